//! A client handle with the Redis protocol attached (`lh_client_new_redis`).
//!
//! Application calls stay the same (`lh_acquire`, `lh_release`, `lh_poll_output` for events,
//! `lh_poll_timeout` / `lh_timeout`); the engine's commands no longer come out of
//! `lh_poll_output`: they become Redis requests, polled with `lh_poll_request`, run verbatim
//! by the host, and answered with `lh_reply` / `lh_request_failed`. Pub/sub traffic comes in
//! through `lh_pubsub_message` and `lh_subscription`.
//!
//! Replies cross as a flat pre-order list of `lh_value` plus one data buffer that string
//! values point into by offset: no pointers inside structs, so cgo passes Go memory without
//! pinning, and ctypes and C++ fill them without a copy per value.
#![allow(non_camel_case_types)]

use super::boundary::{
    Diag, Failure, bytes_arg, guard_mut, guard_ref, guard_static, optional_bytes_arg, out_ptr,
    read_growing, read_sized, require_out, write_out,
};
use super::client::{ClientState, config_from_c, lh_client, seed_arg};
use super::types::*;
use crate::backend::redis::{self as proto, Connection, FlatValue, RedisOptions, RedisProtocol};
use crate::{Client, Output};

/// `lh_request.connection`: the ordinary commands connection.
pub const LH_CONNECTION_COMMANDS: u32 = 1;
/// `lh_request.connection`: the pub/sub (subscriber) connection.
pub const LH_CONNECTION_SUBSCRIBER: u32 = 2;

/// `lh_value.kind`: nil (null bulk string, null array, RESP3 null).
pub const LH_VALUE_NIL: u32 = 1;
/// `lh_value.kind`: integer (`integer`).
pub const LH_VALUE_INT: u32 = 2;
/// `lh_value.kind`: bulk string (`offset`, `len` into the data buffer).
pub const LH_VALUE_BULK: u32 = 3;
/// `lh_value.kind`: simple string such as `OK` (`offset`, `len`).
pub const LH_VALUE_STATUS: u32 = 4;
/// `lh_value.kind`: error reply, the message without `-` (`offset`, `len`).
pub const LH_VALUE_ERROR: u32 = 5;
/// `lh_value.kind`: array of `len` elements, which follow it in the list (pre-order).
pub const LH_VALUE_ARRAY: u32 = 6;

/// Most values in one reply (`lh_reply` refuses more with `LH_ERR_INVALID_REPLY`).
pub const LH_MAX_REPLY_VALUES: usize = 4096;
/// Largest data buffer of one reply, and longest pub/sub channel or payload, in bytes.
pub const LH_MAX_REPLY_DATA: usize = 1 << 20;
/// Deepest array nesting accepted in a reply.
pub const LH_MAX_REPLY_DEPTH: usize = 16;

const _: () = {
    assert!(LH_VALUE_NIL == proto::value::KIND_NIL);
    assert!(LH_VALUE_INT == proto::value::KIND_INT);
    assert!(LH_VALUE_BULK == proto::value::KIND_BULK);
    assert!(LH_VALUE_STATUS == proto::value::KIND_STATUS);
    assert!(LH_VALUE_ERROR == proto::value::KIND_ERROR);
    assert!(LH_VALUE_ARRAY == proto::value::KIND_ARRAY);
    assert!(LH_MAX_REPLY_VALUES == proto::value::MAX_VALUES);
    assert!(LH_MAX_REPLY_DATA == proto::value::MAX_DATA);
    assert!(LH_MAX_REPLY_DEPTH == proto::value::MAX_DEPTH);
    assert!(LH_CONNECTION_COMMANDS == Connection::Commands as u32);
    assert!(LH_CONNECTION_SUBSCRIBER == Connection::Subscriber as u32);
};

