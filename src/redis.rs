//! The Redis protocol of leasehold (docs/design.md §6): the canonical Lua scripts and the key layout.
//!
//! Every host (Python, Go, C++, C) runs these exact bytes, read from the library through
//! `lh_redis_script` / `lh_redis_key`, so clients written in different languages contend
//! correctly for the same lock on the same server. Nothing here performs IO.
//!
//! The protocol itself (key layout, waking one waiter per release, direct grants on release,
//! the grant notice, each script's keys, arguments and replies, and the `lh: ` error replies
//! for garbage in the keyspace) is specified in `docs/redis-protocol-3.md`; this module is its
//! implementation, and its tests pin the details. [`parse_grant_notice`] reads a grant notice.

use crate::Error;

/// Bumped whenever the script semantics change in a way other hosts must know about.
pub const PROTOCOL_VERSION: u32 = 3;

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
/// Suffix of the grants key (protocol 3).
pub const GRANTS_SUFFIX: &str = "}:grants";
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
/// Longest ownership token the scripts accept, in bytes.
pub const MAX_TOKEN_LEN: usize = 256;
/// Separates the wake channel from the token in a protocol-3 queue entry (`wake#token`).
pub const ENTRY_SEPARATOR: u8 = b'#';
/// Most decimal digits of the tag a 4-key ACQUIRE carries (enough for any `u64`).
pub const MAX_TAG_DIGITS: usize = 20;
/// Every direct-grant notice starts with these bytes; a lock name never contains NUL, so a
/// wake-up payload that starts with NUL is a notice and anything else is a plain name.
pub const GRANT_NOTICE_PREFIX: &[u8] = b"\0grant ";

