// RedisStreamExecutor (LH_BACKEND_REDIS_STREAM: the core owns the Redis wire, the executor moves
// bytes) driven by LockClient against a real redis-server this test starts on a free loopback
// port and a Unix socket: fences increase over acquire/release rounds, a release wakes a waiter
// through the subscriber, a restarted server is reconnected to, a Unix socket URL works, a
// release keeps its bound while the server's replies are held back, and bad URLs, TLS and an
// unreachable server fail with their reason. rediss:// (built with OpenSSL) against a
// redis-server with a TLS port and certificates of a CA the test makes: a lock with a client
// certificate, and a server certificate from another CA, for another name or without the client's
// certificate refused with the reason; built without OpenSSL, rediss:// is refused at
// construction. A Redis Cluster (scripts/redis-cluster-test.sh) is reached through a
// redis+cluster:// URL, and a Sentinel failover (scripts/redis-sentinel-test.sh) is followed
// through a redis+sentinel:// URL. make_executor/open_client: a URL gives its executor (SQLite where built in), an
// unknown scheme or a backend not built in is refused with its reason. The executor alone, on a
// peer that reads nothing (no server): writes never block, a caller's wait keeps its bound.
// Without redis-server (or openssl to make the certificates) the tests skip, except under
// CI=true.
#include <leasehold.hpp>
#include <leasehold/open.hpp>
#include <leasehold/redis_stream_executor.hpp>

#include <gtest/gtest.h>

#include "server_test_util.hpp"
#include "stall_proxy.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <vector>
#include <sstream>
#include <string>
#include <thread>
#include <variant>

using namespace std::chrono_literals;
using leasehold::AcquireOptions;
using leasehold::ClientOptions;
using leasehold::LockClient;
using leasehold::RedisStreamExecutor;
using leasehold_test::eventually;

namespace {

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// One inline command on a fresh connection; the first line of the answer ("" if none), or all
// of its first read.
std::string raw(int port, const std::string& command, bool all = false) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string line = command + "\r\n";
    if (::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size())) {
      char buf[8192];
      const auto n = ::read(fd, buf, sizeof buf);
      if (n > 0) out.assign(buf, static_cast<std::size_t>(n));
    }
  }
  if (fd >= 0) ::close(fd);
  return all ? out : out.substr(0, out.find("\r\n"));
}

std::string find_redis() {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path != nullptr ? path : "/usr/bin");
  for (std::string dir; std::getline(ss, dir, ':');)
    if (!dir.empty() && ::access((dir + "/redis-server").c_str(), X_OK) == 0) return dir + "/redis-server";
  return {};
}

struct Server {
  leasehold_test::Child proc;
  int port = free_port();
  std::string dir = leasehold_test::temp_dir("lh-stream");
  std::string unix_path = dir + "/redis.sock";
  std::vector<std::string> extra;  // more arguments (the TLS port)
  // A port chosen free can be taken before the server binds it: then other ports are tried.
  // `pick` chooses the ports of `extra` again for each try.
  bool start(const std::function<void()>& pick = {}) {
    for (int attempt = 0; attempt < 5; ++attempt) {
      if (attempt > 0) port = free_port();
      if (pick) pick();
      if (launch()) return true;
      proc.stop();
    }
    return false;
  }
  bool launch() {
    const auto bin = find_redis();
    if (bin.empty() || port <= 0) return false;
    std::vector<std::string> argv{bin, "--port", std::to_string(port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--unixsocket", unix_path, "--unixsocketperm", "700"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    proc = leasehold_test::Child::spawn(argv, false, "/dev/null");
    if (proc.pid <= 0) return false;
    // Our own process answers only if it still runs (another server may hold the port).
    const bool answered = eventually([&] { return !proc.running() || raw(port, "PING") == "+PONG"; }, 20s);
    return answered && proc.running();
  }
  void kill() {
    if (proc.pid > 0) ::kill(proc.pid, SIGKILL);
    proc.stop();
  }
  ~Server() {
    proc.stop();
    ::unlink(unix_path.c_str());
    ::rmdir(dir.c_str());
  }
};

Server* g_server = nullptr;

class RedisStream : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::signal(SIGPIPE, SIG_IGN);
    g_server = new Server();
    if (!g_server->start()) {
      delete g_server;
      g_server = nullptr;
    }
  }
  static void TearDownTestSuite() {
    delete g_server;
    g_server = nullptr;
  }
  void SetUp() override {
    if (g_server == nullptr) {
      if (leasehold_test::ci()) FAIL() << "redis-server did not start (CI=true: a failure)";
      GTEST_SKIP() << "no redis-server";
    }
  }
  static std::string url() { return "redis://127.0.0.1:" + std::to_string(g_server->port); }
  static ClientOptions quiet() {
    ClientOptions o;
    o.log = [](std::string_view) {};
    o.close_timeout = 1s;  // an unreachable server keeps cleanups pending
    return o;
  }
  static std::shared_ptr<RedisStreamExecutor> executor(const std::string& u) {
    leasehold::RedisStreamOptions o;
    o.url = u;
    o.connect_timeout = 1000ms;
    return std::make_shared<RedisStreamExecutor>(o);
  }
  static AcquireOptions wait_for(std::chrono::nanoseconds w) {
    AcquireOptions o;
    o.wait = w;
    return o;
  }
};

