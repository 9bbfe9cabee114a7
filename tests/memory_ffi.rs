//! Drives the memory service's C ABI (`lh_memory_service_*`, its requests through
//! `lh_memory_service_call`) from Rust with hostile input: NULL for every pointer, malformed
//! requests (unknown words, invalid UTF-8 and oversized names and tokens, bad TTLs, too many
//! or too few arguments, lengths no buffer could have), unknown connections, unknown fault
//! bits, small struct sizes and a poisoning panic. Misuse of the call yields its documented
//! code and writes no out-parameter; a malformed request is an error *answer*; either way the
//! service is left as it was.
#![allow(unsafe_code)]
// The fault switches and the panic hook are test hooks: exported with the `testing` feature only.
#![cfg(feature = "testing")]

#[path = "support/abi.rs"]
mod abi;

use std::ffi::CStr;
use std::ptr::{null, null_mut};

use abi::*;
use leasehold::ffi::*;

const TOKEN: &[u8] = b"0123456789abcdef0123456789abcdef";

fn faults(flags: u32) -> lh_memory_faults {
    lh_memory_faults {
        struct_size: size_of::<lh_memory_faults>() as u32,
        flags,
        drop_next_responses: 0,
        _reserved: 0,
    }
}

fn acquire(s: &Svc, conn: u64, now: u64, name: &[u8], token: &[u8]) -> Vec<String> {
    s.call(conn, now, &[b"ACQUIRE", name, token, b"1000"])
        .expect("a call")
        .words()
}

fn grants(s: &Svc) -> (u64, u64) {
    let k = s.stats();
    (k.names, k.grants)
}

