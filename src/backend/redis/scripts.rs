//! The Lua scripts of the Redis protocol, the key layout and the pub/sub payloads.

use std::borrow::Cow;

use super::Arg;
pub use super::sha1::sha1;
use crate::{Error, Token, validate_name};

/// Prefix of every key: `lh:{`, so Redis Cluster hashes the name (the hash tag). A name with
/// a brace gets a digest tag instead ([`hash_tag`]): `lh:{#` + 16 hex digits + `}` + name.
pub const KEY_PREFIX: &str = "lh:{";
/// Suffix of the lock key `lh:{NAME}` (a string `FENCE MARK TOKEN` with the lease's expiry).
pub const LOCK_SUFFIX: &str = "}";
/// Suffix of the fence key `lh:{NAME}:fence` (the last fence, decimal text, with an expiry).
pub const FENCE_SUFFIX: &str = "}:fence";
/// Suffix of the wait queue `lh:{NAME}:queue` (a zset of `wake#token` entries).
pub const QUEUE_SUFFIX: &str = "}:queue";
/// Every wake channel starts with this; the scripts publish on nothing else, so a garbage
/// queue key cannot make a release publish on an application's channel.
pub const WAKE_CHANNEL_PREFIX: &str = "lh:wake:";
/// Prefix of a name's shard wake channel `lh:{NAME}:wake` (Redis Cluster, sharded pub/sub):
/// the hash tag puts it in the slot of the name's keys, so the scripts can SPUBLISH to it.
pub const SHARD_CHANNEL_PREFIX: &str = KEY_PREFIX;
/// Suffix of a name's shard wake channel.
pub const SHARD_CHANNEL_SUFFIX: &str = "}:wake";
/// Random bytes a wake channel is made of (128 bits: unguessable, never shared).
pub const WAKE_RANDOM_LEN: usize = 16;
/// Longest ownership token the scripts accept, in bytes.
pub const MAX_TOKEN_LEN: usize = 256;
/// Largest fencing token the scripts hand out: Lua numbers are doubles, exact up to 2^53.
pub const MAX_FENCE: u64 = (1 << 53) - 1;

/// Payload kind on a wake channel: the lock was released and this client's entry was at the
/// head of the queue (`w TOKEN NAME`, the entry's token in hex); that lease should try now.
pub const MSG_WAKE: u8 = b'w';
/// Payload kind: this client's entry is one of the [`STANDBYS`] after a woken one, with its
/// rank and the entry's token (`s1 TOKEN NAME`, `s2 TOKEN NAME`); if nobody reports the lock
/// taken within rank × the standby delay, that lease tries.
pub const MSG_STANDBY: u8 = b's';
/// Entries told to stand by at a release: so many frozen waiters in a row at the head cost
/// a live one a few standby delays, not the holder's TTL.
pub const STANDBYS: u8 = 2;
/// Payload kind: the lock was granted to someone (`t NAME`); a standby may stand down. It
/// names no token: whichever local lease stood by, the lock is taken. Older scripts send it;
/// these send [`MSG_GRANTED`].
pub const MSG_TAKEN: u8 = b't';
/// Payload kind: the lock was granted for TTL ms (`g TTL TOKEN NAME`), sent to each of the
/// first two entries left in the queue: a standby stands down, and the entry's lease looks
/// again when that grant runs out, so a holder that freezes right after the grant is taken
/// over at its expiry by a waiter that reached the head through handoffs (its own refusal,
/// from further back, told it to wait `idle_recheck_ms`).
pub const MSG_GRANTED: u8 = b'g';
/// Length of the token field of `w`, `s` and `g` payloads: a [`Token`] in lowercase hex.
pub const MSG_TOKEN_LEN: usize = 32;
/// Longest TTL field of a `g` payload, in decimal digits (the scripts' integer bound).
const MSG_TTL_DIGITS: usize = 15;

/// Which key of a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// `lh:{NAME}`
    Lock,
    /// `lh:{NAME}:fence`
    Fence,
    /// `lh:{NAME}:queue`
    Queue,
}

impl KeyKind {
    /// Every kind.
    pub const ALL: [KeyKind; 3] = [KeyKind::Lock, KeyKind::Fence, KeyKind::Queue];

    fn suffix(self) -> &'static str {
        match self {
            KeyKind::Lock => LOCK_SUFFIX,
            KeyKind::Fence => FENCE_SUFFIX,
            KeyKind::Queue => QUEUE_SUFFIX,
        }
    }
}

/// Length of a digest tag's text, `#` and 16 hex digits.
const DIGEST_TAG_LEN: usize = 17;

