//! The Redis protocol of leasehold (design §6): the canonical Lua scripts and the key layout.
//!
//! Every host (Python, Go, C++, C) runs these exact bytes, read from the library through
//! `lh_redis_script` / `lh_redis_key`, so clients written in different languages contend
//! correctly for the same lock on the same server. Nothing here performs IO.
//!
//! # Keys (hash-tagged so Redis Cluster keeps one lock's keys in one slot)
//!
//! | kind      | key                  | contents                                           |
//! |-----------|----------------------|----------------------------------------------------|
//! | lock      | `lh:{NAME}`          | hash `{token, fence}` with a PX expiry              |
//! | fence     | `lh:{NAME}:fence`    | decimal integer text, no expiry: the last fence     |
//! | channel   | `lh:{NAME}:released` | pub/sub channel; RELEASE publishes `NAME` on it     |
//! | waiters   | `lh:{NAME}:waiters`  | zset of wake channels of waiting clients (FIFO)     |
//!
//! The keys of one name never collide with the keys of another name (the lock key ends in
//! `}`, the others in `}:fence` / `}:released` / `}:waiters`). Redis Cluster hashes the text
//! between the first `{` and the first `}` after it; that is a prefix of `NAME` (or all of it)
//! in every key, so they share a slot — except for a name that starts with `}`, whose hash tag
//! is empty (Cluster then hashes whole keys). Single-instance Redis is unaffected.
//!
//! # Waking one waiter per release (protocol 2)
//!
//! Publishing every release to every waiting client wakes them all, and all but one lose the
//! race: with a client per waiter that herd costs milliseconds of CPU per handoff. So each
//! client subscribes one *wake channel* of its own (`lh:wake:` + a random suffix, at most 128
//! bytes) and passes it, with the waiters key, to the ACQUIRE attempts it makes while it has
//! waiters. A refused attempt queues the channel; RELEASE pops the oldest queued channels until
//! a `PUBLISH channel NAME` reaches a subscriber (dead clients count 0 and are dropped). The
//! woken client's waiter tries at once. A client that receives a wake-up for a name it no longer
//! waits for passes it on with NOTIFY; a client that stops waiting removes its channel
//! (`ZREM`). RELEASE still publishes on the release channel too, for subscribers that want every
//! release (and for hosts that do not queue). The queue is only a fast path: a waiter whose
//! entry is lost (restart, expiry, Cluster PUBLISH counting only one node's subscribers) still
//! retries at the holder's remaining TTL or with backoff.
//!
//! # Calling convention (EVALSHA, falling back to EVAL on NOSCRIPT)
//!
//! - ACQUIRE: `KEYS = [lock, fence]`, `ARGV = [token, ttl_ms]`, or with queueing
//!   `KEYS = [lock, fence, waiters]`, `ARGV = [token, ttl_ms, wake_channel]` →
//!   `[1, fencing_token, ttl_ms]` granted, or `[0, retry_after_ms]` held by another token
//!   (`-1` = no hint; with queueing the wake channel is queued). Idempotent: the token that
//!   already holds the lock gets its own fencing token back and its TTL refreshed. A new
//!   grant's fencing token is `max(previous + 1, server TIME in µs)`, persisted in the fence
//!   key, so tokens keep increasing even when a restart without persistence lost the fence key.
//! - RENEW: `KEYS = [lock]`, `ARGV = [token, ttl_ms]` → `1` renewed, `0` rejected. Never
//!   re-creates an expired lock (renewing a lock that is gone is a loss, not a new grant).
//! - RELEASE: `KEYS = [lock]` or `[lock, waiters]`, `ARGV = [token, channel, name]` plus,
//!   optionally, the caller's own wake channel when it no longer waits → `1` released (the
//!   oldest live queued waiter is woken, and `PUBLISH channel name`), `0` not owner.
//! - NOTIFY: `KEYS = [waiters]`, `ARGV = [name]` plus, optionally, the caller's own wake
//!   channel → `1` when a queued client was woken, `0` when none was reachable.
//!
//! Garbage in the keyspace (a lock key of another type or a hash without a valid
//! token/fence, a lock without expiry, a fence key holding anything but a decimal integer, a
//! waiters key that is not a zset when a refused ACQUIRE queues) and malformed arguments make
//! the scripts return a Redis error reply whose message starts with `lh: `. Hosts report it as
//! a transport error; it is never a grant.

