// leasehold/output.hpp — what the core asks for and reports (Output: commands and events, owned
// copies of lh_output) and the results a host feeds back (AcquireResult, RenewResult,
// ReleaseResult).
#pragma once

#include <leasehold/types.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace leasehold {

using Bytes = std::vector<std::uint8_t>;

struct AcquireCommand {
  std::uint64_t request = 0;
  std::uint64_t lease = 0;
  std::string name;
  std::string token;  // 32 lowercase hex chars
  std::uint64_t ttl_ms = 0;
};
struct RenewCommand {
  std::uint64_t request = 0;
  std::uint64_t lease = 0;
  std::string name;
  std::string token;
  std::uint64_t ttl_ms = 0;
  Bytes backend_data;
};
struct ReleaseCommand {
  std::uint64_t request = 0;
  std::uint64_t lease = 0;
  std::string name;
  std::string token;
  Bytes backend_data;
};
struct WatchCommand {
  std::string name;
};
struct UnwatchCommand {
  std::string name;
};
struct AcquiredEvent {
  std::uint64_t lease = 0;
  std::uint64_t fencing_token = 0;
  std::uint64_t valid_until_ns = 0;
};
struct AcquireFailedEvent {
  std::uint64_t lease = 0;
  AcquireFailReason reason = AcquireFailReason::WaitExhausted;
};
struct LostEvent {
  std::uint64_t lease = 0;
  LostReason reason = LostReason::Expired;
};
struct ReleasedEvent {
  std::uint64_t lease = 0;
};
// Completes a Core::renew (automatic renewals are silent).
struct RenewedEvent {
  std::uint64_t lease = 0;
  std::uint64_t valid_until_ns = 0;
};
// The service's answer to a Core::release_reported; follows that lease's ReleasedEvent.
struct ReleaseOutcomeEvent {
  std::uint64_t lease = 0;
  ReleaseReply reply = ReleaseReply::Confirmed;
};

using Output = std::variant<AcquireCommand, RenewCommand, ReleaseCommand, WatchCommand,
                            UnwatchCommand, AcquiredEvent, AcquireFailedEvent, LostEvent,
                            ReleasedEvent, RenewedEvent, ReleaseOutcomeEvent>;

template <class... Fs>
struct overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
overloaded(Fs...) -> overloaded<Fs...>;

// Results a host feeds back.
struct Granted {
  std::uint64_t fencing_token = 0;
  std::uint64_t ttl_ms = 0;
  Bytes backend_data;
};
struct HeldByOther {
  std::optional<std::uint64_t> retry_after_ms;  // remaining TTL of the holder, if known
};
struct TransportError {
  std::string message;
};
using AcquireResult = std::variant<Granted, HeldByOther, TransportError>;
enum class RenewResult : std::uint32_t {
  Renewed = LH_RENEW_RENEWED,
  Rejected = LH_RENEW_REJECTED,
  TransportError = LH_RENEW_TRANSPORT_ERROR,
};
enum class ReleaseResult : std::uint32_t {
  Released = LH_RELEASE_RELEASED,
  NotOwner = LH_RELEASE_NOT_OWNER,
  TransportError = LH_RELEASE_TRANSPORT_ERROR,
};

}  // namespace leasehold
