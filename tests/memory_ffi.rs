//! Drives the memory service's C ABI (`lh_memory_service_*`) from Rust with hostile input:
//! NULL for every pointer, invalid UTF-8 and oversized names and tokens (including lengths
//! no buffer could have), unknown connections, unknown fault bits, small struct sizes and a
//! poisoning panic. Each yields its documented code, writes no out-parameter and leaves the
//! service as it was.
#![allow(unsafe_code)]
// The fault switches and the panic hook are test hooks: exported with the `testing` feature only.
#![cfg(feature = "testing")]

use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::ptr::{null, null_mut};

use leasehold::ffi::*;

const MS: u64 = 1_000_000;
const TOKEN: &[u8] = b"0123456789abcdef0123456789abcdef";

/// Owns a service handle for one test and frees it on drop.
struct S(*mut lh_memory_service);

impl Drop for S {
    fn drop(&mut self) {
        // SAFETY: the handle came from lh_memory_service_new and is not used after drop.
        unsafe { lh_memory_service_free(self.0) }
    }
}

fn config() -> lh_memory_config {
    let mut c = MaybeUninit::<lh_memory_config>::uninit();
    // SAFETY: valid out-pointer; every field is written.
    unsafe {
        lh_memory_config_default(c.as_mut_ptr());
        c.assume_init()
    }
}

fn service() -> S {
    let cfg = config();
    let mut p = null_mut();
    // SAFETY: pointers to live locals.
    assert_eq!(unsafe { lh_memory_service_new(&cfg, &mut p) }, LH_OK);
    assert!(!p.is_null());
    S(p)
}

fn connect(s: &S) -> u64 {
    let mut id = 0;
    // SAFETY: live handle, valid out-pointer.
    assert_eq!(unsafe { lh_memory_service_connect(s.0, &mut id) }, LH_OK);
    id
}

fn last_error(s: &S) -> String {
    // SAFETY: live handle; the string is copied at once.
    unsafe { CStr::from_ptr(lh_memory_service_last_error(s.0)) }
        .to_string_lossy()
        .into_owned()
}

fn result() -> lh_memory_result {
    lh_memory_result {
        struct_size: size_of::<lh_memory_result>() as u32,
        outcome: 99,
        engine_outcome: 99,
        _reserved: 0,
        fencing_token: 99,
        ttl_ms: 99,
        retry_after_ms: 99,
    }
}

fn acquire(s: &S, conn: u64, now: u64, name: &[u8], token: &[u8]) -> Result<lh_memory_result, u32> {
    let mut r = result();
    // SAFETY: slices valid for the call; valid out-pointer.
    let st = unsafe {
        lh_memory_service_acquire(
            s.0,
            conn,
            now,
            name.as_ptr(),
            name.len(),
            token.as_ptr(),
            token.len(),
            1000,
            &mut r,
        )
    };
    if st == LH_OK { Ok(r) } else { Err(st) }
}

fn status(s: &S, now: u64, name: &[u8]) -> lh_memory_status {
    // SAFETY: plain data; zeroed is valid.
    let mut st: lh_memory_status = unsafe { std::mem::zeroed() };
    st.struct_size = size_of::<lh_memory_status>() as u32;
    // SAFETY: valid pointers.
    let code = unsafe { lh_memory_service_status(s.0, now, name.as_ptr(), name.len(), &mut st) };
    assert_eq!(code, LH_OK);
    st
}

fn faults(flags: u32) -> lh_memory_faults {
    lh_memory_faults {
        struct_size: size_of::<lh_memory_faults>() as u32,
        flags,
        drop_next_responses: 0,
        _reserved: 0,
    }
}

