//! Constants and `#[repr(C)]` structs of the C ABI.
//!
//! Values are part of the ABI: they are never renumbered and never reused. Codes that a host
//! passes *in* (outcomes, flags) are taken as plain `u32` and validated, so an unknown value is
//! an error code (`LH_ERR_INVALID_ENUM`) instead of undefined behaviour, which a Rust enum
//! parameter would be.
#![allow(non_camel_case_types)]

/// Status returned by every fallible function (`LH_OK` or one of `LH_ERR_*`).
///
/// A plain `uint32_t` rather than a C enum so that the width is fixed for ctypes and cgo and so
/// that codes added later cannot be undefined behaviour in an older host.
pub type lh_status = u32;

// Status codes are typed `u32` (= `lh_status`) so cbindgen emits them first in the header.

/// Success.
pub const LH_OK: u32 = 0;
/// A required pointer argument was NULL (or NULL with a non-zero length).
pub const LH_ERR_NULL_ARGUMENT: u32 = 1;
/// A name was not valid UTF-8.
pub const LH_ERR_INVALID_UTF8: u32 = 2;
/// A name was empty.
pub const LH_ERR_EMPTY_NAME: u32 = 3;
/// A name was longer than `LH_MAX_NAME_LEN` bytes.
pub const LH_ERR_NAME_TOO_LONG: u32 = 4;
/// A name contained a NUL byte.
pub const LH_ERR_NAME_HAS_NUL: u32 = 5;
/// A TTL was zero, too short for the renew cadence and margins, or above `max_ttl_ms`.
pub const LH_ERR_INVALID_TTL: u32 = 6;
/// A configuration value was out of range (also: a seed longer than `LH_MAX_SEED_LEN`).
pub const LH_ERR_INVALID_CONFIG: u32 = 7;
/// A seed was shorter than `LH_MIN_SEED_LEN` bytes.
pub const LH_ERR_SEED_TOO_SHORT: u32 = 8;
/// A lease id was never issued by this client.
pub const LH_ERR_UNKNOWN_LEASE: u32 = 9;
/// A lease id names a lease that has already ended (released, lost, failed).
pub const LH_ERR_LEASE_ENDED: u32 = 10;
/// The client already holds `max_leases` live lease records.
pub const LH_ERR_TOO_MANY_LEASES: u32 = 11;
/// An enum value or flag bit passed in is not one this library knows.
pub const LH_ERR_INVALID_ENUM: u32 = 12;
/// Retired with the engine-command results of ABI 2 (never reused).
pub const LH_ERR_BACKEND_DATA_TOO_LONG: u32 = 13;
/// A caller-provided buffer was too small (the needed size is reported where documented).
pub const LH_ERR_BUFFER_TOO_SMALL: u32 = 14;
/// The fencing token or validity was asked for a lease that was never granted.
pub const LH_ERR_NOT_GRANTED: u32 = 15;
/// The `struct_size` field of a struct passed in is smaller than this library's struct.
pub const LH_ERR_STRUCT_SIZE: u32 = 16;
/// An answer or message passed in is malformed (`lh_value` list inconsistent, offsets
/// outside the data, unknown kinds, an HTTP status outside 100..=599) or over the limits
/// (`LH_MAX_REPLY_*`); nothing changed: report the request with `lh_io_failed`.
pub const LH_ERR_INVALID_REPLY: u32 = 17;
/// The call needs a backend the handle does not have (kept for hosts built against older
/// headers; `lh_client_new` always attaches one).
pub const LH_ERR_NO_BACKEND: u32 = 18;
/// An ownership token passed to the memory service was empty or longer than
/// `LH_MEMORY_MAX_TOKEN_LEN` bytes.
pub const LH_ERR_INVALID_TOKEN: u32 = 19;
/// A memory-service connection id was never issued by that service, or was disconnected; or
/// a stream id this client never handed out in an `LH_IO_OPEN`.
pub const LH_ERR_UNKNOWN_CONNECTION: u32 = 20;
/// A memory-service limit was reached (connections, watches per connection).
pub const LH_ERR_LIMIT_REACHED: u32 = 21;
/// The answer's kind does not fit the handle's backend (an HTTP reply on a Redis handle, a
/// message on an etcd handle); nothing changed.
pub const LH_ERR_WRONG_ANSWER: u32 = 22;
/// A panic was caught inside the library; the handle is now poisoned.
pub const LH_ERR_PANIC: u32 = 900;
/// The handle was poisoned by an earlier panic; only `lh_client_free` is still meaningful.
pub const LH_ERR_POISONED: u32 = 901;

