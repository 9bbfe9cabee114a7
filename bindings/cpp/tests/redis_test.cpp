// Real-Redis tests: RedisTransport against a redis-server this test starts on a free loopback
// port (stopped by its pid), and a C++ client contending with a Python client for the same names.
// Under CI=true a missing redis-server or Python environment is a failure, never a skip.
#include <leasehold.hpp>
#include <leasehold/redis_transport.hpp>

#include <gtest/gtest.h>

#include "child_process.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using leasehold::AcquireOptions;
using leasehold::ClientOptions;
using leasehold::Lease;
using leasehold::LockClient;
using leasehold::LostReason;
using leasehold::RedisOptions;
using leasehold::RedisTransport;
namespace lr = leasehold::redis;

namespace {

constexpr auto kPatience = 60s;

bool ci() {
  const char* v = std::getenv("CI");
  return v != nullptr && std::string_view(v) == "true";
}

template <class P>
bool eventually(P pred, std::chrono::milliseconds limit = kPatience) {
  const auto end = leasehold::Clock::now() + limit;
  while (!pred()) {
    if (leasehold::Clock::now() > end) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

bool executable(const std::string& p) { return ::access(p.c_str(), X_OK) == 0; }

std::string find_in_path(const std::string& prog) {
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/sbin:/usr/bin:/usr/local/bin:/sbin";
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':'))
    if (!dir.empty() && executable(dir + "/" + prog)) return dir + "/" + prog;
  return {};
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

using leasehold_test::Child;

struct RedisServer {
  Child proc;
  int port = -1;
  std::string error;

  bool start() {
    const auto bin = find_in_path("redis-server");
    if (bin.empty()) {
      error = "redis-server not found (install it: scripts/ensure-redis.sh or apt-get install redis-server)";
      return false;
    }
    for (int attempt = 0; attempt < 5; ++attempt) {
      port = free_port();
      if (port <= 0) continue;
      proc = Child::spawn({bin, "--port", std::to_string(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                           "no", "--daemonize", "no"},
                          false, "/dev/null");
      if (proc.pid <= 0) {
        error = "cannot spawn " + bin;
        continue;
      }
      const bool up = eventually(
          [&] {
            if (!proc.running()) return true;
            redisContext* c = redisConnectWithTimeout("127.0.0.1", port, lr::to_timeval(200ms));
            bool ok = false;
            if (c != nullptr && c->err == 0) {
              auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
              ok = r != nullptr && r->type == REDIS_REPLY_STATUS && std::string_view(r->str, r->len) == "PONG";
              if (r) freeReplyObject(r);
            }
            if (c) redisFree(c);
            return ok;
          },
          20s);
      if (up && proc.running()) return true;
      proc.stop();
      error = "redis-server did not answer PING on port " + std::to_string(port);
    }
    return false;
  }
  ~RedisServer() { proc.stop(); }
};

// Shared across the suite: one server.
RedisServer* g_server = nullptr;

class Redis : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::signal(SIGPIPE, SIG_IGN);  // a worker that died early must fail the test, not kill it
    if (g_server == nullptr) {
      g_server = new RedisServer();
      if (!g_server->start()) {
        // keep g_server with its error; each test reports it
      }
    }
  }
  static void TearDownTestSuite() {
    delete g_server;
    g_server = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(g_server, nullptr);
    if (g_server->proc.pid <= 0) {
      if (ci()) FAIL() << "CI=true and no Redis: " << g_server->error;
      GTEST_SKIP() << g_server->error;
    }
    conn_ = lr::connect("127.0.0.1", g_server->port, 1000ms);
    cmd({"FLUSHALL"});
  }
  lr::ReplyPtr cmd(const std::vector<std::string>& args) { return lr::command(conn_.get(), args); }
  long long integer(const std::vector<std::string>& args) {
    auto r = cmd(args);
    EXPECT_EQ(r->type, REDIS_REPLY_INTEGER) << (r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : "");
    return r->integer;
  }
  std::vector<std::string> lrange(const std::string& key) {
    auto r = cmd({"LRANGE", key, "0", "-1"});
    std::vector<std::string> v;
    for (std::size_t i = 0; i < r->elements; ++i) v.emplace_back(r->element[i]->str, r->element[i]->len);
    return v;
  }
  bool queued(const std::string& name, const std::string& wake) {
    return cmd({"ZSCORE", lr::key(lr::Key::Waiters, name), wake})->type != REDIS_REPLY_NIL;
  }
  std::vector<std::string> queue_of(const std::string& name) {
    auto r = cmd({"ZRANGE", lr::key(lr::Key::Waiters, name), "0", "-1"});
    std::vector<std::string> v;
    for (std::size_t i = 0; i < r->elements; ++i) v.emplace_back(r->element[i]->str, r->element[i]->len);
    return v;
  }
  long long subscribers(const std::string& channel) {
    auto r = cmd({"PUBSUB", "NUMSUB", channel});
    return r->elements == 2 ? r->element[1]->integer : -1;
  }
  std::shared_ptr<RedisTransport> transport(std::chrono::milliseconds command_timeout = 2000ms,
                                            leasehold::LogFn log = {}) {
    RedisOptions o;
    o.port = g_server->port;
    o.command_timeout = command_timeout;
    o.log = std::move(log);
    return std::make_shared<RedisTransport>(o);
  }
  static ClientOptions quiet(std::vector<std::string>* logs = nullptr, std::mutex* mu = nullptr) {
    ClientOptions o;
    o.close_timeout = 10s;
    o.log = [logs, mu](std::string_view m) {
      if (logs && mu) {
        std::lock_guard g(*mu);
        logs->emplace_back(m);
      }
    };
    return o;
  }
  lr::ContextPtr conn_;
};

AcquireOptions wait_for(std::chrono::nanoseconds w) {
  AcquireOptions o;
  o.wait = w;
  return o;
}

leasehold::Status catch_renew(Lease& l) {
  try {
    (void)l.renew();
  } catch (const leasehold::Error& e) {
    return e.code();
  }
  return LH_OK;
}

// "cpp:123" / "py:456" → 123 / 456
std::uint64_t token_of(const std::string& entry) {
  return std::stoull(entry.substr(entry.find(':') + 1));
}

}  // namespace

