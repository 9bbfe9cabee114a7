// Rough numbers for the README (not a test; no assertions on time anywhere in the suite).
//   cmake -DLEASEHOLD_BUILD_BENCH=ON … && ./leasehold_bench [redis-port [iterations [handoffs]]]
// With a port, also the byte path (LockClient + RedisStreamExecutor) against a raw-socket floor
// replaying the core's recorded requests, beside the hiredis executor (stream_compare), and the
// handoff latency with 8 waiters beside the protocol's own steps on plain sockets
// (handoff_compare; 400 handoffs each unless given, 0 skips them).
// Measures, on one LockClient: uncontended acquire+release round trips (memory service and,
// with a port, Redis beside a raw hiredis SET NX PX / DEL loop and the core's own requests run
// by one thread, interleaved, with the ratios), and how late loss detection fires relative to
// valid_until when the transport hangs.
#include <leasehold.hpp>
#include <leasehold/memory_executor.hpp>
#include <leasehold/redis_stream_executor.hpp>
#ifdef LEASEHOLD_BENCH_REDIS
#include <leasehold/redis_executor.hpp>
#endif

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

static double us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// How often this process's threads blocked so far (voluntary context switches): a thread hop
// per request shows as two more per request.
static long blocked() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_nvcsw;
}

// acquire + release (waiting for the service's answer), sequential; returns ops/s.
static double round_trips(const char* label, std::shared_ptr<leasehold::Executor> t, int n) {
  leasehold::ClientOptions o;
  o.log = [](std::string_view) {};
  leasehold::LockClient client(std::move(t), o);
  std::vector<double> lat, rel;
  lat.reserve(static_cast<std::size_t>(n));
  rel.reserve(static_cast<std::size_t>(n));
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    auto lease = client.acquire("bench-" + std::to_string(i % 16), 10s);
    lat.push_back(us(Clock::now() - t0));
    if (!lease) {
      std::printf("%s: acquire failed\n", label);
      return 0;
    }
    const auto t1 = Clock::now();
    lease->release();
    rel.push_back(us(Clock::now() - t1));
  }
  const double total = std::chrono::duration<double>(Clock::now() - start).count();
  std::sort(lat.begin(), lat.end());
  std::sort(rel.begin(), rel.end());
  std::printf("%-8s acquire+release: %d in %.2fs = %.0f/s; acquire p50 %.0fus p99 %.0fus; release p50 %.0fus p99 %.0fus\n",
              label, n, total, n / total, lat[lat.size() / 2], lat[lat.size() * 99 / 100], rel[rel.size() / 2],
              rel[rel.size() * 99 / 100]);
  return n / total;
}

#ifdef LEASEHOLD_BENCH_REDIS
// Uncontended lock+unlock on one Redis three ways, in interleaved blocks so that the load of a
// shared machine hits all three alike:
//   raw hiredis — SET key token NX PX / DEL on one blocking connection (no fence, no queue);
//   core, one thread — the core's own requests (the two scripts) run on one blocking hiredis
//                      connection by the calling thread: what the protocol costs without a host;
//   LockClient — LockClient + RedisExecutor, the binding as an application uses it.
struct RawLoop {
  redisContext* c = nullptr;
  explicit RawLoop(int port) : c(redisConnect("127.0.0.1", port)) {}
  ~RawLoop() {
    if (c) redisFree(c);
  }
  bool ok() const { return c != nullptr && c->err == 0; }
  bool cycle(int i) {
    const std::string key = "bench-raw-" + std::to_string(i % 16);
    auto* r = static_cast<redisReply*>(redisCommand(c, "SET %s tok NX PX 10000", key.c_str()));
    const bool got = r && r->type == REDIS_REPLY_STATUS;
    if (r) freeReplyObject(r);
    r = static_cast<redisReply*>(redisCommand(c, "DEL %s", key.c_str()));
    if (r) freeReplyObject(r);
    return got && r;
  }
};

