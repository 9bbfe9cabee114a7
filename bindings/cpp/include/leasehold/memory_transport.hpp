// leasehold/memory_transport.hpp — an in-process reference lock service and a transport to it
// with fault switches (reject, drop, hang, partition). For tests, examples and demos.
//
// MemoryService has the same semantics as the canonical Redis scripts: idempotent acquire for the
// same token (same fencing token, TTL refreshed), remaining TTL as the retry hint, renew and
// release compare the token, release publishes a notification, fencing tokens per name strictly
// increase and are never reset. Expiry runs on steady_clock.
#pragma once

#include <leasehold.hpp>

#include <algorithm>
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

  AcquireResult acquire(std::string_view name, std::string_view token, std::uint64_t ttl_ms) {
    std::lock_guard g(mu_);
    const auto now = Clock::now();
    auto it = locks_.find(std::string(name));
    if (it != locks_.end() && it->second.expires > now && it->second.token != token) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(it->second.expires - now);
      return HeldByOther{static_cast<std::uint64_t>(std::max<std::int64_t>(left.count(), 1))};
    }
    const auto expires = now + std::chrono::milliseconds(static_cast<std::int64_t>(ttl_ms));
    if (it != locks_.end() && it->second.expires > now) {  // same token: idempotent
      it->second.expires = expires;
      return Granted{it->second.fencing_token, ttl_ms, {}};
    }
    const std::uint64_t fence = ++fences_[std::string(name)];
    locks_[std::string(name)] = Holder{std::string(token), fence, expires};
    ++grants_;
    return Granted{fence, ttl_ms, {}};
  }

  bool renew(std::string_view name, std::string_view token, std::uint64_t ttl_ms) {
    std::lock_guard g(mu_);
    const auto now = Clock::now();
    auto it = locks_.find(std::string(name));
    if (it == locks_.end() || it->second.expires <= now || it->second.token != token) return false;
    it->second.expires = now + std::chrono::milliseconds(static_cast<std::int64_t>(ttl_ms));
    return true;
  }

  bool release(std::string_view name, std::string_view token) {
    std::vector<Callback> notify;
    {
      std::lock_guard g(mu_);
      auto it = locks_.find(std::string(name));
      if (it == locks_.end() || it->second.expires <= Clock::now() || it->second.token != token) return false;
      locks_.erase(it);
      ++releases_;
      for (const auto& [id, sub] : subs_)
        if (sub.first == name) notify.push_back(sub.second);
    }
    for (auto& cb : notify) cb(name);  // outside the lock
    return true;
  }

  std::uint64_t subscribe(std::string_view name, Callback cb) {
    std::lock_guard g(mu_);
    const auto id = ++next_sub_;
    subs_.emplace(id, std::make_pair(std::string(name), std::move(cb)));
    return id;
  }
  void unsubscribe(std::uint64_t id) {
    std::lock_guard g(mu_);
    subs_.erase(id);
  }

  // Inspection and manipulation for tests.
  std::optional<Holder> holder(std::string_view name) const {
    std::lock_guard g(mu_);
    auto it = locks_.find(std::string(name));
    if (it == locks_.end() || it->second.expires <= Clock::now()) return std::nullopt;
    return it->second;
  }
  // The service forgets the lock (as after a failover): the holder's next renew is rejected.
  void drop_lock(std::string_view name) {
    std::lock_guard g(mu_);
    locks_.erase(std::string(name));
  }
  std::uint64_t last_fence(std::string_view name) const {
    std::lock_guard g(mu_);
    auto it = fences_.find(std::string(name));
    return it == fences_.end() ? 0 : it->second;
  }
  std::uint64_t grants() const {
    std::lock_guard g(mu_);
    return grants_;
  }
  std::size_t subscriptions() const {
    std::lock_guard g(mu_);
    return subs_.size();
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, Holder> locks_;
  std::unordered_map<std::string, std::uint64_t> fences_;
  std::map<std::uint64_t, std::pair<std::string, Callback>> subs_;
  std::uint64_t next_sub_ = 0;
  std::uint64_t grants_ = 0;
  std::uint64_t releases_ = 0;
};

// One client's view of a MemoryService, with fault switches:
//   reject    — the service refuses this client: renew → Rejected, acquire → HeldByOther
//               (releases still go through, so nothing leaks);
//   drop      — requests reach the service and are executed, the replies are lost;
//   hang      — calls block (not executed) until the switch is cleared or the transport closes,
//               then fail as transport errors; notifications are not delivered;
//   partition — calls fail at once (not executed); notifications are not delivered.
class MemoryTransport final : public Transport {
 public:
  explicit MemoryTransport(std::shared_ptr<MemoryService> service, bool notifications = true)
      : service_(std::move(service)), faults_(std::make_shared<Faults>()), notifications_(notifications) {
    if (!service_) throw Error(LH_ERR_NULL_ARGUMENT, "MemoryTransport needs a service");
  }
  ~MemoryTransport() override { close(); }

