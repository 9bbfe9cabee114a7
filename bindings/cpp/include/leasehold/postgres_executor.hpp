// leasehold/postgres_executor.hpp — the PostgreSQL executor on libpq (link leasehold::postgres).
//
// The core speaks the SQL protocol itself (LH_BACKEND_POSTGRES: the schema,
// its server-side functions, every statement, the meaning of every row, the LISTEN channels;
// docs/sql-protocol.md). Expiry runs on the server's clock and fences come from a table that is
// never reset. This executor owns two connections, each on its own thread:
//   commands — runs the core's statements verbatim (one request at a time, each bounded by
//              command_timeout) and hands the rows back unread;
//   listener — runs LISTEN / UNLISTEN and passes every notification to the core, so waiters
//              wake on a release instead of polling.
// A connection that breaks fails the request on it (a transport error for the engine: the
// outcome is unknown) and is opened again — the commands connection for the next request, the
// listener at once and then every half second until the server answers; each reopening is
// reported (lh_io_connection, REOPENED) so the core checks the schema and LISTENs again. A database
// error rolls back the open transaction. One PostgresExecutor per LockClient.
// No log line or failure message quotes the connection string's password: a string that does
// not parse, or whose '@' comes after its host part (an unescaped '/' in a password), is refused
// by the constructor without being shown, and the password is masked in libpq's messages.
#pragma once

#include <leasehold.hpp>
#include <leasehold/detail/pg_conninfo.hpp>
#include <leasehold/detail/sql_executor.hpp>

#include <libpq-fe.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>

namespace leasehold {

struct PostgresOptions {
  // A libpq connection string: postgresql://user:password@host:port/db?sslmode=verify-full (or
  // key=value pairs; percent-encode '/' and '@' in a URI's password). Its own
  // connect_timeout, keepalive and TLS settings take precedence.
  std::string url;
  std::chrono::milliseconds connect_timeout{2000};  // libpq rounds up to whole seconds (at least 2)
  std::chrono::milliseconds command_timeout{5000};  // no answer by then: the connection is dropped
  LogFn log;                                        // connection errors; default: stderr
  // Acquire, renew and release commit without waiting for the WAL flush (synchronous_commit
  // off for their own transactions): much faster on a server that flushes; a server crash
  // may forget the last moments' grants and releases (docs/backends.md).
  bool asynchronous_commit = false;
};

namespace detail {
struct PgFinish {
  void operator()(PGconn* c) const noexcept { PQfinish(c); }
};
struct PgClear {
  void operator()(PGresult* r) const noexcept { PQclear(r); }
};
using PgConn = std::unique_ptr<PGconn, PgFinish>;
using PgResult = std::unique_ptr<PGresult, PgClear>;

// libpq's multi-line messages as one line.
inline std::string pg_text(const char* m) { return pg_one_line(m); }

// A connection (or null and the server's reason), with the defaults below the URL's own.
inline PgConn pg_connect(const PostgresOptions& o, std::string& error) {
  const auto secs = std::to_string(std::max<long long>(1, (o.connect_timeout.count() + 999) / 1000));
  const char* keys[] = {"connect_timeout", "keepalives_idle", "keepalives_interval", "keepalives_count",
                        "application_name", "dbname", nullptr};
  const char* vals[] = {secs.c_str(), "10", "5", "3", "leasehold", o.url.c_str(), nullptr};
  PgConn c(PQconnectdbParams(keys, vals, 1));
  if (!c) {
    error = "out of memory";
    return nullptr;
  }
  if (PQstatus(c.get()) != CONNECTION_OK) {
    error = pg_text(PQerrorMessage(c.get()));
    return nullptr;
  }
  // The migration's "already exists, skipping" notices are expected: not for stderr.
  PQsetNoticeProcessor(c.get(), [](void*, const char*) {}, nullptr);
  return c;
}

// Why a statement failed: the database refused it, or the connection is gone.
struct PgFailure {
  std::uint32_t kind = LH_FAILURE_DATABASE;
  std::string message;
};

// Waits until libpq has a whole result, at most until `deadline`.
inline std::optional<PgFailure> pg_wait(PGconn* c, Clock::time_point deadline) {
  while (PQisBusy(c) != 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return PgFailure{LH_FAILURE_TRANSPORT, "no answer within the command timeout"};
    pollfd p{PQsocket(c), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000))) < 0 && errno != EINTR)
      return PgFailure{LH_FAILURE_TRANSPORT, "poll failed"};
    if (PQconsumeInput(c) == 0) return PgFailure{LH_FAILURE_TRANSPORT, pg_text(PQerrorMessage(c))};
  }
  return std::nullopt;
}

