//! The lease lifecycle as one state machine: every phase a lease can be in, the data only that
//! phase has, and every legal change of phase. `Client` decides when a change happens and
//! produces what goes with it (commands, events, counters, the name table); the phase itself
//! changes only through the methods below.
//!
//! ```text
//!   public state: Waiting, Asking = Acquiring; Held, Renewing = Held; the others = how it ended
//!
//!   Waiting ──attempt_sent──▶ Asking ──grant──▶ Held ◀──renewed / renewal_failed──┐
//!      ▲                        │                │                                │
//!      └────────attempt_answered┘                └──renew_sent──▶ Renewing ───────┘
//!
//!   end:  Waiting, Held, Renewing ──▶ Ended          Asking ──▶ Withdrawing
//!   Withdrawing ──attempt_settled──▶ Ended, or RetryingRelease when a release is owed
//!   start_release:  Ended ──▶ RetryingRelease (due now); a cleanup under way is joined
//!   RetryingRelease ──release_sent──▶ Releasing ──release_due──▶ RetryingRelease
//!   Releasing, RetryingRelease ──finish_release──▶ Ended
//! ```
//!
//! Rules:
//! 1. At most one request per lease is in flight, and the phase says which: an acquire attempt
//!    in `Asking` and `Withdrawing`, a renewal in `Renewing`, a release in `Releasing`. Its id
//!    is always the newest its slot minted (see `table`), so a phase keeps only its send time.
//! 2. A lease ends once, from acquiring or held, with its terminal event; no ended phase leads
//!    back. `holders` is 0 from then on.
//! 3. An ended lease whose grant may exist at the service releases it (design rule 6):
//!    [`Effort::UntilConfirmed`] retries with backoff until the service answers or `until`;
//!    [`Effort::BestEffort`] (a lease lost locally) sends once. A grant that surfaces meanwhile
//!    makes the effort `UntilConfirmed` and, while a release is in flight, asks for one more
//!    after it (`again`): the one in flight may have left the newer grant in place.
//! 4. An ended lease's `until` is when any grant of ours has certainly run out at the service
//!    (one TTL plus one request timeout after the latest reason to release). Past it nothing is
//!    retried, and the record goes as soon as no late answer can matter.
//! 5. A change asked of a phase that does not allow it does nothing and returns `false`: callers
//!    check the phase first, so this never happens, and no input can make it panic.

use crate::types::LeaseState;

/// "No deadline" inside the core.
pub(crate) const NEVER: u64 = u64::MAX;

/// Where a lease is in its lifecycle, with the data only that phase has (24 bytes, so that a
/// lease record stays within its table slot).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Phase {
    /// Acquiring, no attempt in flight: the next goes out at `retry_at` or on a wake-up.
    Waiting {
        retry_at: u64,
        wait_until: u64,
        tries: Tries,
    },
    /// Acquiring, an attempt in flight since `sent`.
    Asking {
        sent: u64,
        wait_until: u64,
        tries: Tries,
    },
    /// Held, no renewal in flight: the next goes out at `renew_at` (`NEVER` without automatic
    /// renewal).
    Held { renew_at: u64, renewal: Renewal },
    /// Held, a renewal in flight since `sent`.
    Renewing { sent: u64, renewal: Renewal },
    /// Ended `AcquireFailed` (cancelled, say) while an attempt sent at `sent` is in flight: its
    /// answer decides whether a grant must be released. `release` is set once one must be
    /// whatever the answer (an earlier attempt's outcome is unknown, or a late grant came).
    Withdrawing {
        sent: u64,
        until: u64,
        release: bool,
    },
    /// Ended, a release of our grant in flight since `sent`.
    Releasing {
        end: End,
        sent: u64,
        until: u64,
        cleanup: Cleanup,
    },
    /// Ended, the next release goes out at `retry_at`.
    RetryingRelease {
        end: End,
        retry_at: u64,
        until: u64,
        cleanup: Cleanup,
    },
    /// Ended, nothing in flight and nothing owed. The record stays until `until` only while a
    /// superseded attempt may still be granted (that grant would have to be released).
    Ended { end: End, until: u64 },
}

