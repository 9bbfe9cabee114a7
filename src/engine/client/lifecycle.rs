//! What each change of a lease's phase does around it: the commands it sends, the events and
//! counters it produces, the timers it arms. The phases and their legal changes are in
//! `phase`; this is where `Client` decides which change an input or a deadline makes.

use std::sync::Arc;

use super::{Client, NS_PER_MS};
use crate::engine::config::parts_per_million;
use crate::engine::lease::Lease;
use crate::engine::phase::{Effort, End, NEVER, Owed, Phase, ReqKind};
use crate::types::{
    AcquireFailReason, AcquireResult, Command, Event, LostReason, Output, ReleaseOutcome, RequestId,
};

/// Waiters use the holder's remaining TTL only after this many quick attempts, so a release
/// that raced the first subscription is not missed for a whole TTL.
const QUICK_ATTEMPTS: u16 = 3;
/// Up to this many records the records stay in cache, and prefetching them
/// (`Table::prefetch_upcoming`) would cost more than it saves. None with the simulator, so
/// that its small worlds exercise that path too (outputs are the same either way).
const CACHED_RECORDS: u32 = if cfg!(feature = "sim") { 0 } else { 4096 };

impl Client {
    /// Finds the lease a result belongs to, and whether the result answers its request in
    /// flight (else one of its superseded acquire attempts). A result of the wrong kind is
    /// left pending for the real answer.
    pub(super) fn find_request(&self, req: u64, kind: ReqKind) -> Option<(u32, bool)> {
        let (slot, newest) = self.table.request_slot(req)?;
        let l = self.table.get(slot)?;
        let (expected, current) = match l.phase.in_flight() {
            Some((k, _)) if newest => (k, true),
            // Only acquire attempts are ever superseded.
            _ if l.is_superseded(req) => (ReqKind::Acquire, false),
            _ => return None,
        };
        (expected == kind).then_some((slot, current))
    }

    pub(super) fn clamp(&mut self, now: u64) {
        if now < self.now {
            self.counters.time_clamped += 1;
        } else {
            self.now = now;
        }
    }

    /// Moves time forward and runs every due timer in deadline order. After a long pause,
    /// validity checks therefore run before anything new is sent (rule 3).
    pub(super) fn advance(&mut self, now: u64) {
        self.clamp(now);
        while let Some(e @ (deadline, slot, version)) = self.timers.peek() {
            if deadline > self.now {
                break;
            }
            self.timers.remove_earliest(e);
            if !self.table.timer_is_current(slot, version) {
                continue;
            }
            self.table.timer_fired(slot);
            if self.table.live() > CACHED_RECORDS {
                self.table.prefetch_upcoming(&self.timers);
            }
            self.on_timer(slot);
            self.settle(slot);
        }
    }

    pub(super) fn request_timeout(&self, l: &Lease) -> u64 {
        match l.phase {
            Phase::Renewing { .. } => self
                .config
                .request_timeout_ns
                .min(l.ttl_ms * NS_PER_MS / 3)
                .max(1),
            _ => self.config.request_timeout_ns,
        }
    }

    /// When the lease's phase next needs attention.
    fn deadline_of(&self, l: &Lease) -> u64 {
        let timeout = |sent: u64| sent.saturating_add(self.request_timeout(l));
        match l.phase {
            Phase::Waiting {
                retry_at,
                wait_until,
                ..
            } => retry_at.min(wait_until),
            Phase::Asking { sent, .. }
            | Phase::Withdrawing { sent, .. }
            | Phase::Releasing { sent, .. } => timeout(sent),
            Phase::Held { renew_at, .. } => renew_at.min(l.valid_until),
            Phase::Renewing { sent, .. } => timeout(sent).min(l.valid_until),
            Phase::RetryingRelease { retry_at, .. } => retry_at,
            Phase::Ended { until, .. } => until,
        }
    }

