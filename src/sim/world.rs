//! The simulated world: client hosts running real cores, the network, the
//! reference service, the fencing gate, and the invariant checks of docs/design.md §4.
//!
//! Everything happens on one true timeline driven by a priority queue of
//! events `(true time, sequence number)`, so a seed replays exactly. Each host
//! follows the canonical loop: feed one input at its own clock's `now`, drain
//! every output (commands become network messages, events go to the
//! application workers), call `handle_timeout` while the core's deadline has
//! passed, then sleep until the earliest of the core's deadline and its
//! workers' next action. Workers write through the fencing gate whenever the
//! core says their lease is held.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;

use super::clock::DriftClock;
use super::gate::FencingGate;
use super::net::{Fate, Network};
use super::rng::SimRng;
use super::scenario::Scenario;
use super::service::{AcquireReply, LockService, OwnerToken, ReleaseOutcome};
use crate::{
    AcquireFailReason, AcquireOptions, AcquireResult, Client, Command, Config, Event, LeaseId,
    LeaseState, LockName, LostReason, Output, ReleaseResult, Releasing, RenewResult, RequestId,
};

const MS: u64 = 1_000_000;

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

#[derive(Clone, Debug)]
enum ToService {
    Acquire {
        req: RequestId,
        name: LockName,
        token: OwnerToken,
        ttl_ms: u64,
    },
    Renew {
        req: RequestId,
        name: LockName,
        token: OwnerToken,
        ttl_ms: u64,
        data: Option<Arc<[u8]>>,
        sent_at: u64,
    },
    Release {
        req: RequestId,
        name: LockName,
        token: OwnerToken,
        data: Option<Arc<[u8]>>,
        sent_at: u64,
    },
    Watch(LockName),
    Unwatch(LockName),
}

#[derive(Clone, Debug)]
enum ToClient {
    /// `None` = transport error.
    Acquire(RequestId, Option<AcquireReply>),
    Renew(RequestId, RenewResult),
    Release(RequestId, ReleaseResult),
    Notify(LockName),
}

#[derive(Debug)]
enum Ev {
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

struct Queued {
    at: u64,
    seq: u64,
    client: usize,
    ev: Ev,
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    Idle {
        until: u64,
    },
    Acquiring {
        lease: LeaseId,
        cancel_at: Option<u64>,
    },
    Held {
        lease: LeaseId,
        release_at: u64,
        /// When the worker next calls `renew` (`u64::MAX`: never).
        renew_at: u64,
    },
    Done,
}

struct Worker {
    state: Work,
    rng: SimRng,
}

/// What the host knows about one lease, for the oracles.
struct LeaseRec {
    name: LockName,
    token: Option<OwnerToken>,
    reentrant: bool,
    /// Core time right after `acquire` returned (start of the wait budget).
    created: u64,
    wait_ns: u64,
    fence: Option<u64>,
    terminal: Option<&'static str>,
    /// Core time of the terminal event.
    ended_at: u64,
    /// TTL the service grants for this lease (asked, or the service's cap).
    grant_ttl_ms: u64,
    app_released: bool,
    /// Upper bound for `valid_until` from confirmed requests (I1).
    max_valid: u64,
    releases_sent: u32,
    /// The service may hold a grant for this lease's token that the core
    /// knows of or cannot rule out, so rule 6 requires a release command:
    /// granted then released or lost (not rejected), an acquire attempt that
    /// failed in transport, or a grant that arrived after the end.
    needs_release: bool,
    /// An acquire attempt failed in transport (it may have been granted);
    /// matters if the lease is never granted (AcquireFailed).
    uncertain: bool,
    /// Created with automatic renewal (its workers then renew only now and then).
    auto_renew: bool,
    /// `renew` was called and no `Renewed` has answered it yet.
    renew_requested: bool,
    /// `release_reported` answered Pending and no `ReleaseOutcome` has arrived yet.
    outcome_expected: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum ReqKind {
    Acquire,
    Renew,
    Release,
}

struct ReqRec {
    lease: LeaseId,
    kind: ReqKind,
    /// Core time when the command was drained (the core's `t_sent`).
    sent: u64,
    ttl_ms: u64,
    /// A result was delivered already (later ones are duplicates).
    answered: bool,
}

struct Host {
    core: Client,
    config: Config,
    clock: DriftClock,
    epoch: u64,
    paused_until: u64,
    wake_gen: u64,
    workers: Vec<Worker>,
    leases: HashMap<LeaseId, LeaseRec>,
    /// Acquired and not yet terminal.
    active: Vec<LeaseId>,
    requests: HashMap<RequestId, ReqRec>,
    watching: HashMap<LockName, bool>,
    /// Leases without a terminal event yet.
    open: Vec<LeaseId>,
    /// Recently ended leases `(core time until which the record may stay, id)`: the core may keep
    /// their records a while (to release a late grant), which I7 allows.
    recent: Vec<(u64, LeaseId)>,
    /// The unanswered request per (lease, kind) with its core send time and
    /// timeout: rule 4 allows one renew (and one acquire attempt) in flight.
    inflight: HashMap<(LeaseId, ReqKind), (RequestId, u64, u64)>,
    /// Set by a pause or a clock step: the core's time jumped, so lingering
    /// records get a fresh window measured from the jump.
    time_jumped: bool,
}

/// Everything but the hosts, so host code can borrow both mutably.
struct Shared {
    sc: Scenario,
    queue: BinaryHeap<Queued>,
    seq: u64,
    now: u64,
    step: u64,
    net: Network,
    service: LockService,
    service_clock: DriftClock,
    gate: FencingGate,
    rng: SimRng,
    stopping: bool,
    /// Highest token the gate accepted per name (independent of the gate: I6).
    accepted_max: HashMap<LockName, u64>,
    /// Highest fence among live first grants seen per name (I4).
    seen_fence: HashMap<LockName, u64>,
    /// When (true time) each grant's backend data first reached a client.
    delivered: HashMap<(OwnerToken, Vec<u8>), u64>,
    /// Highest fresh grant per name at the service (I4).
    grant_fence: HashMap<LockName, u64>,
    failure: Option<Failure>,
    trace: Option<Vec<String>>,
    stats: Stats,
    i5: bool,
    honest: bool,
}

fn hex(token: &OwnerToken) -> &str {
    std::str::from_utf8(&token[..8]).unwrap_or("?")
}

fn secs(ns: u64) -> String {
    format!("{}.{:09}s", ns / 1_000_000_000, ns % 1_000_000_000)
}

impl Shared {
    fn push(&mut self, at: u64, client: usize, ev: Ev) {
        self.seq += 1;
        self.queue.push(Queued {
            at,
            seq: self.seq,
            client,
            ev,
        });
    }

