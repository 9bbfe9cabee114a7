// SQLiteExecutor on real SQLite files: several OS processes contend on one file, the file is
// deleted or replaced under a client, and bad files (foreign table, corrupt, locked, missing
// directory) give a clear error and never a grant. The file is private (0600 whatever the umask,
// the default file's directories 0700), a link at the path is refused without touching its
// target, and an exposed file or directory is reported.
#include <leasehold.hpp>
#include <leasehold/memory_executor.hpp>
#include <leasehold/sqlite_executor.hpp>

#include <gtest/gtest.h>

#include "server_test_util.hpp"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>

using namespace std::chrono_literals;
using leasehold::ClientOptions;
using leasehold::LockClient;
using leasehold::SqliteOptions;
using leasehold::SQLiteExecutor;
using namespace leasehold_test;

namespace {

std::string g_dir;

class Sqlite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::signal(SIGPIPE, SIG_IGN);
    if (g_dir.empty()) g_dir = temp_dir("sqlite");
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    std::filesystem::remove_all(g_dir, ec);
  }
  static std::string file(const std::string& name) { return g_dir + "/" + name; }
  static std::shared_ptr<SQLiteExecutor> transport(const std::string& path, std::chrono::milliseconds busy = 5000ms) {
    SqliteOptions o;
    o.path = path;
    o.busy_timeout = busy;
    o.log = [](std::string_view) {};
    return std::make_shared<SQLiteExecutor>(o);
  }
  // failing: the client gives up on a refused backend sooner (each acquire retries a transport
  // error for one request timeout, and close() waits for the uncertain attempt's cleanup).
  static ClientOptions quiet(bool failing = false) {
    ClientOptions o;
    o.close_timeout = failing ? 500ms : 5s;
    if (failing) o.config.request_timeout_ns = 500'000'000;
    o.log = [](std::string_view) {};
    return o;
  }
  // Runs SQL on the file directly (the test's own connection).
  static std::string query(const std::string& path, const std::string& sql) {
    sqlite3* db = nullptr;
    sqlite3_open(path.c_str(), &db);
    sqlite3_busy_timeout(db, 5000);
    std::string out;
    char* err = nullptr;
    sqlite3_exec(
        db, sql.c_str(),
        [](void* o, int n, char** v, char**) {
          auto* s = static_cast<std::string*>(o);
          for (int i = 0; i < n; ++i) *s += (v[i] ? v[i] : "NULL"), *s += i + 1 < n ? "|" : "\n";
          return 0;
        },
        &out, &err);
    if (err != nullptr) out = std::string("error: ") + err, sqlite3_free(err);
    sqlite3_close(db);
    while (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  }
};

// The Python package's and the CLI's default file: under an absolute XDG_CACHE_HOME, else under
// ~/.cache (a relative XDG_CACHE_HOME is ignored); neither set is an error. Environment restored.
TEST(SqliteDefaultPath, FollowsXdgCacheHomeThenHome) {
  auto saved = [](const char* k) { const char* v = std::getenv(k); return v ? std::optional<std::string>(v) : std::nullopt; };
  const auto xdg = saved("XDG_CACHE_HOME"), home = saved("HOME");
  ::setenv("HOME", "/home/u", 1);
  ::setenv("XDG_CACHE_HOME", "/var/cache/u", 1);
  EXPECT_EQ(leasehold::default_sqlite_path(), "/var/cache/u/leasehold/locks.sqlite3");
  ::setenv("XDG_CACHE_HOME", "relative", 1);
  EXPECT_EQ(leasehold::default_sqlite_path(), "/home/u/.cache/leasehold/locks.sqlite3");
  ::unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(leasehold::default_sqlite_path(), "/home/u/.cache/leasehold/locks.sqlite3");
  ::unsetenv("HOME");
  EXPECT_THROW(leasehold::default_sqlite_path(), std::runtime_error);
  for (const auto& [k, v] : {std::pair{"XDG_CACHE_HOME", xdg}, std::pair{"HOME", home}})
    v ? ::setenv(k, v->c_str(), 1) : ::unsetenv(k);
}

