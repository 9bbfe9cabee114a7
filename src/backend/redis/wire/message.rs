//! What a reply says beyond its value: the code of an error reply (so a caller can reload a
//! script, follow a redirection or give up) and the kind of a push message.

use super::codec::Reply;

/// The code of an error reply, with what a caller needs to act on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// `NOSCRIPT`: the script is not cached; load it (EVAL or SCRIPT LOAD) and retry.
    NoScript,
    /// `MOVED slot host:port`: the slot lives on another node from now on.
    Moved(Redirect),
    /// `ASK slot host:port`: ask that node once, after `ASKING`.
    Ask(Redirect),
    /// `TRYAGAIN`: a multi-key command during a slot migration; retry shortly.
    TryAgain,
    /// `CLUSTERDOWN`: the cluster cannot serve the slot.
    ClusterDown,
    /// `LOADING`: the server is loading its dataset.
    Loading,
    /// `BUSY`: a script runs too long.
    Busy,
    /// `READONLY`: a write reached a replica (the master moved).
    ReadOnly,
    /// `MASTERDOWN`: a replica lost its master.
    MasterDown,
    /// `NOAUTH`: authentication is required.
    NoAuth,
    /// `WRONGPASS`: the user or password is wrong.
    WrongPass,
    /// `NOPERM`: the ACL user may not run this.
    NoPerm,
    /// `NOPROTO`: the server does not speak the asked protocol version.
    NoProto,
    /// `WRONGTYPE`: a key of another type.
    WrongType,
    /// `ERR` and any other code.
    Other,
}

/// Where a `MOVED` or `ASK` sends a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// The hash slot (0–16383).
    pub slot: u16,
    /// The node's host; empty means the host of the node that answered.
    pub host: Vec<u8>,
    /// The node's port.
    pub port: u16,
}

/// An error reply, typed by its code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    /// What the code means.
    pub kind: ErrorKind,
    /// The whole message, code first (without the leading `-`).
    pub message: Vec<u8>,
}

impl ServerError {
    /// Reads an error reply's message.
    pub fn parse(message: &[u8]) -> ServerError {
        let mut words = message.split(|&b| b == b' ');
        let code = words.next().unwrap_or_default();
        let kind = match code {
            b"NOSCRIPT" => ErrorKind::NoScript,
            b"MOVED" | b"ASK" => match redirect(&mut words) {
                Some(r) if code == b"MOVED" => ErrorKind::Moved(r),
                Some(r) => ErrorKind::Ask(r),
                None => ErrorKind::Other,
            },
            b"TRYAGAIN" => ErrorKind::TryAgain,
            b"CLUSTERDOWN" => ErrorKind::ClusterDown,
            b"LOADING" => ErrorKind::Loading,
            b"BUSY" => ErrorKind::Busy,
            b"READONLY" => ErrorKind::ReadOnly,
            b"MASTERDOWN" => ErrorKind::MasterDown,
            b"NOAUTH" => ErrorKind::NoAuth,
            b"WRONGPASS" => ErrorKind::WrongPass,
            b"NOPERM" => ErrorKind::NoPerm,
            b"NOPROTO" => ErrorKind::NoProto,
            b"WRONGTYPE" => ErrorKind::WrongType,
            _ => ErrorKind::Other,
        };
        ServerError {
            kind,
            message: message.to_vec(),
        }
    }

    /// The error's code (its first word).
    pub fn code(&self) -> &[u8] {
        self.message
            .split(|&b| b == b' ')
            .next()
            .unwrap_or_default()
    }

    /// An authentication or permission failure: retrying the same credentials cannot help.
    pub fn is_auth(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::NoAuth | ErrorKind::WrongPass | ErrorKind::NoPerm
        )
    }
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = &self.message[..self.message.len().min(256)];
        write!(f, "{}", String::from_utf8_lossy(shown))
    }
}

fn redirect<'a>(words: &mut impl Iterator<Item = &'a [u8]>) -> Option<Redirect> {
    let slot: u16 = std::str::from_utf8(words.next()?).ok()?.parse().ok()?;
    let endpoint = words.next()?;
    if slot >= 16384 || words.next().is_some() {
        return None;
    }
    let colon = endpoint.iter().rposition(|&b| b == b':')?;
    let port = std::str::from_utf8(&endpoint[colon + 1..])
        .ok()?
        .parse()
        .ok()?;
    Some(Redirect {
        slot,
        host: endpoint[..colon].to_vec(),
        port,
    })
}

