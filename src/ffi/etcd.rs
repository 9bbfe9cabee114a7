//! A client handle with the etcd protocol attached (`lh_client_new_etcd`), spoken through
//! etcd's JSON gateway, so the host needs only an HTTP client.
//!
//! Application calls stay the same (`lh_acquire`, `lh_release`, `lh_poll_output` for events,
//! `lh_poll_timeout` / `lh_timeout`); the engine's commands become HTTP requests, polled with
//! `lh_http_poll_request`: `POST` a JSON body to a path on any cluster member (a unary call,
//! a watch stream to keep open, or the cancellation of one). Replies go back whole through
//! `lh_http_reply` (status and body), streamed watch messages one by one through
//! `lh_http_stream_message`, and failures through `lh_http_failed`.
#![allow(non_camel_case_types)]

use super::boundary::{
    Diag, Failure, check_sized_out, guard_mut, guard_ref, guard_static, optional_bytes_arg,
    out_ptr, read_sized, require_out, write_out,
};
use super::client::{ClientState, config_from_c, lh_client, seed_arg};
use super::types::*;
use crate::Client;
use crate::backend::etcd::{EtcdProtocol, MAX_BODY, MAX_CREDENTIAL_LEN, RequestKind};

/// `lh_http_request.kind`: `POST` the body, read the whole reply, answer with `lh_http_reply`
/// (or `lh_http_failed` when no reply came).
pub const LH_HTTP_UNARY: u32 = 1;
/// `lh_http_request.kind`: `POST` the body and keep the response open; pass each
/// newline-delimited JSON message to `lh_http_stream_message`; when the stream ends or
/// breaks, call `lh_http_failed` with its id.
pub const LH_HTTP_WATCH: u32 = 2;
/// `lh_http_request.kind`: close the watch stream `id` (no reply).
pub const LH_HTTP_CANCEL_WATCH: u32 = 3;
/// Largest reply body or stream message the protocol reads, in bytes.
pub const LH_MAX_HTTP_BODY: usize = 1 << 20;

const _: () = {
    assert!(LH_HTTP_UNARY == RequestKind::Unary as u32);
    assert!(LH_HTTP_WATCH == RequestKind::Watch as u32);
    assert!(LH_HTTP_CANCEL_WATCH == RequestKind::CancelWatch as u32);
    assert!(LH_MAX_HTTP_BODY == MAX_BODY);
};

/// One polled HTTP request. `id == 0` means nothing is left. `method` and `path` are
/// NUL-terminated (empty for `LH_HTTP_CANCEL_WATCH`); the path is appended to a member's
/// base URL (`http://host:2379`); any member serves any request, so on a transport failure
/// the host may try the next member before reporting it. Send `Content-Type:
/// application/json`. Every pointer borrows the handle until the next call on it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lh_http_request {
    /// Request id (never reused), 0 when none.
    pub id: u64,
    /// `LH_HTTP_*`.
    pub kind: u32,
    /// Always 0.
    pub _reserved: u32,
    /// The HTTP method (`POST`), NUL-terminated.
    pub method: *const std::ffi::c_char,
    /// The path, NUL-terminated.
    pub path: *const std::ffi::c_char,
    /// The JSON body (a NUL follows it, not counted).
    pub body: *const u8,
    /// Length of `body`.
    pub body_len: usize,
    /// NUL-terminated; when not empty, send it as the `Authorization` header (the token of
    /// an authenticated cluster).
    pub authorization: *const std::ffi::c_char,
}

/// Options of the etcd protocol. Fill with `lh_etcd_options_default`. With a user, the
/// handle authenticates first (`/v3/auth/authenticate`) and every request carries the token.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lh_etcd_options {
    /// `sizeof(lh_etcd_options)` as compiled by the caller.
    pub struct_size: u32,
    /// Always 0.
    pub _reserved: u32,
    /// User name (UTF-8, at most 256 bytes; not NUL-terminated), NULL for none.
    pub user: *const u8,
    /// Length of `user`.
    pub user_len: usize,
    /// Password (UTF-8, at most 256 bytes), NULL when empty.
    pub password: *const u8,
    /// Length of `password`.
    pub password_len: usize,
}

/// What the etcd protocol saw (monotonic), for diagnostics and tests.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct lh_etcd_counters {
    /// `sizeof(lh_etcd_counters)` as compiled by the caller; set to the library's size.
    pub struct_size: u32,
    /// Always 0.
    pub _reserved: u32,
    /// Requests emitted (cancellations not included).
    pub requests: u64,
    /// etcd leases granted.
    pub leases_granted: u64,
    /// Acquire transactions sent.
    pub txns: u64,
    /// Watches opened on a predecessor.
    pub watches: u64,
    /// Waiters woken by their predecessor's deletion (or a cut watch).
    pub wakeups: u64,
    /// Keep-alives sent for waiting leases.
    pub waiting_keepalives: u64,
    /// Waiters whose etcd lease was gone (they rejoined the queue).
    pub waiters_expired: u64,
    /// Error bodies or non-200 statuses.
    pub error_replies: u64,
    /// Malformed or oversized replies.
    pub garbage_replies: u64,
    /// Transport failures reported by the host.
    pub transport_failures: u64,
    /// Replies for unknown or already answered ids.
    pub stale_replies: u64,
}

