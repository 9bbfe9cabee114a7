//! Backend protocols (docs/design.md §6): what to send to a lock service and what its replies mean,
//! written once in Rust for every host.
//!
//! A protocol sits between the lease engine ([`crate::Client`]) and the host's own client
//! library. It consumes the engine's commands and produces backend requests (for Redis: an
//! argument vector and the connection that runs it); it consumes replies and notifications
//! and feeds the engine's inputs. The engine stays backend-neutral; the host executes
//! requests verbatim and hands replies back unread.
//!
//! Each protocol keeps its pending requests, their order and expiry, the events and status
//! answers waiting to be polled and its last error in one shared outbox (`outbox.rs`), so the
//! three read alike and cannot drift. The reference lock service is not a client protocol: it
//! lives in [`crate::service`].

pub mod etcd;
pub mod memory;
mod outbox;
mod protocol;
pub mod redis;
pub mod sql;
pub mod value;

pub use protocol::{AnswerError, ConnectionEvent, FailureKind, Protocol, StreamAnswerError};
pub(crate) use protocol::{CONNECTION_COMMANDS, CONNECTION_NOTIFY};

/// What the backend says about one name (`leasehold status`): advisory, it can change at once.
/// Fields a backend does not record are `None`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LockStatus {
    /// A live grant exists.
    pub held: bool,
    /// The holder's fencing token, while held.
    pub fencing_token: Option<u64>,
    /// The holder's remaining TTL in ms, while held.
    pub remaining_ttl_ms: Option<u64>,
    /// The highest fence ever minted for the name (None: never, or not recorded).
    pub last_fencing_token: Option<u64>,
    /// SQLite: the holder's process id, while held.
    pub holder_pid: Option<i64>,
    /// SQLite: the holder's host name, while held (when recorded).
    pub holder_host: Option<String>,
    /// How long the current grant has been held, in ms (when recorded).
    pub held_for_ms: Option<u64>,
}

/// A finished status query: its id and what the backend said, or why it could not say.
pub type StatusAnswer = (u64, Result<LockStatus, String>);
