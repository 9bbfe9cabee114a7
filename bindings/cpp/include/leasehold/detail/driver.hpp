// leasehold/detail/driver.hpp — the driver: the core's outputs dispatched (commands to the IO pool,
// events to the lease records), inputs fed, the loop that waits for the core's deadline, and
// close() (definitions of ClientState's members).
#pragma once

#include <leasehold/detail/client_state.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <variant>

namespace leasehold::detail {

inline void ClientState::dispatch_locked(Output& out) {
  auto find = [&](std::uint64_t id) -> std::shared_ptr<LeaseRecord> {
    auto it = records_.find(id);
    return it == records_.end() ? nullptr : it->second;
  };
  std::visit(
      overloaded{
          [&](AcquireCommand& c) {
            io_->post([this, c = std::move(c)] {
              AcquireResult r = TransportError{};
              try {
                r = executor_->acquire(c.name, c.token, c.ttl_ms);
              } catch (const std::exception& e) {
                log(std::string("acquire ") + c.name + ": " + e.what());
                r = TransportError{e.what()};
              } catch (...) {
                r = TransportError{"unknown exception"};
              }
              if (auto* te = std::get_if<TransportError>(&r); te && !te->message.empty())
                log("acquire " + c.name + ": " + te->message);
              push_input(InAcquire{c.request, std::move(r)});
            });
          },
          [&](RenewCommand& c) {
            io_->post([this, c = std::move(c)] {
              RenewResult r = RenewResult::TransportError;
              try {
                r = executor_->renew(c.name, c.token, c.ttl_ms, c.backend_data);
              } catch (const std::exception& e) {
                log(std::string("renew ") + c.name + ": " + e.what());
              } catch (...) {
              }
              push_input(InRenew{c.request, r});
            });
          },
          [&](ReleaseCommand& c) {
            io_->post([this, c = std::move(c)] {
              ReleaseResult r = ReleaseResult::TransportError;
              try {
                r = executor_->release(c.name, c.token, c.backend_data);
              } catch (const std::exception& e) {
                log(std::string("release ") + c.name + ": " + e.what());
              } catch (...) {
              }
              push_input(InRelease{c.request, r});
            });
          },
          [&](WatchCommand& c) {
            if (!executor_notifications_) return;  // nothing would be delivered
            core_watching_.insert(c.name);
            watcher_->post([this, on_wake = waiter_callback(), name = std::move(c.name)] {
              try {
                executor_->watch_waiter(name, on_wake);
              } catch (const std::exception& e) {
                log(std::string("watch ") + name + ": " + e.what());
              } catch (...) {
              }
            });
          },
          [&](UnwatchCommand& c) {
            if (!executor_notifications_) return;
            // Now, not when the watcher gets to unwatch: wake-ups arriving meanwhile are declined.
            core_watching_.erase(c.name);
            watcher_->post([this, name = std::move(c.name)] {
              try {
                executor_->unwatch(name);
              } catch (const std::exception& e) {
                log(std::string("unwatch ") + name + ": " + e.what());
              } catch (...) {
              }
            });
          },
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
      out);
}

inline void ClientState::drain_locked(bool for_caller) {
  if (backend_ != nullptr) for_caller ? backend_->drain_for_caller(*core_) : backend_->drain(*core_);
  while (auto out = core_->poll_output()) dispatch_locked(*out);
  if (backend_ != nullptr && backend_->answers_status()) {
    bool any = false;
    while (auto st = core_->poll_status()) {
      if (abandoned_statuses_.erase(st->id) == 0) statuses_[st->id] = std::move(*st), any = true;
    }
    if (any) waiters_cv_.notify_all();
  }
}

inline void ClientState::feed_backend_locked(std::uint64_t now, BackendInput& in) {
  using K = BackendInput::Kind;
  switch (in.kind) {
    case K::Reply:
      try {
        core_->reply(now, in.id, in.values, in.data);
      } catch (const Error& e) {
        if (e.code() != LH_ERR_INVALID_REPLY) throw;
        core_->request_failed(now, in.id);  // a reply the core cannot read: a transport error
      }
      break;
    case K::Failed: core_->request_failed(now, in.id); break;
    case K::Message: core_->pubsub_message(now, in.channel, in.data); break;
    case K::Subscription: core_->subscription(now, in.channel, in.subscribed); break;
    case K::Apply:
      if (in.apply) in.apply(*core_, now);
      break;
  }
}

inline void ClientState::feed_locked(Input& in) {
  const auto now = now_ns();
  try {
    std::visit(overloaded{
                   [&](InAcquire& i) { core_->acquire_result(now, i.request, i.result); },
                   [&](InRenew& i) { core_->renew_result(now, i.request, i.result); },
                   [&](InRelease& i) { core_->release_result(now, i.request, i.result); },
                   [&](InReleased& i) { core_->released(now, i.name); },
                   [&](BackendInput& i) { feed_backend_locked(now, i); },
               },
               in);
  } catch (const Error& e) {
    if (e.code() == LH_ERR_PANIC || e.code() == LH_ERR_POISONED) throw;
    // An executor answered something the core refuses (e.g. oversized backend data): log it
    // and treat that answer as a transport error.
    log(std::string("result refused by the core: ") + e.what());
    if (auto* a = std::get_if<InAcquire>(&in)) {
      core_->acquire_result(now, a->request, TransportError{});
    }
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
        Input in = std::move(inputs_.front());
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
    if (backend_ != nullptr && core_ && !broken_) {
      try {
        backend_->closing(*core_, now_ns());
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
  io_->shutdown(true);
  watcher_->shutdown(true);
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
