//! One test (or a few) per lease rule of docs/design.md §3, and per kind of bad input.
//! Every test drives the public API exactly as a host would.

use std::sync::Arc;

use leasehold::{
    AcquireFailReason, AcquireOptions, AcquireResult, Client, Command, Config, Error, Event,
    LeaseId, LeaseState, LostReason, Output, ReleaseOutcome, ReleaseResult, Releasing, RenewResult,
    RequestId, Token,
};

const MS: u64 = 1_000_000;
const SEED: [u8; 32] = [42; 32];

fn client() -> Client {
    Client::new(Config::default(), &SEED).unwrap()
}

fn drain(c: &mut Client) -> Vec<Output> {
    std::iter::from_fn(|| c.poll_output()).collect()
}

fn commands(out: &[Output]) -> Vec<Command> {
    out.iter()
        .filter_map(|o| match o {
            Output::Command(c) => Some(c.clone()),
            Output::Event(_) => None,
        })
        .collect()
}

fn events(out: &[Output]) -> Vec<Event> {
    out.iter()
        .filter_map(|o| match o {
            Output::Event(e) => Some(*e),
            Output::Command(_) => None,
        })
        .collect()
}

fn acquire_req(out: &[Output]) -> (RequestId, Token) {
    for c in commands(out) {
        if let Command::Acquire { request, token, .. } = c {
            return (request, token);
        }
    }
    panic!("no Acquire command in {out:?}")
}

fn renew_req(out: &[Output]) -> Option<RequestId> {
    commands(out).into_iter().find_map(|c| match c {
        Command::Renew { request, .. } => Some(request),
        _ => None,
    })
}

fn release_req(out: &[Output]) -> Option<(RequestId, Token)> {
    commands(out).into_iter().find_map(|c| match c {
        Command::Release { request, token, .. } => Some((request, token)),
        _ => None,
    })
}

fn grant(fence: u64, ttl_ms: u64) -> AcquireResult<'static> {
    AcquireResult::Granted {
        fencing_token: fence,
        ttl_ms,
        backend_data: &[],
    }
}

