//! Redis Cluster's slot arithmetic and topology replies: the hash slot of a key (CRC16/XMODEM
//! of its hash tag, as Redis computes it), the slot a request's argument vector goes to, and
//! the slot table read from `CLUSTER SHARDS` or `CLUSTER SLOTS` (RESP2 or RESP3). A reply of
//! the wrong shape is a [`ClusterError`], never a panic.

use crate::backend::redis::url::Endpoint;
use crate::backend::redis::wire::Reply;

/// Slots of a Redis Cluster.
pub(crate) const SLOTS: usize = 16384;
/// Most nodes one topology reply may name.
pub(crate) const MAX_NODES: usize = 1000;
const MAX_HOST_LEN: usize = 255;

/// Why a topology reply was not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    /// A reply without the shape the command has.
    #[error("the cluster's topology reply is malformed: {0}")]
    Malformed(&'static str),
    /// A well-formed reply that serves no slot (a cluster not set up yet).
    #[error("the cluster's topology reply assigns no slot to a master")]
    NoSlots,
    /// More nodes than a client keeps links for.
    #[error("the cluster names more than 1000 nodes")]
    TooManyNodes,
}

/// CRC16/XMODEM (polynomial 0x1021, initial 0), the checksum of Redis Cluster key slots.
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The hash slot of `key`: of the text between the first `{` and the next `}` when that is
/// not empty, else of the whole key.
pub fn hash_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS as u16
}

/// The slot a request runs in: its first key (a script call with keys), its channel (sharded
/// pub/sub), else its first argument; `None` for a command without one.
pub fn request_slot<A: AsRef<[u8]>>(args: &[A]) -> Option<u16> {
    let name = args.first()?.as_ref().to_ascii_uppercase();
    let key = match name.as_slice() {
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" | b"FCALL_RO" => {
            let keys: usize = std::str::from_utf8(args.get(2)?.as_ref())
                .ok()?
                .parse()
                .ok()?;
            if keys == 0 {
                return None;
            }
            args.get(3)?
        }
        _ => args.get(1)?,
    };
    Some(hash_slot(key.as_ref()))
}

/// A topology: the masters' slot ranges and every node named (masters and replicas), to ask
/// again later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// `(first slot, last slot, master)`.
    pub ranges: Vec<(u16, u16, Endpoint)>,
    /// Every node of the reply, masters first.
    pub nodes: Vec<Endpoint>,
}

fn text(r: &Reply) -> Option<&[u8]> {
    match r {
        Reply::Bulk(b) | Reply::Status(b) | Reply::Verbatim(b) => Some(b),
        _ => None,
    }
}

fn int(r: &Reply) -> Option<i64> {
    match r {
        Reply::Int(i) => Some(*i),
        other => std::str::from_utf8(text(other)?).ok()?.parse().ok(),
    }
}

/// A map's fields: a RESP3 map or a RESP2 flat array of names and values.
fn fields(r: &Reply) -> Option<Vec<(&[u8], &Reply)>> {
    match r {
        Reply::Map(pairs) => pairs.iter().map(|(k, v)| Some((text(k)?, v))).collect(),
        Reply::Array(items) if items.len() % 2 == 0 => items
            .chunks(2)
            .map(|kv| Some((text(&kv[0])?, &kv[1])))
            .collect(),
        _ => None,
    }
}

fn field<'a>(fields: &[(&[u8], &'a Reply)], name: &str) -> Option<&'a Reply> {
    fields
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name.as_bytes()))
        .map(|(_, v)| *v)
}

/// A node's address; an empty or unknown (`?`) host is the host of the node asked.
fn endpoint(host: &[u8], port: i64, asked: &Endpoint, tls: bool) -> Result<Endpoint, ClusterError> {
    let host = match (host, asked) {
        (b"" | b"?", Endpoint::Tcp { host, .. }) => host.as_str(),
        (b"" | b"?", Endpoint::Unix { .. }) => {
            return Err(ClusterError::Malformed("a node has no host"));
        }
        (h, _) => std::str::from_utf8(h)
            .ok()
            .filter(|h| h.len() <= MAX_HOST_LEN)
            .filter(|h| !h.contains(|c: char| c.is_whitespace() || c.is_control()))
            .ok_or(ClusterError::Malformed("a node's host is not a host name"))?,
    };
    let port = u16::try_from(port)
        .ok()
        .filter(|&p| p != 0)
        .ok_or(ClusterError::Malformed("a node's port is not in 1..=65535"))?;
    Ok(Endpoint::Tcp {
        host: host.to_owned(),
        port,
        tls,
        server_name: host.to_owned(),
    })
}

fn range(start: Option<i64>, end: Option<i64>) -> Result<(u16, u16), ClusterError> {
    let bad = ClusterError::Malformed("a slot range is not two slots in 0..16384, in order");
    let (Some(s), Some(e)) = (start, end) else {
        return Err(bad);
    };
    match (u16::try_from(s), u16::try_from(e)) {
        (Ok(s), Ok(e)) if s <= e && usize::from(e) < SLOTS => Ok((s, e)),
        _ => Err(bad),
    }
}