const _: () = assert!(std::mem::size_of::<Phase>() == 24);

/// How a lease ended: its terminal `LeaseState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Released,
    Lost,
    AcquireFailed,
}

impl From<End> for LeaseState {
    fn from(end: End) -> Self {
        match end {
            End::Released => LeaseState::Released,
            End::Lost => LeaseState::Lost,
            End::AcquireFailed => LeaseState::AcquireFailed,
        }
    }
}

/// What the acquiring phases know about the attempts so far.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tries {
    /// Attempts sent (saturating: only backoff and the quick-attempt count read it).
    pub(crate) attempts: u16,
    /// Some attempt's outcome is unknown: the service may hold a grant for our token. Sticky,
    /// because a delayed attempt can still be applied after a later one was refused.
    pub(crate) uncertain: bool,
    /// The latest attempt failed in transport (decides `Unavailable` vs `WaitExhausted`).
    pub(crate) last_failed: bool,
    /// A wake-up arrived while an attempt was in flight: a refusal of that attempt is older
    /// news than the wake-up, so the lease asks again at once instead of sleeping.
    pub(crate) retry_if_refused: bool,
    pub(crate) watch: Watch,
}

/// A waiting lease's place in its name's shared watch (design rule 7).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Watch {
    #[default]
    No,
    /// Counted in its name's watchers.
    Watching,
    /// Counted in its name's watchers and sitting in its wake queue.
    Queued,
}

/// What the held phases know about renewals.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Renewal {
    /// Consecutive renewals that failed in transport.
    pub(crate) failures: u32,
    /// The application asked for a renewal (`renew`): its confirmation is reported.
    pub(crate) requested: bool,
}

/// How hard an ended lease tries to release its grant (rule 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effort {
    UntilConfirmed,
    BestEffort,
}

/// What the application is owed when the release it asked for is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owed {
    /// Not the application's release (a loss, a failed acquire, a late grant), or already told.
    Nothing,
    /// The outcome is counted.
    Count,
    /// Counted and reported (`release_reported`) as an `Event::ReleaseOutcome`.
    Report,
}

/// A release in progress.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cleanup {
    pub(crate) effort: Effort,
    pub(crate) owed: Owed,
    /// A grant surfaced while a release was in flight: send one more after it.
    pub(crate) again: bool,
    /// Some release was confirmed (a later NotOwner for a re-sent release does not undo it).
    pub(crate) confirmed: bool,
    /// Releases that failed in transport (saturating: backoff and "any failed" read it).
    pub(crate) failures: u16,
}

/// The kind of a lease's request in flight (rule 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReqKind {
    Acquire,
    Renew,
    Release,
}

/// How `start_release` found the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Started {
    /// A new cleanup began (rather than joining one under way).
    pub(crate) fresh: bool,
    /// Nothing is in flight: the release is due now.
    pub(crate) send_now: bool,
}

impl Phase {
    /// A new lease: acquiring, its first attempt not yet sent.
    pub(crate) fn new(wait_until: u64) -> Self {
        Phase::Waiting {
            retry_at: NEVER,
            wait_until,
            tries: Tries::default(),
        }
    }

    /// The lease's public state.
    pub(crate) fn state(&self) -> LeaseState {
        match *self {
            Phase::Waiting { .. } | Phase::Asking { .. } => LeaseState::Acquiring,
            Phase::Held { .. } | Phase::Renewing { .. } => LeaseState::Held,
            Phase::Withdrawing { .. } => LeaseState::AcquireFailed,
            Phase::Releasing { end, .. }
            | Phase::RetryingRelease { end, .. }
            | Phase::Ended { end, .. } => end.into(),
        }
    }

    /// Whether the lease was ever granted (its fence and validity mean something).
    pub(crate) fn granted(&self) -> bool {
        match *self {
            Phase::Waiting { .. } | Phase::Asking { .. } | Phase::Withdrawing { .. } => false,
            Phase::Held { .. } | Phase::Renewing { .. } => true,
            Phase::Releasing { end, .. }
            | Phase::RetryingRelease { end, .. }
            | Phase::Ended { end, .. } => end != End::AcquireFailed,
        }
    }

