"""SQL executors: run the core's SQL requests verbatim on SQLite (stdlib ``sqlite3``) or
PostgreSQL (psycopg 3).

The core speaks the SQL protocol itself (the schema and its migration, every statement and
parameter, the meaning of every row: ``docs/sql-protocol.md``). An executor owns the
connections, binds the host facts, runs the statements in order in autocommit mode and
hands every row back unread; on the first error it rolls back and reports a database error
or a transport failure. It reports a connection opened anew (a server restart, a SQLite file
replaced at its path) so the core checks the schema again.

Give an executor to ``LockClient`` in place of a service (one client at a time)::

    with LockClient(SqliteExecutor("/var/lib/app/locks.db")) as client: ...
    with LockClient(PostgresExecutor("postgresql://app:secret@db/app")) as client: ...
"""

from __future__ import annotations

import logging
import os
import queue
import select
import socket
import sqlite3
import stat
import threading
import time
import urllib.parse
from functools import partial
from typing import Any

from .. import _ffi
from .._backend import Deferred, SqlFailure, bind_params, host_facts
from .._core import SqlOptions, SqlRequest
from ._pg_call import Late, PgCall, PgSession

__all__ = ["SQLiteExecutor", "SqliteExecutor", "PostgresExecutor", "DEFAULT_CONNECT_TIMEOUT", "DEFAULT_REQUEST_TIMEOUT", "TCP_KEEPALIVE"]

DEFAULT_CONNECT_TIMEOUT = 5.0
"""Seconds a PostgreSQL connection attempt may take before it is a transport failure."""

DEFAULT_REQUEST_TIMEOUT = 10.0
"""Seconds one PostgreSQL request may take before its connection is cut (a transport
failure): a server that stopped answering never holds a request, nor those behind it."""

TCP_KEEPALIVE = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3, "tcp_user_timeout": 10_000}
"""libpq settings that turn a server gone silent (a dead host, a cut network) into a broken
connection within seconds instead of a request that never ends (each can be overridden)."""

# Connections a forked child inherited: kept referenced so they are never finalized there.
_INHERITED: list[Any] = []

log = logging.getLogger("leasehold")

_monotonic = time.monotonic
_DATABASE = _ffi.LH_FAILURE_DATABASE
_TRANSPORT = _ffi.LH_FAILURE_TRANSPORT
_COMMANDS = _ffi.LH_CONNECTION_COMMANDS
_LISTENER = _ffi.LH_CONNECTION_NOTIFY


# -- the SQLite file: created 0600, never through a symbolic link ------------------------------

_SIDECARS = ("-wal", "-shm", "-journal")  # SQLite opens these beside the file, following links

# Closing a descriptor drops every POSIX lock this process holds on its file (SQLite's locks
# included): no connection of this process opens a file between its creation and that close.
_CREATE_MU = threading.Lock()
_WARNED: set[str] = set()


def _reset_create_mu() -> None:
    global _CREATE_MU
    _CREATE_MU = threading.Lock()  # a forked child must not inherit it held by a thread it lacks


os.register_at_fork(after_in_child=_reset_create_mu)


def sqlite_file_problem(path: str | os.PathLike[str]) -> str | None:
    """What makes ``path`` unusable as a lock file as it stands (a symbolic link, which SQLite
    would follow to create or rewrite its target; not a regular file); ``None`` when it is a
    regular file or missing."""
    p = os.fspath(path)
    for name in (p, *(p + s for s in _SIDECARS)):
        try:
            st = os.lstat(name)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            return f"{name} is a symbolic link; leasehold does not follow links to its lock file (give the target's path)"
        if name == p and not stat.S_ISREG(st.st_mode):
            return f"{name} is not a regular file"
    return None


def _unsafe(what: str, path: str, st: os.stat_result, is_dir: bool) -> list[str]:
    """Why another user could read, replace or rewrite the lock records. A directory owned by
    root, or sticky (like /tmp), does not let others replace the file."""
    out: list[str] = []
    if st.st_uid != os.geteuid() and not (is_dir and st.st_uid == 0):
        out.append(f"the lock {what} {path} is owned by another user (uid {st.st_uid})")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022 and not (is_dir and mode & stat.S_ISVTX):
        out.append(f"the lock {what} {path} is writable by other users (mode {mode:04o})")
    elif not is_dir and mode & 0o004:
        out.append(f"the lock {what} {path} is readable by other users (mode {mode:04o})")
    return out


