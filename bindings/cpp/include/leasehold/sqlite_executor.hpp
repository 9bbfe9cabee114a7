// leasehold/sqlite_executor.hpp — the SQLite executor on libsqlite3 (link leasehold::sqlite).
//
// The core speaks the SQL protocol itself (LH_BACKEND_SQLITE: the schema and
// its migration, every statement, the meaning of every row; docs/sql-protocol.md). This
// executor runs the core's statements verbatim on one connection to the file, on one thread,
// binds the host facts (CLOCK_MONOTONIC, the wall clock, the boot id, the pid, the host name)
// and hands every row back unread. Processes of one host share the file (and share it with the
// other bindings' executors). Before each request it compares the file at the path with the one
// it opened (device and inode): a deleted or replaced file is followed, the request that found
// it fails and the core checks the schema again on the new file. A file that stays locked is a
// database error after the busy timeout, never a hang. One SQLiteExecutor per LockClient.
//
// The file holds lock names, pids, host names and tokens: a missing file is created 0600 whatever
// the umask (its directory must exist, except for default_sqlite_path(), whose missing
// directories are created 0700; SQLite gives the -wal and -shm files the file's mode, and laxer
// ones this user owns are tightened), a symbolic link at the path is refused rather than
// followed, and an existing file or directory that another user owns or may write (the file: or
// read) is reported through SqliteOptions::log. The directory is trusted.
#pragma once

#include <leasehold.hpp>
#include <leasehold/detail/sql_executor.hpp>

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace leasehold {

struct SqliteOptions {
  std::string path;                               // the database file (created when missing)
  std::chrono::milliseconds busy_timeout{5000};   // a file locked longer: a database error
  LogFn log;                                      // open failures and database errors; default: stderr
};

// The embedded default lock file the Python package and the leasehold CLI use, so every program
// of a user on one host shares it: $XDG_CACHE_HOME/leasehold/locks.sqlite3, or
// ~/.cache/leasehold/locks.sqlite3 when XDG_CACHE_HOME is unset or relative. Its directory may
// not exist yet: a SQLiteExecutor on this path creates it (0700) with the file (0600).
// std::runtime_error when neither variable gives a directory.
inline std::filesystem::path default_sqlite_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  std::filesystem::path cache = xdg != nullptr ? std::filesystem::path(xdg) : std::filesystem::path();
  if (!cache.is_absolute()) {
    const char* home = std::getenv("HOME");
    if (home == nullptr || *home == '\0') throw std::runtime_error("neither XDG_CACHE_HOME nor HOME is set");
    cache = std::filesystem::path(home) / ".cache";
  }
  return cache / "leasehold" / "locks.sqlite3";
}


