//! The seam (`lh_io_*`): one poll for the next piece of IO the core wants, as a tagged
//! request, and one function per kind of answer, the same for every backend.
//!
//! Request kinds (design §5): a *call* the host runs on its own client — a command (an
//! argument vector for Redis or the memory service), SQL statements in one transaction, an
//! HTTP request (unary, a watch stream to keep open, or the cancellation of one). Answers:
//! values (`lh_io_reply`), an HTTP status and body (`lh_io_http_reply`), one message of a
//! stream (`lh_io_stream_message`), no answer (`lh_io_failed`). Notifications that arrive on
//! a connection go to `lh_io_message`, what happens to a connection to `lh_io_connection`.
//! The *stream* kind (Redis with its connections in the core): open a stream, write bytes on
//! it, shut it down; answered in `stream.rs` (`lh_io_opened`, `lh_io_received`,
//! `lh_io_closed`).
#![allow(non_camel_case_types)]

use std::ffi::c_char;

use super::boundary::{
    Failure, bytes_arg, guard_mut, optional_bytes_arg, out_ptr, require_out, write_out,
};
use super::client::{ClientState, lh_client};
use super::types::*;
use super::values::*;
use crate::backend::redis::Connection as RedisConnection;
use crate::backend::redis::stream::StreamRequest;
use crate::backend::redis::url::Endpoint;
use crate::backend::sql::{Connection as SqlConnection, Param};
use crate::backend::{AnswerError, ConnectionEvent, FailureKind, Protocol};

/// `lh_io_request.kind`: nothing left to poll.
pub const LH_IO_NONE: u32 = 0;
/// Run the command `argv` on `connection` (Redis: verbatim on that connection; memory: hand
/// the request to `lh_memory_service_call`). Answer with `lh_io_reply` or `lh_io_failed`; a
/// SUBSCRIBE is answered by its confirmation through `lh_io_connection`.
pub const LH_IO_COMMAND: u32 = 1;
/// Run the statements in order on `connection`, in autocommit mode (transaction control is
/// part of the list). Answer with `lh_io_reply` (one array per statement, of rows, of
/// columns) or `lh_io_failed`.
pub const LH_IO_SQL: u32 = 2;
/// Send the HTTP request to any cluster member and read the whole reply. Answer with
/// `lh_io_http_reply` or `lh_io_failed`.
pub const LH_IO_HTTP: u32 = 3;
/// Send the HTTP request and keep the response open: pass each newline-delimited message to
/// `lh_io_stream_message`; when the stream ends or breaks, `lh_io_failed` with its id.
pub const LH_IO_HTTP_WATCH: u32 = 4;
/// Close the watch stream `id` (no answer).
pub const LH_IO_HTTP_CANCEL: u32 = 5;
/// Open stream `stream` (the core owns the wire: Redis on the stream path) to `host`:`port`
/// over TCP, or to the Unix socket `unix_path`; with `tls` 1, wrap it in TLS and verify the
/// server's certificate against `server_name`. Give up at `deadline` (ns, the clock of `now`).
/// Answer with `lh_io_opened`, or `lh_io_closed` if it failed; then pass every byte read on
/// it to `lh_io_received` and its end to `lh_io_closed`.
pub const LH_IO_OPEN: u32 = 6;
/// Write `data`/`data_len` on `stream`, after the bytes of earlier writes (no answer; a
/// write that fails is the stream's end: `lh_io_closed`).
pub const LH_IO_WRITE: u32 = 7;
/// Close `stream` (no answer; bytes or a close still reported for it are ignored).
pub const LH_IO_SHUTDOWN: u32 = 8;

/// `lh_io_request.connection`: the ordinary connection.
pub const LH_CONNECTION_COMMANDS: u32 = 1;
/// `lh_io_request.connection`: the connection notifications arrive on (the Redis subscriber,
/// the PostgreSQL listener).
pub const LH_CONNECTION_NOTIFY: u32 = 2;

