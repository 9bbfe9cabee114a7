//! Redis Cluster on the stream path against scripted nodes: slot arithmetic, topology
//! replies (good and garbage), and a client that learns the table, follows `MOVED` and `ASK`,
//! retries `TRYAGAIN`, and asks again when a node fails (the harness of `stream_tests.rs`).

use super::super::tests::{GRANTED, Got, HELLO_REPLY, T, is_acquire};
use super::*;
use crate::backend::redis::wire::Reply;
use crate::backend::redis::{RedisOptions, RedisProtocol};
use crate::{Client, Config};

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

fn bulk(s: &str) -> Reply {
    Reply::Bulk(s.as_bytes().to_vec())
}

/// RESP3 bytes of `r` (the shapes a topology reply uses).
fn resp(r: &Reply) -> Vec<u8> {
    let mut out = Vec::new();
    match r {
        Reply::Int(i) => out.extend(format!(":{i}\r\n").bytes()),
        Reply::Bulk(b) => {
            out.extend(format!("${}\r\n", b.len()).bytes());
            out.extend(b);
            out.extend(b"\r\n");
        }
        Reply::Array(items) => {
            out.extend(format!("*{}\r\n", items.len()).bytes());
            items.iter().for_each(|i| out.extend(resp(i)));
        }
        Reply::Map(pairs) => {
            out.extend(format!("%{}\r\n", pairs.len()).bytes());
            for (k, v) in pairs {
                out.extend(resp(k));
                out.extend(resp(v));
            }
        }
        other => panic!("not scripted: {other:?}"),
    }
    out
}

/// A `CLUSTER SLOTS` entry: `[first, last, [host, port]]`.
fn slots_entry(first: u16, last: u16, port: u16) -> Reply {
    Reply::Array(vec![
        Reply::Int(first.into()),
        Reply::Int(last.into()),
        Reply::Array(vec![bulk("127.0.0.1"), Reply::Int(port.into())]),
    ])
}

/// A `CLUSTER SHARDS` node, as a RESP3 map.
fn shard_node(port: u16, role: &str, health: &str, endpoint: &str) -> Reply {
    Reply::Map(vec![
        (bulk("id"), bulk("abc")),
        (bulk("port"), Reply::Int(port.into())),
        (bulk("ip"), bulk("10.0.0.9")),
        (bulk("endpoint"), bulk(endpoint)),
        (bulk("role"), bulk(role)),
        (bulk("replication-offset"), Reply::Int(7)),
        (bulk("health"), bulk(health)),
    ])
}

fn shard(slots: &[i64], nodes: Vec<Reply>) -> Reply {
    Reply::Map(vec![
        (
            bulk("slots"),
            Reply::Array(slots.iter().map(|s| Reply::Int(*s)).collect()),
        ),
        (bulk("nodes"), Reply::Array(nodes)),
    ])
}

/// RESP2's form of a map: a flat array of names and values.
fn flat(r: &Reply) -> Reply {
    match r {
        Reply::Map(pairs) => {
            Reply::Array(pairs.iter().flat_map(|(k, v)| [flat(k), flat(v)]).collect())
        }
        Reply::Array(items) => Reply::Array(items.iter().map(flat).collect()),
        other => other.clone(),
    }
}

