//! The seam itself (`lh_io_*`) across every backend: the same functions poll and answer every
//! kind of request; an answer of the wrong kind is `LH_ERR_WRONG_ANSWER`, a malformed one
//! `LH_ERR_INVALID_REPLY`, and neither changes anything; late, duplicate and unknown ids are
//! counted as stale; unknown connection values are `LH_ERR_INVALID_ENUM`; the backend options
//! and `lh_client_new` refuse what they do not know; `lh_backend_last_error` says what each
//! backend said; and a malformed memory-service request is an error answer that the client
//! counts and turns into a transport error.
#![allow(unsafe_code)]

#[path = "support/abi.rs"]
mod abi;

use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::ptr::{null, null_mut};

use abi::*;
use base64::Engine as _;
use leasehold::ffi::*;

fn waiting(ttl_ms: u64) -> lh_acquire_options {
    let mut o = opts(ttl_ms);
    o.wait_ns = 600_000 * MS;
    o
}

/// A client of `kind` with a lock acquire in flight: its pending request (the one the
/// acquire sent, after the backend's own set-up requests, which are returned too).
fn in_flight(kind: u32) -> (H, u64, Req, Vec<Req>) {
    let h = client_of(kind, 1);
    let setup = h.requests();
    let lease = h.acquire(MS, b"jobs", &waiting(3_000)).unwrap();
    let mut reqs = h.requests();
    assert!(
        !reqs.is_empty(),
        "backend {kind}: the acquire sends a request"
    );
    let r = reqs.remove(0);
    (h, lease, r, setup)
}

/// Every counter of the backend protocol, to check that nothing changed.
fn backend_counters(h: &H) -> [u64; 7] {
    let k = h.counters();
    [
        k.backend_requests,
        k.backend_error_replies,
        k.backend_garbage_replies,
        k.backend_stale_replies,
        k.backend_transport_failures,
        k.backend_wakeups,
        k.backend_ignored_messages,
    ]
}

/// An answer of the backend's own kind to `id` that is well formed whatever it says.
fn own_answer(h: &H, kind: u32, now: u64, id: u64) -> lh_status {
    match kind {
        LH_BACKEND_ETCD => h.http_reply(now, id, 200, b"{}"),
        LH_BACKEND_SQLITE | LH_BACKEND_POSTGRES => h.reply(now, id, &V::Arr(vec![])),
        _ => h.reply(now, id, &V::Int(1)),
    }
}

#[test]
fn the_same_functions_poll_and_answer_every_kind() {
    for kind in BACKENDS {
        let h = client_of(kind, 1);
        let mut raw = MaybeUninit::<lh_io_request>::uninit();
        // The set-up requests, then the acquire's.
        let lease = h.acquire(MS, b"jobs", &opts(3_000)).unwrap();
        let mut seen = Vec::new();
        loop {
            // SAFETY: valid out-pointer; checked before the next call on the handle.
            let r = unsafe {
                ok(lh_io_poll(h.0, raw.as_mut_ptr()));
                raw.assume_init()
            };
            // SAFETY: just polled.
            let Some(req) = (unsafe { Req::copy(&r) }) else {
                break;
            };
            // The fields of other kinds are 0 / NULL.
            match r.kind {
                LH_IO_COMMAND => {
                    assert!(r.argc >= 2 && !r.argv.is_null());
                    assert!(r.statements.is_null() && r.params.is_null() && r.data.is_null());
                    assert_eq!((r.nstatements, r.nparams, r.data_len), (0, 0, 0));
                    assert!(r.method.is_null() && r.path.is_null() && r.authorization.is_null());
                }
                LH_IO_SQL => {
                    assert_eq!(r.connection, LH_CONNECTION_COMMANDS);
                    assert!(r.nstatements >= 1 && !r.data.is_null());
                    assert!(r.argv.is_null() && r.argc == 0);
                    assert!(r.method.is_null() && r.path.is_null() && r.authorization.is_null());
                }
                LH_IO_HTTP => {
                    assert!(r.argv.is_null() && r.argc == 0);
                    assert!(r.statements.is_null() && r.params.is_null());
                    assert!(!r.method.is_null() && !r.path.is_null() && !r.authorization.is_null());
                    assert!(r.data_len > 0);
                }
                other => panic!("backend {kind}: first requests of kind {other}"),
            }
            assert!(
                matches!(r.connection, LH_CONNECTION_COMMANDS | LH_CONNECTION_NOTIFY),
                "{req:?}"
            );
            seen.push(req);
        }
        let kinds: Vec<u32> = seen.iter().map(|r| r.kind).collect();
        let want = match kind {
            LH_BACKEND_MEMORY => vec![LH_IO_COMMAND],
            LH_BACKEND_REDIS => vec![LH_IO_COMMAND, LH_IO_COMMAND],
            LH_BACKEND_SQLITE | LH_BACKEND_POSTGRES => vec![LH_IO_SQL],
            _ => vec![LH_IO_HTTP],
        };
        assert_eq!(kinds, want, "backend {kind}: {seen:?}");
        // Ids are never 0 and never reused.
        let mut ids: Vec<u64> = seen.iter().map(|r| r.id).collect();
        ids.dedup();
        assert_eq!(ids.len(), seen.len());
        // Every backend's request is failed with the one function, the same way.
        let last = seen.last().unwrap();
        ok(h.failed(2 * MS, last.id, LH_FAILURE_TRANSPORT, b"connection refused"));
        assert_eq!(h.counters().backend_transport_failures, 1, "backend {kind}");
        let failed = h.events();
        assert_eq!(
            failed
                .iter()
                .map(|e| (e.kind, e.lease_id))
                .collect::<Vec<_>>(),
            [(LH_EVENT_ACQUIRE_FAILED, lease)],
            "backend {kind}: one attempt, failed in transport"
        );
        assert_eq!(failed[0].reason, LH_REASON_UNAVAILABLE);
    }
}

