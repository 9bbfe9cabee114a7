//! A side connection: one the core opens beside its links to ask a question of its own (a
//! sentinel for the master, a cluster node for the slot table).
//!
//! [`SideConn`] holds what every such question shares: the stream, its open and the open's
//! deadline, the connection on it (handshake, bytes in and out, reply deadlines) and the
//! stream's end. Its owner, a [`SideOwner`], says what to ask once the stream is open, what the
//! connection's events mean and where to ask after a failure; the inputs of the stream go
//! through the owner's provided methods, which hand it those moments. [`Rounds`] is their
//! shared patience: after every candidate failed once, the next question waits for a backoff.

use super::Streams;
use crate::backend::outbox::MS;
use crate::backend::redis::url::Endpoint;
use crate::backend::redis::wire::{Conn, ConnEvent, ConnOptions, SendError};

/// First delay after every candidate failed, and its cap.
pub(in super::super) const ROUND_BACKOFF_BASE: u64 = 50 * MS;
pub(in super::super) const ROUND_BACKOFF_CAP: u64 = 2_000 * MS;

/// Failed questions since one was answered, counted in rounds over the candidates: after a
/// whole round failed the next question waits, 50 ms doubling to 2 s.
#[derive(Debug, Default)]
pub(in super::super) struct Rounds {
    /// Candidates that failed in the current round.
    tried: usize,
    /// Whole rounds that failed in a row.
    rounds: u32,
}

impl Rounds {
    /// A question was answered: the next failure starts afresh.
    pub(in super::super) fn answered(&mut self) {
        *self = Rounds::default();
    }

    /// A question to one of `candidates` failed: when the next may be asked, and whether
    /// this failure ended a round.
    pub(in super::super) fn failed(&mut self, now: u64, candidates: usize) -> (u64, bool) {
        self.tried += 1;
        if self.tried < candidates {
            return (now, false);
        }
        self.tried = 0;
        self.rounds = self.rounds.saturating_add(1);
        let step = ROUND_BACKOFF_BASE
            .saturating_mul(1 << (self.rounds - 1).min(10))
            .min(ROUND_BACKOFF_CAP);
        (now.saturating_add(step), true)
    }
}

/// What a side connection said since the last input.
#[derive(Debug)]
pub(in super::super) struct Answers {
    /// Its events in order, but for its end.
    pub(in super::super) events: Vec<ConnEvent>,
    /// It ended: why (the host's reason if the host reported it, else the connection's), and
    /// whether the core shuts the stream down (the host did not report the end).
    pub(in super::super) ended: Option<(String, bool)>,
}

#[derive(Debug)]
enum Phase {
    Idle,
    Opening { deadline: u64 },
    Open(Box<Conn>),
}

/// The stream and the connection of a side question (module docs).
#[derive(Debug)]
pub(in super::super) struct SideConn {
    opts: ConnOptions,
    connect_timeout_ns: u64,
    /// The current stream's id, 0 when idle.
    stream: u64,
    phase: Phase,
}

impl SideConn {
    /// `opts` must have been validated (a connection is made with them at each open).
    pub(in super::super) fn new(opts: ConnOptions, connect_timeout_ns: u64) -> SideConn {
        SideConn {
            opts,
            connect_timeout_ns,
            stream: 0,
            phase: Phase::Idle,
        }
    }

    /// The current stream's id, 0 when idle.
    pub(in super::super) fn stream(&self) -> u64 {
        self.stream
    }

