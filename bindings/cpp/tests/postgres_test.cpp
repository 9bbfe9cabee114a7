// PostgresExecutor and PostgresFencingGate on a real PostgreSQL: a throw-away cluster started
// once for this binary (scripts/pg-test-server.sh: initdb in a temporary directory, a free
// loopback port, stopped by its pid) and shared by its tests. Worker processes contend, a
// counter behind the gate loses no update, a holder stopped past its TTL is fenced out, the
// server restarts mid-run, and bad input gives a clear error that never shows the connection
// string's password (hostile strings, libpq errors, the server's refusal). Under CI=true a missing
// PostgreSQL is a failure, never a skip.
#include <leasehold.hpp>
#include <leasehold/postgres_fencing.hpp>
#include <leasehold/postgres_executor.hpp>

#include <gtest/gtest.h>

#include "reply_threads.hpp"
#include "server_test_util.hpp"
#include "stall_proxy.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <filesystem>

using namespace std::chrono_literals;
using leasehold::ClientOptions;
using leasehold::LockClient;
using leasehold::PostgresFencingGate;
using leasehold::PostgresOptions;
using leasehold::PostgresExecutor;
using namespace leasehold_test;

namespace {

struct PgServer {
  std::string dir, url, error;
  bool start() {
    if (sh("bash " + script("ensure-postgres.sh") + " >/dev/null 2>&1").first != 0) {
      error = "PostgreSQL is not installed (scripts/ensure-postgres.sh failed)";
      return false;
    }
    dir = temp_dir("pg");
    return launch();
  }
  bool launch() {
    auto [rc, out] = sh("bash " + script("pg-test-server.sh") + " start " + dir + "/pg 2>&1");
    if (rc != 0) {
      error = "pg-test-server.sh start: " + out;
      return false;
    }
    url = out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
    return true;
  }
  void stop() { sh("bash " + script("pg-test-server.sh") + " stop " + dir + "/pg >/dev/null 2>&1"); }
  ~PgServer() {
    if (dir.empty()) return;
    stop();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};
PgServer* g_pg = nullptr;

// The test's own connection, for setting up tables and looking at them.
struct Admin {
  PGconn* c = nullptr;
  explicit Admin(const std::string& url) : c(PQconnectdb(url.c_str())) {
    PQsetNoticeProcessor(c, [](void*, const char*) {}, nullptr);
  }
  ~Admin() { PQfinish(c); }
  [[nodiscard]] bool ok() const { return PQstatus(c) == CONNECTION_OK; }
  // The first column of the first row ("" when none), or "error: …".
  std::string q(const std::string& sql) {
    PGresult* r = PQexec(c, sql.c_str());
    std::string out;
    const auto st = PQresultStatus(r);
    if (st == PGRES_TUPLES_OK && PQntuples(r) > 0) out = PQgetvalue(r, 0, 0);
    else if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) out = std::string("error: ") + PQresultErrorMessage(r);
    PQclear(r);
    return out;
  }
};

class Postgres : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::signal(SIGPIPE, SIG_IGN);
    if (g_pg == nullptr) {
      g_pg = new PgServer();
      g_pg->start();
    }
  }
  static void TearDownTestSuite() {
    delete g_pg;
    g_pg = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(g_pg, nullptr);
    if (g_pg->url.empty()) {
      if (ci()) FAIL() << "CI=true and no PostgreSQL: " << g_pg->error;
      GTEST_SKIP() << g_pg->error;
    }
  }
  static std::shared_ptr<PostgresExecutor> transport(const std::string& url, std::vector<std::string>* log = nullptr,
                                                      bool asynchronous_commit = false) {
    PostgresOptions o;
    o.url = url;
    o.asynchronous_commit = asynchronous_commit;
    auto mu = std::make_shared<std::mutex>();
    o.log = [log, mu](std::string_view m) {
      if (log == nullptr) return;
      std::lock_guard g(*mu);
      log->emplace_back(m);
    };
    return std::make_shared<PostgresExecutor>(o);
  }
  static ClientOptions quiet(bool failing = false) {
    ClientOptions o;
    o.close_timeout = failing ? 500ms : 5s;
    if (failing) o.config.request_timeout_ns = 500'000'000;  // give up on a refused server sooner
    o.log = [](std::string_view) {};
    return o;
  }
  static std::string url() { return g_pg->url; }
};

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Connection strings that do not parse, or with an '@' after the host part (an unescaped '/'
// in the password), are refused by the constructors; the error says why without a
// byte of the password, however libpq quotes the string.
TEST(PostgresSecrets, UnparseableOrAmbiguousStringsAreRefusedUnshown) {
  const std::vector<std::string> refused = {
      "postgresql://u:S3CRET@[::1/db",                  // bad IPv6 bracket: libpq quotes the whole URI
      "postgresql://u:S3%zzCRET@127.0.0.1:1/db",        // bad percent escape
      "postgresql://u:S3CRET%00@127.0.0.1:1/db",        // %00
      "postgresql://u:S3CRET/x@127.0.0.1:1/db",         // unescaped '/': libpq would take S3CRET as the port
      "postgresql://u:S3?CR/ET@127.0.0.1:1/db",         // unescaped '?' and '/'
      "postgresql://u:S3\"CR\"ET@[::1/db",              // quotes in the password
      "host=127.0.0.1 password='S3CRET",                // unterminated quote
      "host=127.0.0.1 S3CRET",                          // no '='
      "postgresql://u:S3CRET@127.0.0.1:1/db?password",  // a query key without '='
  };
  for (const auto& url : refused) {
    SCOPED_TRACE(url);
    PostgresOptions o;
    o.url = url;
    o.log = [](std::string_view m) { ADD_FAILURE() << "logged: " << m; };
    try {
      PostgresExecutor t(o);
      ADD_FAILURE() << "accepted";
    } catch (const leasehold::Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find("S3"), std::string::npos) << what;
      EXPECT_EQ(what.find("CRET"), std::string::npos) << what;
      EXPECT_NE(what.find("not shown"), std::string::npos) << what;
    }
    try {
      PostgresFencingGate gate(url);
      ADD_FAILURE() << "accepted by the gate";
    } catch (const leasehold::PostgresError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find("S3"), std::string::npos) << what;
      EXPECT_EQ(what.find("CRET"), std::string::npos) << what;
    }
  }
}

