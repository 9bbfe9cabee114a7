"""The driver both clients share: what each core output means, and how a service's answer
becomes the core's input.

:class:`Driver` is the part of :class:`~leasehold.client.LockClient` and
:class:`~leasehold.aio.AsyncLockClient` that does not depend on how a caller waits (a thread
on an event, a task on a future). The threads are :mod:`leasehold._threaded`, the event loop
:mod:`leasehold.aio`; each provides the waiting: ``_submit_command(out)``
runs an acquire/renew/release command with the service, ``_granted(h)`` wakes the acquire()
caller of a handle just granted, ``_start_watch(name)`` / ``_stop_watch(name)`` run the
service's watch calls, ``_input(fn, *args)`` feeds one input to the core, ``_serial()`` is
the context that serializes core calls (the client mutex; nothing on the loop).
"""

from __future__ import annotations

import contextlib
import logging
from functools import partial
from typing import Any, Callable, ContextManager

from . import _ffi, errors
from ._args import check_name, ttl_to_ms, wait_budget
from ._core import Counters, Output
from ._lease import LeaseLifecycle
from .service import Granted, HeldByOther

__all__ = ["Driver", "service_call", "service_input", "transport_error_input", "IDLE_TICK_NS"]

log = logging.getLogger("leasehold")

_ACQUIRING, _HELD = "acquiring", "held"
_COMMANDS = (_ffi.LH_OUTPUT_ACQUIRE, _ffi.LH_OUTPUT_RENEW, _ffi.LH_OUTPUT_RELEASE)
_KIND_NAMES = {_ffi.LH_OUTPUT_ACQUIRE: "acquire", _ffi.LH_OUTPUT_RENEW: "renew", _ffi.LH_OUTPUT_RELEASE: "release"}

# The longest a driver sleeps without a deadline before it sleeps for ever: in a loop of
# acquire/release cycles the core has no deadline between two cycles, and a driver asleep for
# ever would have to be woken by the next cycle's first deadline.
IDLE_TICK_NS = 500_000_000


# -- a service's commands ------------------------------------------------------------------------
def service_call(service: Any, out: Output) -> Any:
    """Call the service for one command: its answer, or an awaitable of it (asyncio)."""
    if out.kind == _ffi.LH_OUTPUT_ACQUIRE:
        return service.acquire(out.name, out.token, out.ttl_ms)
    if out.kind == _ffi.LH_OUTPUT_RENEW:
        return service.renew(out.name, out.token, out.ttl_ms, out.backend_data)
    return service.release(out.name, out.token, out.backend_data)


def _grant(core: Any, req: int, r: Granted) -> None:
    """(input) Feed a grant; one the core refuses counts as a transport error."""
    try:
        core.acquire_result(req, _ffi.LH_ACQUIRE_GRANTED, r.fencing_token, r.ttl_ms, None, bytes(r.backend_data))
    except (errors.InvalidArgument, TypeError, ValueError) as e:
        log.error("leasehold: the service returned an invalid grant %r (%s); treated as a transport error", r, e)
        core.acquire_result(req, _ffi.LH_ACQUIRE_TRANSPORT_ERROR)


def service_input(core: Any, out: Output, answer: Any) -> Callable[[], None]:
    """The core input for a service's ``answer`` to ``out``; ``TypeError`` for an answer of
    the wrong type (the caller treats it as a transport error)."""
    k, req = out.kind, out.request_id
    if k == _ffi.LH_OUTPUT_ACQUIRE:
        if isinstance(answer, Granted):
            return partial(_grant, core, req, answer)
        if isinstance(answer, HeldByOther):
            hint = answer.retry_after_ms
            if hint is not None and (isinstance(hint, bool) or not isinstance(hint, int) or hint < 0):
                hint = None
            return partial(core.acquire_result, req, _ffi.LH_ACQUIRE_HELD_BY_OTHER, retry_after_ms=hint)
        raise TypeError(f"acquire() returned {type(answer).__name__}, expected Granted or HeldByOther")
    if not isinstance(answer, bool):
        raise TypeError(f"{_KIND_NAMES.get(k, k)}() returned {type(answer).__name__}, expected bool")
    if k == _ffi.LH_OUTPUT_RENEW:
        return partial(core.renew_result, req, _ffi.LH_RENEW_RENEWED if answer else _ffi.LH_RENEW_REJECTED)
    # An application release's caller is woken by the RELEASE_OUTCOME this may emit.
    return partial(core.release_result, req, _ffi.LH_RELEASE_RELEASED if answer else _ffi.LH_RELEASE_NOT_OWNER)


def transport_error_input(core: Any, out: Output, e: BaseException | None = None) -> Callable[[], None]:
    """The core input for a command that failed in transport (logged when ``e`` is given)."""
    k, req = out.kind, out.request_id
    if e is not None:
        log.warning("leasehold: %s %r failed (transport error): %s", _KIND_NAMES.get(k, k), out.name, e)
    if k == _ffi.LH_OUTPUT_ACQUIRE:
        return partial(core.acquire_result, req, _ffi.LH_ACQUIRE_TRANSPORT_ERROR)
    if k == _ffi.LH_OUTPUT_RENEW:
        return partial(core.renew_result, req, _ffi.LH_RENEW_TRANSPORT_ERROR)
    return partial(core.release_result, req, _ffi.LH_RELEASE_TRANSPORT_ERROR)


