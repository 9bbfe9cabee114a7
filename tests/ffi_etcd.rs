//! Drives the etcd exports (`lh_client_new_etcd`, `lh_http_poll_request`, `lh_http_reply`,
//! …) from Rust as a C host would: method, path and body read in place, replies handed back
//! as status and bytes. Hostile input is an error that changes nothing.
//! `tests/etcd_server.rs` runs the protocol against a real cluster.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::ptr::{null, null_mut};

use leasehold::ffi::*;
use serde_json::{Value, json};

const MS: u64 = 1_000_000;

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

fn etcd_client() -> H {
    let (cfg, seed) = (config(), [3u8; 32]);
    let mut c = null_mut();
    // SAFETY: pointers to locals.
    let st = unsafe { lh_client_new_etcd(&cfg, null(), seed.as_ptr(), seed.len(), &mut c) };
    assert_eq!(st, LH_OK);
    H(c)
}

/// The next request: (id, kind, method, path, body).
fn poll(h: &H) -> Option<(u64, u32, String, String, Value)> {
    let mut r = MaybeUninit::<lh_http_request>::uninit();
    // SAFETY: valid out-pointer; the request borrows the handle until the next call.
    let r = unsafe {
        assert_eq!(lh_http_poll_request(h.0, r.as_mut_ptr()), LH_OK);
        r.assume_init()
    };
    if r.id == 0 {
        return None;
    }
    // SAFETY: NUL-terminated strings and a body of body_len bytes, borrowed until the next call.
    let (method, path, body) = unsafe {
        (
            CStr::from_ptr(r.method).to_str().unwrap().to_owned(),
            CStr::from_ptr(r.path).to_str().unwrap().to_owned(),
            std::slice::from_raw_parts(r.body, r.body_len).to_vec(),
        )
    };
    let body = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).unwrap()
    };
    Some((r.id, r.kind, method, path, body))
}

fn reply(h: &H, now: u64, id: u64, status: u32, body: &[u8]) -> u32 {
    // SAFETY: a live handle and a readable body.
    unsafe { lh_http_reply(h.0, now, id, status, body.as_ptr(), body.len()) }
}

fn acquire(h: &H, name: &str) -> u64 {
    let mut o = MaybeUninit::<lh_acquire_options>::uninit();
    let mut lease = 0;
    // SAFETY: valid out-pointers.
    unsafe {
        lh_acquire_options_default(o.as_mut_ptr());
        let mut o = o.assume_init();
        o.ttl_ms = 3_000;
        o.wait_ns = 60_000 * MS;
        assert_eq!(
            lh_acquire(h.0, 0, name.as_ptr(), name.len(), &o, &mut lease),
            LH_OK
        );
    }
    lease
}

fn outputs(h: &H) -> Vec<(u32, u64)> {
    let mut v = Vec::new();
    loop {
        let mut o = MaybeUninit::<lh_output>::uninit();
        // SAFETY: valid out-pointer.
        let o = unsafe {
            assert_eq!(lh_poll_output(h.0, o.as_mut_ptr()), LH_OK);
            o.assume_init()
        };
        if o.kind == LH_OUTPUT_NONE {
            return v;
        }
        v.push((o.kind, o.fencing_token));
    }
}

