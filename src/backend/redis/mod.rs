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
//! # Handoff: wake one, with a standby
//!
//! Each protocol object subscribes one wake channel of its own (`lh:wake:` + 32 hex digits).
//! A refused ACQUIRE queues the lease in `lh:{NAME}:queue` (entry `wake#token`, scored by
//! server time, a retry keeps its place). RELEASE pops the oldest entry whose channel has a
//! subscriber and publishes `w TOKEN NAME` to it (wake up and try), and `s1 TOKEN NAME` /
//! `s2 TOKEN NAME` to the two entries after it (stand by, with a rank); TOKEN is the entry's
//! own, so the message reaches the lease whose entry it is ([`Client::handle_wake`]), not
//! whichever of this client's waiters of the name is first. A granted ACQUIRE removes its
//! own entry and publishes `g TTL TOKEN NAME` (granted for TTL ms) to each of the first two
//! entries left: a standby stands down, and that entry's lease looks again when the grant
//! runs out, so a holder that freezes is taken over at its expiry even by a waiter whose
//! refusal, from further back in the queue, told it to wait `idle_recheck_ms` (older
//! scripts send `t NAME`, which only stands a standby down). A standby that
//! hears no `g` within rank × the standby delay (150 ms by default) tries itself: a frozen
//! or dead head (a SIGSTOP'd process whose socket is still open, so its PUBLISH counted)
//! keeps the lock free for about one delay (two frozen in a row: two), never for a TTL, and
//! it has been popped, so it costs one handoff once. An ordinary handoff is two script
//! calls (RELEASE, the woken waiter's ACQUIRE); the standby notices are PUBLISHes inside
//! them.
//! Direct grants (RELEASE granting the head) were not kept: they save one call per handoff
//! but need the grantee's send time to date the grant, a notice path, and releases of grants
//! nobody wants any more; the wake-one queue meets the bounds without them.
//!
//! Idle waiters cost almost nothing: a refused ACQUIRE whose entry is queued while the
//! subscription is live makes that lease's later retries (the engine's quick attempts) local
//! refusals, until a wake-up, a re-subscription, or — for the head of the queue — the
//! holder's expiry (it may have died without releasing), and for the others
//! `idle_recheck_ms` (10 s): only then does the lease ask Redis again.
//!
//! # Bounded keyspace
//!
//! The fence key expires `key_keep_ms` after the lease it was minted for would; the queue key
//! `key_keep_ms` after the holder it waits for. Fences are `max(previous + 1, server TIME in
//! µs)`, so once the fence key is gone the server clock, far past the last fence, keeps them
//! increasing. Queue entries older than `queue_max_age_ms` are dropped at a release; a lease
//! that gives up removes its own entry (ZREM).
//!
//! # Subscription
//!
//! The first request is `SUBSCRIBE wake` on the subscriber connection. Until the host
//! confirms it ([`RedisProtocol::handle_subscription`], or the confirmation as the reply), a
//! wake-up may be lost, so no retry is answered locally. When the subscription takes effect —
//! first or again after the host reports it lost — every name with local waiters is checked
//! once (one real ACQUIRE), because a release in the gap reached nobody.
//!
//! # Sharded wake (Redis Cluster)
//!
//! With [`RedisOptions::sharded_wake`] there is no client channel: a name's notices go to its
//! shard channel `lh:{NAME}:wake` (SPUBLISH, in the slot of the name's keys), which this
//! object SSUBSCRIBEs while the engine watches the name (its first waiter to its last) and
//! re-checks once the subscription takes effect. Every waiting client hears every notice; only
//! one naming a lease of this object acts, so a release still wakes one lease.
//!
//! Error replies (the scripts answer garbage in the keyspace with `lh: …` errors), replies of
//! the wrong shape and transport failures are transport errors for the engine, never grants;
//! `NOSCRIPT` re-sends the same call as EVAL once (which loads the script for later EVALSHAs).
//! Replies to unknown or already answered ids are counted and ignored.

pub mod scripts;
pub mod value;

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

pub use scripts::{
    KeyKind, Script, WakeMessage, key, parse_message, shard_channel, shard_channel_name,
};
pub use value::{DecodeError, FlatValue, Value, decode, encode};

use super::LockStatus;
use crate::{
    AcquireResult, Client, Command, Event, LeaseId, LockName, Output, ReleaseResult, RenewResult,
    RequestId, Token,
};

const NEVER: u64 = u64::MAX;
const MS: u64 = 1_000_000;
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

/// One argument of a request.
pub type Arg = Cow<'static, [u8]>;

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

/// Reads the STATUS script's reply: `[fence or nil, pttl, last fence or nil]`.
fn status_reply(reply: &Value<'_>) -> Result<LockStatus, String> {
    let fence = |v: &Value<'_>| -> Result<Option<u64>, String> {
        match v {
            Value::Nil => Ok(None),
            Value::Bulk(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|t| t.parse::<u64>().ok())
                .filter(|f| (1..=scripts::MAX_FENCE).contains(f))
                .map(Some)
                .ok_or_else(|| format!("bad fence {}", describe(v))),
            other => Err(format!("bad fence {}", describe(other))),
        }
    };
    let Value::Array(items) = reply else {
        return Err(match reply {
            Value::Error(e) => {
                String::from_utf8_lossy(&e[..e.len().min(MAX_ERROR_TEXT)]).into_owned()
            }
            other => format!("unexpected reply {}", describe(other)),
        });
    };
    let [f, Value::Int(pttl), last] = items.as_slice() else {
        return Err(format!("unexpected reply {}", describe(reply)));
    };
    let (f, last) = (fence(f)?, fence(last)?);
    let mut st = LockStatus {
        last_fencing_token: last.max(f),
        ..LockStatus::default()
    };
    match (f, *pttl) {
        (Some(f), ms) if ms > 0 => {
            st.held = true;
            st.fencing_token = Some(f);
            st.remaining_ttl_ms = Some(ms as u64);
        }
        // -2: no lock key (or it expired between the two reads).
        (_, -2) => {}
        (_, ms) => return Err(format!("lock key with pttl {ms}: not a leasehold lock")),
    }
    Ok(st)
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

