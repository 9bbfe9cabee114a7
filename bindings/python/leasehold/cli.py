"""The ``leasehold`` command line: run a command while holding a lock, or inspect a lock.

``leasehold run NAME [options] -- COMMAND [ARG...]`` works like ``flock(1)`` or
``etcdctl lock``, with lease renewal and fencing, and takes flock's options where they fit
(``-n``, ``-w SECONDS``, ``-E CODE``, ``-c "shell command"``): see ``leasehold run --help`` and
``bindings/python/CLI.md``. ``leasehold status NAME`` prints whether a lock is held and by whom.

Process model of ``run``: the CLI's main thread only supervises. It waits for the lock on a
helper thread (so signals are handled while waiting), then starts COMMAND and waits for one
of: COMMAND exited, a signal arrived (forwarded to COMMAND), the lock was lost (COMMAND gets
SIGTERM, then SIGKILL after the grace period). The lock is renewed by the
:class:`~leasehold.client.LockClient` driver meanwhile and released when COMMAND exits.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from ._cli_backends import (
    BackendError,
    UsageError,
    backend_url,
    child_environment,
    etcd_url,
    open_backend,
    read_backend_file,
    safe_text,
)
from ._cli_proc import (
    EX_NOT_EXECUTABLE,
    EX_NOT_FOUND,
    _Child,
    _exit_status,
    _spawn,
    _tty_foreground,
    _Wakeup,
    resolve_command,
)
from ._status_render import WaitStatusLine, cmd_status, describe_holder
from ._urls import redact, scrub

__all__ = ["main", "open_backend", "EXIT_CODES"]
# Also importable from here, as before the CLI was split into modules.
_WaitStatusLine = WaitStatusLine
_REEXPORTED = (etcd_url, read_backend_file, describe_holder, resolve_command)

log = logging.getLogger("leasehold.cli")

# Exit codes (sysexits.h where one fits). Documented in --help and CLI.md.
EX_OK = 0
EX_FREE = 1  # status: the lock is not held
EX_USAGE = 64  # bad arguments
EX_UNAVAILABLE = 69  # the backend cannot be opened or keeps failing
EX_SOFTWARE = 70  # internal error (a bug)
EX_NOT_ACQUIRED = 75  # not acquired within --wait (EX_TEMPFAIL)
EX_LOST = 76  # the lock was lost while COMMAND ran

EXIT_CODES = {
    "child": "COMMAND's own exit status (128+N if COMMAND was killed by signal N)",
    EX_USAGE: "usage error (bad option, bad NAME, bad --ttl/--wait/--grace, bad --backend URL)",
    EX_UNAVAILABLE: "backend unavailable (cannot open or write the database, server unreachable)",
    EX_SOFTWARE: "internal error",
    EX_NOT_ACQUIRED: "the lock was not acquired within --wait (or at once with -n); COMMAND was not started (-E sets this code)",
    EX_LOST: "the lock was lost while COMMAND ran; COMMAND got SIGTERM (then SIGKILL after --grace)",
    EX_NOT_EXECUTABLE: "COMMAND was found but could not be executed",
    EX_NOT_FOUND: "COMMAND was not found",
}

DEFAULT_TTL = 30.0
DEFAULT_GRACE = 10.0
SHELL = "/bin/sh"  # runs -c COMMAND (a fixed shell, as scripts expect, whatever the user's $SHELL)
_WAIT_CHUNK = 60.0  # an infinite --wait is a loop of bounded acquires (a broken backend shows up)
_FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
_TTY_SIGNALS = ("SIGINT", "SIGQUIT")
# Signals whose default action ends the process without a core dump: when COMMAND died of
# one of them, leasehold re-raises it on itself (so `for ...; do leasehold run ...; done` stops
# on Ctrl-C like it would without leasehold). Others (SIGQUIT, SIGSEGV, ...) give exit 128+N.
_RERAISE = {
    int(getattr(signal, n))
    for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGKILL", "SIGPIPE", "SIGALRM", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, n)
}
_TTY_STOPS = {int(getattr(signal, n)) for n in ("SIGTTIN", "SIGTTOU") if hasattr(signal, n)}

_RUN_VALUE_OPTS = {
    "--backend", "-b", "--backend-file", "--ttl", "-t", "--wait", "-w", "--grace", "-g",
    "--conflict-exit-code", "-E", "--command", "-c", "--fail-budget",
}

_EXIT_TEXT = """\
exit status:
  COMMAND's own   COMMAND ran; its exit status. If it was killed by signal N,
                  leasehold ends with the same signal (a shell shows 128+N), like
                  timeout(1); for core-dumping signals it exits 128+N instead
  64              usage error (bad option, NAME, duration or --backend URL)
  69              backend unavailable (cannot open/write the database, server down)
  75              not acquired within --wait (at once with -n); COMMAND was not
                  started. -E CODE replaces 75 with CODE
  76              the lock was lost while COMMAND ran (COMMAND got SIGTERM, then
                  SIGKILL after --grace); wins over COMMAND's own status
  126 / 127       COMMAND could not be executed / was not found (lock not taken)
  128+N           leasehold got signal N while waiting for the lock: it cleans up
                  and ends with that signal; COMMAND was not started