#[test]
fn new_rejects_hostile_configs_and_writes_nothing() {
    let sentinel = std::ptr::dangling_mut::<lh_memory_service>();
    let mut p = sentinel;
    let good = config();
    let mut small = good;
    small.struct_size -= 1;
    let mut zero = good;
    zero.max_names = 0;
    let mut huge = good;
    huge.max_watches = u32::MAX;
    // SAFETY: pointers to locals or NULL.
    unsafe {
        assert_eq!(lh_memory_service_new(null(), &mut p), LH_ERR_NULL_ARGUMENT);
        assert_eq!(
            lh_memory_service_new(&good, null_mut()),
            LH_ERR_NULL_ARGUMENT
        );
        assert_eq!(lh_memory_service_new(&small, &mut p), LH_ERR_STRUCT_SIZE);
        assert_eq!(lh_memory_service_new(&zero, &mut p), LH_ERR_INVALID_CONFIG);
        assert_eq!(lh_memory_service_new(&huge, &mut p), LH_ERR_INVALID_CONFIG);
        lh_memory_config_default(null_mut());
        lh_memory_service_free(null_mut());
        assert_eq!(
            CStr::from_ptr(lh_memory_service_last_error(null())).to_bytes(),
            b""
        );
    }
    assert_eq!(p, sentinel, "out untouched on error");
    let d = config();
    assert_eq!(
        (d.max_names, d.max_connections, d.max_watches, d.max_pending),
        (65_536, 1_024, 4_096, 1_024)
    );
}

#[test]
fn null_handle_everywhere() {
    let mut r = result();
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
    let (nm, t) = (b"n".as_ptr(), TOKEN.as_ptr());
    // SAFETY: a NULL handle is checked first; other pointers are valid.
    unsafe {
        for code in [
            lh_memory_service_connect(h, &mut u),
            lh_memory_service_disconnect(h, 1),
            lh_memory_service_acquire(h, 1, 0, nm, 1, t, 32, 10, &mut r),
            lh_memory_service_renew(h, 1, 0, nm, 1, t, 32, 10, &mut r),
            lh_memory_service_release(h, 1, 0, nm, 1, t, 32, &mut r),
            lh_memory_service_status(h, 0, nm, 1, &mut st),
            lh_memory_service_watch(h, 1, nm, 1),
            lh_memory_service_unwatch(h, 1, nm, 1),
            lh_memory_service_poll_released(h, 1, &mut p, &mut n),
            lh_memory_service_set_faults(h, 1, &f),
            lh_memory_service_get_faults(h, 1, &mut fo),
            lh_memory_service_step_clock(h, 1),
            lh_memory_service_forget(h, nm, 1),
            lh_memory_service_stats_get(h, &mut k),
            lh_memory_service_debug_panic(h),
        ] {
            assert_eq!(code, LH_ERR_NULL_ARGUMENT);
        }
    }
    assert_eq!((r.outcome, u), (99, 0));
}

#[test]
fn null_arguments_are_errors_and_change_nothing() {
    let s = service();
    let c = connect(&s);
    let mut r = result();
    let mut p: *const u8 = null();
    let mut n = 0usize;
    let nm = b"n".as_ptr();
    // SAFETY: the NULLs are checked; other pointers are valid.
    unsafe {
        let t = TOKEN.as_ptr();
        for code in [
            lh_memory_service_connect(s.0, null_mut()),
            lh_memory_service_acquire(s.0, c, 0, null(), 1, t, 32, 10, &mut r),
            lh_memory_service_acquire(s.0, c, 0, nm, 1, null(), 32, 10, &mut r),
            lh_memory_service_acquire(s.0, c, 0, nm, 1, t, 32, 10, null_mut()),
            lh_memory_service_renew(s.0, c, 0, nm, 1, null(), 0, 10, &mut r),
            lh_memory_service_release(s.0, c, 0, null(), 0, t, 32, &mut r),
            lh_memory_service_status(s.0, 0, nm, 1, null_mut()),
            lh_memory_service_watch(s.0, c, null(), 1),
            lh_memory_service_unwatch(s.0, c, null(), 1),
            lh_memory_service_poll_released(s.0, c, null_mut(), &mut n),
            lh_memory_service_poll_released(s.0, c, &mut p, null_mut()),
            lh_memory_service_set_faults(s.0, c, null()),
            lh_memory_service_get_faults(s.0, c, null_mut()),
            lh_memory_service_forget(s.0, null(), 1),
            lh_memory_service_stats_get(s.0, null_mut()),
        ] {
            assert_eq!(code, LH_ERR_NULL_ARGUMENT);
        }
    }
    assert!(last_error(&s).contains("NULL"), "{}", last_error(&s));
    assert_eq!(r.outcome, 99, "out untouched");
    assert_eq!(status(&s, 0, b"n").last_fencing_token, 0, "nothing granted");
    assert!(acquire(&s, c, 0, b"n", TOKEN).is_ok(), "still usable");
}

