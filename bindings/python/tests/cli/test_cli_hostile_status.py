"""A holder's fields are whatever was written into the lock service: a host name planted with
terminal escape sequences in a real SQLite lock file reaches ``leasehold status`` (text and
JSON) and the waiting status line escaped, never raw."""

from __future__ import annotations

import json
import sys

import pytest
from cli_helpers import db_exec, db_rows, finish, run_cli, spawn_cli, wait_until

# Set the window title, clear the screen, a C1 CSI, DEL, a bidi override, a newline.
EVIL = "evil\x1b]0;pwned\x07\x1b[2J\x9b31m\x7fhost\u202edrow\nnext"
RAW = ("\x1b", "\x07", "\x9b", "\x7f", "\u202e", "\n")


@pytest.fixture
def planted(env, db, backend, tmp_path):
    """NAME 'job' held by a running ``leasehold run``, its holder row's host replaced by EVIL."""
    started, gate = tmp_path / "started", tmp_path / "gate"
    holder = spawn_cli(
        ["run", *backend, "job", "--", "sh", "-c", f"touch {started}; while [ ! -e {gate} ]; do sleep 0.05; done"],
        env,
    )
    try:
        wait_until(started.exists, what="holder running")
        assert db_exec(db, "UPDATE leasehold_holders SET host=? WHERE name='job'", EVIL) == 1
        assert db_rows(db, "SELECT host FROM leasehold_holders WHERE name='job'") == [(EVIL,)]
        yield holder
    finally:
        gate.touch()
        rc, _, err = finish(holder)
        assert rc == 0, err


def test_status_text_escapes_the_planted_host(env, backend, planted) -> None:
    res = run_cli(["status", "job", *backend], env)
    assert res.returncode == 0, res.stderr
    line = res.stdout.rstrip("\n")
    assert not any(c in line for c in RAW), repr(line)
    assert "on evil\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\x7fhost\\u202edrow\\x0anext" in line, line
    assert line.startswith("job: held, fencing token ")


def test_status_json_escapes_the_planted_host_and_keeps_its_value(env, backend, planted) -> None:
    res = run_cli(["status", "job", *backend, "--json"], env)
    assert res.returncode == 0, res.stderr
    assert not any(c in res.stdout.rstrip("\n") for c in RAW), repr(res.stdout)
    assert res.stdout.isascii()
    assert json.loads(res.stdout)["holder_host"] == EVIL  # escaped on the wire, intact when parsed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pty checked on Linux")
def test_waiting_status_line_escapes_the_planted_host(env, backend, planted) -> None:
    from test_cli_tty import Terminal

    term = Terminal(["run", *backend, "--wait", "1.5", "job", "--", "true"], env)
    try:
        term.read_until(b"unless renewed; giving up in ")
        status = term.wait()
    finally:
        term.close()
    out = term.output
    assert b"held by pid " in out and b"on evil\\x1b]0;pwned\\x07" in out, out
    for raw in (b"\x1b]", b"\x07", b"\x1b[2J", "\x9b".encode(), b"\x7f", "\u202e".encode()):
        assert raw not in out, (raw, out)
    assert status != 0  # not acquired within --wait: the holder kept it
