//! The Redis protocol (docs/design.md §6): keys, scripts, argument vectors, reply interpretation, the
//! wait queue and the wake channel, in one sans-IO object.
//!
//! [`RedisProtocol`] sits between the lease engine ([`Client`]) and a host that owns two Redis
//! connections: one for commands and one subscriber. It turns the engine's commands into
//! [`Request`]s (argument vectors the host runs verbatim), and the host's replies, pub/sub
//! messages and subscription confirmations into the engine's inputs. Events for the
//! application come out of [`RedisProtocol::poll_event`]. Every input takes `now`, like the
//! engine's; nothing here reads a clock or touches a socket.
//!
//! # The parts
//!
//! - [`scripts`]: the keys, the Lua scripts and the wake-channel messages;
//! - [`value`]: replies as the host hands them over;
//! - `requests.rs`: what each engine command becomes (a script call with its arguments);
//! - `replies.rs`: what each reply means;
//! - `queue.rs`, the handoff: a refused ACQUIRE queues the lease, RELEASE wakes one queued
//!   lease and puts the next two on standby, and idle waiters answer their own retries;
//! - `subscription.rs`: the wake channel (or, for a cluster, one shard channel per name)
//!   and what happens when it takes effect or is lost;
//! - [`wire`]: RESP2/RESP3 and one connection's handshake, pipelining and pushes, for
//!   hosts that only move bytes;
//! - [`stream`]: the protocol with its two connections in the core (the *stream* kind of
//!   the seam), to an endpoint parsed from a URL ([`url`]);
//! - the shared outbox (`backend::outbox`): pending requests, their expiry, the event and
//!   status queues and the last error, as every protocol keeps them.
//!
//! # Bounded keyspace
//!
//! The fence key expires `key_keep_ms` after the lease it was minted for would; the queue key
//! `key_keep_ms` after the holder it waits for. Fences are `max(previous + 1, server TIME in
//! µs)`, so once the fence key is gone the server clock, far past the last fence, keeps them
//! increasing. Queue entries older than `queue_max_age_ms` are dropped at a release; a lease
//! that gives up removes its own entry (ZREM).
//!
//! # Faults
//!
//! Error replies (the scripts answer garbage in the keyspace with `lh: …` errors), replies of
//! the wrong shape and transport failures are transport errors for the engine, never grants;
//! `NOSCRIPT` re-sends the same call as EVAL once (which loads the script for later EVALSHAs).
//! Replies to unknown or already answered ids are counted and ignored.

mod arg;
mod queue;
mod replies;
mod requests;
pub mod scripts;
mod sha1;
pub mod stream;
mod subscription;
pub mod url;
pub mod wire;
pub use super::value;

use std::collections::HashMap;

pub use arg::{Arg, INLINE_ARG_LEN};
pub use scripts::{
    KeyKind, Script, WakeMessage, key, parse_message, shard_channel, shard_channel_name,
};
pub use value::{DecodeError, FlatValue, Value, decode, encode};

use super::outbox::{IdHash, MS, NEVER, Outbox, id_hash};
use crate::{
    AcquireResult, Client, Event, LeaseId, LockName, Output, ReleaseResult, RenewResult, RequestId,
    Token,
};
use queue::{NameState, Waiting};
use replies::{describe, status_reply};
use subscription::{Shard, wake_channel};

/// Longest diagnostic kept from a reply.
const MAX_ERROR_TEXT: usize = 256;

/// Tunables of the protocol. The defaults suit production; tests shorten them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisOptions {
    /// How long a standby waits for `taken` before it tries itself (bounds the time a frozen
    /// head waiter keeps the lock free).
    pub standby_delay_ms: u64,
    /// How long the fence and queue keys outlive the lease they serve.
    pub key_keep_ms: u64,
    /// Queue entries older than this are dropped at a release (waiters that died queued).
    pub queue_max_age_ms: u64,
    /// How long a queued waiter behind the head waits before it asks again on its own (the
    /// head asks when the holder's time is up; the others are woken in turn). Bounds what an
    /// idle waiter costs: at most one script call per this interval.
    pub idle_recheck_ms: u64,
    /// Redis Cluster: wake-ups travel on one shard channel per name (`lh:{NAME}:wake`, in the
    /// slot of the name's keys) with SPUBLISH / SSUBSCRIBE (Redis 7+), subscribed while this
    /// client has leases waiting on the name. Off: one channel per client (PUBLISH /
    /// SUBSCRIBE), which a cluster would broadcast to every node.
    pub sharded_wake: bool,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            standby_delay_ms: 150,
            key_keep_ms: 60_000,
            queue_max_age_ms: 600_000,
            idle_recheck_ms: 10_000,
            sharded_wake: false,
        }
    }
}