use crate::Error;

/// Bumped whenever the script semantics change in a way other hosts must know about.
pub const PROTOCOL_VERSION: u32 = 2;

/// Prefix of every key: `lh:{`.
pub const KEY_PREFIX: &str = "lh:{";
/// Suffix of the lock key.
pub const LOCK_SUFFIX: &str = "}";
/// Suffix of the fence key.
pub const FENCE_SUFFIX: &str = "}:fence";
/// Suffix of the release channel.
pub const CHANNEL_SUFFIX: &str = "}:released";
/// Suffix of the waiters key.
pub const WAITERS_SUFFIX: &str = "}:waiters";
/// Every wake channel starts with this; the scripts publish to nothing else, so a garbage
/// waiters key cannot make a release publish on an application's channel.
pub const WAKE_CHANNEL_PREFIX: &str = "lh:wake:";
/// Longest wake channel the scripts accept, in bytes.
pub const MAX_WAKE_CHANNEL_LEN: usize = 128;
/// Random bytes a wake channel is made of (`wake_channel`): 128 bits, so that no two clients
/// share a channel and nobody can guess another's.
pub const WAKE_RANDOM_LEN: usize = 16;
/// Length of the wake channels `wake_channel` makes.
pub const WAKE_CHANNEL_LEN: usize = WAKE_CHANNEL_PREFIX.len() + 2 * WAKE_RANDOM_LEN;
const _: () = assert!(WAKE_CHANNEL_LEN <= MAX_WAKE_CHANNEL_LEN);

/// Largest fencing token the scripts hand out: Lua numbers are doubles, exact up to 2^53.
pub const MAX_FENCE: u64 = (1 << 53) - 1;

// The script texts are macros so that the NUL-terminated copies for the C ABI are built from
// the same literal at compile time (one copy of the source text). The waiter-queue helpers
// are one fragment shared by ACQUIRE, RELEASE and NOTIFY.
macro_rules! lua_wake_queue {
    () => {
        r#"-- Waiter queue (protocol 2): a sorted set of wake channels, oldest registration first.
-- A release publishes to the oldest channel that has a subscriber, so one waiting client
-- wakes per release instead of every subscriber of the release channel.
local WAKE_PREFIX = 'lh:wake:'
local WAIT_KEEP_MS = 60000
local function is_wake(ch)
  return type(ch) == 'string' and #ch > #WAKE_PREFIX and #ch <= 128 and string.sub(ch, 1, #WAKE_PREFIX) == WAKE_PREFIX
end
-- Queue `wake` at the back, or keep an older registration's place (`keep_place`); the queue
-- outlives `ms` by WAIT_KEEP_MS. `now_us` is the server time when the caller has read it.
local function enqueue(waiters, wake, ms, keep_place, now_us)
  if not now_us then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  local score = string.format('%.0f', now_us)
  local r
  if keep_place then r = redis.pcall('ZADD', waiters, 'NX', score, wake) else r = redis.pcall('ZADD', waiters, score, wake) end
  if type(r) == 'table' and r.err then
    return redis.error_reply('lh: waiters key ' .. waiters .. ' holds a ' .. redis.call('TYPE', waiters)['ok'] .. ', expected a zset')
  end
  local keep = ms + WAIT_KEEP_MS
  if redis.call('PTTL', waiters) < keep then redis.call('PEXPIRE', waiters, keep) end
  return nil
end
-- Drop the caller's own entry (`skip`: it no longer waits for this name).
local function leave(waiters, skip)
  if is_wake(skip) then redis.pcall('ZREM', waiters, skip) end
end
-- Pop queued wake channels until a PUBLISH reaches a subscriber; 1 if one did. At most 16
-- entries per call (a burst of dead clients costs one release its wake-up, never a loop). A
-- waiters key of another type is left alone: nobody is woken through it (waiters fall back
-- to their retry timers).
local function wake_next(waiters, name)
  for _ = 1, 16 do
    local e = redis.pcall('ZPOPMIN', waiters)
    if type(e) ~= 'table' or e.err or #e == 0 then return 0 end
    if is_wake(e[1]) and redis.call('PUBLISH', e[1], name) > 0 then return 1 end
  end
  return 0
end
"#
    };
}

