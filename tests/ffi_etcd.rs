//! Drives etcd-backend handles through the seam (`lh_client_new` with `LH_BACKEND_ETCD`,
//! `lh_io_poll` of `LH_IO_HTTP` / `_WATCH` / `_CANCEL` requests, `lh_io_http_reply`,
//! `lh_io_stream_message`, `lh_io_failed`, `lh_io_close`) from Rust as a C host would: method,
//! path and body read in place, replies handed back as status and bytes. Hostile input is an
//! error that changes nothing. `tests/etcd_server.rs` runs the protocol against a real cluster.
#![allow(unsafe_code)]

#[path = "support/abi.rs"]
mod abi;

use std::ptr::{null, null_mut};

use abi::*;
use base64::Engine as _;
use leasehold::backend::etcd::{paths, queue_prefix};
use leasehold::ffi::*;
use serde_json::{Value, json};

fn etcd_client() -> H {
    client_of(LH_BACKEND_ETCD, 3)
}

/// The next request, which must be an HTTP one: (id, kind, path, body).
fn poll(h: &H) -> Option<(u64, u32, String, Value)> {
    let r = h.poll()?;
    assert!(
        matches!(r.kind, LH_IO_HTTP | LH_IO_HTTP_WATCH | LH_IO_HTTP_CANCEL),
        "{r:?}"
    );
    if r.kind == LH_IO_HTTP_CANCEL {
        // A cancellation names only its watch: every other field is NULL.
        assert!(r.method.is_none() && r.path.is_none() && r.authorization.is_none());
    } else {
        assert_eq!(r.method.as_deref(), Some("POST"));
    }
    assert!(r.args.is_empty() && r.statements.is_empty());
    Some((r.id, r.kind, r.path.clone().unwrap_or_default(), r.json()))
}

fn acquire(h: &H, name: &str) -> u64 {
    let mut o = opts(3_000);
    o.wait_ns = 60_000 * MS;
    h.acquire(0, name.as_bytes(), &o).unwrap()
}

fn events(h: &H) -> Vec<(u32, u64)> {
    h.events()
        .iter()
        .map(|e| (e.kind, e.fencing_token))
        .collect()
}

