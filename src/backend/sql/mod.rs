//! The SQL protocol (docs/design.md §6) for SQLite and PostgreSQL: the schema and its migration,
//! every statement with typed parameters, and what the rows mean, in one sans-IO object.
//!
//! [`SqlProtocol`] sits between the lease engine ([`Client`]) and a host that owns a
//! database connection (and, for PostgreSQL, a second one that LISTENs). It turns the
//! engine's commands into [`Request`]s — a short list of [`Statement`]s the host runs in
//! order on one connection, verbatim — and the rows the host hands back into the engine's
//! inputs. The host never writes SQL for the lock service and never reads a row itself.
//!
//! # A request
//!
//! Statements carry their own transaction control (SQLite: `BEGIN IMMEDIATE` … `COMMIT`;
//! PostgreSQL: one statement calling a function the migration created, so one round trip),
//! so the host runs them in autocommit mode. If one fails, the host stops, rolls back an open
//! transaction and reports the failure ([`SqlProtocol::handle_failed`]): a
//! [`FailureKind::Database`] (the database refused: busy, read-only, corrupt, missing table)
//! or a [`FailureKind::Transport`] (the connection broke: the outcome is unknown). Both are
//! transport errors for the engine, never grants; after either, the schema is checked again
//! before the next operation (a deleted file or a dropped table is re-created, and fences
//! still do not regress, see below).
//!
//! Parameters are typed ([`Param`]). A few are facts only the host knows, read once per
//! request when it starts executing it (any moment after polling it) and bound wherever the
//! kind appears ([`HostValue`]): SQLite expiry runs on the host's system-wide monotonic
//! clock (`CLOCK_MONOTONIC`, comparable between processes) tied to the boot id, and fences
//! use the wall clock. The core itself reads no clock.
//!
//! # Fences
//!
//! A table of last fences per name is never reset; a grant mints
//! `max(previous + 1, clock in µs)` (PostgreSQL: `clock_timestamp()`; SQLite: the host's wall
//! clock). Fences strictly increase per name, and if the table is lost (a deleted file, a
//! restored backup) the clock, far past the old fences, keeps them increasing while clocks are
//! sane. None exceeds 2^53: a stored fence that leaves no room (planted, corrupt) refuses the
//! name's acquires without writing anything.
//!
//! # The first request
//!
//! The first operation runs the migration: it creates missing tables (and, for PostgreSQL,
//! the functions), then checks the schema version and the column names and types. On SQLite
//! a read-only inspection comes first: a file holding anything but leasehold's tables is
//! another application's and is refused before anything is created or switched to WAL. Operations
//! wait for it; if it fails (a foreign table of the same name, a read-only or corrupt file),
//! they fail in transport with [`SqlProtocol::last_error`] saying why, and the next attempt
//! runs the migration again.
//!
//! # Notifications
//!
//! PostgreSQL: a release runs `pg_notify` on the name's channel ([`listen_channel`]); the
//! protocol asks the host to `LISTEN` on the listener connection while a local lease waits
//! for the name, and turns each notification into a wake-up. When a LISTEN takes effect, the
//! name is checked once (a release just before it reached nobody). SQLite has none: waiters
//! wake at the holder's expiry (the refusal's retry hint) or by backoff.

pub mod postgres;
mod rows;
pub mod sqlite;

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

pub use crate::backend::redis::value::{FlatValue, KIND_ARRAY, KIND_BULK, KIND_INT, KIND_NIL};
use crate::{
    AcquireResult, Client, Command, Event, LockName, Output, ReleaseResult, RenewResult, RequestId,
    Token,
};
pub(crate) use rows::{
    MAX_FENCE, check_columns, fence, fence_refusal, flag, int, ms_to_ns, one_row, opt_int, text,
    token_text,
};

const NEVER: u64 = u64::MAX;
const MS: u64 = 1_000_000;
const MAX_ERROR_TEXT: usize = 512;
/// How long an unanswered request is remembered (the engine timed it out long before).
const FORGET_AFTER_NS: u64 = 120_000 * MS;

