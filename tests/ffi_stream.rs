//! The *stream* kind of the seam through the C ABI only: a client of kind
//! `LH_BACKEND_REDIS_STREAM` asks for `LH_IO_OPEN` / `LH_IO_WRITE` / `LH_IO_SHUTDOWN`, and a
//! Rust host that knows no command moves bytes between it and a real redis-server over
//! `TcpStream` / `UnixStream` (`lh_io_opened`, `lh_io_received`, `lh_io_closed`). Covers a
//! lock's life with its fencing token, a release waking a waiter through the subscriber, a
//! server restart mid-session, an ACL user with a password and a database from the URL, a
//! client name, a Unix socket, and the refusals of bad URLs and bad answers.
#![allow(unsafe_code)]
// A host reads its clock; only the core must not.
#![allow(clippy::disallowed_methods)]

#[path = "support/abi.rs"]
mod abi;
#[path = "support/stream_host.rs"]
mod stream_host;
mod support;

use std::process::{Child, Command, Stdio};
use std::ptr::null;
use std::time::{Duration, Instant};

use abi::*;
use leasehold::backend::redis::{KeyKind, key};
use leasehold::ffi::*;
use stream_host::{Host, c_text};
use support::resp::{Resp, Server};

fn url_of(port: u16) -> String {
    format!("redis://127.0.0.1:{port}")
}

#[test]
fn acquire_fence_release() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut host = Host::new(&url_of(server.port), 1, |_| {});
    let lease = host.acquire("stream-job", 5_000, 0);
    let got = host
        .wait_for(lease, LH_EVENT_ACQUIRED, Duration::from_secs(5))
        .expect("acquired");
    assert!(host.opens >= 2, "a commands and a subscriber stream");
    // The fence is max(previous + 1, the server's clock in µs).
    let mut admin = server.conn();
    let server_us = {
        let t = admin.call(&[&b"TIME"[..]]).unwrap();
        let support::resp::Owned::Array(v) = t else {
            panic!("{t:?}")
        };
        v[0].text().parse::<u64>().unwrap() * 1_000_000
    };
    assert!(
        got.fencing_token > server_us - 60_000_000,
        "fence {}",
        got.fencing_token
    );
    assert_eq!(host.h.fence(lease), Ok(got.fencing_token));
    let lock = key(KeyKind::Lock, "stream-job").unwrap();
    assert_eq!(admin.call(&[&b"EXISTS"[..], &lock]).unwrap().int(), 1);

    host.release(lease);
    assert!(
        host.wait_for(lease, LH_EVENT_RELEASED, Duration::from_secs(5))
            .is_some()
    );
    // Released at once for the application; the server confirms the RELEASE after.
    let until = Instant::now() + Duration::from_secs(5);
    while host.h.counters().releases_confirmed == 0 && Instant::now() < until {
        host.step();
    }
    assert_eq!(host.h.counters().releases_confirmed, 1);
    assert_eq!(admin.call(&[&b"EXISTS"[..], &lock]).unwrap().int(), 0);
    let k = host.h.counters();
    assert!(
        k.redis_subscribed == 1 && k.redis_subscriptions == 1,
        "{k:?}"
    );
    assert_eq!(k.backend_transport_failures, 0);
    // One open per connection, none closed, and the Redis stream fields say so.
    assert_eq!((k.stream_opens, host.opens), (2, 2), "{k:?}");
    assert_eq!((k.stream_closes, k.stream_late_answers), (0, 0), "{k:?}");
    assert_eq!(k.sentinel_lookups, 0, "not a Sentinel URL");
}

