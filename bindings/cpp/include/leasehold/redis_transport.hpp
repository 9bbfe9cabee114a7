// leasehold/redis_transport.hpp — the earlier name of leasehold/redis_executor.hpp: RedisExecutor,
// with RedisTransport as an alias of RedisExecutor.
#pragma once

#include <leasehold/redis_executor.hpp>