    fn fail(&mut self, invariant: Invariant, detail: String) {
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

    fn tracing(&self) -> bool {
        self.trace.is_some()
    }

    fn tr(&mut self, line: String) {
        if let Some(t) = &mut self.trace {
            t.push(line);
        }
    }

    /// Sends a request from client `c` at the current true time.
    fn send_request(&mut self, c: usize, msg: ToService) {
        let now = self.now;
        let can_error = !matches!(msg, ToService::Watch(_) | ToService::Unwatch(_));
        match self.net.fate(c, now, can_error, false) {
            Fate::Deliver(delays) => {
                if delays.len() == 2 {
                    self.tr("    (request duplicated)".into());
                    let copy = msg.clone();
                    self.push(
                        now + delays[1],
                        c,
                        Ev::AtService {
                            msg: copy,
                            silent: false,
                        },
                    );
                }
                self.push(now + delays[0], c, Ev::AtService { msg, silent: false });
            }
            Fate::Lost => self.tr("    (request lost)".into()),
            Fate::TransportError { after_ns, reached } => {
                self.tr(format!(
                    "    (request fails in transport; reached service: {reached})"
                ));
                let err = match &msg {
                    ToService::Acquire { req, .. } => Some(ToClient::Acquire(*req, None)),
                    ToService::Renew { req, .. } => {
                        Some(ToClient::Renew(*req, RenewResult::TransportError))
                    }
                    ToService::Release { req, .. } => {
                        Some(ToClient::Release(*req, ReleaseResult::TransportError))
                    }
                    _ => None,
                };
                if let Some(e) = err {
                    self.push(now + after_ns, c, Ev::AtClient(e));
                }
                if reached {
                    self.push(now + after_ns / 2, c, Ev::AtService { msg, silent: true });
                }
            }
        }
    }

    /// Sends a reply or notification from the service to client `c`.
    fn send_reply(&mut self, c: usize, msg: ToClient) {
        let now = self.now;
        let is_notify = matches!(msg, ToClient::Notify(_));
        match self.net.fate(c, now, !is_notify, true) {
            Fate::Deliver(delays) => {
                if delays.len() == 2 {
                    let copy = msg.clone();
                    self.push(now + delays[1], c, Ev::AtClient(copy));
                }
                self.push(now + delays[0], c, Ev::AtClient(msg));
            }
            Fate::Lost => {}
            Fate::TransportError { after_ns, .. } => {
                let err = match msg {
                    ToClient::Acquire(r, _) => ToClient::Acquire(r, None),
                    ToClient::Renew(r, _) => ToClient::Renew(r, RenewResult::TransportError),
                    ToClient::Release(r, _) => ToClient::Release(r, ReleaseResult::TransportError),
                    n @ ToClient::Notify(_) => n,
                };
                self.push(now + after_ns, c, Ev::AtClient(err));
            }
        }
    }

    /// A renew/release carried other backend data than the token's live grant.
    /// That is the core's fault only if the live grant's data had been
    /// delivered to it before it sent the command (a grant answered by a
    /// transport error cannot be known).
    fn judge_echo(&mut self, sent_at: u64) {
        let Some(m) = self.service.take_echo_mismatch() else {
            return;
        };
        // Only a cleanup release must adopt a late grant's data (rule 6); a
        // renew of a live lease rightly keeps its own grant's data (rule 5),
        // and the service refuses it if that grant is gone.
        let known = m.what == "release"
            && self
                .delivered
                .get(&(m.token, m.live.clone()))
                .is_some_and(|&t| t < sent_at);
        let msg = format!(
            "{} for token {} echoed backend data {:?}, but its live grant has {:?}{}",
            m.what,
            hex(&m.token),
            String::from_utf8_lossy(&m.sent),
            String::from_utf8_lossy(&m.live),
            if known {
                ", which the client had received"
            } else {
                " (not the core's fault: a renew, or data it never received)"
            }
        );
        if known {
            self.fail("echo", msg);
        } else {
            self.tr(format!("    note: {msg}"));
        }
    }

    /// A fresh grant by the service (not an idempotent re-grant): fences rise per name (I4).
    fn fresh_grant(&mut self, name: &LockName, fence: u64) {
        self.stats.grants += 1;
        let prev = self.grant_fence.insert(name.clone(), fence);
        if prev.is_some_and(|p| p >= fence) {
            self.fail(
                "I4",
                format!(
                    "service granted {name:?} with fence {fence} after fence {}",
                    prev.unwrap_or(0)
                ),
            );
        }
    }

    /// Notifies the watchers of a release.
    fn after_release(&mut self, name: &LockName, out: ReleaseOutcome) {
        for w in out.watchers {
            self.send_reply(w, ToClient::Notify(name.clone()));
        }
    }

    /// The service processes one message from client `c`.
    fn at_service(&mut self, c: usize, msg: ToService, silent: bool) {
        let snow = self.service_clock.local(self.now);
        let reply = match msg {
            ToService::Acquire {
                req,
                name,
                token,
                ttl_ms,
            } => {
                let grants_before = self.service.grants();
                let r = self.service.acquire(snow, &name, token, ttl_ms);
                if let AcquireReply::Granted { fence, .. } = &r {
                    if self.service.grants() > grants_before {
                        self.fresh_grant(&name, *fence);
                    }
                }
                self.tr(format!(
                    "{:>14} service <- c{c} Acquire req={req} {name:?} token={} ttl={ttl_ms}ms => {r:?}{}",
                    secs(self.now),
                    hex(&token),
                    if silent { " (reply lost)" } else { "" }
                ));
                Some(ToClient::Acquire(req, Some(r)))
            }
            ToService::Renew {
                req,
                name,
                token,
                ttl_ms,
                data,
                sent_at,
            } => {
                let ok = self
                    .service
                    .renew(snow, &name, token, ttl_ms, data.as_deref());
                self.judge_echo(sent_at);
                self.tr(format!(
                    "{:>14} service <- c{c} Renew req={req} {name:?} token={} => {}",
                    secs(self.now),
                    hex(&token),
                    if ok { "renewed" } else { "rejected" }
                ));
                let r = if ok {
                    RenewResult::Renewed
                } else {
                    RenewResult::Rejected
                };
                Some(ToClient::Renew(req, r))
            }
            ToService::Release {
                req,
                name,
                token,
                data,
                sent_at,
            } => {
                let out = self.service.release(snow, &name, token, data.as_deref());
                self.judge_echo(sent_at);
                let ok = out.released;
                self.tr(format!(
                    "{:>14} service <- c{c} Release req={req} {name:?} token={} => {} notify {:?}",
                    secs(self.now),
                    hex(&token),
                    if ok { "released" } else { "not owner" },
                    out.watchers
                ));
                self.after_release(&name, out);
                let r = if ok {
                    ReleaseResult::Released
                } else {
                    ReleaseResult::NotOwner
                };
                Some(ToClient::Release(req, r))
            }
            ToService::Watch(name) => {
                self.service.watch(c, &name);
                None
            }
            ToService::Unwatch(name) => {
                self.service.unwatch(c, &name);
                None
            }
        };
        if let Some(v) = self.service.violations().first() {
            let v = v.clone();
            self.fail("protocol", v);
        }
        if let Some(r) = reply {
            if !silent {
                self.send_reply(c, r);
            }
        }
    }
}

/// The drift the core must subtract, computed independently of the core.
fn drift_ns(cfg: &Config, ttl_ms: u64) -> u64 {
    let ttl_ns = u128::from(ttl_ms) * u128::from(MS);
    (ttl_ns * u128::from(cfg.drift_ppm) / 1_000_000) as u64 + cfg.drift_fixed_ns
}

impl Host {
    fn local(&self, t: u64) -> u64 {
        self.clock.local(t)
    }

