"""Lock services (backends).

:mod:`leasehold.backends.memory` is the in-process reference service with fault switches
(tests, examples): ``MemoryService`` (the server) and ``MemoryExecutor`` (one connection;
first names ``MemoryStore`` and ``MemoryLockService``). Executors run the core's own backend protocol verbatim (the core owns keys, SQL and
replies; the executor owns the connections):

* :mod:`leasehold.backends.redis_executor` / :mod:`leasehold.backends.redis_executor_async` – Redis
  (and Sentinel; also under their first names: :mod:`leasehold.backends.redis` /
  :mod:`leasehold.backends.redis_async`), their connections (pools, URLs, Sentinel) made by
  :mod:`leasehold.backends.redis_connect`; :mod:`leasehold.backends.redis_cluster_executor` /
  :mod:`leasehold.backends.redis_cluster_executor_async` – Redis Cluster;
* :mod:`leasehold.backends.redis_stream` – ``RedisStreamExecutor``: Redis with the connections
  in the core, the executor only moving bytes (standard-library ``socket`` and ``ssl``);
* :mod:`leasehold.backends.sqlite` – ``SQLiteLockService``, the embedded default for
  processes on one host: a ``SQLiteExecutor`` that checks and migrates the file when made,
  and answers ``status(name)``;
* :mod:`leasehold.backends.sql_executor` – ``SQLiteExecutor`` (``sqlite3``; first name
  ``SqliteExecutor``) and ``PostgresExecutor`` (psycopg 3),
  :mod:`leasehold.backends.sql_executor_async` – PostgreSQL for asyncio;
* :mod:`leasehold.backends.etcd_executor` – etcd v3 through its JSON gateway (``http.client``).

Only the memory backend is imported eagerly; the others load their dependencies on import.
``Deferred`` is what an executor's bounded call (``command_within``, ``execute_within``,
``post_within``) raises past an application's deadline.
"""

from .._backend import Deferred
from .memory import LockRecord, MemoryExecutor, MemoryLockService, MemoryService, MemoryStore

__all__ = ["Deferred", "MemoryService", "MemoryExecutor", "MemoryStore", "MemoryLockService", "LockRecord"]
