"""The SQLite lock file holds lock names, pids, host names and tokens: it is created 0600 (its
-wal and -shm too) and the default directory 0700 whatever the umask, a symbolic link at the
path is refused without creating or touching its target, and a file or directory that
another user owns or may write is reported as a warning. Real files in tmp_path."""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from leasehold import LockClient, errors
from leasehold.backends.sql_executor import SqliteExecutor
from leasehold.backends.sqlite import SQLiteLockService, SQLiteServiceError, default_path


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """The most permissive umask: the modes below come from leasehold, not from it."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "leasehold" and r.levelno == logging.WARNING]


def _hold_and_check_sidecars(svc: SQLiteLockService, path: Path) -> None:
    """Grant a lock (SQLite now has its -wal and -shm open) and check their modes."""
    with LockClient(svc) as client:
        with client.acquire("n", ttl=5):
            for side in ("-wal", "-shm"):
                sidecar = Path(str(path) + side)
                assert sidecar.exists(), sidecar
                assert _mode(sidecar) == 0o600, (sidecar, oct(_mode(sidecar)))


def test_the_default_file_and_its_directories_are_private(tmp_path: Path, monkeypatch, loose_umask) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = default_path()
    assert path == tmp_path / "cache" / "leasehold" / "locks.sqlite3"
    svc = SQLiteLockService(path)
    assert _mode(tmp_path / "cache") == 0o700
    assert _mode(tmp_path / "cache" / "leasehold") == 0o700
    assert _mode(path) == 0o600
    _hold_and_check_sidecars(svc, path)
    svc.close()


def test_a_new_file_anywhere_is_0600_and_its_sidecars_too(tmp_path: Path, loose_umask) -> None:
    path = tmp_path / "locks.db"
    svc = SQLiteLockService(path)
    assert _mode(path) == 0o600
    _hold_and_check_sidecars(svc, path)
    svc.close()
    # The executor alone creates it the same way.
    other = tmp_path / "exec.db"
    with LockClient(SqliteExecutor(other)) as client:
        client.acquire("n", ttl=5).release()
    assert _mode(other) == 0o600


def test_a_link_is_refused_and_its_missing_target_never_created(tmp_path: Path) -> None:
    victim, link = tmp_path / "victim.db", tmp_path / "link.db"
    link.symlink_to(victim)
    with pytest.raises(SQLiteServiceError, match="symbolic link") as ei:
        SQLiteLockService(link)
    assert ei.value.path == str(link)
    with pytest.raises(ValueError, match="symbolic link"):
        SqliteExecutor(link)
    assert not victim.exists() and not os.path.lexists(str(victim) + "-wal")
    assert link.is_symlink()


def test_a_link_to_an_existing_file_leaves_it_untouched(tmp_path: Path) -> None:
    victim, link = tmp_path / "victim.db", tmp_path / "link.db"
    con = sqlite3.connect(victim)
    con.execute("CREATE TABLE users (name TEXT)")
    con.execute("INSERT INTO users VALUES ('alice')")
    con.commit()
    con.close()
    before, st = victim.read_bytes(), os.stat(victim)
    link.symlink_to(victim)
    with pytest.raises(SQLiteServiceError, match="symbolic link"):
        SQLiteLockService(link)
    after = os.stat(victim)
    assert victim.read_bytes() == before
    assert (after.st_mtime_ns, after.st_mode) == (st.st_mtime_ns, st.st_mode)
    assert not os.path.lexists(str(victim) + "-wal") and not os.path.lexists(str(victim) + "-shm")


def test_a_link_beside_the_file_is_refused(tmp_path: Path) -> None:
    """SQLite would follow a planted -wal link and write the log into its target."""
    path, victim = tmp_path / "locks.db", tmp_path / "victim"
    Path(str(path) + "-wal").symlink_to(victim)
    with pytest.raises(SQLiteServiceError, match=r"locks\.db-wal is a symbolic link"):
        SQLiteLockService(path)
    assert not victim.exists()


def test_a_link_put_in_the_files_place_later_is_refused_not_followed(tmp_path: Path) -> None:
    path, victim = tmp_path / "locks.db", tmp_path / "victim.db"
    victim.write_bytes(b"precious")
    client = LockClient(SqliteExecutor(path))
    try:
        client.acquire("n", ttl=5).release()
        os.unlink(path)
        for side in ("-wal", "-shm"):
            if os.path.lexists(str(path) + side):
                os.unlink(str(path) + side)
        path.symlink_to(victim)
        with pytest.raises(errors.BackendUnavailable, match="symbolic link"):
            client.acquire("n", ttl=5, wait=0.5)
    finally:
        client.close()
    assert victim.read_bytes() == b"precious"
    assert not os.path.lexists(str(victim) + "-wal")


def test_a_link_swapped_in_while_sqlite_opens_is_caught_before_any_write(tmp_path: Path, monkeypatch) -> None:
    """The race between the checks and SQLite's own open: the file is replaced by a link to
    an existing database just before SQLite opens the path."""
    path, victim = tmp_path / "locks.db", tmp_path / "victim.db"
    con = sqlite3.connect(victim)
    con.execute("CREATE TABLE users (name TEXT)")
    con.commit()
    con.close()
    before = victim.read_bytes()
    real_connect = sqlite3.connect

    def swap_then_connect(*args, **kwargs):
        if os.path.lexists(path) and not os.path.islink(path):
            os.unlink(path)
            path.symlink_to(victim)
        return real_connect(*args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", swap_then_connect)
    with pytest.raises(SQLiteServiceError, match="replaced while it was opened"):
        SQLiteLockService(path)
    monkeypatch.undo()
    assert victim.read_bytes() == before
    assert not os.path.lexists(str(victim) + "-wal")


def test_a_fifo_at_the_path_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "locks.db"
    os.mkfifo(path)
    with pytest.raises(SQLiteServiceError, match="not a regular file"):
        SQLiteLockService(path)


def test_a_group_writable_existing_file_is_warned_about(tmp_path: Path, caplog) -> None:
    path = tmp_path / "shared.db"
    SQLiteLockService(path).close()
    assert _warnings(caplog) == []  # its own new file: nothing to say
    os.chmod(path, 0o664)
    SQLiteLockService(path).close()
    said = _warnings(caplog)
    assert len(said) == 1 and f"lock file {path} is writable by other users (mode 0664)" in said[0], said
    # Once per process and file, not once per connection.
    SQLiteLockService(path).close()
    assert len(_warnings(caplog)) == 1


def test_a_world_readable_file_and_a_writable_directory_are_warned_about(tmp_path: Path, caplog) -> None:
    d = tmp_path / "d"
    d.mkdir()
    path = d / "locks.db"
    SQLiteLockService(path).close()
    os.chmod(path, 0o644)
    os.chmod(d, 0o777)
    SQLiteLockService(path).close()
    said = " | ".join(_warnings(caplog))
    assert f"lock file {path} is readable by other users (mode 0644)" in said, said
    assert f"lock directory {d} is writable by other users (mode 0777)" in said, said


def test_a_sticky_shared_directory_is_not_warned_about(tmp_path: Path, caplog) -> None:
    d = tmp_path / "sticky"
    d.mkdir()
    os.chmod(d, 0o1777)  # like /tmp: others cannot replace the file
    SQLiteLockService(d / "locks.db").close()
    assert _warnings(caplog) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_file_owned_by_another_user_is_warned_about(tmp_path: Path, caplog) -> None:
    path = tmp_path / "theirs.db"
    SQLiteLockService(path).close()
    os.chown(path, 65534, 65534)
    SQLiteLockService(path).close()
    said = _warnings(caplog)
    assert len(said) == 1 and f"lock file {path} is owned by another user (uid 65534)" in said[0], said


def test_an_existing_default_directory_open_to_others_is_warned_about(tmp_path: Path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    d = tmp_path / "cache" / "leasehold"
    d.mkdir(parents=True)
    os.chmod(d, 0o775)
    SQLiteLockService(default_path()).close()
    assert _mode(d) == 0o775  # an existing directory is the user's: reported, not changed
    said = _warnings(caplog)
    assert len(said) == 1 and f"lock directory {d} is writable by other users (mode 0775)" in said[0], said


def test_laxer_wal_and_shm_left_by_a_looser_file_are_tightened(tmp_path: Path) -> None:
    path = tmp_path / "locks.db"
    SQLiteLockService(path).close()
    os.chmod(path, 0o644)
    old = os.umask(0o022)
    try:
        other = sqlite3.connect(path)  # another process's connection keeps -wal and -shm
        other.execute("SELECT count(*) FROM sqlite_master").fetchall()
    finally:
        os.umask(old)
    try:
        for side in ("-wal", "-shm"):
            assert _mode(Path(str(path) + side)) == 0o644
        os.chmod(path, 0o600)  # the owner closes the file to others
        SQLiteLockService(path).close()
        for side in ("-wal", "-shm"):
            assert _mode(Path(str(path) + side)) == 0o600, side
    finally:
        other.close()
