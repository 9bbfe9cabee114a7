// leasehold/memory_executor.hpp — MemoryExecutor: one client's connection to a MemoryService
// (memory_service.hpp), with fault switches (reject, drop, hang, partition). For tests, examples
// and demos.
#pragma once

#include <leasehold.hpp>
#include <leasehold/memory_service.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace leasehold {

// One client's view of a MemoryService, with fault switches:
//   reject    — the service refuses this client: renew → Rejected, acquire → HeldByOther
//               (releases still go through, so nothing leaks);
//   drop      — requests reach the service and are executed, the replies are lost;
//   hang      — calls block (not executed) until the switch is cleared or the executor closes,
//               then fail as transport errors; notifications are not delivered;
//   partition — calls fail at once (not executed); notifications are not delivered.
class MemoryExecutor final : public Executor {
 public:
  explicit MemoryExecutor(std::shared_ptr<MemoryService> service, bool notifications = true)
      : service_(std::move(service)), state_(std::make_shared<State>()), notifications_(notifications) {
    if (!service_) throw Error(LH_ERR_NULL_ARGUMENT, "MemoryExecutor needs a service");
    // The sink holds the shared state only: the service may deliver after this executor is gone.
    conn_ = service_->connect(std::make_shared<MemoryService::Callback>([s = state_](std::string_view n) {
      ReleasedCallback cb;
      {
        std::lock_guard g(s->mu);
        if (s->hang || s->closed) return;
        if (auto it = s->watches.find(std::string(n)); it != s->watches.end()) cb = it->second;
      }
      if (cb) cb(n);
    }));
  }
  ~MemoryExecutor() override { close(); }

  void set_reject(bool on) { set(state_->reject, on); }
  void set_drop(bool on) { set(state_->drop, on); }
  void set_partition(bool on) { set(state_->partition, on); }
  void set_hang(bool on) {
    {
      std::lock_guard g(state_->mu);
      state_->hang = on;
    }
    state_->cv.notify_all();
  }
  // Calls currently blocked by the hang switch.
  [[nodiscard]] std::size_t hung() const {
    std::lock_guard g(state_->mu);
    return state_->hung;
  }
  [[nodiscard]] std::uint64_t calls() const { return calls_.load(); }
  [[nodiscard]] std::uint64_t renew_calls() const { return renew_calls_.load(); }
  [[nodiscard]] std::uint64_t release_calls() const { return release_calls_.load(); }
  [[nodiscard]] const std::shared_ptr<MemoryService>& service() const { return service_; }

  AcquireResult acquire(std::string_view name, std::string_view token, std::uint64_t ttl_ms) override {
    ++calls_;
    if (auto err = gate()) return TransportError{*err};
    const auto r = service_->request(MemoryService::Op::Acquire, conn_, name, token, ttl_ms);
    if (r.outcome == LH_MEMORY_DROPPED) return TransportError{dropped()};
    return MemoryService::to_acquire_result(r);
  }
  RenewResult renew(std::string_view name, std::string_view token, std::uint64_t ttl_ms,
                    std::span<const std::uint8_t>) override {
    ++calls_;
    ++renew_calls_;
    if (gate()) return RenewResult::TransportError;
    return static_cast<RenewResult>(
        service_->request(MemoryService::Op::Renew, conn_, name, token, ttl_ms).engine_outcome);
  }
  ReleaseResult release(std::string_view name, std::string_view token, std::span<const std::uint8_t>) override {
    ++calls_;
    ++release_calls_;
    if (gate()) return ReleaseResult::TransportError;
    return static_cast<ReleaseResult>(
        service_->request(MemoryService::Op::Release, conn_, name, token, 1).engine_outcome);
  }

  void watch(std::string_view name, ReleasedCallback on_released) override {
    std::lock_guard g(mu_);
    if (!notifications_) return;
    {
      std::lock_guard sg(state_->mu);
      if (state_->closed) return;
      state_->watches[std::string(name)] = std::move(on_released);
    }
    service_->watch(conn_, name, true);
  }
  void unwatch(std::string_view name) override {
    std::lock_guard g(mu_);
    {
      std::lock_guard sg(state_->mu);
      if (state_->closed || state_->watches.erase(std::string(name)) == 0) return;
    }
    service_->watch(conn_, name, false);
  }
  [[nodiscard]] bool notifications() const override { return notifications_; }

  void close() override {
    {
      std::lock_guard g(mu_);
      {
        std::lock_guard sg(state_->mu);
        if (state_->closed) return;
        state_->closed = true;
        state_->watches.clear();
      }
      service_->disconnect(conn_);  // its watches go; its locks stay until they expire
    }
    state_->cv.notify_all();
  }

 private:
  struct State {
    std::atomic<bool> reject{false}, drop{false}, partition{false};
    mutable std::mutex mu;
    std::condition_variable cv;
    bool hang = false, closed = false;
    std::size_t hung = 0;
    std::unordered_map<std::string, ReleasedCallback> watches;
  };

  // The switch changes only once the service took it (a release library refuses).
  void set(std::atomic<bool>& flag, bool on) {
    std::lock_guard g(mu_);
    const auto value = [&](const std::atomic<bool>& f) { return &f == &flag ? on : f.load(); };
    std::uint32_t flags = 0;
    if (value(state_->reject)) flags |= LH_MEMORY_REJECT_ACQUIRES | LH_MEMORY_REJECT_RENEWALS;
    if (value(state_->drop)) flags |= LH_MEMORY_DROP_RESPONSES;
    if (value(state_->partition)) flags |= LH_MEMORY_PARTITIONED;
    if (!closed()) service_->set_faults(conn_, flags);
    flag = on;
  }
  bool closed() const {
    std::lock_guard g(state_->mu);
    return state_->closed;
  }
  std::string dropped() const { return state_->partition ? "partitioned" : "reply dropped"; }

  // nullopt: go ahead; otherwise the transport error to report.
  std::optional<std::string> gate() {
    std::unique_lock l(state_->mu);
    if (state_->closed) return "transport closed";
    if (state_->partition) return "partitioned";  // fails at once, even when hung
    if (!state_->hang) return std::nullopt;
    ++state_->hung;
    state_->cv.wait(l, [&] { return !state_->hang || state_->closed; });
    --state_->hung;
    return std::string("hung request abandoned");
  }

  std::shared_ptr<MemoryService> service_;
  std::shared_ptr<State> state_;
  bool notifications_;
  std::uint64_t conn_ = 0;
  std::atomic<std::uint64_t> calls_{0}, renew_calls_{0}, release_calls_{0};
  std::mutex mu_;  // orders watch / unwatch / close / fault changes
};

// The earlier name of MemoryExecutor.
using MemoryTransport = MemoryExecutor;

}  // namespace leasehold
