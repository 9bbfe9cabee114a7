//! The processes: one client host per scenario plan, running a real [`crate::Client`] on its
//! own drifting clock.
//!
//! A host follows the canonical loop: feed one input at its own clock's `now`, drain every
//! output (commands become network messages, events go to the application workers), call
//! `handle_timeout` while the core's deadline has passed, then sleep until the earliest of
//! the core's deadline and its workers' next action. It keeps what the oracles need to know
//! about its leases and requests (`LeaseRec`, `ReqRec`), checking the rules tied to one
//! output as it drains them: I2 (one terminal event, in order), I4 (fences as granted),
//! rule 4 (one request in flight per kind), rule 9 (one token per lease), `watch`.

use std::collections::HashMap;

use super::clock::DriftClock;
use super::messages::{ToClient, ToService};
use super::service::{AcquireReply, OwnerToken};
use super::workers::{Work, Worker, next_manual_renewal};
use super::world::{Ev, MS, Shared, secs};
use crate::{
    AcquireFailReason, AcquireResult, Client, Command, Config, Event, LeaseId, LockName,
    LostReason, Output, RenewResult, RequestId,
};

/// What the host knows about one lease, for the oracles.
pub(super) struct LeaseRec {
    pub(super) name: LockName,
    pub(super) token: Option<OwnerToken>,
    pub(super) reentrant: bool,
    /// Core time right after `acquire` returned (start of the wait budget).
    pub(super) created: u64,
    pub(super) wait_ns: u64,
    pub(super) fence: Option<u64>,
    pub(super) terminal: Option<&'static str>,
    /// Core time of the terminal event.
    pub(super) ended_at: u64,
    /// TTL the service grants for this lease (asked, or the service's cap).
    pub(super) grant_ttl_ms: u64,
    pub(super) app_released: bool,
    /// Upper bound for `valid_until` from confirmed requests (I1).
    pub(super) max_valid: u64,
    pub(super) releases_sent: u32,
    /// The service may hold a grant for this lease's token that the core
    /// knows of or cannot rule out, so rule 6 requires a release command:
    /// granted then released or lost (not rejected), an acquire attempt that
    /// failed in transport, or a grant that arrived after the end.
    pub(super) needs_release: bool,
    /// An acquire attempt failed in transport (it may have been granted);
    /// matters if the lease is never granted (AcquireFailed).
    pub(super) uncertain: bool,
    /// Created with automatic renewal (its workers then renew only now and then).
    pub(super) auto_renew: bool,
    /// `renew` was called and no `Renewed` has answered it yet.
    pub(super) renew_requested: bool,
    /// `release_reported` answered Pending and no `ReleaseOutcome` has arrived yet.
    pub(super) outcome_expected: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum ReqKind {
    Acquire,
    Renew,
    Release,
}

pub(super) struct ReqRec {
    pub(super) lease: LeaseId,
    pub(super) kind: ReqKind,
    /// Core time when the command was drained (the core's `t_sent`).
    pub(super) sent: u64,
    pub(super) ttl_ms: u64,
    /// A result was delivered already (later ones are duplicates).
    pub(super) answered: bool,
}

pub(super) struct Host {
    pub(super) core: Client,
    pub(super) config: Config,
    pub(super) clock: DriftClock,
    pub(super) epoch: u64,
    pub(super) paused_until: u64,
    pub(super) wake_gen: u64,
    pub(super) workers: Vec<Worker>,
    pub(super) leases: HashMap<LeaseId, LeaseRec>,
    /// Acquired and not yet terminal.
    pub(super) active: Vec<LeaseId>,
    pub(super) requests: HashMap<RequestId, ReqRec>,
    pub(super) watching: HashMap<LockName, bool>,
    /// Leases without a terminal event yet.
    pub(super) open: Vec<LeaseId>,
    /// Recently ended leases `(core time until which the record may stay, id)`: the core may keep
    /// their records a while (to release a late grant), which I7 allows.
    pub(super) recent: Vec<(u64, LeaseId)>,
    /// The unanswered request per (lease, kind) with its core send time and
    /// timeout: rule 4 allows one renew (and one acquire attempt) in flight.
    pub(super) inflight: HashMap<(LeaseId, ReqKind), (RequestId, u64, u64)>,
    /// Set by a pause or a clock step: the core's time jumped, so lingering
    /// records get a fresh window measured from the jump.
    pub(super) time_jumped: bool,
}

/// The drift the core must subtract, computed independently of the core.
pub(super) fn drift_ns(cfg: &Config, ttl_ms: u64) -> u64 {
    let ttl_ns = u128::from(ttl_ms) * u128::from(MS);
    (ttl_ns * u128::from(cfg.drift_ppm) / 1_000_000) as u64 + cfg.drift_fixed_ns
}

impl Host {
    pub(super) fn local(&self, t: u64) -> u64 {
        self.clock.local(t)
    }

    /// Drains every output after one input, turning commands into messages
    /// and events into worker transitions, and checking I2/I4/I7 on the way.
    pub(super) fn drain(&mut self, c: usize, sh: &mut Shared) {
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

    pub(super) fn on_command(&mut self, c: usize, sh: &mut Shared, cmd: Command) {
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

    pub(super) fn on_event(&mut self, c: usize, sh: &mut Shared, ev: Event) {
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

    /// The bound on `valid_until` after a positive answer to `req` (I1).
    pub(super) fn note_confirmed(&mut self, req: RequestId, granted_ttl_ms: u64) {
        if let Some(r) = self.requests.get(&req) {
            let ttl = r.ttl_ms.min(granted_ttl_ms);
            let bound = (r.sent + ttl * MS).saturating_sub(drift_ns(&self.config, ttl));
            if let Some(rec) = self.leases.get_mut(&r.lease) {
                rec.max_valid = rec.max_valid.max(bound);
            }
        }
    }

    /// Feeds one message to the core.
    pub(super) fn deliver(&mut self, c: usize, sh: &mut Shared, now: u64, msg: ToClient) {
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
    pub(super) fn after_input(&mut self, c: usize, sh: &mut Shared, now: u64) {
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

    pub(super) fn run_workers_if_due(&mut self, c: usize, sh: &mut Shared, now: u64) {
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

    /// How long after its end (core time) a lease record may stay.
    pub(super) fn linger(&self, sh: &Shared) -> u64 {
        2 * (self.config.request_timeout_ns + sh.sc.max_ttl_ns()) + self.config.backoff_cap_ns
    }

    /// Schedules the next wake-up at the earliest of the core deadline and the
    /// workers' next actions, mapped from local to true time.
    pub(super) fn schedule(&mut self, c: usize, sh: &mut Shared, now: u64) {
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
