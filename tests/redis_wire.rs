//! The core's Redis wire (`backend::redis::wire`) against a real redis-server started on a free
//! loopback port (stopped at the end): a plain `TcpStream` only moves bytes, the connection
//! state machine does the rest — the handshake with an ACL user, a password and a database,
//! the HELLO 2 and AUTH/SELECT/SETNAME fallbacks, pipelining, typed errors, pub/sub pushes,
//! replies fed byte by byte, and the Redis protocol's own requests run over it. Without
//! redis-server the tests skip with a message, except under `CI=true`.

mod support;

use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use leasehold::backend::redis::wire::{
    Conn, ConnError, ConnEvent, ConnOptions, ErrorKind, Protocol, Push, Reply,
};
use leasehold::backend::redis::{Connection, RedisOptions, RedisProtocol};
use leasehold::{AcquireOptions, Client, Config, Event};
use support::resp::{Server, now};

const S: u64 = 1_000_000_000;

/// A host that only moves bytes between a socket and a [`Conn`].
struct Wire {
    conn: Conn,
    sock: TcpStream,
    /// Feed what is read one byte at a time.
    byte_by_byte: bool,
    events: Vec<ConnEvent>,
}

impl Wire {
    fn open(port: u16, opts: ConnOptions) -> Wire {
        let sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
        sock.set_nodelay(true).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(5)))
            .unwrap();
        Wire {
            conn: Conn::new(opts, now()).unwrap(),
            sock,
            byte_by_byte: false,
            events: Vec::new(),
        }
    }

    /// Moves bytes until `done` holds for the events so far (10 s at most).
    fn run_until(&mut self, mut done: impl FnMut(&[ConnEvent]) -> bool) {
        let end = now() + 10 * S;
        let mut buf = [0u8; 4096];
        loop {
            while let Some(e) = self.conn.poll_event() {
                self.events.push(e);
            }
            if done(&self.events) {
                return;
            }
            assert!(now() < end, "gave up waiting; events: {:?}", self.events);
            let out = self.conn.take_output();
            if !out.is_empty() {
                self.sock.write_all(&out).unwrap();
            }
            match self.sock.read(&mut buf) {
                Ok(0) => self.conn.handle_closed(),
                Ok(n) if self.byte_by_byte => {
                    for b in &buf[..n] {
                        self.conn.feed(now(), std::slice::from_ref(b));
                    }
                }
                Ok(n) => self.conn.feed(now(), &buf[..n]),
                Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::TimedOut) => {}
                Err(_) => self.conn.handle_closed(),
            }
            self.conn.handle_timeout(now());
        }
    }

    fn ready(&mut self) -> bool {
        self.run_until(|ev| {
            ev.iter()
                .any(|e| matches!(e, ConnEvent::Ready { .. } | ConnEvent::Closed(_)))
        });
        match self.events.remove(0) {
            ConnEvent::Ready { resp3 } => resp3,
            other => panic!("handshake failed: {other:?}"),
        }
    }

    /// Sends one command and waits for its answer (reply, error or failure).
    fn call(&mut self, id: u64, argv: &[&[u8]]) -> ConnEvent {
        self.conn.send(now(), id, argv).unwrap();
        self.answer(id)
    }

    fn answer(&mut self, id: u64) -> ConnEvent {
        let of = |e: &ConnEvent| match e {
            ConnEvent::Reply { id: i, .. }
            | ConnEvent::Error { id: i, .. }
            | ConnEvent::Failed { id: i, .. } => *i == id,
            _ => false,
        };
        self.run_until(|ev| ev.iter().any(of));
        let at = self.events.iter().position(of).unwrap();
        self.events.remove(at)
    }

    fn text(&mut self, id: u64, argv: &[&[u8]]) -> String {
        match self.call(id, argv) {
            ConnEvent::Reply { reply, .. } => {
                String::from_utf8_lossy(reply.bytes().expect("a string reply")).into_owned()
            }
            other => panic!("{argv:?}: {other:?}"),
        }
    }
}

const ACL: [&str; 8] = [
    "--requirepass",
    "adminpw",
    "--user",
    "app",
    "on",
    ">apppw",
    "~*",
    "+@all",
];

