//! FIFO waiting: a lease joins its name's queue with a key of its own and waits for the keys
//! before it to go.
//!
//! The acquire transaction creates the lease's key (or finds it: retries are idempotent) and
//! reads the queue's first key. A lease that is not first looks up its predecessor (the key
//! just before its own in create order) and opens a watch on that key alone
//! ([`RequestKind::Watch`]: a streaming `POST /v3/watch` the host keeps open, passing each
//! streamed JSON message to [`EtcdProtocol::handle_watch_message`]). When that key is deleted
//! — released, or its lease expired because its owner died — the waiter is woken and asks
//! again: a release wakes exactly one waiter, in FIFO order (the ZooKeeper recipe). While it
//! waits the protocol keeps the pooled lease alive (`pool.rs`); if that lease is lost, the
//! waiter rejoins at the end of the queue. A waiter that gives up deletes its key, so it
//! never blocks the queue.

use serde_json::{Value, json};

use super::json::{self, ReplyError};
use super::pool::{CODE_NOT_FOUND, Dating, Shared};
use super::{
    EtcdProtocol, FORGET_AFTER_NS, MS, NEVER, Op, RequestKind, paths, prefix_end, queue_prefix,
};
use crate::{AcquireResult, Client, LeaseId, LockName, RequestId};

/// After a failed watch or predecessor lookup, how long before the waiter is woken to retry.
const REWATCH_AFTER_NS: u64 = 200 * MS;

/// What the protocol knows of one engine lease.
#[derive(Debug)]
pub(super) struct Holder {
    pub(super) name: LockName,
    pub(super) key: Vec<u8>,
    pub(super) ttl_ms: u64,
    /// The pool this lease draws from: its TTL in whole seconds.
    pub(super) secs: u64,
    pub(super) etcd_lease: Option<i64>,
    /// The acquire waiting for the pool's grant.
    pub(super) parked: Option<RequestId>,
    /// When the engine sent the current acquire (its validity counts from there).
    pub(super) since: u64,
    pub(super) dating: Option<Dating>,
    /// Our key's create revision, once read.
    pub(super) own_rev: i64,
    /// The open watch (request id) and the key it watches.
    pub(super) watch: Option<(u64, Vec<u8>)>,
    pub(super) lookup_in_flight: bool,
    pub(super) waiting: bool,
    /// Acquire transactions in flight.
    pub(super) txns: u32,
    /// A transaction failed without an answer since the last one answered: our key may be
    /// on the server or not.
    pub(super) txn_unknown: bool,
    /// A delete of our key is in flight.
    pub(super) deleting: bool,
    /// When a waiter without a live watch is woken to retry.
    pub(super) recheck_at: u64,
    pub(super) ended: bool,
    pub(super) forget_at: u64,
}

impl Holder {
    /// The etcd lease it was bound to is gone, and its key with it.
    pub(super) fn forget_lease(&mut self) {
        self.etcd_lease = None;
        self.own_rev = 0;
        self.waiting = false;
    }
}

impl EtcdProtocol {
    /// The acquire transaction: put our key with the pooled lease unless it exists, read it
    /// and the queue's first key.
    pub(super) fn send_txn(&mut self, lease: LeaseId, req: RequestId, now: u64) {
        let Some(h) = self.holders.get_mut(&lease) else {
            return;
        };
        let Some(etcd_lease) = h.etcd_lease else {
            return;
        };
        h.txns += 1;
        let since = h.since;
        let ttl_ms = h.ttl_ms;
        let key = json::b64(&h.key);
        let prefix = queue_prefix(&h.name);
        let first = json!({ "request_range": {
            "key": json::b64(&prefix),
            "range_end": json::b64(&prefix_end(&prefix)),
            "sort_order": "ASCEND",
            "sort_target": "CREATE",
            "limit": "1",
            "keys_only": true,
        }});
        let own = json!({ "request_range": { "key": key } });
        let token_hex = h
            .key
            .get(h.key.len().saturating_sub(32)..)
            .unwrap_or_default();
        let body = json!({
            "compare": [{ "target": "CREATE", "key": key, "result": "EQUAL", "create_revision": "0" }],
            "success": [
                { "request_put": { "key": key, "value": json::b64(token_hex), "lease": etcd_lease.to_string() } },
                own,
                first,
            ],
            "failure": [own, first],
        });
        self.counters.txns += 1;
        self.push(
            Op::Txn { lease, req },
            RequestKind::Unary,
            paths::KV_TXN,
            body,
            now,
        );
        // The grant is dated by the lease's last keep-alive (see `grant_when_dated`): one
        // beside the transaction (not a Raft write) keeps that date within half the
        // allowance of the acquire, so a busy client rarely waits for one.
        if self.is_stale(etcd_lease, since, ttl_ms) {
            self.send_keepalive(etcd_lease, None, now);
        }
    }

