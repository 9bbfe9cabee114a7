//! Target `redis_protocol`: the Redis protocol layer (`leasehold::backend::redis`) fed hostile
//! replies and messages — wrong types, huge and negative integers and lengths, deep nesting,
//! flat lists that do not decode, replies to unknown and answered requests, duplicated and
//! foreign pub/sub messages, subscription flapping — beside ordinary traffic.
//!
//! Oracle: no panic; every `Acquired` carries a fence that some grant-shaped reply
//! (`[1, fence, ttl]`) actually delivered (garbage never becomes a grant); at most one
//! terminal event per lease; no event for a lease that never existed; requests, events and
//! the protocol's pending table stay bounded.
//!
//! The same kind of traffic also reaches a second handle through the C ABI's one seam
//! (`lh_client_new` with `LH_BACKEND_REDIS`, `lh_io_reply` with arbitrary `lh_value` lists
//! and lengths, NULLs, `lh_io_failed`, `lh_io_message`, `lh_io_connection` with any event):
//! every status is one of the documented codes, never a panic, `lh_io_reply` refuses a list
//! exactly when the core's decoder does, and every polled request is a command on one of the
//! two connections.

use std::collections::{HashMap, HashSet};

use arbitrary::Arbitrary;
use leasehold::backend::redis::{FlatValue, RedisOptions, RedisProtocol, Value, decode};
use leasehold::ffi::*;
use leasehold::{AcquireOptions, Client, Config, Event, LeaseId};

use crate::{Seq, SmallBytes};

const MS: u64 = 1_000_000;
const NAMES: [&str; 3] = ["a", "jobs", "n x"];

/// One fuzz input.
#[derive(Debug, Arbitrary)]
pub struct Input {
    /// The operations, in order.
    pub ops: Seq<Op>,
}

/// Picks a request: one the protocol emitted (by index, wrapping) or any id at all.
#[derive(Debug, Arbitrary)]
pub enum Pick {
    /// The n-th outstanding request.
    Emitted(u8),
    /// A raw id (unknown, zero, huge).
    Raw(u64),
}

/// A reply built from parts.
#[derive(Debug, Arbitrary)]
pub enum Reply {
    /// `[1, fence, ttl]`.
    Grant(i64, i64),
    /// `[0, left]`.
    Held(i64),
    /// `[0, left, rank]`.
    Ranked(i64, i64),
    /// An integer.
    Int(i64),
    /// Nil.
    Nil,
    /// An error reply.
    Error(SmallBytes),
    /// `NOSCRIPT ...`.
    NoScript,
    /// A status reply.
    Status(SmallBytes),
    /// A bulk string.
    Bulk(SmallBytes),
    /// An array nested `depth` times around a grant.
    Nested(u8),
    /// An array of small integers.
    Ints(Vec<i64>),
    /// A subscribe confirmation of the protocol's own channel.
    Confirm,
}

/// A wake-channel payload.
#[derive(Debug, Arbitrary)]
pub enum Payload {
    /// `KIND ' ' TOKEN ' ' NAME` (`t NAME` without a token) with one of the known names and
    /// the token of a lease seen in an ACQUIRE (or, past those, a token nobody has).
    Known(u8, u8, u8),
    /// Any bytes.
    Raw(SmallBytes),
}

/// One operation.
#[derive(Debug, Arbitrary)]
pub enum Op {
    /// Acquire a name with a wait budget (in 100 ms steps).
    Acquire(u8, u8),
    /// Release the n-th lease handed out.
    Release(u8),
    /// Time passes (ms).
    Advance(u16),
    /// A structured reply.
    Reply(Pick, Reply),
    /// A flat reply as a host would pass it (may not decode).
    Flat(Pick, Vec<(u8, i64, u16, u16)>, SmallBytes),
    /// A transport failure.
    Fail(Pick),
    /// A pub/sub message on the own channel or another one.
    Message(bool, Payload),
    /// A subscription change.
    Subscription(bool, bool),
    /// A call on the C ABI handle.
    Abi(AbiOp),
}

/// A call through the C ABI.
#[derive(Debug, Arbitrary)]
pub enum AbiOp {
    /// `lh_acquire` of a known name.
    Acquire(u8),
    /// `lh_io_poll` and `lh_poll_event` until empty.
    Drain,
    /// `lh_io_reply` with raw values (kind, integer, offset, len), a value count that may lie
    /// (NULL values when `null`), and data.
    Reply(Pick, Vec<(u32, i64, u64, u64)>, u16, bool, SmallBytes),
    /// `lh_io_failed` (transport).
    Fail(Pick),
    /// `lh_io_message` (NULL channel when the flag is set).
    Message(bool, SmallBytes, SmallBytes),
    /// `lh_io_connection` of the subscriber: 0 unsubscribed, 1 subscribed, any other value
    /// as the raw event.
    Subscription(bool, u32),
    /// `lh_timeout`.
    Timeout(u16),
}

