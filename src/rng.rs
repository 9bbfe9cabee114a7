//! Seeded randomness: the core never asks the OS, so the same seed and inputs replay exactly.

use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

use crate::error::Error;
use crate::types::Token;

/// Minimum seed length: 128 bits, the size of an ownership token.
pub const MIN_SEED_LEN: usize = 16;

/// ChaCha20 keyed from the host's seed; a CSPRNG because ownership tokens must be unguessable
/// (a guessable token lets another client release our lock).
pub(crate) struct Rng {
    inner: ChaCha20Rng,
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
        Ok(Self {
            inner: ChaCha20Rng::from_seed(fold_seed(seed)),
        })
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

    /// Uniform in `[0, bound]` (inclusive); the modulo bias is below 2^-40 for our ranges.
    pub(crate) fn up_to(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            return 0;
        }
        if bound == u64::MAX {
            return self.next_u64();
        }
        self.next_u64() % (bound + 1)
    }
}