    /// Drains every output after one input, turning commands into messages
    /// and events into worker transitions, and checking I2/I4/I7 on the way.
    fn drain(&mut self, c: usize, sh: &mut Shared) {
        let live = self.core.counters().live_leases;
        let bound = 64 + 8 * live;
        let mut n = 0u64;
        while let Some(out) = self.core.poll_output() {
            n += 1;
            if n > bound {
                sh.fail(
                    "I7",
                    format!("one input produced more than {bound} outputs ({live} live leases)"),
                );
                return;
            }
            match out {
                Output::Command(cmd) => self.on_command(c, sh, cmd),
                Output::Event(ev) => self.on_event(c, sh, ev),
            }
        }
    }

    fn on_command(&mut self, c: usize, sh: &mut Shared, cmd: Command) {
        let sent = self.core.now();
        if sh.tracing() {
            sh.tr(format!("    c{c} -> {cmd:?}"));
        }
        let (lease, token, kind, req, ttl_ms) = match &cmd {
            Command::Acquire {
                request,
                lease,
                token,
                ttl_ms,
                ..
            } => (*lease, token.to_hex(), ReqKind::Acquire, *request, *ttl_ms),
            Command::Renew {
                request,
                lease,
                token,
                ttl_ms,
                ..
            } => (*lease, token.to_hex(), ReqKind::Renew, *request, *ttl_ms),
            Command::Release {
                request,
                lease,
                token,
                ..
            } => (*lease, token.to_hex(), ReqKind::Release, *request, 0),
            Command::Watch { name } => {
                let was = self.watching.insert(name.clone(), true).unwrap_or(false);
                if was {
                    sh.fail(
                        "watch",
                        format!("c{c}: Watch {name:?} while already watching"),
                    );
                }
                sh.send_request(c, ToService::Watch(name.clone()));
                return;
            }
            Command::Unwatch { name } => {
                let was = self.watching.insert(name.clone(), false).unwrap_or(false);
                if !was {
                    sh.fail(
                        "watch",
                        format!("c{c}: Unwatch {name:?} while not watching"),
                    );
                }
                sh.send_request(c, ToService::Unwatch(name.clone()));
                return;
            }
        };
        let Some(rec) = self.leases.get_mut(&lease) else {
            sh.fail(
                "I2",
                format!("c{c}: command for lease {lease} never created: {cmd:?}"),
            );
            return;
        };
        match rec.token {
            None => rec.token = Some(token),
            Some(t) if t != token => {
                sh.fail(
                    "rule 9",
                    format!("c{c}: lease {lease} changed its ownership token: {cmd:?}"),
                );
            }
            _ => {}
        }
        if let Some(term) = rec.terminal {
            if kind != ReqKind::Release {
                sh.fail(
                    "I2",
                    format!(
                        "c{c}: {kind:?} command for lease {lease} after its terminal event {term}"
                    ),
                );
            }
        }
        if kind == ReqKind::Release {
            rec.releases_sent += 1;
            if rec.releases_sent > 1000 {
                sh.fail(
                    "I7",
                    format!("c{c}: more than 1000 release commands for lease {lease}"),
                );
            }
        }
        if kind != ReqKind::Release {
            let timeout = if kind == ReqKind::Renew {
                self.config.request_timeout_ns.min(ttl_ms * MS / 3).max(1)
            } else {
                self.config.request_timeout_ns
            };
            if let Some((prev, psent, ptimeout)) =
                self.inflight.insert((lease, kind), (req, sent, timeout))
            {
                if psent.saturating_add(ptimeout) > sent {
                    sh.fail(
                        "rule 4",
                        format!(
                            "c{c}: {kind:?} {req} for lease {lease} while {prev} (sent {psent}, timeout {ptimeout}) is unanswered and not timed out"
                        ),
                    );
                }
            }
        }
        if self
            .requests
            .insert(
                req,
                ReqRec {
                    lease,
                    kind,
                    sent,
                    ttl_ms,
                    answered: false,
                },
            )
            .is_some()
        {
            sh.fail("contract", format!("c{c}: request id {req} reused"));
        }
        let msg = match cmd {
            Command::Acquire {
                request,
                name,
                ttl_ms,
                ..
            } => ToService::Acquire {
                req: request,
                name,
                token,
                ttl_ms,
            },
            Command::Renew {
                request,
                name,
                ttl_ms,
                backend_data,
                ..
            } => ToService::Renew {
                req: request,
                name,
                token,
                ttl_ms,
                data: backend_data,
                sent_at: sh.now,
            },
            Command::Release {
                request,
                name,
                backend_data,
                ..
            } => ToService::Release {
                req: request,
                name,
                token,
                data: backend_data,
                sent_at: sh.now,
            },
            Command::Watch { .. } | Command::Unwatch { .. } => return,
        };
        sh.send_request(c, msg);
    }

