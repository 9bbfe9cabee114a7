// Takes a lock, prints its fencing token and releases it, with the C++ binding.
//
// The C++ binding has no SQLite service yet (the embedded default is in the Python package),
// so this uses its in-process MemoryService; with Redis, pass a leasehold::RedisTransport
// (leasehold/redis_transport.hpp, target leasehold::redis) instead.
#include <leasehold.hpp>
#include <leasehold/memory_transport.hpp>

#include <chrono>
#include <cstdio>
#include <memory>

int main() {
  using namespace std::chrono_literals;
  auto service = std::make_shared<leasehold::MemoryService>();
  leasehold::LockClient client(std::make_shared<leasehold::MemoryTransport>(service));

  leasehold::AcquireOptions opts;
  opts.wait = 5s;
  auto lease = client.acquire("example", 10s, opts);
  if (!lease) {
    std::fprintf(stderr, "'example' is held by someone else\n");
    return 1;
  }
  // Hand the token to every write the lock protects; the resource refuses older tokens.
  std::printf("holding 'example': fencing token %llu\n",
              static_cast<unsigned long long>(lease->fencing_token()));
  lease->release();  // the destructor would release it too
  if (lease->is_held()) return 1;
  std::printf("released\n");
  return 0;
}
