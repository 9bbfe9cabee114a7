//! One test per behaviour of the Redis protocol layer (`leasehold::backend::redis`): feed
//! replies, messages and subscription changes, assert the requests it emits and the events
//! the engine produces. Real-server behaviour is in `tests/redis_server.rs`.

use leasehold::backend::redis::{Connection, RedisOptions, RedisProtocol, Script, Value};
use leasehold::{AcquireFailReason, AcquireOptions, Client, Config, Event, LeaseId};

const MS: u64 = 1_000_000;
const WAKE: &[u8] = b"lh:wake:07070707070707070707070707070707";

#[derive(Debug, Clone, PartialEq)]
struct Req {
    id: u64,
    conn: Connection,
    args: Vec<Vec<u8>>,
}

impl Req {
    fn cmd(&self) -> &[u8] {
        &self.args[0]
    }
    fn is_script(&self, s: Script) -> bool {
        self.args[0] == b"EVALSHA" && self.args[1] == s.sha1_hex()
    }
}

struct H {
    core: Client,
    proto: RedisProtocol,
    now: u64,
}

impl H {
    /// A core and protocol whose subscription is already confirmed.
    fn new() -> Self {
        let mut h = Self::unsubscribed();
        let sub = h.reqs();
        assert_eq!(sub.len(), 1);
        h.subscribed();
        h
    }

    fn unsubscribed() -> Self {
        let core = Client::new(Config::default(), &[9; 32]).unwrap();
        let proto = RedisProtocol::new(RedisOptions::default(), [7; 16]).unwrap();
        H {
            core,
            proto,
            now: MS,
        }
    }

    fn subscribed(&mut self) {
        self.proto
            .handle_subscription(&mut self.core, self.now, WAKE, true);
    }

    fn reqs(&mut self) -> Vec<Req> {
        let mut v = Vec::new();
        while let Some(r) = self.proto.poll_request(&mut self.core) {
            v.push(Req {
                id: r.id,
                conn: r.connection,
                args: r.args.iter().map(|a| a.to_vec()).collect(),
            });
        }
        v
    }

    fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.proto.poll_event(&mut self.core)).collect()
    }

    fn acquire(&mut self, name: &str, wait_ms: u64) -> LeaseId {
        let mut o = AcquireOptions::new(3_000);
        o.wait_ns = wait_ms * MS;
        self.core.acquire(self.now, name, o).unwrap()
    }

    fn reply(&mut self, id: u64, v: Value<'_>) {
        self.proto.handle_reply(&mut self.core, self.now, id, &v);
    }

    fn msg(&mut self, payload: &[u8]) {
        self.proto
            .handle_message(&mut self.core, self.now, WAKE, payload);
    }

    fn advance(&mut self, ms: u64) {
        self.now += ms * MS;
        self.proto.handle_timeout(&mut self.core, self.now);
    }

    fn only_acquire(&mut self) -> Req {
        let r = self.reqs();
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0].is_script(Script::Acquire), "{r:?}");
        r[0].clone()
    }
}

fn granted(fence: i64) -> Value<'static> {
    Value::Array(vec![Value::Int(1), Value::Int(fence), Value::Int(3_000)])
}

fn held(left: i64) -> Value<'static> {
    Value::Array(vec![Value::Int(0), Value::Int(left)])
}

/// A wake-channel payload naming a queue entry's token: `w TOKEN NAME`, `s1 TOKEN NAME`.
fn notice(kind: &str, token: &[u8], name: &str) -> Vec<u8> {
    let mut m = format!("{kind} ").into_bytes();
    m.extend_from_slice(token);
    m.push(b' ');
    m.extend_from_slice(name.as_bytes());
    m
}

fn acquired(ev: &[Event]) -> Option<u64> {
    ev.iter().find_map(|e| match e {
        Event::Acquired { fencing_token, .. } => Some(*fencing_token),
        _ => None,
    })
}

#[test]
fn the_first_request_subscribes_the_wake_channel() {
    let mut h = H::unsubscribed();
    let r = h.reqs();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].conn, Connection::Subscriber);
    assert_eq!(r[0].args, vec![b"SUBSCRIBE".to_vec(), WAKE.to_vec()]);
    assert_eq!(h.proto.wake_channel(), WAKE);
    assert!(!h.proto.is_subscribed());
}

#[test]
fn acquire_is_one_evalsha_with_hash_tagged_keys_and_a_queue_entry() {
    let mut h = H::new();
    h.acquire("jobs", 0);
    let r = h.only_acquire();
    assert_eq!(r.conn, Connection::Commands);
    assert_eq!(r.args[2], b"3");
    assert_eq!(r.args[3], b"lh:{jobs}");
    assert_eq!(r.args[4], b"lh:{jobs}:fence");
    assert_eq!(r.args[5], b"lh:{jobs}:queue");
    let token = r.args[6].clone();
    assert_eq!(token.len(), 32);
    assert_eq!(r.args[7], b"3000");
    let mut entry = WAKE.to_vec();
    entry.push(b'#');
    entry.extend_from_slice(&token);
    assert_eq!(r.args[8], entry);
    assert_eq!(r.args[9], b"60000", "key_keep_ms");
    assert_eq!(r.args[10], b"jobs");
    assert_eq!(
        r.args[11], b"0",
        "a first attempt cannot have queued the lease"
    );
    assert_eq!(r.args.len(), 12);
}

#[test]
fn a_grant_reply_becomes_acquired_with_its_fence() {
    let mut h = H::new();
    h.acquire("jobs", 0);
    let r = h.only_acquire();
    h.reply(r.id, granted(1_700_000_000_000_000));
    assert_eq!(acquired(&h.events()), Some(1_700_000_000_000_000));
}

#[test]
fn renew_and_release_send_their_scripts_and_map_flags() {
    let mut h = H::new();
    let lease = h.acquire("jobs", 0);
    let r = h.only_acquire();
    h.reply(r.id, granted(5));
    h.events();
    let deadline = h.proto.poll_timeout(&mut h.core).unwrap();
    h.now = deadline;
    h.proto.handle_timeout(&mut h.core, h.now);
    let r = h.reqs();
    assert!(r[0].is_script(Script::Renew), "{r:?}");
    assert_eq!(r[0].args[2..4], [b"1".to_vec(), b"lh:{jobs}".to_vec()]);
    h.reply(r[0].id, Value::Int(1));
    assert!(h.core.is_held(lease, h.now).unwrap());
    h.core.release(h.now, lease).unwrap();
    let r = h.reqs();
    assert!(r[0].is_script(Script::Release), "{r:?}");
    assert_eq!(
        r[0].args[2..5],
        [
            b"2".to_vec(),
            b"lh:{jobs}".to_vec(),
            b"lh:{jobs}:queue".to_vec()
        ]
    );
    assert_eq!(r[0].args[6], b"jobs");
    h.reply(r[0].id, Value::Int(0));
    assert_eq!(h.events(), vec![Event::Released { lease }]);
    assert_eq!(h.core.counters().pending_cleanups, 0);
}

