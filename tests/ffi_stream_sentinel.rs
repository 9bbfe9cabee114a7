//! Redis Sentinel on the *stream* kind of the seam, through the C ABI only: the core asks the
//! sentinels for the master, checks it with `ROLE`, and follows a failover; the host only
//! moves bytes (tests/support/stream_host.rs). On a real topology (1 master, 1 replica,
//! 3 sentinels on loopback): a name the sentinels do not know is a clear error; a sentinel
//! that is down is skipped; a lock taken and released on the master is taken again on the
//! promoted replica after the master is killed, with a higher fence; a lease held across
//! the failover is renewed on the new master or reported lost, never kept unconfirmed; a
//! RESP2 client (its sentinel watch in subscribe mode) follows the failover too.
#![allow(unsafe_code)]
// A host reads its clock; only the core must not.
#![allow(clippy::disallowed_methods)]

#[path = "support/abi.rs"]
mod abi;
#[path = "support/stream_host.rs"]
mod stream_host;
mod support;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use leasehold::backend::redis::{KeyKind, key};
use leasehold::ffi::*;
use stream_host::Host;
use support::resp::Resp;
use support::sentinel::{MASTER_NAME, Topology};

fn exists(port: u16, name: &str) -> i64 {
    let lock = key(KeyKind::Lock, name).unwrap();
    let mut c = Resp::connect(port).unwrap();
    c.call(&[&b"EXISTS"[..], &lock]).unwrap().int()
}