/// `lh_event.kind`: nothing left to poll. (Values 1 to 5 named engine commands before the
/// seam; they are never reused.)
pub const LH_EVENT_NONE: u32 = 0;
/// The lease is held (lease_id, fencing_token, valid_until_ns).
pub const LH_EVENT_ACQUIRED: u32 = 6;
/// Terminal: the acquire did not succeed (lease_id, reason).
pub const LH_EVENT_ACQUIRE_FAILED: u32 = 7;
/// Terminal: a held lease was lost (lease_id, reason).
pub const LH_EVENT_LOST: u32 = 8;
/// Terminal: the lease was released by the application (lease_id).
pub const LH_EVENT_RELEASED: u32 = 9;
/// A renewal asked for with `lh_renew` was confirmed (lease_id, valid_until_ns). Only hosts
/// that call `lh_renew` ever see it; automatic renewals are silent.
pub const LH_EVENT_RENEWED: u32 = 10;
/// The service's answer to a release whose disposition was asked for (`lh_release` with a
/// non-NULL `out_releasing`; lease_id; reason `LH_REASON_RELEASE_CONFIRMED`, `_NOT_OWNER` or
/// `_UNCONFIRMED`). Not a lifecycle event: it follows RELEASED.
pub const LH_EVENT_RELEASE_OUTCOME: u32 = 11;

/// `lh_event.reason`: no reason (every event kind except ACQUIRE_FAILED, LOST and
/// RELEASE_OUTCOME).
pub const LH_REASON_NONE: u32 = 0;
/// ACQUIRE_FAILED: the wait budget ran out while someone else held the lock.
pub const LH_REASON_WAIT_EXHAUSTED: u32 = 1;
/// ACQUIRE_FAILED: the application released the lease while it was being acquired.
pub const LH_REASON_CANCELLED: u32 = 2;
/// ACQUIRE_FAILED: the service could not be reached within the wait budget.
pub const LH_REASON_UNAVAILABLE: u32 = 3;
/// LOST: the service rejected a renew (someone else owns the lock now).
pub const LH_REASON_REJECTED: u32 = 4;
/// LOST: the validity window elapsed without a confirmed renewal.
pub const LH_REASON_EXPIRED: u32 = 5;
/// LOST: the renewal failure budget ran out: under the default time budget
/// (`fail_budget = 0`) renewals kept failing until validity was about to end (declared
/// before valid_until, never after); with `fail_budget = N > 0`, N consecutive failures.
pub const LH_REASON_FAIL_BUDGET: u32 = 6;
/// RELEASE_OUTCOME: the service deleted our grant.
pub const LH_REASON_RELEASE_CONFIRMED: u32 = 7;
/// RELEASE_OUTCOME: the service refused: our grant was no longer there (expired, or someone
/// else holds the lock now).
pub const LH_REASON_RELEASE_NOT_OWNER: u32 = 8;
/// RELEASE_OUTCOME: no answer before the grant's TTL had certainly run out (it is gone).
pub const LH_REASON_RELEASE_UNCONFIRMED: u32 = 9;