// Strings that parse but cannot connect: libpq's errors reach the log, the failure the client
// keeps and the gate's exception with the password masked, even where libpq quotes it (a
// password given as the port).
TEST(PostgresSecrets, ConnectionErrorsHideThePassword) {
  const std::string port = std::to_string(free_port());
  const std::vector<std::string> hostile = {
      "postgresql://u@127.0.0.1:" + port + "/db?password=S3CRET",
      "postgresql://u:S3CRET@127.0.0.1:S3CRET/db",  // libpq: invalid integer value "S3CRET" for ... "port"
      "host=127.0.0.1 port=S3CRET user=u password=S3CRET",
      "host=127.0.0.1 port=" + port + " user=u password=S3CRET sslmode=bogus",
      "postgresql://u:S3%2FCRET@127.0.0.1:" + port + "/db",  // a '/' percent-encoded: accepted
      "postgresql://u:S3CRET?x@127.0.0.1:" + port + "/db",   // libpq reads S3CRET?x as the password
  };
  for (const auto& url : hostile) {
    SCOPED_TRACE(url);
    auto logs = std::make_shared<std::vector<std::string>>();
    auto mu = std::make_shared<std::mutex>();
    PostgresOptions o;
    o.url = url;
    o.log = [logs, mu](std::string_view m) {
      std::lock_guard g(*mu);
      logs->emplace_back(m);
    };
    ClientOptions co;
    co.close_timeout = 500ms;
    co.config.request_timeout_ns = 500'000'000;
    std::string error;
    {
      LockClient c(std::make_shared<PostgresExecutor>(o), co);
      EXPECT_FALSE(c.acquire("n", 5s).has_value());
      error = c.last_backend_error();
    }
    EXPECT_FALSE(error.empty());
    EXPECT_EQ(error.find("S3CRET"), std::string::npos) << error;
    EXPECT_EQ(error.find("S3/CRET"), std::string::npos) << error;
    std::lock_guard g(*mu);
    EXPECT_FALSE(logs->empty());
    for (const auto& line : *logs) {
      EXPECT_EQ(line.find("S3CRET"), std::string::npos) << line;
      EXPECT_EQ(line.find("S3/CRET"), std::string::npos) << line;
    }
    try {
      PostgresFencingGate gate(url);
      ADD_FAILURE() << "the gate connected";
    } catch (const leasehold::PostgresError& e) {
      EXPECT_EQ(std::string(e.what()).find("S3CRET"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("connection failed"), std::string::npos) << e.what();
    }
  }
}

TEST_F(Postgres, LifecycleAndAWaiterWokenByNotify) {
  auto tb = transport(url());
  LockClient a(transport(url()), quiet());
  LockClient b(tb, quiet());
  auto held = a.acquire("life", 30s);
  ASSERT_TRUE(held.has_value()) << a.last_backend_error();
  Admin admin(url());
  EXPECT_EQ(admin.q("SELECT fence FROM leasehold_locks WHERE name = 'life'"), std::to_string(held->fencing_token()));
  EXPECT_FALSE(b.acquire("life", 5s).has_value());
  const auto st = b.status("life");
  EXPECT_TRUE(st.ok) << st.error;
  EXPECT_TRUE(st.held);
  EXPECT_EQ(st.fencing_token, held->fencing_token());
  EXPECT_GT(st.remaining_ttl_ms, 0u);
  EXPECT_LE(st.remaining_ttl_ms, 30000u);
  EXPECT_GE(st.last_fencing_token, held->fencing_token());
  std::optional<leasehold::Lease> got;
  std::thread waiter([&] {
    leasehold::AcquireOptions o;
    o.wait = 20s;
    got = b.acquire("life", 5s, std::move(o));
  });
  // The waiter LISTENs; the release's NOTIFY wakes it, long before its retry at the holder's
  // expiry (30 s).
  ASSERT_TRUE(eventually([&] { return admin.q("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'ClientRead' AND query LIKE 'LISTEN%'") != "0"; }, 10s));
  const auto t0 = leasehold::Clock::now();
  const auto old = held->fencing_token();
  EXPECT_EQ(held->release(), leasehold::ReleaseOutcome::Released);
  waiter.join();
  ASSERT_TRUE(got.has_value()) << b.last_backend_error();
  EXPECT_LT(leasehold::Clock::now() - t0, 5s);
  EXPECT_GT(got->fencing_token(), old);
  EXPECT_GE(tb->notifications_received(), 1u);
}

TEST_F(Postgres, GateRejectsOnlyTokensBelowTheMarkAndRollsBackFailedWork) {
  PostgresFencingGate gate(url());
  gate.ensure_schema();
  Admin admin(url());
  admin.q("CREATE TABLE IF NOT EXISTS leasehold_test_writes (resource text, fence bigint, pid bigint)");
  auto write = [](std::uint64_t fence) {
    return [fence](PGconn* c) {
      const std::string f = std::to_string(fence);
      const char* p[] = {f.c_str()};
      PGresult* r = PQexecParams(c, "INSERT INTO leasehold_test_writes VALUES ('gate', $1, 0)", 1, nullptr, p, nullptr,
                                 nullptr, 0);
      const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
      PQclear(r);
      return ok;
    };
  };
  EXPECT_FALSE(gate.high_water_mark("gate").has_value());
  EXPECT_TRUE(gate.run("gate", 10, write(10)));
  EXPECT_TRUE(gate.run("gate", 10, write(10)));  // equal passes (a retry)
  EXPECT_EQ(gate.high_water_mark("gate"), 10u);
  try {
    gate.run("gate", 9, write(9));
    ADD_FAILURE() << "a stale token passed";
  } catch (const leasehold::StaleFencingToken& e) {
    EXPECT_EQ(e.token(), 9u);
    EXPECT_EQ(e.high_water_mark(), 10u);
  }
  EXPECT_THROW(gate.run("gate", 12, [](PGconn*) { throw std::runtime_error("work failed"); }), std::runtime_error);
  EXPECT_EQ(gate.high_water_mark("gate"), 10u);  // rolled back with the work
  EXPECT_EQ(admin.q("SELECT count(*) FROM leasehold_test_writes WHERE resource = 'gate'"), "2");
  EXPECT_EQ(admin.q("SELECT count(*) FROM leasehold_test_writes WHERE resource = 'gate' AND fence = 9"), "0");
  EXPECT_THROW(PostgresFencingGate(url(), leasehold::FencingGateOptions{"bad name"}), leasehold::Error);
}

// Worker processes contend for one name; each holder adds 1 to a counter through the gate
// (read, then write): one holder at a time, fences strictly increasing, no update lost.
TEST_F(Postgres, ProcessesContendAndTheGatedCounterLosesNoUpdate) {
  Admin admin(url());
  PostgresFencingGate(url()).ensure_schema();
  admin.q("CREATE TABLE IF NOT EXISTS leasehold_test_counter (name text PRIMARY KEY, n bigint NOT NULL)");
  admin.q("INSERT INTO leasehold_test_counter VALUES ('gated', 0) ON CONFLICT (name) DO UPDATE SET n = 0");
  const auto log = g_pg->dir + "/gated.log";
  constexpr int kWorkers = 3, kIters = 15;
  const auto done = contend({LEASEHOLD_PAUSE_WORKER, "postgres", url()}, kWorkers,
                            "contend gated " + std::to_string(kIters) + " 5000 30000 " + log + " gate", 120s);
  for (auto n : done) EXPECT_EQ(n, kIters);
  const auto entries = read_log(log);
  EXPECT_EQ(entries.size(), 2u * kWorkers * kIters);
  check_log(entries, true);
  EXPECT_EQ(admin.q("SELECT n FROM leasehold_test_counter WHERE name = 'gated'"), std::to_string(kWorkers * kIters));
  ASSERT_FALSE(entries.empty());
  EXPECT_EQ(admin.q("SELECT hwm FROM leasehold_fencing WHERE resource = 'gated'"), std::to_string(entries.back().fence));
}

// Kleppmann's case: the holder is stopped (SIGSTOP) past its TTL; another process takes the
// lock over and writes through the gate; the resumed holder's write is rejected by the gate, and
// its lease ends Lost.
TEST_F(Postgres, PausedHolderIsFencedOutAndLosesItsLease) {
  Admin admin(url());
  PostgresFencingGate gate(url());
  gate.ensure_schema();
  admin.q("CREATE TABLE IF NOT EXISTS leasehold_test_writes (resource text, fence bigint, pid bigint)");
  auto worker = Child::spawn({LEASEHOLD_PAUSE_WORKER, "postgres", url()}, true, "");
  ASSERT_GT(worker.pid, 0);
  worker.write_line("acquire klepp 800");
  const auto held = worker.read_line(30s);
  ASSERT_TRUE(held && held->rfind("held ", 0) == 0) << held.value_or("<nothing>");
  const auto old = std::stoull(held->substr(5));
  ASSERT_EQ(::kill(worker.pid, SIGSTOP), 0);

  LockClient taker(transport(url()), quiet());
  leasehold::AcquireOptions o;
  o.wait = 20s;
  auto lease = taker.acquire("klepp", 30s, std::move(o));
  ASSERT_TRUE(lease.has_value()) << taker.last_backend_error();
  EXPECT_GT(lease->fencing_token(), old);
  gate.run("klepp", lease->fencing_token(), [&](PGconn* c) {
    const std::string q = "INSERT INTO leasehold_test_writes VALUES ('klepp', " + std::to_string(lease->fencing_token()) + ", 0)";
    PQclear(PQexec(c, q.c_str()));
  });

  worker.write_line("write klepp");  // the first things it reads on waking
  worker.write_line("release");
  ASSERT_EQ(::kill(worker.pid, SIGCONT), 0);
  const auto wrote = worker.read_line(30s);
  ASSERT_TRUE(wrote.has_value());
  EXPECT_EQ(*wrote, "stale " + std::to_string(lease->fencing_token()));
  const auto report = worker.read_line(30s);
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->rfind("outcome=lost lost=1 reason=", 0), 0u) << *report;
  EXPECT_NE(report->find("callbacks=1 stop=1"), std::string::npos) << *report;
  worker.write_line("quit");
  EXPECT_EQ(worker.wait_exit(30s), 0);
  worker.stop();
  EXPECT_EQ(admin.q("SELECT count(*) FROM leasehold_test_writes WHERE resource = 'klepp'"), "1");
  EXPECT_EQ(admin.q("SELECT fence FROM leasehold_test_writes WHERE resource = 'klepp'"), std::to_string(lease->fencing_token()));
  EXPECT_TRUE(lease->is_held());
}

