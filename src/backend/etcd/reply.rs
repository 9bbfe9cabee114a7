//! What each reply means: the dispatch from a request's operation to the part that reads it
//! (`pool.rs`, `waiting.rs`, `auth.rs`), releases, and the two-step status query.
//!
//! Every reader goes through [`EtcdProtocol::read`]: a reply of the wrong shape is counted,
//! noted in `last_error`, and becomes an error for the caller — never a grant.

use serde_json::{Value, json};

use super::json::{self, ReplyError};
use super::{EtcdProtocol, Op, RequestKind, paths, prefix_end, queue_prefix};
use crate::backend::LockStatus;
use crate::{Client, ReleaseResult};

impl EtcdProtocol {
    /// Queues a status query for `name` (`leasehold status`): the queue's oldest key (the
    /// owner, whose create revision is the fence), then its lease's time to live. The answer
    /// comes out of [`Self::poll_status`] under the returned id. etcd keeps no record of
    /// past fences once the keys are gone, so `last_fencing_token` is the owner's.
    pub fn request_status(&mut self, now: u64, name: &str) -> Result<u64, crate::Error> {
        crate::validate_name(name)?;
        let prefix = queue_prefix(name);
        let body = json!({
            "key": json::b64(&prefix),
            "range_end": json::b64(&prefix_end(&prefix)),
            "sort_order": "ASCEND",
            "sort_target": "CREATE",
            "limit": "1",
            "keys_only": true,
        });
        let id = self.push(
            Op::StatusFirst { status: 0 },
            RequestKind::Unary,
            paths::KV_RANGE,
            body,
            now,
        );
        // The query is known by its first request's id.
        if let Some(p) = self.out.get_mut(id) {
            p.op = Op::StatusFirst { status: id };
        }
        Ok(id)
    }

    pub(super) fn on_reply(
        &mut self,
        core: &mut Client,
        now: u64,
        op: Op,
        reply: Result<Value, ReplyError>,
    ) {
        match op {
            Op::Grant { secs, sent } => self.on_grant(core, now, secs, sent, reply),
            Op::Txn { lease, req } => self.on_txn(core, now, lease, req, reply),
            Op::Predecessor { lease, req } => self.on_predecessor(core, now, lease, req, reply),
            Op::KeepAlive {
                etcd_lease,
                renew,
                sent,
            } => self.on_keepalive(core, now, etcd_lease, renew, sent, reply),
            Op::Delete { lease, req } => {
                let read = self.read(reply, json::read_deleted);
                let result = match read {
                    Ok(n) if n > 0 => ReleaseResult::Released,
                    Ok(_) => ReleaseResult::NotOwner,
                    Err(_) => ReleaseResult::TransportError,
                };
                if let Some(h) = self.holders.get_mut(&lease) {
                    h.deleting = false;
                    let id = h.etcd_lease;
                    if result != ReleaseResult::TransportError {
                        h.own_rev = 0;
                    } else if let Some(id) = id {
                        // Our key may stay on a lease others keep alive.
                        self.retire(id, now);
                    }
                    if let Some(id) = id {
                        self.drop_if_idle(id, now);
                    }
                }
                if let Some(req) = req {
                    let _ = core.handle_release_result(now, req, result);
                }
            }
            Op::Revoke => {}
            Op::Watch { .. } => {}
            Op::StatusFirst { status } => match self.read(reply, json::read_first_owner) {
                Ok(None) => self.out.answer_status((status, Ok(LockStatus::default()))),
                Ok(Some((fence, lease))) => {
                    self.push(
                        Op::StatusTtl { status, fence },
                        RequestKind::Unary,
                        paths::LEASE_TIMETOLIVE,
                        json!({ "ID": lease.to_string() }),
                        now,
                    );
                }
                Err(e) => self.out.answer_status((status, Err(e.to_string()))),
            },
            Op::StatusTtl { status, fence } => match self.read(reply, json::read_time_to_live) {
                // The lease ended between the two reads: free now.
                Ok(ttl_s) if ttl_s <= 0 => {
                    self.out.answer_status((status, Ok(LockStatus::default())))
                }
                Ok(ttl_s) => {
                    let st = LockStatus {
                        held: true,
                        fencing_token: Some(fence as u64),
                        remaining_ttl_ms: Some((ttl_s as u64).saturating_mul(1_000)),
                        ..LockStatus::default()
                    };
                    self.out.answer_status((status, Ok(st)));
                }
                Err(e) => self.out.answer_status((status, Err(e.to_string()))),
            },
            Op::Authenticate => self.on_authenticate(core, now, reply),
        }
    }

    /// Reads a parsed reply; a reply of the wrong shape is counted and noted.
    pub(super) fn read<T>(
        &mut self,
        reply: Result<Value, ReplyError>,
        f: impl FnOnce(&Value) -> Result<T, ReplyError>,
    ) -> Result<T, ReplyError> {
        let v = reply?;
        let r = f(&v);
        if let Err(e) = &r {
            self.garbage(&e.to_string());
        }
        r
    }
}