fn app(protocol: Protocol) -> ConnOptions {
    ConnOptions {
        username: Some(b"app".to_vec()),
        password: Some(b"apppw".to_vec()),
        database: 5,
        client_name: Some(b"lh-wire".to_vec()),
        protocol,
        request_timeout_ns: 5 * S,
        ..ConnOptions::default()
    }
}

/// Checks the handshake's effect from the server's side.
fn check_client(w: &mut Wire, resp: u8) {
    let info = w.text(100, &[b"CLIENT", b"INFO"]);
    for field in [
        "name=lh-wire".to_string(),
        "db=5".into(),
        "user=app".into(),
        format!("resp={resp}"),
    ] {
        assert!(
            info.split_whitespace().any(|f| f == field),
            "{field} missing: {info}"
        );
    }
}

#[test]
fn handshake_with_acl_user_password_and_database_then_a_pipeline() {
    let Some(server) = Server::start_with(&ACL) else {
        return;
    };
    let mut w = Wire::open(server.port, app(Protocol::Resp3));
    assert!(w.ready(), "RESP3 expected");
    check_client(&mut w, 3);
    // 200 commands written in one batch, answered in order.
    for i in 0..100u64 {
        let v = i.to_string();
        w.conn
            .send(now(), 2 * i, &[&b"SET"[..], b"k", v.as_bytes()])
            .unwrap();
        w.conn
            .send(now(), 2 * i + 1, &[&b"INCR"[..], b"n"])
            .unwrap();
    }
    assert_eq!(w.conn.outstanding(), 200);
    w.run_until(|ev| ev.len() == 200);
    for (i, e) in w.events.drain(..).enumerate() {
        let want = if i % 2 == 0 {
            Reply::Status(b"OK".to_vec())
        } else {
            Reply::Int(i as i64 / 2 + 1)
        };
        assert_eq!(
            e,
            ConnEvent::Reply {
                id: i as u64,
                reply: want
            }
        );
    }
    // The keys went to database 5.
    let mut admin = server.conn();
    admin.call(&["AUTH", "adminpw"]).unwrap();
    admin.call(&["SELECT", "5"]).unwrap();
    assert_eq!(admin.call(&["GET", "n"]).unwrap().text(), "100");
}

#[test]
fn wrong_password_is_a_handshake_error() {
    let Some(server) = Server::start_with(&ACL) else {
        return;
    };
    let mut opts = app(Protocol::Resp3);
    opts.password = Some(b"nope".to_vec());
    let mut w = Wire::open(server.port, opts);
    w.conn.send(now(), 1, &[&b"PING"[..]]).unwrap();
    w.run_until(|ev| ev.iter().any(|e| matches!(e, ConnEvent::Closed(_))));
    // Held behind the refused handshake: never written.
    assert_eq!(w.events[0], ConnEvent::Failed { id: 1, sent: false });
    assert!(
        matches!(&w.events[1], ConnEvent::Closed(ConnError::Handshake(e)) if e.kind == ErrorKind::WrongPass),
        "{:?}",
        w.events
    );
}

#[test]
fn hello_2_when_asked_and_auth_select_setname_without_hello() {
    let Some(server) = Server::start_with(&ACL) else {
        return;
    };
    let mut w = Wire::open(server.port, app(Protocol::Resp2));
    assert!(!w.ready());
    check_client(&mut w, 2);
    drop(server);
    // A server that does not know HELLO: the RESP3 preference falls back to AUTH + SELECT +
    // CLIENT SETNAME.
    let mut args = ACL.to_vec();
    args.extend(["--rename-command", "HELLO", ""]);
    let Some(server) = Server::start_with(&args) else {
        return;
    };
    let mut w = Wire::open(server.port, app(Protocol::Resp3));
    assert!(!w.ready());
    check_client(&mut w, 2);
    let mut w = Wire::open(server.port, app(Protocol::Legacy));
    assert!(!w.ready());
    check_client(&mut w, 2);
}

