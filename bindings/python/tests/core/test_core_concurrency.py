"""Many threads in several clients contend for one name while the fake clock stands still.

With time frozen, no lease expires and no backoff or retry hint ever elapses: only release
notifications can move a waiter forward. So every acquisition completing proves there is no
lost wake-up (python-redis-lock #71), and the critical sections must be strictly serial.
"""

from __future__ import annotations

import threading

from leasehold import LockClient
from leasehold.testing import FakeClock, MemoryLockService, MemoryStore

CLIENTS = 3
THREADS_PER_CLIENT = 3
ROUNDS = 5


def test_contention_with_frozen_clock_is_serial_and_never_stalls() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    clients = [LockClient(MemoryLockService(store), clock=clock) for _ in range(CLIENTS)]
    inside = 0
    overlaps = 0
    tokens: list[int] = []
    errors: list[BaseException] = []
    guard = threading.Lock()

    def worker(c: LockClient) -> None:
        nonlocal inside, overlaps
        try:
            for _ in range(ROUNDS):
                with c.acquire("hot", ttl=10, wait=1_000) as h:
                    with guard:
                        inside += 1
                        overlaps += inside > 1
                        tokens.append(h.fencing_token)
                    with guard:
                        inside -= 1
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [
        threading.Thread(target=worker, args=(c,), daemon=True) for c in clients for _ in range(THREADS_PER_CLIENT)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert not any(t.is_alive() for t in threads), "a waiter stalled: lost wake-up"
        assert errors == []
        assert overlaps == 0
        assert len(tokens) == CLIENTS * THREADS_PER_CLIENT * ROUNDS
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    finally:
        for c in clients:
            c.close(timeout=1)


def test_async_contention_with_frozen_clock_never_stalls() -> None:
    import asyncio

    from leasehold import AsyncLockClient

    async def main() -> list[int]:
        clock = FakeClock()
        store = MemoryStore(clock=clock)
        clients = [AsyncLockClient(MemoryLockService(store), clock=clock) for _ in range(CLIENTS)]
        tokens: list[int] = []
        inside = 0

        async def worker(c: AsyncLockClient) -> None:
            nonlocal inside
            for _ in range(ROUNDS):
                async with c.acquire("hot", ttl=10, wait=1_000) as h:
                    inside += 1
                    assert inside == 1
                    tokens.append(h.fencing_token)
                    await asyncio.sleep(0)
                    inside -= 1

        try:
            await asyncio.wait_for(
                asyncio.gather(*(worker(c) for c in clients for _ in range(THREADS_PER_CLIENT))), 90
            )
        finally:
            for c in clients:
                await c.close(timeout=1)
        return tokens

    tokens = asyncio.run(main())
    assert len(tokens) == CLIENTS * THREADS_PER_CLIENT * ROUNDS
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