    /// After any change to a lease: free a finished record, or (re)schedule its deadline.
    pub(super) fn settle(&mut self, slot: u32) {
        let Some(l) = self.table.get(slot) else {
            return;
        };
        if let Phase::Ended { until, .. } = l.phase {
            if !l.superseded_pending() || until <= self.now {
                self.table.remove(slot);
                return;
            }
            // Nothing else pending: keep the record (to release a late grant) until its
            // `until`, which is in the future, so the timer always makes progress.
        }
        let deadline = self.deadline_of(l);
        let in_flight = l.phase.in_flight().is_some();
        self.table
            .schedule(slot, deadline, in_flight, &mut self.timers);
    }

    fn on_timer(&mut self, slot: u32) {
        let now = self.now;
        let Some(l) = self.table.get(slot) else {
            return;
        };
        let timed_out = l
            .phase
            .in_flight()
            .is_some_and(|(_, sent)| now >= sent.saturating_add(self.request_timeout(l)));
        match l.phase {
            Phase::Asking { .. } => {
                if timed_out {
                    self.supersede_inflight(slot);
                    self.on_acquire_failed(slot, true);
                }
            }
            Phase::Waiting {
                retry_at,
                wait_until,
                tries,
            } => {
                if now >= wait_until {
                    let reason = if tries.last_failed {
                        AcquireFailReason::Unavailable
                    } else {
                        AcquireFailReason::WaitExhausted
                    };
                    self.fail_acquire(slot, reason);
                } else if now >= retry_at {
                    self.send_acquire(slot);
                }
            }
            Phase::Held { renew_at, .. } => {
                if now >= l.valid_until {
                    self.lose(slot, LostReason::Expired);
                } else if now >= renew_at {
                    self.send_renew(slot);
                }
            }
            Phase::Renewing { .. } => {
                if now >= l.valid_until {
                    self.lose(slot, LostReason::Expired);
                } else if timed_out {
                    self.renew_failed(slot);
                }
            }
            Phase::Withdrawing { .. } => {
                if timed_out {
                    self.supersede_inflight(slot);
                    self.table.lease_mut(slot).phase.attempt_settled();
                    self.start_cleanup(slot, Effort::UntilConfirmed, Owed::Nothing);
                }
            }
            Phase::Releasing { .. } => {
                if timed_out {
                    self.release_attempt_failed(slot);
                }
            }
            Phase::RetryingRelease { retry_at, .. } => {
                if now >= retry_at {
                    self.send_release(slot);
                }
            }
            Phase::Ended { .. } => {}
        }
    }

    /// A timed-out acquire attempt may still be applied by the service; remember its id so a
    /// late grant can be recognised (and released if the lease has ended by then).
    fn supersede_inflight(&mut self, slot: u32) {
        let req = self.table.newest_request(slot);
        let l = self.table.lease_mut(slot);
        l.supersede(req);
        if let Some(tries) = l.phase.tries_mut() {
            tries.uncertain = true;
        }
    }

    pub(super) fn send_acquire(&mut self, slot: u32) {
        self.leave_queue(slot);
        let now = self.now;
        if self.table.lease_mut(slot).phase.attempt_sent(now) {
            self.send(slot, ReqKind::Acquire);
            self.counters.acquires_sent += 1;
        }
    }

    pub(super) fn send_renew(&mut self, slot: u32) {
        let now = self.now;
        if self.table.lease_mut(slot).phase.renew_sent(now) {
            self.send(slot, ReqKind::Renew);
            self.counters.renewals_sent += 1;
        }
    }

    pub(super) fn send_release(&mut self, slot: u32) {
        let now = self.now;
        if self.table.lease_mut(slot).phase.release_sent(now) {
            self.send(slot, ReqKind::Release);
            self.counters.releases_sent += 1;
        }
    }

    /// Emits the command for the request the lease's phase just put in flight.
    fn send(&mut self, slot: u32, kind: ReqKind) {
        let request = RequestId(self.table.mint_request(slot));
        let lease = self.table.id_of(slot);
        let l = self.table.lease_mut(slot);
        let (name, token) = (l.name.clone(), l.token);
        let cmd = match kind {
            ReqKind::Acquire => Command::Acquire {
                request,
                lease,
                name,
                token,
                ttl_ms: l.ttl_ms,
            },
            ReqKind::Renew => Command::Renew {
                request,
                lease,
                name,
                token,
                ttl_ms: l.ttl_ms,
                backend_data: l.backend_data(),
            },
            ReqKind::Release => Command::Release {
                request,
                lease,
                name,
                token,
                backend_data: l.backend_data(),
            },
        };
        self.outputs.push_back(Output::Command(cmd));
    }