/// `FlatValue::kind` / parameter kind: UTF-8 text (`offset`, `len`).
pub const KIND_TEXT: u32 = 7;
/// `FlatValue::kind` / parameter kind: a double; `integer` holds its IEEE-754 bits.
pub const KIND_FLOAT: u32 = 8;
/// Parameter kind: the host's system-wide monotonic clock in ns (Linux `CLOCK_MONOTONIC`).
pub const KIND_HOST_MONOTONIC_NS: u32 = 20;
/// Parameter kind: the host's wall clock in µs since the Unix epoch.
pub const KIND_HOST_WALL_US: u32 = 21;
/// Parameter kind: the host's boot id as text (`/proc/sys/kernel/random/boot_id`).
pub const KIND_HOST_BOOT_ID: u32 = 22;
/// Parameter kind: the executing process's id.
pub const KIND_HOST_PID: u32 = 23;
/// Parameter kind: the host name as text.
pub const KIND_HOST_NAME: u32 = 24;

/// Most values one result may hold.
pub const MAX_VALUES: usize = crate::backend::redis::value::MAX_VALUES;
/// Largest data buffer of one result, in bytes.
pub const MAX_DATA: usize = crate::backend::redis::value::MAX_DATA;

/// Which database the statements are written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Dialect {
    /// SQLite 3.24 or later (UPSERT), one file shared by the processes of one host.
    Sqlite = 1,
    /// PostgreSQL 11 or later.
    Postgres = 2,
}

impl Dialect {
    /// The dialect of a C value.
    pub fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::Sqlite),
            2 => Some(Self::Postgres),
            _ => None,
        }
    }
}

/// Which connection runs a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Connection {
    /// The ordinary connection (migration and every operation).
    Commands = 1,
    /// PostgreSQL: the connection that LISTENs and receives notifications.
    Listener = 2,
}

impl Connection {
    /// The connection of a C value.
    pub fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::Commands),
            2 => Some(Self::Listener),
            _ => None,
        }
    }
}

/// Tunables of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqlOptions {
    /// SQLite: how long a statement waits for another process's transaction before it fails
    /// (`PRAGMA busy_timeout`): a database that stays locked is a failure, never a hang.
    pub busy_timeout_ms: u64,
    /// PostgreSQL: acquire, renew and release commit without waiting for the WAL flush
    /// (`synchronous_commit = off` for their own transactions only). Several times the
    /// throughput on a server that flushes, but a server crash may forget the last moments'
    /// grants and releases (docs/backends.md). Off by default; SQLite ignores it.
    pub asynchronous_commit: bool,
}

impl Default for SqlOptions {
    fn default() -> Self {
        Self {
            busy_timeout_ms: 5_000,
            asynchronous_commit: false,
        }
    }
}

impl SqlOptions {
    /// Rejects values that defeat the bound.
    pub fn validate(&self) -> Result<(), crate::Error> {
        if self.busy_timeout_ms > 600_000 {
            return Err(crate::Error::InvalidConfig(
                "busy_timeout_ms must be at most 600000",
            ));
        }
        Ok(())
    }
}

/// A fact the host binds when it executes a request (read once per request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum HostValue {
    /// `CLOCK_MONOTONIC` in ns, as an integer.
    MonotonicNs = KIND_HOST_MONOTONIC_NS,
    /// Wall clock in µs since the Unix epoch, as an integer.
    WallUs = KIND_HOST_WALL_US,
    /// The boot id, as text.
    BootId = KIND_HOST_BOOT_ID,
    /// The process id, as an integer.
    Pid = KIND_HOST_PID,
    /// The host name, as text.
    HostName = KIND_HOST_NAME,
}

/// One typed parameter of a statement (`?N` in SQLite, `$N` in PostgreSQL, in order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    /// SQL NULL.
    Null,
    /// A 64-bit integer.
    Int(i64),
    /// UTF-8 text.
    Text(String),
    /// Bytes (BLOB / bytea).
    Blob(Vec<u8>),
    /// A host fact, bound at execution.
    Host(HostValue),
}

/// One statement and its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// The SQL text, placeholders in the dialect's form.
    pub sql: Cow<'static, str>,
    /// Parameters, `?1`/`$1` first.
    pub params: Vec<Param>,
}

impl Statement {
    fn bare(sql: impl Into<Cow<'static, str>>) -> Self {
        Self {
            sql: sql.into(),
            params: Vec::new(),
        }
    }

    fn with(sql: &'static str, params: Vec<Param>) -> Self {
        Self {
            sql: Cow::Borrowed(sql),
            params,
        }
    }
}

