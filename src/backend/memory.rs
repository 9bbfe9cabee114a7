//! The memory service spoken as a client protocol, so a client talks to the reference service
//! through the same seam as to every other backend and the hosts have one execution model.
//!
//! A request is a *call*: an argument vector the host hands, unread, to the service it holds
//! (`lh_memory_service_call`), whose answer comes back in the shared flat value format
//! ([`crate::backend::value`]). Release notifications for watched names come back as messages
//! whose channel is the name. The words of the wire are the service's
//! ([`crate::service::call`]): `ACQUIRE name token ttl_ms`, `RENEW name token ttl_ms`,
//! `RELEASE name token`, `WATCH name`, `UNWATCH name`, `STATUS name`.

use std::collections::BTreeSet;

use super::LockStatus;
use super::outbox::{MS, NEVER, Outbox};
use super::value::Value;
use crate::{
    AcquireResult, Client, Command, Event, LockName, Output, ReleaseResult, RenewResult,
    RequestId, Token,
};

/// How long an unanswered request is remembered (the engine timed it out long before).
const FORGET_AFTER_NS: u64 = 120_000 * MS;
const MAX_ERROR_TEXT: usize = 512;

/// A request for the host: hand `args` to the service on its connection and answer `id` with
/// the service's values, or as failed when the service dropped it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// Request id (never reused, never 0).
    pub id: u64,
    /// The argument vector, command word first.
    pub args: &'a [Vec<u8>],
}

/// What the protocol saw, for diagnostics and tests (monotonic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryCounters {
    /// Requests emitted.
    pub requests: u64,
    /// Error answers (a request the service refused as malformed).
    pub error_replies: u64,
    /// Answers of a shape the request cannot have.
    pub garbage_replies: u64,
    /// Answers and failures for unknown or already answered ids.
    pub stale_replies: u64,
    /// Requests reported failed (dropped by the service, or by the host).
    pub transport_failures: u64,
    /// Release notifications that woke a waiting name.
    pub wakeups: u64,
    /// Notifications for names nobody here waits for.
    pub ignored_messages: u64,
}

#[derive(Debug)]
enum Op {
    Acquire { req: RequestId, ttl_ms: u64 },
    Renew { req: RequestId },
    Release { req: RequestId },
    Watch,
    Unwatch,
    Status { id: u64 },
}

#[derive(Debug)]
struct Pending {
    op: Op,
    args: Vec<Vec<u8>>,
}

/// The memory protocol of one client core. See the module docs.
#[derive(Debug, Default)]
pub struct MemoryProtocol {
    out: Outbox<Pending>,
    watched: BTreeSet<LockName>,
    counters: MemoryCounters,
}

fn word_args(word: &str, name: &str, rest: &[&[u8]]) -> Vec<Vec<u8>> {
    let mut args = vec![word.as_bytes().to_vec(), name.as_bytes().to_vec()];
    args.extend(rest.iter().map(|a| a.to_vec()));
    args
}

impl MemoryProtocol {
    /// Creates the protocol for one core.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counters.
    pub fn counters(&self) -> MemoryCounters {
        self.counters
    }

    /// The last malformed or refused answer ("" if none).
    pub fn last_error(&self) -> &str {
        self.out.last_error()
    }

