//! Generates the small committed seed corpus (`fuzz/gen_corpus.sh` runs this):
//! pseudo-random inputs are run through each target's logic (client_ops: property runs
//! against the oracle; sim: simulator worlds; ffi: differential runs against the core) and an
//! input is kept when it reaches a behaviour no kept input reached (new feature bits: event
//! kinds, loss reasons, status codes, simulator outcomes). Every kept input passed the oracle.

use leasehold_fuzz::{TARGETS, corpus};

const MAX_FILES: usize = 16;

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[test]
#[ignore = "writes fuzz/corpus; run through fuzz/gen_corpus.sh"]
fn gen_corpus() {
    for target in TARGETS {
        let dir = corpus::corpus_dir(target);
        std::fs::create_dir_all(&dir).expect("mkdir corpus");
        let mut have = 0u64;
        for path in corpus::files(&dir) {
            have |= corpus::features(target, &std::fs::read(&path).expect("read"));
        }
        let mut kept = corpus::files(&dir).len();
        let mut rng = corpus::XorShift::new(0xC0FFEE ^ fnv(target.as_bytes()));
        // Random bytes rarely make a valid acquire through the C ABI (a name, a TTL, flags,
        // struct sizes and pointers all have to be right), so `ffi` tries longer.
        let tries = match target {
            "sim" => 600,
            "ffi" => 200_000,
            _ => 4000,
        };
        for _ in 0..tries {
            if kept >= MAX_FILES {
                break;
            }
            let len = 16 + (rng.next_u64() % 1500) as usize;
            let data = rng.bytes(len);
            let f = match std::panic::catch_unwind(|| corpus::features(target, &data)) {
                Ok(f) => f,
                Err(e) => {
                    let path = std::env::temp_dir().join(format!("leasehold-gen-{target}-fail"));
                    std::fs::write(&path, &data).expect("save failing input");
                    eprintln!("{target}: failing input saved to {}", path.display());
                    std::panic::resume_unwind(e);
                }
            };
            if f & !have != 0 {
                have |= f;
                let path = dir.join(format!("gen-{:016x}", fnv(&data)));
                std::fs::write(&path, &data).expect("write corpus file");
                kept += 1;
            }
        }
        eprintln!("{target}: {kept} corpus files, features {have:#x}");
    }
}
