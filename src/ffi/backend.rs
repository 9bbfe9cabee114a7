//! A client and its backend: `lh_backend_options` names the backend and carries its options,
//! `lh_client_new` creates the core with that one protocol attached. One struct for every
//! backend (fields that do not apply to `kind` are ignored), so a host has one constructor.
#![allow(non_camel_case_types)]

use std::ffi::c_char;

use super::boundary::{
    Diag, Failure, bytes_arg, guard_static, optional_bytes_arg, read_sized, require_out, write_out,
};
use super::client::{ClientState, config_from_c, lh_client, seed_arg};
use super::types::*;
use crate::Client;
use crate::backend::Protocol;
use crate::backend::etcd::{EtcdProtocol, MAX_CREDENTIAL_LEN};
use crate::backend::redis::stream::{RedisStream, StreamSettings};
use crate::backend::redis::wire::Protocol as Resp;
use crate::backend::redis::{self, RedisOptions, RedisProtocol};
use crate::backend::sql::{Dialect, SqlOptions, SqlProtocol};

/// `lh_backend_options.kind`: the in-process memory service (`lh_memory_service_*`).
pub const LH_BACKEND_MEMORY: u32 = 1;
/// `lh_backend_options.kind`: Redis (single server, Sentinel, Cluster).
pub const LH_BACKEND_REDIS: u32 = 2;
/// `lh_backend_options.kind`: SQLite (one file shared by the processes of one host).
pub const LH_BACKEND_SQLITE: u32 = 3;
/// `lh_backend_options.kind`: PostgreSQL.
pub const LH_BACKEND_POSTGRES: u32 = 4;
/// `lh_backend_options.kind`: etcd v3 through its JSON gateway.
pub const LH_BACKEND_ETCD: u32 = 5;
/// `lh_backend_options.kind`: Redis with the connections in the core (the *stream* kind of
/// the seam): the client asks for `LH_IO_OPEN` / `LH_IO_WRITE` / `LH_IO_SHUTDOWN` to the
/// endpoint of `redis_url` (for a Sentinel URL: the sentinels, then the master they name)
/// and speaks RESP itself; the host only moves bytes. The `redis_*` tunables apply as for
/// `LH_BACKEND_REDIS`.
pub const LH_BACKEND_REDIS_STREAM: u32 = 6;

/// `lh_backend_options.redis_protocol`: `AUTH` + `SELECT` + `CLIENT SETNAME` only (servers
/// before Redis 6).
pub const LH_REDIS_PROTOCOL_LEGACY: u32 = 1;
/// `lh_backend_options.redis_protocol`: `HELLO 2`, falling back to the legacy handshake.
pub const LH_REDIS_PROTOCOL_RESP2: u32 = 2;
/// `lh_backend_options.redis_protocol`: `HELLO 3`, falling back to `HELLO 2`, then to the
/// legacy handshake (the default).
pub const LH_REDIS_PROTOCOL_RESP3: u32 = 3;