TEST_F(Redis, KeysAndScriptsComeFromTheLibrary) {
  EXPECT_EQ(lr::key(lr::Key::Lock, "orders"), "lh:{orders}");
  EXPECT_EQ(lr::key(lr::Key::Fence, "orders"), "lh:{orders}:fence");
  EXPECT_EQ(lr::key(lr::Key::Channel, "orders"), "lh:{orders}:released");
  EXPECT_EQ(lr::key(lr::Key::Waiters, "orders"), "lh:{orders}:waiters");
  EXPECT_NE(lr::script(lr::Script::Notify).find("PUBLISH"), std::string_view::npos);
  const std::string long_name(400, 'z');
  EXPECT_EQ(lr::key(lr::Key::Channel, long_name), "lh:{" + long_name + "}:released");  // buffer regrowth
  EXPECT_FALSE(lr::script(lr::Script::Acquire).empty());
  EXPECT_NE(lr::script(lr::Script::Release).find("PUBLISH"), std::string_view::npos);
  EXPECT_THROW(lr::key(static_cast<lr::Key>(99), "x"), leasehold::Error);
  EXPECT_THROW(lr::script(static_cast<lr::Script>(0)), leasehold::Error);
}

TEST_F(Redis, Lifecycle) {
  LockClient client(transport(), quiet());
  std::uint64_t fence = 0;
  {
    auto lease = client.acquire("life", 5s);
    ASSERT_TRUE(lease.has_value());
    fence = lease->fencing_token();
    EXPECT_GT(fence, 0u);
    EXPECT_TRUE(lease->is_held());
    EXPECT_EQ(integer({"EXISTS", "lh:{life}"}), 1);
    EXPECT_FALSE(client.acquire("life", 5s).has_value());  // a second lease of the same client
  }
  EXPECT_TRUE(eventually([&] { return integer({"EXISTS", "lh:{life}"}) == 0; }));
  auto again = client.acquire("life", 5s);
  ASSERT_TRUE(again.has_value());
  EXPECT_GT(again->fencing_token(), fence);
}

TEST_F(Redis, RenewsAndDetectsRejection) {
  LockClient client(transport(), quiet());
  std::atomic<int> lost{0};
  AcquireOptions o;
  o.on_lost = [&](LostReason r) {
    EXPECT_EQ(r, LostReason::Rejected);
    ++lost;
  };
  auto lease = client.acquire("renew", 1500ms, std::move(o));
  ASSERT_TRUE(lease.has_value());
  ASSERT_TRUE(eventually([&] { return client.counters().renewals_ok >= 3 || lease->lost(); }));
  EXPECT_FALSE(lease->lost());
  EXPECT_EQ(integer({"EXISTS", "lh:{renew}"}), 1);  // alive past the original TTL
  cmd({"DEL", "lh:{renew}"});                        // the server forgets us
  ASSERT_TRUE(eventually([&] { return lease->lost(); }));
  EXPECT_EQ(lease->lost_reason(), LostReason::Rejected);
  EXPECT_TRUE(eventually([&] { return lost.load() == 1; }));
  EXPECT_TRUE(lease->stop_token().stop_requested());
}