// The server restarts while processes contend: nothing hangs, every worker finishes, fences
// never regress; a client in this process keeps working across the restart.
TEST_F(Postgres, ServerRestartMidRunNothingHangsFencesNeverRegress) {
  LockClient local(transport(url()), quiet());
  auto before = local.acquire("restart-local", 5s);
  ASSERT_TRUE(before.has_value());
  const auto old = before->fencing_token();
  before->release();
  // Held across the restart: the rows survive it, so renewals retried after it succeed and the
  // lease is kept (its TTL is far longer than the restart).
  auto across = local.acquire("restart-held", 8s);
  ASSERT_TRUE(across.has_value());

  const auto log = g_pg->dir + "/restart.log";
  constexpr int kWorkers = 3, kIters = 12;
  const auto done = contend({LEASEHOLD_PAUSE_WORKER, "postgres", url()}, kWorkers,
                            "contend restart " + std::to_string(kIters) + " 3000 30000 " + log, 120s, [&] {
                              std::this_thread::sleep_for(150ms);
                              g_pg->stop();
                              std::this_thread::sleep_for(300ms);
                              ASSERT_TRUE(g_pg->launch()) << g_pg->error;
                            });
  for (auto n : done) EXPECT_GT(n, 0);
  const auto entries = read_log(log);
  EXPECT_FALSE(entries.empty());
  check_log(entries, false);

  leasehold::AcquireOptions o;
  o.wait = 20s;
  auto after = local.acquire("restart-local", 5s, std::move(o));
  ASSERT_TRUE(after.has_value()) << local.last_backend_error();
  EXPECT_GT(after->fencing_token(), old);
  EXPECT_NO_THROW(across->renew()) << local.last_backend_error();
  EXPECT_FALSE(across->lost());
  EXPECT_TRUE(across->is_held());
  Admin admin(url());
  EXPECT_EQ(admin.q("SELECT fence FROM leasehold_locks WHERE name = 'restart-held'"), std::to_string(across->fencing_token()));
}

