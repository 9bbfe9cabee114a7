"""`leasehold` CLI end to end: help, usage errors, exit codes, environment, status, backends."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import db_rows, run_cli

from leasehold import LockClient
from leasehold.backends.sqlite import SQLiteLockService
from leasehold.cli import split_run_argv

PRINT_ENV = 'echo "$LEASEHOLD_LOCK_NAME $LEASEHOLD_FENCING_TOKEN"'


# ------------------------------------------------------------------ help


def test_help_is_complete(env):
    top = run_cli(["--help"], env)
    assert top.returncode == 0
    assert "run" in top.stdout and "status" in top.stdout

    run = run_cli(["run", "--help"], env)
    assert run.returncode == 0
    text = run.stdout
    for needle in (
        "--backend", "--ttl", "--wait", "--grace", "--foreground",
        "LEASEHOLD_FENCING_TOKEN", "LEASEHOLD_LOCK_NAME", "SIGTERM", "SIGKILL",
        " 64 ", " 69 ", " 75 ", " 76 ", "126", "127", "128+N",
        "sqlite://", "redis://", "memory://", "XDG_CACHE_HOME", "LEASEHOLD_BACKEND",
    ):
        assert needle in text, f"{needle!r} missing from run --help"

    status = run_cli(["status", "--help"], env)
    assert status.returncode == 0
    for needle in ("--json", "--backend", "held", "free"):
        assert needle in status.stdout

    version = run_cli(["--version"], env)
    assert version.returncode == 0 and version.stdout.startswith("leasehold ")


# ------------------------------------------------------------------ usage errors → 64


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["run"],
        ["run", "name"],  # no COMMAND
        ["run", "name", "--"],
        ["run", "", "--", "true"],
        ["run", "--ttl", "abc", "name", "--", "true"],
        ["run", "--ttl", "0", "name", "--", "true"],
        ["run", "--ttl", "-1", "name", "--", "true"],
        ["run", "--wait", "-1", "name", "--", "true"],
        ["run", "--grace", "nan", "name", "--", "true"],
        ["run", "--no-such-option", "name", "--", "true"],
        ["run", "--backend", "ftp://x", "name", "--", "true"],
        ["run", "--backend", "sqlite://host/x.db", "name", "--", "true"],
        ["run", "x" * 600, "--", "true"],
        ["status"],
        ["status", "name", "--backend", "bogus"],
        ["frobnicate"],
    ],
)
def test_usage_errors_exit_64(env, args):
    res = run_cli(args, env)
    assert res.returncode == 64, (res.returncode, res.stderr)
    assert res.stderr.strip()
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("ttl", ["0.001", "1e9"])
def test_ttl_refused_by_the_core_is_a_usage_error(env, backend, ttl):
    res = run_cli(["run", *backend, "--ttl", ttl, "name", "--", "echo", "ran"], env)
    assert res.returncode == 64, res.stderr
    assert "TTL" in res.stderr and "ran" not in res.stdout


def test_usage_error_does_not_take_the_lock(env, db, backend):
    res = run_cli(["run", *backend, "--ttl", "-5", "name", "--", "true"], env)
    assert res.returncode == 64
    assert db_rows(db, "SELECT * FROM leasehold_fences") == []


def test_split_run_argv():
    assert split_run_argv(["n", "--", "ls", "-l"]) == (["n"], ["ls", "-l"])
    assert split_run_argv(["--ttl", "3", "n", "ls", "--ttl", "9"]) == (["--ttl", "3", "n"], ["ls", "--ttl", "9"])
    assert split_run_argv(["n", "--wait=0", "--", "--weird"]) == (["n", "--wait=0"], ["--weird"])
    assert split_run_argv(["-v", "n"]) == (["-v", "n"], [])
    assert split_run_argv(["n", "-b", "memory://", "echo", "hi"]) == (["n", "-b", "memory://"], ["echo", "hi"])


# ------------------------------------------------------------------ the child's status and env


@pytest.mark.parametrize("code", [0, 1, 3, 75, 76, 200])
def test_child_exit_status_is_passed_through(env, backend, code):
    res = run_cli(["run", *backend, "job", "--", "sh", "-c", f"exit {code}"], env)
    assert res.returncode == code, res.stderr


def test_child_killed_by_signal_is_passed_on(env, backend):
    # Like timeout(1): leasehold dies of the same signal (a shell sees 128+N) ...
    res = run_cli(["run", *backend, "job", "--", "sh", "-c", "kill -TERM $$"], env)
    assert res.returncode == -15, res.stderr
    # ... except for core-dumping signals, which give exit status 128+N.
    res = run_cli(["run", *backend, "job", "--", "sh", "-c", "kill -QUIT $$"], env)
    assert res.returncode == 128 + 3, res.stderr
    shell = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" -m leasehold run {" ".join(backend)} job -- sh -c "kill -KILL \\$\\$"; echo "status $?"'],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert shell.stdout.strip() == "status 137", shell.stderr


def test_environment_and_increasing_fencing_tokens(env, db, backend):
    tokens = []
    for _ in range(3):
        res = run_cli(["run", *backend, "my-job", "--", "sh", "-c", PRINT_ENV], env)
        assert res.returncode == 0, res.stderr
        name, token = res.stdout.split()
        assert name == "my-job"
        tokens.append(int(token))
    assert tokens == sorted(set(tokens)) and len(tokens) == 3  # strictly increasing
    # released on exit: nothing left held
    assert db_rows(db, "SELECT count(*) FROM leasehold_locks") == [(0,)]


def test_command_without_double_dash_and_its_own_options(env, backend):
    res = run_cli(["run", *backend, "job", "sh", "-c", "echo $0 $1", "--ttl", "x"], env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["--ttl", "x"]


def test_stdin_and_stdout_are_the_commands(env, backend):
    res = run_cli(["run", *backend, "job", "--", "cat"], env, input="through the lock\n")
    assert res.returncode == 0
    assert res.stdout == "through the lock\n"


def test_other_environment_is_kept(env, backend):
    env = dict(env, MY_SETTING="kept")
    res = run_cli(["run", *backend, "job", "--", "sh", "-c", 'echo "$MY_SETTING"'], env)
    assert res.stdout.strip() == "kept"


def test_unicode_lock_name(env, backend):
    res = run_cli(["run", *backend, "Zürich/日本", "--", "sh", "-c", PRINT_ENV], env)
    assert res.returncode == 0, res.stderr
    name, token = res.stdout.split()
    assert name == "Zürich/日本" and int(token) > 0


# ------------------------------------------------------------------ 126 / 127 / 69


def test_command_not_found_is_127_and_takes_no_lock(env, db, backend):
    res = run_cli(["run", *backend, "job", "--", "no-such-command-leasehold-test"], env)
    assert res.returncode == 127
    assert "not found" in res.stderr
    res = run_cli(["run", *backend, "job", "--", "/no/such/file"], env)
    assert res.returncode == 127
    assert db_rows(db, "SELECT count(*) FROM leasehold_fences") in ([], [(0,)])


def test_command_not_executable_is_126(env, backend, tmp_path):
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    if os.geteuid() == 0:
        res = run_cli(["run", *backend, "job", "--", str(tmp_path)], env)  # a directory
    else:
        res = run_cli(["run", *backend, "job", "--", str(script)], env)
    assert res.returncode == 126, res.stderr


def test_unusable_database_is_69(env, tmp_path):
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"not a database at all\n" * 100)
    res = run_cli(["run", "--backend", f"sqlite://{garbage}", "job", "--", "echo", "ran"], env)
    assert res.returncode == 69
    assert str(garbage) in res.stderr and "corrupt" in res.stderr
    assert "ran" not in res.stdout

    res = run_cli(["run", "--backend", "sqlite:///proc/leasehold-cli-test.sqlite3", "job", "--", "true"], env)
    assert res.returncode == 69
    assert "/proc/leasehold-cli-test.sqlite3" in res.stderr

    res = run_cli(["status", "job", "--backend", f"sqlite://{garbage}"], env)
    assert res.returncode == 69


# ------------------------------------------------------------------ backends


def test_default_backend_is_sqlite_in_the_cache_dir(env, tmp_path):
    res = run_cli(["run", "job", "--", "sh", "-c", PRINT_ENV], env)
    assert res.returncode == 0, res.stderr
    db = tmp_path / "cache" / "leasehold" / "locks.sqlite3"
    assert db.exists()
    [(name, fence)] = db_rows(db, "SELECT name, fence FROM leasehold_fences")
    assert name == "job" and fence > 0
    st = run_cli(["status", "job", "--json"], env)
    assert json.loads(st.stdout)["last_fencing_token"] == fence


def test_backend_from_environment_variable(env, db):
    env = dict(env, LEASEHOLD_BACKEND=f"sqlite://{db}")
    res = run_cli(["run", "job", "--", "true"], env)
    assert res.returncode == 0, res.stderr
    assert db_rows(db, "SELECT name FROM leasehold_fences") == [("job",)]


def test_memory_backend_runs_in_one_process(env):
    res = run_cli(["run", "--backend", "memory://", "job", "--", "sh", "-c", PRINT_ENV], env)
    assert res.returncode == 0, res.stderr
    name, token = res.stdout.split()
    assert name == "job" and int(token) > 0


def test_relative_sqlite_url(env, tmp_path):
    res = run_cli(["run", "--backend", "sqlite:rel.sqlite3", "job", "--", "true"], env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "rel.sqlite3").exists()


# ------------------------------------------------------------------ status


def test_status_free_held_and_json(env, db, backend):
    st = run_cli(["status", "job", *backend], env)
    assert st.returncode == 1
    assert "free" in st.stdout and "never" in st.stdout
    assert not db.exists(), "status must not create the database"

    with LockClient(SQLiteLockService(db)) as client:
        lock = client.acquire("job", ttl=60)
        fence = lock.fencing_token
        st = run_cli(["status", "job", *backend, "--json"], env)
        assert st.returncode == 0, st.stderr
        info = json.loads(st.stdout)
        assert info["held"] is True and info["fencing_token"] == fence
        assert 0 < info["remaining_ttl_ms"] <= 60_000
        assert info["holder_pid"] == os.getpid() and info["holder_host"] == socket.gethostname()
        assert info["name"] == "job"

        text = run_cli(["status", "job", *backend], env)
        assert text.returncode == 0
        assert "held" in text.stdout and f"fencing token {fence}" in text.stdout

        assert lock.release() == "released"
        st = run_cli(["status", "job", *backend, "--json"], env)
        assert st.returncode == 1
        info = json.loads(st.stdout)
        assert info["held"] is False and info["fencing_token"] is None and info["last_fencing_token"] == fence


def test_status_on_a_backend_without_status_is_69(env):
    st = run_cli(["status", "job", "--backend", "memory://"], env)  # in-process only: nothing to read
    assert st.returncode == 69, st.stderr
    assert "not supported" in st.stderr


# ------------------------------------------------------------------ entry points


def test_console_script(env, backend):
    script = Path(sys.executable).parent / "leasehold"
    if not script.exists():
        script_path = shutil.which("leasehold")
        if script_path is None:
            pytest.skip("the leasehold console script is not installed in this environment")
        script = Path(script_path)
    res = subprocess.run(
        [str(script), "run", *backend, "job", "--", "sh", "-c", PRINT_ENV],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 0, res.stderr
    name, token = res.stdout.split()
    assert name == "job" and int(token) > 0


def test_database_locked_by_another_connection_is_69_not_a_hang(env, db, backend):
    import sqlite3

    SQLiteLockService(db).close()
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # holds the write lock past the 5 s busy timeout
    try:
        res = run_cli(["run", *backend, "--wait", "1", "job", "--", "echo", "ran"], env)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert res.returncode == 69, res.stderr
    assert "busy" in res.stderr and str(db) in res.stderr
    assert "ran" not in res.stdout


def test_command_gets_default_sigpipe(env, backend, tmp_path):
    # Python ignores SIGPIPE; COMMAND must not inherit that: `yes | head` ends quietly.
    err = tmp_path / "err"
    cmd = f'"{sys.executable}" -m leasehold run {" ".join(backend)} pipe -- yes 2>{err} | head -n 2'
    res = subprocess.run(["sh", "-c", cmd], env=env, capture_output=True, text=True, timeout=120)
    assert res.stdout == "y\ny\n"
    assert "Broken pipe" not in err.read_text()
