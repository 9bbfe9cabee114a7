// leasehold/memory_service.hpp — an in-process reference lock service, for tests, examples and
// demos; a client reaches it through a MemoryExecutor (memory_executor.hpp).
//
// MemoryService wraps the core's reference service (lh_memory_service_*, the one every binding
// tests against): idempotent acquire for the same token (same fencing token, TTL refreshed),
// remaining TTL as the retry hint, renew and release compare the token, release notifies the
// watchers, fencing tokens per name strictly increase. Expiry runs on steady_clock (now_ns()).
// The service's faults (reject, drop, partition) are applied by the core; hang, call counting
// and delivering notifications on the caller's thread stay in MemoryExecutor. Those faults and
// drop_lock are test hooks: they need a library built with the `testing` feature, and throw
// Error(status::no_testing_feature) with a release library (hang and clearing work with either).
#pragma once

#include <leasehold.hpp>

// Weak references to the service's test hooks (see leasehold/error.hpp).
extern "C" lh_status lh_memory_service_set_faults(struct lh_memory_service* svc, uint64_t connection,
                                                  const struct lh_memory_faults* faults) LEASEHOLD_TEST_HOOK;
extern "C" lh_status lh_memory_service_forget(struct lh_memory_service* svc, const uint8_t* name,
                                              size_t name_len) LEASEHOLD_TEST_HOOK;

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace leasehold {

class MemoryService {
 public:
  struct Holder {
    std::string token;
    std::uint64_t fencing_token = 0;
    Clock::time_point expires;
  };
  using Callback = std::function<void(std::string_view)>;

  MemoryService() {
    lh_memory_config cfg;
    lh_memory_config_default(&cfg);
    cfg.max_connections = 1u << 24;  // one per executor and per subscription
    if (const auto st = lh_memory_service_new(&cfg, &p_); st != LH_OK) throw Error(st, "lh_memory_service_new");
  }
  ~MemoryService() { lh_memory_service_free(p_); }
  MemoryService(const MemoryService&) = delete;
  MemoryService& operator=(const MemoryService&) = delete;

  // Requests on the service's own connection (no fault switches).
  AcquireResult acquire(std::string_view name, std::string_view token, std::uint64_t ttl_ms) {
    return to_acquire_result(request(Op::Acquire, direct(), name, token, ttl_ms));
  }
  bool renew(std::string_view name, std::string_view token, std::uint64_t ttl_ms) {
    return request(Op::Renew, direct(), name, token, ttl_ms).outcome == LH_MEMORY_RENEWED;
  }
  bool release(std::string_view name, std::string_view token) {
    return request(Op::Release, direct(), name, token, 1).outcome == LH_MEMORY_RELEASED;
  }

  // Calls cb (outside the service's lock) for every release of `name` until unsubscribe.
  std::uint64_t subscribe(std::string_view name, Callback cb) {
    const auto id = connect(std::make_shared<Callback>(std::move(cb)));
    std::lock_guard g(mu_);
    check(lh_memory_service_watch(p_, id, bytes(name), name.size()));
    return id;
  }
  void unsubscribe(std::uint64_t id) { disconnect(id); }

  // Inspection and manipulation for tests.
  std::optional<Holder> holder(std::string_view name) const {
    const auto st = status(name);
    if (st.held == 0) return std::nullopt;
    return Holder{std::string(reinterpret_cast<const char*>(st.holder_token), st.holder_token_len),
                  st.fencing_token, Clock::time_point(std::chrono::nanoseconds(st.expires_at_ns))};
  }
  // The service forgets the lock (as after a failover): the holder's next renew is rejected.
  void drop_lock(std::string_view name) {
    if (!LEASEHOLD_HAS_TEST_HOOK(lh_memory_service_forget)) detail::no_testing_feature("lh_memory_service_forget");
    std::lock_guard g(mu_);
    check(lh_memory_service_forget(p_, bytes(name), name.size()));
  }
  std::uint64_t last_fence(std::string_view name) const { return status(name).last_fencing_token; }
  std::uint64_t grants() const { return stats().grants; }
  std::size_t subscriptions() const { return static_cast<std::size_t>(stats().watches); }

  // ---- for MemoryExecutor ----
  enum class Op : std::uint8_t { Acquire, Renew, Release };
  // A connection whose release notifications go to `sink` (null: none).
  std::uint64_t connect(std::shared_ptr<Callback> sink) {
    std::lock_guard g(mu_);
    std::uint64_t id = 0;
    check(lh_memory_service_connect(p_, &id));
    if (sink) sinks_.emplace(id, std::move(sink));
    return id;
  }
  void disconnect(std::uint64_t id) {
    std::lock_guard g(mu_);
    if (lh_memory_service_disconnect(p_, id) == LH_OK) sinks_.erase(id);
  }
  void set_faults(std::uint64_t id, std::uint32_t flags) {
    if (!LEASEHOLD_HAS_TEST_HOOK(lh_memory_service_set_faults)) {
      if (flags == 0) return;  // a library without the hooks never had a switch on
      detail::no_testing_feature("lh_memory_service_set_faults");
    }
    lh_memory_faults f{sizeof(lh_memory_faults), flags, 0, 0};
    std::lock_guard g(mu_);
    check(lh_memory_service_set_faults(p_, id, &f));
  }
  void watch(std::uint64_t id, std::string_view name, bool on) {
    std::lock_guard g(mu_);
    check(on ? lh_memory_service_watch(p_, id, bytes(name), name.size())
             : lh_memory_service_unwatch(p_, id, bytes(name), name.size()));
  }
  // One request; after a release, the notifications it queued are delivered on this thread.
  lh_memory_result request(Op op, std::uint64_t id, std::string_view name, std::string_view token,
                           std::uint64_t ttl_ms) {
    lh_memory_result r{};
    r.struct_size = sizeof r;
    std::vector<std::pair<std::shared_ptr<Callback>, std::string>> notify;
    {
      std::lock_guard g(mu_);
      const auto now = now_ns();
      const auto* n = bytes(name);
      const auto* t = bytes(token);
      switch (op) {
        case Op::Acquire:
          check(lh_memory_service_acquire(p_, id, now, n, name.size(), t, token.size(), ttl_ms, &r));
          break;
        case Op::Renew:
          check(lh_memory_service_renew(p_, id, now, n, name.size(), t, token.size(), ttl_ms, &r));
          break;
        case Op::Release:
          check(lh_memory_service_release(p_, id, now, n, name.size(), t, token.size(), &r));
          // Queued even when the answer is then lost.
          if (r.outcome == LH_MEMORY_RELEASED || r.outcome == LH_MEMORY_DROPPED) {
            for (const auto& [conn, sink] : sinks_) {
              const std::uint8_t* got = nullptr;
              std::size_t len = 0;
              while (lh_memory_service_poll_released(p_, conn, &got, &len) == LH_OK && got != nullptr)
                notify.emplace_back(sink, std::string(reinterpret_cast<const char*>(got), len));
            }
          }
          break;
      }
    }
    for (auto& [sink, n] : notify) (*sink)(n);  // outside the lock
    return r;
  }
  static AcquireResult to_acquire_result(const lh_memory_result& r) {
    switch (r.outcome) {
      case LH_MEMORY_GRANTED: return Granted{r.fencing_token, r.ttl_ms, {}};
      case LH_MEMORY_HELD_BY_OTHER:
        return HeldByOther{r.retry_after_ms == LH_NO_RETRY_HINT ? std::nullopt
                                                                : std::optional<std::uint64_t>(r.retry_after_ms)};
      default: return TransportError{r.outcome == LH_MEMORY_FULL ? "service full" : "dropped"};
    }
  }

 private:
  static const std::uint8_t* bytes(std::string_view s) { return reinterpret_cast<const std::uint8_t*>(s.data()); }
  // mu_ is held.
  void check(lh_status st) const {
    if (st != LH_OK) throw Error(st, lh_memory_service_last_error(p_));
  }
  std::uint64_t direct() {
    std::call_once(direct_once_, [&] { direct_ = connect(nullptr); });
    return direct_;
  }
  lh_memory_status status(std::string_view name) const {
    lh_memory_status st{};
    st.struct_size = sizeof st;
    std::lock_guard g(mu_);
    check(lh_memory_service_status(p_, now_ns(), bytes(name), name.size(), &st));
    return st;
  }
  lh_memory_stats stats() const {
    lh_memory_stats s{};
    s.struct_size = sizeof s;
    std::lock_guard g(mu_);
    check(lh_memory_service_stats_get(p_, &s));
    return s;
  }

  mutable std::mutex mu_;  // the handle is not thread-safe
  lh_memory_service* p_ = nullptr;
  std::map<std::uint64_t, std::shared_ptr<Callback>> sinks_;
  std::once_flag direct_once_;
  std::uint64_t direct_ = 0;
};

}  // namespace leasehold
