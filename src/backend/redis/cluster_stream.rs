//! Redis Cluster on the stream path: the core learns the slot table and routes every request
//! to the master serving its slot, so a host that only moves bytes talks to a cluster too.
//!
//! The links of [`RedisStream`] come in pairs, one pair (commands, subscriber) per master
//! node, each opened to that node. A request goes to the pair of the node serving the slot of
//! its first key or its shard channel (every key of a name shares the name's hash tag, so one
//! name is one slot, `scripts.rs`); wake-ups are sharded (`lh:{NAME}:wake`, SSUBSCRIBE on the
//! owner's subscriber link, SPUBLISH from the scripts).
//!
//! `Cluster` holds the table. At the first request it connects to a seed of the URL and asks
//! `CLUSTER SHARDS` (`CLUSTER SLOTS` after an error reply, for servers before Redis 7), on a
//! connection of its own that it closes once answered; requests wait for the table, or fail
//! with the reason once every seed failed in a round (the next round waits 50 ms doubling to
//! 2 s). Later it asks again — the nodes it knows, then the seeds, nodes whose links fail last —
//! when a link closes, a `MOVED` or `CLUSTERDOWN` arrives, and every 300 ms for a while after
//! a serving node's link failed (a failover in progress); at most one question per 100 ms. A
//! new table moves the requests still waiting on a link to their new node. Each request's
//! argument vector is kept until its answer: `MOVED` updates the slot and sends it to the
//! named node, `ASK` sends `ASKING` and the request there once, and
//! `TRYAGAIN` / `CLUSTERDOWN` send it again after a jittered backoff (10 ms doubling to
//! 500 ms) while its deadline (the request timeout from its first send) allows; after five
//! redirections, or past the deadline, the error reply is the request's answer. A subscriber
//! link that closes reports lost exactly the channels confirmed on it, and the protocol
//! subscribes them again at their owner.

use std::collections::{HashMap, VecDeque};

use super::{
    Answers, Arg, ConnEvent, Connection, Endpoint, RedisStream, Rounds, SideConn, SideOwner,
    StreamSettings, Streams,
};
use crate::backend::outbox::{MS, NEVER};
use crate::backend::redis::url::ClusterUrl;
use crate::backend::redis::wire::{ConnOptions, ErrorKind, ServerError};
use crate::{Client, Error};

#[path = "cluster_slots.rs"]
mod slots;
pub use slots::{
    ClusterError, Topology, crc16, hash_slot, parse_shards, parse_slots, request_slot,
};

/// The id `ASKING` is sent with (the protocol's ids never reach it).
pub(super) const ASKING_ID: u64 = u64::MAX - 1;
const SHARDS_ID: u64 = 1;
const SLOTS_ID: u64 = 2;
const MAX_REDIRECTS: u8 = 5;
const REFRESH_GAP: u64 = 100 * MS;
const REFRESH_WHILE_DOWN: u64 = 300 * MS;
/// How long after a link's last failure (and its backoff) it still counts as failing.
const DOWN_WINDOW: u64 = 5_000 * MS;
const RETRY_BASE: u64 = 10 * MS;
const RETRY_CAP: u64 = 500 * MS;
const NO_NODE: u16 = u16::MAX;

/// A request of the protocol until its answer: what to send again after a redirection.
#[derive(Debug)]
struct Flight {
    which: Connection,
    args: Vec<Arg>,
    /// Retries after `TRYAGAIN` / `CLUSTERDOWN` stop here.
    deadline: u64,
    redirects: u8,
    /// `ASK`: the node to send it to next, after `ASKING`.
    ask: Option<u16>,
    tries: u32,
}

