"""Helpers shared by the SQLite backend tests (no pytest fixtures here, see conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
import polling  # noqa: E402

BOUND = 60.0  # generous bound for anything that waits: never a timing assertion


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.pop("PYTHONSTARTUP", None)
    return env


def spawn_python(code: str, *args: str, **kw: Any) -> subprocess.Popen[str]:
    """Start ``python -c code args…`` with this interpreter and this test's import path."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def wait_until(pred: Callable[[], Any], bound: float = BOUND, step: float = 0.02) -> Any:
    return polling.wait_until(pred, bound, step)


class FakeClock:
    """A monotonic clock in ns that only moves when told to."""

    def __init__(self, start: int = 1_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance_ms(self, ms: int) -> None:
        self.now += ms * 1_000_000
