//! The lease state machine: one `Client` per session to one lock service, any number of
//! leases. Pure: inputs in (each with `now`), outputs polled out, no clock, no IO.
//!
//! This file is the public face (getters, application calls, `handle_*` inputs, `poll_*`
//! outputs). A lease's phases and their legal changes are in `engine::phase`; what each change
//! does around it (commands, events, counters, timers) in `lifecycle`; a lease's part in its
//! name's watch and wake queue in `waiting` (the per-name table itself in `engine::names`);
//! where records live in `engine::table`.

use std::collections::VecDeque;

use crate::engine::config::{AcquireOptions, Config};
use crate::engine::hash::KeyedState;
use crate::engine::lease::Lease;
use crate::engine::names::Names;
use crate::engine::phase::{Effort, End, NEVER, Owed, Phase, ReqKind};
use crate::engine::rng::Rng;
use crate::engine::table::Table;
use crate::engine::timers::Timers;
use crate::error::Error;
use crate::types::{
    AcquireFailReason, AcquireResult, Counters, Event, LeaseId, LeaseInfo, LeaseState, LockName,
    LostReason, Output, ReleaseResult, Releasing, RenewResult, RequestId,
};
use crate::{MAX_BACKEND_DATA_LEN, validate_name};

mod lifecycle;
mod waiting;

pub(super) const NS_PER_MS: u64 = 1_000_000;

/// The sans-IO lease core. See the crate docs for the run loop a host implements.
///
/// Methods fall in four groups: getters (`&self`), application calls (`acquire`, `release`),
/// inputs from the host (`handle_*`, `reseed`), and outputs (`poll_output`, `poll_timeout`).
/// After every application call or input, drain `poll_output` until it returns `None`, then
/// wait no later than `poll_timeout`.
pub struct Client {
    pub(super) config: Config,
    pub(super) rng: Rng,
    pub(super) now: u64,
    pub(super) table: Table,
    pub(super) timers: Timers,
    pub(super) names: Names,
    pub(super) outputs: VecDeque<Output>,
    pub(super) counters: Counters,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("now", &self.now)
            .field("records", &self.table.live())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Creates a core. `seed` (at least 16 bytes, from the OS in production, fixed in tests)
    /// drives ownership tokens and jitter, so identical seeds and inputs replay identically.
    pub fn new(config: Config, seed: &[u8]) -> Result<Self, Error> {
        config.validate()?;
        let mut rng = Rng::new(seed)?;
        let names = Names::new(KeyedState::new(rng.next_u64()));
        Ok(Self {
            config,
            rng,
            now: 0,
            table: Table::default(),
            timers: Timers::default(),
            names,
            outputs: VecDeque::new(),
            counters: Counters::default(),
        })
    }

    /// Mixes fresh entropy into the token stream. Hosts call it in a forked child so parent
    /// and child never mint the same ownership tokens.
    pub fn reseed(&mut self, seed: &[u8]) -> Result<(), Error> {
        self.rng.reseed(seed)
    }

    /// The configuration this core runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Latest `now` seen (time never runs backwards inside the core).
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Uniform in `[0, bound]` from the core's seeded jitter stream: protocols draw their
    /// backoff here, so a fixed seed gives identical runs.
    pub fn random_up_to(&mut self, bound: u64) -> u64 {
        self.rng.up_to(bound)
    }

    // ---------------------------------------------------------------- application calls