impl RedisOptions {
    /// Rejects values the scripts cannot take or that defeat the protocol's bounds.
    pub fn validate(&self) -> Result<(), crate::Error> {
        if self.standby_delay_ms == 0 || self.standby_delay_ms > 60_000 {
            return Err(crate::Error::InvalidConfig(
                "standby_delay_ms must be in [1, 60000]",
            ));
        }
        if self.key_keep_ms > 86_400_000 {
            return Err(crate::Error::InvalidConfig(
                "key_keep_ms must be at most one day",
            ));
        }
        if self.queue_max_age_ms == 0 || self.queue_max_age_ms > 86_400_000 {
            return Err(crate::Error::InvalidConfig(
                "queue_max_age_ms must be in [1 ms, one day]",
            ));
        }
        if self.idle_recheck_ms > 3_600_000 {
            return Err(crate::Error::InvalidConfig(
                "idle_recheck_ms must be at most one hour",
            ));
        }
        Ok(())
    }
}

/// Which connection runs a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Connection {
    /// The ordinary connection (scripts, ZREM).
    Commands = 1,
    /// The pub/sub connection (SUBSCRIBE).
    Subscriber = 2,
}

/// A request for the host: run `args` on `connection` and answer `id` with the reply
/// ([`RedisProtocol::handle_reply`]) or a transport failure
/// ([`RedisProtocol::handle_request_failed`]). A SUBSCRIBE is answered by its confirmation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// Id to answer with; never reused.
    pub id: u64,
    /// Where to run it.
    pub connection: Connection,
    /// The argument vector, command name first.
    pub args: &'a [Arg],
}

/// What the protocol saw, for diagnostics and tests (monotonic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RedisCounters {
    /// Requests emitted.
    pub requests: u64,
    /// Script calls emitted (EVALSHA and EVAL).
    pub script_calls: u64,
    /// EVALSHAs re-sent as EVAL after NOSCRIPT.
    pub noscript_retries: u64,
    /// Error replies (other than a NOSCRIPT that was retried).
    pub error_replies: u64,
    /// Replies of a shape the request cannot have.
    pub garbage_replies: u64,
    /// Replies and failures for unknown or already answered ids.
    pub stale_replies: u64,
    /// Transport failures reported by the host.
    pub transport_failures: u64,
    /// Retries answered without a round trip (the lease's entry is queued, nothing changed).
    pub local_refusals: u64,
    /// Wake-ups received.
    pub wakeups: u64,
    /// Standbys that tried after hearing nothing.
    pub standby_takeovers: u64,
    /// Messages and confirmations that were not for this protocol object, or malformed.
    pub ignored_messages: u64,
    /// Times the subscription took effect.
    pub subscriptions: u64,
    /// Times the host reported the subscription lost.
    pub subscriber_losses: u64,
}

#[derive(Debug)]
enum Op {
    Acquire {
        req: RequestId,
        lease: LeaseId,
        name: LockName,
        token: Token,
        /// The subscription was live when it was sent.
        covered: bool,
        /// The name's epoch when it was sent.
        epoch: u64,
        /// The lease's wake-ups when it was sent.
        wakes: u32,
    },
    Renew {
        req: RequestId,
    },
    Release {
        req: RequestId,
    },
    /// ZREM of a queue entry (best effort).
    Leave,
    Subscribe,
    /// SSUBSCRIBE of a name's shard channel (sharded wake).
    ShardSubscribe {
        name: LockName,
    },
    /// A status query (`leasehold status`); its answer goes to `statuses`.
    Status,
}

#[derive(Debug)]
struct Pending {
    op: Op,
    connection: Connection,
    args: Vec<Arg>,
    script: Option<Script>,
    sent_at: u64,
    retried: bool,
}

