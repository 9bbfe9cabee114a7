"""SQLite lock service: the embedded default for processes on one host (docs/design.md §6).

One database file holds every lock of the host::

    leasehold_locks    (name PRIMARY KEY, token, fence, expiry_ns, boot_id, pid)
    leasehold_fences   (name PRIMARY KEY, fence)        -- never deleted: fences never reset
    leasehold_watchers (name, addr, pid)                -- cross-process release wake-ups
    leasehold_holders  (name PRIMARY KEY, fence, host, since_ns)  -- who holds it, for status
    leasehold_meta     (key PRIMARY KEY, value)         -- schema version

``leasehold_holders`` describes the grant with that fence (a row whose fence differs from the
lock's describes an earlier grant and is ignored). Opening a file creates missing tables, so a
file written by an older leasehold gains it on first use; older versions ignore the table, so
processes of both versions can share a file (the schema version stays 1: nothing existing
changed).

Every operation is one ``BEGIN IMMEDIATE`` transaction, so the read-check-write of acquire,
renew and release is atomic across threads and processes. The database runs in WAL mode; a
grant commits with ``synchronous=FULL`` by default (the new fence survives a power loss, so a
fencing token is never handed out twice), renewals and releases with ``NORMAL`` (after a power
loss the boot id expires every lock anyway; a later FULL commit syncs the whole WAL). A bounded
busy timeout turns a database that stays locked into a transport error for the core, never a
hang.

**Expiry.** Expiry instants are ``time.monotonic_ns()`` values. On Linux ``CLOCK_MONOTONIC`` is
one system-wide clock, so the values written by one process are comparable in another (processes
in different *time namespaces* are not supported). Each row also stores the kernel's boot id
(``/proc/sys/kernel/random/boot_id``): a row written during an earlier boot counts as expired,
because the monotonic clock restarts at boot and an old expiry could otherwise look far in the
future. A host whose processes sleep in a suspended VM sees the clock stop for everyone alike.

**Fencing tokens** are ``last fence of the name + 1``; the last fence of every name is kept in
``leasehold_fences`` forever (it is never deleted, also not when a lock expires or is released),
so the tokens of one name strictly increase for the life of the file.

**A deleted or replaced file** (a cache cleaner, a user) is noticed before every operation
(one ``stat``): the service reopens the file at the path instead of going on alone with the
unlinked one, so holders' renewals are refused there and they learn that they lost their locks.
The fences of a new file start again at 1, which a fencing gate that saw higher tokens refuses
(safe, but stuck until its mark is reset): keep databases whose fencing tokens matter out of
directories that get cleaned.

**Notifications.** Releases made through this object are delivered to its own watchers at once.
Other processes learn about releases through a cheap wake-up channel (Linux only): a watching
service binds one abstract-namespace Unix datagram socket and registers its address for every
watched name in ``leasehold_watchers``; a releasing process reads the registrations inside its
release transaction and sends one datagram to each after the commit. A lost datagram (the
receiver died, its buffer was full, it lives in another network namespace) only costs latency:
with ``notifications = True`` the core sleeps for the holder's remaining TTL (the retry hint) and
then tries again. Where the channel is not available ``notifications`` is ``False`` and the core
polls with capped exponential backoff.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import secrets
import socket
import sqlite3
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from ..errors import LeaseholdError
from ..service import Granted, HeldByOther, LockService, LockStatus

__all__ = [
    "SQLiteLockService",
    "SQLiteServiceError",
    "LockStatus",
    "current_boot_id",
    "default_path",
]

log = logging.getLogger(__name__)

SCHEMA_VERSION = "1"
_NS_PER_MS = 1_000_000
_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
_STOP = b"\0stop"  # sentinel datagram that ends the listener thread

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS leasehold_meta (
        key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS leasehold_locks (
        name TEXT PRIMARY KEY, token TEXT NOT NULL, fence INTEGER NOT NULL,
        expiry_ns INTEGER NOT NULL, boot_id TEXT NOT NULL, pid INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS leasehold_fences (
        name TEXT PRIMARY KEY, fence INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS leasehold_watchers (
        name TEXT NOT NULL, addr BLOB NOT NULL, pid INTEGER NOT NULL,
        PRIMARY KEY (name, addr))""",
    """CREATE TABLE IF NOT EXISTS leasehold_holders (
        name TEXT PRIMARY KEY, fence INTEGER NOT NULL, host TEXT NOT NULL,
        since_ns INTEGER NOT NULL)""",
)