TEST_F(Postgres, WrongPasswordUnreachableServerAndForeignTableAreClearErrors) {
  std::string bad = url();
  bad.replace(bad.find(":leasehold@"), 11, ":wrong@");
  std::vector<std::string> logs;
  {
    LockClient c(transport(bad, &logs), quiet(true));
    EXPECT_FALSE(c.acquire("n", 5s).has_value());
    EXPECT_NE(c.last_backend_error().find("password authentication failed"), std::string::npos) << c.last_backend_error();
    EXPECT_EQ(c.counters().grants, 0u);
  }
  ASSERT_FALSE(logs.empty());
  EXPECT_NE(logs.front().find("password authentication failed"), std::string::npos) << logs.front();

  {
    LockClient c(transport("postgresql://postgres:x@127.0.0.1:" + std::to_string(free_port()) + "/postgres"), quiet(true));
    EXPECT_FALSE(c.acquire("n", 5s).has_value());
    EXPECT_EQ(c.last_backend_error().rfind("connection failed", 0), 0u) << c.last_backend_error();
  }

  Admin admin(url());
  admin.q("DROP DATABASE IF EXISTS foreign_db");
  ASSERT_EQ(admin.q("CREATE DATABASE foreign_db"), "");
  const std::string foreign = url().substr(0, url().rfind('/')) + "/foreign_db";
  Admin fa(foreign);
  ASSERT_TRUE(fa.ok());
  ASSERT_EQ(fa.q("CREATE TABLE leasehold_locks (name text PRIMARY KEY, owner int)"), "");
  {
    LockClient c(transport(foreign), quiet(true));
    EXPECT_FALSE(c.acquire("n", 5s).has_value());
    EXPECT_NE(c.last_backend_error().find("leasehold_locks"), std::string::npos) << c.last_backend_error();
    EXPECT_EQ(c.counters().grants, 0u);
  }
  EXPECT_EQ(fa.q("SELECT count(*) FROM leasehold_locks"), "0");
}

