//! Test support: a real etcd cluster on free loopback ports (scripts/etcd-test-cluster.sh,
//! stopped by pid on drop), a small blocking HTTP/1.1 client on std's TcpStream, and a host
//! that executes the etcd protocol's requests the way a binding does: unary calls on worker
//! threads with fail-over between members, watch streams kept open, replies handed back
//! unread.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::backend::etcd::{EtcdProtocol, RequestKind};
use leasehold::{AcquireOptions, Client, Config, Event, LeaseId, LostReason};

use super::resp::now;

const MS: u64 = 1_000_000;
/// How long one member may take to answer before the host tries the next.
const TRY_TIMEOUT: Duration = Duration::from_millis(1_000);

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/etcd-test-cluster.sh")
}

/// A running cluster; every member is stopped by pid when it drops.
pub struct Cluster {
    pub dir: PathBuf,
    pub urls: Vec<String>,
}

impl Cluster {
    /// Starts `n` members, or `None` (with a message) when etcd is not installed; under
    /// `CI=true` a missing etcd fails the test.
    pub fn start(tag: &str, n: usize) -> Option<Cluster> {
        if !super::have_server("etcd", "scripts/ensure-etcd.sh") {
            return None;
        }
        let dir = std::env::temp_dir().join(format!("lh-etcd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(&dir)
            .arg(n.to_string())
            .output()
            .expect("run etcd-test-cluster.sh");
        let mut cluster = Cluster {
            dir,
            urls: Vec::new(),
        };
        assert!(
            out.status.success(),
            "cluster did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let urls = String::from_utf8(out.stdout).unwrap();
        cluster.urls = urls.trim().split(',').map(str::to_owned).collect();
        Some(cluster)
    }

    fn run(&self, cmd: &str, member: usize) -> String {
        let out = Command::new("bash")
            .arg(script())
            .arg(cmd)
            .arg(&self.dir)
            .arg((member + 1).to_string())
            .output()
            .unwrap();
        assert!(out.status.success(), "{cmd} {member}");
        String::from_utf8(out.stdout).unwrap()
    }

    /// SIGKILLs member `i` (0-based).
    pub fn kill(&self, i: usize) {
        self.run("kill", i);
    }

    /// Starts member `i` again on its data.
    pub fn restart(&self, i: usize) {
        self.run("restart", i);
    }

    pub fn pid(&self, i: usize) -> i32 {
        self.run("pid", i).trim().parse().unwrap()
    }

    /// SIGSTOP / SIGCONT of member `i`.
    pub fn pause(&self, i: usize, stop: bool) {
        let sig = if stop { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: a plain syscall on a pid this test's cluster owns.
        assert_eq!(unsafe { libc::kill(self.pid(i), sig) }, 0);
    }

    /// The member that is leader now, as seen by a live member.
    pub fn leader(&self) -> Option<usize> {
        let mut ids = Vec::new();
        let mut leader = None;
        for url in &self.urls {
            match post(url, "/v3/maintenance/status", b"{}", TRY_TIMEOUT) {
                Ok((200, body)) => {
                    let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
                    ids.push(v["header"]["member_id"].as_str().map(str::to_owned));
                    if let Some(l) = v["leader"].as_str() {
                        leader = Some(l.to_owned());
                    }
                }
                _ => ids.push(None),
            }
        }
        let leader = leader?;
        ids.iter().position(|id| id.as_deref() == Some(&leader))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn connect(base: &str, timeout: Duration) -> Result<(TcpStream, String), String> {
    let hostport = base.strip_prefix("http://").ok_or("not an http URL")?;
    let addr = hostport
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("no address")?;
    let s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    s.set_nodelay(true).ok();
    Ok((s, hostport.to_owned()))
}

fn send_post(
    s: &mut TcpStream,
    host: &str,
    path: &str,
    body: &[u8],
    auth: &str,
) -> std::io::Result<()> {
    let auth = if auth.is_empty() {
        String::new()
    } else {
        format!("Authorization: {auth}\r\n")
    };
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut msg = head.into_bytes();
    msg.extend_from_slice(body);
    s.write_all(&msg)
}

/// Reads the status line and headers; returns the status and whether the body is chunked.
fn read_head(r: &mut BufReader<TcpStream>) -> Result<(u16, bool, Option<usize>), String> {
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| e.to_string())?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {line:?}"))?;
    let (mut chunked, mut length) = (false, None);
    loop {
        line.clear();
        if r.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Err("eof in headers".into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            return Ok((status, chunked, length));
        }
        let lower = l.to_ascii_lowercase();
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().ok();
        }
    }
}

/// Reads one chunk (`None` at the last one).
fn read_chunk(r: &mut BufReader<TcpStream>) -> Result<Option<Vec<u8>>, String> {
    let mut line = String::new();
    if r.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
        return Err("eof in chunk size".into());
    }
    let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
        .map_err(|_| format!("bad chunk size {line:?}"))?;
    if size == 0 {
        return Ok(None);
    }
    let mut buf = vec![0; size + 2];
    r.read_exact(&mut buf).map_err(|e| e.to_string())?;
    buf.truncate(size);
    Ok(Some(buf))
}

/// One blocking POST: the status and the whole body.
pub fn post(
    base: &str,
    path: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<(u16, Vec<u8>), String> {
    post_auth(base, path, body, "", timeout)
}

/// One blocking POST with an `Authorization` header (unless empty).
pub fn post_auth(
    base: &str,
    path: &str,
    body: &[u8],
    auth: &str,
    timeout: Duration,
) -> Result<(u16, Vec<u8>), String> {
    let (mut s, host) = connect(base, timeout)?;
    s.set_read_timeout(Some(timeout)).ok();
    s.set_write_timeout(Some(timeout)).ok();
    send_post(&mut s, &host, path, body, auth).map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s);
    let (status, chunked, length) = read_head(&mut r)?;
    let mut out = Vec::new();
    if chunked {
        while let Some(c) = read_chunk(&mut r)? {
            out.extend_from_slice(&c);
        }
    } else if let Some(n) = length {
        out.resize(n, 0);
        r.read_exact(&mut out).map_err(|e| e.to_string())?;
    } else {
        r.read_to_end(&mut out).map_err(|e| e.to_string())?;
    }
    Ok((status, out))
}

enum Msg {
    Reply(u64, u16, Vec<u8>),
    Failed(u64, String),
    Stream(u64, Vec<u8>),
}

/// One client process: a core, its etcd protocol and the executor.
pub struct Host {
    pub core: Client,
    pub proto: EtcdProtocol,
    urls: Arc<Vec<String>>,
    preferred: Arc<AtomicUsize>,
    tx: Sender<Msg>,
    rx: Receiver<Msg>,
    streams: Arc<Mutex<HashMap<u64, Option<TcpStream>>>>,
    pub events: Vec<Event>,
}

impl Host {
    pub fn new(urls: &[String], seed: u8, first_member: usize) -> Host {
        Self::with_protocol(urls, seed, first_member, EtcdProtocol::new())
    }

    pub fn with_protocol(
        urls: &[String],
        seed: u8,
        first_member: usize,
        proto: EtcdProtocol,
    ) -> Host {
        let (tx, rx) = channel();
        Host {
            core: Client::new(Config::default(), &[seed; 32]).unwrap(),
            proto,
            urls: Arc::new(urls.to_vec()),
            preferred: Arc::new(AtomicUsize::new(first_member % urls.len())),
            tx,
            rx,
            streams: Arc::new(Mutex::new(HashMap::new())),
            events: Vec::new(),
        }
    }

    pub fn acquire(&mut self, name: &str, ttl_ms: u64, wait_ms: u64) -> LeaseId {
        let lease = self
            .core
            .acquire(
                now(),
                name,
                AcquireOptions::new(ttl_ms).wait_ns(wait_ms * MS),
            )
            .unwrap();
        self.pump();
        lease
    }

    pub fn release(&mut self, lease: LeaseId) {
        self.core.release(now(), lease).unwrap();
        self.pump();
    }

    pub fn acquired(&self, lease: LeaseId) -> Option<u64> {
        self.events.iter().find_map(|e| match e {
            Event::Acquired {
                lease: l,
                fencing_token,
                ..
            } if *l == lease => Some(*fencing_token),
            _ => None,
        })
    }

    pub fn lost(&self, lease: LeaseId) -> Option<LostReason> {
        self.events.iter().find_map(|e| match e {
            Event::Lost { lease: l, reason } if *l == lease => Some(*reason),
            _ => None,
        })
    }

    pub fn failed(&self, lease: LeaseId) -> bool {
        self.events
            .iter()
            .any(|e| matches!(e, Event::AcquireFailed { lease: l, .. } if *l == lease))
    }

    /// Runs requests and drains events.
    fn pump(&mut self) {
        while let Some(r) = self.proto.poll_request(&mut self.core) {
            let (id, kind, path, body) = (r.id, r.kind, r.path, r.body.to_vec());
            let auth = r.authorization.to_owned();
            match kind {
                RequestKind::Unary => self.unary(id, path, body, auth),
                RequestKind::Watch => self.watch(id, path, body, auth),
                RequestKind::CancelWatch => {
                    if let Some(Some(s)) = self.streams.lock().unwrap().remove(&id) {
                        let _ = s.shutdown(Shutdown::Both);
                    }
                }
            }
        }
        while let Some(e) = self.proto.poll_event(&mut self.core) {
            self.events.push(e);
        }
    }

    fn unary(&self, id: u64, path: &'static str, body: Vec<u8>, auth: String) {
        let (urls, preferred, tx) = (self.urls.clone(), self.preferred.clone(), self.tx.clone());
        std::thread::spawn(move || {
            let start = preferred.load(Ordering::Relaxed);
            let mut last = String::new();
            for k in 0..urls.len() {
                let i = (start + k) % urls.len();
                match post_auth(&urls[i], path, &body, &auth, TRY_TIMEOUT) {
                    Ok((status, reply)) => {
                        preferred.store(i, Ordering::Relaxed);
                        let _ = tx.send(Msg::Reply(id, status, reply));
                        return;
                    }
                    Err(e) => last = e,
                }
            }
            // The next request starts at another member.
            preferred.store((start + 1) % urls.len(), Ordering::Relaxed);
            let _ = tx.send(Msg::Failed(id, last));
        });
    }

    fn watch(&self, id: u64, path: &'static str, body: Vec<u8>, auth: String) {
        let (urls, preferred, tx, streams) = (
            self.urls.clone(),
            self.preferred.clone(),
            self.tx.clone(),
            self.streams.clone(),
        );
        streams.lock().unwrap().insert(id, None);
        std::thread::spawn(move || {
            let i = preferred.load(Ordering::Relaxed) % urls.len();
            let result = (|| -> Result<(), String> {
                let (mut s, host) = connect(&urls[i], TRY_TIMEOUT)?;
                {
                    let mut map = streams.lock().unwrap();
                    match map.get_mut(&id) {
                        Some(slot) => *slot = Some(s.try_clone().map_err(|e| e.to_string())?),
                        None => return Ok(()), // cancelled meanwhile
                    }
                }
                send_post(&mut s, &host, path, &body, &auth).map_err(|e| e.to_string())?;
                let mut r = BufReader::new(s);
                let (status, chunked, _) = read_head(&mut r)?;
                if status != 200 || !chunked {
                    return Err(format!("watch answered {status}"));
                }
                let mut pending = Vec::new();
                while let Some(c) = read_chunk(&mut r)? {
                    pending.extend_from_slice(&c);
                    while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
                        let line: Vec<u8> = pending.drain(..=nl).collect();
                        let line = line[..line.len() - 1].to_vec();
                        if !line.is_empty() {
                            let _ = tx.send(Msg::Stream(id, line));
                        }
                    }
                }
                Err("watch stream ended".into())
            })();
            let live = streams.lock().unwrap().remove(&id).is_some();
            if live {
                let _ = tx.send(Msg::Failed(
                    id,
                    result.err().unwrap_or_else(|| "ended".into()),
                ));
            }
        });
    }

    /// Drives the host until `done` holds or `limit` passes; returns whether `done` held.
    #[allow(clippy::disallowed_methods)]
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&mut Host) -> bool) -> bool {
        let start = Instant::now();
        loop {
            self.pump();
            if done(self) {
                return true;
            }
            if start.elapsed() >= limit {
                return false;
            }
            let t = now();
            let wait = match self.proto.poll_timeout(&mut self.core) {
                Some(d) if d <= t => 0,
                Some(d) => (d - t).min(10 * MS),
                None => 10 * MS,
            };
            match self.rx.recv_timeout(Duration::from_nanos(wait)) {
                Ok(Msg::Reply(id, status, body)) => {
                    self.proto
                        .handle_reply(&mut self.core, now(), id, status, &body)
                }
                Ok(Msg::Failed(id, e)) => self.proto.handle_failed(&mut self.core, now(), id, &e),
                Ok(Msg::Stream(id, line)) => {
                    self.proto
                        .handle_watch_message(&mut self.core, now(), id, &line)
                }
                Err(RecvTimeoutError::Timeout) => self.proto.handle_timeout(&mut self.core, now()),
                Err(RecvTimeoutError::Disconnected) => unreachable!("the host holds a sender"),
            }
        }
    }

    /// Drives the host for `d`.
    pub fn run_for(&mut self, d: Duration) {
        self.run_until(d, |_| false);
    }

    /// Closes every watch stream (a host that stops).
    pub fn close(&mut self) {
        for (_, s) in self.streams.lock().unwrap().drain() {
            if let Some(s) = s {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.close();
    }
}