class SQLiteServiceError(LeaseholdError):
    """The lock database cannot be used: unwritable, corrupt, foreign schema, or closed.

    ``path`` is the database file the error is about.
    """

    def __init__(self, path: str | os.PathLike[str], message: str) -> None:
        self.path = os.fspath(path)
        self.message = message
        super().__init__(f"{message}: {self.path}")


def _wall_us() -> int:
    return time.time_ns() // 1_000  # noqa: a fence floor, not a duration


def current_boot_id() -> str:
    """An identifier of the current boot: a row written under another one is expired."""
    try:
        with open(_BOOT_ID_PATH, encoding="ascii") as f:
            value = f.read().strip()
        if value:
            return value
    except OSError:
        pass
    if sys.platform == "darwin":  # pragma: no cover - not exercised on the Linux CI
        import subprocess

        try:
            out = subprocess.run(
                ["sysctl", "-n", "kern.bootsessionuuid"],
                capture_output=True, text=True, timeout=5, check=True,
            ).stdout.strip()
            if out:
                return out
        except (OSError, subprocess.SubprocessError):
            pass
    # Last resort: the wall-clock instant of boot, to the minute. Stable within one boot
    # unless the wall clock is stepped by more than that.
    boot = time.time() - time.monotonic()  # noqa: clock use is the point here
    return f"boottime-{int(boot // 60)}"


def default_path() -> Path:
    """``$XDG_CACHE_HOME/leasehold/locks.sqlite3`` (``~/.cache`` when the variable is unset)."""
    cache = os.environ.get("XDG_CACHE_HOME") or ""
    base = Path(cache) if os.path.isabs(cache) else Path.home() / ".cache"
    return base / "leasehold" / "locks.sqlite3"


_live_services: weakref.WeakSet[SQLiteLockService] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for svc in list(_live_services):
        svc._reset_lock_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _notify_supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(socket, "AF_UNIX")


