// Real-Redis tests: RedisExecutor against a redis-server this test starts on a free loopback
// port (stopped by its pid), and a C++ client contending with a Python client for the same names.
// Under CI=true a missing redis-server or Python environment is a failure, never a skip.
#include <leasehold.hpp>
#include <leasehold/redis_executor.hpp>

#include <gtest/gtest.h>

#include "child_process.hpp"
#include "reply_threads.hpp"
#include "stall_proxy.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <variant>
#include <vector>

using namespace std::chrono_literals;
using leasehold::AcquireOptions;
using leasehold::ClientOptions;
using leasehold::Lease;
using leasehold::LockClient;
using leasehold::LostReason;
using leasehold::RedisOptions;
using leasehold::RedisExecutor;

// Test-side hiredis helpers (the tests inspect the server directly).
namespace lr {
struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;
struct ContextDeleter {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;
inline timeval to_timeval(std::chrono::milliseconds ms) {
  return timeval{static_cast<time_t>(ms.count() / 1000), static_cast<suseconds_t>(ms.count() % 1000 * 1000)};
}
inline ContextPtr connect(const std::string& host, int port, std::chrono::milliseconds timeout) {
  ContextPtr c(redisConnectWithTimeout(host.c_str(), port, to_timeval(timeout)));
  if (!c || c->err) throw std::runtime_error("redis connect failed");
  return c;
}
inline ReplyPtr command(redisContext* c, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  for (const auto& a : args) argv.push_back(a.data()), lens.push_back(a.size());
  auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
  if (r == nullptr) throw std::runtime_error("redis io error");
  return ReplyPtr(r);
}
}  // namespace lr

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

  std::vector<std::string> extra;  // more redis-server arguments (persistence)