TEST_F(RedisStream, AcquireReleaseWithIncreasingFences) {
  auto exec = executor(url());
  LockClient client(exec, quiet());
  std::uint64_t last = 0;
  for (int i = 0; i < 5; ++i) {
    auto lease = client.acquire("s-fences", 10s, wait_for(2s));
    ASSERT_TRUE(lease.has_value()) << "round " << i << ": " << client.last_backend_error();
    EXPECT_GT(lease->fencing_token(), last);
    last = lease->fencing_token();
    EXPECT_EQ(raw(g_server->port, "EXISTS lh:{s-fences}"), ":1");
    EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Released);
  }
  EXPECT_EQ(client.counters().releases_confirmed, 5u);
  EXPECT_EQ(raw(g_server->port, "EXISTS lh:{s-fences}"), ":0");
  // One open per connection (commands, subscriber), none ended.
  const auto k = client.counters();
  EXPECT_EQ(k.stream_opens, 2u);
  EXPECT_EQ(k.stream_closes, 0u);
  EXPECT_EQ(k.stream_late_answers, 0u);
  // The application threads read their own replies (no hop through the reader thread).
  EXPECT_GE(exec->stats().caller_reads, 5u) << "reader thread reads: " << exec->stats().reader_reads;
}

// An application thread's own replies never wake the reader thread: its interest in the stream
// is taken back before the request goes out, and given back after the reply was read.
TEST_F(RedisStream, ACallersRepliesLeaveTheReaderThreadAsleep) {
  auto exec = executor(url());
  LockClient client(exec, quiet());
  ASSERT_TRUE(eventually([&] { return client.counters().redis_subscribed > 0; }, 5s));
  auto cycle = [&] {
    auto lease = client.acquire("s-asleep", 10s, wait_for(2s));
    return lease.has_value() && lease->release() == leasehold::ReleaseOutcome::Released;
  };
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cycle());  // connected, scripts loaded
  const auto before = exec->stats();
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(cycle()) << "round " << i << ": " << client.last_backend_error();
  const auto after = exec->stats();
  EXPECT_EQ(after.reader_wakeups, before.reader_wakeups);
  EXPECT_EQ(after.reader_reads, before.reader_reads);
  EXPECT_GE(after.caller_reads - before.caller_reads, 100u);  // two round trips a cycle
}

TEST_F(RedisStream, ContentionWakesTheWaiter) {
  LockClient a(executor(url()), quiet());
  LockClient b(executor(url()), quiet());
  ASSERT_TRUE(eventually([&] { return b.counters().redis_subscribed > 0; }, 5s));
  auto held = a.acquire("s-contend", 30s);
  ASSERT_TRUE(held.has_value()) << a.last_backend_error();
  std::atomic<bool> done{false};
  auto waiter = std::async(std::launch::async, [&] {
    auto l = b.acquire("s-contend", 30s, wait_for(20s));
    done = true;
    return l;
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(done.load()) << "b got the lock while a held it";
  const auto wakeups = b.counters().backend_wakeups;
  const auto t0 = leasehold::Clock::now();
  EXPECT_EQ(held->release(), leasehold::ReleaseOutcome::Released);
  auto got = waiter.get();
  const auto took = leasehold::Clock::now() - t0;
  ASSERT_TRUE(got.has_value()) << b.last_backend_error();
  EXPECT_GT(got->fencing_token(), held->fencing_token());
  EXPECT_LT(took, 2s) << "the waiter was not woken by the release";
  EXPECT_GT(b.counters().backend_wakeups, wakeups);
  EXPECT_EQ(got->release(), leasehold::ReleaseOutcome::Released);
}

// Application threads of one client read their replies concurrently on the shared stream (and
// the reader thread takes what none of them waits for): every round gets its lock, one holder
// per name at a time, fences strictly increasing per name.
TEST_F(RedisStream, ThreadsShareOneClient) {
  auto exec = executor(url());
  LockClient client(exec, quiet());
  std::mutex mu;
  std::map<std::string, std::uint64_t> last;
  std::map<std::string, int> holders;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        const std::string name = "s-threads-" + std::to_string((t + i) % 2);
        auto lease = client.acquire(name, 10s, wait_for(10s));
        if (!lease) {
          ++failures;
          continue;
        }
        {
          std::lock_guard g(mu);
          if (lease->fencing_token() <= last[name] || holders[name]++ != 0) ++failures;
          last[name] = lease->fencing_token();
        }
        std::this_thread::sleep_for(1ms);
        {
          std::lock_guard g(mu);
          --holders[name];
        }
        if (lease->release() != leasehold::ReleaseOutcome::Released) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0) << client.last_backend_error();
  EXPECT_EQ(client.counters().releases_confirmed, 100u);
  EXPECT_GT(exec->stats().caller_reads, 0u);
}

TEST_F(RedisStream, ReconnectsAfterAServerRestart) {
  LockClient client(executor(url()), quiet());
  auto lease = client.acquire("s-restart", 10s, wait_for(2s));
  ASSERT_TRUE(lease.has_value()) << client.last_backend_error();
  EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Released);
  g_server->kill();
  EXPECT_TRUE(eventually([&] { return client.counters().redis_subscribed == 0; }, 5s));
  EXPECT_FALSE(client.last_backend_error().empty());
  ASSERT_TRUE(g_server->launch()) << "redis-server did not restart";
  auto again = client.acquire("s-restart", 10s, wait_for(10s));
  ASSERT_TRUE(again.has_value()) << client.last_backend_error();
  EXPECT_TRUE(eventually([&] { return client.counters().redis_subscribed > 0; }, 5s));
  EXPECT_EQ(again->release(), leasehold::ReleaseOutcome::Released);
  // Both connections ended with the server and were opened again.
  const auto k = client.counters();
  EXPECT_GE(k.stream_closes, 2u);
  EXPECT_GE(k.stream_opens, 4u);
  EXPECT_LE(k.stream_opens - k.stream_closes, 2u);
}

