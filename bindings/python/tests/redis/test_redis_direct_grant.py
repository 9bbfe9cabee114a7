"""Direct grants (Redis protocol 3) through LockClient: a release hands the lock to the oldest
queued lease and tells its client with a grant notice, so the next holder sends no ACQUIRE.

As in test_redis_lockclient.py, the holder's TTL (120 s) exceeds every waiter's budget, so a
waiter can only get the lock through the mechanism under test, never by its retry timer.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
import polling  # noqa: E402

from leasehold import LockClient, errors  # noqa: E402
from leasehold.aio import AsyncLockClient  # noqa: E402
from leasehold.backends import redis_protocol as proto  # noqa: E402
from leasehold.backends.redis_async import AsyncRedisLockService  # noqa: E402
from test_redis_lockclient import Acquirer, queued, queued_tokens, service  # noqa: E402


def wait_for(pred: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> None:
    polling.wait_until(pred, timeout, 0.01, what)


def settled(c: LockClient, horizon_s: float = 20.0) -> Callable[[], bool]:
    """Nothing in flight and no core timer due within ``horizon_s``: past the quick attempts,
    a waiter sleeps until the holder's 120 s TTL hint, so only a release can hand over."""

    def check() -> bool:
        dl = c._deadline
        return (dl is None or dl - c._now() > horizon_s * 1e9) and c.wait_idle(0.05) and c._side_pending == 0

    return check


def test_a_release_grants_the_queued_waiter_without_its_acquire(redis_server, r):
    with LockClient(service(redis_server.url)) as holder, LockClient(service(redis_server.url)) as c:
        h = holder.acquire("direct", ttl=120.0)
        w = Acquirer(c, "direct", ttl=10.0, wait=60.0)
        w.start()
        wait_for(lambda: len(queued_tokens(r, "direct")) == 1, what="the waiter queued")
        wait_for(settled(c), what="the waiter asleep")
        sent = c.counters().acquires_sent
        k = proto.keys_for("direct")
        [token] = queued_tokens(r, "direct")
        # Every attempt of the waiter was sent before this; the grant must be dated no later.
        attempts_done_ns = time.monotonic_ns()
        time.sleep(0.3)  # more than the drift allowance (10 s: 102 ms), so a later date shows
        t0 = time.monotonic()
        h.release()
        w.join(30)
        assert w.error is None and w.handle is not None, w.error
        assert time.monotonic() - t0 < 20, "handed over by the release, not by a timer"
        assert c.counters().acquires_sent == sent, "no ACQUIRE: the release granted the lock"
        assert c._grant_notices == 1
        assert w.handle.fencing_token > h.fencing_token
        assert int(r.hget(k.lock, "fence")) == w.handle.fencing_token
        assert r.hget(k.lock, "token").decode() == token
        # Validity is counted from the send time of the attempt that queued it, which was
        # before ``attempts_done_ns``, not from the notice's arrival 0.3 s later.
        assert w.handle.valid_until_ns is not None
        assert w.handle.valid_until_ns <= attempts_done_ns + 10_000_000_000
        assert w.handle.remaining() > 0
        assert queued(r, "direct") == [] and r.hlen(k.grants) == 0
        wait_for(lambda: c.counters().renewals_ok >= 1, what="a renewal of the granted lease")
        w.handle.release()
        assert not r.exists(k.lock)


def test_a_waiter_that_gave_up_takes_its_entry_out_of_the_queue(redis_server, r):
    with LockClient(service(redis_server.url)) as holder, LockClient(
        service(redis_server.url)
    ) as quitter, LockClient(service(redis_server.url)) as c:
        h = holder.acquire("quit", ttl=120.0)
        q = Acquirer(quitter, "quit", ttl=10.0, wait=2.0)
        q.start()
        wait_for(lambda: len(queued_tokens(r, "quit")) == 1, what="the quitter queued")
        w = Acquirer(c, "quit", ttl=10.0, wait=60.0)
        w.start()
        wait_for(lambda: len(queued_tokens(r, "quit")) == 2, what="the waiter queued behind it")
        q.join(30)
        assert isinstance(q.error, errors.LockTimeout), q.error
        wait_for(lambda: len(queued_tokens(r, "quit")) == 1, what="the quitter's entry gone")
        assert r.hlen(proto.keys_for("quit").grants) == 1
        wait_for(settled(c), what="the waiter asleep")
        # Fences count up by one from here (above the server clock), so a spent one shows.
        secs, usecs = r.time()
        ahead = (secs * 1_000_000 + usecs) + 10**12
        r.set(proto.keys_for("quit").fence, ahead)
        h.release()
        w.join(30)
        assert w.error is None and w.handle is not None, w.error
        assert w.handle.fencing_token == ahead + 1, "granted directly, no fence spent on the quitter"
        w.handle.release()


