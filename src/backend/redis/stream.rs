//! The Redis protocol on the *stream* kind of the seam (docs/design.md §5): the core owns the
//! two connections and the host only moves bytes.
//!
//! [`RedisStream`] wraps a [`RedisProtocol`] and one [`Conn`] per connection kind (commands,
//! subscriber). Each argument vector of the protocol goes to its connection, opened first if
//! it is closed (commands wait while it opens and handshakes). What the host sees are
//! [`StreamRequest`]s: open stream `s` to the endpoint of the URL, write these bytes on `s`,
//! shut `s` down. It answers with [`RedisStream::handle_opened`], the bytes it read
//! ([`RedisStream::handle_received`], split anywhere) and [`RedisStream::handle_closed`].
//!
//! A connection's events become the protocol's inputs as a host's answers do on the command
//! path: a reply or an error reply goes to `handle_reply` (so `NOSCRIPT` reloads and retries),
//! a push to `handle_message` or `handle_subscription`, a close fails every outstanding
//! request, reports the subscriber's live channels lost (the protocol subscribes them again)
//! and reopens the connection after a jittered exponential backoff drawn from the core's RNG.
//! Stream ids are never reused; answers for a stream that was closed since are ignored.
//!
//! With a `redis+sentinel://` URL the endpoint is found, not given: `sentinel_stream.rs` asks
//! the sentinels for the master, checks it with `ROLE` before a connection carries a request, and
//! follows failovers (see its docs). With a `redis+cluster://` URL there is one pair of links
//! per master node and each request goes to the node serving its slot: `cluster_stream.rs`
//! learns the slot table and follows redirections and failovers (see its docs).

use std::collections::{HashSet, VecDeque};

use super::url::{Endpoint, RedisUrl, Target, parse_target};
use super::wire::{
    Conn, ConnEvent, ConnOptions, ErrorKind, Protocol as Resp, Push, SubscriptionKind,
};
use super::{Arg, Connection, RedisProtocol, Value, scripts};
use crate::backend::outbox::{MS, NEVER};
use crate::{Client, Error, Event};

#[path = "stream_types.rs"]
mod types;
use types::{Answers, Io, Rounds, SideConn, SideOwner, Streams, index, note_subscription, unsub};
pub use types::{StreamCounters, StreamError, StreamRequest, StreamSettings};

/// First reopen delay (jittered down to half) and its cap.
const BACKOFF_BASE: u64 = 25 * MS;
const BACKOFF_CAP: u64 = 2_000 * MS;

#[derive(Debug)]
enum State {
    /// No stream; the next one may be asked for at `reopen_at`.
    Idle,
    /// Sentinel: waiting for the sentinels to name the master, until `deadline`.
    Resolving {
        deadline: u64,
    },
    Opening {
        deadline: u64,
    },
    Open(Box<Conn>),
}

#[derive(Debug)]
struct Link {
    which: Connection,
    /// The current stream's id, 0 when idle.
    stream: u64,
    state: State,
    /// Requests waiting for the connection to open.
    waiting: VecDeque<(u64, Vec<Arg>)>,
    /// Ids of (S)(UN)SUBSCRIBEs in flight: their confirmations arrive as pushes.
    subs: HashSet<u64>,
    /// Closes since the last handshake that succeeded.
    failures: u32,
    reopen_at: u64,
    /// Where the current stream goes.
    endpoint: Option<Endpoint>,
    /// Requests may go on the connection (Sentinel: `ROLE` said master).
    verified: bool,
}

impl Link {
    fn new(which: Connection) -> Link {
        Link {
            which,
            stream: 0,
            state: State::Idle,
            waiting: VecDeque::new(),
            subs: HashSet::new(),
            failures: 0,
            reopen_at: 0,
            endpoint: None,
            verified: false,
        }
    }

    /// Open and verified: what it is given is written now, not held unsent in `waiting`.
    fn sends(&self) -> bool {
        matches!(self.state, State::Open(_)) && self.verified
    }

