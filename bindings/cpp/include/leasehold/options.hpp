// leasehold/options.hpp — ClientOptions (a LockClient's threads, timeouts and log) and
// AcquireOptions (one acquire's wait, reentrancy, renewal and loss callback).
#pragma once

#include <leasehold/config.hpp>
#include <leasehold/types.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string_view>

namespace leasehold {

using LogFn = std::function<void(std::string_view message)>;

struct ClientOptions {
  Config config = Config::defaults();
  std::size_t io_threads = 4;  // unused: each executor owns its threads (kept for source compatibility)
  // close() keeps driving releases for at most this long, then abandons them (the TTL frees them).
  std::chrono::milliseconds close_timeout{5000};
  // How long Lease::release() waits for the service's answer; nullopt = the request timeout.
  // Past it the release reports Released and the core keeps retrying in the background.
  std::optional<std::chrono::milliseconds> release_timeout;
  // Transport errors and callback exceptions; default: stderr.
  LogFn log;
};

struct AcquireOptions {
  std::chrono::nanoseconds wait{0};  // acquisition budget; 0 = one attempt
  bool reentrant = false;            // in-process reentrancy on this LockClient
  // false: no automatic renewals; only Lease::renew() extends the lease, which is lost when
  // its validity ends (on_lost and stop_token still fire).
  bool auto_renew = true;
  // Called once, on the callback thread, when this lease is lost (not on release).
  std::function<void(LostReason)> on_lost;
};

}  // namespace leasehold