#[test]
fn crc16_and_slots_as_redis_computes_them() {
    assert_eq!(crc16(b"123456789"), 0x31C3);
    assert_eq!(hash_slot(b"foo"), 12182);
    assert_eq!(hash_slot(b"bar"), 5061);
    assert_eq!(
        hash_slot(b"{user1000}.following"),
        hash_slot(b"{user1000}.followers")
    );
    assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
    // An empty tag hashes the whole key; the first `{` and the next `}` delimit the tag.
    assert_eq!(hash_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
    assert_eq!(hash_slot(b"foo{{bar}}zap"), hash_slot(b"{bar"));
    assert_eq!(hash_slot(b"foo{bar}{zap}"), hash_slot(b"bar"));
    // A name's keys and its shard channel share the name's slot.
    let name = hash_slot(b"jobs");
    assert_eq!(hash_slot(b"lh:{jobs}:lock"), name);
    let evalsha = words(&["EVALSHA", "x", "3", "lh:{jobs}:lock", "lh:{jobs}:fence"]);
    assert_eq!(request_slot(&evalsha), Some(name));
    assert_eq!(
        request_slot(&words(&["SSUBSCRIBE", "lh:{jobs}:wake"])),
        Some(name)
    );
    assert_eq!(request_slot(&words(&["EVAL", "return 1", "0"])), None);
    assert_eq!(request_slot(&words(&["EVAL", "return 1", "x"])), None);
    assert_eq!(request_slot::<&[u8]>(&[]), None);
}

#[test]
fn a_table_from_cluster_shards_in_resp3_and_resp2() {
    let asked = tcp("seed", 7000);
    let reply = Reply::Array(vec![
        shard(
            &[0, 100, 200, 16383],
            vec![
                shard_node(7003, "replica", "online", "127.0.0.1"),
                shard_node(7000, "master", "online", "127.0.0.1"),
            ],
        ),
        shard(
            &[101, 199],
            vec![
                // A failed master and the promoted one: the online master serves.
                shard_node(7001, "master", "fail", "127.0.0.1"),
                shard_node(7004, "master", "online", "?"),
            ],
        ),
        // A shard that serves nothing (a node being added).
        shard(&[], vec![shard_node(7009, "master", "online", "h9")]),
    ]);
    for r in [reply.clone(), flat(&reply)] {
        let t = parse_shards(&r, &asked, false).unwrap();
        assert_eq!(
            t.ranges,
            vec![
                (0, 100, tcp("127.0.0.1", 7000)),
                (200, 16383, tcp("127.0.0.1", 7000)),
                (101, 199, tcp("10.0.0.9", 7004)),
            ]
        );
        assert_eq!(
            t.nodes,
            vec![
                tcp("127.0.0.1", 7000),
                tcp("10.0.0.9", 7004),
                tcp("127.0.0.1", 7003),
                tcp("127.0.0.1", 7001),
                tcp("h9", 7009),
            ]
        );
    }
    // TLS: a node's tls-port, when it has one.
    let Reply::Map(mut node) = shard_node(7000, "master", "online", "") else {
        unreachable!()
    };
    node.push((bulk("tls-port"), Reply::Int(8000)));
    let r = Reply::Array(vec![shard(&[0, 16383], vec![Reply::Map(node)])]);
    let t = parse_shards(&r, &asked, true).unwrap();
    let Endpoint::Tcp {
        host, port, tls, ..
    } = &t.ranges[0].2
    else {
        panic!()
    };
    assert_eq!((host.as_str(), *port, *tls), ("10.0.0.9", 8000, true));
}

#[test]
fn a_table_from_cluster_slots() {
    let asked = tcp("seed", 7000);
    let r = Reply::Array(vec![
        slots_entry(0, 5460, 7000),
        Reply::Array(vec![
            Reply::Int(5461),
            Reply::Int(16383),
            // An empty host is the node asked.
            Reply::Array(vec![bulk(""), Reply::Int(7001), bulk("id")]),
            Reply::Array(vec![bulk("127.0.0.1"), Reply::Int(7004)]),
        ]),
    ]);
    let t = parse_slots(&r, &asked, false).unwrap();
    assert_eq!(
        t.ranges,
        vec![
            (0, 5460, tcp("127.0.0.1", 7000)),
            (5461, 16383, tcp("seed", 7001))
        ]
    );
    assert_eq!(t.nodes.len(), 3);
}

#[test]
fn garbage_topology_replies_are_errors() {
    let asked = tcp("seed", 7000);
    let node = |port: i64, host: &str| Reply::Array(vec![bulk(host), Reply::Int(port)]);
    let entry = |a: i64, b: i64, n: Reply| Reply::Array(vec![Reply::Int(a), Reply::Int(b), n]);
    for bad in [
        Reply::Int(3),
        Reply::Array(vec![]),
        Reply::Array(vec![Reply::Int(1)]),
        Reply::Array(vec![Reply::Array(vec![Reply::Int(0), Reply::Int(1)])]),
        Reply::Array(vec![entry(10, 5, node(7000, "h"))]),
        Reply::Array(vec![entry(0, 16384, node(7000, "h"))]),
        Reply::Array(vec![entry(-1, 5, node(7000, "h"))]),
        Reply::Array(vec![entry(0, 5, node(0, "h"))]),
        Reply::Array(vec![entry(0, 5, node(70_000, "h"))]),
        Reply::Array(vec![entry(0, 5, node(7000, "a b"))]),
        Reply::Array(vec![entry(0, 5, Reply::Int(1))]),
        Reply::Array(vec![entry(0, 5, Reply::Array(vec![bulk("h")]))]),
    ] {
        assert!(parse_slots(&bad, &asked, false).is_err(), "{bad:?}");
    }
    let good_node = shard_node(7000, "master", "online", "h");
    for bad in [
        Reply::Map(vec![]),
        Reply::Array(vec![]),
        Reply::Array(vec![Reply::Int(1)]),
        Reply::Array(vec![Reply::Array(vec![bulk("slots")])]),
        Reply::Array(vec![shard(&[0], vec![good_node.clone()])]),
        Reply::Array(vec![shard(&[5, 1], vec![good_node.clone()])]),
        Reply::Array(vec![shard(&[0, 99_999], vec![good_node.clone()])]),
        Reply::Array(vec![shard(&[0, 1], vec![Reply::Int(1)])]),
        Reply::Array(vec![shard(&[0, 1], vec![Reply::Map(vec![])])]),
        Reply::Array(vec![Reply::Map(vec![(
            bulk("slots"),
            Reply::Array(vec![]),
        )])]),
        Reply::Array(vec![shard(
            &[0, 1],
            vec![shard_node(0, "master", "online", "h")],
        )]),
    ] {
        assert!(parse_shards(&bad, &asked, false).is_err(), "{bad:?}");
    }
    let none = Reply::Array(vec![shard(
        &[0, 1],
        vec![shard_node(1, "replica", "online", "h")],
    )]);
    assert_eq!(
        parse_shards(&none, &asked, false),
        Err(ClusterError::NoSlots)
    );
}

/// A cluster client (sharded wake) on seeds s1:7000 and s2:7001.
fn cluster_t() -> T {
    cluster_with(StreamSettings::default())
}

fn cluster_with(settings: StreamSettings) -> T {
    let opts = RedisOptions {
        sharded_wake: true,
        ..RedisOptions::default()
    };
    let proto = RedisProtocol::new(opts, [7; 16]).unwrap();
    T {
        core: Client::new(Config::default(), &[9; 32]).unwrap(),
        s: RedisStream::new(proto, "redis+cluster://s1:7000,s2:7001", settings).unwrap(),
        now: MS,
    }
}

/// The one open queued now, to `to`.
fn open_to(t: &mut T, to: &Endpoint) -> u64 {
    let got = t.io();
    match &got[..] {
        [Got::Open(s, e, _)] if e == to => *s,
        _ => panic!("expected one open to {to:?}: {got:?}"),
    }
}

/// Topology stream `s` opens and is asked `CLUSTER <what>`.
fn asked(t: &mut T, s: u64, what: &str) {
    t.opened(s);
    assert_eq!(t.write(s), vec![words(&["HELLO", "3"])]);
    t.recv(s, HELLO_REPLY);
    assert_eq!(t.write(s), vec![words(&["CLUSTER", what])]);
}

/// The slot of name "a" (the harness's acquires).
fn slot_a() -> u16 {
    hash_slot(b"a")
}

/// "a" on 127.0.0.1:7001, every other slot on 127.0.0.1:7000.
fn table() -> Vec<u8> {
    let s = slot_a();
    let mut entries = vec![slots_entry(s, s, 7001)];
    if s > 0 {
        entries.push(slots_entry(0, s - 1, 7000));
    }
    if s < 16383 {
        entries.push(slots_entry(s + 1, 16383, 7000));
    }
    resp(&Reply::Array(entries))
}

/// Stream `s` opens and handshakes; what it writes next.
fn handshake(t: &mut T, s: u64) -> Vec<Vec<Vec<u8>>> {
    t.opened(s);
    assert_eq!(t.write(s), vec![words(&["HELLO", "3"])]);
    t.recv(s, HELLO_REPLY);
    t.write(s)
}

/// A link (just asked for, to `to`) opens and handshakes; its stream and what it writes.
fn link_ready(t: &mut T, to: &Endpoint) -> (u64, Vec<Vec<Vec<u8>>>) {
    let s = open_to(t, to);
    (s, handshake(t, s))
}

/// Topology stream `topo` opens, is asked `CLUSTER SHARDS`, refuses it and answers `CLUSTER
/// SLOTS` with [`table`]: it is shut down, and the request for "a" opens 7001's commands
/// link. That link's stream and what it writes after its handshake.
fn routed_to_7001(t: &mut T, topo: u64) -> (u64, Vec<Vec<Vec<u8>>>) {
    asked(t, topo, "SHARDS");
    t.recv(topo, b"-ERR unknown subcommand 'SHARDS'\r\n");
    assert_eq!(t.write(topo), vec![words(&["CLUSTER", "SLOTS"])]);
    t.recv(topo, &table());
    let got = t.io();
    let [Got::Shutdown(done), Got::Open(s, to, _)] = &got[..] else {
        panic!("{got:?}")
    };
    assert_eq!((*done, to), (topo, &tcp("127.0.0.1", 7001)));
    let s = *s;
    (s, handshake(t, s))
}

/// A client whose acquire of "a" is written on 7001's commands link (after `CLUSTER SHARDS`
/// failed and `CLUSTER SLOTS` answered). Returns that link's stream.
fn routed() -> (T, u64) {
    routed_with(StreamSettings::default())
}

fn routed_with(settings: StreamSettings) -> (T, u64) {
    routed_waiting(settings, 0)
}

fn routed_waiting(settings: StreamSettings, wait_ms: u64) -> (T, u64) {
    let mut t = cluster_with(settings);
    t.acquire(wait_ms);
    let topo = open_to(&mut t, &tcp("s1", 7000));
    let (s, cmds) = routed_to_7001(&mut t, topo);
    assert!(cmds.len() == 1 && is_acquire(&cmds[0]), "{cmds:?}");
    assert_eq!(t.s.counters().cluster_refreshes, 2);
    (t, s)
}

#[test]
fn requests_go_to_the_master_of_their_slot() {
    let (mut t, s) = routed();
    t.recv(s, GRANTED);
    assert_eq!(t.fence(), Some(42));
    assert_eq!(t.s.links.len(), 4, "a pair of links per node");
}

#[test]
fn moved_updates_the_slot_and_resends_there() {
    let (mut t, s) = routed();
    let moved = format!("-MOVED {} :7002\r\n", slot_a());
    t.recv(s, moved.as_bytes());
    // The empty host is the host of the node that answered.
    let (_, cmds) = link_ready(&mut t, &tcp("127.0.0.1", 7002));
    assert!(cmds.len() == 1 && is_acquire(&cmds[0]), "{cmds:?}");
    assert_eq!(t.s.counters().cluster_redirects, 1);
    // A full refresh follows, after the gap since the last answer.
    assert!(t.tick(200 * MS));
    let topo = open_to(&mut t, &tcp("127.0.0.1", 7001));
    asked(&mut t, topo, "SLOTS");
    let s2 = t.s.links[4].stream;
    t.recv(s2, GRANTED);
    assert_eq!(t.fence(), Some(42));
}

#[test]
fn ask_sends_asking_then_the_request_once() {
    let (mut t, s) = routed();
    let ask = format!("-ASK {} 127.0.0.1:7000\r\n", slot_a());
    t.recv(s, ask.as_bytes());
    let (a, cmds) = link_ready(&mut t, &tcp("127.0.0.1", 7000));
    assert_eq!(cmds.len(), 2, "{cmds:?}");
    assert_eq!(cmds[0], words(&["ASKING"]));
    assert!(is_acquire(&cmds[1]));
    t.recv(a, b"+OK\r\n");
    t.recv(a, GRANTED);
    assert_eq!(t.fence(), Some(42));
    // The table is unchanged: the slot is still 7001's.
    assert_eq!(t.s.counters().cluster_redirects, 1);
    let c = t.s.cluster.as_deref().unwrap();
    assert_eq!(
        c.nodes[usize::from(c.slots[usize::from(slot_a())])],
        tcp("127.0.0.1", 7001)
    );
}

#[test]
fn tryagain_is_retried_after_a_backoff_within_the_deadline() {
    // Retries stop at the request timeout (shorter here than the engine's own bound).
    let (mut t, s) = routed_with(StreamSettings {
        request_timeout_ns: 1_000 * MS,
        ..StreamSettings::default()
    });
    t.recv(
        s,
        b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
    );
    assert!(t.io().is_empty(), "not at once");
    assert!(t.tick(100 * MS));
    let cmds = t.write(s);
    assert!(cmds.len() == 1 && is_acquire(&cmds[0]), "{cmds:?}");
    // CLUSTERDOWN until the request's deadline: then the error reply is the answer.
    let start = t.now;
    let answered = |t: &T| t.s.protocol().counters().error_replies > 0;
    let mut rounds = 0;
    while !answered(&t) {
        rounds += 1;
        assert!(rounds < 100);
        t.recv(s, b"-CLUSTERDOWN The cluster is down\r\n");
        let mut resent = false;
        while !resent && !answered(&t) {
            assert!(t.tick(1_000 * MS), "nothing due");
            for g in t.io() {
                match g {
                    // The refresh CLUSTERDOWN asks for: the same table.
                    Got::Open(topo, ..) => {
                        asked(&mut t, topo, "SLOTS");
                        t.recv(topo, &table());
                    }
                    Got::Write(w, cmds) if w == s => {
                        assert!(is_acquire(&cmds[0]), "{cmds:?}");
                        resent = true;
                    }
                    _ => {}
                }
            }
        }
    }
    assert!(rounds > 3, "{rounds}");
    assert!(t.now - start <= 1_100 * MS, "{}", t.now - start);
    assert!(
        t.s.last_error().contains("CLUSTERDOWN"),
        "{}",
        t.s.last_error()
    );
}

#[test]
fn garbage_from_every_seed_fails_the_request_with_the_reason() {
    let mut t = cluster_t();
    t.acquire(0);
    let topo = open_to(&mut t, &tcp("s1", 7000));
    asked(&mut t, topo, "SHARDS");
    t.recv(topo, b"*1\r\n:5\r\n");
    let got = t.io();
    assert_eq!(got[0], Got::Shutdown(topo));
    let Got::Open(next, to, _) = &got[1] else {
        panic!("{got:?}")
    };
    assert_eq!(to, &tcp("s2", 7001));
    let next = *next;
    t.opened(next);
    t.io();
    t.closed(next, "connection refused");
    let events = t.events();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, crate::Event::Acquired { .. })),
        "{events:?}"
    );
    let err = t.s.last_error().to_owned();
    assert!(err.contains("connection refused"), "{err}");
    assert!(t.s.counters().cluster_refreshes >= 1);
    // The next round waits for its backoff, then asks the first seed again.
    assert!(t.io().is_empty());
    t.acquire(0);
    assert!(t.tick(100 * MS));
    open_to(&mut t, &tcp("s1", 7000));
}

