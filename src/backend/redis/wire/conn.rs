//! One Redis connection, sans IO: the handshake, pipelined commands matched to their replies
//! in order, push messages, and deadlines. The host opens the socket, writes what
//! [`Conn::take_output`] gives, feeds what it reads to [`Conn::feed`], reports a close with
//! [`Conn::handle_closed`], and calls [`Conn::handle_timeout`] at [`Conn::deadline`]; what
//! happened comes out of [`Conn::poll_event`]. Nothing here reads a clock: `now` is an
//! argument (ns, the host's monotonic clock, as for the engine).
//!
//! # Handshake
//!
//! [`Protocol::Resp3`] sends `HELLO 3` with `AUTH` and `SETNAME` folded in, and `SELECT`
//! pipelined behind it. A `NOPROTO` answer falls back to `HELLO 2`; any other error that is
//! not an authentication failure (a server without `HELLO`) falls back to `AUTH`, `SELECT`
//! and `CLIENT SETNAME`. Commands sent before the handshake ends wait for it, so they never
//! run unauthenticated or in the wrong protocol.
//!
//! # Replies and pushes
//!
//! Replies answer commands in the order they were written. RESP3 push frames, and on a RESP2
//! connection in subscribe mode the arrays of pub/sub messages and confirmations, are
//! [`ConnEvent::Push`]es instead. A `(S|P)(UN)SUBSCRIBE` is answered by its confirmations (one
//! per channel, each also a push) and completes with the subscription count.
//!
//! # Failures
//!
//! Garbage bytes, a frame over the limits, a reply nothing waits for, an overdue reply and a
//! close all end the connection: each outstanding command gets [`ConnEvent::Failed`] and a
//! last [`ConnEvent::Closed`] says why. A byte stream cannot be resynchronised, so nothing is
//! retried here; the caller reconnects with a new `Conn`.

use std::collections::VecDeque;

use super::codec::{Decoder, Limits, Reply, WireError, encode_command};
use super::message::{ErrorKind, Push, ServerError, SubscriptionKind};

/// Which protocol the handshake asks for first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// `HELLO 3`, falling back to `HELLO 2`, then to `AUTH` + `SELECT` + `CLIENT SETNAME`.
    #[default]
    Resp3,
    /// `HELLO 2`, falling back to `AUTH` + `SELECT` + `CLIENT SETNAME`.
    Resp2,
    /// `AUTH` + `SELECT` + `CLIENT SETNAME` only (servers before Redis 6).
    Legacy,
}

/// What a connection is opened with. Its `Debug` form leaves the password out.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnOptions {
    /// ACL user (`None`: the default user).
    pub username: Option<Vec<u8>>,
    /// Password (`None`: no authentication).
    pub password: Option<Vec<u8>>,
    /// Database selected after authentication (0: left as is).
    pub database: u32,
    /// `CLIENT SETNAME` (shows in `CLIENT LIST`).
    pub client_name: Option<Vec<u8>>,
    /// Which protocol to ask for.
    pub protocol: Protocol,
    /// How long a command may wait for its reply, from when it was sent.
    pub request_timeout_ns: u64,
    /// The decoder's bounds.
    pub limits: Limits,
}

impl Default for ConnOptions {
    fn default() -> Self {
        ConnOptions {
            username: None,
            password: None,
            database: 0,
            client_name: None,
            protocol: Protocol::Resp3,
            request_timeout_ns: 5_000_000_000,
            limits: Limits::default(),
        }
    }
}

impl std::fmt::Debug for ConnOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnOptions")
            .field(
                "username",
                &self.username.as_deref().map(String::from_utf8_lossy),
            )
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("database", &self.database)
            .field(
                "client_name",
                &self.client_name.as_deref().map(String::from_utf8_lossy),
            )
            .field("protocol", &self.protocol)
            .field("request_timeout_ns", &self.request_timeout_ns)
            .field("limits", &self.limits)
            .finish()
    }
}

