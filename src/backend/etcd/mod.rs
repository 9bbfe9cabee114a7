//! The etcd v3 protocol (design §6), spoken through etcd's JSON gateway (`/v3/…`), so a host
//! needs nothing but an HTTP client.
//!
//! [`EtcdProtocol`] sits between the lease engine ([`Client`]) and the host's HTTP client. It
//! turns the engine's commands into [`Request`]s — `POST` a JSON body to a path on any member
//! of the cluster — and the replies (status code and body) into the engine's inputs. The host
//! never builds a key or reads a body.
//!
//! # Keys and ownership
//!
//! Each lock name has a queue under the prefix [`queue_prefix`]: `lh/<byte length>:<name>/`
//! (the length keeps `a` and `a/b` apart, since names may hold `/`). A lease joins it with
//! the key `prefix + token hex`. The key with the lowest create revision owns the lock, and
//! **its create revision is the fencing token**: revisions strictly increase cluster-wide, and
//! each new owner's key is younger than every earlier owner's, so fences of one name strictly
//! increase across clients, leaders and restarts.
//!
//! # Requests
//!
//! - acquire: one `kv/txn` (if the key does not exist, put it with the pooled lease; either
//!   way read it and the queue's first key), beside a `lease/keepalive` of that lease unless
//!   one sent since the acquire already answered; `lease/grant` first when there is no pooled
//!   lease yet. Retries with the same token find the same key (idempotent).
//! - renew: `lease/keepalive` (a gateway stream; the host reads the whole body). A reply
//!   without a TTL means the lease is gone: every lock bound to it is Lost.
//! - release: `kv/deleterange` of the lease's own key (nothing there: NotOwner). The pooled
//!   lease stays for the next acquire; with no lock bound it is not kept alive and expires on
//!   its own (it carries no key), unless an acquire reuses it first.
//! - close ([`EtcdProtocol::close`]): `lease/revoke` of every pooled lease.
//!
//! # The parts
//!
//! - `pool.rs`, the pooled etcd lease: keys are bound to an etcd lease shared by the
//!   client's locks of one TTL, kept alive by their renewals; a grant is reported once a
//!   keep-alive sent at or after the acquire found that lease alive; a lease found gone loses
//!   every lock bound to it at once; a lease that may carry a stray key is retired.
//! - `waiting.rs`, FIFO waiting: a lease that is not first watches only its predecessor's
//!   key ([`RequestKind::Watch`]), so a release wakes exactly one waiter (the ZooKeeper
//!   recipe); a waiter that gives up deletes its key.
//! - `auth.rs`, authentication ([`EtcdProtocol::with_auth`]): user and password traded for
//!   a token that every later request carries.
//! - `reply.rs`, what each reply means for the engine, and status queries.
//! - the shared outbox (`backend::outbox`): pending requests, their expiry, the event and
//!   status queues and the last error, as every protocol keeps them.
//!
//! # Faults
//!
//! Any error body (`{"error":…,"code":…}`), HTTP status other than 200, garbage or
//! out-of-bounds reply is a transport error for the engine — never a grant. An acquire
//! whose lease vanished starts over with a fresh lease.

mod auth;
mod json;
mod pool;
mod redact;
mod reply;
mod waiting;

use std::collections::{HashMap, VecDeque};

use serde_json::{Value, json};

use super::outbox::{MS, NEVER, Outbox};
use crate::{Client, Command, Event, LeaseId, Output, RenewResult, RequestId, Token};
use auth::Auth;
pub use auth::MAX_CREDENTIAL_LEN;
pub use json::{MAX_BODY, ReplyError};
use pool::{Pool, Shared, keepalive_interval};
use waiting::Holder;

const MAX_ERROR_TEXT: usize = 512;
/// How long an unanswered unary request is remembered (the engine timed it out long before).
const FORGET_AFTER_NS: u64 = 30_000 * MS;

/// The gateway paths the protocol uses (etcd 3.4 and later serve all of them).
pub mod paths {
    /// `LeaseGrant`.
    pub const LEASE_GRANT: &str = "/v3/lease/grant";
    /// `LeaseKeepAlive` (a stream; one message in, one out).
    pub const LEASE_KEEPALIVE: &str = "/v3/lease/keepalive";
    /// `LeaseRevoke`.
    pub const LEASE_REVOKE: &str = "/v3/lease/revoke";
    /// `Txn`.
    pub const KV_TXN: &str = "/v3/kv/txn";
    /// `Range`.
    pub const KV_RANGE: &str = "/v3/kv/range";
    /// `Watch` (a stream the host keeps open).
    pub const WATCH: &str = "/v3/watch";
    /// `Authenticate` (user and password for a token).
    pub const AUTHENTICATE: &str = "/v3/auth/authenticate";
    /// `LeaseTimeToLive` (a status query: the holder's time left).
    pub const LEASE_TIMETOLIVE: &str = "/v3/lease/timetolive";
    /// `DeleteRange` (a release: the lease's own key).
    pub const KV_DELETE: &str = "/v3/kv/deleterange";
}

