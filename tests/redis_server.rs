//! The Redis protocol against a real redis-server started on a free loopback port (stopped by
//! pid at the end). Each test host executes requests verbatim on two connections, like a
//! binding's executor. Without redis-server the tests skip with a message, except under
//! `CI=true`, where that is a failure.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::backend::redis::RedisOptions;
use leasehold::{AcquireFailReason, Event};
use support::resp::{Host, Owned, Server, now};

const MS: u64 = 1_000_000;
const LONG: Duration = Duration::from_secs(20);

fn subscribed(h: &mut Host) {
    assert!(
        h.run_until(LONG, |h| h.proto.is_subscribed()),
        "never subscribed"
    );
}

/// Acquires `name` and waits for the outcome: the fence, or `None` if it failed.
fn take(h: &mut Host, name: &str, ttl_ms: u64, wait_ms: u64) -> Option<u64> {
    let lease = h.acquire(name, ttl_ms, wait_ms);
    let mut fence = None;
    h.run_until(LONG, |h| {
        fence = h.take_acquired(lease);
        fence.is_some() || h.failed(lease)
    });
    fence
}

#[test]
fn many_handoffs_keep_fences_strictly_increasing_and_holders_exclusive() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut admin = server.conn();
    const HOSTS: u8 = 4;
    const ROUNDS: usize = 60;
    let held = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new(Vec::<(u64, u8)>::new()));
    let queued = Arc::new(AtomicU64::new(0));
    let before = admin.calls("evalsha") + admin.calls("eval");
    let threads: Vec<_> = (0..HOSTS)
        .map(|i| {
            let (held, log, queued, port) =
                (held.clone(), log.clone(), queued.clone(), server.port);
            std::thread::spawn(move || {
                let mut h = Host::new(port, 10 + i, RedisOptions::default());
                subscribed(&mut h);
                for _ in 0..ROUNDS {
                    let lease = h.acquire("shared", 10_000, 30_000);
                    let mut fence = None;
                    assert!(
                        h.run_until(LONG, |h| {
                            fence = h.take_acquired(lease);
                            fence.is_some()
                        }),
                        "host {i} never got the lock"
                    );
                    assert!(!held.swap(true, Ordering::SeqCst), "two holders at once");
                    log.lock().unwrap().push((fence.unwrap(), i));
                    std::thread::sleep(Duration::from_millis(1));
                    held.store(false, Ordering::SeqCst);
                    h.release(lease);
                    h.run_until(LONG, |h| h.core.counters().pending_cleanups == 0);
                    // Let the woken waiter take it before asking again (no barging).
                    h.run_until(Duration::from_millis(3), |_| false);
                }
                queued.fetch_add(h.proto.counters().script_calls, Ordering::SeqCst);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let log = log.lock().unwrap();
    assert_eq!(log.len(), HOSTS as usize * ROUNDS);
    for w in log.windows(2) {
        assert!(w[0].0 < w[1].0, "fences must strictly increase: {w:?}");
    }
    let handoffs = log.windows(2).filter(|w| w[0].1 != w[1].1).count();
    let calls = admin.calls("evalsha") + admin.calls("eval") - before;
    let grants = log.len() as u64;
    eprintln!(
        "{grants} grants, {handoffs} handoffs between hosts, {calls} script calls at the server \
         ({:.2} per grant: each acquisition's queueing refusal, then RELEASE + the woken ACQUIRE)",
        calls as f64 / grants as f64
    );
    assert_eq!(
        calls,
        queued.load(Ordering::SeqCst),
        "every call the hosts sent, no more"
    );
    assert!(handoffs >= 200, "{handoffs}");
    // Per grant: one RELEASE, one granting ACQUIRE, at most one queueing refusal (the quick
    // retries are answered locally), and a little slack for races with a release.
    assert!(
        calls <= grants * 3 + grants / 10,
        "{calls} calls for {grants} grants"
    );
}

/// `frozen` waiters queue first and then stop running (their sockets stay open, as for a
/// SIGSTOP'd process); a live waiter queues behind them. The delay from the release to the
/// live waiter's grant, in ms.
fn frozen_case(server: &Server, frozen: u8, name: &str) -> f64 {
    let opts = RedisOptions::default();
    let mut holder = Host::new(server.port, 40 + frozen, opts);
    let mut stuck: Vec<Host> = (0..frozen)
        .map(|i| Host::new(server.port, 50 + 2 * frozen + i, opts))
        .collect();
    let mut live = Host::new(server.port, 60 + frozen, opts);
    subscribed(&mut holder);
    subscribed(&mut live);
    let held = holder.acquire(name, 10_000, 0);
    assert!(holder.run_until(LONG, |h| h.take_acquired(held).is_some()));
    for f in &mut stuck {
        subscribed(f);
        let lease = f.acquire(name, 10_000, 60_000);
        f.run_until(Duration::from_millis(100), |_| false);
        assert_eq!(
            f.core.lease_state(lease).unwrap(),
            leasehold::LeaseState::Acquiring
        );
    }
    let l = live.acquire(name, 10_000, 60_000);
    live.run_until(Duration::from_millis(100), |_| false);
    let released_at = now();
    holder.release(held);
    holder.run_until(LONG, |h| h.core.counters().pending_cleanups == 0);
    let mut got = None;
    assert!(live.run_until(LONG, |h| {
        got = h.take_acquired(l);
        got.is_some()
    }));
    assert_eq!(live.proto.counters().standby_takeovers, 1);
    (now() - released_at) as f64 / MS as f64
}

#[test]
fn a_frozen_head_waiter_does_not_keep_the_lock_from_a_live_one() {
    let Some(server) = Server::start() else {
        return;
    };
    for frozen in 1..=2 {
        let delay_ms = frozen_case(&server, frozen, &format!("frozen{frozen}"));
        eprintln!(
            "{frozen} frozen waiter(s) at the head: the live waiter got the lock {delay_ms:.1} ms \
             after the release"
        );
        // Generous: without the standbys the live waiter would sleep until the holder's TTL
        // (10 s). The number itself is in the output (about frozen × 150 ms).
        assert!(delay_ms < 2_000.0 * f64::from(frozen), "{delay_ms} ms");
    }
}

#[test]
fn keys_of_20000_released_names_expire_and_fences_still_increase() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut admin = server.conn();
    let opts = RedisOptions {
        key_keep_ms: 100,
        ..RedisOptions::default()
    };
    let mut h = Host::new(server.port, 4, opts);
    subscribed(&mut h);
    const NAMES: usize = 20_000;
    let mut first = Vec::with_capacity(NAMES);
    for i in 0..NAMES {
        let name = format!("k{i}");
        let lease = h.acquire(&name, 1_000, 0);
        let mut fence = None;
        while fence.is_none() {
            h.step(Duration::ZERO);
            fence = h.take_acquired(lease);
            assert!(!h.failed(lease), "{name}");
        }
        first.push(fence.unwrap());
        h.release(lease);
        while h.core.counters().pending_cleanups > 0 {
            h.step(Duration::ZERO);
        }
    }
    let deadline = now() + 10_000 * MS;
    let mut keys = i64::MAX;
    while now() < deadline {
        keys = admin.call(&["DBSIZE"]).unwrap().int();
        if keys == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        keys, 0,
        "keys left after 20000 names were locked and released"
    );
    for i in (0..NAMES).step_by(997) {
        let fence = take(&mut h, &format!("k{i}"), 1_000, 0).unwrap();
        assert!(fence > first[i], "k{i}: {fence} after {}", first[i]);
    }
}

#[test]
fn script_flush_mid_run_reloads_through_noscript() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut admin = server.conn();
    let mut h = Host::new(server.port, 5, RedisOptions::default());
    subscribed(&mut h);
    let mut last = 0;
    for round in 0..6 {
        if round % 2 == 1 {
            assert_eq!(
                admin.call(&["SCRIPT", "FLUSH"]).unwrap(),
                Owned::Status(b"OK".to_vec())
            );
        }
        let lease = h.acquire("flush", 2_000, 0);
        let mut fence = None;
        assert!(h.run_until(LONG, |h| {
            fence = h.take_acquired(lease);
            fence.is_some()
        }));
        assert!(fence.unwrap() > last);
        last = fence.unwrap();
        h.release(lease);
        assert!(h.run_until(LONG, |h| h.core.counters().pending_cleanups == 0));
    }
    assert!(
        h.proto.counters().noscript_retries >= 3,
        "{:?}",
        h.proto.counters()
    );
    assert!(h.events.iter().all(|e| !matches!(e, Event::Lost { .. })));
}

#[test]
fn foreign_keys_of_the_wrong_type_are_errors_never_grants() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut admin = server.conn();
    admin.call(&["SET", "lh:{str}", "not a lock"]).unwrap();
    admin
        .call(&["HSET", "lh:{hash}", "owner", "someone"])
        .unwrap();
    admin.call(&["SET", "lh:{fence}:fence", "garbage"]).unwrap();
    admin.call(&["LPUSH", "lh:{list}", "x"]).unwrap();
    let mut h = Host::new(server.port, 6, RedisOptions::default());
    subscribed(&mut h);
    for name in ["str", "hash", "fence", "list"] {
        let lease = h.acquire(name, 2_000, 0);
        assert!(h.run_until(LONG, |h| h.failed(lease)), "{name}");
        assert!(h.take_acquired(lease).is_none(), "{name}");
        assert!(h.events.iter().any(|e| matches!(e,
            Event::AcquireFailed { lease: l, reason: AcquireFailReason::Unavailable } if *l == lease)));
    }
    assert!(h.proto.counters().error_replies >= 4);
    assert!(
        h.proto.last_error().contains("lh: "),
        "{}",
        h.proto.last_error()
    );
    // RENEW and RELEASE answer a string that is no lock with an error too.
    use leasehold::backend::redis::scripts::{RELEASE_SCRIPT, RENEW_SCRIPT};
    let renew = admin.call(&["EVAL", RENEW_SCRIPT, "1", "lh:{str}", "t", "1000"]);
    assert!(renew.unwrap().text().starts_with("lh: "));
    let release = admin.call(&[
        "EVAL",
        RELEASE_SCRIPT,
        "2",
        "lh:{str}",
        "lh:{str}:queue",
        "t",
        "str",
        "1000",
    ]);
    assert!(release.unwrap().text().starts_with("lh: "));
    // The foreign keys are untouched.
    assert_eq!(
        admin.call(&["GET", "lh:{str}"]).unwrap(),
        Owned::Bulk(b"not a lock".to_vec())
    );
    // A queue key of another type: waiting fails clearly, the holder still releases.
    let mut other = Host::new(server.port, 7, RedisOptions::default());
    subscribed(&mut other);
    let held = take(&mut h, "q", 5_000, 0).unwrap();
    assert!(held > 0);
    admin.call(&["SET", "lh:{q}:queue", "x"]).unwrap();
    let w = other.acquire("q", 2_000, 0);
    assert!(other.run_until(LONG, |h| h.failed(w)));
    assert!(
        other.proto.last_error().contains("queue key"),
        "{}",
        other.proto.last_error()
    );
}

