//! Frame boundaries before decoding. The codec crate decodes a frame recursively and, given
//! an incomplete frame, starts again from its first byte on the next attempt; this scanner
//! finds where a frame ends in one resumable pass (linear in the bytes however they are
//! split), enforces the size, element and nesting limits on the way, and hands the crate
//! only complete frames within them. It reads lengths and line ends; the crate reads values.

use super::codec::{Limits, WireError};

/// Longest length prefix accepted (`-` and 19 digits).
const MAX_LEN_DIGITS: usize = 20;

/// A finished scan of one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Framed {
    /// Bytes of the frame from the start of the buffer.
    pub len: usize,
    /// The frame holds a type only RESP3 has (decode it as RESP3, else as RESP2).
    pub resp3: bool,
}

/// Where the scan of the current frame stands; kept across calls so no byte is read twice.
#[derive(Debug, Default)]
pub(super) struct Scanner {
    /// Next element header, relative to the frame start.
    pos: usize,
    /// Bytes from `pos` already known to hold no line end (a long line arriving in pieces).
    line_checked: usize,
    /// Elements still to come in each open aggregate, innermost last.
    open: Vec<u64>,
    elements: usize,
    resp3: bool,
}

impl Scanner {
    /// Scans on from where the last call stopped. `buf` starts at the frame's first byte and
    /// only ever grows between calls until the frame is complete ([`Scanner::reset`]).
    pub(super) fn scan(
        &mut self,
        buf: &[u8],
        limits: &Limits,
    ) -> Result<Option<Framed>, WireError> {
        // Only the first `max_frame_bytes` are ever looked at, so every verdict depends on the
        // same bytes whether they came at once or in pieces.
        let truncated = buf.len() > limits.max_frame_bytes;
        let buf = &buf[..buf.len().min(limits.max_frame_bytes)];
        loop {
            let Some(&kind) = buf.get(self.pos) else {
                return self.incomplete(buf, truncated, limits);
            };
            if !b"+-:_,#($!=*~>%|".contains(&kind) {
                return Err(garbage(
                    self.pos,
                    if kind == b'?' || kind == b';' || kind == b'.' {
                        "a streamed (chunked) RESP3 value, which Redis does not send"
                    } else {
                        "a byte that starts no RESP type"
                    },
                ));
            }
            let Some(line_end) = self.line_end(buf) else {
                return self.incomplete(buf, truncated, limits);
            };
            let body = &buf[self.pos + 1..line_end];
            let mut next = line_end + 2;
            // Children this element opens (0: a leaf).
            let mut children = 0u64;
            match kind {
                b'$' | b'!' | b'=' => {
                    self.resp3 |= kind != b'$';
                    match length(body, kind == b'$', self.pos)? {
                        None => {}
                        Some(n) => {
                            let end = usize::try_from(n)
                                .ok()
                                .and_then(|n| next.checked_add(n))
                                .filter(|&e| e <= limits.max_frame_bytes.saturating_sub(2))
                                .ok_or(WireError::FrameTooLarge {
                                    limit: limits.max_frame_bytes,
                                })?;
                            if buf.len() < end + 2 {
                                return self.incomplete(buf, truncated, limits);
                            }
                            if &buf[end..end + 2] != b"\r\n" {
                                return Err(garbage(end, "a string not followed by CRLF"));
                            }
                            next = end + 2;
                        }
                    }
                }
                b'*' | b'~' | b'>' | b'%' | b'|' => {
                    self.resp3 |= kind != b'*';
                    if let Some(n) = length(body, kind == b'*', self.pos)? {
                        children = match kind {
                            b'%' => n.saturating_mul(2),
                            // Attributes, then the value they describe.
                            b'|' => n.saturating_mul(2).saturating_add(1),
                            _ => n,
                        };
                    }
                }
                // A line: simple string, error or integer (RESP2), or a RESP3 scalar.
                _ => self.resp3 |= !matches!(kind, b'+' | b'-' | b':'),
            }
            if next > limits.max_frame_bytes {
                return Err(WireError::FrameTooLarge {
                    limit: limits.max_frame_bytes,
                });
            }
            self.elements += 1;
            if self.elements > limits.max_elements {
                return Err(WireError::TooManyElements {
                    limit: limits.max_elements,
                });
            }
            self.pos = next;
            self.line_checked = 0;
            if children > 0 {
                // Every element takes at least 3 bytes: a count beyond what the frame limit
                // can hold is refused now rather than waited for.
                if children > (limits.max_frame_bytes / 3) as u64 {
                    return Err(WireError::FrameTooLarge {
                        limit: limits.max_frame_bytes,
                    });
                }
                if children > (limits.max_elements - self.elements) as u64 {
                    return Err(WireError::TooManyElements {
                        limit: limits.max_elements,
                    });
                }
                if self.open.len() >= limits.max_depth {
                    return Err(WireError::TooDeep {
                        limit: limits.max_depth,
                    });
                }
                self.open.push(children);
                continue;
            }
            // A leaf (or empty aggregate) completes its parent, which may complete its own.
            loop {
                let Some(left) = self.open.last_mut() else {
                    return Ok(Some(Framed {
                        len: self.pos,
                        resp3: self.resp3,
                    }));
                };
                *left -= 1;
                if *left > 0 {
                    break;
                }
                self.open.pop();
            }
        }
    }

