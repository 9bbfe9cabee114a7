//! The values that cross the core's boundary: ids, tokens, command results, outputs, getters.

use std::fmt;
use std::sync::Arc;

/// Names one lease inside one core. Ids are never reused, so a stale id can only ever yield
/// "unknown" or "ended", never another lease's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub u64);

/// Matches a command's result to the command. Never reused inside one core, so a late answer
/// to an old request can always be recognised as stale. Opaque to hosts: neither sequential
/// nor ordered in time (it encodes the lease record it belongs to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The ownership token a lease stores on the service: 128 random bits chosen per lease and
/// reused by every retry of that lease, so a retried acquire finds its own grant (rule 9) and
/// release/renew can only ever touch this lease's grant.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(pub(crate) [u8; 16]);

impl Token {
    /// The raw 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Lowercase hex, the form every backend stores (a plain string in Redis, SQL and etcd).
    pub fn to_hex(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        write_lower_hex(&self.0, &mut out);
        out
    }
}

/// Writes `src` as lowercase hex into the front of `dst` (two digits per byte; stops at the
/// shorter of the two). Tokens and Redis wake channels share it.
pub(crate) fn write_lower_hex(src: &[u8], dst: &mut [u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in dst.chunks_exact_mut(2).zip(src) {
        pair[0] = HEX[usize::from(b >> 4)];
        pair[1] = HEX[usize::from(b & 0x0f)];
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.to_hex();
        // Hex digits are ASCII, so this conversion cannot fail.
        f.write_str(std::str::from_utf8(&hex).unwrap_or("?"))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({self})")
    }
}

/// Bytes a [`LockName`] keeps inline. Most lock names ("orders:42", "job/nightly-report") fit.
pub const INLINE_NAME_LEN: usize = 22;

/// A lock name as the core stores it and hands it out in commands. Names of up to
/// [`INLINE_NAME_LEN`] bytes live inline, so a command carrying one costs a 24-byte copy from
/// the lease record that is already in cache. A shared allocation would cost a reference count
/// on a line that has gone cold by the time a renewal comes due, an atomic in both the core and
/// the host's drop. Longer names share one allocation. Reads as a `&str`.
#[derive(Clone)]
pub struct LockName(NameRepr);

#[derive(Clone)]
enum NameRepr {
    Inline {
        len: u8,
        bytes: [u8; INLINE_NAME_LEN],
    },
    Shared(Arc<str>),
}

impl LockName {
    /// The name as text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            // The bytes were copied whole from a `str`, so they are UTF-8 and this never falls
            // back (there is no unchecked conversion outside `src/ffi/`).
            NameRepr::Inline { .. } => std::str::from_utf8(self.as_bytes()).unwrap_or_default(),
            NameRepr::Shared(s) => s,
        }
    }

    /// The name's UTF-8 bytes, without re-checking them (what a transport writes).
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            NameRepr::Inline { len, bytes } => bytes.get(..usize::from(*len)).unwrap_or_default(),
            NameRepr::Shared(s) => s.as_bytes(),
        }
    }
}

impl From<&str> for LockName {
    fn from(name: &str) -> Self {
        let mut bytes = [0u8; INLINE_NAME_LEN];
        match (bytes.get_mut(..name.len()), u8::try_from(name.len())) {
            (Some(head), Ok(len)) => {
                head.copy_from_slice(name.as_bytes());
                Self(NameRepr::Inline { len, bytes })
            }
            _ => Self(NameRepr::Shared(Arc::from(name))),
        }
    }
}

impl From<String> for LockName {
    fn from(name: String) -> Self {
        Self::from(name.as_str())
    }
}