"""

_BACKEND_TEXT = """\
backends (--backend URL or --backend-file PATH, default $LEASEHOLD_BACKEND or the file
$LEASEHOLD_BACKEND_FILE names, else the SQLite file below; a password given with --backend is
visible to other local users in ps: prefer the file, mode 600, or the variable):
  sqlite:///ABS/PATH   a SQLite file shared by the processes of one host
  sqlite:REL/PATH      the same, relative to the working directory
  sqlite://            the default file: $XDG_CACHE_HOME/leasehold/locks.sqlite3
                       (~/.cache/leasehold/locks.sqlite3 when XDG_CACHE_HOME is unset)
  redis://[:PASSWORD@]HOST[:PORT][/DB], rediss://..., unix:///PATH.sock[?db=N]
                       a Redis server (rediss:// takes ?ssl_ca_certs=PEM and redis-py's
                       other ssl_* settings)
  redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER[/DB]
                       the master that these Redis Sentinels name MASTER, followed across
                       failovers (PASSWORD and DB are the Redis servers')
  postgresql://USER:PASSWORD@HOST[:PORT]/DB[?sslmode=verify-full], postgres://...
                       a PostgreSQL database (needs psycopg 3: pip install 'leasehold[postgres]')
  etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...], etcds://... (TLS)
                       an etcd v3 cluster, any of its members; etcd:// with a user or
                       password needs ?insecure_auth=1 (they would cross in clear text)
  redis+cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]
                       a Redis Cluster (7+), from any of these nodes: commands routed by
                       slot, wake-ups on sharded pub/sub, failovers followed
  memory://            in-process only: no other process sees the lock (for tests)
"""

_RUN_DESCRIPTION = """\
Run COMMAND while holding the lock NAME, like flock(1) or etcdctl lock, but with a lease:
the lock is renewed every TTL/3 while COMMAND runs and released when it exits. If it is
lost (renewal refused, backend unreachable until the lease ran out, too many failed
renewals in a row, process paused past the TTL), COMMAND gets SIGTERM, then SIGKILL after
--grace seconds. -c runs a shell command line instead of COMMAND (/bin/sh -c).

While waiting on a terminal, a status line on stderr names the holder (its pid and host
where the backend records them), when its lease runs out unless renewed, and when the wait
gives up; it is cleared once the lock is taken.

COMMAND's environment is leasehold's without LEASEHOLD_BACKEND, LEASEHOLD_BACKEND_FILE and
any variable holding the backend URL or its password, plus:
  LEASEHOLD_LOCK_NAME       NAME
  LEASEHOLD_FENCING_TOKEN   the fencing token of this grant (a decimal integer that
                            strictly increases with every grant of NAME): pass it to the
                            resource you protect and let it reject tokens lower than the
                            highest it has seen; that, not the lock, is what keeps a
                            paused or partitioned holder from doing harm.

Signals: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to leasehold are
forwarded to COMMAND; the lock is released when COMMAND exits. While waiting for the
lock they cancel the wait (leasehold ends with that signal). COMMAND runs in its own process group, and
forwarded signals and the loss signals go to that whole group; with --foreground
COMMAND stays in leasehold's process group (so it can use the terminal), only COMMAND
itself is signalled, and SIGINT/SIGQUIT typed at the terminal reach it directly (they
are not forwarded a second time). On Linux COMMAND also gets SIGTERM if leasehold
itself dies (parent-death signal).
"""

_STATUS_EXIT_TEXT = """\
status's exit status:
  0   NAME is held
  1   NAME is free
  64  usage error
  69  backend unavailable (or it cannot report status)
"""

_RUN_EPILOG = (
    _EXIT_TEXT
    + "\n"
    + _BACKEND_TEXT
    + """
