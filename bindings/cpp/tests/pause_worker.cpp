// A process that holds leases for tests that pause it with SIGSTOP (paused_test.hpp).
//
//   leasehold_pause_worker memory        # its own in-process MemoryService
//   leasehold_pause_worker redis PORT    # RedisTransport to 127.0.0.1:PORT
//
// Reads commands on stdin, answers one line each on stdout:
//   acquire NAME TTL_MS [WAIT_MS] → "held FENCE" | "failed" (waits for the lock up to WAIT_MS)
//   release              → "outcome=O lost=0|1 reason=R callbacks=N stop=0|1"
//                          (release() is the first thing it does after reading the line)
//   quit / EOF           → exit 0
#include <leasehold.hpp>
#include <leasehold/memory_transport.hpp>
#ifdef LEASEHOLD_PAUSE_WORKER_REDIS
#include <leasehold/redis_transport.hpp>
#endif

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
  std::shared_ptr<leasehold::Transport> transport;
  if (kind == "memory") {
    transport = std::make_shared<leasehold::MemoryTransport>(std::make_shared<leasehold::MemoryService>());
#ifdef LEASEHOLD_PAUSE_WORKER_REDIS
  } else if (kind == "redis" && argc > 2) {
    leasehold::RedisOptions ro;
    ro.port = std::stoi(argv[2]);
    transport = std::make_shared<leasehold::RedisTransport>(ro);
#endif
  } else {
    std::cerr << "usage: " << argv[0] << " memory | redis PORT\n";
    return 2;
  }
  leasehold::ClientOptions co;
  co.log = [](std::string_view) {};
  leasehold::LockClient client(transport, co);

  std::optional<leasehold::Lease> lease;
  std::atomic<int> callbacks{0};
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
    } else if (cmd == "quit") {
      break;
    } else {
      std::cout << "error unknown command: " << line << std::endl;
    }
  }
  return 0;
}
