//! The codec on representative replies split at every point, and on hostile input.

use super::codec::{Decoder, Limits, Reply, WireError, encode_command};
use super::message::{ErrorKind, Push, Redirect, ServerError, SubscriptionKind};
use crate::backend::value::Value;

fn bulk(s: &str) -> Reply {
    Reply::Bulk(s.as_bytes().to_vec())
}

/// Wire bytes and what they decode to, RESP2 and RESP3.
fn samples() -> Vec<(Vec<u8>, Reply)> {
    let big = vec![b'x'; 70_000];
    let mut big_wire = format!("${}\r\n", big.len()).into_bytes();
    big_wire.extend_from_slice(&big);
    big_wire.extend_from_slice(b"\r\n");
    vec![
        (b"+OK\r\n".to_vec(), Reply::Status(b"OK".to_vec())),
        (
            b"-NOSCRIPT No matching script\r\n".to_vec(),
            Reply::Error(b"NOSCRIPT No matching script".to_vec()),
        ),
        (b"-ERR \xff\xfe\r\n".to_vec(), Reply::Error(b"ERR \xff\xfe".to_vec())),
        (b":-42\r\n".to_vec(), Reply::Int(-42)),
        (b"$5\r\nhe\r\no\r\n".to_vec(), bulk("he\r\no")),
        (b"$0\r\n\r\n".to_vec(), bulk("")),
        (b"$-1\r\n".to_vec(), Reply::Nil),
        (b"*-1\r\n".to_vec(), Reply::Nil),
        (b"*0\r\n".to_vec(), Reply::Array(vec![])),
        (
            b"*3\r\n:1\r\n:1700000000000001\r\n:30000\r\n".to_vec(),
            Reply::Array(vec![
                Reply::Int(1),
                Reply::Int(1_700_000_000_000_001),
                Reply::Int(30_000),
            ]),
        ),
        (
            b"*3\r\n*2\r\n:1\r\n$-1\r\n*0\r\n*1\r\n*1\r\n$3\r\nabc\r\n".to_vec(),
            Reply::Array(vec![
                Reply::Array(vec![Reply::Int(1), Reply::Nil]),
                Reply::Array(vec![]),
                Reply::Array(vec![Reply::Array(vec![bulk("abc")])]),
            ]),
        ),
        (big_wire, Reply::Bulk(big)),
        (b"_\r\n".to_vec(), Reply::Nil),
        (b"#t\r\n".to_vec(), Reply::Bool(true)),
        (b",3.5\r\n".to_vec(), Reply::Double(b"3.5".to_vec())),
        (b",-inf\r\n".to_vec(), Reply::Double(b"-inf".to_vec())),
        (
            b"(3492890328409238509324850943850943825024385\r\n".to_vec(),
            Reply::BigNumber(b"3492890328409238509324850943850943825024385".to_vec()),
        ),
        (
            b"!21\r\nSYNTAX invalid syntax\r\n".to_vec(),
            Reply::Error(b"SYNTAX invalid syntax".to_vec()),
        ),
        (b"=8\r\ntxt:abcd\r\n".to_vec(), Reply::Verbatim(b"abcd".to_vec())),
        (
            b"%3\r\n$6\r\nserver\r\n$5\r\nredis\r\n$5\r\nproto\r\n:3\r\n+mod\r\n*1\r\n%1\r\n+a\r\n~2\r\n:1\r\n:2\r\n"
                .to_vec(),
            Reply::Map(vec![
                (bulk("server"), bulk("redis")),
                (bulk("proto"), Reply::Int(3)),
                (
                    Reply::Status(b"mod".to_vec()),
                    Reply::Array(vec![Reply::Map(vec![(
                        Reply::Status(b"a".to_vec()),
                        Reply::Set(vec![Reply::Int(1), Reply::Int(2)]),
                    )])]),
                ),
            ]),
        ),
        (
            b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$3\r\npay\r\n".to_vec(),
            Reply::Push(vec![bulk("message"), bulk("ch"), bulk("pay")]),
        ),
        // Attributes describe the value after them; they are dropped.
        (
            b"|1\r\n+key-popularity\r\n%0\r\n:42\r\n".to_vec(),
            Reply::Int(42),
        ),
        (b"%0\r\n".to_vec(), Reply::Map(vec![])),
    ]
}

