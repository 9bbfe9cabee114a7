//! The `lh_memory_service_*` exports: the in-memory reference lock service
//! (`service::memory`) for every binding's tests and examples.
//!
//! One opaque `lh_memory_service` is one service ("the server"); each client talks to it
//! through a connection id with its own fault switches. Requests answer at once with an
//! `lh_memory_result` whose `engine_outcome` is the value to feed to `lh_acquire_result` /
//! `lh_renew_result` / `lh_release_result`, so a wrapper needs no mapping of its own.
//! Host-level faults (delay, hang) stay in the wrappers: the service never waits.
#![allow(non_camel_case_types)]

use std::ffi::c_char;

use super::boundary::{
    Diag, Failure, bytes_arg, check_sized_out, guard_parts, guard_static, name_arg, read_sized,
    require_out, write_out,
};
use super::types::*;
#[cfg(feature = "testing")]
use crate::service::memory::Faults;
use crate::service::memory::{Limits, MemoryError, MemoryService, Reply, Stats, Status};

/// Longest ownership token the memory service accepts, in bytes (the engine's are 32).
pub const LH_MEMORY_MAX_TOKEN_LEN: usize = 64;

/// `lh_memory_result.outcome` (acquire): the token holds the name (fencing_token, ttl_ms).
pub const LH_MEMORY_GRANTED: u32 = 1;
/// `lh_memory_result.outcome` (acquire): another token holds it (retry_after_ms, or
/// `LH_NO_RETRY_HINT` when a reject switch answered).
pub const LH_MEMORY_HELD_BY_OTHER: u32 = 2;
/// `lh_memory_result.outcome` (renew): extended.
pub const LH_MEMORY_RENEWED: u32 = 3;
/// `lh_memory_result.outcome` (renew): the token does not hold the name.
pub const LH_MEMORY_REJECTED: u32 = 4;
/// `lh_memory_result.outcome` (release): deleted; watchers are notified.
pub const LH_MEMORY_RELEASED: u32 = 5;
/// `lh_memory_result.outcome` (release): the token did not hold the name; nothing changed.
pub const LH_MEMORY_NOT_OWNER: u32 = 6;
/// `lh_memory_result.outcome`: no answer (request or answer lost, or partitioned): a
/// transport error for the engine.
pub const LH_MEMORY_DROPPED: u32 = 7;
/// `lh_memory_result.outcome` (acquire): a new name while every record is live
/// (`max_names`): a transport error for the engine.
pub const LH_MEMORY_FULL: u32 = 8;

/// `lh_memory_faults.flags`: acquires answer HELD_BY_OTHER (no hint) without looking.
pub const LH_MEMORY_REJECT_ACQUIRES: u32 = 1;
/// `lh_memory_faults.flags`: renews answer REJECTED without looking (the lease is lost).
pub const LH_MEMORY_REJECT_RENEWALS: u32 = 2;
/// `lh_memory_faults.flags`: releases answer NOT_OWNER without looking.
pub const LH_MEMORY_REJECT_RELEASES: u32 = 4;
/// `lh_memory_faults.flags`: all three reject switches.
pub const LH_MEMORY_REJECT_ALL: u32 = 7;
/// `lh_memory_faults.flags`: requests are lost before reaching the service (DROPPED).
pub const LH_MEMORY_DROP_REQUESTS: u32 = 8;
/// `lh_memory_faults.flags`: requests are applied, then their answers lost (DROPPED).
pub const LH_MEMORY_DROP_RESPONSES: u32 = 16;
/// `lh_memory_faults.flags`: cut off: requests are lost (DROPPED) and release notifications
/// for the connection are discarded.
pub const LH_MEMORY_PARTITIONED: u32 = 32;
#[cfg(feature = "testing")]
const ALL_FAULT_FLAGS: u32 = 63;

const _: () = assert!(LH_MEMORY_MAX_TOKEN_LEN == crate::service::memory::MAX_TOKEN_BYTES);

/// Limits of a memory service. Fill with `lh_memory_config_default`, then change fields;
/// every field is 1 to 2^24 (else `LH_ERR_INVALID_CONFIG`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct lh_memory_config {
    /// `sizeof(lh_memory_config)` as compiled by the caller.
    pub struct_size: u32,
    /// Most names with a record (default 65536); free and expired records are reclaimed when
    /// it is reached, and an acquire of a new name answers `LH_MEMORY_FULL` if none is.
    pub max_names: u32,
    /// Most open connections (default 1024).
    pub max_connections: u32,
    /// Most names one connection watches (default 4096).
    pub max_watches: u32,
    /// Most release notifications queued per connection (default 1024); later ones are
    /// discarded and counted.
    pub max_pending: u32,
}

