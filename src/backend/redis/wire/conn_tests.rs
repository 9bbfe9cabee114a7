//! The connection state machine against scripted server bytes.

use super::*;

const S: u64 = 1_000_000_000;

fn events(c: &mut Conn) -> Vec<ConnEvent> {
    std::iter::from_fn(|| c.poll_event()).collect()
}

fn opts(protocol: Protocol) -> ConnOptions {
    ConnOptions {
        username: Some(b"app".to_vec()),
        password: Some(b"pw".to_vec()),
        database: 3,
        client_name: Some(b"lh-1".to_vec()),
        protocol,
        request_timeout_ns: S,
        ..ConnOptions::default()
    }
}

fn cmd(args: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_command(args, &mut out).unwrap();
    out
}

const HELLO3_MAP: &[u8] = b"%2\r\n$6\r\nserver\r\n$5\r\nredis\r\n$5\r\nproto\r\n:3\r\n";

#[test]
fn resp3_handshake_then_pipelined_commands() {
    let mut c = Conn::new(opts(Protocol::Resp3), 0).unwrap();
    let mut want = cmd(&["HELLO", "3", "AUTH", "app", "pw", "SETNAME", "lh-1"]);
    want.extend(cmd(&["SELECT", "3"]));
    assert_eq!(c.take_output(), want);
    // Sent during the handshake: held until it is done.
    c.send(1, 10, &["GET", "k"]).unwrap();
    assert!(!c.has_output());
    assert_eq!(c.deadline(), Some(S));
    c.feed(2, HELLO3_MAP);
    assert!(events(&mut c).is_empty());
    c.feed(3, b"+OK\r\n");
    assert_eq!(events(&mut c), vec![ConnEvent::Ready { resp3: true }]);
    assert!(c.is_ready() && c.is_resp3());
    c.send(4, 11, &["EVALSHA", "abc", "0"]).unwrap();
    c.send(5, 12, &["SET", "k", "v"]).unwrap();
    let mut want = cmd(&["GET", "k"]);
    want.extend(cmd(&["EVALSHA", "abc", "0"]));
    want.extend(cmd(&["SET", "k", "v"]));
    assert_eq!(c.take_output(), want);
    assert_eq!(c.deadline(), Some(1 + S));
    assert_eq!(c.outstanding(), 3);
    // Replies in order, split anywhere; a push in between is not a reply.
    let replies = b"_\r\n-NOSCRIPT No matching script. Use EVAL.\r\n>3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\np\r\n+OK\r\n";
    for b in replies.chunks(1) {
        c.feed(6, b);
    }
    assert_eq!(
        events(&mut c),
        vec![
            ConnEvent::Reply {
                id: 10,
                reply: Reply::Nil
            },
            ConnEvent::Error {
                id: 11,
                error: ServerError {
                    kind: ErrorKind::NoScript,
                    message: b"NOSCRIPT No matching script. Use EVAL.".to_vec()
                }
            },
            ConnEvent::Push(Push::Message {
                channel: b"c".to_vec(),
                payload: b"p".to_vec()
            }),
            ConnEvent::Reply {
                id: 12,
                reply: Reply::Status(b"OK".to_vec())
            },
        ]
    );
    assert_eq!(c.deadline(), None);
}

#[test]
fn noproto_falls_back_to_hello_2_and_unknown_hello_to_auth_select_setname() {
    let mut c = Conn::new(opts(Protocol::Resp3), 0).unwrap();
    c.take_output();
    c.send(0, 1, &["PING"]).unwrap();
    c.feed(1, b"-NOPROTO unsupported protocol version\r\n");
    let mut want = cmd(&["HELLO", "2", "AUTH", "app", "pw", "SETNAME", "lh-1"]);
    want.extend(cmd(&["SELECT", "3"]));
    assert_eq!(c.take_output(), want);
    // The first SELECT's answer (whatever it is) belongs to the abandoned attempt.
    c.feed(2, b"-NOAUTH Authentication required.\r\n");
    assert!(events(&mut c).is_empty());
    c.feed(3, b"-ERR unknown command 'HELLO'\r\n");
    let mut want = cmd(&["AUTH", "app", "pw"]);
    want.extend(cmd(&["SELECT", "3"]));
    want.extend(cmd(&["CLIENT", "SETNAME", "lh-1"]));
    assert_eq!(c.take_output(), want);
    c.feed(4, b"-NOAUTH Authentication required.\r\n+OK\r\n+OK\r\n");
    assert!(!c.is_ready());
    c.feed(5, b"+OK\r\n");
    assert_eq!(events(&mut c), vec![ConnEvent::Ready { resp3: false }]);
    assert_eq!(c.take_output(), cmd(&["PING"]));
    c.feed(6, b"+PONG\r\n");
    assert_eq!(
        events(&mut c),
        vec![ConnEvent::Reply {
            id: 1,
            reply: Reply::Status(b"PONG".to_vec())
        }]
    );
}

