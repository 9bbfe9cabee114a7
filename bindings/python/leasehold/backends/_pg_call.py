"""One request's statements on a PostgreSQL connection, driven through libpq (psycopg's
``pq``) rather than ``cursor.execute``: psycopg waits for the end of a statement however long
it takes, where a caller's deadline must bound the wait on the calling thread and, past it,
leave the same request to finish on another thread with the connection still in step.

Parameters are dumped and rows loaded by psycopg's own :class:`~psycopg.adapt.Transformer`
(what ``RawCursor`` does); statements are prepared on first use per connection (what psycopg's
``prepare_threshold`` does after a few uses). Nothing here reads a statement or a row.

This runs once per lock operation, so it does the least per request: what psycopg and the
connection give once (the Transformer, a poller on the socket, the statements prepared, an
``int`` dumped as ``bigint``) lives in the :class:`PgSession`; parameters go to psycopg as
the core gave them unless a host fact is among them.
"""

from __future__ import annotations

import select
import time
from typing import Any

from .. import _ffi
from .._backend import SqlFailure, host_fact_values
from .._core import HostFact, SqlRequest

_READ = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP
_WRITE = select.POLLOUT | select.POLLERR | select.POLLHUP
_monotonic = time.monotonic


def pg_failure(e: Exception, broken: bool) -> SqlFailure:
    """A psycopg error as the protocol reports it: the database's refusal (with its
    message), or a transport failure when the connection is gone."""
    diag = getattr(e, "diag", None)
    text = (getattr(diag, "message_primary", None) if diag is not None else None) or str(e) or type(e).__name__
    if broken or getattr(e, "sqlstate", None) is None:
        # The core says "connection failed: " itself.
        return SqlFailure(_ffi.LH_FAILURE_TRANSPORT, str(e).strip().removeprefix("connection failed: ") or text)
    return SqlFailure(_ffi.LH_FAILURE_DATABASE, text)


class _Psycopg:
    """What this module takes from psycopg (imported lazily by the executor), looked up once."""

    def __init__(self, psycopg: Any) -> None:
        pq = psycopg.pq
        auto = psycopg.adapt.PyFormat.AUTO
        self.auto = [[auto] * n for n in range(9)]  # the dump formats of n parameters
        self.tuples_ok = int(pq.ExecStatus.TUPLES_OK)
        self.ok = frozenset(int(s) for s in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK, pq.ExecStatus.EMPTY_QUERY))
        self.auto_format = auto


_PSYCOPG: _Psycopg | None = None


def _psycopg_names(psycopg: Any) -> _Psycopg:
    global _PSYCOPG
    if _PSYCOPG is None:
        _PSYCOPG = _Psycopg(psycopg)
    return _PSYCOPG


_FIRST_FACT = int(HostFact.MONOTONIC_NS)


class Late(Exception):
    """The caller's deadline passed before the request ended; :meth:`PgCall.run` continues it."""


class PgSession:
    """A connection and what a request on it reuses: the statements prepared on it (names
    live as long as the connection), psycopg's Transformer (its dumpers and loaders looked up
    once, as a cursor keeps one: requests on a connection never overlap) and a poller
    registered on its socket.

    The connection dumps a Python ``int`` as ``bigint`` (the protocol's type; psycopg picks
    the smallest type that holds the value): parameters go to psycopg as the core gave them,
    without a wrapper object per integer."""

    __slots__ = ("conn", "pgconn", "prepared", "tx", "poller")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.pgconn = conn.pgconn
        self.prepared: dict[tuple[str, tuple[int, ...]], bytes] = {}
        self.poller: Any = None  # select.poll for reading, made at the first wait
        from psycopg.adapt import Transformer
        from psycopg.types.numeric import Int8BinaryDumper

        conn.adapters.register_dumper(int, Int8BinaryDumper)
        self.tx: Any = Transformer(conn)


