//! The checks that look across a host or the whole world, rather than at one output: the
//! per-host deadlines and bounds after every input (I1, I3, I7), the service's own fences
//! (I4) and backend data (`echo`), the agreement of every core with the service at each
//! instant (I5), and the end-of-run accounting (I3, rule 6, `watch`).
//!
//! A failure is recorded once, with its step and true time (`Shared::fail`); the scenario
//! may ignore an invariant on purpose (the oracle-mutation tests).

use super::host::Host;
use super::world::{Shared, World, hex, secs};
use crate::{LeaseState, LockName};

impl Host {
    /// I1, I3 and I7 for this host, after its timeouts were handled.
    pub(super) fn check(&mut self, c: usize, sh: &mut Shared, now: u64) {
        let cnow = self.core.now();
        if cnow < now {
            sh.fail(
                "contract",
                format!("c{c}: core now {cnow} behind input now {now}"),
            );
        }
        let next_deadline = self.core.poll_timeout().unwrap_or(u64::MAX);
        for &lease in &self.open {
            let rec = &self.leases[&lease];
            if rec.fence.is_none() {
                let deadline = rec.created + rec.wait_ns + self.config.request_timeout_ns;
                if next_deadline > deadline {
                    // Rule 7 / I3: the core must ask to be woken by then, not
                    // rely on some other input arriving.
                    sh.fail(
                        "I3",
                        format!(
                            "c{c}: lease {lease} acquiring until at most {deadline}, but the next deadline is {next_deadline}"
                        ),
                    );
                }
                if cnow > deadline {
                    sh.fail(
                        "I3",
                        format!(
                            "c{c}: lease {lease} still acquiring at {cnow}, past wait deadline + request timeout {deadline}"
                        ),
                    );
                }
                continue;
            }
            let vu = self.core.valid_until(lease).ok().flatten().unwrap_or(0);
            if next_deadline > vu {
                // Rule 3: loss is detected locally and on time, even if no
                // input ever arrives.
                sh.fail(
                    "I3",
                    format!(
                        "c{c}: lease {lease} valid until {vu}, but the next deadline is {next_deadline}"
                    ),
                );
            }
            if cnow >= vu {
                sh.fail(
                    "I3",
                    format!(
                        "c{c}: lease {lease} not ended at {cnow} although valid_until {vu} passed"
                    ),
                );
            }
            if vu > rec.max_valid {
                sh.fail(
                    "I1",
                    format!(
                        "c{c}: lease {lease} valid_until {vu} beyond t_sent + ttl - drift = {}",
                        rec.max_valid
                    ),
                );
            }
            if self.core.is_held(lease, vu).unwrap_or(false) {
                sh.fail("I1", format!("c{c}: is_held({lease}, valid_until) is true"));
            }
        }
        let k = self.core.counters();
        if std::mem::take(&mut self.time_jumped) {
            let linger = self.linger(sh);
            for r in &mut self.recent {
                r.0 = r.0.max(cnow + linger);
            }
        }
        self.recent.retain(|(until, _)| *until >= cnow);
        let allowed = (self.open.len() + self.recent.len()) as u64 + k.pending_cleanups;
        if k.live_leases > allowed {
            sh.fail(
                "I7",
                format!(
                    "c{c}: {} lease records for {} open leases, {} recently ended and {} pending cleanups",
                    k.live_leases,
                    self.open.len(),
                    self.recent.len(),
                    k.pending_cleanups
                ),
            );
        }
    }
}

impl Shared {
    /// A renew/release carried other backend data than the token's live grant.
    /// That is the core's fault only if the live grant's data had been
    /// delivered to it before it sent the command (a grant answered by a
    /// transport error cannot be known).
    pub(super) fn judge_echo(&mut self, sent_at: u64) {
        let Some(m) = self.service.take_echo_mismatch() else {
            return;
        };
        // Only a cleanup release must adopt a late grant's data (rule 6); a
        // renew of a live lease rightly keeps its own grant's data (rule 5),
        // and the service refuses it if that grant is gone.
        let known = m.what == "release"
            && self
                .delivered
                .get(&(m.token, m.live.clone()))
                .is_some_and(|&t| t < sent_at);
        let msg = format!(
            "{} for token {} echoed backend data {:?}, but its live grant has {:?}{}",
            m.what,
            hex(&m.token),
            String::from_utf8_lossy(&m.sent),
            String::from_utf8_lossy(&m.live),
            if known {
                ", which the client had received"
            } else {
                " (not the core's fault: a renew, or data it never received)"
            }
        );
        if known {
            self.fail("echo", msg);
        } else {
            self.tr(format!("    note: {msg}"));
        }
    }