/// How the host runs a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum RequestKind {
    /// `POST` the body, read the whole reply, answer with
    /// [`EtcdProtocol::handle_reply`] or [`EtcdProtocol::handle_failed`].
    Unary = 1,
    /// `POST` the body and keep the response open: pass every newline-delimited JSON message
    /// to [`EtcdProtocol::handle_watch_message`]; when the stream ends or fails, call
    /// [`EtcdProtocol::handle_failed`] with its id.
    Watch = 2,
    /// Close the watch stream `id` (no reply). Messages still arriving for it are ignored.
    CancelWatch = 3,
}

/// A request for the host. Any member of the cluster serves every request: on a transport
/// failure the host may try the next member URL before reporting it. Its `Debug` shows
/// neither the token nor an authenticate request's body (the password).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// Id to answer with; never reused.
    pub id: u64,
    /// How to run it.
    pub kind: RequestKind,
    /// The HTTP method (always `POST` for the gateway; empty for `CancelWatch`).
    pub method: &'static str,
    /// The path, appended to a member's base URL (empty for `CancelWatch`).
    pub path: &'static str,
    /// The JSON body (empty for `CancelWatch`).
    pub body: &'a [u8],
    /// Send as the `Authorization` header when not empty (the token of an authenticated
    /// cluster; see [`EtcdProtocol::with_auth`]).
    pub authorization: &'a str,
}

/// What the protocol saw, for diagnostics and tests (monotonic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EtcdCounters {
    /// Requests emitted (watch cancellations not included).
    pub requests: u64,
    /// etcd leases granted (one per pool of the client's locks of one TTL, and again after
    /// one expired or was retired).
    pub leases_granted: u64,
    /// Acquire transactions sent.
    pub txns: u64,
    /// Watches opened on a predecessor.
    pub watches: u64,
    /// Waiters woken because the key they watched was deleted (or the watch was cut).
    pub wakeups: u64,
    /// Keep-alives the protocol sent on its own to keep a pooled lease with waiters alive.
    pub waiting_keepalives: u64,
    /// Waiters whose etcd lease was gone (they rejoin the queue).
    pub waiters_expired: u64,
    /// Error bodies or non-200 statuses.
    pub error_replies: u64,
    /// Replies that were not what the request can get (garbage, wrong types, oversized).
    pub garbage_replies: u64,
    /// Transport failures reported by the host.
    pub transport_failures: u64,
    /// Replies and messages for unknown or already answered ids.
    pub stale_replies: u64,
}

#[derive(Debug, Clone)]
enum Op {
    /// A pooled lease for the locks of one TTL (`secs`), sent at `sent`.
    Grant { secs: u64, sent: u64 },
    /// The acquire transaction.
    Txn { lease: LeaseId, req: RequestId },
    /// The key before ours: a waiter's lookup, or (`req`) a woken waiter's acquire, which
    /// needs no transaction while its key is known: no key before it means it is first.
    Predecessor {
        lease: LeaseId,
        req: Option<RequestId>,
    },
    /// A keep-alive of `etcd_lease` sent at `sent`: a renewal of `renew`, or the protocol's
    /// own (a waiter's, or one that dates a grant).
    KeepAlive {
        etcd_lease: i64,
        renew: Option<(LeaseId, RequestId)>,
        sent: u64,
    },
    /// Deletes `lease`'s key: a release (`req`) or the protocol's own cleanup (`None`).
    Delete {
        lease: LeaseId,
        req: Option<RequestId>,
    },
    /// A retired or closed pooled lease.
    Revoke,
    /// The watch on the predecessor's key.
    Watch { lease: LeaseId, key: Vec<u8> },
    /// User and password for a token.
    Authenticate,
    /// A status query's first step: the queue's oldest key (`status` is the query's id).
    StatusFirst { status: u64 },
    /// Its second step: the time left on the owner key's lease.
    StatusTtl { status: u64, fence: i64 },
}

