"""`leasehold run --backend redis://...` runs COMMAND under a Redis lock."""

from __future__ import annotations

import subprocess
import sys

from lh_keys import keys_for, plant_holder


def run_cli(args: list[str], env: dict[str, str], timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leasehold", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_run_gets_a_redis_fencing_token_and_releases(redis_server, r, worker_env):
    url = redis_server.url
    cmd = ["run", "jobs", "--backend", url, "--", "sh", "-c", 'echo "$LEASEHOLD_FENCING_TOKEN"']
    first = run_cli(cmd, worker_env)
    assert first.returncode == 0, first.stderr
    second = run_cli(cmd, worker_env)
    assert second.returncode == 0, second.stderr
    t1, t2 = int(first.stdout.strip()), int(second.stdout.strip())
    assert t2 > t1
    assert int(r.get(keys_for("jobs").fence)) == t2
    assert not r.exists(keys_for("jobs").lock), "released when COMMAND exited"


def test_run_with_wait_0_gives_up_when_held_in_redis(redis_server, r, worker_env):
    plant_holder(r, "busy")
    res = run_cli(["run", "--wait", "0", "busy", "--backend", redis_server.url, "--", "true"], worker_env)
    assert res.returncode == 75, (res.returncode, res.stderr)


def test_nonblock_conflict_code_and_status_on_redis(redis_server, r, worker_env):
    import json

    k = keys_for("busy")
    plant_holder(r, "busy")
    res = run_cli(["run", "-n", "-E", "5", "busy", "--backend", redis_server.url, "-c", "echo ran"], worker_env)
    assert res.returncode == 5, (res.returncode, res.stderr)
    assert "ran" not in res.stdout
    st = run_cli(["status", "busy", "--backend", redis_server.url, "--json"], worker_env)
    assert st.returncode == 0, st.stderr
    info = json.loads(st.stdout)
    assert info["held"] is True and info["fencing_token"] == int(r.get(k.fence))
    # Redis does not record who holds a lock: no holder details, never made-up ones.
    assert info["holder_pid"] is None and info["holder_host"] is None and info["holder_since"] is None
    text = run_cli(["status", "busy", "--backend", redis_server.url], worker_env)
    assert text.returncode == 0 and "holder" not in text.stdout, text.stdout


# -- without redis-py ------------------------------------------------------------------------------
_BLOCK_REDIS = '''
import sys


class _NoRedisPy:
    """``import redis`` fails in this process, as where redis-py is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "redis" or name.startswith("redis."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None


sys.meta_path.insert(0, _NoRedisPy())
'''

_LIBRARY_WITHOUT_REDIS_PY = '''
import asyncio, sys
from leasehold import AsyncLockClient, LockClient
from leasehold.backends.redis import RedisLockService
from leasehold.backends.redis_async import AsyncRedisLockService

url = sys.argv[1]
with RedisLockService.from_url(url) as svc:
    assert svc.ping() is True
    with LockClient(svc, owns_service=False) as c:
        with c.acquire("no-redis-py", ttl=5) as lock:
            assert svc.status("no-redis-py").fencing_token == lock.fencing_token
        assert c.counters().stream_opens >= 1
    try:
        svc.client
    except ImportError as e:
        assert "leasehold[redis]" in str(e), e
    else:
        raise AssertionError(".client without redis-py")
try:
    RedisLockService(object())
except ImportError as e:
    assert "leasehold[redis]" in str(e), e
else:
    raise AssertionError("RedisLockService(client) without redis-py")


async def main():
    async with AsyncLockClient(AsyncRedisLockService.from_url(url)) as c:
        async with c.acquire("no-redis-py", ttl=5) as lock:
            return lock.fencing_token


assert asyncio.run(main()) > 0
assert not any(m == "redis" or m.startswith("redis.") for m in sys.modules), "redis-py was imported"
print("ok")
'''


def _without_redis_py(worker_env, tmp_path):  # type: ignore[no-untyped-def]
    import os

    shim = tmp_path / "no-redis-py"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(_BLOCK_REDIS)
    env = dict(worker_env)
    env["PYTHONPATH"] = os.pathsep.join([str(shim), env.get("PYTHONPATH", "")])
    probe = subprocess.run([sys.executable, "-c", "import redis"], env=env, capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "blocked by the test" in probe.stderr, probe.stderr
    return env


def test_the_library_takes_the_byte_path_without_redis_py(redis_server, r, worker_env, tmp_path):
    env = _without_redis_py(worker_env, tmp_path)
    res = subprocess.run(
        [sys.executable, "-c", _LIBRARY_WITHOUT_REDIS_PY, redis_server.url], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
    assert int(r.get(keys_for("no-redis-py").fence)) > 0


def test_the_cli_runs_on_redis_without_redis_py(redis_server, r, worker_env, tmp_path):
    import json

    env = _without_redis_py(worker_env, tmp_path)
    url = redis_server.url
    cmd = ["run", "jobs", "--backend", url, "--", "sh", "-c", 'echo "$LEASEHOLD_FENCING_TOKEN"']
    first = run_cli(cmd, env)
    assert first.returncode == 0, first.stderr
    token = int(first.stdout.strip())
    assert int(r.get(keys_for("jobs").fence)) == token
    assert not r.exists(keys_for("jobs").lock), "released when COMMAND exited"
    st = run_cli(["status", "jobs", "--backend", url, "--json"], env)
    assert st.returncode == 1, st.stderr  # free
    assert json.loads(st.stdout)["last_fencing_token"] == token
    plant_holder(r, "busy")
    held = run_cli(["status", "busy", "--backend", url, "--json"], env)
    assert held.returncode == 0 and json.loads(held.stdout)["held"] is True, held.stderr
    assert run_cli(["run", "--wait", "0", "busy", "--backend", url, "--", "true"], env).returncode == 75
    bad = run_cli(["status", "x", "--backend", url + "?db=1"], env)  # the core refuses the query
    assert bad.returncode == 64 and "query" in bad.stderr, bad.stderr
    down = run_cli(["status", "x", "--backend", "redis://127.0.0.1:1/0"], env)
    assert down.returncode == 69 and "refused" in down.stderr.lower(), down.stderr
    for res in (first, st, held, bad, down):
        assert "redis-py" not in res.stderr and "Traceback" not in res.stderr, res.stderr