examples:
  leasehold run nightly-backup -- ./backup.sh
  leasehold run -n cron-job -- ./job.sh                # give up at once if held (exit 75)
  leasehold run -n -E 0 cron-job -c './job.sh && ./report.sh'   # busy: exit 0
  leasehold run -w 30 deploy -- make deploy            # wait at most 30 s
  leasehold run --ttl 10 --grace 5 deploy -- make deploy
  leasehold run jobs --backend redis://localhost:6379/0 -- sh -c 'echo "$LEASEHOLD_FENCING_TOKEN"'
"""
)


class DieBySignal(Exception):
    """Leave the way a shell expects: killed by this signal (after cleaning up)."""

    def __init__(self, sig: int) -> None:
        super().__init__(sig)
        self.sig = sig


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EX_USAGE, f"{self.prog}: error: {message}\n")


# ---------------------------------------------------------------------- argument parsing


def _duration(what: str, *, allow_inf: bool = False, positive: bool = False) -> Any:
    def parse(text: str) -> float:
        t = text.strip().lower()
        if allow_inf and t in ("inf", "infinity", "forever", "none"):
            return math.inf
        if t.endswith("s"):  # "2.5s" reads like "2.5"
            t = t[:-1]
        try:
            v = float(t)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a number of seconds, got {text!r}") from None
        if math.isnan(v) or math.isinf(v) or v < 0 or (positive and v == 0):
            bound = "> 0" if positive else ">= 0"
            raise argparse.ArgumentTypeError(f"{what} must be a finite number of seconds {bound}, got {text!r}")
        return v

    parse.__name__ = what
    return parse


def _exit_code(text: str) -> int:
    try:
        v = int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"-E must be an exit status 0-255, got {text!r}") from None
    if not 0 <= v <= 255:
        raise argparse.ArgumentTypeError(f"-E must be an exit status 0-255, got {text!r}")
    return v


def _fail_budget(text: str) -> int:
    try:
        v = int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--fail-budget must be a whole number >= 0, got {text!r}") from None
    if not 0 <= v <= 2**32 - 1:
        raise argparse.ArgumentTypeError(f"--fail-budget must be in 0..{2**32 - 1}, got {text!r}")
    return v


def _add_backend(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-b", "--backend", metavar="URL", default=None,
        help="lock service URL (default: $LEASEHOLD_BACKEND, else the file $LEASEHOLD_BACKEND_FILE names, "
        "else the SQLite file in the cache directory). A password given here is visible to other local "
        "users (ps, /proc/PID/cmdline): use --backend-file or $LEASEHOLD_BACKEND for one",
    )
    p.add_argument(
        "--backend-file", metavar="PATH", default=None,
        help="read the lock service URL from the first line of PATH (keep it mode 600: leasehold warns "
        "when group or others can access it)",
    )


def build_parser() -> _Parser:
    top = _Parser(
        prog="leasehold",
        description="Distributed locks with renewal, loss detection and fencing tokens.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run 'leasehold run --help' or 'leasehold status --help' for details.\n\n"
        + "run's " + _EXIT_TEXT + "\n" + _STATUS_EXIT_TEXT + "\n" + _BACKEND_TEXT,
    )
    top.add_argument("--version", action="version", version=f"leasehold {_version()}")
    sub = top.add_subparsers(dest="cmd", metavar="{run,status}")
    sub.required = True

    run = sub.add_parser(
        "run",
        help="run a command while holding a lock",
        usage="leasehold run [-h] [-b URL | --backend-file PATH] [-t S] [-w S | -n] [-E CODE] [-g S] [--fail-budget N] [--foreground] [-v]\n"
        "                     NAME {[--] COMMAND [ARG ...] | -c 'SHELL COMMAND'}",
        description=_RUN_DESCRIPTION,
        epilog=_RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("name", metavar="NAME", help="the lock name (non-empty UTF-8, at most 512 bytes)")
    _add_backend(run)
    run.add_argument(
        "-t", "--ttl", metavar="S", type=_duration("--ttl", positive=True), default=DEFAULT_TTL,
        help=f"lease TTL in seconds, renewed every TTL/3 (default {DEFAULT_TTL:g}); if leasehold "
        "dies without releasing, the lock frees after at most this long",
    )
    waiting = run.add_mutually_exclusive_group()
    waiting.add_argument(
        "-w", "--wait", metavar="S", type=_duration("--wait", allow_inf=True), default=math.inf,
        help="give up if the lock is not acquired within S seconds (exit 75); 0 = one attempt; "
        "default: wait forever (like flock)",
    )
    waiting.add_argument(
        "-n", "--nonblock", action="store_true",
        help="do not wait: give up at once (exit 75) if someone else holds the lock (= --wait 0)",
    )
    run.add_argument(
        "-E", "--conflict-exit-code", metavar="CODE", type=_exit_code, default=EX_NOT_ACQUIRED,
        help=f"exit status when the lock was not acquired within --wait or -n (0-255, default {EX_NOT_ACQUIRED})",
    )
    run.add_argument(
        "-c", "--command", metavar="'SHELL COMMAND'", dest="shell_command", default=None,
        help=f"run this command line with {SHELL} -c instead of COMMAND [ARG...]",
    )
    run.add_argument(
        "--fail-budget", metavar="N", type=_fail_budget, default=None,
        help="the renewal failure budget (the core's fail_budget): 0, the default, retries renewals "
        "failing in transit while the lease is valid and loses the lock only just before its validity "
        "ends; N > 0 loses it after N renewals in a row failed in transit. A refused renewal loses it anyway",
    )
    run.add_argument(
        "-g", "--grace", metavar="S", type=_duration("--grace"), default=DEFAULT_GRACE,
        help=f"seconds between SIGTERM and SIGKILL when the lock is lost (default {DEFAULT_GRACE:g})",
    )
    run.add_argument(
        "--foreground", action="store_true",
        help="keep COMMAND in leasehold's process group (interactive commands that use the "
        "terminal); only COMMAND itself is signalled, not its children",
    )
    run.add_argument("-v", "--verbose", action="store_true", help="report acquire, release and renewal trouble on stderr")

    st = sub.add_parser(
        "status",
        help="show whether a lock is held",
        description="Show whether NAME is held, its fencing token and remaining TTL, and the "
        "holder's pid, host and how long it has held the lock where the backend records them "
        "(SQLite), read directly from the backend (advisory: it can change right after).",
        epilog=_STATUS_EXIT_TEXT.replace("status's exit status", "exit status") + "\n" + _BACKEND_TEXT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    st.add_argument("name", metavar="NAME", help="the lock name")
    _add_backend(st)
    st.add_argument("--json", action="store_true", help="print one JSON object instead of a sentence")
    return top


def split_run_argv(tokens: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split ``run``'s arguments into (options + NAME, COMMAND).

    ``--`` ends the options; without it COMMAND starts at the first argument after NAME that
    is not an option of ``run`` (so ``leasehold run NAME ls -l`` works like flock).
    """
    opts: list[str] = []
    seen_name = False
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "--":
            return opts, list(tokens[i + 1 :])
        if tok.startswith("-") and tok != "-":
            opts.append(tok)
            if tok in _RUN_VALUE_OPTS and i + 1 < len(tokens):
                opts.append(tokens[i + 1])
                i += 1
            i += 1
            continue
        if not seen_name:
            opts.append(tok)
            seen_name = True
            i += 1
            continue
        return opts, list(tokens[i:])
    return opts, []


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("leasehold")
    except Exception:
        return "0.1.0"


