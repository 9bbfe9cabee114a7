"""Release outcomes and manual renewal against a real redis-server, both clients."""

from __future__ import annotations

import asyncio

import pytest

from leasehold import LockClient, LockLost, LockNotHeld, ReleaseOutcome
from leasehold.aio import AsyncLockClient
from leasehold.backends.redis import RedisLockService
from leasehold.backends.redis_async import AsyncRedisLockService
from lh_keys import keys_for


def service(url: str) -> RedisLockService:
    return RedisLockService.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)


def test_release_outcomes_on_redis(redis_server, r):  # type: ignore[no-untyped-def]
    with LockClient(service(redis_server.url)) as a, LockClient(service(redis_server.url)) as b:
        h = a.acquire("clean", ttl=10)
        assert h.release() is ReleaseOutcome.RELEASED
        assert not r.exists(keys_for("clean").lock)
        ha = a.acquire("taken", ttl=10)
        r.delete(keys_for("taken").lock)  # our grant is gone on the server ...
        hb = b.acquire("taken", ttl=10)  # ... and someone else holds the lock now
        assert hb.fencing_token > ha.fencing_token
        assert ha.release() is ReleaseOutcome.NOT_OWNER
        assert ha.release() == "not_owner"
        assert r.exists(keys_for("taken").lock), "the new holder's lock is untouched"
        assert hb.release() == "released"
        n = a.counters()
        assert n.releases_confirmed == 1 and n.releases_not_owner == 1


def test_manual_renew_on_redis(redis_server, r):  # type: ignore[no-untyped-def]
    with LockClient(service(redis_server.url)) as c:
        h = c.acquire("man", ttl=30, auto_renew=False)
        key = keys_for("man").lock
        r.pexpire(key, 5_000)  # shortened on the server: a renewal restores the full TTL
        before = h.valid_until
        assert before is not None
        after = h.renew(timeout=10)
        assert after >= before and after == h.valid_until
        assert r.pttl(key) > 20_000
        assert c.counters().renewals_requested == 1
        h.release()
        calls = c.counters()
        with pytest.raises(LockNotHeld):
            h.renew()
        assert c.counters().renewals_sent == calls.renewals_sent


def test_async_release_outcomes_and_renew_on_redis(redis_server, r):  # type: ignore[no-untyped-def]
    async def main() -> None:
        def svc() -> AsyncRedisLockService:
            return AsyncRedisLockService.from_url(redis_server.url, socket_timeout=1.0, socket_connect_timeout=1.0)

        async with AsyncLockClient(svc()) as a, AsyncLockClient(svc()) as b:
            h = await a.acquire("clean", ttl=10, auto_renew=False)
            r.pexpire(keys_for("clean").lock, 5_000)
            await h.renew(timeout=10)
            assert r.pttl(keys_for("clean").lock) > 5_000
            assert await h.release() is ReleaseOutcome.RELEASED
            with pytest.raises(LockNotHeld) as ei:
                await h.renew()
            assert not isinstance(ei.value, LockLost)
            ha = await a.acquire("taken", ttl=10)
            r.delete(keys_for("taken").lock)
            hb = await b.acquire("taken", ttl=10)
            assert await ha.release() is ReleaseOutcome.NOT_OWNER
            assert await hb.release() is ReleaseOutcome.RELEASED

    asyncio.run(asyncio.wait_for(main(), 60))