/// The protocol attached to a handle and the flat form of the last polled request.
pub(crate) struct EtcdAttached {
    pub(crate) proto: EtcdProtocol,
    method: Vec<u8>,
    path: Vec<u8>,
    body: Vec<u8>,
    authorization: Vec<u8>,
}

impl ClientState {
    fn with_etcd(&mut self) -> Result<(&mut EtcdAttached, &mut Client), Failure> {
        match &mut self.etcd {
            Some(b) => Ok((b, &mut self.core)),
            None => Err(Failure::new(
                LH_ERR_NO_BACKEND,
                "this handle has no etcd backend (create it with lh_client_new_etcd)",
            )),
        }
    }
}

/// Fills `*out` with the default etcd options (no authentication, and `struct_size`).
/// NULL is ignored.
///
/// # Safety
/// `out` is NULL or valid for writing one `lh_etcd_options`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_etcd_options_default(out: *mut lh_etcd_options) {
    if out.is_null() {
        return;
    }
    let value = lh_etcd_options {
        struct_size: size_of::<lh_etcd_options>() as u32,
        _reserved: 0,
        user: std::ptr::null(),
        user_len: 0,
        password: std::ptr::null(),
        password_len: 0,
    };
    // SAFETY: non-NULL; valid per the caller's contract.
    unsafe { write_out(out, value) };
}

/// Creates a client with the etcd protocol attached (see the header's etcd run loop).
/// Arguments and errors as for `lh_client_new`, plus `opts` (NULL: no authentication).
/// Credentials that are not UTF-8 are `LH_ERR_INVALID_UTF8`; empty or overlong ones
/// `LH_ERR_INVALID_CONFIG`.
///
/// # Safety
/// As for `lh_client_new`; `opts` is NULL or points to a readable `lh_etcd_options` whose
/// strings are readable for their lengths.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_client_new_etcd(
    cfg: *const lh_config,
    opts: *const lh_etcd_options,
    seed: *const u8,
    seed_len: usize,
    out: *mut *mut lh_client,
) -> lh_status {
    guard_static(|| {
        require_out(out, "out")?;
        // SAFETY: per the caller's contract.
        let cfg = unsafe { read_sized(cfg, "cfg")? };
        // SAFETY: per the caller's contract.
        let seed = unsafe { seed_arg(seed, seed_len)? };
        let proto = if opts.is_null() {
            EtcdProtocol::new()
        } else {
            // SAFETY: per the caller's contract.
            let o = unsafe { read_sized(opts, "opts")? };
            let text = |p: *const u8, len: usize, what: &'static str| {
                // SAFETY: per the caller's contract.
                let b = unsafe {
                    optional_bytes_arg(p, len, MAX_CREDENTIAL_LEN, what, LH_ERR_INVALID_CONFIG)
                }?;
                std::str::from_utf8(b)
                    .map_err(|_| Failure::new(LH_ERR_INVALID_UTF8, format!("{what} is not UTF-8")))
            };
            let user = text(o.user, o.user_len, "user")?;
            let password = text(o.password, o.password_len, "password")?;
            if user.is_empty() {
                EtcdProtocol::new()
            } else {
                EtcdProtocol::with_auth(user, password)?
            }
        };
        let core = Client::new(config_from_c(&cfg)?, seed)?;
        let mut state = ClientState::new(core);
        state.etcd = Some(Box::new(EtcdAttached {
            proto,
            method: Vec::new(),
            path: Vec::new(),
            body: Vec::new(),
            authorization: Vec::new(),
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

/// Takes the next request into `*out` (`out->id == 0` when none is left; drain until then
/// after every input, like `lh_poll_output`).
///
/// # Safety
/// `c` is NULL or a live handle; `out` is valid for writing one `lh_http_request`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_http_poll_request(
    c: *mut lh_client,
    out: *mut lh_http_request,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            require_out(out, "out")?;
            let (b, core) = s.with_etcd()?;
            let mut r = lh_http_request {
                id: 0,
                kind: 0,
                _reserved: 0,
                method: std::ptr::null(),
                path: std::ptr::null(),
                body: std::ptr::null(),
                body_len: 0,
                authorization: std::ptr::null(),
            };
            if let Some(req) = b.proto.poll_request(core) {
                let fill = |buf: &mut Vec<u8>, bytes: &[u8]| {
                    buf.clear();
                    buf.extend_from_slice(bytes);
                    buf.push(0);
                };
                fill(&mut b.method, req.method.as_bytes());
                fill(&mut b.path, req.path.as_bytes());
                fill(&mut b.body, req.body);
                fill(&mut b.authorization, req.authorization.as_bytes());
                r = lh_http_request {
                    id: req.id,
                    kind: req.kind as u32,
                    _reserved: 0,
                    method: b.method.as_ptr().cast(),
                    path: b.path.as_ptr().cast(),
                    body: b.body.as_ptr(),
                    body_len: b.body.len() - 1,
                    authorization: b.authorization.as_ptr().cast(),
                };
            }
            write_out(out, r);
            Ok(())
        })
    }
}

/// Hands back the reply to unary request `id`: the HTTP status (100..=599) and the whole
/// body (at most `LH_MAX_HTTP_BODY` bytes; NULL when empty). Read during the call, never
/// retained. Any status, error body or malformed JSON is the protocol's to judge (a
/// transport error for the engine, never a grant). Unknown and already answered ids are
/// counted and ignored (`LH_OK`).
///
/// # Safety
/// `c` is NULL or a live handle; `body` points to `body_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_http_reply(
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
            let body = optional_bytes_arg(body, body_len, MAX_BODY, "body", LH_ERR_INVALID_REPLY)?;
            let (b, core) = s.with_etcd()?;
            b.proto.handle_reply(core, now, id, status, body);
            Ok(())
        })
    }
}