inline bool pg_connection_fault(const char* sqlstate) {
  // 08: connection exceptions; 57P: the server is shutting down or restarting.
  return sqlstate != nullptr && (std::strncmp(sqlstate, "08", 2) == 0 || std::strncmp(sqlstate, "57P", 3) == 0);
}

// Runs one statement with text parameters; appends its rows to `out` (when given).
inline std::optional<PgFailure> pg_run(PGconn* c, const std::string& sql, const std::vector<std::optional<std::string>>& params,
                                       Clock::time_point deadline, FlatRows* out) {
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) values.push_back(p ? p->c_str() : nullptr);
  if (PQsendQueryParams(c, sql.c_str(), static_cast<int>(values.size()), nullptr, values.data(), nullptr, nullptr, 0) == 0)
    return PgFailure{LH_FAILURE_TRANSPORT, pg_text(PQerrorMessage(c))};
  std::optional<PgFailure> failure;
  bool rows_done = false;
  for (;;) {
    if (auto f = pg_wait(c, deadline)) return f;
    PgResult r(PQgetResult(c));
    if (!r) break;
    const auto st = PQresultStatus(r.get());
    if (st == PGRES_FATAL_ERROR || st == PGRES_BAD_RESPONSE || st == PGRES_NONFATAL_ERROR) {
      if (st == PGRES_NONFATAL_ERROR) continue;
      if (!failure) {
        const char* state = PQresultErrorField(r.get(), PG_DIAG_SQLSTATE);
        const char* msg = PQresultErrorField(r.get(), PG_DIAG_MESSAGE_PRIMARY);
        failure = PgFailure{static_cast<std::uint32_t>(pg_connection_fault(state) ? LH_FAILURE_TRANSPORT : LH_FAILURE_DATABASE),
                            pg_text(msg != nullptr ? msg : PQresultErrorMessage(r.get()))};
      }
      continue;
    }
    if (out == nullptr || rows_done) continue;
    rows_done = true;
    const int nrows = PQntuples(r.get()), ncols = PQnfields(r.get());
    out->array(static_cast<std::uint64_t>(nrows));
    for (int i = 0; i < nrows; ++i) {
      out->array(static_cast<std::uint64_t>(ncols));
      for (int k = 0; k < ncols; ++k) {
        if (PQgetisnull(r.get(), i, k) != 0) {
          out->nil();
          continue;
        }
        const char* v = PQgetvalue(r.get(), i, k);
        const auto len = static_cast<std::size_t>(PQgetlength(r.get(), i, k));
        switch (PQftype(r.get(), k)) {
          case 16: out->integer(v[0] == 't' ? 1 : 0); break;                       // bool
          case 20: case 21: case 23: out->integer(std::strtoll(v, nullptr, 10)); break;  // int8/2/4
          case 700: case 701: out->real(std::strtod(v, nullptr)); break;            // float4/8
          case 25: case 1043: case 19: case 705: out->text(v, len); break;          // text, varchar, name, unknown
          case 17: {                                                                // bytea
            std::size_t n = 0;
            unsigned char* b = PQunescapeBytea(reinterpret_cast<const unsigned char*>(v), &n);
            out->blob(b, b != nullptr ? n : 0);
            PQfreemem(b);
            break;
          }
          default: out->nil(); break;  // void and types the protocol never reads
        }
      }
    }
  }
  if (!failure && PQstatus(c) == CONNECTION_BAD) failure = PgFailure{LH_FAILURE_TRANSPORT, pg_text(PQerrorMessage(c))};
  if (!failure && out != nullptr && !rows_done) out->array(0);
  return failure;
}

inline std::optional<std::string> pg_param(const SqlParam& p, const HostFacts& f) {
  static const char* hex = "0123456789abcdef";
  switch (p.kind) {
    case LH_VALUE_INT: return std::to_string(p.integer);
    case LH_VALUE_TEXT: return p.bytes;
    case LH_VALUE_BULK: {
      std::string s = "\\x";
      for (unsigned char ch : p.bytes) s += hex[ch >> 4], s += hex[ch & 15];
      return s;
    }
    case LH_PARAM_HOST_MONOTONIC_NS: return std::to_string(f.monotonic_ns);
    case LH_PARAM_HOST_WALL_US: return std::to_string(f.wall_us);
    case LH_PARAM_HOST_BOOT_ID: return f.boot_id;
    case LH_PARAM_HOST_PID: return std::to_string(f.pid);
    case LH_PARAM_HOST_NAME: return f.host;
    default: return std::nullopt;  // NIL
  }
}
}  // namespace detail

