//! Tunables and their validation. Defaults follow Redlock's drift rule and the usual
//! "renew at a third of the TTL" cadence.

use crate::error::Error;

/// Longest TTL the core accepts at all; keeps every deadline computation far from overflow.
pub const TTL_CEILING_MS: u64 = 365 * 24 * 3600 * 1000;

/// Client-wide configuration, fixed at construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Clock-drift allowance in parts per million of the TTL (Redlock: 1%).
    pub drift_ppm: u32,
    /// Fixed drift allowance in ns (Redlock: 2 ms), covering timer and scheduling slack.
    pub drift_fixed_ns: u64,
    /// Jitter of the renew cadence in ppm, so many leases do not renew in lockstep.
    pub renew_jitter_ppm: u32,
    /// Timeout of one request; renewals use at most a third of the TTL.
    pub request_timeout_ns: u64,
    /// Renewal failure budget. 0 (the default) is a time budget: renewals that fail in
    /// transport are retried with growing backoff for as long as validity remains, so a short
    /// outage does not cost a valid lease; the lease is lost on a rejection, or as
    /// `FailBudget` when its validity is about to end without a confirmed renewal (a further
    /// retry would leave less than one backoff step), or as `Expired` at `valid_until` when a
    /// renewal is still unanswered then. N > 0 is the count budget instead: N consecutive
    /// transport failures lose the lease as `FailBudget`, even with validity left.
    pub fail_budget: u32,
    /// First backoff step of acquisition retries.
    pub backoff_base_ns: u64,
    /// Largest backoff step.
    pub backoff_cap_ns: u64,
    /// Longest TTL an acquire may ask for.
    pub max_ttl_ms: u64,
    /// Bound on lease records, so memory stays bounded whatever the caller does.
    pub max_leases: u32,
    /// The host delivers release notifications reliably: waiters then sleep for the holder's
    /// remaining TTL and are woken early by a notification instead of polling. `Watch` and
    /// `Unwatch` are emitted either way (a host may deliver best-effort notifications, which
    /// still wake waiters early); with `false`, waiters also poll with capped backoff.
    pub notifications: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            drift_ppm: 10_000,
            drift_fixed_ns: 2_000_000,
            renew_jitter_ppm: 100_000,
            request_timeout_ns: 2_000_000_000,
            fail_budget: 0,
            backoff_base_ns: 5_000_000,
            backoff_cap_ns: 500_000_000,
            max_ttl_ms: 7 * 24 * 3600 * 1000,
            max_leases: 1 << 20,
            notifications: true,
        }
    }
}

/// Lease slots are addressed with 24 bits inside a `LeaseId`.
pub const MAX_LEASES_LIMIT: u32 = 1 << 24;

impl Config {
    /// Rejects values that would make timing decisions meaningless or overflow.
    pub fn validate(&self) -> Result<(), Error> {
        if self.drift_ppm >= 500_000 {
            return Err(Error::InvalidConfig("drift_ppm must be below 500000 (50%)"));
        }
        if self.drift_fixed_ns > 60_000_000_000 {
            return Err(Error::InvalidConfig("drift_fixed_ns must be at most 60 s"));
        }
        if self.renew_jitter_ppm > 500_000 {
            return Err(Error::InvalidConfig(
                "renew_jitter_ppm must be at most 500000 (50%)",
            ));
        }
        if self.request_timeout_ns == 0 || self.request_timeout_ns > 3_600_000_000_000 {
            return Err(Error::InvalidConfig(
                "request_timeout_ns must be in (0, 1 h]",
            ));
        }
        if self.backoff_base_ns == 0 {
            return Err(Error::InvalidConfig("backoff_base_ns must be positive"));
        }
        if self.backoff_cap_ns < self.backoff_base_ns {
            return Err(Error::InvalidConfig(
                "backoff_cap_ns must not be below backoff_base_ns",
            ));
        }
        if self.backoff_cap_ns > 3_600_000_000_000 {
            return Err(Error::InvalidConfig("backoff_cap_ns must be at most 1 h"));
        }
        if self.max_ttl_ms == 0 || self.max_ttl_ms > TTL_CEILING_MS {
            return Err(Error::InvalidConfig("max_ttl_ms must be in [1, 365 days]"));
        }
        if self.max_leases == 0 || self.max_leases > MAX_LEASES_LIMIT {
            return Err(Error::InvalidConfig("max_leases must be in [1, 16777216]"));
        }
        Ok(())
    }