def test_a_grant_for_a_waiter_that_gave_up_goes_to_the_next(redis_server, r):
    """The first queued waiter timed out and its entry stayed behind (its removal failed, or an
    attempt still in flight queued it again); the release grants it, its client's core finds
    no lease for the token (NotOurs) and the client releases the grant, which goes on."""
    quitter_svc = service(redis_server.url)
    quitter_svc.forget_queued = lambda *a: None  # type: ignore[method-assign]
    with LockClient(service(redis_server.url)) as holder, LockClient(quitter_svc) as quitter, LockClient(
        service(redis_server.url)
    ) as c:
        h = holder.acquire("gave-up", ttl=120.0)
        q = Acquirer(quitter, "gave-up", ttl=10.0, wait=2.0)
        q.start()
        wait_for(lambda: len(queued_tokens(r, "gave-up")) == 1, what="the quitter queued")
        w = Acquirer(c, "gave-up", ttl=10.0, wait=60.0)
        w.start()
        wait_for(lambda: len(queued_tokens(r, "gave-up")) == 2, what="the waiter queued behind it")
        q.join(30)
        assert isinstance(q.error, errors.LockTimeout), q.error
        assert len(queued_tokens(r, "gave-up")) == 2, "the quitter's entry stays behind"
        wait_for(settled(c), what="the waiter asleep")
        h.release()
        w.join(30)
        assert w.error is None and w.handle is not None, w.error
        assert w.handle.fencing_token > h.fencing_token + 1, "a fence went to the quitter's grant first"
        assert c._grant_notices == 1
        assert queued(r, "gave-up") == []
        w.handle.release()


def test_a_grant_for_a_forgotten_lease_of_a_client_that_still_waits_is_released_by_the_host(redis_server, r):
    """Same, but the quitter's client still waits for the name with another lease (and the
    quitter's entry stayed behind): the notice reaches the core, which no longer knows the
    token (NotOurs), so the client releases it and the grant goes on to its other lease."""
    csvc = service(redis_server.url)
    csvc.forget_queued = lambda *a: None  # type: ignore[method-assign]
    with LockClient(service(redis_server.url)) as holder, LockClient(csvc) as c:
        h = holder.acquire("forgotten", ttl=120.0)
        q = Acquirer(c, "forgotten", ttl=10.0, wait=2.0)
        q.start()
        wait_for(lambda: len(queued_tokens(r, "forgotten")) == 1, what="the quitter queued")
        w = Acquirer(c, "forgotten", ttl=10.0, wait=60.0)
        w.start()
        wait_for(lambda: len(queued_tokens(r, "forgotten")) == 2, what="the waiter queued behind it")
        q.join(30)
        assert isinstance(q.error, errors.LockTimeout), q.error
        wait_for(settled(c), what="the waiter asleep")
        h.release()
        w.join(30)
        assert w.error is None and w.handle is not None, w.error
        assert w.handle.fencing_token > h.fencing_token + 1
        assert queued(r, "forgotten") == []
        w.handle.release()


def test_a_protocol_2_releaser_wakes_a_protocol_3_waiter_which_then_asks(redis_server, r):
    """A holder that releases with the 2-key form (an older host, or ``direct_grants=False``)
    wakes the queued lease's client with the plain name; the waiter then sends its ACQUIRE."""
    with LockClient(service(redis_server.url, direct_grants=False)) as holder, LockClient(
        service(redis_server.url)
    ) as c:
        h = holder.acquire("mixed", ttl=120.0)
        w = Acquirer(c, "mixed", ttl=10.0, wait=60.0)
        w.start()
        wait_for(lambda: len(queued_tokens(r, "mixed")) == 1, what="the waiter queued")
        wait_for(settled(c), what="the waiter asleep")
        sent = c.counters().acquires_sent
        h.release()
        w.join(30)
        assert w.error is None and w.handle is not None, w.error
        assert c.counters().acquires_sent == sent + 1, "woken, it asked once"
        assert c._grant_notices == 0
        assert w.handle.fencing_token > h.fencing_token
        w.handle.release()


