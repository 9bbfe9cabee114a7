"""The fencing gate on sqlite3: one transaction, reject only token < high-water mark."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from leasehold import FencingGate, StaleFencingToken


@pytest.fixture
def conn(tmp_path: Path) -> sqlite3.Connection:
    c = sqlite3.connect(tmp_path / "r.db")
    c.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v INTEGER)")
    c.execute("INSERT INTO kv VALUES ('x', 0)")
    c.commit()
    return c


def add(gate: FencingGate, token: int, delta: int = 1) -> None:
    with gate.guard("kv", token) as cur:
        cur.execute("SELECT v FROM kv WHERE k = 'x'")
        (v,) = cur.fetchone()
        cur.execute("UPDATE kv SET v = ? WHERE k = 'x'", (v + delta,))


def value(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT v FROM kv WHERE k = 'x'").fetchone()[0])


def test_gate_accepts_equal_and_higher_rejects_lower(conn: sqlite3.Connection) -> None:
    gate = FencingGate(conn)
    gate.ensure_schema()
    assert gate.high_water_mark("kv") is None
    add(gate, 5)
    add(gate, 5)  # equal passes: a retry with the same token works
    assert gate.high_water_mark("kv") == 5
    add(gate, 9)
    assert gate.high_water_mark("kv") == 9
    with pytest.raises(StaleFencingToken) as ei:
        add(gate, 8)
    assert ei.value.high_water_mark == 9 and ei.value.token == 8 and ei.value.resource == "kv"
    assert value(conn) == 3
    assert gate.high_water_mark("kv") == 9
    assert not conn.in_transaction


def test_failed_operation_rolls_back_mark_and_writes(conn: sqlite3.Connection) -> None:
    gate = FencingGate(conn)
    gate.ensure_schema()
    add(gate, 1)
    with pytest.raises(ZeroDivisionError):
        with gate.guard("kv", 4) as cur:
            cur.execute("UPDATE kv SET v = 100 WHERE k = 'x'")
            1 / 0
    assert value(conn) == 1
    assert gate.high_water_mark("kv") == 1  # the raise of the mark was rolled back too


def test_stale_reader_cannot_lose_an_update(tmp_path: Path) -> None:
    """A stale holder that read before the new holder's write is refused as a whole."""
    path = tmp_path / "s.db"
    a, b = sqlite3.connect(path), sqlite3.connect(path)
    a.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v INTEGER)")
    a.execute("INSERT INTO kv VALUES ('x', 0)")
    a.commit()
    ga, gb = FencingGate(a), FencingGate(b)
    ga.ensure_schema()
    add(ga, 1)  # old holder, token 1
    add(gb, 2)  # new holder, token 2
    with pytest.raises(StaleFencingToken):
        add(ga, 1)  # the old holder resumes: its read-modify-write is refused
    assert value(a) == 2


def test_gate_misuse(conn: sqlite3.Connection) -> None:
    gate = FencingGate(conn)
    gate.ensure_schema()
    with pytest.raises(TypeError):
        with gate.guard("kv", "3"):  # type: ignore[arg-type]
            pass
    with pytest.raises(ValueError):
        with gate.guard("", 3):
            pass
    with pytest.raises(ValueError):
        FencingGate(conn, table="x; DROP TABLE kv")
    conn.execute("UPDATE kv SET v = 7")
    assert conn.in_transaction
    with pytest.raises(RuntimeError, match="own the transaction"):
        with gate.guard("kv", 3):
            pass
    conn.rollback()
    assert gate.run("kv", 3, lambda cur: cur.execute("SELECT v FROM kv").fetchone()[0]) == 0


class _FakeCursor:
    def __init__(self, conn: "_FakeConn") -> None:
        self.conn = conn
        self._row: tuple[int] | None = None

    def execute(self, sql: str, params: object = ()) -> None:
        self.conn.log.append((sql, params))
        if sql.startswith("SELECT hwm"):
            hwm = self.conn.hwm
            self._row = None if hwm is None else (hwm,)
        elif sql.startswith("INSERT"):
            assert isinstance(params, tuple)
            if "ON CONFLICT" in sql:
                if self.conn.hwm is None:
                    self.conn.hwm = params[1]  # type: ignore[assignment]
            else:
                self.conn.hwm = params[1]  # type: ignore[assignment]
        elif sql.startswith("UPDATE leasehold_fencing"):
            assert isinstance(params, tuple)
            self.conn.hwm = params[0]  # type: ignore[assignment]

    def fetchone(self) -> tuple[int] | None:
        return self._row

    def close(self) -> None:
        pass


class _FakeConn:
    """Just enough of a DB-API connection (format paramstyle, like psycopg) to see the SQL."""

    def __init__(self) -> None:
        self.hwm: int | None = None
        self.log: list[tuple[str, object]] = []
        self.commits = 0
        self.rollbacks = 0

    def cursor(self) -> _FakeCursor:
        return _FakeCursor(self)

    def commit(self) -> None:
        self.commits += 1

    def rollback(self) -> None:
        self.rollbacks += 1


@pytest.mark.parametrize("dialect", ["postgres", "generic"])
def test_gate_sql_for_dbapi_connections(dialect: str) -> None:
    conn = _FakeConn()
    gate = FencingGate(conn, dialect=dialect, paramstyle="format")
    with gate.guard("res", 5) as cur:
        cur.execute("UPDATE app SET x = 1")
    assert conn.hwm == 5 and conn.commits == 1
    sqls = [s for s, _ in conn.log]
    assert any("FOR UPDATE" in s and "%s" in s for s in sqls)
    if dialect == "postgres":
        assert "ON CONFLICT (resource) DO NOTHING" in sqls[0]
    conn.log.clear()
    with pytest.raises(StaleFencingToken):
        with gate.guard("res", 4):
            raise AssertionError("must not run")
    assert conn.rollbacks == 1 and conn.hwm == 5
    assert not any(s.startswith("UPDATE app") for s, _ in conn.log)
