//! The `lh_*` exports: one function per core input and getter.
//!
//! Each export checks every pointer and enum argument before it touches the core (so an error
//! leaves the client unchanged and out-params are written only on success), then runs inside
//! the panic boundary of `ffi::boundary`.
#![allow(non_camel_case_types)]

use std::ffi::{CString, c_char};

use super::boundary::{
    Diag, Failure, check_sized_out, guard_mut, guard_ref, guard_static, name_arg, read_sized,
    require_out, write_out,
};
use super::types::*;
use crate::backend::Protocol;
use crate::{
    AcquireFailReason, AcquireOptions, Client, Config, Event, LeaseId, LeaseState, LostReason,
    ReleaseOutcome, Releasing,
};

/// Opaque client handle: one core session plus the memory that borrowed outputs point into.
///
/// Created by `lh_client_new` with one backend attached, destroyed by `lh_client_free`. Not thread-safe: one thread at a
/// time (hosts guard it with a mutex).
pub struct lh_client {
    pub(crate) state: ClientState,
    pub(crate) diag: Diag,
}

impl std::fmt::Debug for lh_client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("lh_client")
            .field("diag", &self.diag)
            .finish_non_exhaustive()
    }
}

/// The mutable part of a handle the exports work on.
pub(crate) struct ClientState {
    pub(crate) core: Client,
    /// The backend protocol attached at creation: one per handle.
    pub(crate) proto: Protocol,
    /// The flat form of the last polled request; `lh_io_request` points into it.
    pub(crate) flat: super::io::Flat,
    /// The text `lh_backend_last_error` points into.
    pub(crate) backend_error: CString,
    /// Holder host or error of the last polled status; `lh_lock_status` points into it.
    pub(crate) status_text: String,
}

const VERSION_C: &std::ffi::CStr = match std::ffi::CStr::from_bytes_with_nul(
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes(),
) {
    Ok(s) => s,
    Err(_) => panic!("crate version contains NUL"),
};

/// Library version as a static NUL-terminated string (equal to `LH_VERSION` of the header the
/// library was built with); lets a host detect a header/library mismatch at run time.
#[unsafe(no_mangle)]
pub extern "C" fn lh_version() -> *const c_char {
    VERSION_C.as_ptr()
}

/// ABI version of the loaded library; wrappers compare it with `LH_ABI_VERSION` (or their own
/// constant, for ctypes) at load time and refuse to run on a mismatch.
#[unsafe(no_mangle)]
pub extern "C" fn lh_abi_version() -> u32 {
    LH_ABI_VERSION
}

/// Static name of a status code ("LH_OK", "LH_ERR_NULL_ARGUMENT", ...), or
/// "LH_UNKNOWN_STATUS" for a value this library does not know. Never NULL; never freed.
#[unsafe(no_mangle)]
pub extern "C" fn lh_status_str(status: u32) -> *const c_char {
    status_name(status).as_ptr()
}

