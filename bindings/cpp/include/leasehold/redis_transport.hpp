// leasehold/redis_transport.hpp — a Transport for a single Redis server on hiredis.
//
// Uses the canonical Lua scripts and key layout exported by the library (lh_redis_script /
// lh_redis_key), so C++, Python and Go clients contend correctly for the same names:
//   ACQUIRE KEYS=[lock, fence] ARGV=[token, ttl_ms] → [1, fence, ttl_ms] | [0, retry_ms or -1]
//   RENEW   KEYS=[lock]        ARGV=[token, ttl_ms] → 1 | 0
//   RELEASE KEYS=[lock]        ARGV=[token, channel, name] → 1 (and PUBLISH channel name) | 0
// Scripts run with EVALSHA, falling back to EVAL on NOSCRIPT. A Redis error reply or a reply of
// an unexpected shape is a transport error (thrown, so the LockClient logs it), never a grant.
//
// Commands use a small pool of blocking connections with a command timeout (so a call never hangs
// longer than that). hiredis writes with write(2): call it from threads that block SIGPIPE (the
// LockClient's IO threads do; so does the subscriber thread). Release notifications use one subscriber connection on its own thread
// (SUBSCRIBE lh:{NAME}:released), re-established and re-subscribed after a disconnect.
// One RedisTransport per LockClient (LockClient::close() closes it).
#pragma once

#include <leasehold.hpp>

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace leasehold {
namespace redis {

enum class Script : std::uint32_t {
  Acquire = LH_REDIS_SCRIPT_ACQUIRE,
  Renew = LH_REDIS_SCRIPT_RENEW,
  Release = LH_REDIS_SCRIPT_RELEASE,
};
enum class Key : std::uint32_t {
  Lock = LH_REDIS_KEY_LOCK,
  Fence = LH_REDIS_KEY_FENCE,
  Channel = LH_REDIS_KEY_CHANNEL,
};

// The canonical script text (static storage in the library).
inline std::string_view script(Script kind) {
  const char* text = nullptr;
  std::size_t len = 0;
  const auto st = lh_redis_script(static_cast<std::uint32_t>(kind), &text, &len);
  if (st != LH_OK) throw Error(st, "lh_redis_script");
  return {text, len};
}

// The key (or channel) for `name`, e.g. lh:{NAME}, lh:{NAME}:fence, lh:{NAME}:released.
inline std::string key(Key kind, std::string_view name) {
  std::string buf(name.size() + 32, '\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::size_t n = 0;
    const auto st = lh_redis_key(static_cast<std::uint32_t>(kind), detail::bytes_ptr(name.data()), name.size(),
                                 reinterpret_cast<std::uint8_t*>(buf.data()), buf.size(), &n);
    if (st == LH_OK) {
      buf.resize(n);
      return buf;
    }
    if (st != LH_ERR_BUFFER_TOO_SMALL) throw Error(st, "lh_redis_key");
    buf.assign(n, '\0');
  }
  throw Error(LH_ERR_BUFFER_TOO_SMALL, "lh_redis_key");
}

struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;
struct ContextDeleter {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;

inline timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<decltype(tv.tv_sec)>(ms.count() / 1000);
  tv.tv_usec = static_cast<decltype(tv.tv_usec)>((ms.count() % 1000) * 1000);
  return tv;
}

inline ContextPtr connect(const std::string& host, int port, std::chrono::milliseconds connect_timeout) {
  ContextPtr c(redisConnectWithTimeout(host.c_str(), port, to_timeval(connect_timeout)));
  if (!c) throw std::runtime_error("redis: cannot allocate a context");
  if (c->err) throw std::runtime_error(std::string("redis connect: ") + c->errstr);
  return c;
}

// Runs one command given as argv; throws on IO errors (the context is then unusable).
inline ReplyPtr command(redisContext* c, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  argv.reserve(args.size());
  lens.reserve(args.size());
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
  if (r == nullptr) throw std::runtime_error(std::string("redis io: ") + (c->err ? c->errstr : "no reply"));
  return ReplyPtr(r);
}

}  // namespace redis

struct RedisOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::chrono::milliseconds connect_timeout{1000};
  std::chrono::milliseconds command_timeout{2000};  // bounds every blocking call
  std::size_t max_idle_connections = 8;
};

