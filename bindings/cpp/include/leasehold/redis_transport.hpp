// leasehold/redis_transport.hpp — a Transport for a single Redis server on hiredis.
//
// Uses the canonical Lua scripts and key layout exported by the library (lh_redis_script /
// lh_redis_key), so C++, Python and Go clients contend correctly for the same names
// (protocol 2, see docs/redis-protocol-3.md):
//   ACQUIRE KEYS=[lock, fence(, waiters)] ARGV=[token, ttl_ms(, wake)] → [1, fence, ttl] | [0, retry or -1]
//   RENEW   KEYS=[lock]           ARGV=[token, ttl_ms] → 1 | 0
//   RELEASE KEYS=[lock, waiters]  ARGV=[token, channel, name(, own wake)] → 1 | 0
//   NOTIFY  KEYS=[waiters]        ARGV=[name, own wake] → 1 | 0
// Scripts run with EVALSHA, falling back to EVAL on NOSCRIPT. A Redis error reply or a reply of
// an unexpected shape is a transport error (thrown, so the LockClient logs it), never a grant.
//
// Commands use a small pool of blocking connections with a command timeout (so a call never hangs
// longer than that). hiredis writes with write(2): call it from threads that block SIGPIPE (the
// LockClient's IO threads do; so does the subscriber thread).
//
// Waiting (watch/unwatch) uses one wake channel per transport (lh:wake:<32 random hex>),
// subscribed on a subscriber connection on its own thread (re-established and re-subscribed
// after a disconnect) from the first watch on. Once the server confirmed that subscription,
// ACQUIRE for a waiting name queues the wake channel, and a release wakes one queued client
// instead of every waiting client. A wake-up for a name nobody here waits for any more (no
// callback, or a watch_waiter callback that declines it) is passed on with NOTIFY. The release
// channel lh:{NAME}:released is still published by every RELEASE but not subscribed here.
// One RedisTransport per LockClient (LockClient::close() closes it).
#pragma once

#include <leasehold.hpp>

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
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
  Notify = LH_REDIS_SCRIPT_NOTIFY,
};
enum class Key : std::uint32_t {
  Lock = LH_REDIS_KEY_LOCK,
  Fence = LH_REDIS_KEY_FENCE,
  Channel = LH_REDIS_KEY_CHANNEL,
  Waiters = LH_REDIS_KEY_WAITERS,
};

// The canonical script text (static storage in the library).
inline std::string_view script(Script kind) {
  const char* text = nullptr;
  std::size_t len = 0;
  const auto st = lh_redis_script(static_cast<std::uint32_t>(kind), &text, &len);
  if (st != LH_OK) throw Error(st, "lh_redis_script");
  return {text, len};
}

// The key (or channel) for `name`, e.g. lh:{NAME}, lh:{NAME}:fence, lh:{NAME}:released,
// lh:{NAME}:waiters.
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

// A fresh wake channel, formatted by the library (lh_redis_wake_channel: lh:wake: + 32 hex
// digits) from std::random_device bytes: unguessable, so two transports never share one and
// nobody else's release can be aimed at it by accident.
inline std::string new_wake_channel() {
  std::random_device rd;
  std::array<std::uint8_t, LH_REDIS_WAKE_RANDOM_LEN> random{};
  for (std::size_t i = 0; i < random.size(); i += 4) {
    auto v = static_cast<std::uint32_t>(rd());
    for (std::size_t j = 0; j < 4 && i + j < random.size(); ++j, v >>= 8) random[i + j] = static_cast<std::uint8_t>(v);
  }
  std::string ch(64, '\0');
  std::size_t n = 0;
  const auto st =
      lh_redis_wake_channel(random.data(), reinterpret_cast<std::uint8_t*>(ch.data()), ch.size(), &n);
  if (st != LH_OK) throw Error(st, "lh_redis_wake_channel");
  ch.resize(n);
  return ch;
}

}  // namespace redis

