// leasehold/redis_transport.hpp — the Redis executor on hiredis.
//
// The core speaks the Redis protocol itself (lh_client_new_redis: keys, scripts, arguments, the
// meaning of every reply, the wait queue, the wake channel; docs/redis-protocol.md). This
// executor only runs the core's requests verbatim and hands back what Redis said, unread:
//   commands connection   — one thread; the requests queued meanwhile go out as one pipeline,
//                           each reply flattened into lh_value + one data buffer (lh_reply).
//                           An application thread that waits for its own request (acquire,
//                           release) runs the pipeline itself when the connection is free:
//                           two thread hops per request cost more than the round trip;
//   subscriber connection — one thread polling its socket and an eventfd; SUBSCRIBE /
//                           UNSUBSCRIBE are written there, every message and confirmation goes
//                           to the core; a lost connection reports its channels unsubscribed
//                           and is reopened when the core subscribes again.
// A broken or timed-out connection fails the requests on it (lh_request_failed) and is
// reopened for the next one. One RedisTransport per LockClient (LockClient::close() closes it).
//
// Redis Sentinel (RedisOptions::sentinels): hiredis has no Sentinel support, so every (re)connect
// asks the sentinels for the master (SENTINEL get-master-addr-by-name) and checks that the server
// there says it is one (ROLE). A failover breaks the connections to a dead master, and the new
// ones reach the promoted replica once the sentinels name it; a READONLY reply (a demoted master)
// drops the commands connection; a commands connection that reaches another master drops the
// subscriber, so the core subscribes again there. Not followed: a master demoted while still
// running, until a request fails or the sentinels close its clients (they do when they
// reconfigure it as a replica); nothing listens to the sentinels' +switch-master.
#pragma once

#include <leasehold.hpp>

#include <hiredis/hiredis.h>
#include <poll.h>
#include <signal.h>
#include <cerrno>
#include <charconv>
#include <tuple>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

namespace leasehold {

// A sentinel's address (RedisOptions::sentinels).
struct SentinelAddress {
  std::string host;
  int port = 26379;
};

struct RedisOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string unix_socket;  // non-empty: connect to this path instead of host:port
  std::string username;     // ACL user (AUTH username password); empty: AUTH password
  std::string password;     // empty: no AUTH
  int db = 0;               // SELECT db on each connection when non-zero
  std::chrono::milliseconds connect_timeout{1000};
  std::chrono::milliseconds command_timeout{2000};  // bounds every reply on the commands connection
  std::size_t max_idle_connections = 8;             // ignored: one pipelined commands connection
  std::optional<lh_redis_options> protocol;         // the core's Redis options; nullopt: defaults
  LogFn log;                                        // connection errors; default: stderr
  // Redis Sentinel: non-empty, host/port are ignored and each connection goes to the master the
  // first answering sentinel names `sentinel_master`. The credentials above are the servers'.
  std::vector<SentinelAddress> sentinels;
  std::string sentinel_master;
  std::string sentinel_username;  // the sentinels' ACL user / password, if they require one
  std::string sentinel_password;
};

// Counters of a RedisTransport. The core counts the protocol (lh_redis_counters); here only the
// pub/sub messages received (`wakeups`). The other fields stay 0 (kept for compatibility).
struct RedisStats {
  std::uint64_t acquires = 0;
  std::uint64_t queued_acquires = 0;
  std::uint64_t wakeups = 0;
  std::uint64_t passed_on = 0;
};

namespace detail {
// SIGPIPE blocked on an application thread while it writes to a socket, and one raised meanwhile
// taken back: a peer that went away is EPIPE, and the thread's signal mask is left as it was.
class SigpipeScope {
 public:
  SigpipeScope() noexcept {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    sigset_t p;
    sigpending(&p);
    was_pending_ = sigismember(&p, SIGPIPE) == 1;
  }
  ~SigpipeScope() {
    sigset_t p;
    sigpending(&p);
    if (!was_pending_ && sigismember(&p, SIGPIPE) == 1) {
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeScope(const SigpipeScope&) = delete;
  SigpipeScope& operator=(const SigpipeScope&) = delete;

 private:
  sigset_t pipe_{}, old_{};
  bool was_pending_ = false;
};
}  // namespace detail

class RedisTransport final : public Transport, public Backend {
  struct CtxFree { void operator()(redisContext* c) const noexcept { redisFree(c); } };  // clang-format off
  struct ReplyFree { void operator()(void* r) const noexcept { freeReplyObject(r); } };   // clang-format on
  using Ctx = std::unique_ptr<redisContext, CtxFree>;
  using Reply = std::unique_ptr<redisReply, ReplyFree>;

