"""The lease lifecycle as both clients see it: release outcomes, manual renewal, loss.

:class:`LeaseLifecycle` is a mixin of :class:`~leasehold.client.LockClient` and
:class:`~leasehold.aio.AsyncLockClient`: the decisions are the same whether the caller is a
thread or a task; only how a caller waits differs (a *slot*: an object with ``set(value)``
that wakes the waiting caller once). Every method runs serialized with the client's other
core calls (under the client mutex, or on the event loop), and the caller drains the core
afterwards.

A handle stays registered with its lease and keeps its state until the core has decided how
the lease ended: a release whose lease's validity already ran out (a paused process) ends
Lost, and the LOST event must find the handle to set ``lost`` and run ``on_lost``.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import replace
from typing import Any, Callable, Protocol

from . import _ffi, errors
from ._core import Config, Core, Event

__all__ = ["ReleaseOutcome", "LeaseLifecycle", "LeaseBase", "client_config"]

log = logging.getLogger("leasehold")

_ACQUIRING, _HELD, _RELEASED, _LOST, _FAILED = "acquiring", "held", "released", "lost", "failed"


class ReleaseOutcome(str, enum.Enum):
    """What ``release()`` found out. A ``str`` enum: ``outcome == "released"`` works.

    * ``RELEASED`` (``"released"``): the lease ended released. The service confirmed it,
      or did not answer before the release timeout or the grant's TTL (the core keeps
      retrying the release with the same ownership token meanwhile);
    * ``LOST`` (``"lost"``): the lease was lost before the release was processed (also when
      its validity ran out while the process was paused); ``handle.lost_reason`` says why;
    * ``NOT_OWNER`` (``"not_owner"``): the service refused: our grant was no longer there
      (it expired on the service, and someone else may hold the lock now).
    """

    RELEASED = "released"
    LOST = "lost"
    NOT_OWNER = "not_owner"

    def __str__(self) -> str:
        return self.value


_OUTCOME_BY_REASON = {
    _ffi.LH_REASON_RELEASE_CONFIRMED: ReleaseOutcome.RELEASED,
    _ffi.LH_REASON_RELEASE_NOT_OWNER: ReleaseOutcome.NOT_OWNER,
    _ffi.LH_REASON_RELEASE_UNCONFIRMED: ReleaseOutcome.RELEASED,
}


class Slot(Protocol):
    """Wakes one waiting renew()/release() caller with a value (or an exception to raise)."""

    def set(self, value: Any) -> None: ...


def client_config(config: Config | None, service: object, fail_budget: int | None) -> Config:
    """The core configuration of a client: ``notifications`` from the executor unless set,
    ``fail_budget`` (0 = the time budget, N = N consecutive failures) when given."""
    cfg = config or Config()
    if not isinstance(cfg, Config):
        raise TypeError("config must be a leasehold.Config")
    if fail_budget is not None:
        if isinstance(fail_budget, bool) or not isinstance(fail_budget, int):
            raise TypeError(f"fail_budget must be an int, not {type(fail_budget).__name__}")
        if fail_budget < 0:
            raise ValueError(f"fail_budget must be >= 0, got {fail_budget}")
        cfg = replace(cfg, fail_budget=fail_budget)
    if cfg.notifications is None:
        cfg = replace(cfg, notifications=bool(getattr(service, "notifications", True)))
    return cfg


class LeaseLifecycle:
    """Mixin: the lease-ending logic shared by the threaded and the asyncio client.

    The client provides ``_core``, ``_handles`` (lease id → its handles), ``_renew_waiters``
    (lease id → slots), ``_release_waiters`` (lease id → slot), ``_check_open()``,
    ``_callback(fn, *args)`` (runs a user callback off the caller), ``_settle_error(h, e)``
    and ``_on_fatal(e)``.
    """

    _core: Core
    _handles: dict[int, list[Any]]
    _renew_waiters: dict[int, list[Slot]]
    _release_waiters: dict[int, Slot]
    _closing: bool
    _closed: bool

    def _check_open(self) -> None: ...  # pragma: no cover - provided by the client

    def _callback(self, fn: Callable[..., Any], *args: Any) -> None: ...  # pragma: no cover

    def _settle_error(self, h: Any, e: BaseException) -> None: ...  # pragma: no cover

    def _on_fatal(self, e: BaseException) -> None: ...  # pragma: no cover

    # -- events ------------------------------------------------------------------------------
    def _lease_event(self, out: Event) -> bool:
        """Handle a lease's LOST or RENEWED event; False for any other event kind.
        (``Driver._dispatch`` handles RELEASED and RELEASE_OUTCOME, the events of every
        release, itself: one frame less each.)"""
        k, lease = out.kind, out.lease_id
        if k == _ffi.LH_EVENT_LOST:
            hs = self._handles.pop(lease, ())
            for h in hs:
                if h._state == _HELD:
                    self._mark_lost(h, out.reason_name)
            if lease in self._renew_waiters:
                self._end_renewals(lease, errors.LockLost(hs[0].name if hs else "?", out.reason_name))
            slot = self._release_waiters.pop(lease, None)
            if slot is not None:
                slot.set(ReleaseOutcome.LOST)
        elif k == _ffi.LH_EVENT_RENEWED:
            for h in self._handles.get(lease, ()):
                h._valid_until_ns = out.valid_until_ns
            self._end_renewals(lease, out.valid_until_ns)
        else:
            return False
        return True

    def _lease_released(self, lease: int) -> None:
        """RELEASED: the lease's handles are released; a renew() waiting on it fails."""
        hs = self._handles.pop(lease, ())
        for h in hs:
            if h._state == _HELD:
                h._state = _RELEASED
                h._valid_until_ns = None
        if lease in self._renew_waiters:
            name = hs[0].name if hs else "?"
            self._end_renewals(lease, errors.LockNotHeld(f"lock {name!r} was released"))

    def _end_renewals(self, lease: int, value: Any) -> None:
        for slot in self._renew_waiters.pop(lease, ()):
            slot.set(value)

    def _fail_waiters(self, e: BaseException) -> None:
        """The client closed or failed: wake every renew() (with ``e``) and release() caller."""
        for slots in self._renew_waiters.values():
            for slot in slots:
                slot.set(e)
        self._renew_waiters.clear()
        for slot in self._release_waiters.values():
            slot.set(ReleaseOutcome.RELEASED)
        self._release_waiters.clear()

    def _mark_lost(self, h: Any, reason: str) -> None:
        h.lost_reason = reason
        h._valid_until_ns = None
        h._set_lost()
        log.warning("leasehold: lock %r (fencing token %s) lost: %s", h.name, h._fencing_token, reason)
        if h._on_lost is not None:
            self._callback(h._on_lost, h)

    def _acquire_error(self, h: Any, reason: int) -> BaseException:
        wait_s = h._wait_s
        if reason == _ffi.LH_REASON_WAIT_EXHAUSTED:
            return errors.LockTimeout(h.name, wait_s)
        if reason == _ffi.LH_REASON_UNAVAILABLE:
            # What the database or cluster said (a refused password, a foreign table...).
            core = getattr(self, "_core", None)
            detail = core.backend_last_error() if core is not None and not core.closed else ""
            return errors.BackendUnavailable(h.name, wait_s, detail)
        if self._closing or self._closed:
            return errors.ClientClosed(f"acquire of {h.name!r} cancelled: the client was closed")
        return errors.AcquireCancelled(f"acquire of {h.name!r} was cancelled")

    # -- release -----------------------------------------------------------------------------
    def _release_in_core(self, h: Any) -> ReleaseOutcome | None:
        """Give one holder of ``h``'s lease back to the core. Returns the outcome when it is
        known at once (another reentrant holder remains: released; the validity had run
        out: lost, with the LOST event queued), ``None`` when the service's answer decides
        (RELEASED is queued and the RELEASE goes out) or ``h`` was still acquiring."""
        lease = h.lease_id
        was = h._state
        if was == _ACQUIRING:
            self._forget_handle(h)
            try:
                self._core.release(lease)
            except (errors.LeaseEnded, errors.UnknownLease, errors.ClientClosed):
                pass
            except (errors.CorePanic, errors.CorePoisoned) as e:
                self._on_fatal(e)
            if h._state == _ACQUIRING:
                # Another reentrant holder keeps the lease alive; this waiter alone is cancelled.
                self._settle_error(h, self._acquire_error(h, _ffi.LH_REASON_CANCELLED))
            return None
        if was != _HELD:
            return None
        # The handle stays registered until the core decides: a lease whose validity ran
        # out ends LOST, and that event must reach this handle (lost, on_lost).
        try:
            releasing = self._core.release_reported(lease)
        except (errors.LeaseEnded, errors.UnknownLease, errors.ClientClosed):
            releasing = _ffi.LH_RELEASING_HOLDER_LEFT  # nothing left to release in the core
        except (errors.CorePanic, errors.CorePoisoned) as e:
            self._on_fatal(e)
            return ReleaseOutcome.LOST if h._state == _LOST else ReleaseOutcome.RELEASED
        if releasing == _ffi.LH_RELEASING_LOST:
            return ReleaseOutcome.LOST
        if releasing == _ffi.LH_RELEASING_PENDING:
            return None
        # HOLDER_LEFT: the lease lives on for its other holders; this one is done.
        self._forget_handle(h)
        if h._state == _HELD:
            h._state = _RELEASED
            h._valid_until_ns = None
        return ReleaseOutcome.RELEASED

    def _forget_handle(self, h: Any) -> None:
        hs = self._handles.get(h.lease_id)
        if hs is not None and h in hs:
            hs.remove(h)
            if not hs:
                del self._handles[h.lease_id]

    def _release_early(self, h: Any) -> ReleaseOutcome | None:
        """The outcome of a release that needs no core call (a repeated release, a handle
        that is not held, a closing client); ``None``: go ahead."""
        if h._release_outcome is not None:
            return h._release_outcome  # type: ignore[no-any-return]
        if h._state == _HELD and not (self._closed or self._closing or getattr(self, "_fatal", None) is not None):
            return None
        if h._state == _HELD:
            h._state = _RELEASED
        outcome = ReleaseOutcome.LOST if h._state == _LOST else ReleaseOutcome.RELEASED
        if h._state in (_LOST, _RELEASED) and not h._releasing:
            h._release_outcome = outcome
        return outcome

    def _release_start(self, h: Any, slot: Slot) -> ReleaseOutcome | None:
        """Register ``slot`` for the lease's RELEASE_OUTCOME and release ``h`` in the core;
        the outcome when known at once. The caller drains, then waits on ``slot``."""
        h._releasing = True
        self._release_waiters[h.lease_id] = slot
        outcome = self._release_in_core(h)
        if outcome is not None and self._release_waiters.get(h.lease_id) is slot:
            del self._release_waiters[h.lease_id]
        return outcome

    def _release_end(self, h: Any, slot: Slot, value: Any) -> ReleaseOutcome:
        """The release is over (``value``: what ``slot`` received, ``None`` if nothing):
        record the outcome on the handle (a repeated release returns it)."""
        if self._release_waiters.get(h.lease_id) is slot:
            del self._release_waiters[h.lease_id]
        if isinstance(value, ReleaseOutcome):
            outcome = value
        else:
            outcome = ReleaseOutcome.LOST if h._state == _LOST else ReleaseOutcome.RELEASED
        h._release_outcome = outcome
        h._releasing = False
        return outcome

    # -- renew -------------------------------------------------------------------------------
    def _renew_start(self, h: Any, slot: Slot) -> None:
        """Check ``h`` locally (a lost or released handle fails at once, nothing is sent) and
        renew its lease in the core; RENEWED or LOST then completes ``slot``."""
        self._check_open()
        if h._state == _LOST:
            raise errors.LockLost(h.name, h.lost_reason)
        if h._state != _HELD:
            raise errors.LockNotHeld(f"lock {h.name!r} is {h._state}; nothing to renew")
        lease = h.lease_id
        self._renew_waiters.setdefault(lease, []).append(slot)
        try:
            self._core.renew(lease)
        except BaseException as e:
            slots = self._renew_waiters.get(lease)
            if slots is not None and slot in slots:
                slots.remove(slot)
                if not slots:
                    del self._renew_waiters[lease]
            if isinstance(e, (errors.CorePanic, errors.CorePoisoned)):
                self._on_fatal(e)
                raise errors.ClientClosed(f"the client stopped after a core failure: {e}") from e
            if isinstance(e, (errors.LeaseEnded, errors.UnknownLease, errors.NotGranted)):
                raise errors.LockNotHeld(f"lock {h.name!r} is not held: {e}") from e
            raise

    def _renew_forget(self, lease: int, slot: Slot) -> None:
        """A renew() caller stopped waiting (timeout, cancellation)."""
        slots = self._renew_waiters.get(lease)
        if slots is not None and slot in slots:
            slots.remove(slot)
            if not slots:
                del self._renew_waiters[lease]

    def _renew_bound(self, h: Any) -> float:
        """Default bound of renew(): by the end of the validity window the core has answered
        (RENEWED, or LOST at the latest then), plus one request timeout."""
        request_s = self._core.request_timeout_ns / 1e9
        try:
            left = max(0, self._core.valid_until(h.lease_id) - self._core.now()) / 1e9
        except errors.LeaseholdError:
            left = 0.0
        return left + request_s