/// The 64-bit FNV-1a hash of `bytes` (offset basis 0xcbf29ce484222325, prime 0x100000001b3):
/// fixed and documented, so every binding and version finds the same keys.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The Redis Cluster hash tag of `name`'s keys and shard channel: the name itself when it
/// holds no brace (`lh:{NAME}…`), else `#` and 16 lowercase hex digits of [`fnv1a64`] of the
/// name (`lh:{#0123456789abcdef}NAME}…`). A brace in the name would end or restart the tag
/// (`}x` gave the empty tag `lh:{}`, its keys in different slots); brace-free names keep
/// their keys, and a digest tag ends before the name, which no brace-free name can match.
pub fn hash_tag(name: &str) -> Cow<'_, str> {
    // Bytewise: a brace is one byte in UTF-8, never part of another character.
    if name.bytes().any(|b| b == b'{' || b == b'}') {
        Cow::Owned(format!("#{:016x}", fnv1a64(name.as_bytes())))
    } else {
        Cow::Borrowed(name)
    }
}

/// `lh:{` + tag, then (digest tags) `}` + name, then `suffix`.
/// `lh:{NAME}SUFFIX`, or `lh:{TAG}NAME}SUFFIX` when `tag`, the name's [`hash_tag`], is a
/// digest (a name that holds no brace is its own tag).
fn tagged(tag: &str, name: &str, suffix: &str) -> Arg {
    let (p, n, s) = (KEY_PREFIX.as_bytes(), name.as_bytes(), suffix.as_bytes());
    if tag == name {
        Arg::concat(&[p, n, s])
    } else {
        Arg::concat(&[p, tag.as_bytes(), b"}", n, s])
    }
}

/// The key of `kind` for `name`, e.g. `lh:{jobs}:queue` (see [`hash_tag`] for names with a
/// brace).
pub fn key(kind: KeyKind, name: &str) -> Result<Vec<u8>, Error> {
    key_arg(kind, name).map(|k| k.to_vec())
}

/// [`key`] as a request argument.
pub fn key_arg(kind: KeyKind, name: &str) -> Result<Arg, Error> {
    validate_name(name)?;
    Ok(tagged(&hash_tag(name), name, kind.suffix()))
}

/// The lock, fence and queue keys of `name` as request arguments (an acquire sends all
/// three); see [`keys_of`].
pub fn key_args(name: &str) -> Result<[Arg; 3], Error> {
    keys_of(name, KeyKind::ALL)
}

/// The keys of `kinds` for `name` as request arguments, with the name checked and its tag
/// computed once for all of them.
pub fn keys_of<const N: usize>(name: &str, kinds: [KeyKind; N]) -> Result<[Arg; N], Error> {
    validate_name(name)?;
    let tag = hash_tag(name);
    Ok(kinds.map(|kind| tagged(&tag, name, kind.suffix())))
}

/// The shard wake channel of `name`, `lh:{NAME}:wake`, in the slot of the name's keys.
pub fn shard_channel(name: &str) -> Result<Vec<u8>, Error> {
    shard_channel_arg(name).map(|c| c.to_vec())
}

/// [`shard_channel`] as a request argument.
pub fn shard_channel_arg(name: &str) -> Result<Arg, Error> {
    validate_name(name)?;
    Ok(tagged(&hash_tag(name), name, SHARD_CHANNEL_SUFFIX))
}

/// The name whose shard wake channel `channel` is, if it is exactly the one
/// [`shard_channel`] gives that name.
pub fn shard_channel_name(channel: &[u8]) -> Option<&str> {
    let inner = channel
        .strip_prefix(SHARD_CHANNEL_PREFIX.as_bytes())?
        .strip_suffix(SHARD_CHANNEL_SUFFIX.as_bytes())?;
    let inner = std::str::from_utf8(inner).ok()?;
    let name = match inner.get(DIGEST_TAG_LEN..) {
        Some(rest) if inner.starts_with('#') && rest.starts_with('}') => &rest[1..],
        _ => inner,
    };
    validate_name(name).ok()?;
    (shard_channel(name).ok()? == channel).then_some(name)
}

/// A wake-channel message: its kind (`MSG_*`), a standby's rank, the queue entry's token and
/// the lock name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WakeMessage<'a> {
    /// `MSG_WAKE`, `MSG_STANDBY`, `MSG_GRANTED` or `MSG_TAKEN`.
    pub kind: u8,
    /// `1..=STANDBYS` for `MSG_STANDBY`, 0 otherwise.
    pub rank: u8,
    /// The granted TTL in ms for `MSG_GRANTED`, 0 otherwise.
    pub ttl_ms: u64,
    /// The token of the queue entry the script acted on (`MSG_WAKE`, `MSG_STANDBY`,
    /// `MSG_GRANTED`): the lease it is meant for. `None` for `MSG_TAKEN`.
    pub token: Option<Token>,
    /// The lock name (valid).
    pub name: &'a str,
}