    pub(super) fn renew_interval(&mut self, ttl_ns: u64) -> u64 {
        let base = ttl_ns / 3;
        let jitter = parts_per_million(base, self.config.renew_jitter_ppm);
        base - jitter + self.rng.up_to(2 * jitter)
    }

    /// Full-jitter exponential backoff: `random(0, min(cap, base × 2^attempt))`.
    fn backoff(&mut self, attempt: u16) -> u64 {
        let exp = self
            .config
            .backoff_base_ns
            .saturating_mul(1u64 << attempt.min(32));
        self.rng.up_to(exp.min(self.config.backoff_cap_ns))
    }

    /// A grant we may have to release may carry the ownership data the release needs (an
    /// etcd lease id, say); without it the cleanup would target a stale grant.
    pub(super) fn adopt_backend_data(&mut self, slot: u32, result: &AcquireResult<'_>) {
        if let AcquireResult::Granted {
            fencing_token,
            backend_data,
            ..
        } = *result
        {
            let live_fence = self.table.fence(slot);
            let l = self.table.lease_mut(slot);
            l.adopt_backend_data(backend_data, fencing_token, live_fence);
        }
    }

    /// The attempt sent at `sent` was granted.
    pub(super) fn on_granted(
        &mut self,
        slot: u32,
        sent: u64,
        fencing_token: u64,
        ttl_ms: u64,
        backend_data: &[u8],
    ) {
        let now = self.now;
        let live_fence = self.table.fence(slot);
        let drift = |ttl_ns| self.config.drift_ns(ttl_ns);
        let l = self.table.lease_mut(slot);
        let Phase::Asking { wait_until, .. } = l.phase else {
            return;
        };
        let ttl_ns = ttl_ms.min(l.ttl_ms) * NS_PER_MS;
        let valid_until = sent.saturating_add(ttl_ns).saturating_sub(drift(ttl_ns));
        if ttl_ns == 0 || valid_until <= now {
            // The grant was already stale when it arrived: it is ours at the service, but no
            // validity is left. Retry (idempotent for our token) or give up and clean up.
            l.adopt_backend_data(backend_data, fencing_token, live_fence);
            let Some(tries) = l.phase.tries_mut() else {
                return;
            };
            tries.uncertain = true;
            tries.last_failed = true;
            let attempts = tries.attempts;
            self.attempt_failed(slot, wait_until, attempts, AcquireFailReason::Unavailable);
            return;
        }
        // Renewals ask for (and count validity from) what the service actually granted.
        l.ttl_ms = ttl_ns / NS_PER_MS;
        l.valid_until = valid_until;
        l.set_backend_data(
            (!backend_data.is_empty()).then(|| Arc::from(backend_data)),
            fencing_token,
        );
        let auto_renew = l.auto_renew;
        self.table.set_fence(slot, fencing_token);
        let next = if auto_renew {
            sent.saturating_add(self.renew_interval(ttl_ns))
        } else {
            NEVER
        };
        self.leave_waiting(slot);
        self.table.lease_mut(slot).phase.grant(next);
        self.counters.grants += 1;
        let lease = self.table.id_of(slot);
        self.outputs.push_back(Output::Event(Event::Acquired {
            lease,
            fencing_token,
            valid_until,
        }));
    }

    /// The attempt in flight is over without a grant: the wait budget is spent (the lease
    /// fails with `reason`) or the next attempt goes out after a backoff.
    fn attempt_failed(
        &mut self,
        slot: u32,
        wait_until: u64,
        attempts: u16,
        reason: AcquireFailReason,
    ) {
        let now = self.now;
        if now >= wait_until {
            self.table.lease_mut(slot).phase.attempt_answered(NEVER);
            self.fail_acquire(slot, reason);
            return;
        }
        let delay = self.backoff(attempts);
        let l = self.table.lease_mut(slot);
        l.phase.attempt_answered(now.saturating_add(delay));
    }