class RedisTransport final : public Transport {
 public:
  explicit RedisTransport(RedisOptions options = {}) : opts_(std::move(options)) {
    scripts_[0] = std::string(redis::script(redis::Script::Acquire));
    scripts_[1] = std::string(redis::script(redis::Script::Renew));
    scripts_[2] = std::string(redis::script(redis::Script::Release));
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) throw std::runtime_error("eventfd failed");
    subscriber_ = std::thread([this] { subscribe_loop(); });
  }
  RedisTransport(const RedisTransport&) = delete;
  RedisTransport& operator=(const RedisTransport&) = delete;
  ~RedisTransport() override {
    close();
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  AcquireResult acquire(std::string_view name, std::string_view token, std::uint64_t ttl_ms) override {
    auto r = eval(0, {redis::key(redis::Key::Lock, name), redis::key(redis::Key::Fence, name)},
                  {std::string(token), std::to_string(ttl_ms)});
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2) throw std::runtime_error(bad_shape("acquire", r.get()));
    const auto i = [&](std::size_t k) -> long long {
      if (k >= r->elements || r->element[k]->type != REDIS_REPLY_INTEGER)
        throw std::runtime_error(bad_shape("acquire", r.get()));
      return r->element[k]->integer;
    };
    if (i(0) == 1) {
      if (r->elements < 3 || i(1) <= 0 || i(2) <= 0) throw std::runtime_error(bad_shape("acquire", r.get()));
      return Granted{static_cast<std::uint64_t>(i(1)), static_cast<std::uint64_t>(i(2)), {}};
    }
    if (i(0) == 0) {
      const long long retry = i(1);
      if (retry < 0) return HeldByOther{std::nullopt};
      return HeldByOther{static_cast<std::uint64_t>(retry)};
    }
    throw std::runtime_error(bad_shape("acquire", r.get()));
  }

  RenewResult renew(std::string_view name, std::string_view token, std::uint64_t ttl_ms,
                    std::span<const std::uint8_t>) override {
    auto r = eval(1, {redis::key(redis::Key::Lock, name)}, {std::string(token), std::to_string(ttl_ms)});
    return flag("renew", r.get()) ? RenewResult::Renewed : RenewResult::Rejected;
  }

  ReleaseResult release(std::string_view name, std::string_view token, std::span<const std::uint8_t>) override {
    auto r = eval(2, {redis::key(redis::Key::Lock, name)},
                  {std::string(token), redis::key(redis::Key::Channel, name), std::string(name)});
    return flag("release", r.get()) ? ReleaseResult::Released : ReleaseResult::NotOwner;
  }

  void watch(std::string_view name, ReleasedCallback on_released) override {
    {
      std::lock_guard g(sub_mu_);
      if (closed_) return;
      watched_[redis::key(redis::Key::Channel, name)] = Watch{std::string(name), std::move(on_released)};
    }
    wake();
  }
  void unwatch(std::string_view name) override {
    {
      std::lock_guard g(sub_mu_);
      watched_.erase(redis::key(redis::Key::Channel, name));
    }
    wake();
  }
  [[nodiscard]] bool notifications() const override { return true; }

  void close() override {
    {
      std::lock_guard g(pool_mu_);
      closed_flag_ = true;
      idle_.clear();
      for (int fd : busy_fds_) ::shutdown(fd, SHUT_RDWR);  // unblock in-flight calls
    }
    {
      std::lock_guard g(sub_mu_);
      closed_ = true;
      watched_.clear();
    }
    wake();
    if (subscriber_.joinable()) subscriber_.join();
  }

  // Subscribed channels confirmed by the server (for tests and diagnostics).
  [[nodiscard]] std::size_t subscribed() const {
    std::lock_guard g(sub_mu_);
    return subscribed_count_;
  }

 private:
  struct Watch {
    std::string name;
    ReleasedCallback cb;
  };

  static std::string bad_shape(const char* what, const redisReply* r) {
    std::string s = std::string("redis ") + what + ": unexpected reply type " + std::to_string(r->type);
    if (r->type == REDIS_REPLY_ERROR || r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_STRING)
      s += ": " + std::string(r->str, r->len);
    return s;
  }
  static bool flag(const char* what, const redisReply* r) {
    if (r->type != REDIS_REPLY_INTEGER || (r->integer != 0 && r->integer != 1))
      throw std::runtime_error(bad_shape(what, r));
    return r->integer == 1;
  }

  // Pool -------------------------------------------------------------------------------------
  redis::ContextPtr checkout() {
    {
      std::lock_guard g(pool_mu_);
      if (closed_flag_) throw std::runtime_error("redis transport closed");
      if (!idle_.empty()) {
        auto c = std::move(idle_.back());
        idle_.pop_back();
        busy_fds_.insert(c->fd);
        return c;
      }
    }
    auto c = redis::connect(opts_.host, opts_.port, opts_.connect_timeout);
    redisSetTimeout(c.get(), redis::to_timeval(opts_.command_timeout));
    std::lock_guard g(pool_mu_);
    if (closed_flag_) throw std::runtime_error("redis transport closed");
    busy_fds_.insert(c->fd);
    return c;
  }
  void checkin(redis::ContextPtr c, bool healthy) {
    std::lock_guard g(pool_mu_);
    busy_fds_.erase(c->fd);
    if (healthy && !closed_flag_ && c->err == 0 && idle_.size() < opts_.max_idle_connections)
      idle_.push_back(std::move(c));
    // otherwise freed here, after its fd left busy_fds_ (close() never shuts down a reused fd)
  }

  std::string sha(std::size_t i) {
    std::lock_guard g(sha_mu_);
    return shas_[i];
  }

  redis::ReplyPtr eval(std::size_t script, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
    auto c = checkout();
    bool healthy = false;
    struct Guard {
      RedisTransport* t;
      redis::ContextPtr* c;
      bool* healthy;
      ~Guard() { t->checkin(std::move(*c), *healthy); }
    } guard{this, &c, &healthy};

    std::vector<std::string> argv;
    auto build = [&](const std::string& verb, const std::string& body) {
      argv.clear();
      argv.push_back(verb);
      argv.push_back(body);
      argv.push_back(std::to_string(keys.size()));
      argv.insert(argv.end(), keys.begin(), keys.end());
      argv.insert(argv.end(), args.begin(), args.end());
    };
    std::string s = sha(script);
    if (s.empty()) {
      auto r = redis::command(c.get(), {"SCRIPT", "LOAD", scripts_[script]});
      if (r->type != REDIS_REPLY_STRING) throw std::runtime_error(bad_shape("script load", r.get()));
      s.assign(r->str, r->len);
      std::lock_guard g(sha_mu_);
      shas_[script] = s;
    }
    build("EVALSHA", s);
    auto r = redis::command(c.get(), argv);
    if (r->type == REDIS_REPLY_ERROR && std::string_view(r->str, r->len).starts_with("NOSCRIPT")) {
      build("EVAL", scripts_[script]);
      r = redis::command(c.get(), argv);
    }
    healthy = true;
    if (r->type == REDIS_REPLY_ERROR) throw std::runtime_error("redis error: " + std::string(r->str, r->len));
    return r;
  }

  // Subscriber -------------------------------------------------------------------------------
  void wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
  }

  void subscribe_loop() {
    detail::block_sigpipe_in_this_thread();
    redis::ContextPtr c;
    std::set<std::string> subscribed;  // channels we asked the server for
    auto backoff = std::chrono::milliseconds(50);
    for (;;) {
      std::map<std::string, std::string> want;  // channel → name
      {
        std::lock_guard g(sub_mu_);
        if (closed_) return;
        for (const auto& [ch, w] : watched_) want.emplace(ch, w.name);
      }
      if (!c && !want.empty()) {
        try {
          c = redis::connect(opts_.host, opts_.port, opts_.connect_timeout);
          subscribed.clear();
          backoff = std::chrono::milliseconds(50);
        } catch (const std::exception&) {
          c.reset();
          wait_wake(backoff);
          backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
          continue;
        }
      }
      if (c) {
        bool ok = true;
        for (const auto& [ch, name] : want) {
          if (subscribed.count(ch)) continue;
          const char* argv[] = {"SUBSCRIBE", ch.c_str()};
          const std::size_t lens[] = {9, ch.size()};
          ok = ok && redisAppendCommandArgv(c.get(), 2, argv, lens) == REDIS_OK;
          subscribed.insert(ch);
        }
        for (auto it = subscribed.begin(); it != subscribed.end();) {
          if (want.count(*it)) {
            ++it;
            continue;
          }
          const char* argv[] = {"UNSUBSCRIBE", it->c_str()};
          const std::size_t lens[] = {11, it->size()};
          ok = ok && redisAppendCommandArgv(c.get(), 2, argv, lens) == REDIS_OK;
          it = subscribed.erase(it);
        }
        int done = 0;
        while (ok && !done) ok = redisBufferWrite(c.get(), &done) == REDIS_OK;
        if (!ok) {
          drop(c, subscribed);
          continue;
        }
      }
      pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {c ? c->fd : -1, POLLIN, 0}};
      const int n = ::poll(fds, c ? 2 : 1, 1000);
      if (n < 0 && errno != EINTR) {
        drop(c, subscribed);
        continue;
      }
      if (fds[0].revents & POLLIN) {
        std::uint64_t v = 0;
        [[maybe_unused]] auto r = ::read(wake_fd_, &v, sizeof(v));
      }
      if (c && (fds[1].revents & (POLLIN | POLLERR | POLLHUP))) {
        if (redisBufferRead(c.get()) != REDIS_OK) {
          drop(c, subscribed);
          continue;
        }
        for (;;) {
          void* raw = nullptr;
          if (redisGetReplyFromReader(c.get(), &raw) != REDIS_OK) {
            drop(c, subscribed);
            break;
          }
          if (raw == nullptr) break;
          redis::ReplyPtr reply(static_cast<redisReply*>(raw));
          handle_push(reply.get());
        }
      }
    }
  }

  void drop(redis::ContextPtr& c, std::set<std::string>& subscribed) {
    c.reset();
    subscribed.clear();
    std::lock_guard g(sub_mu_);
    subscribed_count_ = 0;
  }

  void wait_wake(std::chrono::milliseconds ms) {
    pollfd fd{wake_fd_, POLLIN, 0};
    if (::poll(&fd, 1, static_cast<int>(ms.count())) > 0) {
      std::uint64_t v = 0;
      [[maybe_unused]] auto r = ::read(wake_fd_, &v, sizeof(v));
    }
  }

  void handle_push(const redisReply* r) {
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3) return;
    const auto* kind = r->element[0];
    if (kind->type != REDIS_REPLY_STRING) return;
    const std::string_view k(kind->str, kind->len);
    if (k == "subscribe" || k == "unsubscribe") {
      if (r->element[2]->type == REDIS_REPLY_INTEGER) {
        std::lock_guard g(sub_mu_);
        subscribed_count_ = static_cast<std::size_t>(r->element[2]->integer);
      }
      if (k == "unsubscribe" || r->element[1]->type != REDIS_REPLY_STRING) return;
      // A release published before this subscription took effect was never delivered, so a
      // confirmed (re)subscription wakes one waiter: at worst one extra acquire attempt.
      ReleasedCallback cb;
      std::string name;
      {
        std::lock_guard g(sub_mu_);
        auto it = watched_.find(std::string(r->element[1]->str, r->element[1]->len));
        if (it == watched_.end()) return;
        cb = it->second.cb;
        name = it->second.name;
      }
      if (cb) cb(name);
      return;
    }
    if (k != "message" || r->element[1]->type != REDIS_REPLY_STRING) return;
    const std::string channel(r->element[1]->str, r->element[1]->len);
    ReleasedCallback cb;
    std::string name;
    {
      std::lock_guard g(sub_mu_);
      auto it = watched_.find(channel);
      if (it == watched_.end()) return;
      cb = it->second.cb;
      name = it->second.name;
    }
    if (cb) cb(name);
  }

  RedisOptions opts_;
  std::string scripts_[3];
  std::mutex sha_mu_;
  std::string shas_[3];

  std::mutex pool_mu_;
  bool closed_flag_ = false;
  std::vector<redis::ContextPtr> idle_;
  std::multiset<int> busy_fds_;

  mutable std::mutex sub_mu_;
  bool closed_ = false;
  std::map<std::string, Watch> watched_;  // channel → watch
  std::size_t subscribed_count_ = 0;
  int wake_fd_ = -1;
  std::thread subscriber_;
};

}  // namespace leasehold
