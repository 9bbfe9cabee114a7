//! Drives the C ABI (`leasehold::ffi::lh_*`) from Rust with every hostile input: NULL for
//! every pointer parameter, invalid UTF-8 and oversized names, zero and negative-as-huge TTLs,
//! unknown lease ids, unknown enum values, answers for unknown or already-answered request
//! ids, malformed and garbage answers, double release, time running backwards, and use after
//! a poisoning panic. Each yields its documented code and leaves the client usable (except
//! poisoning). The engine's rules are exercised through a memory-backend client: its requests
//! run on an `lh_memory_service` (`lh_memory_service_call`, answered with `lh_io_reply` /
//! `lh_io_failed`), or are answered by hand where a test needs an answer the service would
//! not give. Also checks the header's version macros against Cargo.toml.
//!
//! Calling `extern "C"` functions with raw pointers needs `unsafe`; every block here passes
//! pointers to live locals, which is exactly the contract a C caller must honour.
#![allow(unsafe_code)]

#[path = "support/abi.rs"]
mod abi;

use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::ptr::{null, null_mut};

use abi::*;
use leasehold::ffi::*;

const SEED: [u8; 32] = [9; 32];
const NAME: &[u8] = b"orders";

/// A memory-backend client whose requests the test answers by hand.
fn client() -> H {
    try_client(&config(), &backend(LH_BACKEND_MEMORY), &SEED).expect("lh_client_new")
}

fn granted(fence: i64) -> V<'static> {
    word("GRANTED", vec![V::Int(fence)])
}

fn find(v: &[lh_event], kind: u32) -> Option<lh_event> {
    v.iter().copied().find(|e| e.kind == kind)
}

fn text(b: &[u8]) -> &str {
    std::str::from_utf8(b).unwrap()
}

/// Acquires `name` and takes the one ACQUIRE request it sends.
fn acquire_req(h: &H, now: u64, name: &[u8], o: &lh_acquire_options) -> (u64, Req) {
    let lease = h.acquire(now, name, o).expect("acquire");
    let mut reqs = h.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    let r = reqs.remove(0);
    assert_eq!(
        (r.kind, r.connection),
        (LH_IO_COMMAND, LH_CONNECTION_COMMANDS)
    );
    assert_eq!(
        (r.args[0].as_slice(), r.args[1].as_slice()),
        (&b"ACQUIRE"[..], name)
    );
    (lease, r)
}

/// Acquire + a GRANTED answer with `fence`; returns the lease id.
fn held(h: &H, now: u64, ttl_ms: u64, fence: i64) -> u64 {
    let (lease, a) = acquire_req(h, now, NAME, &opts(ttl_ms));
    ok(h.reply(now + MS, a.id, &granted(fence)));
    let acq = find(&h.events(), LH_EVENT_ACQUIRED).expect("acquired");
    assert_eq!((acq.lease_id, acq.fencing_token), (lease, fence as u64));
    lease
}

/// Feeds timeouts at the core's deadlines until a request `word` goes out (bounded); the
/// requests and events before it are dropped.
fn advance_until_request(h: &H, now: &mut u64, word: &[u8]) -> Option<Req> {
    for _ in 0..50 {
        let d = h.deadline();
        if d == LH_NO_DEADLINE {
            return None;
        }
        *now = (*now).max(d);
        ok(h.timeout(*now));
        h.events();
        if let Some(r) = h.requests().into_iter().find(|r| r.args[0] == word) {
            return Some(r);
        }
    }
    None
}

