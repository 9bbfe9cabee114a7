//! A small synchronous SQL host for the real-database tests: it executes the protocol's
//! requests verbatim on a real connection (rusqlite or postgres), binds the host facts and
//! hands the rows back — what every binding's executor does, and nothing more.
#![allow(dead_code)]
// A host reads clocks: that is its job (the core never does).
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use leasehold::backend::sql::{
    Connection, Dialect, FailureKind, HostValue, Param, Request, Rows, SqlOptions, SqlProtocol,
    SqlValue,
};
use leasehold::{AcquireOptions, Client, Config, Event, LeaseId};

pub const MS: u64 = 1_000_000;

/// A column value owned by the host until it is handed over.
#[derive(Debug, Clone, PartialEq)]
pub enum Owned {
    Null,
    Int(i64),
    Float(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl Owned {
    fn view(&self) -> SqlValue<'_> {
        match self {
            Owned::Null => SqlValue::Null,
            Owned::Int(i) => SqlValue::Int(*i),
            Owned::Float(f) => SqlValue::Float(*f),
            Owned::Text(s) => SqlValue::Text(s.as_bytes()),
            Owned::Blob(b) => SqlValue::Blob(b),
        }
    }
}

pub type OwnedRows = Vec<Vec<Owned>>;

/// Host facts, read once per request.
pub struct Facts {
    pub mono_ns: i64,
    pub wall_us: i64,
    pub boot_id: String,
    pub pid: i64,
    pub host: String,
}

pub fn monotonic_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

pub fn facts() -> Facts {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    Facts {
        mono_ns: monotonic_ns(),
        wall_us: wall.as_micros() as i64,
        boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .unwrap_or_default()
            .trim()
            .to_owned(),
        pid: i64::from(std::process::id()),
        host: "testhost".into(),
    }
}

/// Binds a parameter to an owned value (host facts resolved).
pub fn bind(p: &Param, f: &Facts) -> Owned {
    match p {
        Param::Null => Owned::Null,
        Param::Int(i) => Owned::Int(*i),
        Param::Text(s) => Owned::Text(s.clone()),
        Param::Blob(b) => Owned::Blob(b.clone()),
        Param::Host(HostValue::MonotonicNs) => Owned::Int(f.mono_ns),
        Param::Host(HostValue::WallUs) => Owned::Int(f.wall_us),
        Param::Host(HostValue::BootId) => Owned::Text(f.boot_id.clone()),
        Param::Host(HostValue::Pid) => Owned::Int(f.pid),
        Param::Host(HostValue::HostName) => Owned::Text(f.host.clone()),
    }
}

/// Runs requests on a real database.
pub trait Executor {
    fn execute(&mut self, req: &Request<'_>) -> Result<Vec<OwnedRows>, (FailureKind, String)>;
    /// Notifications received on the listener (channel, payload), waiting at most `wait`.
    fn notifications(&mut self, _wait: Duration) -> Vec<(String, String)> {
        Vec::new()
    }
    /// The connections opened anew since the last call (after a failure, a replaced file).
    fn take_resets(&mut self) -> Vec<Connection> {
        Vec::new()
    }
}

/// One client core with the SQL protocol and an executor, driven synchronously.
pub struct Host<E: Executor> {
    pub core: Client,
    pub proto: SqlProtocol,
    pub exec: E,
    epoch: Instant,
    pub events: Vec<Event>,
    pub failures: u64,
}

impl<E: Executor> Host<E> {
    pub fn new(dialect: Dialect, opts: SqlOptions, exec: E, seed: u8) -> Self {
        let mut cfg = Config {
            notifications: dialect == Dialect::Postgres,
            ..Config::default()
        };
        cfg.request_timeout_ns = 10_000 * MS;
        let mut s = [seed; 32];
        s[..8].copy_from_slice(&(std::process::id() as u64).to_le_bytes());
        s[8] = seed;
        Self {
            core: Client::new(cfg, &s).unwrap(),
            proto: SqlProtocol::new(dialect, opts).unwrap(),
            exec,
            epoch: Instant::now(),
            events: Vec::new(),
            failures: 0,
        }
    }

    pub fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Executes every pending request and collects events.
    pub fn pump(&mut self) {
        while let Some(req) = self.proto.poll_request(&mut self.core) {
            let id = req.id;
            let outcome = self.exec.execute(&req);
            let now = self.now();
            match outcome {
                Ok(rows) => {
                    let views: Vec<Rows<'_>> = rows
                        .iter()
                        .map(|r| {
                            r.iter()
                                .map(|row| row.iter().map(Owned::view).collect())
                                .collect()
                        })
                        .collect();
                    self.proto.handle_rows(&mut self.core, now, id, &views);
                }
                Err((kind, msg)) => {
                    self.failures += 1;
                    self.proto
                        .handle_failed(&mut self.core, now, id, kind, &msg);
                }
            }
            self.resets();
        }
        while let Some(ev) = self.proto.poll_event(&mut self.core) {
            self.events.push(ev);
        }
    }

    fn resets(&mut self) {
        for c in self.exec.take_resets() {
            let now = self.now();
            self.proto.handle_connection_reset(&mut self.core, now, c);
        }
    }

    /// Waits for the next deadline or a notification, then feeds it.
    pub fn wait_step(&mut self, cap: Duration) {
        let now = self.now();
        let deadline = self.proto.poll_timeout(&mut self.core).unwrap_or(u64::MAX);
        let wait = Duration::from_nanos(deadline.saturating_sub(now)).min(cap);
        let notes = self.exec.notifications(wait);
        self.resets();
        if notes.is_empty() {
            let left = Duration::from_nanos(deadline.saturating_sub(self.now())).min(cap);
            std::thread::sleep(left);
        }
        for (ch, payload) in notes {
            let now = self.now();
            self.proto
                .handle_notification(&mut self.core, now, ch.as_bytes(), payload.as_bytes());
        }
        let now = self.now();
        self.proto.handle_timeout(&mut self.core, now);
        self.pump();
    }

    /// Acquires `name`, waiting at most `wait`: the fence, or the failure event.
    pub fn acquire(
        &mut self,
        name: &str,
        ttl_ms: u64,
        wait: Duration,
    ) -> Result<(LeaseId, u64), Event> {
        let now = self.now();
        let lease = self
            .core
            .acquire(
                now,
                name,
                AcquireOptions::new(ttl_ms).wait_ns(wait.as_nanos() as u64),
            )
            .unwrap();
        self.pump();
        loop {
            if let Some(i) = self.events.iter().position(|e| match e {
                Event::Acquired { lease: l, .. } | Event::AcquireFailed { lease: l, .. } => {
                    *l == lease
                }
                _ => false,
            }) {
                return match self.events.remove(i) {
                    Event::Acquired { fencing_token, .. } => Ok((lease, fencing_token)),
                    other => Err(other),
                };
            }
            self.wait_step(Duration::from_millis(50));
        }
    }

    /// Releases and runs the release request.
    pub fn release(&mut self, lease: LeaseId) {
        let now = self.now();
        self.core.release(now, lease).unwrap();
        self.pump();
    }
}