/// The Redis protocol of one client core. See the module docs.
#[derive(Debug)]
pub struct RedisProtocol {
    opts: RedisOptions,
    wake: Vec<u8>,
    shas: &'static [[u8; 40]; 4],
    out: Outbox<Pending>,
    subscribed: bool,
    subscribe_pending: bool,
    resubscribe_at: u64,
    sub_failures: u32,
    epochs: u64,
    names: HashMap<LockName, NameState>,
    leases: HashMap<LeaseId, Waiting, IdHash>,
    /// Leases by token, from their first acquire until their terminal event, to find the
    /// lease a wake-channel message names (and whether it already holds the lock).
    tokens: HashMap<Token, (LeaseId, LockName), IdHash>,
    /// The tokens of leases that hold their lock, to forget them at their terminal event.
    held: HashMap<LeaseId, Token, IdHash>,
    /// Sharded wake: the names whose channel is wanted (the engine's Watch .. Unwatch).
    shards: HashMap<LockName, Shard>,
    standbys: usize,
    /// Names whose `recheck_at` is armed.
    rechecks: usize,
    counters: RedisCounters,
}

impl RedisProtocol {
    /// Creates the protocol for one core. `wake_random` names its wake channel: fresh
    /// randomness per process (a forked child must call [`Self::set_wake_random`]).
    pub fn new(
        opts: RedisOptions,
        wake_random: [u8; scripts::WAKE_RANDOM_LEN],
    ) -> Result<Self, crate::Error> {
        opts.validate()?;
        let mut p = Self {
            opts,
            wake: Vec::new(),
            shas: Script::all_sha1_hex(),
            out: Outbox::default(),
            subscribed: false,
            subscribe_pending: false,
            resubscribe_at: NEVER,
            sub_failures: 0,
            epochs: 0,
            names: HashMap::new(),
            leases: HashMap::with_hasher(id_hash()),
            tokens: HashMap::with_hasher(id_hash()),
            held: HashMap::with_hasher(id_hash()),
            shards: HashMap::new(),
            standbys: 0,
            rechecks: 0,
            counters: RedisCounters::default(),
        };
        p.wake = wake_channel(&wake_random);
        if !opts.sharded_wake {
            p.send_subscribe(0);
        }
        Ok(p)
    }

    /// The options.
    pub fn options(&self) -> &RedisOptions {
        &self.opts
    }

    /// Counters.
    pub fn counters(&self) -> RedisCounters {
        self.counters
    }

    /// The last error reply or malformed reply seen, for diagnostics ("" if none).
    pub fn last_error(&self) -> &str {
        self.out.last_error()
    }

    // ------------------------------------------------------------------------ outputs