#[test]
fn an_empty_borrowed_buffer_of_a_request_is_null() {
    // The header: "A borrowed buffer of length 0 is NULL", and an lh_io_request's fields of
    // other kinds are 0 / NULL. An etcd watch cancellation has no body, method or path.
    let h = client_of(LH_BACKEND_ETCD, 1);
    let lease = h.acquire(0, b"n", &waiting(3_000)).unwrap();
    let r = h.poll().unwrap();
    ok(h.http_reply(
        MS,
        r.id,
        200,
        br#"{"header":{"revision":"1"},"ID":"9","TTL":"3"}"#,
    ));
    let t = h.poll().unwrap();
    let key = t.json()["success"][0]["request_put"]["key"].clone();
    // An older key of the name's queue: the holder's.
    let holder = [leasehold::backend::etcd::queue_prefix("n"), b"a".repeat(32)].concat();
    let holder = serde_json::json!(base64::engine::general_purpose::STANDARD.encode(holder));
    let kv = |k: &serde_json::Value, rev: i64| serde_json::json!({"key": k, "create_revision": rev.to_string(), "lease": "9"});
    let txn = serde_json::json!({"header": {"revision": "30"}, "succeeded": true, "responses": [
        {"response_put": {}}, {"response_range": {"kvs": [kv(&key, 30)]}},
        {"response_range": {"kvs": [kv(&holder, 10)]}}]});
    ok(h.http_reply(2 * MS, t.id, 200, &serde_json::to_vec(&txn).unwrap()));
    let range = h.poll().unwrap();
    let found = serde_json::json!({"header": {"revision": "31"}, "kvs": [kv(&holder, 10)]});
    ok(h.http_reply(3 * MS, range.id, 200, &serde_json::to_vec(&found).unwrap()));
    let watch = h.poll().unwrap();
    assert_eq!(watch.kind, LH_IO_HTTP_WATCH);
    // The waiter gives up: its watch is cancelled.
    ok(h.release(4 * MS, lease));
    let mut raw = MaybeUninit::<lh_io_request>::uninit();
    let mut cancel = None;
    for _ in 0..10 {
        // SAFETY: valid out-pointer.
        let r = unsafe {
            ok(lh_io_poll(h.0, raw.as_mut_ptr()));
            raw.assume_init()
        };
        match r.kind {
            LH_IO_HTTP_CANCEL => {
                cancel = Some(r);
                break;
            }
            LH_IO_NONE => break,
            _ => {}
        }
    }
    let c = cancel.expect("the watch is cancelled");
    assert_eq!(c.id, watch.id);
    assert_eq!(c.data_len, 0);
    assert!(
        c.data.is_null(),
        "LH_IO_HTTP_CANCEL: data is not NULL with data_len 0"
    );
}

