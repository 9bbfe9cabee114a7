//! The pooled etcd lease: what binds a lock's key to the cluster's clock.
//!
//! Keys are bound to an etcd lease shared by the client's locks of one TTL (in whole seconds,
//! rounded up): granted when the first of them needs it, kept alive by their renewals (and
//! by the protocol while one of them waits), as etcd's `concurrency.Session` shares one lease
//! between its mutexes. Locks of different TTLs get different etcd leases, so a dead client's
//! lock is still freed at most its own TTL after its last renewal. Since every lock of the
//! lease renews it, each lock's validity is still counted from its own acquire or renewal:
//! a grant is reported to the engine only once a keep-alive (or the grant) *sent at or after
//! the acquire* found the etcd lease alive — usually the keep-alive that goes out beside the
//! transaction. When a keep-alive finds the lease gone, every lock bound to it is lost at once
//! ([`Client::handle_revoked`]) and every waiter bound to it rejoins with a fresh lease.
//!
//! A key whose deletion cannot be confirmed (a delete lost in transport, an acquire
//! transaction with an unknown outcome for a lease that ended) might stay bound to the pooled
//! lease while other locks keep that lease alive. Such a lease is **retired**: new acquires
//! get a fresh one, and it is revoked as soon as no live lock is bound to it.

use serde_json::{Value, json};

use super::json::{self, ReplyError};
use super::waiting::Holder;
use super::{EtcdProtocol, MS, NEVER, Op, RequestKind, paths, queue_key};
use crate::{AcquireResult, Client, LeaseId, LockName, RenewResult, RequestId, Token};

/// gRPC code etcd answers for a lease that does not exist (expired or revoked).
pub(super) const CODE_NOT_FOUND: i64 = 5;

/// One etcd lease of this client, shared by the locks bound to it.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) secs: u64,
    /// Send time of the latest grant or keep-alive that found it alive.
    pub(super) alive_at: u64,
    /// Send time of the latest grant or keep-alive.
    pub(super) last_sent: u64,
    /// Keep-alives in flight: (request id, send time).
    pub(super) in_flight: Vec<(u64, u64)>,
    /// May carry a key nobody owns: no new acquire, revoked once no live lock is bound.
    pub(super) retired: bool,
}

/// The pooled lease of one TTL.
#[derive(Debug, Default)]
pub(super) struct Pool {
    pub(super) lease: Option<i64>,
    granting: bool,
    /// Leases waiting for the grant, in the order they asked.
    parked: Vec<LeaseId>,
}

/// A transaction that found our key first, waiting for a keep-alive sent at or after the
/// acquire (`since`) to find the etcd lease alive before it becomes a grant.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dating {
    pub(super) req: RequestId,
    pub(super) fence: i64,
    pub(super) since: u64,
}

/// How much of a lock's TTL a grant may lose to the age of the pooled lease's last
/// keep-alive rather than wait for a fresh one: 1% of the TTL (the engine's default drift
/// allowance is of the same order).
pub(super) fn shortfall_allowance_ns(ttl_ms: u64) -> u64 {
    ttl_ms.saturating_mul(MS) / 100
}

/// A waiting lease's keep-alive cadence: a third of its TTL, as the engine renews.
pub(super) fn keepalive_interval(ttl_ms: u64) -> u64 {
    (ttl_ms.max(3) / 3).saturating_mul(MS)
}

