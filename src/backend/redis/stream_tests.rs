//! `RedisStream` against a scripted server: the test reads the commands the core writes
//! (decoded with the crate's own decoder) and answers with hand-written RESP bytes.

use super::*;
use crate::backend::redis::scripts::Script;
use crate::backend::redis::wire::{Decoder, Limits, Reply};
use crate::backend::redis::{RedisOptions, RedisProtocol};
use crate::{AcquireOptions, Config};

pub(super) const HELLO_REPLY: &[u8] = b"%1\r\n$6\r\nserver\r\n$5\r\nredis\r\n";
pub(super) const GRANTED: &[u8] = b"*3\r\n:1\r\n:42\r\n:3000\r\n";

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Got {
    Open(u64, Endpoint, u64),
    Write(u64, Vec<Vec<Vec<u8>>>),
    Shutdown(u64),
}

pub(super) struct T {
    pub(super) core: Client,
    pub(super) s: RedisStream,
    pub(super) now: u64,
}

pub(super) fn commands(bytes: &[u8]) -> Vec<Vec<Vec<u8>>> {
    let mut d = Decoder::new(Limits::default());
    d.feed(bytes).unwrap();
    let mut out = Vec::new();
    while let Some(r) = d.next().unwrap() {
        let Reply::Array(items) = r else {
            panic!("not a command: {r:?}")
        };
        out.push(items.iter().map(|i| i.bytes().unwrap().to_vec()).collect());
    }
    assert_eq!(d.buffered(), 0, "a write holds whole commands");
    out
}

impl T {
    pub(super) fn new(url: &str) -> T {
        let proto = RedisProtocol::new(RedisOptions::default(), [7; 16]).unwrap();
        T {
            core: Client::new(Config::default(), &[9; 32]).unwrap(),
            s: RedisStream::new(proto, url, StreamSettings::default()).unwrap(),
            now: MS,
        }
    }

    pub(super) fn io(&mut self) -> Vec<Got> {
        let mut v = Vec::new();
        while let Some(r) = self.s.poll_request(&mut self.core) {
            v.push(match r {
                StreamRequest::Open {
                    stream,
                    endpoint,
                    deadline,
                } => Got::Open(stream, endpoint.clone(), deadline),
                StreamRequest::Write { stream, bytes } => Got::Write(stream, commands(bytes)),
                StreamRequest::Shutdown { stream } => Got::Shutdown(stream),
            });
            assert!(v.len() < 100);
        }
        v
    }

    pub(super) fn opens(&mut self) -> Vec<u64> {
        let got = self.io();
        got.iter()
            .map(|g| match g {
                Got::Open(s, _, _) => *s,
                other => panic!("expected opens only: {got:?} ({other:?})"),
            })
            .collect()
    }

    /// The commands of the one write queued now, on `stream`.
    pub(super) fn write(&mut self, stream: u64) -> Vec<Vec<Vec<u8>>> {
        let got = self.io();
        match &got[..] {
            [Got::Write(s, cmds)] if *s == stream => cmds.clone(),
            _ => panic!("expected one write on {stream}: {got:?}"),
        }
    }

    pub(super) fn opened(&mut self, stream: u64) {
        self.s
            .handle_opened(&mut self.core, self.now, stream)
            .unwrap();
    }

    pub(super) fn recv(&mut self, stream: u64, bytes: &[u8]) {
        self.s
            .handle_received(&mut self.core, self.now, stream, bytes)
            .unwrap();
    }

    pub(super) fn closed(&mut self, stream: u64, why: &str) {
        self.s
            .handle_closed(&mut self.core, self.now, stream, why)
            .unwrap();
    }

    pub(super) fn acquire(&mut self, wait_ms: u64) -> crate::LeaseId {
        let o = AcquireOptions::new(3_000).wait_ns(wait_ms * MS);
        self.core.acquire(self.now, "a", o).unwrap()
    }

    /// Opens and handshakes the commands connection (streams: commands, subscriber).
    pub(super) fn ready_commands(&mut self) -> (u64, u64) {
        let opens = self.opens();
        assert_eq!(opens.len(), 2, "{opens:?}");
        let (cmd, sub) = (opens[0], opens[1]);
        self.opened(cmd);
        assert_eq!(
            self.write(cmd),
            vec![vec![b"HELLO".to_vec(), b"3".to_vec()]]
        );
        self.recv(cmd, HELLO_REPLY);
        (cmd, sub)
    }

