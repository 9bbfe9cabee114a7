//! The SQL protocol's wire types: what crosses between the core and the host's database
//! driver, in both directions.
//!
//! Out: a [`Request`] is a short list of [`Statement`]s with typed [`Param`]s, for one
//! [`Connection`], written in one [`Dialect`]; a few parameters are facts only the host knows
//! ([`HostValue`]), bound when it executes the request. In: the rows of every statement, each
//! a list of [`SqlValue`]s, handed over flat ([`FlatValue`]s over one data buffer, the format
//! the Redis protocol's replies use too) and checked by [`decode`] — or a failure of a
//! [`FailureKind`]. Nothing here knows what a statement means; `sqlite.rs` and `postgres.rs`
//! write them and `rows.rs` reads the answers.

use std::borrow::Cow;

use crate::backend::value::{FlatValue, KIND_ARRAY, KIND_BULK, KIND_INT, KIND_NIL};

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
pub const MAX_VALUES: usize = crate::backend::value::MAX_VALUES;
/// Largest data buffer of one result, in bytes.
pub const MAX_DATA: usize = crate::backend::value::MAX_DATA;

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
    pub(super) fn bare(sql: impl Into<Cow<'static, str>>) -> Self {
        Self {
            sql: sql.into(),
            params: Vec::new(),
        }
    }

    pub(super) fn with(sql: &'static str, params: Vec<Param>) -> Self {
        Self {
            sql: Cow::Borrowed(sql),
            params,
        }
    }
}

/// A request for the host: run `statements` in order on `connection` and answer `id` with
/// every statement's rows ([`super::SqlProtocol::handle_rows`]) or a failure
/// ([`super::SqlProtocol::handle_failed`]).
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
