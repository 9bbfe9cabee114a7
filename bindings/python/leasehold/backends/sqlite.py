"""SQLite: the embedded default for processes on one host.

:class:`SQLiteLockService` is the name this default has always had; it is a
:class:`~leasehold.backends.sql_executor.SqliteExecutor`, so the core speaks the SQL protocol
itself (``docs/sql-protocol.md``: the schema and its migration, every statement, the meaning of
every row) and this module writes no SQL. The file is the one every binding's SQLite executor
shares (Go's ``SQLiteTransport``, C++'s ``SqliteTransport``, C), and files written by earlier
versions of this module open unchanged (the core's schema is theirs).

What the service adds to the executor: it checks the file when it is made (a clear
:class:`SQLiteServiceError` instead of an acquire that times out), ``status(name)`` for
``leasehold status``, ``sqlite:`` URLs and the default path.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from .._backend import backend_status, host_facts
from .._urls import redact
from .._core import HostFact
from ..errors import LeaseholdError
from ..service import LockStatus
from .sql_executor import SqliteExecutor, sqlite_file_problem

__all__ = [
    "SQLiteLockService",
    "SQLiteServiceError",
    "LockStatus",
    "current_boot_id",
    "default_path",
    "path_from_url",
]

_MAX_BUSY_MS = 600_000  # the core's bound on the busy timeout
_PROBE_NAME = "leasehold"  # any name: the check only needs the migration to run


class SQLiteServiceError(LeaseholdError):
    """The lock database cannot be used: unwritable, corrupt, foreign schema, or busy.

    ``path`` is the database file the error is about.
    """

    def __init__(self, path: str | os.PathLike[str], message: str) -> None:
        self.path = os.fspath(path)
        self.message = message
        super().__init__(f"{message}: {self.path}")


def current_boot_id() -> str:
    """The boot id the SQL protocol stores beside each expiry (``/proc/sys/kernel/random/boot_id``;
    empty where there is none): a row written under another one counts as expired."""
    return str(host_facts()[HostFact.BOOT_ID])


def default_path() -> Path:
    """``$XDG_CACHE_HOME/leasehold/locks.sqlite3`` (``~/.cache`` when the variable is unset).
    :class:`SQLiteLockService` creates its missing directories ``0700`` and the file ``0600``."""
    cache = os.environ.get("XDG_CACHE_HOME") or ""
    base = Path(cache) if os.path.isabs(cache) else Path.home() / ".cache"
    return base / "leasehold" / "locks.sqlite3"


def path_from_url(url: str) -> Path:
    """Map a ``sqlite:`` URL to a path: ``sqlite:///abs/path`` (absolute), ``sqlite:rel/path``
    (relative to the working directory), ``sqlite://`` or ``sqlite:`` (the default path)."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise ValueError(f"not a sqlite: URL: {redact(url)}")
    if parts.netloc:
        raise ValueError(f"sqlite URLs have no host part (use sqlite:///absolute/path): {redact(url)}")
    if parts.query or parts.fragment:
        raise ValueError(f"sqlite URLs take no query or fragment: {redact(url)}")
    path = unquote(parts.path)
    if not path:
        return default_path()
    return Path(path)


_Overrides = dict[HostFact, Callable[[], Any]]


def _facts(overrides: _Overrides) -> dict[HostFact, Any]:
    facts = host_facts()
    for fact, read in overrides.items():
        facts[fact] = read()
    return facts


class _StatusReader(SqliteExecutor):
    """The connection a status query runs on (the service's own may serve a client)."""

    def __init__(self, path: str, busy_timeout_ms: int, overrides: _Overrides) -> None:
        super().__init__(path, busy_timeout_ms=busy_timeout_ms)
        self._overrides = overrides

    def _host_facts(self) -> dict[HostFact, Any]:
        return _facts(self._overrides)


