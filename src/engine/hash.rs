//! A small keyed hasher for the core's tables. Keys come from the seeded RNG, so table
//! behaviour is deterministic per seed and the core never asks the OS for hash keys.

use std::hash::{BuildHasher, Hasher};

const K1: u64 = 0x9e37_79b9_7f4a_7c15;
const K2: u64 = 0xbf58_476d_1ce4_e5b9;

/// Builds [`KeyedHasher`]s sharing one key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyedState {
    key: u64,
}

impl KeyedState {
    pub(crate) fn new(key: u64) -> Self {
        Self { key }
    }
}

impl BuildHasher for KeyedState {
    type Hasher = KeyedHasher;

    fn build_hasher(&self) -> KeyedHasher {
        KeyedHasher { state: self.key }
    }
}

/// Multiply-rotate mixing over 8-byte words: fast for the short lock names the name table is
/// keyed by (request ids need no table: they carry their record slot).
#[derive(Debug)]
pub(crate) struct KeyedHasher {
    state: u64,
}

impl KeyedHasher {
    #[inline]
    fn mix(&mut self, v: u64) {
        self.state = (self.state ^ v).wrapping_mul(K1).rotate_left(31);
    }
}

impl Hasher for KeyedHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut buf = [0u8; 8];
            buf[..chunk.len()].copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(buf));
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.mix(v);
    }

    fn write_u32(&mut self, v: u32) {
        self.mix(u64::from(v));
    }

    fn write_u8(&mut self, v: u8) {
        self.mix(u64::from(v));
    }

    fn write_usize(&mut self, v: usize) {
        self.mix(v as u64);
    }

    fn finish(&self) -> u64 {
        let mut x = self.state;
        x ^= x >> 32;
        x = x.wrapping_mul(K2);
        x ^= x >> 29;
        x
    }
}