/// Options of the Redis protocol. Fill with `lh_redis_options_default`, then change fields.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct lh_redis_options {
    /// `sizeof(lh_redis_options)` as compiled by the caller.
    pub struct_size: u32,
    /// Always 0.
    pub _reserved: u32,
    /// How long a waiter told to stand by waits for "taken" before it tries (default 150 ms):
    /// the longest a frozen waiter at the head of the queue keeps the lock free.
    pub standby_delay_ms: u64,
    /// How long the fence and queue keys outlive the lease they serve (default 60000).
    pub key_keep_ms: u64,
    /// Queue entries older than this are dropped at a release (default 600000).
    pub queue_max_age_ms: u64,
    /// How long a queued waiter behind the head of the queue waits before it asks again on
    /// its own (default 10000): an idle waiter's cost is one script call per this interval.
    pub idle_recheck_ms: u64,
    /// Redis Cluster (default 0): non-zero sends wake-ups on one shard channel per name,
    /// `lh:{NAME}:wake`, with SPUBLISH (Redis 7+); the client then requests `SSUBSCRIBE` /
    /// `SUNSUBSCRIBE` of a name's channel on the subscriber connection while it has leases
    /// waiting on it, instead of one `SUBSCRIBE` of its own channel. Added after the fields
    /// above: a caller whose `struct_size` ends before it gets 0.
    pub sharded_wake: u32,
    /// Always 0.
    pub _reserved2: u32,
}

/// A borrowed byte string.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lh_bytes {
    /// First byte (NULL only when `len` is 0).
    pub ptr: *const u8,
    /// Length in bytes.
    pub len: usize,
}

/// One polled request: run `argv` verbatim on `connection` (`LH_CONNECTION_*`), then answer
/// `id` with `lh_reply` or `lh_request_failed`. `id == 0` means nothing is left. `argv` and
/// the bytes it points to borrow the handle until the next call on it: copy or send them
/// before calling in again.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lh_request {
    /// Request id (never reused), 0 when none.
    pub id: u64,
    /// `LH_CONNECTION_COMMANDS` or `LH_CONNECTION_SUBSCRIBER`.
    pub connection: u32,
    /// Number of arguments (command name included).
    pub argc: u32,
    /// The arguments.
    pub argv: *const lh_bytes,
}

/// One value of a flat reply (see `lh_reply`). No pointers: strings are `offset`/`len` into
/// the data buffer passed beside the list.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct lh_value {
    /// `LH_VALUE_*`.
    pub kind: u32,
    /// Always 0.
    pub _reserved: u32,
    /// The integer of `LH_VALUE_INT`.
    pub integer: i64,
    /// Start of a string value in the data buffer.
    pub offset: u64,
    /// Byte length of a string value, or element count of an array.
    pub len: u64,
}

/// What the Redis protocol saw, filled by `lh_redis_counters_get`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct lh_redis_counters {
    /// `sizeof(lh_redis_counters)` as compiled by the caller; set to the library's size.
    pub struct_size: u32,
    /// 1 while the subscription is in effect.
    pub subscribed: u32,
    /// Requests emitted.
    pub requests: u64,
    /// Script calls emitted (EVALSHA and EVAL).
    pub script_calls: u64,
    /// EVALSHAs re-sent as EVAL after NOSCRIPT.
    pub noscript_retries: u64,
    /// Error replies.
    pub error_replies: u64,
    /// Replies of a shape the request cannot have.
    pub garbage_replies: u64,
    /// Replies and failures for unknown or already answered ids.
    pub stale_replies: u64,
    /// Transport failures reported.
    pub transport_failures: u64,
    /// Retries answered without a round trip.
    pub local_refusals: u64,
    /// Wake-ups received.
    pub wakeups: u64,
    /// Standbys that tried after hearing nothing.
    pub standby_takeovers: u64,
    /// Messages and confirmations ignored.
    pub ignored_messages: u64,
    /// Times the subscription took effect.
    pub subscriptions: u64,
    /// Times the subscription was reported lost.
    pub subscriber_losses: u64,
}

/// The protocol attached to a handle and the argv array of the last polled request.
pub(crate) struct Attached {
    pub(crate) proto: RedisProtocol,
    argv: Vec<lh_bytes>,
}

/// Domain separation: the wake channel is public (PUBSUB CHANNELS), ownership tokens are
/// secret, so the channel never comes from the core's token stream.
fn wake_random(seed: &[u8]) -> Result<[u8; proto::scripts::WAKE_RANDOM_LEN], Failure> {
    let mut tagged = seed.to_vec();
    tagged.extend_from_slice(b"leasehold redis wake channel");
    let mut rng = crate::engine::rng::Rng::new(&tagged)?;
    Ok(*rng.token().as_bytes())
}