#[test]
fn a_killed_subscriber_connection_is_replaced_and_waiters_still_wake() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut admin = server.conn();
    let mut holder = Host::new(server.port, 8, RedisOptions::default());
    let mut waiter = Host::new(server.port, 9, RedisOptions::default());
    subscribed(&mut holder);
    subscribed(&mut waiter);
    let held = holder.acquire("kill", 10_000, 0);
    assert!(holder.run_until(LONG, |h| h.take_acquired(held).is_some()));
    let w = waiter.acquire("kill", 10_000, 60_000);
    waiter.run_until(Duration::from_millis(100), |_| false);
    let killed = admin
        .call(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .unwrap()
        .int();
    assert_eq!(killed, 2);
    assert!(waiter.run_until(LONG, |h| h.proto.counters().subscriber_losses == 1));
    assert!(waiter.run_until(LONG, |h| h.proto.is_subscribed()));
    assert_eq!(waiter.proto.counters().subscriptions, 2);
    let released_at = now();
    holder.release(held);
    holder.run_until(LONG, |h| h.core.counters().pending_cleanups == 0);
    let mut got = None;
    assert!(waiter.run_until(LONG, |h| {
        got = h.take_acquired(w);
        got.is_some()
    }));
    let ms = (now() - released_at) / MS;
    eprintln!("after a killed subscriber, the waiter got the lock {ms} ms after the release");
    assert!(ms < 5_000, "woken, not left to its retry timer: {ms} ms");
}