def _warn_once(messages: list[str]) -> None:
    for m in messages:
        if m not in _WARNED:
            _WARNED.add(m)
            log.warning("leasehold: %s", m)


def _refused(path: str, why: str) -> SqlFailure:
    return SqlFailure(_TRANSPORT, f"cannot open {path}: refused: {why}")


def _open_sqlite_file(path: str, busy_s: float) -> tuple[sqlite3.Connection, tuple[int, int]]:
    """Open the lock file: create it 0600 (whatever the umask; SQLite gives its -wal and -shm
    files the file's mode) when missing, refuse a symbolic link at the path or beside it, warn
    when another user owns or may write the file or its directory, and check that the file
    SQLite opened is the one checked. Returns the connection and the file's identity."""
    with _CREATE_MU:
        problem = sqlite_file_problem(path)
        if problem:
            raise _refused(path, problem)
        created = False
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            pass
        except OSError as e:  # said as SQLite says it
            raise SqlFailure(_TRANSPORT, f"cannot open {path}: unable to open database file ({e.strerror or e})") from None
        else:
            created = True
            try:
                os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
        try:
            st = os.lstat(path)
        except OSError as e:
            raise SqlFailure(_TRANSPORT, f"cannot open {path}: {e.strerror or e}") from None
        problem = sqlite_file_problem(path)
        if problem:
            raise _refused(path, problem)
        ident = (st.st_dev, st.st_ino)
        unsafe = [] if created else _unsafe("file", path, st, False)
        parent = os.path.dirname(os.path.abspath(path))
        try:
            unsafe += _unsafe("directory", parent, os.stat(parent), True)
        except OSError:
            pass
        # mode=rw: SQLite never creates the file itself (a link swapped in meanwhile fails).
        quoted = urllib.parse.quote(path)
        uri = ("file://" if path.startswith("/") else "file:") + quoted + "?mode=rw"
        try:
            db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=busy_s)
        except sqlite3.Error as e:
            raise SqlFailure(_TRANSPORT, f"cannot open {path}: {e}") from None
    try:
        # The file SQLite opened (by the name it resolved) is the one checked above.
        names = [row[2] for row in db.execute("PRAGMA database_list").fetchall() if row[1] == "main"]
        opened = os.stat(names[0]) if names and names[0] else None
        now = os.lstat(path)
        if opened is None or (opened.st_dev, opened.st_ino) != ident or (now.st_dev, now.st_ino) != ident:
            raise _refused(path, "the file was replaced while it was opened")
        db.execute("PRAGMA schema_version").fetchall()
    except (OSError, sqlite3.Error, SqlFailure) as e:
        db.close()
        if isinstance(e, SqlFailure):
            raise
        raise SqlFailure(_TRANSPORT, f"cannot open {path}: {e}") from None
    _warn_once(unsafe)
    _tighten_sidecars(path, stat.S_IMODE(st.st_mode))
    return db, ident


def _tighten_sidecars(path: str, mode: int) -> None:
    """Give this user's -wal and -shm no permission the lock file lacks: SQLite sets their mode
    only when it creates them. By path: a descriptor's close would drop SQLite's locks."""
    for side in ("-wal", "-shm"):
        name = path + side
        try:
            st = os.lstat(name)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & ~mode:
                os.chmod(name, stat.S_IMODE(st.st_mode) & mode)
        except OSError:
            pass