    /// Safety margin subtracted from a grant: `ttl × drift + fixed` (design rule 2).
    pub fn drift_ns(&self, ttl_ns: u64) -> u64 {
        parts_per_million(ttl_ns, self.drift_ppm).saturating_add(self.drift_fixed_ns)
    }

    /// Longest renew interval the jitter can produce for a TTL.
    pub fn max_renew_interval_ns(&self, ttl_ns: u64) -> u64 {
        let base = ttl_ns / 3;
        base + parts_per_million(base, self.renew_jitter_ppm)
    }

    /// Checks that a TTL leaves room for the cadence and margins: the validity window must
    /// span at least two (maximally jittered) renew intervals, so one failed renewal can be
    /// retried before the lease runs out.
    pub fn check_ttl(&self, ttl_ms: u64) -> Result<(), Error> {
        if ttl_ms == 0 {
            return Err(Error::InvalidTtl {
                ttl_ms,
                reason: "TTL must be positive",
            });
        }
        if ttl_ms > self.max_ttl_ms {
            return Err(Error::InvalidTtl {
                ttl_ms,
                reason: "TTL exceeds max_ttl_ms",
            });
        }
        let ttl_ns = ttl_ms * 1_000_000;
        let validity = ttl_ns.saturating_sub(self.drift_ns(ttl_ns));
        if validity < 2 * self.max_renew_interval_ns(ttl_ns) {
            return Err(Error::InvalidTtl {
                ttl_ms,
                reason: "TTL too short for the renew cadence plus drift margin",
            });
        }
        Ok(())
    }
}

/// Per-acquire options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquireOptions {
    /// Time to live of the grant in milliseconds; renewed automatically at about a third.
    pub ttl_ms: u64,
    /// Budget for waiting while someone else holds the lock; 0 means one attempt.
    pub wait_ns: u64,
    /// Join a live reentrant lease of the same name in this core instead of contending.
    pub reentrant: bool,
    /// Renew automatically at about a third of the TTL. Off, only `Client::renew` extends the
    /// lease, and it is lost (`Expired`) when its validity ends unless the caller renewed it.
    pub auto_renew: bool,
}

impl AcquireOptions {
    /// One attempt, not reentrant.
    pub fn new(ttl_ms: u64) -> Self {
        Self {
            ttl_ms,
            wait_ns: 0,
            reentrant: false,
            auto_renew: true,
        }
    }

    /// Sets the wait budget.
    pub fn wait_ns(mut self, wait_ns: u64) -> Self {
        self.wait_ns = wait_ns;
        self
    }

    /// Makes the acquisition reentrant within this core.
    pub fn reentrant(mut self, reentrant: bool) -> Self {
        self.reentrant = reentrant;
        self
    }

    /// Turns automatic renewal on (the default) or off.
    pub fn auto_renew(mut self, auto_renew: bool) -> Self {
        self.auto_renew = auto_renew;
        self
    }
}

/// `x × ppm / 10^6` without overflow. The u64 path avoids a 128-bit division, which costs
/// more than the rest of a renew cycle's arithmetic; the u128 path covers huge values.
pub(crate) fn parts_per_million(x: u64, ppm: u32) -> u64 {
    match x.checked_mul(u64::from(ppm)) {
        Some(p) => p / 1_000_000,
        None => (u128::from(x) * u128::from(ppm) / 1_000_000) as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::parts_per_million;

    #[test]
    fn parts_per_million_matches_wide_arithmetic_on_both_paths() {
        let reference = |x: u64, ppm: u32| (u128::from(x) * u128::from(ppm) / 1_000_000) as u64;
        for x in [
            0,
            1,
            999_999,
            10_000_000_000,
            u64::MAX / 500_000,
            u64::MAX / 3,
            u64::MAX,
        ] {
            for ppm in [0, 1, 10_000, 100_000, 500_000, u32::MAX] {
                assert_eq!(parts_per_million(x, ppm), reference(x, ppm), "{x} × {ppm}");
            }
        }
    }
}