#[test]
fn a_renew_answered_zero_loses_the_lease() {
    let mut h = H::new();
    let lease = h.acquire("jobs", 0);
    let r = h.only_acquire();
    h.reply(r.id, granted(5));
    h.events();
    let deadline = h.proto.poll_timeout(&mut h.core).unwrap();
    h.now = deadline;
    h.proto.handle_timeout(&mut h.core, h.now);
    let r = h.reqs();
    h.reply(r[0].id, Value::Int(0));
    assert!(
        h.events()
            .iter()
            .any(|e| matches!(e, Event::Lost { lease: l, .. } if *l == lease))
    );
}

#[test]
fn noscript_resends_the_same_call_as_eval_once() {
    let mut h = H::new();
    h.acquire("jobs", 0);
    let first = h.only_acquire();
    h.reply(
        first.id,
        Value::Error(b"NOSCRIPT No matching script. Please use EVAL."),
    );
    let r = h.reqs();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].cmd(), b"EVAL");
    assert_eq!(r[0].args[1], Script::Acquire.text().as_bytes());
    assert_eq!(r[0].args[2..], first.args[2..]);
    assert_ne!(r[0].id, first.id);
    assert!(h.events().is_empty());
    h.reply(r[0].id, granted(9));
    assert_eq!(acquired(&h.events()), Some(9));
    assert_eq!(h.proto.counters().noscript_retries, 1);
}

#[test]
fn a_second_noscript_is_a_transport_error() {
    let mut h = H::new();
    h.acquire("jobs", 0);
    let first = h.only_acquire();
    h.reply(first.id, Value::Error(b"NOSCRIPT x"));
    let eval = h.reqs().remove(0);
    h.reply(eval.id, Value::Error(b"NOSCRIPT x"));
    let ev = h.events();
    assert_eq!(acquired(&ev), None);
    assert!(
        ev.iter().any(|e| matches!(
            e,
            Event::AcquireFailed {
                reason: AcquireFailReason::Unavailable,
                ..
            }
        )),
        "{ev:?}"
    );
}

#[test]
fn an_error_reply_is_a_transport_error_never_a_grant() {
    let mut h = H::new();
    h.acquire("jobs", 0);
    let r = h.only_acquire();
    h.reply(
        r.id,
        Value::Error(b"lh: lock key lh:{jobs} holds a string, expected a hash; refusing to grant"),
    );
    let ev = h.events();
    assert_eq!(acquired(&ev), None);
    assert!(
        matches!(
            ev[..],
            [Event::AcquireFailed {
                reason: AcquireFailReason::Unavailable,
                ..
            }]
        ),
        "{ev:?}"
    );
    assert_eq!(h.proto.counters().error_replies, 1);
    assert!(
        h.proto.last_error().contains("holds a string"),
        "{}",
        h.proto.last_error()
    );
}

#[test]
fn wrong_type_nil_and_garbage_replies_are_never_grants() {
    let bad: Vec<Value<'static>> = vec![
        Value::Nil,
        Value::Int(1),
        Value::Status(b"OK"),
        Value::Bulk(b"1"),
        Value::Array(vec![]),
        Value::Array(vec![Value::Int(1), Value::Int(0), Value::Int(3_000)]),
        Value::Array(vec![Value::Int(1), Value::Int(-4), Value::Int(3_000)]),
        Value::Array(vec![Value::Int(1), Value::Int(1 << 53), Value::Int(3_000)]),
        Value::Array(vec![Value::Int(1), Value::Int(5), Value::Int(0)]),
        Value::Array(vec![Value::Int(1), Value::Int(5)]),
        Value::Array(vec![Value::Int(0), Value::Int(-2)]),
        Value::Array(vec![Value::Int(2), Value::Int(5), Value::Int(3_000)]),
        Value::Array(vec![Value::Bulk(b"1"), Value::Int(5), Value::Int(3_000)]),
        Value::Array(vec![
            Value::Int(1),
            Value::Int(5),
            Value::Int(3_000),
            Value::Int(1),
        ]),
        Value::Array(vec![Value::Array(vec![
            Value::Int(1),
            Value::Int(5),
            Value::Int(3_000),
        ])]),
    ];
    for v in bad {
        let mut h = H::new();
        h.acquire("jobs", 0);
        let r = h.only_acquire();
        h.reply(r.id, v.clone());
        let ev = h.events();
        assert_eq!(acquired(&ev), None, "{v:?}");
        assert_eq!(h.proto.counters().garbage_replies, 1, "{v:?}");
    }
    // RENEW and RELEASE want the integers 0 or 1.
    let mut h = H::new();
    let lease = h.acquire("jobs", 0);
    let r = h.only_acquire();
    h.reply(r.id, granted(5));
    h.core.release(h.now, lease).unwrap();
    let rel = h.reqs().remove(0);
    h.reply(rel.id, Value::Int(2));
    assert_eq!(
        h.core.counters().pending_cleanups,
        1,
        "a garbage reply is not a release"
    );
}

#[test]
fn replies_to_unknown_or_answered_ids_are_ignored() {
    let mut h = H::new();
    h.acquire("jobs", 0);
    let r = h.only_acquire();
    h.reply(r.id + 1000, granted(1));
    h.reply(0, granted(1));
    h.proto.handle_request_failed(&mut h.core, h.now, u64::MAX);
    assert!(h.events().is_empty());
    h.reply(r.id, granted(2));
    h.reply(r.id, granted(3));
    let ev = h.events();
    assert_eq!(ev.len(), 1);
    assert_eq!(acquired(&ev), Some(2));
    assert_eq!(h.proto.counters().stale_replies, 4);
}

/// A refused lease, subscribed, with the holder's 2 s left.
fn refused(h: &mut H, wait_ms: u64) -> (LeaseId, Req) {
    let lease = h.acquire("jobs", wait_ms);
    let r = h.only_acquire();
    h.reply(r.id, held(2_000));
    (lease, r)
}

#[test]
fn a_queued_refusal_answers_quick_retries_locally() {
    let mut h = H::new();
    refused(&mut h, 10_000);
    let before = h.proto.counters().script_calls;
    for _ in 0..100 {
        h.advance(10);
        assert!(h.reqs().is_empty());
    }
    assert_eq!(h.proto.counters().script_calls, before);
    assert!(h.proto.counters().local_refusals >= 2);
    // When the holder's time is up the lease asks Redis again.
    h.advance(1_200);
    let r = h.reqs();
    assert!(r.iter().any(|r| r.is_script(Script::Acquire)), "{r:?}");
}