// The script texts are macros so that the NUL-terminated copies for the C ABI are built from
// the same literal at compile time (one copy of the source text). The waiter-queue helpers
// are one fragment shared by ACQUIRE, RELEASE and NOTIFY.
macro_rules! lua_wake_queue {
    () => {
        r#"-- Waiter queue: a sorted set, oldest registration first. A protocol-2 entry is a wake
-- channel; a protocol-3 entry is 'wake#token', one per waiting lease (wake channels never
-- contain '#'). A release serves the oldest entry whose channel has a subscriber, so one
-- waiting client wakes per release instead of every subscriber of the release channel.
local WAKE_PREFIX = 'lh:wake:'
local WAIT_KEEP_MS = 60000
local function is_wake(ch)
  return type(ch) == 'string' and #ch > #WAKE_PREFIX and #ch <= 128 and string.sub(ch, 1, #WAKE_PREFIX) == WAKE_PREFIX
end
-- A queue entry split at its first '#': (wake channel, token), or (entry, nil) for a
-- protocol-2 entry (and for 'wake#', whose token would be empty).
local function split_entry(e)
  local i = string.find(e, '#', 1, true)
  if not i or i == #e then return e, nil end
  return string.sub(e, 1, i - 1), string.sub(e, i + 1)
end
-- Keep a queue key alive `ms` (the holder's remaining time) plus WAIT_KEEP_MS.
local function keep_alive(key, ms)
  local keep = ms + WAIT_KEEP_MS
  if redis.call('PTTL', key) < keep then redis.call('PEXPIRE', key, keep) end
end
-- Queue `entry` at the back, or keep an older registration's place (`keep_place`); the queue
-- outlives `ms` by WAIT_KEEP_MS. `now_us` is the server time when the caller has read it.
local function enqueue(waiters, entry, ms, keep_place, now_us)
  if not now_us then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  local score = string.format('%.0f', now_us)
  local r
  if keep_place then r = redis.pcall('ZADD', waiters, 'NX', score, entry) else r = redis.pcall('ZADD', waiters, score, entry) end
  if type(r) == 'table' and r.err then
    return redis.error_reply('lh: waiters key ' .. waiters .. ' holds a ' .. redis.call('TYPE', waiters)['ok'] .. ', expected a zset')
  end
  keep_alive(waiters, ms)
  return nil
end
-- Drop the caller's own entry (`skip`: it no longer waits for this name).
local function leave(waiters, skip)
  if is_wake(skip) then redis.pcall('ZREM', waiters, skip) end
end
-- Pop queued entries until a PUBLISH of the plain name reaches a subscriber; 1 if one did. A
-- protocol-3 entry gets the plain name on its channel too (its client then sends ACQUIRE).
-- At most 16 entries per call (a burst of dead clients costs one release its wake-up, never a
-- loop). A waiters key of another type is left alone: nobody is woken through it (waiters
-- fall back to their retry timers).
local function wake_next(waiters, name)
  for _ = 1, 16 do
    local e = redis.pcall('ZPOPMIN', waiters)
    if type(e) ~= 'table' or e.err or #e == 0 then return 0 end
    local ch = split_entry(e[1])
    if is_wake(ch) and redis.call('PUBLISH', ch, name) > 0 then return 1 end
  end
  return 0
end
"#
    };
}

// The fencing-token computation, shared by ACQUIRE and RELEASE (a direct grant mints the next
// fence exactly as ACQUIRE does).
macro_rules! lua_next_fence {
    () => {
        r#"-- Fencing tokens: max(previous + 1, server TIME in us), persisted in the fence key.
local MAX_FENCE = 9007199254740991
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
-- The next fence for the fence key `fence` and the server time read for it: (fence, now_us),
-- or (nil, message) when the fence key is garbage or exhausted (the caller grants nothing;
-- the message lacks the 'lh: ' prefix). Writes nothing.
local function next_fence(fence)
  local prev = 0
  -- GET under pcall: a fence key of another type is an error reply, and only then is TYPE
  -- asked (one command fewer on every grant).
  local s = redis.pcall('GET', fence)
  if type(s) == 'table' and s.err then
    return nil, 'fence key ' .. fence .. ' holds a ' .. redis.call('TYPE', fence)['ok'] .. ', expected a string; refusing to grant'
  elseif s then
    prev = as_fence(s)
    if not prev then
      return nil, 'fence key ' .. fence .. ' holds ' .. show(s) .. ', expected a decimal integer below 2^53; refusing to grant'
    end
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local nxt = prev + 1
  if now > nxt then nxt = now end
  if nxt > MAX_FENCE then
    return nil, 'fence key ' .. fence .. ' is exhausted (2^53); refusing to grant'
  end
  return nxt, now
end
"#
    };
}

macro_rules! lua_acquire {
    () => {
        concat!(
            r#"-- leasehold ACQUIRE (protocol 3)
-- KEYS[1] lock key  (hash {token, fence}, PX expiry)
-- KEYS[2] fence key (decimal integer text, no expiry)
-- KEYS[3] optional waiters key (zset of queue entries); then ARGV[3] is the caller's wake channel
-- KEYS[4] optional grants key (hash token -> '<ttl_ms>:<tag>'); then ARGV[4] is the attempt's tag
--         (1..20 digits) and a refusal queues this lease ('wake#token') for a direct grant
-- ARGV[1] ownership token, ARGV[2] ttl in ms
-- -> {1, fencing_token, ttl_ms} granted | {0, retry_after_ms or -1} held by another token
if redis.replicate_commands then redis.replicate_commands() end
"#,
            lua_wake_queue!(),
            lua_next_fence!(),
            r#"if #KEYS ~= 2 and #KEYS ~= 3 and #KEYS ~= 4 then return redis.error_reply('lh: ACQUIRE expects 2 keys (lock, fence), 3 (lock, fence, waiters) or 4 (lock, fence, waiters, grants), got ' .. #KEYS) end
local lock, fence, waiters, grants = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, ttl_s, wake, tag = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if type(token) ~= 'string' or #token == 0 or #token > 256 then
  return redis.error_reply('lh: ACQUIRE needs an ownership token of 1..256 bytes')
end
if type(ttl_s) ~= 'string' or #ttl_s > 15 or not string.match(ttl_s, '^[1-9]%d*$') then
  return redis.error_reply('lh: ACQUIRE needs ttl_ms as a positive integer, got ' .. show(ttl_s))
end
if waiters and not is_wake(wake) then
  return redis.error_reply('lh: ACQUIRE with a waiters key needs a wake channel "lh:wake:..." of at most 128 bytes, got ' .. show(wake))
end
-- With the grants key the queue entry is this lease's own: 'wake#token'.
local entry
if grants then
  if string.find(wake, '#', 1, true) then
    return redis.error_reply('lh: ACQUIRE with a grants key needs a wake channel without a hash sign (#), got ' .. show(wake))
  end
  if type(tag) ~= 'string' or #tag > 20 or not string.match(tag, '^%d+$') then
    return redis.error_reply('lh: ACQUIRE with a grants key needs a tag of 1..20 decimal digits, got ' .. show(tag))
  end
  entry = wake .. '#' .. token
end
-- Granted to this lease (protocol 3): its entry and grants field go, and it is not queued
-- again (entries are per lease). Both keys outlive the grant like a refusal keeps them.
local function dequeue(ms)
  local r = redis.pcall('ZREM', waiters, entry)
  if type(r) ~= 'table' then keep_alive(waiters, ms) end
  r = redis.pcall('HDEL', grants, token)
  if type(r) ~= 'table' then keep_alive(grants, ms) end
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
    -- The same grant: a retry whose reply was lost, or (protocol 3) an attempt that crossed
    -- the notice of its direct grant. A protocol-2 entry moves to the back as on a fresh
    -- grant (below).
    if grants then dequeue(ttl) elseif waiters then enqueue(waiters, wake, ttl, false) end
    return {1, f, ttl}
  end
  local left = redis.call('PTTL', lock)
  if left < 0 then
    return redis.error_reply('lh: lock key ' .. lock .. ' has no expiry (not written by leasehold?); refusing to wait on it forever')
  end
  if grants then
    -- The newest refused attempt's ttl and tag: a direct grant is counted from its send time.
    local r = redis.pcall('HSET', grants, token, ttl_s .. ':' .. tag)
    if type(r) == 'table' and r.err then
      return redis.error_reply('lh: grants key ' .. grants .. ' holds a ' .. redis.call('TYPE', grants)['ok'] .. ', expected a hash')
    end
    keep_alive(grants, left)
    local err = enqueue(waiters, entry, left, true)
    if err then return err end
  elseif waiters then
    local err = enqueue(waiters, wake, left, true)
    if err then return err end
  end
  return {0, left}
elseif kind ~= 'none' then
  return redis.error_reply('lh: lock key ' .. lock .. ' holds a ' .. kind .. ', expected a hash; refusing to grant')
end
local nxt, now = next_fence(fence)
if not nxt then return redis.error_reply('lh: ' .. now) end
local ns = string.format('%.0f', nxt)
redis.call('SET', fence, ns)
redis.call('HSET', lock, 'token', token, 'fence', ns)
redis.call('PEXPIRE', lock, ttl_s)
-- A protocol-2 waiter that wins stays queued, moved to the back: its client may have more
-- waiters for this name. The client removes the entry when it stops waiting, or skips it in
-- its RELEASE.
if grants then dequeue(ttl) elseif waiters then enqueue(waiters, wake, ttl, false, now) end
return {1, nxt, ttl}
"#
        )
    };
}

macro_rules! lua_renew {
    () => {
        r#"-- leasehold RENEW (protocol 3)
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
            r#"-- leasehold RELEASE (protocol 3)
-- KEYS[1] lock key, KEYS[2] optional waiters key, KEYS[3] and KEYS[4] optional fence and
-- grants keys (direct grant: the oldest queued lease gets the lock)
-- ARGV[1] ownership token, ARGV[2] release channel, ARGV[3] lock name,
-- ARGV[4] optional: the caller's own wake channel when it no longer waits (dropped from the queue)
-- -> 1 released (PUBLISH channel name; the oldest live queued entry gets the lock or name) | 0 not the owner
if redis.replicate_commands then redis.replicate_commands() end
"#,
            lua_wake_queue!(),
            lua_next_fence!(),
            r#"-- A grants field, '<ttl_ms>:<tag>' -> (ttl_ms text, tag text), or nil when malformed.
local function grant_of(v)
  if type(v) ~= 'string' then return nil end
  local ttl_s, tag = string.match(v, '^([1-9]%d*):(%d+)$')
  if not ttl_s or #ttl_s > 15 or #tag > 20 then return nil end
  return ttl_s, tag
end
-- Direct grant (protocol 3): pop queued entries until one is served; 1 if one was. A
-- 'wake#token' entry with a valid grants field whose channel has a subscriber here gets the
-- lock (the next fence, the field's ttl) and a notice on its channel. A grant is never undone
-- once published: a PUBLISH reply counts only this server's subscribers, and a subscriber
-- elsewhere (a replica, another Cluster node) may have the notice already. So the channel is
-- asked first (PUBSUB NUMSUB, the same local count): with nobody here the entry gets no
-- grant, only the plain name (harmless wherever it lands), and the next entry is tried. Any
-- other entry on a wake channel gets the plain name, as wake_next does. At most 16 entries per
-- call. A garbage fence key grants nothing: the entry's client gets the plain name and meets
-- the error in its ACQUIRE.
local function grant_next(lock, waiters, fence, grants, name)
  for _ = 1, 16 do
    local e = redis.pcall('ZPOPMIN', waiters)
    if type(e) ~= 'table' or e.err or #e == 0 then return 0 end
    local ch, tok = split_entry(e[1])
    if is_wake(ch) then
      local ttl_s, tag
      if tok and #tok <= 256 then
        local v = redis.pcall('HGET', grants, tok)
        if type(v) == 'string' then
          redis.call('HDEL', grants, tok)
          ttl_s, tag = grant_of(v)
        end
      end
      local f = nil
      if ttl_s and redis.call('PUBSUB', 'NUMSUB', ch)[2] > 0 then f = next_fence(fence) end
      if f then
        local fs = string.format('%.0f', f)
        redis.call('SET', fence, fs)
        redis.call('HSET', lock, 'token', tok, 'fence', fs)
        redis.call('PEXPIRE', lock, ttl_s)
        -- Names never contain NUL: a payload starting with one is a notice, not a name.
        local notice = '\0grant ' .. tag .. ' ' .. fs .. ' ' .. ttl_s .. ' ' .. #tok .. ' ' .. tok .. name
        redis.call('PUBLISH', ch, notice)
        -- The rest of the queue now waits for this grant (both keys are of their type:
        -- ZPOPMIN and HGET worked on them).
        keep_alive(waiters, tonumber(ttl_s))
        keep_alive(grants, tonumber(ttl_s))
        return 1
      elseif redis.call('PUBLISH', ch, name) > 0 then
        return 1
      end
    end
  end
  return 0
end
if #KEYS ~= 1 and #KEYS ~= 2 and #KEYS ~= 4 then return redis.error_reply('lh: RELEASE expects 1 key (lock), 2 (lock, waiters) or 4 (lock, waiters, fence, grants), got ' .. #KEYS) end
local lock, waiters, fence, grants = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
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
if grants then grant_next(lock, waiters, fence, grants, name) elseif waiters then wake_next(waiters, name) end
redis.call('PUBLISH', channel, name)
return 1
"#
        )
    };
}

macro_rules! lua_notify {
    () => {
        concat!(
            r#"-- leasehold NOTIFY (protocol 3)
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

/// The ACQUIRE script (calling convention: `docs/redis-protocol-3.md`).
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

    /// The numbers of KEYS the script accepts: the plain form, with the waiters key
    /// (protocol 2) and, for ACQUIRE and RELEASE, with the grants key too (protocol 3).
    pub fn num_keys(self) -> &'static [usize] {
        match self {
            ScriptKind::Acquire => &[2, 3, 4],
            ScriptKind::Release => &[1, 2, 4],
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
    /// `lh:{NAME}:grants` (`LH_REDIS_KEY_GRANTS`, protocol 3)
    Grants = 5,
}

impl KeyKind {
    /// All kinds, in value order.
    pub const ALL: [KeyKind; 5] = [
        KeyKind::Lock,
        KeyKind::Fence,
        KeyKind::Channel,
        KeyKind::Waiters,
        KeyKind::Grants,
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
            KeyKind::Grants => GRANTS_SUFFIX,
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

/// The payload of a direct grant (protocol 3) that a 4-key RELEASE publishes on the wake
/// channel of the lease it granted the lock to:
/// `"\0grant " tag " " fencing_token " " ttl_ms " " token_len " " token name` (decimal numbers;
/// the token is length-prefixed because it may contain spaces; the name is the rest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantNotice<'a> {
    /// The tag of the refused ACQUIRE that queued the lease (the host's attempt id): the
    /// grant's validity counts from that attempt's send time.
    pub tag: u64,
    /// The fencing token of the grant (`1..=MAX_FENCE`).
    pub fencing_token: u64,
    /// The grant's TTL: the `ttl_ms` of that attempt (positive).
    pub ttl_ms: u64,
    /// The ownership token the lock was granted to (`1..=MAX_TOKEN_LEN` bytes).
    pub token: &'a [u8],
    /// The lock name (a valid name: non-empty, UTF-8, no NUL, at most `MAX_NAME_LEN` bytes).
    pub name: &'a str,
}

/// Parses a wake-channel payload as a direct-grant notice (see [`GrantNotice`]).
///
/// `None` for a plain wake-up (the payload is the lock name) and for anything malformed:
/// a number that is empty, not decimal, longer than 20 digits or over `u64::MAX`, a zero
/// fence or TTL, a fence over `MAX_FENCE`, a token length of 0, over `MAX_TOKEN_LEN` or past
/// the end of the payload, a missing separator, or a name that is not a valid lock name.
pub fn parse_grant_notice(payload: &[u8]) -> Option<GrantNotice<'_>> {
    let rest = payload.strip_prefix(GRANT_NOTICE_PREFIX)?;
    let (tag, rest) = notice_number(rest)?;
    let (fencing_token, rest) = notice_number(rest)?;
    let (ttl_ms, rest) = notice_number(rest)?;
    let (token_len, rest) = notice_number(rest)?;
    let token_len = usize::try_from(token_len).ok()?;
    if fencing_token == 0 || fencing_token > MAX_FENCE || ttl_ms == 0 {
        return None;
    }
    if token_len == 0 || token_len > MAX_TOKEN_LEN || token_len > rest.len() {
        return None;
    }
    let (token, name) = rest.split_at(token_len);
    let name = std::str::from_utf8(name).ok()?;
    validate_name(name).ok()?;
    Some(GrantNotice {
        tag,
        fencing_token,
        ttl_ms,
        token,
        name,
    })
}

/// A notice field: 1..=20 decimal digits followed by one space; the value and what follows.
fn notice_number(s: &[u8]) -> Option<(u64, &[u8])> {
    let end = s.iter().position(|&b| b == b' ')?;
    let digits = &s[..end];
    if digits.is_empty() || digits.len() > MAX_TAG_DIGITS {
        return None;
    }
    let mut n: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some((n, &s[end + 1..]))
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
        assert_eq!(key(KeyKind::Grants, "jobs").unwrap(), "lh:{jobs}:grants");
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
            "x}:grants",
            "x:grants",
            "x}:grants}",
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
        }
        for bad in [0, 6, 99, u32::MAX] {
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
                [a, b, c] => format!("#KEYS ~= {a} and #KEYS ~= {b} and #KEYS ~= {c}"),
                other => panic!("{kind:?}: {other:?}"),
            };
            assert!(text.contains(&check), "{kind:?}");
        }
    }

    #[test]
    fn max_fence_matches_the_lua_constant() {
        assert_eq!(MAX_FENCE, 9_007_199_254_740_991);
        assert!(ACQUIRE_SCRIPT.contains(&format!("local MAX_FENCE = {MAX_FENCE}")));
        assert!(RELEASE_SCRIPT.contains(&format!("local MAX_FENCE = {MAX_FENCE}")));
    }

    #[test]
    fn acquire_and_release_share_one_fence_computation() {
        let fragment = lua_next_fence!();
        for script in [ACQUIRE_SCRIPT, RELEASE_SCRIPT] {
            assert_eq!(script.matches(fragment).count(), 1);
            assert_eq!(
                script.matches("redis.call('TIME')").count(),
                2,
                "enqueue's and next_fence's"
            );
            assert_eq!(script.matches("local function next_fence(").count(), 1);
        }
        assert!(ACQUIRE_SCRIPT.contains("local nxt, now = next_fence(fence)"));
        assert!(RELEASE_SCRIPT.contains("f = next_fence(fence)"));
        assert!(!NOTIFY_SCRIPT.contains("next_fence"), "NOTIFY never grants");
        assert!(!RENEW_SCRIPT.contains("next_fence"));
    }

    #[test]
    fn the_scripts_limits_match_the_rust_constants() {
        assert!(ACQUIRE_SCRIPT.contains(&format!("#token > {MAX_TOKEN_LEN}")));
        assert!(RELEASE_SCRIPT.contains(&format!("#tok <= {MAX_TOKEN_LEN}")));
        assert!(ACQUIRE_SCRIPT.contains(&format!("#tag > {MAX_TAG_DIGITS}")));
        assert!(RELEASE_SCRIPT.contains(&format!("#tag > {MAX_TAG_DIGITS}")));
        let sep = char::from(ENTRY_SEPARATOR);
        assert!(ACQUIRE_SCRIPT.contains(&format!("entry = wake .. '{sep}' .. token")));
        assert!(RELEASE_SCRIPT.contains(&format!("string.find(e, '{sep}', 1, true)")));
        // The Lua literal of the notice prefix, with NUL written as the escape `\0`.
        let prefix = std::str::from_utf8(&GRANT_NOTICE_PREFIX[1..]).unwrap();
        assert_eq!(GRANT_NOTICE_PREFIX[0], 0);
        assert!(RELEASE_SCRIPT.contains(&format!("local notice = '\\0{prefix}' .. tag")));
    }

    /// The notice exactly as the RELEASE script concatenates it (`#token` is a byte count).
    fn lua_notice(tag: &str, fence: &str, ttl: &str, token: &[u8], name: &[u8]) -> Vec<u8> {
        let mut v = b"\0grant ".to_vec();
        for part in [
            tag.as_bytes(),
            b" ",
            fence.as_bytes(),
            b" ",
            ttl.as_bytes(),
            b" ",
        ] {
            v.extend_from_slice(part);
        }
        v.extend_from_slice(token.len().to_string().as_bytes());
        v.push(b' ');
        v.extend_from_slice(token);
        v.extend_from_slice(name);
        v
    }

    #[test]
    fn grant_notices_built_like_the_script_does_parse() {
        let token = b"0123456789abcdef0123456789abcdef";
        let raw = lua_notice("42", "1733000000123456", "30000", token, b"jobs");
        assert_eq!(
            parse_grant_notice(&raw),
            Some(GrantNotice {
                tag: 42,
                fencing_token: 1_733_000_000_123_456,
                ttl_ms: 30_000,
                token,
                name: "jobs",
            })
        );
        // Tokens may contain spaces and '#', names spaces and any UTF-8 but NUL.
        let raw = lua_notice(
            "0",
            "1",
            "1",
            b"a b#c 7 ",
            "r\u{e4}ks m\u{f6}rg\u{e5}s 1 2".as_bytes(),
        );
        let n = parse_grant_notice(&raw).unwrap();
        assert_eq!((n.tag, n.fencing_token, n.ttl_ms), (0, 1, 1));
        assert_eq!(
            (n.token, n.name),
            (&b"a b#c 7 "[..], "r\u{e4}ks m\u{f6}rg\u{e5}s 1 2")
        );
        // Extremes: the largest tag, fence and TTL, a 256-byte token, a 512-byte name.
        let token = [b'x'; MAX_TOKEN_LEN];
        let name = "n".repeat(crate::MAX_NAME_LEN);
        let raw = lua_notice(
            &u64::MAX.to_string(),
            &MAX_FENCE.to_string(),
            &u64::MAX.to_string(),
            &token,
            name.as_bytes(),
        );
        let n = parse_grant_notice(&raw).unwrap();
        assert_eq!(
            (n.tag, n.fencing_token, n.ttl_ms),
            (u64::MAX, MAX_FENCE, u64::MAX)
        );
        assert_eq!((n.token, n.name), (&token[..], name.as_str()));
        // Leading zeros are digits like any other (the scripts pass the tag through as text).
        assert_eq!(
            parse_grant_notice(&lua_notice("007", "5", "9", b"t", b"n"))
                .unwrap()
                .tag,
            7
        );
    }

    #[test]
    fn plain_wake_ups_and_malformed_notices_are_not_notices() {
        let ok = |tag: &str, fence: &str, ttl: &str, token: &[u8], name: &[u8]| {
            parse_grant_notice(&lua_notice(tag, fence, ttl, token, name)).is_some()
        };
        assert!(ok("1", "2", "3", b"tok", b"jobs"), "the baseline parses");
        // Plain wake-ups: the payload is a name.
        for plain in [
            &b"jobs"[..],
            b"grant 1 2 3 3 tokjobs",
            b"",
            b"\0",
            b"\0grant",
            b" \0grant 1 2 3 1 tn",
        ] {
            assert_eq!(parse_grant_notice(plain), None, "{plain:?}");
        }
        // Bad numbers: empty, signs, non-digits, too long, overflow, zero fence/TTL, big fence.
        for bad in [
            "",
            "-1",
            "+1",
            "1x",
            " 1",
            "0x1",
            "1.0",
            "123456789012345678901",
            "18446744073709551616",
        ] {
            assert!(!ok(bad, "2", "3", b"tok", b"jobs"), "tag {bad:?}");
            assert!(!ok("1", bad, "3", b"tok", b"jobs"), "fence {bad:?}");
            assert!(!ok("1", "2", bad, b"tok", b"jobs"), "ttl {bad:?}");
        }
        assert!(!ok("1", "0", "3", b"tok", b"jobs"), "fence 0");
        assert!(!ok("1", &(MAX_FENCE + 1).to_string(), "3", b"tok", b"jobs"));
        assert!(!ok("1", "2", "0", b"tok", b"jobs"), "ttl 0");
        // Tokens: empty, too long.
        assert!(!ok("1", "2", "3", b"", b"jobs"));
        assert!(!ok("1", "2", "3", &[b'x'; MAX_TOKEN_LEN + 1], b"jobs"));
        // Names: empty, invalid UTF-8, NUL, too long.
        assert!(!ok("1", "2", "3", b"tok", b""));
        assert!(!ok("1", "2", "3", b"tok", b"\xff\xfe"));
        assert!(!ok("1", "2", "3", b"tok", b"a\0b"));
        assert!(!ok(
            "1",
            "2",
            "3",
            b"tok",
            "n".repeat(crate::MAX_NAME_LEN + 1).as_bytes()
        ));
        // A token length past the end of the payload, or one that eats the whole name.
        for raw in [
            &b"\0grant 1 2 3 9 tokjobs"[..],
            b"\0grant 1 2 3 7 tokjobs",
            b"\0grant 1 2 3 99999999999999999999 tokjobs",
            b"\0grant 1 2 3 3",
            b"\0grant 1 2 3 ",
            b"\0grant 1 2 3",
            b"\0grant 1 2",
            b"\0grant  1 2 3 3 tokjobs",
            b"\0grant 1  2 3 3 tokjobs",
            b"\0GRANT 1 2 3 3 tokjobs",
            b"\0grant\t1 2 3 3 tokjobs",
        ] {
            assert_eq!(parse_grant_notice(raw), None, "{raw:?}");
        }
        assert!(parse_grant_notice(b"\0grant 1 2 3 3 tokjobs").is_some());
        // The token is length-prefixed, so a space after the length belongs to the token.
        let n = parse_grant_notice(b"\0grant 1 2 3 3  tokjobs").unwrap();
        assert_eq!((n.token, n.name), (&b" to"[..], "kjobs"));
        // Every truncation of a valid notice is rejected or still names a non-empty prefix.
        let full = lua_notice("12", "345", "678", b"a token", b"name");
        for cut in 0..full.len() {
            if let Some(n) = parse_grant_notice(&full[..cut]) {
                assert!(n.name.len() < 4 && n.token == b"a token", "{n:?}");
            }
        }
    }
}
