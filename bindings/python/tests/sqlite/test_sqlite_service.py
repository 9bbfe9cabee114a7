"""SQLiteLockService: the embedded default on the core's SQL protocol — fences, expiry, boot id,
status, unusable files, and files written by earlier versions."""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import stat
import tempfile
from pathlib import Path

import pytest
from sqlite_helpers import FakeClock

from leasehold import AsyncLockClient, LockClient, errors
from leasehold.backends.sql_executor import SqliteExecutor
from leasehold.backends.sqlite import (
    LockStatus,
    SQLiteLockService,
    SQLiteServiceError,
    current_boot_id,
    default_path,
    path_from_url,
)

T1 = "a" * 32


def _remove_db(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def test_is_an_executor_of_the_core_protocol_and_takes_the_old_arguments(open_service, db_path):
    svc = open_service(busy_timeout=1.5, durable=False, notify=True, boot_id="b", clock=lambda: 1)
    assert isinstance(svc, SqliteExecutor) and svc.backend_protocol == "sql"
    assert svc.notifications is False  # notify is ignored: SQLite has no release wake-ups
    assert svc.path == str(db_path) and repr(svc) == f"SQLiteLockService({str(db_path)!r})"
    assert db_path.exists()  # created and migrated at once
    with SQLiteLockService(db_path, notify=False) as other:
        assert other.status("n") == LockStatus("n", False, None, None, None, None)


def test_grants_status_and_fences_through_a_client(open_service):
    clock = FakeClock()
    svc = open_service(clock=clock)
    with LockClient(svc) as client:
        h = client.acquire("n", ttl=60)
        assert h.fencing_token == 1
        clock.advance_ms(2_500)
        h.renew()  # a renewal does not restart "since"
        clock.advance_ms(500)
        # status() reads on a connection of its own while the client drives the service.
        st = svc.status("n")
        assert st == LockStatus("n", True, 1, 59_500, os.getpid(), 1)
        assert st.holder_host == socket.gethostname() and st.held_for_ms == 3_000
        assert st.to_dict()["remaining_ttl_ms"] == 59_500
        with LockClient(open_service(clock=clock)) as other, pytest.raises(errors.LockTimeout):
            other.acquire("n", ttl=5, wait=0)
        assert h.release() == "released"
        free = svc.status("n")
        assert free == LockStatus("n", False, None, None, None, 1)
        assert free.holder_host is None and free.held_for_ms is None
        assert client.acquire("n", ttl=60).fencing_token == 2  # never reset, never reused


def test_fences_keep_increasing_when_the_file_is_lost(open_service, db_path):
    # Fences are max(previous + 1, wall clock in µs): a deleted file starts its fence table
    # again, and the clock keeps new fences above every fence a gate saw before.
    wall = [1_000_000]
    with LockClient(open_service(wall_clock=lambda: wall[0])) as client:
        with client.acquire("n", ttl=5) as h:
            first = h.fencing_token
        assert first == 1_000_000
        with client.acquire("n", ttl=5) as h:
            assert h.fencing_token == first + 1  # the clock has not moved
    _remove_db(db_path)
    wall[0] += 5
    fresh = open_service(wall_clock=lambda: wall[0])
    assert fresh.status("n").last_fencing_token is None  # the table really is new
    with LockClient(fresh) as client, client.acquire("n", ttl=5) as h:
        assert h.fencing_token == first + 5


def test_real_wall_clock_fences_are_microseconds_since_the_epoch(db_path):
    import time

    with LockClient(SQLiteLockService(db_path)) as client:
        before = time.time_ns() // 1_000
        with client.acquire("n", ttl=5) as h:
            assert before <= h.fencing_token <= time.time_ns() // 1_000


def test_a_holder_learns_it_lost_its_lock_when_the_file_is_deleted(open_service, db_path):
    wall = [1_000]
    with LockClient(open_service(wall_clock=lambda: wall[0])) as client:
        h = client.acquire("n", ttl=60)
        _remove_db(db_path)
        wall[0] += 10
        # The service follows the path to the new file: the lock is not there, so the
        # renewal is refused and the holder learns it at once.
        with pytest.raises(errors.LockLost):
            h.renew()
        assert h.lost.is_set()
        with client.acquire("n", ttl=5) as again:
            assert again.fencing_token == 1_010 > h.fencing_token


def test_lock_from_an_earlier_boot_counts_as_expired(open_service):
    clock = FakeClock()
    before = open_service(boot_id="boot-one", clock=clock)
    with LockClient(before) as client:
        h = client.acquire("n", ttl=3_600, auto_renew=False)
        assert h.fencing_token == 1
        # Same file after a "reboot": the monotonic clock restarted, so the old expiry would
        # look like an hour in the future; the boot id makes it expired.
        clock.now = 1
        after = open_service(boot_id="boot-two", clock=clock)
        st = after.status("n")
        assert not st.held and st.last_fencing_token == 1
        with LockClient(after) as other, other.acquire("n", ttl=5) as taken:
            assert taken.fencing_token == 2


def test_current_boot_id_is_stable():
    assert current_boot_id() == current_boot_id()
    if os.path.exists("/proc/sys/kernel/random/boot_id"):
        assert current_boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_the_asyncio_client_runs_it_in_worker_threads(open_service):
    svc = open_service()

    async def main() -> None:
        async with AsyncLockClient(svc) as client:
            async with client.acquire("n", ttl=5) as h:
                assert h.fencing_token == 1
                assert svc.status("n").fencing_token == 1
            async with client.acquire("n", ttl=5) as h:
                assert h.fencing_token == 2

    asyncio.run(main())
    assert not svc.status("n").held


def test_busy_database_is_a_bounded_error(open_service, db_path):
    svc = open_service(busy_timeout=0.05)
    blocker = sqlite3.connect(db_path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(SQLiteServiceError, match="busy") as ei:
            SQLiteLockService(db_path, busy_timeout=0.05)
        assert ei.value.path == str(db_path) and str(db_path) in str(ei.value)
        with pytest.raises(SQLiteServiceError, match="busy"):
            svc.status("n")
        client = LockClient(svc, owns_service=False)
        with pytest.raises(errors.BackendUnavailable, match="locked"):
            client.acquire("n", ttl=5, wait=0.3)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    with client.acquire("n", ttl=5, wait=5) as h:  # fine again afterwards
        assert h.fencing_token >= 1
    client.close()


def test_database_is_in_wal_mode(open_service, db_path):
    open_service()
    con = sqlite3.connect(db_path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()


# ------------------------------------------------------------------ files of earlier versions

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


def _tables(db: Path) -> set[str]:
    con = sqlite3.connect(db)
    try:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        con.close()


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
    with LockClient(svc) as client:
        with pytest.raises(errors.LockTimeout):
            client.acquire("old", ttl=5, wait=0)  # the old holder's lock still counts
        with client.acquire("new", ttl=5) as h:
            assert h.fencing_token == 1
            assert svc.status("new").holder_host == socket.gethostname()
    # What an older leasehold checks when it opens a file: schema version and lock columns.
    con = sqlite3.connect(db_path)
    try:
        assert con.execute("SELECT value FROM leasehold_meta WHERE key='schema'").fetchone() == ("1",)
        cols = [r[1] for r in con.execute("PRAGMA table_info(leasehold_locks)")]
        assert cols == ["name", "token", "fence", "expiry_ns", "boot_id", "pid"]
    finally:
        con.close()


def test_a_grant_by_an_older_version_does_not_inherit_stale_holder_details(db_path, open_service):
    clock = FakeClock()
    svc = open_service(clock=clock)
    with LockClient(svc) as client, client.acquire("n", ttl=5) as h:
        assert h.fencing_token == 1
    # An older leasehold grants the next fence without touching leasehold_holders.
    con = sqlite3.connect(db_path)
    con.execute(
        "INSERT INTO leasehold_locks VALUES ('n', ?, 2, ?, ?, 999)",
        (T1, clock.now + 5_000_000_000, current_boot_id()),
    )
    con.execute("UPDATE leasehold_fences SET fence=2 WHERE name='n'")
    con.commit()
    con.close()
    st = svc.status("n")
    assert st.held and st.fencing_token == 2 and st.holder_pid == 999
    assert st.holder_host is None and st.held_for_ms is None  # the record describes fence 1


# ------------------------------------------------------------------ unusable files


def test_garbage_file_is_reported_with_its_path(tmp_path):
    p = tmp_path / "garbage.sqlite3"
    p.write_bytes(b"this is not a database\n" * 200)
    with pytest.raises(SQLiteServiceError, match="corrupt or not a SQLite file") as ei:
        SQLiteLockService(p)
    assert ei.value.path == str(p)
    assert str(p) in str(ei.value)


def test_damaged_database_is_reported(tmp_path):
    p = tmp_path / "damaged.sqlite3"
    SQLiteLockService(p).close()
    con = sqlite3.connect(p)
    con.executemany(  # a few pages of data
        "INSERT INTO leasehold_fences VALUES (?, ?)", [(f"name-{i:04d}-" + "x" * 100, i) for i in range(300)]
    )
    con.commit()
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    data = bytearray(p.read_bytes())
    assert len(data) > 4 * 4096
    for off in range(4096 + 8, len(data), 97):  # scribble over every page but the header
        data[off] = 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(SQLiteServiceError, match="corrupt") as ei:
        SQLiteLockService(p)
    assert ei.value.path == str(p)


def test_foreign_schema_is_refused(tmp_path):
    p = tmp_path / "other.sqlite3"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE leasehold_locks (name TEXT PRIMARY KEY, owner TEXT)")
    con.commit()
    con.close()
    with pytest.raises(SQLiteServiceError, match="leasehold_locks exists with columns"):
        SQLiteLockService(p)
    con = sqlite3.connect(p)
    assert con.execute("SELECT count(*) FROM leasehold_locks").fetchone() == (0,)  # untouched
    con.close()


def test_newer_schema_version_is_refused(tmp_path):
    p = tmp_path / "newer.sqlite3"
    SQLiteLockService(p).close()
    con = sqlite3.connect(p)
    con.execute("UPDATE leasehold_meta SET value='99' WHERE key='schema'")
    con.commit()
    con.close()
    with pytest.raises(SQLiteServiceError, match='schema version "99"'):
        SQLiteLockService(p)


def test_missing_directory_and_not_a_directory(tmp_path):
    with pytest.raises(SQLiteServiceError, match="does not exist") as ei:
        SQLiteLockService(tmp_path / "nope" / "locks.sqlite3")
    assert ei.value.path == str(tmp_path / "nope" / "locks.sqlite3")
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(SQLiteServiceError, match="is not a directory"):
        SQLiteLockService(f / "locks.sqlite3")
    with pytest.raises(SQLiteServiceError, match="is a directory"):
        SQLiteLockService(tmp_path)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_file_that_cannot_be_created_is_reported():
    # /proc refuses new files even for root.
    with pytest.raises(SQLiteServiceError, match="not writable") as ei:
        SQLiteLockService("/proc/leasehold-test.sqlite3")
    assert ei.value.path == "/proc/leasehold-test.sqlite3"


def _readonly_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="leasehold-ro-"))
    d.chmod(0o755)
    return d


def test_read_only_file_is_reported():
    d = _readonly_dir()
    p = d / "locks.sqlite3"
    try:
        SQLiteLockService(p).close()
        for f in d.iterdir():
            f.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        d.chmod(0o555)
        if os.geteuid() != 0:
            with pytest.raises(SQLiteServiceError, match="not writable") as ei:
                SQLiteLockService(p)
            assert ei.value.path == str(p)
            return
        # root ignores permissions: check from a forked child that drops to nobody.
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            code = 3
            try:
                os.close(r)
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                try:
                    SQLiteLockService(p, notify=False).close()
                    msg = "opened"
                except SQLiteServiceError as e:
                    msg = f"{e.message}|{e.path}"
                os.write(w, msg.encode())
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        with os.fdopen(r) as rf:
            msg = rf.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert "not writable" in msg and msg.endswith(f"|{p}"), msg
    finally:
        d.chmod(0o755)
        for f in d.iterdir():
            f.chmod(0o644)
            f.unlink()
        d.rmdir()


# ------------------------------------------------------------------ misc


def test_bad_arguments(open_service, tmp_path):
    svc = open_service()
    for bad in (-1, float("nan"), float("inf"), 601, True, "5"):
        with pytest.raises(ValueError, match="busy_timeout"):
            SQLiteLockService(tmp_path / "x.sqlite3", busy_timeout=bad)  # type: ignore[arg-type]
    for path in (":memory:", "", "file:x.db?mode=memory"):
        with pytest.raises(ValueError):
            SQLiteLockService(path)
    with pytest.raises(ValueError):
        svc.status("")
    assert not (tmp_path / "x.sqlite3").exists()


def test_urls_and_default_path(tmp_path, monkeypatch):
    assert path_from_url("sqlite:///tmp/x.sqlite3") == Path("/tmp/x.sqlite3")
    assert path_from_url("sqlite:rel/x.sqlite3") == Path("rel/x.sqlite3")
    assert path_from_url("sqlite:///tmp/a%20b.sqlite3") == Path("/tmp/a b.sqlite3")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_path() == tmp_path / "leasehold" / "locks.sqlite3"
    assert path_from_url("sqlite://") == default_path()
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the spec says: absolute only
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_path() == tmp_path / "home" / ".cache" / "leasehold" / "locks.sqlite3"
    for bad in ("redis://x", "sqlite://host/x", "sqlite:///x?mode=ro"):
        with pytest.raises(ValueError):
            path_from_url(bad)
    svc = SQLiteLockService.from_url(f"sqlite://{tmp_path}/u.sqlite3", busy_timeout=1)
    assert svc.path == str(tmp_path / "u.sqlite3")
    svc.close()