    pub(super) fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.s.poll_event(&mut self.core)).collect()
    }

    pub(super) fn fence(&mut self) -> Option<u64> {
        self.events().iter().find_map(|e| match e {
            Event::Acquired { fencing_token, .. } => Some(*fencing_token),
            _ => None,
        })
    }

    /// Advances to the next deadline (at most `limit` ns ahead); false if none.
    pub(super) fn tick(&mut self, limit: u64) -> bool {
        match self.s.poll_timeout(&mut self.core) {
            Some(t) if t <= self.now + limit => {
                self.now = self.now.max(t);
                self.s.handle_timeout(&mut self.core, self.now);
                true
            }
            _ => false,
        }
    }
}

pub(super) fn is_acquire(cmd: &[Vec<u8>]) -> bool {
    cmd[0] == b"EVALSHA" && cmd[1] == Script::Acquire.sha1_hex()
}

#[test]
fn open_handshake_command_reply() {
    let mut t = T::new("redis://cache.example:6380");
    t.acquire(0);
    let got = t.io();
    let [
        Got::Open(
            cmd,
            Endpoint::Tcp {
                host, port, tls, ..
            },
            deadline,
        ),
        Got::Open(sub, ..),
    ] = &got[..]
    else {
        panic!("{got:?}")
    };
    assert_eq!((host.as_str(), *port, *tls), ("cache.example", 6380, false));
    assert_eq!(*deadline, t.now + 5_000 * MS);
    let (cmd, sub) = (*cmd, *sub);
    assert_ne!(cmd, sub);
    t.opened(cmd);
    // The acquire waits for the handshake.
    assert_eq!(t.write(cmd), vec![vec![b"HELLO".to_vec(), b"3".to_vec()]]);
    assert!(!t.s.is_ready(Connection::Commands));
    t.recv(cmd, HELLO_REPLY);
    assert!(t.s.is_ready(Connection::Commands));
    let cmds = t.write(cmd);
    assert!(cmds.len() == 1 && is_acquire(&cmds[0]), "{cmds:?}");
    t.recv(cmd, GRANTED);
    assert_eq!(t.fence(), Some(42));
}

#[test]
fn bytes_split_anywhere() {
    let mut t = T::new("redis://h");
    t.acquire(0);
    let opens = t.opens();
    t.opened(opens[0]);
    t.io();
    for b in HELLO_REPLY {
        t.recv(opens[0], &[*b]);
    }
    assert!(is_acquire(&t.write(opens[0])[0]));
    for b in GRANTED {
        t.recv(opens[0], &[*b]);
    }
    assert_eq!(t.fence(), Some(42));
}

#[test]
fn close_mid_reply_fails_the_request_and_reopens_after_a_backoff() {
    let mut t = T::new("redis://h");
    t.acquire(5_000);
    let (cmd, _sub) = t.ready_commands();
    assert!(is_acquire(&t.write(cmd)[0]));
    t.recv(cmd, b"*3\r\n:1\r\n");
    let closed_at = t.now;
    t.closed(cmd, "connection reset by peer");
    assert_eq!(t.s.protocol().counters().transport_failures, 1);
    assert!(
        t.s.last_error().contains("connection reset by peer"),
        "{}",
        t.s.last_error()
    );
    // Late bytes for the old stream are ignored.
    t.recv(cmd, b":42\r\n:3000\r\n");
    assert_eq!(t.s.counters().late_answers, 1);
    assert_eq!(t.fence(), None);
    // The engine retries; the new stream waits for the backoff.
    let mut reopened = None;
    while reopened.is_none() && t.tick(2_000 * MS) {
        for g in t.io() {
            if let Got::Open(s, ..) = g {
                reopened = Some(s);
            }
        }
    }
    let stream = reopened.expect("reopened");
    assert!(stream > cmd);
    assert!(
        t.now - closed_at >= 12 * MS,
        "reopened after {} ns",
        t.now - closed_at
    );
    t.opened(stream);
    t.io();
    t.recv(stream, HELLO_REPLY);
    let cmds = t.write(stream);
    assert!(is_acquire(&cmds[0]), "{cmds:?}");
    t.recv(stream, GRANTED);
    assert_eq!(t.fence(), Some(42));
}

