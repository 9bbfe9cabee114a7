"""The Redis key layout the core writes (``docs/redis-protocol.md``), for tests that look at or
plant keys on the server. Library code never needs it: the core owns the keys."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Keys:
    lock: str  # hash {token, fence} with the lease's expiry
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
    r.hset(k.lock, mapping={"token": uuid.uuid4().hex, "fence": fence})
    r.pexpire(k.lock, ttl_ms)
    return fence
