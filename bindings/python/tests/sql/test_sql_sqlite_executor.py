"""SqliteExecutor: the core's SQL protocol executed on real SQLite files by stdlib sqlite3."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from leasehold import LockClient, errors
from leasehold.backends.sql_executor import SqliteExecutor
from leasehold.backends.sqlite import SQLiteLockService


def _grants(path: Path) -> list[int]:
    return [int(line.split()[0]) for line in path.read_text().splitlines()]


def test_processes_contend_fences_increase_and_the_gate_loses_no_update(tmp_path: Path, spawn) -> None:
    db, gate = tmp_path / "locks.db", tmp_path / "gate.db"
    workers = [spawn("contend", f"sqlite:{db}", "job", "12", str(tmp_path), f"sqlite:{gate}") for _ in range(3)]
    for w in workers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0 and out.split() == ["DONE"], err
    fences = _grants(tmp_path / "grants")
    assert len(fences) == 36
    assert all(a < b for a, b in zip(fences, fences[1:])), fences
    with sqlite3.connect(gate) as conn:
        assert conn.execute("SELECT n FROM lh_counter WHERE id = 1").fetchone() == (36,)
        assert conn.execute("SELECT hwm FROM leasehold_fencing WHERE resource = 'job'").fetchone() == (fences[-1],)


def test_a_replaced_file_is_followed_and_fences_never_regress(tmp_path: Path) -> None:
    db = tmp_path / "locks.db"
    ex = SqliteExecutor(db)
    with LockClient(ex) as client:
        with client.acquire("n", ttl=5.0) as lock:
            first = lock.fencing_token
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        # The lock table is gone: the next request fails (the file was replaced), the
        # executor reopens the path, the core migrates again and mints from the clock.
        with client.acquire("n", ttl=5.0, wait=10.0) as lock:
            second = lock.fencing_token
    assert second > first
    assert db.exists()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT fence FROM leasehold_fences WHERE name = 'n'").fetchone() == (second,)


def test_an_embedded_service_and_the_executor_share_one_file(tmp_path: Path) -> None:
    db = tmp_path / "locks.db"
    with LockClient(SQLiteLockService(db)) as old, LockClient(SqliteExecutor(db)) as new:
        held = old.acquire("shared", ttl=10.0)
        with pytest.raises(errors.LockTimeout):
            new.acquire("shared", ttl=5.0, wait=0.3)
        held.release()
        with new.acquire("shared", ttl=5.0, wait=5.0) as lock:
            assert lock.fencing_token > held.fencing_token
            with pytest.raises(errors.LockTimeout):
                old.acquire("shared", ttl=5.0, wait=0.3)


def test_a_foreign_table_of_the_same_name_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE leasehold_locks (name TEXT PRIMARY KEY, owner INTEGER)")
    client = LockClient(SqliteExecutor(db))
    with pytest.raises(errors.BackendUnavailable) as e:
        client.acquire("n", ttl=5.0, wait=1.0)
    assert "leasehold_locks" in str(e.value), str(e.value)
    assert "leasehold_locks" in client.backend_last_error()
    client.close(timeout=0.2)  # its cleanup release cannot reach a refused schema
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM leasehold_locks").fetchone() == (0,)


def test_an_unusable_path_or_a_corrupt_file_is_a_clear_error_never_a_grant(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(os.urandom(8192))
    for path, said in ((tmp_path / "missing-dir" / "locks.db", "unable to open"), (garbage, "not a database")):
        client = LockClient(SqliteExecutor(path))
        with pytest.raises(errors.BackendUnavailable) as e:
            client.acquire("n", ttl=5.0, wait=0.5)
        assert said in str(e.value), str(e.value)
        client.close(timeout=0.2)
    with pytest.raises(ValueError):
        SqliteExecutor(":memory:")


def test_a_forked_child_leaves_the_parents_lock_alone(tmp_path: Path) -> None:
    import time

    with LockClient(SqliteExecutor(tmp_path / "locks.db")) as c:
        h = c.acquire("parent", ttl=1.0)
        pid = os.fork()
        if pid == 0:  # the child: its own core and connection; the parent's lease is not its own
            code = 1
            try:
                lost = h.lost.is_set()
                child = c.acquire("child", ttl=5.0)
                ok = child.release() == "released"
                code = 0 if (lost and ok) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        time.sleep(1.3)  # past the TTL: the parent kept renewing it, the child released nothing
        assert h.is_held() and not h.lost.is_set()
        assert h.release() == "released"
