//! The lease engine against the memory service, both through the C ABI only: a small host
//! loop in Rust (what every binding's memory executor does) hands each client's polled
//! requests to `lh_memory_service_call` on its own connection of one `lh_memory_service`,
//! answers with `lh_io_reply` / `lh_io_failed`, passes release notifications to
//! `lh_io_message` and feeds the deadlines. Acquire, contention and handoff, renewal, loss
//! after a partition, a lost answer retried with the same token, a not-owner release, and a
//! reconnect.
#![allow(unsafe_code)]
// The fault switches and the clock step are test hooks: exported with the `testing` feature only.
#![cfg(feature = "testing")]

#[path = "support/abi.rs"]
mod abi;

use abi::*;
use leasehold::ffi::*;

const NAME: &str = "orders";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ev {
    kind: u32,
    reason: u32,
    lease: u64,
    fence: u64,
    at: u64,
}

struct Host {
    m: Mem,
    events: Vec<Ev>,
}

struct World {
    // Declared first so the clients go before the service.
    hosts: Vec<Host>,
    svc: Svc,
    now: u64,
}

impl World {
    fn new(clients: u8) -> Self {
        let svc = Svc::new();
        let hosts = (0..clients)
            .map(|i| Host {
                m: Mem::new(&svc, i + 1),
                events: Vec::new(),
            })
            .collect();
        World { hosts, svc, now: 0 }
    }

    fn acquire(&mut self, host: usize, ttl_ms: u64, wait_ns: u64) -> u64 {
        let mut o = opts(ttl_ms);
        o.wait_ns = wait_ns;
        let lease = self.hosts[host]
            .m
            .h
            .acquire(self.now, NAME.as_bytes(), &o)
            .unwrap();
        self.pump();
        lease
    }

    /// Runs every host's requests on the service and feeds the answers and notifications
    /// back, until nothing is left to do.
    fn pump(&mut self) {
        let (svc, now) = (&self.svc, self.now);
        for _ in 0..1000 {
            let mut busy = false;
            for h in &mut self.hosts {
                busy |= h.m.notify(svc, now) > 0;
                busy |= !h.m.serve(svc, now).is_empty();
                h.events.extend(h.m.h.events().into_iter().map(|e| Ev {
                    kind: e.kind,
                    reason: e.reason,
                    lease: e.lease_id,
                    fence: e.fencing_token,
                    at: now,
                }));
            }
            if !busy {
                return;
            }
        }
        panic!("the host loop does not settle");
    }

    /// Lets time pass to `to`, feeding every deadline on the way.
    fn advance(&mut self, to: u64) {
        for _ in 0..100_000 {
            let next = self
                .hosts
                .iter()
                .map(|h| h.m.h.deadline())
                .min()
                .unwrap_or(LH_NO_DEADLINE);
            if next > to {
                break;
            }
            self.now = self.now.max(next);
            for h in &self.hosts {
                ok(h.m.h.timeout(self.now));
            }
            self.pump();
        }
        self.now = to;
        for h in &self.hosts {
            ok(h.m.h.timeout(self.now));
        }
        self.pump();
    }

    fn event(&self, host: usize, kind: u32) -> Option<Ev> {
        self.hosts[host]
            .events
            .iter()
            .copied()
            .find(|e| e.kind == kind)
    }

    fn is_held(&self, host: usize, lease: u64) -> bool {
        let mut b = false;
        // SAFETY: live handle, valid pointer.
        ok(unsafe { lh_is_held(self.hosts[host].m.h.0, lease, self.now, &mut b) });
        b
    }

    fn status(&self) -> lh_memory_status {
        self.svc.status(self.now, NAME.as_bytes())
    }
}

#[test]
fn acquire_contend_and_hand_off_on_the_release_notification() {
    let mut w = World::new(2);
    let a = w.acquire(0, 3_000, 0);
    assert_eq!(
        w.event(0, LH_EVENT_ACQUIRED).map(|e| (e.lease, e.fence)),
        Some((a, 1))
    );
    w.now = 10 * MS;
    let b = w.acquire(1, 3_000, 10_000 * MS);
    assert!(w.event(1, LH_EVENT_ACQUIRED).is_none(), "A holds it");
    w.advance(100 * MS);
    assert!(w.event(1, LH_EVENT_ACQUIRED).is_none());
    assert_eq!(w.status().watchers, 1, "B watches the name");
    ok(w.hosts[0].m.h.release(w.now, a));
    w.pump();
    // B is woken by the notification, not by its backoff or A's TTL running out.
    let got = w
        .event(1, LH_EVENT_ACQUIRED)
        .expect("B acquires after A's release");
    assert_eq!((got.lease, got.fence, got.at), (b, 2, 100 * MS));
    assert_eq!(w.hosts[1].m.h.counters().backend_wakeups, 1);
    let st = w.status();
    assert_eq!(
        (st.held, st.fencing_token, st.holder_connection),
        (1, 2, w.hosts[1].m.conn)
    );
}

