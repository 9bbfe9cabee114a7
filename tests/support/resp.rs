//! Test support: a redis-server started on a free loopback port (stopped by pid on drop), a
//! tiny blocking RESP2 client, and a host that executes the Redis protocol's requests the way
//! a binding does (two connections, requests run verbatim, replies handed back unread).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use leasehold::backend::redis::{Connection, RedisOptions, RedisProtocol, Value};
use leasehold::{AcquireOptions, Client, Config, Event, LeaseId};

/// Monotonic ns since the first call: the host's clock (the core never reads one).
#[allow(clippy::disallowed_methods)]
pub fn now() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}

pub struct Server {
    child: Child,
    pub port: u16,
}

impl Server {
    /// Starts redis-server, or `None` (with a message) when it is not installed; under
    /// `CI=true` a missing server fails the test.
    pub fn start() -> Option<Server> {
        Server::start_with(&[])
    }

    /// Like [`Server::start`], with extra `redis-server` arguments (ACL users, passwords,
    /// renamed commands).
    pub fn start_with(extra: &[&str]) -> Option<Server> {
        let found = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok();
        if !found {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("redis-server is missing (scripts/ensure-redis.sh installs it)");
            }
            eprintln!("SKIP: redis-server not installed (scripts/ensure-redis.sh installs it)");
            return None;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let s = Server { child, port };
        for _ in 0..500 {
            if let Ok(mut c) = Resp::connect(port) {
                if c.call(&[b"PING"]).is_ok() {
                    return Some(s);
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server on port {port} did not come up");
    }

    pub fn conn(&self) -> Resp {
        Resp::connect(self.port).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A reply as read from the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owned {
    Nil,
    Int(i64),
    Bulk(Vec<u8>),
    Status(Vec<u8>),
    Error(Vec<u8>),
    Array(Vec<Owned>),
}

impl Owned {
    pub fn as_value(&self) -> Value<'_> {
        match self {
            Owned::Nil => Value::Nil,
            Owned::Int(i) => Value::Int(*i),
            Owned::Bulk(b) => Value::Bulk(b),
            Owned::Status(s) => Value::Status(s),
            Owned::Error(e) => Value::Error(e),
            Owned::Array(a) => Value::Array(a.iter().map(Owned::as_value).collect()),
        }
    }

    pub fn int(&self) -> i64 {
        match self {
            Owned::Int(i) => *i,
            other => panic!("not an integer: {other:?}"),
        }
    }

    pub fn text(&self) -> String {
        match self {
            Owned::Bulk(b) | Owned::Status(b) | Owned::Error(b) => {
                String::from_utf8_lossy(b).into_owned()
            }
            other => panic!("not a string: {other:?}"),
        }
    }
}

pub struct Resp {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Resp {
    pub fn connect(port: u16) -> std::io::Result<Resp> {
        let w = TcpStream::connect(("127.0.0.1", port))?;
        w.set_nodelay(true)?;
        Ok(Resp {
            r: BufReader::new(w.try_clone()?),
            w,
        })
    }

    pub fn send<A: AsRef<[u8]>>(&mut self, args: &[A]) -> std::io::Result<()> {
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            let a = a.as_ref();
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
        self.w.write_all(&buf)
    }

    pub fn read(&mut self) -> std::io::Result<Owned> {
        let mut line = Vec::new();
        if self.r.read_until(b'\n', &mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let body = &line[1..line.len().saturating_sub(2)];
        let num = || -> i64 { std::str::from_utf8(body).unwrap().parse().unwrap() };
        Ok(match line[0] {
            b'+' => Owned::Status(body.to_vec()),
            b'-' => Owned::Error(body.to_vec()),
            b':' => Owned::Int(num()),
            b'$' if num() < 0 => Owned::Nil,
            b'$' => {
                let mut b = vec![0; num() as usize + 2];
                self.r.read_exact(&mut b)?;
                b.truncate(b.len() - 2);
                Owned::Bulk(b)
            }
            b'*' if num() < 0 => Owned::Nil,
            b'*' => {
                let n = num();
                let mut items = Vec::new();
                for _ in 0..n {
                    items.push(self.read()?);
                }
                Owned::Array(items)
            }
            other => panic!("unexpected RESP type byte {other}"),
        })
    }

    pub fn call<A: AsRef<[u8]>>(&mut self, args: &[A]) -> std::io::Result<Owned> {
        self.send(args)?;
        self.read()
    }

    pub fn set_read_timeout(&self, d: Option<Duration>) {
        self.w.set_read_timeout(d).unwrap();
    }

    /// Whether a reply can be read, waiting at most `wait`; an error when the peer closed.
    /// A zero wait polls without blocking (socket timeouts are rounded up to a scheduler
    /// tick, far too coarse for a poll).
    pub fn ready(&mut self, wait: Duration) -> std::io::Result<bool> {
        if !self.r.buffer().is_empty() {
            return Ok(true);
        }
        let mut one = [0u8; 1];
        let peeked = if wait < Duration::from_millis(1) {
            self.w.set_nonblocking(true)?;
            let r = self.w.peek(&mut one);
            self.w.set_nonblocking(false)?;
            r
        } else {
            self.w.set_read_timeout(Some(wait))?;
            self.w.peek(&mut one)
        };
        match peeked {
            Ok(0) => Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(_) => Ok(true),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// `calls` of one command from `INFO commandstats` (0 if never called).
    pub fn calls(&mut self, command: &str) -> u64 {
        let info = self.call(&["INFO", "commandstats"]).unwrap().text();
        let key = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&key))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    }
}

/// One client process: a core, its protocol, a commands connection and a subscriber.
pub struct Host {
    pub core: Client,
    pub proto: RedisProtocol,
    port: u16,
    cmd: Resp,
    sub: Option<Resp>,
    pub events: Vec<Event>,
}

impl Host {
    pub fn new(port: u16, seed: u8, opts: RedisOptions) -> Host {
        let mut s = [seed; 32];
        s[0] = 0x5a;
        Host {
            core: Client::new(Config::default(), &s).unwrap(),
            proto: RedisProtocol::new(opts, [seed; 16]).unwrap(),
            port,
            cmd: Resp::connect(port).unwrap(),
            sub: None,
            events: Vec::new(),
        }
    }

    pub fn acquire(&mut self, name: &str, ttl_ms: u64, wait_ms: u64) -> LeaseId {
        let mut o = AcquireOptions::new(ttl_ms);
        o.wait_ns = wait_ms * 1_000_000;
        self.core.acquire(now(), name, o).unwrap()
    }

    pub fn release(&mut self, lease: LeaseId) {
        self.core.release(now(), lease).unwrap();
    }

    /// Runs requests and feeds replies, messages and timeouts for up to `max_wait`.
    pub fn step(&mut self, max_wait: Duration) {
        while let Some(r) = self.proto.poll_request(&mut self.core) {
            let (id, conn) = (r.id, r.connection);
            let args: Vec<Vec<u8>> = r.args.iter().map(|a| a.to_vec()).collect();
            match conn {
                Connection::Commands => match self.cmd.call(&args) {
                    Ok(v) => self
                        .proto
                        .handle_reply(&mut self.core, now(), id, &v.as_value()),
                    Err(_) => self.proto.handle_request_failed(&mut self.core, now(), id),
                },
                Connection::Subscriber => {
                    if self.sub.is_none() {
                        self.sub = Resp::connect(self.port).ok();
                    }
                    let ok = self.sub.as_mut().is_some_and(|s| s.send(&args).is_ok());
                    if !ok {
                        self.sub = None;
                        self.proto.handle_request_failed(&mut self.core, now(), id);
                    }
                }
            }
        }
        while let Some(e) = self.proto.poll_event(&mut self.core) {
            self.events.push(e);
        }
        let deadline = self.proto.poll_timeout(&mut self.core).unwrap_or(u64::MAX);
        let t = now();
        let wait = Duration::from_nanos(deadline.saturating_sub(t)).min(max_wait);
        self.read_subscriber(wait);
        if self
            .proto
            .poll_timeout(&mut self.core)
            .is_some_and(|d| d <= now())
        {
            self.proto.handle_timeout(&mut self.core, now());
        }
        while let Some(e) = self.proto.poll_event(&mut self.core) {
            self.events.push(e);
        }
    }

    fn read_subscriber(&mut self, wait: Duration) {
        let mut wait = wait;
        loop {
            let Some(sub) = self.sub.as_mut() else {
                std::thread::sleep(wait);
                return;
            };
            match sub.ready(wait) {
                Ok(false) => return,
                Ok(true) => {}
                Err(_) => return self.lost_subscriber(),
            }
            sub.set_read_timeout(Some(Duration::from_secs(5)));
            match sub.read() {
                Ok(Owned::Array(items)) if items.len() == 3 => {
                    if let (Owned::Bulk(kind), Owned::Bulk(ch)) = (&items[0], &items[1]) {
                        let t = now();
                        match (kind.as_slice(), &items[2]) {
                            (b"message" | b"smessage", Owned::Bulk(p)) => {
                                self.proto.handle_message(&mut self.core, t, ch, p)
                            }
                            (b"subscribe" | b"ssubscribe", _) => {
                                self.proto.handle_subscription(&mut self.core, t, ch, true)
                            }
                            (b"unsubscribe" | b"sunsubscribe", _) => {
                                self.proto.handle_subscription(&mut self.core, t, ch, false)
                            }
                            _ => {}
                        }
                    }
                }
                Ok(_) => {}
                Err(_) => return self.lost_subscriber(),
            }
            // Take whatever else already arrived, without waiting again.
            wait = Duration::ZERO;
        }
    }

    /// The subscriber connection is gone: report it; the protocol asks to SUBSCRIBE again
    /// and we reconnect when we run that request.
    fn lost_subscriber(&mut self) {
        self.sub = None;
        let ch = self.proto.wake_channel().to_vec();
        self.proto
            .handle_subscription(&mut self.core, now(), &ch, false);
    }

    /// Steps until `done` holds or `limit` passes; whether it held.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&mut Host) -> bool) -> bool {
        let end = now() + limit.as_nanos() as u64;
        while now() < end {
            if done(self) {
                return true;
            }
            self.step(Duration::from_millis(5));
        }
        done(self)
    }

    pub fn take_acquired(&mut self, lease: LeaseId) -> Option<u64> {
        let pos = self
            .events
            .iter()
            .position(|e| matches!(e, Event::Acquired { lease: l, .. } if *l == lease))?;
        match self.events.remove(pos) {
            Event::Acquired { fencing_token, .. } => Some(fencing_token),
            _ => None,
        }
    }

    pub fn failed(&self, lease: LeaseId) -> bool {
        self.events
            .iter()
            .any(|e| matches!(e, Event::AcquireFailed { lease: l, .. } if *l == lease))
    }
}
