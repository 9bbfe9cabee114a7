// leasehold/memory_executor.hpp — MemoryExecutor: one client's connection to a MemoryService
// (memory_service.hpp), with fault switches (reject, drop, hang, partition). For tests, examples
// and demos. It is an executor like the others: its thread hands each request of the core's
// memory protocol to the service (MemoryService::call) and the answer back to the core, and
// passes the service's release notifications on.
#pragma once

#include <leasehold.hpp>
#include <leasehold/memory_service.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace leasehold {

// One client's view of a MemoryService, with fault switches:
//   reject    — the service refuses this client: renew → rejected, acquire → held by another
//               (releases still go through, so nothing leaks);
//   drop      — requests reach the service and are executed, the answers are lost;
//   hang      — requests block (not executed) until the switch is cleared or the executor
//               closes, then fail as transport errors; notifications are not delivered;
//   partition — requests fail at once (not executed); notifications are not delivered.
// With `notifications` false no release notification is delivered: the core's waiters poll.
class MemoryExecutor final : public Executor {
 public:
  explicit MemoryExecutor(std::shared_ptr<MemoryService> service, bool notifications = true)
      : service_(std::move(service)), state_(std::make_shared<State>()), notifications_(notifications) {
    if (!service_) throw Error(LH_ERR_NULL_ARGUMENT, "MemoryExecutor needs a service");
    state_->notifications = notifications;
    // The callback holds the shared state only: the service may deliver after this executor is gone.
    conn_ = service_->connect(std::make_shared<MemoryService::Callback>([s = state_](std::string_view n) {
      Sink sink;
      {
        std::lock_guard g(s->mu);
        if (!s->notifications || s->hang || s->closed || !s->sink) return;
        sink = s->sink;
        ++s->delivering;
      }
      try {
        sink(IoMessage{std::string(n), {}});
      } catch (...) {
      }
      {
        std::lock_guard g(s->mu);
        --s->delivering;
      }
      s->cv.notify_all();
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
  // Requests currently blocked by the hang switch.
  [[nodiscard]] std::size_t hung() const {
    std::lock_guard g(state_->mu);
    return state_->hung;
  }
  // Requests handed to this executor.
  [[nodiscard]] std::uint64_t calls() const { return calls_.load(); }
  [[nodiscard]] const std::shared_ptr<MemoryService>& service() const { return service_; }

  [[nodiscard]] lh_backend_options backend_options() const override { return backend_defaults(LH_BACKEND_MEMORY); }
  [[nodiscard]] bool notifications() const override { return notifications_; }
  void start(Sink sink) override {
    {
      std::lock_guard g(state_->mu);
      if (state_->closed || state_->sink) return;
      state_->sink = std::move(sink);
    }
    worker_ = std::thread([this] { run(); });
  }
  void execute(IoRequest request) override {
    ++calls_;
    {
      std::lock_guard g(state_->mu);
      if (state_->closed) return;
      queue_.push_back(std::move(request));
    }
    state_->cv.notify_all();
  }
  // The connection goes (its watches too; its locks stay until they expire, as a dead client's
  // would); no answer or notification is delivered after this returns.
  void close() override {
    {
      std::unique_lock g(state_->mu);
      if (state_->closed) return;
      state_->closed = true;
      state_->cv.notify_all();
      state_->cv.wait(g, [&] { return state_->delivering == 0; });
    }
    if (worker_.joinable()) worker_.join();
    std::lock_guard g(mu_);
    service_->disconnect(conn_);
  }

 private:
  struct State {
    std::atomic<bool> reject{false}, drop{false}, partition{false};
    mutable std::mutex mu;
    std::condition_variable cv;
    bool notifications = true, hang = false, closed = false;
    std::size_t hung = 0;
    int delivering = 0;  // notifications being handed to the sink
    Sink sink;
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

  void run() {
    State& s = *state_;
    for (;;) {
      IoRequest r;
      {
        std::unique_lock l(s.mu);
        s.cv.wait(l, [&] { return s.closed || !queue_.empty(); });
        if (s.closed) return;
        r = std::move(queue_.front());
        queue_.pop_front();
        if (s.hang && !s.partition) {  // a partition fails at once, even when hung
          ++s.hung;
          s.cv.wait(l, [&] { return !s.hang || s.closed; });
          --s.hung;
          if (s.closed) return;
          l.unlock();
          s.sink(IoFailed{r.id, LH_FAILURE_TRANSPORT, "hung request abandoned"});
          continue;
        }
      }
      if (r.kind != LH_IO_COMMAND) {
        s.sink(IoFailed{r.id, LH_FAILURE_TRANSPORT, "not a request of the memory protocol"});
        continue;
      }
      try {
        service_->call(conn_, now_ns(), r.argv, [&](MemoryService::Answer a) {
          if (a.dropped) {
            s.sink(IoFailed{r.id, LH_FAILURE_TRANSPORT, s.partition ? "partitioned" : "answer dropped"});
          } else {
            s.sink(IoReply{r.id, std::move(a.values), std::move(a.data)});
          }
        });
      } catch (const std::exception& e) {  // a request the service refused as an argument error
        s.sink(IoFailed{r.id, LH_FAILURE_TRANSPORT, e.what()});
      }
    }
  }

  std::shared_ptr<MemoryService> service_;
  std::shared_ptr<State> state_;
  bool notifications_;
  std::uint64_t conn_ = 0;
  std::deque<IoRequest> queue_;  // guarded by state_->mu
  std::atomic<std::uint64_t> calls_{0};
  std::mutex mu_;  // orders fault changes and close
  std::thread worker_;
};

// The earlier name of MemoryExecutor.
using MemoryTransport = MemoryExecutor;

}  // namespace leasehold
