//! Drives the C ABI (`leasehold::ffi::lh_*`) from Rust with every hostile input:
//! NULL for every pointer parameter, invalid UTF-8 and oversized names, zero and
//! negative-as-huge TTLs, unknown lease ids, unknown enum values, results for unknown or
//! already-answered request ids, double release, time running backwards, and use after a
//! poisoning panic. Each yields its documented code and leaves the client usable (except
//! poisoning). Also checks the header's version macros against Cargo.toml.
//!
//! Calling `extern "C"` functions with raw pointers needs `unsafe`; every block here passes
//! pointers to live locals, which is exactly the contract a C caller must honour.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::ptr::{null, null_mut};

use leasehold::ffi::*;

const MS: u64 = 1_000_000;
const SEED: [u8; 32] = [9; 32];
const NAME: &[u8] = b"orders";

/// Owns a handle for one test and frees it on drop.
struct H(*mut lh_client);

impl Drop for H {
    fn drop(&mut self) {
        // SAFETY: the handle came from lh_client_new and is not used after drop.
        unsafe { lh_client_free(self.0) }
    }
}

fn config() -> lh_config {
    let mut cfg = MaybeUninit::<lh_config>::uninit();
    // SAFETY: valid out-pointer; lh_config_default fills every field.
    unsafe {
        lh_config_default(cfg.as_mut_ptr());
        cfg.assume_init()
    }
}

fn opts(ttl_ms: u64) -> lh_acquire_options {
    let mut o = MaybeUninit::<lh_acquire_options>::uninit();
    // SAFETY: valid out-pointer; the function fills every field.
    let mut o = unsafe {
        lh_acquire_options_default(o.as_mut_ptr());
        o.assume_init()
    };
    o.ttl_ms = ttl_ms;
    o
}

fn client() -> H {
    let cfg = config();
    let mut c = null_mut();
    // SAFETY: valid pointers to locals.
    let st = unsafe { lh_client_new(&cfg, SEED.as_ptr(), SEED.len(), &mut c) };
    assert_eq!(st, LH_OK);
    assert!(!c.is_null());
    H(c)
}

fn last_error(h: &H) -> String {
    // SAFETY: live handle; the returned string is copied at once.
    unsafe { CStr::from_ptr(lh_client_last_error(h.0)) }
        .to_string_lossy()
        .into_owned()
}

fn name_of(st: lh_status) -> String {
    // SAFETY: lh_status_str returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(lh_status_str(st)) }
        .to_string_lossy()
        .into_owned()
}

#[track_caller]
fn expect(got: lh_status, want: lh_status) {
    assert_eq!(got, want, "got {}, want {}", name_of(got), name_of(want));
}

fn acquire(h: &H, now: u64, name: &[u8], o: &lh_acquire_options) -> Result<u64, lh_status> {
    let mut lease = 0;
    // SAFETY: pointers to live locals/slices.
    let st = unsafe { lh_acquire(h.0, now, name.as_ptr(), name.len(), o, &mut lease) };
    if st == LH_OK { Ok(lease) } else { Err(st) }
}

/// A polled output with its borrowed bytes copied out.
#[derive(Debug, Clone)]
struct Out {
    raw: lh_output,
    name: Vec<u8>,
    token: Vec<u8>,
    backend_data: Vec<u8>,
}

fn copy(ptr: *const u8, len: usize) -> Vec<u8> {
    if ptr.is_null() {
        assert_eq!(len, 0, "NULL pointer with non-zero length");
        Vec::new()
    } else {
        // SAFETY: the library guarantees ptr/len are valid until the next call on the handle.
        unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec()
    }
}

fn poll(h: &H) -> Option<Out> {
    let mut o = MaybeUninit::<lh_output>::uninit();
    // SAFETY: valid out-pointer; written on LH_OK.
    expect(unsafe { lh_poll_output(h.0, o.as_mut_ptr()) }, LH_OK);
    // SAFETY: LH_OK means the struct was written.
    let raw = unsafe { o.assume_init() };
    if raw.kind == LH_OUTPUT_NONE {
        return None;
    }
    Some(Out {
        name: copy(raw.name, raw.name_len),
        token: copy(raw.token, raw.token_len),
        backend_data: copy(raw.backend_data, raw.backend_data_len),
        raw,
    })
}

fn drain(h: &H) -> Vec<Out> {
    let mut v = Vec::new();
    while let Some(o) = poll(h) {
        v.push(o);
        assert!(v.len() < 10_000, "output queue does not drain");
    }
    v
}

fn find(v: &[Out], kind: u32) -> Option<&Out> {
    v.iter().find(|o| o.raw.kind == kind)
}

fn counters(h: &H) -> lh_counters {
    // SAFETY: lh_counters is plain integers; zeroed is a valid value.
    let mut k: lh_counters = unsafe { std::mem::zeroed() };
    k.struct_size = size_of::<lh_counters>() as u32;
    // SAFETY: valid pointer.
    expect(unsafe { lh_counters_get(h.0, &mut k) }, LH_OK);
    k
}

fn grant(h: &H, now: u64, req: u64, fence: u64, ttl_ms: u64, data: &[u8]) -> lh_status {
    // SAFETY: slice pointer valid for the call.
    unsafe {
        lh_acquire_result(
            h.0,
            now,
            req,
            LH_ACQUIRE_GRANTED,
            fence,
            ttl_ms,
            LH_NO_RETRY_HINT,
            data.as_ptr(),
            data.len(),
        )
    }
}

/// Acquire + grant; returns the lease id.
fn held(h: &H, now: u64, ttl_ms: u64, fence: u64) -> u64 {
    let lease = acquire(h, now, NAME, &opts(ttl_ms)).expect("acquire");
    let a = poll(h).expect("acquire command");
    assert_eq!(a.raw.kind, LH_OUTPUT_ACQUIRE);
    expect(
        grant(h, now + MS, a.raw.request_id, fence, ttl_ms, &[]),
        LH_OK,
    );
    let ev = drain(h);
    let acq = find(&ev, LH_OUTPUT_ACQUIRED).expect("acquired");
    assert_eq!((acq.raw.lease_id, acq.raw.fencing_token), (lease, fence));
    lease
}

fn state(h: &H, lease: u64) -> Result<u32, lh_status> {
    let mut s = 0;
    // SAFETY: valid pointer.
    let st = unsafe { lh_lease_state(h.0, lease, &mut s) };
    if st == LH_OK { Ok(s) } else { Err(st) }
}