macro_rules! lua_acquire {
    () => {
        concat!(
            r#"-- leasehold ACQUIRE (protocol 2)
-- KEYS[1] lock key  (hash {token, fence}, PX expiry)
-- KEYS[2] fence key (decimal integer text, no expiry)
-- KEYS[3] optional waiters key (zset of wake channels); then ARGV[3] is the caller's wake channel
-- ARGV[1] ownership token, ARGV[2] ttl in ms
-- -> {1, fencing_token, ttl_ms} granted | {0, retry_after_ms or -1} held by another token
if redis.replicate_commands then redis.replicate_commands() end
"#,
            lua_wake_queue!(),
            r#"local MAX_FENCE = 9007199254740991
local function show(v)
  local s = tostring(v)
  if #s > 32 then s = string.sub(s, 1, 32) .. '...' end
  return '"' .. string.gsub(s, '[^%w%p ]', '?') .. '"'
end
local function as_fence(s)
  if type(s) ~= 'string' or #s > 16 or not string.match(s, '^%d+$') then return nil end
  local n = tonumber(s)
  if n > MAX_FENCE then return nil end
  return n
end
if #KEYS ~= 2 and #KEYS ~= 3 then return redis.error_reply('lh: ACQUIRE expects 2 keys (lock, fence) or 3 (lock, fence, waiters), got ' .. #KEYS) end
local lock, fence, waiters = KEYS[1], KEYS[2], KEYS[3]
local token, ttl_s, wake = ARGV[1], ARGV[2], ARGV[3]
if type(token) ~= 'string' or #token == 0 or #token > 256 then
  return redis.error_reply('lh: ACQUIRE needs an ownership token of 1..256 bytes')
end
if type(ttl_s) ~= 'string' or #ttl_s > 15 or not string.match(ttl_s, '^[1-9]%d*$') then
  return redis.error_reply('lh: ACQUIRE needs ttl_ms as a positive integer, got ' .. show(ttl_s))
end
if waiters and not is_wake(wake) then
  return redis.error_reply('lh: ACQUIRE with a waiters key needs a wake channel "lh:wake:..." of at most 128 bytes, got ' .. show(wake))
end
local ttl = tonumber(ttl_s)
local kind = redis.call('TYPE', lock)['ok']
if kind == 'hash' then
  local cur = redis.call('HMGET', lock, 'token', 'fence')
  local f = as_fence(cur[2])
  if type(cur[1]) ~= 'string' or not f then
    return redis.error_reply('lh: lock key ' .. lock .. ' is a hash without a valid token and fence (not written by leasehold?); refusing to grant')
  end
  if cur[1] == token then
    redis.call('PEXPIRE', lock, ttl_s)
    -- A retry whose grant reply was lost: queued at the back like a fresh grant (below).
    if waiters then enqueue(waiters, wake, ttl, false) end
    return {1, f, ttl}
  end
  local left = redis.call('PTTL', lock)
  if left < 0 then
    return redis.error_reply('lh: lock key ' .. lock .. ' has no expiry (not written by leasehold?); refusing to wait on it forever')
  end
  if waiters then
    local err = enqueue(waiters, wake, left, true)
    if err then return err end
  end
  return {0, left}
elseif kind ~= 'none' then
  return redis.error_reply('lh: lock key ' .. lock .. ' holds a ' .. kind .. ', expected a hash; refusing to grant')
end
local prev = 0
-- GET under pcall: a fence key of another type is an error reply, and only then is TYPE
-- asked (one command fewer on every grant).
local s = redis.pcall('GET', fence)
if type(s) == 'table' and s.err then
  local fkind = redis.call('TYPE', fence)['ok']
  return redis.error_reply('lh: fence key ' .. fence .. ' holds a ' .. fkind .. ', expected a string; refusing to grant')
elseif s then
  prev = as_fence(s)
  if not prev then
    return redis.error_reply('lh: fence key ' .. fence .. ' holds ' .. show(s) .. ', expected a decimal integer below 2^53; refusing to grant')
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local nxt = prev + 1
if now > nxt then nxt = now end
if nxt > MAX_FENCE then
  return redis.error_reply('lh: fence key ' .. fence .. ' is exhausted (2^53); refusing to grant')
end
local ns = string.format('%.0f', nxt)
redis.call('SET', fence, ns)
redis.call('HSET', lock, 'token', token, 'fence', ns)
redis.call('PEXPIRE', lock, ttl_s)
-- A waiter that wins stays queued, moved to the back: its client may have more waiters for
-- this name. The client removes the entry when it stops waiting, or skips it in its RELEASE.
if waiters then enqueue(waiters, wake, ttl, false, now) end
return {1, nxt, ttl}
"#
        )
    };
}