#[test]
fn hostile_names_and_tokens() {
    let s = service();
    let c = connect(&s);
    let long_name = vec![b'x'; LH_MAX_NAME_LEN + 1];
    let long_token = [b't'; LH_MEMORY_MAX_TOKEN_LEN + 1];
    for (name, token, want) in [
        (&b"\xff\xfe"[..], TOKEN, LH_ERR_INVALID_UTF8),
        (&long_name[..], TOKEN, LH_ERR_NAME_TOO_LONG),
        (&b""[..], TOKEN, LH_ERR_EMPTY_NAME),
        (&b"a\0b"[..], TOKEN, LH_ERR_NAME_HAS_NUL),
        (&b"n"[..], &b""[..], LH_ERR_INVALID_TOKEN),
        (&b"n"[..], &long_token[..], LH_ERR_INVALID_TOKEN),
    ] {
        assert_eq!(acquire(&s, c, 0, name, token), Err(want));
    }
    assert!(last_error(&s).contains("token"));
    let mut r = result();
    let big = usize::MAX;
    // SAFETY: the lengths are refused before any byte is read.
    unsafe {
        let code = lh_memory_service_acquire(
            s.0,
            c,
            0,
            b"n".as_ptr(),
            big,
            TOKEN.as_ptr(),
            32,
            10,
            &mut r,
        );
        assert_eq!(code, LH_ERR_NAME_TOO_LONG);
        let code =
            lh_memory_service_acquire(s.0, c, 0, b"n".as_ptr(), 1, TOKEN.as_ptr(), big, 10, &mut r);
        assert_eq!(code, LH_ERR_INVALID_TOKEN);
        let code = lh_memory_service_watch(s.0, c, b"n".as_ptr(), big);
        assert_eq!(code, LH_ERR_NAME_TOO_LONG);
        let code =
            lh_memory_service_renew(s.0, c, 0, b"n".as_ptr(), 1, TOKEN.as_ptr(), 32, 0, &mut r);
        assert_eq!(code, LH_ERR_INVALID_TTL);
    }
    assert_eq!(r.outcome, 99);
    // SAFETY: plain data; zeroed is valid.
    let mut k: lh_memory_stats = unsafe { std::mem::zeroed() };
    k.struct_size = size_of::<lh_memory_stats>() as u32;
    // SAFETY: valid pointer.
    assert_eq!(unsafe { lh_memory_service_stats_get(s.0, &mut k) }, LH_OK);
    assert_eq!((k.names, k.grants), (0, 0));
}

#[test]
fn unknown_connections_fault_bits_and_struct_sizes() {
    let s = service();
    let c = connect(&s);
    assert_eq!(
        acquire(&s, 0, 0, b"n", TOKEN),
        Err(LH_ERR_UNKNOWN_CONNECTION)
    );
    assert_eq!(
        acquire(&s, c + 1, 0, b"n", TOKEN),
        Err(LH_ERR_UNKNOWN_CONNECTION)
    );
    let mut small = result();
    small.struct_size = 8;
    let bad_bits = faults(64);
    let mut short = faults(0);
    short.struct_size = 4;
    // SAFETY: valid pointers; the sizes are checked before anything is read or written.
    unsafe {
        let code = lh_memory_service_acquire(
            s.0,
            c,
            0,
            b"n".as_ptr(),
            1,
            TOKEN.as_ptr(),
            32,
            10,
            &mut small,
        );
        assert_eq!(code, LH_ERR_STRUCT_SIZE);
        assert_eq!(
            lh_memory_service_set_faults(s.0, c, &bad_bits),
            LH_ERR_INVALID_ENUM
        );
        assert_eq!(
            lh_memory_service_set_faults(s.0, c, &short),
            LH_ERR_STRUCT_SIZE
        );
        assert_eq!(
            lh_memory_service_get_faults(s.0, c, &mut short),
            LH_ERR_STRUCT_SIZE
        );
        assert_eq!(
            lh_memory_service_disconnect(s.0, c + 7),
            LH_ERR_UNKNOWN_CONNECTION
        );
    }
    assert_eq!(small.outcome, 99);
    assert_eq!(
        status(&s, 0, b"n").held,
        0,
        "a refused call granted nothing"
    );
    assert!(
        last_error(&s).contains("unknown connection"),
        "{}",
        last_error(&s)
    );
    let mut f = faults(0);
    // SAFETY: valid pointer.
    assert_eq!(
        unsafe { lh_memory_service_get_faults(s.0, c, &mut f) },
        LH_OK
    );
    assert_eq!(f.flags, 0, "the bad switches were not applied");
}

