// leasehold/config.hpp — the core's configuration (Config, from lh_config) and its counters (Counters,
// from lh_counters: the engine's and the backend protocol's).
#pragma once

#include <leasehold.h>

#include <cstdint>

namespace leasehold {

struct Config {
  std::uint32_t drift_ppm = 0;
  std::uint64_t drift_fixed_ns = 0;
  std::uint32_t renew_jitter_ppm = 0;
  // Renewal failure budget: 0 (the default) = by time, transport failures are retried with
  // backoff while validity remains and the lease is lost just before valid_until; N > 0 = lost
  // after N consecutive failed renewals.
  std::uint32_t fail_budget = 0;
  std::uint64_t request_timeout_ns = 0;
  std::uint64_t backoff_base_ns = 0;
  std::uint64_t backoff_cap_ns = 0;
  std::uint64_t max_ttl_ms = 0;
  std::uint32_t max_leases = 0;
  bool notifications = true;

  static Config defaults() {
    lh_config c{};
    lh_config_default(&c);
    return from_c(c);
  }
  static Config from_c(const lh_config& c) {
    Config r;
    r.drift_ppm = c.drift_ppm;
    r.drift_fixed_ns = c.drift_fixed_ns;
    r.renew_jitter_ppm = c.renew_jitter_ppm;
    r.fail_budget = c.fail_budget;
    r.request_timeout_ns = c.request_timeout_ns;
    r.backoff_base_ns = c.backoff_base_ns;
    r.backoff_cap_ns = c.backoff_cap_ns;
    r.max_ttl_ms = c.max_ttl_ms;
    r.max_leases = c.max_leases;
    r.notifications = c.notifications != 0;
    return r;
  }
  [[nodiscard]] lh_config to_c() const {
    lh_config c{};
    lh_config_default(&c);  // sets struct_size and any field this header does not know yet
    c.drift_ppm = drift_ppm;
    c.drift_fixed_ns = drift_fixed_ns;
    c.renew_jitter_ppm = renew_jitter_ppm;
    c.fail_budget = fail_budget;
    c.request_timeout_ns = request_timeout_ns;
    c.backoff_base_ns = backoff_base_ns;
    c.backoff_cap_ns = backoff_cap_ns;
    c.max_ttl_ms = max_ttl_ms;
    c.max_leases = max_leases;
    c.notifications = notifications ? 1u : 0u;
    return c;
  }
};

struct Counters {
  std::uint64_t live_leases = 0, pending_cleanups = 0, acquires_sent = 0, grants = 0,
                acquire_failed = 0, renewals_sent = 0, renewals_ok = 0, renewals_failed = 0,
                releases_sent = 0, lost_rejected = 0, lost_expired = 0, lost_fail_budget = 0,
                stale_results = 0, time_clamped = 0;
  // Manual renewals (Lease::renew) and the outcomes of releases that reached the service.
  std::uint64_t renewals_requested = 0, releases_confirmed = 0, releases_not_owner = 0,
                releases_unconfirmed = 0, releases_lost = 0;
  // The backend protocol, every backend: requests emitted, error / garbage / stale answers,
  // transport failures, notifications that woke a name and those ignored.
  std::uint64_t backend_requests = 0, backend_error_replies = 0, backend_garbage_replies = 0,
                backend_stale_replies = 0, backend_transport_failures = 0, backend_wakeups = 0,
                backend_ignored_messages = 0;
  // Redis (redis_subscribed is a gauge: 1 while the subscription is in effect).
  std::uint64_t redis_script_calls = 0, redis_noscript_retries = 0, redis_local_refusals = 0,
                redis_standby_takeovers = 0, redis_subscriptions = 0, redis_subscriber_losses = 0,
                redis_subscribed = 0;
  // SQL and etcd.
  std::uint64_t sql_migrations = 0, sql_database_errors = 0;
  std::uint64_t etcd_leases_granted = 0, etcd_txns = 0, etcd_watches = 0, etcd_waiting_keepalives = 0,
                etcd_waiters_expired = 0;
  // Redis stream kind (LH_BACKEND_REDIS_STREAM): connections asked for, connections ended,
  // reports about ended ones (ignored), master lookups sent to a sentinel; with a
  // redis+cluster:// URL, slot map questions and MOVED / ASK redirections followed.
  std::uint64_t stream_opens = 0, stream_closes = 0, stream_late_answers = 0, sentinel_lookups = 0;
  std::uint64_t cluster_refreshes = 0, cluster_redirects = 0;

  static Counters from_c(const lh_counters& c) {
    Counters r;
    r.live_leases = c.live_leases, r.pending_cleanups = c.pending_cleanups, r.acquires_sent = c.acquires_sent;
    r.grants = c.grants, r.acquire_failed = c.acquire_failed, r.renewals_sent = c.renewals_sent;
    r.renewals_ok = c.renewals_ok, r.renewals_failed = c.renewals_failed, r.releases_sent = c.releases_sent;
    r.lost_rejected = c.lost_rejected, r.lost_expired = c.lost_expired, r.lost_fail_budget = c.lost_fail_budget;
    r.stale_results = c.stale_results, r.time_clamped = c.time_clamped;
    r.renewals_requested = c.renewals_requested, r.releases_confirmed = c.releases_confirmed;
    r.releases_not_owner = c.releases_not_owner, r.releases_unconfirmed = c.releases_unconfirmed;
    r.releases_lost = c.releases_lost;
    r.backend_requests = c.backend_requests, r.backend_error_replies = c.backend_error_replies;
    r.backend_garbage_replies = c.backend_garbage_replies, r.backend_stale_replies = c.backend_stale_replies;
    r.backend_transport_failures = c.backend_transport_failures, r.backend_wakeups = c.backend_wakeups;
    r.backend_ignored_messages = c.backend_ignored_messages;
    r.redis_script_calls = c.redis_script_calls, r.redis_noscript_retries = c.redis_noscript_retries;
    r.redis_local_refusals = c.redis_local_refusals, r.redis_standby_takeovers = c.redis_standby_takeovers;
    r.redis_subscriptions = c.redis_subscriptions, r.redis_subscriber_losses = c.redis_subscriber_losses;
    r.redis_subscribed = c.redis_subscribed;
    r.sql_migrations = c.sql_migrations, r.sql_database_errors = c.sql_database_errors;
    r.etcd_leases_granted = c.etcd_leases_granted, r.etcd_txns = c.etcd_txns, r.etcd_watches = c.etcd_watches;
    r.etcd_waiting_keepalives = c.etcd_waiting_keepalives, r.etcd_waiters_expired = c.etcd_waiters_expired;
    r.stream_opens = c.stream_opens, r.stream_closes = c.stream_closes;
    r.stream_late_answers = c.stream_late_answers, r.sentinel_lookups = c.sentinel_lookups;
    r.cluster_refreshes = c.cluster_refreshes, r.cluster_redirects = c.cluster_redirects;
    return r;
  }
};

}  // namespace leasehold
