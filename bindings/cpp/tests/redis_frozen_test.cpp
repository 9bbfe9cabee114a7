// A holder frozen (SIGSTOP) after a lock went round several processes is taken over when its
// grant runs out: four tests/pause_worker.cpp processes hand a 1 s lock round against a
// redis-server this test starts on a free loopback port (stopped by its pid). Under CI=true a
// missing redis-server is a failure, never a skip.
#include <gtest/gtest.h>

#include <hiredis/hiredis.h>

#include "child_process.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using leasehold_test::Child;

namespace {

bool ci() {
  const char* v = std::getenv("CI");
  return v != nullptr && std::string_view(v) == "true";
}

std::string find_in_path(const std::string& prog) {
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/sbin:/usr/bin:/usr/local/bin:/sbin";
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':'))
    if (!dir.empty() && ::access((dir + "/" + prog).c_str(), X_OK) == 0) return dir + "/" + prog;
  return {};
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = -1;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) ::close(fd);
  return port;
}

bool pong(int port) {
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, timeval{0, 200000});
  bool ok = false;
  if (c != nullptr && c->err == 0) {
    auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
    ok = r != nullptr && r->type == REDIS_REPLY_STATUS && std::string_view(r->str, r->len) == "PONG";
    if (r) freeReplyObject(r);
  }
  if (c) redisFree(c);
  return ok;
}

// Every child stopped (resumed first, then terminated) and reaped when the test ends.
struct Children {
  std::vector<Child> v;
  ~Children() {
    for (auto& c : v) c.stop();
  }
};

// The process is in the stopped state (the SIGSTOP took effect).
bool stopped(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto close = s.rfind(')');
  return close != std::string::npos && s.size() > close + 2 && s[close + 2] == 'T';
}

struct Event {
  std::size_t worker = 0;
  std::string what;  // held | releasing | failed | eof
  std::uint64_t fence = 0;
  std::int64_t mono_ns = 0;
};

// The next line of any worker, or nullopt at `until`.
std::optional<Event> next_event(std::vector<Child>& kids, std::deque<Event>& pending, leasehold::Clock::time_point until) {
  while (pending.empty()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - leasehold::Clock::now());
    if (left.count() <= 0) return std::nullopt;
    std::vector<pollfd> fds;
    for (auto& k : kids) fds.push_back(pollfd{k.out_fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), static_cast<int>(left.count())) <= 0) continue;
    for (std::size_t i = 0; i < kids.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP)) == 0) continue;
      char tmp[512];
      const auto n = ::read(kids[i].out_fd, tmp, sizeof(tmp));
      if (n <= 0) {
        pending.push_back(Event{i, "eof"});
        continue;
      }
      kids[i].buf.append(tmp, static_cast<std::size_t>(n));
      for (auto nl = kids[i].buf.find('\n'); nl != std::string::npos; nl = kids[i].buf.find('\n')) {
        std::istringstream in(kids[i].buf.substr(0, nl));
        kids[i].buf.erase(0, nl + 1);
        Event e{i, ""};
        in >> e.what >> e.fence >> e.mono_ns;
        pending.push_back(e);
      }
    }
  }
  auto e = pending.front();
  pending.pop_front();
  return e;
}

