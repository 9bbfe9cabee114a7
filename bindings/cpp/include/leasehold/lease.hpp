// leasehold/lease.hpp — leasehold::Lease, a held lock: move-only, released by its destructor, with
// its fencing token, validity, manual renewal, and loss signals (on_lost, stop_token).
#pragma once

#include <leasehold/detail/client_state.hpp>
#include <leasehold/error.hpp>
#include <leasehold/types.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>

namespace leasehold {

class Lease {
 public:
  Lease(Lease&& o) noexcept
      : st_(std::move(o.st_)), rec_(std::move(o.rec_)), holder_(o.holder_), fencing_(o.fencing_),
        outcome_(o.outcome_) {}
  Lease& operator=(Lease&& o) noexcept {
    if (this != &o) {
      release(std::chrono::nanoseconds{0});
      st_ = std::move(o.st_);
      rec_ = std::move(o.rec_);
      holder_ = o.holder_;
      fencing_ = o.fencing_;
      outcome_ = o.outcome_;
    }
    return *this;
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  // Releases without waiting for the service's answer (the core still retries it).
  ~Lease() { release(std::chrono::nanoseconds{0}); }

  // Releases this holder and says how the lease ended: Released, Lost (validity ran out first,
  // e.g. after a pause: the loss signals fire and lost_reason() says why) or NotOwner (the
  // service refused). Waits for the service's answer at most ClientOptions::release_timeout
  // (default: the request timeout); past it, Released (the core keeps retrying the release in
  // the background). Idempotent: later calls return the first outcome. Never throws.
  ReleaseOutcome release() noexcept { return release_impl(std::nullopt); }
  // The same with its own bound on the wait for the service's answer (0: do not wait).
  ReleaseOutcome release(std::chrono::nanoseconds timeout) noexcept { return release_impl(timeout); }
  // Renews now (manual renewal; joins one in flight) and returns the new end of validity.
  // Waits until the service confirms or the lease is lost (the core ends it by valid_until).
  // Throws leasehold::Error: LH_ERR_LEASE_ENDED when the lease was released or lost (before
  // the call, checked locally without a network call, or while waiting), status::closed,
  // status::timeout if the driver never answered (a starved process).
  Clock::time_point renew() {
    if (!st_) {
      throw Error(LH_ERR_LEASE_ENDED, !rec_                        ? "moved-from lease"
                                      : outcome_ == ReleaseOutcome::Lost ? "the lease was lost"
                                                                         : "the lease was released");
    }
    return to_time_point(st_->renew(rec_));
  }
  // The fencing token of the grant; carry it on every protected write.
  [[nodiscard]] std::uint64_t fencing_token() const noexcept { return fencing_; }
  // Advice only: true while this handle is unreleased and the core believes the lease valid now.
  [[nodiscard]] bool is_held() const { return st_ && st_->is_held(*rec_); }
  // End of the current validity window (moves forward with each confirmed renewal).
  [[nodiscard]] Clock::time_point valid_until() const {
    if (st_) return to_time_point(st_->valid_until(*rec_));
    return to_time_point(rec_ ? rec_->valid_until_ns.load() : 0);
  }
  // Stopped when the lease is lost (and when the LockClient closes under it).
  [[nodiscard]] std::stop_token stop_token() const noexcept {
    return rec_ ? rec_->stop.get_token() : std::stop_token();
  }
  [[nodiscard]] bool lost() const { return lost_reason().has_value(); }
  // Set once the lease is lost, and stays set after release().
  [[nodiscard]] std::optional<LostReason> lost_reason() const {
    if (!rec_) return std::nullopt;
    return detail::ClientState::lost_reason(*rec_);
  }
  [[nodiscard]] const std::string& name() const noexcept {
    static const std::string empty;
    return rec_ ? rec_->name : empty;
  }
  [[nodiscard]] std::uint64_t id() const noexcept { return rec_ ? rec_->id : 0; }
  // False after release() or a move.
  [[nodiscard]] bool owns() const noexcept { return st_ != nullptr; }

 private:
  friend class detail::ClientState;
  Lease(std::shared_ptr<detail::ClientState> st, std::shared_ptr<detail::LeaseRecord> rec,
        std::uint64_t holder, std::uint64_t fencing)
      : st_(std::move(st)), rec_(std::move(rec)), holder_(holder), fencing_(fencing) {}

  ReleaseOutcome release_impl(std::optional<std::chrono::nanoseconds> timeout) noexcept {
    if (st_) {
      outcome_ = st_->release(rec_, holder_, timeout);
      st_.reset();
    }
    return outcome_.value_or(ReleaseOutcome::Released);
  }

  std::shared_ptr<detail::ClientState> st_;
  std::shared_ptr<detail::LeaseRecord> rec_;
  std::uint64_t holder_ = 0;
  std::uint64_t fencing_ = 0;
  std::optional<ReleaseOutcome> outcome_;
};

}  // namespace leasehold

// The client calls a Lease makes (they construct Leases, so they follow it).
#include <leasehold/detail/client_calls.hpp>