    pub(super) fn on_held_by_other(&mut self, slot: u32, retry_after_ms: Option<u64>) {
        let now = self.now;
        let l = self.table.lease_mut(slot);
        let Phase::Asking {
            wait_until,
            mut tries,
            ..
        } = l.phase
        else {
            return;
        };
        if now >= wait_until {
            l.phase.attempt_answered(NEVER);
            self.fail_acquire(slot, AcquireFailReason::WaitExhausted);
            return;
        }
        let noticed = tries.retry_if_refused;
        tries.last_failed = false;
        tries.retry_if_refused = false;
        l.phase.attempt_answered(NEVER);
        if let Some(t) = l.phase.tries_mut() {
            *t = tries;
        }
        let attempts = tries.attempts;
        self.enter_waiting(slot);
        let name = self.table.lease_mut(slot).name.clone();
        let woken = self.names.take_pending_wake(&name) || noticed;
        let sleep = if woken {
            0
        } else {
            let hint_ns = retry_after_ms
                .filter(|&h| h > 0)
                .map(|h| h.saturating_mul(NS_PER_MS));
            match hint_ns {
                Some(h) if self.config.notifications && attempts >= QUICK_ATTEMPTS => {
                    // Sleep until a dead holder's grant runs out; a notification wakes us
                    // earlier. A little jitter keeps co-waiters from colliding.
                    let spread = self.config.backoff_base_ns.min(h / 16);
                    h.saturating_add(self.rng.up_to(spread))
                }
                Some(h) => self.backoff(attempts).min(h),
                None => self.backoff(attempts),
            }
        };
        if let Phase::Waiting { retry_at, .. } = &mut self.table.lease_mut(slot).phase {
            *retry_at = now.saturating_add(sleep);
        }
        self.enqueue(slot);
    }

    /// The attempt in flight failed: retried while the wait lasts. `uncertain`: it failed in
    /// transport or timed out, so it may have been granted (a cleanup is owed at the end);
    /// else it certainly never took effect.
    pub(super) fn on_acquire_failed(&mut self, slot: u32, uncertain: bool) {
        let l = self.table.lease_mut(slot);
        let Phase::Asking { wait_until, .. } = l.phase else {
            return;
        };
        let Some(tries) = l.phase.tries_mut() else {
            return;
        };
        tries.uncertain |= uncertain;
        tries.last_failed = true;
        let attempts = tries.attempts;
        self.attempt_failed(slot, wait_until, attempts, AcquireFailReason::Unavailable);
    }

    /// Ends an acquiring lease with `AcquireFailed`; a grant it may have gets released.
    pub(super) fn fail_acquire(&mut self, slot: u32, reason: AcquireFailReason) {
        self.leave_waiting(slot);
        self.unregister_reentrant(slot);
        let lease = self.table.id_of(slot);
        let until = self.retention_limit(slot);
        let l = self.table.lease_mut(slot);
        let uncertain = l.phase.tries_mut().is_some_and(|t| t.uncertain);
        l.phase.end(End::AcquireFailed, until);
        l.holders = 0;
        self.counters.acquire_failed += 1;
        self.outputs
            .push_back(Output::Event(Event::AcquireFailed { lease, reason }));
        if uncertain {
            self.start_cleanup(slot, Effort::UntilConfirmed, Owed::Nothing);
        }
    }

    /// A renewal failed in transport or timed out: retried promptly while validity remains
    /// (design rule 4), until the failure budget is spent.
    pub(super) fn renew_failed(&mut self, slot: u32) {
        self.counters.renewals_failed += 1;
        let now = self.now;
        let budget = self.config.fail_budget;
        let base = self.config.backoff_base_ns;
        let l = self.table.lease_mut(slot);
        let Phase::Renewing { renewal, .. } = l.phase else {
            return;
        };
        let failures = renewal.failures.saturating_add(1);
        if budget > 0 && failures >= budget {
            self.lose(slot, LostReason::FailBudget);
            return;
        }
        // Exponential steps from `backoff_base_ns`, at most TTL/10, so an outage of a few
        // seconds is bridged by a retry soon after the service returns.
        let step = base
            .saturating_mul(1u64 << (failures - 1).min(32))
            .min(l.ttl_ms * NS_PER_MS / 10)
            .max(1);
        if budget == 0 && now.saturating_add(2 * step) >= l.valid_until {
            // The time budget ran out: a retry would leave less than one step before validity
            // ends, so the lease is declared lost now rather than at (or, as a host with a
            // coarse clock sees it, after) the last moment.
            self.lose(slot, LostReason::FailBudget);
            return;
        }
        let delay = step / 2 + self.rng.up_to(step / 2);
        let l = self.table.lease_mut(slot);
        l.phase.renewal_failed(failures, now.saturating_add(delay));
    }

