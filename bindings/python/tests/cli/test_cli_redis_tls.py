"""``rediss://`` verifies the server's certificate *and* that it names the host connected to,
whatever redis-py's defaults (redis-py 5 checked no host name): the connection keywords the
library builds, and a real redis-server speaking TLS with certificates made here by openssl
(one for another host name, one whose subjectAltName is the IP address 127.0.0.1)."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "redis"))
from lh_certs import make_ca, make_cert, require_openssl  # noqa: E402
from lh_redis_server import _in_ci, ensure_redis_server, free_port  # noqa: E402

redis = pytest.importorskip("redis")

from leasehold.backends.redis import RedisLockService  # noqa: E402
from leasehold.backends.redis_cluster_executor import cluster_startup  # noqa: E402
from leasehold.backends.redis_connect import async_connection_pool, connection_pool, sentinel_pool  # noqa: E402


def _missing(what: str) -> None:
    if _in_ci():
        pytest.fail(f"{what} -- CI=true: a missing server is a failure")
    pytest.skip(what)


# ------------------------------------------------------------------ the keywords built


def test_rediss_url_keywords_require_the_certificate_and_the_host_name() -> None:
    pool = connection_pool(url="rediss://127.0.0.1:6380/0")
    assert pool.connection_class.__name__ == "SSLConnection"
    assert pool.connection_kwargs["ssl_check_hostname"] is True
    assert pool.connection_kwargs["ssl_cert_reqs"] == "required"
    # from_url is on the byte path: the standard library's verifying context, also when the
    # URL has TLS settings (redis-py's ssl_* query parameters are read for those only).
    svc = RedisLockService.from_url("rediss://127.0.0.1:6380/0")
    try:
        assert svc.settings()["ssl_context"] is None  # ssl.create_default_context() on connect
    finally:
        svc.close()
    svc = RedisLockService.from_url("rediss://127.0.0.1:6380/0?ssl_cert_reqs=required")
    try:
        ctx = svc.settings()["ssl_context"]
        assert ctx.check_hostname is True and ctx.verify_mode == ssl.CERT_REQUIRED
        assert "?" not in svc.url  # the core gets the URL without them
    finally:
        svc.close()
    apool = async_connection_pool(url="rediss://127.0.0.1:6380/0")
    assert apool.connection_kwargs["ssl_check_hostname"] is True
    assert apool.connection_kwargs["ssl_cert_reqs"] == "required"
    plain = connection_pool(url="redis://127.0.0.1:6380/0")
    assert "ssl_check_hostname" not in plain.connection_kwargs  # not a TLS connection


def test_ssl_keywords_require_the_certificate_and_the_host_name() -> None:
    pool = connection_pool(host="127.0.0.1", port=6380, ssl=True)
    assert pool.connection_kwargs["ssl_check_hostname"] is True
    assert pool.connection_kwargs["ssl_cert_reqs"] == "required"
    sentinel = sentinel_pool("127.0.0.1:26379", "main", ssl=True)
    assert sentinel.connection_kwargs["ssl_check_hostname"] is True
    assert sentinel.connection_kwargs["ssl_cert_reqs"] == "required"
    kwargs: dict = {"ssl": True}
    cluster_startup("127.0.0.1:7000", None, None, kwargs, None)
    assert kwargs["ssl_check_hostname"] is True and kwargs["ssl_cert_reqs"] == "required"


def test_an_explicit_choice_still_wins() -> None:
    pool = connection_pool(url="rediss://127.0.0.1:6380/0", ssl_check_hostname=False)
    assert pool.connection_kwargs["ssl_check_hostname"] is False
    pool = connection_pool(url="rediss://127.0.0.1:6380/0?ssl_cert_reqs=none")
    assert pool.connection_kwargs["ssl_cert_reqs"] == "none"


# ------------------------------------------------------------------ a real TLS server


def _certificates(d: Path, san: str) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate for ``san``, its key), made in ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    make_ca(d, "ca")
    make_cert(d, "server", "ca", san)
    return d / "ca.crt", d / "server.crt", d / "server.key"


class TlsRedis:
    """redis-server on 127.0.0.1, TLS only (no plain port), with the given certificate."""

    def __init__(self, binary: str, d: Path, ca: Path, cert: Path, key: Path) -> None:
        self.port = free_port()
        self.ca = ca
        args = [
            binary, "--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1",
            "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca),
            "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", str(d),
            "--protected-mode", "no", "--daemonize", "no",
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def wait_ready(self, bound: float = 20.0) -> None:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.check_hostname = False  # the readiness probe only; the tests check host names
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = self.proc.stdout.read().decode(errors="replace") if self.proc.stdout else ""
                raise RuntimeError(out)
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as raw:
                    with ctx.wrap_socket(raw) as s:
                        s.sendall(b"PING\r\n")
                        if s.recv(64).startswith(b"+PONG"):
                            return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"TLS redis-server on port {self.port} did not answer")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def tls_redis(tmp_path: Path):
    """``start(san)``: a TLS redis-server whose certificate (from a fresh CA) names ``san``."""
    binary = ensure_redis_server()
    if binary is None:
        _missing("redis-server is not installed")
    require_openssl()
    servers: list[TlsRedis] = []

    def start(san: str) -> TlsRedis:
        d = tmp_path / f"tls-{len(servers)}"
        ca, cert, key = _certificates(d, san)
        srv = TlsRedis(binary, d, ca, cert, key)  # type: ignore[arg-type]
        servers.append(srv)
        try:
            srv.wait_ready()
        except RuntimeError as e:
            if "tls" in str(e).lower() and ("bad directive" in str(e).lower() or "not supported" in str(e).lower()):
                _missing(f"this redis-server was built without TLS: {e}")
            raise
        return srv

    yield start
    for srv in servers:
        srv.close()


def _url(srv: TlsRedis) -> str:
    return f"rediss://127.0.0.1:{srv.port}/0?ssl_ca_certs={srv.ca}"


def _ping(url: str) -> None:
    svc = RedisLockService.from_url(url)
    try:
        svc.ping()
    finally:
        svc.close()


def test_certificate_for_another_host_is_refused(env, tls_redis) -> None:
    srv = tls_redis("DNS:not-this-host.example")
    with pytest.raises(Exception) as info:
        _ping(_url(srv))
    text = str(info.value).lower()
    assert "mismatch" in text or "certificate verify failed" in text, info.value
    res = run_cli(["status", "job", "--backend", _url(srv)], env)
    assert res.returncode == 69, (res.returncode, res.stderr)
    assert "mismatch" in res.stderr.lower() or "verify" in res.stderr.lower(), res.stderr
    # The same certificate is accepted once host names are explicitly not checked: the CA
    # verification passes, so the refusal above was the host name check.
    _ping(_url(srv) + "&ssl_check_hostname=False")


def test_certificate_naming_the_ip_address_is_accepted(env, tls_redis) -> None:
    srv = tls_redis("IP:127.0.0.1")
    _ping(_url(srv))
    res = run_cli(["status", "job", "--backend", _url(srv)], env)
    assert res.returncode == 1, (res.returncode, res.stderr)  # reached: the lock is free
    run = run_cli(["run", "job", "--backend", _url(srv), "--", "sh", "-c", 'echo "$LEASEHOLD_FENCING_TOKEN"'], env)
    assert run.returncode == 0 and int(run.stdout) >= 1, run.stderr
    # Without the CA the server's certificate is unknown: refused.
    with pytest.raises(Exception) as info:
        _ping(f"rediss://127.0.0.1:{srv.port}/0")
    assert "certificate verify failed" in str(info.value).lower(), info.value


def test_the_byte_path_over_tls(tls_redis) -> None:
    """``RedisStreamExecutor`` on ``rediss://``: non-blocking TLS sockets, replies read on the
    caller's thread and by the poller (a renewal), the certificate checked for the host."""
    import threading

    from leasehold import LockClient
    from leasehold.backends.redis_stream import RedisStreamExecutor

    srv = tls_redis("IP:127.0.0.1")
    ctx = ssl.create_default_context(cafile=str(srv.ca))
    ex = RedisStreamExecutor(f"rediss://127.0.0.1:{srv.port}/0", ssl_context=ctx)
    reads: list[str] = []
    inner = ex.read_held

    def read_held(claims, timeout, wake=-1):  # type: ignore[no-untyped-def]
        got = inner(claims, timeout, wake)
        if got:
            reads.append(threading.current_thread().name)
        return got

    ex.read_held = read_held  # type: ignore[method-assign]
    with LockClient(ex) as c:
        last = 0
        for _ in range(20):
            with c.acquire("tls-bytes", ttl=10) as lock:
                assert lock.fencing_token > last
                last = lock.fencing_token
        assert reads and set(reads) == {threading.current_thread().name}
        h = c.acquire("tls-renew", ttl=1)
        before = h.valid_until
        deadline = time.monotonic() + 5
        while h.valid_until <= before:  # renewed by the timer thread, its reply read by the poller
            assert time.monotonic() < deadline, "no renewal over TLS"
            time.sleep(0.05)
        h.release()
    other = RedisStreamExecutor(f"rediss://127.0.0.1:{srv.port}/0")  # the system CAs: refused
    with LockClient(other) as c:
        from leasehold import errors

        with pytest.raises(errors.LockTimeout):
            c.acquire("tls-refused", ttl=10, wait=0.5)
        assert "certificate" in c.backend_last_error().lower(), c.backend_last_error()


def test_the_byte_path_on_the_event_loop_over_tls(tls_redis) -> None:
    """``AsyncRedisLockService.from_url`` on ``rediss://`` with the CA as redis-py's query
    parameter: the loop's TLS transports check the certificate and the host name."""
    import asyncio

    from leasehold import AsyncLockClient, errors
    from leasehold.backends.redis_async import AsyncRedisLockService

    good = tls_redis("IP:127.0.0.1")
    wrong_host = tls_redis("DNS:not-this-host.example")

    async def main() -> None:
        async with AsyncLockClient(AsyncRedisLockService.from_url(_url(good))) as c:
            last = 0
            for _ in range(5):
                async with c.acquire("tls-loop", ttl=10) as lock:
                    assert lock.fencing_token > last
                    last = lock.fencing_token
            assert c.counters().stream_opens >= 1
        async with AsyncLockClient(AsyncRedisLockService.from_url(_url(wrong_host))) as c:
            with pytest.raises(errors.LockTimeout):
                await c.acquire("tls-loop-refused", ttl=10, wait=0.5)
            why = c.backend_last_error().lower()
            assert "mismatch" in why or "certificate" in why, why

    asyncio.run(asyncio.wait_for(main(), 60))