struct RedisOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::chrono::milliseconds connect_timeout{1000};
  std::chrono::milliseconds command_timeout{2000};  // bounds every blocking call
  std::size_t max_idle_connections = 8;
  // Errors of best-effort housekeeping (ZREM on unwatch, NOTIFY pass-on); default: stderr.
  LogFn log;
};

// Counters of a RedisTransport (diagnostics and tests).
struct RedisStats {
  std::uint64_t acquires = 0;         // ACQUIRE scripts run
  std::uint64_t queued_acquires = 0;  // ... of them in the queueing form
  std::uint64_t wakeups = 0;          // messages received on the wake channel
  std::uint64_t passed_on = 0;        // stray wake-ups passed on with NOTIFY
};

class RedisTransport final : public Transport {
 public:
  explicit RedisTransport(RedisOptions options = {}) : opts_(std::move(options)), wake_(redis::new_wake_channel()) {
    if (!opts_.log) {
      opts_.log = [](std::string_view m) {
        std::fprintf(stderr, "leasehold redis: %.*s\n", static_cast<int>(m.size()), m.data());
      };
    }
    for (auto k : {redis::Script::Acquire, redis::Script::Renew, redis::Script::Release, redis::Script::Notify})
      scripts_[index(k)] = std::string(redis::script(k));
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
    std::vector<std::string> keys{redis::key(redis::Key::Lock, name), redis::key(redis::Key::Fence, name)};
    std::vector<std::string> args{std::string(token), std::to_string(ttl_ms)};
    bool queueing = false;
    {
      // Queue only once the wake subscription is confirmed: a release must not pop our entry
      // while nobody listens. Uncontended names keep the plain form.
      std::lock_guard g(sub_mu_);
      if (wake_confirmed_ && waiting_.contains(name)) {
        queueing = true;
        queued_.emplace(name);
      }
    }
    if (queueing) {
      keys.push_back(redis::key(redis::Key::Waiters, name));
      args.push_back(wake_);
      ++queued_acquires_;
    }
    ++acquires_;
    if (!queueing) return parse_acquire(eval(redis::Script::Acquire, keys, args).get());
    std::optional<AcquireResult> res;
    try {
      res = parse_acquire(eval(redis::Script::Acquire, keys, args).get());
    } catch (...) {
      after_queueing(name, false);
      throw;
    }
    after_queueing(name, std::holds_alternative<Granted>(*res));
    return *res;
  }

  RenewResult renew(std::string_view name, std::string_view token, std::uint64_t ttl_ms,
                    std::span<const std::uint8_t>) override {
    auto r = eval(redis::Script::Renew, {redis::key(redis::Key::Lock, name)}, {std::string(token), std::to_string(ttl_ms)});
    return flag("renew", r.get()) ? RenewResult::Renewed : RenewResult::Rejected;
  }

  ReleaseResult release(std::string_view name, std::string_view token, std::span<const std::uint8_t>) override {
    std::vector<std::string> args{std::string(token), redis::key(redis::Key::Channel, name), std::string(name)};
    bool skip_own = false;
    {
      // Queued earlier but no waiter any more: the script drops our entry (owner or not) before
      // waking anyone.
      std::lock_guard g(sub_mu_);
      if (!waiting_.contains(name)) skip_own = erase_queued(name);
    }
    if (skip_own) args.push_back(wake_);
    // On a transport error the name stays forgotten: a leftover entry is passed on later.
    const bool released = flag("release", eval(redis::Script::Release,
                                               {redis::key(redis::Key::Lock, name), redis::key(redis::Key::Waiters, name)},
                                               args)
                                              .get());
    return released ? ReleaseResult::Released : ReleaseResult::NotOwner;
  }