/// The fault switches of one connection (`lh_memory_service_set_faults` / `_get_faults`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct lh_memory_faults {
    /// `sizeof(lh_memory_faults)` as compiled by the caller.
    pub struct_size: u32,
    /// `LH_MEMORY_REJECT_* | LH_MEMORY_DROP_* | LH_MEMORY_PARTITIONED` bits, or 0 for none;
    /// unknown bits are `LH_ERR_INVALID_ENUM`.
    pub flags: u32,
    /// The answers of the next this-many requests are lost (counts down as they go).
    pub drop_next_responses: u32,
    /// Always 0.
    pub _reserved: u32,
}

/// The answer to one acquire / renew / release.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct lh_memory_result {
    /// `sizeof(lh_memory_result)` as compiled by the caller; set to the library's size on return.
    pub struct_size: u32,
    /// `LH_MEMORY_*` outcome.
    pub outcome: u32,
    /// What to feed the engine: `LH_ACQUIRE_*` (acquire), `LH_RENEW_*` (renew) or
    /// `LH_RELEASE_*` (release); DROPPED and FULL are the TRANSPORT_ERROR of each.
    pub engine_outcome: u32,
    /// Always 0.
    pub _reserved: u32,
    /// Fencing token (GRANTED), else 0.
    pub fencing_token: u64,
    /// TTL granted in ms (GRANTED), else 0.
    pub ttl_ms: u64,
    /// The holder's remaining TTL in ms, rounded up (HELD_BY_OTHER), else `LH_NO_RETRY_HINT`.
    pub retry_after_ms: u64,
}

/// What the service says about one name (`lh_memory_service_status`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct lh_memory_status {
    /// `sizeof(lh_memory_status)` as compiled by the caller; set to the library's size on return.
    pub struct_size: u32,
    /// 1 while an unexpired grant exists, else 0 (then the holder fields are 0).
    pub held: u32,
    /// The holder's fencing token.
    pub fencing_token: u64,
    /// The holder's remaining TTL in ms, rounded up.
    pub remaining_ttl_ms: u64,
    /// Service time of the holder's expiry, ns.
    pub expires_at_ns: u64,
    /// Time since the grant on the service's clock, ns.
    pub held_for_ns: u64,
    /// Connection that acquired it.
    pub holder_connection: u64,
    /// Highest fencing token issued for the name; 0 if never (or its record was reclaimed).
    pub last_fencing_token: u64,
    /// The service's clock when it looked, ns (the host's `now` plus every clock step).
    pub service_now_ns: u64,
    /// Length of `holder_token`.
    pub holder_token_len: u32,
    /// Connections watching the name (held or not).
    pub watchers: u32,
    /// The holder's ownership token (its first `holder_token_len` bytes), not NUL-terminated.
    pub holder_token: [u8; LH_MEMORY_MAX_TOKEN_LEN],
}

/// Counters of a memory service (`lh_memory_service_stats_get`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct lh_memory_stats {
    /// `sizeof(lh_memory_stats)` as compiled by the caller; set to the library's size on return.
    pub struct_size: u32,
    /// Always 0.
    pub _reserved: u32,
    /// Gauge: names with a record.
    pub names: u64,
    /// Gauge: open connections.
    pub connections: u64,
    /// New grants (idempotent re-acquires not counted).
    pub grants: u64,
    /// Releases that deleted a grant.
    pub releases: u64,
    /// Renews that extended a grant.
    pub renewals: u64,
    /// Renews refused (not the holder, or a reject switch).
    pub renewals_rejected: u64,
    /// Gauge: (connection, name) watches.
    pub watches: u64,
    /// Release notifications queued for watchers.
    pub notifications: u64,
    /// Release notifications discarded (partitioned connection, full queue).
    pub notifications_dropped: u64,
    /// Records reclaimed to stay within `max_names`.
    pub reclaimed: u64,
}

/// Opaque memory-service handle: one in-process lock service, for tests and examples (it is
/// not a lock across processes). Created by `lh_memory_service_new`, destroyed by
/// `lh_memory_service_free`. Not thread-safe: one thread at a time.
pub struct lh_memory_service {
    state: MemoryState,
    diag: Diag,
}

