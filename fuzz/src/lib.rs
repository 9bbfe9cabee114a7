//! Shared logic of the leasehold fuzz targets.
//!
//! Every target is a function from an `arbitrary`-decoded input to "no invariant broke"
//! (a broken invariant panics with a message naming it). The libFuzzer binaries in
//! `fuzz_targets/` and the stable-Rust replay test in `tests/replay.rs` call the same
//! functions, so a corpus file behaves identically in both.

pub mod client_ops;
pub mod corpus;
pub mod ffi_ops;
pub mod redis_ops;
pub mod resp_ops;
pub mod sim_ops;

use arbitrary::{Arbitrary, Unstructured};

/// A byte string of at most 64 bytes whose length is one input byte, so one field never
/// swallows the rest of the input (plain `Vec<u8>` takes a length from the end of the data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmallBytes(pub Vec<u8>);

impl<'a> Arbitrary<'a> for SmallBytes {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let len = usize::from(u.arbitrary::<u8>()? % 65);
        let len = len.min(u.len());
        Ok(SmallBytes(u.bytes(len)?.to_vec()))
    }

    fn size_hint(_depth: usize) -> (usize, Option<usize>) {
        (1, Some(65))
    }
}

impl SmallBytes {
    /// The bytes as a string (invalid UTF-8 replaced), keeping NULs and multi-byte chars.
    pub fn lossy(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }
}

/// A sequence that, as the last field of an input, decodes elements until the data runs out
/// (plain `Vec` spends a "continue?" byte per element, so random data yields two on average).
#[derive(Debug, Clone)]
pub struct Seq<T>(pub Vec<T>);

/// Elements decoded at most, so one execution stays short.
pub const MAX_SEQ: usize = 512;

impl<'a, T: Arbitrary<'a>> Arbitrary<'a> for Seq<T> {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let n = u.arbitrary_len::<T>()?.min(MAX_SEQ);
        (0..n)
            .map(|_| T::arbitrary(u))
            .collect::<arbitrary::Result<_>>()
            .map(Seq)
    }

    fn arbitrary_take_rest(mut u: Unstructured<'a>) -> arbitrary::Result<Self> {
        let mut v = Vec::new();
        while !u.is_empty() && v.len() < MAX_SEQ {
            v.push(T::arbitrary(&mut u)?);
        }
        Ok(Seq(v))
    }

    fn size_hint(_depth: usize) -> (usize, Option<usize>) {
        (0, None)
    }
}

/// Decodes `data` the way `libfuzzer_sys::fuzz_target!` does for a typed input
/// (`arbitrary_take_rest`), so replaying a corpus file on stable sees the same input.
pub fn decode<'a, T: Arbitrary<'a>>(data: &'a [u8]) -> Option<T> {
    if data.len() < T::size_hint(0).0 {
        return None;
    }
    T::arbitrary_take_rest(Unstructured::new(data)).ok()
}

/// Runs the named target on raw bytes (used by the replay test and the corpus generator).
/// Returns false when the bytes do not decode (libFuzzer would skip them too).
pub fn run_target(target: &str, data: &[u8]) -> bool {
    match target {
        "client_ops" => decode::<client_ops::Input>(data)
            .map(|i| client_ops::run(&i))
            .is_some(),
        "ffi" => decode::<ffi_ops::Input>(data)
            .map(|i| ffi_ops::run(&i))
            .is_some(),
        "sim" => decode::<sim_ops::Input>(data)
            .map(|i| sim_ops::run(&i))
            .is_some(),
        "redis_protocol" => decode::<redis_ops::Input>(data)
            .map(|i| redis_ops::run(&i))
            .is_some(),
        "resp" => decode::<resp_ops::Input>(data)
            .map(|i| resp_ops::run(&i))
            .is_some(),
        other => panic!("unknown fuzz target {other}"),
    }
}

/// The fuzz targets, in the order smoke.sh runs them.
pub const TARGETS: [&str; 5] = ["client_ops", "ffi", "sim", "redis_protocol", "resp"];
