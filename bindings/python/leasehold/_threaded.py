"""How a thread waits: the threaded half of :class:`~leasehold.client.LockClient`.

:class:`ThreadedDriver` runs the shared driver (:class:`leasehold._driver.Driver`) with
threads: the driver thread's loop over the core's deadlines, the IO pool, requests run on
the thread that fed their cause (the inline path), and the callback worker. Every method
that touches the core runs under the client mutex (``_mu`` / ``_cond``), as its docstring
says. The public API and the lifecycle (``__init__``, ``acquire``, ``close``, fork) are in
:mod:`leasehold.client`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import socket
import threading
import time
from collections import deque
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

from . import errors
from . import _ffi
from ._backend import (
    SIDE,
    STREAM_KINDS,
    Deferred,
    Received,
    execute_request,
    execute_sql,
    lane_of,
    step_received,
    stream_failed,
)
from ._core import IoRequest, dispatch_all
from ._driver import IDLE_TICK_NS, Driver

if TYPE_CHECKING:
    from .client import Lease

__all__ = ["ThreadedDriver"]

log = logging.getLogger("leasehold")

_ACQUIRING, _HELD, _FAILED = "acquiring", "held", "failed"
_IDLE_TICK_NS = IDLE_TICK_NS
_WRITE, _SQL = _ffi.LH_IO_WRITE, _ffi.LH_IO_SQL
_monotonic = time.monotonic
_get_ident = threading.get_ident


class ThreadedDriver(Driver):
    """Mixin of :class:`~leasehold.client.LockClient`: the shared driver, run by threads.
    The client provides the state ``__init__`` / ``_init_runtime_state`` set up."""

    _mu: threading.RLock
    _cond: threading.Condition
    _pool: concurrent.futures.ThreadPoolExecutor | None
    _side_pool: "_SerialWorker | None"
    _cb_pool: concurrent.futures.ThreadPoolExecutor | None
    _sink: Any
    _tl: "_Batches"
    _now_fn: Callable[[], int]
    _clock_sub: Any
    _real_clock: bool
    _io_workers: int
    _inline: bool
    _bounded: bool
    _inputs: deque[Callable[[], None]]
    _inflight: int
    _side_pending: int
    _deadline: int | None
    _sleeping: bool
    _sleep_until: int | None
    _idle_waiters: int
    _wakeups: int
    _paused: bool
    _stop: bool
    _driver: threading.Thread | None
    _driving: bool
    # The executor reads replies on the thread that wrote their requests (``read_held``:
    # RedisStreamExecutor); see _drain_holding and _pump.
    _reads: bool = False

    # -- serialization ---------------------------------------------------------------
    def _now(self) -> int:
        return int(self._now_fn())

    def _serial(self) -> threading.RLock:
        return self._mu

    # -- the driver thread -----------------------------------------------------------
    def _ensure_started(self) -> None:
        """(mutex held) Start the driver and pools; after a fork, in the child, restart them."""
        if self._driving or self._stop:
            return
        self._pool = concurrent.futures.ThreadPoolExecutor(self._io_workers, thread_name_prefix="leasehold-io")
        self._side_pool = _SerialWorker("leasehold-side")
        self._cb_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="leasehold-callbacks")
        self._driver = threading.Thread(target=self._run_driver, name="leasehold-driver", daemon=True)
        self._driving = True  # before start(): the thread clears it when it ends
        try:
            self._driver.start()
        except BaseException:
            self._driving = False
            raise

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _pending_cleanups(self) -> int:
        try:
            return self._core.counters().pending_cleanups
        except errors.LeaseholdError:
            return 0

    def _is_idle(self) -> bool:
        if self._paused or self._inputs or self._inflight or self._side_pending:
            return False
        if self._fatal is not None or self._closed:
            return True
        dl = self._deadline
        return dl is None or self._now() < dl

    def _run_driver(self) -> None:
        try:
            self._run()
        finally:
            # Read by _ensure_started on every acquire(): a flag, not Thread.is_alive()'s
            # three Python frames.
            self._driving = False

    def _run(self) -> None:
        # With no deadline the driver first sleeps one short tick, then for ever: in a loop
        # of acquire/release cycles the core has no deadline between two cycles, and a driver
        # asleep for ever would have to be woken by the next cycle's first deadline.
        tick_ns = min(_IDLE_TICK_NS, self._core.request_timeout_ns // 4)
        ticked = False
        with self._cond:
            while not self._stop:
                if self._paused or self._fatal is not None:
                    self._cond.wait()  # _set_paused / close notify
                    continue
                if self._inputs:
                    self._feed(self._inputs.popleft())
                    continue
                now = self._now()
                dl = self._deadline
                if dl is not None and now >= dl:
                    self._feed(self._core.timeout)
                    continue
                if dl is None and not ticked and tick_ns > 0:
                    dl = now + tick_ns
                    ticked = True
                elif dl is not None:
                    ticked = False
                wait_s: float | None = None if dl is None else (dl - now) / 1e9
                if not self._real_clock:
                    # An injected clock: a subscribable one wakes us when it moves; any other
                    # is polled.
                    wait_s = None if self._clock_sub is not None else 0.01
                if self._idle_waiters:
                    self._cond.notify_all()
                self._sleep_until = dl
                self._sleeping = True
                try:
                    self._cond.wait(wait_s)
                finally:
                    self._sleeping = False
                    self._wakeups += 1

    def _feed(self, fn: Callable[..., None], *args: Any) -> None:
        """(mutex held) Feed one input, ``fn(*args)``, and drain; or, while the driver is paused
        (a paused client processes no result: see ``leasehold.testing.pause_driver``) or after
        a core failure, queue it for the driver (which feeds only when neither holds)."""
        if self._paused or self._fatal is not None:
            self._inputs.append(partial(fn, *args))
            self._cond.notify_all()
            return
        if type(fn) is Received:  # bytes read: fed and drained in one crossing
            self._drain(fn.stream, fn.data)
            return
        try:
            fn(*args)
        except (errors.CorePanic, errors.CorePoisoned) as e:
            self._on_fatal(e)
            return
        except Exception:  # never let a bad input kill the driver
            log.exception("leasehold: the core refused an input")
        self._drain()

    def _on_fatal(self, e: BaseException) -> None:
        log.critical("leasehold: the core failed (%s); every lock of this client is considered lost", e)
        self._fatal = e
        for hs in self._handles.values():
            for h in hs:
                if h._state == _ACQUIRING:
                    self._settle_error(h, errors.ClientClosed(f"core failure: {e}"))
                elif h._state == _HELD:
                    self._mark_lost(h, "core_failure")
        self._handles.clear()
        self._fail_waiters(errors.ClientClosed(f"the client stopped after a core failure: {e}"))
        self._cond.notify_all()

    def _drain(self, stream: int = 0, data: bytes | None = None) -> None:
        """(mutex held) Drain every output, refresh the deadline, and wake the driver if it
        must act earlier than it planned (or anyone waits for a state change). With
        ``data``, feed those bytes read on ``stream`` first (in the drain's first crossing)."""
        if self._fatal is not None:
            return
        try:
            reqs, outs, dl = self._core.step() if data is None else step_received(self._core, stream, data)
            for req in reqs:
                kind = req.kind
                if kind == _WRITE:  # (_submit_request's stream write, one frame less)
                    stream, data = req.payload
                    try:
                        self._backend.write(stream, data)
                    except Exception as e:
                        self._write_failed(stream, e)
                elif kind == _SQL and self._tl.batch is not None:  # (_submit_request's common case)
                    self._inflight += 1
                    self._tl.batch.append(req)
                else:
                    self._submit_request(req)
        except errors.ClientClosed:  # the core handle is freed (close()): nothing to drain
            return
        except (errors.CorePanic, errors.CorePoisoned) as e:
            self._on_fatal(e)
            return
        self._deadline = dl
        if outs:
            if len(outs) == 1:  # (dispatch_all's loop, one frame less in the common case)
                try:
                    self._dispatch(outs[0])
                except Exception:
                    log.exception("leasehold: failed to dispatch %r", outs[0])
            else:
                dispatch_all(outs, self._dispatch)
        if (
            self._inputs
            or self._closing
            or self._idle_waiters
            or (self._sleeping and dl is not None and (self._sleep_until is None or dl < self._sleep_until))
        ):
            self._cond.notify_all()

    # -- reading on the caller's thread ------------------------------------------------------
    def _drain_holding(self) -> list[Any] | None:
        """(mutex held) ``_drain``; with an executor that reads on the caller's thread, the
        streams the drained requests wrote on are held by this thread (the ones nobody else
        reads now): it reads their replies itself (``_pump``) and lets them go."""
        if not self._reads or self._paused:
            self._drain()
            return None
        be = self._backend
        be.hold_reads()
        try:
            self._drain()
        finally:
            claims: list[Any] = be.held_reads()
        return claims

    def _pump(self, claims: list[Any], done: Any, end: float, waker: "_Waker", widen: bool = False) -> None:
        """(mutex not held) Read the streams this thread holds and feed what arrives until
        ``done`` or ``end`` (``time.monotonic()``), then let them go: the executor's poller
        reads them from then on. ``done``: the :class:`_Slot` this thread waits on (done once
        set), the handle it acquires (done once no longer acquiring), or a callable saying
        whether it is done (the first two are looked at without a call). ``waker`` is set when
        what this thread waits for settles on another thread (it stops waiting at once).
        ``widen``: when the first replies did not settle it (an acquire that queued), also
        take the streams nobody reads, so the wake-up comes to this thread too."""
        if callable(done):
            slot, h = None, None
        elif type(done) is _Slot:
            slot, h = done, None
        else:
            slot, h = None, done
        be = self._backend
        read, wake, now = be.read_held, waker.fd, time.monotonic
        # What the replies cause is read here too: the streams this thread writes on while it
        # feeds join ``claims`` (it writes only then, under the mutex, so they are held for
        # the whole call rather than once per reply).
        be.hold_more(claims)
        try:
            while not (slot.done if slot is not None else h._state != _ACQUIRING if h is not None else done()):
                left = end - now()
                if left <= 0:
                    break
                got = read(claims, left, wake)
                if got is None:  # no held stream is open any more
                    break
                if not got:  # the deadline, or woken: look again
                    waker.drain()
                    continue
                with self._mu:
                    if self._closed or self._stop:
                        break
                    core = self._core
                    for stream, data, why in got:
                        if not data:
                            self._feed(core.stream_closed, stream, why)
                        elif self._paused or self._fatal is not None:
                            self._feed(core.stream_received, stream, data)
                        else:  # (_feed's common case: fed and drained in one crossing)
                            self._drain(stream, data)
                    if widen and not (slot.done if slot is not None else h._state != _ACQUIRING if h is not None else done()):
                        widen = False
                        claims.extend(be.hold_idle())
        finally:
            be.held_reads()
            if claims:
                be.release_reads(claims)

    def _wait_reading(self, h: Lease, end: float) -> None:
        """(mutex not held) An acquire() that waits reads the streams nobody reads until ``h``
        settles or ``end``: its wake-up and its grant come to this thread, with no hop
        through the executor's poller thread and no event to wake it."""
        with self._mu:
            if h._state != _ACQUIRING or self._closed or self._stop or self._paused:
                return
            claims = self._backend.hold_idle()
            if not claims:
                return
            w = waker()
            w.clear()
            h._settled, h._waiter = w, threading.get_ident()  # type: ignore[assignment]
        try:
            self._pump(claims, h, end, w)
        finally:
            with self._mu:
                h._settled = None

    # -- the acquire() caller that waits ------------------------------------------------
    def _granted(self, h: Lease) -> None:
        ev = h._settled  # (None: granted on the caller's own thread, nobody waits)
        if ev is not None and h._waiter != _get_ident():  # (_wake_waiter, one frame less)
            ev.set()

    def _settle_error(self, h: Lease, e: BaseException) -> None:
        h._error = e
        h._state = _FAILED
        self._wake_waiter(h)

    def _wake_waiter(self, h: Lease) -> None:
        """(mutex held) ``h`` settled: wake its waiting acquire() caller.

        On the caller's own thread no Event work is needed: that thread looks at the handle
        under the mutex before it waits again (see _wait_settled).
        """
        ev = h._settled
        if ev is not None and h._waiter != threading.get_ident():
            ev.set()

    def _wait_settled(self, h: Lease, bound: float) -> bool:
        """Wait (at most ``bound`` s) until ``h`` is granted or failed; True if it is."""
        end = time.monotonic() + bound
        while True:
            with self._mu:
                if h._state != _ACQUIRING:
                    return True
                ev = h._settled
                if ev is None:
                    ev = h._settled = threading.Event()
                    h._waiter = threading.get_ident()
                else:
                    ev.clear()  # every set() happens under the mutex: none is lost
            left = end - time.monotonic()
            if left <= 0:
                return h._state != _ACQUIRING
            if not ev.wait(left):
                return h._state != _ACQUIRING

    def _callback(self, fn: Callable[..., Any], *args: Any) -> None:
        pool = self._cb_pool
        if pool is None:
            return
        self._side_call(pool, f"callback {fn!r}", fn, *args)

    # -- requests -------------------------------------------------------------------
    def _submit_request(self, req: IoRequest) -> None:
        """(mutex held) Run one request: on this thread once it drops the mutex, when it
        collects them (``_collecting``), else on the IO pool (the notify connection's
        requests and watch streams in order on the side worker). Running a request where
        its cause was fed saves a thread hop. Stream requests never block: they run here, in
        the order they were polled (a stream's writes must not overtake each other)."""
        kind = req.kind
        if kind == _SQL:
            batch = self._tl.batch
            if batch is not None:  # the inline path's common request
                self._inflight += 1
                batch.append(req)
                return
        elif kind == _WRITE:  # the hot one, without execute_request's plan
            stream, data = req.payload
            try:
                self._backend.write(stream, data)
            except Exception as e:
                self._write_failed(stream, e)
            return
        if kind in STREAM_KINDS:
            fn = execute_request(self._core, self._backend, self._sink, req)
            if fn is not None:
                self._inputs.append(fn)
                self._cond.notify_all()
            return
        batch = self._tl.batch
        if batch is not None:
            self._inflight += 1
            batch.append(req)
            return
        pool: Any = self._side_pool if lane_of(req) == SIDE else self._pool
        if pool is None:
            return
        self._inflight += 1
        try:
            pool.submit(self._execute, req)
        except RuntimeError:  # shut down
            self._inflight -= 1

    def _write_failed(self, stream: int, e: Exception) -> None:
        """(mutex held) A write on ``stream`` failed: the driver tells the core it closed."""
        self._inputs.append(stream_failed(self._core, self._backend, stream, e))
        self._cond.notify_all()

    def _execute(self, req: IoRequest) -> None:
        self._run_here([req])

    def _collecting(self) -> list[IoRequest] | None:
        """(mutex held) Collect the requests the next drains emit for this thread to run
        (``_run_here`` after the mutex is dropped); ``None`` when they go to the pool (the
        executor's calls may block without a bound, or the driver is paused)."""
        if not self._inline or self._paused:
            return None
        batch: list[IoRequest] = []
        self._tl.batch = batch
        return batch

    def _run_here(self, batch: list[IoRequest] | None, end: float | None = None, first: Any = None) -> None:
        """(mutex not held) Run collected requests on this thread, feeding each result; the
        requests those emit join the batch. ``end`` (``time.monotonic()``): the caller's
        deadline, which the IO here keeps when the executor can bound its calls; a request
        unanswered by then finishes on the pool, and so do the rest, as on an interrupt.
        ``first``: a deferred request's ``finish()``, run before the batch (on the pool)."""
        if not batch and first is None:
            return
        batch = batch if batch is not None else []
        try:
            while batch or first is not None:
                if first is not None:
                    fn, first = first(), None
                else:
                    left = None
                    if end is not None and self._bounded:
                        left = end - _monotonic()
                        if left <= 0:
                            break
                    req = batch.pop(0)
                    try:
                        run = execute_sql if req.kind == _SQL else execute_request
                        fn = run(self._core, self._backend, self._sink, req, left)
                    except Deferred as d:
                        self._defer(d.finish)
                        continue
                with self._mu:
                    self._inflight -= 1
                    if fn is not None and not self._closed and not self._stop:
                        tl = self._tl
                        tl.batch = batch if not self._paused else None
                        try:
                            if self._paused or self._fatal is not None:
                                self._feed(fn)  # queued for the driver
                            else:  # (_feed's common case, one frame less per request)
                                try:
                                    fn()
                                except (errors.CorePanic, errors.CorePoisoned) as e:
                                    self._on_fatal(e)
                                except Exception:
                                    log.exception("leasehold: the core refused an input")
                                    self._drain()
                                else:
                                    self._drain()
                        finally:
                            tl.batch = None
                    elif self._idle_waiters or self._closing:
                        self._cond.notify_all()
        finally:
            if batch:
                with self._mu:
                    for req in batch:
                        self._inflight -= 1
                        self._submit_request(req)

    def _defer(self, finish: Callable[[], Any]) -> None:
        """A request ran out of its caller's time: ``finish()`` completes it on the IO pool
        and its result is fed as usual (it stays counted in flight until then)."""
        with self._mu:
            pool = self._pool
            try:
                if pool is None:
                    raise RuntimeError("no pool")
                pool.submit(self._run_here, None, None, finish)
            except RuntimeError:  # shut down: nobody reads the answer
                self._inflight -= 1
                self._cond.notify_all()

    def _backend_input(self, fn: Callable[[], None]) -> None:
        """(any thread) What arrived on the executor's own: a notification, a subscription
        change, a watch message. The requests it causes (a woken waiter's attempt) run on
        this thread when the executor's calls are bounded."""
        with self._mu:
            if self._closed or self._stop:
                return
            batch = self._collecting()
            try:
                self._feed(fn)
            finally:
                self._tl.batch = None
        self._run_here(batch)

    # -- callbacks ------------------------------------------------------------------
    def _side_call(self, pool: concurrent.futures.ThreadPoolExecutor, what: str, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` on ``pool`` (the callback thread), counted in ``_side_pending`` so
        close() can wait for it; an exception is logged as ``what`` and never propagates."""
        self._side_pending += 1

        def run() -> None:
            try:
                self._safe_call(what, fn, *args)
            finally:
                with self._cond:
                    self._side_pending -= 1
                    self._cond.notify_all()

        try:
            pool.submit(run)
        except RuntimeError:
            self._side_pending -= 1

    @staticmethod
    def _safe_call(what: str, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("leasehold: %s raised", what)


class _Batches(threading.local):
    """Per thread: the requests it collects to run itself (see _submit_request)."""

    batch: list[IoRequest] | None = None


class _Slot:
    """Wakes one renew()/release() caller with a value (see leasehold._lease.Slot); a caller
    reading its streams (``_pump``) is woken through its ``waker`` when the value is set on
    another thread."""

    # Class defaults, no __init__: one slot per release() is made without a Python frame.
    # ``_ev`` is made by the first wait() that must block: a slot set on the caller's own
    # thread (the inline path) never needs one. set() marks ``done`` before it looks for the
    # event and wait() publishes the event before it looks at ``done``, so one of them sees
    # the other.
    _ev: threading.Event | None = None
    value: Any = None
    done = False
    waker: "_Waker | None" = None
    waiter = 0

    def set(self, value: Any) -> None:
        if not self.done:
            self.value, self.done = value, True
            ev = self._ev
            if ev is not None:
                ev.set()
            w = self.waker
            if w is not None and self.waiter != threading.get_ident():
                w.set()

    def wait(self, timeout: float) -> bool:
        if self.done:
            return True
        ev = self._ev
        if ev is None:
            ev = self._ev = threading.Event()
        if self.done:
            return True
        return ev.wait(timeout)


class _Waker:
    """Stops a thread's wait for its streams' bytes (``_pump``) from another thread: one byte
    on a socket pair it polls beside them. It stands in for the handle's ``_settled`` event
    while its caller reads, so a grant or failure fed elsewhere wakes that caller."""

    __slots__ = ("_r", "_w", "fd", "poked")

    def __init__(self) -> None:
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)
        self.fd = self._r.fileno()
        self.poked = False

    def set(self) -> None:
        if not self.poked:
            self.poked = True
            try:
                self._w.send(b"x")
            except OSError:  # full: a byte is there anyway
                pass

    def drain(self) -> None:
        self.poked = False
        try:
            while self._r.recv(64):
                pass
        except OSError:
            pass

    def clear(self) -> None:
        if self.poked:
            self.drain()

    def __del__(self) -> None:  # its thread ended
        self._r.close()
        self._w.close()


class _Wakers(threading.local):
    w: _Waker | None = None


_wakers = _Wakers()


def waker() -> _Waker:
    """This thread's waker (one per thread and process)."""
    w = _wakers.w
    if w is None:
        w = _wakers.w = _Waker()
    return w


def _forget_wakers() -> None:
    global _wakers
    _wakers = _Wakers()  # the parent's socket pairs are the parent's


os.register_at_fork(after_in_child=_forget_wakers)


class _SerialWorker:
    """One daemon thread that runs submitted calls in order: a ``ThreadPoolExecutor(1)``
    without a ``Future`` per call (``ThreadPoolExecutor.submit`` costs tens of microseconds on
    the path of a handoff)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._shut = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)``; raises RuntimeError after ``shutdown`` (as an executor does)."""
        if self._shut:
            raise RuntimeError("cannot schedule new calls after shutdown")
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    t = threading.Thread(target=self._run, name=self._name, daemon=True)
                    t.start()
                    self._thread = t
        self._queue.put((fn, args))

    def shutdown(self, wait: bool = True) -> None:
        """Run what is queued, then stop (``wait``: until then)."""
        self._shut = True
        self._queue.put(None)
        if wait and self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, args = item
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - callers wrap their calls; never die silently
                log.exception("leasehold: %s call failed", self._name)