struct World {
    core: Client,
    proto: RedisProtocol,
    now: u64,
    outstanding: Vec<u64>,
    leases: Vec<LeaseId>,
    granted_fences: HashSet<u64>,
    terminal: HashMap<LeaseId, u32>,
    /// Tokens the ACQUIREs carried (bounded), for wake-channel messages that name them.
    tokens: Vec<Vec<u8>>,
}

impl World {
    fn drain(&mut self) {
        let mut n = 0;
        while let Some(r) = self.proto.poll_request(&mut self.core) {
            self.outstanding.push(r.id);
            let acquire = r.args.len() == 12 && r.args[2].as_ref() == b"3";
            if acquire && self.tokens.len() < 64 && !self.tokens.iter().any(|t| *t == *r.args[6]) {
                self.tokens.push(r.args[6].to_vec());
            }
            n += 1;
            assert!(n < 1_000, "unbounded requests");
        }
        if self.outstanding.len() > 4_096 {
            self.outstanding.drain(..2_048);
        }
        let mut n = 0;
        while let Some(e) = self.proto.poll_event(&mut self.core) {
            n += 1;
            assert!(n < 1_000, "unbounded events");
            let lease = match e {
                Event::Acquired {
                    lease,
                    fencing_token,
                    ..
                } => {
                    assert!(
                        self.granted_fences.contains(&fencing_token),
                        "Acquired with fence {fencing_token} that no grant reply carried"
                    );
                    lease
                }
                Event::AcquireFailed { lease, .. }
                | Event::Lost { lease, .. }
                | Event::Released { lease } => {
                    let k = self.terminal.entry(lease).or_default();
                    *k += 1;
                    assert_eq!(*k, 1, "two terminal events for {lease:?}");
                    lease
                }
                // This target never renews by hand nor asks for release outcomes.
                Event::Renewed { lease, .. } | Event::ReleaseOutcome { lease, .. } => {
                    panic!("{lease:?}: an event nobody asked for")
                }
            };
            assert!(
                self.leases.contains(&lease),
                "event for unknown lease {lease:?}"
            );
        }
    }

    fn pick(&self, p: &Pick) -> u64 {
        match *p {
            Pick::Emitted(i) if !self.outstanding.is_empty() => {
                let len = self.outstanding.len();
                self.outstanding[len - 1 - usize::from(i) % len]
            }
            Pick::Emitted(i) => u64::from(i),
            Pick::Raw(id) => id,
        }
    }
}

fn build<'a>(r: &'a Reply, wake: &'a [u8], fences: &mut HashSet<u64>) -> Value<'a> {
    let grant = |f: i64, t: i64, fences: &mut HashSet<u64>| {
        if f > 0 {
            fences.insert(f as u64);
        }
        Value::Array(vec![Value::Int(1), Value::Int(f), Value::Int(t)])
    };
    match r {
        Reply::Grant(f, t) => grant(*f, *t, fences),
        Reply::Held(l) => Value::Array(vec![Value::Int(0), Value::Int(*l)]),
        Reply::Ranked(l, r) => Value::Array(vec![Value::Int(0), Value::Int(*l), Value::Int(*r)]),
        Reply::Int(i) => Value::Int(*i),
        Reply::Nil => Value::Nil,
        Reply::Error(e) => Value::Error(&e.0),
        Reply::NoScript => Value::Error(b"NOSCRIPT No matching script"),
        Reply::Status(s) => Value::Status(&s.0),
        Reply::Bulk(b) => Value::Bulk(&b.0),
        Reply::Nested(d) => {
            // Depth 0 is a plain grant; any nesting around it must never be one.
            let depth = *d % 40;
            let mut v = if depth == 0 {
                grant(5, 3_000, fences)
            } else {
                grant(5, 3_000, &mut HashSet::new())
            };
            for _ in 0..depth {
                v = Value::Array(vec![v]);
            }
            v
        }
        Reply::Ints(xs) => Value::Array(xs.iter().take(64).map(|&i| Value::Int(i)).collect()),
        Reply::Confirm => Value::Array(vec![
            Value::Bulk(b"subscribe"),
            Value::Bulk(wake),
            Value::Int(1),
        ]),
    }
}