/// Steps 10 ms at a time (at most `steps`) until an ACQUIRE goes out; when, in ms.
fn next_acquire_ms(h: &mut H, steps: usize) -> u64 {
    for _ in 0..steps {
        h.advance(10);
        if h.reqs().iter().any(|r| r.is_script(Script::Acquire)) {
            return h.now / MS;
        }
    }
    panic!("no ACQUIRE within {steps} steps");
}

#[test]
fn a_waiter_behind_the_head_looks_again_only_after_the_idle_interval() {
    let mut h = H::new();
    h.acquire("jobs", 60_000);
    let r = h.only_acquire();
    let behind = Value::Array(vec![Value::Int(0), Value::Int(2_000), Value::Int(3)]);
    h.reply(r.id, behind);
    let asked_ms = next_acquire_ms(&mut h, 1_200);
    assert!(
        (10_000..11_000).contains(&asked_ms),
        "asked again at {asked_ms} ms"
    );
}

#[test]
fn the_head_looks_again_when_the_holders_time_is_up() {
    let mut h = H::new();
    h.acquire("jobs", 60_000);
    let r = h.only_acquire();
    let head = Value::Array(vec![Value::Int(0), Value::Int(2_000), Value::Int(0)]);
    h.reply(r.id, head);
    let asked_ms = next_acquire_ms(&mut h, 1_200);
    assert!(
        (2_000..2_200).contains(&asked_ms),
        "asked again at {asked_ms} ms"
    );
}

#[test]
fn without_a_confirmed_subscription_every_retry_goes_to_redis() {
    let mut h = H::unsubscribed();
    h.reqs();
    h.acquire("jobs", 10_000);
    let r = h.only_acquire();
    h.reply(r.id, held(2_000));
    let mut sent = 0;
    for _ in 0..50 {
        h.advance(10);
        for r in h.reqs() {
            if r.is_script(Script::Acquire) {
                sent += 1;
                h.reply(r.id, held(2_000));
            }
        }
    }
    assert!(sent >= 2, "quick attempts are real: {sent}");
    assert_eq!(h.proto.counters().local_refusals, 0);
}

#[test]
fn a_wake_up_makes_one_waiter_try_at_once() {
    let mut h = H::new();
    let (_, first) = refused(&mut h, 10_000);
    h.advance(50);
    h.reqs();
    h.msg(&notice("w", &first.args[6], "jobs"));
    let r = h.only_acquire();
    h.reply(r.id, granted(77));
    assert_eq!(acquired(&h.events()), Some(77));
    assert_eq!(h.proto.counters().wakeups, 1);
}

#[test]
fn duplicated_wake_ups_are_harmless() {
    let mut h = H::new();
    let (_, first) = refused(&mut h, 10_000);
    let w = notice("w", &first.args[6], "jobs");
    h.msg(&w);
    h.msg(&w);
    h.msg(&w);
    let r = h.reqs();
    assert_eq!(
        r.iter().filter(|r| r.is_script(Script::Acquire)).count(),
        1,
        "{r:?}"
    );
    h.reply(r[0].id, granted(3));
    h.msg(&w);
    assert!(h.reqs().is_empty());
    assert_eq!(acquired(&h.events()), Some(3));
}

#[test]
fn a_standby_that_hears_nothing_tries_after_the_delay() {
    let mut h = H::new();
    let (_, first) = refused(&mut h, 10_000);
    h.advance(50);
    h.reqs();
    h.msg(&notice("s1", &first.args[6], "jobs"));
    h.advance(140);
    assert!(h.reqs().is_empty(), "not before the standby delay");
    h.advance(10);
    let r = h.only_acquire();
    h.reply(r.id, granted(8));
    assert_eq!(acquired(&h.events()), Some(8));
    assert_eq!(h.proto.counters().standby_takeovers, 1);
}

#[test]
fn a_second_standby_waits_twice_as_long() {
    let mut h = H::new();
    let (_, first) = refused(&mut h, 10_000);
    for _ in 0..20 {
        h.advance(10);
    }
    h.reqs();
    h.msg(&notice("s2", &first.args[6], "jobs"));
    assert_eq!(h.proto.poll_timeout(&mut h.core), Some(h.now + 300 * MS));
    h.advance(290);
    assert!(h.reqs().is_empty());
    h.advance(10);
    h.only_acquire();
}

/// `t NAME` (older clients' scripts) and `g TTL TOKEN NAME` both stand a standby down.
#[test]
fn a_standby_told_taken_or_granted_stands_down() {
    for granted in [false, true] {
        let mut h = H::new();
        let (_, first) = refused(&mut h, 10_000);
        h.advance(50);
        h.reqs();
        h.msg(&notice("s1", &first.args[6], "jobs"));
        h.advance(20);
        let taken = if granted {
            notice("g 5000", &first.args[6], "jobs")
        } else {
            b"t jobs".to_vec()
        };
        h.msg(&taken);
        h.advance(500);
        assert!(h.reqs().is_empty(), "granted: {granted}");
        assert_eq!(h.proto.counters().standby_takeovers, 0);
    }
}

/// A waiter behind the head (its refusal said: look again after idle_recheck_ms) that hears
/// a grant naming its entry looks again when that grant runs out: the new holder may freeze.
#[test]
fn a_grant_notice_makes_its_entry_look_again_when_the_grant_runs_out() {
    let mut h = H::new();
    h.acquire("jobs", 60_000);
    let r = h.only_acquire();
    h.reply(
        r.id,
        Value::Array(vec![Value::Int(0), Value::Int(2_000), Value::Int(2)]),
    );
    h.advance(100);
    h.msg(&notice("g 1500", &r.args[6], "jobs"));
    assert!(h.proto.poll_timeout(&mut h.core) <= Some(h.now + 1_500 * MS));
    let asked_ms = next_acquire_ms(&mut h, 1_000);
    assert!(
        (1_600..1_650).contains(&asked_ms),
        "asked again at {asked_ms} ms"
    );
}

#[test]
fn a_grant_notice_for_another_token_or_followed_by_a_wake_up_arms_nothing() {
    let mut h = H::new();
    let (_, first) = refused(&mut h, 60_000);
    h.advance(10);
    h.msg(&notice("g 100", &[b'0'; 32], "jobs"));
    h.advance(500);
    assert!(h.reqs().is_empty(), "a grant for another entry");
    // A wake-up supersedes the grant notice: the lease tries at once, and only then.
    h.msg(&notice("g 100", &first.args[6], "jobs"));
    h.msg(&notice("w", &first.args[6], "jobs"));
    let r = h.only_acquire();
    h.reply(r.id, held(5_000));
    h.advance(500);
    assert!(h.reqs().is_empty(), "the recheck went with the wake-up");
}