fn decode_all(d: &mut Decoder, out: &mut Vec<Reply>) -> Result<(), WireError> {
    while let Some(r) = d.next()? {
        out.push(r);
    }
    Ok(())
}

fn decode_split(stream: &[u8], cuts: &[usize], limits: Limits) -> Result<Vec<Reply>, WireError> {
    let mut d = Decoder::new(limits);
    let mut out = Vec::new();
    let mut from = 0;
    for &cut in cuts.iter().chain([stream.len()].iter()) {
        d.feed(&stream[from..cut])?;
        decode_all(&mut d, &mut out)?;
        from = cut;
    }
    Ok(out)
}

#[test]
fn every_sample_decodes_whole() {
    for (wire, want) in samples() {
        let got = decode_split(&wire, &[], Limits::default()).unwrap();
        assert_eq!(got, vec![want], "{:?}", String::from_utf8_lossy(&wire));
    }
}

#[test]
fn every_split_point_gives_the_same_replies() {
    let samples = samples();
    let small: Vec<_> = samples.iter().filter(|(w, _)| w.len() < 1000).collect();
    let stream: Vec<u8> = small.iter().flat_map(|(w, _)| w.clone()).collect();
    let want: Vec<Reply> = small.iter().map(|(_, r)| r.clone()).collect();
    for cut in 0..=stream.len() {
        assert_eq!(
            decode_split(&stream, &[cut], Limits::default()).unwrap(),
            want,
            "split at {cut}"
        );
    }
    for cut in 0..stream.len() {
        let cuts: Vec<usize> = (cut..stream.len()).step_by(3).collect();
        assert_eq!(
            decode_split(&stream, &cuts, Limits::default()).unwrap(),
            want
        );
    }
    let every: Vec<usize> = (1..stream.len()).collect();
    assert_eq!(
        decode_split(&stream, &every, Limits::default()).unwrap(),
        want
    );
}

#[test]
fn a_big_bulk_string_byte_by_byte_and_in_pieces() {
    let (wire, want) = samples().into_iter().find(|(w, _)| w.len() > 1000).unwrap();
    let every: Vec<usize> = (1..wire.len()).collect();
    assert_eq!(
        decode_split(&wire, &every, Limits::default()).unwrap(),
        vec![want.clone()]
    );
    let pieces: Vec<usize> = (4096..wire.len()).step_by(4096).collect();
    assert_eq!(
        decode_split(&wire, &pieces, Limits::default()).unwrap(),
        vec![want]
    );
}

#[test]
fn a_long_simple_string_byte_by_byte() {
    let mut wire = vec![b'+'];
    wire.extend(std::iter::repeat_n(b'a', 200_000));
    wire.extend_from_slice(b"\r\n");
    let every: Vec<usize> = (1..wire.len()).collect();
    let got = decode_split(&wire, &every, Limits::default()).unwrap();
    assert_eq!(got, vec![Reply::Status(vec![b'a'; 200_000])]);
}

fn small_limits() -> Limits {
    Limits {
        max_frame_bytes: 1024,
        max_elements: 64,
        max_depth: 4,
        max_buffered_bytes: 4096,
    }
}

fn first_error(wire: &[u8], limits: Limits) -> WireError {
    // The same error whether the bytes come at once or one by one.
    let whole = decode_split(wire, &[], limits).unwrap_err();
    let every: Vec<usize> = (1..wire.len()).collect();
    assert_eq!(decode_split(wire, &every, limits).unwrap_err(), whole);
    whole
}

