"""leasehold — distributed locks with renewal, loss detection and fencing tokens.

A pure, IO-free Rust core decides all lease timing (renewal cadence, local expiry with a
drift margin, failure budget, backoff, reentrancy); this package drives it over ctypes and
runs the backend IO::

    from leasehold import LockClient, LockTimeout
    from leasehold.backends.memory import MemoryExecutor

    with LockClient(MemoryExecutor()) as client:
        try:
            with client.acquire("reports", ttl=30, wait=5) as lock:
                write_report(fencing_token=lock.fencing_token)
        except LockTimeout:
            print("someone else is writing the report")

The client can only *detect* that it lost a lock (``lock.lost``, ``on_lost``,
``lock.is_held()``); the resource must *enforce* exclusivity with the fencing token — see
:mod:`leasehold.fencing`.
"""

from typing import TYPE_CHECKING, Any

# Pure-Python parts import eagerly; everything that loads the native library is imported on
# first use (PEP 562), so `leasehold --help` and the SQLite `status` work, and report a clear
# error, even when the library is missing.
from .errors import (
    AcquireCancelled,
    BackendUnavailable,
    ClientClosed,
    CoreError,
    InvalidArgument,
    LeaseholdError,
    LibraryError,
    LockLost,
    LockNotHeld,
    LockTimeout,
    RenewTimeout,
    StaleFencingToken,
)
from .fencing import FencingGate
from .service import AsyncLockService, Granted, HeldByOther, LockService, to_async

if TYPE_CHECKING:
    from ._core import Config, Counters, EtcdOptions, MemoryOptions, RedisOptions, SqlOptions
    from ._ffi import VERSION as CORE_VERSION
    from ._ffi import library_path
    from ._lease import ReleaseOutcome
    from .aio import AsyncLease, AsyncLockClient, AsyncLockHandle
    from .backends.etcd_executor import EtcdExecutor
    from .backends.memory import MemoryExecutor, MemoryService
    from .backends.redis_executor import RedisExecutor
    from .backends.sql_executor import PostgresExecutor, SQLiteExecutor
    from .client import Lease, LockClient, LockHandle, Subscription

_LAZY = {
    "Config": ("._core", "Config"),
    "Counters": ("._core", "Counters"),
    "RedisOptions": ("._core", "RedisOptions"),
    "SqlOptions": ("._core", "SqlOptions"),
    "EtcdOptions": ("._core", "EtcdOptions"),
    "MemoryOptions": ("._core", "MemoryOptions"),
    "ReleaseOutcome": ("._lease", "ReleaseOutcome"),
    "CORE_VERSION": ("._ffi", "VERSION"),
    "library_path": ("._ffi", "library_path"),
    "AsyncLockClient": (".aio", "AsyncLockClient"),
    "AsyncLease": (".aio", "AsyncLease"),
    "AsyncLockHandle": (".aio", "AsyncLockHandle"),
    "LockClient": (".client", "LockClient"),
    "Lease": (".client", "Lease"),
    "LockHandle": (".client", "LockHandle"),
    # The names every binding shares (Go's leasehold.RedisExecutor, ...). Not in __all__: each
    # loads its backend's driver (redis-py, psycopg) on first use and is documented in its module.
    "MemoryService": (".backends.memory", "MemoryService"),
    "MemoryExecutor": (".backends.memory", "MemoryExecutor"),
    "SQLiteExecutor": (".backends.sql_executor", "SQLiteExecutor"),
    "PostgresExecutor": (".backends.sql_executor", "PostgresExecutor"),
    "RedisExecutor": (".backends.redis_executor", "RedisExecutor"),
    "EtcdExecutor": (".backends.etcd_executor", "EtcdExecutor"),
    "Subscription": (".client", "Subscription"),
}


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'leasehold' has no attribute {name!r}") from None
    import importlib

    value = getattr(importlib.import_module(module, __name__), attr)
    globals()[name] = value
    return value


__version__ = "0.1.0"

__all__ = [
    "LockClient",
    "Lease",
    "LockHandle",
    "Subscription",
    "AsyncLockClient",
    "AsyncLease",
    "AsyncLockHandle",
    "Config",
    "Counters",
    "RedisOptions",
    "SqlOptions",
    "EtcdOptions",
    "MemoryOptions",
    "LockService",
    "AsyncLockService",
    "Granted",
    "HeldByOther",
    "to_async",
    "FencingGate",
    "LeaseholdError",
    "LibraryError",
    "CoreError",
    "InvalidArgument",
    "LockTimeout",
    "BackendUnavailable",
    "AcquireCancelled",
    "ClientClosed",
    "LockNotHeld",
    "LockLost",
    "RenewTimeout",
    "ReleaseOutcome",
    "StaleFencingToken",
    "CORE_VERSION",
    "library_path",
    "__version__",
]