#[test]
fn results_carry_the_engine_outcome_to_feed() {
    let s = service();
    let (a, b) = (connect(&s), connect(&s));
    let r = acquire(&s, a, 0, b"n", TOKEN).unwrap();
    assert_eq!(
        (r.outcome, r.engine_outcome),
        (LH_MEMORY_GRANTED, LH_ACQUIRE_GRANTED)
    );
    assert_eq!(
        (r.fencing_token, r.ttl_ms, r.retry_after_ms),
        (1, 1000, LH_NO_RETRY_HINT)
    );
    let r = acquire(&s, b, 400 * MS, b"n", b"other").unwrap();
    assert_eq!(
        (r.outcome, r.engine_outcome),
        (LH_MEMORY_HELD_BY_OTHER, LH_ACQUIRE_HELD_BY_OTHER)
    );
    assert_eq!(r.retry_after_ms, 600);
    let mut r = result();
    // SAFETY: valid pointers.
    unsafe {
        let set = |flags| lh_memory_service_set_faults(s.0, a, &faults(flags));
        assert_eq!(set(LH_MEMORY_PARTITIONED), LH_OK);
        let code = lh_memory_service_renew(
            s.0,
            a,
            MS,
            b"n".as_ptr(),
            1,
            TOKEN.as_ptr(),
            32,
            1000,
            &mut r,
        );
        assert_eq!(code, LH_OK);
        assert_eq!(
            (r.outcome, r.engine_outcome),
            (LH_MEMORY_DROPPED, LH_RENEW_TRANSPORT_ERROR)
        );
        assert_eq!(set(LH_MEMORY_DROP_RESPONSES), LH_OK);
        let code =
            lh_memory_service_release(s.0, a, MS, b"n".as_ptr(), 1, TOKEN.as_ptr(), 32, &mut r);
        assert_eq!(code, LH_OK);
        assert_eq!(
            (r.outcome, r.engine_outcome),
            (LH_MEMORY_DROPPED, LH_RELEASE_TRANSPORT_ERROR)
        );
        assert_eq!(set(LH_MEMORY_REJECT_ALL), LH_OK);
        let code = lh_memory_service_renew(
            s.0,
            a,
            MS,
            b"n".as_ptr(),
            1,
            TOKEN.as_ptr(),
            32,
            1000,
            &mut r,
        );
        assert_eq!(code, LH_OK);
        assert_eq!(
            (r.outcome, r.engine_outcome),
            (LH_MEMORY_REJECTED, LH_RENEW_REJECTED)
        );
        let code =
            lh_memory_service_release(s.0, a, MS, b"n".as_ptr(), 1, TOKEN.as_ptr(), 32, &mut r);
        assert_eq!(code, LH_OK);
        assert_eq!(
            (r.outcome, r.engine_outcome),
            (LH_MEMORY_NOT_OWNER, LH_RELEASE_NOT_OWNER)
        );
    }
    assert_eq!(
        status(&s, MS, b"n").held,
        0,
        "the dropped-answer release was applied"
    );
}

#[test]
fn notifications_are_polled_with_a_borrowed_name() {
    let s = service();
    let (a, b) = (connect(&s), connect(&s));
    let name = "wait-here";
    let mut r = result();
    let (mut p, mut n): (*const u8, usize) = (std::ptr::dangling(), 7);
    // SAFETY: valid pointers; the borrowed name is copied before the next call.
    unsafe {
        assert_eq!(
            lh_memory_service_watch(s.0, b, name.as_ptr(), name.len()),
            LH_OK
        );
        assert_eq!(
            lh_memory_service_poll_released(s.0, b, &mut p, &mut n),
            LH_OK
        );
        assert_eq!((p, n), (null(), 0), "none queued: NULL, 0");
        acquire(&s, a, 0, name.as_bytes(), TOKEN).unwrap();
        let code = lh_memory_service_release(
            s.0,
            a,
            0,
            name.as_ptr(),
            name.len(),
            TOKEN.as_ptr(),
            32,
            &mut r,
        );
        assert_eq!((code, r.outcome), (LH_OK, LH_MEMORY_RELEASED));
        assert_eq!(
            lh_memory_service_poll_released(s.0, b, &mut p, &mut n),
            LH_OK
        );
        assert_eq!(std::slice::from_raw_parts(p, n), name.as_bytes());
        assert_eq!(
            lh_memory_service_poll_released(s.0, b, &mut p, &mut n),
            LH_OK
        );
        assert_eq!((p, n), (null(), 0));
        assert_eq!(
            lh_memory_service_unwatch(s.0, b, name.as_ptr(), name.len()),
            LH_OK
        );
        assert_eq!(lh_memory_service_disconnect(s.0, b), LH_OK);
        assert_eq!(
            lh_memory_service_poll_released(s.0, b, &mut p, &mut n),
            LH_ERR_UNKNOWN_CONNECTION
        );
    }
}

