"""The memory service in both clients (the other backends' tables are in tests/redis, tests/sql
and tests/etcd: ``test_*_either_client.py``); what either client refuses, and how."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from either_client import in_both_clients  # noqa: E402

from leasehold import AsyncLockClient, LockClient  # noqa: E402
from leasehold.backends.memory import MemoryLockService, MemoryStore  # noqa: E402
from leasehold.backends.sql_executor import SqliteExecutor  # noqa: E402
from leasehold.service import AsyncLockService, Granted, HeldByOther, LockService  # noqa: E402


def test_memory_service_in_both_clients() -> None:
    store = MemoryStore()
    in_both_clients(lambda: MemoryLockService(store), "either")


class _AsyncOnly(AsyncLockService):
    async def acquire(self, name: str, token: str, ttl_ms: int) -> Granted | HeldByOther:
        return Granted(1, ttl_ms)

    async def renew(self, name: str, token: str, ttl_ms: int, backend_data: bytes) -> bool:
        return True

    async def release(self, name: str, token: str, backend_data: bytes) -> bool:
        return True


class _OwnService(LockService):
    def acquire(self, name: str, token: str, ttl_ms: int) -> Granted | HeldByOther:
        return Granted(1, ttl_ms)

    def renew(self, name: str, token: str, ttl_ms: int, backend_data: bytes) -> bool:
        return True

    def release(self, name: str, token: str, backend_data: bytes) -> bool:
        return True


_EXECUTORS = "MemoryExecutor, SQLiteExecutor"


@pytest.mark.parametrize("client", [LockClient, AsyncLockClient])
@pytest.mark.parametrize("thing, says", [
    (_AsyncOnly(), "_AsyncOnly is a LockService of its own: a client drives an executor"),
    (_OwnService(), "_OwnService is a LockService of its own: a client drives an executor"),
    (object(), "service must be a backend executor (MemoryExecutor, SQLiteExecutor, RedisExecutor, ...), not object"),
])
def test_either_client_refuses_what_it_cannot_drive_and_names_the_executors(client: Any, thing: Any, says: str) -> None:
    with pytest.raises(TypeError) as e:
        client(thing)
    assert says in str(e.value) and _EXECUTORS in str(e.value)


class _Overriding(SqliteExecutor):
    """Code written for the earlier services: these are never called on an executor."""

    def acquire(self, name: str, token: str, ttl_ms: int) -> Any:
        raise AssertionError("never called")

    def release(self, name: str, token: str, backend_data: bytes) -> Any:
        raise AssertionError("never called")


def test_an_executor_subclass_overriding_acquire_is_warned_about(tmp_path: Any) -> None:
    with pytest.warns(RuntimeWarning, match=r"_Overriding is a backend executor.*never calls its acquire/release\(\)"):
        client = LockClient(_Overriding(str(tmp_path / "l.db")))
    with client:
        with client.acquire("x", ttl=5) as h:  # the core's protocol ran, not the overrides
            assert h.fencing_token > 0


def test_a_plain_executor_is_not_warned_about(tmp_path: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LockClient(SqliteExecutor(str(tmp_path / "l.db"))).close()
