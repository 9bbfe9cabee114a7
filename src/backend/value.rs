//! The flat value format every *call* answer crosses the seam in: Redis replies, SQL rows and
//! the memory service's answers. A flat list of values in pre-order (an array carries its
//! element count and its elements follow it) plus one byte buffer that string values point
//! into by offset. No pointers inside the values, so Go can pass its own memory through cgo
//! without pinning and ctypes / C++ fill it without a copy per value.
//!
//! [`decode`] turns that list into a [`Value`] tree, bounding everything first: a hostile or
//! broken answer is an error, never a panic or an allocation the input size does not justify.

/// One decoded reply value (RESP2 and the RESP3 types our scripts can produce).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value<'a> {
    /// Nil bulk string, nil array or RESP3 null.
    Nil,
    /// Integer reply.
    Int(i64),
    /// Bulk string.
    Bulk(&'a [u8]),
    /// Simple string (`+OK`).
    Status(&'a [u8]),
    /// Error reply (`-ERR ...`): the message without the leading `-`.
    Error(&'a [u8]),
    /// Array of values.
    Array(Vec<Value<'a>>),
}

/// `FlatValue::kind`: nil.
pub const KIND_NIL: u32 = 1;
/// `FlatValue::kind`: integer (`integer`).
pub const KIND_INT: u32 = 2;
/// `FlatValue::kind`: bulk string (`offset`, `len` into the data buffer).
pub const KIND_BULK: u32 = 3;
/// `FlatValue::kind`: simple string (`offset`, `len`).
pub const KIND_STATUS: u32 = 4;
/// `FlatValue::kind`: error reply (`offset`, `len`).
pub const KIND_ERROR: u32 = 5;
/// `FlatValue::kind`: array of `len` values, which follow it in pre-order.
pub const KIND_ARRAY: u32 = 6;

/// Most values one reply may hold: every reply of the protocol has at most three.
pub const MAX_VALUES: usize = 4096;
/// Deepest array nesting accepted (the protocol's replies are one level deep).
pub const MAX_DEPTH: usize = 16;
/// Largest data buffer of one reply, in bytes.
pub const MAX_DATA: usize = 1 << 20;

/// One value of the flat form (the Rust twin of the ABI's `lh_value`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlatValue {
    /// `KIND_*`.
    pub kind: u32,
    /// The integer of `KIND_INT`.
    pub integer: i64,
    /// Start of a string value in the data buffer.
    pub offset: u64,
    /// Byte length of a string value, or element count of an array.
    pub len: u64,
}

/// Why a flat reply could not be decoded. The reply is then not interpreted at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// No values were given.
    #[error("the reply has no values")]
    Empty,
    /// More than [`MAX_VALUES`] values or a data buffer over [`MAX_DATA`] bytes.
    #[error("the reply is larger than the protocol accepts")]
    TooLarge,
    /// Arrays nested deeper than [`MAX_DEPTH`].
    #[error("the reply nests arrays deeper than {MAX_DEPTH}")]
    TooDeep,
    /// A kind value this library does not know.
    #[error("value {index} has unknown kind {kind}")]
    UnknownKind {
        /// Position in the flat list.
        index: usize,
        /// The kind given.
        kind: u32,
    },
    /// A string reaches past the end of the data buffer.
    #[error("value {index} points outside the data buffer")]
    OutOfBounds {
        /// Position in the flat list.
        index: usize,
    },
    /// An array announces more elements than values follow it.
    #[error("value {index} announces more elements than follow it")]
    Truncated {
        /// Position in the flat list.
        index: usize,
    },
    /// Values are left after the first complete value.
    #[error("{extra} values follow the complete reply")]
    Trailing {
        /// How many.
        extra: usize,
    },
}

/// Decodes a flat reply. Work and memory are linear in `values.len()` (at most [`MAX_VALUES`]).
pub fn decode<'a>(values: &[FlatValue], data: &'a [u8]) -> Result<Value<'a>, DecodeError> {
    if values.is_empty() {
        return Err(DecodeError::Empty);
    }
    if values.len() > MAX_VALUES || data.len() > MAX_DATA {
        return Err(DecodeError::TooLarge);
    }
    // Open arrays: their elements so far and how many are still to come.
    let mut stack: Vec<(Vec<Value<'a>>, usize)> = Vec::new();
    for (index, v) in values.iter().enumerate() {
        let leaf = match v.kind {
            KIND_NIL => Value::Nil,
            KIND_INT => Value::Int(v.integer),
            KIND_BULK | KIND_STATUS | KIND_ERROR => {
                let s =
                    string_at(data, v.offset, v.len).ok_or(DecodeError::OutOfBounds { index })?;
                match v.kind {
                    KIND_BULK => Value::Bulk(s),
                    KIND_STATUS => Value::Status(s),
                    _ => Value::Error(s),
                }
            }
            KIND_ARRAY => {
                let remaining = values.len() - index - 1;
                let n = usize::try_from(v.len)
                    .ok()
                    .filter(|&n| n <= remaining)
                    .ok_or(DecodeError::Truncated { index })?;
                if n > 0 {
                    if stack.len() >= MAX_DEPTH {
                        return Err(DecodeError::TooDeep);
                    }
                    // `n` is bounded by the values that follow, so this cannot over-allocate.
                    stack.push((Vec::with_capacity(n), n));
                    continue;
                }
                Value::Array(Vec::new())
            }
            kind => return Err(DecodeError::UnknownKind { index, kind }),
        };
        // Attach the finished value, closing every array it completes.
        let mut done = leaf;
        loop {
            let Some((items, left)) = stack.last_mut() else {
                let extra = values.len() - index - 1;
                return if extra == 0 {
                    Ok(done)
                } else {
                    Err(DecodeError::Trailing { extra })
                };
            };
            items.push(done);
            *left -= 1;
            if *left > 0 {
                break;
            }
            let (items, _) = stack.pop().unwrap_or_default();
            done = Value::Array(items);
        }
    }
    // The values ran out inside an open array.
    Err(DecodeError::Truncated {
        index: values.len() - 1,
    })
}