class SqliteExecutor:
    """Runs a SQL-protocol core's requests on one SQLite file (processes of one host share
    it; the file is interoperable with every binding's SQLite executor). Thread-safe: one
    connection, one request at a time (each is one ``BEGIN IMMEDIATE`` transaction).

    The file holds lock names, pids, host names and tokens: a missing file is created
    ``0600``; a symbolic link at the path (or at its ``-wal``/``-shm``/``-journal``) is
    refused, never followed; a file or directory that another user owns or may write is
    reported once as a warning on the ``leasehold`` logger.

    :param path: the database file (created when missing)
    :param busy_timeout_ms: how long a locked file is waited for before the request is a
        database error (the core's default, 5000, when ``None``)
    :raises ValueError: ``path`` is a symbolic link or not a regular file
    """

    backend_protocol = "sql"
    notifications = False  # SQLite has none: waiters retry at the holder's expiry

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int | None = None) -> None:
        self.path = os.fspath(path)
        if not self.path or self.path == ":memory:":
            raise ValueError("SqliteExecutor needs a file path shared by the processes (not :memory:)")
        problem = sqlite_file_problem(self.path)
        if problem:
            raise ValueError(problem)
        self.options = SqlOptions("sqlite", busy_timeout_ms)
        self._busy_s = (busy_timeout_ms if busy_timeout_ms is not None else 5000) / 1000
        self._mu = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._ident: tuple[int, int] | None = None
        self._opened = False
        self._resets: list[int] = []
        self._attached = False

    def attach(self, sink: Any = None) -> None:
        """A client starts driving this executor (only one at a time)."""
        with self._mu:
            if self._attached:
                raise ValueError("this SqliteExecutor already serves a client; make one per client")
            self._attached = True

    def detach(self) -> None:
        """The client stopped: the connection closes (it reopens if attached again)."""
        with self._mu:
            self._attached = False
            db, self._db, self._ident = self._db, None, None
        if db is not None:
            db.close()

    def close(self) -> None:
        self.detach()

    def after_fork(self) -> None:
        """(in a forked child) Forget the parent's connection without using it (SQLite
        connections must not cross a fork); the child opens its own."""
        self._mu = threading.Lock()
        if self._db is not None:
            _INHERITED.append(self._db)  # never closed here: closing may checkpoint the file
        self._db, self._ident, self._opened, self._resets = None, None, False, []
        self._attached = False  # the child's client attaches anew

    def take_resets(self) -> list[int]:
        with self._mu:
            resets, self._resets = self._resets, []
        return resets

    _host_facts = staticmethod(host_facts)  # the facts a request binds, read as it starts

    def _stat(self) -> tuple[int, int] | None:
        """What is at the path itself: a link put in the file's place is a replacement."""
        try:
            st = os.lstat(self.path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None

    def _open(self) -> sqlite3.Connection:
        """(lock held) Open the file; a reopening is reported as a reset."""
        db, ident = _open_sqlite_file(self.path, self._busy_s)
        self._db, self._ident = db, ident
        if self._opened:
            self._resets.append(_COMMANDS)
        self._opened = True
        return db

    def execute(self, request: SqlRequest, sink: Any = None) -> list[list[tuple[Any, ...]]]:
        """Run ``request``'s statements in order; every statement's rows. Raises
        :class:`~leasehold._backend.SqlFailure`."""
        with self._mu:
            db = self._db
            if db is not None and self._stat() != self._ident:
                # Replaced or deleted at the path: follow the path instead of locking alone
                # on the old inode. This request did not run; the schema is checked again.
                self._db = None
                db.close()
                self._open()
                raise SqlFailure(_TRANSPORT, f"the database file {self.path} was replaced")
            if db is None:
                db = self._open()
            facts = self._host_facts()
            out: list[list[tuple[Any, ...]]] = []
            try:
                for sql, params in request.statements:
                    out.append(db.execute(sql, bind_params(params, facts)).fetchall())
            except sqlite3.Error as e:
                if db.in_transaction:
                    try:
                        db.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                raise SqlFailure(_DATABASE, str(e) or type(e).__name__) from None
            return out


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("PostgresExecutor needs psycopg 3: pip install 'leasehold[postgres]'") from e
    return psycopg


def _cut(conn: Any) -> bool:
    """Shut a connection's socket down under a blocked call: it fails at once."""
    try:
        s = socket.socket(fileno=os.dup(conn.fileno()))
    except Exception:
        return True
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        s.close()
    return True


SQLiteExecutor = SqliteExecutor
"""The name every binding gives the SQLite executor (Go's ``SQLiteExecutor``)."""


class _Job:
    """One call run by a :class:`_Worker`; ``done`` is held until it finished."""

    __slots__ = ("fn", "done", "result", "error")

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.done = threading.Lock()
        self.done.acquire()
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as e:
            self.error = e
        self.done.release()

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result

    def finish(self) -> Any:
        """(blocking) Wait for the call to end; its result, or it raises."""
        self.done.acquire()
        return self.outcome()


class _Worker:
    """A thread that runs calls a caller with a deadline does not wait for to the end: a
    request that was late on the caller's thread, or one that waits for its connection."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._q: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._mu = threading.Lock()

    def run_within(self, fn: Any, timeout: float) -> Any:
        """``fn()`` on the worker, waited for at most ``timeout`` seconds; past it raises
        :class:`~leasehold._backend.Deferred` (whose ``finish()`` waits for the rest). ``fn``
        runs even if nobody calls ``finish()``."""
        job = _Job(fn)
        with self._mu:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, args=(self._q,), name=self._name, daemon=True)
                self._thread.start()
            self._q.put(job)
        if not job.done.acquire(timeout=max(timeout, 0.001)):
            raise Deferred(job.finish)
        return job.outcome()

    def stop(self) -> None:
        """The thread ends after the calls queued (none is dropped: each ends its transaction)."""
        with self._mu:
            if self._thread is not None:
                self._q.put(None)
                self._thread = None
                self._q = queue.SimpleQueue()

    @staticmethod
    def _run(q: "queue.SimpleQueue[_Job | None]") -> None:
        while (job := q.get()) is not None:
            job.run()


def _workers() -> tuple[_Worker, _Worker, _Worker]:
    """Requests waiting for the commands connection; the listener's requests; the rest of
    requests late on their caller's thread (never waits for the connection: it holds it)."""
    return (_Worker("leasehold-pg-commands"), _Worker("leasehold-pg-listen-calls"), _Worker("leasehold-pg-late"))


def pg_params(params: list[Any]) -> list[Any]:
    """Parameters as psycopg binds them: integers as ``bigint`` (the protocol's type)."""
    from psycopg.types.numeric import Int8

    return [Int8(p) if type(p) is int else p for p in params]


class PostgresExecutor:
    """Runs a SQL-protocol core's requests on PostgreSQL with psycopg 3 (sync): a commands
    connection (one request at a time) and a listener connection whose notifications wake
    waiters on release (a reader thread passes each one on). Thread-safe.

    :param conninfo: a connection string (``postgresql://user:pass@host:port/db?sslmode=…``)
        or libpq keywords; ``connect_timeout`` defaults to 5 s, TCP keepalives to
        :data:`TCP_KEEPALIVE`
    :param request_timeout: seconds one request may take before its connection is cut
    :param asynchronous_commit: acquire, renew and release commit without waiting for the
        server's WAL flush (``synchronous_commit = off`` for their own transactions only):
        several times the throughput on a server that flushes, but a server crash may forget
        the last moments' grants and releases (docs/backends.md)
    :param connect_kwargs: further ``psycopg.connect`` keywords (``sslrootcert``, ...)
    """

    backend_protocol = "sql"
    notifications = True

    def __init__(
        self,
        conninfo: str = "",
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        asynchronous_commit: bool = False,
        **connect_kwargs: Any,
    ) -> None:
        self._psycopg = _psycopg()
        self._conn_ok = int(self._psycopg.pq.ConnStatus.OK)
        self.conninfo = conninfo
        self.request_timeout = float(request_timeout)
        connect_kwargs.setdefault("connect_timeout", int(DEFAULT_CONNECT_TIMEOUT))
        for k, v in TCP_KEEPALIVE.items():
            connect_kwargs.setdefault(k, v)
        self._kwargs = connect_kwargs
        self.options = SqlOptions("postgresql", asynchronous_commit=bool(asynchronous_commit))
        self._mu = threading.Lock()  # the commands connection
        self._lmu = threading.Lock()  # the listener connection
        self._cmd: Any = None
        self._listen: Any = None
        self._opened: set[int] = set()
        self._resets: list[int] = []
        self._attached = False
        self._stop = threading.Event()
        self._reader: threading.Thread | None = None
        self._sink: Any = None
        self._pending: list[tuple[str, str]] = []  # notifications seen while a LISTEN ran
        self._sessions: dict[int, PgSession] = {}  # by connection kind
        self._workers = _workers()

    # -- lifecycle -----------------------------------------------------------------------------
    def attach(self, sink: Any = None) -> None:
        """A client starts driving this executor (only one at a time)."""
        with self._mu:
            if self._attached:
                raise ValueError("this PostgresExecutor already serves a client; make one per client")
            self._attached = True
            self._stop = threading.Event()

    def detach(self) -> None:
        """The client stopped: both connections close."""
        self._stop.set()
        with self._mu:
            self._attached = False
            cmd, self._cmd = self._cmd, None
        with self._lmu:
            listen, self._listen = self._listen, None
        for c in (cmd, listen):
            if c is not None:
                try:
                    c.close()
                except Exception:
                    pass
        reader, self._reader = self._reader, None
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout=2.0)
        for w in self._workers:
            w.stop()
        self._opened = set()

    def close(self) -> None:
        self.detach()

    def after_fork(self) -> None:
        """(in a forked child) Forget the parent's connections without using them."""
        self._workers = _workers()
        self._sessions = {}
        self._mu, self._lmu = threading.Lock(), threading.Lock()
        self._cmd = self._listen = self._reader = None
        self._opened, self._resets, self._pending = set(), [], []
        self._stop = threading.Event()
        self._attached = False  # the child's client attaches anew

    def take_resets(self) -> list[int]:
        if not self._resets:  # the common case, without the lock: an append made under it
            return []  # before this request's end is seen (its release ordered it)
        with self._mu:
            resets, self._resets = self._resets, []
        return resets

    # -- connections ---------------------------------------------------------------------------
    def _connect(self, which: int) -> Any:
        try:
            conn = self._psycopg.connect(self.conninfo, autocommit=True, **self._kwargs)
        except Exception as e:
            raise SqlFailure(_TRANSPORT, str(e).strip().removeprefix("connection failed: ") or type(e).__name__) from None
        reopened = which in self._opened
        self._opened.add(which)
        if which == _LISTENER:
            conn.add_notify_handler(lambda n: self._pending.append((n.channel, n.payload)))
        return conn, reopened

    def _session(self, which: int, conn: Any) -> PgSession:
        """The prepared statements of ``conn`` (forgotten with the connection it replaced)."""
        session = self._sessions.get(which)
        if session is None or session.conn is not conn:
            session = self._sessions[which] = PgSession(conn)
        return session

    def _commands(self) -> PgSession:
        """(``_mu`` held) The commands connection, opened if needed."""
        conn = self._cmd
        if conn is not None:
            session = self._sessions.get(_COMMANDS)
            if session is not None and session.conn is conn and session.pgconn.status == self._conn_ok:
                return session  # the common case, without psycopg's ``closed`` property
        if conn is None or conn.closed:
            conn, reopened = self._connect(_COMMANDS)
            self._cmd = conn
            if reopened:
                self._resets.append(_COMMANDS)
        return self._session(_COMMANDS, conn)

    def _finish(self, call: PgCall, deadline: float | None) -> list[list[tuple[Any, ...]]]:
        """(``_mu`` held) Run ``call`` on; a transport failure drops the connection."""
        try:
            return call.run(deadline)
        except SqlFailure as f:
            self._failed(f)
            raise

    def _failed(self, f: SqlFailure) -> None:
        """(``_mu`` held) A request on the commands connection failed: a transport failure
        drops the connection."""
        if f.kind == _TRANSPORT:
            conn, self._cmd = self._cmd, None
            try:
                if conn is not None:
                    conn.close()
            except Exception:
                pass

    def _finish_late(self, call: PgCall) -> list[list[tuple[Any, ...]]]:
        """(on the late worker, ``_mu`` held by the caller that handed ``call`` over) The rest
        of a request past its caller's deadline; the connection is free after it."""
        try:
            return self._finish(call, None)
        finally:
            self._mu.release()

    def execute(self, request: SqlRequest, sink: Any = None) -> list[list[tuple[Any, ...]]]:
        """Run ``request``'s statements on the connection it names; every statement's rows.
        Raises :class:`~leasehold._backend.SqlFailure`."""
        if request.connection == _LISTENER:
            return self._execute_listener(request, sink)
        with self._mu:
            return self._finish(PgCall(self._psycopg, self._commands(), request, self.request_timeout), None)

    def execute_within(self, request: SqlRequest, sink: Any, timeout: float) -> list[list[tuple[Any, ...]]]:
        """:meth:`execute`, waited for at most ``timeout`` seconds (an application's
        deadline). It runs on the calling thread; past the deadline it raises
        :class:`~leasehold._backend.Deferred` and the request goes on on a worker thread
        (its transaction committed or rolled back, never left open), which ``finish()``
        waits for. A request whose connection stays busy past the deadline waits its turn
        on a worker too."""
        if request.connection == _LISTENER:
            rows: list[list[tuple[Any, ...]]] = self._workers[1].run_within(partial(self.execute, request, sink), timeout)
            return rows
        deadline = _monotonic() + timeout
        mu = self._mu
        if not mu.acquire(False) and not mu.acquire(timeout=max(timeout, 0.001)):
            rows = self._workers[0].run_within(partial(self.execute, request, sink), 0.0)
            return rows
        handed = False
        try:
            # _commands()'s common case inline: the connection open, its session current.
            session = self._sessions.get(_COMMANDS)
            if session is None or session.conn is not self._cmd or session.pgconn.status != self._conn_ok:
                session = self._commands()
            call = PgCall(self._psycopg, session, request, self.request_timeout)
            try:
                return call.run(deadline)
            except Late:
                handed = True
                rows = self._workers[2].run_within(partial(self._finish_late, call), 0.0)
                return rows
            except SqlFailure as f:
                self._failed(f)
                raise
        finally:
            if not handed:
                mu.release()

    def _execute_listener(self, request: SqlRequest, sink: Any) -> list[list[tuple[Any, ...]]]:
        if sink is not None:
            self._sink = sink
        try:
            with self._lmu:
                conn = self._listen
                if conn is None or conn.closed:
                    conn, reopened = self._connect(_LISTENER)
                    self._listen = conn
                    if reopened:
                        with self._mu:
                            self._resets.append(_LISTENER)
                    self._start_reader()
                try:
                    return PgCall(self._psycopg, self._session(_LISTENER, conn), request, self.request_timeout).run()
                except SqlFailure as f:
                    if f.kind == _TRANSPORT:
                        self._listen = None
                        try:
                            conn.close()
                        except Exception:
                            pass
                    raise
        finally:
            self._collect()
            self._deliver()

    # -- the listener --------------------------------------------------------------------------
    def _start_reader(self) -> None:
        if self._reader is None or not self._reader.is_alive():
            self._reader = threading.Thread(target=self._read, name="leasehold-pg-listen", daemon=True)
            self._reader.start()

    def _collect(self) -> None:
        """Notifications libpq read while a statement ran on the listener (the reader's
        ``select`` will not see them: they left the socket)."""
        with self._lmu:
            conn = self._listen
            if conn is None or conn.closed:
                return
            while (n := conn.pgconn.notifies()) is not None:
                self._pending.append((n.relname.decode("utf-8", "replace"), n.extra.decode("utf-8", "replace")))

    def _deliver(self) -> None:
        """Pass the notifications collected under the listener's lock (never call the sink
        while holding it: the client may run a LISTEN on this thread)."""
        sink = self._sink
        while self._pending and sink is not None:
            ch, payload = self._pending.pop(0)
            sink.notification(ch, payload)

    def _read(self) -> None:
        stop = self._stop
        backoff = 0.1
        while not stop.is_set():
            conn = self._listen
            if conn is None:
                # The listener broke: reopen it, then the core LISTENs again.
                if stop.wait(backoff):
                    return
                with self._lmu:
                    if self._listen is None and not stop.is_set():
                        try:
                            self._listen, _ = self._connect(_LISTENER)
                        except SqlFailure:
                            backoff = min(backoff * 2, 2.0)
                            continue
                        backoff = 0.1
                        reset = True
                    else:
                        reset = False
                if reset and self._sink is not None:
                    self._sink.connection_reset(_LISTENER)
                continue
            try:
                ready, _, _ = select.select([conn.fileno()], [], [], 0.5)
            except (OSError, ValueError, self._psycopg.Error):
                ready = [True]
            if not ready:
                continue
            with self._lmu:
                if conn is not self._listen:
                    continue
                try:
                    pg = conn.pgconn
                    pg.consume_input()
                    while (n := pg.notifies()) is not None:
                        self._pending.append(
                            (n.relname.decode("utf-8", "replace"), n.extra.decode("utf-8", "replace"))
                        )
                    if pg.status != self._psycopg.pq.ConnStatus.OK:
                        raise self._psycopg.OperationalError("the listener connection closed")
                except Exception:
                    self._listen = None
                    try:
                        conn.close()
                    except Exception:
                        pass
            self._deliver()
