// leasehold/memory_service.hpp — an in-process reference lock service, for tests, examples and
// demos; a client reaches it through a MemoryExecutor (memory_executor.hpp).
//
// MemoryService wraps the core's reference service (lh_memory_service_*, the one every binding
// tests against): a client's core speaks its protocol like any backend's, and the executor hands
// each request to call() unread. Idempotent acquire for the same token, the holder's remaining
// TTL as the retry hint, renew and release compare the token, a release notifies the names'
// watchers, fencing tokens per name strictly increase. Expiry runs on steady_clock (now_ns()).
// The service's faults (reject, drop, partition) are applied by the core's service; hang and
// delivering notifications stay in MemoryExecutor. Those faults and drop_lock are test hooks:
// they need a library built with the `testing` feature, and throw
// Error(status::no_testing_feature) with a release library (hang and clearing work with either).
#pragma once

#include <leasehold.hpp>

// Weak references to the service's test hooks (see leasehold/error.hpp).
extern "C" lh_status lh_memory_service_set_faults(struct lh_memory_service* svc, uint64_t connection,
                                                  const struct lh_memory_faults* faults) LEASEHOLD_TEST_HOOK;
extern "C" lh_status lh_memory_service_forget(struct lh_memory_service* svc, const uint8_t* name,
                                              size_t name_len) LEASEHOLD_TEST_HOOK;

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
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
  // Receives the names released while a connection watched them (any thread).
  using Callback = std::function<void(std::string_view)>;
  // One call's answer, copied out of the service: the values for lh_io_reply, or dropped.
  struct Answer {
    bool dropped = false;
    std::vector<lh_value> values;
    std::string data;
  };

  MemoryService() {
    lh_memory_config cfg;
    lh_memory_config_default(&cfg);
    cfg.max_connections = 1u << 24;  // one per executor
    if (const auto st = lh_memory_service_new(&cfg, &p_); st != LH_OK) throw Error(st, "lh_memory_service_new");
  }
  ~MemoryService() { lh_memory_service_free(p_); }
  MemoryService(const MemoryService&) = delete;
  MemoryService& operator=(const MemoryService&) = delete;

  // Inspection and manipulation for tests (`now`: the host's monotonic ns, as the clients feed).
  std::optional<Holder> holder(std::string_view name, std::uint64_t now = now_ns()) const {
    const auto st = status(name, now);
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
  std::uint64_t last_fence(std::string_view name) const { return status(name, now_ns()).last_fencing_token; }
  std::uint64_t grants() const { return stats().grants; }
  // (connection, name) watches: one per name a client's waiters wait on.
  std::size_t subscriptions() const { return static_cast<std::size_t>(stats().watches); }
  [[nodiscard]] lh_memory_stats stats() const {
    lh_memory_stats s{};
    s.struct_size = sizeof s;
    std::lock_guard g(mu_);
    check(lh_memory_service_stats_get(p_, &s));
    return s;
  }

  // ---- for MemoryExecutor ----
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
  // Hands one request of connection `id` (its argument vector, unread) to the service at host
  // time `now`; `on_answer` gets the answer, then every release notification the service
  // queued goes to its connection's sink (both outside the service's lock).
  void call(std::uint64_t id, std::uint64_t now, const std::vector<std::string>& argv,
            const std::function<void(Answer)>& on_answer) {
    Answer a;
    std::vector<std::pair<std::shared_ptr<Callback>, std::string>> notify;
    {
      std::vector<lh_bytes> args;
      args.reserve(argv.size());
      for (const auto& s : argv) args.push_back(lh_bytes{bytes(s), s.size()});
      lh_memory_answer r{};
      r.struct_size = sizeof r;
      std::lock_guard g(mu_);
      check(lh_memory_service_call(p_, id, now, args.data(), static_cast<std::uint32_t>(args.size()), &r));
      a.dropped = r.dropped != 0;
      if (r.nvalues != 0) a.values.assign(r.values, r.values + r.nvalues);
      if (r.data_len != 0) a.data.assign(reinterpret_cast<const char*>(r.data), r.data_len);
      // The answer is copied: the service handle may be called again.
      for (const auto& [conn, sink] : sinks_) {
        const std::uint8_t* got = nullptr;
        std::size_t len = 0;
        while (lh_memory_service_poll_released(p_, conn, &got, &len) == LH_OK && got != nullptr)
          notify.emplace_back(sink, std::string(reinterpret_cast<const char*>(got), len));
      }
    }
    if (on_answer) on_answer(std::move(a));
    for (auto& [sink, n] : notify) (*sink)(n);
  }

 private:
  static const std::uint8_t* bytes(std::string_view s) { return detail::bytes_ptr(s.data()); }
  // mu_ is held.
  void check(lh_status st) const {
    if (st != LH_OK) throw Error(st, lh_memory_service_last_error(p_));
  }
  lh_memory_status status(std::string_view name, std::uint64_t now) const {
    lh_memory_status st{};
    st.struct_size = sizeof st;
    std::lock_guard g(mu_);
    check(lh_memory_service_status(p_, now, bytes(name), name.size(), &st));
    return st;
  }

  mutable std::mutex mu_;  // the handle is not thread-safe
  lh_memory_service* p_ = nullptr;
  std::map<std::uint64_t, std::shared_ptr<Callback>> sinks_;
};

}  // namespace leasehold
