"""Measurement-only prototype of an inline fast path for ``LockClient`` (not used by the library).

``LockClient`` (leasehold/client.py) sends every command through its driver thread and IO pool:
an uncontended acquire+release costs ~6 thread hand-offs on top of its 2 Redis round trips,
and every ``_drain()`` wakes the driver even when its deadline did not move. This subclass shows
what removing both would buy, so the benchmark can report the number next to the real client:

1. **inline commands of the caller's own call**: while ``acquire()`` / ``release()`` hold the
   client mutex and drain the core, the Acquire (resp. Release) command that this very call
   produced is not submitted to the IO pool but captured (thread-local); after the mutex is
   released the calling thread runs ``service.acquire`` / ``service.release`` itself, then takes
   the mutex again and feeds the result to the core (``_feed``), which emits ``Acquired`` /
   answers the release at once. Later retries (after HeldByOther, timeouts) still go through the
   driver and pool, so nothing else changes; a late inline result after a core timeout is a
   stale result, counted and ignored by the core.
2. **wake the driver only when it must act**: the driver records the deadline it sleeps until;
   ``_drain`` notifies it only if an input is queued for it or the new core deadline is earlier
   than that (a renewal deadline after a grant is always later in steady state).

It overrides private methods of leasehold/client.py as it is today; if those change, the
benchmark reports the prototype as unavailable instead of failing.
"""

from __future__ import annotations

import threading
from typing import Any

from leasehold import errors
from leasehold.client import LockClient, LockHandle, _ffi
from leasehold._args import check_name, seconds, ttl_to_ms, wait_to_ns
from leasehold.service import Granted

_CAPTURED = (_ffi.LH_OUTPUT_ACQUIRE, _ffi.LH_OUTPUT_RELEASE)


class InlineLockClient(LockClient):
    _sleep_until: Any = 0  # 0 = the driver is awake; None = asleep without deadline

    def __init__(self, *a: Any, **kw: Any) -> None:
        self._tl = threading.local()
        super().__init__(*a, **kw)

    # 1. capture this thread's own command instead of submitting it to the pool
    def _submit_io(self, out: Any) -> None:
        tl = self._tl
        if getattr(tl, "capture", False) and getattr(tl, "cmd", None) is None and out.kind in _CAPTURED:
            self._inflight += 1
            tl.cmd = out
            return
        super()._submit_io(out)

    def _run_inline(self) -> None:
        tl = self._tl
        cmd, tl.cmd, tl.capture = getattr(tl, "cmd", None), None, False
        if cmd is None:
            return
        core, req, k = self._core, cmd.request_id, cmd.kind
        try:
            if k == _ffi.LH_OUTPUT_ACQUIRE:
                r = self._service.acquire(cmd.name, cmd.token, cmd.ttl_ms)
                if isinstance(r, Granted):
                    fn = self._granted_input(req, r)
                else:
                    hint = r.retry_after_ms
                    fn = lambda: core.acquire_result(req, _ffi.LH_ACQUIRE_HELD_BY_OTHER, retry_after_ms=hint)  # noqa: E731
            else:
                ok = self._service.release(cmd.name, cmd.token, cmd.backend_data)
                oc = _ffi.LH_RELEASE_RELEASED if ok else _ffi.LH_RELEASE_NOT_OWNER
                fn = lambda: self._release_answered(req, cmd.lease_id, oc)  # noqa: E731
        except Exception:
            fn = self._transport_error_input(k, req)
        with self._cond:
            self._inflight -= 1
            self._requests.pop(req, None)
            if not self._closed and not self._stop:
                self._feed(fn)

    def acquire(self, name: str, ttl: float, *, wait: float = 0.0, reentrant: bool = False, on_lost: Any = None) -> LockHandle:
        check_name(name)
        ttl_ms, wait_s, wait_ns = ttl_to_ms(ttl), seconds(wait, "wait"), wait_to_ns(wait)
        tl = self._tl
        with self._cond:
            self._check_open()
            self._ensure_started()
            tl.capture, tl.cmd = True, None
            try:
                lease = self._core.acquire(name, ttl_ms, wait_ns, reentrant)
                h = LockHandle(self, lease, name, ttl_ms, reentrant, on_lost)
                h._wait_s = wait_s
                self._handles.setdefault(lease, []).append(h)
                self._drain()
            finally:
                tl.capture = False
        self._run_inline()
        if not h._settled.wait(wait_s + self._core.request_timeout_ns / 1e9 + 30.0):
            self._cancel(h)
            raise errors.LockTimeout(name, wait_s)
        if h._error is not None:
            raise h._error
        return h

    def _release_handle(self, h: LockHandle, timeout: float | None) -> None:
        wait_s = self._release_timeout if timeout is None else seconds(timeout, "timeout")
        tl = self._tl
        with self._cond:
            if h._state != "held" or self._closed or self._closing or self._fatal is not None:
                if h._state == "held":
                    h._state = "released"
                return
            ev = threading.Event()
            self._release_waiters[h.lease_id] = ev
            tl.capture, tl.cmd = True, None
            try:
                self._release_in_core(h)
                self._drain()
            finally:
                tl.capture = False
        self._run_inline()
        ev.wait(wait_s)

    # 2. the driver records what it sleeps until; _drain wakes it only when needed
    def _run(self) -> None:
        with self._cond:
            while not self._stop:
                if self._paused or self._fatal is not None:
                    self._cond.wait()
                    continue
                if self._inputs:
                    self._feed(self._inputs.popleft())
                    continue
                now, dl = self._now(), self._deadline
                if dl is not None and now >= dl:
                    self._feed(self._core.timeout)
                    continue
                self._sleep_until = dl
                self._cond.notify_all()
                self._cond.wait(None if dl is None else (dl - now) / 1e9)
                self._sleep_until = 0

    def _drain(self) -> None:
        if self._fatal is not None or self._core.closed:
            return
        try:
            while True:
                out = self._core.poll_output()
                if out is None:
                    break
                self._dispatch(out)
            self._deadline = self._core.poll_timeout()
        except (errors.CorePanic, errors.CorePoisoned) as e:
            self._on_fatal(e)
        su = self._sleep_until
        if su == 0 or self._inputs or self._closing or (self._deadline is not None and (su is None or self._deadline < su)):
            self._cond.notify_all()
