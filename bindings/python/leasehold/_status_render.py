"""What ``leasehold status`` prints, and the status line ``leasehold run`` draws while it waits.

Everything a lock service reports about a holder (its host above all) is the holder's own
say, written into the service by whoever held the name: it is printed with its control
characters escaped (:func:`~leasehold._urls.escape_control`), so a planted value cannot drive
the terminal.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import threading
import time
from typing import Any

from ._cli_backends import BackendError, UsageError, backend_url, open_backend
from ._urls import escape_control, redact, scrub

__all__ = ["WaitStatusLine", "cmd_status", "describe_holder", "render_status", "status_info"]

_STATUS_EVERY = 0.5  # seconds between updates of the waiting status line on a terminal


def cmd_status(args: argparse.Namespace) -> int:
    """``leasehold status NAME``: 0 when held, 1 when free (EX_OK / EX_FREE)."""
    url = backend_url(args.backend, getattr(args, "backend_file", None))
    name = args.name
    if not name:
        raise UsageError("NAME must not be empty")
    info = status_info(name, url, _read_status(name, url))
    print(render_status(info, as_json=bool(args.json)))
    return 0 if info["held"] else 1


def _read_status(name: str, url: str) -> Any:
    lower = url.lower()
    if lower.startswith("sqlite:"):
        from .backends.sqlite import path_from_url
        from .service import LockStatus

        try:
            path = path_from_url(url)
        except ValueError as e:
            raise UsageError(scrub(e, url)) from None
        if not path.exists():  # never create a database just to say "free"
            return LockStatus(name, False, None, None, None, None)
        return _status_from(open_backend(url), name, url)
    if lower.startswith("memory:"):
        open_backend(url).close()  # validates the URL
        raise BackendError(f"status is not supported by the backend {redact(url)} (in-process only: nothing to read)")
    if lower.startswith(("etcd:", "etcds:", "postgresql:", "postgres:", "redis+sentinel:", "redis+cluster:")):
        return _backend_status(open_backend(url), name, url)
    return _status_from(open_backend(url), name, url)


def status_info(name: str, url: str, st: Any) -> dict[str, Any]:
    """The fields ``status --json`` prints (values as the service reported them)."""
    held_for = _field(st, "held_for_ms")
    return {
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


def render_status(info: dict[str, Any], *, as_json: bool) -> str:
    """One line of text, or one JSON object; no control character of a reported value
    reaches the output raw (JSON escapes C0 and non-ASCII; DEL is escaped here)."""
    if as_json:
        return json.dumps(info).replace("\x7f", "\\u007f")
    name = escape_control(str(info["name"]))
    if info["held"]:
        ttl = info["remaining_ttl_ms"]
        ttl_text = f", expires in {ttl / 1000:.3f}s unless renewed" if ttl is not None else ""
        holder = ""
        if info["holder_pid"] or info["holder_host"]:
            holder = ", holder " + describe_holder(info)
            if info["holder_since"]:
                holder += f" (since {info['holder_since']})"
        return escape_control(f"{name}: held, fencing token {info['fencing_token']}{ttl_text}{holder}")
    last = info["last_fencing_token"]
    return escape_control(f"{name}: free" + (f" (last fencing token {last})" if last is not None else " (never acquired)"))


def _backend_status(executor: Any, name: str, url: str) -> dict[str, Any]:
    """An executor's status of ``name``, read through the core's own query."""
    from ._backend import backend_status

    try:
        st = backend_status(executor, name)
    except Exception as e:
        raise BackendError(f"{redact(url)}: {scrub(e, url)}") from None
    finally:
        executor.close()
    if not st.ok:
        raise BackendError(f"{redact(url)}: {scrub(st.error, url)}")
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
            raise UsageError(scrub(e, url)) from None
        except Exception as e:
            raise BackendError(f"{redact(url)}: {scrub(e, url)}") from None
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
    return escape_control(text)


class WaitStatusLine:
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
    def start(cls, service: Any, name: str, wait: float, done: threading.Event) -> WaitStatusLine | None:
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
        text = escape_control(text)
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