#[test]
fn noscript_is_a_typed_error_and_replies_survive_byte_by_byte_reads() {
    let Some(server) = Server::start() else {
        return;
    };
    for protocol in [Protocol::Resp3, Protocol::Resp2] {
        let mut w = Wire::open(
            server.port,
            ConnOptions {
                protocol,
                ..ConnOptions::default()
            },
        );
        w.byte_by_byte = true;
        w.ready();
        let script = b"return {1, tonumber(ARGV[1]), {ARGV[2], false}, 'x'}";
        let sha = w.text(1, &[b"SCRIPT", b"LOAD", script]);
        w.call(2, &[b"SCRIPT", b"FLUSH"]);
        match w.call(3, &[b"EVALSHA", sha.as_bytes(), b"0", b"7", b"abc"]) {
            ConnEvent::Error { error, .. } => assert_eq!(error.kind, ErrorKind::NoScript),
            other => panic!("{other:?}"),
        }
        let want = Reply::Array(vec![
            Reply::Int(1),
            Reply::Int(7),
            Reply::Array(vec![Reply::Bulk(b"abc".to_vec()), Reply::Nil]),
            Reply::Bulk(b"x".to_vec()),
        ]);
        assert_eq!(
            w.call(4, &[b"EVAL", script, b"0", b"7", b"abc"]),
            ConnEvent::Reply { id: 4, reply: want }
        );
        let big = vec![b'z'; 300_000];
        w.call(5, &[b"SET", b"big", &big]);
        assert_eq!(
            w.call(6, &[b"GET", b"big"]),
            ConnEvent::Reply {
                id: 6,
                reply: Reply::Bulk(big)
            }
        );
    }
}

#[test]
fn subscribers_get_push_messages_on_resp3_and_resp2() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut admin = server.conn();
    for protocol in [Protocol::Resp3, Protocol::Resp2] {
        let mut w = Wire::open(
            server.port,
            ConnOptions {
                protocol,
                ..ConnOptions::default()
            },
        );
        w.ready();
        match w.call(1, &[b"SUBSCRIBE", b"ch1", b"ch2"]) {
            ConnEvent::Reply { reply, .. } => assert_eq!(reply, Reply::Int(2)),
            other => panic!("{other:?}"),
        }
        let confirmations: Vec<_> = w.events.drain(..).collect();
        assert_eq!(confirmations.len(), 2, "{confirmations:?}");
        assert_eq!(admin.call(&["PUBLISH", "ch2", "hello"]).unwrap().int(), 1);
        w.run_until(|ev| !ev.is_empty());
        assert_eq!(
            w.events.remove(0),
            ConnEvent::Push(Push::Message {
                channel: b"ch2".to_vec(),
                payload: b"hello".to_vec()
            })
        );
        // PING in subscribe mode is a reply, not a push.
        assert!(matches!(
            w.call(2, &[b"PING"]),
            ConnEvent::Reply { id: 2, .. }
        ));
    }
}

#[test]
fn the_redis_protocol_runs_over_the_wire() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut core = Client::new(Config::default(), &[7; 32]).unwrap();
    let mut proto = RedisProtocol::new(RedisOptions::default(), [7; 16]).unwrap();
    let mut w = Wire::open(server.port, ConnOptions::default());
    assert!(w.ready());
    let lease = core
        .acquire(now(), "wired", AcquireOptions::new(10_000))
        .unwrap();
    let mut fence = None;
    let end = now() + 10 * S;
    while fence.is_none() && now() < end {
        while let Some(r) = proto.poll_request(&mut core) {
            // The subscriber connection is not part of this test.
            if r.connection == Connection::Commands {
                let args: Vec<&[u8]> = r.args.iter().map(|a| a.as_ref()).collect();
                w.conn.send(now(), r.id, &args).unwrap();
            }
        }
        w.run_until(|ev| !ev.is_empty());
        for e in std::mem::take(&mut w.events) {
            match e {
                ConnEvent::Reply { id, reply } => {
                    proto.handle_reply(&mut core, now(), id, &reply.as_value())
                }
                ConnEvent::Error { id, error } => proto.handle_reply(
                    &mut core,
                    now(),
                    id,
                    &Reply::Error(error.message).as_value(),
                ),
                other => panic!("{other:?}"),
            }
        }
        while let Some(e) = proto.poll_event(&mut core) {
            if let Event::Acquired {
                lease: l,
                fencing_token,
                ..
            } = e
            {
                assert_eq!(l, lease);
                fence = Some(fencing_token);
            }
        }
    }
    assert!(fence.is_some_and(|f| f > 0), "no grant over the wire");
    assert_eq!(proto.counters().garbage_replies, 0);
    assert_eq!(proto.counters().error_replies, 0);
}
