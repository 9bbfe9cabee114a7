//! Routing: the protocol's requests go to their connections (a cluster: to the node serving
//! their slot), the opens they need are asked for and the bytes to write are queued for the
//! host. Every output and input of [`RedisStream`] routes, so this is its hot path; it lives
//! apart from the inputs and outputs it serves.

use super::types::index;
use super::{Connection, RedisStream, State};
use crate::Client;

/// Most requests waiting for a connection to open; more fail at once.
const MAX_WAITING: usize = 4096;

impl RedisStream {
    /// Whether [`Self::poll_request`] would return a request now. It routes what the
    /// protocol has but takes nothing: the request last returned stays valid.
    pub fn has_request(&mut self, core: &mut Client) -> bool {
        self.route(core);
        !self.streams.io.is_empty()
    }

    /// Hands the protocol's requests to their connections, starts the opens they need and
    /// queues the bytes to write.
    ///
    /// A host polls several times per input and most polls find nothing new, so a route
    /// returns at once while nothing it reads has changed since a route that did nothing:
    /// no input (inputs set `unrouted`), the same clock, no request waiting for a connection
    /// (whether one is still worth sending follows the engine's leases) and none queued by
    /// the protocol (the engine's commands are pumped into it first).
    pub(super) fn route(&mut self, core: &mut Client) {
        let now = core.now();
        if !self.unrouted
            && now == self.routed_at
            && self.links.iter().all(|l| l.waiting.is_empty())
        {
            self.proto.pump(core);
            if self.proto.out.queue_is_empty() {
                return;
            }
        }
        let io = (self.streams.next, self.streams.io.len());
        let busy = self.route_all(core, now);
        self.routed_at = now;
        // A route that did more than write the requests it took to open connections may
        // have left something for the next one: that one runs in full too.
        let topology = self.sentinel.is_some() || self.cluster.is_some();
        self.unrouted =
            busy || self.streams.next != io.0 || (topology && io.1 != self.streams.io.len());
    }

    /// [`Self::route`] in full; whether it did more than write what it took to open
    /// connections (dropped, admitted to a cluster, held, refused or resolved anything).
    fn route_all(&mut self, core: &mut Client, now: u64) -> bool {
        // Nothing to drop in the common case: no call.
        let waiting = self.links.iter().any(|l| !l.waiting.is_empty());
        let mut busy = waiting && self.drop_abandoned(core, now);
        let mut refused: Vec<(u64, String)> = Vec::new();
        let mut placed = Vec::new();
        if !self.cluster_holds_requests(core) {
            while let Some(req) = self.proto.poll_request(core) {
                busy |= self.cluster.is_some();
                let (id, i) = (req.id, index(req.connection));
                match &mut self.cluster {
                    Some(c) => c.admit(now, id, req.connection, req.args.to_vec()),
                    // The common case: encoded from the protocol's own arguments, not a copy.
                    None => match self.links[i].send_now(now, id, req.args) {
                        Some(r) => refused.extend(r.err().map(|e| (id, e))),
                        None => placed.push((i, id, req.args.to_vec())),
                    },
                }
            }
        }
        if self.cluster.is_some() {
            placed = self.cluster_placements(core, now);
        }
        busy |= !placed.is_empty();
        for (i, id, args) in placed {
            let link = &mut self.links[i];
            if let Some(r) = link.send_now(now, id, &args) {
                refused.extend(r.err().map(|e| (id, e)));
                continue;
            }
            match &link.state {
                // The commands connection failed and waits out its backoff: fail at once,
                // as a refused connect would, so the engine's own retries and its callers'
                // bounds run on time rather than behind the reopen.
                State::Idle
                    if link.which == Connection::Commands
                        && link.failures > 0
                        && link.reopen_at > now =>
                {
                    refused.push((id, self.last_close.clone()))
                }
                _ if link.waiting.len() >= MAX_WAITING => refused.push((
                    id,
                    "too many requests wait for the Redis connection to open".to_owned(),
                )),
                _ => link.waiting.push_back((id, args)),
            }
        }
        busy |= !refused.is_empty();
        for (id, why) in refused {
            self.fail_request(core, now, id, &why, false);
        }
        self.follow_master(core, now);
        self.sentinel_news();
        let dated = self.dated(core);
        let mut resolve = false;
        for (i, link) in self.links.iter_mut().enumerate() {
            let master = match (&self.sentinel, &self.cluster) {
                (Some(d), _) => d.master(),
                (None, Some(c)) => c.node(i / 2),
                (None, None) => Some(&self.url.endpoint),
            };
            let open_now = match &link.state {
                State::Idle => dated && !link.waiting.is_empty() && link.reopen_at <= now,
                State::Resolving { .. } => master.is_some(),
                _ => false,
            };
            if let (true, Some(endpoint)) = (open_now, master) {
                let deadline = now.saturating_add(self.settings.connect_timeout_ns);
                link.stream = self.streams.open(endpoint, deadline);
                link.endpoint = Some(endpoint.clone());
                link.state = State::Opening { deadline };
            } else if open_now && matches!(link.state, State::Idle) {
                // Sentinel: no master known; the open waits for the sentinels' answer.
                let deadline = now.saturating_add(self.settings.connect_timeout_ns);
                link.state = State::Resolving { deadline };
                resolve = true;
            } else if let State::Open(conn) = &mut link.state {
                self.streams.write(link.stream, conn);
            }
        }
        if let (true, Some(d)) = (resolve, &mut self.sentinel) {
            d.start(now, &mut self.streams);
        }
        busy || resolve
    }
}
