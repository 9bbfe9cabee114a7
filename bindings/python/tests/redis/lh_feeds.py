"""Counts how a client hands bytes read to its core: fed alone, or with the drain."""

from __future__ import annotations

from typing import Any


def count_feeds(core: Any) -> tuple[list[int], list[int]]:
    """Counts, on ``core``, bytes fed alone (``stream_received``) and bytes fed with a drain
    (``step(stream, data)``)."""
    alone: list[int] = []
    drained: list[int] = []
    received, step = core.stream_received, core.step

    def received_alone(stream: int, data: bytes) -> None:
        alone.append(len(data))
        received(stream, data)

    def step_with(stream: int = 0, data: bytes | None = None) -> Any:
        if data is not None:
            drained.append(len(data))
        return step(stream, data)

    core.stream_received, core.step = received_alone, step_with
    return alone, drained
