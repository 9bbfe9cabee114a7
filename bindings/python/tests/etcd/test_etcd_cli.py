"""`leasehold run --backend etcd://host:port,host:port` on a real 3-member etcd cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

from leasehold import LockClient
from leasehold.backends.etcd_executor import EtcdExecutor
from leasehold.cli import etcd_url, redact


def run_cli(args: list[str], timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("LEASEHOLD_BACKEND", None)
    return subprocess.run(
        [sys.executable, "-m", "leasehold", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_run_on_an_etcd_cluster(etcd_cluster) -> None:
    url = "etcd://" + ",".join(u.removeprefix("http://") for u in etcd_cluster.urls)
    name = f"cli-{uuid.uuid4().hex[:8]}"
    cmd = ["run", name, "--backend", url, "--", "sh", "-c", 'echo "$LEASEHOLD_FENCING_TOKEN"']
    first, second = run_cli(cmd), run_cli(cmd)
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    assert int(second.stdout) > int(first.stdout)
    with LockClient(EtcdExecutor(etcd_cluster.urls)) as client, client.acquire(name, ttl=30.0) as h:
        busy = run_cli(["run", "--wait", "0", name, "--backend", url, "--", "true"])
        assert busy.returncode == 75, busy.stderr
        held = run_cli(["status", name, "--backend", url, "--json"])
        assert held.returncode == 0, held.stderr
        info = json.loads(held.stdout)
        assert info["held"] is True and info["fencing_token"] == h.fencing_token
        assert 0 < info["remaining_ttl_ms"] <= 30_000
    free = run_cli(["status", name, "--backend", url])
    assert free.returncode == 1 and "free" in free.stdout, (free.stdout, free.stderr)


def test_etcd_urls() -> None:
    assert etcd_url("etcd://a:1,b:2") == (None, None, ["http://a:1", "http://b:2"])
    assert etcd_url("etcds://root:p%40ss@a:1/") == ("root", "p@ss", ["https://a:1"])
    assert redact("etcd://root:secret@a:1,b:2") == "etcd://root:***@a:1,b:2"
    res = run_cli(["run", "x", "--backend", "etcd://a:1/path", "--", "true"])
    assert res.returncode == 64, res.stderr