 public:
  explicit RedisTransport(RedisOptions options = {}) : opts_(std::move(options)) {
    if (!opts_.sentinels.empty() && opts_.sentinel_master.empty())
      throw std::invalid_argument("RedisOptions::sentinels needs sentinel_master");
    for (const auto& a : opts_.sentinels)
      if (a.host.empty() || a.port <= 0 || a.port > 65535) throw std::invalid_argument("bad sentinel address");
    if (!opts_.log) opts_.log = [](std::string_view m) { std::fprintf(stderr, "leasehold redis: %.*s\n", int(m.size()), m.data()); };
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) throw std::runtime_error("eventfd failed");
  }
  RedisTransport(const RedisTransport&) = delete;
  RedisTransport& operator=(const RedisTransport&) = delete;
  ~RedisTransport() override {
    close();
    ::close(wake_fd_);
  }

  // The LockClient runs the core's requests instead; a direct call is a transport error.
  AcquireResult acquire(std::string_view, std::string_view, std::uint64_t) override {
    return TransportError{"RedisTransport executes its LockClient's requests only"};
  }
  RenewResult renew(std::string_view, std::string_view, std::uint64_t, std::span<const std::uint8_t>) override {
    return RenewResult::TransportError;
  }
  ReleaseResult release(std::string_view, std::string_view, std::span<const std::uint8_t>) override {
    return ReleaseResult::TransportError;
  }
  Backend* backend() override { return this; }
  [[nodiscard]] bool answers_status() const override { return true; }
  [[nodiscard]] RedisStats stats() const { return RedisStats{0, 0, messages_.load(), 0}; }

  Core make_core(const Config& config) override {
    lh_redis_options ro{};
    lh_redis_options_default(&ro);
    if (opts_.protocol) ro = *opts_.protocol, ro.struct_size = sizeof ro;
    const lh_config c = config.to_c();
    const auto seed = detail::os_seed();
    lh_client* raw = nullptr;
    const auto st = lh_client_new_redis(&c, &ro, seed.data(), seed.size(), &raw);
    if (st != LH_OK) throw Error(st, "lh_client_new_redis failed");
    return Core::adopt(raw);
  }
  void start(Sink sink) override {
    sink_ = std::move(sink);
    commands_ = std::thread([this] { command_loop(); });
    subscriber_ = std::thread([this] { subscriber_loop(); });
  }
  void execute(Request r) override {
    const bool sub = r.connection == LH_CONNECTION_SUBSCRIBER;
    {
      std::lock_guard g(mu_);
      if (closed_) return;
      (sub ? sub_q_ : cmd_q_).push_back(std::move(r));
      if (!sub && caller_runs_) return;  // run_pending() follows
    }
    sub ? wake() : cv_.notify_one();
  }
  void drain_for_caller(Core& core) override {
    {
      std::lock_guard g(mu_);
      caller_runs_ = true;
    }
    struct Reset {
      RedisTransport* t;
      ~Reset() {
        std::lock_guard g(t->mu_);
        t->caller_runs_ = false;
      }
    } reset{this};
    drain(core);
  }
  void run_pending() noexcept override {
    std::deque<Request> batch;
    {
      std::unique_lock l(mu_);
      if (closed_ || cmd_q_.empty()) return;
      if (cmd_busy_) return cv_.notify_one();  // the running batch's owner hands it on
      cmd_busy_ = true;
      batch.swap(cmd_q_);
    }
    {
      const detail::SigpipeScope quiet;
      run_batch(batch);
    }
    {
      std::lock_guard g(mu_);
      cmd_busy_ = false;
    }
    cv_.notify_all();  // the commands thread (more requests) or close() (the connection is free)
  }
  // Unblocks an in-flight command (shutdown of its socket) and joins both threads.
  void close() override {
    {
      std::unique_lock l(mu_);
      if (closed_) return;
      closed_ = true;
      if (cmd_fd_ >= 0) ::shutdown(cmd_fd_, SHUT_RDWR);
    }
    cv_.notify_all();
    wake();
    if (commands_.joinable()) commands_.join();
    if (subscriber_.joinable()) subscriber_.join();
    std::unique_lock l(mu_);
    cv_.wait(l, [&] { return !cmd_busy_; });  // an application thread's batch (unblocked above)
    cmd_.reset();
  }