/// A request for the host: run `statements` in order on `connection` and answer `id` with
/// every statement's rows ([`SqlProtocol::handle_rows`]) or a failure
/// ([`SqlProtocol::handle_failed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// Id to answer with; never reused.
    pub id: u64,
    /// Where to run it.
    pub connection: Connection,
    /// The statements.
    pub statements: &'a [Statement],
}

/// One column value of a row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SqlValue<'a> {
    /// NULL.
    Null,
    /// An integer (booleans are 0/1).
    Int(i64),
    /// A double.
    Float(f64),
    /// Text.
    Text(&'a [u8]),
    /// Bytes.
    Blob(&'a [u8]),
}

/// The rows of one statement, each a list of columns.
pub type Rows<'a> = Vec<Vec<SqlValue<'a>>>;

/// How a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum FailureKind {
    /// The connection broke or timed out: the transaction may or may not have committed.
    Transport = 1,
    /// The database refused a statement (busy, read-only, corrupt, missing table, …); the
    /// transaction was rolled back.
    Database = 2,
}

impl FailureKind {
    /// The kind of a C value.
    pub fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::Transport),
            2 => Some(Self::Database),
            _ => None,
        }
    }
}

/// Why a flat result could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// More than [`MAX_VALUES`] values or a data buffer over [`MAX_DATA`] bytes.
    #[error("the result is larger than the protocol accepts")]
    TooLarge,
    /// The list is not an array of statements, each an array of rows, each an array of
    /// columns.
    #[error("value {index} breaks the shape statements > rows > columns")]
    Shape {
        /// Position in the flat list.
        index: usize,
    },
    /// A kind this library does not know (or one a row cannot hold).
    #[error("value {index} has kind {kind}, not a column value")]
    UnknownKind {
        /// Position in the flat list.
        index: usize,
        /// The kind given.
        kind: u32,
    },
    /// A string reaches past the end of the data buffer.
    #[error("value {index} points outside the data buffer")]
    OutOfBounds {
        /// Position in the flat list.
        index: usize,
    },
    /// Values follow the complete result.
    #[error("{extra} values follow the complete result")]
    Trailing {
        /// How many.
        extra: usize,
    },
}

/// Decodes a flat result: an array with one element per statement, each an array of rows,
/// each an array of column values. Work and memory are linear in `values.len()`.
pub fn decode<'a>(values: &[FlatValue], data: &'a [u8]) -> Result<Vec<Rows<'a>>, DecodeError> {
    if values.len() > MAX_VALUES || data.len() > MAX_DATA {
        return Err(DecodeError::TooLarge);
    }
    let mut at = 0usize;
    let array = |at: &mut usize| -> Result<usize, DecodeError> {
        let index = *at;
        let v = values.get(index).ok_or(DecodeError::Shape { index })?;
        *at += 1;
        let remaining = values.len() - *at;
        match usize::try_from(v.len) {
            Ok(n) if v.kind == KIND_ARRAY && n <= remaining => Ok(n),
            _ => Err(DecodeError::Shape { index }),
        }
    };
    let statements = array(&mut at)?;
    let mut out = Vec::with_capacity(statements);
    for _ in 0..statements {
        let nrows = array(&mut at)?;
        let mut rows = Vec::with_capacity(nrows);
        for _ in 0..nrows {
            let ncols = array(&mut at)?;
            let mut row = Vec::with_capacity(ncols);
            for _ in 0..ncols {
                let index = at;
                let v = values.get(index).ok_or(DecodeError::Shape { index })?;
                at += 1;
                let string = || {
                    let start = usize::try_from(v.offset).ok()?;
                    let end = start.checked_add(usize::try_from(v.len).ok()?)?;
                    data.get(start..end)
                };
                row.push(match v.kind {
                    KIND_NIL => SqlValue::Null,
                    KIND_INT => SqlValue::Int(v.integer),
                    KIND_FLOAT => SqlValue::Float(f64::from_bits(v.integer as u64)),
                    KIND_TEXT => {
                        SqlValue::Text(string().ok_or(DecodeError::OutOfBounds { index })?)
                    }
                    KIND_BULK => {
                        SqlValue::Blob(string().ok_or(DecodeError::OutOfBounds { index })?)
                    }
                    kind => return Err(DecodeError::UnknownKind { index, kind }),
                });
            }
            rows.push(row);
        }
        out.push(rows);
    }
    if at != values.len() {
        return Err(DecodeError::Trailing {
            extra: values.len() - at,
        });
    }
    Ok(out)
}

