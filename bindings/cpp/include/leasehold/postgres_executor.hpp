// leasehold/postgres_executor.hpp — the PostgreSQL executor on libpq (link leasehold::postgres).
//
// The core speaks the SQL protocol itself (LH_BACKEND_POSTGRES: the schema,
// its server-side functions, every statement, the meaning of every row, the LISTEN channels;
// docs/sql-protocol.md). Expiry runs on the server's clock and fences come from a table that is
// never reset. This executor owns two connections, each with a thread of its own:
//   commands — runs the core's statements verbatim (one request at a time, each bounded by
//              command_timeout) and hands the rows back unread; an application call's request
//              runs on the calling thread until the call's deadline (execute_for_caller), and
//              what is unanswered then goes on on the commands thread;
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

// Waits until libpq has a whole result: true once it has, false when `until` passed first;
// a failure of the connection is put in `failure` (and true returned).
inline bool pg_wait(PGconn* c, Clock::time_point until, std::optional<PgFailure>& failure) {
  while (PQisBusy(c) != 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{PQsocket(c), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000))) < 0 && errno != EINTR) {
      failure = PgFailure{LH_FAILURE_TRANSPORT, "poll failed"};
      return true;
    }
    if (PQconsumeInput(c) == 0) {
      failure = PgFailure{LH_FAILURE_TRANSPORT, pg_text(PQerrorMessage(c))};
      return true;
    }
  }
  return true;
}

inline bool pg_connection_fault(const char* sqlstate) {
  // 08: connection exceptions; 57P: the server is shutting down or restarting.
  return sqlstate != nullptr && (std::strncmp(sqlstate, "08", 2) == 0 || std::strncmp(sqlstate, "57P", 3) == 0);
}

// Sends one statement with text parameters.
inline std::optional<PgFailure> pg_send(PGconn* c, const std::string& sql, const std::vector<std::optional<std::string>>& params) {
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) values.push_back(p ? p->c_str() : nullptr);
  if (PQsendQueryParams(c, sql.c_str(), static_cast<int>(values.size()), nullptr, values.data(), nullptr, nullptr, 0) == 0)
    return PgFailure{LH_FAILURE_TRANSPORT, pg_text(PQerrorMessage(c))};
  return std::nullopt;
}

// What has been read of a sent statement's results: pg_collect can stop at a caller's
// deadline and go on later, on another thread.
struct PgReading {
  std::optional<PgFailure> failure;
  bool rows_done = false;
};

