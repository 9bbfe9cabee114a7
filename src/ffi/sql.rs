//! A client handle with the SQL protocol attached (`lh_client_new_sql`): SQLite or
//! PostgreSQL, chosen at creation.
//!
//! Application calls stay the same (`lh_acquire`, `lh_release`, `lh_poll_output` for events,
//! `lh_poll_timeout` / `lh_timeout`); the engine's commands become SQL requests, polled with
//! `lh_sql_poll_request`: a list of statements with typed parameters, run in order, verbatim.
//! The rows go back through `lh_sql_result` in the same flat `lh_value` form as Redis
//! replies (an array per statement, of rows, of columns); failures through `lh_sql_failed`,
//! database errors and broken connections told apart. No pointers inside the structs:
//! statements and parameters point into one data buffer by offset, so cgo, ctypes and C++
//! read them in place.
#![allow(non_camel_case_types)]

use super::backend::{LH_VALUE_BULK, LH_VALUE_INT, LH_VALUE_NIL, flat_values_arg, lh_value};
use super::boundary::{
    Diag, Failure, bytes_arg, guard_mut, guard_ref, guard_static, optional_bytes_arg, out_ptr,
    read_growing, read_sized, require_out, write_out,
};
use super::client::{ClientState, config_from_c, lh_client, seed_arg};
use super::types::*;
use crate::Client;
use crate::backend::sql::{
    self as proto, Connection, Dialect, FailureKind, Param, SqlOptions, SqlProtocol,
};

/// `lh_sql_options.dialect`: SQLite (one file shared by the processes of one host).
pub const LH_DIALECT_SQLITE: u32 = 1;
/// `lh_sql_options.dialect`: PostgreSQL.
pub const LH_DIALECT_POSTGRES: u32 = 2;

/// `lh_sql_request.connection`: the ordinary connection (migration and every operation).
pub const LH_SQL_CONNECTION_COMMANDS: u32 = 1;
/// `lh_sql_request.connection`: PostgreSQL's listener connection (LISTEN / UNLISTEN; its
/// notifications go to `lh_sql_notification`).
pub const LH_SQL_CONNECTION_LISTENER: u32 = 2;

/// `lh_value.kind` of a column or parameter: UTF-8 text (`offset`, `len`).
pub const LH_VALUE_TEXT: u32 = 7;
/// `lh_value.kind` of a column: a double, its IEEE-754 bits in `integer`. (None of the
/// protocol's statements return one; a float where a number belongs is an error.)
pub const LH_VALUE_FLOAT: u32 = 8;
/// Parameter kind: bind the host's `CLOCK_MONOTONIC` in ns as an integer.
pub const LH_PARAM_HOST_MONOTONIC_NS: u32 = 20;
/// Parameter kind: bind the host's wall clock in µs since the Unix epoch as an integer.
pub const LH_PARAM_HOST_WALL_US: u32 = 21;
/// Parameter kind: bind the boot id (`/proc/sys/kernel/random/boot_id`, trimmed) as text.
pub const LH_PARAM_HOST_BOOT_ID: u32 = 22;
/// Parameter kind: bind the executing process's id as an integer.
pub const LH_PARAM_HOST_PID: u32 = 23;
/// Parameter kind: bind the host name as text.
pub const LH_PARAM_HOST_NAME: u32 = 24;

/// `lh_sql_failed` kind: the connection broke or timed out (the outcome is unknown); reopen
/// it and call `lh_sql_connection_reset`.
pub const LH_SQL_FAILURE_TRANSPORT: u32 = 1;
/// `lh_sql_failed` kind: the database refused a statement (busy, read-only, corrupt, missing
/// table, …) and the transaction was rolled back.
pub const LH_SQL_FAILURE_DATABASE: u32 = 2;

/// Longest notification channel or payload, and longest failure message, in bytes.
pub const LH_MAX_SQL_MESSAGE: usize = 1 << 16;

