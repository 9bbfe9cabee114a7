//! Corpus replay and generation, shared by `tests/replay.rs` and `tests/gen_corpus.rs`.

use std::path::PathBuf;

/// `fuzz/corpus/<target>`.
pub fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

/// `fuzz/regressions/<target>`: minimized inputs of crashes found so far.
pub fn regressions_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("regressions")
        .join(target)
}

/// Sorted regular files of a directory (missing directory: none).
pub fn files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.is_file()
                    && !p
                        .file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with('.'))
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    out.sort();
    out
}

/// Runs the target's logic on every file of `dir`, panicking with the file name on a
/// violation. Returns (files, files that decoded).
pub fn replay_dir(target: &str, dir: &std::path::Path) -> (usize, usize) {
    let mut decoded = 0;
    let all = files(dir);
    for path in &all {
        let data = std::fs::read(path).expect("read corpus file");
        let res = std::panic::catch_unwind(|| crate::run_target(target, &data));
        match res {
            Ok(true) => decoded += 1,
            Ok(false) => {}
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!("{target}: {} fails: {msg}", path.display());
            }
        }
    }
    (all.len(), decoded)
}

/// A tiny deterministic PRNG (xorshift64*), so corpus generation needs no extra crate.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}

/// Feature bits of one run of `target` on `data` (0 when it does not decode).
pub fn features(target: &str, data: &[u8]) -> u64 {
    use crate::{client_ops, decode, ffi_ops, redis_ops, resp_ops, sim_ops};
    match target {
        "client_ops" => decode::<client_ops::Input>(data).map_or(0, |i| client_ops::run(&i)),
        "ffi" => decode::<ffi_ops::Input>(data).map_or(0, |i| ffi_ops::run(&i)),
        "sim" => decode::<sim_ops::Input>(data).map_or(0, |i| sim_ops::run(&i)),
        "redis_protocol" => decode::<redis_ops::Input>(data).map_or(0, |i| redis_ops::run(&i)),
        "resp" => decode::<resp_ops::Input>(data).map_or(0, |i| resp_ops::run(&i)),
        other => panic!("unknown target {other}"),
    }
}