impl ConnOptions {
    /// Rejects options the handshake cannot carry.
    pub fn validate(&self) -> Result<(), crate::Error> {
        if self.username.is_some() && self.password.is_none() {
            return Err(crate::Error::InvalidConfig(
                "a Redis ACL user needs a password",
            ));
        }
        if let Some(name) = &self.client_name {
            // Redis refuses names with spaces, newlines or other special characters.
            if name.is_empty() || !name.iter().all(|b| b.is_ascii_graphic()) {
                return Err(crate::Error::InvalidConfig(
                    "a Redis client name must be printable ASCII without spaces",
                ));
            }
        }
        if self.request_timeout_ns == 0 {
            return Err(crate::Error::InvalidConfig(
                "request_timeout_ns must be positive",
            ));
        }
        self.limits.validate()
    }
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnError {
    /// The server refused a handshake step (wrong password, unknown user, bad database).
    #[error("the Redis handshake failed: {0}")]
    Handshake(ServerError),
    /// The server answered `HELLO` with something that is not its map of properties.
    #[error("the Redis server answered HELLO with something else")]
    BadHello,
    /// Bytes that are not RESP, or a frame over the limits.
    #[error("{0}")]
    Wire(WireError),
    /// A reply arrived while no command was waiting for one.
    #[error("a reply arrived while no command was waiting for one")]
    UnexpectedReply,
    /// The oldest command's reply did not come before its deadline.
    #[error("a Redis reply did not arrive in time")]
    TimedOut,
    /// The host reported the connection closed (`mid_reply`: part of a reply had arrived).
    #[error("the Redis connection closed{}", if *.mid_reply { " in the middle of a reply" } else { "" })]
    Closed {
        /// Part of a reply had arrived.
        mid_reply: bool,
    },
}

/// Why a command was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The connection ended (see the [`ConnEvent::Closed`] it reported).
    #[error("the Redis connection is closed")]
    Closed,
    /// The command cannot be encoded (an empty argument vector).
    #[error("{0}")]
    Encode(WireError),
    /// An `(S|P)UNSUBSCRIBE` naming no channel: its confirmations could not be counted.
    #[error("name the channels to unsubscribe from")]
    NoChannels,
}

/// What a connection reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnEvent {
    /// The handshake is done; commands run from now on.
    Ready {
        /// The connection speaks RESP3.
        resp3: bool,
    },
    /// A command's reply (not an error).
    Reply {
        /// The id it was sent with.
        id: u64,
        /// The reply.
        reply: Reply,
    },
    /// A command's error reply, typed.
    Error {
        /// The id it was sent with.
        id: u64,
        /// The error.
        error: ServerError,
    },
    /// A push message or subscription change.
    Push(Push),
    /// The connection ended before this command's reply.
    Failed {
        /// The id it was sent with.
        id: u64,
        /// Its bytes were handed over to be written, so it may have run; `false`: they
        /// never left the connection (queued behind the handshake or not yet taken), so it
        /// certainly did not.
        sent: bool,
    },
    /// The connection is unusable; the host closes it. Always the last event.
    Closed(ConnError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Hello(u8),
    Auth,
    Select,
    SetName,
    /// A step of an abandoned handshake attempt: its reply means nothing.
    Ignore,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiter {
    Handshake(Step),
    Command {
        id: u64,
    },
    Subscription {
        id: u64,
        kind: SubscriptionKind,
        left: usize,
    },
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    waiter: Waiter,
    deadline: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Handshake,
    Ready,
    Closed,
}

/// One Redis connection's protocol state (see the module docs). Its `Debug` form shows the
/// state, never the bytes (the handshake's carry the password).
pub struct Conn {
    opts: ConnOptions,
    decoder: Decoder,
    phase: Phase,
    resp3: bool,
    /// RESP2 only: the connection has live subscriptions, so pub/sub arrays are pushes.
    subscribe_mode: bool,
    out: Vec<u8>,
    /// Written commands waiting for replies, oldest first.
    pending: VecDeque<Pending>,
    /// How many of `pending`, from the front, had their bytes handed over by
    /// [`Conn::take_output`] (the rest are still in `out`: certainly not sent).
    handed: usize,
    /// Commands sent during the handshake, written once it is done.
    held: Vec<u8>,
    held_pending: VecDeque<Pending>,
    events: VecDeque<ConnEvent>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("opts", &self.opts)
            .field("phase", &self.phase)
            .field("resp3", &self.resp3)
            .field("subscribe_mode", &self.subscribe_mode)
            .field("output_bytes", &self.out.len())
            .field("outstanding", &self.outstanding())
            .field("events", &self.events.len())
            .finish()
    }
}