    /// Starts acquiring `name`. The result arrives as an `Acquired` or `AcquireFailed` event
    /// for the returned id. A reentrant acquire of a name with a live reentrant lease in this
    /// core joins it (same id, one more holder, no network call).
    pub fn acquire(
        &mut self,
        now: u64,
        name: &str,
        opts: AcquireOptions,
    ) -> Result<LeaseId, Error> {
        validate_name(name)?;
        self.config.check_ttl(opts.ttl_ms)?;
        // Everything that can fail is decided before time moves, so an error always means
        // "nothing happened". A reentrant acquire joins the live reentrant lease of this name
        // as it is now; if this call's own advance then ends that lease, the terminal event
        // reaches the new holder too (one event per lease, as for every nested holder).
        let join = if opts.reentrant {
            self.names.reentrant(name)
        } else {
            None
        };
        if let Some(slot) = join {
            let holders = self.table.lease_mut(slot).holders;
            let holders = holders.checked_add(1).ok_or(Error::TooManyLeases)?;
            let id = self.table.id_of(slot);
            self.table.lease_mut(slot).holders = holders;
            self.advance(now);
            let now = self.now;
            if let Ok((slot, l)) = self.table.find(id) {
                if l.phase.state() == LeaseState::Held && now < l.valid_until {
                    let ev = Event::Acquired {
                        lease: id,
                        fencing_token: self.table.fence(slot),
                        valid_until: l.valid_until,
                    };
                    self.outputs.push_back(Output::Event(ev));
                }
            }
            return Ok(id);
        }
        if self.table.live() >= self.config.max_leases {
            return Err(Error::TooManyLeases);
        }
        self.advance(now);
        let now = self.now;

        let name = LockName::from(name);
        let lease = Lease {
            name: name.clone(),
            token: self.rng.token(),
            cold: None,
            ttl_ms: opts.ttl_ms,
            valid_until: 0,
            phase: Phase::new(now.saturating_add(opts.wait_ns)),
            holders: 1,
            reentrant: opts.reentrant,
            auto_renew: opts.auto_renew,
        };
        let slot = self.table.insert(lease)?;
        if opts.reentrant {
            self.names.set_reentrant(name, slot);
        }
        self.send_acquire(slot);
        self.settle(slot);
        Ok(self.table.id_of(slot))
    }

    /// Releases one holder of `lease`. The last holder ends the lease: `Released` (or
    /// `AcquireFailed{Cancelled}` while acquiring) is emitted at once, and the service-side
    /// release is retried with the same token until it is confirmed or the TTL has run out.
    /// A lease whose validity ran out before this call (a paused process) ends `Lost` instead.
    pub fn release(&mut self, now: u64, lease: LeaseId) -> Result<(), Error> {
        self.release_inner(now, lease, Owed::Count).map(|_| ())
    }

    /// Like [`Client::release`], and tells what the call did ([`Releasing`]); when the lease
    /// ended `Released` ([`Releasing::Pending`]), the service's answer follows as an
    /// [`Event::ReleaseOutcome`]. A lease whose validity ran out before this call (a paused
    /// process) ends `Lost` with its reason ([`Releasing::Lost`]), never quietly `Released`.
    pub fn release_reported(&mut self, now: u64, lease: LeaseId) -> Result<Releasing, Error> {
        self.release_inner(now, lease, Owed::Report)
    }

    fn release_inner(&mut self, now: u64, lease: LeaseId, owed: Owed) -> Result<Releasing, Error> {
        let slot = self.table.resolve(lease)?;
        if self.table.lease_mut(slot).phase.state().is_terminal() {
            // Checked before time moves, so an error always means "nothing happened".
            return Err(Error::LeaseEnded(lease));
        }
        self.clamp(now);
        // A held lease that is still valid is released before other timers run, so a renew
        // that happens to be due right now is not sent only to be thrown away. A lease whose
        // validity has passed is reported Lost by `advance` first: that is what it was.
        let t = self.now;
        let l = self.table.lease_mut(slot);
        let was_held = l.phase.state() == LeaseState::Held;
        let still_valid = was_held && t < l.valid_until;
        if still_valid {
            let done = self.release_slot(slot, lease, owed);
            self.advance(now);
            return Ok(done);
        }
        self.advance(now);
        // If the lease ended during this advance (lost, or its wait ran out), the release is
        // already satisfied and its terminal event is queued.
        let Ok(slot) = self.table.resolve(lease) else {
            // The record is gone: a held lease that was lost, or an acquire whose wait ran out
            // in this advance (its slot is freed at once when no attempt is uncertain).
            if was_held {
                self.counters.releases_lost += 1;
                return Ok(Releasing::Lost);
            }
            return Ok(Releasing::NotAcquired);
        };
        match self.table.lease_mut(slot).phase.state() {
            LeaseState::Lost => {
                self.counters.releases_lost += 1;
                Ok(Releasing::Lost)
            }
            LeaseState::AcquireFailed | LeaseState::Released => Ok(Releasing::NotAcquired),
            LeaseState::Acquiring | LeaseState::Held => Ok(self.release_slot(slot, lease, owed)),
        }
    }

