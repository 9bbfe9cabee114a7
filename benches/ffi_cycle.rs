//! Cost of the C ABI: ns per cycle of a memory-backend client on the memory service, in Rust
//! directly (`Client`, `Protocol::Memory`, `MemoryService::call`) versus through the seam's
//! `lh_*` exports (`lh_io_poll`, `lh_memory_service_call`, `lh_io_reply`, `lh_poll_event`).
//!
//! Acquire + release cycle = acquire -> poll the ACQUIRE request -> the service runs it ->
//! reply -> poll the ACQUIRED event -> release -> poll the RELEASE request -> the service runs
//! it -> reply -> poll the RELEASED event.
//! Renew cycle (the one `bindings/c/bench/bench_ffi.c` runs from C) = poll_timeout ->
//! timeout(deadline) -> poll the RENEW request -> the service runs it -> reply -> poll events
//! (none).
//! Time inside the core is virtual; the wall clock only measures CPU cost, so this never runs
//! as a test.
//!
//! Run: `cargo bench --bench ffi_cycle [-- cycles]`.
// A benchmark has to read the wall clock; the core itself never does (clippy.toml).
#![allow(clippy::disallowed_methods)]
// Without the `harness = false` stanza cargo would build this as a libtest bench, where `main`
// is unused; keep that configuration warning-free too.
#![cfg_attr(test, allow(dead_code))]

use std::hint::black_box;
use std::time::Instant;

use leasehold::backend::Protocol;
use leasehold::backend::memory::MemoryProtocol;
use leasehold::ffi::*;
use leasehold::service::memory::{Limits, MemoryService};
use leasehold::{AcquireOptions, Client, Config, Event};

const SEED: [u8; 32] = [7; 32];
const TTL_MS: u64 = 60_000;
const NAME: &str = "bench";

/// The Rust side: a core with the memory protocol and the service on one connection.
struct Direct {
    core: Client,
    proto: Protocol,
    svc: MemoryService,
    conn: u64,
    now: u64,
}

impl Direct {
    fn new() -> Direct {
        let mut svc = MemoryService::new(Limits::default()).expect("service");
        let conn = svc.connect().expect("connection");
        Direct {
            core: Client::new(Config::default(), &SEED).expect("client"),
            proto: Protocol::Memory(Box::new(MemoryProtocol::new())),
            svc,
            conn,
            now: 1,
        }
    }

    /// Runs the one pending request on the service and hands the answer back.
    fn serve(&mut self) {
        let Protocol::Memory(p) = &mut self.proto else {
            unreachable!("a memory protocol");
        };
        let req = p.poll_request(&mut self.core).expect("a request");
        let id = req.id;
        let args: Vec<&[u8]> = req.args.iter().map(Vec::as_slice).collect();
        let answer = self.svc.call(self.conn, self.now, &args).expect("call");
        self.proto
            .handle_values(&mut self.core, self.now, id, &answer.values, &answer.data)
            .expect("a well-formed answer");
    }

    /// A lease held on a name of its own, for the renew cycle.
    fn held(mut self) -> Direct {
        self.core
            .acquire(self.now, "renewed", AcquireOptions::new(TTL_MS))
            .expect("acquire");
        self.serve();
        assert!(matches!(self.event(), Event::Acquired { .. }));
        self
    }

    fn renew_cycles(&mut self, cycles: u64) -> u64 {
        for _ in 0..cycles {
            let deadline = self.proto.poll_timeout(&mut self.core).expect("a deadline");
            self.now = self.now.max(deadline);
            self.proto.handle_timeout(&mut self.core, self.now);
            self.serve();
            assert!(self.proto.poll_event(&mut self.core).is_none());
        }
        cycles
    }

    fn event(&mut self) -> Event {
        self.proto.poll_event(&mut self.core).expect("an event")
    }