macro_rules! lua_renew {
    () => {
        r#"-- leasehold RENEW (protocol 2)
-- KEYS[1] lock key; ARGV[1] ownership token, ARGV[2] ttl in ms
-- -> 1 renewed | 0 rejected (not the owner, or the lock is gone: never re-created here)
if #KEYS ~= 1 then return redis.error_reply('lh: RENEW expects 1 key (lock), got ' .. #KEYS) end
local lock = KEYS[1]
local token, ttl_s = ARGV[1], ARGV[2]
if type(token) ~= 'string' or #token == 0 or #token > 256 then
  return redis.error_reply('lh: RENEW needs an ownership token of 1..256 bytes')
end
if type(ttl_s) ~= 'string' or #ttl_s > 15 or not string.match(ttl_s, '^[1-9]%d*$') then
  return redis.error_reply('lh: RENEW needs ttl_ms as a positive integer')
end
-- HGET under pcall: TYPE and EXISTS are asked only when it fails or finds no token.
local owner = redis.pcall('HGET', lock, 'token')
if type(owner) == 'table' and owner.err then
  local kind = redis.call('TYPE', lock)['ok']
  return redis.error_reply('lh: lock key ' .. lock .. ' holds a ' .. kind .. ', expected a hash')
end
if not owner then
  if redis.call('EXISTS', lock) == 0 then return 0 end
  return redis.error_reply('lh: lock key ' .. lock .. ' is a hash without a token (not written by leasehold?)')
end
if owner ~= token then return 0 end
redis.call('PEXPIRE', lock, ttl_s)
return 1
"#
    };
}

macro_rules! lua_release {
    () => {
        concat!(
            r#"-- leasehold RELEASE (protocol 2)
-- KEYS[1] lock key, KEYS[2] optional waiters key
-- ARGV[1] ownership token, ARGV[2] release channel, ARGV[3] lock name,
-- ARGV[4] optional: the caller's own wake channel when it no longer waits (dropped from the queue)
-- -> 1 released (PUBLISH channel name, and name to the oldest live waiter) | 0 not the owner
if redis.replicate_commands then redis.replicate_commands() end
"#,
            lua_wake_queue!(),
            r#"if #KEYS ~= 1 and #KEYS ~= 2 then return redis.error_reply('lh: RELEASE expects 1 key (lock) or 2 (lock, waiters), got ' .. #KEYS) end
local lock, waiters = KEYS[1], KEYS[2]
local token, channel, name, skip = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if type(token) ~= 'string' or #token == 0 or #token > 256 then
  return redis.error_reply('lh: RELEASE needs an ownership token of 1..256 bytes')
end
if type(channel) ~= 'string' or #channel == 0 or type(name) ~= 'string' or #name == 0 then
  return redis.error_reply('lh: RELEASE needs a channel and a lock name')
end
-- The caller leaves the queue whether or not it still owns the lock.
if waiters then leave(waiters, skip) end
-- HGET under pcall: TYPE and EXISTS are asked only when it fails or finds no token.
local owner = redis.pcall('HGET', lock, 'token')
if type(owner) == 'table' and owner.err then
  local kind = redis.call('TYPE', lock)['ok']
  return redis.error_reply('lh: lock key ' .. lock .. ' holds a ' .. kind .. ', expected a hash')
end
if not owner then
  if redis.call('EXISTS', lock) == 0 then return 0 end
  return redis.error_reply('lh: lock key ' .. lock .. ' is a hash without a token (not written by leasehold?)')
end
if owner ~= token then return 0 end
redis.call('DEL', lock)
if waiters then wake_next(waiters, name) end
redis.call('PUBLISH', channel, name)
return 1
"#
        )
    };
}