    /// A fresh grant by the service (not an idempotent re-grant): fences rise per name (I4).
    pub(super) fn fresh_grant(&mut self, name: &LockName, fence: u64) {
        self.stats.grants += 1;
        let prev = self.grant_fence.insert(name.clone(), fence);
        if prev.is_some_and(|p| p >= fence) {
            self.fail(
                "I4",
                format!(
                    "service granted {name:?} with fence {fence} after fence {}",
                    prev.unwrap_or(0)
                ),
            );
        }
    }
}

impl World {
    /// I5: in an honest world, whenever a client's core says a lease is held
    /// (on that client's clock at this true instant), the service's current
    /// unexpired holder of the name is that very lease.
    pub(super) fn check_i5(&mut self) {
        let t = self.sh.now;
        let snow = self.sh.service_clock.local(t);
        for (c, h) in self.hosts.iter().enumerate() {
            let local = h.clock.local(t);
            for &lease in &h.active {
                if !h.core.is_held(lease, local).unwrap_or(false) {
                    continue;
                }
                let rec = &h.leases[&lease];
                let holder = self.sh.service.holder(snow, &rec.name);
                let mine = match (holder, rec.token) {
                    (Some((tok, _)), Some(mine)) => tok == mine,
                    _ => false,
                };
                if !mine {
                    let vu = h.core.valid_until(lease).ok().flatten().unwrap_or(0);
                    let vu_true = h.clock.true_at(vu);
                    let detail = format!(
                        "c{c}: lease {lease} on {:?} is held until true {} but the service's holder at true {} is {:?}",
                        rec.name,
                        secs(vu_true),
                        secs(t),
                        holder.map(|(tok, f)| (hex(&tok).to_owned(), f))
                    );
                    self.sh.fail("I5", detail);
                    return;
                }
            }
        }
    }

    /// Final checks after the settle phase: every lease ended, every cleanup
    /// confirmed, no table left non-empty (I3, rule 6, I7).
    pub(super) fn finish(&mut self) {
        let sh = &mut self.sh;
        sh.tr(format!("{:>14} === end ===", secs(sh.now)));
        for (c, h) in self.hosts.iter().enumerate() {
            for (lease, rec) in &h.leases {
                if rec.terminal.is_none() {
                    let st = h.core.lease_state(*lease).ok();
                    sh.fail(
                        "I3",
                        format!("c{c}: lease {lease} never ended (state {st:?})"),
                    );
                }
            }
            let k = h.core.counters();
            if k.pending_cleanups != 0 || k.live_leases != 0 {
                sh.fail(
                    "rule 6",
                    format!(
                        "c{c}: after settling on a healed network: {} pending cleanups, {} lease records",
                        k.pending_cleanups, k.live_leases
                    ),
                );
            }
            if let Some((name, _)) = h.watching.iter().find(|(_, w)| **w) {
                sh.fail(
                    "watch",
                    format!("c{c}: still watching {name:?} with no waiter left"),
                );
            }
            let mut unreleased: Vec<_> = h
                .leases
                .iter()
                .filter(|(_, r)| {
                    (r.needs_release || (r.uncertain && r.fence.is_none())) && r.releases_sent == 0
                })
                .map(|(l, r)| (*l, r.terminal))
                .collect();
            unreleased.sort();
            if let Some((lease, end)) = unreleased.first() {
                sh.fail(
                    "rule 6",
                    format!(
                        "c{c}: lease {lease} ended ({end:?}) with a grant possibly live at the service, but no Release was ever sent"
                    ),
                );
            }
            for lease in h.leases.keys() {
                if h.core.lease_state(*lease) == Ok(LeaseState::Held) {
                    sh.fail("I2", format!("c{c}: lease {lease} still Held at the end"));
                }
            }
        }
    }
}