#[test]
fn wrong_answer_kinds_change_nothing() {
    for kind in BACKENDS {
        let (h, lease, r, _) = in_flight(kind);
        let before = backend_counters(&h);
        let mut wrong: Vec<(&str, lh_status)> = vec![];
        if kind != LH_BACKEND_ETCD {
            wrong.push(("http reply", h.http_reply(2 * MS, r.id, 200, b"{}")));
            wrong.push(("stream message", h.stream_message(2 * MS, r.id, b"{}")));
        } else {
            wrong.push(("values", h.reply(2 * MS, r.id, &V::Int(1))));
            wrong.push(("message", h.message(2 * MS, b"jobs", b"")));
        }
        if kind != LH_BACKEND_REDIS {
            for ev in [LH_CONNECTION_SUBSCRIBED, LH_CONNECTION_UNSUBSCRIBED] {
                wrong.push((
                    "subscription",
                    h.connection(2 * MS, LH_CONNECTION_NOTIFY, ev, b"ch"),
                ));
            }
        }
        for (what, st) in wrong {
            expect(st, LH_ERR_WRONG_ANSWER);
            assert!(!h.last_error().is_empty(), "backend {kind}: {what}");
        }
        assert_eq!(backend_counters(&h), before, "backend {kind}");
        assert!(
            h.events().is_empty() && h.poll().is_none(),
            "backend {kind}"
        );
        assert_eq!(h.state(lease), Ok(LH_STATE_ACQUIRING));
        // The request is still pending: failing it now is taken (not stale).
        ok(h.failed(3 * MS, r.id, LH_FAILURE_TRANSPORT, b""));
        let k = h.counters();
        assert_eq!(
            (k.backend_transport_failures, k.backend_stale_replies),
            (1, 0),
            "backend {kind}"
        );
    }
}

#[test]
fn malformed_answers_are_invalid_reply_and_change_nothing() {
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
    let malformed: Vec<(Vec<lh_value>, &[u8])> = vec![
        (vec![], b""),
        (vec![arr(2), arr(0)], b""),
        (vec![arr(0), arr(0)], b""),
        (vec![bulk(1, 3)], b"ab"),
        (
            vec![lh_value {
                kind: 77,
                ..lh_value::default()
            }],
            b"",
        ),
        (vec![arr(1); LH_MAX_REPLY_DEPTH + 2], b""),
    ];
    for kind in BACKENDS {
        let (h, lease, r, _) = in_flight(kind);
        let before = backend_counters(&h);
        if kind == LH_BACKEND_ETCD {
            for status in [0, 99, 600, 1_000, u32::MAX] {
                expect(
                    h.http_reply(2 * MS, r.id, status, b"{}"),
                    LH_ERR_INVALID_REPLY,
                );
            }
            let big = vec![b'{'; LH_MAX_REPLY_DATA + 1];
            expect(h.http_reply(2 * MS, r.id, 200, &big), LH_ERR_INVALID_REPLY);
        } else {
            for (values, data) in &malformed {
                expect(
                    h.reply_raw(2 * MS, r.id, values, data),
                    LH_ERR_INVALID_REPLY,
                );
                assert!(h.last_error().contains("invalid"), "{}", h.last_error());
            }
        }
        // A status outside 100..=599 is refused on every backend before its kind matters.
        expect(h.http_reply(2 * MS, r.id, 42, b""), LH_ERR_INVALID_REPLY);
        assert_eq!(backend_counters(&h), before, "backend {kind}");
        assert!(h.events().is_empty() && h.poll().is_none());
        assert_eq!(h.state(lease), Ok(LH_STATE_ACQUIRING));
        ok(h.failed(3 * MS, r.id, LH_FAILURE_TRANSPORT, b""));
        assert_eq!(h.counters().backend_transport_failures, 1, "still pending");
    }
}

