//! The in-memory reference lock service: a test double with the semantics every backend must
//! have, for the simulator's peers, the Rust tests and every binding's tests.
//!
//! [`MemoryService`] puts what a test or an example needs around a [`LockTable`], for every
//! binding through the C ABI (`lh_memory_service_*`): connections (one per client, each with
//! its own [`Faults`], so one client can be partitioned while the others carry on), release
//! notifications queued per watching connection, a status view, and a clock of its own:
//! the `now` passed in (clamped so it never runs backwards) plus a step offset. Memory is
//! bounded: names, connections, watches and queued notifications all have limits
//! ([`Limits`]); names whose lock is free or expired are reclaimed when the table is full,
//! and the fences they had raise a floor, so a reclaimed name's next fence is still higher.
//!
//! It is a test double, not a lock across processes: it lives inside one process.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

pub use super::table::{Acquired, Grant, LockTable};

const NS_PER_MS: u64 = 1_000_000;

/// Longest ownership token the service accepts, bytes (the engine's are 32; the C ABI
/// mirrors it as `LH_MEMORY_MAX_TOKEN_LEN`).
pub(crate) const MAX_TOKEN_BYTES: usize = 64;

/// Limits that bound the service's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most names with a record; past it, free and expired records are reclaimed, and an
    /// acquire of a new name is answered [`Reply::Full`] when none is.
    pub max_names: u32,
    /// Most open connections.
    pub max_connections: u32,
    /// Most names one connection watches.
    pub max_watches: u32,
    /// Most release notifications queued for one connection; later ones are dropped (counted).
    pub max_pending: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_names: 65_536,
            max_connections: 1_024,
            max_watches: 4_096,
            max_pending: 1_024,
        }
    }
}

/// Largest value of any [`Limits`] field (keeps a hostile limit from meaning "unbounded").
const LIMIT_CEILING: u32 = 1 << 24;

/// One connection's fault switches. Host-level faults (delay, hang) stay in the wrappers:
/// they are about when an answer arrives, and the service never waits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Acquires are answered "held by another" (no hint) without looking.
    pub reject_acquires: bool,
    /// Renews are answered "rejected" without looking: the lease is lost.
    pub reject_renewals: bool,
    /// Releases are answered "not owner" without looking (the grant stays until it expires).
    pub reject_releases: bool,
    /// Requests are lost before reaching the service ([`Reply::Dropped`], nothing applied).
    pub drop_requests: bool,
    /// Requests are applied, then their answers lost ([`Reply::Dropped`]).
    pub drop_responses: bool,
    /// The answers of the next this-many requests are lost (counts down).
    pub drop_next_responses: u32,
    /// Cut off: requests are lost and release notifications for it are discarded.
    pub partitioned: bool,
}

/// The service's answer to one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Acquire: the token holds the name.
    Granted {
        /// Fencing token of the grant.
        fence: u64,
        /// TTL granted, ms.
        ttl_ms: u64,
    },
    /// Acquire: another token holds it; `retry_after_ms` is its remaining TTL (rounded up),
    /// `None` when a reject switch answered.
    HeldByOther {
        /// Remaining TTL of the holder, ms.
        retry_after_ms: Option<u64>,
    },
    /// Renew: extended.
    Renewed,
    /// Renew: the token does not hold the name (expired, taken, never held).
    Rejected,
    /// Release: the grant is deleted and watchers are notified.
    Released,
    /// Release: the token did not hold the name (expired, taken): nothing changed.
    NotOwner,
    /// No answer: the request or its answer was lost, or the connection is partitioned.
    Dropped,
    /// Acquire of a new name while every one of `max_names` records is live.
    Full,
}

/// Caller misuse of the memory service; the service is unchanged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    /// The name is empty, too long or contains NUL (the engine's rule).
    #[error(transparent)]
    Name(#[from] crate::Error),
    /// Tokens identify owners; an empty one would match nobody's intent.
    #[error("token is {len} bytes; it must be 1 to {MAX_TOKEN_BYTES}")]
    InvalidToken {
        /// Length of the rejected token.
        len: usize,
    },
    /// A zero TTL grants a lock that is already gone.
    #[error("TTL must be 1 ms or more")]
    InvalidTtl,
    /// The id was never issued by this service or was disconnected.
    #[error("unknown connection {0}")]
    UnknownConnection(u64),
    /// `max_connections` are open, or the connection watches `max_watches` names.
    #[error("limit reached: {0}")]
    LimitReached(&'static str),
    /// A [`Limits`] field is 0 or above 2^24.
    #[error("invalid limits: {0}")]
    InvalidLimits(&'static str),
}

/// What the service reports about one name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// The service's clock when it looked, ns.
    pub service_now: u64,
    /// The unexpired holder, if any.
    pub holder: Option<HolderStatus>,
    /// Highest fence issued for the name (`None`: never, or its record was reclaimed).
    pub last_fence: Option<u64>,
    /// Connections watching the name.
    pub watchers: usize,
}

/// The holder part of a [`Status`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderStatus {
    /// Its ownership token.
    pub token: Vec<u8>,
    /// Its fencing token.
    pub fence: u64,
    /// Service time of expiry, ns.
    pub expires_at: u64,
    /// Remaining TTL, ms, rounded up.
    pub remaining_ms: u64,
    /// Time since the grant on the service's clock, ns.
    pub held_for_ns: u64,
    /// Connection that acquired it.
    pub connection: u64,
}

