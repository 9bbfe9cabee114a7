//! The lease state machine: one `Client` per session to one lock service, any number of
//! leases. Pure: inputs in (each with `now`), outputs polled out, no clock, no IO.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::engine::config::{AcquireOptions, Config, parts_per_million};
use crate::engine::hash::KeyedState;
use crate::engine::prefetch::prefetch;
use crate::engine::rng::Rng;
use crate::engine::timers::{CANCELLED, Timers};
use crate::error::Error;
use crate::types::{
    AcquireFailReason, AcquireResult, Command, Counters, Event, LeaseId, LeaseInfo, LeaseState,
    LockName, LostReason, Output, ReleaseOutcome, ReleaseResult, Releasing, RenewResult, RequestId,
    Token,
};
use crate::{MAX_BACKEND_DATA_LEN, validate_name};

/// "No deadline" inside the core.
const NEVER: u64 = u64::MAX;
const NS_PER_MS: u64 = 1_000_000;
/// Low bits of a `LeaseId` address the slot, high bits count reuses of that slot.
const SLOT_BITS: u32 = 24;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
/// A slot whose generation reaches this is retired, so no id is ever reused.
const MAX_GEN: u32 = u32::MAX;
/// A `RequestId` is `(n << SLOT_BITS) | slot`, where `n` counts the slot's requests from 1.
/// The slot is enough to find the lease, so results need no lookup table, and the count makes
/// ids unique for ever: a slot is retired once half of its 2^40 ids are used, and a single
/// lease would need to renew every 3 ms for 50 years to use the other half.
const REQUEST_LIMIT: u64 = 1 << (64 - SLOT_BITS);
/// Superseded acquire attempts remembered per lease (to release a late grant of a dead lease).
const MAX_SUPERSEDED: usize = 16;
/// Waiters use the holder's remaining TTL only after this many quick attempts, so a release
/// that raced the first subscription is not missed for a whole TTL.
const QUICK_ATTEMPTS: u32 = 3;
/// Up to this many records the records stay in cache, and prefetching them
/// (`prefetch_upcoming`) would cost more than it saves. None with the simulator, so that its
/// small worlds exercise that path too (outputs are the same either way).
const CACHED_RECORDS: u32 = if cfg!(feature = "sim") { 0 } else { 4096 };

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReqKind {
    Acquire,
    Renew,
    Release,
}

#[derive(Debug)]
struct Lease {
    name: LockName,
    token: Token,
    /// Backend data and superseded attempts, which most leases never have.
    cold: Option<Box<Cold>>,
    ttl_ms: u64,
    valid_until: u64,
    /// Next retry / renew time.
    next_at: u64,
    inflight_req: u64,
    inflight_sent: u64,
    /// Acquire attempts, consecutive renew failures, or release attempts, by phase.
    attempts: u32,
    state: LeaseState,
    inflight_kind: ReqKind,
    flags: Flags,
}

/// A lease's yes/no facts, packed into one word so that the record, with its name inline,
/// stays two cache lines.
#[derive(Debug, Clone, Copy, Default)]
struct Flags(u16);

impl Flags {
    fn has(self, f: Flag) -> bool {
        self.0 & f as u16 != 0
    }

    fn set(&mut self, f: Flag, on: bool) {
        if on {
            self.0 |= f as u16;
        } else {
            self.0 &= !(f as u16);
        }
    }

    fn with(mut self, f: Flag, on: bool) -> Self {
        self.set(f, on);
        self
    }
}

#[derive(Debug, Clone, Copy)]
#[repr(u16)]
enum Flag {
    Granted = 1,
    Reentrant = 1 << 1,
    /// An attempt's outcome is unknown: the service may hold a grant for our token. Sticky,
    /// because a delayed attempt can still be applied after a later one was refused.
    Uncertain = 1 << 2,
    /// The latest acquire attempt failed in transport (decides Unavailable vs WaitExhausted).
    LastAttemptFailed = 1 << 3,
    /// Counted in its name's `watchers`.
    Watching = 1 << 4,
    /// Sitting in its name's wake queue.
    Queued = 1 << 5,
    Cleanup = 1 << 6,
    CleanupBestEffort = 1 << 7,
    CleanupAgain = 1 << 8,
    /// A grant notice arrived while a later attempt was in flight: a refusal of that attempt
    /// is older news than the grant, so the lease asks again at once instead of sleeping.
    RetryIfRefused = 1 << 9,
    /// The application asked for a renewal (`renew`): its confirmation is reported.
    RenewRequested = 1 << 10,
    /// Automatic renewal is off for this lease (`AcquireOptions::auto_renew`).
    NoAutoRenew = 1 << 11,
    /// The application released with `release_reported`: the service's answer is reported.
    ReportRelease = 1 << 12,
    /// A release attempt of this lease was confirmed (a later NotOwner for a re-sent release
    /// does not undo that).
    ReleaseConfirmed = 1 << 13,
    /// The application release's outcome was counted (a later cleanup of a late grant, sim
    /// seed 167, is not that release).
    OutcomeKnown = 1 << 14,
}

/// The rarely used part of a lease, boxed so the record stays within two cache lines.
#[derive(Debug, Default)]
struct Cold {
    /// Opaque ownership data from the grant (an etcd lease id, say), echoed in renew/release.
    backend_data: Option<Arc<[u8]>>,
    /// Fencing token of the grant `backend_data` came from.
    backend_fence: u64,
    /// Acquire attempts that timed out while still possibly in flight.
    superseded: Vec<u64>,
}

impl Lease {
    fn backend_data(&self) -> Option<Arc<[u8]>> {
        self.cold.as_ref().and_then(|c| c.backend_data.clone())
    }

    fn set_backend_data(&mut self, data: Option<Arc<[u8]>>, fence: u64) {
        if data.is_some() || self.cold.is_some() {
            let c = self.cold.get_or_insert_with(Default::default);
            c.backend_data = data;
            c.backend_fence = fence;
        }
    }

    /// Takes a grant's data for a cleanup release unless it is older (lower fence) than the
    /// live grant or than data already taken: an older grant is already gone at the service
    /// (sim seeds 70255 and 1147940, where replies arrive out of order).
    /// A newer grant without data replaces older data too: a release echoing the older
    /// grant's data would miss the live grant (fuzz sim crash-a80b8948, a stale grant after a
    /// direct grant).
    fn adopt_backend_data(&mut self, data: &[u8], fence: u64, live_fence: u64) {
        let older_than_live = self.flags.has(Flag::Granted) && fence < live_fence;
        let held = self
            .cold
            .as_ref()
            .map(|c| (c.backend_data.is_some(), c.backend_fence));
        let older_than_held = held.is_some_and(|(_, f)| fence < f);
        if older_than_live || older_than_held {
            return;
        }
        if !data.is_empty() {
            self.set_backend_data(Some(Arc::from(data)), fence);
        } else if held.is_some_and(|(has, f)| has && fence > f) {
            self.set_backend_data(None, fence);
        }
    }

