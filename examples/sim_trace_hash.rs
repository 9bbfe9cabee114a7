//! The oracle for changes that must not change behaviour (storage layouts, timer internals):
//! hashes the simulator's full traces (every command, event, id and time) over a seed range.
//! Run it before and after; the two hashes must match.
//!
//! `cargo run --release --features sim --example sim_trace_hash -- 0 20000`
//! (`PER_SEED=1` also prints each seed's hash, to find the first one that differs).
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use leasehold::sim::{Scenario, run};

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap_or_else(|_| panic!("not a seed: {a}")))
        .collect();
    let [from, to] = args[..] else {
        eprintln!("usage: sim_trace_hash FROM TO");
        std::process::exit(2);
    };
    let per_seed = std::env::var_os("PER_SEED").is_some();
    let mut all = DefaultHasher::new();
    let mut lines = 0usize;
    for seed in from..to {
        let out = run(Scenario::from_seed(seed), true);
        let mut h = DefaultHasher::new();
        out.trace.hash(&mut h);
        format!("{:?}", out.failure.as_ref().map(|f| (&f.invariant, f.step))).hash(&mut h);
        lines += out.trace.len();
        let v = h.finish();
        if per_seed {
            println!("{seed} {v:016x}");
        }
        v.hash(&mut all);
    }
    println!(
        "seeds {from}..{to}: {lines} trace lines, hash {:016x}",
        all.finish()
    );
}