#[test]
fn a_closed_link_asks_for_the_topology_again() {
    let (mut t, s) = routed();
    t.recv(s, GRANTED);
    assert_eq!(t.fence(), Some(42));
    t.closed(s, "reset by peer");
    assert!(t.tick(200 * MS));
    // Another node of the last answer is asked (7001's link just failed).
    let topo = open_to(&mut t, &tcp("127.0.0.1", 7000));
    asked(&mut t, topo, "SLOTS");
}

#[test]
fn redirections_end_after_five() {
    let (mut t, s) = routed();
    let moved = format!("-MOVED {} 127.0.0.1:7001\r\n", slot_a());
    for _ in 0..5 {
        t.recv(s, moved.as_bytes());
        let cmds = t.write(s);
        assert!(cmds.len() == 1 && is_acquire(&cmds[0]), "{cmds:?}");
    }
    assert_eq!(t.s.protocol().counters().error_replies, 0);
    t.recv(s, moved.as_bytes());
    assert_eq!(t.s.protocol().counters().error_replies, 1);
    assert_eq!(t.s.counters().cluster_redirects, 5);
    assert!(t.s.last_error().contains("MOVED"), "{}", t.s.last_error());
}

#[test]
fn a_cluster_url_needs_sharded_wake() {
    let proto = RedisProtocol::new(RedisOptions::default(), [7; 16]).unwrap();
    let err =
        RedisStream::new(proto, "redis+cluster://h:1", StreamSettings::default()).unwrap_err();
    assert!(err.to_string().contains("sharded"), "{err}");
}

