//! What one simulated world looks like, drawn entirely from one `u64` seed.
//!
//! A scenario fixes everything that is not the core's own decision: how many
//! clients, their configurations, clock rates, pauses and steps, the network's
//! fault rates and partitions, the service's behaviour. The same seed always
//! yields the same scenario, and the world driven by it replays exactly.

use super::gate::GateMode;
use super::net::{NetConfig, Partition};
use super::rng::SimRng;
use super::service::ServiceFault;
use crate::Config;

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;

/// One simulated client host.
#[derive(Clone, Debug)]
pub struct ClientPlan {
    /// Core configuration of this host.
    pub config: Config,
    /// Clock rate error in ppm.
    pub ppm: i32,
    /// Local clock reading at true time 0 (hosts pick different epochs).
    pub epoch: u64,
    /// Independent application workers (each acquires and releases in a loop).
    pub workers: usize,
    /// Process pauses: (true start, duration).
    pub pauses: Vec<(u64, u64)>,
    /// Clock steps: (true time, delta of the local reading).
    pub steps: Vec<(u64, i64)>,
}

/// A whole simulated world.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The seed this scenario was drawn from (also seeds the world's choices).
    pub seed: u64,
    /// The client hosts.
    pub clients: Vec<ClientPlan>,
    /// Lock names the workers contend for.
    pub names: Vec<String>,
    /// TTLs (ms) the workers choose from.
    pub ttls_ms: Vec<u64>,
    /// Largest wait budget a worker asks for, ns.
    pub max_wait_ns: u64,
    /// Active phase in true ns; after it the network heals and workers stop.
    pub duration_ns: u64,
    /// Network fault rates.
    pub net: NetConfig,
    /// Partitions (client cut off from the service).
    pub partitions: Vec<Partition>,
    /// Service clock rate error in ppm.
    pub service_ppm: i32,
    /// Whether held-by-other replies carry the holder's remaining TTL.
    pub retry_hints: bool,
    /// Gap between successive fencing tokens.
    pub fence_stride: u64,
    /// Longest TTL the service grants (it may grant less than asked).
    pub grant_cap_ms: Option<u64>,
    /// Deliberate service bug (tests of the oracles only).
    pub service_fault: ServiceFault,
    /// Gate behaviour (tests of the oracles only).
    pub gate_mode: GateMode,
    /// Cap on processed simulation events (I7: no livelock).
    pub max_steps: u64,
    /// Invariant names whose violations are ignored, so that a known bug of
    /// one kind does not hide others while it is being fixed
    /// (`LEASEHOLD_SIM_IGNORE=protocol,I7` in the test harness).
    pub ignore: Vec<String>,
}