/// Parses a wake-channel payload: `w TOKEN NAME`, `s` RANK ` TOKEN NAME` (`s1 <hex> jobs`),
/// `g TTL TOKEN NAME` or `t NAME`, where TOKEN is exactly [`MSG_TOKEN_LEN`] lowercase hex
/// digits and TTL a positive decimal of at most 15 digits. `None` for anything else.
pub fn parse_message(payload: &[u8]) -> Option<WakeMessage<'_>> {
    let (&kind, mut rest) = payload.split_first()?;
    let mut rank = 0;
    let mut ttl_ms = 0;
    match kind {
        MSG_WAKE | MSG_TAKEN => {}
        MSG_GRANTED => {
            let digits = rest.strip_prefix(b" ")?;
            let len = digits.iter().take_while(|c| c.is_ascii_digit()).count();
            if len == 0 || len > MSG_TTL_DIGITS || digits[0] == b'0' {
                return None;
            }
            ttl_ms = std::str::from_utf8(&digits[..len]).ok()?.parse().ok()?;
            rest = &digits[len..];
        }
        MSG_STANDBY => {
            let (&digit, after) = rest.split_first()?;
            rank = digit.wrapping_sub(b'0');
            if !(1..=STANDBYS).contains(&rank) {
                return None;
            }
            rest = after;
        }
        _ => return None,
    }
    rest = rest.strip_prefix(b" ")?;
    let mut token = None;
    if kind != MSG_TAKEN {
        if rest.len() <= MSG_TOKEN_LEN || rest[MSG_TOKEN_LEN] != b' ' {
            return None;
        }
        token = Some(token_from_hex(&rest[..MSG_TOKEN_LEN])?);
        rest = &rest[MSG_TOKEN_LEN + 1..];
    }
    let name = std::str::from_utf8(rest).ok()?;
    validate_name(name).ok()?;
    Some(WakeMessage {
        kind,
        rank,
        ttl_ms,
        token,
        name,
    })
}

/// The token written as `hex` ([`Token::to_hex`]: lowercase only, so one token has one text
/// and matches the queue entry byte for byte).
fn token_from_hex(hex: &[u8]) -> Option<Token> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    let mut raw = [0u8; MSG_TOKEN_LEN / 2];
    if hex.len() != MSG_TOKEN_LEN {
        return None;
    }
    for (b, pair) in raw.iter_mut().zip(hex.chunks_exact(2)) {
        *b = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(Token(raw))
}

// Shared by the scripts: argument checks, the entry format and the fence computation.
macro_rules! lua_common {
    () => {
        r#"if redis.replicate_commands then redis.replicate_commands() end
local MAX_FENCE = 9007199254740991
local WAKE = 'lh:wake:'
local function show(v)
  local s = tostring(v)
  if #s > 32 then s = string.sub(s, 1, 32) .. '...' end
  return '"' .. string.gsub(s, '[^%w%p ]', '?') .. '"'
end
local function posint(s)
  return type(s) == 'string' and #s <= 15 and string.match(s, '^[1-9]%d*$') ~= nil
end
local function natural(s)
  return type(s) == 'string' and #s <= 15 and string.match(s, '^%d+$') ~= nil
end
local function good_token(t)
  return type(t) == 'string' and #t > 0 and #t <= 256
end
local function good_name(n)
  return type(n) == 'string' and #n > 0 and #n <= 512
end
-- A queue entry is 'lh:wake:<channel>#<token>'; its wake channel, or nil for garbage.
local function channel_of(e)
  if type(e) ~= 'string' then return nil end
  local i = string.find(e, '#', 1, true)
  if not i then return nil end
  local ch = string.sub(e, 1, i - 1)
  if #ch <= #WAKE or #ch > 128 or string.sub(ch, 1, #WAKE) ~= WAKE then return nil end
  return ch
end
-- The name's shard channel when the caller asks for sharded pub/sub (Redis Cluster): it
-- must be 'lh:{NAME}:wake', or 'lh:{#<16 hex>}NAME}:wake' for a name with a brace (the
-- digest tag), so a script never publishes anywhere else. nil = classic.
local function shard_of(arg, name)
  if arg == nil or arg == '' then return nil end
  if string.find(name, '[{}]') then
    if #arg ~= 22 + #name + 6 or not string.find(string.sub(arg, 1, 22), '^lh:{#[0-9a-f]+}$')
      or string.sub(arg, 23) ~= name .. '}:wake' then return false end
  elseif arg ~= 'lh:{' .. name .. '}:wake' then return false end
  return arg
end
local function server_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function as_fence(s)
  if type(s) ~= 'string' or #s > 16 or not string.match(s, '^%d+$') then return nil end
  local n = tonumber(s)
  if n > MAX_FENCE then return nil end
  return n
end
-- A lock's value 'FENCE MARK TOKEN': the fence's text, the mark ('0' nobody queued, '1' the
-- release wakes the queue) and the holder's token; nil for anything else.
local function lock_of(v)
  local fs, mark, owner = string.match(v, '^(%d+) ([01]) (.+)$')
  if not fs or not as_fence(fs) or #owner > 256 then return nil end
  return fs, mark, owner
end
"#
    };
}

