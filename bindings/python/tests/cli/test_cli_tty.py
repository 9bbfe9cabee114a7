"""`leasehold run` on a terminal (a pseudo-terminal): job control and Ctrl-C."""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable

import pytest
from cli_helpers import BOUND, finish, spawn_cli, wait_until

pty = pytest.importorskip("pty")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pty job control checked on Linux")


class Terminal:
    """``leasehold ARGS`` as the session leader of a new pseudo-terminal."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # pragma: no cover - child
            try:
                os.execve(sys.executable, [sys.executable, "-m", "leasehold", *args], env)
            finally:
                os._exit(127)
        self.output = b""
        self.status: int | None = None

    def read_until(self, needle: bytes, bound: float = BOUND) -> None:
        self.read_until_true(lambda out: needle in out, repr(needle), bound)

    def read_until_true(self, pred: Callable[[bytes], bool], what: str, bound: float = BOUND) -> None:
        deadline = time.monotonic() + bound
        while not pred(self.output):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{what} not seen within {bound}s; output so far: {self.output!r}")
            r, _, _ = select.select([self.fd], [], [], min(left, 0.5))
            if r:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:  # EIO: the terminal's other side is gone
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"terminal closed before {what}; output: {self.output!r}")
                self.output += chunk

    def write(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait(self, bound: float = BOUND) -> int:
        def done() -> bool:
            try:  # keep draining so the child never blocks on a full terminal
                while select.select([self.fd], [], [], 0)[0]:
                    chunk = os.read(self.fd, 4096)
                    if not chunk:
                        break
                    self.output += chunk
            except OSError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = status
            return self.status is not None

        wait_until(done, bound=bound, what="leasehold exit")
        assert self.status is not None
        return self.status

    def close(self) -> None:
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except OSError:
                pass
        os.close(self.fd)


def test_interactive_command_without_foreground_gets_a_hint(env, backend, tmp_path):
    started = tmp_path / "started"
    term = Terminal(["run", *backend, "tty", "--", "sh", "-c", f"echo $$ > {started}; cat"], env)
    try:
        # cat reads the terminal from its own (background) process group: stopped by SIGTTIN.
        term.read_until(b"--foreground")
        os.kill(term.pid, signal.SIGTERM)  # forwarded to the stopped group, which is continued
        status = term.wait()
    finally:
        term.close()
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, (status, term.output)


COUNT_INTS = """
import signal, sys, time
n = [0]
signal.signal(signal.SIGINT, lambda *a: n.__setitem__(0, n[0] + 1))
print("ready", flush=True)
line = sys.stdin.readline()  # reading the terminal works: COMMAND is in the foreground group
print("read " + line.strip() + ", waiting for ctrl-c", flush=True)
while n[0] == 0:
    time.sleep(0.01)
time.sleep(1)  # room for a second, forwarded copy to arrive (it would be counted)
print("ints=%d" % n[0], flush=True)
"""


def test_foreground_ctrl_c_reaches_the_command_once(env, backend):
    term = Terminal(["run", *backend, "--foreground", "tty", "--", sys.executable, "-c", COUNT_INTS], env)
    try:
        term.read_until(b"ready")
        term.write(b"typed-line\n")
        term.read_until(b"read typed-line, waiting")
        term.write(b"\x03")  # Ctrl-C: SIGINT to the terminal's foreground group (leasehold + COMMAND)
        term.read_until(b"ints=")
        status = term.wait()
    finally:
        term.close()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (status, term.output)
    # The terminal delivered it; leasehold did not forward a second copy.
    assert b"ints=1" in term.output, term.output


WAIT_INT = """
import signal, time
n = [0]
signal.signal(signal.SIGINT, lambda *a: n.__setitem__(0, n[0] + 1))
print("ready", flush=True)
while n[0] == 0:
    time.sleep(0.01)
time.sleep(1)
print("ints=%d" % n[0], flush=True)
"""


def test_default_ctrl_c_is_forwarded_to_the_command_group_once(env, backend):
    # COMMAND is in its own process group: the terminal's SIGINT reaches only leasehold,
    # which forwards it.
    term = Terminal(["run", *backend, "tty", "--", sys.executable, "-c", WAIT_INT], env)
    try:
        term.read_until(b"ready")
        term.write(b"\x03")
        term.read_until(b"ints=")
        status = term.wait()
    finally:
        term.close()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (status, term.output)
    assert b"ints=1" in term.output, term.output


DRAW = b"\rleasehold: waiting for 'job'"


def test_waiting_shows_the_holder_in_place_and_erases_it_once_acquired(env, backend, tmp_path):
    started, gate = tmp_path / "started", tmp_path / "gate"
    holder = spawn_cli(
        ["run", *backend, "job", "--", "sh", "-c", f"touch {started}; while [ ! -e {gate} ]; do sleep 0.05; done"],
        env,
    )
    term = None
    try:
        wait_until(started.exists, what="holder running")
        term = Terminal(["run", *backend, "--wait", "60", "job", "--", "echo", "acquired-now"], env)
        term.read_until(f"held by pid {holder.pid} on {socket.gethostname()} for ".encode())
        term.read_until(b"unless renewed; giving up in ")
        # Redrawn in place: a carriage return and the whole line again, erased to its end.
        term.read_until_true(lambda out: out.count(DRAW) >= 2, "a second draw of the status line")
        assert b"\x1b[K" in term.output and b"\n" not in term.output, term.output
        gate.touch()
        term.read_until(b"acquired-now")
        status = term.wait()
        rc, _, err = finish(holder)
    finally:
        gate.touch()
        if term is not None:
            term.close()
        if holder.poll() is None:
            holder.kill()
    assert rc == 0, err
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (status, term.output)
    out = term.output
    last_draw = out.rindex(DRAW)
    erased = out.find(b"\r\x1b[K", last_draw + len(DRAW))
    assert last_draw < erased < out.index(b"acquired-now"), out
