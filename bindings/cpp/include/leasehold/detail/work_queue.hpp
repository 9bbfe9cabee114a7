// leasehold/detail/work_queue.hpp — the LockClient's callback thread (a queue of jobs run by N
// threads that block SIGPIPE), and the SIGPIPE blocking the executors' threads share.
#pragma once

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <signal.h>
#endif

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace leasehold::detail {

inline void block_sigpipe_in_this_thread() noexcept {
#if defined(__unix__) || defined(__APPLE__)
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
#endif
}

class WorkQueue {
 public:
  explicit WorkQueue(std::size_t threads) {
    if (threads == 0) threads = 1;
    for (std::size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { run(); });
  }
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;
  ~WorkQueue() { shutdown(true); }

  void post(std::function<void()> f) {
    {
      std::lock_guard g(mu_);
      if (stop_) return;
      q_.push_back(std::move(f));
    }
    cv_.notify_one();
  }
  // Stops accepting work; runs (drop_pending=false) or discards what is queued; joins.
  void shutdown(bool drop_pending) {
    {
      std::lock_guard g(mu_);
      if (stop_ && workers_.empty()) return;
      stop_ = true;
      drop_ = drop_pending;
    }
    cv_.notify_all();
    for (auto& t : workers_)
      if (t.joinable()) t.join();
    workers_.clear();
    std::lock_guard g(mu_);
    q_.clear();
  }

 private:
  void run() {
    block_sigpipe_in_this_thread();
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock l(mu_);
        cv_.wait(l, [&] { return stop_ || !q_.empty(); });
        if (q_.empty() || (stop_ && drop_)) return;
        f = std::move(q_.front());
        q_.pop_front();
      }
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  bool stop_ = false;
  bool drop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace leasehold::detail