#[test]
fn while_the_commands_connection_backs_off_requests_fail_at_once_and_waits_end_on_time() {
    let mut t = T::new("redis://h");
    t.acquire(5_000);
    let opens = t.opens();
    t.closed(opens[0], "connection refused");
    let failures = t.s.protocol().counters().transport_failures;
    assert_eq!(failures, 1);
    // Another acquire during the backoff: its request fails now (no open, no wait behind
    // the reopen), with the connection's reason.
    let b = t
        .core
        .acquire(t.now, "b", AcquireOptions::new(3_000).wait_ns(300 * MS))
        .unwrap();
    let started = t.now;
    assert!(!t.io().iter().any(|g| matches!(g, Got::Open(..))));
    assert_eq!(t.s.protocol().counters().transport_failures, failures + 1);
    assert!(
        t.s.last_error().contains("connection refused"),
        "{}",
        t.s.last_error()
    );
    // Its wait ends at its deadline although no connection opened.
    let mut failed_at = None;
    while failed_at.is_none() && t.tick(1_000 * MS) {
        for g in t.io() {
            if let Got::Open(s, ..) = g {
                t.closed(s, "connection refused");
            }
        }
        for e in t.events() {
            if matches!(e, Event::AcquireFailed { lease, .. } if lease == b) {
                failed_at = Some(t.now);
            }
        }
    }
    let took = failed_at.expect("the acquire failed") - started;
    assert!(
        took <= 300 * MS + 5 * MS,
        "ended {} ms after it started",
        took / MS
    );
}

#[test]
fn garbage_closes_the_stream_and_reopens() {
    let mut t = T::new("redis://h");
    t.acquire(5_000);
    let (cmd, _) = t.ready_commands();
    t.io();
    t.recv(cmd, b"?garbage\r\n");
    assert_eq!(t.io(), vec![Got::Shutdown(cmd)]);
    assert_eq!(t.s.protocol().counters().transport_failures, 1);
    assert_eq!(t.s.counters().closes, 1);
    let mut reopened = false;
    while !reopened && t.tick(2_000 * MS) {
        reopened = t.io().iter().any(|g| matches!(g, Got::Open(..)));
    }
    assert!(reopened);
}

#[test]
fn noscript_loads_and_retries() {
    let mut t = T::new("redis://h");
    t.acquire(0);
    let (cmd, _) = t.ready_commands();
    assert!(is_acquire(&t.write(cmd)[0]));
    t.recv(cmd, b"-NOSCRIPT No matching script. Please use EVAL.\r\n");
    let cmds = t.write(cmd);
    assert_eq!(cmds[0][0], b"EVAL");
    assert_eq!(cmds[0][1], Script::Acquire.text().as_bytes());
    assert_eq!(t.s.protocol().counters().noscript_retries, 1);
    t.recv(cmd, GRANTED);
    assert_eq!(t.fence(), Some(42));
}

#[test]
fn subscriber_resubscribes_after_a_reopen() {
    let mut t = T::new("unix:///run/redis.sock?db=3");
    t.s.handle_timeout(&mut t.core, t.now);
    let opens = t.opens();
    assert_eq!(opens.len(), 1, "only the subscriber opens at first");
    let sub = opens[0];
    t.opened(sub);
    let hello = t.write(sub);
    assert_eq!(hello[1], vec![b"SELECT".to_vec(), b"3".to_vec()]);
    t.recv(sub, HELLO_REPLY);
    t.recv(sub, b"+OK\r\n");
    let cmds = t.write(sub);
    assert_eq!(cmds[0][0], b"SUBSCRIBE");
    let wake = cmds[0][1].clone();
    let mut confirm = format!(">3\r\n$9\r\nsubscribe\r\n${}\r\n", wake.len()).into_bytes();
    confirm.extend_from_slice(&wake);
    confirm.extend_from_slice(b"\r\n:1\r\n");
    t.recv(sub, &confirm);
    assert!(t.s.protocol().is_subscribed());
    assert_eq!(t.s.protocol().counters().stale_replies, 0);

    t.closed(sub, "");
    assert!(!t.s.protocol().is_subscribed());
    assert_eq!(t.s.protocol().counters().subscriber_losses, 1);
    let mut reopened = None;
    while reopened.is_none() && t.tick(2_000 * MS) {
        reopened = t.io().iter().find_map(|g| match g {
            Got::Open(s, Endpoint::Unix { path }, _) if path == "/run/redis.sock" => Some(*s),
            _ => None,
        });
    }
    let sub2 = reopened.expect("the subscriber reopens");
    t.opened(sub2);
    t.io();
    t.recv(sub2, HELLO_REPLY);
    t.recv(sub2, b"+OK\r\n");
    assert_eq!(
        t.write(sub2),
        vec![vec![b"SUBSCRIBE".to_vec(), wake.clone()]]
    );
    t.recv(sub2, &confirm);
    assert!(t.s.protocol().is_subscribed());
    assert_eq!(t.s.protocol().counters().subscriptions, 2);
}