class PgCall:
    """A request in progress on a :class:`PgSession`: :meth:`run` sends each statement and
    waits for its result, within a deadline or to the end; after :class:`Late` it can be
    called again (on any thread) and picks up where it stopped."""

    __slots__ = (
        "_pg",
        "_names",
        "_session",
        "_todo",
        "_next",
        "_phase",
        "_key",
        "_values",
        "_formats",
        "_prepared_name",
        "_out",
        "_give_up_at",
        "_request_timeout",
    )

    def __init__(self, psycopg: Any, session: PgSession, request: SqlRequest, request_timeout: float) -> None:
        self._pg = psycopg
        self._names = _PSYCOPG if _PSYCOPG is not None else _psycopg_names(psycopg)
        self._session = session
        todo = request.statements
        for _sql, params in todo:
            if HostFact in map(type, params):  # exact types, in C: no frame per parameter
                todo = _bound(todo)
                break
        self._todo = todo
        self._next = 0
        self._phase = 0  # 0: nothing in flight; 1: PREPARE sent; 2: the statement sent
        self._out: list[list[tuple[Any, ...]]] = []
        self._give_up_at = _monotonic() + request_timeout
        self._request_timeout = request_timeout

    def run(self, deadline: float | None = None) -> list[list[tuple[Any, ...]]]:
        """Every statement's rows. Raises :class:`Late` at ``deadline`` (``time.monotonic()``),
        :class:`~leasehold._backend.SqlFailure` on an error (a database error leaves no
        transaction open; a transport failure, or no answer within the request timeout,
        leaves the connection closed)."""
        # One frame for the common request (a prepared statement, one result): sending,
        # waiting and loading are spelled out here; the rest is in the methods below.
        session, todo = self._session, self._todo
        pg, tx = session.pgconn, session.tx
        tuples_ok = self._names.tuples_ok
        limit = self._give_up_at if deadline is None or deadline > self._give_up_at else deadline
        try:
            while self._next < len(todo):
                if self._phase == 0:
                    sql, params = todo[self._next]
                    if params:
                        n = len(params)
                        auto = self._names.auto
                        values = tx.dump_sequence(params, auto[n] if n < len(auto) else [self._names.auto_format] * n)
                        types = tx.types
                        key = (sql, types if type(types) is tuple else tuple(types or ()))
                        name = session.prepared.get(key)
                        if name is not None:
                            pg.send_query_prepared(name, values, param_formats=tx.formats)
                            self._phase = 2
                        else:
                            self._values, self._formats = values, tx.formats
                            self._prepare(key)
                    else:
                        # The simple protocol, as psycopg runs a statement without parameters:
                        # a text may hold several statements (the schema's migration does).
                        pg.send_query(sql.encode())
                        self._phase = 2
                while pg.flush() != 0:
                    self._wait(_WRITE, deadline)
                results: list[Any] = []
                while True:
                    while pg.is_busy():
                        poller = session.poller
                        left = limit - _monotonic()
                        if poller is None or left <= 0 or not poller.poll(left * 1000.0):
                            self._wait(_READ, deadline)  # the first wait, or the time is up
                        pg.consume_input()
                    res = pg.get_result()
                    if res is None:
                        break
                    results.append(res)
                if self._phase == 1:
                    self._check(results)
                    session.prepared[self._key] = self._prepared_name
                    pg.send_query_prepared(self._prepared_name, self._values, param_formats=self._formats)
                    self._phase = 2
                    continue
                if len(results) == 1 and results[0].status == tuples_ok:
                    res = results[0]
                    tx.set_pgresult(res)
                    self._out.append(tx.load_rows(0, res.ntuples, tuple))
                else:
                    self._out.append(self._rows(results))
                self._phase = 0
                self._next += 1
        except (Late, SqlFailure):
            raise
        except self._pg.Error as e:
            raise self._failure(e) from None
        return self._out

    # -- sending -------------------------------------------------------------------------------
    def _prepare(self, key: tuple[str, tuple[int, ...]]) -> None:
        """Prepare the statement of ``key`` (its text and parameter types) on the connection;
        the dumped parameters wait in ``_values`` for the execution that follows."""
        self._key = key
        self._prepared_name = b"lh_%d" % len(self._session.prepared)
        self._session.pgconn.send_prepare(self._prepared_name, key[0].encode(), param_types=key[1])
        self._phase = 1

    # -- waiting -------------------------------------------------------------------------------
    def _wait(self, events: int, deadline: float | None) -> None:
        limit = self._give_up_at if deadline is None or deadline > self._give_up_at else deadline
        left = limit - _monotonic()
        if left > 0:
            if events == _READ:
                poller = self._session.poller
                if poller is None:
                    poller = self._session.poller = select.poll()
                    poller.register(self._session.pgconn.socket, _READ)
            else:
                poller = select.poll()
                poller.register(self._session.pgconn.socket, events)
            if poller.poll(left * 1000.0):
                return
        if deadline is not None and deadline < self._give_up_at:
            raise Late()
        # Mid-request: the connection cannot be trusted to be in step any more.
        self._session.conn.close()
        raise SqlFailure(_ffi.LH_FAILURE_TRANSPORT, f"no answer within {self._request_timeout:g}s")

    # -- results -------------------------------------------------------------------------------
    def _check(self, results: list[Any]) -> None:
        if not results:
            raise self._pg.InternalError("got no result from the query")
        ok = self._names.ok
        for res in results:
            if res.status not in ok:
                raise self._pg.errors.error_from_result(res, encoding=self._session.conn.info.encoding)

    def _rows(self, results: list[Any]) -> list[tuple[Any, ...]]:
        # The first result's rows, as ``cursor.fetchall()`` after a text of several statements.
        if len(results) != 1 or results[0].status != self._names.tuples_ok:
            self._check(results)  # raises on an error
            if results[0].status != self._names.tuples_ok:
                return []
        res = results[0]
        tx = self._session.tx
        tx.set_pgresult(res)
        rows: list[tuple[Any, ...]] = tx.load_rows(0, res.ntuples, tuple)
        return rows

    def _failure(self, e: Exception) -> SqlFailure:
        conn = self._session.conn
        broken = conn.closed or conn.broken or self._session.pgconn.status != self._pg.pq.ConnStatus.OK
        if not broken:
            try:
                if conn.info.transaction_status != self._pg.pq.TransactionStatus.IDLE:
                    conn.execute("ROLLBACK")
            except self._pg.Error:
                broken = True
        return pg_failure(e, broken)


def _bound(statements: list[tuple[str, list[Any]]]) -> list[tuple[str, list[Any]]]:
    """``statements`` with the host facts bound (read once for the request)."""
    facts = host_fact_values()
    return [(sql, [facts[p - _FIRST_FACT] if type(p) is HostFact else p for p in params]) for sql, params in statements]
