//! Redis Sentinel on the stream path: the core finds the master itself, so a host that
//! only moves bytes follows failovers too.
//!
//! [`Discovery`] keeps one connection to a sentinel. It asks
//! `SENTINEL GET-MASTER-ADDR-BY-NAME <name>` there, then subscribes to `+switch-master` on
//! the same connection and keeps it as a watch. A sentinel that cannot be reached, times
//! out, names no such master or answers garbage is left for the next one in the URL's order;
//! after a whole round fails, the next round waits for a backoff (50 ms doubling, at most
//! 2 s). The links of [`RedisStream`] open to the master it names and send `ROLE` first:
//! no request goes on a connection before the server says it is the master (else the link
//! is dropped and the master asked for again). A link that drops or meets `READONLY` makes
//! the discovery ask again (on a fresh sentinel connection); a `+switch-master` or an
//! answer naming another master drops the links still on the old one, and they reopen to
//! the new one at once. The watch is checked with a `PING` after every second it sits
//! idle: a sentinel gone silent without a close (a dead peer, a dropped route) would hide
//! every later `+switch-master`, so a `PING` unanswered within the request timeout ends the
//! connection and the next sentinel is asked. Requests in flight on a dropped link fail as
//! on any close, so the lock semantics are the single server's across a failover
//! (docs/backends.md, Redis Sentinel): a lease whose key did not reach the promoted replica
//! is rejected at its next renewal and ends Lost.

use super::{
    Answers, ConnEvent, Endpoint, Push, RedisStream, RedisUrl, Rounds, SideConn, SideOwner, State,
    StreamSettings, Streams,
};
use crate::backend::outbox::MS;
use crate::backend::redis::url::SentinelUrl;
use crate::backend::redis::wire::{ConnOptions, Reply};
use crate::{Client, Error};

/// The id `ROLE` is sent with on a master link (the protocol's ids never reach it).
pub(super) const ROLE_ID: u64 = u64::MAX;
const ASK_ID: u64 = 1;
const WATCH_ID: u64 = 2;
const PING_ID: u64 = 3;
/// How long the watch may sit idle before a `PING` checks it (module docs).
pub(super) const WATCH_PING_NS: u64 = 1_000 * MS;
const SWITCH_CHANNEL: &[u8] = b"+switch-master";
/// Longest host name a sentinel may name.
const MAX_HOST_LEN: usize = 255;

/// Why a sentinel's answer (or a master's `ROLE`) was not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SentinelError {
    /// `GET-MASTER-ADDR-BY-NAME` answered nil.
    #[error("the sentinel knows no master named {0:?}")]
    UnknownMaster(String),
    /// A reply without the shape the command has.
    #[error("the sentinel's reply is malformed: {0}")]
    Malformed(&'static str),
    /// The server the sentinels named says it is something else.
    #[error("the server the sentinels named is not the master (ROLE {0:?})")]
    NotMaster(String),
    /// `ROLE` answered something that is not a role.
    #[error("the server's ROLE reply is malformed")]
    BadRole,
}

fn text(r: &Reply) -> Option<&[u8]> {
    match r {
        Reply::Bulk(b) | Reply::Status(b) | Reply::Verbatim(b) => Some(b),
        _ => None,
    }
}

/// A master's address as a sentinel gives it (host and port as text).
fn endpoint(host: &[u8], port: &[u8]) -> Result<Endpoint, SentinelError> {
    let host = std::str::from_utf8(host)
        .ok()
        .filter(|h| !h.is_empty() && h.len() <= MAX_HOST_LEN)
        .filter(|h| !h.contains(|c: char| c.is_whitespace() || c.is_control()))
        .ok_or(SentinelError::Malformed("the host is not a host name"))?;
    let port = std::str::from_utf8(port)
        .ok()
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|&p| p != 0)
        .ok_or(SentinelError::Malformed("the port is not in 1..=65535"))?;
    Ok(Endpoint::Tcp {
        host: host.to_owned(),
        port,
        tls: false,
        server_name: host.to_owned(),
    })
}