#[test]
fn new_rejects_hostile_configs_and_writes_nothing() {
    let sentinel = std::ptr::dangling_mut::<lh_memory_service>();
    let mut p = sentinel;
    let good = memory_config();
    let mut small = good;
    small.struct_size -= 1;
    let mut zero = good;
    zero.max_names = 0;
    let mut huge = good;
    huge.max_watches = u32::MAX;
    // SAFETY: pointers to locals or NULL.
    unsafe {
        expect(lh_memory_service_new(null(), &mut p), LH_ERR_NULL_ARGUMENT);
        expect(
            lh_memory_service_new(&good, null_mut()),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(lh_memory_service_new(&small, &mut p), LH_ERR_STRUCT_SIZE);
        expect(lh_memory_service_new(&zero, &mut p), LH_ERR_INVALID_CONFIG);
        expect(lh_memory_service_new(&huge, &mut p), LH_ERR_INVALID_CONFIG);
        lh_memory_config_default(null_mut());
        lh_memory_service_free(null_mut());
        assert_eq!(
            CStr::from_ptr(lh_memory_service_last_error(null())).to_bytes(),
            b""
        );
    }
    assert_eq!(p, sentinel, "out untouched on error");
    let d = memory_config();
    assert_eq!(
        (d.max_names, d.max_connections, d.max_watches, d.max_pending),
        (65_536, 1_024, 4_096, 1_024)
    );
}

#[test]
fn null_handle_everywhere() {
    let mut a = answer_out();
    let mut u = 0u64;
    let mut p: *const u8 = null();
    let mut n = 0usize;
    let f = faults(0);
    let mut fo = faults(0);
    // SAFETY: plain data; zeroed is valid.
    let mut st: lh_memory_status = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut k: lh_memory_stats = unsafe { std::mem::zeroed() };
    let h = null_mut();
    let nm = b"n".as_ptr();
    let argv = [
        lh_bytes {
            ptr: b"WATCH".as_ptr(),
            len: 5,
        },
        lh_bytes { ptr: nm, len: 1 },
    ];
    // SAFETY: a NULL handle is checked first; other pointers are valid.
    unsafe {
        for code in [
            lh_memory_service_connect(h, &mut u),
            lh_memory_service_disconnect(h, 1),
            lh_memory_service_call(h, 1, 0, argv.as_ptr(), 2, &mut a),
            lh_memory_service_status(h, 0, nm, 1, &mut st),
            lh_memory_service_poll_released(h, 1, &mut p, &mut n),
            lh_memory_service_set_faults(h, 1, &f),
            lh_memory_service_get_faults(h, 1, &mut fo),
            lh_memory_service_step_clock(h, 1),
            lh_memory_service_forget(h, nm, 1),
            lh_memory_service_stats_get(h, &mut k),
            lh_memory_service_debug_panic(h),
        ] {
            expect(code, LH_ERR_NULL_ARGUMENT);
        }
    }
    assert_eq!((a.dropped, a.nvalues, u), (7, 7, 0));
}

#[test]
fn null_arguments_are_errors_and_change_nothing() {
    let s = Svc::new();
    let c = s.connect();
    let mut a = answer_out();
    let mut p: *const u8 = null();
    let mut n = 0usize;
    let nm = b"n".as_ptr();
    let arg = |ptr: *const u8, len| lh_bytes { ptr, len };
    let acquire_with = |name: lh_bytes, token: lh_bytes| {
        [
            arg(b"ACQUIRE".as_ptr(), 7),
            name,
            token,
            arg(b"1000".as_ptr(), 4),
        ]
    };
    // SAFETY: plain data; zeroed is valid.
    let mut ms: lh_memory_status = unsafe { std::mem::zeroed() };
    ms.struct_size = size_of::<lh_memory_status>() as u32;
    let null_name = acquire_with(arg(null(), 1), arg(TOKEN.as_ptr(), 32));
    let null_token = acquire_with(arg(nm, 1), arg(null(), 32));
    let good = acquire_with(arg(nm, 1), arg(TOKEN.as_ptr(), 32));
    // SAFETY: the NULLs are checked; other pointers are valid.
    unsafe {
        for code in [
            lh_memory_service_connect(s.0, null_mut()),
            lh_memory_service_call(s.0, c, 0, null(), 4, &mut a),
            lh_memory_service_call(s.0, c, 0, null(), 0, &mut a),
            lh_memory_service_call(s.0, c, 0, null_name.as_ptr(), 4, &mut a),
            lh_memory_service_call(s.0, c, 0, null_token.as_ptr(), 4, &mut a),
            lh_memory_service_call(s.0, c, 0, good.as_ptr(), 4, null_mut()),
            lh_memory_service_status(s.0, 0, nm, 1, null_mut()),
            lh_memory_service_status(s.0, 0, null(), 1, &mut ms),
            lh_memory_service_poll_released(s.0, c, null_mut(), &mut n),
            lh_memory_service_poll_released(s.0, c, &mut p, null_mut()),
            lh_memory_service_set_faults(s.0, c, null()),
            lh_memory_service_get_faults(s.0, c, null_mut()),
            lh_memory_service_forget(s.0, null(), 1),
            lh_memory_service_stats_get(s.0, null_mut()),
        ] {
            expect(code, LH_ERR_NULL_ARGUMENT);
        }
    }
    assert!(s.last_error().contains("NULL"), "{}", s.last_error());
    assert_eq!((a.dropped, a.nvalues), (7, 7), "out untouched");
    assert_eq!(grants(&s), (0, 0), "nothing granted");
    // An empty argument may be NULL: it is a malformed request, answered as one.
    let empty_name = acquire_with(arg(null(), 0), arg(TOKEN.as_ptr(), 32));
    // SAFETY: as above.
    ok(unsafe { lh_memory_service_call(s.0, c, 0, empty_name.as_ptr(), 4, &mut a) });
    assert_eq!(a.dropped, 0);
    assert_eq!(
        acquire(&s, c, 0, b"n", TOKEN),
        ["[2]", "GRANTED", "1"],
        "still usable"
    );
}

#[test]
fn malformed_requests_are_error_answers_that_change_nothing() {
    let s = Svc::new();
    let c = s.connect();
    let long_name = vec![b'x'; LH_MAX_NAME_LEN + 1];
    let long_token = [b't'; LH_MEMORY_MAX_TOKEN_LEN + 1];
    let nine: Vec<&[u8]> = vec![b"ACQUIRE"; 9];
    let cases: Vec<(Vec<&[u8]>, &str)> = vec![
        (vec![b"ACQUIRE", b"\xff\xfe", TOKEN, b"1000"], "UTF-8"),
        (vec![b"ACQUIRE", &long_name, TOKEN, b"1000"], "limit is 512"),
        (vec![b"ACQUIRE", b"", TOKEN, b"1000"], "empty"),
        (vec![b"ACQUIRE", b"a\0b", TOKEN, b"1000"], "NUL"),
        (vec![b"ACQUIRE", b"n", b"", b"1000"], "token"),
        (vec![b"ACQUIRE", b"n", &long_token, b"1000"], "token"),
        (vec![b"ACQUIRE", b"n", TOKEN, b"abc"], "ttl_ms"),
        (vec![b"ACQUIRE", b"n", TOKEN, b"-1"], "ttl_ms"),
        (
            vec![b"ACQUIRE", b"n", TOKEN, b"99999999999999999999"],
            "ttl_ms",
        ),
        (vec![b"ACQUIRE", b"n", TOKEN, b"0"], "TTL"),
        (vec![b"RENEW", b"n", TOKEN, b"0"], "TTL"),
        (vec![b"ACQUIRE", b"n", TOKEN], "unknown request"),
        (
            vec![b"ACQUIRE", b"n", TOKEN, b"1000", b"extra"],
            "unknown request",
        ),
        (vec![b"acquire", b"n", TOKEN, b"1000"], "unknown request"),
        (vec![b"FLUSHALL", b"n"], "unknown request"),
        (vec![b"WATCH", b"n", b"x"], "unknown request"),
        (vec![b"WATCH"], "a command word and a name"),
        (vec![], "a command word and a name"),
        (nine, "at most 8"),
    ];
    for (args, why) in &cases {
        let a = s.call(c, 0, args).expect("an answer");
        let words = a.words();
        assert!(!a.dropped && words.len() == 1, "{args:?}: {words:?}");
        assert!(words[0].starts_with("-ERR "), "{args:?}: {words:?}");
        assert!(words[0].contains(why), "{args:?}: {words:?} lacks {why}");
    }
    let k = s.stats();
    assert_eq!((k.names, k.grants, k.watches), (0, 0, 0));
    let mut a = answer_out();
    let big = [lh_bytes {
        ptr: TOKEN.as_ptr(),
        len: usize::MAX,
    }];
    let many: Vec<lh_bytes> = (0..65)
        .map(|_| lh_bytes {
            ptr: b"n".as_ptr(),
            len: 1,
        })
        .collect();
    // SAFETY: the lengths and counts are refused before anything is read.
    unsafe {
        expect(
            lh_memory_service_call(s.0, c, 0, big.as_ptr(), 1, &mut a),
            LH_ERR_INVALID_REPLY,
        );
        expect(
            lh_memory_service_call(s.0, c, 0, many.as_ptr(), 65, &mut a),
            LH_ERR_INVALID_REPLY,
        );
        expect(
            lh_memory_service_call(s.0, c, 0, many.as_ptr(), u32::MAX, &mut a),
            LH_ERR_INVALID_REPLY,
        );
    }
    assert_eq!((a.dropped, a.nvalues), (7, 7));
    // 64 arguments are read, and answered as a malformed request.
    let words = s.call(c, 0, &vec![&b"n"[..]; 64]).unwrap().words();
    assert!(words[0].contains("64 arguments"), "{words:?}");
    // The status export still checks names itself.
    // SAFETY: plain data; zeroed is valid.
    let mut ms: lh_memory_status = unsafe { std::mem::zeroed() };
    ms.struct_size = size_of::<lh_memory_status>() as u32;
    for (name, want) in [
        (&b"\xff"[..], LH_ERR_INVALID_UTF8),
        (&long_name[..], LH_ERR_NAME_TOO_LONG),
        (b"", LH_ERR_EMPTY_NAME),
        (b"a\0b", LH_ERR_NAME_HAS_NUL),
    ] {
        // SAFETY: valid pointers.
        let code = unsafe { lh_memory_service_status(s.0, 0, name.as_ptr(), name.len(), &mut ms) };
        expect(code, want);
    }
    // SAFETY: the length is refused before any byte is read.
    let code = unsafe { lh_memory_service_status(s.0, 0, b"n".as_ptr(), usize::MAX, &mut ms) };
    expect(code, LH_ERR_NAME_TOO_LONG);
    assert_eq!(ms.held, 0);
}

#[test]
fn unknown_connections_fault_bits_and_struct_sizes() {
    let s = Svc::new();
    let c = s.connect();
    assert_eq!(
        s.call(0, 0, &[b"ACQUIRE", b"n", TOKEN, b"1000"]),
        Err(LH_ERR_UNKNOWN_CONNECTION)
    );
    assert_eq!(
        s.call(c + 1, 0, &[b"STATUS", b"n"]),
        Err(LH_ERR_UNKNOWN_CONNECTION)
    );
    assert!(
        s.last_error().contains("unknown connection"),
        "{}",
        s.last_error()
    );
    let mut small = answer_out();
    small.struct_size = 8;
    let bad_bits = faults(64);
    let mut short = faults(0);
    short.struct_size = 4;
    let argv = [
        lh_bytes {
            ptr: b"STATUS".as_ptr(),
            len: 6,
        },
        lh_bytes {
            ptr: b"n".as_ptr(),
            len: 1,
        },
    ];
    // SAFETY: valid pointers; the sizes are checked before anything is read or written.
    unsafe {
        expect(
            lh_memory_service_call(s.0, c, 0, argv.as_ptr(), 2, &mut small),
            LH_ERR_STRUCT_SIZE,
        );
        expect(
            lh_memory_service_set_faults(s.0, c, &bad_bits),
            LH_ERR_INVALID_ENUM,
        );
        expect(
            lh_memory_service_set_faults(s.0, c, &short),
            LH_ERR_STRUCT_SIZE,
        );
        expect(
            lh_memory_service_get_faults(s.0, c, &mut short),
            LH_ERR_STRUCT_SIZE,
        );
        expect(
            lh_memory_service_disconnect(s.0, c + 7),
            LH_ERR_UNKNOWN_CONNECTION,
        );
    }
    assert_eq!((small.dropped, small.nvalues), (7, 7));
    assert_eq!(s.status(0, b"n").held, 0, "a refused call granted nothing");
    let mut f = faults(0);
    // SAFETY: valid pointer.
    ok(unsafe { lh_memory_service_get_faults(s.0, c, &mut f) });
    assert_eq!(f.flags, 0, "the bad switches were not applied");
    // A larger answer struct (a newer host) is fine; its size is set to the library's.
    let mut large = answer_out();
    large.struct_size += 16;
    // SAFETY: valid pointers (the library writes only its own struct).
    ok(unsafe { lh_memory_service_call(s.0, c, 0, argv.as_ptr(), 2, &mut large) });
    assert_eq!(large.struct_size as usize, size_of::<lh_memory_answer>());
}

#[test]
fn answers_are_the_memory_wire_and_fault_switches_change_them() {
    let s = Svc::new();
    let (a, b) = (s.connect(), s.connect());
    assert_eq!(acquire(&s, a, 0, b"n", TOKEN), ["[2]", "GRANTED", "1"]);
    // Idempotent for the same token: the same grant.
    assert_eq!(acquire(&s, a, 0, b"n", TOKEN), ["[2]", "GRANTED", "1"]);
    // Someone else: HELD with the holder's remaining TTL.
    assert_eq!(
        acquire(&s, b, 400 * MS, b"n", b"other"),
        ["[2]", "HELD", "600"]
    );
    let call = |conn, args: &[&[u8]]| s.call(conn, 400 * MS, args).unwrap();
    assert_eq!(
        call(a, &[b"RENEW", b"n", TOKEN, b"1000"]).words(),
        ["[1]", "RENEWED"]
    );
    assert_eq!(
        call(b, &[b"RENEW", b"n", b"other", b"1000"]).words(),
        ["[1]", "REJECTED"]
    );
    assert_eq!(call(b, &[b"WATCH", b"n"]).words(), ["OK"]);
    // [STATUS held fence left_ms last_fence held_for_ms]
    assert_eq!(
        call(b, &[b"STATUS", b"n"]).words(),
        ["[6]", "STATUS", "1", "1", "1000", "1", "400"]
    );
    let set = |conn, flags| {
        // SAFETY: live handle, valid pointer.
        ok(unsafe { lh_memory_service_set_faults(s.0, conn, &faults(flags)) });
    };
    set(a, LH_MEMORY_PARTITIONED);
    let r = call(a, &[b"RENEW", b"n", TOKEN, b"1000"]);
    assert!(r.dropped && r.values.is_empty(), "{r:?}");
    set(a, LH_MEMORY_REJECT_ALL);
    assert_eq!(
        call(a, &[b"RENEW", b"n", TOKEN, b"1000"]).words(),
        ["[1]", "REJECTED"]
    );
    assert_eq!(
        call(a, &[b"RELEASE", b"n", TOKEN]).words(),
        ["[1]", "NOT_OWNER"]
    );
    assert_eq!(
        call(a, &[b"ACQUIRE", b"m", TOKEN, b"1000"]).words(),
        ["[2]", "HELD", "nil"]
    );
    assert_eq!(s.status(MS, b"n").held, 1, "rejections touched nothing");
    set(a, LH_MEMORY_DROP_RESPONSES);
    let r = call(a, &[b"RELEASE", b"n", TOKEN]);
    assert!(r.dropped, "{r:?}");
    assert_eq!(
        s.status(MS, b"n").held,
        0,
        "the dropped-answer release was applied"
    );
    assert_eq!(
        s.released(b).as_deref(),
        Some(&b"n"[..]),
        "the watcher hears of it"
    );
    set(a, LH_MEMORY_DROP_REQUESTS);
    let r = call(a, &[b"ACQUIRE", b"n", TOKEN, b"1000"]);
    assert!(r.dropped, "{r:?}");
    assert_eq!(
        s.status(MS, b"n").held,
        0,
        "a dropped request is not applied"
    );
    set(a, 0);
    assert_eq!(acquire(&s, a, MS, b"n", TOKEN), ["[2]", "GRANTED", "2"]);
    assert_eq!(
        call(a, &[b"RELEASE", b"n", TOKEN]).words(),
        ["[1]", "RELEASED"]
    );
    assert_eq!(call(b, &[b"UNWATCH", b"n"]).words(), ["OK"]);
}

#[test]
fn notifications_are_polled_with_a_borrowed_name() {
    let s = Svc::new();
    let (a, b) = (s.connect(), s.connect());
    let name = "wait-here";
    let (mut p, mut n): (*const u8, usize) = (std::ptr::dangling(), 7);
    assert_eq!(
        s.call(b, 0, &[b"WATCH", name.as_bytes()]).unwrap().words(),
        ["OK"]
    );
    // SAFETY: valid pointers; the borrowed name is copied before the next call.
    unsafe {
        ok(lh_memory_service_poll_released(s.0, b, &mut p, &mut n));
        assert_eq!((p, n), (null(), 0), "none queued: NULL, 0");
    }
    acquire(&s, a, 0, name.as_bytes(), TOKEN);
    let r = s.call(a, 0, &[b"RELEASE", name.as_bytes(), TOKEN]).unwrap();
    assert_eq!(r.words(), ["[1]", "RELEASED"]);
    // SAFETY: as above.
    unsafe {
        ok(lh_memory_service_poll_released(s.0, b, &mut p, &mut n));
        assert_eq!(std::slice::from_raw_parts(p, n), name.as_bytes());
        ok(lh_memory_service_poll_released(s.0, b, &mut p, &mut n));
        assert_eq!((p, n), (null(), 0));
    }
    assert_eq!(
        s.call(b, 0, &[b"UNWATCH", name.as_bytes()])
            .unwrap()
            .words(),
        ["OK"]
    );
    // SAFETY: as above.
    unsafe {
        ok(lh_memory_service_disconnect(s.0, b));
        expect(
            lh_memory_service_poll_released(s.0, b, &mut p, &mut n),
            LH_ERR_UNKNOWN_CONNECTION,
        );
    }
    assert_eq!(
        s.call(b, 0, &[b"WATCH", b"n"]),
        Err(LH_ERR_UNKNOWN_CONNECTION)
    );
}

#[test]
fn status_copies_the_holder_token() {
    let s = Svc::new();
    let a = s.connect();
    acquire(&s, a, 10 * MS, b"n", TOKEN);
    // SAFETY: valid pointer.
    ok(unsafe { lh_memory_service_step_clock(s.0, -(5 * MS as i64)) });
    let st = s.status(20 * MS, b"n");
    assert_eq!(
        (st.held, st.fencing_token, st.last_fencing_token),
        (1, 1, 1)
    );
    assert_eq!(st.service_now_ns, 15 * MS);
    assert_eq!((st.expires_at_ns, st.remaining_ttl_ms), (1010 * MS, 995));
    assert_eq!((st.held_for_ns, st.holder_connection), (5 * MS, a));
    assert_eq!(&st.holder_token[..st.holder_token_len as usize], TOKEN);
    assert_eq!(st.watchers, 0);
    assert_eq!(
        s.call(a, 20 * MS, &[b"WATCH", b"n"]).unwrap().words(),
        ["OK"]
    );
    assert_eq!(s.status(20 * MS, b"n").watchers, 1);
    // SAFETY: valid pointer.
    ok(unsafe { lh_memory_service_forget(s.0, b"n".as_ptr(), 1) });
    let st = s.status(20 * MS, b"n");
    assert_eq!(
        (st.held, st.holder_token_len, st.last_fencing_token),
        (0, 0, 1)
    );
    // The forgotten grant's renewal is rejected, as after a failover that lost the key.
    let r = s
        .call(a, 20 * MS, &[b"RENEW", b"n", TOKEN, b"1000"])
        .unwrap();
    assert_eq!(r.words(), ["[1]", "REJECTED"]);
}

#[test]
fn a_panic_poisons_only_that_service() {
    let s = Svc::new();
    let other = Svc::new();
    let c = s.connect();
    let mut u = 0;
    // SAFETY: live handles; the panic is caught inside the library.
    unsafe {
        expect(lh_memory_service_debug_panic(s.0), LH_ERR_PANIC);
        assert!(s.last_error().contains("panic"));
        expect(lh_memory_service_connect(s.0, &mut u), LH_ERR_POISONED);
        expect(lh_memory_service_step_clock(s.0, 1), LH_ERR_POISONED);
    }
    assert_eq!(
        s.call(c, 0, &[b"ACQUIRE", b"n", TOKEN, b"1000"]),
        Err(LH_ERR_POISONED)
    );
    assert!(s.last_error().contains("poisoned"));
    assert_eq!(u, 0);
    let oc = other.connect();
    assert_eq!(acquire(&other, oc, 0, b"n", TOKEN), ["[2]", "GRANTED", "1"]);
}

#[test]
fn struct_layouts_match_what_bindings_mirror() {
    use std::mem::offset_of;
    // LP64 layouts that ctypes / cgo / C++ mirror field for field; a change is an ABI break.
    assert_eq!(size_of::<lh_memory_config>(), 20);
    assert_eq!(size_of::<lh_memory_faults>(), 16);
    assert_eq!(size_of::<lh_memory_answer>(), 40);
    assert_eq!(offset_of!(lh_memory_answer, dropped), 4);
    assert_eq!(offset_of!(lh_memory_answer, nvalues), 16);
    assert_eq!(offset_of!(lh_memory_answer, data_len), 32);
    assert_eq!(size_of::<lh_memory_status>(), 136);
    assert_eq!(offset_of!(lh_memory_status, service_now_ns), 56);
    assert_eq!(offset_of!(lh_memory_status, holder_token), 72);
    assert_eq!(size_of::<lh_memory_stats>(), 88);
    assert_eq!(offset_of!(lh_memory_status, watchers), 68);
}