def acquire_args(name: str, ttl: Any, wait: Any, reentrant: Any, on_lost: Any, auto_renew: Any) -> tuple[int, float, int]:
    """Check ``acquire()``'s arguments before the core is called: ``(ttl_ms, wait_s, wait_ns)``."""
    check_name(name)
    ttl_ms = ttl_to_ms(ttl)
    wait_s, wait_ns = wait_budget(wait)
    if not isinstance(reentrant, bool):
        raise TypeError("reentrant must be a bool")
    if on_lost is not None and not callable(on_lost):
        raise TypeError("on_lost must be callable or None")
    if not isinstance(auto_renew, bool):
        raise TypeError("auto_renew must be a bool")
    return ttl_ms, wait_s, wait_ns


class Driver(LeaseLifecycle):
    """Mixin: the dispatch of the core's outputs and the client queries, for both clients."""

    _backend: Any
    _requests: dict[int, tuple[int, int]]
    _watch_refs: dict[str, int]
    _core_watching: set[str]
    _subscribers: dict[str, list[Callable[[str], Any]]]
    _fatal: BaseException | None = None

    def _submit_command(self, out: Output) -> None: ...  # pragma: no cover - by the client

    def _granted(self, h: Any) -> None: ...  # pragma: no cover

    def _start_watch(self, name: str) -> None: ...  # pragma: no cover

    def _stop_watch(self, name: str) -> None: ...  # pragma: no cover

    def _input(self, fn: Callable[..., None], *args: Any) -> None: ...  # pragma: no cover

    def _serial(self) -> ContextManager[Any]:
        return contextlib.nullcontext()

    # -- outputs ---------------------------------------------------------------------------------
    def _dispatch(self, out: Output) -> None:
        k = out.kind
        if k in _COMMANDS:
            self._requests[out.request_id] = (k, out.lease_id)
            self._submit_command(out)
        elif k == _ffi.LH_OUTPUT_WATCH:
            if out.name not in self._core_watching:
                self._core_watching.add(out.name)
                self._watch_ref(out.name, +1)  # waiters share the release notifications
        elif k == _ffi.LH_OUTPUT_UNWATCH:
            if out.name in self._core_watching:
                self._core_watching.discard(out.name)
                self._watch_ref(out.name, -1)
        elif k == _ffi.LH_OUTPUT_ACQUIRED:
            for h in self._handles.get(out.lease_id, ()):
                if h._state == _ACQUIRING:
                    h._fencing_token = out.fencing_token
                    h._valid_until_ns = out.valid_until_ns
                    h._state = _HELD
                    self._granted(h)
        elif k == _ffi.LH_OUTPUT_ACQUIRE_FAILED:
            for h in self._handles.pop(out.lease_id, ()):
                if h._state == _ACQUIRING:
                    self._settle_error(h, self._acquire_error(h, out.reason))
        elif not self._lease_event(out):
            log.error("leasehold: unknown output kind %d", k)

    def _watch_ref(self, name: str, delta: int) -> None:
        """Reference-count watches (core waiters + on_release subscribers)."""
        before = self._watch_refs.get(name, 0)
        after = max(0, before + delta)
        if after:
            self._watch_refs[name] = after
        else:
            self._watch_refs.pop(name, None)
        if before == 0 and after > 0:
            self._start_watch(name)
        elif before > 0 and after == 0:
            self._stop_watch(name)

    def _deliver_notification(self, name: str) -> None:
        """A release notification of ``name``: wake one local waiter, run the subscribers."""
        if name in self._core_watching:
            self._input(self._core.released, name)
        for cb in list(self._subscribers.get(name, ())):
            self._callback(cb, name)

    def _check_subscribable(self, name: str, callback: Any) -> None:
        check_name(name)
        if not callable(callback):
            raise TypeError("callback must be callable")
        if self._backend is not None:
            raise errors.LeaseholdError("on_release is not available on a backend executor")

    # -- queries -----------------------------------------------------------------------------------
    def counters(self) -> Counters:
        """The core's counters (renewals sent/ok/failed, losses by reason, ...)."""
        with self._serial():
            if self._closed:
                raise errors.ClientClosed(f"the {self._kind} is closed")
            return self._core.counters()

    def backend_counters(self) -> dict[str, int]:
        """What the core's backend protocol saw (Redis: requests, script calls, wake-ups,
        standby takeovers, subscriber losses; etcd: requests, leases, watches...); empty for a
        service."""
        with self._serial():
            if self._closed:
                raise errors.ClientClosed(f"the {self._kind} is closed")
            return self._core.backend_counters() if self._backend is not None else {}

    def backend_last_error(self) -> str:
        """The last database error, refused schema, error reply or transport failure the
        core's backend protocol saw (SQL and etcd executors; empty otherwise)."""
        with self._serial():
            return "" if self._core.closed else self._core.backend_last_error()

    @property
    def closed(self) -> bool:
        """``True`` once ``close()`` has finished."""
        return self._closed

    _kind = "client"

    def _is_held(self, h: Any) -> bool:
        with self._serial():
            if h._state != _HELD or self._closed or self._fatal is not None:
                return False
            try:
                return self._core.is_held(h.lease_id)
            except errors.LeaseholdError:
                return False

    def _valid_until_ns(self, h: Any) -> int | None:
        with self._serial():
            if h._state != _HELD or self._closed or self._fatal is not None:
                return None
            try:
                return self._core.valid_until(h.lease_id)
            except errors.LeaseholdError:
                return None