/// `lh_io_failed` kind: no answer came (connection refused, broken or timed out; the
/// outcome is unknown), or the memory service dropped the request.
pub const LH_FAILURE_TRANSPORT: u32 = 1;
/// `lh_io_failed` kind: the database refused a statement (busy, read-only, corrupt,
/// missing table…) and the transaction was rolled back (SQL only).
pub const LH_FAILURE_DATABASE: u32 = 2;

/// `lh_io_connection` event: the connection was opened anew (after a failure or a restart of
/// the server, a replaced SQLite file, a reconnect to the memory service): what lived on the
/// old one is set up again.
pub const LH_CONNECTION_REOPENED: u32 = 1;
/// `lh_io_connection` event: a SUBSCRIBE of `channel` took effect (its confirmation came).
pub const LH_CONNECTION_SUBSCRIBED: u32 = 2;
/// `lh_io_connection` event: a subscription ended (its confirmation came), or the connection
/// carrying it was lost: report every subscribed channel.
pub const LH_CONNECTION_UNSUBSCRIBED: u32 = 3;

const _: () = {
    assert!(LH_CONNECTION_COMMANDS == RedisConnection::Commands as u32);
    assert!(LH_CONNECTION_NOTIFY == RedisConnection::Subscriber as u32);
    assert!(LH_CONNECTION_COMMANDS == SqlConnection::Commands as u32);
    assert!(LH_CONNECTION_NOTIFY == SqlConnection::Listener as u32);
    assert!(LH_FAILURE_TRANSPORT == FailureKind::Transport as u32);
    assert!(LH_FAILURE_DATABASE == FailureKind::Database as u32);
    assert!(LH_CONNECTION_COMMANDS == crate::backend::CONNECTION_COMMANDS);
    assert!(LH_CONNECTION_NOTIFY == crate::backend::CONNECTION_NOTIFY);
};

/// One polled request (`lh_io_poll`). Flat and union-free; the fields of other kinds are 0 /
/// NULL. Every pointer borrows the handle until the next call on it: copy or send before
/// calling in again.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lh_io_request {
    /// Request id (never reused), 0 when nothing is left. OPEN, WRITE, SHUTDOWN: the stream id
    /// (the same for every request on that stream; answers name the stream).
    pub id: u64,
    /// `LH_IO_*`.
    pub kind: u32,
    /// `LH_CONNECTION_*` (COMMAND, SQL).
    pub connection: u32,
    /// COMMAND: the arguments, command word first.
    pub argv: *const lh_bytes,
    /// COMMAND: number of arguments.
    pub argc: u32,
    /// SQL: number of statements.
    pub nstatements: u32,
    /// SQL: the statements.
    pub statements: *const lh_sql_statement,
    /// SQL: the parameters of all statements: NIL, INT, TEXT, BULK (a blob) with
    /// `offset`/`len` into `data`, or `LH_PARAM_HOST_*` (facts the host binds: read them once
    /// per request, when it starts executing it, and bind the same values wherever the kind
    /// appears).
    pub params: *const lh_value,
    /// SQL: number of parameters.
    pub nparams: usize,
    /// SQL: the bytes SQL texts and string parameters point into (each followed by a NUL not
    /// counted in its length). HTTP: the JSON body (a NUL follows it, not counted).
    pub data: *const u8,
    /// Length of `data`.
    pub data_len: usize,
    /// HTTP, HTTP_WATCH: the method (`POST`), NUL-terminated (NULL for HTTP_CANCEL, like every
    /// field a kind does not use).
    pub method: *const c_char,
    /// HTTP: the path, NUL-terminated, appended to a member's base URL; any member serves any
    /// request, so on a transport failure the host may try the next one before reporting.
    pub path: *const c_char,
    /// HTTP: NUL-terminated; when not empty, send it as the `Authorization` header. Send
    /// `Content-Type: application/json` too.
    pub authorization: *const c_char,
    /// OPEN, WRITE, SHUTDOWN: the stream (never reused; `id` carries the same value).
    pub stream: u64,
    /// OPEN: when to give up connecting (ns, the clock of `now`).
    pub deadline: u64,
    /// OPEN over TCP: the host name or address, NUL-terminated (NULL for a Unix socket).
    pub host: *const c_char,
    /// OPEN to a Unix socket: its path, NUL-terminated (NULL over TCP).
    pub unix_path: *const c_char,
    /// OPEN with `tls` 1: the name to verify the certificate against (and send as SNI),
    /// NUL-terminated.
    pub server_name: *const c_char,
    /// OPEN over TCP: the port.
    pub port: u32,
    /// OPEN: 1 to wrap the stream in TLS, else 0.
    pub tls: u32,
}