class SQLiteLockService(SqliteExecutor):
    """The embedded default: a :class:`~leasehold.backends.sql_executor.SqliteExecutor` on one
    SQLite file shared by the processes of one host. Give it to ``LockClient`` or
    ``AsyncLockClient`` (one client at a time)::

        with LockClient(SQLiteLockService("locks.sqlite3")) as client: ...

    Every operation is one ``BEGIN IMMEDIATE`` transaction of the core's SQL protocol (WAL;
    grants committed with ``synchronous=FULL``); fences are ``max(previous + 1, wall clock
    µs)`` from a table that is never reset, so they keep increasing even when the file is
    deleted; expiry is on the host's ``CLOCK_MONOTONIC`` under the boot id. A file deleted or
    replaced at the path is followed (locks held in the old one are lost and their holders
    learn it). There are no release notifications: waiters retry at the holder's expiry or
    by backoff (capped at half a second).

    :param path: the database file; it is created ``0600`` if missing (its directory must
        exist, except for :func:`default_path`, whose missing directories are created
        ``0700``). It is checked (and migrated) at once. A symbolic link at the path is
        refused, never followed; a file or directory that another user owns or may write is
        reported as a warning on the ``leasehold`` logger.
    :param busy_timeout: seconds an operation waits for another process's transaction before
        it fails (a transport error for the core); at most 600.
    :param durable: ignored: grants are always committed with ``synchronous=FULL``.
    :param notify: ignored: the SQL protocol has no release wake-ups on SQLite.
    :param boot_id: override the boot id (tests simulate a reboot with it).
    :param clock: override ``CLOCK_MONOTONIC`` in ns that expiry is written in (tests only:
        every process sharing a file must use the same clock).
    :param wall_clock: override the wall clock in µs since the epoch that fences are minted
        from (tests only).
    :raises SQLiteServiceError: the file cannot be opened, created or written, is a symbolic
        link, is not a leasehold database, is corrupt, or stayed busy past the busy timeout.
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
        if (
            isinstance(busy_timeout, bool)
            or not isinstance(busy_timeout, (int, float))
            or not (0 <= busy_timeout < math.inf)
        ):
            raise ValueError(f"busy_timeout must be a finite number of seconds >= 0, got {busy_timeout!r}")
        if busy_timeout * 1000 > _MAX_BUSY_MS:
            raise ValueError(f"busy_timeout must be at most {_MAX_BUSY_MS // 1000} s, got {busy_timeout!r}")
        raw = os.fspath(path)
        if not raw or raw == ":memory:" or raw.startswith("file:"):
            raise ValueError("SQLiteLockService needs a file path (use MemoryLockService in-process)")
        overrides: _Overrides = {}
        if boot_id is not None:
            overrides[HostFact.BOOT_ID] = lambda: boot_id
        if clock is not None:
            overrides[HostFact.MONOTONIC_NS] = lambda: int(clock())
        if wall_clock is not None:
            overrides[HostFact.WALL_US] = lambda: int(wall_clock())
        self._busy_ms = round(busy_timeout * 1000)
        self._overrides = overrides
        # Absolute: a later chdir() must not switch files.
        p = os.path.abspath(raw)
        if p == os.path.abspath(default_path()):
            _make_private_dirs(p)
        if not os.path.islink(p):
            _check_directory(p)
        problem = sqlite_file_problem(p)
        if problem:
            raise SQLiteServiceError(p, f"refusing the lock database ({problem})")
        super().__init__(p, busy_timeout_ms=self._busy_ms)
        self._read_status(_PROBE_NAME)  # migrates the file, or says why it cannot be used

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> SQLiteLockService:
        """``sqlite:///abs/path``, ``sqlite:relative/path`` or ``sqlite://`` (the default path)."""
        return cls(path_from_url(url), **kwargs)

    def status(self, name: str) -> LockStatus:
        """The state of ``name`` as stored (read-only; advisory for humans and tools), read
        with the core's status request on a connection of its own (so it may be called
        while a client drives this service)."""
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string")
        st = self._read_status(name)
        last = st.last_fencing_token or None
        if not st.held:
            return LockStatus(name=name, held=False, fencing_token=None, remaining_ttl_ms=None,
                              holder_pid=None, last_fencing_token=last)
        return LockStatus(
            name=name, held=True, fencing_token=st.fencing_token, remaining_ttl_ms=st.remaining_ttl_ms,
            holder_pid=st.holder_pid or None, last_fencing_token=last,
            holder_host=st.holder_host or None, held_for_ms=st.held_for_ms if st.holder_host else None,
        )

    def _host_facts(self) -> dict[HostFact, Any]:
        return _facts(self._overrides)

    def _read_status(self, name: str) -> Any:
        try:
            reader = _StatusReader(self.path, self._busy_ms, self._overrides)
        except ValueError as e:  # a link put at the path since
            raise SQLiteServiceError(self.path, f"refusing the lock database ({e})") from None
        try:
            st = backend_status(reader, name, timeout=self._busy_ms / 1000 + 10)
        except TimeoutError as e:
            raise SQLiteServiceError(self.path, f"lock database did not answer ({e})") from None
        if not st.ok:
            if not os.path.isdir(os.path.dirname(self.path)):
                _check_directory(self.path)  # the directory went away: say so
            raise SQLiteServiceError(self.path, _describe(st.error, self.path))
        return st

    def __enter__(self) -> SQLiteLockService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SQLiteLockService({self.path!r})"


def _check_directory(p: str) -> None:
    if os.path.isdir(p):
        raise SQLiteServiceError(p, "lock database path is a directory")
    parent = os.path.dirname(p)
    if not os.path.isdir(parent):
        what = "is not a directory" if os.path.exists(parent) else "does not exist"
        raise SQLiteServiceError(p, f"the lock database's directory {parent!r} {what}")


def _make_private_dirs(p: str) -> None:
    """Create the missing directories of file ``p``, each ``0700`` (the lock records are the
    user's own)."""
    missing: list[str] = []
    d = os.path.dirname(p)
    while d and not os.path.lexists(d):
        missing.append(d)
        d = os.path.dirname(d)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise SQLiteServiceError(p, f"cannot create the lock database's directory {d!r} ({e.strerror or e})") from None


def _describe(error: str, path: str) -> str:
    """The core's error about the file, said as what is wrong with the lock database."""
    detail = error
    for prefix in ("connection failed: ", f"cannot open {path}: ", "database error: "):
        detail = detail.removeprefix(prefix)
    if detail.startswith("refused: "):
        return f"refusing the lock database ({detail.removeprefix('refused: ')})"
    low = detail.lower()
    if "not a database" in low or "malformed" in low or "corrupt" in low or "quick_check" in low:
        return f"lock database is corrupt or not a SQLite file ({detail})"
    if "readonly" in low or "read-only" in low or "unable to open" in low or "permission" in low:
        return f"lock database is not writable ({detail})"
    if "locked" in low or "busy" in low:
        return f"lock database stayed busy past the busy timeout ({detail})"
    if "schema" in low:
        return detail
    return f"lock database error ({detail})"