    fn superseded_pending(&self) -> bool {
        self.cold.as_ref().is_some_and(|c| !c.superseded.is_empty())
    }
}

/// One record: the lease and its timer bookkeeping, exactly two cache lines (64-byte
/// aligned), so a renewal at a million leases reaches one page and two lines at a random
/// address, not two pages and three lines (with `Timing` in an array of its own the renew
/// cycle at a million leases measured ~10% slower). `prefetch_upcoming` names a field in each line.
#[derive(Debug)]
#[repr(C, align(64))]
struct Slot {
    lease: Option<Lease>,
    timing: Timing,
    generation: u32,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 128);

/// Timer bookkeeping of a slot. It outlives the slot's records: versions and request counts
/// must never repeat.
#[derive(Debug, Clone, Copy)]
struct Timing {
    /// Deadline of the slot's live timer entry, `NEVER` if none.
    scheduled: u64,
    /// Requests issued from this slot, over all its records (see `REQUEST_LIMIT`).
    requests: u64,
    /// Entries carrying another version are stale. Bumped when the record is freed too.
    version: u32,
    /// Where the live entry sits in the request-timeout FIFO, if it went there: an answered
    /// request cancels its timeout in place (see `Timers::cancel_in_order`).
    fifo_position: u32,
}

/// The fields of a lease that a renewal never reads, in an array beside the records so that
/// the record stays two cache lines.
#[derive(Debug, Clone, Copy, Default)]
struct Lifecycle {
    /// Fencing token of the grant (meaningful once `Flag::Granted` is set).
    fencing_token: u64,
    /// Acquiring: wait deadline. Ended: how long the record may stay (cleanup give-up time,
    /// or until late answers can no longer matter).
    limit: u64,
    /// Reentrant holders; 0 once the lease ended.
    holders: u32,
}

/// The next version of a slot's timer entries. Versions stay even, so never `CANCELLED`.
fn next_version(v: u32) -> u32 {
    const _: () = assert!(CANCELLED % 2 == 1);
    v.wrapping_add(2)
}

#[derive(Debug, Default)]
struct NameEntry {
    reentrant: Option<u32>,
    watchers: u32,
    queue: VecDeque<u32>,
    pending_wake: bool,
}

/// The sans-IO lease core. See the crate docs for the run loop a host implements.
///
/// Methods fall in four groups: getters (`&self`), application calls (`acquire`, `release`),
/// inputs from the host (`handle_*`, `reseed`), and outputs (`poll_output`, `poll_timeout`).
/// After every application call or input, drain `poll_output` until it returns `None`, then
/// wait no later than `poll_timeout`.
pub struct Client {
    config: Config,
    rng: Rng,
    now: u64,
    slots: Vec<Slot>,
    lifecycle: Vec<Lifecycle>,
    free: Vec<u32>,
    records: u32,
    timers: Timers,
    names: HashMap<LockName, NameEntry, KeyedState>,
    outputs: VecDeque<Output>,
    counters: Counters,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("now", &self.now)
            .field("records", &self.records)
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
        let names = HashMap::with_hasher(KeyedState::new(rng.next_u64()));
        Ok(Self {
            config,
            rng,
            now: 0,
            slots: Vec::new(),
            lifecycle: Vec::new(),
            free: Vec::new(),
            records: 0,
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
            self.names.get(name).and_then(|e| e.reentrant)
        } else {
            None
        };
        if let Some(slot) = join {
            let holders = self.life(slot).holders;
            let holders = holders.checked_add(1).ok_or(Error::TooManyLeases)?;
            let id = self.id_of(slot);
            self.life_mut(slot).holders = holders;
            self.advance(now);
            let now = self.now;
            if let Ok(l) = self.lease_ref(id) {
                if l.state == LeaseState::Held && now < l.valid_until {
                    let ev = Event::Acquired {
                        lease: id,
                        fencing_token: self.life(slot).fencing_token,
                        valid_until: l.valid_until,
                    };
                    self.outputs.push_back(Output::Event(ev));
                }
            }
            return Ok(id);
        }
        if self.records >= self.config.max_leases {
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
            next_at: NEVER,
            inflight_req: 0,
            inflight_sent: 0,
            attempts: 0,
            state: LeaseState::Acquiring,
            inflight_kind: ReqKind::Acquire,
            flags: Flags::default()
                .with(Flag::Reentrant, opts.reentrant)
                .with(Flag::NoAutoRenew, !opts.auto_renew),
        };
        let life = Lifecycle {
            fencing_token: 0,
            limit: now.saturating_add(opts.wait_ns),
            holders: 1,
        };
        let slot = self.alloc(lease, life)?;
        if opts.reentrant {
            self.names.entry(name).or_default().reentrant = Some(slot);
        }
        self.send_acquire(slot);
        self.settle(slot);
        Ok(self.id_of(slot))
    }

    /// Releases one holder of `lease`. The last holder ends the lease: `Released` (or
    /// `AcquireFailed{Cancelled}` while acquiring) is emitted at once, and the service-side
    /// release is retried with the same token until it is confirmed or the TTL has run out.
    /// A lease whose validity ran out before this call (a paused process) ends `Lost` instead.
    pub fn release(&mut self, now: u64, lease: LeaseId) -> Result<(), Error> {
        self.release_inner(now, lease, false).map(|_| ())
    }

    /// Like [`Client::release`], and tells what the call did ([`Releasing`]); when the lease
    /// ended `Released` ([`Releasing::Pending`]), the service's answer follows as an
    /// [`Event::ReleaseOutcome`]. A lease whose validity ran out before this call (a paused
    /// process) ends `Lost` with its reason ([`Releasing::Lost`]), never quietly `Released`.
    pub fn release_reported(&mut self, now: u64, lease: LeaseId) -> Result<Releasing, Error> {
        self.release_inner(now, lease, true)
    }

