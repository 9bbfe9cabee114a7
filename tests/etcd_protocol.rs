//! One test per behaviour of the etcd protocol (design §6): feed gateway replies as a host
//! would, assert the requests (path, JSON body) and what the engine makes of them.
//! `tests/etcd_server.rs` runs the same requests against a real 3-member cluster.

use base64::Engine as _;
use leasehold::backend::etcd::{EtcdProtocol, RequestKind, paths, queue_prefix};
use leasehold::{AcquireFailReason, AcquireOptions, Client, Config, Event, LeaseId, LostReason};
use serde_json::{Value, json};

const MS: u64 = 1_000_000;

fn setup() -> (Client, EtcdProtocol) {
    (
        Client::new(Config::default(), &[9; 32]).unwrap(),
        EtcdProtocol::new(),
    )
}

/// A polled request: (id, kind, path, body as JSON).
#[derive(Debug)]
struct Req {
    id: u64,
    kind: RequestKind,
    path: &'static str,
    body: Value,
}

fn next(core: &mut Client, p: &mut EtcdProtocol) -> Option<Req> {
    let r = p.poll_request(core)?;
    Some(Req {
        id: r.id,
        kind: r.kind,
        path: r.path,
        body: if r.body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(r.body).unwrap()
        },
    })
}

fn expect(core: &mut Client, p: &mut EtcdProtocol, path: &str) -> Req {
    let r = next(core, p).expect("a request");
    assert_eq!(r.path, path, "{r:?}");
    r
}

fn events(core: &mut Client, p: &mut EtcdProtocol) -> Vec<Event> {
    std::iter::from_fn(|| p.poll_event(core)).collect()
}

