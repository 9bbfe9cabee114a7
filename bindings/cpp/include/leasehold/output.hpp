// leasehold/output.hpp — what the core reports to the application: Event (owned copies of
// lh_event: a lease acquired, failed, lost, released, renewed, or a release's outcome).
#pragma once

#include <leasehold/types.hpp>

#include <cstdint>
#include <variant>
#include <vector>

namespace leasehold {

using Bytes = std::vector<std::uint8_t>;

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

using Event = std::variant<AcquiredEvent, AcquireFailedEvent, LostEvent, ReleasedEvent, RenewedEvent,
                           ReleaseOutcomeEvent>;
// The earlier name of Event (Core::poll_output).
using Output = Event;

template <class... Fs>
struct overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
overloaded(Fs...) -> overloaded<Fs...>;

}  // namespace leasehold