 private:
  static timeval tv(std::chrono::milliseconds ms) {
    return timeval{static_cast<time_t>(ms.count() / 1000), static_cast<suseconds_t>(ms.count() % 1000 * 1000)};
  }
  static int append(redisContext* c, const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto& a : args) argv.push_back(a.data()), lens.push_back(a.size());
    return redisAppendCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data());
  }
  void wake() const noexcept { [[maybe_unused]] auto n = ::write(wake_fd_, "\1\0\0\0\0\0\0\0", 8); }
  void log(const std::string& m) const noexcept try { opts_.log(m); } catch (...) {}

  bool sentinel() const noexcept { return !opts_.sentinels.empty(); }

  // Runs the commands in order on c; the last reply, or null on a failure or an error reply
  // (logged).
  Reply run(redisContext* c, const std::vector<std::vector<std::string>>& cmds) const {
    Reply r;
    for (const auto& cmd : cmds) {
      void* raw = nullptr;
      if (append(c, cmd) != REDIS_OK || redisGetReply(c, &raw) != REDIS_OK || raw == nullptr)
        return log(cmd[0] + ": " + (c->err ? c->errstr : "no reply")), nullptr;
      r.reset(static_cast<redisReply*>(raw));
      if (r->type == REDIS_REPLY_ERROR) return log(cmd[0] + ": " + std::string(r->str, r->len)), nullptr;
    }
    return r;
  }
  static std::vector<std::string> auth(const std::string& user, const std::string& password) {
    return user.empty() ? std::vector<std::string>{"AUTH", password} : std::vector<std::string>{"AUTH", user, password};
  }

  // The master's host and port as the first sentinel that knows it says, or nullopt (logged).
  std::optional<std::pair<std::string, int>> ask_sentinels() const {
    for (const auto& a : opts_.sentinels) {
      Ctx c(redisConnectWithTimeout(a.host.c_str(), a.port, tv(opts_.connect_timeout)));
      if (!c || c->err) continue;
      redisSetTimeout(c.get(), tv(opts_.command_timeout));
      std::vector<std::vector<std::string>> cmds;
      if (!opts_.sentinel_password.empty()) cmds.push_back(auth(opts_.sentinel_username, opts_.sentinel_password));
      cmds.push_back({"SENTINEL", "get-master-addr-by-name", opts_.sentinel_master});
      Reply r = run(c.get(), cmds);
      if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
          r->element[1]->type != REDIS_REPLY_STRING)
        continue;  // a nil reply: this sentinel does not know the name
      const std::string port(r->element[1]->str, r->element[1]->len);
      int p = 0;
      const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
      if (ec != std::errc{} || end != port.data() + port.size() || p <= 0 || p > 65535) continue;
      return std::pair{std::string(r->element[0]->str, r->element[0]->len), p};
    }
    log("no sentinel named a master for " + opts_.sentinel_master);
    return std::nullopt;
  }

  // A connection with AUTH and SELECT done, or null (logged). With sentinels, to the master they
  // name, checked with ROLE; *addr says where.
  Ctx connect(std::string* addr = nullptr) const {
    std::string host = opts_.host;
    int port = opts_.port;
    if (sentinel()) {
      auto m = ask_sentinels();
      if (!m) return nullptr;
      std::tie(host, port) = *m;
    }
    Ctx c(opts_.unix_socket.empty() || sentinel()
              ? redisConnectWithTimeout(host.c_str(), port, tv(opts_.connect_timeout))
              : redisConnectUnixWithTimeout(opts_.unix_socket.c_str(), tv(opts_.connect_timeout)));
    if (!c || c->err) return log(std::string("connect: ") + (c ? c->errstr : "out of memory")), nullptr;
    redisSetTimeout(c.get(), tv(opts_.command_timeout));
    std::vector<std::vector<std::string>> setup;
    if (!opts_.password.empty()) setup.push_back(auth(opts_.username, opts_.password));
    if (opts_.db != 0) setup.push_back({"SELECT", std::to_string(opts_.db)});
    if (!setup.empty() && !run(c.get(), setup)) return nullptr;
    if (sentinel()) {
      // A sentinel may still name a master it has not seen demoted yet.
      Reply r = run(c.get(), {{"ROLE"}});
      if (!r) return nullptr;
      if (r->type != REDIS_REPLY_ARRAY || r->elements == 0 || r->element[0]->type != REDIS_REPLY_STRING ||
          std::string_view(r->element[0]->str, r->element[0]->len) != "master")
        return log(host + ":" + std::to_string(port) + " named by the sentinels is not a master"), nullptr;
    }
    if (addr) *addr = host + ":" + std::to_string(port);
    return c;
  }

  static void flatten(const redisReply* r, BackendInput& out) {
    lh_value v{};
    switch (r->type) {
      case REDIS_REPLY_INTEGER: v.kind = LH_VALUE_INT, v.integer = r->integer; break;
      case REDIS_REPLY_STRING: v.kind = LH_VALUE_BULK; break;
      case REDIS_REPLY_STATUS: v.kind = LH_VALUE_STATUS; break;
      case REDIS_REPLY_ERROR: v.kind = LH_VALUE_ERROR; break;
      case REDIS_REPLY_ARRAY: v.kind = LH_VALUE_ARRAY, v.len = r->elements; break;
      default: v.kind = LH_VALUE_NIL; break;
    }
    if (v.kind == LH_VALUE_BULK || v.kind == LH_VALUE_STATUS || v.kind == LH_VALUE_ERROR) {
      v.offset = out.data.size(), v.len = r->len;
      out.data.append(r->str, r->len);
    }
    out.values.push_back(v);
    if (v.kind == LH_VALUE_ARRAY)
      for (std::size_t i = 0; i < r->elements; ++i) flatten(r->element[i], out);
  }
  void failed(std::uint64_t id) { sink_(BackendInput{BackendInput::Kind::Failed, id, {}, {}, {}, false, {}}); }

  void command_loop() {
    detail::block_sigpipe_in_this_thread();
    for (;;) {
      std::deque<Request> batch;
      {
        std::unique_lock l(mu_);
        cv_.wait(l, [&] { return closed_ || (!cmd_q_.empty() && !cmd_busy_); });
        if (closed_) return;
        cmd_busy_ = true;
        batch.swap(cmd_q_);
      }
      run_batch(batch);
      std::lock_guard g(mu_);
      cmd_busy_ = false;
      cv_.notify_all();  // close() may wait for the connection
    }
  }
  // Sends the batch as one pipeline on cmd_ and hands back the replies (the caller set
  // cmd_busy_: cmd_ is this thread's until it clears it).
  void run_batch(std::deque<Request>& batch) {
    Ctx& c = cmd_;
    if (!c) {
      std::string addr;
      if ((c = connect(&addr))) set_cmd_fd(c->fd), found_master(addr);
    }
    std::size_t sent = 0, done = 0;
    bool demoted = false;
    while (c && sent < batch.size() && append(c.get(), batch[sent].argv) == REDIS_OK) ++sent;
    for (void* raw = nullptr; done < sent && redisGetReply(c.get(), &raw) == REDIS_OK && raw; ++done, raw = nullptr) {
      Reply r(static_cast<redisReply*>(raw));
      demoted = demoted || (r->type == REDIS_REPLY_ERROR && std::string_view(r->str, r->len).starts_with("READONLY"));
      BackendInput in{BackendInput::Kind::Reply, batch[done].id, {}, {}, {}, false, {}};
      flatten(r.get(), in);
      sink_(std::move(in));
    }
    if (demoted && sentinel() && done == batch.size()) {
      // The master became a replica: ask the sentinels again on the next request.
      log("commands connection: the master was demoted");
      set_cmd_fd(-1);
      c.reset();
      return;
    }
    if (done == batch.size()) return;
    if (c) log(std::string("commands connection: ") + (c->err ? c->errstr : "broken"));
    for (std::size_t i = done; i < batch.size(); ++i) failed(batch[i].id);
    set_cmd_fd(-1);
    c.reset();
  }
  void set_cmd_fd(int fd) { std::lock_guard g(mu_); cmd_fd_ = fd; }
  // (Sentinel) A connection reached the master at addr; the subscriber leaves an older one.
  void found_master(const std::string& addr) {
    {
      std::lock_guard g(mu_);
      if (addr.empty() || addr == master_) return;
      master_ = addr;
    }
    wake();
  }

  void subscriber_loop() {
    detail::block_sigpipe_in_this_thread();
    Ctx s;
    std::string at;                  // where s is connected
    std::set<std::string> channels;  // subscribed (or asked for) on s: reported lost with it
    auto lose = [&] {
      if (s) log(std::string("subscriber connection: ") + (s->err ? s->errstr : "broken"));
      s.reset();
      for (const auto& ch : channels) sink_(BackendInput{BackendInput::Kind::Subscription, 0, {}, {}, ch, false, {}});
      channels.clear();
    };
    for (;;) {
      std::deque<Request> batch;
      {
        std::lock_guard g(mu_);
        if (closed_) return;
        batch.swap(sub_q_);
      }
      for (auto& r : batch) {
        if (!s && (s = connect(&at))) found_master(at);
        int written = 0;
        if (s && append(s.get(), r.argv) == REDIS_OK)
          while (redisBufferWrite(s.get(), &written) == REDIS_OK && !written) {}
        if (!written) {
          failed(r.id);
          lose();
        } else if (r.argv.size() > 1 && strcasecmp(r.argv[0].c_str(), "SUBSCRIBE") == 0) {
          channels.insert(r.argv.begin() + 1, r.argv.end());
        }
      }
      pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {s ? s->fd : -1, POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) continue;
      std::uint64_t n = 0;
      if (fds[0].revents != 0) [[maybe_unused]] auto rd = ::read(wake_fd_, &n, sizeof n);
      if (s && sentinel()) {
        if (const auto now = master_addr(); !now.empty() && now != at) {
          log("subscriber connection: the master moved to " + now);
          s.reset();  // lose() without a second log line
          lose();
          continue;
        }
      }
      if (!s || fds[1].revents == 0) continue;
      if (redisBufferRead(s.get()) != REDIS_OK) {
        lose();
        continue;
      }
      void* raw = nullptr;
      while (redisGetReplyFromReader(s.get(), &raw) == REDIS_OK && raw != nullptr) {
        Reply r(static_cast<redisReply*>(std::exchange(raw, nullptr)));
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 || r->element[0]->type != REDIS_REPLY_STRING ||
            r->element[1]->type != REDIS_REPLY_STRING)
          continue;
        const std::string kind(r->element[0]->str, r->element[0]->len);
        std::string ch(r->element[1]->str, r->element[1]->len);
        const redisReply* p = r->element[2];
        if (kind == "message" && p->type == REDIS_REPLY_STRING) {
          ++messages_;
          sink_(BackendInput{BackendInput::Kind::Message, 0, {}, std::string(p->str, p->len), std::move(ch), false, {}});
        } else if (kind == "subscribe" || kind == "unsubscribe") {
          if (kind[0] == 'u') channels.erase(ch);
          sink_(BackendInput{BackendInput::Kind::Subscription, 0, {}, {}, std::move(ch), kind[0] == 's', {}});
        }
      }
      if (s->err) lose();
    }
  }

  RedisOptions opts_;
  Sink sink_;
  int wake_fd_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Request> cmd_q_, sub_q_;  // guarded by mu_
  int cmd_fd_ = -1;                    // guarded by mu_: shut down by close()
  bool cmd_busy_ = false;              // guarded by mu_: a thread is running a batch on cmd_
  bool caller_runs_ = false;           // guarded by mu_: in drain_for_caller()
  Ctx cmd_;                            // the commands connection: its thread's while cmd_busy_
  std::string master_;                 // guarded by mu_: the master a connection reached last
  std::string master_addr() {
    std::lock_guard g(mu_);
    return master_;
  }
  bool closed_ = false;                // guarded by mu_
  std::atomic<std::uint64_t> messages_{0};
  std::thread commands_, subscriber_;
};

}  // namespace leasehold