impl std::fmt::Debug for lh_memory_service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("lh_memory_service")
            .field("diag", &self.diag)
            .finish_non_exhaustive()
    }
}

struct MemoryState {
    svc: MemoryService,
    /// Name of the last polled notification; the borrowed pointer points into it.
    out_name: String,
}

impl From<MemoryError> for Failure {
    fn from(e: MemoryError) -> Self {
        let status = match &e {
            MemoryError::Name(inner) => return Failure::from(inner.clone()),
            MemoryError::InvalidToken { .. } => LH_ERR_INVALID_TOKEN,
            MemoryError::InvalidTtl => LH_ERR_INVALID_TTL,
            MemoryError::UnknownConnection(_) => LH_ERR_UNKNOWN_CONNECTION,
            MemoryError::LimitReached(_) => LH_ERR_LIMIT_REACHED,
            MemoryError::InvalidLimits(_) => LH_ERR_INVALID_CONFIG,
        };
        Failure::new(status, e.to_string())
    }
}

/// Runs `f` on a service handle inside the panic boundary.
///
/// # Safety
/// `p` is NULL or a live handle from `lh_memory_service_new` not used concurrently.
unsafe fn guard_svc(
    p: *mut lh_memory_service,
    f: impl FnOnce(&mut MemoryState) -> Result<(), Failure>,
) -> lh_status {
    // SAFETY: the caller guarantees `p` is NULL or a live, unaliased handle.
    let Some(h) = (unsafe { p.as_mut() }) else {
        return LH_ERR_NULL_ARGUMENT;
    };
    guard_parts(&h.diag, &mut h.state, f)
}

/// # Safety
/// `ptr` points to `len` readable bytes (or is NULL: an error).
unsafe fn token_arg<'a>(ptr: *const u8, len: usize) -> Result<&'a [u8], Failure> {
    // SAFETY: forwarded contract.
    unsafe {
        bytes_arg(
            ptr,
            len,
            LH_MEMORY_MAX_TOKEN_LEN,
            "token",
            LH_ERR_INVALID_TOKEN,
        )
    }
}

fn limits_from_c(c: &lh_memory_config) -> Limits {
    Limits {
        max_names: c.max_names,
        max_connections: c.max_connections,
        max_watches: c.max_watches,
        max_pending: c.max_pending,
    }
}

#[cfg(feature = "testing")]
fn faults_to_c(f: Faults) -> lh_memory_faults {
    let bit = |on: bool, b: u32| if on { b } else { 0 };
    lh_memory_faults {
        struct_size: size_of::<lh_memory_faults>() as u32,
        flags: bit(f.reject_acquires, LH_MEMORY_REJECT_ACQUIRES)
            | bit(f.reject_renewals, LH_MEMORY_REJECT_RENEWALS)
            | bit(f.reject_releases, LH_MEMORY_REJECT_RELEASES)
            | bit(f.drop_requests, LH_MEMORY_DROP_REQUESTS)
            | bit(f.drop_responses, LH_MEMORY_DROP_RESPONSES)
            | bit(f.partitioned, LH_MEMORY_PARTITIONED),
        drop_next_responses: f.drop_next_responses,
        _reserved: 0,
    }
}

#[cfg(feature = "testing")]
fn faults_from_c(c: &lh_memory_faults) -> Result<Faults, Failure> {
    if c.flags & !ALL_FAULT_FLAGS != 0 {
        return Err(Failure::invalid_enum("lh_memory_faults.flags", c.flags));
    }
    let on = |b: u32| c.flags & b != 0;
    Ok(Faults {
        reject_acquires: on(LH_MEMORY_REJECT_ACQUIRES),
        reject_renewals: on(LH_MEMORY_REJECT_RENEWALS),
        reject_releases: on(LH_MEMORY_REJECT_RELEASES),
        drop_requests: on(LH_MEMORY_DROP_REQUESTS),
        drop_responses: on(LH_MEMORY_DROP_RESPONSES),
        drop_next_responses: c.drop_next_responses,
        partitioned: on(LH_MEMORY_PARTITIONED),
    })
}

/// Which engine input a reply answers (for `engine_outcome`).
#[derive(Clone, Copy)]
enum Request {
    Acquire,
    Renew,
    Release,
}

