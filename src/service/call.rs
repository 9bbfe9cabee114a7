//! The memory service's side of the seam: it reads one request of the memory protocol
//! ([`crate::backend::memory`]) as the host hands it over, unread, and writes its answer in the
//! shared flat value format, so a host's memory executor is a loop with no mapping of its own.
//!
//! Answers: `[GRANTED fence]`, `[HELD retry_ms|nil]`, `[FULL]`, `[RENEWED]`, `[REJECTED]`,
//! `[RELEASED]`, `[NOT_OWNER]`, `OK` (watch, unwatch), `[STATUS held fence|nil left_ms|nil
//! last_fence|nil held_for_ms|nil]`; a malformed request is an error value and changes
//! nothing; a dropped one (fault switches) has no answer.

use super::memory::{MemoryError, MemoryService, Reply};
use crate::backend::value::{FlatValue, Value, encode};

/// Most arguments of one request (the longest has four).
const MAX_ARGS: usize = 8;

/// One answer in the flat value format, or none (the request or its answer was lost).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CallAnswer {
    /// The service dropped the request or its answer: report it to the client as failed.
    pub dropped: bool,
    /// The answer's values in pre-order.
    pub values: Vec<FlatValue>,
    /// The bytes string values point into.
    pub data: Vec<u8>,
}

impl CallAnswer {
    fn of(value: &Value<'_>) -> Self {
        let mut a = CallAnswer::default();
        encode(value, &mut a.values, &mut a.data);
        a
    }

    fn dropped() -> Self {
        CallAnswer {
            dropped: true,
            ..CallAnswer::default()
        }
    }
}

fn word(w: &'static str) -> Value<'static> {
    Value::Status(w.as_bytes())
}

fn num(n: u64) -> Value<'static> {
    Value::Int(i64::try_from(n).unwrap_or(i64::MAX))
}

fn opt(n: Option<u64>) -> Value<'static> {
    n.map_or(Value::Nil, num)
}

fn text<'a>(arg: &'a [u8], what: &str) -> Result<&'a str, String> {
    std::str::from_utf8(arg).map_err(|_| format!("{what} is not UTF-8"))
}

fn ttl(arg: &[u8]) -> Result<u64, String> {
    text(arg, "ttl_ms")?
        .parse::<u64>()
        .map_err(|_| "ttl_ms is not a number".to_owned())
}

impl MemoryService {
    /// Runs one memory-protocol request from `connection` at host time `now`. Caller misuse
    /// that concerns the connection itself (an unknown id) is an `Err`; anything wrong with
    /// the request is an error *answer*, for the client to see.
    pub fn call(
        &mut self,
        connection: u64,
        now: u64,
        args: &[&[u8]],
    ) -> Result<CallAnswer, MemoryError> {
        self.faults(connection)?;
        match self.run(connection, now, args) {
            Ok(Some(value)) => Ok(CallAnswer::of(&value)),
            Ok(None) => Ok(CallAnswer::dropped()),
            Err(Ok(msg)) => Ok(CallAnswer::of(&Value::Error(
                format!("ERR {msg}").as_bytes(),
            ))),
            Err(Err(e)) => Err(e),
        }
    }