impl ClientState {
    /// The next output for `lh_poll_output`: with a backend only events come out (commands
    /// became requests).
    pub(crate) fn next_output(&mut self) -> Option<Output> {
        if let Some(b) = &mut self.sql {
            return b.proto.poll_event(&mut self.core).map(Output::Event);
        }
        if let Some(b) = &mut self.etcd {
            return b.proto.poll_event(&mut self.core).map(Output::Event);
        }
        match &mut self.backend {
            Some(b) => b.proto.poll_event(&mut self.core).map(Output::Event),
            None => self.core.poll_output(),
        }
    }

    pub(crate) fn next_deadline(&mut self) -> Option<u64> {
        if let Some(b) = &mut self.sql {
            return b.proto.poll_timeout(&mut self.core);
        }
        if let Some(b) = &mut self.etcd {
            return b.proto.poll_timeout(&mut self.core);
        }
        match &mut self.backend {
            Some(b) => b.proto.poll_timeout(&mut self.core),
            None => self.core.poll_timeout(),
        }
    }

    pub(crate) fn timeout(&mut self, now: u64) {
        if let Some(b) = &mut self.sql {
            return b.proto.handle_timeout(&mut self.core, now);
        }
        if let Some(b) = &mut self.etcd {
            return b.proto.handle_timeout(&mut self.core, now);
        }
        match &mut self.backend {
            Some(b) => b.proto.handle_timeout(&mut self.core, now),
            None => self.core.handle_timeout(now),
        }
    }

    pub(crate) fn reseed_backend(&mut self, seed: &[u8]) -> Result<(), Failure> {
        if let Some(b) = &mut self.backend {
            let random = wake_random(seed)?;
            let now = self.core.now();
            b.proto.set_wake_random(now, random);
        }
        Ok(())
    }

    fn with_backend(&mut self) -> Result<(&mut Attached, &mut Client), Failure> {
        match &mut self.backend {
            Some(b) => Ok((b, &mut self.core)),
            None => Err(Failure::new(
                LH_ERR_NO_BACKEND,
                "this handle has no backend (create it with lh_client_new_redis)",
            )),
        }
    }
}

/// `sizeof(lh_redis_options)` before `sharded_wake` was added: the smallest accepted.
const REDIS_OPTIONS_V1: usize = 40;

const NO_REDIS_OPTIONS: lh_redis_options = lh_redis_options {
    struct_size: 0,
    _reserved: 0,
    standby_delay_ms: 0,
    key_keep_ms: 0,
    queue_max_age_ms: 0,
    idle_recheck_ms: 0,
    sharded_wake: 0,
    _reserved2: 0,
};

fn options_from_c(o: &lh_redis_options) -> RedisOptions {
    RedisOptions {
        standby_delay_ms: o.standby_delay_ms,
        key_keep_ms: o.key_keep_ms,
        queue_max_age_ms: o.queue_max_age_ms,
        idle_recheck_ms: o.idle_recheck_ms,
        sharded_wake: o.sharded_wake != 0,
    }
}

/// Fills `*out` with the default Redis options (and `struct_size`). NULL is ignored.
///
/// # Safety
/// `out` is NULL or valid for writing one `lh_redis_options`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_redis_options_default(out: *mut lh_redis_options) {
    if out.is_null() {
        return;
    }
    let d = RedisOptions::default();
    let value = lh_redis_options {
        struct_size: size_of::<lh_redis_options>() as u32,
        _reserved: 0,
        standby_delay_ms: d.standby_delay_ms,
        key_keep_ms: d.key_keep_ms,
        queue_max_age_ms: d.queue_max_age_ms,
        idle_recheck_ms: d.idle_recheck_ms,
        sharded_wake: u32::from(d.sharded_wake),
        _reserved2: 0,
    };
    // SAFETY: non-NULL; valid per the caller's contract.
    unsafe { write_out(out, value) };
}