/// Which subscription a confirmation is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubscriptionKind {
    /// `SUBSCRIBE`.
    Subscribe,
    /// `SSUBSCRIBE` (a shard channel).
    SSubscribe,
    /// `PSUBSCRIBE`.
    PSubscribe,
    /// `UNSUBSCRIBE`.
    Unsubscribe,
    /// `SUNSUBSCRIBE`.
    SUnsubscribe,
    /// `PUNSUBSCRIBE`.
    PUnsubscribe,
}

impl SubscriptionKind {
    /// The kind of a command name or confirmation (any case), if it is one.
    pub fn from_name(name: &[u8]) -> Option<SubscriptionKind> {
        const NAMES: [(&[u8], SubscriptionKind); 6] = [
            (b"subscribe", SubscriptionKind::Subscribe),
            (b"ssubscribe", SubscriptionKind::SSubscribe),
            (b"psubscribe", SubscriptionKind::PSubscribe),
            (b"unsubscribe", SubscriptionKind::Unsubscribe),
            (b"sunsubscribe", SubscriptionKind::SUnsubscribe),
            (b"punsubscribe", SubscriptionKind::PUnsubscribe),
        ];
        NAMES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, k)| *k)
    }

    /// Whether it starts a subscription (rather than ends one).
    pub fn is_subscribe(self) -> bool {
        matches!(
            self,
            SubscriptionKind::Subscribe
                | SubscriptionKind::SSubscribe
                | SubscriptionKind::PSubscribe
        )
    }
}

/// A push message: RESP3 `>` frames, or RESP2 arrays on a connection in subscribe mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Push {
    /// `message`: a PUBLISH on a subscribed channel.
    Message {
        /// The channel.
        channel: Vec<u8>,
        /// The payload.
        payload: Vec<u8>,
    },
    /// `smessage`: an SPUBLISH on a subscribed shard channel.
    ShardMessage {
        /// The channel.
        channel: Vec<u8>,
        /// The payload.
        payload: Vec<u8>,
    },
    /// `pmessage`: a PUBLISH matching a subscribed pattern.
    PatternMessage {
        /// The pattern.
        pattern: Vec<u8>,
        /// The channel.
        channel: Vec<u8>,
        /// The payload.
        payload: Vec<u8>,
    },
    /// A subscription took effect or ended (asked for, or ended by the server: a shard
    /// channel whose slot moved).
    Subscription {
        /// Which.
        kind: SubscriptionKind,
        /// The channel or pattern (`None`: an unsubscribe from nothing).
        channel: Option<Vec<u8>>,
        /// Subscriptions of the connection after it.
        count: i64,
    },
    /// Any other push (client-side caching invalidations, a future kind).
    Other(Vec<Reply>),
}

impl Push {
    /// Reads a push's elements; `None` when they do not have a pub/sub message's shape.
    pub fn pubsub(items: &[Reply]) -> Option<Push> {
        let text = |r: &Reply| match r {
            Reply::Bulk(b) | Reply::Status(b) => Some(b.clone()),
            _ => None,
        };
        let (kind, rest) = items.split_first()?;
        let kind = match kind {
            Reply::Bulk(k) | Reply::Status(k) => k.as_slice(),
            _ => return None,
        };
        Some(match (kind, rest) {
            (b"message", [c, p]) => Push::Message {
                channel: text(c)?,
                payload: text(p)?,
            },
            (b"smessage", [c, p]) => Push::ShardMessage {
                channel: text(c)?,
                payload: text(p)?,
            },
            (b"pmessage", [pat, c, p]) => Push::PatternMessage {
                pattern: text(pat)?,
                channel: text(c)?,
                payload: text(p)?,
            },
            (k, [c, Reply::Int(count)]) => Push::Subscription {
                kind: SubscriptionKind::from_name(k)?,
                channel: match c {
                    Reply::Nil => None,
                    c => Some(text(c)?),
                },
                count: *count,
            },
            _ => return None,
        })
    }

    /// Reads a RESP3 push frame's elements: a pub/sub message or [`Push::Other`].
    pub fn from_items(items: Vec<Reply>) -> Push {
        Push::pubsub(&items).unwrap_or(Push::Other(items))
    }
}