TEST_F(RedisStream, UnixSocket) {
  LockClient client(std::make_shared<RedisStreamExecutor>("unix://" + g_server->unix_path), quiet());
  auto lease = client.acquire("s-unix", 10s, wait_for(2s));
  ASSERT_TRUE(lease.has_value()) << client.last_backend_error();
  EXPECT_EQ(raw(g_server->port, "EXISTS lh:{s-unix}"), ":1");
  EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Released);
}

// The replies are held back longer than the release's bound: release(100ms) returns by then
// (plus a margin for a loaded machine) and the confirmation still arrives afterwards.
TEST_F(RedisStream, ReleaseKeepsItsBoundWhenTheServerStalls) {
  leasehold_test::StallProxy proxy(g_server->port);
  leasehold::RedisStreamOptions o;
  o.url = "redis://127.0.0.1:" + std::to_string(proxy.port());
  o.request_timeout = 5000ms;  // longer than the stall: the late reply is read, not a reconnect
  LockClient client(std::make_shared<RedisStreamExecutor>(o), quiet());
  auto lease = client.acquire("s-stall", 30s, wait_for(2s));
  ASSERT_TRUE(lease.has_value()) << client.last_backend_error();
  proxy.delay_ms = 1500;
  const auto t0 = leasehold::Clock::now();
  EXPECT_EQ(lease->release(100ms), leasehold::ReleaseOutcome::Released);
  const auto took = leasehold::Clock::now() - t0;
  EXPECT_LT(took, 600ms) << "release(100ms) took "
                         << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  EXPECT_EQ(client.counters().releases_confirmed, 0u) << "the reply came before the stall ended";
  proxy.delay_ms = 0;
  EXPECT_TRUE(eventually([&] { return client.counters().releases_confirmed == 1; }, 30s));
  EXPECT_EQ(raw(g_server->port, "EXISTS lh:{s-stall}"), ":0");
}

TEST_F(RedisStream, BadUrlsAndUnreachableServersFailWithTheirReason) {
  for (const char* bad : {"http://127.0.0.1:6379", "redis://127.0.0.1:notaport", "redis+cluster://127.0.0.1:7000/3", ""}) {
    try {
      LockClient c(executor(bad), quiet());
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const leasehold::Error& e) {
      EXPECT_EQ(e.code(), LH_ERR_INVALID_CONFIG) << bad;
    }
  }
  try {
    LockClient c(executor("unix://redis.sock"), quiet());
    ADD_FAILURE() << "accepted a relative socket path";
  } catch (const leasehold::Error& e) {
    EXPECT_NE(e.detail().find("absolute socket path"), std::string::npos) << e.what();
  }
  {
    LockClient c(executor("redis://127.0.0.1:" + std::to_string(free_port())), quiet());
    EXPECT_FALSE(c.acquire("s-nobody", 5s, wait_for(300ms)).has_value());
    EXPECT_NE(c.last_backend_error().find("refused"), std::string::npos) << c.last_backend_error();
  }
#if defined(LEASEHOLD_OPENSSL)
  {  // TLS to a plain port: the handshake never ends, nothing is granted
    LockClient c(executor("rediss://127.0.0.1:" + std::to_string(g_server->port)), quiet());
    EXPECT_FALSE(c.acquire("s-tls", 5s, wait_for(300ms)).has_value());
    EXPECT_TRUE(eventually([&] { return c.last_backend_error().find("did not open in time") != std::string::npos; }, 5s))
        << c.last_backend_error();
  }
#else
  try {
    executor("rediss://127.0.0.1:" + std::to_string(g_server->port));
    ADD_FAILURE() << "rediss:// accepted without OpenSSL";
  } catch (const leasehold::Error& e) {
    EXPECT_EQ(e.code(), leasehold::status::invalid_argument);
    EXPECT_NE(e.detail().find("TLS (rediss://) is not built in"), std::string::npos) << e.what();
  }
#endif
}

