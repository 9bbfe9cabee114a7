"""SQLiteLockService semantics in one process: grants, fencing, expiry, boot id, errors."""

from __future__ import annotations

import os
import sqlite3
import stat
import tempfile
import threading
from pathlib import Path

import pytest
from sqlite_helpers import BOUND, FakeClock

from leasehold.backends.sqlite import (
    LockStatus,
    SQLiteLockService,
    SQLiteServiceError,
    current_boot_id,
    default_path,
    path_from_url,
)
from leasehold.service import Granted, HeldByOther, LockService

T1, T2, T3 = "a" * 32, "b" * 32, "c" * 32


def test_is_a_lock_service(open_service):
    svc = open_service()
    assert isinstance(svc, LockService)


def test_grant_held_by_other_and_idempotent_acquire(open_service):
    clock = FakeClock()
    svc = open_service(clock=clock)
    g = svc.acquire("job", T1, 10_000)
    assert g == Granted(fencing_token=1, ttl_ms=10_000)

    clock.advance_ms(4_000)
    other = svc.acquire("job", T2, 10_000)
    assert other == HeldByOther(retry_after_ms=6_000)  # the holder's remaining TTL

    # The same token again (a retried acquire whose answer was lost): same fence, TTL refreshed.
    again = svc.acquire("job", T1, 10_000)
    assert again == Granted(fencing_token=1, ttl_ms=10_000)
    assert svc.status("job").remaining_ttl_ms == 10_000

    # Other names are independent.
    assert svc.acquire("other", T2, 1_000) == Granted(fencing_token=1, ttl_ms=1_000)


def test_retry_hint_rounds_up_and_is_positive(open_service):
    clock = FakeClock()
    svc = open_service(clock=clock)
    svc.acquire("n", T1, 1_000)
    clock.now += 999_999_500  # 500 ns left
    assert svc.acquire("n", T2, 1_000) == HeldByOther(retry_after_ms=1)


def test_renew_and_release_compare_the_token(open_service):
    clock = FakeClock()
    svc = open_service(clock=clock)
    svc.acquire("n", T1, 1_000)
    assert svc.renew("n", T2, 1_000, b"") is False
    assert svc.release("n", T2, b"") is False
    assert svc.status("n").held

    clock.advance_ms(900)
    assert svc.renew("n", T1, 5_000, b"") is True
    clock.advance_ms(4_000)  # would have expired at 1 000 ms without the renew
    assert svc.acquire("n", T2, 1_000) == HeldByOther(retry_after_ms=1_000)

    assert svc.release("n", T1, b"") is True
    assert svc.release("n", T1, b"") is False  # already released
    assert svc.renew("n", T1, 1_000, b"") is False
    assert not svc.status("n").held


def test_expired_lock_is_taken_over_and_never_renewed(open_service):
    clock = FakeClock()
    svc = open_service(clock=clock)
    assert svc.acquire("n", T1, 1_000).fencing_token == 1
    clock.advance_ms(1_000)  # expiry is exclusive: at expiry_ns the lock is free
    assert svc.renew("n", T1, 1_000, b"") is False  # no silent re-acquire on renew
    assert svc.acquire("n", T2, 1_000).fencing_token == 2
    assert svc.release("n", T1, b"") is False  # the old holder cannot delete the new grant
    assert svc.status("n").fencing_token == 2


def test_release_of_own_expired_row_reports_not_owner_and_frees(open_service):
    clock = FakeClock()
    svc = open_service(clock=clock)
    svc.acquire("n", T1, 1_000)
    clock.advance_ms(5_000)
    assert svc.release("n", T1, b"") is False
    assert svc.acquire("n", T2, 1_000).fencing_token == 2


