//! `ffi`: host operations through the `lh_*` C functions (called from Rust through
//! `leasehold::ffi`) on a memory-backend handle and the one seam, with arbitrary byte strings
//! (invalid UTF-8, embedded NULs, oversized lengths), arbitrary answers (well-formed memory
//! answers, garbage, malformed value lists), unknown enum values, odd `struct_size`s and NULL
//! pointers; its requests are also run on a real `lh_memory_service`.
//!
//! Oracle: nothing crashes; every status is a documented code of that function (never
//! `LH_ERR_PANIC`/`LH_ERR_POISONED`); out-params are untouched on error; and the handle is a
//! faithful translation of the core: a shadow `leasehold::Client` with the memory protocol
//! (`leasehold::backend::Protocol::Memory`), the same config and seed gets the same (valid)
//! inputs, and every status, getter, polled request, event and status answer must match it
//! field for field. Inputs refused at the C boundary must leave the handle unchanged (the
//! shadow is not called, so any state change shows up as a divergence).

use std::ffi::CStr;
use std::ptr;

use arbitrary::Arbitrary;
use leasehold::backend::memory::MemoryProtocol;
use leasehold::backend::value::FlatValue;
use leasehold::backend::{ConnectionEvent, FailureKind, Protocol};
use leasehold::ffi::*;
use leasehold::{
    AcquireFailReason, AcquireOptions, Client, Config, Error, Event, LeaseId, LeaseState,
    LostReason, MAX_NAME_LEN,
};

use crate::{Seq, SmallBytes};

const NAMES: [&str; 3] = ["a", "b", "lock/c"];
const TIME_CAP: u64 = 1 << 62;
/// Longest `BufChoice::Repeat` buffer (around the name and seed limits).
const REPEAT_MAX: usize = 2056;

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
    /// A short buffer with a length beyond every limit (the library must refuse the length
    /// before reading).
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
    /// The n-th request id seen in a polled request.
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

/// One host operation. The variants keep their order (see fuzz/README.md); those named after
/// the engine-result exports of ABI 2 now send the memory protocol's answers of that shape
/// through `lh_io_reply` / `lh_io_failed`.
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
    /// `lh_release` without a report.
    Release {
        time: Time,
        lease: Lease,
        null_handle: bool,
    },
    /// An acquire's answer: `[GRANTED fence]`, `[HELD retry|nil]`, a transport failure
    /// (`data` is the host's message), or garbage (`[data-as-status ttl]`).
    AcquireResult {
        time: Time,
        req: Req,
        outcome: Enum,
        fencing_token: u64,
        ttl_ms: u32,
        retry_after_ms: u64,
        data: BufChoice,
    },
    /// A renewal's answer: `[RENEWED]`, `[REJECTED]`, a transport failure, or garbage.
    RenewResult {
        time: Time,
        req: Req,
        outcome: Enum,
    },
    /// A release's answer: `[RELEASED]`, `[NOT_OWNER]`, a transport failure, or garbage.
    ReleaseResult {
        time: Time,
        req: Req,
        outcome: Enum,
    },
    /// A release notification (`lh_io_message` with the name as the channel).
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
    /// `lh_release` with a report.
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
    /// skipped.
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
    /// Run every unanswered request on a real `lh_memory_service` (one connection) and hand
    /// its answers and release notifications to the handle and the shadow.
    Serve {
        time: Time,
    },
    /// `lh_io_reply` with a raw value list (kind, integer, offset, len) and data; NULL values
    /// with a count when `null_values`.
    Reply {
        time: Time,
        req: Req,
        values: Vec<(u8, i64, u16, u16)>,
        data: BufChoice,
        null_values: bool,
    },
    /// `lh_io_failed` with any kind and message.
    Failed {
        time: Time,
        req: Req,
        kind: Enum,
        message: BufChoice,
    },
    /// `lh_io_message` with any channel and payload.
    Message {
        time: Time,
        channel: BufChoice,
        payload: BufChoice,
    },
    /// `lh_io_connection` with any connection, event and channel.
    Connection {
        time: Time,
        connection: Enum,
        event: Enum,
        channel: BufChoice,
    },
    /// An answer of another backend's kind: `lh_io_http_reply` or `lh_io_stream_message`.
    WrongAnswer {
        time: Time,
        req: Req,
        status: u16,
        body: BufChoice,
        stream: bool,
    },
    /// `lh_status_request`.
    StatusRequest {
        time: Time,
        name: BufChoice,
        nulls: Nulls,
    },
    /// `lh_poll_status` with a chosen `struct_size`.
    PollStatus {
        struct_size: SizeChoice,
    },
    /// `lh_io_close`.
    Close {
        time: Time,
    },
}