#[test]
fn the_standby_deadline_is_part_of_poll_timeout() {
    let mut h = H::new();
    let (_, first) = refused(&mut h, 10_000);
    for _ in 0..20 {
        h.advance(10);
    }
    assert!(h.reqs().is_empty());
    assert!(h.proto.poll_timeout(&mut h.core).unwrap() > h.now + 1_000 * MS);
    h.msg(&notice("s1", &first.args[6], "jobs"));
    assert_eq!(h.proto.poll_timeout(&mut h.core), Some(h.now + 150 * MS));
}

#[test]
fn messages_for_other_channels_names_or_malformed_are_ignored() {
    let mut h = H::new();
    let (_, first) = refused(&mut h, 10_000);
    let token = first.args[6].clone();
    h.reqs();
    h.proto.handle_message(
        &mut h.core,
        h.now,
        b"lh:wake:other",
        &notice("w", &token, "jobs"),
    );
    let upper = token.to_ascii_uppercase();
    for bad in [
        &b"w jobs"[..],
        b"s1 jobs",
        b"x jobs",
        b"w",
        b"",
        &notice("w", &token, "")[..],
        &notice("w", &token[1..], "jobs"),
        &notice("w", &upper, "jobs"),
        &notice("w", &token, "\u{fffd}\0"),
        &notice("s", &token, "jobs"),
        &notice("s9", &token, "jobs"),
    ] {
        h.msg(bad);
    }
    // Well formed, for a name nobody waits for here: nothing to wake.
    h.msg(&notice("w", &token, "other-name"));
    h.msg(&notice("s1", &token, "other"));
    assert!(h.reqs().is_empty());
    assert_eq!(h.proto.counters().ignored_messages, 12);
}

#[test]
fn the_subscription_confirmed_as_a_reply_takes_effect() {
    let mut h = H::unsubscribed();
    let sub = h.reqs().remove(0);
    h.reply(
        sub.id,
        Value::Array(vec![
            Value::Bulk(b"subscribe"),
            Value::Bulk(WAKE),
            Value::Int(1),
        ]),
    );
    assert!(h.proto.is_subscribed());
    assert_eq!(h.proto.counters().subscriptions, 1);
}

#[test]
fn subscription_confirmations_for_other_channels_do_not_count() {
    let mut h = H::unsubscribed();
    h.reqs();
    h.proto
        .handle_subscription(&mut h.core, h.now, b"lh:wake:someone-else", true);
    assert!(!h.proto.is_subscribed());
    h.subscribed();
    h.subscribed();
    assert_eq!(h.proto.counters().subscriptions, 1);
}

#[test]
fn taking_effect_rechecks_every_waiting_name() {
    let mut h = H::unsubscribed();
    h.reqs();
    h.acquire("a", 10_000);
    h.acquire("b", 10_000);
    for r in h.reqs() {
        h.reply(r.id, held(2_000));
    }
    h.advance(1);
    for r in h.reqs() {
        h.reply(r.id, held(2_000));
    }
    h.subscribed();
    let r = h.reqs();
    let names: Vec<&[u8]> = r.iter().map(|r| r.args[10].as_slice()).collect();
    assert_eq!(r.len(), 2, "{r:?}");
    assert!(names.contains(&&b"a"[..]) && names.contains(&&b"b"[..]));
}

#[test]
fn a_lost_subscriber_resubscribes_and_rechecks() {
    let mut h = H::new();
    refused(&mut h, 10_000);
    h.advance(50);
    h.reqs();
    h.proto.handle_subscription(&mut h.core, h.now, WAKE, false);
    assert!(!h.proto.is_subscribed());
    let r = h.reqs();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].args, vec![b"SUBSCRIBE".to_vec(), WAKE.to_vec()]);
    assert_eq!(r[0].conn, Connection::Subscriber);
    // Retries are real again while nobody listens.
    h.advance(1_000);
    let r = h.reqs();
    assert!(r.iter().any(|r| r.is_script(Script::Acquire)), "{r:?}");
    for r in r {
        h.reply(r.id, held(2_000));
    }
    h.subscribed();
    let r = h.only_acquire();
    h.reply(r.id, granted(4));
    assert_eq!(acquired(&h.events()), Some(4));
    assert_eq!(h.proto.counters().subscriber_losses, 1);
}

#[test]
fn a_subscriber_lost_before_the_confirmation_subscribes_again_after_a_backoff() {
    let mut h = H::unsubscribed();
    h.reqs();
    // Reported from inside the failed send (the server is down): not again at once, or a host
    // that feeds the loss synchronously would loop as fast as it can.
    for _ in 0..100 {
        h.proto.handle_subscription(&mut h.core, h.now, WAKE, false);
        assert!(h.reqs().is_empty());
    }
    assert_eq!(
        h.proto.counters().subscriber_losses,
        0,
        "it was never in effect"
    );
    let at = h.proto.poll_timeout(&mut h.core).unwrap();
    assert!(at > h.now && at <= h.now + 2_000 * MS);
    h.now = at;
    h.proto.handle_timeout(&mut h.core, h.now);
    let r = h.reqs();
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].args, vec![b"SUBSCRIBE".to_vec(), WAKE.to_vec()]);
    h.subscribed();
    assert!(h.proto.is_subscribed());
}

#[test]
fn a_failed_subscribe_is_retried_with_backoff() {
    let mut h = H::unsubscribed();
    let sub = h.reqs().remove(0);
    h.proto.handle_request_failed(&mut h.core, h.now, sub.id);
    assert!(h.reqs().is_empty());
    let at = h.proto.poll_timeout(&mut h.core).unwrap();
    assert!(at > h.now && at <= h.now + 2_000 * MS);
    h.now = at;
    h.proto.handle_timeout(&mut h.core, h.now);
    let r = h.reqs();
    assert_eq!(r[0].cmd(), b"SUBSCRIBE");
    h.reply(r[0].id, Value::Error(b"ERR connection reset"));
    assert!(!h.proto.is_subscribed());
    assert!(h.proto.poll_timeout(&mut h.core).is_some());
}

