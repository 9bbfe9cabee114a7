//! The Redis protocol exports: the canonical Lua scripts and the key layout of
//! [`crate::redis`], so every host transport runs the same bytes against the same keys.
//!
//! Both functions take no handle: they are thread-safe and keep no state.
#![allow(non_camel_case_types)]

use std::ffi::c_char;

use super::boundary::{Failure, guard_static, name_arg, require_out, write_out};
use super::types::*;
use crate::redis::{KeyKind, ScriptKind, WAKE_RANDOM_LEN, write_key, write_wake_channel};

/// `lh_redis_script` kind: ACQUIRE. `KEYS = [lock, fence]`, `ARGV = [token, ttl_ms]`, or, to
/// queue as a waiter when refused, `KEYS = [lock, fence, waiters]`,
/// `ARGV = [token, ttl_ms, wake_channel]` (protocol 2: the client's wake channel is queued),
/// or `KEYS = [lock, fence, waiters, grants]`, `ARGV = [token, ttl_ms, wake_channel, tag]`
/// (protocol 3: the lease is queued as `wake_channel#token` with its `ttl_ms` and `tag`, the
/// host's attempt id in 1..20 decimal digits, for a direct grant on release) →
/// `[1, fencing_token, ttl_ms]` granted (idempotent for the same token) or
/// `[0, retry_after_ms]` held by another token (`-1` = no hint). A wake channel is `lh:wake:`
/// followed by a suffix unique to the client's pub/sub connection (at most 128 bytes in all,
/// never a `#`; `lh_redis_wake_channel` makes one); the client subscribes to it before it
/// queues.
pub const LH_REDIS_SCRIPT_ACQUIRE: u32 = 1;
/// `lh_redis_script` kind: RENEW. `KEYS = [lock]`, `ARGV = [token, ttl_ms]` → `1` renewed,
/// `0` rejected (never re-creates an expired lock).
pub const LH_REDIS_SCRIPT_RENEW: u32 = 2;
/// `lh_redis_script` kind: RELEASE. `KEYS = [lock]`, `[lock, waiters]` or
/// `[lock, waiters, fence, grants]`, `ARGV = [token, channel, name]` plus optionally the
/// caller's own wake channel if it no longer waits → `1` released (the oldest live queued
/// waiter is woken with `name` on its wake channel, or with the 4 keys a queued lease is
/// granted the lock directly and gets a grant notice on it; then `PUBLISH channel name`), `0`
/// not owner. A grant notice is `"\0grant TAG FENCE TTL_MS TOKEN_LEN "` followed by the token
/// and the name (numbers in decimal, tokens may contain spaces); a wake-channel payload that
/// starts with a NUL byte is a grant notice, anything else a lock name.
pub const LH_REDIS_SCRIPT_RELEASE: u32 = 3;
/// `lh_redis_script` kind: NOTIFY. `KEYS = [waiters]`, `ARGV = [name]` plus optionally the
/// caller's own wake channel → `1` a queued client was woken, `0` none was reachable. A
/// client runs it when it receives a wake-up for a name it no longer waits for. It never
/// grants: a protocol-3 entry gets the plain name too.
pub const LH_REDIS_SCRIPT_NOTIFY: u32 = 4;
/// `lh_redis_key` kind: the lock key `lh:{NAME}` (a hash `{token, fence}` with a PX expiry).
pub const LH_REDIS_KEY_LOCK: u32 = 1;
/// `lh_redis_key` kind: the fence key `lh:{NAME}:fence` (decimal text, no expiry).
pub const LH_REDIS_KEY_FENCE: u32 = 2;
/// `lh_redis_key` kind: the release channel `lh:{NAME}:released` (every release is published
/// on it; subscribe to hear all releases of a name).
pub const LH_REDIS_KEY_CHANNEL: u32 = 3;
/// `lh_redis_key` kind: the waiters key `lh:{NAME}:waiters` (a zset of the wake channels of
/// waiting clients, and of `wake_channel#token` entries of waiting leases, oldest first;
/// RELEASE wakes one of them).
pub const LH_REDIS_KEY_WAITERS: u32 = 4;
/// `lh_redis_key` kind: the grants key `lh:{NAME}:grants` (protocol 3: a hash from the token
/// of each queued lease to `<ttl_ms>:<tag>` of its latest refused attempt; a 4-key RELEASE
/// grants the lock to the oldest queued lease with these).
pub const LH_REDIS_KEY_GRANTS: u32 = 5;

