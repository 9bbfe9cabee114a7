//! Seeded randomness: the core never asks the OS, so the same seed and inputs replay exactly.

use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

use crate::error::Error;
use crate::types::Token;

/// Minimum seed length: 128 bits, the size of an ownership token.
pub const MIN_SEED_LEN: usize = 16;

/// ChaCha20 keyed from the host's seed; a CSPRNG because ownership tokens must be unguessable
/// (a guessable token lets another client release our lock). Jitter and backoff need no
/// secrecy and run on every renewal, so they draw from a SplitMix64 stream keyed from it.
pub(crate) struct Rng {
    inner: ChaCha20Rng,
    jitter: u64,
}

fn fold_seed(seed: &[u8]) -> [u8; 32] {
    // Every input byte influences the key; lengths other than 32 are accepted.
    let mut key = [0u8; 32];
    for (i, b) in seed.iter().enumerate() {
        let at = i % 32;
        key[at] = key[at].rotate_left(3) ^ b;
    }
    key[31] ^= (seed.len() & 0xff) as u8;
    key
}

impl Rng {
    pub(crate) fn new(seed: &[u8]) -> Result<Self, Error> {
        if seed.len() < MIN_SEED_LEN {
            return Err(Error::SeedTooShort { len: seed.len() });
        }
        let mut inner = ChaCha20Rng::from_seed(fold_seed(seed));
        let jitter = inner.next_u64();
        Ok(Self { inner, jitter })
    }

    /// Mixes fresh entropy into the stream (after `fork()`, parent and child diverge).
    pub(crate) fn reseed(&mut self, seed: &[u8]) -> Result<(), Error> {
        if seed.len() < MIN_SEED_LEN {
            return Err(Error::SeedTooShort { len: seed.len() });
        }
        let mut key = [0u8; 32];
        self.inner.fill_bytes(&mut key);
        for (k, s) in key.iter_mut().zip(fold_seed(seed)) {
            *k ^= s;
        }
        self.inner = ChaCha20Rng::from_seed(key);
        self.jitter = self.inner.next_u64();
        Ok(())
    }

    pub(crate) fn token(&mut self) -> Token {
        let mut bytes = [0u8; 16];
        self.inner.fill_bytes(&mut bytes);
        Token(bytes)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    /// SplitMix64 (Steele, Lea, Flood 2014): fast, and statistically fine for spreading
    /// deadlines; never used for tokens.
    fn next_jitter(&mut self) -> u64 {
        self.jitter = self.jitter.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.jitter;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, bound]` (inclusive), for jitter and backoff. Multiply-shift instead of
    /// a modulo (a 64-bit division per renewal); the bias, `(bound + 1) / 2^64`, is negligible.
    pub(crate) fn up_to(&mut self, bound: u64) -> u64 {
        let x = self.next_jitter();
        match bound.checked_add(1) {
            Some(n) => ((u128::from(x) * u128::from(n)) >> 64) as u64,
            None => x,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn up_to_stays_in_range_and_reaches_both_ends() {
        let mut r = Rng::new(&[7; 16]).unwrap();
        assert_eq!(r.up_to(0), 0);
        let (mut lo, mut hi) = (false, false);
        for _ in 0..10_000 {
            let v = r.up_to(3);
            assert!(v <= 3);
            lo |= v == 0;
            hi |= v == 3;
        }
        assert!(lo && hi, "both ends of [0, 3] drawn");
        // The full range is allowed and not stuck.
        let a = r.up_to(u64::MAX);
        let b = r.up_to(u64::MAX);
        assert_ne!(a, b);
    }

    #[test]
    fn reseed_changes_the_jitter_stream_too() {
        let mut a = Rng::new(&[7; 16]).unwrap();
        let mut b = Rng::new(&[7; 16]).unwrap();
        assert_eq!(a.up_to(1 << 40), b.up_to(1 << 40));
        b.reseed(&[9; 16]).unwrap();
        let same = (0..8).all(|_| a.up_to(1 << 40) == b.up_to(1 << 40));
        assert!(!same);
    }
}