impl std::ops::Deref for LockName {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

/// Lets maps keyed by `LockName` be searched with a `&str`.
impl std::borrow::Borrow<str> for LockName {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for LockName {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for LockName {}

impl PartialEq<str> for LockName {
    fn eq(&self, other: &str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<&str> for LockName {
    fn eq(&self, other: &&str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

/// Hashes exactly as the `str` does (its bytes, then `0xff`), as `Borrow<str>` requires, without
/// re-checking the bytes as UTF-8 on every lookup.
impl std::hash::Hash for LockName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(self.as_bytes());
        state.write_u8(0xff);
    }
}

impl PartialOrd for LockName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for LockName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Prints as the quoted string, like the `Arc<str>` names did (simulator traces rely on it).
impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// What the service answered to an `Acquire` command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireResult<'a> {
    /// The lock is ours. `ttl_ms` is what the service granted (the core uses the smaller of it
    /// and what was asked); `backend_data` is echoed in later commands (an etcd lease id, say).
    Granted {
        /// Strictly increasing per name across all clients; the storage layer checks it.
        fencing_token: u64,
        /// Granted time to live in milliseconds.
        ttl_ms: u64,
        /// Backend-specific ownership bytes, possibly empty.
        backend_data: &'a [u8],
    },
    /// Someone else holds it; `retry_after_ms` is the holder's remaining TTL, when known, so a
    /// waiter can sleep until a dead holder's lock runs out instead of polling.
    HeldByOther {
        /// Remaining TTL of the current holder in milliseconds.
        retry_after_ms: Option<u64>,
    },
    /// The request may or may not have reached the service.
    TransportError,
    /// The request certainly did not take effect (it was never written to a connection):
    /// a failure like `TransportError`, but with no grant that could need a cleanup release,
    /// so a client whose service is down has nothing left to clean up when it closes.
    NotApplied,
}

/// What the service answered to a `Renew` command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewResult {
    /// The TTL was extended from the service's receipt of the request.
    Renewed,
    /// The service no longer records us as the owner: the lease is lost.
    Rejected,
    /// The request may or may not have reached the service.
    TransportError,
}

/// What the service answered to a `Release` command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseResult {
    /// Our grant was deleted.
    Released,
    /// Nothing of ours was there (expired, or never applied): nothing left to clean up.
    NotOwner,
    /// The request may or may not have reached the service; the core retries.
    TransportError,
}

/// Why an acquisition ended without the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum AcquireFailReason {
    /// The wait budget ran out while someone else held the lock.
    WaitExhausted = 1,
    /// The application released the lease before it was granted.
    Cancelled = 2,
    /// The wait budget ran out and the last attempt failed in transport.
    Unavailable = 3,
}

/// Why a held lease was lost. Each is detected by the core, never assumed by the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum LostReason {
    /// The service rejected a renewal: someone else may hold the lock now.
    Rejected = 4,
    /// `valid_until` passed without a confirmed renewal (network hang, paused process).
    Expired = 5,
    /// The renewal failure budget ran out: renewals kept failing in transport until, under
    /// the default time budget, a further retry would leave less than one backoff step of
    /// validity (so the loss is declared just before `valid_until`, never after), or, with a
    /// count budget (`Config::fail_budget = N > 0`), N consecutive failures.
    FailBudget = 6,
}

/// What the service said to the release of a lease the application released, reported by
/// [`Event::ReleaseOutcome`] for releases made with `Client::release_reported`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ReleaseOutcome {
    /// The service deleted our grant.
    Confirmed = 7,
    /// The service refused: our grant was no longer there (it expired, or someone else holds
    /// the lock now), so protected work done near the end may have overlapped another holder.
    NotOwner = 8,
    /// No answer before the grant's TTL had certainly run out: it is gone either way.
    Unconfirmed = 9,
}

/// What a release call did at once (`Client::release_reported`). Its values are the C ABI's
/// `LH_RELEASING_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Releasing {
    /// Other in-process (reentrant) holders remain: nothing was sent, the lease stays held.
    HolderLeft = 1,
    /// The lease ended `Released` and its release is on its way to the service; with
    /// `release_reported` an [`Event::ReleaseOutcome`] tells the service's answer.
    Pending = 2,
    /// The lease's validity had run out before the release was processed (a paused process):
    /// it ended `Lost`, and its `Lost` event, with the reason, is queued.
    Lost = 3,
    /// The lease was never granted: it ended `AcquireFailed` (event queued).
    NotAcquired = 4,
}

/// A lease's lifecycle position. The last three are terminal and sticky (rule 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LeaseState {
    /// Waiting for a grant (attempting or backing off).
    Acquiring = 1,
    /// Granted and not yet known to be lost; see `is_held` for the time-aware answer.
    Held = 2,
    /// Released by the application.
    Released = 3,
    /// Lost while held.
    Lost = 4,
    /// Never granted.
    AcquireFailed = 5,
}

