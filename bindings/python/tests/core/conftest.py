"""Fixtures of the core binding tests: a fake clock, a memory store, clients on it."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # core_helpers

from core_helpers import Recording  # noqa: E402

from leasehold import LockClient
from leasehold.testing import FakeClock, MemoryLockService, MemoryStore


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(clock=clock)


MakeClient = Callable[..., LockClient]


@pytest.fixture
def make_client(clock: FakeClock, store: MemoryStore) -> Iterator[MakeClient]:
    """``make_client(**kwargs)`` → a LockClient on its own connection to ``store`` (a
    :class:`core_helpers.Recording` executor unless one is given)."""
    made: list[LockClient] = []

    def make(service: MemoryLockService | None = None, **kwargs: Any) -> LockClient:
        svc = service if service is not None else Recording(store)
        kwargs.setdefault("clock", clock)
        c = LockClient(svc, **kwargs)
        made.append(c)
        return c

    yield make
    for c in made:
        svc = c.service
        if isinstance(svc, MemoryLockService):
            svc.heal()
        c.close(timeout=2.0)