// make_executor()/open_client(): the executor a URL names, locking for real.
TEST_F(RedisStream, OpenByUrl) {
  const auto lock_once = [](LockClient& c, const std::string& name) {
    auto lease = c.acquire(name, 10s, wait_for(2s));
    EXPECT_TRUE(lease.has_value()) << name << ": " << c.last_backend_error();
    if (lease) {
      EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Released);
    }
  };
  auto exec = leasehold::make_executor(url() + "/0");
  EXPECT_NE(std::dynamic_pointer_cast<RedisStreamExecutor>(exec), nullptr);
  {
    LockClient c(exec, quiet());
    auto lease = c.acquire("s-open", 10s, wait_for(2s));
    ASSERT_TRUE(lease.has_value()) << c.last_backend_error();
    EXPECT_EQ(raw(g_server->port, "EXISTS lh:{s-open}"), ":1");
    EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Released);
  }
  leasehold::ExecutorOptions eo;
  eo.redis.client_name = "lh-open-test";
  auto c = leasehold::open_client("unix://" + g_server->unix_path, quiet(), eo);
  lock_once(c, "s-open-unix");
  EXPECT_NE(raw(g_server->port, "CLIENT LIST", true).find("name=lh-open-test"), std::string::npos);
  auto m = leasehold::open_client("memory://", quiet());
  lock_once(m, "s-open-memory");
#if defined(LEASEHOLD_HAVE_SQLITE)
  const auto dir = leasehold_test::temp_dir("lh-open");
  auto sq = leasehold::open_client("sqlite://" + dir + "/locks.db", quiet());
  lock_once(sq, "s-open-sqlite");
  sq.close();
  EXPECT_EQ(::access((dir + "/locks.db").c_str(), F_OK), 0);
  leasehold_test::sh("rm -rf " + dir);
  for (const char* bad : {"sqlite://host/x.db", "sqlite:///x.db?mode=ro", "sqlite:///x%zz.db"}) {
    try {
      leasehold::make_executor(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const leasehold::Error& e) {
      EXPECT_EQ(e.code(), leasehold::status::invalid_argument) << e.what();
      EXPECT_NE(e.detail().find("SQLite URL"), std::string::npos) << e.what();
    }
  }
#else
  const char* sqlite_refusal = "sqlite: URLs need SQLiteExecutor, not built into this program";
#endif
  const std::pair<std::string, std::string> refused[] = {
      {"ftp://user:secret@host/x", "unknown backend URL scheme 'ftp'"},
      {"no-scheme", "without a scheme"},
      {"memory://somewhere", "memory URLs take no host or path"},
#if !defined(LEASEHOLD_HAVE_SQLITE)
      {"sqlite:///tmp/x.db", sqlite_refusal},
#endif
#if !defined(LEASEHOLD_HAVE_POSTGRES)
      {"postgresql://user:secret@127.0.0.1/db", "need PostgresExecutor, not built into this program"},
#endif
  };
  for (const auto& [u, why] : refused) {
    try {
      leasehold::make_executor(u);
      ADD_FAILURE() << "accepted '" << u << "'";
    } catch (const leasehold::Error& e) {
      EXPECT_EQ(e.code(), leasehold::status::invalid_argument) << e.what();
      EXPECT_NE(e.detail().find(why), std::string::npos) << e.what();
      EXPECT_EQ(e.detail().find("secret"), std::string::npos) << "the password shows: " << e.what();
    }
  }
}

#if defined(LEASEHOLD_OPENSSL)
// A redis-server with a TLS port that requires a client certificate; the certificates come from
// CAs this suite makes (openssl). The server's certificate names localhost only.
std::string g_certs;
Server* g_tls = nullptr;
int g_tls_port = 0;

class RedisStreamTls : public RedisStream {
 protected:
  static void SetUpTestSuite() {
    ::signal(SIGPIPE, SIG_IGN);
    g_certs = leasehold_test::temp_dir("lh-tls");
    const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const auto ca = [&](const std::string& n) {
      return "openssl req -x509" + ec + " -keyout " + n + ".key -out " + n + ".crt -days 2 -subj /CN=" + n;
    };
    const auto cert = [&](const std::string& n, const std::string& by, const std::string& san) {
      return "printf 'subjectAltName=" + san + "\\n' > " + n + ".ext && openssl req" + ec + " -keyout " + n +
             ".key -out " + n + ".csr -subj /CN=" + n + " && openssl x509 -req -in " + n + ".csr -CA " + by +
             ".crt -CAkey " + by + ".key -CAcreateserial -out " + n + ".crt -days 2 -extfile " + n + ".ext";
    };
    const auto made = leasehold_test::sh("cd " + g_certs + " && (" + ca("ca") + " && " + ca("other") + " && " +
                                         cert("server", "ca", "DNS:localhost") + " && " + cert("client", "ca", "DNS:client") +
                                         " && " + cert("stranger", "other", "DNS:localhost") + ") >/dev/null 2>&1");
    if (made.first != 0) return;
    g_tls = new Server();
    const bool up = g_tls->start([] {
      g_tls_port = free_port();
      g_tls->extra = {"--tls-port", std::to_string(g_tls_port), "--tls-cert-file", g_certs + "/server.crt",
                      "--tls-key-file", g_certs + "/server.key", "--tls-ca-cert-file", g_certs + "/ca.crt",
                      "--tls-auth-clients", "yes"};
    });
    if (!up) {
      delete g_tls;
      g_tls = nullptr;
    }
  }
  static void TearDownTestSuite() {
    delete g_tls;
    g_tls = nullptr;
    if (!g_certs.empty()) leasehold_test::sh("rm -rf " + g_certs);
  }
  void SetUp() override {
    if (g_tls == nullptr) {
      if (leasehold_test::ci()) FAIL() << "no TLS redis-server (openssl, redis-server with TLS; CI=true: a failure)";
      GTEST_SKIP() << "no openssl or no redis-server with TLS";
    }
  }
  static std::shared_ptr<RedisStreamExecutor> tls_executor(const std::string& host, const std::string& ca,
                                                           bool client_cert = true) {
    leasehold::RedisStreamOptions o;
    o.url = "rediss://" + host + ":" + std::to_string(g_tls_port) + "/0";
    o.connect_timeout = 1000ms;
    o.tls.ca_file = g_certs + "/" + ca + ".crt";
    if (client_cert) {
      o.tls.cert_file = g_certs + "/client.crt";
      o.tls.key_file = g_certs + "/client.key";
    }
    return std::make_shared<RedisStreamExecutor>(o);
  }
};