    /// The attempt is refused while the lease waits in the queue. The watch wakes it; the
    /// TTL hint only bounds the sleep if the watch cannot. Pumped at once, so a waiter that
    /// gave up on this refusal is seen before it is given a predecessor to watch.
    fn refused_to_wait(&mut self, core: &mut Client, now: u64, req: RequestId, ttl_ms: u64) {
        let _ = core.handle_acquire_result(
            now,
            req,
            AcquireResult::HeldByOther {
                retry_after_ms: Some(ttl_ms),
            },
        );
        self.pump(core);
    }

    /// `lease`'s key is the first of its queue: the lock is its own. Its watch stops, and the
    /// grant is reported once dated.
    fn own_first(
        &mut self,
        core: &mut Client,
        now: u64,
        lease: LeaseId,
        req: RequestId,
        fence: i64,
    ) {
        let Some(h) = self.holders.get_mut(&lease) else {
            return;
        };
        h.waiting = false;
        h.recheck_at = NEVER;
        let since = h.since;
        if let Some((w, _)) = h.watch.take() {
            self.out.take(w);
            self.cancels.push_back(w);
        }
        self.grant_when_dated(core, now, lease, Dating { req, fence, since });
    }

    /// The answer to the acquire transaction: first (a grant once dated), queued behind
    /// another key (refused; the lease waits), or unknown.
    pub(super) fn on_txn(
        &mut self,
        core: &mut Client,
        now: u64,
        lease: LeaseId,
        req: RequestId,
        reply: Result<Value, ReplyError>,
    ) {
        let read = self.read(reply, json::read_txn);
        let Some(h) = self.holders.get_mut(&lease) else {
            let _ = core.handle_acquire_result(now, req, AcquireResult::TransportError);
            return;
        };
        h.txns = h.txns.saturating_sub(1);
        let answered = matches!(&read, Ok(t) if t.own_key.as_deref() == Some(&h.key[..]) && t.first_key.is_some());
        if h.ended {
            // Wanted by nobody: remove our key ourselves (the engine has no grant to release),
            // or retire the lease it may be on if the outcome is unknown.
            let id = h.etcd_lease;
            match &read {
                Ok(t) if t.own_key.as_deref() == Some(&h.key[..]) => {
                    if !h.deleting {
                        h.deleting = true;
                        let key = json::b64(&h.key);
                        self.push(
                            Op::Delete { lease, req: None },
                            RequestKind::Unary,
                            paths::KV_DELETE,
                            json!({ "key": key }),
                            now,
                        );
                    }
                }
                Ok(_) => {}
                Err(e) if e.code() == Some(CODE_NOT_FOUND) => {}
                Err(_) => {
                    if let Some(id) = id {
                        self.retire(id, now);
                    }
                }
            }
            if let Some(id) = id {
                self.drop_if_idle(id, now);
            }
            let _ = core.handle_acquire_result(
                now,
                req,
                AcquireResult::HeldByOther {
                    retry_after_ms: None,
                },
            );
            return;
        }
        let t = match read {
            Ok(t) if answered => t,
            Ok(_) => {
                h.txn_unknown = true;
                self.garbage("acquire: the transaction did not return our key and the first");
                let _ = core.handle_acquire_result(now, req, AcquireResult::TransportError);
                return;
            }
            Err(e) => {
                if e.code() == Some(CODE_NOT_FOUND) {
                    // Our etcd lease is gone (it expired): so is everything bound to it.
                    if let Some(id) = h.etcd_lease {
                        let _ = core.handle_acquire_result(now, req, AcquireResult::TransportError);
                        self.lease_gone(core, now, id);
                        return;
                    }
                } else {
                    h.txn_unknown = true;
                }
                let _ = core.handle_acquire_result(now, req, AcquireResult::TransportError);
                return;
            }
        };
        h.txn_unknown = false;
        if t.own_lease != 0 && Some(t.own_lease) != h.etcd_lease {
            // Our token's key, bound to an earlier etcd lease of ours: adopt it.
            let secs = h.secs;
            h.etcd_lease = Some(t.own_lease);
            self.shared.entry(t.own_lease).or_insert(Shared {
                secs,
                alive_at: 0,
                last_sent: 0,
                in_flight: Vec::new(),
                retired: true,
            });
        }
        let Some(h) = self.holders.get_mut(&lease) else {
            return;
        };
        h.own_rev = t.own_rev;
        if t.first_key.as_deref() == Some(&h.key[..]) {
            self.own_first(core, now, lease, req, t.own_rev);
            return;
        }
        h.waiting = true;
        let ttl_ms = h.ttl_ms;
        self.refused_to_wait(core, now, req, ttl_ms);
        if let Some(h) = self.holders.get_mut(&lease) {
            if h.waiting && !h.ended && h.watch.is_none() && !h.lookup_in_flight {
                h.lookup_in_flight = true;
                self.send_lookup(lease, now, None);
            }
        }
    }