    fn cycles(&mut self, cycles: u64) -> u64 {
        for _ in 0..cycles {
            self.now += 1_000;
            let lease = self
                .core
                .acquire(self.now, NAME, AcquireOptions::new(TTL_MS))
                .expect("acquire");
            self.serve();
            assert!(matches!(self.event(), Event::Acquired { .. }));
            self.core.release(self.now, lease).expect("release");
            self.serve();
            assert!(matches!(self.event(), Event::Released { .. }));
        }
        cycles
    }
}

fn ok(st: lh_status) {
    assert_eq!(st, LH_OK, "{:?}", status_name(st));
}

/// The ABI side: a memory-backend handle and an `lh_memory_service`, driven as a C host does.
struct Abi {
    c: *mut lh_client,
    svc: *mut lh_memory_service,
    conn: u64,
    opts: lh_acquire_options,
    now: u64,
}

impl Abi {
    fn new() -> Abi {
        let mut cfg = std::mem::MaybeUninit::<lh_config>::uninit();
        let mut backend = std::mem::MaybeUninit::<lh_backend_options>::uninit();
        let mut mcfg = std::mem::MaybeUninit::<lh_memory_config>::uninit();
        let mut opts = std::mem::MaybeUninit::<lh_acquire_options>::uninit();
        let (mut c, mut svc, mut conn) = (std::ptr::null_mut(), std::ptr::null_mut(), 0);
        // SAFETY: every pointer is a valid local; the handles are freed on drop.
        unsafe {
            lh_config_default(cfg.as_mut_ptr());
            ok(lh_backend_options_default(
                LH_BACKEND_MEMORY,
                backend.as_mut_ptr(),
            ));
            ok(lh_client_new(
                cfg.as_ptr(),
                backend.as_ptr(),
                SEED.as_ptr(),
                SEED.len(),
                &mut c,
            ));
            lh_memory_config_default(mcfg.as_mut_ptr());
            ok(lh_memory_service_new(mcfg.as_ptr(), &mut svc));
            ok(lh_memory_service_connect(svc, &mut conn));
            lh_acquire_options_default(opts.as_mut_ptr());
        }
        // SAFETY: filled by lh_acquire_options_default.
        let mut opts = unsafe { opts.assume_init() };
        opts.ttl_ms = TTL_MS;
        Abi {
            c,
            svc,
            conn,
            opts,
            now: 1,
        }
    }

    /// Polls the one pending request, runs it on the service and answers it.
    ///
    /// # Safety
    /// The handles are live.
    unsafe fn serve(&mut self, req: &mut lh_io_request, answer: &mut lh_memory_answer) {
        // SAFETY: per the contract; the answer is handed back before the service's next call.
        unsafe {
            ok(lh_io_poll(self.c, req));
            assert_eq!(req.kind, LH_IO_COMMAND);
            ok(lh_memory_service_call(
                self.svc, self.conn, self.now, req.argv, req.argc, answer,
            ));
            assert_eq!(answer.dropped, 0);
            ok(lh_io_reply(
                self.c,
                self.now,
                req.id,
                answer.values,
                answer.nvalues,
                answer.data,
                answer.data_len,
            ));
        }
    }

    fn cycles(&mut self, cycles: u64) -> u64 {
        // SAFETY: plain data; every field is written before it is read.
        let mut req: lh_io_request = unsafe { std::mem::zeroed() };
        let mut answer = answer_out();
        let mut ev = lh_event::default();
        let mut lease = 0;
        for _ in 0..cycles {
            self.now += 1_000;
            // SAFETY: live handles; pointers to locals.
            unsafe {
                ok(lh_acquire(
                    self.c,
                    self.now,
                    NAME.as_ptr(),
                    NAME.len(),
                    &self.opts,
                    &mut lease,
                ));
                self.serve(&mut req, &mut answer);
                ok(lh_poll_event(self.c, &mut ev));
                assert_eq!(ev.kind, LH_EVENT_ACQUIRED);
                ok(lh_release(self.c, self.now, lease, std::ptr::null_mut()));
                self.serve(&mut req, &mut answer);
                ok(lh_poll_event(self.c, &mut ev));
                assert_eq!(ev.kind, LH_EVENT_RELEASED);
            }
        }
        cycles
    }
}