  // Deliver wake-ups for `name` to on_released until unwatch; each counts as taken.
  void watch(std::string_view name, ReleasedCallback on_released) override {
    WakeCallback cb;
    if (on_released) cb = [f = std::move(on_released)](std::string_view n) {
      f(n);
      return true;
    };
    watch_waiter(name, std::move(cb));
  }
  // The core has waiters for `name`: deliver wake-ups for it to on_wake until unwatch; one it
  // declines (false) is passed on like one for an unwatched name.
  void watch_waiter(std::string_view name, WakeCallback on_wake) override {
    bool recheck = false, start = false;
    {
      std::lock_guard g(sub_mu_);
      if (closed_) return;
      waiting_.insert_or_assign(std::string(name), on_wake);
      recheck = wake_confirmed_;
      start = !wake_wanted_;
      wake_wanted_ = true;  // kept subscribed from now on (lingering costs nothing)
    }
    if (start) wake();
    // Attempts sent before this watch registered were not queued, so a release may already have
    // passed us by; one re-check (as the confirmation of a new subscription does) covers it.
    if (recheck && on_wake) on_wake(name);  // its answer: nothing to pass on, nobody was woken
  }
  void unwatch(std::string_view name) override {
    bool zrem = false;
    {
      std::lock_guard g(sub_mu_);
      if (auto it = waiting_.find(name); it != waiting_.end()) waiting_.erase(it);
      zrem = erase_queued(name);
    }
    // Synchronous on the watcher thread: a later watch of the same name runs after it, so this
    // ZREM cannot remove a newer entry.
    if (zrem) zrem_own(name);
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
      waiting_.clear();
    }
    wake();
    if (subscriber_.joinable()) subscriber_.join();
  }

  // Subscribed channels confirmed by the server (for tests and diagnostics).
  [[nodiscard]] std::size_t subscribed() const {
    std::lock_guard g(sub_mu_);
    return subscribed_count_;
  }
  // This transport's wake channel.
  [[nodiscard]] const std::string& wake_channel() const noexcept { return wake_; }
  // True while the server has confirmed the wake subscription (ACQUIREs of waiting names queue).
  [[nodiscard]] bool wake_ready() const {
    std::lock_guard g(sub_mu_);
    return wake_confirmed_;
  }
  [[nodiscard]] RedisStats stats() const noexcept {
    return {acquires_.load(), queued_acquires_.load(), wakeups_.load(), passed_on_.load()};
  }

 private:
  static constexpr std::size_t kScripts = 4;
  static std::size_t index(redis::Script k) { return static_cast<std::size_t>(k) - 1; }

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
  static AcquireResult parse_acquire(const redisReply* r) {
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2) throw std::runtime_error(bad_shape("acquire", r));
    const auto i = [&](std::size_t k) -> long long {
      if (k >= r->elements || r->element[k]->type != REDIS_REPLY_INTEGER) throw std::runtime_error(bad_shape("acquire", r));
      return r->element[k]->integer;
    };
    if (i(0) == 1) {
      if (r->elements < 3 || i(1) <= 0 || i(2) <= 0) throw std::runtime_error(bad_shape("acquire", r));
      return Granted{static_cast<std::uint64_t>(i(1)), static_cast<std::uint64_t>(i(2)), {}};
    }
    if (i(0) == 0) {
      const long long retry = i(1);
      if (retry < 0) return HeldByOther{std::nullopt};
      return HeldByOther{static_cast<std::uint64_t>(retry)};
    }
    throw std::runtime_error(bad_shape("acquire", r));
  }

  void log(const std::string& m) const noexcept {
    try {
      opts_.log(m);
    } catch (...) {
    }
  }
  bool is_closed() {
    std::lock_guard g(pool_mu_);
    return closed_flag_;
  }

  // sub_mu_ held.
  bool erase_queued(std::string_view name) {
    auto it = queued_.find(name);
    if (it == queued_.end()) return false;
    queued_.erase(it);
    return true;
  }

  // A queueing ACQUIRE finished. If unwatch ran meanwhile, its ZREM may have reached the
  // server before this ACQUIRE queued us again: the entry is ours to remove.
  void after_queueing(std::string_view name, bool granted) {
    {
      std::lock_guard g(sub_mu_);
      if (waiting_.contains(name) || queued_.contains(name)) return;
      // Granted: the core releases (or keeps) the lock; that RELEASE skips the entry.
      if (granted) {
        queued_.emplace(name);
        return;
      }
    }
    zrem_own(name);
  }

  // Best effort: a stale entry only costs a NOTIFY pass-on at the next release.
  void zrem_own(std::string_view name) {
    try {
      run({"ZREM", redis::key(redis::Key::Waiters, name), wake_});
    } catch (const std::exception& e) {
      if (!is_closed()) log("ZREM " + redis::key(redis::Key::Waiters, name) + ": " + e.what());
    }
  }

  // A wake-up for a name we no longer wait for: wake the next queued client instead (our own
  // entry, if any, is dropped by the script). Best effort, on a pool connection.
  void pass_on(const std::string& name) {
    try {
      ++passed_on_;
      eval(redis::Script::Notify, {redis::key(redis::Key::Waiters, name)}, {name, wake_});
    } catch (const std::exception& e) {
      if (!is_closed()) log("NOTIFY " + name + ": " + e.what());
    }
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

  // Runs `body` on a pooled connection; the connection goes back only if body returned.
  template <class F>
  redis::ReplyPtr with_connection(F&& body) {
    auto c = checkout();
    bool healthy = false;
    struct Guard {
      RedisTransport* t;
      redis::ContextPtr* c;
      bool* healthy;
      ~Guard() { t->checkin(std::move(*c), *healthy); }
    } guard{this, &c, &healthy};
    auto r = body(c.get());
    healthy = true;
    if (r->type == REDIS_REPLY_ERROR) throw std::runtime_error("redis error: " + std::string(r->str, r->len));
    return r;
  }

  redis::ReplyPtr run(const std::vector<std::string>& args) {
    return with_connection([&](redisContext* c) { return redis::command(c, args); });
  }

  std::string sha(std::size_t i) {
    std::lock_guard g(sha_mu_);
    return shas_[i];
  }

  redis::ReplyPtr eval(redis::Script kind, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
    const std::size_t script = index(kind);
    return with_connection([&](redisContext* c) {
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
        auto r = redis::command(c, {"SCRIPT", "LOAD", scripts_[script]});
        if (r->type != REDIS_REPLY_STRING) throw std::runtime_error(bad_shape("script load", r.get()));
        s.assign(r->str, r->len);
        std::lock_guard g(sha_mu_);
        shas_[script] = s;
      }
      build("EVALSHA", s);
      auto r = redis::command(c, argv);
      if (r->type == REDIS_REPLY_ERROR && std::string_view(r->str, r->len).starts_with("NOSCRIPT")) {
        build("EVAL", scripts_[script]);
        r = redis::command(c, argv);
      }
      return r;
    });
  }

  // Subscriber -------------------------------------------------------------------------------
  void wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
  }

  void subscribe_loop() {
    detail::block_sigpipe_in_this_thread();
    redis::ContextPtr c;
    bool asked = false;  // SUBSCRIBE sent on this connection
    auto backoff = std::chrono::milliseconds(50);
    for (;;) {
      bool want = false;
      {
        std::lock_guard g(sub_mu_);
        if (closed_) return;
        want = wake_wanted_;
      }
      if (!c && want) {
        try {
          c = redis::connect(opts_.host, opts_.port, opts_.connect_timeout);
          asked = false;
          backoff = std::chrono::milliseconds(50);
        } catch (const std::exception&) {
          c.reset();
          wait_wake(backoff);
          backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
          continue;
        }
      }
      if (c && !asked) {
        const char* argv[] = {"SUBSCRIBE", wake_.c_str()};
        const std::size_t lens[] = {9, wake_.size()};
        bool ok = redisAppendCommandArgv(c.get(), 2, argv, lens) == REDIS_OK;
        int done = 0;
        while (ok && !done) ok = redisBufferWrite(c.get(), &done) == REDIS_OK;
        if (!ok) {
          drop(c);
          continue;
        }
        asked = true;
      }
      pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {c ? c->fd : -1, POLLIN, 0}};
      const int n = ::poll(fds, c ? 2 : 1, 1000);
      if (n < 0 && errno != EINTR) {
        drop(c);
        continue;
      }
      if (fds[0].revents & POLLIN) {
        std::uint64_t v = 0;
        [[maybe_unused]] auto r = ::read(wake_fd_, &v, sizeof(v));
      }
      if (c && (fds[1].revents & (POLLIN | POLLERR | POLLHUP))) {
        if (redisBufferRead(c.get()) != REDIS_OK) {
          drop(c);
          continue;
        }
        for (;;) {
          void* raw = nullptr;
          if (redisGetReplyFromReader(c.get(), &raw) != REDIS_OK) {
            drop(c);
            break;
          }
          if (raw == nullptr) break;
          redis::ReplyPtr reply(static_cast<redisReply*>(raw));
          handle_push(reply.get());
        }
      }
    }
  }

  // Until the next confirmation, releases may pop our entries unheard: stop queueing.
  void drop(redis::ContextPtr& c) {
    c.reset();
    std::lock_guard g(sub_mu_);
    subscribed_count_ = 0;
    wake_confirmed_ = false;
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
    const auto* chan = r->element[1];
    if (kind->type != REDIS_REPLY_STRING || chan->type != REDIS_REPLY_STRING) return;
    const std::string_view k(kind->str, kind->len);
    if (std::string_view(chan->str, chan->len) != wake_) return;
    if (k == "subscribe") {
      // A release during the gap was missed, so every waiting name gets one re-check: at worst
      // one extra acquire attempt each.
      std::vector<std::pair<std::string, WakeCallback>> due;
      {
        std::lock_guard g(sub_mu_);
        if (r->element[2]->type == REDIS_REPLY_INTEGER)
          subscribed_count_ = static_cast<std::size_t>(r->element[2]->integer);
        wake_confirmed_ = true;
        due.assign(waiting_.begin(), waiting_.end());
      }
      for (auto& [name, cb] : due)
        if (cb) cb(name);
      return;
    }
    if (k != "message" || r->element[2]->type != REDIS_REPLY_STRING) return;
    ++wakeups_;
    const std::string name(r->element[2]->str, r->element[2]->len);
    WakeCallback cb;
    bool waiting = false;
    {
      std::lock_guard g(sub_mu_);
      if (auto it = waiting_.find(name); it != waiting_.end()) {
        waiting = true;
        cb = it->second;
      }
    }
    // Declined: the client's last waiter for it is gone though its unwatch has not arrived yet.
    if (!waiting || (cb && !cb(name))) pass_on(name);
  }

  RedisOptions opts_;
  const std::string wake_;  // immutable: read without a lock
  std::string scripts_[kScripts];
  std::mutex sha_mu_;
  std::string shas_[kScripts];

  std::mutex pool_mu_;
  bool closed_flag_ = false;
  std::vector<redis::ContextPtr> idle_;
  std::multiset<int> busy_fds_;

  mutable std::mutex sub_mu_;
  bool closed_ = false;
  bool wake_wanted_ = false;     // a watch happened: keep the wake channel subscribed
  bool wake_confirmed_ = false;  // the server confirmed it on the current connection
  std::map<std::string, WakeCallback, std::less<>> waiting_;  // name → core callback
  std::set<std::string, std::less<>> queued_;  // names a queueing ACQUIRE was sent for
  std::size_t subscribed_count_ = 0;
  int wake_fd_ = -1;
  std::thread subscriber_;

  std::atomic<std::uint64_t> acquires_{0}, queued_acquires_{0}, wakeups_{0}, passed_on_{0};
};

}  // namespace leasehold