/// Flattens results into the host form (what Rust hosts and tests hand over).
pub fn encode(results: &[Rows<'_>], values: &mut Vec<FlatValue>, data: &mut Vec<u8>) {
    let array = |n: usize| FlatValue {
        kind: KIND_ARRAY,
        len: n as u64,
        ..FlatValue::default()
    };
    values.push(array(results.len()));
    for rows in results {
        values.push(array(rows.len()));
        for row in rows {
            values.push(array(row.len()));
            for v in row {
                let mut string = |kind: u32, s: &[u8]| {
                    values.push(FlatValue {
                        kind,
                        integer: 0,
                        offset: data.len() as u64,
                        len: s.len() as u64,
                    });
                    data.extend_from_slice(s);
                };
                match *v {
                    SqlValue::Null => values.push(FlatValue {
                        kind: KIND_NIL,
                        ..FlatValue::default()
                    }),
                    SqlValue::Int(i) => values.push(FlatValue {
                        kind: KIND_INT,
                        integer: i,
                        ..FlatValue::default()
                    }),
                    SqlValue::Float(f) => values.push(FlatValue {
                        kind: KIND_FLOAT,
                        integer: f.to_bits() as i64,
                        ..FlatValue::default()
                    }),
                    SqlValue::Text(s) => string(KIND_TEXT, s),
                    SqlValue::Blob(s) => string(KIND_BULK, s),
                }
            }
        }
    }
}

/// The PostgreSQL notification channel of a lock name: `lh_` and 16 hex digits of a stable
/// 64-bit hash (FNV-1a) of the name. Names are longer than channel names may be; two names
/// sharing a channel only cost a spurious wake-up (the payload is the name).
pub fn listen_channel(name: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("lh_{h:016x}")
}

pub use super::LockStatus;

/// What the protocol saw, for diagnostics and tests (monotonic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SqlCounters {
    /// Requests emitted.
    pub requests: u64,
    /// Migrations emitted.
    pub migrations: u64,
    /// Requests the database refused.
    pub database_errors: u64,
    /// Requests that failed in transport.
    pub transport_failures: u64,
    /// Results of a shape the request cannot have (a foreign table, a wrong type).
    pub garbage_results: u64,
    /// Results and failures for unknown or already answered ids.
    pub stale_results: u64,
    /// Notifications that woke a waiting name.
    pub wakeups: u64,
    /// Notifications for names nobody here waits for, or malformed.
    pub ignored_notifications: u64,
}

/// The outcome of an acquire, as the dialects read it from rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Acquired {
    Granted {
        fence: u64,
    },
    Held {
        left_ms: Option<u64>,
    },
    /// Nothing written: the name's stored fence leaves no room for another (why).
    Refused(String),
}

#[derive(Debug, Clone)]
enum Op {
    /// SQLite: what the file holds, before anything is created or switched.
    Inspect,
    Migrate,
    Acquire {
        req: RequestId,
        name: LockName,
        token: Token,
        ttl_ms: u64,
    },
    Renew {
        req: RequestId,
        name: LockName,
        token: Token,
        ttl_ms: u64,
    },
    Release {
        req: RequestId,
        name: LockName,
        token: Token,
    },
    Status {
        id: u64,
        name: LockName,
    },
    Listen {
        name: LockName,
    },
    Unlisten,
}

#[derive(Debug)]
struct Pending {
    op: Op,
    connection: Connection,
    statements: Vec<Statement>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Schema {
    Unchecked,
    Migrating,
    Ready,
}

#[derive(Debug)]
struct Watched {
    channel: String,
    /// The LISTEN took effect on the current listener connection.
    live: bool,
}

/// The SQL protocol of one client core. See the module docs.
#[derive(Debug)]
pub struct SqlProtocol {
    dialect: Dialect,
    opts: SqlOptions,
    next_id: u64,
    pending: HashMap<u64, Pending>,
    expiry: BinaryHeap<Reverse<(u64, u64)>>,
    outbox: VecDeque<u64>,
    events: VecDeque<Event>,
    schema: Schema,
    parked: Vec<Op>,
    watched: HashMap<LockName, Watched>,
    relisten_at: u64,
    statuses: VecDeque<crate::backend::StatusAnswer>,
    counters: SqlCounters,
    last_error: String,
}

impl SqlProtocol {
    /// Creates the protocol for one core.
    pub fn new(dialect: Dialect, opts: SqlOptions) -> Result<Self, crate::Error> {
        opts.validate()?;
        Ok(Self {
            dialect,
            opts,
            next_id: 0,
            pending: HashMap::new(),
            expiry: BinaryHeap::new(),
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            schema: Schema::Unchecked,
            parked: Vec::new(),
            watched: HashMap::new(),
            relisten_at: NEVER,
            statuses: VecDeque::new(),
            counters: SqlCounters::default(),
            last_error: String::new(),
        })
    }