class PostgresExecutor final : public detail::SqlExecutor {
 public:
  explicit PostgresExecutor(PostgresOptions options) : opts_(std::move(options)), facts_(detail::HostFacts::stable()) {
    if (opts_.url.empty()) throw Error(status::invalid_argument, "PostgresExecutor needs a connection string");
    if (opts_.command_timeout.count() <= 0) throw Error(status::invalid_argument, "command_timeout must be positive");
    std::string refused;
    auto redact = detail::PgRedactor::make(opts_.url, refused);
    if (!redact) throw Error(status::invalid_argument, "PostgresExecutor: " + refused);
    redact_ = std::move(*redact);
    if (!opts_.log) opts_.log = [](std::string_view m) { std::fprintf(stderr, "leasehold postgres: %.*s\n", int(m.size()), m.data()); };
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) throw std::runtime_error("eventfd failed");
  }
  explicit PostgresExecutor(std::string url) : PostgresExecutor(PostgresOptions{std::move(url), std::chrono::milliseconds{2000}, std::chrono::milliseconds{5000}, {}}) {}
  PostgresExecutor(const PostgresExecutor&) = delete;
  PostgresExecutor& operator=(const PostgresExecutor&) = delete;
  ~PostgresExecutor() override {
    close();
    ::close(wake_fd_);
  }

  // Notifications received on the listener connection (all of them, the core's or not).
  [[nodiscard]] std::uint64_t notifications_received() const noexcept { return notes_.load(); }

  [[nodiscard]] lh_backend_options backend_options() const override {
    auto o = backend_defaults(LH_BACKEND_POSTGRES);
    o.postgres_asynchronous_commit = opts_.asynchronous_commit ? 1 : 0;
    return o;
  }
  void start(Sink sink) override {
    SqlExecutor::start(std::move(sink));
    commands_ = std::thread([this] { command_loop(); });
    listener_ = std::thread([this] { listener_loop(); });
  }
  // Unblocks an in-flight statement (shutdown of its socket) and joins both threads.
  void close() override {
    {
      std::lock_guard g(mu_);
      if (closed_) return;
      closed_ = true;
      if (cmd_fd_ >= 0) ::shutdown(cmd_fd_, SHUT_RDWR);
    }
    cv_.notify_all();
    wake();
    if (commands_.joinable()) commands_.join();
    if (listener_.joinable()) listener_.join();
  }

 private:
  using Clock = leasehold::Clock;

  void submit(IoRequest r) override {
    const bool listener = r.connection == LH_CONNECTION_NOTIFY;
    {
      std::lock_guard g(mu_);
      if (closed_) return;
      (listener ? listen_q_ : cmd_q_).push_back(std::move(r));
    }
    listener ? wake() : cv_.notify_one();
  }
  void wake() const noexcept { [[maybe_unused]] auto n = ::write(wake_fd_, "\1\0\0\0\0\0\0\0", 8); }
  void log(const std::string& m) const noexcept try { opts_.log(redact_(m)); } catch (...) {}
  // Fails request `id` with a message in which no secret of the connection string is left.
  void failed(std::uint64_t id, std::uint32_t kind, const std::string& m) { fail(id, kind, redact_(m)); }
  bool closed() {
    std::lock_guard g(mu_);
    return closed_;
  }

  // Runs the request's statements; rows, or why it failed (a transaction left open is rolled
  // back after a database error; after a transport failure the connection is dropped).
  std::optional<detail::PgFailure> run_statements(PGconn* c, const IoRequest& r, detail::FlatRows& out) const {
    const auto facts = facts_.now();
    const auto deadline = Clock::now() + opts_.command_timeout;
    out.array(r.statements.size());
    for (const auto& s : r.statements) {
      std::vector<std::optional<std::string>> params;
      params.reserve(s.params.size());
      for (const auto& p : s.params) params.push_back(detail::pg_param(p, facts));
      if (auto f = detail::pg_run(c, s.sql, params, deadline, &out)) {
        if (f->kind == LH_FAILURE_DATABASE && PQtransactionStatus(c) != PQTRANS_IDLE)
          detail::pg_run(c, "ROLLBACK", {}, deadline, nullptr);
        if (PQstatus(c) == CONNECTION_BAD) f->kind = LH_FAILURE_TRANSPORT;
        return f;
      }
    }
    return std::nullopt;
  }

  void command_loop() {
    detail::block_sigpipe_in_this_thread();
    detail::PgConn c;
    bool opened = false;
    for (;;) {
      IoRequest r;
      {
        std::unique_lock l(mu_);
        cv_.wait(l, [&] { return closed_ || !cmd_q_.empty(); });
        if (closed_) return;
        r = std::move(cmd_q_.front());
        cmd_q_.pop_front();
      }
      if (!c) {
        std::string err;
        c = detail::pg_connect(opts_, err);
        if (!c) {
          log("commands connection: " + err);
          failed(r.id, LH_FAILURE_TRANSPORT, err);
          continue;
        }
        set_cmd_fd(PQsocket(c.get()));
        // Reported before this request's answer: the core checks the schema again first.
        if (std::exchange(opened, true)) reset(LH_CONNECTION_COMMANDS);
      }
      detail::FlatRows rows;
      if (auto f = run_statements(c.get(), r, rows)) {
        if (f->kind == LH_FAILURE_TRANSPORT) {
          log("commands connection: " + f->message);
          set_cmd_fd(-1);
          c.reset();
        }
        failed(r.id, f->kind, f->message);
      } else {
        answer(r.id, std::move(rows));
      }
      while (c) {  // notifications on this connection are nobody's
        PGnotify* n = PQnotifies(c.get());
        if (n == nullptr) break;
        PQfreemem(n);
      }
    }
  }
  void set_cmd_fd(int fd) {
    std::lock_guard g(mu_);
    cmd_fd_ = fd;
  }

  void listener_loop() {
    detail::block_sigpipe_in_this_thread();
    detail::PgConn c;
    bool opened = false;                      // a listener existed: reopen it when it breaks
    auto retry_at = Clock::time_point::max();  // when to try reopening a broken listener
    auto connect = [&]() -> bool {
      std::string err;
      c = detail::pg_connect(opts_, err);
      if (!c) {
        log("listener connection: " + err);
        listen_error_ = err;
        retry_at = opened ? Clock::now() + std::chrono::milliseconds(500) : Clock::time_point::max();
        return false;
      }
      retry_at = Clock::time_point::max();
      if (std::exchange(opened, true)) reset(LH_CONNECTION_NOTIFY);  // the core LISTENs again
      return true;
    };
    auto broke = [&](const std::string& why) {
      log("listener connection: " + why);
      c.reset();
      retry_at = Clock::now();
    };
    auto deliver = [&] {
      while (c) {
        PGnotify* n = PQnotifies(c.get());
        if (n == nullptr) break;
        ++notes_;
        notification(n->relname != nullptr ? n->relname : "", n->extra != nullptr ? n->extra : "");
        PQfreemem(n);
      }
    };
    for (;;) {
      std::deque<IoRequest> batch;
      {
        std::lock_guard g(mu_);
        if (closed_) return;
        batch.swap(listen_q_);
      }
      for (auto& r : batch) {
        if (!c && !connect()) {
          failed(r.id, LH_FAILURE_TRANSPORT, listen_error_);
          continue;
        }
        detail::FlatRows rows;
        if (auto f = run_statements(c.get(), r, rows)) {
          if (f->kind == LH_FAILURE_TRANSPORT) broke(f->message);
          failed(r.id, f->kind, f->message);
        } else {
          answer(r.id, std::move(rows));
        }
        deliver();
      }
      if (!c && Clock::now() >= retry_at) connect();
      int timeout = -1;
      if (retry_at != Clock::time_point::max())
        timeout = static_cast<int>(std::clamp<long long>(
            std::chrono::duration_cast<std::chrono::milliseconds>(retry_at - Clock::now()).count(), 0, 500));
      pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {c ? PQsocket(c.get()) : -1, POLLIN, 0}};
      if (::poll(fds, 2, timeout) < 0) continue;
      std::uint64_t n = 0;
      if (fds[0].revents != 0) [[maybe_unused]] auto rd = ::read(wake_fd_, &n, sizeof n);
      if (!c || fds[1].revents == 0) continue;
      if (PQconsumeInput(c.get()) == 0 || PQstatus(c.get()) == CONNECTION_BAD) {
        deliver();
        broke(detail::pg_text(PQerrorMessage(c.get())));
        continue;
      }
      deliver();
    }
  }

  PostgresOptions opts_;
  detail::PgRedactor redact_;
  detail::HostFacts facts_;
  int wake_fd_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<IoRequest> cmd_q_, listen_q_;  // guarded by mu_
  int cmd_fd_ = -1;                          // guarded by mu_: shut down by close()
  bool closed_ = false;                      // guarded by mu_
  std::string listen_error_;                 // the listener thread's
  std::atomic<std::uint64_t> notes_{0};
  std::thread commands_, listener_;
};

// The earlier name of PostgresExecutor.
using PostgresTransport = PostgresExecutor;

}  // namespace leasehold