class SQLiteLockService(LockService):
    """A :class:`~leasehold.service.LockService` on one SQLite file, for processes on one host.

    Thread-safe: one connection per service object, used under a lock (SQLite serializes
    writers anyway); a forked child opens its own connection on first use.

    :param path: the database file; it is created if missing (its directory must exist).
    :param busy_timeout: seconds an operation waits for another process's transaction before
        it fails (a transport error for the core).
    :param durable: ``synchronous=FULL`` (default) or ``NORMAL`` (faster; a power loss may
        forget the last grants, and with them fences: only for throwaway data).
    :param notify: cross-process release wake-ups; ``None`` = where supported (Linux).
    :param boot_id: override the boot id (tests simulate a reboot with it).
    :param clock: override the monotonic clock in ns (tests only: every process sharing a
        file must use the same clock).
    :param wall_clock: override the wall clock in µs since the epoch that fences are minted
        from (tests only). Fences are ``max(previous + 1, wall clock)``, so they keep
        increasing even when the file is deleted and the fence table starts again.
    :raises SQLiteServiceError: the file cannot be opened, created or written, is not a
        leasehold database, or is corrupt.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 5.0,
        durable: bool = True,
        notify: bool | None = None,
        boot_id: str | None = None,
        clock: Callable[[], int] | None = None,
        wall_clock: Callable[[], int] | None = None,
    ) -> None:
        if not isinstance(busy_timeout, (int, float)) or not (0 <= busy_timeout < math.inf):
            raise ValueError(f"busy_timeout must be a finite number of seconds >= 0, got {busy_timeout!r}")
        raw = os.fspath(path)
        if not raw or raw == ":memory:" or raw.startswith("file:"):
            raise ValueError("SQLiteLockService needs a file path (use MemoryLockService in-process)")
        self.path = os.path.abspath(raw)  # a later chdir() must not switch files
        self._busy_timeout = float(busy_timeout)
        self._durable = bool(durable)
        self._sync_mode = ""  # the connection's current PRAGMA synchronous
        self._boot_id = boot_id if boot_id is not None else current_boot_id()
        self._clock = clock if clock is not None else time.monotonic_ns
        self._wall_us = wall_clock if wall_clock is not None else _wall_us
        self._lock = threading.RLock()
        _live_services.add(self)
        self._closed = False
        self._pid = os.getpid()
        self._conn: sqlite3.Connection | None = None
        self._ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the file we opened
        self._inherited: list[Any] = []  # objects from before a fork: kept open, never used
        self._watch: dict[str, Callable[[str], None]] = {}
        self._sock: socket.socket | None = None
        self._addr: bytes | None = None
        self._sender: socket.socket | None = None
        self._listener: threading.Thread | None = None
        self.notifications = _notify_supported() if notify is None else bool(notify)
        if self.notifications and not _notify_supported():
            raise ValueError("cross-process notifications need Linux abstract Unix sockets")
        self._conn = self._open()

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> SQLiteLockService:
        """``sqlite:///abs/path``, ``sqlite:relative/path`` or ``sqlite://`` (the default path)."""
        return cls(path_from_url(url), **kwargs)

    def _open(self) -> sqlite3.Connection:
        p = self.path
        if os.path.isdir(p):
            raise SQLiteServiceError(p, "lock database path is a directory")
        parent = os.path.dirname(os.path.abspath(p))
        if not os.path.isdir(parent):
            what = "is not a directory" if os.path.exists(parent) else "does not exist"
            raise SQLiteServiceError(p, f"the lock database's directory {parent!r} {what}")
        try:
            conn = sqlite3.connect(
                p, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as e:
            raise SQLiteServiceError(p, _describe(e)) from e
        try:
            self._init_db(conn)
            self._ident = _file_ident(p)
        except SQLiteServiceError:
            conn.close()
            raise
        except sqlite3.Error as e:
            conn.close()
            raise SQLiteServiceError(p, _describe(e)) from e
        return conn

    def _init_db(self, conn: sqlite3.Connection) -> None:
        # Fails with "file is not a database" for a foreign file, "readonly" when unwritable.
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise SQLiteServiceError(self.path, f"cannot switch the lock database to WAL mode (got {mode!r})")
        conn.execute("PRAGMA synchronous=FULL")
        self._sync_mode = "FULL"
        ok = conn.execute("PRAGMA quick_check").fetchall()
        if ok != [("ok",)]:
            detail = "; ".join(str(r[0]) for r in ok[:3])
            raise SQLiteServiceError(self.path, f"lock database is corrupt ({detail})")
        conn.execute("BEGIN IMMEDIATE")  # proves the file is writable
        try:
            for stmt in _SCHEMA:
                conn.execute(stmt)
            row = conn.execute("SELECT value FROM leasehold_meta WHERE key='schema'").fetchone()
            if row is None:
                conn.execute("INSERT INTO leasehold_meta(key, value) VALUES ('schema', ?)", (SCHEMA_VERSION,))
            elif row[0] != SCHEMA_VERSION:
                raise SQLiteServiceError(
                    self.path, f"lock database has schema version {row[0]!r}, this leasehold uses {SCHEMA_VERSION!r}"
                )
            cols = [r[1] for r in conn.execute("PRAGMA table_info(leasehold_locks)")]
            if cols != ["name", "token", "fence", "expiry_ns", "boot_id", "pid"]:
                raise SQLiteServiceError(self.path, f"table leasehold_locks has unexpected columns {cols}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    # ------------------------------------------------------------------ plumbing

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise SQLiteServiceError(self.path, "SQLiteLockService is closed")
        if os.getpid() != self._pid:
            self._after_fork()
        if self._conn is None or _file_ident(self.path) != self._ident:
            self._reopen()
        assert self._conn is not None
        return self._conn

    def _reopen(self) -> None:
        # The file was deleted or replaced (a cache cleaner, a user): our connection still works
        # on the unlinked inode that no other process will ever open again, so holding on to it
        # would make two disjoint lock worlds. Switch to the file at the path: locks held in the
        # old one are then unknown (renewals are refused: the holders learn they lost them).
        old, self._conn = self._conn, None
        if old is not None:
            log.warning("leasehold: lock database %s was deleted or replaced; reopening it", self.path)
            try:
                old.close()
            except sqlite3.Error:
                pass
        self._sync_mode = ""
        self._conn = self._open()  # SQLiteServiceError if it cannot be recreated: retried next call
        if self._watch and self.notifications and self._addr is not None:
            with self._txn() as conn:
                for name in self._watch:
                    self._register(conn, name)

    def _reset_lock_in_child(self) -> None:
        # Another thread may have held the lock at fork(): the child's copy would stay locked.
        self._lock = threading.RLock()

    def _after_fork(self) -> None:
        # SQLite connections (and their locks) must not be used across fork(): keep the
        # inherited objects referenced so they are never closed in the child, open new ones.
        self._inherited.extend(x for x in (self._conn, self._sock, self._sender) if x is not None)
        self._conn = self._sock = self._sender = None
        self._addr = None
        self._listener = None
        self._pid = os.getpid()
        self._sync_mode = ""
        self._conn = self._open()
        if self._watch and self.notifications:
            self._ensure_listener()
            with self._txn() as conn:
                for name in self._watch:
                    self._register(conn, name)

    @contextmanager
    def _txn(self, *, durable: bool = False, write: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction; ``durable``: its commit must survive a power loss (new fences)."""
        with self._lock:
            conn = self._connection()
            try:
                mode = "FULL" if durable and self._durable else "NORMAL"
                if mode != self._sync_mode:
                    conn.execute(f"PRAGMA synchronous={mode}")
                    self._sync_mode = mode
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.Error as e:
                raise _as_service_error(self.path, e) from e
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as e:
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:  # pragma: no cover - best effort
                        log.exception("leasehold: ROLLBACK failed on %s", self.path)
                if isinstance(e, sqlite3.Error):
                    raise _as_service_error(self.path, e) from e
                raise

    def _now(self) -> int:
        return int(self._clock())

    def _live(self, row: tuple[Any, ...] | None, now: int) -> bool:
        """Is the lock row (token, fence, expiry_ns, boot_id, pid) still held at ``now``?"""
        return row is not None and row[3] == self._boot_id and row[2] > now

    # ------------------------------------------------------------------ LockService

    def acquire(self, name: str, token: str, ttl_ms: int) -> Granted | HeldByOther:
        _check(name, token, ttl_ms)
        with self._txn(durable=True) as conn:
            now = self._now()  # read inside the transaction: no writer can interleave
            row = conn.execute(
                "SELECT token, fence, expiry_ns, boot_id, pid FROM leasehold_locks WHERE name=?", (name,)
            ).fetchone()
            if row is not None and self._live(row, now):
                if row[0] == token:  # idempotent: our own grant, refresh it
                    conn.execute(
                        "UPDATE leasehold_locks SET expiry_ns=? WHERE name=?", (now + ttl_ms * _NS_PER_MS, name)
                    )
                    return Granted(fencing_token=int(row[1]), ttl_ms=ttl_ms)
                remaining = max(1, -(-(row[2] - now) // _NS_PER_MS))
                return HeldByOther(retry_after_ms=int(remaining))
            last = conn.execute("SELECT fence FROM leasehold_fences WHERE name=?", (name,)).fetchone()
            fence = max(max(last[0] if last else 0, row[1] if row else 0) + 1, int(self._wall_us()))
            conn.execute(
                "INSERT OR REPLACE INTO leasehold_locks(name, token, fence, expiry_ns, boot_id, pid)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (name, token, fence, now + ttl_ms * _NS_PER_MS, self._boot_id, os.getpid()),
            )
            conn.execute("INSERT OR REPLACE INTO leasehold_fences(name, fence) VALUES (?, ?)", (name, fence))
            conn.execute(
                "INSERT OR REPLACE INTO leasehold_holders(name, fence, host, since_ns) VALUES (?, ?, ?, ?)",
                (name, fence, _hostname(), now),
            )
            return Granted(fencing_token=fence, ttl_ms=ttl_ms)

    def renew(self, name: str, token: str, ttl_ms: int, backend_data: bytes = b"") -> bool:
        _check(name, token, ttl_ms)
        with self._txn() as conn:
            now = self._now()
            row = conn.execute(
                "SELECT token, fence, expiry_ns, boot_id, pid FROM leasehold_locks WHERE name=?", (name,)
            ).fetchone()
            # An expired row is not renewed even with the right token: the lock was free for a
            # while and someone may have used that (no silent re-acquire on renew).
            if row is None or row[0] != token or not self._live(row, now):
                return False
            conn.execute("UPDATE leasehold_locks SET expiry_ns=? WHERE name=?", (now + ttl_ms * _NS_PER_MS, name))
            return True

    def release(self, name: str, token: str, backend_data: bytes = b"") -> bool:
        _check(name, token, None)
        with self._txn() as conn:
            now = self._now()
            row = conn.execute(
                "SELECT token, fence, expiry_ns, boot_id, pid FROM leasehold_locks WHERE name=?", (name,)
            ).fetchone()
            if row is None or row[0] != token:
                return False
            live = self._live(row, now)
            conn.execute("DELETE FROM leasehold_locks WHERE name=?", (name,))  # ours, live or not
            if not live:
                return False  # it had run out: there was nothing left to release
            addrs = [a for (a,) in conn.execute("SELECT addr FROM leasehold_watchers WHERE name=?", (name,))]
        self._notify(name, addrs)
        return True

    def watch(self, name: str, on_released: Callable[[str], None]) -> None:
        if not callable(on_released):
            raise TypeError("on_released must be callable")
        with self._lock:
            self._connection()
            self._watch[name] = on_released
            if not self.notifications:
                return
            self._ensure_listener()
            with self._txn() as conn:
                self._register(conn, name)
                row = conn.execute(
                    "SELECT token, fence, expiry_ns, boot_id, pid FROM leasehold_locks WHERE name=?", (name,)
                ).fetchone()
                free = not self._live(row, self._now())
        # A release that committed before the registration sent us nothing: if the lock is free
        # now, say so once (a spurious wake only costs the core one extra attempt).
        if free:
            self._deliver(name)

    def unwatch(self, name: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._connection()
            if self._watch.pop(name, None) is None or self._addr is None:
                return
            with self._txn() as conn:
                conn.execute("DELETE FROM leasehold_watchers WHERE name=? AND addr=?", (name, self._addr))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            forked = os.getpid() != self._pid
            try:
                if not forked and self._addr is not None and self._conn is not None:
                    with self._txn() as conn:
                        conn.execute("DELETE FROM leasehold_watchers WHERE addr=?", (self._addr,))
            except Exception:  # closing never fails because the file went bad
                log.warning("leasehold: could not unregister watchers in %s", self.path, exc_info=True)
            self._closed = True
            self._watch.clear()
            if not forked:
                if self._sock is not None and self._addr is not None and self._sender is not None:
                    try:
                        self._sender.sendto(_STOP, self._addr)
                    except OSError:
                        pass
                for obj in (self._sender, self._conn):
                    if obj is not None:
                        obj.close()
            listener = self._listener
            self._conn = self._sender = None
        if listener is not None and listener is not threading.current_thread():
            listener.join(timeout=5)
        with self._lock:
            if self._sock is not None and not forked:
                self._sock.close()
            self._sock = None

    def __enter__(self) -> SQLiteLockService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SQLiteLockService({self.path!r})"

    # ------------------------------------------------------------------ inspection

    def status(self, name: str) -> LockStatus:
        """The state of ``name`` as stored (read-only; advisory for humans and tools)."""
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string")
        with self._txn(write=False) as conn:
            now = self._now()
            row = conn.execute(
                "SELECT token, fence, expiry_ns, boot_id, pid FROM leasehold_locks WHERE name=?", (name,)
            ).fetchone()
            last = conn.execute("SELECT fence FROM leasehold_fences WHERE name=?", (name,)).fetchone()
            holder = conn.execute("SELECT fence, host, since_ns FROM leasehold_holders WHERE name=?", (name,)).fetchone()
        last_fence = last[0] if last else None
        if row is not None and self._live(row, now):
            same_grant = holder is not None and holder[0] == row[1]
            return LockStatus(
                name=name, held=True, fencing_token=int(row[1]),
                remaining_ttl_ms=int(max(1, -(-(row[2] - now) // _NS_PER_MS))),
                holder_pid=int(row[4]) or None, last_fencing_token=last_fence,
                holder_host=(str(holder[1]) or None) if same_grant else None,
                held_for_ms=max(0, (now - int(holder[2])) // _NS_PER_MS) if same_grant else None,
            )
        return LockStatus(name=name, held=False, fencing_token=None, remaining_ttl_ms=None,
                          holder_pid=None, last_fencing_token=last_fence)

    # ------------------------------------------------------------------ notifications

    def _register(self, conn: sqlite3.Connection, name: str) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO leasehold_watchers(name, addr, pid) VALUES (?, ?, ?)",
            (name, self._addr, os.getpid()),
        )

    def _ensure_listener(self) -> None:
        if self._sock is not None:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        addr = b"\0leasehold-" + secrets.token_hex(12).encode()
        sock.bind(addr)
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sender.setblocking(False)
        self._sock, self._addr, self._sender = sock, addr, sender
        t = threading.Thread(target=self._listen, args=(sock,), name="leasehold-sqlite-notify", daemon=True)
        self._listener = t
        t.start()

    def _listen(self, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(4096)
            except OSError:
                return
            if data == _STOP or self._closed:
                return
            try:
                name = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            self._deliver(name)

    def _deliver(self, name: str) -> None:
        cb = self._watch.get(name)
        if cb is None:
            return
        try:
            cb(name)
        except Exception:  # a callback never breaks the service
            log.exception("leasehold: release callback for %r failed", name)

    def _notify(self, name: str, addrs: list[bytes]) -> None:
        self._deliver(name)  # this object's own watcher: at once
        stale: list[bytes] = []
        payload = name.encode("utf-8")
        with self._lock:
            sender = self._sender
            if sender is None and addrs and self.notifications:
                sender = self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                sender.setblocking(False)
            for addr in addrs:
                if addr == self._addr or sender is None:
                    continue
                try:
                    sender.sendto(payload, addr)
                except (ConnectionRefusedError, FileNotFoundError):
                    stale.append(addr)  # its process is gone
                except OSError as e:  # full buffer etc.: the waiter falls back on its retry hint
                    if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS):
                        log.debug("leasehold: release wake-up to %r failed: %s", addr, e)
        if stale:
            try:
                with self._txn() as conn:
                    conn.executemany("DELETE FROM leasehold_watchers WHERE addr=?", [(a,) for a in stale])
            except Exception:
                log.debug("leasehold: could not drop stale watchers", exc_info=True)


# ---------------------------------------------------------------------- helpers


def _hostname() -> str:
    try:
        return socket.gethostname()
    except OSError:  # pragma: no cover - gethostname does not fail on Linux
        return ""


def _file_ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _check(name: object, token: object, ttl_ms: object) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    if not isinstance(token, str) or not token:
        raise ValueError("token must be a non-empty string")
    if ttl_ms is not None and (not isinstance(ttl_ms, int) or isinstance(ttl_ms, bool) or ttl_ms <= 0):
        raise ValueError(f"ttl_ms must be a positive int, got {ttl_ms!r}")


def _describe(e: sqlite3.Error) -> str:
    text = str(e)
    low = text.lower()
    if "not a database" in low or "malformed" in low or "corrupt" in low:
        return f"lock database is corrupt or not a SQLite file ({text})"
    if "readonly" in low or "read-only" in low or "unable to open" in low or "permission" in low:
        return f"lock database is not writable ({text})"
    if "locked" in low or "busy" in low:
        return f"lock database stayed busy past the busy timeout ({text})"
    return f"lock database error ({text})"


def _as_service_error(path: str, e: sqlite3.Error) -> SQLiteServiceError:
    return SQLiteServiceError(path, _describe(e))


def path_from_url(url: str) -> Path:
    """Map a ``sqlite:`` URL to a path: ``sqlite:///abs/path`` (absolute), ``sqlite:rel/path``
    (relative to the working directory), ``sqlite://`` or ``sqlite:`` (the default path)."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise ValueError(f"not a sqlite: URL: {url!r}")
    if parts.netloc:
        raise ValueError(f"sqlite URLs have no host part (use sqlite:///absolute/path): {url!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"sqlite URLs take no query or fragment: {url!r}")
    path = unquote(parts.path)
    if not path:
        return default_path()
    return Path(path)