/// Counters of a service (for tests and the wrappers' inspection helpers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Gauge: names with a record.
    pub names: u64,
    /// Gauge: open connections.
    pub connections: u64,
    /// New grants (not idempotent refreshes).
    pub grants: u64,
    /// Releases that deleted a grant.
    pub releases: u64,
    /// Renews that extended a grant.
    pub renewals: u64,
    /// Renews refused (not the holder, or a reject switch).
    pub renewals_rejected: u64,
    /// Gauge: (connection, name) watches.
    pub watches: u64,
    /// Notifications queued for watchers.
    pub notifications: u64,
    /// Notifications discarded (partitioned connection or full queue).
    pub notifications_dropped: u64,
    /// Records reclaimed to stay within `max_names`.
    pub reclaimed: u64,
}

#[derive(Clone, Debug)]
struct Grantee {
    connection: u64,
}

#[derive(Debug, Default)]
struct Connection {
    faults: Faults,
    watching: BTreeSet<String>,
    pending: VecDeque<String>,
}

/// The in-memory reference lock service. Not a lock across processes: one per test world.
#[derive(Debug)]
pub struct MemoryService {
    table: LockTable<Box<[u8]>, Grantee>,
    limits: Limits,
    /// Latest `now` seen (the host's clock never runs backwards here).
    last_now: u64,
    /// Clock steps so far, ns (either direction).
    offset: i64,
    connections: BTreeMap<u64, Connection>,
    watchers: HashMap<String, BTreeSet<u64>>,
    next_connection: u64,
    /// After a full table found nothing to reclaim: the earliest service time it could.
    next_reclaim: u64,
    stats: Stats,
}

impl Default for MemoryService {
    fn default() -> Self {
        Self::with_limits(Limits::default())
    }
}

fn check_limit(v: u32, what: &'static str) -> Result<(), MemoryError> {
    if v == 0 || v > LIMIT_CEILING {
        return Err(MemoryError::InvalidLimits(what));
    }
    Ok(())
}

fn check_token(token: &[u8]) -> Result<(), MemoryError> {
    if token.is_empty() || token.len() > MAX_TOKEN_BYTES {
        return Err(MemoryError::InvalidToken { len: token.len() });
    }
    Ok(())
}

fn check_ttl(ttl_ms: u64) -> Result<u64, MemoryError> {
    if ttl_ms == 0 {
        return Err(MemoryError::InvalidTtl);
    }
    Ok(ttl_ms.saturating_mul(NS_PER_MS))
}

impl MemoryService {
    /// A service with no names and no connections.
    pub fn new(limits: Limits) -> Result<Self, MemoryError> {
        check_limit(limits.max_names, "max_names must be 1 to 2^24")?;
        check_limit(limits.max_connections, "max_connections must be 1 to 2^24")?;
        check_limit(limits.max_watches, "max_watches must be 1 to 2^24")?;
        check_limit(limits.max_pending, "max_pending must be 1 to 2^24")?;
        Ok(Self::with_limits(limits))
    }

    fn with_limits(limits: Limits) -> Self {
        MemoryService {
            table: LockTable::new(),
            limits,
            last_now: 0,
            offset: 0,
            connections: BTreeMap::new(),
            watchers: HashMap::new(),
            next_connection: 1,
            next_reclaim: 0,
            stats: Stats::default(),
        }
    }

    /// The limits it was made with.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The service's clock for a host reading `now`: never behind an earlier reading, plus
    /// every clock step.
    pub fn clock(&mut self, now: u64) -> u64 {
        self.last_now = self.last_now.max(now);
        if self.offset >= 0 {
            self.last_now.saturating_add(self.offset.unsigned_abs())
        } else {
            self.last_now.saturating_sub(self.offset.unsigned_abs())
        }
    }

    /// Steps the service's clock by `delta_ns` (forward: grants expire early on the service
    /// side only; backward: they outlive what their holders believe).
    pub fn step_clock(&mut self, delta_ns: i64) {
        self.offset = self.offset.saturating_add(delta_ns);
        // A step back may revive a record a reclaim pass skipped as live: look again.
        self.next_reclaim = 0;
    }