#[test]
fn a_handoff_costs_two_script_calls_and_idle_waiters_none() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut admin = server.conn();
    const WAITERS: u8 = 8;
    let mut holder = Host::new(server.port, 20, RedisOptions::default());
    subscribed(&mut holder);
    // Load the scripts first: a NOSCRIPT'd EVALSHA counts as a call too.
    let warm = holder.acquire("warm-up", 10_000, 0);
    assert!(holder.run_until(LONG, |h| h.take_acquired(warm).is_some()));
    holder.release(warm);
    assert!(holder.run_until(LONG, |h| h.core.counters().pending_cleanups == 0));
    let held = holder.acquire("count", 10_000, 0);
    assert!(holder.run_until(LONG, |h| h.take_acquired(held).is_some()));
    let mut waiters: Vec<Host> = (0..WAITERS)
        .map(|i| Host::new(server.port, 30 + i, RedisOptions::default()))
        .collect();
    let mut leases = Vec::new();
    for w in &mut waiters {
        subscribed(w);
        leases.push(w.acquire("count", 10_000, 60_000));
        // Queue one after the other, and let the quick retries run out.
        w.run_until(Duration::from_millis(100), |_| false);
    }
    // Idle: two more seconds of waiting cost the waiters no call at all.
    let idle_before: u64 = waiters
        .iter()
        .map(|w| w.proto.counters().script_calls)
        .sum();
    let end = now() + 2_000 * MS;
    while now() < end {
        for w in &mut waiters {
            w.step(Duration::from_millis(1));
        }
    }
    let idle_calls: u64 = waiters
        .iter()
        .map(|w| w.proto.counters().script_calls)
        .sum::<u64>()
        - idle_before;
    assert_eq!(idle_calls, 0, "idle waiters sent script calls");
    let before = admin.calls("evalsha") + admin.calls("eval");
    holder.release(held);
    holder.run_until(LONG, |h| h.core.counters().pending_cleanups == 0);
    let mut fences = Vec::new();
    let mut done = vec![false; WAITERS as usize];
    let end = now() + 30_000 * MS;
    while done.iter().any(|d| !d) && now() < end {
        for (i, w) in waiters.iter_mut().enumerate() {
            w.step(Duration::ZERO);
            if let Some(f) = w.take_acquired(leases[i]) {
                fences.push(f);
                w.release(leases[i]);
                w.run_until(LONG, |h| h.core.counters().pending_cleanups == 0);
                done[i] = true;
            }
        }
    }
    assert_eq!(
        fences.len(),
        WAITERS as usize,
        "every waiter got the lock in turn"
    );
    assert!(fences.windows(2).all(|w| w[0] < w[1]));
    let calls = admin.calls("evalsha") + admin.calls("eval") - before;
    let handoffs = WAITERS as u64;
    eprintln!("{handoffs} handoffs cost {calls} script calls (the last RELEASE included)");
    assert!(
        calls <= 2 * handoffs + 1,
        "{calls} script calls for {handoffs} handoffs"
    );
    let takeovers: u64 = waiters
        .iter()
        .map(|w| w.proto.counters().standby_takeovers)
        .sum();
    assert_eq!(takeovers, 0, "no waiter was frozen here");
}

