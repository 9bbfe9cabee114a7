"""Lock services (backends).

* :mod:`leasehold.backends.memory` – in-process reference with fault switches (tests, examples);
* :mod:`leasehold.backends.sqlite` – the embedded default for processes on one host;
* :mod:`leasehold.backends.redis` / :mod:`leasehold.backends.redis_async` – Redis.

Only the memory backend is imported eagerly; the others load their dependencies on import.
"""

from .memory import LockRecord, MemoryLockService, MemoryStore

__all__ = ["MemoryLockService", "MemoryStore", "LockRecord"]
