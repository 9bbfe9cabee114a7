//! `lh_drain`, the host's drain in one call, through the C ABI: on every backend it takes the
//! same requests, events and deadline as the single polls, in the same order; a full events
//! array says so and the rest follows; bad arguments are refused before anything is taken.
#![allow(unsafe_code)]

#[path = "support/abi.rs"]
mod abi;

use std::mem::MaybeUninit;
use std::ptr::{NonNull, null_mut};

use abi::*;
use leasehold::ffi::*;

fn drained() -> lh_drained {
    lh_drained {
        struct_size: size_of::<lh_drained>() as u32,
        ..lh_drained::default()
    }
}

/// One `lh_drain` call with room for `cap` events.
fn drain_once(h: &H, cap: usize) -> (Option<Req>, Vec<lh_event>, lh_drained) {
    let mut r = MaybeUninit::<lh_io_request>::uninit();
    let mut evs = vec![lh_event::default(); cap];
    let mut d = drained();
    let evp = if cap == 0 {
        null_mut()
    } else {
        evs.as_mut_ptr()
    };
    // SAFETY: valid out-pointers of the sizes given.
    ok(unsafe { lh_drain(h.0, r.as_mut_ptr(), evp, cap, &mut d) });
    // SAFETY: LH_OK wrote the request; its pointers are read before the next call.
    let req = unsafe { Req::copy(&r.assume_init()) };
    assert_eq!(d.request == 1, req.is_some(), "{d:?}");
    if d.more_requests == 1 || d.more_events == 1 {
        assert_eq!(
            d.deadline_ns, LH_NO_DEADLINE,
            "only a drain's last call has a deadline"
        );
    }
    evs.truncate(d.nevents as usize);
    (req, evs, d)
}

/// The whole drain with `lh_drain`: requests, events, and the last call's deadline.
fn drain_all(h: &H, cap: usize) -> (Vec<Req>, Vec<lh_event>, u64) {
    let (reqs, evs, dl, _) = drain_counted(h, cap);
    (reqs, evs, dl)
}

/// [`drain_all`], and how many calls it took.
fn drain_counted(h: &H, cap: usize) -> (Vec<Req>, Vec<lh_event>, u64, usize) {
    let (mut reqs, mut evs) = (Vec::new(), Vec::new());
    for calls in 1..10_000 {
        let (r, e, d) = drain_once(h, cap);
        assert!(
            d.more_requests == 0 || r.is_some(),
            "more only after a request: {d:?}"
        );
        reqs.extend(r);
        evs.extend(e);
        if d.more_requests == 0 && d.more_events == 0 {
            return (reqs, evs, d.deadline_ns, calls);
        }
    }
    panic!("lh_drain does not end");
}

/// The same drain with the single polls.
fn poll_all(h: &H) -> (Vec<Req>, Vec<lh_event>, u64) {
    let reqs = h.requests();
    let evs = h.events();
    (reqs, evs, h.deadline())
}

/// Polls `a` and drains `b` (the same client twice): they must take the same, and a drain
/// with no events must take one call per request. Returns how many requests it took.
fn one_call_per_request(a: &H, b: &H, what: &str) -> usize {
    let polled = poll_all(a);
    let (reqs, evs, dl, calls) = drain_counted(b, 4);
    assert_eq!(polled, (reqs.clone(), evs.clone(), dl), "{what}");
    if evs.is_empty() {
        assert_eq!(calls, reqs.len().max(1), "{what}: one call per request");
    }
    reqs.len()
}