// The server's refusal of a wrong password, given in the userinfo or as ?password=, names no
// password in the log, the client's error or the gate's exception; the right one given as
// ?password= works.
TEST_F(Postgres, TheServersRefusalNeverCarriesThePassword) {
  std::string in_userinfo = url(), in_query = url();
  in_userinfo.replace(in_userinfo.find(":leasehold@"), 11, ":S3CRET@");
  in_query.replace(in_query.find(":leasehold@"), 11, "@");
  for (const auto& bad : {in_userinfo, in_query + "?password=S3CRET"}) {
    SCOPED_TRACE(bad);
    std::vector<std::string> logs;
    {
      LockClient c(transport(bad, &logs), quiet(true));
      EXPECT_FALSE(c.acquire("n", 5s).has_value());
      EXPECT_NE(c.last_backend_error().find("password authentication failed"), std::string::npos) << c.last_backend_error();
      EXPECT_EQ(c.last_backend_error().find("S3CRET"), std::string::npos) << c.last_backend_error();
    }
    ASSERT_FALSE(logs.empty());
    for (const auto& line : logs) EXPECT_EQ(line.find("S3CRET"), std::string::npos) << line;
    try {
      PostgresFencingGate gate(bad);
      ADD_FAILURE() << "the gate connected";
    } catch (const leasehold::PostgresError& e) {
      EXPECT_EQ(std::string(e.what()).find("S3CRET"), std::string::npos) << e.what();
    }
  }
  LockClient good(transport(in_query + "?password=leasehold"), quiet());
  EXPECT_TRUE(good.acquire("by-query", 5s).has_value()) << good.last_backend_error();
}

