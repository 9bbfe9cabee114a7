// Cross-language contention worker (C++): see tests/crosslang/README.md.
//
//   crosslang_worker BACKEND NAME ROUNDS LOG TAG WORKERS [bytes]
//
// With `bytes` a Redis URL goes to RedisStreamExecutor (the core owns the wire); without it,
// to the hiredis transport.
#include <leasehold.hpp>
#include <leasehold/etcd_transport.hpp>
#include <leasehold/postgres_transport.hpp>
#include <leasehold/redis_stream_executor.hpp>
#include <leasehold/redis_transport.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>

using namespace std::chrono_literals;

namespace {

std::shared_ptr<leasehold::Transport> transport(const std::string& backend) {
  const std::string redis = "redis://";
  if (backend.rfind(redis, 0) == 0) {
    // redis://HOST:PORT
    const std::string rest = backend.substr(redis.size());
    const auto colon = rest.rfind(':');
    leasehold::RedisOptions ro;
    ro.host = rest.substr(0, colon);
    ro.port = std::stoi(rest.substr(colon + 1));
    return std::make_shared<leasehold::RedisTransport>(ro);
  }
  if (backend.rfind("postgresql://", 0) == 0) {
    leasehold::PostgresOptions po;
    po.url = backend;
    return std::make_shared<leasehold::PostgresTransport>(po);
  }
  if (backend.rfind("etcd://", 0) == 0) {
    leasehold::EtcdOptions eo;
    eo.endpoints = leasehold::EtcdOptions::split(backend);
    return std::make_shared<leasehold::EtcdTransport>(eo);
  }
  throw std::runtime_error("unsupported backend " + backend);
}

// One write per line: O_APPEND keeps lines whole.
void append(int fd, const std::string& line) {
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    throw std::runtime_error("write to the log failed");
  }
}

int count(const std::string& log, const std::string& kind) {
  std::ifstream in(log);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += line.rfind(kind + " ", 0) == 0;
  return n;
}

// Others held the lock `turns` times since our last exit, or every other worker is done.
bool others_had_it(const std::string& log, const std::string& tag, int workers, int turns) {
  std::ifstream in(log);
  std::string line;
  int done = 0, others = 0;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string kind, who;
    f >> kind >> who;
    if (kind == "done") ++done;
    if (kind == "exit" && who == tag) others = 0;
    if (kind == "enter" && who != tag) ++others;
  }
  return done >= workers - 1 || others >= turns;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 7 && argc != 8) {
    std::cerr << "usage: crosslang_worker BACKEND NAME ROUNDS LOG TAG WORKERS [bytes]\n";
    return 2;
  }
  const std::string backend = argv[1], name = argv[2], log = argv[4], tag = argv[5];
  const int rounds = std::stoi(argv[3]), workers = std::stoi(argv[6]);
  const int fd = ::open(log.c_str(), O_WRONLY | O_APPEND);
  if (fd < 0) throw std::runtime_error("cannot open " + log);
  const auto pid = std::to_string(::getpid());
  {
    const bool bytes = argc == 8 && std::string(argv[7]) == "bytes";
    leasehold::LockClient client = bytes ? leasehold::LockClient(std::make_shared<leasehold::RedisStreamExecutor>(backend))
                                         : leasehold::LockClient(transport(backend));
    leasehold::AcquireOptions opts;
    opts.wait = 60s;
    std::mt19937 rng(std::random_device{}());
    // Start together: each waits until every worker has its client.
    append(fd, "ready " + tag + " " + pid + "\n");
    const auto ready_by = std::chrono::steady_clock::now() + 60s;
    while (count(log, "ready") < workers && std::chrono::steady_clock::now() < ready_by) {
      std::this_thread::sleep_for(5ms);
    }
    for (int i = 0; i < rounds; ++i) {
      auto lease = client.acquire(name, 10s, opts);
      if (!lease) throw std::runtime_error("acquire gave up");
      const auto fence = std::to_string(lease->fencing_token());
      append(fd, "enter " + tag + " " + pid + " " + fence + "\n");
      std::this_thread::sleep_for(500us);
      append(fd, "exit " + tag + " " + pid + " " + fence + "\n");
      const auto outcome = lease->release();
      if (outcome != leasehold::ReleaseOutcome::Released) {
        throw std::runtime_error("release said " + std::string(leasehold::to_string(outcome)));
      }
      // Now and then let two others go first, so a FIFO queue changes its order.
      const int turns = std::uniform_int_distribution<int>(0, 9)(rng) < 3 ? 2 : 1;
      const auto deadline = std::chrono::steady_clock::now() + 500ms;
      while (!others_had_it(log, tag, workers, turns) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(1ms);
      }
    }
  }
  append(fd, "done " + tag + " " + pid + "\n");
  ::close(fd);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "crosslang_worker: " << e.what() << "\n";
  return 1;
}