TEST_F(Sqlite, LifecycleOnARealFile) {
  const auto path = file("life.db");

  LockClient a(transport(path), quiet());
  LockClient b(transport(path), quiet());
  std::uint64_t fence = 0;
  {
    auto lease = a.acquire("life", 5s);
    ASSERT_TRUE(lease.has_value()) << a.last_backend_error();
    fence = lease->fencing_token();
    EXPECT_GT(fence, 0u);
    EXPECT_EQ(query(path, "SELECT count(*) FROM leasehold_locks WHERE name = 'life'"), "1");
    EXPECT_EQ(query(path, "SELECT pid FROM leasehold_locks WHERE name = 'life'"), std::to_string(::getpid()));
    EXPECT_FALSE(b.acquire("life", 5s).has_value());  // held by a
    const auto st = b.status("life");
    EXPECT_TRUE(st.ok) << st.error;
    EXPECT_TRUE(st.held);
    EXPECT_EQ(st.fencing_token, fence);
    EXPECT_EQ(st.holder_pid, ::getpid());
    EXPECT_GT(st.remaining_ttl_ms, 0u);
    EXPECT_LE(st.remaining_ttl_ms, 5000u);
    EXPECT_FALSE(st.holder_host.empty());
    EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Released);
  }
  const auto free = a.status("life");
  EXPECT_TRUE(free.ok) << free.error;
  EXPECT_FALSE(free.held);
  EXPECT_EQ(free.last_fencing_token, fence);
  EXPECT_THROW((void)a.status(""), leasehold::Error);
  EXPECT_EQ(query(path, "SELECT count(*) FROM leasehold_locks WHERE name = 'life'"), "0");
  auto next = b.acquire("life", 1500ms);
  ASSERT_TRUE(next.has_value());
  EXPECT_GT(next->fencing_token(), fence);
  // Renewals keep it past its TTL.
  ASSERT_TRUE(eventually([&] { return b.counters().renewals_ok >= 2 || next->lost(); }, 20s));
  EXPECT_FALSE(next->lost());
  EXPECT_FALSE(a.acquire("life", 5s).has_value());
  EXPECT_TRUE(b.last_backend_error().empty()) << b.last_backend_error();
}

// A waiter retries at the holder's expiry or by backoff (SQLite has no notifications) and
// gets the lock once it is released.
TEST_F(Sqlite, WaiterGetsTheLockAfterRelease) {
  const auto path = file("wait.db");
  LockClient a(transport(path), quiet());
  LockClient b(transport(path), quiet());
  auto held = a.acquire("w", 5s);
  ASSERT_TRUE(held.has_value());
  std::optional<leasehold::Lease> got;
  std::thread waiter([&] {
    leasehold::AcquireOptions o;
    o.wait = 20s;
    got = b.acquire("w", 5s, std::move(o));
  });
  std::this_thread::sleep_for(200ms);
  const auto old = held->fencing_token();
  held->release();
  waiter.join();
  ASSERT_TRUE(got.has_value());
  EXPECT_GT(got->fencing_token(), old);
}

// Several OS processes contend for one name on one file: one holder at a time, fences strictly
// increasing in grant order.
TEST_F(Sqlite, ProcessesContendFencesStrictlyIncrease) {
  const auto path = file("procs.db"), log = file("procs.log");
  constexpr int kWorkers = 3, kIters = 15;
  const auto done = contend({LEASEHOLD_PAUSE_WORKER, "sqlite", path}, kWorkers,
                            "contend procs " + std::to_string(kIters) + " 5000 30000 " + log, 120s);
  for (auto n : done) EXPECT_EQ(n, kIters);
  const auto entries = read_log(log);
  EXPECT_EQ(entries.size(), 2u * kWorkers * kIters);
  check_log(entries, true);
}

// The file is deleted under a holder: the client follows the path to the new file, and the new
// file's fences, minted from the wall clock, are still above the lost ones. The old holder's
// next renewal is rejected: its lease is lost.
TEST_F(Sqlite, DeletedFileIsFollowedAndFencesDoNotRegress) {
  const auto path = file("gone.db");
  LockClient a(transport(path), quiet());
  std::atomic<int> lost{0};
  leasehold::AcquireOptions o;
  o.on_lost = [&](leasehold::LostReason) { ++lost; };
  auto held = a.acquire("gone", 1500ms, std::move(o));
  ASSERT_TRUE(held.has_value());
  const auto old = held->fencing_token();
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
  LockClient b(transport(path), quiet());
  std::optional<leasehold::Lease> again;
  ASSERT_TRUE(eventually([&] { return (again = b.acquire("gone", 5s)).has_value(); }, 20s)) << b.last_backend_error();
  EXPECT_GT(again->fencing_token(), old);
  EXPECT_TRUE(eventually([&] { return held->lost(); }, 20s));
  EXPECT_TRUE(eventually([&] { return lost.load() == 1; }, 20s));  // on the callback thread
  EXPECT_TRUE(held->stop_token().stop_requested());
  // The first client works on the new file too.
  auto other = a.acquire("other", 5s);
  EXPECT_TRUE(other.has_value()) << a.last_backend_error();
}