const NO_REQUEST: lh_io_request = lh_io_request {
    id: 0,
    kind: LH_IO_NONE,
    connection: 0,
    argv: std::ptr::null(),
    argc: 0,
    nstatements: 0,
    statements: std::ptr::null(),
    params: std::ptr::null(),
    nparams: 0,
    data: std::ptr::null(),
    data_len: 0,
    method: std::ptr::null(),
    path: std::ptr::null(),
    authorization: std::ptr::null(),
    stream: 0,
    deadline: 0,
    host: std::ptr::null(),
    unix_path: std::ptr::null(),
    server_name: std::ptr::null(),
    port: 0,
    tls: 0,
};

/// The flat form of the last polled request; `lh_io_request` points into it.
#[derive(Default)]
pub(crate) struct Flat {
    argv: Vec<lh_bytes>,
    statements: Vec<lh_sql_statement>,
    params: Vec<lh_value>,
    data: Vec<u8>,
    method: Vec<u8>,
    path: Vec<u8>,
    authorization: Vec<u8>,
}

fn push_str(data: &mut Vec<u8>, s: &[u8]) -> (u64, u64) {
    let at = data.len() as u64;
    data.extend_from_slice(s);
    data.push(0);
    (at, s.len() as u64)
}

fn c_string(buf: &mut Vec<u8>, s: &[u8]) -> *const c_char {
    buf.clear();
    buf.extend_from_slice(s);
    buf.push(0);
    buf.as_ptr().cast()
}

fn argv<'a>(flat: &mut Flat, args: impl Iterator<Item = &'a [u8]>) -> (*const lh_bytes, u32) {
    flat.argv.extend(args.map(|a| lh_bytes {
        ptr: out_ptr(a),
        len: a.len(),
    }));
    (
        out_ptr(&flat.argv),
        u32::try_from(flat.argv.len()).unwrap_or(u32::MAX),
    )
}