// Reads the sent statement's results, appending its rows to `out` (when given): true once all
// are in (a failure, if any, is then in `st.failure`), false when `until` passed first.
inline bool pg_collect(PGconn* c, PgReading& st, Clock::time_point until, FlatRows* out) {
  for (;;) {
    std::optional<PgFailure> broken;
    if (!pg_wait(c, until, broken)) return false;
    if (broken) {
      st.failure = std::move(broken);
      return true;
    }
    PgResult r(PQgetResult(c));
    if (!r) break;
    const auto status = PQresultStatus(r.get());
    if (status == PGRES_FATAL_ERROR || status == PGRES_BAD_RESPONSE || status == PGRES_NONFATAL_ERROR) {
      if (status == PGRES_NONFATAL_ERROR) continue;
      if (!st.failure) {
        const char* state = PQresultErrorField(r.get(), PG_DIAG_SQLSTATE);
        const char* msg = PQresultErrorField(r.get(), PG_DIAG_MESSAGE_PRIMARY);
        st.failure = PgFailure{static_cast<std::uint32_t>(pg_connection_fault(state) ? LH_FAILURE_TRANSPORT : LH_FAILURE_DATABASE),
                               pg_text(msg != nullptr ? msg : PQresultErrorMessage(r.get()))};
      }
      continue;
    }
    if (out == nullptr || st.rows_done) continue;
    st.rows_done = true;
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
  if (!st.failure && PQstatus(c) == CONNECTION_BAD) st.failure = PgFailure{LH_FAILURE_TRANSPORT, pg_text(PQerrorMessage(c))};
  if (!st.failure && out != nullptr && !st.rows_done) out->array(0);
  return true;
}

// Runs one statement with text parameters, at most until `deadline`; appends its rows to `out`
// (when given).
inline std::optional<PgFailure> pg_run(PGconn* c, const std::string& sql, const std::vector<std::optional<std::string>>& params,
                                       Clock::time_point deadline, FlatRows* out) {
  if (auto f = pg_send(c, sql, params)) return f;
  PgReading st;
  if (!pg_collect(c, st, deadline, out)) return PgFailure{LH_FAILURE_TRANSPORT, "no answer within the command timeout"};
  return st.failure;
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
  // A commands request waits for run_pending() on the caller's thread (no hop to ours).
  void execute_for_caller(IoRequest r) override {
    if (r.kind != LH_IO_SQL || r.connection == LH_CONNECTION_NOTIFY) return execute(std::move(r));
    std::lock_guard g(mu_);
    if (!closed_) cmd_q_.push_back(std::move(r));
  }
  void run_pending() noexcept override { run_pending_until(Clock::time_point::max()); }
  // The queued commands requests run on the calling thread until `deadline`; a statement still
  // unanswered then is read on by the commands thread, which answers it (and runs the rest) as
  // it does its own. While another thread holds the connection, this thread waits for it (the
  // answer cannot come sooner). Opening the connection is the commands thread's: it is not
  // bounded by a caller's deadline.
  void run_pending_until(Clock::time_point deadline) noexcept override {
    std::deque<IoRequest> batch;
    {
      std::unique_lock l(mu_);
      const auto ready = [&] { return closed_ || cmd_q_.empty() || !cmd_busy_; };
      if (deadline == Clock::time_point::max()) {
        free_cv_.wait(l, ready);
      } else {
        free_cv_.wait_until(l, deadline, ready);
      }
      if (closed_ || cmd_q_.empty()) return;  // taken with another batch: answered there
      if (cmd_busy_ || !cmd_conn_ || Clock::now() >= deadline) {
        cmd_wanted_ = true;  // the commands thread runs it
        return work_cv_.notify_one();
      }
      cmd_busy_ = true;  // cmd_conn_ is this thread's until it clears it
      cmd_wanted_ = false;
      batch.swap(cmd_q_);
    }
    free_cv_.notify_all();  // other callers whose requests this batch took
    // No SIGPIPE scope: libpq sends with MSG_NOSIGNAL, and blocks SIGPIPE itself around TLS writes.
    std::optional<InFlight> left;
    while (!batch.empty() && cmd_conn_) {  // after a broken connection the commands thread reopens it
      InFlight f = begin(std::move(batch.front()));
      batch.pop_front();
      if (!advance(f, deadline)) {
        left = std::move(f);
        break;
      }
    }
    bool work = false;
    {
      std::lock_guard g(mu_);
      if (!batch.empty()) {
        for (auto it = batch.rbegin(); it != batch.rend(); ++it) cmd_q_.push_front(std::move(*it));
        cmd_wanted_ = true;
      }
      if (left && !closed_) {
        handoff_ = std::move(left);  // cmd_busy_ (cmd_conn_) passes to the commands thread with it
      } else {
        cmd_busy_ = false;
      }
      work = handoff_ || (cmd_wanted_ && !cmd_q_.empty());
    }
    // Only when it has work: waking the commands thread for nothing costs two context switches.
    if (work) work_cv_.notify_one();
    free_cv_.notify_all();  // a caller or close() may wait for the connection
  }
  // Unblocks an in-flight statement (shutdown of its socket), joins both threads and waits for
  // an application thread's statement (unblocked too).
  void close() override {
    {
      std::lock_guard g(mu_);
      if (closed_) return;
      closed_ = true;
      if (cmd_fd_ >= 0) ::shutdown(cmd_fd_, SHUT_RDWR);
    }
    work_cv_.notify_all();
    free_cv_.notify_all();
    wake();
    if (commands_.joinable()) commands_.join();
    if (listener_.joinable()) listener_.join();
    std::unique_lock l(mu_);
    if (handoff_) handoff_.reset(), cmd_busy_ = false;  // left unanswered, as in-flight requests are
    free_cv_.wait(l, [&] { return !cmd_busy_; });
    cmd_conn_.reset();
  }

 private:
  using Clock = leasehold::Clock;

  void submit(IoRequest r) override {
    const bool listener = r.connection == LH_CONNECTION_NOTIFY;
    {
      std::lock_guard g(mu_);
      if (closed_) return;
      (listener ? listen_q_ : cmd_q_).push_back(std::move(r));
      if (!listener) cmd_wanted_ = true;
    }
    listener ? wake() : work_cv_.notify_one();
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

  // One commands request and how far it went on cmd_conn_: an application thread whose
  // deadline passed with a statement unanswered hands it to the commands thread, which reads on.
  struct InFlight {
    IoRequest request;
    detail::HostFacts facts;     // read once, when it starts
    Clock::time_point deadline;  // command_timeout from its start
    detail::FlatRows rows;
    std::size_t next = 0;  // the statement running (or to send)
    bool sent = false;     // `next` is sent, its results not all read
    detail::PgReading reading;
  };
  InFlight begin(IoRequest r) const {
    InFlight f;
    f.request = std::move(r);
    f.facts = facts_.now();
    f.deadline = Clock::now() + opts_.command_timeout;
    f.rows.array(f.request.statements.size());
    return f;
  }
  // Runs `f` on cmd_conn_ (the calling thread holds cmd_busy_): true once it is answered or
  // failed, false when `until` passed first (it goes on from there later).
  bool advance(InFlight& f, Clock::time_point until) {
    PGconn* c = cmd_conn_.get();
    while (f.next < f.request.statements.size()) {
      if (!f.sent) {
        if (Clock::now() >= until) return false;
        const auto& s = f.request.statements[f.next];
        std::vector<std::optional<std::string>> params;
        params.reserve(s.params.size());
        for (const auto& p : s.params) params.push_back(detail::pg_param(p, f.facts));
        if (auto e = detail::pg_send(c, s.sql, params)) return finish_failed(f, std::move(*e));
        f.sent = true;
        f.reading = {};
      }
      if (!detail::pg_collect(c, f.reading, std::min(until, f.deadline), &f.rows)) {
        if (until < f.deadline && Clock::now() < f.deadline) return false;  // the caller's bound, not the command's
        return finish_failed(f, {LH_FAILURE_TRANSPORT, "no answer within the command timeout"});
      }
      if (f.reading.failure) return finish_failed(f, std::move(*f.reading.failure));
      f.sent = false;
      ++f.next;
    }
    answer(f.request.id, std::move(f.rows));
    drop_notifications();
    return true;
  }
  // A database error rolls the open transaction back; a broken connection is dropped (the
  // commands thread opens it again for the next request).
  bool finish_failed(InFlight& f, detail::PgFailure e) {
    PGconn* c = cmd_conn_.get();
    if (e.kind == LH_FAILURE_DATABASE && PQtransactionStatus(c) != PQTRANS_IDLE)
      detail::pg_run(c, "ROLLBACK", {}, f.deadline, nullptr);
    if (PQstatus(c) == CONNECTION_BAD) e.kind = LH_FAILURE_TRANSPORT;
    if (e.kind == LH_FAILURE_TRANSPORT) {
      log("commands connection: " + e.message);
      set_cmd_fd(-1);
      cmd_conn_.reset();
    } else {
      drop_notifications();
    }
    failed(f.request.id, e.kind, e.message);
    return true;
  }
  void drop_notifications() {  // notifications on the commands connection are nobody's
    while (PGnotify* n = PQnotifies(cmd_conn_.get())) PQfreemem(n);
  }
  bool open_commands(std::uint64_t id) {
    std::string err;
    auto c = detail::pg_connect(opts_, err);
    if (!c) {
      log("commands connection: " + err);
      failed(id, LH_FAILURE_TRANSPORT, err);
      return false;
    }
    set_cmd_fd(PQsocket(c.get()));
    cmd_conn_ = std::move(c);
    // Reported before this request's answer: the core checks the schema again first.
    if (std::exchange(cmd_opened_, true)) reset(LH_CONNECTION_COMMANDS);
    return true;
  }

  void command_loop() {
    detail::block_sigpipe_in_this_thread();
    for (;;) {
      std::optional<InFlight> resumed;
      std::deque<IoRequest> batch;
      {
        std::unique_lock l(mu_);
        // Requests queued for a caller (execute_for_caller) are left to it: it runs them next.
        work_cv_.wait(l, [&] { return closed_ || handoff_ || (cmd_wanted_ && !cmd_q_.empty() && !cmd_busy_); });
        if (closed_) return;
        if (handoff_) {
          resumed = std::move(handoff_);  // cmd_busy_ came with it
          handoff_.reset();
        } else {
          cmd_busy_ = true;
          cmd_wanted_ = false;
          batch.swap(cmd_q_);
        }
      }
      free_cv_.notify_all();  // callers whose requests it took stop waiting for the connection
      if (resumed) advance(*resumed, Clock::time_point::max());
      for (auto& r : batch) {
        if (closed()) break;  // unanswered, as in-flight requests are
        if (!cmd_conn_ && !open_commands(r.id)) continue;
        InFlight f = begin(std::move(r));
        advance(f, Clock::time_point::max());
      }
      std::lock_guard g(mu_);
      cmd_busy_ = false;
      free_cv_.notify_all();  // close(), or a caller, may wait for the connection
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
  std::condition_variable work_cv_;  // the commands thread waits here for requests or a handoff
  std::condition_variable free_cv_;  // callers and close() wait here for the commands connection
  std::deque<IoRequest> cmd_q_, listen_q_;  // guarded by mu_
  int cmd_fd_ = -1;                          // guarded by mu_: shut down by close()
  bool closed_ = false;                      // guarded by mu_
  bool cmd_busy_ = false;                    // guarded by mu_: a thread runs requests on cmd_conn_
  bool cmd_wanted_ = false;                  // guarded by mu_: cmd_q_ is the commands thread's to run
  std::optional<InFlight> handoff_;          // guarded by mu_: a caller's request for the commands thread
  detail::PgConn cmd_conn_;                  // the thread's that set cmd_busy_
  bool cmd_opened_ = false;                  // likewise: a commands connection existed (report reopenings)
  std::string listen_error_;                 // the listener thread's
  std::atomic<std::uint64_t> notes_{0};
  std::thread commands_, listener_;
};

// The earlier name of PostgresExecutor.
using PostgresTransport = PostgresExecutor;

}  // namespace leasehold
