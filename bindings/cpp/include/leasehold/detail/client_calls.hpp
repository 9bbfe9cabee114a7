// leasehold/detail/client_calls.hpp — the application's calls on the shared state: acquire,
// release, renew and the lease queries (definitions of ClientState's members).
#pragma once

#include <leasehold/detail/client_state.hpp>
#include <leasehold/lease.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace leasehold::detail {

inline std::optional<Lease> ClientState::acquire(std::string_view name, std::chrono::milliseconds ttl,
                                                 AcquireOptions opts) {
  if (ttl.count() < 0) throw Error(LH_ERR_INVALID_TTL, "ttl must not be negative");
  const auto wait = std::chrono::nanoseconds(static_cast<std::int64_t>(to_u64_ns(opts.wait, "wait")));

  std::unique_lock lk(mu_);
  if (closing_ || !core_) throw Error(status::closed, "LockClient is closed");
  if (broken_) throw Error(LH_ERR_POISONED, "the core handle failed earlier");
  const std::uint64_t id = core_->acquire(now_ns(), name, ttl, wait, opts.reentrant, opts.auto_renew);  // throws on misuse
  auto& slot = records_[id];
  if (!slot) slot = std::make_shared<LeaseRecord>(id, std::string(name));
  std::shared_ptr<LeaseRecord> rec = slot;
  const std::uint64_t holder = ++next_holder_;
  if (opts.on_lost) rec->on_lost.emplace_back(holder, std::move(opts.on_lost));
  ++active_acquires_;
  // I3: terminal by the wait deadline + one request timeout; the IO run on this thread ends
  // then too. The extra slack of the wait only matters when the driver itself is starved; past
  // it we cancel.
  const auto budget = std::min<std::chrono::nanoseconds>(wait, std::chrono::hours(24 * 365));
  if (!hold_driver_) {
    send_from_this_thread(lk, Clock::now() + budget + request_timeout_);
  } else {
    poke_locked();
  }
  const auto bound = Clock::now() + budget + 2 * request_timeout_ + std::chrono::milliseconds(500);
  const bool settled = waiters_cv_.wait_until(lk, bound, [&] { return rec->state != LeaseState::Acquiring; });
  if (!settled && core_) {
    try {
      core_->release(now_ns(), id);  // cancel (or drop our reentrant share)
    } catch (const Error&) {
    }
    poke_locked();
  }
  --active_acquires_;
  if (closing_) waiters_cv_.notify_all();
  if (rec->state == LeaseState::Held) return Lease(shared_from_this(), rec, holder, rec->fencing_token);
  std::erase_if(rec->on_lost, [&](const auto& p) { return p.first == holder; });
  return std::nullopt;
}

inline ReleaseOutcome ClientState::release(const std::shared_ptr<LeaseRecord>& rec, std::uint64_t holder,
                                           std::optional<std::chrono::nanoseconds> timeout) noexcept {
  std::unique_lock lk(mu_);
  // This holder's on_lost stays registered until the core has decided: a lease whose validity
  // ran out before this call ends Lost and its callbacks fire, this holder's included.
  auto drop_callback = [&] { std::erase_if(rec->on_lost, [&](const auto& p) { return p.first == holder; }); };
  auto ended = [&] {
    drop_callback();
    return rec->state == LeaseState::Lost ? ReleaseOutcome::Lost : ReleaseOutcome::Released;
  };
  auto drain = [&] {
    try {
      drain_locked();
    } catch (const std::exception& e) {
      fail_all_locked(e.what());
    }
    poke_locked();
  };
  if (!core_ || broken_) return ended();
  if (rec->state != LeaseState::Held && rec->state != LeaseState::Acquiring) return ended();
  Releasing how = Releasing::HolderLeft;
  try {
    how = core_->release_reported(now_ns(), rec->id);
  } catch (const Error& e) {
    if (e.code() == LH_ERR_PANIC || e.code() == LH_ERR_POISONED) {
      fail_all_locked(e.what());
      return ended();
    }
    if (e.code() != LH_ERR_LEASE_ENDED && e.code() != LH_ERR_UNKNOWN_LEASE)
      log(std::string("release: ") + e.what());
    drain();  // an ended lease's event may still be queued
    return ended();
  } catch (...) {
    return ended();
  }
  if (how == Releasing::Pending) awaiting_reply_[rec->id] = rec;
  const auto wait = std::clamp<std::chrono::nanoseconds>(
      timeout.value_or(opts_.release_timeout ? std::chrono::nanoseconds(*opts_.release_timeout) : request_timeout_),
      {}, std::chrono::hours(24));
  const auto until = Clock::now() + wait;
  if (how == Releasing::Pending && wait.count() > 0 && !hold_driver_) {
    // This thread waits for the answer anyway: it sends the request itself, within its wait
    // (and this lease's RELEASED or LOST event is dispatched now).
    send_from_this_thread(lk, until);
  } else {
    drain();  // this lease's RELEASED or LOST event, dispatched now
  }
  if (how == Releasing::Lost || rec->state == LeaseState::Lost) return ended();
  drop_callback();
  if (how != Releasing::Pending) return ReleaseOutcome::Released;

  try {
    waiters_cv_.wait_until(lk, until, [&] { return rec->release_reply.has_value() || closing_ || broken_; });
  } catch (...) {
  }
  awaiting_reply_.erase(rec->id);
  return rec->release_reply == ReleaseReply::NotOwner ? ReleaseOutcome::NotOwner : ReleaseOutcome::Released;
}

