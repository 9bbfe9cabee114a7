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
//! # The pooled etcd lease
//!
//! Keys are bound to an etcd lease shared by the client's locks of one TTL (in whole seconds,
//! rounded up): granted when the first of them needs it, kept alive by their renewals (and
//! by the protocol while one of them waits), as etcd's `concurrency.Session` shares one lease
//! between its mutexes. Locks of different TTLs get different etcd leases, so a dead client's
//! lock is still freed at most its own TTL after its last renewal. Since every lock of the
//! lease renews it, each lock's validity is still counted from its own acquire or renewal:
//! a grant is reported to the engine only once a keep-alive (or the grant) *sent at or after
//! the acquire* found the etcd lease alive — usually the keep-alive that goes out beside the
//! transaction. When a keep-alive finds the lease gone, every lock bound to it is lost at once
//! ([`Client::handle_revoked`]) and every waiter bound to it rejoins with a fresh lease.
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
//! A key whose deletion cannot be confirmed (a delete lost in transport, an acquire
//! transaction with an unknown outcome for a lease that ended) might stay bound to the pooled
//! lease while other locks keep that lease alive. Such a lease is **retired**: new acquires
//! get a fresh one, and it is revoked as soon as no live lock is bound to it.
//!
//! # Waiting
//!
//! A lease that is not first looks up its predecessor (the key just before its own in create
//! order) and opens a watch on that key alone ([`RequestKind::Watch`]: a streaming `POST
//! /v3/watch` the host keeps open, passing each streamed JSON message to
//! [`EtcdProtocol::handle_watch_message`]). When that key is deleted — released, or its
//! lease expired because its owner died — the waiter is woken and asks again: a release wakes
//! exactly one waiter, in FIFO order (the ZooKeeper recipe). While it waits the protocol
//! keeps the pooled lease alive; if that lease is lost, the waiter rejoins at the end of the
//! queue. A waiter that gives up deletes its key, so it never blocks the queue.
//!
//! # Authentication
//!
//! With [`EtcdProtocol::with_auth`], the first request is `auth/authenticate` with the user
//! and password; every later request carries the token ([`Request::authorization`], the
//! `Authorization` header). A request refused for its token (expired, or the member forgot
//! it) is a transport error for the engine, and the next request authenticates again.
//!
//! # Faults
//!
//! Any error body (`{"error":…,"code":…}`), HTTP status other than 200, garbage or
//! out-of-bounds reply is a transport error for the engine — never a grant. An acquire
//! whose lease vanished starts over with a fresh lease.

mod json;
mod redact;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use super::LockStatus;
use serde_json::{Value, json};

use crate::{
    AcquireResult, Client, Command, Event, LeaseId, LockName, Output, ReleaseResult, RenewResult,
    RequestId, Token,
};
pub use json::{MAX_BODY, ReplyError};

const NEVER: u64 = u64::MAX;
const MS: u64 = 1_000_000;
const MAX_ERROR_TEXT: usize = 512;
/// How long an unanswered unary request is remembered (the engine timed it out long before).
const FORGET_AFTER_NS: u64 = 30_000 * MS;
/// After a failed watch or predecessor lookup, how long before the waiter is woken to retry.
const REWATCH_AFTER_NS: u64 = 200 * MS;
/// gRPC code etcd answers for a lease that does not exist (expired or revoked).
const CODE_NOT_FOUND: i64 = 5;

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

/// Longest user name or password accepted, in bytes.
pub const MAX_CREDENTIAL_LEN: usize = 256;
/// gRPC code of a missing, expired or invalid auth token.
const CODE_UNAUTHENTICATED: i64 = 16;
/// After a failed authentication, how long before the next attempt.
const REAUTH_AFTER_NS: u64 = 500 * MS;

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

/// A transaction that found our key first, waiting for a keep-alive sent at or after the
/// acquire (`since`) to find the etcd lease alive before it becomes a grant.
#[derive(Debug, Clone, Copy)]
struct Dating {
    req: RequestId,
    fence: i64,
    since: u64,
}

/// What the protocol knows of one engine lease.
#[derive(Debug)]
struct Holder {
    name: LockName,
    key: Vec<u8>,
    ttl_ms: u64,
    /// The pool this lease draws from: its TTL in whole seconds.
    secs: u64,
    etcd_lease: Option<i64>,
    /// The acquire waiting for the pool's grant.
    parked: Option<RequestId>,
    /// When the engine sent the current acquire (its validity counts from there).
    since: u64,
    dating: Option<Dating>,
    /// Our key's create revision, once read.
    own_rev: i64,
    /// The open watch (request id) and the key it watches.
    watch: Option<(u64, Vec<u8>)>,
    lookup_in_flight: bool,
    waiting: bool,
    /// Acquire transactions in flight.
    txns: u32,
    /// A transaction failed without an answer since the last one answered: our key may be
    /// on the server or not.
    txn_unknown: bool,
    /// A delete of our key is in flight.
    deleting: bool,
    /// When a waiter without a live watch is woken to retry.
    recheck_at: u64,
    ended: bool,
    forget_at: u64,
}

/// One etcd lease of this client, shared by the locks bound to it.
#[derive(Debug)]
struct Shared {
    secs: u64,
    /// Send time of the latest grant or keep-alive that found it alive.
    alive_at: u64,
    /// Send time of the latest grant or keep-alive.
    last_sent: u64,
    /// Keep-alives in flight: (request id, send time).
    in_flight: Vec<(u64, u64)>,
    /// May carry a key nobody owns: no new acquire, revoked once no live lock is bound.
    retired: bool,
}

/// The pooled lease of one TTL.
#[derive(Debug, Default)]
struct Pool {
    lease: Option<i64>,
    granting: bool,
    /// Leases waiting for the grant, in the order they asked.
    parked: Vec<LeaseId>,
}

