// leasehold/detail/sql_executor.hpp — what the SQLite and PostgreSQL executors share: the host
// facts they bind, the flat row list they hand back, and the Executor plumbing of an SQL client
// (LH_BACKEND_SQLITE / _POSTGRES). No SQL text and no row meaning here: the core owns both.
#pragma once

#include <leasehold.hpp>

#include <time.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

namespace leasehold::detail {

// The facts a request binds (LH_PARAM_HOST_*): the clocks are read once per request, when it
// starts executing; the boot id and host name once per executor.
struct HostFacts {
  std::int64_t monotonic_ns = 0;
  std::int64_t wall_us = 0;
  std::int64_t pid = 0;
  std::string boot_id;
  std::string host;

  static HostFacts stable() {
    HostFacts f;
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::getline(in, f.boot_id);
    while (!f.boot_id.empty() && (f.boot_id.back() == '\n' || f.boot_id.back() == ' ')) f.boot_id.pop_back();
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) == 0) f.host = host;
    return f;
  }
  // A copy with the clocks and the pid read now.
  [[nodiscard]] HostFacts now() const {
    HostFacts f = *this;
    timespec m{}, w{};
    ::clock_gettime(CLOCK_MONOTONIC, &m);
    ::clock_gettime(CLOCK_REALTIME, &w);
    f.monotonic_ns = static_cast<std::int64_t>(m.tv_sec) * 1000000000 + m.tv_nsec;
    f.wall_us = static_cast<std::int64_t>(w.tv_sec) * 1000000 + w.tv_nsec / 1000;
    f.pid = static_cast<std::int64_t>(::getpid());
    return f;
  }
};

// lh_io_reply's format: lh_values in pre-order, strings as offset/len into one buffer.
struct FlatRows {
  std::vector<lh_value> values;
  std::string data;

  std::size_t array(std::uint64_t len = 0) { return push(LH_VALUE_ARRAY, 0, nullptr, len); }
  void set_len(std::size_t at, std::uint64_t len) { values[at].len = len; }
  void nil() { push(LH_VALUE_NIL, 0, nullptr, 0); }
  void integer(std::int64_t v) { push(LH_VALUE_INT, v, nullptr, 0); }
  void real(double d) {
    std::int64_t bits = 0;
    std::memcpy(&bits, &d, sizeof bits);
    push(LH_VALUE_FLOAT, bits, nullptr, 0);
  }
  void text(const void* p, std::size_t n) { push(LH_VALUE_TEXT, 0, p != nullptr ? p : "", n); }
  void blob(const void* p, std::size_t n) { push(LH_VALUE_BULK, 0, p != nullptr ? p : "", n); }

 private:
  std::size_t push(std::uint32_t kind, std::int64_t integer, const void* s, std::uint64_t len) {
    lh_value v{};
    v.kind = kind;
    v.integer = integer;
    v.len = len;
    if (s != nullptr) {
      v.offset = data.size();
      data.append(static_cast<const char*>(s), static_cast<std::size_t>(len));
    }
    values.push_back(v);
    return values.size() - 1;
  }
};

// The Executor side of an SQL client: requests queued by submit(), answers back through the sink.
class SqlExecutor : public Executor {
 public:
  void start(Sink sink) override { sink_ = std::move(sink); }
  void execute(IoRequest r) override {
    if (r.kind != LH_IO_SQL) return fail(r.id, LH_FAILURE_TRANSPORT, "not an SQL request");  // never from the core
    submit(std::move(r));
  }

 protected:
  // Queues one request for an executor thread; never blocks.
  virtual void submit(IoRequest request) = 0;

  void answer(std::uint64_t id, FlatRows rows) { sink_(IoReply{id, std::move(rows.values), std::move(rows.data)}); }
  void fail(std::uint64_t id, std::uint32_t kind, std::string message) {
    sink_(IoFailed{id, kind, std::move(message)});
  }
  void reset(std::uint32_t connection) { sink_(IoConnection{connection, LH_CONNECTION_REOPENED, {}}); }
  void notification(std::string channel, std::string payload) {
    if (channel.size() > LH_MAX_REPLY_DATA || payload.size() > LH_MAX_REPLY_DATA) return;  // never ours
    sink_(IoMessage{std::move(channel), std::move(payload)});
  }

  Sink sink_;
};

}  // namespace leasehold::detail
