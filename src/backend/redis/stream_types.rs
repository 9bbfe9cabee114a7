//! The stream path's vocabulary: its settings, what it asks of the host, what it refuses,
//! its counters, the queue of IO the links and the side connections share, and the side
//! connections themselves (`side_stream.rs`).

use std::collections::{HashSet, VecDeque};

use super::Endpoint;
use super::{Arg, Conn, Connection, Resp, SubscriptionKind};
use crate::backend::outbox::MS;

#[path = "side_stream.rs"]
mod side;
pub(super) use side::{Answers, Rounds, SideConn, SideOwner};
#[cfg(test)]
pub(super) use side::{ROUND_BACKOFF_BASE, ROUND_BACKOFF_CAP};

/// How the stream path connects, besides the URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSettings {
    /// `CLIENT SETNAME` of both connections (`None`: unnamed).
    pub client_name: Option<Vec<u8>>,
    /// Which protocol the handshake asks for first.
    pub protocol: Resp,
    /// How long an open may take, from when it was asked for.
    pub connect_timeout_ns: u64,
    /// How long a command may wait for its reply, from when it was written.
    pub request_timeout_ns: u64,
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            client_name: None,
            protocol: Resp::Resp3,
            connect_timeout_ns: 5_000 * MS,
            request_timeout_ns: 5_000 * MS,
        }
    }
}

/// A piece of IO for the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamRequest<'a> {
    /// Open stream `stream` to `endpoint`; give up at `deadline` (the host's clock) and
    /// report it closed.
    Open {
        /// The new stream's id.
        stream: u64,
        /// Where to connect.
        endpoint: &'a Endpoint,
        /// When to give up.
        deadline: u64,
    },
    /// Write `bytes` on `stream`, in order after the earlier writes.
    Write {
        /// The stream.
        stream: u64,
        /// What to write.
        bytes: &'a [u8],
    },
    /// Close `stream` (no answer; later reads for it are ignored).
    Shutdown {
        /// The stream.
        stream: u64,
    },
}

/// Why an answer about a stream was refused (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// The id was never handed out by this object.
    #[error("unknown stream {0}")]
    Unknown(u64),
    /// Bytes for a stream the host has not reported opened.
    #[error("stream {0} is not open yet: report it opened before its bytes")]
    NotOpen(u64),
}

/// What the stream path saw, for diagnostics and tests (monotonic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamCounters {
    /// Streams asked for.
    pub opens: u64,
    /// Streams that ended (closed by the host, by the server, or shut down by the core).
    pub closes: u64,
    /// Answers for streams already closed (ignored).
    pub late_answers: u64,
    /// `SENTINEL GET-MASTER-ADDR-BY-NAME` questions sent (a Sentinel URL only).
    pub sentinel_lookups: u64,
    /// `CLUSTER SHARDS` / `CLUSTER SLOTS` questions sent (a Cluster URL only).
    pub cluster_refreshes: u64,
    /// `MOVED` and `ASK` redirections followed (a Cluster URL only).
    pub cluster_redirects: u64,
}

#[derive(Debug, Clone)]
pub(super) enum Io {
    Open {
        stream: u64,
        deadline: u64,
        endpoint: Endpoint,
    },
    Write {
        stream: u64,
        bytes: Vec<u8>,
    },
    Shutdown {
        stream: u64,
    },
}

/// Stream ids, the IO queued for the host and the counters: shared by the links and the
/// side connections.
#[derive(Debug)]
pub(super) struct Streams {
    pub(super) next: u64,
    pub(super) io: VecDeque<Io>,
    pub(super) counters: StreamCounters,
    /// A written buffer the host is done with, for the next write (see [`Streams::reclaim`]).
    pub(super) spare: Vec<u8>,
}

/// Largest written buffer kept for reuse.
const MAX_SPARE: usize = 16 << 10;

impl Streams {
    /// Queues what `conn` has to write on `stream`, if anything; it encodes on into the spare
    /// buffer.
    pub(super) fn write(&mut self, stream: u64, conn: &mut Conn) {
        if conn.has_output() {
            let bytes = conn.take_output_into(std::mem::take(&mut self.spare));
            self.io.push_back(Io::Write { stream, bytes });
        }
    }

    /// The host is done with `io`, the request handed out last: a write's buffer is kept.
    pub(super) fn reclaim(&mut self, io: Option<Io>) {
        if let Some(Io::Write { bytes, .. }) = io {
            if bytes.capacity() <= MAX_SPARE && bytes.capacity() > self.spare.capacity() {
                self.spare = bytes;
            }
        }
    }

    /// Asks for a new stream to `endpoint`; its id.
    pub(super) fn open(&mut self, endpoint: &Endpoint, deadline: u64) -> u64 {
        let stream = self.next;
        self.next += 1;
        self.counters.opens += 1;
        self.io.push_back(Io::Open {
            stream,
            deadline,
            endpoint: endpoint.clone(),
        });
        stream
    }

    /// A stream ended; `shutdown`: the core ends it (the host did not report it).
    pub(super) fn closed(&mut self, stream: u64, shutdown: bool) {
        if shutdown {
            self.io.push_back(Io::Shutdown { stream });
        }
        self.counters.closes += 1;
    }
}

/// Forgets `id` as a subscription in flight; whether it was one (no hashing when none is).
pub(super) fn unsub(subs: &mut HashSet<u64>, id: u64) -> bool {
    !subs.is_empty() && subs.remove(&id)
}

pub(super) fn note_subscription(subs: &mut HashSet<u64>, id: u64, args: &[Arg]) {
    if args
        .first()
        .and_then(|n| SubscriptionKind::from_name(n))
        .is_some()
    {
        subs.insert(id);
    }
}

/// A connection kind's link in `RedisStream::links`.
pub(super) fn index(which: Connection) -> usize {
    match which {
        Connection::Commands => 0,
        Connection::Subscriber => 1,
    }
}