macro_rules! lua_notify {
    () => {
        concat!(
            r#"-- leasehold NOTIFY (protocol 2)
-- Passes a wake-up on to the next queued waiter.
-- KEYS[1] waiters key; ARGV[1] lock name, ARGV[2] optional: the caller's own wake channel
-- -> 1 a waiter's client was woken | 0 nobody is queued (or no queued client is connected)
if redis.replicate_commands then redis.replicate_commands() end
"#,
            lua_wake_queue!(),
            r#"if #KEYS ~= 1 then return redis.error_reply('lh: NOTIFY expects 1 key (waiters), got ' .. #KEYS) end
local name = ARGV[1]
if type(name) ~= 'string' or #name == 0 then
  return redis.error_reply('lh: NOTIFY needs a lock name')
end
leave(KEYS[1], ARGV[2])
return wake_next(KEYS[1], name)
"#
        )
    };
}

/// The ACQUIRE script (see the module docs for its calling convention).
pub const ACQUIRE_SCRIPT: &str = lua_acquire!();
/// The RENEW script.
pub const RENEW_SCRIPT: &str = lua_renew!();
/// The RELEASE script.
pub const RELEASE_SCRIPT: &str = lua_release!();
/// The NOTIFY script (pass a wake-up on to the next queued waiter).
pub const NOTIFY_SCRIPT: &str = lua_notify!();

const ACQUIRE_SCRIPT_NUL: &str = concat!(lua_acquire!(), "\0");
const RENEW_SCRIPT_NUL: &str = concat!(lua_renew!(), "\0");
const RELEASE_SCRIPT_NUL: &str = concat!(lua_release!(), "\0");
const NOTIFY_SCRIPT_NUL: &str = concat!(lua_notify!(), "\0");

/// Which script (values match `LH_REDIS_SCRIPT_*`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScriptKind {
    /// `LH_REDIS_SCRIPT_ACQUIRE`
    Acquire = 1,
    /// `LH_REDIS_SCRIPT_RENEW`
    Renew = 2,
    /// `LH_REDIS_SCRIPT_RELEASE`
    Release = 3,
    /// `LH_REDIS_SCRIPT_NOTIFY`
    Notify = 4,
}

impl ScriptKind {
    /// All kinds, in value order.
    pub const ALL: [ScriptKind; 4] = [
        ScriptKind::Acquire,
        ScriptKind::Renew,
        ScriptKind::Release,
        ScriptKind::Notify,
    ];

    /// The kind for a C ABI value; `None` for unknown values.
    pub fn from_u32(v: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u32 == v)
    }

    /// The script text (no trailing NUL).
    pub fn text(self) -> &'static str {
        let t = self.text_with_nul();
        &t[..t.len() - 1]
    }

    /// The script text followed by one NUL byte (for C callers; the length excludes it).
    pub fn text_with_nul(self) -> &'static str {
        match self {
            ScriptKind::Acquire => ACQUIRE_SCRIPT_NUL,
            ScriptKind::Renew => RENEW_SCRIPT_NUL,
            ScriptKind::Release => RELEASE_SCRIPT_NUL,
            ScriptKind::Notify => NOTIFY_SCRIPT_NUL,
        }
    }

    /// The numbers of KEYS the script accepts: without and with the waiters key.
    pub fn num_keys(self) -> &'static [usize] {
        match self {
            ScriptKind::Acquire => &[2, 3],
            ScriptKind::Release => &[1, 2],
            ScriptKind::Renew | ScriptKind::Notify => &[1],
        }
    }
}

/// Which key (values match `LH_REDIS_KEY_*`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// `lh:{NAME}` (`LH_REDIS_KEY_LOCK`)
    Lock = 1,
    /// `lh:{NAME}:fence` (`LH_REDIS_KEY_FENCE`)
    Fence = 2,
    /// `lh:{NAME}:released` (`LH_REDIS_KEY_CHANNEL`)
    Channel = 3,
    /// `lh:{NAME}:waiters` (`LH_REDIS_KEY_WAITERS`)
    Waiters = 4,
}