#[test]
fn an_open_past_its_deadline_is_shut_down_and_retried() {
    let mut t = T::new("redis://h");
    t.acquire(20_000);
    let opens = t.opens();
    let start = t.now;
    let mut got = Vec::new();
    while t.now < start + 5_000 * MS && t.tick(6_000 * MS) {
        got.extend(t.io());
    }
    assert!(got.contains(&Got::Shutdown(opens[0])), "{got:?}");
    assert!(got.contains(&Got::Shutdown(opens[1])), "{got:?}");
    assert!(
        t.s.last_error().contains("did not open in time"),
        "{}",
        t.s.last_error()
    );
    // A refused open (the host's report) backs off too, longer each time.
    let mut gaps = Vec::new();
    let mut last = t.now;
    for _ in 0..4 {
        let mut next = None;
        while next.is_none() && t.tick(10_000 * MS) {
            next = t.io().iter().find_map(|g| match g {
                Got::Open(s, ..) => Some(*s),
                _ => None,
            });
        }
        let s = next.expect("reopens");
        gaps.push(t.now - last);
        last = t.now;
        t.closed(s, "connection refused");
    }
    assert!(gaps[3] > gaps[1], "backoff grows: {gaps:?}");
}

#[test]
fn a_client_polled_before_any_input_opens_once_it_has_a_clock() {
    let mut t = T::new("redis://h");
    t.now = 7_000 * MS;
    // The core has seen no time: no open yet, and a deadline due at once.
    assert_eq!(t.io(), vec![]);
    assert_eq!(t.s.poll_timeout(&mut t.core), Some(0));
    t.s.handle_timeout(&mut t.core, t.now);
    let got = t.io();
    assert!(
        matches!(&got[..], [Got::Open(_, _, deadline)] if *deadline == t.now + 5_000 * MS),
        "{got:?}"
    );
}

#[test]
fn unknown_and_late_streams() {
    let mut t = T::new("redis://h");
    assert_eq!(
        t.s.handle_opened(&mut t.core, t.now, 1),
        Err(StreamError::Unknown(1))
    );
    t.s.handle_timeout(&mut t.core, t.now);
    let sub = t.opens()[0];
    assert_eq!(
        t.s.handle_received(&mut t.core, t.now, sub, b"+OK\r\n"),
        Err(StreamError::NotOpen(sub))
    );
    for bad in [0, sub + 1, u64::MAX] {
        assert_eq!(
            t.s.handle_closed(&mut t.core, t.now, bad, ""),
            Err(StreamError::Unknown(bad))
        );
    }
    t.closed(sub, "refused");
    // Everything about a closed stream is late, never an error.
    t.opened(sub);
    t.recv(sub, b"+OK\r\n");
    t.closed(sub, "");
    assert_eq!(t.s.counters().late_answers, 3);
}

#[test]
fn time_running_backwards_is_clamped() {
    let mut t = T::new("redis://h");
    t.now = 10_000 * MS;
    t.acquire(0);
    let (cmd, _) = t.ready_commands();
    t.io();
    t.now = MS;
    t.recv(cmd, GRANTED);
    assert_eq!(t.fence(), Some(42));
    assert_eq!(t.core.now(), 10_000 * MS);
    let deadline = t.s.poll_timeout(&mut t.core).unwrap();
    assert!(deadline > 10_000 * MS);
}

#[test]
fn bad_settings_are_refused() {
    let p = || RedisProtocol::new(RedisOptions::default(), [7; 16]).unwrap();
    let err = RedisStream::new(p(), "redis+cluster://h", StreamSettings::default()).unwrap_err();
    assert!(err.to_string().contains("needs sharded wake-ups"), "{err}");
    let settings = StreamSettings {
        client_name: Some(b"has space".to_vec()),
        ..StreamSettings::default()
    };
    assert!(RedisStream::new(p(), "redis://h", settings).is_err());
    let settings = StreamSettings {
        connect_timeout_ns: 0,
        ..StreamSettings::default()
    };
    assert!(RedisStream::new(p(), "redis://h", settings).is_err());
}