#[test]
fn legacy_without_credentials_is_ready_at_once() {
    let mut c = Conn::new(
        ConnOptions {
            protocol: Protocol::Legacy,
            ..ConnOptions::default()
        },
        0,
    )
    .unwrap();
    assert_eq!(events(&mut c), vec![ConnEvent::Ready { resp3: false }]);
    assert!(!c.has_output());
    let mut c = Conn::new(
        ConnOptions {
            password: Some(b"pw".to_vec()),
            protocol: Protocol::Legacy,
            ..ConnOptions::default()
        },
        0,
    )
    .unwrap();
    assert_eq!(c.take_output(), cmd(&["AUTH", "pw"]));
}

#[test]
fn a_refused_handshake_fails_held_commands() {
    let mut c = Conn::new(opts(Protocol::Resp3), 0).unwrap();
    c.send(0, 7, &["GET", "k"]).unwrap();
    c.feed(
        1,
        b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
    );
    let ev = events(&mut c);
    // Held behind the handshake, never written: it certainly did not run.
    assert_eq!(ev[0], ConnEvent::Failed { id: 7, sent: false });
    assert!(
        matches!(&ev[1], ConnEvent::Closed(ConnError::Handshake(e)) if e.kind == ErrorKind::WrongPass),
        "{ev:?}"
    );
    assert_eq!(ev.len(), 2);
    assert!(c.is_closed());
    assert_eq!(c.send(2, 8, &["GET", "k"]), Err(SendError::Closed));
    // A bad database after a good HELLO.
    let mut c = Conn::new(opts(Protocol::Resp2), 0).unwrap();
    c.feed(1, b"*0\r\n-ERR DB index is out of range\r\n");
    assert!(matches!(
        events(&mut c).as_slice(),
        [ConnEvent::Closed(ConnError::Handshake(_))]
    ));
    // HELLO answered with a plain status: not a Redis server speaking HELLO.
    let mut c = Conn::new(opts(Protocol::Resp2), 0).unwrap();
    c.feed(1, b"+OK\r\n");
    assert_eq!(events(&mut c), vec![ConnEvent::Closed(ConnError::BadHello)]);
}

fn ready(protocol: Protocol) -> Conn {
    let mut c = Conn::new(
        ConnOptions {
            protocol,
            request_timeout_ns: S,
            ..ConnOptions::default()
        },
        0,
    )
    .unwrap();
    c.take_output();
    match protocol {
        Protocol::Resp3 => c.feed(0, HELLO3_MAP),
        Protocol::Resp2 => c.feed(0, b"*2\r\n$5\r\nproto\r\n:2\r\n"),
        Protocol::Legacy => {}
    }
    assert_eq!(
        events(&mut c),
        vec![ConnEvent::Ready {
            resp3: protocol == Protocol::Resp3
        }]
    );
    c
}

#[test]
fn resp2_subscribe_mode_turns_pubsub_arrays_into_pushes() {
    let mut c = ready(Protocol::Resp2);
    // Before subscribing, an array that looks like a message is an ordinary reply.
    c.send(0, 1, &["LRANGE", "l", "0", "-1"]).unwrap();
    c.send(0, 2, &["SUBSCRIBE", "a", "b"]).unwrap();
    c.feed(
        1,
        b"*3\r\n$7\r\nmessage\r\n$1\r\nx\r\n$1\r\ny\r\n\
          *3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n",
    );
    let sub = |ch: &[u8], count| {
        ConnEvent::Push(Push::Subscription {
            kind: SubscriptionKind::Subscribe,
            channel: Some(ch.to_vec()),
            count,
        })
    };
    let ev = events(&mut c);
    assert!(matches!(ev[0], ConnEvent::Reply { id: 1, .. }));
    assert_eq!(ev[1..], [sub(b"a", 1)]);
    c.feed(2, b"*3\r\n$9\r\nsubscribe\r\n$1\r\nb\r\n:2\r\n");
    assert_eq!(
        events(&mut c),
        vec![
            sub(b"b", 2),
            ConnEvent::Reply {
                id: 2,
                reply: Reply::Int(2)
            }
        ]
    );
    assert_eq!(c.deadline(), None);
    c.send(3, 3, &["PING"]).unwrap();
    c.feed(
        4,
        b"*3\r\n$7\r\nmessage\r\n$1\r\na\r\n$2\r\nhi\r\n*2\r\n$4\r\npong\r\n$0\r\n\r\n",
    );
    assert_eq!(
        events(&mut c),
        vec![
            ConnEvent::Push(Push::Message {
                channel: b"a".to_vec(),
                payload: b"hi".to_vec()
            }),
            ConnEvent::Reply {
                id: 3,
                reply: Reply::Array(vec![Reply::Bulk(b"pong".to_vec()), Reply::Bulk(vec![])])
            }
        ]
    );
    assert_eq!(c.send(5, 4, &["UNSUBSCRIBE"]), Err(SendError::NoChannels));
    c.send(5, 4, &["SUBSCRIBE", "denied"]).unwrap();
    c.feed(
        6,
        b"-NOPERM this user has no permissions to access the 'denied' channel\r\n",
    );
    assert!(matches!(
        events(&mut c).as_slice(),
        [ConnEvent::Error { id: 4, error }] if error.kind == ErrorKind::NoPerm
    ));
}

