//! The answers of the *stream* kind of the seam (`LH_IO_OPEN`, `LH_IO_WRITE`,
//! `LH_IO_SHUTDOWN`): the host opened a stream, read bytes on it, or saw it close. The core
//! owns what the bytes mean (Redis on the stream path: `LH_BACKEND_REDIS_STREAM`).

use super::boundary::{Failure, guard_mut, optional_bytes_arg};
use super::client::{ClientState, lh_client};
use super::types::*;
use super::values::LH_MAX_REPLY_DATA;
use crate::backend::StreamAnswerError;
use crate::backend::redis::stream::StreamError;

fn refused(e: StreamAnswerError) -> Failure {
    match e {
        StreamAnswerError::WrongKind(m) => Failure::new(LH_ERR_WRONG_ANSWER, m),
        StreamAnswerError::Stream(e @ StreamError::Unknown(_)) => {
            Failure::new(LH_ERR_UNKNOWN_CONNECTION, e.to_string())
        }
        StreamAnswerError::Stream(e @ StreamError::NotOpen(_)) => {
            Failure::new(LH_ERR_WRONG_ANSWER, e.to_string())
        }
    }
}

/// The host opened `stream` (of an `LH_IO_OPEN`, TLS handshake included): the core starts
/// its own handshake on it. A stream closed since is ignored (`LH_OK`); an id never handed
/// out is `LH_ERR_UNKNOWN_CONNECTION`; a handle whose backend opens no streams,
/// `LH_ERR_WRONG_ANSWER`.
///
/// # Safety
/// `c` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_io_opened(c: *mut lh_client, now: u64, stream: u64) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            s.proto
                .handle_opened(&mut s.core, now, stream)
                .map_err(refused)
        })
    }
}

/// `len` bytes read on `stream`, split anywhere (at most `LH_MAX_REPLY_DATA` per call: split longer reads); read
/// during the call, never retained. Bytes for a stream closed since are ignored (`LH_OK`);
/// bytes before `lh_io_opened` are `LH_ERR_WRONG_ANSWER`; an unknown id is
/// `LH_ERR_UNKNOWN_CONNECTION`.
///
/// # Safety
/// `c` is NULL or a live handle; `bytes` points to `len` readable bytes (NULL when 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_io_received(
    c: *mut lh_client,
    now: u64,
    stream: u64,
    bytes: *const u8,
    len: usize,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe { guard_mut(c, |s| received(s, now, stream, bytes, len)) }
}

/// `lh_io_received`'s work, shared with `lh_io_received_drain`.
///
/// # Safety
/// `bytes` points to `len` readable bytes (NULL when 0).
pub(super) unsafe fn received(
    s: &mut ClientState,
    now: u64,
    stream: u64,
    bytes: *const u8,
    len: usize,
) -> Result<(), Failure> {
    // SAFETY: per the caller's contract.
    let bytes = unsafe {
        optional_bytes_arg(bytes, len, LH_MAX_REPLY_DATA, "bytes", LH_ERR_INVALID_REPLY)
    }?;
    s.proto
        .handle_received(&mut s.core, now, stream, bytes)
        .map_err(refused)
}

/// `stream` ended (the peer closed it, a read or write failed) or never opened (refused,
/// timed out, a TLS failure); `message` is the host's reason (UTF-8 not required, at most
/// `LH_MAX_REPLY_DATA` bytes, NULL when empty), kept as the backend's last error. The core
/// fails what was outstanding on it and opens a new stream after a backoff. A stream closed
/// since is ignored; an unknown id is `LH_ERR_UNKNOWN_CONNECTION`.
///
/// # Safety
/// `c` is NULL or a live handle; `message` points to `message_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_io_closed(
    c: *mut lh_client,
    now: u64,
    stream: u64,
    message: *const u8,
    message_len: usize,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            let msg = optional_bytes_arg(
                message,
                message_len,
                LH_MAX_REPLY_DATA,
                "message",
                LH_ERR_INVALID_REPLY,
            )?;
            let msg = String::from_utf8_lossy(msg);
            s.proto
                .handle_closed(&mut s.core, now, stream, &msg)
                .map_err(refused)
        })
    }
}
