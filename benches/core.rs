//! Core benchmarks: cost per renew cycle with 1, 1,000 and 1,000,000 live leases,
//! cost per acquire → grant → release cycle, and heap bytes per held lease.
//!
//! Run: `cargo bench --bench core` (`-- quick` for a shorter run; `-- renew 1000000` or
//! `-- acquire` for one case, e.g. under `perf record`; `-- renew 10000` runs a size the table
//! leaves out). Prints a markdown table.
//!
//! * A renew cycle is what a host does for one renewal: `poll_timeout` → `handle_timeout` at
//!   that deadline → `poll_output` (the `Renew` command) → `handle_renew_result(Renewed)` →
//!   `poll_output` (empty). With many leases the deadlines interleave, so the cycle also pays
//!   for finding the next lease due — which is what "cost per event grows at most
//!   logarithmically" is about.
//! * An acquire cycle: `acquire` → `Acquire` command → `Granted` → `Acquired` event →
//!   `release` → `Released` event + `Release` command → `Released` result.
//! * At 1,000,000 leases a second renew row runs with renew jitter off (diagnostic): the leases
//!   then come due in slot order, so it shows the core's own cost without the random order
//!   in which jitter makes a million records come due.
//! * Bytes per lease: heap bytes live (counted by the global allocator below) after
//!   1,000,000 leases were acquired and granted, minus the bytes live before, divided by
//!   1,000,000. The resident-set growth is printed beside it as a cross-check that includes
//!   allocator overhead and slack.
//!
//! Time inside the core is virtual, so the wall clock measures CPU cost only. Numbers belong in
//! the README, never in test assertions.
// A benchmark has to read the wall clock; the core itself never does (clippy.toml).
#![allow(clippy::disallowed_methods)]
// Without `harness = false` cargo would build this as a libtest bench where `main` is unused.
#![cfg_attr(test, allow(dead_code))]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use leasehold::{
    AcquireOptions, AcquireResult, Client, Command, Config, Event, LeaseId, Output, ReleaseResult,
    RenewResult,
};

/// Counts live heap bytes so the bench can report bytes per lease. This is the only `unsafe`
/// outside `src/ffi/`: a global allocator cannot be written without it, and it merely forwards
/// to the system allocator.
struct Counting;

static LIVE_BYTES: AtomicU64 = AtomicU64::new(0);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so `System`'s
// guarantees carry over; the counters are plain atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as u64, Relaxed);
        ALLOCS.fetch_add(1, Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as u64, Relaxed);
        // SAFETY: `ptr` was allocated by `System` with `layout` (through `alloc`/`realloc` above).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as u64, Relaxed);
        ALLOCS.fetch_add(1, Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size as u64, Relaxed);
        LIVE_BYTES.fetch_sub(layout.size() as u64, Relaxed);
        ALLOCS.fetch_add(1, Relaxed);
        // SAFETY: `ptr`/`layout` come from this allocator; `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const SEED: [u8; 32] = [42; 32];
const MS: u64 = 1_000_000;
/// Long enough that no lease ever comes near expiry during the run.
const TTL_MS: u64 = 30_000;
/// Simulated round trip between a command and its result.
const RTT_NS: u64 = 500_000;

fn config(leases: u64) -> Config {
    Config {
        max_leases: (leases as u32).max(Config::default().max_leases),
        ..Config::default()
    }
}

/// Renew jitter on (the default) or off. Off, the leases (all granted at one instant) come due
/// in slot order, so records are visited in memory order: a diagnostic row that separates the
/// cost of the core's work from the cost of reaching a million records in random order.
#[derive(Clone, Copy, PartialEq)]
enum Jitter {
    Default,
    Off,
}

/// CPU time of the calling thread in ns (Linux, 10 ms ticks), so that time spent descheduled on
/// a shared machine does not count; `None` elsewhere.
fn thread_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut f = rest.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some((utime + stime) * 10_000_000)
}

/// Wall and CPU nanoseconds of one measured run.
#[derive(Clone, Copy)]
struct Timing {
    wall_ns: f64,
    cpu_ns: Option<f64>,
}

impl Timing {
    fn measure(ops: u64, f: impl FnOnce()) -> Timing {
        let cpu0 = thread_cpu_ns();
        let start = Instant::now();
        f();
        let wall = start.elapsed().as_nanos() as f64;
        let cpu = match (cpu0, thread_cpu_ns()) {
            (Some(a), Some(b)) => Some((b - a) as f64 / ops as f64),
            _ => None,
        };
        Timing {
            wall_ns: wall / ops as f64,
            cpu_ns: cpu,
        }
    }

    fn best(self, other: Timing) -> Timing {
        Timing {
            wall_ns: self.wall_ns.min(other.wall_ns),
            cpu_ns: match (self.cpu_ns, other.cpu_ns) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        }
    }

