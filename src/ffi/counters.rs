//! `lh_counters_get`: the engine's counters and its backend protocol's, in one struct.

use super::boundary::{check_growing_out, guard_ref, write_prefix};
use super::client::lh_client;
use super::types::*;
use crate::Counters;
use crate::backend::Protocol;

fn counters_to_c(k: &Counters, proto: &Protocol) -> lh_counters {
    let mut c = lh_counters {
        struct_size: size_of::<lh_counters>() as u32,
        _reserved: 0,
        live_leases: k.live_leases,
        pending_cleanups: k.pending_cleanups,
        acquires_sent: k.acquires_sent,
        grants: k.grants,
        acquire_failed: k.acquire_failed,
        renewals_sent: k.renewals_sent,
        renewals_ok: k.renewals_ok,
        renewals_failed: k.renewals_failed,
        releases_sent: k.releases_sent,
        lost_rejected: k.lost_rejected,
        lost_expired: k.lost_expired,
        lost_fail_budget: k.lost_fail_budget,
        stale_results: k.stale_results,
        time_clamped: k.time_clamped,
        renewals_requested: k.renewals_requested,
        releases_confirmed: k.releases_confirmed,
        releases_not_owner: k.releases_not_owner,
        releases_unconfirmed: k.releases_unconfirmed,
        releases_lost: k.releases_lost,
        backend_requests: 0,
        backend_error_replies: 0,
        backend_garbage_replies: 0,
        backend_stale_replies: 0,
        backend_transport_failures: 0,
        backend_wakeups: 0,
        backend_ignored_messages: 0,
        redis_script_calls: 0,
        redis_noscript_retries: 0,
        redis_local_refusals: 0,
        redis_standby_takeovers: 0,
        redis_subscriptions: 0,
        redis_subscriber_losses: 0,
        redis_subscribed: 0,
        sql_migrations: 0,
        sql_database_errors: 0,
        etcd_leases_granted: 0,
        etcd_txns: 0,
        etcd_watches: 0,
        etcd_waiting_keepalives: 0,
        etcd_waiters_expired: 0,
        stream_opens: 0,
        stream_closes: 0,
        stream_late_answers: 0,
        sentinel_lookups: 0,
        cluster_refreshes: 0,
        cluster_redirects: 0,
    };
    // requests, error, garbage and stale replies, transport failures, wake-ups, ignored
    let common = match proto {
        Protocol::Memory(p) => {
            let b = p.counters();
            [
                b.requests,
                b.error_replies,
                b.garbage_replies,
                b.stale_replies,
                b.transport_failures,
                b.wakeups,
                b.ignored_messages,
            ]
        }
        Protocol::Redis(p) => redis_counters(p, &mut c),
        Protocol::RedisStream(p) => {
            let s = p.counters();
            c.stream_opens = s.opens;
            c.stream_closes = s.closes;
            c.stream_late_answers = s.late_answers;
            c.sentinel_lookups = s.sentinel_lookups;
            c.cluster_refreshes = s.cluster_refreshes;
            c.cluster_redirects = s.cluster_redirects;
            redis_counters(p.protocol(), &mut c)
        }
        Protocol::Sql(p) => {
            let b = p.counters();
            c.sql_migrations = b.migrations;
            c.sql_database_errors = b.database_errors;
            [
                b.requests,
                0,
                b.garbage_results,
                b.stale_results,
                b.transport_failures,
                b.wakeups,
                b.ignored_notifications,
            ]
        }
        Protocol::Etcd(p) => {
            let b = p.counters();
            c.etcd_leases_granted = b.leases_granted;
            c.etcd_txns = b.txns;
            c.etcd_watches = b.watches;
            c.etcd_waiting_keepalives = b.waiting_keepalives;
            c.etcd_waiters_expired = b.waiters_expired;
            [
                b.requests,
                b.error_replies,
                b.garbage_replies,
                b.stale_replies,
                b.transport_failures,
                b.wakeups,
                0,
            ]
        }
    };
    [
        c.backend_requests,
        c.backend_error_replies,
        c.backend_garbage_replies,
        c.backend_stale_replies,
        c.backend_transport_failures,
        c.backend_wakeups,
        c.backend_ignored_messages,
    ] = common;
    c
}

fn redis_counters(p: &crate::backend::redis::RedisProtocol, c: &mut lh_counters) -> [u64; 7] {
    let b = p.counters();
    c.redis_script_calls = b.script_calls;
    c.redis_noscript_retries = b.noscript_retries;
    c.redis_local_refusals = b.local_refusals;
    c.redis_standby_takeovers = b.standby_takeovers;
    c.redis_subscriptions = b.subscriptions;
    c.redis_subscriber_losses = b.subscriber_losses;
    c.redis_subscribed = u64::from(p.is_subscribed());
    [
        b.requests,
        b.error_replies,
        b.garbage_replies,
        b.stale_replies,
        b.transport_failures,
        b.wakeups,
        b.ignored_messages,
    ]
}

/// Fills `*out` with the client's counters, the engine's and its backend protocol's (`out->struct_size` must be set by the caller, at
/// least `LH_COUNTERS_V1_SIZE`; the library fills the fields that fit, up to its own struct,
/// and sets `struct_size` to the bytes it wrote).
///
/// # Safety
/// `c` is NULL or a live handle; `out` is valid for reading and writing an `lh_counters`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_counters_get(c: *const lh_client, out: *mut lh_counters) -> lh_status {
    // SAFETY: per the caller's contract.
    unsafe {
        guard_ref(c, |s| {
            let len = check_growing_out(out, "out", LH_COUNTERS_V1_SIZE)?;
            write_prefix(out, counters_to_c(&s.core.counters(), &s.proto), len);
            Ok(())
        })
    }
}