TEST_F(RedisStreamTls, ALockWithAClientCertificate) {
  auto exec = tls_executor("localhost", "ca");
  LockClient client(exec, quiet());
  std::uint64_t last = 0;
  for (int i = 0; i < 3; ++i) {
    auto lease = client.acquire("s-tls-lock", 10s, wait_for(3s));
    ASSERT_TRUE(lease.has_value()) << "round " << i << ": " << client.last_backend_error();
    EXPECT_GT(lease->fencing_token(), last);
    last = lease->fencing_token();
    EXPECT_EQ(raw(g_tls->port, "EXISTS lh:{s-tls-lock}"), ":1");
    EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Released);
  }
  EXPECT_EQ(raw(g_tls->port, "EXISTS lh:{s-tls-lock}"), ":0");
  EXPECT_EQ(client.counters().stream_closes, 0u);
  // A waiter is woken through the subscriber, over TLS too.
  LockClient other(tls_executor("localhost", "ca"), quiet());
  ASSERT_TRUE(eventually([&] { return other.counters().redis_subscribed > 0; }, 5s)) << other.last_backend_error();
  auto held = client.acquire("s-tls-wake", 30s);
  ASSERT_TRUE(held.has_value()) << client.last_backend_error();
  auto waiter = std::async(std::launch::async, [&] { return other.acquire("s-tls-wake", 30s, wait_for(20s)); });
  std::this_thread::sleep_for(200ms);
  const auto t0 = leasehold::Clock::now();
  EXPECT_EQ(held->release(), leasehold::ReleaseOutcome::Released);
  auto got = waiter.get();
  ASSERT_TRUE(got.has_value()) << other.last_backend_error();
  EXPECT_LT(leasehold::Clock::now() - t0, 2s) << "the waiter was not woken by the release";
  EXPECT_EQ(got->release(), leasehold::ReleaseOutcome::Released);
}

// Application threads write and read one TLS stream concurrently (one SSL object: its calls are
// serialised), with the reader thread taking what none of them waits for.
TEST_F(RedisStreamTls, ThreadsShareOneClient) {
  auto exec = tls_executor("localhost", "ca");
  LockClient client(exec, quiet());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 15; ++i) {
        auto lease = client.acquire("s-tls-threads-" + std::to_string((t + i) % 2), 10s, wait_for(10s));
        if (!lease || lease->release() != leasehold::ReleaseOutcome::Released) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0) << client.last_backend_error();
  EXPECT_EQ(client.counters().releases_confirmed, 60u);
  EXPECT_EQ(client.counters().stream_closes, 0u);
  EXPECT_GT(exec->stats().caller_reads, 0u);
}

// Each refusal grants nothing and says why; the server never sees the lock's keys.
TEST_F(RedisStreamTls, RefusedHandshakesSayWhy) {
  const struct {
    std::shared_ptr<RedisStreamExecutor> exec;
    std::vector<std::string> why;  // one of these in last_backend_error()
  } cases[] = {
      {tls_executor("localhost", "other"), {"certificate verify failed"}},           // another CA
      {tls_executor("127.0.0.1", "ca"), {"certificate verify failed"}},             // not the certificate's name
      {tls_executor("localhost", "ca", false), {"certificate required", "TLS read: ", "TLS write: "}},
  };
  for (const auto& c : cases) {
    LockClient client(c.exec, quiet());
    EXPECT_FALSE(client.acquire("s-tls-refused", 5s, wait_for(500ms)).has_value());
    const auto why = client.last_backend_error();
    bool found = false;
    for (const auto& w : c.why) found = found || why.find(w) != std::string::npos;
    EXPECT_TRUE(found) << why;
  }
  EXPECT_EQ(raw(g_tls->port, "KEYS lh:{s-tls-refused}*"), "*0");
}

TEST_F(RedisStreamTls, FilesThatDoNotLoadAreRefusedAtConstruction) {
  leasehold::RedisStreamOptions o;
  o.url = "rediss://localhost:" + std::to_string(g_tls_port);
  o.tls.ca_file = g_certs + "/missing.crt";
  try {
    RedisStreamExecutor e(o);
    ADD_FAILURE() << "a missing CA file was accepted";
  } catch (const leasehold::Error& e) {
    EXPECT_EQ(e.code(), leasehold::status::invalid_argument);
    EXPECT_NE(e.detail().find("missing.crt"), std::string::npos) << e.what();
  }
  o.tls.ca_file = g_certs + "/ca.crt";
  o.tls.cert_file = g_certs + "/client.crt";
  o.tls.key_file = g_certs + "/server.key";  // not the certificate's key
  EXPECT_THROW(RedisStreamExecutor{o}, leasehold::Error);
}