// Asynchronous commit shares locks with the default; a read-only session (SQLSTATE 25006)
// is a clear error and grants nothing.
TEST_F(Postgres, AsynchronousCommitAndAReadOnlyDatabase) {
  LockClient fast(transport(url(), nullptr, true), quiet());
  LockClient slow(transport(url()), quiet());
  auto a = fast.acquire("async", 30s);
  ASSERT_TRUE(a.has_value()) << fast.last_backend_error();
  EXPECT_FALSE(slow.acquire("async", 5s).has_value());
  const auto old = a->fencing_token();
  EXPECT_EQ(a->release(), leasehold::ReleaseOutcome::Released);
  auto b = slow.acquire("async", 5s);
  ASSERT_TRUE(b.has_value()) << slow.last_backend_error();
  EXPECT_GT(b->fencing_token(), old);
  EXPECT_EQ(b->release(), leasehold::ReleaseOutcome::Released);

  LockClient ro(transport(url() + "?options=-c%20default_transaction_read_only%3Don"), quiet(true));
  EXPECT_FALSE(ro.acquire("async", 5s).has_value());
  EXPECT_NE(ro.last_backend_error().find("read-only transaction"), std::string::npos) << ro.last_backend_error();
  EXPECT_EQ(ro.counters().grants, 0u);
  Admin admin(url());
  EXPECT_EQ(admin.q("SELECT token FROM leasehold_locks WHERE name = 'async'"), "");
}