impl Abi {
    /// A lease held on a name of its own, for the renew cycle.
    fn held(mut self) -> Abi {
        self.now += 1_000;
        // SAFETY: plain data; every field is written before it is read.
        let mut req: lh_io_request = unsafe { std::mem::zeroed() };
        let mut answer = answer_out();
        let (mut lease, mut ev) = (0, lh_event::default());
        // SAFETY: live handles; pointers to locals.
        unsafe {
            ok(lh_acquire(
                self.c,
                self.now,
                b"renewed".as_ptr(),
                7,
                &self.opts,
                &mut lease,
            ));
            self.serve(&mut req, &mut answer);
            ok(lh_poll_event(self.c, &mut ev));
        }
        assert_eq!(ev.kind, LH_EVENT_ACQUIRED);
        self
    }

    fn renew_cycles(&mut self, cycles: u64) -> u64 {
        // SAFETY: plain data; every field is written before it is read.
        let mut req: lh_io_request = unsafe { std::mem::zeroed() };
        let mut answer = answer_out();
        let (mut deadline, mut ev) = (0, lh_event::default());
        for _ in 0..cycles {
            // SAFETY: live handles; pointers to locals.
            unsafe {
                ok(lh_poll_timeout(self.c, &mut deadline));
                self.now = self.now.max(deadline);
                ok(lh_timeout(self.c, self.now));
                self.serve(&mut req, &mut answer);
                ok(lh_poll_event(self.c, &mut ev));
                assert_eq!(ev.kind, LH_EVENT_NONE);
            }
        }
        cycles
    }
}

fn answer_out() -> lh_memory_answer {
    lh_memory_answer {
        struct_size: size_of::<lh_memory_answer>() as u32,
        dropped: 0,
        values: std::ptr::null(),
        nvalues: 0,
        data: std::ptr::null(),
        data_len: 0,
    }
}

impl Drop for Abi {
    fn drop(&mut self) {
        // SAFETY: the handles came from their constructors and are not used afterwards.
        unsafe {
            lh_client_free(self.c);
            lh_memory_service_free(self.svc);
        }
    }
}

const RUNS: usize = 11;

/// Times one run of `cycles` cycles; returns ns per cycle.
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

/// Runs `direct` and `through_abi` interleaved (so load from other processes hits both
/// alike) and prints their costs per cycle.
fn compare(
    what: &str,
    cycles: u64,
    mut direct: impl FnMut(u64) -> u64,
    mut through_abi: impl FnMut(u64) -> u64,
) {
    direct(cycles / 10 + 1); // warm up
    through_abi(cycles / 10 + 1);
    let (mut ds, mut fs) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        ds.push(time_run(&mut direct, cycles));
        fs.push(time_run(&mut through_abi, cycles));
    }
    let ((dmin, dmed), (fmin, fmed)) = (summary(ds), summary(fs));
    println!(
        "{what}: rust -> Client:  min {dmin:7.1} ns  median {dmed:7.1} ns  ({RUNS} runs x {cycles} cycles)"
    );
    println!(
        "{what}: rust -> lh_* seam: min {fmin:7.1} ns  median {fmed:7.1} ns  ({RUNS} runs x {cycles} cycles)"
    );
    println!(
        "{what}: lh_* / direct: {:.2}x (min), {:.2}x (median)",
        fmin / dmin,
        fmed / dmed
    );
}

fn main() {
    // `cargo bench` passes `--bench`; the first numeric argument, if any, is cycles per run.
    let cycles = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<u64>().ok())
        .unwrap_or(100_000)
        .max(1);

    let (mut d, mut a) = (Direct::new(), Abi::new());
    compare(
        "acquire+release cycle",
        cycles,
        |n| d.cycles(n),
        |n| a.cycles(n),
    );
    let (mut d, mut a) = (Direct::new().held(), Abi::new().held());
    compare(
        "renew cycle",
        cycles,
        |n| d.renew_cycles(n),
        |n| a.renew_cycles(n),
    );
}
