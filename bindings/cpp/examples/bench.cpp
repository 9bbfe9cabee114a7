// Rough numbers for the README (not a test; no assertions on time anywhere in the suite).
//   cmake -DLEASEHOLD_BUILD_BENCH=ON … && ./leasehold_bench [redis-port [iterations]]
// Measures, on one LockClient: uncontended acquire+release round trips (memory service and,
// with a port, Redis beside a raw hiredis SET NX PX / DEL loop on the same server, with the
// ratio), and how late loss detection fires relative to valid_until when the transport hangs.
#include <leasehold.hpp>
#include <leasehold/memory_transport.hpp>
#ifdef LEASEHOLD_BENCH_REDIS
#include <leasehold/redis_transport.hpp>
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
static double round_trips(const char* label, std::shared_ptr<leasehold::Transport> t, int n) {
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
// The floor: a plain hiredis lock loop (SET key token NX PX, DEL) on one blocking connection.
static double raw_hiredis(int port, int n) {
  redisContext* c = redisConnect("127.0.0.1", port);
  if (c == nullptr || c->err) {
    std::printf("raw hiredis: cannot connect\n");
    if (c) redisFree(c);
    return 0;
  }
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    const std::string key = "bench-raw-" + std::to_string(i % 16);
    auto* r = static_cast<redisReply*>(redisCommand(c, "SET %s tok NX PX 10000", key.c_str()));
    if (r) freeReplyObject(r);
    r = static_cast<redisReply*>(redisCommand(c, "DEL %s", key.c_str()));
    if (r) freeReplyObject(r);
  }
  const double total = std::chrono::duration<double>(Clock::now() - start).count();
  redisFree(c);
  std::printf("%-8s SET NX PX + DEL: %d in %.2fs = %.0f/s\n", "hiredis", n, total, n / total);
  return n / total;
}
#endif

static void loss_lag() {
  auto service = std::make_shared<leasehold::MemoryService>();
  std::vector<double> lags;
  for (int i = 0; i < 5; ++i) {
    auto t = std::make_shared<leasehold::MemoryTransport>(service);
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
  round_trips("memory", std::make_shared<leasehold::MemoryTransport>(std::make_shared<leasehold::MemoryService>()),
              20000);
#ifdef LEASEHOLD_BENCH_REDIS
  if (argc > 1) {
    leasehold::RedisOptions ro;
    ro.port = std::atoi(argv[1]);
    const int n = argc > 2 ? std::atoi(argv[2]) : 5000;
    const double raw = raw_hiredis(ro.port, n);
    const double lh = round_trips("redis", std::make_shared<leasehold::RedisTransport>(ro), n);
    if (raw > 0) std::printf("redis: leasehold / raw hiredis = %.2f\n", lh / raw);
  }
#else
  (void)argc;
  (void)argv;
#endif
  loss_lag();
  return 0;
}