    fn on_event(&mut self, c: usize, sh: &mut Shared, ev: Event) {
        let now = self.core.now();
        if sh.tracing() {
            sh.tr(format!("    c{c} event {ev:?}"));
        }
        let lease = match ev {
            Event::Acquired { lease, .. }
            | Event::AcquireFailed { lease, .. }
            | Event::Lost { lease, .. }
            | Event::Released { lease }
            | Event::Renewed { lease, .. }
            | Event::ReleaseOutcome { lease, .. } => lease,
        };
        let Some(rec) = self.leases.get_mut(&lease) else {
            sh.fail(
                "I2",
                format!("c{c}: event for lease {lease} never created: {ev:?}"),
            );
            return;
        };
        if let Event::ReleaseOutcome { .. } = ev {
            // Follows the lease's Released, once, and only for a reported release.
            if rec.terminal != Some("Released") || !std::mem::take(&mut rec.outcome_expected) {
                sh.fail(
                    "contract",
                    format!("c{c}: {ev:?} unasked for, repeated or not after Released"),
                );
            }
            return;
        }
        if let Some(term) = rec.terminal {
            sh.fail("I2", format!("c{c}: {ev:?} after terminal event {term}"));
            return;
        }
        match ev {
            Event::Acquired {
                fencing_token,
                valid_until,
                ..
            } => {
                let first = rec.fence.is_none();
                if let Some(f) = rec.fence {
                    if f != fencing_token {
                        sh.fail(
                            "I4",
                            format!("c{c}: lease {lease} re-acquired with fence {fencing_token}, had {f}"),
                        );
                    }
                }
                rec.fence = Some(fencing_token);
                let granted = rec
                    .token
                    .and_then(|t| sh.service.history(&t))
                    .is_some_and(|h| h.fences.contains(&fencing_token));
                if !granted {
                    sh.fail(
                        "I4",
                        format!("c{c}: lease {lease} reports fence {fencing_token}, never granted to its token"),
                    );
                }
                if valid_until > rec.max_valid {
                    sh.fail(
                        "I1",
                        format!(
                            "c{c}: lease {lease} Acquired with valid_until {valid_until} beyond t_sent + ttl - drift = {}",
                            rec.max_valid
                        ),
                    );
                }
                if first {
                    sh.stats.acquired += 1;
                    self.active.push(lease);
                    if sh.honest && valid_until > now {
                        let prev = sh.seen_fence.get(&rec.name).copied().unwrap_or(0);
                        if fencing_token <= prev {
                            sh.fail(
                                "I4",
                                format!(
                                    "c{c}: lease {lease} on {:?} acquired with fence {fencing_token} after a live grant with fence {prev} was seen",
                                    rec.name
                                ),
                            );
                        }
                        sh.seen_fence.insert(rec.name.clone(), fencing_token);
                    }
                }
                let ttl_ns = rec.grant_ttl_ms * MS;
                let auto_renew = rec.auto_renew;
                for w in &mut self.workers {
                    if let Work::Acquiring { lease: l, .. } = w.state {
                        if l == lease {
                            let hold = w.rng.range(0, 3 * sh.sc.max_ttl_ns());
                            let renew_at = next_manual_renewal(&mut w.rng, auto_renew, now, ttl_ns);
                            w.state = Work::Held {
                                lease,
                                release_at: now + hold,
                                renew_at,
                            };
                        }
                    }
                }
                return;
            }
            Event::Renewed { valid_until, .. } => {
                if !std::mem::take(&mut rec.renew_requested) {
                    sh.fail(
                        "contract",
                        format!("c{c}: Renewed for lease {lease} without renew()"),
                    );
                }
                if valid_until > rec.max_valid {
                    sh.fail(
                        "I1",
                        format!(
                            "c{c}: lease {lease} Renewed with valid_until {valid_until} beyond t_sent + ttl - drift = {}",
                            rec.max_valid
                        ),
                    );
                }
                return;
            }
            Event::ReleaseOutcome { .. } => return,
            Event::AcquireFailed { reason, .. } => {
                if rec.fence.is_some() {
                    sh.fail(
                        "I2",
                        format!("c{c}: AcquireFailed after Acquired for lease {lease}"),
                    );
                }
                if reason == AcquireFailReason::Cancelled && !rec.app_released {
                    sh.fail(
                        "I2",
                        format!("c{c}: lease {lease} Cancelled without release()"),
                    );
                }
                rec.terminal = Some("AcquireFailed");
                rec.ended_at = now;
                sh.stats.acquire_failed += 1;
            }
            Event::Lost { reason, .. } => {
                if reason != LostReason::Rejected {
                    rec.needs_release = true;
                }
                if rec.fence.is_none() {
                    sh.fail(
                        "I2",
                        format!("c{c}: Lost before Acquired for lease {lease}"),
                    );
                }
                rec.terminal = Some("Lost");
                rec.ended_at = now;
                sh.stats.lost += 1;
            }
            Event::Released { .. } => {
                if rec.fence.is_some() {
                    rec.needs_release = true;
                }
                if !rec.app_released {
                    sh.fail(
                        "I2",
                        format!("c{c}: Released without release() for lease {lease}"),
                    );
                }
                rec.terminal = Some("Released");
                rec.ended_at = now;
                sh.stats.released += 1;
            }
        }
        // Terminal event: detach workers and forget the lease as active.
        self.open.retain(|l| *l != lease);
        self.active.retain(|l| *l != lease);
        // Records of ended leases may linger while an answer may still come
        // (an in-flight request, then a cleanup whose give-up time is one TTL
        // plus one request timeout later): a bounded window, so the table
        // stays O(leases ended within it).
        let until = now + self.linger(sh);
        self.recent.push((until, lease));
        for w in &mut self.workers {
            match w.state {
                Work::Acquiring { lease: l, .. } | Work::Held { lease: l, .. } if l == lease => {
                    let pause = w.rng.range(0, 200 * MS);
                    w.state = Work::Idle { until: now + pause };
                }
                _ => {}
            }
        }
    }