/// The slot table, the requests' argument vectors and the topology connection (module docs).
#[derive(Debug)]
pub(super) struct Cluster {
    url: ClusterUrl,
    request_timeout_ns: u64,
    /// Node `n` has the links `2n` (commands) and `2n + 1` (subscriber).
    nodes: Vec<Endpoint>,
    /// Whether node `n` serves slots in the current table.
    serving: Vec<bool>,
    /// Whether a link of node `n` failed since its last handshake: asked last.
    failing: Vec<bool>,
    /// Slot → node; empty until the first table.
    slots: Vec<u16>,
    /// Every node of the last answer, asked first at a refresh.
    known: Vec<Endpoint>,
    flights: HashMap<u64, Flight>,
    /// Requests to put on links now.
    ready: VecDeque<u64>,
    /// Requests waiting for a table (or for a node to serve their slot).
    unrouted: VecDeque<u64>,
    /// `(when, id)`: requests sent again after a backoff.
    retries: Vec<(u64, u64)>,
    /// Shard channel → the link its subscription was confirmed on.
    channels: HashMap<Vec<u8>, usize>,
    wanted: bool,
    refresh_at: u64,
    /// The topology connection.
    side: SideConn,
    /// The node the topology connection asks.
    asked: Option<Endpoint>,
    next: usize,
    /// Candidates that failed since one answered.
    rounds: Rounds,
    /// A node answered `CLUSTER SHARDS` with an error: ask `CLUSTER SLOTS` from then on.
    use_slots: bool,
    /// A new table: requests waiting on links move to their node.
    changed: bool,
    /// Every candidate failed in a round: the unrouted requests fail with this.
    round_failed: Option<String>,
    last_error: String,
    fresh_error: bool,
}

impl Cluster {
    pub(super) fn new(
        url: ClusterUrl,
        settings: &StreamSettings,
        opts: ConnOptions,
    ) -> Result<Cluster, Error> {
        if url.seeds.is_empty() {
            return Err(Error::InvalidConfig("a Cluster URL names no seed node"));
        }
        opts.validate()?;
        Ok(Cluster {
            url,
            request_timeout_ns: settings.request_timeout_ns,
            nodes: Vec::new(),
            serving: Vec::new(),
            failing: Vec::new(),
            slots: Vec::new(),
            known: Vec::new(),
            flights: HashMap::new(),
            ready: VecDeque::new(),
            unrouted: VecDeque::new(),
            retries: Vec::new(),
            channels: HashMap::new(),
            wanted: false,
            refresh_at: 0,
            side: SideConn::new(opts, settings.connect_timeout_ns),
            asked: None,
            next: 0,
            rounds: Rounds::default(),
            use_slots: false,
            changed: false,
            round_failed: None,
            last_error: String::new(),
            fresh_error: false,
        })
    }

    pub(super) fn node(&self, n: usize) -> Option<&Endpoint> {
        self.nodes.get(n)
    }

    pub(super) fn stream(&self) -> u64 {
        self.side.stream()
    }

    pub(super) fn is_open(&self) -> bool {
        self.side.is_open()
    }

    /// Links a node list this long needs.
    fn links_needed(&self) -> usize {
        2 * self.nodes.len().max(1)
    }

    pub(super) fn deadline(&self) -> u64 {
        let mut t = if !self.side.is_idle() {
            self.side.deadline().unwrap_or(NEVER)
        } else if self.wanted {
            self.refresh_at
        } else {
            NEVER
        };
        for (at, _) in &self.retries {
            t = t.min(*at);
        }
        for id in &self.unrouted {
            if let Some(f) = self.flights.get(id) {
                t = t.min(f.deadline);
            }
        }
        t
    }

    /// A request of the protocol, placed at the next `RedisStream::cluster_placements`.
    pub(super) fn admit(&mut self, now: u64, id: u64, which: Connection, args: Vec<Arg>) {
        let deadline = now.saturating_add(self.request_timeout_ns);
        self.flights.insert(
            id,
            Flight {
                which,
                args,
                deadline,
                redirects: 0,
                ask: None,
                tries: 0,
            },
        );
        self.ready.push_back(id);
    }

    /// The request was answered (or failed): nothing more to send.
    pub(super) fn done(&mut self, id: u64) {
        self.flights.remove(&id);
    }

    fn node_index(&mut self, e: &Endpoint) -> Option<u16> {
        if let Some(n) = self.nodes.iter().position(|x| x == e) {
            return u16::try_from(n).ok();
        }
        if self.nodes.len() >= slots::MAX_NODES {
            return None;
        }
        self.nodes.push(e.clone());
        self.serving.push(false);
        u16::try_from(self.nodes.len() - 1).ok()
    }