const _: () = {
    assert!(LH_DIALECT_SQLITE == Dialect::Sqlite as u32);
    assert!(LH_DIALECT_POSTGRES == Dialect::Postgres as u32);
    assert!(LH_SQL_CONNECTION_COMMANDS == Connection::Commands as u32);
    assert!(LH_SQL_CONNECTION_LISTENER == Connection::Listener as u32);
    assert!(LH_VALUE_TEXT == proto::KIND_TEXT);
    assert!(LH_VALUE_FLOAT == proto::KIND_FLOAT);
    assert!(LH_PARAM_HOST_MONOTONIC_NS == proto::KIND_HOST_MONOTONIC_NS);
    assert!(LH_PARAM_HOST_WALL_US == proto::KIND_HOST_WALL_US);
    assert!(LH_PARAM_HOST_BOOT_ID == proto::KIND_HOST_BOOT_ID);
    assert!(LH_PARAM_HOST_PID == proto::KIND_HOST_PID);
    assert!(LH_PARAM_HOST_NAME == proto::KIND_HOST_NAME);
    assert!(LH_SQL_FAILURE_TRANSPORT == FailureKind::Transport as u32);
    assert!(LH_SQL_FAILURE_DATABASE == FailureKind::Database as u32);
};

/// Options of the SQL protocol. Fill with `lh_sql_options_default`, then set `dialect`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct lh_sql_options {
    /// `sizeof(lh_sql_options)` as compiled by the caller.
    pub struct_size: u32,
    /// `LH_DIALECT_*` (default SQLite).
    pub dialect: u32,
    /// SQLite: `PRAGMA busy_timeout` (default 5000): a file that stays locked is a database
    /// error after this long, never a hang.
    pub busy_timeout_ms: u64,
    /// PostgreSQL, 0 or 1 (default 0): acquire, renew and release commit without waiting for
    /// the WAL flush. Much faster on a server that flushes; a server crash may forget the
    /// last moments' grants and releases (docs/backends.md). Added after the first struct:
    /// a caller whose `struct_size` ends before it gets 0.
    pub asynchronous_commit: u32,
    /// Always 0.
    pub _reserved: u32,
}

/// Size of `lh_sql_options` before `asynchronous_commit`.
const SQL_OPTIONS_V1: usize = 16;

/// One statement of a request: its SQL text and its parameters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct lh_sql_statement {
    /// Start of the SQL text in the request's data buffer (a NUL follows it).
    pub sql_offset: u64,
    /// Length of the SQL text in bytes, without the NUL.
    pub sql_len: u64,
    /// Index of the statement's first parameter in the request's `params`.
    pub first_param: u32,
    /// Number of parameters (`?1…`/`$1…` in order).
    pub nparams: u32,
}

/// One polled request: run its statements in order on `connection`, in autocommit mode
/// (transaction control is part of the list), then answer `id` with `lh_sql_result` or
/// `lh_sql_failed`. `id == 0` means nothing is left. Parameters are `lh_value`s: NIL, INT
/// (`integer`), TEXT and BULK (a blob) with `offset`/`len` into `data`, or
/// `LH_PARAM_HOST_*` (facts the host binds: read them once per request, when it starts
/// executing it, and bind the same values wherever the kind appears). Every SQL text and
/// TEXT parameter in `data` is followed by a NUL byte (not counted in its length). The
/// pointers borrow the handle until the next call on it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lh_sql_request {
    /// Request id (never reused), 0 when none.
    pub id: u64,
    /// `LH_SQL_CONNECTION_*`.
    pub connection: u32,
    /// Number of statements.
    pub nstatements: u32,
    /// The statements.
    pub statements: *const lh_sql_statement,
    /// The parameters of all statements.
    pub params: *const lh_value,
    /// Number of parameters.
    pub nparams: usize,
    /// The bytes SQL texts and string parameters point into.
    pub data: *const u8,
    /// Length of `data`.
    pub data_len: usize,
}

/// The protocol attached to a handle and the flat form of the last polled request.
pub(crate) struct SqlAttached {
    pub(crate) proto: SqlProtocol,
    statements: Vec<lh_sql_statement>,
    params: Vec<lh_value>,
    data: Vec<u8>,
}