    /// Releases one holder of a live lease; the last one ends it (`owed`: what the
    /// application is told of the service's answer).
    fn release_slot(&mut self, slot: u32, lease: LeaseId, owed: Owed) -> Releasing {
        let l = self.table.lease_mut(slot);
        match l.phase.state() {
            LeaseState::Acquiring | LeaseState::Held if l.holders > 1 => {
                l.holders -= 1;
                Releasing::HolderLeft
            }
            LeaseState::Acquiring => {
                self.fail_acquire(slot, AcquireFailReason::Cancelled);
                self.settle(slot);
                Releasing::NotAcquired
            }
            LeaseState::Held => {
                self.unregister_reentrant(slot);
                let until = self.retention_limit(slot);
                let l = self.table.lease_mut(slot);
                l.phase.end(End::Released, until);
                l.holders = 0;
                self.outputs
                    .push_back(Output::Event(Event::Released { lease }));
                self.start_cleanup(slot, Effort::UntilConfirmed, owed);
                self.settle(slot);
                Releasing::Pending
            }
            // Never reached: callers release live leases only.
            LeaseState::Released | LeaseState::Lost | LeaseState::AcquireFailed => {
                Releasing::NotAcquired
            }
        }
    }

    /// Sends a renewal of a held lease now (or joins the one in flight), whatever its
    /// automatic cadence. Validity counts from the send time, as for every renewal. The answer
    /// arrives as [`Event::Renewed`] with the new `valid_until`, or as the lease's `Lost`
    /// event; a renewal that fails in transport is retried like any other (see
    /// `Config::fail_budget`). If the lease's validity had already run out, it ends `Lost`
    /// in this call and nothing is sent. Terminal leases are refused without a command
    /// ([`Error::LeaseEnded`]), leases still acquiring with [`Error::NotGranted`].
    pub fn renew(&mut self, now: u64, lease: LeaseId) -> Result<(), Error> {
        let slot = self.table.resolve(lease)?;
        // Checked before time moves, so an error always means "nothing happened".
        match self.table.lease_mut(slot).phase.state() {
            LeaseState::Held => {}
            LeaseState::Acquiring => return Err(Error::NotGranted(lease)),
            LeaseState::Released | LeaseState::Lost | LeaseState::AcquireFailed => {
                return Err(Error::LeaseEnded(lease));
            }
        }
        self.advance(now);
        let Ok(slot) = self.table.resolve(lease) else {
            return Ok(()); // lost during the advance: its Lost event is queued
        };
        let l = self.table.lease_mut(slot);
        match &mut l.phase {
            Phase::Held { renewal, .. } => {
                renewal.requested = true;
                self.send_renew(slot);
            }
            Phase::Renewing { renewal, .. } => renewal.requested = true,
            _ => return Ok(()),
        }
        self.counters.renewals_requested += 1;
        self.settle(slot);
        Ok(())
    }

    /// Until when acquire attempt `req`, if not sent yet, is worth sending: its request
    /// timeout (not its wait: a try-acquire on a new client waits for the connection);
    /// `None` once its lease ended while it was in flight, a newer attempt superseded it, or
    /// it is unknown. A backend holding it unsent (a connection still opening) should drop
    /// it then and answer [`AcquireResult::NotApplied`] before feeding that time: the
    /// attempt is not taken for one that may have been granted, and no cleanup waits on a
    /// request that never left.
    pub fn acquire_send_deadline(&self, req: RequestId) -> Option<u64> {
        let Some((slot, true)) = self.find_request(req.0, ReqKind::Acquire) else {
            return None;
        };
        let l = self.table.get(slot)?;
        match l.phase {
            Phase::Asking { sent, .. } => Some(sent.saturating_add(self.request_timeout(l))),
            _ => None,
        }
    }