fn add_node(nodes: &mut Vec<Endpoint>, e: &Endpoint) -> Result<(), ClusterError> {
    if !nodes.contains(e) {
        if nodes.len() == MAX_NODES {
            return Err(ClusterError::TooManyNodes);
        }
        nodes.push(e.clone());
    }
    Ok(())
}

fn finish(mut t: Topology, replicas: Vec<Endpoint>) -> Result<Topology, ClusterError> {
    if t.ranges.is_empty() {
        return Err(ClusterError::NoSlots);
    }
    for r in &replicas {
        add_node(&mut t.nodes, r)?;
    }
    Ok(t)
}

/// Reads `CLUSTER SHARDS` (Redis 7+): per shard its slot ranges and nodes; the shard's
/// master (`role` master, an `online` one preferred) serves them. `asked`: the node that
/// answered; `tls`: the port to use is `tls-port` when the node has one.
pub fn parse_shards(reply: &Reply, asked: &Endpoint, tls: bool) -> Result<Topology, ClusterError> {
    let Reply::Array(shards) = reply else {
        return Err(ClusterError::Malformed("CLUSTER SHARDS is not an array"));
    };
    let mut t = Topology {
        ranges: Vec::new(),
        nodes: Vec::new(),
    };
    let mut replicas = Vec::new();
    for shard in shards {
        let shard = fields(shard).ok_or(ClusterError::Malformed("a shard is not a map"))?;
        let Some(Reply::Array(slots)) = field(&shard, "slots") else {
            return Err(ClusterError::Malformed("a shard has no slots array"));
        };
        let Some(Reply::Array(nodes)) = field(&shard, "nodes") else {
            return Err(ClusterError::Malformed("a shard has no nodes array"));
        };
        if slots.len() % 2 != 0 {
            return Err(ClusterError::Malformed("a shard's slots are not pairs"));
        }
        // (endpoint, is master, is online)
        let mut members = Vec::new();
        for node in nodes {
            let node = fields(node).ok_or(ClusterError::Malformed("a node is not a map"))?;
            let host = field(&node, "endpoint")
                .and_then(text)
                .filter(|h| !h.is_empty() && *h != b"?")
                .or_else(|| field(&node, "ip").and_then(text))
                .ok_or(ClusterError::Malformed("a node has no endpoint or ip"))?;
            let tls_port = field(&node, "tls-port").and_then(int).filter(|_| tls);
            let port = tls_port
                .or_else(|| field(&node, "port").and_then(int))
                .ok_or(ClusterError::Malformed("a node has no port"))?;
            let role = field(&node, "role").and_then(text).unwrap_or_default();
            let online = field(&node, "health").and_then(text) == Some(b"online");
            members.push((endpoint(host, port, asked, tls)?, role == b"master", online));
        }
        let master = members
            .iter()
            .filter(|m| m.1)
            .max_by_key(|m| m.2)
            .map(|m| m.0.clone());
        for m in &members {
            if Some(&m.0) != master.as_ref() {
                replicas.push(m.0.clone());
            }
        }
        let Some(master) = master else { continue };
        if slots.is_empty() {
            // Serves nothing, but may answer the next question.
            replicas.push(master);
            continue;
        }
        add_node(&mut t.nodes, &master)?;
        for pair in slots.chunks(2) {
            let (s, e) = range(int(&pair[0]), int(&pair[1]))?;
            t.ranges.push((s, e, master.clone()));
        }
    }
    finish(t, replicas)
}

/// Reads `CLUSTER SLOTS`: `[first, last, [host, port, …], replica…]` per range.
pub fn parse_slots(reply: &Reply, asked: &Endpoint, tls: bool) -> Result<Topology, ClusterError> {
    let Reply::Array(entries) = reply else {
        return Err(ClusterError::Malformed("CLUSTER SLOTS is not an array"));
    };
    let mut t = Topology {
        ranges: Vec::new(),
        nodes: Vec::new(),
    };
    let mut replicas = Vec::new();
    for entry in entries {
        let Reply::Array(items) = entry else {
            return Err(ClusterError::Malformed("a slot range is not an array"));
        };
        if items.len() < 3 {
            return Err(ClusterError::Malformed("a slot range names no master"));
        }
        let (s, e) = range(int(&items[0]), int(&items[1]))?;
        let mut servers = Vec::new();
        for node in &items[2..] {
            let Reply::Array(node) = node else {
                return Err(ClusterError::Malformed("a node is not an array"));
            };
            let (Some(host), Some(port)) = (node.first().and_then(text), node.get(1).and_then(int))
            else {
                return Err(ClusterError::Malformed("a node is not a host and a port"));
            };
            servers.push(endpoint(host, port, asked, tls)?);
        }
        let master = servers.remove(0);
        add_node(&mut t.nodes, &master)?;
        t.ranges.push((s, e, master));
        replicas.extend(servers);
    }
    finish(t, replicas)
}
