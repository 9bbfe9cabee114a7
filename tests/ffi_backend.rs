//! Drives a Redis-backend handle through the seam (`lh_client_new` with `LH_BACKEND_REDIS`,
//! `lh_io_poll`, `lh_io_reply`, `lh_io_failed`, `lh_io_message`, `lh_io_connection`,
//! `lh_counters_get`, `lh_backend_last_error`) from Rust with well-formed and hostile input:
//! every malformed reply is `LH_ERR_INVALID_REPLY` and changes nothing. The last test runs two
//! handles against a real redis-server, executed the way a C host does.
#![allow(unsafe_code)]

#[path = "support/abi.rs"]
mod abi;
#[path = "support/resp.rs"]
mod resp;

use std::ptr::{null, null_mut};
use std::time::Duration;

use abi::*;
use leasehold::ffi::*;

const SEED: u8 = 3;

fn redis_client() -> H {
    client_of(LH_BACKEND_REDIS, SEED)
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

fn acquire(h: &H, name: &[u8]) -> u64 {
    h.acquire(MS, name, &opts(3_000)).expect("acquire")
}

/// The SUBSCRIBE of the wake channel, confirmed; returns the channel.
fn subscribed(h: &H) -> Vec<u8> {
    let sub = h.poll().expect("SUBSCRIBE");
    assert_eq!(
        (sub.kind, sub.connection),
        (LH_IO_COMMAND, LH_CONNECTION_NOTIFY)
    );
    assert_eq!(sub.args[0], b"SUBSCRIBE");
    ok(h.connection(
        MS,
        LH_CONNECTION_NOTIFY,
        LH_CONNECTION_SUBSCRIBED,
        &sub.args[1],
    ));
    sub.args[1].clone()
}

#[test]
fn a_redis_handle_subscribes_then_turns_acquire_into_evalsha() {
    let h = redis_client();
    let sub = h.poll().unwrap();
    assert_eq!(
        (sub.kind, sub.connection),
        (LH_IO_COMMAND, LH_CONNECTION_NOTIFY)
    );
    assert_eq!(sub.args[0], b"SUBSCRIBE");
    assert!(sub.args[1].starts_with(b"lh:wake:"));
    assert!(h.poll().is_none());
    let ch = &sub.args[1];
    assert_eq!(h.counters().redis_subscribed, 0);
    ok(h.connection(MS, LH_CONNECTION_NOTIFY, LH_CONNECTION_SUBSCRIBED, ch));
    expect(
        h.connection(MS, LH_CONNECTION_NOTIFY, 4, ch),
        LH_ERR_INVALID_ENUM,
    );
    expect(
        h.connection(MS, 0, LH_CONNECTION_SUBSCRIBED, ch),
        LH_ERR_INVALID_ENUM,
    );
    let lease = acquire(&h, b"jobs");
    assert!(
        h.event().is_none(),
        "requests never come out of lh_poll_event"
    );
    let r = h.poll().unwrap();
    assert_eq!(
        (r.kind, r.connection),
        (LH_IO_COMMAND, LH_CONNECTION_COMMANDS)
    );
    assert_eq!(r.args[0], b"EVALSHA");
    assert_eq!(r.args[3], b"lh:{jobs}");
    ok(h.reply_raw(2 * MS, r.id, &[array(3), int(1), int(42), int(3_000)], b""));
    let ev = h.event().unwrap();
    assert_eq!(ev.kind, LH_EVENT_ACQUIRED);
    assert_eq!((ev.lease_id, ev.fencing_token), (lease, 42));
    let k = h.counters();
    assert_eq!(
        (
            k.redis_subscribed,
            k.redis_script_calls,
            k.redis_subscriptions
        ),
        (1, 1, 1)
    );
    assert_eq!((k.backend_requests, k.grants), (2, 1));
    assert_eq!(h.backend_error(), "");
}

#[test]
fn malformed_replies_are_refused_and_change_nothing() {
    let h = redis_client();
    h.poll();
    acquire(&h, b"jobs");
    let r = h.poll().unwrap();
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
        expect(
            h.reply_raw(2 * MS, r.id, values, data),
            LH_ERR_INVALID_REPLY,
        );
    }
    // SAFETY: NULL values and a NULL data pointer with a length.
    unsafe {
        expect(
            lh_io_reply(h.0, 2 * MS, r.id, null(), 0, null(), 0),
            LH_ERR_NULL_ARGUMENT,
        );
        let v = [int(1)];
        expect(
            lh_io_reply(h.0, 2 * MS, r.id, v.as_ptr(), 1, null(), 5),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_io_message(h.0, MS, null(), 3, null(), 0),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_io_message(h.0, MS, b"ch".as_ptr(), 2, null(), 3),
            LH_ERR_NULL_ARGUMENT,
        );
    }
    let k = h.counters();
    assert_eq!(
        (
            k.backend_stale_replies,
            k.backend_garbage_replies,
            k.backend_ignored_messages
        ),
        (0, 0, 0)
    );
    // The request is still pending: a good reply is taken.
    ok(h.reply_raw(2 * MS, r.id, &[array(3), int(1), int(7), int(3_000)], b""));
    assert_eq!(h.event().unwrap().fencing_token, 7);
}