    /// `(link, id, args)` for every request that can go now, `ASKING` before an asked one.
    fn place(&mut self, now: u64, streams: &mut Streams) -> Vec<(usize, u64, Vec<Arg>)> {
        let mut out = Vec::new();
        if self.slots.is_empty() {
            self.unrouted.extend(self.ready.drain(..));
            if !self.unrouted.is_empty() {
                self.want(now, streams);
            }
            return out;
        }
        while let Some(id) = self.ready.pop_front() {
            let Some(f) = self.flights.get_mut(&id) else {
                continue;
            };
            let asked = f.ask.take();
            // An unsubscribe goes where the subscription was confirmed.
            let confirmed_on = match &f.args[..] {
                [cmd, channel] if cmd.eq_ignore_ascii_case(b"SUNSUBSCRIBE") => {
                    self.channels.get(&channel[..]).copied()
                }
                _ => None,
            };
            let node = asked.or_else(|| {
                let slot = request_slot(&f.args).unwrap_or(0);
                Some(self.slots[usize::from(slot)]).filter(|&n| n != NO_NODE)
            });
            let link = match (confirmed_on, node) {
                (Some(link), _) => link,
                (None, Some(node)) => {
                    2 * usize::from(node) + usize::from(f.which == Connection::Subscriber)
                }
                (None, None) => {
                    self.unrouted.push_back(id);
                    self.want(now, streams);
                    continue;
                }
            };
            if asked.is_some() {
                out.push((link, ASKING_ID, vec![Arg::Static(b"ASKING")]));
            }
            out.push((link, id, f.args.clone()));
        }
        out
    }

    /// An error reply to request `id` on a link to `from`: `true` when it is followed (sent
    /// again elsewhere or later) rather than the request's answer.
    pub(super) fn redirected(
        &mut self,
        core: &mut Client,
        now: u64,
        id: u64,
        error: &ServerError,
        from: Option<&Endpoint>,
        streams: &mut Streams,
    ) -> bool {
        let tls = self.url.tls;
        let Some(f) = self.flights.get_mut(&id) else {
            return false;
        };
        match &error.kind {
            ErrorKind::Moved(r) | ErrorKind::Ask(r) => {
                if f.redirects >= MAX_REDIRECTS {
                    return false;
                }
                f.redirects += 1;
                let host = match (&r.host[..], from) {
                    (b"", Some(Endpoint::Tcp { host, .. })) => host.clone(),
                    (h, _) => String::from_utf8_lossy(h).into_owned(),
                };
                if host.is_empty() || r.port == 0 {
                    return false;
                }
                let to = Endpoint::Tcp {
                    server_name: host.clone(),
                    host,
                    port: r.port,
                    tls,
                };
                let moved = matches!(error.kind, ErrorKind::Moved(_));
                let Some(node) = self.node_index(&to) else {
                    return false;
                };
                if moved {
                    if let Some(s) = self.slots.get_mut(usize::from(r.slot)) {
                        *s = node;
                    }
                    if let Some(s) = self.serving.get_mut(usize::from(node)) {
                        *s = true;
                    }
                    self.want(now, streams);
                } else if let Some(f) = self.flights.get_mut(&id) {
                    f.ask = Some(node);
                }
                streams.counters.cluster_redirects += 1;
                self.ready.push_back(id);
                true
            }
            ErrorKind::TryAgain | ErrorKind::ClusterDown => {
                let step = RETRY_BASE
                    .saturating_mul(1 << f.tries.min(10))
                    .min(RETRY_CAP);
                let at = now.saturating_add(step / 2 + core.random_up_to(step / 2));
                if at > f.deadline {
                    return false;
                }
                f.tries += 1;
                self.retries.push((at, id));
                if error.kind == ErrorKind::ClusterDown {
                    self.want(now, streams);
                }
                true
            }
            _ => false,
        }
    }

    /// A new topology: the slot table, which nodes serve, the nodes to ask next time.
    fn apply(&mut self, t: Topology) -> Result<(), ClusterError> {
        let mut table = vec![NO_NODE; slots::SLOTS];
        let mut serving = vec![false; self.nodes.len()];
        for (s, e, master) in &t.ranges {
            let node = self.node_index(master).ok_or(ClusterError::TooManyNodes)?;
            serving.resize(self.nodes.len(), false);
            serving[usize::from(node)] = true;
            table[usize::from(*s)..=usize::from(*e)].fill(node);
        }
        serving.resize(self.nodes.len(), false);
        if table != self.slots {
            self.changed = true;
        }
        self.slots = table;
        self.serving = serving;
        self.known = t.nodes;
        self.unrouted.retain(|id| self.flights.contains_key(id));
        self.ready.extend(self.unrouted.drain(..));
        Ok(())
    }

