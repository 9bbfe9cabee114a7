// leasehold/redis_executor.hpp — the Redis executor on hiredis.
//
// The core speaks the Redis protocol itself (LH_BACKEND_REDIS: keys, scripts, arguments, the
// meaning of every reply, the wait queue, the wake channel; docs/redis-protocol.md). This
// executor only runs the core's requests verbatim and hands back what Redis said, unread:
//   commands connection   — one thread; the requests queued meanwhile go out as one pipeline,
//                           each reply flattened into lh_value + one data buffer (lh_io_reply).
//                           An application thread that waits for its own request (acquire,
//                           release) runs the pipeline itself, once a batch in flight ends:
//                           two thread hops per request cost more than the round trip; past
//                           its call's bound, the commands thread runs what is left;
//   subscriber connection — one thread polling its socket and an eventfd; SUBSCRIBE /
//                           UNSUBSCRIBE are written there, every message and confirmation goes
//                           to the core; a lost connection reports its channels unsubscribed
//                           and is reopened when the core subscribes again.
// A broken or timed-out connection fails the requests on it (lh_io_failed) and is
// reopened for the next one. One RedisExecutor per LockClient (LockClient::close() closes it).
//
// Redis Sentinel (RedisOptions::sentinels): hiredis has no Sentinel support, so every (re)connect
// asks the sentinels for the master (SENTINEL get-master-addr-by-name) and checks that the server
// there says it is one (ROLE). A failover breaks the connections to a dead master, and the new
// ones reach the promoted replica once the sentinels name it; a READONLY reply (a demoted master)
// drops the commands connection; a commands connection that reaches another master drops the
// subscriber, so the core subscribes again there. Not followed: a master demoted while still
// running, until a request fails or the sentinels close its clients (they do when they
// reconfigure it as a replica); nothing listens to the sentinels' +switch-master.
//
// RedisOptions and the opening of connections (Sentinel discovery included): redis_connect.hpp.
// The executor proper (threads, pipeline, subscriber): detail/redis_executor.hpp.
#pragma once

#include <leasehold.hpp>
#include <leasehold/detail/redis_executor.hpp>
#include <leasehold/redis_connect.hpp>  // RedisOptions, SentinelAddress; included for them too

namespace leasehold {

// Counters of a RedisExecutor. The core counts the protocol (Counters::redis_*, backend_*); here
// only the pub/sub messages received (`wakeups`). The other fields stay 0 (kept for compatibility).
struct RedisStats {
  std::uint64_t acquires = 0;
  std::uint64_t queued_acquires = 0;
  std::uint64_t wakeups = 0;
  std::uint64_t passed_on = 0;
};

class RedisExecutor final : public detail::RedisRunner {
 public:
  explicit RedisExecutor(RedisOptions options = {}) : RedisRunner(std::move(options)) {}
  ~RedisExecutor() override { close(); }

  [[nodiscard]] RedisStats stats() const { return RedisStats{0, 0, messages_received(), 0}; }
  [[nodiscard]] lh_backend_options backend_options() const override {
    auto o = backend_defaults(LH_BACKEND_REDIS);
    if (const auto& p = connector().options().protocol) p->apply(o);
    return o;
  }
  // Unblocks an in-flight command (shutdown of its socket) and joins both threads.
  void close() override { RedisRunner::close(); }
};

// The earlier name of RedisExecutor.
using RedisTransport = RedisExecutor;

}  // namespace leasehold
