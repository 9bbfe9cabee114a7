"""One scenario, run by every backend's tests in both clients: the same executor (or
service) class must work in ``LockClient`` and in ``AsyncLockClient``, or be refused by the
constructor with an error that names the class to use (no helper fixtures here)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

from leasehold import AsyncLockClient, LockClient, LockTimeout

BOUND = 30.0  # generous: a bound for waits, never a timing assertion


def handoff_sync(make: Callable[[], Any], name: str, released: tuple[str, ...] = ("released",)) -> tuple[int, int]:
    """A holds ``name``; B waits for it and is granted once A releases. Returns both fences.
    ``released``: the release outcomes the backend may report."""
    with LockClient(make()) as a, LockClient(make()) as b:
        ha = a.acquire(name, ttl=10)
        try:
            b.acquire(name, ttl=10)
        except LockTimeout:
            pass
        else:
            raise AssertionError("B was granted a lock A holds")
        got: dict[str, Any] = {}

        def wait_for_it() -> None:
            try:
                got["h"] = b.acquire(name, ttl=10, wait=BOUND)
            except BaseException as e:  # reported below
                got["e"] = e

        t = threading.Thread(target=wait_for_it)
        t.start()
        out = ha.release()
        assert out in released, (out, ha.lost_reason, a.backend_last_error())
        t.join(BOUND + 15)
        assert not t.is_alive(), "B's acquire did not end"
        assert "e" not in got, got.get("e")
        hb = got["h"]
        assert hb.is_held()
        fences = (ha.fencing_token, hb.fencing_token)
        out = hb.release()
        assert out in released, (out, hb.lost_reason, b.backend_last_error())
    return fences


async def _handoff_async(make: Callable[[], Any], name: str, released: tuple[str, ...]) -> tuple[int, int]:
    async with AsyncLockClient(make()) as a, AsyncLockClient(make()) as b:
        ha = await a.acquire(name, ttl=10)
        try:
            await b.acquire(name, ttl=10)
        except LockTimeout:
            pass
        else:
            raise AssertionError("B was granted a lock A holds")
        waiting = asyncio.ensure_future(b.acquire(name, ttl=10, wait=BOUND))
        await asyncio.sleep(0.05)  # let B queue up (the scenario holds either way)
        out = await ha.release()
        assert out in released, (out, ha.lost_reason, a.backend_last_error())
        hb = await asyncio.wait_for(waiting, BOUND + 15)
        assert hb.is_held()
        fences = (ha.fencing_token, hb.fencing_token)
        out = await hb.release()
        assert out in released, (out, hb.lost_reason, b.backend_last_error())
    return fences


def handoff_async(make: Callable[[], Any], name: str, released: tuple[str, ...] = ("released",)) -> tuple[int, int]:
    """As :func:`handoff_sync`, in two ``AsyncLockClient`` s (``close()`` must not raise)."""
    return asyncio.run(_handoff_async(make, name, released))


def in_both_clients(make: Callable[[], Any], name: str, released: tuple[str, ...] = ("released",)) -> None:
    """The scenario in the threaded client, then in the asyncio one, on fresh executors:
    fences strictly increase across all four grants."""
    f1 = handoff_sync(make, name, released)
    f2 = handoff_async(make, name, released)
    fences = [*f1, *f2]
    assert fences == sorted(set(fences)), fences


def refused_by_lock_client(async_one: Any, twin: str) -> str:
    """``LockClient(async_one)`` raises ``TypeError`` naming ``twin`` and ``AsyncLockClient``."""
    try:
        LockClient(async_one)
    except TypeError as e:
        msg = str(e)
    else:
        raise AssertionError(f"LockClient accepted {type(async_one).__name__}")
    assert twin in msg and "AsyncLockClient" in msg, msg
    return msg
