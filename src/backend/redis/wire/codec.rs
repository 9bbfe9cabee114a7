//! RESP2 and RESP3 through the `redis-protocol` crate: commands encoded as arrays of bulk
//! strings, replies decoded from bytes split at any point into owned [`Reply`] values.
//!
//! [`Decoder`] buffers what the host read, finds where each frame ends (`scan.rs`:
//! one pass, limits enforced before anything is allocated for the frame), and hands the
//! crate only complete frames. Hostile input costs at most [`Limits`]: a frame, element
//! count, nesting depth or buffer over them is a [`WireError`], never a panic or an
//! allocation the limits do not allow. After an error the stream cannot be resynchronised:
//! the decoder keeps answering with that error.

use redis_protocol::resp2::decode as resp2_decode;
use redis_protocol::resp2::types::RangeFrame as Range2;
use redis_protocol::resp3::decode::complete as resp3_decode;
use redis_protocol::resp3::types::RangeFrame as Range3;

use super::scan::{Scanner, crlf};
use crate::backend::value::Value;

/// How much one connection's decoder may hold. The defaults fit every reply the protocol
/// reads (script replies, `HELLO`, `CLUSTER SHARDS` of a large cluster) with room to spare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest frame, in bytes.
    pub max_frame_bytes: usize,
    /// Most values in one frame (each costs a [`Reply`] once decoded).
    pub max_elements: usize,
    /// Deepest nesting of aggregates (the decoder recurses once per level).
    pub max_depth: usize,
    /// Most bytes buffered at once: the frame in progress plus what one `feed` adds.
    pub max_buffered_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: 16 << 20,
            max_elements: 1 << 20,
            max_depth: 32,
            max_buffered_bytes: 32 << 20,
        }
    }
}

/// Deepest nesting [`Limits::validate`] accepts: the decoding recursion stays far from any
/// thread's stack size.
pub const MAX_DEPTH_LIMIT: usize = 64;

impl Limits {
    /// Rejects limits that would refuse every reply or let the decoder recurse too deep.
    pub fn validate(&self) -> Result<(), crate::Error> {
        if self.max_frame_bytes < 64 || self.max_elements < 16 {
            return Err(crate::Error::InvalidConfig(
                "wire limits must allow frames of 64 bytes and 16 elements",
            ));
        }
        if self.max_depth == 0 || self.max_depth > MAX_DEPTH_LIMIT {
            return Err(crate::Error::InvalidConfig(
                "wire max_depth must be in [1, 64]",
            ));
        }
        if self.max_buffered_bytes < self.max_frame_bytes {
            return Err(crate::Error::InvalidConfig(
                "wire max_buffered_bytes must be at least max_frame_bytes",
            ));
        }
        Ok(())
    }
}

/// Why bytes could not be decoded. The stream is unusable after any of them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A frame larger than [`Limits::max_frame_bytes`].
    #[error("a reply is larger than {limit} bytes")]
    FrameTooLarge {
        /// The limit.
        limit: usize,
    },
    /// A frame of more than [`Limits::max_elements`] values.
    #[error("a reply holds more than {limit} values")]
    TooManyElements {
        /// The limit.
        limit: usize,
    },
    /// Aggregates nested deeper than [`Limits::max_depth`].
    #[error("a reply nests aggregates deeper than {limit}")]
    TooDeep {
        /// The limit.
        limit: usize,
    },
    /// More than [`Limits::max_buffered_bytes`] waiting to be decoded.
    #[error("more than {limit} bytes buffered")]
    BufferFull {
        /// The limit.
        limit: usize,
    },
    /// Bytes that are not RESP.
    #[error("not RESP at byte {offset} of a reply: {what}")]
    Garbage {
        /// Offset in the frame.
        offset: usize,
        /// What was found.
        what: &'static str,
    },
    /// A frame the codec crate refused (a bad number, boolean, map key or verbatim string).
    #[error("invalid reply: {0}")]
    Invalid(String),
    /// A command that cannot be encoded.
    #[error("cannot encode the command: {0}")]
    Encode(&'static str),
}

/// One decoded reply or push message. RESP3 types keep their kind; [`Reply::as_value`] reads
/// them the way a RESP2 server would have sent them, which is what the protocol expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Nil bulk string or array (RESP2) or null (RESP3).
    Nil,
    /// Integer.
    Int(i64),
    /// Bulk (blob) string.
    Bulk(Vec<u8>),
    /// Simple string (`+OK`).
    Status(Vec<u8>),
    /// Simple or blob error, without the leading `-`.
    Error(Vec<u8>),
    /// Array.
    Array(Vec<Reply>),
    /// RESP3 map, in wire order (a repeated key keeps its first place and last value).
    Map(Vec<(Reply, Reply)>),
    /// RESP3 set, in wire order.
    Set(Vec<Reply>),
    /// RESP3 push message (`>`).
    Push(Vec<Reply>),
    /// RESP3 double, as the decimal text RESP2 would send (`inf`, `-inf` and `NaN` included).
    Double(Vec<u8>),
    /// RESP3 boolean.
    Bool(bool),
    /// RESP3 big number, its digits.
    BigNumber(Vec<u8>),
    /// RESP3 verbatim string, without its format prefix.
    Verbatim(Vec<u8>),
}