// The core driven by the calling thread over one blocking connection (and one for pub/sub).
struct CoreLoop {
  leasehold::Core core;
  redisContext* c;
  redisContext* sub;
  CoreLoop(int port, leasehold::RedisExecutor& factory)
      : core(leasehold::Config::defaults(), factory.backend_options()),
        c(redisConnect("127.0.0.1", port)),
        sub(redisConnect("127.0.0.1", port)) {}
  ~CoreLoop() {
    if (c) redisFree(c);
    if (sub) redisFree(sub);
  }
  bool ok() const { return c && !c->err && sub && !sub->err; }
  // Runs every queued request; false on a connection failure.
  bool run() {
    while (auto q = core.io_poll()) {
      std::vector<const char*> argv;
      std::vector<std::size_t> lens;
      for (const auto& a : q->argv) argv.push_back(a.data()), lens.push_back(a.size());
      redisContext* on = q->connection == LH_CONNECTION_NOTIFY ? sub : c;
      auto* r = static_cast<redisReply*>(redisCommandArgv(on, int(argv.size()), argv.data(), lens.data()));
      if (!r) return false;
      if (on == sub) {  // the confirmation
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 3)
          core.io_connection(leasehold::now_ns(), LH_CONNECTION_NOTIFY,
                             std::string_view(r->element[0]->str, r->element[0]->len) == "subscribe"
                                 ? LH_CONNECTION_SUBSCRIBED
                                 : LH_CONNECTION_UNSUBSCRIBED,
                             std::string_view(r->element[1]->str, r->element[1]->len));
      } else {
        leasehold::IoReply in{q->id, {}, {}};
        leasehold::detail::redis_flatten(r, in);
        core.answer(leasehold::now_ns(), in);
      }
      freeReplyObject(r);
    }
    return true;
  }
  bool cycle(int i) {
    const auto id = core.acquire(leasehold::now_ns(), "bench-core-" + std::to_string(i % 16), 10s);
    if (!run()) return false;
    bool held = false;
    while (auto o = core.poll_event()) held = held || std::holds_alternative<leasehold::AcquiredEvent>(*o);
    if (!held) return false;
    core.release_reported(leasehold::now_ns(), id);
    if (!run()) return false;
    bool confirmed = false;
    while (auto o = core.poll_event())
      if (auto* e = std::get_if<leasehold::ReleaseOutcomeEvent>(&*o)) confirmed = e->reply == leasehold::ReleaseReply::Confirmed;
    return confirmed;
  }
};

static void redis_compare(int port, int n) {
  RawLoop raw(port);
  leasehold::RedisOptions ro;
  ro.port = port;
  leasehold::RedisExecutor factory(ro);
  CoreLoop direct(port, factory);
  if (!raw.ok() || !direct.ok()) {
    std::printf("redis: cannot connect\n");
    return;
  }
  leasehold::ClientOptions o;
  o.log = [](std::string_view) {};
  leasehold::LockClient client(std::make_shared<leasehold::RedisExecutor>(ro), o);
  std::vector<double> lat;
  lat.reserve(static_cast<std::size_t>(n));
  double t_raw = 0, t_core = 0, t_client = 0;
  const int block = 100;
  for (int done = 0; done < n; done += block) {
    const int m = std::min(block, n - done);
    auto t0 = Clock::now();
    for (int i = done; i < done + m; ++i)
      if (!raw.cycle(i)) return void(std::printf("raw hiredis: failed\n"));
    auto t1 = Clock::now();
    for (int i = done; i < done + m; ++i)
      if (!direct.cycle(i)) return void(std::printf("core, one thread: failed\n"));
    auto t2 = Clock::now();
    for (int i = done; i < done + m; ++i) {
      const auto a = Clock::now();
      auto lease = client.acquire("bench-" + std::to_string(i % 16), 10s);
      lat.push_back(us(Clock::now() - a));
      if (!lease || lease->release() != leasehold::ReleaseOutcome::Released)
        return void(std::printf("LockClient: failed\n"));
    }
    auto t3 = Clock::now();
    t_raw += std::chrono::duration<double>(t1 - t0).count();
    t_core += std::chrono::duration<double>(t2 - t1).count();
    t_client += std::chrono::duration<double>(t3 - t2).count();
  }
  std::sort(lat.begin(), lat.end());
  std::printf("redis, %d lock+unlock each, interleaved blocks of %d:\n", n, block);
  std::printf("  raw hiredis SET NX PX + DEL   %8.0f/s\n", n / t_raw);
  std::printf("  core, one thread (2 scripts)  %8.0f/s  %.2fx raw\n", n / t_core, t_raw / t_core);
  std::printf("  LockClient + RedisExecutor   %8.0f/s  %.2fx raw, %.2fx core; acquire p50 %.0fus p99 %.0fus\n",
              n / t_client, t_raw / t_client, t_core / t_client, lat[lat.size() / 2], lat[lat.size() * 99 / 100]);
}
#endif

