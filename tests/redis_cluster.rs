//! The Redis protocol's keys on a real Redis Cluster (scripts/redis-cluster-test.sh: six nodes
//! on free loopback ports, stopped by pid): every name's keys and shard wake channel share
//! one slot, so its scripts run on one node, whatever braces the name holds. Without
//! redis-server the test skips with a message, except under `CI=true`.

mod support;

use leasehold::backend::redis::{
    Connection, KeyKind, RedisOptions, RedisProtocol, Script, key, shard_channel,
};
use leasehold::{AcquireOptions, Client, Config, Event};
use support::cluster::Cluster;
use support::resp::{Owned, Resp};

/// Runs `args` on the node owning its keys: sent to `port`, following one MOVED.
fn call_routed(port: u16, args: &[Vec<u8>]) -> Owned {
    let reply = Resp::connect(port).unwrap().call(args).unwrap();
    if let Owned::Error(e) = &reply {
        let e = String::from_utf8_lossy(e);
        if let Some(rest) = e.strip_prefix("MOVED ") {
            let to: u16 = rest.rsplit(':').next().unwrap().parse().unwrap();
            return Resp::connect(to).unwrap().call(args).unwrap();
        }
    }
    reply
}

#[test]
fn names_with_braces_keep_every_key_in_one_slot_and_their_scripts_run() {
    let Some(cluster) = Cluster::start("rcluster") else {
        return;
    };
    let port = cluster.ports[0];
    let mut admin = Resp::connect(port).unwrap();
    for p in &cluster.ports {
        for s in Script::ALL {
            let mut c = Resp::connect(*p).unwrap();
            assert!(matches!(
                c.call(&["SCRIPT", "LOAD", s.text()]).unwrap(),
                Owned::Bulk(_)
            ));
        }
    }
    let opts = RedisOptions {
        sharded_wake: true,
        ..RedisOptions::default()
    };
    for name in ["}x", "{", "}", "a}b", "{}", "}{", "ünï}cødé{", "jobs"] {
        // The cluster's own slot computation agrees for every key and the channel.
        let mut all: Vec<Vec<u8>> = KeyKind::ALL
            .iter()
            .map(|&k| key(k, name).unwrap())
            .collect();
        all.push(shard_channel(name).unwrap());
        let slots: Vec<i64> = all
            .iter()
            .map(|k| admin.call(&[&b"CLUSTER"[..], b"KEYSLOT", k]).unwrap().int())
            .collect();
        assert!(slots.iter().all(|s| *s == slots[0]), "{name:?}: {slots:?}");
        // ACQUIRE and RELEASE run (no CROSSSLOT) and grant, with SPUBLISH on the channel.
        let mut core = Client::new(Config::default(), &[7; 32]).unwrap();
        let mut proto = RedisProtocol::new(opts, [3; 16]).unwrap();
        let lease = core.acquire(1, name, AcquireOptions::new(5_000)).unwrap();
        let mut granted = None;
        let mut released = false;
        for round in 0..6 {
            while let Some(r) = proto.poll_request(&mut core) {
                if r.connection != Connection::Commands {
                    continue;
                }
                let (id, args): (u64, Vec<Vec<u8>>) =
                    (r.id, r.args.iter().map(|a| a.to_vec()).collect());
                let reply = call_routed(port, &args);
                assert!(
                    !matches!(&reply, Owned::Error(_)),
                    "{name:?}: {:?} -> {reply:?}",
                    String::from_utf8_lossy(&args[0])
                );
                proto.handle_reply(&mut core, 2 + round, id, &reply.as_value());
            }
            while let Some(ev) = proto.poll_event(&mut core) {
                match ev {
                    Event::Acquired { fencing_token, .. } => granted = Some(fencing_token),
                    Event::Released { .. } => released = true,
                    _ => {}
                }
            }
            if granted.is_some() && !released && round == 1 {
                core.release(3, lease).unwrap();
            }
        }
        assert!(granted.is_some(), "{name:?} granted");
        assert!(released, "{name:?} released");
    }
}