fn b64(s: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn header(rev: i64) -> Value {
    json!({"cluster_id": "1", "member_id": "2", "revision": rev.to_string(), "raft_term": "3"})
}

fn grant_reply(id: i64, ttl: i64) -> Vec<u8> {
    serde_json::to_vec(&json!({"header": header(1), "ID": id.to_string(), "TTL": ttl.to_string()}))
        .unwrap()
}

fn kv(key: &[u8], rev: i64, lease: i64) -> Value {
    json!({"key": b64(key), "create_revision": rev.to_string(), "mod_revision": rev.to_string(),
           "version": "1", "lease": lease.to_string()})
}

/// A transaction reply: `succeeded`, our key (rev, lease) and the queue's first key.
fn txn_reply(succeeded: bool, own: Option<Value>, first: Option<Value>, rev: i64) -> Vec<u8> {
    let range = |kv: Option<Value>| {
        json!({"response_range": {"header": {"revision": rev.to_string()},
               "kvs": kv.map(|k| vec![k]).unwrap_or_default(), "count": "1"}})
    };
    let mut responses = Vec::new();
    if succeeded {
        responses.push(json!({"response_put": {"header": {"revision": rev.to_string()}}}));
    }
    responses.push(range(own));
    responses.push(range(first));
    let mut v = json!({"header": header(rev), "responses": responses});
    if succeeded {
        v["succeeded"] = json!(true);
    }
    serde_json::to_vec(&v).unwrap()
}

/// Acquires `name` from an empty queue: returns the lease, our key and the etcd lease id.
fn acquire_granted(
    core: &mut Client,
    p: &mut EtcdProtocol,
    name: &str,
    etcd_lease: i64,
    rev: i64,
) -> (LeaseId, Vec<u8>) {
    let lease = core.acquire(0, name, AcquireOptions::new(3_000)).unwrap();
    let g = expect(core, p, paths::LEASE_GRANT);
    assert_eq!(g.kind, RequestKind::Unary);
    assert_eq!(g.body, json!({"TTL": "3"}));
    p.handle_reply(core, MS, g.id, 200, &grant_reply(etcd_lease, 3));
    let t = expect(core, p, paths::KV_TXN);
    let key = base64::engine::general_purpose::STANDARD
        .decode(t.body["success"][0]["request_put"]["key"].as_str().unwrap())
        .unwrap();
    assert!(key.starts_with(&queue_prefix(name)));
    assert_eq!(
        t.body["success"][0]["request_put"]["lease"],
        json!(etcd_lease.to_string())
    );
    p.handle_reply(
        core,
        2 * MS,
        t.id,
        200,
        &txn_reply(
            true,
            Some(kv(&key, rev, etcd_lease)),
            Some(kv(&key, rev, etcd_lease)),
            rev,
        ),
    );
    (lease, key)
}

#[test]
fn queue_keys_keep_names_with_slashes_apart() {
    assert_eq!(queue_prefix("a"), b"lh/1:a/".to_vec());
    assert_eq!(queue_prefix("a/b"), b"lh/3:a/b/".to_vec());
    assert!(!queue_prefix("a/b").starts_with(&queue_prefix("a")));
}

#[test]
fn acquire_grants_a_lease_then_puts_the_key_in_one_txn_and_fences_with_its_create_revision() {
    let (mut core, mut p) = setup();
    let (lease, key) = acquire_granted(&mut core, &mut p, "orders", 7_000_000_000_001, 42);
    let ev = events(&mut core, &mut p);
    assert!(
        matches!(ev[..], [Event::Acquired { lease: l, fencing_token: 42, .. }] if l == lease),
        "{ev:?}"
    );
    assert_eq!(key.len(), queue_prefix("orders").len() + 32);
    assert!(next(&mut core, &mut p).is_none());
}

#[test]
fn the_txn_compares_create_revision_zero_and_reads_our_key_and_the_first() {
    let (mut core, mut p) = setup();
    core.acquire(0, "n", AcquireOptions::new(2_500)).unwrap();
    let g = expect(&mut core, &mut p, paths::LEASE_GRANT);
    // TTLs round up to whole seconds: the server never keeps the key shorter than we believe.
    assert_eq!(g.body, json!({"TTL": "3"}));
    p.handle_reply(&mut core, MS, g.id, 200, &grant_reply(5, 3));
    let t = expect(&mut core, &mut p, paths::KV_TXN);
    let cmp = &t.body["compare"][0];
    assert_eq!(cmp["target"], "CREATE");
    assert_eq!(cmp["create_revision"], "0");
    assert_eq!(t.body["success"].as_array().unwrap().len(), 3);
    assert_eq!(t.body["failure"].as_array().unwrap().len(), 2);
    let first = &t.body["failure"][1]["request_range"];
    assert_eq!(first["sort_target"], "CREATE");
    assert_eq!(first["sort_order"], "ASCEND");
    assert_eq!(first["limit"], "1");
}

#[test]
fn a_retried_acquire_finds_its_own_key_and_gets_the_same_fence() {
    let (mut core, mut p) = setup();
    let lease = core
        .acquire(0, "n", AcquireOptions::new(3_000).wait_ns(60_000 * MS))
        .unwrap();
    let g = expect(&mut core, &mut p, paths::LEASE_GRANT);
    p.handle_reply(&mut core, MS, g.id, 200, &grant_reply(5, 3));
    let t = expect(&mut core, &mut p, paths::KV_TXN);
    // The answer is lost: the engine retries with the same token and the same etcd lease.
    p.handle_failed(&mut core, 2 * MS, t.id, "connection reset");
    let deadline = p.poll_timeout(&mut core).unwrap();
    p.handle_timeout(&mut core, deadline);
    let t2 = expect(&mut core, &mut p, paths::KV_TXN);
    assert_eq!(t2.body["success"][0], t.body["success"][0]);
    // The retry goes out soon after the grant: the grant's date covers it, no keep-alive.
    assert!(next(&mut core, &mut p).is_none());
    let key = put_key(&t2.body);
    p.handle_reply(
        &mut core,
        deadline + MS,
        t2.id,
        200,
        &txn_reply(false, Some(kv(&key, 17, 5)), Some(kv(&key, 17, 5)), 20),
    );
    let ev = events(&mut core, &mut p);
    assert!(
        matches!(ev[..], [Event::Acquired { lease: l, fencing_token: 17, .. }] if l == lease),
        "{ev:?}"
    );
    assert_eq!(p.counters().leases_granted, 1);
}

#[test]
fn renew_is_a_keepalive_and_a_missing_ttl_means_the_lease_is_lost() {
    let (mut core, mut p) = setup();
    let (lease, _) = acquire_granted(&mut core, &mut p, "n", 77, 10);
    events(&mut core, &mut p);
    let due = p.poll_timeout(&mut core).unwrap();
    p.handle_timeout(&mut core, due);
    let k = expect(&mut core, &mut p, paths::LEASE_KEEPALIVE);
    assert_eq!(k.body, json!({"ID": "77"}));
    let ok = br#"{"result":{"header":{"revision":"11"},"ID":"77","TTL":"3"}}"#;
    p.handle_reply(&mut core, due + MS, k.id, 200, ok);
    assert!(core.is_held(lease, due + MS).unwrap());
    let due = p.poll_timeout(&mut core).unwrap();
    p.handle_timeout(&mut core, due);
    let k = expect(&mut core, &mut p, paths::LEASE_KEEPALIVE);
    // etcd answers a keep-alive of an unknown lease with no TTL.
    let gone = br#"{"result":{"header":{"revision":"12"},"ID":"77"}}"#;
    p.handle_reply(&mut core, due + MS, k.id, 200, gone);
    let ev = events(&mut core, &mut p);
    assert!(
        ev.contains(&Event::Lost {
            lease,
            reason: LostReason::Rejected
        }),
        "{ev:?}"
    );
    // The service said the lease is gone: nothing is left to revoke.
    assert!(next(&mut core, &mut p).is_none());
}

#[test]
fn release_deletes_the_key_and_nothing_deleted_is_not_owner() {
    let (mut core, mut p) = setup();
    let (lease, key) = acquire_granted(&mut core, &mut p, "n", 88, 10);
    events(&mut core, &mut p);
    core.release_reported(3 * MS, lease).unwrap();
    let r = expect(&mut core, &mut p, paths::KV_DELETE);
    assert_eq!(r.body, json!({"key": b64(&key)}));
    // The key was gone (its lease expired): not ours any more.
    p.handle_reply(&mut core, 4 * MS, r.id, 200, &delete_reply(0));
    let ev = events(&mut core, &mut p);
    assert!(
        ev.contains(&Event::ReleaseOutcome {
            lease,
            outcome: leasehold::ReleaseOutcome::NotOwner
        }),
        "{ev:?}"
    );
}

/// The watched `key` is deleted (watch `watch`): the woken lease's predecessor lookup.
fn woken_lookup(core: &mut Client, p: &mut EtcdProtocol, watch: u64, key: &[u8]) -> Req {
    let del = json!({"result": {"header": header(40), "events": [{"type": "DELETE", "kv": {"key": b64(key), "mod_revision": "40"}}]}});
    p.handle_watch_message(core, 4 * MS, watch, &serde_json::to_vec(&del).unwrap());
    loop {
        let r = next(core, p).expect("the woken lease asks again");
        if r.path == paths::KV_RANGE {
            return r;
        }
    }
}

/// A lease of `n` that joined the queue behind `holder` (its key at revision 30, on etcd
/// lease 9): the lease and its key.
fn joined_behind(
    core: &mut Client,
    p: &mut EtcdProtocol,
    holder: &[u8],
) -> (leasehold::LeaseId, Vec<u8>) {
    let lease = core
        .acquire(0, "n", AcquireOptions::new(3_000).wait_ns(60_000 * MS))
        .unwrap();
    let g = expect(core, p, paths::LEASE_GRANT);
    p.handle_reply(core, MS, g.id, 200, &grant_reply(9, 3));
    let t = expect(core, p, paths::KV_TXN);
    let mine = put_key(&t.body);
    p.handle_reply(
        core,
        2 * MS,
        t.id,
        200,
        &txn_reply(true, Some(kv(&mine, 30, 9)), Some(kv(holder, 10, 1)), 30),
    );
    (lease, mine)
}

#[test]
fn a_waiter_watches_only_its_predecessor_and_its_deletion_wakes_it() {
    let (mut core, mut p) = setup();
    let holder = [queue_prefix("n"), b"a".repeat(32)].concat();
    let before = [queue_prefix("n"), b"b".repeat(32)].concat();
    let (lease, mine) = joined_behind(&mut core, &mut p, &holder);
    assert!(events(&mut core, &mut p).is_empty());
    // The predecessor: the youngest key older than ours.
    let r = expect(&mut core, &mut p, paths::KV_RANGE);
    assert_eq!(r.body["max_create_revision"], "29");
    assert_eq!(r.body["sort_order"], "DESCEND");
    let range = json!({"header": header(31), "kvs": [kv(&before, 20, 2)], "count": "1"});
    p.handle_reply(
        &mut core,
        3 * MS,
        r.id,
        200,
        &serde_json::to_vec(&range).unwrap(),
    );
    let w = expect(&mut core, &mut p, paths::WATCH);
    assert_eq!(w.kind, RequestKind::Watch);
    assert_eq!(w.body["create_request"]["key"], b64(&before));
    assert_eq!(w.body["create_request"]["start_revision"], "32");
    assert_eq!(p.open_watches(), 1);
    // A PUT of the holder's key or the watch's creation wakes nobody.
    p.handle_watch_message(
        &mut core,
        4 * MS,
        w.id,
        br#"{"result":{"header":{"revision":"31"},"created":true}}"#,
    );
    assert!(next(&mut core, &mut p).is_none());
    // The predecessor is deleted: one wake, the watch closes, the engine asks again.
    let del = json!({"result": {"header": header(40), "events": [{"type": "DELETE", "kv": {"key": b64(&before), "mod_revision": "40"}}]}});
    p.handle_watch_message(&mut core, 5 * MS, w.id, &serde_json::to_vec(&del).unwrap());
    assert_eq!(p.counters().wakeups, 1);
    let c = next(&mut core, &mut p).unwrap();
    assert_eq!((c.kind, c.id), (RequestKind::CancelWatch, w.id));
    // Woken, our key known: no transaction, a serializable read for any key before ours.
    let r = expect(&mut core, &mut p, paths::KV_RANGE);
    assert_eq!(r.body["max_create_revision"], "29");
    assert_eq!(r.body["serializable"], true);
    // A member that has not applied our key's revision proves nothing: asked again.
    let behind = json!({"header": header(29), "count": "0"});
    p.handle_reply(
        &mut core,
        6 * MS,
        r.id,
        200,
        &serde_json::to_vec(&behind).unwrap(),
    );
    assert!(events(&mut core, &mut p).is_empty());
    let mut retry = None;
    for _ in 0..10 {
        if let Some(r) = next(&mut core, &mut p) {
            retry = Some(r);
            break;
        }
        let t = p.poll_timeout(&mut core).unwrap();
        p.handle_timeout(&mut core, t);
    }
    // Then with the transaction, which reads our key again.
    let t = retry.expect("a retry");
    assert_eq!(t.path, paths::KV_TXN);
    p.handle_reply(
        &mut core,
        7 * MS,
        t.id,
        200,
        &txn_reply(false, Some(kv(&mine, 30, 9)), Some(kv(&mine, 30, 9)), 41),
    );
    let ev = events(&mut core, &mut p);
    assert!(
        matches!(ev[..], [Event::Acquired { lease: l, fencing_token: 30, .. }] if l == lease),
        "{ev:?}"
    );
    assert_eq!(p.open_watches(), 0);
}

/// Two leases of one client wait for one name and their acquire answers arrive in the
/// opposite order to their queue places: the watch of the lease whose predecessor went
/// wakes that lease, not the first local waiter of the name.
#[test]
fn a_predecessor_deletion_wakes_the_lease_that_watched_it() {
    let (mut core, mut p) = setup();
    let wait = AcquireOptions::new(3_000).wait_ns(60_000 * MS);
    let first = core.acquire(0, "n", wait).unwrap();
    let second = core.acquire(0, "n", wait).unwrap();
    // One pooled etcd lease for both.
    let g = expect(&mut core, &mut p, paths::LEASE_GRANT);
    p.handle_reply(&mut core, MS, g.id, 200, &grant_reply(9, 3));
    let t1 = expect(&mut core, &mut p, paths::KV_TXN);
    let t2 = expect(&mut core, &mut p, paths::KV_TXN);
    assert_eq!(t1.body["success"][0]["request_put"]["lease"], "9");
    assert_eq!(t2.body["success"][0]["request_put"]["lease"], "9");
    let (k1, k2) = (put_key(&t1.body), put_key(&t2.body));
    let holder = [queue_prefix("n"), b"a".repeat(32)].concat();
    // The later place's answer is handled first.
    p.handle_reply(
        &mut core,
        2 * MS,
        t2.id,
        200,
        &txn_reply(true, Some(kv(&k2, 31, 9)), Some(kv(&holder, 10, 1)), 31),
    );
    p.handle_reply(
        &mut core,
        2 * MS,
        t1.id,
        200,
        &txn_reply(true, Some(kv(&k1, 30, 9)), Some(kv(&holder, 10, 1)), 31),
    );
    // Each looks up its predecessor: the holder for the first, the first's key for the second.
    let mut watches = Vec::new();
    for _ in 0..2 {
        let r = expect(&mut core, &mut p, paths::KV_RANGE);
        let pred = if r.body["max_create_revision"] == "29" {
            kv(&holder, 10, 1)
        } else {
            kv(&k1, 30, 9)
        };
        let range = json!({"header": header(32), "kvs": [pred], "count": "1"});
        p.handle_reply(
            &mut core,
            3 * MS,
            r.id,
            200,
            &serde_json::to_vec(&range).unwrap(),
        );
    }
    for _ in 0..2 {
        let w = expect(&mut core, &mut p, paths::WATCH);
        watches.push((w.id, w.body["create_request"]["key"].clone()));
    }
    let (holder_watch, _) = watches
        .iter()
        .find(|(_, k)| *k == json!(b64(&holder)))
        .expect("a watch on the holder's key");
    // The holder's key is deleted: the first lease asks again at once.
    let del = json!({"result": {"header": header(40), "events": [{"type": "DELETE", "kv": {"key": b64(&holder), "mod_revision": "40"}}]}});
    p.handle_watch_message(
        &mut core,
        5 * MS,
        *holder_watch,
        &serde_json::to_vec(&del).unwrap(),
    );
    let mut check = None;
    while let Some(r) = next(&mut core, &mut p) {
        if r.path == paths::KV_RANGE {
            check = Some(r);
            break;
        }
    }
    let r = check.expect("the woken lease asks again");
    assert_eq!(
        r.body["max_create_revision"], "29",
        "the lease whose predecessor went must ask"
    );
    let none = json!({"header": header(41), "count": "0"});
    p.handle_reply(
        &mut core,
        6 * MS,
        r.id,
        200,
        &serde_json::to_vec(&none).unwrap(),
    );
    // Nobody before it: the transaction, which reads its own key, decides.
    let t = expect(&mut core, &mut p, paths::KV_TXN);
    assert_eq!(put_key(&t.body), k1);
    p.handle_reply(
        &mut core,
        7 * MS,
        t.id,
        200,
        &txn_reply(false, Some(kv(&k1, 30, 9)), Some(kv(&k1, 30, 9)), 42),
    );
    let ev = events(&mut core, &mut p);
    assert!(
        matches!(ev[..], [Event::Acquired { lease: l, fencing_token: 30, .. }] if l == first),
        "{ev:?}"
    );
    let _ = second;
}

/// A woken waiter whose lookup finds nobody before it is not granted on that read alone: its
/// own key may be gone (its etcd lease expired while a stale member answered the lookup). The
/// transaction that follows re-creates the key behind the current holder, and it waits.
#[test]
fn a_woken_waiter_whose_own_key_is_gone_is_not_granted() {
    let (mut core, mut p) = setup();
    let holder = [queue_prefix("n"), b"a".repeat(32)].concat();
    let other = [queue_prefix("n"), b"c".repeat(32)].concat();
    let (lease, mine) = joined_behind(&mut core, &mut p, &holder);
    let r = expect(&mut core, &mut p, paths::KV_RANGE);
    let range = json!({"header": header(31), "kvs": [kv(&holder, 10, 1)], "count": "1"});
    p.handle_reply(
        &mut core,
        3 * MS,
        r.id,
        200,
        &serde_json::to_vec(&range).unwrap(),
    );
    let w = expect(&mut core, &mut p, paths::WATCH);
    let r = woken_lookup(&mut core, &mut p, w.id, &holder);
    // A stale member: nobody before us (and it cannot say our key is gone).
    let none = json!({"header": header(41), "count": "0"});
    p.handle_reply(
        &mut core,
        5 * MS,
        r.id,
        200,
        &serde_json::to_vec(&none).unwrap(),
    );
    assert!(
        events(&mut core, &mut p).is_empty(),
        "no grant on the lookup alone"
    );
    // The transaction finds our key gone (it puts it again, at revision 50) and another
    // lease's key first: not ours.
    let t = expect(&mut core, &mut p, paths::KV_TXN);
    p.handle_reply(
        &mut core,
        6 * MS,
        t.id,
        200,
        &txn_reply(true, Some(kv(&mine, 50, 9)), Some(kv(&other, 45, 4)), 50),
    );
    let ev = events(&mut core, &mut p);
    assert!(
        !ev.iter().any(|e| matches!(e, Event::Acquired { .. })),
        "{ev:?}"
    );
    assert!(
        core.lease_state(lease).unwrap() == leasehold::LeaseState::Acquiring,
        "it waits behind the current holder"
    );
}

/// A keep-alive answer: alive with `ttl` seconds, or (0) gone.
fn keepalive_reply(id: i64, ttl: i64) -> Vec<u8> {
    let mut r = json!({"header": header(50), "ID": id.to_string()});
    if ttl > 0 {
        r["TTL"] = json!(ttl.to_string());
    }
    serde_json::to_vec(&json!({ "result": r })).unwrap()
}

fn delete_reply(deleted: i64) -> Vec<u8> {
    serde_json::to_vec(&json!({"header": header(60), "deleted": deleted.to_string()})).unwrap()
}

fn put_key(txn: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(txn["success"][0]["request_put"]["key"].as_str().unwrap())
        .unwrap()
}

#[test]
fn a_waiting_lease_is_kept_alive_and_rejoins_when_its_lease_is_gone() {
    let (mut core, mut p) = setup();
    core.acquire(0, "n", AcquireOptions::new(3_000).wait_ns(60_000 * MS))
        .unwrap();
    let g = expect(&mut core, &mut p, paths::LEASE_GRANT);
    p.handle_reply(&mut core, MS, g.id, 200, &grant_reply(9, 3));
    let t = expect(&mut core, &mut p, paths::KV_TXN);
    let mine = put_key(&t.body);
    let holder = [queue_prefix("n"), b"a".repeat(32)].concat();
    p.handle_reply(
        &mut core,
        2 * MS,
        t.id,
        200,
        &txn_reply(true, Some(kv(&mine, 30, 9)), Some(kv(&holder, 10, 1)), 30),
    );
    let r = expect(&mut core, &mut p, paths::KV_RANGE);
    let range = json!({"header": header(31), "kvs": [kv(&holder, 10, 1)]});
    p.handle_reply(
        &mut core,
        3 * MS,
        r.id,
        200,
        &serde_json::to_vec(&range).unwrap(),
    );
    let w = expect(&mut core, &mut p, paths::WATCH);
    // A third of the TTL later the waiter's own lease is kept alive by the protocol.
    p.handle_timeout(&mut core, 1_003 * MS);
    let k = expect(&mut core, &mut p, paths::LEASE_KEEPALIVE);
    assert_eq!(k.body, json!({"ID": "9"}));
    assert_eq!(p.counters().waiting_keepalives, 1);
    p.handle_reply(
        &mut core,
        1_004 * MS,
        k.id,
        200,
        br#"{"result":{"header":{"revision":"31"},"ID":"9"}}"#,
    );
    // Gone: the watch closes and the next attempt grants a fresh lease.
    let c = next(&mut core, &mut p).unwrap();
    assert_eq!((c.kind, c.id), (RequestKind::CancelWatch, w.id));
    assert_eq!(p.counters().waiters_expired, 1);
    let mut saw_grant = false;
    for _ in 0..10 {
        match next(&mut core, &mut p) {
            Some(r) if r.path == paths::LEASE_GRANT => {
                saw_grant = true;
                break;
            }
            Some(_) => {}
            None => {
                let t = p.poll_timeout(&mut core).unwrap();
                p.handle_timeout(&mut core, t);
            }
        }
    }
    assert!(saw_grant);
}

#[test]
fn a_waiter_that_gives_up_deletes_its_key() {
    let (mut core, mut p) = setup();
    let lease = core
        .acquire(0, "n", AcquireOptions::new(3_000).wait_ns(50 * MS))
        .unwrap();
    let g = expect(&mut core, &mut p, paths::LEASE_GRANT);
    p.handle_reply(&mut core, MS, g.id, 200, &grant_reply(9, 3));
    let t = expect(&mut core, &mut p, paths::KV_TXN);
    let mine = put_key(&t.body);
    let holder = [queue_prefix("n"), b"a".repeat(32)].concat();
    p.handle_reply(
        &mut core,
        60 * MS,
        t.id,
        200,
        &txn_reply(true, Some(kv(&mine, 30, 9)), Some(kv(&holder, 10, 1)), 30),
    );
    let ev = events(&mut core, &mut p);
    assert!(
        ev.contains(&Event::AcquireFailed {
            lease,
            reason: AcquireFailReason::WaitExhausted
        }),
        "{ev:?}"
    );
    // The pooled lease stays; only our queue key goes.
    let r = expect(&mut core, &mut p, paths::KV_DELETE);
    assert_eq!(r.body, json!({"key": b64(&mine)}));
    p.handle_reply(&mut core, 61 * MS, r.id, 200, &delete_reply(1));
    assert!(next(&mut core, &mut p).is_none());
}

#[test]
fn garbage_error_bodies_and_http_errors_are_transport_errors_never_grants() {
    let bodies: [(u16, &[u8]); 8] = [
        (200, b"not json"),
        (200, b"[1,2]"),
        (200, br#"{"header":{"revision":"x"}}"#),
        (200, br#"{"header":{"revision":"5"},"succeeded":"yes"}"#),
        (200, br#"{"header":{"revision":"5"},"responses":[{"response_range":{"kvs":[{"key":"!!"}]}},{"response_range":{}}]}"#),
        (503, b"<html>busy</html>"),
        (500, br#"{"error":"etcdserver: request timed out","code":14}"#),
        (200, br#"{"error":"etcdserver: no leader","code":14}"#),
    ];
    for (status, body) in bodies {
        let (mut core, mut p) = setup();
        let lease = core
            .acquire(0, "n", AcquireOptions::new(3_000).wait_ns(0))
            .unwrap();
        let g = expect(&mut core, &mut p, paths::LEASE_GRANT);
        p.handle_reply(&mut core, MS, g.id, 200, &grant_reply(9, 3));
        let t = expect(&mut core, &mut p, paths::KV_TXN);
        p.handle_reply(&mut core, 2 * MS, t.id, status, body);
        let ev = events(&mut core, &mut p);
        assert!(
            ev.iter().all(|e| !matches!(e, Event::Acquired { .. })),
            "{status} {:?}: {ev:?}",
            String::from_utf8_lossy(body)
        );
        assert!(
            ev.contains(&Event::AcquireFailed {
                lease,
                reason: AcquireFailReason::Unavailable
            }),
            "{ev:?}"
        );
        assert!(!p.last_error().is_empty());
    }
    // A body over the bound is refused unread.
    let (mut core, mut p) = setup();
    core.acquire(0, "n", AcquireOptions::new(3_000)).unwrap();
    let g = expect(&mut core, &mut p, paths::LEASE_GRANT);
    let huge = vec![b' '; leasehold::backend::etcd::MAX_BODY + 1];
    p.handle_reply(&mut core, MS, g.id, 200, &huge);
    assert!(p.last_error().contains("larger"), "{}", p.last_error());
}

#[test]
fn a_txn_that_does_not_return_our_key_is_not_a_grant() {
    let (mut core, mut p) = setup();
    core.acquire(0, "n", AcquireOptions::new(3_000).wait_ns(0))
        .unwrap();
    let g = expect(&mut core, &mut p, paths::LEASE_GRANT);
    p.handle_reply(&mut core, MS, g.id, 200, &grant_reply(9, 3));
    let t = expect(&mut core, &mut p, paths::KV_TXN);
    let other = [queue_prefix("n"), b"c".repeat(32)].concat();
    p.handle_reply(
        &mut core,
        2 * MS,
        t.id,
        200,
        &txn_reply(false, Some(kv(&other, 5, 9)), Some(kv(&other, 5, 9)), 6),
    );
    let ev = events(&mut core, &mut p);
    assert!(
        ev.iter().all(|e| !matches!(e, Event::Acquired { .. })),
        "{ev:?}"
    );
    assert_eq!(p.counters().garbage_replies, 1);
    // Our key without the queue's first is no answer either.
    let (mut core, mut p) = setup();
    core.acquire(0, "n", AcquireOptions::new(3_000).wait_ns(0))
        .unwrap();
    let g = expect(&mut core, &mut p, paths::LEASE_GRANT);
    p.handle_reply(&mut core, MS, g.id, 200, &grant_reply(9, 3));
    let t = expect(&mut core, &mut p, paths::KV_TXN);
    let mine = put_key(&t.body);
    p.handle_reply(
        &mut core,
        2 * MS,
        t.id,
        200,
        &txn_reply(true, Some(kv(&mine, 5, 9)), None, 5),
    );
    let ev = events(&mut core, &mut p);
    assert!(
        ev.iter().all(|e| !matches!(e, Event::Acquired { .. })),
        "{ev:?}"
    );
    assert_eq!(p.counters().garbage_replies, 1);
}

#[test]
fn late_duplicate_and_unknown_replies_are_counted_and_ignored() {
    let (mut core, mut p) = setup();
    let (lease, _) = acquire_granted(&mut core, &mut p, "n", 5, 10);
    events(&mut core, &mut p);
    let before = p.counters().stale_replies;
    p.handle_reply(&mut core, 3 * MS, 1, 200, &grant_reply(6, 3));
    p.handle_reply(&mut core, 3 * MS, 999, 200, b"{}");
    p.handle_failed(&mut core, 3 * MS, 999, "x");
    p.handle_watch_message(&mut core, 3 * MS, 2, b"{}");
    assert_eq!(p.counters().stale_replies, before + 4);
    assert!(core.is_held(lease, 3 * MS).unwrap());
    assert!(next(&mut core, &mut p).is_none());
}

#[test]
fn a_grant_that_arrives_after_the_acquire_was_cancelled_is_pooled_for_the_next() {
    let (mut core, mut p) = setup();
    let lease = core.acquire(0, "n", AcquireOptions::new(3_000)).unwrap();
    let g = expect(&mut core, &mut p, paths::LEASE_GRANT);
    core.release(MS, lease).unwrap();
    p.handle_reply(&mut core, 2 * MS, g.id, 200, &grant_reply(31, 3));
    // No key was put on it: nothing to revoke, and the next acquire needs no grant.
    assert!(next(&mut core, &mut p).is_none());
    core.acquire(3 * MS, "m", AcquireOptions::new(3_000))
        .unwrap();
    let t = expect(&mut core, &mut p, paths::KV_TXN);
    assert_eq!(t.body["success"][0]["request_put"]["lease"], "31");
    assert_eq!(p.counters().leases_granted, 1);
}

#[test]
fn a_watch_cut_by_compaction_or_a_stream_error_makes_the_waiter_look_again() {
    for msg in [
        br#"{"result":{"header":{"revision":"50"},"canceled":true,"compact_revision":"45"}}"#
            .to_vec(),
        br#"{"error":{"grpc_code":14,"http_code":503,"message":"no leader"}}"#.to_vec(),
        b"garbage".to_vec(),
    ] {
        let (mut core, mut p) = setup();
        core.acquire(0, "n", AcquireOptions::new(3_000).wait_ns(60_000 * MS))
            .unwrap();
        let g = expect(&mut core, &mut p, paths::LEASE_GRANT);
        p.handle_reply(&mut core, MS, g.id, 200, &grant_reply(9, 3));
        let t = expect(&mut core, &mut p, paths::KV_TXN);
        let mine = put_key(&t.body);
        let holder = [queue_prefix("n"), b"a".repeat(32)].concat();
        p.handle_reply(
            &mut core,
            2 * MS,
            t.id,
            200,
            &txn_reply(true, Some(kv(&mine, 30, 9)), Some(kv(&holder, 10, 1)), 30),
        );
        let r = expect(&mut core, &mut p, paths::KV_RANGE);
        let range = json!({"header": header(31), "kvs": [kv(&holder, 10, 1)]});
        p.handle_reply(
            &mut core,
            3 * MS,
            r.id,
            200,
            &serde_json::to_vec(&range).unwrap(),
        );
        let w = expect(&mut core, &mut p, paths::WATCH);
        p.handle_watch_message(&mut core, 4 * MS, w.id, &msg);
        assert_eq!(p.open_watches(), 0, "{}", String::from_utf8_lossy(&msg));
        let c = next(&mut core, &mut p).unwrap();
        assert_eq!(c.kind, RequestKind::CancelWatch);
        // The next attempt (at once or after the re-check delay) reads the queue again.
        let mut saw_txn = false;
        for _ in 0..10 {
            if let Some(r) = next(&mut core, &mut p) {
                saw_txn = r.path == paths::KV_TXN
                    || (r.path == paths::KV_RANGE && r.body["max_create_revision"] == "29");
                break;
            }
            let t = p.poll_timeout(&mut core).unwrap();
            p.handle_timeout(&mut core, t);
        }
        assert!(saw_txn);
    }
}

#[test]
fn with_auth_the_first_request_authenticates_and_every_later_one_carries_the_token() {
    assert!(EtcdProtocol::with_auth("", "pw").is_err());
    assert!(EtcdProtocol::with_auth(&"u".repeat(257), "pw").is_err());
    let mut core = Client::new(Config::default(), &[9; 32]).unwrap();
    let mut p = EtcdProtocol::with_auth("root", "secret").unwrap();
    core.acquire(0, "n", AcquireOptions::new(3_000).wait_ns(60_000 * MS))
        .unwrap();
    let r = p.poll_request(&mut core).unwrap();
    let (auth_id, path, authz) = (r.id, r.path, r.authorization.to_owned());
    assert_eq!((path, authz.as_str()), (paths::AUTHENTICATE, ""));
    assert_eq!(
        serde_json::from_slice::<Value>(r.body).unwrap(),
        json!({"name": "root", "password": "secret"})
    );
    // Nothing else goes out before the token.
    assert!(p.poll_request(&mut core).is_none());
    let token = br#"{"header":{"revision":"1"},"token":"abc.123"}"#;
    p.handle_reply(&mut core, MS, auth_id, 200, token);
    assert!(p.is_authenticated());
    let r = p.poll_request(&mut core).unwrap();
    assert_eq!((r.path, r.authorization), (paths::LEASE_GRANT, "abc.123"));
    let grant_id = r.id;
    // The token expired: the request fails, and the next one authenticates again.
    p.handle_reply(
        &mut core,
        2 * MS,
        grant_id,
        401,
        br#"{"error":"etcdserver: invalid auth token","code":16}"#,
    );
    assert!(!p.is_authenticated());
    let mut saw_auth = false;
    for _ in 0..10 {
        match p.poll_request(&mut core) {
            Some(r) => {
                saw_auth = r.path == paths::AUTHENTICATE;
                break;
            }
            None => {
                let t = p.poll_timeout(&mut core).unwrap();
                p.handle_timeout(&mut core, t);
            }
        }
    }
    assert!(saw_auth);
}

#[test]
fn a_refused_authentication_is_retried_after_a_pause_and_grants_nothing() {
    let mut core = Client::new(Config::default(), &[9; 32]).unwrap();
    let mut p = EtcdProtocol::with_auth("root", "wrong").unwrap();
    let lease = core
        .acquire(0, "n", AcquireOptions::new(3_000).wait_ns(100 * MS))
        .unwrap();
    let r = p.poll_request(&mut core).unwrap();
    let id = r.id;
    p.handle_reply(
        &mut core,
        MS,
        id,
        400,
        br#"{"error":"etcdserver: authentication failed, invalid user ID or password","code":3}"#,
    );
    // Not at once: after a pause.
    assert!(p.poll_request(&mut core).is_none());
    assert!(p.last_error().contains("authentication failed"));
    let mut now = MS;
    let mut ev = Vec::new();
    while now < 3_000 * MS {
        now = p.poll_timeout(&mut core).unwrap().max(now + MS);
        p.handle_timeout(&mut core, now);
        while let Some(r) = p.poll_request(&mut core) {
            assert_eq!(r.path, paths::AUTHENTICATE);
        }
        ev.extend(events(&mut core, &mut p));
    }
    assert!(
        ev.contains(&Event::AcquireFailed {
            lease,
            reason: AcquireFailReason::Unavailable
        }) || ev.contains(&Event::AcquireFailed {
            lease,
            reason: AcquireFailReason::WaitExhausted
        }),
        "{ev:?}"
    );
}

mod hostile {
    use super::*;
    use proptest::prelude::*;

    /// A waiter with a watch open, and the ids of its pending txn-less state.
    fn waiting() -> (Client, EtcdProtocol, u64) {
        let (mut core, mut p) = setup();
        core.acquire(0, "n", AcquireOptions::new(3_000).wait_ns(60_000 * MS))
            .unwrap();
        let g = expect(&mut core, &mut p, paths::LEASE_GRANT);
        p.handle_reply(&mut core, MS, g.id, 200, &grant_reply(9, 3));
        let t = expect(&mut core, &mut p, paths::KV_TXN);
        let mine = put_key(&t.body);
        let holder = [queue_prefix("n"), b"a".repeat(32)].concat();
        p.handle_reply(
            &mut core,
            2 * MS,
            t.id,
            200,
            &txn_reply(true, Some(kv(&mine, 30, 9)), Some(kv(&holder, 10, 1)), 30),
        );
        let r = expect(&mut core, &mut p, paths::KV_RANGE);
        let range = json!({"header": header(31), "kvs": [kv(&holder, 10, 1)]});
        p.handle_reply(
            &mut core,
            3 * MS,
            r.id,
            200,
            &serde_json::to_vec(&range).unwrap(),
        );
        let w = expect(&mut core, &mut p, paths::WATCH);
        (core, p, w.id)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary bytes as any reply or watch message: no panic, never a grant.
        #[test]
        fn arbitrary_replies_never_grant(
            status in prop_oneof![Just(200u16), 100u16..600],
            bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 1..6),
        ) {
            let (mut core, mut p, watch) = waiting();
            let mut now = 4 * MS;
            for body in &bodies {
                now += MS;
                p.handle_watch_message(&mut core, now, watch, body);
                while let Some(r) = next(&mut core, &mut p) {
                    p.handle_reply(&mut core, now, r.id, status, body);
                }
                p.handle_timeout(&mut core, now);
            }
            let ev = events(&mut core, &mut p);
            prop_assert!(ev.iter().all(|e| !matches!(e, Event::Acquired { .. })), "{:?}", ev);
        }

        /// JSON of the right outline with values of the wrong types: no panic, never a grant.
        #[test]
        fn wrong_types_never_grant(pick in 0usize..8, n in any::<i64>()) {
            let odd = [
                json!(null), json!(n), json!(n.to_string()), json!("x"), json!([n]),
                json!({"n": n}), json!(true), json!(-1),
            ][pick].clone();
            let (mut core, mut p) = setup();
            core.acquire(0, "n", AcquireOptions::new(3_000).wait_ns(0)).unwrap();
            let g = expect(&mut core, &mut p, paths::LEASE_GRANT);
            p.handle_reply(&mut core, MS, g.id, 200, &grant_reply(9, 3));
            let t = expect(&mut core, &mut p, paths::KV_TXN);
            let body = json!({"header": {"revision": odd}, "succeeded": odd,
                "responses": [{"response_range": {"kvs": [{"key": odd, "create_revision": odd}]}},
                              {"response_range": {"kvs": odd}}]});
            p.handle_reply(&mut core, 2 * MS, t.id, 200, &serde_json::to_vec(&body).unwrap());
            let ev = events(&mut core, &mut p);
            prop_assert!(ev.iter().all(|e| !matches!(e, Event::Acquired { .. })), "{:?}", ev);
        }
    }
}

#[test]
fn status_reads_the_owner_then_its_leases_time_left_and_garbage_is_an_error() {
    let (mut core, mut p) = setup();
    let owner = [queue_prefix("n"), b"a".repeat(32)].concat();
    let range =
        |kvs: Vec<Value>| serde_json::to_vec(&json!({"header": header(9), "kvs": kvs})).unwrap();
    // Held: the oldest key's create revision, then its lease's TTL.
    let id = p.request_status(0, "n").unwrap();
    let r = expect(&mut core, &mut p, paths::KV_RANGE);
    assert_eq!(
        (r.body["sort_order"].as_str(), r.body["limit"].as_str()),
        (Some("ASCEND"), Some("1"))
    );
    p.handle_reply(&mut core, MS, r.id, 200, &range(vec![kv(&owner, 7, 99)]));
    let t = expect(&mut core, &mut p, paths::LEASE_TIMETOLIVE);
    assert_eq!(t.body, json!({"ID": "99"}));
    p.handle_reply(
        &mut core,
        MS,
        t.id,
        200,
        br#"{"header":{"revision":"9"},"ID":"99","TTL":"4"}"#,
    );
    let (got, st) = p.poll_status().unwrap();
    let st = st.unwrap();
    assert_eq!(got, id);
    assert!(st.held && st.fencing_token == Some(7) && st.remaining_ttl_ms == Some(4_000));
    // The lease ended between the reads: free.
    p.request_status(0, "n").unwrap();
    let r = expect(&mut core, &mut p, paths::KV_RANGE);
    p.handle_reply(&mut core, MS, r.id, 200, &range(vec![kv(&owner, 7, 99)]));
    let t = expect(&mut core, &mut p, paths::LEASE_TIMETOLIVE);
    p.handle_reply(
        &mut core,
        MS,
        t.id,
        200,
        br#"{"header":{"revision":"9"},"ID":"99","TTL":"-1"}"#,
    );
    assert!(!p.poll_status().unwrap().1.unwrap().held);
    // Nobody: free, one request.
    p.request_status(0, "n").unwrap();
    let r = expect(&mut core, &mut p, paths::KV_RANGE);
    p.handle_reply(&mut core, MS, r.id, 200, &range(vec![]));
    assert_eq!(
        p.poll_status().unwrap().1.unwrap(),
        leasehold::backend::LockStatus::default()
    );
    assert!(next(&mut core, &mut p).is_none());
    // A key without a lease (not ours), garbage, an error body, a transport failure: errors.
    for body in [
        range(vec![kv(&owner, 7, 0)]),
        b"nope".to_vec(),
        br#"{"error":"x","code":2}"#.to_vec(),
    ] {
        p.request_status(0, "n").unwrap();
        let r = expect(&mut core, &mut p, paths::KV_RANGE);
        p.handle_reply(&mut core, MS, r.id, 200, &body);
        assert!(p.poll_status().unwrap().1.is_err());
    }
    p.request_status(0, "n").unwrap();
    let r = expect(&mut core, &mut p, paths::KV_RANGE);
    p.handle_failed(&mut core, MS, r.id, "reset");
    assert!(p.poll_status().unwrap().1.is_err());
    assert!(p.poll_status().is_none());
    assert!(p.request_status(0, "").is_err());
}

#[test]
fn a_failed_grant_keeps_the_hosts_reason_as_the_last_error() {
    let (mut core, mut p) = setup();
    core.acquire(0, "n", AcquireOptions::new(3_000)).unwrap();
    let g = expect(&mut core, &mut p, paths::LEASE_GRANT);
    p.handle_failed(&mut core, MS, g.id, "connection refused");
    assert!(
        p.last_error().contains("connection refused"),
        "{}",
        p.last_error()
    );
}

// ------------------------------------------------------------------ the pooled etcd lease

/// A second lock at a later time: one transaction on the pooled lease, beside a keep-alive
/// that dates its grant. Returns the lease, its key and the requests' ids (txn, keep-alive).
fn acquire_pooled(
    core: &mut Client,
    p: &mut EtcdProtocol,
    now: u64,
    name: &str,
    etcd_lease: i64,
) -> (LeaseId, Vec<u8>, u64, u64) {
    let lease = core.acquire(now, name, AcquireOptions::new(3_000)).unwrap();
    let t = expect(core, p, paths::KV_TXN);
    assert_eq!(
        t.body["success"][0]["request_put"]["lease"],
        json!(etcd_lease.to_string())
    );
    let k = expect(core, p, paths::LEASE_KEEPALIVE);
    assert_eq!(k.body, json!({"ID": etcd_lease.to_string()}));
    assert!(next(core, p).is_none(), "no grant, nothing else");
    (lease, put_key(&t.body), t.id, k.id)
}

fn lost(ev: &[Event], lease: LeaseId) -> usize {
    ev.iter()
        .filter(
            |e| matches!(e, Event::Lost { lease: l, reason: LostReason::Rejected } if *l == lease),
        )
        .count()
}

#[test]
fn two_locks_share_one_etcd_lease_with_one_transaction_each() {
    let (mut core, mut p) = setup();
    let (a, _) = acquire_granted(&mut core, &mut p, "a", 70, 10);
    let now = 500 * MS;
    let (b, kb, t, k) = acquire_pooled(&mut core, &mut p, now, "b", 70);
    p.handle_reply(
        &mut core,
        now + MS,
        t,
        200,
        &txn_reply(true, Some(kv(&kb, 11, 70)), Some(kv(&kb, 11, 70)), 11),
    );
    // The transaction alone does not show the etcd lease alive since this acquire.
    let ev = events(&mut core, &mut p);
    assert!(
        matches!(ev[..], [Event::Acquired { lease: l, .. }] if l == a),
        "{ev:?}"
    );
    p.handle_reply(&mut core, now + 2 * MS, k, 200, &keepalive_reply(70, 3));
    let ev = events(&mut core, &mut p);
    assert!(
        matches!(ev[..], [Event::Acquired { lease: l, fencing_token: 11, valid_until }]
            if l == b && valid_until <= now + 3_000 * MS),
        "{ev:?}"
    );
    assert_eq!(p.counters().leases_granted, 1);
    assert_eq!(p.counters().txns, 2);
    // b renews the one etcd lease.
    let due = core.valid_until(b).unwrap().unwrap();
    p.handle_timeout(&mut core, due - 2_000 * MS);
    let mut ids = Vec::new();
    while let Some(r) = next(&mut core, &mut p) {
        assert_eq!(r.path, paths::LEASE_KEEPALIVE);
        ids.push(r.body["ID"].clone());
    }
    assert!(
        !ids.is_empty() && ids.iter().all(|i| *i == json!("70")),
        "{ids:?}"
    );
}

#[test]
fn a_grant_waits_for_a_keepalive_sent_since_the_acquire_and_its_failure_is_retried() {
    let (mut core, mut p) = setup();
    let (_a, _) = acquire_granted(&mut core, &mut p, "a", 70, 10);
    events(&mut core, &mut p);
    let now = 900 * MS;
    let b = core
        .acquire(now, "b", AcquireOptions::new(3_000).wait_ns(60_000 * MS))
        .unwrap();
    let t = expect(&mut core, &mut p, paths::KV_TXN);
    let kb = put_key(&t.body);
    let k = expect(&mut core, &mut p, paths::LEASE_KEEPALIVE);
    p.handle_reply(
        &mut core,
        now + MS,
        t.id,
        200,
        &txn_reply(true, Some(kv(&kb, 11, 70)), Some(kv(&kb, 11, 70)), 11),
    );
    // The keep-alive is lost: no grant on the strength of a keep-alive from before.
    p.handle_failed(&mut core, now + 2 * MS, k.id, "connection reset");
    assert!(events(&mut core, &mut p).is_empty());
    assert_eq!(
        core.lease_state(b).unwrap(),
        leasehold::LeaseState::Acquiring
    );
    // The engine asks again: the same key, a fresh keep-alive, and then the grant.
    let due = p.poll_timeout(&mut core).unwrap();
    p.handle_timeout(&mut core, due);
    let t2 = expect(&mut core, &mut p, paths::KV_TXN);
    let k2 = expect(&mut core, &mut p, paths::LEASE_KEEPALIVE);
    p.handle_reply(&mut core, due + MS, k2.id, 200, &keepalive_reply(70, 3));
    p.handle_reply(
        &mut core,
        due + MS,
        t2.id,
        200,
        &txn_reply(false, Some(kv(&kb, 11, 70)), Some(kv(&kb, 11, 70)), 12),
    );
    let ev = events(&mut core, &mut p);
    assert!(
        matches!(ev[..], [Event::Acquired { lease: l, fencing_token: 11, valid_until }]
            if l == b && valid_until <= due + 3_000 * MS),
        "{ev:?}"
    );
}

#[test]
fn the_pooled_lease_gone_loses_every_lock_bound_to_it_exactly_once() {
    let (mut core, mut p) = setup();
    let (a, _) = acquire_granted(&mut core, &mut p, "a", 70, 10);
    let (b, kb, t, k) = acquire_pooled(&mut core, &mut p, 100 * MS, "b", 70);
    p.handle_reply(&mut core, 101 * MS, k, 200, &keepalive_reply(70, 3));
    p.handle_reply(
        &mut core,
        101 * MS,
        t,
        200,
        &txn_reply(true, Some(kv(&kb, 11, 70)), Some(kv(&kb, 11, 70)), 11),
    );
    events(&mut core, &mut p);
    // Both renew; the first answer says the etcd lease is gone.
    let due = p.poll_timeout(&mut core).unwrap();
    p.handle_timeout(&mut core, due + 200 * MS);
    let k1 = expect(&mut core, &mut p, paths::LEASE_KEEPALIVE);
    let k2 = expect(&mut core, &mut p, paths::LEASE_KEEPALIVE);
    p.handle_reply(
        &mut core,
        due + 201 * MS,
        k1.id,
        200,
        &keepalive_reply(70, 0),
    );
    let ev = events(&mut core, &mut p);
    assert_eq!((lost(&ev, a), lost(&ev, b)), (1, 1), "{ev:?}");
    // The other renewal's late answer, alive or gone, changes nothing and fires nothing.
    let stale = core.counters().stale_results;
    p.handle_reply(
        &mut core,
        due + 202 * MS,
        k2.id,
        200,
        &keepalive_reply(70, 3),
    );
    assert!(events(&mut core, &mut p).is_empty());
    assert!(core.counters().stale_results > stale);
    assert_eq!(core.counters().lost_rejected, 2);
    // Nothing to delete or revoke: the keys went with the lease.
    assert!(next(&mut core, &mut p).is_none());
    // The next lock gets a fresh etcd lease.
    core.acquire(due + 300 * MS, "c", AcquireOptions::new(3_000))
        .unwrap();
    expect(&mut core, &mut p, paths::LEASE_GRANT);
    assert_eq!(p.counters().leases_granted, 2);
}

#[test]
fn a_late_keepalive_answer_for_a_lease_already_replaced_touches_no_lock() {
    let (mut core, mut p) = setup();
    let (a, _) = acquire_granted(&mut core, &mut p, "a", 70, 10);
    let due = p.poll_timeout(&mut core).unwrap();
    p.handle_timeout(&mut core, due);
    let k_old = expect(&mut core, &mut p, paths::LEASE_KEEPALIVE);
    p.handle_reply(&mut core, due + MS, k_old.id, 200, &keepalive_reply(70, 0));
    let ev = events(&mut core, &mut p);
    assert_eq!(lost(&ev, a), 1);
    // A new lock on a new etcd lease.
    let (c, _) = acquire_granted_at(&mut core, &mut p, due + 2 * MS, "c", 71, 20);
    // A keep-alive answer for the old lease (a duplicate, out of order) is counted and
    // ignored; the new lock stays held.
    p.handle_reply(
        &mut core,
        due + 3 * MS,
        k_old.id,
        200,
        &keepalive_reply(70, 0),
    );
    assert!(events(&mut core, &mut p).is_empty());
    assert!(core.is_held(c, due + 3 * MS).unwrap());
    assert!(p.counters().stale_replies >= 1);
}

/// `acquire_granted` at a given time (the pool is empty: a grant, then the transaction).
fn acquire_granted_at(
    core: &mut Client,
    p: &mut EtcdProtocol,
    now: u64,
    name: &str,
    etcd_lease: i64,
    rev: i64,
) -> (LeaseId, Vec<u8>) {
    let lease = core.acquire(now, name, AcquireOptions::new(3_000)).unwrap();
    let g = expect(core, p, paths::LEASE_GRANT);
    p.handle_reply(core, now + MS, g.id, 200, &grant_reply(etcd_lease, 3));
    let t = expect(core, p, paths::KV_TXN);
    let key = put_key(&t.body);
    p.handle_reply(
        core,
        now + 2 * MS,
        t.id,
        200,
        &txn_reply(
            true,
            Some(kv(&key, rev, etcd_lease)),
            Some(kv(&key, rev, etcd_lease)),
            rev,
        ),
    );
    let ev = events(core, p);
    assert!(
        matches!(ev[..], [Event::Acquired { lease: l, .. }] if l == lease),
        "{ev:?}"
    );
    (lease, key)
}

#[test]
fn releasing_one_lock_deletes_its_key_and_keeps_the_other_on_the_lease() {
    let (mut core, mut p) = setup();
    let (a, ka) = acquire_granted(&mut core, &mut p, "a", 70, 10);
    let (b, kb, t, k) = acquire_pooled(&mut core, &mut p, 100 * MS, "b", 70);
    p.handle_reply(&mut core, 101 * MS, k, 200, &keepalive_reply(70, 3));
    p.handle_reply(
        &mut core,
        101 * MS,
        t,
        200,
        &txn_reply(true, Some(kv(&kb, 11, 70)), Some(kv(&kb, 11, 70)), 11),
    );
    events(&mut core, &mut p);
    core.release(120 * MS, a).unwrap();
    let d = expect(&mut core, &mut p, paths::KV_DELETE);
    assert_eq!(d.body, json!({"key": b64(&ka)}));
    assert!(next(&mut core, &mut p).is_none(), "no revoke");
    p.handle_reply(&mut core, 121 * MS, d.id, 200, &delete_reply(1));
    let ev = events(&mut core, &mut p);
    assert!(ev.contains(&Event::Released { lease: a }), "{ev:?}");
    // The other lock is untouched and renews the same etcd lease.
    assert!(core.is_held(b, 121 * MS).unwrap());
    let due = p.poll_timeout(&mut core).unwrap();
    p.handle_timeout(&mut core, due);
    let r = expect(&mut core, &mut p, paths::LEASE_KEEPALIVE);
    assert_eq!(r.body, json!({"ID": "70"}));
    p.handle_reply(&mut core, due + MS, r.id, 200, &keepalive_reply(70, 3));
    assert!(core.is_held(b, due + MS).unwrap());
}

#[test]
fn locks_of_different_ttls_get_different_etcd_leases() {
    let (mut core, mut p) = setup();
    acquire_granted(&mut core, &mut p, "a", 70, 10);
    core.acquire(10 * MS, "b", AcquireOptions::new(10_000))
        .unwrap();
    // A dead client's 3 s lock must not be kept for 10 s: a lease of its own TTL.
    let g = expect(&mut core, &mut p, paths::LEASE_GRANT);
    assert_eq!(g.body, json!({"TTL": "10"}));
}

#[test]
fn a_release_lost_in_transport_retires_the_lease_and_revokes_it_after_its_last_lock() {
    let (mut core, mut p) = setup();
    let (a, _) = acquire_granted(&mut core, &mut p, "a", 70, 10);
    let (b, kb, t, k) = acquire_pooled(&mut core, &mut p, 100 * MS, "b", 70);
    p.handle_reply(&mut core, 101 * MS, k, 200, &keepalive_reply(70, 3));
    p.handle_reply(
        &mut core,
        101 * MS,
        t,
        200,
        &txn_reply(true, Some(kv(&kb, 11, 70)), Some(kv(&kb, 11, 70)), 11),
    );
    events(&mut core, &mut p);
    core.release(120 * MS, a).unwrap();
    let d = expect(&mut core, &mut p, paths::KV_DELETE);
    p.handle_failed(&mut core, 121 * MS, d.id, "timed out");
    // a's key may still be there, kept alive by b's renewals: no new lock uses lease 70.
    core.acquire(122 * MS, "c", AcquireOptions::new(3_000))
        .unwrap();
    let mut saw = Vec::new();
    while let Some(r) = next(&mut core, &mut p) {
        saw.push(r.path);
    }
    assert!(saw.contains(&paths::LEASE_GRANT), "{saw:?}");
    // When b, its last live lock, is released, lease 70 is revoked (a's key goes with it).
    core.release(130 * MS, b).unwrap();
    let mut revoke = None;
    for _ in 0..4 {
        let Some(r) = next(&mut core, &mut p) else {
            break;
        };
        match r.path {
            paths::KV_DELETE if r.body == json!({"key": b64(&kb)}) => {
                p.handle_reply(&mut core, 131 * MS, r.id, 200, &delete_reply(1));
            }
            paths::LEASE_REVOKE => revoke = Some(r),
            _ => {}
        }
    }
    let revoke = revoke.expect("the retired lease is revoked");
    assert_eq!(revoke.body, json!({"ID": "70"}));
}

#[test]
fn an_idle_pooled_lease_is_reused_while_surely_alive_then_replaced() {
    let (mut core, mut p) = setup();
    let (a, _) = acquire_granted(&mut core, &mut p, "a", 70, 10);
    core.release(10 * MS, a).unwrap();
    let d = expect(&mut core, &mut p, paths::KV_DELETE);
    p.handle_reply(&mut core, 11 * MS, d.id, 200, &delete_reply(1));
    events(&mut core, &mut p);
    // Idle, not kept alive: nothing is sent while no lock uses it.
    assert!(next(&mut core, &mut p).is_none());
    // Soon after: reused (one transaction and its dating keep-alive).
    acquire_pooled(&mut core, &mut p, 500 * MS, "b", 70);
    let (mut core, mut p) = setup();
    let (a, _) = acquire_granted(&mut core, &mut p, "a", 70, 10);
    core.release(10 * MS, a).unwrap();
    let d = expect(&mut core, &mut p, paths::KV_DELETE);
    p.handle_reply(&mut core, 11 * MS, d.id, 200, &delete_reply(1));
    // More than half its TTL idle: it may lapse under us, a fresh one is granted.
    core.acquire(2_000 * MS, "b", AcquireOptions::new(3_000))
        .unwrap();
    expect(&mut core, &mut p, paths::LEASE_GRANT);
}

#[test]
fn close_revokes_the_pooled_lease_and_a_held_lock_is_lost() {
    let (mut core, mut p) = setup();
    let (a, _) = acquire_granted(&mut core, &mut p, "a", 70, 10);
    events(&mut core, &mut p);
    p.close(&mut core, 10 * MS);
    let r = expect(&mut core, &mut p, paths::LEASE_REVOKE);
    assert_eq!(r.body, json!({"ID": "70"}));
    let ev = events(&mut core, &mut p);
    assert_eq!(lost(&ev, a), 1, "{ev:?}");
    assert!(next(&mut core, &mut p).is_none());
}

#[test]
fn soon_after_a_keepalive_a_grant_comes_at_once_with_its_ttl_shortened_by_the_lease_age() {
    let (mut core, mut p) = setup();
    let (a, _) = acquire_granted(&mut core, &mut p, "a", 70, 10);
    events(&mut core, &mut p);
    // 20 ms after the grant was sent (at 0): within 1% of the 3 s TTL, so the grant does
    // not wait for the keep-alive that goes beside it (over half of that: a refresh).
    let b = core
        .acquire(20 * MS, "b", AcquireOptions::new(3_000))
        .unwrap();
    let t = expect(&mut core, &mut p, paths::KV_TXN);
    expect(&mut core, &mut p, paths::LEASE_KEEPALIVE);
    assert!(next(&mut core, &mut p).is_none());
    let kb = put_key(&t.body);
    p.handle_reply(
        &mut core,
        21 * MS,
        t.id,
        200,
        &txn_reply(true, Some(kv(&kb, 11, 70)), Some(kv(&kb, 11, 70)), 11),
    );
    let ev = events(&mut core, &mut p);
    assert!(
        matches!(ev[..], [Event::Acquired { lease: l, .. }] if l == b),
        "{ev:?}"
    );
    // Valid no longer than the etcd lease is surely kept: from the grant's send time.
    // A full TTL from the acquire would give 20 + 3000 - 32 ms; 2980 ms give 3000 - 31.8.
    let until = core.valid_until(b).unwrap().unwrap();
    assert!((2_960 * MS..2_970 * MS).contains(&until), "{until}");
    let _ = a;
}

#[test]
fn a_woken_waiter_with_a_key_still_before_it_watches_that_key_without_another_lookup() {
    let (mut core, mut p) = setup();
    let lease = core
        .acquire(0, "n", AcquireOptions::new(3_000).wait_ns(60_000 * MS))
        .unwrap();
    let g = expect(&mut core, &mut p, paths::LEASE_GRANT);
    p.handle_reply(&mut core, MS, g.id, 200, &grant_reply(9, 3));
    let t = expect(&mut core, &mut p, paths::KV_TXN);
    let mine = put_key(&t.body);
    let holder = [queue_prefix("n"), b"a".repeat(32)].concat();
    let gone = [queue_prefix("n"), b"b".repeat(32)].concat();
    p.handle_reply(
        &mut core,
        2 * MS,
        t.id,
        200,
        &txn_reply(true, Some(kv(&mine, 30, 9)), Some(kv(&holder, 10, 1)), 30),
    );
    let r = expect(&mut core, &mut p, paths::KV_RANGE);
    let range = json!({"header": header(31), "kvs": [kv(&gone, 20, 2)]});
    p.handle_reply(
        &mut core,
        3 * MS,
        r.id,
        200,
        &serde_json::to_vec(&range).unwrap(),
    );
    let w = expect(&mut core, &mut p, paths::WATCH);
    // The waiter before us gave up: we wake, but the holder is still there.
    let del = json!({"result": {"header": header(40), "events": [{"type": "DELETE", "kv": {"key": b64(&gone), "mod_revision": "40"}}]}});
    p.handle_watch_message(&mut core, 5 * MS, w.id, &serde_json::to_vec(&del).unwrap());
    let c = next(&mut core, &mut p).unwrap();
    assert_eq!(c.kind, RequestKind::CancelWatch);
    let r = expect(&mut core, &mut p, paths::KV_RANGE);
    let range = json!({"header": header(41), "kvs": [kv(&holder, 10, 1)]});
    p.handle_reply(
        &mut core,
        6 * MS,
        r.id,
        200,
        &serde_json::to_vec(&range).unwrap(),
    );
    assert!(events(&mut core, &mut p).is_empty());
    let w = expect(&mut core, &mut p, paths::WATCH);
    assert_eq!(w.body["create_request"]["key"], b64(&holder));
    assert_eq!(w.body["create_request"]["start_revision"], "42");
    assert!(next(&mut core, &mut p).is_none());
    assert_eq!(
        core.lease_state(lease).unwrap(),
        leasehold::LeaseState::Acquiring
    );
}

#[test]
fn debug_output_never_shows_the_password_or_the_token() {
    const PASSWORD: &str = "S3CRET-pw";
    const TOKEN: &str = "tok-XYZ987";
    // The password's bytes as a derived Debug of a byte buffer would list them.
    let as_bytes = format!("{:?}", PASSWORD.as_bytes());
    let as_bytes = &as_bytes[1..as_bytes.len() - 1];
    let clean = |what: &str, text: &str| {
        for secret in [PASSWORD, TOKEN, as_bytes] {
            assert!(!text.contains(secret), "{what} shows a secret: {text}");
        }
    };
    let mut core = Client::new(Config::default(), &[9; 32]).unwrap();
    let mut p = EtcdProtocol::with_auth("root", PASSWORD).unwrap();
    let shown = format!("{p:?}");
    clean("a new protocol", &shown);
    assert!(
        shown.contains("root") && shown.contains("<redacted>"),
        "{shown}"
    );
    core.acquire(0, "n", AcquireOptions::new(3_000).wait_ns(60_000 * MS))
        .unwrap();
    let r = p.poll_request(&mut core).unwrap();
    assert_eq!(r.path, paths::AUTHENTICATE);
    assert!(std::str::from_utf8(r.body).unwrap().contains(PASSWORD));
    let auth_id = r.id;
    for text in [format!("{r:?}"), format!("{r:#?}")] {
        clean("the authenticate request", &text);
    }
    clean("a protocol authenticating", &format!("{p:#?}"));
    let reply = format!(r#"{{"header":{{"revision":"1"}},"token":"{TOKEN}"}}"#);
    p.handle_reply(&mut core, MS, auth_id, 200, reply.as_bytes());
    assert!(p.is_authenticated());
    let r = p.poll_request(&mut core).unwrap();
    assert_eq!((r.path, r.authorization), (paths::LEASE_GRANT, TOKEN));
    let shown = format!("{r:?}");
    clean("a request with the token", &shown);
    assert!(
        shown.contains("/v3/lease/grant") && shown.contains("TTL"),
        "{shown}"
    );
    clean("an authenticated protocol", &format!("{p:?}"));
    // A refused password: the error says so, without it.
    let mut p = EtcdProtocol::with_auth("root", PASSWORD).unwrap();
    core.acquire(0, "m", AcquireOptions::new(3_000)).unwrap();
    let id = p.poll_request(&mut core).unwrap().id;
    p.handle_reply(
        &mut core,
        MS,
        id,
        400,
        br#"{"error":"etcdserver: authentication failed, invalid user ID or password","code":3}"#,
    );
    assert!(p.last_error().contains("authentication failed"));
    clean("the last error", p.last_error());
    clean("a refused protocol", &format!("{p:?}"));
}

#[test]
fn a_revision_at_2_pow_53_refuses_the_acquire_before_a_key_is_written() {
    let limit = 1i64 << 53;
    let (mut core, mut p) = setup();
    let lease = core.acquire(0, "n", AcquireOptions::new(3_000)).unwrap();
    let g = expect(&mut core, &mut p, paths::LEASE_GRANT);
    let reply =
        serde_json::to_vec(&json!({"header": header(limit), "ID": "77", "TTL": "3"})).unwrap();
    p.handle_reply(&mut core, MS, g.id, 200, &reply);
    assert_eq!(
        events(&mut core, &mut p),
        vec![Event::AcquireFailed {
            lease,
            reason: AcquireFailReason::Unavailable
        }]
    );
    assert!(p.last_error().contains("2^53"), "{}", p.last_error());
    // No transaction (the only request that writes a key) went out.
    while let Some(r) = next(&mut core, &mut p) {
        assert_ne!(r.path, paths::KV_TXN, "{r:?}");
    }
    // A create revision past the range (whatever the header says) is never a fence.
    let (mut core, mut p) = setup();
    let lease = core.acquire(0, "n", AcquireOptions::new(3_000)).unwrap();
    let g = expect(&mut core, &mut p, paths::LEASE_GRANT);
    p.handle_reply(&mut core, MS, g.id, 200, &grant_reply(5, 3));
    let t = expect(&mut core, &mut p, paths::KV_TXN);
    let key = base64::engine::general_purpose::STANDARD
        .decode(t.body["success"][0]["request_put"]["key"].as_str().unwrap())
        .unwrap();
    let own = kv(&key, i64::MAX, 5);
    p.handle_reply(
        &mut core,
        2 * MS,
        t.id,
        200,
        &txn_reply(true, Some(own.clone()), Some(own), 9),
    );
    for _ in 0..4 {
        let r = next(&mut core, &mut p);
        if let Some(r) = r {
            p.handle_failed(&mut core, 3 * MS, r.id, "test: no answer");
        }
    }
    let ev = events(&mut core, &mut p);
    assert!(
        !ev.iter().any(|e| matches!(e, Event::Acquired { .. })),
        "{ev:?}"
    );
    assert!(
        matches!(ev[..], [Event::AcquireFailed { lease: l, .. }] if l == lease),
        "{ev:?}"
    );
}

/// A woken waiter's lookup answered after its pooled etcd lease was found gone: no transaction
/// on a lease that no longer exists, and no grant; the engine asks again with a fresh lease.
#[test]
fn a_lookup_answered_after_the_pooled_lease_went_grants_nothing() {
    let (mut core, mut p) = setup();
    let holder = [queue_prefix("n"), b"a".repeat(32)].concat();
    let (_lease, _mine) = joined_behind(&mut core, &mut p, &holder);
    let r = expect(&mut core, &mut p, paths::KV_RANGE);
    let range = json!({"header": header(31), "kvs": [kv(&holder, 10, 1)]});
    p.handle_reply(
        &mut core,
        3 * MS,
        r.id,
        200,
        &serde_json::to_vec(&range).unwrap(),
    );
    let w = expect(&mut core, &mut p, paths::WATCH);
    let lookup = woken_lookup(&mut core, &mut p, w.id, &holder);
    // Before the lookup's answer, a keep-alive finds the pooled lease gone.
    p.handle_timeout(&mut core, 1_003 * MS);
    let k = loop {
        let r = next(&mut core, &mut p).expect("a keep-alive");
        if r.path == paths::LEASE_KEEPALIVE {
            break r;
        }
    };
    p.handle_reply(
        &mut core,
        1_004 * MS,
        k.id,
        200,
        br#"{"result":{"header":{"revision":"41"},"ID":"9"}}"#,
    );
    let none = json!({"header": header(41), "count": "0"});
    p.handle_reply(
        &mut core,
        1_005 * MS,
        lookup.id,
        200,
        &serde_json::to_vec(&none).unwrap(),
    );
    let ev = events(&mut core, &mut p);
    assert!(
        !ev.iter().any(|e| matches!(e, Event::Acquired { .. })),
        "{ev:?}"
    );
    // The attempt is answered at once (a transport error), not left to its request timeout.
    let mut granted_at = None;
    let mut t = 1_005 * MS;
    for _ in 0..10 {
        match next(&mut core, &mut p) {
            Some(r) if r.path == paths::LEASE_GRANT => {
                granted_at = Some(t);
                break;
            }
            Some(r) => assert_ne!(
                r.path,
                paths::KV_TXN,
                "a transaction on a lease that is gone"
            ),
            None => {
                t = p.poll_timeout(&mut core).unwrap();
                p.handle_timeout(&mut core, t);
            }
        }
    }
    let at = granted_at.expect("a fresh lease is granted for the next attempt");
    assert!(at < 1_005 * MS + 500 * MS, "asked again at {} ms", at / MS);
}
