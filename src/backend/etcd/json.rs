//! Reading the gateway's JSON: strict about shapes and sizes, so a wrong reply is an error,
//! never a grant. int64s arrive as strings (proto3 JSON), but numbers are accepted too.

use serde_json::Value;

/// Largest reply body or streamed message the protocol reads, in bytes.
pub const MAX_BODY: usize = 1 << 20;
/// Longest key the protocol reads back (names are bounded, tokens fixed).
const MAX_KEY: usize = 4096;

/// Why a reply gives no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The host reported a transport failure or never answered.
    #[error("no reply")]
    Transport,
    /// An error body from etcd (`{"error":…,"code":…}`): `code` is the gRPC code.
    #[error("etcd error {code}: {message}")]
    Server {
        /// gRPC status code (5: not found).
        code: i64,
        /// etcd's message.
        message: String,
    },
    /// An HTTP status other than 200 without an etcd error body.
    #[error("HTTP status {0}")]
    Status(u16),
    /// Larger than [`MAX_BODY`].
    #[error("reply larger than {MAX_BODY} bytes")]
    TooLarge,
    /// Not JSON, or not the shape the request gets.
    #[error("malformed reply: {0}")]
    Garbage(&'static str),
}

impl ReplyError {
    /// The gRPC code of an error body.
    pub fn code(&self) -> Option<i64> {
        match self {
            Self::Server { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// What a watch message says that matters here.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct WatchMessage {
    /// Keys of DELETE events.
    pub deleted_keys: Vec<Vec<u8>>,
    /// The server cancelled the watch (compaction, error).
    pub canceled: bool,
}

/// The answer of an acquire transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TxnRead {
    pub own_key: Option<Vec<u8>>,
    pub own_rev: i64,
    pub own_lease: i64,
    pub first_key: Option<Vec<u8>>,
}

pub(crate) fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(s: &str) -> Result<Vec<u8>, ReplyError> {
    use base64::Engine as _;
    if s.len() > MAX_KEY * 2 {
        return Err(ReplyError::Garbage("key too long"));
    }
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|_| ReplyError::Garbage("key is not base64"))
}

/// An etcd lease id as the engine echoes it: decimal text.
pub(crate) fn lease_from_data(data: &[u8]) -> Option<i64> {
    std::str::from_utf8(data)
        .ok()?
        .parse::<i64>()
        .ok()
        .filter(|&id| id != 0)
}

/// An int64 field: a decimal string or a number; absent means 0 (proto3 omits zeros).
fn int(v: &Value, field: &str) -> Result<i64, ReplyError> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::String(s)) => s
            .parse::<i64>()
            .map_err(|_| ReplyError::Garbage("an integer field is not a number")),
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or(ReplyError::Garbage("an integer field is out of range")),
        Some(_) => Err(ReplyError::Garbage("an integer field has the wrong type")),
    }
}

fn object<'a>(v: &'a Value, field: &str) -> Result<Option<&'a Value>, ReplyError> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(o @ Value::Object(_)) => Ok(Some(o)),
        Some(_) => Err(ReplyError::Garbage("an object field has the wrong type")),
    }
}

fn array<'a>(v: &'a Value, field: &str) -> Result<&'a [Value], ReplyError> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err(ReplyError::Garbage("a list field has the wrong type")),
    }
}

fn key_of(kv: &Value) -> Result<Vec<u8>, ReplyError> {
    match kv.get("key") {
        Some(Value::String(s)) => unb64(s),
        _ => Err(ReplyError::Garbage("a key-value has no key")),
    }
}

/// Revisions are fences: from 2^53 on, the next one would leave the range every host
/// language holds exactly.
const MAX_REVISION: i64 = 1 << 53;

/// The reply's revision. One at 2^53 or past it fails every reply, so the lease grant that
/// precedes an acquire fails and no key is written for it.
fn header_revision(v: &Value) -> Result<i64, ReplyError> {
    let h = object(v, "header")?.ok_or(ReplyError::Garbage("no header"))?;
    let rev = int(h, "revision")?;
    if rev <= 0 {
        return Err(ReplyError::Garbage("header revision is not positive"));
    }
    if rev >= MAX_REVISION {
        return Err(ReplyError::Garbage(REVISION_AT_LIMIT));
    }
    Ok(rev)
}