/// A name with acquiring leases here.
#[derive(Debug)]
struct NameState {
    /// Bumped by every event after which a queued refusal may be out of date.
    epoch: u64,
    leases: u32,
    standby_until: u64,
    /// The lease a standby message named (the earliest armed one): the lease it wakes.
    standby_lease: Option<LeaseId>,
    /// When the latest grant reported by a `g` notice runs out: the lease it named looks
    /// again then (the holder may have frozen). `NEVER` if none.
    recheck_at: u64,
    recheck_lease: Option<LeaseId>,
}

/// A name whose shard channel this client wants (sharded wake): it has leases waiting on it.
#[derive(Debug)]
struct Shard {
    channel: Vec<u8>,
    /// The SSUBSCRIBE took effect and was not lost since.
    live: bool,
    /// The SSUBSCRIBE in flight, if any.
    subscribing: Option<u64>,
}

/// A refusal after which nothing can change for the lease before `until` unless the name's
/// epoch moves: its entry is queued and the subscription was live throughout.
#[derive(Debug, Clone, Copy)]
struct Quiet {
    epoch: u64,
    until: u64,
}

#[derive(Debug)]
struct Waiting {
    name: LockName,
    token: Token,
    /// A refusal queued the entry (remove it if the lease gives up).
    queued: bool,
    quiet: Option<Quiet>,
    /// Wake-ups aimed at this lease: a refusal sent before the latest one is older news and
    /// must not quiet the lease.
    wakes: u32,
}