def test_fencing_tokens_strictly_increase_and_never_reset(open_service, db_path):
    clock = FakeClock()
    svc = open_service(clock=clock)
    seen = []
    for i in range(5):
        tok = f"{i:032x}"
        seen.append(svc.acquire("n", tok, 1_000).fencing_token)
        if i % 2:
            assert svc.release("n", tok, b"")
        else:
            clock.advance_ms(2_000)  # let it expire instead
    assert seen == [1, 2, 3, 4, 5]
    svc.close()

    # The fence survives in its own table even when the lock row is gone (deleted by hand).
    con = sqlite3.connect(db_path)
    con.execute("DELETE FROM leasehold_locks")
    con.commit()
    con.close()
    svc2 = open_service(clock=clock)
    assert svc2.status("n") == LockStatus("n", False, None, None, None, 5)
    assert svc2.acquire("n", T1, 1_000).fencing_token == 6


def test_fences_keep_increasing_when_the_file_is_lost(open_service, db_path):
    # Fences are max(previous + 1, wall clock in µs): a deleted file starts its fence table
    # again, and the clock keeps new fences above every fence a gate saw before.
    wall = [1_000_000]
    svc = open_service(wall_clock=lambda: wall[0])
    first = svc.acquire("n", T1, 1_000).fencing_token
    assert first == 1_000_000
    assert svc.release("n", T1, b"")
    assert svc.acquire("n", T2, 1_000).fencing_token == first + 1  # the clock has not moved
    svc.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db_path}{suffix}").unlink(missing_ok=True)
    wall[0] += 5
    fresh = open_service(wall_clock=lambda: wall[0])
    assert fresh.status("n").last_fencing_token is None  # the table really is new
    assert fresh.acquire("n", T3, 1_000).fencing_token == first + 5


def test_real_wall_clock_fences_are_microseconds_since_the_epoch(db_path):
    import time

    svc = SQLiteLockService(db_path)
    try:
        before = time.time_ns() // 1_000
        fence = svc.acquire("n", T1, 1_000).fencing_token
        assert before <= fence <= time.time_ns() // 1_000
    finally:
        svc.close()


def test_status(open_service):
    clock = FakeClock()
    svc = open_service(clock=clock)
    assert svc.status("n") == LockStatus("n", False, None, None, None, None)
    svc.acquire("n", T1, 3_000)
    clock.advance_ms(1_000)
    st = svc.status("n")
    assert st == LockStatus("n", True, 1, 2_000, os.getpid(), 1)
    assert st.to_dict()["remaining_ttl_ms"] == 2_000
    svc.release("n", T1, b"")
    assert svc.status("n") == LockStatus("n", False, None, None, None, 1)


def test_lock_from_an_earlier_boot_counts_as_expired(open_service):
    clock = FakeClock()
    before = open_service(boot_id="boot-one", clock=clock)
    assert before.acquire("n", T1, 3_600_000).fencing_token == 1
    assert before.acquire("n", T2, 1_000) == HeldByOther(retry_after_ms=3_600_000)

    # Same file after a "reboot": the monotonic clock restarted, so the old expiry would look
    # like an hour in the future; the boot id makes it expired.
    clock.now = 1
    after = open_service(boot_id="boot-two", clock=clock)
    assert not after.status("n").held
    assert after.status("n").last_fencing_token == 1
    assert after.renew("n", T1, 1_000, b"") is False
    assert after.acquire("n", T2, 1_000) == Granted(fencing_token=2, ttl_ms=1_000)
    # And the other way round: the new boot's row is foreign to the old boot id.
    assert before.acquire("n", T3, 1_000).fencing_token == 3


def test_current_boot_id_is_stable():
    assert current_boot_id() == current_boot_id()
    if os.path.exists("/proc/sys/kernel/random/boot_id"):
        assert current_boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_same_process_watch_is_delivered_at_once(open_service):
    svc = open_service()
    got: list[str] = []
    svc.acquire("n", T1, 10_000)
    svc.watch("n", got.append)
    assert got == []  # held: nothing to report
    assert svc.release("n", T2, b"") is False
    assert got == []  # a refused release notifies nobody
    assert svc.release("n", T1, b"") is True
    assert got == ["n"]  # synchronously, before release() returned
    svc.unwatch("n")
    svc.acquire("n", T1, 10_000)
    svc.release("n", T1, b"")
    assert got == ["n"]


