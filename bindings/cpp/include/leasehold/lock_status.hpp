// leasehold/lock_status.hpp — what a backend says about one lock name (LockClient::status).
#pragma once

#include <cstdint>
#include <string>

namespace leasehold {

// What the backend said about one name (lh_poll_status); advisory.
struct LockStatus {
  std::uint64_t id = 0;
  bool ok = false;
  bool held = false;
  std::uint64_t fencing_token = 0, remaining_ttl_ms = 0, last_fencing_token = 0, held_for_ms = 0;
  std::int64_t holder_pid = 0;
  std::string holder_host, error;
};
using SqlStatus = LockStatus;  // the same type under its SQL name

}  // namespace leasehold