fn b64(s: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn kv(key: &[u8], rev: i64, lease: i64) -> Value {
    json!({"key": b64(key), "create_revision": rev.to_string(),
           "mod_revision": rev.to_string(), "version": "1", "lease": lease.to_string()})
}

/// A transaction reply: `succeeded`, our key and the queue's first key.
fn txn(succeeded: bool, own: &Value, first: &Value, rev: i64) -> Vec<u8> {
    let range = |kv: &Value| json!({"response_range": {"kvs": [kv], "count": "1"}});
    let mut responses = Vec::new();
    if succeeded {
        responses.push(json!({"response_put": {"header": {"revision": rev.to_string()}}}));
    }
    responses.extend([range(own), range(first)]);
    let v = json!({"header": {"revision": rev.to_string()}, "succeeded": succeeded,
                   "responses": responses});
    serde_json::to_vec(&v).unwrap()
}

fn grant(id: i64) -> Vec<u8> {
    format!(r#"{{"header":{{"revision":"1"}},"ID":"{id}","TTL":"3"}}"#).into_bytes()
}

fn put_key(body: &Value) -> Vec<u8> {
    let k = body["success"][0]["request_put"]["key"].as_str().unwrap();
    base64::engine::general_purpose::STANDARD.decode(k).unwrap()
}

#[test]
fn an_acquire_through_the_abi_is_a_grant_then_a_txn_and_fences_with_the_create_revision() {
    let h = etcd_client();
    acquire(&h, "orders");
    let (id, kind, path, body) = poll(&h).unwrap();
    assert_eq!((kind, path.as_str()), (LH_IO_HTTP, paths::LEASE_GRANT));
    assert_eq!(body, json!({"TTL": "3"}));
    // A lease id that is not a number is garbage, not a grant.
    let bad = br#"{"header":{"revision":"1"},"ID":"694d77aa9e38260f","TTL":"3"}"#;
    ok(h.http_reply(MS, id, 200, bad));
    assert!(events(&h).is_empty());
    assert!(!h.backend_error().is_empty());
    // The engine retries after a backoff; feed its timeout.
    let deadline = h.deadline();
    ok(h.timeout(deadline));
    let (id, _, path, _) = poll(&h).unwrap();
    assert_eq!(path, paths::LEASE_GRANT);
    ok(h.http_reply(deadline + MS, id, 200, &grant(7587)));
    let (id, _, path, body) = poll(&h).unwrap();
    assert_eq!(path, paths::KV_TXN);
    let key = put_key(&body);
    let mine = kv(&key, 99, 7587);
    ok(h.http_reply(deadline + 2 * MS, id, 200, &txn(true, &mine, &mine, 99)));
    assert_eq!(events(&h), vec![(LH_EVENT_ACQUIRED, 99)]);
    assert!(poll(&h).is_none());
    let k = h.counters();
    assert_eq!(
        (
            k.etcd_leases_granted,
            k.etcd_txns,
            k.backend_garbage_replies
        ),
        (2, 1, 1)
    );
    assert_eq!((k.backend_requests, k.grants), (3, 1));
}

#[test]
fn a_waiter_watches_its_predecessor_through_the_stream_functions() {
    let h = etcd_client();
    let holder = [queue_prefix("n"), b"a".repeat(32)].concat();
    let lease = acquire(&h, "n");
    let (id, ..) = poll(&h).unwrap();
    ok(h.http_reply(MS, id, 200, &grant(9)));
    let (id, _, path, body) = poll(&h).unwrap();
    assert_eq!(path, paths::KV_TXN);
    let mine = put_key(&body);
    ok(h.http_reply(
        2 * MS,
        id,
        200,
        &txn(true, &kv(&mine, 30, 9), &kv(&holder, 10, 1), 30),
    ));
    assert!(events(&h).is_empty(), "queued behind the holder");
    let (id, _, path, _) = poll(&h).unwrap();
    assert_eq!(path, paths::KV_RANGE);
    let range = json!({"header": {"revision": "31"}, "kvs": [kv(&holder, 10, 1)], "count": "1"});
    ok(h.http_reply(3 * MS, id, 200, &serde_json::to_vec(&range).unwrap()));
    let (watch, kind, path, body) = poll(&h).unwrap();
    assert_eq!((kind, path.as_str()), (LH_IO_HTTP_WATCH, paths::WATCH));
    assert_eq!(body["create_request"]["key"], b64(&holder));
    assert_eq!(h.counters().etcd_watches, 1);
    // The stream's first message (created) wakes nobody; an oversized one is refused.
    ok(h.stream_message(
        4 * MS,
        watch,
        br#"{"result":{"header":{"revision":"31"},"created":true}}"#,
    ));
    let big = vec![b' '; LH_MAX_REPLY_DATA + 1];
    expect(h.stream_message(4 * MS, watch, &big), LH_ERR_INVALID_REPLY);
    assert!(poll(&h).is_none());
    // The holder's key is deleted: the waiter is woken and the stream is to be closed.
    let del = json!({"result": {"header": {"revision": "40"}, "events": [
        {"type": "DELETE", "kv": {"key": b64(&holder), "mod_revision": "40"}}]}});
    ok(h.stream_message(5 * MS, watch, &serde_json::to_vec(&del).unwrap()));
    assert_eq!(h.counters().backend_wakeups, 1);
    let (id, kind, ..) = poll(&h).unwrap();
    assert_eq!((id, kind), (watch, LH_IO_HTTP_CANCEL));
    // Messages on a closed stream and its end are stale.
    let stale = h.counters().backend_stale_replies;
    ok(h.stream_message(6 * MS, watch, &serde_json::to_vec(&del).unwrap()));
    ok(h.failed(6 * MS, watch, LH_FAILURE_TRANSPORT, b"stream closed"));
    assert_eq!(h.counters().backend_stale_replies, stale + 2);
    assert_eq!(h.state(lease), Ok(LH_STATE_ACQUIRING));
}

#[test]
fn hostile_input_is_an_error_that_changes_nothing() {
    let h = etcd_client();
    acquire(&h, "n");
    let (id, ..) = poll(&h).unwrap();
    let big = vec![b' '; LH_MAX_REPLY_DATA + 1];
    // SAFETY: deliberately NULL / oversized / out-of-range arguments.
    unsafe {
        expect(lh_io_poll(h.0, null_mut()), LH_ERR_NULL_ARGUMENT);
        expect(lh_io_poll(null_mut(), null_mut()), LH_ERR_NULL_ARGUMENT);
        expect(
            lh_io_http_reply(h.0, MS, id, 200, null(), 5),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_io_stream_message(h.0, MS, id, null(), 5),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_io_http_reply(h.0, MS, id, 200, big.as_ptr(), usize::MAX),
            LH_ERR_INVALID_REPLY,
        );
        let mut k: lh_counters = std::mem::zeroed();
        expect(lh_counters_get(h.0, &mut k), LH_ERR_STRUCT_SIZE);
    }
    for status in [0, 99, 600, 70_000, u32::MAX] {
        expect(h.http_reply(MS, id, status, b""), LH_ERR_INVALID_REPLY);
        assert!(h.last_error().contains("HTTP status"), "{}", h.last_error());
    }
    expect(h.http_reply(MS, id, 200, &big), LH_ERR_INVALID_REPLY);
    expect(h.stream_message(MS, id, &big), LH_ERR_INVALID_REPLY);
    expect(h.failed(MS, id, 0, b""), LH_ERR_INVALID_ENUM);
    // Answers of other backends' kinds.
    expect(h.reply(MS, id, &V::Int(1)), LH_ERR_WRONG_ANSWER);
    expect(h.message(MS, b"ch", b""), LH_ERR_WRONG_ANSWER);
    expect(
        h.connection(MS, LH_CONNECTION_NOTIFY, LH_CONNECTION_SUBSCRIBED, b"ch"),
        LH_ERR_WRONG_ANSWER,
    );
    let k = h.counters();
    assert_eq!(
        (
            k.backend_garbage_replies,
            k.backend_stale_replies,
            k.backend_error_replies
        ),
        (0, 0, 0)
    );
    // The request is still open: a real reply is taken.
    ok(h.http_reply(MS, id, 200, &grant(12)));
    let (_, _, path, _) = poll(&h).unwrap();
    assert_eq!(path, paths::KV_TXN);
    // Unknown ids are counted and ignored.
    ok(h.http_reply(MS, 12345, 200, b"{}"));
    ok(h.failed(MS, 12345, LH_FAILURE_TRANSPORT, b""));
    ok(h.stream_message(MS, 12345, b"{}"));
    assert_eq!(h.counters().backend_stale_replies, 3);
}

#[test]
fn error_statuses_and_bodies_are_transport_errors_with_the_text_kept() {
    let h = etcd_client();
    acquire(&h, "n");
    let (id, ..) = poll(&h).unwrap();
    let body = br#"{"error":"etcdserver: too many requests","code":14}"#;
    ok(h.http_reply(MS, id, 503, body));
    assert!(events(&h).is_empty(), "retried within the wait budget");
    assert!(
        h.backend_error().contains("too many requests"),
        "{}",
        h.backend_error()
    );
    assert_eq!(h.counters().backend_error_replies, 1);
}

fn etcd_options(user: &[u8], password: &[u8]) -> lh_backend_options {
    let mut o = backend(LH_BACKEND_ETCD);
    (o.etcd_user, o.etcd_user_len) = (user.as_ptr(), user.len());
    (o.etcd_password, o.etcd_password_len) = (password.as_ptr(), password.len());
    o
}

#[test]
fn credentials_are_checked_and_the_token_is_carried_in_authorization() {
    let (cfg, seed) = (config(), [5u8; 32]);
    let long = vec![b'u'; 257];
    let bad = etcd_options(b"\xff", b"pw");
    assert_eq!(
        try_client(&cfg, &bad, &seed).err(),
        Some(LH_ERR_INVALID_UTF8)
    );
    let bad = etcd_options(&long, b"pw");
    assert_eq!(
        try_client(&cfg, &bad, &seed).err(),
        Some(LH_ERR_INVALID_CONFIG)
    );
    let mut bad = etcd_options(b"root", b"pw");
    bad.etcd_password = null();
    assert_eq!(
        try_client(&cfg, &bad, &seed).err(),
        Some(LH_ERR_NULL_ARGUMENT),
        "NULL with a length"
    );
    let good = etcd_options(b"root", b"pw");
    let h = try_client(&cfg, &good, &seed).unwrap();
    acquire(&h, "n");
    let r = h.poll().unwrap();
    assert_eq!(
        (r.path.as_deref(), r.authorization.as_deref()),
        (Some(paths::AUTHENTICATE), Some(""))
    );
    ok(h.http_reply(
        MS,
        r.id,
        200,
        br#"{"header":{"revision":"1"},"token":"tok.1"}"#,
    ));
    let r = h.poll().unwrap();
    assert_eq!(
        (r.path.as_deref(), r.authorization.as_deref()),
        (Some(paths::LEASE_GRANT), Some("tok.1"))
    );
}

#[test]
fn lh_io_close_revokes_the_pooled_lease_and_ends_a_held_lock_lost() {
    let h = etcd_client();
    acquire(&h, "n");
    let (id, _, path, _) = poll(&h).unwrap();
    assert_eq!(path, paths::LEASE_GRANT);
    ok(h.http_reply(MS, id, 200, &grant(41)));
    let (id, _, _, body) = poll(&h).unwrap();
    let mine = kv(&put_key(&body), 7, 41);
    ok(h.http_reply(2 * MS, id, 200, &txn(true, &mine, &mine, 7)));
    assert_eq!(events(&h), vec![(LH_EVENT_ACQUIRED, 7)]);
    // SAFETY: a live handle, then NULL.
    unsafe {
        ok(lh_io_close(h.0, 3 * MS));
        expect(lh_io_close(null_mut(), 3 * MS), LH_ERR_NULL_ARGUMENT);
    }
    let (_, kind, path, body) = poll(&h).unwrap();
    assert_eq!((kind, path.as_str()), (LH_IO_HTTP, paths::LEASE_REVOKE));
    assert_eq!(body, json!({"ID": "41"}));
    assert!(poll(&h).is_none());
    assert_eq!(
        events(&h).iter().map(|o| o.0).collect::<Vec<_>>(),
        vec![LH_EVENT_LOST]
    );
    // Another backend has nothing of its own to give back: nothing is sent.
    let other = client_of(LH_BACKEND_MEMORY, 5);
    let lease = other.acquire(0, b"n", &opts(3_000)).unwrap();
    let a = other.poll().unwrap();
    // SAFETY: a live handle.
    ok(unsafe { lh_io_close(other.0, MS) });
    assert!(other.poll().is_none());
    assert_eq!(other.state(lease), Ok(LH_STATE_ACQUIRING));
    ok(other.reply(MS, a.id, &word("GRANTED", vec![V::Int(1)])));
    assert_eq!(other.state(lease), Ok(LH_STATE_HELD));
}
