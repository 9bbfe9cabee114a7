// Takes a lock on the embedded default, a SQLite file in the user's cache directory shared by
// every process on this host (the file the Python package and the leasehold CLI use by
// default), prints its fencing token and releases it. With Redis, pass a
// leasehold::RedisExecutor (leasehold/redis_executor.hpp, target leasehold::redis) instead.
//
//   lock [NAME]
#include <leasehold.hpp>
#include <leasehold/sqlite_executor.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

namespace fs = std::filesystem;

int main(int argc, char** argv) try {
  using namespace std::chrono_literals;
  const std::string name = argc > 1 ? argv[1] : "example";
  // The executor creates the default file's directory (0700) and the file (0600).
  const fs::path path = leasehold::default_sqlite_path();
  leasehold::LockClient client(std::make_shared<leasehold::SQLiteExecutor>(path.string()));

  leasehold::AcquireOptions opts;
  opts.wait = 5s;
  auto lease = client.acquire(name, 10s, opts);
  if (!lease) {
    std::fprintf(stderr, "'%s' is held by another process\n", name.c_str());
    return 1;
  }
  // Hand the token to every write the lock protects; the resource refuses older tokens.
  std::printf("holding '%s' in %s: fencing token %llu\n", name.c_str(), path.c_str(),
              static_cast<unsigned long long>(lease->fencing_token()));
  lease->release();  // the destructor would release it too
  if (lease->is_held()) return 1;
  std::printf("released\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "lock: %s\n", e.what());
  return 1;
}
