"""`leasehold run` supervision end to end: contention, --wait, renewal, loss, signals, crashes."""

from __future__ import annotations

import os
import signal
import sys

import pytest
from cli_helpers import BOUND, db_exec, db_rows, finish, pid_alive, run_cli, spawn_cli, wait_until

from leasehold import LockClient
from leasehold.backends.sqlite import SQLiteLockService

LOOP = "while :; do sleep 0.05; done"


def wait_pid_file(path):
    """The pid COMMAND wrote to ``path`` (waits until the file is complete, not just created)."""
    return int(wait_until(lambda: path.exists() and path.read_text().endswith("\n") and path.read_text().strip(),
                          what=f"{path.name} written"))


def _waiting(proc, db):
    """Wait until ``leasehold run -v`` (``proc``) is trying to take its lock: it has said so,
    and its client has the lock file open (it opens it for its first request; the check of
    the file when the backend opened used a connection of its own, closed by then)."""
    assert proc.stderr is not None
    while "waiting for lock" not in (line := proc.stderr.readline()):
        assert line, "leasehold exited before waiting"

    def has_db_open():
        fds = f"/proc/{proc.pid}/fd"
        for fd in os.listdir(fds):
            try:
                if os.readlink(f"{fds}/{fd}") == str(db):
                    return True
            except OSError:
                pass
        return False

    wait_until(has_db_open, what="the waiter's first request")


def test_two_runs_serialize_and_fencing_tokens_increase(env, db, backend, tmp_path):
    log, gate = tmp_path / "log", tmp_path / "gate"
    a = spawn_cli(
        ["run", *backend, "shared", "--", "sh", "-c",
         f'echo "A start $LEASEHOLD_FENCING_TOKEN" >> {log}; '
         f'while [ ! -e {gate} ]; do sleep 0.05; done; echo "A end" >> {log}'],
        env,
    )
    b = None
    try:
        wait_until(lambda: log.exists() and "A start" in log.read_text(), what="A running")
        b = spawn_cli(
            ["run", "-v", *backend, "shared", "--", "sh", "-c",
             f'echo "B start $LEASEHOLD_FENCING_TOKEN" >> {log}; echo "B end" >> {log}'],
            env,
        )
        _waiting(b, db)  # B is trying while A holds the lock
        assert "B" not in log.read_text()
        gate.touch()
        rc_a, _, err_a = finish(a)
        rc_b, _, err_b = finish(b)
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
    assert rc_a == 0, err_a
    assert rc_b == 0, err_b
    lines = [line.split() for line in log.read_text().splitlines()]
    assert [line[:2] for line in lines] == [["A", "start"], ["A", "end"], ["B", "start"], ["B", "end"]]
    assert int(lines[0][2]) < int(lines[2][2])
    assert db_rows(db, "SELECT count(*) FROM leasehold_locks") == [(0,)]


def test_wait_timeout_is_75_and_the_command_never_runs(env, db, backend, tmp_path):
    marker = tmp_path / "ran"
    svc = SQLiteLockService(db)
    with LockClient(SQLiteLockService(db)) as holder:
        fence = holder.acquire("busy", ttl=600).fencing_token
        res = run_cli(["run", *backend, "--wait", "0.5", "busy", "--", "touch", str(marker)], env)
        assert res.returncode == 75, res.stderr
        assert "not acquired" in res.stderr
        res = run_cli(["run", *backend, "--wait", "0", "busy", "--", "touch", str(marker)], env)
        assert res.returncode == 75, res.stderr
        assert not marker.exists()
        assert svc.status("busy").fencing_token == fence  # the holder still holds


