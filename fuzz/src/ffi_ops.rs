//! `ffi`: host operations through the `lh_*` C functions (called from Rust through
//! `leasehold::ffi`), with arbitrary byte strings (invalid UTF-8, embedded NULs, oversized
//! lengths), unknown enum values, odd `struct_size`s and NULL pointers.
//!
//! Oracle: nothing crashes; every status is a documented code of that function (never
//! `LH_ERR_PANIC`/`LH_ERR_POISONED`); out-params are untouched on error; and the handle is a
//! faithful translation of the core: a shadow `leasehold::Client` with the same config and
//! seed gets the same (valid) inputs, and every status, getter and polled output must match it
//! field for field. Inputs refused at the C boundary must leave the handle unchanged (the
//! shadow is not called, so any state change shows up as a divergence).

use std::ffi::CStr;
use std::ptr;

use arbitrary::Arbitrary;
use leasehold::ffi::*;
use leasehold::{
    AcquireFailReason, AcquireOptions, AcquireResult, Client, Command, Config, Error, Event,
    LeaseId, LeaseState, LostReason, MAX_BACKEND_DATA_LEN, MAX_NAME_LEN, MIN_SEED_LEN, Output,
    ReleaseResult, RenewResult, RequestId,
};

use crate::{Seq, SmallBytes};

const NAMES: [&str; 3] = ["a", "b", "lock/c"];
const TIME_CAP: u64 = 1 << 62;

#[derive(Arbitrary, Debug, Clone)]
pub struct Input {
    pub config: CConfig,
    pub seed: BufChoice,
    pub ops: Seq<FOp>,
}