    fn cpu(&self) -> String {
        self.cpu_ns.map_or("n/a".into(), |c| format!("{c:.0}"))
    }
}

/// Resident set size in bytes (Linux), for a cross-check of the heap count.
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Acquires and grants `n` leases named `lease/<i>` at time `now`; returns their ids.
fn hold_leases(c: &mut Client, n: u64, now: u64, ids: &mut Vec<LeaseId>) {
    let mut name = String::with_capacity(32);
    for i in 0..n {
        use std::fmt::Write as _;
        name.clear();
        let _ = write!(name, "lease/{i}");
        let id = c
            .acquire(now, &name, AcquireOptions::new(TTL_MS))
            .expect("acquire");
        ids.push(id);
        let Some(Output::Command(Command::Acquire { request, .. })) = c.poll_output() else {
            panic!("expected an Acquire command");
        };
        let granted = AcquireResult::Granted {
            fencing_token: i + 1,
            ttl_ms: TTL_MS,
            backend_data: &[],
        };
        c.handle_acquire_result(now + RTT_NS, request, granted)
            .expect("grant");
        match c.poll_output() {
            Some(Output::Event(Event::Acquired { .. })) => {}
            other => panic!("expected Acquired, got {other:?}"),
        }
        assert!(c.poll_output().is_none());
    }
}

/// Runs renew cycles until `cycles` renewals were confirmed.
fn renew_cycles(c: &mut Client, now: &mut u64, cycles: u64) {
    let mut renewed = 0;
    while renewed < cycles {
        let deadline = c.poll_timeout().expect("held leases have deadlines");
        *now = (*now).max(deadline);
        c.handle_timeout(*now);
        while let Some(out) = c.poll_output() {
            match out {
                Output::Command(Command::Renew { request, .. }) => {
                    c.handle_renew_result(*now + RTT_NS, request, RenewResult::Renewed)
                        .expect("renew result");
                    renewed += 1;
                }
                other => panic!("unexpected output {other:?}"),
            }
        }
        black_box(c.poll_output());
    }
}

struct RenewRow {
    leases: u64,
    time: Timing,
    allocs_per_cycle: f64,
    /// Heap after granting, heap after the timed renewals (timer buffers grown), RSS growth.
    bytes_per_lease: Option<(f64, f64, Option<f64>)>,
}

fn bench_renew(leases: u64, cycles: u64, measure_memory: bool, jitter: Jitter) -> RenewRow {
    let mut ids = Vec::with_capacity(leases as usize);
    let rss0 = rss_bytes();
    let live0 = LIVE_BYTES.load(Relaxed);
    let mut cfg = config(leases);
    if jitter == Jitter::Off {
        cfg.renew_jitter_ppm = 0;
    }
    let mut c = Client::new(cfg, &SEED).expect("client");
    let mut now = 1_000 * MS;
    hold_leases(&mut c, leases, now, &mut ids);
    let bytes = measure_memory.then(|| {
        let heap = (LIVE_BYTES.load(Relaxed) - live0) as f64 / leases as f64;
        let rss = match (rss0, rss_bytes()) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / leases as f64),
            _ => None,
        };
        (heap, rss)
    });
    now += RTT_NS;
    // Warm up (one round of renewals for small tables), then measure.
    renew_cycles(&mut c, &mut now, cycles.min(leases.max(1000)) / 4 + 1);
    let allocs0 = ALLOCS.load(Relaxed);
    // Best of three runs: the machine is shared, the minimum is the least disturbed.
    let mut best = Timing::measure(cycles, || renew_cycles(&mut c, &mut now, cycles));
    let mut done = cycles;
    for _ in 0..2 {
        best = best.best(Timing::measure(cycles, || {
            renew_cycles(&mut c, &mut now, cycles)
        }));
        done += cycles;
    }
    let allocs = (ALLOCS.load(Relaxed) - allocs0) as f64 / done as f64;
    let bytes = bytes.map(|(heap, rss)| {
        let steady = (LIVE_BYTES.load(Relaxed) - live0) as f64 / leases as f64;
        (heap, steady, rss)
    });
    black_box(&ids);
    RenewRow {
        leases,
        time: best,
        allocs_per_cycle: allocs,
        bytes_per_lease: bytes,
    }
}