# ---------------------------------------------------------------------- run


def _acquire(client: Any, name: str, ttl: float, wait: float, on_lost: Any) -> Any:
    """Acquire within ``wait`` seconds (may be infinite) as a loop of bounded acquires, so a
    backend that keeps failing is reported (BackendUnavailable) instead of waited on forever."""
    from .errors import BackendUnavailable, LockTimeout

    deadline = time.monotonic() + wait
    while True:
        chunk = min(max(deadline - time.monotonic(), 0.0), _WAIT_CHUNK)
        try:
            return client.acquire(name, ttl, wait=chunk, on_lost=on_lost)
        except BackendUnavailable:
            raise
        except LockTimeout:
            if deadline - time.monotonic() <= 0:
                raise


def cmd_run(args: argparse.Namespace, command: list[str]) -> int:
    if args.shell_command is not None:
        if command:
            raise UsageError("-c takes the whole command line: give either -c 'SHELL COMMAND' or COMMAND [ARG...]")
        command = [SHELL, "-c", args.shell_command]
    if not command:
        raise UsageError("missing COMMAND (leasehold run NAME -- COMMAND [ARG...], or -c 'SHELL COMMAND')")
    if args.nonblock:
        args.wait = 0.0
    name: str = args.name
    if not name:
        raise UsageError("NAME must not be empty")
    if "\0" in name or len(name.encode("utf-8", "surrogateescape")) > 512:
        raise UsageError("NAME must be at most 512 bytes of UTF-8 without NUL")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError("NAME is not valid UTF-8") from None
    url = backend_url(args.backend, args.backend_file)
    verbose = args.verbose

    env = child_environment(dict(os.environ), url)  # COMMAND gets the lock, not the credentials
    path = resolve_command(command, env)  # before taking the lock: fail fast, hold nothing

    # Signals first: a SIGINT while the backend opens or while waiting must cancel cleanly.
    wake = _Wakeup(_FORWARDED)
    try:
        service = open_backend(url)
        try:
            from .client import LockClient
        except ImportError as e:  # the native library is missing
            service.close()
            raise BackendError(f"cannot load the leasehold library: {e}") from None
        config = None
        if args.fail_budget is not None:
            from ._core import Config

            config = Config(fail_budget=args.fail_budget)
        client = LockClient(service, config=config, owns_service=True)
        try:
            return _run_locked(client, service, wake, args, name, command, path, env, url, verbose)
        finally:
            client.close()
    finally:
        wake.close()