#[test]
fn a_shard_channel_lives_on_its_masters_subscriber_link() {
    let (mut t, cmd) = routed_waiting(StreamSettings::default(), 5_000);
    // Held: the lease waits, and the name's channel is subscribed on 7001's subscriber link.
    t.recv(cmd, b"*2\r\n:0\r\n:2000\r\n");
    let (sub, cmds) = link_ready(&mut t, &tcp("127.0.0.1", 7001));
    assert_eq!(sub, t.s.links[1].stream);
    assert_eq!(cmds, vec![words(&["SSUBSCRIBE", "lh:{a}:wake"])]);
    let confirmed = b">3\r\n$10\r\nssubscribe\r\n$11\r\nlh:{a}:wake\r\n:1\r\n";
    t.recv(sub, confirmed);
    assert!(t.s.protocol().is_subscribed());
    // Subscribed: the name is checked once.
    let again = t.write(cmd);
    assert!(again.len() == 1 && is_acquire(&again[0]), "{again:?}");
    // The subscriber link closes: its channel is lost and subscribed again there.
    t.closed(sub, "reset by peer");
    assert!(!t.s.protocol().is_subscribed());
    assert_eq!(t.s.protocol().counters().subscriber_losses, 1);
    let mut resubscribed = false;
    for _ in 0..20 {
        if resubscribed || !t.tick(500 * MS) {
            break;
        }
        for g in t.io() {
            match g {
                Got::Open(s, to, _) if s == t.s.links[1].stream => {
                    assert_eq!(to, tcp("127.0.0.1", 7001));
                    let cmds = handshake(&mut t, s);
                    assert_eq!(cmds, vec![words(&["SSUBSCRIBE", "lh:{a}:wake"])]);
                    resubscribed = true;
                }
                // The topology asked again after the close: the same table.
                Got::Open(topo, ..) => {
                    asked(&mut t, topo, "SLOTS");
                    t.recv(topo, &table());
                }
                _ => {}
            }
        }
    }
    assert!(resubscribed);
}

