"""Helpers shared by the SQLite backend tests (no pytest fixtures here, see conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

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
    """Poll ``pred`` until truthy; fail the test after ``bound`` seconds."""
    deadline = time.monotonic() + bound
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {bound}s")
        time.sleep(step)


class FakeClock:
    """A monotonic clock in ns that only moves when told to."""

    def __init__(self, start: int = 1_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance_ms(self, ms: int) -> None:
        self.now += ms * 1_000_000
