"""`leasehold run --backend postgresql://...` and `leasehold status` on a real PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from leasehold import LockClient
from leasehold.backends.sql_executor import PostgresExecutor


def run_cli(args: list[str], timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("LEASEHOLD_BACKEND", None)
    return subprocess.run(
        [sys.executable, "-m", "leasehold", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_run_and_status_on_postgresql(pg_url: str) -> None:
    cmd = ["run", "jobs", "--backend", pg_url, "--", "sh", "-c", 'echo "$LEASEHOLD_FENCING_TOKEN"']
    first, second = run_cli(cmd), run_cli(cmd)
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    t1, t2 = int(first.stdout), int(second.stdout)
    assert t2 > t1
    st = run_cli(["status", "jobs", "--backend", pg_url, "--json"])
    assert st.returncode == 1, st.stderr  # free
    info = json.loads(st.stdout)
    assert info["held"] is False and info["last_fencing_token"] == t2
    assert ":***@" in info["backend"] and "leasehold@" not in info["backend"]
    with LockClient(PostgresExecutor(pg_url)) as client, client.acquire("jobs", ttl=30.0) as lock:
        busy = run_cli(["run", "--wait", "0", "jobs", "--backend", pg_url, "--", "true"])
        assert busy.returncode == 75, busy.stderr
        st = run_cli(["status", "jobs", "--backend", pg_url, "--json"])
        assert st.returncode == 0, st.stderr
        info = json.loads(st.stdout)
        assert info["held"] is True and info["fencing_token"] == lock.fencing_token > t2
        assert 0 < info["remaining_ttl_ms"] <= 30_000
        # PostgreSQL records no holder process: no holder details, never made-up ones.
        assert info["holder_pid"] is None and info["holder_host"] is None
        text = run_cli(["status", "jobs", "--backend", pg_url])
        assert text.returncode == 0 and f"held, fencing token {lock.fencing_token}" in text.stdout, text.stdout


def test_a_wrong_password_is_a_clear_error(pg_url: str) -> None:
    bad = pg_url.replace(":leasehold@", ":wrong@")
    st = run_cli(["status", "jobs", "--backend", bad])
    assert st.returncode == 69 and "password authentication failed" in st.stderr, st.stderr
    assert "wrong" not in st.stderr, st.stderr