TEST_F(Redis, WaiterWokenByPubSub) {
  auto tb = transport();
  LockClient a(transport(), quiet());
  LockClient b(tb, quiet());
  auto held = a.acquire("wake", 60s);
  ASSERT_TRUE(held.has_value());
  std::optional<Lease> got;
  std::thread waiter([&] { got = b.acquire("wake", 10s, wait_for(45s)); });
  ASSERT_TRUE(eventually([&] { return tb->subscribed() >= 1; }));
  const auto old = held->fencing_token();
  held.reset();
  waiter.join();
  ASSERT_TRUE(got.has_value());
  EXPECT_GT(got->fencing_token(), old);
}

TEST_F(Redis, ErrorReplyIsATransportErrorNeverAGrant) {
  std::vector<std::string> logs;
  std::mutex mu;
  LockClient client(transport(), quiet(&logs, &mu));
  cmd({"SET", "lh:{wrong}", "not-a-hash"});
  EXPECT_FALSE(client.acquire("wrong", 5s).has_value());
  EXPECT_TRUE(eventually([&] {
    std::lock_guard g(mu);
    for (const auto& l : logs)
      if (l.find("redis error: lh: ") != std::string::npos) return true;
    return false;
  })) << "the script's error reply should be logged";
  auto kind = cmd({"TYPE", "lh:{wrong}"});
  EXPECT_EQ(std::string(kind->str, kind->len), "string");  // untouched, never granted
}

TEST_F(Redis, LossDetectedWhileServerHangs) {
  RedisServer hung;  // a private server we can SIGSTOP
  ASSERT_TRUE(hung.start()) << hung.error;
  RedisOptions o;
  o.port = hung.port;
  o.command_timeout = 5000ms;  // calls block for a long time once the server is stopped
  LockClient client(std::make_shared<RedisTransport>(o), quiet());
  auto lease = client.acquire("h", 900ms);
  ASSERT_TRUE(lease.has_value());
  ASSERT_EQ(::kill(hung.proc.pid, SIGSTOP), 0);
  const bool lost = eventually([&] { return lease->stop_token().stop_requested(); });
  ::kill(hung.proc.pid, SIGCONT);
  ASSERT_TRUE(lost);
  const auto r = *lease->lost_reason();
  EXPECT_TRUE(r == LostReason::Expired || r == LostReason::FailBudget) << leasehold::to_string(r);
  EXPECT_FALSE(lease->is_held());
}

// A process holding a lease on Redis is stopped past the lease's validity and calls release()
// as soon as it runs again: the lease ends Lost (once, with its signals), never Released.
TEST_F(Redis, PausedProcessReleaseEndsLost) {
  leasehold_test::pause_then_release({LEASEHOLD_PAUSE_WORKER, "redis", std::to_string(g_server->port)}, "paused",
                                     400ms, 900ms, 3);
  EXPECT_TRUE(eventually([&] { return integer({"EXISTS", "lh:{paused}"}) == 0; }));
}

TEST_F(Redis, ManualRenewAndReleaseOutcomes) {
  LockClient client(transport(), quiet());
  LockClient other(transport(), quiet());
  AcquireOptions o;
  o.auto_renew = false;
  auto lease = client.acquire("outcomes", 2000ms, o);
  ASSERT_TRUE(lease.has_value());
  cmd({"PEXPIRE", "lh:{outcomes}", "500"});  // so that the renewal visibly moves the server's TTL
  const auto before = lease->valid_until();
  const auto after = lease->renew();
  EXPECT_GT(after, before);
  EXPECT_GT(integer({"PTTL", "lh:{outcomes}"}), 500);
  EXPECT_EQ(client.counters().renewals_sent, 1u);  // the manual one only
  EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Released);
  EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Released);
  EXPECT_EQ(integer({"EXISTS", "lh:{outcomes}"}), 0);
  EXPECT_EQ(leasehold::to_string(lease->release()), "released");

  auto stolen = client.acquire("stolen", 30s);
  ASSERT_TRUE(stolen.has_value());
  cmd({"DEL", "lh:{stolen}"});  // the server forgot us, and someone else took it
  auto thief = other.acquire("stolen", 30s);
  ASSERT_TRUE(thief.has_value());
  EXPECT_EQ(stolen->release(), leasehold::ReleaseOutcome::NotOwner);
  EXPECT_EQ(stolen->release(), leasehold::ReleaseOutcome::NotOwner);
  EXPECT_EQ(integer({"EXISTS", "lh:{stolen}"}), 1);  // the thief's lock is untouched
  EXPECT_TRUE(thief->is_held());
  EXPECT_EQ(client.counters().releases_not_owner, 1u);
  EXPECT_EQ(catch_renew(*stolen), LH_ERR_LEASE_ENDED);
}

