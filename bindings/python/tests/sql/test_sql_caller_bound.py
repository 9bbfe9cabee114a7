"""PostgresExecutor keeps an application call's bound when the server stalls: the call waits
for its request at most to its deadline, and the transaction ends (committed or rolled back)
in the background. A proxy holds back every reply of the real PostgreSQL server."""

from __future__ import annotations

import threading
import urllib.parse

import pytest

import lh_caller_bound as bound
from leasehold import LockClient, ReleaseOutcome
from leasehold.backends.sql_executor import PostgresExecutor
from lh_stall_proxy import StallProxy
from polling import wait_until


@pytest.fixture
def proxy(pg_url: str):  # type: ignore[no-untyped-def]
    u = urllib.parse.urlsplit(pg_url)
    p = StallProxy("127.0.0.1", u.port or 5432)
    p.pg_url = urllib.parse.urlunsplit(u._replace(netloc=f"{u.username}:{u.password}@127.0.0.1:{p.port}"))
    yield p
    p.close()


def _stalled(proxy: StallProxy):  # type: ignore[no-untyped-def]
    return lambda: PostgresExecutor(proxy.pg_url, request_timeout=10.0)


def test_release_with_a_timeout_returns_by_it_and_the_release_completes_later(proxy, pg_url) -> None:  # type: ignore[no-untyped-def]
    bound.release_returns_by_its_timeout(proxy, _stalled(proxy), lambda: PostgresExecutor(pg_url))


def test_release_without_a_timeout_keeps_the_release_timeout(proxy, pg_url) -> None:  # type: ignore[no-untyped-def]
    bound.release_keeps_the_release_timeout(proxy, _stalled(proxy), lambda: PostgresExecutor(pg_url))


def test_acquire_fails_by_its_bound_and_leaks_no_lock(proxy, pg_url) -> None:  # type: ignore[no-untyped-def]
    bound.acquire_fails_by_its_bound(proxy, _stalled(proxy), lambda: PostgresExecutor(pg_url))


def test_a_transaction_past_the_deadline_ends_before_the_next_request_runs(proxy, pg_url) -> None:  # type: ignore[no-untyped-def]
    """The commands connection is never shared with a transaction left open: the requests
    after a deferred one wait for it to end, and all of them are answered."""
    with LockClient(_stalled(proxy)()) as c:
        a = c.acquire("x1", ttl=30)
        proxy.delay = 0.5
        assert a.release(timeout=0.05) is ReleaseOutcome.RELEASED
        b = c.acquire("x2", ttl=30, wait=5)  # runs after the release's transaction ended
        proxy.delay = 0
        b.release()
        wait_until(lambda: c.counters().releases_confirmed == 2, bound=30, what="both releases confirmed")
    with LockClient(PostgresExecutor(pg_url)) as other:
        other.acquire("x1", ttl=5, wait=0).release()
        other.acquire("x2", ttl=5, wait=0).release()


def test_a_subclass_wrapping_execute_alone_is_still_called(pg_url) -> None:  # type: ignore[no-untyped-def]
    seen: list[str] = []

    class Recording(PostgresExecutor):
        def execute(self, request, sink=None):  # type: ignore[no-untyped-def]
            seen.append(threading.current_thread().name)
            return super().execute(request, sink)

    with LockClient(Recording(pg_url)) as c:
        c.acquire("wrapped", ttl=30).release()
    assert seen
