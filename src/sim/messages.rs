//! Messages between the hosts and the service: what a command becomes on the wire, its trip
//! through the network (delay, loss, duplication, transport errors and partitions, drawn
//! by `net.rs`), and the reference service answering it on its own drifting clock.
//!
//! A transport error reaches the client as the request's error answer; whether the request
//! reached the service first is part of its fate, so a "failed" acquire may still have been
//! granted — the case rule 6 exists for. Release notifications travel the same network.

use std::sync::Arc;

use super::net::Fate;
use super::service::{AcquireReply, OwnerToken, ReleaseOutcome};
use super::world::{Ev, Shared, hex, secs};
use crate::{LockName, ReleaseResult, RenewResult, RequestId};

#[derive(Clone, Debug)]
pub(super) enum ToService {
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
pub(super) enum ToClient {
    /// `None` = transport error.
    Acquire(RequestId, Option<AcquireReply>),
    Renew(RequestId, RenewResult),
    Release(RequestId, ReleaseResult),
    Notify(LockName),
}

impl Shared {
    /// Sends a request from client `c` at the current true time.
    pub(super) fn send_request(&mut self, c: usize, msg: ToService) {
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
    pub(super) fn send_reply(&mut self, c: usize, msg: ToClient) {
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

    /// Notifies the watchers of a release.
    pub(super) fn after_release(&mut self, name: &LockName, out: ReleaseOutcome) {
        for w in out.watchers {
            self.send_reply(w, ToClient::Notify(name.clone()));
        }
    }

    /// The service processes one message from client `c`.
    pub(super) fn at_service(&mut self, c: usize, msg: ToService, silent: bool) {
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