/// `lh_release` disposition: other reentrant holders remain; nothing was sent.
pub const LH_RELEASING_HOLDER_LEFT: u32 = 1;
/// `lh_release` disposition: the lease ended RELEASED (event queued) and a RELEASE
/// command was sent; a RELEASE_OUTCOME event follows with the service's answer.
pub const LH_RELEASING_PENDING: u32 = 2;
/// `lh_release` disposition: the lease's validity had run out before the release
/// (a paused process): it ended LOST, and its LOST event, with the reason, is queued.
pub const LH_RELEASING_LOST: u32 = 3;
/// `lh_release` disposition: the lease was never granted; it ended ACQUIRE_FAILED.
pub const LH_RELEASING_NOT_ACQUIRED: u32 = 4;

/// Lease state: an acquire is in progress.
pub const LH_STATE_ACQUIRING: u32 = 1;
/// Lease state: granted and believed valid.
pub const LH_STATE_HELD: u32 = 2;
/// Lease state (terminal): released by the application.
pub const LH_STATE_RELEASED: u32 = 3;
/// Lease state (terminal): lost after a grant.
pub const LH_STATE_LOST: u32 = 4;
/// Lease state (terminal): never granted.
pub const LH_STATE_ACQUIRE_FAILED: u32 = 5;

/// `lh_poll_timeout`: the core has no deadline; wait for other inputs only.
pub const LH_NO_DEADLINE: u64 = u64::MAX;
/// `lh_acquire_options.flags` bit: in-process reentrant acquire.
pub const LH_ACQUIRE_REENTRANT: u32 = 1;
/// `lh_acquire_options.flags` bit: no automatic renewal; only `lh_renew` extends the lease,
/// which is lost (EXPIRED) when its validity ends unless renewed.
pub const LH_ACQUIRE_NO_AUTO_RENEW: u32 = 2;

/// Default requested TTL of `lh_acquire_options_default`, in ms.
pub const LH_DEFAULT_TTL_MS: u64 = 30_000;

/// Longest accepted name in bytes (equals the core's `MAX_NAME_LEN`).
pub const LH_MAX_NAME_LEN: usize = 512;
/// Shortest accepted seed in bytes (equals the core's `MIN_SEED_LEN`).
pub const LH_MIN_SEED_LEN: usize = 16;
/// Longest accepted seed in bytes: bounds how far the library reads from a seed pointer, so a
/// garbage length is an error instead of an out-of-bounds read of gigabytes.
pub const LH_MAX_SEED_LEN: usize = 1024;

/// ABI version; bumped on any incompatible change. Wrappers compare it with `lh_abi_version()`
/// at load time.
pub const LH_ABI_VERSION: u32 = 4;
/// Library version (the crate version in Cargo.toml; a test keeps them equal). cbindgen cannot
/// emit string constants, so the header gets `LH_VERSION` from `after_includes` in cbindgen.toml.
///
/// cbindgen:ignore
pub const LH_VERSION: &str = "0.1.0";

const _: () = {
    assert!(LH_MAX_NAME_LEN == crate::MAX_NAME_LEN);
    assert!(LH_MIN_SEED_LEN == crate::MIN_SEED_LEN);
    assert!(LH_MIN_SEED_LEN <= LH_MAX_SEED_LEN);
    assert!(const_str_eq(LH_VERSION, env!("CARGO_PKG_VERSION")));
};