    /// Whether link `i`'s node serves slots now.
    pub(super) fn serves(&self, i: usize) -> bool {
        self.serving.get(i / 2).copied().unwrap_or(false)
    }

    /// Asks for the topology (again) as soon as the last question is 100 ms old.
    pub(super) fn want(&mut self, now: u64, streams: &mut Streams) {
        self.wanted = true;
        self.poll(now, streams);
    }

    /// Every 300 ms while a serving node's link keeps failing.
    pub(super) fn want_soon(&mut self, now: u64, streams: &mut Streams) {
        if !self.wanted && self.side.is_idle() {
            self.wanted = true;
            self.refresh_at = self.refresh_at.max(now.saturating_add(REFRESH_WHILE_DOWN));
        }
        self.poll(now, streams);
    }

    /// Whom to ask: the nodes of the last answer, then the seeds; nodes whose links fail
    /// last (a host that swallows connections would hold the question up).
    fn candidates(&self) -> Vec<&Endpoint> {
        let failing = |e: &&Endpoint| {
            let n = self.nodes.iter().position(|x| x == *e);
            n.is_some_and(|n| self.failing.get(n).copied().unwrap_or(false))
        };
        let all = || self.known.iter().chain(&self.url.seeds);
        let mut c: Vec<&Endpoint> = Vec::new();
        for e in all().filter(|e| !failing(e)).chain(all().filter(failing)) {
            if !c.contains(&e) {
                c.push(e);
            }
        }
        c
    }

    fn poll(&mut self, now: u64, streams: &mut Streams) {
        if self.wanted && self.side.is_idle() && self.refresh_at <= now {
            let candidates = self.candidates();
            let target = candidates[self.next % candidates.len()].clone();
            self.side.open(now, &target, streams);
            self.asked = Some(target);
            self.wanted = false;
        }
    }

    pub(super) fn handle_timeout(&mut self, now: u64, streams: &mut Streams) {
        self.side_timeout(now, streams);
        let mut due = Vec::new();
        self.retries.retain(|&(at, id)| {
            let now_due = at <= now;
            if now_due {
                due.push(id);
            }
            !now_due
        });
        self.ready.extend(due);
        self.poll(now, streams);
    }

    /// Unrouted requests past their deadline.
    fn expired(&mut self, now: u64) -> Vec<u64> {
        let flights = &self.flights;
        let (gone, keep): (Vec<u64>, Vec<u64>) = self
            .unrouted
            .drain(..)
            .partition(|id| flights.get(id).is_none_or(|f| f.deadline <= now));
        self.unrouted = keep.into();
        gone
    }

    /// Notes a shard channel's subscription confirmed (or ended) on link `i`.
    pub(super) fn note_channel(&mut self, i: usize, channel: &[u8], on: bool) {
        if on {
            self.channels.insert(channel.to_vec(), i);
        } else if self.channels.get(channel) == Some(&i) {
            self.channels.remove(channel);
        }
    }

    /// The channels confirmed on link `i`, forgotten (it closed).
    pub(super) fn channels_on(&mut self, i: usize) -> Vec<Vec<u8>> {
        let lost: Vec<Vec<u8>> = self
            .channels
            .iter()
            .filter(|(_, l)| **l == i)
            .map(|(c, _)| c.clone())
            .collect();
        for c in &lost {
            self.channels.remove(c);
        }
        lost
    }
}

impl SideOwner for Cluster {
    fn side(&mut self) -> &mut SideConn {
        &mut self.side
    }

    fn ask(&mut self, now: u64, streams: &mut Streams) {
        let (id, what): (u64, &[u8]) = if self.use_slots {
            (SLOTS_ID, b"SLOTS")
        } else {
            (SHARDS_ID, b"SHARDS")
        };
        // Unreachable failure: a new connection takes any command.
        let _ = self.side.send(now, id, &[&b"CLUSTER"[..], what]);
        streams.counters.cluster_refreshes += 1;
    }