/// Creates a client with the Redis protocol attached (see the header's run loop). Arguments
/// and errors as for `lh_client_new`, plus `opts` (NULL for the defaults; bad values are
/// `LH_ERR_INVALID_CONFIG`). The first request is the SUBSCRIBE of the client's wake channel.
///
/// # Safety
/// As for `lh_client_new`; `opts` is NULL or points to a readable `lh_redis_options`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_client_new_redis(
    cfg: *const lh_config,
    opts: *const lh_redis_options,
    seed: *const u8,
    seed_len: usize,
    out: *mut *mut lh_client,
) -> lh_status {
    guard_static(|| {
        require_out(out, "out")?;
        // SAFETY: per the caller's contract.
        let cfg = unsafe { read_sized(cfg, "cfg")? };
        let options = if opts.is_null() {
            RedisOptions::default()
        } else {
            // SAFETY: per the caller's contract.
            let mut base = NO_REDIS_OPTIONS;
            // SAFETY: writes one valid struct into a local.
            unsafe { lh_redis_options_default(&raw mut base) };
            // SAFETY: per the caller's contract.
            options_from_c(&unsafe { read_growing(opts, "opts", REDIS_OPTIONS_V1, base)? })
        };
        // SAFETY: per the caller's contract.
        let seed = unsafe { seed_arg(seed, seed_len)? };
        let config = config_from_c(&cfg)?;
        let core = Client::new(config, seed)?;
        let proto = RedisProtocol::new(options, wake_random(seed)?)?;
        let mut state = ClientState::new(core);
        state.backend = Some(Box::new(Attached {
            proto,
            argv: Vec::new(),
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

const NO_REQUEST: lh_request = lh_request {
    id: 0,
    connection: 0,
    argc: 0,
    argv: std::ptr::null(),
};

/// Takes the next request into `*out` (`out->id == 0` when none is left; drain until then
/// after every input, like `lh_poll_output`). The argument bytes borrow the handle until the
/// next call on it.
///
/// # Safety
/// `c` is NULL or a live handle; `out` is valid for writing one `lh_request`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_poll_request(c: *mut lh_client, out: *mut lh_request) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            require_out(out, "out")?;
            let (b, core) = s.with_backend()?;
            let mut r = NO_REQUEST;
            b.argv.clear();
            if let Some(req) = b.proto.poll_request(core) {
                b.argv.extend(req.args.iter().map(|a| lh_bytes {
                    ptr: out_ptr(a),
                    len: a.len(),
                }));
                r = lh_request {
                    id: req.id,
                    connection: req.connection as u32,
                    argc: u32::try_from(b.argv.len()).unwrap_or(u32::MAX),
                    argv: out_ptr(&b.argv),
                };
            }
            write_out(out, r);
            Ok(())
        })
    }
}

/// Hands back the reply to request `id`: `nvalues` values in pre-order (an array is followed
/// by its elements) and the `data_len` bytes their strings point into. Read during the call,
/// never retained. Unknown and already answered ids are counted and ignored (`LH_OK`). A
/// malformed or oversized list is `LH_ERR_INVALID_REPLY` and changes nothing: then report the
/// request with `lh_request_failed`.
///
/// # Safety
/// `c` is NULL or a live handle; `values` points to `nvalues` readable `lh_value`s and `data`
/// to `data_len` readable bytes (NULL allowed when the count is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_reply(
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
            let (flat, data) = flat_values_arg(values, nvalues, data, data_len, "reply")?;
            let reply = proto::decode(&flat, data)
                .map_err(|e| Failure::new(LH_ERR_INVALID_REPLY, format!("invalid reply: {e}")))?;
            let (b, core) = s.with_backend()?;
            b.proto.handle_reply(core, now, id, &reply);
            Ok(())
        })
    }
}

/// Request `id` failed in transport (connection lost, timeout, or a reply `lh_reply`
/// refused). Unknown ids are counted and ignored.
///
/// # Safety
/// `c` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_request_failed(c: *mut lh_client, now: u64, id: u64) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            let (b, core) = s.with_backend()?;
            b.proto.handle_request_failed(core, now, id);
            Ok(())
        })
    }
}

/// Delivers one pub/sub message from the subscriber connection (every one: the protocol
/// ignores what is not its own). Channel and payload are at most `LH_MAX_REPLY_DATA` bytes.
///
/// # Safety
/// `c` is NULL or a live handle; `channel` and `payload` point to their lengths in readable
/// bytes (`payload` may be NULL when empty).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_pubsub_message(
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
                LH_MAX_REPLY_DATA,
                "channel",
                LH_ERR_INVALID_REPLY,
            )?;
            let payload = optional_bytes_arg(
                payload,
                payload_len,
                LH_MAX_REPLY_DATA,
                "payload",
                LH_ERR_INVALID_REPLY,
            )?;
            let (b, core) = s.with_backend()?;
            b.proto.handle_message(core, now, channel, payload);
            Ok(())
        })
    }
}