TEST_F(RedisStreamTls, OpenByUrl) {
  leasehold::ExecutorOptions eo;
  eo.redis.tls = {g_certs + "/ca.crt", g_certs + "/client.crt", g_certs + "/client.key"};
  auto c = leasehold::open_client("rediss://localhost:" + std::to_string(g_tls_port), quiet(), eo);
  auto lease = c.acquire("s-tls-open", 10s, wait_for(3s));
  ASSERT_TRUE(lease.has_value()) << c.last_backend_error();
  EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Released);
}
#endif

// Redis Sentinel on the byte path (scripts/redis-sentinel-test.sh: a master, a replica, three
// sentinels) through a redis+sentinel:// URL. Two clients contend on a name; the master is
// SIGKILLed while one holds it and the other waits. Both follow the promotion (the core asks the
// sentinels again): the held lease is renewed on the promoted replica, the waiter is woken there
// by its release, a later acquire is granted there, and the fences granted, in order, only go up.
long long info_number(int port, const std::string& field) {
  const auto info = raw(port, "INFO replication", true);
  const auto at = info.find("\r\n" + field + ":");
  return at == std::string::npos ? -1 : std::atoll(info.c_str() + at + field.size() + 3);
}

int port_of(const std::string& addr) { return std::atoi(addr.c_str() + addr.rfind(':') + 1); }

// The executor alone, on a loopback peer that reads nothing: writes never block, the caller's
// or the reader thread's, however much the peer leaves unread; a caller waiting for its
// stream's bytes keeps its bound, and reads what comes on its own thread.
TEST(RedisStreamExecutorAlone, ACallerKeepsItsBoundAndWritesNeverBlock) {
  const auto listener = leasehold_test::listen_loopback();
  const int lfd = listener.first, port = listener.second;
  ASSERT_GE(lfd, 0);

  std::mutex mu;
  std::vector<leasehold::IoAnswer> answers;
  auto count = [&](auto pred) {
    std::lock_guard g(mu);
    return std::count_if(answers.begin(), answers.end(), pred);
  };
  auto opened = [&](std::uint64_t id) {
    return count([id](const auto& x) { return std::holds_alternative<leasehold::IoOpened>(x) && std::get<leasehold::IoOpened>(x).stream == id; }) == 1;
  };
  auto exec = std::make_shared<RedisStreamExecutor>("redis://127.0.0.1:" + std::to_string(port));
  exec->start([&](leasehold::IoAnswer x) {
    std::lock_guard g(mu);
    answers.push_back(std::move(x));
  });
  auto open = [&](std::uint64_t id) {
    leasehold::IoRequest r;
    r.id = r.stream = id;
    r.kind = LH_IO_OPEN;
    r.host = "127.0.0.1";
    r.port = static_cast<std::uint32_t>(port);
    r.deadline = leasehold::now_ns() + 5'000'000'000ull;
    exec->execute(std::move(r));
  };
  auto write = [&](std::uint64_t id, std::string data) {
    leasehold::IoRequest r;
    r.id = 100 + id;
    r.stream = id;
    r.kind = LH_IO_WRITE;
    r.data = std::move(data);
    exec->execute_for_caller(std::move(r));
  };
  open(1);
  const int peer = ::accept(lfd, nullptr, nullptr);
  ASSERT_GE(peer, 0);
  ASSERT_TRUE(eventually([&] { return opened(1); }, 5s));

  // 8 MiB the peer never reads: the caller's write returns, and so does the reader thread's
  // flush of the rest (a second stream still opens meanwhile).
  auto wrote = std::async(std::launch::async, [&] {
    write(1, std::string(8u << 20, 'x'));
    exec->run_pending_until(leasehold::Clock::now());  // the borrow back, nothing read
  });
  ASSERT_EQ(wrote.wait_for(5s), std::future_status::ready) << "a write blocked the caller";
  open(2);
  const int peer2 = ::accept(lfd, nullptr, nullptr);
  ASSERT_GE(peer2, 0);
  EXPECT_TRUE(eventually([&] { return opened(2); }, 5s)) << "the reader thread is stuck in a write";

  // Nothing comes: the wait ends at its bound, not before (nor seconds after).
  write(1, "");
  auto t0 = leasehold::Clock::now();
  exec->run_pending_until(t0 + 60ms);
  auto took = leasehold::Clock::now() - t0;
  EXPECT_GE(took, 60ms);
  EXPECT_LT(took, 2s) << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";

  // Bytes sent 80 ms into a long wait end it, read on the caller's thread.
  write(1, "");
  const auto before = exec->stats();
  std::thread later([&] {
    std::this_thread::sleep_for(80ms);
    [[maybe_unused]] auto n = ::send(peer, "+OK\r\n", 5, MSG_NOSIGNAL);
  });
  t0 = leasehold::Clock::now();
  exec->run_pending_until(t0 + 10s);
  took = leasehold::Clock::now() - t0;
  later.join();
  EXPECT_LT(took, 5s);
  const auto after = exec->stats();
  EXPECT_EQ(after.caller_reads - before.caller_reads, 1u);
  EXPECT_EQ(after.reader_reads, before.reader_reads);
  EXPECT_EQ(count([](const auto& x) { return std::holds_alternative<leasehold::IoReceived>(x) && std::get<leasehold::IoReceived>(x).bytes == "+OK\r\n"; }), 1);

  // A caller waiting in its read (a blocking recv on a plain stream) is woken by close().
  write(1, "");
  auto waited = std::async(std::launch::async, [&] {
    const auto start = leasehold::Clock::now();
    exec->run_pending_until(start + 30s);
    return leasehold::Clock::now() - start;
  });
  std::this_thread::sleep_for(50ms);
  exec->close();
  ASSERT_EQ(waited.wait_for(5s), std::future_status::ready) << "close() left a caller waiting in its read";
  EXPECT_LT(waited.get(), 5s);
  ::close(peer);
  ::close(peer2);
  ::close(lfd);
}

