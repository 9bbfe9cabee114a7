// leasehold/detail/driver.hpp — the driver: the core's requests handed to the executor, its events
// dispatched to the lease records, answers fed, the loop that waits for the core's deadline, and
// close() (definitions of ClientState's members).
#pragma once

#include <leasehold/detail/client_state.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

namespace leasehold::detail {

inline void ClientState::dispatch_locked(Event& ev) {
  auto find = [&](std::uint64_t id) -> std::shared_ptr<LeaseRecord> {
    auto it = records_.find(id);
    return it == records_.end() ? nullptr : it->second;
  };
  std::visit(
      overloaded{
          [&](AcquiredEvent& e) {
            if (auto rec = find(e.lease)) {
              rec->state = LeaseState::Held;
              rec->fencing_token = e.fencing_token;
              rec->valid_until_ns = e.valid_until_ns;
              waiters_cv_.notify_all();
            }
          },
          [&](AcquireFailedEvent& e) {
            if (auto rec = find(e.lease)) end_record_locked(*rec, LeaseState::AcquireFailed);
          },
          [&](LostEvent& e) {
            if (auto rec = find(e.lease)) {
              set_lost_reason(*rec, e.reason);
              auto callbacks = std::move(rec->on_lost);
              rec->on_lost.clear();
              end_record_locked(*rec, LeaseState::Lost);
              callbacks_->post([this, rec, callbacks = std::move(callbacks), reason = e.reason] {
                rec->stop.request_stop();
                for (const auto& [holder, cb] : callbacks) {
                  try {
                    cb(reason);
                  } catch (const std::exception& ex) {
                    log(std::string("on_lost callback threw: ") + ex.what());
                  } catch (...) {
                    log("on_lost callback threw");
                  }
                }
              });
            }
          },
          [&](RenewedEvent& e) {
            if (auto rec = find(e.lease)) {
              rec->valid_until_ns = e.valid_until_ns;
              ++rec->renewed;
              waiters_cv_.notify_all();
            }
          },
          [&](ReleaseOutcomeEvent& e) {
            if (auto it = awaiting_reply_.find(e.lease); it != awaiting_reply_.end()) {
              it->second->release_reply = e.reply;
              awaiting_reply_.erase(it);
              waiters_cv_.notify_all();
            }
          },
          [&](ReleasedEvent& e) {
            if (auto rec = find(e.lease)) {
              end_record_locked(*rec, LeaseState::Released);
              // Released by close() under a live handle: tell the holder's work to stop.
              if (closing_) callbacks_->post([rec] { rec->stop.request_stop(); });
            }
          },
      },
      ev);
}

inline std::uint64_t ClientState::drain_locked(bool for_caller) {
  // Every request to the executor (an exception there fails the request, a transport error)
  // and every event to the lease records, in one lh_drain per request; then every status answer
  // to its caller. Returns the core's next deadline (LH_NO_DEADLINE: none).
  std::vector<std::pair<std::uint64_t, std::string>> failed;
  std::uint64_t deadline = LH_NO_DEADLINE;
  {
    executing_ = std::this_thread::get_id();
    struct Done {
      std::atomic<std::thread::id>& e;
      ~Done() { e = std::thread::id(); }
    } done{executing_};
    std::array<lh_event, 8> events;
    for (;;) {
      std::optional<IoRequest> r;
      const lh_drained d = core_->drain(r, events);
      if (r) {
        const auto id = r->id;
        try {
          for_caller ? executor_->execute_for_caller(std::move(*r)) : executor_->execute(std::move(*r));
        } catch (const std::exception& e) {
          failed.emplace_back(id, e.what());
        } catch (...) {
          failed.emplace_back(id, "unknown exception");
        }
      }
      for (std::uint32_t i = 0; i < d.nevents; ++i)
        if (auto ev = Core::to_event(events[i])) dispatch_locked(*ev);
      if (d.more_requests == 0 && d.more_events == 0) {
        deadline = d.deadline_ns;
        break;
      }
    }
  }
  for (const auto& [id, why] : failed) {
    log("request " + std::to_string(id) + " failed in the executor: " + why);
    core_->io_failed(now_ns(), id, LH_FAILURE_TRANSPORT, why);
  }
  if (!failed.empty()) {
    poke_locked();  // what those failures cause goes out on the driver's next drain
    while (auto ev = core_->poll_event()) dispatch_locked(*ev);
    deadline = core_->poll_timeout().value_or(LH_NO_DEADLINE);
  }
  if (statuses_asked_ > 0) {  // (no status query outstanding: nothing to poll)
    bool any = false;
    while (auto st = core_->poll_status()) {
      --statuses_asked_;
      if (abandoned_statuses_.erase(st->id) == 0) statuses_[st->id] = std::move(*st), any = true;
    }
    if (any) waiters_cv_.notify_all();
  }
  return deadline;
}

// An answer the core refuses (malformed, oversized, of the wrong kind) is logged and its request
// failed in transport: it never counts as what the service said.
inline void ClientState::feed_locked(IoAnswer& in) {
  const auto now = now_ns();
  try {
    core_->answer(now, in);
  } catch (const Error& e) {
    if (e.code() == LH_ERR_PANIC || e.code() == LH_ERR_POISONED) throw;
    log(std::string("answer refused by the core: ") + e.what());
    const std::uint64_t id = std::visit(overloaded{
                                            [](const IoReply& r) { return r.id; },
                                            [](const IoHttpReply& r) { return r.id; },
                                            [](const IoStreamMessage& m) { return m.id; },
                                            [](const auto&) { return std::uint64_t{0}; },
                                        },
                                        in);
    if (id != 0) core_->io_failed(now, id, LH_FAILURE_TRANSPORT, e.what());
  }
}

// The handle failed (panic → poisoned). Nothing it says can be trusted any more: every waiter
// fails, every held lease is reported lost (Expired: we can no longer vouch for it).
inline void ClientState::fail_all_locked(std::string_view why) {
  broken_ = true;
  log(std::string("core failed, client unusable: ") + std::string(why));
  auto recs = std::move(records_);
  records_.clear();
  for (auto& [id, rec] : recs) {
    if (rec->state == LeaseState::Held) {
      rec->state = LeaseState::Lost;
      set_lost_reason(*rec, LostReason::Expired);
      auto callbacks = std::move(rec->on_lost);
      rec->on_lost.clear();
      callbacks_->post([this, rec, callbacks = std::move(callbacks)] {
        rec->stop.request_stop();
        for (const auto& [holder, cb] : callbacks) {
          try {
            cb(LostReason::Expired);
          } catch (...) {
            log("on_lost callback threw");
          }
        }
      });
    } else {
      rec->state = LeaseState::AcquireFailed;
    }
  }
  waiters_cv_.notify_all();
}

inline void ClientState::drive() noexcept {
  std::unique_lock lk(mu_);
  while (!broken_) {
    try {
      if (hold_driver_ && !stopping_) {
        driver_cv_.wait(lk, [&] { return !hold_driver_ || stopping_; });
        continue;
      }
      while (!inputs_.empty()) {
        IoAnswer in = std::move(inputs_.front());
        inputs_.pop_front();
        feed_locked(in);
        drain_locked();
      }
      if (dirty_) {
        dirty_ = false;
        drain_locked();
      }
      const auto deadline = core_->poll_timeout();
      const auto now = now_ns();
      if (deadline && *deadline <= now) {
        core_->timeout(now);
        drain_locked();
        continue;
      }
      if (closing_) waiters_cv_.notify_all();  // close() watches pending_cleanups
      if (stopping_) break;
      auto ready = [&] { return !inputs_.empty() || dirty_ || stopping_; };
      driver_until_ = deadline ? *deadline : std::numeric_limits<std::uint64_t>::max();
      if (deadline) {
        driver_cv_.wait_until(lk, to_time_point(*deadline), ready);
      } else {
        driver_cv_.wait(lk, ready);
      }
      driver_until_ = 0;
    } catch (const std::exception& e) {
      fail_all_locked(e.what());
    }
  }
}

inline void ClientState::release_everything_locked() {
  if (!core_ || broken_) return;
  const auto now = now_ns();
  for (auto& [id, rec] : records_) {
    // A reentrant lease needs one release per holder; bounded by max_leases-sized refcounts.
    for (int guard = 0; guard < (1 << 22); ++guard) {
      try {
        const auto s = core_->lease_state(id);
        if (s != LeaseState::Held && s != LeaseState::Acquiring) break;
        core_->release(now, id);
      } catch (const Error&) {
        break;
      }
    }
  }
  poke_locked();
}

inline void ClientState::close() noexcept {
  std::lock_guard serial(close_mu_);
  {
    std::unique_lock lk(mu_);
    if (closed_) return;
    closing_ = true;
    release_everything_locked();
    waiters_cv_.notify_all();
    const auto deadline = Clock::now() + opts_.close_timeout;
    waiters_cv_.wait_until(lk, deadline, [&] {
      if (broken_ || !core_) return active_acquires_ == 0;
      try {
        return active_acquires_ == 0 && records_.empty() && core_->counters().pending_cleanups == 0;
      } catch (...) {
        return true;
      }
    });
    if (core_ && !broken_) {
      try {
        core_->io_close(now_ns());  // etcd: revoke the pooled leases; the executor sends it
        drain_locked();
      } catch (...) {
      }
    }
    stopping_ = true;
    driver_cv_.notify_all();
  }
  if (driver_.joinable()) driver_.join();
  try {
    executor_->close();
  } catch (...) {
  }
  {
    std::unique_lock lk(mu_);
    // Anything still open (the driver was stopped before its events arrived) ends now.
    for (auto& [id, rec] : records_) {
      rec->state = rec->state == LeaseState::Held ? LeaseState::Released : LeaseState::AcquireFailed;
      auto r = rec;
      callbacks_->post([r] { r->stop.request_stop(); });
    }
    records_.clear();
    awaiting_reply_.clear();
    waiters_cv_.notify_all();
    waiters_cv_.wait(lk, [&] { return active_acquires_ == 0; });
    core_.reset();
    inputs_.clear();
    closed_ = true;
  }
  callbacks_->shutdown(false);
}

}  // namespace leasehold::detail