// The byte path (RedisStreamExecutor) against a raw-socket floor: the requests the core sends for
// one uncontended acquire+release, recorded once from a stream client, replayed pre-encoded on a
// plain blocking socket in a bare loop (each write, then a read until as many replies as it had
// commands). Interleaved blocks beside the hiredis executor when it is built in.
class Recorder final : public leasehold::Executor {
 public:
  explicit Recorder(std::shared_ptr<leasehold::Executor> in) : in_(std::move(in)) {}
  std::vector<std::string> writes;
  std::atomic<bool> on{false};
  lh_backend_options backend_options() const override { return in_->backend_options(); }
  void start(Sink s) override { in_->start(std::move(s)); }
  void execute(leasehold::IoRequest r) override { in_->execute(keep(std::move(r))); }
  void execute_for_caller(leasehold::IoRequest r) override { in_->execute_for_caller(keep(std::move(r))); }
  void run_pending() noexcept override { in_->run_pending(); }
  void run_pending_until(Clock::time_point d) noexcept override { in_->run_pending_until(d); }
  void close() override { in_->close(); }

 private:
  leasehold::IoRequest keep(leasehold::IoRequest r) {
    if (on && r.kind == LH_IO_WRITE) writes.push_back(r.data);
    return r;
  }
  std::shared_ptr<leasehold::Executor> in_;
};

// End of the RESP value at b[i..], or npos while incomplete (the floor's reply counter only).
static std::size_t value_end(const std::string& b, std::size_t i) {
  const auto nl = i < b.size() ? b.find('\n', i) : std::string::npos;
  if (nl == std::string::npos) return nl;
  const long len = std::atol(b.c_str() + i + 1);
  const std::size_t line = nl + 1;
  switch (b[i]) {
    case '$': case '=': case '!':
      return len < 0 ? line : line + std::size_t(len) + 2 <= b.size() ? line + std::size_t(len) + 2 : std::string::npos;
    case '*': case '~': case '>': case '%': {
      std::size_t j = line;
      for (long k = b[i] == '%' ? 2 * len : len; k > 0 && j != std::string::npos; --k) j = value_end(b, j);
      return j;
    }
    default:
      return line;
  }
}
static int count_values(const std::string& b) {
  int c = 0;
  for (std::size_t i = 0; i < b.size() && (i = value_end(b, i)) != std::string::npos; ++c) {
  }
  return c;
}