impl ClientState {
    /// The next request of the handle's protocol, flattened into `self.flat`.
    pub(crate) fn poll_request(&mut self) -> lh_io_request {
        let flat = &mut self.flat;
        flat.argv.clear();
        flat.statements.clear();
        flat.params.clear();
        flat.data.clear();
        let mut r = NO_REQUEST;
        match &mut self.proto {
            Protocol::Memory(p) => {
                if let Some(req) = p.poll_request(&mut self.core) {
                    r.id = req.id;
                    r.kind = LH_IO_COMMAND;
                    r.connection = LH_CONNECTION_COMMANDS;
                    (r.argv, r.argc) = argv(flat, req.args.iter().map(Vec::as_slice));
                }
            }
            Protocol::Redis(p) => {
                if let Some(req) = p.poll_request(&mut self.core) {
                    r.id = req.id;
                    r.kind = LH_IO_COMMAND;
                    r.connection = req.connection as u32;
                    (r.argv, r.argc) = argv(flat, req.args.iter().map(|a| a.as_ref()));
                }
            }
            Protocol::RedisStream(p) => match p.poll_request(&mut self.core) {
                None => {}
                Some(StreamRequest::Open {
                    stream,
                    endpoint,
                    deadline,
                }) => {
                    r.kind = LH_IO_OPEN;
                    r.deadline = deadline;
                    match endpoint {
                        Endpoint::Tcp {
                            host,
                            port,
                            tls,
                            server_name,
                        } => {
                            r.host = c_string(&mut flat.path, host.as_bytes());
                            r.port = u32::from(*port);
                            r.tls = u32::from(*tls);
                            if *tls {
                                r.server_name =
                                    c_string(&mut flat.authorization, server_name.as_bytes());
                            }
                        }
                        Endpoint::Unix { path } => {
                            r.unix_path = c_string(&mut flat.path, path.as_bytes());
                        }
                    }
                    (r.id, r.stream) = (stream, stream);
                }
                Some(StreamRequest::Write { stream, bytes }) => {
                    r.kind = LH_IO_WRITE;
                    flat.data.extend_from_slice(bytes);
                    r.data = out_ptr(&flat.data);
                    r.data_len = flat.data.len();
                    (r.id, r.stream) = (stream, stream);
                }
                Some(StreamRequest::Shutdown { stream }) => {
                    r.kind = LH_IO_SHUTDOWN;
                    (r.id, r.stream) = (stream, stream);
                }
            },
            Protocol::Sql(p) => {
                if let Some(req) = p.poll_request(&mut self.core) {
                    for st in req.statements {
                        let (sql_offset, sql_len) = push_str(&mut flat.data, st.sql.as_bytes());
                        let first_param = flat.params.len() as u32;
                        for param in &st.params {
                            let mut v = lh_value::default();
                            match param {
                                Param::Null => v.kind = LH_VALUE_NIL,
                                Param::Int(i) => {
                                    v.kind = LH_VALUE_INT;
                                    v.integer = *i;
                                }
                                Param::Text(t) => {
                                    v.kind = LH_VALUE_TEXT;
                                    (v.offset, v.len) = push_str(&mut flat.data, t.as_bytes());
                                }
                                Param::Blob(b) => {
                                    v.kind = LH_VALUE_BULK;
                                    v.offset = flat.data.len() as u64;
                                    v.len = b.len() as u64;
                                    flat.data.extend_from_slice(b);
                                }
                                Param::Host(h) => v.kind = *h as u32,
                            }
                            flat.params.push(v);
                        }
                        flat.statements.push(lh_sql_statement {
                            sql_offset,
                            sql_len,
                            first_param,
                            nparams: st.params.len() as u32,
                        });
                    }
                    r.id = req.id;
                    r.kind = LH_IO_SQL;
                    r.connection = req.connection as u32;
                    r.nstatements = flat.statements.len() as u32;
                    r.statements = out_ptr(&flat.statements);
                    r.params = out_ptr(&flat.params);
                    r.nparams = flat.params.len();
                    r.data = out_ptr(&flat.data);
                    r.data_len = flat.data.len();
                }
            }
            Protocol::Etcd(p) => {
                if let Some(req) = p.poll_request(&mut self.core) {
                    r.id = req.id;
                    r.kind = match req.kind {
                        crate::backend::etcd::RequestKind::Unary => LH_IO_HTTP,
                        crate::backend::etcd::RequestKind::Watch => LH_IO_HTTP_WATCH,
                        crate::backend::etcd::RequestKind::CancelWatch => LH_IO_HTTP_CANCEL,
                    };
                    r.connection = LH_CONNECTION_COMMANDS;
                    if r.kind != LH_IO_HTTP_CANCEL {
                        r.method = c_string(&mut flat.method, req.method.as_bytes());
                        r.path = c_string(&mut flat.path, req.path.as_bytes());
                        r.authorization =
                            c_string(&mut flat.authorization, req.authorization.as_bytes());
                    }
                    if !req.body.is_empty() {
                        flat.data.extend_from_slice(req.body);
                        r.data_len = flat.data.len();
                        flat.data.push(0);
                        r.data = flat.data.as_ptr();
                    }
                }
            }
        }
        r
    }
}

/// Takes the next request into `*out` (`out->kind == LH_IO_NONE`, `out->id == 0` when none is
/// left). Drain it after every input, like `lh_poll_event`.
///
/// # Safety
/// `c` is NULL or a live handle; `out` is valid for writing one `lh_io_request`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_io_poll(c: *mut lh_client, out: *mut lh_io_request) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            require_out(out, "out")?;
            let r = s.poll_request();
            write_out(out, r);
            Ok(())
        })
    }
}