/// Feeds the deadlines until the next request goes out (bounded).
fn next_request(h: &H, now: &mut u64) -> Req {
    for _ in 0..50 {
        let d = h.deadline();
        assert_ne!(d, LH_NO_DEADLINE, "nothing scheduled");
        *now = (*now).max(d);
        ok(h.timeout(*now));
        if let Some(r) = h.poll() {
            return r;
        }
    }
    panic!("no request within 50 deadlines");
}

#[test]
fn error_replies_transport_failures_and_stale_answers() {
    let h = redis_client();
    subscribed(&h);
    let lease = h
        .acquire(MS, b"jobs", &{
            let mut o = opts(3_000);
            o.wait_ns = 10_000 * MS;
            o
        })
        .unwrap();
    let r = h.poll().unwrap();
    // An error reply is a transport error for the engine, and the backend's text is kept.
    ok(h.reply(
        2 * MS,
        r.id,
        &V::Error(b"READONLY You can't write against a read only replica"),
    ));
    assert!(
        h.backend_error().contains("READONLY"),
        "{}",
        h.backend_error()
    );
    assert_eq!(h.counters().backend_error_replies, 1);
    assert_eq!(
        h.state(lease),
        Ok(LH_STATE_ACQUIRING),
        "retried, not failed"
    );
    // Answers to it now are stale.
    ok(h.reply_raw(3 * MS, r.id, &[array(3), int(1), int(9), int(3_000)], b""));
    ok(h.failed(3 * MS, r.id, LH_FAILURE_TRANSPORT, b""));
    assert_eq!(h.counters().backend_stale_replies, 2);
    assert_eq!(h.state(lease), Ok(LH_STATE_ACQUIRING));
    // The retry fails in transport; the one after it is granted.
    let mut now = 3 * MS;
    let retry = next_request(&h, &mut now);
    ok(h.failed(now, retry.id, LH_FAILURE_TRANSPORT, b"connection refused"));
    let k = h.counters();
    assert_eq!(k.backend_transport_failures, 1);
    let retry = next_request(&h, &mut now);
    assert_eq!(retry.args[0], b"EVALSHA");
    ok(h.reply_raw(now, retry.id, &[array(3), int(1), int(11), int(3_000)], b""));
    assert_eq!(h.fence(lease), Ok(11));
}

#[test]
fn bad_redis_options_are_invalid_config() {
    let cfg = config();
    let mut o = backend(LH_BACKEND_REDIS);
    assert_eq!(
        (o.redis_standby_delay_ms, o.redis_idle_recheck_ms),
        (150, 10_000)
    );
    assert_eq!(o.redis_sharded_wake, 0);
    o.redis_standby_delay_ms = 0;
    assert_eq!(
        try_client(&cfg, &o, &[SEED; 32]).err(),
        Some(LH_ERR_INVALID_CONFIG)
    );
    let mut o = backend(LH_BACKEND_REDIS);
    o.redis_sharded_wake = 2;
    assert_eq!(
        try_client(&cfg, &o, &[SEED; 32]).err(),
        Some(LH_ERR_INVALID_CONFIG)
    );
    let mut o = backend(LH_BACKEND_REDIS);
    for size in [0, 4, size_of::<lh_backend_options>() as u32 - 1] {
        o.struct_size = size;
        assert_eq!(
            try_client(&cfg, &o, &[SEED; 32]).err(),
            Some(LH_ERR_STRUCT_SIZE)
        );
    }
}