#[test]
fn oversize_frames_are_errors_before_they_arrive() {
    let l = small_limits();
    let too_large = WireError::FrameTooLarge { limit: 1024 };
    assert_eq!(first_error(b"$99999999999999\r\n", l), too_large);
    assert_eq!(first_error(b"$1023\r\n", l), too_large);
    assert_eq!(first_error(b"*400\r\n", l), too_large);
    assert_eq!(
        first_error(b"*65\r\n", l),
        WireError::TooManyElements { limit: 64 }
    );
    let mut long = vec![b'+'];
    long.extend(vec![b'a'; 2000]);
    assert_eq!(first_error(&long, l), too_large);
    let mut many = b"*60\r\n".to_vec();
    for _ in 0..60 {
        many.extend_from_slice(b"*1\r\n:1\r\n");
    }
    assert_eq!(
        first_error(&many, l),
        WireError::TooManyElements { limit: 64 }
    );
    assert_eq!(
        first_error(b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n", l),
        WireError::TooDeep { limit: 4 }
    );
    assert!(decode_split(b"*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n", &[], l).is_ok());
    // Frames read whole without a scan keep the scanner's limits.
    let whole_but_large = [&b"+"[..], &[b'a'; 1030], b"\r\n"].concat();
    assert_eq!(first_error(&whole_but_large, l), too_large);
    let flat = Limits { max_depth: 1, ..l };
    assert_eq!(
        first_error(b"*1\r\n*1\r\n:1\r\n", flat),
        WireError::TooDeep { limit: 1 }
    );
    assert!(decode_split(b"*2\r\n:1\r\n:2\r\n", &[], flat).is_ok());
    let exact = Limits {
        max_elements: 16,
        max_frame_bytes: 80,
        ..l
    };
    let sixteen = [&b"*15\r\n"[..], &b":1\r\n".repeat(15)].concat();
    assert!(decode_split(&sixteen, &[], exact).is_ok());
    let seventeen = [&b"*16\r\n"[..], &b":1\r\n".repeat(16)].concat();
    assert_eq!(
        first_error(&seventeen, exact),
        WireError::TooManyElements { limit: 16 }
    );
    // A hostile nesting far beyond the default depth: an error, not a stack overflow.
    let deep = b"*1\r\n".repeat(100_000);
    assert_eq!(
        first_error(&deep, Limits::default()),
        WireError::TooDeep { limit: 32 }
    );
    let mut d = Decoder::new(l);
    assert_eq!(
        d.feed(&[b'+'; 5000]),
        Err(WireError::BufferFull { limit: 4096 })
    );
    assert_eq!(d.next(), Err(WireError::BufferFull { limit: 4096 }));
}

#[test]
fn garbage_is_an_error_and_the_decoder_stays_failed() {
    let garbage = |wire: &[u8]| {
        let e = first_error(wire, Limits::default());
        assert!(
            matches!(e, WireError::Garbage { .. } | WireError::Invalid(_)),
            "{:?}: {e:?}",
            String::from_utf8_lossy(wire)
        );
    };
    for wire in [
        &b"x\r\n"[..],
        b"HELLO 3\r\n",
        b"$abc\r\n",
        b"$+3\r\nabc\r\n",
        b"$-2\r\n",
        b"$3\r\nabcXY",
        b"*?\r\n",
        b"$?\r\n",
        b";3\r\nabc\r\n",
        b"*1\r\n\x00\r\n",
        b":12a\r\n",
        b"#x\r\n",
        b",pi\r\n",
        b"=3\r\ntxt\r\n",
        b"%-1\r\n",
        b"%1\r\n*1\r\n:1\r\n:1\r\n",
        b"$111111111111111111111111111111111",
    ] {
        garbage(wire);
    }
    let mut d = Decoder::new(Limits::default());
    d.feed(b"+OK\r\n&\r\n+OK\r\n").unwrap();
    assert_eq!(d.next(), Ok(Some(Reply::Status(b"OK".to_vec()))));
    let e = d.next().unwrap_err();
    assert!(matches!(e, WireError::Garbage { offset: 0, .. }), "{e:?}");
    assert_eq!(d.next(), Err(e.clone()));
    assert_eq!(d.feed(b"+OK\r\n"), Err(e));
}

#[test]
fn pseudo_random_streams_decode_the_same_however_split() {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let pieces: Vec<Vec<u8>> = samples()
        .into_iter()
        .map(|(w, _)| w)
        .filter(|w| w.len() < 1000)
        .collect();
    for _ in 0..300 {
        // Samples with a byte flipped here and there: valid and broken streams.
        let mut stream = Vec::new();
        for _ in 0..(rnd() % 6) {
            stream.extend_from_slice(&pieces[(rnd() % pieces.len() as u64) as usize]);
        }
        if !stream.is_empty() && rnd() % 2 == 0 {
            let at = (rnd() % stream.len() as u64) as usize;
            stream[at] = rnd() as u8;
        }
        let whole = decode_split(&stream, &[], small_limits());
        let mut cuts: Vec<usize> = (0..4)
            .map(|_| (rnd() % (stream.len() as u64 + 1)) as usize)
            .collect();
        cuts.sort();
        let split = decode_split(&stream, &cuts, small_limits());
        // A split stream reports the same replies, or the same first error.
        match (&whole, &split) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(a), Err(b)) => assert_eq!(a, b),
            _ => panic!("{whole:?} vs {split:?} for {stream:?} cut at {cuts:?}"),
        }
    }
}