// An application call keeps its bound when the server stalls: the statement run on the
// caller's thread ends by the caller's deadline and goes on on the commands thread. A proxy
// holds back every byte the server sends for kStall; the bounds asserted are those the calls
// document plus kMargin for a loaded machine, never a speed.
constexpr auto kStall = 1500ms;
constexpr auto kMargin = 500ms;

// The test server's URL with the proxy's port instead of the server's.
std::string through(const leasehold_test::StallProxy& p, const std::string& url) {
  const auto at = url.rfind(':');
  const auto slash = url.find('/', at);
  return url.substr(0, at + 1) + std::to_string(p.port()) + (slash == std::string::npos ? "" : url.substr(slash));
}

long long ms(leasehold::Clock::duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }

TEST_F(Postgres, ReleaseReturnsByItsBoundWhenTheServerStallsAndCompletesLater) {
  leasehold_test::StallProxy proxy(std::stoi(url().substr(url().rfind(':') + 1)));
  LockClient client(transport(through(proxy, url())), quiet());  // command_timeout 5 s: longer than the stall
  auto lease = client.acquire("pg-rel", 30s);
  ASSERT_TRUE(lease.has_value()) << client.last_backend_error();
  proxy.delay_ms = static_cast<int>(kStall.count());
  const auto t0 = leasehold::Clock::now();
  const auto out = lease->release(100ms);
  const auto took = leasehold::Clock::now() - t0;
  EXPECT_EQ(out, leasehold::ReleaseOutcome::Released);
  EXPECT_FALSE(lease->is_held());
  EXPECT_LT(took, 100ms + kMargin) << "release(100ms) took " << ms(took) << " ms";
  EXPECT_EQ(client.counters().releases_confirmed, 0u) << "the answer came before the stall ended";
  std::printf("release(100ms) with the answers held back %lld ms: returned in %lld ms\n",
              static_cast<long long>(kStall.count()), ms(took));
  proxy.delay_ms = 0;
  // The commands thread reads the answer once the stall ends; the core waits for it.
  EXPECT_TRUE(eventually([&] { return client.counters().releases_confirmed == 1; }, 30s));
  Admin admin(url());
  EXPECT_EQ(admin.q("SELECT token <> '' FROM leasehold_locks WHERE name = 'pg-rel'"), "f");
}