/// Reports a subscription change on the subscriber connection: `subscribed` 1 when a
/// SUBSCRIBE of `channel` took effect (its confirmation arrived), 0 when it ended (an
/// UNSUBSCRIBE confirmation, or the connection was lost: report every subscribed channel).
/// Other values are `LH_ERR_INVALID_ENUM`.
///
/// # Safety
/// `c` is NULL or a live handle; `channel` points to `channel_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_subscription(
    c: *mut lh_client,
    now: u64,
    channel: *const u8,
    channel_len: usize,
    subscribed: u32,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_mut(c, |s| {
            let channel = bytes_arg(
                channel,
                channel_len,
                LH_MAX_REPLY_DATA,
                "channel",
                LH_ERR_INVALID_REPLY,
            )?;
            let on = match subscribed {
                0 => false,
                1 => true,
                other => return Err(Failure::invalid_enum("subscribed", other)),
            };
            let (b, core) = s.with_backend()?;
            b.proto.handle_subscription(core, now, channel, on);
            Ok(())
        })
    }
}

/// Fills `*out` with the Redis protocol's counters (`out->struct_size` set by the caller).
///
/// # Safety
/// `c` is NULL or a live handle; `out` is valid for reading and writing an `lh_redis_counters`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_redis_counters_get(
    c: *const lh_client,
    out: *mut lh_redis_counters,
) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_ref(c, |s| {
            super::boundary::check_sized_out(out, "out")?;
            let Some(b) = &s.backend else {
                return Err(Failure::new(
                    LH_ERR_NO_BACKEND,
                    "this handle has no backend",
                ));
            };
            let k = b.proto.counters();
            write_out(
                out,
                lh_redis_counters {
                    struct_size: size_of::<lh_redis_counters>() as u32,
                    subscribed: u32::from(b.proto.is_subscribed()),
                    requests: k.requests,
                    script_calls: k.script_calls,
                    noscript_retries: k.noscript_retries,
                    error_replies: k.error_replies,
                    garbage_replies: k.garbage_replies,
                    stale_replies: k.stale_replies,
                    transport_failures: k.transport_failures,
                    local_refusals: k.local_refusals,
                    wakeups: k.wakeups,
                    standby_takeovers: k.standby_takeovers,
                    ignored_messages: k.ignored_messages,
                    subscriptions: k.subscriptions,
                    subscriber_losses: k.subscriber_losses,
                },
            );
            Ok(())
        })
    }
}

/// Reads a flat value list and its data buffer (`lh_reply`, `lh_sql_result`): NULL and the
/// limits checked, then one copy into the protocols' form.
///
/// # Safety
/// `values` points to `nvalues` readable `lh_value`s and `data` to `data_len` readable bytes
/// (NULL allowed when the count is 0).
pub(crate) unsafe fn flat_values_arg<'a>(
    values: *const lh_value,
    nvalues: usize,
    data: *const u8,
    data_len: usize,
    what: &str,
) -> Result<(Vec<FlatValue>, &'a [u8]), Failure> {
    if values.is_null() {
        return Err(Failure::null("values"));
    }
    if nvalues > LH_MAX_REPLY_VALUES {
        return Err(Failure::new(
            LH_ERR_INVALID_REPLY,
            format!("{what} has {nvalues} values, the limit is {LH_MAX_REPLY_VALUES}"),
        ));
    }
    // SAFETY: non-NULL, count bounded, readable per the caller's contract.
    let values = unsafe { std::slice::from_raw_parts(values, nvalues) };
    // SAFETY: per the caller's contract.
    let data = unsafe {
        optional_bytes_arg(
            data,
            data_len,
            LH_MAX_REPLY_DATA,
            "data",
            LH_ERR_INVALID_REPLY,
        )
    }?;
    let flat = values
        .iter()
        .map(|v| FlatValue {
            kind: v.kind,
            integer: v.integer,
            offset: v.offset,
            len: v.len,
        })
        .collect();
    Ok((flat, data))
}
