//! Sentinel discovery against scripted sentinels and servers: the test reads what the core
//! writes and answers with hand-written RESP bytes (the harness of `stream_tests.rs`).

use super::super::tests::{GRANTED, Got, HELLO_REPLY, T, is_acquire};
use super::super::types::{ROUND_BACKOFF_BASE, ROUND_BACKOFF_CAP};
use super::*;
use crate::Event;
use crate::backend::outbox::MS;
use crate::backend::redis::Connection;
use crate::backend::redis::stream::StreamError;

const ADDR_6380: &[u8] = b"*2\r\n$9\r\n127.0.0.1\r\n$4\r\n6380\r\n";
const SUBSCRIBED: &[u8] = b">3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n";
const ROLE_MASTER: &[u8] = b"*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n";
const ROLE_REPLICA: &[u8] =
    b"*5\r\n$5\r\nslave\r\n$9\r\n127.0.0.1\r\n:6381\r\n$9\r\nconnected\r\n:0\r\n";

fn tcp(host: &str, port: u16) -> Endpoint {
    Endpoint::Tcp {
        host: host.into(),
        port,
        tls: false,
        server_name: host.into(),
    }
}

fn words(w: &[&str]) -> Vec<Vec<u8>> {
    w.iter().map(|w| w.as_bytes().to_vec()).collect()
}

/// The one open queued now, to `to`.
fn open_to(t: &mut T, to: &Endpoint) -> u64 {
    let got = t.io();
    match &got[..] {
        [Got::Open(s, e, _)] if e == to => *s,
        _ => panic!("expected one open to {to:?}: {got:?}"),
    }
}

fn push_message(channel: &str, payload: &str) -> Vec<u8> {
    format!(
        ">3\r\n$7\r\nmessage\r\n${}\r\n{channel}\r\n${}\r\n{payload}\r\n",
        channel.len(),
        payload.len()
    )
    .into_bytes()
}