inline std::uint64_t ClientState::renew(const std::shared_ptr<LeaseRecord>& rec) {
  std::unique_lock lk(mu_);
  auto ended = [&]() -> Error {
    if (const auto r = lost_reason(*rec))
      return Error(LH_ERR_LEASE_ENDED, "the lease was lost (" + std::string(to_string(*r)) + ")");
    return Error(LH_ERR_LEASE_ENDED, "the lease was released");
  };
  if (closing_ || !core_) throw Error(status::closed, "LockClient is closed");
  if (broken_) throw Error(LH_ERR_POISONED, "the core handle failed earlier");
  if (rec->state != LeaseState::Held) throw ended();  // terminal: nothing is sent
  const auto seen = rec->renewed;
  const auto now = now_ns();
  const auto valid = rec->valid_until_ns.load();
  try {
    core_->renew(now, rec->id);
  } catch (const Error& e) {
    if (e.code() == LH_ERR_PANIC || e.code() == LH_ERR_POISONED) {
      fail_all_locked(e.what());
      throw;
    }
    if (e.code() != LH_ERR_LEASE_ENDED) throw;
  }
  try {
    drain_locked();  // LOST now if validity had already run out
  } catch (const std::exception& e) {
    fail_all_locked(e.what());
    throw Error(LH_ERR_POISONED, e.what());
  }
  poke_locked();
  // The core answers by valid_until at the latest; the slack only matters to a starved driver.
  const auto left = std::chrono::nanoseconds(static_cast<std::int64_t>(
      std::min<std::uint64_t>(valid > now ? valid - now : 0, std::uint64_t{1} << 50)));
  const auto bound = Clock::now() + left + 2 * request_timeout_ + std::chrono::milliseconds(500);
  waiters_cv_.wait_until(lk, bound, [&] {
    return rec->renewed != seen || rec->state != LeaseState::Held || closing_ || broken_;
  });
  if (rec->renewed != seen) return rec->valid_until_ns.load();
  if (rec->state != LeaseState::Held && rec->state != LeaseState::Acquiring) throw ended();
  if (closing_) throw Error(status::closed, "LockClient closed during renew");
  if (broken_) throw Error(LH_ERR_POISONED, "the core handle failed");
  throw Error(status::timeout, "no answer to the renewal in time");
}

inline bool ClientState::is_held(const LeaseRecord& rec) const {
  std::lock_guard g(mu_);
  if (!core_ || broken_ || rec.state != LeaseState::Held) return false;
  try {
    return core_->is_held(rec.id, now_ns());
  } catch (const Error& e) {
    if (e.code() == LH_ERR_LEASE_ENDED || e.code() == LH_ERR_UNKNOWN_LEASE) return false;
    throw;
  }
}

inline std::uint64_t ClientState::valid_until(LeaseRecord& rec) const {
  std::lock_guard g(mu_);
  if (core_ && !broken_ && rec.state == LeaseState::Held) {
    try {
      if (auto v = core_->valid_until(rec.id)) rec.valid_until_ns = *v;
    } catch (const Error&) {
    }
  }
  return rec.valid_until_ns.load();
}

inline void ClientState::end_record_locked(LeaseRecord& rec, LeaseState st) {
  rec.state = st;
  records_.erase(rec.id);
  waiters_cv_.notify_all();
}

}  // namespace leasehold::detail
