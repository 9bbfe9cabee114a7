//! Drives the backend exports (`lh_client_new_redis`, `lh_poll_request`, `lh_reply`, …) from
//! Rust with well-formed and hostile input: every malformed reply is `LH_ERR_INVALID_REPLY`
//! and changes nothing; a handle without a backend says so.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;
use std::ptr::{null, null_mut};

use leasehold::ffi::*;

const MS: u64 = 1_000_000;
const SEED: [u8; 32] = [3; 32];

struct H(*mut lh_client);

impl Drop for H {
    fn drop(&mut self) {
        // SAFETY: from lh_client_new*, not used after drop.
        unsafe { lh_client_free(self.0) }
    }
}

fn config() -> lh_config {
    let mut cfg = MaybeUninit::<lh_config>::uninit();
    // SAFETY: valid out-pointer, filled completely.
    unsafe {
        lh_config_default(cfg.as_mut_ptr());
        cfg.assume_init()
    }
}

fn redis_client() -> H {
    let cfg = config();
    let mut c = null_mut();
    // SAFETY: pointers to locals; NULL options mean the defaults.
    let st = unsafe { lh_client_new_redis(&cfg, null(), SEED.as_ptr(), SEED.len(), &mut c) };
    assert_eq!(st, LH_OK);
    H(c)
}

#[derive(Debug)]
struct Req {
    id: u64,
    connection: u32,
    args: Vec<Vec<u8>>,
}

fn poll_request(h: &H) -> Option<Req> {
    let mut r = MaybeUninit::<lh_request>::uninit();
    // SAFETY: valid out-pointer; argv borrows the handle until the next call, read at once.
    unsafe {
        assert_eq!(lh_poll_request(h.0, r.as_mut_ptr()), LH_OK);
        let r = r.assume_init();
        if r.id == 0 {
            return None;
        }
        let argv = std::slice::from_raw_parts(r.argv, r.argc as usize);
        let args = argv
            .iter()
            .map(|b| std::slice::from_raw_parts(b.ptr, b.len).to_vec())
            .collect();
        Some(Req {
            id: r.id,
            connection: r.connection,
            args,
        })
    }
}

fn int(i: i64) -> lh_value {
    lh_value {
        kind: LH_VALUE_INT,
        integer: i,
        ..lh_value::default()
    }
}

fn array(n: u64) -> lh_value {
    lh_value {
        kind: LH_VALUE_ARRAY,
        len: n,
        ..lh_value::default()
    }
}

fn reply(h: &H, now: u64, id: u64, values: &[lh_value], data: &[u8]) -> u32 {
    // SAFETY: slices of live locals.
    unsafe {
        lh_reply(
            h.0,
            now,
            id,
            values.as_ptr(),
            values.len(),
            data.as_ptr(),
            data.len(),
        )
    }
}

fn poll_event(h: &H) -> Option<lh_output> {
    let mut o = MaybeUninit::<lh_output>::uninit();
    // SAFETY: valid out-pointer.
    unsafe {
        assert_eq!(lh_poll_output(h.0, o.as_mut_ptr()), LH_OK);
        let o = o.assume_init();
        (o.kind != LH_OUTPUT_NONE).then_some(o)
    }
}

fn acquire(h: &H, name: &[u8]) -> u64 {
    let mut o = MaybeUninit::<lh_acquire_options>::uninit();
    let mut lease = 0;
    // SAFETY: pointers to locals.
    unsafe {
        lh_acquire_options_default(o.as_mut_ptr());
        let mut o = o.assume_init();
        o.ttl_ms = 3_000;
        assert_eq!(
            lh_acquire(h.0, MS, name.as_ptr(), name.len(), &o, &mut lease),
            LH_OK
        );
    }
    lease
}

