//! Cost of the Redis protocol layer per request: an acquire → grant → release cycle (two
//! requests: ACQUIRE, RELEASE) through `backend::redis::RedisProtocol` (argument vectors
//! built, replies interpreted) beside the same cycle on the bare engine, and a renew cycle
//! (one request) both ways. The difference divided by the requests is the layer's cost per
//! encode + decode. Then the wire's cost (`backend::redis::wire`): an acquire's EVALSHA argument
//! vector encoded as RESP, its grant reply decoded from bytes, and both through a connection
//! (send, take the bytes, feed the reply, poll the event). Last, the byte path whole
//! (`backend::redis::stream::RedisStream`, what `LH_BACKEND_REDIS_STREAM` runs): an acquire →
//! grant → release cycle from the application's call to the bytes to write, and from the
//! bytes read to the event, with the engine, protocol, connection and codec in it. Prints
//! markdown tables; numbers belong in the README, never in tests.
//!
//! Run: `cargo bench --bench redis_protocol` (`-- quick` for a shorter run).
// A benchmark has to read the wall clock; the core itself never does (clippy.toml).
#![allow(clippy::disallowed_methods)]
#![cfg_attr(test, allow(dead_code))]

use std::hint::black_box;
use std::time::Instant;

use leasehold::backend::redis::stream::{RedisStream, StreamRequest, StreamSettings};
use leasehold::backend::redis::wire::{
    Conn, ConnEvent, ConnOptions, Decoder, Limits, Protocol, Reply, encode_command,
};
use leasehold::backend::redis::{RedisOptions, RedisProtocol, Value};
use leasehold::{
    AcquireOptions, AcquireResult, Client, Command, Config, Output, ReleaseResult, RenewResult,
};

const MS: u64 = 1_000_000;