#[test]
fn late_duplicate_and_unknown_ids_are_counted_stale() {
    for kind in BACKENDS {
        let (h, _, r, _) = in_flight(kind);
        let base = h.counters().backend_stale_replies;
        // Answered, then answered again (both ways).
        ok(h.failed(2 * MS, r.id, LH_FAILURE_TRANSPORT, b""));
        ok(h.failed(2 * MS, r.id, LH_FAILURE_TRANSPORT, b""));
        ok(own_answer(&h, kind, 2 * MS, r.id));
        // Never issued.
        for id in [0, 999_999, u64::MAX] {
            ok(own_answer(&h, kind, 2 * MS, id));
            ok(h.failed(2 * MS, id, LH_FAILURE_DATABASE, b"x"));
        }
        let k = h.counters();
        assert_eq!(k.backend_stale_replies, base + 8, "backend {kind}");
        assert_eq!(k.backend_transport_failures, 1, "backend {kind}");
        // Late: a request its protocol gave up on long ago (the host never answered).
        let mut now = 2 * MS;
        let late = loop {
            now = now.max(h.deadline());
            ok(h.timeout(now));
            if let Some(r) = h.requests().pop() {
                break r;
            }
            assert!(now < 60_000 * MS, "backend {kind}: no retry");
        };
        now += 200_000 * MS;
        ok(h.timeout(now));
        h.requests();
        h.events();
        let before = h.counters();
        ok(own_answer(&h, kind, now, late.id));
        let k = h.counters();
        assert_eq!(
            k.backend_stale_replies,
            before.backend_stale_replies + 1,
            "backend {kind}: a late answer"
        );
        assert_eq!(
            (k.grants, k.backend_garbage_replies),
            (before.grants, before.backend_garbage_replies)
        );
    }
}

#[test]
fn unknown_connection_values_are_invalid_enum() {
    for kind in BACKENDS {
        let (h, lease, _, _) = in_flight(kind);
        let before = backend_counters(&h);
        for conn in [0, 3, 7, u32::MAX] {
            expect(
                h.connection(2 * MS, conn, LH_CONNECTION_REOPENED, b""),
                LH_ERR_INVALID_ENUM,
            );
            assert!(h.last_error().contains("connection"), "{}", h.last_error());
        }
        for event in [0, 4, 9, u32::MAX] {
            for conn in [LH_CONNECTION_COMMANDS, LH_CONNECTION_NOTIFY] {
                expect(
                    h.connection(2 * MS, conn, event, b"ch"),
                    LH_ERR_INVALID_ENUM,
                );
            }
        }
        for failure in [0, 3, u32::MAX] {
            expect(h.failed(2 * MS, 1, failure, b""), LH_ERR_INVALID_ENUM);
        }
        // SAFETY: a NULL channel with a length is refused, never read.
        expect(
            unsafe {
                lh_io_connection(
                    h.0,
                    2 * MS,
                    LH_CONNECTION_NOTIFY,
                    LH_CONNECTION_SUBSCRIBED,
                    null(),
                    3,
                )
            },
            LH_ERR_NULL_ARGUMENT,
        );
        assert_eq!(backend_counters(&h), before, "backend {kind}");
        assert_eq!(h.state(lease), Ok(LH_STATE_ACQUIRING));
        // A reopened connection is harmless everywhere.
        ok(h.connection(2 * MS, LH_CONNECTION_COMMANDS, LH_CONNECTION_REOPENED, b""));
    }
}

#[test]
fn backend_options_and_client_new_refuse_what_they_do_not_know() {
    let sentinel = lh_backend_options {
        struct_size: 7,
        kind: 7,
        ..backend(LH_BACKEND_MEMORY)
    };
    for bad in [0, 7, 99, u32::MAX] {
        let mut o = sentinel;
        // SAFETY: valid out-pointer.
        expect(
            unsafe { lh_backend_options_default(bad, &mut o) },
            LH_ERR_INVALID_ENUM,
        );
        assert_eq!((o.struct_size, o.kind), (7, 7), "written on error");
    }
    // SAFETY: NULL is refused.
    expect(
        unsafe { lh_backend_options_default(LH_BACKEND_REDIS, null_mut()) },
        LH_ERR_NULL_ARGUMENT,
    );
    for kind in BACKENDS {
        let o = backend(kind);
        assert_eq!(
            (o.struct_size as usize, o.kind),
            (size_of::<lh_backend_options>(), kind)
        );
        assert!(o.etcd_user.is_null() && o.etcd_password.is_null());
    }
    let (cfg, seed) = (config(), [1u8; 32]);
    let sentinel = 0x1234usize as *mut lh_client;
    let mut c = sentinel;
    // SAFETY: NULL backend, otherwise valid pointers.
    expect(
        unsafe { lh_client_new(&cfg, null(), seed.as_ptr(), 32, &mut c) },
        LH_ERR_NULL_ARGUMENT,
    );
    assert_eq!(c, sentinel, "out written on error");
    for bad in [0, 7, u32::MAX] {
        let mut o = backend(LH_BACKEND_MEMORY);
        o.kind = bad;
        assert_eq!(try_client(&cfg, &o, &seed).err(), Some(LH_ERR_INVALID_ENUM));
    }
    let mut o = backend(LH_BACKEND_MEMORY);
    o.struct_size = 8;
    assert_eq!(try_client(&cfg, &o, &seed).err(), Some(LH_ERR_STRUCT_SIZE));
}