impl Scenario {
    /// Draws a scenario from `seed`. About a third of the worlds are "chaotic"
    /// (process pauses, clock steps, drift beyond the configured bound); the
    /// rest keep clocks honest so that I5 is checked.
    pub fn from_seed(seed: u64) -> Scenario {
        let mut rng = SimRng::new(seed ^ 0x5EED_1EA5_E401_D000);
        let chaotic = rng.chance_ppm(350_000);
        let duration_ns = rng.range(SEC, 4 * SEC);
        // One world in ten is a crowd: many hosts on one name, so hand-offs,
        // waiter wake-ups and I5 are exercised under heavy contention. Drawn
        // from its own stream so the other worlds keep their scenarios.
        let crowd = SimRng::new(seed ^ 0xC20_D000).chance_ppm(100_000);
        let mut n_clients = rng.range(2, 4) as usize;
        let mut n_names = rng.range(1, 3) as usize;
        if crowd {
            n_clients += 4;
            n_names = 1;
        }
        let names = (0..n_names).map(|i| format!("res/{i}")).collect();
        let ttl_menu: [u64; 6] = [30, 60, 100, 250, 600, 1500];
        let first = rng.below(4) as usize;
        let ttls_ms = ttl_menu[first..(first + rng.range(1, 3) as usize).min(6)].to_vec();
        let max_wait_ns = *rng.pick(&[0, 50 * MS, 300 * MS, 2 * SEC]);

        let min_delay_ns = rng.range(20_000, MS);
        let net = NetConfig {
            min_delay_ns,
            max_delay_ns: min_delay_ns + rng.range(0, 10 * MS),
            tail_ppm: rng.range(0, 20_000) as u32,
            tail_max_ns: rng.range(20 * MS, 600 * MS),
            loss_ppm: *rng.pick(&[0, 0, 5_000, 30_000, 100_000]),
            dup_ppm: *rng.pick(&[0, 10_000, 50_000]),
            error_ppm: *rng.pick(&[0, 10_000, 50_000]),
        };

        // Bounded drift: with Redlock's 1% margin, clocks within ±3000 ppm of
        // true time are within ~0.6% of each other, inside the bound.
        let bounded_ppm = 3_000;
        let service_ppm = rng.signed(bounded_ppm) as i32;
        let mut clients = Vec::with_capacity(n_clients);
        let mut partitions = Vec::new();
        for c in 0..n_clients {
            let mut config = Config {
                request_timeout_ns: *rng.pick(&[20 * MS, 100 * MS, 500 * MS, 2 * SEC]),
                // 0: the time budget (the default).
                fail_budget: rng.range(0, 3) as u32,
                backoff_base_ns: *rng.pick(&[MS, 5 * MS]),
                backoff_cap_ns: *rng.pick(&[50 * MS, 500 * MS]),
                notifications: rng.chance_ppm(700_000),
                ..Config::default()
            };
            if rng.chance_ppm(200_000) {
                config.renew_jitter_ppm = 0;
            }
            let mut ppm = rng.signed(bounded_ppm) as i32;
            let mut pauses = Vec::new();
            let mut steps = Vec::new();
            if chaotic {
                if rng.chance_ppm(500_000) {
                    for _ in 0..rng.range(1, 3) {
                        pauses.push((rng.range(0, duration_ns), rng.range(MS, 3 * SEC)));
                    }
                }
                if rng.chance_ppm(400_000) {
                    for _ in 0..rng.range(1, 2) {
                        let delta = if rng.chance_ppm(300_000) {
                            -(rng.range(MS, SEC) as i64)
                        } else {
                            rng.range(MS, 5 * SEC) as i64
                        };
                        steps.push((rng.range(0, duration_ns), delta));
                    }
                }
                if rng.chance_ppm(400_000) {
                    ppm = rng.signed(60_000) as i32;
                }
            }
            if rng.chance_ppm(150_000) {
                let start = rng.range(0, duration_ns);
                partitions.push(Partition {
                    client: c,
                    start,
                    end: start + rng.range(10 * MS, 1500 * MS),
                });
            }
            clients.push(ClientPlan {
                config,
                ppm,
                epoch: rng.range(0, 1 << 40),
                workers: rng.range(1, 3) as usize,
                pauses,
                steps,
            });
        }
        Scenario {
            seed,
            clients,
            names,
            ttls_ms,
            max_wait_ns,
            duration_ns,
            net,
            partitions,
            service_ppm,
            retry_hints: rng.chance_ppm(800_000),
            fence_stride: *rng.pick(&[1, 1, 1_000_003]),
            grant_cap_ms: rng
                .chance_ppm(150_000)
                .then(|| *rng.pick(&[20, 45, 80, 400])),
            service_fault: ServiceFault::None,
            gate_mode: GateMode::Correct,
            max_steps: 3_000_000,
            ignore: Vec::new(),
        }
    }

    /// Whether every client's clock, relative to the service's, stays inside
    /// the drift its core assumes: a client may only believe it holds for
    /// `(ttl − drift)` of its own time, which must not outlast `ttl` of service
    /// time, i.e. `rate_service × (1 − drift_ppm/1e6) ≤ rate_client`.
    pub fn drift_within_bound(&self) -> bool {
        let s = 1_000_000i128 + i128::from(self.service_ppm);
        self.clients.iter().all(|c| {
            let r = 1_000_000i128 + i128::from(c.ppm);
            s * (1_000_000 - i128::from(c.config.drift_ppm)) <= r * 1_000_000
        })
    }

    /// No clock steps and drift within bound: clocks are honest, so fencing
    /// tokens of live grants must be observed in increasing order (I4).
    pub fn honest_clocks(&self) -> bool {
        self.drift_within_bound() && self.clients.iter().all(|c| c.steps.is_empty())
    }

    /// The conditions of I5: honest clocks and no process pauses.
    pub fn i5_applies(&self) -> bool {
        self.honest_clocks() && self.clients.iter().all(|c| c.pauses.is_empty())
    }

    /// Longest TTL in use, ns.
    pub fn max_ttl_ns(&self) -> u64 {
        self.ttls_ms.iter().copied().max().unwrap_or(0) * MS
    }

    /// How long after the active phase the world keeps running so that every
    /// lease can end and every cleanup can be confirmed on a healed network.
    pub fn settle_ns(&self) -> u64 {
        let max_timeout = self
            .clients
            .iter()
            .map(|c| c.config.request_timeout_ns.max(c.config.backoff_cap_ns))
            .max()
            .unwrap_or(0);
        self.max_wait_ns + 4 * self.max_ttl_ns() + 4 * max_timeout + self.net.tail_max_ns + 2 * SEC
    }
}