#[test]
fn status_copies_the_holder_token() {
    let s = service();
    let a = connect(&s);
    acquire(&s, a, 10 * MS, b"n", TOKEN).unwrap();
    // SAFETY: valid pointer.
    assert_eq!(
        unsafe { lh_memory_service_step_clock(s.0, -(5 * MS as i64)) },
        LH_OK
    );
    let st = status(&s, 20 * MS, b"n");
    assert_eq!(
        (st.held, st.fencing_token, st.last_fencing_token),
        (1, 1, 1)
    );
    assert_eq!(st.service_now_ns, 15 * MS);
    assert_eq!((st.expires_at_ns, st.remaining_ttl_ms), (1010 * MS, 995));
    assert_eq!((st.held_for_ns, st.holder_connection), (5 * MS, a));
    assert_eq!(&st.holder_token[..st.holder_token_len as usize], TOKEN);
    assert_eq!(st.watchers, 0);
    // SAFETY: valid pointer.
    assert_eq!(
        unsafe { lh_memory_service_watch(s.0, a, b"n".as_ptr(), 1) },
        LH_OK
    );
    assert_eq!(status(&s, 20 * MS, b"n").watchers, 1);
    // SAFETY: valid pointer.
    assert_eq!(
        unsafe { lh_memory_service_forget(s.0, b"n".as_ptr(), 1) },
        LH_OK
    );
    let st = status(&s, 20 * MS, b"n");
    assert_eq!(
        (st.held, st.holder_token_len, st.last_fencing_token),
        (0, 0, 1)
    );
}

#[test]
fn a_panic_poisons_only_that_service() {
    let s = service();
    let other = service();
    let c = connect(&s);
    let mut u = 0;
    // SAFETY: live handles; the panic is caught inside the library.
    unsafe {
        assert_eq!(lh_memory_service_debug_panic(s.0), LH_ERR_PANIC);
        assert!(last_error(&s).contains("panic"));
        assert_eq!(lh_memory_service_connect(s.0, &mut u), LH_ERR_POISONED);
        assert_eq!(lh_memory_service_step_clock(s.0, 1), LH_ERR_POISONED);
        assert_eq!(
            lh_memory_service_watch(s.0, c, b"n".as_ptr(), 1),
            LH_ERR_POISONED
        );
    }
    assert_eq!(acquire(&s, c, 0, b"n", TOKEN), Err(LH_ERR_POISONED));
    assert!(last_error(&s).contains("poisoned"));
    assert_eq!(u, 0);
    let oc = connect(&other);
    assert!(acquire(&other, oc, 0, b"n", TOKEN).is_ok());
}

#[test]
fn struct_layouts_match_what_bindings_mirror() {
    use std::mem::offset_of;
    // LP64 layouts that ctypes / cgo / C++ mirror field for field; a change is an ABI break.
    assert_eq!(size_of::<lh_memory_config>(), 20);
    assert_eq!(size_of::<lh_memory_faults>(), 16);
    assert_eq!(size_of::<lh_memory_result>(), 40);
    assert_eq!(offset_of!(lh_memory_result, fencing_token), 16);
    assert_eq!(size_of::<lh_memory_status>(), 136);
    assert_eq!(offset_of!(lh_memory_status, service_now_ns), 56);
    assert_eq!(offset_of!(lh_memory_status, holder_token), 72);
    assert_eq!(size_of::<lh_memory_stats>(), 88);
    assert_eq!(offset_of!(lh_memory_status, watchers), 68);
}
