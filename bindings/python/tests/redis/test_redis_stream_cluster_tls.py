"""``rediss+cluster://`` on a real Redis Cluster that serves TLS only (3 masters, 3 replicas;
the cluster bus and replication on TLS too), with a CA the test makes. The core learns each
node's TLS port from the topology (``port`` is 0 there), checks every master's certificate
for the address the topology gives, and routes names and wake-ups as on plain TCP; a client
that does not trust the cluster's CA is granted nothing and says why."""

from __future__ import annotations

import ssl
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from leasehold import LockClient, errors
from leasehold.backends.redis_stream import RedisStreamExecutor

from lh_certs import make_ca, make_cert, require_openssl
from lh_cluster import ClusterTopology
from test_redis_stream_cluster import _lock_key, names_on_masters


@pytest.fixture(scope="module")
def tls_cluster(redis_bin: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    require_openssl()
    certs = tmp_path_factory.mktemp("cluster-certs")
    make_ca(certs, "ca")
    make_ca(certs, "other-ca")
    make_cert(certs, "server", "ca", "DNS:localhost,IP:127.0.0.1")
    t = ClusterTopology(tmp_path_factory.mktemp("stream-cluster-tls"), tls=certs)
    try:
        yield t.start()
    finally:
        t.stop()


def _client(t: ClusterTopology, ca: str = "ca") -> LockClient:
    assert t.tls is not None
    ctx = ssl.create_default_context(cafile=str(Path(t.tls) / f"{ca}.crt"))
    return LockClient(RedisStreamExecutor("rediss+cluster://" + ",".join(t.nodes), ssl_context=ctx))


def test_names_on_every_master_and_a_wake_up_over_tls(tls_cluster: ClusterTopology) -> None:
    t = tls_cluster
    names = names_on_masters(t, "tls-")
    a, b = _client(t), _client(t)
    try:
        for master, name in names.items():
            lease = a.acquire(name, ttl=5, wait=5)
            assert t.node(master).exists(_lock_key(name)) == 1, (master, name)
            assert lease.release() == "released"
        # A holder with a long TTL: the waiter can only get the name through its shard's
        # wake-up (published on the owning master) within the bound below.
        name = next(iter(names.values()))
        held = a.acquire(name, ttl=60, wait=5)
        got: dict[str, Any] = {}

        def wait() -> None:
            try:
                got["lease"] = b.acquire(name, ttl=5, wait=20)
            except Exception as e:  # reported below
                got["error"] = e

        th = threading.Thread(target=wait)
        th.start()
        time.sleep(0.5)
        released_at = time.monotonic()
        assert held.release() == "released"
        th.join(20)
        assert "lease" in got, got
        assert time.monotonic() - released_at < 5
        assert got["lease"].fencing_token > held.fencing_token
        assert got["lease"].release() == "released"
    finally:
        a.close()
        b.close()


def test_a_cluster_certificate_from_another_ca_grants_nothing(tls_cluster: ClusterTopology) -> None:
    t = tls_cluster
    client = _client(t, ca="other-ca")
    try:
        with pytest.raises(errors.LockTimeout):
            client.acquire("tls-refused", ttl=5, wait=1.0)
        assert "certificate verify failed" in client.backend_last_error(), client.backend_last_error()
    finally:
        client.close(timeout=0.1)
    master, _ = t.shard_of(_lock_key("tls-refused"))
    assert t.node(master).exists(_lock_key("tls-refused")) == 0
