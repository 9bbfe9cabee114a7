//! One value for "the backend protocol a client has": the C ABI keeps exactly one per handle
//! and every input of the seam goes through here, so a host's driver is the same loop for
//! every backend.

use super::StatusAnswer;
use super::etcd::EtcdProtocol;
use super::memory::MemoryProtocol;
use super::redis::stream::{RedisStream, StreamError, StreamRequest};
use super::redis::{self, RedisProtocol};
use super::sql::{self, SqlProtocol};
use super::value::Value;
use crate::{Client, Event};

pub use super::sql::FailureKind;

/// Why an answer was not taken; nothing changed either way. The two differ for the host: a
/// wrong kind is a bug in its driver, an invalid answer may be a garbled reply from the
/// backend (then the request is reported failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnswerError {
    /// This backend's requests are not answered with this kind of answer.
    WrongKind(String),
    /// The answer did not decode; the text says what.
    Invalid(String),
}

impl std::fmt::Display for AnswerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnswerError::WrongKind(m) => f.write_str(m),
            AnswerError::Invalid(m) => write!(f, "invalid answer: {m}"),
        }
    }
}

/// A protocol, one per client.
#[derive(Debug)]
pub enum Protocol {
    /// The in-process reference service (tests, examples).
    Memory(Box<MemoryProtocol>),
    /// Redis: single server, Sentinel, Cluster, on the host's own client.
    Redis(Box<RedisProtocol>),
    /// Redis with its connections in the core: the host only moves bytes.
    RedisStream(Box<RedisStream>),
    /// SQLite or PostgreSQL.
    Sql(Box<SqlProtocol>),
    /// etcd through its JSON gateway.
    Etcd(Box<EtcdProtocol>),
}

/// Something that happened to one of the host's connections, as the protocol must hear it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionEvent {
    /// The connection was opened anew (after a failure or a restart): what lived on the old
    /// one (a checked schema, LISTENs, watches) is set up again.
    Reopened,
    /// A subscription to the channel took effect (Redis).
    Subscribed,
    /// A subscription ended, or the connection carrying it was lost (Redis).
    Unsubscribed,
}

/// The ordinary connection: every request that is not about notifications.
pub(crate) const CONNECTION_COMMANDS: u32 = 1;
/// The connection notifications arrive on (Redis subscriber, PostgreSQL listener).
pub(crate) const CONNECTION_NOTIFY: u32 = 2;

impl Protocol {
    /// The next event for the application.
    pub fn poll_event(&mut self, core: &mut Client) -> Option<Event> {
        match self {
            Protocol::Memory(p) => p.poll_event(core),
            Protocol::Redis(p) => p.poll_event(core),
            Protocol::RedisStream(p) => p.poll_event(core),
            Protocol::Sql(p) => p.poll_event(core),
            Protocol::Etcd(p) => p.poll_event(core),
        }
    }

    /// Whether the next request poll may find a request, without taking or moving anything
    /// (so what the last poll handed out stays valid). `false` means it finds none.
    pub fn may_have_request(&mut self, core: &mut Client) -> bool {
        match self {
            Protocol::RedisStream(p) => p.has_request(core),
            Protocol::Memory(p) => p.has_request(core),
            Protocol::Redis(p) => p.has_request(core),
            Protocol::Sql(p) => p.has_request(core),
            Protocol::Etcd(p) => p.has_request(core),
        }
    }

    /// When `handle_timeout` must be called at the latest.
    pub fn poll_timeout(&mut self, core: &mut Client) -> Option<u64> {
        match self {
            Protocol::Memory(p) => p.poll_timeout(core),
            Protocol::Redis(p) => p.poll_timeout(core),
            Protocol::RedisStream(p) => p.poll_timeout(core),
            Protocol::Sql(p) => p.poll_timeout(core),
            Protocol::Etcd(p) => p.poll_timeout(core),
        }
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, core: &mut Client, now: u64) {
        match self {
            Protocol::Memory(p) => p.handle_timeout(core, now),
            Protocol::Redis(p) => p.handle_timeout(core, now),
            Protocol::RedisStream(p) => p.handle_timeout(core, now),
            Protocol::Sql(p) => p.handle_timeout(core, now),
            Protocol::Etcd(p) => p.handle_timeout(core, now),
        }
    }

