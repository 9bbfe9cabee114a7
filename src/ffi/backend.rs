//! A client and its backend: `lh_backend_options` names the backend and carries its options,
//! `lh_client_new` creates the core with that one protocol attached. One struct for every
//! backend (fields that do not apply to `kind` are ignored), so a host has one constructor.
#![allow(non_camel_case_types)]

use super::boundary::{
    Diag, Failure, guard_static, optional_bytes_arg, read_sized, require_out, write_out,
};
use super::client::{ClientState, config_from_c, lh_client, seed_arg};
use super::types::*;
use crate::Client;
use crate::backend::Protocol;
use crate::backend::etcd::{EtcdProtocol, MAX_CREDENTIAL_LEN};
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
}

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
    }
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
        if !(LH_BACKEND_MEMORY..=LH_BACKEND_ETCD).contains(&kind) {
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

/// # Safety
/// The etcd strings of `o` are readable for their lengths.
unsafe fn protocol(o: &lh_backend_options, seed: &[u8]) -> Result<Protocol, Failure> {
    Ok(match o.kind {
        LH_BACKEND_MEMORY => Protocol::Memory(Box::default()),
        LH_BACKEND_REDIS => {
            let opts = RedisOptions {
                standby_delay_ms: o.redis_standby_delay_ms,
                key_keep_ms: o.redis_key_keep_ms,
                queue_max_age_ms: o.redis_queue_max_age_ms,
                idle_recheck_ms: o.redis_idle_recheck_ms,
                sharded_wake: flag(o.redis_sharded_wake, "redis_sharded_wake")?,
            };
            Protocol::Redis(Box::new(RedisProtocol::new(opts, wake_random(seed)?)?))
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
/// `LH_ERR_STRUCT_SIZE`; an unknown backend kind → `LH_ERR_INVALID_ENUM`; bad values →
/// `LH_ERR_INVALID_CONFIG` (credentials that are not UTF-8: `LH_ERR_INVALID_UTF8`); short
/// seed → `LH_ERR_SEED_TOO_SHORT`. There is no handle yet, so no detail message.
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
        let cfg = unsafe { read_sized(cfg, "cfg")? };
        // SAFETY: per the caller's contract.
        let o = unsafe { read_sized(backend, "backend")? };
        // SAFETY: per the caller's contract.
        let seed = unsafe { seed_arg(seed, seed_len)? };
        let mut config = config_from_c(&cfg)?;
        if o.kind == LH_BACKEND_SQLITE {
            config.notifications = false;
        }
        // SAFETY: per the caller's contract.
        let proto = unsafe { protocol(&o, seed)? };
        let core = Client::new(config, seed)?;
        let handle = Box::new(lh_client {
            state: ClientState::new(core, proto),
            diag: Diag::new(),
        });
        // SAFETY: checked non-NULL above; valid per the caller's contract.
        unsafe { write_out(out, Box::into_raw(handle)) };
        Ok(())
    })
}