/// Time per acquire → grant → release cycle, with `background` other leases held.
fn bench_acquire_release(background: u64, cycles: u64) -> (Timing, f64) {
    let mut ids = Vec::with_capacity(background as usize);
    let mut c = Client::new(config(background + 1), &SEED).expect("client");
    let now = 1_000 * MS;
    hold_leases(&mut c, background, now, &mut ids);
    let run = |c: &mut Client, cycles: u64| {
        for i in 0..cycles {
            let t = now + i * 10;
            let lease = c
                .acquire(t, "bench/cycle", AcquireOptions::new(TTL_MS))
                .expect("acquire");
            let Some(Output::Command(Command::Acquire { request, .. })) = c.poll_output() else {
                panic!("expected Acquire");
            };
            let granted = AcquireResult::Granted {
                fencing_token: 1_000_000_000 + i,
                ttl_ms: TTL_MS,
                backend_data: &[],
            };
            c.handle_acquire_result(t + 1, request, granted)
                .expect("grant");
            let Some(Output::Event(Event::Acquired { .. })) = c.poll_output() else {
                panic!("expected Acquired");
            };
            c.release(t + 2, lease).expect("release");
            let mut release_req = None;
            while let Some(out) = c.poll_output() {
                if let Output::Command(Command::Release { request, .. }) = out {
                    release_req = Some(request);
                }
            }
            let req = release_req.expect("a Release command");
            c.handle_release_result(t + 3, req, ReleaseResult::Released)
                .expect("release result");
            black_box(c.poll_output());
        }
    };
    run(&mut c, cycles / 4 + 1);
    let allocs0 = ALLOCS.load(Relaxed);
    let mut best = Timing::measure(cycles, || run(&mut c, cycles));
    for _ in 0..2 {
        best = best.best(Timing::measure(cycles, || run(&mut c, cycles)));
    }
    let allocs = (ALLOCS.load(Relaxed) - allocs0) as f64 / (3 * cycles) as f64;
    black_box(&ids);
    (best, allocs)
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let quick = args.iter().any(|a| a == "quick");
    // `renew` / `acquire` run only that family; a number restricts the renew sizes (for profiling).
    let want = |family: &str, leases: u64| {
        let named: Vec<&String> = args.iter().filter(|a| *a != "quick").collect();
        named.is_empty()
            || named.iter().any(|a| **a == family)
                && !named
                    .iter()
                    .any(|a| a.parse::<u64>().is_ok_and(|n| n != leases))
    };
    let scale = if quick { 10 } else { 1 };
    println!("leasehold core benchmarks (cargo bench --bench core); best of 3 runs");
    println!(
        "wall = elapsed time; cpu = this thread's CPU time (10 ms ticks), robust on a shared box\n"
    );
    println!(
        "| benchmark | live leases | ns per cycle (cpu) | ns per cycle (wall) | allocations per cycle |"
    );
    println!("|---|---:|---:|---:|---:|");
    let mut memory = None;
    // A size that is not in the table (`-- renew 10000`) runs as well, for the curve between.
    let mut sizes = vec![
        (1u64, 3_000_000u64),
        (1_000, 3_000_000),
        (1_000_000, 2_000_000),
    ];
    for n in args.iter().filter_map(|a| a.parse::<u64>().ok()) {
        if n > 0 && !sizes.iter().any(|&(l, _)| l == n) {
            sizes.push((n, 2_000_000));
        }
    }
    for (leases, cycles) in sizes {
        if !want("renew", leases) {
            continue;
        }
        let row = bench_renew(leases, cycles / scale, leases == 1_000_000, Jitter::Default);
        println!(
            "| renew cycle (timeout → Renew → renewed) | {} | {} | {:.0} | {:.2} |",
            row.leases,
            row.time.cpu(),
            row.time.wall_ns,
            row.allocs_per_cycle
        );
        if row.bytes_per_lease.is_some() {
            memory = row.bytes_per_lease.map(|b| (row.leases, b));
        }
        if leases == 1_000_000 {
            let row = bench_renew(leases, cycles / scale, false, Jitter::Off);
            println!(
                "| renew cycle, jitter off: records visited in memory order (diagnostic) | {} | {} | {:.0} | {:.2} |",
                row.leases,
                row.time.cpu(),
                row.time.wall_ns,
                row.allocs_per_cycle
            );
        }
    }
    for background in [0u64, 1_000] {
        if !want("acquire", background + 1) {
            continue;
        }
        let (t, allocs) = bench_acquire_release(background, 1_000_000 / scale);
        println!(
            "| acquire → grant → release cycle | {} | {} | {:.0} | {allocs:.2} |",
            background + 1,
            t.cpu(),
            t.wall_ns
        );
    }
    if let Some((leases, (heap, steady, rss))) = memory {
        println!("\n| memory | value |\n|---|---:|");
        println!("| heap bytes per held lease ({leases} leases, counting allocator) | {heap:.0} |");
        println!("| the same after the timed renewals (timer buffers grown) | {steady:.0} |");
        if let Some(rss) = rss {
            println!(
                "| resident-set growth per held lease (includes allocator slack) | {rss:.0} |"
            );
        }
    }
}