/// Reads `SENTINEL GET-MASTER-ADDR-BY-NAME`'s reply: `[host, port]`, or nil.
pub fn master_addr(reply: &Reply, name: &str) -> Result<Endpoint, SentinelError> {
    match reply {
        Reply::Nil => Err(SentinelError::UnknownMaster(name.to_owned())),
        Reply::Array(items) => match &items[..] {
            [h, p] => endpoint(
                text(h).ok_or(SentinelError::Malformed("the host is not a string"))?,
                text(p).ok_or(SentinelError::Malformed("the port is not a string"))?,
            ),
            _ => Err(SentinelError::Malformed("not a host and a port")),
        },
        _ => Err(SentinelError::Malformed("not an array")),
    }
}

/// Reads a `+switch-master` payload (`name old-ip old-port new-ip new-port`): the new
/// master if it is `name`'s, `None` for another master's.
pub fn switch_master(payload: &[u8], name: &str) -> Result<Option<Endpoint>, SentinelError> {
    let parts: Vec<&[u8]> = payload
        .split(|b| *b == b' ')
        .filter(|p| !p.is_empty())
        .collect();
    match parts[..] {
        [n, _, _, host, port] if n == name.as_bytes() => endpoint(host, port).map(Some),
        [_, _, _, _, _] => Ok(None),
        _ => Err(SentinelError::Malformed(
            "a +switch-master message has five fields",
        )),
    }
}

/// Reads `ROLE`'s reply: `Ok` when the server is a master.
pub fn check_role(reply: &Reply) -> Result<(), SentinelError> {
    let Reply::Array(items) = reply else {
        return Err(SentinelError::BadRole);
    };
    match items.first().and_then(text) {
        Some(b"master") => Ok(()),
        Some(role) => Err(SentinelError::NotMaster(
            String::from_utf8_lossy(role).into_owned(),
        )),
        None => Err(SentinelError::BadRole),
    }
}

/// Finds the master through the sentinels and watches for failovers (module docs).
#[derive(Debug)]
pub(super) struct Discovery {
    url: SentinelUrl,
    /// The connection to the sentinel asked.
    side: SideConn,
    /// Asked for at least once: keeps a sentinel connection from then on.
    started: bool,
    /// The sentinel asked now, or next.
    next: usize,
    /// Sentinels that failed since one answered.
    rounds: Rounds,
    retry_at: u64,
    /// The connection has asked and is subscribed to `+switch-master`.
    watching: bool,
    /// Watching: when the next `PING` goes, if nothing is in flight by then.
    ping_at: u64,
    /// The master to open to (`None`: being asked for again).
    master: Option<Endpoint>,
    /// The master named last, and how many times that changed.
    named: Option<Endpoint>,
    generation: u64,
    last_error: String,
    /// `last_error` changed since the stream read it.
    fresh_error: bool,
}

impl Discovery {
    pub(super) fn new(url: SentinelUrl, settings: &StreamSettings) -> Result<Discovery, Error> {
        if url.sentinels.is_empty() {
            return Err(Error::InvalidConfig("a Sentinel URL names no sentinel"));
        }
        // The URL's credentials and database are the Redis servers'; sentinels get none.
        let opts = ConnOptions {
            client_name: settings.client_name.clone(),
            protocol: settings.protocol,
            request_timeout_ns: settings.request_timeout_ns,
            ..ConnOptions::default()
        };
        opts.validate()?;
        Ok(Discovery {
            url,
            side: SideConn::new(opts, settings.connect_timeout_ns),
            started: false,
            next: 0,
            rounds: Rounds::default(),
            retry_at: 0,
            watching: false,
            ping_at: 0,
            master: None,
            named: None,
            generation: 0,
            last_error: String::new(),
            fresh_error: false,
        })
    }

    /// The masters' credentials and database, with the first sentinel as the endpoint.
    pub(super) fn server_url(&self) -> RedisUrl {
        RedisUrl {
            endpoint: self.url.sentinels[0].clone(),
            username: self.url.username.clone(),
            password: self.url.password.clone(),
            database: self.url.database,
        }
    }

    pub(super) fn master(&self) -> Option<&Endpoint> {
        self.master.as_ref()
    }

