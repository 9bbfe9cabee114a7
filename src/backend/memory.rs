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
    AcquireResult, Client, Command, Event, LockName, Output, ReleaseResult, RenewResult, RequestId,
    Token,
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
    Watch { name: LockName },
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

    /// Whether [`Self::poll_request`] may give a request, taking and moving nothing.
    pub fn has_request(&self, core: &Client) -> bool {
        self.out.has_request(core)
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
            let msg = format!(
                "service refused the request: {}",
                String::from_utf8_lossy(e)
            );
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
            (Op::Watch { name }, Some(Answer::Ok)) => {
                // A release between the "held" answer and this watch reached nobody: try once.
                if self.watched.contains(&name) {
                    let _ = core.handle_released(now, &name);
                }
            }
            (Op::Unwatch, Some(Answer::Ok)) => {}
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
    /// name is tried once when its watch took effect (a release while disconnected reached
    /// nobody).
    pub fn handle_reconnect(&mut self, core: &mut Client, now: u64) {
        self.pump(core);
        core.handle_timeout(now);
        let now = core.now();
        let names: Vec<LockName> = self.watched.iter().cloned().collect();
        for name in names {
            let args = word_args("WATCH", &name, &[]);
            self.push(Op::Watch { name }, args, now);
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
                self.watched.insert(name.clone());
                self.push(Op::Watch { name }, args, now);
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
            Op::Watch { .. } | Op::Unwatch => {}
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
        return matches!(
            (op, reply),
            (Op::Watch { .. } | Op::Unwatch, Value::Status(b"OK"))
        )
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::memory::{Limits, MemoryService};
    use crate::{AcquireOptions, Config};

    const MS_NS: u64 = 1_000_000;

    /// One client of `svc` on `conn`: runs every pending request through the service, as a
    /// host's memory executor does, and delivers its release notifications.
    fn drive(
        p: &mut MemoryProtocol,
        core: &mut Client,
        svc: &mut MemoryService,
        conn: u64,
        now: u64,
    ) {
        while let Some(req) = p.poll_request(core) {
            let id = req.id;
            let args: Vec<Vec<u8>> = req.args.to_vec();
            let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let answer = svc.call(conn, now, &refs).unwrap();
            if answer.dropped {
                p.handle_failed(core, now, id, "dropped");
            } else {
                let v = crate::backend::value::decode(&answer.values, &answer.data).unwrap();
                p.handle_reply(core, now, id, &v);
            }
            while let Some(name) = svc.poll_released(conn).unwrap() {
                p.handle_message(core, now, name.as_bytes());
            }
        }
    }

    fn events(p: &mut MemoryProtocol, core: &mut Client) -> Vec<Event> {
        std::iter::from_fn(|| p.poll_event(core)).collect()
    }

    #[test]
    fn grant_contention_wake_and_status_through_the_service() {
        let mut svc = MemoryService::new(Limits::default()).unwrap();
        let (ca, cb) = (svc.connect().unwrap(), svc.connect().unwrap());
        let mut a = Client::new(Config::default(), &[1; 32]).unwrap();
        let mut b = Client::new(Config::default(), &[2; 32]).unwrap();
        let (mut pa, mut pb) = (MemoryProtocol::new(), MemoryProtocol::new());

        let la = a.acquire(0, "job", AcquireOptions::new(5_000)).unwrap();
        drive(&mut pa, &mut a, &mut svc, ca, 0);
        let got = events(&mut pa, &mut a);
        assert!(
            matches!(got[..], [Event::Acquired { lease, fencing_token: 1, .. }] if lease == la)
        );

        let mut wait = AcquireOptions::new(5_000);
        wait.wait_ns = 10_000 * MS_NS;
        let lb = b.acquire(MS_NS, "job", wait).unwrap();
        drive(&mut pb, &mut b, &mut svc, cb, MS_NS);
        assert!(events(&mut pb, &mut b).is_empty(), "b waits while a holds");
        assert_eq!(svc.watchers("job"), 1, "b watches the name");

        a.release(2 * MS_NS, la).unwrap();
        drive(&mut pa, &mut a, &mut svc, ca, 2 * MS_NS);
        // The release notification reached b's connection; deliver it as a host would.
        while let Some(name) = svc.poll_released(cb).unwrap() {
            pb.handle_message(&mut b, 3 * MS_NS, name.as_bytes());
        }
        drive(&mut pb, &mut b, &mut svc, cb, 3 * MS_NS);
        let got = events(&mut pb, &mut b);
        assert!(
            matches!(got[..], [Event::Acquired { lease, fencing_token: 2, .. }] if lease == lb),
            "{got:?}"
        );
        assert_eq!(pb.counters().wakeups, 1);

        let id = pa.request_status(&mut a, 4 * MS_NS, "job").unwrap();
        drive(&mut pa, &mut a, &mut svc, ca, 4 * MS_NS);
        let (sid, st) = pa.poll_status().unwrap();
        assert_eq!(sid, id);
        let st = st.unwrap();
        assert!(st.held);
        assert_eq!(st.fencing_token, Some(2));
        assert_eq!(st.last_fencing_token, Some(2));
    }

    #[test]
    fn a_release_before_the_watch_took_effect_is_not_missed() {
        let mut svc = MemoryService::new(Limits::default()).unwrap();
        let (ca, cb) = (svc.connect().unwrap(), svc.connect().unwrap());
        let mut a = Client::new(Config::default(), &[1; 32]).unwrap();
        let mut b = Client::new(Config::default(), &[2; 32]).unwrap();
        let (mut pa, mut pb) = (MemoryProtocol::new(), MemoryProtocol::new());
        let la = a.acquire(0, "job", AcquireOptions::new(5_000)).unwrap();
        drive(&mut pa, &mut a, &mut svc, ca, 0);
        let mut wait = AcquireOptions::new(5_000);
        wait.wait_ns = 10_000 * MS_NS;
        let lb = b.acquire(MS_NS, "job", wait).unwrap();
        // B's ACQUIRE is answered "held"; its WATCH is polled but not yet run.
        let req = pb.poll_request(&mut b).unwrap();
        let (id, args) = (req.id, req.args.to_vec());
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let ans = svc.call(cb, MS_NS, &refs).unwrap();
        let v = crate::backend::value::decode(&ans.values, &ans.data).unwrap();
        pb.handle_reply(&mut b, MS_NS, id, &v);
        let watch = pb.poll_request(&mut b).unwrap();
        let (wid, wargs) = (watch.id, watch.args.to_vec());
        assert_eq!(wargs[0], b"WATCH");
        // A releases: nobody watches yet, so no notification is queued for B.
        a.release(2 * MS_NS, la).unwrap();
        drive(&mut pa, &mut a, &mut svc, ca, 2 * MS_NS);
        assert_eq!(svc.poll_released(cb).unwrap(), None);
        // The watch takes effect: B tries at once, long before its backoff.
        let refs: Vec<&[u8]> = wargs.iter().map(Vec::as_slice).collect();
        let ans = svc.call(cb, 3 * MS_NS, &refs).unwrap();
        let v = crate::backend::value::decode(&ans.values, &ans.data).unwrap();
        pb.handle_reply(&mut b, 3 * MS_NS, wid, &v);
        drive(&mut pb, &mut b, &mut svc, cb, 3 * MS_NS);
        let got = events(&mut pb, &mut b);
        assert!(
            matches!(got[..], [Event::Acquired { lease, .. }] if lease == lb),
            "{got:?}"
        );
    }

    #[test]
    fn garbage_and_error_answers_are_transport_errors_never_grants() {
        let mut core = Client::new(Config::default(), &[3; 32]).unwrap();
        let mut p = MemoryProtocol::new();
        let lease = core.acquire(0, "x", AcquireOptions::new(5_000)).unwrap();
        let id = p.poll_request(&mut core).unwrap().id;
        // A grant with fence 0 is not a grant.
        let bad = Value::Array(vec![Value::Status(b"GRANTED"), Value::Int(0)]);
        p.handle_reply(&mut core, 0, id, &bad);
        assert_eq!(p.counters().garbage_replies, 1);
        // Late duplicate: counted, ignored.
        p.handle_reply(&mut core, 0, id, &bad);
        assert_eq!(p.counters().stale_replies, 1);
        // An error answer fails its attempt too.
        let other = core
            .acquire(MS_NS, "y", AcquireOptions::new(5_000))
            .unwrap();
        // The uncertain attempt on "x" is cleaned up by a RELEASE first.
        while let Some(req) = p.poll_request(&mut core) {
            let id = req.id;
            let answer = match &req.args[0][..] {
                b"RELEASE" => Value::Array(vec![Value::Status(b"RELEASED")]),
                _ => Value::Error(b"ERR nope"),
            };
            p.handle_reply(&mut core, MS_NS, id, &answer);
        }
        assert_eq!(p.counters().error_replies, 1);
        assert!(p.last_error().contains("nope"));
        let got = events(&mut p, &mut core);
        for l in [lease, other] {
            assert!(
                got.iter()
                    .any(|e| matches!(e, Event::AcquireFailed { lease, .. } if *lease == l)),
                "one attempt, failed, never granted: {got:?}"
            );
        }
    }

    #[test]
    fn malformed_calls_are_error_answers_and_change_nothing() {
        let mut svc = MemoryService::new(Limits::default()).unwrap();
        let c = svc.connect().unwrap();
        for args in [
            vec![&b"ACQUIRE"[..], b"n", b"tok", b"soon"],
            vec![&b"ACQUIRE"[..], b"n", b"tok"],
            vec![&b"FROB"[..], b"n"],
            vec![&b"ACQUIRE"[..]],
            vec![&b"ACQUIRE"[..], b"\xff", b"tok", b"10"],
            vec![&b"ACQUIRE"[..], b"n", b"", b"10"],
            vec![&b"WATCH"[..]; 9],
        ] {
            let a = svc.call(c, 0, &args).unwrap();
            assert!(!a.dropped);
            let v = crate::backend::value::decode(&a.values, &a.data).unwrap();
            assert!(matches!(v, Value::Error(_)), "{args:?} -> {v:?}");
        }
        assert_eq!(svc.stats().grants, 0);
        assert!(svc.call(c + 100, 0, &[b"STATUS", b"n"]).is_err());
    }
}
