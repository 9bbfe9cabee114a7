// Rough numbers for the README (not a test; no assertions on time anywhere in the suite).
//   cmake -DLEASEHOLD_BUILD_BENCH=ON … && ./leasehold_bench [redis-port [iterations]]
// Measures, on one LockClient: uncontended acquire+release round trips (memory service and,
// with a port, Redis beside a raw hiredis SET NX PX / DEL loop and the core's own requests run
// by one thread, interleaved, with the ratios), and how late loss detection fires relative to
// valid_until when the transport hangs.
#include <leasehold.hpp>
#include <leasehold/memory_executor.hpp>
#ifdef LEASEHOLD_BENCH_REDIS
#include <leasehold/redis_executor.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

static double us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

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

static void loss_lag() {
  auto service = std::make_shared<leasehold::MemoryService>();
  std::vector<double> lags;
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
    t->set_hang(false);
  }
  std::sort(lags.begin(), lags.end());
  std::printf("loss detection with a hung transport (ttl 300ms): stop_token fired %.0f..%.0fus after valid_until\n",
              lags.front(), lags.back());
}

int main(int argc, char** argv) {
  round_trips("memory", std::make_shared<leasehold::MemoryExecutor>(std::make_shared<leasehold::MemoryService>()),
              20000);
#ifdef LEASEHOLD_BENCH_REDIS
  if (argc > 1) {
    const int port = std::atoi(argv[1]);
    const int n = argc > 2 ? std::atoi(argv[2]) : 5000;
    redis_compare(port, n);
  }
#else
  (void)argc;
  (void)argv;
#endif
  loss_lag();
  return 0;
}