/// Ticks until `lease` fails (at most `limit` ns of deadlines), answering every open with
/// `refuse`'s reason when given; the time it failed.
fn until_failed(t: &mut T, lease: crate::LeaseId, limit: u64, refuse: Option<&str>) -> u64 {
    loop {
        for g in t.io() {
            if let (Got::Open(s, ..), Some(why)) = (g, refuse) {
                t.closed(s, why);
            }
        }
        if t.events()
            .iter()
            .any(|e| matches!(e, Event::AcquireFailed { lease: l, .. } if *l == lease))
        {
            return t.now;
        }
        assert!(t.tick(limit), "no deadline left and {lease:?} did not fail");
    }
}

#[test]
fn an_acquire_that_never_left_owes_no_cleanup() {
    // Every open refused: no acquire was ever written, so nothing can be granted and no
    // cleanup release is owed (a client closing now has nothing to wait for).
    let mut t = T::new("redis://h");
    let a = t.acquire(300);
    until_failed(&mut t, a, 1_000 * MS, Some("connection refused"));
    assert_eq!(t.core.counters().pending_cleanups, 0);
    // The contrast: an acquire that was written and got no answer may have been granted.
    let mut t = T::new("redis://h");
    let b = t.acquire(300);
    let (cmd, _) = t.ready_commands();
    assert!(t.write(cmd).iter().any(|c| is_acquire(c)));
    t.closed(cmd, "connection reset");
    until_failed(&mut t, b, 1_000 * MS, Some("connection refused"));
    assert_eq!(t.core.counters().pending_cleanups, 1);
}

#[test]
fn an_acquire_held_behind_the_handshake_owes_no_cleanup() {
    // The connection opens and HELLO goes out, but the server ends it before answering (a
    // TLS 1.3 server refusing the client's certificate does so after the TLS handshake):
    // the acquire queued behind HELLO was never written, so no cleanup release is owed.
    let mut t = T::new("redis://h");
    let a = t.acquire(300);
    let opens = t.opens();
    let cmd = opens[0];
    t.opened(cmd);
    assert_eq!(t.write(cmd), vec![vec![b"HELLO".to_vec(), b"3".to_vec()]]);
    t.closed(cmd, "certificate required");
    until_failed(&mut t, a, 1_000 * MS, Some("connection refused"));
    assert_eq!(t.core.counters().pending_cleanups, 0);
}

#[test]
fn an_acquire_whose_caller_gave_up_is_dropped_before_the_connection_opens() {
    // The open hangs (5 s connect deadline) past the caller's 100 ms bound, and the caller
    // gives the lease back (what a binding's acquire does at its deadline): the acquire
    // waiting for the connection is dropped, so no cleanup waits for the connect, and the
    // connection that opens later never sends it.
    let mut t = T::new("redis://h");
    let a = t.acquire(100);
    let opens = t.opens();
    t.now += 100 * MS;
    t.core.release(t.now, a).unwrap();
    let failed = until_failed(&mut t, a, 1_000 * MS, None);
    assert_eq!(failed, t.now);
    // Past the request timeout: an attempt still queued would now be uncertain and owe a
    // cleanup release (which would hold a closing client until its bound).
    let end = t.now + 4_000 * MS;
    while t.now < end && t.tick(end - t.now) {
        assert!(t.io().is_empty());
    }
    assert_eq!(t.core.counters().pending_cleanups, 0);
    assert!(
        t.s.last_error().contains("no connection opened"),
        "{}",
        t.s.last_error()
    );
    t.opened(opens[0]);
    let sent = t.write(opens[0]);
    assert!(!sent.iter().any(|c| is_acquire(c)), "{sent:?}");
}

/// Polls as a host makes them between inputs: they find nothing (and so skip the routing).
fn idle_polls(t: &mut T) {
    for _ in 0..3 {
        assert!(!t.s.has_request(&mut t.core));
        assert_eq!(t.io(), vec![]);
        t.s.poll_timeout(&mut t.core);
    }
    // The routes skipped: no input since a route that did nothing, no request waiting.
    assert!(!t.s.unrouted);
    assert!(t.s.links.iter().all(|l| l.waiting.is_empty()));
}