#[test]
fn the_fast_resp2_reading_agrees_with_the_codec_crate() {
    use super::codec::{decode2, fast2};
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut frames: Vec<Vec<u8>> = samples().into_iter().map(|(w, _)| w).collect();
    for edge in [
        &b":+5\r\n"[..],
        b":9223372036854775807\r\n",
        b":9223372036854775808\r\n",
        b":-9223372036854775808\r\n",
        b":\r\n",
        b":-\r\n",
        b":-0\r\n",
        b":--1\r\n",
        b":000000000000000000\r\n",
        b":-999999999999999999\r\n",
        b":9999999999999999999\r\n",
        b"+a\rb\r\n",
        b":1 \r\n",
        b"$007\r\nabcdefg\r\n",
        b"$3\r\nabcd\r\n",
        b"*2\r\n:1\r\n",
        b"*1\r\n*1\r\n*1\r\n:1\r\n",
        b"*3\r\n:1\r\n:1700000000000001\r\n:30000\r\n",
        b"*2\r\n$-1\r\n*-1\r\n",
        b"+\r\n",
        b"-\r\n",
    ] {
        frames.push(edge.to_vec());
    }
    let mut checked = 0;
    for round in 0..4000 {
        let mut f = frames[round % frames.len()].clone();
        if round >= frames.len() && !f.is_empty() {
            // A byte or two changed: valid and broken frames alike.
            for _ in 0..=(rnd() % 2) {
                let at = (rnd() % f.len() as u64) as usize;
                f[at] = b"0123456789:+-$*\r\n-x"[(rnd() % 19) as usize];
            }
        }
        if let Some(fast) = fast2(&f) {
            assert_eq!(decode2(&f), Ok(fast), "{:?}", String::from_utf8_lossy(&f));
            checked += 1;
        }
    }
    assert!(checked > 500, "only {checked} frames read fast");
}

#[test]
fn commands_encode_as_arrays_of_bulk_strings() {
    let mut out = b"prefix".to_vec();
    encode_command(&[&b"EVALSHA"[..], b"abc", b"", b"x\r\ny"], &mut out).unwrap();
    assert_eq!(
        out,
        b"prefix*4\r\n$7\r\nEVALSHA\r\n$3\r\nabc\r\n$0\r\n\r\n$4\r\nx\r\ny\r\n"
    );
    let none: [&[u8]; 0] = [];
    assert!(encode_command(&none, &mut out).is_err());
    let mut d = Decoder::new(Limits::default());
    d.feed(&out[6..]).unwrap();
    assert_eq!(
        d.next().unwrap(),
        Some(Reply::Array(vec![
            bulk("EVALSHA"),
            bulk("abc"),
            bulk(""),
            bulk("x\r\ny")
        ]))
    );
}

#[test]
fn replies_read_as_the_protocol_reads_resp2() {
    let map = Reply::Map(vec![
        (bulk("a"), Reply::Bool(true)),
        (bulk("b"), Reply::Nil),
    ]);
    assert_eq!(
        map.as_value(),
        Value::Array(vec![
            Value::Bulk(b"a"),
            Value::Int(1),
            Value::Bulk(b"b"),
            Value::Nil
        ])
    );
    assert_eq!(
        Reply::Double(b"1.5".to_vec()).as_value(),
        Value::Bulk(b"1.5")
    );
    assert_eq!(
        Reply::Error(b"E x".to_vec()).as_value(),
        Value::Error(b"E x")
    );
    assert_eq!(
        Reply::Set(vec![Reply::Int(3)]).as_value(),
        Value::Array(vec![Value::Int(3)])
    );
}