#[test]
fn reseeding_a_redis_handle_moves_it_to_a_new_wake_channel() {
    let h = redis_client();
    let first = h.poll().unwrap().args[1].clone();
    let seed = [8u8; 32];
    // SAFETY: pointer to a local.
    ok(unsafe { lh_client_reseed(h.0, seed.as_ptr(), 32) });
    let unsub = h.poll().unwrap();
    let sub = h.poll().unwrap();
    assert_eq!(unsub.args, vec![b"UNSUBSCRIBE".to_vec(), first.clone()]);
    assert_eq!(unsub.connection, LH_CONNECTION_NOTIFY);
    assert_eq!(sub.args[0], b"SUBSCRIBE");
    assert_ne!(sub.args[1], first);
}

#[test]
fn status_on_a_redis_handle_is_one_eval_and_its_reply_reads_back() {
    let h = redis_client();
    h.requests();
    let name = b"reports";
    let id = h.status_request(MS, name);
    let mut bad = 0;
    // SAFETY: pointers to locals.
    unsafe {
        expect(
            lh_status_request(h.0, MS, null(), 3, &mut bad),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_status_request(h.0, MS, name.as_ptr(), name.len(), null_mut()),
            LH_ERR_NULL_ARGUMENT,
        );
        let long = vec![b'n'; 100_000];
        expect(
            lh_status_request(h.0, MS, long.as_ptr(), long.len(), &mut bad),
            LH_ERR_NAME_TOO_LONG,
        );
        expect(
            lh_status_request(h.0, MS, b"\xff".as_ptr(), 1, &mut bad),
            LH_ERR_INVALID_UTF8,
        );
    }
    assert_eq!(bad, 0);
    let r = h.poll().unwrap();
    assert_eq!(r.id, id);
    assert_eq!(r.args[0], b"EVAL");
    assert_eq!(
        &r.args[2..],
        [&b"2"[..], b"lh:{reports}", b"lh:{reports}:fence"]
    );
    assert!(h.poll().is_none());
    assert_eq!(h.poll_status().0.id, 0, "no answer yet");
    // [ "42", 1500, "42" ]: held with fence 42, 1.5 s left.
    ok(h.reply(
        2 * MS,
        id,
        &V::Arr(vec![V::Bulk(b"42"), V::Int(1_500), V::Bulk(b"42")]),
    ));
    let (st, _, _) = h.poll_status();
    assert_eq!((st.id, st.ok, st.held), (id, 1, 1));
    assert_eq!(
        (st.fencing_token, st.remaining_ttl_ms, st.last_fencing_token),
        (42, 1_500, 42)
    );
    // A garbage reply is an answer that says why.
    let id2 = h.status_request(MS, name);
    let r = h.poll().unwrap();
    ok(h.reply(3 * MS, r.id, &V::Int(7)));
    let (st, _, why) = h.poll_status();
    assert_eq!((st.id, st.ok), (id2, 0));
    assert!(!why.is_empty());
    // So is a transport failure.
    let id3 = h.status_request(4 * MS, name);
    ok(h.failed(4 * MS, id3, LH_FAILURE_TRANSPORT, b"gone"));
    let (st, _, why) = h.poll_status();
    assert_eq!((st.id, st.ok), (id3, 0));
    assert!(!why.is_empty());
}

#[test]
fn sharded_wake_subscribes_names_while_waited_on() {
    let mut o = backend(LH_BACKEND_REDIS);
    o.redis_sharded_wake = 1;
    let h = try_client(&config(), &o, &[SEED; 32]).unwrap();
    // Sharded: no client channel is subscribed; names are, while waited on.
    assert!(h.poll().is_none());
    let mut w = opts(3_000);
    w.wait_ns = 10_000 * MS;
    h.acquire(MS, b"jobs", &w).unwrap();
    let r = h.poll().unwrap();
    assert_eq!(r.args[0], b"EVALSHA");
    // Held by someone else: [0, left].
    ok(h.reply(2 * MS, r.id, &V::Arr(vec![V::Int(0), V::Int(2_000)])));
    let sub = h
        .requests()
        .into_iter()
        .find(|r| r.connection == LH_CONNECTION_NOTIFY)
        .expect("a shard subscription");
    assert_eq!(sub.args, [&b"SSUBSCRIBE"[..], b"lh:{jobs}:wake"]);
}

/// A handle driven against a real redis-server the way a C host does: requests run verbatim
/// on a commands connection or the subscriber, replies handed back unread.
struct RealHost {
    h: H,
    cmd: resp::Resp,
    sub: Option<resp::Resp>,
    port: u16,
    events: Vec<lh_event>,
}