def test_lock_is_renewed_across_many_ttls(env, db, backend, tmp_path):
    gate = tmp_path / "gate"
    p = spawn_cli(
        ["run", *backend, "--ttl", "3", "long", "--", "sh", "-c",
         f"while [ ! -e {gate} ]; do sleep 0.05; done"],
        env,
    )
    try:
        wait_until(lambda: len(db_rows(db, "SELECT fence FROM leasehold_locks WHERE name='long'")) == 1)
        svc = SQLiteLockService(db)
        try:
            # Several TTLs later the lock is still the same grant (renewed, never re-acquired).
            first = svc.status("long")

            def expiry():
                rows = db_rows(db, "SELECT expiry_ns FROM leasehold_locks WHERE name='long'")
                return rows[0][0] if rows else None

            seen = [expiry()]
            for _ in range(4):  # renewals every ~1 s: 4 of them span more than one TTL
                wait_until(lambda: expiry() not in seen, what="a renewal")
                seen.append(expiry())
            assert None not in seen and seen == sorted(seen)  # each renewal moved the expiry on
            st = svc.status("long")
            assert st.held and st.fencing_token == first.fencing_token
            res = run_cli(["run", *backend, "--wait", "0", "long", "--", "true"], env)
            assert res.returncode == 75
        finally:
            svc.close()
        gate.touch()
        rc, _, err = finish(p)
        assert rc == 0, err
    finally:
        if p.poll() is None:
            p.kill()


def _steal(db, name):
    assert db_exec(db, "UPDATE leasehold_locks SET token='stolen-by-test' WHERE name=?", name) == 1


def test_loss_sends_sigterm_and_exits_76(env, db, backend, tmp_path):
    started, term = tmp_path / "started", tmp_path / "term"
    cmd = f'trap "echo TERM > {term}; exit 5" TERM; echo $$ > {started}; {LOOP}'
    p = spawn_cli(["run", *backend, "--ttl", "1", "--grace", "60", "victim", "--", "sh", "-c", cmd], env)
    try:
        wait_pid_file(started)
        _steal(db, "victim")  # the next renewal is rejected: the lock is lost
        rc, _, err = finish(p)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 76, err
    assert term.read_text().strip() == "TERM"
    assert "lost" in err
    # The thief's row is untouched: the losing CLI's release could not delete it.
    assert db_rows(db, "SELECT token FROM leasehold_locks WHERE name='victim'") == [("stolen-by-test",)]


def test_loss_escalates_to_sigkill_of_the_whole_group(env, db, backend, tmp_path):
    started, grand = tmp_path / "started", tmp_path / "grandchild"
    # The command and its child ignore SIGTERM; only SIGKILL after --grace stops them.
    cmd = f'trap "" TERM; sleep 1000 & echo $! > {grand}; echo $$ > {started}; {LOOP}'
    p = spawn_cli(["run", *backend, "--ttl", "1", "--grace", "0.5", "stubborn", "--", "sh", "-c", cmd], env)
    try:
        child_pid = wait_pid_file(started)
        grand_pid = wait_pid_file(grand)
        _steal(db, "stubborn")
        rc, _, err = finish(p)
    finally:
        if p.poll() is None:
            p.kill()
        if started.exists() and started.read_text().strip():  # never leave TERM-proof strays
            try:
                os.killpg(int(started.read_text()), signal.SIGKILL)
            except OSError:
                pass
    assert rc == 76, err
    assert "SIGKILL" in err
    wait_until(lambda: not pid_alive(child_pid), what="command killed")
    wait_until(lambda: not pid_alive(grand_pid), what="grandchild killed")


def test_foreground_mode_signals_only_the_command(env, db, backend, tmp_path):
    started, term = tmp_path / "started", tmp_path / "term"
    cmd = f'trap "echo TERM > {term}; exit 5" TERM; echo $$ > {started}; {LOOP}'
    p = spawn_cli(
        ["run", *backend, "--foreground", "--ttl", "1", "--grace", "60", "fg", "--", "sh", "-c", cmd], env
    )
    try:
        wait_pid_file(started)
        assert os.getpgid(int(started.read_text())) == os.getpgid(p.pid)  # same process group
        _steal(db, "fg")
        rc, _, err = finish(p)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 76, err
    assert term.read_text().strip() == "TERM"