impl LeaseState {
    /// Terminal states never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Released | Self::Lost | Self::AcquireFailed)
    }
}

/// A command for the host to execute against the lock service. Commands with a `request`
/// expect exactly one result fed back with that id (a missing answer times out by itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Try to take `name` for `ttl_ms` with our ownership `token` (idempotent per token).
    Acquire {
        /// Id to answer with.
        request: RequestId,
        /// The lease this attempt belongs to.
        lease: LeaseId,
        /// Lock name.
        name: LockName,
        /// Ownership token (the same for every attempt of this lease).
        token: Token,
        /// Requested TTL in milliseconds.
        ttl_ms: u64,
    },
    /// Extend our grant to `ttl_ms` from the service's receipt, if `token` still owns it.
    Renew {
        /// Id to answer with.
        request: RequestId,
        /// The lease being renewed.
        lease: LeaseId,
        /// Lock name.
        name: LockName,
        /// Ownership token.
        token: Token,
        /// TTL in milliseconds.
        ttl_ms: u64,
        /// Backend ownership bytes from the grant, if any.
        backend_data: Option<Arc<[u8]>>,
    },
    /// Delete our grant, if `token` still owns it, and notify waiters.
    Release {
        /// Id to answer with.
        request: RequestId,
        /// The lease being released (possibly already terminal: cleanup).
        lease: LeaseId,
        /// Lock name.
        name: LockName,
        /// Ownership token.
        token: Token,
        /// Backend ownership bytes from the grant, if any.
        backend_data: Option<Arc<[u8]>>,
    },
    /// Start delivering release notifications for `name` (first local waiter).
    Watch {
        /// Lock name.
        name: LockName,
    },
    /// Stop delivering them (last local waiter left).
    Unwatch {
        /// Lock name.
        name: LockName,
    },
}

/// Something the application should learn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The lease is held; the token must accompany every protected write.
    Acquired {
        /// The lease.
        lease: LeaseId,
        /// Fencing token for the storage layer.
        fencing_token: u64,
        /// Host-monotonic ns after which the lease must be assumed lost.
        valid_until: u64,
    },
    /// Terminal: the lock was not obtained.
    AcquireFailed {
        /// The lease.
        lease: LeaseId,
        /// Why.
        reason: AcquireFailReason,
    },
    /// Terminal: the lock was held and is no longer; stop protected work now.
    Lost {
        /// The lease.
        lease: LeaseId,
        /// Why.
        reason: LostReason,
    },
    /// Terminal: the application released the lease.
    Released {
        /// The lease.
        lease: LeaseId,
    },
    /// A renewal the application asked for (`Client::renew`) was confirmed. Automatic
    /// renewals are silent: the host only needs to hear about the ones it waits for.
    Renewed {
        /// The lease.
        lease: LeaseId,
        /// New end of validity, counted from the renewal's send time.
        valid_until: u64,
    },
    /// The service answered (or never answered) the release of a lease released with
    /// `Client::release_reported`. Not a lifecycle event: it follows the lease's `Released`.
    ReleaseOutcome {
        /// The lease.
        lease: LeaseId,
        /// What the service said.
        outcome: ReleaseOutcome,
    },
}

/// One item drained by `Client::poll_output`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Execute against the service.
    Command(Command),
    /// Deliver to the application.
    Event(Event),
}

/// A snapshot of one lease, for getters and diagnostics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// Lifecycle position.
    pub state: LeaseState,
    /// Lock name.
    pub name: LockName,
    /// Fencing token of the grant, once granted.
    pub fencing_token: Option<u64>,
    /// End of validity, once granted.
    pub valid_until: Option<u64>,
    /// Number of in-process holders (reentrancy).
    pub holders: u32,
}