    /// Opens a connection; its id is never reused by this service.
    pub fn connect(&mut self) -> Result<u64, MemoryError> {
        if self.connections.len() >= self.limits.max_connections as usize {
            return Err(MemoryError::LimitReached("max_connections"));
        }
        let id = self.next_connection;
        self.next_connection += 1;
        self.connections.insert(id, Connection::default());
        self.stats.connections = self.connections.len() as u64;
        Ok(id)
    }

    /// Closes a connection: its watches and queued notifications go; locks it acquired stay
    /// until they expire (as a dead client's would).
    pub fn disconnect(&mut self, connection: u64) -> Result<(), MemoryError> {
        let conn = self
            .connections
            .remove(&connection)
            .ok_or(MemoryError::UnknownConnection(connection))?;
        for name in conn.watching {
            self.remove_watcher(&name, connection);
        }
        self.stats.connections = self.connections.len() as u64;
        Ok(())
    }

    fn conn(&mut self, connection: u64) -> Result<&mut Connection, MemoryError> {
        self.connections
            .get_mut(&connection)
            .ok_or(MemoryError::UnknownConnection(connection))
    }

    /// The fault switches of a connection.
    pub fn faults(&self, connection: u64) -> Result<Faults, MemoryError> {
        self.connections
            .get(&connection)
            .map(|c| c.faults)
            .ok_or(MemoryError::UnknownConnection(connection))
    }

    /// Replaces the fault switches of a connection.
    pub fn set_faults(&mut self, connection: u64, faults: Faults) -> Result<(), MemoryError> {
        self.conn(connection)?.faults = faults;
        Ok(())
    }

    /// Validates a request and says whether it reaches the service (`None`: dropped).
    fn enter(
        &mut self,
        connection: u64,
        name: &str,
        token: &[u8],
    ) -> Result<Option<Faults>, MemoryError> {
        crate::validate_name(name)?;
        check_token(token)?;
        let f = self.conn(connection)?.faults;
        Ok((!f.partitioned && !f.drop_requests).then_some(f))
    }

    /// Whether the answer of a request that was applied is lost on its way back.
    pub(super) fn answer_lost(&mut self, connection: u64) -> bool {
        let Some(c) = self.connections.get_mut(&connection) else {
            return true;
        };
        if c.faults.drop_responses {
            return true;
        }
        if c.faults.drop_next_responses > 0 {
            c.faults.drop_next_responses -= 1;
            return true;
        }
        false
    }

    /// Acquire `name` for `token` for `ttl_ms`, at host time `now`.
    pub fn acquire(
        &mut self,
        connection: u64,
        now: u64,
        name: &str,
        token: &[u8],
        ttl_ms: u64,
    ) -> Result<Reply, MemoryError> {
        let ttl_ns = check_ttl(ttl_ms)?;
        let Some(faults) = self.enter(connection, name, token)? else {
            return Ok(Reply::Dropped);
        };
        if faults.reject_acquires {
            return Ok(Reply::HeldByOther {
                retry_after_ms: None,
            });
        }
        let snow = self.clock(now);
        if !self.table.contains(name) && !self.make_room(snow) {
            return Ok(Reply::Full);
        }
        let fresh = |last: u64| {
            (
                last.saturating_add(1),
                Box::<[u8]>::from(token),
                Grantee { connection },
            )
        };
        let reply = match self.table.acquire(snow, name, token, ttl_ns, false, fresh) {
            Acquired::Granted { fence } => {
                self.stats.grants += 1;
                Reply::Granted { fence, ttl_ms }
            }
            Acquired::Refreshed { fence } => {
                self.next_reclaim = self.next_reclaim.min(snow.saturating_add(ttl_ns));
                Reply::Granted { fence, ttl_ms }
            }
            Acquired::HeldByOther { remaining_ns } => Reply::HeldByOther {
                retry_after_ms: Some(remaining_ns.div_ceil(NS_PER_MS)),
            },
        };
        self.stats.names = self.table.len() as u64;
        Ok(if self.answer_lost(connection) {
            Reply::Dropped
        } else {
            reply
        })
    }

    /// Whether a new name fits, reclaiming free and expired records when the table is full.
    fn make_room(&mut self, snow: u64) -> bool {
        let max = self.limits.max_names as usize;
        if self.table.len() < max {
            return true;
        }
        if snow < self.next_reclaim {
            return false;
        }
        let (gone, earliest) = self.table.reclaim(snow);
        self.stats.reclaimed += gone as u64;
        if self.table.len() < max {
            return true;
        }
        self.next_reclaim = earliest.unwrap_or(0);
        false
    }