#[test]
fn a_redis_handle_subscribes_then_turns_acquire_into_evalsha() {
    let h = redis_client();
    let sub = poll_request(&h).unwrap();
    assert_eq!(sub.connection, LH_CONNECTION_SUBSCRIBER);
    assert_eq!(sub.args[0], b"SUBSCRIBE");
    assert!(sub.args[1].starts_with(b"lh:wake:"));
    assert!(poll_request(&h).is_none());
    // SAFETY: pointers to locals.
    unsafe {
        let ch = &sub.args[1];
        assert_eq!(lh_subscription(h.0, MS, ch.as_ptr(), ch.len(), 1), LH_OK);
        assert_eq!(
            lh_subscription(h.0, MS, ch.as_ptr(), ch.len(), 2),
            LH_ERR_INVALID_ENUM
        );
    }
    let lease = acquire(&h, b"jobs");
    assert!(
        poll_event(&h).is_none(),
        "commands never come out of lh_poll_output"
    );
    let r = poll_request(&h).unwrap();
    assert_eq!(r.connection, LH_CONNECTION_COMMANDS);
    assert_eq!(r.args[0], b"EVALSHA");
    assert_eq!(r.args[3], b"lh:{jobs}");
    let v = [array(3), int(1), int(42), int(3_000)];
    assert_eq!(reply(&h, 2 * MS, r.id, &v, b""), LH_OK);
    let ev = poll_event(&h).unwrap();
    assert_eq!(ev.kind, LH_OUTPUT_ACQUIRED);
    assert_eq!((ev.lease_id, ev.fencing_token), (lease, 42));
    let mut k = lh_redis_counters {
        struct_size: size_of::<lh_redis_counters>() as u32,
        ..Default::default()
    };
    // SAFETY: pointer to a local.
    assert_eq!(unsafe { lh_redis_counters_get(h.0, &mut k) }, LH_OK);
    assert_eq!((k.subscribed, k.script_calls, k.subscriptions), (1, 1, 1));
}

#[test]
fn malformed_replies_are_refused_and_change_nothing() {
    let h = redis_client();
    poll_request(&h);
    acquire(&h, b"jobs");
    let r = poll_request(&h).unwrap();
    let bulk = |offset, len| lh_value {
        kind: LH_VALUE_BULK,
        offset,
        len,
        ..lh_value::default()
    };
    let unknown = lh_value {
        kind: 0,
        ..lh_value::default()
    };
    let deep: Vec<lh_value> = (0..100).map(|_| array(1)).chain([int(1)]).collect();
    let cases: Vec<(Vec<lh_value>, &[u8])> = vec![
        (vec![], b""),
        (vec![array(3), int(1), int(2)], b""),
        (vec![array(u64::MAX)], b""),
        (vec![int(1), int(1)], b""),
        (vec![bulk(2, 5)], b"abc"),
        (vec![bulk(u64::MAX, 1)], b"abc"),
        (vec![unknown], b""),
        (deep, b""),
        (vec![int(0); LH_MAX_REPLY_VALUES + 1], b""),
    ];
    for (values, data) in &cases {
        assert_eq!(
            reply(&h, 2 * MS, r.id, values, data),
            LH_ERR_INVALID_REPLY,
            "{values:?}"
        );
    }
    // SAFETY: NULL values and a NULL data pointer with a length.
    unsafe {
        assert_eq!(
            lh_reply(h.0, 2 * MS, r.id, null(), 0, null(), 0),
            LH_ERR_NULL_ARGUMENT
        );
        let v = [int(1)];
        assert_eq!(
            lh_reply(h.0, 2 * MS, r.id, v.as_ptr(), 1, null(), 5),
            LH_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            lh_pubsub_message(h.0, MS, null(), 3, null(), 0),
            LH_ERR_NULL_ARGUMENT
        );
    }
    // The request is still pending: a good reply is taken.
    let v = [array(3), int(1), int(7), int(3_000)];
    assert_eq!(reply(&h, 2 * MS, r.id, &v, b""), LH_OK);
    assert_eq!(poll_event(&h).unwrap().fencing_token, 7);
}

