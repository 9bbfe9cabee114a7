"""An in-process reference lock service with fault switches.

The names are those of every binding (Go's ``MemoryService`` / ``MemoryExecutor``); the first
ones, ``MemoryStore`` and ``MemoryLockService``, are aliases.

* :class:`MemoryService` is the "server": the core's reference service (``lh_memory_service_*``,
  the one every binding tests against) with locks, fencing counters and its own clock
  (``store.step_clock()`` jumps it forward, expiring leases on the server side only).
* :class:`MemoryExecutor` is one *connection* to a store, with its own fault switches, so a
  test can partition one client while the others keep working. It is the executor of the
  core's memory protocol: it hands each request the core polls to the service unread
  (``lh_memory_service_call``) and the service's answer back, and passes the release
  notifications queued for its connection on as messages. Several clients contend for the
  same locks by each using their own connection on one shared store::

      store = MemoryService()
      a = LockClient(MemoryExecutor(store))
      b = LockClient(MemoryExecutor(store))

Semantics match the other backends: acquire is idempotent for the same token (same fencing
token, TTL refreshed); renew and release compare the token first; a release notifies every
connection watching the name.

Fault switches (attributes of an executor, change them at any time):

* ``partitioned`` – every call is lost before reaching the store (a transport error);
* ``drop_requests`` – the same, counted separately (a lost request);
* ``drop_responses`` – the call is applied, then its answer lost (a transport error);
  :meth:`MemoryExecutor.drop_next_responses` does that for the next *n* calls only;
* ``reject_renewals`` – renewals are refused (the lease is lost);
* ``reject_acquires`` – acquires answer "held by another";
* ``reject_releases`` – releases answer "not owner" (the grant stays until it expires);
* ``delay`` – seconds every call takes, measured on the store's clock (with a
  :class:`~leasehold.testing.FakeClock` the call waits until the test advances it);
* :meth:`MemoryExecutor.hang` / :meth:`MemoryExecutor.unhang` – calls block until
  ``unhang()`` (or ``close()``): a hung backend.

The store applies the first six; delay and hang belong to the host. Those six, ``step_clock``
and ``forget`` need a library built with the ``testing`` feature (the test suites build one);
with a release library, turning one on raises :class:`~leasehold.errors.LibraryError` saying
so, while ``heal()``, ``delay`` and ``hang()`` still work.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from .. import _ffi, errors
from .._clock import resolve_clock
from .._core import MemoryOptions
from .._values import Answer
from ..service import LockStatus

__all__ = ["MemoryService", "MemoryExecutor", "MemoryStore", "MemoryLockService", "LockRecord"]

_HOST = socket.gethostname()
_lib = _ffi.lib
_VALUE_SIZE = ctypes.sizeof(_ffi.lh_value)


@dataclass(frozen=True)
class LockRecord:
    """The store's view of one held lock, with who acquired it and when (for ``status``)."""

    name: str
    token: str
    fencing_token: int
    expires_ns: int
    pid: int = 0
    host: str = ""
    since_ns: int = 0


def _name_bytes(name: str) -> bytes:
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    return name.encode("utf-8", "surrogatepass")