#[test]
fn a_release_wakes_the_waiter_through_a_resp2_subscriber() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut a = Host::new(&url_of(server.port), 1, |_| {});
    // The waiter speaks RESP2: its subscriber's messages come as arrays in subscribe mode.
    let mut b = Host::new(&url_of(server.port), 2, |o| {
        o.redis_protocol = LH_REDIS_PROTOCOL_RESP2
    });
    let la = a.acquire("contended", 10_000, 0);
    let fa = a
        .wait_for(la, LH_EVENT_ACQUIRED, Duration::from_secs(5))
        .expect("a holds")
        .fencing_token;
    let lb = b.acquire("contended", 10_000, 20_000);
    // B is refused and queues; its subscription is live.
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        a.step();
        b.step();
    }
    assert!(b.event(lb, LH_EVENT_ACQUIRED).is_none());
    assert_eq!(b.h.counters().redis_subscribed, 1);
    a.release(la);
    let released_at = Instant::now();
    let mut fb = None;
    while fb.is_none() && released_at.elapsed() < Duration::from_secs(5) {
        a.step();
        b.step();
        fb = b.event(lb, LH_EVENT_ACQUIRED).map(|e| e.fencing_token);
    }
    let fb = fb.expect("b is woken");
    // Woken, not polling: the idle recheck is 10 s away.
    assert!(released_at.elapsed() < Duration::from_secs(2));
    assert!(b.h.counters().backend_wakeups >= 1);
    assert!(fb > fa, "fences increase: {fa} then {fb}");
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts redis-server on `port` (the one a stopped server had); stopped on drop.
fn restart(port: u16) -> Killed {
    let server = Killed(
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server"),
    );
    for _ in 0..500 {
        if let Ok(mut c) = Resp::connect(port) {
            if c.call(&[b"PING"]).is_ok() {
                return server;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("redis-server did not come back on {port}");
}

#[test]
fn the_client_reconnects_after_a_server_restart() {
    let Some(server) = Server::start() else {
        return;
    };
    let port = server.port;
    let mut host = Host::new(&url_of(port), 3, |_| {});
    let lease = host.acquire("restart", 3_000, 0);
    host.wait_for(lease, LH_EVENT_ACQUIRED, Duration::from_secs(5))
        .expect("acquired");
    let opens_before = host.opens;
    let k = host.h.counters();
    assert_eq!(
        (k.stream_opens, k.stream_closes),
        (opens_before, 0),
        "{k:?}"
    );
    drop(server);
    // Down for a while: the streams close, reopens are refused and back off.
    host.step_for(Duration::from_millis(400));
    assert!(host.opens > opens_before, "the client tried to reopen");
    // Every open the host saw is counted, and each ended (the server went away, the
    // reopens were refused): a close per stream, whoever ended it.
    let k = host.h.counters();
    assert_eq!(k.stream_opens, host.opens, "{k:?}");
    assert_eq!(k.stream_closes, host.closes + host.shutdowns, "{k:?}");
    assert!(k.stream_closes >= 2, "both connections closed: {k:?}");
    let _server = restart(port);
    // A new acquire succeeds over the reopened connections.
    let second = host.acquire("restart-2", 3_000, 10_000);
    let got = host
        .wait_for(second, LH_EVENT_ACQUIRED, Duration::from_secs(10))
        .expect("acquired after the restart");
    assert!(got.fencing_token > 0);
    // The subscriber came back too.
    let until = Instant::now() + Duration::from_secs(5);
    while host.h.counters().redis_subscribed != 1 && Instant::now() < until {
        host.step();
    }
    let k = host.h.counters();
    assert_eq!(k.redis_subscribed, 1, "{k:?}");
    assert!(k.redis_subscriber_losses >= 1, "{k:?}");
    // The first lease's key died with the server: its renewal is refused, it ends Lost.
    assert!(
        host.wait_for(lease, LH_EVENT_LOST, Duration::from_secs(5))
            .is_some()
    );
    assert!(!host.h.backend_error().is_empty());
    // Back up: two streams live, every other one ended.
    let k = host.h.counters();
    assert_eq!(k.stream_opens, host.opens, "{k:?}");
    assert_eq!(k.stream_closes, k.stream_opens - 2, "{k:?}");
}

#[test]
fn acl_user_password_database_and_client_name_from_the_url() {
    let acl = [
        "--requirepass",
        "adminpw",
        "--user",
        "app",
        "on",
        ">p@ss word",
        "~*",
        "&*",
        "+@all",
    ];
    let Some(server) = Server::start_with(&acl) else {
        return;
    };
    let url = format!("redis://app:p%40ss%20word@127.0.0.1:{}/5", server.port);
    let name = "lh-stream-test";
    let mut host = Host::new(&url, 4, |o| {
        o.redis_client_name = name.as_ptr();
        o.redis_client_name_len = name.len();
    });
    let lease = host.acquire("acl", 5_000, 0);
    host.wait_for(lease, LH_EVENT_ACQUIRED, Duration::from_secs(5))
        .expect("acquired as app");
    let mut admin = server.conn();
    admin.call(&[&b"AUTH"[..], b"adminpw"]).unwrap();
    let lock = key(KeyKind::Lock, "acl").unwrap();
    assert_eq!(admin.call(&[&b"EXISTS"[..], &lock]).unwrap().int(), 0);
    admin.call(&[&b"SELECT"[..], b"5"]).unwrap();
    assert_eq!(admin.call(&[&b"EXISTS"[..], &lock]).unwrap().int(), 1);
    let list = admin.call(&[&b"CLIENT"[..], b"LIST"]).unwrap().text();
    let ours: Vec<&str> = list.lines().filter(|l| l.contains("user=app")).collect();
    assert_eq!(ours.len(), 2, "{list}");
    assert!(
        ours.iter()
            .all(|l| l.contains(&format!("name={name}")) && l.contains("db=5"))
    );

    // A wrong password: the handshake fails, the acquire with it.
    let bad = format!("redis://app:wrong@127.0.0.1:{}/5", server.port);
    let mut host = Host::new(&bad, 5, |_| {});
    let lease = host.acquire("acl", 5_000, 0);
    host.wait_for(lease, LH_EVENT_ACQUIRE_FAILED, Duration::from_secs(5))
        .expect("refused");
    assert!(
        host.h.backend_error().contains("WRONGPASS"),
        "{}",
        host.h.backend_error()
    );
}

#[test]
fn a_unix_socket() {
    let dir = std::env::temp_dir().join(format!("lh-stream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("redis.sock");
    let path_s = path.to_str().unwrap().to_owned();
    let Some(server) = Server::start_with(&["--unixsocket", &path_s, "--unixsocketperm", "700"])
    else {
        return;
    };
    let mut host = Host::new(&format!("unix://{path_s}?db=2"), 6, |_| {});
    let lease = host.acquire("unix", 5_000, 0);
    host.wait_for(lease, LH_EVENT_ACQUIRED, Duration::from_secs(5))
        .expect("acquired over the socket");
    let mut admin = server.conn();
    admin.call(&[&b"SELECT"[..], b"2"]).unwrap();
    let lock = key(KeyKind::Lock, "unix").unwrap();
    assert_eq!(admin.call(&[&b"EXISTS"[..], &lock]).unwrap().int(), 1);
    host.release(lease);
    host.wait_for(lease, LH_EVENT_RELEASED, Duration::from_secs(5))
        .expect("released");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_urls_and_bad_answers_are_refused() {
    for url in [
        "redis+sentinel://127.0.0.1:26379",
        "redis+cluster://127.0.0.1:7000/3",
        "http://127.0.0.1",
        "redis://127.0.0.1:0",
        "",
    ] {
        let mut o = backend(LH_BACKEND_REDIS_STREAM);
        o.redis_url = url.as_ptr();
        o.redis_url_len = url.len();
        let st = try_client(&config(), &o, &[1; 32]).err();
        assert_eq!(st, Some(LH_ERR_INVALID_CONFIG), "{url}");
    }
    let mut o = backend(LH_BACKEND_REDIS_STREAM);
    let url = "redis://h";
    o.redis_url = url.as_ptr();
    o.redis_url_len = url.len();
    o.redis_protocol = 9;
    assert_eq!(
        try_client(&config(), &o, &[1; 32]).err(),
        Some(LH_ERR_INVALID_ENUM)
    );
    // A caller built against the header before the stream fields keeps working for the
    // other kinds, and cannot ask for a stream client.
    let mut old = backend(LH_BACKEND_REDIS);
    old.struct_size = std::mem::offset_of!(lh_backend_options, redis_url) as u32;
    assert!(try_client(&config(), &old, &[1; 32]).is_ok());
    old.kind = LH_BACKEND_REDIS_STREAM;
    assert_eq!(
        try_client(&config(), &old, &[1; 32]).err(),
        Some(LH_ERR_STRUCT_SIZE)
    );
    old.struct_size -= 8;
    old.kind = LH_BACKEND_REDIS;
    assert_eq!(
        try_client(&config(), &old, &[1; 32]).err(),
        Some(LH_ERR_STRUCT_SIZE)
    );

    // Answers: unknown streams, bytes before the open, answers of other kinds.
    let host = Host::new("redis://127.0.0.1:1", 7, |_| {});
    let h = host.h.0;
    // SAFETY: live handle, pointers to live locals or NULL with length 0.
    unsafe {
        expect(lh_io_opened(h, MS, 1), LH_ERR_UNKNOWN_CONNECTION);
        expect(
            lh_io_received(h, MS, 0, null(), 0),
            LH_ERR_UNKNOWN_CONNECTION,
        );
        expect(
            lh_io_closed(h, MS, u64::MAX, null(), 0),
            LH_ERR_UNKNOWN_CONNECTION,
        );
        // Before any input the core has no clock to date an open with: it asks for a
        // timeout at once, and opens then.
        let mut r = std::mem::MaybeUninit::<lh_io_request>::uninit();
        ok(lh_io_poll(h, r.as_mut_ptr()));
        assert_eq!(r.assume_init().kind, LH_IO_NONE);
        assert_eq!(host.h.deadline(), 0);
        ok(lh_timeout(h, MS));
        ok(lh_io_poll(h, r.as_mut_ptr()));
        let r = r.assume_init();
        assert_eq!(r.kind, LH_IO_OPEN);
        assert_eq!(c_text(r.host).as_deref(), Some("127.0.0.1"));
        assert_eq!((r.port, r.tls), (1, 0));
        assert!(r.unix_path.is_null() && r.server_name.is_null());
        assert_eq!(r.deadline, MS + 5_000 * MS);
        expect(
            lh_io_received(h, MS, r.stream, b"+OK\r\n".as_ptr(), 5),
            LH_ERR_WRONG_ANSWER,
        );
        expect(
            lh_io_received(h, MS, r.stream, null(), 5),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_io_received(h, MS, r.stream, b"x".as_ptr(), LH_MAX_REPLY_DATA + 1),
            LH_ERR_INVALID_REPLY,
        );
        expect(
            lh_io_failed(h, MS, r.stream, LH_FAILURE_TRANSPORT, null(), 0),
            LH_ERR_WRONG_ANSWER,
        );
        expect(
            lh_io_message(h, MS, b"c".as_ptr(), 1, null(), 0),
            LH_ERR_WRONG_ANSWER,
        );
        ok(lh_io_closed(h, MS, r.stream, b"refused".as_ptr(), 7));
        // Late: the stream is closed now.
        ok(lh_io_opened(h, MS, r.stream));
        ok(lh_io_received(h, MS, r.stream, b"+OK\r\n".as_ptr(), 5));
        assert!(
            host.h.backend_error().contains("refused"),
            "{}",
            host.h.backend_error()
        );
        // A handle of another kind has no streams.
        let mem = client_of(LH_BACKEND_MEMORY, 1);
        expect(lh_io_opened(mem.0, MS, 1), LH_ERR_WRONG_ANSWER);
        expect(
            lh_io_opened(std::ptr::null_mut(), MS, 1),
            LH_ERR_NULL_ARGUMENT,
        );
    }
}

/// `lh_client_new_check` on the arguments of `lh_client_new`: its status and the reason.
fn check(cfg: *const lh_config, o: *const lh_backend_options, seed: &[u8]) -> (lh_status, String) {
    let mut buf = [0xFFu8; 512];
    let mut len = usize::MAX;
    // SAFETY: pointers NULL or to live locals; `buf` holds `buf.len()` bytes.
    let st = unsafe {
        lh_client_new_check(
            cfg,
            o,
            seed.as_ptr(),
            seed.len(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut len,
        )
    };
    assert!(len < buf.len(), "the reason fits: {len}");
    assert_eq!(buf[len], 0, "NUL-terminated");
    (st, String::from_utf8(buf[..len].to_vec()).expect("UTF-8"))
}

fn stream_options(url: &[u8]) -> lh_backend_options {
    let mut o = backend(LH_BACKEND_REDIS_STREAM);
    o.redis_url = url.as_ptr();
    o.redis_url_len = url.len();
    o
}

#[test]
fn a_refused_configuration_says_why() {
    let cfg = config();
    let seed = [1u8; 32];
    // The verdict is lh_client_new's, with its reason.
    for (url, status, words) in [
        (
            &b"unix://redis.sock"[..],
            LH_ERR_INVALID_CONFIG,
            "absolute socket path",
        ),
        (b"http://127.0.0.1", LH_ERR_INVALID_CONFIG, "redis://"),
        (b"redis://127.0.0.1:0", LH_ERR_INVALID_CONFIG, "port"),
        (
            b"redis://h\xff",
            LH_ERR_INVALID_UTF8,
            "redis_url is not UTF-8",
        ),
    ] {
        let o = stream_options(url);
        let (st, why) = check(&cfg, &o, &seed);
        let shown = String::from_utf8_lossy(url);
        assert_eq!(st, status, "{shown}: {why}");
        assert!(why.contains(words), "{shown}: {why}");
        assert_eq!(try_client(&cfg, &o, &seed).err(), Some(st), "{shown}");
    }
    let mut o = stream_options(b"redis://h");
    o.redis_protocol = 9;
    let (st, why) = check(&cfg, &o, &seed);
    assert_eq!(st, LH_ERR_INVALID_ENUM);
    assert!(why.contains("redis_protocol"), "{why}");
    // A good configuration: LH_OK and no reason; lh_client_new agrees.
    let good = stream_options(b"redis://127.0.0.1:6379/2");
    assert_eq!(check(&cfg, &good, &seed), (LH_OK, String::new()));
    assert!(try_client(&cfg, &good, &seed).is_ok());
    assert_eq!(
        check(&cfg, &backend(LH_BACKEND_ETCD), &seed),
        (LH_OK, String::new())
    );
    // The configuration's own faults and the seed's are reported too.
    let mut bad_cfg = config();
    bad_cfg.notifications = 7;
    let (st, why) = check(&bad_cfg, &good, &seed);
    assert_eq!(st, LH_ERR_INVALID_CONFIG);
    assert!(why.contains("notifications"), "{why}");
    let (st, why) = check(&cfg, &good, &[1; 4]);
    assert_eq!(st, LH_ERR_SEED_TOO_SHORT);
    assert!(why.contains("seed"), "{why}");

    // NULL arguments are the verdict's NULL_ARGUMENT, named.
    let (st, why) = check(null(), &good, &seed);
    assert_eq!(st, LH_ERR_NULL_ARGUMENT);
    assert!(why.contains("cfg"), "{why}");
    let (st, why) = check(&cfg, null(), &seed);
    assert_eq!(st, LH_ERR_NULL_ARGUMENT);
    assert!(why.contains("backend"), "{why}");
    let mut len = 0;
    // SAFETY: NULL seed with a length (refused before any read), valid `len`.
    let st =
        unsafe { lh_client_new_check(&cfg, &good, null(), 32, std::ptr::null_mut(), 0, &mut len) };
    assert_eq!(st, LH_ERR_NULL_ARGUMENT);
    assert!(
        len > 0,
        "the length of the reason is reported without a buffer"
    );
    let bad = stream_options(b"unix://redis.sock");
    // SAFETY: NULL buffer and NULL length: only the status.
    let st = unsafe {
        lh_client_new_check(
            &cfg,
            &bad,
            seed.as_ptr(),
            seed.len(),
            std::ptr::null_mut(),
            64,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(st, LH_ERR_INVALID_CONFIG);

    // A buffer too small: cut like snprintf, NUL-terminated, the whole length reported.
    let (_, whole) = check(&cfg, &bad, &seed);
    let mut small = [0xFFu8; 9];
    let mut len = 0;
    // SAFETY: `small` holds 8 bytes plus the guard byte after them.
    let st = unsafe {
        lh_client_new_check(
            &cfg,
            &bad,
            seed.as_ptr(),
            seed.len(),
            small.as_mut_ptr().cast(),
            8,
            &mut len,
        )
    };
    assert_eq!(st, LH_ERR_INVALID_CONFIG);
    assert_eq!(len, whole.len());
    assert_eq!(&small[..7], &whole.as_bytes()[..7]);
    assert_eq!(
        (small[7], small[8]),
        (0, 0xFF),
        "cut at buf_len, not past it"
    );
    // A one-byte buffer gets the empty string.
    let mut one = [0xFFu8; 1];
    // SAFETY: `one` holds 1 byte.
    let st = unsafe {
        lh_client_new_check(
            &cfg,
            &bad,
            seed.as_ptr(),
            seed.len(),
            one.as_mut_ptr().cast(),
            1,
            std::ptr::null_mut(),
        )
    };
    assert_eq!((st, one[0]), (LH_ERR_INVALID_CONFIG, 0));
}