fn string_at(data: &[u8], offset: u64, len: u64) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    data.get(start..end)
}

/// Flattens a value into the host form (what tests and hosts written in Rust hand over).
pub fn encode(value: &Value<'_>, values: &mut Vec<FlatValue>, data: &mut Vec<u8>) {
    let mut string = |kind: u32, s: &[u8], values: &mut Vec<FlatValue>| {
        values.push(FlatValue {
            kind,
            integer: 0,
            offset: data.len() as u64,
            len: s.len() as u64,
        });
        data.extend_from_slice(s);
    };
    match value {
        Value::Nil => values.push(FlatValue {
            kind: KIND_NIL,
            ..FlatValue::default()
        }),
        Value::Int(i) => values.push(FlatValue {
            kind: KIND_INT,
            integer: *i,
            ..FlatValue::default()
        }),
        Value::Bulk(s) => string(KIND_BULK, s, values),
        Value::Status(s) => string(KIND_STATUS, s, values),
        Value::Error(s) => string(KIND_ERROR, s, values),
        Value::Array(items) => {
            values.push(FlatValue {
                kind: KIND_ARRAY,
                len: items.len() as u64,
                ..FlatValue::default()
            });
            for item in items {
                encode(item, values, data);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(v: Value<'_>) {
        let (mut values, mut data) = (Vec::new(), Vec::new());
        encode(&v, &mut values, &mut data);
        assert_eq!(decode(&values, &data).unwrap(), v);
    }

    #[test]
    fn values_round_trip() {
        round_trip(Value::Nil);
        round_trip(Value::Int(-7));
        round_trip(Value::Error(b"NOSCRIPT No matching script"));
        round_trip(Value::Array(vec![
            Value::Int(1),
            Value::Array(vec![]),
            Value::Array(vec![Value::Bulk(b"x"), Value::Status(b"OK")]),
            Value::Nil,
        ]));
    }

    #[test]
    fn hostile_lists_are_errors() {
        let arr = |n| FlatValue {
            kind: KIND_ARRAY,
            len: n,
            ..FlatValue::default()
        };
        let int = FlatValue {
            kind: KIND_INT,
            ..FlatValue::default()
        };
        assert_eq!(decode(&[], b""), Err(DecodeError::Empty));
        assert_eq!(
            decode(&[arr(u64::MAX)], b""),
            Err(DecodeError::Truncated { index: 0 })
        );
        assert_eq!(
            decode(&[arr(2), int], b""),
            Err(DecodeError::Truncated { index: 0 })
        );
        assert_eq!(
            decode(&[arr(2), arr(1), int], b""),
            Err(DecodeError::Truncated { index: 2 })
        );
        assert_eq!(
            decode(&[int, int], b""),
            Err(DecodeError::Trailing { extra: 1 })
        );
        let deep: Vec<FlatValue> = (0..40).map(|_| arr(1)).chain([int]).collect();
        assert_eq!(decode(&deep, b""), Err(DecodeError::TooDeep));
        let bulk = |offset, len| FlatValue {
            kind: KIND_BULK,
            integer: 0,
            offset,
            len,
        };
        assert!(decode(&[bulk(0, 3)], b"abc").is_ok());
        for (o, l) in [(1, 3), (u64::MAX, 2), (2, u64::MAX), (4, 0)] {
            assert_eq!(
                decode(&[bulk(o, l)], b"abc"),
                Err(DecodeError::OutOfBounds { index: 0 })
            );
        }
        let unknown = FlatValue {
            kind: 99,
            ..FlatValue::default()
        };
        assert_eq!(
            decode(&[unknown], b""),
            Err(DecodeError::UnknownKind { index: 0, kind: 99 })
        );
        assert_eq!(
            decode(&vec![int; MAX_VALUES + 1], b""),
            Err(DecodeError::TooLarge)
        );
    }
}
