// leasehold/executor.hpp — what a LockClient drives: an Executor (one per backend; the memory
// service's runs the core's commands, the others return a Backend from backend() that runs the
// requests of the core's backend protocol verbatim), and BackendInput, what a Backend hands back
// for the core.
#pragma once

#include <leasehold.h>
#include <leasehold/config.hpp>
#include <leasehold/core.hpp>
#include <leasehold/output.hpp>
#include <leasehold/request.hpp>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace leasehold {

class Backend;

// Executes the core's commands against a lock service (called from the LockClient's IO pool;
// may block), or, through backend(), runs a backend protocol's requests.
class Executor {
 public:
  using ReleasedCallback = std::function<void(std::string_view name)>;

  Executor() = default;
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  virtual ~Executor() = default;

  // An exception thrown by acquire/renew/release is a transport error for the core (logged).
  virtual AcquireResult acquire(std::string_view name, std::string_view token, std::uint64_t ttl_ms) = 0;
  virtual RenewResult renew(std::string_view name, std::string_view token, std::uint64_t ttl_ms,
                            std::span<const std::uint8_t> backend_data) = 0;
  virtual ReleaseResult release(std::string_view name, std::string_view token,
                                std::span<const std::uint8_t> backend_data) = 0;
  // The core has waiters for `name` (watch) or no more (unwatch): deliver release notifications
  // of `name` to on_released (any thread) until unwatch. An executor may deliver only the ones
  // meant for this client (Redis wakes one waiting client per release) and spurious re-checks.
  virtual void watch(std::string_view /*name*/, ReleasedCallback /*on_released*/) {}
  virtual void unwatch(std::string_view /*name*/) {}
  // watch() for the core's waiters (LockClient uses this; unwatch() ends it). on_wake returns
  // false when no waiter here takes the wake-up (the last one just won or left, and unwatch is
  // still on its way): an executor that wakes one client per release then passes it on, or it
  // is lost. Re-checks may ignore the answer. Default: watch(), ignoring the answer.
  using WakeCallback = std::function<bool(std::string_view name)>;
  virtual void watch_waiter(std::string_view name, WakeCallback on_wake) {
    ReleasedCallback cb;
    if (on_wake) cb = [f = std::move(on_wake)](std::string_view n) { static_cast<void>(f(n)); };
    watch(name, std::move(cb));
  }
  // True when watch() delivers notifications (→ Config::notifications).
  [[nodiscard]] virtual bool notifications() const { return false; }
  // Non-null: LockClient drives a backend-attached core through it and never calls
  // acquire/renew/release/watch.
  virtual Backend* backend() { return nullptr; }
  // Called once by LockClient::close() after the driver stopped: make in-flight calls return
  // promptly (they become transport errors) and stop delivering notifications.
  virtual void close() {}
};

// What a backend executor hands back to the driver (fed to the core unread).
struct BackendInput {
  enum class Kind : std::uint8_t { Reply, Failed, Message, Subscription, Apply } kind = Kind::Failed;
  std::uint64_t id = 0;             // Reply, Failed
  std::vector<lh_value> values;     // Reply
  std::string data;                 // Reply: the data buffer; Message: the payload
  std::string channel;              // Message, Subscription
  bool subscribed = false;          // Subscription
  // Apply: feeds the core directly (SQL rows, HTTP replies, …), on the driver's side of the
  // mutex. Errors other than a panic are logged and ignored (the core's timeout then applies).
  std::function<void(Core&, std::uint64_t now)> apply;

  static BackendInput applying(std::function<void(Core&, std::uint64_t now)> f) {
    BackendInput in;
    in.kind = Kind::Apply;
    in.apply = std::move(f);
    return in;
  }
};

// An executor for a core that speaks a backend protocol itself (Redis): it makes the core
// handle and runs the core's requests verbatim. LockClient uses it instead of the command
// calls when Executor::backend() returns one.
class Backend {
 public:
  using Sink = std::function<void(BackendInput)>;
  virtual ~Backend() = default;
  virtual Core make_core(const Config& config) = 0;
  // Called once before any execute(); sink may be called from any thread until close().
  virtual void start(Sink sink) = 0;
  // Queues one request; never blocks on the network.
  virtual void execute(Request /*request*/) {}
  // Takes every pending request out of the core (under the client's mutex) and queues it;
  // never blocks on the network. Default: the Redis requests (lh_poll_request) to execute().
  virtual void drain(Core& core) {
    while (auto r = core.poll_request()) execute(std::move(*r));
  }
  // drain(), by a thread that calls run_pending() as soon as it has unlocked the client and
  // then waits for the answer: the executor may leave the requests to it (no thread hop).
  virtual void drain_for_caller(Core& core) { drain(core); }
  // Runs what drain_for_caller() left on the calling thread when its connection is free, or
  // hands it to the executor's own thread. Called without the client's mutex.
  virtual void run_pending() noexcept {}
  // What the protocol last saw go wrong (a database error, a refused schema, an error body).
  [[nodiscard]] virtual std::string last_error(const Core& /*core*/) const { return {}; }
  // True when the core's protocol answers status queries (SQL, Redis, etcd): LockClient::status().
  [[nodiscard]] virtual bool answers_status() const { return false; }
  // Called once by LockClient::close() after its releases were answered: queue in the core
  // the removal of what the client keeps on the server of its own (etcd: its pooled lease);
  // the requests then go out through drain(). Default: nothing.
  virtual void closing(Core& /*core*/, std::uint64_t /*now*/) {}
};

// The earlier name of Executor.
using Transport = Executor;

}  // namespace leasehold