    /// Runs the workers whose next action is due at local time `now`.
    fn run_workers(&mut self, c: usize, sh: &mut Shared, now: u64) {
        for i in 0..self.workers.len() {
            let state = self.workers[i].state;
            match state {
                Work::Idle { until } if until <= now => {
                    if sh.stopping {
                        self.workers[i].state = Work::Done;
                        continue;
                    }
                    self.start_acquire(c, sh, i, now);
                }
                Work::Acquiring {
                    lease,
                    cancel_at: Some(at),
                } if at <= now => {
                    self.app_release(c, sh, i, lease, now);
                }
                Work::Held {
                    lease, release_at, ..
                } if release_at <= now || sh.stopping => {
                    self.app_release(c, sh, i, lease, now);
                }
                Work::Held {
                    lease, renew_at, ..
                } if renew_at <= now => {
                    self.app_renew(c, sh, i, lease, now);
                }
                _ => {}
            }
        }
    }

    fn start_acquire(&mut self, c: usize, sh: &mut Shared, i: usize, now: u64) {
        let w = &mut self.workers[i];
        let name = LockName::from(w.rng.pick(&sh.sc.names).as_str());
        let ttl_ms = *w.rng.pick(&sh.sc.ttls_ms);
        let wait_ns = if w.rng.chance_ppm(300_000) {
            0
        } else {
            w.rng.range(0, sh.sc.max_wait_ns)
        };
        let reentrant = w.rng.chance_ppm(250_000);
        let cancel_at = w
            .rng
            .chance_ppm(100_000)
            .then(|| now + w.rng.range(0, wait_ns.max(20 * MS)));
        let auto_renew = !w.rng.chance_ppm(150_000);
        let opts = AcquireOptions {
            ttl_ms,
            wait_ns,
            reentrant,
            auto_renew,
        };
        if sh.tracing() {
            sh.tr(format!("    c{c} worker {i}: acquire({name:?}, {opts:?})"));
        }
        match self.core.acquire(now, &name, opts) {
            Ok(lease) => {
                let created = self.core.now();
                if let Some(rec) = self.leases.get(&lease) {
                    // A reentrant join must return a live reentrant lease of that name.
                    if !reentrant || !rec.reentrant || rec.name != name || rec.terminal.is_some() {
                        sh.fail(
                            "I2",
                            format!("c{c}: acquire returned existing lease {lease} (reentrant={reentrant}) for {name:?}"),
                        );
                    }
                } else {
                    sh.stats.leases += 1;
                    self.open.push(lease);
                    self.leases.insert(
                        lease,
                        LeaseRec {
                            name,
                            token: None,
                            reentrant,
                            created,
                            wait_ns,
                            fence: None,
                            terminal: None,
                            ended_at: 0,
                            grant_ttl_ms: sh.sc.grant_cap_ms.map_or(ttl_ms, |cap| ttl_ms.min(cap)),
                            app_released: false,
                            max_valid: 0,
                            releases_sent: 0,
                            needs_release: false,
                            uncertain: false,
                            auto_renew,
                            renew_requested: false,
                            outcome_expected: false,
                        },
                    );
                }
                self.workers[i].state = Work::Acquiring { lease, cancel_at };
                self.drain(c, sh);
            }
            Err(e) => sh.fail("contract", format!("c{c}: valid acquire refused: {e}")),
        }
    }

    fn app_release(&mut self, c: usize, sh: &mut Shared, i: usize, lease: LeaseId, now: u64) {
        let holders = self.core.lease_info(lease).map(|x| x.holders).unwrap_or(0);
        sh.tr(format!(
            "    c{c} worker {i}: release(lease {lease}) holders={holders}"
        ));
        let pause = self.workers[i].rng.range(0, 200 * MS);
        self.workers[i].state = Work::Idle { until: now + pause };
        if let Some(rec) = self.leases.get_mut(&lease) {
            rec.app_released = true;
        }
        let result = if self.workers[i].rng.chance_ppm(500_000) {
            self.core.release_reported(now, lease).map(Some)
        } else {
            self.core.release(now, lease).map(|()| None)
        };
        match result {
            Ok(releasing) => {
                if releasing == Some(Releasing::Pending) {
                    if let Some(rec) = self.leases.get_mut(&lease) {
                        rec.outcome_expected = true;
                    }
                }
                self.drain(c, sh);
                let rec = self.leases.get(&lease);
                let ok = match releasing {
                    None => true,
                    Some(Releasing::HolderLeft) => holders > 1,
                    Some(Releasing::Pending) => rec.is_some_and(|r| r.terminal == Some("Released")),
                    Some(Releasing::Lost) => rec.is_some_and(|r| r.terminal == Some("Lost")),
                    Some(Releasing::NotAcquired) => {
                        rec.is_some_and(|r| r.terminal == Some("AcquireFailed"))
                    }
                };
                if !ok {
                    sh.fail(
                        "contract",
                        format!("c{c}: release_reported(lease {lease}) said {releasing:?}, events disagree"),
                    );
                }
                if holders <= 1 {
                    if self.core.is_held(lease, now).unwrap_or(false) {
                        sh.fail(
                            "contract",
                            format!("c{c}: lease {lease} still held after release()"),
                        );
                    }
                    let ended = self
                        .leases
                        .get(&lease)
                        .is_some_and(|r| r.terminal.is_some());
                    if !ended {
                        sh.fail(
                            "contract",
                            format!(
                                "c{c}: release(lease {lease}) emitted no terminal event at once"
                            ),
                        );
                    }
                }
            }
            Err(e) => sh.fail(
                "contract",
                format!("c{c}: release of a lease the app holds failed: {e}"),
            ),
        }
    }