const fn const_str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Client configuration. Fill it with `lh_config_default`, then change fields.
///
/// `struct_size` comes first so that the struct can grow: the library reads only the fields it
/// knows and rejects a `struct_size` smaller than its own struct with `LH_ERR_STRUCT_SIZE`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct lh_config {
    /// `sizeof(lh_config)` as compiled by the caller.
    pub struct_size: u32,
    /// Clock drift allowance in parts per million of the TTL (default 10000 = 1%).
    pub drift_ppm: u32,
    /// Fixed drift allowance in ns (default 2 ms).
    pub drift_fixed_ns: u64,
    /// Jitter of the renew cadence (TTL/3) in ppm (default 100000 = ±10%).
    pub renew_jitter_ppm: u32,
    /// Renewal failure budget. 0 (default): a time budget: transport failures are retried
    /// with backoff while validity remains; the lease is lost on a rejection, or (FAIL_BUDGET)
    /// when validity is about to end without a confirmed renewal, or (EXPIRED) at valid_until
    /// with a renewal unanswered. N > 0: lost (FAIL_BUDGET) after N consecutive failures.
    pub fail_budget: u32,
    /// Timeout of each request in ns (renews use min(this, TTL/3); default 2 s).
    pub request_timeout_ns: u64,
    /// Base of the capped exponential acquire backoff in ns (default 5 ms).
    pub backoff_base_ns: u64,
    /// Cap of the acquire backoff in ns (default 500 ms).
    pub backoff_cap_ns: u64,
    /// Largest TTL accepted by `lh_acquire` in ms (default 7 days).
    pub max_ttl_ms: u64,
    /// Most live lease records (default 1048576).
    pub max_leases: u32,
    /// 1 (default) to let waiters sleep until the backend's release notification (Redis
    /// pub/sub, PostgreSQL NOTIFY, etcd watches, the memory service's messages), 0 to make
    /// them poll with capped backoff. Any other value is `LH_ERR_INVALID_CONFIG`.
    pub notifications: u32,
}

/// Options of one `lh_acquire`. Fill with `lh_acquire_options_default`, then change fields.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct lh_acquire_options {
    /// `sizeof(lh_acquire_options)` as compiled by the caller.
    pub struct_size: u32,
    /// `LH_ACQUIRE_REENTRANT | LH_ACQUIRE_NO_AUTO_RENEW` bits or 0; unknown bits are
    /// `LH_ERR_INVALID_ENUM`.
    pub flags: u32,
    /// Requested TTL in ms (default 30000).
    pub ttl_ms: u64,
    /// Wait budget in ns; 0 means one attempt (default 0).
    pub wait_ns: u64,
}

/// One polled event for the application (`lh_poll_event`). Flat and union-free so that
/// ctypes and cgo mirror it field for field; fields that do not apply to `kind` are 0.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct lh_event {
    /// `LH_EVENT_*`.
    pub kind: u32,
    /// `LH_REASON_*` (ACQUIRE_FAILED, LOST, RELEASE_OUTCOME), else `LH_REASON_NONE`.
    pub reason: u32,
    /// The lease the event concerns (0 for NONE).
    pub lease_id: u64,
    /// Fencing token of the grant (ACQUIRED).
    pub fencing_token: u64,
    /// Monotonic ns until which the lease is valid (ACQUIRED, RENEWED).
    pub valid_until_ns: u64,
}

/// Snapshot of one lease, filled by `lh_lease_info_get`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct lh_lease_info {
    /// `sizeof(lh_lease_info)` as compiled by the caller; set to the library's size on return.
    pub struct_size: u32,
    /// `LH_STATE_*`.
    pub state: u32,
    /// Number of reentrant holders (1 for a plain lease).
    pub holders: u32,
    /// 1 if the lease was granted (then `fencing_token` is meaningful), else 0.
    pub has_token: u32,
    /// Fencing token of the grant, 0 if none.
    pub fencing_token: u64,
    /// Monotonic ns until which the lease is valid, 0 if not known.
    pub valid_until_ns: u64,
}

