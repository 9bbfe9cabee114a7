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


def run_workers(code: str, args: list[str], workers: int, bound: float) -> None:
    """Start ``workers`` copies of ``code``; once all print ``ready``, send each ``go`` and
    check that each exits 0 after printing ``done``. Stragglers are killed."""
    procs = [spawn_python(code, *args, stdin=subprocess.PIPE) for _ in range(workers)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdin is not None
            assert p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr else ""
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            out, err = p.communicate(timeout=bound)
            assert p.returncode == 0, err
            assert out.strip() == "done"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


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