impl Conn {
    /// A connection that starts its handshake at `now` (its bytes are in
    /// [`Conn::take_output`] before anything else).
    pub fn new(opts: ConnOptions, now: u64) -> Result<Conn, crate::Error> {
        opts.validate()?;
        let mut c = Conn {
            decoder: Decoder::new(opts.limits),
            opts,
            phase: Phase::Handshake,
            resp3: false,
            subscribe_mode: false,
            out: Vec::new(),
            pending: VecDeque::new(),
            handed: 0,
            held: Vec::new(),
            held_pending: VecDeque::new(),
            events: VecDeque::new(),
        };
        match c.opts.protocol {
            Protocol::Resp3 => c.hello(now, 3),
            Protocol::Resp2 => c.hello(now, 2),
            Protocol::Legacy => c.legacy(now),
        }
        c.maybe_ready();
        Ok(c)
    }

    /// Queues a command (`argv`, name first) answered under `id`. Commands sent during the
    /// handshake are written when it is done.
    pub fn send<A: AsRef<[u8]>>(&mut self, now: u64, id: u64, argv: &[A]) -> Result<(), SendError> {
        if self.phase == Phase::Closed {
            return Err(SendError::Closed);
        }
        let waiter = match argv
            .first()
            .and_then(|n| SubscriptionKind::from_name(n.as_ref()))
        {
            Some(kind) if argv.len() < 2 => {
                return Err(if kind.is_subscribe() {
                    SendError::Encode(WireError::Encode("subscribe to at least one channel"))
                } else {
                    SendError::NoChannels
                });
            }
            Some(kind) => Waiter::Subscription {
                id,
                kind,
                left: argv.len() - 1,
            },
            None => Waiter::Command { id },
        };
        let p = Pending {
            waiter,
            deadline: now.saturating_add(self.opts.request_timeout_ns),
        };
        if self.phase == Phase::Handshake {
            encode_command(argv, &mut self.held).map_err(SendError::Encode)?;
            self.held_pending.push_back(p);
        } else {
            encode_command(argv, &mut self.out).map_err(SendError::Encode)?;
            self.pending.push_back(p);
        }
        Ok(())
    }

    /// The bytes to write, in order (the buffer is handed over and emptied).
    pub fn take_output(&mut self) -> Vec<u8> {
        self.handed = self.pending.len();
        std::mem::take(&mut self.out)
    }

    /// [`Conn::take_output`], leaving `spare` (emptied) to encode the next commands into: a
    /// caller that hands back written buffers allocates none per command.
    pub fn take_output_into(&mut self, mut spare: Vec<u8>) -> Vec<u8> {
        spare.clear();
        self.handed = self.pending.len();
        std::mem::replace(&mut self.out, spare)
    }

    /// Whether there are bytes to write.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// Takes bytes read from the connection: replies, pushes and handshake steps become
    /// events; garbage or a frame over the limits ends the connection.
    pub fn feed(&mut self, now: u64, bytes: &[u8]) {
        if self.phase == Phase::Closed {
            return;
        }
        if let Err(e) = self.decoder.feed(bytes) {
            return self.fail(ConnError::Wire(e));
        }
        while self.phase != Phase::Closed {
            match self.decoder.next() {
                Ok(Some(reply)) => self.on_frame(now, reply),
                Ok(None) => return,
                Err(e) => return self.fail(ConnError::Wire(e)),
            }
        }
    }