#[test]
fn a_plain_handle_has_no_backend() {
    let cfg = config();
    let mut c = null_mut();
    // SAFETY: pointers to locals.
    unsafe {
        assert_eq!(lh_client_new(&cfg, SEED.as_ptr(), 32, &mut c), LH_OK);
        let h = H(c);
        let mut r = MaybeUninit::<lh_request>::uninit();
        assert_eq!(lh_poll_request(h.0, r.as_mut_ptr()), LH_ERR_NO_BACKEND);
        assert_eq!(lh_request_failed(h.0, 0, 1), LH_ERR_NO_BACKEND);
        assert_eq!(
            lh_poll_request(null_mut(), r.as_mut_ptr()),
            LH_ERR_NULL_ARGUMENT
        );
        assert_eq!(lh_poll_request(h.0, null_mut()), LH_ERR_NULL_ARGUMENT);
    }
}

#[test]
fn bad_redis_options_are_invalid_config() {
    let cfg = config();
    let mut o = MaybeUninit::<lh_redis_options>::uninit();
    let mut c = null_mut();
    // SAFETY: pointers to locals.
    unsafe {
        lh_redis_options_default(o.as_mut_ptr());
        let mut o = o.assume_init();
        assert_eq!((o.standby_delay_ms, o.idle_recheck_ms), (150, 10_000));
        o.standby_delay_ms = 0;
        assert_eq!(
            lh_client_new_redis(&cfg, &o, SEED.as_ptr(), 32, &mut c),
            LH_ERR_INVALID_CONFIG
        );
        assert!(c.is_null());
        o.struct_size = 4;
        assert_eq!(
            lh_client_new_redis(&cfg, &o, SEED.as_ptr(), 32, &mut c),
            LH_ERR_STRUCT_SIZE
        );
    }
}

#[test]
fn reseeding_a_redis_handle_moves_it_to_a_new_wake_channel() {
    let h = redis_client();
    let first = poll_request(&h).unwrap().args[1].clone();
    let seed = [8u8; 32];
    // SAFETY: pointer to a local.
    assert_eq!(unsafe { lh_client_reseed(h.0, seed.as_ptr(), 32) }, LH_OK);
    let unsub = poll_request(&h).unwrap();
    let sub = poll_request(&h).unwrap();
    assert_eq!(unsub.args, vec![b"UNSUBSCRIBE".to_vec(), first.clone()]);
    assert_eq!(sub.args[0], b"SUBSCRIBE");
    assert_ne!(sub.args[1], first);
}

fn poll_status(h: &H) -> lh_lock_status {
    let mut st = MaybeUninit::<lh_lock_status>::zeroed();
    // SAFETY: valid out-pointer with its size set; the strings are read at once.
    unsafe {
        (*st.as_mut_ptr()).struct_size = size_of::<lh_lock_status>() as u32;
        assert_eq!(lh_poll_status(h.0, st.as_mut_ptr()), LH_OK);
        st.assume_init()
    }
}

