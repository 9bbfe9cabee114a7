"""An in-process reference lock service with fault switches.

The names are those of every binding (Go's ``MemoryService`` / ``MemoryExecutor``); the first
ones, ``MemoryStore`` and ``MemoryLockService``, are aliases.

* :class:`MemoryService` is the "server": the core's reference service (``lh_memory_service_*``,
  the one every binding tests against) with locks, fencing counters and its own clock
  (``store.step_clock()`` jumps it forward, expiring leases on the server side only).
* :class:`MemoryExecutor` (a :class:`~leasehold.service.LockService`) is one *connection* to
  a store, with its own fault switches, so a test can partition one client while the others
  keep working. Several clients contend for the same locks by each using their own
  connection on one shared store::

      store = MemoryService()
      a = LockClient(MemoryExecutor(store))
      b = LockClient(MemoryExecutor(store))

Semantics match the other backends: acquire is idempotent for the same token (same fencing
token, TTL refreshed) and returns the holder's remaining TTL otherwise; renew and release
compare the token first; release notifies every connection watching the name.

Fault switches (attributes of a service, change them at any time):

* ``partitioned`` – every call raises ``ConnectionError`` before reaching the store;
* ``drop_requests`` – same, but counted separately (a lost request);
* ``drop_responses`` – the call is applied, then ``ConnectionError`` (a lost answer);
  :meth:`MemoryExecutor.drop_next_responses` does that for the next *n* calls only;
* ``reject_renewals`` – renew answers ``False`` (the service refuses: the lease is lost);
* ``reject_acquires`` – acquire answers "held by another";
* ``reject_releases`` – release answers ``False`` (the grant stays until it expires);
* ``delay`` – seconds every call takes, measured on the store's clock (with a
  :class:`~leasehold.testing.FakeClock` the call waits until the test advances it);
* :meth:`MemoryExecutor.hang` / :meth:`MemoryExecutor.unhang` – calls block until
  ``unhang()`` (or ``close()``): a hung backend.

The store applies the first six; delay, hang and the call counters belong to the host.
Those six, ``step_clock`` and ``forget`` need a library built with the ``testing`` feature
(the test suites build one); with a release library, turning one on raises
:class:`~leasehold.errors.LibraryError` saying so, while ``heal()``, ``delay`` and ``hang()``
still work.
"""

from __future__ import annotations

import collections
import ctypes
import os
import socket
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from .. import _ffi, errors
from .._clock import resolve_clock
from ..service import Granted, HeldByOther, LockService, LockStatus

__all__ = ["MemoryService", "MemoryExecutor", "MemoryStore", "MemoryLockService", "LockRecord"]