    /// Whether unsent acquire attempt `req` is past [`Self::acquire_send_deadline`] at `now`.
    pub fn acquire_abandoned(&self, req: RequestId, now: u64) -> bool {
        self.acquire_send_deadline(req)
            .is_none_or(|d| now.max(self.now) >= d)
    }

    // ------------------------------------------------------------------------- inputs

    /// Feeds the service's answer to an `Acquire` command.
    pub fn handle_acquire_result(
        &mut self,
        now: u64,
        request: RequestId,
        result: AcquireResult<'_>,
    ) -> Result<(), Error> {
        if let AcquireResult::Granted { backend_data, .. } = result {
            if backend_data.len() > MAX_BACKEND_DATA_LEN {
                return Err(Error::BackendDataTooLong {
                    len: backend_data.len(),
                });
            }
        }
        self.advance(now);
        let Some((slot, current)) = self.find_request(request.0, ReqKind::Acquire) else {
            self.counters.stale_results += 1;
            return Ok(());
        };
        let live_fence = self.table.fence(slot);
        let l = self.table.lease_mut(slot);
        let refused = matches!(
            result,
            AcquireResult::HeldByOther { .. } | AcquireResult::NotApplied
        );
        if !current {
            // A superseded attempt: never changes a live lease (rule 5), but a grant for a
            // lease that already ended must be released (rule 6).
            l.forget_superseded(request.0);
            let state = l.phase.state();
            let regranted = matches!(result, AcquireResult::Granted { fencing_token, .. }
                if state == LeaseState::Held && fencing_token > live_fence);
            self.counters.stale_results += 1;
            if state != LeaseState::Held || regranted {
                // Not a state change: remember the grant's ownership data, so a cleanup
                // release can target it. A held lease keeps its live grant's data, unless the
                // service granted our token again under a newer fence (our grant had ended
                // there): renewals and the release must then carry that grant's data.
                self.adopt_backend_data(slot, &result);
            }
            if state.is_terminal() && !refused {
                self.start_cleanup(slot, Effort::UntilConfirmed, Owed::Nothing);
            }
            self.settle(slot);
            return Ok(());
        }
        match l.phase {
            Phase::Asking { sent, .. } => match result {
                AcquireResult::Granted {
                    fencing_token,
                    ttl_ms,
                    backend_data,
                } => self.on_granted(slot, sent, fencing_token, ttl_ms, backend_data),
                AcquireResult::HeldByOther { retry_after_ms } => {
                    self.on_held_by_other(slot, retry_after_ms)
                }
                AcquireResult::TransportError => self.on_acquire_failed(slot, true),
                AcquireResult::NotApplied => self.on_acquire_failed(slot, false),
            },
            Phase::Withdrawing { .. } => {
                // The lease ended while this attempt was in flight.
                l.phase.attempt_settled();
                if !refused {
                    self.adopt_backend_data(slot, &result);
                    self.start_cleanup(slot, Effort::UntilConfirmed, Owed::Nothing);
                } else if matches!(l.phase, Phase::RetryingRelease { .. }) {
                    self.send_release(slot);
                }
            }
            _ => {}
        }
        self.settle(slot);
        Ok(())
    }

