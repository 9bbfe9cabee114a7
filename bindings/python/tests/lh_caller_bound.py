"""The checks of an application call's bound against a stalled server, shared by the backends'
tests: a :class:`~lh_stall_proxy.StallProxy` holds back every reply for ``STALL`` seconds.
The bounds asserted are those the calls document (plus a margin for a loaded machine),
never a speed."""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest

from leasehold import Config, LockClient, LockTimeout, ReleaseOutcome
from lh_stall_proxy import StallProxy
from polling import wait_until

STALL = 1.5
MARGIN = 0.5
REQUEST_TIMEOUT = Config(request_timeout_ns=300_000_000)  # an acquire's bound: wait + 0.3 s


def _free_for_another(direct: Callable[[], Any], name: str) -> None:
    """A client on the unstalled server gets ``name`` at once: nothing leaked it."""
    with LockClient(direct()) as other:
        other.acquire(name, ttl=5, wait=0).release()


def release_returns_by_its_timeout(proxy: StallProxy, stalled: Callable[[], Any], direct: Callable[[], Any]) -> None:
    """``release(timeout=0.1)`` returns RELEASED by its bound; the release completes later."""
    with LockClient(stalled()) as c:
        h = c.acquire("rel", ttl=30, wait=30)  # (wait: a slow first connect is retried)
        proxy.delay = STALL
        t0 = time.monotonic()
        out = h.release(timeout=0.1)
        took = time.monotonic() - t0
        assert out is ReleaseOutcome.RELEASED and not h.is_held()
        assert took < 0.1 + MARGIN, f"release(timeout=0.1) took {took:.3f}s"
        proxy.delay = 0
        wait_until(lambda: c.counters().releases_confirmed == 1, bound=30, what="the release confirmed")
    _free_for_another(direct, "rel")


def release_keeps_the_release_timeout(proxy: StallProxy, stalled: Callable[[], Any], direct: Callable[[], Any]) -> None:
    """``release()`` waits at most the release timeout (the request timeout, 0.3 s)."""
    with LockClient(stalled(), config=REQUEST_TIMEOUT) as c:
        h = c.acquire("reldef", ttl=30, wait=30)  # (wait: a slow first connect is retried)
        proxy.delay = STALL
        t0 = time.monotonic()
        out = h.release()
        took = time.monotonic() - t0
        assert out is ReleaseOutcome.RELEASED and not h.is_held()
        assert took < 0.3 + MARGIN, f"release() took {took:.3f}s"
        proxy.delay = 0
        wait_until(lambda: c.counters().pending_cleanups == 0 and c.counters().live_leases == 0, bound=30)
    _free_for_another(direct, "reldef")


def acquire_fails_by_its_bound(proxy: StallProxy, stalled: Callable[[], Any], direct: Callable[[], Any]) -> None:
    """``acquire(wait=0.1)`` fails by the wait plus one request timeout; whatever the stalled
    requests did on the server is undone: no lock leaks."""
    with LockClient(stalled(), config=REQUEST_TIMEOUT) as c:
        # Connections and schema ready, so the stall is the IO's. The wait retries a first
        # connect or migration slower than the 0.3 s request timeout (a loaded machine).
        c.acquire("warm", ttl=30, wait=30).release()
        proxy.delay = STALL
        t0 = time.monotonic()
        with pytest.raises(LockTimeout):
            c.acquire("acq", ttl=30, wait=0.1)
        took = time.monotonic() - t0
        assert took < 0.1 + 0.3 + MARGIN, f"acquire(wait=0.1) took {took:.3f}s"
        proxy.delay = 0
        wait_until(
            lambda: c.counters().live_leases == 0 and c.counters().pending_cleanups == 0,
            bound=30,
            what="no live lease nor cleanup",
        )
        _free_for_another(direct, "acq")