  void set_reject(bool on) { faults_->reject = on; }
  void set_drop(bool on) { faults_->drop = on; }
  void set_partition(bool on) { faults_->partition = on; }
  void set_hang(bool on) {
    {
      std::lock_guard g(faults_->mu);
      faults_->hang = on;
    }
    faults_->cv.notify_all();
  }
  // Calls currently blocked by the hang switch.
  [[nodiscard]] std::size_t hung() const {
    std::lock_guard g(faults_->mu);
    return faults_->hung;
  }
  [[nodiscard]] std::uint64_t calls() const { return calls_.load(); }
  [[nodiscard]] std::uint64_t renew_calls() const { return renew_calls_.load(); }
  [[nodiscard]] std::uint64_t release_calls() const { return release_calls_.load(); }
  [[nodiscard]] const std::shared_ptr<MemoryService>& service() const { return service_; }

  AcquireResult acquire(std::string_view name, std::string_view token, std::uint64_t ttl_ms) override {
    ++calls_;
    if (auto err = gate()) return TransportError{*err};
    if (faults_->reject) return HeldByOther{std::nullopt};
    auto r = service_->acquire(name, token, ttl_ms);
    if (faults_->drop) return TransportError{"reply dropped"};
    return r;
  }
  RenewResult renew(std::string_view name, std::string_view token, std::uint64_t ttl_ms,
                    std::span<const std::uint8_t>) override {
    ++calls_;
    ++renew_calls_;
    if (gate()) return RenewResult::TransportError;
    if (faults_->reject) return RenewResult::Rejected;
    const bool ok = service_->renew(name, token, ttl_ms);
    if (faults_->drop) return RenewResult::TransportError;
    return ok ? RenewResult::Renewed : RenewResult::Rejected;
  }
  ReleaseResult release(std::string_view name, std::string_view token, std::span<const std::uint8_t>) override {
    ++calls_;
    ++release_calls_;
    if (gate()) return ReleaseResult::TransportError;
    const bool ok = service_->release(name, token);
    if (faults_->drop) return ReleaseResult::TransportError;
    return ok ? ReleaseResult::Released : ReleaseResult::NotOwner;
  }

  void watch(std::string_view name, ReleasedCallback on_released) override {
    std::lock_guard g(mu_);
    if (closed_ || !notifications_) return;
    if (auto it = watches_.find(std::string(name)); it != watches_.end()) service_->unsubscribe(it->second);
    auto faults = faults_;  // shared: the service may publish after this transport is gone
    watches_[std::string(name)] = service_->subscribe(name, [faults, cb = std::move(on_released)](std::string_view n) {
      if (faults->partition || faults->closed) return;
      {
        std::lock_guard fg(faults->mu);
        if (faults->hang) return;
      }
      cb(n);
    });
  }
  void unwatch(std::string_view name) override {
    std::lock_guard g(mu_);
    if (auto it = watches_.find(std::string(name)); it != watches_.end()) {
      service_->unsubscribe(it->second);
      watches_.erase(it);
    }
  }
  [[nodiscard]] bool notifications() const override { return notifications_; }

  void close() override {
    {
      std::lock_guard g(mu_);
      closed_ = true;
      for (const auto& [name, id] : watches_) service_->unsubscribe(id);
      watches_.clear();
    }
    {
      std::lock_guard g(faults_->mu);
      faults_->closed = true;
    }
    faults_->cv.notify_all();
  }

 private:
  struct Faults {
    std::atomic<bool> reject{false}, drop{false}, partition{false}, closed{false};
    mutable std::mutex mu;
    std::condition_variable cv;
    bool hang = false;
    std::size_t hung = 0;
  };

  // nullopt: go ahead; otherwise the transport error to report.
  std::optional<std::string> gate() {
    if (faults_->closed) return "transport closed";
    if (faults_->partition) return "partitioned";
    std::unique_lock l(faults_->mu);
    if (!faults_->hang) return std::nullopt;
    ++faults_->hung;
    faults_->cv.wait(l, [&] { return !faults_->hang || faults_->closed; });
    --faults_->hung;
    return std::string("hung request abandoned");
  }

  std::shared_ptr<MemoryService> service_;
  std::shared_ptr<Faults> faults_;
  bool notifications_;
  std::atomic<std::uint64_t> calls_{0}, renew_calls_{0}, release_calls_{0};
  std::mutex mu_;
  bool closed_ = false;
  std::unordered_map<std::string, std::uint64_t> watches_;
};

}  // namespace leasehold