def renew_value(value: Any) -> float:
    """What renew() returns for a slot's ``value``: the new ``valid_until`` in seconds;
    an exception is raised."""
    if isinstance(value, BaseException):
        raise value
    return int(value) / 1e9


class LeaseBase:
    """What a lease is in both clients: its grant, its state and its validity, read from the
    client's core. ``Lease`` and ``AsyncLease`` add how a caller waits (``lost``, ``renew``,
    ``release``)."""

    _client: Any

    def __init__(self, client: Any, lease_id: int, name: str, ttl_ms: int, reentrant: bool,
                 on_lost: Callable[..., Any] | None, auto_renew: bool = True) -> None:
        self._client = client
        self.lease_id = lease_id
        self.name = name
        self.ttl = ttl_ms / 1000.0
        self.reentrant = reentrant
        self.auto_renew = auto_renew
        self._release_outcome: ReleaseOutcome | None = None
        self._releasing = False  # a release() call of this handle is under way
        self._on_lost = on_lost
        self.lost_reason: str | None = None
        self._state = _ACQUIRING
        self._fencing_token: int | None = None
        self._valid_until_ns: int | None = None
        self._wait_s = 0.0

    @property
    def fencing_token(self) -> int:
        """The fencing token of this grant; strictly larger than any earlier grant's of this name."""
        if self._fencing_token is None:
            raise errors.LockNotHeld(f"lock {self.name!r} was never granted")
        return self._fencing_token

    @property
    def valid_until_ns(self) -> int | None:
        """End of the current validity window (clock ns), ``None`` once released or lost."""
        return self._client._valid_until_ns(self)  # type: ignore[no-any-return]

    @property
    def valid_until(self) -> float | None:
        """End of the current validity window in seconds on the client's clock
        (``time.monotonic()`` for the default clock), ``None`` once released or lost."""
        ns = self.valid_until_ns
        return None if ns is None else ns / 1e9

    def remaining(self) -> float:
        """Seconds of validity left now (0.0 when not held). Advisory, like :meth:`is_held`."""
        ns = self.valid_until_ns
        if ns is None:
            return 0.0
        return max(0.0, (ns - int(self._client._now_fn())) / 1e9)

    @property
    def state(self) -> str:
        """``"held"``, ``"released"`` or ``"lost"`` (``"acquiring"``/``"failed"`` internally)."""
        return self._state

    def is_held(self) -> bool:
        """Advisory: is the lease valid right now? The fencing token is the real authority."""
        return self._client._is_held(self)  # type: ignore[no-any-return]

    def _check_enter(self) -> None:
        if self._state != _HELD:
            raise errors.LockNotHeld(f"lock {self.name!r} is {self._state}; acquire it again")

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} name={self.name!r} state={self._state} "
            f"fencing_token={self._fencing_token} lease={self.lease_id}>"
        )