    /// The dialect.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Counters.
    pub fn counters(&self) -> SqlCounters {
        self.counters
    }

    /// The last database error, failed schema check or malformed result ("" if none).
    pub fn last_error(&self) -> &str {
        &self.last_error
    }

    /// Whether the schema was checked on the current connection.
    pub fn is_ready(&self) -> bool {
        self.schema == Schema::Ready
    }

    // ------------------------------------------------------------------------ outputs

    /// The next request to execute. The statements borrow this object until its next
    /// mutation.
    pub fn poll_request(&mut self, core: &mut Client) -> Option<Request<'_>> {
        self.pump(core);
        while let Some(id) = self.outbox.pop_front() {
            if self.pending.contains_key(&id) {
                let p = &self.pending[&id];
                return Some(Request {
                    id,
                    connection: p.connection,
                    statements: &p.statements,
                });
            }
        }
        None
    }

    /// The next event for the application.
    pub fn poll_event(&mut self, core: &mut Client) -> Option<Event> {
        self.pump(core);
        self.events.pop_front()
    }

    /// The next finished status query: its id and what the database said (or why not).
    pub fn poll_status(&mut self) -> Option<crate::backend::StatusAnswer> {
        self.statuses.pop_front()
    }

    /// When [`Self::handle_timeout`] must be called at the latest.
    pub fn poll_timeout(&mut self, core: &mut Client) -> Option<u64> {
        let t = core.poll_timeout().unwrap_or(NEVER).min(self.relisten_at);
        (t != NEVER).then_some(t)
    }

    // ------------------------------------------------------------------------- inputs

    /// Time passed: runs the engine's timers and due re-LISTENs.
    pub fn handle_timeout(&mut self, core: &mut Client, now: u64) {
        core.handle_timeout(now);
        let now = core.now();
        if self.relisten_at <= now {
            self.relisten_at = NEVER;
            self.relisten_all(now);
        }
        self.prune(core, now);
        self.pump(core);
    }

    /// Asks the database about `name` (for `leasehold status`); the answer comes out of
    /// [`Self::poll_status`] with the returned id.
    pub fn request_status(
        &mut self,
        core: &mut Client,
        now: u64,
        name: &str,
    ) -> Result<u64, crate::Error> {
        crate::validate_name(name)?;
        core.handle_timeout(now);
        self.next_id += 1;
        let id = self.next_id;
        self.submit(
            Op::Status {
                id,
                name: LockName::from(name),
            },
            core.now(),
        );
        self.pump(core);
        Ok(id)
    }