TEST_F(Redis, ManyThreadsFencingStrictlyIncreases) {
  constexpr int kClients = 2, kThreads = 3, kIters = 15;
  const std::vector<std::string> names{"mt0", "mt1"};
  std::vector<std::unique_ptr<LockClient>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(std::make_unique<LockClient>(transport(), quiet()));
  std::atomic<int> acquired{0}, violations{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, c, t] {
        auto conn = lr::connect("127.0.0.1", g_server->port, 1000ms);
        for (int i = 0; i < kIters; ++i) {
          const auto& name = names[static_cast<std::size_t>(i + t) % names.size()];
          auto lease = clients[static_cast<std::size_t>(c)]->acquire(name, 5s, wait_for(30s));
          if (!lease) continue;
          ++acquired;
          auto in = lr::command(conn.get(), {"INCR", "test:inside:" + name});
          if (in->integer != 1) ++violations;
          lr::command(conn.get(), {"RPUSH", "test:log:" + name, "cpp:" + std::to_string(lease->fencing_token())});
          lr::command(conn.get(), {"DECR", "test:inside:" + name});
        }
      });
    }
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(acquired.load(), kClients * kThreads * kIters);
  EXPECT_EQ(violations.load(), 0);
  for (const auto& n : names) {
    const auto log = lrange("test:log:" + n);
    EXPECT_FALSE(log.empty());
    for (std::size_t i = 1; i < log.size(); ++i)
      EXPECT_LT(token_of(log[i - 1]), token_of(log[i])) << n << " at " << i;
  }
}