    /// A worker renews its held lease by hand (auto-renewed leases now and then, others
    /// regularly; those are lost when a renewal comes too late, as they should be).
    fn app_renew(&mut self, c: usize, sh: &mut Shared, i: usize, lease: LeaseId, now: u64) {
        sh.tr(format!("    c{c} worker {i}: renew(lease {lease})"));
        let (auto_renew, ttl_ns) = self
            .leases
            .get(&lease)
            .map_or((true, 0), |r| (r.auto_renew, r.grant_ttl_ms * MS));
        let w = &mut self.workers[i];
        let next = next_manual_renewal(&mut w.rng, auto_renew, now, ttl_ns);
        if let Work::Held { renew_at, .. } = &mut w.state {
            *renew_at = next;
        }
        match self.core.renew(now, lease) {
            Ok(()) => {
                if let Some(rec) = self.leases.get_mut(&lease) {
                    rec.renew_requested = true;
                }
                self.drain(c, sh);
            }
            Err(e) => sh.fail(
                "contract",
                format!("c{c}: renew of a lease the app holds failed: {e}"),
            ),
        }
    }

    /// The bound on `valid_until` after a positive answer to `req` (I1).
    fn note_confirmed(&mut self, req: RequestId, granted_ttl_ms: u64) {
        if let Some(r) = self.requests.get(&req) {
            let ttl = r.ttl_ms.min(granted_ttl_ms);
            let bound = (r.sent + ttl * MS).saturating_sub(drift_ns(&self.config, ttl));
            if let Some(rec) = self.leases.get_mut(&r.lease) {
                rec.max_valid = rec.max_valid.max(bound);
            }
        }
    }

    /// Feeds one message to the core.
    fn deliver(&mut self, c: usize, sh: &mut Shared, now: u64, msg: ToClient) {
        if sh.tracing() {
            sh.tr(format!(
                "{:>14} c{c} (local +{}) <- {msg:?}",
                secs(sh.now),
                secs(now.saturating_sub(self.epoch))
            ));
        }
        let first_answer = match &msg {
            ToClient::Acquire(req, _) | ToClient::Renew(req, _) | ToClient::Release(req, _) => {
                match self.requests.get_mut(req) {
                    Some(r) if !r.answered => {
                        r.answered = true;
                        Some(r.lease)
                    }
                    _ => None,
                }
            }
            ToClient::Notify(_) => None,
        };
        if let (ToClient::Acquire(_, reply), Some(lease)) = (&msg, first_answer) {
            if let Some(rec) = self.leases.get_mut(&lease) {
                match reply {
                    None => rec.uncertain = true,
                    // A late grant must be released at once (rule 6) while
                    // the core still keeps the record: up to one TTL plus
                    // one request timeout after the end (bounded retention,
                    // I7); a grant arriving later expires by its TTL.
                    Some(AcquireReply::Granted { .. })
                        if rec.terminal.is_some()
                            && now.max(self.core.now())
                                < rec.ended_at
                                    + rec.grant_ttl_ms * MS
                                    + self.config.request_timeout_ns =>
                    {
                        rec.needs_release = true;
                    }
                    _ => {}
                }
            }
        }
        let answered = match &msg {
            ToClient::Acquire(req, _) => Some((*req, ReqKind::Acquire)),
            ToClient::Renew(req, _) => Some((*req, ReqKind::Renew)),
            ToClient::Release(..) | ToClient::Notify(_) => None,
        };
        if let Some((req, kind)) = answered {
            if let Some(r) = self.requests.get(&req) {
                let key = (r.lease, kind);
                if self.inflight.get(&key).is_some_and(|x| x.0 == req) {
                    self.inflight.remove(&key);
                }
            }
        }
        let r = match msg {
            ToClient::Acquire(req, reply) => {
                let kind_ok = self
                    .requests
                    .get(&req)
                    .is_some_and(|r| r.kind == ReqKind::Acquire);
                match reply {
                    Some(AcquireReply::Granted {
                        fence,
                        ttl_ms,
                        backend_data,
                    }) => {
                        if kind_ok {
                            self.note_confirmed(req, ttl_ms);
                        }
                        let token = self
                            .requests
                            .get(&req)
                            .and_then(|r| self.leases.get(&r.lease))
                            .and_then(|l| l.token);
                        // A duplicate of an answered request is ignored by the core
                        // (rule 5), so its data does not count as received. A service that
                        // re-grants a duplicated acquire after the release (this one does)
                        // leaves that grant to expire by its TTL.
                        if let (Some(token), true) = (token, first_answer.is_some()) {
                            let now = sh.now;
                            sh.delivered
                                .entry((token, backend_data.clone()))
                                .or_insert(now);
                        }
                        let r = AcquireResult::Granted {
                            fencing_token: fence,
                            ttl_ms,
                            backend_data: &backend_data,
                        };
                        self.core.handle_acquire_result(now, req, r)
                    }
                    Some(AcquireReply::HeldByOther { retry_after_ms }) => {
                        self.core.handle_acquire_result(
                            now,
                            req,
                            AcquireResult::HeldByOther { retry_after_ms },
                        )
                    }
                    None => {
                        self.core
                            .handle_acquire_result(now, req, AcquireResult::TransportError)
                    }
                }
            }
            ToClient::Renew(req, r) => {
                if r == RenewResult::Renewed
                    && self
                        .requests
                        .get(&req)
                        .is_some_and(|x| x.kind == ReqKind::Renew)
                {
                    let ttl = self.requests[&req].ttl_ms;
                    self.note_confirmed(req, ttl);
                }
                self.core.handle_renew_result(now, req, r)
            }
            ToClient::Release(req, r) => self.core.handle_release_result(now, req, r),
            ToClient::Notify(name) => self.core.handle_released(now, &name),
        };
        if let Err(e) = r {
            sh.fail("contract", format!("c{c}: result input refused: {e}"));
        }
        self.drain(c, sh);
    }