    /// The answer to a predecessor lookup: a waiter's (watch that key, or ask again at once
    /// if there is none) or a woken waiter's acquire (first: ours; else wait again).
    pub(super) fn on_predecessor(
        &mut self,
        core: &mut Client,
        now: u64,
        lease: LeaseId,
        req: Option<RequestId>,
        reply: Result<Value, ReplyError>,
    ) {
        let read = self.read(reply, json::read_first);
        let Some(h) = self.holders.get_mut(&lease) else {
            if let Some(req) = req {
                let _ = core.handle_acquire_result(now, req, AcquireResult::TransportError);
            }
            return;
        };
        // A member behind our own key's revision may not show every key before it.
        let read = match read {
            Ok((_, revision)) if revision < h.own_rev => Err(ReplyError::Transport),
            r => r,
        };
        let Some(req) = req else {
            h.lookup_in_flight = false;
            if h.ended || !h.waiting {
                return;
            }
            match read {
                Ok((Some(key), revision)) => self.open_watch(lease, key, revision, now),
                // Nobody before us any more: ask again now.
                Ok((None, _)) => h.recheck_at = now,
                Err(_) => h.recheck_at = now.saturating_add(REWATCH_AFTER_NS),
            }
            return;
        };
        if h.ended {
            let _ = core.handle_acquire_result(
                now,
                req,
                AcquireResult::HeldByOther {
                    retry_after_ms: None,
                },
            );
            return;
        }
        match read {
            Ok((None, _)) => {
                // Nobody before us as this member sees it; the transaction decides, since it
                // reads our own key linearizably: a lookup cannot tell that our key itself is
                // gone (its etcd lease expired on the cluster while a stale member, such as
                // a leader resumed from a pause, answered).
                if h.etcd_lease.is_some() {
                    self.send_txn(lease, req, now);
                } else {
                    // The pooled lease went meanwhile: the engine asks again, and a new one
                    // is granted first.
                    let _ = core.handle_acquire_result(now, req, AcquireResult::TransportError);
                }
            }
            Ok((Some(key), revision)) => {
                let ttl_ms = h.ttl_ms;
                self.refused_to_wait(core, now, req, ttl_ms);
                let rewatch = self.holders.get(&lease).is_some_and(|h| {
                    h.waiting && !h.ended && h.watch.as_ref().is_none_or(|(_, k)| *k != key)
                });
                if rewatch {
                    if let Some((w, _)) = self.holders.get_mut(&lease).and_then(|h| h.watch.take())
                    {
                        self.out.take(w);
                        self.cancels.push_back(w);
                    }
                    self.open_watch(lease, key, revision, now);
                }
            }
            Err(_) => {
                // Ask with the transaction next time.
                h.own_rev = 0;
                let _ = core.handle_acquire_result(now, req, AcquireResult::TransportError);
            }
        }
    }

    /// Watches `key` (our predecessor, read at `revision`) for its deletion.
    fn open_watch(&mut self, lease: LeaseId, key: Vec<u8>, revision: i64, now: u64) {
        let body = json!({ "create_request": {
            "key": json::b64(&key),
            "start_revision": (revision + 1).to_string(),
        }});
        self.counters.watches += 1;
        let id = self.push(
            Op::Watch {
                lease,
                key: key.clone(),
            },
            RequestKind::Watch,
            paths::WATCH,
            body,
            now,
        );
        if let Some(h) = self.holders.get_mut(&lease) {
            h.watch = Some((id, key));
        }
    }

