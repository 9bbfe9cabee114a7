"""Argument validation shared by the sync and async clients."""

from __future__ import annotations

import datetime
import math
from typing import Any

__all__ = ["check_name", "seconds", "ttl_to_ms", "wait_budget"]

_U64_MAX = 2**64 - 1


def check_name(name: Any) -> str:
    """A lock name: a non-empty ``str`` (the core checks length, NUL and UTF-8)."""
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("lock name must not be empty")
    return name


def seconds(value: Any, what: str) -> float:
    """A duration in seconds (``int``, ``float`` or ``timedelta``), finite and >= 0."""
    t = type(value)
    if (t is float or t is int) and 0 <= value < math.inf:  # the usual case in one test
        return float(value)
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds (int, float or timedelta), not {type(value).__name__}")
    v = float(value)
    if math.isnan(v) or math.isinf(v):
        raise ValueError(f"{what} must be finite, got {value!r}")
    if v < 0:
        raise ValueError(f"{what} must not be negative, got {value!r}")
    return v


def ttl_to_ms(ttl: Any) -> int:
    """TTL seconds → whole milliseconds (at least 1 ms; the core enforces its own minimum)."""
    v = seconds(ttl, "ttl")
    ms = round(v * 1000)
    if ms <= 0:
        raise ValueError(f"ttl must be at least 1 ms, got {ttl!r}")
    if ms > _U64_MAX:
        raise ValueError(f"ttl is too large: {ttl!r}")
    return ms


def wait_budget(wait: Any) -> tuple[float, int]:
    """A wait budget in seconds and in nanoseconds (one validation for both)."""
    s = seconds(wait, "wait")
    ns = round(s * 1e9)
    if ns > _U64_MAX:
        raise ValueError(f"wait is too large (at most about 584 years): {wait!r}")
    return s, ns