/// The Redis protocol of one client core. See the module docs.
#[derive(Debug)]
pub struct RedisProtocol {
    opts: RedisOptions,
    wake: Vec<u8>,
    shas: [[u8; 40]; 3],
    next_id: u64,
    pending: HashMap<u64, Pending>,
    expiry: BinaryHeap<Reverse<(u64, u64)>>,
    outbox: VecDeque<u64>,
    events: VecDeque<Event>,
    subscribed: bool,
    subscribe_pending: bool,
    resubscribe_at: u64,
    sub_failures: u32,
    epochs: u64,
    names: HashMap<LockName, NameState>,
    leases: HashMap<LeaseId, Waiting>,
    /// Leases by token, from their first acquire until their terminal event, to find the
    /// lease a wake-channel message names (and whether it already holds the lock).
    tokens: HashMap<Token, (LeaseId, LockName)>,
    /// The tokens of leases that hold their lock, to forget them at their terminal event.
    held: HashMap<LeaseId, Token>,
    /// Sharded wake: the names whose channel is wanted (the engine's Watch .. Unwatch).
    shards: HashMap<LockName, Shard>,
    standbys: usize,
    /// Names whose `recheck_at` is armed.
    rechecks: usize,
    statuses: VecDeque<crate::backend::StatusAnswer>,
    counters: RedisCounters,
    last_error: String,
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
            shas: Script::ALL.map(Script::sha1_hex),
            next_id: 0,
            pending: HashMap::new(),
            expiry: BinaryHeap::new(),
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            subscribed: false,
            subscribe_pending: false,
            resubscribe_at: NEVER,
            sub_failures: 0,
            epochs: 0,
            names: HashMap::new(),
            leases: HashMap::new(),
            tokens: HashMap::new(),
            held: HashMap::new(),
            shards: HashMap::new(),
            standbys: 0,
            rechecks: 0,
            statuses: VecDeque::new(),
            counters: RedisCounters::default(),
            last_error: String::new(),
        };
        p.wake = wake_channel(&wake_random);
        if !opts.sharded_wake {
            p.send_subscribe(0);
        }
        Ok(p)
    }

    /// Switches to a new wake channel (after `fork()`, so parent and child never share one):
    /// unsubscribes the old one, subscribes the new one, and re-checks on confirmation.
    pub fn set_wake_random(&mut self, now: u64, wake_random: [u8; scripts::WAKE_RANDOM_LEN]) {
        let old = std::mem::replace(&mut self.wake, wake_channel(&wake_random));
        if self.opts.sharded_wake {
            // The wake id only names queue entries here; the channels are per name.
            self.bump_all();
            return;
        }
        self.push(
            Op::Leave,
            Connection::Subscriber,
            None,
            vec![Cow::Borrowed(b"UNSUBSCRIBE"), Cow::Owned(old)],
            now,
            now.saturating_add(60_000 * MS),
        );
        self.subscribed = false;
        self.bump_all();
        self.send_subscribe(now);
    }

    /// The wake channel this object subscribes.
    pub fn wake_channel(&self) -> &[u8] {
        &self.wake
    }

    /// Whether the subscription is in effect (sharded wake: every wanted name's).
    pub fn is_subscribed(&self) -> bool {
        if self.opts.sharded_wake {
            self.shards.values().all(|s| s.live)
        } else {
            self.subscribed
        }
    }

    /// The names whose shard channel is wanted (sharded wake), with whether it is live.
    pub fn watched_names(&self) -> impl Iterator<Item = (&str, bool)> {
        self.shards.iter().map(|(n, s)| (&**n, s.live))
    }

    /// Whether a release of `name` would reach this client now.
    fn live(&self, name: &str) -> bool {
        if self.opts.sharded_wake {
            self.shards.get(name).is_some_and(|s| s.live)
        } else {
            self.subscribed
        }
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
        &self.last_error
    }

    // ------------------------------------------------------------------------ outputs

    /// The next request to execute, once the engine's commands are translated. The arguments
    /// borrow this object until its next mutation.
    pub fn poll_request(&mut self, core: &mut Client) -> Option<Request<'_>> {
        self.pump(core);
        while let Some(id) = self.outbox.pop_front() {
            if self.pending.contains_key(&id) {
                let p = &self.pending[&id];
                return Some(Request {
                    id,
                    connection: p.connection,
                    args: &p.args,
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

    /// Queues a status query for `name` (`leasehold status`): one read-only EVAL on the
    /// commands connection. Its answer comes out of [`Self::poll_status`] under the returned
    /// id, which is also the request's id.
    pub fn request_status(&mut self, now: u64, name: &str) -> Result<u64, crate::Error> {
        let lock = key(KeyKind::Lock, name)?;
        let fence = key(KeyKind::Fence, name)?;
        let args = vec![
            Cow::Borrowed(&b"EVAL"[..]),
            Cow::Borrowed(scripts::STATUS_SCRIPT.as_bytes()),
            Cow::Borrowed(&b"2"[..]),
            Cow::Owned(lock),
            Cow::Owned(fence),
        ];
        let expires = now.saturating_add(60_000 * MS);
        Ok(self.push(Op::Status, Connection::Commands, None, args, now, expires))
    }

    /// The next answered status query: its id and what the server said (or why not).
    pub fn poll_status(&mut self) -> Option<crate::backend::StatusAnswer> {
        self.statuses.pop_front()
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
        if self.standbys > 0 {
            let due: Vec<LockName> = self
                .names
                .iter()
                .filter(|(_, s)| s.standby_until <= now)
                .map(|(n, _)| n.clone())
                .collect();
            for name in due {
                let lease = self.names.get(&name).and_then(|s| s.standby_lease);
                self.disarm(&name);
                self.counters.standby_takeovers += 1;
                self.wake_lease(core, &name, lease);
            }
        }
        if self.rechecks > 0 {
            let due: Vec<LockName> = self
                .names
                .iter()
                .filter(|(_, s)| s.recheck_at <= now)
                .map(|(n, _)| n.clone())
                .collect();
            for name in due {
                let lease = self.names.get(&name).and_then(|s| s.recheck_lease);
                self.clear_recheck(&name);
                if let Some(l) = lease.filter(|l| self.leases.contains_key(l)) {
                    self.wake_lease(core, &name, Some(l));
                }
            }
        }
        if self.resubscribe_at <= now {
            self.resubscribe_at = NEVER;
            if self.opts.sharded_wake {
                let due: Vec<LockName> = self
                    .shards
                    .iter()
                    .filter(|(_, s)| !s.live && s.subscribing.is_none())
                    .map(|(n, _)| n.clone())
                    .collect();
                for name in due {
                    self.send_shard_subscribe(&name, now);
                }
            } else {
                self.send_subscribe(now);
            }
        }
        self.prune(now);
        self.pump(core);
    }

    /// The reply to request `id`. Unknown and already answered ids are counted and ignored.
    pub fn handle_reply(&mut self, core: &mut Client, now: u64, id: u64, reply: &Value<'_>) {
        core.handle_timeout(now);
        let now = core.now();
        let Some(p) = self.pending.remove(&id) else {
            self.counters.stale_replies += 1;
            self.pump(core);
            return;
        };
        if let (Value::Error(msg), Some(script), false) = (reply, p.script, p.retried) {
            if msg.starts_with(b"NOSCRIPT") {
                self.counters.noscript_retries += 1;
                let mut args = p.args;
                args[0] = Cow::Borrowed(b"EVAL");
                args[1] = Cow::Borrowed(script.text().as_bytes());
                let expires = self.expiry_of(&p.op, now);
                let new = self.push(p.op, p.connection, Some(script), args, now, expires);
                if let Some(n) = self.pending.get_mut(&new) {
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
                let result = match self.acquire_reply(reply) {
                    Some(Acquired::Granted { fence, ttl_ms }) => AcquireResult::Granted {
                        fencing_token: fence,
                        ttl_ms,
                        backend_data: &[],
                    },
                    Some(Acquired::Held { left_ms, rank }) => {
                        let live_epoch = self.names.get(&name).map(|s| s.epoch);
                        let live = self.live(&name);
                        let idle = self.opts.idle_recheck_ms;
                        if let Some(w) = self.leases.get_mut(&lease) {
                            w.queued = true;
                            let fresh = live_epoch == Some(epoch) && w.wakes == wakes;
                            // The head looks again when the holder's time is up (it may have
                            // died); the others are woken in turn, or look again after
                            // idle_recheck_ms.
                            let quiet_ms = match rank {
                                Some(r) if r > 0 => left_ms.map(|l| l.max(idle)),
                                _ => left_ms,
                            };
                            w.quiet =
                                (covered && live && fresh)
                                    .then_some(())
                                    .and(quiet_ms)
                                    .map(|ms| Quiet {
                                        epoch,
                                        until: p.sent_at.saturating_add(ms.saturating_mul(MS)),
                                    });
                        } else {
                            // The lease gave up while this attempt was queueing it.
                            self.send_leave(&name, token, now);
                        }
                        AcquireResult::HeldByOther {
                            retry_after_ms: left_ms,
                        }
                    }
                    None => AcquireResult::TransportError,
                };
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
                self.statuses.push_back((id, answer));
            }
            Op::Subscribe => {
                let confirmed = matches!(reply, Value::Array(items)
                    if items.len() == 3
                        && matches!(&items[0], Value::Bulk(k) | Value::Status(k) if k.eq_ignore_ascii_case(b"subscribe"))
                        && matches!(&items[1], Value::Bulk(c) if *c == self.wake.as_slice()));
                if confirmed {
                    self.subscribe_pending = false;
                    self.on_subscribed(core);
                } else {
                    self.note_error("unexpected reply to SUBSCRIBE", describe(reply).as_bytes());
                    self.counters.garbage_replies += 1;
                    self.subscribe_failed(now);
                }
            }
            Op::ShardSubscribe { name } => {
                let confirmed = matches!(reply, Value::Array(items)
                    if items.len() == 3
                        && matches!(&items[0], Value::Bulk(k) | Value::Status(k) if k.eq_ignore_ascii_case(b"ssubscribe"))
                        && matches!(&items[1], Value::Bulk(c) if shard_channel_name(c) == Some(&*name)));
                if confirmed {
                    self.on_shard_subscribed(core, &name, Some(id));
                } else {
                    self.note_error("unexpected reply to SSUBSCRIBE", describe(reply).as_bytes());
                    self.counters.garbage_replies += 1;
                    self.shard_failed(&name, id, now);
                }
            }
        }
        self.pump(core);
    }

    /// Request `id` failed in transport (the connection broke, a timeout): the engine sees a
    /// transport error and retries as it sees fit.
    pub fn handle_request_failed(&mut self, core: &mut Client, now: u64, id: u64) {
        core.handle_timeout(now);
        let now = core.now();
        let Some(p) = self.pending.remove(&id) else {
            self.counters.stale_replies += 1;
            self.pump(core);
            return;
        };
        self.counters.transport_failures += 1;
        match p.op {
            Op::Acquire { req, .. } => {
                let _ = core.handle_acquire_result(now, req, AcquireResult::TransportError);
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
                .statuses
                .push_back((id, Err("the request failed in transport".to_owned()))),
        }
        self.pump(core);
    }

    /// A pub/sub message. Anything not on this object's wake channel, and malformed
    /// payloads, are counted and ignored; duplicates are harmless.
    pub fn handle_message(&mut self, core: &mut Client, now: u64, channel: &[u8], payload: &[u8]) {
        core.handle_timeout(now);
        let now = core.now();
        let msg = if self.opts.sharded_wake {
            // Every client waiting on the name hears every notice: only a name this client
            // watches, on that name's own channel, counts.
            parse_message(payload).filter(|m| {
                self.shards.contains_key(m.name) && shard_channel_name(channel) == Some(m.name)
            })
        } else if channel == self.wake.as_slice() {
            parse_message(payload)
        } else {
            None
        };
        let Some(msg) = msg else {
            self.counters.ignored_messages += 1;
            self.pump(core);
            return;
        };
        match msg.kind {
            scripts::MSG_WAKE => {
                self.disarm(msg.name);
                self.clear_recheck(msg.name);
                let lease = self.lease_for(msg.token, msg.name);
                // Sharded: a wake-up naming no lease of ours is another client's turn.
                if lease.is_some() || !self.opts.sharded_wake {
                    self.counters.wakeups += 1;
                    self.wake_lease(core, msg.name, lease);
                }
            }
            scripts::MSG_STANDBY => {
                let delay = self
                    .opts
                    .standby_delay_ms
                    .saturating_mul(MS)
                    .saturating_mul(u64::from(msg.rank));
                let lease = self.lease_for(msg.token, msg.name);
                let ours = lease.is_some() || !self.opts.sharded_wake;
                if let Some(s) = self.names.get_mut(msg.name).filter(|_| ours) {
                    if s.standby_until == NEVER {
                        self.standbys += 1;
                    }
                    // One standby per name is enough here (this client's standbys live or
                    // die together); the earliest one names the lease to wake.
                    let at = now.saturating_add(delay);
                    if at < s.standby_until || s.standby_lease.is_none() {
                        s.standby_lease = lease.or(s.standby_lease);
                    }
                    s.standby_until = s.standby_until.min(at);
                }
            }
            scripts::MSG_GRANTED => {
                self.disarm(msg.name);
                // Only the entry's own lease looks again (sharded: every client hears it).
                if let Some(lease) = self.lease_for(msg.token, msg.name) {
                    let at = now.saturating_add(msg.ttl_ms.saturating_mul(MS));
                    if let Some(s) = self.names.get_mut(msg.name) {
                        if s.recheck_at == NEVER {
                            self.rechecks += 1;
                        }
                        if at < s.recheck_at {
                            s.recheck_at = at;
                            s.recheck_lease = Some(lease);
                        }
                    }
                }
            }
            _ => self.disarm(msg.name),
        }
        self.pump(core);
    }

    /// A subscription confirmation (`subscribed`) or its loss / an unsubscribe confirmation
    /// (`!subscribed`) for `channel`. Taking effect re-checks every waiting name; a loss
    /// re-subscribes (the host runs the SUBSCRIBE once its connection is back).
    pub fn handle_subscription(
        &mut self,
        core: &mut Client,
        now: u64,
        channel: &[u8],
        subscribed: bool,
    ) {
        core.handle_timeout(now);
        let now = core.now();
        if self.opts.sharded_wake {
            self.shard_subscription(core, now, channel, subscribed);
        } else if channel != self.wake.as_slice() {
            self.counters.ignored_messages += 1;
        } else if subscribed {
            if let Some(id) = self.subscribe_id() {
                self.pending.remove(&id);
            }
            self.subscribe_pending = false;
            self.on_subscribed(core);
        } else if self.subscribed {
            // A live subscription was lost: subscribe again at once (a second SUBSCRIBE is
            // harmless, a missing one is not).
            self.counters.subscriber_losses += 1;
            self.subscribed = false;
            self.bump_all();
            self.resubscribe_at = NEVER;
            self.send_subscribe(now);
        } else {
            // Lost before it took effect (a SUBSCRIBE sent on a connection that then dropped):
            // the connection keeps failing, so back off, or a host that reports the loss from
            // inside the failed send loops as fast as it can (a master down in a failover).
            if let Some(id) = self.subscribe_id() {
                self.pending.remove(&id);
            }
            self.subscribe_failed(now);
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
                    self.events.push_back(ev);
                }
                Output::Command(cmd) => self.on_command(core, cmd),
            }
        }
    }

    fn on_command(&mut self, core: &mut Client, cmd: Command) {
        let now = core.now();
        match cmd {
            Command::Acquire {
                request,
                lease,
                name,
                token,
                ttl_ms,
            } => {
                let epoch = self.enter(lease, &name, token);
                if let Some(q) = self.leases.get(&lease).and_then(|w| w.quiet) {
                    if self.live(&name) && q.epoch == epoch && q.until > now.saturating_add(MS) {
                        self.counters.local_refusals += 1;
                        let left = (q.until - now) / MS;
                        let _ = core.handle_acquire_result(
                            now,
                            request,
                            AcquireResult::HeldByOther {
                                retry_after_ms: Some(left),
                            },
                        );
                        return;
                    }
                }
                let Ok(keys) = name_keys(&name) else { return };
                let hex = token.to_hex();
                let mut entry = Vec::with_capacity(self.wake.len() + 1 + hex.len());
                entry.extend_from_slice(&self.wake);
                entry.push(b'#');
                entry.extend_from_slice(&hex);
                let [lock, fence, queue] = keys;
                let mut args = vec![
                    Cow::Borrowed(&b"EVALSHA"[..]),
                    Cow::Owned(self.shas[0].to_vec()),
                    Cow::Borrowed(&b"3"[..]),
                    Cow::Owned(lock),
                    Cow::Owned(fence),
                    Cow::Owned(queue),
                    Cow::Owned(hex.to_vec()),
                    Cow::Owned(ttl_ms.to_string().into_bytes()),
                    Cow::Owned(entry),
                    Cow::Owned(self.opts.key_keep_ms.to_string().into_bytes()),
                    Cow::Owned(name.as_bytes().to_vec()),
                ];
                if let Some(s) = self.shards.get(&name).filter(|_| self.opts.sharded_wake) {
                    args.push(Cow::Owned(s.channel.clone()));
                } else if self.opts.sharded_wake {
                    args.extend(shard_channel(&name).ok().map(Cow::Owned));
                }
                let wakes = self.leases.get(&lease).map_or(0, |w| w.wakes);
                let covered = self.live(&name);
                let op = Op::Acquire {
                    req: request,
                    lease,
                    name,
                    token,
                    covered,
                    epoch,
                    wakes,
                };
                let expires = self.expiry_of(&op, now).max(
                    now.saturating_add(ttl_ms.saturating_mul(MS))
                        .saturating_add(core.config().request_timeout_ns),
                );
                self.push(
                    op,
                    Connection::Commands,
                    Some(Script::Acquire),
                    args,
                    now,
                    expires,
                );
            }
            Command::Renew {
                request,
                name,
                token,
                ttl_ms,
                ..
            } => {
                let Ok([lock, _, _]) = name_keys(&name) else {
                    return;
                };
                let args = vec![
                    Cow::Borrowed(&b"EVALSHA"[..]),
                    Cow::Owned(self.shas[1].to_vec()),
                    Cow::Borrowed(&b"1"[..]),
                    Cow::Owned(lock),
                    Cow::Owned(token.to_hex().to_vec()),
                    Cow::Owned(ttl_ms.to_string().into_bytes()),
                ];
                let op = Op::Renew { req: request };
                let expires =
                    now.saturating_add(core.config().request_timeout_ns.saturating_mul(2));
                self.push(
                    op,
                    Connection::Commands,
                    Some(Script::Renew),
                    args,
                    now,
                    expires,
                );
            }
            Command::Release {
                request,
                name,
                token,
                ..
            } => {
                let Ok([lock, _, queue]) = name_keys(&name) else {
                    return;
                };
                let mut args = vec![
                    Cow::Borrowed(&b"EVALSHA"[..]),
                    Cow::Owned(self.shas[2].to_vec()),
                    Cow::Borrowed(&b"2"[..]),
                    Cow::Owned(lock),
                    Cow::Owned(queue),
                    Cow::Owned(token.to_hex().to_vec()),
                    Cow::Owned(name.as_bytes().to_vec()),
                    Cow::Owned(self.opts.queue_max_age_ms.to_string().into_bytes()),
                ];
                if self.opts.sharded_wake {
                    args.extend(shard_channel(&name).ok().map(Cow::Owned));
                }
                let op = Op::Release { req: request };
                let expires =
                    now.saturating_add(core.config().request_timeout_ns.saturating_mul(2));
                self.push(
                    op,
                    Connection::Commands,
                    Some(Script::Release),
                    args,
                    now,
                    expires,
                );
            }
            // Sharded wake: the name's channel is subscribed while it has local waiters.
            Command::Watch { name } if self.opts.sharded_wake => {
                if !self.shards.contains_key(&name) {
                    let Ok(channel) = shard_channel(&name) else {
                        return;
                    };
                    self.shards.insert(
                        name.clone(),
                        Shard {
                            channel,
                            live: false,
                            subscribing: None,
                        },
                    );
                    self.send_shard_subscribe(&name, now);
                }
            }
            Command::Unwatch { name } if self.opts.sharded_wake => {
                if let Some(s) = self.shards.remove(&name) {
                    if let Some(id) = s.subscribing {
                        self.pending.remove(&id);
                    }
                    self.push(
                        Op::Leave,
                        Connection::Subscriber,
                        None,
                        vec![Cow::Borrowed(b"SUNSUBSCRIBE"), Cow::Owned(s.channel)],
                        now,
                        now.saturating_add(60_000 * MS),
                    );
                }
            }
            // Otherwise wake-ups come through this object's queue entries and wake channel,
            // not through a subscription per name.
            Command::Watch { .. } | Command::Unwatch { .. } => {}
        }
    }

    fn on_event(&mut self, ev: &Event, now: u64) {
        match *ev {
            Event::Acquired { lease, .. } => {
                // The granting ACQUIRE removed the entry.
                if let Some(w) = self.leave(lease) {
                    self.held.insert(lease, w.token);
                }
            }
            Event::AcquireFailed { lease, .. } => {
                if let Some(w) = self.leave(lease) {
                    self.tokens.remove(&w.token);
                    if w.queued {
                        self.send_leave(&w.name, w.token, now);
                    }
                }
            }
            Event::Lost { lease, .. } | Event::Released { lease } => {
                // Terminal (one per lease): its token names nobody any more.
                if let Some(w) = self.leave(lease) {
                    self.tokens.remove(&w.token);
                }
                if let Some(token) = self.held.remove(&lease) {
                    self.tokens.remove(&token);
                }
            }
            Event::Renewed { .. } | Event::ReleaseOutcome { .. } => {}
        }
    }

    /// Registers an acquiring lease (idempotent); the name's current epoch.
    fn enter(&mut self, lease: LeaseId, name: &LockName, token: Token) -> u64 {
        if let std::collections::hash_map::Entry::Vacant(v) = self.leases.entry(lease) {
            v.insert(Waiting {
                name: name.clone(),
                token,
                queued: false,
                quiet: None,
                wakes: 0,
            });
            self.tokens.insert(token, (lease, name.clone()));
            let fresh = self.epochs + 1;
            let s = self.names.entry(name.clone()).or_insert(NameState {
                epoch: fresh,
                leases: 0,
                standby_until: NEVER,
                standby_lease: None,
                recheck_at: NEVER,
                recheck_lease: None,
            });
            if s.epoch == fresh {
                self.epochs = fresh;
            }
            s.leases += 1;
        }
        self.names.get(&**name).map_or(0, |s| s.epoch)
    }

    fn leave(&mut self, lease: LeaseId) -> Option<Waiting> {
        let w = self.leases.remove(&lease)?;
        if let Some(s) = self.names.get_mut(&*w.name) {
            s.leases = s.leases.saturating_sub(1);
            if s.leases == 0 {
                self.disarm(&w.name);
                self.clear_recheck(&w.name);
                self.names.remove(&*w.name);
            }
        }
        Some(w)
    }

    fn disarm(&mut self, name: &str) {
        if let Some(s) = self.names.get_mut(name) {
            if s.standby_until != NEVER {
                s.standby_until = NEVER;
                self.standbys -= 1;
            }
            s.standby_lease = None;
        }
    }

    fn clear_recheck(&mut self, name: &str) {
        if let Some(s) = self.names.get_mut(name) {
            if s.recheck_at != NEVER {
                s.recheck_at = NEVER;
                self.rechecks -= 1;
            }
            s.recheck_lease = None;
        }
    }

    fn bump(&mut self, name: &str) {
        if let Some(s) = self.names.get_mut(name) {
            self.epochs += 1;
            s.epoch = self.epochs;
        }
    }

    fn bump_all(&mut self) {
        for s in self.names.values_mut() {
            self.epochs += 1;
            s.epoch = self.epochs;
        }
    }

    /// Something may have freed `name`: queued refusals are out of date, and one local waiter
    /// tries now.
    fn wake_name(&mut self, core: &mut Client, name: &str) {
        self.bump(name);
        let now = core.now();
        let _ = core.handle_released(now, name);
    }

    /// The acquiring lease of this object that a message's token names, if it waits for
    /// `name`.
    fn lease_for(&self, token: Option<Token>, name: &str) -> Option<LeaseId> {
        let (lease, of) = self.tokens.get(&token?)?;
        (**of == *name).then_some(*lease)
    }

    /// `name` may be free and it is `lease`'s turn (its queue entry was popped or stood by):
    /// that lease tries now. If it holds the lock already (a retry of its own won, or the
    /// message is a duplicate) there is nothing to do. A wake-up for a lease that no longer
    /// waits here (it gave up or ended, or the token is not ours) goes to the next local
    /// waiter of the name instead, so it is never lost for the others; with none, the
    /// standbys cover it.
    /// Only that lease's queued refusal goes out of date: the other local waiters' entries
    /// are still queued, so they stay quiet (one script call per handoff, not one per local
    /// waiter).
    fn wake_lease(&mut self, core: &mut Client, name: &str, lease: Option<LeaseId>) {
        let now = core.now();
        if let Some(l) = lease {
            if let Some(w) = self.leases.get_mut(&l) {
                w.quiet = None;
                w.wakes = w.wakes.wrapping_add(1);
            }
            if core.handle_wake(now, l) == Ok(true)
                || core.lease_state(l) == Ok(crate::LeaseState::Held)
            {
                return;
            }
        }
        self.bump(name);
        let _ = core.handle_released(now, name);
    }

    fn on_subscribed(&mut self, core: &mut Client) {
        if self.subscribed {
            self.counters.ignored_messages += 1;
            return;
        }
        self.subscribed = true;
        self.sub_failures = 0;
        self.resubscribe_at = NEVER;
        self.counters.subscriptions += 1;
        // A release while we were not listening reached nobody: check every waiting name.
        let names: Vec<LockName> = self.names.keys().cloned().collect();
        for name in names {
            self.wake_name(core, &name);
        }
    }

    /// A name's SSUBSCRIBE took effect (sharded wake): a release just before reached nobody
    /// here, so the name is checked once.
    fn on_shard_subscribed(&mut self, core: &mut Client, name: &str, id: Option<u64>) {
        let Some(s) = self.shards.get_mut(name) else {
            self.counters.ignored_messages += 1;
            return;
        };
        if id.is_some() && s.subscribing != id {
            // The confirmation of an SSUBSCRIBE this name no longer waits for.
            self.counters.ignored_messages += 1;
            return;
        }
        if let Some(old) = s.subscribing.take() {
            self.pending.remove(&old);
        }
        if s.live {
            self.counters.ignored_messages += 1;
            return;
        }
        s.live = true;
        self.sub_failures = 0;
        self.counters.subscriptions += 1;
        self.wake_name(core, name);
    }

    /// A shard channel's confirmation or loss (sharded wake). Channels of names nobody waits
    /// for here (an SSUBSCRIBE overtaken by the name's SUNSUBSCRIBE, foreign channels) are
    /// ignored; a lost one is subscribed again.
    fn shard_subscription(&mut self, core: &mut Client, now: u64, channel: &[u8], on: bool) {
        let Some(name) = shard_channel_name(channel)
            .filter(|n| self.shards.contains_key(*n))
            .map(LockName::from)
        else {
            self.counters.ignored_messages += 1;
            return;
        };
        if on {
            self.on_shard_subscribed(core, &name, None);
            return;
        }
        // Lost (the node failed, the slot moved) or never confirmed: subscribe again. Until
        // then a release may reach nobody, so no refusal of the name is trusted. (An
        // unsubscribe confirmation comes this way too, so "never confirmed" cannot be told
        // from a SUNSUBSCRIBE answered while a new SSUBSCRIBE is on its way: no backoff here.)
        if let Some(s) = self.shards.get_mut(&name) {
            if s.live {
                self.counters.subscriber_losses += 1;
            }
            s.live = false;
        }
        self.bump(&name);
        self.send_shard_subscribe(&name, now);
    }

    fn shard_failed(&mut self, name: &str, id: u64, now: u64) {
        let Some(s) = self.shards.get_mut(name) else {
            return;
        };
        if s.subscribing == Some(id) {
            s.subscribing = None;
        }
        s.live = false;
        self.bump(name);
        self.sub_failures = self.sub_failures.saturating_add(1);
        let backoff = (50 * MS)
            .saturating_mul(1 << self.sub_failures.min(5))
            .min(2_000 * MS);
        self.resubscribe_at = self.resubscribe_at.min(now.saturating_add(backoff));
    }

    fn send_shard_subscribe(&mut self, name: &LockName, now: u64) {
        let Some(channel) = self.shards.get(name).map(|s| s.channel.clone()) else {
            return;
        };
        if let Some(old) = self.shards.get_mut(name).and_then(|s| s.subscribing.take()) {
            self.pending.remove(&old);
        }
        let id = self.push(
            Op::ShardSubscribe { name: name.clone() },
            Connection::Subscriber,
            None,
            vec![Cow::Borrowed(b"SSUBSCRIBE"), Cow::Owned(channel)],
            now,
            NEVER,
        );
        if let Some(s) = self.shards.get_mut(name) {
            s.subscribing = Some(id);
        }
    }

    fn subscribe_failed(&mut self, now: u64) {
        self.subscribed = false;
        self.subscribe_pending = false;
        self.bump_all();
        self.sub_failures = self.sub_failures.saturating_add(1);
        let backoff = (50 * MS)
            .saturating_mul(1 << self.sub_failures.min(5))
            .min(2_000 * MS);
        self.resubscribe_at = now.saturating_add(backoff);
    }

    fn subscribe_id(&self) -> Option<u64> {
        self.pending
            .iter()
            .find(|(_, p)| matches!(p.op, Op::Subscribe))
            .map(|(id, _)| *id)
    }

    fn send_subscribe(&mut self, now: u64) {
        if let Some(id) = self.subscribe_id() {
            self.pending.remove(&id);
        }
        self.subscribe_pending = true;
        let args = vec![
            Cow::Borrowed(&b"SUBSCRIBE"[..]),
            Cow::Owned(self.wake.clone()),
        ];
        self.push(
            Op::Subscribe,
            Connection::Subscriber,
            None,
            args,
            now,
            NEVER,
        );
    }

    fn send_leave(&mut self, name: &LockName, token: Token, now: u64) {
        let Ok(queue) = key(KeyKind::Queue, name) else {
            return;
        };
        let mut entry = self.wake.clone();
        entry.push(b'#');
        entry.extend_from_slice(&token.to_hex());
        let args = vec![
            Cow::Borrowed(&b"ZREM"[..]),
            Cow::Owned(queue),
            Cow::Owned(entry),
        ];
        self.push(
            Op::Leave,
            Connection::Commands,
            None,
            args,
            now,
            now.saturating_add(60_000 * MS),
        );
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
        self.next_id += 1;
        let id = self.next_id;
        self.counters.requests += 1;
        if script.is_some() {
            self.counters.script_calls += 1;
        }
        self.pending.insert(
            id,
            Pending {
                op,
                connection,
                args,
                script,
                sent_at: now,
                retried: false,
            },
        );
        if expires != NEVER {
            self.expiry.push(Reverse((expires, id)));
        }
        self.outbox.push_back(id);
        id
    }

    /// Forgets requests the engine can no longer care about (it timed them out long ago), so
    /// a host that never answers some cannot grow the table.
    fn prune(&mut self, now: u64) {
        while let Some(Reverse((at, id))) = self.expiry.peek().copied() {
            if at > now {
                break;
            }
            self.expiry.pop();
            if let Some(Pending { op: Op::Status, .. }) = self.pending.remove(&id) {
                self.statuses
                    .push_back((id, Err("no answer within 60 s".to_owned())));
            }
        }
    }

    fn note_error(&mut self, what: &str, detail: &[u8]) {
        let text = String::from_utf8_lossy(&detail[..detail.len().min(MAX_ERROR_TEXT)]);
        self.last_error = format!("{what}: {text}");
    }

    fn acquire_reply(&mut self, reply: &Value<'_>) -> Option<Acquired> {
        if let Value::Array(items) = reply {
            match items.as_slice() {
                [Value::Int(1), Value::Int(fence), Value::Int(ttl)]
                    if *fence >= 1 && *fence as u64 <= scripts::MAX_FENCE && *ttl >= 1 =>
                {
                    return Some(Acquired::Granted {
                        fence: *fence as u64,
                        ttl_ms: *ttl as u64,
                    });
                }
                [Value::Int(0), Value::Int(left)] if *left >= -1 => {
                    return Some(Acquired::Held {
                        left_ms: u64::try_from(*left).ok(),
                        rank: None,
                    });
                }
                [Value::Int(0), Value::Int(left), Value::Int(rank)]
                    if *left >= -1 && *rank >= 0 =>
                {
                    return Some(Acquired::Held {
                        left_ms: u64::try_from(*left).ok(),
                        rank: u64::try_from(*rank).ok(),
                    });
                }
                _ => {}
            }
        }
        self.bad_reply(reply, "ACQUIRE");
        None
    }

    fn flag_reply(&mut self, reply: &Value<'_>, what: &str) -> Option<bool> {
        match reply {
            Value::Int(1) => Some(true),
            Value::Int(0) => Some(false),
            _ => {
                self.bad_reply(reply, what);
                None
            }
        }
    }

    fn bad_reply(&mut self, reply: &Value<'_>, what: &str) {
        if let Value::Error(msg) = reply {
            self.counters.error_replies += 1;
            self.note_error(&format!("{what} failed"), msg);
        } else {
            self.counters.garbage_replies += 1;
            self.note_error(
                &format!("unexpected reply to {what}"),
                describe(reply).as_bytes(),
            );
        }
    }
}

enum Acquired {
    Granted {
        fence: u64,
        ttl_ms: u64,
    },
    Held {
        left_ms: Option<u64>,
        rank: Option<u64>,
    },
}

fn name_keys(name: &str) -> Result<[Vec<u8>; 3], crate::Error> {
    Ok([
        key(KeyKind::Lock, name)?,
        key(KeyKind::Fence, name)?,
        key(KeyKind::Queue, name)?,
    ])
}

fn wake_channel(random: &[u8; scripts::WAKE_RANDOM_LEN]) -> Vec<u8> {
    let mut ch = scripts::WAKE_CHANNEL_PREFIX.as_bytes().to_vec();
    let start = ch.len();
    ch.resize(start + 2 * random.len(), 0);
    crate::types::write_lower_hex(random, &mut ch[start..]);
    ch
}

/// A short description of a reply for diagnostics.
fn describe(v: &Value<'_>) -> String {
    match v {
        Value::Nil => "nil".into(),
        Value::Int(i) => format!("integer {i}"),
        Value::Bulk(b) => format!("bulk string of {} bytes", b.len()),
        Value::Status(s) => format!("status {}", String::from_utf8_lossy(&s[..s.len().min(64)])),
        Value::Error(e) => format!("error {}", String::from_utf8_lossy(&e[..e.len().min(64)])),
        Value::Array(items) => format!("array of {}", items.len()),
    }
}
