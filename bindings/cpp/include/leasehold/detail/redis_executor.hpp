// leasehold/detail/redis_executor.hpp — the Redis executor proper, on hiredis: it runs the
// core's requests verbatim on a commands connection and a subscriber connection and hands back
// what Redis said, unread (redis_executor.hpp describes both; leasehold::RedisExecutor is its public face).
// Connections are opened by RedisConnector (redis_connect.hpp).
#pragma once

#include <leasehold.hpp>
#include <leasehold/detail/hiredis.hpp>
#include <leasehold/detail/sigpipe.hpp>
#include <leasehold/redis_connect.hpp>

#include <hiredis/hiredis.h>
#include <poll.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <optional>

namespace leasehold::detail {

class RedisRunner : public Executor {
  using Ctx = RedisCtx;
  using Reply = RedisReply;

 public:
  RedisRunner(const RedisRunner&) = delete;
  RedisRunner& operator=(const RedisRunner&) = delete;

  void start(Sink sink) override {
    sink_ = std::move(sink);
    commands_ = std::thread([this] { command_loop(); });
    subscriber_ = std::thread([this] { subscriber_loop(); });
  }
  void execute(IoRequest r) override { queue(std::move(r), false); }
  // A commands request waits for run_pending() on the caller's thread (no hop to ours).
  void execute_for_caller(IoRequest r) override { queue(std::move(r), true); }
  void run_pending() noexcept override { run_pending_until(Clock::time_point::max()); }
  // The pipeline runs on the calling thread until `deadline`; the replies still due then are
  // read by the commands thread, which answers them as it answers its own. While another
  // thread's batch holds the connection, this thread waits for it (the answer cannot come
  // sooner): the thread whose batch just ended may still be feeding the reply that led to this
  // request. Only when the deadline passes first is the queue handed to the commands thread.
  void run_pending_until(Clock::time_point deadline) noexcept override {
    Pipeline p;
    {
      std::unique_lock l(mu_);
      const auto ready = [&] { return closed_ || cmd_q_.empty() || !cmd_busy_; };
      if (deadline == Clock::time_point::max()) {
        free_cv_.wait(l, ready);
      } else {
        free_cv_.wait_until(l, deadline, ready);
      }
      if (closed_ || cmd_q_.empty()) return;  // taken with another batch: answered there
      if (cmd_busy_) {
        cmd_wanted_ = true;  // the commands thread runs it after the running batch
        return work_cv_.notify_one();
      }
      cmd_busy_ = true;
      cmd_wanted_ = false;
      p.batch.swap(cmd_q_);
    }
    free_cv_.notify_all();  // other callers whose requests this batch took
    bool finished = true;
    {
      const SigpipeScope quiet;
      finished = run_batch(p, deadline);
    }
    bool work = false;
    {
      std::lock_guard g(mu_);
      if (finished || closed_) {
        cmd_busy_ = false;
      } else {
        handoff_ = std::move(p);  // cmd_busy_ (cmd_) passes to the commands thread with it
      }
      work = handoff_ || (cmd_wanted_ && !cmd_q_.empty());
    }
    // Only when it has work: waking the commands thread for nothing costs two context switches.
    if (work) work_cv_.notify_one();
    free_cv_.notify_all();  // a caller or close() may wait for cmd_
  }
  // Unblocks an in-flight command (shutdown of its socket) and joins both threads.
  void close() {
    {
      std::unique_lock l(mu_);
      if (closed_) return;
      closed_ = true;
      if (cmd_fd_ >= 0) ::shutdown(cmd_fd_, SHUT_RDWR);
    }
    work_cv_.notify_all();
    free_cv_.notify_all();
    wake();
    if (commands_.joinable()) commands_.join();
    if (subscriber_.joinable()) subscriber_.join();
    std::unique_lock l(mu_);
    if (handoff_) handoff_.reset(), cmd_busy_ = false;  // left unanswered, as in-flight requests are
    free_cv_.wait(l, [&] { return !cmd_busy_; });  // an application thread's batch (unblocked above)
    cmd_.reset();
  }

 protected:
  explicit RedisRunner(RedisOptions options) : conn_(std::move(options)) {
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) throw std::runtime_error("eventfd failed");
  }
  ~RedisRunner() override {
    close();
    ::close(wake_fd_);
  }
  [[nodiscard]] const RedisConnector& connector() const noexcept { return conn_; }
  [[nodiscard]] std::uint64_t messages_received() const noexcept { return messages_.load(); }

