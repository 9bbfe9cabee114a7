"""``RedisStreamExecutor`` over TLS (``rediss://``) against a real redis-server that requires
client certificates, with a certificate authority the test makes (openssl): the server's
certificate is verified against that CA for the host name the core asks for, the client
presents its own certificate from the ``ssl_context``, and a handshake that fails (no client
certificate, a server certificate from another CA) grants nothing and says why."""

from __future__ import annotations

import ssl
import threading
from pathlib import Path

import pytest

from leasehold import LockClient, errors
from leasehold.backends.redis_stream import RedisStreamExecutor
from lh_certs import make_ca, make_cert, require_openssl
from lh_redis_server import RedisServer, free_port


class TlsRedis(RedisServer):
    """A redis-server with a plain port (readiness, inspection) and a TLS port that requires a
    client certificate signed by the test's CA."""

    def __init__(self, binary: str, workdir: Path, certs: Path) -> None:
        super().__init__(binary, workdir)
        self.certs = certs
        self.tls_port = free_port()

    def args(self) -> list[str]:
        c = self.certs
        return super().args() + [
            "--tls-port", str(self.tls_port),
            "--tls-cert-file", str(c / "server.crt"),
            "--tls-key-file", str(c / "server.key"),
            "--tls-ca-cert-file", str(c / "ca.crt"),
            "--tls-auth-clients", "yes",
        ]


@pytest.fixture(scope="module")
def tls(redis_bin: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    require_openssl()
    tmp_path = tmp_path_factory.mktemp("tls")
    certs = tmp_path / "certs"
    certs.mkdir()
    make_ca(certs, "ca")
    make_ca(certs, "other-ca")
    make_cert(certs, "server", "ca", "DNS:localhost,IP:127.0.0.1")
    make_cert(certs, "client", "ca", "DNS:client")
    make_cert(certs, "stranger", "other-ca", "DNS:localhost,IP:127.0.0.1")
    srv = TlsRedis(redis_bin, tmp_path / "redis", certs).start()
    yield srv
    srv.stop()


def _context(certs: Path, *, ca: str = "ca", client: bool = True) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs / f"{ca}.crt"))
    if client:
        ctx.load_cert_chain(str(certs / "client.crt"), str(certs / "client.key"))
    return ctx


def test_a_lock_over_tls_with_a_client_certificate(tls: TlsRedis) -> None:
    url = f"rediss://localhost:{tls.tls_port}/0"
    with LockClient(RedisStreamExecutor(url, ssl_context=_context(tls.certs))) as client:
        first = client.acquire("tls-lock", ttl=5, wait=5)
        assert tls.client().exists(*tls.client().keys("lh:{tls-lock}*")) >= 1
        assert first.release() == "released"
        second = client.acquire("tls-lock", ttl=5, wait=5)
        assert second.fencing_token > first.fencing_token
        assert second.release() == "released"


def test_a_failed_handshake_grants_nothing_and_says_why(tls: TlsRedis) -> None:
    url = f"rediss://localhost:{tls.tls_port}/0"
    # The server's certificate is not from the CA the client trusts.
    client = LockClient(RedisStreamExecutor(url, ssl_context=_context(tls.certs, ca="other-ca")))
    try:
        with pytest.raises(errors.LockTimeout):
            client.acquire("tls-refused", ttl=5, wait=1.0)
        assert "certificate verify failed" in client.backend_last_error(), client.backend_last_error()
        # No connection opened, so no request was written: no cleanup release is owed.
        assert client.counters().pending_cleanups == 0
    finally:
        client.close()
    # No client certificate: the server ends the handshake.
    client = LockClient(RedisStreamExecutor(url, ssl_context=_context(tls.certs, client=False)))
    try:
        with pytest.raises(errors.LockTimeout):
            client.acquire("tls-refused", ttl=5, wait=1.0)
        # TLS 1.3: the server's refusal arrives as an alert or as the end of the TLS stream.
        why = client.backend_last_error()
        assert any(w in why for w in ("certificate required", "EOF", "closed")), why
        # The acquire waited behind HELLO, which the server never answered: never written,
        # so no cleanup release is owed either.
        assert client.counters().pending_cleanups == 0
    finally:
        client.close()
    assert tls.client().keys("lh:{tls-refused}*") == []


def test_a_shut_down_tls_stream_never_yields_raw_tls_records(tls: TlsRedis) -> None:
    """A stream shut down (by a writer that failed, or by close) while its reply waits unread:
    what the reader gets next is that reply decrypted or the end, never the TLS records
    beneath (an SSL socket's own shutdown() drops its SSL object, and its recv() then reads
    the raw socket: the core saw ``0x17 0x03 0x03`` as a reply)."""
    import select
    import socket

    from leasehold.backends.redis_stream import _Stream

    raw = socket.create_connection(("localhost", tls.tls_port), timeout=5)
    st = _Stream(1, None)
    st.io_lock = threading.Lock()
    st.sock = _context(tls.certs).wrap_socket(raw, server_hostname="localhost")
    try:
        st.sock.setblocking(False)
        assert st.send(b"*1\r\n$4\r\nPING\r\n") == 14
        assert select.select([st.sock], [], [], 5)[0], "no reply"
        st.shutdown()
        got = st.recv()
        assert got in (b"+PONG\r\n", b"", None), got
    finally:
        st.sock.close()
