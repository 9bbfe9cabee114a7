//! The `lh_memory_service_*` exports: the in-memory reference lock service
//! (`service::memory`) for every binding's tests and examples.
//!
//! One opaque `lh_memory_service` is one service ("the server"); each client (a handle made
//! with `LH_BACKEND_MEMORY`) talks to it through a connection id with its own fault switches,
//! through the same seam as every backend: the host hands each polled request to
//! `lh_memory_service_call` and the answer back with `lh_io_reply`, and each release
//! notification from `lh_memory_service_poll_released` to `lh_io_message`. Host-level faults
//! (delay, hang) stay in the wrappers: the service never waits.
#![allow(non_camel_case_types)]

use std::ffi::c_char;

use super::boundary::{
    Diag, Failure, check_sized_out, guard_parts, guard_static, name_arg, optional_bytes_arg,
    out_ptr, read_sized, require_out, write_out,
};
use super::types::*;
use super::values::{LH_MAX_REPLY_DATA, lh_bytes, lh_value};
use crate::service::call::CallAnswer;
#[cfg(feature = "testing")]
use crate::service::memory::Faults;
use crate::service::memory::{Limits, MemoryError, MemoryService, Stats, Status};

/// Longest ownership token the memory service accepts, in bytes (the engine's are 32).
pub const LH_MEMORY_MAX_TOKEN_LEN: usize = 64;

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
    /// it is reached, and an acquire of a new name answers FULL (a transport error for the
    /// client) if none is.
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
    /// The last answer of `lh_memory_service_call`; `lh_memory_answer` points into it.
    answer: CallAnswer,
    values: Vec<lh_value>,
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
                answer: CallAnswer::default(),
                values: Vec::new(),
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

/// The answer of `lh_memory_service_call`, in the flat value format `lh_io_reply` takes.
/// The pointers borrow the service handle until the next call on it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lh_memory_answer {
    /// `sizeof(lh_memory_answer)` as compiled by the caller; set to the library's size.
    pub struct_size: u32,
    /// 1 when the request or its answer was lost (fault switches, partition): report the
    /// request to the client with `lh_io_failed` (`LH_FAILURE_TRANSPORT`); the values are
    /// then empty.
    pub dropped: u32,
    /// The answer's values in pre-order.
    pub values: *const lh_value,
    /// Number of values.
    pub nvalues: usize,
    /// The bytes string values point into.
    pub data: *const u8,
    /// Length of `data`.
    pub data_len: usize,
}

/// Runs one request a memory-backend client polled (`LH_IO_COMMAND`: hand over its `argv`
/// unread) for `connection` at host time `now` (monotonic ns; the service's clock is it plus
/// every clock step). `*out` receives the answer to pass to `lh_io_reply`, or `dropped`. A
/// malformed request is an error *answer* for the client to see, never a status here.
///
/// Errors (nothing changed): NULL pointers (an argument may be NULL only when empty), more
/// than 64 arguments or one over `LH_MAX_REPLY_DATA` bytes (`LH_ERR_INVALID_REPLY`),
/// small `out->struct_size`, `LH_ERR_UNKNOWN_CONNECTION`.
///
/// # Safety
/// `svc` is NULL or a live handle; `argv` points to `argc` readable `lh_bytes`, each readable
/// for its length; `out` is valid for reading and writing an `lh_memory_answer`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_memory_service_call(
    svc: *mut lh_memory_service,
    connection: u64,
    now: u64,
    argv: *const lh_bytes,
    argc: u32,
    out: *mut lh_memory_answer,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_svc(svc, |s| {
            check_sized_out(out, "out")?;
            if argv.is_null() {
                return Err(Failure::null("argv"));
            }
            if argc > 64 {
                return Err(Failure::new(
                    LH_ERR_INVALID_REPLY,
                    format!("{argc} arguments, at most 64"),
                ));
            }
            let raw = std::slice::from_raw_parts(argv, argc as usize);
            let mut args = Vec::with_capacity(raw.len());
            for a in raw {
                args.push(optional_bytes_arg(
                    a.ptr,
                    a.len,
                    LH_MAX_REPLY_DATA,
                    "argument",
                    LH_ERR_INVALID_REPLY,
                )?);
            }
            s.answer = s.svc.call(connection, now, &args)?;
            s.values.clear();
            s.values.extend(s.answer.values.iter().map(|v| lh_value {
                kind: v.kind,
                _reserved: 0,
                integer: v.integer,
                offset: v.offset,
                len: v.len,
            }));
            write_out(
                out,
                lh_memory_answer {
                    struct_size: size_of::<lh_memory_answer>() as u32,
                    dropped: u32::from(s.answer.dropped),
                    values: out_ptr(&s.values),
                    nvalues: s.values.len(),
                    data: out_ptr(&s.answer.data),
                    data_len: s.answer.data.len(),
                },
            );
            Ok(())
        })
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

/// Takes the oldest release notification queued for `connection`: `*out_name` /
/// `*out_name_len` receive the name (BORROWED, valid until the next call on this handle;
/// hand it to the client with `lh_io_message` as the channel), or NULL / 0 when none is
/// queued.
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
