"""Helpers of the core binding tests (imported as ``core_helpers``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from leasehold import Config, LockClient
from leasehold.testing import MemoryLockService


def svc(client: LockClient) -> MemoryLockService:
    s = client.service
    assert isinstance(s, MemoryLockService)
    return s


class Result:
    """Runs ``fn`` on a thread and keeps its return value or exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()

        def run() -> None:
            try:
                self.value = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the test
                self.error = e
            finally:
                self.done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def get(self, timeout: float = 10.0) -> Any:
        assert self.done.wait(timeout), "background call did not finish"
        if self.error is not None:
            raise self.error
        return self.value


def small_config(**kw: Any) -> Config:
    return Config(**kw)
