// Test helpers: child processes (posix fork + exec) and the pause-then-release scenario run
// against tests/pause_worker.cpp.
#pragma once

#include <leasehold.hpp>

#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace leasehold_test {

using namespace std::chrono_literals;

// A child process started with fork + exec; optional pipes to its stdin/stdout.
struct Child {
  pid_t pid = -1;
  int in_fd = -1;   // write end → child's stdin
  int out_fd = -1;  // read end ← child's stdout

  // fork + exec; the child gets SIGKILL if this (forking) thread dies, so a crashed test never
  // leaves a redis-server or a worker behind. Only async-signal-safe calls after fork().
  static Child spawn(const std::vector<std::string>& argv, bool pipes, const std::string& stderr_path) {
    Child c;
    int in_p[2] = {-1, -1}, out_p[2] = {-1, -1};
    if (pipes && (::pipe2(in_p, O_CLOEXEC) != 0 || ::pipe2(out_p, O_CLOEXEC) != 0)) return c;
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      const int devnull = ::open("/dev/null", O_RDWR);
      ::dup2(pipes ? in_p[0] : devnull, 0);
      ::dup2(pipes ? out_p[1] : devnull, 1);
      if (!stderr_path.empty()) {  // empty: inherit ours
        const int err = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ::dup2(err >= 0 ? err : devnull, 2);
      }
      ::execve(args[0], args.data(), environ);
      ::_exit(127);
    }
    if (pipes) {
      ::close(in_p[0]);
      ::close(out_p[1]);
      c.in_fd = in_p[1];
      c.out_fd = out_p[0];
    }
    if (pid > 0) c.pid = pid;
    return c;
  }

  // One line from the child's stdout, or nullopt when nothing arrives within `limit`.
  std::optional<std::string> read_line(std::chrono::milliseconds limit) {
    const auto end = leasehold::Clock::now() + limit;
    while (true) {
      if (auto nl = buf.find('\n'); nl != std::string::npos) {
        std::string line = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - leasehold::Clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{out_fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char tmp[512];
      const auto n = ::read(out_fd, tmp, sizeof(tmp));
      if (n <= 0) return std::nullopt;
      buf.append(tmp, static_cast<std::size_t>(n));
    }
  }
  void write_line(const std::string& s) {
    std::string l = s + "\n";
    [[maybe_unused]] auto n = ::write(in_fd, l.data(), l.size());
  }
  // Exit status, or nullopt if still running after `limit` (then killed).
  std::optional<int> wait_exit(std::chrono::milliseconds limit) {
    const auto end = leasehold::Clock::now() + limit;
    while (pid > 0) {
      int st = 0;
      const pid_t r = ::waitpid(pid, &st, WNOHANG);
      if (r == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
      }
      if (leasehold::Clock::now() > end) {
        stop();
        return std::nullopt;
      }
      std::this_thread::sleep_for(10ms);
    }
    return std::nullopt;
  }
  bool running() {
    if (pid <= 0) return false;
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) {
      pid = -1;
      return false;
    }
    return true;
  }
  // SIGCONT (in case a test stopped it), SIGTERM, bounded wait, then SIGKILL.
  void stop() {
    if (pid > 0) {
      ::kill(pid, SIGCONT);
      ::kill(pid, SIGTERM);
      for (int i = 0; i < 500 && pid > 0; ++i) {
        int st = 0;
        if (::waitpid(pid, &st, WNOHANG) == pid) pid = -1;
        else std::this_thread::sleep_for(10ms);
      }
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        pid = -1;
      }
    }
    if (in_fd >= 0) ::close(in_fd);
    if (out_fd >= 0) ::close(out_fd);
    in_fd = out_fd = -1;
  }
  std::string buf;
};

// Runs `rounds` times: the worker acquires `name` for `ttl`, is stopped (SIGSTOP) for `pause`
// (longer than the TTL), gets "release" queued on its stdin and is continued (SIGCONT): the
// release races the driver's own expiry check on wake-up. Whichever wins, the lease must end
// Lost, with one on_lost call and its stop_token requested, and release() must report lost.
inline void pause_then_release(const std::vector<std::string>& argv, const std::string& name,
                               std::chrono::milliseconds ttl, std::chrono::milliseconds pause, int rounds) {
  auto worker = Child::spawn(argv, true, "");
  ASSERT_GT(worker.pid, 0) << "cannot start " << argv[0];
  for (int i = 0; i < rounds; ++i) {
    worker.write_line("acquire " + name + " " + std::to_string(ttl.count()));
    const auto held = worker.read_line(60s);
    ASSERT_TRUE(held.has_value()) << "round " << i << ": no answer to acquire";
    ASSERT_EQ(held->rfind("held ", 0), 0u) << "round " << i << ": " << *held;
    ASSERT_EQ(::kill(worker.pid, SIGSTOP), 0);
    std::this_thread::sleep_for(pause);
    worker.write_line("release");  // waits in the pipe: the first thing it reads on waking
    ASSERT_EQ(::kill(worker.pid, SIGCONT), 0);
    const auto report = worker.read_line(60s);
    ASSERT_TRUE(report.has_value()) << "round " << i << ": no answer to release";
    EXPECT_EQ(*report, "outcome=lost lost=1 reason=expired callbacks=1 stop=1") << "round " << i;
  }
  worker.write_line("quit");
  EXPECT_EQ(worker.wait_exit(30s), 0);
  worker.stop();
}

}  // namespace leasehold_test