#[test]
fn idle_waiters_behind_the_head_of_a_short_lease_stay_quiet() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut holder = Host::new(server.port, 70, RedisOptions::default());
    subscribed(&mut holder);
    // A 1 s lease, renewed: the head waiter looks again about once a second (the holder may
    // have died); the waiters behind it wait to be woken, or 10 s.
    let held = holder.acquire("short", 1_000, 0);
    assert!(holder.run_until(LONG, |h| h.take_acquired(held).is_some()));
    let mut waiters: Vec<Host> = (0..4)
        .map(|i| Host::new(server.port, 71 + i, RedisOptions::default()))
        .collect();
    for w in &mut waiters {
        subscribed(w);
        w.acquire("short", 1_000, 60_000);
        w.step(Duration::from_millis(1));
    }
    let before: Vec<u64> = waiters
        .iter()
        .map(|w| w.proto.counters().script_calls)
        .collect();
    let end = now() + 3_000 * MS;
    while now() < end {
        holder.step(Duration::from_millis(1));
        for w in &mut waiters {
            w.step(Duration::ZERO);
        }
    }
    let calls: Vec<u64> = waiters
        .iter()
        .zip(&before)
        .map(|(w, b)| w.proto.counters().script_calls - b)
        .collect();
    eprintln!("script calls of 4 idle waiters over 3 s behind a renewed 1 s lease: {calls:?}");
    assert!(
        holder.core.is_held(held, now()).unwrap(),
        "the holder kept renewing"
    );
    assert!(calls[0] >= 1 && calls[0] <= 6, "the head: {calls:?}");
    assert_eq!(
        calls[1..].iter().sum::<u64>(),
        0,
        "waiters behind the head: {calls:?}"
    );
}

#[test]
fn several_leases_of_one_client_on_one_name_each_get_their_turn_quickly() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut admin = server.conn();
    const HOSTS: u8 = 2;
    const LEASES: usize = 8;
    const ROUNDS: usize = 8;
    const TTL_MS: u64 = 10_000;
    // Long enough that waiters run out of quick attempts and sleep until woken.
    const HOLD_MS: u64 = 5;
    let held = Arc::new(AtomicBool::new(false));
    let before = admin.calls("evalsha") + admin.calls("eval");
    let started = now();
    let threads: Vec<_> = (0..HOSTS)
        .map(|i| {
            let (held, port) = (held.clone(), server.port);
            std::thread::spawn(move || {
                let mut h = Host::new(port, 70 + i, RedisOptions::default());
                subscribed(&mut h);
                // Per lease slot: the live lease, when it asked, when it got the lock, rounds
                // done, when to ask again (0: asking or holding).
                let mut slots: Vec<(leasehold::LeaseId, u64, Option<u64>, usize, u64)> = (0
                    ..LEASES)
                    .map(|_| (h.acquire("crowd", TTL_MS, 60_000), now(), None, 0, 0))
                    .collect();
                let mut waits = Vec::new();
                let end = now() + 60_000 * MS;
                while slots.iter().any(|s| s.3 < ROUNDS || s.2.is_some()) && now() < end {
                    h.step(Duration::from_millis(1));
                    for s in &mut slots {
                        if s.3 == ROUNDS {
                            continue;
                        }
                        if s.4 != 0 {
                            if now() >= s.4 {
                                s.4 = 0;
                                s.0 = h.acquire("crowd", TTL_MS, 60_000);
                                s.1 = now();
                            }
                            continue;
                        }
                        match s.2 {
                            None => {
                                if h.take_acquired(s.0).is_some() {
                                    assert!(!held.swap(true, Ordering::SeqCst), "two holders");
                                    s.2 = Some(now());
                                    waits.push((now() - s.1) as f64 / MS as f64);
                                } else {
                                    assert!(!h.failed(s.0), "host {i}: a lease gave up");
                                }
                            }
                            Some(at) if now() - at >= HOLD_MS * MS => {
                                held.store(false, Ordering::SeqCst);
                                h.release(s.0);
                                s.2 = None;
                                s.3 += 1;
                                // Ask again after a pause, so the woken waiter is not
                                // barged out of its turn by the lease that just released.
                                s.4 = now() + HOLD_MS * MS;
                            }
                            Some(_) => {}
                        }
                    }
                }
                h.run_until(LONG, |h| h.core.counters().pending_cleanups == 0);
                let rounds: usize = slots.iter().map(|s| s.3).sum();
                (rounds, waits, h.proto.counters().script_calls)
            })
        })
        .collect();
    let mut waits = Vec::new();
    let mut sent = 0;
    for t in threads {
        let (rounds, w, calls) = t.join().unwrap();
        assert_eq!(
            rounds,
            LEASES * ROUNDS,
            "every lease got the lock every round"
        );
        waits.extend(w);
        sent += calls;
    }
    let total_ms = (now() - started) as f64 / MS as f64;
    waits.sort_by(f64::total_cmp);
    let grants = waits.len();
    let calls = admin.calls("evalsha") + admin.calls("eval") - before;
    eprintln!(
        "{HOSTS} clients x {LEASES} leases x {ROUNDS} rounds on one name: {grants} grants in \
         {total_ms:.0} ms; wait median {:.1} ms, max {:.1} ms (TTL {TTL_MS} ms); {calls} script \
         calls ({:.2} per grant)",
        waits[grants / 2],
        waits[grants - 1],
        calls as f64 / grants as f64
    );
    assert_eq!(grants, usize::from(HOSTS) * LEASES * ROUNDS);
    assert_eq!(calls, sent, "every call the hosts sent, no more");
    // A wake-up that reached the wrong lease left the right one asleep for the holder's TTL.
    assert!(
        waits[grants - 1] < 3_000.0,
        "a wait of {:.0} ms",
        waits[grants - 1]
    );
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

