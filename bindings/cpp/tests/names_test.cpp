// The binding's names: every header (the umbrella, one per concept, each executor's, and the
// earlier per-backend headers) compiles on its own include line, every earlier name is the same
// type as the name that replaced it, and a LockClient built through the earlier names grants
// leases on the memory service and on a real SQLite file. Headers of executors whose client
// library is missing are left out (LEASEHOLD_NAMES_<BACKEND>, set by CMake per target found).
#include <leasehold.hpp>
#include <leasehold/config.hpp>
#include <leasehold/core.hpp>
#include <leasehold/error.hpp>
#include <leasehold/executor.hpp>
#include <leasehold/lease.hpp>
#include <leasehold/lock_client.hpp>
#include <leasehold/lock_status.hpp>
#include <leasehold/memory_executor.hpp>
#include <leasehold/memory_service.hpp>
#include <leasehold/memory_transport.hpp>
#include <leasehold/open.hpp>
#include <leasehold/options.hpp>
#include <leasehold/output.hpp>
#include <leasehold/redis_protocol.hpp>
#include <leasehold/redis_stream_executor.hpp>
#include <leasehold/request.hpp>
#include <leasehold/types.hpp>
#ifdef LEASEHOLD_NAMES_REDIS
#include <leasehold/redis_connect.hpp>
#include <leasehold/redis_executor.hpp>
#include <leasehold/redis_transport.hpp>
#endif
#ifdef LEASEHOLD_NAMES_SQLITE
#include <leasehold/sqlite_executor.hpp>
#include <leasehold/sqlite_transport.hpp>
#endif
#ifdef LEASEHOLD_NAMES_POSTGRES
#include <leasehold/postgres_executor.hpp>
#include <leasehold/postgres_fencing.hpp>
#include <leasehold/postgres_transport.hpp>
#endif
#ifdef LEASEHOLD_NAMES_ETCD
#include <leasehold/etcd_executor.hpp>
#include <leasehold/etcd_transport.hpp>
#endif

#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <type_traits>

using namespace std::chrono_literals;

// Each earlier name is an alias, not a second type: code written against either mixes freely.
static_assert(std::is_same_v<leasehold::Transport, leasehold::Executor>);
static_assert(std::is_same_v<leasehold::Backend, leasehold::Executor>);
static_assert(std::is_same_v<leasehold::Transport::Sink, leasehold::Executor::Sink>);
static_assert(std::is_same_v<leasehold::Request, leasehold::IoRequest>);
static_assert(std::is_same_v<leasehold::SqlRequest, leasehold::IoRequest>);
static_assert(std::is_same_v<leasehold::HttpRequest, leasehold::IoRequest>);
static_assert(std::is_same_v<leasehold::Output, leasehold::Event>);
static_assert(std::is_same_v<leasehold::MemoryTransport, leasehold::MemoryExecutor>);
static_assert(std::is_same_v<leasehold::SqlStatus, leasehold::LockStatus>);
static_assert(std::is_base_of_v<leasehold::Executor, leasehold::MemoryExecutor>);
#ifdef LEASEHOLD_NAMES_REDIS
static_assert(std::is_same_v<leasehold::RedisTransport, leasehold::RedisExecutor>);
static_assert(std::is_base_of_v<leasehold::Executor, leasehold::RedisExecutor>);
#endif
#ifdef LEASEHOLD_NAMES_SQLITE
static_assert(std::is_same_v<leasehold::SqliteTransport, leasehold::SQLiteExecutor>);
static_assert(std::is_same_v<leasehold::SqliteExecutor, leasehold::SQLiteExecutor>);
static_assert(std::is_base_of_v<leasehold::Executor, leasehold::SQLiteExecutor>);
#endif
#ifdef LEASEHOLD_NAMES_POSTGRES
static_assert(std::is_same_v<leasehold::PostgresTransport, leasehold::PostgresExecutor>);
static_assert(std::is_same_v<leasehold::FencingGate, leasehold::PostgresFencingGate>);
static_assert(std::is_base_of_v<leasehold::Executor, leasehold::PostgresExecutor>);
#endif
#ifdef LEASEHOLD_NAMES_ETCD
static_assert(std::is_same_v<leasehold::EtcdTransport, leasehold::EtcdExecutor>);
static_assert(std::is_base_of_v<leasehold::Executor, leasehold::EtcdExecutor>);
#endif

namespace {

leasehold::ClientOptions quiet() {
  leasehold::ClientOptions o;
  o.log = [](std::string_view) {};
  return o;
}

// Grants `name` through `client`, then a second client on the same service is refused while the
// first holds it: the earlier names drive the same service as the new ones.
void expect_exclusive(leasehold::LockClient& a, leasehold::LockClient& b, const std::string& name) {
  auto lease = a.acquire(name, 10s);
  ASSERT_TRUE(lease.has_value());
  EXPECT_GT(lease->fencing_token(), 0u);
  EXPECT_FALSE(b.acquire(name, 10s).has_value());
  EXPECT_EQ(lease->release(), leasehold::ReleaseOutcome::Released);
  auto next = b.acquire(name, 10s);
  ASSERT_TRUE(next.has_value());
  EXPECT_GT(next->fencing_token(), lease->fencing_token());
  // Released here, not by ~Lease (which does not wait): a status query after this sees it free.
  EXPECT_EQ(next->release(), leasehold::ReleaseOutcome::Released);
}

}  // namespace

TEST(Names, EarlierMemoryNamesDriveTheSameService) {
  auto service = std::make_shared<leasehold::MemoryService>();
  std::shared_ptr<leasehold::Transport> old_name = std::make_shared<leasehold::MemoryTransport>(service);
  std::shared_ptr<leasehold::Executor> new_name = std::make_shared<leasehold::MemoryExecutor>(service);
  leasehold::LockClient a(old_name, quiet());
  leasehold::LockClient b(new_name, quiet());
  expect_exclusive(a, b, "names-memory");
  EXPECT_EQ(service->grants(), 2u);
}

#ifdef LEASEHOLD_NAMES_SQLITE
TEST(Names, EarlierSqliteNamesShareOneFile) {
  const auto dir = std::filesystem::temp_directory_path() / ("leasehold-names-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "locks.db").string();
  {
    leasehold::LockClient a(std::make_shared<leasehold::SqliteTransport>(path), quiet());
    leasehold::LockClient b(std::make_shared<leasehold::SQLiteExecutor>(path), quiet());
    expect_exclusive(a, b, "names-sqlite");
    leasehold::LockClient c(std::make_shared<leasehold::SqliteExecutor>(path), quiet());
    const auto st = c.status("names-sqlite");  // every lease above was released
    EXPECT_TRUE(st.ok) << st.error;
    EXPECT_FALSE(st.held);
    EXPECT_GE(st.last_fencing_token, 2u);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}
#endif
