//! A deterministic simulator for the lease core (design §4), behind the cargo
//! feature `sim` so that the test suite and the fuzz crate can both drive it.
//!
//! One `u64` seed fixes a whole world: several client hosts, each running a
//! real [`crate::Client`] against its own drifting (and sometimes stepping or
//! pausing) clock; a reference lock service with its own clock; a network
//! with seeded delays, loss, duplication, reordering, transport errors and
//! partitions; and a fencing gate at the protected resource. Invariants I1–I7
//! are checked after every step; the first violation stops the run, and
//! replaying the same seed with tracing on yields the same violation with a
//! readable trace.
//!
//! ```no_run
//! # #[cfg(feature = "sim")] {
//! let report = leasehold::sim::check_seed(42);
//! assert!(report.is_ok(), "{}", report.unwrap_err());
//! # }
//! ```

pub mod clock;
pub mod gate;
pub mod net;
pub mod rng;
pub mod scenario;
pub mod service;
pub mod world;

pub use scenario::Scenario;
pub use world::{Failure, Outcome, Stats, World};

/// Runs one scenario.
pub fn run(scenario: Scenario, trace: bool) -> Outcome {
    World::new(scenario, trace).run()
}

/// How many trailing trace lines a failure report prints.
pub const REPORT_TRACE_LINES: usize = 400;

/// Runs the scenario of `seed`; on a violation, replays it with tracing and
/// returns a readable report (seed, invariant, the end of the trace, and how
/// to replay it).
pub fn check_seed(seed: u64) -> Result<Stats, String> {
    check_scenario(Scenario::from_seed(seed))
}

/// Like [`check_seed`] for a scenario that was modified after drawing it.
pub fn check_scenario(scenario: Scenario) -> Result<Stats, String> {
    let first = run(scenario.clone(), false);
    let Some(f) = first.failure else {
        return Ok(first.stats);
    };
    let replay = run(scenario, true);
    Err(report(&f, &replay))
}

/// Formats a failure and the tail of its replayed trace.
pub fn report(f: &Failure, replay: &Outcome) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "simulator seed {} broke {} at step {} (true time {} ns):\n  {}",
        f.seed, f.invariant, f.step, f.true_ns, f.detail
    );
    match &replay.failure {
        Some(r) if r.step == f.step && r.invariant == f.invariant => {}
        other => {
            let _ = writeln!(s, "WARNING: the traced replay differs: {other:?}");
        }
    }
    let t = &replay.trace;
    if let Some(head) = t.first() {
        let _ = writeln!(s, "{head}");
    }
    let from = t.len().saturating_sub(REPORT_TRACE_LINES).max(1);
    if from > 1 {
        let _ = writeln!(s, "... ({} earlier trace lines omitted)", from - 1);
    }
    for line in &t[from.min(t.len())..] {
        let _ = writeln!(s, "{line}");
    }
    let _ = writeln!(
        s,
        "replay: LEASEHOLD_SIM_SEED={} cargo test --features sim --test simulator replay -- --nocapture",
        f.seed
    );
    s
}