/// Static name of a status code (see `lh_status_str`).
pub fn status_name(status: u32) -> &'static std::ffi::CStr {
    match status {
        LH_OK => c"LH_OK",
        LH_ERR_NULL_ARGUMENT => c"LH_ERR_NULL_ARGUMENT",
        LH_ERR_INVALID_UTF8 => c"LH_ERR_INVALID_UTF8",
        LH_ERR_EMPTY_NAME => c"LH_ERR_EMPTY_NAME",
        LH_ERR_NAME_TOO_LONG => c"LH_ERR_NAME_TOO_LONG",
        LH_ERR_NAME_HAS_NUL => c"LH_ERR_NAME_HAS_NUL",
        LH_ERR_INVALID_TTL => c"LH_ERR_INVALID_TTL",
        LH_ERR_INVALID_CONFIG => c"LH_ERR_INVALID_CONFIG",
        LH_ERR_SEED_TOO_SHORT => c"LH_ERR_SEED_TOO_SHORT",
        LH_ERR_UNKNOWN_LEASE => c"LH_ERR_UNKNOWN_LEASE",
        LH_ERR_LEASE_ENDED => c"LH_ERR_LEASE_ENDED",
        LH_ERR_TOO_MANY_LEASES => c"LH_ERR_TOO_MANY_LEASES",
        LH_ERR_INVALID_ENUM => c"LH_ERR_INVALID_ENUM",
        LH_ERR_BACKEND_DATA_TOO_LONG => c"LH_ERR_BACKEND_DATA_TOO_LONG",
        LH_ERR_BUFFER_TOO_SMALL => c"LH_ERR_BUFFER_TOO_SMALL",
        LH_ERR_NOT_GRANTED => c"LH_ERR_NOT_GRANTED",
        LH_ERR_STRUCT_SIZE => c"LH_ERR_STRUCT_SIZE",
        LH_ERR_INVALID_REPLY => c"LH_ERR_INVALID_REPLY",
        LH_ERR_NO_BACKEND => c"LH_ERR_NO_BACKEND",
        LH_ERR_INVALID_TOKEN => c"LH_ERR_INVALID_TOKEN",
        LH_ERR_UNKNOWN_CONNECTION => c"LH_ERR_UNKNOWN_CONNECTION",
        LH_ERR_LIMIT_REACHED => c"LH_ERR_LIMIT_REACHED",
        LH_ERR_PANIC => c"LH_ERR_PANIC",
        LH_ERR_WRONG_ANSWER => c"LH_ERR_WRONG_ANSWER",
        LH_ERR_POISONED => c"LH_ERR_POISONED",
        _ => c"LH_UNKNOWN_STATUS",
    }
}

/// Converts a core configuration into its C mirror.
fn config_to_c(c: &Config) -> lh_config {
    lh_config {
        struct_size: size_of::<lh_config>() as u32,
        drift_ppm: c.drift_ppm,
        drift_fixed_ns: c.drift_fixed_ns,
        renew_jitter_ppm: c.renew_jitter_ppm,
        fail_budget: c.fail_budget,
        request_timeout_ns: c.request_timeout_ns,
        backoff_base_ns: c.backoff_base_ns,
        backoff_cap_ns: c.backoff_cap_ns,
        max_ttl_ms: c.max_ttl_ms,
        max_leases: c.max_leases,
        notifications: u32::from(c.notifications),
    }
}

pub(crate) fn config_from_c(c: &lh_config) -> Result<Config, Failure> {
    let notifications = match c.notifications {
        0 => false,
        1 => true,
        n => {
            return Err(Failure::new(
                LH_ERR_INVALID_CONFIG,
                format!("notifications must be 0 or 1, got {n}"),
            ));
        }
    };
    Ok(Config {
        drift_ppm: c.drift_ppm,
        drift_fixed_ns: c.drift_fixed_ns,
        renew_jitter_ppm: c.renew_jitter_ppm,
        request_timeout_ns: c.request_timeout_ns,
        fail_budget: c.fail_budget,
        backoff_base_ns: c.backoff_base_ns,
        backoff_cap_ns: c.backoff_cap_ns,
        max_ttl_ms: c.max_ttl_ms,
        max_leases: c.max_leases,
        notifications,
    })
}

/// Fills `*out` with the default configuration (and `struct_size = sizeof(lh_config)`), so a
/// host only sets the fields it cares about. NULL is ignored.
///
/// # Safety
/// `out` is NULL or valid for writing one `lh_config`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_config_default(out: *mut lh_config) {
    if out.is_null() {
        return;
    }
    let _ = guard_static(|| {
        // SAFETY: non-NULL; valid per the caller's contract.
        unsafe { write_out(out, config_to_c(&Config::default())) };
        Ok(())
    });
}

/// Fills `*out` with default acquire options: no flags, `ttl_ms = LH_DEFAULT_TTL_MS`,
/// `wait_ns = 0` (one attempt). NULL is ignored.
///
/// # Safety
/// `out` is NULL or valid for writing one `lh_acquire_options`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_acquire_options_default(out: *mut lh_acquire_options) {
    if out.is_null() {
        return;
    }
    let value = lh_acquire_options {
        struct_size: size_of::<lh_acquire_options>() as u32,
        flags: 0,
        ttl_ms: LH_DEFAULT_TTL_MS,
        wait_ns: 0,
    };
    // SAFETY: non-NULL; valid per the caller's contract.
    unsafe { write_out(out, value) };
}

