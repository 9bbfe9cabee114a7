"""FencingGate and tokens no lock grants: a token past 2**63 - 1 (what the mark's BIGINT
holds) is refused as out of range, as the Go and C++ gates refuse it, before any transaction;
a negative or non-int token is a clear error; the largest token is stored exactly. On a real
SQLite file and on the session's real PostgreSQL (``pg_url`` of tests/conftest.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from leasehold.fencing import FencingGate, StaleFencingToken

MAX = 2**63 - 1


def _sqlite(tmp_path: Path) -> Iterator[tuple[FencingGate, Callable[[], bool]]]:
    conn = sqlite3.connect(tmp_path / "app.db")
    gate = FencingGate(conn)
    gate.ensure_schema()
    conn.execute("CREATE TABLE items (v INTEGER)")
    conn.commit()
    yield gate, lambda: conn.in_transaction
    conn.close()


def _postgres(pg_url: str) -> Iterator[tuple[FencingGate, Callable[[], bool]]]:
    import psycopg
    from psycopg.pq import TransactionStatus

    conn = psycopg.connect(pg_url)
    gate = FencingGate(conn, dialect="postgres")
    gate.ensure_schema()
    conn.execute("CREATE TABLE items (v NUMERIC)")
    conn.commit()
    yield gate, lambda: conn.info.transaction_status != TransactionStatus.IDLE
    conn.close()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[FencingGate, Callable[[], bool]]]:
    if request.param == "sqlite":
        yield from _sqlite(tmp_path)
    else:
        yield from _postgres(request.getfixturevalue("pg_url"))


def _write(gate: FencingGate, token: Any) -> None:
    with gate.guard("r", token) as cur:
        cur.execute(gate._sql("INSERT INTO items VALUES ({0})", 1), gate._params(str(token)))


def _items(gate: FencingGate) -> list[str]:
    cur = gate.connection.cursor()
    cur.execute("SELECT v FROM items")
    rows = [str(v) for (v,) in cur.fetchall()]
    cur.close()
    gate.connection.commit()
    return rows


@pytest.mark.parametrize("token", [2**63, 2**64, 10**30])
def test_a_token_past_the_bigint_range_is_refused_before_any_transaction(store, token: int) -> None:
    gate, in_transaction = store
    _write(gate, 10)
    with pytest.raises(ValueError, match=rf"fencing token {token} out of range \(0 to 2\*\*63 - 1\)"):
        _write(gate, token)
    ran: list[int] = []
    with pytest.raises(ValueError, match="out of range"):
        gate.run("r", token, lambda cur: ran.append(1))
    assert ran == [] and not in_transaction()
    assert gate.high_water_mark("r") == 10 and _items(gate) == ["10"]
    _write(gate, 11)  # the gate still works
    assert gate.high_water_mark("r") == 11


def test_the_largest_token_is_stored_exactly_and_then_fences_out_every_other(store) -> None:
    gate, in_transaction = store
    _write(gate, MAX)
    assert gate.high_water_mark("r") == MAX
    _write(gate, MAX)  # equal passes
    with pytest.raises(StaleFencingToken):
        _write(gate, MAX - 1)
    assert not in_transaction() and _items(gate) == [str(MAX), str(MAX)]


@pytest.mark.parametrize(
    ("token", "error", "said"),
    [
        (-1, ValueError, "out of range"),
        (-(2**63), ValueError, "out of range"),
        (1.5, TypeError, "must be an int, not float"),
        ("5", TypeError, "must be an int, not str"),
        (None, TypeError, "must be an int, not NoneType"),
        (True, TypeError, "must be an int, not bool"),
    ],
)
def test_a_negative_or_non_int_token_is_a_clear_error(store, token: Any, error: type, said: str) -> None:
    gate, in_transaction = store
    with pytest.raises(error, match=said):
        _write(gate, token)
    assert not in_transaction() and gate.high_water_mark("r") is None and _items(gate) == []