fn owned_to_v(o: &resp::Owned) -> V<'_> {
    match o {
        resp::Owned::Nil => V::Nil,
        resp::Owned::Int(i) => V::Int(*i),
        resp::Owned::Bulk(b) => V::Bulk(b),
        resp::Owned::Status(s) => V::Status(s),
        resp::Owned::Error(e) => V::Error(e),
        resp::Owned::Array(a) => V::Arr(a.iter().map(owned_to_v).collect()),
    }
}

impl RealHost {
    fn new(port: u16, seed: u8) -> RealHost {
        RealHost {
            h: client_of(LH_BACKEND_REDIS, seed),
            cmd: resp::Resp::connect(port).unwrap(),
            sub: None,
            port,
            events: Vec::new(),
        }
    }

    fn step(&mut self) {
        while let Some(r) = self.h.poll() {
            assert_eq!(r.kind, LH_IO_COMMAND);
            if r.connection == LH_CONNECTION_COMMANDS {
                match self.cmd.call(&r.args) {
                    Ok(v) => ok(self.h.reply(resp::now(), r.id, &owned_to_v(&v))),
                    Err(e) => ok(self.h.failed(
                        resp::now(),
                        r.id,
                        LH_FAILURE_TRANSPORT,
                        e.to_string().as_bytes(),
                    )),
                }
            } else {
                let sub = self
                    .sub
                    .get_or_insert_with(|| resp::Resp::connect(self.port).unwrap());
                sub.send(&r.args).unwrap();
            }
        }
        if let Some(sub) = self.sub.as_mut() {
            while sub.ready(Duration::from_millis(2)).unwrap() {
                let resp::Owned::Array(items) = sub.read().unwrap() else {
                    panic!("a subscriber reply is an array");
                };
                let (kind, ch) = (items[0].text(), items[1].text());
                let t = resp::now();
                match (kind.as_str(), &items[2]) {
                    ("message", resp::Owned::Bulk(p)) => ok(self.h.message(t, ch.as_bytes(), p)),
                    ("subscribe", _) => ok(self.h.connection(
                        t,
                        LH_CONNECTION_NOTIFY,
                        LH_CONNECTION_SUBSCRIBED,
                        ch.as_bytes(),
                    )),
                    ("unsubscribe", _) => ok(self.h.connection(
                        t,
                        LH_CONNECTION_NOTIFY,
                        LH_CONNECTION_UNSUBSCRIBED,
                        ch.as_bytes(),
                    )),
                    other => panic!("unexpected subscriber reply {other:?}"),
                }
            }
        }
        if self.h.deadline() <= resp::now() {
            ok(self.h.timeout(resp::now()));
        }
        self.events.extend(self.h.events());
    }

    fn acquired(&self, lease: u64) -> Option<u64> {
        self.events
            .iter()
            .find(|e| e.kind == LH_EVENT_ACQUIRED && e.lease_id == lease)
            .map(|e| e.fencing_token)
    }
}

#[test]
fn two_handles_hand_over_on_a_real_redis_through_the_abi() {
    let Some(server) = resp::Server::start() else {
        return;
    };
    let (mut a, mut b) = (RealHost::new(server.port, 1), RealHost::new(server.port, 2));
    let mut w = opts(5_000);
    w.wait_ns = 20_000 * MS;
    let la = a.h.acquire(resp::now(), b"jobs", &w).unwrap();
    let until = |host: &mut RealHost, done: &dyn Fn(&RealHost) -> bool| {
        for _ in 0..2_000 {
            host.step();
            if done(host) {
                return true;
            }
        }
        false
    };
    assert!(until(&mut a, &|h| h.acquired(la).is_some()));
    let fa = a.acquired(la).unwrap();
    assert!(until(&mut b, &|h| h.h.counters().redis_subscribed == 1));
    let lb = b.h.acquire(resp::now(), b"jobs", &w).unwrap();
    for _ in 0..20 {
        b.step();
    }
    assert!(b.acquired(lb).is_none(), "A holds it");
    let t = resp::now();
    ok(a.h.release(t, la));
    a.step();
    // B is woken by A's release message on its subscriber, long before A's TTL runs out.
    assert!(until(&mut b, &|h| h.acquired(lb).is_some()));
    assert!(resp::now() - t < 2_000 * MS);
    assert!(b.acquired(lb).unwrap() > fa);
    let k = b.h.counters();
    assert!(k.backend_wakeups >= 1, "woken by the message");
    assert_eq!(
        (k.backend_error_replies, k.backend_garbage_replies),
        (0, 0),
        "{}",
        b.h.backend_error()
    );
    assert_eq!(a.h.counters().pending_cleanups, 0);
}