    /// The stream is open (bytes may be received on it).
    pub(in super::super) fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Open(_))
    }

    /// No stream: the owner may open one.
    pub(in super::super) fn is_idle(&self) -> bool {
        matches!(self.phase, Phase::Idle)
    }

    /// Opening: when the open gives up; open: the connection's next deadline; idle: `None`.
    pub(in super::super) fn deadline(&self) -> Option<u64> {
        match &self.phase {
            Phase::Opening { deadline } => Some(*deadline),
            Phase::Open(c) => c.deadline(),
            Phase::Idle => None,
        }
    }

    /// Asks the host for a stream to `to`, to give up `connect_timeout_ns` after `now`.
    pub(in super::super) fn open(&mut self, now: u64, to: &Endpoint, streams: &mut Streams) {
        let deadline = now.saturating_add(self.connect_timeout_ns);
        self.stream = streams.open(to, deadline);
        self.phase = Phase::Opening { deadline };
    }

    /// Sends a command on the open connection (after the handshake if it is still on).
    pub(in super::super) fn send<A: AsRef<[u8]>>(
        &mut self,
        now: u64,
        id: u64,
        argv: &[A],
    ) -> Result<(), SendError> {
        match &mut self.phase {
            Phase::Open(c) => c.send(now, id, argv),
            Phase::Idle | Phase::Opening { .. } => Err(SendError::Closed),
        }
    }

    /// Queues the connection's pending bytes for the host.
    pub(in super::super) fn flush(&mut self, streams: &mut Streams) {
        if let Phase::Open(c) = &mut self.phase {
            streams.write(self.stream, c);
        }
    }

    /// Ends the stream (if any) and forgets the connection; `shutdown`: the core ends it (the
    /// host did not report it).
    pub(in super::super) fn close(&mut self, shutdown: bool, streams: &mut Streams) {
        if self.stream != 0 {
            streams.closed(self.stream, shutdown);
        }
        self.stream = 0;
        self.phase = Phase::Idle;
    }

    /// The host opened the stream: `Ok(true)` with a new connection on it, `Ok(false)` for a
    /// report that comes late (counted).
    fn opened(&mut self, now: u64, streams: &mut Streams) -> Result<bool, &'static str> {
        if !matches!(self.phase, Phase::Opening { .. }) {
            streams.counters.late_answers += 1;
            return Ok(false);
        }
        // Unreachable failure: the options were validated before.
        let conn = Conn::new(self.opts.clone(), now).map_err(|_| "invalid connection options")?;
        self.phase = Phase::Open(Box::new(conn));
        Ok(true)
    }

    /// Time passed: `Err` when the open is overdue, what an open connection said (one whose
    /// reply is overdue closes), `None` otherwise.
    fn timed(&mut self, now: u64) -> Option<Result<Answers, &'static str>> {
        match &mut self.phase {
            Phase::Opening { deadline } if *deadline <= now => {
                Some(Err("the connection did not open in time"))
            }
            Phase::Open(c) => {
                c.handle_timeout(now);
                Some(Ok(answers(c, None)))
            }
            Phase::Idle | Phase::Opening { .. } => None,
        }
    }

    /// Bytes read on the open connection: what it said (`None` if it is not open).
    fn received(&mut self, now: u64, bytes: &[u8]) -> Option<Answers> {
        let Phase::Open(c) = &mut self.phase else {
            return None;
        };
        c.feed(now, bytes);
        Some(answers(c, None))
    }

    /// The host reported the end, for `why`: the open connection's last words (`None`: it
    /// was not open yet).
    fn ended(&mut self, why: &str) -> Option<Answers> {
        let Phase::Open(c) = &mut self.phase else {
            return None;
        };
        c.handle_closed();
        Some(answers(c, Some(why)))
    }
}

/// The connection's events; `host_reason`: the host reported its end.
fn answers(c: &mut Conn, host_reason: Option<&str>) -> Answers {
    let mut events = Vec::new();
    let mut ended = None;
    while let Some(ev) = c.poll_event() {
        match ev {
            ConnEvent::Closed(e) => {
                let why = host_reason.map_or_else(|| e.to_string(), str::to_owned);
                ended = Some((why, host_reason.is_none()));
            }
            ev => events.push(ev),
        }
    }
    Answers { events, ended }
}

/// What a side question asks and what its answers mean: the owner of a [`SideConn`]. The
/// provided methods are the stream's inputs for it.
pub(in super::super) trait SideOwner {
    /// The side connection.
    fn side(&mut self) -> &mut SideConn;

    /// The stream opened: sends the first question ([`SideConn::send`]).
    fn ask(&mut self, now: u64, streams: &mut Streams);

    /// What the connection said: replies, pushes, its end.
    fn answered(&mut self, now: u64, answers: Answers, streams: &mut Streams);

    /// The question failed (the open, the connection or the answer): the stream ends, and
    /// the owner asks elsewhere or later. `shutdown`: the core ends the stream.
    fn failed(&mut self, now: u64, why: &str, shutdown: bool, streams: &mut Streams);

    /// The host opened the side stream.
    fn handle_opened(&mut self, now: u64, streams: &mut Streams) {
        match self.side().opened(now, streams) {
            Ok(true) => {
                self.ask(now, streams);
                self.side().flush(streams);
            }
            Ok(false) => {}
            Err(why) => self.failed(now, why, true, streams),
        }
    }

    /// Bytes the host read on the side stream.
    fn handle_received(&mut self, now: u64, bytes: &[u8], streams: &mut Streams) {
        if let Some(answers) = self.side().received(now, bytes) {
            self.answered(now, answers, streams);
        }
    }

    /// The side stream closed, or failed to open; `why` is the host's reason.
    fn handle_closed(&mut self, now: u64, why: &str, streams: &mut Streams) {
        match self.side().ended(why) {
            Some(answers) => self.answered(now, answers, streams),
            None => self.failed(now, why, false, streams),
        }
    }

    /// Time passed: an overdue open fails, an open connection's deadlines run.
    fn side_timeout(&mut self, now: u64, streams: &mut Streams) {
        match self.side().timed(now) {
            Some(Ok(answers)) => self.answered(now, answers, streams),
            Some(Err(why)) => self.failed(now, why, true, streams),
            None => {}
        }
    }
}