#[test]
fn status_reports_the_holder_its_time_left_and_the_last_fence() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut h = Host::new(server.port, 8, RedisOptions::default());
    subscribed(&mut h);
    let never = status(&mut h, "s").unwrap();
    assert_eq!(never, leasehold::backend::LockStatus::default());
    let lease = h.acquire("s", 30_000, 0);
    let mut fence = None;
    assert!(h.run_until(LONG, |h| {
        fence = h.take_acquired(lease);
        fence.is_some()
    }));
    let held = status(&mut h, "s").unwrap();
    assert!(held.held);
    assert_eq!(held.fencing_token, fence);
    assert_eq!(held.last_fencing_token, fence);
    assert!(
        held.remaining_ttl_ms
            .is_some_and(|ms| 0 < ms && ms <= 30_000)
    );
    h.release(lease);
    assert!(h.run_until(LONG, |h| {
        h.events
            .iter()
            .any(|e| matches!(e, Event::Released { lease: l } if *l == lease))
    }));
    let free = status(&mut h, "s").unwrap();
    assert!(!free.held && free.fencing_token.is_none());
    assert_eq!(free.last_fencing_token, fence);
    // Foreign keys of the same name: an error, never a made-up holder.
    let mut admin = server.conn();
    admin.call(&["SET", "lh:{foreign}", "x"]).unwrap();
    admin.call(&["HSET", "lh:{nofence}", "token", "t"]).unwrap();
    admin.call(&["PEXPIRE", "lh:{nofence}", "60000"]).unwrap();
    admin.call(&["LPUSH", "lh:{badfence}:fence", "x"]).unwrap();
    for name in ["foreign", "nofence", "badfence"] {
        let e = status(&mut h, name).unwrap_err();
        assert!(!e.is_empty(), "{name}");
    }
    assert!(status(&mut h, "foreign").unwrap_err().contains("lh: "));
    assert!(h.proto.request_status(now(), "").is_err());
}

#[test]
fn names_with_braces_lock_exclude_and_wake_on_one_slot() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut admin = server.conn();
    for sharded_wake in [false, true] {
        let opts = RedisOptions {
            sharded_wake,
            ..RedisOptions::default()
        };
        let mut a = Host::new(server.port, 61, opts);
        let mut b = Host::new(server.port, 62, opts);
        if !sharded_wake {
            subscribed(&mut a);
            subscribed(&mut b);
        }
        for name in ["}x", "{", "}", "a}b", "{}", "}{", "ünï}cødé{"] {
            let la = a.acquire(name, 60_000, 0);
            let mut fa = None;
            a.run_until(LONG, |h| {
                fa = h.take_acquired(la);
                fa.is_some() || h.failed(la)
            });
            let fa = fa.unwrap_or_else(|| panic!("{name:?}: free name not granted"));
            // Held: refused at once, then granted only through the release's wake-up (the
            // holder's TTL is far longer than the wait).
            assert_eq!(take(&mut b, name, 60_000, 0), None, "{name:?} is held");
            let lb = b.acquire(name, 60_000, 10_000);
            b.run_until(Duration::from_millis(300), |_| false);
            a.release(la);
            a.run_until(Duration::from_millis(100), |_| false);
            let mut fb = None;
            assert!(
                b.run_until(Duration::from_secs(5), |h| {
                    fb = h.take_acquired(lb);
                    fb.is_some()
                }),
                "{name:?} (sharded {sharded_wake}): the waiter was woken by the release"
            );
            assert!(fb.unwrap() > fa);
            b.release(lb);
            b.run_until(Duration::from_millis(50), |_| false);
            // The fence key is in the digest-tagged form, the plain empty tag is unused.
            let fence = leasehold::backend::redis::scripts::key(
                leasehold::backend::redis::KeyKind::Fence,
                name,
            )
            .unwrap();
            assert_eq!(admin.call(&[&b"EXISTS"[..], &fence]).unwrap().int(), 1);
        }
        let stray = admin.call(&["KEYS", "lh:{}*"]).unwrap();
        assert_eq!(stray, Owned::Array(Vec::new()));
    }
}

