"""EtcdExecutor over TLS: a one-member etcd serving https:// with a certificate made for the
test (openssl); the executor verifies it with the given ssl context, and refuses it without."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from leasehold import LockClient, errors
from leasehold.backends.etcd_executor import EtcdExecutor


def _port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def tls_member(etcd_cluster, tmp_path: Path):
    """(https URL, CA file) of a one-member etcd on TLS, killed by its pid afterwards."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=30,
    )
    client, peer = _port(), _port()
    url = f"https://127.0.0.1:{client}"
    proc = subprocess.Popen(
        ["etcd", "--name", "tls", "--data-dir", str(tmp_path / "data"),
         "--listen-client-urls", url, "--advertise-client-urls", url,
         "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"tls=http://127.0.0.1:{peer}", "--cert-file", str(cert), "--key-file", str(key),
         "--log-level", "warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    ctx = ssl.create_default_context(cafile=str(cert))
    try:
        for _ in range(100):
            try:
                with socket.create_connection(("127.0.0.1", client), timeout=0.2) as s, ctx.wrap_socket(s, server_hostname="127.0.0.1"):
                    break
            except OSError:
                time.sleep(0.1)
        yield url, ctx
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_tls_members_are_verified_with_the_given_context(tls_member, caplog: pytest.LogCaptureFixture) -> None:
    url, ctx = tls_member
    with LockClient(EtcdExecutor([url], ssl_context=ctx)) as client:
        with client.acquire("tls", ttl=3.0, wait=10.0) as lock:
            assert lock.fencing_token > 0
    client = LockClient(EtcdExecutor([url], timeout=1.0))  # the system CAs do not know it
    with pytest.raises(errors.BackendUnavailable):
        client.acquire("tls", ttl=3.0, wait=0.5)
    client.close(timeout=0.2)
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text