    /// Queues a status query; its answer comes out of [`Self::poll_status`].
    pub fn request_status(
        &mut self,
        core: &mut Client,
        now: u64,
        name: &str,
    ) -> Result<u64, crate::Error> {
        match self {
            Protocol::Memory(p) => p.request_status(core, now, name),
            Protocol::Redis(p) => p.request_status(now, name),
            Protocol::RedisStream(p) => p.request_status(core, now, name),
            Protocol::Sql(p) => p.request_status(core, now, name),
            Protocol::Etcd(p) => p.request_status(now, name),
        }
    }

    /// The next finished status query.
    pub fn poll_status(&mut self) -> Option<StatusAnswer> {
        match self {
            Protocol::Memory(p) => p.poll_status(),
            Protocol::Redis(p) => p.poll_status(),
            Protocol::RedisStream(p) => p.poll_status(),
            Protocol::Sql(p) => p.poll_status(),
            Protocol::Etcd(p) => p.poll_status(),
        }
    }

    /// The last error the backend reported or the protocol found in an answer ("" if none).
    pub fn last_error(&self) -> &str {
        match self {
            Protocol::Memory(p) => p.last_error(),
            Protocol::Redis(p) => p.last_error(),
            Protocol::RedisStream(p) => p.last_error(),
            Protocol::Sql(p) => p.last_error(),
            Protocol::Etcd(p) => p.last_error(),
        }
    }

    /// The client is closing: etcd revokes its pooled leases (locks still held end Lost);
    /// the other protocols have nothing of their own to give back.
    pub fn close(&mut self, core: &mut Client, now: u64) {
        if let Protocol::Etcd(p) = self {
            p.close(core, now);
        } else {
            core.handle_timeout(now);
        }
    }

    /// A values answer (Redis reply, SQL rows, memory answer) to request `id`. `Err` names
    /// what did not decode; nothing changed then.
    pub fn handle_values(
        &mut self,
        core: &mut Client,
        now: u64,
        id: u64,
        values: &[super::value::FlatValue],
        data: &[u8],
    ) -> Result<(), AnswerError> {
        let invalid = |e: &dyn std::fmt::Display| AnswerError::Invalid(e.to_string());
        match self {
            Protocol::Memory(p) => {
                let v = super::value::decode(values, data).map_err(|e| invalid(&e))?;
                p.handle_reply(core, now, id, &v);
            }
            Protocol::Redis(p) => {
                let v: Value<'_> = redis::decode(values, data).map_err(|e| invalid(&e))?;
                p.handle_reply(core, now, id, &v);
            }
            Protocol::Sql(p) => {
                let rows = sql::decode(values, data).map_err(|e| invalid(&e))?;
                p.handle_rows(core, now, id, &rows);
            }
            Protocol::Etcd(_) => {
                return Err(AnswerError::WrongKind(
                    "etcd requests are answered with lh_io_http_reply".to_owned(),
                ));
            }
            Protocol::RedisStream(_) => return Err(stream_only()),
        }
        Ok(())
    }

    /// An HTTP answer to request `id` (etcd).
    pub fn handle_http(
        &mut self,
        core: &mut Client,
        now: u64,
        id: u64,
        status: u16,
        body: &[u8],
    ) -> Result<(), AnswerError> {
        match self {
            Protocol::Etcd(p) => {
                p.handle_reply(core, now, id, status, body);
                Ok(())
            }
            _ => Err(AnswerError::WrongKind(
                "only etcd requests are answered with an HTTP reply".to_owned(),
            )),
        }
    }

    /// One message streamed on watch request `id` (etcd).
    pub fn handle_stream_message(
        &mut self,
        core: &mut Client,
        now: u64,
        id: u64,
        message: &[u8],
    ) -> Result<(), AnswerError> {
        match self {
            Protocol::Etcd(p) => {
                p.handle_watch_message(core, now, id, message);
                Ok(())
            }
            _ => Err(AnswerError::WrongKind(
                "only etcd watches stream messages".to_owned(),
            )),
        }
    }

    /// Request `id` got no answer (or a database error, for SQL); `message` is the host's.
    pub fn handle_failed(
        &mut self,
        core: &mut Client,
        now: u64,
        id: u64,
        kind: FailureKind,
        message: &str,
    ) -> Result<(), AnswerError> {
        match self {
            Protocol::Memory(p) => p.handle_failed(core, now, id, message),
            Protocol::Redis(p) => p.handle_request_failed_because(core, now, id, message),
            Protocol::Sql(p) => p.handle_failed(core, now, id, kind, message),
            Protocol::Etcd(p) => p.handle_failed(core, now, id, message),
            Protocol::RedisStream(_) => return Err(stream_only()),
        }
        Ok(())
    }

