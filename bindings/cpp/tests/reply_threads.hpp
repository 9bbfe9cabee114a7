// An Executor that forwards to another and records the threads its replies were answered on:
// the tests that an answer in time is read on the caller's thread (no hop to the executor's).
#pragma once

#include <leasehold.hpp>

#include <algorithm>
#include <memory>
#include <mutex>
#include <thread>
#include <variant>
#include <vector>

namespace leasehold_test {

class ReplyThreads final : public leasehold::Executor {
 public:
  explicit ReplyThreads(std::shared_ptr<leasehold::Executor> inner) : inner_(std::move(inner)) {}
  [[nodiscard]] lh_backend_options backend_options() const override { return inner_->backend_options(); }
  [[nodiscard]] bool notifications() const override { return inner_->notifications(); }
  void start(Sink sink) override {
    inner_->start([this, sink = std::move(sink)](leasehold::IoAnswer a) {
      if (std::holds_alternative<leasehold::IoReply>(a)) {
        std::lock_guard g(mu_);
        threads_.push_back(std::this_thread::get_id());
      }
      sink(std::move(a));
    });
  }
  void execute(leasehold::IoRequest r) override { inner_->execute(std::move(r)); }
  void execute_for_caller(leasehold::IoRequest r) override { inner_->execute_for_caller(std::move(r)); }
  void run_pending() noexcept override { inner_->run_pending(); }
  void run_pending_until(leasehold::Clock::time_point d) noexcept override { inner_->run_pending_until(d); }
  void close() override { inner_->close(); }
  // The threads of the replies after the first `from`.
  std::vector<std::thread::id> since(std::size_t from) {
    std::lock_guard g(mu_);
    return {threads_.begin() + static_cast<std::ptrdiff_t>(std::min(from, threads_.size())), threads_.end()};
  }

 private:
  std::shared_ptr<leasehold::Executor> inner_;
  std::mutex mu_;
  std::vector<std::thread::id> threads_;
};

}  // namespace leasehold_test