pub(crate) unsafe fn seed_arg<'a>(seed: *const u8, seed_len: usize) -> Result<&'a [u8], Failure> {
    // SAFETY: forwarded contract.
    unsafe {
        super::boundary::bytes_arg(
            seed,
            seed_len,
            LH_MAX_SEED_LEN,
            "seed",
            LH_ERR_INVALID_CONFIG,
        )
    }
}

/// Destroys a client and everything it owns (borrowed output pointers become invalid).
/// NULL is a no-op. Freeing a handle twice is undefined behaviour, as with `free()`.
///
/// # Safety
/// `c` is NULL or a handle from `lh_client_new` that is not used again afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_client_free(c: *mut lh_client) {
    if c.is_null() {
        return;
    }
    // SAFETY: a live handle from Box::into_raw, given up by the caller.
    let handle = unsafe { Box::from_raw(c) };
    // Dropping cannot reasonably panic; if it did, unwinding must still not cross the ABI.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(handle)));
}

/// NUL-terminated detail of the last error reported on this handle, "" if none yet. Never
/// NULL ("" for a NULL handle). Valid until the next call on this handle; copy it to keep it.
///
/// # Safety
/// `c` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_client_last_error(c: *const lh_client) -> *const c_char {
    // SAFETY: per the caller's contract.
    match unsafe { c.as_ref() } {
        Some(h) => h.diag.message_ptr(),
        None => c"".as_ptr(),
    }
}

/// Mixes a fresh seed into the client's random generator. Call it in a forked child before
/// using an inherited handle, so parent and child never generate the same ownership tokens.
///
/// # Safety
/// `c` is NULL or a live handle; `seed` points to `seed_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_client_reseed(
    c: *mut lh_client,
    seed: *const u8,
    seed_len: usize,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            let seed = seed_arg(seed, seed_len)?;
            s.core.reseed(seed)?;
            let redis = match &mut s.proto {
                Protocol::Redis(p) => Some(&mut **p),
                Protocol::RedisStream(p) => Some(p.protocol_mut()),
                _ => None,
            };
            if let Some(p) = redis {
                let random = super::backend::wake_random(seed)?;
                let now = s.core.now();
                p.set_wake_random(now, random);
            }
            Ok(())
        })
    }
}

/// Starts acquiring `name` (UTF-8, `name_len` bytes, no NUL needed or allowed). On success
/// `*out_lease` receives the new lease id (or, for a reentrant acquire of a name already
/// leased here, the existing id) and outputs are ready to poll.
///
/// Errors: NULL pointers, small `opts->struct_size`, unknown `opts->flags` bits
/// (`LH_ERR_INVALID_ENUM`), bad names (`LH_ERR_INVALID_UTF8`, `EMPTY_NAME`, `NAME_TOO_LONG`,
/// `NAME_HAS_NUL`), bad TTL (`LH_ERR_INVALID_TTL`), `LH_ERR_TOO_MANY_LEASES`.
///
/// # Safety
/// `c` is NULL or a live handle; `name` points to `name_len` readable bytes; `opts` to a
/// readable `lh_acquire_options`; `out_lease` is valid for writing a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_acquire(
    c: *mut lh_client,
    now: u64,
    name: *const u8,
    name_len: usize,
    opts: *const lh_acquire_options,
    out_lease: *mut u64,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            require_out(out_lease, "out_lease")?;
            let opts = read_sized(opts, "opts")?;
            if opts.flags & !(LH_ACQUIRE_REENTRANT | LH_ACQUIRE_NO_AUTO_RENEW) != 0 {
                return Err(Failure::invalid_enum(
                    "lh_acquire_options.flags",
                    opts.flags,
                ));
            }
            let name = name_arg(name, name_len)?;
            let options = AcquireOptions {
                ttl_ms: opts.ttl_ms,
                wait_ns: opts.wait_ns,
                reentrant: opts.flags & LH_ACQUIRE_REENTRANT != 0,
                auto_renew: opts.flags & LH_ACQUIRE_NO_AUTO_RENEW == 0,
            };
            let lease = s.core.acquire(now, name, options)?;
            write_out(out_lease, lease.0);
            Ok(())
        })
    }
}

