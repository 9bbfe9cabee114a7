// leasehold/sqlite_transport.hpp — the earlier name of leasehold/sqlite_executor.hpp: SQLiteExecutor,
// with SqliteTransport as an alias of SQLiteExecutor.
#pragma once

#include <leasehold/sqlite_executor.hpp>