    /// Forgets the frame just returned, ready for the next one.
    pub(super) fn reset(&mut self) {
        self.pos = 0;
        self.line_checked = 0;
        self.open.clear();
        self.elements = 0;
        self.resp3 = false;
    }

    /// The position of the CRLF ending the header line at `pos`, if it has arrived.
    fn line_end(&mut self, buf: &[u8]) -> Option<usize> {
        let from = self.pos + 1 + self.line_checked;
        let rest = buf.get(from..)?;
        match crlf(rest) {
            Some(i) => Some(from + i),
            None => {
                // The last byte may be the CR of a CRLF still to come.
                self.line_checked += rest.len().saturating_sub(1);
                None
            }
        }
    }

    fn incomplete(
        &self,
        buf: &[u8],
        truncated: bool,
        limits: &Limits,
    ) -> Result<Option<Framed>, WireError> {
        // A length prefix cannot be this long (a simple string, error or number line can).
        if self.line_checked > MAX_LEN_DIGITS
            && buf.get(self.pos).is_some_and(|k| b"$!=*~>%|".contains(k))
        {
            return Err(garbage(self.pos, "a malformed length"));
        }
        if truncated {
            return Err(WireError::FrameTooLarge {
                limit: limits.max_frame_bytes,
            });
        }
        Ok(None)
    }
}

/// Reads a length prefix: `None` for RESP2's nil (`-1`, where `nil_ok`), else the count.
fn length(body: &[u8], nil_ok: bool, at: usize) -> Result<Option<u64>, WireError> {
    if nil_ok && body == b"-1" {
        return Ok(None);
    }
    if body == b"?" {
        return Err(garbage(
            at,
            "a streamed (chunked) RESP3 value, which Redis does not send",
        ));
    }
    if body.is_empty() || body.len() > MAX_LEN_DIGITS || !body.iter().all(u8::is_ascii_digit) {
        return Err(garbage(at, "a malformed length"));
    }
    // Digits only: a decimal overflow is the one way to fail.
    body.iter()
        .try_fold(0u64, |n, d| {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })
        .map(Some)
        .ok_or_else(|| garbage(at, "a malformed length"))
}

/// Where the first CRLF of `bytes` starts.
pub(super) fn crlf(bytes: &[u8]) -> Option<usize> {
    let mut from = 0;
    loop {
        let cr = from + bytes.get(from..)?.iter().position(|&b| b == b'\r')?;
        if bytes.get(cr + 1) == Some(&b'\n') {
            return Some(cr);
        }
        from = cr + 1;
    }
}

fn garbage(offset: usize, what: &'static str) -> WireError {
    WireError::Garbage { offset, what }
}
