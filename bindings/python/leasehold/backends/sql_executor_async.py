"""The asyncio PostgreSQL executor (psycopg 3 ``AsyncConnection``) for ``AsyncLockClient``.

The twin of :class:`leasehold.backends.sql_executor.PostgresExecutor`: it runs the core's
SQL requests verbatim on a commands connection and a listener connection, binds the host
facts and hands every row and notification back unread. It knows nothing of the protocol.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .. import _ffi
from .._backend import SqlFailure, bind_params, host_facts
from .._core import SqlOptions, SqlRequest
from ._pg_call import pg_failure
from .sql_executor import DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT, TCP_KEEPALIVE, _cut, _psycopg, pg_params

__all__ = ["AsyncPostgresExecutor"]

_TRANSPORT = _ffi.LH_FAILURE_TRANSPORT
_COMMANDS = _ffi.LH_CONNECTION_COMMANDS
_LISTENER = _ffi.LH_CONNECTION_NOTIFY
# How long the listener task waits for notifications before it lets a LISTEN through (both
# need the listener connection; a release just before a LISTEN is caught by the core's check
# when the LISTEN takes effect).
_LISTEN_SLICE = 0.05


class AsyncPostgresExecutor:
    """Runs a SQL-protocol core's requests on PostgreSQL with psycopg 3's asyncio API (on one
    event loop); give it to ``AsyncLockClient``. One client at a time.

    Parameters as for :class:`~leasehold.backends.sql_executor.PostgresExecutor`.
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
        self.conninfo = conninfo
        self.request_timeout = float(request_timeout)
        connect_kwargs.setdefault("connect_timeout", int(DEFAULT_CONNECT_TIMEOUT))
        for k, v in TCP_KEEPALIVE.items():
            connect_kwargs.setdefault(k, v)
        self._kwargs = connect_kwargs
        self.options = SqlOptions("postgresql", asynchronous_commit=bool(asynchronous_commit))
        self._mu: asyncio.Lock | None = None
        self._lmu: asyncio.Lock | None = None
        self._cmd: Any = None
        self._listen: Any = None
        self._opened: set[int] = set()
        self._resets: list[int] = []
        self._reader: asyncio.Task[None] | None = None
        self._sink: Any = None
        self._attached = False

    def attach(self, sink: Any = None) -> None:
        """A client starts driving this executor (only one at a time)."""
        if self._attached:
            raise ValueError("this AsyncPostgresExecutor already serves a client; make one per client")
        self._attached = True

    async def detach(self) -> None:
        """The client stopped: both connections close."""
        self._attached = False
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            try:
                await reader
            except BaseException:
                pass
        cmd, listen, self._cmd, self._listen = self._cmd, self._listen, None, None
        for c in (cmd, listen):
            if c is not None:
                try:
                    await c.close()
                except Exception:
                    pass
        self._opened = set()

    async def close(self) -> None:
        await self.detach()

    def after_fork(self) -> None:
        """(in a forked child) Forget the parent's connections without using them."""
        self._cmd = self._listen = self._reader = self._mu = self._lmu = None
        self._opened, self._resets = set(), []

    def take_resets(self) -> list[int]:
        resets, self._resets = self._resets, []
        return resets

    async def _connect(self, which: int) -> Any:
        try:
            conn = await self._psycopg.AsyncConnection.connect(self.conninfo, autocommit=True, **self._kwargs)
        except Exception as e:
            raise SqlFailure(_TRANSPORT, str(e).strip().removeprefix("connection failed: ") or type(e).__name__) from None
        if which in self._opened:
            self._resets.append(which)
        self._opened.add(which)
        return conn

    async def _run(self, conn: Any, request: SqlRequest) -> list[list[tuple[Any, ...]]]:
        # Cut the socket rather than cancel the task: psycopg would wait for the server to
        # confirm a cancellation that a stopped server never sends.
        cut: list[bool] = []
        watchdog = asyncio.get_running_loop().call_later(self.request_timeout, lambda: cut.append(_cut(conn)))
        try:
            return await self._run_all(conn, request)
        except SqlFailure:
            if cut:
                raise SqlFailure(_TRANSPORT, f"no answer within {self.request_timeout:g}s") from None
            raise
        finally:
            watchdog.cancel()

    async def _run_all(self, conn: Any, request: SqlRequest) -> list[list[tuple[Any, ...]]]:
        facts = host_facts()
        out: list[list[tuple[Any, ...]]] = []
        cur = self._psycopg.AsyncRawCursor(conn)
        try:
            for sql, params in request.statements:
                await cur.execute(sql, pg_params(bind_params(params, facts)) or None)
                out.append(await cur.fetchall() if cur.description is not None else [])
        except self._psycopg.Error as e:
            broken = conn.closed or conn.broken
            if not broken:
                try:
                    if conn.info.transaction_status != self._psycopg.pq.TransactionStatus.IDLE:
                        await conn.execute("ROLLBACK")
                except self._psycopg.Error:
                    broken = True
            raise pg_failure(e, broken) from None
        finally:
            try:
                await cur.close()
            except Exception:
                pass
        return out

    async def execute(self, request: SqlRequest, sink: Any = None) -> list[list[tuple[Any, ...]]]:
        """Run ``request``'s statements on the connection it names; every statement's rows.
        Raises :class:`~leasehold._backend.SqlFailure`."""
        if self._mu is None:
            self._mu, self._lmu = asyncio.Lock(), asyncio.Lock()
        if request.connection == _LISTENER:
            if sink is not None:
                self._sink = sink
            lmu = self._lmu
            assert lmu is not None  # made together with _mu above
            async with lmu:  # one listener connection, even when LISTENs arrive together
                conn = self._listen
                if conn is None or conn.closed:
                    conn = self._listen = await self._connect(_LISTENER)
                    if self._reader is None or self._reader.done():
                        self._reader = asyncio.get_running_loop().create_task(self._read())
            try:
                return await self._run(conn, request)
            except SqlFailure as f:
                if f.kind == _TRANSPORT and self._listen is conn:
                    self._listen = None
                raise
        async with self._mu:
            conn = self._cmd
            if conn is None or conn.closed:
                conn = self._cmd = await self._connect(_COMMANDS)
            try:
                return await self._run(conn, request)
            except SqlFailure as f:
                if f.kind == _TRANSPORT:
                    self._cmd = None
                    try:
                        await conn.close()
                    except Exception:
                        pass
                raise

    async def _read(self) -> None:
        """Pass the listener's notifications on; when it breaks, reopen it and report the
        reset (the core LISTENs again)."""
        backoff = 0.1
        while True:
            conn = self._listen
            if conn is None or conn.closed:
                await asyncio.sleep(backoff)
                if self._listen is not None and not self._listen.closed:
                    continue
                try:
                    self._listen = await self._connect(_LISTENER)
                except SqlFailure:
                    backoff = min(backoff * 2, 2.0)
                    continue
                self._resets = [r for r in self._resets if r != _LISTENER]  # reported here, at once
                backoff = 0.1
                if self._sink is not None:
                    self._sink.connection_reset(_LISTENER)
                continue
            try:
                async for n in conn.notifies(timeout=_LISTEN_SLICE):
                    if self._sink is not None:
                        self._sink.notification(n.channel, n.payload)
            except self._psycopg.Error:
                if self._listen is conn:
                    self._listen = None
                try:
                    await conn.close()
                except Exception:
                    pass
            await asyncio.sleep(0)  # let a waiting LISTEN take the connection