#[test]
fn a_planted_fence_at_its_limit_is_refused_and_nothing_is_written() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut admin = server.conn();
    let mut h = Host::new(server.port, 63, RedisOptions::default());
    subscribed(&mut h);
    // The last fence (2^53 - 1: Lua numbers are doubles) and values past it.
    for (name, planted, want) in [
        ("at", "9007199254740991", "exhausted"),
        ("past", "9007199254740992", "below 2^53"),
        ("max", "9223372036854775807", "below 2^53"),
    ] {
        let fence = format!("lh:{{{name}}}:fence");
        admin
            .call(&["SET", &fence, planted, "PX", "600000"])
            .unwrap();
        let before = admin.call(&["PTTL", &fence]).unwrap().int();
        assert_eq!(take(&mut h, name, 5_000, 0), None, "{name}");
        assert!(
            h.proto.last_error().contains(want),
            "{name}: {}",
            h.proto.last_error()
        );
        // Nothing written: the fence as planted (its TTL not renewed), no lock, no queue.
        assert_eq!(admin.call(&["GET", &fence]).unwrap().text(), planted);
        assert!(admin.call(&["PTTL", &fence]).unwrap().int() <= before);
        let lock = format!("lh:{{{name}}}");
        let queue = format!("lh:{{{name}}}:queue");
        assert_eq!(admin.call(&["EXISTS", &lock, &queue]).unwrap().int(), 0);
        // Recovery: delete the fence key; fences restart from the server clock.
        admin.call(&["DEL", &fence]).unwrap();
        let f = take(&mut h, name, 5_000, 0).expect("granted after the recovery");
        assert!(f < 1 << 53);
    }
}

/// Steps every host in turn (a few ms each) until `done` holds or `limit` passes.
fn run_all(
    hosts: &mut [&mut Host],
    limit: Duration,
    mut done: impl FnMut(&mut [&mut Host]) -> bool,
) -> bool {
    let end = now() + limit.as_nanos() as u64;
    while now() < end {
        if done(hosts) {
            return true;
        }
        for h in hosts.iter_mut() {
            h.step(Duration::from_millis(2));
        }
    }
    done(hosts)
}

#[test]
fn a_holder_frozen_after_handoffs_is_taken_over_at_its_expiry() {
    let Some(server) = Server::start() else {
        return;
    };
    const TTL: u64 = 1_000;
    let opts = RedisOptions::default();
    let name = "frozen-after-handoff";
    let mut a = Host::new(server.port, 81, opts);
    let mut b = Host::new(server.port, 82, opts);
    let mut c = Host::new(server.port, 83, opts);
    let mut d = Host::new(server.port, 84, opts);
    for h in [&mut a, &mut b, &mut c, &mut d] {
        subscribed(h);
    }
    let la = a.acquire(name, TTL, 0);
    assert!(a.run_until(LONG, |h| h.take_acquired(la).is_some()));
    // B, C and D queue in that order: C and D are behind the head, so their refusals tell
    // them to look again only after idle_recheck_ms (10 s).
    let lb = b.acquire(name, TTL, 10_000);
    b.run_until(Duration::from_millis(50), |_| false);
    let lc = c.acquire(name, TTL, 10_000);
    c.run_until(Duration::from_millis(50), |_| false);
    let ld = d.acquire(name, TTL, 10_000);
    d.run_until(Duration::from_millis(50), |_| false);
    // A hands over to B (a release wakes the head); C and D hear the grant. B's grant is
    // made after `released_at` and seen at `granted_at`: its expiry lies between them + TTL.
    let released_at = now();
    a.release(la);
    let mut granted_at = 0;
    assert!(run_all(&mut [&mut a, &mut b, &mut c, &mut d], LONG, |hs| {
        if granted_at == 0 && hs[1].take_acquired(lb).is_some() {
            granted_at = now();
        }
        granted_at != 0
    }));
    // B freezes holding the lock: it never runs again (no renewal, no release).
    let mut got = None;
    assert!(
        run_all(&mut [&mut c, &mut d], Duration::from_secs(8), |hs| {
            got = hs[0]
                .take_acquired(lc)
                .map(|f| ('c', f))
                .or_else(|| hs[1].take_acquired(ld).map(|f| ('d', f)));
            got.is_some()
        }),
        "nobody took over from the frozen holder within 8 s"
    );
    let taken_at = now();
    let after_ms = (taken_at - granted_at) / MS;
    eprintln!(
        "a holder frozen after a handoff was taken over {after_ms} ms after its grant ({got:?})"
    );
    // Never before its grant ran out; the waiter looks again then (plus scheduling slack).
    assert!((taken_at - released_at) / MS >= TTL, "{after_ms} ms");
    assert!(after_ms < TTL + 700, "{after_ms} ms");
}