 private:
  void wake() const noexcept { [[maybe_unused]] auto n = ::write(wake_fd_, "\1\0\0\0\0\0\0\0", 8); }
  void log(const std::string& m) const noexcept { conn_.log(m); }
  bool sentinel() const noexcept { return conn_.sentinel(); }

  void failed(std::uint64_t id, std::string why) { sink_(IoFailed{id, LH_FAILURE_TRANSPORT, std::move(why)}); }
  void queue(IoRequest r, bool caller_runs) {
    if (r.kind != LH_IO_COMMAND) {
      failed(r.id, "not a Redis command");  // never from the core's Redis protocol
      return;
    }
    const bool sub = r.connection == LH_CONNECTION_NOTIFY;
    {
      std::lock_guard g(mu_);
      if (closed_) return;
      (sub ? sub_q_ : cmd_q_).push_back(std::move(r));
      if (!sub && caller_runs) return;  // run_pending() follows
      if (!sub) cmd_wanted_ = true;
    }
    sub ? wake() : work_cv_.notify_one();
  }

  void command_loop() {
    block_sigpipe_in_this_thread();
    for (;;) {
      Pipeline p;
      {
        std::unique_lock l(mu_);
        // Requests queued for a caller (execute_for_caller) are left to it: it runs them next.
        work_cv_.wait(l, [&] { return closed_ || handoff_ || (cmd_wanted_ && !cmd_q_.empty() && !cmd_busy_); });
        if (closed_) return;
        if (handoff_) {
          p = std::move(*handoff_);  // sent by an application thread whose wait ended
          handoff_.reset();
        } else {
          cmd_busy_ = true;
          cmd_wanted_ = false;
          p.batch.swap(cmd_q_);
        }
      }
      free_cv_.notify_all();  // callers whose requests it took stop waiting for cmd_
      run_batch(p, std::nullopt);
      std::lock_guard g(mu_);
      cmd_busy_ = false;
      free_cv_.notify_all();  // close(), or a caller, may wait for the connection
    }
  }
  // A batch of commands requests and how far it went on cmd_.
  struct Pipeline {
    std::deque<IoRequest> batch;
    std::size_t sent = 0, done = 0;  // written / answered
    bool demoted = false;            // a READONLY reply came
  };
  // Sends the batch as one pipeline on cmd_ (unless sent already) and hands back the replies
  // (the caller set cmd_busy_: cmd_ is this thread's until it clears it). With a deadline (an
  // application thread's), false when it passed with replies still due: p says how far it went,
  // for the commands thread to finish.
  bool run_batch(Pipeline& p, std::optional<Clock::time_point> deadline) {
    Ctx& c = cmd_;
    std::string why;
    if (p.sent == 0) {
      if (!c) {
        std::string addr;
        if ((c = conn_.connect(&addr))) set_cmd_fd(c->fd), found_master(addr);
      }
      while (c && p.sent < p.batch.size() && redis_append(c.get(), p.batch[p.sent].argv) == REDIS_OK) ++p.sent;
      if (c && deadline) {
        // Written now: the replies are then waited for with poll().
        int written = 0;
        while (redisBufferWrite(c.get(), &written) == REDIS_OK && !written) {}
        if (!written) p.sent = 0;
      }
    }
    while (c && p.done < p.sent) {
      void* raw = nullptr;
      if (deadline) {
        const int got = read_reply(c.get(), *deadline, &raw, why);
        if (got == 0) return false;
        if (got < 0) break;
      } else if (redisGetReply(c.get(), &raw) != REDIS_OK || raw == nullptr) {
        break;
      }
      Reply r(static_cast<redisReply*>(raw));
      p.demoted = p.demoted ||
                  (r->type == REDIS_REPLY_ERROR && std::string_view(r->str, r->len).starts_with("READONLY"));
      IoReply in{p.batch[p.done].id, {}, {}};
      redis_flatten(r.get(), in);
      sink_(std::move(in));
      ++p.done;
    }
    if (p.demoted && sentinel() && p.done == p.batch.size()) {
      // The master became a replica: ask the sentinels again on the next request.
      log("commands connection: the master was demoted");
      set_cmd_fd(-1);
      c.reset();
      return true;
    }
    if (p.done == p.batch.size()) return true;
    if (c && c->err) why = c->errstr;
    why = "commands connection: " + (why.empty() ? std::string("broken") : why);
    if (c) log(why);
    for (std::size_t i = p.done; i < p.batch.size(); ++i) failed(p.batch[i].id, why);
    set_cmd_fd(-1);
    c.reset();
    return true;
  }
  // One reply from c, its socket polled until `deadline`, each wait at most command_timeout (as
  // hiredis bounds a blocking read): 1 with *raw set, 0 when the deadline passed first, -1 when
  // the connection failed or timed out (why, unless c->err says).
  int read_reply(redisContext* c, Clock::time_point deadline, void** raw, std::string& why) const {
    const auto limit = conn_.options().command_timeout;
    for (;;) {
      if (redisGetReplyFromReader(c, raw) != REDIS_OK) return -1;
      if (*raw != nullptr) return 1;
      const auto now = Clock::now();
      if (now >= deadline) return 0;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::min(now, deadline));
      const bool capped = limit.count() > 0 && left > limit;
      const auto wait = capped ? limit : std::min<std::chrono::milliseconds>(left, std::chrono::hours(24));
      pollfd fd{c->fd, POLLIN, 0};
      const int n = ::poll(&fd, 1, static_cast<int>(wait.count()));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return why = "poll failed", -1;
      if (n == 0) {
        if (capped) return why = "timed out", -1;
        continue;  // the deadline, checked above
      }
      if (redisBufferRead(c) != REDIS_OK) return -1;
    }
  }
  void set_cmd_fd(int fd) { std::lock_guard g(mu_); cmd_fd_ = fd; }
  // (Sentinel) A connection reached the master at addr; the subscriber leaves an older one.
  void found_master(const std::string& addr) {
    if (conn_.reached(addr)) wake();
  }

  void subscriber_loop() {
    block_sigpipe_in_this_thread();
    Ctx s;
    std::string at;                  // where s is connected
    std::set<std::string> channels;  // subscribed (or asked for) on s: reported lost with it
    auto lose = [&] {
      if (s) log(std::string("subscriber connection: ") + (s->err ? s->errstr : "broken"));
      s.reset();
      for (const auto& ch : channels) sink_(IoConnection{LH_CONNECTION_NOTIFY, LH_CONNECTION_UNSUBSCRIBED, ch});
      channels.clear();
    };
    for (;;) {
      std::deque<IoRequest> batch;
      {
        std::lock_guard g(mu_);
        if (closed_) return;
        batch.swap(sub_q_);
      }
      for (auto& r : batch) {
        if (!s && (s = conn_.connect(&at))) found_master(at);
        int written = 0;
        if (s && redis_append(s.get(), r.argv) == REDIS_OK)
          while (redisBufferWrite(s.get(), &written) == REDIS_OK && !written) {}
        if (!written) {
          failed(r.id, "subscriber connection: broken");
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
        if (const auto now = conn_.master(); !now.empty() && now != at) {
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
          sink_(IoMessage{std::move(ch), std::string(p->str, p->len)});
        } else if (kind == "subscribe" || kind == "unsubscribe") {
          if (kind[0] == 'u') channels.erase(ch);
          const std::uint32_t event = kind[0] == 's' ? LH_CONNECTION_SUBSCRIBED : LH_CONNECTION_UNSUBSCRIBED;
          sink_(IoConnection{LH_CONNECTION_NOTIFY, event, std::move(ch)});
        }
      }
      if (s->err) lose();
    }
  }

  RedisConnector conn_;  // the options, and how a connection is opened
  Sink sink_;
  int wake_fd_ = -1;
  std::mutex mu_;
  std::condition_variable work_cv_;  // the commands thread waits here for requests or a handoff
  std::condition_variable free_cv_;  // callers and close() wait here for cmd_
  std::deque<IoRequest> cmd_q_, sub_q_;  // guarded by mu_
  int cmd_fd_ = -1;                    // guarded by mu_: shut down by close()
  bool cmd_busy_ = false;              // guarded by mu_: a thread is running a batch on cmd_
  bool cmd_wanted_ = false;            // guarded by mu_: cmd_q_ is the commands thread's to run
  std::optional<Pipeline> handoff_;    // guarded by mu_: a batch for the commands thread to finish
  Ctx cmd_;                            // the commands connection: its thread's while cmd_busy_
  bool closed_ = false;                // guarded by mu_
  std::atomic<std::uint64_t> messages_{0};
  std::thread commands_, subscriber_;
};

}  // namespace leasehold::detail
