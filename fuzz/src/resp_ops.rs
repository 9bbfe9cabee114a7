//! Target `resp`: the core's Redis wire (`leasehold::backend::redis::wire`) fed arbitrary byte
//! streams split at arbitrary points — the decoder alone, and a connection (handshake or not,
//! with commands outstanding) that reads them as a server's answers.
//!
//! Oracle: no panic; the decoder never holds more than its frame limit once drained, and
//! never more than its buffer limit; **differential**: the replies and the first error (and a
//! connection's events) are the same whether the stream arrives whole, in the input's pieces
//! or byte by byte; a connection answers every command it accepted exactly once (a reply, an
//! error or a failure) by the time it is closed, and reports `Closed` once, last; a failed
//! command is `sent` exactly when its bytes were handed to the host.

use std::collections::HashMap;

use arbitrary::{Arbitrary, Unstructured};
use leasehold::backend::redis::wire::{
    Conn, ConnEvent, ConnOptions, Decoder, Limits, Protocol, Reply, WireError,
};

/// One fuzz input: a flags byte, six split points, then the stream.
#[derive(Debug)]
pub struct Input {
    /// Bit 0: small limits; bit 1: the connection shakes hands with `HELLO 3` and a
    /// password (the stream answers it); bits 2–4: commands outstanding before the stream.
    pub flags: u8,
    /// Split points (modulo the stream length + 1, sorted).
    pub cuts: [u16; 6],
    /// What the server sends.
    pub stream: Vec<u8>,
}

impl<'a> Arbitrary<'a> for Input {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Input {
            flags: u.arbitrary()?,
            cuts: u.arbitrary()?,
            stream: u.bytes(u.len())?.to_vec(),
        })
    }

    fn arbitrary_take_rest(mut u: Unstructured<'a>) -> arbitrary::Result<Self> {
        Self::arbitrary(&mut u)
    }

    fn size_hint(_depth: usize) -> (usize, Option<usize>) {
        (13, None)
    }
}

/// Replies and the error that ended them, if any.
type Decoded = (Vec<Reply>, Option<WireError>);

fn limits(input: &Input) -> Limits {
    // The buffer limit leaves room for the whole stream here, so that it never depends on
    // how the stream is cut; `buffer_cap` exercises it separately.
    let room = input.stream.len() + 1024;
    if input.flags & 1 == 1 {
        Limits {
            max_frame_bytes: 256,
            max_elements: 32,
            max_depth: 5,
            max_buffered_bytes: room,
        }
    } else {
        Limits {
            max_buffered_bytes: room.max(Limits::default().max_frame_bytes),
            ..Limits::default()
        }
    }
}

fn pieces(stream: &[u8], cuts: &[usize]) -> Vec<(usize, usize)> {
    let mut from = 0;
    let mut out = Vec::new();
    for &c in cuts.iter().chain(std::iter::once(&stream.len())) {
        out.push((from, c));
        from = c;
    }
    out
}

fn decode(stream: &[u8], cuts: &[usize], limits: Limits) -> Decoded {
    let mut d = Decoder::new(limits);
    let mut replies = Vec::new();
    for (a, b) in pieces(stream, cuts) {
        if let Err(e) = d.feed(&stream[a..b]) {
            return (replies, Some(e));
        }
        loop {
            match d.next() {
                Ok(Some(r)) => replies.push(r),
                Ok(None) => break,
                Err(e) => return (replies, Some(e)),
            }
        }
        assert!(
            d.buffered() <= limits.max_frame_bytes,
            "invariant bounded-memory violated: {} bytes buffered after draining",
            d.buffered()
        );
    }
    (replies, None)
}

/// The buffer limit: a small one refuses a big piece, never panics, never grows past it.
fn buffer_cap(stream: &[u8], cuts: &[usize]) -> u64 {
    let limits = Limits {
        max_frame_bytes: 64,
        max_elements: 16,
        max_depth: 3,
        max_buffered_bytes: 96,
    };
    let mut d = Decoder::new(limits);
    for (a, b) in pieces(stream, cuts) {
        if d.feed(&stream[a..b]).is_err() {
            return 1 << 20;
        }
        assert!(d.buffered() <= 96, "invariant buffer-limit violated");
        while let Ok(Some(_)) = d.next() {}
        if d.error().is_some() {
            return 1 << 21;
        }
    }
    0
}