#[test]
fn a_waiter_that_gives_up_at_the_head_hands_the_holders_expiry_to_the_next() {
    let Some(server) = Server::start() else {
        return;
    };
    const TTL: u64 = 1_000;
    let opts = RedisOptions::default();
    let name = "head-gives-up";
    let mut a = Host::new(server.port, 91, opts);
    let mut b = Host::new(server.port, 92, opts);
    let mut c = Host::new(server.port, 93, opts);
    for h in [&mut a, &mut b, &mut c] {
        subscribed(h);
    }
    let asked_at = now();
    let la = a.acquire(name, TTL, 0);
    assert!(a.run_until(LONG, |h| h.take_acquired(la).is_some()));
    let granted_at = now();
    // A freezes from here on. B queues at the head with a short wait; C behind it, told by
    // its refusal to look again only after idle_recheck_ms (10 s).
    let lb = b.acquire(name, TTL, 300);
    b.run_until(Duration::from_millis(50), |_| false);
    let lc = c.acquire(name, TTL, 10_000);
    c.run_until(Duration::from_millis(50), |_| false);
    // B gives up: its entry leaves the queue and C learns when A's grant runs out.
    assert!(b.run_until(LONG, |h| h.failed(lb)));
    let mut got = None;
    assert!(
        run_all(&mut [&mut b, &mut c], Duration::from_secs(8), |hs| {
            got = hs[1].take_acquired(lc);
            got.is_some()
        }),
        "the waiter left behind the one that gave up did not take over within 8 s"
    );
    let taken_at = now();
    let after_ms = (taken_at - granted_at) / MS;
    eprintln!(
        "after the head gave up, the next waiter took over {after_ms} ms after the frozen holder's grant"
    );
    assert!((taken_at - asked_at) / MS >= TTL, "{after_ms} ms");
    assert!(after_ms < TTL + 700, "{after_ms} ms");
}

/// Every command the server ran since the last `CONFIG RESETSTAT` (a script's `redis.call`s
/// included), per command, without the stats' own INFO and CONFIG RESETSTAT.
fn commands_since_reset(admin: &mut support::resp::Resp) -> Vec<(String, u64)> {
    let info = admin.call(&["INFO", "commandstats"]).unwrap().text();
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (cmd, rest) = l.split_once(":calls=")?;
            let n = rest.split(',').next()?.parse().ok()?;
            Some((cmd.to_string(), n))
        })
        .filter(|(cmd, _)| cmd != "info" && cmd != "config|resetstat")
        .collect()
}

#[test]
fn an_uncontended_acquire_and_release_cost_at_most_8_server_commands() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut admin = server.conn();
    let mut h = Host::new(server.port, 95, RedisOptions::default());
    subscribed(&mut h);
    // Load the scripts first: a NOSCRIPT'd EVALSHA and its EVAL are one-off costs.
    let warm = h.acquire("warm-up", 10_000, 0);
    assert!(h.run_until(LONG, |h| h.take_acquired(warm).is_some()));
    h.release(warm);
    assert!(h.run_until(LONG, |h| h.core.counters().pending_cleanups == 0));
    let mut last = 0;
    // The first round mints the name's fence key; the next ones find it (the steady state).
    for case in ["no fence key yet", "fence key present", "fence key present"] {
        assert_eq!(admin.call(&["CONFIG", "RESETSTAT"]).unwrap().text(), "OK");
        let lease = h.acquire("uncontended", 10_000, 0);
        let mut fence = None;
        assert!(h.run_until(LONG, |h| {
            fence = h.take_acquired(lease);
            fence.is_some()
        }));
        let fence = fence.unwrap();
        assert!(fence > last, "fences increase: {fence} after {last}");
        last = fence;
        h.release(lease);
        assert!(h.run_until(LONG, |h| h.core.counters().pending_cleanups == 0));
        let stats = commands_since_reset(&mut admin);
        let total: u64 = stats.iter().map(|(_, n)| n).sum();
        let breakdown: Vec<String> = stats.iter().map(|(c, n)| format!("{c} {n}")).collect();
        eprintln!(
            "uncontended acquire + release, {case}: {total} server commands ({})",
            breakdown.join(", ")
        );
        assert_eq!(
            stats.iter().find(|(c, _)| c == "evalsha").map(|(_, n)| *n),
            Some(2),
            "two script calls: {breakdown:?}"
        );
        assert!(total <= 8, "{total} commands: {breakdown:?}");
    }
}