#[test]
fn sentinel_discovery_and_failover() {
    let started = Instant::now();
    let Some(mut topo) = Topology::start() else {
        return;
    };
    // A port nothing listens on: the first sentinel of the URL is down.
    let dead = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();

    // A master name the sentinels do not know: the acquire fails and says why.
    let mut lost = Host::new(&topo.url(&[], "no-such-master"), 1, |o| {
        o.redis_connect_timeout_ms = 1_000
    });
    let lease = lost.acquire("x", 3_000, 0);
    lost.wait_for(lease, LH_EVENT_ACQUIRE_FAILED, Duration::from_secs(5))
        .expect("refused");
    let err = lost.h.backend_error();
    assert!(
        err.contains("knows no master named \"no-such-master\""),
        "{err}"
    );
    assert!(
        lost.opened_to
            .iter()
            .all(|a| topo.sentinels.iter().any(|s| a.ends_with(&format!(":{s}")))),
        "only sentinels were opened: {:?}",
        lost.opened_to
    );
    drop(lost);

    let url = topo.url(&[dead], &format!("{MASTER_NAME}/0"));
    let mut host = Host::new(&url, 2, |o| o.redis_connect_timeout_ms = 1_000);
    let first = host.acquire("job", 5_000, 0);
    let f1 = host
        .wait_for(first, LH_EVENT_ACQUIRED, Duration::from_secs(10))
        .expect("acquired on the master")
        .fencing_token;
    assert!(host.opened_to.contains(&format!("127.0.0.1:{dead}")));
    assert!(
        host.opened_to
            .contains(&format!("127.0.0.1:{}", topo.master))
    );
    assert_eq!(exists(topo.master, "job"), 1);
    host.release(first);
    let until = Instant::now() + Duration::from_secs(5);
    while host.h.counters().releases_confirmed == 0 && Instant::now() < until {
        host.step();
    }
    assert_eq!(host.h.counters().releases_confirmed, 1);
    assert_eq!(exists(topo.master, "job"), 0);

    // A lease held across the failover; replicated before the master dies.
    let held = host.acquire("held", 15_000, 0);
    host.wait_for(held, LH_EVENT_ACQUIRED, Duration::from_secs(5))
        .expect("held");
    let until = Instant::now() + Duration::from_secs(5);
    while exists(topo.replica, "held") == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }

    // A second client speaks RESP2 (its sentinel watch is a connection in subscribe mode).
    let mut resp2 = Host::new(&topo.url(&[], MASTER_NAME), 3, |o| {
        o.redis_connect_timeout_ms = 1_000;
        o.redis_protocol = LH_REDIS_PROTOCOL_RESP2;
    });
    let r1 = resp2.acquire("resp2", 3_000, 0);
    let g1 = resp2
        .wait_for(r1, LH_EVENT_ACQUIRED, Duration::from_secs(10))
        .expect("acquired over RESP2")
        .fencing_token;
    resp2.release(r1);
    resp2
        .wait_for(r1, LH_EVENT_RELEASED, Duration::from_secs(5))
        .expect("released");

    let old = topo.master;
    topo.kill(old);
    // The sentinels promote the replica within a few seconds; the client follows.
    let until = Instant::now() + Duration::from_secs(30);
    while topo.master_now() != Some(topo.replica) && Instant::now() < until {
        host.step_for(Duration::from_millis(50));
        resp2.step_for(Duration::from_millis(50));
    }
    assert_eq!(topo.master_now(), Some(topo.replica), "no failover");
    // (Sentinel closed the clients of the promoted replica: a new connection.)
    let role = Resp::connect(topo.replica)
        .unwrap()
        .call(&["ROLE"])
        .unwrap();
    let support::resp::Owned::Array(role) = role else {
        panic!("{role:?}")
    };
    assert_eq!(role[0].text(), "master");

    let r2 = resp2.acquire("resp2", 3_000, 20_000);
    let g2 = resp2
        .wait_for(r2, LH_EVENT_ACQUIRED, Duration::from_secs(20))
        .expect("the RESP2 client follows the failover")
        .fencing_token;
    assert!(g2 > g1, "{g1} then {g2}");
    assert_eq!(exists(topo.replica, "resp2"), 1);

    host.events.clear();
    // Confirmed until then by the old master, or by the new one already.
    let valid_before = host.h.valid_until(held);
    let second = host.acquire("job", 5_000, 20_000);
    let f2 = host
        .wait_for(second, LH_EVENT_ACQUIRED, Duration::from_secs(20))
        .expect("acquired on the new master")
        .fencing_token;
    assert!(
        f2 > f1,
        "fences increase across the failover: {f1} then {f2}"
    );
    assert_eq!(exists(topo.replica, "job"), 1);
    assert!(
        host.opened_to
            .contains(&format!("127.0.0.1:{}", topo.replica))
    );

    // The held lease: renewed on the new master (automatic renewals are silent: its
    // validity moves on), or reported lost.
    let until = Instant::now() + Duration::from_secs(15);
    let (mut renewed, mut lost) = (false, false);
    while !renewed && !lost && Instant::now() < until {
        host.step();
        lost = host.event(held, LH_EVENT_LOST).is_some();
        renewed = !lost && host.h.valid_until(held) > valid_before;
    }
    eprintln!(
        "held lease across the failover: {}",
        if renewed { "renewed" } else { "lost" }
    );
    if renewed {
        assert_eq!(exists(topo.replica, "held"), 1);
    } else {
        assert!(lost, "the held lease was neither renewed nor lost");
        assert!(!host.h.backend_error().is_empty());
    }
    // The subscriber is subscribed again on the new master (after its reconnect's backoff).
    let until = Instant::now() + Duration::from_secs(10);
    while host.h.counters().redis_subscribed != 1 && Instant::now() < until {
        host.step_for(Duration::from_millis(50));
    }
    let k = host.h.counters();
    assert!(k.redis_subscribed == 1, "{k:?}");
    // Asked at the start and again after the failover; every open the host saw is counted.
    assert!(k.sentinel_lookups >= 2, "{k:?}");
    assert_eq!(k.stream_opens, host.opens, "{k:?}");

    // Idle, each watch is checked with a PING a second and stays (RESP3, and RESP2 in
    // subscribe mode): the sentinels see the PINGs, and none is asked again.
    let pings = |h: &Host| -> usize {
        topo.sentinels
            .iter()
            .filter_map(|p| h.written_to.get(&format!("127.0.0.1:{p}")))
            .map(|w| w.windows(6).filter(|x| x == b"PING\r\n").count())
            .sum()
    };
    let before = [&host, &resp2].map(|h| (pings(h), h.h.counters().sentinel_lookups));
    let until = Instant::now() + Duration::from_millis(2_600);
    while Instant::now() < until {
        host.step_for(Duration::from_millis(50));
        resp2.step_for(Duration::from_millis(50));
    }
    for (h, (p, asked)) in [&host, &resp2].into_iter().zip(before) {
        assert!(pings(h) >= p + 2, "{} PINGs, {p} before", pings(h));
        assert_eq!(
            h.h.counters().sentinel_lookups,
            asked,
            "a watch was replaced"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}