/// The backend of a client and its options. Fill with `lh_backend_options_default`, then
/// change fields; fields of other backends are ignored.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lh_backend_options {
    /// `sizeof(lh_backend_options)` as compiled by the caller.
    pub struct_size: u32,
    /// `LH_BACKEND_*`.
    pub kind: u32,
    /// Redis: how long a waiter told to stand by waits for "taken" before it tries (default
    /// 150 ms): the longest a frozen waiter at the head of the queue keeps the lock free.
    pub redis_standby_delay_ms: u64,
    /// Redis: how long the fence and queue keys outlive the lease they serve (default 60000).
    pub redis_key_keep_ms: u64,
    /// Redis: queue entries older than this are dropped at a release (default 600000).
    pub redis_queue_max_age_ms: u64,
    /// Redis: how long a queued waiter behind the head waits before it asks again on its own
    /// (default 10000): an idle waiter's cost is one script call per this interval.
    pub redis_idle_recheck_ms: u64,
    /// Redis Cluster, 0 or 1 (default 0): wake-ups go on one shard channel per name,
    /// `lh:{NAME}:wake`, with SPUBLISH (Redis 7+), and the client asks for `SSUBSCRIBE` /
    /// `SUNSUBSCRIBE` of a name's channel while it has leases waiting on it.
    pub redis_sharded_wake: u32,
    /// PostgreSQL, 0 or 1 (default 0): acquire, renew and release commit without waiting for
    /// the WAL flush. Much faster on a server that flushes; a server crash may forget the
    /// last moments' grants and releases (docs/backends.md).
    pub postgres_asynchronous_commit: u32,
    /// SQLite: `PRAGMA busy_timeout` (default 5000): a file that stays locked is a database
    /// error after this long, never a hang.
    pub sqlite_busy_timeout_ms: u64,
    /// etcd: user name (UTF-8, at most 256 bytes, not NUL-terminated), NULL for none. With a
    /// user the client authenticates first and every request carries the token.
    pub etcd_user: *const u8,
    /// Length of `etcd_user`.
    pub etcd_user_len: usize,
    /// etcd: password (UTF-8, at most 256 bytes), NULL when empty.
    pub etcd_password: *const u8,
    /// Length of `etcd_password`.
    pub etcd_password_len: usize,
    /// Redis stream: `redis://[user:pass@]host[:port][/db]`, `rediss://…` (TLS, the server
    /// name is the host), `unix:///path[?db=N]` or
    /// `redis+sentinel://[[user]:pass@]host:port[,host:port…]/MASTER[/db]` (the master the
    /// sentinels name, followed across failovers; the credentials and database are the
    /// Redis servers', the sentinels take none) (UTF-8, at most 4096 bytes, not
    /// NUL-terminated; percent-escapes in the user, password and master name), or
    /// `redis+cluster://[[user]:pass@]host:port[,host:port…]` / `rediss+cluster://…` (seed
    /// nodes of a Redis Cluster: requests go to the master serving their slot, wake-ups are
    /// sharded whatever `redis_sharded_wake` says). The fields from here on are new: a
    /// host built against the header before them passes that smaller `struct_size` and gets
    /// their defaults (it cannot ask for `LH_BACKEND_REDIS_STREAM`).
    pub redis_url: *const u8,
    /// Length of `redis_url`.
    pub redis_url_len: usize,
    /// Redis stream: `CLIENT SETNAME` of both connections (printable ASCII, no spaces, at
    /// most 256 bytes), NULL for none.
    pub redis_client_name: *const u8,
    /// Length of `redis_client_name`.
    pub redis_client_name_len: usize,
    /// Redis stream: `LH_REDIS_PROTOCOL_*` the handshake asks for first (default RESP3).
    pub redis_protocol: u32,
    /// Redis stream: how long an `LH_IO_OPEN` may take (default 5000 ms).
    pub redis_connect_timeout_ms: u32,
    /// Redis stream: how long a command waits for its reply before the connection is
    /// dropped and reopened (default 5000 ms).
    pub redis_request_timeout_ms: u64,
}

/// The size of `lh_backend_options` before the stream fields: the smallest a caller may pass.
const BACKEND_OPTIONS_V1_SIZE: usize = std::mem::offset_of!(lh_backend_options, redis_url);

