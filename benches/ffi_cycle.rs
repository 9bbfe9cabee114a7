//! Cost of the C ABI: ns per renew cycle on the Rust `Client` directly versus through the
//! `lh_*` exports (the C side is `bindings/c/bench/bench_ffi.c`, which runs the same cycle).
//!
//! One renew cycle = poll_timeout -> timeout(deadline) -> poll_output (Renew) ->
//! poll_output (none) -> renew result (Renewed) -> poll_output (none). Time inside the core is
//! virtual; the wall clock only measures CPU cost, so this never runs as a test.
//!
//! Run: `cargo bench --bench ffi_cycle [-- cycles]`.
// A benchmark has to read the wall clock; the core itself never does (clippy.toml).
#![allow(clippy::disallowed_methods)]
// Without the `harness = false` stanza cargo would build this as a libtest bench, where `main`
// is unused; keep that configuration warning-free too.
#![cfg_attr(test, allow(dead_code))]

use std::hint::black_box;
use std::time::Instant;

use leasehold::ffi::*;
use leasehold::{AcquireOptions, AcquireResult, Client, Command, Config, Output, RenewResult};

const SEED: [u8; 32] = [7; 32];
const TTL_MS: u64 = 60_000;

/// Runs `cycles` renew cycles on the Rust API; returns the cycles done.
fn rust_cycles(c: &mut Client, now: &mut u64, cycles: u64) -> u64 {
    let mut renewed = 0;
    while renewed < cycles {
        let deadline = c.poll_timeout().expect("a held lease has a deadline");
        *now = (*now).max(deadline);
        c.handle_timeout(*now);
        while let Some(out) = c.poll_output() {
            match out {
                Output::Command(Command::Renew { request, .. }) => {
                    assert!(c.poll_output().is_none());
                    c.handle_renew_result(*now + 1, request, RenewResult::Renewed)
                        .expect("renew result");
                    renewed += 1;
                }
                other => panic!("unexpected output {other:?}"),
            }
        }
    }
    renewed
}

fn rust_client() -> (Client, u64) {
    let mut c = Client::new(Config::default(), &SEED).expect("client");
    c.acquire(0, "bench", AcquireOptions::new(TTL_MS))
        .expect("acquire");
    let Some(Output::Command(Command::Acquire { request, .. })) = c.poll_output() else {
        panic!("expected an acquire command");
    };
    c.handle_acquire_result(
        1,
        request,
        AcquireResult::Granted {
            fencing_token: 1,
            ttl_ms: TTL_MS,
            backend_data: &[],
        },
    )
    .expect("grant");
    while c.poll_output().is_some() {}
    (c, 1)
}

fn ok(st: lh_status) {
    assert_eq!(st, LH_OK, "{:?}", status_name(st));
}

/// Runs `cycles` renew cycles through the C ABI (called from Rust); returns the cycles done.
fn ffi_cycles(c: *mut lh_client, now: &mut u64, cycles: u64) -> u64 {
    let mut renewed = 0;
    let mut out = std::mem::MaybeUninit::<lh_output>::uninit();
    let mut deadline = 0u64;
    while renewed < cycles {
        // SAFETY: `c` is a live handle; the out-pointers are valid locals.
        unsafe {
            ok(lh_poll_timeout(c, &mut deadline));
            *now = (*now).max(deadline);
            ok(lh_timeout(c, *now));
            loop {
                ok(lh_poll_output(c, out.as_mut_ptr()));
                let o = out.assume_init_ref();
                match o.kind {
                    LH_OUTPUT_NONE => break,
                    LH_OUTPUT_RENEW => {
                        let req = o.request_id;
                        ok(lh_poll_output(c, out.as_mut_ptr()));
                        assert_eq!(out.assume_init_ref().kind, LH_OUTPUT_NONE);
                        ok(lh_renew_result(c, *now + 1, req, LH_RENEW_RENEWED));
                        renewed += 1;
                    }
                    k => panic!("unexpected output kind {k}"),
                }
            }
        }
    }
    renewed
}

fn ffi_client() -> (*mut lh_client, u64) {
    let mut cfg = std::mem::MaybeUninit::<lh_config>::uninit();
    let mut opts = std::mem::MaybeUninit::<lh_acquire_options>::uninit();
    let mut c: *mut lh_client = std::ptr::null_mut();
    let mut lease = 0u64;
    let mut out = std::mem::MaybeUninit::<lh_output>::uninit();
    // SAFETY: every pointer is a valid local; the handle is freed by the caller.
    unsafe {
        lh_config_default(cfg.as_mut_ptr());
        ok(lh_client_new(
            cfg.as_ptr(),
            SEED.as_ptr(),
            SEED.len(),
            &mut c,
        ));
        lh_acquire_options_default(opts.as_mut_ptr());
        let mut opts = opts.assume_init();
        opts.ttl_ms = TTL_MS;
        ok(lh_acquire(c, 0, b"bench".as_ptr(), 5, &opts, &mut lease));
        ok(lh_poll_output(c, out.as_mut_ptr()));
        let req = out.assume_init_ref().request_id;
        ok(lh_acquire_result(
            c,
            1,
            req,
            LH_ACQUIRE_GRANTED,
            1,
            TTL_MS,
            LH_NO_RETRY_HINT,
            std::ptr::null(),
            0,
        ));
        loop {
            ok(lh_poll_output(c, out.as_mut_ptr()));
            if out.assume_init_ref().kind == LH_OUTPUT_NONE {
                break;
            }
        }
    }
    (c, 1)
}

const RUNS: usize = 11;

/// Times one run of `cycles` renew cycles; returns ns per cycle.
fn time_run(run: &mut impl FnMut(u64) -> u64, cycles: u64) -> f64 {
    let t = Instant::now();
    let n = black_box(run(cycles));
    t.elapsed().as_nanos() as f64 / n as f64
}

/// (min, median) of a sorted sample. The machine is shared, so the minimum is the least
/// noisy estimate of the cost.
fn summary(mut ns: Vec<f64>) -> (f64, f64) {
    ns.sort_by(f64::total_cmp);
    (ns[0], ns[ns.len() / 2])
}

fn main() {
    // `cargo bench` passes `--bench`; the first numeric argument, if any, is cycles per run.
    let cycles = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<u64>().ok())
        .unwrap_or(200_000)
        .max(1);

    let (mut c, mut now) = rust_client();
    let (h, mut fnow) = ffi_client();
    let mut direct = |n| rust_cycles(&mut c, &mut now, n);
    let mut through_abi = |n| ffi_cycles(h, &mut fnow, n);
    direct(cycles / 10 + 1); // warm up
    through_abi(cycles / 10 + 1);
    // Interleave the two so that load from other processes hits both alike.
    let (mut d, mut f) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        d.push(time_run(&mut direct, cycles));
        f.push(time_run(&mut through_abi, cycles));
    }
    let ((dmin, dmed), (fmin, fmed)) = (summary(d), summary(f));
    println!(
        "rust -> Client renew cycle: min {dmin:6.1} ns  median {dmed:6.1} ns  ({RUNS} runs x {cycles} cycles)"
    );
    println!(
        "rust -> lh_* renew cycle:   min {fmin:6.1} ns  median {fmed:6.1} ns  ({RUNS} runs x {cycles} cycles)"
    );
    println!(
        "lh_* / direct: {:.2}x (min), {:.2}x (median)",
        fmin / dmin,
        fmed / dmed
    );
    // SAFETY: `h` came from lh_client_new and is not used afterwards.
    unsafe { lh_client_free(h) };
}
