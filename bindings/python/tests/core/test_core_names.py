"""The names every binding shares (LockClient, Lease, <Backend>Executor, FencingGate,
MemoryService) are importable here, and each first name still is, as the same object."""

from __future__ import annotations

import importlib

import pytest

import leasehold

# (module, new name, first name or None)
NAMES = [
    ("leasehold", "LockClient", None),
    ("leasehold", "Lease", "LockHandle"),
    ("leasehold", "AsyncLease", "AsyncLockHandle"),
    ("leasehold", "FencingGate", None),
    ("leasehold", "MemoryService", None),
    ("leasehold", "MemoryExecutor", None),
    ("leasehold", "SQLiteExecutor", None),
    ("leasehold", "PostgresExecutor", None),
    ("leasehold", "RedisExecutor", None),
    ("leasehold", "EtcdExecutor", None),
    ("leasehold.client", "Lease", "LockHandle"),
    ("leasehold.aio", "AsyncLease", "AsyncLockHandle"),
    ("leasehold.backends", "MemoryService", "MemoryStore"),
    ("leasehold.backends", "MemoryExecutor", "MemoryLockService"),
    ("leasehold.backends.memory", "MemoryService", "MemoryStore"),
    ("leasehold.backends.memory", "MemoryExecutor", "MemoryLockService"),
    ("leasehold.backends.sql_executor", "SQLiteExecutor", "SqliteExecutor"),
    ("leasehold.testing", "MemoryService", "MemoryStore"),
    ("leasehold.testing", "MemoryExecutor", "MemoryLockService"),
    ("leasehold.testing", "MemoryExecutor", "FaultyMemoryService"),
]


@pytest.mark.parametrize("module, name, first", NAMES, ids=[f"{m}.{n}" for m, n, _ in NAMES])
def test_the_shared_name_and_its_first_name_are_one_object(module: str, name: str, first: str | None) -> None:
    mod = importlib.import_module(module)
    obj = getattr(mod, name)
    assert isinstance(obj, type), obj
    if first is not None:
        assert getattr(mod, first) is obj
    if module != "leasehold" or name in leasehold.__all__:  # the top level lists only its own
        assert name in getattr(mod, "__all__", [name])


def test_the_top_level_executors_are_the_backend_modules_classes() -> None:
    from leasehold.backends.etcd_executor import EtcdExecutor
    from leasehold.backends.memory import MemoryExecutor, MemoryService
    from leasehold.backends.redis_executor import RedisExecutor
    from leasehold.backends.sql_executor import PostgresExecutor, SQLiteExecutor

    assert leasehold.EtcdExecutor is EtcdExecutor
    assert leasehold.MemoryExecutor is MemoryExecutor
    assert leasehold.MemoryService is MemoryService
    assert leasehold.RedisExecutor is RedisExecutor
    assert leasehold.PostgresExecutor is PostgresExecutor
    assert leasehold.SQLiteExecutor is SQLiteExecutor


def test_a_lease_is_what_acquire_returns_under_both_names() -> None:
    from leasehold import Lease, LockClient, LockHandle
    from leasehold.backends.memory import MemoryExecutor

    with LockClient(MemoryExecutor()) as client:
        with client.acquire("names", ttl=5) as h:
            assert type(h) is Lease and isinstance(h, LockHandle)
            assert repr(h).startswith("<Lease name='names' state=held")


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'Leese'"):
        leasehold.Leese  # noqa: B018