#[test]
fn a_lease_that_gives_up_removes_its_queue_entry() {
    let mut h = H::new();
    let (lease, r) = refused(&mut h, 10_000);
    let entry = r.args[8].clone();
    h.core.release(h.now, lease).unwrap();
    let ev = h.events();
    assert!(
        matches!(
            ev[..],
            [Event::AcquireFailed {
                reason: AcquireFailReason::Cancelled,
                ..
            }]
        ),
        "{ev:?}"
    );
    let r = h.reqs();
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(r[0].is_script(Script::Leave), "{r:?}");
    assert_eq!(
        r[0].args[2..],
        [
            b"2".to_vec(),
            b"lh:{jobs}".to_vec(),
            b"lh:{jobs}:queue".to_vec(),
            entry,
            b"jobs".to_vec()
        ]
    );
    h.reply(r[0].id, Value::Int(1));
    assert!(h.reqs().is_empty());
}

#[test]
fn a_refusal_arriving_after_give_up_removes_the_entry_again() {
    let mut h = H::new();
    let lease = h.acquire("jobs", 10_000);
    let r = h.only_acquire();
    h.core.release(h.now, lease).unwrap();
    h.events();
    assert!(h.reqs().is_empty(), "never queued: nothing to remove yet");
    h.reply(r.id, held(2_000));
    let z = h.reqs();
    assert_eq!(z.len(), 1);
    assert!(z[0].is_script(Script::Leave), "{z:?}");
}

#[test]
fn a_transport_failure_is_a_transport_error_for_the_engine() {
    let mut h = H::new();
    h.acquire("jobs", 0);
    let r = h.only_acquire();
    h.proto.handle_request_failed(&mut h.core, h.now, r.id);
    let ev = h.events();
    assert!(
        matches!(
            ev[..],
            [Event::AcquireFailed {
                reason: AcquireFailReason::Unavailable,
                ..
            }]
        ),
        "{ev:?}"
    );
    assert_eq!(h.proto.counters().transport_failures, 1);
}

#[test]
fn unanswered_requests_are_forgotten_eventually() {
    let mut h = H::new();
    for i in 0..50 {
        h.acquire(&format!("n{i}"), 0);
    }
    let r = h.reqs();
    assert_eq!(r.len(), 50);
    h.advance(120_000);
    h.reply(r[0].id, granted(1));
    assert_eq!(h.proto.counters().stale_replies, 1);
}

#[test]
fn the_wake_channel_can_change_after_fork() {
    let mut h = H::new();
    h.proto.set_wake_random(h.now, [1; 16]);
    let r = h.reqs();
    assert_eq!(r[0].args, vec![b"UNSUBSCRIBE".to_vec(), WAKE.to_vec()]);
    assert_eq!(r[1].args[0], b"SUBSCRIBE");
    assert_eq!(r[1].args[1], h.proto.wake_channel());
    assert_ne!(h.proto.wake_channel(), WAKE);
    assert!(!h.proto.is_subscribed());
}

#[test]
fn bad_options_are_refused() {
    for o in [
        RedisOptions {
            standby_delay_ms: 0,
            ..RedisOptions::default()
        },
        RedisOptions {
            queue_max_age_ms: 0,
            ..RedisOptions::default()
        },
        RedisOptions {
            key_keep_ms: u64::MAX,
            ..RedisOptions::default()
        },
    ] {
        assert!(RedisProtocol::new(o, [0; 16]).is_err(), "{o:?}");
    }
}

/// `n` leases of this client queued for `jobs` in order (ranks 0, 1, …), holder 2 s left;
/// each with its token as sent.
fn queued(h: &mut H, n: usize) -> Vec<(LeaseId, Vec<u8>)> {
    (0..n)
        .map(|rank| {
            let lease = h.acquire("jobs", 60_000);
            let r = h.only_acquire();
            let reply = Value::Array(vec![
                Value::Int(0),
                Value::Int(2_000),
                Value::Int(rank as i64),
            ]);
            h.reply(r.id, reply);
            (lease, r.args[6].clone())
        })
        .collect()
}

/// The ACQUIREs sent, by token.
fn acquire_tokens(r: &[Req]) -> Vec<Vec<u8>> {
    r.iter()
        .filter(|r| r.is_script(Script::Acquire))
        .map(|r| r.args[6].clone())
        .collect()
}

fn acquired_lease(ev: &[Event]) -> Option<LeaseId> {
    ev.iter().find_map(|e| match e {
        Event::Acquired { lease, .. } => Some(*lease),
        _ => None,
    })
}

#[test]
fn of_two_local_waiters_the_popped_entrys_lease_is_the_one_that_tries() {
    let mut h = H::new();
    let w = queued(&mut h, 2);
    h.advance(50);
    assert!(h.reqs().is_empty());
    // Redis popped the second lease's entry (say the first registered later there).
    h.msg(&notice("w", &w[1].1, "jobs"));
    let r = h.reqs();
    assert_eq!(acquire_tokens(&r), vec![w[1].1.clone()], "{r:?}");
    h.reply(r[0].id, granted(5));
    assert_eq!(acquired_lease(&h.events()), Some(w[1].0));
    // The first lease's entry is still queued: it keeps sleeping.
    h.advance(100);
    assert!(h.reqs().is_empty());
    // Its own wake-up reaches it.
    h.msg(&notice("w", &w[0].1, "jobs"));
    let r = h.reqs();
    assert_eq!(acquire_tokens(&r), vec![w[0].1.clone()], "{r:?}");
    h.reply(r[0].id, granted(6));
    assert_eq!(acquired_lease(&h.events()), Some(w[0].0));
    assert_eq!(h.proto.counters().wakeups, 2);
}

#[test]
fn of_three_local_waiters_each_wake_up_reaches_its_own_lease() {
    let mut h = H::new();
    let w = queued(&mut h, 3);
    h.advance(50);
    for i in [2, 0, 1] {
        h.msg(&notice("w", &w[i].1, "jobs"));
        let r = h.reqs();
        assert_eq!(acquire_tokens(&r), vec![w[i].1.clone()], "wake {i}: {r:?}");
        h.reply(r[0].id, granted(10 + i as i64));
        assert_eq!(acquired_lease(&h.events()), Some(w[i].0));
        h.advance(20);
        assert!(h.reqs().is_empty(), "nobody else tries");
    }
}

#[test]
fn a_standby_message_wakes_the_lease_it_names() {
    let mut h = H::new();
    let w = queued(&mut h, 3);
    h.advance(50);
    h.msg(&notice("s2", &w[2].1, "jobs"));
    h.msg(&notice("s1", &w[1].1, "jobs"));
    h.advance(149);
    assert!(h.reqs().is_empty());
    h.advance(1);
    let r = h.reqs();
    assert_eq!(acquire_tokens(&r), vec![w[1].1.clone()], "{r:?}");
    // One standby per name here: the second does not fire as well.
    h.reply(r[0].id, held(2_000));
    h.advance(300);
    assert!(acquire_tokens(&h.reqs()).is_empty());
    assert_eq!(h.proto.counters().standby_takeovers, 1);
}