    /// Feeds the service's answer to a `Renew` command.
    pub fn handle_renew_result(
        &mut self,
        now: u64,
        request: RequestId,
        result: RenewResult,
    ) -> Result<(), Error> {
        self.advance(now);
        let Some((slot, current)) = self.find_request(request.0, ReqKind::Renew) else {
            self.counters.stale_results += 1;
            return Ok(());
        };
        let now = self.now;
        let l = self.table.lease_mut(slot);
        let Phase::Renewing { sent, .. } = l.phase else {
            self.counters.stale_results += 1;
            self.settle(slot);
            return Ok(());
        };
        if !current {
            self.counters.stale_results += 1;
            self.settle(slot);
            return Ok(());
        }
        match result {
            RenewResult::Renewed => {
                let ttl_ns = l.ttl_ms * NS_PER_MS;
                let until = sent
                    .saturating_add(ttl_ns)
                    .saturating_sub(self.config.drift_ns(ttl_ns));
                l.valid_until = l.valid_until.max(until);
                let next = if l.auto_renew {
                    sent.saturating_add(self.renew_interval(ttl_ns))
                } else {
                    NEVER
                };
                let l = self.table.lease_mut(slot);
                let requested = l.phase.renewed(next).unwrap_or(false);
                let valid_until = l.valid_until;
                self.counters.renewals_ok += 1;
                if now >= valid_until {
                    self.lose(slot, LostReason::Expired);
                } else if requested {
                    let lease = self.table.id_of(slot);
                    self.outputs
                        .push_back(Output::Event(Event::Renewed { lease, valid_until }));
                }
            }
            RenewResult::Rejected => {
                self.counters.renewals_failed += 1;
                self.lose(slot, LostReason::Rejected);
            }
            RenewResult::TransportError => self.renew_failed(slot),
        }
        self.settle(slot);
        Ok(())
    }

    /// Feeds the service's answer to a `Release` command.
    pub fn handle_release_result(
        &mut self,
        now: u64,
        request: RequestId,
        result: ReleaseResult,
    ) -> Result<(), Error> {
        self.advance(now);
        let Some((slot, current)) = self.find_request(request.0, ReqKind::Release) else {
            self.counters.stale_results += 1;
            return Ok(());
        };
        let l = self.table.lease_mut(slot);
        let Phase::Releasing { cleanup, .. } = &mut l.phase else {
            self.counters.stale_results += 1;
            self.settle(slot);
            return Ok(());
        };
        if !current {
            self.counters.stale_results += 1;
            self.settle(slot);
            return Ok(());
        }
        match result {
            ReleaseResult::Released | ReleaseResult::NotOwner => {
                if result == ReleaseResult::Released {
                    cleanup.confirmed = true;
                }
                // A refusal after an attempt lost in transport may be that attempt having
                // released the lock: no evidence that another owner took it.
                let ambiguous = result == ReleaseResult::NotOwner && cleanup.failures > 0;
                if cleanup.again {
                    cleanup.again = false;
                    l.phase.release_due(NEVER);
                    self.send_release(slot);
                } else {
                    self.finish_cleanup(slot, !ambiguous);
                }
            }
            ReleaseResult::TransportError => self.release_attempt_failed(slot),
        }
        self.settle(slot);
        Ok(())
    }

    /// A release notification for `name` from a watch: wakes one local waiter (rule 7).
    pub fn handle_released(&mut self, now: u64, name: &str) -> Result<(), Error> {
        validate_name(name)?;
        self.advance(now);
        if let Some(slot) = self.names.wake_one(name) {
            self.left_queue(slot);
            self.send_acquire(slot);
            self.settle(slot);
        }
        Ok(())
    }