macro_rules! lua_acquire {
    () => {
        concat!(
            r#"-- leasehold ACQUIRE (queue protocol 7)
-- KEYS[1] lock (string 'FENCE MARK TOKEN', PX ttl), KEYS[2] fence (decimal text, PX ttl +
-- keep), KEYS[3] queue (zset of 'wake#token' entries scored by registration, server ms)
-- ARGV[1] token, ARGV[2] ttl_ms, ARGV[3] queue entry ('' = do not queue), ARGV[4] keep_ms,
-- ARGV[5] lock name, ARGV[6] '1' if an earlier attempt of this lease may have queued it
-- ('0' for a first attempt: a grant then leaves the queue alone), ARGV[7] optional: the
-- name's shard channel 'lh:{NAME}:wake' (Cluster: notices go there with SPUBLISH instead of
-- PUBLISH to the entries' channels)
-- -> {1, fence, ttl_ms} granted | {0, pttl_ms, rank} held by another token (the entry is
--    queued at 0-based rank) | {0, pttl_ms} held, not queued (no entry given)
-- MARK is '1' once the queue may hold entries for this holder's release to wake (a
-- queueing refusal sets it), '0' while nobody queued: RELEASE then skips the queue.
"#,
            lua_common!(),
            r#"if #KEYS ~= 3 then return redis.error_reply('lh: ACQUIRE expects 3 keys (lock, fence, queue), got ' .. #KEYS) end
local lock, fence, queue = KEYS[1], KEYS[2], KEYS[3]
local token, ttl_s, entry, keep_s, name, queued = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if not good_token(token) then return redis.error_reply('lh: ACQUIRE needs an ownership token of 1..256 bytes') end
if not posint(ttl_s) then return redis.error_reply('lh: ACQUIRE needs ttl_ms as a positive integer, got ' .. show(ttl_s)) end
if not natural(keep_s) then return redis.error_reply('lh: ACQUIRE needs keep_ms as an integer, got ' .. show(keep_s)) end
if not good_name(name) then return redis.error_reply('lh: ACQUIRE needs the lock name') end
if queued ~= '0' and queued ~= '1' then return redis.error_reply('lh: ACQUIRE needs queued as 0 or 1, got ' .. show(queued)) end
local shard = shard_of(ARGV[7], name)
if shard == false then return redis.error_reply('lh: ACQUIRE needs the shard channel "lh:{NAME}:wake" or none, got ' .. show(ARGV[7])) end
if type(entry) ~= 'string' or (#entry > 0 and (not channel_of(entry) or string.sub(entry, -#token - 1) ~= '#' .. token)) then
  return redis.error_reply('lh: ACQUIRE needs an entry "lh:wake:...#token" or "", got ' .. show(entry))
end
local ttl, keep = tonumber(ttl_s), tonumber(keep_s)
-- Held by another token: queue the entry (NX keeps the place of an earlier registration)
-- and answer with the holder's time left and the entry's place (0 = head: only the head
-- needs to look again when the holder's time is up; the others are woken in turn). mark()
-- marks the lock, so its release wakes the queue.
local function held(left, mark)
  if left < 0 then
    return redis.error_reply('lh: lock key ' .. lock .. ' has no expiry (not written by leasehold?); refusing to wait on it forever')
  end
  if #entry == 0 then return {0, left} end
  local r = redis.pcall('ZADD', queue, 'NX', string.format('%.0f', math.floor(server_us() / 1000)), entry)
  if type(r) == 'table' and r.err then
    return redis.error_reply('lh: queue key ' .. queue .. ' holds a ' .. redis.call('TYPE', queue)['ok'] .. ', expected a zset')
  end
  if redis.call('PTTL', queue) < left + keep then redis.call('PEXPIRE', queue, left + keep) end
  if mark then mark() end
  return {0, left, redis.call('ZRANK', queue, entry)}
end
-- One read for both keys: MGET answers nil for a key of another type, which the NX and GET
-- of the writes below catch.
local got = redis.call('MGET', lock, fence)
local cur, s = got[1], got[2]
if cur then
  local fs, mark, owner = lock_of(cur)
  if not fs then
    return redis.error_reply('lh: lock key ' .. lock .. ' holds ' .. show(cur) .. ', not a leasehold lock; refusing to grant')
  end
  if owner == token then
    -- The same grant (a retry whose reply was lost): the same fence, the TTL refreshed.
    redis.call('PEXPIRE', lock, ttl_s)
    return {1, tonumber(fs), ttl}
  end
  local set_mark = nil
  if mark == '0' then set_mark = function() redis.call('SETRANGE', lock, #fs + 1, '1') end end
  return held(redis.call('PTTL', lock), set_mark)
end
-- Free: the next fence is max(previous + 1, server time in us). The fence key expires keep
-- ms after the lease would, so the keyspace stays bounded; by then the server clock is far
-- past the last fence, so fences keep increasing without it.
local prev = 0
if s then
  prev = as_fence(s)
  if not prev then
    return redis.error_reply('lh: fence key ' .. fence .. ' holds ' .. show(s) .. ', expected a decimal integer below 2^53; refusing to grant')
  end
end
local nxt = prev + 1
local now = server_us()
if now > nxt then nxt = now end
if nxt > MAX_FENCE then return redis.error_reply('lh: fence key ' .. fence .. ' is exhausted (2^53); refusing to grant') end
local ns = string.format('%.0f', nxt)
if not redis.call('SET', lock, ns .. ' ' .. queued .. ' ' .. token, 'PX', ttl_s, 'NX') then
  -- A lock key of another type: a hash is the lock of a client of queue protocol 6 (held
  -- while it lasts); anything else is garbage.
  local kind = redis.call('TYPE', lock)['ok']
  if kind ~= 'hash' then
    return redis.error_reply('lh: lock key ' .. lock .. ' holds a ' .. kind .. ', expected a string; refusing to grant')
  end
  local old = redis.call('HMGET', lock, 'token', 'fence')
  if type(old[1]) ~= 'string' or not as_fence(old[2]) then
    return redis.error_reply('lh: lock key ' .. lock .. ' is a hash without a valid token and fence (not written by leasehold?); refusing to grant')
  end
  return held(redis.call('PTTL', lock), nil)
end
-- GET makes SET fail, writing nothing, on a fence key of another type: undo the lock.
local r = redis.pcall('SET', fence, ns, 'PX', string.format('%.0f', ttl + keep), 'GET')
if type(r) == 'table' and r.err then
  redis.call('DEL', lock)
  return redis.error_reply('lh: fence key ' .. fence .. ' holds a ' .. redis.call('TYPE', fence)['ok'] .. ', expected a string; refusing to grant')
end
if queued == '1' and #entry > 0 then
  -- Leave the queue and tell its first entries (the standbys, if a release named them)
  -- that the lock is taken and for how long: they look again when it runs out, whatever
  -- their refusals said. A queue key of another type is left alone.
  local z = redis.pcall('ZREM', queue, entry)
  if type(z) == 'number' then
    local head = redis.call('ZRANGE', queue, 0, 1)
    for i = 1, #head do
      local ch = channel_of(head[i])
      if ch then
        local msg = 'g ' .. ttl_s .. ' ' .. string.sub(head[i], #ch + 2) .. ' ' .. name
        if shard then redis.call('SPUBLISH', shard, msg) else redis.call('PUBLISH', ch, msg) end
      end
    end
  end
end
return {1, nxt, ttl}
"#
        )
    };
}

// RENEW and RELEASE read the lock with GET: a lock of another type is a hash of a client of
// queue protocol 6 (never this token's) or garbage.
macro_rules! lua_read_lock {
    () => {
        concat!(
            r#"local cur = redis.pcall('GET', lock)
if type(cur) == 'table' and cur.err then
  local kind = redis.call('TYPE', lock)['ok']
  if kind == 'hash' then return 0 end
  return redis.error_reply('lh: lock key ' .. lock .. ' holds a ' .. kind .. ', expected a string')
end
if not cur then return 0 end
local fs, mark, owner = lock_of(cur)
if not fs then return redis.error_reply('lh: lock key ' .. lock .. ' holds ' .. show(cur) .. ', not a leasehold lock') end
if owner ~= token then return 0 end
"#
        )
    };
}

macro_rules! lua_renew {
    () => {
        concat!(
            r#"-- leasehold RENEW (queue protocol 7)
-- KEYS[1] lock; ARGV[1] token, ARGV[2] ttl_ms
-- -> 1 renewed | 0 rejected (not the owner, or the lock is gone: never re-created here)
"#,
            lua_common!(),
            r#"if #KEYS ~= 1 then return redis.error_reply('lh: RENEW expects 1 key (lock), got ' .. #KEYS) end
local lock, token, ttl_s = KEYS[1], ARGV[1], ARGV[2]
if not good_token(token) then return redis.error_reply('lh: RENEW needs an ownership token of 1..256 bytes') end
if not posint(ttl_s) then return redis.error_reply('lh: RENEW needs ttl_ms as a positive integer, got ' .. show(ttl_s)) end
"#,
            lua_read_lock!(),
            r#"redis.call('PEXPIRE', lock, ttl_s)
return 1
"#
        )
    };
}

macro_rules! lua_release {
    () => {
        concat!(
            r#"-- leasehold RELEASE (queue protocol 7)
-- KEYS[1] lock, KEYS[2] queue; ARGV[1] token, ARGV[2] lock name, ARGV[3] max_age_ms,
-- ARGV[4] optional: the name's shard channel 'lh:{NAME}:wake' (Cluster: SPUBLISH there, the
-- payloads unchanged; a reached subscriber is then any client listening for the name)
-- -> 1 released: if the lock is marked (someone queued), the oldest queued entry whose
--    client listens gets 'w TOKEN NAME' (that lease wakes up and tries), the two after it
--    's1 TOKEN NAME' and 's2 TOKEN NAME' (stand by: try if nobody takes the lock within 1
--    or 2 standby delays); TOKEN is the entry's token
--  | 0 not the owner
"#,
            lua_common!(),
            r#"if #KEYS ~= 2 then return redis.error_reply('lh: RELEASE expects 2 keys (lock, queue), got ' .. #KEYS) end
local lock, queue = KEYS[1], KEYS[2]
local token, name, age_s = ARGV[1], ARGV[2], ARGV[3]
if not good_token(token) then return redis.error_reply('lh: RELEASE needs an ownership token of 1..256 bytes') end
if not good_name(name) then return redis.error_reply('lh: RELEASE needs the lock name') end
if not posint(age_s) then return redis.error_reply('lh: RELEASE needs max_age_ms as a positive integer, got ' .. show(age_s)) end
local shard = shard_of(ARGV[4], name)
if shard == false then return redis.error_reply('lh: RELEASE needs the shard channel "lh:{NAME}:wake" or none, got ' .. show(ARGV[4])) end
local function notify(ch, msg)
  if shard then return redis.call('SPUBLISH', shard, msg) end
  return redis.call('PUBLISH', ch, msg)
end
"#,
            lua_read_lock!(),
            r#"redis.call('DEL', lock)
-- Unmarked (nobody queued for this holder) or no queue key: nothing to prune or wake.
if mark == '0' or redis.call('EXISTS', queue) == 0 then return 1 end
-- Entries older than max_age belong to waiters that died without leaving; a live waiter
-- that old registers again at its next refusal. A queue key of another type is left alone.
local oldest = math.floor(server_us() / 1000) - tonumber(age_s)
local r = redis.pcall('ZREMRANGEBYSCORE', queue, '-inf', '(' .. string.format('%.0f', oldest))
if type(r) == 'number' then
  -- Entries whose channel nobody listens on (PUBLISH reaches 0) are dropped; at most 16 per
  -- release, so a burst of dead clients costs one wake-up, never a loop.
  for _ = 1, 16 do
    local e = redis.call('ZPOPMIN', queue)
    if #e == 0 then break end
    -- Messages name the entry's token: the client wakes exactly that lease.
    local ch = channel_of(e[1])
    if ch and notify(ch, 'w ' .. string.sub(e[1], #ch + 2) .. ' ' .. name) > 0 then
      local nxt = redis.call('ZRANGE', queue, 0, 1)
      for i = 1, #nxt do
        local ch2 = channel_of(nxt[i])
        if ch2 then notify(ch2, 's' .. i .. ' ' .. string.sub(nxt[i], #ch2 + 2) .. ' ' .. name) end
      end
      break
    end
  end
end
return 1
"#
        )
    };
}

macro_rules! lua_leave {
    () => {
        concat!(
            r#"-- leasehold LEAVE (queue protocol 7)
-- KEYS[1] lock, KEYS[2] queue; ARGV[1] entry 'lh:wake:...#token', ARGV[2] lock name,
-- ARGV[3] optional: the name's shard channel (as for ACQUIRE)
-- -> 1 left: an entry that was one of the first two tells the first two left the holder's
--    remaining time ('g PTTL TOKEN NAME'; 1 ms when the lock is free), so one of them looks
--    again when it runs out: a waiter that gives up never leaves the queue without a head
--    that knows when to try
--  | 0 not queued
"#,
            lua_common!(),
            r#"if #KEYS ~= 2 then return redis.error_reply('lh: LEAVE expects 2 keys (lock, queue), got ' .. #KEYS) end
local lock, queue = KEYS[1], KEYS[2]
local entry, name = ARGV[1], ARGV[2]
if not good_name(name) then return redis.error_reply('lh: LEAVE needs the lock name') end
if not channel_of(entry) then return redis.error_reply('lh: LEAVE needs an entry "lh:wake:...#token", got ' .. show(entry)) end
local shard = shard_of(ARGV[3], name)
if shard == false then return redis.error_reply('lh: LEAVE needs the shard channel "lh:{NAME}:wake" or none, got ' .. show(ARGV[3])) end
local rank = redis.pcall('ZRANK', queue, entry)
if type(rank) ~= 'number' then return 0 end
redis.call('ZREM', queue, entry)
if rank < 2 then
  local left = redis.pcall('PTTL', lock)
  if type(left) ~= 'number' or left < 1 then left = 1 end
  local head = redis.call('ZRANGE', queue, 0, 1)
  for i = 1, #head do
    local ch = channel_of(head[i])
    if ch then
      local msg = 'g ' .. string.format('%d', left) .. ' ' .. string.sub(head[i], #ch + 2) .. ' ' .. name
      if shard then redis.call('SPUBLISH', shard, msg) else redis.call('PUBLISH', ch, msg) end
    end
  end
end
return 1
"#
        )
    };
}

/// The ACQUIRE script.
pub const ACQUIRE_SCRIPT: &str = lua_acquire!();
/// The RENEW script.
pub const RENEW_SCRIPT: &str = lua_renew!();
/// The RELEASE script.
pub const RELEASE_SCRIPT: &str = lua_release!();
/// The LEAVE script (a waiter gives up its queue entry).
pub const LEAVE_SCRIPT: &str = lua_leave!();

/// The STATUS script (`leasehold status`), sent with EVAL: read only, and rare enough that
/// caching it on the server buys nothing. `KEYS = [lock, fence]` → `[fence or nil, pttl,
/// last fence or nil]`; a key of another type is an `lh: ` error reply. A hash lock is one
/// of a client of queue protocol 6.
pub const STATUS_SCRIPT: &str = r#"
local fence, pttl, last = false, -2, false
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'string' then
  local v = redis.call('GET', KEYS[1])
  fence = string.match(v, '^(%d+) [01] .')
  if not fence then return redis.error_reply('lh: lock key ' .. KEYS[1] .. ' is not a leasehold lock') end
  pttl = redis.call('PTTL', KEYS[1])
elseif t == 'hash' then
  fence = redis.call('HGET', KEYS[1], 'fence')
  pttl = redis.call('PTTL', KEYS[1])
elseif t ~= 'none' then
  return redis.error_reply('lh: lock key ' .. KEYS[1] .. ' is a ' .. t)
end
local f = redis.call('TYPE', KEYS[2])['ok']
if f == 'string' then
  last = redis.call('GET', KEYS[2])
elseif f ~= 'none' then
  return redis.error_reply('lh: fence key ' .. KEYS[2] .. ' is a ' .. f)
end
return {fence, pttl, last}
"#;

/// One of the scripts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Script {
    /// ACQUIRE
    Acquire,
    /// RENEW
    Renew,
    /// RELEASE
    Release,
    /// LEAVE
    Leave,
}

impl Script {
    /// Every script.
    pub const ALL: [Script; 4] = [
        Script::Acquire,
        Script::Renew,
        Script::Release,
        Script::Leave,
    ];

    /// The Lua text.
    pub fn text(self) -> &'static str {
        match self {
            Script::Acquire => ACQUIRE_SCRIPT,
            Script::Renew => RENEW_SCRIPT,
            Script::Release => RELEASE_SCRIPT,
            Script::Leave => LEAVE_SCRIPT,
        }
    }

    /// The SHA-1s of [`Script::ALL`], computed once per process: every EVALSHA borrows them.
    pub(super) fn all_sha1_hex() -> &'static [[u8; 40]; 4] {
        static SHAS: std::sync::OnceLock<[[u8; 40]; 4]> = std::sync::OnceLock::new();
        SHAS.get_or_init(|| Script::ALL.map(Script::sha1_hex))
    }

    /// The SHA-1 of the text in lowercase hex, as EVALSHA wants it.
    pub fn sha1_hex(self) -> [u8; 40] {
        let mut out = [0u8; 40];
        crate::types::write_lower_hex(&sha1(self.text().as_bytes()), &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_the_documented_layout_and_never_collide() {
        assert_eq!(key(KeyKind::Lock, "jobs").unwrap(), b"lh:{jobs}");
        assert_eq!(key(KeyKind::Fence, "jobs").unwrap(), b"lh:{jobs}:fence");
        assert_eq!(key(KeyKind::Queue, "jobs").unwrap(), b"lh:{jobs}:queue");
        assert!(key(KeyKind::Lock, "").is_err());
        let mut seen = std::collections::HashSet::new();
        for name in [
            "x", "x}", "x}:fence", "x:fence", "x}:queue", "x:queue", "}", "}}",
        ] {
            for kind in KeyKind::ALL {
                assert!(seen.insert(key(kind, name).unwrap()), "{name} {kind:?}");
            }
        }
    }

    #[test]
    fn messages_parse_only_when_well_formed() {
        const T: &str = "00112233445566778899aabbccddeeff";
        let raw = Token(*b"\x00\x11\x22\x33\x44\x55\x66\x77\x88\x99\xaa\xbb\xcc\xdd\xee\xff");
        let token = Some(raw);
        assert_eq!(
            parse_message(format!("w {T} jobs").as_bytes()),
            Some(WakeMessage {
                kind: MSG_WAKE,
                rank: 0,
                ttl_ms: 0,
                token,
                name: "jobs"
            })
        );
        assert_eq!(raw.to_hex(), T.as_bytes());
        let standby = format!("s2 {T} a b");
        let s = parse_message(standby.as_bytes()).unwrap();
        assert_eq!(
            (s.kind, s.rank, s.token, s.name),
            (MSG_STANDBY, 2, token, "a b")
        );
        let t = parse_message(b"t x").unwrap();
        assert_eq!((t.kind, t.token, t.name), (MSG_TAKEN, None, "x"));
        // `t` carries no token: a hex prefix is part of the name.
        assert_eq!(
            parse_message(format!("t {T} x").as_bytes()).unwrap().name,
            format!("{T} x")
        );
        let granted = format!("g 1500 {T} a b");
        let g = parse_message(granted.as_bytes()).unwrap();
        assert_eq!(
            (g.kind, g.ttl_ms, g.token, g.name),
            (MSG_GRANTED, 1500, token, "a b")
        );
        let upper = T.to_uppercase();
        let short = &T[1..];
        let long = format!("{T}0");
        let bad_digit = T.replace('a', "g");
        for bad in [
            String::new(),
            "w".into(),
            "w ".into(),
            "wjobs".into(),
            "w jobs".into(),
            "x jobs".into(),
            format!("w {T}"),
            format!("w {T} "),
            format!("w {T}jobs"),
            format!("w  {T} jobs"),
            format!("w {upper} jobs"),
            format!("w {short} jobs"),
            format!("w {long} jobs"),
            format!("w {bad_digit} jobs"),
            format!("w {T} a\0b"),
            format!("s {T} jobs"),
            format!("s0 {T} jobs"),
            format!("s3 {T} jobs"),
            format!("s1{T} jobs"),
            "s1 jobs".into(),
            format!("w1 {T} jobs"),
            "t".into(),
            "t ".into(),
            format!("g {T} jobs"),
            format!("g 0 {T} jobs"),
            format!("g 01 {T} jobs"),
            format!("g -1 {T} jobs"),
            format!("g 1000000000000000 {T} jobs"),
            format!("g 1000{T} jobs"),
            format!("g 1000 {T}"),
            "g 1000 jobs".into(),
            format!("g1000 {T} jobs"),
        ] {
            assert_eq!(parse_message(bad.as_bytes()), None, "{bad:?}");
        }
        let mut invalid = format!("w {T} ").into_bytes();
        invalid.push(0xff);
        assert_eq!(parse_message(&invalid), None);
    }

    #[test]
    fn scripts_are_ascii_and_check_their_keys() {
        for s in Script::ALL {
            assert!(s.text().is_ascii());
            assert!(s.text().contains("queue protocol 7"));
            assert_eq!(
                s.text().matches("redis.error_reply('lh: ").count(),
                s.text().matches("redis.error_reply(").count()
            );
        }
        assert!(ACQUIRE_SCRIPT.contains(&format!("local MAX_FENCE = {MAX_FENCE}")));
        assert!(ACQUIRE_SCRIPT.contains(&format!("local WAKE = '{WAKE_CHANNEL_PREFIX}'")));
        assert!(
            !RENEW_SCRIPT.contains("'SET'"),
            "RENEW never re-creates a lock"
        );
    }
}