#[test]
fn lh_backend_last_error_on_each_backend() {
    // SAFETY: a NULL handle reads "".
    assert_eq!(
        unsafe { CStr::from_ptr(lh_backend_last_error(null_mut())) }.to_bytes(),
        b""
    );
    for kind in BACKENDS {
        let (h, _, r, _) = in_flight(kind);
        assert_eq!(h.backend_error(), "", "backend {kind}: none yet");
        let (st, said) = match kind {
            LH_BACKEND_MEMORY => (
                h.reply(2 * MS, r.id, &V::Error(b"ERR the service said no")),
                "the service said no",
            ),
            LH_BACKEND_REDIS => (
                h.reply(2 * MS, r.id, &V::Error(b"LOADING Redis is loading")),
                "LOADING",
            ),
            LH_BACKEND_SQLITE | LH_BACKEND_POSTGRES => (
                h.failed(2 * MS, r.id, LH_FAILURE_DATABASE, b"disk I/O error"),
                "disk I/O error",
            ),
            _ => (
                h.http_reply(
                    2 * MS,
                    r.id,
                    500,
                    br#"{"error":"etcdserver: leader changed","code":14}"#,
                ),
                "leader changed",
            ),
        };
        ok(st);
        let text = h.backend_error();
        assert!(text.contains(said), "backend {kind}: {text:?}");
        // It stays until the backend says something else, and survives other calls.
        h.counters();
        assert_eq!(h.backend_error(), text);
        assert_eq!(h.last_error(), "", "no call failed");
    }
}

#[test]
fn the_host_reason_of_a_failed_request_is_the_last_error_on_every_backend() {
    for kind in BACKENDS {
        let (h, _, r, _) = in_flight(kind);
        ok(h.failed(
            2 * MS,
            r.id,
            LH_FAILURE_TRANSPORT,
            b"connection reset by peer",
        ));
        let text = h.backend_error();
        assert!(
            text.contains("connection reset by peer"),
            "backend {kind}: {text:?}"
        );
    }
}

#[test]
fn a_malformed_memory_request_is_a_counted_error_answer_and_a_transport_error() {
    let svc = Svc::new();
    let m = Mem::new(&svc, 1);
    let nine: Vec<&[u8]> = vec![b"RELEASE"; 9];
    let cases: Vec<(Vec<&[u8]>, &str)> = vec![
        (vec![b"GRAB", b"jobs", b"t", b"1000"], "unknown request"),
        (vec![b"ACQUIRE", b"jobs", b"t", b"soon"], "ttl_ms"),
        (nine, "at most 8"),
    ];
    for (i, (argv, why)) in cases.into_iter().enumerate() {
        let now = (i as u64 + 1) * 10_000 * MS;
        let lease = m.h.acquire(now, b"jobs", &opts(3_000)).unwrap();
        let r = m.h.poll().unwrap();
        // The host hands over a request the client never sent (a broken executor).
        let a = svc.call(m.conn, now, &argv).unwrap();
        assert!(!a.dropped);
        ok(m.h.reply_raw(now, r.id, &a.values, &a.data));
        let k = m.h.counters();
        assert_eq!(k.backend_error_replies, i as u64 + 1, "{why}");
        assert!(m.h.backend_error().contains(why), "{}", m.h.backend_error());
        let evs = m.h.events();
        assert_eq!(
            evs.iter()
                .map(|e| (e.kind, e.lease_id, e.reason))
                .collect::<Vec<_>>(),
            [(LH_EVENT_ACQUIRE_FAILED, lease, LH_REASON_UNAVAILABLE)],
            "{why}: a transport error for the engine"
        );
        assert_eq!(svc.stats().grants, 0, "nothing granted");
        // The unknown outcome is cleaned up: the release goes to the service for real.
        let ran = m.serve(&svc, now);
        assert!(ran.iter().all(|r| r.args[0] == b"RELEASE"), "{ran:?}");
    }
    assert_eq!(m.h.counters().pending_cleanups, 0);
}
