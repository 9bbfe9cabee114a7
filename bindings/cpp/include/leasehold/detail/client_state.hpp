// leasehold/detail/client_state.hpp — the state a LockClient and its Leases share: one Core under
// one mutex, the lease records, the answers queued for the driver and the callback thread.
//
// Threads of a LockClient:
//   driver     — feeds the core its deadlines and the answers queued for it, and hands the
//                requests they cause to the executor (detail/driver.hpp). It never waits for the
//                executor, so a hung executor cannot delay loss detection.
//   executor   — the Executor's own threads run the requests and feed the answers back through
//                the sink (feed): under the mutex, on the thread that received them, so an answer
//                reaches the waiting application thread with one wake-up. An application thread
//                waiting for its own request may run it itself, within its own wait
//                (send_from_this_thread).
//   callbacks  — runs on_lost callbacks and stops the lease's stop_token (one thread). A callback
//                that throws is logged, never fatal. Callbacks never run on the application
//                thread that called acquire()/release().
#pragma once

#include <leasehold/core.hpp>
#include <leasehold/detail/work_queue.hpp>
#include <leasehold/error.hpp>
#include <leasehold/executor.hpp>
#include <leasehold/lock_status.hpp>
#include <leasehold/options.hpp>
#include <leasehold/output.hpp>
#include <leasehold/types.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace leasehold {

class Lease;
class LockClient;

namespace detail {
struct TestAccess;  // defined by tests only

struct LeaseRecord {
  LeaseRecord(std::uint64_t i, std::string n) : id(i), name(std::move(n)) {}
  std::uint64_t id;
  std::string name;
  LeaseState state = LeaseState::Acquiring;
  std::uint64_t fencing_token = 0;
  std::atomic<std::uint64_t> valid_until_ns{0};  // last known; read without the lock after release
  std::atomic<std::uint32_t> lost_code{0};       // LostReason + 1 once lost; read after release too
  std::uint64_t renewed = 0;                     // RenewedEvents seen (Lease::renew waits on it)
  std::optional<ReleaseReply> release_reply;     // the service's answer to release_reported
  std::stop_source stop;
  std::vector<std::pair<std::uint64_t, std::function<void(LostReason)>>> on_lost;
};

class ClientState : public std::enable_shared_from_this<ClientState> {
 public:
  ClientState(std::shared_ptr<Executor> executor, ClientOptions opts)
      : executor_(std::move(executor)), opts_(std::move(opts)) {
    if (!executor_) throw Error(LH_ERR_NULL_ARGUMENT, "LockClient needs an executor");
    if (!opts_.log) {
      opts_.log = [](std::string_view m) {
        std::fprintf(stderr, "leasehold: %.*s\n", static_cast<int>(m.size()), m.data());
      };
    }
    Config cfg = opts_.config;
    cfg.notifications = cfg.notifications && executor_->notifications();
    core_.emplace(cfg, executor_->backend_options());  // throws on an invalid config; nothing started yet
    request_timeout_ = std::chrono::nanoseconds(static_cast<std::int64_t>(
        std::min<std::uint64_t>(cfg.request_timeout_ns, std::uint64_t{1} << 50)));
  }
  ClientState(const ClientState&) = delete;
  ClientState& operator=(const ClientState&) = delete;
  ~ClientState() = default;

  void start() {
    callbacks_ = std::make_unique<WorkQueue>(1);
    executor_->start([this](IoAnswer&& in) { feed(in); });  // (the sink's argument, not a copy)
    driver_ = std::thread([this] { drive(); });
  }

  std::optional<Lease> acquire(std::string_view name, std::chrono::milliseconds ttl, AcquireOptions opts);
  ReleaseOutcome release(const std::shared_ptr<LeaseRecord>& rec, std::uint64_t holder,
                         std::optional<std::chrono::nanoseconds> timeout) noexcept;
  std::uint64_t renew(const std::shared_ptr<LeaseRecord>& rec);
  bool is_held(const LeaseRecord& rec) const;
  std::uint64_t valid_until(LeaseRecord& rec) const;
  LeaseState state(const LeaseRecord& rec) const {
    std::lock_guard g(mu_);
    return rec.state;
  }
  static std::optional<LostReason> lost_reason(const LeaseRecord& rec) noexcept {
    const auto c = rec.lost_code.load();
    if (c == 0) return std::nullopt;
    return static_cast<LostReason>(c - 1);
  }
  static void set_lost_reason(LeaseRecord& rec, LostReason r) noexcept {
    rec.lost_code = static_cast<std::uint32_t>(r) + 1;
  }
  Counters counters() const {
    std::lock_guard g(mu_);
    if (!core_) throw Error(status::closed, "LockClient is closed");
    return core_->counters();
  }
  std::string last_backend_error() const {
    std::lock_guard g(mu_);
    if (!core_ || broken_) return {};
    return core_->backend_last_error();
  }
  LockStatus status(std::string_view name, std::chrono::nanoseconds timeout) {
    std::unique_lock lk(mu_);
    if (closing_ || !core_) throw Error(status::closed, "LockClient is closed");
    if (broken_) throw Error(LH_ERR_POISONED, "the core handle failed earlier");
    const auto id = core_->status_request(now_ns(), name);  // throws on a bad name
    ++statuses_asked_;
    try {
      drain_locked();
    } catch (const std::exception& e) {
      fail_all_locked(e.what());
    }
    poke_locked();
    const auto bound = Clock::now() + std::clamp<std::chrono::nanoseconds>(timeout, {}, std::chrono::hours(24));
    waiters_cv_.wait_until(lk, bound, [&] { return statuses_.contains(id) || closing_ || broken_; });
    auto it = statuses_.find(id);
    if (it == statuses_.end()) {
      if (closing_) throw Error(status::closed, "LockClient closed during status");
      if (broken_) throw Error(LH_ERR_POISONED, "the core handle failed");
      abandoned_statuses_.insert(id);
      throw Error(status::timeout, "no answer to the status query in time");
    }
    LockStatus out = std::move(it->second);
    statuses_.erase(it);
    return out;
  }
  void close() noexcept;