    /// Extends `token`'s grant of `name` to `ttl_ms` from now.
    pub fn renew(
        &mut self,
        connection: u64,
        now: u64,
        name: &str,
        token: &[u8],
        ttl_ms: u64,
    ) -> Result<Reply, MemoryError> {
        let ttl_ns = check_ttl(ttl_ms)?;
        let Some(faults) = self.enter(connection, name, token)? else {
            return Ok(Reply::Dropped);
        };
        let snow = self.clock(now);
        let reply = if !faults.reject_renewals && self.table.renew(snow, name, token, ttl_ns) {
            self.stats.renewals += 1;
            Reply::Renewed
        } else {
            self.stats.renewals_rejected += 1;
            Reply::Rejected
        };
        if faults.reject_renewals {
            return Ok(reply);
        }
        Ok(if self.answer_lost(connection) {
            Reply::Dropped
        } else {
            reply
        })
    }

    /// Deletes `token`'s grant of `name` and notifies the name's watchers.
    pub fn release(
        &mut self,
        connection: u64,
        now: u64,
        name: &str,
        token: &[u8],
    ) -> Result<Reply, MemoryError> {
        let Some(faults) = self.enter(connection, name, token)? else {
            return Ok(Reply::Dropped);
        };
        if faults.reject_releases {
            return Ok(Reply::NotOwner);
        }
        let snow = self.clock(now);
        let reply = if self.table.release(snow, name, token) {
            self.stats.releases += 1;
            self.next_reclaim = 0;
            self.notify(name);
            Reply::Released
        } else {
            Reply::NotOwner
        };
        Ok(if self.answer_lost(connection) {
            Reply::Dropped
        } else {
            reply
        })
    }

    fn notify(&mut self, name: &str) {
        let Some(ids) = self.watchers.get(name) else {
            return;
        };
        let max = self.limits.max_pending as usize;
        for id in ids {
            let Some(c) = self.connections.get_mut(id) else {
                continue;
            };
            if c.faults.partitioned || c.pending.len() >= max {
                self.stats.notifications_dropped += 1;
            } else {
                c.pending.push_back(name.to_owned());
                self.stats.notifications += 1;
            }
        }
    }

    /// Starts queueing release notifications of `name` for `connection` (idempotent).
    pub fn watch(&mut self, connection: u64, name: &str) -> Result<(), MemoryError> {
        crate::validate_name(name)?;
        let max = self.limits.max_watches as usize;
        let c = self.conn(connection)?;
        if c.watching.contains(name) {
            return Ok(());
        }
        if c.watching.len() >= max {
            return Err(MemoryError::LimitReached("max_watches"));
        }
        c.watching.insert(name.to_owned());
        self.stats.watches += 1;
        self.watchers
            .entry(name.to_owned())
            .or_default()
            .insert(connection);
        Ok(())
    }

    /// Stops queueing release notifications of `name` for `connection` (idempotent;
    /// notifications already queued stay).
    pub fn unwatch(&mut self, connection: u64, name: &str) -> Result<(), MemoryError> {
        crate::validate_name(name)?;
        if self.conn(connection)?.watching.remove(name) {
            self.remove_watcher(name, connection);
        }
        Ok(())
    }

    fn remove_watcher(&mut self, name: &str, connection: u64) {
        if let Some(ids) = self.watchers.get_mut(name) {
            if ids.remove(&connection) {
                self.stats.watches -= 1;
            }
            if ids.is_empty() {
                self.watchers.remove(name);
            }
        }
    }

    /// The oldest release notification queued for `connection` (a name it watched), if any.
    pub fn poll_released(&mut self, connection: u64) -> Result<Option<String>, MemoryError> {
        Ok(self.conn(connection)?.pending.pop_front())
    }

    /// How many connections watch `name`.
    pub fn watchers(&self, name: &str) -> usize {
        self.watchers.get(name).map_or(0, BTreeSet::len)
    }

    /// What the service says about `name` at host time `now` (no fault switch applies).
    pub fn status(&mut self, now: u64, name: &str) -> Result<Status, MemoryError> {
        crate::validate_name(name)?;
        let snow = self.clock(now);
        let holder = self.table.live(snow, name).map(|g| HolderStatus {
            token: g.token.to_vec(),
            fence: g.fence,
            expires_at: g.expires_at,
            remaining_ms: (g.expires_at - snow).div_ceil(NS_PER_MS),
            held_for_ns: snow.saturating_sub(g.granted_at),
            connection: g.data.connection,
        });
        Ok(Status {
            service_now: snow,
            holder,
            last_fence: self.table.last_fence(name),
            watchers: self.watchers(name),
        })
    }

    /// Drops the grant of `name` without a notification, as a failover that lost the key
    /// would: the holder's next renew is rejected. The fence is kept. Whether there was one.
    pub fn forget(&mut self, name: &str) -> Result<bool, MemoryError> {
        crate::validate_name(name)?;
        let had = self.table.forget(name);
        self.next_reclaim = 0;
        Ok(had)
    }

    /// Counters and gauges.
    pub fn stats(&self) -> Stats {
        self.stats
    }
}