    /// A notification that arrived on `connection`: a Redis pub/sub message, a PostgreSQL
    /// NOTIFY, a memory service release (channel = the name). Every one is handed over; the
    /// protocol ignores what is not its own.
    pub fn handle_message(
        &mut self,
        core: &mut Client,
        now: u64,
        channel: &[u8],
        payload: &[u8],
    ) -> Result<(), AnswerError> {
        match self {
            Protocol::Memory(p) => p.handle_message(core, now, channel),
            Protocol::Redis(p) => p.handle_message(core, now, channel, payload),
            Protocol::Sql(p) => p.handle_notification(core, now, channel, payload),
            Protocol::Etcd(_) => {
                return Err(AnswerError::WrongKind(
                    "etcd messages arrive on their watch".to_owned(),
                ));
            }
            Protocol::RedisStream(_) => return Err(stream_only()),
        }
        Ok(())
    }

    /// Something happened to one of the host's connections.
    pub fn handle_connection(
        &mut self,
        core: &mut Client,
        now: u64,
        connection: u32,
        event: ConnectionEvent,
        channel: &[u8],
    ) -> Result<(), AnswerError> {
        match (self, event) {
            (Protocol::Memory(p), ConnectionEvent::Reopened) => p.handle_reconnect(core, now),
            (Protocol::Sql(p), ConnectionEvent::Reopened) => {
                let c = sql::Connection::from_u32(connection).ok_or_else(|| {
                    AnswerError::WrongKind(format!("unknown connection {connection}"))
                })?;
                p.handle_connection_reset(core, now, c);
            }
            (Protocol::Redis(p), ConnectionEvent::Subscribed | ConnectionEvent::Unsubscribed) => {
                p.handle_subscription(core, now, channel, event == ConnectionEvent::Subscribed);
            }
            // Redis reconnects are told through failed requests and lost subscriptions;
            // etcd's requests each name a member, so nothing lives on a connection.
            (Protocol::Redis(_) | Protocol::Etcd(_), ConnectionEvent::Reopened) => {
                core.handle_timeout(now);
            }
            (Protocol::RedisStream(_), _) => return Err(stream_only()),
            (_, e) => {
                return Err(AnswerError::WrongKind(format!(
                    "{e:?} does not apply to this backend"
                )));
            }
        }
        Ok(())
    }
}

fn stream_only() -> AnswerError {
    AnswerError::WrongKind(
        "this client owns its connections: answer with lh_io_opened, lh_io_received and \
         lh_io_closed"
            .to_owned(),
    )
}

/// Why a stream answer was not taken (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamAnswerError {
    /// This backend has no streams.
    WrongKind(String),
    /// The stream id was never handed out, or the answer does not fit its state.
    Stream(StreamError),
}

impl Protocol {
    /// The next stream request (`None` for backends without streams, or nothing to do).
    pub fn poll_stream_request(&mut self, core: &mut Client) -> Option<StreamRequest<'_>> {
        match self {
            Protocol::RedisStream(p) => p.poll_request(core),
            _ => None,
        }
    }

    fn stream(&mut self) -> Result<&mut RedisStream, StreamAnswerError> {
        match self {
            Protocol::RedisStream(p) => Ok(p),
            _ => Err(StreamAnswerError::WrongKind(
                "this backend opens no streams: its requests are calls".to_owned(),
            )),
        }
    }

    /// The host opened `stream`.
    pub fn handle_opened(
        &mut self,
        core: &mut Client,
        now: u64,
        stream: u64,
    ) -> Result<(), StreamAnswerError> {
        self.stream()?
            .handle_opened(core, now, stream)
            .map_err(StreamAnswerError::Stream)
    }

    /// Bytes the host read on `stream`.
    pub fn handle_received(
        &mut self,
        core: &mut Client,
        now: u64,
        stream: u64,
        bytes: &[u8],
    ) -> Result<(), StreamAnswerError> {
        self.stream()?
            .handle_received(core, now, stream, bytes)
            .map_err(StreamAnswerError::Stream)
    }

    /// `stream` closed or failed to open.
    pub fn handle_closed(
        &mut self,
        core: &mut Client,
        now: u64,
        stream: u64,
        message: &str,
    ) -> Result<(), StreamAnswerError> {
        self.stream()?
            .handle_closed(core, now, stream, message)
            .map_err(StreamAnswerError::Stream)
    }
}
