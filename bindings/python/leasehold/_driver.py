"""The driver both clients share: what each core event means for the application.

:class:`Driver` is the part of :class:`~leasehold.client.LockClient` and
:class:`~leasehold.aio.AsyncLockClient` that does not depend on how a caller waits (a thread
on an event, a task on a future). The threads are :mod:`leasehold._threaded`, the event loop
:mod:`leasehold.aio`; each provides the waiting: ``_granted(h)`` wakes the acquire() caller of
a handle just granted, ``_serial()`` is the context that serializes core calls (the client
mutex; nothing on the loop). The IO the core asks for runs through the executor
(:mod:`leasehold._backend`), the same way for every backend.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, ContextManager, NoReturn

from . import _ffi, errors
from ._args import check_name, ttl_to_ms, wait_budget
from ._core import Counters, Event
from ._lease import _OUTCOME_BY_REASON, LeaseLifecycle, ReleaseOutcome

__all__ = ["Driver", "acquire_args", "IDLE_TICK_NS"]

log = logging.getLogger("leasehold")

_ACQUIRING, _HELD = "acquiring", "held"
_EV_ACQUIRED, _EV_RELEASED = _ffi.LH_EVENT_ACQUIRED, _ffi.LH_EVENT_RELEASED
_EV_OUTCOME = _ffi.LH_EVENT_RELEASE_OUTCOME

# The longest a driver sleeps without a deadline before it sleeps for ever: in a loop of
# acquire/release cycles the core has no deadline between two cycles, and a driver asleep for
# ever would have to be woken by the next cycle's first deadline.
IDLE_TICK_NS = 500_000_000


def acquire_args(name: str, ttl: Any, wait: Any, reentrant: Any, on_lost: Any, auto_renew: Any) -> tuple[int, float, int]:
    """Check ``acquire()``'s arguments before the core is called: ``(ttl_ms, wait_s, wait_ns)``."""
    if type(name) is not str or not name:
        check_name(name)  # raises
    t = type(ttl)
    # The usual TTL in one test (else ttl_to_ms says what is wrong); 1e15 s is far inside u64 ms.
    ttl_ms = round(ttl * 1000) if (t is float or t is int) and 0.001 <= ttl < 1e15 else ttl_to_ms(ttl)
    t = type(wait)
    if t is float and 0.0 <= wait < 1e9:
        wait_s, wait_ns = wait, round(wait * 1e9)
    elif t is int and 0 <= wait < 1_000_000_000:  # (what wait_budget gives, exact here)
        wait_s, wait_ns = float(wait), wait * 1_000_000_000
    else:
        wait_s, wait_ns = wait_budget(wait)
    if not isinstance(reentrant, bool):
        raise TypeError("reentrant must be a bool")
    if on_lost is not None and not callable(on_lost):
        raise TypeError("on_lost must be callable or None")
    if not isinstance(auto_renew, bool):
        raise TypeError("auto_renew must be a bool")
    return ttl_ms, wait_s, wait_ns


class Driver(LeaseLifecycle):
    """Mixin: the dispatch of the core's events and the client queries, for both clients."""

    _backend: Any
    _fatal: BaseException | None = None

    def _granted(self, h: Any) -> None: ...  # pragma: no cover - by the client

    def _serial(self) -> ContextManager[Any]:
        return contextlib.nullcontext()

    # -- events ----------------------------------------------------------------------------------
    def _dispatch(self, ev: Event) -> None:
        k = ev.kind
        if k == _EV_ACQUIRED:
            for h in self._handles.get(ev.lease_id, ()):
                if h._state == _ACQUIRING:
                    h._fencing_token = ev.fencing_token
                    h._valid_until_ns = ev.valid_until_ns
                    h._state = _HELD
                    self._granted(h)
        elif k == _EV_RELEASED:  # (every release's event, without _lease_event's frame)
            self._lease_released(ev.lease_id)
        elif k == _EV_OUTCOME:
            slot = self._release_waiters.pop(ev.lease_id, None)
            if slot is not None:
                slot.set(_OUTCOME_BY_REASON.get(ev.reason, ReleaseOutcome.RELEASED))
        elif k == _ffi.LH_EVENT_ACQUIRE_FAILED:
            for h in self._handles.pop(ev.lease_id, ()):
                if h._state == _ACQUIRING:
                    self._settle_error(h, self._acquire_error(h, ev.reason))
        elif not self._lease_event(ev):
            log.error("leasehold: unknown event kind %d", k)

    def _refuse_subscription(self, name: str, callback: Any) -> NoReturn:
        """``on_release``: bad arguments first, then a closed client, then why not."""
        check_name(name)
        if not callable(callback):
            raise TypeError("callback must be callable")
        self._check_open()
        raise errors.LeaseholdError(
            "on_release is not available: every backend's protocol delivers its release "
            "notifications to the waiters of this client only"
        )

    # -- queries -----------------------------------------------------------------------------------
    def counters(self) -> Counters:
        """The core's counters (renewals sent/ok/failed, losses by reason, the backend
        protocol's requests and replies, ...)."""
        with self._serial():
            if self._closed:
                raise errors.ClientClosed(f"the {self._kind} is closed")
            return self._core.counters()

    def backend_counters(self) -> dict[str, int]:
        """What the core's backend protocol saw, by short name (requests, error and garbage
        replies, wake-ups; Redis: script calls, standby takeovers, subscriber losses; SQL:
        migrations, database errors; etcd: leases, watches...)."""
        with self._serial():
            if self._closed:
                raise errors.ClientClosed(f"the {self._kind} is closed")
            return self._core.backend_counters()

    def backend_last_error(self) -> str:
        """The last database error, refused schema, error reply or transport failure the
        core's backend protocol saw (empty when none)."""
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