struct Pending {
    op: Op,
    kind: RequestKind,
    path: &'static str,
    body: Vec<u8>,
}

/// The etcd protocol of one client core. See the module docs.
#[derive(Debug)]
pub struct EtcdProtocol {
    out: Outbox<Pending>,
    /// Watch streams to close, ahead of every other request.
    cancels: VecDeque<u64>,
    holders: HashMap<LeaseId, Holder>,
    shared: HashMap<i64, Shared>,
    pools: HashMap<u64, Pool>,
    counters: EtcdCounters,
    auth: Option<Auth>,
}

impl Default for EtcdProtocol {
    fn default() -> Self {
        Self::new()
    }
}

/// The queue prefix of a lock name: `lh/<byte length>:<name>/`.
pub fn queue_prefix(name: &str) -> Vec<u8> {
    format!("lh/{}:{}/", name.len(), name).into_bytes()
}

/// The queue key of one lease: the prefix and the ownership token in hex.
pub fn queue_key(name: &str, token: &Token) -> Vec<u8> {
    let mut k = queue_prefix(name);
    k.extend_from_slice(&token.to_hex());
    k
}

/// The end of a prefix range (the prefix with its last byte incremented).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl EtcdProtocol {
    /// Creates the protocol for one core.
    pub fn new() -> Self {
        Self {
            out: Outbox::default(),
            cancels: VecDeque::new(),
            holders: HashMap::new(),
            shared: HashMap::new(),
            pools: HashMap::new(),
            counters: EtcdCounters::default(),
            auth: None,
        }
    }

    /// Counters.
    pub fn counters(&self) -> EtcdCounters {
        self.counters
    }

    /// The last error body, failure or malformed reply ("" if none).
    pub fn last_error(&self) -> &str {
        self.out.last_error()
    }

    /// Watch streams the host should have open now.
    pub fn open_watches(&self) -> usize {
        self.holders.values().filter(|h| h.watch.is_some()).count()
    }

    // ------------------------------------------------------------------------ outputs

    /// The next request to execute. Its body borrows this object until its next mutation.
    pub fn poll_request(&mut self, core: &mut Client) -> Option<Request<'_>> {
        self.pump(core);
        if let Some(id) = self.cancels.pop_front() {
            return Some(Request {
                id,
                kind: RequestKind::CancelWatch,
                method: "",
                path: "",
                body: &[],
                authorization: "",
            });
        }
        let now = core.now();
        if self.auth.as_ref().is_some_and(|a| a.token.is_empty()) {
            // Everything waits for the token; one authenticate request at a time.
            let id = self.authenticate(now)?;
            let p = self.out.get(id)?;
            return Some(Request {
                id,
                kind: p.kind,
                method: "POST",
                path: p.path,
                body: &p.body,
                authorization: "",
            });
        }
        let (id, p) = self.out.next_ready()?;
        Some(Request {
            id,
            kind: p.kind,
            method: "POST",
            path: p.path,
            body: &p.body,
            authorization: self.auth.as_ref().map_or("", |a| a.token.as_str()),
        })
    }

    /// Whether [`Self::poll_request`] may give a request, taking and moving nothing: a watch
    /// to cancel, an authentication due, one queued, or engine output that may make one.
    pub fn has_request(&self, core: &Client) -> bool {
        self.out.has_request(core)
            || !self.cancels.is_empty()
            || self.auth.as_ref().is_some_and(|a| a.token.is_empty())
    }

    /// The next event for the application.
    pub fn poll_event(&mut self, core: &mut Client) -> Option<Event> {
        self.pump(core);
        self.out.pop_event()
    }

    /// When [`Self::handle_timeout`] must be called at the latest.
    pub fn poll_timeout(&mut self, core: &mut Client) -> Option<u64> {
        let mut t = core.poll_timeout().unwrap_or(NEVER);
        for h in self.holders.values() {
            if h.ended {
                t = t.min(h.forget_at);
                continue;
            }
            t = t.min(h.recheck_at);
            if h.waiting {
                if let Some(s) = h.etcd_lease.and_then(|id| self.shared.get(&id)) {
                    if s.in_flight.is_empty() {
                        t = t.min(
                            s.last_sent
                                .saturating_add(keepalive_interval(s.secs.saturating_mul(1000))),
                        );
                    }
                }
            }
        }
        for id in self.pools.values().filter_map(|p| p.lease) {
            // A pooled lease is forgotten once it may have expired.
            if let Some(s) = self.shared.get(&id) {
                t = t.min(s.alive_at.saturating_add(s.secs.saturating_mul(1_000 * MS)));
            }
        }
        if let Some(at) = self.out.next_expiry() {
            t = t.min(at);
        }
        if let Some(at) = self.auth_retry_at() {
            t = t.min(at);
        }
        (t != NEVER).then_some(t)
    }

    // ------------------------------------------------------------------------- inputs

    /// Time passed: runs the engine's timers, the keep-alives of pooled leases that have
    /// waiters, and waiters' re-checks.
    pub fn handle_timeout(&mut self, core: &mut Client, now: u64) {
        // Commands and events of application calls made since come first.
        self.pump(core);
        core.handle_timeout(now);
        let now = core.now();
        self.prune(core, now);
        self.recheck_waiters(core, now);
        self.keep_waiters_alive(now);
        self.pump(core);
    }

    /// The client is closing: cancels every acquire still waiting, revokes every pooled
    /// lease (their keys go with them, so nothing of this client stays on the cluster for a
    /// TTL) and ends every lock still held as Lost. Run the host loop until the requests are
    /// answered, or for a short bound: an unanswered revoke leaves the lease to expire.
    pub fn close(&mut self, core: &mut Client, now: u64) {
        self.pump(core);
        let waiting: Vec<LeaseId> = self
            .holders
            .iter()
            .filter(|(_, h)| !h.ended)
            .map(|(l, _)| *l)
            .collect();
        for lease in waiting {
            if core.lease_state(lease) == Ok(crate::LeaseState::Acquiring) {
                let _ = core.release(now, lease);
            }
        }
        self.pump(core);
        let ids: Vec<i64> = self.shared.keys().copied().collect();
        for id in ids {
            self.push(
                Op::Revoke,
                RequestKind::Unary,
                paths::LEASE_REVOKE,
                json!({ "ID": id.to_string() }),
                now,
            );
            self.lease_gone(core, now, id);
        }
        self.pools.clear();
        self.pump(core);
    }

    /// The next answered status query: its id and what the cluster said (or why not).
    pub fn poll_status(&mut self) -> Option<crate::backend::StatusAnswer> {
        self.out.pop_status()
    }

    /// The reply to unary request `id`: the HTTP status and the whole body. Unknown and
    /// already answered ids are counted and ignored.
    pub fn handle_reply(&mut self, core: &mut Client, now: u64, id: u64, status: u16, body: &[u8]) {
        // Commands and events of application calls made since come first.
        self.pump(core);
        core.handle_timeout(now);
        let now = core.now();
        let Some(p) = self.out.take(id) else {
            self.counters.stale_replies += 1;
            self.pump(core);
            return;
        };
        if p.kind == RequestKind::Watch {
            // A watch stream answered as a whole: the host read it to its end.
            let mut over = status != 200;
            for line in body.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                match json::parse_stream_message(line) {
                    Ok(msg) if !over => over = self.watch_message(core, now, id, &p.op, &msg),
                    _ => over = true,
                }
            }
            self.watch_ended(now, id, p.op);
            self.pump(core);
            return;
        }
        let parsed = json::parse_body(status, body);
        if let Err(e) = &parsed {
            self.check_token(e);
            match e {
                ReplyError::Server { .. } | ReplyError::Status(_) => {
                    self.counters.error_replies += 1
                }
                _ => self.counters.garbage_replies += 1,
            }
            self.note_error(&format!("{}: {e}", p.path));
        }
        self.on_reply(core, now, p.op, parsed);
        self.pump(core);
    }

    /// Request `id` failed in transport (no answer, a broken connection), or a watch stream
    /// ended. The engine sees a transport error; a waiter whose watch ended retries soon.
    pub fn handle_failed(&mut self, core: &mut Client, now: u64, id: u64, message: &str) {
        // Commands and events of application calls made since come first.
        self.pump(core);
        core.handle_timeout(now);
        let now = core.now();
        let Some(p) = self.out.take(id) else {
            self.counters.stale_replies += 1;
            self.pump(core);
            return;
        };
        self.counters.transport_failures += 1;
        self.note_error(&format!("{}: transport failure: {message}", p.path));
        if p.kind == RequestKind::Watch {
            self.watch_ended(now, id, p.op);
        } else {
            self.on_reply(core, now, p.op, Err(ReplyError::Transport));
        }
        self.pump(core);
    }

    /// One JSON message streamed on watch `id` (one line of the response body).
    pub fn handle_watch_message(&mut self, core: &mut Client, now: u64, id: u64, message: &[u8]) {
        // Commands and events of application calls made since come first.
        self.pump(core);
        core.handle_timeout(now);
        let now = core.now();
        let Some(p) = self.out.get(id).filter(|p| p.kind == RequestKind::Watch) else {
            self.counters.stale_replies += 1;
            self.pump(core);
            return;
        };
        let op = p.op.clone();
        match json::parse_stream_message(message) {
            Ok(msg) => {
                if self.watch_message(core, now, id, &op, &msg) {
                    self.out.take(id);
                    self.watch_ended(now, id, op);
                }
            }
            Err(e) => {
                self.counters.garbage_replies += 1;
                self.note_error(&format!("watch: {e}"));
                // Whatever the stream carries now cannot be trusted: close it, look again.
                self.out.take(id);
                self.cancels.push_back(id);
                self.watch_ended(now, id, op);
            }
        }
        self.pump(core);
    }

    // ---------------------------------------------------------------------- internals

    fn pump(&mut self, core: &mut Client) {
        while let Some(out) = core.poll_output() {
            let now = core.now();
            match out {
                Output::Event(ev) => {
                    match ev {
                        Event::AcquireFailed { lease, .. } => self.ended(lease, now, true),
                        Event::Lost { lease, .. } | Event::Released { lease } => {
                            self.ended(lease, now, false)
                        }
                        _ => {}
                    }
                    self.out.push_event(ev);
                }
                Output::Command(cmd) => self.on_command(core, now, cmd),
            }
        }
    }

    fn on_command(&mut self, core: &mut Client, now: u64, cmd: Command) {
        match cmd {
            Command::Acquire {
                request,
                lease,
                name,
                token,
                ttl_ms,
            } => self.on_acquire(lease, request, name, &token, ttl_ms, now),
            Command::Renew {
                request,
                lease,
                backend_data,
                ..
            } => {
                let id = backend_data
                    .as_deref()
                    .and_then(json::lease_from_data)
                    .or_else(|| self.holders.get(&lease).and_then(|h| h.etcd_lease));
                match id {
                    Some(id) => self.send_keepalive(id, Some((lease, request)), now),
                    // Nothing of ours can be on the server without a lease.
                    None => {
                        let _ = core.handle_renew_result(now, request, RenewResult::Rejected);
                    }
                }
            }
            Command::Release {
                request,
                lease,
                name,
                token,
                ..
            } => {
                // The key is the token's: a delete can only remove our own grant.
                if let Some(h) = self.holders.get_mut(&lease) {
                    h.deleting = true;
                }
                self.push(
                    Op::Delete {
                        lease,
                        req: Some(request),
                    },
                    RequestKind::Unary,
                    paths::KV_DELETE,
                    json!({ "key": json::b64(&queue_key(&name, &token)) }),
                    now,
                );
            }
            // Waiters watch their own predecessor (see the module docs), not the name.
            Command::Watch { .. } | Command::Unwatch { .. } => {}
        }
    }

    fn push(
        &mut self,
        op: Op,
        kind: RequestKind,
        path: &'static str,
        body: Value,
        now: u64,
    ) -> u64 {
        self.counters.requests += 1;
        let body = serde_json::to_vec(&body).unwrap_or_default();
        let expires = match kind {
            RequestKind::Unary => now.saturating_add(FORGET_AFTER_NS),
            _ => NEVER,
        };
        self.out.push(
            Pending {
                op,
                kind,
                path,
                body,
            },
            expires,
        )
    }

    /// Forgets requests the host never answered (failing the protocol's own ones, so nothing
    /// waits for them forever) and records of leases long ended.
    fn prune(&mut self, core: &mut Client, now: u64) {
        while let Some((_, p)) = self.out.pop_expired(now) {
            self.on_reply(core, now, p.op, Err(ReplyError::Transport));
        }
        self.holders.retain(|_, h| !(h.ended && h.forget_at <= now));
        self.forget_lapsed(now);
    }

    fn note_reply_error(&mut self, what: &str, e: &ReplyError) {
        self.note_error(&format!("{what}: {e}"));
    }

    fn garbage(&mut self, msg: &str) {
        self.counters.garbage_replies += 1;
        self.note_error(&format!("unexpected reply: {msg}"));
    }

    fn note_error(&mut self, text: &str) {
        self.out.note_error(text, MAX_ERROR_TEXT);
    }
}