    /// The request in flight, if any: its kind and when it was sent.
    #[inline]
    pub(crate) fn in_flight(&self) -> Option<(ReqKind, u64)> {
        match *self {
            Phase::Asking { sent, .. } | Phase::Withdrawing { sent, .. } => {
                Some((ReqKind::Acquire, sent))
            }
            Phase::Renewing { sent, .. } => Some((ReqKind::Renew, sent)),
            Phase::Releasing { sent, .. } => Some((ReqKind::Release, sent)),
            _ => None,
        }
    }

    /// The acquiring phases' attempt facts.
    pub(crate) fn tries_mut(&mut self) -> Option<&mut Tries> {
        match self {
            Phase::Waiting { tries, .. } | Phase::Asking { tries, .. } => Some(tries),
            _ => None,
        }
    }

    /// Waiting → Asking: an acquire attempt goes out at `now`.
    pub(crate) fn attempt_sent(&mut self, now: u64) -> bool {
        let Phase::Waiting {
            wait_until,
            mut tries,
            ..
        } = *self
        else {
            return false;
        };
        tries.attempts = tries.attempts.saturating_add(1);
        *self = Phase::Asking {
            sent: now,
            wait_until,
            tries,
        };
        true
    }

    /// Asking → Waiting: the attempt was refused or failed (or its grant was stale on
    /// arrival); the next goes out at `retry_at`.
    pub(crate) fn attempt_answered(&mut self, retry_at: u64) -> bool {
        let Phase::Asking {
            wait_until, tries, ..
        } = *self
        else {
            return false;
        };
        *self = Phase::Waiting {
            retry_at,
            wait_until,
            tries,
        };
        true
    }

    /// Asking → Held: granted; the first renewal is due at `renew_at`.
    pub(crate) fn grant(&mut self, renew_at: u64) -> bool {
        if !matches!(self, Phase::Asking { .. }) {
            return false;
        }
        *self = Phase::Held {
            renew_at,
            renewal: Renewal::default(),
        };
        true
    }

    /// Held → Renewing: a renewal goes out at `now`.
    pub(crate) fn renew_sent(&mut self, now: u64) -> bool {
        let Phase::Held { renewal, .. } = *self else {
            return false;
        };
        *self = Phase::Renewing { sent: now, renewal };
        true
    }

    /// Renewing → Held: renewed; the next renewal is due at `renew_at`. Returns whether the
    /// application had asked for it.
    pub(crate) fn renewed(&mut self, renew_at: u64) -> Option<bool> {
        let Phase::Renewing { renewal, .. } = *self else {
            return None;
        };
        *self = Phase::Held {
            renew_at,
            renewal: Renewal::default(),
        };
        Some(renewal.requested)
    }

    /// Renewing → Held: the renewal failed in transport (`failures` in a row now); the next
    /// goes out at `retry_at`.
    pub(crate) fn renewal_failed(&mut self, failures: u32, retry_at: u64) -> bool {
        let Phase::Renewing { renewal, .. } = *self else {
            return false;
        };
        *self = Phase::Held {
            renew_at: retry_at,
            renewal: Renewal {
                failures,
                ..renewal
            },
        };
        true
    }

    /// Acquiring or held → ended. A request in flight is dropped (its answer will be stale),
    /// except an acquire attempt: its grant, if any, must be released (`Withdrawing`).
    pub(crate) fn end(&mut self, end: End, until: u64) -> bool {
        *self = match *self {
            Phase::Asking { sent, .. } if end == End::AcquireFailed => Phase::Withdrawing {
                sent,
                until,
                release: false,
            },
            Phase::Waiting { .. } | Phase::Held { .. } | Phase::Renewing { .. } => {
                Phase::Ended { end, until }
            }
            _ => return false,
        };
        true
    }

