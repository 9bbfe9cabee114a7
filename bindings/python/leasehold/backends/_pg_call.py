"""One request's statements on a PostgreSQL connection, driven through libpq (psycopg's
``pq``) rather than ``cursor.execute``: psycopg waits for the end of a statement however long
it takes, where a caller's deadline must bound the wait on the calling thread and, past it,
leave the same request to finish on another thread with the connection still in step.

Parameters are dumped and rows loaded by psycopg's own :class:`~psycopg.adapt.Transformer`
(what ``RawCursor`` does); statements are prepared on first use per connection (what psycopg's
``prepare_threshold`` does after a few uses). Nothing here reads a statement or a row.
"""

from __future__ import annotations

import select
import time
from typing import Any

from .. import _ffi
from .._backend import SqlFailure, bind_params, host_facts
from .._core import SqlRequest

_READ = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP
_WRITE = select.POLLOUT | select.POLLERR | select.POLLHUP


def pg_failure(e: Exception, broken: bool) -> SqlFailure:
    """A psycopg error as the protocol reports it: the database's refusal (with its
    message), or a transport failure when the connection is gone."""
    diag = getattr(e, "diag", None)
    text = (getattr(diag, "message_primary", None) if diag is not None else None) or str(e) or type(e).__name__
    if broken or getattr(e, "sqlstate", None) is None:
        # The core says "connection failed: " itself.
        return SqlFailure(_ffi.LH_FAILURE_TRANSPORT, str(e).strip().removeprefix("connection failed: ") or text)
    return SqlFailure(_ffi.LH_FAILURE_DATABASE, text)


_INT8: Any = None


def _int8(psycopg: Any) -> Any:
    global _INT8
    if _INT8 is None:
        from psycopg.types.numeric import Int8

        _INT8 = Int8
    return _INT8


class Late(Exception):
    """The caller's deadline passed before the request ended; :meth:`PgCall.run` continues it."""


class PgSession:
    """A connection and the statements prepared on it (names live as long as the connection)."""

    __slots__ = ("conn", "prepared", "tx")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.prepared: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        # One Transformer per connection, as a cursor keeps one: its dumpers and loaders are
        # looked up once, not per request (requests on a connection never overlap).
        self.tx: Any = None


class PgCall:
    """A request in progress on a :class:`PgSession`: :meth:`run` sends each statement and
    waits for its result, within a deadline or to the end; after :class:`Late` it can be
    called again (on any thread) and picks up where it stopped."""

    def __init__(self, psycopg: Any, session: PgSession, request: SqlRequest, request_timeout: float) -> None:
        self._pg = psycopg
        self._session = session
        self._pgconn = session.conn.pgconn
        if session.tx is None:
            session.tx = psycopg.adapt.Transformer(session.conn)
        self._tx = session.tx
        self._auto = psycopg.adapt.PyFormat.AUTO
        int8 = _int8(psycopg)
        facts = host_facts()
        # Integers bind as bigint, the protocol's type.
        self._todo = [
            (sql.encode(), [int8(p) if type(p) is int else p for p in bind_params(params, facts)])
            for sql, params in request.statements
        ]
        self._next = 0
        self._phase = 0  # 0: nothing in flight; 1: PREPARE sent; 2: the statement sent
        self._key: tuple[bytes, tuple[int, ...]] = (b"", ())
        self._values: Any = None
        self._formats: Any = None
        self._prepared_name = b""
        self._out: list[list[tuple[Any, ...]]] = []
        self._give_up_at = time.monotonic() + request_timeout
        self._request_timeout = request_timeout

    def run(self, deadline: float | None = None) -> list[list[tuple[Any, ...]]]:
        """Every statement's rows. Raises :class:`Late` at ``deadline`` (``time.monotonic()``),
        :class:`~leasehold._backend.SqlFailure` on an error (a database error leaves no
        transaction open; a transport failure, or no answer within the request timeout,
        leaves the connection closed)."""
        try:
            while self._next < len(self._todo):
                if self._phase == 0:
                    self._send()
                results = self._results(deadline)
                self._check(results)
                if self._phase == 1:
                    self._session.prepared[self._key] = self._prepared_name
                    self._send_prepared(self._prepared_name)
                    continue
                self._out.append(self._rows(results[0]))
                self._phase = 0
                self._next += 1
        except (Late, SqlFailure):
            raise
        except self._pg.Error as e:
            raise self._failure(e) from None
        return self._out

    # -- sending -------------------------------------------------------------------------------
    def _send(self) -> None:
        sql, params = self._todo[self._next]
        if not params:
            # The simple protocol, as psycopg runs a statement without parameters: a text
            # may hold several statements (the schema's migration does).
            self._pgconn.send_query(sql)
            self._phase = 2
            return
        tx = self._tx
        self._values = tx.dump_sequence(params, [self._auto] * len(params))
        self._formats = tx.formats
        self._key = (sql, tuple(tx.types or ()))
        name = self._session.prepared.get(self._key)
        if name is not None:
            self._send_prepared(name)
            return
        self._prepared_name = b"lh_%d" % len(self._session.prepared)
        self._pgconn.send_prepare(self._prepared_name, sql, param_types=self._key[1])
        self._phase = 1

    def _send_prepared(self, name: bytes) -> None:
        self._pgconn.send_query_prepared(name, self._values, param_formats=self._formats)
        self._phase = 2

    # -- waiting -------------------------------------------------------------------------------
    def _results(self, deadline: float | None) -> list[Any]:
        pg = self._pgconn
        while pg.flush() != 0:
            self._wait(_WRITE, deadline)
        results: list[Any] = []
        while True:
            while pg.is_busy():
                self._wait(_READ, deadline)
                pg.consume_input()
            res = pg.get_result()
            if res is None:
                return results
            results.append(res)

    def _wait(self, events: int, deadline: float | None) -> None:
        limit = self._give_up_at if deadline is None else min(deadline, self._give_up_at)
        left = limit - time.monotonic()
        if left > 0:
            poller = select.poll()
            poller.register(self._pgconn.socket, events)
            if poller.poll(left * 1000.0):
                return
        if deadline is not None and deadline < self._give_up_at:
            raise Late()
        # Mid-request: the connection cannot be trusted to be in step any more.
        self._session.conn.close()
        raise SqlFailure(_ffi.LH_FAILURE_TRANSPORT, f"no answer within {self._request_timeout:g}s")

    # -- results -------------------------------------------------------------------------------
    def _check(self, results: list[Any]) -> None:
        pq = self._pg.pq
        ok = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK, pq.ExecStatus.EMPTY_QUERY)
        if not results:
            raise self._pg.InternalError("got no result from the query")
        for res in results:
            if res.status not in ok:
                raise self._pg.errors.error_from_result(res, encoding=self._session.conn.info.encoding)

    def _rows(self, res: Any) -> list[tuple[Any, ...]]:
        # The first result's rows, as ``cursor.fetchall()`` after a text of several statements.
        if res.status != self._pg.pq.ExecStatus.TUPLES_OK:
            return []
        self._tx.set_pgresult(res)
        rows: list[tuple[Any, ...]] = self._tx.load_rows(0, res.ntuples, tuple)
        return rows

    def _failure(self, e: Exception) -> SqlFailure:
        conn = self._session.conn
        broken = conn.closed or conn.broken or self._pgconn.status != self._pg.pq.ConnStatus.OK
        if not broken:
            try:
                if conn.info.transaction_status != self._pg.pq.TransactionStatus.IDLE:
                    conn.execute("ROLLBACK")
            except self._pg.Error:
                broken = True
        return pg_failure(e, broken)