impl Reply {
    /// The reply in the form the Redis protocol reads: maps as flat arrays of keys and values,
    /// sets and pushes as arrays, doubles, big numbers and verbatim strings as bulk strings,
    /// booleans as 1 and 0.
    pub fn as_value(&self) -> Value<'_> {
        match self {
            Reply::Nil => Value::Nil,
            Reply::Int(i) => Value::Int(*i),
            Reply::Bool(b) => Value::Int(i64::from(*b)),
            Reply::Bulk(b) | Reply::Double(b) | Reply::BigNumber(b) | Reply::Verbatim(b) => {
                Value::Bulk(b)
            }
            Reply::Status(s) => Value::Status(s),
            Reply::Error(e) => Value::Error(e),
            Reply::Array(items) | Reply::Set(items) | Reply::Push(items) => {
                Value::Array(items.iter().map(Reply::as_value).collect())
            }
            Reply::Map(pairs) => Value::Array(
                pairs
                    .iter()
                    .flat_map(|(k, v)| [k.as_value(), v.as_value()])
                    .collect(),
            ),
        }
    }

    /// The bytes of a string-like reply (bulk, status, error, double, big number, verbatim).
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(b)
            | Reply::Status(b)
            | Reply::Error(b)
            | Reply::Double(b)
            | Reply::BigNumber(b)
            | Reply::Verbatim(b) => Some(b),
            _ => None,
        }
    }
}

/// Appends `argv` as a RESP command (an array of bulk strings) to `out`. Fails only for an
/// empty argument vector. Written here rather than through the codec crate: a command is
/// three lengths and the bytes, and this runs once per request on the hot path.
pub fn encode_command<A: AsRef<[u8]>>(argv: &[A], out: &mut Vec<u8>) -> Result<(), WireError> {
    if argv.is_empty() {
        return Err(WireError::Encode("a command needs at least its name"));
    }
    let body: usize = argv.iter().map(|a| a.as_ref().len() + 16).sum();
    out.reserve(body + 16);
    push_header(out, b'*', argv.len());
    for a in argv {
        let a = a.as_ref();
        push_header(out, b'$', a.len());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    Ok(())
}

/// Appends `kind`, `n` in decimal and CRLF, in one copy (of a fixed size for the short
/// lengths most arguments have).
fn push_header(out: &mut Vec<u8>, kind: u8, n: usize) {
    let digit = |d: usize| b'0' + (d % 10) as u8;
    match n {
        0..10 => return out.extend_from_slice(&[kind, digit(n), b'\r', b'\n']),
        10..100 => return out.extend_from_slice(&[kind, digit(n / 10), digit(n), b'\r', b'\n']),
        _ => {}
    }
    let mut line = [0u8; 24];
    line[22..].copy_from_slice(b"\r\n");
    let i = write_decimal(&mut line[..22], n as u64) - 1;
    line[i] = kind;
    out.extend_from_slice(&line[i..]);
}

/// Writes `n` in decimal at the end of `buf` (20 bytes hold any `u64`) and returns where the
/// digits start: no formatter and no allocation on the request path.
pub(crate) fn write_decimal(buf: &mut [u8], mut n: u64) -> usize {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return i;
        }
    }
}

/// A streaming reply decoder: [`Decoder::feed`] what was read, then call [`Decoder::next`]
/// until it answers `Ok(None)`.
#[derive(Debug)]
pub struct Decoder {
    limits: Limits,
    buf: Vec<u8>,
    /// Start of the frame being scanned in `buf` (bytes before it are decoded).
    start: usize,
    scanner: Scanner,
    /// The frame at `start` has not been tried whole (see `next`).
    fresh: bool,
    failed: Option<WireError>,
}

impl Decoder {
    /// A decoder bounded by `limits` (see [`Limits::validate`]; a depth over
    /// [`MAX_DEPTH_LIMIT`] is lowered to it, so no input can exhaust the stack).
    pub fn new(limits: Limits) -> Decoder {
        Decoder {
            limits: Limits {
                max_depth: limits.max_depth.min(MAX_DEPTH_LIMIT),
                ..limits
            },
            buf: Vec::new(),
            start: 0,
            scanner: Scanner::default(),
            fresh: true,
            failed: None,
        }
    }