_HOST = socket.gethostname()
_lib = _ffi.lib


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
        self._services: "weakref.WeakSet[MemoryExecutor]" = weakref.WeakSet()
        self._fence_seen: dict[str, int] = {}
        self.grants: list[tuple[str, str, int]] = []
        """Every new grant, in order: (name, token, fencing_token)."""

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

    def forget(self, name: str) -> None:
        """Drop the grant of ``name`` without a notification, as a failover that lost the key
        would: the holder's next renew is rejected. The fence is kept."""
        raw = _name_bytes(name)
        with self._lock:
            _ffi.hook("lh_memory_service_forget")(self._h, raw, len(raw))

    # -- operations without fault switches (the store's own connection) ----------------------------
    def _direct(self) -> int:
        cid = self.__dict__.get("_direct_cid")
        if cid is None:
            c = ctypes.c_uint64()
            with self._lock:
                _lib.lh_memory_service_connect(self._h, ctypes.byref(c))
            cid = self._direct_cid = c.value
        return cid

    def acquire(self, name: str, token: str, ttl_ms: int) -> Granted | HeldByOther:
        return _acquire_reply(self._request("acquire", self._direct(), name, token, ttl_ms))

    def renew(self, name: str, token: str, ttl_ms: int) -> bool:
        return self._request("renew", self._direct(), name, token, ttl_ms).outcome == _ffi.LH_MEMORY_RENEWED

    def release(self, name: str, token: str) -> bool:
        return self._request("release", self._direct(), name, token, 1).outcome == _ffi.LH_MEMORY_RELEASED

    # -- connections (called by services) --------------------------------------------------------
    def _connect(self, service: "MemoryExecutor") -> int:
        cid = ctypes.c_uint64()
        with self._lock:
            _lib.lh_memory_service_connect(self._h, ctypes.byref(cid))
        self._services.add(service)
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

    def _watch(self, cid: int, name: str, on: bool) -> None:
        raw = _name_bytes(name)
        fn = _lib.lh_memory_service_watch if on else _lib.lh_memory_service_unwatch
        with self._lock:
            fn(self._h, cid, raw, len(raw))

    def _request(self, op: str, cid: int, name: str, token: str, ttl_ms: int) -> _ffi.lh_memory_result:
        raw = _name_bytes(name)
        tok = token.encode("utf-8", "surrogateescape")
        r = _ffi.lh_memory_result()
        r.struct_size = ctypes.sizeof(r)
        notices: list[tuple[MemoryExecutor, str]] = []
        with self._lock:
            now = self._host_now()
            if op == "acquire":
                _lib.lh_memory_service_acquire(self._h, cid, now, raw, len(raw), tok, len(tok), ttl_ms, ctypes.byref(r))
                self._note_grant(name, token, r)
            elif op == "renew":
                _lib.lh_memory_service_renew(self._h, cid, now, raw, len(raw), tok, len(tok), ttl_ms, ctypes.byref(r))
            else:
                _lib.lh_memory_service_release(self._h, cid, now, raw, len(raw), tok, len(tok), ctypes.byref(r))
                if r.outcome in (_ffi.LH_MEMORY_RELEASED, _ffi.LH_MEMORY_DROPPED):
                    notices = self._poll_released(name)  # queued even when the answer is lost
        for s, n in notices:  # outside the lock: callbacks may call back in
            s._deliver(n)
        return r

    def _note_grant(self, name: str, token: str, r: _ffi.lh_memory_result) -> None:
        # A new grant has a fence above every earlier one of the name; a refresh repeats it.
        fence = r.fencing_token
        if r.outcome == _ffi.LH_MEMORY_DROPPED:  # applied or not, the answer is lost: look
            raw = _name_bytes(name)
            st = _ffi.lh_memory_status()
            st.struct_size = ctypes.sizeof(st)
            _lib.lh_memory_service_status(self._h, self._host_now(), raw, len(raw), ctypes.byref(st))
            if not st.held or bytes(st.holder_token[: st.holder_token_len]) != token.encode("utf-8", "surrogateescape"):
                return
            fence = st.fencing_token
        elif r.outcome != _ffi.LH_MEMORY_GRANTED:
            return
        if fence > self._fence_seen.get(name, 0):
            self._fence_seen[name] = fence
            self.grants.append((name, token, int(fence)))

    def _poll_released(self, name: str) -> list[tuple["MemoryExecutor", str]]:
        # The store queued a notification for every connection watching the name (queues are
        # drained here after every release, so only those can have one).
        out = []
        p = ctypes.c_void_p()
        n = ctypes.c_size_t()
        for s in list(self._services):
            if name not in s._watchers:
                continue
            while True:
                _lib.lh_memory_service_poll_released(self._h, s._cid, ctypes.byref(p), ctypes.byref(n))
                if not p.value:
                    break
                out.append((s, ctypes.string_at(p.value, n.value).decode("utf-8", "surrogatepass")))
        return out


def _acquire_reply(r: _ffi.lh_memory_result) -> Granted | HeldByOther:
    if r.outcome == _ffi.LH_MEMORY_GRANTED:
        return Granted(r.fencing_token, r.ttl_ms)
    hint = r.retry_after_ms
    return HeldByOther(None if hint == _ffi.LH_NO_RETRY_HINT else hint)


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