    fn release_inner(
        &mut self,
        now: u64,
        lease: LeaseId,
        report: bool,
    ) -> Result<Releasing, Error> {
        let slot = self.resolve(lease)?;
        if self.lease_mut(slot).state.is_terminal() {
            // Checked before time moves, so an error always means "nothing happened".
            return Err(Error::LeaseEnded(lease));
        }
        self.clamp(now);
        // A held lease that is still valid is released before other timers run, so a renew
        // that happens to be due right now is not sent only to be thrown away. A lease whose
        // validity has passed is reported Lost by `advance` first: that is what it was.
        let t = self.now;
        let l = self.lease_mut(slot);
        let was_held = l.state == LeaseState::Held;
        let still_valid = was_held && t < l.valid_until;
        if still_valid {
            l.flags.set(Flag::ReportRelease, report);
            let done = self.release_slot(slot, lease);
            self.advance(now);
            return Ok(done);
        }
        self.advance(now);
        // If the lease ended during this advance (lost, or its wait ran out), the release is
        // already satisfied and its terminal event is queued.
        let Ok(slot) = self.resolve(lease) else {
            // The record is gone: a held lease that was lost, or an acquire whose wait ran out
            // in this advance (its slot is freed at once when no attempt is uncertain).
            if was_held {
                self.counters.releases_lost += 1;
                return Ok(Releasing::Lost);
            }
            return Ok(Releasing::NotAcquired);
        };
        let l = self.lease_mut(slot);
        l.flags.set(Flag::ReportRelease, report);
        match l.state {
            LeaseState::Lost => {
                self.counters.releases_lost += 1;
                Ok(Releasing::Lost)
            }
            LeaseState::AcquireFailed | LeaseState::Released => Ok(Releasing::NotAcquired),
            LeaseState::Acquiring | LeaseState::Held => Ok(self.release_slot(slot, lease)),
        }
    }

