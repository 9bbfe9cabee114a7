"""Holder details (pid, host, since) in the SQLite file, and the schema migration that adds them."""

from __future__ import annotations

import os
import socket
import sqlite3

from sqlite_helpers import FakeClock

from leasehold.backends.sqlite import LockStatus, SQLiteLockService, current_boot_id

T1, T2 = "a" * 32, "b" * 32

# The schema as leasehold wrote it before holder details were recorded.
OLD_SCHEMA = (
    "CREATE TABLE leasehold_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE leasehold_locks (name TEXT PRIMARY KEY, token TEXT NOT NULL, fence INTEGER NOT NULL,"
    " expiry_ns INTEGER NOT NULL, boot_id TEXT NOT NULL, pid INTEGER NOT NULL)",
    "CREATE TABLE leasehold_fences (name TEXT PRIMARY KEY, fence INTEGER NOT NULL)",
    "CREATE TABLE leasehold_watchers (name TEXT NOT NULL, addr BLOB NOT NULL, pid INTEGER NOT NULL,"
    " PRIMARY KEY (name, addr))",
    "INSERT INTO leasehold_meta(key, value) VALUES ('schema', '1')",
)


def _tables(db) -> set[str]:
    con = sqlite3.connect(db)
    try:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        con.close()


def test_status_reports_host_and_time_held(open_service):
    clock = FakeClock()
    svc = open_service(clock=clock)
    svc.acquire("n", T1, 10_000)
    clock.advance_ms(2_500)
    svc.renew("n", T1, 10_000, b"")  # a renewal does not restart "since"
    svc.acquire("n", T1, 10_000)  # nor does the idempotent re-acquire
    clock.advance_ms(500)
    st = svc.status("n")
    assert st == LockStatus("n", True, 1, 9_500, os.getpid(), 1)
    assert st.holder_host == socket.gethostname()
    assert st.held_for_ms == 3_000

    svc.release("n", T1, b"")
    svc.acquire("n", T2, 10_000)  # a new grant starts its own time
    clock.advance_ms(100)
    assert svc.status("n").held_for_ms == 100
    svc.release("n", T2, b"")
    free = svc.status("n")
    assert not free.held and free.holder_host is None and free.held_for_ms is None


def test_an_older_file_gains_the_holders_table_and_keeps_its_locks(db_path, open_service):
    clock = FakeClock()
    con = sqlite3.connect(db_path)
    for stmt in OLD_SCHEMA:
        con.execute(stmt)
    # A lock held by a process of the older version: no holder details anywhere.
    con.execute(
        "INSERT INTO leasehold_locks VALUES ('old', ?, 7, ?, ?, 4242)",
        (T1, clock.now + 60_000_000_000, current_boot_id()),
    )
    con.execute("INSERT INTO leasehold_fences VALUES ('old', 7)")
    con.commit()
    con.close()
    assert "leasehold_holders" not in _tables(db_path)

    svc = open_service(clock=clock)
    assert "leasehold_holders" in _tables(db_path)
    st = svc.status("old")
    assert st == LockStatus("old", True, 7, 60_000, 4242, 7)
    assert st.holder_host is None and st.held_for_ms is None  # unknown, not made up
    assert svc.renew("old", T1, 60_000, b"") is True  # the old holder's lock still works
    assert svc.acquire("old", T2, 1_000).__class__.__name__ == "HeldByOther"

    # Opening again (another process, a later start) changes nothing: the migration is idempotent.
    again = open_service(clock=clock)
    assert again.status("old") == st
    assert again.acquire("new", T2, 5_000).fencing_token == 1
    assert again.status("new").holder_host == socket.gethostname()


def test_a_grant_by_an_older_version_does_not_inherit_stale_holder_details(db_path, open_service):
    clock = FakeClock()
    svc = open_service(clock=clock)
    svc.acquire("n", T1, 1_000)
    svc.release("n", T1, b"")
    # An older leasehold grants the next fence without touching leasehold_holders.
    con = sqlite3.connect(db_path)
    con.execute(
        "INSERT INTO leasehold_locks VALUES ('n', ?, 2, ?, ?, 999)",
        (T2, clock.now + 5_000_000_000, current_boot_id()),
    )
    con.execute("UPDATE leasehold_fences SET fence=2 WHERE name='n'")
    con.commit()
    con.close()
    st = svc.status("n")
    assert st.held and st.fencing_token == 2 and st.holder_pid == 999
    assert st.holder_host is None and st.held_for_ms is None  # the row describes fence 1


def test_older_versions_can_still_open_a_migrated_file(db_path, open_service):
    open_service().acquire("n", T1, 5_000)
    # What an older leasehold checks when it opens a file: schema version and lock columns.
    con = sqlite3.connect(db_path)
    try:
        assert con.execute("SELECT value FROM leasehold_meta WHERE key='schema'").fetchone() == ("1",)
        cols = [r[1] for r in con.execute("PRAGMA table_info(leasehold_locks)")]
        assert cols == ["name", "token", "fence", "expiry_ns", "boot_id", "pid"]
    finally:
        con.close()