const REVISION_AT_LIMIT: &str = "the cluster's revision is at 2^53: its fences (create \
     revisions) would leave the exact range; refusing to acquire";

/// An error body, in either form the gateway writes: `{"error":"…","code":5}` (unary) or
/// `{"error":{"grpc_code":5,"message":"…"}}` (streams).
fn error_of(v: &Value) -> Option<ReplyError> {
    let e = v.get("error")?;
    let (code, message) = match e {
        Value::String(s) => (v.get("code").and_then(Value::as_i64), s.clone()),
        Value::Object(_) => (
            e.get("grpc_code").and_then(Value::as_i64),
            e.get("message")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        ),
        _ => (None, String::new()),
    };
    let mut message = message;
    message.truncate(
        (0..=message.len().min(256))
            .rev()
            .find(|&i| message.is_char_boundary(i))
            .unwrap_or(0),
    );
    Some(ReplyError::Server {
        code: code.unwrap_or(2),
        message,
    })
}

fn first_value(body: &[u8]) -> Result<Value, ReplyError> {
    if body.len() > MAX_BODY {
        return Err(ReplyError::TooLarge);
    }
    let mut values = serde_json::Deserializer::from_slice(body).into_iter::<Value>();
    match values.next() {
        Some(Ok(v @ Value::Object(_))) => Ok(v),
        Some(Ok(_)) => Err(ReplyError::Garbage("the body is not a JSON object")),
        _ => Err(ReplyError::Garbage("the body is not JSON")),
    }
}

/// A unary reply: the object, unwrapped from a stream's `{"result":…}` (keep-alive), or
/// the error it carries.
pub(crate) fn parse_body(status: u16, body: &[u8]) -> Result<Value, ReplyError> {
    let v = match first_value(body) {
        Ok(v) => v,
        Err(e) if status == 200 => return Err(e),
        Err(_) => return Err(ReplyError::Status(status)),
    };
    if let Some(e) = error_of(&v) {
        return Err(e);
    }
    if status != 200 {
        return Err(ReplyError::Status(status));
    }
    match v.get("result") {
        Some(r @ Value::Object(_)) => {
            if let Some(e) = error_of(r) {
                return Err(e);
            }
            Ok(r.clone())
        }
        Some(_) => Err(ReplyError::Garbage("result is not an object")),
        None => Ok(v),
    }
}

/// One streamed watch message.
pub(crate) fn parse_stream_message(message: &[u8]) -> Result<WatchMessage, ReplyError> {
    let v = parse_body(200, message)?;
    let mut out = WatchMessage {
        canceled: matches!(v.get("canceled"), Some(Value::Bool(true))),
        ..WatchMessage::default()
    };
    if int(&v, "compact_revision")? > 0 {
        out.canceled = true;
    }
    for ev in array(&v, "events")? {
        let kind = match ev.get("type") {
            None | Some(Value::Null) => "PUT",
            Some(Value::String(s)) => s.as_str(),
            Some(_) => return Err(ReplyError::Garbage("event type has the wrong type")),
        };
        if kind == "DELETE" {
            let kv = object(ev, "kv")?.ok_or(ReplyError::Garbage("event without kv"))?;
            out.deleted_keys.push(key_of(kv)?);
        }
    }
    Ok(out)
}

/// `LeaseGrant`: the lease id and its TTL in seconds.
pub(crate) fn read_grant(v: &Value) -> Result<(i64, u64), ReplyError> {
    if let Some(Value::String(e)) = v.get("error") {
        if !e.is_empty() {
            return Err(ReplyError::Server {
                code: 2,
                message: e.chars().take(256).collect(),
            });
        }
    }
    // No key is written for a lease granted at the limit.
    if object(v, "header")?.is_some() {
        header_revision(v)?;
    }
    let id = int(v, "ID")?;
    let ttl = int(v, "TTL")?;
    if id == 0 || ttl <= 0 {
        return Err(ReplyError::Garbage("lease grant without an id or a TTL"));
    }
    Ok((id, ttl as u64))
}