namespace detail {

// The identity and permission bits of the lock file as checked before SQLite opens it.
struct SqliteFile {
  dev_t dev{};
  ino_t ino{};
  mode_t mode{};
};

// What about an existing file or directory would let another user read or rewrite the locks. A
// directory owned by root, or sticky (like /tmp), does not let others replace the file.
inline void sqlite_exposure(const struct stat& st, const char* what, const std::string& path, bool dir,
                            std::vector<std::string>& warnings) {
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  const std::string lead = std::string("the lock ") + what + " " + path;
  if (st.st_uid != ::geteuid() && !(dir && st.st_uid == 0))
    warnings.push_back(lead + " is owned by another user (uid " + std::to_string(st.st_uid) + ")");
  if ((st.st_mode & 022) != 0 && !(dir && (st.st_mode & S_ISVTX) != 0))
    warnings.push_back(lead + " is writable by other users (mode " + mode + ")");
  else if (!dir && (st.st_mode & 004) != 0)
    warnings.push_back(lead + " is readable by other users (mode " + mode + ")");
}

// Closing a descriptor drops every POSIX lock this process holds on the file, so no transport of
// this process may open a file between its creation and that close.
inline std::mutex& sqlite_create_mutex() {
  static std::mutex m;
  return m;
}

// Creates the file (0600 whatever the umask) when missing, and with `mkdir` its missing
// directories (0700), without following a link at the path; an existing file is never opened
// here (that close would drop SQLite's locks on it). The file's identity, or nullopt and why.
inline std::optional<SqliteFile> prepare_sqlite_file(const std::string& path, bool mkdir, std::string& error,
                                                     std::vector<std::string>& warnings) {
  const auto fail = [&](const std::string& why) {
    error = "cannot open " + path + ": " + why;
    return std::nullopt;
  };
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  if (mkdir) {
    for (std::size_t at = dir.find('/', 1);; at = dir.find('/', at + 1)) {
      const std::string prefix = dir.substr(0, at);
      if (::mkdir(prefix.c_str(), 0700) == 0) ::chmod(prefix.c_str(), 0700);  // whatever the umask
      else if (errno != EEXIST) return fail("unable to open database file (cannot create " + prefix + ": " + std::strerror(errno) + ")");
      if (at == std::string::npos) break;
    }
  }
  bool created = false;
  int err = 0;
  {
    std::lock_guard g(sqlite_create_mutex());
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    err = errno;
    created = fd >= 0;
    if (created && ::fchmod(fd, 0600) != 0) err = errno, created = false;
    if (fd >= 0) ::close(fd);
    if (created) err = 0;
  }
  struct stat st{};
  if ((err != 0 && err != EEXIST) || ::lstat(path.c_str(), &st) != 0)
    return fail(std::string("unable to open database file (") + std::strerror(err != 0 ? err : errno) + ")");
  if (S_ISLNK(st.st_mode))
    return fail("it is a symbolic link; leasehold does not follow links to its lock file (give the target's path)");
  if (!S_ISREG(st.st_mode)) return fail("not a regular file");
  struct stat ds{};
  if (::stat(dir.c_str(), &ds) == 0) sqlite_exposure(ds, "directory", dir, true, warnings);
  if (!created) sqlite_exposure(st, "file", path, false, warnings);
  return SqliteFile{st.st_dev, st.st_ino, static_cast<mode_t>(st.st_mode & 0777)};
}

// Gives this user's -wal and -shm files no permission the lock file lacks: SQLite sets their mode
// only when it creates them. By path: a descriptor's close would drop SQLite's locks on them.
inline void tighten_sqlite_sidecars(const std::string& path, mode_t mode) {
  for (const char* suffix : {"-wal", "-shm"}) {
    const std::string p = path + suffix;
    struct stat st{};
    if (::lstat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 0777 & ~mode) != 0)
      ::chmod(p.c_str(), st.st_mode & 0777 & mode);
  }
}

