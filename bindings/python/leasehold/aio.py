"""asyncio flavour: :class:`AsyncLockClient` drives the same core from an event loop.

Everything runs on the loop the client is first used from (calling it from another loop
raises ``RuntimeError``): a driver task runs the core's deadlines; each request the core asks
for runs as its own task on the executor (a synchronous executor's calls in worker threads,
see :class:`leasehold._backend.ThreadedExecutor`), so a hung backend never delays loss
detection; a write on a byte stream, which never waits, is handed to the stream's transport
from the drain that asks for it (``write_now``), with no task. A finished request and a
notification feed the core directly from their task or callback (all on the loop, so no lock
is needed; what another thread delivers is passed to the loop first); the driver is woken
only when an input was queued for it (while paused), the client is closing, or the core's
deadline moved earlier than the one it sleeps until.

::

    async with AsyncLockClient(executor) as client:
        async with client.acquire("job", ttl=30, wait=5) as lock:
            await do_work(lock.fencing_token)

``acquire`` returns an object that is both awaitable (``h = await client.acquire(...)``) and
an async context manager. Not getting the lock within ``wait`` raises
:class:`~leasehold.errors.LockTimeout`, as in the threaded client. Cancelling the awaiting
task cancels the acquire (a grant that arrives later is released by the core).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
import time
import weakref
from collections import deque
from typing import Any, Awaitable, Callable, Coroutine, Generator

from . import _ffi, errors
from ._backend import BackendSink, Received, backend_of, execute_request_async, step_received, stream_failed
from ._args import seconds
from ._clock import resolve_clock
from ._core import Config, Core, IoRequest, dispatch_all
from ._driver import IDLE_TICK_NS, Driver, acquire_args
from ._lease import LeaseBase, ReleaseOutcome, Slot, client_config, renew_value
from .client import Subscription, not_an_executor

__all__ = ["AsyncLockClient", "AsyncLease", "AsyncLockHandle"]

log = logging.getLogger("leasehold")

_ACQUIRING, _HELD, _RELEASED, _LOST, _FAILED = "acquiring", "held", "released", "lost", "failed"
_ACQUIRE_SAFETY_S = 30.0
_WRITE = _ffi.LH_IO_WRITE

OnLost = Callable[["AsyncLease"], Any]


class AsyncLease(LeaseBase):
    """A lock held through :class:`AsyncLockClient` (the asyncio twin of ``Lease``).

    ``lost`` is an :class:`asyncio.Event`; ``await handle.lost.wait()`` wakes on loss.
    ``await handle.renew()`` extends the lease now; ``await handle.release()`` returns a
    :class:`~leasehold.ReleaseOutcome`.
    """

    _client: "AsyncLockClient"

    def __init__(self, client: "AsyncLockClient", lease_id: int, name: str, ttl_ms: int, wait_s: float,
                 reentrant: bool, on_lost: OnLost | None, auto_renew: bool = True) -> None:
        super().__init__(client, lease_id, name, ttl_ms, reentrant, on_lost, auto_renew)
        self._wait_s = wait_s
        self.lost = asyncio.Event()
        self._fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def _set_lost(self) -> None:
        self._state = _LOST
        self.lost.set()

    async def renew(self, timeout: float | None = None) -> float:
        """Extend the lease now and return the new :attr:`valid_until` (seconds on the
        client's clock); as ``Lease.renew``, including its errors (``LockLost``,
        ``LockNotHeld`` without any call to the service, ``RenewTimeout``)."""
        return await self._client._renew_handle(self, timeout)

    async def release(self, timeout: float | None = None) -> ReleaseOutcome:
        """Release and return the :class:`~leasehold.ReleaseOutcome` (``"released"``,
        ``"lost"``, ``"not_owner"``), as ``Lease.release``: idempotent, waits at most
        ``timeout`` for the service's answer."""
        return await self._client._release_handle(self, timeout)

    async def __aenter__(self) -> "AsyncLease":
        self._check_enter()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


