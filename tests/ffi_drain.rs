//! `lh_drain`, the host's drain in one call, through the C ABI: on every backend it takes the
//! same requests, events and deadline as the single polls, in the same order; a full events
//! array says so and the rest follows; bad arguments are refused before anything is taken.
//! `lh_io_received_drain` feeds bytes and drains as the two calls do, and refuses what they
//! refuse without taking anything.
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

/// A client of the stream kind whose server is never reached (the test answers for it).
fn stream_client(seed: u8) -> H {
    let url = b"redis://127.0.0.1:1/0";
    let mut o = backend(LH_BACKEND_REDIS_STREAM);
    o.redis_url = url.as_ptr();
    o.redis_url_len = url.len();
    try_client(&config(), &o, &[seed; 32]).expect("lh_client_new")
}

/// The stream kind as well: its connections' requests and the lock requests they carry.
#[test]
fn the_stream_kind_ends_a_drain_with_the_call_that_took_its_last_request() {
    let (a, b) = (stream_client(9), stream_client(9));
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

/// `lh_io_received_drain` into fresh out-values with room for `cap` events.
fn received_drain(
    h: &H,
    now: u64,
    stream: u64,
    bytes: &[u8],
    cap: usize,
) -> (lh_status, Option<Req>, Vec<lh_event>, lh_drained) {
    let mut r = MaybeUninit::<lh_io_request>::zeroed();
    let mut evs = vec![lh_event::default(); cap];
    let mut d = drained();
    // SAFETY: valid out-pointers of the sizes given; `bytes` is readable.
    let st = unsafe {
        lh_io_received_drain(
            h.0,
            now,
            stream,
            bytes.as_ptr(),
            bytes.len(),
            r.as_mut_ptr(),
            evs.as_mut_ptr(),
            cap,
            &mut d,
        )
    };
    if st != LH_OK {
        return (st, None, Vec::new(), d);
    }
    // SAFETY: LH_OK wrote the request; its pointers are read before the next call.
    let req = unsafe { Req::copy(&r.assume_init()) };
    evs.truncate(d.nevents as usize);
    (st, req, evs, d)
}

/// Feeds `bytes` to `a` with `lh_io_received` and the whole drain, and to `b` with
/// `lh_io_received_drain` and the rest of its drain: they must take the same.
fn feed_both(a: &H, b: &H, now: u64, stream: u64, bytes: &[u8], what: &str) -> Vec<Req> {
    // SAFETY: `bytes` is readable for its length.
    ok(unsafe { lh_io_received(a.0, now, stream, bytes.as_ptr(), bytes.len()) });
    let want = drain_all(a, 4);
    let (st, r, e, d) = received_drain(b, now, stream, bytes, 4);
    ok(st);
    let (mut reqs, mut evs, mut dl) = (Vec::from_iter(r), e, d.deadline_ns);
    if d.more_requests == 1 || d.more_events == 1 {
        let (r, e, rest_dl) = drain_all(b, 4);
        reqs.extend(r);
        evs.extend(e);
        dl = rest_dl;
    }
    assert_eq!(want, (reqs.clone(), evs, dl), "{what}");
    reqs
}

/// The RESP3 confirmation of the SUBSCRIBE among `reqs`.
fn subscribed(reqs: &[Req]) -> Vec<u8> {
    let sub = reqs
        .iter()
        .find(|r| r.data.windows(9).any(|w| w == b"SUBSCRIBE"))
        .expect("a SUBSCRIBE");
    let parts: Vec<&[u8]> = sub.data.split(|&c| c == b'\n').collect();
    let channel = parts[4].strip_suffix(b"\r").expect("a channel");
    let mut confirm = format!(">3\r\n$9\r\nsubscribe\r\n${}\r\n", channel.len()).into_bytes();
    confirm.extend_from_slice(channel);
    confirm.extend_from_slice(b"\r\n:1\r\n");
    confirm
}

#[test]
fn received_and_drained_in_one_call_is_the_two_calls() {
    let (a, b) = (stream_client(9), stream_client(9));
    for h in [&a, &b] {
        ok(h.timeout(MS));
        h.acquire(2 * MS, b"one", &opts(3_000)).unwrap();
    }
    let (opens, _, _) = drain_all(&a, 4);
    assert_eq!(drain_all(&b, 4).0, opens);
    // Every stream opens and answers its handshake; the subscriber's SUBSCRIBE is confirmed.
    let hello = b"%1\r\n$6\r\nserver\r\n$5\r\nredis\r\n";
    let (mut cmd, mut sent) = (0, Vec::new());
    for open in opens.iter().filter(|r| r.kind == LH_IO_OPEN) {
        for h in [&a, &b] {
            // SAFETY: a live handle.
            ok(unsafe { lh_io_opened(h.0, 3 * MS, open.id) });
            let sent = h.requests();
            assert!(
                sent.iter()
                    .any(|r| r.data.starts_with(b"*2\r\n$5\r\nHELLO")),
                "{sent:?}"
            );
        }
        let reqs = feed_both(&a, &b, 4 * MS, open.id, hello, "handshake");
        if reqs
            .iter()
            .any(|r| r.data.windows(9).any(|w| w == b"SUBSCRIBE"))
        {
            feed_both(&a, &b, 4 * MS, open.id, &subscribed(&reqs), "subscribed");
        } else {
            (cmd, sent) = (open.id, reqs);
        }
    }
    assert_ne!(cmd, 0, "a commands stream among {opens:?}");
    // The commands handshake's reply sent the acquire that waited for it.
    assert!(
        sent.iter()
            .any(|r| r.data.windows(7).any(|w| w == b"EVALSHA")),
        "{sent:?}"
    );
    // A reply split anywhere: the first piece causes nothing, the second the retry.
    let noscript = b"-NOSCRIPT No matching script. Please use EVAL.\r\n";
    assert!(feed_both(&a, &b, 5 * MS, cmd, &noscript[..9], "half a reply").is_empty());
    let reqs = feed_both(&a, &b, 5 * MS, cmd, &noscript[9..], "the rest");
    assert!(
        reqs.iter().any(|r| r.data.windows(4).any(|w| w == b"EVAL")),
        "{reqs:?}"
    );
    // The grant comes out of the same call as its event.
    let (st, r, evs, d) = received_drain(&b, 6 * MS, cmd, b"*3\r\n:1\r\n:42\r\n:3000\r\n", 4);
    ok(st);
    assert!(r.is_none() && d.more_requests == 0, "{r:?} {d:?}");
    assert_eq!(
        evs.iter().map(|e| e.kind).collect::<Vec<_>>(),
        [LH_EVENT_ACQUIRED],
        "{evs:?}"
    );
    assert_ne!(d.deadline_ns, LH_NO_DEADLINE, "the renewal is due");
}

#[test]
fn refused_bytes_and_bad_drain_arguments_take_nothing() {
    let h = stream_client(3);
    ok(h.timeout(MS));
    h.acquire(2 * MS, b"one", &opts(3_000)).unwrap();
    let cmd = h
        .requests()
        .iter()
        .find(|r| r.kind == LH_IO_OPEN)
        .expect("an open")
        .id;
    // Bytes before the stream opened, and on a stream never handed out: refused, nothing drained.
    let (st, _, _, d) = received_drain(&h, 2 * MS, cmd, b"+OK\r\n", 4);
    expect(st, LH_ERR_WRONG_ANSWER);
    assert_eq!(
        (d.request, d.nevents, d.deadline_ns),
        (0, 0, 0),
        "out written: {d:?}"
    );
    let (st, _, _, _) = received_drain(&h, 2 * MS, 999, b"+OK\r\n", 4);
    expect(st, LH_ERR_UNKNOWN_CONNECTION);
    // SAFETY: a live handle.
    ok(unsafe { lh_io_opened(h.0, 3 * MS, cmd) });
    assert!(!h.requests().is_empty(), "the handshake");
    let hello = b"%1\r\n$6\r\nserver\r\n$5\r\nredis\r\n";
    let big = vec![b'+'; LH_MAX_REPLY_DATA + 1];
    let mut r = MaybeUninit::<lh_io_request>::uninit();
    let mut ev = [lh_event::default(); 2];
    let mut d = drained();
    let (req, evs, out) = (r.as_mut_ptr(), ev.as_mut_ptr(), &raw mut d);
    // Each case has one bad argument, the others valid: (handle, bytes, length, events, out,
    // status).
    type Case = (
        *mut lh_client,
        *const u8,
        usize,
        *mut lh_event,
        *mut lh_drained,
        lh_status,
    );
    let cases: [Case; 5] = [
        (
            h.0,
            hello.as_ptr(),
            hello.len(),
            evs,
            null_mut(),
            LH_ERR_NULL_ARGUMENT,
        ),
        (
            h.0,
            hello.as_ptr(),
            hello.len(),
            null_mut(),
            out,
            LH_ERR_NULL_ARGUMENT,
        ),
        (h.0, std::ptr::null(), 3, evs, out, LH_ERR_NULL_ARGUMENT),
        (h.0, big.as_ptr(), big.len(), evs, out, LH_ERR_INVALID_REPLY),
        (
            null_mut(),
            hello.as_ptr(),
            hello.len(),
            evs,
            out,
            LH_ERR_NULL_ARGUMENT,
        ),
    ];
    for (i, (c, bytes, len, events, out, want)) in cases.into_iter().enumerate() {
        d.nevents = 0xdead;
        // SAFETY: every pointer is NULL or valid for its length; `req` and `events` have room.
        let st = unsafe { lh_io_received_drain(c, 4 * MS, cmd, bytes, len, req, events, 2, out) };
        expect(st, want);
        assert_eq!(d.nevents, 0xdead, "case {i}: out written");
    }
    // None of them took the reply: the handshake still waits, and what follows it.
    assert!(h.requests().is_empty(), "nothing went out");
    let (st, r, _, _) = received_drain(&h, 5 * MS, cmd, hello, 4);
    ok(st);
    let r = r.expect("the subscription, sent once the handshake is answered");
    assert!(r.data.windows(9).any(|w| w == b"SUBSCRIBE"), "{r:?}");
}