def _run_locked(
    client: Any, service: Any, wake: _Wakeup, args: argparse.Namespace, name: str, command: list[str],
    path: str, env: dict[str, str], url: str, verbose: bool,
) -> int:
    from .errors import BackendUnavailable, ClientClosed, LockTimeout

    lost = threading.Event()
    lost_reason: list[str] = []

    def on_lost(handle: Any) -> None:
        lost_reason.append(str(getattr(handle, "lost_reason", None) or "lost"))
        lost.set()
        wake.poke()

    # ---- wait for the lock on a helper thread; the main thread keeps handling signals
    box: dict[str, Any] = {}
    done = threading.Event()

    def acquirer() -> None:
        try:
            box["handle"] = _acquire(client, name, args.ttl, args.wait, on_lost)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            box["error"] = e
        finally:
            done.set()  # before the poke: the main loop tests `done`, never the thread's liveness
            wake.poke()

    if verbose:
        _note(f"waiting for lock {name!r} on {redact(url)}")
    t = threading.Thread(target=acquirer, name="leasehold-cli-acquire", daemon=True)
    t.start()
    status_line = WaitStatusLine.start(service, name, args.wait, done)
    try:
        while not done.is_set():
            if wake.pending:
                sig = wake.pending.popleft()
                if status_line is not None:
                    status_line.stop()
                if verbose:
                    _note(f"{_signame(sig)} while waiting for {name!r}: giving up")
                client.close()  # cancels the pending acquire (or releases a grant that just came)
                t.join(10)
                raise DieBySignal(sig)
            wake.wait(1.0)
    finally:
        if status_line is not None:
            status_line.stop()
    if "error" in box:
        e = box["error"]
        if isinstance(e, BackendUnavailable):
            raise BackendError(f"lock {name!r}: backend {redact(url)} unavailable: {scrub(e, url)}")
        if isinstance(e, LockTimeout):
            if args.nonblock:
                _note(f"lock {name!r} is held by someone else")
            else:
                _note(f"lock {name!r} not acquired within {args.wait:g}s")
            return int(args.conflict_exit_code)
        if isinstance(e, ClientClosed):
            raise BackendError(f"lock client closed while acquiring {name!r}")
        if isinstance(e, (TypeError, ValueError)):
            raise UsageError(str(e))
        raise e
    handle = box["handle"]
    if wake.pending:  # a signal came while the grant was arriving: start nothing
        sig = wake.pending.popleft()
        handle.release()
        raise DieBySignal(sig)
    token = handle.fencing_token
    if verbose:
        _note(f"acquired {name!r} (fencing token {token}, ttl {args.ttl:g}s)")

    # ---- run COMMAND
    env["LEASEHOLD_FENCING_TOKEN"] = str(token)
    env["LEASEHOLD_LOCK_NAME"] = name
    own_group = not args.foreground
    try:
        proc = _spawn(path, command, env, own_group)
    except OSError as e:
        handle.release()
        _note(f"cannot execute {command[0]}: {e.strerror or e}")
        return EX_NOT_FOUND if isinstance(e, FileNotFoundError) else EX_NOT_EXECUTABLE
    child = _Child(proc, own_group)
    term_at: float | None = None
    killed = False
    hinted = False
    signalled_tty = set(getattr(signal, n) for n in _TTY_SIGNALS if hasattr(signal, n))

    handle_lost = getattr(handle, "lost", None)
    while True:
        if handle_lost is not None and handle_lost.is_set():
            lost.set()  # belt and braces: on_lost normally said so already
        while wake.pending:
            sig = wake.pending.popleft()
            if not own_group and sig in signalled_tty and _tty_foreground():
                continue  # typed at the terminal: COMMAND, in our process group, got it too
            if verbose:
                _note(f"forwarding {_signame(sig)} to the command")
            child.signal(sig)
        if lost.is_set() and term_at is None and proc.poll() is None:
            reason = lost_reason[0] if lost_reason else "lost"
            _note(
                f"lost lock {name!r} ({reason}); sending SIGTERM to the command"
                + (f", SIGKILL in {args.grace:g}s" if args.grace > 0 else "")
            )
            term_at = time.monotonic()
            child.signal(signal.SIGTERM)
            if args.grace <= 0:
                child.signal(signal.SIGKILL)
                killed = True
        if term_at is not None and not killed and time.monotonic() >= term_at + args.grace:
            if proc.poll() is None or child.group_alive():
                _note(f"the command did not stop within {args.grace:g}s: SIGKILL")
                child.signal(signal.SIGKILL)
            killed = True
        rc = proc.poll()
        if rc is not None:
            if term_at is None or killed or not child.group_alive():
                break
        elif own_group and not hinted and child.stop_signal() in _TTY_STOPS:
            hinted = True  # it tried to use the terminal from its own (background) group
            _note("the command was stopped for using the terminal; use 'leasehold run --foreground' for interactive commands")
        if term_at is not None and not killed:
            timeout = max(0.0, term_at + args.grace - time.monotonic())
            timeout = min(timeout, 0.1 if rc is not None else timeout)
        else:
            timeout = 1.0
        wake.wait(timeout)

    was_lost = lost.is_set() or term_at is not None
    handle.release()
    code = EX_LOST if was_lost else _exit_status(proc.returncode)
    if verbose:
        what = "lost" if was_lost else "released"
        _note(f"{what} {name!r}; command exited with status {_exit_status(proc.returncode)}")
    if not was_lost and proc.returncode < 0 and -proc.returncode in _RERAISE:
        raise DieBySignal(-proc.returncode)  # like timeout(1): the caller sees the signal
    return code


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _note(msg: str) -> None:
    sys.stderr.write(f"leasehold: {safe_text(msg)}\n")
    sys.stderr.flush()