    /// The rows of every statement of request `id`, in order. Unknown and already answered
    /// ids are counted and ignored.
    pub fn handle_rows(&mut self, core: &mut Client, now: u64, id: u64, results: &[Rows<'_>]) {
        core.handle_timeout(now);
        let now = core.now();
        let Some(p) = self.pending.remove(&id) else {
            self.counters.stale_results += 1;
            self.pump(core);
            return;
        };
        if results.len() != p.statements.len() {
            let msg = format!(
                "{} results for {} statements",
                results.len(),
                p.statements.len()
            );
            self.garbage(&msg);
            self.fail_op(core, p.op, now, &msg);
            self.pump(core);
            return;
        }
        match p.op {
            Op::Inspect => match sqlite::check_inspection(results) {
                Ok(()) => self.emit(Op::Migrate, now),
                Err(msg) => self.schema_unusable(core, now, &msg),
            },
            Op::Migrate => {
                let checked = match self.dialect {
                    Dialect::Sqlite => sqlite::check_migration(results),
                    Dialect::Postgres => postgres::check_migration(results),
                };
                match checked {
                    Ok(()) => {
                        self.schema = Schema::Ready;
                        for op in std::mem::take(&mut self.parked) {
                            self.emit(op, now);
                        }
                    }
                    Err(msg) => self.schema_unusable(core, now, &msg),
                }
            }
            Op::Acquire {
                req,
                ref name,
                ttl_ms,
                ..
            } => {
                let read = match self.dialect {
                    Dialect::Sqlite => sqlite::read_acquire(results),
                    Dialect::Postgres => postgres::read_acquire(results),
                };
                let result = match read {
                    Ok(Acquired::Granted { fence }) => AcquireResult::Granted {
                        fencing_token: fence,
                        ttl_ms,
                        backend_data: &[],
                    },
                    Ok(Acquired::Held { left_ms }) => AcquireResult::HeldByOther {
                        retry_after_ms: left_ms,
                    },
                    Ok(Acquired::Refused(why)) => {
                        self.note_error(&format!("acquire of {name:?} refused: {why}"));
                        AcquireResult::TransportError
                    }
                    Err(msg) => {
                        self.garbage(&format!("acquire of {name:?}: {msg}"));
                        AcquireResult::TransportError
                    }
                };
                let _ = core.handle_acquire_result(now, req, result);
            }
            Op::Renew { req, ref name, .. } => {
                let read = match self.dialect {
                    Dialect::Sqlite => sqlite::read_renew(results),
                    Dialect::Postgres => postgres::read_flag(results),
                };
                let result = match read {
                    Ok(true) => RenewResult::Renewed,
                    Ok(false) => RenewResult::Rejected,
                    Err(msg) => {
                        self.garbage(&format!("renew of {name:?}: {msg}"));
                        RenewResult::TransportError
                    }
                };
                let _ = core.handle_renew_result(now, req, result);
            }
            Op::Release { req, ref name, .. } => {
                let read = match self.dialect {
                    Dialect::Sqlite => sqlite::read_release(results),
                    Dialect::Postgres => postgres::read_flag(results),
                };
                let result = match read {
                    Ok(true) => ReleaseResult::Released,
                    Ok(false) => ReleaseResult::NotOwner,
                    Err(msg) => {
                        self.garbage(&format!("release of {name:?}: {msg}"));
                        ReleaseResult::TransportError
                    }
                };
                let _ = core.handle_release_result(now, req, result);
            }
            Op::Status { id, .. } => {
                let read = match self.dialect {
                    Dialect::Sqlite => sqlite::read_status(results),
                    Dialect::Postgres => postgres::read_status(results),
                };
                if let Err(msg) = &read {
                    self.garbage(&format!("status: {msg}"));
                }
                self.statuses.push_back((id, read));
            }
            Op::Listen { name } => {
                if let Some(w) = self.watched.get_mut(&name) {
                    if !w.live {
                        w.live = true;
                        // A release just before the LISTEN took effect reached nobody.
                        let _ = core.handle_released(now, &name);
                    }
                }
            }
            Op::Unlisten => {}
        }
        self.pump(core);
    }

    /// The inspection or the migration refused the database: everything parked fails.
    fn schema_unusable(&mut self, core: &mut Client, now: u64, msg: &str) {
        self.counters.garbage_results += 1;
        self.note_error(&format!("the lock schema is not usable: {msg}"));
        self.schema = Schema::Unchecked;
        let detail = self.last_error.clone();
        for op in std::mem::take(&mut self.parked) {
            self.fail_op(core, op, now, &detail);
        }
    }

    /// Request `id` failed: the database refused it, or the connection broke. The engine sees
    /// a transport error; the schema is checked again before the next operation.
    pub fn handle_failed(
        &mut self,
        core: &mut Client,
        now: u64,
        id: u64,
        kind: FailureKind,
        message: &str,
    ) {
        core.handle_timeout(now);
        let now = core.now();
        let Some(p) = self.pending.remove(&id) else {
            self.counters.stale_results += 1;
            self.pump(core);
            return;
        };
        match kind {
            FailureKind::Transport => self.counters.transport_failures += 1,
            FailureKind::Database => self.counters.database_errors += 1,
        }
        let what = match kind {
            FailureKind::Transport => "connection failed",
            FailureKind::Database => "database error",
        };
        self.note_error(&format!("{what}: {message}"));
        if p.connection == Connection::Commands {
            self.schema = Schema::Unchecked;
        }
        let detail = self.last_error.clone();
        self.fail_op(core, p.op, now, &detail);
        self.pump(core);
    }

    /// A notification from the listener connection (PostgreSQL): `payload` is the released
    /// name. Anything for a name nobody here waits for is counted and ignored.
    pub fn handle_notification(
        &mut self,
        core: &mut Client,
        now: u64,
        channel: &[u8],
        payload: &[u8],
    ) {
        core.handle_timeout(now);
        let now = core.now();
        let name = std::str::from_utf8(payload).ok().filter(|n| {
            self.watched
                .get(*n)
                .is_some_and(|w| w.channel.as_bytes() == channel)
        });
        match name {
            Some(n) => {
                self.counters.wakeups += 1;
                let _ = core.handle_released(now, n);
            }
            None => self.counters.ignored_notifications += 1,
        }
        self.pump(core);
    }

    /// The host opened `connection` anew (after a failure, a restart of the server, a
    /// replaced SQLite file): commands re-check the schema first; the listener LISTENs again
    /// (each name is checked once when its LISTEN takes effect).
    pub fn handle_connection_reset(&mut self, core: &mut Client, now: u64, connection: Connection) {
        core.handle_timeout(now);
        let now = core.now();
        match connection {
            Connection::Commands => {
                if self.schema == Schema::Ready {
                    self.schema = Schema::Unchecked;
                }
            }
            Connection::Listener => self.relisten_all(now),
        }
        self.pump(core);
    }

    // ---------------------------------------------------------------------- internals

    fn pump(&mut self, core: &mut Client) {
        while let Some(out) = core.poll_output() {
            match out {
                Output::Event(ev) => self.events.push_back(ev),
                Output::Command(cmd) => self.on_command(core.now(), cmd),
            }
        }
    }

    fn on_command(&mut self, now: u64, cmd: Command) {
        match cmd {
            Command::Acquire {
                request,
                name,
                token,
                ttl_ms,
                ..
            } => self.submit(
                Op::Acquire {
                    req: request,
                    name,
                    token,
                    ttl_ms,
                },
                now,
            ),
            Command::Renew {
                request,
                name,
                token,
                ttl_ms,
                ..
            } => self.submit(
                Op::Renew {
                    req: request,
                    name,
                    token,
                    ttl_ms,
                },
                now,
            ),
            Command::Release {
                request,
                name,
                token,
                ..
            } => self.submit(
                Op::Release {
                    req: request,
                    name,
                    token,
                },
                now,
            ),
            Command::Watch { name } => {
                if self.dialect == Dialect::Postgres && !self.watched.contains_key(&name) {
                    self.watched.insert(
                        name.clone(),
                        Watched {
                            channel: listen_channel(&name),
                            live: false,
                        },
                    );
                    self.emit(Op::Listen { name }, now);
                }
            }
            Command::Unwatch { name } => {
                if let Some(w) = self.watched.remove(&name) {
                    let sql = format!("UNLISTEN {}", w.channel);
                    self.push(
                        Op::Unlisten,
                        Connection::Listener,
                        vec![Statement::bare(sql)],
                        now,
                    );
                }
            }
        }
    }

    /// An operation that needs the schema: emitted now, or after the migration.
    fn submit(&mut self, op: Op, now: u64) {
        match self.schema {
            Schema::Ready => self.emit(op, now),
            Schema::Migrating => self.parked.push(op),
            Schema::Unchecked => {
                self.parked.push(op);
                self.schema = Schema::Migrating;
                let first = match self.dialect {
                    Dialect::Sqlite => Op::Inspect,
                    Dialect::Postgres => Op::Migrate,
                };
                self.emit(first, now);
            }
        }
    }

    fn emit(&mut self, op: Op, now: u64) {
        let (connection, statements) = match (&op, self.dialect) {
            (Op::Inspect, _) => (Connection::Commands, sqlite::inspection(&self.opts)),
            (Op::Migrate, Dialect::Sqlite) => {
                self.counters.migrations += 1;
                (Connection::Commands, sqlite::migration(&self.opts))
            }
            (Op::Migrate, Dialect::Postgres) => {
                self.counters.migrations += 1;
                (Connection::Commands, postgres::migration())
            }
            (
                Op::Acquire {
                    name,
                    token,
                    ttl_ms,
                    ..
                },
                d,
            ) => (
                Connection::Commands,
                match d {
                    Dialect::Sqlite => sqlite::acquire(name, token, *ttl_ms),
                    Dialect::Postgres => postgres::acquire(&self.opts, name, token, *ttl_ms),
                },
            ),
            (
                Op::Renew {
                    name,
                    token,
                    ttl_ms,
                    ..
                },
                d,
            ) => (
                Connection::Commands,
                match d {
                    Dialect::Sqlite => sqlite::renew(name, token, *ttl_ms),
                    Dialect::Postgres => postgres::renew(&self.opts, name, token, *ttl_ms),
                },
            ),
            (Op::Release { name, token, .. }, d) => (
                Connection::Commands,
                match d {
                    Dialect::Sqlite => sqlite::release(name, token),
                    Dialect::Postgres => postgres::release(&self.opts, name, token),
                },
            ),
            (Op::Status { name, .. }, d) => (
                Connection::Commands,
                match d {
                    Dialect::Sqlite => sqlite::status(name),
                    Dialect::Postgres => postgres::status(name),
                },
            ),
            (Op::Listen { name }, _) => (
                Connection::Listener,
                vec![Statement::bare(format!("LISTEN {}", listen_channel(name)))],
            ),
            (Op::Unlisten, _) => return,
        };
        self.push(op, connection, statements, now);
    }

    fn push(&mut self, op: Op, connection: Connection, statements: Vec<Statement>, now: u64) {
        self.next_id += 1;
        let id = self.next_id;
        self.counters.requests += 1;
        self.pending.insert(
            id,
            Pending {
                op,
                connection,
                statements,
            },
        );
        self.expiry
            .push(Reverse((now.saturating_add(FORGET_AFTER_NS), id)));
        self.outbox.push_back(id);
    }

    /// Tells whoever waits for `op` that it failed.
    fn fail_op(&mut self, core: &mut Client, op: Op, now: u64, detail: &str) {
        match op {
            Op::Inspect | Op::Migrate => {
                self.schema = Schema::Unchecked;
                for op in std::mem::take(&mut self.parked) {
                    self.fail_op(core, op, now, detail);
                }
            }
            Op::Acquire { req, .. } => {
                let _ = core.handle_acquire_result(now, req, AcquireResult::TransportError);
            }
            Op::Renew { req, .. } => {
                let _ = core.handle_renew_result(now, req, RenewResult::TransportError);
            }
            Op::Release { req, .. } => {
                let _ = core.handle_release_result(now, req, ReleaseResult::TransportError);
            }
            Op::Status { id, .. } => self.statuses.push_back((id, Err(detail.to_owned()))),
            Op::Listen { name } => {
                if let Some(w) = self.watched.get_mut(&name) {
                    w.live = false;
                    self.relisten_at = self.relisten_at.min(now.saturating_add(500 * MS));
                }
            }
            Op::Unlisten => {}
        }
    }

    fn relisten_all(&mut self, now: u64) {
        let names: Vec<LockName> = self.watched.keys().cloned().collect();
        for name in names {
            if let Some(w) = self.watched.get_mut(&name) {
                w.live = false;
            }
            self.emit(Op::Listen { name }, now);
        }
    }

    /// Forgets requests the host never answered. The engine timed its own out long ago; a
    /// migration, a status query or a LISTEN is failed here, so nothing waits for it forever.
    fn prune(&mut self, core: &mut Client, now: u64) {
        while let Some(Reverse((at, id))) = self.expiry.peek().copied() {
            if at > now {
                break;
            }
            self.expiry.pop();
            if let Some(p) = self.pending.remove(&id) {
                if matches!(
                    p.op,
                    Op::Inspect | Op::Migrate | Op::Status { .. } | Op::Listen { .. }
                ) {
                    self.fail_op(core, p.op, now, "the host never answered the request");
                }
            }
        }
    }

    fn garbage(&mut self, msg: &str) {
        self.counters.garbage_results += 1;
        self.note_error(&format!("unexpected result: {msg}"));
        // A foreign table of the same name shows up here first: check the schema again.
        self.schema = Schema::Unchecked;
    }

    fn note_error(&mut self, text: &str) {
        let mut end = text.len().min(MAX_ERROR_TEXT);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.last_error = text[..end].to_owned();
    }
}