/// # Safety
/// `ptr` points to `len` readable bytes (NULL allowed when `len` is 0).
unsafe fn answer_bytes<'a>(
    ptr: *const u8,
    len: usize,
    what: &'static str,
) -> Result<&'a [u8], Failure> {
    // SAFETY: forwarded contract.
    unsafe { optional_bytes_arg(ptr, len, LH_MAX_REPLY_DATA, what, LH_ERR_INVALID_REPLY) }
}

/// # Safety
/// `ptr` points to `len` readable bytes (never NULL).
unsafe fn answer_bytes_required<'a>(
    ptr: *const u8,
    len: usize,
    what: &'static str,
) -> Result<&'a [u8], Failure> {
    // SAFETY: forwarded contract.
    unsafe { bytes_arg(ptr, len, LH_MAX_REPLY_DATA, what, LH_ERR_INVALID_REPLY) }
}

/// The status an answer the protocol did not take is reported with.
fn refused(e: AnswerError) -> Failure {
    let code = match e {
        AnswerError::WrongKind(_) => LH_ERR_WRONG_ANSWER,
        AnswerError::Invalid(_) => LH_ERR_INVALID_REPLY,
    };
    Failure::new(code, e.to_string())
}

/// Hands back the values answering COMMAND or SQL request `id`: `nvalues` values in
/// pre-order (an array is followed by its elements) and the `data_len` bytes their strings
/// point into. SQL: one array per statement (every statement, an empty array for one without
/// rows), of rows, each an array of column values (NIL, INT — booleans as 0/1 —, FLOAT,
/// TEXT, BULK for blobs). Read during the call, never retained. Unknown and already answered
/// ids are counted and ignored (`LH_OK`). A malformed or oversized list is
/// `LH_ERR_INVALID_REPLY` and changes nothing: then report the request with `lh_io_failed`.
///
/// # Safety
/// `c` is NULL or a live handle; `values` points to `nvalues` readable `lh_value`s (never
/// NULL: an answer has at least one value) and `data` to `data_len` readable bytes (NULL
/// allowed when `data_len` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_io_reply(
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
            let (flat, data) = flat_values_arg(values, nvalues, data, data_len)?;
            s.proto
                .handle_values(&mut s.core, now, id, &flat, data)
                .map_err(refused)
        })
    }
}

/// Hands back the reply to HTTP request `id`: the status (100..=599) and the whole body (at
/// most `LH_MAX_REPLY_DATA` bytes; NULL when empty). Any status, error body or malformed
/// JSON is the protocol's to judge. Unknown and already answered ids are counted and ignored.
///
/// # Safety
/// `c` is NULL or a live handle; `body` points to `body_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_io_http_reply(
    c: *mut lh_client,
    now: u64,
    id: u64,
    status: u32,
    body: *const u8,
    body_len: usize,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            let status = u16::try_from(status)
                .ok()
                .filter(|s| (100..=599).contains(s))
                .ok_or_else(|| {
                    Failure::new(
                        LH_ERR_INVALID_REPLY,
                        format!("HTTP status {status} is not in 100..=599"),
                    )
                })?;
            let body = answer_bytes(body, body_len, "body")?;
            s.proto
                .handle_http(&mut s.core, now, id, status, body)
                .map_err(refused)
        })
    }
}

/// One message streamed on HTTP watch `id` (one line of its response body, without the
/// newline; at most `LH_MAX_REPLY_DATA` bytes).
///
/// # Safety
/// `c` is NULL or a live handle; `message` points to `message_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_io_stream_message(
    c: *mut lh_client,
    now: u64,
    id: u64,
    message: *const u8,
    message_len: usize,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            let message = answer_bytes(message, message_len, "message")?;
            s.proto
                .handle_stream_message(&mut s.core, now, id, message)
                .map_err(refused)
        })
    }
}

/// Request `id` got no answer (`LH_FAILURE_TRANSPORT`: connection refused, broken or timed
/// out, a reply `lh_io_reply` refused, a request the memory service dropped; a watch stream
/// that ended), or the database refused it (`LH_FAILURE_DATABASE`, SQL). `message` is the
/// host's text (UTF-8 not required; at most `LH_MAX_REPLY_DATA` bytes, NULL when empty). The
/// engine sees a transport error either way. Unknown ids are counted and ignored.
///
/// # Safety
/// `c` is NULL or a live handle; `message` points to `message_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_io_failed(
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
            let msg = answer_bytes(message, message_len, "message")?;
            let msg = String::from_utf8_lossy(msg);
            s.proto
                .handle_failed(&mut s.core, now, id, kind, &msg)
                .map_err(refused)
        })
    }
}

