// Helpers of the SQLite, PostgreSQL and etcd tests: scripts, temporary directories, the log
// that contending worker processes append to, and its checks.
#pragma once

#include <leasehold.hpp>

#include <gtest/gtest.h>

#include "child_process.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace leasehold_test {

// A socket listening on a free loopback port, and the port; {-1, 0} when that fails.
inline std::pair<int, int> listen_loopback(int backlog = 16) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, backlog) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return {-1, 0};
  }
  return {fd, ntohs(a.sin_port)};
}

inline bool ci() {
  const char* v = std::getenv("CI");
  return v != nullptr && std::string_view(v) == "true";
}

template <class P>
bool eventually(P pred, std::chrono::milliseconds limit = 60s) {
  const auto end = leasehold::Clock::now() + limit;
  while (!pred()) {
    if (leasehold::Clock::now() > end) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// Runs a command through the shell; its stdout (trimmed) and exit status.
inline std::pair<int, std::string> sh(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, ""};
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int st = ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

inline std::string script(const std::string& name) { return std::string(LEASEHOLD_REPO_ROOT) + "/scripts/" + name; }

// A fresh directory under /tmp, removed at the end of the test binary's run.
inline std::string temp_dir(const std::string& tag) {
  std::string t = "/tmp/leasehold-cpp-" + tag + "-XXXXXX";
  if (::mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  ::chmod(t.c_str(), 0755);
  return t;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The log of a contention run: "+ FENCE PID" on entering, "- FENCE PID" on leaving.
struct Entry {
  bool enter = false;
  std::uint64_t fence = 0;
  long pid = 0;
};
inline std::vector<Entry> read_log(const std::string& path) {
  std::vector<Entry> v;
  std::istringstream in(read_file(path));
  std::string sign;
  Entry e;
  while (in >> sign >> e.fence >> e.pid) {
    e.enter = sign == "+";
    v.push_back(e);
  }
  return v;
}
// Fences of the entries strictly increase; with `exclusive`, every entry is followed by the
// same holder's exit before anyone else enters.
inline void check_log(const std::vector<Entry>& log, bool exclusive) {
  std::uint64_t last = 0;
  for (std::size_t i = 0; i < log.size(); ++i) {
    if (log[i].enter) {
      EXPECT_GT(log[i].fence, last) << "fence regressed at entry " << i;
      last = log[i].fence;
    }
    if (exclusive) {
      const bool want_enter = i % 2 == 0;
      ASSERT_EQ(log[i].enter, want_enter) << "two holders at once at entry " << i;
      if (!want_enter) {
        ASSERT_EQ(log[i].fence, log[i - 1].fence) << "entry " << i;
        ASSERT_EQ(log[i].pid, log[i - 1].pid) << "entry " << i;
      }
    }
  }
}

// Worker processes (tests/pause_worker.cpp) each running `contend`; returns their "done N".
inline std::vector<long> contend(const std::vector<std::string>& worker_argv, int workers, const std::string& command,
                                 std::chrono::milliseconds limit, const std::function<void()>& meanwhile = {}) {
  std::vector<Child> kids;
  for (int i = 0; i < workers; ++i) {
    kids.push_back(Child::spawn(worker_argv, true, ""));
    EXPECT_GT(kids.back().pid, 0);
  }
  for (auto& k : kids) k.write_line(command);
  if (meanwhile) meanwhile();
  std::vector<long> done;
  for (auto& k : kids) {
    std::optional<std::string> line;
    while ((line = k.read_line(limit)) && line->rfind("done ", 0) != 0)
      ADD_FAILURE() << "worker " << k.pid << ": " << *line;
    EXPECT_TRUE(line.has_value()) << "worker " << k.pid << " did not finish in time";
    done.push_back(line ? std::stol(line->substr(5)) : -1);
    k.write_line("quit");
    EXPECT_EQ(k.wait_exit(30s), 0);
    k.stop();
  }
  return done;
}

}  // namespace leasehold_test