/// The etcd protocol of one client core. See the module docs.
#[derive(Debug)]
pub struct EtcdProtocol {
    next_id: u64,
    pending: HashMap<u64, Pending>,
    expiry: BinaryHeap<Reverse<(u64, u64)>>,
    outbox: VecDeque<u64>,
    cancels: VecDeque<u64>,
    events: VecDeque<Event>,
    holders: HashMap<LeaseId, Holder>,
    shared: HashMap<i64, Shared>,
    pools: HashMap<u64, Pool>,
    counters: EtcdCounters,
    last_error: String,
    statuses: VecDeque<crate::backend::StatusAnswer>,
    auth: Option<Auth>,
}

/// Credentials and the token they got (`Debug` shows the user only).
struct Auth {
    user: String,
    password: String,
    token: String,
    /// The authenticate request, while one is out.
    request: Option<u64>,
    retry_at: u64,
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
            next_id: 0,
            pending: HashMap::new(),
            expiry: BinaryHeap::new(),
            outbox: VecDeque::new(),
            cancels: VecDeque::new(),
            events: VecDeque::new(),
            holders: HashMap::new(),
            shared: HashMap::new(),
            pools: HashMap::new(),
            counters: EtcdCounters::default(),
            last_error: String::new(),
            statuses: VecDeque::new(),
            auth: None,
        }
    }

    /// Creates the protocol for a cluster with authentication on: before anything else it
    /// trades `user` and `password` for a token (`/v3/auth/authenticate`), which every request
    /// then carries; a request refused for its token gets a new one. Empty or overlong
    /// credentials are refused.
    pub fn with_auth(user: &str, password: &str) -> Result<Self, crate::Error> {
        if user.is_empty() || user.len() > MAX_CREDENTIAL_LEN || password.len() > MAX_CREDENTIAL_LEN
        {
            return Err(crate::Error::InvalidConfig(
                "etcd user must be 1..=256 bytes and its password at most 256",
            ));
        }
        let mut p = Self::new();
        p.auth = Some(Auth {
            user: user.to_owned(),
            password: password.to_owned(),
            token: String::new(),
            request: None,
            retry_at: 0,
        });
        Ok(p)
    }

    /// Whether requests carry a token now (always true without authentication).
    pub fn is_authenticated(&self) -> bool {
        self.auth.as_ref().is_none_or(|a| !a.token.is_empty())
    }

    /// Counters.
    pub fn counters(&self) -> EtcdCounters {
        self.counters
    }

    /// The last error body, failure or malformed reply ("" if none).
    pub fn last_error(&self) -> &str {
        &self.last_error
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
        if let Some(a) = &mut self.auth {
            if a.token.is_empty() {
                // Everything waits for the token; one authenticate request at a time.
                if a.request.is_some() || now < a.retry_at || self.outbox.is_empty() {
                    return None;
                }
                let body = json!({ "name": a.user, "password": a.password });
                let id = self.push(
                    Op::Authenticate,
                    RequestKind::Unary,
                    paths::AUTHENTICATE,
                    body,
                    now,
                );
                // Sent now, ahead of the queue it unblocks.
                self.outbox.retain(|&o| o != id);
                if let Some(a) = &mut self.auth {
                    a.request = Some(id);
                }
                let p = &self.pending[&id];
                return Some(Request {
                    id,
                    kind: p.kind,
                    method: "POST",
                    path: p.path,
                    body: &p.body,
                    authorization: "",
                });
            }
        }
        while let Some(id) = self.outbox.pop_front() {
            if let Some(p) = self.pending.get(&id) {
                return Some(Request {
                    id,
                    kind: p.kind,
                    method: "POST",
                    path: p.path,
                    body: &p.body,
                    authorization: self.auth.as_ref().map_or("", |a| a.token.as_str()),
                });
            }
        }
        None
    }

    /// The next event for the application.
    pub fn poll_event(&mut self, core: &mut Client) -> Option<Event> {
        self.pump(core);
        self.events.pop_front()
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
        if let Some(Reverse((at, _))) = self.expiry.peek() {
            t = t.min(*at);
        }
        if let Some(a) = &self.auth {
            if a.token.is_empty() && a.request.is_none() && !self.outbox.is_empty() {
                t = t.min(a.retry_at);
            }
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
        let due: Vec<LeaseId> = self
            .holders
            .iter()
            .filter(|(_, h)| !h.ended && h.recheck_at <= now)
            .map(|(l, _)| *l)
            .collect();
        for lease in due {
            let Some(h) = self.holders.get_mut(&lease) else {
                continue;
            };
            if h.recheck_at <= now && !h.ended {
                h.recheck_at = NEVER;
                self.counters.wakeups += 1;
                // This lease, not the name's first local waiter: each watches its own place.
                let _ = core.handle_wake(now, lease);
                self.pump(core);
            }
        }
        // A waiter's key lives on the pooled lease: keep it alive while anyone waits on it.
        let mut keep: Vec<i64> = self
            .holders
            .values()
            .filter(|h| !h.ended && h.waiting)
            .filter_map(|h| h.etcd_lease)
            .collect();
        keep.sort_unstable();
        keep.dedup();
        for id in keep {
            let due = self.shared.get(&id).is_some_and(|s| {
                s.in_flight.is_empty()
                    && s.last_sent
                        .saturating_add(keepalive_interval(s.secs.saturating_mul(1000)))
                        <= now
            });
            if due {
                self.counters.waiting_keepalives += 1;
                self.send_keepalive(id, None, now);
            }
        }
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

    /// Queues a status query for `name` (`leasehold status`): the queue's oldest key (the
    /// owner, whose create revision is the fence), then its lease's time to live. The answer
    /// comes out of [`Self::poll_status`] under the returned id. etcd keeps no record of
    /// past fences once the keys are gone, so `last_fencing_token` is the owner's.
    pub fn request_status(&mut self, now: u64, name: &str) -> Result<u64, crate::Error> {
        crate::validate_name(name)?;
        let prefix = queue_prefix(name);
        let body = json!({
            "key": json::b64(&prefix),
            "range_end": json::b64(&prefix_end(&prefix)),
            "sort_order": "ASCEND",
            "sort_target": "CREATE",
            "limit": "1",
            "keys_only": true,
        });
        let id = self.push(
            Op::StatusFirst { status: 0 },
            RequestKind::Unary,
            paths::KV_RANGE,
            body,
            now,
        );
        // The query is known by its first request's id.
        if let Some(p) = self.pending.get_mut(&id) {
            p.op = Op::StatusFirst { status: id };
        }
        Ok(id)
    }

    /// The next answered status query: its id and what the cluster said (or why not).
    pub fn poll_status(&mut self) -> Option<crate::backend::StatusAnswer> {
        self.statuses.pop_front()
    }

    /// The reply to unary request `id`: the HTTP status and the whole body. Unknown and
    /// already answered ids are counted and ignored.
    pub fn handle_reply(&mut self, core: &mut Client, now: u64, id: u64, status: u16, body: &[u8]) {
        // Commands and events of application calls made since come first.
        self.pump(core);
        core.handle_timeout(now);
        let now = core.now();
        let Some(p) = self.pending.remove(&id) else {
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
            self.watch_ended(core, now, id, p.op);
            self.pump(core);
            return;
        }
        let parsed = json::parse_body(status, body);
        if let (Err(e), Some(a)) = (&parsed, &mut self.auth) {
            if e.code() == Some(CODE_UNAUTHENTICATED) || e.to_string().contains("auth token") {
                // The token expired or the member restarted: get a new one.
                a.token.clear();
            }
        }
        if let Err(e) = &parsed {
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
        let Some(p) = self.pending.remove(&id) else {
            self.counters.stale_replies += 1;
            self.pump(core);
            return;
        };
        self.counters.transport_failures += 1;
        self.note_error(&format!("{}: transport failure: {message}", p.path));
        if p.kind == RequestKind::Watch {
            self.watch_ended(core, now, id, p.op);
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
        let Some(p) = self
            .pending
            .get(&id)
            .filter(|p| p.kind == RequestKind::Watch)
        else {
            self.counters.stale_replies += 1;
            self.pump(core);
            return;
        };
        let op = p.op.clone();
        match json::parse_stream_message(message) {
            Ok(msg) => {
                if self.watch_message(core, now, id, &op, &msg) {
                    self.pending.remove(&id);
                    self.watch_ended(core, now, id, op);
                }
            }
            Err(e) => {
                self.counters.garbage_replies += 1;
                self.note_error(&format!("watch: {e}"));
                // Whatever the stream carries now cannot be trusted: close it, look again.
                self.pending.remove(&id);
                self.cancels.push_back(id);
                self.watch_ended(core, now, id, op);
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
                    self.events.push_back(ev);
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
            } => {
                let h = self.holders.entry(lease).or_insert_with(|| Holder {
                    key: queue_key(&name, &token),
                    name,
                    ttl_ms,
                    secs: ttl_ms.div_ceil(1000).max(1),
                    etcd_lease: None,
                    parked: None,
                    since: now,
                    dating: None,
                    own_rev: 0,
                    watch: None,
                    lookup_in_flight: false,
                    waiting: false,
                    txns: 0,
                    txn_unknown: false,
                    deleting: false,
                    recheck_at: NEVER,
                    ended: false,
                    forget_at: NEVER,
                });
                h.recheck_at = NEVER;
                h.since = now;
                h.dating = None;
                let secs = h.secs;
                // A lease whose key may be on an etcd lease keeps asking with that one; a woken
                // waiter whose key is known only checks that no key is before it.
                if let Some(id) = h.etcd_lease.filter(|id| self.shared.contains_key(id)) {
                    if h.waiting && h.own_rev > 0 {
                        let ttl_ms = h.ttl_ms;
                        self.send_lookup(lease, now, Some(request));
                        if self.is_stale(id, now, ttl_ms) {
                            self.send_keepalive(id, None, now);
                        }
                    } else {
                        self.send_txn(lease, request, now);
                    }
                    return;
                }
                h.etcd_lease = None;
                let pool = self.pools.entry(secs).or_default();
                if let Some(id) = pool.lease {
                    // Reused while it is surely alive; an idle one may have lapsed.
                    let fresh = self.shared.get(&id).is_some_and(|s| {
                        !s.retired
                            && now
                                < s.alive_at
                                    .saturating_add(s.secs.saturating_mul(1_000 * MS) / 2)
                    });
                    if fresh {
                        if let Some(h) = self.holders.get_mut(&lease) {
                            h.etcd_lease = Some(id);
                        }
                        self.send_txn(lease, request, now);
                        return;
                    }
                    pool.lease = None;
                    self.drop_if_idle(id, now);
                }
                let Some(h) = self.holders.get_mut(&lease) else {
                    return;
                };
                h.parked = Some(request);
                let pool = self.pools.entry(secs).or_default();
                pool.parked.retain(|l| *l != lease);
                pool.parked.push(lease);
                if !pool.granting {
                    pool.granting = true;
                    self.counters.leases_granted += 1;
                    self.push(
                        Op::Grant { secs, sent: now },
                        RequestKind::Unary,
                        paths::LEASE_GRANT,
                        json!({ "TTL": secs.to_string() }),
                        now,
                    );
                }
            }
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

    fn send_keepalive(&mut self, id: i64, renew: Option<(LeaseId, RequestId)>, now: u64) {
        let rid = self.push(
            Op::KeepAlive {
                etcd_lease: id,
                renew,
                sent: now,
            },
            RequestKind::Unary,
            paths::LEASE_KEEPALIVE,
            json!({ "ID": id.to_string() }),
            now,
        );
        if let Some(s) = self.shared.get_mut(&id) {
            s.last_sent = s.last_sent.max(now);
            s.in_flight.push((rid, now));
        }
    }

    fn send_txn(&mut self, lease: LeaseId, req: RequestId, now: u64) {
        let Some(h) = self.holders.get_mut(&lease) else {
            return;
        };
        let Some(etcd_lease) = h.etcd_lease else {
            return;
        };
        h.txns += 1;
        let since = h.since;
        let ttl_ms = h.ttl_ms;
        let key = json::b64(&h.key);
        let prefix = queue_prefix(&h.name);
        let first = json!({ "request_range": {
            "key": json::b64(&prefix),
            "range_end": json::b64(&prefix_end(&prefix)),
            "sort_order": "ASCEND",
            "sort_target": "CREATE",
            "limit": "1",
            "keys_only": true,
        }});
        let own = json!({ "request_range": { "key": key } });
        let token_hex = h
            .key
            .get(h.key.len().saturating_sub(32)..)
            .unwrap_or_default();
        let body = json!({
            "compare": [{ "target": "CREATE", "key": key, "result": "EQUAL", "create_revision": "0" }],
            "success": [
                { "request_put": { "key": key, "value": json::b64(token_hex), "lease": etcd_lease.to_string() } },
                own,
                first,
            ],
            "failure": [own, first],
        });
        self.counters.txns += 1;
        self.push(
            Op::Txn { lease, req },
            RequestKind::Unary,
            paths::KV_TXN,
            body,
            now,
        );
        // The grant is dated by the lease's last keep-alive (see `grant_when_dated`): one
        // beside the transaction (not a Raft write) keeps that date within half the
        // allowance of the acquire, so a busy client rarely waits for one.
        if self.is_stale(etcd_lease, since, ttl_ms) {
            self.send_keepalive(etcd_lease, None, now);
        }
    }

    /// Whether an acquire sent at `since` should send a keep-alive to date its grant.
    fn is_stale(&self, id: i64, since: u64, ttl_ms: u64) -> bool {
        let old = self
            .shared
            .get(&id)
            .is_some_and(|s| since.saturating_sub(s.alive_at) > shortfall_allowance_ns(ttl_ms) / 2);
        old && !self.is_dated(id, since)
    }

    /// Whether a grant or keep-alive sent at or after `since` found `id` alive, or is out.
    fn is_dated(&self, id: i64, since: u64) -> bool {
        self.shared
            .get(&id)
            .is_some_and(|s| s.alive_at >= since || s.in_flight.iter().any(|&(_, t)| t >= since))
    }

    /// Our key is first: the lock is ours for as long as the server surely keeps the etcd
    /// lease, counted from the acquire (`since`), as the engine counts it. That is the whole
    /// TTL once a keep-alive sent since the acquire found it alive; before that, the lease
    /// is surely kept until its last good keep-alive's send time plus its TTL, and a grant
    /// whose TTL that shortens by at most [`shortfall_allowance_ns`] is reported at once with
    /// the shorter TTL. Otherwise the grant waits for a keep-alive.
    /// `lease`'s key is the first of its queue: the lock is its own. Its watch stops, and the
    /// grant is reported once dated.
    /// The attempt is refused while the lease waits in the queue. The watch wakes it; the
    /// TTL hint only bounds the sleep if the watch cannot. Pumped at once, so a waiter that
    /// gave up on this refusal is seen before it is given a predecessor to watch.
    fn refused_to_wait(&mut self, core: &mut Client, now: u64, req: RequestId, ttl_ms: u64) {
        let _ = core.handle_acquire_result(
            now,
            req,
            AcquireResult::HeldByOther {
                retry_after_ms: Some(ttl_ms),
            },
        );
        self.pump(core);
    }

    fn own_first(
        &mut self,
        core: &mut Client,
        now: u64,
        lease: LeaseId,
        req: RequestId,
        fence: i64,
    ) {
        let Some(h) = self.holders.get_mut(&lease) else {
            return;
        };
        h.waiting = false;
        h.recheck_at = NEVER;
        let since = h.since;
        if let Some((w, _)) = h.watch.take() {
            self.pending.remove(&w);
            self.cancels.push_back(w);
        }
        self.grant_when_dated(core, now, lease, Dating { req, fence, since });
    }

    fn grant_when_dated(&mut self, core: &mut Client, now: u64, lease: LeaseId, d: Dating) {
        let Some(h) = self.holders.get_mut(&lease) else {
            return;
        };
        let Some(id) = h.etcd_lease else {
            let _ = core.handle_acquire_result(now, d.req, AcquireResult::TransportError);
            return;
        };
        let surely_ms = self.shared.get(&id).map(|s| {
            if s.alive_at >= d.since {
                u64::MAX
            } else {
                let until = s.alive_at.saturating_add(s.secs.saturating_mul(1_000 * MS));
                until.saturating_sub(d.since) / MS
            }
        });
        match surely_ms {
            Some(ms)
                if h.ttl_ms.saturating_sub(ms).saturating_mul(MS)
                    <= shortfall_allowance_ns(h.ttl_ms) =>
            {
                let data = id.to_string();
                let ttl_ms = h.ttl_ms.min(ms);
                h.dating = None;
                let _ = core.handle_acquire_result(
                    now,
                    d.req,
                    AcquireResult::Granted {
                        fencing_token: d.fence as u64,
                        ttl_ms,
                        backend_data: data.as_bytes(),
                    },
                );
            }
            Some(_) => {
                h.dating = Some(d);
                if !self.is_dated(id, d.since) {
                    self.send_keepalive(id, None, now);
                }
            }
            None => {
                h.dating = None;
                let _ = core.handle_acquire_result(now, d.req, AcquireResult::TransportError);
            }
        }
    }

    /// A keep-alive or a transaction says etcd lease `id` is gone: every lock bound to it is
    /// lost (each exactly once: the engine ignores a second loss), every waiter rejoins.
    fn lease_gone(&mut self, core: &mut Client, now: u64, id: i64) {
        self.shared.remove(&id);
        for pool in self.pools.values_mut() {
            if pool.lease == Some(id) {
                pool.lease = None;
            }
        }
        let bound: Vec<LeaseId> = self
            .holders
            .iter()
            .filter(|(_, h)| h.etcd_lease == Some(id))
            .map(|(l, _)| *l)
            .collect();
        for lease in bound {
            let Some(h) = self.holders.get_mut(&lease) else {
                continue;
            };
            let was_waiting = h.waiting;
            Self::forget_lease(h);
            if h.ended {
                continue;
            }
            if let Some(d) = h.dating.take() {
                let _ = core.handle_acquire_result(now, d.req, AcquireResult::TransportError);
            } else if core.handle_revoked(now, lease).unwrap_or(false) {
                // Lost; its Lost event comes out of the engine.
            } else if let Some(h) = self.holders.get_mut(&lease) {
                if was_waiting {
                    // A waiter: its queue entry went with the lease; rejoin at the end.
                    self.counters.waiters_expired += 1;
                    if let Some((w, _)) = h.watch.take() {
                        self.pending.remove(&w);
                        self.cancels.push_back(w);
                    }
                    h.lookup_in_flight = false;
                    h.recheck_at = now;
                }
            }
        }
    }

    /// A key of `id` may be left without an owner: no new acquire uses `id`, and it is
    /// revoked once no live lock is bound to it.
    fn retire(&mut self, id: i64, now: u64) {
        let Some(s) = self.shared.get_mut(&id) else {
            return;
        };
        s.retired = true;
        for pool in self.pools.values_mut() {
            if pool.lease == Some(id) {
                pool.lease = None;
            }
        }
        self.drop_if_idle(id, now);
    }

    /// Forgets pooled lease `id` if nothing is bound to it: a retired one is revoked (it may
    /// carry a stray key), another is left to expire (it carries none).
    fn drop_if_idle(&mut self, id: i64, now: u64) {
        let Some(s) = self.shared.get(&id) else {
            return;
        };
        let in_pool = self.pools.values().any(|p| p.lease == Some(id));
        let bound = self
            .holders
            .values()
            .any(|h| h.etcd_lease == Some(id) && (!h.ended || h.deleting || h.txns > 0));
        if bound {
            return;
        }
        if s.retired {
            self.shared.remove(&id);
            self.push(
                Op::Revoke,
                RequestKind::Unary,
                paths::LEASE_REVOKE,
                json!({ "ID": id.to_string() }),
                now,
            );
        } else if !in_pool && s.in_flight.is_empty() {
            self.shared.remove(&id);
        }
    }

    fn on_reply(&mut self, core: &mut Client, now: u64, op: Op, reply: Result<Value, ReplyError>) {
        match op {
            Op::Grant { secs, sent } => {
                let granted = self.read(reply, json::read_grant);
                let pool = self.pools.entry(secs).or_default();
                pool.granting = false;
                let order = std::mem::take(&mut pool.parked);
                let parked: Vec<(LeaseId, RequestId)> = order
                    .into_iter()
                    .filter_map(|l| {
                        let h = self.holders.get_mut(&l)?;
                        h.parked.take().map(|r| (l, r))
                    })
                    .collect();
                match granted {
                    Ok((id, ttl_s)) => {
                        if let Some(old) = pool.lease.replace(id) {
                            self.drop_if_idle(old, now);
                        }
                        self.shared.insert(
                            id,
                            Shared {
                                secs: ttl_s.min(secs).max(1),
                                alive_at: sent,
                                last_sent: sent,
                                in_flight: Vec::new(),
                                retired: false,
                            },
                        );
                        for (lease, req) in parked {
                            let Some(h) = self.holders.get_mut(&lease) else {
                                continue;
                            };
                            if h.ended {
                                continue;
                            }
                            h.etcd_lease = Some(id);
                            h.ttl_ms = h.ttl_ms.min(ttl_s.saturating_mul(1000).max(1));
                            self.send_txn(lease, req, now);
                        }
                    }
                    Err(e) => {
                        // A transport failure's own text (from the host) is already noted.
                        if !matches!(e, ReplyError::Transport) {
                            self.note_reply_error("lease grant", &e);
                        }
                        for (_, req) in parked {
                            let _ =
                                core.handle_acquire_result(now, req, AcquireResult::TransportError);
                        }
                    }
                }
            }
            Op::Txn { lease, req } => self.on_txn(core, now, lease, req, reply),
            Op::Predecessor { lease, req } => {
                let read = self.read(reply, json::read_first);
                let Some(h) = self.holders.get_mut(&lease) else {
                    if let Some(req) = req {
                        let _ = core.handle_acquire_result(now, req, AcquireResult::TransportError);
                    }
                    return;
                };
                // A member behind our own key's revision may not show every key before it.
                let read = match read {
                    Ok((_, revision)) if revision < h.own_rev => Err(ReplyError::Transport),
                    r => r,
                };
                let Some(req) = req else {
                    h.lookup_in_flight = false;
                    if h.ended || !h.waiting {
                        return;
                    }
                    match read {
                        Ok((Some(key), revision)) => self.open_watch(lease, key, revision, now),
                        // Nobody before us any more: ask again now.
                        Ok((None, _)) => h.recheck_at = now,
                        Err(_) => h.recheck_at = now.saturating_add(REWATCH_AFTER_NS),
                    }
                    return;
                };
                if h.ended {
                    let _ = core.handle_acquire_result(
                        now,
                        req,
                        AcquireResult::HeldByOther {
                            retry_after_ms: None,
                        },
                    );
                    return;
                }
                match read {
                    Ok((None, _)) => {
                        // First in the queue, our key known since the transaction: ours.
                        let fence = h.own_rev;
                        self.own_first(core, now, lease, req, fence);
                    }
                    Ok((Some(key), revision)) => {
                        let ttl_ms = h.ttl_ms;
                        self.refused_to_wait(core, now, req, ttl_ms);
                        let rewatch = self.holders.get(&lease).is_some_and(|h| {
                            h.waiting && !h.ended && h.watch.as_ref().is_none_or(|(_, k)| *k != key)
                        });
                        if rewatch {
                            if let Some((w, _)) =
                                self.holders.get_mut(&lease).and_then(|h| h.watch.take())
                            {
                                self.pending.remove(&w);
                                self.cancels.push_back(w);
                            }
                            self.open_watch(lease, key, revision, now);
                        }
                    }
                    Err(_) => {
                        // Ask with the transaction next time.
                        h.own_rev = 0;
                        let _ = core.handle_acquire_result(now, req, AcquireResult::TransportError);
                    }
                }
            }
            Op::KeepAlive {
                etcd_lease: id,
                renew,
                sent,
            } => {
                let read = self.read(reply, json::read_keepalive);
                let alive = match &read {
                    Ok(ttl) => Some(*ttl > 0),
                    Err(e) if e.code() == Some(CODE_NOT_FOUND) => Some(false),
                    Err(_) => None,
                };
                if let Some(s) = self.shared.get_mut(&id) {
                    s.in_flight.retain(|&(_, t)| t != sent);
                    if alive == Some(true) {
                        s.alive_at = s.alive_at.max(sent);
                    }
                }
                if let Some((_, req)) = renew {
                    let result = match alive {
                        Some(true) => RenewResult::Renewed,
                        Some(false) => RenewResult::Rejected,
                        None => RenewResult::TransportError,
                    };
                    let _ = core.handle_renew_result(now, req, result);
                }
                if alive == Some(false) {
                    self.lease_gone(core, now, id);
                    return;
                }
                // Grants waiting for a keep-alive of this lease: dated now, or not by this one.
                let dating: Vec<(LeaseId, Dating)> = self
                    .holders
                    .iter()
                    .filter(|(_, h)| h.etcd_lease == Some(id) && !h.ended)
                    .filter_map(|(l, h)| h.dating.map(|d| (*l, d)))
                    .collect();
                for (lease, d) in dating {
                    if alive == Some(true) && sent >= d.since {
                        self.grant_when_dated(core, now, lease, d);
                    } else if alive.is_none() && !self.is_dated(id, d.since) {
                        // Not confirmed: the engine asks again (idempotent for our token).
                        if let Some(h) = self.holders.get_mut(&lease) {
                            h.dating = None;
                        }
                        let _ =
                            core.handle_acquire_result(now, d.req, AcquireResult::TransportError);
                    }
                }
                self.drop_if_idle(id, now);
            }
            Op::Delete { lease, req } => {
                let read = self.read(reply, json::read_deleted);
                let result = match read {
                    Ok(n) if n > 0 => ReleaseResult::Released,
                    Ok(_) => ReleaseResult::NotOwner,
                    Err(_) => ReleaseResult::TransportError,
                };
                if let Some(h) = self.holders.get_mut(&lease) {
                    h.deleting = false;
                    let id = h.etcd_lease;
                    if result != ReleaseResult::TransportError {
                        h.own_rev = 0;
                    } else if let Some(id) = id {
                        // Our key may stay on a lease others keep alive.
                        self.retire(id, now);
                    }
                    if let Some(id) = id {
                        self.drop_if_idle(id, now);
                    }
                }
                if let Some(req) = req {
                    let _ = core.handle_release_result(now, req, result);
                }
            }
            Op::Revoke => {}
            Op::Watch { .. } => {}
            Op::StatusFirst { status } => match self.read(reply, json::read_first_owner) {
                Ok(None) => self.statuses.push_back((status, Ok(LockStatus::default()))),
                Ok(Some((fence, lease))) => {
                    self.push(
                        Op::StatusTtl { status, fence },
                        RequestKind::Unary,
                        paths::LEASE_TIMETOLIVE,
                        json!({ "ID": lease.to_string() }),
                        now,
                    );
                }
                Err(e) => self.statuses.push_back((status, Err(e.to_string()))),
            },
            Op::StatusTtl { status, fence } => match self.read(reply, json::read_time_to_live) {
                // The lease ended between the two reads: free now.
                Ok(ttl_s) if ttl_s <= 0 => {
                    self.statuses.push_back((status, Ok(LockStatus::default())))
                }
                Ok(ttl_s) => {
                    let st = LockStatus {
                        held: true,
                        fencing_token: Some(fence as u64),
                        remaining_ttl_ms: Some((ttl_s as u64).saturating_mul(1_000)),
                        ..LockStatus::default()
                    };
                    self.statuses.push_back((status, Ok(st)));
                }
                Err(e) => self.statuses.push_back((status, Err(e.to_string()))),
            },
            Op::Authenticate => {
                let token = self.read(reply, json::read_token);
                let refused = token.is_err();
                if let Some(a) = &mut self.auth {
                    a.request = None;
                    match token {
                        Ok(t) => a.token = t,
                        Err(_) => a.retry_at = now.saturating_add(REAUTH_AFTER_NS),
                    }
                }
                if refused {
                    // What waited for the token fails now (the engine retries within its
                    // budget), rather than when the engine times it out.
                    let why = self.last_error.clone();
                    let waiting: Vec<u64> = self.outbox.drain(..).collect();
                    for id in waiting {
                        match self.pending.get(&id).map(|p| p.kind) {
                            Some(RequestKind::Unary) => {
                                if let Some(p) = self.pending.remove(&id) {
                                    self.on_reply(core, now, p.op, Err(ReplyError::Transport));
                                }
                            }
                            Some(_) => {
                                if let Some(p) = self.pending.remove(&id) {
                                    self.watch_ended(core, now, id, p.op);
                                }
                            }
                            None => {}
                        }
                    }
                    self.last_error = why;
                }
            }
        }
    }

    fn on_txn(
        &mut self,
        core: &mut Client,
        now: u64,
        lease: LeaseId,
        req: RequestId,
        reply: Result<Value, ReplyError>,
    ) {
        let read = self.read(reply, json::read_txn);
        let Some(h) = self.holders.get_mut(&lease) else {
            let _ = core.handle_acquire_result(now, req, AcquireResult::TransportError);
            return;
        };
        h.txns = h.txns.saturating_sub(1);
        let answered = matches!(&read, Ok(t) if t.own_key.as_deref() == Some(&h.key[..]) && t.first_key.is_some());
        if h.ended {
            // Wanted by nobody: remove our key ourselves (the engine has no grant to release),
            // or retire the lease it may be on if the outcome is unknown.
            let id = h.etcd_lease;
            match &read {
                Ok(t) if t.own_key.as_deref() == Some(&h.key[..]) => {
                    if !h.deleting {
                        h.deleting = true;
                        let key = json::b64(&h.key);
                        self.push(
                            Op::Delete { lease, req: None },
                            RequestKind::Unary,
                            paths::KV_DELETE,
                            json!({ "key": key }),
                            now,
                        );
                    }
                }
                Ok(_) => {}
                Err(e) if e.code() == Some(CODE_NOT_FOUND) => {}
                Err(_) => {
                    if let Some(id) = id {
                        self.retire(id, now);
                    }
                }
            }
            if let Some(id) = id {
                self.drop_if_idle(id, now);
            }
            let _ = core.handle_acquire_result(
                now,
                req,
                AcquireResult::HeldByOther {
                    retry_after_ms: None,
                },
            );
            return;
        }
        let t = match read {
            Ok(t) if answered => t,
            Ok(_) => {
                h.txn_unknown = true;
                self.garbage("acquire: the transaction did not return our key and the first");
                let _ = core.handle_acquire_result(now, req, AcquireResult::TransportError);
                return;
            }
            Err(e) => {
                if e.code() == Some(CODE_NOT_FOUND) {
                    // Our etcd lease is gone (it expired): so is everything bound to it.
                    if let Some(id) = h.etcd_lease {
                        let _ = core.handle_acquire_result(now, req, AcquireResult::TransportError);
                        self.lease_gone(core, now, id);
                        return;
                    }
                } else {
                    h.txn_unknown = true;
                }
                let _ = core.handle_acquire_result(now, req, AcquireResult::TransportError);
                return;
            }
        };
        h.txn_unknown = false;
        if t.own_lease != 0 && Some(t.own_lease) != h.etcd_lease {
            // Our token's key, bound to an earlier etcd lease of ours: adopt it.
            let secs = h.secs;
            h.etcd_lease = Some(t.own_lease);
            self.shared.entry(t.own_lease).or_insert(Shared {
                secs,
                alive_at: 0,
                last_sent: 0,
                in_flight: Vec::new(),
                retired: true,
            });
        }
        let Some(h) = self.holders.get_mut(&lease) else {
            return;
        };
        h.own_rev = t.own_rev;
        if t.first_key.as_deref() == Some(&h.key[..]) {
            self.own_first(core, now, lease, req, t.own_rev);
            return;
        }
        h.waiting = true;
        let ttl_ms = h.ttl_ms;
        self.refused_to_wait(core, now, req, ttl_ms);
        if let Some(h) = self.holders.get_mut(&lease) {
            if h.waiting && !h.ended && h.watch.is_none() && !h.lookup_in_flight {
                h.lookup_in_flight = true;
                self.send_lookup(lease, now, None);
            }
        }
    }

    /// Reads a parsed reply; a reply of the wrong shape is counted and noted.
    fn read<T>(
        &mut self,
        reply: Result<Value, ReplyError>,
        f: impl FnOnce(&Value) -> Result<T, ReplyError>,
    ) -> Result<T, ReplyError> {
        let v = reply?;
        let r = f(&v);
        if let Err(e) = &r {
            self.garbage(&e.to_string());
        }
        r
    }

    /// Watches `key` (our predecessor, read at `revision`) for its deletion.
    fn open_watch(&mut self, lease: LeaseId, key: Vec<u8>, revision: i64, now: u64) {
        let body = json!({ "create_request": {
            "key": json::b64(&key),
            "start_revision": (revision + 1).to_string(),
        }});
        self.counters.watches += 1;
        let id = self.push(
            Op::Watch {
                lease,
                key: key.clone(),
            },
            RequestKind::Watch,
            paths::WATCH,
            body,
            now,
        );
        if let Some(h) = self.holders.get_mut(&lease) {
            h.watch = Some((id, key));
        }
    }

    /// Reads the youngest key older than ours. Serializable (the member answers from its
    /// own state, no Raft round): no key older than ours can be created after ours, so a
    /// member that has applied our key's revision cannot miss one that still exists; at
    /// worst it shows one already deleted, and the watch from its revision sees the delete.
    fn send_lookup(&mut self, lease: LeaseId, now: u64, req: Option<RequestId>) {
        let Some(h) = self.holders.get(&lease) else {
            return;
        };
        let prefix = queue_prefix(&h.name);
        let body = json!({
            "key": json::b64(&prefix),
            "range_end": json::b64(&prefix_end(&prefix)),
            "sort_order": "DESCEND",
            "sort_target": "CREATE",
            "limit": "1",
            "keys_only": true,
            "serializable": true,
            "max_create_revision": (h.own_rev - 1).max(1).to_string(),
        });
        self.push(
            Op::Predecessor { lease, req },
            RequestKind::Unary,
            paths::KV_RANGE,
            body,
            now,
        );
    }

    /// Reads one watch message; returns whether the watch is over (woken or cancelled).
    fn watch_message(
        &mut self,
        core: &mut Client,
        now: u64,
        id: u64,
        op: &Op,
        msg: &json::WatchMessage,
    ) -> bool {
        let Op::Watch { lease, key } = op else {
            return false;
        };
        let deleted = msg.deleted_keys.iter().any(|k| k == key);
        if !(deleted || msg.canceled) {
            return false;
        }
        if let Some(h) = self.holders.get_mut(lease) {
            if h.watch.as_ref().is_some_and(|(w, _)| *w == id) {
                h.watch = None;
                if h.waiting && !h.ended {
                    self.counters.wakeups += 1;
                    let _ = core.handle_wake(now, *lease);
                }
            }
        }
        self.cancels.push_back(id);
        true
    }

    /// A watch stream is over (woken, cut, failed): a waiter that still waits looks again.
    fn watch_ended(&mut self, _core: &mut Client, now: u64, id: u64, op: Op) {
        let Op::Watch { lease, .. } = op else {
            return;
        };
        if let Some(h) = self.holders.get_mut(&lease) {
            if h.watch.as_ref().is_some_and(|(w, _)| *w == id) {
                h.watch = None;
                if h.waiting && !h.ended {
                    h.recheck_at = h.recheck_at.min(now.saturating_add(REWATCH_AFTER_NS));
                }
            }
        }
    }

    /// The engine lease ended. A waiter that gave up deletes its key here (the engine sends
    /// no release for a lock it never got); otherwise the engine's release does.
    fn ended(&mut self, lease: LeaseId, now: u64, gave_up: bool) {
        let Some(h) = self.holders.get_mut(&lease) else {
            return;
        };
        h.ended = true;
        h.waiting = false;
        h.parked = None;
        h.dating = None;
        h.forget_at = now.saturating_add(FORGET_AFTER_NS);
        if let Some((w, _)) = h.watch.take() {
            self.pending.remove(&w);
            self.cancels.push_back(w);
        }
        let id = h.etcd_lease;
        let unknown = h.txn_unknown;
        if gave_up && id.is_some() && (h.own_rev > 0 || unknown) && !h.deleting {
            h.deleting = true;
            let key = json::b64(&h.key);
            self.push(
                Op::Delete { lease, req: None },
                RequestKind::Unary,
                paths::KV_DELETE,
                json!({ "key": key }),
                now,
            );
        }
        if let Some(id) = id {
            if gave_up && unknown {
                // A transaction of ours may still land after the delete.
                self.retire(id, now);
            }
            self.drop_if_idle(id, now);
        }
    }

    fn forget_lease(h: &mut Holder) {
        h.etcd_lease = None;
        h.own_rev = 0;
        h.waiting = false;
    }

    fn push(
        &mut self,
        op: Op,
        kind: RequestKind,
        path: &'static str,
        body: Value,
        now: u64,
    ) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.counters.requests += 1;
        let body = serde_json::to_vec(&body).unwrap_or_default();
        self.pending.insert(
            id,
            Pending {
                op,
                kind,
                path,
                body,
            },
        );
        if kind == RequestKind::Unary {
            self.expiry
                .push(Reverse((now.saturating_add(FORGET_AFTER_NS), id)));
        }
        self.outbox.push_back(id);
        id
    }

    /// Forgets requests the host never answered (failing the protocol's own ones, so nothing
    /// waits for them forever) and records of leases long ended.
    fn prune(&mut self, core: &mut Client, now: u64) {
        while let Some(Reverse((at, id))) = self.expiry.peek().copied() {
            if at > now {
                break;
            }
            self.expiry.pop();
            if let Some(p) = self.pending.remove(&id) {
                self.on_reply(core, now, p.op, Err(ReplyError::Transport));
            }
        }
        self.holders.retain(|_, h| !(h.ended && h.forget_at <= now));
        // A pooled lease not kept alive for its TTL may have expired: the next acquire
        // takes a fresh one.
        let lapsed: Vec<i64> = self
            .shared
            .iter()
            .filter(|(_, s)| s.alive_at.saturating_add(s.secs.saturating_mul(1_000 * MS)) <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in lapsed {
            for pool in self.pools.values_mut() {
                if pool.lease == Some(id) {
                    pool.lease = None;
                }
            }
            self.drop_if_idle(id, now);
        }
    }

    fn note_reply_error(&mut self, what: &str, e: &ReplyError) {
        self.note_error(&format!("{what}: {e}"));
    }

    fn garbage(&mut self, msg: &str) {
        self.counters.garbage_replies += 1;
        self.note_error(&format!("unexpected reply: {msg}"));
    }

    fn note_error(&mut self, text: &str) {
        let mut end = text.len().min(MAX_ERROR_TEXT);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.last_error = text[..end].to_owned();
    }
}

/// How much of a lock's TTL a grant may lose to the age of the pooled lease's last
/// keep-alive rather than wait for a fresh one: 1% of the TTL (the engine's default drift
/// allowance is of the same order).
fn shortfall_allowance_ns(ttl_ms: u64) -> u64 {
    ttl_ms.saturating_mul(MS) / 100
}

/// A waiting lease's keep-alive cadence: a third of its TTL, as the engine renews.
fn keepalive_interval(ttl_ms: u64) -> u64 {
    (ttl_ms.max(3) / 3).saturating_mul(MS)
}