fn result_to_c(req: Request, reply: Reply) -> lh_memory_result {
    let transport_error = match req {
        Request::Acquire => LH_ACQUIRE_TRANSPORT_ERROR,
        Request::Renew => LH_RENEW_TRANSPORT_ERROR,
        Request::Release => LH_RELEASE_TRANSPORT_ERROR,
    };
    let mut r = lh_memory_result {
        struct_size: size_of::<lh_memory_result>() as u32,
        outcome: 0,
        engine_outcome: transport_error,
        _reserved: 0,
        fencing_token: 0,
        ttl_ms: 0,
        retry_after_ms: LH_NO_RETRY_HINT,
    };
    (r.outcome, r.engine_outcome) = match reply {
        Reply::Granted { fence, ttl_ms } => {
            r.fencing_token = fence;
            r.ttl_ms = ttl_ms;
            (LH_MEMORY_GRANTED, LH_ACQUIRE_GRANTED)
        }
        Reply::HeldByOther { retry_after_ms } => {
            r.retry_after_ms = retry_after_ms.unwrap_or(LH_NO_RETRY_HINT);
            (LH_MEMORY_HELD_BY_OTHER, LH_ACQUIRE_HELD_BY_OTHER)
        }
        Reply::Renewed => (LH_MEMORY_RENEWED, LH_RENEW_RENEWED),
        Reply::Rejected => (LH_MEMORY_REJECTED, LH_RENEW_REJECTED),
        Reply::Released => (LH_MEMORY_RELEASED, LH_RELEASE_RELEASED),
        Reply::NotOwner => (LH_MEMORY_NOT_OWNER, LH_RELEASE_NOT_OWNER),
        Reply::Dropped => (LH_MEMORY_DROPPED, transport_error),
        Reply::Full => (LH_MEMORY_FULL, transport_error),
    };
    r
}

fn status_to_c(st: &Status) -> lh_memory_status {
    let holder = st.holder.as_ref();
    let mut s = lh_memory_status {
        struct_size: size_of::<lh_memory_status>() as u32,
        held: 0,
        fencing_token: 0,
        remaining_ttl_ms: 0,
        expires_at_ns: 0,
        held_for_ns: 0,
        holder_connection: 0,
        last_fencing_token: st.last_fence.unwrap_or(0),
        service_now_ns: st.service_now,
        holder_token_len: 0,
        watchers: u32::try_from(st.watchers).unwrap_or(u32::MAX),
        holder_token: [0; LH_MEMORY_MAX_TOKEN_LEN],
    };
    if let Some(h) = holder {
        s.held = 1;
        s.fencing_token = h.fence;
        s.remaining_ttl_ms = h.remaining_ms;
        s.expires_at_ns = h.expires_at;
        s.held_for_ns = h.held_for_ns;
        s.holder_connection = h.connection;
        let n = h.token.len().min(LH_MEMORY_MAX_TOKEN_LEN);
        s.holder_token[..n].copy_from_slice(&h.token[..n]);
        s.holder_token_len = n as u32;
    }
    s
}

fn stats_to_c(s: Stats) -> lh_memory_stats {
    lh_memory_stats {
        struct_size: size_of::<lh_memory_stats>() as u32,
        _reserved: 0,
        names: s.names,
        connections: s.connections,
        grants: s.grants,
        releases: s.releases,
        renewals: s.renewals,
        renewals_rejected: s.renewals_rejected,
        watches: s.watches,
        notifications: s.notifications,
        notifications_dropped: s.notifications_dropped,
        reclaimed: s.reclaimed,
    }
}

/// Fills `*out` with the default limits (and `struct_size`). NULL is ignored.
///
/// # Safety
/// `out` is NULL or valid for writing one `lh_memory_config`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_config_default(out: *mut lh_memory_config) {
    if out.is_null() {
        return;
    }
    let d = Limits::default();
    let value = lh_memory_config {
        struct_size: size_of::<lh_memory_config>() as u32,
        max_names: d.max_names,
        max_connections: d.max_connections,
        max_watches: d.max_watches,
        max_pending: d.max_pending,
    };
    // SAFETY: non-NULL; valid per the caller's contract.
    unsafe { write_out(out, value) };
}