fn conn_events(input: &Input, stream: &[u8], cuts: &[usize], limits: Limits) -> Vec<ConnEvent> {
    let handshake = input.flags & 2 == 2;
    let opts = ConnOptions {
        password: handshake.then(|| b"pw".to_vec()),
        database: if handshake { 2 } else { 0 },
        protocol: if handshake {
            Protocol::Resp3
        } else {
            Protocol::Legacy
        },
        limits,
        ..ConnOptions::default()
    };
    let mut c = Conn::new(opts, 0).expect("valid options");
    let commands = usize::from(input.flags >> 2 & 7);
    let argvs: [&[&[u8]]; 4] = [
        &[b"EVALSHA", b"0123", b"1", b"k"],
        &[b"SUBSCRIBE", b"a", b"b"],
        &[b"GET", b"k"],
        &[b"SSUBSCRIBE", b"{n}:wake"],
    ];
    let mut accepted = Vec::new();
    for id in 0..commands as u64 {
        if c.send(id, id, argvs[id as usize % 4]).is_ok() {
            accepted.push(id);
        }
    }
    let mut events = Vec::new();
    // How many of `accepted` the host was handed, in order, read back from the output bytes.
    let mut out = Decoder::new(Limits::default());
    let mut handed = 0;
    let check_sent = |polled: &[ConnEvent], before: usize, after: usize| {
        for e in polled {
            if let ConnEvent::Failed { id, sent } = e {
                let at = accepted.iter().position(|a| a == id).unwrap_or(usize::MAX);
                assert!(
                    if *sent { at < after } else { at >= before },
                    "invariant sent-means-handed violated for {id} (sent {sent}, handed {before}..{after} of {accepted:?})"
                );
            }
        }
    };
    for (i, (a, b)) in pieces(stream, cuts).into_iter().enumerate() {
        c.feed(i as u64, &stream[a..b]);
        let before = handed;
        out.feed(&c.take_output())
            .expect("the connection's own output decodes");
        while let Ok(Some(Reply::Array(argv))) = out.next() {
            if argvs
                .iter()
                .any(|cmd| matches!(argv.first(), Some(Reply::Bulk(n)) if n[..] == *cmd[0]))
            {
                handed += 1;
            }
        }
        let at = events.len();
        events.extend(std::iter::from_fn(|| c.poll_event()));
        check_sent(&events[at..], before, handed);
    }
    c.handle_closed();
    let at = events.len();
    events.extend(std::iter::from_fn(|| c.poll_event()));
    check_sent(&events[at..], handed, handed);
    // Every accepted command answered exactly once; one Closed, last.
    let mut answers: HashMap<u64, usize> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        match e {
            ConnEvent::Reply { id, .. }
            | ConnEvent::Error { id, .. }
            | ConnEvent::Failed { id, .. } => {
                *answers.entry(*id).or_default() += 1;
            }
            ConnEvent::Closed(_) => assert_eq!(
                i,
                events.len() - 1,
                "invariant closed-last violated: {events:?}"
            ),
            ConnEvent::Ready { .. } | ConnEvent::Push(_) => {}
        }
    }
    for id in &accepted {
        assert_eq!(
            answers.remove(id),
            Some(1),
            "invariant one-answer violated for {id}: {events:?}"
        );
    }
    assert!(
        answers.is_empty(),
        "invariant no-unknown-answer violated: {answers:?}"
    );
    assert!(matches!(events.last(), Some(ConnEvent::Closed(_))));
    // Whether a failed command was handed over depends on when the host took the output
    // (here: after each piece), not only on the bytes; the rest must not depend on the split.
    events
        .into_iter()
        .map(|e| match e {
            ConnEvent::Failed { id, .. } => ConnEvent::Failed { id, sent: false },
            other => other,
        })
        .collect()
}

fn features(decoded: &Decoded, events: &[ConnEvent]) -> u64 {
    let mut f = 0u64;
    for r in &decoded.0 {
        f |= 1
            << match r {
                Reply::Nil => 0,
                Reply::Int(_) => 1,
                Reply::Bulk(_) => 2,
                Reply::Status(_) => 3,
                Reply::Error(_) => 4,
                Reply::Array(_) => 5,
                Reply::Map(_) => 6,
                Reply::Set(_) => 7,
                Reply::Push(_) => 8,
                Reply::Double(_) | Reply::Bool(_) | Reply::BigNumber(_) | Reply::Verbatim(_) => 9,
            };
    }
    f |= match &decoded.1 {
        None => 0,
        Some(WireError::FrameTooLarge { .. }) => 1 << 10,
        Some(WireError::TooManyElements { .. }) => 1 << 11,
        Some(WireError::TooDeep { .. }) => 1 << 12,
        Some(WireError::Garbage { .. }) => 1 << 13,
        Some(WireError::Invalid(_)) => 1 << 14,
        Some(_) => 1 << 15,
    };
    for e in events {
        f |= 1
            << match e {
                ConnEvent::Ready { .. } => 16,
                ConnEvent::Reply { .. } => 17,
                ConnEvent::Error { .. } => 18,
                ConnEvent::Push(_) => 19,
                ConnEvent::Failed { .. } => 22,
                ConnEvent::Closed(_) => 23,
            };
    }
    f
}

/// Runs one input; returns the behaviours it reached (for the corpus generator).
pub fn run(input: &Input) -> u64 {
    let stream = &input.stream;
    let mut cuts: Vec<usize> = input
        .cuts
        .iter()
        .map(|&c| usize::from(c) % (stream.len() + 1))
        .collect();
    cuts.sort_unstable();
    let limits = limits(input);
    let whole = decode(stream, &[], limits);
    let split = decode(stream, &cuts, limits);
    assert_eq!(
        whole, split,
        "invariant split-independence violated at cuts {cuts:?}"
    );
    let every: Vec<usize> = (1..stream.len().min(1024)).collect();
    if stream.len() <= 1024 {
        assert_eq!(
            whole,
            decode(stream, &every, limits),
            "invariant split-independence violated byte by byte"
        );
    }
    let events = conn_events(input, stream, &[], limits);
    assert_eq!(
        events,
        conn_events(input, stream, &cuts, limits),
        "invariant connection split-independence violated at cuts {cuts:?}"
    );
    features(&whole, &events) | buffer_cap(stream, &cuts)
}
