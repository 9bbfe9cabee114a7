//! Status queries (`leasehold status`) on the handle's backend. A query is a request like any
//! other: the host runs what it produces and polls the answer.
#![allow(non_camel_case_types)]

use super::boundary::{check_sized_out, guard_mut, name_arg, out_ptr, require_out, write_out};
use super::client::lh_client;
use super::types::*;

/// What the backend said about one name (`lh_poll_status`). Advisory: it can change at once.
/// Numbers that are unknown (or that the backend does not record) are 0.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lh_lock_status {
    /// `sizeof(lh_lock_status)` as compiled by the caller; set to the library's size.
    pub struct_size: u32,
    /// 1 if the query succeeded; 0 if it failed (`error` says why).
    pub ok: u32,
    /// The id `lh_status_request` returned; 0 when no answer is waiting.
    pub id: u64,
    /// 1 while a live grant exists.
    pub held: u32,
    /// Always 0.
    pub _reserved: u32,
    /// The holder's fencing token, while held.
    pub fencing_token: u64,
    /// The holder's remaining TTL in ms, while held.
    pub remaining_ttl_ms: u64,
    /// The highest fence ever minted for the name (SQL, Redis while its fence key lives).
    pub last_fencing_token: u64,
    /// SQLite: the holder's process id, while held.
    pub holder_pid: i64,
    /// How long the grant has been held, in ms (when recorded).
    pub held_for_ms: u64,
    /// SQLite: the holder's host name (borrowed, not NUL-terminated), while held.
    pub holder_host: *const u8,
    /// Length of `holder_host`.
    pub holder_host_len: usize,
    /// Why the query failed (borrowed, not NUL-terminated), when `ok == 0`.
    pub error: *const u8,
    /// Length of `error`.
    pub error_len: usize,
}

/// Queues a status query for `name` (rules as for `lh_acquire`'s name) on the handle's
/// backend protocol; `*out_id` identifies its answer in `lh_poll_status`. Run the requests it
/// produces as usual.
///
/// # Safety
/// `c` is NULL or a live handle; `name` points to `name_len` readable bytes; `out_id` is
/// valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_status_request(
    c: *mut lh_client,
    now: u64,
    name: *const u8,
    name_len: usize,
    out_id: *mut u64,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            require_out(out_id, "out_id")?;
            let name = name_arg(name, name_len)?;
            let id = s.proto.request_status(&mut s.core, now, name)?;
            write_out(out_id, id);
            Ok(())
        })
    }
}

/// Takes the next answered status query into `*out` (`out->id == 0` when none is waiting).
/// Its strings borrow the handle until the next call on it.
///
/// # Safety
/// `c` is NULL or a live handle; `out` is valid for reading and writing an `lh_lock_status`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_poll_status(c: *mut lh_client, out: *mut lh_lock_status) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            check_sized_out(out, "out")?;
            let mut v = lh_lock_status {
                struct_size: size_of::<lh_lock_status>() as u32,
                ok: 0,
                id: 0,
                held: 0,
                _reserved: 0,
                fencing_token: 0,
                remaining_ttl_ms: 0,
                last_fencing_token: 0,
                holder_pid: 0,
                held_for_ms: 0,
                holder_host: std::ptr::null(),
                holder_host_len: 0,
                error: std::ptr::null(),
                error_len: 0,
            };
            if let Some((id, answer)) = s.proto.poll_status() {
                v.id = id;
                match answer {
                    Ok(st) => {
                        v.ok = 1;
                        v.held = u32::from(st.held);
                        v.fencing_token = st.fencing_token.unwrap_or(0);
                        v.remaining_ttl_ms = st.remaining_ttl_ms.unwrap_or(0);
                        v.last_fencing_token = st.last_fencing_token.unwrap_or(0);
                        v.holder_pid = st.holder_pid.unwrap_or(0);
                        v.held_for_ms = st.held_for_ms.unwrap_or(0);
                        s.status_text = st.holder_host.unwrap_or_default();
                        v.holder_host = out_ptr(s.status_text.as_bytes());
                        v.holder_host_len = s.status_text.len();
                    }
                    Err(e) => {
                        s.status_text = e;
                        v.error = out_ptr(s.status_text.as_bytes());
                        v.error_len = s.status_text.len();
                    }
                }
            }
            write_out(out, v);
            Ok(())
        })
    }
}