/// Counters of one client, filled by `lh_counters_get`.
///
/// Grows at the end only: a caller compiled against an older header (a smaller
/// `struct_size`, at least `LH_COUNTERS_V1_SIZE`) gets the fields it knows.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct lh_counters {
    /// `sizeof(lh_counters)` as compiled by the caller; set to the library's size on return.
    pub struct_size: u32,
    /// Always 0; keeps the u64 fields 8-byte aligned.
    pub _reserved: u32,
    /// Gauge: lease records in the table (live plus those finishing cleanup).
    pub live_leases: u64,
    /// Gauge: leases whose release the core still wants confirmed (drive the loop until 0 on
    /// close).
    pub pending_cleanups: u64,
    /// Acquire commands emitted.
    pub acquires_sent: u64,
    /// Grants received.
    pub grants: u64,
    /// Leases that ended in ACQUIRE_FAILED.
    pub acquire_failed: u64,
    /// Renew commands emitted.
    pub renewals_sent: u64,
    /// Renews confirmed.
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
    /// `lh_renew` calls that sent or joined a renewal.
    pub renewals_requested: u64,
    /// Application releases the service confirmed.
    pub releases_confirmed: u64,
    /// Application releases the service refused (not owner).
    pub releases_not_owner: u64,
    /// Application releases never answered before the grant had certainly run out.
    pub releases_unconfirmed: u64,
    /// Releases that found the lease's validity run out: the lease ended LOST instead.
    pub releases_lost: u64,
    /// Backend protocol (every backend): requests emitted.
    pub backend_requests: u64,
    /// Error answers (Redis error replies, etcd error bodies or statuses, memory refusals).
    pub backend_error_replies: u64,
    /// Answers of a shape the request cannot have (a foreign table, a garbage reply).
    pub backend_garbage_replies: u64,
    /// Answers and failures for unknown or already answered request ids.
    pub backend_stale_replies: u64,
    /// Requests reported failed in transport.
    pub backend_transport_failures: u64,
    /// Release notifications that woke a waiting name.
    pub backend_wakeups: u64,
    /// Notifications and confirmations ignored (not for a name waited on here).
    pub backend_ignored_messages: u64,
    /// Redis: script calls emitted (EVALSHA and EVAL).
    pub redis_script_calls: u64,
    /// Redis: EVALSHAs re-sent as EVAL after NOSCRIPT.
    pub redis_noscript_retries: u64,
    /// Redis: retries answered without a round trip.
    pub redis_local_refusals: u64,
    /// Redis: standbys that tried after hearing nothing.
    pub redis_standby_takeovers: u64,
    /// Redis: times the subscription took effect.
    pub redis_subscriptions: u64,
    /// Redis: times the subscription was reported lost.
    pub redis_subscriber_losses: u64,
    /// Redis, gauge: 1 while the subscription is in effect.
    pub redis_subscribed: u64,
    /// SQL: schema migrations emitted.
    pub sql_migrations: u64,
    /// SQL: requests the database refused.
    pub sql_database_errors: u64,
    /// etcd: leases granted.
    pub etcd_leases_granted: u64,
    /// etcd: acquire transactions sent.
    pub etcd_txns: u64,
    /// etcd: watches opened on a predecessor.
    pub etcd_watches: u64,
    /// etcd: keep-alives sent for waiting leases.
    pub etcd_waiting_keepalives: u64,
    /// etcd: waiters whose etcd lease was gone (they rejoined the queue).
    pub etcd_waiters_expired: u64,
    /// Redis stream: connections asked for (`LH_IO_OPEN`), to the servers and the sentinels.
    pub stream_opens: u64,
    /// Redis stream: connections that ended (closed by the host or the server, or shut down
    /// by the core).
    pub stream_closes: u64,
    /// Redis stream: host reports about connections already ended (ignored).
    pub stream_late_answers: u64,
    /// Redis stream: master lookups sent to a sentinel (a `redis+sentinel://` URL only).
    pub sentinel_lookups: u64,
    /// Redis stream: slot map questions (`CLUSTER SHARDS` / `CLUSTER SLOTS`) sent (a
    /// `redis+cluster://` URL only): each follows a start, a redirect or a node that failed.
    pub cluster_refreshes: u64,
    /// Redis stream: `MOVED` and `ASK` redirections followed (a `redis+cluster://` URL only); a
    /// steady count means the slot map is current.
    pub cluster_redirects: u64,
}

/// Size of the first `lh_counters` (up to `time_clamped`): the smallest `struct_size`
/// `lh_counters_get` accepts.
pub const LH_COUNTERS_V1_SIZE: usize = 120;

const _: () = assert!(std::mem::offset_of!(lh_counters, renewals_requested) == LH_COUNTERS_V1_SIZE);