#[test]
fn a_failing_link_has_the_topology_asked_every_300_ms_not_more() {
    let (mut t, s) = routed();
    t.recv(s, GRANTED);
    assert_eq!(t.fence(), Some(42));
    t.closed(s, "reset by peer");
    let start = t.now;
    let mut questions = 0;
    while t.tick(1_000 * MS) && t.now < start + 10_000 * MS {
        for g in t.io() {
            match g {
                // The link's own reopens fail at once.
                Got::Open(l, ..) if l == t.s.links[0].stream => t.closed(l, "refused"),
                Got::Open(topo, ..) => {
                    asked(&mut t, topo, "SLOTS");
                    t.recv(topo, &table());
                    questions += 1;
                }
                _ => {}
            }
        }
    }
    assert!((5..=40).contains(&questions), "{questions}");
}

#[test]
fn a_moved_subscription_follows_to_the_new_owner() {
    let (mut t, cmd) = routed_waiting(StreamSettings::default(), 5_000);
    t.recv(cmd, b"*2\r\n:0\r\n:2000\r\n");
    let (sub, cmds) = link_ready(&mut t, &tcp("127.0.0.1", 7001));
    assert_eq!(cmds, vec![words(&["SSUBSCRIBE", "lh:{a}:wake"])]);
    let moved = format!("-MOVED {} 127.0.0.1:7000\r\n", slot_a());
    t.recv(sub, moved.as_bytes());
    // 7000's subscriber link (node 1: link 3).
    let (sub2, cmds) = link_ready(&mut t, &tcp("127.0.0.1", 7000));
    assert_eq!(sub2, t.s.links[3].stream);
    assert_eq!(cmds, vec![words(&["SSUBSCRIBE", "lh:{a}:wake"])]);
    t.recv(
        sub2,
        b">3\r\n$10\r\nssubscribe\r\n$11\r\nlh:{a}:wake\r\n:1\r\n",
    );
    assert!(t.s.protocol().is_subscribed());
    // The old owner's subscriber link closing loses nothing.
    t.closed(sub, "reset by peer");
    assert!(t.s.protocol().is_subscribed());
    assert_eq!(t.s.protocol().counters().subscriber_losses, 0);
    // The new one's does.
    t.closed(sub2, "reset by peer");
    assert!(!t.s.protocol().is_subscribed());
    assert_eq!(t.s.protocol().counters().subscriber_losses, 1);
}