/// Feeds timeouts at the core's deadlines until an event of `kind` (bounded). The service is
/// silent: requests are taken and never answered.
fn advance_until_event(h: &H, now: &mut u64, kind: u32) -> Option<lh_event> {
    for _ in 0..50 {
        let d = h.deadline();
        if d == LH_NO_DEADLINE {
            return None;
        }
        *now = (*now).max(d);
        ok(h.timeout(*now));
        h.requests();
        if let Some(e) = find(&h.events(), kind) {
            return Some(e);
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
    // ABI 4: the stream kind (the request and backend option structs grew).
    assert_eq!(LH_ABI_VERSION, 4);
    assert_eq!(header_define(&h, "LH_ABI_VERSION"), "4");
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
    assert_eq!(seen, 25, "LH_OK + 24 error codes");
    assert_eq!(name_of(22), "LH_ERR_WRONG_ANSWER");
    for unknown in [23, 99, 899, 902, u32::MAX] {
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
    let b = backend(LH_BACKEND_MEMORY);
    assert_eq!(
        (b.struct_size as usize, b.kind),
        (size_of::<lh_backend_options>(), LH_BACKEND_MEMORY)
    );
    // SAFETY: NULL is documented as ignored.
    unsafe {
        lh_config_default(null_mut());
        lh_acquire_options_default(null_mut());
    }
}

#[test]
fn client_new_hostile_arguments() {
    let mut cfg = config();
    let b = backend(LH_BACKEND_MEMORY);
    let sentinel = 0x1234usize as *mut lh_client;
    let mut c = sentinel;
    // SAFETY: every non-NULL pointer is valid; the library must reject the rest.
    unsafe {
        expect(
            lh_client_new(null(), &b, SEED.as_ptr(), 32, &mut c),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_client_new(&cfg, &b, null(), 32, &mut c),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_client_new(&cfg, &b, null(), 0, &mut c),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_client_new(&cfg, &b, SEED.as_ptr(), 32, null_mut()),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_client_new(&cfg, &b, SEED.as_ptr(), 15, &mut c),
            LH_ERR_SEED_TOO_SHORT,
        );
        expect(
            lh_client_new(&cfg, &b, SEED.as_ptr(), 0, &mut c),
            LH_ERR_SEED_TOO_SHORT,
        );
        expect(
            lh_client_new(&cfg, &b, SEED.as_ptr(), usize::MAX, &mut c),
            LH_ERR_INVALID_CONFIG,
        );
        expect(
            lh_client_new(&cfg, &b, SEED.as_ptr(), LH_MAX_SEED_LEN + 1, &mut c),
            LH_ERR_INVALID_CONFIG,
        );
        cfg.notifications = 7;
        expect(
            lh_client_new(&cfg, &b, SEED.as_ptr(), 32, &mut c),
            LH_ERR_INVALID_CONFIG,
        );
        cfg = config();
        cfg.max_leases = 0;
        expect(
            lh_client_new(&cfg, &b, SEED.as_ptr(), 32, &mut c),
            LH_ERR_INVALID_CONFIG,
        );
        cfg = config();
        cfg.struct_size = 0;
        expect(
            lh_client_new(&cfg, &b, SEED.as_ptr(), 32, &mut c),
            LH_ERR_STRUCT_SIZE,
        );
        cfg.struct_size = size_of::<lh_config>() as u32 - 1;
        expect(
            lh_client_new(&cfg, &b, SEED.as_ptr(), 32, &mut c),
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
    let mut ev = lh_event::default();
    let mut req = MaybeUninit::<lh_io_request>::uninit();
    // SAFETY: plain integers; zeroed is valid.
    let mut info: lh_lease_info = unsafe { std::mem::zeroed() };
    info.struct_size = size_of::<lh_lease_info>() as u32;
    // SAFETY: as above.
    let mut k: lh_counters = unsafe { std::mem::zeroed() };
    k.struct_size = size_of::<lh_counters>() as u32;
    // SAFETY: plain integers and NULL pointers; zeroed is valid.
    let mut st: lh_lock_status = unsafe { std::mem::zeroed() };
    st.struct_size = size_of::<lh_lock_status>() as u32;
    let (values, data) = flat(&granted(1));
    let n = null_mut();
    // SAFETY: a NULL handle is documented as an error; other pointers are valid.
    unsafe {
        expect(lh_client_reseed(n, SEED.as_ptr(), 32), LH_ERR_NULL_ARGUMENT);
        expect(
            lh_acquire(n, 0, NAME.as_ptr(), 6, &o, &mut u64v),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(lh_release(n, 0, 1, null_mut()), LH_ERR_NULL_ARGUMENT);
        expect(lh_release(n, 0, 1, &mut u32v), LH_ERR_NULL_ARGUMENT);
        expect(lh_renew(n, 0, 1), LH_ERR_NULL_ARGUMENT);
        expect(lh_timeout(n, 0), LH_ERR_NULL_ARGUMENT);
        expect(lh_poll_event(n, &mut ev), LH_ERR_NULL_ARGUMENT);
        expect(lh_poll_timeout(n, &mut u64v), LH_ERR_NULL_ARGUMENT);
        expect(lh_lease_state(n, 1, &mut u32v), LH_ERR_NULL_ARGUMENT);
        expect(lh_lease_info_get(n, 1, &mut info), LH_ERR_NULL_ARGUMENT);
        expect(lh_fencing_token(n, 1, &mut u64v), LH_ERR_NULL_ARGUMENT);
        expect(lh_valid_until(n, 1, &mut u64v), LH_ERR_NULL_ARGUMENT);
        expect(lh_is_held(n, 1, 0, &mut b), LH_ERR_NULL_ARGUMENT);
        expect(lh_counters_get(n, &mut k), LH_ERR_NULL_ARGUMENT);
        expect(lh_io_poll(n, req.as_mut_ptr()), LH_ERR_NULL_ARGUMENT);
        expect(
            lh_io_reply(
                n,
                0,
                1,
                values.as_ptr(),
                values.len(),
                data.as_ptr(),
                data.len(),
            ),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_io_http_reply(n, 0, 1, 200, b"{}".as_ptr(), 2),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_io_stream_message(n, 0, 1, b"{}".as_ptr(), 2),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_io_failed(n, 0, 1, LH_FAILURE_TRANSPORT, null(), 0),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_io_message(n, 0, NAME.as_ptr(), 6, null(), 0),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_io_connection(
                n,
                0,
                LH_CONNECTION_COMMANDS,
                LH_CONNECTION_REOPENED,
                null(),
                0,
            ),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(lh_io_close(n, 0), LH_ERR_NULL_ARGUMENT);
        expect(
            lh_status_request(n, 0, NAME.as_ptr(), 6, &mut u64v),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(lh_poll_status(n, &mut st), LH_ERR_NULL_ARGUMENT);
        #[cfg(feature = "testing")]
        expect(lh_client_debug_panic(n), LH_ERR_NULL_ARGUMENT);
        assert_eq!(CStr::from_ptr(lh_client_last_error(n)).to_bytes(), b"");
        assert_eq!(CStr::from_ptr(lh_backend_last_error(n)).to_bytes(), b"");
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
        assert_eq!(h.counters().acquires_sent, 0);
        assert!(h.last_error().contains("out_lease"));
        expect(lh_poll_timeout(h.0, null_mut()), LH_ERR_NULL_ARGUMENT);
        expect(lh_lease_state(h.0, 1, null_mut()), LH_ERR_NULL_ARGUMENT);
        expect(lh_lease_info_get(h.0, 1, null_mut()), LH_ERR_NULL_ARGUMENT);
        expect(lh_fencing_token(h.0, 1, null_mut()), LH_ERR_NULL_ARGUMENT);
        expect(lh_valid_until(h.0, 1, null_mut()), LH_ERR_NULL_ARGUMENT);
        expect(lh_is_held(h.0, 1, 0, null_mut()), LH_ERR_NULL_ARGUMENT);
        expect(lh_counters_get(h.0, null_mut()), LH_ERR_NULL_ARGUMENT);
        expect(
            lh_status_request(h.0, 0, NAME.as_ptr(), 6, null_mut()),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(lh_poll_status(h.0, null_mut()), LH_ERR_NULL_ARGUMENT);
    }
    let (lease, a) = acquire_req(&h, 0, NAME, &o);
    ok(h.reply(MS, a.id, &granted(3)));
    // SAFETY: a NULL out is a documented error and must not consume the request or event.
    unsafe {
        expect(lh_poll_event(h.0, null_mut()), LH_ERR_NULL_ARGUMENT);
        expect(lh_io_poll(h.0, null_mut()), LH_ERR_NULL_ARGUMENT);
    }
    assert_eq!(
        h.event().map(|e| (e.kind, e.lease_id)),
        Some((LH_EVENT_ACQUIRED, lease))
    );
    ok(h.release(2 * MS, lease));
    // SAFETY: as above.
    expect(unsafe { lh_io_poll(h.0, null_mut()) }, LH_ERR_NULL_ARGUMENT);
    let rel = h.poll().expect("the RELEASE request is still there");
    assert_eq!(rel.args[0], b"RELEASE");
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
        assert_eq!(h.acquire(0, name, &o), Err(*want), "name {name:?}");
        assert!(!h.last_error().is_empty());
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
            h.acquire(0, NAME, &opts(ttl)),
            Err(LH_ERR_INVALID_TTL),
            "ttl {ttl}"
        );
    }
    for flags in [4, 6, 0x8000_0000, u32::MAX] {
        let mut bad = opts(1000);
        bad.flags = flags;
        assert_eq!(h.acquire(0, NAME, &bad), Err(LH_ERR_INVALID_ENUM));
    }
    for size in [0, 4, size_of::<lh_acquire_options>() as u32 - 1] {
        let mut bad = opts(1000);
        bad.struct_size = size;
        assert_eq!(h.acquire(0, NAME, &bad), Err(LH_ERR_STRUCT_SIZE));
    }
    assert_eq!(lease, 77);
    let k = h.counters();
    assert_eq!(
        (k.acquires_sent, k.live_leases, k.backend_requests),
        (0, 0, 0)
    );
    assert!(h.poll().is_none() && h.event().is_none());
    // Still usable, and the longest legal name goes out whole in the request.
    let max = vec![b'z'; LH_MAX_NAME_LEN];
    acquire_req(&h, 0, &max, &o);
    // Names on both sides of the core's inline limit come out whole.
    let inline = leasehold::INLINE_NAME_LEN;
    for len in [inline - 1, inline, inline + 1] {
        let name = vec![b'q'; len];
        acquire_req(&h, 0, &name, &o);
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
            expect(lh_release(h.0, 0, id, null_mut()), LH_ERR_UNKNOWN_LEASE);
            expect(lh_release(h.0, 0, id, &mut u32v), LH_ERR_UNKNOWN_LEASE);
            expect(lh_renew(h.0, 0, id), LH_ERR_UNKNOWN_LEASE);
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
    assert_eq!(h.state(lease), Ok(LH_STATE_HELD));
}

#[test]
fn unknown_enum_values_change_nothing() {
    let h = client();
    let (lease, a) = acquire_req(&h, 0, NAME, &opts(1000));
    for bad in [0, 3, 17, u32::MAX] {
        expect(h.failed(MS, a.id, bad, b"x"), LH_ERR_INVALID_ENUM);
        assert!(
            h.last_error().contains("failure kind"),
            "{}",
            h.last_error()
        );
        expect(
            h.connection(MS, bad, LH_CONNECTION_REOPENED, b""),
            LH_ERR_INVALID_ENUM,
        );
    }
    for bad in [0, 4, 17, u32::MAX] {
        expect(
            h.connection(MS, LH_CONNECTION_COMMANDS, bad, b""),
            LH_ERR_INVALID_ENUM,
        );
        assert!(
            h.last_error().contains("connection event"),
            "{}",
            h.last_error()
        );
    }
    // A value kind nobody knows is a malformed answer, not an enum error.
    let unknown = lh_value {
        kind: 99,
        ..lh_value::default()
    };
    expect(h.reply_raw(MS, a.id, &[unknown], b""), LH_ERR_INVALID_REPLY);
    assert_eq!(h.state(lease), Ok(LH_STATE_ACQUIRING));
    let k = h.counters();
    assert_eq!(
        (
            k.stale_results,
            k.backend_stale_replies,
            k.backend_transport_failures
        ),
        (0, 0, 0)
    );
    assert!(h.events().is_empty() && h.poll().is_none());
    ok(h.reply(MS, a.id, &granted(2)));
    assert_eq!(h.state(lease), Ok(LH_STATE_HELD));
}

#[test]
fn unknown_and_already_answered_request_ids_are_stale() {
    let h = client();
    let (lease, a) = acquire_req(&h, 0, NAME, &opts(3000));
    ok(h.reply(MS, a.id, &granted(5)));
    h.events();
    let before = h.counters();
    ok(h.reply(2 * MS, a.id, &granted(6))); // answered twice
    ok(h.reply(2 * MS, a.id, &word("HELD", vec![V::Nil])));
    ok(h.failed(2 * MS, a.id, LH_FAILURE_TRANSPORT, b""));
    ok(h.reply(2 * MS, 999_999, &granted(7))); // never issued
    ok(h.reply(2 * MS, 0, &word("RENEWED", vec![])));
    ok(h.failed(2 * MS, u64::MAX, LH_FAILURE_DATABASE, b"no"));
    ok(h.reply(2 * MS, a.id + 1, &word("RELEASED", vec![])));
    let k = h.counters();
    assert_eq!(k.backend_stale_replies, before.backend_stale_replies + 7);
    assert_eq!(
        (
            k.backend_transport_failures,
            k.backend_garbage_replies,
            k.grants
        ),
        (0, 0, 1),
        "a stale answer is not looked at"
    );
    assert!(h.poll().is_none() && h.events().is_empty());
    assert_eq!(h.fence(lease), Ok(5));
    assert_eq!(h.state(lease), Ok(LH_STATE_HELD));
}

#[test]
fn lifecycle_through_the_abi_with_borrowed_bytes() {
    let h = client();
    let (lease, a) = acquire_req(&h, 0, NAME, &opts(3000));
    let (mut fence, mut vu) = (0u64, 0u64);
    // SAFETY: valid pointers.
    unsafe {
        expect(lh_fencing_token(h.0, lease, &mut fence), LH_ERR_NOT_GRANTED);
        expect(lh_valid_until(h.0, lease, &mut vu), LH_ERR_NOT_GRANTED);
    }
    assert_eq!(a.args.len(), 4);
    let token = a.args[2].clone();
    assert_eq!(token.len(), 32);
    assert!(token.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')));
    assert_eq!(text(&a.args[3]), "3000");
    assert!(a.data.is_empty() && a.statements.is_empty() && a.method.is_none());
    assert!(h.poll().is_none() && h.event().is_none());

    ok(h.reply(MS, a.id, &granted(42)));
    let ev = h.event().unwrap();
    assert_eq!(ev.kind, LH_EVENT_ACQUIRED);
    assert_eq!(
        (ev.lease_id, ev.fencing_token, ev.reason),
        (lease, 42, LH_REASON_NONE)
    );
    assert!(ev.valid_until_ns > MS && ev.valid_until_ns <= 3000 * MS);
    let vu = h.valid_until(lease);
    assert_eq!(vu, ev.valid_until_ns);
    let mut held_now = false;
    // SAFETY: valid pointers; lh_lease_info is plain integers.
    unsafe {
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
    let r = advance_until_request(&h, &mut now, b"RENEW").expect("renew");
    assert!(now < vu, "renew must come before validity ends");
    assert_eq!(r.args, [&b"RENEW"[..], NAME, &token, b"3000"]);
    ok(h.reply(now + MS, r.id, &word("RENEWED", vec![])));
    assert!(h.events().is_empty(), "automatic renewals are silent");
    assert!(h.valid_until(lease) > vu);

    ok(h.release(now + 2 * MS, lease));
    let evs = h.events();
    assert!(find(&evs, LH_EVENT_RELEASED).is_some_and(|e| e.lease_id == lease));
    let rel = h.poll().expect("release request");
    assert_eq!(rel.args, [&b"RELEASE"[..], NAME, &token]);
    assert_eq!(h.counters().pending_cleanups, 1);
    ok(h.reply(now + 3 * MS, rel.id, &word("RELEASED", vec![])));
    let k = h.counters();
    assert_eq!((k.pending_cleanups, k.backend_requests), (0, 3));
}

#[test]
fn double_release_is_lease_ended() {
    let h = client();
    let lease = held(&h, 0, 3000, 1);
    ok(h.release(2 * MS, lease));
    h.requests();
    h.events();
    expect(h.release(3 * MS, lease), LH_ERR_LEASE_ENDED);
    assert!(!h.last_error().is_empty());
    assert!(
        h.poll().is_none() && h.event().is_none(),
        "no second event or request"
    );
}

#[test]
fn malformed_answers_are_refused_and_change_nothing() {
    let h = client();
    let (lease, a) = acquire_req(&h, 0, NAME, &opts(3000));
    let big = vec![0u8; LH_MAX_REPLY_DATA + 1];
    let (good, good_data) = flat(&granted(1));
    let arr = |n| lh_value {
        kind: LH_VALUE_ARRAY,
        len: n,
        ..lh_value::default()
    };
    let bulk = |offset, len| lh_value {
        kind: LH_VALUE_BULK,
        offset,
        len,
        ..lh_value::default()
    };
    let deep: Vec<lh_value> = (0..LH_MAX_REPLY_DEPTH as u64 + 2)
        .map(|_| arr(1))
        .chain([lh_value {
            kind: LH_VALUE_INT,
            ..lh_value::default()
        }])
        .collect();
    let cases: Vec<(Vec<lh_value>, &[u8])> = vec![
        (vec![], b""),
        (vec![arr(2)], b""),
        (vec![arr(u64::MAX)], b""),
        (good.clone(), &big),
        (vec![bulk(2, 5)], b"abc"),
        (vec![bulk(u64::MAX, 2)], b"abc"),
        (deep, b""),
        (vec![lh_value::default(); LH_MAX_REPLY_VALUES + 1], b""),
    ];
    for (values, data) in &cases {
        expect(h.reply_raw(MS, a.id, values, data), LH_ERR_INVALID_REPLY);
    }
    // SAFETY: lengths beyond the limit are never read; NULL with a length is refused.
    unsafe {
        expect(
            lh_io_reply(
                h.0,
                MS,
                a.id,
                good.as_ptr(),
                good.len(),
                big.as_ptr(),
                usize::MAX,
            ),
            LH_ERR_INVALID_REPLY,
        );
        expect(
            lh_io_reply(h.0, MS, a.id, good.as_ptr(), usize::MAX, null(), 0),
            LH_ERR_INVALID_REPLY,
        );
        expect(
            lh_io_reply(h.0, MS, a.id, good.as_ptr(), good.len(), null(), 5),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_io_reply(h.0, MS, a.id, null(), 0, null(), 0),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_io_failed(h.0, MS, a.id, LH_FAILURE_TRANSPORT, null(), 3),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_io_failed(h.0, MS, a.id, LH_FAILURE_TRANSPORT, big.as_ptr(), big.len()),
            LH_ERR_INVALID_REPLY,
        );
    }
    assert!(!h.last_error().is_empty());
    assert_eq!(h.state(lease), Ok(LH_STATE_ACQUIRING));
    let k = h.counters();
    assert_eq!(
        (
            k.backend_stale_replies,
            k.backend_garbage_replies,
            k.backend_transport_failures
        ),
        (0, 0, 0)
    );
    assert!(h.events().is_empty());
    // The request is still pending: a good answer (its data may carry unused bytes) is taken.
    let mut padded = good_data.clone();
    padded.extend_from_slice(&[0xff; 16]);
    ok(h.reply_raw(MS, a.id, &good, &padded));
    assert_eq!(h.state(lease), Ok(LH_STATE_HELD));
    assert_eq!(h.fence(lease), Ok(1));
}

#[test]
fn garbage_answers_are_transport_errors_never_grants() {
    // Well-formed value lists of a shape the request cannot have: zero, negative and textual
    // fences, missing or extra fields, another request's word, an error reply.
    let cases: Vec<(V<'static>, &str)> = vec![
        (granted(0), "garbage"),
        (granted(-1), "garbage"),
        (word("GRANTED", vec![V::Bulk(b"7")]), "garbage"),
        (word("GRANTED", vec![]), "garbage"),
        (word("GRANTED", vec![V::Int(7), V::Int(8)]), "garbage"),
        (word("RENEWED", vec![]), "garbage"),
        (word("HELD", vec![V::Int(-5)]), "garbage"),
        (V::Arr(vec![V::Bulk(b"GRANTED"), V::Int(7)]), "garbage"),
        (V::Int(7), "garbage"),
        (V::Status(b"OK"), "garbage"),
        (V::Arr(vec![]), "garbage"),
        (V::Error(b"ERR something broke"), "error"),
    ];
    for (answer, what) in cases {
        let h = client();
        let (lease, a) = acquire_req(&h, 10 * MS, NAME, &opts(3000));
        ok(h.reply(11 * MS, a.id, &answer));
        let evs = h.events();
        assert!(
            find(&evs, LH_EVENT_ACQUIRED).is_none(),
            "{answer:?} granted"
        );
        // One attempt (no wait budget): the transport error fails the acquire.
        let failed = find(&evs, LH_EVENT_ACQUIRE_FAILED).expect("failed");
        assert_eq!(
            (failed.lease_id, failed.reason),
            (lease, LH_REASON_UNAVAILABLE),
            "{answer:?}"
        );
        let k = h.counters();
        let counted = if what == "error" {
            k.backend_error_replies
        } else {
            k.backend_garbage_replies
        };
        assert_eq!((counted, k.grants), (1, 0), "{answer:?}");
        assert!(!h.backend_error().is_empty(), "{answer:?}");
        // The outcome is unknown, so the token is released in case the service granted it.
        let cleanup = h.requests();
        assert_eq!(cleanup.len(), 1, "{cleanup:?}");
        assert_eq!(cleanup[0].args, [&b"RELEASE"[..], NAME, &a.args[2]]);
        ok(h.reply(12 * MS, cleanup[0].id, &word("NOT_OWNER", vec![])));
        // Still usable afterwards.
        held(&h, 12 * MS, 3000, 9);
    }
}

#[test]
fn hostile_granted_fences_never_extend_validity() {
    // The largest fence a service could send is taken as is; validity still counts from the
    // send (10 ms) and never exceeds the requested TTL.
    let h = client();
    let (lease, a) = acquire_req(&h, 10 * MS, NAME, &opts(3000));
    ok(h.reply(11 * MS, a.id, &granted(i64::MAX)));
    let acq = find(&h.events(), LH_EVENT_ACQUIRED).expect("acquired");
    assert_eq!(acq.fencing_token, i64::MAX as u64);
    assert!(acq.valid_until_ns <= 10 * MS + 3000 * MS);
    let mut held_now = true;
    // SAFETY: valid pointer.
    ok(unsafe { lh_is_held(h.0, lease, 10 * MS + 3000 * MS, &mut held_now) });
    assert!(!held_now);
}

#[test]
fn notification_and_reseed_hostile_inputs() {
    let h = client();
    let huge = vec![b'n'; LH_MAX_REPLY_DATA + 1];
    // SAFETY: NULL / oversized lengths are documented errors and never dereferenced.
    unsafe {
        expect(
            lh_io_message(h.0, 0, null(), 3, null(), 0),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_io_message(h.0, 0, null(), 0, null(), 0),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_io_message(h.0, 0, NAME.as_ptr(), usize::MAX, null(), 0),
            LH_ERR_INVALID_REPLY,
        );
        expect(
            lh_io_message(h.0, 0, huge.as_ptr(), huge.len(), null(), 0),
            LH_ERR_INVALID_REPLY,
        );
        expect(
            lh_io_message(h.0, 0, NAME.as_ptr(), 6, null(), 4),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(lh_client_reseed(h.0, null(), 32), LH_ERR_NULL_ARGUMENT);
        expect(
            lh_client_reseed(h.0, SEED.as_ptr(), 3),
            LH_ERR_SEED_TOO_SHORT,
        );
        expect(
            lh_client_reseed(h.0, SEED.as_ptr(), usize::MAX),
            LH_ERR_INVALID_CONFIG,
        );
    }
    assert_eq!(h.counters().backend_ignored_messages, 0);
    // Messages the client does not wait for are counted and ignored: invalid UTF-8, empty,
    // a name nobody watches.
    for ch in [&b"\xfe"[..], b"", NAME, b"other"] {
        ok(h.message(0, ch, b"payload"));
    }
    assert_eq!(h.counters().backend_ignored_messages, 4);
    // SAFETY: valid seed.
    ok(unsafe { lh_client_reseed(h.0, SEED.as_ptr(), SEED.len()) });
    assert!(h.poll().is_none() && h.event().is_none());
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
        let mut st: lh_lock_status = std::mem::zeroed();
        st.struct_size = 8;
        st.id = 0xdead;
        expect(lh_poll_status(h.0, &mut st), LH_ERR_STRUCT_SIZE);
        assert_eq!(st.id, 0xdead);
    }
    let k = h.counters();
    assert_eq!(
        (k.struct_size as usize, k._reserved, k.live_leases),
        (size_of::<lh_counters>(), 0, 1)
    );
}

#[test]
fn time_running_backwards_is_clamped() {
    let h = client();
    let lease = held(&h, 1000 * MS, 3000, 11);
    let before = h.counters().time_clamped;
    ok(h.timeout(5 * MS));
    ok(h.timeout(0));
    ok(h.release(1, lease));
    assert!(find(&h.events(), LH_EVENT_RELEASED).is_some());
    assert!(h.counters().time_clamped > before);
}

#[test]
fn rejected_renew_and_silent_service_lose_the_lease() {
    let h = client();
    let mut now = 0;
    let lease = held(&h, now, 3000, 5);
    let r = advance_until_request(&h, &mut now, b"RENEW").expect("renew");
    ok(h.reply(now + MS, r.id, &word("REJECTED", vec![])));
    let lost = find(&h.events(), LH_EVENT_LOST).expect("lost");
    assert_eq!((lost.lease_id, lost.reason), (lease, LH_REASON_REJECTED));
    assert!(matches!(
        h.state(lease),
        Ok(LH_STATE_LOST) | Err(LH_ERR_LEASE_ENDED)
    ));
    assert_eq!(h.counters().lost_rejected, 1);

    // A service that never answers: the lease is lost on the client's own clock.
    let h2 = client();
    let mut now = 0;
    let lease = held(&h2, now, 3000, 5);
    let vu = h2.valid_until(lease);
    let mut unanswered = Vec::new();
    let mut lost = None;
    for _ in 0..50 {
        now = now.max(h2.deadline());
        ok(h2.timeout(now));
        unanswered.extend(h2.requests().into_iter().map(|r| r.id));
        lost = find(&h2.events(), LH_EVENT_LOST);
        if lost.is_some() {
            break;
        }
    }
    let lost = lost.expect("lost on its own");
    assert_eq!(lost.lease_id, lease);
    assert!(matches!(
        lost.reason,
        LH_REASON_EXPIRED | LH_REASON_FAIL_BUDGET
    ));
    assert!(now <= vu, "loss detected no later than valid_until");
    assert!(!unanswered.is_empty(), "renewals went out");
    // Requests the host never answers are forgotten after a while, not kept forever: an
    // answer that comes after that is stale.
    ok(h2.timeout(now + 200_000 * MS));
    h2.requests();
    let before = h2.counters().backend_stale_replies;
    for id in &unanswered {
        ok(h2.reply(now + 200_000 * MS, *id, &word("RENEWED", vec![])));
    }
    let k = h2.counters();
    assert_eq!(k.backend_stale_replies, before + unanswered.len() as u64);
    assert_eq!((k.backend_transport_failures, k.renewals_ok), (0, 0));
}

#[test]
fn a_now_jump_past_validity_loses_the_lease_before_any_request() {
    let h = client();
    let lease = held(&h, 0, 3000, 5);
    let vu = h.valid_until(lease);
    ok(h.timeout(vu + 10_000 * MS));
    let lost = find(&h.events(), LH_EVENT_LOST).expect("lost");
    assert_eq!((lost.lease_id, lost.reason), (lease, LH_REASON_EXPIRED));
    assert!(
        h.requests().iter().all(|r| r.args[0] != b"RENEW"),
        "no renewal of a lease whose validity is gone"
    );
}

#[test]
fn reentrant_acquire_through_the_abi() {
    let h = client();
    let mut o = opts(3000);
    o.flags = LH_ACQUIRE_REENTRANT;
    let (l1, a) = acquire_req(&h, 0, NAME, &o);
    ok(h.reply(MS, a.id, &granted(3)));
    h.events();
    let l2 = h.acquire(2 * MS, NAME, &o).unwrap();
    assert_eq!(l1, l2);
    assert!(h.poll().is_none(), "a join sends nothing");
    assert!(find(&h.events(), LH_EVENT_ACQUIRED).is_some());
    ok(h.release(3 * MS, l1));
    assert!(h.poll().is_none() && h.event().is_none());
    ok(h.release(4 * MS, l1));
    assert!(find(&h.events(), LH_EVENT_RELEASED).is_some());
    assert_eq!(
        h.poll().map(|r| r.args[0].clone()),
        Some(b"RELEASE".to_vec())
    );
}

#[test]
fn last_error_is_per_handle() {
    let a = client();
    let b = client();
    assert_eq!(a.last_error(), "");
    assert_eq!(a.acquire(0, NAME, &opts(0)), Err(LH_ERR_INVALID_TTL));
    let msg = a.last_error();
    assert!(msg.contains("TTL"), "{msg}");
    expect(b.release(0, 777), LH_ERR_UNKNOWN_LEASE);
    assert_eq!(a.last_error(), msg, "b's error leaked into a");
    assert_ne!(b.last_error(), msg);
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
    let (lease, a) = acquire_req(&h, 0, NAME, &opts(3000));
    let (mut u64v, mut u32v, mut b) = (1u64, 1u32, false);
    let mut ev = lh_event::default();
    let mut req = MaybeUninit::<lh_io_request>::uninit();
    // SAFETY: plain integers; zeroed is valid.
    let mut info: lh_lease_info = unsafe { std::mem::zeroed() };
    info.struct_size = size_of::<lh_lease_info>() as u32;
    // SAFETY: as above.
    let mut k: lh_counters = unsafe { std::mem::zeroed() };
    k.struct_size = size_of::<lh_counters>() as u32;
    // SAFETY: as above.
    let mut st: lh_lock_status = unsafe { std::mem::zeroed() };
    st.struct_size = size_of::<lh_lock_status>() as u32;
    let o = opts(3000);
    let (values, data) = flat(&granted(1));
    // SAFETY: valid handle and pointers; the panic is caught inside the library.
    unsafe {
        expect(lh_client_debug_panic(h.0), LH_ERR_PANIC);
        assert!(h.last_error().contains("panic"));
        let c = h.0;
        expect(lh_client_debug_panic(c), LH_ERR_POISONED);
        expect(lh_client_reseed(c, SEED.as_ptr(), 32), LH_ERR_POISONED);
        expect(
            lh_acquire(c, 0, NAME.as_ptr(), 6, &o, &mut u64v),
            LH_ERR_POISONED,
        );
        expect(lh_release(c, 0, lease, null_mut()), LH_ERR_POISONED);
        expect(lh_release(c, 0, lease, &mut u32v), LH_ERR_POISONED);
        expect(lh_renew(c, 0, lease), LH_ERR_POISONED);
        expect(lh_timeout(c, 0), LH_ERR_POISONED);
        expect(lh_poll_event(c, &mut ev), LH_ERR_POISONED);
        expect(lh_poll_timeout(c, &mut u64v), LH_ERR_POISONED);
        expect(lh_lease_state(c, lease, &mut u32v), LH_ERR_POISONED);
        expect(lh_lease_info_get(c, lease, &mut info), LH_ERR_POISONED);
        expect(lh_fencing_token(c, lease, &mut u64v), LH_ERR_POISONED);
        expect(lh_valid_until(c, lease, &mut u64v), LH_ERR_POISONED);
        expect(lh_is_held(c, lease, 0, &mut b), LH_ERR_POISONED);
        expect(lh_counters_get(c, &mut k), LH_ERR_POISONED);
        expect(lh_io_poll(c, req.as_mut_ptr()), LH_ERR_POISONED);
        expect(
            lh_io_reply(
                c,
                0,
                a.id,
                values.as_ptr(),
                values.len(),
                data.as_ptr(),
                data.len(),
            ),
            LH_ERR_POISONED,
        );
        expect(
            lh_io_http_reply(c, 0, a.id, 200, null(), 0),
            LH_ERR_POISONED,
        );
        expect(lh_io_stream_message(c, 0, a.id, null(), 0), LH_ERR_POISONED);
        expect(
            lh_io_failed(c, 0, a.id, LH_FAILURE_TRANSPORT, null(), 0),
            LH_ERR_POISONED,
        );
        expect(
            lh_io_message(c, 0, NAME.as_ptr(), 6, null(), 0),
            LH_ERR_POISONED,
        );
        expect(
            lh_io_connection(
                c,
                0,
                LH_CONNECTION_COMMANDS,
                LH_CONNECTION_REOPENED,
                null(),
                0,
            ),
            LH_ERR_POISONED,
        );
        expect(lh_io_close(c, 0), LH_ERR_POISONED);
        expect(
            lh_status_request(c, 0, NAME.as_ptr(), 6, &mut u64v),
            LH_ERR_POISONED,
        );
        expect(lh_poll_status(c, &mut st), LH_ERR_POISONED);
        assert_eq!(CStr::from_ptr(lh_backend_last_error(c)).to_bytes(), b"");
    }
    assert!(h.last_error().contains("poisoned"));
    assert_eq!((u64v, u32v), (1, 1));
    held(&other, 0, 3000, 4);
}

#[test]
fn free_with_pending_work() {
    let h = client();
    for i in 0..200u64 {
        let name = format!("lock-{i}");
        h.acquire(i, name.as_bytes(), &opts(3000)).unwrap();
    }
    assert_eq!(h.counters().live_leases, 200);
    // Half the requests polled and never answered, half never polled.
    for _ in 0..100 {
        h.poll().unwrap();
    }
    drop(h); // unpolled requests and unanswered ones are freed with the handle
}

#[test]
fn struct_layouts_match_what_bindings_mirror() {
    use std::mem::offset_of;
    // LP64 layouts that ctypes / cgo / C++ mirror field for field; a change is an ABI break.
    assert_eq!(size_of::<lh_config>(), 64);
    assert_eq!(offset_of!(lh_config, drift_fixed_ns), 8);
    assert_eq!(offset_of!(lh_config, max_leases), 56);
    assert_eq!(size_of::<lh_acquire_options>(), 24);
    assert_eq!(size_of::<lh_event>(), 32);
    assert_eq!(offset_of!(lh_event, lease_id), 8);
    assert_eq!(offset_of!(lh_event, valid_until_ns), 24);
    assert_eq!(size_of::<lh_lease_info>(), 32);
    assert_eq!(size_of::<lh_bytes>(), 16);
    assert_eq!(size_of::<lh_value>(), 32);
    assert_eq!(offset_of!(lh_value, integer), 8);
    assert_eq!(offset_of!(lh_value, len), 24);
    assert_eq!(size_of::<lh_sql_statement>(), 24);
    assert_eq!(size_of::<lh_io_request>(), 144);
    assert_eq!(offset_of!(lh_io_request, argv), 16);
    assert_eq!(offset_of!(lh_io_request, argc), 24);
    assert_eq!(offset_of!(lh_io_request, statements), 32);
    assert_eq!(offset_of!(lh_io_request, data), 56);
    assert_eq!(offset_of!(lh_io_request, authorization), 88);
    // The stream fields, appended.
    assert_eq!(offset_of!(lh_io_request, stream), 96);
    assert_eq!(offset_of!(lh_io_request, host), 112);
    assert_eq!(offset_of!(lh_io_request, port), 136);
    assert_eq!(size_of::<lh_backend_options>(), 136);
    assert_eq!(offset_of!(lh_backend_options, redis_url), 88);
    assert_eq!(offset_of!(lh_backend_options, redis_protocol), 120);
    assert_eq!(offset_of!(lh_backend_options, redis_sharded_wake), 40);
    assert_eq!(offset_of!(lh_backend_options, sqlite_busy_timeout_ms), 48);
    assert_eq!(offset_of!(lh_backend_options, etcd_password_len), 80);
    assert_eq!(size_of::<lh_memory_answer>(), 40);
    assert_eq!(offset_of!(lh_memory_answer, values), 8);
    assert_eq!(size_of::<lh_lock_status>(), 96);
    // lh_counters grows at the end only (older hosts pass LH_COUNTERS_V1_SIZE).
    assert_eq!(offset_of!(lh_counters, time_clamped), 112);
    assert_eq!(
        offset_of!(lh_counters, renewals_requested),
        LH_COUNTERS_V1_SIZE
    );
    assert_eq!(offset_of!(lh_counters, releases_lost), 152);
    assert_eq!(offset_of!(lh_counters, backend_requests), 160);
    assert_eq!(offset_of!(lh_counters, etcd_waiters_expired), 320);
    assert_eq!(offset_of!(lh_counters, stream_opens), 328);
    assert_eq!(offset_of!(lh_counters, sentinel_lookups), 352);
    assert_eq!(offset_of!(lh_counters, cluster_refreshes), 360);
    assert_eq!(offset_of!(lh_counters, cluster_redirects), 368);
    assert_eq!(size_of::<lh_counters>(), 376);
}

#[test]
fn separate_handles_run_on_separate_threads() {
    // Handles share no state: one client and one service per thread, concurrently, each
    // through full lifecycles on the memory service.
    let threads: Vec<_> = (0..4u8)
        .map(|i| {
            std::thread::spawn(move || {
                let svc = Svc::new();
                let m = Mem::new(&svc, i + 1);
                for round in 0..50u64 {
                    let t = round * 10 * MS;
                    let lease = m.h.acquire(t, NAME, &opts(3000)).unwrap();
                    m.serve(&svc, t + MS);
                    let acq = find(&m.h.events(), LH_EVENT_ACQUIRED).expect("acquired");
                    assert_eq!(acq.fencing_token, round + 1);
                    ok(m.h.release(t + 5 * MS, lease));
                    assert_eq!(m.serve(&svc, t + 6 * MS).len(), 1);
                    assert!(find(&m.h.events(), LH_EVENT_RELEASED).is_some());
                }
                let k = m.h.counters();
                assert_eq!(svc.stats().releases, 50);
                (k.grants, k.pending_cleanups)
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), (50, 0));
    }
}

#[test]
fn same_seed_same_tokens_and_reseed_changes_them() {
    let token_of = |h: &H| acquire_req(h, 0, b"x", &opts(3000)).1.args[2].clone();
    let (a, b, c) = (client(), client(), client());
    let ta = token_of(&a);
    assert_eq!(ta, token_of(&b), "fixed seeds must replay identically");
    // SAFETY: valid handle and seed.
    ok(unsafe { lh_client_reseed(c.0, [0xc5u8; 32].as_ptr(), 32) });
    assert_ne!(
        ta,
        token_of(&c),
        "a reseeded (forked) client must not repeat tokens"
    );
}

// ------------------------------------------- manual renew, auto_renew, release outcomes

fn renew(h: &H, now: u64, lease: u64) -> lh_status {
    // SAFETY: live handle.
    unsafe { lh_renew(h.0, now, lease) }
}

#[test]
fn manual_renew_through_the_service() {
    let svc = Svc::new();
    let m = Mem::new(&svc, 1);
    let lease = m.h.acquire(0, NAME, &opts(3000)).unwrap();
    m.serve(&svc, 0);
    assert!(find(&m.h.events(), LH_EVENT_ACQUIRED).is_some());
    expect(renew(&m.h, 500 * MS, lease), LH_OK);
    assert!(m.h.events().is_empty());
    let ran = m.serve(&svc, 501 * MS);
    assert_eq!(ran.len(), 1, "{ran:?}");
    assert_eq!(ran[0].args[0], b"RENEW");
    let evs = m.h.events();
    let ev = find(&evs, LH_EVENT_RENEWED).expect("renewed");
    // From the send time: 500 ms + 3000 ms − (30 ms + 2 ms).
    assert_eq!((ev.lease_id, ev.valid_until_ns), (lease, 3468 * MS));
    assert_eq!(ev.reason, LH_REASON_NONE);
    assert_eq!(m.h.counters().renewals_requested, 1);
    assert_eq!(svc.stats().renewals, 1);
    // The service agrees: its grant runs from the renewal it saw.
    let st = svc.status(501 * MS, NAME);
    assert_eq!(
        (st.held, st.fencing_token, st.remaining_ttl_ms),
        (1, 1, 3000)
    );
}

#[test]
fn manual_renew_of_ended_unknown_or_acquiring_leases_sends_nothing() {
    let h = client();
    let released = held(&h, 0, 3000, 5);
    ok(h.release(MS, released));
    h.requests();
    h.events();
    let before = h.counters();
    expect(renew(&h, 2 * MS, released), LH_ERR_LEASE_ENDED);
    assert!(h.last_error().contains("ended"), "{}", h.last_error());
    expect(renew(&h, 2 * MS, 0), LH_ERR_UNKNOWN_LEASE);
    expect(renew(&h, 2 * MS, u64::MAX), LH_ERR_UNKNOWN_LEASE);
    let (acquiring, _) = acquire_req(&h, 3 * MS, b"other", &opts(3000));
    expect(renew(&h, 4 * MS, acquiring), LH_ERR_NOT_GRANTED);
    assert!(h.poll().is_none() && h.event().is_none(), "nothing sent");
    let k = h.counters();
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
    ok(h2.timeout(10_000 * MS));
    assert!(find(&h2.events(), LH_EVENT_LOST).is_some());
    h2.requests();
    let sent = h2.counters().renewals_sent;
    expect(renew(&h2, 10_001 * MS, lease), LH_ERR_LEASE_ENDED);
    assert!(h2.poll().is_none() && h2.event().is_none());
    assert_eq!(h2.counters().renewals_sent, sent);
}

#[test]
fn no_auto_renew_flag_through_the_abi() {
    let h = client();
    let mut o = opts(3000);
    o.flags = LH_ACQUIRE_NO_AUTO_RENEW | LH_ACQUIRE_REENTRANT;
    let (lease, a) = acquire_req(&h, 0, NAME, &o);
    ok(h.reply(MS, a.id, &granted(4)));
    h.events();
    let mut now = MS;
    let lost = advance_until_event(&h, &mut now, LH_EVENT_LOST).expect("lost at valid_until");
    assert_eq!((lost.lease_id, lost.reason), (lease, LH_REASON_EXPIRED));
    assert_eq!(h.counters().renewals_sent, 0);
}

fn release_reported(h: &H, now: u64, lease: u64) -> Result<u32, lh_status> {
    let mut out = 0xdead;
    // SAFETY: live handle, valid out-pointer.
    let st = unsafe { lh_release(h.0, now, lease, &mut out) };
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
        ("RELEASED", LH_REASON_RELEASE_CONFIRMED),
        ("NOT_OWNER", LH_REASON_RELEASE_NOT_OWNER),
    ] {
        let h = client();
        let lease = held(&h, 0, 3000, 5);
        assert_eq!(release_reported(&h, MS, lease), Ok(LH_RELEASING_PENDING));
        assert!(find(&h.events(), LH_EVENT_RELEASED).is_some());
        let rel = h.poll().expect("release");
        assert_eq!(rel.args[0], b"RELEASE");
        ok(h.reply(2 * MS, rel.id, &word(answer, vec![])));
        let ev = find(&h.events(), LH_EVENT_RELEASE_OUTCOME).expect("outcome");
        assert_eq!((ev.lease_id, ev.reason), (lease, reason));
        let k = h.counters();
        assert_eq!(k.releases_confirmed + k.releases_not_owner, 1);
        assert_eq!(release_reported(&h, 3 * MS, lease), Err(LH_ERR_LEASE_ENDED));
    }
    // No answer before the grant has certainly run out: UNCONFIRMED.
    let h = client();
    let lease = held(&h, 0, 3000, 5);
    assert_eq!(release_reported(&h, MS, lease), Ok(LH_RELEASING_PENDING));
    let rel = h.poll().expect("release");
    ok(h.failed(2 * MS, rel.id, LH_FAILURE_TRANSPORT, b"connection reset"));
    let mut now = 2 * MS;
    let ev = advance_until_event(&h, &mut now, LH_EVENT_RELEASE_OUTCOME).expect("outcome");
    assert_eq!(
        (ev.lease_id, ev.reason),
        (lease, LH_REASON_RELEASE_UNCONFIRMED)
    );
    assert!(
        h.backend_error().contains("connection reset"),
        "{}",
        h.backend_error()
    );

    let h = client();
    assert_eq!(release_reported(&h, 0, 77), Err(LH_ERR_UNKNOWN_LEASE));
    let mut out = 0;
    // SAFETY: a NULL handle is an error, not UB.
    expect(
        unsafe { lh_release(null_mut(), 0, 1, &mut out) },
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
    let evs = h.events();
    let lost = find(&evs, LH_EVENT_LOST).expect("lost");
    assert_eq!((lost.lease_id, lost.reason), (lease, LH_REASON_EXPIRED));
    assert!(find(&evs, LH_EVENT_RELEASED).is_none());
    assert_eq!(h.counters().releases_lost, 1);
    // The plain release says the same through the events.
    let h = client();
    let lease = held(&h, 0, 3000, 5);
    ok(h.release(10_000 * MS, lease));
    let evs = h.events();
    assert!(find(&evs, LH_EVENT_LOST).is_some() && find(&evs, LH_EVENT_RELEASED).is_none());
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
        // A host built against ABI 2's struct (up to releases_lost) gets no backend fields.
        let v2 = std::mem::offset_of!(lh_counters, backend_requests);
        k.struct_size = v2 as u32;
        k.backend_requests = 0xdead;
        expect(lh_counters_get(h.0, &mut k), LH_OK);
        assert_eq!((k.struct_size as usize, k.releases_lost), (v2, 0));
        assert_eq!(
            k.backend_requests, 0xdead,
            "written past the caller's struct"
        );
        // A host built against the struct before the Redis stream fields gets none of them.
        let before_stream = std::mem::offset_of!(lh_counters, stream_opens);
        k = std::mem::zeroed();
        k.struct_size = before_stream as u32;
        k.stream_opens = 0xdead;
        k.sentinel_lookups = 0xdead;
        expect(lh_counters_get(h.0, &mut k), LH_OK);
        assert_eq!(k.struct_size as usize, before_stream);
        assert_eq!((k.grants, k.backend_requests), (1, 1));
        assert_eq!(
            (k.stream_opens, k.sentinel_lookups),
            (0xdead, 0xdead),
            "written past the caller's struct"
        );
        // Nor before the Cluster fields.
        let before_cluster = std::mem::offset_of!(lh_counters, cluster_refreshes);
        k = std::mem::zeroed();
        k.struct_size = before_cluster as u32;
        k.cluster_refreshes = 0xdead;
        k.cluster_redirects = 0xdead;
        expect(lh_counters_get(h.0, &mut k), LH_OK);
        assert_eq!(k.struct_size as usize, before_cluster);
        assert_eq!(k.sentinel_lookups, 0);
        assert_eq!(
            (k.cluster_refreshes, k.cluster_redirects),
            (0xdead, 0xdead),
            "written past the caller's struct"
        );
        // A bigger struct than the library's (a newer header) gets the library's size back.
        const WORDS: usize = size_of::<lh_counters>() / 8;
        let mut big = [u64::MAX; WORDS + 2];
        let bp = big.as_mut_ptr().cast::<lh_counters>();
        (*bp).struct_size = (size_of::<u64>() * big.len()) as u32;
        expect(lh_counters_get(h.0, bp), LH_OK);
        let got = bp.read();
        assert_eq!(got.struct_size as usize, size_of::<lh_counters>());
        assert_eq!((got.grants, got.stream_opens), (1, 0));
        assert_eq!(
            big[WORDS..],
            [u64::MAX; 2],
            "written past the library's struct"
        );
        k.struct_size = LH_COUNTERS_V1_SIZE as u32 - 8;
        expect(lh_counters_get(h.0, &mut k), LH_ERR_STRUCT_SIZE);
    }
    assert_eq!(h.counters().backend_requests, 1);
}

// --------------------------------------------------- the service's fault switches

/// Fault switches of the memory service (test hooks of the `testing` feature) turn into the
/// engine's rejections and transport errors through the seam.
#[cfg(feature = "testing")]
#[test]
fn fault_switches_through_the_service_become_rejections_and_transport_errors() {
    let svc = Svc::new();
    let m = Mem::new(&svc, 1);
    let lease = m.h.acquire(0, NAME, &opts(3000)).unwrap();
    m.serve(&svc, 0);
    assert!(find(&m.h.events(), LH_EVENT_ACQUIRED).is_some());

    // One host loop step: time to the next deadline, then every request run.
    let mut now = 0;
    let mut step = || {
        now = now.max(m.h.deadline());
        ok(m.h.timeout(now));
        (now, m.serve(&svc, now), m.h.events())
    };
    // Dropped requests are transport failures: the renewal is retried, the lease survives.
    svc.set_faults(m.conn, LH_MEMORY_DROP_REQUESTS, 0);
    let (_, ran, evs) = step();
    assert!(ran.iter().any(|r| r.args[0] == b"RENEW"), "{ran:?}");
    assert!(evs.is_empty(), "{evs:?}");
    let k = m.h.counters();
    assert!(k.backend_transport_failures >= 1 && k.renewals_failed >= 1);
    assert_eq!(m.h.state(lease), Ok(LH_STATE_HELD));

    // A rejecting service: the next renewal loses the lease (REJECTED).
    svc.set_faults(m.conn, LH_MEMORY_REJECT_RENEWALS, 0);
    let lost = (0..50)
        .find_map(|_| find(&step().2, LH_EVENT_LOST))
        .expect("lost");
    assert_eq!((lost.lease_id, lost.reason), (lease, LH_REASON_REJECTED));
    assert_eq!(svc.stats().renewals_rejected, 1);

    // Rejected acquires are HELD without a hint: one attempt fails WAIT_EXHAUSTED.
    svc.set_faults(m.conn, LH_MEMORY_REJECT_ACQUIRES, 0);
    let l2 = m.h.acquire(now, b"other", &opts(3000)).unwrap();
    m.serve(&svc, now);
    let f = find(&m.h.events(), LH_EVENT_ACQUIRE_FAILED).expect("failed");
    assert_eq!((f.lease_id, f.reason), (l2, LH_REASON_WAIT_EXHAUSTED));
    assert_eq!(svc.status(now, b"other").held, 0);
}