class MemoryExecutor(LockService):
    """One connection to a :class:`MemoryService`, with fault switches (see the module doc);
    also named ``MemoryLockService``.

    :param store: the shared store; a private one (with ``clock``) when omitted
    :param clock: the clock of the private store (ignored when ``store`` is given)
    :param notifications: deliver release notifications to watchers
    """

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
        self._wlock = threading.Lock()
        self._watchers: dict[str, Callable[[str], None]] = {}
        self.calls: collections.Counter[str] = collections.Counter()
        """Calls that reached this service, by operation."""
        self.called: collections.defaultdict[str, threading.Event] = collections.defaultdict(threading.Event)
        """``called[op]`` is set once ``op`` was called (tests wait on it instead of sleeping)."""
        self.tokens: list[str] = []
        """Ownership tokens seen in acquire calls, in order."""
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
        """Cut this connection off (every call fails with ``ConnectionError``)."""
        self.partitioned = True

    def heal(self) -> None:
        """Undo every fault switch (and unhang)."""
        self.delay = 0.0
        self._open.set()
        self._push_faults({attr: False for attr, _ in _FLAGS}, 0)

    def drop_next_responses(self, n: int = 1) -> None:
        """Apply the next ``n`` calls, then lose their answers (``ConnectionError``)."""
        self._push_faults(drop_next=n)

    def hang(self) -> None:
        """Make every call block until :meth:`unhang` or :meth:`close` (a hung backend)."""
        self._open.clear()

    def unhang(self) -> None:
        self._open.set()

    def step_clock(self, seconds: float) -> None:
        """Jump the store's clock forward (see :meth:`MemoryService.step_clock`)."""
        self.store.step_clock(seconds)

    # -- LockService -------------------------------------------------------------------------------
    def _enter(self, op: str) -> None:
        self.calls[op] += 1
        self.called[op].set()
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

    def _call(self, op: str, name: str, token: str, ttl_ms: int) -> _ffi.lh_memory_result:
        try:
            r = self.store._request(op, self._cid, name, token, ttl_ms)
        except errors.CoreError as e:
            if e.status == _ffi.LH_ERR_UNKNOWN_CONNECTION:
                raise ConnectionError("memory service closed") from None
            raise
        if r.outcome == _ffi.LH_MEMORY_DROPPED:
            if self.partitioned:
                raise ConnectionError(f"memory service partitioned ({op})")
            if self.drop_requests:
                raise ConnectionError(f"request dropped ({op})")
            raise ConnectionError(f"response dropped ({op})")
        if r.outcome == _ffi.LH_MEMORY_FULL:
            raise ConnectionError(f"memory store full ({op})")
        return r

    def acquire(self, name: str, token: str, ttl_ms: int) -> Granted | HeldByOther:
        self._enter("acquire")
        self.tokens.append(token)
        return _acquire_reply(self._call("acquire", name, token, ttl_ms))

    def renew(self, name: str, token: str, ttl_ms: int, backend_data: bytes) -> bool:
        self._enter("renew")
        return self._call("renew", name, token, ttl_ms).outcome == _ffi.LH_MEMORY_RENEWED

    def release(self, name: str, token: str, backend_data: bytes) -> bool:
        self._enter("release")
        return self._call("release", name, token, 1).outcome == _ffi.LH_MEMORY_RELEASED

    def status(self, name: str) -> LockStatus:
        """The store's view of ``name`` (see :meth:`MemoryService.status`); no fault switch applies."""
        return self.store.status(name)

    def watch(self, name: str, on_released: Callable[[str], None]) -> None:
        with self._wlock:
            first = name not in self._watchers
            self._watchers[name] = on_released
            if first and self.notifications and not self._closed.is_set():
                self.store._watch(self._cid, name, True)

    def unwatch(self, name: str) -> None:
        with self._wlock:
            if self._watchers.pop(name, None) is not None and self.notifications and not self._closed.is_set():
                self.store._watch(self._cid, name, False)

    def close(self) -> None:
        """Fail every later call and wake hung ones. Idempotent."""
        self._closed.set()
        self._open.set()

    def _deliver(self, name: str) -> None:
        if not self.notifications or self._closed.is_set():
            return
        with self._wlock:
            cb = self._watchers.get(name)
        if cb is not None:
            cb(name)


MemoryStore = MemoryService
"""The first name of :class:`MemoryService`."""

MemoryLockService = MemoryExecutor
"""The first name of :class:`MemoryExecutor`."""