fn defaults(kind: u32) -> lh_backend_options {
    let r = RedisOptions::default();
    lh_backend_options {
        struct_size: size_of::<lh_backend_options>() as u32,
        kind,
        redis_standby_delay_ms: r.standby_delay_ms,
        redis_key_keep_ms: r.key_keep_ms,
        redis_queue_max_age_ms: r.queue_max_age_ms,
        redis_idle_recheck_ms: r.idle_recheck_ms,
        redis_sharded_wake: u32::from(r.sharded_wake),
        postgres_asynchronous_commit: 0,
        sqlite_busy_timeout_ms: SqlOptions::default().busy_timeout_ms,
        etcd_user: std::ptr::null(),
        etcd_user_len: 0,
        etcd_password: std::ptr::null(),
        etcd_password_len: 0,
        redis_url: std::ptr::null(),
        redis_url_len: 0,
        redis_client_name: std::ptr::null(),
        redis_client_name_len: 0,
        redis_protocol: LH_REDIS_PROTOCOL_RESP3,
        redis_connect_timeout_ms: 5_000,
        redis_request_timeout_ms: 5_000,
    }
}

/// Reads a caller's `lh_backend_options`: a struct from the header before the stream fields
/// (exactly the fields before `redis_url`) gets the defaults of the newer fields; any other
/// size below this library's is refused.
///
/// # Safety
/// `ptr` is NULL or points to a readable struct of its `struct_size` bytes.
unsafe fn read_backend(ptr: *const lh_backend_options) -> Result<lh_backend_options, Failure> {
    if ptr.is_null() {
        return Err(Failure::null("backend"));
    }
    // SAFETY: every sized struct of this ABI starts with `uint32_t struct_size`.
    let size = unsafe { ptr.cast::<u32>().read() } as usize;
    if size != BACKEND_OPTIONS_V1_SIZE && size < size_of::<lh_backend_options>() {
        return Err(Failure::struct_size(
            "backend",
            size as u32,
            size_of::<lh_backend_options>(),
        ));
    }
    let mut o = defaults(0);
    let n = size.min(size_of::<lh_backend_options>());
    // SAFETY: the caller claims `size` readable bytes; `o` has room for `n` of them.
    unsafe {
        std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), (&raw mut o).cast::<u8>(), n);
    }
    if o.kind == LH_BACKEND_REDIS_STREAM && n < size_of::<lh_backend_options>() {
        return Err(Failure::struct_size(
            "backend",
            size as u32,
            size_of::<lh_backend_options>(),
        ));
    }
    Ok(o)
}

/// Fills `*out` with the defaults of backend `kind` (and `struct_size`). An unknown kind is
/// `LH_ERR_INVALID_ENUM`; NULL `out` is `LH_ERR_NULL_ARGUMENT`.
///
/// # Safety
/// `out` is NULL or valid for writing one `lh_backend_options`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_backend_options_default(
    kind: u32,
    out: *mut lh_backend_options,
) -> lh_status {
    guard_static(|| {
        require_out(out, "out")?;
        if !(LH_BACKEND_MEMORY..=LH_BACKEND_REDIS_STREAM).contains(&kind) {
            return Err(Failure::invalid_enum("backend kind", kind));
        }
        // SAFETY: non-NULL; valid per the caller's contract.
        unsafe { write_out(out, defaults(kind)) };
        Ok(())
    })
}

/// Domain separation: the wake channel is public (PUBSUB CHANNELS), ownership tokens are
/// secret, so the channel never comes from the core's token stream.
pub(crate) fn wake_random(seed: &[u8]) -> Result<[u8; redis::scripts::WAKE_RANDOM_LEN], Failure> {
    let mut tagged = seed.to_vec();
    tagged.extend_from_slice(b"leasehold redis wake channel");
    let mut rng = crate::engine::rng::Rng::new(&tagged)?;
    Ok(*rng.token().as_bytes())
}

fn flag(v: u32, what: &'static str) -> Result<bool, Failure> {
    match v {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(Failure::new(
            LH_ERR_INVALID_CONFIG,
            format!("{what} must be 0 or 1, not {v}"),
        )),
    }
}