def test_watch_of_a_free_name_reports_it_free_once(open_service):
    # Closes the race "the release committed before the watch was registered".
    svc = open_service()
    got: list[str] = []
    svc.watch("n", got.append)
    assert got == (["n"] if svc.notifications else [])
    svc.acquire("n", T1, 10_000)
    assert got == (["n"] if svc.notifications else [])


def test_watch_callback_exception_does_not_break_release(open_service):
    svc = open_service()

    def boom(name: str) -> None:
        raise RuntimeError("callback failed")

    svc.watch("n", boom)
    svc.acquire("n", T1, 10_000)
    assert svc.release("n", T1, b"") is True


@pytest.mark.skipif(not os.path.exists("/proc/sys/kernel/random/boot_id"), reason="Linux only")
def test_release_wakes_another_service_on_the_same_file(open_service):
    waiter = open_service()
    holder = open_service()
    assert waiter.notifications and holder.notifications
    woke = threading.Event()
    names: list[str] = []

    def on_released(name: str) -> None:
        names.append(name)
        woke.set()

    holder.acquire("ü-name", T1, 10_000)
    waiter.watch("ü-name", on_released)
    assert names == []
    holder.release("ü-name", T1, b"")
    assert woke.wait(BOUND)
    assert names == ["ü-name"]


def test_notifications_can_be_disabled(open_service, db_path):
    waiter = open_service(notify=False)
    holder = open_service()
    assert waiter.notifications is False
    got: list[str] = []
    waiter.watch("n", got.append)
    con = sqlite3.connect(db_path)
    assert con.execute("SELECT count(*) FROM leasehold_watchers").fetchone()[0] == 0
    con.close()
    holder.acquire("n", T1, 10_000)
    holder.release("n", T1, b"")
    assert got == []


def test_close_unregisters_watchers_and_is_idempotent(open_service, db_path):
    svc = open_service()
    svc.watch("a", lambda n: None)
    svc.watch("b", lambda n: None)
    con = sqlite3.connect(db_path)
    count = lambda: con.execute("SELECT count(*) FROM leasehold_watchers").fetchone()[0]  # noqa: E731
    assert count() == (2 if svc.notifications else 0)
    svc.unwatch("a")
    assert count() == (1 if svc.notifications else 0)
    svc.close()
    svc.close()
    assert count() == 0
    con.close()
    with pytest.raises(SQLiteServiceError, match="closed"):
        svc.acquire("n", T1, 1_000)


def test_threads_share_one_service_without_lost_updates(open_service):
    svc = open_service()
    counter = {"value": 0, "inside": 0, "max_inside": 0}
    fences: list[int] = []
    per_thread, threads = 30, 4

    def worker(idx: int) -> None:
        for i in range(per_thread):
            tok = f"{idx:016x}{i:016x}"
            while True:
                r = svc.acquire("shared", tok, 30_000)
                if isinstance(r, Granted):
                    break
                threading.Event().wait(0.001)
            counter["inside"] += 1
            counter["max_inside"] = max(counter["max_inside"], counter["inside"])
            v = counter["value"]
            threading.Event().wait(0)  # yield inside the critical section
            counter["value"] = v + 1
            fences.append(r.fencing_token)
            counter["inside"] -= 1
            assert svc.release("shared", tok, b"")

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(BOUND)
    assert counter["value"] == per_thread * threads
    assert counter["max_inside"] == 1
    assert fences == sorted(fences) and len(set(fences)) == len(fences)