#[test]
fn renewals_keep_the_lease_past_its_ttl() {
    let mut w = World::new(1);
    let a = w.acquire(0, 300, 0);
    w.advance(3_000 * MS);
    assert!(w.is_held(0, a), "renewed ten times over");
    assert!(w.event(0, LH_EVENT_LOST).is_none());
    let st = w.status();
    assert_eq!((st.held, st.fencing_token), (1, 1));
    assert!(st.expires_at_ns > 3_000 * MS);
    let k = w.hosts[0].m.h.counters();
    assert!(k.renewals_ok >= 9, "{}", k.renewals_ok);
    assert_eq!(w.svc.stats().renewals, k.renewals_ok);
}

#[test]
fn a_partitioned_holder_loses_the_lease_before_another_gets_it() {
    let mut w = World::new(2);
    let a = w.acquire(0, 300, 0);
    w.svc
        .set_faults(w.hosts[0].m.conn, LH_MEMORY_PARTITIONED, 0);
    let b = w.acquire(1, 300, 5_000 * MS);
    w.advance(2_000 * MS);
    let lost = w.event(0, LH_EVENT_LOST).expect("A notices the loss");
    assert_eq!(lost.lease, a);
    assert!(
        lost.reason == LH_REASON_FAIL_BUDGET || lost.reason == LH_REASON_EXPIRED,
        "reason {}",
        lost.reason
    );
    let got = w
        .event(1, LH_EVENT_ACQUIRED)
        .expect("B takes over after A's grant expired");
    assert_eq!((got.lease, got.fence), (b, 2));
    assert!(
        lost.at <= got.at,
        "A stopped believing before B was granted"
    );
    assert!(w.hosts[0].m.h.counters().backend_transport_failures >= 1);
    assert!(matches!(
        w.hosts[0].m.h.state(a),
        Err(LH_ERR_LEASE_ENDED) | Ok(LH_STATE_LOST)
    ));
}

#[test]
fn a_lost_answer_is_retried_with_the_same_token_and_gets_the_same_grant() {
    let mut w = World::new(1);
    w.svc.set_faults(w.hosts[0].m.conn, 0, 1);
    let a = w.acquire(0, 3_000, 1_000 * MS);
    assert!(
        w.event(0, LH_EVENT_ACQUIRED).is_none(),
        "the first answer was lost"
    );
    w.advance(1_000 * MS);
    let got = w
        .event(0, LH_EVENT_ACQUIRED)
        .expect("the retry finds its own grant");
    assert_eq!((got.lease, got.fence), (a, 1));
    assert_eq!(w.svc.stats().grants, 1, "one grant, refreshed by the retry");
    assert_eq!(w.hosts[0].m.h.counters().backend_transport_failures, 1);
}

#[test]
fn releasing_after_the_service_moved_on_is_not_owner() {
    let mut w = World::new(2);
    let a = w.acquire(0, 3_000, 0);
    // The service's clock jumps past A's TTL: B gets the lock while A still believes.
    // SAFETY: live handle.
    ok(unsafe { lh_memory_service_step_clock(w.svc.0, 5_000 * MS as i64) });
    w.now = 10 * MS;
    let b = w.acquire(1, 3_000, 0);
    assert_eq!(
        w.event(1, LH_EVENT_ACQUIRED).map(|e| (e.lease, e.fence)),
        Some((b, 2))
    );
    assert!(w.is_held(0, a), "A's own clock says it is still valid");
    let mut releasing = 0;
    // SAFETY: live handle, valid pointer.
    ok(unsafe { lh_release(w.hosts[0].m.h.0, w.now, a, &mut releasing) });
    assert_eq!(releasing, LH_RELEASING_PENDING);
    w.pump();
    let out = w
        .event(0, LH_EVENT_RELEASE_OUTCOME)
        .expect("the service's answer");
    assert_eq!(out.reason, LH_REASON_RELEASE_NOT_OWNER);
    let st = w.status();
    assert_eq!(
        (st.held, st.fencing_token),
        (1, 2),
        "B's grant is untouched"
    );
}

#[test]
fn a_reconnected_waiter_watches_again_and_is_woken() {
    let mut w = World::new(2);
    let a = w.acquire(0, 3_000, 0);
    let b = w.acquire(1, 3_000, 60_000 * MS);
    assert_eq!(w.status().watchers, 1);
    // B's connection goes (its watch with it); the host connects again and says so.
    // SAFETY: live handle.
    ok(unsafe { lh_memory_service_disconnect(w.svc.0, w.hosts[1].m.conn) });
    assert_eq!(w.status().watchers, 0);
    w.hosts[1].m.conn = w.svc.connect();
    w.now = 5 * MS;
    ok(w.hosts[1]
        .m
        .h
        .connection(w.now, LH_CONNECTION_COMMANDS, LH_CONNECTION_REOPENED, b""));
    w.pump();
    assert_eq!(w.status().watchers, 1, "the watch is asked for again");
    ok(w.hosts[0].m.h.release(w.now, a));
    w.pump();
    let got = w
        .event(1, LH_EVENT_ACQUIRED)
        .expect("woken on the new connection");
    assert_eq!((got.lease, got.fence, got.at), (b, 2, 5 * MS));
}