def test_a_grant_to_a_client_that_closed_is_released_or_passed_on(redis_server, r):
    """The queued lease's client closed: its wake channel has no subscriber any more, so the
    release grants that lease nothing (no fence spent) and grants the next queued lease."""
    with LockClient(service(redis_server.url)) as holder, LockClient(service(redis_server.url)) as c:
        gone = LockClient(service(redis_server.url))
        h = holder.acquire("closed", ttl=120.0)
        g = Acquirer(gone, "closed", ttl=10.0, wait=60.0)
        g.start()
        wait_for(lambda: len(queued_tokens(r, "closed")) == 1, what="the first waiter queued")
        w = Acquirer(c, "closed", ttl=10.0, wait=60.0)
        w.start()
        wait_for(lambda: len(queued_tokens(r, "closed")) == 2, what="the second queued")
        gone.close()
        g.join(30)
        assert isinstance(g.error, errors.ClientClosed), g.error
        wait_for(settled(c), what="the waiter asleep")
        secs, usecs = r.time()
        ahead = (secs * 1_000_000 + usecs) + 10**12  # fences count up by one from here
        r.set(proto.keys_for("closed").fence, ahead)
        h.release()
        w.join(30)
        assert w.error is None and w.handle is not None, w.error
        assert c._grant_notices == 1
        assert w.handle.fencing_token == ahead + 1, "the closed client's lease got no grant at all"
        w.handle.release()


def test_asyncio_clients_hand_over_by_direct_grant(redis_server, r):
    """The asyncio twin: the waiting AsyncLockClient gets the lock from the release's notice,
    without an ACQUIRE of its own; a queued lease that gave up meanwhile (its grant reaches a
    core that no longer knows it) is released by the client and the grant moves on."""

    async def main() -> None:
        holder_svc = AsyncRedisLockService.from_url(redis_server.url)
        b_svc = AsyncRedisLockService.from_url(redis_server.url)

        async def keep_entry(name: str, token: str) -> None:  # the quitter's entry stays behind
            return None

        b_svc.forget_queued = keep_entry  # type: ignore[method-assign]
        async with AsyncLockClient(holder_svc) as a, AsyncLockClient(b_svc) as b:
            h = await a.acquire("aio-direct", ttl=120.0)
            quitter = asyncio.ensure_future(b.acquire("aio-direct", ttl=5.0, wait=1.0))
            while len(queued_tokens(r, "aio-direct")) != 1:
                await asyncio.sleep(0.01)
            task = asyncio.ensure_future(b.acquire("aio-direct", ttl=5.0, wait=60.0))
            while len(queued_tokens(r, "aio-direct")) != 2:
                await asyncio.sleep(0.01)
            try:
                await quitter
                raise AssertionError("the quitter got the lock")
            except errors.LockTimeout:
                pass
            # Past the waiter's quick attempts: asleep on the 120 s hint, nothing in flight.
            while b._deadline is not None and b._deadline - time.monotonic_ns() < 20 * 10**9 or b._requests:
                await asyncio.sleep(0.01)
            sent = b.counters().acquires_sent
            await h.release()
            h2 = await asyncio.wait_for(task, 30)
            assert h2.fencing_token > h.fencing_token + 1, "a fence went to the quitter's grant first"
            assert b.counters().acquires_sent == sent, "granted by the release, no ACQUIRE"
            assert b._grant_notices == 1
            assert queued(r, "aio-direct") == []
            await h2.release()
            assert not r.exists(proto.keys_for("aio-direct").lock)

    asyncio.run(asyncio.wait_for(main(), 120))