TEST_F(Postgres, AcquireFailsByItsBoundWhenTheServerStallsAndALateGrantIsReleased) {
  leasehold_test::StallProxy proxy(std::stoi(url().substr(url().rfind(':') + 1)));
  ClientOptions co = quiet();
  co.config.request_timeout_ns = 300'000'000;  // an acquire's bound: its wait + 0.3 s
  LockClient client(transport(through(proxy, url())), co);
  auto warm = client.acquire("pg-warm", 30s);  // connected and migrated: the stalled acquire grants
  ASSERT_TRUE(warm.has_value()) << client.last_backend_error();
  ASSERT_EQ(warm->release(), leasehold::ReleaseOutcome::Released);
  proxy.delay_ms = static_cast<int>(kStall.count());
  leasehold::AcquireOptions o;
  o.wait = 100ms;
  const auto t0 = leasehold::Clock::now();
  const auto lease = client.acquire("pg-acq", 30s, std::move(o));
  const auto took = leasehold::Clock::now() - t0;
  EXPECT_FALSE(lease.has_value());
  EXPECT_LT(took, 100ms + 300ms + kMargin) << "acquire(wait 100ms) took " << ms(took) << " ms";
  Admin admin(url());
  EXPECT_EQ(admin.q("SELECT token <> '' FROM leasehold_locks WHERE name = 'pg-acq'"), "t")
      << "the server granted the stalled acquire";
  std::printf("acquire(wait 100ms, request timeout 300ms) with the answers held back %lld ms: failed in %lld ms\n",
              static_cast<long long>(kStall.count()), ms(took));
  proxy.delay_ms = 0;
  // The grant answered after the acquire failed is released: no lock leaks.
  EXPECT_TRUE(eventually([&] { return admin.q("SELECT token <> '' FROM leasehold_locks WHERE name = 'pg-acq'") == "f"; }, 30s))
      << "the late grant leaked";
  EXPECT_TRUE(eventually([&] { return client.counters().live_leases == 0; }, 30s));
  LockClient other(transport(url()), quiet());
  EXPECT_TRUE(other.acquire("pg-acq", 5s).has_value());
}

// A LockClient closed while the commands thread reads on a statement an application thread
// left to it: close() keeps its own bound.
TEST_F(Postgres, CloseDuringAStallKeepsItsBound) {
  leasehold_test::StallProxy proxy(std::stoi(url().substr(url().rfind(':') + 1)));
  ClientOptions co = quiet();
  co.close_timeout = 200ms;
  LockClient client(transport(through(proxy, url())), co);
  auto lease = client.acquire("pg-closing", 30s);
  ASSERT_TRUE(lease.has_value()) << client.last_backend_error();
  proxy.delay_ms = static_cast<int>(kStall.count());
  EXPECT_EQ(lease->release(100ms), leasehold::ReleaseOutcome::Released);
  const auto t0 = leasehold::Clock::now();
  client.close();
  const auto took = leasehold::Clock::now() - t0;
  EXPECT_LT(took, 200ms + kMargin) << "close() took " << ms(took) << " ms";
  proxy.delay_ms = 0;
  Admin admin(url());
  EXPECT_TRUE(eventually([&] { return admin.q("SELECT token <> '' FROM leasehold_locks WHERE name = 'pg-closing'") == "f"; }, 5s))
      << "the server ran the release";
}

// An answer in time is read on the thread of the call that waits for it: no hop to the
// commands thread and back.
TEST_F(Postgres, AnAnswerInTimeIsReadOnTheCallersThread) {
  auto rec = std::make_shared<leasehold_test::ReplyThreads>(transport(url()));
  LockClient client(rec, quiet());
  ASSERT_TRUE(client.acquire("pg-first", 30s).has_value()) << client.last_backend_error();  // connected (on the commands thread)
  const auto me = std::this_thread::get_id();
  for (int i = 0; i < 3; ++i) {
    const auto before = rec->since(0).size();
    auto lease = client.acquire("pg-fast", 30s);
    ASSERT_TRUE(lease.has_value());
    const auto acquired = rec->since(before);
    EXPECT_NE(std::find(acquired.begin(), acquired.end(), me), acquired.end()) << "acquire's answer came on another thread";
    const auto held = rec->since(0).size();
    EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Released);
    const auto released = rec->since(held);
    EXPECT_NE(std::find(released.begin(), released.end(), me), released.end()) << "release's answer came on another thread";
  }
}

}  // namespace
