"""The Redis key layout the core writes (``docs/redis-protocol.md``), for tests that look at or
plant keys on the server. Library code never needs it: the core owns the keys."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Keys:
    lock: str  # "FENCE MARK TOKEN" with the lease's expiry (MARK 1: someone queued)
    fence: str  # the last fence, decimal text, expiring some time after the lease
    queue: str  # zset of waiting clients' entries


def keys_for(name: str) -> Keys:
    base = "lh:{" + name + "}"
    return Keys(base, base + ":fence", base + ":queue")


def plant_holder(r: Any, name: str, ttl_ms: int = 60_000) -> int:
    """Make ``name`` held by a token no client owns (as a crashed holder leaves it), with a
    time-based fence as the core would grant; returns that fence."""
    k = keys_for(name)
    fence = max(int(r.get(k.fence) or 0) + 1, time.time_ns() // 1000)
    r.set(k.fence, fence, px=ttl_ms + 60_000)
    r.set(k.lock, f"{fence} 0 {uuid.uuid4().hex}", px=ttl_ms)
    return fence


def holder_of(r: Any, name: str) -> tuple[int, str] | None:
    """The fence and token of ``name``'s holder, or None if it is free."""
    v = r.get(keys_for(name).lock)
    if v is None:
        return None
    if isinstance(v, bytes):
        v = v.decode()
    fence, _mark, token = v.split(" ", 2)
    return int(fence), token