def test_a_late_notice_for_a_lease_that_holds_already_never_releases_it(redis_server, r):
    """The waiter's own ACQUIRE can win the race with its notice: the lease holds, the client
    stops waiting for the name, and then the notice arrives. It must reach the core (which
    ignores it), not be released as nobody's: that would free a lock a live lease holds."""
    with LockClient(service(redis_server.url)) as holder, LockClient(service(redis_server.url)) as c:
        # c waits once (as any waiter would), so its service knows where notices go.
        h = holder.acquire("first", ttl=120.0)
        w = Acquirer(c, "first", ttl=10.0, wait=60.0)
        w.start()
        wait_for(lambda: len(queued_tokens(r, "first")) == 1, what="the waiter queued")
        h.release()
        w.join(30)
        assert w.handle is not None, w.error
        w.handle.release()
        mine = c.acquire("late", ttl=10.0)
        k = proto.keys_for("late")
        token = r.hget(k.lock, "token").decode()
        stale = c.counters().stale_results
        # A tag names one of the lease's own attempts (request ids carry the lease's slot in
        # their low 24 bits): here its first, the kind of old attempt a late notice names.
        tag = (1 << 24) | (mine.lease_id & (2**24 - 1))
        notice = b"\0grant %d %d 10000 %d %s%s" % (tag, mine.fencing_token, len(token), token.encode(), b"late")
        assert r.publish(c.service.wake_channel, notice) == 1
        wait_for(lambda: c.counters().stale_results > stale, what="the core saw the notice")
        time.sleep(0.2)
        assert r.hget(k.lock, "token").decode() == token, "the held lock was not released"
        assert mine.is_held()
        mine.release()
        assert not r.exists(k.lock)


def test_a_grant_route_goes_to_the_one_client_and_to_all_once_two_shared_the_service():
    class Client:
        def woken(self, name: str, notice: object = None) -> bool:
            return True

    a, b = Client(), Client()
    route = proto.GrantRoute()
    assert route.clients == [] and not route.shared(), "before any waiter: nothing of ours holds it"
    route.saw(a.woken)
    route.saw(a.woken)
    assert route.clients == [a.woken] and not route.shared()
    route.saw(b.woken)
    assert route.clients == [a.woken, b.woken] and route.shared()
    route.saw(a.woken)
    assert len(route.clients) == 2

def test_a_service_two_clients_share_stops_tagging_and_hands_over_as_protocol_2(redis_server, r):
    """Wake-up callbacks are per name, so on a shared service a notice goes to every client
    (marked shared: a core that does not own the token must not release it). Once a second
    client waits through it, the service queues plain (protocol-2) entries: a release wakes
    the client, which asks."""
    shared = service(redis_server.url)
    with LockClient(service(redis_server.url)) as holder, LockClient(
        shared, owns_service=False
    ) as c1, LockClient(shared, owns_service=False) as c2:
        try:
            holders = [holder.acquire(n, ttl=120.0) for n in ("sh-a", "sh-b", "sh-c")]
            first = Acquirer(c1, "sh-a", ttl=10.0, wait=60.0)
            first.start()
            wait_for(lambda: len(queued_tokens(r, "sh-a")) == 1, what="a tagged entry while one client waits")
            second = Acquirer(c2, "sh-b", ttl=10.0, wait=60.0)
            second.start()
            wait_for(lambda: queued(r, "sh-b") == [shared.wake_channel], what="the second client queued")
            assert queued_tokens(r, "sh-b") == [], "shared: no tags any more"
            w = Acquirer(c1, "sh-c", ttl=10.0, wait=60.0)
            w.start()
            wait_for(lambda: queued(r, "sh-c") == [shared.wake_channel], what="a plain entry")
            assert queued_tokens(r, "sh-c") == []
            holders[2].release()
            w.join(30)
            assert w.error is None and w.handle is not None, w.error
            assert w.handle.fencing_token > holders[2].fencing_token
            w.handle.release()
            holders[1].release()
            second.join(30)
            assert second.handle is not None, second.error
            second.handle.release()
            # The entry tagged before the service was shared gets its grant: the notice, marked
            # shared, goes to both clients; c1's core owns the token and takes it.
            holders[0].release()
            first.join(30)
            assert first.handle is not None, first.error
            # c2's core does not own the token and must not release c1's grant.
            wait_for(lambda: c2._side_pending == 0, what="c2 done with the notice")
            time.sleep(0.3)
            assert r.hget(proto.keys_for("sh-a").lock, "token") is not None, "c1's lock still held"
            assert first.handle.is_held()
            first.handle.release()
        finally:
            shared.close()
