//! A throw-away Redis Cluster (scripts/redis-cluster-test.sh: 3 masters and 3 replicas on
//! free loopback ports), every process stopped by pid when dropped.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

use leasehold::backend::redis::stream::cluster::hash_slot;
use leasehold::backend::redis::{KeyKind, key};

use super::resp::{Owned, Resp};

pub struct Cluster {
    dir: PathBuf,
    /// The six nodes' ports.
    pub ports: Vec<u16>,
}

fn script() -> String {
    format!(
        "{}/scripts/redis-cluster-test.sh",
        env!("CARGO_MANIFEST_DIR")
    )
}

impl Cluster {
    /// Starts one (`tag` names its directory); `None` (a skip, said on stderr) without
    /// redis-server, except under `CI=true`, where that is a failure.
    pub fn start(tag: &str) -> Option<Cluster> {
        if !super::have_server("redis-server", "scripts/ensure-redis.sh") {
            return None;
        }
        let dir = std::env::temp_dir().join(format!("lh-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = Cluster {
            dir,
            ports: Vec::new(),
        };
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(&c.dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cluster start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let nodes = text
            .lines()
            .find_map(|l| l.strip_prefix("nodes "))
            .expect("addresses");
        c.ports = nodes
            .split(',')
            .map(|a| a.rsplit(':').next().unwrap().parse().unwrap())
            .collect();
        Some(c)
    }

    /// SIGKILL of the node on `port`.
    pub fn kill(&self, port: u16) {
        let out = Command::new("bash")
            .arg(script())
            .arg("pid")
            .arg(&self.dir)
            .arg(port.to_string())
            .output()
            .unwrap();
        let pid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(!pid.is_empty(), "no pid for {port}");
        assert!(
            Command::new("kill")
                .args(["-KILL", &pid])
                .status()
                .unwrap()
                .success()
        );
    }

    /// The master serving `name`'s slot, as node `via` sees it.
    pub fn owner(&self, via: u16, name: &str) -> Option<u16> {
        let slot = i64::from(hash_slot(&key(KeyKind::Lock, name).unwrap()));
        let Ok(Owned::Array(ranges)) = Resp::connect(via).ok()?.call(&["CLUSTER", "SLOTS"]) else {
            return None;
        };
        ranges.iter().find_map(|r| match r {
            Owned::Array(items) if items[0].int() <= slot && slot <= items[1].int() => {
                match &items[2] {
                    Owned::Array(node) => u16::try_from(node[1].int()).ok(),
                    _ => None,
                }
            }
            _ => None,
        })
    }

    /// `redis+cluster://` with these seed nodes.
    pub fn url(&self, seeds: &[u16]) -> String {
        let seeds: Vec<String> = seeds.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+cluster://{}", seeds.join(","))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