    /// The next request to execute, once the engine's commands are translated. The arguments
    /// borrow this object until its next mutation.
    pub fn poll_request(&mut self, core: &mut Client) -> Option<Request<'_>> {
        self.pump(core);
        let (id, p) = self.out.next_ready()?;
        Some(Request {
            id,
            connection: p.connection,
            args: &p.args,
        })
    }

    /// Whether [`Self::poll_request`] may give a request, taking and moving nothing.
    pub fn has_request(&self, core: &Client) -> bool {
        self.out.has_request(core)
    }

    /// The next event for the application.
    pub fn poll_event(&mut self, core: &mut Client) -> Option<Event> {
        self.pump(core);
        self.out.pop_event()
    }

    /// Queues a status query for `name` (`leasehold status`): one read-only EVAL on the
    /// commands connection. Its answer comes out of [`Self::poll_status`] under the returned
    /// id, which is also the request's id.
    pub fn request_status(&mut self, now: u64, name: &str) -> Result<u64, crate::Error> {
        let lock = key(KeyKind::Lock, name)?;
        let fence = key(KeyKind::Fence, name)?;
        let args = vec![
            Arg::Static(b"EVAL"),
            Arg::Static(scripts::STATUS_SCRIPT.as_bytes()),
            Arg::Static(b"2"),
            Arg::from(lock),
            Arg::from(fence),
        ];
        let expires = now.saturating_add(60_000 * MS);
        Ok(self.push(Op::Status, Connection::Commands, None, args, now, expires))
    }

    /// The next answered status query: its id and what the server said (or why not).
    pub fn poll_status(&mut self) -> Option<crate::backend::StatusAnswer> {
        self.out.pop_status()
    }

    /// When [`Self::handle_timeout`] must be called at the latest (the engine's deadline or
    /// the protocol's own: a standby, a re-subscription).
    pub fn poll_timeout(&mut self, core: &mut Client) -> Option<u64> {
        let mut t = core
            .poll_timeout()
            .unwrap_or(NEVER)
            .min(self.resubscribe_at);
        if self.standbys > 0 || self.rechecks > 0 {
            for s in self.names.values() {
                t = t.min(s.standby_until).min(s.recheck_at);
            }
        }
        (t != NEVER).then_some(t)
    }

    // ------------------------------------------------------------------------- inputs

    /// Time passed: runs the engine's timers, fires due standbys, rechecks and
    /// re-subscriptions.
    pub fn handle_timeout(&mut self, core: &mut Client, now: u64) {
        core.handle_timeout(now);
        let now = core.now();
        self.fire_standbys(core, now);
        self.resubscribe_if_due(now);
        self.prune(now);
        self.pump(core);
    }

    /// The reply to request `id`. Unknown and already answered ids are counted and ignored.
    pub fn handle_reply(&mut self, core: &mut Client, now: u64, id: u64, reply: &Value<'_>) {
        core.handle_timeout(now);
        let now = core.now();
        let Some(p) = self.out.take(id) else {
            self.counters.stale_replies += 1;
            self.pump(core);
            return;
        };
        if let (Value::Error(msg), Some(script), false) = (reply, p.script, p.retried) {
            if msg.starts_with(b"NOSCRIPT") {
                self.counters.noscript_retries += 1;
                let mut args = p.args;
                args[0] = Arg::Static(b"EVAL");
                args[1] = Arg::Static(script.text().as_bytes());
                let expires = self.expiry_of(&p.op, now);
                let new = self.push(p.op, p.connection, Some(script), args, now, expires);
                if let Some(n) = self.out.get_mut(new) {
                    n.retried = true;
                    // Validity still counts from the first send: the engine dates the grant.
                    n.sent_at = p.sent_at;
                }
                self.pump(core);
                return;
            }
        }
        match p.op {
            Op::Acquire {
                req,
                lease,
                name,
                token,
                covered,
                epoch,
                wakes,
            } => {
                let attempt = queue::Attempt {
                    lease,
                    name,
                    token,
                    covered,
                    epoch,
                    wakes,
                    sent_at: p.sent_at,
                };
                let result = self.acquire_result(reply, attempt, now);
                let _ = core.handle_acquire_result(now, req, result);
            }
            Op::Renew { req } => {
                let result = match self.flag_reply(reply, "RENEW") {
                    Some(true) => RenewResult::Renewed,
                    Some(false) => RenewResult::Rejected,
                    None => RenewResult::TransportError,
                };
                let _ = core.handle_renew_result(now, req, result);
            }
            Op::Release { req } => {
                let result = match self.flag_reply(reply, "RELEASE") {
                    Some(true) => ReleaseResult::Released,
                    Some(false) => ReleaseResult::NotOwner,
                    None => ReleaseResult::TransportError,
                };
                let _ = core.handle_release_result(now, req, result);
            }
            Op::Leave => {
                if let Value::Error(msg) = reply {
                    self.note_error("error reply", msg);
                    self.counters.error_replies += 1;
                }
            }
            Op::Status => {
                let answer = status_reply(reply);
                if let Err(e) = &answer {
                    self.note_error("STATUS failed", e.as_bytes());
                }
                self.out.answer_status((id, answer));
            }
            Op::Subscribe => self.on_subscribe_reply(core, now, reply),
            Op::ShardSubscribe { name } => {
                self.on_shard_subscribe_reply(core, now, id, &name, reply)
            }
        }
        self.pump(core);
    }

    /// Request `id` failed in transport (the connection broke, a timeout): the engine sees a
    /// transport error and retries as it sees fit.
    pub fn handle_request_failed(&mut self, core: &mut Client, now: u64, id: u64) {
        self.handle_request_failed_because(core, now, id, "");
    }

    /// [`Self::handle_request_failed`] with the host's reason, kept as the last error.
    pub fn handle_request_failed_because(
        &mut self,
        core: &mut Client,
        now: u64,
        id: u64,
        message: &str,
    ) {
        self.request_failed(core, now, id, message, AcquireResult::TransportError);
    }

    /// Until when request `id` is worth sending: an acquire's
    /// [`Client::acquire_send_deadline`] (`Some(0)`: no more), `None` for any other request.
    pub(crate) fn send_deadline(&self, core: &Client, id: u64) -> Option<u64> {
        match self.out.get(id)?.op {
            Op::Acquire { req, .. } => Some(core.acquire_send_deadline(req).unwrap_or(0)),
            _ => None,
        }
    }

    /// Request `id` was never written to a connection (it waited for one that did not open):
    /// as [`Self::handle_request_failed_because`], but an acquire that never left leaves no
    /// grant behind, so no cleanup release is owed for it.
    pub fn handle_request_not_sent(&mut self, core: &mut Client, now: u64, id: u64, message: &str) {
        self.request_failed(core, now, id, message, AcquireResult::NotApplied);
    }

    fn request_failed(
        &mut self,
        core: &mut Client,
        now: u64,
        id: u64,
        message: &str,
        acquire: AcquireResult<'_>,
    ) {
        core.handle_timeout(now);
        let now = core.now();
        let Some(p) = self.out.take(id) else {
            self.counters.stale_replies += 1;
            self.pump(core);
            return;
        };
        self.counters.transport_failures += 1;
        if !message.is_empty() {
            self.note_error("request failed", message.as_bytes());
        }
        match p.op {
            Op::Acquire { req, .. } => {
                let _ = core.handle_acquire_result(now, req, acquire);
            }
            Op::Renew { req } => {
                let _ = core.handle_renew_result(now, req, RenewResult::TransportError);
            }
            Op::Release { req } => {
                let _ = core.handle_release_result(now, req, ReleaseResult::TransportError);
            }
            // The entry goes at the next release by age, or when the queue key expires.
            Op::Leave => {}
            Op::Subscribe => self.subscribe_failed(now),
            Op::ShardSubscribe { name } => self.shard_failed(&name, id, now),
            Op::Status => self
                .out
                .answer_status((id, Err("the request failed in transport".to_owned()))),
        }
        self.pump(core);
    }

    // ---------------------------------------------------------------------- internals

    /// Translates the engine's outputs: commands become requests, events are queued.
    fn pump(&mut self, core: &mut Client) {
        while let Some(out) = core.poll_output() {
            match out {
                Output::Event(ev) => {
                    self.on_event(&ev, core.now());
                    self.out.push_event(ev);
                }
                Output::Command(cmd) => self.on_command(core, cmd),
            }
        }
    }

    fn expiry_of(&self, op: &Op, now: u64) -> u64 {
        match op {
            Op::Subscribe | Op::ShardSubscribe { .. } => NEVER,
            _ => now.saturating_add(60_000 * MS),
        }
    }

    fn push(
        &mut self,
        op: Op,
        connection: Connection,
        script: Option<Script>,
        args: Vec<Arg>,
        now: u64,
        expires: u64,
    ) -> u64 {
        self.counters.requests += 1;
        if script.is_some() {
            self.counters.script_calls += 1;
        }
        self.out.push(
            Pending {
                op,
                connection,
                args,
                script,
                sent_at: now,
                retried: false,
            },
            expires,
        )
    }

    /// Forgets requests the engine can no longer care about (it timed them out long ago), so
    /// a host that never answers some cannot grow the table.
    fn prune(&mut self, now: u64) {
        while let Some((id, p)) = self.out.pop_expired(now) {
            if let Op::Status = p.op {
                self.out
                    .answer_status((id, Err("no answer within 60 s".to_owned())));
            }
        }
    }

    fn note_error(&mut self, what: &str, detail: &[u8]) {
        let text = String::from_utf8_lossy(&detail[..detail.len().min(MAX_ERROR_TEXT)]);
        self.out.set_last_error(format!("{what}: {text}"));
    }
}
