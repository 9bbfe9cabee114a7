"""What the core refuses in a SQLite lock file, seen from Python (docs/sql-protocol.md): a
database of another application is refused and left as it was (no leasehold tables, its
journal mode unchanged), and a fence planted at 2^53 makes that name's acquires fail without
writing anything, until the documented recovery. Real files in tmp_path."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from leasehold import LockClient, errors
from leasehold.backends.sql_executor import SqliteExecutor
from leasehold.backends.sqlite import SQLiteLockService, SQLiteServiceError

LIMIT = 2**53


def _tables(path: Path) -> list[str]:
    con = sqlite3.connect(path)
    try:
        return [n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    finally:
        con.close()


def _journal_mode(path: Path) -> str:
    con = sqlite3.connect(path)
    try:
        return str(con.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        con.close()


def test_a_database_of_another_application_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE users (name TEXT)")
    con.execute("INSERT INTO users VALUES ('alice')")
    con.commit()
    con.close()
    before = path.read_bytes()
    with pytest.raises(SQLiteServiceError, match=r'belongs to something else \(it holds table "users"\)') as ei:
        SQLiteLockService(path)
    assert ei.value.path == str(path)
    with LockClient(SqliteExecutor(path)) as client:
        with pytest.raises(errors.BackendUnavailable, match="belongs to something else"):
            client.acquire("n", ttl=5, wait=0.5)
    assert _tables(path) == ["users"]
    assert _journal_mode(path) == "delete"
    assert path.read_bytes() == before


def _fence(path: Path, name: str) -> tuple[object, str]:
    con = sqlite3.connect(path)
    try:
        row = con.execute("SELECT fence, typeof(fence) FROM leasehold_fences WHERE name = ?", (name,)).fetchone()
        return row[0], row[1]
    finally:
        con.close()


def _plant(path: Path, name: str, fence: int) -> None:
    con = sqlite3.connect(path)
    con.execute("UPDATE leasehold_fences SET fence = ? WHERE name = ?", (fence, name))
    con.commit()
    con.close()


@pytest.mark.parametrize("planted", [LIMIT, 2**63 - 1])
def test_a_fence_planted_at_the_limit_fails_the_name_and_nothing_is_written(tmp_path: Path, planted: int) -> None:
    path = tmp_path / "locks.db"
    with LockClient(SQLiteLockService(path)) as client:
        first = client.acquire("n", ttl=5)
        assert first.fencing_token < LIMIT
        first.release()
        _plant(path, "n", planted)
        for _ in range(2):  # each attempt refused, none moves the stored fence
            with pytest.raises(errors.LockTimeout) as ei:
                client.acquire("n", ttl=5, wait=0.3)
            assert "stored fence" in str(ei.value), str(ei.value)
            assert _fence(path, "n") == (planted, "integer")
        con = sqlite3.connect(path)
        assert con.execute("SELECT count(*) FROM leasehold_locks WHERE name = 'n'").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM leasehold_holders WHERE fence >= ?", (LIMIT,)).fetchone() == (0,)
        con.close()
        # Other names are not affected.
        other = client.acquire("other", ttl=5)
        assert other.fencing_token < LIMIT
        other.release()
        # The documented recovery: delete the name's rows; fences restart from the clock.
        con = sqlite3.connect(path)
        con.execute("BEGIN IMMEDIATE")
        for table in ("leasehold_fences", "leasehold_locks", "leasehold_holders"):
            con.execute(f"DELETE FROM {table} WHERE name = 'n'")
        con.execute("COMMIT")
        con.close()
        again = client.acquire("n", ttl=5)
        assert again.fencing_token < LIMIT
        again.release()