#[test]
fn status_on_a_redis_handle_is_one_eval_and_its_reply_reads_back() {
    let h = redis_client();
    while poll_request(&h).is_some() {}
    let name = b"reports";
    let mut id = 0;
    // SAFETY: pointers to locals.
    unsafe {
        assert_eq!(
            lh_status_request(h.0, MS, name.as_ptr(), name.len(), &mut id),
            LH_OK
        );
        assert_eq!(
            lh_status_request(h.0, MS, null(), 3, &mut id),
            LH_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            lh_status_request(h.0, MS, name.as_ptr(), name.len(), null_mut()),
            LH_ERR_NULL_ARGUMENT
        );
        let long = vec![b'n'; 100_000];
        assert_ne!(
            lh_status_request(h.0, MS, long.as_ptr(), long.len(), &mut id),
            LH_OK,
            "an oversized name"
        );
        assert_eq!(
            lh_status_request(h.0, MS, b"\xff".as_ptr(), 1, &mut id),
            LH_ERR_INVALID_UTF8
        );
    }
    let r = poll_request(&h).unwrap();
    assert_eq!(r.id, id);
    assert_eq!(r.args[0], b"EVAL");
    assert_eq!(
        &r.args[2..],
        [&b"2"[..], b"lh:{reports}", b"lh:{reports}:fence"]
    );
    assert_eq!(poll_status(&h).id, 0, "no answer yet");
    // [ "42", 1500, "42" ]: held with fence 42, 1.5 s left.
    let data = b"4242";
    let values = [
        array(3),
        lh_value {
            kind: LH_VALUE_BULK,
            offset: 0,
            len: 2,
            ..lh_value::default()
        },
        int(1_500),
        lh_value {
            kind: LH_VALUE_BULK,
            offset: 2,
            len: 2,
            ..lh_value::default()
        },
    ];
    assert_eq!(reply(&h, 2 * MS, id, &values, data), LH_OK);
    let st = poll_status(&h);
    assert_eq!((st.id, st.ok, st.held), (id, 1, 1));
    assert_eq!(
        (st.fencing_token, st.remaining_ttl_ms, st.last_fencing_token),
        (42, 1_500, 42)
    );
    // A garbage reply is an answer that says why.
    let mut id2 = 0;
    // SAFETY: pointers to locals.
    unsafe {
        assert_eq!(
            lh_status_request(h.0, MS, name.as_ptr(), name.len(), &mut id2),
            LH_OK
        );
    }
    let r = poll_request(&h).unwrap();
    assert_eq!(reply(&h, 3 * MS, r.id, &[int(7)], b""), LH_OK);
    let st = poll_status(&h);
    assert_eq!((st.id, st.ok), (id2, 0));
    // SAFETY: the error borrows the handle until the next call; read at once.
    let why = unsafe { std::slice::from_raw_parts(st.error, st.error_len) };
    assert!(!why.is_empty());
}

#[test]
fn status_on_a_plain_handle_has_no_backend() {
    let cfg = config();
    let mut c = null_mut();
    let mut id = 0;
    // SAFETY: pointers to locals.
    unsafe {
        assert_eq!(lh_client_new(&cfg, SEED.as_ptr(), 32, &mut c), LH_OK);
        let h = H(c);
        assert_eq!(
            lh_status_request(h.0, MS, b"x".as_ptr(), 1, &mut id),
            LH_ERR_NO_BACKEND
        );
        let mut st = MaybeUninit::<lh_lock_status>::zeroed();
        (*st.as_mut_ptr()).struct_size = size_of::<lh_lock_status>() as u32;
        assert_eq!(lh_poll_status(h.0, st.as_mut_ptr()), LH_ERR_NO_BACKEND);
        assert_eq!(lh_poll_status(h.0, null_mut()), LH_ERR_NULL_ARGUMENT);
    }
}

#[test]
fn sharded_wake_through_the_abi_and_an_older_options_struct_keeps_it_off() {
    let cfg = config();
    let mut o = MaybeUninit::<lh_redis_options>::uninit();
    // SAFETY: pointers to locals; each handle is freed by H.
    unsafe {
        lh_redis_options_default(o.as_mut_ptr());
        let mut o = o.assume_init();
        assert_eq!(o.struct_size as usize, size_of::<lh_redis_options>());
        assert_eq!(o.sharded_wake, 0);
        o.sharded_wake = 1;
        let mut c = null_mut();
        assert_eq!(
            lh_client_new_redis(&cfg, &o, SEED.as_ptr(), 32, &mut c),
            LH_OK
        );
        // Sharded: no client channel is subscribed; names are, while waited on.
        assert!(poll_request(&H(c)).is_none());
        // A host built before sharded_wake existed passes the shorter struct: it gets the
        // classic wake channel whatever lies beyond its struct_size.
        o.struct_size = 40;
        let mut c = null_mut();
        assert_eq!(
            lh_client_new_redis(&cfg, &o, SEED.as_ptr(), 32, &mut c),
            LH_OK
        );
        let h = H(c);
        assert_eq!(poll_request(&h).unwrap().args[0], b"SUBSCRIBE");
        o.struct_size = 39;
        let mut c = null_mut();
        assert_eq!(
            lh_client_new_redis(&cfg, &o, SEED.as_ptr(), 32, &mut c),
            LH_ERR_STRUCT_SIZE
        );
    }
}