/// Runs one input against a fresh core and protocol; feature bits of what it reached (for
/// corpus generation): grants, local refusals, NOSCRIPT retries, standby takeovers, garbage
/// and error replies, subscriptions taking effect.
pub fn run(input: &Input) -> u64 {
    let opts = RedisOptions {
        standby_delay_ms: 150,
        key_keep_ms: 1_000,
        queue_max_age_ms: 10_000,
        idle_recheck_ms: 1_000,
        sharded_wake: false,
    };
    let mut w = World {
        core: Client::new(Config::default(), &[0x42; 32]).expect("valid config"),
        proto: RedisProtocol::new(opts, [7; 16]).expect("valid options"),
        now: MS,
        outstanding: Vec::new(),
        leases: Vec::new(),
        granted_fences: HashSet::new(),
        terminal: HashMap::new(),
        tokens: Vec::new(),
    };
    let wake = w.proto.wake_channel().to_vec();
    let mut abi = Abi::new();
    w.drain();
    for op in &input.ops.0 {
        match op {
            Op::Acquire(n, wait) => {
                let name = NAMES[usize::from(*n) % NAMES.len()];
                let mut o = AcquireOptions::new(3_000);
                o.wait_ns = u64::from(*wait) * 100 * MS;
                if let Ok(l) = w.core.acquire(w.now, name, o)
                    && !w.leases.contains(&l)
                {
                    w.leases.push(l);
                }
            }
            Op::Release(i) => {
                if !w.leases.is_empty() {
                    let l = w.leases[usize::from(*i) % w.leases.len()];
                    let _ = w.core.release(w.now, l);
                }
            }
            Op::Advance(ms) => {
                w.now += u64::from(*ms) * MS;
                w.proto.handle_timeout(&mut w.core, w.now);
            }
            Op::Reply(p, r) => {
                let id = w.pick(p);
                let v = build(r, &wake, &mut w.granted_fences);
                w.proto.handle_reply(&mut w.core, w.now, id, &v);
            }
            Op::Flat(p, values, data) => {
                let id = w.pick(p);
                let flat: Vec<FlatValue> = values
                    .iter()
                    .take(256)
                    .map(|&(kind, integer, offset, len)| FlatValue {
                        kind: u32::from(kind % 8),
                        integer,
                        offset: u64::from(offset),
                        len: u64::from(len),
                    })
                    .collect();
                if let Ok(v) = decode(&flat, &data.0) {
                    note_grants(&v, &mut w.granted_fences);
                    w.proto.handle_reply(&mut w.core, w.now, id, &v);
                }
            }
            Op::Fail(p) => {
                let id = w.pick(p);
                w.proto.handle_request_failed(&mut w.core, w.now, id);
            }
            Op::Message(own, payload) => {
                let bytes = match payload {
                    Payload::Known(k, n, t) => {
                        let kind: &[u8] =
                            [&b"w"[..], b"s1", b"s2", b"t", b"x", b"s"][usize::from(*k) % 6];
                        let mut b = kind.to_vec();
                        b.push(b' ');
                        if kind != b"t" {
                            match w.tokens.get(usize::from(*t)) {
                                Some(token) => b.extend_from_slice(token),
                                None => b.extend_from_slice(format!("{t:032x}").as_bytes()),
                            }
                            b.push(b' ');
                        }
                        b.extend_from_slice(NAMES[usize::from(*n) % NAMES.len()].as_bytes());
                        b
                    }
                    Payload::Raw(r) => r.0.clone(),
                };
                let ch: &[u8] = if *own { &wake } else { b"lh:wake:other" };
                w.proto.handle_message(&mut w.core, w.now, ch, &bytes);
            }
            Op::Subscription(own, on) => {
                let ch: &[u8] = if *own { &wake } else { b"elsewhere" };
                w.proto.handle_subscription(&mut w.core, w.now, ch, *on);
            }
            Op::Abi(op) => abi.run(op, w.now),
        }
        w.drain();
    }
    let k = w.proto.counters();
    [
        !w.granted_fences.is_empty() && w.core.counters().grants > 0,
        k.local_refusals > 0,
        k.noscript_retries > 0,
        k.standby_takeovers > 0,
        k.garbage_replies > 0,
        k.error_replies > 0,
        k.subscriptions > 0,
        k.wakeups > 0,
    ]
    .iter()
    .enumerate()
    .fold(0, |acc, (i, &on)| acc | (u64::from(on) << i))
}