    /// Buffers bytes read from the connection. Refused (and the decoder failed) when more
    /// than [`Limits::max_buffered_bytes`] would wait to be decoded.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.start > 0 && self.start * 2 >= self.buf.len() {
            // Drop decoded bytes once they are at least half the buffer (amortised O(1)).
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let waiting = self.buf.len() - self.start;
        if waiting.saturating_add(bytes.len()) > self.limits.max_buffered_bytes {
            return Err(self.fail(WireError::BufferFull {
                limit: self.limits.max_buffered_bytes,
            }));
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    /// The next complete reply, `Ok(None)` until one has arrived.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Reply>, WireError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let frame = &self.buf[self.start..];
        if frame.is_empty() {
            return Ok(None);
        }
        // A plain frame that came whole: read in one pass, no scan. Tried once per frame, so
        // a frame arriving in pieces is scanned on as usual.
        let fast = self
            .fresh
            .then(|| fast2_whole(frame, &self.limits))
            .flatten();
        self.fresh = false;
        let (decoded, len) = match fast {
            Some((reply, len)) => (Ok(reply), len),
            None => {
                let framed = match self.scanner.scan(frame, &self.limits) {
                    Ok(Some(f)) => f,
                    Ok(None) => return Ok(None),
                    Err(e) => return Err(self.fail(e)),
                };
                let bytes = &frame[..framed.len];
                let decoded = if framed.resp3 {
                    decode3(bytes)
                } else {
                    fast2(bytes).map_or_else(|| decode2(bytes), Ok)
                };
                (decoded, framed.len)
            }
        };
        match decoded {
            Ok(reply) => {
                self.start += len;
                self.scanner.reset();
                self.fresh = true;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                }
                Ok(Some(reply))
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Bytes buffered and not yet returned as a reply (a reply cut short by a close, if any).
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The error this decoder failed with, if any.
    pub fn error(&self) -> Option<&WireError> {
        self.failed.as_ref()
    }

    fn fail(&mut self, e: WireError) -> WireError {
        self.buf = Vec::new();
        self.start = 0;
        self.failed = Some(e.clone());
        e
    }
}

/// Deepest array [`fast2`] reads itself (script replies are flat).
const FAST_DEPTH: usize = 2;

/// One complete RESP2 frame of the shapes replies mostly have (integers, strings, nils and
/// shallow arrays of them), read here without the crate's parser. `None` for anything it
/// does not read exactly as the crate would (the crate then decodes it, and words its
/// errors): every value it returns is the one [`decode2`] gives.
pub(super) fn fast2(bytes: &[u8]) -> Option<Reply> {
    let mut pos = 0;
    let reply = fast2_at(bytes, &mut pos, FAST_DEPTH, &mut 0)?;
    (pos == bytes.len()).then_some(reply)
}

/// [`fast2`] on the frame at the start of `buf`, unscanned: the reply and its length if the
/// frame is complete and within every limit the scanner enforces (it would have passed it).
pub(super) fn fast2_whole(buf: &[u8], limits: &Limits) -> Option<(Reply, usize)> {
    if limits.max_depth < FAST_DEPTH {
        return None;
    }
    let buf = &buf[..buf.len().min(limits.max_frame_bytes)];
    let (mut pos, mut elements) = (0, 0);
    let reply = fast2_at(buf, &mut pos, FAST_DEPTH, &mut elements)?;
    (elements <= limits.max_elements).then_some((reply, pos))
}

fn fast2_at(bytes: &[u8], pos: &mut usize, depth: usize, elements: &mut usize) -> Option<Reply> {
    *elements += 1;
    let kind = *bytes.get(*pos)?;
    let rest = bytes.get(*pos + 1..)?;
    let line = crlf(rest)?;
    let body = &rest[..line];
    *pos += line + 3;
    match kind {
        b':' => Some(Reply::Int(int(body)?)),
        b'+' => Some(Reply::Status(body.to_vec())),
        b'-' => Some(Reply::Error(body.to_vec())),
        b'$' | b'*' if body == b"-1" => Some(Reply::Nil),
        b'$' => {
            let end = pos.checked_add(count(body)?)?;
            let data = bytes.get(*pos..end)?;
            (bytes.get(end..end.checked_add(2)?)? == b"\r\n").then_some(())?;
            *pos = end + 2;
            Some(Reply::Bulk(data.to_vec()))
        }
        b'*' if depth > 0 => {
            let n = count(body)?;
            // Each element takes at least 3 bytes of the (complete) frame.
            let mut items = Vec::with_capacity(n.min(bytes.len() / 3));
            for _ in 0..n {
                items.push(fast2_at(bytes, pos, depth - 1, elements)?);
            }
            Some(Reply::Array(items))
        }
        _ => None,
    }
}

/// An integer line as the crate reads it (`str::parse::<i64>`): short plain ones here, the
/// rest (a sign `+`, 19 digits, garbage) through that very function.
fn int(body: &[u8]) -> Option<i64> {
    let digits = body.strip_prefix(b"-").unwrap_or(body);
    if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
        return std::str::from_utf8(body).ok()?.parse().ok();
    }
    let n = digits
        .iter()
        .fold(0i64, |n, d| n * 10 + i64::from(d - b'0'));
    Some(if digits.len() < body.len() { -n } else { n })
}

/// A length prefix of digits only (the scanner refused any other).
fn count(body: &[u8]) -> Option<usize> {
    if body.is_empty() || body.len() > 18 || !body.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(body.iter().fold(0, |n, d| n * 10 + usize::from(d - b'0')))
}

/// Decodes one complete RESP2 frame (the scanner found its end and checked its limits).
pub(super) fn decode2(bytes: &[u8]) -> Result<Reply, WireError> {
    match resp2_decode::decode_range(bytes) {
        Ok(Some((frame, n))) if n == bytes.len() => from2(bytes, &frame),
        Ok(_) => Err(WireError::Invalid(
            "the codec disagrees on where a reply ends".into(),
        )),
        Err(e) => Err(invalid(&e)),
    }
}

/// Decodes one complete frame holding RESP3 types.
fn decode3(bytes: &[u8]) -> Result<Reply, WireError> {
    match resp3_decode::decode_range(bytes) {
        Ok(Some((frame, n))) if n == bytes.len() => from3(bytes, &frame),
        Ok(_) => Err(WireError::Invalid(
            "the codec disagrees on where a reply ends".into(),
        )),
        Err(e) => Err(invalid(&e)),
    }
}

fn invalid(e: &redis_protocol::error::RedisProtocolError) -> WireError {
    WireError::Invalid(e.to_string().chars().take(200).collect())
}

fn slice(bytes: &[u8], (a, b): (usize, usize)) -> Result<Vec<u8>, WireError> {
    bytes
        .get(a..b)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| WireError::Invalid("a value outside its frame".into()))
}