#[derive(Arbitrary, Debug, Clone)]
pub enum CConfig {
    Default,
    Fields {
        drift_ppm: u32,
        drift_fixed_ns: u32,
        renew_jitter_ppm: u32,
        fail_budget: u8,
        request_timeout_ms: u16,
        backoff_base_ns: u32,
        backoff_cap_ns: u32,
        max_ttl_ms: u32,
        max_leases: u8,
        notifications: u32,
        struct_size: SizeChoice,
    },
    Null,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum SizeChoice {
    Exact,
    Smaller(u8),
    Larger(u8),
}

/// A byte buffer argument: pointer and length as a C caller might pass them.
#[derive(Arbitrary, Debug, Clone)]
pub enum BufChoice {
    Pool(u8),
    Bytes(SmallBytes),
    /// `n` bytes of one value (around the 512/1024 limits).
    Repeat(u16, u8),
    /// NULL with a length.
    Null(u16),
    /// A short buffer with a length far beyond every limit (the library must refuse the
    /// length before reading).
    Oversized(SmallBytes, u16),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Time {
    Same,
    Fwd(u32),
    FwdSecs(u16),
    Back(u32),
    Raw(u64),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Lease {
    Issued(u8),
    Raw(u64),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Req {
    /// The n-th request id seen in a polled command.
    Seen(u8),
    Raw(u64),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Enum {
    Known(u8),
    Raw(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Nulls {
    None,
    Handle,
    Out,
}

#[derive(Arbitrary, Debug, Clone)]
pub enum FOp {
    Acquire {
        time: Time,
        name: BufChoice,
        ttl_ms: u32,
        wait_ns: u64,
        flags: Enum,
        struct_size: SizeChoice,
        null_opts: bool,
        nulls: Nulls,
    },
    Release {
        time: Time,
        lease: Lease,
        null_handle: bool,
    },
    AcquireResult {
        time: Time,
        req: Req,
        outcome: Enum,
        fencing_token: u64,
        ttl_ms: u32,
        retry_after_ms: u64,
        data: BufChoice,
    },
    RenewResult {
        time: Time,
        req: Req,
        outcome: Enum,
    },
    ReleaseResult {
        time: Time,
        req: Req,
        outcome: Enum,
    },
    Released {
        time: Time,
        name: BufChoice,
    },
    Timeout {
        time: Time,
    },
    /// Fire the deadline from `lh_poll_timeout` (a host loop step).
    Fire,
    /// `lh_renew` (manual renewal).
    Renew {
        time: Time,
        lease: Lease,
        null_handle: bool,
    },
    /// `lh_release_reported`.
    ReleaseReported {
        time: Time,
        lease: Lease,
        nulls: Nulls,
    },
    Getters {
        lease: Lease,
        time: Time,
        nulls: Nulls,
        struct_size: SizeChoice,
    },
    Reseed {
        seed: BufChoice,
        null_handle: bool,
    },
    StatusStr(u32),
    /// Ops of exports that were removed (`lh_redis_key`, `lh_redis_script`): decoded and
    /// skipped, so that committed inputs keep their meaning.
    RetiredKey {
        kind: Enum,
        name: BufChoice,
        buf_len: u16,
        null_buf: bool,
        null_out: bool,
    },
    RetiredScript {
        kind: Enum,
        null_out: bool,
    },
    /// Poll with a NULL out pointer / NULL handle.
    PollNull,
    /// Answer every unanswered command the way a healthy service would.
    Serve {
        time: Time,
    },
}

/// An owned argument buffer; `ptr()`/`len()` are what the C caller passes.
struct Arg {
    data: Vec<u8>,
    null: bool,
    len: usize,
}

impl Arg {
    fn ptr(&self) -> *const u8 {
        if self.null {
            ptr::null()
        } else {
            self.data.as_ptr()
        }
    }

    /// The bytes the library may read, when pointer and length are valid.
    fn bytes(&self) -> Option<&[u8]> {
        (!self.null && self.len <= self.data.len()).then(|| &self.data[..self.len])
    }
}

fn arg_of(c: &BufChoice) -> Arg {
    match c {
        BufChoice::Pool(i) => {
            let d = NAMES[usize::from(*i) % NAMES.len()].as_bytes().to_vec();
            let len = d.len();
            Arg {
                data: d,
                null: false,
                len,
            }
        }
        BufChoice::Bytes(b) => Arg {
            data: b.0.clone(),
            null: false,
            len: b.0.len(),
        },
        BufChoice::Repeat(n, v) => {
            let n = usize::from(*n) % (2 * MAX_BACKEND_DATA_LEN + 8);
            Arg {
                data: vec![*v; n],
                null: false,
                len: n,
            }
        }
        BufChoice::Null(n) => Arg {
            data: Vec::new(),
            null: true,
            len: usize::from(*n) % 3,
        },
        BufChoice::Oversized(b, k) => Arg {
            data: b.0.clone(),
            null: false,
            len: [usize::MAX, isize::MAX as usize, 4096, 1 << 20][usize::from(*k) % 4],
        },
    }
}

fn enum_of(e: Enum, known: u32) -> u32 {
    match e {
        Enum::Known(i) => u32::from(i) % known + 1,
        Enum::Raw(v) => v,
    }
}

fn status_of(e: &Error) -> u32 {
    match e {
        Error::EmptyName => LH_ERR_EMPTY_NAME,
        Error::NameTooLong { .. } => LH_ERR_NAME_TOO_LONG,
        Error::NameHasNul => LH_ERR_NAME_HAS_NUL,
        Error::InvalidTtl { .. } => LH_ERR_INVALID_TTL,
        Error::InvalidConfig(_) => LH_ERR_INVALID_CONFIG,
        Error::SeedTooShort { .. } => LH_ERR_SEED_TOO_SHORT,
        Error::UnknownLease(_) => LH_ERR_UNKNOWN_LEASE,
        Error::LeaseEnded(_) => LH_ERR_LEASE_ENDED,
        Error::NotGranted(_) => LH_ERR_NOT_GRANTED,
        Error::TooManyLeases => LH_ERR_TOO_MANY_LEASES,
        Error::BackendDataTooLong { .. } => LH_ERR_BACKEND_DATA_TOO_LONG,
    }
}

fn state_of(s: LeaseState) -> u32 {
    match s {
        LeaseState::Acquiring => LH_STATE_ACQUIRING,
        LeaseState::Held => LH_STATE_HELD,
        LeaseState::Released => LH_STATE_RELEASED,
        LeaseState::Lost => LH_STATE_LOST,
        LeaseState::AcquireFailed => LH_STATE_ACQUIRE_FAILED,
    }
}

fn expect_status(what: &str, got: u32, allowed: &[u32]) {
    assert!(
        got != LH_ERR_PANIC && got != LH_ERR_POISONED,
        "ffi: {what} returned {got} ({:?}): a panic inside the core",
        unsafe { CStr::from_ptr(lh_status_str(got)) }
    );
    assert!(
        allowed.contains(&got),
        "ffi: {what} returned status {got} ({:?}), allowed {allowed:?}",
        unsafe { CStr::from_ptr(lh_status_str(got)) }
    );
}

/// One polled output in comparable form.
#[derive(Debug, PartialEq, Eq)]
struct Flat {
    kind: u32,
    reason: u32,
    request_id: u64,
    lease_id: u64,
    name: Vec<u8>,
    token: Vec<u8>,
    backend_data: Vec<u8>,
    ttl_ms: u64,
    fencing_token: u64,
    valid_until_ns: u64,
}

fn flat_of(o: Option<Output>) -> Flat {
    let mut f = Flat {
        kind: LH_OUTPUT_NONE,
        reason: LH_REASON_NONE,
        request_id: 0,
        lease_id: 0,
        name: Vec::new(),
        token: Vec::new(),
        backend_data: Vec::new(),
        ttl_ms: 0,
        fencing_token: 0,
        valid_until_ns: 0,
    };
    let Some(o) = o else {
        return f;
    };
    match o {
        Output::Command(c) => match c {
            Command::Acquire {
                request,
                lease,
                name,
                token,
                ttl_ms,
            } => {
                f.kind = LH_OUTPUT_ACQUIRE;
                f.request_id = request.0;
                f.lease_id = lease.0;
                f.name = name.as_bytes().to_vec();
                f.token = token.to_hex().to_vec();
                f.ttl_ms = ttl_ms;
            }
            Command::Renew {
                request,
                lease,
                name,
                token,
                ttl_ms,
                backend_data,
            } => {
                f.kind = LH_OUTPUT_RENEW;
                f.request_id = request.0;
                f.lease_id = lease.0;
                f.name = name.as_bytes().to_vec();
                f.token = token.to_hex().to_vec();
                f.ttl_ms = ttl_ms;
                f.backend_data = backend_data.map(|d| d.to_vec()).unwrap_or_default();
            }
            Command::Release {
                request,
                lease,
                name,
                token,
                backend_data,
            } => {
                f.kind = LH_OUTPUT_RELEASE;
                f.request_id = request.0;
                f.lease_id = lease.0;
                f.name = name.as_bytes().to_vec();
                f.token = token.to_hex().to_vec();
                f.backend_data = backend_data.map(|d| d.to_vec()).unwrap_or_default();
            }
            Command::Watch { name } => {
                f.kind = LH_OUTPUT_WATCH;
                f.name = name.as_bytes().to_vec();
            }
            Command::Unwatch { name } => {
                f.kind = LH_OUTPUT_UNWATCH;
                f.name = name.as_bytes().to_vec();
            }
        },
        Output::Event(e) => match e {
            Event::Acquired {
                lease,
                fencing_token,
                valid_until,
            } => {
                f.kind = LH_OUTPUT_ACQUIRED;
                f.lease_id = lease.0;
                f.fencing_token = fencing_token;
                f.valid_until_ns = valid_until;
            }
            Event::AcquireFailed { lease, reason } => {
                f.kind = LH_OUTPUT_ACQUIRE_FAILED;
                f.lease_id = lease.0;
                f.reason = match reason {
                    AcquireFailReason::WaitExhausted => LH_REASON_WAIT_EXHAUSTED,
                    AcquireFailReason::Cancelled => LH_REASON_CANCELLED,
                    AcquireFailReason::Unavailable => LH_REASON_UNAVAILABLE,
                };
            }
            Event::Lost { lease, reason } => {
                f.kind = LH_OUTPUT_LOST;
                f.lease_id = lease.0;
                f.reason = match reason {
                    LostReason::Rejected => LH_REASON_REJECTED,
                    LostReason::Expired => LH_REASON_EXPIRED,
                    LostReason::FailBudget => LH_REASON_FAIL_BUDGET,
                };
            }
            Event::Released { lease } => {
                f.kind = LH_OUTPUT_RELEASED;
                f.lease_id = lease.0;
            }
            Event::Renewed { lease, valid_until } => {
                f.kind = LH_OUTPUT_RENEWED;
                f.lease_id = lease.0;
                f.valid_until_ns = valid_until;
            }
            Event::ReleaseOutcome { lease, outcome } => {
                f.kind = LH_OUTPUT_RELEASE_OUTCOME;
                f.lease_id = lease.0;
                f.reason = outcome as u32;
            }
        },
    }
    f
}

/// Copies the borrowed bytes of a polled `lh_output` (checking pointer/length coherence).
fn flat_of_c(o: &lh_output) -> Flat {
    fn take(p: *const u8, len: usize, what: &str) -> Vec<u8> {
        if len == 0 {
            return Vec::new();
        }
        assert!(!p.is_null(), "ffi: lh_output.{what} NULL with length {len}");
        // SAFETY: the library promises `len` readable bytes until the next call on the handle.
        unsafe { std::slice::from_raw_parts(p, len) }.to_vec()
    }
    Flat {
        kind: o.kind,
        reason: o.reason,
        request_id: o.request_id,
        lease_id: o.lease_id,
        name: take(o.name, o.name_len, "name"),
        token: take(o.token, o.token_len, "token"),
        backend_data: take(o.backend_data, o.backend_data_len, "backend_data"),
        ttl_ms: o.ttl_ms,
        fencing_token: o.fencing_token,
        valid_until_ns: o.valid_until_ns,
    }
}

struct Handle {
    h: *mut lh_client,
    shadow: Client,
    now: u64,
    leases: Vec<u64>,
    requests: Vec<u64>,
    /// Unanswered commands (request id, output kind) for `FOp::Serve`.
    open: Vec<(u64, u32)>,
    fence: u64,
    features: u64,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle came from lh_client_new and is not used again.
        unsafe { lh_client_free(self.h) };
    }
}

fn sized_buf<T: Copy>(value: T, size: SizeChoice) -> (Vec<u64>, u32) {
    let base = std::mem::size_of::<T>();
    let size = match size {
        SizeChoice::Exact => base,
        SizeChoice::Smaller(n) => base.saturating_sub(usize::from(n) % base + 1),
        SizeChoice::Larger(n) => base + usize::from(n),
    };
    let words = size.max(base).div_ceil(8);
    let mut buf = vec![0u64; words];
    // SAFETY: the buffer holds at least size_of::<T>() bytes and is 8-byte aligned.
    unsafe { ptr::write(buf.as_mut_ptr().cast::<T>(), value) };
    (buf, size as u32)
}

/// Runs one input; panics on a crash-worthy divergence. Returns behaviours reached.
pub fn run(input: &Input) -> u64 {
    // Version functions and the status table.
    // SAFETY: static NUL-terminated strings.
    unsafe {
        assert_eq!(
            CStr::from_ptr(lh_version()).to_bytes(),
            LH_VERSION.as_bytes()
        );
    }
    assert_eq!(lh_abi_version(), LH_ABI_VERSION);

    let Some(mut h) = create(input) else {
        return 0;
    };
    for op in input.ops.0.iter().take(crate::MAX_SEQ) {
        h.apply(op);
        h.compare_drain();
    }
    h.features
}

fn create(input: &Input) -> Option<Handle> {
    let mut default = std::mem::MaybeUninit::<lh_config>::uninit();
    // SAFETY: writes one lh_config.
    unsafe { lh_config_default(default.as_mut_ptr()) };
    // SAFETY: initialized by lh_config_default.
    let default = unsafe { default.assume_init() };
    // SAFETY: NULL is documented as ignored.
    unsafe { lh_config_default(ptr::null_mut()) };
    assert_eq!(
        default.struct_size as usize,
        std::mem::size_of::<lh_config>()
    );

    let (cfg_c, size, null_cfg) = match &input.config {
        CConfig::Default => (default, SizeChoice::Exact, false),
        CConfig::Null => (default, SizeChoice::Exact, true),
        CConfig::Fields {
            drift_ppm,
            drift_fixed_ns,
            renew_jitter_ppm,
            fail_budget,
            request_timeout_ms,
            backoff_base_ns,
            backoff_cap_ns,
            max_ttl_ms,
            max_leases,
            notifications,
            struct_size,
        } => (
            lh_config {
                struct_size: 0,
                drift_ppm: *drift_ppm,
                drift_fixed_ns: u64::from(*drift_fixed_ns),
                renew_jitter_ppm: *renew_jitter_ppm,
                fail_budget: u32::from(*fail_budget),
                request_timeout_ns: u64::from(*request_timeout_ms) * 1_000_000,
                backoff_base_ns: u64::from(*backoff_base_ns),
                backoff_cap_ns: u64::from(*backoff_cap_ns),
                max_ttl_ms: u64::from(*max_ttl_ms),
                max_leases: u32::from(*max_leases),
                notifications: *notifications % 3,
            },
            *struct_size,
            false,
        ),
    };
    let (mut buf, sz) = sized_buf(cfg_c, size);
    // SAFETY: struct_size is the first u32 of the buffer.
    unsafe { *buf.as_mut_ptr().cast::<u32>() = sz };
    let seed = arg_of(&input.seed);
    let mut out: *mut lh_client = ptr::null_mut();
    let cfg_ptr = if null_cfg {
        ptr::null()
    } else {
        buf.as_ptr().cast::<lh_config>()
    };
    // SAFETY: pointers valid for their stated sizes (oversized seed lengths are refused
    // before reading).
    let st = unsafe { lh_client_new(cfg_ptr, seed.ptr(), seed.len, &mut out) };
    // Expected outcome.
    let mut problems = Vec::new();
    if null_cfg || seed.null {
        problems.push(LH_ERR_NULL_ARGUMENT);
    }
    if (sz as usize) < std::mem::size_of::<lh_config>() {
        problems.push(LH_ERR_STRUCT_SIZE);
    }
    if seed.len > LH_MAX_SEED_LEN {
        problems.push(LH_ERR_INVALID_CONFIG);
    }
    if cfg_c.notifications > 1 {
        problems.push(LH_ERR_INVALID_CONFIG);
    }
    let config = Config {
        drift_ppm: cfg_c.drift_ppm,
        drift_fixed_ns: cfg_c.drift_fixed_ns,
        renew_jitter_ppm: cfg_c.renew_jitter_ppm,
        request_timeout_ns: cfg_c.request_timeout_ns,
        fail_budget: cfg_c.fail_budget,
        backoff_base_ns: cfg_c.backoff_base_ns,
        backoff_cap_ns: cfg_c.backoff_cap_ns,
        max_ttl_ms: cfg_c.max_ttl_ms,
        max_leases: cfg_c.max_leases,
        notifications: cfg_c.notifications == 1,
    };
    if !problems.is_empty() {
        expect_status("lh_client_new", st, &problems);
        assert!(out.is_null(), "ffi: lh_client_new wrote *out on error");
        return None;
    }
    let seed_bytes = seed.bytes().expect("valid seed arg");
    match Client::new(config, seed_bytes) {
        Ok(shadow) => {
            expect_status("lh_client_new", st, &[LH_OK]);
            assert!(!out.is_null(), "ffi: lh_client_new OK with NULL handle");
            // SAFETY: live handle.
            let msg = unsafe { CStr::from_ptr(lh_client_last_error(out)) };
            assert!(
                msg.to_bytes().is_empty(),
                "ffi: fresh handle has an error message"
            );
            Some(Handle {
                h: out,
                shadow,
                now: 0,
                leases: Vec::new(),
                requests: Vec::new(),
                open: Vec::new(),
                fence: 0,
                features: 0,
            })
        }
        Err(e) => {
            expect_status("lh_client_new", st, &[status_of(&e)]);
            assert!(out.is_null(), "ffi: lh_client_new wrote *out on error");
            None
        }
    }
}

impl Handle {
    fn time(&mut self, t: Time) -> u64 {
        let now = match t {
            Time::Same => self.now,
            Time::Fwd(ns) => self.now.saturating_add(u64::from(ns)),
            Time::FwdSecs(s) => self.now.saturating_add(u64::from(s) * 1_000_000_000),
            Time::Back(ns) => self.now.saturating_sub(u64::from(ns)),
            Time::Raw(v) => v,
        }
        .min(TIME_CAP);
        self.now = self.now.max(now);
        now
    }

    fn lease(&self, l: Lease) -> u64 {
        match l {
            Lease::Issued(i) if !self.leases.is_empty() => {
                self.leases[usize::from(i) % self.leases.len()]
            }
            Lease::Issued(i) => u64::from(i),
            Lease::Raw(v) => v,
        }
    }

    fn req(&self, r: Req) -> u64 {
        match r {
            Req::Seen(i) if !self.requests.is_empty() => {
                self.requests[self.requests.len() - 1 - usize::from(i) % self.requests.len()]
            }
            Req::Seen(i) => u64::from(i),
            Req::Raw(v) => v,
        }
    }

    fn note(&mut self, st: u32) {
        self.features |= 1 << (st.min(20) + 20);
        if st != LH_OK && st != LH_ERR_NOT_GRANTED {
            // The handle keeps a detail message for every error.
            // SAFETY: live handle; NUL-terminated per the contract.
            let msg = unsafe { CStr::from_ptr(lh_client_last_error(self.h)) };
            assert!(
                !msg.to_bytes().is_empty(),
                "ffi: no lh_client_last_error detail after status {st}"
            );
        }
    }

    /// Compares a refused or performed call against the shadow's answer.
    fn check(
        &mut self,
        what: &str,
        st: u32,
        problems: &[u32],
        shadow: impl FnOnce(&mut Client) -> Result<(), Error>,
    ) {
        if problems.is_empty() {
            let expect = match shadow(&mut self.shadow) {
                Ok(()) => LH_OK,
                Err(e) => status_of(&e),
            };
            expect_status(what, st, &[expect]);
        } else {
            expect_status(what, st, problems);
        }
        self.note(st);
    }

    fn apply(&mut self, op: &FOp) {
        let h = self.h;
        match op {
            FOp::Acquire {
                time,
                name,
                ttl_ms,
                wait_ns,
                flags,
                struct_size,
                null_opts,
                nulls,
            } => {
                let now = self.time(*time);
                let name = arg_of(name);
                let flags = match flags {
                    Enum::Known(i) => u32::from(*i) % 4,
                    Enum::Raw(v) => *v,
                };
                let opts = lh_acquire_options {
                    struct_size: 0,
                    flags,
                    ttl_ms: u64::from(*ttl_ms % 200_000),
                    wait_ns: *wait_ns % (120 * 1_000_000_000),
                };
                let (mut buf, sz) = sized_buf(opts, *struct_size);
                // SAFETY: struct_size is the first u32 of the buffer.
                unsafe { *buf.as_mut_ptr().cast::<u32>() = sz };
                let mut out: u64 = 0xDEAD_BEEF;
                let hp = if matches!(nulls, Nulls::Handle) {
                    ptr::null_mut()
                } else {
                    h
                };
                let outp: *mut u64 = if matches!(nulls, Nulls::Out) {
                    ptr::null_mut()
                } else {
                    &mut out
                };
                let optp = if *null_opts {
                    ptr::null()
                } else {
                    buf.as_ptr().cast::<lh_acquire_options>()
                };
                // SAFETY: every pointer is NULL or valid for its stated size.
                let st = unsafe { lh_acquire(hp, now, name.ptr(), name.len, optp, outp) };
                let mut problems = Vec::new();
                if hp.is_null() || outp.is_null() || optp.is_null() || name.null {
                    problems.push(LH_ERR_NULL_ARGUMENT);
                }
                if !optp.is_null() && (sz as usize) < std::mem::size_of::<lh_acquire_options>() {
                    problems.push(LH_ERR_STRUCT_SIZE);
                }
                if flags & !(LH_ACQUIRE_REENTRANT | LH_ACQUIRE_NO_AUTO_RENEW) != 0 {
                    problems.push(LH_ERR_INVALID_ENUM);
                }
                let name_str = match name.bytes() {
                    Some(b) if b.len() <= MAX_NAME_LEN => match std::str::from_utf8(b) {
                        Ok(s) => Some(s.to_owned()),
                        Err(_) => {
                            problems.push(LH_ERR_INVALID_UTF8);
                            None
                        }
                    },
                    _ => {
                        if !name.null {
                            problems.push(LH_ERR_NAME_TOO_LONG);
                        }
                        None
                    }
                };
                if hp.is_null() {
                    // No handle: nothing else is looked at.
                    expect_status("lh_acquire(NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
                    return;
                }
                let mut got = None;
                let options = AcquireOptions {
                    ttl_ms: opts.ttl_ms,
                    wait_ns: opts.wait_ns,
                    reentrant: flags & LH_ACQUIRE_REENTRANT != 0,
                    auto_renew: flags & LH_ACQUIRE_NO_AUTO_RENEW == 0,
                };
                self.check("lh_acquire", st, &problems, |c| {
                    let id = c.acquire(now, name_str.as_deref().unwrap_or(""), options)?;
                    got = Some(id.0);
                    Ok(())
                });
                match (st, got) {
                    (LH_OK, Some(id)) => {
                        assert_eq!(out, id, "ffi: lh_acquire lease id differs from the core's");
                        if !self.leases.contains(&id) {
                            self.leases.push(id);
                        }
                    }
                    _ => assert_eq!(out, 0xDEAD_BEEF, "ffi: lh_acquire wrote out on error"),
                }
            }
            FOp::Release {
                time,
                lease,
                null_handle,
            } => {
                let now = self.time(*time);
                let id = self.lease(*lease);
                if *null_handle {
                    // SAFETY: NULL handle is an error, not UB.
                    let st = unsafe { lh_release(ptr::null_mut(), now, id) };
                    expect_status("lh_release(NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
                    return;
                }
                // SAFETY: live handle.
                let st = unsafe { lh_release(h, now, id) };
                self.check("lh_release", st, &[], |c| c.release(now, LeaseId(id)));
            }
            FOp::Renew {
                time,
                lease,
                null_handle,
            } => {
                let now = self.time(*time);
                let id = self.lease(*lease);
                if *null_handle {
                    // SAFETY: NULL handle is an error, not UB.
                    let st = unsafe { lh_renew(ptr::null_mut(), now, id) };
                    expect_status("lh_renew(NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
                    return;
                }
                // SAFETY: live handle.
                let st = unsafe { lh_renew(h, now, id) };
                self.check("lh_renew", st, &[], |c| c.renew(now, LeaseId(id)));
            }
            FOp::ReleaseReported { time, lease, nulls } => {
                let now = self.time(*time);
                let id = self.lease(*lease);
                let mut out: u32 = 0xDEAD;
                let hp = if matches!(nulls, Nulls::Handle) {
                    ptr::null_mut()
                } else {
                    h
                };
                let outp: *mut u32 = if matches!(nulls, Nulls::Out) {
                    ptr::null_mut()
                } else {
                    &mut out
                };
                // SAFETY: pointers NULL or valid.
                let st = unsafe { lh_release_reported(hp, now, id, outp) };
                if hp.is_null() {
                    expect_status("lh_release_reported(NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
                    return;
                }
                let problems: &[u32] = if outp.is_null() {
                    &[LH_ERR_NULL_ARGUMENT]
                } else {
                    &[]
                };
                let mut shadow_out = None;
                self.check("lh_release_reported", st, problems, |c| {
                    shadow_out = Some(c.release_reported(now, LeaseId(id))? as u32);
                    Ok(())
                });
                let expect = if st == LH_OK { shadow_out } else { None };
                assert_eq!(
                    (st == LH_OK).then_some(out),
                    expect,
                    "ffi: lh_release_reported disposition (written only on success)"
                );
                if st != LH_OK {
                    assert_eq!(out, 0xDEAD, "ffi: out written on error");
                }
            }
            FOp::AcquireResult {
                time,
                req,
                outcome,
                fencing_token,
                ttl_ms,
                retry_after_ms,
                data,
            } => {
                let now = self.time(*time);
                let r = self.req(*req);
                let outcome = enum_of(*outcome, 3);
                let data = arg_of(data);
                let ttl = u64::from(*ttl_ms % 200_000);
                // SAFETY: live handle; data NULL or valid for len (oversized refused unread).
                let st = unsafe {
                    lh_acquire_result(
                        h,
                        now,
                        r,
                        outcome,
                        *fencing_token,
                        ttl,
                        *retry_after_ms,
                        data.ptr(),
                        data.len,
                    )
                };
                let mut problems = Vec::new();
                let bytes: &[u8] = match outcome {
                    LH_ACQUIRE_GRANTED => {
                        if data.null && data.len != 0 {
                            problems.push(LH_ERR_NULL_ARGUMENT);
                        }
                        if data.len > MAX_BACKEND_DATA_LEN {
                            problems.push(LH_ERR_BACKEND_DATA_TOO_LONG);
                        }
                        data.bytes().unwrap_or(&[])
                    }
                    LH_ACQUIRE_HELD_BY_OTHER | LH_ACQUIRE_TRANSPORT_ERROR => &[],
                    _ => {
                        problems.push(LH_ERR_INVALID_ENUM);
                        &[]
                    }
                };
                let result = match outcome {
                    LH_ACQUIRE_GRANTED => AcquireResult::Granted {
                        fencing_token: *fencing_token,
                        ttl_ms: ttl,
                        backend_data: bytes,
                    },
                    LH_ACQUIRE_HELD_BY_OTHER => AcquireResult::HeldByOther {
                        retry_after_ms: (*retry_after_ms != LH_NO_RETRY_HINT)
                            .then_some(*retry_after_ms),
                    },
                    _ => AcquireResult::TransportError,
                };
                self.check("lh_acquire_result", st, &problems, |c| {
                    c.handle_acquire_result(now, RequestId(r), result)
                });
            }
            FOp::RenewResult { time, req, outcome } => {
                let now = self.time(*time);
                let r = self.req(*req);
                let outcome = enum_of(*outcome, 3);
                // SAFETY: live handle.
                let st = unsafe { lh_renew_result(h, now, r, outcome) };
                let (problems, res) = match outcome {
                    LH_RENEW_RENEWED => (vec![], RenewResult::Renewed),
                    LH_RENEW_REJECTED => (vec![], RenewResult::Rejected),
                    LH_RENEW_TRANSPORT_ERROR => (vec![], RenewResult::TransportError),
                    _ => (vec![LH_ERR_INVALID_ENUM], RenewResult::TransportError),
                };
                self.check("lh_renew_result", st, &problems, |c| {
                    c.handle_renew_result(now, RequestId(r), res)
                });
            }
            FOp::ReleaseResult { time, req, outcome } => {
                let now = self.time(*time);
                let r = self.req(*req);
                let outcome = enum_of(*outcome, 3);
                // SAFETY: live handle.
                let st = unsafe { lh_release_result(h, now, r, outcome) };
                let (problems, res) = match outcome {
                    LH_RELEASE_RELEASED => (vec![], ReleaseResult::Released),
                    LH_RELEASE_NOT_OWNER => (vec![], ReleaseResult::NotOwner),
                    LH_RELEASE_TRANSPORT_ERROR => (vec![], ReleaseResult::TransportError),
                    _ => (vec![LH_ERR_INVALID_ENUM], ReleaseResult::TransportError),
                };
                self.check("lh_release_result", st, &problems, |c| {
                    c.handle_release_result(now, RequestId(r), res)
                });
            }
            FOp::Released { time, name } => {
                let now = self.time(*time);
                let name = arg_of(name);
                // SAFETY: live handle; name NULL or valid (oversized refused unread).
                let st = unsafe { lh_released(h, now, name.ptr(), name.len) };
                let mut problems = Vec::new();
                let mut s = String::new();
                if name.null {
                    problems.push(LH_ERR_NULL_ARGUMENT);
                } else {
                    match name.bytes() {
                        Some(b) if b.len() <= MAX_NAME_LEN => match std::str::from_utf8(b) {
                            Ok(v) => s = v.to_owned(),
                            Err(_) => problems.push(LH_ERR_INVALID_UTF8),
                        },
                        _ => problems.push(LH_ERR_NAME_TOO_LONG),
                    }
                }
                self.check("lh_released", st, &problems, |c| c.handle_released(now, &s));
            }
            FOp::Timeout { time } => {
                let now = self.time(*time);
                // SAFETY: live handle.
                let st = unsafe { lh_timeout(h, now) };
                self.check("lh_timeout", st, &[], |c| {
                    c.handle_timeout(now);
                    Ok(())
                });
            }
            FOp::Fire => {
                let mut d = 0u64;
                // SAFETY: live handle, valid out.
                let st = unsafe { lh_poll_timeout(h, &mut d) };
                expect_status("lh_poll_timeout", st, &[LH_OK]);
                let want = self.shadow.poll_timeout().unwrap_or(LH_NO_DEADLINE);
                assert_eq!(d, want, "ffi: lh_poll_timeout differs from the core");
                if d != LH_NO_DEADLINE {
                    let now = d.min(TIME_CAP).max(self.now);
                    self.now = now;
                    // SAFETY: live handle.
                    let st = unsafe { lh_timeout(h, now) };
                    self.check("lh_timeout", st, &[], |c| {
                        c.handle_timeout(now);
                        Ok(())
                    });
                }
            }
            FOp::Getters {
                lease,
                time,
                nulls,
                struct_size,
            } => self.getters(*lease, *time, *nulls, *struct_size),
            FOp::Reseed { seed, null_handle } => {
                let seed = arg_of(seed);
                let hp = if *null_handle { ptr::null_mut() } else { h };
                // SAFETY: handle NULL or live; seed NULL or valid (oversized refused unread).
                let st = unsafe { lh_client_reseed(hp, seed.ptr(), seed.len) };
                if hp.is_null() {
                    expect_status("lh_client_reseed(NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
                    return;
                }
                let mut problems = Vec::new();
                if seed.null {
                    problems.push(LH_ERR_NULL_ARGUMENT);
                } else if seed.len > LH_MAX_SEED_LEN {
                    problems.push(LH_ERR_INVALID_CONFIG);
                }
                let bytes = seed.bytes().unwrap_or(&[]).to_vec();
                self.check("lh_client_reseed", st, &problems, |c| c.reseed(&bytes));
            }
            FOp::StatusStr(code) => {
                let p = lh_status_str(*code);
                assert!(!p.is_null(), "ffi: lh_status_str({code}) is NULL");
                // SAFETY: static NUL-terminated string.
                let s = unsafe { CStr::from_ptr(p) }.to_str().expect("ASCII");
                let known = matches!(*code, 0..=21 | 900 | 901);
                assert_eq!(
                    s == "LH_UNKNOWN_STATUS",
                    !known,
                    "ffi: lh_status_str({code}) = {s}"
                );
                assert!(s.starts_with("LH_"), "ffi: lh_status_str({code}) = {s}");
            }
            FOp::RetiredKey { .. } | FOp::RetiredScript { .. } => {}
            FOp::Serve { time } => {
                let t = *time;
                for (r, kind) in std::mem::take(&mut self.open) {
                    let op = match kind {
                        LH_OUTPUT_ACQUIRE => {
                            self.fence += 1;
                            FOp::AcquireResult {
                                time: t,
                                req: Req::Raw(r),
                                outcome: Enum::Known(0),
                                fencing_token: self.fence,
                                ttl_ms: u32::MAX,
                                retry_after_ms: LH_NO_RETRY_HINT,
                                data: BufChoice::Bytes(SmallBytes(b"d".to_vec())),
                            }
                        }
                        LH_OUTPUT_RENEW => FOp::RenewResult {
                            time: t,
                            req: Req::Raw(r),
                            outcome: Enum::Known(0),
                        },
                        _ => FOp::ReleaseResult {
                            time: t,
                            req: Req::Raw(r),
                            outcome: Enum::Known(0),
                        },
                    };
                    self.apply(&op);
                }
            }
            FOp::PollNull => {
                // SAFETY: NULL pointers are documented errors.
                let st = unsafe { lh_poll_output(h, ptr::null_mut()) };
                expect_status("lh_poll_output(out NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
                self.note(st);
                let mut o = std::mem::MaybeUninit::<lh_output>::uninit();
                // SAFETY: NULL handle is an error.
                let st = unsafe { lh_poll_output(ptr::null_mut(), o.as_mut_ptr()) };
                expect_status("lh_poll_output(NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
                // SAFETY: NULL handle is an error; free(NULL) is a no-op.
                unsafe {
                    let mut d = 0u64;
                    let st = lh_poll_timeout(ptr::null_mut(), &mut d);
                    expect_status("lh_poll_timeout(NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
                    let st = lh_timeout(ptr::null_mut(), 0);
                    expect_status("lh_timeout(NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
                    lh_client_free(ptr::null_mut());
                    let e = CStr::from_ptr(lh_client_last_error(ptr::null()));
                    assert!(e.to_bytes().is_empty());
                }
            }
        }
    }

    fn getters(&mut self, lease: Lease, time: Time, nulls: Nulls, size: SizeChoice) {
        let id = self.lease(lease);
        let now = match time {
            Time::Raw(v) => v,
            t => {
                let saved = self.now;
                let n = self.time(t);
                self.now = saved;
                n
            }
        };
        let hp: *const lh_client = if matches!(nulls, Nulls::Handle) {
            ptr::null()
        } else {
            self.h
        };
        let null_out = matches!(nulls, Nulls::Out);
        let err = |e: Error| status_of(&e);
        let null_problem: &[u32] = if hp.is_null() || null_out {
            &[LH_ERR_NULL_ARGUMENT]
        } else {
            &[]
        };

        // lh_lease_state
        let mut st_out = 0xAAu32;
        // SAFETY: pointers NULL or valid.
        let st = unsafe {
            lh_lease_state(
                hp,
                id,
                if null_out {
                    ptr::null_mut()
                } else {
                    &mut st_out
                },
            )
        };
        if null_problem.is_empty() {
            match self.shadow.lease_state(LeaseId(id)) {
                Ok(s) => {
                    expect_status("lh_lease_state", st, &[LH_OK]);
                    assert_eq!(st_out, state_of(s), "ffi: lh_lease_state");
                }
                Err(e) => {
                    expect_status("lh_lease_state", st, &[err(e)]);
                    assert_eq!(st_out, 0xAA, "ffi: lh_lease_state wrote out on error");
                }
            }
        } else {
            expect_status("lh_lease_state", st, null_problem);
        }

        // lh_lease_info_get with a chosen struct_size
        let blank = lh_lease_info {
            struct_size: 0,
            state: 0xAA,
            holders: 0xAA,
            has_token: 0xAA,
            fencing_token: 0xAA,
            valid_until_ns: 0xAA,
        };
        let (mut buf, sz) = sized_buf(blank, size);
        // SAFETY: struct_size is the first u32 of the buffer.
        unsafe { *buf.as_mut_ptr().cast::<u32>() = sz };
        let infop = if null_out {
            ptr::null_mut()
        } else {
            buf.as_mut_ptr().cast::<lh_lease_info>()
        };
        // SAFETY: pointers NULL or valid for struct_size bytes.
        let st = unsafe { lh_lease_info_get(hp, id, infop) };
        if null_problem.is_empty() {
            let small = (sz as usize) < std::mem::size_of::<lh_lease_info>();
            // SAFETY: the buffer holds an lh_lease_info.
            let got = unsafe { ptr::read(buf.as_ptr().cast::<lh_lease_info>()) };
            match self.shadow.lease_info(LeaseId(id)) {
                Ok(_) if small => {
                    expect_status("lh_lease_info_get", st, &[LH_ERR_STRUCT_SIZE]);
                }
                Ok(info) => {
                    expect_status("lh_lease_info_get", st, &[LH_OK]);
                    assert_eq!(got.state, state_of(info.state));
                    assert_eq!(got.holders, info.holders);
                    assert_eq!(got.has_token, u32::from(info.fencing_token.is_some()));
                    assert_eq!(got.fencing_token, info.fencing_token.unwrap_or(0));
                    assert_eq!(got.valid_until_ns, info.valid_until.unwrap_or(0));
                    assert_eq!(
                        got.struct_size as usize,
                        std::mem::size_of::<lh_lease_info>()
                    );
                }
                Err(e) => {
                    expect_status(
                        "lh_lease_info_get",
                        st,
                        &if small {
                            vec![LH_ERR_STRUCT_SIZE, err(e)]
                        } else {
                            vec![err(e)]
                        },
                    );
                }
            }
            if st != LH_OK {
                assert_eq!(got.state, 0xAA, "ffi: lh_lease_info_get wrote out on error");
            }
        } else {
            expect_status("lh_lease_info_get", st, null_problem);
        }

        // lh_fencing_token / lh_valid_until
        for (name, which) in [("lh_fencing_token", 0), ("lh_valid_until", 1)] {
            let mut v = 0xAAu64;
            let outp: *mut u64 = if null_out { ptr::null_mut() } else { &mut v };
            // SAFETY: pointers NULL or valid.
            let st = unsafe {
                if which == 0 {
                    lh_fencing_token(hp, id, outp)
                } else {
                    lh_valid_until(hp, id, outp)
                }
            };
            if !null_problem.is_empty() {
                expect_status(name, st, null_problem);
                continue;
            }
            let want = if which == 0 {
                self.shadow.fencing_token(LeaseId(id))
            } else {
                self.shadow.valid_until(LeaseId(id))
            };
            match want {
                Ok(Some(x)) => {
                    expect_status(name, st, &[LH_OK]);
                    assert_eq!(v, x, "ffi: {name}");
                }
                Ok(None) => {
                    expect_status(name, st, &[LH_ERR_NOT_GRANTED]);
                    assert_eq!(v, 0xAA, "ffi: {name} wrote out on error");
                }
                Err(e) => {
                    expect_status(name, st, &[err(e)]);
                    assert_eq!(v, 0xAA, "ffi: {name} wrote out on error");
                }
            }
        }

        // lh_is_held
        let mut held = false;
        let outp: *mut bool = if null_out { ptr::null_mut() } else { &mut held };
        // SAFETY: pointers NULL or valid.
        let st = unsafe { lh_is_held(hp, id, now, outp) };
        if null_problem.is_empty() {
            match self.shadow.is_held(LeaseId(id), now) {
                Ok(x) => {
                    expect_status("lh_is_held", st, &[LH_OK]);
                    assert_eq!(held, x, "ffi: lh_is_held");
                }
                Err(e) => expect_status("lh_is_held", st, &[err(e)]),
            }
        } else {
            expect_status("lh_is_held", st, null_problem);
        }

        // lh_counters_get
        let blank = [0xAAu64; 20];
        let (mut buf, sz) = sized_buf(blank, size);
        // SAFETY: struct_size is the first u32 of the buffer.
        unsafe { *buf.as_mut_ptr().cast::<u32>() = sz };
        let cp = if null_out {
            ptr::null_mut()
        } else {
            buf.as_mut_ptr().cast::<lh_counters>()
        };
        // SAFETY: pointers NULL or valid for struct_size bytes (the buffer is 128 bytes or more).
        let st = unsafe { lh_counters_get(hp, cp) };
        if null_problem.is_empty() {
            if (sz as usize) < LH_COUNTERS_V1_SIZE {
                expect_status("lh_counters_get", st, &[LH_ERR_STRUCT_SIZE]);
            } else {
                expect_status("lh_counters_get", st, &[LH_OK]);
                // SAFETY: filled by the library (up to struct_size; the buffer holds it all).
                let c = unsafe { ptr::read(buf.as_ptr().cast::<lh_counters>()) };
                let k = self.shadow.counters();
                let full = std::mem::size_of::<lh_counters>();
                assert_eq!(
                    c.struct_size as usize,
                    (sz as usize).min(full),
                    "ffi: struct_size"
                );
                if (sz as usize) >= full {
                    assert_eq!(
                        [c.renewals_requested, c.releases_confirmed, c.releases_lost],
                        [k.renewals_requested, k.releases_confirmed, k.releases_lost],
                        "ffi: lh_counters_get (added fields)"
                    );
                } else if (sz as usize) <= std::mem::offset_of!(lh_counters, releases_lost) {
                    assert_eq!(c.releases_lost, 0xAA, "ffi: wrote past struct_size");
                }
                assert_eq!(
                    [
                        c.live_leases,
                        c.pending_cleanups,
                        c.grants,
                        c.stale_results,
                        c.time_clamped
                    ],
                    [
                        k.live_leases,
                        k.pending_cleanups,
                        k.grants,
                        k.stale_results,
                        k.time_clamped
                    ],
                    "ffi: lh_counters_get"
                );
            }
        } else {
            expect_status("lh_counters_get", st, null_problem);
        }
        if !hp.is_null() {
            self.note(st);
        }
    }

    /// Drains both the handle and the shadow and compares every output field by field.
    fn compare_drain(&mut self) {
        for n in 0.. {
            assert!(n < 100_000, "ffi: output queue does not drain");
            let mut o = std::mem::MaybeUninit::<lh_output>::uninit();
            // SAFETY: live handle, valid out.
            let st = unsafe { lh_poll_output(self.h, o.as_mut_ptr()) };
            expect_status("lh_poll_output", st, &[LH_OK]);
            // SAFETY: written on LH_OK.
            let o = unsafe { o.assume_init() };
            let got = flat_of_c(&o);
            let want = flat_of(self.shadow.poll_output());
            assert_eq!(got, want, "ffi: polled output differs from the core's");
            if got.kind == LH_OUTPUT_NONE {
                break;
            }
            self.features |= 1 << got.kind;
            if matches!(
                got.kind,
                LH_OUTPUT_ACQUIRE | LH_OUTPUT_RENEW | LH_OUTPUT_RELEASE
            ) {
                assert_eq!(got.token.len(), 32);
                assert!(
                    got.token
                        .iter()
                        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
                    "ffi: token is not lowercase hex"
                );
                self.requests.push(got.request_id);
                if self.requests.len() > 64 {
                    self.requests.remove(0);
                }
                self.open.push((got.request_id, got.kind));
                if self.open.len() > 64 {
                    self.open.remove(0);
                }
            }
            assert!(
                std::str::from_utf8(&got.name).is_ok(),
                "ffi: name not UTF-8"
            );
        }
        let _ = MIN_SEED_LEN;
    }
}
