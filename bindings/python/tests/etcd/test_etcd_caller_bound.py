"""EtcdExecutor keeps an application call's bound when a member stalls: the call waits for a
reply at most to its deadline, and the reply is read in the background. A proxy holds back
every reply of one real etcd member."""

from __future__ import annotations

import threading
import urllib.parse

import pytest

import lh_caller_bound as bound
from leasehold import LockClient
from leasehold.backends.etcd_executor import EtcdExecutor
from lh_stall_proxy import StallProxy


@pytest.fixture
def proxy(etcd_cluster):  # type: ignore[no-untyped-def]
    u = urllib.parse.urlsplit(etcd_cluster.urls[0])
    p = StallProxy("127.0.0.1", u.port or 2379)
    yield p
    p.close()


def _stalled(proxy: StallProxy):  # type: ignore[no-untyped-def]
    # One member only (no failover to an unstalled one); its timeout above the stall.
    return lambda: EtcdExecutor([f"http://127.0.0.1:{proxy.port}"], timeout=5.0)


def test_release_with_a_timeout_returns_by_it_and_the_release_completes_later(proxy, etcd_cluster) -> None:  # type: ignore[no-untyped-def]
    bound.release_returns_by_its_timeout(proxy, _stalled(proxy), lambda: EtcdExecutor(etcd_cluster.urls))


def test_release_without_a_timeout_keeps_the_release_timeout(proxy, etcd_cluster) -> None:  # type: ignore[no-untyped-def]
    bound.release_keeps_the_release_timeout(proxy, _stalled(proxy), lambda: EtcdExecutor(etcd_cluster.urls))


def test_acquire_fails_by_its_bound_and_leaks_no_lock(proxy, etcd_cluster) -> None:  # type: ignore[no-untyped-def]
    bound.acquire_fails_by_its_bound(proxy, _stalled(proxy), lambda: EtcdExecutor(etcd_cluster.urls))


def test_uncontended_calls_run_on_the_callers_thread(proxy) -> None:  # type: ignore[no-untyped-def]
    seen: list[str] = []

    class Recording(EtcdExecutor):
        def post_within(self, req, timeout):  # type: ignore[no-untyped-def]
            seen.append(threading.current_thread().name)
            return super().post_within(req, timeout)

    with LockClient(Recording([f"http://127.0.0.1:{proxy.port}"])) as r:
        r.acquire("fast", ttl=30).release()
    assert seen and set(seen) == {threading.current_thread().name}