#[test]
fn one_call_takes_what_the_single_polls_take() {
    for kind in BACKENDS {
        for cap in [1, 4] {
            // Two clients with the same seed fed the same inputs: one drained each way.
            let (a, b) = (client_of(kind, 7), client_of(kind, 7));
            let both = |f: &dyn Fn(&H)| {
                f(&a);
                f(&b);
            };
            assert_eq!(poll_all(&a), drain_all(&b, cap), "backend {kind}: set-up");
            let mut leases = Vec::new();
            both(&|h| {
                h.acquire(MS, b"one", &opts(3_000)).unwrap();
                h.acquire(MS, b"two", &opts(3_000)).unwrap();
            });
            let (reqs, evs, dl) = poll_all(&a);
            assert_eq!(
                (reqs.clone(), evs, dl),
                drain_all(&b, cap),
                "backend {kind}: acquires"
            );
            assert!(!reqs.is_empty() && dl != LH_NO_DEADLINE, "backend {kind}");
            // Fail every request: one ACQUIRE_FAILED per lease, both pending at once.
            for r in &reqs {
                ok(a.failed(2 * MS, r.id, LH_FAILURE_TRANSPORT, b"refused"));
                ok(b.failed(2 * MS, r.id, LH_FAILURE_TRANSPORT, b"refused"));
            }
            let (reqs, evs, dl) = poll_all(&a);
            assert_eq!(
                (reqs, evs.clone(), dl),
                drain_all(&b, cap),
                "backend {kind}: failures"
            );
            for e in &evs {
                leases.push(e.lease_id);
            }
            assert!(
                evs.iter()
                    .filter(|e| e.kind == LH_EVENT_ACQUIRE_FAILED)
                    .count()
                    == 2,
                "backend {kind}: {evs:?}"
            );
            // Time passes on both the same way.
            ok(a.timeout(60_000 * MS));
            ok(b.timeout(60_000 * MS));
            assert_eq!(poll_all(&a), drain_all(&b, cap), "backend {kind}: timeout");
        }
    }
}

/// Every kind knows whether another request is pending: a drain with nothing left for the
/// engine to say ends with the call that took its last request.
#[test]
fn a_drain_ends_with_the_call_that_took_its_last_request() {
    let mut mosts = Vec::new();
    for kind in BACKENDS {
        let (a, b) = (client_of(kind, 5), client_of(kind, 5));
        let mut most = 0;
        let mut compare =
            |what: &str| most = most.max(one_call_per_request(&a, &b, &format!("{kind} {what}")));
        compare("set-up");
        for h in [&a, &b] {
            h.acquire(MS, b"one", &opts(3_000)).unwrap();
            h.acquire(MS, b"two", &opts(3_000)).unwrap();
        }
        compare("acquires");
        for h in [&a, &b] {
            ok(h.timeout(60_000 * MS));
        }
        compare("time passes");
        // SQL runs one request per connection at a time; the others send both at once.
        assert!(most >= 1, "{kind}: no request drained");
        mosts.push(most);
    }
    assert!(
        mosts.iter().any(|&m| m >= 2),
        "no drain took two requests at once: {mosts:?}"
    );
}

/// The stream kind as well: its connections' requests and the lock requests they carry.
#[test]
fn the_stream_kind_ends_a_drain_with_the_call_that_took_its_last_request() {
    let url = b"redis://127.0.0.1:1/0";
    let stream_client = || {
        let mut o = backend(LH_BACKEND_REDIS_STREAM);
        o.redis_url = url.as_ptr();
        o.redis_url_len = url.len();
        try_client(&config(), &o, &[9; 32]).expect("lh_client_new")
    };
    let (a, b) = (stream_client(), stream_client());
    let mut most = 0;
    let mut compare = |what: &str| most = most.max(one_call_per_request(&a, &b, what));
    compare("set-up");
    for h in [&a, &b] {
        ok(h.timeout(MS));
        h.acquire(2 * MS, b"one", &opts(3_000)).unwrap();
        h.acquire(2 * MS, b"two", &opts(3_000)).unwrap();
    }
    compare("acquires");
    for h in [&a, &b] {
        ok(h.timeout(10_000 * MS));
    }
    compare("their connections time out");
    assert!(most >= 2, "some drain took two requests at once ({most})");
}