#[test]
fn a_wake_up_for_a_lease_that_gave_up_goes_to_the_next_local_waiter() {
    let mut h = H::new();
    let w = queued(&mut h, 3);
    h.advance(50);
    // The popped entry's lease gives up before the message arrives.
    h.core.release(h.now, w[1].0).unwrap();
    h.events();
    let z = h.reqs();
    assert_eq!(z.len(), 1);
    assert!(z[0].is_script(Script::Leave), "{z:?}");
    h.msg(&notice("w", &w[1].1, "jobs"));
    let r = h.reqs();
    assert_eq!(acquire_tokens(&r), vec![w[0].1.clone()], "{r:?}");
    h.reply(r[0].id, granted(4));
    assert_eq!(acquired_lease(&h.events()), Some(w[0].0));
    // A token this client never had: the next local waiter tries too.
    h.msg(&notice("w", &[b'a'; 32], "jobs"));
    let r = h.reqs();
    assert_eq!(acquire_tokens(&r), vec![w[2].1.clone()], "{r:?}");
    h.reply(r[0].id, held(2_000));
    // With no local waiter left, a stray wake-up sends nothing.
    h.core.release(h.now, w[2].0).unwrap();
    h.events();
    h.reqs();
    h.msg(&notice("w", &[b'b'; 32], "jobs"));
    assert!(h.reqs().is_empty());
}

#[test]
fn duplicated_wake_ups_for_one_of_several_waiters_cost_nothing_once_it_holds() {
    let mut h = H::new();
    let w = queued(&mut h, 2);
    h.advance(50);
    let wake = notice("w", &w[1].1, "jobs");
    h.msg(&wake);
    h.msg(&wake);
    let r = h.reqs();
    assert_eq!(acquire_tokens(&r), vec![w[1].1.clone()], "in flight: {r:?}");
    h.reply(r[0].id, granted(9));
    assert_eq!(acquired_lease(&h.events()), Some(w[1].0));
    // The lease holds the lock: a late copy is not passed on to the other waiter.
    h.msg(&wake);
    h.advance(20);
    assert!(h.reqs().is_empty());
    let before = h.core.counters().stale_results;
    h.msg(&wake);
    assert_eq!(h.core.counters().stale_results, before + 1);
    // Once it has released, its token names nobody: the other waiter gets the copy.
    h.core.release(h.now, w[1].0).unwrap();
    h.events();
    let rel = h.reqs();
    assert!(rel[0].is_script(Script::Release), "{rel:?}");
    h.msg(&wake);
    let r = h.reqs();
    assert_eq!(acquire_tokens(&r), vec![w[0].1.clone()], "{r:?}");
}

#[test]
fn a_wake_up_while_the_leases_attempt_is_in_flight_retries_a_refusal_at_once() {
    let mut h = H::new();
    let w = queued(&mut h, 2);
    // The head's own retry is in flight when the holder's time is up ...
    h.advance(2_100);
    let r = h.reqs();
    let mine: Vec<_> = r
        .iter()
        .filter(|r| r.args.get(6) == Some(&w[0].1))
        .collect();
    assert_eq!(mine.len(), 1, "{r:?}");
    let id = mine[0].id;
    // ... and the release's wake-up for it arrives before the (older) refusal.
    h.msg(&notice("w", &w[0].1, "jobs"));
    assert!(acquire_tokens(&h.reqs()).is_empty());
    h.reply(id, held(2_000));
    h.advance(1);
    let r = h.reqs();
    assert_eq!(acquire_tokens(&r), vec![w[0].1.clone()], "{r:?}");
}

// ------------------------------------------------------------------ sharded wake (Cluster)

const JOBS_CH: &[u8] = b"lh:{jobs}:wake";

fn sharded() -> H {
    let core = Client::new(Config::default(), &[9; 32]).unwrap();
    let opts = RedisOptions {
        sharded_wake: true,
        ..RedisOptions::default()
    };
    let proto = RedisProtocol::new(opts, [7; 16]).unwrap();
    H {
        core,
        proto,
        now: MS,
    }
}

impl H {
    fn smsg(&mut self, channel: &[u8], payload: &[u8]) {
        self.proto
            .handle_message(&mut self.core, self.now, channel, payload);
    }
    fn ssub(&mut self, channel: &[u8], on: bool) {
        self.proto
            .handle_subscription(&mut self.core, self.now, channel, on);
    }
}

fn queue_reply(rank: i64) -> Value<'static> {
    Value::Array(vec![Value::Int(0), Value::Int(2_000), Value::Int(rank)])
}

/// A sharded client with one lease queued at `rank` on `jobs` and the name's channel live
/// (refused, SSUBSCRIBE confirmed, re-checked and refused again): its token as sent.
fn sharded_waiter(h: &mut H, rank: i64) -> (LeaseId, Vec<u8>) {
    let lease = h.acquire("jobs", 60_000);
    let r = h.only_acquire();
    h.reply(r.id, queue_reply(rank));
    let sub = h.reqs();
    assert_eq!(sub.len(), 1, "{sub:?}");
    assert_eq!(sub[0].conn, Connection::Subscriber);
    assert_eq!(sub[0].args, vec![b"SSUBSCRIBE".to_vec(), JOBS_CH.to_vec()]);
    h.ssub(JOBS_CH, true);
    let again = h.only_acquire();
    h.reply(again.id, queue_reply(rank));
    assert!(h.reqs().is_empty());
    (lease, r.args[6].clone())
}

#[test]
fn sharded_wake_subscribes_nothing_until_a_lease_waits() {
    let mut h = sharded();
    assert!(h.reqs().is_empty(), "no client channel");
    assert!(h.proto.is_subscribed());
    let lease = h.acquire("jobs", 0);
    let r = h.only_acquire();
    // The scripts get the name's shard channel as their last argument.
    assert_eq!(r.args.len(), 13, "{r:?}");
    assert_eq!(r.args[12], JOBS_CH);
    h.reply(r.id, granted(3));
    assert_eq!(acquired(&h.events()), Some(3));
    assert!(h.reqs().is_empty(), "a free lock subscribes nothing");
    h.core.release(h.now, lease).unwrap();
    let r = h.reqs();
    assert!(r[0].is_script(Script::Release), "{r:?}");
    assert_eq!(r[0].args.last().unwrap(), JOBS_CH);
}