/// Sentinel stream `s` (just asked for) opens, asks for `mymaster` and gets `reply`.
fn sentinel_answers(t: &mut T, s: u64, reply: &[u8]) {
    t.opened(s);
    assert_eq!(t.write(s), vec![words(&["HELLO", "3"])]);
    t.recv(s, HELLO_REPLY);
    assert_eq!(
        t.write(s),
        vec![words(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"])]
    );
    t.recv(s, reply);
}

/// After the sentinel named `master`: it subscribes, and both links open there.
fn links_open(t: &mut T, s: u64, master: &Endpoint) -> (u64, u64) {
    let got = t.io();
    match &got[..] {
        [
            Got::Write(w, cmds),
            Got::Open(cmd, a, _),
            Got::Open(sub, b, _),
        ] if *w == s && a == master && b == master => {
            assert_eq!(cmds, &vec![words(&["SUBSCRIBE", "+switch-master"])]);
            (*cmd, *sub)
        }
        _ => panic!("expected the watch and two opens to {master:?}: {got:?}"),
    }
}

/// A client whose acquire went to the master the sentinel named, after ROLE said master.
/// Streams: the sentinel, commands, subscriber (not opened yet).
fn established() -> (T, u64, u64, u64) {
    let mut t = T::new("redis+sentinel://s1:1,s2:2/mymaster");
    t.acquire(0);
    let s = open_to(&mut t, &tcp("s1", 1));
    sentinel_answers(&mut t, s, ADDR_6380);
    let (cmd, sub) = links_open(&mut t, s, &tcp("127.0.0.1", 6380));
    t.recv(s, SUBSCRIBED);
    t.opened(cmd);
    assert_eq!(t.write(cmd), vec![words(&["HELLO", "3"])]);
    t.recv(cmd, HELLO_REPLY);
    // Nothing but ROLE before the server says it is the master.
    assert_eq!(t.write(cmd), vec![words(&["ROLE"])]);
    assert!(!t.s.is_ready(Connection::Commands));
    t.recv(cmd, ROLE_MASTER);
    assert!(t.s.is_ready(Connection::Commands));
    let cmds = t.write(cmd);
    assert!(cmds.len() == 1 && is_acquire(&cmds[0]), "{cmds:?}");
    (t, s, cmd, sub)
}

fn discovery(t: &T) -> &Discovery {
    t.s.sentinel.as_deref().expect("a Sentinel client")
}

#[test]
fn the_master_is_asked_for_and_checked_with_role_before_use() {
    let (mut t, ..) = established();
    let cmd = t.s.links[0].stream;
    t.recv(cmd, GRANTED);
    assert_eq!(t.fence(), Some(42));
    assert_eq!(discovery(&t).master(), Some(&tcp("127.0.0.1", 6380)));
    assert!(discovery(&t).watching);
}

#[test]
fn the_sentinels_get_no_credentials_the_master_does() {
    let mut t = T::new("redis+sentinel://u:pw@s1:1/mymaster/3");
    assert_eq!(t.s.url().database, 3);
    t.acquire(0);
    let s = open_to(&mut t, &tcp("s1", 1));
    sentinel_answers(&mut t, s, ADDR_6380);
    let (cmd, _) = links_open(&mut t, s, &tcp("127.0.0.1", 6380));
    t.opened(cmd);
    let hello = t.write(cmd);
    assert_eq!(
        hello,
        vec![
            words(&["HELLO", "3", "AUTH", "u", "pw"]),
            words(&["SELECT", "3"])
        ]
    );
}

#[test]
fn a_sentinel_that_is_down_or_answers_garbage_is_skipped() {
    let mut t = T::new("redis+sentinel://s1:1,s2:2/mymaster");
    t.acquire(10_000);
    let s = open_to(&mut t, &tcp("s1", 1));
    t.closed(s, "connection refused");
    // The next sentinel at once.
    let s = open_to(&mut t, &tcp("s2", 2));
    sentinel_answers(&mut t, s, b":5\r\n");
    assert_eq!(t.io(), vec![Got::Shutdown(s)]);
    assert!(
        discovery(&t).last_error.contains("sentinel s2:2")
            && discovery(&t).last_error.contains("malformed"),
        "{}",
        discovery(&t).last_error
    );
    // Every sentinel failed: the next round waits for its backoff.
    let before = t.now;
    assert!(t.tick(ROUND_BACKOFF_BASE));
    assert_eq!(t.now, before + ROUND_BACKOFF_BASE);
    let garbage: [&[u8]; 5] = [
        b"*2\r\n$0\r\n\r\n$4\r\n6380\r\n",
        b"*2\r\n$1\r\nh\r\n$5\r\n99999\r\n",
        b"*3\r\n$1\r\nh\r\n$1\r\n1\r\n$1\r\nx\r\n",
        b"-ERR unknown subcommand\r\n",
        b"?not resp\r\n",
    ];
    let mut at = 1;
    for bytes in garbage {
        let to = if at == 1 { tcp("s1", 1) } else { tcp("s2", 2) };
        let mut got = t.io();
        got.retain(|g| !matches!(g, Got::Shutdown(_)));
        if got.is_empty() {
            assert!(t.tick(ROUND_BACKOFF_CAP));
            got = t.io();
        }
        let s = match got[..] {
            [Got::Open(s, ref e, _)] if *e == to => s,
            ref other => panic!("{other:?}"),
        };
        sentinel_answers(&mut t, s, bytes);
        assert!(
            discovery(&t).master().is_none() && discovery(&t).stream() != s,
            "{bytes:?}"
        );
        at = 3 - at;
    }
    // The links still wait: nothing was opened to a master.
    assert!(
        t.s.links
            .iter()
            .all(|l| matches!(l.state, State::Resolving { .. }))
    );
}

#[test]
fn an_unknown_master_name_is_a_clear_error() {
    let mut t = T::new("redis+sentinel://s1:1/nosuch");
    t.acquire(0);
    let s = open_to(&mut t, &tcp("s1", 1));
    t.opened(s);
    t.io();
    t.recv(s, HELLO_REPLY);
    t.io();
    // RESP3 null: the sentinel monitors no such master.
    t.recv(s, b"_\r\n");
    while t.tick(10_000 * MS) {
        if let Some(Got::Open(s, ..)) = t.io().first() {
            let s = *s;
            t.opened(s);
            t.io();
            t.recv(s, HELLO_REPLY);
            t.io();
            t.recv(s, b"*-1\r\n");
        }
        if t.events()
            .iter()
            .any(|e| matches!(e, Event::AcquireFailed { .. }))
        {
            let err = t.s.last_error().to_owned();
            assert!(
                err.contains("sentinel s1:1: the sentinel knows no master named \"nosuch\""),
                "{err}"
            );
            return;
        }
    }
    panic!("the acquire never failed");
}

#[test]
fn a_replica_is_dropped_and_the_sentinels_are_asked_again() {
    let mut t = T::new("redis+sentinel://s1:1/mymaster");
    t.acquire(10_000);
    let s = open_to(&mut t, &tcp("s1", 1));
    sentinel_answers(&mut t, s, ADDR_6380);
    let (cmd, _sub) = links_open(&mut t, s, &tcp("127.0.0.1", 6380));
    t.recv(s, SUBSCRIBED);
    t.opened(cmd);
    t.io();
    t.recv(cmd, HELLO_REPLY);
    assert_eq!(t.write(cmd), vec![words(&["ROLE"])]);
    t.recv(cmd, ROLE_REPLICA);
    let got = t.io();
    // The link goes, and so does the watch: a fresh connection asks again.
    assert!(got.contains(&Got::Shutdown(cmd)), "{got:?}");
    assert!(got.contains(&Got::Shutdown(s)), "{got:?}");
    let again = match got.last() {
        Some(Got::Open(again, e, _)) if *e == tcp("s1", 1) => *again,
        _ => panic!("{got:?}"),
    };
    assert!(
        t.s.last_error().contains("not the master"),
        "{}",
        t.s.last_error()
    );
    // The acquire still waits: it was never sent to the replica.
    assert!(
        t.s.links[0]
            .waiting
            .iter()
            .any(|(_, a)| a[0].as_ref() == b"EVALSHA")
    );
    assert_eq!(t.s.counters().sentinel_lookups, 1);
    sentinel_answers(&mut t, again, b"*2\r\n$9\r\n127.0.0.1\r\n$4\r\n6381\r\n");
    assert_eq!(t.s.counters().sentinel_lookups, 2, "asked again");
    let got = t.io();
    let to_new = got
        .iter()
        .filter(|g| matches!(g, Got::Open(_, e, _) if *e == tcp("127.0.0.1", 6381)))
        .count();
    assert_eq!(
        to_new, 2,
        "both links go to the new master at once: {got:?}"
    );
}

#[test]
fn switch_master_moves_the_links() {
    let (mut t, s, cmd, sub) = established();
    // Not ours, or garbled: nothing moves.
    t.recv(
        s,
        &push_message("+switch-master", "other 1.1.1.1 1 2.2.2.2 2"),
    );
    t.recv(s, &push_message("+switch-master", "mymaster 127.0.0.1"));
    t.recv(s, &push_message("+switch-master", "mymaster a 1 b 0"));
    assert_eq!(t.io(), vec![]);
    t.recv(
        s,
        &push_message("+switch-master", "mymaster 127.0.0.1 6380 127.0.0.1 6381"),
    );
    let got = t.io();
    let new = tcp("127.0.0.1", 6381);
    assert!(
        got.contains(&Got::Shutdown(cmd)) && got.contains(&Got::Shutdown(sub)),
        "{got:?}"
    );
    let opens: Vec<&Got> = got.iter().filter(|g| matches!(g, Got::Open(..))).collect();
    assert!(
        !opens.is_empty()
            && opens
                .iter()
                .all(|g| matches!(g, Got::Open(_, e, _) if *e == new)),
        "{got:?}"
    );
    // The watch stays.
    assert!(!got.contains(&Got::Shutdown(s)));
    assert_eq!(discovery(&t).master(), Some(&new));
}

/// Ticks until the core asks for IO, within `limit` ns; what it asked (empty: nothing).
fn next_io(t: &mut T, limit: u64) -> Vec<Got> {
    let end = t.now + limit;
    loop {
        let got = t.io();
        if !got.is_empty() || !t.tick(end.saturating_sub(t.now)) {
            return got;
        }
    }
}

#[test]
fn an_idle_watch_is_pinged_and_a_silent_sentinel_is_left() {
    let (mut t, s, cmd, sub) = established();
    // Held elsewhere, no wait: the waiter leaves the queue, and then nothing more goes on
    // the links (no lease).
    t.recv(cmd, b"*2\r\n:0\r\n:1000\r\n");
    let leave = t.write(cmd);
    assert!(leave.len() == 1 && leave[0][0] == b"EVALSHA", "{leave:?}");
    t.recv(cmd, b":1\r\n");
    t.opened(sub);
    assert_eq!(t.write(sub), vec![words(&["HELLO", "3"])]);
    t.recv(sub, HELLO_REPLY);
    assert_eq!(t.write(sub), vec![words(&["ROLE"])]);
    t.recv(sub, ROLE_MASTER);
    let subscribe = t.write(sub);
    assert_eq!(subscribe.len(), 1);
    assert_eq!(subscribe[0][0], b"SUBSCRIBE");
    let channel = String::from_utf8(subscribe[0][1].clone()).unwrap();
    let confirmed = format!(
        ">3\r\n$9\r\nsubscribe\r\n${}\r\n{channel}\r\n:1\r\n",
        channel.len()
    );
    t.recv(sub, confirmed.as_bytes());
    assert_eq!(t.io(), vec![]);
    // Answered PINGs: one a second, and the watch stays.
    for _ in 0..3 {
        let before = t.now;
        assert_eq!(
            next_io(&mut t, 10_000 * MS),
            vec![Got::Write(s, vec![words(&["PING"])])]
        );
        assert!(t.now - before <= WATCH_PING_NS, "{} ns", t.now - before);
        t.recv(s, b"+PONG\r\n");
        assert_eq!(t.io(), vec![]);
    }
    // An error reply shows the connection alive too.
    assert_eq!(
        next_io(&mut t, 10_000 * MS),
        vec![Got::Write(s, vec![words(&["PING"])])]
    );
    t.recv(
        s,
        b"-NOPERM this user has no permissions to run the 'ping' command\r\n",
    );
    assert_eq!(t.io(), vec![]);
    assert!(discovery(&t).watching);
    // A PING left unanswered: at the request timeout the watch ends and the next sentinel
    // is asked (the links stay on the master meanwhile).
    assert_eq!(
        next_io(&mut t, 10_000 * MS),
        vec![Got::Write(s, vec![words(&["PING"])])]
    );
    let sent = t.now;
    let got = next_io(&mut t, 10_000 * MS);
    assert_eq!(t.now - sent, StreamSettings::default().request_timeout_ns);
    assert!(got.contains(&Got::Shutdown(s)), "{got:?}");
    assert!(
        matches!(got.last(), Some(Got::Open(_, e, _)) if *e == tcp("s2", 2)),
        "{got:?}"
    );
    assert!(!got.contains(&Got::Shutdown(cmd)) && !got.contains(&Got::Shutdown(sub)));
    assert!(!discovery(&t).watching);
    assert!(
        discovery(&t).last_error.contains("sentinel s1:1"),
        "{}",
        discovery(&t).last_error
    );
}

#[test]
fn readonly_drops_the_link_and_asks_again() {
    let (mut t, s, cmd, _) = established();
    t.recv(
        cmd,
        b"-READONLY You can't write against a read only replica.\r\n",
    );
    let got = t.io();
    assert!(
        got.contains(&Got::Shutdown(cmd)) && got.contains(&Got::Shutdown(s)),
        "{got:?}"
    );
    assert!(matches!(got.last(), Some(Got::Open(_, e, _)) if *e == tcp("s1", 1)));
    assert!(discovery(&t).master().is_none());
}

#[test]
fn replies_are_read_without_panics() {
    let name = "m";
    let bulk = |b: &[u8]| Reply::Bulk(b.to_vec());
    assert_eq!(
        master_addr(&Reply::Array(vec![bulk(b"h"), bulk(b"1")]), name),
        Ok(tcp("h", 1))
    );
    assert_eq!(
        master_addr(&Reply::Nil, name),
        Err(SentinelError::UnknownMaster("m".into()))
    );
    for bad in [
        Reply::Int(1),
        Reply::Array(vec![]),
        Reply::Array(vec![bulk(b"h")]),
        Reply::Array(vec![bulk(b"h"), Reply::Int(1)]),
        Reply::Array(vec![bulk(b"h"), bulk(b"0")]),
        Reply::Array(vec![bulk(b"h"), bulk(b"65536")]),
        Reply::Array(vec![bulk(b"h h"), bulk(b"1")]),
        Reply::Array(vec![bulk(b"\xff"), bulk(b"1")]),
        Reply::Array(vec![bulk(&[b'h'; 256]), bulk(b"1")]),
        Reply::Array(vec![bulk(b""), bulk(b"1")]),
    ] {
        assert!(
            matches!(master_addr(&bad, name), Err(SentinelError::Malformed(_))),
            "{bad:?}"
        );
    }
    assert_eq!(
        switch_master(b"m 1.1.1.1 1 2.2.2.2 2", name),
        Ok(Some(tcp("2.2.2.2", 2)))
    );
    assert_eq!(switch_master(b"n 1.1.1.1 1 2.2.2.2 2", name), Ok(None));
    assert!(switch_master(b"m 1.1.1.1 1 2.2.2.2", name).is_err());
    assert!(switch_master(b"m 1 1 h x", name).is_err());
    assert!(switch_master(b"", name).is_err());
    assert_eq!(
        check_role(&Reply::Array(vec![bulk(b"master"), Reply::Int(0)])),
        Ok(())
    );
    assert_eq!(
        check_role(&Reply::Array(vec![bulk(b"sentinel")])),
        Err(SentinelError::NotMaster("sentinel".into()))
    );
    for bad in [
        Reply::Nil,
        Reply::Array(vec![]),
        Reply::Array(vec![Reply::Int(1)]),
    ] {
        assert_eq!(check_role(&bad), Err(SentinelError::BadRole));
    }
}

#[test]
fn late_and_early_answers_on_the_sentinel_stream() {
    let mut t = T::new("redis+sentinel://s1:1/mymaster");
    t.acquire(0);
    let s = open_to(&mut t, &tcp("s1", 1));
    // Bytes before the open was reported.
    assert_eq!(
        t.s.handle_received(&mut t.core, t.now, s, b"+OK\r\n"),
        Err(StreamError::NotOpen(s))
    );
    t.closed(s, "refused");
    let late = t.s.counters().late_answers;
    t.opened(s);
    assert_eq!(t.s.counters().late_answers, late + 1);
}
