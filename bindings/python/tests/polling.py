"""The one polling helper of the Python tests: wait for a condition with a generous bound.

The bound only turns a hang into a failure; it is never a timing assertion."""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_until(pred: Callable[[], Any], bound: float = 60.0, step: float = 0.02, what: str = "condition") -> Any:
    """Poll ``pred`` until truthy and return its value; fail the test after ``bound`` seconds."""
    deadline = time.monotonic() + bound
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {bound}s")
        time.sleep(step)
