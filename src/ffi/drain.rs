//! The host's drain in one call (`lh_drain`): the next request, every pending event and the
//! next deadline. A host whose crossings cost (ctypes, cgo) drains after each input with one
//! call where the run loop's `lh_io_poll` / `lh_poll_event` / `lh_poll_timeout` take four.
//! `lh_io_received_drain` also feeds the input, when it is bytes read on a stream: a reply
//! and what it caused cross once.
#![allow(non_camel_case_types)]

use super::boundary::{Failure, check_growing_out, guard_mut, write_out, write_prefix};
use super::client::{ClientState, event_to_c, lh_client};
use super::io::lh_io_request;
use super::types::{LH_EVENT_NONE, LH_NO_DEADLINE, lh_event, lh_status};

/// What one `lh_drain` call took out. Fill `struct_size`; the rest is written (up to
/// `struct_size`: a host built against the first struct, which ends at `deadline_ns`, gets
/// that much and calls again while `request` is 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct lh_drained {
    /// `sizeof(lh_drained)` as compiled by the caller; written back as the size written.
    pub struct_size: u32,
    /// 1 when `*request` holds a request, 0 when none is left (`request->kind ==
    /// LH_IO_NONE`) or `request` was NULL.
    pub request: u32,
    /// Events written to `events`, in order.
    pub nevents: u32,
    /// 1 when `events` was filled to its capacity (more may be pending: call again).
    pub more_events: u32,
    /// The next deadline (`LH_NO_DEADLINE`: none), as `lh_poll_timeout` gives it, on the
    /// call that ends a drain (`more_requests` and `more_events` both 0). A call that sets
    /// either leaves the deadline to the next call and writes `LH_NO_DEADLINE` here: what is
    /// still to take can move it.
    pub deadline_ns: u64,
    /// 1 when another request may be pending: run this one, then call again. 0 when none
    /// is: the drain ends with this call (given `more_events` is 0). It may say 1 and the
    /// next call find none (what the engine still has to say can but need not make one).
    pub more_requests: u32,
    /// Zero.
    pub _reserved: u32,
}

/// Size of the first `lh_drained` (up to `deadline_ns`): the smallest `struct_size`
/// `lh_drain` accepts.
pub const LH_DRAINED_V1_SIZE: usize = 24;

const _: () = assert!(std::mem::offset_of!(lh_drained, more_requests) == LH_DRAINED_V1_SIZE);

/// The host's drain after an input, in one call: takes the next IO request into `*request`
/// (as `lh_io_poll`; skipped when `request` is NULL), then up to `events_cap` events into
/// `events` (as `lh_poll_event`; skipped when `events_cap` is 0), then, when neither is
/// left, the next deadline. Call it again while `out->more_requests` or `out->more_events`
/// is 1 (with the first, shorter `lh_drained`: while `out->request` or `out->more_events`).
/// What `*request` points to is valid until the next poll of either kind. It mixes freely
/// with the single polls.
///
/// # Safety
/// `c` is NULL or a live handle; `request` is NULL or valid for writing one `lh_io_request`;
/// `events` is valid for writing `events_cap` `lh_event`s (NULL allowed when `events_cap`
/// is 0); `out` is valid for writing one `lh_drained` whose `struct_size` is set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_drain(
    c: *mut lh_client,
    request: *mut lh_io_request,
    events: *mut lh_event,
    events_cap: usize,
    out: *mut lh_drained,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            let size = check_drain_args(events, events_cap, out)?;
            drain_into(s, request, events, events_cap, out, size);
            Ok(())
        })
    }
}

/// `lh_io_received` and then the first `lh_drain`, in one call: what the bytes caused comes
/// back with them, so a host whose crossings cost (ctypes, cgo) feeds a read and takes what
/// it caused in one. Continue with `lh_drain` while `out` says more is left, as after any
/// `lh_drain` call. The drain's arguments are checked first and refused bytes drain nothing
/// (`out` untouched): on any status but `LH_OK` the bytes were not taken, and the host
/// drains as after any refused input.
///
/// # Safety
/// As `lh_io_received` for `c`, `bytes` and `len`; as `lh_drain` for `request`, `events`,
/// `events_cap` and `out`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // (the two calls' arguments, in their order)
pub unsafe extern "C" fn lh_io_received_drain(
    c: *mut lh_client,
    now: u64,
    stream: u64,
    bytes: *const u8,
    len: usize,
    request: *mut lh_io_request,
    events: *mut lh_event,
    events_cap: usize,
    out: *mut lh_drained,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            let size = check_drain_args(events, events_cap, out)?;
            super::stream::received(s, now, stream, bytes, len)?;
            drain_into(s, request, events, events_cap, out, size);
            Ok(())
        })
    }
}

/// The size of `out` to write, or why the drain's arguments are refused.
///
/// # Safety
/// `out` is NULL or valid for reading its leading `struct_size`.
unsafe fn check_drain_args(
    events: *mut lh_event,
    events_cap: usize,
    out: *mut lh_drained,
) -> Result<usize, Failure> {
    // SAFETY: per the caller's contract.
    let size = unsafe { check_growing_out(out, "out", LH_DRAINED_V1_SIZE) }?;
    if events.is_null() && events_cap > 0 {
        return Err(Failure::null("events"));
    }
    Ok(size)
}

/// One drain call into checked arguments (see `lh_drain`).
///
/// # Safety
/// As `lh_drain`, with `out` checked and `size` from `check_drain_args`.
unsafe fn drain_into(
    s: &mut ClientState,
    request: *mut lh_io_request,
    events: *mut lh_event,
    events_cap: usize,
    out: *mut lh_drained,
    size: usize,
) {
    let mut d = lh_drained {
        struct_size: size_of::<lh_drained>() as u32,
        ..lh_drained::default()
    };
    // SAFETY (the writes below): per the caller's contract.
    if !request.is_null() {
        let r = s.poll_request();
        d.request = u32::from(r.kind != super::io::LH_IO_NONE);
        unsafe { write_out(request, r) };
    }
    let cap = events_cap.min(u32::MAX as usize);
    while (d.nevents as usize) < cap {
        let ev = event_to_c(s.proto.poll_event(&mut s.core));
        if ev.kind == LH_EVENT_NONE {
            break;
        }
        unsafe { write_out(events.add(d.nevents as usize), ev) };
        d.nevents += 1;
    }
    d.more_events = u32::from(cap > 0 && d.nevents as usize == cap);
    // Whether the next call would find a request (what `*request` points to stays valid:
    // looking ahead takes nothing).
    d.more_requests = u32::from(d.request == 1 && s.proto.may_have_request(&mut s.core));
    // Only the last call's deadline is kept, so only it pays for one.
    d.deadline_ns = if d.more_requests == 0 && d.more_events == 0 {
        s.proto.poll_timeout(&mut s.core).unwrap_or(LH_NO_DEADLINE)
    } else {
        LH_NO_DEADLINE
    };
    unsafe { write_prefix(out, d, size) };
}