impl EtcdProtocol {
    /// The engine's acquire: the lease's transaction on the etcd lease its key may be on,
    /// a woken waiter's lookup, or a place in the pool's queue for a (fresh) pooled lease.
    pub(super) fn on_acquire(
        &mut self,
        lease: LeaseId,
        request: RequestId,
        name: LockName,
        token: &Token,
        ttl_ms: u64,
        now: u64,
    ) {
        let h = self.holders.entry(lease).or_insert_with(|| Holder {
            key: queue_key(&name, token),
            name,
            ttl_ms,
            secs: ttl_ms.div_ceil(1000).max(1),
            etcd_lease: None,
            parked: None,
            since: now,
            dating: None,
            own_rev: 0,
            watch: None,
            lookup_in_flight: false,
            waiting: false,
            txns: 0,
            txn_unknown: false,
            deleting: false,
            recheck_at: NEVER,
            ended: false,
            forget_at: NEVER,
        });
        h.recheck_at = NEVER;
        h.since = now;
        h.dating = None;
        let secs = h.secs;
        // A lease whose key may be on an etcd lease keeps asking with that one; a woken
        // waiter whose key is known only checks that no key is before it.
        if let Some(id) = h.etcd_lease.filter(|id| self.shared.contains_key(id)) {
            if h.waiting && h.own_rev > 0 {
                let ttl_ms = h.ttl_ms;
                self.send_lookup(lease, now, Some(request));
                if self.is_stale(id, now, ttl_ms) {
                    self.send_keepalive(id, None, now);
                }
            } else {
                self.send_txn(lease, request, now);
            }
            return;
        }
        h.etcd_lease = None;
        let pool = self.pools.entry(secs).or_default();
        if let Some(id) = pool.lease {
            // Reused while it is surely alive; an idle one may have lapsed.
            let fresh = self.shared.get(&id).is_some_and(|s| {
                !s.retired
                    && now
                        < s.alive_at
                            .saturating_add(s.secs.saturating_mul(1_000 * MS) / 2)
            });
            if fresh {
                if let Some(h) = self.holders.get_mut(&lease) {
                    h.etcd_lease = Some(id);
                }
                self.send_txn(lease, request, now);
                return;
            }
            pool.lease = None;
            self.drop_if_idle(id, now);
        }
        let Some(h) = self.holders.get_mut(&lease) else {
            return;
        };
        h.parked = Some(request);
        let pool = self.pools.entry(secs).or_default();
        pool.parked.retain(|l| *l != lease);
        pool.parked.push(lease);
        if !pool.granting {
            pool.granting = true;
            self.counters.leases_granted += 1;
            self.push(
                Op::Grant { secs, sent: now },
                RequestKind::Unary,
                paths::LEASE_GRANT,
                json!({ "TTL": secs.to_string() }),
                now,
            );
        }
    }

    pub(super) fn send_keepalive(
        &mut self,
        id: i64,
        renew: Option<(LeaseId, RequestId)>,
        now: u64,
    ) {
        let rid = self.push(
            Op::KeepAlive {
                etcd_lease: id,
                renew,
                sent: now,
            },
            RequestKind::Unary,
            paths::LEASE_KEEPALIVE,
            json!({ "ID": id.to_string() }),
            now,
        );
        if let Some(s) = self.shared.get_mut(&id) {
            s.last_sent = s.last_sent.max(now);
            s.in_flight.push((rid, now));
        }
    }

    /// A waiter's key lives on the pooled lease: keeps it alive while anyone waits on it.
    pub(super) fn keep_waiters_alive(&mut self, now: u64) {
        let mut keep: Vec<i64> = self
            .holders
            .values()
            .filter(|h| !h.ended && h.waiting)
            .filter_map(|h| h.etcd_lease)
            .collect();
        keep.sort_unstable();
        keep.dedup();
        for id in keep {
            let due = self.shared.get(&id).is_some_and(|s| {
                s.in_flight.is_empty()
                    && s.last_sent
                        .saturating_add(keepalive_interval(s.secs.saturating_mul(1000)))
                        <= now
            });
            if due {
                self.counters.waiting_keepalives += 1;
                self.send_keepalive(id, None, now);
            }
        }
    }

    /// Whether an acquire sent at `since` should send a keep-alive to date its grant.
    pub(super) fn is_stale(&self, id: i64, since: u64, ttl_ms: u64) -> bool {
        let old = self
            .shared
            .get(&id)
            .is_some_and(|s| since.saturating_sub(s.alive_at) > shortfall_allowance_ns(ttl_ms) / 2);
        old && !self.is_dated(id, since)
    }

    /// Whether a grant or keep-alive sent at or after `since` found `id` alive, or is out.
    pub(super) fn is_dated(&self, id: i64, since: u64) -> bool {
        self.shared
            .get(&id)
            .is_some_and(|s| s.alive_at >= since || s.in_flight.iter().any(|&(_, t)| t >= since))
    }

