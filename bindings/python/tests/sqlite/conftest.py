from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # sqlite_helpers

from leasehold.backends.sqlite import SQLiteLockService  # noqa: E402


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "locks.sqlite3"


@pytest.fixture
def open_service(db_path: Path) -> Iterator[object]:
    """Factory: ``open_service(**kwargs)`` → a service on ``db_path``, closed after the test.

    The wall clock that fences are minted from is pinned to 0 unless a test passes its own,
    so fences count 1, 2, 3 … and tests can name them."""
    made: list[SQLiteLockService] = []

    def make(path: Path | None = None, **kwargs: object) -> SQLiteLockService:
        kwargs.setdefault("wall_clock", lambda: 0)
        svc = SQLiteLockService(path or db_path, **kwargs)  # type: ignore[arg-type]
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.close()
