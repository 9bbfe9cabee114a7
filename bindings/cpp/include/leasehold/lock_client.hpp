// leasehold/lock_client.hpp — leasehold::LockClient: thread-safe, one per process per backend; it
// owns one core handle, the driver thread and an Executor, and hands out Leases.
#pragma once

#include <leasehold/detail/client_state.hpp>
#include <leasehold/error.hpp>
#include <leasehold/executor.hpp>
#include <leasehold/lease.hpp>
#include <leasehold/lock_status.hpp>
#include <leasehold/options.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace leasehold {

class LockClient {
 public:
  explicit LockClient(std::shared_ptr<Executor> executor, ClientOptions options = {})
      : st_(std::make_shared<detail::ClientState>(std::move(executor), std::move(options))) {
    st_->start();
  }
  LockClient(const LockClient&) = delete;
  LockClient& operator=(const LockClient&) = delete;
  // Move-only; a moved-from LockClient throws Error(status::closed) from acquire()/counters().
  LockClient(LockClient&& o) noexcept = default;
  LockClient& operator=(LockClient&& o) noexcept {
    if (this != &o) {
      close();
      st_ = std::move(o.st_);
    }
    return *this;
  }
  // Closes: releases every lease (bounded by close_timeout), stops all threads.
  ~LockClient() { close(); }

  // Acquires `name` for `ttl`, waiting at most options.wait (plus one request timeout) for a
  // grant. nullopt when the wait budget ran out, the service was unavailable, or the client
  // closed meanwhile. Throws leasehold::Error on misuse (bad name/ttl, too many leases, closed).
  std::optional<Lease> acquire(std::string_view name, std::chrono::milliseconds ttl,
                               AcquireOptions options = {}) {
    const auto st = state();  // keeps the state alive until this call returns
    return st->acquire(name, ttl, std::move(options));
  }
  [[nodiscard]] Counters counters() const { return state()->counters(); }
  // What the backend protocol last saw go wrong (SQL: a database error, a refused schema such
  // as a foreign table of the same name, a failed connection; etcd: an error body; Redis: an
  // error reply; any: a transport failure). Empty when nothing did.
  [[nodiscard]] std::string last_backend_error() const { return state()->last_backend_error(); }
  // What the backend says about `name` now (every backend; advisory: it can change at once):
  // held or not, the holder's fence and remaining TTL, the last fence ever minted (SQL, Redis,
  // the memory service), and on SQLite the holder's pid and host. A failed query is
  // `ok == false` with `error`. Throws leasehold::Error: a bad name as acquire() does,
  // status::timeout without an answer within `timeout`, status::closed.
  [[nodiscard]] LockStatus status(std::string_view name, std::chrono::nanoseconds timeout = std::chrono::seconds(10)) {
    return state()->status(name, timeout);
  }
  // Idempotent. Also called by the destructor.
  void close() noexcept {
    if (st_) st_->close();
  }

 private:
  friend struct detail::TestAccess;
  std::shared_ptr<detail::ClientState> state() const {
    if (!st_) throw Error(status::closed, "use of a moved-from LockClient");
    return st_;
  }
  std::shared_ptr<detail::ClientState> st_;
};

}  // namespace leasehold