// Four processes hand a 1 s lock round (each acquire waits up to 10 s, holds 30 ms, releases,
// renewed automatically); the process holding it is then stopped (SIGSTOP: its renewals stop
// too). Another must get the lock within TTL + 1 s of the frozen holder's grant, with a higher
// fence, not when its own 10 s wait runs out.
TEST(RedisProcesses, AHolderFrozenAfterHandoffsIsTakenOverAtItsExpiry) {
  ::signal(SIGPIPE, SIG_IGN);
  const auto bin = find_in_path("redis-server");
  if (bin.empty()) {
    const std::string msg = "redis-server not found (scripts/ensure-redis.sh or apt-get install redis-server)";
    if (ci()) FAIL() << "CI=true: " << msg;
    GTEST_SKIP() << msg;
  }
  Children server;
  int port = -1;
  for (int attempt = 0; attempt < 5 && server.v.empty(); ++attempt) {
    port = free_port();
    auto s = Child::spawn({bin, "--port", std::to_string(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                           "no", "--daemonize", "no"},
                          false, "/dev/null");
    ASSERT_GT(s.pid, 0) << "cannot spawn " << bin;
    const auto end = leasehold::Clock::now() + 20s;
    while (s.running() && !pong(port) && leasehold::Clock::now() < end) std::this_thread::sleep_for(10ms);
    if (s.running() && pong(port)) server.v.push_back(s);
    else s.stop();
  }
  ASSERT_FALSE(server.v.empty()) << "redis-server did not answer PING";

  constexpr std::size_t kWorkers = 4, kWarmUp = 12;
  constexpr auto kTtl = 1000ms;
  Children workers;
  for (std::size_t i = 0; i < kWorkers; ++i) {
    workers.v.push_back(Child::spawn({LEASEHOLD_PAUSE_WORKER, "redis", std::to_string(port)}, true, ""));
    ASSERT_GT(workers.v.back().pid, 0);
    workers.v.back().write_line("handoff frozen-holder " + std::to_string(kTtl.count()) + " 10000 30");
  }
  auto& kids = workers.v;
  std::deque<Event> pending;
  struct Grant {
    std::size_t worker;
    std::uint64_t fence;
  };
  std::vector<Grant> grants;
  std::set<std::size_t> seen;
  std::optional<Event> frozen;
  const auto deadline = leasehold::Clock::now() + 2min;
  while (!frozen) {
    auto e = next_event(kids, pending, deadline);
    ASSERT_TRUE(e.has_value()) << "no freeze within 2 minutes; " << grants.size() << " grants";
    ASSERT_TRUE(e->what == "held" || e->what == "releasing") << "worker " << e->worker << ": " << e->what;
    if (e->what != "held") continue;
    ASSERT_TRUE(grants.empty() || e->fence > grants.back().fence) << "fences went backwards";
    const bool handed = !grants.empty() && grants.back().worker != e->worker;
    grants.push_back({e->worker, e->fence});
    seen.insert(e->worker);
    // Freeze a holder that got the lock through a handoff, once every worker had it.
    if (!handed || grants.size() < kWarmUp || seen.size() < kWorkers) continue;
    const pid_t pid = kids[e->worker].pid;
    ASSERT_EQ(::kill(pid, SIGSTOP), 0);
    const auto stop_by = leasehold::Clock::now() + 10s;
    while (!stopped(pid)) {
      ASSERT_LT(leasehold::Clock::now(), stop_by) << "worker " << e->worker << " did not stop";
      std::this_thread::sleep_for(1ms);
    }
    // Its last lines reach us; if it said "releasing" before the stop took effect, it was too
    // late: resume it and try with a later grant.
    bool missed = false;
    const auto settle = leasehold::Clock::now() + 100ms;
    while (auto later = next_event(kids, pending, settle)) {
      if (later->worker == e->worker && later->what == "releasing") missed = true;
      if (later->what == "held") grants.push_back({later->worker, later->fence});
    }
    if (missed) {
      ASSERT_EQ(::kill(pid, SIGCONT), 0);
      continue;
    }
    ASSERT_EQ(grants.back().worker, e->worker) << "someone acquired while the frozen worker holds the lock";
    ASSERT_EQ(grants.back().fence, e->fence) << "someone acquired while the frozen worker holds the lock";
    frozen = e;
  }
  std::size_t handoffs = 0;
  for (std::size_t i = 1; i < grants.size(); ++i) handoffs += grants[i].worker != grants[i - 1].worker;
  // Wait past the waiters' 10 s waits, so that a late takeover is measured too (a wait that runs
  // out, "failed", is retried by its worker).
  std::optional<Event> taken;
  const auto until = leasehold::Clock::now() + kTtl + 15s;
  while (!taken) {
    auto e = next_event(kids, pending, until);
    ASSERT_TRUE(e.has_value()) << "nobody took over from frozen worker " << frozen->worker << " (fence "
                               << frozen->fence << ") within TTL + 15 s";
    ASSERT_NE(e->worker, frozen->worker) << "the frozen worker said " << e->what;
    ASSERT_TRUE(e->what == "held" || e->what == "releasing" || e->what == "failed")
        << "worker " << e->worker << ": " << e->what;
    if (e->what == "held") taken = e;
  }
  ::kill(kids[frozen->worker].pid, SIGCONT);
  const auto delay = std::chrono::nanoseconds(taken->mono_ns - frozen->mono_ns);
  const auto delay_ms = std::chrono::duration_cast<std::chrono::milliseconds>(delay).count();
  std::cout << grants.size() << " grants (" << handoffs << " handoffs between processes) before the freeze; worker "
            << frozen->worker << " frozen holding fence " << frozen->fence << "; worker " << taken->worker
            << " took over " << delay_ms << " ms after that grant (fence " << taken->fence << ")" << std::endl;
  EXPECT_GT(taken->fence, frozen->fence);
  // Not before the frozen holder's grant ran out (its key's TTL starts a little before the
  // worker's report), and soon after it.
  EXPECT_GT(delay, kTtl - 200ms) << delay_ms << " ms";
  EXPECT_LT(delay, kTtl + 1s) << delay_ms << " ms";
}

}  // namespace