    pub(super) fn stream(&self) -> u64 {
        self.side.stream()
    }

    pub(super) fn is_open(&self) -> bool {
        self.side.is_open()
    }

    /// Why links waited for a master in vain.
    pub(super) fn unresolved(&self) -> String {
        let mut why = format!(
            "no sentinel named the master {:?} in time",
            self.url.master_name
        );
        if !self.last_error.is_empty() {
            why.push_str(": ");
            why.push_str(&self.last_error);
        }
        why
    }

    pub(super) fn deadline(&self) -> Option<u64> {
        if self.side.is_idle() {
            self.started.then_some(self.retry_at)
        } else if self.watching {
            // A reply in flight has its own deadline; with none, the next PING is due.
            Some(self.side.deadline().unwrap_or(self.ping_at))
        } else {
            self.side.deadline()
        }
    }

    /// A link needs the master: connect to a sentinel if not connected.
    pub(super) fn start(&mut self, now: u64, streams: &mut Streams) {
        self.started = true;
        self.poll(now, streams);
    }

    /// The master may have moved (a link dropped, `READONLY`, `ROLE` said otherwise): ask
    /// again on a fresh connection, and open no link until the answer.
    pub(super) fn invalidate(&mut self, now: u64, streams: &mut Streams) {
        self.master = None;
        if self.watching {
            // Subscribed: a fresh connection to the same sentinel asks again.
            self.side.close(true, streams);
            self.watching = false;
        }
        self.start(now, streams);
    }

    pub(super) fn handle_timeout(&mut self, now: u64, streams: &mut Streams) {
        self.side_timeout(now, streams);
        if self.watching && self.side.deadline().is_none() && self.ping_at <= now {
            self.ping_at = now.saturating_add(WATCH_PING_NS);
            match self.side.send(now, PING_ID, &[b"PING"]) {
                Ok(()) => self.side.flush(streams),
                Err(e) => self.failed(now, &e.to_string(), true, streams),
            }
        }
        self.poll(now, streams);
    }

    /// Opens a connection to the next sentinel when one is wanted and due.
    fn poll(&mut self, now: u64, streams: &mut Streams) {
        if self.started && self.side.is_idle() && self.retry_at <= now {
            self.side.open(now, &self.url.sentinels[self.next], streams);
        }
    }

    fn named_master(&mut self, master: Endpoint) {
        if self.named.as_ref() != Some(&master) {
            self.named = Some(master.clone());
            self.generation += 1;
        }
        self.master = Some(master);
    }
}

impl SideOwner for Discovery {
    fn side(&mut self) -> &mut SideConn {
        &mut self.side
    }

    fn ask(&mut self, now: u64, streams: &mut Streams) {
        let ask: [&[u8]; 3] = [
            b"SENTINEL",
            b"GET-MASTER-ADDR-BY-NAME",
            self.url.master_name.as_bytes(),
        ];
        // Unreachable failure: a new connection takes any command.
        let _ = self.side.send(now, ASK_ID, &ask);
        streams.counters.sentinel_lookups += 1;
    }