/// Creates an empty memory service with the limits in `*cfg`. On success `*out` receives a
/// handle to free with `lh_memory_service_free`.
///
/// Errors: NULL `cfg`/`out`, small `cfg->struct_size` (`LH_ERR_STRUCT_SIZE`), a limit of 0
/// or above 2^24 (`LH_ERR_INVALID_CONFIG`). There is no handle yet, so no detail message.
///
/// # Safety
/// `cfg` points to a readable `lh_memory_config`; `out` is valid for writing one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_new(
    cfg: *const lh_memory_config,
    out: *mut *mut lh_memory_service,
) -> lh_status {
    guard_static(|| {
        require_out(out, "out")?;
        // SAFETY: per the caller's contract.
        let cfg = unsafe { read_sized(cfg, "cfg")? };
        let svc = MemoryService::new(limits_from_c(&cfg))?;
        let handle = Box::new(lh_memory_service {
            state: MemoryState {
                svc,
                out_name: String::new(),
            },
            diag: Diag::new(),
        });
        // SAFETY: checked non-NULL above; valid per the caller's contract.
        unsafe { write_out(out, Box::into_raw(handle)) };
        Ok(())
    })
}

/// Destroys a memory service (its connection ids and borrowed pointers become invalid).
/// NULL is a no-op; freeing twice is undefined behaviour, as with `free()`.
///
/// # Safety
/// `svc` is NULL or a handle from `lh_memory_service_new` that is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_free(svc: *mut lh_memory_service) {
    if svc.is_null() {
        return;
    }
    // SAFETY: a live handle from Box::into_raw, given up by the caller.
    let handle = unsafe { Box::from_raw(svc) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(handle)));
}

/// NUL-terminated detail of the last error on this handle, "" if none (also for NULL).
/// Valid until the next call on this handle.
///
/// # Safety
/// `svc` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_last_error(
    svc: *const lh_memory_service,
) -> *const c_char {
    // SAFETY: per the caller's contract.
    match unsafe { svc.as_ref() } {
        Some(h) => h.diag.message_ptr(),
        None => c"".as_ptr(),
    }
}

/// Opens a connection (one per client: it has its own fault switches, watches and
/// notification queue). `*out_connection` receives its id (never 0, never reused).
///
/// Errors: `LH_ERR_LIMIT_REACHED` at `max_connections`.
///
/// # Safety
/// `svc` is NULL or a live handle; `out_connection` is valid for writing a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_connect(
    svc: *mut lh_memory_service,
    out_connection: *mut u64,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_svc(svc, |s| {
            require_out(out_connection, "out_connection")?;
            let id = s.svc.connect()?;
            write_out(out_connection, id);
            Ok(())
        })
    }
}

/// Closes a connection: its watches and queued notifications go; the locks it acquired stay
/// until they expire, as a dead client's would. Errors: `LH_ERR_UNKNOWN_CONNECTION`.
///
/// # Safety
/// `svc` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_disconnect(
    svc: *mut lh_memory_service,
    connection: u64,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_svc(svc, |s| {
            s.svc.disconnect(connection)?;
            Ok(())
        })
    }
}

/// Shared body of acquire / renew / release: argument checks before any state changes.
///
/// # Safety
/// As for the exports that call it.
#[allow(clippy::too_many_arguments)]
unsafe fn request(
    svc: *mut lh_memory_service,
    req: Request,
    connection: u64,
    now: u64,
    name: *const u8,
    name_len: usize,
    token: *const u8,
    token_len: usize,
    ttl_ms: u64,
    out: *mut lh_memory_result,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_svc(svc, |s| {
            check_sized_out(out, "out")?;
            let name = name_arg(name, name_len)?;
            let token = token_arg(token, token_len)?;
            let reply = match req {
                Request::Acquire => s.svc.acquire(connection, now, name, token, ttl_ms)?,
                Request::Renew => s.svc.renew(connection, now, name, token, ttl_ms)?,
                Request::Release => s.svc.release(connection, now, name, token)?,
            };
            write_out(out, result_to_c(req, reply));
            Ok(())
        })
    }
}