// A table of the same name that is not ours is refused with a clear error, and nothing is
// written to it.
TEST_F(Sqlite, ForeignTableIsAClearErrorNeverAGrant) {
  const auto path = file("foreign.db");
  query(path, "CREATE TABLE leasehold_locks (name TEXT PRIMARY KEY, owner INTEGER)");
  LockClient a(transport(path), quiet(true));
  EXPECT_FALSE(a.acquire("n", 5s).has_value());
  EXPECT_NE(a.last_backend_error().find("leasehold_locks"), std::string::npos) << a.last_backend_error();
  EXPECT_EQ(a.counters().grants, 0u);
  EXPECT_EQ(query(path, "SELECT count(*) FROM leasehold_locks"), "0");
}

TEST_F(Sqlite, CorruptFileAndMissingDirectoryAreClearErrors) {
  const auto path = file("corrupt.db");
  {
    std::ofstream f(path);
    for (int i = 0; i < 64; ++i) f << "this is not an SQLite database, just text; ";
  }
  LockClient a(transport(path), quiet(true));
  EXPECT_FALSE(a.acquire("n", 5s).has_value());
  EXPECT_NE(a.last_backend_error().find("not a database"), std::string::npos) << a.last_backend_error();
  EXPECT_EQ(a.counters().grants, 0u);

  LockClient b(transport(file("no/such/dir/x.db")), quiet(true));
  EXPECT_FALSE(b.acquire("n", 5s).has_value());
  EXPECT_NE(b.last_backend_error().find("unable to open"), std::string::npos) << b.last_backend_error();
}

// The permission bits of `path` (not following a link), -1 when it is missing.
int mode_of(const std::string& path) {
  struct stat st{};
  return ::lstat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
}

// Log lines of a transport, for the tests that read its warnings.
struct Captured {
  std::mutex mu;
  std::vector<std::string> lines;
  std::string joined() {
    std::lock_guard g(mu);
    std::string all;
    for (const auto& l : lines) all += l + "\n";
    return all;
  }
};

std::shared_ptr<SQLiteExecutor> logging_transport(const std::string& path, const std::shared_ptr<Captured>& out) {
  SqliteOptions o;
  o.path = path;
  o.log = [out](std::string_view m) {
    std::lock_guard g(out->mu);
    out->lines.emplace_back(m);
  };
  return std::make_shared<SQLiteExecutor>(o);
}

// A missing file is created 0600 whatever the umask; SQLite's -wal and -shm follow its mode, and
// laxer ones left behind by an older file are tightened.
TEST_F(Sqlite, NewFileIsPrivateWhateverTheUmask) {
  const auto dir = file("private");
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  const auto path = dir + "/locks.sqlite3";
  for (const bool laxer : {false, true}) {
    SCOPED_TRACE(laxer ? "laxer -wal and -shm left behind" : "fresh");
    if (laxer) {
      std::filesystem::remove(path);
      for (const char* suffix : {"-wal", "-shm"}) {
        std::ofstream(path + suffix).flush();  // empty: SQLite accepts them
        ::chmod((path + suffix).c_str(), 0644);
      }
    }
    const mode_t old = ::umask(laxer ? 022 : 0277);
    {
      LockClient a(transport(path), quiet());
      auto lease = a.acquire("private", 5s);
      ::umask(old);
      ASSERT_TRUE(lease.has_value()) << a.last_backend_error();
      EXPECT_EQ(mode_of(path), 0600);
      EXPECT_EQ(mode_of(path + "-wal"), 0600);  // there while the connection is open
      EXPECT_EQ(mode_of(path + "-shm"), 0600);
    }
  }
}

// default_sqlite_path()'s missing directories are created 0700 (whatever the umask), the file
// 0600; nothing in the default file is reported.
TEST_F(Sqlite, DefaultFileDirectoryIsCreatedPrivate) {
  const char* saved = std::getenv("XDG_CACHE_HOME");
  const std::optional<std::string> xdg = saved ? std::optional<std::string>(saved) : std::nullopt;
  const auto cache = file("xdg") + "/cache";
  ::setenv("XDG_CACHE_HOME", cache.c_str(), 1);
  const auto path = leasehold::default_sqlite_path().string();
  const auto log = std::make_shared<Captured>();
  const mode_t old = ::umask(0277);  // the first request creates them
  {
    LockClient a(logging_transport(path, log), quiet());
    EXPECT_TRUE(a.acquire("default", 5s).has_value()) << a.last_backend_error();
  }
  ::umask(old);
  xdg ? ::setenv("XDG_CACHE_HOME", xdg->c_str(), 1) : ::unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(mode_of(file("xdg")), 0700);
  EXPECT_EQ(mode_of(cache), 0700);
  EXPECT_EQ(mode_of(cache + "/leasehold"), 0700);
  EXPECT_EQ(mode_of(path), 0600);
  EXPECT_EQ(log->joined(), "");
}