/// Releases a lease (idempotence is the wrapper's business: a second release returns
/// `LH_ERR_LEASE_ENDED`, its terminal event was delivered earlier). When `out_releasing` is
/// not NULL it receives an `LH_RELEASING_*` value saying what happened:
/// - `LH_RELEASING_PENDING`: the lease ended RELEASED (event queued) and a RELEASE is queued;
///   when the service answers (or the grant's TTL has certainly run out without an answer)
///   an `LH_EVENT_RELEASE_OUTCOME` event tells `LH_REASON_RELEASE_CONFIRMED`,
///   `LH_REASON_RELEASE_NOT_OWNER` or `LH_REASON_RELEASE_UNCONFIRMED`;
/// - `LH_RELEASING_LOST`: the lease's validity had run out before this call (a paused
///   process): it ended LOST, not RELEASED, and the LOST event with its reason is queued;
/// - `LH_RELEASING_HOLDER_LEFT`: other reentrant holders remain, nothing was sent;
/// - `LH_RELEASING_NOT_ACQUIRED`: the lease was still acquiring and ended ACQUIRE_FAILED.
///
/// With `out_releasing` NULL no RELEASE_OUTCOME event is produced.
///
/// # Safety
/// `c` is NULL or a live handle; `out_releasing` is NULL or valid for writing a `uint32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_release(
    c: *mut lh_client,
    now: u64,
    lease: u64,
    out_releasing: *mut u32,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            if out_releasing.is_null() {
                s.core.release(now, LeaseId(lease))?;
                return Ok(());
            }
            let code = match s.core.release_reported(now, LeaseId(lease))? {
                Releasing::HolderLeft => LH_RELEASING_HOLDER_LEFT,
                Releasing::Pending => LH_RELEASING_PENDING,
                Releasing::Lost => LH_RELEASING_LOST,
                Releasing::NotAcquired => LH_RELEASING_NOT_ACQUIRED,
            };
            write_out(out_releasing, code);
            Ok(())
        })
    }
}

/// Renews a held lease now (the manual escape hatch; works with or without automatic
/// renewal): a RENEW command is queued, unless one is in flight, which this call then joins.
/// Validity counts from that renewal's send time. The answer arrives as an
/// `LH_EVENT_RENEWED` event (lease_id, new valid_until_ns) or as the lease's LOST event; a
/// renewal failing in transport is retried within the failure budget like any other. If
/// the lease's validity had already run out, it ends LOST in this call (event queued) and
/// nothing is sent.
///
/// Errors (nothing sent, nothing changed): `LH_ERR_LEASE_ENDED` for a released, lost or
/// failed lease (terminal states are sticky), `LH_ERR_NOT_GRANTED` for a lease still
/// acquiring, `LH_ERR_UNKNOWN_LEASE`.
///
/// # Safety
/// `c` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_renew(c: *mut lh_client, now: u64, lease: u64) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            s.core.renew(now, LeaseId(lease))?;
            Ok(())
        })
    }
}

/// Tells the core that time has passed (call it when the deadline from `lh_poll_timeout`
/// arrives; early or spurious calls are harmless).
///
/// # Safety
/// `c` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_timeout(c: *mut lh_client, now: u64) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            s.proto.handle_timeout(&mut s.core, now);
            Ok(())
        })
    }
}