#[test]
fn a_host_with_the_first_struct_gets_it_and_calls_again_while_it_takes_requests() {
    let h = client_of(LH_BACKEND_MEMORY, 4);
    drain_all(&h, 2);
    h.acquire(MS, b"one", &opts(3_000)).unwrap();
    let mut r = MaybeUninit::<lh_io_request>::uninit();
    let mut ev = [lh_event::default(); 2];
    let mut d = drained();
    d.struct_size = LH_DRAINED_V1_SIZE as u32;
    d.more_requests = 0xdead;
    // SAFETY: valid out-pointers; the struct is read and written up to its struct_size.
    ok(unsafe { lh_drain(h.0, r.as_mut_ptr(), ev.as_mut_ptr(), 2, &mut d) });
    assert_eq!((d.struct_size as usize, d.request), (LH_DRAINED_V1_SIZE, 1));
    assert_eq!(d.more_requests, 0xdead, "written past the caller's struct");
    // SAFETY: as above.
    ok(unsafe { lh_drain(h.0, r.as_mut_ptr(), ev.as_mut_ptr(), 2, &mut d) });
    assert_eq!(d.request, 0, "the second call finds the drain done");
    assert_eq!(d.deadline_ns, h.deadline());
}

#[test]
fn a_full_events_array_says_so_and_the_rest_follows() {
    let h = client_of(LH_BACKEND_MEMORY, 3);
    drain_all(&h, 4);
    let l1 = h.acquire(MS, b"one", &opts(3_000)).unwrap();
    let l2 = h.acquire(MS, b"two", &opts(3_000)).unwrap();
    let (reqs, evs, _) = drain_all(&h, 4);
    assert!(evs.is_empty() && reqs.len() == 2, "{reqs:?} {evs:?}");
    for r in &reqs {
        ok(h.failed(2 * MS, r.id, LH_FAILURE_TRANSPORT, b"refused"));
    }
    // (A failed attempt owes a cleanup: its requests come out of the same calls.)
    let mut got = Vec::new();
    loop {
        let (r, e, d) = drain_once(&h, 1);
        assert_eq!(d.more_events, d.nevents, "full after one event: {d:?}");
        got.extend(e);
        if r.is_none() && d.more_events == 0 {
            break;
        }
        assert!(got.len() <= 2, "{got:?}");
    }
    let ids: Vec<u64> = got.iter().map(|e| e.lease_id).collect();
    assert_eq!(ids, [l1, l2]);
    h.requests();
    // With no request pointer and no room for events, only the deadline is taken.
    let l3 = h.acquire(3 * MS, b"three", &opts(3_000)).unwrap();
    let mut d = drained();
    // SAFETY: NULL request and events are allowed (cap 0); `d` is valid.
    ok(unsafe { lh_drain(h.0, null_mut(), null_mut(), 0, &mut d) });
    assert_eq!((d.request, d.nevents, d.more_events), (0, 0, 0));
    assert_eq!(d.deadline_ns, h.deadline());
    let left = h.requests();
    assert_eq!(left.len(), 1, "the request is still there: {left:?}");
    assert!(l3 > 0);
}

#[test]
fn bad_arguments_are_refused_and_take_nothing() {
    let mut d = drained();
    let mut ev = [lh_event::default(); 2];
    // SAFETY: a NULL handle is refused before anything is read.
    let st = unsafe { lh_drain(null_mut(), null_mut(), ev.as_mut_ptr(), 2, &mut d) };
    expect(st, LH_ERR_NULL_ARGUMENT);

    let h = client_of(LH_BACKEND_MEMORY, 5);
    drain_all(&h, 2);
    h.acquire(MS, b"one", &opts(3_000)).unwrap();
    let mut r = MaybeUninit::<lh_io_request>::uninit();
    // SAFETY: each call below passes one bad argument and valid others.
    unsafe {
        expect(
            lh_drain(h.0, r.as_mut_ptr(), ev.as_mut_ptr(), 2, null_mut()),
            LH_ERR_NULL_ARGUMENT,
        );
        assert!(h.last_error().contains("out"), "{}", h.last_error());
        expect(
            lh_drain(h.0, r.as_mut_ptr(), null_mut(), 1, &mut d),
            LH_ERR_NULL_ARGUMENT,
        );
        assert!(h.last_error().contains("events"), "{}", h.last_error());
        let mut small = drained();
        small.struct_size = 8;
        expect(
            lh_drain(h.0, r.as_mut_ptr(), ev.as_mut_ptr(), 2, &mut small),
            LH_ERR_STRUCT_SIZE,
        );
    }
    // Nothing was taken: the acquire's request is still pending.
    let left = h.requests();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(NonNull::new(h.0).is_some());
}