impl KeyKind {
    /// All kinds, in value order.
    pub const ALL: [KeyKind; 4] = [
        KeyKind::Lock,
        KeyKind::Fence,
        KeyKind::Channel,
        KeyKind::Waiters,
    ];

    /// The kind for a C ABI value; `None` for unknown values.
    pub fn from_u32(v: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u32 == v)
    }

    /// What follows the name.
    pub fn suffix(self) -> &'static str {
        match self {
            KeyKind::Lock => LOCK_SUFFIX,
            KeyKind::Fence => FENCE_SUFFIX,
            KeyKind::Channel => CHANNEL_SUFFIX,
            KeyKind::Waiters => WAITERS_SUFFIX,
        }
    }
}

/// The core's lock-name check, here too because every key is built from a name.
pub use crate::validate_name;

/// Length in bytes of the key of `kind` for `name` (the name is not validated).
pub fn key_len(kind: KeyKind, name: &str) -> usize {
    KEY_PREFIX.len() + name.len() + kind.suffix().len()
}

/// Writes the key of `kind` for `name` into the front of `buf`.
///
/// Returns `Ok(Ok(len))` when it fits, `Ok(Err(needed))` when `buf` is too small (nothing
/// written), and `Err` for an invalid name.
pub fn write_key(kind: KeyKind, name: &str, buf: &mut [u8]) -> Result<Result<usize, usize>, Error> {
    validate_name(name)?;
    let needed = key_len(kind, name);
    let Some(dst) = buf.get_mut(..needed) else {
        return Ok(Err(needed));
    };
    let (prefix, rest) = dst.split_at_mut(KEY_PREFIX.len());
    prefix.copy_from_slice(KEY_PREFIX.as_bytes());
    let (middle, suffix) = rest.split_at_mut(name.len());
    middle.copy_from_slice(name.as_bytes());
    suffix.copy_from_slice(kind.suffix().as_bytes());
    Ok(Ok(needed))
}

/// The key of `kind` for `name`, e.g. `key(KeyKind::Fence, "jobs")` = `"lh:{jobs}:fence"`.
pub fn key(kind: KeyKind, name: &str) -> Result<String, Error> {
    validate_name(name)?;
    let mut s = String::with_capacity(key_len(kind, name));
    s.push_str(KEY_PREFIX);
    s.push_str(name);
    s.push_str(kind.suffix());
    Ok(s)
}

/// Writes the wake channel made of `random` (fresh randomness per subscriber connection) into
/// the front of `buf`: `lh:wake:` and the bytes in lowercase hex. The channel format is written
/// here only, so every host's transport makes channels the scripts accept. Returns the length,
/// or `Err(needed)` when `buf` is too small (nothing written).
pub fn write_wake_channel(random: &[u8; WAKE_RANDOM_LEN], buf: &mut [u8]) -> Result<usize, usize> {
    let Some(dst) = buf.get_mut(..WAKE_CHANNEL_LEN) else {
        return Err(WAKE_CHANNEL_LEN);
    };
    let (prefix, digits) = dst.split_at_mut(WAKE_CHANNEL_PREFIX.len());
    prefix.copy_from_slice(WAKE_CHANNEL_PREFIX.as_bytes());
    crate::types::write_lower_hex(random, digits);
    Ok(WAKE_CHANNEL_LEN)
}

