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
