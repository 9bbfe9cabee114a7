// leasehold/etcd_transport.hpp — the earlier name of leasehold/etcd_executor.hpp: EtcdExecutor,
// with EtcdTransport as an alias of EtcdExecutor.
#pragma once

#include <leasehold/etcd_executor.hpp>
