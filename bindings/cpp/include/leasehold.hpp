// leasehold.hpp — header-only C++20 binding for the leasehold lease core: includes every header
// of the core binding (one per concept, under leasehold/). Each backend's executor has its own
// header: leasehold/redis_executor.hpp, sqlite_executor.hpp, postgres_executor.hpp and
// etcd_executor.hpp with their CMake targets (leasehold::redis, ::sqlite, ::postgres, ::etcd),
// memory_executor.hpp (MemoryExecutor, MemoryService) and redis_stream_executor.hpp
// (RedisStreamExecutor: the core owns the Redis wire, POSIX sockets; leasehold::redis_stream adds
// TLS through OpenSSL) with none; leasehold/open.hpp makes the executor a URL names
// (make_executor, open_client); the PostgreSQL fencing gate is leasehold/postgres_fencing.hpp.
//
//   leasehold/error.hpp        Status, leasehold::Error
//   leasehold/types.hpp        Clock, lease states and reasons, LeaseInfo
//   leasehold/config.hpp       Config, Counters
//   leasehold/output.hpp       the core's events
//   leasehold/request.hpp      the IO the core asks for (IoRequest) and its answers (IoAnswer)
//   leasehold/lock_status.hpp  LockStatus (LockClient::status)
//   leasehold/core.hpp         Core: RAII owner of one lh_client (sans-IO, not thread-safe)
//   leasehold/executor.hpp     Executor: runs the core's IO for one backend (what a LockClient drives)
//   leasehold/options.hpp      ClientOptions, AcquireOptions
//   leasehold/lease.hpp        Lease
//   leasehold/lock_client.hpp  LockClient: thread-safe, runs the host loop on a driver thread
//
// Time is std::chrono::steady_clock in nanoseconds; the seed comes from std::random_device.
#pragma once

#include <leasehold.h>

#include <leasehold/config.hpp>
#include <leasehold/core.hpp>
#include <leasehold/error.hpp>
#include <leasehold/executor.hpp>
#include <leasehold/lease.hpp>
#include <leasehold/lock_client.hpp>
#include <leasehold/lock_status.hpp>
#include <leasehold/options.hpp>
#include <leasehold/output.hpp>
#include <leasehold/request.hpp>
#include <leasehold/types.hpp>