TEST(RedisStreamSentinel, ContendersFollowTheFailoverAndFencesNeverGoDown) {
  ::signal(SIGPIPE, SIG_IGN);
  if (find_redis().empty()) {
    if (leasehold_test::ci()) FAIL() << "no redis-server (CI=true: a failure)";
    GTEST_SKIP() << "no redis-server";
  }
  const auto dir = leasehold_test::temp_dir("stream-sentinel");
  const auto topology = "bash " + leasehold_test::script("redis-sentinel-test.sh");
  struct Stop {
    std::string cmd;
    ~Stop() { leasehold_test::sh(cmd); }
  } stop{topology + " stop " + dir + " >/dev/null 2>&1; rm -rf " + dir};
  const auto [rc, out] = leasehold_test::sh(topology + " start " + dir + " 2>&1");
  if (rc != 0) {
    if (leasehold_test::ci()) FAIL() << "no Sentinel topology (CI=true: a failure): " << out;
    GTEST_SKIP() << "no Sentinel topology: " << out;
  }
  std::map<std::string, std::string> top;
  std::istringstream lines(out);
  for (std::string key, value; lines >> key >> value;) top[key] = value;
  ASSERT_FALSE(top["name"].empty() || top["master"].empty() || top["replica"].empty() || top["sentinels"].empty())
      << out;
  const int master = port_of(top["master"]), replica = port_of(top["replica"]);
  const auto executor = [&] {
    leasehold::RedisStreamOptions o;
    o.url = "redis+sentinel://" + top["sentinels"] + "/" + top["name"];
    o.connect_timeout = 500ms;
    o.request_timeout = 500ms;
    return std::make_shared<RedisStreamExecutor>(o);
  };
  ClientOptions quiet;
  quiet.log = [](std::string_view) {};
  quiet.close_timeout = 2s;
  LockClient holder(executor(), quiet);
  LockClient waiter(executor(), quiet);
  std::mutex mu;
  std::vector<std::uint64_t> fences;  // every grant for the name, in order
  const auto granted = [&](const std::optional<leasehold::Lease>& l) {
    std::lock_guard g(mu);
    if (l) fences.push_back(l->fencing_token());
  };
  const auto holds = [&](int port, std::uint64_t fence) {  // the lock key there names this fence
    return raw(port, "GET lh:{failover}", true).find("\r\n" + std::to_string(fence) + " ") != std::string::npos;
  };

  auto held = holder.acquire("failover", 10s);
  ASSERT_TRUE(held.has_value()) << holder.last_backend_error();
  granted(held);
  EXPECT_TRUE(holds(master, held->fencing_token())) << "the sentinels named the master";
  auto waiting = std::async(std::launch::async, [&] {
    AcquireOptions o;
    o.wait = 25s;
    auto l = waiter.acquire("failover", 10s, std::move(o));
    granted(l);
    return l;
  });
  ASSERT_TRUE(eventually([&] { return raw(master, "ZCARD lh:{failover}:queue") == ":1"; }, 10s)) << "nobody queued";
  // The held lease and the queue entry are on the replica before the kill (written before the
  // master's offset read here).
  const auto offset = info_number(master, "master_repl_offset");
  ASSERT_GT(offset, 0);
  ASSERT_TRUE(eventually([&] { return info_number(replica, "slave_repl_offset") >= offset; }, 10s));
  const auto lookups = holder.counters().sentinel_lookups + waiter.counters().sentinel_lookups;
  const auto [pid_rc, pid] = leasehold_test::sh(topology + " pid " + dir + " master");
  ASSERT_EQ(pid_rc, 0) << pid;
  ASSERT_EQ(::kill(static_cast<pid_t>(std::stol(pid)), SIGKILL), 0);
  const auto killed = leasehold::Clock::now();

  // The sentinels name the replica (asked through the script), and it says it is a master.
  bool promoted = false;
  for (const auto end = killed + 30s; !promoted && leasehold::Clock::now() < end; std::this_thread::sleep_for(100ms))
    promoted = leasehold_test::sh(topology + " master " + dir + " 2>/dev/null").second == top["replica"] &&
               raw(replica, "ROLE", true).rfind("*3\r\n$6\r\nmaster\r\n", 0) == 0;
  ASSERT_TRUE(promoted) << "no promotion";
  const auto promotion = leasehold::Clock::now() - killed;
  EXPECT_NO_THROW((void)held->renew()) << holder.last_backend_error();
  EXPECT_TRUE(held->is_held());
  EXPECT_TRUE(holds(replica, held->fencing_token()));
  EXPECT_TRUE(eventually([&] { return raw(replica, "PUBSUB CHANNELS lh:wake:*", true).rfind("*2\r\n", 0) == 0; }, 15s))
      << "the subscribers did not follow";
  EXPECT_NE(waiting.wait_for(0s), std::future_status::ready) << "the waiter was granted while the lease was held";
  const auto released = leasehold::Clock::now();
  EXPECT_EQ(held->release(), leasehold::ReleaseOutcome::Released);
  auto next = waiting.get();
  ASSERT_TRUE(next.has_value()) << waiter.last_backend_error();
  const auto handoff = leasehold::Clock::now() - released;
  EXPECT_LT(handoff, 2s) << "the waiter was not woken by the release";
  EXPECT_TRUE(holds(replica, next->fencing_token()));
  EXPECT_EQ(next->release(), leasehold::ReleaseOutcome::Released);
  AcquireOptions o;
  o.wait = 5s;
  auto later = holder.acquire("failover", 10s, std::move(o));
  ASSERT_TRUE(later.has_value()) << holder.last_backend_error();
  granted(later);
  EXPECT_TRUE(holds(replica, later->fencing_token())) << "the later grant is not on the promoted replica";
  EXPECT_EQ(later->release(), leasehold::ReleaseOutcome::Released);
  EXPECT_GT(holder.counters().sentinel_lookups + waiter.counters().sentinel_lookups, lookups)
      << "no sentinel asked again after the kill";

  std::lock_guard g(mu);
  ASSERT_EQ(fences.size(), 3u);
  for (std::size_t i = 1; i < fences.size(); ++i)
    EXPECT_GT(fences[i], fences[i - 1]) << "grant " << i << " has a lower fence than the one before";
  const auto ms = [](auto d) { return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()); };
  std::printf("sentinel failover on the byte path: promoted %lld ms after the kill; handoff after it %lld ms; "
              "fences %llu < %llu < %llu\n",
              ms(promotion), ms(handoff), static_cast<unsigned long long>(fences[0]),
              static_cast<unsigned long long>(fences[1]), static_cast<unsigned long long>(fences[2]));
}

