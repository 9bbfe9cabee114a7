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
import json
import logging
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

__all__ = ["main", "open_backend", "EXIT_CODES"]

log = logging.getLogger("leasehold.cli")

# Exit codes (sysexits.h where one fits). Documented in --help and CLI.md.
EX_OK = 0
EX_FREE = 1  # status: the lock is not held
EX_USAGE = 64  # bad arguments
EX_UNAVAILABLE = 69  # the backend cannot be opened or keeps failing
EX_SOFTWARE = 70  # internal error (a bug)
EX_NOT_ACQUIRED = 75  # not acquired within --wait (EX_TEMPFAIL)
EX_LOST = 76  # the lock was lost while COMMAND ran
EX_NOT_EXECUTABLE = 126
EX_NOT_FOUND = 127

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
_STATUS_EVERY = 0.5  # seconds between updates of the waiting status line on a terminal
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
_ENDING = {int(getattr(signal, n)) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGKILL") if hasattr(signal, n)}

_RUN_VALUE_OPTS = {
    "--backend", "-b", "--ttl", "-t", "--wait", "-w", "--grace", "-g",
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
backends (--backend URL, default $LEASEHOLD_BACKEND, else the SQLite file below):
  sqlite:///ABS/PATH   a SQLite file shared by the processes of one host
  sqlite:REL/PATH      the same, relative to the working directory
  sqlite://            the default file: $XDG_CACHE_HOME/leasehold/locks.sqlite3
                       (~/.cache/leasehold/locks.sqlite3 when XDG_CACHE_HOME is unset)
  redis://[:PASSWORD@]HOST[:PORT][/DB], rediss://..., unix:///PATH.sock
                       a Redis server (needs redis-py: pip install 'redis>=5')
  redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER[/DB]
                       the master that these Redis Sentinels name MASTER, followed across
                       failovers (PASSWORD and DB are the Redis servers')
  postgresql://USER:PASSWORD@HOST[:PORT]/DB[?sslmode=...], postgres://...
                       a PostgreSQL database (needs psycopg 3: pip install 'leasehold[postgres]')
  etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...], etcds://... (TLS)
                       an etcd v3 cluster, any of its members
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

COMMAND's environment gets:
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


class UsageError(Exception):
    """Bad command-line input (exit 64)."""


class BackendError(Exception):
    """The backend could not be opened or used (exit 69)."""


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
        help="lock service URL (default: $LEASEHOLD_BACKEND, else the SQLite file in the cache directory)",
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
        usage="leasehold run [-h] [-b URL] [-t S] [-w S | -n] [-E CODE] [-g S] [--fail-budget N] [--foreground] [-v]\n"
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


# ---------------------------------------------------------------------- backends


def redact(url: str) -> str:
    """The URL without its password (for messages)."""
    if url.lower().startswith(("etcd://", "etcds://")):
        scheme, rest = url.split("://", 1)
        if "@" in rest:
            user, _, hosts = rest.rpartition("@")
            if ":" in user:
                return f"{scheme}://{user.split(':', 1)[0]}:***@{hosts}"
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    hosts = parts.netloc.rpartition("@")[2]  # verbatim: a host list, a bracketed IPv6 address
    user = parts.username or ""
    return urlunsplit((parts.scheme, f"{user}:***@{hosts}", parts.path, parts.query, parts.fragment))


def backend_url(arg: str | None) -> str:
    url = arg if arg is not None else os.environ.get("LEASEHOLD_BACKEND") or "sqlite://"
    return url.strip()


def open_backend(url: str) -> Any:
    """Open the lock service for a ``--backend`` URL.

    :raises UsageError: the URL is malformed or its scheme unknown
    :raises BackendError: the backend cannot be opened
    """
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "sqlite":
        from .backends.sqlite import SQLiteLockService, SQLiteServiceError, default_path, path_from_url

        try:
            path = path_from_url(url)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if path == default_path():
            try:
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as e:
                raise BackendError(f"cannot create {path.parent}: {e.strerror or e}") from None
        try:
            return SQLiteLockService(path)
        except SQLiteServiceError as e:
            raise BackendError(str(e)) from None
    if scheme == "memory":
        if url.rstrip("/") not in ("memory:", "memory:/", "memory://"):
            raise UsageError(f"memory URLs take no host or path: {url!r}")
        from .backends.memory import MemoryLockService

        return MemoryLockService()
    if scheme in ("redis", "rediss", "unix"):
        try:
            from .backends.redis import RedisLockService
        except ImportError as e:
            raise BackendError(f"the Redis backend needs redis-py (pip install 'redis>=5'): {e}") from None
        try:
            # The Redis executor (the core's protocol) under its first name, for its status().
            svc = RedisLockService.from_url(url)
        except ValueError as e:
            raise UsageError(f"bad Redis URL {redact(url)!r}: {e}") from None
        except Exception as e:
            raise BackendError(f"cannot connect to {redact(url)}: {e}") from None
        ping = getattr(svc, "ping", None)
        if callable(ping):
            try:
                ping()
            except Exception as e:
                svc.close()
                raise BackendError(f"cannot reach {redact(url)}: {e}") from None
        return svc
    if scheme == "redis+sentinel":
        return _open_sentinel(url)
    if scheme == "redis+cluster":
        return _open_cluster(url)
    if scheme in ("postgresql", "postgres"):
        try:
            from .backends.sql_executor import PostgresExecutor

            return PostgresExecutor(url)
        except ImportError as e:
            raise BackendError(f"the PostgreSQL backend needs psycopg 3 (pip install 'leasehold[postgres]'): {e}") from None
    if scheme in ("etcd", "etcds"):
        from .backends.etcd_executor import EtcdExecutor

        user, password, endpoints = etcd_url(url)
        try:
            return EtcdExecutor(endpoints, user=user, password=password)
        except ValueError as e:
            raise UsageError(f"bad etcd URL {redact(url)!r}: {e}") from None
    raise UsageError(
        f"unknown backend URL {redact(url)!r} (use sqlite://, redis://, redis+sentinel://, redis+cluster://, "
        "postgresql://, etcd://, or memory://)"
    )


def _open_cluster(url: str) -> Any:
    """The Redis Cluster executor on the cluster any node of ``url`` belongs to."""
    try:
        from .backends.redis_cluster_executor import RedisClusterExecutor, parse_cluster_url
    except ImportError as e:
        raise BackendError(f"the Redis backend needs redis-py (pip install 'redis>=5'): {e}") from None
    try:
        parse_cluster_url(url)
    except ValueError as e:
        raise UsageError(f"bad Redis Cluster URL {redact(url)!r}: {e}") from None
    try:
        # redis-py reads the slot map from the first node that answers.
        return RedisClusterExecutor(url=url)
    except Exception as e:
        raise BackendError(f"cannot reach the cluster through {redact(url)}: {e}") from None


def _open_sentinel(url: str) -> Any:
    """The Redis executor on the master the sentinels of ``url`` name (it asks them again on
    every reconnect, so a run follows a failover)."""
    try:
        from .backends.redis_executor import RedisExecutor, parse_sentinel_url
    except ImportError as e:
        raise BackendError(f"the Redis backend needs redis-py (pip install 'redis>=5'): {e}") from None
    try:
        parse_sentinel_url(url)
    except ValueError as e:
        raise UsageError(f"bad Redis Sentinel URL {redact(url)!r}: {e}") from None
    executor = RedisExecutor(url=url)
    try:
        executor.command([b"PING"])  # the sentinels answer and name a reachable master
    except Exception as e:
        executor.close()
        why = str(e).split(" : ")[0]  # redis-py appends every sentinel's repr
        raise BackendError(f"cannot reach the master through {redact(url)}: {why}") from None
    return executor


def etcd_url(url: str) -> tuple[str | None, str | None, list[str]]:
    """``etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]`` as (user, password, member URLs);
    ``etcds://`` members speak TLS."""
    from urllib.parse import unquote

    scheme, _, rest = url.partition("://")
    user = password = None
    if "@" in rest:
        info, _, rest = rest.rpartition("@")
        name, sep, pw = info.partition(":")
        user, password = unquote(name) or None, (unquote(pw) if sep else None)
    rest = rest.rstrip("/")
    if not rest or "/" in rest or "?" in rest:
        raise UsageError(f"bad etcd URL {redact(url)!r}: give HOST:PORT[,HOST:PORT...] and nothing else")
    prefix = "https://" if scheme.lower() == "etcds" else "http://"
    return user, password, [prefix + h.strip() for h in rest.split(",") if h.strip()]


# ---------------------------------------------------------------------- status


def cmd_status(args: argparse.Namespace) -> int:
    url = backend_url(args.backend)
    name = args.name
    if not name:
        raise UsageError("NAME must not be empty")
    st: Any
    if url.lower().startswith("sqlite:"):
        from .backends.sqlite import path_from_url
        from .service import LockStatus

        try:
            path = path_from_url(url)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if not path.exists():  # never create a database just to say "free"
            st = LockStatus(name, False, None, None, None, None)
        else:
            st = _status_from(open_backend(url), name, url)
    elif url.lower().startswith("memory:"):
        open_backend(url).close()  # validates the URL
        raise BackendError(f"status is not supported by the backend {redact(url)} (in-process only: nothing to read)")
    elif url.lower().startswith(("etcd:", "etcds:", "postgresql:", "postgres:", "redis+sentinel:", "redis+cluster:")):
        st = _backend_status(open_backend(url), name, url)
    else:
        st = _status_from(open_backend(url), name, url)
    held_for = _field(st, "held_for_ms")
    info = {
        "name": name,
        "held": bool(_field(st, "held")),
        "fencing_token": _field(st, "fencing_token"),
        "remaining_ttl_ms": _field(st, "remaining_ttl_ms"),
        "holder_pid": _field(st, "holder_pid"),
        "holder_host": _field(st, "holder_host"),
        "held_for_ms": held_for,
        "holder_since": _utc_iso(time.time() - held_for / 1000) if held_for is not None else None,
        "last_fencing_token": _field(st, "last_fencing_token"),
        "backend": redact(url),
    }
    if args.json:
        print(json.dumps(info))
    elif info["held"]:
        ttl = info["remaining_ttl_ms"]
        ttl_text = f", expires in {ttl / 1000:.3f}s unless renewed" if ttl is not None else ""
        holder = ""
        if info["holder_pid"] or info["holder_host"]:
            holder = ", holder " + describe_holder(st)
            if info["holder_since"]:
                holder += f" (since {info['holder_since']})"
        print(f"{name}: held, fencing token {info['fencing_token']}{ttl_text}{holder}")
    else:
        last = info["last_fencing_token"]
        print(f"{name}: free" + (f" (last fencing token {last})" if last is not None else " (never acquired)"))
    return EX_OK if info["held"] else EX_FREE


def _backend_status(executor: Any, name: str, url: str) -> dict[str, Any]:
    """An executor's status of ``name``, read through the core's own query."""
    from ._backend import backend_status

    try:
        st = backend_status(executor, name)
    except Exception as e:
        raise BackendError(f"{redact(url)}: {e}") from None
    finally:
        executor.close()
    if not st.ok:
        raise BackendError(f"{redact(url)}: {st.error}")
    held = st.held
    return {
        "held": held,
        "fencing_token": st.fencing_token if held else None,
        "remaining_ttl_ms": st.remaining_ttl_ms if held else None,
        "holder_pid": st.holder_pid if held and st.holder_pid else None,
        "holder_host": st.holder_host if held and st.holder_host else None,
        "held_for_ms": st.held_for_ms if held else None,
        "last_fencing_token": st.last_fencing_token or None,
    }


def _utc_iso(unix: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(unix, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _field(st: Any, key: str) -> Any:
    if isinstance(st, dict):
        return st.get(key)
    return getattr(st, key, None)


def _status_from(svc: Any, name: str, url: str) -> Any:
    try:
        status = getattr(svc, "status", None)
        if not callable(status):
            raise BackendError(f"status is not supported by the backend {redact(url)}")
        try:
            return status(name)
        except BackendError:
            raise
        except ValueError as e:
            raise UsageError(str(e)) from None
        except Exception as e:
            raise BackendError(f"{redact(url)}: {e}") from None
    finally:
        svc.close()


# ---------------------------------------------------------------------- run: waiting on a terminal


def _seconds(ms: float) -> str:
    """A short human duration: 850ms, 12s, 4m05s, 2h03m."""
    if ms < 1000:
        return f"{int(ms)}ms"
    s = int(ms // 1000)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def describe_holder(st: Any) -> str:
    """``pid 123 on host-a for 12s``, as much of it as the backend knows (or ``someone``)."""
    pid, host, held_for = _field(st, "holder_pid"), _field(st, "holder_host"), _field(st, "held_for_ms")
    text = f"pid {pid}" if pid else "another client"
    if host:
        text += f" on {host}"
    if held_for is not None:
        text += f" for {_seconds(held_for)}"
    return text


class _WaitStatusLine:
    """While ``run`` waits on a terminal: one line on stderr, rewritten in place, naming the
    holder and the time left, and erased once the wait ends.

    A thread of its own reads the backend's status (a read can wait behind the IO threads'
    transactions) and draws; ``stop`` erases under the same lock, so nothing is drawn after it.
    """

    def __init__(self, service: Any, name: str, wait: float, done: threading.Event, fd: int) -> None:
        self.service, self.name, self.done, self.fd = service, name, done, fd
        self.give_up_at = time.monotonic() + wait if math.isfinite(wait) else None
        self.lock = threading.Lock()
        self.stopped = False
        self.drawn = False
        self.thread = threading.Thread(target=self._run, name="leasehold-cli-status", daemon=True)

    @classmethod
    def start(cls, service: Any, name: str, wait: float, done: threading.Event) -> _WaitStatusLine | None:
        fd = 2
        try:
            if not os.isatty(fd) or os.environ.get("TERM") == "dumb":
                return None
        except (OSError, ValueError):
            return None
        if wait <= 0 or not callable(getattr(service, "status", None)):
            return None
        line = cls(service, name, wait, done, fd)
        line.thread.start()
        return line

    def _run(self) -> None:
        # The first read comes after a short while: an uncontended acquire draws nothing.
        while not self.done.wait(_STATUS_EVERY) and not self.stopped:
            try:
                st = self.service.status(self.name)
            except Exception:  # noqa: BLE001 - a status line never fails the run
                st = None
            self._draw(self.text(st))

    def text(self, st: Any) -> str:
        parts = [f"leasehold: waiting for {self.name!r}"]
        if st is None:
            parts.append("holder unknown")
        elif not _field(st, "held"):
            parts.append("free, acquiring")
        else:
            holder = f"held by {describe_holder(st)}"
            ttl = _field(st, "remaining_ttl_ms")
            if ttl is not None:
                holder += f", expires in {_seconds(ttl)} unless renewed"
            parts.append(holder)
        if self.give_up_at is not None:
            parts.append(f"giving up in {_seconds(max(0.0, self.give_up_at - time.monotonic()) * 1000)}")
        return "; ".join(parts)

    def _draw(self, text: str) -> None:
        try:
            width = os.get_terminal_size(self.fd).columns
        except OSError:
            width = 80
        if width > 1 and len(text) >= width:
            text = text[: width - 2] + "…"  # a wrapped line could not be redrawn in place
        with self.lock:
            if self.stopped:
                return
            self._write("\r" + text + "\x1b[K")
            self.drawn = True

    def stop(self) -> None:
        with self.lock:
            if self.stopped:
                return
            self.stopped = True
            if self.drawn:
                self._write("\r\x1b[K")

    def _write(self, data: str) -> None:
        try:
            os.write(self.fd, data.encode("utf-8", "replace"))
        except OSError:
            pass


# ---------------------------------------------------------------------- run: signals


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


# ---------------------------------------------------------------------- run


def _die(code: int, message: str) -> NoReturn:
    sys.stderr.write(f"leasehold: {message}\n")
    raise SystemExit(code)


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
    url = backend_url(args.backend)
    verbose = args.verbose

    env = dict(os.environ)
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
    status_line = _WaitStatusLine.start(service, name, args.wait, done)
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
            raise BackendError(f"lock {name!r}: backend {redact(url)} unavailable: {e}")
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
    sys.stderr.write(f"leasehold: {msg}\n")
    sys.stderr.flush()


# ---------------------------------------------------------------------- main


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
    try:
        if args.cmd == "run":
            return cmd_run(args, command)
        return cmd_status(args)
    except UsageError as e:
        sys.stderr.write(f"leasehold: error: {e}\n(see 'leasehold {args.cmd} --help')\n")
        return EX_USAGE
    except BackendError as e:
        sys.stderr.write(f"leasehold: {e}\n")
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
        sys.stderr.write(f"leasehold: internal error: {type(e).__name__}: {e}\n")
        return EX_SOFTWARE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