fn best_of<F: FnMut(u64) -> u64>(rounds: u32, n: u64, mut f: F) -> f64 {
    (0..rounds)
        .map(|r| {
            let t = Instant::now();
            black_box(f(n * u64::from(r + 1)));
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .fold(f64::MAX, f64::min)
}

fn engine_cycles(n: u64, core: &mut Client, start: u64) -> u64 {
    let mut now = start;
    for _ in 0..n {
        now += MS;
        let lease = core
            .acquire(now, "jobs", AcquireOptions::new(3_000))
            .unwrap();
        let Some(Output::Command(Command::Acquire { request, .. })) = core.poll_output() else {
            panic!()
        };
        let g = AcquireResult::Granted {
            fencing_token: now,
            ttl_ms: 3_000,
            backend_data: &[],
        };
        core.handle_acquire_result(now, request, g).unwrap();
        black_box(core.poll_output());
        core.release(now, lease).unwrap();
        black_box(core.poll_output());
        let Some(Output::Command(Command::Release { request, .. })) = core.poll_output() else {
            panic!()
        };
        core.handle_release_result(now, request, ReleaseResult::Released)
            .unwrap();
    }
    now
}

fn protocol_cycles(n: u64, core: &mut Client, p: &mut RedisProtocol, start: u64) -> u64 {
    let mut now = start;
    let released = Value::Int(1);
    for _ in 0..n {
        now += MS;
        let lease = core
            .acquire(now, "jobs", AcquireOptions::new(3_000))
            .unwrap();
        let id = p.poll_request(core).unwrap().id;
        let grant = Value::Array(vec![
            Value::Int(1),
            Value::Int(now as i64),
            Value::Int(3_000),
        ]);
        p.handle_reply(core, now, id, &grant);
        black_box(p.poll_event(core));
        core.release(now, lease).unwrap();
        black_box(p.poll_event(core));
        let id = p.poll_request(core).unwrap().id;
        p.handle_reply(core, now, id, &released);
    }
    now
}

fn renew_engine(n: u64, core: &mut Client) {
    for _ in 0..n {
        let d = core.poll_timeout().unwrap();
        core.handle_timeout(d);
        let Some(Output::Command(Command::Renew { request, .. })) = core.poll_output() else {
            panic!()
        };
        core.handle_renew_result(d, request, RenewResult::Renewed)
            .unwrap();
    }
}

fn renew_protocol(n: u64, core: &mut Client, p: &mut RedisProtocol) {
    let renewed = Value::Int(1);
    for _ in 0..n {
        let d = p.poll_timeout(core).unwrap();
        p.handle_timeout(core, d);
        let id = p.poll_request(core).unwrap().id;
        p.handle_reply(core, d, id, &renewed);
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let (rounds, n) = if quick { (3, 20_000) } else { (7, 200_000) };
    let config = Config::default();

    let mut core = Client::new(config, &[1; 32]).unwrap();
    let mut t = 0;
    let engine = best_of(rounds, n, |_| {
        t = engine_cycles(n, &mut core, t);
        t
    });

    let mut core = Client::new(config, &[1; 32]).unwrap();
    let mut p = RedisProtocol::new(RedisOptions::default(), [2; 16]).unwrap();
    let sub = p.poll_request(&mut core).unwrap();
    let ch = sub.args[1].to_vec();
    p.handle_subscription(&mut core, 0, &ch, true);
    let mut t = 0;
    let proto = best_of(rounds, n, |_| {
        t = protocol_cycles(n, &mut core, &mut p, t);
        t
    });

    let mut core = Client::new(config, &[3; 32]).unwrap();
    let lease = core
        .acquire(0, "jobs", AcquireOptions::new(30_000))
        .unwrap();
    let Some(Output::Command(Command::Acquire { request, .. })) = core.poll_output() else {
        panic!()
    };
    let g = AcquireResult::Granted {
        fencing_token: 1,
        ttl_ms: 30_000,
        backend_data: &[],
    };
    core.handle_acquire_result(0, request, g).unwrap();
    while core.poll_output().is_some() {}
    let renew_e = best_of(rounds, n, |k| {
        renew_engine(n, &mut core);
        k
    });
    black_box(lease);

    let mut core = Client::new(config, &[3; 32]).unwrap();
    let mut p = RedisProtocol::new(RedisOptions::default(), [4; 16]).unwrap();
    let sub = p.poll_request(&mut core).unwrap();
    let ch = sub.args[1].to_vec();
    p.handle_subscription(&mut core, 0, &ch, true);
    core.acquire(0, "jobs", AcquireOptions::new(30_000))
        .unwrap();
    let id = p.poll_request(&mut core).unwrap().id;
    let grant = Value::Array(vec![Value::Int(1), Value::Int(1), Value::Int(30_000)]);
    p.handle_reply(&mut core, 0, id, &grant);
    while p.poll_event(&mut core).is_some() {}
    let renew_p = best_of(rounds, n, |k| {
        renew_protocol(n, &mut core, &mut p);
        k
    });

    println!(
        "| cycle | engine only (ns) | through the Redis protocol (ns) | protocol per request (ns) |"
    );
    println!("|---|---:|---:|---:|");
    println!(
        "| acquire → grant → release (2 requests) | {engine:.0} | {proto:.0} | {:.0} |",
        (proto - engine) / 2.0
    );
    println!(
        "| renew (1 request) | {renew_e:.0} | {renew_p:.0} | {:.0} |",
        renew_p - renew_e
    );
    wire(rounds, n);
    stream(rounds, n);
}

/// Every request the stream has for the host: its opens, and the bytes of its writes.
fn stream_io(s: &mut RedisStream, core: &mut Client) -> (Vec<u64>, Vec<(u64, Vec<u8>)>) {
    let (mut opens, mut writes) = (Vec::new(), Vec::new());
    while let Some(r) = s.poll_request(core) {
        match r {
            StreamRequest::Open { stream, .. } => opens.push(stream),
            StreamRequest::Write { stream, bytes } => writes.push((stream, bytes.to_vec())),
            StreamRequest::Shutdown { .. } => panic!("the bench's stream was shut"),
        }
    }
    (opens, writes)
}

/// The byte path whole: acquire → the ACQUIRE's bytes → its grant's bytes → the event →
/// release → the RELEASE's bytes → its reply's bytes → the outcome.
fn stream(rounds: u32, n: u64) {
    let mut core = Client::new(Config::default(), &[6; 32]).unwrap();
    let proto = RedisProtocol::new(RedisOptions::default(), [6; 16]).unwrap();
    let mut s = RedisStream::new(proto, "redis://bench:6379", StreamSettings::default()).unwrap();
    let mut now = MS;
    core.acquire(now, "warm", AcquireOptions::new(30_000))
        .unwrap();
    let (opens, _) = stream_io(&mut s, &mut core);
    for &st in &opens {
        s.handle_opened(&mut core, now, st).unwrap();
    }
    let (_, handshakes) = stream_io(&mut s, &mut core);
    assert_eq!(handshakes.len(), opens.len(), "a HELLO on each connection");
    let hello = b"%1\r\n$6\r\nserver\r\n$5\r\nredis\r\n";
    for &st in &opens {
        s.handle_received(&mut core, now, st, hello).unwrap();
    }
    // The subscriber's SUBSCRIBE confirmed, the warm-up granted and released.
    let mut cmd = 0;
    for (st, bytes) in stream_io(&mut s, &mut core).1 {
        let mut d = Decoder::new(Limits::default());
        d.feed(&bytes).unwrap();
        let Some(Reply::Array(argv)) = d.next().unwrap() else {
            panic!("not a command")
        };
        let word = |i: usize| argv[i].bytes().unwrap().to_vec();
        if word(0).eq_ignore_ascii_case(b"SUBSCRIBE") {
            let ch = word(1);
            let mut push = format!(">3\r\n$9\r\nsubscribe\r\n${}\r\n", ch.len()).into_bytes();
            push.extend(&ch);
            push.extend(b"\r\n:1\r\n");
            s.handle_received(&mut core, now, st, &push).unwrap();
        } else {
            cmd = st;
            s.handle_received(&mut core, now, st, b"*3\r\n:1\r\n:1\r\n:30000\r\n")
                .unwrap();
        }
    }
    let mut fence = 1u64;
    let mut cycle = |k: u64| {
        for _ in 0..n {
            now += 1_000;
            fence += 1;
            let lease = core
                .acquire(now, "jobs", AcquireOptions::new(30_000))
                .unwrap();
            let (_, w) = stream_io(&mut s, &mut core);
            assert_eq!(w.len(), 1, "one ACQUIRE");
            black_box(&w);
            let grant = format!("*3\r\n:1\r\n:{fence}\r\n:30000\r\n");
            s.handle_received(&mut core, now, cmd, grant.as_bytes())
                .unwrap();
            while let Some(e) = s.poll_event(&mut core) {
                black_box(e);
            }
            core.release(now, lease).unwrap();
            let (_, w) = stream_io(&mut s, &mut core);
            assert_eq!(w.len(), 1, "one RELEASE");
            black_box(&w);
            s.handle_received(&mut core, now, cmd, b":1\r\n").unwrap();
            while let Some(e) = s.poll_event(&mut core) {
                black_box(e);
            }
        }
        k
    };
    let whole = best_of(rounds, n, &mut cycle);
    println!();
    println!("| the byte path whole (engine, protocol, connection, codec) | ns |");
    println!("|---|---:|");
    println!("| acquire → grant → release, bytes out and in (2 requests) | {whole:.0} |");
}

/// The RESP codec and a connection per request, on the protocol's own ACQUIRE.
fn wire(rounds: u32, n: u64) {
    let mut core = Client::new(Config::default(), &[5; 32]).unwrap();
    let mut p = RedisProtocol::new(RedisOptions::default(), [5; 16]).unwrap();
    let sub = p.poll_request(&mut core).unwrap();
    let ch = sub.args[1].to_vec();
    p.handle_subscription(&mut core, 0, &ch, true);
    core.acquire(0, "jobs", AcquireOptions::new(30_000))
        .unwrap();
    let argv: Vec<Vec<u8>> = p
        .poll_request(&mut core)
        .unwrap()
        .args
        .iter()
        .map(|a| a.to_vec())
        .collect();
    assert_eq!(argv[0], b"EVALSHA");
    let reply = b"*3\r\n:1\r\n:1700000000000001\r\n:30000\r\n";

    let mut out = Vec::with_capacity(512);
    let encode = best_of(rounds, n, |k| {
        for _ in 0..n {
            out.clear();
            encode_command(black_box(&argv), &mut out).unwrap();
            black_box(&out);
        }
        k
    });
    let mut d = Decoder::new(Limits::default());
    let decode = best_of(rounds, n, |k| {
        for _ in 0..n {
            d.feed(black_box(reply)).unwrap();
            black_box(d.next().unwrap());
        }
        k
    });
    let opts = ConnOptions {
        protocol: Protocol::Legacy,
        ..ConnOptions::default()
    };
    let mut c = Conn::new(opts, 0).unwrap();
    while c.poll_event().is_some() {}
    let mut id = 0;
    let conn = best_of(rounds, n, |k| {
        for _ in 0..n {
            id += 1;
            c.send(id, id, &argv).unwrap();
            black_box(c.take_output());
            c.feed(id, black_box(reply));
            let Some(ConnEvent::Reply { .. }) = c.poll_event() else {
                panic!()
            };
        }
        k
    });
    println!();
    println!("| wire, per request | ns |");
    println!("|---|---:|");
    println!(
        "| encode the ACQUIRE EVALSHA ({} args, {} bytes) | {encode:.0} |",
        argv.len(),
        out.len()
    );
    println!(
        "| decode its grant reply ({} bytes) | {decode:.0} |",
        reply.len()
    );
    println!("| both through a connection (send, output, feed, event) | {conn:.0} |");
}
