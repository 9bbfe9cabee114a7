//! The application on each host: workers that acquire a lock, hold it for a while (renewing
//! it by hand now and then), release it, and write to the protected resource through the
//! fencing gate whenever the core says their lease is held.
//!
//! Their choices (names, TTLs, waits, reentrancy, cancellations, reported releases) come
//! from each worker's own seeded generator, so a seed replays exactly. A write checks the
//! gate's I6 bound independently of the gate.

use super::host::{Host, LeaseRec};
use super::rng::SimRng;
use super::world::{MS, Shared};
use crate::{AcquireOptions, LeaseId, LockName, Releasing};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Work {
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

pub(super) struct Worker {
    pub(super) state: Work,
    pub(super) rng: SimRng,
}

impl Host {
    /// Runs the workers whose next action is due at local time `now`.
    pub(super) fn run_workers(&mut self, c: usize, sh: &mut Shared, now: u64) {
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

    pub(super) fn start_acquire(&mut self, c: usize, sh: &mut Shared, i: usize, now: u64) {
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

    pub(super) fn app_release(
        &mut self,
        c: usize,
        sh: &mut Shared,
        i: usize,
        lease: LeaseId,
        now: u64,
    ) {
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
    pub(super) fn app_renew(
        &mut self,
        c: usize,
        sh: &mut Shared,
        i: usize,
        lease: LeaseId,
        now: u64,
    ) {
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

    /// Protected writes by every worker whose lease the core says is held.
    pub(super) fn writes(&mut self, c: usize, sh: &mut Shared, now: u64) {
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
}

pub(super) fn gate_write(sh: &mut Shared, c: usize, name: &LockName, fence: u64, why: &str) {
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

/// When a worker next renews by hand: a lease without automatic renewal every TTL/6 to
/// TTL/2 (sometimes too late: then it is lost, as it should be), an auto-renewed one
/// occasionally.
pub(super) fn next_manual_renewal(
    rng: &mut SimRng,
    auto_renew: bool,
    now: u64,
    ttl_ns: u64,
) -> u64 {
    if !auto_renew {
        now + rng.range(ttl_ns / 6, ttl_ns / 2)
    } else if rng.chance_ppm(200_000) {
        now + rng.range(0, ttl_ns)
    } else {
        u64::MAX
    }
}
