// leasehold/config.hpp — the core's configuration (Config, from lh_config) and its counters.
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
};

}  // namespace leasehold
