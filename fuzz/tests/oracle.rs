//! The oracles can fail: known-bad behaviour is detected (so a silent fuzz run means something).

use leasehold::{Event, LeaseId, LostReason, Output};
use leasehold_fuzz::client_ops::{
    self, ConfigChoice, Harness, HostOp, Input, LeaseChoice, NameChoice, Op, SeedChoice, Step,
    TtlChoice, WaitChoice,
};
use leasehold_fuzz::{Seq, sim_ops};

fn input(ops: Vec<Op>) -> Input {
    Input {
        seed: SeedChoice::Fixed(7),
        config: ConfigChoice::Default,
        ops: Seq(ops.into_iter().map(HostOp).collect()),
    }
}

fn acquire_and_serve() -> Vec<Op> {
    vec![
        Op::Acquire {
            name: NameChoice::Pool(0),
            ttl: TtlChoice::Typical(4),
            wait: WaitChoice::None,
            reentrant: false,
        },
        Op::Serve {
            rounds: 0,
            drop_some: false,
        },
    ]
}

/// Finding F1 as a client_ops input (acquire, let the request time out, release at that
/// instant): the strict oracle (the default since the fix) passes on the fixed core.
#[test]
fn f1_input_passes_the_strict_oracle() {
    let ops = vec![
        Op::Acquire {
            name: NameChoice::Pool(0),
            ttl: TtlChoice::Typical(4),
            wait: WaitChoice::None,
            reentrant: false,
        },
        Op::Advance {
            step: Step::Secs(3),
            fire: false,
        },
        Op::Release {
            lease: LeaseChoice::Issued(0),
        },
    ];
    let features = client_ops::run_with(&input(ops), true);
    assert_ne!(features & 1, 0, "no Acquire command seen");
    assert_ne!(
        features & (1 << (8 + 3)),
        0,
        "no AcquireFailed{{Unavailable}} seen"
    );
}

#[test]
#[should_panic(expected = "invariant I2 violated")]
fn client_ops_oracle_rejects_a_second_terminal_event() {
    let mut h = Harness::new(&input(vec![])).expect("harness");
    for op in acquire_and_serve() {
        h.apply(&op);
    }
    let lease = h.lease_ids()[0];
    let lost = Output::Event(Event::Lost {
        lease,
        reason: LostReason::Expired,
    });
    h.inject_output(lost.clone());
    h.inject_output(lost);
}

#[test]
#[should_panic(expected = "invariant I2 violated")]
fn client_ops_oracle_rejects_an_unsolicited_acquired() {
    let mut h = Harness::new(&input(vec![])).expect("harness");
    for op in acquire_and_serve() {
        h.apply(&op);
    }
    let lease = h.lease_ids()[0];
    // Already Acquired once; no grant was fed since and no reentrant join happened.
    h.inject_output(Output::Event(Event::Acquired {
        lease,
        fencing_token: 1,
        valid_until: 1,
    }));
}

#[test]
#[should_panic(expected = "invariant ids violated")]
fn client_ops_oracle_rejects_events_for_unknown_leases() {
    let mut h = Harness::new(&input(vec![])).expect("harness");
    h.inject_output(Output::Event(Event::Released { lease: LeaseId(99) }));
}

#[test]
fn client_ops_well_behaved_run_reaches_acquired_and_quiesces() {
    let features = client_ops::run(&input(acquire_and_serve()));
    assert_ne!(features & (1 << 8), 0, "no Acquired event");
    assert_ne!(
        features & (1 << 2),
        0,
        "no cleanup Release command in quiesce"
    );
}

/// A service that grants while someone else holds the name must break an invariant in some
/// world built by the sim target (the world's oracle is live under our scenarios).
#[test]
fn sim_oracle_detects_a_service_that_grants_twice() {
    let mut rng = leasehold_fuzz::corpus::XorShift::new(5);
    let caught = (0..200).any(|_| {
        let data = rng.bytes(300);
        let Some(input) = leasehold_fuzz::decode::<sim_ops::Input>(&data) else {
            return false;
        };
        let mut sc = sim_ops::scenario_of(&input);
        sc.service_fault = leasehold::sim::service::ServiceFault::IgnoreHolder;
        leasehold::sim::run(sc, false)
            .failure
            .is_some_and(|f| ["I4", "I5", "I6"].contains(&f.invariant))
    });
    assert!(caught, "no world detected a double-granting service");
}
