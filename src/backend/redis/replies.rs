//! What a reply means: the shapes each script answers with, read strictly. Anything else —
//! an error reply, a value of the wrong type or range — is counted, noted in `last_error`, and
//! is a transport error for the engine, never a grant.

use super::scripts;
use super::{MAX_ERROR_TEXT, RedisProtocol, Value};
use crate::backend::LockStatus;

/// Reads the STATUS script's reply: `[fence or nil, pttl, last fence or nil]`.
pub(super) fn status_reply(reply: &Value<'_>) -> Result<LockStatus, String> {
    let fence = |v: &Value<'_>| -> Result<Option<u64>, String> {
        match v {
            Value::Nil => Ok(None),
            Value::Bulk(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|t| t.parse::<u64>().ok())
                .filter(|f| (1..=scripts::MAX_FENCE).contains(f))
                .map(Some)
                .ok_or_else(|| format!("bad fence {}", describe(v))),
            other => Err(format!("bad fence {}", describe(other))),
        }
    };
    let Value::Array(items) = reply else {
        return Err(match reply {
            Value::Error(e) => {
                String::from_utf8_lossy(&e[..e.len().min(MAX_ERROR_TEXT)]).into_owned()
            }
            other => format!("unexpected reply {}", describe(other)),
        });
    };
    let [f, Value::Int(pttl), last] = items.as_slice() else {
        return Err(format!("unexpected reply {}", describe(reply)));
    };
    let (f, last) = (fence(f)?, fence(last)?);
    let mut st = LockStatus {
        last_fencing_token: last.max(f),
        ..LockStatus::default()
    };
    match (f, *pttl) {
        (Some(f), ms) if ms > 0 => {
            st.held = true;
            st.fencing_token = Some(f);
            st.remaining_ttl_ms = Some(ms as u64);
        }
        // -2: no lock key (or it expired between the two reads).
        (_, -2) => {}
        (_, ms) => return Err(format!("lock key with pttl {ms}: not a leasehold lock")),
    }
    Ok(st)
}

/// An ACQUIRE's answer.
pub(super) enum Acquired {
    Granted {
        fence: u64,
        ttl_ms: u64,
    },
    Held {
        left_ms: Option<u64>,
        rank: Option<u64>,
    },
}

impl RedisProtocol {
    pub(super) fn acquire_reply(&mut self, reply: &Value<'_>) -> Option<Acquired> {
        if let Value::Array(items) = reply {
            match items.as_slice() {
                [Value::Int(1), Value::Int(fence), Value::Int(ttl)]
                    if *fence >= 1 && *fence as u64 <= scripts::MAX_FENCE && *ttl >= 1 =>
                {
                    return Some(Acquired::Granted {
                        fence: *fence as u64,
                        ttl_ms: *ttl as u64,
                    });
                }
                [Value::Int(0), Value::Int(left)] if *left >= -1 => {
                    return Some(Acquired::Held {
                        left_ms: u64::try_from(*left).ok(),
                        rank: None,
                    });
                }
                [Value::Int(0), Value::Int(left), Value::Int(rank)]
                    if *left >= -1 && *rank >= 0 =>
                {
                    return Some(Acquired::Held {
                        left_ms: u64::try_from(*left).ok(),
                        rank: u64::try_from(*rank).ok(),
                    });
                }
                _ => {}
            }
        }
        self.bad_reply(reply, "ACQUIRE");
        None
    }

    pub(super) fn flag_reply(&mut self, reply: &Value<'_>, what: &str) -> Option<bool> {
        match reply {
            Value::Int(1) => Some(true),
            Value::Int(0) => Some(false),
            _ => {
                self.bad_reply(reply, what);
                None
            }
        }
    }

    pub(super) fn bad_reply(&mut self, reply: &Value<'_>, what: &str) {
        if let Value::Error(msg) = reply {
            self.counters.error_replies += 1;
            self.note_error(&format!("{what} failed"), msg);
        } else {
            self.counters.garbage_replies += 1;
            self.note_error(
                &format!("unexpected reply to {what}"),
                describe(reply).as_bytes(),
            );
        }
    }
}

/// A short description of a reply for diagnostics.
pub(super) fn describe(v: &Value<'_>) -> String {
    match v {
        Value::Nil => "nil".into(),
        Value::Int(i) => format!("integer {i}"),
        Value::Bulk(b) => format!("bulk string of {} bytes", b.len()),
        Value::Status(s) => format!("status {}", String::from_utf8_lossy(&s[..s.len().min(64)])),
        Value::Error(e) => format!("error {}", String::from_utf8_lossy(&e[..e.len().min(64)])),
        Value::Array(items) => format!("array of {}", items.len()),
    }
}