    /// Writes a request now if the link [`Self::sends`] (`Some`: whether it was refused).
    fn send_now(&mut self, now: u64, id: u64, args: &[Arg]) -> Option<Result<(), String>> {
        let State::Open(conn) = &mut self.state else {
            return None;
        };
        let sent = self.verified.then(|| conn.send(now, id, args))?;
        let subs = &mut self.subs;
        Some(
            sent.map(|()| note_subscription(subs, id, args))
                .map_err(|e| e.to_string()),
        )
    }

    /// Sends the waiting requests on the open, verified connection; the ones it refused.
    fn flush(&mut self, now: u64) -> Vec<(u64, String)> {
        if !self.sends() {
            return Vec::new();
        }
        let waiting = std::mem::take(&mut self.waiting);
        (waiting.into_iter())
            .filter_map(|(id, args)| Some((id, self.send_now(now, id, &args)?.err()?)))
            .collect()
    }
}

/// What a stream id belongs to.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Link(usize),
    Sentinel,
    Cluster,
}

/// The Redis protocol with the connections in the core. See the module docs.
#[derive(Debug)]
pub struct RedisStream {
    proto: RedisProtocol,
    url: RedisUrl,
    /// Sentinel URLs: how the master is found.
    sentinel: Option<Box<sentinel::Discovery>>,
    /// Cluster URLs: the slot table; links `2n`, `2n + 1` go to node `n`.
    cluster: Option<Box<cluster::Cluster>>,
    /// The sentinel discovery's generation the links follow.
    generation: u64,
    settings: StreamSettings,
    conn_opts: ConnOptions,
    links: Vec<Link>,
    streams: Streams,
    /// The request last handed out by [`Self::poll_request`] (its bytes are borrowed).
    current: Option<Io>,
    last_close: String,
    /// An input carried the host's clock: an open's deadline can be dated.
    clock_seen: bool,
    /// `drain`'s buffer, kept so a reply's events need no allocation.
    events: Vec<ConnEvent>,
    /// An input came, or the last route did something: the next route runs in full.
    unrouted: bool,
    /// The core's clock at the last route.
    routed_at: u64,
}

impl RedisStream {
    /// Wraps `proto` with connections to `url` (parsed here, once): one server, the master
    /// of a Sentinel deployment, or the masters of a cluster (which needs `sharded_wake`).
    pub fn new(
        proto: RedisProtocol,
        url: &str,
        settings: StreamSettings,
    ) -> Result<RedisStream, Error> {
        if settings.connect_timeout_ns == 0 {
            return Err(Error::InvalidConfig("connect_timeout_ns must be positive"));
        }
        let (url, sentinel, cluster_url) = match parse_target(url)? {
            Target::Direct(url) => (url, None, None),
            Target::Sentinel(s) => {
                let d = sentinel::Discovery::new(s, &settings)?;
                (d.server_url(), Some(Box::new(d)), None)
            }
            Target::Cluster(c) => (cluster::server_url(&c, &proto)?, None, Some(c)),
        };
        let conn_opts = ConnOptions {
            username: url.username.clone(),
            password: url.password.clone(),
            database: url.database,
            client_name: settings.client_name.clone(),
            protocol: settings.protocol,
            request_timeout_ns: settings.request_timeout_ns,
            ..ConnOptions::default()
        };
        conn_opts.validate()?;
        let cluster = cluster_url
            .map(|c| cluster::Cluster::new(c, &settings, conn_opts.clone()).map(Box::new))
            .transpose()?;
        Ok(RedisStream {
            proto,
            url,
            sentinel,
            cluster,
            generation: 0,
            settings,
            conn_opts,
            links: vec![
                Link::new(Connection::Commands),
                Link::new(Connection::Subscriber),
            ],
            streams: Streams {
                next: 1,
                io: VecDeque::new(),
                counters: StreamCounters::default(),
                spare: Vec::new(),
            },
            current: None,
            last_close: String::new(),
            clock_seen: false,
            events: Vec::new(),
            unrouted: true,
            routed_at: 0,
        })
    }

    /// The wrapped protocol (counters, subscription state, the wake channel).
    pub fn protocol(&self) -> &RedisProtocol {
        &self.proto
    }

    /// The wrapped protocol, to change it (a new wake channel after `fork()`).
    pub fn protocol_mut(&mut self) -> &mut RedisProtocol {
        self.unrouted = true;
        &mut self.proto
    }

