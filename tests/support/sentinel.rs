//! A throw-away Redis Sentinel topology on free loopback ports: 1 master, 1 replica and 3
//! sentinels (quorum 2, `down-after-milliseconds` 1000, `failover-timeout` 3000), every
//! process stopped by pid on drop. Sentinels run as `redis-server --sentinel`, as in
//! scripts/redis-sentinel-test.sh.
#![allow(dead_code)]
// A test host reads its clock; only the core must not.
#![allow(clippy::disallowed_methods)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::resp::{Owned, Resp};

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "leasehold";

pub struct Topology {
    dir: PathBuf,
    /// Each process by the port it listens on.
    procs: Vec<(u16, Child)>,
    pub master: u16,
    pub replica: u16,
    pub sentinels: Vec<u16>,
}

fn free_ports(n: usize) -> Vec<u16> {
    // Held together so no two are the same.
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// Polls `port` with `args` until the reply's text contains `text`.
fn wait_for(port: u16, args: &[&str], text: &str, limit: Duration) {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let Ok(mut c) = Resp::connect(port) {
            if let Ok(Owned::Bulk(b) | Owned::Status(b)) = c.call(args) {
                if String::from_utf8_lossy(&b).contains(text) {
                    return;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("port {port}: {args:?} never showed {text:?}");
}

impl Topology {
    /// Starts the topology and waits until every sentinel knows the replica and the other
    /// sentinels (a failover needs both). `None` (with a message) when redis-server is not
    /// installed; under `CI=true` that fails the test.
    pub fn start() -> Option<Topology> {
        // (Sentinel runs as redis-server --sentinel.)
        if !super::have_server("redis-server", "scripts/ensure-redis.sh") {
            return None;
        }
        let ports = free_ports(5);
        let dir =
            std::env::temp_dir().join(format!("lh-sentinel-{}-{}", std::process::id(), ports[0]));
        std::fs::create_dir_all(&dir).unwrap();
        let mut t = Topology {
            dir,
            procs: Vec::new(),
            master: ports[0],
            replica: ports[1],
            sentinels: ports[2..].to_vec(),
        };
        let common = [
            "--bind",
            "127.0.0.1",
            "--protected-mode",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
        ];
        let master = t.master.to_string();
        // Its own directory: a replica writes the RDB it syncs from.
        let dir = t.dir.to_str().unwrap().to_owned();
        t.spawn(t.master, &["--port", &master, "--dir", &dir], &common);
        t.spawn(
            t.replica,
            &[
                "--port",
                &t.replica.to_string(),
                "--dir",
                &dir,
                "--replicaof",
                "127.0.0.1",
                &master,
            ],
            &common,
        );
        for port in t.sentinels.clone() {
            let conf = t.dir.join(format!("sentinel-{port}.conf"));
            // Sentinel rewrites its config file: it must be its own and writable.
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                     sentinel failover-timeout {MASTER_NAME} 3000\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir = t.dir.display()
                ),
            )
            .unwrap();
            t.spawn(port, &[conf.to_str().unwrap(), "--sentinel"], &[]);
        }
        let limit = Duration::from_secs(20);
        wait_for(t.master, &["PING"], "PONG", limit);
        wait_for(
            t.replica,
            &["INFO", "replication"],
            "master_link_status:up",
            limit,
        );
        for &s in &t.sentinels {
            wait_for(s, &["INFO", "sentinel"], "slaves=1", limit);
            wait_for(s, &["INFO", "sentinel"], "sentinels=3", limit);
        }
        Some(t)
    }

    fn spawn(&mut self, port: u16, args: &[&str], common: &[&str]) {
        let child = Command::new("redis-server")
            .args(args)
            .args(common)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.procs.push((port, child));
    }

    /// `redis+sentinel://` with these sentinels (`extra` first: e.g. one that is down).
    pub fn url(&self, extra: &[u16], rest: &str) -> String {
        let hosts: Vec<String> = extra
            .iter()
            .chain(&self.sentinels)
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{rest}", hosts.join(","))
    }

    /// The master's port as the first sentinel that answers reports it.
    pub fn master_now(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|&s| {
            let mut c = Resp::connect(s).ok()?;
            match c.call(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME]) {
                Ok(Owned::Array(v)) if v.len() == 2 => v[1].text().parse().ok(),
                _ => None,
            }
        })
    }

    /// SIGKILLs the process listening on `port`.
    pub fn kill(&mut self, port: u16) {
        for (p, child) in &mut self.procs {
            if *p == port {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for (_, child) in &mut self.procs {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