    /// When the oldest outstanding command times out (`None`: nothing is waiting).
    pub fn deadline(&self) -> Option<u64> {
        if self.phase == Phase::Closed {
            return None;
        }
        let first = |q: &VecDeque<Pending>| q.front().map(|p| p.deadline);
        match (first(&self.pending), first(&self.held_pending)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Ends the connection if a command's deadline has passed at `now`.
    pub fn handle_timeout(&mut self, now: u64) {
        if self.deadline().is_some_and(|d| d <= now) {
            self.fail(ConnError::TimedOut);
        }
    }

    /// The host saw the connection close (or fail): outstanding commands fail.
    pub fn handle_closed(&mut self) {
        if self.phase != Phase::Closed {
            let mid_reply = self.decoder.buffered() > 0;
            self.fail(ConnError::Closed { mid_reply });
        }
    }

    /// The next event, oldest first.
    pub fn poll_event(&mut self) -> Option<ConnEvent> {
        self.events.pop_front()
    }

    /// The handshake is done and the connection is usable.
    pub fn is_ready(&self) -> bool {
        self.phase == Phase::Ready
    }

    /// The connection ended (a [`ConnEvent::Closed`] said why).
    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Closed
    }

    /// The handshake settled on RESP3.
    pub fn is_resp3(&self) -> bool {
        self.resp3
    }

    /// Commands written or held that wait for a reply.
    pub fn outstanding(&self) -> usize {
        self.pending.len() + self.held_pending.len()
    }

    fn write(&mut self, now: u64, step: Step, argv: &[&[u8]]) {
        // Handshake commands always encode: they have a name.
        if encode_command(argv, &mut self.out).is_ok() {
            self.pending.push_back(Pending {
                waiter: Waiter::Handshake(step),
                deadline: now.saturating_add(self.opts.request_timeout_ns),
            });
        }
    }

    fn hello(&mut self, now: u64, version: u8) {
        let v = [b'0' + version];
        let mut argv: Vec<&[u8]> = vec![b"HELLO", &v];
        let user = self.opts.username.clone();
        let pass = self.opts.password.clone();
        let name = self.opts.client_name.clone();
        if let Some(pass) = &pass {
            argv.extend([b"AUTH", user.as_deref().unwrap_or(b"default"), pass]);
        }
        if let Some(name) = &name {
            argv.extend([b"SETNAME".as_slice(), name]);
        }
        self.write(now, Step::Hello(version), &argv);
        self.select(now);
    }

    fn legacy(&mut self, now: u64) {
        if let Some(pass) = self.opts.password.clone() {
            match self.opts.username.clone() {
                Some(user) => self.write(now, Step::Auth, &[b"AUTH", &user, &pass]),
                None => self.write(now, Step::Auth, &[b"AUTH", &pass]),
            }
        }
        self.select(now);
        if let Some(name) = self.opts.client_name.clone() {
            self.write(now, Step::SetName, &[b"CLIENT", b"SETNAME", &name]);
        }
    }

    fn select(&mut self, now: u64) {
        if self.opts.database != 0 {
            let db = self.opts.database.to_string();
            self.write(now, Step::Select, &[b"SELECT", db.as_bytes()]);
        }
    }

    fn on_frame(&mut self, now: u64, reply: Reply) {
        let reply = match reply {
            Reply::Push(items) => return self.on_push(Push::from_items(items)),
            Reply::Array(items) if !self.resp3 && self.pubsub_arrays() => {
                match Push::pubsub(&items) {
                    Some(push) => return self.on_push(push),
                    // Not a pub/sub array (PING's `pong` in subscribe mode): a reply.
                    None => Reply::Array(items),
                }
            }
            other => other,
        };
        self.handed = self.handed.saturating_sub(1);
        let Some(head) = self.pending.pop_front() else {
            return self.fail(ConnError::UnexpectedReply);
        };
        match head.waiter {
            Waiter::Handshake(step) => self.on_handshake(now, step, reply),
            Waiter::Command { id } | Waiter::Subscription { id, .. } => {
                self.events.push_back(match reply {
                    Reply::Error(e) => ConnEvent::Error {
                        id,
                        error: ServerError::parse(&e),
                    },
                    reply => ConnEvent::Reply { id, reply },
                });
            }
        }
    }

    /// RESP2: pub/sub arrays are pushes once subscribed or while a subscription is answered.
    fn pubsub_arrays(&self) -> bool {
        self.subscribe_mode
            || matches!(
                self.pending.front(),
                Some(Pending {
                    waiter: Waiter::Subscription { .. },
                    ..
                })
            )
    }

    fn on_push(&mut self, push: Push) {
        if let Push::Subscription {
            kind: got, count, ..
        } = &push
        {
            self.subscribe_mode = *count > 0;
            let mut done = None;
            if let Some(Pending {
                waiter: Waiter::Subscription { id, kind, left },
                ..
            }) = self.pending.front_mut()
            {
                if kind == got {
                    *left -= 1;
                    if *left == 0 {
                        done = Some(*id);
                    }
                }
            }
            self.events.push_back(ConnEvent::Push(push.clone()));
            if let Some(id) = done {
                self.pending.pop_front();
                self.handed = self.handed.saturating_sub(1);
                self.events.push_back(ConnEvent::Reply {
                    id,
                    reply: Reply::Int(*count),
                });
            }
            return;
        }
        self.events.push_back(ConnEvent::Push(push));
    }

    fn on_handshake(&mut self, now: u64, step: Step, reply: Reply) {
        match (step, reply) {
            (Step::Ignore, _) => {}
            (Step::Hello(version), Reply::Error(e)) => {
                let error = ServerError::parse(&e);
                if error.is_auth() {
                    return self.fail(ConnError::Handshake(error));
                }
                // The steps pipelined behind this HELLO ran in a state that is being redone.
                for p in &mut self.pending {
                    p.waiter = Waiter::Handshake(Step::Ignore);
                }
                if version == 3 && error.kind == ErrorKind::NoProto {
                    self.hello(now, 2);
                } else {
                    self.legacy(now);
                }
            }
            (Step::Hello(version), Reply::Map(_) | Reply::Array(_)) => self.resp3 = version == 3,
            (Step::Hello(_), _) => return self.fail(ConnError::BadHello),
            (_, Reply::Error(e)) => return self.fail(ConnError::Handshake(ServerError::parse(&e))),
            (Step::Auth | Step::Select | Step::SetName, _) => {}
        }
        self.maybe_ready();
    }

    fn maybe_ready(&mut self) {
        if self.phase != Phase::Handshake || !self.pending.is_empty() {
            return;
        }
        self.phase = Phase::Ready;
        self.events
            .push_back(ConnEvent::Ready { resp3: self.resp3 });
        self.out.append(&mut self.held);
        self.pending.append(&mut self.held_pending);
    }

    fn fail(&mut self, error: ConnError) {
        if self.phase == Phase::Closed {
            return;
        }
        self.phase = Phase::Closed;
        self.out.clear();
        self.held.clear();
        let handed = self.handed;
        self.handed = 0;
        let pending = self.pending.drain(..).chain(self.held_pending.drain(..));
        for (at, p) in pending.enumerate() {
            if let Waiter::Command { id } | Waiter::Subscription { id, .. } = p.waiter {
                let sent = at < handed;
                self.events.push_back(ConnEvent::Failed { id, sent });
            }
        }
        self.events.push_back(ConnEvent::Closed(error));
    }
}

#[cfg(test)]
#[path = "conn_tests.rs"]
mod tests;