/// The URL and connection settings of a Redis stream client.
///
/// # Safety
/// The URL and client name of `o` are readable for their lengths.
unsafe fn stream_settings(o: &lh_backend_options) -> Result<(&str, StreamSettings), Failure> {
    // SAFETY: per the caller's contract.
    let url = unsafe {
        bytes_arg(
            o.redis_url,
            o.redis_url_len,
            4096,
            "redis_url",
            LH_ERR_INVALID_CONFIG,
        )?
    };
    let url = std::str::from_utf8(url)
        .map_err(|_| Failure::new(LH_ERR_INVALID_UTF8, "redis_url is not UTF-8"))?;
    // SAFETY: per the caller's contract.
    let name = unsafe {
        optional_bytes_arg(
            o.redis_client_name,
            o.redis_client_name_len,
            256,
            "redis_client_name",
            LH_ERR_INVALID_CONFIG,
        )?
    };
    let protocol = match o.redis_protocol {
        LH_REDIS_PROTOCOL_LEGACY => Resp::Legacy,
        LH_REDIS_PROTOCOL_RESP2 => Resp::Resp2,
        LH_REDIS_PROTOCOL_RESP3 => Resp::Resp3,
        other => return Err(Failure::invalid_enum("redis_protocol", other)),
    };
    if o.redis_connect_timeout_ms == 0 || o.redis_request_timeout_ms == 0 {
        return Err(Failure::new(
            LH_ERR_INVALID_CONFIG,
            "redis_connect_timeout_ms and redis_request_timeout_ms must be positive",
        ));
    }
    let settings = StreamSettings {
        client_name: (!name.is_empty()).then(|| name.to_vec()),
        protocol,
        connect_timeout_ns: u64::from(o.redis_connect_timeout_ms) * 1_000_000,
        request_timeout_ns: o.redis_request_timeout_ms.saturating_mul(1_000_000),
    };
    Ok((url, settings))
}

/// # Safety
/// The strings of `o` are readable for their lengths.
unsafe fn protocol(o: &lh_backend_options, seed: &[u8]) -> Result<Protocol, Failure> {
    Ok(match o.kind {
        LH_BACKEND_MEMORY => Protocol::Memory(Box::default()),
        LH_BACKEND_REDIS | LH_BACKEND_REDIS_STREAM => {
            let stream = if o.kind == LH_BACKEND_REDIS_STREAM {
                // SAFETY: per the caller's contract.
                Some(unsafe { stream_settings(o)? })
            } else {
                None
            };
            // A cluster on the stream path always wakes through shard channels.
            let cluster = stream
                .as_ref()
                .is_some_and(|(url, _)| redis::url::is_cluster_url(url));
            let opts = RedisOptions {
                standby_delay_ms: o.redis_standby_delay_ms,
                key_keep_ms: o.redis_key_keep_ms,
                queue_max_age_ms: o.redis_queue_max_age_ms,
                idle_recheck_ms: o.redis_idle_recheck_ms,
                sharded_wake: flag(o.redis_sharded_wake, "redis_sharded_wake")? || cluster,
            };
            let proto = RedisProtocol::new(opts, wake_random(seed)?)?;
            match stream {
                None => Protocol::Redis(Box::new(proto)),
                Some((url, settings)) => {
                    Protocol::RedisStream(Box::new(RedisStream::new(proto, url, settings)?))
                }
            }
        }
        LH_BACKEND_SQLITE | LH_BACKEND_POSTGRES => {
            let dialect = if o.kind == LH_BACKEND_SQLITE {
                Dialect::Sqlite
            } else {
                Dialect::Postgres
            };
            let opts = SqlOptions {
                busy_timeout_ms: o.sqlite_busy_timeout_ms,
                asynchronous_commit: flag(
                    o.postgres_asynchronous_commit,
                    "postgres_asynchronous_commit",
                )?,
            };
            Protocol::Sql(Box::new(SqlProtocol::new(dialect, opts)?))
        }
        LH_BACKEND_ETCD => {
            let text = |p: *const u8, len: usize, what: &'static str| {
                // SAFETY: per the caller's contract.
                let b = unsafe {
                    optional_bytes_arg(p, len, MAX_CREDENTIAL_LEN, what, LH_ERR_INVALID_CONFIG)
                }?;
                std::str::from_utf8(b)
                    .map_err(|_| Failure::new(LH_ERR_INVALID_UTF8, format!("{what} is not UTF-8")))
            };
            let user = text(o.etcd_user, o.etcd_user_len, "etcd_user")?;
            let password = text(o.etcd_password, o.etcd_password_len, "etcd_password")?;
            Protocol::Etcd(Box::new(if user.is_empty() {
                EtcdProtocol::new()
            } else {
                EtcdProtocol::with_auth(user, password)?
            }))
        }
        other => return Err(Failure::invalid_enum("backend kind", other)),
    })
}