    /// A wake-up for one lease: the service says this lease's turn has come (a release
    /// popped the lease's own queue entry), so it, not the first local waiter of its name,
    /// must ask. Needed when several leases of this client wait for one name: waking
    /// another lease would leave this one asleep without an entry.
    ///
    /// An acquiring lease with nothing in flight leaves the name's local queue and sends its
    /// acquire now; one whose attempt is in flight asks again at once if that attempt is
    /// refused (the refusal may predate the release). Both return `Ok(true)`. A lease that
    /// is not acquiring (held, ended, releasing) returns `Ok(false)` and is counted in
    /// `stale_results`: the caller may pass the wake-up on (say, with
    /// [`Client::handle_released`]). Duplicates cost at most one more attempt each.
    pub fn handle_wake(&mut self, now: u64, lease: LeaseId) -> Result<bool, Error> {
        self.advance(now);
        let slot = match self.table.resolve(lease) {
            Ok(slot) => slot,
            Err(Error::LeaseEnded(_)) => {
                self.counters.stale_results += 1;
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        match &mut self.table.lease_mut(slot).phase {
            Phase::Asking { tries, .. } => tries.retry_if_refused = true,
            Phase::Waiting { .. } => self.send_acquire(slot),
            _ => {
                self.counters.stale_results += 1;
                return Ok(false);
            }
        }
        self.settle(slot);
        Ok(true)
    }

    /// The service says a held lease's grant is gone although no renewal of this lease asked:
    /// several leases share one server-side lease (etcd's pooled lease) and another lease's
    /// keep-alive found it expired. The lease ends `Lost` (`Rejected`) at once, exactly as if
    /// its own renewal had been refused, instead of at its next renewal. Returns whether the
    /// lease was held; any other state is left alone and counted in `stale_results`.
    pub fn handle_revoked(&mut self, now: u64, lease: LeaseId) -> Result<bool, Error> {
        self.advance(now);
        let slot = match self.table.resolve(lease) {
            Ok(slot) => slot,
            Err(Error::LeaseEnded(_)) => {
                self.counters.stale_results += 1;
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        if self.table.lease_mut(slot).phase.state() != LeaseState::Held {
            self.counters.stale_results += 1;
            return Ok(false);
        }
        self.lose(slot, LostReason::Rejected);
        self.settle(slot);
        Ok(true)
    }

    /// The deadline from `poll_timeout` passed. Early or repeated calls are harmless.
    pub fn handle_timeout(&mut self, now: u64) {
        self.advance(now);
    }

    // ------------------------------------------------------------------------ outputs

    /// Whether [`Self::poll_output`] has something: lets a backend say whether a request may
    /// follow without taking anything.
    pub fn has_output(&self) -> bool {
        !self.outputs.is_empty()
    }

    /// Next command or event, in the order they arose; `None` once drained.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// When the host must call `handle_timeout` at the latest; `None` when nothing is
    /// scheduled. May be in the past: then call `handle_timeout` at once.
    pub fn poll_timeout(&mut self) -> Option<u64> {
        while let Some(e @ (deadline, slot, version)) = self.timers.peek() {
            if self.table.timer_is_current(slot, version) {
                return Some(deadline);
            }
            self.timers.remove_earliest(e);
        }
        None
    }

    // ------------------------------------------------------------------------ getters

    /// Lifecycle position of a lease whose record still exists.
    pub fn lease_state(&self, lease: LeaseId) -> Result<LeaseState, Error> {
        Ok(self.table.find(lease)?.1.phase.state())
    }

    /// Snapshot of a lease.
    pub fn lease_info(&self, lease: LeaseId) -> Result<LeaseInfo, Error> {
        let (slot, l) = self.table.find(lease)?;
        let granted = l.phase.granted();
        Ok(LeaseInfo {
            state: l.phase.state(),
            name: l.name.clone(),
            fencing_token: granted.then(|| self.table.fence(slot)),
            valid_until: granted.then_some(l.valid_until),
            holders: l.holders,
        })
    }

    /// Fencing token of the grant; `None` before a grant. Pass it with every protected write.
    pub fn fencing_token(&self, lease: LeaseId) -> Result<Option<u64>, Error> {
        let (slot, l) = self.table.find(lease)?;
        Ok(l.phase.granted().then(|| self.table.fence(slot)))
    }

    /// End of validity (host-monotonic ns); `None` before a grant.
    pub fn valid_until(&self, lease: LeaseId) -> Result<Option<u64>, Error> {
        let l = self.table.find(lease)?.1;
        Ok(l.phase.granted().then_some(l.valid_until))
    }

    /// Advice only: true while the lease is held and `now` is before `valid_until`. Storage
    /// must still check the fencing token; this cannot see a pause that happens after it.
    pub fn is_held(&self, lease: LeaseId, now: u64) -> Result<bool, Error> {
        let l = self.table.find(lease)?.1;
        let now = now.max(self.now);
        Ok(l.phase.state() == LeaseState::Held && now < l.valid_until)
    }

    /// Counters and gauges.
    pub fn counters(&self) -> Counters {
        let mut c = self.counters;
        c.live_leases = u64::from(self.table.live());
        c
    }
}