    /// The parsed URL. For a Sentinel URL: the Redis servers' credentials and database,
    /// and the first sentinel as the endpoint; for a Cluster URL: the first seed node.
    pub fn url(&self) -> &RedisUrl {
        &self.url
    }

    /// The connection settings.
    pub fn settings(&self) -> &StreamSettings {
        &self.settings
    }

    /// Counters of the stream path.
    pub fn counters(&self) -> StreamCounters {
        self.streams.counters
    }

    /// The last error: the protocol's, or why a connection closed last if that is newer.
    pub fn last_error(&self) -> &str {
        match self.proto.last_error() {
            "" => &self.last_close,
            e => e,
        }
    }

    /// Whether a connection is open and done with its handshake (a cluster: the first
    /// node's).
    pub fn is_ready(&self, which: Connection) -> bool {
        let link = self.link(which);
        matches!(&link.state, State::Open(c) if c.is_ready() && link.verified)
    }

    // ------------------------------------------------------------------------ outputs

    /// The next piece of IO for the host. A write's bytes borrow this object until its next
    /// mutation.
    pub fn poll_request(&mut self, core: &mut Client) -> Option<StreamRequest<'_>> {
        self.streams.reclaim(self.current.take());
        self.route(core);
        self.current = self.streams.io.pop_front();
        Some(match self.current.as_ref()? {
            Io::Open {
                stream,
                deadline,
                endpoint,
            } => StreamRequest::Open {
                stream: *stream,
                endpoint,
                deadline: *deadline,
            },
            Io::Write { stream, bytes } => StreamRequest::Write {
                stream: *stream,
                bytes,
            },
            Io::Shutdown { stream } => StreamRequest::Shutdown { stream: *stream },
        })
    }

    /// The next event for the application.
    pub fn poll_event(&mut self, core: &mut Client) -> Option<Event> {
        self.proto.poll_event(core)
    }

    /// Queues a status query (see [`RedisProtocol::request_status`]). The opens it causes
    /// wait for the core's clock like any open (a fresh core asks for a timeout at once).
    pub fn request_status(
        &mut self,
        _core: &mut Client,
        now: u64,
        name: &str,
    ) -> Result<u64, Error> {
        self.unrouted = true;
        self.proto.request_status(now, name)
    }

    /// The next answered status query.
    pub fn poll_status(&mut self) -> Option<crate::backend::StatusAnswer> {
        self.proto.poll_status()
    }

    /// When [`Self::handle_timeout`] must be called at the latest: the protocol's deadline,
    /// an open's or a reply's deadline, a reopen that requests wait for, the sentinels'.
    pub fn poll_timeout(&mut self, core: &mut Client) -> Option<u64> {
        self.route(core);
        let mut t = self.proto.poll_timeout(core).unwrap_or(NEVER);
        for l in &self.links {
            t = t.min(match &l.state {
                State::Opening { deadline } | State::Resolving { deadline } => *deadline,
                State::Open(c) => c.deadline().unwrap_or(NEVER),
                State::Idle if !l.waiting.is_empty() => l.reopen_at,
                State::Idle => NEVER,
            });
            if !l.sends() {
                // An unsent acquire is dropped at its deadline (drop_abandoned).
                for (id, _) in &l.waiting {
                    t = t.min(self.proto.send_deadline(core, *id).unwrap_or(NEVER));
                }
            }
        }
        if let Some(d) = &self.sentinel {
            t = t.min(d.deadline().unwrap_or(NEVER));
        }
        if let Some(c) = &self.cluster {
            t = t.min(c.deadline());
        }
        let waiting = self.links.iter().any(|l| !l.waiting.is_empty());
        if (!self.dated(core) && waiting) || self.cluster_holds_requests(core) {
            // An open (a cluster: an admission) waits for a clock to date it: due at once.
            t = t.min(core.now());
        }
        (t != NEVER).then_some(t)
    }

    // ------------------------------------------------------------------------- inputs

    /// Time passed: the protocol's timers, opens and replies overdue, reopens due.
    pub fn handle_timeout(&mut self, core: &mut Client, now: u64) {
        self.unrouted = true;
        self.drop_abandoned(core, now);
        self.proto.handle_timeout(core, now);
        self.clock_seen = true;
        let now = core.now();
        if let Some(d) = &mut self.sentinel {
            d.handle_timeout(now, &mut self.streams);
        }
        self.cluster_timeout(core, now);
        for i in 0..self.links.len() {
            // Some(resolving): the open (or the search for the master) is overdue.
            let overdue = match &mut self.links[i].state {
                State::Opening { deadline } => (*deadline <= now).then_some(false),
                State::Resolving { deadline } => (*deadline <= now).then_some(true),
                State::Open(c) => {
                    c.handle_timeout(now);
                    None
                }
                State::Idle => None,
            };
            match (overdue, &self.sentinel) {
                (Some(true), Some(d)) => {
                    let why = d.unresolved();
                    self.open_failed(core, now, i, &why, false);
                }
                (Some(_), _) => {
                    self.open_failed(core, now, i, "the connection did not open in time", true);
                }
                (None, _) => self.drain(core, now, i, None),
            }
        }
        self.route(core);
    }

    /// The host opened `stream`: the handshake starts and the waiting requests follow it
    /// (Sentinel: once `ROLE` says the server is the master).
    pub fn handle_opened(
        &mut self,
        core: &mut Client,
        now: u64,
        stream: u64,
    ) -> Result<(), StreamError> {
        self.unrouted = true;
        let found = self.find(stream)?;
        core.handle_timeout(now);
        let now = core.now();
        self.clock_seen = true;
        let i = match found {
            None => return Ok(()),
            Some(Slot::Sentinel) => {
                if let Some(d) = &mut self.sentinel {
                    d.handle_opened(now, &mut self.streams);
                }
                self.route(core);
                return Ok(());
            }
            Some(Slot::Cluster) => {
                self.with_cluster(|c, s| c.handle_opened(now, s));
                self.route(core);
                return Ok(());
            }
            Some(Slot::Link(i)) => i,
        };
        if !matches!(self.links[i].state, State::Opening { .. }) {
            // Reported twice: the first report counts.
            self.streams.counters.late_answers += 1;
            return Ok(());
        }
        let mut conn = match Conn::new(self.conn_opts.clone(), now) {
            Ok(c) => Box::new(c),
            Err(_) => {
                // Unreachable: the options were validated at construction.
                self.open_failed(core, now, i, "invalid connection options", true);
                return Ok(());
            }
        };
        let verified = self.sentinel.is_none();
        if !verified {
            // Unreachable failure: a new connection takes any command.
            let _ = conn.send(now, sentinel::ROLE_ID, &[&b"ROLE"[..]]);
        }
        let link = &mut self.links[i];
        link.state = State::Open(conn);
        link.verified = verified;
        let refused = if verified {
            link.flush(now)
        } else {
            Vec::new()
        };
        for (id, why) in refused {
            self.fail_request(core, now, id, &why, false);
        }
        self.route(core);
        Ok(())
    }

    /// Bytes the host read on `stream` (any split).
    pub fn handle_received(
        &mut self,
        core: &mut Client,
        now: u64,
        stream: u64,
        bytes: &[u8],
    ) -> Result<(), StreamError> {
        self.unrouted = true;
        let found = self.find(stream)?;
        let open = match found {
            Some(Slot::Link(i)) => matches!(self.links[i].state, State::Open(_)),
            Some(Slot::Sentinel) => self.sentinel.as_ref().is_some_and(|d| d.is_open()),
            Some(Slot::Cluster) => self.cluster.as_ref().is_some_and(|c| c.is_open()),
            None => true,
        };
        if !open {
            return Err(StreamError::NotOpen(stream));
        }
        core.handle_timeout(now);
        let now = core.now();
        self.clock_seen = true;
        match found {
            None => return Ok(()),
            Some(Slot::Sentinel) => {
                if let Some(d) = &mut self.sentinel {
                    d.handle_received(now, bytes, &mut self.streams);
                }
            }
            Some(Slot::Cluster) => self.with_cluster(|c, s| c.handle_received(now, bytes, s)),
            Some(Slot::Link(i)) => {
                if let State::Open(conn) = &mut self.links[i].state {
                    conn.feed(now, bytes);
                    self.drain(core, now, i, None);
                }
            }
        }
        self.route(core);
        Ok(())
    }

    /// `stream` closed, or failed to open; `message` is the host's reason.
    pub fn handle_closed(
        &mut self,
        core: &mut Client,
        now: u64,
        stream: u64,
        message: &str,
    ) -> Result<(), StreamError> {
        self.unrouted = true;
        let found = self.find(stream)?;
        core.handle_timeout(now);
        let now = core.now();
        self.clock_seen = true;
        let why = if message.is_empty() {
            "the connection closed"
        } else {
            message
        };
        match found {
            None => return Ok(()),
            Some(Slot::Sentinel) => {
                if let Some(d) = &mut self.sentinel {
                    d.handle_closed(now, why, &mut self.streams);
                }
            }
            Some(Slot::Cluster) => self.with_cluster(|c, s| c.handle_closed(now, why, s)),
            Some(Slot::Link(i)) => {
                if let State::Open(conn) = &mut self.links[i].state {
                    conn.handle_closed();
                    self.drain(core, now, i, Some(why));
                } else {
                    self.open_failed(core, now, i, why, false);
                }
            }
        }
        self.route(core);
        Ok(())
    }

    // ---------------------------------------------------------------------- internals

    /// Whether the core has seen the host's clock (a client polled before its first input
    /// has only 0).
    fn dated(&self, core: &Client) -> bool {
        self.clock_seen || core.now() > 0
    }

    fn link(&self, which: Connection) -> &Link {
        &self.links[index(which)]
    }

    /// What `stream` is the current stream of; `None` for a stream closed since (the
    /// answer is late and ignored).
    fn find(&mut self, stream: u64) -> Result<Option<Slot>, StreamError> {
        if stream == 0 || stream >= self.streams.next {
            return Err(StreamError::Unknown(stream));
        }
        let found = match self.links.iter().position(|l| l.stream == stream) {
            Some(i) => Some(Slot::Link(i)),
            None if self.sentinel.as_ref().is_some_and(|d| d.stream() == stream) => {
                Some(Slot::Sentinel)
            }
            None if self.cluster.as_ref().is_some_and(|c| c.stream() == stream) => {
                Some(Slot::Cluster)
            }
            None => None,
        };
        if found.is_none() {
            self.streams.counters.late_answers += 1;
        }
        Ok(found)
    }

    /// Turns connection `i`'s events into the protocol's inputs. `host_reason`: the host
    /// reported the close (no shutdown to ask for).
    fn drain(&mut self, core: &mut Client, now: u64, i: usize, host_reason: Option<&str>) {
        let State::Open(conn) = &mut self.links[i].state else {
            return;
        };
        let mut events = std::mem::take(&mut self.events);
        events.extend(std::iter::from_fn(|| conn.poll_event()));
        let mut failed = Vec::new();
        let mut closed = None;
        // Sentinel: why the core ends this connection itself (not the master).
        let mut drop_it = None;
        let mut verified = false;
        for ev in events.drain(..) {
            let subs = &mut self.links[i].subs;
            match ev {
                ConnEvent::Ready { .. } => self.links[i].failures = 0,
                ConnEvent::Reply { id, .. }
                | ConnEvent::Error { id, .. }
                | ConnEvent::Failed { id, .. }
                    if id == cluster::ASKING_ID => {}
                ConnEvent::Reply {
                    id: sentinel::ROLE_ID,
                    reply,
                } => match sentinel::check_role(&reply) {
                    Ok(()) => verified = true,
                    Err(e) => drop_it = Some(e.to_string()),
                },
                ConnEvent::Error {
                    id: sentinel::ROLE_ID,
                    error,
                } => {
                    drop_it = Some(format!(
                        "ROLE failed: {}",
                        String::from_utf8_lossy(&error.message)
                    ));
                }
                ConnEvent::Reply { id, reply } => {
                    if let Some(c) = &mut self.cluster {
                        c.done(id);
                    }
                    // A subscription's confirmation came as a push already.
                    if !unsub(subs, id) {
                        self.proto.handle_reply(core, now, id, &reply.as_value());
                    }
                }
                ConnEvent::Error { id, error } => {
                    unsub(subs, id);
                    if self.cluster_redirect(core, now, i, id, &error) {
                        continue;
                    }
                    if error.kind == ErrorKind::ReadOnly && self.sentinel.is_some() {
                        // A replica now: the master moved.
                        drop_it = Some(String::from_utf8_lossy(&error.message).into_owned());
                    }
                    let reply = Value::Error(&error.message);
                    self.proto.handle_reply(core, now, id, &reply);
                }
                ConnEvent::Push(push) => self.on_push(core, now, i, push),
                ConnEvent::Failed { id, sent } => {
                    unsub(subs, id);
                    if id != sentinel::ROLE_ID {
                        failed.push((id, sent));
                    }
                }
                ConnEvent::Closed(e) => closed = Some(e.to_string()),
            }
        }
        self.events = events;
        if verified && closed.is_none() {
            self.links[i].verified = true;
            for (id, why) in self.links[i].flush(now) {
                self.fail_request(core, now, id, &why, false);
            }
        }
        let Some(own) = closed else {
            if let Some(why) = drop_it {
                self.drop_link(core, now, i, &why);
                self.master_lost(now);
            }
            return;
        };
        let why = host_reason.map_or(own, str::to_owned);
        for (id, sent) in failed {
            self.fail_request(core, now, id, &why, sent);
        }
        self.down(core, now, i, &why, host_reason.is_none());
        self.master_lost(now);
    }

    fn on_push(&mut self, core: &mut Client, now: u64, i: usize, push: Push) {
        self.cluster_note_push(i, &push);
        match push {
            Push::Message { channel, payload }
            | Push::ShardMessage { channel, payload }
            | Push::PatternMessage {
                channel, payload, ..
            } => self.proto.handle_message(core, now, &channel, &payload),
            Push::Subscription {
                kind,
                channel: Some(channel),
                ..
            } if kind != SubscriptionKind::PSubscribe && kind != SubscriptionKind::PUnsubscribe => {
                self.proto
                    .handle_subscription(core, now, &channel, kind.is_subscribe());
            }
            Push::Subscription { .. } | Push::Other(_) => {}
        }
    }

    /// Connection `i` is gone: back off, and tell the protocol its subscriptions are lost.
    pub(super) fn down(
        &mut self,
        core: &mut Client,
        now: u64,
        i: usize,
        why: &str,
        shutdown: bool,
    ) {
        let link = &mut self.links[i];
        if link.stream != 0 {
            self.streams.closed(link.stream, shutdown);
        }
        self.last_close = format!("Redis connection closed: {why}");
        link.stream = 0;
        link.state = State::Idle;
        link.subs.clear();
        link.endpoint = None;
        link.verified = false;
        link.failures = link.failures.saturating_add(1);
        let step = BACKOFF_BASE
            .saturating_mul(1 << (link.failures - 1).min(10))
            .min(BACKOFF_CAP);
        link.reopen_at = now.saturating_add(step / 2 + core.random_up_to(step / 2));
        if link.which == Connection::Subscriber {
            self.subscriptions_lost(core, now, i);
        }
        self.cluster_link_lost(now);
    }

    /// The subscriber is gone: every live channel is reported lost, so the protocol
    /// subscribes it again (on the reopened connection) and re-checks its waiters.
    fn subscriptions_lost(&mut self, core: &mut Client, now: u64, i: usize) {
        let lost: Vec<Vec<u8>> = if let Some(c) = &mut self.cluster {
            c.channels_on(i)
        } else if self.proto.options().sharded_wake {
            self.proto
                .watched_names()
                .filter(|(_, live)| *live)
                .filter_map(|(name, _)| scripts::shard_channel(name).ok())
                .collect()
        } else if self.proto.is_subscribed() {
            vec![self.proto.wake_channel().to_vec()]
        } else {
            Vec::new()
        };
        for channel in lost {
            self.proto.handle_subscription(core, now, &channel, false);
        }
    }
}

#[path = "sentinel_stream.rs"]
mod sentinel;

#[path = "stream_failures.rs"]
mod failures;

#[path = "stream_route.rs"]
mod route;

#[path = "cluster_stream.rs"]
pub mod cluster;

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
