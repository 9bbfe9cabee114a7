"""Every Redis executor, under every name, in both clients on a real redis-server: a
synchronous one in ``AsyncLockClient`` runs its IO in worker threads; an asyncio one in
``LockClient`` is refused with an error naming its synchronous twin."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, Callable

import pytest
import redis

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from either_client import in_both_clients, refused_by_lock_client  # noqa: E402

from leasehold import AsyncLockClient  # noqa: E402
from leasehold.backends.redis import RedisLockService  # noqa: E402
from leasehold.backends.redis_async import AsyncRedisLockService  # noqa: E402
from leasehold.backends.redis_cluster_executor import RedisClusterExecutor  # noqa: E402
from leasehold.backends.redis_cluster_executor_async import AsyncRedisClusterExecutor  # noqa: E402
from leasehold.backends.redis_executor import RedisExecutor  # noqa: E402
from leasehold.backends.redis_executor_async import AsyncRedisExecutor  # noqa: E402

SYNC: dict[str, Callable[[str], Any]] = {
    "RedisLockService.from_url": RedisLockService.from_url,
    "RedisLockService(client)": lambda url: RedisLockService(redis.Redis.from_url(url), owns_client=True),
    "RedisExecutor(url=)": lambda url: RedisExecutor(url=url),
}


@pytest.mark.parametrize("how", sorted(SYNC))
def test_sync_redis_executor_in_both_clients(how: str, r: redis.Redis, redis_server: Any) -> None:
    in_both_clients(lambda: SYNC[how](redis_server.url), "either")  # r: a flushed server


def test_the_async_service_of_the_issue_grants_and_closes(redis_server: Any) -> None:
    """``AsyncLockClient(RedisLockService.from_url(url))``: the combination the README names."""

    async def main() -> int:
        client = AsyncLockClient(RedisLockService.from_url(redis_server.url))
        h = await client.acquire("issue", ttl=5)
        token = h.fencing_token
        assert await h.release() == "released"
        await client.close()  # must not raise
        assert client.closed
        return token

    assert asyncio.run(main()) > 0


@pytest.mark.parametrize(
    "make, twin",
    [
        (lambda url: AsyncRedisExecutor(url=url), "leasehold.backends.redis_executor.RedisExecutor"),
        (lambda url: AsyncRedisLockService.from_url(url), "leasehold.backends.redis.RedisLockService"),
    ],
    ids=["AsyncRedisExecutor", "AsyncRedisLockService"],
)
def test_async_redis_executor_is_refused_by_lock_client(make: Any, twin: str, redis_server: Any) -> None:
    refused_by_lock_client(make(redis_server.url), twin)


def test_sentinel_executor_in_both_clients(redis_bin: str, tmp_path: Any) -> None:
    from lh_sentinel import SentinelTopology

    t = SentinelTopology(tmp_path / "sentinel").start()
    try:
        in_both_clients(lambda: RedisExecutor(url=t.url), "either-sentinel")
    finally:
        t.stop()


def test_sentinel_byte_path_in_both_clients(redis_bin: str, tmp_path: Any) -> None:
    """``from_url("redis+sentinel://…")``: the core asks the sentinels, in both clients (the
    asyncio one on the loop's transports)."""
    from lh_sentinel import SentinelTopology

    t = SentinelTopology(tmp_path / "sentinel").start()
    try:
        in_both_clients(lambda: RedisLockService.from_url(t.url), "either-sentinel-bytes")
    finally:
        t.stop()


def test_cluster_executor_in_both_clients(redis_bin: str, tmp_path: Any) -> None:
    from lh_cluster import ClusterTopology

    t = ClusterTopology(tmp_path / "cluster").start()
    try:
        in_both_clients(lambda: RedisClusterExecutor(url=t.url), "either-cluster")
        refused_by_lock_client(
            AsyncRedisClusterExecutor(url=t.url), "leasehold.backends.redis_cluster_executor.RedisClusterExecutor"
        )
    finally:
        t.stop()


def test_a_sync_executors_subscriber_traffic_is_fed_on_the_loop(redis_server: Any, monkeypatch: Any) -> None:
    """The reader thread of ``RedisExecutor`` hands its messages to the loop: every core input
    they become (subscription confirmations, the wake-up of the handoff) is fed on the loop's
    thread."""
    import threading

    from leasehold import _core

    seen: list[tuple[str, str]] = []
    for kind in ("message", "subscription"):
        real = getattr(_core.Core, kind)

        def record(self: Any, *args: Any, _real: Any = real, _kind: str = kind) -> None:
            seen.append((_kind, threading.current_thread().name))
            _real(self, *args)

        monkeypatch.setattr(_core.Core, kind, record)
    from either_client import handoff_async

    handoff_async(lambda: RedisExecutor(url=redis_server.url), "either-loop")
    kinds = {k for k, _ in seen}
    assert {"message", "subscription"} <= kinds, seen  # the wake-up and the SUBSCRIBE confirmations
    assert {t for _, t in seen} == {threading.main_thread().name}, seen