// The core's values are the ABI's, so hosts and the fuzz targets may convert with `as u32`.
const _: () = {
    assert!(Releasing::HolderLeft as u32 == LH_RELEASING_HOLDER_LEFT);
    assert!(Releasing::Pending as u32 == LH_RELEASING_PENDING);
    assert!(Releasing::Lost as u32 == LH_RELEASING_LOST);
    assert!(Releasing::NotAcquired as u32 == LH_RELEASING_NOT_ACQUIRED);
    assert!(ReleaseOutcome::Confirmed as u32 == LH_REASON_RELEASE_CONFIRMED);
    assert!(ReleaseOutcome::NotOwner as u32 == LH_REASON_RELEASE_NOT_OWNER);
    assert!(ReleaseOutcome::Unconfirmed as u32 == LH_REASON_RELEASE_UNCONFIRMED);
};

fn lost_reason(r: LostReason) -> u32 {
    match r {
        LostReason::Rejected => LH_REASON_REJECTED,
        LostReason::Expired => LH_REASON_EXPIRED,
        LostReason::FailBudget => LH_REASON_FAIL_BUDGET,
    }
}

fn fail_reason(r: AcquireFailReason) -> u32 {
    match r {
        AcquireFailReason::WaitExhausted => LH_REASON_WAIT_EXHAUSTED,
        AcquireFailReason::Cancelled => LH_REASON_CANCELLED,
        AcquireFailReason::Unavailable => LH_REASON_UNAVAILABLE,
    }
}

fn state_code(s: LeaseState) -> u32 {
    match s {
        LeaseState::Acquiring => LH_STATE_ACQUIRING,
        LeaseState::Held => LH_STATE_HELD,
        LeaseState::Released => LH_STATE_RELEASED,
        LeaseState::Lost => LH_STATE_LOST,
        LeaseState::AcquireFailed => LH_STATE_ACQUIRE_FAILED,
    }
}

impl ClientState {
    pub(crate) fn new(core: Client, proto: Protocol) -> Self {
        ClientState {
            core,
            proto,
            flat: super::io::Flat::default(),
            backend_error: CString::default(),
            status_text: String::new(),
        }
    }
}

pub(crate) fn event_to_c(ev: Option<Event>) -> lh_event {
    let mut o = lh_event::default();
    let Some(ev) = ev else {
        return o;
    };
    match ev {
        Event::Acquired {
            lease,
            fencing_token,
            valid_until,
        } => {
            o.kind = LH_EVENT_ACQUIRED;
            o.lease_id = lease.0;
            o.fencing_token = fencing_token;
            o.valid_until_ns = valid_until;
        }
        Event::AcquireFailed { lease, reason } => {
            o.kind = LH_EVENT_ACQUIRE_FAILED;
            o.lease_id = lease.0;
            o.reason = fail_reason(reason);
        }
        Event::Lost { lease, reason } => {
            o.kind = LH_EVENT_LOST;
            o.lease_id = lease.0;
            o.reason = lost_reason(reason);
        }
        Event::Released { lease } => {
            o.kind = LH_EVENT_RELEASED;
            o.lease_id = lease.0;
        }
        Event::Renewed { lease, valid_until } => {
            o.kind = LH_EVENT_RENEWED;
            o.lease_id = lease.0;
            o.valid_until_ns = valid_until;
        }
        Event::ReleaseOutcome { lease, outcome } => {
            o.kind = LH_EVENT_RELEASE_OUTCOME;
            o.lease_id = lease.0;
            o.reason = outcome as u32;
        }
    }
    o
}

/// Takes the next event for the application into `*out` (`out->kind == LH_EVENT_NONE` when
/// nothing is left; drain until then after every input).
///
/// # Safety
/// `c` is NULL or a live handle; `out` is valid for writing one `lh_event`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_poll_event(c: *mut lh_client, out: *mut lh_event) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            require_out(out, "out")?;
            let ev = s.proto.poll_event(&mut s.core);
            write_out(out, event_to_c(ev));
            Ok(())
        })
    }
}

/// Writes the monotonic ns at which `lh_timeout` must be called at the latest, or
/// `LH_NO_DEADLINE` if the core has nothing scheduled.
///
/// # Safety
/// `c` is NULL or a live handle; `out_deadline_ns` is valid for writing a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_poll_timeout(
    c: *mut lh_client,
    out_deadline_ns: *mut u64,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            require_out(out_deadline_ns, "out_deadline_ns")?;
            let deadline = s.proto.poll_timeout(&mut s.core).unwrap_or(LH_NO_DEADLINE);
            write_out(out_deadline_ns, deadline);
            Ok(())
        })
    }
}

