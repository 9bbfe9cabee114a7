// leasehold/postgres_transport.hpp — the earlier name of leasehold/postgres_executor.hpp: PostgresExecutor,
// with PostgresTransport as an alias of PostgresExecutor.
#pragma once

#include <leasehold/postgres_executor.hpp>