    /// `Ok(None)`: dropped. `Err(Ok(msg))`: a malformed request. `Err(Err(e))`: misuse.
    fn run(
        &mut self,
        connection: u64,
        now: u64,
        args: &[&[u8]],
    ) -> Result<Option<Value<'static>>, Result<String, MemoryError>> {
        if args.len() > MAX_ARGS {
            return Err(Ok(format!("{} arguments, at most {MAX_ARGS}", args.len())));
        }
        let (cmd, name, rest) = match args {
            [cmd, name, rest @ ..] => (*cmd, text(name, "name").map_err(Ok)?, rest),
            _ => return Err(Ok("a request is a command word and a name".to_owned())),
        };
        let refused = |e: MemoryError| match e {
            MemoryError::UnknownConnection(_) => Err(e),
            other => Ok(other.to_string()),
        };
        // Watches and status queries travel like any request: a partition or a dropped
        // request loses them, a dropped answer loses what they said.
        if matches!(cmd, b"WATCH" | b"UNWATCH" | b"STATUS") {
            let f = self.faults(connection).map_err(Err)?;
            if f.partitioned || f.drop_requests {
                return Ok(None);
            }
        }
        let lost = |svc: &mut MemoryService, v: Value<'static>| {
            (!svc.answer_lost(connection)).then_some(v)
        };
        let reply = match (cmd, rest) {
            (b"ACQUIRE", [token, t]) => {
                let t = ttl(t).map_err(Ok)?;
                self.acquire(connection, now, name, token, t)
            }
            (b"RENEW", [token, t]) => {
                let t = ttl(t).map_err(Ok)?;
                self.renew(connection, now, name, token, t)
            }
            (b"RELEASE", [token]) => self.release(connection, now, name, token),
            (b"WATCH", []) => {
                return match self.watch(connection, name) {
                    Ok(()) => Ok(lost(self, word("OK"))),
                    Err(e) => Err(refused(e)),
                };
            }
            (b"UNWATCH", []) => {
                return match self.unwatch(connection, name) {
                    Ok(()) => Ok(lost(self, word("OK"))),
                    Err(e) => Err(refused(e)),
                };
            }
            (b"STATUS", []) => {
                let st = self.status(now, name).map_err(refused)?;
                let h = st.holder.as_ref();
                return Ok(lost(
                    self,
                    Value::Array(vec![
                        word("STATUS"),
                        num(u64::from(h.is_some())),
                        opt(h.map(|h| h.fence)),
                        opt(h.map(|h| h.remaining_ms)),
                        opt(st.last_fence),
                        opt(h.map(|h| h.held_for_ns / 1_000_000)),
                    ]),
                ));
            }
            _ => {
                return Err(Ok(format!(
                    "unknown request {:?} with {} arguments",
                    String::from_utf8_lossy(cmd),
                    rest.len()
                )));
            }
        }
        .map_err(refused)?;
        Ok(match reply {
            Reply::Granted { fence, .. } => Some(Value::Array(vec![word("GRANTED"), num(fence)])),
            Reply::HeldByOther { retry_after_ms } => {
                Some(Value::Array(vec![word("HELD"), opt(retry_after_ms)]))
            }
            Reply::Full => Some(Value::Array(vec![word("FULL")])),
            Reply::Renewed => Some(Value::Array(vec![word("RENEWED")])),
            Reply::Rejected => Some(Value::Array(vec![word("REJECTED")])),
            Reply::Released => Some(Value::Array(vec![word("RELEASED")])),
            Reply::NotOwner => Some(Value::Array(vec![word("NOT_OWNER")])),
            Reply::Dropped => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::memory::{Faults, Limits};

    #[test]
    fn watches_and_status_queries_obey_the_fault_switches() {
        let mut svc = MemoryService::new(Limits::default()).unwrap();
        let c = svc.connect().unwrap();
        let calls: [&[&[u8]]; 3] = [&[b"WATCH", b"n"], &[b"UNWATCH", b"n"], &[b"STATUS", b"n"]];
        for faults in [
            Faults {
                partitioned: true,
                ..Faults::default()
            },
            Faults {
                drop_requests: true,
                ..Faults::default()
            },
            Faults {
                drop_responses: true,
                ..Faults::default()
            },
        ] {
            svc.set_faults(c, faults).unwrap();
            for args in calls {
                assert!(svc.call(c, 0, args).unwrap().dropped, "{faults:?} {args:?}");
            }
        }
        // A lost request changes nothing; a lost answer does (the watch took effect).
        assert_eq!(svc.watchers("n"), 0);
        svc.set_faults(c, Faults::default()).unwrap();
        assert!(!svc.call(c, 0, &[b"WATCH", b"n"]).unwrap().dropped);
        assert_eq!(svc.watchers("n"), 1);
    }
}
