//! Per-host monotonic clocks that drift, and sometimes step, against true time.
//!
//! The simulator keeps one "true" timeline (nanoseconds, starting at 0). Each
//! client host and the lock service read their own clock, which is a piecewise
//! linear function of true time: a random epoch, a rate off by a few hundred or
//! thousand ppm, and optional steps (a monotonic clock that jumps, as after a
//! VM migration). Invariant I5 compares validity windows in *true* time, so the
//! clock must also map a local instant back to the first true instant at which
//! the host's clock shows it.

const PPM: i128 = 1_000_000;

/// A drifting clock. Rates are `1 + ppm / 1e6`; `ppm` may be negative (slow).
#[derive(Clone, Debug)]
pub struct DriftClock {
    /// True time at which the current linear segment started.
    seg_true: u64,
    /// Local reading at `seg_true`.
    seg_local: u64,
    /// Rate error of the current segment, in parts per million.
    ppm: i32,
    /// Whether the clock has ever stepped (then local→true mapping is only
    /// meaningful within the current segment, and I5 is not checked).
    stepped: bool,
}

impl DriftClock {
    /// A clock that reads `epoch` at true time `start_true` and runs at
    /// `1 + ppm/1e6` of true speed. `ppm` must be above -1,000,000.
    pub fn new(start_true: u64, epoch: u64, ppm: i32) -> Self {
        assert!(ppm > -999_999, "a clock must run forwards");
        DriftClock {
            seg_true: start_true,
            seg_local: epoch,
            ppm,
            stepped: false,
        }
    }

    /// The rate error in ppm.
    pub fn ppm(&self) -> i32 {
        self.ppm
    }

    /// Whether a step ever happened.
    pub fn stepped(&self) -> bool {
        self.stepped
    }

    /// Local reading at true time `t` (`t` at or after the current segment).
    pub fn local(&self, t: u64) -> u64 {
        let dt = i128::from(t.saturating_sub(self.seg_true));
        let dl = dt * (PPM + i128::from(self.ppm)) / PPM;
        (i128::from(self.seg_local) + dl).clamp(0, i128::from(u64::MAX)) as u64
    }

    /// The first true instant (not before the current segment) at which the
    /// clock reads at least `local`. Used to map deadlines and `valid_until`
    /// back onto the true timeline.
    pub fn true_at(&self, local: u64) -> u64 {
        if local <= self.seg_local {
            return self.seg_true;
        }
        let dl = i128::from(local - self.seg_local);
        let rate = PPM + i128::from(self.ppm);
        // smallest dt with floor(dt * rate / PPM) >= dl  <=>  dt * rate >= dl * PPM
        let dt = (dl * PPM + rate - 1) / rate;
        (i128::from(self.seg_true) + dt).min(i128::from(u64::MAX)) as u64
    }

    /// Jumps the local reading by `delta` ns at true time `now` (negative steps
    /// model a misbehaving "monotonic" clock; the core must clamp them).
    pub fn step(&mut self, now: u64, delta: i64) {
        let cur = self.local(now);
        self.seg_local = if delta >= 0 {
            cur.saturating_add(delta as u64)
        } else {
            cur.saturating_sub(delta.unsigned_abs())
        };
        self.seg_true = now;
        self.stepped = true;
    }

    /// Changes the rate from true time `now` on, keeping the reading continuous.
    pub fn set_ppm(&mut self, now: u64, ppm: i32) {
        assert!(ppm > -999_999, "a clock must run forwards");
        self.seg_local = self.local(now);
        self.seg_true = now;
        self.ppm = ppm;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_and_true_at_are_inverse() {
        for ppm in [-5000, -1, 0, 1, 3999, 250_000] {
            let c = DriftClock::new(1_000, 5_000_000_000, ppm);
            for t in [1_000u64, 1_001, 7_777_777, 123_456_789_012] {
                let l = c.local(t);
                let back = c.true_at(l);
                assert!(back <= t, "ppm {ppm} t {t}");
                assert!(c.local(back) >= l);
                if back > 1_000 {
                    assert!(c.local(back - 1) < l);
                }
            }
        }
    }

    #[test]
    fn drift_direction_and_step() {
        let mut fast = DriftClock::new(0, 0, 1000);
        assert_eq!(fast.local(1_000_000), 1_001_000);
        fast.step(1_000_000, 5);
        assert!(fast.stepped());
        assert_eq!(fast.local(1_000_000), 1_001_005);
        fast.step(1_000_000, -2_000_000);
        assert_eq!(fast.local(1_000_000), 0);
        let slow = DriftClock::new(0, 0, -1000);
        assert_eq!(slow.local(1_000_000), 999_000);
    }
}