/// Random bytes `lh_redis_wake_channel` takes.
pub const LH_REDIS_WAKE_RANDOM_LEN: usize = 16;

const _: () = {
    assert!(LH_REDIS_WAKE_RANDOM_LEN == WAKE_RANDOM_LEN);
    assert!(LH_REDIS_SCRIPT_ACQUIRE == ScriptKind::Acquire as u32);
    assert!(LH_REDIS_SCRIPT_RENEW == ScriptKind::Renew as u32);
    assert!(LH_REDIS_SCRIPT_RELEASE == ScriptKind::Release as u32);
    assert!(LH_REDIS_SCRIPT_NOTIFY == ScriptKind::Notify as u32);
    assert!(LH_REDIS_KEY_LOCK == KeyKind::Lock as u32);
    assert!(LH_REDIS_KEY_FENCE == KeyKind::Fence as u32);
    assert!(LH_REDIS_KEY_CHANNEL == KeyKind::Channel as u32);
    assert!(LH_REDIS_KEY_WAITERS == KeyKind::Waiters as u32);
    assert!(LH_REDIS_KEY_GRANTS == KeyKind::Grants as u32);
};

/// The canonical Lua script of `kind` (`LH_REDIS_SCRIPT_*`).
///
/// On success `*out_text` points to static text (valid for the life of the process, never
/// freed, NUL-terminated for convenience) and `*out_len` is its length in bytes without the
/// NUL. Run it with EVALSHA (SHA1 of exactly those `*out_len` bytes), falling back to EVAL on
/// a NOSCRIPT error. A Redis error reply whose message starts with `lh:` means garbage in the
/// keyspace or malformed arguments: report it as a transport error, never as a grant.
///
/// Errors: `LH_ERR_NULL_ARGUMENT` (an out-pointer is NULL), `LH_ERR_INVALID_ENUM` (unknown
/// kind).
///
/// # Safety
/// `out_text` and `out_len` are NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_redis_script(
    kind: u32,
    out_text: *mut *const c_char,
    out_len: *mut usize,
) -> lh_status {
    guard_static(|| {
        require_out(out_text, "out_text")?;
        require_out(out_len, "out_len")?;
        let kind = ScriptKind::from_u32(kind)
            .ok_or_else(|| Failure::invalid_enum("redis script kind", kind))?;
        let text = kind.text_with_nul();
        // SAFETY: both out-pointers were checked non-NULL; the caller guarantees validity.
        unsafe {
            write_out(out_text, text.as_ptr().cast::<c_char>());
            write_out(out_len, text.len() - 1);
        }
        Ok(())
    })
}

/// Formats the Redis key of `kind` (`LH_REDIS_KEY_*`) for the lock `name` into `buf`.
///
/// `name` is UTF-8 of `name_len` bytes (not NUL-terminated), non-empty, at most
/// `LH_MAX_NAME_LEN` bytes and without NUL — the same rules as `lh_acquire`. On success the
/// key (not NUL-terminated) is in `buf[0 .. *out_len]`. If `buf_len` is too small the call
/// returns `LH_ERR_BUFFER_TOO_SMALL`, writes nothing to `buf` and sets `*out_len` to the size
/// needed (so `buf = NULL, buf_len = 0` asks for the size). `buf` may be NULL only when
/// `buf_len` is 0.
///
/// Errors: `LH_ERR_NULL_ARGUMENT`, `LH_ERR_INVALID_ENUM`, `LH_ERR_INVALID_UTF8`,
/// `LH_ERR_EMPTY_NAME`, `LH_ERR_NAME_TOO_LONG`, `LH_ERR_NAME_HAS_NUL`,
/// `LH_ERR_BUFFER_TOO_SMALL`.
///
/// # Safety
/// `name` points to `name_len` readable bytes (if `name_len <= LH_MAX_NAME_LEN`); `buf` is
/// NULL with `buf_len == 0` or points to `buf_len` writable bytes that do not overlap `name`;
/// `out_len` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_redis_key(
    kind: u32,
    name: *const u8,
    name_len: usize,
    buf: *mut u8,
    buf_len: usize,
    out_len: *mut usize,
) -> lh_status {
    guard_static(|| {
        require_out(out_len, "out_len")?;
        let kind =
            KeyKind::from_u32(kind).ok_or_else(|| Failure::invalid_enum("redis key kind", kind))?;
        // SAFETY: forwarded caller contract for `name`.
        let name = unsafe { name_arg(name, name_len)? };
        // SAFETY: forwarded caller contract for `buf`.
        let dst = unsafe { out_buffer(buf, buf_len)? };
        let written = write_key(kind, name, dst)?;
        // SAFETY: `out_len` was checked non-NULL above.
        unsafe { report_len(written, out_len, buf_len, "the key") }
    })
}

