// Minimal use of the C++ binding: two clients contend for one name on the in-memory service.
//   target_link_libraries(app leasehold::leasehold)
#include <leasehold.hpp>
#include <leasehold/memory_executor.hpp>

#include <chrono>
#include <cstdio>
#include <memory>

int main() {
  using namespace std::chrono_literals;
  auto service = std::make_shared<leasehold::MemoryService>();
  leasehold::LockClient alice(std::make_shared<leasehold::MemoryExecutor>(service));
  leasehold::LockClient bob(std::make_shared<leasehold::MemoryExecutor>(service));

  leasehold::AcquireOptions opts;
  opts.on_lost = [](leasehold::LostReason r) {
    std::printf("lost: %.*s\n", static_cast<int>(leasehold::to_string(r).size()), leasehold::to_string(r).data());
  };
  auto lease = alice.acquire("reports", 10s, opts);
  if (!lease) return 1;
  std::printf("alice holds reports, fencing token %llu\n", static_cast<unsigned long long>(lease->fencing_token()));

  leasehold::AcquireOptions wait;
  wait.wait = 5s;
  if (bob.acquire("reports", 10s)) return 1;  // one attempt: held by alice
  lease->release();                           // or let the destructor do it
  auto bobs = bob.acquire("reports", 10s, wait);
  if (!bobs || bobs->fencing_token() <= 0) return 1;
  std::printf("bob holds reports, fencing token %llu\n", static_cast<unsigned long long>(bobs->fencing_token()));
  return 0;
}
