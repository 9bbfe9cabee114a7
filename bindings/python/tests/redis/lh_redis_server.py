"""Start and stop real redis-server processes for the Redis tests and the benchmark.

Each server listens on a free loopback port, writes into its own directory and is stopped by
the pid this module started (never by name). Without persistence it runs with
``--save "" --appendonly no``; with persistence it uses an fsync-always append-only file, so a
SIGKILL loses nothing that was acknowledged.

Usable as a script too (for manual runs)::

    python lh_redis_server.py            # start one, print its URL, wait for Ctrl-C
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def ensure_redis_server() -> str | None:
    """Path of redis-server, installing it when missing and possible (root + apt-get)."""
    found = shutil.which("redis-server")
    if found:
        return found
    script = REPO / "scripts" / "ensure-redis.sh"
    try:
        if script.is_file():
            subprocess.run(["bash", str(script)], check=False, timeout=600)
        elif hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            r = subprocess.run(["apt-get", "install", "-y", "redis-server"], env=env, check=False, timeout=600)
            if r.returncode != 0:
                subprocess.run(["apt-get", "update"], env=env, check=False, timeout=600)
                subprocess.run(["apt-get", "install", "-y", "redis-server"], env=env, check=False, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:  # pragma: no cover - depends on the machine
        print(f"installing redis-server failed: {e}", file=sys.stderr)
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").is_file() else None
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One redis-server child process on 127.0.0.1:<port>."""

    def __init__(self, binary: str, workdir: str | os.PathLike[str] | None = None, *, persistence: bool = False):
        self.binary = binary
        self.persistence = persistence
        self._tmp = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="lh-redis-")
            workdir = self._tmp.name
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def logfile(self) -> Path:
        return self.dir / "redis.log"

    def args(self) -> list[str]:
        a = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--logfile", str(self.logfile),
            "--daemonize", "no",
            "--save", "",
            "--protected-mode", "no",
        ]
        if self.persistence:
            a += ["--appendonly", "yes", "--appendfsync", "always", "--appendfilename", "lh.aof"]
        else:
            a += ["--appendonly", "no"]
        return a

    def start(self, timeout: float = 20.0) -> RedisServer:
        """Start (or restart, on the same port) and wait until it answers PING."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"redis-server pid {self.proc.pid} is still running")
        last_err: Exception | None = None
        deadline = time.monotonic() + timeout
        while True:
            self.proc = subprocess.Popen(self.args(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            self.starts += 1
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break  # exited (port taken, bad option): maybe retry below
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                        s.sendall(b"PING\r\n")
                        if s.recv(64).startswith(b"+PONG"):
                            return self
                except OSError as e:
                    last_err = e
                time.sleep(0.02)
            if self.proc.poll() is None:
                self.kill()
                raise RuntimeError(f"redis-server on port {self.port} did not answer PING: {last_err}")
            err = (self.proc.stderr.read() if self.proc.stderr else b"").decode(errors="replace")
            tail = self.logfile.read_text(errors="replace")[-2000:] if self.logfile.exists() else ""
            if self.starts == 1 and time.monotonic() < deadline and "Address already in use" in (err + tail):
                self.port = free_port()  # lost a race for the port on first start: pick another
                continue
            raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {err}\n{tail}")

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the server we started (no shutdown save) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; reaps the process."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()

    def restart(self) -> RedisServer:
        self.kill()
        return self.start()

    def client(self, **kwargs):  # type: ignore[no-untyped-def]
        import redis

        kwargs.setdefault("socket_timeout", 5.0)
        kwargs.setdefault("socket_connect_timeout", 5.0)
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def close(self) -> None:
        self.stop()
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":  # pragma: no cover - manual use
    binary = ensure_redis_server()
    if binary is None:
        sys.exit("redis-server not found")
    with RedisServer(binary, persistence="--aof" in sys.argv) as srv:
        print(srv.url, "pid", srv.pid, flush=True)
        try:
            while srv.is_running():
                time.sleep(1)
        except KeyboardInterrupt:
            pass