/// Delivers one notification that arrived on a connection, every one (the protocol ignores
/// what is not its own): a Redis pub/sub message on the subscriber (channel, payload), a
/// PostgreSQL NOTIFY on the listener (channel, payload), a memory-service release
/// (`lh_memory_service_poll_released`: channel = the name, no payload). Channel and payload
/// are at most `LH_MAX_REPLY_DATA` bytes.
///
/// # Safety
/// `c` is NULL or a live handle; `channel` and `payload` point to their lengths in readable
/// bytes (`payload` may be NULL when empty).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_io_message(
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
            let channel = answer_bytes_required(channel, channel_len, "channel")?;
            let payload = answer_bytes(payload, payload_len, "payload")?;
            s.proto
                .handle_message(&mut s.core, now, channel, payload)
                .map_err(refused)
        })
    }
}

/// Something happened to `connection` (`LH_CONNECTION_*`): `event` is
/// `LH_CONNECTION_REOPENED` (SQL, memory; harmless elsewhere) or, for Redis,
/// `LH_CONNECTION_SUBSCRIBED` / `LH_CONNECTION_UNSUBSCRIBED` of `channel` (NULL otherwise).
/// Unknown values are `LH_ERR_INVALID_ENUM`; an event the backend does not have is
/// `LH_ERR_WRONG_ANSWER`.
///
/// # Safety
/// `c` is NULL or a live handle; `channel` points to `channel_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_io_connection(
    c: *mut lh_client,
    now: u64,
    connection: u32,
    event: u32,
    channel: *const u8,
    channel_len: usize,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            if !(LH_CONNECTION_COMMANDS..=LH_CONNECTION_NOTIFY).contains(&connection) {
                return Err(Failure::invalid_enum("connection", connection));
            }
            let event = match event {
                LH_CONNECTION_REOPENED => ConnectionEvent::Reopened,
                LH_CONNECTION_SUBSCRIBED => ConnectionEvent::Subscribed,
                LH_CONNECTION_UNSUBSCRIBED => ConnectionEvent::Unsubscribed,
                other => return Err(Failure::invalid_enum("connection event", other)),
            };
            let channel = answer_bytes(channel, channel_len, "channel")?;
            s.proto
                .handle_connection(&mut s.core, now, connection, event, channel)
                .map_err(refused)
        })
    }
}

/// The client is closing. etcd: cancels acquires still waiting and queues a `lease/revoke`
/// of every pooled etcd lease (the keys of its locks go with it), locks still held end Lost;
/// other backends have nothing of their own to give back. Call it after releasing what you
/// hold and before `lh_client_free`, then run the loop until the requests are answered, for
/// a short bound.
///
/// # Safety
/// `c` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_io_close(c: *mut lh_client, now: u64) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            s.proto.close(&mut s.core, now);
            Ok(())
        })
    }
}

/// NUL-terminated text of the last error the backend reported or the protocol found in an
/// answer (a refused statement, an error reply, a malformed body, a failed schema check), for
/// the application's diagnostics; "" if none, and "" for a NULL or poisoned handle. Same
/// convention as `lh_client_last_error` (which holds the detail of the last failed *call*):
/// never NULL, valid until the next call on this handle.
///
/// # Safety
/// `c` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_backend_last_error(c: *mut lh_client) -> *const c_char {
    let mut ptr: *const c_char = c"".as_ptr();
    // SAFETY: per the caller's contract.
    let _ = unsafe {
        guard_mut(c, |s| {
            let text = s.proto.last_error().replace('\0', "\\0");
            s.backend_error = std::ffi::CString::new(text).unwrap_or_default();
            ptr = s.backend_error.as_ptr();
            Ok(())
        })
    };
    ptr
}