struct FloorLoop {
  int fd = -1;
  std::vector<std::pair<std::string, int>> writes;  // bytes, replies to wait for
  std::string in;
  explicit FloorLoop(int port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int one = 1;
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ::close(fd), fd = -1;
    if (fd >= 0) ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~FloorLoop() {
    if (fd >= 0) ::close(fd);
  }
  bool send(const std::string& w, int replies) {
    if (::write(fd, w.data(), w.size()) != static_cast<ssize_t>(w.size())) return false;
    in.clear();
    char buf[4096];
    while (count_values(in) < replies) {
      const auto n = ::read(fd, buf, sizeof buf);
      if (n <= 0) return false;
      in.append(buf, static_cast<std::size_t>(n));
    }
    return true;
  }
  bool cycle() {
    for (const auto& [w, r] : writes)
      if (!send(w, r)) return false;
    return true;
  }
};

static void stream_compare(int port, int n) {
  leasehold::ClientOptions o;
  o.log = [](std::string_view) {};
  const std::string url = "redis://127.0.0.1:" + std::to_string(port);
  auto rec = std::make_shared<Recorder>(std::make_shared<leasehold::RedisStreamExecutor>(url));
  FloorLoop floor(port);
  {
    leasehold::LockClient recording(rec, o);
    for (int i = 0; i < 20; ++i) {  // connected, subscribed, scripts loaded
      auto l = recording.acquire("bench-floor", 10s);
      if (!l) return void(std::printf("stream: acquire failed: %s\n", recording.last_backend_error().c_str()));
      l->release();
    }
    rec->on = true;
    auto l = recording.acquire("bench-floor", 10s);
    if (l) l->release();
    rec->on = false;
  }
  for (const auto& w : rec->writes) floor.writes.emplace_back(w, count_values(w));
  if (floor.fd < 0 || floor.writes.empty() || !floor.send("*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n", 1))
    return void(std::printf("floor: cannot connect or nothing recorded\n"));
  auto exec = std::make_shared<leasehold::RedisStreamExecutor>(url);
  leasehold::LockClient stream(exec, o);
#ifdef LEASEHOLD_BENCH_REDIS
  leasehold::RedisOptions ro;
  ro.port = port;
  leasehold::LockClient peer(std::make_shared<leasehold::RedisExecutor>(ro), o);
#endif
  auto lock_unlock = [](leasehold::LockClient& c, const char* name) {
    auto l = c.acquire(name, 10s);
    return l && l->release() == leasehold::ReleaseOutcome::Released;
  };
  for (int i = 0; i < 200; ++i) {  // warm: connections, scripts
    floor.cycle();
    lock_unlock(stream, "bench-stream");
#ifdef LEASEHOLD_BENCH_REDIS
    lock_unlock(peer, "bench-peer");
#endif
  }
  const int block = 500;
  std::vector<double> t_floor, t_stream, t_peer;
  long b_floor = 0, b_stream = 0, b_peer = 0;
  for (int done = 0; done < n; done += block) {
    const int m = std::min(block, n - done);
    auto t0 = Clock::now();
    long b0 = blocked();
    for (int i = 0; i < m; ++i)
      if (!floor.cycle()) return void(std::printf("floor: failed\n"));
    auto t1 = Clock::now();
    long b1 = blocked();
    for (int i = 0; i < m; ++i)
      if (!lock_unlock(stream, "bench-stream")) return void(std::printf("stream: failed\n"));
    auto t2 = Clock::now();
    long b2 = blocked();
#ifdef LEASEHOLD_BENCH_REDIS
    for (int i = 0; i < m; ++i)
      if (!lock_unlock(peer, "bench-peer")) return void(std::printf("hiredis: failed\n"));
#endif
    auto t3 = Clock::now();
    long b3 = blocked();
    b_floor += b1 - b0, b_stream += b2 - b1, b_peer += b3 - b2;
    t_floor.push_back(us(t1 - t0) / m);
    t_stream.push_back(us(t2 - t1) / m);
    t_peer.push_back(us(t3 - t2) / m);
  }
  for (auto* v : {&t_floor, &t_stream, &t_peer}) std::sort(v->begin(), v->end());
  int commands = 0;
  for (const auto& w : floor.writes) commands += w.second;
  std::printf("redis stream, %d acquire+release each, interleaved blocks of %d (%zu writes, %d commands recorded):\n", n,
              block, floor.writes.size(), commands);
  std::printf("  floor: recorded requests, raw socket  min %6.1fus  median %6.1fus  blocking waits per cycle %.1f\n",
              t_floor.front(), t_floor[t_floor.size() / 2], static_cast<double>(b_floor) / n);
  std::printf("  LockClient + RedisStreamExecutor     min %6.1fus  median %6.1fus  floor/stream %.2fx (min) %.2fx (median)"
              "  blocking waits per cycle %.1f\n",
              t_stream.front(), t_stream[t_stream.size() / 2], t_floor.front() / t_stream.front(),
              t_floor[t_floor.size() / 2] / t_stream[t_stream.size() / 2], static_cast<double>(b_stream) / n);
#ifdef LEASEHOLD_BENCH_REDIS
  std::printf("  LockClient + RedisExecutor (hiredis) min %6.1fus  median %6.1fus  floor/hiredis %.2fx (min)"
              "  blocking waits per cycle %.1f\n",
              t_peer.front(), t_peer[t_peer.size() / 2], t_floor.front() / t_peer.front(), static_cast<double>(b_peer) / n);
#endif
  const auto st = exec->stats();
  std::printf("  stream reads on the application's thread: %llu, on the reader thread: %llu\n",
              static_cast<unsigned long long>(st.caller_reads), static_cast<unsigned long long>(st.reader_reads));
}

// Handoff latency on one name: a holder's release() call → the next waiter's acquire()
// returning, with 9 threads (so 8 wait at every handoff), each holding 10 ms and queueing again
// only once another has held the lock. Two kinds, in alternating rounds: a LockClient +
// RedisStreamExecutor per thread, and the floor — the protocol's own steps on plain sockets,
// per thread a commands socket and a subscriber socket on a wake channel of its own: the ACQUIRE
// and RELEASE script calls recorded once from a real client for the name (the core's bytes,
// through Recorder), each thread putting in its own token and entry (docs/redis-protocol.md:
// ARGV of ACQUIRE [token, ttl_ms, entry, keep_ms, name, queued], of RELEASE [token, name,
// max_age_ms]). A refused floor waiter waits for its "w TOKEN NAME" message, or the holder's
// pttl, then asks again with queued = 1.
struct Locker {
  virtual ~Locker() = default;
  virtual bool lock() = 0;  // blocks until granted; false on a failure
  virtual bool unlock() = 0;
};

struct ClientLocker final : Locker {
  leasehold::LockClient client;
  std::string name;
  std::optional<leasehold::Lease> lease;
  ClientLocker(const std::string& url, std::string n, const leasehold::ClientOptions& o)
      : client(std::make_shared<leasehold::RedisStreamExecutor>(url), o), name(std::move(n)) {}
  bool lock() override {
    leasehold::AcquireOptions o;
    o.wait = 30s;
    lease = client.acquire(name, 10s, std::move(o));
    if (!lease) std::printf("handoff: acquire failed: %s\n", client.last_backend_error().c_str());
    return lease.has_value();
  }
  bool unlock() override {
    const bool ok = lease && lease->release() == leasehold::ReleaseOutcome::Released;
    lease.reset();
    return ok;
  }
};

// The commands one recorded write holds (RESP arrays of bulk strings).
static std::vector<std::vector<std::string>> commands_of(const std::string& w) {
  std::vector<std::vector<std::string>> out;
  std::size_t i = 0;
  while (i < w.size() && w[i] == '*') {
    std::size_t nl = w.find("\r\n", i);
    const long n = std::atol(w.c_str() + i + 1);
    std::vector<std::string> argv;
    for (long k = 0; k < n && nl != std::string::npos && w[nl + 2] == '$'; ++k) {
      const auto len = static_cast<std::size_t>(std::atol(w.c_str() + nl + 3));
      const auto at = w.find("\r\n", nl + 2) + 2;
      argv.push_back(w.substr(at, len));
      nl = at + len;
    }
    if (argv.size() != static_cast<std::size_t>(n)) break;
    out.push_back(std::move(argv));
    i = nl + 2;
  }
  return out;
}

static std::string resp(const std::vector<std::string>& argv) {
  std::string out = "*" + std::to_string(argv.size()) + "\r\n";
  for (const auto& a : argv) out += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
  return out;
}

static std::string hex32(std::mt19937_64& rng) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

struct FloorLocker final : Locker {
  FloorLoop cmd, sub;  // plain blocking sockets (RESP2)
  std::string first, again, release_call, wake, pending;
  long long pttl_ms = 0;
  FloorLocker(int port, std::vector<std::string> acquire, std::vector<std::string> release, std::mt19937_64& rng)
      : cmd(port), sub(port) {
    const auto token = hex32(rng), channel = "lh:wake:" + hex32(rng);
    acquire[6] = token;
    acquire[8] = channel + "#" + token;
    acquire[11] = "0";
    first = resp(acquire);
    acquire[11] = "1";
    again = resp(acquire);
    release[5] = token;
    release_call = resp(release);
    wake = "w " + token + " ";
    if (!sub.send(resp({"SUBSCRIBE", channel}), 1)) sub.fd = -1;  // its confirmation
  }
  bool ok() const { return cmd.fd >= 0 && sub.fd >= 0; }
  // The integers of a reply (an integer or an array of them); empty on an error reply.
  std::vector<long long> call(const std::string& payload) {
    std::vector<long long> v;
    if (!cmd.send(payload, 1)) return v;
    if (cmd.in[0] == '-') {
      std::printf("floor: %s", cmd.in.c_str());
      return v;
    }
    for (std::size_t i = 0; (i = cmd.in.find(':', i)) != std::string::npos; ++i) v.push_back(std::atoll(cmd.in.c_str() + i + 1));
    return v;
  }
  // Its wake-up message, or false once `ms` pass without one.
  bool woken(long long ms) {
    const auto end = Clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
      for (std::size_t e; !pending.empty() && (e = value_end(pending, 0)) != std::string::npos;) {
        const bool mine = pending.substr(0, e).find(wake) != std::string::npos;
        pending.erase(0, e);
        if (mine) return true;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{sub.fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buf[4096];
      const auto n = ::read(sub.fd, buf, sizeof buf);
      if (n <= 0) return false;
      pending.append(buf, static_cast<std::size_t>(n));
    }
  }
  bool lock() override {
    const std::string* payload = &first;
    for (;;) {
      const auto r = call(*payload);
      if (r.size() != 3) return false;
      if (r[0] == 1) return true;
      payload = &again;
      woken(std::max(r[1], 1LL));
    }
  }
  bool unlock() override {
    const auto r = call(release_call);
    if (r.size() != 1 || r[0] != 1) return std::printf("floor: RELEASE found another owner\n"), false;
    return true;
  }
};

// One round: `handoffs` samples (µs) appended; false on a failure.
static bool handoff_round(std::vector<std::unique_ptr<Locker>>& lockers, int handoffs, std::vector<double>& samples) {
  std::mutex mu;
  std::condition_variable cv;
  long gen = 0;
  int taken = 0;
  bool done = false, failed = false;
  std::optional<Clock::time_point> last_release;
  std::vector<std::thread> threads;
  for (auto& l : lockers) {
    threads.emplace_back([&, lk = l.get()] {
      const auto fail = [&] {
        std::lock_guard g(mu);
        failed = done = true;
        cv.notify_all();
      };
      for (;;) {
        if (!lk->lock()) return fail();
        const auto now = Clock::now();
        long my;
        bool stop;
        {
          std::lock_guard g(mu);
          my = ++gen;
          cv.notify_all();
          if (last_release && !done) {
            samples.push_back(us(now - *last_release));
            done = ++taken >= handoffs;
          }
          stop = done;
        }
        std::this_thread::sleep_for(10ms);  // the previous holder queues again meanwhile
        {
          std::lock_guard g(mu);
          last_release = Clock::now();
        }
        if (!lk->unlock()) return fail();
        if (stop) return;
        std::unique_lock g(mu);  // queue again only once another has held it
        cv.wait(g, [&] { return gen != my || done; });
        if (done) return;
      }
    });
  }
  for (auto& t : threads) t.join();
  return !failed;
}

static void handoff_compare(int port, int handoffs) {
  constexpr int kThreads = 9, kRound = 100;
  leasehold::ClientOptions o;
  o.log = [](std::string_view) {};
  const std::string url = "redis://127.0.0.1:" + std::to_string(port);
  const std::string floor_name = "bench-handoff-floor", client_name = "bench-handoff";
  std::vector<std::string> acquire, release;
  {
    auto rec = std::make_shared<Recorder>(std::make_shared<leasehold::RedisStreamExecutor>(url));
    leasehold::LockClient recording(rec, o);
    leasehold::AcquireOptions w;
    w.wait = 1s;
    for (int i = 0; i < 3; ++i) {  // connected, subscribed, scripts loaded; the last one recorded
      rec->on = i == 2;
      auto l = recording.acquire(floor_name, 10s, w);
      if (!l) return void(std::printf("handoff: recording failed: %s\n", recording.last_backend_error().c_str()));
      l->release();
    }
    rec->on = false;
    for (const auto& w : rec->writes)
      for (auto& c : commands_of(w)) {
        if (c.size() == 12 && c[0] == "EVALSHA" && c[2] == "3") acquire = c;
        if (c.size() == 8 && c[0] == "EVALSHA" && c[2] == "2") release = c;
      }
  }
  if (acquire.empty() || release.empty())
    return void(std::printf("handoff: no ACQUIRE (EVALSHA, 3 keys, 12 arguments) or RELEASE (2 keys, 8) recorded\n"));
  std::mt19937_64 rng(std::random_device{}());
  std::vector<std::unique_ptr<Locker>> floor, clients;
  for (int i = 0; i < kThreads; ++i) {
    auto f = std::make_unique<FloorLocker>(port, acquire, release, rng);
    if (!f->ok()) return void(std::printf("handoff: floor cannot connect\n"));
    floor.push_back(std::move(f));
    clients.push_back(std::make_unique<ClientLocker>(url, client_name, o));
  }
  std::vector<double> t_floor, t_client;
  for (int done = 0; done < handoffs; done += kRound) {
    const int m = std::min(kRound, handoffs - done);
    if (!handoff_round(floor, m, t_floor)) return void(std::printf("handoff: floor failed\n"));
    if (!handoff_round(clients, m, t_client)) return void(std::printf("handoff: LockClient failed\n"));
  }
  std::sort(t_floor.begin(), t_floor.end());
  std::sort(t_client.begin(), t_client.end());
  const auto pct = [](const std::vector<double>& v, double p) { return v[static_cast<std::size_t>(p * double(v.size() - 1))] / 1000; };
  std::printf("redis handoff, %d waiters (%d threads, hold 10 ms), %d handoffs each in alternating rounds of %d:\n",
              kThreads - 1, kThreads, handoffs, kRound);
  std::printf("  floor: the protocol's steps on plain sockets  p50 %.2f ms  p99 %.2f ms\n", pct(t_floor, 0.5),
              pct(t_floor, 0.99));
  std::printf("  LockClient + RedisStreamExecutor             p50 %.2f ms  p99 %.2f ms  (%.2fx / %.2fx the floor)\n",
              pct(t_client, 0.5), pct(t_client, 0.99), pct(t_client, 0.5) / pct(t_floor, 0.5),
              pct(t_client, 0.99) / pct(t_floor, 0.99));
}

static void loss_lag() {
  auto service = std::make_shared<leasehold::MemoryService>();
  std::vector<double> lags;
  int expired = 0, budget = 0;
  for (int i = 0; i < 5; ++i) {
    auto t = std::make_shared<leasehold::MemoryExecutor>(service);
    leasehold::ClientOptions o;
    o.log = [](std::string_view) {};
    o.close_timeout = 100ms;
    leasehold::LockClient client(t, o);
    auto lease = client.acquire("lag-" + std::to_string(i), 300ms);
    if (!lease) return;
    t->set_hang(true);
    while (!lease->stop_token().stop_requested()) std::this_thread::sleep_for(100us);
    const auto seen = Clock::now();
    lags.push_back(us(seen - lease->valid_until()));
    (lease->lost_reason() == leasehold::LostReason::FailBudget ? budget : expired)++;
    t->set_hang(false);
  }
  std::sort(lags.begin(), lags.end());
  // FailBudget ends a lease shortly before valid_until (a renewal retry would not fit in what
  // is left); Expired ends it at valid_until: a negative lag is the former, not a clock error.
  std::printf("loss detection with a hung transport (ttl 300ms): stop_token fired %.0f..%.0fus after valid_until "
              "(%d Expired, %d FailBudget)\n",
              lags.front(), lags.back(), expired, budget);
}

int main(int argc, char** argv) {
  round_trips("memory", std::make_shared<leasehold::MemoryExecutor>(std::make_shared<leasehold::MemoryService>()),
              20000);
  if (argc > 1) {
    const int port = std::atoi(argv[1]);
    const int n = argc > 2 ? std::atoi(argv[2]) : 5000;
    const int handoffs = argc > 3 ? std::atoi(argv[3]) : 400;
    if (port <= 0 || port > 65535 || n <= 0 || handoffs < 0) {
      std::fprintf(stderr, "usage: leasehold_bench [redis-port [iterations (> 0) [handoffs (0 skips them)]]]\n");
      return 2;
    }
#ifdef LEASEHOLD_BENCH_REDIS
    redis_compare(port, n);
#endif
    stream_compare(port, n);
    if (handoffs > 0) handoff_compare(port, handoffs);
  }
  loss_lag();
  return 0;
}