    /// The next request to hand to the service; it borrows this object until its next
    /// mutation.
    pub fn poll_request(&mut self, core: &mut Client) -> Option<Request<'_>> {
        self.pump(core);
        let (id, p) = self.out.next_ready()?;
        Some(Request { id, args: &p.args })
    }

    /// The next event for the application.
    pub fn poll_event(&mut self, core: &mut Client) -> Option<Event> {
        self.pump(core);
        self.out.pop_event()
    }

    /// The next finished status query.
    pub fn poll_status(&mut self) -> Option<super::StatusAnswer> {
        self.out.pop_status()
    }

    /// When [`Self::handle_timeout`] must be called at the latest.
    pub fn poll_timeout(&mut self, core: &mut Client) -> Option<u64> {
        self.pump(core);
        let t = core
            .poll_timeout()
            .unwrap_or(NEVER)
            .min(self.out.next_expiry().unwrap_or(NEVER));
        (t != NEVER).then_some(t)
    }

    /// Time passed: runs the engine's timers and forgets requests never answered.
    pub fn handle_timeout(&mut self, core: &mut Client, now: u64) {
        core.handle_timeout(now);
        let now = core.now();
        while let Some((_, p)) = self.out.pop_expired(now) {
            self.fail(core, now, p.op, "the host never answered the request");
        }
        self.pump(core);
    }

    /// Asks the service about `name`; the answer comes out of [`Self::poll_status`].
    pub fn request_status(
        &mut self,
        core: &mut Client,
        now: u64,
        name: &str,
    ) -> Result<u64, crate::Error> {
        crate::validate_name(name)?;
        core.handle_timeout(now);
        let id = self.out.next_id();
        self.push(Op::Status { id }, word_args("STATUS", name, &[]), now);
        Ok(id)
    }

    /// The service's answer to request `id`. Unknown and already answered ids are counted
    /// and ignored.
    pub fn handle_reply(&mut self, core: &mut Client, now: u64, id: u64, reply: &Value<'_>) {
        self.pump(core);
        core.handle_timeout(now);
        let now = core.now();
        let Some(p) = self.out.take(id) else {
            self.counters.stale_replies += 1;
            self.pump(core);
            return;
        };
        if let Value::Error(e) = reply {
            self.counters.error_replies += 1;
            let msg = format!("service refused the request: {}", String::from_utf8_lossy(e));
            self.out.note_error(&msg, MAX_ERROR_TEXT);
            self.fail(core, now, p.op, &msg);
            self.pump(core);
            return;
        }
        let read = read_answer(&p.op, reply);
        match (p.op, read) {
            (Op::Acquire { req, .. }, Some(Answer::Acquire(r))) => {
                let _ = core.handle_acquire_result(now, req, r);
            }
            (Op::Renew { req }, Some(Answer::Renew(r))) => {
                let _ = core.handle_renew_result(now, req, r);
            }
            (Op::Release { req }, Some(Answer::Release(r))) => {
                let _ = core.handle_release_result(now, req, r);
            }
            (Op::Status { id }, Some(Answer::Status(st))) => self.out.answer_status((id, Ok(st))),
            (Op::Watch | Op::Unwatch, Some(Answer::Ok)) => {}
            (op, _) => {
                self.counters.garbage_replies += 1;
                let msg = format!("unexpected answer {reply:?} to {op:?}");
                self.out.note_error(&msg, MAX_ERROR_TEXT);
                self.fail(core, now, op, &msg);
            }
        }
        self.pump(core);
    }

    /// Request `id` got no answer (the service dropped it, or the host gave up).
    pub fn handle_failed(&mut self, core: &mut Client, now: u64, id: u64, message: &str) {
        self.pump(core);
        core.handle_timeout(now);
        let now = core.now();
        let Some(p) = self.out.take(id) else {
            self.counters.stale_replies += 1;
            self.pump(core);
            return;
        };
        self.counters.transport_failures += 1;
        let msg = format!("no answer: {message}");
        self.out.note_error(&msg, MAX_ERROR_TEXT);
        self.fail(core, now, p.op, &msg);
        self.pump(core);
    }

    /// A release notification: `channel` is the released name. One nobody here waits for is
    /// counted and ignored.
    pub fn handle_message(&mut self, core: &mut Client, now: u64, channel: &[u8]) {
        self.pump(core);
        core.handle_timeout(now);
        let now = core.now();
        match std::str::from_utf8(channel)
            .ok()
            .filter(|n| self.watched.contains(*n))
        {
            Some(name) => {
                self.counters.wakeups += 1;
                let _ = core.handle_released(now, name);
            }
            None => self.counters.ignored_messages += 1,
        }
        self.pump(core);
    }

    /// The host connected to the service anew: watches are asked for again, and each waiting
    /// name is tried once (a release while disconnected reached nobody).
    pub fn handle_reconnect(&mut self, core: &mut Client, now: u64) {
        self.pump(core);
        core.handle_timeout(now);
        let now = core.now();
        let names: Vec<LockName> = self.watched.iter().cloned().collect();
        for name in names {
            self.push(Op::Watch, word_args("WATCH", &name, &[]), now);
            let _ = core.handle_released(now, &name);
        }
        self.pump(core);
    }

    fn pump(&mut self, core: &mut Client) {
        while let Some(out) = core.poll_output() {
            match out {
                Output::Event(ev) => self.out.push_event(ev),
                Output::Command(cmd) => self.on_command(core.now(), cmd),
            }
        }
    }

    fn on_command(&mut self, now: u64, cmd: Command) {
        let hex = |t: &Token| t.to_hex().to_vec();
        match cmd {
            Command::Acquire {
                request,
                name,
                token,
                ttl_ms,
                ..
            } => {
                let args = word_args(
                    "ACQUIRE",
                    &name,
                    &[&hex(&token), ttl_ms.to_string().as_bytes()],
                );
                self.push(
                    Op::Acquire {
                        req: request,
                        ttl_ms,
                    },
                    args,
                    now,
                );
            }
            Command::Renew {
                request,
                name,
                token,
                ttl_ms,
                ..
            } => {
                let args = word_args(
                    "RENEW",
                    &name,
                    &[&hex(&token), ttl_ms.to_string().as_bytes()],
                );
                self.push(Op::Renew { req: request }, args, now);
            }
            Command::Release {
                request,
                name,
                token,
                ..
            } => {
                let args = word_args("RELEASE", &name, &[&hex(&token)]);
                self.push(Op::Release { req: request }, args, now);
            }
            Command::Watch { name } => {
                let args = word_args("WATCH", &name, &[]);
                self.watched.insert(name);
                self.push(Op::Watch, args, now);
            }
            Command::Unwatch { name } => {
                let args = word_args("UNWATCH", &name, &[]);
                self.watched.remove(&name);
                self.push(Op::Unwatch, args, now);
            }
        }
    }

    fn push(&mut self, op: Op, args: Vec<Vec<u8>>, now: u64) {
        self.counters.requests += 1;
        self.out
            .push(Pending { op, args }, now.saturating_add(FORGET_AFTER_NS));
    }

    fn fail(&mut self, core: &mut Client, now: u64, op: Op, detail: &str) {
        match op {
            Op::Acquire { req, .. } => {
                let _ = core.handle_acquire_result(now, req, AcquireResult::TransportError);
            }
            Op::Renew { req } => {
                let _ = core.handle_renew_result(now, req, RenewResult::TransportError);
            }
            Op::Release { req } => {
                let _ = core.handle_release_result(now, req, ReleaseResult::TransportError);
            }
            Op::Status { id } => self.out.answer_status((id, Err(detail.to_owned()))),
            // A lost watch is asked for again at the next reconnect; the engine's waiters
            // also retry by their own backoff meanwhile.
            Op::Watch | Op::Unwatch => {}
        }
    }
}