/// A decoded flat reply may be grant-shaped: its fence then counts as delivered.
fn note_grants(v: &Value<'_>, fences: &mut HashSet<u64>) {
    if let Value::Array(items) = v
        && let [Value::Int(1), Value::Int(f), Value::Int(_)] = items.as_slice()
        && *f > 0
    {
        fences.insert(*f as u64);
    }
}

/// A handle with the Redis protocol attached, driven through the C ABI.
struct Abi {
    h: *mut lh_client,
    ids: Vec<u64>,
    wake: Vec<u8>,
}

impl Drop for Abi {
    fn drop(&mut self) {
        // SAFETY: the handle came from lh_client_new and is not used after this.
        unsafe { lh_client_free(self.h) };
    }
}

fn expect(what: &str, st: u32, allowed: &[u32]) {
    assert!(
        st == LH_OK || allowed.contains(&st),
        "{what}: unexpected status {st}"
    );
}

/// A borrowed buffer of the library (NULL when empty).
fn borrowed<'a, T>(p: *const T, len: usize) -> &'a [T] {
    if len == 0 {
        assert!(p.is_null(), "an empty borrowed buffer is NULL");
        return &[];
    }
    // SAFETY: the library keeps `len` values readable until the next call on the handle.
    unsafe { std::slice::from_raw_parts(p, len) }
}

impl Abi {
    fn new() -> Abi {
        let mut cfg = std::mem::MaybeUninit::<lh_config>::uninit();
        let mut backend = std::mem::MaybeUninit::<lh_backend_options>::uninit();
        let mut h = std::ptr::null_mut();
        let seed = [0x24u8; 32];
        // SAFETY: valid out-pointers and a live seed buffer.
        let st = unsafe {
            lh_config_default(cfg.as_mut_ptr());
            assert_eq!(
                lh_backend_options_default(LH_BACKEND_REDIS, backend.as_mut_ptr()),
                LH_OK
            );
            lh_client_new(
                cfg.as_ptr(),
                backend.as_ptr(),
                seed.as_ptr(),
                seed.len(),
                &mut h,
            )
        };
        assert_eq!(st, LH_OK);
        let mut a = Abi {
            h,
            ids: Vec::new(),
            wake: Vec::new(),
        };
        a.drain();
        a
    }

    fn drain(&mut self) {
        for _ in 0..1_000 {
            let mut r = std::mem::MaybeUninit::<lh_io_request>::uninit();
            // SAFETY: valid out-pointer; argv is read before the next call on the handle.
            let r = unsafe {
                assert_eq!(lh_io_poll(self.h, r.as_mut_ptr()), LH_OK);
                r.assume_init()
            };
            if r.kind == LH_IO_NONE {
                assert_eq!(r.id, 0);
                break;
            }
            assert_eq!(r.kind, LH_IO_COMMAND, "a Redis handle runs commands only");
            assert!(
                matches!(r.connection, LH_CONNECTION_COMMANDS | LH_CONNECTION_NOTIFY),
                "connection {}",
                r.connection
            );
            assert!(r.statements.is_null() && r.data.is_null() && r.method.is_null());
            let argv = borrowed(r.argv, r.argc as usize);
            assert!(!argv.is_empty(), "a command has a word");
            let first = borrowed(argv[0].ptr, argv[0].len);
            if first == b"SUBSCRIBE" {
                self.wake = borrowed(argv[1].ptr, argv[1].len).to_vec();
            }
            self.ids.push(r.id);
        }
        if self.ids.len() > 4_096 {
            self.ids.drain(..2_048);
        }
        for _ in 0..1_000 {
            let mut e = lh_event::default();
            // SAFETY: valid out-pointer.
            unsafe { assert_eq!(lh_poll_event(self.h, &mut e), LH_OK) };
            if e.kind == LH_EVENT_NONE {
                break;
            }
            assert!(
                matches!(
                    e.kind,
                    LH_EVENT_ACQUIRED | LH_EVENT_ACQUIRE_FAILED | LH_EVENT_LOST | LH_EVENT_RELEASED
                ),
                "an event nobody asked for on a Redis handle: {}",
                e.kind
            );
        }
    }

    fn pick(&self, p: &Pick) -> u64 {
        match *p {
            Pick::Emitted(i) if !self.ids.is_empty() => self.ids[usize::from(i) % self.ids.len()],
            Pick::Emitted(i) => u64::from(i),
            Pick::Raw(id) => id,
        }
    }

