// leasehold/types.hpp — the clock, the lease states and reasons, and LeaseInfo: the values the core
// reports, typed.
#pragma once

#include <leasehold.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

namespace leasehold {

using Clock = std::chrono::steady_clock;

// Monotonic nanoseconds: the `now` every core input takes.
inline std::uint64_t now_ns() noexcept {
  auto d = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch());
  return d.count() < 0 ? 0 : static_cast<std::uint64_t>(d.count());
}

inline Clock::time_point to_time_point(std::uint64_t ns) noexcept {
  constexpr auto max_ns = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max() / 2);
  const auto clamped = ns > max_ns ? max_ns : ns;
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(
      std::chrono::nanoseconds(static_cast<std::int64_t>(clamped))));
}

enum class AcquireFailReason : std::uint32_t {
  WaitExhausted = LH_REASON_WAIT_EXHAUSTED,
  Cancelled = LH_REASON_CANCELLED,
  Unavailable = LH_REASON_UNAVAILABLE,
};
enum class LostReason : std::uint32_t {
  Rejected = LH_REASON_REJECTED,
  Expired = LH_REASON_EXPIRED,
  FailBudget = LH_REASON_FAIL_BUDGET,
};
// What Lease::release() tells the caller; ordinary outcomes, never exceptions.
enum class ReleaseOutcome : std::uint32_t {
  Released,  // ended while still valid (the service confirmed, or could not answer before the TTL ran out)
  Lost,      // the lease was lost first (Lease::lost_reason() says why); the loss signals fired
  NotOwner,  // the service refused: the lock was no longer ours (someone else may hold it now)
};
// The service's answer to a release made with Core::release_reported (ReleaseOutcomeEvent).
enum class ReleaseReply : std::uint32_t {
  Confirmed = LH_REASON_RELEASE_CONFIRMED,
  NotOwner = LH_REASON_RELEASE_NOT_OWNER,
  Unconfirmed = LH_REASON_RELEASE_UNCONFIRMED,  // no answer before the grant's TTL had certainly run out
};
// Core::release_reported's immediate disposition.
enum class Releasing : std::uint32_t {
  HolderLeft = LH_RELEASING_HOLDER_LEFT,    // other reentrant holders remain; nothing was sent
  Pending = LH_RELEASING_PENDING,           // ended Released; a ReleaseOutcomeEvent follows
  Lost = LH_RELEASING_LOST,                 // validity had run out first: ended Lost (LostEvent queued)
  NotAcquired = LH_RELEASING_NOT_ACQUIRED,  // still acquiring: ended AcquireFailed
};
enum class LeaseState : std::uint32_t {
  Acquiring = LH_STATE_ACQUIRING,
  Held = LH_STATE_HELD,
  Released = LH_STATE_RELEASED,
  Lost = LH_STATE_LOST,
  AcquireFailed = LH_STATE_ACQUIRE_FAILED,
};

inline std::string_view to_string(AcquireFailReason r) noexcept {
  switch (r) {
    case AcquireFailReason::WaitExhausted: return "wait_exhausted";
    case AcquireFailReason::Cancelled: return "cancelled";
    case AcquireFailReason::Unavailable: return "unavailable";
  }
  return "unknown";
}
inline std::string_view to_string(LostReason r) noexcept {
  switch (r) {
    case LostReason::Rejected: return "rejected";
    case LostReason::Expired: return "expired";
    case LostReason::FailBudget: return "fail_budget";
  }
  return "unknown";
}
inline std::string_view to_string(ReleaseOutcome o) noexcept {
  switch (o) {
    case ReleaseOutcome::Released: return "released";
    case ReleaseOutcome::Lost: return "lost";
    case ReleaseOutcome::NotOwner: return "not_owner";
  }
  return "unknown";
}
inline std::string_view to_string(LeaseState s) noexcept {
  switch (s) {
    case LeaseState::Acquiring: return "acquiring";
    case LeaseState::Held: return "held";
    case LeaseState::Released: return "released";
    case LeaseState::Lost: return "lost";
    case LeaseState::AcquireFailed: return "acquire_failed";
  }
  return "unknown";
}

struct LeaseInfo {
  LeaseState state = LeaseState::Acquiring;
  std::uint32_t holders = 0;
  std::optional<std::uint64_t> fencing_token;  // nullopt before the first grant
  std::optional<std::uint64_t> valid_until_ns;
};

}  // namespace leasehold