/// Opens and handshakes the subscriber `sub`, subscribed to the wake channel.
fn ready_subscriber(t: &mut T, sub: u64) {
    t.opened(sub);
    assert_eq!(t.write(sub), vec![vec![b"HELLO".to_vec(), b"3".to_vec()]]);
    t.recv(sub, HELLO_REPLY);
    let cmds = t.write(sub);
    assert_eq!(cmds[0][0], b"SUBSCRIBE");
    let wake = &cmds[0][1];
    let mut confirm = format!(">3\r\n$9\r\nsubscribe\r\n${}\r\n", wake.len()).into_bytes();
    confirm.extend_from_slice(wake);
    confirm.extend_from_slice(b"\r\n:1\r\n");
    t.recv(sub, &confirm);
    assert!(t.s.protocol().is_subscribed());
}

/// A client with both connections ready and a lease granted, polled idle; the commands
/// stream.
fn granted_then_idle(t: &mut T) -> (crate::LeaseId, u64) {
    let lease = t.acquire(0);
    let (cmd, sub) = t.ready_commands();
    assert!(is_acquire(&t.write(cmd)[0]));
    ready_subscriber(t, sub);
    t.recv(cmd, GRANTED);
    assert_eq!(t.fence(), Some(42));
    idle_polls(t);
    (lease, cmd)
}

#[test]
fn a_command_the_engine_queues_after_idle_polls_is_routed_at_the_same_clock() {
    let mut t = T::new("redis://h");
    let (lease, cmd) = granted_then_idle(&mut t);
    t.core.release(t.now, lease).unwrap();
    assert!(t.s.has_request(&mut t.core));
    let cmds = t.write(cmd);
    assert!(
        cmds.len() == 1 && cmds[0][1] == Script::Release.sha1_hex(),
        "{cmds:?}"
    );
    t.events();
    idle_polls(&mut t);
    // Another lease, taken from the engine by an event poll before any route.
    t.core
        .acquire(t.now, "b", AcquireOptions::new(3_000))
        .unwrap();
    t.events();
    let cmds = t.write(cmd);
    assert!(cmds.len() == 1 && is_acquire(&cmds[0]), "{cmds:?}");
}

#[test]
fn a_reply_after_idle_polls_unblocks_what_it_queues() {
    let mut t = T::new("redis://h");
    let (_, cmd) = granted_then_idle(&mut t);
    t.core
        .acquire(t.now, "b", AcquireOptions::new(3_000))
        .unwrap();
    assert!(is_acquire(&t.write(cmd)[0]));
    idle_polls(&mut t);
    t.recv(cmd, b"-NOSCRIPT No matching script. Please use EVAL.\r\n");
    let cmds = t.write(cmd);
    assert_eq!(cmds[0][0], b"EVAL");
    // The handshake's reply, too, sends what waited for it. The acquire waits for the
    // connection meanwhile, so these polls route in full rather than skip.
    let mut t = T::new("redis://h");
    t.acquire(0);
    let cmd = t.opens()[0];
    t.opened(cmd);
    assert_eq!(t.write(cmd), vec![vec![b"HELLO".to_vec(), b"3".to_vec()]]);
    for _ in 0..3 {
        assert!(!t.s.has_request(&mut t.core));
        assert!(t.s.links.iter().any(|l| !l.waiting.is_empty()));
    }
    t.recv(cmd, HELLO_REPLY);
    assert!(is_acquire(&t.write(cmd)[0]));
}

#[test]
fn a_close_after_idle_polls_is_noticed_at_the_same_clock() {
    let mut t = T::new("redis://h");
    let (_, cmd) = granted_then_idle(&mut t);
    t.closed(cmd, "connection reset by peer");
    assert!(!t.s.is_ready(Connection::Commands));
    // Nothing goes to the closed stream: a new acquire fails during the backoff.
    let failures = t.s.protocol().counters().transport_failures;
    t.core
        .acquire(t.now, "b", AcquireOptions::new(3_000))
        .unwrap();
    assert_eq!(t.io(), vec![]);
    assert_eq!(t.s.protocol().counters().transport_failures, failures + 1);
    // The reopen is due after the backoff, without another input.
    let due = t.s.poll_timeout(&mut t.core).expect("a reopen is due");
    assert!(due > t.now, "{due}");
}