    /// Our key is first: the lock is ours for as long as the server surely keeps the etcd
    /// lease, counted from the acquire (`since`), as the engine counts it. That is the whole
    /// TTL once a keep-alive sent since the acquire found it alive; before that, the lease
    /// is surely kept until its last good keep-alive's send time plus its TTL, and a grant
    /// whose TTL that shortens by at most [`shortfall_allowance_ns`] is reported at once with
    /// the shorter TTL. Otherwise the grant waits for a keep-alive.
    pub(super) fn grant_when_dated(
        &mut self,
        core: &mut Client,
        now: u64,
        lease: LeaseId,
        d: Dating,
    ) {
        let Some(h) = self.holders.get_mut(&lease) else {
            return;
        };
        let Some(id) = h.etcd_lease else {
            let _ = core.handle_acquire_result(now, d.req, AcquireResult::TransportError);
            return;
        };
        let surely_ms = self.shared.get(&id).map(|s| {
            if s.alive_at >= d.since {
                u64::MAX
            } else {
                let until = s.alive_at.saturating_add(s.secs.saturating_mul(1_000 * MS));
                until.saturating_sub(d.since) / MS
            }
        });
        match surely_ms {
            Some(ms)
                if h.ttl_ms.saturating_sub(ms).saturating_mul(MS)
                    <= shortfall_allowance_ns(h.ttl_ms) =>
            {
                let data = id.to_string();
                let ttl_ms = h.ttl_ms.min(ms);
                h.dating = None;
                let _ = core.handle_acquire_result(
                    now,
                    d.req,
                    AcquireResult::Granted {
                        fencing_token: d.fence as u64,
                        ttl_ms,
                        backend_data: data.as_bytes(),
                    },
                );
            }
            Some(_) => {
                h.dating = Some(d);
                if !self.is_dated(id, d.since) {
                    self.send_keepalive(id, None, now);
                }
            }
            None => {
                h.dating = None;
                let _ = core.handle_acquire_result(now, d.req, AcquireResult::TransportError);
            }
        }
    }

    /// A keep-alive or a transaction says etcd lease `id` is gone: every lock bound to it is
    /// lost (each exactly once: the engine ignores a second loss), every waiter rejoins.
    pub(super) fn lease_gone(&mut self, core: &mut Client, now: u64, id: i64) {
        self.shared.remove(&id);
        for pool in self.pools.values_mut() {
            if pool.lease == Some(id) {
                pool.lease = None;
            }
        }
        let bound: Vec<LeaseId> = self
            .holders
            .iter()
            .filter(|(_, h)| h.etcd_lease == Some(id))
            .map(|(l, _)| *l)
            .collect();
        for lease in bound {
            let Some(h) = self.holders.get_mut(&lease) else {
                continue;
            };
            let was_waiting = h.waiting;
            h.forget_lease();
            if h.ended {
                continue;
            }
            if let Some(d) = h.dating.take() {
                let _ = core.handle_acquire_result(now, d.req, AcquireResult::TransportError);
            } else if core.handle_revoked(now, lease).unwrap_or(false) {
                // Lost; its Lost event comes out of the engine.
            } else if let Some(h) = self.holders.get_mut(&lease) {
                if was_waiting {
                    // A waiter: its queue entry went with the lease; rejoin at the end.
                    self.counters.waiters_expired += 1;
                    if let Some((w, _)) = h.watch.take() {
                        self.out.take(w);
                        self.cancels.push_back(w);
                    }
                    h.lookup_in_flight = false;
                    h.recheck_at = now;
                }
            }
        }
    }

    /// A key of `id` may be left without an owner: no new acquire uses `id`, and it is
    /// revoked once no live lock is bound to it.
    pub(super) fn retire(&mut self, id: i64, now: u64) {
        let Some(s) = self.shared.get_mut(&id) else {
            return;
        };
        s.retired = true;
        for pool in self.pools.values_mut() {
            if pool.lease == Some(id) {
                pool.lease = None;
            }
        }
        self.drop_if_idle(id, now);
    }

    /// Forgets pooled lease `id` if nothing is bound to it: a retired one is revoked (it may
    /// carry a stray key), another is left to expire (it carries none).
    pub(super) fn drop_if_idle(&mut self, id: i64, now: u64) {
        let Some(s) = self.shared.get(&id) else {
            return;
        };
        let in_pool = self.pools.values().any(|p| p.lease == Some(id));
        let bound = self
            .holders
            .values()
            .any(|h| h.etcd_lease == Some(id) && (!h.ended || h.deleting || h.txns > 0));
        if bound {
            return;
        }
        if s.retired {
            self.shared.remove(&id);
            self.push(
                Op::Revoke,
                RequestKind::Unary,
                paths::LEASE_REVOKE,
                json!({ "ID": id.to_string() }),
                now,
            );
        } else if !in_pool && s.in_flight.is_empty() {
            self.shared.remove(&id);
        }
    }