// A Redis Cluster (3 masters, 3 replicas) through redis+cluster://: the core learns the slot
// table and routes each name to its master's streams; a release wakes a waiter through the
// name's shard channel.
TEST_F(RedisStream, ClusterRoutesNamesAndWakesOnShardChannels) {
  const auto dir = leasehold_test::temp_dir("stream-cluster");
  const auto cluster = "bash " + leasehold_test::script("redis-cluster-test.sh");
  struct Stop {
    std::string cmd;
    ~Stop() { leasehold_test::sh(cmd); }
  } stop{cluster + " stop " + dir + " >/dev/null 2>&1; rm -rf " + dir};
  const auto [rc, out] = leasehold_test::sh(cluster + " start " + dir + " 2>&1");
  ASSERT_EQ(rc, 0) << out;
  const auto at = out.find("nodes ");
  ASSERT_NE(at, std::string::npos) << out;
  const auto nodes = out.substr(at + 6, out.find('\n', at) - at - 6);
  const auto cluster_url = "redis+cluster://" + nodes;
  auto a = leasehold::open_client(cluster_url, quiet());  // the URL entry point takes Cluster too
  // Thirty names: every master serves some (the cluster's slot ranges are fixed).
  for (int i = 0; i < 30; ++i) {
    const auto name = "s-cluster-" + std::to_string(i);
    auto lease = a.acquire(name, 10s, wait_for(3s));
    ASSERT_TRUE(lease.has_value()) << name << ": " << a.last_backend_error();
    EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Released) << name;
  }
  // The topology stream and a commands stream per master, at least.
  EXPECT_GE(a.counters().stream_opens, 4u);
  EXPECT_GE(a.counters().cluster_refreshes, 1u) << "the slot map was asked for";
  LockClient b(executor(cluster_url), quiet());
  auto held = a.acquire("s-cluster-contend", 30s);
  ASSERT_TRUE(held.has_value()) << a.last_backend_error();
  std::atomic<bool> done{false};
  auto waiter = std::async(std::launch::async, [&] {
    auto l = b.acquire("s-cluster-contend", 30s, wait_for(20s));
    done = true;
    return l;
  });
  std::this_thread::sleep_for(500ms);
  EXPECT_FALSE(done.load()) << "b got the lock while a held it";
  const auto t0 = leasehold::Clock::now();
  EXPECT_EQ(held->release(), leasehold::ReleaseOutcome::Released);
  auto got = waiter.get();
  const auto took = leasehold::Clock::now() - t0;
  ASSERT_TRUE(got.has_value()) << b.last_backend_error();
  EXPECT_GT(got->fencing_token(), held->fencing_token());
  EXPECT_LT(took, 2s) << "the waiter was not woken by the release";
  EXPECT_GE(b.counters().backend_wakeups, 1u);
  EXPECT_EQ(got->release(), leasehold::ReleaseOutcome::Released);
}

}  // namespace