impl ClientState {
    fn with_sql(&mut self) -> Result<(&mut SqlAttached, &mut Client), Failure> {
        match &mut self.sql {
            Some(b) => Ok((b, &mut self.core)),
            None => Err(Failure::new(
                LH_ERR_NO_BACKEND,
                "this handle has no SQL backend (create it with lh_client_new_sql)",
            )),
        }
    }
}

/// Fills `*out` with the default SQL options (SQLite, and `struct_size`). NULL is ignored.
///
/// # Safety
/// `out` is NULL or valid for writing one `lh_sql_options`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_sql_options_default(out: *mut lh_sql_options) {
    if out.is_null() {
        return;
    }
    let value = lh_sql_options {
        struct_size: size_of::<lh_sql_options>() as u32,
        dialect: LH_DIALECT_SQLITE,
        busy_timeout_ms: SqlOptions::default().busy_timeout_ms,
        asynchronous_commit: 0,
        _reserved: 0,
    };
    // SAFETY: non-NULL; valid per the caller's contract.
    unsafe { write_out(out, value) };
}

/// Creates a client with the SQL protocol attached (see the header's SQL run loop).
/// Arguments and errors as for `lh_client_new`, plus `opts` (required: it names the
/// dialect; an unknown dialect is `LH_ERR_INVALID_ENUM`, bad values `LH_ERR_INVALID_CONFIG`).
/// SQLite delivers no release notifications, so for it `cfg->notifications` is taken as 0
/// (waiters retry at the holder's expiry or by backoff). The first request is the migration.
///
/// # Safety
/// As for `lh_client_new`; `opts` points to a readable `lh_sql_options`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_client_new_sql(
    cfg: *const lh_config,
    opts: *const lh_sql_options,
    seed: *const u8,
    seed_len: usize,
    out: *mut *mut lh_client,
) -> lh_status {
    guard_static(|| {
        require_out(out, "out")?;
        // SAFETY: per the caller's contract.
        let cfg = unsafe { read_sized(cfg, "cfg")? };
        let mut base = lh_sql_options {
            struct_size: 0,
            dialect: 0,
            busy_timeout_ms: 0,
            asynchronous_commit: 0,
            _reserved: 0,
        };
        // SAFETY: writes one valid struct into a local.
        unsafe { lh_sql_options_default(&raw mut base) };
        // SAFETY: per the caller's contract.
        let o = unsafe { read_growing(opts, "opts", SQL_OPTIONS_V1, base)? };
        if o.asynchronous_commit > 1 {
            return Err(crate::Error::InvalidConfig("asynchronous_commit must be 0 or 1").into());
        }
        let dialect = Dialect::from_u32(o.dialect)
            .ok_or_else(|| Failure::invalid_enum("dialect", o.dialect))?;
        // SAFETY: per the caller's contract.
        let seed = unsafe { seed_arg(seed, seed_len)? };
        let mut config = config_from_c(&cfg)?;
        if dialect == Dialect::Sqlite {
            config.notifications = false;
        }
        let core = Client::new(config, seed)?;
        let proto = SqlProtocol::new(
            dialect,
            SqlOptions {
                busy_timeout_ms: o.busy_timeout_ms,
                asynchronous_commit: o.asynchronous_commit == 1,
            },
        )?;
        let mut state = ClientState::new(core);
        state.sql = Some(Box::new(SqlAttached {
            proto,
            statements: Vec::new(),
            params: Vec::new(),
            data: Vec::new(),
        }));
        let handle = Box::new(lh_client {
            state,
            diag: Diag::new(),
        });
        // SAFETY: checked non-NULL above; valid per the caller's contract.
        unsafe { write_out(out, Box::into_raw(handle)) };
        Ok(())
    })
}

const NO_REQUEST: lh_sql_request = lh_sql_request {
    id: 0,
    connection: 0,
    nstatements: 0,
    statements: std::ptr::null(),
    params: std::ptr::null(),
    nparams: 0,
    data: std::ptr::null(),
    data_len: 0,
};