TEST_F(Redis, CppAndPythonContendFencingStrictlyIncreases) {
  const std::string python = std::string(LEASEHOLD_REPO_ROOT) + "/bindings/python/.venv/bin/python";
  if (!executable(python)) {
    const std::string why = "Python environment missing: " + python + " (run bindings/python/setup-venv.sh)";
    if (ci()) FAIL() << "CI=true: " << why;
    GTEST_SKIP() << why;
  }
  const std::string lib = std::string(LEASEHOLD_REPO_ROOT) + "/target/release/libleasehold.so";
  if (executable(lib) || ::access(lib.c_str(), R_OK) == 0) ::setenv("LEASEHOLD_LIBRARY", lib.c_str(), 1);

  const std::vector<std::string> names{"pc0", "pc1", "pc2"};
  constexpr int kPyIters = 30, kCppThreads = 2, kCppIters = 15;
  char errpath[] = "/tmp/leasehold-pyworker-XXXXXX";
  const int efd = ::mkstemp(errpath);
  ASSERT_GE(efd, 0);
  ::close(efd);
  auto py = Child::spawn({python, LEASEHOLD_PY_WORKER, "--port", std::to_string(g_server->port), "--names",
                          "pc0,pc1,pc2", "--iterations", std::to_string(kPyIters)},
                         true, errpath);
  auto stderr_text = [&] {
    std::ifstream f(errpath);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  ASSERT_GT(py.pid, 0) << "cannot start " << python;
  const auto ready = py.read_line(120s);
  if (!ready || *ready != "ready") {
    py.stop();
    FAIL() << "Python worker did not start (" << ready.value_or("<no output>") << ")\n" << stderr_text();
  }

  LockClient client(transport(), quiet());
  py.write_line("go");
  std::atomic<int> acquired{0}, violations{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kCppThreads; ++t) {
    threads.emplace_back([&, t] {
      auto conn = lr::connect("127.0.0.1", g_server->port, 1000ms);
      for (int i = 0; i < kCppIters; ++i) {
        const auto& name = names[static_cast<std::size_t>(i + t) % names.size()];
        auto lease = client.acquire(name, 5s, wait_for(30s));
        if (!lease) continue;
        ++acquired;
        auto in = lr::command(conn.get(), {"INCR", "test:inside:" + name});
        if (in->integer != 1) ++violations;
        lr::command(conn.get(), {"RPUSH", "test:log:" + name, "cpp:" + std::to_string(lease->fencing_token())});
        std::this_thread::sleep_for(2ms);
        lr::command(conn.get(), {"DECR", "test:inside:" + name});
        if (!lease->is_held()) ++violations;
      }
    });
  }
  for (auto& th : threads) th.join();
  const auto summary = py.read_line(180s);
  const auto status = py.wait_exit(30s);
  const auto err = stderr_text();
  ::unlink(errpath);
  ASSERT_TRUE(status.has_value()) << "Python worker did not exit\n" << err;
  ASSERT_EQ(*status, 0) << err;
  ASSERT_TRUE(summary.has_value()) << err;
  EXPECT_NE(summary->find("\"acquired\": " + std::to_string(kPyIters)), std::string::npos) << *summary << "\n" << err;

  EXPECT_EQ(acquired.load(), kCppThreads * kCppIters);
  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(integer({"LLEN", "test:violations"}), 0) << "the Python side saw overlapping holders";
  std::size_t py_entries = 0, cpp_entries = 0;
  for (const auto& n : names) {
    const auto log = lrange("test:log:" + n);
    for (const auto& e : log) (e.rfind("py:", 0) == 0 ? py_entries : cpp_entries)++;
    for (std::size_t i = 1; i < log.size(); ++i)
      EXPECT_LT(token_of(log[i - 1]), token_of(log[i])) << n << ": " << log[i - 1] << " then " << log[i];
  }
  EXPECT_EQ(py_entries, static_cast<std::size_t>(kPyIters));
  EXPECT_EQ(cpp_entries, static_cast<std::size_t>(kCppThreads * kCppIters));
}

// --- protocol 2: one wake-up per release -------------------------------------------------------

namespace {

// Waiter threads that each acquire `name` on their own LockClient (own RedisTransport), record
// the grant and hold it until the test lets them go. Cleanup lets everyone go and closes the
// clients (which ends waits that are still running), so a failed assertion never hangs.
struct Waiters {
  struct One {
    std::shared_ptr<RedisTransport> t;
    std::unique_ptr<LockClient> c;
    std::thread th;
  };
  std::vector<One> w;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::size_t> order;          // indices, in the order they got the lock
  std::vector<std::uint64_t> tokens;       // their fencing tokens, same order
  std::vector<bool> go;                    // may release
  bool all_go = false;

  void start(std::shared_ptr<RedisTransport> t, const std::string& name, std::chrono::milliseconds ttl,
             std::chrono::nanoseconds wait) {
    const std::size_t i = w.size();
    {
      std::lock_guard g(mu);
      go.push_back(false);
    }
    auto c = std::make_unique<LockClient>(t, Redis_quiet());
    LockClient* cp = c.get();
    w.push_back(One{std::move(t), std::move(c), {}});
    w.back().th = std::thread([this, i, cp, name, ttl, wait] {
      auto lease = cp->acquire(name, ttl, wait_for(wait));
      std::unique_lock l(mu);
      if (lease) {
        order.push_back(i);
        tokens.push_back(lease->fencing_token());
      }
      cv.notify_all();
      cv.wait(l, [&] { return all_go || go[i]; });
      l.unlock();
      if (lease) lease->release();
    });
  }
  void let_go(std::size_t i) {
    std::lock_guard g(mu);
    go[i] = true;
    cv.notify_all();
  }
  std::size_t granted() {
    std::lock_guard g(mu);
    return order.size();
  }
  std::size_t winner(std::size_t k) {
    std::lock_guard g(mu);
    return order.at(k);
  }
  ~Waiters() {
    {
      std::lock_guard g(mu);
      all_go = true;
      cv.notify_all();
    }
    for (auto& o : w) o.c->close();
    for (auto& o : w)
      if (o.th.joinable()) o.th.join();
  }
  static ClientOptions Redis_quiet() {
    ClientOptions o;
    o.close_timeout = 10s;
    o.log = [](std::string_view) {};
    return o;
  }
};

}  // namespace

TEST_F(Redis, WakeChannelIsRandomAndPerTransport) {
  auto a = transport();
  auto b = transport();
  EXPECT_EQ(a->wake_channel().rfind("lh:wake:", 0), 0u);
  EXPECT_EQ(a->wake_channel().size(), 8u + 32u);
  EXPECT_EQ(a->wake_channel().find_first_not_of("0123456789abcdef", 8), std::string::npos);
  EXPECT_NE(a->wake_channel(), b->wake_channel());
  EXPECT_EQ(a->subscribed(), 0u);  // nothing subscribed before the first waiter
  EXPECT_FALSE(a->wake_ready());
}

// N waiters on N transports: each release wakes exactly one (the oldest queued), that one
// acquires, the others make no attempt; everyone gets the lock in queue order, tokens rising.
TEST_F(Redis, ReleaseWakesOneQueuedWaiterAtATime) {
  constexpr std::size_t kWaiters = 5;
  const std::string name = "herd";
  LockClient holder(transport(), quiet());
  auto held = holder.acquire(name, 120s);  // parked waiters sleep ~120 s: only a wake-up moves them
  ASSERT_TRUE(held.has_value());

  Waiters ws;
  for (std::size_t i = 0; i < kWaiters; ++i) {
    ws.start(transport(), name, 30s, 90s);
    // One at a time, so the queue order is the start order; past the quick retries.
    ASSERT_TRUE(eventually([&] {
      return queued(name, ws.w[i].t->wake_channel()) && ws.w[i].c->counters().acquires_sent >= 3;
    })) << "waiter " << i << " never queued";
  }
  const auto queue = queue_of(name);
  ASSERT_EQ(queue.size(), kWaiters);
  for (std::size_t i = 0; i < kWaiters; ++i) EXPECT_EQ(queue[i], ws.w[i].t->wake_channel()) << i;
  for (auto& o : ws.w) EXPECT_EQ(o.t->stats().wakeups, 0u);

  std::uint64_t last_token = held->fencing_token();
  for (std::size_t k = 0; k < kWaiters; ++k) {
    std::vector<std::uint64_t> wakeups_before, attempts_before;
    for (auto& o : ws.w) {
      wakeups_before.push_back(o.t->stats().wakeups);
      attempts_before.push_back(o.c->counters().acquires_sent);
    }
    if (k == 0) {
      held.reset();
    } else {
      ws.let_go(ws.winner(k - 1));
    }
    ASSERT_TRUE(eventually([&] { return ws.granted() == k + 1; })) << "nobody got the lock after release " << k;
    const std::size_t win = ws.winner(k);
    EXPECT_EQ(win, k) << "the oldest queued waiter should win";
    for (std::size_t i = 0; i < kWaiters; ++i) {
      const auto woke = ws.w[i].t->stats().wakeups - wakeups_before[i];
      EXPECT_EQ(woke, i == win ? 1u : 0u) << "release " << k << ", waiter " << i;
      if (i != win && i > k) {  // still parked: no attempt at all
        EXPECT_EQ(ws.w[i].c->counters().acquires_sent, attempts_before[i]) << "release " << k << ", waiter " << i;
      }
    }
    {
      std::lock_guard g(ws.mu);
      EXPECT_GT(ws.tokens[k], last_token);
      last_token = ws.tokens[k];
    }
    // The winner's unwatch removes its entry (re-added at the back by its grant).
    ASSERT_TRUE(eventually([&] { return !queued(name, ws.w[win].t->wake_channel()); }));
    EXPECT_EQ(queue_of(name).size(), kWaiters - k - 1);
  }
  ws.let_go(ws.winner(kWaiters - 1));
  EXPECT_TRUE(eventually([&] { return integer({"EXISTS", lr::key(lr::Key::Lock, name)}) == 0; }));
  std::uint64_t passed_on = 0;
  for (auto& o : ws.w) passed_on += o.t->stats().passed_on;
  EXPECT_EQ(passed_on, 0u);
}

// A queued waiter whose transport is gone is skipped: the next live one is woken.
TEST_F(Redis, DeadQueuedWaiterIsSkipped) {
  const std::string name = "dead";
  LockClient holder(transport(), quiet());
  auto held = holder.acquire(name, 120s);
  ASSERT_TRUE(held.has_value());
  Waiters ws;
  for (std::size_t i = 0; i < 2; ++i) {
    ws.start(transport(), name, 30s, 90s);
    ASSERT_TRUE(eventually([&] {
      return queued(name, ws.w[i].t->wake_channel()) && ws.w[i].c->counters().acquires_sent >= 3;
    }));
  }
  const std::string dead = ws.w[0].t->wake_channel(), live = ws.w[1].t->wake_channel();
  ASSERT_EQ(queue_of(name), (std::vector<std::string>{dead, live}));
  ws.w[0].t->close();  // dies without dequeuing (its pool is closed, no ZREM possible)
  ASSERT_TRUE(eventually([&] { return subscribers(dead) == 0; }));
  EXPECT_TRUE(queued(name, dead));

  held.reset();
  ASSERT_TRUE(eventually([&] { return ws.granted() == 1; }));
  EXPECT_EQ(ws.winner(0), 1u);
  EXPECT_EQ(ws.w[1].t->stats().wakeups, 1u);
  EXPECT_EQ(ws.w[0].t->stats().wakeups, 0u);
  EXPECT_FALSE(queued(name, dead)) << "the dead entry is popped and dropped";
}

// A stale entry (a live transport that no longer waits) is passed on with NOTIFY.
TEST_F(Redis, StaleEntryIsPassedOnToARealWaiter) {
  const std::string name = "stale";
  auto stray = transport();
  stray->watch("warm-up", {});  // subscribes the wake channel, which then lingers
  ASSERT_TRUE(eventually([&] { return stray->wake_ready(); }));
  stray->unwatch("warm-up");

  LockClient holder(transport(), quiet());
  auto held = holder.acquire(name, 120s);
  ASSERT_TRUE(held.has_value());
  Waiters ws;
  ws.start(transport(), name, 30s, 90s);
  ASSERT_TRUE(eventually([&] {
    return queued(name, ws.w[0].t->wake_channel()) && ws.w[0].c->counters().acquires_sent >= 3;
  }));
  // Older than the real waiter's entry, as if `stray` had queued and quit without ZREM.
  ASSERT_EQ(integer({"ZADD", lr::key(lr::Key::Waiters, name), "1", stray->wake_channel()}), 1);
  ASSERT_EQ(queue_of(name).front(), stray->wake_channel());

  const auto old = held->fencing_token();
  held.reset();
  ASSERT_TRUE(eventually([&] { return ws.granted() == 1; }));
  EXPECT_EQ(stray->stats().wakeups, 1u);
  EXPECT_EQ(stray->stats().passed_on, 1u);
  EXPECT_EQ(ws.w[0].t->stats().wakeups, 1u);
  EXPECT_EQ(ws.w[0].t->stats().passed_on, 0u);
  EXPECT_FALSE(queued(name, stray->wake_channel()));
  std::lock_guard g(ws.mu);
  EXPECT_GT(ws.tokens[0], old);
}

// The friend accessor LockClient declares for tests.
struct leasehold::detail::TestAccess {
  static Transport::WakeCallback waiter_callback(LockClient& c) { return c.state()->waiter_callback(); }
};

// The window between a client's core ending its last wait for a name (Unwatch) and its
// transport's unwatch: the transport still has the client's callback, the core no longer waits.
// A wake-up then must be declined and passed on, not swallowed by a core that drops it.
TEST_F(Redis, WakeUpDeclinedByAClientThatNoLongerWaitsIsPassedOn) {
  const std::string name = "declined";
  LockClient holder(transport(), quiet());
  auto held = holder.acquire(name, 120s);  // B's retry hint: ~120 s, past its wait
  ASSERT_TRUE(held.has_value());

  // A's core does not wait for `name`; its transport still holds A's waiter callback for it.
  auto ta = transport();
  LockClient a(ta, quiet());
  ta->watch_waiter(name, leasehold::detail::TestAccess::waiter_callback(a));
  ASSERT_TRUE(eventually([&] { return ta->wake_ready(); }));

  Waiters ws;
  ws.start(transport(), name, 30s, 60s);
  ASSERT_TRUE(eventually([&] {
    return queued(name, ws.w[0].t->wake_channel()) && ws.w[0].c->counters().acquires_sent >= 3;
  }));
  ASSERT_EQ(integer({"ZADD", lr::key(lr::Key::Waiters, name), "0", ta->wake_channel()}), 1);
  ASSERT_EQ(queue_of(name).front(), ta->wake_channel());

  held.reset();
  EXPECT_TRUE(eventually([&] { return ws.granted() == 1; }, 15s))
      << "the wake-up went to A, which no longer waits, and was not passed on to B";
  EXPECT_EQ(ta->stats().wakeups, 1u);
  EXPECT_EQ(ta->stats().passed_on, 1u);
  EXPECT_EQ(ws.w[0].t->stats().wakeups, 1u);
  EXPECT_EQ(a.counters().acquires_sent, 0u);
  EXPECT_FALSE(queued(name, ta->wake_channel()));
  ta->unwatch(name);
}

// A waiters key of the wrong type: a contended (queueing) acquire is a transport error, never a
// grant; the release still works and leaves the key alone.
TEST_F(Redis, WrongTypeWaitersKeyIsATransportError) {
  const std::string name = "wt", waiters = lr::key(lr::Key::Waiters, "wt");
  cmd({"SET", waiters, "not-a-zset"});
  LockClient holder(transport(), quiet());
  auto held = holder.acquire(name, 120s);
  ASSERT_TRUE(held.has_value());

  std::vector<std::string> logs;
  std::mutex mu;
  auto tw = transport(2000ms, quiet(&logs, &mu).log);
  {
    LockClient waiter(tw, quiet(&logs, &mu));
    EXPECT_FALSE(waiter.acquire(name, 5s, wait_for(3s)).has_value());
    EXPECT_GE(tw->stats().queued_acquires, 1u);
    EXPECT_TRUE(eventually([&] {
      std::lock_guard g(mu);
      for (const auto& l : logs)
        if (l.find("redis error: lh: waiters key") != std::string::npos) return true;
      return false;
    })) << "the queueing acquire's lh: error should be logged as a transport error";
    // The unwatch's ZREM hits the same garbage: logged, nothing else.
    EXPECT_TRUE(eventually([&] {
      std::lock_guard g(mu);
      for (const auto& l : logs)
        if (l.find("ZREM " + waiters) != std::string::npos) return true;
      return false;
    }));
  }
  EXPECT_TRUE(held->is_held());
  held->release();
  EXPECT_TRUE(eventually([&] { return integer({"EXISTS", lr::key(lr::Key::Lock, name)}) == 0; }));
  auto kind = cmd({"TYPE", waiters});
  EXPECT_EQ(std::string(kind->str, kind->len), "string");
  LockClient again(transport(), quiet());
  EXPECT_TRUE(again.acquire(name, 5s).has_value());  // uncontended: the plain form
}

// The transport alone: plain ACQUIRE until the name waits and the wake channel is confirmed,
// then queueing; a release reaches the waiting name's callback; unwatch dequeues at once.
TEST_F(Redis, TransportQueuesOnlyWaitingNames) {
  const std::string name = "tq";
  auto a = transport();
  auto b = transport();
  ASSERT_TRUE(std::holds_alternative<leasehold::Granted>(b->acquire(name, "other", 60000)));
  ASSERT_TRUE(std::holds_alternative<leasehold::HeldByOther>(a->acquire(name, "mine", 60000)));
  EXPECT_EQ(a->stats().queued_acquires, 0u);
  EXPECT_EQ(integer({"EXISTS", lr::key(lr::Key::Waiters, name)}), 0);

  std::atomic<int> calls{0};
  a->watch(name, [&](std::string_view n) {
    EXPECT_EQ(n, name);
    ++calls;
  });
  ASSERT_TRUE(eventually([&] { return a->wake_ready() && calls.load() == 1; }))
      << "the confirmed subscription re-checks every waiting name once";
  ASSERT_TRUE(std::holds_alternative<leasehold::HeldByOther>(a->acquire(name, "mine", 60000)));
  EXPECT_EQ(a->stats().queued_acquires, 1u);
  EXPECT_TRUE(queued(name, a->wake_channel()));

  ASSERT_EQ(b->release(name, "other", {}), leasehold::ReleaseResult::Released);
  ASSERT_TRUE(eventually([&] { return calls.load() == 2; }));
  EXPECT_EQ(a->stats().wakeups, 1u);
  EXPECT_FALSE(queued(name, a->wake_channel())) << "popped by the release";

  ASSERT_TRUE(std::holds_alternative<leasehold::Granted>(a->acquire(name, "mine", 60000)));
  EXPECT_TRUE(queued(name, a->wake_channel())) << "a queueing grant stays queued at the back";
  a->unwatch(name);
  EXPECT_FALSE(queued(name, a->wake_channel())) << "unwatch removes the entry before it returns";
  EXPECT_EQ(a->release(name, "mine", {}), leasehold::ReleaseResult::Released);

  // Waiting again while the subscription is confirmed: one re-check, from watch itself.
  a->watch(name, [&](std::string_view) { ++calls; });
  EXPECT_EQ(calls.load(), 3);
  a->unwatch(name);
  EXPECT_EQ(a->stats().passed_on, 0u);
}