    fn answered(&mut self, now: u64, answers: Answers, streams: &mut Streams) {
        let asked = self
            .asked
            .clone()
            .unwrap_or_else(|| self.url.seeds[0].clone());
        let mut answer: Option<Result<Topology, String>> = None;
        for ev in answers.events {
            match ev {
                ConnEvent::Reply { id, reply } => {
                    let parsed = if id == SLOTS_ID {
                        parse_slots(&reply, &asked, self.url.tls)
                    } else {
                        parse_shards(&reply, &asked, self.url.tls)
                    };
                    answer = Some(parsed.map_err(|e| e.to_string()));
                }
                ConnEvent::Error { id: SHARDS_ID, .. } if !self.use_slots => {
                    // Before Redis 7: the same question in its older form.
                    self.use_slots = true;
                    let _ = self.side.send(now, SLOTS_ID, &[&b"CLUSTER"[..], b"SLOTS"]);
                    streams.counters.cluster_refreshes += 1;
                }
                ConnEvent::Error { error, .. } => {
                    answer = Some(Err(format!("CLUSTER SLOTS failed: {error}")));
                }
                ConnEvent::Ready { .. }
                | ConnEvent::Push(_)
                | ConnEvent::Failed { .. }
                | ConnEvent::Closed(_) => {}
            }
        }
        let answer = answer.map(|a| a.and_then(|t| self.apply(t).map_err(|e| e.to_string())));
        match (answer, answers.ended) {
            (Some(Ok(())), _) => {
                self.rounds.answered();
                self.side.close(true, streams);
                self.refresh_at = self.refresh_at.max(now.saturating_add(REFRESH_GAP));
            }
            (Some(Err(why)), _) => self.failed(now, &why, true, streams),
            (None, Some((why, shutdown))) => self.failed(now, &why, shutdown, streams),
            (None, None) => self.side.flush(streams),
        }
    }

    /// The node asked failed: the next candidate is asked, at once or after a round's backoff.
    fn failed(&mut self, now: u64, why: &str, shutdown: bool, streams: &mut Streams) {
        self.side.close(shutdown, streams);
        if let Some(Endpoint::Tcp { host, port, .. }) = &self.asked {
            self.last_error = format!("node {host}:{port}: {why}");
            self.fresh_error = true;
        }
        self.wanted = true;
        self.next = self.next.wrapping_add(1);
        let round_over;
        (self.refresh_at, round_over) = self.rounds.failed(now, self.candidates().len());
        if round_over {
            self.round_failed = Some(format!(
                "no node of the cluster answered CLUSTER SHARDS: {}",
                self.last_error
            ));
        }
        self.poll(now, streams);
    }
}

/// Per node: a link of it failed since its last handshake.
fn failing_nodes(links: &[super::Link]) -> Vec<bool> {
    links
        .chunks(2)
        .map(|pair| pair.iter().any(|l| l.failures > 0))
        .collect()
}

/// The URL a cluster's links handshake with (the first seed as the endpoint). A cluster
/// needs sharded wake-ups: a client channel would be broadcast to every node.
pub(super) fn server_url(
    c: &ClusterUrl,
    proto: &super::RedisProtocol,
) -> Result<super::RedisUrl, Error> {
    if !proto.options().sharded_wake {
        return Err(Error::InvalidConfig(
            "a Redis Cluster URL needs sharded wake-ups (sharded_wake)",
        ));
    }
    Ok(super::RedisUrl {
        endpoint: c
            .seeds
            .first()
            .cloned()
            .ok_or(Error::InvalidConfig("a Cluster URL names no seed node"))?,
        username: c.username.clone(),
        password: c.password.clone(),
        database: 0,
    })
}

impl RedisStream {
    /// Runs `f` on the topology connection's state, if a cluster.
    pub(super) fn with_cluster(&mut self, f: impl FnOnce(&mut Cluster, &mut super::Streams)) {
        if let Some(c) = &mut self.cluster {
            f(c, &mut self.streams);
        }
    }

