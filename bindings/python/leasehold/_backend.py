"""The request model, shared by ``LockClient`` and ``AsyncLockClient``.

A client drives its core in one of two ways:

* a **service** (:class:`~leasehold.service.LockService`, the memory and SQLite backends):
  the core's commands (acquire, renew, release, watch) become service calls;
* a **backend executor** (the Redis executor): the core speaks the backend's protocol
  itself, and the executor only runs the requests it polls (``lh_poll_request``), verbatim,
  on the connection each names, handing back raw replies, pub/sub messages and subscription
  changes. An executor declares ``backend_protocol = "redis"`` and ``options`` (the core's
  protocol options), and has ``attach()`` / ``detach()`` (one client at a time),
  ``command(argv)`` (the raw reply; raises on a transport failure) and
  ``subscriber(argv, sink)``; the asyncio twin has the same with ``async`` calls.

This module is the part of the request model both clients share: polling requests, turning
an executor's result into the core input to feed, and the sink of the subscriber traffic.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, Callable

from . import _ffi
from ._core import Core

__all__ = ["backend_of", "run_requests", "execute_request", "execute_request_async", "BackendSink"]

log = logging.getLogger("leasehold")

_SUBSCRIBER = _ffi.LH_CONNECTION_SUBSCRIBER


def backend_of(service: object) -> Any:
    """``service`` when it is a backend executor, else ``None``."""
    return service if getattr(service, "backend_protocol", None) == "redis" else None


def run_requests(core: Core, submit: Callable[[int, int, list[bytes]], None]) -> None:
    """Hand every pending request to ``submit(id, connection, argv)``."""
    for rid, connection, argv in core.poll_requests():
        submit(rid, connection, argv)


def _result(core: Core, rid: int, reply: Any) -> Callable[[], None]:
    return partial(core.reply, rid, reply)


def _failed(core: Core, rid: int, argv: list[bytes], e: BaseException) -> Callable[[], None]:
    log.warning("leasehold: backend request %s failed (transport error): %s", argv[0][:16].decode("ascii", "replace"), e)
    return partial(core.request_failed, rid)


def execute_request(
    core: Core, executor: Any, sink: "BackendSink", rid: int, connection: int, argv: list[bytes]
) -> Callable[[], None] | None:
    """(IO thread) Run one request with a sync executor; the input to feed, ``None`` when the
    answer comes through the sink (a subscriber request's confirmation)."""
    try:
        if connection == _SUBSCRIBER:
            executor.subscriber(argv, sink)
            return None
        return _result(core, rid, executor.command(argv))
    except Exception as e:
        return _failed(core, rid, argv, e)


async def execute_request_async(
    core: Core, executor: Any, sink: "BackendSink", rid: int, connection: int, argv: list[bytes]
) -> Callable[[], None] | None:
    """The asyncio twin of :func:`execute_request`."""
    try:
        if connection == _SUBSCRIBER:
            await executor.subscriber(argv, sink)
            return None
        return _result(core, rid, await executor.command(argv))
    except Exception as e:
        return _failed(core, rid, argv, e)


class BackendSink:
    """Passes the subscriber connection's traffic to the core through ``feed(fn)`` (which
    serializes it with the client's other core calls)."""

    def __init__(self, core: Core, feed: Callable[[Callable[[], None]], None]) -> None:
        self._core = core
        self._feed = feed

    def message(self, channel: bytes, payload: bytes) -> None:
        self._feed(partial(self._core.pubsub_message, channel, payload))

    def subscription(self, channel: bytes, subscribed: bool) -> None:
        self._feed(partial(self._core.subscription, channel, subscribed))
