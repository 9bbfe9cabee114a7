"""The storage-side fencing gate for SQL stores (sqlite3 and any DB-API 2.0 connection).

A lock client can only *detect* that it lost a lock; the resource must *enforce* it. The
gate does that with one transaction per protected operation:

1. lock the resource's high-water-mark row (``BEGIN IMMEDIATE`` on SQLite,
   ``SELECT ... FOR UPDATE`` elsewhere);
2. refuse the operation if ``token < high-water mark`` (:class:`StaleFencingToken`; equal
   passes, so a retry with the same token works);
3. raise the mark to ``token``;
4. run the protected operation — **its reads as well as its writes** — in the same
   transaction, then commit (or roll everything back if it raises).

Checking only the final write is not enough: a stale holder that *read* before its pause and
writes before the new holder's first write raised the mark would still lose an update.

Example::

    gate = FencingGate(sqlite3.connect("app.db"))
    gate.ensure_schema()
    with client.acquire("invoices", ttl=30) as lock:
        with gate.guard("invoices", lock.fencing_token) as cur:
            cur.execute("SELECT total FROM invoices WHERE id = ?", (1,))
            (total,) = cur.fetchone()
            cur.execute("UPDATE invoices SET total = ? WHERE id = ?", (total + 10, 1))
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import sys
from typing import Any, Callable, Iterator, TypeVar

from .errors import StaleFencingToken

__all__ = ["FencingGate", "StaleFencingToken"]

T = TypeVar("T")
_MAX_TOKEN = 2**63 - 1  # the largest BIGINT (and SQLite INTEGER)
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _placeholder(paramstyle: str, i: int) -> str:
    if paramstyle == "qmark":
        return "?"
    if paramstyle in ("format", "pyformat"):
        return "%s"
    if paramstyle == "numeric":
        return f":{i}"
    if paramstyle == "named":
        return f":p{i}"
    raise ValueError(f"unsupported paramstyle {paramstyle!r}")


class FencingGate:
    """Guards operations on named resources with fencing tokens, in one SQL transaction.

    :param connection: a ``sqlite3.Connection`` or any DB-API 2.0 connection; the gate owns
        its transactions (do not call it inside an open transaction)
    :param table: the high-water-mark table (created by :meth:`ensure_schema`)
    :param paramstyle: the driver's paramstyle (detected from the driver module if omitted)
    :param dialect: ``"sqlite"`` (detected for sqlite3), ``"postgres"`` (``ON CONFLICT`` +
        ``FOR UPDATE``), or ``"generic"`` (``FOR UPDATE``, insert when missing)
    """

    def __init__(
        self,
        connection: Any,
        *,
        table: str = "leasehold_fencing",
        paramstyle: str | None = None,
        dialect: str | None = None,
    ) -> None:
        if not _IDENT.match(table):
            raise ValueError(f"table must be a plain SQL identifier, got {table!r}")
        self.connection = connection
        self.table = table
        is_sqlite = isinstance(connection, sqlite3.Connection)
        self.dialect = dialect or ("sqlite" if is_sqlite else "generic")
        if self.dialect not in ("sqlite", "postgres", "generic"):
            raise ValueError(f"unknown dialect {self.dialect!r}")
        if paramstyle is None:
            if is_sqlite:
                paramstyle = "qmark"
            else:
                mod = sys.modules.get(type(connection).__module__.split(".")[0])
                paramstyle = getattr(mod, "paramstyle", "format")
        self.paramstyle = paramstyle

    def _sql(self, template: str, nparams: int) -> str:
        return template.format(*(_placeholder(self.paramstyle, i + 1) for i in range(nparams)), t=self.table)

    def _params(self, *values: Any) -> Any:
        if self.paramstyle == "named":
            return {f"p{i + 1}": v for i, v in enumerate(values)}
        return tuple(values)

    def ensure_schema(self) -> None:
        """Create the high-water-mark table if it does not exist (and commit)."""
        cur = self.connection.cursor()
        try:
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {self.table} (resource TEXT PRIMARY KEY, hwm BIGINT NOT NULL)"
            )
        finally:
            cur.close()
        self.connection.commit()

    def high_water_mark(self, resource: str) -> int | None:
        """The highest token accepted for ``resource`` (``None`` if never written)."""
        cur = self.connection.cursor()
        try:
            cur.execute(self._sql("SELECT hwm FROM {t} WHERE resource = {0}", 1), self._params(resource))
            row = cur.fetchone()
        finally:
            cur.close()
        self.connection.commit()
        return None if row is None else int(row[0])

    @contextlib.contextmanager
    def guard(self, resource: str, token: int) -> Iterator[Any]:
        """Open the gate for ``token`` on ``resource``; yields a cursor in the transaction.

        Commits when the block ends normally; rolls back (and re-raises) if it raises.

        :raises StaleFencingToken: ``token`` is lower than the high-water mark (nothing ran)
        :raises TypeError: ``token`` is not an ``int`` (nothing ran)
        :raises ValueError: ``token`` is outside ``0 .. 2**63 - 1``, what the mark's ``BIGINT``
            holds, as in the Go and C++ gates (nothing ran, no transaction was opened)
        """
        if not isinstance(resource, str) or not resource:
            raise ValueError("resource must be a non-empty str")
        if isinstance(token, bool) or not isinstance(token, int):
            raise TypeError(f"fencing token must be an int, not {type(token).__name__}")
        if not 0 <= token <= _MAX_TOKEN:
            raise ValueError(f"fencing token {token} out of range (0 to 2**63 - 1)")
        conn = self.connection
        cur = self._begin()
        try:
            hwm = self._check_and_raise(cur, resource, token)
            if hwm is not None and token < hwm:
                raise StaleFencingToken(resource, token, hwm)
            yield cur
        except BaseException:
            try:
                conn.rollback()
            finally:
                cur.close()
            raise
        else:
            try:
                conn.commit()
            finally:
                cur.close()

    def run(self, resource: str, token: int, operation: Callable[[Any], T]) -> T:
        """``operation(cursor)`` inside :meth:`guard`; returns its result."""
        with self.guard(resource, token) as cur:
            return operation(cur)

    # -- internals -----------------------------------------------------------------------------
    def _begin(self) -> Any:
        conn = self.connection
        if self.dialect == "sqlite":
            if conn.in_transaction:
                raise RuntimeError(
                    "FencingGate needs to own the transaction: commit or roll back before calling guard()"
                )
            cur = conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            return cur
        return conn.cursor()

    def _check_and_raise(self, cur: Any, resource: str, token: int) -> int | None:
        """Lock the mark row, compare, and raise the mark. Returns the previous mark."""
        if self.dialect == "sqlite":
            cur.execute(self._sql("SELECT hwm FROM {t} WHERE resource = {0}", 1), self._params(resource))
            row = cur.fetchone()
            if row is None:
                cur.execute(self._sql("INSERT INTO {t} (resource, hwm) VALUES ({0}, {1})", 2), self._params(resource, token))
                return None
        else:
            if self.dialect == "postgres":
                cur.execute(
                    self._sql("INSERT INTO {t} (resource, hwm) VALUES ({0}, {1}) ON CONFLICT (resource) DO NOTHING", 2),
                    self._params(resource, -1),
                )
            cur.execute(self._sql("SELECT hwm FROM {t} WHERE resource = {0} FOR UPDATE", 1), self._params(resource))
            row = cur.fetchone()
            if row is None:
                cur.execute(self._sql("INSERT INTO {t} (resource, hwm) VALUES ({0}, {1})", 2), self._params(resource, token))
                return None
        hwm = int(row[0])
        if hwm < 0:  # placeholder row inserted above
            hwm_opt: int | None = None
        else:
            hwm_opt = hwm
        if hwm_opt is not None and token < hwm_opt:
            return hwm_opt
        if hwm_opt is None or token > hwm_opt:
            cur.execute(self._sql("UPDATE {t} SET hwm = {0} WHERE resource = {1}", 2), self._params(token, resource))
        return hwm_opt
