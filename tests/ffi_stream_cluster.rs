//! Redis Cluster on the *stream* kind of the seam, through the C ABI only: the core learns
//! the slot table from a seed node, opens one pair of links per master and routes each
//! request by its name's slot; the host only moves bytes (tests/support/stream_host.rs). On a
//! real cluster (scripts/redis-cluster-test.sh: 3 masters, 3 replicas on loopback, stopped by
//! pid): names on every master are acquired and released; a waiter is woken by the sharded
//! notice of a release; a master killed during contention is followed to its promoted
//! replica, and a name's fences never go down. Without redis-server the test skips with a
//! message, except under `CI=true`.
#![allow(unsafe_code)]
// A host reads its clock; only the core must not.
#![allow(clippy::disallowed_methods)]

#[path = "support/abi.rs"]
mod abi;
#[path = "support/stream_host.rs"]
mod stream_host;
mod support;

use std::time::{Duration, Instant};

use leasehold::backend::redis::stream::cluster::hash_slot;
use leasehold::backend::redis::{KeyKind, key};
use leasehold::ffi::*;
use stream_host::Host;
use support::cluster::Cluster;
use support::resp::{Resp, now};

fn exists(port: u16, name: &str) -> i64 {
    let lock = key(KeyKind::Lock, name).unwrap();
    let mut c = Resp::connect(port).unwrap();
    c.call(&[&b"EXISTS"[..], &lock]).unwrap().int()
}

fn host(url: &str, seed: u8) -> Host {
    Host::new(url, seed, |o| {
        o.redis_connect_timeout_ms = 1_000;
        o.redis_request_timeout_ms = 2_000;
    })
}

/// Steps both hosts until `done` or `limit`.
fn both_until(
    a: &mut Host,
    b: &mut Host,
    limit: Duration,
    mut done: impl FnMut(&Host, &Host) -> bool,
) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        a.step();
        b.step();
        if done(a, b) {
            return true;
        }
    }
    false
}