// A symbolic link at the path is refused with a clear error; its target is neither created nor
// changed, whether it exists or not, and nothing is granted.
TEST_F(Sqlite, SymbolicLinkIsRefusedAndItsTargetUntouched) {
  const auto link = file("link.db"), victim = file("victim.db");
  for (const bool exists : {false, true}) {
    SCOPED_TRACE(exists ? "target exists" : "target missing");
    std::filesystem::remove(link);
    std::filesystem::remove(victim);
    if (exists) std::ofstream(victim) << "keep";
    ASSERT_EQ(::symlink("victim.db", link.c_str()), 0);
    LockClient a(transport(link), quiet(true));
    EXPECT_FALSE(a.acquire("n", 5s).has_value());
    EXPECT_NE(a.last_backend_error().find("symbolic link"), std::string::npos) << a.last_backend_error();
    EXPECT_EQ(a.counters().grants, 0u);
    if (exists) {
      std::ifstream f(victim);
      std::string content((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      EXPECT_EQ(content, "keep");
    } else {
      EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(victim)));
    }
  }
  // A link put in the file's place later is a replacement that is refused, not followed.
  const auto path = file("swapped.db"), other = file("other.db");
  LockClient a(transport(path), quiet(true));
  ASSERT_TRUE(a.acquire("before", 5s).has_value()) << a.last_backend_error();
  std::filesystem::rename(path, other);
  ASSERT_EQ(::symlink("other.db", path.c_str()), 0);
  EXPECT_FALSE(a.acquire("after", 5s).has_value());
  EXPECT_NE(a.last_backend_error().find("symbolic link"), std::string::npos) << a.last_backend_error();
}

// An existing file others may read, or a file or directory others may write (as root: a file
// another user owns), is reported on the transport's log; a private one is not.
TEST_F(Sqlite, ExposedFileOrDirectoryIsReported) {
  const auto dir = file("shared");
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  const auto path = dir + "/locks.sqlite3";
  const auto warnings = [&] {
    const auto log = std::make_shared<Captured>();
    LockClient a(logging_transport(path, log), quiet());
    EXPECT_TRUE(a.acquire("exposed", 5s).has_value()) << a.last_backend_error();
    return log->joined();
  };
  EXPECT_EQ(warnings(), "");  // created here: private
  EXPECT_EQ(warnings(), "");  // existing and private
  ::chmod(path.c_str(), 0644);
  auto got = warnings();
  EXPECT_NE(got.find("the lock file " + path + " is readable by other users (mode 0644)"), std::string::npos) << got;
  ::chmod(path.c_str(), 0666);
  ::chmod(dir.c_str(), 0777);
  got = warnings();
  ::chmod(dir.c_str(), 0700);
  EXPECT_NE(got.find("the lock file " + path + " is writable by other users (mode 0666)"), std::string::npos) << got;
  EXPECT_NE(got.find("the lock directory " + dir + " is writable by other users (mode 0777)"), std::string::npos) << got;
  ::chmod(path.c_str(), 0600);
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
    got = warnings();
    EXPECT_NE(got.find("the lock file " + path + " is owned by another user (uid 65534)"), std::string::npos) << got;
  }
}

// A file another connection keeps locked is a database error after the busy timeout, never a
// hang; once it is unlocked the lock is granted.
TEST_F(Sqlite, LockedFileFailsAfterTheBusyTimeoutThenWorks) {
  const auto path = file("locked.db");
  LockClient warm(transport(path), quiet());
  ASSERT_TRUE(warm.acquire("warm", 5s).has_value());  // the schema exists
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  ASSERT_EQ(sqlite3_exec(db, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
  LockClient a(transport(path, 300ms), quiet(true));
  const auto t0 = leasehold::Clock::now();
  EXPECT_FALSE(a.acquire("n", 5s).has_value());
  EXPECT_LT(leasehold::Clock::now() - t0, 30s);
  EXPECT_NE(a.last_backend_error().find("locked"), std::string::npos) << a.last_backend_error();
  sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  leasehold::AcquireOptions o;
  o.wait = 10s;
  EXPECT_TRUE(a.acquire("n", 5s, std::move(o)).has_value()) << a.last_backend_error();
}

// A process holding a lease on the file is stopped past the lease's validity and calls release()
// as soon as it runs again: the lease ends Lost (once, with its signals), never Released.
TEST_F(Sqlite, PausedProcessReleaseEndsLost) {
  const auto path = file("paused.db");
  pause_then_release({LEASEHOLD_PAUSE_WORKER, "sqlite", path}, "paused", 400ms, 900ms, 1);
  LockClient a(transport(path), quiet());
  EXPECT_TRUE(a.acquire("paused", 5s).has_value());
}

}  // namespace