#[test]
fn a_fence_key_of_another_type_is_refused_and_nothing_is_written() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut admin = server.conn();
    admin.call(&["RPUSH", "lh:{fl}:fence", "x"]).unwrap();
    let mut h = Host::new(server.port, 96, RedisOptions::default());
    subscribed(&mut h);
    assert_eq!(take(&mut h, "fl", 5_000, 0), None);
    assert!(
        h.proto.last_error().contains("fence key"),
        "{}",
        h.proto.last_error()
    );
    // The lock written before the fence's type showed was taken back; the list is as it was.
    assert_eq!(admin.call(&["EXISTS", "lh:{fl}"]).unwrap().int(), 0);
    assert_eq!(admin.call(&["LLEN", "lh:{fl}:fence"]).unwrap().int(), 1);
}

#[test]
fn a_lock_of_queue_protocol_6_is_held_until_it_expires() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut admin = server.conn();
    // An older client's lock: a hash {token, fence} with the lease's expiry.
    admin
        .call(&["HSET", "lh:{old}", "token", "older", "fence", "5"])
        .unwrap();
    admin.call(&["PEXPIRE", "lh:{old}", "800"]).unwrap();
    let mut h = Host::new(server.port, 97, RedisOptions::default());
    subscribed(&mut h);
    let st = status(&mut h, "old").unwrap();
    assert!(st.held && st.fencing_token == Some(5), "{st:?}");
    // Never this client's: RENEW and RELEASE answer "not the owner" and change nothing.
    use leasehold::backend::redis::scripts::{RELEASE_SCRIPT, RENEW_SCRIPT};
    let renew = admin.call(&["EVAL", RENEW_SCRIPT, "1", "lh:{old}", "older", "60000"]);
    assert_eq!(renew.unwrap().int(), 0);
    let release = admin.call(&[
        "EVAL",
        RELEASE_SCRIPT,
        "2",
        "lh:{old}",
        "lh:{old}:queue",
        "older",
        "old",
        "1000",
    ]);
    assert_eq!(release.unwrap().int(), 0);
    assert!(admin.call(&["PTTL", "lh:{old}"]).unwrap().int() <= 800);
    let lease = h.acquire("old", 5_000, 10_000);
    h.run_until(Duration::from_millis(300), |_| false);
    assert!(h.take_acquired(lease).is_none(), "granted over a held lock");
    // Queued behind it, and the hash left as it was.
    assert_eq!(admin.call(&["ZCARD", "lh:{old}:queue"]).unwrap().int(), 1);
    assert_eq!(
        admin.call(&["HGET", "lh:{old}", "token"]).unwrap().text(),
        "older"
    );
    let mut fence = None;
    assert!(h.run_until(LONG, |h| {
        fence = h.take_acquired(lease);
        fence.is_some()
    }));
    assert!(fence.unwrap() > 5);
    assert_eq!(admin.call(&["ZCARD", "lh:{old}:queue"]).unwrap().int(), 0);
}

#[test]
fn a_queueing_refusal_marks_the_lock_so_its_release_wakes_the_queue() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut admin = server.conn();
    let mut holder = Host::new(server.port, 98, RedisOptions::default());
    let mut waiter = Host::new(server.port, 99, RedisOptions::default());
    subscribed(&mut holder);
    subscribed(&mut waiter);
    let held = holder.acquire("mark", 10_000, 0);
    let mut fence = None;
    assert!(holder.run_until(LONG, |h| {
        fence = h.take_acquired(held);
        fence.is_some()
    }));
    let value = |admin: &mut support::resp::Resp| admin.call(&["GET", "lh:{mark}"]).unwrap().text();
    let v = value(&mut admin);
    let token = v.rsplit(' ').next().unwrap().to_string();
    assert_eq!(
        v,
        format!("{} 0 {token}", fence.unwrap()),
        "unmarked: nobody queued"
    );
    let lease = waiter.acquire("mark", 10_000, 30_000);
    waiter.run_until(Duration::from_millis(100), |_| false);
    assert_eq!(value(&mut admin), format!("{} 1 {token}", fence.unwrap()));
    let pttl = admin.call(&["PTTL", "lh:{mark}"]).unwrap().int();
    assert!(pttl > 9_000, "the mark keeps the lease's expiry: {pttl}");
    let released = now();
    holder.release(held);
    assert!(holder.run_until(LONG, |h| h.core.counters().pending_cleanups == 0));
    let mut got = None;
    assert!(waiter.run_until(LONG, |h| {
        got = h.take_acquired(lease);
        got.is_some()
    }));
    let ms = (now() - released) / MS;
    assert!(ms < 2_000, "woken by the release, not its retry: {ms} ms");
    // The woken lease's grant (not a first attempt) is marked: a later waiter may be queued.
    let v = value(&mut admin);
    assert!(
        v.starts_with(&format!("{} 1 ", got.unwrap())) && !v.ends_with(&token),
        "{v}"
    );
}