  bool start() {
    for (int attempt = 0; attempt < 5; ++attempt) {
      port = free_port();
      if (port > 0 && launch()) return true;
    }
    return false;
  }
  // Stops the server (SIGTERM, so it shuts down cleanly) and starts it again on the same port.
  bool restart() {
    proc.stop();
    return launch();
  }
  bool launch() {
    const auto bin = find_in_path("redis-server");
    if (bin.empty()) {
      error = "redis-server not found (install it: scripts/ensure-redis.sh or apt-get install redis-server)";
      return false;
    }
    std::vector<std::string> args{bin, "--port", std::to_string(port), "--bind", "127.0.0.1", "--daemonize", "no"};
    if (extra.empty()) args.insert(args.end(), {"--save", "", "--appendonly", "no"});
    args.insert(args.end(), extra.begin(), extra.end());
    proc = Child::spawn(args, false, "/dev/null");
    if (proc.pid <= 0) {
      error = "cannot spawn " + bin;
      return false;
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
  long long zcard(const std::string& key) { return integer({"ZCARD", key}); }
  std::size_t wake_channels() {
    auto r = cmd({"PUBSUB", "CHANNELS", "lh:wake:*"});
    return r->type == REDIS_REPLY_ARRAY ? r->elements : 0;
  }
  // Subscribers of the wake channel of the queue's first entry ("<channel>#<token>").
  long long head_listeners(const std::string& queue) {
    auto r = cmd({"ZRANGE", queue, "0", "0"});
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 1) return -1;
    const std::string entry(r->element[0]->str, r->element[0]->len);
    return subscribers(entry.substr(0, entry.find('#')));
  }
  // Script calls the server ran (EVALSHA + EVAL) since the last CONFIG RESETSTAT.
  long long script_calls() {
    auto r = cmd({"INFO", "commandstats"});
    const std::string info(r->str, r->len);
    long long n = 0;
    for (const char* k : {"cmdstat_evalsha:calls=", "cmdstat_eval:calls="})
      if (auto at = info.find(k); at != std::string::npos) n += std::stoll(info.substr(at + std::strlen(k)));
    return n;
  }
  long long subscribers(const std::string& channel) {
    auto r = cmd({"PUBSUB", "NUMSUB", channel});
    return r->elements == 2 ? r->element[1]->integer : -1;
  }
  std::shared_ptr<RedisExecutor> transport(std::chrono::milliseconds command_timeout = 2000ms,
                                            leasehold::LogFn log = {}, std::uint64_t standby_delay_ms = 0) {
    RedisOptions o;
    o.port = g_server->port;
    if (standby_delay_ms != 0) {
      leasehold::RedisProtocolOptions ro;
      ro.standby_delay_ms = standby_delay_ms;
      o.protocol = ro;
    }
    o.command_timeout = command_timeout;
    o.log = std::move(log);
    return std::make_shared<RedisExecutor>(o);
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
    const auto st = client.status("life");  // the core's read-only STATUS script
    ASSERT_TRUE(st.ok) << st.error;
    EXPECT_TRUE(st.held);
    EXPECT_EQ(st.fencing_token, fence);
    EXPECT_EQ(st.last_fencing_token, fence);
    EXPECT_GT(st.remaining_ttl_ms, 0u);
    EXPECT_LE(st.remaining_ttl_ms, 5000u);
  }
  EXPECT_TRUE(eventually([&] { return integer({"EXISTS", "lh:{life}"}) == 0; }));
  const auto free = client.status("life");
  ASSERT_TRUE(free.ok) << free.error;
  EXPECT_FALSE(free.held);
  EXPECT_EQ(free.last_fencing_token, fence);
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
  ASSERT_TRUE(eventually([&] { return zcard("lh:{wake}:queue") == 1 && wake_channels() >= 1; }));
  const auto old = held->fencing_token();
  held.reset();
  waiter.join();
  ASSERT_TRUE(got.has_value());
  EXPECT_GT(got->fencing_token(), old);
}

// Garbage under the lock's name (a key of another type) is an error, never a grant, and is
// left alone; the lease fails by its wait budget.
TEST_F(Redis, GarbageKeyIsAnErrorNeverAGrant) {
  LockClient client(transport(), quiet());
  cmd({"SET", "lh:{wrong}", "not-a-hash"});
  cmd({"HSET", "lh:{tokenless}", "x", "1"});
  EXPECT_FALSE(client.acquire("wrong", 5s).has_value());
  EXPECT_FALSE(client.acquire("wrong", 5s, wait_for(600ms)).has_value());
  EXPECT_FALSE(client.acquire("tokenless", 5s, wait_for(600ms)).has_value());
  auto kind = cmd({"TYPE", "lh:{wrong}"});
  EXPECT_EQ(std::string(kind->str, kind->len), "string");  // untouched, never granted
  EXPECT_EQ(client.counters().grants, 0u);
  cmd({"DEL", "lh:{wrong}"});
  EXPECT_TRUE(client.acquire("wrong", 5s).has_value());  // and the name works once it is gone
}

TEST_F(Redis, LossDetectedWhileServerHangs) {
  RedisServer hung;  // a private server we can SIGSTOP
  ASSERT_TRUE(hung.start()) << hung.error;
  RedisOptions o;
  o.port = hung.port;
  o.command_timeout = 5000ms;  // calls block for a long time once the server is stopped
  LockClient client(std::make_shared<RedisExecutor>(o), quiet());
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

// An application call keeps its bound when the server stalls: the IO run on the caller's thread
// ends by the caller's deadline and the rest continues on the executor's thread. A proxy holds
// back every reply of the server for kStall; the bounds asserted are those the calls document
// plus kMargin for a loaded machine, never a speed.
constexpr auto kStall = 1500ms;
constexpr auto kMargin = 500ms;

std::shared_ptr<RedisExecutor> through(const leasehold_test::StallProxy& p) {
  RedisOptions o;
  o.port = p.port();
  o.command_timeout = 5000ms;  // longer than the stall: the late replies are read, not failed
  return std::make_shared<RedisExecutor>(o);
}

TEST_F(Redis, ReleaseReturnsByItsBoundWhenTheServerStallsAndCompletesLater) {
  leasehold_test::StallProxy proxy(g_server->port);
  LockClient client(through(proxy), quiet());
  auto lease = client.acquire("rel", 30s);
  ASSERT_TRUE(lease.has_value());
  proxy.delay_ms = static_cast<int>(kStall.count());
  const auto t0 = leasehold::Clock::now();
  const auto out = lease->release(100ms);
  const auto took = leasehold::Clock::now() - t0;
  EXPECT_EQ(out, leasehold::ReleaseOutcome::Released);
  EXPECT_FALSE(lease->is_held());
  EXPECT_LT(took, 100ms + kMargin) << "release(100ms) took "
                                   << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  EXPECT_EQ(client.counters().releases_confirmed, 0u) << "the reply came before the stall ended";
  std::printf("release(100ms) with the replies held back %lld ms: returned in %lld ms\n",
              static_cast<long long>(kStall.count()),
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
  proxy.delay_ms = 0;
  // The core waits for the service's answer, which comes once the stall ends.
  EXPECT_TRUE(eventually([&] { return client.counters().releases_confirmed == 1; }, 30s));
  EXPECT_EQ(integer({"EXISTS", "lh:{rel}"}), 0);
}

TEST_F(Redis, AcquireFailsByItsBoundWhenTheServerStallsAndALateGrantIsReleased) {
  leasehold_test::StallProxy proxy(g_server->port);
  ClientOptions co = quiet();
  co.config.request_timeout_ns = 300'000'000;  // an acquire's bound: its wait + 0.3 s
  LockClient client(through(proxy), co);
  auto warm = client.acquire("warm", 30s);  // the scripts are loaded: the stalled ACQUIRE grants
  ASSERT_TRUE(warm.has_value());
  ASSERT_EQ(warm->release(), leasehold::ReleaseOutcome::Released);
  proxy.delay_ms = static_cast<int>(kStall.count());
  const auto t0 = leasehold::Clock::now();
  const auto lease = client.acquire("acq", 30s, wait_for(100ms));
  const auto took = leasehold::Clock::now() - t0;
  EXPECT_FALSE(lease.has_value());
  EXPECT_LT(took, 100ms + 300ms + kMargin)
      << "acquire(wait 100ms) took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  EXPECT_EQ(integer({"EXISTS", "lh:{acq}"}), 1) << "the server granted the stalled ACQUIRE";
  std::printf("acquire(wait 100ms, request timeout 300ms) with the replies held back %lld ms: failed in %lld ms\n",
              static_cast<long long>(kStall.count()),
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
  proxy.delay_ms = 0;
  // The grant answered after the acquire failed is released: no lock leaks.
  EXPECT_TRUE(eventually([&] { return integer({"EXISTS", "lh:{acq}"}) == 0; }, 30s)) << "the late grant leaked";
  EXPECT_TRUE(eventually([&] { return client.counters().live_leases == 0; }, 30s));
  LockClient other(transport(), quiet());
  EXPECT_TRUE(other.acquire("acq", 5s).has_value());
}

// A LockClient closed while the commands thread reads the replies an application thread left
// to it: close() keeps its own bound, and the late replies are never fed.
TEST_F(Redis, CloseDuringAStallKeepsItsBound) {
  leasehold_test::StallProxy proxy(g_server->port);
  ClientOptions co = quiet();
  co.close_timeout = 200ms;
  LockClient client(through(proxy), co);
  auto warm = client.acquire("warm", 30s);  // the scripts are loaded: the stalled RELEASE releases
  ASSERT_TRUE(warm.has_value());
  ASSERT_EQ(warm->release(), leasehold::ReleaseOutcome::Released);
  auto lease = client.acquire("closing", 30s);
  ASSERT_TRUE(lease.has_value());
  proxy.delay_ms = static_cast<int>(kStall.count());
  EXPECT_EQ(lease->release(100ms), leasehold::ReleaseOutcome::Released);
  const auto t0 = leasehold::Clock::now();
  client.close();
  const auto took = leasehold::Clock::now() - t0;
  EXPECT_LT(took, 200ms + kMargin) << "close() took "
                                   << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  proxy.delay_ms = 0;
  EXPECT_TRUE(eventually([&] { return integer({"EXISTS", "lh:{closing}"}) == 0; }, 5s));  // the server ran it
}

// An answer in time is read on the thread of the call that waits for it: no hop to the
// commands thread and back.
TEST_F(Redis, AnAnswerInTimeIsReadOnTheCallersThread) {
  auto rec = std::make_shared<leasehold_test::ReplyThreads>(transport());
  LockClient client(rec, quiet());
  const auto me = std::this_thread::get_id();
  for (int i = 0; i < 3; ++i) {
    const auto before = rec->since(0).size();
    auto lease = client.acquire("fast", 30s);
    ASSERT_TRUE(lease.has_value());
    const auto acquired = rec->since(before);
    EXPECT_NE(std::find(acquired.begin(), acquired.end(), me), acquired.end())
        << "acquire's reply came on another thread";
    const auto held = rec->since(0).size();
    EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Released);
    const auto released = rec->since(held);
    EXPECT_NE(std::find(released.begin(), released.end(), me), released.end())
        << "release's reply came on another thread";
  }
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

// Waiter threads that each acquire `name` on their own LockClient (own RedisExecutor), record
// the grant and hold it until the test lets them go. Cleanup lets everyone go and closes the
// clients (which ends waits that are still running), so a failed assertion never hangs.
struct Waiters {
  struct One {
    std::shared_ptr<RedisExecutor> t;
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

  void start(std::shared_ptr<RedisExecutor> t, const std::string& name, std::chrono::milliseconds ttl,
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
  void let_all_go() {
    std::lock_guard g(mu);
    all_go = true;
    cv.notify_all();
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


// --- the handoff protocol against a real server ------------------------------------------------

// A waiter frozen at the head of the queue (SIGSTOP'd process, subscriber socket still open, so
// the release's wake-up "reaches" it) keeps the lock free only until a standby takes over.
TEST_F(Redis, FrozenWaiterAtTheHeadDoesNotKeepTheLockFree) {
  const std::string name = "frozen", queue = "lh:{frozen}:queue";
  LockClient holder(transport(), quiet());
  auto held = holder.acquire(name, 60s);  // a waiter's own retry would come ~60 s later
  ASSERT_TRUE(held.has_value());
  auto worker = Child::spawn({LEASEHOLD_PAUSE_WORKER, "redis", std::to_string(g_server->port)}, true, "");
  ASSERT_GT(worker.pid, 0);
  worker.write_line("acquire " + name + " 30000 60000");
  // Queued, and its wake channel subscribed on the server (so PUBLISH counts it as a listener).
  ASSERT_TRUE(eventually([&] { return zcard(queue) == 1 && head_listeners(queue) == 1; })) << "the worker never queued";
  ASSERT_EQ(::kill(worker.pid, SIGSTOP), 0);

  LockClient live(transport(), quiet());
  std::optional<Lease> got;
  leasehold::Clock::time_point got_at{};
  std::thread waiter([&] {
    got = live.acquire(name, 10s, wait_for(45s));
    got_at = leasehold::Clock::now();
  });
  const bool queued = eventually([&] { return zcard(queue) == 2; });
  const auto released_at = leasehold::Clock::now();
  held->release();
  waiter.join();
  worker.stop();  // SIGCONT + SIGTERM
  ASSERT_TRUE(queued) << "the live waiter never queued behind the frozen one";
  ASSERT_TRUE(got.has_value());
  const auto delay = std::chrono::duration<double, std::milli>(got_at - released_at).count();
  std::printf("frozen waiter at the head: the live waiter got the lock %.1f ms after the release\n", delay);
  EXPECT_LT(delay, 2000.0);  // the standby delay is 150 ms; without the standby it would be ~60 s
  EXPECT_GT(got->fencing_token(), held->fencing_token());
}

// An ordinary handoff between queued waiters costs two script calls (the RELEASE and the woken
// waiter's ACQUIRE), counting every waiter's calls; idle waiters send none.
TEST_F(Redis, HandoffBetweenQueuedWaitersCostsAtMostTwoScriptCalls) {
  constexpr std::size_t kWaiters = 4;
  const std::string name = "handoff", queue = "lh:{handoff}:queue";
  LockClient holder(transport(), quiet());
  ASSERT_TRUE(holder.acquire("warm-up", 5s).has_value());  // loads the scripts (no NOSCRIPT below)
  auto held = holder.acquire(name, 60s);
  ASSERT_TRUE(held.has_value());
  Waiters ws;
  for (std::size_t i = 0; i < kWaiters; ++i) {
    // A long standby delay: only ordinary handoffs here, no standby taking over on a slow box.
    ws.start(transport(2000ms, {}, 20000), name, 30s, 60s);
    ASSERT_TRUE(eventually([&] { return zcard(queue) == static_cast<long long>(i + 1); })) << "waiter " << i;
  }
  ws.let_all_go();  // each releases as soon as it holds
  std::this_thread::sleep_for(300ms);
  cmd({"CONFIG", "RESETSTAT"});
  EXPECT_EQ(script_calls(), 0) << "idle waiters send nothing";
  held->release();
  ASSERT_TRUE(eventually([&] { return ws.granted() == kWaiters; }));
  ASSERT_TRUE(eventually([&] { return integer({"EXISTS", "lh:{handoff}"}) == 0; }));
  std::this_thread::sleep_for(200ms);  // the last release's reply
  const auto calls = script_calls();
  std::printf("%zu handoffs between queued waiters: %lld script calls (incl. the first RELEASE)\n", kWaiters, calls);
  EXPECT_LE(calls, static_cast<long long>(1 + 2 * kWaiters));
  std::lock_guard g(ws.mu);
  for (std::size_t k = 0; k < kWaiters; ++k) EXPECT_EQ(ws.order[k], k) << "queue order";
  for (std::size_t k = 1; k < ws.tokens.size(); ++k) EXPECT_LT(ws.tokens[k - 1], ws.tokens[k]);
}

// CLIENT KILL TYPE pubsub drops the subscriber connection under a queued waiter; the release
// that follows reaches nobody. The executor reports the subscription lost, the core subscribes
// again and re-checks, and the waiter gets the lock long before the holder's TTL.
TEST_F(Redis, KilledPubSubConnectionRecovers) {
  const std::string name = "killsub";
  LockClient holder(transport(), quiet());
  auto held = holder.acquire(name, 60s);
  ASSERT_TRUE(held.has_value());
  LockClient live(transport(), quiet());
  std::optional<Lease> got;
  std::thread waiter([&] { got = live.acquire(name, 10s, wait_for(30s)); });
  const bool queued = eventually([&] { return zcard("lh:{killsub}:queue") == 1 && wake_channels() == 2; });
  if (queued) {
    EXPECT_GE(integer({"CLIENT", "KILL", "TYPE", "pubsub"}), 2);
  }
  held->release();
  waiter.join();
  ASSERT_TRUE(queued);
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(eventually([&] { return wake_channels() >= 1; })) << "subscribed again";
}

// A holder killed outright (no release) is taken over once its TTL ran out, with a larger fence.
TEST_F(Redis, KilledHolderIsTakenOver) {
  auto worker = Child::spawn({LEASEHOLD_PAUSE_WORKER, "redis", std::to_string(g_server->port)}, true, "");
  ASSERT_GT(worker.pid, 0);
  worker.write_line("acquire victim 1000");
  const auto held = worker.read_line(60s);
  ASSERT_TRUE(held && held->rfind("held ", 0) == 0) << held.value_or("<none>");
  const auto fence = std::stoull(held->substr(5));
  ASSERT_EQ(::kill(worker.pid, SIGKILL), 0);
  worker.stop();
  LockClient client(transport(), quiet());
  auto lease = client.acquire("victim", 5s, wait_for(20s));
  ASSERT_TRUE(lease.has_value());
  EXPECT_GT(lease->fencing_token(), fence);
}

// A restart without persistence forgets the lock: the holder's renewal is refused (Rejected),
// and the next grant's fence is still larger (server time). With an fsync'd AOF the lock
// survives the restart and the lease keeps renewing.
TEST_F(Redis, RestartWithoutPersistenceLosesTheLeaseFencesStillIncrease) {
  RedisServer server;
  ASSERT_TRUE(server.start()) << server.error;
  RedisOptions o;
  o.port = server.port;
  LockClient client(std::make_shared<RedisExecutor>(o), quiet());
  auto lease = client.acquire("restart", 1500ms);
  ASSERT_TRUE(lease.has_value());
  ASSERT_TRUE(server.restart()) << server.error;
  ASSERT_TRUE(eventually([&] { return lease->lost(); }, 20s));
  EXPECT_EQ(lease->lost_reason(), LostReason::Rejected);
  auto next = client.acquire("restart", 5s, wait_for(10s));
  ASSERT_TRUE(next.has_value());
  EXPECT_GT(next->fencing_token(), lease->fencing_token());
}

TEST_F(Redis, RestartWithPersistenceKeepsTheLease) {
  char dir[] = "/tmp/leasehold-redis-aof-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  RedisServer server;
  server.extra = {"--dir", dir, "--save", "", "--appendonly", "yes", "--appendfsync", "always"};
  ASSERT_TRUE(server.start()) << server.error;
  RedisOptions o;
  o.port = server.port;
  LockClient client(std::make_shared<RedisExecutor>(o), quiet());
  LockClient other(std::make_shared<RedisExecutor>(o), quiet());
  auto lease = client.acquire("restart", 3000ms);
  ASSERT_TRUE(lease.has_value());
  ASSERT_TRUE(server.restart()) << server.error;
  const auto renewed = client.counters().renewals_ok;
  ASSERT_TRUE(eventually([&] { return client.counters().renewals_ok >= renewed + 2 || lease->lost(); }, 30s));
  EXPECT_FALSE(lease->lost());
  EXPECT_FALSE(other.acquire("restart", 5s).has_value());  // still ours on the restarted server
  EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Released);
  server.proc.stop();
  [[maybe_unused]] const int rc = std::system(("rm -rf '" + std::string(dir) + "'").c_str());
}

// Redis Sentinel: a real topology (1 master, 1 replica, 3 sentinels) from the shared
// scripts/redis-sentinel-test.sh. The transport finds the master through the sentinels and follows
// a promotion after the master is killed; a lease whose key never reached the replica is lost at
// its next renewal; the subscriber follows; fences go on increasing.
namespace {

struct SentinelTopology {
  std::string dir, name, master, replica;
  std::vector<leasehold::SentinelAddress> sentinels;
  std::string error;

  static std::string script() { return std::string(LEASEHOLD_REPO_ROOT) + "/scripts/redis-sentinel-test.sh"; }
  bool start() {
    char tmpl[] = "/tmp/lh-sentinel-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return error = "mkdtemp failed", false;
    dir = tmpl;
    FILE* p = ::popen(("bash '" + script() + "' start '" + dir + "' 2>&1").c_str(), "r");
    if (p == nullptr) return error = "popen failed", false;
    std::string out;
    char buf[512];
    while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
    if (::pclose(p) != 0) return error = "redis-sentinel-test.sh start failed: " + out, false;
    std::istringstream lines(out);
    for (std::string key, value; lines >> key >> value;) {
      if (key == "name") name = value;
      if (key == "master") master = value;
      if (key == "replica") replica = value;
      if (key == "sentinels") {
        std::stringstream ss(value);
        for (std::string a; std::getline(ss, a, ',');)
          sentinels.push_back({a.substr(0, a.rfind(':')), std::stoi(a.substr(a.rfind(':') + 1))});
      }
    }
    if (name.empty() || master.empty() || replica.empty() || sentinels.size() != 3)
      return error = "unexpected output: " + out, false;
    return true;
  }
  ~SentinelTopology() {
    if (!dir.empty()) [[maybe_unused]] auto rc = std::system(("bash '" + script() + "' stop '" + dir + "'").c_str());
  }
  pid_t pid(const std::string& node) const {
    std::ifstream f(dir + "/" + node + "/pid");
    pid_t p = -1;
    f >> p;
    return p;
  }
  static lr::ContextPtr connect(const std::string& addr) {
    return lr::connect(addr.substr(0, addr.rfind(':')), std::stoi(addr.substr(addr.rfind(':') + 1)), 1000ms);
  }
  // The sentinels name the replica, and it says it is a master.
  bool promoted() const {
    try {
      auto s = lr::connect(sentinels[0].host, sentinels[0].port, 1000ms);
      auto r = lr::command(s.get(), {"SENTINEL", "get-master-addr-by-name", name});
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) return false;
      if (std::string(r->element[0]->str) + ":" + r->element[1]->str != replica) return false;
      auto c = connect(replica);
      auto role = lr::command(c.get(), {"ROLE"});
      return role->type == REDIS_REPLY_ARRAY && role->elements > 0 && std::string_view(role->element[0]->str) == "master";
    } catch (const std::exception&) {
      return false;
    }
  }
};

// On a connection of its own: the sentinels close the clients of a server they reconfigure.
long long integer_on(const std::string& addr, const std::vector<std::string>& args) {
  auto c = SentinelTopology::connect(addr);
  auto r = lr::command(c.get(), args);
  return r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
}

std::size_t wake_channels_on(const std::string& addr) {
  auto c = SentinelTopology::connect(addr);
  auto r = lr::command(c.get(), {"PUBSUB", "CHANNELS", "lh:wake:*"});
  return r->type == REDIS_REPLY_ARRAY ? r->elements : 0;
}

}  // namespace

TEST(RedisSentinel, OptionsAreChecked) {
  RedisOptions o;
  o.sentinels = {{"127.0.0.1", 26379}};
  EXPECT_THROW(RedisExecutor{o}, std::invalid_argument);  // no master name
  o.sentinel_master = "m";
  o.sentinels = {{"", 26379}};
  EXPECT_THROW(RedisExecutor{o}, std::invalid_argument);
  o.sentinels = {{"127.0.0.1", 0}};
  EXPECT_THROW(RedisExecutor{o}, std::invalid_argument);
}

TEST(RedisSentinel, FollowsTheFailoverAndDetectsALostKey) {
  ::signal(SIGPIPE, SIG_IGN);
  SentinelTopology top;
  if (!top.start()) {
    if (ci()) FAIL() << "CI=true and no Sentinel topology: " << top.error;
    GTEST_SKIP() << top.error;
  }
  auto transport = [&] {
    RedisOptions o;
    o.sentinels = top.sentinels;
    o.sentinel_master = top.name;
    o.connect_timeout = 500ms;
    o.command_timeout = 1000ms;
    o.log = [](std::string_view) {};
    return std::make_shared<RedisExecutor>(o);
  };
  ClientOptions quiet;
  quiet.close_timeout = 10s;
  quiet.log = [](std::string_view) {};
  LockClient holder(transport(), quiet);
  LockClient other(transport(), quiet);
  const std::string& master = top.master;
  const std::string& replica = top.replica;

  auto kept = holder.acquire("kept", 8s);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(integer_on(master, {"EXISTS", "lh:{kept}"}), 1) << "the sentinels named the master";
  ASSERT_EQ(integer_on(master, {"WAIT", "1", "5000"}), 1) << "the replica has the kept lease";

  // The replica falls behind deterministically: stopped, its replication link closed by the
  // master, so the next grant reaches no replica; then the master dies.
  std::atomic<int> lost_calls{0};
  std::optional<Lease> gone;
  const pid_t replica_pid = top.pid("replica");
  ASSERT_EQ(::kill(replica_pid, SIGSTOP), 0);
  {
    struct Resume {
      pid_t pid;
      ~Resume() { ::kill(pid, SIGCONT); }
    } resume{replica_pid};
    ASSERT_GE(integer_on(master, {"CLIENT", "KILL", "TYPE", "replica"}), 1);
    AcquireOptions o;
    o.on_lost = [&](LostReason) { ++lost_calls; };
    gone = holder.acquire("gone", 8s, std::move(o));
    ASSERT_TRUE(gone.has_value());
    ASSERT_EQ(::kill(top.pid("master"), SIGKILL), 0);
  }
  const auto killed = leasehold::Clock::now();
  ASSERT_TRUE(eventually([&] { return top.promoted(); })) << "no promotion";
  const auto promoted = leasehold::Clock::now() - killed;
  EXPECT_EQ(integer_on(replica, {"EXISTS", "lh:{kept}"}), 1);
  ASSERT_EQ(integer_on(replica, {"EXISTS", "lh:{gone}"}), 0) << "the unreplicated key survived";

  ASSERT_TRUE(eventually([&] { return gone->lost(); }, 30s)) << "the lost lease's loss was not detected";
  const auto detected = leasehold::Clock::now() - killed;
  EXPECT_EQ(gone->lost_reason(), LostReason::Rejected);
  EXPECT_TRUE(eventually([&] { return lost_calls.load() == 1; }, 5s));
  EXPECT_NO_THROW((void)kept->renew());
  EXPECT_TRUE(kept->is_held());

  // A waiter on the new master is woken by the holder's release (the wake channels followed).
  std::optional<Lease> next;
  std::thread waiter([&] { next = other.acquire("kept", 8s, wait_for(30s)); });
  EXPECT_TRUE(eventually([&] { return integer_on(replica, {"ZCARD", "lh:{kept}:queue"}) == 1; }, 30s));
  EXPECT_TRUE(eventually([&] { return wake_channels_on(replica) == 2; }, 30s)) << "the subscribers followed";
  const auto resubscribed = leasehold::Clock::now() - killed;
  EXPECT_EQ(kept->release(), leasehold::ReleaseOutcome::Released);
  waiter.join();
  ASSERT_TRUE(next.has_value());
  EXPECT_GT(next->fencing_token(), kept->fencing_token());
  auto newer = other.acquire("gone", 8s, wait_for(10s));
  ASSERT_TRUE(newer.has_value());
  EXPECT_GT(newer->fencing_token(), gone->fencing_token()) << "fences never go back";
  const auto ms = [](auto d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
  std::printf("sentinel failover: promoted %lld ms after the kill, loss detected after %lld ms, subscribers on the "
              "new master after %lld ms\n",
              static_cast<long long>(ms(promoted)), static_cast<long long>(ms(detected)),
              static_cast<long long>(ms(resubscribed)));
}