fn from2(bytes: &[u8], f: &Range2) -> Result<Reply, WireError> {
    Ok(match f {
        Range2::SimpleString(r) => Reply::Status(slice(bytes, *r)?),
        Range2::Error(r) => Reply::Error(slice(bytes, *r)?),
        Range2::Integer(i) => Reply::Int(*i),
        Range2::BulkString(r) => Reply::Bulk(slice(bytes, *r)?),
        Range2::Null => Reply::Nil,
        Range2::Array(items) => Reply::Array(
            items
                .iter()
                .map(|i| from2(bytes, i))
                .collect::<Result<_, _>>()?,
        ),
    })
}

fn from3(bytes: &[u8], f: &Range3) -> Result<Reply, WireError> {
    let all = |items: &mut dyn Iterator<Item = &Range3>| -> Result<Vec<Reply>, WireError> {
        items.map(|i| from3(bytes, i)).collect()
    };
    Ok(match f {
        Range3::SimpleString { data, .. } => Reply::Status(slice(bytes, *data)?),
        Range3::SimpleError { data, .. } | Range3::BlobError { data, .. } => {
            Reply::Error(slice(bytes, *data)?)
        }
        Range3::BlobString { data, .. } => Reply::Bulk(slice(bytes, *data)?),
        Range3::Number { data, .. } => Reply::Int(*data),
        Range3::Null => Reply::Nil,
        Range3::Boolean { data, .. } => Reply::Bool(*data),
        Range3::Double { data, .. } => Reply::Double(data.to_string().into_bytes()),
        Range3::BigNumber { data, .. } => Reply::BigNumber(slice(bytes, *data)?),
        Range3::VerbatimString { data, .. } => Reply::Verbatim(slice(bytes, *data)?),
        Range3::Array { data, .. } => Reply::Array(all(&mut data.iter())?),
        Range3::Set { data, .. } => Reply::Set(all(&mut data.iter())?),
        Range3::Push { data, .. } => Reply::Push(all(&mut data.iter())?),
        // The crate builds maps back to front: reverse to get wire order.
        Range3::Map { data, .. } => Reply::Map(
            data.iter()
                .rev()
                .map(|(k, v)| Ok((from3(bytes, k)?, from3(bytes, v)?)))
                .collect::<Result<_, WireError>>()?,
        ),
        Range3::Hello { .. } | Range3::ChunkedString(_) => {
            return Err(WireError::Invalid("a frame a server never sends".into()));
        }
    })
}
