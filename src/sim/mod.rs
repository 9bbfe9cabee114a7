//! A deterministic simulator for the lease core (docs/design.md §4), behind the cargo
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
//! # The oracles (failure labels)
//!
//! | label | checked | meaning |
//! |---|---|---|
//! | `I1` | every host step, every `Acquired` | `valid_until ≤ t_sent + ttl − drift` of a confirmed request (drift computed independently of the core); `is_held(valid_until)` is false |
//! | `I2` | every output | one terminal event per lease, nothing after it but cleanup `Release`s; no `Lost` before `Acquired`, no `Released` without `release()`, no `AcquireFailed` after `Acquired` |
//! | `I3` | every host step, end | the core's next deadline is no later than every held lease's `valid_until` and every acquiring lease's wait deadline + request timeout, and by then the lease has ended; every lease ends |
//! | `I4` | every grant / `Acquired` | service fences rise per name; a reported fence was granted to that lease's token and never changes; with honest clocks, live grants are observed in rising fence order |
//! | `I5` | every step (honest, pause-free worlds) | whenever a core says a lease is held (on its own clock, now), the service's unexpired holder of the name is that lease's token |
//! | `I6` | every gate write | the gate never accepts a token below one it accepted (including writes checked before a pause) |
//! | `I7` | every drain, every host step, step cap | bounded outputs per input, bounded `handle_timeout` rounds, lease records ≤ open + recently ended + pending cleanups, no livelock |
//! | `rule 4` | every command | at most one renew (and one acquire attempt) in flight per lease |
//! | `rule 6` | end | every grant that may be live (granted then released or lost, transport-failed attempt of a never-granted lease, late grant) gets a `Release`; all cleanups confirmed on a healed network |
//! | `echo` | every release | a cleanup release carries the live grant's backend data when the core had received it as the first answer to its request (rule 6 for backends whose ownership is in that data; duplicates are ignored by rule 5) |
//! | `rule 9` | every command | a lease keeps one ownership token for all its commands |
//! | `watch` | every command, end | `Watch`/`Unwatch` alternate per name and none is left watching |
//! | `contract`, `protocol` | inputs, service | valid inputs are accepted, `release()` ends the lease at once, request ids unique; backend data was granted to that token |
//!
//! ```no_run
//! # #[cfg(feature = "sim")] {
//! let report = leasehold::sim::check_seed(42);
//! assert!(report.is_ok(), "{}", report.unwrap_err());
//! # }
//! ```

pub mod clock;
pub mod gate;
mod host;
mod messages;
pub mod net;
mod oracle;
pub mod rng;
pub mod scenario;
pub mod service;
mod workers;
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
