// leasehold/redis_protocol.hpp — RedisProtocolOptions, the core's Redis protocol options, shared
// by both Redis executors (RedisExecutor on hiredis, RedisStreamExecutor on sockets); no
// dependency beyond the core.
#pragma once

#include <leasehold.hpp>

#include <cstdint>

namespace leasehold {

// The core's Redis protocol options (lh_backend_options' redis_* fields), the library's
// defaults until changed (docs/redis-protocol.md).
struct RedisProtocolOptions {
  // How long a waiter told to stand by waits for "taken" before it tries: the longest a frozen
  // waiter at the head of the queue keeps the lock free.
  std::uint64_t standby_delay_ms = 0;
  std::uint64_t key_keep_ms = 0;       // how long the fence and queue keys outlive their lease
  std::uint64_t queue_max_age_ms = 0;  // queue entries older than this are dropped at a release
  std::uint64_t idle_recheck_ms = 0;   // a queued waiter behind the head asks again after this
  bool sharded_wake = false;           // Redis Cluster: one shard channel per name (SPUBLISH)

  RedisProtocolOptions() {
    const auto d = backend_defaults(LH_BACKEND_REDIS);
    standby_delay_ms = d.redis_standby_delay_ms;
    key_keep_ms = d.redis_key_keep_ms;
    queue_max_age_ms = d.redis_queue_max_age_ms;
    idle_recheck_ms = d.redis_idle_recheck_ms;
    sharded_wake = d.redis_sharded_wake != 0;
  }
  // Into the options the core is made with.
  void apply(lh_backend_options& o) const {
    o.redis_standby_delay_ms = standby_delay_ms;
    o.redis_key_keep_ms = key_keep_ms;
    o.redis_queue_max_age_ms = queue_max_age_ms;
    o.redis_idle_recheck_ms = idle_recheck_ms;
    o.redis_sharded_wake = sharded_wake ? 1u : 0u;
  }
};

}  // namespace leasehold