 private:
  friend struct TestAccess;
  void log(std::string_view m) const noexcept {
    try {
      opts_.log(m);
    } catch (...) {
    }
  }
  // (executor thread) Fed at once under the mutex, not through the driver: an answer reaches the
  // waiting application thread with one wake-up. The driver is woken only when the core's
  // deadline moved earlier (or it is held: then the answer queues for it).
  void feed(IoAnswer& in) {
    if (executing_.load() == std::this_thread::get_id()) {
      // From inside execute() on a thread that holds the mutex: the driver feeds it.
      inputs_.push_back(std::move(in));
      poke_locked();
      return;
    }
    {
      std::lock_guard g(mu_);
      if (stopping_ || broken_ || !core_) return;
      if (hold_driver_) {
        inputs_.push_back(std::move(in));
        return;
      }
      try {
        feed_locked(in);
        const auto deadline = drain_locked();
        if (closing_) waiters_cv_.notify_all();  // close() waits for the last cleanups' answers
        if (!driver_late_locked(deadline)) return;
      } catch (const std::exception& e) {
        fail_all_locked(e.what());
      }
      dirty_ = true;
    }
    driver_cv_.notify_one();
  }
  void poke_locked() {
    dirty_ = true;
    driver_cv_.notify_one();
  }
  // After a drain on this thread (`deadline`, the core's next one, as it returned it): whether
  // the driver will wake up later than that (the driver drains and re-arms whenever it runs;
  // waking it for nothing costs a context switch per request).
  bool driver_late_locked(std::uint64_t deadline) const {
    return deadline != LH_NO_DEADLINE && deadline < driver_until_;
  }
  // The calling thread waits for its own request's answer anyway: it drains the core (taking
  // the request instead of handing it to the executor's thread) and runs it itself, unlocked,
  // until `deadline`, where its own wait ends (the executor finishes what is left).
  void send_from_this_thread(std::unique_lock<std::mutex>& lk, Clock::time_point deadline) {
    try {
      if (driver_late_locked(drain_locked(true))) poke_locked();
    } catch (const std::exception& e) {
      fail_all_locked(e.what());
      poke_locked();
    }
    lk.unlock();
    executor_->run_pending_until(deadline);
    lk.lock();
  }

  void drive() noexcept;
  void feed_locked(IoAnswer& in);
  std::uint64_t drain_locked(bool for_caller = false);
  void dispatch_locked(Event& ev);
  void end_record_locked(LeaseRecord& rec, LeaseState st);
  void fail_all_locked(std::string_view why);
  void release_everything_locked();

  std::shared_ptr<Executor> executor_;
  ClientOptions opts_;
  std::chrono::nanoseconds request_timeout_{0};

  mutable std::mutex mu_;
  std::condition_variable driver_cv_;   // driver waits here
  std::condition_variable waiters_cv_;  // acquirers and close() wait here
  std::optional<Core> core_;            // guarded by mu_; reset at close
  std::deque<IoAnswer> inputs_;  // answers for the driver to feed
  std::unordered_map<std::uint64_t, std::shared_ptr<LeaseRecord>> records_;
  // Released leases whose release() waits for the service's answer (ReleaseOutcomeEvent).
  std::unordered_map<std::uint64_t, std::shared_ptr<LeaseRecord>> awaiting_reply_;
  // Answered status queries (LockClient::status) until their caller takes them.
  std::unordered_map<std::uint64_t, LockStatus> statuses_;
  std::set<std::uint64_t> abandoned_statuses_;  // their callers gave up waiting
  std::size_t statuses_asked_ = 0;  // status queries the core has not answered yet
  std::uint64_t next_holder_ = 0;
  std::size_t active_acquires_ = 0;
  bool dirty_ = false;
  bool closing_ = false;   // no new acquires; everything being released
  bool stopping_ = false;  // the driver is asked to exit
  bool closed_ = false;    // all threads joined
  bool broken_ = false;    // the core handle failed (poisoned)
  bool hold_driver_ = false;  // test hook (TestAccess): the driver waits, as in a starved process
  // When the waiting driver wakes up by itself (ns, the core's clock); 0 while it runs.
  std::uint64_t driver_until_ = 0;

  // The thread inside Executor::execute() (holding mu_), so feed() can tell an answer given there.
  std::atomic<std::thread::id> executing_{};

  std::thread driver_;
  std::unique_ptr<WorkQueue> callbacks_;
  std::mutex close_mu_;  // serializes close()
};

}  // namespace detail

}  // namespace leasehold

// The driver's side (dispatch, feeding, the loop, close).
#include <leasehold/detail/driver.hpp>
