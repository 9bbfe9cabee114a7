//! The etcd protocol against a real 3-member etcd cluster on free loopback ports
//! (scripts/etcd-test-cluster.sh; members stopped by pid at the end). Each host executes
//! requests through a small blocking HTTP/1.1 client with fail-over between members, like a
//! binding's executor. Without etcd the tests skip with a message, except under `CI=true`.
//! `LEASEHOLD_ETCD_LONG=1` makes the fault runs longer.
// A host reads clocks: that is its job (the core never does).
#![allow(clippy::disallowed_methods)]

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::backend::etcd::EtcdProtocol;
use support::etcd::{Cluster, Host};
use support::resp::now;
use support::rounds::{Grant, Rounds, assert_taken_over_at_expiry};

const MS: u64 = 1_000_000;
const LONG: Duration = Duration::from_secs(20);

fn long_runs() -> bool {
    std::env::var("LEASEHOLD_ETCD_LONG").is_ok_and(|v| v == "1")
}

/// A fencing gate: rejects a write whose token is below the highest it accepted.
#[derive(Default)]
struct Gate {
    hwm: Mutex<u64>,
    rejected: AtomicU64,
}

impl Gate {
    fn write(&self, fence: u64) -> bool {
        let mut hwm = self.hwm.lock().unwrap();
        if fence < *hwm {
            self.rejected.fetch_add(1, Ordering::SeqCst);
            return false;
        }
        *hwm = fence;
        true
    }
}

/// Acquires `name` and waits for the grant.
fn take(h: &mut Host, name: &str, ttl_ms: u64, wait_ms: u64) -> Option<u64> {
    let lease = h.acquire(name, ttl_ms, wait_ms);
    let mut fence = None;
    h.run_until(LONG, |h| {
        fence = h.acquired(lease);
        fence.is_some() || h.failed(lease)
    });
    fence
}

