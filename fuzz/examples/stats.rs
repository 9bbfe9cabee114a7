//! Development helper: `stats TARGET N SEED` runs N pseudo-random inputs of a target and prints
//! the behaviours reached; a failing input is saved to /tmp/leasehold-fuzz-fail.
use leasehold_fuzz::corpus::{XorShift, features};
fn main() {
    let target = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "client_ops".into());
    let n: u64 = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let s: u64 = std::env::args()
        .nth(3)
        .and_then(|a| a.parse().ok())
        .unwrap_or(7);
    let mut rng = XorShift::new(s);
    let mut all = 0u64;
    for _ in 0..n {
        let len = (rng.next_u64() % 2048) as usize;
        let data = rng.bytes(len);
        let r = std::panic::catch_unwind(|| features(&target, &data));
        match r {
            Ok(f) => all |= f,
            Err(_) => {
                std::fs::write("/tmp/leasehold-fuzz-fail", &data).unwrap();
                eprintln!("saved /tmp/leasehold-fuzz-fail");
                std::process::exit(1);
            }
        }
    }
    println!("features {all:064b}");
}
