//! One argument of a Redis command, as the protocol keeps it until its reply (a retry after
//! `NOSCRIPT`, a reconnect or a Cluster redirect sends it again). Most arguments are short
//! (keys, a token in hex, a TTL), so they live inline: an uncontended acquire + release would
//! otherwise make about fifteen small allocations.

use std::fmt;
use std::ops::Deref;

use super::wire::codec::write_decimal;

/// Bytes an [`Arg`] keeps inline: a key of a name up to about 35 bytes, a token in hex, any
/// integer.
pub const INLINE_ARG_LEN: usize = 46;

/// One argument of a request: a constant, short bytes inline, or a buffer of its own.
#[derive(Clone)]
pub enum Arg {
    /// A constant (command names, script hashes' text, fixed flags).
    Static(&'static [u8]),
    /// Up to [`INLINE_ARG_LEN`] bytes.
    Inline {
        /// How many of `bytes` are the argument.
        len: u8,
        /// The argument, then zeros.
        bytes: [u8; INLINE_ARG_LEN],
    },
    /// Anything longer.
    Owned(Vec<u8>),
}

impl Arg {
    /// `parts` joined: inline when they fit, in one allocation otherwise.
    pub fn concat(parts: &[&[u8]]) -> Arg {
        let n: usize = parts.iter().map(|p| p.len()).sum();
        match u8::try_from(n) {
            Ok(len) if n <= INLINE_ARG_LEN => {
                let mut bytes = [0u8; INLINE_ARG_LEN];
                let mut at = 0;
                for p in parts {
                    let end = at + p.len();
                    if let Some(dst) = bytes.get_mut(at..end) {
                        dst.copy_from_slice(p);
                    }
                    at = end;
                }
                Arg::Inline { len, bytes }
            }
            _ => Arg::Owned(parts.concat()),
        }
    }

    /// A copy of `b` (inline when it fits).
    pub fn copy(b: &[u8]) -> Arg {
        Arg::concat(&[b])
    }

    /// `n` in decimal, with no formatter and no allocation.
    pub fn decimal(n: u64) -> Arg {
        let mut digits = [0u8; 20];
        let at = write_decimal(&mut digits, n);
        Arg::copy(&digits[at..])
    }

    /// The argument's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Arg::Static(b) => b,
            Arg::Inline { len, bytes } => bytes.get(..usize::from(*len)).unwrap_or_default(),
            Arg::Owned(v) => v,
        }
    }
}

impl Deref for Arg {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<[u8]> for Arg {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl From<Vec<u8>> for Arg {
    fn from(v: Vec<u8>) -> Arg {
        Arg::Owned(v)
    }
}

impl PartialEq for Arg {
    fn eq(&self, other: &Arg) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Arg {}

impl PartialEq<[u8]> for Arg {
    fn eq(&self, other: &[u8]) -> bool {
        self.as_bytes() == other
    }
}

/// Prints the bytes, as the slice does.
impl fmt::Debug for Arg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_bytes(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_writes_what_to_string_writes() {
        for n in [0, 7, 10, 30_000, 60_000, 1_700_000_000_000_001, u64::MAX] {
            assert_eq!(Arg::decimal(n).as_bytes(), n.to_string().as_bytes());
        }
    }

    #[test]
    fn short_arguments_live_inline_and_long_ones_in_one_buffer() {
        let fits = [b'k'; INLINE_ARG_LEN];
        let a = Arg::concat(&[&fits[..10], &fits[10..]]);
        assert!(matches!(a, Arg::Inline { .. }));
        assert_eq!(&a[..], &fits[..]);
        let long = [b'x'; INLINE_ARG_LEN + 1];
        let b = Arg::concat(&[b"", &long[..5], &long[5..]]);
        assert!(matches!(b, Arg::Owned(_)));
        assert_eq!(&b[..], &long[..]);
        assert_eq!(Arg::concat(&[]).as_bytes(), b"");
        assert_eq!(Arg::copy(b"lh:{jobs}"), Arg::Owned(b"lh:{jobs}".to_vec()));
        assert_eq!(
            format!("{:?}", Arg::Static(b"ab")),
            format!("{:?}", &b"ab"[..])
        );
    }
}