#[test]
fn cluster_routing_sharded_wake_and_failover() {
    let started = Instant::now();
    let Some(cluster) = Cluster::start("scluster") else {
        return;
    };
    let via = cluster.ports[0];
    // The core's slot agrees with the cluster's.
    for k in [&b"foo"[..], b"lh:{jobs}:lock", b"{user1000}.following"] {
        let mut c = Resp::connect(via).unwrap();
        let theirs = c.call(&[&b"CLUSTER"[..], b"KEYSLOT", k]).unwrap().int();
        assert_eq!(
            i64::from(hash_slot(k)),
            theirs,
            "{}",
            String::from_utf8_lossy(k)
        );
    }
    // Two names per master.
    let mut names: Vec<(String, u16)> = Vec::new();
    let mut masters: Vec<u16> = Vec::new();
    for i in 0..1000 {
        let name = format!("n{i}");
        let owner = cluster.owner(via, &name).expect("owner");
        if !masters.contains(&owner) {
            masters.push(owner);
        }
        if names.iter().filter(|(_, o)| *o == owner).count() < 2 {
            names.push((name, owner));
        }
        if names.len() == 6 {
            break;
        }
    }
    assert_eq!(masters.len(), 3, "{names:?}");

    // Seeds: a replica first (it knows the table too) and a master.
    let replica = *cluster.ports.iter().find(|p| !masters.contains(p)).unwrap();
    let url = cluster.url(&[replica, masters[0]]);
    let mut a = host(&url, 1);
    let leases: Vec<u64> = names.iter().map(|(n, _)| a.acquire(n, 5_000, 0)).collect();
    for (lease, (name, owner)) in leases.iter().zip(&names) {
        a.wait_for(*lease, LH_EVENT_ACQUIRED, Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{name} acquired: {}", a.h.backend_error()));
        assert_eq!(exists(*owner, name), 1, "{name} on {owner}");
    }
    let k = a.h.counters();
    assert!(
        k.cluster_refreshes >= 1,
        "the slot map was asked for: {k:?}"
    );
    assert_eq!((k.sentinel_lookups, k.stream_late_answers), (0, 0), "{k:?}");
    for m in &masters {
        assert!(
            a.opened_to.contains(&format!("127.0.0.1:{m}")),
            "{:?}",
            a.opened_to
        );
    }
    for lease in &leases {
        a.release(*lease);
        a.wait_for(*lease, LH_EVENT_RELEASED, Duration::from_secs(5))
            .expect("released");
    }
    // (RELEASED comes at once; the server's confirmation follows.)
    let until = Instant::now() + Duration::from_secs(5);
    while a.h.counters().releases_confirmed < 6 && Instant::now() < until {
        a.step();
    }
    assert_eq!(
        a.h.counters().releases_confirmed,
        6,
        "{}",
        a.h.backend_error()
    );
    for (name, owner) in &names {
        assert_eq!(exists(*owner, name), 0, "{name} released on {owner}");
    }

    // Contention: the waiter is woken by the release's sharded notice, not by its recheck
    // (10 s by default). A RESP2 waiter too (its subscriber link in subscribe mode).
    let mut resp2 = Host::new(&url, 3, |o| {
        o.redis_connect_timeout_ms = 1_000;
        o.redis_protocol = LH_REDIS_PROTOCOL_RESP2;
    });
    let (other, _) = names[2].clone();
    let held = a.acquire(&other, 10_000, 0);
    a.wait_for(held, LH_EVENT_ACQUIRED, Duration::from_secs(5))
        .expect("held");
    let waiter = resp2.acquire(&other, 10_000, 20_000);
    both_until(&mut a, &mut resp2, Duration::from_millis(500), |_, _| false);
    assert!(resp2.event(waiter, LH_EVENT_ACQUIRED).is_none());
    let released_at = Instant::now();
    a.release(held);
    assert!(
        both_until(&mut a, &mut resp2, Duration::from_secs(5), |_, b| b
            .event(waiter, LH_EVENT_ACQUIRED)
            .is_some()),
        "the RESP2 waiter was not woken: {}",
        resp2.h.backend_error()
    );
    assert!(released_at.elapsed() < Duration::from_secs(3));
    resp2.release(waiter);
    resp2
        .wait_for(waiter, LH_EVENT_RELEASED, Duration::from_secs(5))
        .expect("released");
    drop(resp2);
    a.events.clear();

    let mut b = host(&url, 2);
    let (contended, _) = names[0].clone();
    let held = a.acquire(&contended, 10_000, 0);
    let f1 = a
        .wait_for(held, LH_EVENT_ACQUIRED, Duration::from_secs(5))
        .expect("held")
        .fencing_token;
    let waiter = b.acquire(&contended, 10_000, 20_000);
    both_until(&mut a, &mut b, Duration::from_millis(500), |_, _| false);
    assert!(b.event(waiter, LH_EVENT_ACQUIRED).is_none());
    let released_at = Instant::now();
    a.release(held);
    assert!(
        both_until(&mut a, &mut b, Duration::from_secs(5), |_, b| b
            .event(waiter, LH_EVENT_ACQUIRED)
            .is_some()),
        "the waiter was not woken: {}",
        b.h.backend_error()
    );
    let woken_in = released_at.elapsed();
    let f2 = b.event(waiter, LH_EVENT_ACQUIRED).unwrap().fencing_token;
    assert!(f2 > f1, "{f1} then {f2}");
    assert!(woken_in < Duration::from_secs(3), "{woken_in:?}");
    assert!(b.h.counters().backend_wakeups >= 1, "{:?}", b.h.counters());
    b.release(waiter);
    b.wait_for(waiter, LH_EVENT_RELEASED, Duration::from_secs(5))
        .expect("released");

    // A master killed during contention: both clients follow the promotion; the name's
    // fences keep increasing.
    let (name, doomed) = names
        .iter()
        .find(|(_, o)| *o != masters[0])
        .cloned()
        .unwrap();
    let survivor = masters[0];
    a.events.clear();
    b.events.clear();
    let held = a.acquire(&name, 3_000, 0);
    let g1 = a
        .wait_for(held, LH_EVENT_ACQUIRED, Duration::from_secs(5))
        .expect("held")
        .fencing_token;
    let waiter = b.acquire(&name, 5_000, 40_000);
    both_until(&mut a, &mut b, Duration::from_millis(300), |_, _| false);
    let kb = b.h.counters();
    cluster.kill(doomed);
    let killed_at = Instant::now();
    let mut promoted = None;
    let until = Instant::now() + Duration::from_secs(25);
    while promoted.is_none() && Instant::now() < until {
        both_until(&mut a, &mut b, Duration::from_millis(100), |_, _| false);
        promoted = cluster.owner(survivor, &name).filter(|o| *o != doomed);
    }
    let promoted = promoted.expect("no replica took over");
    eprintln!("failover after {:?}", killed_at.elapsed());
    // The holder lets go (its lease may be lost already: the status is not checked).
    let _ = a.h.release(now(), held);
    assert!(
        both_until(&mut a, &mut b, Duration::from_secs(20), |_, b| b
            .event(waiter, LH_EVENT_ACQUIRED)
            .is_some()),
        "the waiter did not follow the failover: {}",
        b.h.backend_error()
    );
    let g2 = b.event(waiter, LH_EVENT_ACQUIRED).unwrap().fencing_token;
    let kb2 = b.h.counters();
    assert!(
        kb2.cluster_refreshes + kb2.cluster_redirects > kb.cluster_refreshes + kb.cluster_redirects,
        "the waiter learnt the new owner from the cluster: {kb:?} then {kb2:?}"
    );
    assert!(
        g2 > g1,
        "fences increase across the failover: {g1} then {g2}"
    );
    assert_eq!(exists(promoted, &name), 1);
    assert!(
        b.opened_to.contains(&format!("127.0.0.1:{promoted}")),
        "{:?}",
        b.opened_to
    );
    b.release(waiter);
    b.wait_for(waiter, LH_EVENT_RELEASED, Duration::from_secs(10))
        .expect("released on the new master");
    // The first client reaches every name again, the moved ones on the new master.
    a.events.clear();
    let mut last = g2;
    for (n, _) in &names {
        let l = a.acquire(n, 3_000, 10_000);
        let e = a
            .wait_for(l, LH_EVENT_ACQUIRED, Duration::from_secs(15))
            .unwrap_or_else(|| panic!("{n} after the failover: {}", a.h.backend_error()));
        if *n == name {
            assert!(e.fencing_token > last, "{last} then {}", e.fencing_token);
            last = e.fencing_token;
        }
        a.release(l);
        a.wait_for(l, LH_EVENT_RELEASED, Duration::from_secs(5))
            .expect("released");
    }
    let k = a.h.counters();
    assert_eq!(k.stream_opens, a.opens, "{k:?}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}