    /// After an input: timeouts, writes, per-host checks, next wake-up.
    fn after_input(&mut self, c: usize, sh: &mut Shared, now: u64) {
        let mut rounds = 0;
        while let Some(d) = self.core.poll_timeout() {
            if d > now {
                break;
            }
            rounds += 1;
            if rounds > 64 {
                sh.fail(
                    "I7",
                    format!("c{c}: deadline {d} stays due after 64 handle_timeout({now}) calls"),
                );
                return;
            }
            self.core.handle_timeout(now);
            self.drain(c, sh);
        }
        self.run_workers_if_due(c, sh, now);
        self.writes(c, sh, now);
        self.check(c, sh, now);
        self.schedule(c, sh, now);
    }

    fn run_workers_if_due(&mut self, c: usize, sh: &mut Shared, now: u64) {
        let due = self.workers.iter().any(|w| match w.state {
            Work::Idle { until } => until <= now,
            Work::Acquiring { cancel_at, .. } => cancel_at.is_some_and(|a| a <= now),
            Work::Held {
                release_at,
                renew_at,
                ..
            } => release_at <= now || renew_at <= now || sh.stopping,
            Work::Done => false,
        });
        if due {
            self.run_workers(c, sh, now);
            // Worker inputs may have made deadlines due (e.g. a zero wait).
            let mut rounds = 0;
            while self.core.poll_timeout().is_some_and(|d| d <= now) && rounds < 64 {
                rounds += 1;
                self.core.handle_timeout(now);
                self.drain(c, sh);
            }
        }
    }

    /// Protected writes by every worker whose lease the core says is held.
    fn writes(&mut self, c: usize, sh: &mut Shared, now: u64) {
        for i in 0..self.workers.len() {
            let Work::Held { lease, .. } = self.workers[i].state else {
                continue;
            };
            if self.core.is_held(lease, now).unwrap_or(false) {
                let Some(rec) = self.leases.get(&lease) else {
                    continue;
                };
                let fence = self.core.fencing_token(lease).ok().flatten();
                if fence != rec.fence {
                    sh.fail(
                        "I4",
                        format!(
                            "c{c}: fencing_token({lease}) = {fence:?}, Acquired said {:?}",
                            rec.fence
                        ),
                    );
                    return;
                }
                let name = rec.name.clone();
                gate_write(sh, c, &name, fence.unwrap_or(0), "");
            }
        }
    }

    /// I1, I3 and I7 for this host, after its timeouts were handled.
    fn check(&mut self, c: usize, sh: &mut Shared, now: u64) {
        let cnow = self.core.now();
        if cnow < now {
            sh.fail(
                "contract",
                format!("c{c}: core now {cnow} behind input now {now}"),
            );
        }
        let next_deadline = self.core.poll_timeout().unwrap_or(u64::MAX);
        for &lease in &self.open {
            let rec = &self.leases[&lease];
            if rec.fence.is_none() {
                let deadline = rec.created + rec.wait_ns + self.config.request_timeout_ns;
                if next_deadline > deadline {
                    // Rule 7 / I3: the core must ask to be woken by then, not
                    // rely on some other input arriving.
                    sh.fail(
                        "I3",
                        format!(
                            "c{c}: lease {lease} acquiring until at most {deadline}, but the next deadline is {next_deadline}"
                        ),
                    );
                }
                if cnow > deadline {
                    sh.fail(
                        "I3",
                        format!(
                            "c{c}: lease {lease} still acquiring at {cnow}, past wait deadline + request timeout {deadline}"
                        ),
                    );
                }
                continue;
            }
            let vu = self.core.valid_until(lease).ok().flatten().unwrap_or(0);
            if next_deadline > vu {
                // Rule 3: loss is detected locally and on time, even if no
                // input ever arrives.
                sh.fail(
                    "I3",
                    format!(
                        "c{c}: lease {lease} valid until {vu}, but the next deadline is {next_deadline}"
                    ),
                );
            }
            if cnow >= vu {
                sh.fail(
                    "I3",
                    format!(
                        "c{c}: lease {lease} not ended at {cnow} although valid_until {vu} passed"
                    ),
                );
            }
            if vu > rec.max_valid {
                sh.fail(
                    "I1",
                    format!(
                        "c{c}: lease {lease} valid_until {vu} beyond t_sent + ttl - drift = {}",
                        rec.max_valid
                    ),
                );
            }
            if self.core.is_held(lease, vu).unwrap_or(false) {
                sh.fail("I1", format!("c{c}: is_held({lease}, valid_until) is true"));
            }
        }
        let k = self.core.counters();
        if std::mem::take(&mut self.time_jumped) {
            let linger = self.linger(sh);
            for r in &mut self.recent {
                r.0 = r.0.max(cnow + linger);
            }
        }
        self.recent.retain(|(until, _)| *until >= cnow);
        let allowed = (self.open.len() + self.recent.len()) as u64 + k.pending_cleanups;
        if k.live_leases > allowed {
            sh.fail(
                "I7",
                format!(
                    "c{c}: {} lease records for {} open leases, {} recently ended and {} pending cleanups",
                    k.live_leases,
                    self.open.len(),
                    self.recent.len(),
                    k.pending_cleanups
                ),
            );
        }
    }