# ---------------------------------------------------------------------- main


class _ScrubLog(logging.Filter):
    """The library's log lines (a driver's error text among them) pass through
    :func:`safe_text` before they reach stderr, tracebacks included."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = safe_text(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = safe_text(logging.Formatter().formatException(record.exc_info)).replace("\\x0a", "\n")
        return True


def _die_by_signal(sig: int) -> int:
    """Kill this process with ``sig`` (default action); 128+sig if it survives that."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:
        signal.signal(sig, signal.SIG_DFL)
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        time.sleep(0.1)  # delivery to another thread still ends the process
    except (OSError, ValueError):
        pass
    return 128 + sig


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``leasehold`` console script and ``python -m leasehold``."""
    tokens = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    command: list[str] = []
    if tokens and tokens[0] == "run":
        opts, command = split_run_argv(tokens[1:])
        tokens = ["run", *opts]
    try:
        args = parser.parse_args(tokens)
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else EX_USAGE
    verbose = bool(getattr(args, "verbose", False))
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(message)s",
        stream=sys.stderr,
    )
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _ScrubLog) for f in handler.filters):
            handler.addFilter(_ScrubLog())
    try:
        if args.cmd == "run":
            return cmd_run(args, command)
        return cmd_status(args)
    except UsageError as e:
        sys.stderr.write(f"leasehold: error: {safe_text(e)}\n(see 'leasehold {args.cmd} --help')\n")
        return EX_USAGE
    except BackendError as e:
        sys.stderr.write(f"leasehold: {safe_text(e)}\n")
        return EX_UNAVAILABLE
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else EX_SOFTWARE
    except KeyboardInterrupt:
        return 128 + int(signal.SIGINT)
    except DieBySignal as d:  # as a program, die of it; called from Python, just say so
        return _die_by_signal(d.sig) if argv is None else 128 + d.sig
    except Exception as e:  # a bug: say so, with the traceback when asked for
        if verbose:
            log.exception("internal error")
        sys.stderr.write(f"leasehold: internal error: {type(e).__name__}: {safe_text(e)}\n")
        return EX_SOFTWARE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