/// Formats a wake channel into `buf` from `LH_REDIS_WAKE_RANDOM_LEN` random bytes: `lh:wake:`
/// and the bytes in lowercase hex (40 bytes). Take the bytes from the OS (`getrandom`,
/// `/dev/urandom`) once per pub/sub connection; every client needs a channel of its own.
///
/// On success the channel (not NUL-terminated) is in `buf[0 .. *out_len]`. If `buf_len` is too
/// small the call returns `LH_ERR_BUFFER_TOO_SMALL`, writes nothing to `buf` and sets
/// `*out_len` to the size needed (so `buf = NULL, buf_len = 0` asks for the size). `buf` may be
/// NULL only when `buf_len` is 0.
///
/// Errors: `LH_ERR_NULL_ARGUMENT`, `LH_ERR_BUFFER_TOO_SMALL`.
///
/// # Safety
/// `random` is NULL or points to `LH_REDIS_WAKE_RANDOM_LEN` readable bytes; `buf` is NULL with
/// `buf_len == 0` or points to `buf_len` writable bytes that do not overlap `random`; `out_len`
/// is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_redis_wake_channel(
    random: *const u8,
    buf: *mut u8,
    buf_len: usize,
    out_len: *mut usize,
) -> lh_status {
    guard_static(|| {
        require_out(out_len, "out_len")?;
        if random.is_null() {
            return Err(Failure::null("random"));
        }
        // SAFETY: forwarded caller contract for `buf`.
        let dst = unsafe { out_buffer(buf, buf_len)? };
        let mut bytes = [0u8; WAKE_RANDOM_LEN];
        // SAFETY: non-NULL and `LH_REDIS_WAKE_RANDOM_LEN` readable bytes per the contract.
        bytes.copy_from_slice(unsafe { std::slice::from_raw_parts(random, WAKE_RANDOM_LEN) });
        let written = write_wake_channel(&bytes, dst);
        // SAFETY: `out_len` was checked non-NULL above.
        unsafe { report_len(written, out_len, buf_len, "the wake channel") }
    })
}

/// The caller's output buffer: NULL only with length 0.
///
/// # Safety
/// `buf` is NULL or points to `buf_len` writable bytes, unaliased for the returned lifetime.
unsafe fn out_buffer<'a>(buf: *mut u8, buf_len: usize) -> Result<&'a mut [u8], Failure> {
    if buf_len == 0 {
        return Ok(&mut []);
    }
    if buf.is_null() {
        return Err(Failure::null("buf"));
    }
    // SAFETY: non-NULL and `buf_len` writable bytes per the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf, buf_len) })
}

