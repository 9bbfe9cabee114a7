//! The simulated world: client hosts running real cores, the network, the reference
//! service, the fencing gate, and the invariant checks of docs/design.md §4.
//!
//! Everything happens on one true timeline driven by a priority queue of
//! events `(true time, sequence number)`, so a seed replays exactly. This module owns that
//! timeline: [`World`] builds the scenario's hosts and schedules, pops one event at a time and
//! hands it to the part that owns it. The parts:
//! - `host.rs`, the processes: each host follows the canonical loop (feed one input at its
//!   own clock's `now`, drain every output, call `handle_timeout` while the core's deadline
//!   has passed, then sleep until the earliest of the core's deadline and its workers' next
//!   action), pausing and stepping its clock when the scenario says;
//! - `workers.rs`, the application: workers that acquire, hold, renew, release and write
//!   through the fencing gate whenever the core says their lease is held;
//! - `messages.rs`, the network and the service: requests and replies as messages with
//!   their fates (delay, loss, duplication, transport errors, partitions), and the reference
//!   service that answers them on its own clock;
//! - `oracle.rs`, the checks that span a host or the whole world (I1, I3, I5, I7, rule 6 at
//!   the end); the checks tied to one output (I2, I4, rules 4 and 9) sit where that output is
//!   handled, in `host.rs`.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::fmt::Write as _;

use super::clock::DriftClock;
use super::gate::FencingGate;
use super::host::Host;
use super::messages::{ToClient, ToService};
use super::net::Network;
use super::rng::SimRng;
use super::scenario::Scenario;
use super::service::{LockService, OwnerToken};
use super::workers::{Work, Worker, gate_write};
use crate::{Client, LockName};

pub(super) const MS: u64 = 1_000_000;

/// Which invariant (or contract rule) a failure breaks.
pub type Invariant = &'static str;

/// The first invariant violation found in a run.
#[derive(Clone, Debug)]
pub struct Failure {
    /// Seed of the scenario.
    pub seed: u64,
    /// Invariant name, e.g. "I5".
    pub invariant: Invariant,
    /// What exactly went wrong.
    pub detail: String,
    /// Simulation step at which it was detected.
    pub step: u64,
    /// True time at which it was detected, ns.
    pub true_ns: u64,
}

/// Counts describing one run (to see that the worlds exercise something).
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Simulation events processed.
    pub steps: u64,
    /// Leases created by `acquire` (reentrant joins not counted).
    pub leases: u64,
    /// Acquired events (first per lease).
    pub acquired: u64,
    /// Lost events.
    pub lost: u64,
    /// AcquireFailed events.
    pub acquire_failed: u64,
    /// Released events.
    pub released: u64,
    /// Writes accepted by the gate.
    pub writes_ok: u64,
    /// Writes rejected by the gate (stale holders stopped by fencing).
    pub writes_rejected: u64,
    /// Fresh grants by the service.
    pub grants: u64,
    /// Messages handed to the network / lost.
    pub messages: u64,
    /// Messages lost.
    pub messages_lost: u64,
    /// Whether I5 was checked in this world.
    pub i5_checked: bool,
}

/// What a run produced.
#[derive(Debug)]
pub struct Outcome {
    /// Statistics.
    pub stats: Stats,
    /// The first violation, if any.
    pub failure: Option<Failure>,
    /// Readable trace (only when tracing was requested).
    pub trace: Vec<String>,
}

#[derive(Debug)]
pub(super) enum Ev {
    Wake {
        wake: u64,
    },
    AtService {
        msg: ToService,
        silent: bool,
    },
    AtClient(ToClient),
    PauseStart {
        dur: u64,
    },
    ClockStep {
        delta: i64,
    },
    /// A write whose `is_held` check happened before a pause.
    StaleWrite {
        name: LockName,
        fence: u64,
    },
    Heal,
    End,
}

pub(super) struct Queued {
    pub(super) at: u64,
    pub(super) seq: u64,
    pub(super) client: usize,
    pub(super) ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}

impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Queued {
    // Reversed: BinaryHeap is a max-heap and we want the earliest event.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// Everything but the hosts, so host code can borrow both mutably.
pub(super) struct Shared {
    pub(super) sc: Scenario,
    pub(super) queue: BinaryHeap<Queued>,
    pub(super) seq: u64,
    pub(super) now: u64,
    pub(super) step: u64,
    pub(super) net: Network,
    pub(super) service: LockService,
    pub(super) service_clock: DriftClock,
    pub(super) gate: FencingGate,
    pub(super) rng: SimRng,
    pub(super) stopping: bool,
    /// Highest token the gate accepted per name (independent of the gate: I6).
    pub(super) accepted_max: HashMap<LockName, u64>,
    /// Highest fence among live first grants seen per name (I4).
    pub(super) seen_fence: HashMap<LockName, u64>,
    /// When (true time) each grant's backend data first reached a client.
    pub(super) delivered: HashMap<(OwnerToken, Vec<u8>), u64>,
    /// Highest fresh grant per name at the service (I4).
    pub(super) grant_fence: HashMap<LockName, u64>,
    pub(super) failure: Option<Failure>,
    pub(super) trace: Option<Vec<String>>,
    pub(super) stats: Stats,
    pub(super) i5: bool,
    pub(super) honest: bool,
}

pub(super) fn hex(token: &OwnerToken) -> &str {
    std::str::from_utf8(&token[..8]).unwrap_or("?")
}

pub(super) fn secs(ns: u64) -> String {
    format!("{}.{:09}s", ns / 1_000_000_000, ns % 1_000_000_000)
}

impl Shared {
    pub(super) fn push(&mut self, at: u64, client: usize, ev: Ev) {
        self.seq += 1;
        self.queue.push(Queued {
            at,
            seq: self.seq,
            client,
            ev,
        });
    }

    pub(super) fn fail(&mut self, invariant: Invariant, detail: String) {
        if self.sc.ignore.iter().any(|i| i == invariant) {
            return;
        }
        if self.failure.is_none() {
            if let Some(t) = &mut self.trace {
                t.push(format!("!!! {invariant} violated: {detail}"));
            }
            self.failure = Some(Failure {
                seed: self.sc.seed,
                invariant,
                detail,
                step: self.step,
                true_ns: self.now,
            });
        }
    }

    pub(super) fn tracing(&self) -> bool {
        self.trace.is_some()
    }

    pub(super) fn tr(&mut self, line: String) {
        if let Some(t) = &mut self.trace {
            t.push(line);
        }
    }
}

/// A simulated world.
pub struct World {
    pub(super) hosts: Vec<Host>,
    pub(super) sh: Shared,
}

impl World {
    /// Builds the world for a scenario.
    pub fn new(sc: Scenario, trace: bool) -> World {
        let mut rng = SimRng::new(sc.seed);
        let net = Network::new(sc.net.clone(), sc.partitions.clone(), rng.fork(1));
        let mut hosts = Vec::with_capacity(sc.clients.len());
        for (i, plan) in sc.clients.iter().enumerate() {
            let mut seed = [0u8; 32];
            rng.fill(&mut seed);
            let core = Client::new(plan.config, &seed).expect("scenario configs are valid");
            let workers = (0..plan.workers)
                .map(|w| {
                    let mut wr = rng.fork(100 + (i * 16 + w) as u64);
                    let until = plan.epoch + wr.range(0, 100 * MS);
                    Worker {
                        state: Work::Idle { until },
                        rng: wr,
                    }
                })
                .collect();
            hosts.push(Host {
                core,
                config: plan.config,
                clock: DriftClock::new(0, plan.epoch, plan.ppm),
                epoch: plan.epoch,
                paused_until: 0,
                wake_gen: 0,
                workers,
                leases: HashMap::new(),
                active: Vec::new(),
                requests: HashMap::new(),
                watching: HashMap::new(),
                open: Vec::new(),
                recent: Vec::new(),
                time_jumped: false,
                inflight: HashMap::new(),
            });
        }
        let mut service = LockService::new(sc.service_fault, sc.retry_hints, sc.fence_stride);
        service.set_grant_cap(sc.grant_cap_ms);
        let service_clock = DriftClock::new(0, 1 << 41, sc.service_ppm);
        let i5 = sc.i5_applies();
        let honest = sc.honest_clocks();
        let mut sh = Shared {
            queue: BinaryHeap::new(),
            seq: 0,
            now: 0,
            step: 0,
            net,
            service,
            service_clock,
            gate: FencingGate::new(sc.gate_mode),
            rng,
            stopping: false,
            accepted_max: HashMap::new(),
            seen_fence: HashMap::new(),
            grant_fence: HashMap::new(),
            delivered: HashMap::new(),
            failure: None,
            trace: trace.then(Vec::new),
            stats: Stats {
                i5_checked: i5,
                ..Stats::default()
            },
            i5,
            honest,
            sc,
        };
        for (i, plan) in sh.sc.clients.clone().iter().enumerate() {
            sh.push(0, i, Ev::Wake { wake: 0 });
            for &(at, dur) in &plan.pauses {
                sh.push(at, i, Ev::PauseStart { dur });
            }
            for &(at, delta) in &plan.steps {
                sh.push(at, i, Ev::ClockStep { delta });
            }
        }
        let d = sh.sc.duration_ns;
        let settle = sh.sc.settle_ns();
        // Settling starts only once every pause is over, so each host gets
        // the whole settle phase to finish its leases and cleanups.
        let last_pause_end = sh
            .sc
            .clients
            .iter()
            .flat_map(|c| c.pauses.iter().map(|&(at, dur)| at + dur))
            .max()
            .unwrap_or(0);
        sh.push(d, usize::MAX, Ev::Heal);
        sh.push(d.max(last_pause_end) + settle, usize::MAX, Ev::End);
        if let Some(t) = &mut sh.trace {
            let mut s = String::new();
            let _ = write!(
                s,
                "scenario seed={} i5_checked={} honest_clocks={}\n{:#?}",
                sh.sc.seed, i5, honest, sh.sc
            );
            t.push(s);
        }
        World { hosts, sh }
    }

    /// Runs to the end (or the first violation).
    pub fn run(mut self) -> Outcome {
        while self.sh.failure.is_none() {
            let Some(q) = self.sh.queue.pop() else {
                break;
            };
            self.sh.step += 1;
            if self.sh.step > self.sh.sc.max_steps {
                let m = self.sh.sc.max_steps;
                self.sh
                    .fail("I7", format!("more than {m} simulation steps (livelock?)"));
                break;
            }
            self.sh.now = q.at;
            if matches!(q.ev, Ev::End) {
                self.finish();
                break;
            }
            self.step(q);
            if self.sh.i5 && self.sh.failure.is_none() {
                self.check_i5();
            }
        }
        let mut stats = self.sh.stats.clone();
        stats.steps = self.sh.step;
        stats.messages = self.sh.net.sent;
        stats.messages_lost = self.sh.net.lost;
        Outcome {
            stats,
            failure: self.sh.failure,
            trace: self.sh.trace.unwrap_or_default(),
        }
    }

    fn step(&mut self, q: Queued) {
        let sh = &mut self.sh;
        let c = q.client;
        match q.ev {
            Ev::Heal => {
                sh.tr(format!(
                    "{:>14} === heal the network; workers stop ===",
                    secs(sh.now)
                ));
                sh.stopping = true;
                let mut healed = Network::new(
                    super::net::NetConfig::perfect(sh.sc.net.min_delay_ns),
                    Vec::new(),
                    sh.rng.fork(2),
                );
                healed.sent = sh.net.sent;
                healed.lost = sh.net.lost;
                sh.net = healed;
                for (i, h) in self.hosts.iter_mut().enumerate() {
                    h.wake_gen += 1;
                    let wake = h.wake_gen;
                    let at = sh.now.max(h.paused_until);
                    sh.push(at, i, Ev::Wake { wake });
                }
            }
            Ev::AtService { msg, silent } => sh.at_service(c, msg, silent),
            ev => {
                let h = &mut self.hosts[c];
                if let (Ev::PauseStart { dur }, true) = (&ev, sh.now < h.paused_until) {
                    // A pause during a pause extends it (never beyond the
                    // scheduled end the settle phase waits for).
                    h.paused_until = h.paused_until.max(sh.now + dur);
                    return;
                }
                if sh.now < h.paused_until {
                    // Paused processes see nothing; the event waits for the wake-up.
                    let at = h.paused_until;
                    sh.push(at, c, ev);
                    return;
                }
                let now = h.local(sh.now);
                match ev {
                    Ev::Wake { wake } => {
                        if wake != h.wake_gen {
                            return;
                        }
                        if sh.tracing() {
                            sh.tr(format!(
                                "{:>14} c{c} (local +{}) wake",
                                secs(sh.now),
                                secs(now.saturating_sub(h.epoch))
                            ));
                        }
                        // The wake-up itself is the input (possibly early or
                        // spurious, which the core must tolerate).
                        h.core.handle_timeout(now);
                        h.drain(c, sh);
                        h.after_input(c, sh, now);
                    }
                    Ev::AtClient(msg) => {
                        h.deliver(c, sh, now, msg);
                        h.after_input(c, sh, now);
                    }
                    Ev::PauseStart { dur } => {
                        sh.tr(format!(
                            "{:>14} c{c} pauses for {} (after checking is_held)",
                            secs(sh.now),
                            secs(dur)
                        ));
                        h.paused_until = sh.now + dur;
                        h.time_jumped = true;
                        // The classic fencing case: the process checked that it
                        // holds the lease, then stalled before its write.
                        let mut pending = Vec::new();
                        for w in &h.workers {
                            if let Work::Held { lease, .. } = w.state {
                                if h.core.is_held(lease, now).unwrap_or(false) {
                                    if let Some(r) = h.leases.get(&lease) {
                                        pending.push((r.name.clone(), r.fence.unwrap_or(0)));
                                    }
                                }
                            }
                        }
                        for (name, fence) in pending {
                            let at = sh.now + dur;
                            sh.push(at, c, Ev::StaleWrite { name, fence });
                        }
                    }
                    Ev::StaleWrite { name, fence } => {
                        gate_write(sh, c, &name, fence, " (checked is_held before a pause)");
                    }
                    Ev::ClockStep { delta } => {
                        h.clock.step(sh.now, delta);
                        h.time_jumped = true;
                        sh.tr(format!(
                            "{:>14} c{c} clock steps by {delta} ns",
                            secs(sh.now)
                        ));
                        let now = h.local(sh.now);
                        h.core.handle_timeout(now);
                        h.drain(c, sh);
                        h.after_input(c, sh, now);
                    }
                    Ev::AtService { .. } | Ev::Heal | Ev::End => {}
                }
            }
        }
    }
}