    /// Withdrawing → the withdrawn attempt was answered or timed out: a release owed becomes
    /// due (`RetryingRelease`), else the lease is `Ended`.
    pub(crate) fn attempt_settled(&mut self) -> bool {
        let Phase::Withdrawing { until, release, .. } = *self else {
            return false;
        };
        let end = End::AcquireFailed;
        *self = if release {
            Phase::RetryingRelease {
                end,
                retry_at: NEVER,
                until,
                cleanup: Cleanup::new(Effort::UntilConfirmed, Owed::Nothing),
            }
        } else {
            Phase::Ended { end, until }
        };
        true
    }

    /// An ended lease must release its grant (rule 3), retried until `give_up` at least.
    /// `Ended` starts a cleanup, due at once; one under way is joined.
    pub(crate) fn start_release(&mut self, effort: Effort, owed: Owed, give_up: u64) -> Started {
        let joined = |send_now| Started {
            fresh: false,
            send_now,
        };
        match self {
            Phase::Ended { end, until } => {
                *self = Phase::RetryingRelease {
                    end: *end,
                    retry_at: NEVER,
                    until: (*until).max(give_up),
                    cleanup: Cleanup::new(effort, owed),
                };
                Started {
                    fresh: true,
                    send_now: true,
                }
            }
            Phase::Withdrawing { until, release, .. } => {
                let fresh = !*release;
                *release = true;
                *until = (*until).max(give_up);
                Started {
                    fresh,
                    send_now: false,
                }
            }
            Phase::Releasing { until, cleanup, .. } => {
                cleanup.again = true;
                cleanup.join(effort);
                *until = (*until).max(give_up);
                joined(false)
            }
            Phase::RetryingRelease { until, cleanup, .. } => {
                cleanup.join(effort);
                *until = (*until).max(give_up);
                joined(true)
            }
            _ => joined(false),
        }
    }

    /// RetryingRelease → Releasing: a release goes out at `now`.
    pub(crate) fn release_sent(&mut self, now: u64) -> bool {
        let Phase::RetryingRelease {
            end,
            until,
            cleanup,
            ..
        } = *self
        else {
            return false;
        };
        *self = Phase::Releasing {
            end,
            sent: now,
            until,
            cleanup,
        };
        true
    }

    /// Releasing → RetryingRelease: the release in flight is over (failed, or answered with
    /// one more owed); the next goes out at `retry_at`.
    pub(crate) fn release_due(&mut self, retry_at: u64) -> bool {
        let Phase::Releasing {
            end,
            until,
            cleanup,
            ..
        } = *self
        else {
            return false;
        };
        *self = Phase::RetryingRelease {
            end,
            retry_at,
            until,
            cleanup,
        };
        true
    }

    /// Releasing or RetryingRelease → Ended: the cleanup is over (answered, or given up).
    /// Returns it, for what the application is owed.
    pub(crate) fn finish_release(&mut self) -> Option<(End, Cleanup)> {
        let (Phase::Releasing {
            end,
            until,
            cleanup,
            ..
        }
        | Phase::RetryingRelease {
            end,
            until,
            cleanup,
            ..
        }) = *self
        else {
            return None;
        };
        *self = Phase::Ended { end, until };
        Some((end, cleanup))
    }
}

impl Cleanup {
    fn new(effort: Effort, owed: Owed) -> Self {
        Cleanup {
            effort,
            owed,
            again: false,
            confirmed: false,
            failures: 0,
        }
    }