/// Reports what a formatter wrote: its length, or, when `buf_len` was too small, the size
/// needed (the one out-param written on an error: the contract's size query).
///
/// # Safety
/// `out_len` is non-NULL and valid for writes.
unsafe fn report_len(
    written: Result<usize, usize>,
    out_len: *mut usize,
    buf_len: usize,
    what: &str,
) -> Result<(), Failure> {
    match written {
        Ok(len) => {
            // SAFETY: per this function's contract.
            unsafe { write_out(out_len, len) };
            Ok(())
        }
        Err(needed) => {
            // SAFETY: per this function's contract.
            unsafe { write_out(out_len, needed) };
            Err(Failure::new(
                LH_ERR_BUFFER_TOO_SMALL,
                format!("buffer of {buf_len} bytes, {what} needs {needed}"),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ptr;

    #[test]
    fn wake_channels_are_formatted_and_bad_arguments_write_nothing() {
        let random = [0xa5u8; LH_REDIS_WAKE_RANDOM_LEN];
        let mut buf = [0xAAu8; 64];
        let mut out = usize::MAX;
        // SAFETY: valid pointers and lengths throughout; NULLs must be reported.
        unsafe {
            assert_eq!(
                lh_redis_wake_channel(random.as_ptr(), buf.as_mut_ptr(), 64, &mut out),
                LH_OK
            );
            assert_eq!(
                &buf[..out],
                format!("lh:wake:{}", "a5".repeat(16)).as_bytes()
            );
            assert!(buf[out..].iter().all(|&b| b == 0xAA));
            let mut size = 0usize;
            assert_eq!(
                lh_redis_wake_channel(random.as_ptr(), ptr::null_mut(), 0, &mut size),
                LH_ERR_BUFFER_TOO_SMALL
            );
            assert_eq!(size, 40);
            let mut short = [0xAAu8; 39];
            assert_eq!(
                lh_redis_wake_channel(random.as_ptr(), short.as_mut_ptr(), 39, &mut size),
                LH_ERR_BUFFER_TOO_SMALL
            );
            assert!(short.iter().all(|&b| b == 0xAA));
            let mut untouched = usize::MAX;
            for (r, b, n, o) in [
                (ptr::null(), buf.as_mut_ptr(), 64, &raw mut untouched),
                (random.as_ptr(), ptr::null_mut(), 64, &raw mut untouched),
                (random.as_ptr(), buf.as_mut_ptr(), 64, ptr::null_mut()),
            ] {
                assert_eq!(lh_redis_wake_channel(r, b, n, o), LH_ERR_NULL_ARGUMENT);
            }
            assert_eq!(untouched, usize::MAX);
        }
    }

    fn script(kind: u32) -> Result<&'static str, lh_status> {
        let mut text: *const c_char = ptr::null();
        let mut len = 0usize;
        // SAFETY: valid out-pointers.
        let status = unsafe { lh_redis_script(kind, &mut text, &mut len) };
        if status != LH_OK {
            return Err(status);
        }
        // SAFETY: static text of `len` bytes followed by a NUL.
        let bytes = unsafe { std::slice::from_raw_parts(text.cast::<u8>(), len + 1) };
        assert_eq!(bytes[len], 0, "NUL-terminated");
        Ok(std::str::from_utf8(&bytes[..len]).unwrap())
    }

    fn key(kind: u32, name: &[u8], buf_len: usize) -> (lh_status, usize, Vec<u8>) {
        let mut buf = vec![0xAAu8; buf_len];
        let mut out = usize::MAX;
        let bp = if buf_len == 0 {
            ptr::null_mut()
        } else {
            buf.as_mut_ptr()
        };
        // SAFETY: valid pointers and lengths.
        let status =
            unsafe { lh_redis_key(kind, name.as_ptr(), name.len(), bp, buf_len, &mut out) };
        (status, out, buf)
    }

    #[test]
    fn scripts_are_the_canonical_texts() {
        assert_eq!(
            script(LH_REDIS_SCRIPT_ACQUIRE),
            Ok(crate::redis::ACQUIRE_SCRIPT)
        );
        assert_eq!(
            script(LH_REDIS_SCRIPT_RENEW),
            Ok(crate::redis::RENEW_SCRIPT)
        );
        assert_eq!(
            script(LH_REDIS_SCRIPT_RELEASE),
            Ok(crate::redis::RELEASE_SCRIPT)
        );
        assert_eq!(
            script(LH_REDIS_SCRIPT_NOTIFY),
            Ok(crate::redis::NOTIFY_SCRIPT)
        );
        assert_eq!(script(0), Err(LH_ERR_INVALID_ENUM));
        assert_eq!(script(5), Err(LH_ERR_INVALID_ENUM));
    }

    #[test]
    fn script_null_out_pointers_are_errors_and_write_nothing() {
        let mut len = 7usize;
        // SAFETY: NULL is allowed and must be reported.
        assert_eq!(
            unsafe { lh_redis_script(1, ptr::null_mut(), &mut len) },
            LH_ERR_NULL_ARGUMENT
        );
        assert_eq!(len, 7);
        let mut text: *const c_char = ptr::null();
        // SAFETY: as above.
        assert_eq!(
            unsafe { lh_redis_script(1, &mut text, ptr::null_mut()) },
            LH_ERR_NULL_ARGUMENT
        );
        assert!(text.is_null());
    }

    #[test]
    fn keys_are_formatted_and_sizes_reported() {
        let (s, n, buf) = key(LH_REDIS_KEY_LOCK, b"jobs", 64);
        assert_eq!((s, &buf[..n]), (LH_OK, &b"lh:{jobs}"[..]));
        assert!(buf[n..].iter().all(|&b| b == 0xAA));
        let (s, n, buf) = key(LH_REDIS_KEY_FENCE, b"jobs", 15);
        assert_eq!((s, &buf[..n]), (LH_OK, &b"lh:{jobs}:fence"[..]));
        let (s, n, buf) = key(LH_REDIS_KEY_CHANNEL, "é".as_bytes(), 64);
        assert_eq!((s, &buf[..n]), (LH_OK, "lh:{é}:released".as_bytes()));
        let (s, n, buf) = key(LH_REDIS_KEY_WAITERS, b"jobs", 64);
        assert_eq!((s, &buf[..n]), (LH_OK, &b"lh:{jobs}:waiters"[..]));
        let (s, n, buf) = key(LH_REDIS_KEY_GRANTS, b"jobs", 64);
        assert_eq!((s, &buf[..n]), (LH_OK, &b"lh:{jobs}:grants"[..]));
        // Size query with NULL/0, and a one-byte-short buffer: nothing written, size reported.
        assert_eq!(
            key(LH_REDIS_KEY_FENCE, b"jobs", 0).0,
            LH_ERR_BUFFER_TOO_SMALL
        );
        assert_eq!(key(LH_REDIS_KEY_FENCE, b"jobs", 0).1, 15);
        let (s, n, buf) = key(LH_REDIS_KEY_FENCE, b"jobs", 14);
        assert_eq!((s, n), (LH_ERR_BUFFER_TOO_SMALL, 15));
        assert!(buf.iter().all(|&b| b == 0xAA));
    }

    #[test]
    fn bad_key_arguments_are_errors_that_write_nothing() {
        for (kind, name, want) in [
            (0, &b"jobs"[..], LH_ERR_INVALID_ENUM),
            (6, &b"jobs"[..], LH_ERR_INVALID_ENUM),
            (LH_REDIS_KEY_LOCK, &b""[..], LH_ERR_EMPTY_NAME),
            (LH_REDIS_KEY_LOCK, &b"a\0b"[..], LH_ERR_NAME_HAS_NUL),
            (LH_REDIS_KEY_LOCK, &b"\xff\xfe"[..], LH_ERR_INVALID_UTF8),
            (
                LH_REDIS_KEY_LOCK,
                &[b'n'; LH_MAX_NAME_LEN + 1][..],
                LH_ERR_NAME_TOO_LONG,
            ),
        ] {
            let (s, n, buf) = key(kind, name, 64);
            assert_eq!(s, want, "{kind} {name:?}");
            assert_eq!(n, usize::MAX, "out_len untouched");
            assert!(buf.iter().all(|&b| b == 0xAA));
        }
        let mut out = 0usize;
        // SAFETY: NULL arguments must be reported, not dereferenced.
        unsafe {
            assert_eq!(
                lh_redis_key(1, ptr::null(), 4, ptr::null_mut(), 0, &mut out),
                LH_ERR_NULL_ARGUMENT
            );
            assert_eq!(
                lh_redis_key(1, b"jobs".as_ptr(), 4, ptr::null_mut(), 8, &mut out),
                LH_ERR_NULL_ARGUMENT
            );
            let mut buf = [0u8; 16];
            assert_eq!(
                lh_redis_key(
                    1,
                    b"jobs".as_ptr(),
                    4,
                    buf.as_mut_ptr(),
                    16,
                    ptr::null_mut()
                ),
                LH_ERR_NULL_ARGUMENT
            );
        }
    }
}