/// `LeaseKeepAlive`: the TTL left (0: the lease is gone).
pub(crate) fn read_keepalive(v: &Value) -> Result<i64, ReplyError> {
    header_revision(v)?;
    let ttl = int(v, "TTL")?;
    Ok(ttl.max(0))
}

/// The first key-value of a range response: its key, create revision and lease.
fn first_kv(range: &Value) -> Result<Option<(Vec<u8>, i64, i64)>, ReplyError> {
    match array(range, "kvs")?.first() {
        None => Ok(None),
        Some(kv) => {
            let rev = int(kv, "create_revision")?;
            if rev >= MAX_REVISION {
                return Err(ReplyError::Garbage(REVISION_AT_LIMIT));
            }
            Ok(Some((key_of(kv)?, rev, int(kv, "lease")?)))
        }
    }
}

/// The acquire transaction: `[put?, range own key, range first of the queue]`.
pub(crate) fn read_txn(v: &Value) -> Result<TxnRead, ReplyError> {
    header_revision(v)?;
    let succeeded = match v.get("succeeded") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ReplyError::Garbage("succeeded is not a boolean")),
    };
    let responses = array(v, "responses")?;
    let ranges: &[Value] = match (succeeded, responses) {
        (true, [put, rest @ ..]) if put.get("response_put").is_some() => rest,
        (false, all) => all,
        _ => return Err(ReplyError::Garbage("transaction responses out of shape")),
    };
    let [own, first] = ranges else {
        return Err(ReplyError::Garbage("transaction responses out of shape"));
    };
    fn range(r: &Value) -> Result<&Value, ReplyError> {
        object(r, "response_range")?.ok_or(ReplyError::Garbage("expected a range response"))
    }
    let own = first_kv(range(own)?)?;
    let first = first_kv(range(first)?)?;
    let (own_key, own_rev, own_lease) = match own {
        Some((k, rev, lease)) if rev > 0 => (Some(k), rev, lease),
        Some(_) => return Err(ReplyError::Garbage("our key has no create revision")),
        None => (None, 0, 0),
    };
    Ok(TxnRead {
        own_key,
        own_rev,
        own_lease,
        first_key: first.map(|(k, _, _)| k),
    })
}

/// `DeleteRange` of one key: how many keys it deleted (0: it was not there).
pub(crate) fn read_deleted(v: &Value) -> Result<i64, ReplyError> {
    header_revision(v)?;
    let n = int(v, "deleted")?;
    if n < 0 {
        return Err(ReplyError::Garbage("a negative deleted count"));
    }
    Ok(n)
}

/// A range with `limit 1`: the key found (if any) and the revision it was read at.
pub(crate) fn read_first(v: &Value) -> Result<(Option<Vec<u8>>, i64), ReplyError> {
    let rev = header_revision(v)?;
    Ok((first_kv(v)?.map(|(k, _, _)| k), rev))
}

/// A status query's range: the owner key's create revision and lease, if any key is there.
pub(crate) fn read_first_owner(v: &Value) -> Result<Option<(i64, i64)>, ReplyError> {
    header_revision(v)?;
    match first_kv(v)? {
        None => Ok(None),
        Some((_, rev, lease)) if rev > 0 && lease != 0 => Ok(Some((rev, lease))),
        Some(_) => Err(ReplyError::Garbage(
            "the queue's first key has no create revision or no lease",
        )),
    }
}

/// `LeaseTimeToLive`: seconds left (-1 or 0: the lease is gone).
pub(crate) fn read_time_to_live(v: &Value) -> Result<i64, ReplyError> {
    header_revision(v)?;
    int(v, "TTL")
}

/// `Authenticate`: the token (bounded, printable ASCII: it becomes a header).
pub(crate) fn read_token(v: &Value) -> Result<String, ReplyError> {
    match v.get("token") {
        Some(Value::String(t))
            if !t.is_empty()
                && t.len() <= MAX_KEY
                && t.bytes().all(|b| (0x21..0x7f).contains(&b)) =>
        {
            Ok(t.clone())
        }
        _ => Err(ReplyError::Garbage("authenticate without a usable token")),
    }
}
