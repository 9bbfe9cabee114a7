//! The handoff: who tries when a lock comes free.
//!
//! # Wake one, with a standby
//!
//! Each protocol object subscribes one wake channel of its own (`lh:wake:` + 32 hex digits).
//! A refused ACQUIRE queues the lease in `lh:{NAME}:queue` (entry `wake#token`, scored by
//! server time, a retry keeps its place). RELEASE pops the oldest entry whose channel has a
//! subscriber and publishes `w TOKEN NAME` to it (wake up and try), and `s1 TOKEN NAME` /
//! `s2 TOKEN NAME` to the two entries after it (stand by, with a rank); TOKEN is the entry's
//! own, so the message reaches the lease whose entry it is ([`crate::Client::handle_wake`]),
//! not whichever of this client's waiters of the name is first. A granted ACQUIRE of a lease
//! that may have queued (any attempt after its first) removes its own entry and publishes
//! `g TTL TOKEN NAME` (granted for TTL ms) to each of the first two entries left: a standby stands down, and that entry's lease looks again when the grant
//! runs out, so a holder that freezes is taken over at its expiry even by a waiter whose
//! refusal, from further back in the queue, told it to wait `idle_recheck_ms` (older
//! scripts send `t NAME`, which only stands a standby down). A standby that
//! hears no `g` within rank × the standby delay (150 ms by default) tries itself: a frozen
//! or dead head (a SIGSTOP'd process whose socket is still open, so its PUBLISH counted)
//! keeps the lock free for about one delay (two frozen in a row: two), never for a TTL, and
//! it has been popped, so it costs one handoff once. An ordinary handoff is two script
//! calls (RELEASE, the woken waiter's ACQUIRE); the standby notices are PUBLISHes inside
//! them.
//! Direct grants (RELEASE granting the head) were not kept: they save one call per handoff
//! but need the grantee's send time to date the grant, a notice path, and releases of grants
//! nobody wants any more; the wake-one queue meets the bounds without them.
//!
//! # Idle waiters
//!
//! Idle waiters cost almost nothing: a refused ACQUIRE whose entry is queued while the
//! subscription is live makes that lease's later retries (the engine's quick attempts) local
//! refusals, until a wake-up, a re-subscription, or — for the head of the queue — the
//! holder's expiry (it may have died without releasing), and for the others
//! `idle_recheck_ms` (10 s): only then does the lease ask Redis again. Each name keeps an
//! epoch, bumped by everything after which a queued refusal may be out of date.

use super::replies::Acquired;
use super::scripts::{self, KeyKind, Script, parse_message, shard_channel_name};
use super::{Arg, Connection, MS, NEVER, Op, RedisProtocol};
use crate::{AcquireResult, Client, Event, LeaseId, LockName, Token};

/// A name with acquiring leases here.
#[derive(Debug)]
pub(super) struct NameState {
    /// Bumped by every event after which a queued refusal may be out of date.
    pub(super) epoch: u64,
    pub(super) leases: u32,
    pub(super) standby_until: u64,
    /// The lease a standby message named (the earliest armed one): the lease it wakes.
    pub(super) standby_lease: Option<LeaseId>,
    /// When the latest grant reported by a `g` notice runs out: the lease it named looks
    /// again then (the holder may have frozen). `NEVER` if none.
    pub(super) recheck_at: u64,
    pub(super) recheck_lease: Option<LeaseId>,
}

/// A refusal after which nothing can change for the lease before `until` unless the name's
/// epoch moves: its entry is queued and the subscription was live throughout.
#[derive(Debug, Clone, Copy)]
pub(super) struct Quiet {
    pub(super) epoch: u64,
    pub(super) until: u64,
}

#[derive(Debug)]
pub(super) struct Waiting {
    pub(super) name: LockName,
    pub(super) token: Token,
    /// A refusal queued the entry (remove it if the lease gives up).
    pub(super) queued: bool,
    pub(super) quiet: Option<Quiet>,
    /// Wake-ups aimed at this lease: a refusal sent before the latest one is older news and
    /// must not quiet the lease.
    pub(super) wakes: u32,
}