/// One JSON message streamed on watch `id` (one line of its response body, without the
/// newline; at most `LH_MAX_HTTP_BODY` bytes).
///
/// # Safety
/// `c` is NULL or a live handle; `message` points to `message_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_http_stream_message(
    c: *mut lh_client,
    now: u64,
    id: u64,
    message: *const u8,
    message_len: usize,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            let message = optional_bytes_arg(
                message,
                message_len,
                MAX_BODY,
                "message",
                LH_ERR_INVALID_REPLY,
            )?;
            let (b, core) = s.with_etcd()?;
            b.proto.handle_watch_message(core, now, id, message);
            Ok(())
        })
    }
}

/// Request `id` got no reply (connection refused or broken, timed out on every member), or
/// watch stream `id` ended. `message` is the client's text (UTF-8 not required; at most
/// `LH_MAX_HTTP_BODY` bytes, NULL when empty). Unknown ids are counted and ignored.
///
/// # Safety
/// `c` is NULL or a live handle; `message` points to `message_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_http_failed(
    c: *mut lh_client,
    now: u64,
    id: u64,
    message: *const u8,
    message_len: usize,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            let msg = optional_bytes_arg(
                message,
                message_len,
                MAX_BODY,
                "message",
                LH_ERR_INVALID_REPLY,
            )?;
            let msg = String::from_utf8_lossy(msg);
            let (b, core) = s.with_etcd()?;
            b.proto.handle_failed(core, now, id, &msg);
            Ok(())
        })
    }
}

/// The client is closing: cancels acquires still waiting and queues a `lease/revoke` of
/// every pooled etcd lease (the keys of its locks go with it, so nothing of this client is
/// left on the cluster for a TTL); locks still held end Lost. Call it after releasing what
/// you hold and before `lh_client_free`, then run the loop until those requests are
/// answered, for a short bound (an unanswered revoke leaves the lease to expire on its own).
///
/// # Safety
/// `c` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_etcd_close(c: *mut lh_client, now: u64) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            let (b, core) = s.with_etcd()?;
            b.proto.close(core, now);
            Ok(())
        })
    }
}

/// Writes the etcd protocol's counters (`out->struct_size` must be set).
///
/// # Safety
/// `c` is NULL or a live handle; `out` is valid for writing `out->struct_size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_etcd_counters_get(
    c: *const lh_client,
    out: *mut lh_etcd_counters,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_ref(c, |s| {
            check_sized_out(out, "out")?;
            let Some(b) = &s.etcd else {
                return Err(Failure::new(
                    LH_ERR_NO_BACKEND,
                    "this handle has no etcd backend",
                ));
            };
            let k = b.proto.counters();
            write_out(
                out,
                lh_etcd_counters {
                    struct_size: size_of::<lh_etcd_counters>() as u32,
                    _reserved: 0,
                    requests: k.requests,
                    leases_granted: k.leases_granted,
                    txns: k.txns,
                    watches: k.watches,
                    wakeups: k.wakeups,
                    waiting_keepalives: k.waiting_keepalives,
                    waiters_expired: k.waiters_expired,
                    error_replies: k.error_replies,
                    garbage_replies: k.garbage_replies,
                    transport_failures: k.transport_failures,
                    stale_replies: k.stale_replies,
                },
            );
            Ok(())
        })
    }
}

/// The last error body, transport failure or malformed reply the protocol saw:
/// `*out_text` / `*out_len` (not NUL-terminated; length 0 if none), borrowed until the next
/// call on the handle.
///
/// # Safety
/// `c` is NULL or a live handle; the out-pointers are valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_etcd_last_error(
    c: *const lh_client,
    out_text: *mut *const u8,
    out_len: *mut usize,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_ref(c, |s| {
            require_out(out_text, "out_text")?;
            require_out(out_len, "out_len")?;
            let Some(b) = &s.etcd else {
                return Err(Failure::new(
                    LH_ERR_NO_BACKEND,
                    "this handle has no etcd backend",
                ));
            };
            let text = b.proto.last_error();
            write_out(out_text, out_ptr(text.as_bytes()));
            write_out(out_len, text.len());
            Ok(())
        })
    }
}
