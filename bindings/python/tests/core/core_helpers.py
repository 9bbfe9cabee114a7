"""Helpers of the core binding tests (imported as ``core_helpers``)."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from leasehold import Config, LockClient
from leasehold.testing import MemoryExecutor, MemoryLockService


class Recording(MemoryExecutor):
    """A memory executor that records each call it hands to the service: its first word
    (``ACQUIRE``, ``RENEW``, ``RELEASE``, ``WATCH``... — the words of the core's memory
    protocol, src/backend/memory.rs; test instrumentation only: the binding never reads
    them) and the thread that ran it.

    ``calls[op]`` counts calls by lowercased word, ``called[op]`` is set once one was made,
    ``tokens`` are the ownership tokens of the acquires, in order, and ``log`` is
    ``(op, thread name)`` per call."""

    def __init__(self, store: Any = None, *, call_timeout: Any = None, **kwargs: Any) -> None:
        super().__init__(store, **kwargs)
        if call_timeout is not None:
            self.call_timeout = call_timeout
        self.calls: collections.Counter[str] = collections.Counter()
        self.called: collections.defaultdict[str, threading.Event] = collections.defaultdict(threading.Event)
        self.tokens: list[str] = []
        self.log: list[tuple[str, str]] = []
        self.log_cond = threading.Condition()

    def command(self, argv: list[bytes]) -> Any:
        op = argv[0].decode("ascii", "replace").lower() if argv else ""
        with self.log_cond:
            self.calls[op] += 1
            if op == "acquire" and len(argv) > 2:
                self.tokens.append(argv[2].decode("ascii", "replace"))
            self.log.append((op, threading.current_thread().name))
            self.log_cond.notify_all()
        self.called[op].set()
        return super().command(argv)

    def ops(self, *only: str) -> list[str]:
        """The calls made, by word, in order (``only`` those words when given)."""
        with self.log_cond:
            return [o for o, _ in self.log if not only or o in only]

    def threads_of(self, op: str) -> list[str]:
        with self.log_cond:
            return [t for o, t in self.log if o == op]

    def wait_calls(self, op: str, n: int, timeout: float = 10.0) -> bool:
        """Wait until ``n`` calls of ``op`` were made."""
        with self.log_cond:
            return self.log_cond.wait_for(lambda: self.calls[op] >= n, timeout)


def svc(client: LockClient) -> Recording:
    s = client.service
    assert isinstance(s, Recording), type(s)
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