@pytest.mark.parametrize(
    ("sig", "trap", "code"),
    [(signal.SIGTERM, "TERM", 7), (signal.SIGINT, "INT", 9), (signal.SIGHUP, "HUP", 11)],
)
def test_signals_are_forwarded_and_the_lock_released(env, db, backend, tmp_path, sig, trap, code):
    started, got = tmp_path / "started", tmp_path / "got"
    cmd = (
        f'trap "echo USR1 >> {got}" USR1; trap "echo {trap} >> {got}; exit {code}" {trap}; '
        f"echo $$ > {started}; {LOOP}"
    )
    p = spawn_cli(["run", *backend, "fwd", "--", "sh", "-c", cmd], env)
    try:
        wait_pid_file(started)
        assert os.getpgid(int(started.read_text())) != os.getpgid(p.pid)  # its own group
        p.send_signal(signal.SIGUSR1)
        wait_until(lambda: got.exists() and "USR1" in got.read_text(), what="USR1 forwarded")
        assert p.poll() is None  # the CLI kept running
        p.send_signal(sig)
        rc, _, err = finish(p)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == code, err
    assert got.read_text().split() == ["USR1", trap]
    assert db_rows(db, "SELECT count(*) FROM leasehold_locks") == [(0,)]  # released


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_while_waiting_cancels_with_128_plus_n(env, db, backend, tmp_path, sig):
    marker = tmp_path / "ran"
    svc = SQLiteLockService(db)
    with LockClient(SQLiteLockService(db)) as holder:
        fence = holder.acquire("busy", ttl=600).fencing_token
        p = spawn_cli(["run", "-v", *backend, "busy", "--", "touch", str(marker)], env)
        try:
            _waiting(p, db)
            p.send_signal(sig)
            rc, _, err = finish(p)
        finally:
            if p.poll() is None:
                p.kill()
        assert rc == -int(sig), err  # died of the same signal after cleaning up (shell: 128+N)
        assert not marker.exists()
        st = svc.status("busy")
        assert st.held and st.fencing_token == fence  # untouched
        assert db_rows(db, "SELECT max(fence) FROM leasehold_fences") == [(fence,)]  # it minted nothing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
def test_cli_killed_command_gets_sigterm_and_lock_frees_after_ttl(env, db, backend, tmp_path):
    started, term = tmp_path / "started", tmp_path / "term"
    cmd = f'trap "echo TERM > {term}; exit 0" TERM; echo $$ > {started}; {LOOP}'
    p = spawn_cli(["run", *backend, "--ttl", "2", "orphan", "--", "sh", "-c", cmd], env)
    try:
        wait_pid_file(started)
        p.send_signal(signal.SIGKILL)
        p.wait(BOUND)
    finally:
        if p.poll() is None:
            p.kill()
    wait_until(term.exists, what="parent-death SIGTERM")
    svc = SQLiteLockService(db)
    try:
        first = svc.status("orphan").last_fencing_token
        assert first is not None  # nobody released it...
        wait_until(lambda: not svc.status("orphan").held, what="TTL expiry")  # ...it expires
    finally:
        svc.close()
    res = run_cli(["run", *backend, "--wait", "0", "orphan", "--", "sh", "-c", 'echo "$LEASEHOLD_FENCING_TOKEN"'], env)
    assert res.returncode == 0, res.stderr
    assert int(res.stdout) > first


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_forwarded_sigterm_reaches_a_stopped_command(env, db, backend, tmp_path):
    started = tmp_path / "started"
    p = spawn_cli(["run", *backend, "stopped", "--", "sh", "-c", f"echo $$ > {started}; kill -STOP $$; exit 0"], env)
    try:
        pid = wait_pid_file(started)
        wait_until(lambda: open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T", what="stopped")
        p.send_signal(signal.SIGTERM)
        rc, _, err = finish(p)  # without a SIGCONT after the SIGTERM this would hang
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == -int(signal.SIGTERM), err  # COMMAND died of SIGTERM, and so does leasehold
    assert db_rows(db, "SELECT count(*) FROM leasehold_locks") == [(0,)]


def test_deleting_the_database_loses_the_lock(env, db, backend, tmp_path):
    started, term = tmp_path / "started", tmp_path / "term"
    cmd = f'trap "echo TERM > {term}; exit 5" TERM; echo $$ > {started}; {LOOP}'
    p = spawn_cli(["run", *backend, "--ttl", "1", "--grace", "60", "gone", "--", "sh", "-c", cmd], env)
    try:
        wait_pid_file(started)
        for suffix in ("", "-wal", "-shm"):
            (tmp_path / (db.name + suffix)).unlink(missing_ok=True)
        rc, _, err = finish(p)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 76, err
    assert term.read_text().strip() == "TERM"