#[test]
fn resp3_confirmations_are_pushes_and_answer_the_subscribe() {
    let mut c = ready(Protocol::Resp3);
    c.send(0, 1, &["SSUBSCRIBE", "{n}:wake"]).unwrap();
    c.feed(1, b">3\r\n$10\r\nssubscribe\r\n$8\r\n{n}:wake\r\n:1\r\n");
    let ev = events(&mut c);
    assert!(matches!(
        &ev[0],
        ConnEvent::Push(Push::Subscription {
            kind: SubscriptionKind::SSubscribe,
            count: 1,
            ..
        })
    ));
    assert_eq!(
        ev[1],
        ConnEvent::Reply {
            id: 1,
            reply: Reply::Int(1)
        }
    );
    // The server ends a shard subscription on its own (the slot moved): a push only.
    c.feed(2, b">3\r\n$12\r\nsunsubscribe\r\n$8\r\n{n}:wake\r\n:0\r\n");
    assert!(matches!(
        events(&mut c).as_slice(),
        [ConnEvent::Push(Push::Subscription {
            kind: SubscriptionKind::SUnsubscribe,
            ..
        })]
    ));
}

#[test]
fn deadlines_and_timeouts() {
    let mut c = ready(Protocol::Resp2);
    c.send(10, 1, &["GET", "a"]).unwrap();
    c.send(20, 2, &["GET", "b"]).unwrap();
    c.take_output();
    assert_eq!(c.deadline(), Some(10 + S));
    c.handle_timeout(10 + S - 1);
    assert!(events(&mut c).is_empty());
    c.feed(11, b"$1\r\nx\r\n");
    assert_eq!(c.deadline(), Some(20 + S));
    c.handle_timeout(20 + S);
    assert_eq!(
        events(&mut c)[1..],
        [
            ConnEvent::Failed { id: 2, sent: true },
            ConnEvent::Closed(ConnError::TimedOut)
        ]
    );
    assert_eq!(c.deadline(), None);
}

#[test]
fn closes_garbage_and_unexpected_replies_end_the_connection() {
    let mut c = ready(Protocol::Resp3);
    c.send(0, 1, &["GET", "a"]).unwrap();
    c.take_output();
    c.send(0, 2, &["GET", "b"]).unwrap(); // never taken to be written
    c.feed(1, b"$10\r\nabc");
    c.handle_closed();
    assert_eq!(
        events(&mut c),
        vec![
            ConnEvent::Failed { id: 1, sent: true },
            ConnEvent::Failed { id: 2, sent: false },
            ConnEvent::Closed(ConnError::Closed { mid_reply: true })
        ]
    );
    let mut c = ready(Protocol::Resp3);
    c.handle_closed();
    assert_eq!(
        events(&mut c),
        vec![ConnEvent::Closed(ConnError::Closed { mid_reply: false })]
    );
    let mut c = ready(Protocol::Resp3);
    c.send(0, 1, &["GET", "a"]).unwrap();
    c.feed(1, b"+OK\r\n@garbage\r\n");
    let ev = events(&mut c);
    assert!(matches!(ev[0], ConnEvent::Reply { id: 1, .. }));
    assert!(matches!(
        ev[1],
        ConnEvent::Closed(ConnError::Wire(WireError::Garbage { .. }))
    ));
    let mut c = ready(Protocol::Resp2);
    c.feed(1, b":1\r\n");
    assert_eq!(
        events(&mut c),
        vec![ConnEvent::Closed(ConnError::UnexpectedReply)]
    );
    // Nothing more happens on a closed connection.
    c.feed(2, b":1\r\n");
    c.handle_closed();
    c.handle_timeout(u64::MAX);
    assert!(events(&mut c).is_empty());
}

#[test]
fn options_are_validated() {
    let bad = [
        ConnOptions {
            username: Some(b"u".to_vec()),
            ..ConnOptions::default()
        },
        ConnOptions {
            client_name: Some(b"a b".to_vec()),
            ..ConnOptions::default()
        },
        ConnOptions {
            request_timeout_ns: 0,
            ..ConnOptions::default()
        },
        ConnOptions {
            limits: Limits {
                max_depth: 1000,
                ..Limits::default()
            },
            ..ConnOptions::default()
        },
    ];
    for o in bad {
        assert!(Conn::new(o, 0).is_err());
    }
}

#[test]
fn a_buffer_handed_back_carries_only_the_next_commands() {
    let mut c = ready(Protocol::Legacy);
    c.send(1, 1, &["GET", "a"]).unwrap();
    let first = c.take_output_into(b"stale bytes".to_vec());
    assert_eq!(first, cmd(&["GET", "a"]));
    c.send(1, 2, &["GET", "b"]).unwrap();
    assert_eq!(c.take_output_into(first), cmd(&["GET", "b"]));
    assert!(!c.has_output());
    // Both were handed over: they may have run.
    c.handle_closed();
    assert_eq!(
        events(&mut c)[..2],
        [
            ConnEvent::Failed { id: 1, sent: true },
            ConnEvent::Failed { id: 2, sent: true }
        ]
    );
}