// Whether `path` names default_sqlite_path() (whose directory the transport creates).
inline bool is_default_sqlite_path(const std::string& path) {
  try {
    namespace fs = std::filesystem;
    return fs::absolute(path).lexically_normal() == fs::absolute(default_sqlite_path()).lexically_normal();
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace detail

class SQLiteExecutor final : public detail::SqlExecutor {
  struct DbClose {
    void operator()(sqlite3* db) const noexcept { sqlite3_close(db); }
  };
  struct StmtFinalize {
    void operator()(sqlite3_stmt* st) const noexcept { sqlite3_finalize(st); }
  };
  using Db = std::unique_ptr<sqlite3, DbClose>;
  using Stmt = std::unique_ptr<sqlite3_stmt, StmtFinalize>;

 public:
  explicit SQLiteExecutor(SqliteOptions options) : opts_(std::move(options)), facts_(detail::HostFacts::stable()) {
    if (opts_.path.empty()) throw Error(status::invalid_argument, "SQLiteExecutor needs a path");
    if (opts_.busy_timeout.count() <= 0) throw Error(status::invalid_argument, "busy_timeout must be positive");
    if (!opts_.log) opts_.log = [](std::string_view m) { std::fprintf(stderr, "leasehold sqlite: %.*s\n", int(m.size()), m.data()); };
    mkdir_ = detail::is_default_sqlite_path(opts_.path);
  }
  explicit SQLiteExecutor(std::string path) : SQLiteExecutor(SqliteOptions{std::move(path), std::chrono::milliseconds{5000}, {}}) {}
  SQLiteExecutor(const SQLiteExecutor&) = delete;
  SQLiteExecutor& operator=(const SQLiteExecutor&) = delete;
  ~SQLiteExecutor() override { close(); }

  [[nodiscard]] const std::string& path() const noexcept { return opts_.path; }

  [[nodiscard]] lh_backend_options backend_options() const override {
    auto o = backend_defaults(LH_BACKEND_SQLITE);
    o.sqlite_busy_timeout_ms = static_cast<std::uint64_t>(opts_.busy_timeout.count());
    return o;
  }
  void start(Sink sink) override {
    SqlExecutor::start(std::move(sink));
    worker_ = std::thread([this] { run(); });
  }
  void close() override {
    {
      std::lock_guard g(mu_);
      if (closed_) return;
      closed_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

 private:
  void submit(IoRequest r) override {
    {
      std::lock_guard g(mu_);
      if (closed_) return;
      queue_.push_back(std::move(r));
    }
    cv_.notify_one();
  }
  void log(const std::string& m) const noexcept try { opts_.log(m); } catch (...) {}

  // Opens the file (created if missing, see the top) and remembers which file it is.
  bool open() {
    db_.reset();
    std::vector<std::string> warnings;
    const auto file = detail::prepare_sqlite_file(opts_.path, mkdir_, open_error_, warnings);
    for (const auto& w : warnings) log(w);
    if (!file) {
      log(open_error_);
      return false;
    }
    // Without SQLITE_OPEN_CREATE: SQLite never creates the file (it would follow a link put at
    // the path since it was checked); the identity check below sees such a swap.
    sqlite3* raw = nullptr;
    const int rc = sqlite3_open_v2(opts_.path.c_str(), &raw, SQLITE_OPEN_READWRITE, nullptr);
    Db db(raw);
    struct stat st{};
    if (rc != SQLITE_OK) {
      open_error_ = std::string("cannot open ") + opts_.path + ": " + (db ? sqlite3_errmsg(db.get()) : sqlite3_errstr(rc));
      log(open_error_);
      return false;
    }
    if (::lstat(opts_.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != file->dev || st.st_ino != file->ino) {
      open_error_ = "cannot open " + opts_.path + ": the file was replaced while it was opened";
      log(open_error_);
      return false;
    }
    detail::tighten_sqlite_sidecars(opts_.path, file->mode);
    dev_ = st.st_dev;
    ino_ = st.st_ino;
    db_ = std::move(db);
    return true;
  }
  // What is at the path itself: a link put in the file's place is a replacement, not followed.
  bool same_file() const {
    struct stat st{};
    return db_ && ::lstat(opts_.path.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_;
  }

  void run() {
    for (;;) {
      IoRequest r;
      {
        std::unique_lock l(mu_);
        cv_.wait(l, [&] { return closed_ || !queue_.empty(); });
        if (closed_) return;
        r = std::move(queue_.front());
        queue_.pop_front();
      }
      if (!same_file()) {
        // First use, a failed open, or the file at the path was deleted or replaced: follow the
        // path. The request did not run; a reopened connection gets the schema checked again.
        const bool had = opened_;
        if (!open()) {
          fail(r.id, LH_FAILURE_TRANSPORT, open_error_);
          continue;
        }
        opened_ = true;
        if (had) {
          fail(r.id, LH_FAILURE_TRANSPORT, "the database file was replaced or could not be opened");
          reset(LH_CONNECTION_COMMANDS);
          continue;
        }
      }
      FlatRows rows;
      if (auto err = run_statements(r, rows)) {
        if (sqlite3_get_autocommit(db_.get()) == 0) sqlite3_exec(db_.get(), "ROLLBACK", nullptr, nullptr, nullptr);
        fail(r.id, LH_FAILURE_DATABASE, std::move(*err));
      } else {
        answer(r.id, std::move(rows));
      }
    }
  }
  using FlatRows = detail::FlatRows;

  void bind(sqlite3_stmt* st, int i, const SqlParam& p, const detail::HostFacts& f) const {
    switch (p.kind) {
      case LH_VALUE_INT: sqlite3_bind_int64(st, i, p.integer); break;
      case LH_VALUE_TEXT: sqlite3_bind_text(st, i, p.bytes.data(), static_cast<int>(p.bytes.size()), SQLITE_TRANSIENT); break;
      case LH_VALUE_BULK: sqlite3_bind_blob(st, i, p.bytes.data(), static_cast<int>(p.bytes.size()), SQLITE_TRANSIENT); break;
      case LH_PARAM_HOST_MONOTONIC_NS: sqlite3_bind_int64(st, i, f.monotonic_ns); break;
      case LH_PARAM_HOST_WALL_US: sqlite3_bind_int64(st, i, f.wall_us); break;
      case LH_PARAM_HOST_BOOT_ID: sqlite3_bind_text(st, i, f.boot_id.c_str(), -1, SQLITE_TRANSIENT); break;
      case LH_PARAM_HOST_PID: sqlite3_bind_int64(st, i, f.pid); break;
      case LH_PARAM_HOST_NAME: sqlite3_bind_text(st, i, f.host.c_str(), -1, SQLITE_TRANSIENT); break;
      default: sqlite3_bind_null(st, i); break;
    }
  }

  // Runs every statement; the error message of the first that fails, else nullopt.
  std::optional<std::string> run_statements(const IoRequest& r, FlatRows& out) const {
    const auto facts = facts_.now();
    sqlite3* db = db_.get();
    out.array(r.statements.size());
    for (const auto& s : r.statements) {
      sqlite3_stmt* raw = nullptr;
      if (sqlite3_prepare_v2(db, s.sql.c_str(), static_cast<int>(s.sql.size()), &raw, nullptr) != SQLITE_OK)
        return std::string(sqlite3_errmsg(db));
      Stmt st(raw);
      for (std::size_t i = 0; i < s.params.size(); ++i) bind(st.get(), static_cast<int>(i) + 1, s.params[i], facts);
      const auto rows_at = out.array();
      std::uint64_t nrows = 0;
      int rc = SQLITE_OK;
      while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
        const int ncols = sqlite3_column_count(st.get());
        out.array(static_cast<std::uint64_t>(ncols));
        for (int c = 0; c < ncols; ++c) {
          switch (sqlite3_column_type(st.get(), c)) {
            case SQLITE_INTEGER: out.integer(sqlite3_column_int64(st.get(), c)); break;
            case SQLITE_FLOAT: out.real(sqlite3_column_double(st.get(), c)); break;
            case SQLITE_TEXT: {
              const auto* t = sqlite3_column_text(st.get(), c);
              out.text(t, static_cast<std::size_t>(sqlite3_column_bytes(st.get(), c)));
              break;
            }
            case SQLITE_BLOB: {
              const auto* b = sqlite3_column_blob(st.get(), c);
              out.blob(b, static_cast<std::size_t>(sqlite3_column_bytes(st.get(), c)));
              break;
            }
            default: out.nil(); break;
          }
        }
        ++nrows;
      }
      if (rc != SQLITE_DONE) return std::string(sqlite3_errmsg(db));
      out.set_len(rows_at, nrows);
    }
    return std::nullopt;
  }

  SqliteOptions opts_;
  bool mkdir_ = false;  // the default file: its missing directories are created
  detail::HostFacts facts_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<IoRequest> queue_;  // guarded by mu_
  bool closed_ = false;           // guarded by mu_
  // The worker thread's own:
  Db db_;
  dev_t dev_{};
  ino_t ino_{};
  bool opened_ = false;
  std::string open_error_;
  std::thread worker_;
};

// The same stem as SqliteOptions, and the earlier name.
using SqliteExecutor = SQLiteExecutor;
using SqliteTransport = SQLiteExecutor;

}  // namespace leasehold