#[test]
fn error_replies_are_typed() {
    let moved = ServerError::parse(b"MOVED 3999 127.0.0.1:6381");
    assert_eq!(
        moved.kind,
        ErrorKind::Moved(Redirect {
            slot: 3999,
            host: b"127.0.0.1".to_vec(),
            port: 6381
        })
    );
    assert_eq!(moved.code(), b"MOVED");
    let ask = ServerError::parse(b"ASK 1 ::1:7000");
    assert!(
        matches!(ask.kind, ErrorKind::Ask(Redirect { slot: 1, port: 7000, ref host }) if host == b"::1")
    );
    assert_eq!(
        ServerError::parse(b"MOVED 16384 h:1").kind,
        ErrorKind::Other
    );
    assert_eq!(ServerError::parse(b"MOVED x").kind, ErrorKind::Other);
    assert_eq!(
        ServerError::parse(b"NOSCRIPT No matching script").kind,
        ErrorKind::NoScript
    );
    assert!(ServerError::parse(b"WRONGPASS invalid username-password pair").is_auth());
    assert_eq!(ServerError::parse(b"").kind, ErrorKind::Other);
}

#[test]
fn pushes_are_classified() {
    assert_eq!(
        Push::from_items(vec![bulk("smessage"), bulk("c"), bulk("p")]),
        Push::ShardMessage {
            channel: b"c".to_vec(),
            payload: b"p".to_vec()
        }
    );
    assert_eq!(
        Push::from_items(vec![bulk("unsubscribe"), Reply::Nil, Reply::Int(0)]),
        Push::Subscription {
            kind: SubscriptionKind::Unsubscribe,
            channel: None,
            count: 0
        }
    );
    let other = vec![bulk("invalidate"), Reply::Array(vec![bulk("k")])];
    assert_eq!(Push::from_items(other.clone()), Push::Other(other));
    assert_eq!(Push::pubsub(&[bulk("message"), bulk("c")]), None);
}

#[test]
fn the_deepest_accepted_nesting_decodes_and_deeper_limits_are_lowered() {
    let mut wire = b"*1\r\n".repeat(super::codec::MAX_DEPTH_LIMIT);
    wire.extend_from_slice(b":1\r\n");
    let limits = Limits {
        max_depth: 10_000,
        ..Limits::default()
    };
    assert!(limits.validate().is_err());
    let mut want = Reply::Int(1);
    for _ in 0..super::codec::MAX_DEPTH_LIMIT {
        want = Reply::Array(vec![want]);
    }
    assert_eq!(decode_split(&wire, &[], limits).unwrap(), vec![want]);
    let deeper = [b"*1\r\n".as_slice(), &wire].concat();
    assert_eq!(
        decode_split(&deeper, &[], limits).unwrap_err(),
        WireError::TooDeep {
            limit: super::codec::MAX_DEPTH_LIMIT
        }
    );
}

#[test]
fn debug_forms_hide_the_password() {
    let opts = super::conn::ConnOptions {
        password: Some(b"s3cret".to_vec()),
        ..super::conn::ConnOptions::default()
    };
    let c = super::conn::Conn::new(opts.clone(), 0).unwrap();
    assert!(!format!("{opts:?}{c:?}").contains("s3cret"));
}

proptest::proptest! {
    /// The hand-written encoder writes exactly what the codec crate's encoder writes.
    #[test]
    fn commands_encode_as_the_codec_crate_does(
        argv in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40), 1..12),
    ) {
        use redis_protocol::resp2::{encode::encode_borrowed, types::BorrowedFrame};
        let mut ours = Vec::new();
        encode_command(&argv, &mut ours).unwrap();
        let items: Vec<BorrowedFrame<'_>> =
            argv.iter().map(|a| BorrowedFrame::BulkString(a)).collect();
        let frame = BorrowedFrame::Array(&items);
        let mut theirs = vec![0; frame.encode_len(false)];
        let n = encode_borrowed(&mut theirs, &frame, false).unwrap();
        theirs.truncate(n);
        proptest::prop_assert_eq!(ours, theirs);
    }
}