#[test]
fn sharded_wake_subscribes_a_waited_name_and_rechecks_when_it_takes_effect() {
    let mut h = sharded();
    let lease = h.acquire("jobs", 60_000);
    let r = h.only_acquire();
    h.reply(r.id, queue_reply(1));
    let sub = h.reqs();
    assert_eq!(sub.len(), 1, "{sub:?}");
    assert_eq!(sub[0].args, vec![b"SSUBSCRIBE".to_vec(), JOBS_CH.to_vec()]);
    assert!(!h.proto.is_subscribed());
    // Until it takes effect nothing is answered locally.
    h.advance(300);
    let r = h.only_acquire();
    h.reply(r.id, queue_reply(1));
    assert_eq!(h.proto.counters().local_refusals, 0);
    // Confirmed as the reply: one re-check (a release just before reached nobody).
    let conf = Value::Array(vec![
        Value::Bulk(b"ssubscribe"),
        Value::Bulk(JOBS_CH),
        Value::Int(1),
    ]);
    h.reply(sub[0].id, conf);
    let r = h.only_acquire();
    h.reply(r.id, queue_reply(1));
    // Now quiet: an idle waiter asks nothing for the idle interval.
    for _ in 0..90 {
        h.advance(100);
        assert!(h.reqs().is_empty());
    }
    assert!(h.proto.counters().local_refusals > 0);
    // Giving up leaves the queue and unsubscribes the name.
    h.core.release(h.now, lease).unwrap();
    let r = h.reqs();
    let leave = r
        .iter()
        .find(|r| r.is_script(Script::Leave))
        .expect("LEAVE");
    assert_eq!(leave.args.last().unwrap(), JOBS_CH, "{leave:?}");
    let unsub = r
        .iter()
        .find(|r| r.cmd() == b"SUNSUBSCRIBE")
        .expect("SUNSUBSCRIBE");
    assert_eq!(unsub.conn, Connection::Subscriber);
    assert_eq!(unsub.args[1], JOBS_CH);
}

#[test]
fn sharded_wake_only_the_named_lease_acts_on_a_shared_channel() {
    let mut h = sharded();
    let (lease, token) = sharded_waiter(&mut h, 1);
    let other = b"0123456789abcdef0123456789abcdef";
    // Another client's turn, standbys and taken: nothing here moves.
    h.smsg(JOBS_CH, &notice("w", other, "jobs"));
    h.smsg(JOBS_CH, &notice("s1", other, "jobs"));
    h.smsg(JOBS_CH, &notice("s2", other, "jobs"));
    for _ in 0..10 {
        h.advance(100);
        assert!(h.reqs().is_empty());
    }
    assert_eq!(h.proto.counters().wakeups, 0);
    assert_eq!(h.proto.counters().standby_takeovers, 0);
    // Ours: exactly one ACQUIRE, for that lease.
    h.smsg(JOBS_CH, &notice("w", &token, "jobs"));
    let r = h.only_acquire();
    assert_eq!(r.args[6], token);
    h.reply(r.id, granted(9));
    assert_eq!(acquired_lease(&h.events()), Some(lease));
    // No waiter left: the name is unsubscribed.
    let r = h.reqs();
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].args, vec![b"SUNSUBSCRIBE".to_vec(), JOBS_CH.to_vec()]);
}

#[test]
fn sharded_wake_a_standby_naming_our_lease_tries_unless_taken() {
    let mut h = sharded();
    let (_, token) = sharded_waiter(&mut h, 1);
    h.smsg(JOBS_CH, &notice("s1", &token, "jobs"));
    h.smsg(JOBS_CH, b"t jobs");
    h.advance(400);
    assert!(h.reqs().is_empty(), "stood down");
    h.smsg(JOBS_CH, &notice("s1", &token, "jobs"));
    h.advance(149);
    assert!(h.reqs().is_empty());
    h.advance(2);
    let r = h.only_acquire();
    assert_eq!(r.args[6], token);
    assert_eq!(h.proto.counters().standby_takeovers, 1);
}

#[test]
fn sharded_wake_hostile_messages_and_confirmations_are_ignored() {
    let mut h = sharded();
    let (_, token) = sharded_waiter(&mut h, 1);
    let ignored = h.proto.counters().ignored_messages;
    let hostile: Vec<(&[u8], Vec<u8>)> = vec![
        // Our token, but on another name's channel, a client channel, or garbage channels.
        (b"lh:{other}:wake", notice("w", &token, "jobs")),
        (WAKE, notice("w", &token, "jobs")),
        (b"lh:{jobs}:wak", notice("w", &token, "jobs")),
        (b"", notice("w", &token, "jobs")),
        // The right channel naming another name, or malformed payloads.
        (JOBS_CH, notice("w", &token, "other")),
        (JOBS_CH, notice("w", &token.to_ascii_uppercase(), "jobs")),
        (JOBS_CH, notice("s3", &token, "jobs")),
        (JOBS_CH, notice("x", &token, "jobs")),
        (JOBS_CH, b"w".to_vec()),
        (JOBS_CH, b"w  jobs".to_vec()),
        (JOBS_CH, vec![0xff; 70]),
        (JOBS_CH, Vec::new()),
        (JOBS_CH, notice("w", &token[..31], "jobs")),
    ];
    let n = hostile.len() as u64;
    for (ch, p) in hostile {
        h.smsg(ch, &p);
    }
    assert!(h.reqs().is_empty());
    assert_eq!(h.proto.counters().ignored_messages, ignored + n);
    assert_eq!(h.proto.counters().wakeups, 0);
    // Confirmations and losses of channels nobody here waits on change nothing.
    h.ssub(b"lh:{other}:wake", false);
    h.ssub(b"lh:{other}:wake", true);
    h.ssub(WAKE, false);
    h.ssub(b"garbage", false);
    assert!(h.reqs().is_empty());
    // A duplicate confirmation of the live channel does not re-check.
    h.ssub(JOBS_CH, true);
    assert!(h.reqs().is_empty());
    h.advance(500);
    assert!(h.reqs().is_empty(), "still quiet");
}