/// Feeds timeouts at the core's deadlines until an output of `kind` appears (bounded).
fn advance_until(h: &H, now: &mut u64, kind: u32) -> Option<Out> {
    for _ in 0..50 {
        let mut d = 0;
        // SAFETY: valid pointer.
        expect(unsafe { lh_poll_timeout(h.0, &mut d) }, LH_OK);
        if d == LH_NO_DEADLINE {
            return None;
        }
        *now = (*now).max(d);
        // SAFETY: live handle.
        expect(unsafe { lh_timeout(h.0, *now) }, LH_OK);
        if let Some(o) = drain(h).into_iter().find(|o| o.raw.kind == kind) {
            return Some(o);
        }
    }
    None
}

// ---------------------------------------------------------------------------------------

fn header() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/leasehold.h"))
        .expect("include/leasehold.h")
}

fn header_define(h: &str, name: &str) -> String {
    let prefix = format!("#define {name} ");
    h.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{name} not in header"))
        .trim()
        .to_owned()
}

#[test]
fn version_macros_match_cargo_toml_and_library() {
    let manifest =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
    // The first `version = "..."` line is the one in [package].
    let cargo_version = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("version = "))
        .expect("version in Cargo.toml")
        .trim_matches('"')
        .to_owned();
    let h = header();
    assert_eq!(
        header_define(&h, "LH_VERSION"),
        format!("\"{cargo_version}\"")
    );
    assert_eq!(LH_VERSION, cargo_version);
    assert_eq!(env!("CARGO_PKG_VERSION"), cargo_version);
    // SAFETY: static NUL-terminated string.
    let lib = unsafe { CStr::from_ptr(lh_version()) }.to_str().unwrap();
    assert_eq!(lib, cargo_version);
    assert_eq!(
        header_define(&h, "LH_ABI_VERSION"),
        LH_ABI_VERSION.to_string()
    );
    assert_eq!(lh_abi_version(), LH_ABI_VERSION);
}

#[test]
fn every_status_in_the_header_has_its_name() {
    let h = header();
    let mut seen = 0;
    for line in h.lines() {
        let Some(rest) = line.strip_prefix("#define ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(value)) = (parts.next(), parts.next()) else {
            continue;
        };
        if name == "LH_OK" || name.starts_with("LH_ERR_") {
            let code: u32 = value.parse().expect("numeric status");
            assert_eq!(name_of(code), name);
            seen += 1;
        }
    }
    assert_eq!(seen, 24, "LH_OK + 23 error codes");
    for unknown in [22, 99, 899, 902, u32::MAX] {
        assert_eq!(name_of(unknown), "LH_UNKNOWN_STATUS");
    }
}

#[test]
fn defaults_and_null_defaults() {
    let cfg = config();
    assert_eq!(cfg.struct_size as usize, size_of::<lh_config>());
    assert_eq!(cfg.notifications, 1);
    assert_eq!(cfg.fail_budget, 0, "the time budget");
    let o = opts(LH_DEFAULT_TTL_MS);
    assert_eq!((o.flags, o.wait_ns), (0, 0));
    // SAFETY: NULL is documented as ignored.
    unsafe {
        lh_config_default(null_mut());
        lh_acquire_options_default(null_mut());
    }
}