    /// Ends a held lease with `Lost`.
    pub(super) fn lose(&mut self, slot: u32, reason: LostReason) {
        self.unregister_reentrant(slot);
        let lease = self.table.id_of(slot);
        let until = self.retention_limit(slot);
        let l = self.table.lease_mut(slot);
        l.phase.end(End::Lost, until);
        l.holders = 0;
        match reason {
            LostReason::Rejected => self.counters.lost_rejected += 1,
            LostReason::Expired => self.counters.lost_expired += 1,
            LostReason::FailBudget => self.counters.lost_fail_budget += 1,
        }
        self.outputs
            .push_back(Output::Event(Event::Lost { lease, reason }));
        if reason != LostReason::Rejected {
            // One best-effort release: ownership is checked by the service, so it can only
            // delete our own (possibly still live) grant (rule 6).
            self.start_cleanup(slot, Effort::BestEffort, Owed::Nothing);
        }
    }

    /// When any grant of the lease has certainly run out at the service, counted from now:
    /// one TTL plus one request timeout.
    pub(super) fn retention_limit(&mut self, slot: u32) -> u64 {
        let rt = self.config.request_timeout_ns;
        let now = self.now;
        let l = self.table.lease_mut(slot);
        now.saturating_add(l.ttl_ms * NS_PER_MS).saturating_add(rt)
    }

    /// An ended lease must release its grant (phase rule 3).
    pub(super) fn start_cleanup(&mut self, slot: u32, effort: Effort, owed: Owed) {
        let give_up = self.retention_limit(slot);
        let started = self
            .table
            .lease_mut(slot)
            .phase
            .start_release(effort, owed, give_up);
        if started.fresh {
            self.counters.pending_cleanups += 1;
        }
        if started.send_now {
            self.send_release(slot);
        }
    }

    /// A release failed in transport or timed out: retried with backoff unless best-effort or
    /// past the lease's `until`.
    pub(super) fn release_attempt_failed(&mut self, slot: u32) {
        let now = self.now;
        let l = self.table.lease_mut(slot);
        let Phase::Releasing { until, cleanup, .. } = &mut l.phase else {
            return;
        };
        if cleanup.effort == Effort::BestEffort || now >= *until {
            self.finish_cleanup(slot, false);
            return;
        }
        cleanup.failures = cleanup.failures.saturating_add(1);
        let failures = cleanup.failures;
        let delay = self.backoff(failures);
        let l = self.table.lease_mut(slot);
        l.phase.release_due(now.saturating_add(delay));
    }

    /// Ends a cleanup: `answered` when the service answered (confirmed or not owner), else it
    /// gave up. The release the application asked for is counted and, when asked, reported.
    pub(super) fn finish_cleanup(&mut self, slot: u32, answered: bool) {
        let Some((end, cleanup)) = self.table.lease_mut(slot).phase.finish_release() else {
            return;
        };
        self.counters.pending_cleanups -= 1;
        if end != End::Released || cleanup.owed == Owed::Nothing {
            return;
        }
        let outcome = if !answered {
            ReleaseOutcome::Unconfirmed
        } else if cleanup.confirmed {
            ReleaseOutcome::Confirmed
        } else {
            ReleaseOutcome::NotOwner
        };
        match outcome {
            ReleaseOutcome::Confirmed => self.counters.releases_confirmed += 1,
            ReleaseOutcome::NotOwner => self.counters.releases_not_owner += 1,
            ReleaseOutcome::Unconfirmed => self.counters.releases_unconfirmed += 1,
        }
        if cleanup.owed == Owed::Report {
            let lease = self.table.id_of(slot);
            self.outputs
                .push_back(Output::Event(Event::ReleaseOutcome { lease, outcome }));
        }
    }
}
