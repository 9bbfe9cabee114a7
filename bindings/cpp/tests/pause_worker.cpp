// A process that holds leases for tests that pause it with SIGSTOP (paused_test.hpp).
//
//   leasehold_pause_worker memory        # its own in-process MemoryService
//   leasehold_pause_worker redis PORT    # RedisExecutor to 127.0.0.1:PORT
//   leasehold_pause_worker sqlite PATH   # SQLiteExecutor on the file PATH
//   leasehold_pause_worker postgres URL  # PostgresExecutor (and the fencing gate) on URL
//   leasehold_pause_worker etcd URLS     # EtcdExecutor to the comma-separated member URLs
//
// Reads commands on stdin, answers one line each on stdout:
//   acquire NAME TTL_MS [WAIT_MS] → "held FENCE" | "failed" (waits for the lock up to WAIT_MS)
//   release              → "outcome=O lost=0|1 reason=R callbacks=N stop=0|1"
//                          (release() is the first thing it does after reading the line)
//   write RESOURCE       → (postgres) through the fencing gate with the held lease's token:
//                          "written" | "stale HWM" | "error MESSAGE"
//   contend NAME N TTL_MS WAIT_MS LOG [gate]
//                        → acquires NAME N times; each grant appends "+ FENCE PID" to the
//                          file LOG on entering and "- FENCE PID" on leaving; with "gate"
//                          (postgres) it also adds 1 to the row NAME of leasehold_test_counter
//                          through the fencing gate (read, then write). "done ACQUIRED"
//   handoff NAME TTL_MS WAIT_MS HOLD_MS
//                        → until killed: acquire NAME (renewed automatically, waiting up to
//                          WAIT_MS), "held FENCE MONO_NS" (CLOCK_MONOTONIC, one clock for every
//                          process), hold HOLD_MS, "releasing FENCE", release, 20 ms for a
//                          waiter to take it; a wait that runs out answers "failed"
//   quit / EOF           → exit 0
#include <leasehold.hpp>
#include <leasehold/memory_executor.hpp>
#ifdef LEASEHOLD_PAUSE_WORKER_REDIS
#include <leasehold/redis_executor.hpp>
#endif
#ifdef LEASEHOLD_PAUSE_WORKER_SQLITE
#include <leasehold/sqlite_executor.hpp>
#endif
#ifdef LEASEHOLD_PAUSE_WORKER_POSTGRES
#include <leasehold/postgres_fencing.hpp>
#include <leasehold/postgres_executor.hpp>
#endif
#ifdef LEASEHOLD_PAUSE_WORKER_ETCD
#include <leasehold/etcd_executor.hpp>
#endif

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

using namespace std::chrono_literals;

