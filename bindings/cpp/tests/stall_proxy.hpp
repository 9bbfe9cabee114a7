// A loopback TCP proxy that can hold back the server's replies: a stalled server (or network)
// for the tests of an application call's bound. While delay_ms is above zero, every chunk the
// server sends waits that long before it goes on to the client; requests pass at once, so the
// server acts on them and only the answers are late.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace leasehold_test {

class StallProxy {
 public:
  explicit StallProxy(int target_port) : target_(target_port) {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = loopback(0);
    socklen_t len = sizeof a;
    if (listen_ < 0 || ::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_, 16) != 0 || ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      if (listen_ >= 0) ::close(listen_);
      throw std::runtime_error("stall proxy: cannot listen");
    }
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  StallProxy(const StallProxy&) = delete;
  StallProxy& operator=(const StallProxy&) = delete;
  ~StallProxy() {
    {
      std::lock_guard g(mu_);
      stopping_ = true;
      for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    }
    cv_.notify_all();
    ::shutdown(listen_, SHUT_RDWR);  // wakes accept()
    acceptor_.join();
    for (auto& t : pumps_) t.join();
    for (int fd : fds_) ::close(fd);
    ::close(listen_);
  }

  [[nodiscard]] int port() const noexcept { return port_; }
  // How long each chunk of replies is held back (0: passed at once).
  std::atomic<int> delay_ms{0};

 private:
  static sockaddr_in loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    return a;
  }
  void accept_loop() {
    for (;;) {
      const int client = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) {
        std::lock_guard g(mu_);
        if (stopping_) return;
        continue;
      }
      const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a = loopback(target_);
      std::lock_guard g(mu_);
      fds_.push_back(client);
      if (server >= 0) fds_.push_back(server);
      if (stopping_ || server < 0 || ::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::shutdown(client, SHUT_RDWR);
        if (stopping_) return;
        continue;
      }
      pumps_.emplace_back([this, client, server] { pump(client, server, false); });
      pumps_.emplace_back([this, client, server] { pump(server, client, true); });
    }
  }
  // Copies from → to until either end closes, then shuts both down.
  void pump(int from, int to, bool replies) {
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(from, buf, sizeof buf);
      if (n <= 0) break;
      if (const int d = delay_ms.load(); replies && d > 0) {
        std::unique_lock l(mu_);
        if (cv_.wait_for(l, std::chrono::milliseconds(d), [&] { return stopping_; })) break;
      }
      ssize_t off = 0;
      while (off < n) {
        const ssize_t w = ::send(to, buf + off, static_cast<std::size_t>(n - off), MSG_NOSIGNAL);
        if (w <= 0) break;
        off += w;
      }
      if (off < n) break;
    }
    ::shutdown(from, SHUT_RDWR);
    ::shutdown(to, SHUT_RDWR);
  }

  int target_;
  int listen_ = -1;
  int port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  std::vector<int> fds_;   // guarded by mu_; closed by the destructor
  std::vector<std::thread> pumps_;  // guarded by mu_ (joined after the acceptor)
  std::thread acceptor_;
};

}  // namespace leasehold_test