/// Hosts contend on one name until `stop`; every grant is checked for exclusivity and
/// logged with its fence and time. Returns the log (fence, host, grant time).
fn contend(
    urls: &[String],
    hosts: u8,
    stop: Arc<AtomicBool>,
    gate: Arc<Gate>,
) -> std::thread::JoinHandle<Vec<(u64, u8, u64)>> {
    let urls = urls.to_vec();
    std::thread::spawn(move || {
        let held = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let threads: Vec<_> = (0..hosts)
            .map(|i| {
                let (urls, stop, gate, held, log) = (
                    urls.clone(),
                    stop.clone(),
                    gate.clone(),
                    held.clone(),
                    log.clone(),
                );
                std::thread::spawn(move || {
                    let mut h = Host::new(&urls, 40 + i, usize::from(i));
                    while !stop.load(Ordering::SeqCst) {
                        let lease = h.acquire("contended", 3_000, 30_000);
                        let mut fence = None;
                        h.run_until(LONG, |h| {
                            fence = h.acquired(lease);
                            fence.is_some() || h.failed(lease)
                        });
                        let Some(fence) = fence else {
                            continue;
                        };
                        assert!(!held.swap(true, Ordering::SeqCst), "two holders at once");
                        assert!(gate.write(fence), "the gate refused a live holder's fence");
                        log.lock().unwrap().push((fence, i, now()));
                        h.run_for(Duration::from_millis(2));
                        held.store(false, Ordering::SeqCst);
                        h.release(lease);
                        h.run_until(LONG, |h| h.core.counters().pending_cleanups == 0);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        Arc::try_unwrap(log).unwrap().into_inner().unwrap()
    })
}

fn assert_fences_increase(log: &[(u64, u8, u64)]) {
    for w in log.windows(2) {
        assert!(w[0].0 < w[1].0, "fences regressed: {w:?}");
    }
}

#[test]
fn contention_keeps_one_holder_at_a_time_and_fences_strictly_increasing() {
    let Some(cluster) = Cluster::start("contend", 3) else {
        return;
    };
    let (stop, gate) = (Arc::new(AtomicBool::new(false)), Arc::new(Gate::default()));
    let run = contend(&cluster.urls, 4, stop.clone(), gate.clone());
    std::thread::sleep(Duration::from_secs(if long_runs() { 30 } else { 3 }));
    stop.store(true, Ordering::SeqCst);
    let log = run.join().unwrap();
    assert!(log.len() >= 10, "only {} grants", log.len());
    assert_fences_increase(&log);
    let hosts: std::collections::HashSet<u8> = log.iter().map(|e| e.1).collect();
    assert_eq!(hosts.len(), 4, "every host got the lock");
    eprintln!("contention: {} grants by 4 hosts in 3 s", log.len());
}

#[test]
fn a_release_wakes_exactly_the_next_waiter_in_fifo_order() {
    let Some(cluster) = Cluster::start("wake", 3) else {
        return;
    };
    let mut hosts: Vec<Host> = (0..4)
        .map(|i| Host::new(&cluster.urls, 50 + i, i.into()))
        .collect();
    let first = take(&mut hosts[0], "fifo", 5_000, 1_000).expect("first holder");
    let mut leases = Vec::new();
    for h in hosts.iter_mut().skip(1) {
        let lease = h.acquire("fifo", 5_000, 60_000);
        assert!(
            h.run_until(LONG, |h| h.proto.open_watches() == 1),
            "watch never opened"
        );
        leases.push(lease);
    }
    let mut holder_lease = hosts[0].events.iter().find_map(|e| match e {
        leasehold::Event::Acquired { lease, .. } => Some(*lease),
        _ => None,
    });
    let mut fence = first;
    for turn in 0..3 {
        let releasing = turn;
        hosts[releasing].release(holder_lease.take().unwrap());
        let next = turn + 1;
        let lease = leases[turn];
        let mut t0 = Instant::now();
        // Drive everyone until the next in line holds it.
        loop {
            for h in hosts.iter_mut() {
                h.run_for(Duration::from_millis(5));
            }
            if hosts[next].acquired(lease).is_some() {
                break;
            }
            assert!(t0.elapsed() < LONG, "the next waiter never got the lock");
        }
        let got = hosts[next].acquired(lease).unwrap();
        assert!(got > fence, "fence {got} after {fence}");
        fence = got;
        // Give any other waiter time to wake (it must not).
        t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(300) {
            for h in hosts.iter_mut() {
                h.run_for(Duration::from_millis(5));
            }
        }
        // The next waiter was woken (more than once if it read a member that lagged behind
        // its own key and looked again); nobody behind it was.
        let wakes: Vec<u64> = hosts.iter().map(|h| h.proto.counters().wakeups).collect();
        assert!(wakes[next] >= 1, "wakes per host: {wakes:?}");
        assert!(
            wakes[next + 1..].iter().all(|&w| w == 0),
            "wakes per host after {} releases: {wakes:?}",
            turn + 1
        );
        for (j, h) in hosts.iter().enumerate().skip(next + 1) {
            assert!(
                h.acquired(leases[j - 1]).is_none(),
                "host {j} jumped the queue"
            );
        }
        holder_lease = Some(lease);
        eprintln!("release {}: wakes per host {wakes:?}", turn + 1);
    }
}

#[test]
fn a_dead_holders_lock_is_taken_over_within_ttl_plus_one_second() {
    let Some(cluster) = Cluster::start("dead", 3) else {
        return;
    };
    let mut dead = Host::new(&cluster.urls, 60, 0);
    let mut waiter = Host::new(&cluster.urls, 61, 1);
    let ttl_ms = 2_000;
    let f0 = take(&mut dead, "orphan", ttl_ms, 1_000).expect("first holder");
    let lease = waiter.acquire("orphan", ttl_ms, 30_000);
    assert!(waiter.run_until(LONG, |h| h.proto.open_watches() == 1));
    // Status, from a third client: the owner (not the waiter behind it) and its time left.
    let mut observer = Host::new(&cluster.urls, 62, 2);
    let st = status(&mut observer, "orphan").unwrap();
    assert!(st.held, "{st:?}");
    assert_eq!(st.fencing_token, Some(f0));
    assert!(
        st.remaining_ttl_ms.is_some_and(|ms| 0 < ms && ms <= ttl_ms),
        "{st:?}"
    );
    let free = status(&mut observer, "nobody/here").unwrap();
    assert!(!free.held && free.fencing_token.is_none(), "{free:?}");
    assert!(observer.proto.request_status(now(), "").is_err());
    // The holder dies: nothing drives it any more, so its lease is not kept alive. Its last
    // keep-alive was sent at most when it last ran.
    let died = now();
    dead.close();
    assert!(waiter.run_until(LONG, |h| h.acquired(lease).is_some()));
    let took = (now() - died) / MS;
    let f1 = waiter.acquired(lease).unwrap();
    assert!(f1 > f0);
    // Woken by the watch, not by polling: one wake, or a few more when a loaded cluster cut
    // the watch (a cancel or a leader change wakes the waiter to look again). Polling every
    // 200 ms through a 2 s TTL would wake it about ten times.
    let wakeups = waiter.proto.counters().wakeups;
    assert!((1..=3).contains(&wakeups), "woken {wakeups} times");
    eprintln!("dead holder: taken over {took} ms after its last run (TTL {ttl_ms} ms)");
    assert!(took <= ttl_ms + 1_000, "took {took} ms");
    assert_eq!(
        status(&mut observer, "orphan").unwrap().fencing_token,
        Some(f1)
    );
    drop(dead);
}

/// Asks for `name`'s status and runs the host until the answer comes.
fn status(h: &mut Host, name: &str) -> Result<leasehold::backend::LockStatus, String> {
    let id = h.proto.request_status(now(), name).unwrap();
    let mut answer = None;
    assert!(h.run_until(LONG, |h| {
        if let Some((got, a)) = h.proto.poll_status() {
            assert_eq!(got, id);
            answer = Some(a);
        }
        answer.is_some()
    }));
    answer.unwrap()
}

/// Kills the leader (and restarts it) or SIGSTOPs a member during contention.
fn fault_run(tag: &str, fault: fn(&Cluster, usize)) {
    let Some(cluster) = Cluster::start(tag, 3) else {
        return;
    };
    let (stop, gate) = (Arc::new(AtomicBool::new(false)), Arc::new(Gate::default()));
    let run = contend(&cluster.urls, 3, stop.clone(), gate.clone());
    std::thread::sleep(Duration::from_millis(1_500));
    let rounds = if long_runs() { 5 } else { 1 };
    let mut marks = Vec::new();
    for _ in 0..rounds {
        let leader = cluster.leader().expect("a leader");
        let at = now();
        fault(&cluster, leader);
        marks.push(at);
        std::thread::sleep(Duration::from_millis(2_500));
    }
    stop.store(true, Ordering::SeqCst);
    let log = run.join().unwrap();
    assert_fences_increase(&log);
    assert_eq!(gate.rejected.load(Ordering::SeqCst), 0);
    for at in marks {
        let before = log.iter().filter(|e| e.2 < at).count();
        let next = log.iter().find(|e| e.2 > at).map(|e| (e.2 - at) / MS);
        let after = log.iter().filter(|e| e.2 > at).count();
        assert!(before > 0, "no grants before the fault");
        assert!(after > 0, "acquisitions never resumed after the fault");
        eprintln!(
            "{tag}: first grant {next:?} ms after the fault; {before} grants before, {after} after"
        );
    }
}

#[test]
fn acquisitions_resume_after_the_leader_is_killed_and_restarted_and_fences_never_regress() {
    fault_run("leader", |c, leader| {
        c.kill(leader);
        std::thread::sleep(Duration::from_millis(1_000));
        c.restart(leader);
    });
}

#[test]
fn a_sigstopped_member_does_not_stop_acquisitions_or_make_fences_regress() {
    fault_run("sigstop", |c, leader| {
        c.pause(leader, true);
        std::thread::sleep(Duration::from_millis(2_000));
        c.pause(leader, false);
    });
}

#[test]
fn a_holder_paused_past_its_ttl_is_fenced_out_and_learns_it_lost_the_lock() {
    let Some(cluster) = Cluster::start("paused", 3) else {
        return;
    };
    let gate = Gate::default();
    let mut paused = Host::new(&cluster.urls, 70, 0);
    let mut other = Host::new(&cluster.urls, 71, 1);
    let lease0 = paused.acquire("paused", 1_000, 1_000);
    assert!(paused.run_until(LONG, |h| h.acquired(lease0).is_some()));
    let f0 = paused.acquired(lease0).unwrap();
    assert!(gate.write(f0));
    // The holder stops running (a SIGSTOP'd process) while the other takes over.
    let lease1 = other.acquire("paused", 1_000, 30_000);
    assert!(other.run_until(LONG, |h| h.acquired(lease1).is_some()));
    let f1 = other.acquired(lease1).unwrap();
    assert!(f1 > f0);
    assert!(gate.write(f1));
    // The paused holder wakes: its stale write is refused, and it learns of the loss.
    assert!(!gate.write(f0), "the gate accepted a stale fence");
    assert!(paused.run_until(LONG, |h| h.lost(lease0).is_some()));
    eprintln!(
        "paused holder: lost with {:?}",
        paused.lost(lease0).unwrap()
    );
    assert!(!paused.core.is_held(lease0, now()).unwrap());
}

#[test]
fn a_holder_whose_lease_is_revoked_behind_its_back_learns_it_at_its_next_keepalive() {
    let Some(cluster) = Cluster::start("revoked", 3) else {
        return;
    };
    let mut h = Host::new(&cluster.urls, 80, 2);
    let lease = h.acquire("revoked", 3_000, 1_000);
    assert!(h.run_until(LONG, |h| h.acquired(lease).is_some()));
    // Find our etcd lease through the gateway, as an operator would, and revoke it. A member
    // lists the leases it has applied (the gateway omits an empty list): ask until it shows.
    let mut ids: Vec<String> = Vec::new();
    let mut last = serde_json::Value::Null;
    let deadline = Instant::now() + LONG;
    while ids.is_empty() && Instant::now() < deadline {
        let leases =
            support::etcd::post(&cluster.urls[0], "/v3/lease/leases", b"{}", LONG).unwrap();
        last = serde_json::from_slice(&leases.1).unwrap();
        ids = last["leases"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|l| l["ID"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if ids.is_empty() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    assert_eq!(ids.len(), 1, "{last}");
    let body = format!(r#"{{"ID":"{}"}}"#, ids[0]);
    let (status, _) =
        support::etcd::post(&cluster.urls[1], "/v3/lease/revoke", body.as_bytes(), LONG).unwrap();
    assert_eq!(status, 200);
    let before = h.core.counters().renewals_sent;
    assert!(h.run_until(LONG, |h| h.lost(lease).is_some()));
    assert_eq!(h.lost(lease), Some(leasehold::LostReason::Rejected));
    assert_eq!(
        h.core.counters().renewals_sent,
        before + 1,
        "lost at the next keep-alive"
    );
    // Someone else gets the lock at once, with a higher fence.
    let mut other = Host::new(&cluster.urls, 81, 0);
    assert!(take(&mut other, "revoked", 3_000, 5_000).is_some());
}

#[test]
fn with_authentication_on_requests_carry_a_token_and_a_wrong_password_grants_nothing() {
    let Some(cluster) = Cluster::start("auth", 3) else {
        return;
    };
    let url = &cluster.urls[0];
    for (path, body) in [
        (
            "/v3/auth/user/add",
            r#"{"name":"root","password":"rootpw"}"#,
        ),
        ("/v3/auth/role/add", r#"{"name":"root"}"#),
        ("/v3/auth/user/grant", r#"{"user":"root","role":"root"}"#),
        ("/v3/auth/enable", "{}"),
    ] {
        let (status, reply) = support::etcd::post(url, path, body.as_bytes(), LONG).unwrap();
        assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&reply));
    }
    // Without a token etcd refuses; the engine never sees a grant.
    let mut anonymous = Host::new(&cluster.urls, 90, 0);
    assert_eq!(take(&mut anonymous, "guarded", 3_000, 500), None);
    assert!(
        anonymous.proto.last_error().contains("user name"),
        "{}",
        anonymous.proto.last_error()
    );
    let wrong = EtcdProtocol::with_auth("root", "nope").unwrap();
    let mut wrong = Host::with_protocol(&cluster.urls, 91, 1, wrong);
    assert_eq!(take(&mut wrong, "guarded", 3_000, 500), None);
    assert!(!wrong.proto.is_authenticated());
    // The right password: a token, then the usual protocol, renewals and a waiter's watch too.
    let mut a = Host::with_protocol(
        &cluster.urls,
        92,
        2,
        EtcdProtocol::with_auth("root", "rootpw").unwrap(),
    );
    let mut b = Host::with_protocol(
        &cluster.urls,
        93,
        0,
        EtcdProtocol::with_auth("root", "rootpw").unwrap(),
    );
    // b is not driven while a runs: its own etcd lease (its TTL) must outlast that, or the
    // cluster drops its queue key and b rejoins instead of being woken; and the holder's TTL
    // bounds b's own retry, which must not beat the watch either.
    let la = a.acquire("guarded", 9_000, 5_000);
    assert!(
        a.run_until(LONG, |h| h.acquired(la).is_some()),
        "{}",
        a.proto.last_error()
    );
    assert!(a.proto.is_authenticated());
    let lb = b.acquire("guarded", 30_000, 30_000);
    assert!(b.run_until(LONG, |h| h.proto.open_watches() == 1));
    a.run_for(Duration::from_millis(3_500));
    assert!(a.core.counters().renewals_ok >= 1);
    a.release(la);
    assert!(b.run_until(LONG, |h| h.acquired(lb).is_some()));
    assert!(b.acquired(lb).unwrap() > a.acquired(la).unwrap());
    // Not polled: woken by the watch, a cut watch on a loaded cluster waking it once or twice
    // more, or (on a loaded machine) its own retry came first.
    let wakeups = b.proto.counters().wakeups;
    assert!(wakeups <= 3, "woken {wakeups} times");
}

#[test]
fn a_holder_frozen_after_handoffs_is_taken_over_at_its_expiry() {
    let Some(cluster) = Cluster::start("frozen", 3) else {
        return;
    };
    const HOSTS: u8 = 4;
    const TTL: u64 = 1_000;
    let rounds = Arc::new(Rounds::new(HOSTS, 12));
    let threads: Vec<_> = (0..HOSTS)
        .map(|i| {
            let (urls, rounds) = (cluster.urls.clone(), rounds.clone());
            std::thread::spawn(move || {
                let mut h = Host::new(&urls, 70 + i, usize::from(i));
                while !rounds.stopped() {
                    let lease = h.acquire("frozen", TTL, 10_000);
                    let mut fence = None;
                    h.run_until(LONG, |h| {
                        fence = h.acquired(lease);
                        fence.is_some() || h.failed(lease)
                    });
                    let Some(fence) = fence else {
                        rounds.wait_ran_out(i);
                        continue;
                    };
                    let at_ns = now();
                    if rounds.granted(Grant {
                        fence,
                        host: i,
                        at_ns,
                    }) {
                        return;
                    }
                    h.run_for(Duration::from_millis(30));
                    h.release(lease);
                    h.run_until(LONG, |h| h.core.counters().pending_cleanups == 0);
                    // The woken waiter's turn (a release then an instant acquire barges).
                    h.run_for(Duration::from_millis(20));
                }
            })
        })
        .collect();
    let took_over = rounds.takeover(TTL, now);
    for t in threads {
        t.join().unwrap();
    }
    rounds.assert_fences_increase();
    assert_taken_over_at_expiry("etcd", took_over, TTL);
}