fn push_str(data: &mut Vec<u8>, s: &[u8]) -> (u64, u64) {
    let at = data.len() as u64;
    data.extend_from_slice(s);
    data.push(0);
    (at, s.len() as u64)
}

/// Takes the next request into `*out` (`out->id == 0` when none is left; drain until then
/// after every input, like `lh_poll_output`). Everything it points to borrows the handle
/// until the next call on it.
///
/// # Safety
/// `c` is NULL or a live handle; `out` is valid for writing one `lh_sql_request`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_sql_poll_request(
    c: *mut lh_client,
    out: *mut lh_sql_request,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            require_out(out, "out")?;
            let (b, core) = s.with_sql()?;
            b.statements.clear();
            b.params.clear();
            b.data.clear();
            let mut r = NO_REQUEST;
            if let Some(req) = b.proto.poll_request(core) {
                for st in req.statements {
                    let (sql_offset, sql_len) = push_str(&mut b.data, st.sql.as_bytes());
                    let first_param = b.params.len() as u32;
                    for p in &st.params {
                        let mut v = lh_value::default();
                        match p {
                            Param::Null => v.kind = LH_VALUE_NIL,
                            Param::Int(i) => {
                                v.kind = LH_VALUE_INT;
                                v.integer = *i;
                            }
                            Param::Text(t) => {
                                v.kind = LH_VALUE_TEXT;
                                (v.offset, v.len) = push_str(&mut b.data, t.as_bytes());
                            }
                            Param::Blob(bytes) => {
                                v.kind = LH_VALUE_BULK;
                                v.offset = b.data.len() as u64;
                                v.len = bytes.len() as u64;
                                b.data.extend_from_slice(bytes);
                            }
                            Param::Host(h) => v.kind = *h as u32,
                        }
                        b.params.push(v);
                    }
                    b.statements.push(lh_sql_statement {
                        sql_offset,
                        sql_len,
                        first_param,
                        nparams: st.params.len() as u32,
                    });
                }
                r = lh_sql_request {
                    id: req.id,
                    connection: req.connection as u32,
                    nstatements: b.statements.len() as u32,
                    statements: out_ptr(&b.statements),
                    params: out_ptr(&b.params),
                    nparams: b.params.len(),
                    data: out_ptr(&b.data),
                    data_len: b.data.len(),
                };
            }
            write_out(out, r);
            Ok(())
        })
    }
}

/// Hands back the rows of request `id`: `nvalues` values in pre-order forming one array per
/// statement (in order, every statement included, an empty array for one without rows), of
/// rows, each an array of column values (NIL, INT — booleans as 0/1 —, FLOAT, TEXT, BULK for
/// blobs), and the `data_len` bytes their strings point into. Read during the call, never
/// retained. Unknown and already answered ids are counted and ignored (`LH_OK`). A malformed
/// or oversized list is `LH_ERR_INVALID_REPLY` and changes nothing: then report the request
/// with `lh_sql_failed`.
///
/// # Safety
/// `c` is NULL or a live handle; `values` points to `nvalues` readable `lh_value`s and `data`
/// to `data_len` readable bytes (NULL allowed when the count is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_sql_result(
    c: *mut lh_client,
    now: u64,
    id: u64,
    values: *const lh_value,
    nvalues: usize,
    data: *const u8,
    data_len: usize,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            // SAFETY: per the caller's contract.
            let (flat, data) = flat_values_arg(values, nvalues, data, data_len, "result")?;
            let rows = proto::decode(&flat, data)
                .map_err(|e| Failure::new(LH_ERR_INVALID_REPLY, format!("invalid result: {e}")))?;
            let (b, core) = s.with_sql()?;
            b.proto.handle_rows(core, now, id, &rows);
            Ok(())
        })
    }
}