    /// Another reason to release joins this cleanup: only a best-effort one is upgraded.
    fn join(&mut self, effort: Effort) {
        if effort == Effort::UntilConfirmed {
            self.effort = Effort::UntilConfirmed;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One lease in each phase.
    fn every_phase() -> Vec<Phase> {
        let cleanup = Cleanup::new(Effort::UntilConfirmed, Owed::Nothing);
        let (end, until) = (End::Lost, 50);
        vec![
            Phase::new(100),
            Phase::Asking {
                sent: 1,
                wait_until: 100,
                tries: Tries::default(),
            },
            Phase::Held {
                renew_at: 10,
                renewal: Renewal::default(),
            },
            Phase::Renewing {
                sent: 1,
                renewal: Renewal::default(),
            },
            Phase::Withdrawing {
                sent: 1,
                until,
                release: false,
            },
            Phase::Releasing {
                end,
                sent: 1,
                until,
                cleanup,
            },
            Phase::RetryingRelease {
                end,
                retry_at: 5,
                until,
                cleanup,
            },
            Phase::Ended { end, until },
        ]
    }

    fn name(p: &Phase) -> String {
        format!("{p:?}")
            .split([' ', '{'])
            .next()
            .unwrap_or("")
            .to_owned()
    }

    /// The transition table of the module header: each change is accepted from exactly the
    /// phases listed there, and refused from every other without touching the phase.
    #[test]
    fn each_change_is_accepted_only_from_its_phases() {
        type Change = fn(&mut Phase) -> bool;
        let table: [(&str, Change, &[&str]); 12] = [
            ("attempt_sent", |p| p.attempt_sent(2), &["Waiting"]),
            ("attempt_answered", |p| p.attempt_answered(9), &["Asking"]),
            ("grant", |p| p.grant(9), &["Asking"]),
            ("renew_sent", |p| p.renew_sent(2), &["Held"]),
            ("renewed", |p| p.renewed(9).is_some(), &["Renewing"]),
            ("renewal_failed", |p| p.renewal_failed(1, 9), &["Renewing"]),
            (
                "end(Lost)",
                |p| p.end(End::Lost, 60),
                &["Waiting", "Held", "Renewing"],
            ),
            (
                "end(AcquireFailed)",
                |p| p.end(End::AcquireFailed, 60),
                &["Waiting", "Asking", "Held", "Renewing"],
            ),
            ("attempt_settled", |p| p.attempt_settled(), &["Withdrawing"]),
            ("release_sent", |p| p.release_sent(2), &["RetryingRelease"]),
            ("release_due", |p| p.release_due(9), &["Releasing"]),
            (
                "finish_release",
                |p| p.finish_release().is_some(),
                &["Releasing", "RetryingRelease"],
            ),
        ];
        for (change, apply, from) in table {
            for before in every_phase() {
                let mut p = before;
                let accepted = apply(&mut p);
                let legal = from.contains(&name(&before).as_str());
                assert_eq!(accepted, legal, "{change} from {before:?}");
                if !legal {
                    assert_eq!(format!("{p:?}"), format!("{before:?}"), "{change}");
                }
            }
        }
    }

    /// No ended phase leads back to acquiring or held (rule 2), whatever is asked of it.
    #[test]
    fn ended_phases_never_lead_back() {
        for mut p in every_phase().into_iter().skip(4) {
            p.attempt_sent(2);
            p.grant(9);
            p.renew_sent(2);
            p.attempt_settled();
            p.start_release(Effort::BestEffort, Owed::Nothing, 70);
            p.release_sent(3);
            p.release_due(9);
            p.finish_release();
            assert!(p.state().is_terminal(), "{p:?}");
        }
    }

    /// A late grant joins a cleanup under way: a best-effort one becomes until-confirmed, one
    /// in flight asks for one more release, and `until` only grows (rule 3).
    #[test]
    fn a_release_joined_while_in_flight_is_upgraded_and_sent_again() {
        let mut p = Phase::Ended {
            end: End::Lost,
            until: 50,
        };
        let started = p.start_release(Effort::BestEffort, Owed::Nothing, 60);
        assert_eq!(
            started,
            Started {
                fresh: true,
                send_now: true
            }
        );
        assert!(p.release_sent(55));
        let joined = p.start_release(Effort::UntilConfirmed, Owed::Nothing, 40);
        assert_eq!(
            joined,
            Started {
                fresh: false,
                send_now: false
            }
        );
        let Phase::Releasing { until, cleanup, .. } = p else {
            panic!("{p:?}");
        };
        assert_eq!(until, 60);
        assert!(cleanup.again);
        assert_eq!(cleanup.effort, Effort::UntilConfirmed);
    }
}