    fn run(&mut self, op: &AbiOp, now: u64) {
        match op {
            AbiOp::Acquire(n) => {
                let name = NAMES[usize::from(*n) % NAMES.len()].as_bytes();
                let mut o = std::mem::MaybeUninit::<lh_acquire_options>::uninit();
                let mut lease = 0;
                // SAFETY: valid pointers to locals.
                let st = unsafe {
                    lh_acquire_options_default(o.as_mut_ptr());
                    let mut o = o.assume_init();
                    o.ttl_ms = 3_000;
                    o.wait_ns = 1_000 * MS;
                    lh_acquire(self.h, now, name.as_ptr(), name.len(), &o, &mut lease)
                };
                expect("lh_acquire", st, &[LH_ERR_TOO_MANY_LEASES]);
            }
            AbiOp::Drain => {}
            AbiOp::Reply(p, raw, claimed, null, data) => {
                let id = self.pick(p);
                let values: Vec<lh_value> = raw
                    .iter()
                    .take(64)
                    .map(|&(kind, integer, offset, len)| lh_value {
                        kind: kind % 9,
                        _reserved: 0,
                        integer,
                        offset: offset % 96,
                        len: if kind & 0x100 != 0 { len } else { len % 8 },
                    })
                    .collect();
                // A count above the list is only passed with NULL values (never read).
                let count = if *null {
                    usize::from(*claimed)
                } else {
                    values.len()
                };
                let ptr = if *null {
                    std::ptr::null()
                } else {
                    values.as_ptr()
                };
                // SAFETY: `count` values are readable at `ptr` (or it is NULL); data likewise.
                let st = unsafe {
                    lh_io_reply(self.h, now, id, ptr, count, data.0.as_ptr(), data.0.len())
                };
                if *null {
                    assert_eq!(st, LH_ERR_NULL_ARGUMENT, "lh_io_reply with NULL values");
                } else {
                    let flat: Vec<FlatValue> = values
                        .iter()
                        .map(|v| FlatValue {
                            kind: v.kind,
                            integer: v.integer,
                            offset: v.offset,
                            len: v.len,
                        })
                        .collect();
                    let decodes = decode(&flat, &data.0).is_ok();
                    let want = if decodes { LH_OK } else { LH_ERR_INVALID_REPLY };
                    assert_eq!(st, want, "lh_io_reply vs decode: {values:?}");
                }
            }
            AbiOp::Fail(p) => {
                let id = self.pick(p);
                // SAFETY: live handle; no message.
                expect(
                    "lh_io_failed",
                    unsafe {
                        lh_io_failed(self.h, now, id, LH_FAILURE_TRANSPORT, std::ptr::null(), 0)
                    },
                    &[],
                );
            }
            AbiOp::Message(null, ch, payload) => {
                let (cp, cl) = if *null {
                    (std::ptr::null(), ch.0.len())
                } else if ch.0.first() == Some(&b'!') {
                    (self.wake.as_ptr(), self.wake.len())
                } else {
                    (ch.0.as_ptr(), ch.0.len())
                };
                // SAFETY: `cl` bytes at `cp` (or NULL), payload likewise.
                let st = unsafe {
                    lh_io_message(self.h, now, cp, cl, payload.0.as_ptr(), payload.0.len())
                };
                if *null {
                    assert_eq!(st, LH_ERR_NULL_ARGUMENT);
                } else {
                    expect("lh_io_message", st, &[]);
                }
            }
            AbiOp::Subscription(own, flag) => {
                let ch: &[u8] = if *own { &self.wake } else { b"elsewhere" };
                let event = match *flag {
                    0 => LH_CONNECTION_UNSUBSCRIBED,
                    1 => LH_CONNECTION_SUBSCRIBED,
                    raw => raw,
                };
                // SAFETY: a live buffer.
                let st = unsafe {
                    lh_io_connection(
                        self.h,
                        now,
                        LH_CONNECTION_NOTIFY,
                        event,
                        ch.as_ptr(),
                        ch.len(),
                    )
                };
                if (LH_CONNECTION_REOPENED..=LH_CONNECTION_UNSUBSCRIBED).contains(&event) {
                    expect("lh_io_connection", st, &[]);
                } else {
                    assert_eq!(st, LH_ERR_INVALID_ENUM);
                }
            }
            AbiOp::Timeout(ms) => {
                // SAFETY: live handle.
                let st = unsafe { lh_timeout(self.h, now + u64::from(*ms) * MS) };
                expect("lh_timeout", st, &[]);
            }
        }
        self.drain();
    }
}
