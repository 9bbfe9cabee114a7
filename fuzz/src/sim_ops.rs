//! `sim`: the deterministic simulator of `leasehold::sim` with every world parameter taken
//! from the fuzz bytes: number of clients and their configurations, clock rates, pauses and
//! steps, network delays/loss/duplication/transport errors, partitions, the service's clock
//! and retry hints, TTLs and wait budgets. The seed (also from the bytes) then fixes every
//! per-message fate and every worker decision.
//!
//! The world checks I1–I7 after every step itself (I5 only where its preconditions hold:
//! honest clocks within the drift bound and no pauses; I6, the fencing gate, always). This
//! target additionally checks that the world agrees with this crate on when I5 applies and
//! that it really exercised the core (a run that never acquired is rejected as uninteresting).

use arbitrary::Arbitrary;
use leasehold::Config;
use leasehold::sim::gate::GateMode;
use leasehold::sim::net::{NetConfig, Partition};
use leasehold::sim::scenario::ClientPlan;
use leasehold::sim::service::ServiceFault;
use leasehold::sim::{self, Scenario};

/// Simulator checks this target ignores: none. (`echo` was ignored while finding F3 was open;
/// it was the oracle's fault, which counted a duplicated reply the core rightly ignores as
/// received. See fuzz/README.md.)
pub const FUZZ_IGNORED_SIM_CHECKS: &[&str] = &[];

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
const TTL_MENU: [u64; 8] = [30, 60, 100, 250, 600, 1_500, 3_000, 45];
const WAIT_MENU: [u64; 5] = [0, 50 * MS, 300 * MS, 2 * SEC, 10 * MS];
const TIMEOUT_MENU: [u64; 5] = [20 * MS, 100 * MS, 500 * MS, 2 * SEC, 5 * MS];
const DRIFT_MENU: [u32; 4] = [10_000, 5_000, 20_000, 50_000];

#[derive(Arbitrary, Debug, Clone)]
pub struct Input {
    pub seed: u64,
    /// Chaotic worlds may pause processes, step clocks and drift beyond the bound.
    pub chaotic: bool,
    pub duration_ms: u16,
    pub names: u8,
    pub ttls: [u8; 2],
    pub max_wait: u8,
    pub net: NetIn,
    pub service_ppm: i16,
    pub retry_hints: bool,
    pub wide_fences: bool,
    /// The service may grant less than asked (0 = never).
    pub grant_cap: u8,
    pub clients: [ClientIn; 4],
    pub n_clients: u8,
    pub partitions: [PartitionIn; 2],
}

#[derive(Arbitrary, Debug, Clone)]
pub struct NetIn {
    pub min_delay_us: u16,
    pub spread_us: u16,
    pub tail_ppm: u16,
    pub tail_max_ms: u16,
    pub loss_ppm: u32,
    pub dup_ppm: u32,
    pub error_ppm: u32,
}

#[derive(Arbitrary, Debug, Clone)]
pub struct ClientIn {
    pub request_timeout: u8,
    pub fail_budget: u8,
    pub backoff_base_ms: u8,
    pub backoff_cap_ms: u16,
    pub notifications: bool,
    pub no_jitter: bool,
    pub drift: u8,
    pub drift_fixed_us: u16,
    pub ppm: i32,
    pub epoch: u64,
    pub workers: u8,
    pub pauses: [(u16, u16); 2],
    pub n_pauses: u8,
    pub steps: [(u16, i32); 2],
    pub n_steps: u8,
}

#[derive(Arbitrary, Debug, Clone)]
pub struct PartitionIn {
    pub on: bool,
    pub client: u8,
    pub start_ms: u16,
    pub len_ms: u16,
}