/// An owned argument buffer; `ptr()`/`len` are what the C caller passes.
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

    /// The problems of an optional buffer (NULL allowed when empty) limited to `max` bytes.
    fn optional_problems(&self, max: usize, too_long: u32) -> Vec<u32> {
        if self.null && self.len == 0 {
            vec![]
        } else {
            self.required_problems(max, too_long)
        }
    }

    /// The problems of a required buffer limited to `max` bytes.
    fn required_problems(&self, max: usize, too_long: u32) -> Vec<u32> {
        if self.null {
            vec![LH_ERR_NULL_ARGUMENT]
        } else if self.len > max {
            vec![too_long]
        } else {
            vec![]
        }
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
            let n = usize::from(*n) % REPEAT_MAX;
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
            len: [
                usize::MAX,
                isize::MAX as usize,
                LH_MAX_REPLY_DATA + 1,
                1 << 40,
            ][usize::from(*k) % 4],
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

fn event_of(e: Option<Event>) -> lh_event {
    let mut f = lh_event::default();
    let Some(e) = e else {
        return f;
    };
    match e {
        Event::Acquired {
            lease,
            fencing_token,
            valid_until,
        } => {
            f.kind = LH_EVENT_ACQUIRED;
            f.lease_id = lease.0;
            f.fencing_token = fencing_token;
            f.valid_until_ns = valid_until;
        }
        Event::AcquireFailed { lease, reason } => {
            f.kind = LH_EVENT_ACQUIRE_FAILED;
            f.lease_id = lease.0;
            f.reason = match reason {
                AcquireFailReason::WaitExhausted => LH_REASON_WAIT_EXHAUSTED,
                AcquireFailReason::Cancelled => LH_REASON_CANCELLED,
                AcquireFailReason::Unavailable => LH_REASON_UNAVAILABLE,
            };
        }
        Event::Lost { lease, reason } => {
            f.kind = LH_EVENT_LOST;
            f.lease_id = lease.0;
            f.reason = match reason {
                LostReason::Rejected => LH_REASON_REJECTED,
                LostReason::Expired => LH_REASON_EXPIRED,
                LostReason::FailBudget => LH_REASON_FAIL_BUDGET,
            };
        }
        Event::Released { lease } => {
            f.kind = LH_EVENT_RELEASED;
            f.lease_id = lease.0;
        }
        Event::Renewed { lease, valid_until } => {
            f.kind = LH_EVENT_RENEWED;
            f.lease_id = lease.0;
            f.valid_until_ns = valid_until;
        }
        Event::ReleaseOutcome { lease, outcome } => {
            f.kind = LH_EVENT_RELEASE_OUTCOME;
            f.lease_id = lease.0;
            f.reason = outcome as u32;
        }
    }
    f
}

/// Copies a borrowed buffer of the library (checking the NULL-when-empty convention).
fn take<T: Clone>(p: *const T, len: usize, what: &str) -> Vec<T> {
    if len == 0 {
        assert!(p.is_null(), "ffi: {what} not NULL with length 0");
        return Vec::new();
    }
    assert!(!p.is_null(), "ffi: {what} NULL with length {len}");
    // SAFETY: the library promises `len` readable values until the next call on the handle.
    unsafe { std::slice::from_raw_parts(p, len) }.to_vec()
}

/// An answer value, flattened by [`flat`] for both the handle and the shadow.
enum V {
    Nil,
    Int(i64),
    Status(Vec<u8>),
    Arr(Vec<V>),
}

fn word(w: &str, rest: Vec<V>) -> V {
    let mut v = vec![V::Status(w.as_bytes().to_vec())];
    v.extend(rest);
    V::Arr(v)
}

fn flat(v: &V, out: &mut Vec<lh_value>, data: &mut Vec<u8>) {
    match v {
        V::Nil => out.push(lh_value {
            kind: LH_VALUE_NIL,
            ..lh_value::default()
        }),
        V::Int(i) => out.push(lh_value {
            kind: LH_VALUE_INT,
            integer: *i,
            ..lh_value::default()
        }),
        V::Status(s) => {
            out.push(lh_value {
                kind: LH_VALUE_STATUS,
                offset: data.len() as u64,
                len: s.len() as u64,
                ..lh_value::default()
            });
            data.extend_from_slice(s);
        }
        V::Arr(items) => {
            out.push(lh_value {
                kind: LH_VALUE_ARRAY,
                len: items.len() as u64,
                ..lh_value::default()
            });
            for i in items {
                flat(i, out, data);
            }
        }
    }
}

fn flat_values(values: &[lh_value]) -> Vec<FlatValue> {
    values
        .iter()
        .map(|v| FlatValue {
            kind: v.kind,
            integer: v.integer,
            offset: v.offset,
            len: v.len,
        })
        .collect()
}

/// What an engine-result op sends: an answer, or a failure with the host's message.
enum Answer {
    Values(V),
    Failed(BufChoice),
}

struct Shadow {
    core: Client,
    proto: Protocol,
}

struct Handle {
    h: *mut lh_client,
    svc: *mut lh_memory_service,
    conn: u64,
    shadow: Shadow,
    now: u64,
    leases: Vec<u64>,
    requests: Vec<u64>,
    /// Unanswered requests (id, arguments) for `FOp::Serve`.
    open: Vec<(u64, Vec<Vec<u8>>)>,
    features: u64,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handles came from their constructors and are not used again.
        unsafe {
            lh_client_free(self.h);
            lh_memory_service_free(self.svc);
        }
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

fn memory_backend() -> lh_backend_options {
    let mut b = std::mem::MaybeUninit::<lh_backend_options>::uninit();
    // SAFETY: writes one lh_backend_options on LH_OK.
    unsafe {
        assert_eq!(
            lh_backend_options_default(LH_BACKEND_MEMORY, b.as_mut_ptr()),
            LH_OK
        );
        b.assume_init()
    }
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
    let backend = memory_backend();
    let mut out: *mut lh_client = ptr::null_mut();
    let cfg_ptr = if null_cfg {
        ptr::null()
    } else {
        buf.as_ptr().cast::<lh_config>()
    };
    // SAFETY: pointers valid for their stated sizes (oversized seed lengths are refused
    // before reading).
    let st = unsafe { lh_client_new(cfg_ptr, &backend, seed.ptr(), seed.len, &mut out) };
    // lh_client_new_check gives the same verdict, and a reason exactly when it refuses.
    let mut why = [0xAAu8; 64];
    let mut why_len = usize::MAX;
    // SAFETY: as above; `why` holds its length in bytes.
    let checked = unsafe {
        lh_client_new_check(
            cfg_ptr,
            &backend,
            seed.ptr(),
            seed.len,
            why.as_mut_ptr().cast(),
            why.len(),
            &mut why_len,
        )
    };
    assert_eq!(
        checked, st,
        "ffi: lh_client_new_check disagrees with lh_client_new"
    );
    assert_eq!(
        why_len == 0,
        st == LH_OK,
        "ffi: lh_client_new_check's reason"
    );
    assert!(
        why.contains(&0),
        "ffi: lh_client_new_check's reason is not NUL-terminated"
    );
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
        Ok(core) => {
            expect_status("lh_client_new", st, &[LH_OK]);
            assert!(!out.is_null(), "ffi: lh_client_new OK with NULL handle");
            // SAFETY: live handle.
            let msg = unsafe { CStr::from_ptr(lh_client_last_error(out)) };
            assert!(
                msg.to_bytes().is_empty(),
                "ffi: fresh handle has an error message"
            );
            let mut mc = std::mem::MaybeUninit::<lh_memory_config>::uninit();
            let (mut svc, mut conn) = (ptr::null_mut(), 0);
            // SAFETY: valid out-pointers.
            unsafe {
                lh_memory_config_default(mc.as_mut_ptr());
                assert_eq!(lh_memory_service_new(mc.as_ptr(), &mut svc), LH_OK);
                assert_eq!(lh_memory_service_connect(svc, &mut conn), LH_OK);
            }
            Some(Handle {
                h: out,
                svc,
                conn,
                shadow: Shadow {
                    core,
                    proto: Protocol::Memory(Box::new(MemoryProtocol::new())),
                },
                now: 0,
                leases: Vec::new(),
                requests: Vec::new(),
                open: Vec::new(),
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
        self.features |= 1 << (st.min(22) + 20);
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
        shadow: impl FnOnce(&mut Shadow) -> Result<(), u32>,
    ) {
        if problems.is_empty() {
            let expect = match shadow(&mut self.shadow) {
                Ok(()) => LH_OK,
                Err(code) => code,
            };
            expect_status(what, st, &[expect]);
        } else {
            expect_status(what, st, problems);
        }
        self.note(st);
    }

    /// `lh_io_reply` of `values`/`data` to `id`, checked against the shadow.
    fn reply(&mut self, what: &str, now: u64, id: u64, values: &[lh_value], data: &[u8]) {
        // SAFETY: live handle; slices valid for the call.
        let st = unsafe {
            lh_io_reply(
                self.h,
                now,
                id,
                values.as_ptr(),
                values.len(),
                data.as_ptr(),
                data.len(),
            )
        };
        let mut problems = Vec::new();
        if values.len() > LH_MAX_REPLY_VALUES || data.len() > LH_MAX_REPLY_DATA {
            problems.push(LH_ERR_INVALID_REPLY);
        }
        let fl = flat_values(values);
        self.check(what, st, &problems, |s| {
            s.proto
                .handle_values(&mut s.core, now, id, &fl, data)
                .map_err(|e| match e {
                    leasehold::backend::AnswerError::WrongKind(_) => LH_ERR_WRONG_ANSWER,
                    leasehold::backend::AnswerError::Invalid(_) => LH_ERR_INVALID_REPLY,
                })
        });
    }

    /// `lh_io_failed` of `id` with `kind` and `message`, checked against the shadow.
    fn failed(&mut self, what: &str, now: u64, id: u64, kind: u32, message: &Arg) {
        // SAFETY: live handle; the message is NULL or valid (oversized refused unread).
        let st = unsafe { lh_io_failed(self.h, now, id, kind, message.ptr(), message.len) };
        let mut problems = message.optional_problems(LH_MAX_REPLY_DATA, LH_ERR_INVALID_REPLY);
        let fk = FailureKind::from_u32(kind);
        if fk.is_none() {
            problems.push(LH_ERR_INVALID_ENUM);
        }
        let text = String::from_utf8_lossy(message.bytes().unwrap_or(&[])).into_owned();
        self.check(what, st, &problems, |s| {
            let fk = fk.expect("a known kind");
            s.proto
                .handle_failed(&mut s.core, now, id, fk, &text)
                .map_err(|_| LH_ERR_WRONG_ANSWER)
        });
    }

    /// An engine-result op: its answer through the seam.
    fn answer(&mut self, what: &str, time: Time, req: Req, answer: Answer) {
        let now = self.time(time);
        let id = self.req(req);
        match answer {
            Answer::Values(v) => {
                let (mut values, mut data) = (Vec::new(), Vec::new());
                flat(&v, &mut values, &mut data);
                self.reply(what, now, id, &values, &data);
            }
            Answer::Failed(msg) => {
                let msg = arg_of(&msg);
                self.failed(what, now, id, LH_FAILURE_TRANSPORT, &msg);
            }
        }
    }

    /// `lh_io_message` of `channel`/`payload`, checked against the shadow.
    fn message(&mut self, what: &str, now: u64, channel: &Arg, payload: &Arg) {
        // SAFETY: live handle; buffers NULL or valid (oversized refused unread).
        let st = unsafe {
            lh_io_message(
                self.h,
                now,
                channel.ptr(),
                channel.len,
                payload.ptr(),
                payload.len,
            )
        };
        let mut problems = channel.required_problems(LH_MAX_REPLY_DATA, LH_ERR_INVALID_REPLY);
        problems.extend(payload.optional_problems(LH_MAX_REPLY_DATA, LH_ERR_INVALID_REPLY));
        let (ch, pl) = (
            channel.bytes().unwrap_or(&[]).to_vec(),
            payload.bytes().unwrap_or(&[]).to_vec(),
        );
        self.check(what, st, &problems, |s| {
            s.proto
                .handle_message(&mut s.core, now, &ch, &pl)
                .map_err(|_| LH_ERR_WRONG_ANSWER)
        });
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
                self.check("lh_acquire", st, &problems, |s| {
                    let id = s
                        .core
                        .acquire(now, name_str.as_deref().unwrap_or(""), options)
                        .map_err(|e| status_of(&e))?;
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
                    let st = unsafe { lh_release(ptr::null_mut(), now, id, ptr::null_mut()) };
                    expect_status("lh_release(NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
                    return;
                }
                // SAFETY: live handle.
                let st = unsafe { lh_release(h, now, id, ptr::null_mut()) };
                self.check("lh_release", st, &[], |s| {
                    s.core.release(now, LeaseId(id)).map_err(|e| status_of(&e))
                });
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
                self.check("lh_renew", st, &[], |s| {
                    s.core.renew(now, LeaseId(id)).map_err(|e| status_of(&e))
                });
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
                if matches!(nulls, Nulls::Out) {
                    // A NULL out-pointer is the plain release (no report).
                    // SAFETY: live handle.
                    let st = unsafe { lh_release(hp, now, id, ptr::null_mut()) };
                    self.check("lh_release(no report)", st, &[], |s| {
                        s.core.release(now, LeaseId(id)).map_err(|e| status_of(&e))
                    });
                    return;
                }
                // SAFETY: pointers NULL or valid.
                let st = unsafe { lh_release(hp, now, id, &mut out) };
                if hp.is_null() {
                    expect_status("lh_release(NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
                    return;
                }
                let mut shadow_out = None;
                self.check("lh_release(report)", st, &[], |s| {
                    let r = s
                        .core
                        .release_reported(now, LeaseId(id))
                        .map_err(|e| status_of(&e))?;
                    shadow_out = Some(r as u32);
                    Ok(())
                });
                let expect = if st == LH_OK { shadow_out } else { None };
                assert_eq!(
                    (st == LH_OK).then_some(out),
                    expect,
                    "ffi: lh_release disposition (written only on success)"
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
                let answer = match enum_of(*outcome, 3) {
                    1 => Answer::Values(word("GRANTED", vec![V::Int(*fencing_token as i64)])),
                    2 => Answer::Values(word(
                        "HELD",
                        vec![if *retry_after_ms == u64::MAX {
                            V::Nil
                        } else {
                            V::Int(*retry_after_ms as i64)
                        }],
                    )),
                    3 => Answer::Failed(data.clone()),
                    _ => {
                        let d = arg_of(data);
                        let bytes = d.bytes().unwrap_or(b"GRANTED").to_vec();
                        Answer::Values(V::Arr(vec![V::Status(bytes), V::Int(i64::from(*ttl_ms))]))
                    }
                };
                self.answer("acquire answer", *time, *req, answer);
            }
            FOp::RenewResult { time, req, outcome } => {
                let answer = match enum_of(*outcome, 3) {
                    1 => Answer::Values(word("RENEWED", vec![])),
                    2 => Answer::Values(word("REJECTED", vec![])),
                    3 => Answer::Failed(BufChoice::Null(0)),
                    raw => Answer::Values(word("RENEWED", vec![V::Int(i64::from(raw))])),
                };
                self.answer("renew answer", *time, *req, answer);
            }
            FOp::ReleaseResult { time, req, outcome } => {
                let answer = match enum_of(*outcome, 3) {
                    1 => Answer::Values(word("RELEASED", vec![])),
                    2 => Answer::Values(word("NOT_OWNER", vec![])),
                    3 => Answer::Failed(BufChoice::Null(0)),
                    raw => Answer::Values(V::Int(i64::from(raw))),
                };
                self.answer("release answer", *time, *req, answer);
            }
            FOp::Released { time, name } => {
                let now = self.time(*time);
                let name = arg_of(name);
                let none = arg_of(&BufChoice::Null(0));
                self.message("lh_io_message(released)", now, &name, &none);
            }
            FOp::Timeout { time } => {
                let now = self.time(*time);
                // SAFETY: live handle.
                let st = unsafe { lh_timeout(h, now) };
                self.check("lh_timeout", st, &[], |s| {
                    s.proto.handle_timeout(&mut s.core, now);
                    Ok(())
                });
            }
            FOp::Fire => {
                let mut d = 0u64;
                // SAFETY: live handle, valid out.
                let st = unsafe { lh_poll_timeout(h, &mut d) };
                expect_status("lh_poll_timeout", st, &[LH_OK]);
                let s = &mut self.shadow;
                let want = s.proto.poll_timeout(&mut s.core).unwrap_or(LH_NO_DEADLINE);
                assert_eq!(d, want, "ffi: lh_poll_timeout differs from the core");
                if d != LH_NO_DEADLINE {
                    let now = d.min(TIME_CAP).max(self.now);
                    self.now = now;
                    // SAFETY: live handle.
                    let st = unsafe { lh_timeout(h, now) };
                    self.check("lh_timeout", st, &[], |s| {
                        s.proto.handle_timeout(&mut s.core, now);
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
                self.check("lh_client_reseed", st, &problems, |s| {
                    s.core.reseed(&bytes).map_err(|e| status_of(&e))
                });
            }
            FOp::StatusStr(code) => {
                let p = lh_status_str(*code);
                assert!(!p.is_null(), "ffi: lh_status_str({code}) is NULL");
                // SAFETY: static NUL-terminated string.
                let s = unsafe { CStr::from_ptr(p) }.to_str().expect("ASCII");
                let known = matches!(*code, 0..=22 | 900 | 901);
                assert_eq!(
                    s == "LH_UNKNOWN_STATUS",
                    !known,
                    "ffi: lh_status_str({code}) = {s}"
                );
                assert!(s.starts_with("LH_"), "ffi: lh_status_str({code}) = {s}");
            }
            FOp::RetiredKey { .. } | FOp::RetiredScript { .. } => {}
            FOp::Serve { time } => self.serve(*time),
            FOp::PollNull => self.poll_null(),
            FOp::Reply {
                time,
                req,
                values,
                data,
                null_values,
            } => {
                let now = self.time(*time);
                let id = self.req(*req);
                let data = arg_of(data);
                let values: Vec<lh_value> = values
                    .iter()
                    .take(64)
                    .map(|&(kind, integer, offset, len)| lh_value {
                        kind: u32::from(kind % 10),
                        _reserved: 0,
                        integer,
                        offset: u64::from(offset % 128),
                        len: if kind & 0x80 != 0 {
                            u64::from(len)
                        } else {
                            u64::from(len % 16)
                        },
                    })
                    .collect();
                let data_problems = data.optional_problems(LH_MAX_REPLY_DATA, LH_ERR_INVALID_REPLY);
                if *null_values || !data_problems.is_empty() {
                    // NULL values, or a data pointer the library must refuse unread.
                    let vp = if *null_values {
                        ptr::null()
                    } else {
                        values.as_ptr()
                    };
                    // SAFETY: values NULL or valid; data NULL or refused before reading.
                    let st =
                        unsafe { lh_io_reply(h, now, id, vp, values.len(), data.ptr(), data.len) };
                    let mut problems = data_problems;
                    if *null_values {
                        problems.push(LH_ERR_NULL_ARGUMENT);
                    }
                    expect_status("lh_io_reply(refused)", st, &problems);
                    self.note(st);
                    return;
                }
                let bytes = data.bytes().unwrap_or(&[]).to_vec();
                self.reply("lh_io_reply", now, id, &values, &bytes);
            }
            FOp::Failed {
                time,
                req,
                kind,
                message,
            } => {
                let now = self.time(*time);
                let id = self.req(*req);
                let kind = enum_of(*kind, 2);
                let message = arg_of(message);
                self.failed("lh_io_failed", now, id, kind, &message);
            }
            FOp::Message {
                time,
                channel,
                payload,
            } => {
                let now = self.time(*time);
                let (channel, payload) = (arg_of(channel), arg_of(payload));
                self.message("lh_io_message", now, &channel, &payload);
            }
            FOp::Connection {
                time,
                connection,
                event,
                channel,
            } => {
                let now = self.time(*time);
                let (conn, ev) = (enum_of(*connection, 2), enum_of(*event, 3));
                let channel = arg_of(channel);
                // SAFETY: live handle; channel NULL or valid (oversized refused unread).
                let st = unsafe { lh_io_connection(h, now, conn, ev, channel.ptr(), channel.len) };
                let mut problems = Vec::new();
                if !(LH_CONNECTION_COMMANDS..=LH_CONNECTION_NOTIFY).contains(&conn) {
                    problems.push(LH_ERR_INVALID_ENUM);
                }
                let event = match ev {
                    LH_CONNECTION_REOPENED => Some(ConnectionEvent::Reopened),
                    LH_CONNECTION_SUBSCRIBED => Some(ConnectionEvent::Subscribed),
                    LH_CONNECTION_UNSUBSCRIBED => Some(ConnectionEvent::Unsubscribed),
                    _ => {
                        problems.push(LH_ERR_INVALID_ENUM);
                        None
                    }
                };
                problems.extend(channel.optional_problems(LH_MAX_REPLY_DATA, LH_ERR_INVALID_REPLY));
                let ch = channel.bytes().unwrap_or(&[]).to_vec();
                self.check("lh_io_connection", st, &problems, |s| {
                    let event = event.expect("a known event");
                    s.proto
                        .handle_connection(&mut s.core, now, conn, event, &ch)
                        .map_err(|_| LH_ERR_WRONG_ANSWER)
                });
            }
            FOp::WrongAnswer {
                time,
                req,
                status,
                body,
                stream,
            } => {
                let now = self.time(*time);
                let id = self.req(*req);
                let body = arg_of(body);
                let mut problems = Vec::new();
                // SAFETY: live handle; body NULL or valid (oversized refused unread).
                let st = unsafe {
                    if *stream {
                        lh_io_stream_message(h, now, id, body.ptr(), body.len)
                    } else {
                        if !(100..=599).contains(status) {
                            problems.push(LH_ERR_INVALID_REPLY);
                        }
                        lh_io_http_reply(h, now, id, u32::from(*status), body.ptr(), body.len)
                    }
                };
                problems.extend(body.optional_problems(LH_MAX_REPLY_DATA, LH_ERR_INVALID_REPLY));
                if problems.is_empty() {
                    problems.push(LH_ERR_WRONG_ANSWER);
                }
                expect_status("lh_io_http_reply / stream_message", st, &problems);
                self.note(st);
            }
            FOp::StatusRequest { time, name, nulls } => {
                let now = self.time(*time);
                let name = arg_of(name);
                let mut out = 0xDEAD_u64;
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
                // SAFETY: pointers NULL or valid (oversized refused unread).
                let st = unsafe { lh_status_request(hp, now, name.ptr(), name.len, outp) };
                if hp.is_null() {
                    expect_status("lh_status_request(NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
                    return;
                }
                let mut problems = name.required_problems(MAX_NAME_LEN, LH_ERR_NAME_TOO_LONG);
                if outp.is_null() {
                    problems.push(LH_ERR_NULL_ARGUMENT);
                }
                let text = name
                    .bytes()
                    .map(|b| std::str::from_utf8(b).map(str::to_owned));
                if let Some(Err(_)) = &text {
                    problems.push(LH_ERR_INVALID_UTF8);
                }
                let mut got = None;
                self.check("lh_status_request", st, &problems, |s| {
                    let name = text.expect("a name").expect("UTF-8");
                    let id = s
                        .proto
                        .request_status(&mut s.core, now, &name)
                        .map_err(|e| status_of(&e))?;
                    got = Some(id);
                    Ok(())
                });
                match got {
                    Some(id) if st == LH_OK => assert_eq!(out, id, "ffi: status request id"),
                    _ => assert_eq!(out, 0xDEAD, "ffi: lh_status_request wrote out on error"),
                }
            }
            FOp::PollStatus { struct_size } => {
                // SAFETY: plain data with NULL pointers; zeroed is valid.
                let blank: lh_lock_status = unsafe { std::mem::zeroed() };
                let (mut buf, sz) = sized_buf(blank, *struct_size);
                // SAFETY: struct_size is the first u32 of the buffer.
                unsafe { *buf.as_mut_ptr().cast::<u32>() = sz };
                let p = buf.as_mut_ptr().cast::<lh_lock_status>();
                // SAFETY: the buffer holds an lh_lock_status (or more).
                let st = unsafe { lh_poll_status(h, p) };
                if (sz as usize) < std::mem::size_of::<lh_lock_status>() {
                    expect_status("lh_poll_status", st, &[LH_ERR_STRUCT_SIZE]);
                    self.note(st);
                    return;
                }
                expect_status("lh_poll_status", st, &[LH_OK]);
                // SAFETY: written by the library.
                let got = unsafe { ptr::read(p) };
                let want = self.shadow.proto.poll_status();
                let host = take(got.holder_host, got.holder_host_len, "holder_host");
                let error = take(got.error, got.error_len, "error");
                match want {
                    None => assert_eq!(got.id, 0, "ffi: lh_poll_status answered nothing"),
                    Some((id, Ok(ls))) => {
                        assert_eq!(
                            (got.id, got.ok, got.held),
                            (id, 1, u32::from(ls.held)),
                            "ffi: lh_poll_status"
                        );
                        assert_eq!(
                            (
                                got.fencing_token,
                                got.remaining_ttl_ms,
                                got.last_fencing_token,
                                got.held_for_ms
                            ),
                            (
                                ls.fencing_token.unwrap_or(0),
                                ls.remaining_ttl_ms.unwrap_or(0),
                                ls.last_fencing_token.unwrap_or(0),
                                ls.held_for_ms.unwrap_or(0)
                            ),
                            "ffi: lh_poll_status"
                        );
                        assert!(host.is_empty() && error.is_empty());
                        self.features |= 1 << 16;
                    }
                    Some((id, Err(e))) => {
                        assert_eq!((got.id, got.ok), (id, 0), "ffi: lh_poll_status");
                        assert_eq!(error, e.as_bytes(), "ffi: lh_poll_status error");
                        self.features |= 1 << 17;
                    }
                }
            }
            FOp::Close { time } => {
                let now = self.time(*time);
                // SAFETY: live handle.
                let st = unsafe { lh_io_close(h, now) };
                self.check("lh_io_close", st, &[], |s| {
                    s.proto.close(&mut s.core, now);
                    Ok(())
                });
            }
        }
    }

    /// Runs every open request on the memory service; its answers and notifications go to
    /// the handle and the shadow alike.
    fn serve(&mut self, time: Time) {
        let now = self.time(time);
        for (id, args) in std::mem::take(&mut self.open) {
            let argv: Vec<lh_bytes> = args
                .iter()
                .map(|a| lh_bytes {
                    ptr: a.as_ptr(),
                    len: a.len(),
                })
                .collect();
            let mut a = lh_memory_answer {
                struct_size: std::mem::size_of::<lh_memory_answer>() as u32,
                dropped: 0,
                values: ptr::null(),
                nvalues: 0,
                data: ptr::null(),
                data_len: 0,
            };
            // SAFETY: live service; argv valid for the call.
            let st = unsafe {
                lh_memory_service_call(
                    self.svc,
                    self.conn,
                    now,
                    argv.as_ptr(),
                    argv.len() as u32,
                    &mut a,
                )
            };
            expect_status("lh_memory_service_call", st, &[LH_OK]);
            if a.dropped != 0 {
                let none = arg_of(&BufChoice::Null(0));
                self.failed(
                    "lh_io_failed(dropped)",
                    now,
                    id,
                    LH_FAILURE_TRANSPORT,
                    &none,
                );
            } else {
                let values = take(a.values, a.nvalues, "answer values");
                let data = take(a.data, a.data_len, "answer data");
                self.reply("lh_io_reply(service)", now, id, &values, &data);
                self.features |= 1 << 18;
            }
            self.notify(now);
        }
        self.notify(now);
    }

    /// Hands every release notification of the connection to the handle and the shadow.
    fn notify(&mut self, now: u64) {
        for _ in 0..1_000 {
            let (mut p, mut n) = (ptr::null(), 0usize);
            // SAFETY: live service; valid out-pointers.
            let st =
                unsafe { lh_memory_service_poll_released(self.svc, self.conn, &mut p, &mut n) };
            expect_status("lh_memory_service_poll_released", st, &[LH_OK]);
            if p.is_null() {
                return;
            }
            let name = take(p, n, "released name");
            let channel = Arg {
                len: name.len(),
                data: name,
                null: false,
            };
            let none = arg_of(&BufChoice::Null(0));
            self.message("lh_io_message(service)", now, &channel, &none);
            self.features |= 1 << 19;
        }
        panic!("ffi: the service's notifications do not drain");
    }

    fn poll_null(&mut self) {
        let h = self.h;
        // SAFETY: NULL pointers are documented errors.
        let st = unsafe { lh_poll_event(h, ptr::null_mut()) };
        expect_status("lh_poll_event(out NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
        self.note(st);
        // SAFETY: as above.
        let st = unsafe { lh_io_poll(h, ptr::null_mut()) };
        expect_status("lh_io_poll(out NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
        self.note(st);
        let mut e = lh_event::default();
        // SAFETY: NULL handle is an error.
        let st = unsafe { lh_poll_event(ptr::null_mut(), &mut e) };
        expect_status("lh_poll_event(NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
        let mut r = std::mem::MaybeUninit::<lh_io_request>::uninit();
        // SAFETY: NULL handle is an error.
        let st = unsafe { lh_io_poll(ptr::null_mut(), r.as_mut_ptr()) };
        expect_status("lh_io_poll(NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
        // SAFETY: NULL handle is an error; free(NULL) is a no-op.
        unsafe {
            let mut d = 0u64;
            let st = lh_poll_timeout(ptr::null_mut(), &mut d);
            expect_status("lh_poll_timeout(NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
            let st = lh_timeout(ptr::null_mut(), 0);
            expect_status("lh_timeout(NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
            let st = lh_io_close(ptr::null_mut(), 0);
            expect_status("lh_io_close(NULL)", st, &[LH_ERR_NULL_ARGUMENT]);
            lh_client_free(ptr::null_mut());
            let e = CStr::from_ptr(lh_client_last_error(ptr::null()));
            assert!(e.to_bytes().is_empty());
            let e = CStr::from_ptr(lh_backend_last_error(ptr::null_mut()));
            assert!(e.to_bytes().is_empty());
        }
        // The backend's last error is the shadow protocol's.
        // SAFETY: live handle; NUL-terminated, copied at once.
        let got = unsafe { CStr::from_ptr(lh_backend_last_error(h)) }
            .to_bytes()
            .to_vec();
        let want = self.shadow.proto.last_error().replace('\0', "\\0");
        assert_eq!(got, want.as_bytes(), "ffi: lh_backend_last_error");
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
        let core = &self.shadow.core;

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
            match core.lease_state(LeaseId(id)) {
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
            match core.lease_info(LeaseId(id)) {
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
                core.fencing_token(LeaseId(id))
            } else {
                core.valid_until(LeaseId(id))
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
            match core.is_held(LeaseId(id), now) {
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
        const WORDS: usize = std::mem::size_of::<lh_counters>() / 8;
        let blank = [0xAAu64; WORDS];
        let (mut buf, sz) = sized_buf(blank, size);
        // SAFETY: struct_size is the first u32 of the buffer.
        unsafe { *buf.as_mut_ptr().cast::<u32>() = sz };
        let cp = if null_out {
            ptr::null_mut()
        } else {
            buf.as_mut_ptr().cast::<lh_counters>()
        };
        // SAFETY: pointers NULL or valid for struct_size bytes (the buffer holds the struct).
        let st = unsafe { lh_counters_get(hp, cp) };
        if null_problem.is_empty() {
            if (sz as usize) < LH_COUNTERS_V1_SIZE {
                expect_status("lh_counters_get", st, &[LH_ERR_STRUCT_SIZE]);
            } else {
                expect_status("lh_counters_get", st, &[LH_OK]);
                // SAFETY: filled by the library (up to struct_size; the buffer holds it all).
                let c = unsafe { ptr::read(buf.as_ptr().cast::<lh_counters>()) };
                let k = core.counters();
                let full = std::mem::size_of::<lh_counters>();
                assert_eq!(
                    c.struct_size as usize,
                    (sz as usize).min(full),
                    "ffi: struct_size"
                );
                if (sz as usize) >= full {
                    let Protocol::Memory(p) = &self.shadow.proto else {
                        unreachable!("a memory protocol");
                    };
                    let b = p.counters();
                    assert_eq!(
                        [c.renewals_requested, c.releases_confirmed, c.releases_lost],
                        [k.renewals_requested, k.releases_confirmed, k.releases_lost],
                        "ffi: lh_counters_get (added fields)"
                    );
                    assert_eq!(
                        [
                            c.backend_requests,
                            c.backend_error_replies,
                            c.backend_garbage_replies,
                            c.backend_stale_replies,
                            c.backend_transport_failures,
                            c.backend_wakeups,
                            c.backend_ignored_messages,
                            c.redis_script_calls,
                            c.sql_migrations,
                            c.etcd_txns,
                            c.stream_opens,
                            c.stream_closes,
                            c.stream_late_answers,
                            c.sentinel_lookups,
                            c.cluster_refreshes,
                            c.cluster_redirects,
                        ],
                        [
                            b.requests,
                            b.error_replies,
                            b.garbage_replies,
                            b.stale_replies,
                            b.transport_failures,
                            b.wakeups,
                            b.ignored_messages,
                            0,
                            0,
                            0,
                            0,
                            0,
                            0,
                            0,
                            0,
                            0,
                        ],
                        "ffi: lh_counters_get (backend fields)"
                    );
                } else if (sz as usize) <= std::mem::offset_of!(lh_counters, sentinel_lookups) {
                    assert_eq!(c.sentinel_lookups, 0xAA, "ffi: wrote past struct_size");
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

    /// Drains the handle's and the shadow's requests, then their events, comparing every
    /// field.
    fn compare_drain(&mut self) {
        for n in 0.. {
            assert!(n < 100_000, "ffi: requests do not drain");
            let mut r = std::mem::MaybeUninit::<lh_io_request>::uninit();
            // SAFETY: live handle, valid out.
            let st = unsafe { lh_io_poll(self.h, r.as_mut_ptr()) };
            expect_status("lh_io_poll", st, &[LH_OK]);
            // SAFETY: written on LH_OK.
            let r = unsafe { r.assume_init() };
            let argv = take(r.argv, r.argc as usize, "argv");
            let args: Vec<Vec<u8>> = argv
                .iter()
                .map(|b| take(b.ptr, b.len, "argument"))
                .collect();
            let Protocol::Memory(p) = &mut self.shadow.proto else {
                unreachable!("a memory protocol");
            };
            let want = p
                .poll_request(&mut self.shadow.core)
                .map(|q| (q.id, q.args.to_vec()));
            let Some((id, want_args)) = want else {
                assert_eq!(
                    (r.kind, r.id, r.argc),
                    (LH_IO_NONE, 0, 0),
                    "ffi: a request the core does not have"
                );
                break;
            };
            assert_eq!(
                (r.kind, r.connection, r.id),
                (LH_IO_COMMAND, LH_CONNECTION_COMMANDS, id),
                "ffi: polled request differs from the core's"
            );
            assert_eq!(args, want_args, "ffi: request arguments differ");
            assert!(r.statements.is_null() && r.params.is_null() && r.data.is_null());
            assert!(r.method.is_null() && r.path.is_null() && r.authorization.is_null());
            self.features |= match args[0].as_slice() {
                b"ACQUIRE" => 1 << 12,
                b"RENEW" => 1 << 13,
                b"RELEASE" => 1 << 14,
                _ => 1 << 15,
            };
            self.requests.push(id);
            if self.requests.len() > 64 {
                self.requests.remove(0);
            }
            self.open.push((id, args));
            if self.open.len() > 64 {
                self.open.remove(0);
            }
        }
        for n in 0.. {
            assert!(n < 100_000, "ffi: events do not drain");
            let mut e = lh_event {
                kind: 0xAA,
                ..lh_event::default()
            };
            // SAFETY: live handle, valid out.
            let st = unsafe { lh_poll_event(self.h, &mut e) };
            expect_status("lh_poll_event", st, &[LH_OK]);
            let s = &mut self.shadow;
            let want = event_of(s.proto.poll_event(&mut s.core));
            assert_eq!(e, want, "ffi: polled event differs from the core's");
            if e.kind == LH_EVENT_NONE {
                break;
            }
            self.features |= 1 << e.kind;
        }
    }
}
