"""Shared pytest setup for every Python test directory (core, sqlite, cli, redis)."""

from __future__ import annotations

import logging

import pytest


def pytest_report_header(config: pytest.Config) -> list[str]:
    try:
        import leasehold

        return [f"leasehold core {leasehold.CORE_VERSION} from {leasehold.library_path}"]
    except Exception as e:  # the import error itself is reported by the tests
        return [f"leasehold: cannot import ({e})"]


@pytest.fixture(autouse=True)
def _leasehold_debug_logging(caplog: pytest.LogCaptureFixture) -> None:
    """Keep leasehold's warnings in the captured log of a failing test."""
    caplog.set_level(logging.INFO, logger="leasehold")


# -- real PostgreSQL and etcd servers, one of each per test session ------------------------------
# They are started by the first test that asks, shared by every test after it, and stopped by
# pid at the end (scripts/pg-test-server.sh, scripts/etcd-test-cluster.sh). Without the server
# binaries the tests are skipped, except under CI=true where that is a failure.

import itertools  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import signal  # noqa: E402
import uuid  # noqa: E402
from typing import Any  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).resolve().parent / "lh_backend_worker.py"


def _in_ci() -> bool:
    return os.environ.get("CI") == "true"


def _missing(what: str) -> None:
    if _in_ci():
        pytest.fail(f"{what} -- CI=true: a missing server is a failure")
    pytest.skip(what)


def _ensure(script: str) -> bool:
    """Run scripts/ensure-*.sh (it installs with apt-get as root); True when installed."""
    try:
        return subprocess.run(["bash", str(REPO / "scripts" / script)], capture_output=True, timeout=600).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class PgServer:
    """A throw-away PostgreSQL cluster (scripts/pg-test-server.sh) on a free loopback port."""

    def __init__(self) -> None:
        # Under /tmp itself: as root the cluster runs as `postgres`, which must reach the dir.
        self.dir = tempfile.mkdtemp(prefix="lh-pg-")
        self.url = ""
        self._dbs = itertools.count(1)

    def _script(self, *args: str) -> str:
        res = subprocess.run(
            ["bash", str(REPO / "scripts" / "pg-test-server.sh"), *args], capture_output=True, text=True, timeout=120
        )
        if res.returncode != 0:
            raise RuntimeError(f"pg-test-server.sh {args[0]} failed: {res.stderr.strip()}")
        return res.stdout.strip()

    def start(self) -> "PgServer":
        self.url = self._script("start", self.dir)
        return self

    def stop(self) -> None:
        self._script("stop", self.dir)

    def restart(self) -> None:
        self.stop()
        self.start()

    def fresh_database(self) -> str:
        """A new empty database on the server; its URL."""
        import psycopg

        name = f"lh_t{next(self._dbs)}_{uuid.uuid4().hex[:6]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url.rsplit("/", 1)[0] + "/" + name

    def close(self) -> None:
        # Throw-away data: an immediate shutdown (SIGQUIT to the postmaster, by its pid).
        try:
            pid = int((Path(self.dir) / "data" / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGQUIT)
            for _ in range(100):
                os.kill(pid, 0)
                time.sleep(0.05)
        except (OSError, ValueError, IndexError):
            pass
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    if not _ensure("ensure-postgres.sh"):
        _missing("PostgreSQL is not installed and could not be installed (scripts/ensure-postgres.sh)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _missing("psycopg is not installed in the venv (bindings/python/setup-venv.sh installs it)")
    srv = PgServer().start()
    yield srv
    srv.close()


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    """A fresh database on the shared server (the server restarted if a test stopped it)."""
    try:
        return pg_server.fresh_database()
    except Exception:
        pg_server.start()
        return pg_server.fresh_database()


class EtcdCluster:
    """A throw-away etcd cluster (scripts/etcd-test-cluster.sh) on free loopback ports."""

    def __init__(self, members: int = 3) -> None:
        self.dir = tempfile.mkdtemp(prefix="lh-etcd-")
        self.members = members
        self.urls: list[str] = []

    def _script(self, *args: str) -> str:
        res = subprocess.run(
            ["bash", str(REPO / "scripts" / "etcd-test-cluster.sh"), args[0], self.dir, *args[1:]],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if res.returncode != 0:
            raise RuntimeError(f"etcd-test-cluster.sh {args[0]} failed: {res.stderr.strip()}")
        return res.stdout.strip()

    def start(self) -> "EtcdCluster":
        self.urls = self._script("start", str(self.members)).split(",")
        return self

    @property
    def endpoints(self) -> str:
        return ",".join(self.urls)

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` (0-based)."""
        self._script("kill", str(i + 1))

    def restart(self, i: int) -> None:
        self._script("restart", str(i + 1))

    def close(self) -> None:
        # Throw-away data: each member is killed by its pid (a graceful stop takes seconds).
        for pidfile in Path(self.dir).glob("m*/pid"):
            try:
                pid = int(pidfile.read_text())
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def etcd_cluster() -> Iterator[EtcdCluster]:
    if not _ensure("ensure-etcd.sh"):
        _missing("etcd is not installed and could not be installed (scripts/ensure-etcd.sh)")
    cluster = EtcdCluster().start()
    yield cluster
    cluster.close()


@pytest.fixture
def spawn() -> Iterator[Any]:
    """``spawn(*args)`` starts lh_backend_worker.py (stdin/stdout piped, text); every worker
    still running at the end of the test is killed by its pid."""
    env = dict(os.environ)
    pkg = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([pkg, env.get("PYTHONPATH", "")])
    env.setdefault("PYTHONUNBUFFERED", "1")
    made: list[subprocess.Popen[str]] = []

    def start(*args: str) -> "subprocess.Popen[str]":
        p = subprocess.Popen(
            [sys.executable, str(WORKER), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        made.append(p)
        return p

    yield start
    for p in made:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGCONT)
            except OSError:
                pass
            p.kill()
        p.wait(timeout=10)