/// Builds the handle `lh_client_new` hands out, or says why not: one path for creation and
/// for `lh_client_new_check`, so the two never disagree.
///
/// # Safety
/// As for `lh_client_new` (without `out`).
unsafe fn build_client(
    cfg: *const lh_config,
    backend: *const lh_backend_options,
    seed: *const u8,
    seed_len: usize,
) -> Result<Box<lh_client>, Failure> {
    // SAFETY: per the caller's contract.
    let cfg = unsafe { read_sized(cfg, "cfg")? };
    // SAFETY: per the caller's contract.
    let o = unsafe { read_backend(backend)? };
    // SAFETY: per the caller's contract.
    let seed = unsafe { seed_arg(seed, seed_len)? };
    let mut config = config_from_c(&cfg)?;
    if o.kind == LH_BACKEND_SQLITE {
        config.notifications = false;
    }
    // SAFETY: per the caller's contract.
    let proto = unsafe { protocol(&o, seed)? };
    let core = Client::new(config, seed)?;
    Ok(Box::new(lh_client {
        state: ClientState::new(core, proto),
        diag: Diag::new(),
    }))
}

/// Creates a client with its backend's protocol attached (see the header's run loop). The
/// seed (at least `LH_MIN_SEED_LEN`, at most `LH_MAX_SEED_LEN` bytes; hosts pass 32 bytes of
/// OS entropy, tests a fixed seed) drives tokens and jitter; it is copied, not retained. On
/// success `*out` receives a handle to free with `lh_client_free`.
///
/// SQLite delivers no release notifications, so for it `cfg->notifications` is taken as 0
/// (waiters retry at the holder's expiry or by backoff). The first requests are the backend's
/// set-up (Redis: the SUBSCRIBE of the client's wake channel; SQL: the schema check).
///
/// Errors: NULL `cfg`/`backend`/`seed`/`out` → `LH_ERR_NULL_ARGUMENT`; small `struct_size` →
/// `LH_ERR_STRUCT_SIZE` (for `backend`, the size before the stream fields is accepted for the
/// other kinds); a bad `redis_url` → `LH_ERR_INVALID_CONFIG`; an unknown backend kind → `LH_ERR_INVALID_ENUM`; bad values →
/// `LH_ERR_INVALID_CONFIG` (credentials that are not UTF-8: `LH_ERR_INVALID_UTF8`); short
/// seed → `LH_ERR_SEED_TOO_SHORT`. There is no handle yet to hold a detail message:
/// `lh_client_new_check` on the same arguments says why.
///
/// # Safety
/// `cfg` and `backend` point to readable structs of their `struct_size` bytes (the etcd
/// strings readable for their lengths); `seed` to `seed_len` readable bytes; `out` is valid
/// for writing one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_client_new(
    cfg: *const lh_config,
    backend: *const lh_backend_options,
    seed: *const u8,
    seed_len: usize,
    out: *mut *mut lh_client,
) -> lh_status {
    guard_static(|| {
        require_out(out, "out")?;
        // SAFETY: per the caller's contract.
        let handle = unsafe { build_client(cfg, backend, seed, seed_len)? };
        // SAFETY: checked non-NULL above; valid per the caller's contract.
        unsafe { write_out(out, Box::into_raw(handle)) };
        Ok(())
    })
}