    /// Reads the youngest key older than ours. Serializable (the member answers from its
    /// own state, no Raft round): no key older than ours can be created after ours, so a
    /// member that has applied our key's revision cannot miss one that still exists; at
    /// worst it shows one already deleted, and the watch from its revision sees the delete.
    pub(super) fn send_lookup(&mut self, lease: LeaseId, now: u64, req: Option<RequestId>) {
        let Some(h) = self.holders.get(&lease) else {
            return;
        };
        let prefix = queue_prefix(&h.name);
        let body = json!({
            "key": json::b64(&prefix),
            "range_end": json::b64(&prefix_end(&prefix)),
            "sort_order": "DESCEND",
            "sort_target": "CREATE",
            "limit": "1",
            "keys_only": true,
            "serializable": true,
            "max_create_revision": (h.own_rev - 1).max(1).to_string(),
        });
        self.push(
            Op::Predecessor { lease, req },
            RequestKind::Unary,
            paths::KV_RANGE,
            body,
            now,
        );
    }

    /// Reads one watch message; returns whether the watch is over (woken or cancelled).
    pub(super) fn watch_message(
        &mut self,
        core: &mut Client,
        now: u64,
        id: u64,
        op: &Op,
        msg: &json::WatchMessage,
    ) -> bool {
        let Op::Watch { lease, key } = op else {
            return false;
        };
        let deleted = msg.deleted_keys.iter().any(|k| k == key);
        if !(deleted || msg.canceled) {
            return false;
        }
        if let Some(h) = self.holders.get_mut(lease) {
            if h.watch.as_ref().is_some_and(|(w, _)| *w == id) {
                h.watch = None;
                if h.waiting && !h.ended {
                    self.counters.wakeups += 1;
                    let _ = core.handle_wake(now, *lease);
                }
            }
        }
        self.cancels.push_back(id);
        true
    }

    /// A watch stream is over (woken, cut, failed): a waiter that still waits looks again.
    pub(super) fn watch_ended(&mut self, now: u64, id: u64, op: Op) {
        let Op::Watch { lease, .. } = op else {
            return;
        };
        if let Some(h) = self.holders.get_mut(&lease) {
            if h.watch.as_ref().is_some_and(|(w, _)| *w == id) {
                h.watch = None;
                if h.waiting && !h.ended {
                    h.recheck_at = h.recheck_at.min(now.saturating_add(REWATCH_AFTER_NS));
                }
            }
        }
    }

    /// Wakes the waiters whose re-check is due (no live watch, or nobody before them).
    pub(super) fn recheck_waiters(&mut self, core: &mut Client, now: u64) {
        let due: Vec<LeaseId> = self
            .holders
            .iter()
            .filter(|(_, h)| !h.ended && h.recheck_at <= now)
            .map(|(l, _)| *l)
            .collect();
        for lease in due {
            let Some(h) = self.holders.get_mut(&lease) else {
                continue;
            };
            if h.recheck_at <= now && !h.ended {
                h.recheck_at = NEVER;
                self.counters.wakeups += 1;
                // This lease, not the name's first local waiter: each watches its own place.
                let _ = core.handle_wake(now, lease);
                self.pump(core);
            }
        }
    }

    /// The engine lease ended. A waiter that gave up deletes its key here (the engine sends
    /// no release for a lock it never got); otherwise the engine's release does.
    pub(super) fn ended(&mut self, lease: LeaseId, now: u64, gave_up: bool) {
        let Some(h) = self.holders.get_mut(&lease) else {
            return;
        };
        h.ended = true;
        h.waiting = false;
        h.parked = None;
        h.dating = None;
        h.forget_at = now.saturating_add(FORGET_AFTER_NS);
        if let Some((w, _)) = h.watch.take() {
            self.out.take(w);
            self.cancels.push_back(w);
        }
        let id = h.etcd_lease;
        let unknown = h.txn_unknown;
        if gave_up && id.is_some() && (h.own_rev > 0 || unknown) && !h.deleting {
            h.deleting = true;
            let key = json::b64(&h.key);
            self.push(
                Op::Delete { lease, req: None },
                RequestKind::Unary,
                paths::KV_DELETE,
                json!({ "key": key }),
                now,
            );
        }
        if let Some(id) = id {
            if gave_up && unknown {
                // A transaction of ours may still land after the delete.
                self.retire(id, now);
            }
            self.drop_if_idle(id, now);
        }
    }
}