/// Builds the scenario the bytes describe (always a valid one).
pub fn scenario_of(i: &Input) -> Scenario {
    let duration_ns = (200 + u64::from(i.duration_ms) % 3_800) * MS;
    let n_clients = 2 + usize::from(i.n_clients) % 3;
    let bounded_ppm = 3_000i32;
    let clamp = |v: i32, bound: i32| v.rem_euclid(2 * bound + 1) - bound;
    let mut clients = Vec::new();
    for c in &i.clients[..n_clients] {
        let base = MS * (1 + u64::from(c.backoff_base_ms % 10));
        let mut config = Config {
            request_timeout_ns: TIMEOUT_MENU[usize::from(c.request_timeout) % TIMEOUT_MENU.len()],
            fail_budget: u32::from(c.fail_budget % 4), // 0: the time budget
            backoff_base_ns: base,
            backoff_cap_ns: base.max(MS * u64::from(c.backoff_cap_ms % 1_000)),
            notifications: c.notifications,
            drift_ppm: DRIFT_MENU[usize::from(c.drift) % DRIFT_MENU.len()],
            drift_fixed_ns: 1_000 * u64::from(c.drift_fixed_us % 5_000),
            ..Config::default()
        };
        if c.no_jitter {
            config.renew_jitter_ppm = 0;
        }
        let mut ppm = clamp(c.ppm, bounded_ppm);
        let mut pauses = Vec::new();
        let mut steps = Vec::new();
        if i.chaotic {
            for &(at, dur) in &c.pauses[..usize::from(c.n_pauses % 3)] {
                let at = (u64::from(at) * MS) % duration_ns;
                pauses.push((at, MS + u64::from(dur) % 3_000 * MS));
            }
            for &(at, delta) in &c.steps[..usize::from(c.n_steps % 3)] {
                let at = (u64::from(at) * MS) % duration_ns;
                // Steps of -1 s ..= +5 s.
                let delta = i64::from(clamp(delta, 3_000) + 2_000) * MS as i64;
                steps.push((at, delta));
            }
            if c.ppm & 1 == 1 {
                ppm = clamp(c.ppm, 60_000);
            }
        }
        clients.push(ClientPlan {
            config,
            ppm,
            epoch: c.epoch % (1 << 40),
            workers: 1 + usize::from(c.workers % 3),
            pauses,
            steps,
        });
    }
    // TTLs every client's configuration accepts (the world treats a refused acquire as a
    // contract violation).
    let mut ttls_ms: Vec<u64> = i
        .ttls
        .iter()
        .map(|t| TTL_MENU[usize::from(*t) % TTL_MENU.len()])
        .filter(|t| clients.iter().all(|c| c.config.check_ttl(*t).is_ok()))
        .collect();
    ttls_ms.sort_unstable();
    ttls_ms.dedup();
    if ttls_ms.is_empty() {
        ttls_ms.push(1_500);
        for c in &mut clients {
            if c.config.check_ttl(1_500).is_err() {
                c.config.drift_ppm = 10_000;
                c.config.drift_fixed_ns = 2 * MS;
                c.config.renew_jitter_ppm = 100_000;
            }
        }
    }
    let min_delay_ns = 20_000 + u64::from(i.net.min_delay_us) % 1_000 * 1_000;
    let net = NetConfig {
        min_delay_ns,
        max_delay_ns: min_delay_ns + u64::from(i.net.spread_us) * 1_000 % (10 * MS),
        tail_ppm: u32::from(i.net.tail_ppm) % 50_000,
        tail_max_ns: (20 + u64::from(i.net.tail_max_ms) % 600) * MS,
        loss_ppm: i.net.loss_ppm % 300_000,
        dup_ppm: i.net.dup_ppm % 100_000,
        error_ppm: i.net.error_ppm % 100_000,
    };
    let partitions = i
        .partitions
        .iter()
        .filter(|p| p.on)
        .map(|p| {
            let start = (u64::from(p.start_ms) * MS) % duration_ns;
            Partition {
                client: usize::from(p.client) % n_clients,
                start,
                end: start + (10 + u64::from(p.len_ms) % 1_500) * MS,
            }
        })
        .collect();
    // Start from the seed's own scenario so fields added to `Scenario` later keep their
    // drawn values; override everything this input describes.
    let mut sc = Scenario::from_seed(i.seed);
    sc.clients = clients;
    sc.names = (0..1 + usize::from(i.names % 3))
        .map(|n| format!("res/{n}"))
        .collect();
    sc.ttls_ms = ttls_ms;
    sc.max_wait_ns = WAIT_MENU[usize::from(i.max_wait) % WAIT_MENU.len()];
    sc.duration_ns = duration_ns;
    sc.net = net;
    sc.partitions = partitions;
    sc.service_ppm = clamp(i32::from(i.service_ppm), bounded_ppm);
    sc.retry_hints = i.retry_hints;
    sc.fence_stride = if i.wide_fences { 1_000_003 } else { 1 };
    sc.grant_cap_ms = [None, Some(20), Some(45), Some(80), Some(400)][usize::from(i.grant_cap) % 5];
    sc.service_fault = ServiceFault::None;
    sc.gate_mode = GateMode::Correct;
    sc.max_steps = 3_000_000;
    sc.ignore = FUZZ_IGNORED_SIM_CHECKS
        .iter()
        .map(|s| s.to_string())
        .collect();
    sc
}

/// Runs one world; panics with the simulator's report on any violation.
pub fn run(input: &Input) -> u64 {
    let sc = scenario_of(input);
    let i5 = sc.i5_applies();
    let out = sim::run(sc.clone(), false);
    if let Some(f) = &out.failure {
        let replay = sim::run(sc.clone(), true);
        panic!(
            "sim: invariant {} violated\n{}\nscenario: {sc:#?}",
            f.invariant,
            sim::report(f, &replay)
        );
    }
    let s = &out.stats;
    assert_eq!(s.i5_checked, i5, "sim: world disagrees on when I5 applies");
    assert!(s.steps > 0, "sim: world ran no step");
    let mut features = 0u64;
    for (bit, v) in [
        s.acquired,
        s.lost,
        s.acquire_failed,
        s.released,
        s.writes_ok,
        s.writes_rejected,
        s.messages_lost,
        u64::from(i5),
    ]
    .iter()
    .enumerate()
    {
        if *v > 0 {
            features |= 1 << bit;
        }
    }
    // World shapes, so the generated corpus covers chaotic and calm worlds alike.
    let shape = [
        input.chaotic,
        !sc.partitions.is_empty(),
        sc.grant_cap_ms.is_some(),
        sc.clients.iter().any(|c| !c.config.notifications),
        sc.clients.iter().any(|c| !c.pauses.is_empty()),
        sc.clients.iter().any(|c| !c.steps.is_empty()),
        sc.net.loss_ppm > 0 && sc.net.dup_ppm > 0,
        sc.max_wait_ns > 0,
    ];
    for (bit, on) in shape.iter().enumerate() {
        if *on {
            features |= 1 << (16 + bit);
        }
    }
    features
}