AsyncLockHandle = AsyncLease
"""The first name of :class:`AsyncLease` (what ``AsyncLockClient.acquire`` gives)."""


class _Acquire:
    """Awaitable and async context manager returned by :meth:`AsyncLockClient.acquire`."""

    def __init__(self, coro_fn: Callable[[], Awaitable[AsyncLease]]) -> None:
        self._fn = coro_fn
        self._handle: AsyncLease | None = None

    def __await__(self) -> Generator[Any, None, AsyncLease]:
        return self._fn().__await__()

    async def __aenter__(self) -> AsyncLease:
        self._handle = await self._fn()
        return self._handle

    async def __aexit__(self, *exc: object) -> None:
        if self._handle is not None:
            await self._handle.release()


_aclients: "weakref.WeakSet[AsyncLockClient]" = weakref.WeakSet()


class AsyncLockClient(Driver):
    """An asyncio lock client: one core driven by one task on one event loop.

    Parameters as for :class:`leasehold.LockClient` (``fail_budget`` included); ``service``
    is any backend executor, asyncio or synchronous (whose requests then run in worker
    threads).
    """

    def __init__(
        self,
        service: Any,
        *,
        clock: Any = None,
        config: Config | None = None,
        seed: bytes | None = None,
        owns_service: bool = True,
        release_timeout: float | None = None,
        fail_budget: int | None = None,
    ) -> None:
        self._backend = backend_of(service, for_asyncio=True)
        if self._backend is None:
            raise TypeError(not_an_executor(service))
        self._service = service
        self._now_fn, self._clock_sub, self._real_clock = resolve_clock(clock)
        cfg = client_config(config, self._backend, fail_budget)
        self._core = Core(cfg, seed, self._now_fn, backend=self._backend.options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._sink = BackendSink(self._core, self._backend_input)
        self._backend.attach(self._sink)
        self._write_now = _write_now(self._backend)
        self._owns_service = owns_service
        self._release_timeout = (
            seconds(release_timeout, "release_timeout") if release_timeout is not None
            else self._core.request_timeout_ns / 1e9
        )
        self._wake: asyncio.Event | None = None
        self._driver: asyncio.Task[None] | None = None
        self._inputs: deque[Callable[[], None]] = deque()
        self._handles: dict[int, list[AsyncLease]] = {}
        self._release_waiters: dict[int, Slot] = {}  # release() callers, by lease
        self._renew_waiters: dict[int, list[Slot]] = {}  # renew() callers, by lease
        self._tasks: set[asyncio.Task[Any]] = set()
        self._deadline: int | None = None
        self._sleeping = False  # the driver waits; until _sleep_until (None: no deadline)
        self._sleep_until: int | None = None
        self._paused = False
        self._closing = False
        self._closed = False
        self._unsub_clock: Callable[[], None] | None = None
        _aclients.add(self)

    # -- public API ------------------------------------------------------------------------------
    def acquire(self, name: str, ttl: float, *, wait: float = 0.0, reentrant: bool = False,
                on_lost: OnLost | None = None, auto_renew: bool = True) -> _Acquire:
        """Acquire ``name`` for ``ttl`` seconds; see ``LockClient.acquire`` (``auto_renew``
        included).

        ``on_lost(handle)`` may be a plain function or return an awaitable; it runs as its own
        callback/task on the loop, and an exception in it is logged.
        """
        ttl_ms, wait_s, wait_ns = acquire_args(name, ttl, wait, reentrant, on_lost, auto_renew)
        return _Acquire(lambda: self._acquire(name, ttl_ms, wait_s, wait_ns, reentrant, on_lost, auto_renew))

    def on_release(self, name: str, callback: Callable[[str], Any]) -> Subscription:
        """Not available, as :meth:`leasehold.LockClient.on_release`: raises
        :class:`~leasehold.errors.LeaseholdError`."""
        self._refuse_subscription(name, callback)

    async def close(self, timeout: float = 5.0) -> None:
        """Release held locks, cancel pending acquires, wait (bounded) for cleanup, stop."""
        timeout = seconds(timeout, "timeout")
        if self._closing or self._closed:
            return
        self._closing = True
        if self._loop is not None:
            self._ensure_loop()
            for hs in list(self._handles.values()):
                for h in list(hs):
                    if h._state in (_ACQUIRING, _HELD):
                        self._release_in_core(h)
            self._drain()
            end = time.monotonic() + timeout
            while self._core.counters().pending_cleanups > 0 and time.monotonic() < end:
                assert self._wake is not None
                await asyncio.sleep(min(0.01, max(0.0, end - time.monotonic())))
            # What the backend gives back on close (etcd: its pooled lease, now, not a TTL
            # later) goes out now.
            before = set(self._tasks)
            self._core.close_backend()
            self._drain()
            revokes = self._tasks - before
            if revokes:
                await asyncio.wait(revokes, timeout=max(0.0, min(1.0, end - time.monotonic())))
            pending: list[asyncio.Task[Any]] = list(self._tasks)
            if self._driver is not None:
                self._driver.cancel()
                pending.append(self._driver)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        if self._unsub_clock is not None:
            self._unsub_clock()
        self._closed = True
        await self._backend.detach()
        for hs in self._handles.values():
            for h in hs:
                if h._state == _ACQUIRING:
                    self._settle_error(h, errors.ClientClosed("the client was closed"))
        self._handles.clear()
        self._fail_waiters(errors.ClientClosed("the client was closed"))
        self._core.close()
        if self._owns_service:
            try:
                await self._backend.close()
            except Exception:
                log.exception("leasehold: the executor's close() raised")

    async def __aenter__(self) -> "AsyncLockClient":
        self._ensure_loop()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait_idle(self, timeout: float = 10.0) -> bool:
        """Testing aid: wait until nothing is queued or in flight and no deadline is due."""
        end = time.monotonic() + seconds(timeout, "timeout")
        while time.monotonic() < end:
            if self._is_idle():
                return True
            await asyncio.sleep(0.001)
        return self._is_idle()

    # -- internals -----------------------------------------------------------------------------------
    _kind = "AsyncLockClient"

    def _check_open(self) -> None:
        if self._closing or self._closed:
            raise errors.ClientClosed("the AsyncLockClient is closed")

    @property
    def service(self) -> Any:
        """The executor this client drives (as it was given)."""
        return self._service

    def _ensure_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            self._loop_thread = threading.get_ident()
            self._wake = asyncio.Event()
            self._driver = loop.create_task(self._run(), name="leasehold-driver")
            self._drain()  # the backend's set-up (a SUBSCRIBE, the schema check) goes out now
            if self._clock_sub is not None:
                wake = self._wake

                def on_clock() -> None:
                    if not loop.is_closed():
                        loop.call_soon_threadsafe(wake.set)

                self._unsub_clock = self._clock_sub.subscribe(on_clock)
        elif self._loop is not loop:
            raise RuntimeError("this AsyncLockClient is bound to another event loop")

    def _is_idle(self) -> bool:
        if self._paused or self._inputs or self._tasks:
            return False
        if self._closed:
            return True
        dl = self._deadline
        return dl is None or self._core.now() < dl

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None
        wake = self._wake
        # As in LockClient: with no deadline, sleep one short tick before sleeping for ever,
        # so that a loop of acquire/release cycles does not poke the driver every cycle.
        tick_ns = min(IDLE_TICK_NS, self._core.request_timeout_ns // 4)
        ticked = False
        while True:
            if not self._paused:
                if self._inputs:
                    self._feed(self._inputs.popleft())
                    continue
                now = self._core.now()
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
                    wait_s = None if self._clock_sub is not None else 0.01
            else:
                wait_s = dl = None
            wake.clear()
            self._sleep_until = dl
            self._sleeping = True
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow the cancel
                # that close() sends, leaving the driver running.
                async with asyncio.timeout(wait_s):
                    await wake.wait()
            except TimeoutError:
                pass
            finally:
                self._sleeping = False

    def _feed(self, fn: Callable[[], None]) -> None:
        if type(fn) is Received and self._loop is not None:
            self._drain(fn.stream, fn.data)  # fed and drained in one crossing
            return
        try:
            fn()
        except Exception:  # never let a bad input kill the driver
            log.exception("leasehold: the core refused an input")
        self._drain()

    def _drain(self, stream: int = 0, data: bytes | None = None) -> None:
        """Drain every output and refresh the deadline; with ``data``, feed those bytes read
        on ``stream`` first (in the drain's first crossing)."""
        if self._core.closed:
            return
        if self._loop is not None:
            reqs, outs, dl = self._core.step() if data is None else step_received(self._core, stream, data)
            write_now = self._write_now
            for req in reqs:
                # A write on a stream the executor knows goes out now (or waits for its
                # connection, in order), with no task of its own.
                if write_now is not None and req.kind == _WRITE:
                    on, payload = req.payload
                    try:
                        if write_now(on, payload):
                            continue
                    except Exception as e:
                        self._inputs.append(stream_failed(self._core, self._backend, on, e))
                        continue
                self._spawn(self._execute(req))
        else:
            outs, dl = self._core.drain()
        self._deadline = dl
        dispatch_all(outs, self._dispatch)
        if (
            self._inputs
            or self._closing
            or (self._sleeping and dl is not None and (self._sleep_until is None or dl < self._sleep_until))
        ):
            self._poke()

    def _deliver_input(self, fn: Callable[[], None]) -> None:
        """Feed an input now (we are on the loop), or queue it while the driver is paused."""
        if self._paused:
            self._inputs.append(fn)
            self._poke()
        else:
            self._feed(fn)

    async def _execute(self, req: IoRequest) -> None:
        fn = await execute_request_async(self._core, self._backend, self._sink, req)
        if fn is not None and not self._closed:
            self._deliver_input(fn)

    def _backend_input(self, fn: Callable[[], None]) -> None:
        """(any thread) What arrived on the executor's own: a notification, a subscription
        change, a watch message; passed to the loop first when it comes from another thread."""
        loop = self._loop
        if loop is None or self._closed:
            return
        if threading.get_ident() == self._loop_thread:
            self._deliver_input(fn)
            return
        try:
            loop.call_soon_threadsafe(self._backend_input, fn)
        except RuntimeError:  # the loop closed meanwhile
            pass

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        assert self._loop is not None
        t: asyncio.Task[Any] = self._loop.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def _granted(self, h: AsyncLease) -> None:
        if not h._fut.done():
            h._fut.set_result(None)

    def _settle_error(self, h: AsyncLease, e: BaseException) -> None:
        h._state = _FAILED
        if not h._fut.done():
            h._fut.set_exception(e)

    def _on_fatal(self, e: BaseException) -> None:
        raise e

    def _callback(self, fn: Callable[..., Any], *args: Any) -> None:
        async def run() -> None:
            try:
                r = fn(*args)
                if inspect.isawaitable(r):
                    await r
            except Exception:
                log.exception("leasehold: callback %r raised", fn)

        self._spawn(run())

    async def _acquire(self, name: str, ttl_ms: int, wait_s: float, wait_ns: int, reentrant: bool,
                       on_lost: OnLost | None, auto_renew: bool = True) -> AsyncLease:
        self._ensure_loop()
        self._check_open()
        lease = self._core.acquire(name, ttl_ms, wait_ns, reentrant, auto_renew)
        h = AsyncLease(self, lease, name, ttl_ms, wait_s, reentrant, on_lost, auto_renew)
        self._handles.setdefault(lease, []).append(h)
        self._drain()
        bound = wait_s + self._core.request_timeout_ns / 1e9 + _ACQUIRE_SAFETY_S
        try:
            settled = await _bounded(h._fut, bound)
        except asyncio.CancelledError:
            self._cancel(h)
            raise
        if not settled:
            self._cancel(h)
            raise errors.LockTimeout(name, wait_s, f"lock {name!r}: the driver did not answer within {bound:g}s")
        return h

    def _cancel(self, h: AsyncLease) -> None:
        if self._closed:
            return
        if h._state == _ACQUIRING:
            self._release_in_core(h)
            self._drain()
            if not h._fut.done():
                h._fut.cancel()
        elif h._state == _HELD:
            self._release_in_core(h)
            self._drain()
        if h._fut.done() and not h._fut.cancelled():
            h._fut.exception()  # mark retrieved

    async def _release_handle(self, h: AsyncLease, timeout: float | None) -> ReleaseOutcome:
        wait_s = self._release_timeout if timeout is None else seconds(timeout, "timeout")
        early = self._release_early(h)
        if early is not None:
            return early
        assert self._loop is not None
        slot = _Slot(self._loop)
        outcome = self._release_start(h, slot)
        self._drain()
        if outcome is not None or slot.done():
            return self._release_end(h, slot, outcome if outcome is not None else slot.value())
        try:
            await _bounded(slot.fut, wait_s)
        finally:
            outcome = self._release_end(h, slot, slot.value() if slot.answered() else None)
        return outcome

    async def _renew_handle(self, h: AsyncLease, timeout: float | None) -> float:
        given = None if timeout is None else seconds(timeout, "timeout")  # checked before sending
        self._ensure_loop()
        assert self._loop is not None
        slot = _Slot(self._loop)
        self._renew_start(h, slot)
        self._drain()
        wait_s = self._renew_bound(h) if given is None else given
        try:
            answered = await _bounded(slot.fut, wait_s)
        except asyncio.CancelledError:
            self._renew_forget(h.lease_id, slot)
            raise
        if not answered:
            self._renew_forget(h.lease_id, slot)
            raise errors.RenewTimeout(h.name, wait_s)
        return renew_value(slot.value())

    def _set_paused(self, paused: bool) -> None:
        self._paused = paused
        self._poke()


class _Slot:
    """Wakes one awaiting renew()/release() caller with a value (see leasehold._lease.Slot)."""

    __slots__ = ("fut",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.fut: asyncio.Future[Any] = loop.create_future()

    def set(self, value: Any) -> None:
        if not self.fut.done():
            self.fut.set_result(value)

    def done(self) -> bool:
        return self.fut.done()

    def answered(self) -> bool:
        """Set with a value (not given up by a bounded wait, see :func:`_bounded`)."""
        return self.fut.done() and not self.fut.cancelled()

    def value(self) -> Any:
        return self.fut.result()


async def _bounded(fut: asyncio.Future[Any], seconds: float) -> bool:
    """Await ``fut`` at most ``seconds``: True once it is done, False when the time ran out
    first (``fut`` is then cancelled: its waiter gave up). A cancellation of the caller
    propagates. The caller waits on ``fut`` itself, so its answer wakes it in one turn of the
    loop (``asyncio.timeout`` around ``asyncio.shield`` takes three, and more objects)."""
    if fut.done():
        fut.result()  # its exception, as awaiting it would raise
        return True
    expired = False

    def expire() -> None:
        nonlocal expired
        if not fut.done():
            expired = True
            fut.cancel()

    loop = fut.get_loop()
    timer = loop.call_at(loop.time() + seconds, expire)
    try:
        await fut
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if not expired or (task is not None and task.cancelling()):
            raise
        return False
    finally:
        timer.cancel()
    return True


def _write_now(executor: Any) -> Callable[[int, bytes], bool] | None:
    """The executor's ``write_now`` (a write handed over without a task; False when it must
    go through ``write``), unless a subclass overrides ``write`` without it: the user's
    ``write`` then sees every write."""
    for cls in type(executor).__mro__:
        own = vars(cls)
        if "write" in own or "write_now" in own:
            return executor.write_now if "write" in own and "write_now" in own else None
    return None


def _after_fork_child() -> None:
    for c in list(_aclients):
        if not c._closed and not c._core.closed:
            try:
                c._core.reseed(os.urandom(32))
            except errors.LeaseholdError:
                log.exception("leasehold: reseed after fork failed")


os.register_at_fork(after_in_child=_after_fork_child)