def test_busy_database_is_a_bounded_error(open_service, db_path):
    svc = open_service(busy_timeout=0.05)
    blocker = sqlite3.connect(db_path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(SQLiteServiceError, match="busy") as ei:
            svc.acquire("n", T1, 1_000)
        assert ei.value.path == str(db_path)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert isinstance(svc.acquire("n", T1, 1_000), Granted)  # fine again afterwards


def test_database_is_in_wal_mode(open_service, db_path):
    open_service()
    con = sqlite3.connect(db_path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()


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
    svc = SQLiteLockService(p)
    for i in range(300):  # a few pages of data
        svc.acquire(f"name-{i:04d}-" + "x" * 100, T1, 60_000)
    svc.close()
    con = sqlite3.connect(p)
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
    with pytest.raises(SQLiteServiceError, match="unexpected columns"):
        SQLiteLockService(p)


def test_newer_schema_version_is_refused(tmp_path):
    p = tmp_path / "newer.sqlite3"
    SQLiteLockService(p).close()
    con = sqlite3.connect(p)
    con.execute("UPDATE leasehold_meta SET value='99' WHERE key='schema'")
    con.commit()
    con.close()
    with pytest.raises(SQLiteServiceError, match="schema version '99'"):
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
    with pytest.raises(ValueError):
        svc.acquire("", T1, 1_000)
    with pytest.raises(ValueError):
        svc.acquire("n", "", 1_000)
    with pytest.raises(ValueError):
        svc.acquire("n", T1, 0)
    with pytest.raises(ValueError):
        svc.renew("n", T1, -5, b"")
    with pytest.raises(ValueError):
        SQLiteLockService(tmp_path / "x.sqlite3", busy_timeout=-1)
    with pytest.raises(ValueError):
        SQLiteLockService(":memory:")
    with pytest.raises(TypeError):
        svc.watch("n", "not callable")  # type: ignore[arg-type]


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
    svc = SQLiteLockService.from_url(f"sqlite://{tmp_path}/u.sqlite3")
    assert svc.path == str(tmp_path / "u.sqlite3")
    svc.close()


def test_fork_child_gets_its_own_connection(open_service):
    svc = open_service()
    svc.acquire("parent", T1, 60_000)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            os.close(r)
            g = svc.acquire("child", T2, 60_000)
            held = svc.acquire("parent", T2, 60_000)
            ok = svc.release("child", T2, b"")
            os.write(w, f"{g.fencing_token} {type(held).__name__} {ok}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as rf:
        msg = rf.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert msg == "1 HeldByOther True"
    assert svc.status("child").last_fencing_token == 1
    assert svc.release("parent", T1, b"")  # the parent's connection still works


def _remove_db(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_deleted_or_replaced_file_is_followed_and_old_locks_are_lost(open_service, db_path, how):
    holder = open_service()
    assert holder.acquire("n", T1, 60_000) == Granted(fencing_token=1, ttl_ms=60_000)
    _remove_db(db_path)
    if how == "replaced":
        other = SQLiteLockService(db_path, wall_clock=lambda: 0)  # a fresh file, its own lock
        assert other.acquire("n", T2, 60_000).fencing_token == 1
        other.close()
    # The holder must not keep renewing a lock that no other process can see any more.
    assert holder.renew("n", T1, 60_000, b"") is False
    assert db_path.exists()
    newcomer = open_service()
    expected = HeldByOther if how == "replaced" else Granted
    assert isinstance(newcomer.acquire("n", T3, 60_000), expected)
    # Both services now work on the same file: exclusion holds again.
    assert isinstance(holder.acquire("n", T1, 60_000), HeldByOther)


def test_directory_deleted_is_an_error_until_it_comes_back(open_service, tmp_path):
    d = tmp_path / "sub"
    d.mkdir()
    svc = open_service(d / "locks.sqlite3")
    svc.acquire("n", T1, 60_000)
    _remove_db(d / "locks.sqlite3")
    d.rmdir()
    with pytest.raises(SQLiteServiceError, match="does not exist"):
        svc.renew("n", T1, 60_000, b"")
    d.mkdir()
    assert svc.renew("n", T1, 60_000, b"") is False  # a new, empty file: the old lock is gone
    assert svc.acquire("n", T2, 60_000).fencing_token == 1
