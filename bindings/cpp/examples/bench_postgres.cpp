// Uncontended acquire + release on one PostgreSQL (numbers for the README; not a test):
//   cmake -DLEASEHOLD_BUILD_BENCH=ON … && ./leasehold_bench_postgres URL [rounds [round-ms]] [async]
// Rows, in interleaved rounds (the order rotates each round, so a load burst weighs on all):
//   LockClient — LockClient + PostgresExecutor, as an application uses it;
//   floor      — the protocol's two statements (leasehold_acquire, leasehold_release) sent
//                with PQexecParams on one libpq connection, as the executor sends them: what
//                no client on libpq can beat;
//   advisory   — pg_try_advisory_lock + pg_advisory_unlock: no TTL, no fence, nothing
//                written; a reference, not a peer.
// Prints each row's median ops/s, its paired ratio to the floor (median over rounds of
// row_i / floor_i), this process's CPU time per cycle and how often per cycle one of its threads
// blocked (voluntary context switches: a thread hop costs two). `async`: every row with
// synchronous_commit off (PostgresOptions::asynchronous_commit).
#include <leasehold.hpp>
#include <leasehold/postgres_executor.hpp>

#include <libpq-fe.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// This process's CPU time (µs) and the times its threads blocked (voluntary context switches).
std::pair<double, double> usage() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return {(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 + ru.ru_utime.tv_usec + ru.ru_stime.tv_usec,
          static_cast<double>(ru.ru_nvcsw)};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[(v.size() - 1) / 2];
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "bench_postgres: %s\n", what.c_str());
  std::exit(1);
}

// One statement with text parameters; the first value of its one row, or a failure that ends
// the run.
std::string one(PGconn* c, const char* sql, std::vector<const char*> params) {
  PGresult* r = PQexecParams(c, sql, static_cast<int>(params.size()), nullptr, params.data(), nullptr, nullptr, 0);
  if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
    std::string e = PQresultErrorMessage(r);
    PQclear(r);
    fail(std::string(sql) + ": " + e);
  }
  std::string v = PQgetvalue(r, 0, 0);
  PQclear(r);
  return v;
}

PGconn* connect(const std::string& url) {
  PGconn* c = PQconnectdb(url.c_str());
  if (PQstatus(c) != CONNECTION_OK) fail(std::string("connect: ") + PQerrorMessage(c));
  return c;
}

struct Row {
  const char* label;
  std::function<void()> cycle;
  std::vector<double> rates, cpus, blocks;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s URL [rounds [round-ms]] [async]\n", argv[0]);
    return 2;
  }
  const std::string url = argv[1];
  bool async = false;
  std::vector<long> nums;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "async") == 0) {
      async = true;
      continue;
    }
    char* end = nullptr;
    const long v = std::strtol(argv[i], &end, 10);
    if (end == argv[i] || *end != '\0' || v < 1 || v > 100000) {
      std::fprintf(stderr, "usage: %s URL [rounds [round-ms]] [async] (rounds and round-ms: 1..100000)\n", argv[0]);
      return 2;
    }
    nums.push_back(v);
  }
  const long rounds = nums.size() > 0 ? nums[0] : 7;
  const auto round = std::chrono::milliseconds(nums.size() > 1 ? nums[1] : 1000);

  leasehold::PostgresOptions po;
  po.url = url;
  po.asynchronous_commit = async;
  leasehold::ClientOptions co;
  co.log = [](std::string_view) {};
  leasehold::LockClient client(std::make_shared<leasehold::PostgresExecutor>(po), co);
  // The first acquire runs the migration that creates the floor's functions.
  if (auto warm = client.acquire("bench-pg-warm", 10s)) {
    warm->release();
  } else {
    fail("LockClient: the first acquire was refused");
  }

  PGconn* floor_conn = connect(url);
  PGconn* adv_conn = connect(url);
  // The core's statements, word for word (src/backend/sql/postgres.rs).
  const char* acquire = async ? "SELECT a.lh_granted, a.lh_fence, a.lh_remaining_ms "
                                "FROM set_config('synchronous_commit', 'off', true) s, leasehold_acquire($1, $2, $3) a"
                              : "SELECT lh_granted, lh_fence, lh_remaining_ms FROM leasehold_acquire($1, $2, $3)";
  const char* release = async ? "SELECT leasehold_release($1, $2, $3) FROM set_config('synchronous_commit', 'off', true) s"
                              : "SELECT leasehold_release($1, $2, $3)";
  std::vector<Row> rows;
  rows.push_back({"LockClient + PostgresExecutor", [&] {
                    auto lease = client.acquire("bench-pg-client", 10s);
                    if (!lease) fail("LockClient: acquire refused");
                    if (lease->release() != leasehold::ReleaseOutcome::Released) fail("LockClient: not released");
                  }, {}, {}, {}});
  rows.push_back({"floor: the protocol's 2 statements on libpq", [&] {
                    const char* token = "00112233445566778899aabbccddeeff";
                    if (one(floor_conn, acquire, {"bench-pg-floor", token, "10000"}) != "t") fail("floor: not granted");
                    if (one(floor_conn, release, {"bench-pg-floor", token, "lh_bench"}) != "t") fail("floor: not released");
                  }, {}, {}, {}});
  rows.push_back({"pg_try_advisory_lock + unlock (no TTL, no fence)", [&] {
                    if (one(adv_conn, "SELECT pg_try_advisory_lock(4242)", {}) != "t") fail("advisory: taken");
                    if (one(adv_conn, "SELECT pg_advisory_unlock(4242)", {}) != "t") fail("advisory: not held");
                  }, {}, {}, {}});
  for (auto& r : rows) {  // warm-up
    for (int i = 0; i < 50; ++i) r.cycle();
  }
  for (long k = 0; k < rounds; ++k) {
    for (std::size_t j = 0; j < rows.size(); ++j) {
      Row& r = rows[(j + static_cast<std::size_t>(k)) % rows.size()];
      const auto u0 = usage();
      const auto t0 = Clock::now();
      long n = 0;
      while (Clock::now() - t0 < round) {
        r.cycle();
        ++n;
      }
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      r.rates.push_back(n / secs);
      const auto u1 = usage();
      r.cpus.push_back((u1.first - u0.first) / n);
      r.blocks.push_back((u1.second - u0.second) / n);
    }
  }
  std::printf("PostgreSQL, %s; %ld interleaved rounds of %lld ms\n", async ? "synchronous_commit off" : "durable commits",
              rounds, static_cast<long long>(round.count()));
  std::printf("| acquire + release | ops/s, median | paired ratio to the floor | CPU here per cycle (µs) | blocking waits per cycle |\n"
              "|---|---:|---:|---:|---:|\n");
  for (const auto& r : rows) {
    std::vector<double> ratio;
    for (long k = 0; k < rounds; ++k) ratio.push_back(r.rates[static_cast<std::size_t>(k)] / rows[1].rates[static_cast<std::size_t>(k)]);
    std::printf("| %s | %.0f | %.2f× | %.0f | %.1f |\n", r.label, median(r.rates), median(ratio), median(r.cpus),
                median(r.blocks));
  }
  PQfinish(floor_conn);
  PQfinish(adv_conn);
  return 0;
}