/// Writes the lease's `LH_STATE_*`.
///
/// # Safety
/// `c` is NULL or a live handle; `out_state` is valid for writing a `uint32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_lease_state(
    c: *const lh_client,
    lease: u64,
    out_state: *mut u32,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_ref(c, |s| {
            require_out(out_state, "out_state")?;
            let state = s.core.lease_state(LeaseId(lease))?;
            write_out(out_state, state_code(state));
            Ok(())
        })
    }
}

/// Fills `*out` with a snapshot of the lease (`out->struct_size` must be set by the caller;
/// on return it holds the library's size).
///
/// # Safety
/// `c` is NULL or a live handle; `out` is valid for reading and writing an `lh_lease_info`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_lease_info_get(
    c: *const lh_client,
    lease: u64,
    out: *mut lh_lease_info,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_ref(c, |s| {
            check_sized_out(out, "out")?;
            let info = s.core.lease_info(LeaseId(lease))?;
            write_out(
                out,
                lh_lease_info {
                    struct_size: size_of::<lh_lease_info>() as u32,
                    state: state_code(info.state),
                    holders: info.holders,
                    has_token: u32::from(info.fencing_token.is_some()),
                    fencing_token: info.fencing_token.unwrap_or(0),
                    valid_until_ns: info.valid_until.unwrap_or(0),
                },
            );
            Ok(())
        })
    }
}

/// Writes the fencing token of the lease's grant; `LH_ERR_NOT_GRANTED` if it was never
/// granted. Pass it with every protected write: it, not `lh_is_held`, is the authority.
///
/// # Safety
/// `c` is NULL or a live handle; `out` is valid for writing a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_fencing_token(
    c: *const lh_client,
    lease: u64,
    out: *mut u64,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_ref(c, |s| {
            require_out(out, "out")?;
            match s.core.fencing_token(LeaseId(lease))? {
                Some(t) => {
                    write_out(out, t);
                    Ok(())
                }
                None => Err(Failure::new(
                    LH_ERR_NOT_GRANTED,
                    format!("lease {lease} has no fencing token (never granted)"),
                )),
            }
        })
    }
}

/// Writes the monotonic ns until which the lease is believed valid; `LH_ERR_NOT_GRANTED` if
/// it was never granted.
///
/// # Safety
/// `c` is NULL or a live handle; `out_ns` is valid for writing a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_valid_until(
    c: *const lh_client,
    lease: u64,
    out_ns: *mut u64,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_ref(c, |s| {
            require_out(out_ns, "out_ns")?;
            match s.core.valid_until(LeaseId(lease))? {
                Some(t) => {
                    write_out(out_ns, t);
                    Ok(())
                }
                None => Err(Failure::new(
                    LH_ERR_NOT_GRANTED,
                    format!("lease {lease} has no validity window (never granted)"),
                )),
            }
        })
    }
}

/// Writes whether the lease is held and still valid at `now`. Advice for stopping work early;
/// the fencing token checked by the resource is the only authority.
///
/// # Safety
/// `c` is NULL or a live handle; `out_held` is valid for writing a `bool`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_is_held(
    c: *const lh_client,
    lease: u64,
    now: u64,
    out_held: *mut bool,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_ref(c, |s| {
            require_out(out_held, "out_held")?;
            let held = s.core.is_held(LeaseId(lease), now)?;
            write_out(out_held, held);
            Ok(())
        })
    }
}

/// Test hook: panics inside the panic boundary, so hosts can check that they handle
/// `LH_ERR_PANIC` and that the handle reports `LH_ERR_POISONED` afterwards.
///
/// # Safety
/// `c` is NULL or a live handle.
#[cfg(feature = "testing")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_client_debug_panic(c: *mut lh_client) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |_| {
            panic!("lh_client_debug_panic: deliberate panic for tests")
        })
    }
}
