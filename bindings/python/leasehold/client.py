"""The thread-safe :class:`LockClient` and its :class:`Lease` (also named ``LockHandle``).

Threads of one client:

* **the driver** (``leasehold-driver``): runs the core's deadlines. It sleeps until the
  earliest deadline (or until an input is queued for it), calls the core's ``timeout`` and
  drains every request and event. It never performs IO, so a hung backend cannot delay loss
  detection.
* **the IO pool** (``leasehold-io``, a small ``ThreadPoolExecutor``): runs the requests the
  core asks for with the executor (acquire, renew, release on the wire: a memory-service
  call, a Redis command, SQL statements, an HTTP request); each answer is fed to the core by
  the thread that got it, under the client mutex (a core call takes microseconds and never
  waits for IO), so no hop through the driver is needed.
* **the side worker** (``leasehold-side``): the requests that run in order beside the others
  (the Redis subscriber's, the PostgreSQL listener's, etcd watch streams).
* **the callback worker** (``leasehold-callbacks``): runs ``on_lost`` callbacks, one at a
  time, off the application thread. An exception in a callback is logged (logger
  ``leasehold``) and never reaches the driver.

Application calls (``acquire``, ``release``, ``renew``) and what arrives on the executor's
own (notifications) feed the core directly under the client's mutex (the mutex serializes
every call on the core handle). The driver is woken only when it must act earlier than it
planned: an input was queued for it (while it is paused, after a fork), the client is
closing, or the core's next deadline moved earlier than the one it sleeps until. No
application call blocks without a bound.

**Inline path.** A request runs on the thread that fed its cause: the first ``ACQUIRE`` of
``acquire()`` and the ``RELEASE`` of ``release()`` on the calling thread, after the mutex is
dropped, a woken waiter's retry on the thread that delivered the notification; so an
uncontended acquire+release costs two round trips and no thread hand-off. Timer-driven
requests (renewals, retries after a backoff) run on the IO pool. The calling thread cannot be
interrupted inside a call, so this is used only when a call is known to end: an executor whose
calls can block without a bound declares ``call_timeout = None`` (the memory executor, whose
``hang()`` blocks until ``unhang()``) and then everything runs on the pool, unless the
application passes ``inline_io=True`` and vouches for it. With an executor that moves the
bytes of connections the core owns (``RedisStreamExecutor``), the call also reads its reply
itself: the streams its requests were written on are held by the calling thread, which reads
and feeds them until its call is answered or its deadline passes (``_drain_holding``,
``_pump``); the executor's poller thread reads them otherwise.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable

from . import errors
from ._backend import BackendSink, backend_of, bounded_calls, runs_inline
from ._args import seconds
from ._clock import resolve_clock
from ._core import Config, Core, IoRequest
from ._driver import acquire_args
from ._threaded import ThreadedDriver, _Batches, _SerialWorker, _Slot, _wakers, waker
from ._lease import LeaseBase, ReleaseOutcome, Slot, client_config, renew_value

__all__ = ["LockClient", "Lease", "LockHandle", "ReleaseOutcome", "Subscription", "service_call_bound"]

log = logging.getLogger("leasehold")

_ACQUIRING = "acquiring"
_HELD = "held"
_RELEASED = "released"
_LOST = "lost"
_FAILED = "failed"

# Real-time safety margin added to the core's own bound on an acquire (wait + one request
# timeout). The core guarantees a terminal event by then; this only guards against a stuck
# driver (for example one paused by leasehold.testing.pause_driver).
_ACQUIRE_SAFETY_S = 30.0
_get_ident = threading.get_ident


class Lease(LeaseBase):
    """A lock acquired through :meth:`LockClient.acquire`.

    Use it as a context manager (``with client.acquire(...) as h:``) or call
    :meth:`release` (idempotent). Attributes:

    * ``name`` – the lock name; ``fencing_token`` – the token to pass to the resource (the
      only authority: see :mod:`leasehold.fencing`);
    * ``lost`` – a :class:`threading.Event` set when the lock is lost (renewal rejected,
      validity elapsed, or the renewal failure budget spent); ``lost_reason`` says which;
    * :meth:`is_held` – advisory: ``True`` while the core believes the lease is valid *now*;
    * :meth:`renew` – extend the lease now (the manual escape hatch; the only renewal of a
      lease acquired with ``auto_renew=False``);
    * :meth:`release` – idempotent; returns a :class:`~leasehold.ReleaseOutcome`.
    """

    _client: "LockClient"
    # Class defaults (LeaseBase.__init__ is the constructor: one Python frame per acquire).
    _lost: threading.Event | None = None  # created on first use (see ``lost``)
    # Created (under the client mutex) only when the acquiring thread has to wait; set when
    # the handle settles.
    _settled: threading.Event | None = None
    _waiter = 0  # the thread ident of the acquire() caller, once it waits (_settled)
    _error: BaseException | None = None

    @property
    def lost(self) -> threading.Event:
        """A :class:`threading.Event`, set when the lock is lost (see ``lost_reason``)."""
        ev = self._lost
        if ev is None:
            with self._client._mu:
                ev = self._lost
                if ev is None:
                    ev = self._lost = threading.Event()
                    if self._state == _LOST:
                        ev.set()
        return ev

    def _set_lost(self) -> None:
        """(client mutex held) Mark the handle lost and set ``lost`` if it exists."""
        self._state = _LOST
        ev = self._lost
        if ev is not None:
            ev.set()

    def renew(self, timeout: float | None = None) -> float:
        """Extend the lease now, counted from when the renewal is sent; returns the new
        :attr:`valid_until` (seconds on the client's clock, like that property).

        A renewal already in flight is joined. A renewal failing in transport is retried
        within the failure budget, so the call ends when the service confirms (the new
        validity) or the lease is lost (:class:`~leasehold.errors.LockLost`). It waits at
        most ``timeout`` seconds (default: the validity left plus one request timeout, by
        when the core has decided), else raises :class:`~leasehold.errors.RenewTimeout`
        (the lease is unchanged; the core keeps retrying).

        :raises LockLost: the lease is lost, or was lost while waiting (``reason``); nothing
            is sent for a handle already lost
        :raises LockNotHeld: the handle was released; nothing is sent
        :raises ClientClosed: the client is closed
        """
        return self._client._renew_handle(self, timeout)

    def release(self, timeout: float | None = None) -> ReleaseOutcome:
        """Release the lock and return how the lease ended: a
        :class:`~leasehold.ReleaseOutcome` (a ``str``: ``"released"``, ``"lost"`` — the
        reason is in ``lost_reason`` — or ``"not_owner"``, the service refused because our
        grant was gone). Idempotent: a later call returns the first call's outcome. Never
        raises for the ordinary outcomes.

        The lease stops being held at once; a lease whose validity ran out before this call
        (a paused process) ends lost instead, with ``lost`` set and ``on_lost`` called. The
        release command is retried by the core with the same ownership token until the
        service answers. This call waits for that answer at most ``timeout`` seconds
        (default: the client's ``release_timeout``); without one in time it reports
        ``"released"``.
        """
        return self._client._release_handle(self, timeout)

    def __enter__(self) -> "Lease":
        self._check_enter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


LockHandle = Lease
"""The first name of :class:`Lease` (what ``LockClient.acquire`` returns)."""


class Subscription:
    """Returned by :meth:`LockClient.on_release`; :meth:`cancel` stops the callback."""

    def __init__(self, cancel: Callable[[], None]) -> None:
        self._cancel: Callable[[], None] | None = cancel

    def cancel(self) -> None:
        c, self._cancel = self._cancel, None
        if c is not None:
            c()


def not_an_executor(service: object) -> str:
    """Why ``service`` cannot drive a client, naming what can."""
    from .service import AsyncLockService, LockService

    kind = type(service).__name__
    if isinstance(service, (LockService, AsyncLockService)):
        return (
            f"{kind} is a LockService of its own: a client drives an executor, whose backend's "
            "protocol the core speaks itself (leasehold.backends.memory.MemoryExecutor, "
            "SQLiteExecutor, PostgresExecutor, RedisExecutor, EtcdExecutor)"
        )
    return f"service must be a backend executor (MemoryExecutor, SQLiteExecutor, RedisExecutor, ...), not {kind}"


def service_call_bound(service: object) -> float | None:
    """The longest one call of ``service`` can block (seconds), as the executor declares it
    in an optional ``call_timeout`` attribute (a positive number); ``None`` when it declares
    none or ``None``."""
    v = getattr(service, "call_timeout", None)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if 0 < v < float("inf") else None


_clients: "weakref.WeakSet[LockClient]" = weakref.WeakSet()
_fork_locked: list["LockClient"] = []


class LockClient(ThreadedDriver):
    """A thread-safe lock client: one core, one driver thread, one executor.

    :param service: the backend's executor, which runs the requests of the core's protocol
        (``MemoryExecutor``, ``SQLiteExecutor``, ``PostgresExecutor``, ``RedisExecutor``,
        ``RedisClusterExecutor``, ``EtcdExecutor``)
    :param clock: ``None`` for ``time.monotonic_ns``; or an object with ``monotonic_ns()``
        (``leasehold.testing.FakeClock``), or a callable returning nanoseconds
    :param config: core configuration (``notifications`` defaults to the executor's)
    :param seed: core seed (≥16 bytes); ``os.urandom(32)`` by default — tests only
    :param io_workers: size of the IO pool that runs backend calls
    :param owns_service: ``close()`` also closes the executor
    :param release_timeout: default bound (seconds) ``Lease.release`` waits for the
        service's answer; default: the core's request timeout
    :param inline_io: run requests on the thread that fed their cause (the inline path, see
        the module doc). ``None`` (default): unless the executor declares that a call can
        block without a bound (``call_timeout = None``); ``True``: always (the application
        vouches that calls end); ``False``: never
    :param fail_budget: the renewal failure budget (overrides ``config.fail_budget``): ``0``
        (the core's default) is a time budget — renewals failing in transport are retried
        with backoff while validity remains, and the lease is lost only on a rejection or
        just before its validity ends; ``N > 0`` declares it lost after ``N`` consecutive
        failed renewals
    """

    def __init__(
        self,
        service: Any,
        *,
        clock: Any = None,
        config: Config | None = None,
        seed: bytes | None = None,
        io_workers: int = 4,
        owns_service: bool = True,
        release_timeout: float | None = None,
        inline_io: bool | None = None,
        fail_budget: int | None = None,
    ) -> None:
        self._backend = backend_of(service)
        if self._backend is None:
            raise TypeError(not_an_executor(service))
        if isinstance(io_workers, bool) or not isinstance(io_workers, int) or io_workers < 1:
            raise ValueError("io_workers must be an int >= 1")
        if inline_io is not None and not isinstance(inline_io, bool):
            raise TypeError("inline_io must be a bool or None")
        self._call_bound = service_call_bound(service)
        self._inline = runs_inline(service) if inline_io is None else inline_io
        self._bounded = bounded_calls(self._backend)
        self._reads = self._inline and callable(getattr(self._backend, "read_held", None))
        self._service = service
        self._now_fn, self._clock_sub, self._real_clock = resolve_clock(clock)
        cfg = self._cfg = client_config(config, service, fail_budget)
        self._core = Core(cfg, seed, self._now_fn, backend=self._backend.options)
        self._io_workers = io_workers
        self._owns_service = owns_service
        self._release_timeout = (
            seconds(release_timeout, "release_timeout")
            if release_timeout is not None
            else self._core.request_timeout_ns / 1e9
        )
        self._release_timeout_set = release_timeout is not None
        self._mu = threading.RLock()
        self._cond = threading.Condition(self._mu)
        self._init_runtime_state()
        self._closing = False
        self._closed = False
        self._fatal: BaseException | None = None
        self._unsub_clock: Callable[[], None] | None = None
        if self._clock_sub is not None:
            ref = weakref.ref(self)

            def _on_clock() -> None:
                c = ref()
                if c is not None:
                    c._wake()

            self._unsub_clock = self._clock_sub.subscribe(_on_clock)
        _clients.add(self)
        with self._mu:
            self._backend.attach(self._sink)  # first: an executor already in use starts nothing
            self._ensure_started()
            self._drain()  # the backend's set-up (a SUBSCRIBE, the schema check) goes out now

    def _init_runtime_state(self) -> None:
        self._inputs: deque[Callable[[], None]] = deque()
        self._handles: dict[int, list[Lease]] = {}
        self._release_waiters: dict[int, Slot] = {}  # release() callers, by lease
        self._renew_waiters: dict[int, list[Slot]] = {}  # renew() callers, by lease
        self._inflight = 0
        self._side_pending = 0
        self._deadline: int | None = None
        # What the driver sleeps until (valid while _sleeping): _drain wakes it only when the
        # core's deadline moved earlier than that.
        self._sleeping = False
        self._sleep_until: int | None = None
        self._idle_waiters = 0  # threads in wait_idle(): they want every state change
        self._wakeups = 0  # times the driver woke (diagnostics, tests)
        self._paused = False
        self._stop = False
        self._driver: threading.Thread | None = None
        self._driving = False  # the driver thread runs (see _run_driver)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._side_pool: _SerialWorker | None = None
        self._cb_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._sink = BackendSink(self._core, self._backend_input)
        self._tl = _Batches()

    # -- public API ------------------------------------------------------------------------------
    def acquire(
        self,
        name: str,
        ttl: float,
        *,
        wait: float = 0.0,
        reentrant: bool = False,
        on_lost: Callable[[Lease], Any] | None = None,
        auto_renew: bool = True,
    ) -> Lease:
        """Acquire ``name`` for ``ttl`` seconds (renewed automatically until released).

        :param wait: seconds to keep trying while someone else holds it (0 = one attempt)
        :param reentrant: a second reentrant acquire of a name this client already holds
            reentrantly returns at once (same fencing token); the lock is released by the
            last holder's release
        :param on_lost: called as ``on_lost(handle)`` on the callback thread when the lock is
            lost (at most once per handle); exceptions are logged
        :param auto_renew: ``False``: no automatic renewal; the lease is lost when its
            validity ends unless renewed by hand (:meth:`Lease.renew`); loss detection
            and ``on_lost`` work as usual
        :return: a held :class:`Lease`
        :raises LockTimeout: not acquired within ``wait`` (``BackendUnavailable`` if the
            backend kept failing)
        :raises ClientClosed: the client is closed
        :raises TypeError, ValueError: bad arguments (``InvalidArgument`` from the core)
        """
        ttl_ms, wait_s, wait_ns = acquire_args(name, ttl, wait, reentrant, on_lost, auto_renew)
        start = time.monotonic()
        with self._mu:  # the condition's lock, without Condition.__enter__'s Python frame
            if self._closing or self._closed or self._fatal is not None:
                self._check_open()  # raises
            if not self._driving:
                self._ensure_started()
            lease = self._core.acquire(name, ttl_ms, wait_ns, reentrant, auto_renew)
            h = Lease(self, lease, name, ttl_ms, reentrant, on_lost, auto_renew)
            h._wait_s = wait_s
            self._handles.setdefault(lease, []).append(h)
            # A reading executor's requests are stream requests, which never wait in a batch.
            # (_collecting() inline, one frame less)
            batch: list[IoRequest] | None = None
            if not (self._reads or not self._inline or self._paused):
                batch = self._tl.batch = []
            try:
                claims = self._drain_holding()
            finally:
                if batch is not None:
                    self._tl.batch = None
            if claims:
                w = _wakers.w or waker()
                if w.poked:  # (w.clear() inline)
                    w.drain()
                # While it reads, the waker stands in for the event (see _wake_waiter).
                h._settled, h._waiter = w, _get_ident()  # type: ignore[assignment]
        bound = min(wait_s + self._core.request_timeout_ns / 1e9 + _ACQUIRE_SAFETY_S, threading.TIMEOUT_MAX)
        try:
            # This call's own ACQUIRE, inline, by the core's deadline for it (the wait and one
            # request timeout); unanswered by then, it finishes on the pool.
            end = start + min(wait_s + self._core.request_timeout_ns / 1e9, threading.TIMEOUT_MAX)
            if batch:
                self._run_here(batch, end)
            if claims:  # its reply, read here (the rest after the deadline: the poller)
                try:
                    self._pump(claims, h, end, w, wait_s > 0)
                finally:
                    if h._state != _ACQUIRING:  # settled: nobody looks at it again
                        h._settled = None
                    else:
                        with self._mu:
                            h._settled = None
            if h._state == _ACQUIRING and self._reads and wait_s > 0:
                self._wait_reading(h, end)
            # A settled handle never goes back to acquiring: no lock needed to look.
            settled = h._state != _ACQUIRING or self._wait_settled(h, bound)
        except BaseException:  # KeyboardInterrupt and friends: cancel, never leak a grant
            self._cancel(h)
            raise
        if not settled:
            self._cancel(h)
            raise errors.LockTimeout(name, wait_s, f"lock {name!r}: the driver did not answer within {bound:g}s")
        if h._error is not None:
            raise h._error
        return h

    def on_release(self, name: str, callback: Callable[[str], Any]) -> Subscription:
        """Not available: every backend's protocol delivers its release notifications to
        the waiters of this client only. Raises :class:`~leasehold.errors.LeaseholdError`
        (``ClientClosed`` on a closed client; ``TypeError``/``ValueError`` for bad
        arguments first)."""
        with self._mu:
            self._refuse_subscription(name, callback)

    @property
    def service(self) -> Any:
        """The executor this client drives."""
        return self._service

    def close(self, timeout: float = 5.0) -> None:
        """Release every held lock, cancel pending acquires, and stop the client.

        Waits (at most ``timeout`` seconds) until the core has no pending cleanup release,
        so that locks are free on the service when it returns. Idempotent.
        """
        timeout = seconds(timeout, "timeout")
        with self._cond:
            if self._closing or self._closed:
                return
            self._closing = True
            if self._fatal is None and os.getpid() == self._pid:
                self._ensure_started()
                for lease, hs in list(self._handles.items()):
                    for h in list(hs):
                        if h._state in (_ACQUIRING, _HELD):
                            self._release_in_core(h)
                self._drain()
                end = time.monotonic() + timeout
                while self._pending_cleanups() > 0:
                    left = end - time.monotonic()
                    if left <= 0:
                        log.warning(
                            "leasehold: close() gave up on %d pending release(s) after %.3gs; "
                            "they expire with their TTL",
                            self._pending_cleanups(),
                            timeout,
                        )
                        break
                    self._cond.wait(min(left, 0.05))
                if self._fatal is None:
                    # What the backend gives back on close (etcd: its pooled lease, now, not a
                    # TTL later) goes out now.
                    self._feed(self._core.close_backend)
            self._stop = True
            self._cond.notify_all()
            # Let backend calls still in flight finish (bounded) before the service is closed.
            end = time.monotonic() + min(1.0, timeout)
            while self._inflight > 0 and time.monotonic() < end:
                self._cond.wait(max(0.0, min(0.05, end - time.monotonic())))
            driver = self._driver
            pools = (self._pool, self._side_pool, self._cb_pool)
        if driver is not None and driver is not threading.current_thread():
            driver.join(timeout=5.0)
        pool, side_pool, cb_pool = pools
        if side_pool is not None:
            side_pool.shutdown(wait=False)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if cb_pool is not None:
            cb_pool.shutdown(wait=False)
        if self._unsub_clock is not None:
            self._unsub_clock()
            self._unsub_clock = None
        with self._cond:
            self._closed = True
            for hs in self._handles.values():
                for h in hs:
                    if h._state == _ACQUIRING:
                        self._settle_error(h, errors.ClientClosed("the client was closed"))
                    elif h._state == _HELD:
                        h._state = _RELEASED
            self._handles.clear()
            self._fail_waiters(errors.ClientClosed("the client was closed"))
            self._core.close()
        self._backend.detach()
        if self._owns_service:
            try:
                self._service.close()
            except Exception:
                log.exception("leasehold: service.close() raised")

    def __enter__(self) -> "LockClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Testing aid: wait until the client is quiescent — no queued input, no backend call
        or callback in flight, and no core deadline already due. Returns False on timeout.

        With a :class:`~leasehold.testing.FakeClock` this is how a test lets every
        consequence of ``clock.advance()`` happen before looking.
        """
        end = time.monotonic() + seconds(timeout, "timeout")
        with self._cond:
            self._idle_waiters += 1
            try:
                while True:
                    if self._is_idle():
                        return True
                    left = end - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(min(left, 0.05))
            finally:
                self._idle_waiters -= 1

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<LockClient {state} service={type(self._service).__name__}>"

    # -- internals: lifecycle ----------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closing or self._closed:
            raise errors.ClientClosed("the LockClient is closed")
        if self._fatal is not None:
            raise errors.ClientClosed(f"the LockClient stopped after a core failure: {self._fatal}")

    _kind = "LockClient"

    # -- internals: handle operations (the driver itself: leasehold._threaded) --------------------
    def _release_handle(self, h: Lease, timeout: float | None) -> ReleaseOutcome:
        wait_s = self._release_timeout if timeout is None else seconds(timeout, "timeout")
        # An inline call keeps ``timeout`` when the executor can bound its calls; else it is
        # bounded by the executor's call_timeout, and an explicitly shorter wait takes the
        # pooled path, which can stop waiting at any time.
        explicit = timeout is not None or self._release_timeout_set
        bound = self._call_bound
        inline = self._bounded or not explicit or (bound is not None and wait_s >= bound)
        end = time.monotonic() + wait_s
        slot = _Slot()
        with self._mu:
            # _release_early's common case (a held handle, an open client) without its frame.
            if h._release_outcome is not None or h._state != _HELD or self._closed or self._closing or self._fatal is not None:
                early = self._release_early(h)
                if early is not None:
                    return early
            # (_release_start inline, one frame less)
            lease = h.lease_id
            h._releasing = True
            self._release_waiters[lease] = slot
            outcome = self._release_in_core(h)
            if outcome is not None and self._release_waiters.get(lease) is slot:
                del self._release_waiters[lease]
            batch: list[IoRequest] | None = None  # (_collecting() inline, one frame less)
            if inline and not (self._reads or not self._inline or self._paused):
                batch = self._tl.batch = []
            try:
                claims = self._drain_holding()
            finally:
                if batch is not None:
                    self._tl.batch = None
            if outcome is not None or slot.done:
                for req in batch or ():  # a lost lease's cleanup release: nobody waits for it
                    self._inflight -= 1
                    self._submit_request(req)
                if claims:
                    self._backend.release_reads(claims)
                return self._release_end(h, slot, outcome if outcome is not None else slot.value)
            if claims:
                w = _wakers.w or waker()
                if w.poked:  # (w.clear() inline)
                    w.drain()
                slot.waker, slot.waiter = w, _get_ident()
        try:
            if batch:
                self._run_here(batch, end)  # the RELEASE, inline
            if claims:  # its reply, read here by the caller's deadline
                self._pump(claims, slot, end, slot.waker)  # type: ignore[arg-type]
            if not slot.done:  # (answered inline: no wait)
                slot.wait(max(0.0, end - time.monotonic()))
        finally:
            with self._mu:
                outcome = self._release_end(h, slot, slot.value if slot.done else None)
        return outcome

    def _renew_handle(self, h: Lease, timeout: float | None) -> float:
        given = None if timeout is None else seconds(timeout, "timeout")  # checked before sending
        slot = _Slot()
        with self._mu:
            self._renew_start(h, slot)
            claims = self._drain_holding()
            wait_s = self._renew_bound(h) if given is None else given
            if claims:
                slot.waker, slot.waiter = waker(), threading.get_ident()
                slot.waker.clear()
        if claims:  # its reply, read here by the caller's deadline
            self._pump(claims, slot, time.monotonic() + min(wait_s, threading.TIMEOUT_MAX), slot.waker)  # type: ignore[arg-type]
        if not slot.wait(min(wait_s, threading.TIMEOUT_MAX)):
            with self._mu:
                if not slot.done:
                    self._renew_forget(h.lease_id, slot)
                    raise errors.RenewTimeout(h.name, wait_s)
        return renew_value(slot.value)

    def _cancel(self, h: Lease) -> None:
        """Cancel a waiting acquire (or release a grant that raced the cancellation)."""
        with self._cond:
            if self._closed:
                return
            if h._state == _ACQUIRING:
                self._release_in_core(h)
                self._drain()
                return
        if h._state == _HELD:
            h.release()

    # -- testing hooks -------------------------------------------------------------------------------------
    def _set_paused(self, paused: bool) -> None:
        with self._cond:
            self._paused = paused
            self._cond.notify_all()

    # -- fork safety -------------------------------------------------------------------------------------
    def _after_fork_in_child(self) -> None:
        self._mu = threading.RLock()
        self._cond = threading.Condition(self._mu)
        handles = self._handles
        self._init_runtime_state()
        if self._closed or self._core.closed:
            self._stop = True
            return
        # The parent's leases live on in the parent: the child starts a core of its own (a
        # reseeded one would renew and release them) and drops inherited connections.
        self._backend.after_fork()  # forgets the parent's connections and client
        self._core = Core(self._cfg, None, self._now_fn, backend=self._backend.options)
        self._sink = BackendSink(self._core, self._backend_input)
        self._backend.attach(self._sink)
        for hs in handles.values():
            for h in hs:
                if h._state == _ACQUIRING:
                    self._settle_error(h, errors.AcquireCancelled("acquire interrupted by fork()"))
                elif h._state == _HELD:
                    h.lost_reason = "forked"
                    h._set_lost()


def _before_fork() -> None:
    _fork_locked.clear()
    for c in list(_clients):
        c._mu.acquire()
        _fork_locked.append(c)


def _after_fork_parent() -> None:
    for c in _fork_locked:
        c._mu.release()
    _fork_locked.clear()


def _after_fork_child() -> None:
    for c in _fork_locked:
        try:
            c._after_fork_in_child()
        except Exception:  # never break the child
            log.exception("leasehold: after-fork reinit failed")
    _fork_locked.clear()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child)