    /// Releases one holder of a live lease.
    fn release_slot(&mut self, slot: u32, lease: LeaseId) -> Releasing {
        let (l, life) = self.lease_and_life(slot);
        match l.state {
            LeaseState::Acquiring | LeaseState::Held if life.holders > 1 => {
                life.holders -= 1;
                Releasing::HolderLeft
            }
            LeaseState::Acquiring => {
                self.fail_acquire(slot, AcquireFailReason::Cancelled);
                self.settle(slot);
                Releasing::NotAcquired
            }
            LeaseState::Held => {
                self.unregister_reentrant(slot);
                self.drop_inflight(slot);
                let retain_until = self.retention_limit(slot);
                let (l, life) = self.lease_and_life(slot);
                l.state = LeaseState::Released;
                life.holders = 0;
                life.limit = retain_until;
                self.outputs
                    .push_back(Output::Event(Event::Released { lease }));
                self.start_cleanup(slot, false);
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
        let slot = self.resolve(lease)?;
        // Checked before time moves, so an error always means "nothing happened".
        match self.lease_mut(slot).state {
            LeaseState::Held => {}
            LeaseState::Acquiring => return Err(Error::NotGranted(lease)),
            LeaseState::Released | LeaseState::Lost | LeaseState::AcquireFailed => {
                return Err(Error::LeaseEnded(lease));
            }
        }
        self.advance(now);
        let Ok(slot) = self.resolve(lease) else {
            return Ok(()); // lost during the advance: its Lost event is queued
        };
        let l = self.lease_mut(slot);
        if l.state != LeaseState::Held {
            return Ok(());
        }
        l.flags.set(Flag::RenewRequested, true);
        if l.inflight_req == 0 {
            self.send_renew(slot);
        }
        self.counters.renewals_requested += 1;
        self.settle(slot);
        Ok(())
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
        let Some(slot) = self.find_request(request.0, ReqKind::Acquire) else {
            self.counters.stale_results += 1;
            return Ok(());
        };
        let live_fence = self.life(slot).fencing_token;
        let l = self.lease_mut(slot);
        let current = l.inflight_req == request.0;
        if !current {
            // A superseded attempt: never changes a live lease (rule 5), but a grant for a
            // lease that already ended must be released (rule 6).
            if let Some(c) = l.cold.as_mut() {
                c.superseded.retain(|&r| r != request.0);
            }
            let state = l.state;
            let regranted = matches!(result, AcquireResult::Granted { fencing_token, .. }
                if state == LeaseState::Held && fencing_token > live_fence);
            self.counters.stale_results += 1;
            if state != LeaseState::Held || regranted {
                // Not a state change: remember the grant's ownership data, so a cleanup
                // release can target it. A held lease keeps its live grant's data, unless the
                // service granted our token again under a newer fence (our grant had ended
                // there): renewals and the release must then carry that grant's data (sim
                // fuzz seed 16512691444503672638, after a backwards clock step).
                self.adopt_backend_data(slot, &result);
            }
            if state.is_terminal() && !matches!(result, AcquireResult::HeldByOther { .. }) {
                self.start_cleanup(slot, false);
            }
            self.settle(slot);
            return Ok(());
        }
        l.inflight_req = 0;
        if l.state == LeaseState::Acquiring {
            match result {
                AcquireResult::Granted {
                    fencing_token,
                    ttl_ms,
                    backend_data,
                } => self.on_granted(slot, fencing_token, ttl_ms, backend_data),
                AcquireResult::HeldByOther { retry_after_ms } => {
                    self.on_held_by_other(slot, retry_after_ms)
                }
                AcquireResult::TransportError => self.on_acquire_uncertain(slot),
            }
        } else {
            // The lease ended while this attempt was in flight.
            if !matches!(result, AcquireResult::HeldByOther { .. }) {
                l.flags.set(Flag::Uncertain, true);
                self.adopt_backend_data(slot, &result);
                self.start_cleanup(slot, false);
            } else if l.flags.has(Flag::Cleanup) {
                self.send_release(slot);
            }
        }
        self.settle(slot);
        Ok(())
    }

    /// A grant we are about to release may carry the ownership data the release needs (an
    /// etcd lease id, say); without it the cleanup would target a stale grant.
    fn adopt_backend_data(&mut self, slot: u32, result: &AcquireResult<'_>) {
        if let AcquireResult::Granted {
            fencing_token,
            backend_data,
            ..
        } = *result
        {
            let (l, life) = self.lease_and_life(slot);
            l.adopt_backend_data(backend_data, fencing_token, life.fencing_token);
        }
    }

    /// Feeds the service's answer to a `Renew` command.
    pub fn handle_renew_result(
        &mut self,
        now: u64,
        request: RequestId,
        result: RenewResult,
    ) -> Result<(), Error> {
        self.advance(now);
        let Some(slot) = self.find_request(request.0, ReqKind::Renew) else {
            self.counters.stale_results += 1;
            return Ok(());
        };
        let now = self.now;
        let config = self.config;
        let l = self.lease_mut(slot);
        if l.inflight_req != request.0 || l.state != LeaseState::Held {
            self.counters.stale_results += 1;
            self.settle(slot);
            return Ok(());
        }
        l.inflight_req = 0;
        match result {
            RenewResult::Renewed => {
                let ttl_ns = l.ttl_ms * NS_PER_MS;
                let until = l
                    .inflight_sent
                    .saturating_add(ttl_ns)
                    .saturating_sub(config.drift_ns(ttl_ns));
                l.valid_until = l.valid_until.max(until);
                l.attempts = 0;
                let sent = l.inflight_sent;
                let flags = l.flags;
                let next = if flags.has(Flag::NoAutoRenew) {
                    NEVER
                } else {
                    sent.saturating_add(self.renew_interval(ttl_ns))
                };
                let l = self.lease_mut(slot);
                l.next_at = next;
                let valid_until = l.valid_until;
                self.counters.renewals_ok += 1;
                if now >= valid_until {
                    self.lose(slot, LostReason::Expired);
                } else if flags.has(Flag::RenewRequested) {
                    self.lease_mut(slot).flags.set(Flag::RenewRequested, false);
                    let lease = self.id_of(slot);
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
        let Some(slot) = self.find_request(request.0, ReqKind::Release) else {
            self.counters.stale_results += 1;
            return Ok(());
        };
        let l = self.lease_mut(slot);
        if l.inflight_req != request.0 {
            self.counters.stale_results += 1;
            self.settle(slot);
            return Ok(());
        }
        l.inflight_req = 0;
        match result {
            ReleaseResult::Released | ReleaseResult::NotOwner => {
                if result == ReleaseResult::Released {
                    l.flags.set(Flag::ReleaseConfirmed, true);
                }
                // A refusal after an attempt lost in transport may be that attempt having
                // released the lock: no evidence that another owner took it.
                let ambiguous = result == ReleaseResult::NotOwner && l.attempts > 0;
                if l.flags.has(Flag::CleanupAgain) {
                    l.flags.set(Flag::CleanupAgain, false);
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
        let Some(entry) = self.names.get_mut(name) else {
            return Ok(());
        };
        match entry.queue.pop_front() {
            Some(slot) => {
                let l = self.lease_mut(slot);
                l.flags.set(Flag::Queued, false);
                self.send_acquire(slot);
                self.settle(slot);
            }
            None if entry.watchers > 0 => entry.pending_wake = true,
            None => {}
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
        let slot = match self.resolve(lease) {
            Ok(slot) => slot,
            Err(Error::LeaseEnded(_)) => {
                self.counters.stale_results += 1;
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        let l = self.lease_mut(slot);
        if l.state != LeaseState::Acquiring || l.flags.has(Flag::Cleanup) {
            self.counters.stale_results += 1;
            return Ok(false);
        }
        if l.inflight_req != 0 {
            l.flags.set(Flag::RetryIfRefused, true);
        } else {
            self.send_acquire(slot);
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
        let slot = match self.resolve(lease) {
            Ok(slot) => slot,
            Err(Error::LeaseEnded(_)) => {
                self.counters.stale_results += 1;
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        if self.lease_mut(slot).state != LeaseState::Held {
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

    /// Next command or event, in the order they arose; `None` once drained.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// When the host must call `handle_timeout` at the latest; `None` when nothing is
    /// scheduled. May be in the past: then call `handle_timeout` at once.
    pub fn poll_timeout(&mut self) -> Option<u64> {
        while let Some(e @ (deadline, slot, version)) = self.timers.peek() {
            if self.timer_is_current(slot, version) {
                return Some(deadline);
            }
            self.timers.remove_earliest(e);
        }
        None
    }

    // ------------------------------------------------------------------------ getters

    /// Lifecycle position of a lease whose record still exists.
    pub fn lease_state(&self, lease: LeaseId) -> Result<LeaseState, Error> {
        Ok(self.lease_ref(lease)?.state)
    }

    /// Snapshot of a lease.
    pub fn lease_info(&self, lease: LeaseId) -> Result<LeaseInfo, Error> {
        let (l, life) = self.lease_parts(lease)?;
        Ok(LeaseInfo {
            state: l.state,
            name: l.name.clone(),
            fencing_token: l.flags.has(Flag::Granted).then_some(life.fencing_token),
            valid_until: l.flags.has(Flag::Granted).then_some(l.valid_until),
            holders: life.holders,
        })
    }

    /// Fencing token of the grant; `None` before a grant. Pass it with every protected write.
    pub fn fencing_token(&self, lease: LeaseId) -> Result<Option<u64>, Error> {
        let (l, life) = self.lease_parts(lease)?;
        Ok(l.flags.has(Flag::Granted).then_some(life.fencing_token))
    }

    /// End of validity (host-monotonic ns); `None` before a grant.
    pub fn valid_until(&self, lease: LeaseId) -> Result<Option<u64>, Error> {
        let l = self.lease_ref(lease)?;
        Ok(l.flags.has(Flag::Granted).then_some(l.valid_until))
    }

    /// Advice only: true while the lease is held and `now` is before `valid_until`. Storage
    /// must still check the fencing token; this cannot see a pause that happens after it.
    pub fn is_held(&self, lease: LeaseId, now: u64) -> Result<bool, Error> {
        let l = self.lease_ref(lease)?;
        let now = now.max(self.now);
        Ok(l.state == LeaseState::Held && now < l.valid_until)
    }

    /// Counters and gauges.
    pub fn counters(&self) -> Counters {
        let mut c = self.counters;
        c.live_leases = u64::from(self.records);
        c
    }

    // ---------------------------------------------------------------------- internals

    fn id_of(&self, slot: u32) -> LeaseId {
        LeaseId((u64::from(self.slots[slot as usize].generation) << SLOT_BITS) | u64::from(slot))
    }

    fn resolve(&self, lease: LeaseId) -> Result<u32, Error> {
        let slot = (lease.0 & SLOT_MASK) as usize;
        let generation = lease.0 >> SLOT_BITS;
        let Some(s) = self.slots.get(slot) else {
            return Err(Error::UnknownLease(lease));
        };
        let current = u64::from(s.generation);
        if generation == 0 || generation > current {
            return Err(Error::UnknownLease(lease));
        }
        if generation < current || s.lease.is_none() {
            return Err(Error::LeaseEnded(lease));
        }
        Ok(slot as u32)
    }

    fn lease_ref(&self, lease: LeaseId) -> Result<&Lease, Error> {
        Ok(self.lease_parts(lease)?.0)
    }

    fn lease_parts(&self, lease: LeaseId) -> Result<(&Lease, &Lifecycle), Error> {
        let slot = self.resolve(lease)?;
        let l = self.slots[slot as usize]
            .lease
            .as_ref()
            .ok_or(Error::LeaseEnded(lease))?;
        Ok((l, self.life(slot)))
    }

    /// Only called with slots known to hold a record.
    fn lease_mut(&mut self, slot: u32) -> &mut Lease {
        match self.slots[slot as usize].lease.as_mut() {
            Some(l) => l,
            None => unreachable!("slot {slot} has no lease record"),
        }
    }

    /// The lease's fields that live beside its record (see `Lifecycle`).
    fn life(&self, slot: u32) -> &Lifecycle {
        &self.lifecycle[slot as usize]
    }

    fn life_mut(&mut self, slot: u32) -> &mut Lifecycle {
        &mut self.lifecycle[slot as usize]
    }

    /// Both halves of a lease at once.
    fn lease_and_life(&mut self, slot: u32) -> (&mut Lease, &mut Lifecycle) {
        let l = match self.slots[slot as usize].lease.as_mut() {
            Some(l) => l,
            None => unreachable!("slot {slot} has no lease record"),
        };
        (l, &mut self.lifecycle[slot as usize])
    }

    fn alloc(&mut self, lease: Lease, life: Lifecycle) -> Result<u32, Error> {
        let slot = if let Some(slot) = self.free.pop() {
            let s = &mut self.slots[slot as usize];
            s.generation += 1;
            s.lease = Some(lease);
            self.lifecycle[slot as usize] = life;
            slot
        } else {
            let slot = u32::try_from(self.slots.len()).map_err(|_| Error::TooManyLeases)?;
            if u64::from(slot) > SLOT_MASK {
                return Err(Error::TooManyLeases);
            }
            self.slots.push(Slot {
                lease: Some(lease),
                timing: Timing {
                    scheduled: NEVER,
                    requests: 0,
                    version: 0,
                    fifo_position: 0,
                },
                generation: 1,
            });
            self.lifecycle.push(life);
            slot
        };
        self.records += 1;
        Ok(slot)
    }

    fn free_slot(&mut self, slot: u32) {
        self.slots[slot as usize].lease = None;
        let t = &mut self.slots[slot as usize].timing;
        t.version = next_version(t.version);
        t.scheduled = NEVER;
        let ids_left = t.requests < REQUEST_LIMIT / 2;
        self.records -= 1;
        if self.slots[slot as usize].generation < MAX_GEN && ids_left {
            self.free.push(slot);
        }
    }

    fn next_request(&mut self, slot: u32) -> u64 {
        let t = &mut self.slots[slot as usize].timing;
        // Saturates instead of spilling into the slot bits (see `REQUEST_LIMIT`).
        t.requests = (t.requests + 1).min(REQUEST_LIMIT - 1);
        (t.requests << SLOT_BITS) | u64::from(slot)
    }

    /// Finds the lease a result belongs to: its in-flight request, or one of its superseded
    /// acquire attempts. A result of the wrong kind is left pending for the real answer.
    fn find_request(&self, req: u64, kind: ReqKind) -> Option<u32> {
        let slot = (req & SLOT_MASK) as u32;
        let l = self.slots.get(slot as usize)?.lease.as_ref()?;
        let expected = if req != 0 && l.inflight_req == req {
            l.inflight_kind
        } else if l.cold.as_ref().is_some_and(|c| c.superseded.contains(&req)) {
            ReqKind::Acquire // only acquire attempts are ever superseded
        } else {
            return None;
        };
        (expected == kind).then_some(slot)
    }

    fn clamp(&mut self, now: u64) {
        if now < self.now {
            self.counters.time_clamped += 1;
        } else {
            self.now = now;
        }
    }

    /// Moves time forward and runs every due timer in deadline order. After a long pause,
    /// validity checks therefore run before anything new is sent (rule 3).
    fn advance(&mut self, now: u64) {
        self.clamp(now);
        while let Some(e @ (deadline, slot, version)) = self.timers.peek() {
            if deadline > self.now {
                break;
            }
            self.timers.remove_earliest(e);
            if !self.timer_is_current(slot, version) {
                continue;
            }
            self.slots[slot as usize].timing.scheduled = NEVER;
            if self.records > CACHED_RECORDS {
                self.prefetch_upcoming();
            }
            self.on_timer(slot);
            self.settle(slot);
        }
    }

    /// Software pipelining over the sorted timer run: start loading the records of the
    /// timers two and three ahead (names are inside them), so that with many leases a cycle
    /// does not wait on memory. Only a hint: nothing depends on it.
    fn prefetch_upcoming(&self) {
        for k in 2..4 {
            if let Some((_, slot, _)) = self.timers.upcoming(k) {
                if let Some(s) = self.slots.get(slot as usize) {
                    prefetch(&s.lease);
                    prefetch(&s.generation);
                }
            }
        }
        if let Some((_, slot, version)) = self.timers.upcoming_in_order(2) {
            if version != CANCELLED {
                if let Some(s) = self.slots.get(slot as usize) {
                    prefetch(&s.timing);
                }
            }
        }
    }

    /// Freeing a record bumps its version, so a matching version implies a live record.
    /// A cancelled entry is known stale without a look at its slot.
    fn timer_is_current(&self, slot: u32, version: u32) -> bool {
        version != CANCELLED && self.slots[slot as usize].timing.version == version
    }

    fn request_timeout(&self, l: &Lease) -> u64 {
        match (l.state, l.inflight_kind) {
            (LeaseState::Held, ReqKind::Renew) => self
                .config
                .request_timeout_ns
                .min(l.ttl_ms * NS_PER_MS / 3)
                .max(1),
            _ => self.config.request_timeout_ns,
        }
    }

    fn deadline_of(&self, slot: u32, l: &Lease) -> u64 {
        let inflight_deadline = || l.inflight_sent.saturating_add(self.request_timeout(l));
        match l.state {
            LeaseState::Acquiring => {
                if l.inflight_req != 0 {
                    inflight_deadline()
                } else {
                    l.next_at.min(self.life(slot).limit)
                }
            }
            LeaseState::Held => {
                let d = if l.inflight_req != 0 {
                    inflight_deadline()
                } else {
                    l.next_at
                };
                d.min(l.valid_until)
            }
            _ => {
                if l.inflight_req != 0 {
                    inflight_deadline()
                } else if l.flags.has(Flag::Cleanup) {
                    l.next_at
                } else {
                    NEVER
                }
            }
        }
    }

    /// After any change to a lease: free a finished record, or (re)schedule its deadline.
    fn settle(&mut self, slot: u32) {
        let Some(l) = self.slots[slot as usize].lease.as_ref() else {
            return;
        };
        let in_flight = l.inflight_req != 0;
        let deadline = if l.state.is_terminal() && !in_flight && !l.flags.has(Flag::Cleanup) {
            let limit = self.life(slot).limit;
            if !l.superseded_pending() || limit <= self.now {
                self.free_slot(slot);
                return;
            }
            // Nothing else pending: keep the record (to release a late grant) until its
            // give-up time, which is in the future, so the timer always makes progress.
            limit
        } else {
            self.deadline_of(slot, l)
        };
        let t = &mut self.slots[slot as usize].timing;
        if deadline == t.scheduled {
            return;
        }
        let old = (t.scheduled, slot, t.version);
        let old_position = t.fifo_position;
        t.scheduled = deadline;
        t.version = next_version(t.version);
        let version = t.version;
        if old.0 != NEVER {
            // Usually an answered request's timeout.
            let _ = self.timers.cancel_in_order(old_position, old);
        }
        if deadline == NEVER {
            return;
        }
        let entry = (deadline, slot, version);
        if in_flight {
            // Request timeouts are send time plus one duration: nearly always in order.
            let position = self.timers.push_in_order(entry);
            self.slots[slot as usize].timing.fifo_position = position;
        } else {
            self.timers.push(entry);
        }
        self.maybe_compact_timers();
    }

    /// Stale heap entries are dropped lazily; rebuild when they dominate, so the heap stays
    /// O(live leases) whatever the input sequence (I7).
    fn maybe_compact_timers(&mut self) {
        let live = self.records as usize;
        if self.timers.len() <= 4 * live + 64 {
            return;
        }
        self.timers.clear();
        // Freeing a record resets its `scheduled`, so a deadline here means a live record.
        for (i, t) in self.slots.iter().map(|s| &s.timing).enumerate() {
            if t.scheduled != NEVER {
                self.timers.push((t.scheduled, i as u32, t.version));
            }
        }
    }

    fn on_timer(&mut self, slot: u32) {
        let now = self.now;
        let timed_out = {
            let l = self.slots[slot as usize].lease.as_ref();
            l.is_some_and(|l| {
                l.inflight_req != 0
                    && now >= l.inflight_sent.saturating_add(self.request_timeout(l))
            })
        };
        // Borrows the records only, so the acquiring branch can read `lifecycle` (a renewal
        // does not touch it).
        let Some(l) = self.slots[slot as usize].lease.as_mut() else {
            return;
        };
        match l.state {
            LeaseState::Acquiring => {
                if l.inflight_req != 0 {
                    if timed_out {
                        self.supersede_inflight(slot);
                        self.on_acquire_uncertain(slot);
                    }
                } else if now >= self.lifecycle[slot as usize].limit {
                    let reason = if l.flags.has(Flag::LastAttemptFailed) {
                        AcquireFailReason::Unavailable
                    } else {
                        AcquireFailReason::WaitExhausted
                    };
                    self.fail_acquire(slot, reason);
                } else if now >= l.next_at {
                    self.send_acquire(slot);
                }
            }
            LeaseState::Held => {
                if now >= l.valid_until {
                    self.lose(slot, LostReason::Expired);
                } else if l.inflight_req != 0 {
                    if timed_out {
                        l.inflight_req = 0;
                        self.renew_failed(slot);
                    }
                } else if now >= l.next_at {
                    self.send_renew(slot);
                }
            }
            _ => {
                if l.inflight_req != 0 {
                    if timed_out {
                        match l.inflight_kind {
                            ReqKind::Acquire => {
                                self.supersede_inflight(slot);
                                let l = self.lease_mut(slot);
                                l.flags.set(Flag::Uncertain, true);
                                self.start_cleanup(slot, false);
                            }
                            ReqKind::Release => {
                                l.inflight_req = 0;
                                self.release_attempt_failed(slot);
                            }
                            ReqKind::Renew => {
                                l.inflight_req = 0;
                            }
                        }
                    }
                } else if l.flags.has(Flag::Cleanup) && now >= l.next_at {
                    self.send_release(slot);
                }
            }
        }
    }

    /// A timed-out acquire attempt may still be applied by the service; remember its id so a
    /// late grant can be recognised (and released if the lease has ended by then).
    fn supersede_inflight(&mut self, slot: u32) {
        let l = self.lease_mut(slot);
        let req = l.inflight_req;
        l.inflight_req = 0;
        l.flags.set(Flag::Uncertain, true);
        let list = &mut l.cold.get_or_insert_with(Default::default).superseded;
        list.push(req);
        if list.len() > MAX_SUPERSEDED {
            list.remove(0);
        }
    }

    fn drop_inflight(&mut self, slot: u32) {
        let l = self.lease_mut(slot);
        if l.inflight_req != 0 && l.inflight_kind != ReqKind::Acquire {
            l.inflight_req = 0;
        }
    }

    fn send_acquire(&mut self, slot: u32) {
        if self.lease_mut(slot).flags.has(Flag::Queued) {
            self.dequeue(slot);
        }
        let l = self.lease_mut(slot);
        l.attempts = l.attempts.saturating_add(1);
        self.send(slot, ReqKind::Acquire);
        self.counters.acquires_sent += 1;
    }

    fn send_renew(&mut self, slot: u32) {
        self.send(slot, ReqKind::Renew);
        self.counters.renewals_sent += 1;
    }

    fn send_release(&mut self, slot: u32) {
        self.send(slot, ReqKind::Release);
        self.counters.releases_sent += 1;
    }

    /// Emits one command for the lease and makes it the lease's single in-flight request.
    fn send(&mut self, slot: u32, kind: ReqKind) {
        let req = self.next_request(slot);
        let now = self.now;
        let id = self.id_of(slot);
        let l = self.lease_mut(slot);
        l.inflight_req = req;
        l.inflight_sent = now;
        l.inflight_kind = kind;
        let (request, name, token) = (RequestId(req), l.name.clone(), l.token);
        let cmd = match kind {
            ReqKind::Acquire => Command::Acquire {
                request,
                lease: id,
                name,
                token,
                ttl_ms: l.ttl_ms,
            },
            ReqKind::Renew => Command::Renew {
                request,
                lease: id,
                name,
                token,
                ttl_ms: l.ttl_ms,
                backend_data: l.backend_data(),
            },
            ReqKind::Release => Command::Release {
                request,
                lease: id,
                name,
                token,
                backend_data: l.backend_data(),
            },
        };
        self.outputs.push_back(Output::Command(cmd));
    }

    fn renew_interval(&mut self, ttl_ns: u64) -> u64 {
        let base = ttl_ns / 3;
        let jitter = parts_per_million(base, self.config.renew_jitter_ppm);
        base - jitter + self.rng.up_to(2 * jitter)
    }

    /// Full-jitter exponential backoff: `random(0, min(cap, base × 2^attempt))`.
    fn backoff(&mut self, attempt: u32) -> u64 {
        let exp = self
            .config
            .backoff_base_ns
            .saturating_mul(1u64 << attempt.min(32));
        self.rng.up_to(exp.min(self.config.backoff_cap_ns))
    }

    fn on_granted(&mut self, slot: u32, fencing_token: u64, ttl_ms: u64, backend_data: &[u8]) {
        let now = self.now;
        let config = self.config;
        let (l, life) = self.lease_and_life(slot);
        let ttl_ns = ttl_ms.min(l.ttl_ms) * NS_PER_MS;
        let valid_until = l
            .inflight_sent
            .saturating_add(ttl_ns)
            .saturating_sub(config.drift_ns(ttl_ns));
        if ttl_ns == 0 || valid_until <= now {
            // The grant was already stale when it arrived: it is ours at the service, but no
            // validity is left. Retry (idempotent for our token) or give up and clean up.
            l.flags.set(Flag::Uncertain, true);
            l.flags.set(Flag::LastAttemptFailed, true);
            l.adopt_backend_data(backend_data, fencing_token, life.fencing_token);
            if now >= life.limit {
                self.fail_acquire(slot, AcquireFailReason::Unavailable);
            } else {
                let attempts = l.attempts;
                let delay = self.backoff(attempts);
                self.lease_mut(slot).next_at = now.saturating_add(delay);
            }
            return;
        }
        let sent = l.inflight_sent;
        // Renewals ask for (and count validity from) what the service actually granted.
        l.ttl_ms = ttl_ns / NS_PER_MS;
        l.state = LeaseState::Held;
        l.flags.set(Flag::Granted, true);
        life.fencing_token = fencing_token;
        l.valid_until = valid_until;
        l.set_backend_data(
            (!backend_data.is_empty()).then(|| Arc::from(backend_data)),
            fencing_token,
        );
        l.attempts = 0;
        let next = if l.flags.has(Flag::NoAutoRenew) {
            NEVER
        } else {
            sent.saturating_add(self.renew_interval(ttl_ns))
        };
        self.lease_mut(slot).next_at = next;
        self.leave_waiting(slot);
        self.counters.grants += 1;
        let id = self.id_of(slot);
        self.outputs.push_back(Output::Event(Event::Acquired {
            lease: id,
            fencing_token,
            valid_until,
        }));
    }

    fn on_held_by_other(&mut self, slot: u32, retry_after_ms: Option<u64>) {
        let now = self.now;
        let (l, life) = self.lease_and_life(slot);
        if now >= life.limit {
            let reason = AcquireFailReason::WaitExhausted;
            self.fail_acquire(slot, reason);
            return;
        }
        l.flags.set(Flag::LastAttemptFailed, false);
        let noticed = l.flags.has(Flag::RetryIfRefused);
        l.flags.set(Flag::RetryIfRefused, false);
        let attempts = l.attempts;
        self.enter_waiting(slot);
        let name = self.lease_mut(slot).name.clone();
        let woken = self
            .names
            .get_mut(&*name)
            .map(|e| std::mem::take(&mut e.pending_wake))
            .unwrap_or(false)
            || noticed;
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
        let l = self.lease_mut(slot);
        l.next_at = now.saturating_add(sleep);
        self.enqueue(slot);
    }

    fn on_acquire_uncertain(&mut self, slot: u32) {
        let now = self.now;
        let (l, life) = self.lease_and_life(slot);
        l.flags.set(Flag::Uncertain, true);
        l.flags.set(Flag::LastAttemptFailed, true);
        if now >= life.limit {
            self.fail_acquire(slot, AcquireFailReason::Unavailable);
            return;
        }
        let attempts = l.attempts;
        let delay = self.backoff(attempts);
        self.lease_mut(slot).next_at = now.saturating_add(delay);
    }

    fn fail_acquire(&mut self, slot: u32, reason: AcquireFailReason) {
        self.leave_waiting(slot);
        self.unregister_reentrant(slot);
        let id = self.id_of(slot);
        let (l, life) = self.lease_and_life(slot);
        l.state = LeaseState::AcquireFailed;
        life.holders = 0;
        let uncertain = l.flags.has(Flag::Uncertain);
        let ttl_ns = l.ttl_ms * NS_PER_MS;
        let limit = self
            .now
            .saturating_add(ttl_ns)
            .saturating_add(self.config.request_timeout_ns);
        self.life_mut(slot).limit = limit;
        self.counters.acquire_failed += 1;
        self.outputs
            .push_back(Output::Event(Event::AcquireFailed { lease: id, reason }));
        if uncertain {
            self.start_cleanup(slot, false);
        }
    }

    fn renew_failed(&mut self, slot: u32) {
        self.counters.renewals_failed += 1;
        let now = self.now;
        let budget = self.config.fail_budget;
        let base = self.config.backoff_base_ns;
        let l = self.lease_mut(slot);
        l.attempts = l.attempts.saturating_add(1);
        if budget > 0 && l.attempts >= budget {
            self.lose(slot, LostReason::FailBudget);
            return;
        }
        // Retry promptly while validity remains: exponential steps from `backoff_base_ns`,
        // at most TTL/10, so an outage of a few seconds is bridged by a retry soon after the
        // service returns.
        let step = base
            .saturating_mul(1u64 << (l.attempts - 1).min(32))
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
        self.lease_mut(slot).next_at = now.saturating_add(delay);
    }

    fn lose(&mut self, slot: u32, reason: LostReason) {
        self.unregister_reentrant(slot);
        self.drop_inflight(slot);
        let id = self.id_of(slot);
        let retain_until = self.retention_limit(slot);
        let (l, life) = self.lease_and_life(slot);
        l.state = LeaseState::Lost;
        life.holders = 0;
        life.limit = retain_until;
        match reason {
            LostReason::Rejected => self.counters.lost_rejected += 1,
            LostReason::Expired => self.counters.lost_expired += 1,
            LostReason::FailBudget => self.counters.lost_fail_budget += 1,
        }
        self.outputs
            .push_back(Output::Event(Event::Lost { lease: id, reason }));
        if reason != LostReason::Rejected {
            // One best-effort release: ownership is checked by the service, so it can only
            // delete our own (possibly still live) grant (rule 6).
            self.start_cleanup(slot, true);
        }
    }

    /// How long an ended lease's record may linger to recognise a late answer: one TTL plus
    /// one request timeout after the end, whatever the original wait budget was.
    fn retention_limit(&mut self, slot: u32) -> u64 {
        let rt = self.config.request_timeout_ns;
        let now = self.now;
        let l = self.lease_mut(slot);
        now.saturating_add(l.ttl_ms * NS_PER_MS).saturating_add(rt)
    }

    fn start_cleanup(&mut self, slot: u32, best_effort: bool) {
        let now = self.now;
        let rt = self.config.request_timeout_ns;
        let (l, life) = self.lease_and_life(slot);
        let give_up = now.saturating_add(l.ttl_ms * NS_PER_MS).saturating_add(rt);
        if !l.flags.has(Flag::Cleanup) {
            l.flags.set(Flag::Cleanup, true);
            l.flags.set(Flag::CleanupBestEffort, best_effort);
            l.attempts = 0;
            life.limit = give_up;
            l.next_at = NEVER;
            self.counters.pending_cleanups += 1;
        } else {
            if l.inflight_req != 0 && l.inflight_kind == ReqKind::Release {
                l.flags.set(Flag::CleanupAgain, true);
            }
            if !best_effort {
                l.flags.set(Flag::CleanupBestEffort, false);
                life.limit = life.limit.max(give_up);
            }
        }
        if self.lease_mut(slot).inflight_req == 0 {
            self.send_release(slot);
        }
    }

    fn release_attempt_failed(&mut self, slot: u32) {
        let now = self.now;
        let (l, life) = self.lease_and_life(slot);
        if l.flags.has(Flag::CleanupBestEffort) || now >= life.limit {
            self.finish_cleanup(slot, false);
            return;
        }
        l.attempts = l.attempts.saturating_add(1);
        let attempts = l.attempts;
        let delay = self.backoff(attempts);
        self.lease_mut(slot).next_at = now.saturating_add(delay);
    }

    /// Ends a cleanup: with `confirmed` when the service answered (confirmed or not owner),
    /// else it gave up. The release of a lease the application released is counted and, when
    /// asked for, reported.
    fn finish_cleanup(&mut self, slot: u32, answered: bool) {
        let l = self.lease_mut(slot);
        if !l.flags.has(Flag::Cleanup) {
            return;
        }
        l.flags.set(Flag::Cleanup, false);
        l.flags.set(Flag::CleanupAgain, false);
        let (state, flags) = (l.state, l.flags);
        l.flags.set(Flag::OutcomeKnown, true);
        self.counters.pending_cleanups -= 1;
        if state != LeaseState::Released || flags.has(Flag::OutcomeKnown) {
            return;
        }
        let outcome = if !answered {
            ReleaseOutcome::Unconfirmed
        } else if flags.has(Flag::ReleaseConfirmed) {
            ReleaseOutcome::Confirmed
        } else {
            ReleaseOutcome::NotOwner
        };
        let report = flags.has(Flag::ReportRelease);
        match outcome {
            ReleaseOutcome::Confirmed => self.counters.releases_confirmed += 1,
            ReleaseOutcome::NotOwner => self.counters.releases_not_owner += 1,
            ReleaseOutcome::Unconfirmed => self.counters.releases_unconfirmed += 1,
        }
        if report {
            let lease = self.id_of(slot);
            self.outputs
                .push_back(Output::Event(Event::ReleaseOutcome { lease, outcome }));
        }
    }

    fn unregister_reentrant(&mut self, slot: u32) {
        let l = self.lease_mut(slot);
        if !l.flags.has(Flag::Reentrant) {
            return;
        }
        let name = l.name.clone();
        if let Some(e) = self.names.get_mut(&*name) {
            if e.reentrant == Some(slot) {
                e.reentrant = None;
            }
        }
        self.gc_name(&name);
    }

    fn enter_waiting(&mut self, slot: u32) {
        let l = self.lease_mut(slot);
        if l.flags.has(Flag::Watching) {
            return;
        }
        l.flags.set(Flag::Watching, true);
        let name = l.name.clone();
        let e = self.names.entry(name.clone()).or_default();
        e.watchers += 1;
        if e.watchers == 1 {
            self.outputs
                .push_back(Output::Command(Command::Watch { name }));
        }
    }

    fn enqueue(&mut self, slot: u32) {
        let l = self.lease_mut(slot);
        if l.flags.has(Flag::Queued) {
            return;
        }
        l.flags.set(Flag::Queued, true);
        let name = l.name.clone();
        self.names.entry(name).or_default().queue.push_back(slot);
    }

    fn dequeue(&mut self, slot: u32) {
        let l = self.lease_mut(slot);
        l.flags.set(Flag::Queued, false);
        let name = l.name.clone();
        if let Some(e) = self.names.get_mut(&*name) {
            e.queue.retain(|&s| s != slot);
        }
    }

    fn leave_waiting(&mut self, slot: u32) {
        if self.lease_mut(slot).flags.has(Flag::Queued) {
            self.dequeue(slot);
        }
        let l = self.lease_mut(slot);
        if !l.flags.has(Flag::Watching) {
            return;
        }
        l.flags.set(Flag::Watching, false);
        let name = l.name.clone();
        if let Some(e) = self.names.get_mut(&*name) {
            e.watchers -= 1;
            if e.watchers == 0 {
                e.pending_wake = false;
                self.outputs
                    .push_back(Output::Command(Command::Unwatch { name: name.clone() }));
            }
        }
        self.gc_name(&name);
    }

    fn gc_name(&mut self, name: &str) {
        let empty = self
            .names
            .get(name)
            .is_some_and(|e| e.reentrant.is_none() && e.watchers == 0 && e.queue.is_empty());
        if empty {
            self.names.remove(name);
        }
    }
}