fn b64(s: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[test]
fn an_acquire_through_the_abi_is_a_grant_then_a_txn_and_fences_with_the_create_revision() {
    let h = etcd_client();
    acquire(&h, "orders");
    let (id, kind, method, path, body) = poll(&h).unwrap();
    assert_eq!(
        (kind, method.as_str(), path.as_str()),
        (LH_HTTP_UNARY, "POST", "/v3/lease/grant")
    );
    assert_eq!(body, json!({"TTL": "3"}));
    let grant = br#"{"header":{"revision":"1"},"ID":"694d77aa9e38260f","TTL":"3"}"#;
    // A lease id that is not a number is garbage, not a grant.
    assert_eq!(reply(&h, MS, id, 200, grant), LH_OK);
    assert!(outputs(&h).is_empty());
    // The engine retries after a backoff; feed its timeout.
    let mut deadline = 0;
    // SAFETY: valid out-pointer.
    unsafe { assert_eq!(lh_poll_timeout(h.0, &mut deadline), LH_OK) };
    // SAFETY: a live handle.
    unsafe { assert_eq!(lh_timeout(h.0, deadline), LH_OK) };
    let (id, _, _, path, _) = poll(&h).unwrap();
    assert_eq!(path, "/v3/lease/grant");
    let grant = br#"{"header":{"revision":"1"},"ID":"7587","TTL":"3"}"#;
    assert_eq!(reply(&h, deadline + MS, id, 200, grant), LH_OK);
    let (id, _, _, path, body) = poll(&h).unwrap();
    assert_eq!(path, "/v3/kv/txn");
    let key = body["success"][0]["request_put"]["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let kv = json!({"key": key, "create_revision": "99", "lease": "7587"});
    let txn = json!({"header": {"revision": "99"}, "succeeded": true, "responses": [
        {"response_put": {"header": {"revision": "99"}}},
        {"response_range": {"kvs": [kv]}}, {"response_range": {"kvs": [kv]}}]});
    let txn = serde_json::to_vec(&txn).unwrap();
    assert_eq!(reply(&h, deadline + 2 * MS, id, 200, &txn), LH_OK);
    assert_eq!(outputs(&h), vec![(LH_OUTPUT_ACQUIRED, 99)]);
    assert!(poll(&h).is_none());
    let mut k = lh_etcd_counters {
        struct_size: size_of::<lh_etcd_counters>() as u32,
        ..Default::default()
    };
    // SAFETY: valid out-pointer with its size set.
    unsafe { assert_eq!(lh_etcd_counters_get(h.0, &mut k), LH_OK) };
    assert_eq!((k.leases_granted, k.txns, k.garbage_replies), (2, 1, 1));
    let (mut text, mut len) = (null(), 0usize);
    // SAFETY: valid out-pointers; the text borrows the handle.
    unsafe { assert_eq!(lh_etcd_last_error(h.0, &mut text, &mut len), LH_OK) };
    assert!(len > 0);
    let _ = b64(b"");
}

#[test]
fn hostile_input_is_an_error_that_changes_nothing() {
    let h = etcd_client();
    acquire(&h, "n");
    let (id, ..) = poll(&h).unwrap();
    // SAFETY: deliberately NULL / oversized / out-of-range arguments.
    unsafe {
        assert_eq!(lh_http_poll_request(h.0, null_mut()), LH_ERR_NULL_ARGUMENT);
        assert_eq!(
            lh_http_poll_request(null_mut(), null_mut()),
            LH_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            lh_http_reply(h.0, MS, id, 200, null(), 5),
            LH_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            lh_http_reply(h.0, MS, id, 99, null(), 0),
            LH_ERR_INVALID_REPLY
        );
        assert_eq!(
            lh_http_reply(h.0, MS, id, 70_000, null(), 0),
            LH_ERR_INVALID_REPLY
        );
        let big = vec![b' '; LH_MAX_HTTP_BODY + 1];
        assert_eq!(
            lh_http_reply(h.0, MS, id, 200, big.as_ptr(), big.len()),
            LH_ERR_INVALID_REPLY
        );
        assert_eq!(
            lh_http_stream_message(h.0, MS, id, big.as_ptr(), big.len()),
            LH_ERR_INVALID_REPLY
        );
        let mut k = lh_etcd_counters::default();
        assert_eq!(lh_etcd_counters_get(h.0, &mut k), LH_ERR_STRUCT_SIZE);
    }
    // The request is still open: a real reply is taken.
    let grant = br#"{"header":{"revision":"1"},"ID":"12","TTL":"3"}"#;
    assert_eq!(reply(&h, MS, id, 200, grant), LH_OK);
    let (_, _, _, path, _) = poll(&h).unwrap();
    assert_eq!(path, "/v3/kv/txn");
    // Unknown ids are ignored.
    assert_eq!(reply(&h, MS, 12345, 200, b"{}"), LH_OK);
    // SAFETY: a live handle, empty message.
    unsafe { assert_eq!(lh_http_failed(h.0, MS, 12345, null(), 0), LH_OK) };
}

#[test]
fn handles_without_the_etcd_backend_refuse_the_http_calls() {
    let (cfg, seed) = (config(), [4u8; 32]);
    let mut c = null_mut();
    // SAFETY: pointers to locals.
    assert_eq!(
        unsafe { lh_client_new(&cfg, seed.as_ptr(), seed.len(), &mut c) },
        LH_OK
    );
    let h = H(c);
    let mut r = MaybeUninit::<lh_http_request>::uninit();
    // SAFETY: a live handle and a valid out-pointer.
    unsafe {
        assert_eq!(lh_http_poll_request(h.0, r.as_mut_ptr()), LH_ERR_NO_BACKEND);
        assert_eq!(lh_http_reply(h.0, 0, 1, 200, null(), 0), LH_ERR_NO_BACKEND);
    }
}

fn etcd_options(user: &[u8], password: &[u8]) -> lh_etcd_options {
    let mut o = MaybeUninit::<lh_etcd_options>::uninit();
    // SAFETY: valid out-pointer, filled completely.
    let mut o = unsafe {
        lh_etcd_options_default(o.as_mut_ptr());
        o.assume_init()
    };
    (o.user, o.user_len) = (user.as_ptr(), user.len());
    (o.password, o.password_len) = (password.as_ptr(), password.len());
    o
}

#[test]
fn credentials_are_checked_and_the_token_is_carried_in_authorization() {
    let (cfg, seed) = (config(), [5u8; 32]);
    let mut c = null_mut();
    let long = vec![b'u'; 257];
    // SAFETY: pointers to locals.
    unsafe {
        let bad = etcd_options(b"\xff", b"pw");
        assert_eq!(
            lh_client_new_etcd(&cfg, &bad, seed.as_ptr(), seed.len(), &mut c),
            LH_ERR_INVALID_UTF8
        );
        let bad = etcd_options(&long, b"pw");
        assert_eq!(
            lh_client_new_etcd(&cfg, &bad, seed.as_ptr(), seed.len(), &mut c),
            LH_ERR_INVALID_CONFIG
        );
        assert!(c.is_null());
        let good = etcd_options(b"root", b"pw");
        assert_eq!(
            lh_client_new_etcd(&cfg, &good, seed.as_ptr(), seed.len(), &mut c),
            LH_OK
        );
    }
    let h = H(c);
    acquire(&h, "n");
    let mut r = MaybeUninit::<lh_http_request>::uninit();
    // SAFETY: valid out-pointer; strings borrowed until the next call.
    let (id, path, authz) = unsafe {
        assert_eq!(lh_http_poll_request(h.0, r.as_mut_ptr()), LH_OK);
        let r = r.assume_init();
        (
            r.id,
            CStr::from_ptr(r.path).to_str().unwrap().to_owned(),
            CStr::from_ptr(r.authorization).to_str().unwrap().to_owned(),
        )
    };
    assert_eq!(
        (path.as_str(), authz.as_str()),
        ("/v3/auth/authenticate", "")
    );
    assert_eq!(
        reply(
            &h,
            MS,
            id,
            200,
            br#"{"header":{"revision":"1"},"token":"tok.1"}"#
        ),
        LH_OK
    );
    // SAFETY: as above.
    let (path, authz) = unsafe {
        assert_eq!(lh_http_poll_request(h.0, r.as_mut_ptr()), LH_OK);
        let r = r.assume_init();
        (
            CStr::from_ptr(r.path).to_str().unwrap().to_owned(),
            CStr::from_ptr(r.authorization).to_str().unwrap().to_owned(),
        )
    };
    assert_eq!(
        (path.as_str(), authz.as_str()),
        ("/v3/lease/grant", "tok.1")
    );
}

#[test]
fn lh_etcd_close_revokes_the_pooled_lease_and_ends_a_held_lock_lost() {
    let h = etcd_client();
    acquire(&h, "n");
    let (id, _, _, path, _) = poll(&h).unwrap();
    assert_eq!(path, "/v3/lease/grant");
    let grant = br#"{"header":{"revision":"1"},"ID":"41","TTL":"3"}"#;
    assert_eq!(reply(&h, MS, id, 200, grant), LH_OK);
    let (id, _, _, _, body) = poll(&h).unwrap();
    let key = body["success"][0]["request_put"]["key"].clone();
    let kv = json!({"key": key, "create_revision": "7", "lease": "41"});
    let txn = json!({"header": {"revision": "7"}, "succeeded": true, "responses": [
        {"response_put": {"header": {"revision": "7"}}},
        {"response_range": {"kvs": [kv]}}, {"response_range": {"kvs": [kv]}}]});
    assert_eq!(
        reply(&h, 2 * MS, id, 200, &serde_json::to_vec(&txn).unwrap()),
        LH_OK
    );
    assert_eq!(outputs(&h), vec![(LH_OUTPUT_ACQUIRED, 7)]);
    // SAFETY: a live handle, then NULL.
    unsafe {
        assert_eq!(lh_etcd_close(h.0, 3 * MS), LH_OK);
        assert_eq!(lh_etcd_close(null_mut(), 3 * MS), LH_ERR_NULL_ARGUMENT);
    }
    let (_, kind, _, path, body) = poll(&h).unwrap();
    assert_eq!((kind, path.as_str()), (LH_HTTP_UNARY, "/v3/lease/revoke"));
    assert_eq!(body, json!({"ID": "41"}));
    assert!(poll(&h).is_none());
    assert_eq!(
        outputs(&h).iter().map(|o| o.0).collect::<Vec<_>>(),
        vec![LH_OUTPUT_LOST]
    );
    // A handle of another backend refuses it.
    let (cfg, seed) = (config(), [5u8; 32]);
    let mut c = null_mut();
    // SAFETY: pointers to locals.
    assert_eq!(
        unsafe { lh_client_new(&cfg, seed.as_ptr(), seed.len(), &mut c) },
        LH_OK
    );
    let other = H(c);
    // SAFETY: a live handle.
    assert_eq!(unsafe { lh_etcd_close(other.0, 0) }, LH_ERR_NO_BACKEND);
}