/// Acquires `name` for `token` for `ttl_ms` at host time `now` (monotonic ns; the service's
/// clock is it plus every clock step). Idempotent for the same token: the same fencing
/// token, the TTL counted again from now. `*out` receives GRANTED, HELD_BY_OTHER, DROPPED or
/// FULL, with `engine_outcome` an `LH_ACQUIRE_*` value.
///
/// Errors (nothing changed, `*out` untouched): NULL pointers, small `out->struct_size`, bad
/// names (as for `lh_acquire`), a token empty or over `LH_MEMORY_MAX_TOKEN_LEN`
/// (`LH_ERR_INVALID_TOKEN`), `ttl_ms == 0` (`LH_ERR_INVALID_TTL`),
/// `LH_ERR_UNKNOWN_CONNECTION`.
///
/// # Safety
/// `svc` is NULL or a live handle; `name`/`token` point to `name_len`/`token_len` readable
/// bytes; `out` is valid for writing one `lh_memory_result`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_acquire(
    svc: *mut lh_memory_service,
    connection: u64,
    now: u64,
    name: *const u8,
    name_len: usize,
    token: *const u8,
    token_len: usize,
    ttl_ms: u64,
    out: *mut lh_memory_result,
) -> lh_status {
    // SAFETY: forwarded contract.
    unsafe {
        request(
            svc,
            Request::Acquire,
            connection,
            now,
            name,
            name_len,
            token,
            token_len,
            ttl_ms,
            out,
        )
    }
}

/// Extends `token`'s unexpired grant of `name` to `ttl_ms` from now. `*out` receives
/// RENEWED, REJECTED or DROPPED, with `engine_outcome` an `LH_RENEW_*` value. Errors as for
/// `lh_memory_service_acquire`.
///
/// # Safety
/// As for `lh_memory_service_acquire`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_renew(
    svc: *mut lh_memory_service,
    connection: u64,
    now: u64,
    name: *const u8,
    name_len: usize,
    token: *const u8,
    token_len: usize,
    ttl_ms: u64,
    out: *mut lh_memory_result,
) -> lh_status {
    // SAFETY: forwarded contract.
    unsafe {
        request(
            svc,
            Request::Renew,
            connection,
            now,
            name,
            name_len,
            token,
            token_len,
            ttl_ms,
            out,
        )
    }
}

/// Deletes `token`'s unexpired grant of `name` and queues a release notification for every
/// connection watching it. `*out` receives RELEASED, NOT_OWNER (expired, or someone else's
/// now: nothing changed) or DROPPED, with `engine_outcome` an `LH_RELEASE_*` value. Errors
/// as for `lh_memory_service_acquire` (no TTL).
///
/// # Safety
/// As for `lh_memory_service_acquire`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_release(
    svc: *mut lh_memory_service,
    connection: u64,
    now: u64,
    name: *const u8,
    name_len: usize,
    token: *const u8,
    token_len: usize,
    out: *mut lh_memory_result,
) -> lh_status {
    // SAFETY: forwarded contract.
    unsafe {
        request(
            svc,
            Request::Release,
            connection,
            now,
            name,
            name_len,
            token,
            token_len,
            1,
            out,
        )
    }
}

/// Fills `*out` with what the service says about `name` at host time `now` (no fault switch
/// applies). Errors: NULL pointers, small `out->struct_size`, bad names.
///
/// # Safety
/// `svc` is NULL or a live handle; `name` points to `name_len` readable bytes; `out` is
/// valid for writing one `lh_memory_status`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_status(
    svc: *mut lh_memory_service,
    now: u64,
    name: *const u8,
    name_len: usize,
    out: *mut lh_memory_status,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_svc(svc, |s| {
            check_sized_out(out, "out")?;
            let name = name_arg(name, name_len)?;
            let st = s.svc.status(now, name)?;
            write_out(out, status_to_c(&st));
            Ok(())
        })
    }
}

/// Starts queueing release notifications of `name` for `connection` (idempotent).
/// Errors: bad names, `LH_ERR_UNKNOWN_CONNECTION`, `LH_ERR_LIMIT_REACHED` at `max_watches`.
///
/// # Safety
/// `svc` is NULL or a live handle; `name` points to `name_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_watch(
    svc: *mut lh_memory_service,
    connection: u64,
    name: *const u8,
    name_len: usize,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_svc(svc, |s| {
            let name = name_arg(name, name_len)?;
            s.svc.watch(connection, name)?;
            Ok(())
        })
    }
}

/// Stops queueing release notifications of `name` for `connection` (idempotent; those
/// already queued stay). Errors: bad names, `LH_ERR_UNKNOWN_CONNECTION`.
///
/// # Safety
/// `svc` is NULL or a live handle; `name` points to `name_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_unwatch(
    svc: *mut lh_memory_service,
    connection: u64,
    name: *const u8,
    name_len: usize,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_svc(svc, |s| {
            let name = name_arg(name, name_len)?;
            s.svc.unwatch(connection, name)?;
            Ok(())
        })
    }
}