class MemoryService:
    """The shared state of memory executors ("the server"); also named ``MemoryStore``."""

    def __init__(self, *, clock: Any = None) -> None:
        self._now_fn, self._clock_sub, self._real_clock = resolve_clock(clock)
        self.clock = clock
        self._offset_ns = 0
        self._lock = threading.Lock()  # the handle is not thread-safe
        cfg = _ffi.lh_memory_config()
        _lib.lh_memory_config_default(ctypes.byref(cfg))
        cfg.max_connections = 1 << 20
        h = _ffi.lh_memory_service_p()
        _lib.lh_memory_service_new(ctypes.byref(cfg), ctypes.byref(h))
        self._h = h
        self._finalizer = weakref.finalize(self, _lib.lh_memory_service_free, h)
        self._finalizer.atexit = False  # daemon threads may still call in at exit
        self._executors: "weakref.WeakValueDictionary[int, MemoryExecutor]" = weakref.WeakValueDictionary()
        self._answer = _ffi.lh_memory_answer()
        self._stats = _ffi.lh_memory_stats()
        self._stats.struct_size = ctypes.sizeof(self._stats)
        self._notified = 0  # the service's notification count when the queues were last read

    # -- clock ----------------------------------------------------------------------------------
    def now_ns(self) -> int:
        """The store's clock (its own clock plus every ``step_clock``)."""
        return int(self._now_fn()) + self._offset_ns

    def _host_now(self) -> int:
        return max(0, int(self._now_fn()))

    def step_clock(self, seconds: float) -> None:
        """Jump the store's clock forward (a server clock step): leases expire earlier."""
        if seconds < 0:
            raise ValueError("the store's clock only steps forward")
        ns = int(seconds * 1e9)
        with self._lock:
            _ffi.hook("lh_memory_service_step_clock")(self._h, ns)
            self._offset_ns += ns

    def wait(self, seconds: float, abort: threading.Event) -> None:
        """Let ``seconds`` pass on the store's clock (fake clocks: until advanced)."""
        if seconds <= 0:
            return
        if self._real_clock or self.clock is None:
            abort.wait(seconds)
            return
        end = self.now_ns() + int(seconds * 1e9)
        wake = threading.Event()
        unsub = self._clock_sub.subscribe(wake.set) if self._clock_sub is not None else None
        try:
            while self.now_ns() < end and not abort.is_set():
                wake.wait(0.01 if unsub is None else 0.5)
                wake.clear()
        finally:
            if unsub is not None:
                unsub()

    # -- inspection ------------------------------------------------------------------------------
    def _status(self, name: str) -> _ffi.lh_memory_status:
        raw = _name_bytes(name)
        st = _ffi.lh_memory_status()
        st.struct_size = ctypes.sizeof(st)
        with self._lock:
            _lib.lh_memory_service_status(self._h, self._host_now(), raw, len(raw), ctypes.byref(st))
        return st

    def holder(self, name: str) -> LockRecord | None:
        """The live holder of ``name``, or ``None`` (free or expired)."""
        st = self._status(name)
        if not st.held:
            return None
        token = bytes(st.holder_token[: st.holder_token_len]).decode("utf-8", "surrogateescape")
        return LockRecord(
            name, token, st.fencing_token, st.expires_at_ns, os.getpid(), _HOST,
            st.service_now_ns - st.held_for_ns,
        )

    def last_fence(self, name: str) -> int:
        """The last fencing token granted for ``name`` (0 if never)."""
        return int(self._status(name).last_fencing_token)

    def status(self, name: str) -> LockStatus:
        """What the store says about ``name`` right now, holder pid, host and time included."""
        st = self._status(name)
        last = st.last_fencing_token or None
        if not st.held:
            return LockStatus(name, False, None, None, None, last)
        return LockStatus(
            name, True, st.fencing_token, st.remaining_ttl_ms, os.getpid(), last, holder_host=_HOST,
            held_for_ms=st.held_for_ns // 1_000_000,
        )

    def stats(self) -> dict[str, int]:
        """The service's counters (``lh_memory_stats``: names, connections, grants, releases,
        renewals, watches, notifications...), by field name."""
        st = _ffi.lh_memory_stats()
        st.struct_size = ctypes.sizeof(st)
        with self._lock:
            _lib.lh_memory_service_stats_get(self._h, ctypes.byref(st))
        names = [f[0] for f in _ffi.lh_memory_stats._fields_]
        return {f: int(getattr(st, f)) for f in names if f not in ("struct_size", "_reserved")}

    def forget(self, name: str) -> None:
        """Drop the grant of ``name`` without a notification, as a failover that lost the key
        would: the holder's next renew is rejected. The fence is kept."""
        raw = _name_bytes(name)
        with self._lock:
            _ffi.hook("lh_memory_service_forget")(self._h, raw, len(raw))

    # -- connections (called by executors) ---------------------------------------------------------
    def _connect(self, executor: "MemoryExecutor") -> int:
        cid = ctypes.c_uint64()
        with self._lock:
            _lib.lh_memory_service_connect(self._h, ctypes.byref(cid))
            self._executors[cid.value] = executor
        return cid.value

    def _disconnect(self, cid: int) -> None:
        with self._lock:
            if self._finalizer.alive:
                try:
                    _lib.lh_memory_service_disconnect(self._h, cid)
                except errors.CoreError:
                    pass  # already gone

    def _set_faults(self, cid: int, flags: int, drop_next: int | None) -> None:
        if not flags and not drop_next and not _ffi.has_hook("lh_memory_service_set_faults"):
            return  # a library without the hooks never had a switch on: nothing to clear
        set_faults = _ffi.hook("lh_memory_service_set_faults")
        get_faults = _ffi.hook("lh_memory_service_get_faults")
        f = _ffi.lh_memory_faults()
        f.struct_size = ctypes.sizeof(f)
        with self._lock:
            if drop_next is None:  # keep the count as it has run down
                get_faults(self._h, cid, ctypes.byref(f))
            else:
                f.drop_next_responses = drop_next
            f.flags = flags
            set_faults(self._h, cid, ctypes.byref(f))

    def _call(self, cid: int, argv: list[bytes]) -> Answer | None:
        """Run one request for connection ``cid``; its answer (copied: the service's buffers
        are borrowed until its next call), ``None`` when the service dropped it. Release
        notifications the call queued go to the connections they are for."""
        n = len(argv)
        arr = (_ffi.lh_bytes * max(n, 1))()
        for i, arg in enumerate(argv):
            arr[i].ptr = ctypes.cast(ctypes.c_char_p(arg), ctypes.c_void_p) if arg else None
            arr[i].len = len(arg)
        a = self._answer
        a.struct_size = ctypes.sizeof(a)
        with self._lock:
            _lib.lh_memory_service_call(self._h, cid, self._host_now(), arr, n, ctypes.byref(a))
            if a.dropped:
                answer = None
            else:
                values = ctypes.string_at(a.values, a.nvalues * _VALUE_SIZE) if a.nvalues else b""
                answer = Answer(values, int(a.nvalues), ctypes.string_at(a.data, a.data_len) if a.data_len else b"")
            notices = self._take_released()
        for ex, name in notices:  # outside the lock: delivering feeds a client, which may call in
            ex._deliver(name)
        return answer

    def _take_released(self) -> list[tuple["MemoryExecutor", bytes]]:
        """(lock held) The notifications queued since the last look, for every connection
        (a release queues one for each connection watching the name)."""
        _lib.lh_memory_service_stats_get(self._h, ctypes.byref(self._stats))
        if self._stats.notifications == self._notified:
            return []
        self._notified = self._stats.notifications
        out = []
        p, n = ctypes.c_void_p(), ctypes.c_size_t()
        for cid, ex in list(self._executors.items()):
            while True:
                try:
                    _lib.lh_memory_service_poll_released(self._h, cid, ctypes.byref(p), ctypes.byref(n))
                except errors.CoreError:
                    break  # disconnected
                if not p.value:
                    break
                out.append((ex, ctypes.string_at(p.value, n.value)))
        return out

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # a forked child must not inherit it held by a thread it lacks