#[test]
fn sharded_wake_a_lost_channel_resubscribes_and_rechecks_only_its_name() {
    let mut h = sharded();
    sharded_waiter(&mut h, 1);
    h.acquire("other", 60_000);
    let r = h.only_acquire();
    assert_eq!(r.args[12], b"lh:{other}:wake");
    h.reply(r.id, queue_reply(1));
    let sub = h.reqs();
    assert_eq!(sub[0].args[1], b"lh:{other}:wake");
    h.ssub(b"lh:{other}:wake", true);
    let r = h.only_acquire();
    h.reply(r.id, queue_reply(1));
    assert!(h.reqs().is_empty());
    // The node serving jobs' slot failed (or the slot moved: Redis sends sunsubscribe).
    h.ssub(JOBS_CH, false);
    let r = h.reqs();
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].args, vec![b"SSUBSCRIBE".to_vec(), JOBS_CH.to_vec()]);
    assert_eq!(h.proto.counters().subscriber_losses, 1);
    // jobs' retries now go to Redis; other stays quiet.
    h.advance(400);
    let r = h.reqs();
    let names: Vec<&[u8]> = r
        .iter()
        .filter(|r| r.is_script(Script::Acquire))
        .map(|r| &r.args[3][..])
        .collect();
    assert_eq!(names, vec![&b"lh:{jobs}"[..]], "{r:?}");
    for x in &r {
        h.reply(x.id, queue_reply(1));
    }
    // Back: jobs is checked once.
    h.ssub(JOBS_CH, true);
    let r = h.only_acquire();
    assert_eq!(r.args[3], b"lh:{jobs}");
}

#[test]
fn sharded_wake_a_failed_ssubscribe_is_retried_with_backoff() {
    let mut h = sharded();
    h.acquire("jobs", 60_000);
    let r = h.only_acquire();
    h.reply(r.id, queue_reply(0));
    let sub = h.reqs();
    h.reply(sub[0].id, Value::Error(b"MOVED 1234 127.0.0.1:7001"));
    assert!(h.reqs().iter().all(|r| r.cmd() != b"SSUBSCRIBE"));
    let mut again = None;
    for _ in 0..50 {
        h.advance(10);
        for r in h.reqs() {
            if r.cmd() == b"SSUBSCRIBE" {
                again = Some(r);
            } else if r.is_script(Script::Acquire) {
                h.reply(r.id, queue_reply(0));
            }
        }
        if again.is_some() {
            break;
        }
    }
    let again = again.expect("SSUBSCRIBE again");
    assert_eq!(again.args[1], JOBS_CH);
    h.proto.handle_request_failed(&mut h.core, h.now, again.id);
    h.advance(1_000);
    assert!(h.reqs().iter().any(|r| r.cmd() == b"SSUBSCRIBE"));
}

// ------------------------------------------------------------------ hash tags (Cluster)

/// Redis Cluster's key slot: CRC16 (XMODEM) of the hash tag (the bytes between the first `{`
/// and the first `}` after it, when not empty), else of the whole key, mod 16384.
fn key_slot(key: &[u8]) -> u16 {
    fn crc16(bytes: &[u8]) -> u16 {
        let mut crc: u16 = 0;
        for &b in bytes {
            crc ^= u16::from(b) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
        }
        crc
    }
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let close = key[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &key[open + 1..open + 1 + close])
    });
    crc16(tagged.unwrap_or(key)) % 16384
}

/// Names whose braces would break a plain `lh:{NAME}` tag, and some that never did.
fn tag_names() -> Vec<String> {
    let long_brace = format!("}}{}", "é".repeat((leasehold::MAX_NAME_LEN - 1) / 2));
    assert!(long_brace.len() <= leasehold::MAX_NAME_LEN);
    vec![
        "}x".into(),
        "{".into(),
        "}".into(),
        "a}b".into(),
        "{}".into(),
        "}{".into(),
        "{x}".into(),
        "jobs{eu}".into(),
        "ünï}cødé{".into(),
        long_brace,
        "x".repeat(leasehold::MAX_NAME_LEN),
        "jobs".into(),
        "#0123456789abcdef".into(),
        "ünïcødé".into(),
    ]
}

#[test]
fn every_key_and_the_wake_channel_of_a_name_share_one_cluster_slot() {
    use leasehold::backend::redis::scripts::{KeyKind, fnv1a64, hash_tag, key, shard_channel};
    use leasehold::backend::redis::shard_channel_name;
    // The documented digest: 64-bit FNV-1a (its published test vectors).
    assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    let mut seen = std::collections::HashSet::new();
    for name in tag_names() {
        let mut all: Vec<Vec<u8>> = KeyKind::ALL
            .iter()
            .map(|&k| key(k, &name).unwrap())
            .collect();
        all.push(shard_channel(&name).unwrap());
        let slot = key_slot(&all[0]);
        for k in &all {
            assert_eq!(
                key_slot(k),
                slot,
                "{name:?}: {:?}",
                String::from_utf8_lossy(k)
            );
            assert!(
                seen.insert(k.clone()),
                "{name:?}: a key shared with another name"
            );
        }
        let ch = shard_channel(&name).unwrap();
        assert_eq!(shard_channel_name(&ch), Some(name.as_str()));
        if name.contains(['{', '}']) {
            let tag = format!("#{:016x}", fnv1a64(name.as_bytes()));
            assert_eq!(hash_tag(&name), tag);
            assert_eq!(all[0], format!("lh:{{{tag}}}{name}}}").into_bytes());
            assert_eq!(all[1], format!("lh:{{{tag}}}{name}}}:fence").into_bytes());
            // The plain form of such a name is not its channel.
            let plain = format!("lh:{{{name}}}:wake");
            assert_eq!(shard_channel_name(plain.as_bytes()), None, "{plain}");
        } else {
            // Names without a brace keep their keys: older clients still exclude them.
            assert_eq!(all[0], format!("lh:{{{name}}}").into_bytes());
            assert_eq!(all[2], format!("lh:{{{name}}}:queue").into_bytes());
            assert_eq!(all[3], format!("lh:{{{name}}}:wake").into_bytes());
        }
    }
    // A brace-free name cannot take the digest form's place; a name built to look like it
    // has a digest of its own.
    let lookalike = format!("#{:016x}}}}}x", fnv1a64(b"}x"));
    assert_ne!(
        key(KeyKind::Lock, &lookalike).unwrap(),
        key(KeyKind::Lock, "}x").unwrap()
    );
    assert_eq!(shard_channel_name(b"lh:{#0000000000000000}}x}:wake"), None);
}

#[test]
fn a_name_with_a_brace_sends_digest_tagged_keys_and_channel() {
    use leasehold::backend::redis::scripts::{KeyKind, key, shard_channel};
    let mut h = sharded();
    let lease = h.acquire("}x", 0);
    let r = h.reqs();
    let r = r.iter().find(|r| r.is_script(Script::Acquire)).unwrap();
    for (i, kind) in KeyKind::ALL.iter().enumerate() {
        assert_eq!(r.args[3 + i], key(*kind, "}x").unwrap());
    }
    assert_eq!(r.args[10], b"}x");
    assert_eq!(r.args[12], shard_channel("}x").unwrap());
    let id = r.id;
    h.reply(id, granted(77));
    assert!(matches!(
        h.events()[..],
        [Event::Acquired { lease: l, fencing_token: 77, .. }] if l == lease
    ));
}
