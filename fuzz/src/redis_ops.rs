//! Target `redis_protocol`: the Redis protocol layer (`leasehold::backend::redis`) fed hostile
//! replies and messages — wrong types, huge and negative integers and lengths, deep nesting,
//! flat lists that do not decode, replies to unknown and answered requests, duplicated and
//! foreign pub/sub messages, subscription flapping — beside ordinary traffic.
//!
//! Oracle: no panic; every `Acquired` carries a fence that some grant-shaped reply
//! (`[1, fence, ttl]`) actually delivered (garbage never becomes a grant); at most one
//! terminal event per lease; no event for a lease that never existed; requests, events and
//! the protocol's pending table stay bounded.

use std::collections::{HashMap, HashSet};

use arbitrary::Arbitrary;
use leasehold::backend::redis::{FlatValue, RedisOptions, RedisProtocol, Value, decode};
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
    /// `KIND ' ' NAME` with one of the known names.
    Known(u8, u8),
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
}

struct World {
    core: Client,
    proto: RedisProtocol,
    now: u64,
    outstanding: Vec<u64>,
    leases: Vec<LeaseId>,
    granted_fences: HashSet<u64>,
    terminal: HashMap<LeaseId, u32>,
}

impl World {
    fn drain(&mut self) {
        let mut n = 0;
        while let Some(r) = self.proto.poll_request(&mut self.core) {
            self.outstanding.push(r.id);
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
    };
    let mut w = World {
        core: Client::new(Config::default(), &[0x42; 32]).expect("valid config"),
        proto: RedisProtocol::new(opts, [7; 16]).expect("valid options"),
        now: MS,
        outstanding: Vec::new(),
        leases: Vec::new(),
        granted_fences: HashSet::new(),
        terminal: HashMap::new(),
    };
    let wake = w.proto.wake_channel().to_vec();
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
                    Payload::Known(k, n) => {
                        let kind: &[u8] =
                            [&b"w"[..], b"s1", b"s2", b"t", b"x", b"s"][usize::from(*k) % 6];
                        let mut b = kind.to_vec();
                        b.push(b' ');
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