_FLAGS = (
    ("reject_acquires", _ffi.LH_MEMORY_REJECT_ACQUIRES),
    ("reject_renewals", _ffi.LH_MEMORY_REJECT_RENEWALS),
    ("reject_releases", _ffi.LH_MEMORY_REJECT_RELEASES),
    ("drop_requests", _ffi.LH_MEMORY_DROP_REQUESTS),
    ("drop_responses", _ffi.LH_MEMORY_DROP_RESPONSES),
    ("partitioned", _ffi.LH_MEMORY_PARTITIONED),
)


def _switch(attr: str) -> property:
    def get(self: "MemoryExecutor") -> bool:
        return self._switches[attr]

    def set(self: "MemoryExecutor", on: bool) -> None:
        self._push_faults({**self._switches, attr: bool(on)})

    return property(get, set, doc=f"Fault switch ``{attr}`` (applied by the store).")


class MemoryExecutor:
    """One connection to a :class:`MemoryService`, with fault switches (see the module doc):
    the executor of the core's memory protocol; also named ``MemoryLockService``.

    :param store: the shared store; a private one (with ``clock``) when omitted
    :param clock: the clock of the private store (ignored when ``store`` is given)
    :param notifications: deliver release notifications to the client's waiters (without
        them waiters retry with backoff)
    """

    backend_protocol = "memory"
    options = MemoryOptions()
    call_timeout: float | None = None
    """``hang()`` blocks a call until ``unhang()``: no bound, so a client runs this
    executor's calls on its IO pool only (a subclass that never hangs may declare one)."""

    partitioned = _switch("partitioned")
    drop_requests = _switch("drop_requests")
    drop_responses = _switch("drop_responses")
    reject_renewals = _switch("reject_renewals")
    reject_acquires = _switch("reject_acquires")
    reject_releases = _switch("reject_releases")

    def __init__(self, store: MemoryService | None = None, *, clock: Any = None, notifications: bool = True) -> None:
        self.store = store if store is not None else MemoryService(clock=clock)
        self.notifications = notifications
        self._switches = {attr: False for attr, _ in _FLAGS}
        self.delay = 0.0
        self._open = threading.Event()
        self._open.set()
        self._closed = threading.Event()
        self._sink: Any = None
        self._attached = False
        self._cid = self.store._connect(self)
        self._disconnect = weakref.finalize(self, self.store._disconnect, self._cid)
        self._disconnect.atexit = False

    # -- fault switches ---------------------------------------------------------------------------
    def _push_faults(self, switches: dict[str, bool] | None = None, drop_next: int | None = None) -> None:
        # The switches change only once the store took them (a release library refuses).
        switches = self._switches if switches is None else switches
        flags = 0
        for attr, bit in _FLAGS:
            if switches[attr]:
                flags |= bit
        self.store._set_faults(self._cid, flags, drop_next)
        self._switches = switches

    def partition(self) -> None:
        """Cut this connection off (every call fails in transport)."""
        self.partitioned = True

    def heal(self) -> None:
        """Undo every fault switch (and unhang)."""
        self.delay = 0.0
        self._open.set()
        self._push_faults({attr: False for attr, _ in _FLAGS}, 0)

    def drop_next_responses(self, n: int = 1) -> None:
        """Apply the next ``n`` calls, then lose their answers (transport errors)."""
        self._push_faults(drop_next=n)

    def hang(self) -> None:
        """Make every call block until :meth:`unhang` or :meth:`close` (a hung backend)."""
        self._open.clear()

    def unhang(self) -> None:
        self._open.set()

    def step_clock(self, seconds: float) -> None:
        """Jump the store's clock forward (see :meth:`MemoryService.step_clock`)."""
        self.store.step_clock(seconds)

    # -- the executor --------------------------------------------------------------------------------
    def attach(self, sink: Any = None) -> None:
        """A client starts driving this executor (only one at a time); ``sink`` takes the
        release notifications for its connection."""
        if self._attached:
            raise ValueError("this MemoryExecutor already serves a client; make one per client")
        self._attached = True
        self._sink = sink

    def detach(self) -> None:
        """The client stopped (the connection stays: its locks expire as a dead client's)."""
        self._attached = False
        self._sink = None

    def after_fork(self) -> None:
        """(in a forked child) Forget the parent's client; the child's attaches anew."""
        self.store._after_fork()
        self._attached = False
        self._sink = None

    def _enter(self) -> None:
        if self._closed.is_set():
            raise ConnectionError("memory service closed")
        while not self._open.is_set():
            if self._closed.is_set():
                raise ConnectionError("memory service closed")
            self._open.wait(0.5)
        if self._closed.is_set():
            raise ConnectionError("memory service closed")
        if self.delay:
            self.store.wait(self.delay, self._closed)

    def command(self, argv: list[bytes]) -> Answer:
        """Hand one request to the service, unread; its answer. Raises ``ConnectionError``
        when the service dropped it (a fault switch) or the connection is closed."""
        self._enter()
        try:
            answer = self.store._call(self._cid, argv)
        except errors.CoreError as e:
            if e.status == _ffi.LH_ERR_UNKNOWN_CONNECTION:
                raise ConnectionError("memory service closed") from None
            raise
        if answer is None:
            if self.partitioned:
                raise ConnectionError("memory service partitioned")
            if self.drop_requests:
                raise ConnectionError("request dropped")
            raise ConnectionError("response dropped")
        return answer

    def _deliver(self, name: bytes) -> None:
        sink = self._sink
        if sink is not None and self.notifications and not self._closed.is_set():
            sink.message(name, b"")

    def status(self, name: str) -> LockStatus:
        """The store's view of ``name`` (see :meth:`MemoryService.status`); no fault switch applies."""
        return self.store.status(name)

    def close(self) -> None:
        """Fail every later call and wake hung ones. Idempotent."""
        self._closed.set()
        self._open.set()


MemoryStore = MemoryService
"""The first name of :class:`MemoryService`."""

MemoryLockService = MemoryExecutor
"""The first name of :class:`MemoryExecutor`."""