/// The wake channel made of `random` (see `write_wake_channel`).
pub fn wake_channel(random: &[u8; WAKE_RANDOM_LEN]) -> String {
    let mut buf = [0u8; WAKE_CHANNEL_LEN];
    let _ = write_wake_channel(random, &mut buf);
    buf.iter().map(|&b| char::from(b)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_NAME_LEN;

    #[test]
    fn wake_channels_are_the_prefix_and_the_random_bytes_in_hex() {
        let random: [u8; WAKE_RANDOM_LEN] = std::array::from_fn(|i| (i * 17) as u8);
        let ch = wake_channel(&random);
        assert_eq!(ch, "lh:wake:00112233445566778899aabbccddeeff");
        assert_eq!(ch.len(), WAKE_CHANNEL_LEN);
        assert!(ch.starts_with(WAKE_CHANNEL_PREFIX) && ch.len() <= MAX_WAKE_CHANNEL_LEN);
        let mut short = [0u8; WAKE_CHANNEL_LEN - 1];
        assert_eq!(
            write_wake_channel(&random, &mut short),
            Err(WAKE_CHANNEL_LEN)
        );
        assert!(short.iter().all(|&b| b == 0), "nothing written");
    }

    /// Redis Cluster's key slot (CRC16/XMODEM of the hash tag, mod 16384).
    fn slot(key: &[u8]) -> u16 {
        let tagged = key
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
        let mut crc: u16 = 0;
        for &b in tagged {
            crc ^= u16::from(b) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
        }
        crc % 16384
    }

    #[test]
    fn slot_function_matches_redis_reference_values() {
        // Values from the Redis Cluster specification / CLUSTER KEYSLOT.
        assert_eq!(slot(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
    }

    #[test]
    fn keys_have_the_documented_layout() {
        assert_eq!(key(KeyKind::Lock, "jobs").unwrap(), "lh:{jobs}");
        assert_eq!(key(KeyKind::Fence, "jobs").unwrap(), "lh:{jobs}:fence");
        assert_eq!(key(KeyKind::Channel, "jobs").unwrap(), "lh:{jobs}:released");
        assert_eq!(key(KeyKind::Waiters, "jobs").unwrap(), "lh:{jobs}:waiters");
        assert_eq!(key(KeyKind::Lock, "é/ü x").unwrap(), "lh:{é/ü x}");
    }

    #[test]
    fn keys_of_one_name_share_a_cluster_slot() {
        for name in [
            "jobs",
            "a",
            "x{y}z",
            "a}b",
            "{",
            "{}",
            "räksmörgås",
            "n:1:fence",
            "a b",
        ] {
            let slots: Vec<u16> = KeyKind::ALL
                .iter()
                .map(|&k| slot(key(k, name).unwrap().as_bytes()))
                .collect();
            assert!(slots.iter().all(|&s| s == slots[0]), "{name}: {slots:?}");
        }
    }

    #[test]
    fn keys_of_different_names_never_collide() {
        let names = [
            "x",
            "x}",
            "x}:fence",
            "x:fence",
            "x}:released",
            "x:released",
            "x}:waiters",
            "x:waiters",
            "}",
            "}}",
            "x{",
        ];
        let mut seen = std::collections::HashMap::new();
        for name in names {
            for kind in KeyKind::ALL {
                let k = key(kind, name).unwrap();
                if let Some(prev) = seen.insert(k.clone(), (kind, name)) {
                    panic!("{k} produced by {prev:?} and {:?}", (kind, name));
                }
            }
        }
    }

    #[test]
    fn invalid_names_are_refused() {
        assert!(matches!(key(KeyKind::Lock, ""), Err(Error::EmptyName)));
        assert!(matches!(key(KeyKind::Lock, "a\0b"), Err(Error::NameHasNul)));
        let long = "n".repeat(MAX_NAME_LEN + 1);
        assert!(
            matches!(key(KeyKind::Lock, &long), Err(Error::NameTooLong { len }) if len == MAX_NAME_LEN + 1)
        );
        let max = "n".repeat(MAX_NAME_LEN);
        assert_eq!(
            key(KeyKind::Channel, &max).unwrap().len(),
            key_len(KeyKind::Channel, &max)
        );
        let mut buf = [0u8; 8];
        assert!(matches!(
            write_key(KeyKind::Lock, "", &mut buf),
            Err(Error::EmptyName)
        ));
    }

    #[test]
    fn write_key_reports_the_needed_size_and_writes_nothing_when_short() {
        for kind in KeyKind::ALL {
            let want = key(kind, "jobs").unwrap();
            let mut short = vec![0xAAu8; want.len() - 1];
            assert_eq!(
                write_key(kind, "jobs", &mut short).unwrap(),
                Err(want.len())
            );
            assert!(short.iter().all(|&b| b == 0xAA));
            let mut exact = vec![0u8; want.len()];
            assert_eq!(write_key(kind, "jobs", &mut exact).unwrap(), Ok(want.len()));
            assert_eq!(exact, want.as_bytes());
            let mut big = vec![0xAAu8; want.len() + 5];
            assert_eq!(write_key(kind, "jobs", &mut big).unwrap(), Ok(want.len()));
            assert_eq!(&big[..want.len()], want.as_bytes());
            assert!(big[want.len()..].iter().all(|&b| b == 0xAA));
            assert_eq!(write_key(kind, "jobs", &mut []).unwrap(), Err(want.len()));
        }
    }

    #[test]
    fn kinds_round_trip_through_their_abi_values() {
        for kind in ScriptKind::ALL {
            assert_eq!(ScriptKind::from_u32(kind as u32), Some(kind));
        }
        for kind in KeyKind::ALL {
            assert_eq!(KeyKind::from_u32(kind as u32), Some(kind));
        }
        for bad in [0, 5, 99, u32::MAX] {
            assert_eq!(ScriptKind::from_u32(bad), None);
            assert_eq!(KeyKind::from_u32(bad), None);
        }
    }

    #[test]
    fn scripts_are_distinct_text_without_nul_and_c_copies_match() {
        for kind in ScriptKind::ALL {
            let text = kind.text();
            assert!(!text.is_empty());
            assert!(!text.as_bytes().contains(&0), "{kind:?}");
            let c = kind.text_with_nul();
            assert_eq!(c.len(), text.len() + 1);
            assert_eq!(&c[..text.len()], text);
            assert!(c.ends_with('\0'));
            assert!(text.is_ascii(), "{kind:?}");
        }
        let texts: std::collections::HashSet<&str> =
            ScriptKind::ALL.iter().map(|k| k.text()).collect();
        assert_eq!(texts.len(), ScriptKind::ALL.len());
    }

    #[test]
    fn scripts_follow_the_calling_convention() {
        // Cheap structural checks; the behaviour is tested against a real redis-server in
        // bindings/python/tests/redis/test_scripts.py.
        let acquire = ScriptKind::Acquire.text();
        assert!(acquire.contains("redis.call('TIME')"));
        assert!(
            acquire.contains("return {1, f, ttl}"),
            "idempotent re-grant returns the same fence"
        );
        assert!(acquire.contains("return {0, left}"));
        assert!(acquire.contains("'PEXPIRE', lock, ttl_s"));
        let renew = ScriptKind::Renew.text();
        assert!(!renew.contains("HSET"), "RENEW must never re-create a lock");
        assert!(!renew.contains("'SET'"));
        let release = ScriptKind::Release.text();
        assert!(release.contains("redis.call('PUBLISH', channel, name)"));
        assert!(release.contains("wake_next(waiters, name)"));
        assert!(NOTIFY_SCRIPT.contains("return wake_next(KEYS[1], name)"));
        for script in [ACQUIRE_SCRIPT, RELEASE_SCRIPT, NOTIFY_SCRIPT] {
            assert!(script.contains(&format!("local WAKE_PREFIX = '{WAKE_CHANNEL_PREFIX}'")));
            assert!(script.contains(&format!("#ch <= {MAX_WAKE_CHANNEL_LEN}")));
        }
        for kind in ScriptKind::ALL {
            let text = kind.text();
            assert!(text.contains(&format!("(protocol {PROTOCOL_VERSION})")));
            assert_eq!(
                text.matches("redis.error_reply('lh: ").count(),
                text.matches("redis.error_reply(").count()
            );
            let check = match kind.num_keys() {
                [n] => format!("#KEYS ~= {n}"),
                [a, b] => format!("#KEYS ~= {a} and #KEYS ~= {b}"),
                other => panic!("{kind:?}: {other:?}"),
            };
            assert!(text.contains(&check), "{kind:?}");
        }
    }

    #[test]
    fn max_fence_matches_the_lua_constant() {
        assert_eq!(MAX_FENCE, 9_007_199_254_740_991);
        assert!(ACQUIRE_SCRIPT.contains(&format!("local MAX_FENCE = {MAX_FENCE}")));
    }
}