enum Answer {
    Acquire(AcquireResult<'static>),
    Renew(RenewResult),
    Release(ReleaseResult),
    Status(LockStatus),
    Ok,
}

fn int(v: &Value<'_>) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

/// Reads one answer as the service writes it (`[word, numbers…]`); `None` for any other shape.
fn read_answer(op: &Op, reply: &Value<'_>) -> Option<Answer> {
    let Value::Array(items) = reply else {
        return matches!((op, reply), (Op::Watch | Op::Unwatch, Value::Status(b"OK")))
            .then_some(Answer::Ok);
    };
    let (Some(Value::Status(word)), rest) = (items.first(), items.get(1..).unwrap_or(&[])) else {
        return None;
    };
    Some(match (op, *word, rest) {
        (Op::Acquire { ttl_ms, .. }, b"GRANTED", [fence]) => {
            Answer::Acquire(AcquireResult::Granted {
                fencing_token: int(fence).filter(|f| *f > 0)?,
                ttl_ms: *ttl_ms,
                backend_data: &[],
            })
        }
        (Op::Acquire { .. }, b"HELD", [retry]) => Answer::Acquire(AcquireResult::HeldByOther {
            retry_after_ms: match retry {
                Value::Nil => None,
                v => Some(int(v)?),
            },
        }),
        (Op::Acquire { .. }, b"FULL", []) => Answer::Acquire(AcquireResult::TransportError),
        (Op::Renew { .. }, b"RENEWED", []) => Answer::Renew(RenewResult::Renewed),
        (Op::Renew { .. }, b"REJECTED", []) => Answer::Renew(RenewResult::Rejected),
        (Op::Release { .. }, b"RELEASED", []) => Answer::Release(ReleaseResult::Released),
        (Op::Release { .. }, b"NOT_OWNER", []) => Answer::Release(ReleaseResult::NotOwner),
        (Op::Status { .. }, b"STATUS", [held, fence, left, last, held_for]) => {
            let held = int(held)? != 0;
            let opt = |v: &Value<'_>| match v {
                Value::Nil => Some(None),
                v => int(v).map(Some),
            };
            Answer::Status(LockStatus {
                held,
                fencing_token: opt(fence)?,
                remaining_ttl_ms: opt(left)?,
                last_fencing_token: opt(last)?,
                holder_pid: None,
                holder_host: None,
                held_for_ms: opt(held_for)?,
            })
        }
        _ => return None,
    })
}
