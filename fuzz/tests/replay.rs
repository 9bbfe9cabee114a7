//! Replays the committed corpus and the crash regressions of every target on stable Rust,
//! without libFuzzer, through the same decode + run logic the fuzz targets use.

use leasehold_fuzz::{TARGETS, corpus};

#[test]
fn replay_corpus() {
    for target in TARGETS {
        let dir = corpus::corpus_dir(target);
        let (n, decoded) = corpus::replay_dir(target, &dir);
        eprintln!("{target}: replayed {decoded}/{n} corpus files");
        assert!(n > 0, "{target}: empty corpus at {}", dir.display());
        assert!(decoded > 0, "{target}: no corpus file decodes");
    }
}

#[test]
fn replay_regressions() {
    for target in TARGETS {
        let dir = corpus::regressions_dir(target);
        let (n, _) = corpus::replay_dir(target, &dir);
        eprintln!("{target}: replayed {n} regression inputs");
    }
}

/// A few hundred pseudo-random inputs per target: the targets' logic runs on stable even
/// where cargo-fuzz is not installed.
#[test]
fn random_inputs() {
    let runs: u64 = std::env::var("LEASEHOLD_FUZZ_RANDOM_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    for target in TARGETS {
        let mut rng = corpus::XorShift::new(0x1ea5e_u64 ^ target.len() as u64);
        for i in 0..runs {
            let len = (rng.next_u64() % 2048) as usize;
            let data = rng.bytes(len);
            let res = std::panic::catch_unwind(|| leasehold_fuzz::run_target(target, &data));
            if let Err(e) = res {
                let path = std::env::temp_dir().join(format!("leasehold-fuzz-{target}-{i}"));
                let _ = std::fs::write(&path, &data);
                std::panic::resume_unwind(Box::new(format!(
                    "{target}: random input {i} fails (saved to {}): {:?}",
                    path.display(),
                    e.downcast_ref::<String>()
                )));
            }
        }
    }
}