/// Takes the oldest release notification queued for `connection`: `*out_name` /
/// `*out_name_len` receive the name (BORROWED, valid until the next call on this handle;
/// feed it to `lh_released`), or NULL / 0 when none is queued.
///
/// # Safety
/// `svc` is NULL or a live handle; `out_name` and `out_name_len` are valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_poll_released(
    svc: *mut lh_memory_service,
    connection: u64,
    out_name: *mut *const u8,
    out_name_len: *mut usize,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_svc(svc, |s| {
            require_out(out_name, "out_name")?;
            require_out(out_name_len, "out_name_len")?;
            match s.svc.poll_released(connection)? {
                Some(name) => {
                    s.out_name = name;
                    write_out(out_name, s.out_name.as_ptr());
                    write_out(out_name_len, s.out_name.len());
                }
                None => {
                    write_out(out_name, std::ptr::null());
                    write_out(out_name_len, 0);
                }
            }
            Ok(())
        })
    }
}

/// Replaces the fault switches of `connection` with `*faults`.
/// Errors: NULL, small `faults->struct_size`, unknown flag bits (`LH_ERR_INVALID_ENUM`),
/// `LH_ERR_UNKNOWN_CONNECTION`.
///
/// # Safety
/// `svc` is NULL or a live handle; `faults` points to a readable `lh_memory_faults`.
#[cfg(feature = "testing")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_set_faults(
    svc: *mut lh_memory_service,
    connection: u64,
    faults: *const lh_memory_faults,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_svc(svc, |s| {
            let f = faults_from_c(&read_sized(faults, "faults")?)?;
            s.svc.set_faults(connection, f)?;
            Ok(())
        })
    }
}

/// Fills `*out` with the fault switches of `connection` now (`drop_next_responses` as it
/// has counted down). Errors: NULL, small `out->struct_size`, `LH_ERR_UNKNOWN_CONNECTION`.
///
/// # Safety
/// `svc` is NULL or a live handle; `out` is valid for writing one `lh_memory_faults`.
#[cfg(feature = "testing")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_get_faults(
    svc: *mut lh_memory_service,
    connection: u64,
    out: *mut lh_memory_faults,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_svc(svc, |s| {
            check_sized_out(out, "out")?;
            write_out(out, faults_to_c(s.svc.faults(connection)?));
            Ok(())
        })
    }
}

/// Steps the service's clock by `delta_ns` (either direction; steps add up). Forward: grants
/// expire early on the service side only; backward: they outlive what their holders believe.
/// The clock is service-wide: every connection sees it.
///
/// # Safety
/// `svc` is NULL or a live handle.
#[cfg(feature = "testing")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_step_clock(
    svc: *mut lh_memory_service,
    delta_ns: i64,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_svc(svc, |s| {
            s.svc.step_clock(delta_ns);
            Ok(())
        })
    }
}

/// Drops the grant of `name` without a notification, as a failover that lost the key would
/// (the holder's next renew is rejected); the name's fence is kept. Errors: bad names.
///
/// # Safety
/// `svc` is NULL or a live handle; `name` points to `name_len` readable bytes.
#[cfg(feature = "testing")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_forget(
    svc: *mut lh_memory_service,
    name: *const u8,
    name_len: usize,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_svc(svc, |s| {
            let name = name_arg(name, name_len)?;
            s.svc.forget(name)?;
            Ok(())
        })
    }
}

/// Fills `*out` with the service's counters. Errors: NULL, small `out->struct_size`.
///
/// # Safety
/// `svc` is NULL or a live handle; `out` is valid for writing one `lh_memory_stats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_stats_get(
    svc: *mut lh_memory_service,
    out: *mut lh_memory_stats,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_svc(svc, |s| {
            check_sized_out(out, "out")?;
            write_out(out, stats_to_c(s.svc.stats()));
            Ok(())
        })
    }
}

/// Test hook: panics inside the panic boundary (the handle is poisoned afterwards).
///
/// # Safety
/// `svc` is NULL or a live handle.
#[cfg(feature = "testing")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_debug_panic(svc: *mut lh_memory_service) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_svc(svc, |_| {
            panic!("lh_memory_service_debug_panic: deliberate panic for tests")
        })
    }
}