/// What an ACQUIRE knew when it was sent, to judge its refusal by.
#[derive(Debug)]
pub(super) struct Attempt {
    pub(super) lease: LeaseId,
    pub(super) name: LockName,
    pub(super) token: Token,
    /// The subscription was live when it was sent.
    pub(super) covered: bool,
    /// The name's epoch when it was sent.
    pub(super) epoch: u64,
    /// The lease's wake-ups when it was sent.
    pub(super) wakes: u32,
    pub(super) sent_at: u64,
}

impl RedisProtocol {
    /// The result of an ACQUIRE for the engine. A refusal queued the lease's entry: it stays
    /// quiet (its retries are answered here) until the holder's time is up, or longer behind
    /// the head, if nothing can have reached it unheard since the attempt was sent.
    pub(super) fn acquire_result(
        &mut self,
        reply: &super::Value<'_>,
        a: Attempt,
        now: u64,
    ) -> AcquireResult<'static> {
        match self.acquire_reply(reply) {
            Some(Acquired::Granted { fence, ttl_ms }) => AcquireResult::Granted {
                fencing_token: fence,
                ttl_ms,
                backend_data: &[],
            },
            Some(Acquired::Held { left_ms, rank }) => {
                let live_epoch = self.names.get(&a.name).map(|s| s.epoch);
                let live = self.live(&a.name);
                let idle = self.opts.idle_recheck_ms;
                if let Some(w) = self.leases.get_mut(&a.lease) {
                    w.queued = true;
                    let fresh = live_epoch == Some(a.epoch) && w.wakes == a.wakes;
                    // The head looks again when the holder's time is up (it may have
                    // died); the others are woken in turn, or look again after
                    // idle_recheck_ms.
                    let quiet_ms = match rank {
                        Some(r) if r > 0 => left_ms.map(|l| l.max(idle)),
                        _ => left_ms,
                    };
                    w.quiet = (a.covered && live && fresh)
                        .then_some(())
                        .and(quiet_ms)
                        .map(|ms| Quiet {
                            epoch: a.epoch,
                            until: a.sent_at.saturating_add(ms.saturating_mul(MS)),
                        });
                } else {
                    // The lease gave up while this attempt was queueing it.
                    self.send_leave(&a.name, a.token, now);
                }
                AcquireResult::HeldByOther {
                    retry_after_ms: left_ms,
                }
            }
            None => AcquireResult::TransportError,
        }
    }

    /// Fires the standbys and the rechecks that are due.
    pub(super) fn fire_standbys(&mut self, core: &mut Client, now: u64) {
        if self.standbys > 0 {
            let due: Vec<LockName> = self
                .names
                .iter()
                .filter(|(_, s)| s.standby_until <= now)
                .map(|(n, _)| n.clone())
                .collect();
            for name in due {
                let lease = self.names.get(&name).and_then(|s| s.standby_lease);
                self.disarm(&name);
                self.counters.standby_takeovers += 1;
                self.wake_lease(core, &name, lease);
            }
        }
        if self.rechecks > 0 {
            let due: Vec<LockName> = self
                .names
                .iter()
                .filter(|(_, s)| s.recheck_at <= now)
                .map(|(n, _)| n.clone())
                .collect();
            for name in due {
                let lease = self.names.get(&name).and_then(|s| s.recheck_lease);
                self.clear_recheck(&name);
                if let Some(l) = lease.filter(|l| self.leases.contains_key(l)) {
                    self.wake_lease(core, &name, Some(l));
                }
            }
        }
    }

    /// A pub/sub message. Anything not on this object's wake channel, and malformed
    /// payloads, are counted and ignored; duplicates are harmless.
    pub fn handle_message(&mut self, core: &mut Client, now: u64, channel: &[u8], payload: &[u8]) {
        core.handle_timeout(now);
        let now = core.now();
        let msg = if self.opts.sharded_wake {
            // Every client waiting on the name hears every notice: only a name this client
            // watches, on that name's own channel, counts.
            parse_message(payload).filter(|m| {
                self.shards.contains_key(m.name) && shard_channel_name(channel) == Some(m.name)
            })
        } else if channel == self.wake.as_slice() {
            parse_message(payload)
        } else {
            None
        };
        let Some(msg) = msg else {
            self.counters.ignored_messages += 1;
            self.pump(core);
            return;
        };
        match msg.kind {
            scripts::MSG_WAKE => {
                self.disarm(msg.name);
                self.clear_recheck(msg.name);
                let lease = self.lease_for(msg.token, msg.name);
                // Sharded: a wake-up naming no lease of ours is another client's turn.
                if lease.is_some() || !self.opts.sharded_wake {
                    self.counters.wakeups += 1;
                    self.wake_lease(core, msg.name, lease);
                }
            }
            scripts::MSG_STANDBY => {
                let delay = self
                    .opts
                    .standby_delay_ms
                    .saturating_mul(MS)
                    .saturating_mul(u64::from(msg.rank));
                let lease = self.lease_for(msg.token, msg.name);
                let ours = lease.is_some() || !self.opts.sharded_wake;
                if let Some(s) = self.names.get_mut(msg.name).filter(|_| ours) {
                    if s.standby_until == NEVER {
                        self.standbys += 1;
                    }
                    // One standby per name is enough here (this client's standbys live or
                    // die together); the earliest one names the lease to wake.
                    let at = now.saturating_add(delay);
                    if at < s.standby_until || s.standby_lease.is_none() {
                        s.standby_lease = lease.or(s.standby_lease);
                    }
                    s.standby_until = s.standby_until.min(at);
                }
            }
            scripts::MSG_GRANTED => {
                self.disarm(msg.name);
                // Only the entry's own lease looks again (sharded: every client hears it).
                if let Some(lease) = self.lease_for(msg.token, msg.name) {
                    let at = now.saturating_add(msg.ttl_ms.saturating_mul(MS));
                    if let Some(s) = self.names.get_mut(msg.name) {
                        if s.recheck_at == NEVER {
                            self.rechecks += 1;
                        }
                        if at < s.recheck_at {
                            s.recheck_at = at;
                            s.recheck_lease = Some(lease);
                        }
                    }
                }
            }
            _ => self.disarm(msg.name),
        }
        self.pump(core);
    }

    pub(super) fn on_event(&mut self, ev: &Event, now: u64) {
        match *ev {
            Event::Acquired { lease, .. } => {
                // The granting ACQUIRE removed the entry.
                if let Some(w) = self.leave(lease) {
                    self.held.insert(lease, w.token);
                }
            }
            Event::AcquireFailed { lease, .. } => {
                if let Some(w) = self.leave(lease) {
                    self.tokens.remove(&w.token);
                    if w.queued {
                        self.send_leave(&w.name, w.token, now);
                    }
                }
            }
            Event::Lost { lease, .. } | Event::Released { lease } => {
                // Terminal (one per lease): its token names nobody any more.
                if let Some(w) = self.leave(lease) {
                    self.tokens.remove(&w.token);
                }
                if let Some(token) = self.held.remove(&lease) {
                    self.tokens.remove(&token);
                }
            }
            Event::Renewed { .. } | Event::ReleaseOutcome { .. } => {}
        }
    }

    /// Registers an acquiring lease (idempotent); the name's current epoch.
    pub(super) fn enter(&mut self, lease: LeaseId, name: &LockName, token: Token) -> u64 {
        if let std::collections::hash_map::Entry::Vacant(v) = self.leases.entry(lease) {
            v.insert(Waiting {
                name: name.clone(),
                token,
                queued: false,
                quiet: None,
                wakes: 0,
            });
            self.tokens.insert(token, (lease, name.clone()));
            let fresh = self.epochs + 1;
            let s = self.names.entry(name.clone()).or_insert(NameState {
                epoch: fresh,
                leases: 0,
                standby_until: NEVER,
                standby_lease: None,
                recheck_at: NEVER,
                recheck_lease: None,
            });
            if s.epoch == fresh {
                self.epochs = fresh;
            }
            s.leases += 1;
            return s.epoch;
        }
        self.names.get(name).map_or(0, |s| s.epoch)
    }

    pub(super) fn leave(&mut self, lease: LeaseId) -> Option<Waiting> {
        let w = self.leases.remove(&lease)?;
        let last = self.names.get_mut(&w.name).is_some_and(|s| {
            s.leases = s.leases.saturating_sub(1);
            s.leases == 0
        });
        // The name goes, and its standby and recheck with it (as `disarm`, `clear_recheck`).
        if let Some(s) = last.then(|| self.names.remove(&w.name)).flatten() {
            self.standbys -= usize::from(s.standby_until != NEVER);
            self.rechecks -= usize::from(s.recheck_at != NEVER);
        }
        Some(w)
    }

    pub(super) fn disarm(&mut self, name: &str) {
        if let Some(s) = self.names.get_mut(name) {
            if s.standby_until != NEVER {
                s.standby_until = NEVER;
                self.standbys -= 1;
            }
            s.standby_lease = None;
        }
    }

    pub(super) fn clear_recheck(&mut self, name: &str) {
        if let Some(s) = self.names.get_mut(name) {
            if s.recheck_at != NEVER {
                s.recheck_at = NEVER;
                self.rechecks -= 1;
            }
            s.recheck_lease = None;
        }
    }

    pub(super) fn bump(&mut self, name: &str) {
        if let Some(s) = self.names.get_mut(name) {
            self.epochs += 1;
            s.epoch = self.epochs;
        }
    }

    pub(super) fn bump_all(&mut self) {
        for s in self.names.values_mut() {
            self.epochs += 1;
            s.epoch = self.epochs;
        }
    }

    /// Something may have freed `name`: queued refusals are out of date, and one local waiter
    /// tries now.
    pub(super) fn wake_name(&mut self, core: &mut Client, name: &str) {
        self.bump(name);
        let now = core.now();
        let _ = core.handle_released(now, name);
    }

    /// The acquiring lease of this object that a message's token names, if it waits for
    /// `name`.
    pub(super) fn lease_for(&self, token: Option<Token>, name: &str) -> Option<LeaseId> {
        let (lease, of) = self.tokens.get(&token?)?;
        (**of == *name).then_some(*lease)
    }

    /// `name` may be free and it is `lease`'s turn (its queue entry was popped or stood by):
    /// that lease tries now. If it holds the lock already (a retry of its own won, or the
    /// message is a duplicate) there is nothing to do. A wake-up for a lease that no longer
    /// waits here (it gave up or ended, or the token is not ours) goes to the next local
    /// waiter of the name instead, so it is never lost for the others; with none, the
    /// standbys cover it.
    /// Only that lease's queued refusal goes out of date: the other local waiters' entries
    /// are still queued, so they stay quiet (one script call per handoff, not one per local
    /// waiter).
    pub(super) fn wake_lease(&mut self, core: &mut Client, name: &str, lease: Option<LeaseId>) {
        let now = core.now();
        if let Some(l) = lease {
            if let Some(w) = self.leases.get_mut(&l) {
                w.quiet = None;
                w.wakes = w.wakes.wrapping_add(1);
            }
            if core.handle_wake(now, l) == Ok(true)
                || core.lease_state(l) == Ok(crate::LeaseState::Held)
            {
                return;
            }
        }
        self.bump(name);
        let _ = core.handle_released(now, name);
    }

    fn send_leave(&mut self, name: &LockName, token: Token, now: u64) {
        let Ok([lock, queue]) = scripts::keys_of(name.as_str(), [KeyKind::Lock, KeyKind::Queue])
        else {
            return;
        };
        let mut args = vec![
            Arg::Static(b"EVALSHA"),
            Arg::Static(&self.shas[3]),
            Arg::Static(b"2"),
            lock,
            queue,
            Arg::concat(&[&self.wake, b"#", &token.to_hex()]),
            Arg::copy(name.as_bytes()),
        ];
        if self.opts.sharded_wake {
            args.extend(scripts::shard_channel_arg(name).ok());
        }
        self.push(
            Op::Leave,
            Connection::Commands,
            Some(Script::Leave),
            args,
            now,
            now.saturating_add(60_000 * MS),
        );
    }
}
