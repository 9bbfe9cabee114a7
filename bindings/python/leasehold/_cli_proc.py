"""``leasehold run``'s processes: signals turned into a wake-up pipe, and COMMAND started in
its own process group with a parent-death signal (Linux), signalled as a job."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Sequence
from typing import Any, NoReturn

from ._cli_backends import safe_text

EX_NOT_EXECUTABLE = 126
EX_NOT_FOUND = 127
_ENDING = {int(getattr(signal, n)) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGKILL") if hasattr(signal, n)}


def _die(code: int, message: str) -> NoReturn:
    sys.stderr.write(f"leasehold: {safe_text(message)}\n")
    raise SystemExit(code)


class _Wakeup:
    """Signals and cross-thread wake-ups, turned into one readable pipe for ``select``.

    Python runs signal handlers on the main thread only; the C-level handler writes to the
    wake-up fd at once, so ``select`` returns even when the handler has not run yet.
    """

    def __init__(self, names: Sequence[str]) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(self.w, False)
        self.pending: deque[int] = deque()
        self._saved: dict[int, Any] = {}
        self._saved_fd = signal.set_wakeup_fd(self.w, warn_on_full_buffer=False)
        for n in names:
            sig = getattr(signal, n, None)
            if sig is None:
                continue
            if signal.getsignal(sig) == signal.SIG_IGN:
                continue  # ignored by whoever started us (nohup, background job): keep it so
            self._saved[sig] = signal.signal(sig, self._on_signal)
        if hasattr(signal, "SIGCHLD"):
            self._saved[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, self._on_child)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.pending.append(signum)

    def _on_child(self, signum: int, frame: Any) -> None:
        pass  # the wake-up fd already woke the loop

    def poke(self) -> None:
        """Wake the main loop (any thread)."""
        try:
            os.write(self.w, b"\0")
        except (BlockingIOError, OSError):
            pass

    def wait(self, timeout: float | None) -> None:
        try:
            select.select([self.r], [], [], timeout)
        except InterruptedError:  # pragma: no cover - PEP 475 retries
            pass
        try:
            while os.read(self.r, 512):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        for sig, old in self._saved.items():
            try:
                signal.signal(sig, old)
            except (TypeError, ValueError, OSError):
                pass
        signal.set_wakeup_fd(self._saved_fd)
        os.close(self.r)
        os.close(self.w)


def _tty_foreground() -> bool:
    """Is leasehold in the foreground process group of its terminal?"""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


# ---------------------------------------------------------------------- run: the child

# Started instead of COMMAND on Linux: sets the parent-death signal (so COMMAND gets SIGTERM if
# leasehold itself dies, e.g. SIGKILL or OOM), restores SIGPIPE/SIGXFSZ, then execs COMMAND
# (same pid). Tiny and isolated (-I -S) so it starts quickly.
_SHIM = r"""
import os, signal, sys
ppid, deathsig, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
argv = sys.argv[4:]
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, deathsig, 0, 0, 0)  # PR_SET_PDEATHSIG
except Exception:
    pass
if os.getppid() != ppid:
    os._exit(128 + deathsig)  # leasehold died before the death signal was armed
for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ"):
    if hasattr(signal, name):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
try:
    os.execv(path, argv)
except OSError as e:
    sys.stderr.write("leasehold: cannot execute %s: %s\n" % (argv[0], e.strerror or e))
    os._exit(127 if isinstance(e, FileNotFoundError) else 126)
"""


def resolve_command(argv: Sequence[str], env: dict[str, str]) -> str:
    """The executable COMMAND runs (PATH lookup like a shell); exits 127/126 if unusable."""
    cmd = argv[0]
    if "/" in cmd:
        if not os.path.exists(cmd):
            _die(EX_NOT_FOUND, f"{cmd}: no such file")
        if os.path.isdir(cmd) or not os.access(cmd, os.X_OK):
            _die(EX_NOT_EXECUTABLE, f"{cmd}: not executable")
        return cmd
    found = shutil.which(cmd, path=env.get("PATH", os.defpath))
    if found is None:
        _die(EX_NOT_FOUND, f"{cmd}: command not found")
    return found


def _spawn(path: str, argv: Sequence[str], env: dict[str, str], own_group: bool) -> subprocess.Popen[bytes]:
    kwargs: dict[str, Any] = {"env": env, "close_fds": True, "restore_signals": True}
    if own_group:
        kwargs["process_group"] = 0
    if sys.platform.startswith("linux") and sys.executable:
        shim = [sys.executable, "-I", "-S", "-c", _SHIM, str(os.getpid()), str(int(signal.SIGTERM)), path, *argv]
        return subprocess.Popen(shim, **kwargs)
    return subprocess.Popen(list(argv), executable=path, **kwargs)


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class _Child:
    def __init__(self, proc: subprocess.Popen[bytes], own_group: bool) -> None:
        self.proc = proc
        self.own_group = own_group

    def signal(self, sig: int) -> None:
        """Send ``sig`` to COMMAND (its group by default); a stopped COMMAND is continued
        after a signal meant to end it, as shells do for stopped jobs."""
        try:
            if self.own_group:
                os.killpg(self.proc.pid, sig)
            elif self.proc.returncode is None:
                self.proc.send_signal(sig)
            else:
                return
            if sig in _ENDING and sig != signal.SIGKILL and self.stop_signal() is not None:
                self.signal(signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass

    def stop_signal(self) -> int | None:
        """The signal that stopped COMMAND, if it is stopped now (without reaping it)."""
        if self.proc.returncode is not None or not hasattr(os, "waitid"):
            return None
        try:
            res = os.waitid(os.P_PID, self.proc.pid, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return None
        if res is None or res.si_code != os.CLD_STOPPED:
            return None
        return int(res.si_status)

    def group_alive(self) -> bool:
        if not self.own_group:
            return False
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True


