// SqliteTransport on real SQLite files: several OS processes contend on one file, the file is
// deleted or replaced under a client, and bad files (foreign table, corrupt, locked, missing
// directory) give a clear error and never a grant.
#include <leasehold.hpp>
#include <leasehold/memory_transport.hpp>
#include <leasehold/sqlite_transport.hpp>

#include <gtest/gtest.h>

#include "server_test_util.hpp"

#include <filesystem>
#include <optional>

using namespace std::chrono_literals;
using leasehold::ClientOptions;
using leasehold::LockClient;
using leasehold::SqliteOptions;
using leasehold::SqliteTransport;
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
  static std::shared_ptr<SqliteTransport> transport(const std::string& path, std::chrono::milliseconds busy = 5000ms) {
    SqliteOptions o;
    o.path = path;
    o.busy_timeout = busy;
    o.log = [](std::string_view) {};
    return std::make_shared<SqliteTransport>(o);
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

TEST_F(Sqlite, StatusNeedsAnSqlTransport) {
  LockClient m(std::make_shared<leasehold::MemoryTransport>(std::make_shared<leasehold::MemoryService>()), quiet());
  try {
    (void)m.status("x");
    ADD_FAILURE() << "status() answered on the memory service";
  } catch (const leasehold::Error& e) {
    EXPECT_EQ(e.code(), static_cast<leasehold::Status>(LH_ERR_NO_BACKEND));
  }
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