/// Monotonic counters (and two gauges) for observability; never reset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Gauge: lease records in the table (live plus those finishing cleanup).
    pub live_leases: u64,
    /// Gauge: leases whose release the core still wants confirmed.
    pub pending_cleanups: u64,
    /// Acquire commands emitted.
    pub acquires_sent: u64,
    /// Grants accepted.
    pub grants: u64,
    /// Leases that ended in AcquireFailed.
    pub acquire_failed: u64,
    /// Renew commands emitted.
    pub renewals_sent: u64,
    /// Renewals confirmed.
    pub renewals_ok: u64,
    /// Renewals rejected, failed in transport or timed out.
    pub renewals_failed: u64,
    /// Release commands emitted (including cleanup retries).
    pub releases_sent: u64,
    /// Leases lost because the service rejected a renewal.
    pub lost_rejected: u64,
    /// Leases lost because validity elapsed.
    pub lost_expired: u64,
    /// Leases lost because the renew failure budget ran out.
    pub lost_fail_budget: u64,
    /// Results ignored as unknown, duplicate, superseded or of the wrong kind.
    pub stale_results: u64,
    /// Inputs whose `now` was older than one already seen (clamped).
    pub time_clamped: u64,
    /// Renewals the application asked for (`Client::renew` calls that sent or joined one).
    pub renewals_requested: u64,
    /// Application releases the service confirmed.
    pub releases_confirmed: u64,
    /// Application releases the service refused (our grant was no longer there).
    pub releases_not_owner: u64,
    /// Application releases never answered before the grant had certainly run out.
    pub releases_unconfirmed: u64,
    /// Release calls that found the lease's validity run out: the lease ended Lost instead.
    pub releases_lost: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::hash::BuildHasher;

    fn is_inline(n: &LockName) -> bool {
        matches!(n.0, NameRepr::Inline { .. })
    }

    #[test]
    fn short_names_are_inline_and_longer_ones_shared() {
        let fits = "x".repeat(INLINE_NAME_LEN);
        let over = "x".repeat(INLINE_NAME_LEN + 1);
        let longest = "y".repeat(crate::MAX_NAME_LEN);
        for (text, inline) in [
            ("a", true),
            (&fits[..], true),
            (&over[..], false),
            (&longest[..], false),
        ] {
            let n = LockName::from(text);
            assert_eq!(is_inline(&n), inline, "{} bytes", text.len());
            assert_eq!(n.as_str(), text);
            assert_eq!(n.as_bytes(), text.as_bytes());
            assert_eq!(n.len(), text.len());
            assert_eq!(n.clone(), n);
        }
        assert_eq!(std::mem::size_of::<LockName>(), 24);
    }

    #[test]
    fn multibyte_text_round_trips_on_both_sides_of_the_inline_limit() {
        // 20 ASCII bytes and one 2-byte character fill 22 bytes; one more ASCII byte spills.
        let inline = format!("{}é", "a".repeat(INLINE_NAME_LEN - 2));
        let shared = format!("{}é", "a".repeat(INLINE_NAME_LEN - 1));
        assert!(is_inline(&LockName::from(inline.as_str())));
        assert!(!is_inline(&LockName::from(shared.as_str())));
        for text in [inline, shared, "锁/订单:42".to_string(), "🔒".to_string()] {
            let n = LockName::from(text.clone());
            assert_eq!(n.as_str(), text);
            assert_eq!(n.to_string(), text);
            assert_eq!(format!("{n:?}"), format!("{text:?}"));
        }
    }

    #[test]
    fn equality_ordering_and_hashing_follow_the_text() {
        let a = LockName::from("orders:42");
        assert_eq!(a, "orders:42");
        assert_eq!(a, *"orders:42");
        assert_ne!(a, LockName::from("orders:43"));
        let (a1, b1) = (LockName::from("a"), LockName::from("b"));
        let (zz, long_a) = (LockName::from("zz"), LockName::from(&*"a".repeat(40)));
        assert!(a1 < b1 && zz > long_a && long_a > a1);
        // `Borrow<str>` demands the same hash as the `str`, or lookups by `&str` would miss.
        let state = std::collections::hash_map::RandomState::new();
        let keyed = crate::engine::hash::KeyedState::new(0x5eed);
        for text in ["orders:42", &"long/".repeat(20), "", "ö"] {
            assert_eq!(state.hash_one(LockName::from(text)), state.hash_one(text));
            assert_eq!(keyed.hash_one(LockName::from(text)), keyed.hash_one(text));
        }
        let mut map = HashMap::new();
        map.insert(LockName::from("short"), 1);
        map.insert(LockName::from(&*"long".repeat(10)), 2);
        assert_eq!(map.get("short"), Some(&1));
        assert_eq!(map.get(&*"long".repeat(10)), Some(&2));
        assert_eq!(map.get("missing"), None);
    }
}