/// A 3 s grant carrying backend (ownership) data, as an etcd or ZooKeeper transport returns.
fn grant_with(fence: u64, data: &'static [u8]) -> AcquireResult<'static> {
    AcquireResult::Granted {
        fencing_token: fence,
        ttl_ms: 3_000,
        backend_data: data,
    }
}

/// Acquires `name` at t=0 and grants it at `t_grant`; returns the lease.
fn held(c: &mut Client, name: &str, ttl_ms: u64, t_grant: u64) -> LeaseId {
    let lease = c.acquire(0, name, AcquireOptions::new(ttl_ms)).unwrap();
    let out = drain(c);
    let (req, _) = acquire_req(&out);
    c.handle_acquire_result(t_grant, req, grant(7, ttl_ms))
        .unwrap();
    let out = drain(c);
    assert!(
        matches!(events(&out)[..], [Event::Acquired { .. }]),
        "{out:?}"
    );
    lease
}

/// Runs timeouts until the next command appears (or `limit` passes); returns outputs and time.
fn run_until_output(c: &mut Client, limit: u64) -> (Vec<Output>, u64) {
    loop {
        let Some(d) = c.poll_timeout() else {
            return (vec![], c.now());
        };
        if d > limit {
            return (vec![], c.now());
        }
        c.handle_timeout(d);
        let out = drain(c);
        if !out.is_empty() {
            return (out, d);
        }
    }
}

/// A client with a 500 ms request timeout whose lease `a` has had its first acquire attempt
/// time out (superseded, still possibly in flight) and a second attempt sent.
/// Returns the client, the lease, both request ids and the time the second was sent.
fn superseded_attempts(wait_ns: u64) -> (Client, LeaseId, RequestId, RequestId, u64) {
    let cfg = Config {
        request_timeout_ns: 500 * MS,
        ..Config::default()
    };
    let mut c = Client::new(cfg, &SEED).unwrap();
    let lease = c
        .acquire(0, "a", AcquireOptions::new(3_000).wait_ns(wait_ns))
        .unwrap();
    let (r1, _) = acquire_req(&drain(&mut c));
    let (out, t) = run_until_output(&mut c, u64::MAX);
    let (r2, _) = acquire_req(&out);
    assert_ne!(r1, r2);
    (c, lease, r1, r2, t)
}

/// The outputs are exactly one Release command, carrying `data` as its backend data.
fn assert_single_release_with(out: &[Output], data: &[u8]) {
    match &commands(out)[..] {
        [
            Command::Release {
                backend_data: Some(d),
                ..
            },
        ] => assert_eq!(&**d, data),
        other => panic!("expected one Release carrying {data:?}, got {other:?}"),
    }
}

fn terminal_events(evs: &[Event], lease: LeaseId) -> usize {
    evs.iter()
        .filter(|e| match e {
            Event::AcquireFailed { lease: l, .. }
            | Event::Lost { lease: l, .. }
            | Event::Released { lease: l } => *l == lease,
            Event::Acquired { .. } | Event::Renewed { .. } | Event::ReleaseOutcome { .. } => false,
        })
        .count()
}

// ------------------------------------------------------------------ rule 1: sticky terminals

#[test]
fn rule1_terminal_states_are_sticky() {
    let mut c = client();
    let lease = held(&mut c, "a", 3_000, MS);
    let (out, _) = run_until_output(&mut c, u64::MAX);
    let renew = renew_req(&out).unwrap();
    c.handle_renew_result(c.now() + MS, renew, RenewResult::Rejected)
        .unwrap();
    let out = drain(&mut c);
    assert_eq!(
        events(&out),
        vec![Event::Lost {
            lease,
            reason: LostReason::Rejected
        }]
    );
    // A duplicate answer, a late success, a timeout: nothing revives it.
    c.handle_renew_result(c.now() + MS, renew, RenewResult::Renewed)
        .unwrap();
    c.handle_timeout(c.now() + 10_000 * MS);
    let out = drain(&mut c);
    assert_eq!(terminal_events(&events(&out), lease), 0);
    assert!(!c.is_held(lease, c.now()).unwrap_or(false));
    assert!(matches!(
        c.release(c.now(), lease),
        Err(Error::LeaseEnded(_))
    ));
    assert_eq!(c.counters().stale_results, 1);
}

/// A shared server-side lease found gone through another lease: this one is lost at once,
/// exactly once; a renewal already in flight is then stale, and nothing sends a release.
#[test]
fn rule1_a_revoked_grant_is_lost_once_and_later_answers_are_stale() {
    let mut c = client();
    let lease = held(&mut c, "a", 3_000, MS);
    let (out, _) = run_until_output(&mut c, u64::MAX);
    let renew = renew_req(&out).unwrap();
    assert!(c.handle_revoked(c.now() + MS, lease).unwrap());
    let out = drain(&mut c);
    assert_eq!(
        events(&out),
        vec![Event::Lost {
            lease,
            reason: LostReason::Rejected
        }]
    );
    assert!(commands(&out).is_empty());
    assert!(!c.handle_revoked(c.now() + MS, lease).unwrap());
    c.handle_renew_result(c.now() + MS, renew, RenewResult::Renewed)
        .unwrap();
    assert_eq!(terminal_events(&events(&drain(&mut c)), lease), 0);
    assert_eq!(c.counters().lost_rejected, 1);
    // An acquiring lease is not touched.
    let waiting = c.acquire(c.now(), "b", AcquireOptions::new(3_000)).unwrap();
    drain(&mut c);
    assert!(!c.handle_revoked(c.now(), waiting).unwrap());
    assert_eq!(c.lease_state(waiting).unwrap(), LeaseState::Acquiring);
}

#[test]
fn rule1_exactly_one_terminal_event_on_release_after_loss_race() {
    let mut c = client();
    let lease = held(&mut c, "a", 300, MS);
    // No renewal answer ever: the lease expires locally; a later release is an error.
    c.handle_timeout(10_000 * MS);
    let out = drain(&mut c);
    assert_eq!(terminal_events(&events(&out), lease), 1);
    assert!(c.release(10_001 * MS, lease).is_err());
    assert_eq!(terminal_events(&events(&drain(&mut c)), lease), 0);
}

// ------------------------------------------------------------------ rule 2: validity from send

#[test]
fn rule2_validity_counts_from_send_time_minus_drift() {
    let mut c = client();
    let lease = c
        .acquire(100 * MS, "a", AcquireOptions::new(10_000))
        .unwrap();
    let (req, _) = acquire_req(&drain(&mut c));
    // The answer takes 900 ms: validity must still start at the send time (100 ms).
    c.handle_acquire_result(1_000 * MS, req, grant(1, 10_000))
        .unwrap();
    let drift = 10_000 * MS / 100 + 2 * MS;
    let expected = 100 * MS + 10_000 * MS - drift;
    assert_eq!(c.valid_until(lease).unwrap(), Some(expected));
    let ev = events(&drain(&mut c));
    assert_eq!(
        ev,
        vec![Event::Acquired {
            lease,
            fencing_token: 1,
            valid_until: expected
        }]
    );
}

#[test]
fn rule2_granted_ttl_below_request_is_honoured_and_drift_is_configurable() {
    let cfg = Config {
        drift_ppm: 50_000,
        drift_fixed_ns: 5 * MS,
        ..Config::default()
    };
    let mut c = Client::new(cfg, &SEED).unwrap();
    let lease = c.acquire(0, "a", AcquireOptions::new(10_000)).unwrap();
    let (req, _) = acquire_req(&drain(&mut c));
    c.handle_acquire_result(MS, req, grant(1, 4_000)).unwrap();
    let expected = 4_000 * MS - (4_000 * MS / 20 + 5 * MS);
    assert_eq!(c.valid_until(lease).unwrap(), Some(expected));
}

#[test]
fn rule2_renewal_moves_validity_to_renew_send_time() {
    let mut c = client();
    let lease = held(&mut c, "a", 3_000, MS);
    let (out, t_sent) = run_until_output(&mut c, u64::MAX);
    let req = renew_req(&out).unwrap();
    c.handle_renew_result(t_sent + 500 * MS, req, RenewResult::Renewed)
        .unwrap();
    let drift = 3_000 * MS / 100 + 2 * MS;
    assert_eq!(
        c.valid_until(lease).unwrap(),
        Some(t_sent + 3_000 * MS - drift)
    );
}

#[test]
fn grant_that_arrives_after_its_validity_is_not_reported_as_acquired() {
    let mut c = client();
    let lease = c.acquire(0, "a", AcquireOptions::new(100)).unwrap();
    let (req, _) = acquire_req(&drain(&mut c));
    // Answer arrives after the whole TTL: no validity left → never Acquired.
    c.handle_acquire_result(150 * MS, req, grant(1, 100))
        .unwrap();
    let out = drain(&mut c);
    assert!(
        events(&out)
            .iter()
            .all(|e| !matches!(e, Event::Acquired { .. })),
        "{out:?}"
    );
    assert_eq!(
        events(&out),
        vec![Event::AcquireFailed {
            lease,
            reason: AcquireFailReason::Unavailable
        }]
    );
    // …and the grant, which is ours at the service, is released.
    assert!(release_req(&out).is_some());
}

// ------------------------------------------------------------------ rule 3: local loss detection

#[test]
fn rule3_loss_detected_at_valid_until_without_any_response() {
    let mut c = client();
    let lease = held(&mut c, "a", 3_000, MS);
    let valid_until = c.valid_until(lease).unwrap().unwrap();
    // Renewals are sent but never answered. Drive the loop by deadlines only.
    let mut lost_at = None;
    while lost_at.is_none() {
        let d = c
            .poll_timeout()
            .expect("a held lease always has a deadline");
        assert!(
            d <= valid_until,
            "deadline {d} beyond validity {valid_until}"
        );
        assert!(c.is_held(lease, d.saturating_sub(1)).unwrap() || d == valid_until);
        c.handle_timeout(d);
        for e in events(&drain(&mut c)) {
            if let Event::Lost { reason, .. } = e {
                lost_at = Some((d, reason));
            }
        }
    }
    let (t, reason) = lost_at.unwrap();
    assert!(t <= valid_until);
    assert!(matches!(
        reason,
        LostReason::Expired | LostReason::FailBudget
    ));
    assert!(!c.is_held(lease, t).unwrap_or(false));
}

#[test]
fn rule3_after_a_long_pause_loss_comes_before_any_renew() {
    let mut c = client();
    let lease = held(&mut c, "a", 3_000, MS);
    // The process was paused for a minute: the first input after waking is a late timeout.
    c.handle_timeout(60_000 * MS);
    let out = drain(&mut c);
    assert!(
        renew_req(&out).is_none(),
        "a paused process must not renew first: {out:?}"
    );
    assert_eq!(
        events(&out),
        vec![Event::Lost {
            lease,
            reason: LostReason::Expired
        }]
    );
}

#[test]
fn rule3_renew_answer_after_pause_is_not_believed() {
    let mut c = client();
    let lease = held(&mut c, "a", 3_000, MS);
    let (out, _) = run_until_output(&mut c, u64::MAX);
    let req = renew_req(&out).unwrap();
    // The answer arrives after a pause longer than the validity: loss first, answer stale.
    c.handle_renew_result(60_000 * MS, req, RenewResult::Renewed)
        .unwrap();
    let out = drain(&mut c);
    assert_eq!(
        events(&out),
        vec![Event::Lost {
            lease,
            reason: LostReason::Expired
        }]
    );
    assert_eq!(c.counters().stale_results, 1);
}

// ------------------------------------------------------------------ rule 4: renewal cadence

#[test]
fn rule4_renew_cadence_is_a_third_of_ttl_with_bounded_jitter() {
    let mut seen = Vec::new();
    for seed in 0..50u8 {
        let mut c = Client::new(Config::default(), &[seed; 16]).unwrap();
        let _lease = held(&mut c, "a", 3_000, 0);
        let (out, t) = run_until_output(&mut c, u64::MAX);
        assert!(renew_req(&out).is_some());
        // Sent at t=0: renew at 1000 ms ± 10%.
        assert!((900 * MS..=1_100 * MS).contains(&t), "renew at {t}");
        seen.push(t);
    }
    seen.sort_unstable();
    seen.dedup();
    assert!(seen.len() > 10, "jitter must vary with the seed: {seen:?}");
}

#[test]
fn rule4_at_most_one_renew_in_flight_and_per_request_timeout() {
    let mut c = client();
    let lease = held(&mut c, "a", 3_000, 0);
    let (out, t1) = run_until_output(&mut c, u64::MAX);
    assert_eq!(commands(&out).len(), 1);
    // Before the request timeout (min(2 s, TTL/3) = 1 s) nothing else is sent.
    c.handle_timeout(t1 + 999 * MS);
    assert!(drain(&mut c).is_empty());
    // At t1 + TTL/3 (the renew timeout: min(2 s, TTL/3)) the attempt counts as failed and
    // a retry follows promptly (within TTL/10).
    c.handle_timeout(t1 + 1_000 * MS);
    assert!(renew_req(&drain(&mut c)).is_none());
    assert_eq!(c.counters().renewals_failed, 1);
    let (out, t3) = run_until_output(&mut c, u64::MAX);
    assert!(renew_req(&out).is_some(), "{out:?}");
    assert!(
        t3 - (t1 + 1_000 * MS) <= 300 * MS,
        "retry should be prompt (≤ TTL/10)"
    );
    assert_eq!(c.counters().renewals_failed, 1);
    assert!(c.is_held(lease, t3).unwrap());
}

#[test]
fn rule4_transport_failures_exhaust_the_budget() {
    let cfg = Config {
        fail_budget: 2,
        ..Config::default()
    };
    let mut c = Client::new(cfg, &SEED).unwrap();
    let lease = held(&mut c, "a", 30_000, 0);
    let (out, t) = run_until_output(&mut c, u64::MAX);
    c.handle_renew_result(
        t + MS,
        renew_req(&out).unwrap(),
        RenewResult::TransportError,
    )
    .unwrap();
    assert!(
        events(&drain(&mut c)).is_empty(),
        "one failure is within budget"
    );
    let (out, t) = run_until_output(&mut c, u64::MAX);
    c.handle_renew_result(
        t + MS,
        renew_req(&out).unwrap(),
        RenewResult::TransportError,
    )
    .unwrap();
    let out = drain(&mut c);
    assert_eq!(
        events(&out),
        vec![Event::Lost {
            lease,
            reason: LostReason::FailBudget
        }]
    );
    assert_eq!(c.counters().lost_fail_budget, 1);
}

#[test]
fn rule4_success_resets_the_failure_budget() {
    let cfg = Config {
        fail_budget: 2,
        ..Config::default()
    };
    let mut c = Client::new(cfg, &SEED).unwrap();
    let lease = held(&mut c, "a", 30_000, 0);
    for _ in 0..5 {
        let (out, t) = run_until_output(&mut c, u64::MAX);
        c.handle_renew_result(
            t + MS,
            renew_req(&out).unwrap(),
            RenewResult::TransportError,
        )
        .unwrap();
        let (out, t) = run_until_output(&mut c, u64::MAX);
        c.handle_renew_result(t + MS, renew_req(&out).unwrap(), RenewResult::Renewed)
            .unwrap();
        assert!(events(&drain(&mut c)).is_empty());
    }
    assert_eq!(c.lease_state(lease).unwrap(), LeaseState::Held);
}

#[test]
fn rule4_rejection_loses_at_once() {
    let mut c = client();
    let lease = held(&mut c, "a", 3_000, 0);
    let (out, t) = run_until_output(&mut c, u64::MAX);
    c.handle_renew_result(t + MS, renew_req(&out).unwrap(), RenewResult::Rejected)
        .unwrap();
    let out = drain(&mut c);
    assert_eq!(
        events(&out),
        vec![Event::Lost {
            lease,
            reason: LostReason::Rejected
        }]
    );
    // A rejection means the service holds nothing of ours: no cleanup release needed.
    assert!(release_req(&out).is_none());
}

// ------------------------------------- rule 4: the time budget (fail_budget = 0, the default)

/// Answers every renewal with a transport error until `until`, then with `Renewed`; returns
/// the outputs of the last answer and the number of failures.
fn renewals_fail_until(c: &mut Client, until: u64, limit: u64) -> (Vec<Output>, u32) {
    let mut failures = 0;
    loop {
        let (out, t) = run_until_output(c, limit);
        let Some(req) = renew_req(&out) else {
            return (out, failures);
        };
        if t < until {
            failures += 1;
            c.handle_renew_result(t + MS, req, RenewResult::TransportError)
                .unwrap();
            let out = drain(c);
            if !events(&out).is_empty() {
                return (out, failures);
            }
        } else {
            c.handle_renew_result(t + MS, req, RenewResult::Renewed)
                .unwrap();
            return (drain(c), failures);
        }
    }
}

#[test]
fn rule4_time_budget_a_30s_lease_survives_a_3s_outage() {
    let mut c = client();
    assert_eq!(Config::default().fail_budget, 0);
    let lease = held(&mut c, "a", 30_000, MS);
    // The first renewal comes due at about 10 s; the service is unreachable until 13 s.
    let first = c.poll_timeout().unwrap();
    let (out, failures) = renewals_fail_until(&mut c, first + 3_000 * MS, u64::MAX);
    assert!(
        failures > 3,
        "retried through the outage ({failures} failures)"
    );
    assert!(events(&out).is_empty(), "{out:?}");
    assert!(c.is_held(lease, c.now()).unwrap());
    let until = c.valid_until(lease).unwrap().unwrap();
    assert!(
        until > first + 3_000 * MS + 20_000 * MS,
        "validity extended: {until}"
    );
    assert_eq!(c.counters().lost_fail_budget + c.counters().lost_expired, 0);
}

#[test]
fn rule4_time_budget_a_lease_whose_service_never_returns_is_lost_before_valid_until() {
    let mut c = client();
    let lease = held(&mut c, "a", 30_000, 0);
    let valid_until = c.valid_until(lease).unwrap().unwrap();
    let (out, failures) = renewals_fail_until(&mut c, u64::MAX, u64::MAX);
    assert!(failures > 3, "{failures} failures");
    assert_eq!(
        events(&out),
        vec![Event::Lost {
            lease,
            reason: LostReason::FailBudget
        }]
    );
    // Declared before valid_until (a retry would have left less than one step), never after.
    assert!(c.now() < valid_until, "{} vs {valid_until}", c.now());
    assert!(c.now() + 3_000 * MS * 2 >= valid_until, "not long before");
    assert_eq!(c.counters().lost_fail_budget, 1);
}

#[test]
fn rule4_time_budget_a_hanging_service_loses_the_lease_by_valid_until() {
    let mut c = client();
    let lease = held(&mut c, "a", 30_000, 0);
    let valid_until = c.valid_until(lease).unwrap().unwrap();
    // No renewal is ever answered: each times out and is retried.
    let mut renewals = 0;
    let lost_at = loop {
        let (out, t) = run_until_output(&mut c, u64::MAX);
        renewals += commands(&out).len();
        if !events(&out).is_empty() {
            assert_eq!(terminal_events(&events(&out), lease), 1);
            break t;
        }
    };
    assert!(renewals > 3, "{renewals} renewals");
    assert!(
        lost_at <= valid_until,
        "lost at {lost_at}, valid until {valid_until}"
    );
}

// ------------------------------------------------------------------ manual renewal

#[test]
fn manual_renew_sends_now_and_reports_the_new_validity() {
    let mut c = client();
    let lease = held(&mut c, "a", 30_000, MS);
    c.renew(2_000 * MS, lease).unwrap();
    let out = drain(&mut c);
    let req = renew_req(&out).expect("a renewal is sent at once");
    assert_eq!(commands(&out).len(), 1);
    c.handle_renew_result(2_100 * MS, req, RenewResult::Renewed)
        .unwrap();
    // Counted from the send time (2 s), minus the drift margin (1% + 2 ms).
    let valid_until = 2_000 * MS + 30_000 * MS - 302 * MS;
    assert_eq!(
        events(&drain(&mut c)),
        vec![Event::Renewed { lease, valid_until }]
    );
    assert_eq!(c.valid_until(lease).unwrap(), Some(valid_until));
    assert_eq!(c.counters().renewals_requested, 1);
}

#[test]
fn manual_renew_joins_the_renewal_in_flight() {
    let mut c = client();
    let lease = held(&mut c, "a", 3_000, 0);
    let (out, t) = run_until_output(&mut c, u64::MAX);
    let req = renew_req(&out).unwrap();
    c.renew(t + MS, lease).unwrap();
    assert!(drain(&mut c).is_empty(), "joins, sends nothing");
    c.handle_renew_result(t + 2 * MS, req, RenewResult::Renewed)
        .unwrap();
    let valid_until = t + 3_000 * MS - 32 * MS;
    assert_eq!(
        events(&drain(&mut c)),
        vec![Event::Renewed { lease, valid_until }]
    );
}

#[test]
fn automatic_renewals_report_nothing() {
    let mut c = client();
    held(&mut c, "a", 3_000, 0);
    let (out, t) = run_until_output(&mut c, u64::MAX);
    c.handle_renew_result(t + MS, renew_req(&out).unwrap(), RenewResult::Renewed)
        .unwrap();
    assert!(drain(&mut c).is_empty());
}

#[test]
fn manual_renew_of_an_ended_or_acquiring_lease_fails_fast_and_sends_nothing() {
    let mut c = client();
    let released = held(&mut c, "a", 3_000, MS);
    c.release(2 * MS, released).unwrap();
    drain(&mut c);
    let sent = c.counters();
    assert_eq!(c.renew(3 * MS, released), Err(Error::LeaseEnded(released)));

    let lost = held(&mut c, "b", 3_000, MS);
    let (out, t) = run_until_output(&mut c, u64::MAX);
    c.handle_renew_result(t, renew_req(&out).unwrap(), RenewResult::Rejected)
        .unwrap();
    drain(&mut c);
    assert_eq!(c.renew(t + MS, lost), Err(Error::LeaseEnded(lost)));

    let acquiring = c.acquire(t, "c", AcquireOptions::new(3_000)).unwrap();
    drain(&mut c);
    assert_eq!(
        c.renew(t + MS, acquiring),
        Err(Error::NotGranted(acquiring))
    );
    assert_eq!(
        c.renew(t, LeaseId(u64::MAX)),
        Err(Error::UnknownLease(LeaseId(u64::MAX)))
    );
    assert!(drain(&mut c).is_empty(), "nothing sent");
    assert_eq!(c.counters().renewals_requested, 0);
    assert_eq!(c.counters().renewals_sent, sent.renewals_sent + 1);
}

#[test]
fn manual_renew_after_validity_ran_out_ends_lost_and_sends_nothing() {
    let mut c = client();
    let lease = held(&mut c, "a", 3_000, 0);
    c.renew(10_000 * MS, lease).unwrap();
    let out = drain(&mut c);
    assert_eq!(
        events(&out),
        vec![Event::Lost {
            lease,
            reason: LostReason::Expired
        }]
    );
    assert!(renew_req(&out).is_none(), "{out:?}");
}

#[test]
fn manual_renewal_failing_in_transport_is_retried_then_reported() {
    let mut c = client();
    let lease = held(&mut c, "a", 30_000, 0);
    c.renew(MS, lease).unwrap();
    let req = renew_req(&drain(&mut c)).unwrap();
    c.handle_renew_result(2 * MS, req, RenewResult::TransportError)
        .unwrap();
    assert!(drain(&mut c).is_empty());
    let (out, t) = run_until_output(&mut c, u64::MAX);
    c.handle_renew_result(t + MS, renew_req(&out).unwrap(), RenewResult::Renewed)
        .unwrap();
    assert!(matches!(
        events(&drain(&mut c))[..],
        [Event::Renewed { lease: l, .. }] if l == lease
    ));
}

// ------------------------------------------------------------------ auto_renew off

#[test]
fn auto_renew_off_sends_no_renewal_and_the_lease_is_lost_at_valid_until() {
    let mut c = client();
    let lease = c
        .acquire(0, "a", AcquireOptions::new(3_000).auto_renew(false))
        .unwrap();
    let (req, _) = acquire_req(&drain(&mut c));
    c.handle_acquire_result(MS, req, grant(7, 3_000)).unwrap();
    drain(&mut c);
    let valid_until = c.valid_until(lease).unwrap().unwrap();
    assert_eq!(c.poll_timeout(), Some(valid_until));
    let (out, t) = run_until_output(&mut c, u64::MAX);
    assert_eq!(t, valid_until);
    assert_eq!(
        events(&out),
        vec![Event::Lost {
            lease,
            reason: LostReason::Expired
        }]
    );
    assert_eq!(c.counters().renewals_sent, 0);
}

#[test]
fn auto_renew_off_a_lease_renewed_by_hand_lives_to_its_new_validity() {
    let mut c = client();
    let lease = c
        .acquire(0, "a", AcquireOptions::new(3_000).auto_renew(false))
        .unwrap();
    let (req, _) = acquire_req(&drain(&mut c));
    c.handle_acquire_result(MS, req, grant(7, 3_000)).unwrap();
    drain(&mut c);
    c.renew(2_000 * MS, lease).unwrap();
    let req = renew_req(&drain(&mut c)).unwrap();
    c.handle_renew_result(2_001 * MS, req, RenewResult::Renewed)
        .unwrap();
    drain(&mut c);
    let valid_until = 2_000 * MS + 3_000 * MS - 32 * MS;
    assert_eq!(c.poll_timeout(), Some(valid_until), "no automatic renewal");
    assert!(c.is_held(lease, valid_until - 1).unwrap());
    let (out, _) = run_until_output(&mut c, u64::MAX);
    assert_eq!(terminal_events(&events(&out), lease), 1);
    assert_eq!(c.counters().renewals_sent, 1);
}

// ------------------------------------------------------------------ release outcomes

/// Releases a held lease with `release_reported` and answers its release with `result`.
fn reported_release(result: ReleaseResult) -> (Client, LeaseId, Vec<Event>) {
    let mut c = client();
    let lease = held(&mut c, "a", 3_000, MS);
    assert_eq!(c.release_reported(2 * MS, lease), Ok(Releasing::Pending));
    let out = drain(&mut c);
    assert_eq!(events(&out), vec![Event::Released { lease }]);
    let (req, _) = release_req(&out).unwrap();
    c.handle_release_result(3 * MS, req, result).unwrap();
    let evs = events(&drain(&mut c));
    (c, lease, evs)
}

#[test]
fn release_outcome_confirmed() {
    let (c, lease, evs) = reported_release(ReleaseResult::Released);
    assert_eq!(
        evs,
        vec![Event::ReleaseOutcome {
            lease,
            outcome: ReleaseOutcome::Confirmed
        }]
    );
    assert_eq!(c.counters().releases_confirmed, 1);
}

#[test]
fn release_outcome_not_owner() {
    let (c, lease, evs) = reported_release(ReleaseResult::NotOwner);
    assert_eq!(
        evs,
        vec![Event::ReleaseOutcome {
            lease,
            outcome: ReleaseOutcome::NotOwner
        }]
    );
    assert_eq!(c.counters().releases_not_owner, 1);
}

/// The first release may have reached the service and its answer been lost: the retry's
/// "not owner" then says nothing about another owner.
#[test]
fn release_outcome_unconfirmed_when_not_owner_answers_a_retry() {
    let (mut c, lease, evs) = reported_release(ReleaseResult::TransportError);
    assert!(evs.is_empty());
    let (out, t) = run_until_output(&mut c, u64::MAX);
    let (req, _) = release_req(&out).expect("the release is retried");
    c.handle_release_result(t + MS, req, ReleaseResult::NotOwner)
        .unwrap();
    assert_eq!(
        events(&drain(&mut c)),
        vec![Event::ReleaseOutcome {
            lease,
            outcome: ReleaseOutcome::Unconfirmed
        }]
    );
    assert_eq!(c.counters().releases_not_owner, 0);
    assert_eq!(c.counters().releases_unconfirmed, 1);
}

#[test]
fn release_outcome_unconfirmed_when_no_answer_comes_before_the_ttl_ran_out() {
    let (mut c, lease, evs) = reported_release(ReleaseResult::TransportError);
    assert!(evs.is_empty());
    let mut outcome = None;
    while outcome.is_none() {
        let (out, t) = run_until_output(&mut c, u64::MAX);
        assert!(!out.is_empty(), "the release is retried, then given up");
        for e in events(&out) {
            outcome = Some(e);
        }
        if let Some((req, _)) = release_req(&out) {
            c.handle_release_result(t + MS, req, ReleaseResult::TransportError)
                .unwrap();
            for e in events(&drain(&mut c)) {
                outcome = Some(e);
            }
        }
    }
    assert_eq!(
        outcome,
        Some(Event::ReleaseOutcome {
            lease,
            outcome: ReleaseOutcome::Unconfirmed
        })
    );
    assert!(c.now() >= 3_000 * MS, "not before the grant had run out");
    assert_eq!(c.counters().releases_unconfirmed, 1);
}

#[test]
fn plain_release_counts_the_outcome_without_reporting_it() {
    let mut c = client();
    let lease = held(&mut c, "a", 3_000, MS);
    c.release(2 * MS, lease).unwrap();
    let (req, _) = release_req(&drain(&mut c)).unwrap();
    c.handle_release_result(3 * MS, req, ReleaseResult::NotOwner)
        .unwrap();
    assert!(drain(&mut c).is_empty());
    assert_eq!(c.counters().releases_not_owner, 1);
}

#[test]
fn release_outcomes_are_not_reported_for_cleanups_of_lost_leases() {
    let mut c = client();
    let lease = held(&mut c, "a", 3_000, 0);
    c.handle_timeout(10_000 * MS);
    let out = drain(&mut c);
    assert_eq!(terminal_events(&events(&out), lease), 1);
    let (req, _) = release_req(&out).unwrap();
    c.handle_release_result(10_001 * MS, req, ReleaseResult::Released)
        .unwrap();
    assert!(drain(&mut c).is_empty());
    assert_eq!(c.counters().releases_confirmed, 0);
}

#[test]
fn release_reported_of_one_of_several_holders_or_of_an_acquiring_lease() {
    let mut c = client();
    let opts = AcquireOptions::new(3_000).reentrant(true);
    let lease = c.acquire(0, "a", opts).unwrap();
    let (req, _) = acquire_req(&drain(&mut c));
    c.handle_acquire_result(MS, req, grant(7, 3_000)).unwrap();
    assert_eq!(c.acquire(2 * MS, "a", opts), Ok(lease));
    drain(&mut c);
    assert_eq!(c.release_reported(3 * MS, lease), Ok(Releasing::HolderLeft));
    assert!(drain(&mut c).is_empty());
    assert_eq!(c.release_reported(4 * MS, lease), Ok(Releasing::Pending));

    let acquiring = c.acquire(5 * MS, "b", AcquireOptions::new(3_000)).unwrap();
    drain(&mut c);
    assert_eq!(
        c.release_reported(6 * MS, acquiring),
        Ok(Releasing::NotAcquired)
    );
    assert!(matches!(
        events(&drain(&mut c))[..],
        [Event::AcquireFailed {
            reason: AcquireFailReason::Cancelled,
            ..
        }]
    ));
}

/// An acquire whose wait ran out before the release is processed (the host had not yet fed the
/// timeout) ended AcquireFailed, not Lost: the release says NotAcquired and counts no loss.
#[test]
fn release_reported_after_the_wait_ran_out_is_not_acquired_not_lost() {
    let mut c = client();
    let lease = c
        .acquire(0, "a", AcquireOptions::new(3_000).wait_ns(1_000 * MS))
        .unwrap();
    let (req, _) = acquire_req(&drain(&mut c));
    c.handle_acquire_result(
        MS,
        req,
        AcquireResult::HeldByOther {
            retry_after_ms: Some(60_000),
        },
    )
    .unwrap();
    drain(&mut c);
    assert_eq!(
        c.release_reported(1_001 * MS, lease),
        Ok(Releasing::NotAcquired)
    );
    assert!(matches!(
        events(&drain(&mut c))[..],
        [Event::AcquireFailed {
            reason: AcquireFailReason::WaitExhausted,
            ..
        }]
    ));
    assert_eq!(c.counters().releases_lost, 0);
}

// --------------------------------------------------- release after a pause ends Lost (rule 3)

/// After a pause past validity, a release (plain or reported) ends the lease Lost, with one
/// terminal event, and reports it.
fn assert_release_after_pause_is_lost(c: &mut Client, lease: LeaseId, now: u64, reported: bool) {
    let lost_before = c.counters().releases_lost;
    if reported {
        assert_eq!(c.release_reported(now, lease), Ok(Releasing::Lost));
    } else {
        c.release(now, lease).unwrap();
    }
    let evs = events(&drain(c));
    assert_eq!(
        evs,
        vec![Event::Lost {
            lease,
            reason: LostReason::Expired
        }]
    );
    assert_eq!(c.lease_state(lease), Ok(LeaseState::Lost));
    assert_eq!(c.counters().releases_lost, lost_before + 1);
    assert_eq!(c.counters().releases_confirmed, 0);
    assert_eq!(c.release(now + MS, lease), Err(Error::LeaseEnded(lease)));
}

#[test]
fn release_after_a_pause_past_validity_ends_lost() {
    for reported in [false, true] {
        let mut c = client();
        let lease = held(&mut c, "a", 3_000, MS);
        assert_release_after_pause_is_lost(&mut c, lease, 10_000 * MS, reported);
    }
}

#[test]
fn release_after_a_pause_past_validity_ends_lost_for_reentrant_holders() {
    for reported in [false, true] {
        let mut c = client();
        let opts = AcquireOptions::new(3_000).reentrant(true);
        let lease = c.acquire(0, "a", opts).unwrap();
        let (req, _) = acquire_req(&drain(&mut c));
        c.handle_acquire_result(MS, req, grant(7, 3_000)).unwrap();
        assert_eq!(c.acquire(2 * MS, "a", opts), Ok(lease));
        drain(&mut c);
        // One holder releases after the pause: the whole lease is lost, once, for everyone.
        assert_release_after_pause_is_lost(&mut c, lease, 10_000 * MS, reported);
    }
}

#[test]
fn release_after_a_pause_with_a_renewal_in_flight_ends_lost() {
    for reported in [false, true] {
        let mut c = client();
        let lease = held(&mut c, "a", 3_000, 0);
        let (out, t) = run_until_output(&mut c, u64::MAX);
        let req = renew_req(&out).unwrap();
        // Paused with the renewal in flight; the release comes first, the answer later.
        assert_release_after_pause_is_lost(&mut c, lease, t + 10_000 * MS, reported);
        c.handle_renew_result(t + 10_001 * MS, req, RenewResult::Renewed)
            .unwrap();
        assert_eq!(terminal_events(&events(&drain(&mut c)), lease), 0);
    }
}

// ------------------------------------------------------------------ rule 5: stale results

#[test]
fn rule5_unknown_duplicate_wrong_kind_and_superseded_results_are_ignored() {
    let mut c = client();
    let lease = c
        .acquire(0, "a", AcquireOptions::new(3_000).wait_ns(60_000 * MS))
        .unwrap();
    let (req1, _) = acquire_req(&drain(&mut c));
    // Unknown id.
    c.handle_acquire_result(MS, RequestId(999_999), grant(1, 3_000))
        .unwrap();
    // Wrong kind for a live id.
    c.handle_renew_result(MS, req1, RenewResult::Renewed)
        .unwrap();
    c.handle_release_result(MS, req1, ReleaseResult::Released)
        .unwrap();
    assert_eq!(c.lease_state(lease).unwrap(), LeaseState::Acquiring);
    assert_eq!(c.counters().stale_results, 3);
    // Let the attempt time out (2 s): it is superseded by a retry.
    let (out, _) = run_until_output(&mut c, u64::MAX);
    let (out, t) = if commands(&out).is_empty() {
        run_until_output(&mut c, u64::MAX)
    } else {
        (out, c.now())
    };
    let (req2, _) = acquire_req(&out);
    assert_ne!(req1, req2);
    // The superseded attempt's grant does not change state.
    c.handle_acquire_result(t + MS, req1, grant(5, 3_000))
        .unwrap();
    assert_eq!(c.lease_state(lease).unwrap(), LeaseState::Acquiring);
    assert!(events(&drain(&mut c)).is_empty());
    // The current attempt's does; a duplicate of it is ignored.
    c.handle_acquire_result(t + 2 * MS, req2, grant(5, 3_000))
        .unwrap();
    c.handle_acquire_result(t + 3 * MS, req2, grant(6, 3_000))
        .unwrap();
    assert_eq!(c.fencing_token(lease).unwrap(), Some(5));
    assert_eq!(c.counters().stale_results, 5);
}

#[test]
fn rule5_results_for_a_reused_record_slot_or_forged_ids_are_stale() {
    // Request ids name the record slot they came from; a slot freed and reused by another
    // lease must not take the old lease's answers, nor ids that were never issued.
    let mut c = client();
    let a = c.acquire(0, "a", AcquireOptions::new(3_000)).unwrap();
    let (a_req, _) = acquire_req(&drain(&mut c));
    c.handle_acquire_result(MS, a_req, grant(1, 3_000)).unwrap();
    c.release(2 * MS, a).unwrap();
    let (a_rel, _) = release_req(&drain(&mut c)).unwrap();
    c.handle_release_result(3 * MS, a_rel, ReleaseResult::Released)
        .unwrap();
    let b = c.acquire(4 * MS, "b", AcquireOptions::new(3_000)).unwrap();
    assert_eq!(b.0 & 0xFF_FFFF, a.0 & 0xFF_FFFF, "the slot is reused");
    let (b_req, _) = acquire_req(&drain(&mut c));
    let stale0 = c.counters().stale_results;
    // A's old answers, and ids for b's slot that were never issued.
    c.handle_acquire_result(5 * MS, a_req, grant(9, 3_000))
        .unwrap();
    c.handle_release_result(5 * MS, a_rel, ReleaseResult::Released)
        .unwrap();
    for forged in [b_req.0 & 0xFF_FFFF, b_req.0 + (1 << 24), u64::MAX] {
        c.handle_acquire_result(5 * MS, RequestId(forged), grant(9, 3_000))
            .unwrap();
    }
    assert_eq!(c.counters().stale_results, stale0 + 5);
    assert!(drain(&mut c).is_empty(), "stale answers emit nothing");
    assert_eq!(c.lease_state(b).unwrap(), LeaseState::Acquiring);
    // b's own answer still lands.
    c.handle_acquire_result(6 * MS, b_req, grant(2, 3_000))
        .unwrap();
    assert_eq!(c.fencing_token(b).unwrap(), Some(2));
}

// ------------------------------------------------------------------ rule 6: nothing leaks

#[test]
fn rule6_late_grant_after_cancel_is_released_at_once() {
    let mut c = client();
    let lease = c
        .acquire(0, "a", AcquireOptions::new(3_000).wait_ns(10_000 * MS))
        .unwrap();
    let (req, token) = acquire_req(&drain(&mut c));
    c.release(MS, lease).unwrap();
    let out = drain(&mut c);
    assert_eq!(
        events(&out),
        vec![Event::AcquireFailed {
            lease,
            reason: AcquireFailReason::Cancelled
        }]
    );
    assert!(release_req(&out).is_none(), "nothing granted yet");
    c.handle_acquire_result(2 * MS, req, grant(9, 3_000))
        .unwrap();
    let out = drain(&mut c);
    let (_, rel_token) = release_req(&out).expect("the late grant must be released");
    assert_eq!(rel_token, token);
    assert!(events(&out).is_empty(), "no second terminal event");
}

#[test]
fn rule6_late_grant_after_acquire_timed_out_is_released() {
    let mut c = client();
    let lease = c.acquire(0, "a", AcquireOptions::new(3_000)).unwrap();
    let (req, token) = acquire_req(&drain(&mut c));
    // wait = 0 and no answer within the request timeout: AcquireFailed(Unavailable).
    let (out, t) = run_until_output(&mut c, u64::MAX);
    assert_eq!(
        events(&out),
        vec![Event::AcquireFailed {
            lease,
            reason: AcquireFailReason::Unavailable
        }]
    );
    // The attempt may have been applied: a cleanup release goes out with our token.
    let (rel, rel_token) = release_req(&out).unwrap();
    assert_eq!(rel_token, token);
    c.handle_release_result(t + MS, rel, ReleaseResult::NotOwner)
        .unwrap();
    // Then the grant shows up late after all: released again.
    c.handle_acquire_result(t + 2 * MS, req, grant(3, 3_000))
        .unwrap();
    let (_, tok) = release_req(&drain(&mut c)).expect("late grant released");
    assert_eq!(tok, token);
}

#[test]
fn rule6_lost_lease_gets_one_best_effort_release() {
    let mut c = client();
    let lease = held(&mut c, "a", 300, 0);
    let mut releases = 0;
    let mut lost = 0;
    while let Some(d) = c.poll_timeout() {
        let t = d;
        c.handle_timeout(d);
        for o in drain(&mut c) {
            match o {
                Output::Command(Command::Release { .. }) => releases += 1,
                Output::Event(Event::Lost { .. }) => lost += 1,
                _ => {}
            }
        }
        if t > 100_000 * MS {
            break;
        }
    }
    assert_eq!((lost, releases), (1, 1));
    assert_eq!(c.counters().pending_cleanups, 0);
    assert!(matches!(c.lease_state(lease), Err(Error::LeaseEnded(_))));
}

#[test]
fn rule6_failed_release_is_retried_with_same_token_until_confirmed() {
    let mut c = client();
    let lease = held(&mut c, "a", 3_000, 0);
    c.release(10 * MS, lease).unwrap();
    let out = drain(&mut c);
    assert_eq!(events(&out), vec![Event::Released { lease }]);
    let (mut req, token) = release_req(&out).unwrap();
    for _ in 0..3 {
        c.handle_release_result(c.now() + MS, req, ReleaseResult::TransportError)
            .unwrap();
        let (out, _) = run_until_output(&mut c, u64::MAX);
        let (r, t) = release_req(&out).expect("retried");
        assert_eq!(t, token);
        req = r;
    }
    assert_eq!(c.counters().pending_cleanups, 1);
    c.handle_release_result(c.now() + MS, req, ReleaseResult::Released)
        .unwrap();
    assert_eq!(c.counters().pending_cleanups, 0);
    assert_eq!(c.counters().live_leases, 0);
}

#[test]
fn rule6_release_retries_stop_once_ttl_has_certainly_run_out() {
    let mut c = client();
    let lease = held(&mut c, "a", 300, 0);
    c.release(10 * MS, lease).unwrap();
    let mut sent = 0;
    let mut last = 0;
    loop {
        for o in drain(&mut c) {
            if let Output::Command(Command::Release { request, .. }) = o {
                sent += 1;
                c.handle_release_result(c.now(), request, ReleaseResult::TransportError)
                    .unwrap();
            }
        }
        let Some(d) = c.poll_timeout() else { break };
        last = d;
        c.handle_timeout(d);
    }
    assert!(sent > 1);
    assert!(last <= 10 * MS + 300 * MS + Config::default().request_timeout_ns + 1_000 * MS);
    assert_eq!(c.counters().pending_cleanups, 0);
}

// ------------------------------------------------------------------ rule 7: bounded waits

#[test]
fn rule7_wait_is_bounded_and_backoff_never_passes_the_deadline() {
    let cfg = Config {
        notifications: false,
        ..Config::default()
    };
    let mut c = Client::new(cfg, &SEED).unwrap();
    let wait = 1_000 * MS;
    let lease = c
        .acquire(0, "a", AcquireOptions::new(3_000).wait_ns(wait))
        .unwrap();
    let mut attempts = 0;
    let mut failed_at = None;
    let mut out = drain(&mut c);
    loop {
        for cmd in commands(&out) {
            if let Command::Acquire { request, .. } = cmd {
                attempts += 1;
                let t = c.now();
                c.handle_acquire_result(
                    t,
                    request,
                    AcquireResult::HeldByOther {
                        retry_after_ms: None,
                    },
                )
                .unwrap();
            }
        }
        for e in events(&out) {
            if let Event::AcquireFailed { reason, .. } = e {
                assert_eq!(reason, AcquireFailReason::WaitExhausted);
                failed_at = Some(c.now());
            }
        }
        out = drain(&mut c);
        if failed_at.is_some() {
            break;
        }
        if out.is_empty() {
            let d = c.poll_timeout().expect("waiting lease has a deadline");
            assert!(d <= wait, "deadline {d} past the wait budget");
            c.handle_timeout(d);
            out = drain(&mut c);
        }
    }
    assert_eq!(failed_at, Some(wait));
    assert!(
        attempts >= 3,
        "exponential backoff retries several times: {attempts}"
    );
    assert!(matches!(c.lease_state(lease), Err(Error::LeaseEnded(_))));
}

#[test]
fn rule7_backoff_grows_exponentially_with_full_jitter() {
    // Average over seeds: later gaps are larger than early ones, and never above the cap.
    let cfg = Config {
        notifications: false,
        backoff_base_ns: MS,
        backoff_cap_ns: 64 * MS,
        ..Config::default()
    };
    let mut early = 0u64;
    let mut late = 0u64;
    for seed in 0..40u8 {
        let mut c = Client::new(cfg, &[seed; 16]).unwrap();
        c.acquire(0, "a", AcquireOptions::new(3_000).wait_ns(100_000 * MS))
            .unwrap();
        let mut gaps = Vec::new();
        let mut last = 0;
        for _ in 0..10 {
            let out = drain(&mut c);
            let (req, _) = acquire_req(&out);
            let now = c.now();
            gaps.push(now - last);
            last = now;
            c.handle_acquire_result(
                now,
                req,
                AcquireResult::HeldByOther {
                    retry_after_ms: None,
                },
            )
            .unwrap();
            let d = c.poll_timeout().unwrap();
            assert!(d - now <= 64 * MS, "gap above cap");
            c.handle_timeout(d);
        }
        early += gaps[1] + gaps[2];
        late += gaps[8] + gaps[9];
    }
    assert!(late > 4 * early, "late {late} early {early}");
}

#[test]
fn rule7_notification_wakes_one_waiter_and_waiters_share_one_watch() {
    let mut c = client();
    let opts = AcquireOptions::new(3_000).wait_ns(60_000 * MS);
    let a = c.acquire(0, "n", opts).unwrap();
    let b = c.acquire(0, "n", opts).unwrap();
    let out = drain(&mut c);
    let reqs: Vec<_> = commands(&out)
        .into_iter()
        .filter_map(|c| {
            if let Command::Acquire { request, .. } = c {
                Some(request)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(reqs.len(), 2);
    for r in reqs {
        c.handle_acquire_result(
            MS,
            r,
            AcquireResult::HeldByOther {
                retry_after_ms: Some(2_000),
            },
        )
        .unwrap();
    }
    let out = drain(&mut c);
    let watches = commands(&out)
        .iter()
        .filter(|c| matches!(c, Command::Watch { .. }))
        .count();
    assert_eq!(watches, 1, "one watch shared by both waiters: {out:?}");
    // One release notification → exactly one new attempt.
    c.handle_released(2 * MS, "n").unwrap();
    let out = drain(&mut c);
    let attempts: Vec<_> = commands(&out)
        .into_iter()
        .filter(|c| matches!(c, Command::Acquire { .. }))
        .collect();
    assert_eq!(attempts.len(), 1, "{out:?}");
    let Command::Acquire { request, lease, .. } = attempts[0].clone() else {
        unreachable!()
    };
    assert_eq!(lease, a, "first waiter first");
    c.handle_acquire_result(3 * MS, request, grant(1, 3_000))
        .unwrap();
    assert_eq!(c.lease_state(a).unwrap(), LeaseState::Held);
    assert_eq!(c.lease_state(b).unwrap(), LeaseState::Acquiring);
    // b still watches; when b gets the lock, the watch ends.
    c.release(4 * MS, a).unwrap();
    drain(&mut c);
    c.handle_released(5 * MS, "n").unwrap();
    let out = drain(&mut c);
    let (req, _) = acquire_req(&out);
    c.handle_acquire_result(6 * MS, req, grant(2, 3_000))
        .unwrap();
    let out = drain(&mut c);
    assert!(
        commands(&out)
            .iter()
            .any(|c| matches!(c, Command::Unwatch { .. })),
        "{out:?}"
    );
}

/// Three waiters of one name, each refused once (2 s left); their leases in order.
fn three_waiters(c: &mut Client) -> [LeaseId; 3] {
    let opts = AcquireOptions::new(3_000).wait_ns(60_000 * MS);
    let leases = [0; 3].map(|_| c.acquire(0, "n", opts).unwrap());
    for cmd in commands(&drain(c)) {
        if let Command::Acquire { request, .. } = cmd {
            let held = AcquireResult::HeldByOther {
                retry_after_ms: Some(2_000),
            };
            c.handle_acquire_result(MS, request, held).unwrap();
        }
    }
    drain(c);
    leases
}

fn acquires(out: &[Output]) -> Vec<(RequestId, LeaseId)> {
    commands(out)
        .into_iter()
        .filter_map(|c| match c {
            Command::Acquire { request, lease, .. } => Some((request, lease)),
            _ => None,
        })
        .collect()
}

#[test]
fn rule7_a_wake_for_one_lease_makes_exactly_that_lease_ask() {
    let mut c = client();
    let [a, b, d] = three_waiters(&mut c);
    // Not the first local waiter (a): the one named.
    // At the refusals' time, so no retry timer has fired yet.
    assert_eq!(c.handle_wake(MS, d), Ok(true));
    let out = drain(&mut c);
    let sent = acquires(&out);
    assert_eq!(
        sent.iter().map(|s| s.1).collect::<Vec<_>>(),
        vec![d],
        "{out:?}"
    );
    // d left the local queue: a release notification now wakes a, then b.
    c.handle_released(MS, "n").unwrap();
    assert_eq!(acquires(&drain(&mut c))[0].1, a);
    c.handle_released(MS, "n").unwrap();
    assert_eq!(acquires(&drain(&mut c))[0].1, b);
    c.handle_acquire_result(2 * MS, sent[0].0, grant(7, 3_000))
        .unwrap();
    assert_eq!(c.lease_state(d).unwrap(), LeaseState::Held);
}

#[test]
fn rule7_a_wake_during_an_attempt_retries_its_refusal_at_once() {
    let mut c = client();
    let [a, _, _] = three_waiters(&mut c);
    assert_eq!(c.handle_wake(MS, a), Ok(true));
    let sent = acquires(&drain(&mut c));
    assert_eq!(sent.iter().map(|s| s.1).collect::<Vec<_>>(), vec![a]);
    // A duplicate while the attempt is in flight sends nothing more ...
    assert_eq!(c.handle_wake(MS, a), Ok(true));
    assert!(acquires(&drain(&mut c)).is_empty());
    // ... but the refusal may predate the release: ask again at once, not after 2 s.
    let held = AcquireResult::HeldByOther {
        retry_after_ms: Some(2_000),
    };
    c.handle_acquire_result(MS, sent[0].0, held).unwrap();
    drain(&mut c);
    assert_eq!(c.poll_timeout(), Some(MS));
    c.handle_timeout(MS);
    let again = acquires(&drain(&mut c));
    assert_eq!(again.iter().map(|s| s.1).collect::<Vec<_>>(), vec![a]);
}

#[test]
fn rule7_a_wake_for_a_lease_that_does_not_wait_is_a_counted_no_op() {
    let mut c = client();
    let [a, b, _] = three_waiters(&mut c);
    assert_eq!(c.handle_wake(MS, a), Ok(true));
    let sent = acquires(&drain(&mut c));
    assert_eq!(sent.iter().map(|s| s.1).collect::<Vec<_>>(), vec![a]);
    c.handle_acquire_result(MS, sent[0].0, grant(1, 3_000))
        .unwrap();
    drain(&mut c);
    assert_eq!(c.lease_state(a).unwrap(), LeaseState::Held);
    let stale = c.counters().stale_results;
    // Held: nothing to do.
    assert_eq!(c.handle_wake(MS, a), Ok(false));
    // Ended (gave up): nothing to do either.
    c.release(MS, b).unwrap();
    drain(&mut c);
    assert_eq!(c.handle_wake(MS, b), Ok(false));
    assert!(acquires(&drain(&mut c)).is_empty());
    assert_eq!(c.counters().stale_results, stale + 2);
    // An id this client never issued is an error, and changes nothing.
    assert_eq!(
        c.handle_wake(MS, LeaseId(1 << 40)),
        Err(Error::UnknownLease(LeaseId(1 << 40)))
    );
    assert!(drain(&mut c).is_empty());
}

#[test]
fn rule7_waiter_with_notifications_sleeps_for_the_holders_remaining_ttl() {
    let mut c = client();
    c.acquire(0, "n", AcquireOptions::new(3_000).wait_ns(600_000 * MS))
        .unwrap();
    // A few quick attempts first (a release may race the subscription)...
    let mut out = drain(&mut c);
    let mut gaps = Vec::new();
    for _ in 0..5 {
        let (req, _) = acquire_req(&out);
        let now = c.now();
        c.handle_acquire_result(
            now,
            req,
            AcquireResult::HeldByOther {
                retry_after_ms: Some(20_000),
            },
        )
        .unwrap();
        drain(&mut c);
        let d = c.poll_timeout().unwrap();
        gaps.push(d - now);
        c.handle_timeout(d);
        out = drain(&mut c);
    }
    assert!(gaps[0] < 100 * MS, "first retries are quick: {gaps:?}");
    // ...then it sleeps for the hint (holder's remaining TTL), not polling.
    assert!(gaps[4] >= 20_000 * MS, "{gaps:?}");
}

#[test]
fn rule7_notification_while_waiter_in_flight_is_not_lost() {
    let mut c = client();
    c.acquire(0, "n", AcquireOptions::new(3_000).wait_ns(600_000 * MS))
        .unwrap();
    let (r1, _) = acquire_req(&drain(&mut c));
    c.handle_acquire_result(
        MS,
        r1,
        AcquireResult::HeldByOther {
            retry_after_ms: Some(20_000),
        },
    )
    .unwrap();
    drain(&mut c);
    let d = c.poll_timeout().unwrap();
    c.handle_timeout(d);
    let (r2, _) = acquire_req(&drain(&mut c));
    // The release arrives while the second attempt is in flight, which then says "held".
    c.handle_released(d + MS, "n").unwrap();
    assert!(drain(&mut c).is_empty());
    c.handle_acquire_result(
        d + 2 * MS,
        r2,
        AcquireResult::HeldByOther {
            retry_after_ms: Some(20_000),
        },
    )
    .unwrap();
    drain(&mut c);
    // It retries at once instead of sleeping 20 s.
    assert_eq!(c.poll_timeout(), Some(d + 2 * MS));
}

// ------------------------------------------------------------------ rule 8: reentrancy

#[test]
fn rule8_reentrant_acquire_bumps_refcount_without_network() {
    let mut c = client();
    let opts = AcquireOptions::new(3_000).reentrant(true);
    let lease = c.acquire(0, "r", opts).unwrap();
    let (req, _) = acquire_req(&drain(&mut c));
    c.handle_acquire_result(MS, req, grant(4, 3_000)).unwrap();
    drain(&mut c);
    let again = c.acquire(2 * MS, "r", opts).unwrap();
    assert_eq!(again, lease);
    let out = drain(&mut c);
    assert!(commands(&out).is_empty(), "no network call: {out:?}");
    assert!(matches!(
        events(&out)[..],
        [Event::Acquired {
            fencing_token: 4,
            ..
        }]
    ));
    assert_eq!(c.lease_info(lease).unwrap().holders, 2);
    // First release only decrements.
    c.release(3 * MS, lease).unwrap();
    assert!(drain(&mut c).is_empty());
    assert_eq!(c.lease_state(lease).unwrap(), LeaseState::Held);
    // Last release touches the network.
    c.release(4 * MS, lease).unwrap();
    let out = drain(&mut c);
    assert_eq!(events(&out), vec![Event::Released { lease }]);
    assert!(release_req(&out).is_some());
}

#[test]
fn names_inline_or_shared_join_reentrant_leases_and_wake_waiters_alike() {
    // The core keeps short names inline and longer ones shared; lookups by `&str` must find
    // either form (reentrant joins, release notifications), and commands carry the name whole.
    let inline = leasehold::INLINE_NAME_LEN;
    for len in [1, inline, inline + 1, 300] {
        let name = "é".repeat(len / 2) + &"n".repeat(len % 2);
        let mut c = client();
        let opts = AcquireOptions::new(3_000).reentrant(true);
        let lease = c.acquire(0, &name, opts).unwrap();
        let out = drain(&mut c);
        let Some(Command::Acquire {
            request,
            name: sent,
            ..
        }) = commands(&out).first().cloned()
        else {
            panic!("{out:?}");
        };
        assert_eq!(sent, *name, "{len} bytes");
        c.handle_acquire_result(MS, request, grant(1, 3_000))
            .unwrap();
        drain(&mut c);
        assert_eq!(
            c.acquire(2 * MS, &name, opts).unwrap(),
            lease,
            "{len} bytes: joins"
        );
        assert_eq!(&*c.lease_info(lease).unwrap().name, name.as_str());
        // A waiter for the same name is woken by a notification naming it.
        let waiter = c
            .acquire(
                3 * MS,
                &name,
                AcquireOptions::new(3_000).wait_ns(60_000 * MS),
            )
            .unwrap();
        let (req, _) = acquire_req(&drain(&mut c));
        let busy = AcquireResult::HeldByOther {
            retry_after_ms: Some(2_000),
        };
        c.handle_acquire_result(4 * MS, req, busy).unwrap();
        let out = drain(&mut c);
        assert!(
            commands(&out)
                .iter()
                .any(|c| matches!(c, Command::Watch { name: w } if *w == *name)),
            "{len} bytes: {out:?}"
        );
        c.handle_released(5 * MS, &name).unwrap();
        let out = drain(&mut c);
        let woken = commands(&out).into_iter().find_map(|c| match c {
            Command::Acquire { lease, .. } => Some(lease),
            _ => None,
        });
        assert_eq!(woken, Some(waiter), "{len} bytes: {out:?}");
    }
}

#[test]
fn rule8_loss_reaches_every_nested_holder_and_non_reentrant_contends() {
    let mut c = client();
    let opts = AcquireOptions::new(3_000).reentrant(true);
    let lease = c.acquire(0, "r", opts).unwrap();
    let (req, _) = acquire_req(&drain(&mut c));
    c.handle_acquire_result(MS, req, grant(4, 3_000)).unwrap();
    c.acquire(2 * MS, "r", opts).unwrap();
    // A non-reentrant acquire of the same name is a separate lease that must contend.
    let other = c.acquire(2 * MS, "r", AcquireOptions::new(3_000)).unwrap();
    assert_ne!(other, lease);
    drain(&mut c);
    c.handle_timeout(60_000 * MS);
    let evs = events(&drain(&mut c));
    assert_eq!(
        evs.iter()
            .filter(|e| matches!(e, Event::Lost { lease: l, .. } if *l == lease))
            .count(),
        1
    );
    // After the loss, a reentrant acquire starts a new lease.
    let fresh = c.acquire(60_001 * MS, "r", opts).unwrap();
    assert_ne!(fresh, lease);
}

// ------------------------------------------------------------------ rule 9: idempotent acquire

#[test]
fn rule9_retries_reuse_the_ownership_token_and_leases_differ() {
    let mut c = client();
    let lease = c
        .acquire(0, "i", AcquireOptions::new(3_000).wait_ns(60_000 * MS))
        .unwrap();
    let (r1, t1) = acquire_req(&drain(&mut c));
    c.handle_acquire_result(MS, r1, AcquireResult::TransportError)
        .unwrap();
    let (out, _) = run_until_output(&mut c, u64::MAX);
    let (r2, t2) = acquire_req(&out);
    assert_ne!(r1, r2);
    assert_eq!(t1, t2, "a retry must present the same ownership token");
    let other = c.acquire(2 * MS, "j", AcquireOptions::new(3_000)).unwrap();
    let (_, t3) = acquire_req(&drain(&mut c));
    assert_ne!(t1, t3);
    assert_ne!(lease, other);
}

// ------------------------------------------------------------------ time

#[test]
fn time_running_backwards_is_clamped_and_counted() {
    let mut c = client();
    let lease = held(&mut c, "a", 3_000, 1_000 * MS);
    c.handle_timeout(500 * MS);
    assert_eq!(c.now(), 1_000 * MS);
    assert_eq!(c.counters().time_clamped, 1);
    assert!(
        c.is_held(lease, 0).unwrap(),
        "an older now is clamped, not believed"
    );
    // An old `now` never extends validity.
    let vu = c.valid_until(lease).unwrap().unwrap();
    assert!(!c.is_held(lease, vu).unwrap());
}

#[test]
fn same_seed_same_inputs_same_outputs() {
    let run = |seed: &[u8]| {
        let mut c = Client::new(Config::default(), seed).unwrap();
        let mut log = Vec::new();
        let _l = held(&mut c, "a", 3_000, MS);
        for _ in 0..20 {
            let (out, t) = run_until_output(&mut c, u64::MAX);
            if let Some(r) = renew_req(&out) {
                c.handle_renew_result(t + MS, r, RenewResult::Renewed)
                    .unwrap();
            }
            log.push(format!("{t} {out:?}"));
        }
        log
    };
    assert_eq!(run(&SEED), run(&SEED));
    assert_ne!(run(&SEED), run(&[1u8; 32]));
}

#[test]
fn reseed_changes_future_tokens() {
    let mut a = client();
    let mut b = client();
    b.reseed(&[9u8; 32]).unwrap();
    a.acquire(0, "x", AcquireOptions::new(3_000)).unwrap();
    b.acquire(0, "x", AcquireOptions::new(3_000)).unwrap();
    let (_, ta) = acquire_req(&drain(&mut a));
    let (_, tb) = acquire_req(&drain(&mut b));
    assert_ne!(ta, tb);
    assert!(matches!(
        b.reseed(&[1u8; 4]),
        Err(Error::SeedTooShort { len: 4 })
    ));
}

// ------------------------------------------------------------------ bad input

#[test]
fn bad_names_are_refused_and_change_nothing() {
    let mut c = client();
    assert_eq!(
        c.acquire(0, "", AcquireOptions::new(3_000)),
        Err(Error::EmptyName)
    );
    let long = "x".repeat(513);
    assert_eq!(
        c.acquire(0, &long, AcquireOptions::new(3_000)),
        Err(Error::NameTooLong { len: 513 })
    );
    assert!(
        c.acquire(0, &"x".repeat(512), AcquireOptions::new(3_000))
            .is_ok()
    );
    drain(&mut c);
    assert_eq!(
        c.acquire(0, "a\0b", AcquireOptions::new(3_000)),
        Err(Error::NameHasNul)
    );
    assert_eq!(c.handle_released(0, ""), Err(Error::EmptyName));
    assert_eq!(
        c.handle_released(0, &long),
        Err(Error::NameTooLong { len: 513 })
    );
    assert_eq!(c.handle_released(0, "a\0b"), Err(Error::NameHasNul));
    // A refused notification does not move time either.
    assert_eq!(
        c.handle_released(99_000 * MS, "a\0b"),
        Err(Error::NameHasNul)
    );
    assert_eq!(c.now(), 0);
    assert!(drain(&mut c).is_empty());
    assert_eq!(c.counters().live_leases, 1);
}

#[test]
fn bad_ttls_are_refused() {
    let mut c = client();
    assert!(matches!(
        c.acquire(0, "a", AcquireOptions::new(0)),
        Err(Error::InvalidTtl { .. })
    ));
    assert!(matches!(
        c.acquire(0, "a", AcquireOptions::new(u64::MAX)),
        Err(Error::InvalidTtl { .. })
    ));
    // "negative" TTLs from C arrive as huge unsigned values.
    assert!(matches!(
        c.acquire(0, "a", AcquireOptions::new(-1i64 as u64)),
        Err(Error::InvalidTtl { .. })
    ));
    assert!(matches!(
        c.acquire(0, "a", AcquireOptions::new(5)),
        Err(Error::InvalidTtl { .. })
    ));
    assert!(c.acquire(0, "a", AcquireOptions::new(10)).is_ok());
    assert_eq!(c.counters().live_leases, 1);
}

#[test]
fn bad_configs_and_seeds_are_refused() {
    let bad = [
        Config {
            backoff_base_ns: 0,
            ..Config::default()
        },
        Config {
            backoff_base_ns: 10,
            backoff_cap_ns: 5,
            ..Config::default()
        },
        Config {
            request_timeout_ns: 0,
            ..Config::default()
        },
        Config {
            drift_ppm: 600_000,
            ..Config::default()
        },
        Config {
            max_leases: 0,
            ..Config::default()
        },
        Config {
            max_leases: u32::MAX,
            ..Config::default()
        },
        Config {
            max_ttl_ms: 0,
            ..Config::default()
        },
    ];
    for cfg in bad {
        assert!(
            matches!(Client::new(cfg, &SEED), Err(Error::InvalidConfig(_))),
            "{cfg:?}"
        );
    }
    assert!(matches!(
        Client::new(Config::default(), &[0u8; 15]),
        Err(Error::SeedTooShort { len: 15 })
    ));
    assert!(Client::new(Config::default(), &[0u8; 16]).is_ok());
}

#[test]
fn unknown_and_ended_lease_ids_are_distinguished() {
    let mut c = client();
    assert!(matches!(
        c.lease_state(LeaseId(0)),
        Err(Error::UnknownLease(_))
    ));
    assert!(matches!(
        c.release(0, LeaseId(12345 << 24)),
        Err(Error::UnknownLease(_))
    ));
    let lease = c.acquire(0, "a", AcquireOptions::new(3_000)).unwrap();
    let (req, _) = acquire_req(&drain(&mut c));
    c.handle_acquire_result(
        MS,
        req,
        AcquireResult::HeldByOther {
            retry_after_ms: None,
        },
    )
    .unwrap();
    assert!(matches!(c.lease_state(lease), Err(Error::LeaseEnded(_))));
    // The slot is reused by the next lease, but the old id never aliases it.
    let next = c.acquire(2 * MS, "b", AcquireOptions::new(3_000)).unwrap();
    assert_ne!(next, lease);
    assert!(matches!(
        c.release(2 * MS, lease),
        Err(Error::LeaseEnded(_))
    ));
    assert_eq!(c.lease_state(next).unwrap(), LeaseState::Acquiring);
    // An id with a generation from the future is unknown, not "ended".
    assert!(matches!(
        c.lease_state(LeaseId(next.0 + (1 << 24))),
        Err(Error::UnknownLease(_))
    ));
}

#[test]
fn too_many_leases_is_refused_and_backend_data_bounded() {
    let cfg = Config {
        max_leases: 2,
        ..Config::default()
    };
    let mut c = Client::new(cfg, &SEED).unwrap();
    c.acquire(0, "a", AcquireOptions::new(3_000)).unwrap();
    let (req, _) = acquire_req(&drain(&mut c));
    c.acquire(0, "b", AcquireOptions::new(3_000)).unwrap();
    assert_eq!(
        c.acquire(0, "c", AcquireOptions::new(3_000)),
        Err(Error::TooManyLeases)
    );
    let big = vec![0u8; 2_000];
    let r = c.handle_acquire_result(
        MS,
        req,
        AcquireResult::Granted {
            fencing_token: 1,
            ttl_ms: 3_000,
            backend_data: &big,
        },
    );
    assert_eq!(r, Err(Error::BackendDataTooLong { len: 2_000 }));
    // Refused input changed nothing: the real answer still works.
    c.handle_acquire_result(MS, req, grant_with(1, b"etcd-lease-7"))
        .unwrap();
    let out = drain(&mut c);
    assert!(matches!(
        events(&out)[..],
        [Event::Acquired {
            fencing_token: 1,
            ..
        }]
    ));
}

#[test]
fn backend_data_is_echoed_in_renew_and_release() {
    let mut c = client();
    let lease = c.acquire(0, "a", AcquireOptions::new(3_000)).unwrap();
    let (req, _) = acquire_req(&drain(&mut c));
    c.handle_acquire_result(MS, req, grant_with(1, b"lease-99"))
        .unwrap();
    drain(&mut c);
    let (out, _) = run_until_output(&mut c, u64::MAX);
    match &commands(&out)[..] {
        [
            Command::Renew {
                backend_data: Some(d),
                ..
            },
        ] => assert_eq!(&**d, b"lease-99"),
        other => panic!("{other:?}"),
    }
    c.release(c.now(), lease).unwrap();
    assert_single_release_with(&drain(&mut c), b"lease-99");
}

#[test]
fn tables_stay_bounded_under_churn() {
    let mut c = client();
    for i in 0..10_000u64 {
        let t = i * MS;
        let lease = c.acquire(t, "churn", AcquireOptions::new(3_000)).unwrap();
        let (req, _) = acquire_req(&drain(&mut c));
        c.handle_acquire_result(t, req, grant(i, 3_000)).unwrap();
        c.release(t, lease).unwrap();
        let out = drain(&mut c);
        let (rel, _) = release_req(&out).unwrap();
        c.handle_release_result(t, rel, ReleaseResult::Released)
            .unwrap();
        // Garbage results, too.
        c.handle_renew_result(t, RequestId(i * 7 + 3), RenewResult::Renewed)
            .unwrap();
    }
    let k = c.counters();
    assert_eq!(k.live_leases, 0);
    assert_eq!(k.pending_cleanups, 0);
    assert_eq!(c.poll_timeout(), None);
}

#[test]
fn release_when_a_renew_is_due_sends_no_wasted_renew() {
    let mut c = client();
    let lease = held(&mut c, "a", 3_000, 0);
    let due = c.poll_timeout().unwrap();
    c.release(due, lease).unwrap();
    let out = drain(&mut c);
    assert!(renew_req(&out).is_none(), "{out:?}");
    assert_eq!(events(&out), vec![Event::Released { lease }]);
    assert!(release_req(&out).is_some());
}

#[test]
fn release_after_validity_passed_reports_the_loss() {
    let mut c = client();
    let lease = held(&mut c, "a", 3_000, 0);
    let vu = c.valid_until(lease).unwrap().unwrap();
    // The lease ends during this call: the release is satisfied and reports the loss.
    assert_eq!(c.release(vu, lease), Ok(()));
    let out = drain(&mut c);
    assert_eq!(
        events(&out),
        vec![Event::Lost {
            lease,
            reason: LostReason::Expired
        }]
    );
}

#[test]
fn errors_never_follow_a_state_change() {
    // Releasing a lease that already ended leaves time and counters untouched.
    let mut c = client();
    let lease = held(&mut c, "a", 3_000, 0);
    c.release(MS, lease).unwrap();
    drain(&mut c); // Released + a cleanup Release still pending: the record exists.
    let before = (c.now(), c.counters());
    assert_eq!(c.release(60_000 * MS, lease), Err(Error::LeaseEnded(lease)));
    assert_eq!((c.now(), c.counters()), before);
    assert!(drain(&mut c).is_empty());

    // A full table refuses before time moves.
    let cfg = Config {
        max_leases: 1,
        ..Config::default()
    };
    let mut c = Client::new(cfg, &SEED).unwrap();
    c.acquire(0, "a", AcquireOptions::new(3_000)).unwrap();
    drain(&mut c);
    let before = (c.now(), c.counters());
    assert_eq!(
        c.acquire(3_000 * MS, "b", AcquireOptions::new(3_000)),
        Err(Error::TooManyLeases)
    );
    assert_eq!((c.now(), c.counters()), before);
}

#[test]
fn cleanup_release_carries_the_late_grants_backend_data() {
    let cfg = Config {
        request_timeout_ns: 5_000 * MS,
        ..Config::default()
    };
    let mut c = Client::new(cfg, &SEED).unwrap();
    let lease = c.acquire(0, "a", AcquireOptions::new(3_000)).unwrap();
    let (req, _) = acquire_req(&drain(&mut c));
    let late = grant_with(1, b"etcd-lease-42");
    c.handle_acquire_result(3_000 * MS, req, late).unwrap();
    let out = drain(&mut c);
    assert_eq!(
        events(&out),
        vec![Event::AcquireFailed {
            lease,
            reason: AcquireFailReason::Unavailable
        }]
    );
    assert_single_release_with(&out, b"etcd-lease-42");

    // The same for a grant that arrives after the lease was cancelled.
    let mut c = client();
    let lease = c
        .acquire(0, "a", AcquireOptions::new(3_000).wait_ns(10_000 * MS))
        .unwrap();
    let (req, _) = acquire_req(&drain(&mut c));
    c.release(MS, lease).unwrap();
    drain(&mut c);
    let late = grant_with(2, b"zk-node-7");
    c.handle_acquire_result(2 * MS, req, late).unwrap();
    assert_single_release_with(&drain(&mut c), b"zk-node-7");
}

#[test]
fn late_grant_of_a_superseded_attempt_after_release_is_released_with_its_data() {
    // Simulator seed 195: attempt 1 is delayed, attempt 2 is granted, the lease is used and
    // released; then attempt 1 is applied late, with new ownership data.
    let (mut c, lease, r1, r2, t) = superseded_attempts(10_000 * MS);
    let g2 = grant_with(3, b"grant:5");
    c.handle_acquire_result(t + MS, r2, g2).unwrap();
    c.release(t + 2 * MS, lease).unwrap();
    let (rel, _) = release_req(&drain(&mut c)).unwrap();
    c.handle_release_result(t + 3 * MS, rel, ReleaseResult::Released)
        .unwrap();
    let g1 = grant_with(4, b"grant:6");
    c.handle_acquire_result(t + 4 * MS, r1, g1).unwrap();
    let out = drain(&mut c);
    assert!(events(&out).is_empty(), "no second terminal event: {out:?}");
    assert_single_release_with(&out, b"grant:6");
}

/// A client with a 100 ms request timeout whose lease "a" (wait `wait_ns`) has sent
/// `n` acquire attempts, every one but the last timed out (superseded, still possibly in
/// flight). Returns the client, the lease, the attempts' ids and when the last was sent.
fn timed_out_attempts(wait_ns: u64, n: usize) -> (Client, LeaseId, Vec<RequestId>, u64) {
    let cfg = Config {
        request_timeout_ns: 100 * MS,
        ..Config::default()
    };
    let mut c = Client::new(cfg, &SEED).unwrap();
    let lease = c
        .acquire(0, "a", AcquireOptions::new(3_000).wait_ns(wait_ns))
        .unwrap();
    let mut attempts = vec![acquire_req(&drain(&mut c)).0];
    let mut t = 0;
    while attempts.len() < n {
        let (out, at) = run_until_output(&mut c, u64::MAX);
        attempts.push(acquire_req(&out).0);
        t = at;
    }
    (c, lease, attempts, t)
}

/// Runs the core until the ended lease's cleanup release goes out; returns its backend data.
fn cleanup_release_data(c: &mut Client) -> Option<Arc<[u8]>> {
    loop {
        let (out, _) = run_until_output(c, u64::MAX);
        assert!(!out.is_empty(), "the lease must end and clean up");
        let release = commands(&out).into_iter().find_map(|c| match c {
            Command::Release { backend_data, .. } => Some(backend_data),
            _ => None,
        });
        if let Some(data) = release {
            return data;
        }
    }
}

#[test]
fn superseded_grant_while_acquiring_keeps_its_data_for_the_cleanup() {
    // Attempt 1 times out; its grant (with ownership data) arrives while attempt 2 is in
    // flight and is ignored; attempt 2 fails and the wait runs out: the cleanup release must
    // carry attempt 1's data.
    let (mut c, lease, attempts, t) = timed_out_attempts(150 * MS, 2);
    let g1 = grant_with(1, b"lease-1");
    c.handle_acquire_result(t + MS, attempts[0], g1).unwrap();
    assert_eq!(c.lease_state(lease).unwrap(), LeaseState::Acquiring);
    c.handle_acquire_result(t + 2 * MS, attempts[1], AcquireResult::TransportError)
        .unwrap();
    assert_eq!(
        cleanup_release_data(&mut c).as_deref(),
        Some(&b"lease-1"[..])
    );
}

#[test]
fn late_grants_arriving_out_of_order_keep_the_newest_data_for_the_cleanup() {
    // Simulator seed 1147940: two superseded attempts are granted by the service in turn
    // (fence 11 with "old", then fence 12 with "new"), but their replies arrive newest first.
    // The older reply must not replace the newer grant's data: the cleanup release targets
    // the grant the service actually holds.
    let (mut c, lease, attempts, t) = timed_out_attempts(400 * MS, 3);
    let newer = grant_with(12, b"new");
    let older = grant_with(11, b"old");
    c.handle_acquire_result(t + MS, attempts[1], newer).unwrap();
    c.handle_acquire_result(t + 2 * MS, attempts[0], older)
        .unwrap();
    assert_eq!(c.lease_state(lease).unwrap(), LeaseState::Acquiring);
    c.handle_acquire_result(t + 3 * MS, attempts[2], AcquireResult::TransportError)
        .unwrap();
    assert_eq!(cleanup_release_data(&mut c).as_deref(), Some(&b"new"[..]));
}

#[test]
fn time_near_u64_max_never_livelocks() {
    // Deadlines saturate at the end of time; the core must still make progress (the property
    // tests once found `advance` re-arming a past retention deadline for ever there).
    for jump in [
        u64::MAX - 3_000 * MS,
        u64::MAX - 2 * MS,
        u64::MAX - 1,
        u64::MAX,
    ] {
        let (mut c, lease, r1, r2, t) = superseded_attempts(u64::MAX);
        c.handle_acquire_result(t + MS, r2, grant(1, 3_000))
            .unwrap();
        drain(&mut c);
        c.handle_timeout(jump); // lost; best-effort release in flight at the end of time
        let out = drain(&mut c);
        assert!(events(&out).contains(&Event::Lost {
            lease,
            reason: LostReason::Expired
        }));
        // The superseded attempt's grant arrives, then time runs out entirely.
        c.handle_acquire_result(u64::MAX, r1, grant(2, 3_000))
            .unwrap();
        for _ in 0..1_000 {
            match c.poll_timeout() {
                Some(d) if d <= c.now() => {
                    c.handle_timeout(u64::MAX);
                    drain(&mut c);
                }
                _ => break,
            }
        }
        let d = c.poll_timeout();
        assert!(
            d.is_none_or(|d| d > c.now()),
            "a due deadline that never clears: {d:?}"
        );
    }
}

#[test]
fn older_late_grant_does_not_replace_the_live_grants_data() {
    // Sim seed 70255: the data of a grant with a lower fence (already gone at the service)
    // must not replace the data the cleanup release needs.
    let (mut c, lease, r1, r2, t) = superseded_attempts(10_000 * MS);
    let live = grant_with(9, b"live");
    c.handle_acquire_result(t + MS, r2, live).unwrap();
    c.release(t + 2 * MS, lease).unwrap();
    let (rel, _) = release_req(&drain(&mut c)).unwrap();
    let old = grant_with(8, b"dead");
    c.handle_acquire_result(t + 3 * MS, r1, old).unwrap();
    c.handle_release_result(t + 4 * MS, rel, ReleaseResult::Released)
        .unwrap();
    assert_single_release_with(&drain(&mut c), b"live");
}

#[test]
fn newer_grant_to_a_held_leases_token_moves_its_renewals_and_release_to_that_grant() {
    // Sim fuzz seed 16512691444503672638: a backwards clock step kept a lease held here while
    // its grant expired at the service, which then granted a late attempt of the same token
    // under a newer fence. The service's live grant is that one: renewals and the release must
    // carry its data. The lease itself does not change (rule 5): same state, same fence.
    let (mut c, lease, r1, r2, t) = superseded_attempts(10_000 * MS);
    let live = grant_with(9, b"first");
    c.handle_acquire_result(t + MS, r2, live).unwrap();
    drain(&mut c);
    let newer = grant_with(10, b"second");
    c.handle_acquire_result(t + 2 * MS, r1, newer).unwrap();
    let out = drain(&mut c);
    assert!(
        events(&out).is_empty() && commands(&out).is_empty(),
        "{out:?}"
    );
    assert_eq!(c.fencing_token(lease).unwrap(), Some(9));
    assert_eq!(c.lease_info(lease).unwrap().state, LeaseState::Held);
    let (out, _) = run_until_output(&mut c, u64::MAX);
    let renew_data = commands(&out).into_iter().find_map(|cmd| match cmd {
        Command::Renew { backend_data, .. } => Some(backend_data),
        _ => None,
    });
    assert_eq!(renew_data.flatten().as_deref(), Some(&b"second"[..]));
    let now = c.poll_timeout().unwrap_or(t + 3 * MS);
    c.release(now, lease).unwrap();
    assert_single_release_with(&drain(&mut c), b"second");
}

#[test]
fn a_newer_grant_without_data_replaces_older_data_for_the_cleanup() {
    // Two superseded attempts are granted in turn, the older with ownership data, the newer
    // without. The service holds the newer grant: a cleanup release echoing the older grant's
    // data would miss it, so the newer grant's (empty) data wins.
    let (mut c, lease, attempts, t) = timed_out_attempts(400 * MS, 3);
    c.handle_acquire_result(t + MS, attempts[0], grant_with(11, b"old"))
        .unwrap();
    c.handle_acquire_result(t + 2 * MS, attempts[1], grant(12, 3_000))
        .unwrap();
    assert_eq!(c.lease_state(lease).unwrap(), LeaseState::Acquiring);
    c.handle_acquire_result(t + 3 * MS, attempts[2], AcquireResult::TransportError)
        .unwrap();
    assert_eq!(cleanup_release_data(&mut c), None);
}

#[test]
fn a_late_grant_released_after_the_applications_release_reports_no_second_outcome() {
    // The application's release is settled and reported once; a superseded attempt granted
    // later is released too (rule 6), but that cleanup is not the application's release: no
    // second outcome event, no second count.
    let (mut c, lease, r1, r2, t) = superseded_attempts(10_000 * MS);
    c.handle_acquire_result(t + MS, r2, grant(9, 3_000))
        .unwrap();
    drain(&mut c);
    assert_eq!(
        c.release_reported(t + 2 * MS, lease).unwrap(),
        Releasing::Pending
    );
    let (rel, _) = release_req(&drain(&mut c)).unwrap();
    c.handle_release_result(t + 3 * MS, rel, ReleaseResult::Released)
        .unwrap();
    let outcome = Event::ReleaseOutcome {
        lease,
        outcome: ReleaseOutcome::Confirmed,
    };
    assert_eq!(events(&drain(&mut c)), vec![outcome]);
    c.handle_acquire_result(t + 4 * MS, r1, grant(10, 3_000))
        .unwrap();
    let (late, _) = release_req(&drain(&mut c)).expect("the late grant is released");
    c.handle_release_result(t + 5 * MS, late, ReleaseResult::Released)
        .unwrap();
    assert_eq!(drain(&mut c), vec![]);
    let counters = c.counters();
    assert_eq!(counters.releases_confirmed, 1);
    assert_eq!(counters.pending_cleanups, 0);
}

// ------------------------------------------------------------------ not applied

/// Drives `lease` (wait 50 ms) to its end, answering each attempt with `answers` in turn (the
/// last one repeated); whether a cleanup release went out and what `pending_cleanups` says.
fn end_with(answers: &[AcquireResult<'static>]) -> (bool, u64) {
    let mut c = client();
    let lease = c
        .acquire(0, "n", AcquireOptions::new(3_000).wait_ns(50 * MS))
        .unwrap();
    let mut out = drain(&mut c);
    let mut now = 0;
    let mut i = 0;
    loop {
        if release_req(&out).is_some() {
            return (true, c.counters().pending_cleanups);
        }
        if events(&out)
            .iter()
            .any(|e| matches!(e, Event::AcquireFailed { lease: l, .. } if *l == lease))
        {
            return (false, c.counters().pending_cleanups);
        }
        if let Some((r, _)) = commands(&out).iter().find_map(|cmd| match cmd {
            Command::Acquire { request, token, .. } => Some((*request, *token)),
            _ => None,
        }) {
            now += MS;
            let answer = answers[i.min(answers.len() - 1)];
            i += 1;
            c.handle_acquire_result(now, r, answer).unwrap();
            out = drain(&mut c);
            continue;
        }
        let (next, at) = run_until_output(&mut c, now + 10_000 * MS);
        assert!(!next.is_empty(), "stuck at {at}");
        now = at;
        out = next;
    }
}

#[test]
fn an_attempt_that_was_not_applied_leaves_nothing_to_clean_up() {
    // Every attempt never took effect: the wait ends with no release owed.
    assert_eq!(end_with(&[AcquireResult::NotApplied]), (false, 0));
    // One attempt whose outcome is unknown is enough for a cleanup, whatever follows.
    let (released, _) = end_with(&[AcquireResult::TransportError, AcquireResult::NotApplied]);
    assert!(released, "the uncertain attempt's grant must be released");
    let (released, _) = end_with(&[AcquireResult::NotApplied, AcquireResult::TransportError]);
    assert!(released);
}

#[test]
fn a_withdrawn_attempt_that_was_not_applied_ends_without_a_release() {
    let mut c = client();
    let lease = c
        .acquire(0, "w", AcquireOptions::new(3_000).wait_ns(60_000 * MS))
        .unwrap();
    let (r, _) = acquire_req(&drain(&mut c));
    // Unsent, it is worth sending until its request timeout (sent at 0), whatever its wait.
    let timeout = Config::default().request_timeout_ns;
    assert_eq!(c.acquire_send_deadline(r), Some(timeout));
    assert!(!c.acquire_abandoned(r, 5 * MS), "its caller still waits");
    assert!(c.acquire_abandoned(r, timeout));
    // The caller gives up while the attempt is in flight: a grant would be released.
    c.release(5 * MS, lease).unwrap();
    assert!(c.acquire_abandoned(r, 5 * MS));
    assert_eq!(c.acquire_send_deadline(r), None);
    c.handle_acquire_result(6 * MS, r, AcquireResult::NotApplied)
        .unwrap();
    let out = drain(&mut c);
    assert!(release_req(&out).is_none(), "{out:?}");
    assert_eq!(c.counters().pending_cleanups, 0);
    assert_eq!(c.counters().live_leases, 0, "the withdrawn lease is over");
    // A request the core never made, or made long ago, is nobody's any more.
    assert!(c.acquire_abandoned(RequestId(u64::MAX), 6 * MS));
}