/// Why `lh_client_new` refuses these arguments: runs its checks on `cfg`, `backend` and the
/// seed (creating nothing it keeps) and returns the status `lh_client_new` returns for them,
/// `LH_OK` when it would create a client.
///
/// The reason ("" for `LH_OK`), UTF-8, is copied into `buf` like `snprintf` does: at most
/// `buf_len - 1` bytes (cut at a character boundary) and a NUL; nothing when `buf` is NULL
/// or `buf_len` is 0. `*out_len`, when `out_len` is not NULL, receives the reason's whole
/// length without the NUL, so a reason was cut short when `*out_len >= buf_len`. Unlike
/// other out-parameters these are written whatever the status: the status is the verdict.
///
/// # Safety
/// As for `lh_client_new` (without `out`); `buf` is NULL or valid for writing `buf_len`
/// bytes; `out_len` is NULL or valid for writing a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_client_new_check(
    cfg: *const lh_config,
    backend: *const lh_backend_options,
    seed: *const u8,
    seed_len: usize,
    buf: *mut c_char,
    buf_len: usize,
    out_len: *mut usize,
) -> lh_status {
    let mut status = LH_ERR_PANIC;
    let _ = guard_static(|| {
        // SAFETY: per the caller's contract.
        let verdict = unsafe { build_client(cfg, backend, seed, seed_len) };
        let reason: std::borrow::Cow<'static, str> = match verdict {
            Ok(_) => {
                status = LH_OK;
                "".into()
            }
            Err(f) => {
                status = f.status;
                f.detail
            }
        };
        // SAFETY: per the caller's contract.
        unsafe { copy_reason(&reason, buf, buf_len, out_len) };
        Ok(())
    });
    status
}

/// Copies `text` into `buf` the way `snprintf` does (cut at a character boundary, NUL
/// ended) and its whole length into `*out_len`.
///
/// # Safety
/// `buf` is NULL or valid for writing `buf_len` bytes; `out_len` is NULL or valid for
/// writing a `usize`.
unsafe fn copy_reason(text: &str, buf: *mut c_char, buf_len: usize, out_len: *mut usize) {
    // The text crosses as a C string: a NUL inside would end it early.
    let text = text.replace('\0', "\\0");
    if !buf.is_null() && buf_len > 0 {
        let mut n = text.len().min(buf_len - 1);
        while !text.is_char_boundary(n) {
            n -= 1;
        }
        // SAFETY: `buf` has room for `buf_len > n` bytes (caller's contract); no overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            buf.add(n).write(0);
        }
    }
    if !out_len.is_null() {
        // SAFETY: valid for writing per the caller's contract.
        unsafe { write_out(out_len, text.len()) };
    }
}

#[cfg(test)]
mod tests {
    use super::copy_reason;

    fn copied(text: &str, buf_len: usize) -> (Vec<u8>, usize) {
        let mut buf = vec![0xFFu8; buf_len + 1];
        let mut len = usize::MAX;
        // SAFETY: `buf` holds `buf_len` bytes and a guard byte.
        unsafe { copy_reason(text, buf.as_mut_ptr().cast(), buf_len, &mut len) };
        assert_eq!(buf[buf_len], 0xFF, "written past buf_len");
        (buf, len)
    }

    #[test]
    fn a_reason_is_cut_at_a_character_boundary() {
        // "é" is two bytes: a cut inside it drops the whole character.
        let (buf, len) = copied("abé", 4);
        assert_eq!((&buf[..3], len), (&b"ab\0"[..], 4));
        let (buf, _) = copied("abé", 5);
        assert_eq!(&buf[..5], "abé\0".as_bytes());
        let (buf, len) = copied("a\0b", 8);
        assert_eq!((&buf[..5], len), (&b"a\\0b\0"[..], 4));
    }
}