    fn answered(&mut self, now: u64, answers: Answers, streams: &mut Streams) {
        let mut failed: Option<String> = None;
        // The masters named, in order, and whether the first answer came.
        let mut named = Vec::new();
        let mut answered = false;
        for ev in answers.events {
            match ev {
                ConnEvent::Reply { id: ASK_ID, reply } => {
                    match master_addr(&reply, &self.url.master_name) {
                        Ok(master) => {
                            named.push(master);
                            answered = true;
                        }
                        Err(e) => failed = Some(e.to_string()),
                    }
                }
                // Any answer to a PING shows the connection alive.
                ConnEvent::Error { id: PING_ID, .. } => {}
                ConnEvent::Error { error, .. } => {
                    failed = Some(String::from_utf8_lossy(&error.message).into_owned());
                }
                ConnEvent::Push(Push::Message { channel, payload })
                    if channel == SWITCH_CHANNEL =>
                {
                    // A garbled notice changes nothing: the links' drops and ROLE catch a
                    // move it would have announced.
                    if let Ok(Some(master)) = switch_master(&payload, &self.url.master_name) {
                        named.push(master);
                    }
                }
                ConnEvent::Ready { .. }
                | ConnEvent::Reply { .. }
                | ConnEvent::Push(_)
                | ConnEvent::Failed { .. }
                | ConnEvent::Closed(_) => {}
            }
        }
        if answered && failed.is_none() && answers.ended.is_none() {
            self.rounds.answered();
            let watch: [&[u8]; 2] = [b"SUBSCRIBE", SWITCH_CHANNEL];
            match self.side.send(now, WATCH_ID, &watch) {
                Ok(()) => {
                    self.watching = true;
                    self.ping_at = now.saturating_add(WATCH_PING_NS);
                }
                Err(e) => failed = Some(e.to_string()),
            }
        }
        for master in named {
            self.named_master(master);
        }
        if let Some((why, shutdown)) = answers.ended {
            self.failed(now, &why, shutdown, streams);
        } else if let Some(why) = failed {
            self.failed(now, &why, true, streams);
        } else {
            self.side.flush(streams);
        }
    }

    /// The sentinel asked failed: the next one is asked, at once or after a round's
    /// backoff.
    fn failed(&mut self, now: u64, why: &str, shutdown: bool, streams: &mut Streams) {
        self.side.close(shutdown, streams);
        if let Endpoint::Tcp { host, port, .. } = &self.url.sentinels[self.next] {
            self.last_error = format!("sentinel {host}:{port}: {why}");
            self.fresh_error = true;
        }
        self.watching = false;
        self.next = (self.next + 1) % self.url.sentinels.len();
        (self.retry_at, _) = self.rounds.failed(now, self.url.sentinels.len());
        self.poll(now, streams);
    }
}

impl RedisStream {
    /// The sentinels named another master: the links still on the old one are dropped and
    /// every link may open to the new one at once.
    pub(super) fn follow_master(&mut self, core: &mut Client, now: u64) {
        let Some(d) = &self.sentinel else {
            return;
        };
        let Some(master) = d.master().cloned() else {
            return;
        };
        if d.generation == self.generation {
            return;
        }
        self.generation = d.generation;
        for i in 0..2 {
            let link = &self.links[i];
            let stale = matches!(link.state, State::Opening { .. } | State::Open(_))
                && link.endpoint.as_ref() != Some(&master);
            if stale {
                self.drop_link(core, now, i, "the sentinels name another master");
            }
            self.links[i].reopen_at = now;
        }
    }

    /// Ends connection `i` from the core's side (not the master, or no longer): its
    /// requests in flight fail, the waiting ones wait for the next connection.
    pub(super) fn drop_link(&mut self, core: &mut Client, now: u64, i: usize, why: &str) {
        match &mut self.links[i].state {
            State::Open(conn) => {
                conn.handle_closed();
                let failed: Vec<(u64, bool)> = std::iter::from_fn(|| conn.poll_event())
                    .filter_map(|e| match e {
                        ConnEvent::Failed { id, sent } if id != ROLE_ID => Some((id, sent)),
                        _ => None,
                    })
                    .collect();
                for (id, sent) in failed {
                    self.links[i].subs.remove(&id);
                    self.fail_request(core, now, id, why, sent);
                }
            }
            State::Opening { .. } => {}
            State::Idle | State::Resolving { .. } => return,
        }
        self.down(core, now, i, why, true);
    }

    /// A sentinel's failure is the stream's last error (a request that times out waiting
    /// for the master says why).
    pub(super) fn sentinel_news(&mut self) {
        if let Some(d) = &mut self.sentinel {
            if std::mem::take(&mut d.fresh_error) {
                self.last_close = format!("Redis Sentinel: {}", d.last_error);
            }
        }
    }

    /// A link to the master failed: the sentinels are asked again.
    pub(super) fn master_lost(&mut self, now: u64) {
        if let Some(d) = &mut self.sentinel {
            d.invalidate(now, &mut self.streams);
        }
    }
}

#[cfg(test)]
#[path = "sentinel_stream_tests.rs"]
mod tests;