#[test]
fn a_status_query_on_a_fresh_client_dates_the_topology_open_from_its_clock() {
    // A status query may be a core's first input (`leasehold status`, `ping()`): the open it
    // causes must give up at the host's clock plus the connect timeout, not at the timeout
    // after 0, and the query must not expire before the topology is asked.
    let mut t = cluster_t();
    t.now = 1_000_000 * MS;
    t.s.request_status(&mut t.core, t.now, "a").unwrap();
    // As a link's open does, the question waits for a clock: due at once.
    assert_eq!(t.io(), vec![], "an open before the core has a clock");
    assert_eq!(t.s.poll_timeout(&mut t.core), Some(0));
    t.s.handle_timeout(&mut t.core, t.now);
    let got = t.io();
    let s = match &got[..] {
        [Got::Open(s, e, deadline)] => {
            assert_eq!(e, &tcp("s1", 7000));
            let connect = StreamSettings::default().connect_timeout_ns;
            assert_eq!(
                *deadline,
                t.now + connect,
                "the open gives up at {deadline}, not {} after the query ({})",
                connect,
                t.now
            );
            *s
        }
        _ => panic!("expected one open to the first seed: {got:?}"),
    };
    // The query waits for the table, then goes to its slot's node.
    t.s.handle_timeout(&mut t.core, t.now);
    assert!(
        t.s.poll_status().is_none(),
        "the query failed before the topology came"
    );
    let (_, cmds) = routed_to_7001(&mut t, s);
    assert!(cmds.len() == 1 && cmds[0][0] == b"EVAL", "{cmds:?}");
}
