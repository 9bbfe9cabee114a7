// leasehold/memory_transport.hpp — the earlier name of leasehold/memory_executor.hpp:
// MemoryExecutor and MemoryService, with MemoryTransport as an alias of MemoryExecutor.
#pragma once

#include <leasehold/memory_executor.hpp>