int main(int argc, char** argv) {
  const std::string kind = argc > 1 ? argv[1] : "memory";
  std::shared_ptr<leasehold::Executor> transport;
  if (kind == "memory") {
    transport = std::make_shared<leasehold::MemoryExecutor>(std::make_shared<leasehold::MemoryService>());
#ifdef LEASEHOLD_PAUSE_WORKER_REDIS
  } else if (kind == "redis" && argc > 2) {
    leasehold::RedisOptions ro;
    ro.port = std::stoi(argv[2]);
    transport = std::make_shared<leasehold::RedisExecutor>(ro);
#endif
#ifdef LEASEHOLD_PAUSE_WORKER_SQLITE
  } else if (kind == "sqlite" && argc > 2) {
    transport = std::make_shared<leasehold::SQLiteExecutor>(std::string(argv[2]));
#endif
#ifdef LEASEHOLD_PAUSE_WORKER_POSTGRES
  } else if (kind == "postgres" && argc > 2) {
    transport = std::make_shared<leasehold::PostgresExecutor>(std::string(argv[2]));
#endif
#ifdef LEASEHOLD_PAUSE_WORKER_ETCD
  } else if (kind == "etcd" && argc > 2) {
    leasehold::EtcdOptions eo;
    eo.endpoints = leasehold::EtcdOptions::split(argv[2]);
    transport = std::make_shared<leasehold::EtcdExecutor>(eo);
#endif
  } else {
    std::cerr << "usage: " << argv[0] << " memory | redis PORT | sqlite PATH | postgres URL | etcd URLS\n";
    return 2;
  }
  leasehold::ClientOptions co;
  co.log = [](std::string_view) {};
  leasehold::LockClient client(transport, co);

  std::optional<leasehold::Lease> lease;
  std::atomic<int> callbacks{0};
#ifdef LEASEHOLD_PAUSE_WORKER_POSTGRES
  std::optional<leasehold::PostgresFencingGate> gate;
  auto the_gate = [&]() -> leasehold::PostgresFencingGate& {
    if (!gate) gate.emplace(std::string(argv[2]));
    return *gate;
  };
#endif
  auto append = [](const std::string& path, const std::string& line) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd < 0) return false;
    const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    ::close(fd);
    return ok;
  };
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "acquire") {
      std::string name;
      long long ttl = 0, wait_ms = 0;
      in >> name >> ttl;
      if (!(in >> wait_ms)) wait_ms = 0;  // optional: how long to wait for the lock
      callbacks = 0;
      leasehold::AcquireOptions o;
      o.wait = std::chrono::milliseconds(wait_ms);
      o.on_lost = [&](leasehold::LostReason) { ++callbacks; };
      lease = client.acquire(name, std::chrono::milliseconds(ttl), std::move(o));
      if (lease) std::cout << "held " << lease->fencing_token() << std::endl;
      else std::cout << "failed" << std::endl;
    } else if (cmd == "release" && lease) {
      const auto outcome = lease->release();
      // The loss signals run on the callback thread: give them time to arrive (and a duplicate
      // time to show up).
      const auto end = leasehold::Clock::now() + 30s;
      while (lease->lost() && (callbacks.load() == 0 || !lease->stop_token().stop_requested()) &&
             leasehold::Clock::now() < end)
        std::this_thread::sleep_for(2ms);
      std::this_thread::sleep_for(50ms);
      const auto reason = lease->lost_reason();
      std::cout << "outcome=" << leasehold::to_string(outcome) << " lost=" << (lease->lost() ? 1 : 0)
                << " reason=" << (reason ? leasehold::to_string(*reason) : "none")
                << " callbacks=" << callbacks.load() << " stop=" << (lease->stop_token().stop_requested() ? 1 : 0)
                << std::endl;
      lease.reset();
#ifdef LEASEHOLD_PAUSE_WORKER_POSTGRES
    } else if (cmd == "write" && lease && kind == "postgres") {
      std::string resource;
      in >> resource;
      try {
        the_gate().run(resource, lease->fencing_token(), [&](PGconn* c) {
          const std::string fence = std::to_string(lease->fencing_token()), pid = std::to_string(::getpid());
          const char* params[] = {resource.c_str(), fence.c_str(), pid.c_str()};
          PGresult* r = PQexecParams(c, "INSERT INTO leasehold_test_writes (resource, fence, pid) VALUES ($1, $2, $3)",
                                     3, nullptr, params, nullptr, nullptr, 0);
          const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
          PQclear(r);
          if (!ok) throw std::runtime_error(PQerrorMessage(c));
        });
        std::cout << "written" << std::endl;
      } catch (const leasehold::StaleFencingToken& e) {
        std::cout << "stale " << e.high_water_mark() << std::endl;
      } catch (const std::exception& e) {
        std::cout << "error " << e.what() << std::endl;
      }
#endif
    } else if (cmd == "contend") {
      std::string name, log, with_gate;
      long long n = 0, ttl = 0, wait_ms = 0;
      in >> name >> n >> ttl >> wait_ms >> log >> with_gate;
      long long got = 0;
      std::string error;
      for (long long i = 0; i < n; ++i) {
        leasehold::AcquireOptions o;
        o.wait = std::chrono::milliseconds(wait_ms);
        auto l = client.acquire(name, std::chrono::milliseconds(ttl), std::move(o));
        if (!l) continue;
        ++got;
        const auto f = std::to_string(l->fencing_token()) + " " + std::to_string(::getpid()) + "\n";
        append(log, "+ " + f);
#ifdef LEASEHOLD_PAUSE_WORKER_POSTGRES
        if (with_gate == "gate") {
          try {
            the_gate().run(name, l->fencing_token(), [&](PGconn* c) {
              const char* p1[] = {name.c_str()};
              PGresult* r = PQexecParams(c, "SELECT n FROM leasehold_test_counter WHERE name = $1", 1, nullptr, p1,
                                         nullptr, nullptr, 0);
              const std::string next = std::to_string(
                  (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 ? std::stoll(PQgetvalue(r, 0, 0)) : 0) + 1);
              PQclear(r);
              std::this_thread::sleep_for(1ms);  // widen the window a lost update would need
              const char* p2[] = {next.c_str(), name.c_str()};
              r = PQexecParams(c, "UPDATE leasehold_test_counter SET n = $1 WHERE name = $2", 2, nullptr, p2, nullptr,
                               nullptr, 0);
              const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
              PQclear(r);
              if (!ok) throw std::runtime_error(PQerrorMessage(c));
            });
          } catch (const std::exception& e) {
            error = e.what();
          }
        }
#endif
        std::this_thread::sleep_for(1ms);
        append(log, "- " + f);
        l->release();
      }
      for (auto& ch : error) ch = ch == '\n' ? ' ' : ch;
      if (!error.empty()) std::cout << "error " << error << std::endl;
      std::cout << "done " << got << std::endl;
    } else if (cmd == "handoff") {
      std::string name;
      long long ttl = 0, wait_ms = 0, hold_ms = 0;
      in >> name >> ttl >> wait_ms >> hold_ms;
      while (true) {
        leasehold::AcquireOptions o;
        o.wait = std::chrono::milliseconds(wait_ms);
        auto l = client.acquire(name, std::chrono::milliseconds(ttl), std::move(o));
        if (!l) {
          std::cout << "failed" << std::endl;
          continue;
        }
        timespec now{};
        ::clock_gettime(CLOCK_MONOTONIC, &now);
        std::cout << "held " << l->fencing_token() << " " << (now.tv_sec * 1000000000LL + now.tv_nsec) << std::endl;
        std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
        std::cout << "releasing " << l->fencing_token() << std::endl;
        l->release();
        std::this_thread::sleep_for(20ms);  // a release then an instant acquire would barge
      }
    } else if (cmd == "quit") {
      break;
    } else {
      std::cout << "error unknown command: " << line << std::endl;
    }
  }
  return 0;
}
