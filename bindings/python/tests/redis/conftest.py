"""Fixtures for the Redis tests: real redis-server processes on free loopback ports.

Without redis-server the tests are skipped, except under ``CI=true`` where a missing server is
a failure (after trying to install it: scripts/ensure-redis.sh, or apt-get as root).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lh_redis_server import RedisServer, _in_ci, ensure_redis_server  # noqa: E402


@pytest.fixture(scope="session")
def redis_bin() -> str:
    binary = ensure_redis_server()
    if binary is None:
        msg = "redis-server is not installed and could not be installed (apt-get install redis-server)"
        if _in_ci():
            pytest.fail(msg + " -- CI=true: a missing redis-server is a failure")
        pytest.skip(msg)
    return binary


@pytest.fixture(scope="session")
def redis_server(redis_bin: str, tmp_path_factory: pytest.TempPathFactory):
    """One shared server without persistence (tests flush it through ``r``)."""
    srv = RedisServer(redis_bin, tmp_path_factory.mktemp("redis-shared"))
    srv.start()
    yield srv
    srv.close()


@pytest.fixture
def r(redis_server: RedisServer):
    """A redis-py client on the shared server, flushed before the test."""
    if not redis_server.is_running():
        redis_server.start()
    client = redis_server.client()
    client.flushall()
    client.script_flush()
    yield client
    client.close()


@pytest.fixture
def redis_factory(redis_bin: str, tmp_path: Path):
    """Dedicated servers for tests that kill or restart them: ``redis_factory(persistence=False)``."""
    made: list[RedisServer] = []

    def make(*, persistence: bool = False) -> RedisServer:
        srv = RedisServer(redis_bin, tmp_path / f"redis-{len(made)}", persistence=persistence)
        made.append(srv)
        return srv.start()

    yield make
    for srv in made:
        srv.close()


@pytest.fixture
def worker_env() -> dict[str, str]:
    """Environment for worker subprocesses: the package and this directory importable."""
    here = Path(__file__).resolve().parent
    pkg = here.parent.parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(pkg), str(here), env.get("PYTHONPATH", "")])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
