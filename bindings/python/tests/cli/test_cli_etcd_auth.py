"""etcd:// (plain HTTP) with a user and password is refused unless the URL opts in with
``?insecure_auth=1``; etcds:// (TLS) is fine. Checked against a loopback listener standing in
for an etcd member: a refused URL sends it nothing, an opted-in one sends the password."""

from __future__ import annotations

import socket
import threading

import pytest
from cli_helpers import run_cli

from leasehold._cli_backends import UsageError, etcd_url

SECRET = "S3CRET-etcd"


class Listener:
    """A loopback TCP listener that records what the first connections send, then hangs up."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received = b""
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.settimeout(2.0)
            try:
                while b"\r\n\r\n" not in self.received or not self.received.rstrip().endswith(b"}"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    self.received += chunk
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def member():
    lst = Listener()
    yield lst
    lst.close()


def test_etcd_url_needs_tls_or_an_explicit_opt_in() -> None:
    with pytest.raises(UsageError) as info:
        etcd_url(f"etcd://root:{SECRET}@a:1")
    assert "etcds://" in str(info.value) and "insecure_auth=1" in str(info.value)
    assert SECRET not in str(info.value)
    with pytest.raises(UsageError):
        etcd_url("etcd://root@a:1")  # a user alone is sent in clear text too
    assert etcd_url(f"etcds://root:{SECRET}@a:1,b:2") == ("root", SECRET, ["https://a:1", "https://b:2"])
    assert etcd_url(f"etcd://root:{SECRET}@a:1?insecure_auth=1") == ("root", SECRET, ["http://a:1"])
    assert etcd_url("etcd://a:1") == (None, None, ["http://a:1"])  # no credentials: nothing to protect
    for bad in (f"etcd://root:{SECRET}@a:1?insecure_auth=0", f"etcd://root:{SECRET}@a:1?other=1"):
        with pytest.raises(UsageError) as info:
            etcd_url(bad)
        assert SECRET not in str(info.value)


def test_refused_etcd_url_sends_nothing(env, member) -> None:
    res = run_cli(["status", "job", "--backend", f"etcd://root:{SECRET}@127.0.0.1:{member.port}"], env)
    assert res.returncode == 64, res.stderr
    assert "insecure_auth=1" in res.stderr and SECRET not in res.stdout + res.stderr
    run = run_cli(["run", "-w", "0", "job", "--backend", f"etcd://root:{SECRET}@127.0.0.1:{member.port}", "--", "true"], env)
    assert run.returncode == 64, run.stderr
    assert member.connections == 0 and member.received == b""


def test_opted_in_etcd_url_sends_the_password_over_plain_http(env, member) -> None:
    url = f"etcd://root:{SECRET}@127.0.0.1:{member.port}?insecure_auth=1"
    res = run_cli(["status", "job", "--backend", url], env)
    assert res.returncode == 69, res.stderr  # the "member" hung up
    assert SECRET not in res.stdout + res.stderr
    assert member.connections >= 1
    assert SECRET.encode() in member.received  # what the refusal protects against
