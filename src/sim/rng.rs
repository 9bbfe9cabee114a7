//! A tiny deterministic random number generator for the simulator.
//!
//! The simulator must replay a seed bit for bit on every platform and with every
//! version of every dependency, so it carries its own generator (SplitMix64)
//! instead of borrowing one whose output stream might change in an upgrade.
//! It is not cryptographic and is never used by the core.

/// SplitMix64: one `u64` of state, full period, good enough statistical quality
/// for choosing delays and faults, and trivially reproducible.
#[derive(Clone, Debug)]
pub struct SimRng {
    state: u64,
}

impl SimRng {
    /// A generator whose whole output stream is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        SimRng { state: seed }
    }

    /// An independent stream derived from this one, so that adding draws in one
    /// part of the world does not shift the choices made in another part.
    pub fn fork(&mut self, salt: u64) -> SimRng {
        SimRng::new(self.next_u64() ^ salt.wrapping_mul(0xA076_1D64_78BD_642F))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), by multiply-shift; the tiny bias is
    /// irrelevant for a simulator and the method never loops.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        if hi - lo == u64::MAX {
            return self.next_u64();
        }
        lo + self.below(hi - lo + 1)
    }

    /// Uniform signed value in `-bound..=bound`.
    pub fn signed(&mut self, bound: i64) -> i64 {
        let b = bound.unsigned_abs();
        self.range(0, 2 * b) as i64 - b as i64
    }

    /// True with probability `ppm / 1_000_000`.
    pub fn chance_ppm(&mut self, ppm: u32) -> bool {
        ppm > 0 && self.below(1_000_000) < u64::from(ppm)
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// Fills a byte slice (used for the core's seed).
    pub fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_ranges_hold() {
        let mut a = SimRng::new(7);
        let mut b = SimRng::new(7);
        for _ in 0..1000 {
            assert_eq!(a.next_u64(), b.next_u64());
            let r = a.range(3, 9);
            assert!((3..=9).contains(&r));
            b.range(3, 9);
            let s = a.signed(5);
            assert!((-5..=5).contains(&s));
            b.signed(5);
        }
        assert_ne!(SimRng::new(1).next_u64(), SimRng::new(2).next_u64());
    }

    #[test]
    fn chance_extremes() {
        let mut r = SimRng::new(1);
        assert!((0..100).all(|_| !r.chance_ppm(0)));
        assert!((0..100).all(|_| r.chance_ppm(1_000_000)));
    }
}