#[test]
fn client_new_hostile_arguments() {
    let mut cfg = config();
    let sentinel = 0x1234usize as *mut lh_client;
    let mut c = sentinel;
    // SAFETY: every non-NULL pointer is valid; the library must reject the rest.
    unsafe {
        expect(
            lh_client_new(null(), SEED.as_ptr(), 32, &mut c),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_client_new(&cfg, null(), 32, &mut c),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(lh_client_new(&cfg, null(), 0, &mut c), LH_ERR_NULL_ARGUMENT);
        expect(
            lh_client_new(&cfg, SEED.as_ptr(), 32, null_mut()),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_client_new(&cfg, SEED.as_ptr(), 15, &mut c),
            LH_ERR_SEED_TOO_SHORT,
        );
        expect(
            lh_client_new(&cfg, SEED.as_ptr(), 0, &mut c),
            LH_ERR_SEED_TOO_SHORT,
        );
        expect(
            lh_client_new(&cfg, SEED.as_ptr(), usize::MAX, &mut c),
            LH_ERR_INVALID_CONFIG,
        );
        expect(
            lh_client_new(&cfg, SEED.as_ptr(), LH_MAX_SEED_LEN + 1, &mut c),
            LH_ERR_INVALID_CONFIG,
        );
        cfg.notifications = 7;
        expect(
            lh_client_new(&cfg, SEED.as_ptr(), 32, &mut c),
            LH_ERR_INVALID_CONFIG,
        );
        cfg = config();
        cfg.max_leases = 0;
        expect(
            lh_client_new(&cfg, SEED.as_ptr(), 32, &mut c),
            LH_ERR_INVALID_CONFIG,
        );
        cfg = config();
        cfg.struct_size = 0;
        expect(
            lh_client_new(&cfg, SEED.as_ptr(), 32, &mut c),
            LH_ERR_STRUCT_SIZE,
        );
        cfg.struct_size = size_of::<lh_config>() as u32 - 1;
        expect(
            lh_client_new(&cfg, SEED.as_ptr(), 32, &mut c),
            LH_ERR_STRUCT_SIZE,
        );
        assert_eq!(c, sentinel, "out-param written on failure");
        lh_client_free(null_mut());
    }
}

#[test]
fn null_handle_everywhere() {
    let o = opts(1000);
    let (mut u64v, mut u32v, mut b) = (5u64, 5u32, false);
    let mut out = MaybeUninit::<lh_output>::uninit();
    // SAFETY: plain integers; zeroed is valid.
    let mut info: lh_lease_info = unsafe { std::mem::zeroed() };
    info.struct_size = size_of::<lh_lease_info>() as u32;
    // SAFETY: as above.
    let mut k: lh_counters = unsafe { std::mem::zeroed() };
    k.struct_size = size_of::<lh_counters>() as u32;
    let n = null_mut();
    // SAFETY: a NULL handle is documented as an error; other pointers are valid.
    unsafe {
        expect(lh_client_reseed(n, SEED.as_ptr(), 32), LH_ERR_NULL_ARGUMENT);
        expect(
            lh_acquire(n, 0, NAME.as_ptr(), 6, &o, &mut u64v),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(lh_release(n, 0, 1), LH_ERR_NULL_ARGUMENT);
        expect(
            lh_acquire_result(n, 0, 1, LH_ACQUIRE_GRANTED, 1, 1000, 0, null(), 0),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_renew_result(n, 0, 1, LH_RENEW_RENEWED),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_release_result(n, 0, 1, LH_RELEASE_RELEASED),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(lh_released(n, 0, NAME.as_ptr(), 6), LH_ERR_NULL_ARGUMENT);
        expect(lh_timeout(n, 0), LH_ERR_NULL_ARGUMENT);
        expect(lh_poll_output(n, out.as_mut_ptr()), LH_ERR_NULL_ARGUMENT);
        expect(lh_poll_timeout(n, &mut u64v), LH_ERR_NULL_ARGUMENT);
        expect(lh_lease_state(n, 1, &mut u32v), LH_ERR_NULL_ARGUMENT);
        expect(lh_lease_info_get(n, 1, &mut info), LH_ERR_NULL_ARGUMENT);
        expect(lh_fencing_token(n, 1, &mut u64v), LH_ERR_NULL_ARGUMENT);
        expect(lh_valid_until(n, 1, &mut u64v), LH_ERR_NULL_ARGUMENT);
        expect(lh_is_held(n, 1, 0, &mut b), LH_ERR_NULL_ARGUMENT);
        expect(lh_counters_get(n, &mut k), LH_ERR_NULL_ARGUMENT);
        #[cfg(feature = "testing")]
        expect(lh_client_debug_panic(n), LH_ERR_NULL_ARGUMENT);
        assert_eq!(CStr::from_ptr(lh_client_last_error(n)).to_bytes(), b"");
    }
    assert_eq!((u64v, u32v, b), (5, 5, false));
}

#[test]
fn null_out_params_change_nothing() {
    let h = client();
    let o = opts(1000);
    // SAFETY: NULL out-params are documented errors; other pointers valid.
    unsafe {
        expect(
            lh_acquire(h.0, 0, NAME.as_ptr(), 6, &o, null_mut()),
            LH_ERR_NULL_ARGUMENT,
        );
        assert_eq!(counters(&h).acquires_sent, 0);
        assert!(last_error(&h).contains("out_lease"));
        expect(lh_poll_timeout(h.0, null_mut()), LH_ERR_NULL_ARGUMENT);
        expect(lh_lease_state(h.0, 1, null_mut()), LH_ERR_NULL_ARGUMENT);
        expect(lh_lease_info_get(h.0, 1, null_mut()), LH_ERR_NULL_ARGUMENT);
        expect(lh_fencing_token(h.0, 1, null_mut()), LH_ERR_NULL_ARGUMENT);
        expect(lh_valid_until(h.0, 1, null_mut()), LH_ERR_NULL_ARGUMENT);
        expect(lh_is_held(h.0, 1, 0, null_mut()), LH_ERR_NULL_ARGUMENT);
        expect(lh_counters_get(h.0, null_mut()), LH_ERR_NULL_ARGUMENT);
    }
    acquire(&h, 0, NAME, &o).unwrap();
    // SAFETY: NULL out is a documented error and must not consume the output.
    expect(
        unsafe { lh_poll_output(h.0, null_mut()) },
        LH_ERR_NULL_ARGUMENT,
    );
    assert_eq!(poll(&h).unwrap().raw.kind, LH_OUTPUT_ACQUIRE);
}

#[test]
fn hostile_names_and_options_leave_the_client_unchanged() {
    let h = client();
    let o = opts(1000);
    let long = vec![b'a'; LH_MAX_NAME_LEN + 1];
    let cases: &[(&[u8], lh_status)] = &[
        (b"\xff", LH_ERR_INVALID_UTF8),
        (b"a\xc3\x28", LH_ERR_INVALID_UTF8),
        (b"\xc0\xaf", LH_ERR_INVALID_UTF8),     // overlong '/'
        (b"\xed\xa0\x80", LH_ERR_INVALID_UTF8), // surrogate
        (b"", LH_ERR_EMPTY_NAME),
        (&long, LH_ERR_NAME_TOO_LONG),
        (b"a\0b", LH_ERR_NAME_HAS_NUL),
    ];
    for (name, want) in cases {
        assert_eq!(acquire(&h, 0, name, &o), Err(*want), "name {name:?}");
        assert!(!last_error(&h).is_empty());
    }
    let mut lease = 77u64;
    // SAFETY: NULL name / opts are documented errors; lengths beyond the limit are never read.
    unsafe {
        expect(
            lh_acquire(h.0, 0, null(), 6, &o, &mut lease),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_acquire(h.0, 0, null(), 0, &o, &mut lease),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_acquire(h.0, 0, NAME.as_ptr(), 6, null(), &mut lease),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_acquire(h.0, 0, NAME.as_ptr(), usize::MAX, &o, &mut lease),
            LH_ERR_NAME_TOO_LONG,
        );
        expect(
            lh_acquire(h.0, 0, NAME.as_ptr(), 1 << 62, &o, &mut lease),
            LH_ERR_NAME_TOO_LONG,
        );
    }
    for ttl in [0, u64::MAX, u64::MAX / 1_000_000, 604_800_001] {
        assert_eq!(
            acquire(&h, 0, NAME, &opts(ttl)),
            Err(LH_ERR_INVALID_TTL),
            "ttl {ttl}"
        );
    }
    for flags in [4, 6, 0x8000_0000, u32::MAX] {
        let mut bad = opts(1000);
        bad.flags = flags;
        assert_eq!(acquire(&h, 0, NAME, &bad), Err(LH_ERR_INVALID_ENUM));
    }
    for size in [0, 4, size_of::<lh_acquire_options>() as u32 - 1] {
        let mut bad = opts(1000);
        bad.struct_size = size;
        assert_eq!(acquire(&h, 0, NAME, &bad), Err(LH_ERR_STRUCT_SIZE));
    }
    assert_eq!(lease, 77);
    let k = counters(&h);
    assert_eq!((k.acquires_sent, k.live_leases), (0, 0));
    assert!(poll(&h).is_none());
    // Still usable, and the longest legal name works.
    let max = vec![b'z'; LH_MAX_NAME_LEN];
    acquire(&h, 0, &max, &o).unwrap();
    let a = poll(&h).unwrap();
    assert_eq!(a.name, max);
    // Names on both sides of the core's inline limit come out whole.
    let inline = leasehold::INLINE_NAME_LEN;
    for len in [inline - 1, inline, inline + 1] {
        let name = vec![b'q'; len];
        acquire(&h, 0, &name, &o).unwrap();
        assert_eq!(poll(&h).unwrap().name, name);
    }
}

#[test]
fn unknown_lease_ids() {
    let h = client();
    let (mut u64v, mut u32v, mut b) = (3u64, 3u32, true);
    // SAFETY: plain integers; zeroed is valid.
    let mut info: lh_lease_info = unsafe { std::mem::zeroed() };
    info.struct_size = size_of::<lh_lease_info>() as u32;
    for id in [0, 1, 2, 12_345, 1 << 40, u64::MAX] {
        // SAFETY: valid out-pointers.
        unsafe {
            expect(lh_release(h.0, 0, id), LH_ERR_UNKNOWN_LEASE);
            expect(lh_lease_state(h.0, id, &mut u32v), LH_ERR_UNKNOWN_LEASE);
            expect(lh_lease_info_get(h.0, id, &mut info), LH_ERR_UNKNOWN_LEASE);
            expect(lh_fencing_token(h.0, id, &mut u64v), LH_ERR_UNKNOWN_LEASE);
            expect(lh_valid_until(h.0, id, &mut u64v), LH_ERR_UNKNOWN_LEASE);
            expect(lh_is_held(h.0, id, 0, &mut b), LH_ERR_UNKNOWN_LEASE);
        }
    }
    assert_eq!((u64v, u32v, b), (3, 3, true));
    // A live lease next to the garbage still works.
    let lease = held(&h, 0, 3000, 1);
    assert_eq!(state(&h, lease), Ok(LH_STATE_HELD));
}

#[test]
fn unknown_enum_values() {
    let h = client();
    let lease = acquire(&h, 0, NAME, &opts(1000)).unwrap();
    let req = poll(&h).unwrap().raw.request_id;
    for bad in [0, 4, 17, u32::MAX] {
        // SAFETY: valid handle; NULL backend data with length 0 is allowed.
        unsafe {
            expect(
                lh_acquire_result(h.0, MS, req, bad, 1, 1000, 0, null(), 0),
                LH_ERR_INVALID_ENUM,
            );
            expect(lh_renew_result(h.0, MS, req, bad), LH_ERR_INVALID_ENUM);
            expect(lh_release_result(h.0, MS, req, bad), LH_ERR_INVALID_ENUM);
        }
    }
    assert!(last_error(&h).contains("outcome"));
    assert_eq!(state(&h, lease), Ok(LH_STATE_ACQUIRING));
    assert_eq!(counters(&h).stale_results, 0);
    expect(grant(&h, MS, req, 2, 1000, &[]), LH_OK);
    assert_eq!(state(&h, lease), Ok(LH_STATE_HELD));
}

#[test]
fn unknown_and_already_answered_request_ids_are_stale() {
    let h = client();
    let lease = acquire(&h, 0, NAME, &opts(3000)).unwrap();
    let req = poll(&h).unwrap().raw.request_id;
    expect(grant(&h, MS, req, 5, 3000, &[]), LH_OK);
    drain(&h);
    let before = counters(&h).stale_results;
    // SAFETY: valid handle.
    unsafe {
        expect(grant(&h, 2 * MS, req, 6, 3000, &[]), LH_OK); // answered twice
        expect(
            lh_acquire_result(
                h.0,
                2 * MS,
                req,
                LH_ACQUIRE_TRANSPORT_ERROR,
                0,
                0,
                0,
                null(),
                0,
            ),
            LH_OK,
        );
        expect(lh_renew_result(h.0, 2 * MS, req, LH_RENEW_REJECTED), LH_OK); // wrong kind
        expect(
            lh_release_result(h.0, 2 * MS, req, LH_RELEASE_NOT_OWNER),
            LH_OK,
        );
        expect(grant(&h, 2 * MS, 999_999, 7, 3000, &[]), LH_OK); // never issued
        expect(lh_renew_result(h.0, 2 * MS, 0, LH_RENEW_REJECTED), LH_OK);
        expect(
            lh_release_result(h.0, 2 * MS, u64::MAX, LH_RELEASE_RELEASED),
            LH_OK,
        );
    }
    assert_eq!(counters(&h).stale_results, before + 7);
    assert!(poll(&h).is_none());
    let mut fence = 0;
    // SAFETY: valid pointer.
    expect(unsafe { lh_fencing_token(h.0, lease, &mut fence) }, LH_OK);
    assert_eq!(fence, 5);
    assert_eq!(state(&h, lease), Ok(LH_STATE_HELD));
}

#[test]
fn lifecycle_through_the_abi_with_borrowed_bytes() {
    let h = client();
    let data = [0u8, 1, 0xfe, 0xff, b'e', b't', b'c', b'd'];
    let lease = acquire(&h, 0, NAME, &opts(3000)).unwrap();
    let (mut fence, mut vu) = (0u64, 0u64);
    // SAFETY: valid pointers.
    unsafe {
        expect(lh_fencing_token(h.0, lease, &mut fence), LH_ERR_NOT_GRANTED);
        expect(lh_valid_until(h.0, lease, &mut vu), LH_ERR_NOT_GRANTED);
    }
    let a = poll(&h).unwrap();
    assert_eq!(a.raw.kind, LH_OUTPUT_ACQUIRE);
    assert_eq!(
        (a.raw.lease_id, a.raw.ttl_ms, a.raw.reason),
        (lease, 3000, LH_REASON_NONE)
    );
    assert_eq!(a.name, NAME);
    assert_eq!(a.token.len(), 32);
    assert!(
        a.token
            .iter()
            .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
    );
    assert!(a.backend_data.is_empty());
    assert!(poll(&h).is_none());

    expect(grant(&h, MS, a.raw.request_id, 42, 3000, &data), LH_OK);
    let ev = poll(&h).unwrap();
    assert_eq!(ev.raw.kind, LH_OUTPUT_ACQUIRED);
    assert_eq!((ev.raw.lease_id, ev.raw.fencing_token), (lease, 42));
    assert!(ev.raw.valid_until_ns > MS && ev.raw.valid_until_ns <= 3000 * MS);
    assert!(ev.raw.name.is_null() && ev.raw.token.is_null() && ev.raw.request_id == 0);
    let mut held_now = false;
    // SAFETY: valid pointers; lh_lease_info is plain integers.
    unsafe {
        expect(lh_valid_until(h.0, lease, &mut vu), LH_OK);
        assert_eq!(vu, ev.raw.valid_until_ns);
        expect(lh_is_held(h.0, lease, vu - 1, &mut held_now), LH_OK);
        assert!(held_now);
        expect(lh_is_held(h.0, lease, vu, &mut held_now), LH_OK);
        assert!(!held_now);
        let mut info: lh_lease_info = std::mem::zeroed();
        info.struct_size = size_of::<lh_lease_info>() as u32 + 32; // a newer, larger struct
        expect(lh_lease_info_get(h.0, lease, &mut info), LH_OK);
        assert_eq!(info.struct_size as usize, size_of::<lh_lease_info>());
        assert_eq!(
            (info.state, info.holders, info.has_token),
            (LH_STATE_HELD, 1, 1)
        );
        assert_eq!((info.fencing_token, info.valid_until_ns), (42, vu));
    }

    let mut now = MS;
    let r = advance_until(&h, &mut now, LH_OUTPUT_RENEW).expect("renew");
    assert!(now < vu, "renew must come before validity ends");
    assert_eq!((r.raw.lease_id, r.raw.ttl_ms), (lease, 3000));
    assert_eq!(
        (r.name.as_slice(), r.token.as_slice()),
        (NAME, a.token.as_slice())
    );
    assert_eq!(r.backend_data, data);
    // SAFETY: valid handle.
    expect(
        unsafe { lh_renew_result(h.0, now + MS, r.raw.request_id, LH_RENEW_RENEWED) },
        LH_OK,
    );
    drain(&h);
    let mut vu2 = 0;
    // SAFETY: valid pointer.
    expect(unsafe { lh_valid_until(h.0, lease, &mut vu2) }, LH_OK);
    assert!(vu2 > vu);

    // SAFETY: valid handle.
    expect(unsafe { lh_release(h.0, now + 2 * MS, lease) }, LH_OK);
    let outs = drain(&h);
    assert!(find(&outs, LH_OUTPUT_RELEASED).is_some_and(|o| o.raw.lease_id == lease));
    let rel = find(&outs, LH_OUTPUT_RELEASE).expect("release command");
    assert_eq!(
        (rel.token.as_slice(), rel.backend_data.as_slice()),
        (a.token.as_slice(), &data[..])
    );
    assert_eq!(counters(&h).pending_cleanups, 1);
    // SAFETY: valid handle.
    expect(
        unsafe { lh_release_result(h.0, now + 3 * MS, rel.raw.request_id, LH_RELEASE_RELEASED) },
        LH_OK,
    );
    assert_eq!(counters(&h).pending_cleanups, 0);
}

#[test]
fn double_release_is_lease_ended() {
    let h = client();
    let lease = held(&h, 0, 3000, 1);
    // SAFETY: valid handle.
    unsafe {
        expect(lh_release(h.0, 2 * MS, lease), LH_OK);
        drain(&h);
        expect(lh_release(h.0, 3 * MS, lease), LH_ERR_LEASE_ENDED);
    }
    assert!(!last_error(&h).is_empty());
    assert!(poll(&h).is_none(), "no second event or command");
}

#[test]
fn backend_data_hostile_inputs() {
    let h = client();
    let lease = acquire(&h, 0, NAME, &opts(3000)).unwrap();
    let req = poll(&h).unwrap().raw.request_id;
    let big = vec![0u8; LH_MAX_BACKEND_DATA_LEN + 1];
    expect(
        grant(&h, 1, req, 1, 3000, &big),
        LH_ERR_BACKEND_DATA_TOO_LONG,
    );
    // SAFETY: lengths beyond the limit are never read; NULL with a length is rejected.
    unsafe {
        expect(
            lh_acquire_result(
                h.0,
                1,
                req,
                LH_ACQUIRE_GRANTED,
                1,
                3000,
                0,
                big.as_ptr(),
                usize::MAX,
            ),
            LH_ERR_BACKEND_DATA_TOO_LONG,
        );
        expect(
            lh_acquire_result(h.0, 1, req, LH_ACQUIRE_GRANTED, 1, 3000, 0, null(), 5),
            LH_ERR_NULL_ARGUMENT,
        );
    }
    assert_eq!(state(&h, lease), Ok(LH_STATE_ACQUIRING));
    expect(
        grant(&h, 1, req, 1, 3000, &big[..LH_MAX_BACKEND_DATA_LEN]),
        LH_OK,
    );
    assert_eq!(state(&h, lease), Ok(LH_STATE_HELD));
}

#[test]
fn released_notification_and_reseed_hostile_inputs() {
    let h = client();
    // SAFETY: NULL / oversized lengths are documented errors and never dereferenced.
    unsafe {
        expect(lh_released(h.0, 0, null(), 3), LH_ERR_NULL_ARGUMENT);
        expect(
            lh_released(h.0, 0, b"\xfe".as_ptr(), 1),
            LH_ERR_INVALID_UTF8,
        );
        expect(
            lh_released(h.0, 0, NAME.as_ptr(), usize::MAX),
            LH_ERR_NAME_TOO_LONG,
        );
        expect(lh_released(h.0, 0, NAME.as_ptr(), 0), LH_ERR_EMPTY_NAME);
        expect(lh_released(h.0, 0, NAME.as_ptr(), NAME.len()), LH_OK);
        expect(lh_client_reseed(h.0, null(), 32), LH_ERR_NULL_ARGUMENT);
        expect(
            lh_client_reseed(h.0, SEED.as_ptr(), 3),
            LH_ERR_SEED_TOO_SHORT,
        );
        expect(
            lh_client_reseed(h.0, SEED.as_ptr(), usize::MAX),
            LH_ERR_INVALID_CONFIG,
        );
        expect(lh_client_reseed(h.0, SEED.as_ptr(), SEED.len()), LH_OK);
    }
    assert!(poll(&h).is_none());
    held(&h, 0, 3000, 1);
}

#[test]
fn struct_size_of_out_structs() {
    let h = client();
    let lease = held(&h, 0, 3000, 3);
    // SAFETY: plain integers; valid pointers.
    unsafe {
        let mut info: lh_lease_info = std::mem::zeroed();
        info.struct_size = 8;
        info.state = 0xdead;
        expect(lh_lease_info_get(h.0, lease, &mut info), LH_ERR_STRUCT_SIZE);
        assert_eq!(info.state, 0xdead, "written on failure");
        let mut k: lh_counters = std::mem::zeroed();
        k.struct_size = 8;
        k.live_leases = 0xdead;
        expect(lh_counters_get(h.0, &mut k), LH_ERR_STRUCT_SIZE);
        assert_eq!(k.live_leases, 0xdead);
    }
    let k = counters(&h);
    assert_eq!(
        (k.struct_size as usize, k._reserved, k.live_leases),
        (size_of::<lh_counters>(), 0, 1)
    );
}

#[test]
fn time_running_backwards_is_clamped() {
    let h = client();
    let lease = held(&h, 1000 * MS, 3000, 11);
    let before = counters(&h).time_clamped;
    // SAFETY: valid handle.
    unsafe {
        expect(lh_timeout(h.0, 5 * MS), LH_OK);
        expect(lh_timeout(h.0, 0), LH_OK);
        expect(lh_release(h.0, 1, lease), LH_OK);
    }
    assert!(find(&drain(&h), LH_OUTPUT_RELEASED).is_some());
    assert!(counters(&h).time_clamped > before);
}

#[test]
fn rejected_renew_and_silent_service_lose_the_lease() {
    let h = client();
    let mut now = 0;
    let lease = held(&h, now, 3000, 5);
    let r = advance_until(&h, &mut now, LH_OUTPUT_RENEW).expect("renew");
    // SAFETY: valid handle.
    expect(
        unsafe { lh_renew_result(h.0, now + MS, r.raw.request_id, LH_RENEW_REJECTED) },
        LH_OK,
    );
    let outs = drain(&h);
    let lost = find(&outs, LH_OUTPUT_LOST).expect("lost");
    assert_eq!(
        (lost.raw.lease_id, lost.raw.reason),
        (lease, LH_REASON_REJECTED)
    );
    assert!(matches!(
        state(&h, lease),
        Ok(LH_STATE_LOST) | Err(LH_ERR_LEASE_ENDED)
    ));

    let h2 = client();
    let mut now = 0;
    let lease = held(&h2, now, 3000, 5);
    let mut vu = 0;
    // SAFETY: valid pointer.
    expect(unsafe { lh_valid_until(h2.0, lease, &mut vu) }, LH_OK);
    let lost = advance_until(&h2, &mut now, LH_OUTPUT_LOST).expect("lost on its own");
    assert_eq!(lost.raw.lease_id, lease);
    assert!(matches!(
        lost.raw.reason,
        LH_REASON_EXPIRED | LH_REASON_FAIL_BUDGET
    ));
    assert!(now <= vu, "loss detected no later than valid_until");
}

#[test]
fn reentrant_acquire_through_the_abi() {
    let h = client();
    let mut o = opts(3000);
    o.flags = LH_ACQUIRE_REENTRANT;
    let l1 = acquire(&h, 0, NAME, &o).unwrap();
    let req = poll(&h).unwrap().raw.request_id;
    expect(grant(&h, MS, req, 3, 3000, &[]), LH_OK);
    drain(&h);
    let l2 = acquire(&h, 2 * MS, NAME, &o).unwrap();
    assert_eq!(l1, l2);
    let outs = drain(&h);
    assert!(find(&outs, LH_OUTPUT_ACQUIRE).is_none());
    assert!(find(&outs, LH_OUTPUT_ACQUIRED).is_some());
    // SAFETY: valid handle.
    unsafe {
        expect(lh_release(h.0, 3 * MS, l1), LH_OK);
        assert!(drain(&h).is_empty());
        expect(lh_release(h.0, 4 * MS, l1), LH_OK);
    }
    let outs = drain(&h);
    assert!(find(&outs, LH_OUTPUT_RELEASED).is_some() && find(&outs, LH_OUTPUT_RELEASE).is_some());
}

#[test]
fn last_error_is_per_handle() {
    let a = client();
    let b = client();
    assert_eq!(last_error(&a), "");
    assert_eq!(acquire(&a, 0, NAME, &opts(0)), Err(LH_ERR_INVALID_TTL));
    let msg = last_error(&a);
    assert!(msg.contains("TTL"), "{msg}");
    // SAFETY: valid handle.
    expect(unsafe { lh_release(b.0, 0, 777) }, LH_ERR_UNKNOWN_LEASE);
    assert_eq!(last_error(&a), msg, "b's error leaked into a");
    assert_ne!(last_error(&b), msg);
    // The message is kept on the handle, so another thread reads the same text.
    let addr = a.0 as usize;
    let seen = std::thread::spawn(move || {
        // SAFETY: the handle outlives the thread (joined below) and nothing else uses it now.
        unsafe { CStr::from_ptr(lh_client_last_error(addr as *const lh_client)) }
            .to_string_lossy()
            .into_owned()
    })
    .join()
    .unwrap();
    assert_eq!(seen, msg);
}

// lh_client_debug_panic is a test hook: built only with the `testing` feature.
#[cfg(feature = "testing")]
#[test]
fn panic_poisons_only_that_handle() {
    let h = client();
    let other = client();
    let lease = acquire(&h, 0, NAME, &opts(3000)).unwrap();
    let (mut u64v, mut u32v, mut b) = (1u64, 1u32, false);
    let mut out = MaybeUninit::<lh_output>::uninit();
    // SAFETY: plain integers; zeroed is valid.
    let mut info: lh_lease_info = unsafe { std::mem::zeroed() };
    info.struct_size = size_of::<lh_lease_info>() as u32;
    // SAFETY: as above.
    let mut k: lh_counters = unsafe { std::mem::zeroed() };
    k.struct_size = size_of::<lh_counters>() as u32;
    let o = opts(3000);
    // SAFETY: valid handle and pointers; the panic is caught inside the library.
    unsafe {
        expect(lh_client_debug_panic(h.0), LH_ERR_PANIC);
        assert!(last_error(&h).contains("panic"));
        let c = h.0;
        expect(lh_client_debug_panic(c), LH_ERR_POISONED);
        expect(lh_client_reseed(c, SEED.as_ptr(), 32), LH_ERR_POISONED);
        expect(
            lh_acquire(c, 0, NAME.as_ptr(), 6, &o, &mut u64v),
            LH_ERR_POISONED,
        );
        expect(lh_release(c, 0, lease), LH_ERR_POISONED);
        expect(
            lh_acquire_result(c, 0, 1, LH_ACQUIRE_GRANTED, 1, 3000, 0, null(), 0),
            LH_ERR_POISONED,
        );
        expect(lh_renew_result(c, 0, 1, LH_RENEW_RENEWED), LH_ERR_POISONED);
        expect(
            lh_release_result(c, 0, 1, LH_RELEASE_RELEASED),
            LH_ERR_POISONED,
        );
        expect(lh_released(c, 0, NAME.as_ptr(), 6), LH_ERR_POISONED);
        expect(lh_timeout(c, 0), LH_ERR_POISONED);
        expect(lh_poll_output(c, out.as_mut_ptr()), LH_ERR_POISONED);
        expect(lh_poll_timeout(c, &mut u64v), LH_ERR_POISONED);
        expect(lh_lease_state(c, lease, &mut u32v), LH_ERR_POISONED);
        expect(lh_lease_info_get(c, lease, &mut info), LH_ERR_POISONED);
        expect(lh_fencing_token(c, lease, &mut u64v), LH_ERR_POISONED);
        expect(lh_valid_until(c, lease, &mut u64v), LH_ERR_POISONED);
        expect(lh_is_held(c, lease, 0, &mut b), LH_ERR_POISONED);
        expect(lh_counters_get(c, &mut k), LH_ERR_POISONED);
    }
    assert!(last_error(&h).contains("poisoned"));
    assert_eq!((u64v, u32v), (1, 1));
    held(&other, 0, 3000, 4);
}

#[test]
fn free_with_pending_work() {
    let h = client();
    for i in 0..200u64 {
        let name = format!("lock-{i}");
        acquire(&h, i, name.as_bytes(), &opts(3000)).unwrap();
    }
    assert_eq!(counters(&h).live_leases, 200);
    drop(h); // unpolled outputs and unanswered requests are freed with the handle
}

#[test]
fn struct_layouts_match_what_bindings_mirror() {
    use std::mem::offset_of;
    // LP64 layouts that ctypes / cgo / C++ mirror field for field; a change is an ABI break.
    assert_eq!(size_of::<lh_config>(), 64);
    assert_eq!(offset_of!(lh_config, drift_fixed_ns), 8);
    assert_eq!(offset_of!(lh_config, max_leases), 56);
    assert_eq!(size_of::<lh_acquire_options>(), 24);
    assert_eq!(size_of::<lh_output>(), 96);
    assert_eq!(offset_of!(lh_output, name), 24);
    assert_eq!(offset_of!(lh_output, backend_data_len), 64);
    assert_eq!(offset_of!(lh_output, valid_until_ns), 88);
    assert_eq!(size_of::<lh_lease_info>(), 32);
    // lh_counters grows at the end only (older hosts pass LH_COUNTERS_V1_SIZE).
    assert_eq!(size_of::<lh_counters>(), 160);
    assert_eq!(offset_of!(lh_counters, time_clamped), 112);
    assert_eq!(
        offset_of!(lh_counters, renewals_requested),
        LH_COUNTERS_V1_SIZE
    );
    assert_eq!(offset_of!(lh_counters, releases_lost), 152);
}

#[test]
fn separate_handles_run_on_separate_threads() {
    // Handles share no state: one per thread, concurrently, each through a full lifecycle.
    let threads: Vec<_> = (0..4u64)
        .map(|i| {
            std::thread::spawn(move || {
                let h = client();
                for round in 0..50 {
                    let lease = held(&h, round * 10 * MS, 3000, i * 1000 + round + 1);
                    // SAFETY: valid handle.
                    expect(
                        unsafe { lh_release(h.0, round * 10 * MS + 5 * MS, lease) },
                        LH_OK,
                    );
                    let outs = drain(&h);
                    let rel = find(&outs, LH_OUTPUT_RELEASE).expect("release command");
                    // SAFETY: valid handle.
                    expect(
                        unsafe {
                            lh_release_result(
                                h.0,
                                round * 10 * MS + 6 * MS,
                                rel.raw.request_id,
                                LH_RELEASE_RELEASED,
                            )
                        },
                        LH_OK,
                    );
                }
                counters(&h).grants
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), 50);
    }
}

#[test]
fn same_seed_same_tokens_and_reseed_changes_them() {
    let token_of = |h: &H| {
        acquire(h, 0, b"x", &opts(3000)).unwrap();
        poll(h).unwrap().token
    };
    let (a, b, c) = (client(), client(), client());
    let ta = token_of(&a);
    assert_eq!(ta, token_of(&b), "fixed seeds must replay identically");
    // SAFETY: valid handle and seed.
    expect(
        unsafe { lh_client_reseed(c.0, [0xc5u8; 32].as_ptr(), 32) },
        LH_OK,
    );
    assert_ne!(
        ta,
        token_of(&c),
        "a reseeded (forked) client must not repeat tokens"
    );
}

#[test]
fn hostile_granted_ttls_and_fences_never_extend_validity() {
    // A service (or a buggy transport) answers with a zero or "negative" (huge) TTL/fence.
    for (ttl, fence) in [(0, 0), (u64::MAX, u64::MAX), (u64::MAX / 1_000_000 + 1, 1)] {
        let h = client();
        let lease = acquire(&h, 10 * MS, NAME, &opts(3000)).unwrap();
        let req = poll(&h).unwrap().raw.request_id;
        expect(grant(&h, 11 * MS, req, fence, ttl, &[]), LH_OK);
        for o in drain(&h) {
            if o.raw.kind == LH_OUTPUT_ACQUIRED {
                // Validity counts from the send (10 ms) and never exceeds the requested TTL.
                assert!(o.raw.valid_until_ns <= 10 * MS + 3000 * MS, "ttl {ttl}");
            }
        }
        let mut held_now = true;
        // SAFETY: valid pointer.
        expect(
            unsafe { lh_is_held(h.0, lease, 10 * MS + 3000 * MS, &mut held_now) },
            LH_OK,
        );
        assert!(!held_now);
        // Still usable afterwards.
        acquire(&h, 12 * MS, b"other", &opts(3000)).unwrap();
    }
}

// ------------------------------------------- manual renew, auto_renew, release outcomes

fn renew(h: &H, now: u64, lease: u64) -> lh_status {
    // SAFETY: live handle (or NULL in the caller's test).
    unsafe { lh_renew(h.0, now, lease) }
}

#[test]
fn manual_renew_through_the_abi() {
    let h = client();
    let lease = held(&h, 0, 3000, 5);
    expect(renew(&h, 500 * MS, lease), LH_OK);
    let outs = drain(&h);
    assert_eq!(outs.len(), 1, "{outs:?}");
    let r = &outs[0];
    assert_eq!((r.raw.kind, r.raw.lease_id), (LH_OUTPUT_RENEW, lease));
    assert_eq!(r.token.len(), 32);
    // SAFETY: valid handle.
    expect(
        unsafe { lh_renew_result(h.0, 501 * MS, r.raw.request_id, LH_RENEW_RENEWED) },
        LH_OK,
    );
    let outs = drain(&h);
    let ev = find(&outs, LH_OUTPUT_RENEWED).expect("renewed");
    // From the send time: 500 ms + 3000 ms − (30 ms + 2 ms).
    assert_eq!((ev.raw.lease_id, ev.raw.valid_until_ns), (lease, 3468 * MS));
    assert_eq!(ev.raw.reason, LH_REASON_NONE);
    assert_eq!(counters(&h).renewals_requested, 1);
}

#[test]
fn manual_renew_of_ended_unknown_or_acquiring_leases_sends_nothing() {
    let h = client();
    let released = held(&h, 0, 3000, 5);
    // SAFETY: valid handle.
    expect(unsafe { lh_release(h.0, MS, released) }, LH_OK);
    drain(&h);
    let before = counters(&h);
    expect(renew(&h, 2 * MS, released), LH_ERR_LEASE_ENDED);
    assert!(last_error(&h).contains("ended"), "{}", last_error(&h));
    expect(renew(&h, 2 * MS, 0), LH_ERR_UNKNOWN_LEASE);
    expect(renew(&h, 2 * MS, u64::MAX), LH_ERR_UNKNOWN_LEASE);
    let acquiring = acquire(&h, 3 * MS, b"other", &opts(3000)).unwrap();
    drain(&h);
    expect(renew(&h, 4 * MS, acquiring), LH_ERR_NOT_GRANTED);
    assert!(drain(&h).is_empty(), "nothing sent");
    let k = counters(&h);
    assert_eq!(
        (k.renewals_sent, k.renewals_requested),
        (before.renewals_sent, 0)
    );
    // SAFETY: a NULL handle is an error, not UB.
    expect(
        unsafe { lh_renew(null_mut(), 0, released) },
        LH_ERR_NULL_ARGUMENT,
    );

    // A lost lease: terminal states are sticky.
    let h2 = client();
    let lease = held(&h2, 0, 3000, 5);
    // SAFETY: valid handle.
    expect(unsafe { lh_timeout(h2.0, 10_000 * MS) }, LH_OK);
    assert!(find(&drain(&h2), LH_OUTPUT_LOST).is_some());
    let sent = counters(&h2).renewals_sent;
    expect(renew(&h2, 10_001 * MS, lease), LH_ERR_LEASE_ENDED);
    assert!(drain(&h2).is_empty());
    assert_eq!(counters(&h2).renewals_sent, sent);
}

#[test]
fn no_auto_renew_flag_through_the_abi() {
    let h = client();
    let mut o = opts(3000);
    o.flags = LH_ACQUIRE_NO_AUTO_RENEW | LH_ACQUIRE_REENTRANT;
    let lease = acquire(&h, 0, NAME, &o).unwrap();
    let a = find(&drain(&h), LH_OUTPUT_ACQUIRE)
        .expect("acquire")
        .clone();
    // SAFETY: valid handle, NULL data with length 0.
    expect(
        unsafe {
            lh_acquire_result(
                h.0,
                MS,
                a.raw.request_id,
                LH_ACQUIRE_GRANTED,
                4,
                3000,
                LH_NO_RETRY_HINT,
                null(),
                0,
            )
        },
        LH_OK,
    );
    drain(&h);
    let mut now = MS;
    let lost = advance_until(&h, &mut now, LH_OUTPUT_LOST).expect("lost at valid_until");
    assert_eq!(
        (lost.raw.lease_id, lost.raw.reason),
        (lease, LH_REASON_EXPIRED)
    );
    assert_eq!(counters(&h).renewals_sent, 0);
}

fn release_reported(h: &H, now: u64, lease: u64) -> Result<u32, lh_status> {
    let mut out = 0xdead;
    // SAFETY: live handle, valid out-pointer.
    let st = unsafe { lh_release_reported(h.0, now, lease, &mut out) };
    if st == LH_OK {
        Ok(out)
    } else {
        assert_eq!(out, 0xdead, "written on failure");
        Err(st)
    }
}

#[test]
fn release_reported_through_the_abi() {
    for (answer, reason) in [
        (LH_RELEASE_RELEASED, LH_REASON_RELEASE_CONFIRMED),
        (LH_RELEASE_NOT_OWNER, LH_REASON_RELEASE_NOT_OWNER),
    ] {
        let h = client();
        let lease = held(&h, 0, 3000, 5);
        // SAFETY: a NULL out-pointer is an error and changes nothing.
        expect(
            unsafe { lh_release_reported(h.0, MS, lease, null_mut()) },
            LH_ERR_NULL_ARGUMENT,
        );
        assert!(drain(&h).is_empty());
        assert_eq!(release_reported(&h, MS, lease), Ok(LH_RELEASING_PENDING));
        let outs = drain(&h);
        assert!(find(&outs, LH_OUTPUT_RELEASED).is_some());
        let rel = find(&outs, LH_OUTPUT_RELEASE).expect("release").clone();
        // SAFETY: valid handle.
        expect(
            unsafe { lh_release_result(h.0, 2 * MS, rel.raw.request_id, answer) },
            LH_OK,
        );
        let outs = drain(&h);
        let ev = find(&outs, LH_OUTPUT_RELEASE_OUTCOME).expect("outcome");
        assert_eq!((ev.raw.lease_id, ev.raw.reason), (lease, reason));
        let k = counters(&h);
        assert_eq!(k.releases_confirmed + k.releases_not_owner, 1);
        assert_eq!(release_reported(&h, 3 * MS, lease), Err(LH_ERR_LEASE_ENDED));
    }
    let h = client();
    assert_eq!(release_reported(&h, 0, 77), Err(LH_ERR_UNKNOWN_LEASE));
    let mut out = 0;
    // SAFETY: a NULL handle is an error, not UB.
    expect(
        unsafe { lh_release_reported(null_mut(), 0, 1, &mut out) },
        LH_ERR_NULL_ARGUMENT,
    );
}

#[test]
fn release_after_a_pause_ends_lost_through_the_abi() {
    let h = client();
    let lease = held(&h, 0, 3000, 5);
    assert_eq!(
        release_reported(&h, 10_000 * MS, lease),
        Ok(LH_RELEASING_LOST)
    );
    let outs = drain(&h);
    let lost = find(&outs, LH_OUTPUT_LOST).expect("lost");
    assert_eq!(
        (lost.raw.lease_id, lost.raw.reason),
        (lease, LH_REASON_EXPIRED)
    );
    assert!(find(&outs, LH_OUTPUT_RELEASED).is_none());
    assert_eq!(counters(&h).releases_lost, 1);
    // The plain release says the same through the events.
    let h = client();
    let lease = held(&h, 0, 3000, 5);
    // SAFETY: valid handle.
    expect(unsafe { lh_release(h.0, 10_000 * MS, lease) }, LH_OK);
    let outs = drain(&h);
    assert!(find(&outs, LH_OUTPUT_LOST).is_some() && find(&outs, LH_OUTPUT_RELEASED).is_none());
}

#[test]
fn counters_written_to_an_older_struct_size_stop_at_it() {
    let h = client();
    held(&h, 0, 3000, 5);
    // SAFETY: the struct is LH_COUNTERS_V1_SIZE bytes or more; the library writes no further.
    unsafe {
        let mut k: lh_counters = std::mem::zeroed();
        k.struct_size = LH_COUNTERS_V1_SIZE as u32;
        k.releases_lost = 0xdead;
        expect(lh_counters_get(h.0, &mut k), LH_OK);
        assert_eq!(k.struct_size as usize, LH_COUNTERS_V1_SIZE);
        assert_eq!((k.live_leases, k.grants), (1, 1));
        assert_eq!(k.releases_lost, 0xdead, "written past the caller's struct");
        k.struct_size = LH_COUNTERS_V1_SIZE as u32 - 8;
        expect(lh_counters_get(h.0, &mut k), LH_ERR_STRUCT_SIZE);
    }
}