    /// How long after its end (core time) a lease record may stay.
    fn linger(&self, sh: &Shared) -> u64 {
        2 * (self.config.request_timeout_ns + sh.sc.max_ttl_ns()) + self.config.backoff_cap_ns
    }

    /// Schedules the next wake-up at the earliest of the core deadline and the
    /// workers' next actions, mapped from local to true time.
    fn schedule(&mut self, c: usize, sh: &mut Shared, now: u64) {
        let mut next = self.core.poll_timeout().unwrap_or(u64::MAX);
        for w in &self.workers {
            let t = match w.state {
                Work::Idle { until } => until,
                Work::Acquiring { cancel_at, .. } => cancel_at.unwrap_or(u64::MAX),
                Work::Held { release_at, .. } => {
                    // Also wake regularly to write while held.
                    release_at.min(now + 7 * MS)
                }
                Work::Done => u64::MAX,
            };
            next = next.min(t);
        }
        self.wake_gen += 1;
        if next == u64::MAX {
            return;
        }
        let at = self.clock.true_at(next.max(now + 1)).max(sh.now + 1);
        let wake = self.wake_gen;
        sh.push(at, c, Ev::Wake { wake });
    }
}

fn gate_write(sh: &mut Shared, c: usize, name: &LockName, fence: u64, why: &str) {
    let ok = sh.gate.write(name, fence);
    if ok {
        sh.stats.writes_ok += 1;
        let max = sh.accepted_max.entry(name.clone()).or_insert(0);
        if fence < *max {
            let m = *max;
            sh.fail(
                "I6",
                format!("c{c}: gate accepted fence {fence} on {name:?} after accepting {m}{why}"),
            );
        } else {
            *max = fence;
        }
    } else {
        sh.stats.writes_rejected += 1;
        sh.tr(format!(
            "    c{c} write {name:?} fence {fence}{why} REJECTED by the gate"
        ));
    }
}

/// A simulated world.
pub struct World {
    hosts: Vec<Host>,
    sh: Shared,
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

    /// I5: in an honest world, whenever a client's core says a lease is held
    /// (on that client's clock at this true instant), the service's current
    /// unexpired holder of the name is that very lease.
    fn check_i5(&mut self) {
        let t = self.sh.now;
        let snow = self.sh.service_clock.local(t);
        for (c, h) in self.hosts.iter().enumerate() {
            let local = h.clock.local(t);
            for &lease in &h.active {
                if !h.core.is_held(lease, local).unwrap_or(false) {
                    continue;
                }
                let rec = &h.leases[&lease];
                let holder = self.sh.service.holder(snow, &rec.name);
                let mine = match (holder, rec.token) {
                    (Some((tok, _)), Some(mine)) => tok == mine,
                    _ => false,
                };
                if !mine {
                    let vu = h.core.valid_until(lease).ok().flatten().unwrap_or(0);
                    let vu_true = h.clock.true_at(vu);
                    let detail = format!(
                        "c{c}: lease {lease} on {:?} is held until true {} but the service's holder at true {} is {:?}",
                        rec.name,
                        secs(vu_true),
                        secs(t),
                        holder.map(|(tok, f)| (hex(&tok).to_owned(), f))
                    );
                    self.sh.fail("I5", detail);
                    return;
                }
            }
        }
    }

    /// Final checks after the settle phase: every lease ended, every cleanup
    /// confirmed, no table left non-empty (I3, rule 6, I7).
    fn finish(&mut self) {
        let sh = &mut self.sh;
        sh.tr(format!("{:>14} === end ===", secs(sh.now)));
        for (c, h) in self.hosts.iter().enumerate() {
            for (lease, rec) in &h.leases {
                if rec.terminal.is_none() {
                    let st = h.core.lease_state(*lease).ok();
                    sh.fail(
                        "I3",
                        format!("c{c}: lease {lease} never ended (state {st:?})"),
                    );
                }
            }
            let k = h.core.counters();
            if k.pending_cleanups != 0 || k.live_leases != 0 {
                sh.fail(
                    "rule 6",
                    format!(
                        "c{c}: after settling on a healed network: {} pending cleanups, {} lease records",
                        k.pending_cleanups, k.live_leases
                    ),
                );
            }
            if let Some((name, _)) = h.watching.iter().find(|(_, w)| **w) {
                sh.fail(
                    "watch",
                    format!("c{c}: still watching {name:?} with no waiter left"),
                );
            }
            let mut unreleased: Vec<_> = h
                .leases
                .iter()
                .filter(|(_, r)| {
                    (r.needs_release || (r.uncertain && r.fence.is_none())) && r.releases_sent == 0
                })
                .map(|(l, r)| (*l, r.terminal))
                .collect();
            unreleased.sort();
            if let Some((lease, end)) = unreleased.first() {
                sh.fail(
                    "rule 6",
                    format!(
                        "c{c}: lease {lease} ended ({end:?}) with a grant possibly live at the service, but no Release was ever sent"
                    ),
                );
            }
            for lease in h.leases.keys() {
                if h.core.lease_state(*lease) == Ok(LeaseState::Held) {
                    sh.fail("I2", format!("c{c}: lease {lease} still Held at the end"));
                }
            }
        }
    }
}

/// When a worker next renews by hand: a lease without automatic renewal every TTL/6 to
/// TTL/2 (sometimes too late: then it is lost, as it should be), an auto-renewed one
/// occasionally.
fn next_manual_renewal(rng: &mut SimRng, auto_renew: bool, now: u64, ttl_ns: u64) -> u64 {
    if !auto_renew {
        now + rng.range(ttl_ns / 6, ttl_ns / 2)
    } else if rng.chance_ppm(200_000) {
        now + rng.range(0, ttl_ns)
    } else {
        u64::MAX
    }
}