    /// A subscription change on link `i`: which link each shard channel lives on.
    pub(super) fn cluster_note_push(&mut self, i: usize, push: &super::Push) {
        if let (
            Some(c),
            super::Push::Subscription {
                kind,
                channel: Some(ch),
                ..
            },
        ) = (&mut self.cluster, push)
        {
            c.note_channel(i, ch, kind.is_subscribe());
        }
    }

    /// Cluster, before the core has seen a clock: whether requests wait in the protocol. They
    /// are not admitted yet, as admitting one dates its deadline and the topology's open from
    /// the clock (the links' opens wait alike).
    pub(super) fn cluster_holds_requests(&mut self, core: &mut Client) -> bool {
        if self.cluster.is_none() || self.dated(core) {
            return false;
        }
        // The engine's commands become the protocol's requests.
        self.proto.pump(core);
        !self.proto.out.queue_is_empty()
    }

    /// Cluster: the requests to put on links now, after the topology's news (a new table, a
    /// round of failed questions); the links grow to one pair per node.
    pub(super) fn cluster_placements(
        &mut self,
        core: &mut Client,
        now: u64,
    ) -> Vec<(usize, u64, Vec<Arg>)> {
        let Some(c) = &mut self.cluster else {
            return Vec::new();
        };
        let mut failed = Vec::new();
        if let Some(why) = c.round_failed.take() {
            failed.extend(c.unrouted.drain(..).map(|id| (id, why.clone())));
        }
        if std::mem::take(&mut c.fresh_error) {
            self.last_close = format!("Redis Cluster: {}", c.last_error);
        }
        if std::mem::take(&mut c.changed) {
            // Not sent yet: they go to the slot's node in the new table.
            for link in &mut self.links {
                for (id, _) in link.waiting.drain(..) {
                    if id != ASKING_ID && c.flights.contains_key(&id) {
                        c.ready.push_back(id);
                    }
                }
            }
        }
        c.failing = failing_nodes(&self.links);
        let degraded = self.links.iter().enumerate().any(|(i, l)| {
            l.failures > 0 && c.serves(i) && now < l.reopen_at.saturating_add(DOWN_WINDOW)
        });
        if degraded {
            c.want_soon(now, &mut self.streams);
        }
        let placed = c.place(now, &mut self.streams);
        let needed = c.links_needed();
        while self.links.len() < needed {
            let which = if self.links.len() % 2 == 0 {
                Connection::Commands
            } else {
                Connection::Subscriber
            };
            self.links.push(super::Link::new(which));
        }
        for (id, why) in failed {
            self.fail_request(core, now, id, &why, false);
        }
        placed
    }

    /// Time passed: the topology connection's deadlines, retries due, unrouted requests
    /// past their deadline, argument vectors of requests the protocol forgot.
    pub(super) fn cluster_timeout(&mut self, core: &mut Client, now: u64) {
        let Some(c) = &mut self.cluster else {
            return;
        };
        c.handle_timeout(now, &mut self.streams);
        let expired = c.expired(now);
        let out = &self.proto.out;
        c.flights.retain(|id, _| out.get(*id).is_some());
        let why = if c.last_error.is_empty() {
            "no node of the cluster serves the slot yet".to_owned()
        } else {
            format!("Redis Cluster: {}", c.last_error)
        };
        for id in expired {
            self.fail_request(core, now, id, &why, false);
        }
    }

    /// An error reply to `id` on link `i`: `true` when it is a redirection or a retry that
    /// is followed, not the request's answer.
    pub(super) fn cluster_redirect(
        &mut self,
        core: &mut Client,
        now: u64,
        i: usize,
        id: u64,
        error: &ServerError,
    ) -> bool {
        let Some(c) = &mut self.cluster else {
            return false;
        };
        let from = self.links[i].endpoint.as_ref();
        let followed = c.redirected(core, now, id, error, from, &mut self.streams);
        if !followed {
            c.done(id);
        }
        followed
    }

    /// A link closed: the topology may have changed.
    pub(super) fn cluster_link_lost(&mut self, now: u64) {
        if let Some(c) = &mut self.cluster {
            c.failing = failing_nodes(&self.links);
            c.want(now, &mut self.streams);
        }
    }
}

#[cfg(test)]
#[path = "cluster_stream_tests.rs"]
mod tests;