/// Request `id` failed: `kind` is `LH_SQL_FAILURE_TRANSPORT` or `LH_SQL_FAILURE_DATABASE`,
/// `message` the driver's text (UTF-8 not required; at most `LH_MAX_SQL_MESSAGE` bytes, NULL
/// when empty). The engine sees a transport error either way; the schema is checked again
/// before the next operation. Unknown ids are counted and ignored.
///
/// # Safety
/// `c` is NULL or a live handle; `message` points to `message_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_sql_failed(
    c: *mut lh_client,
    now: u64,
    id: u64,
    kind: u32,
    message: *const u8,
    message_len: usize,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            let kind = FailureKind::from_u32(kind)
                .ok_or_else(|| Failure::invalid_enum("failure kind", kind))?;
            let msg = optional_bytes_arg(
                message,
                message_len,
                LH_MAX_SQL_MESSAGE,
                "message",
                LH_ERR_INVALID_REPLY,
            )?;
            let msg = String::from_utf8_lossy(msg);
            let (b, core) = s.with_sql()?;
            b.proto.handle_failed(core, now, id, kind, &msg);
            Ok(())
        })
    }
}

/// Delivers one notification received on the listener connection (PostgreSQL; every one:
/// the protocol ignores what is not its own). Channel and payload are at most
/// `LH_MAX_SQL_MESSAGE` bytes.
///
/// # Safety
/// `c` is NULL or a live handle; `channel` and `payload` point to their lengths in readable
/// bytes (`payload` may be NULL when empty).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_sql_notification(
    c: *mut lh_client,
    now: u64,
    channel: *const u8,
    channel_len: usize,
    payload: *const u8,
    payload_len: usize,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            let channel = bytes_arg(
                channel,
                channel_len,
                LH_MAX_SQL_MESSAGE,
                "channel",
                LH_ERR_INVALID_REPLY,
            )?;
            let payload = optional_bytes_arg(
                payload,
                payload_len,
                LH_MAX_SQL_MESSAGE,
                "payload",
                LH_ERR_INVALID_REPLY,
            )?;
            let (b, core) = s.with_sql()?;
            b.proto.handle_notification(core, now, channel, payload);
            Ok(())
        })
    }
}

/// The host opened `connection` (`LH_SQL_CONNECTION_*`) anew — after a transport failure,
/// a server restart, a replaced SQLite file: the schema is checked again before the next
/// operation; the listener LISTENs again (and each waiting name is checked once).
///
/// # Safety
/// `c` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_sql_connection_reset(
    c: *mut lh_client,
    now: u64,
    connection: u32,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            let conn = Connection::from_u32(connection)
                .ok_or_else(|| Failure::invalid_enum("connection", connection))?;
            let (b, core) = s.with_sql()?;
            b.proto.handle_connection_reset(core, now, conn);
            Ok(())
        })
    }
}

/// `lh_status_request` under its first name (SQL handles came first).
///
/// # Safety
/// As `lh_status_request`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_sql_status_request(
    c: *mut lh_client,
    now: u64,
    name: *const u8,
    name_len: usize,
    out_id: *mut u64,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe { super::status::lh_status_request(c, now, name, name_len, out_id) }
}

/// `lh_poll_status` under its first name (SQL handles came first).
///
/// # Safety
/// As `lh_poll_status`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_sql_poll_status(
    c: *mut lh_client,
    out: *mut super::status::lh_lock_status,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe { super::status::lh_poll_status(c, out) }
}

/// The last database error, failed schema check or malformed result the protocol saw (a
/// read-only or corrupt file, a foreign table of the same name…), for the application's
/// diagnostics: `*out_text` / `*out_len` (not NUL-terminated; length 0 if none), borrowed
/// until the next call on the handle.
///
/// # Safety
/// `c` is NULL or a live handle; the out-pointers are valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_sql_last_error(
    c: *const lh_client,
    out_text: *mut *const u8,
    out_len: *mut usize,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_ref(c, |s| {
            require_out(out_text, "out_text")?;
            require_out(out_len, "out_len")?;
            let Some(b) = &s.sql else {
                return Err(Failure::new(
                    LH_ERR_NO_BACKEND,
                    "this handle has no SQL backend",
                ));
            };
            let text = b.proto.last_error();
            write_out(out_text, out_ptr(text.as_bytes()));
            write_out(out_len, text.len());
            Ok(())
        })
    }
}