    /// A pooled lease not kept alive for its TTL may have expired: the next acquire takes a
    /// fresh one.
    pub(super) fn forget_lapsed(&mut self, now: u64) {
        let lapsed: Vec<i64> = self
            .shared
            .iter()
            .filter(|(_, s)| s.alive_at.saturating_add(s.secs.saturating_mul(1_000 * MS)) <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in lapsed {
            for pool in self.pools.values_mut() {
                if pool.lease == Some(id) {
                    pool.lease = None;
                }
            }
            self.drop_if_idle(id, now);
        }
    }

    /// The answer to a pool's `lease/grant`: its parked acquires send their transactions on
    /// the new lease, or fail.
    pub(super) fn on_grant(
        &mut self,
        core: &mut Client,
        now: u64,
        secs: u64,
        sent: u64,
        reply: Result<Value, ReplyError>,
    ) {
        let granted = self.read(reply, json::read_grant);
        let pool = self.pools.entry(secs).or_default();
        pool.granting = false;
        let order = std::mem::take(&mut pool.parked);
        let parked: Vec<(LeaseId, RequestId)> = order
            .into_iter()
            .filter_map(|l| {
                let h = self.holders.get_mut(&l)?;
                h.parked.take().map(|r| (l, r))
            })
            .collect();
        match granted {
            Ok((id, ttl_s)) => {
                if let Some(old) = pool.lease.replace(id) {
                    self.drop_if_idle(old, now);
                }
                self.shared.insert(
                    id,
                    Shared {
                        secs: ttl_s.min(secs).max(1),
                        alive_at: sent,
                        last_sent: sent,
                        in_flight: Vec::new(),
                        retired: false,
                    },
                );
                for (lease, req) in parked {
                    let Some(h) = self.holders.get_mut(&lease) else {
                        continue;
                    };
                    if h.ended {
                        continue;
                    }
                    h.etcd_lease = Some(id);
                    h.ttl_ms = h.ttl_ms.min(ttl_s.saturating_mul(1000).max(1));
                    self.send_txn(lease, req, now);
                }
            }
            Err(e) => {
                // A transport failure's own text (from the host) is already noted.
                if !matches!(e, ReplyError::Transport) {
                    self.note_reply_error("lease grant", &e);
                }
                for (_, req) in parked {
                    let _ = core.handle_acquire_result(now, req, AcquireResult::TransportError);
                }
            }
        }
    }

    /// The answer to a keep-alive: a renewal's result, the lease's date for grants waiting
    /// for one, or the loss of everything bound to a lease that is gone.
    pub(super) fn on_keepalive(
        &mut self,
        core: &mut Client,
        now: u64,
        id: i64,
        renew: Option<(LeaseId, RequestId)>,
        sent: u64,
        reply: Result<Value, ReplyError>,
    ) {
        let read = self.read(reply, json::read_keepalive);
        let alive = match &read {
            Ok(ttl) => Some(*ttl > 0),
            Err(e) if e.code() == Some(CODE_NOT_FOUND) => Some(false),
            Err(_) => None,
        };
        if let Some(s) = self.shared.get_mut(&id) {
            s.in_flight.retain(|&(_, t)| t != sent);
            if alive == Some(true) {
                s.alive_at = s.alive_at.max(sent);
            }
        }
        if let Some((_, req)) = renew {
            let result = match alive {
                Some(true) => RenewResult::Renewed,
                Some(false) => RenewResult::Rejected,
                None => RenewResult::TransportError,
            };
            let _ = core.handle_renew_result(now, req, result);
        }
        if alive == Some(false) {
            self.lease_gone(core, now, id);
            return;
        }
        // Grants waiting for a keep-alive of this lease: dated now, or not by this one.
        let dating: Vec<(LeaseId, Dating)> = self
            .holders
            .iter()
            .filter(|(_, h)| h.etcd_lease == Some(id) && !h.ended)
            .filter_map(|(l, h)| h.dating.map(|d| (*l, d)))
            .collect();
        for (lease, d) in dating {
            if alive == Some(true) && sent >= d.since {
                self.grant_when_dated(core, now, lease, d);
            } else if alive.is_none() && !self.is_dated(id, d.since) {
                // Not confirmed: the engine asks again (idempotent for our token).
                if let Some(h) = self.holders.get_mut(&lease) {
                    h.dating = None;
                }
                let _ = core.handle_acquire_result(now, d.req, AcquireResult::TransportError);
            }
        }
        self.drop_if_idle(id, now);
    }
}
