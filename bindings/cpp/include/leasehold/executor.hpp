// leasehold/executor.hpp — what a LockClient drives: an Executor runs the IO the core's backend
// protocol asks for (one per backend: the memory service, Redis, SQLite, PostgreSQL, etcd) and
// hands back what came, unread, as IoAnswers.
#pragma once

#include <leasehold.h>
#include <leasehold/request.hpp>

#include <chrono>
#include <functional>

namespace leasehold {

// Runs the core's IoRequests on the executor's own connections and threads. The LockClient
// creates its core with backend_options(), calls start() once, then execute() for every request
// (under the client's mutex: never block there), and close() once at the end.
class Executor {
 public:
  // Feeds one answer to the core (any thread, until close() returns; not from inside execute()
  // on the thread that called it: such answers are queued for the client's driver).
  using Sink = std::function<void(IoAnswer)>;

  Executor() = default;
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  virtual ~Executor() = default;

  // The backend the core speaks, with this executor's protocol options
  // (backend_defaults(LH_BACKEND_*) with fields changed). Pointers in it stay valid while the
  // executor lives.
  [[nodiscard]] virtual lh_backend_options backend_options() const = 0;
  // False: the core's waiters poll with backoff instead of waiting for release notifications
  // (Config::notifications is taken as false).
  [[nodiscard]] virtual bool notifications() const { return true; }
  // Called once before any execute().
  virtual void start(Sink sink) = 0;
  // Queues one request (LH_IO_HTTP_CANCEL included); never blocks on the network. An exception
  // fails the request as a transport error (logged).
  virtual void execute(IoRequest request) = 0;
  // execute() for a thread that calls run_pending() as soon as it has unlocked the client and
  // then waits for the answer: the executor may leave the request to that thread (no hop).
  virtual void execute_for_caller(IoRequest request) { execute(std::move(request)); }
  // Runs what execute_for_caller() left, on the calling thread once its connection is free, or
  // hands it to the executor's own thread. Called without the client's mutex.
  virtual void run_pending() noexcept {}
  // run_pending() for a caller whose wait ends at `deadline`: the IO on the calling thread ends
  // by then, and what is still unanswered continues on the executor's own thread (answered
  // through the sink as usual). The default calls run_pending().
  virtual void run_pending_until(std::chrono::steady_clock::time_point deadline) noexcept {
    (void)deadline;
    run_pending();
  }
  // Called once by LockClient::close() after the driver stopped: make in-flight requests end
  // promptly (unanswered) and stop calling the sink.
  virtual void close() {}
};

// The earlier names: Transport (the whole interface) and Backend (its request-running side,
// now the same interface).
using Transport = Executor;
using Backend = Executor;

}  // namespace leasehold
