"""flock(1)'s options on `leasehold run` (-n, -w, -E, -c), --fail-budget, and the holder details
that `leasehold status` reports, end to end on a real SQLite file with real processes."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading

import pytest
from cli_helpers import BOUND, finish, run_cli, spawn_cli, wait_until


class Holder:
    """`leasehold run NAME` in the background, holding the lock until ``release()``."""

    def __init__(self, backend, env, tmp_path, name="job", extra=()):
        self.started, self.gate = tmp_path / f"{name}.started", tmp_path / f"{name}.gate"
        self.proc = spawn_cli(
            ["run", *backend, *extra, name, "--", "sh", "-c",
             f'echo "$LEASEHOLD_FENCING_TOKEN" > {self.started}; while [ ! -e {self.gate} ]; do sleep 0.05; done'],
            env,
        )
        wait_until(lambda: self.started.exists() and self.started.read_text().strip(), what="holder running")

    def release(self):
        self.gate.touch()
        return finish(self.proc)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def holder(backend, env, tmp_path):
    h = Holder(backend, env, tmp_path)
    yield h
    h.kill()


# ------------------------------------------------------------------ -n, -w, -E, -c


def test_nonblock_gives_up_at_once_with_75(env, backend, holder, tmp_path):
    ran = tmp_path / "ran"
    res = run_cli(["run", *backend, "-n", "job", "--", "touch", str(ran)], env)
    assert res.returncode == 75, res.stderr
    assert "held by someone else" in res.stderr
    assert not ran.exists()
    res = run_cli(["run", *backend, "--nonblock", "job", "--", "touch", str(ran)], env)
    assert res.returncode == 75 and not ran.exists()
    rc, _, err = holder.release()
    assert rc == 0, err
    # Free again: -n takes it at once.
    res = run_cli(["run", *backend, "-n", "job", "--", "touch", str(ran)], env)
    assert res.returncode == 0, res.stderr
    assert ran.exists()


@pytest.mark.parametrize("how", [["-n"], ["-w", "0.3"], ["--wait", "0.3"]])
@pytest.mark.parametrize("code", ["0", "3", "255"])
def test_conflict_exit_code_replaces_75(env, backend, holder, tmp_path, how, code):
    ran = tmp_path / "ran"
    res = run_cli(["run", *backend, *how, "-E", code, "job", "--", "touch", str(ran)], env)
    assert res.returncode == int(code), res.stderr
    assert not ran.exists()
    res = run_cli(["run", *backend, *how, f"--conflict-exit-code={code}", "job", "--", "touch", str(ran)], env)
    assert res.returncode == int(code), res.stderr


def test_conflict_exit_code_leaves_other_codes_alone(env, backend):
    # Acquired: COMMAND's own status, not -E's.
    res = run_cli(["run", *backend, "-n", "-E", "9", "job", "--", "sh", "-c", "exit 4"], env)
    assert res.returncode == 4, res.stderr
    # Backend unavailable stays 69.
    res = run_cli(["run", "--backend", "sqlite:///proc/leasehold-flock.sqlite3", "-E", "9", "job", "--", "true"], env)
    assert res.returncode == 69, res.stderr


def test_shell_command_runs_through_sh(env, backend, tmp_path):
    out = tmp_path / "out"
    res = run_cli(
        ["run", *backend, "job", "-c", f'echo "$LEASEHOLD_LOCK_NAME $LEASEHOLD_FENCING_TOKEN" | tr a-z A-Z > {out}; exit 7'],
        env,
    )
    assert res.returncode == 7, res.stderr
    name, token = out.read_text().split()
    assert name == "JOB" and int(token) > 0
    # Options may come before NAME too, and --command is the long form.
    res = run_cli(["run", "--command", f"echo second >> {out}", *backend, "job"], env)
    assert res.returncode == 0, res.stderr
    assert out.read_text().splitlines()[-1] == "second"


@pytest.mark.parametrize(
    "args",
    [
        ["run", "-n", "-w", "1", "job", "--", "true"],
        ["run", "job", "-c", "true", "--", "echo", "x"],
        ["run", "job", "-c", "true", "echo"],
        ["run", "-c"],
        ["run", "-E", "256", "job", "--", "true"],
        ["run", "-E", "-1", "job", "--", "true"],
        ["run", "-E", "x", "job", "--", "true"],
        ["run", "--fail-budget", "-1", "job", "--", "true"],
        ["run", "--fail-budget", "1.5", "job", "--", "true"],
        ["run", "--fail-budget", str(2**32), "job", "--", "true"],
    ],
)
def test_bad_new_options_are_usage_errors(env, backend, args):
    res = run_cli([args[0], *backend, *args[1:]], env)
    assert res.returncode == 64, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr


def test_help_lists_exit_codes_and_the_new_options(env):
    top = run_cli(["--help"], env)
    assert top.returncode == 0
    for needle in (" 64 ", " 69 ", " 75 ", " 76 ", "126 / 127", "128+N", "-E CODE", "NAME is held", "NAME is free"):
        assert needle in top.stdout, f"{needle!r} missing from leasehold --help"
    run = run_cli(["run", "--help"], env)
    for needle in ("-n, --nonblock", "-E CODE, --conflict-exit-code CODE", "-c 'SHELL COMMAND'", "--fail-budget N",
                   "/bin/sh -c", "status line"):
        assert needle in run.stdout, f"{needle!r} missing from leasehold run --help"


# ------------------------------------------------------------------ --fail-budget


def _lose_while_database_is_locked(env, backend, db, tmp_path, budget):
    """Hold `job` with TTL 3 s, lock the database so every renewal fails in transit, and
    return leasehold's exit status and stderr once it reports the loss."""
    started = tmp_path / f"started-{budget}"
    proc = spawn_cli(
        ["run", *backend, "--ttl", "3", "--grace", "0", "--fail-budget", str(budget), "job", "--",
         "sh", "-c", f"touch {started}; exec sleep 60"],
        env,
    )
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    blocker = sqlite3.connect(db, isolation_level=None, timeout=30)
    try:
        wait_until(started.exists, what="holder running")
        blocker.execute("BEGIN IMMEDIATE")  # renewals wait for the busy timeout: transport errors
        wait_until(lambda: any("lost lock" in line for line in err), bound=BOUND, what="loss reported")
    finally:
        if blocker.in_transaction:
            blocker.execute("ROLLBACK")
        blocker.close()
    try:
        rc = proc.wait(timeout=BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(BOUND)
    return rc, "".join(err)


def test_fail_budget_loses_the_lock_after_that_many_failed_renewals(env, backend, db, tmp_path):
    rc, err = _lose_while_database_is_locked(env, backend, db, tmp_path, budget=1)
    assert rc == 76, err
    assert "lost lock 'job' (fail_budget)" in err, err


def test_a_large_fail_budget_keeps_retrying_until_validity_runs_out(env, backend, db, tmp_path):
    rc, err = _lose_while_database_is_locked(env, backend, db, tmp_path, budget=1_000_000)
    assert rc == 76, err
    assert "lost lock 'job' (expired)" in err, err


def test_fail_budget_zero_is_the_time_budget(env, backend, db, tmp_path):
    rc, err = _lose_while_database_is_locked(env, backend, db, tmp_path, budget=0)
    assert rc == 76, err
    assert "lost lock 'job' (fail_budget)" in err or "lost lock 'job' (expired)" in err, err


# ------------------------------------------------------------------ status: who holds it


def test_status_names_the_holder_pid_host_and_since(env, backend, holder):
    st = run_cli(["status", "job", *backend, "--json"], env)
    assert st.returncode == 0, st.stderr
    info = json.loads(st.stdout)
    assert info["held"] is True
    assert info["holder_pid"] == holder.proc.pid  # the leasehold process that acquired it
    assert info["holder_host"] == socket.gethostname()
    assert isinstance(info["held_for_ms"], int) and info["held_for_ms"] >= 0
    assert info["holder_since"].endswith("Z") and info["holder_since"][:4].isdigit()

    text = run_cli(["status", "job", *backend], env)
    assert text.returncode == 0
    assert f"holder pid {holder.proc.pid} on {socket.gethostname()} for " in text.stdout
    assert f"(since {info['holder_since'][:13]}" in text.stdout  # same hour, whatever the seconds

    rc, _, err = holder.release()
    assert rc == 0, err
    free = json.loads(run_cli(["status", "job", *backend, "--json"], env).stdout)
    assert free["held"] is False
    assert free["holder_pid"] is None and free["holder_host"] is None and free["holder_since"] is None


def test_no_status_line_when_stderr_is_not_a_terminal(env, backend, holder):
    waiter = spawn_cli(["run", *backend, "--wait", "30", "job", "--", "true"], env)
    try:
        wait_until(lambda: run_cli(["status", "job", *backend], env).returncode == 0, what="still held")
        threading.Event().wait(1.2)  # a status line would have been drawn twice by now
        holder.release()
        rc, _, err = finish(waiter)
    finally:
        if waiter.poll() is None:
            waiter.kill()
    assert rc == 0, err
    assert "waiting for" not in err and "\x1b[K" not in err, err
