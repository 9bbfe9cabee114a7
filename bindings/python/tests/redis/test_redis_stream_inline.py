"""``RedisStreamExecutor`` reads replies on the application's thread (the inline path), against
a real redis-server: an uncontended call reads its own reply; many threads share one client;
replies arrive in pieces; a connection cut in the middle of a reply; a stalled server with a
caller's timeout; an acquire that waits reads its own wake-up and grant. The bounds asserted are those the calls document (plus a margin for a loaded
machine), never a speed."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from leasehold import LockClient, ReleaseOutcome, _ffi
from leasehold.backends.redis_stream import RedisStreamExecutor
import lh_caller_bound as bound
from lh_chunk_proxy import ChunkProxy
from lh_stall_proxy import StallProxy
from polling import wait_until


class Recording(RedisStreamExecutor):
    """Counts the reads done on each thread, by who did them (the documented ``read_held``,
    the caller's reads, and the poller's ``_ready``)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.caller_reads: dict[str, int] = {}
        self.caller_streams: set[int] = set()
        self.chunks = 0
        self.poller_streams: list[int] = []
        self.poller_fed: list[int] = []
        self.widened = threading.Event()

    def read_held(self, claims: Any, timeout: float, wake: int = -1) -> Any:
        got = super().read_held(claims, timeout, wake)
        if got:
            name = threading.current_thread().name
            self.caller_reads[name] = self.caller_reads.get(name, 0) + 1
            self.chunks += len(got)
            self.caller_streams.update(stream for stream, _, _ in got)
        return got

    def _ready(self, st: Any) -> None:
        self.poller_streams.append(st.id)
        super()._ready(st)

    def open(self, req: Any, sink: Any) -> None:
        super().open(req, _CountingSink(sink, self.poller_fed))

    def hold_idle(self) -> Any:
        claims = super().hold_idle()
        self.widened.set()
        return claims


class _CountingSink:
    """The sink of a stream, noting which stream the poller thread fed bytes of (the caller's
    reads go to the core directly; ``_ready``'s attempts on a stream a caller holds read nothing)."""

    def __init__(self, sink: Any, fed: list[int]) -> None:
        self._sink, self._fed = sink, fed

    def received(self, stream: int, data: bytes) -> None:
        self._fed.append(stream)
        self._sink.received(stream, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)


def _lock_keys(r: Any, name: str) -> list[bytes]:
    return [k for k in r.keys("lh:{" + name + "}*") if b"fence" not in k and b"queue" not in k]


def test_an_uncontended_call_reads_its_reply_on_the_callers_thread(redis_server, r) -> None:  # type: ignore[no-untyped-def]
    ex = Recording(redis_server.url)
    with LockClient(ex) as c:
        c.acquire("inl-warm", ttl=10).release()  # the streams are open, the scripts loaded
        ex.caller_reads.clear()
        ex.caller_streams.clear()
        polled, fed = len(ex.poller_streams), len(ex.poller_fed)
        for _ in range(20):
            with c.acquire("inl", ttl=10) as lock:
                assert lock.fencing_token > 0
        me = threading.current_thread().name
        assert set(ex.caller_reads) == {me}
        assert ex.caller_reads[me] >= 40  # one reply per acquire and per release
        # The poller may read the subscriber's stream meanwhile, never the commands'. (A wake-up
        # of the poller for the commands' stream while the caller holds it reads nothing: the
        # caller holds the stream's read lock.)
        assert not ex.caller_streams & set(ex.poller_fed[fed:]), (
            f"a reply went through the poller thread (woken for {ex.poller_streams[polled:]})"
        )
    assert not _lock_keys(r, "inl")


def _first_lh_drained(c: LockClient) -> LockClient:
    """``c`` as on a library whose ``lh_drained`` ends at ``deadline_ns``: it writes that
    much back (``struct_size`` included) and no ``more_requests``."""
    c._core._drained.struct_size = _ffi.LH_DRAINED_V1_SIZE
    c._core._drained.more_requests = 0
    return c


def test_the_byte_path_on_a_library_with_the_first_lh_drained(redis_server, r) -> None:  # type: ignore[no-untyped-def]
    """There ``Core.step`` calls ``lh_drain`` again while a call took a request: the whole
    cycle still runs (the streams' opens and handshakes, each acquire and release, a waiter's
    wake-up and grant). The drains of several requests are checked in test_core_inputs."""
    with _first_lh_drained(LockClient(RedisStreamExecutor(redis_server.url))) as holder, _first_lh_drained(
        LockClient(RedisStreamExecutor(redis_server.url))
    ) as waiter:
        tokens = []
        for i in range(5):
            with holder.acquire("v1", ttl=10, wait=5) as lock:
                tokens.append(lock.fencing_token)
            with holder.acquire(f"v1-{i}", ttl=10) as lock:
                assert lock.fencing_token > 0
        assert tokens == sorted(set(tokens))
        h = holder.acquire("v1", ttl=10)
        got: list[Any] = []
        t = threading.Thread(target=lambda: got.append(waiter.acquire("v1", ttl=10, wait=10)))
        t.start()
        wait_until(lambda: r.zcard("lh:{v1}:queue") == 1, what="the waiter queued")
        assert h.release() == ReleaseOutcome.RELEASED
        t.join(15)
        assert got and got[0].fencing_token > h.fencing_token
        assert got[0].release() == ReleaseOutcome.RELEASED
        for c in (holder, waiter):
            assert c._core._drained.struct_size == _ffi.LH_DRAINED_V1_SIZE  # (the seam held)
    assert not _lock_keys(r, "v1")


def test_a_waiting_acquire_reads_its_wake_up_and_grant_on_its_thread(redis_server, r) -> None:  # type: ignore[no-untyped-def]
    ex = Recording(redis_server.url)
    with LockClient(RedisStreamExecutor(redis_server.url)) as holder, LockClient(ex) as waiter:
        waiter.acquire("inl-wait-warm", ttl=10).release()  # both streams open, scripts loaded
        h = holder.acquire("inl-wait", ttl=10)
        fed = len(ex.poller_fed)
        ex.caller_streams.clear()
        got: list[Any] = []
        t = threading.Thread(target=lambda: got.append(waiter.acquire("inl-wait", ttl=10, wait=10)), name="lh-waiter")
        t.start()
        # Queued, and its refusal read: the waiting thread has taken the idle streams.
        assert ex.widened.wait(10)
        assert r.zcard("lh:{inl-wait}:queue") == 1
        assert h.release() == ReleaseOutcome.RELEASED
        t.join(10)
        assert got and got[0].fencing_token > h.fencing_token
        # The wake-up came on the subscriber's stream and the grant on the commands' one; the
        # waiting thread read both, the poller thread neither.
        assert len(ex.caller_streams) == 2, (ex.caller_streams, ex.poller_fed[fed:])
        assert ex.poller_fed[fed:] == [], "the wait went through the poller thread"
        assert ex.caller_reads.get("lh-waiter", 0) >= 2
        got[0].release()


def test_many_threads_share_one_client(redis_server, r) -> None:  # type: ignore[no-untyped-def]
    ex = Recording(redis_server.url)
    errors: list[BaseException] = []
    tokens: list[int] = []
    mu = threading.Lock()
    with LockClient(ex) as c:
        start = threading.Barrier(12)

        def work(i: int) -> None:
            try:
                start.wait(10)
                for j in range(30):
                    with c.acquire(f"inl-own-{i}", ttl=10, wait=5):
                        pass
                    with c.acquire("inl-shared", ttl=10, wait=10) as lock:
                        with mu:
                            tokens.append(lock.fencing_token)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,), name=f"w{i}") for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        assert not errors, errors
        assert len(tokens) == 12 * 30 and len(set(tokens)) == len(tokens), "every grant has its own fencing token"
        assert len(ex.caller_reads) > 1, "the application threads read replies themselves"
    for name in ["inl-shared", *(f"inl-own-{i}" for i in range(12))]:
        assert not _lock_keys(r, name), name


def test_replies_split_across_reads(redis_server, r) -> None:  # type: ignore[no-untyped-def]
    proxy = ChunkProxy("127.0.0.1", redis_server.port, chunk=3)
    try:
        ex = Recording(proxy.url)
        with LockClient(ex) as c:
            c.acquire("inl-split-warm", ttl=10).release()
            ex.chunks = 0
            last = 0
            for _ in range(10):
                with c.acquire("inl-split", ttl=10) as lock:
                    assert lock.fencing_token > last
                    last = lock.fencing_token
            # Each reply (tens of bytes) came in 3-byte pieces: far more reads than replies.
            assert ex.chunks > 4 * 20, ex.chunks
        assert not _lock_keys(r, "inl-split")
    finally:
        proxy.close()


def test_a_connection_cut_in_the_middle_of_a_reply(redis_server, r) -> None:  # type: ignore[no-untyped-def]
    proxy = ChunkProxy("127.0.0.1", redis_server.port, chunk=65536, gap=0)
    try:
        with LockClient(RedisStreamExecutor(proxy.url)) as c:
            c.acquire("inl-cut-warm", ttl=10).release()
            proxy.cut_next()
            t0 = time.monotonic()
            # The first attempt's reply is cut: the core reconnects and the acquire goes on.
            with c.acquire("inl-cut", ttl=10, wait=10) as lock:
                assert lock.fencing_token > 0
                assert _lock_keys(r, "inl-cut")
            assert time.monotonic() - t0 < 10 + 2
            assert proxy.cuts == 1
            assert c.backend_last_error(), "the cut is the backend's last error"
            # And the client goes on as before.
            c.acquire("inl-cut-after", ttl=10).release()
            wait_until(lambda: not _lock_keys(r, "inl-cut"), bound=30, what="the cut lock released")
    finally:
        proxy.close()


@pytest.fixture
def stall(redis_server, r):  # type: ignore[no-untyped-def]
    p = StallProxy("127.0.0.1", redis_server.port)
    yield p
    p.close()


def test_caller_bound_release_with_a_timeout(stall, r, redis_server) -> None:  # type: ignore[no-untyped-def]
    bound.release_returns_by_its_timeout(stall, lambda: RedisStreamExecutor(stall.url), lambda: RedisStreamExecutor(redis_server.url))
    assert not _lock_keys(r, "rel")


def test_caller_bound_release_keeps_the_release_timeout(stall, r, redis_server) -> None:  # type: ignore[no-untyped-def]
    bound.release_keeps_the_release_timeout(stall, lambda: RedisStreamExecutor(stall.url), lambda: RedisStreamExecutor(redis_server.url))
    assert not _lock_keys(r, "reldef")


def test_caller_bound_acquire(stall, r, redis_server) -> None:  # type: ignore[no-untyped-def]
    bound.acquire_fails_by_its_bound(stall, lambda: RedisStreamExecutor(stall.url), lambda: RedisStreamExecutor(redis_server.url))


def test_caller_bound_renew(stall, r) -> None:  # type: ignore[no-untyped-def]
    from leasehold import errors

    with LockClient(RedisStreamExecutor(stall.url)) as c:
        h = c.acquire("inl-renew", ttl=30)
        stall.delay = bound.STALL
        t0 = time.monotonic()
        with pytest.raises(errors.RenewTimeout):
            h.renew(timeout=0.1)
        assert time.monotonic() - t0 < 0.1 + bound.MARGIN
        stall.delay = 0
        assert h.release(timeout=10) is ReleaseOutcome.RELEASED
    assert not _lock_keys(r, "inl-renew")


def test_the_select_poller_where_there_is_no_epoll(redis_server, r, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Off Linux the poller is a select loop: a waiter of another client is still woken by the
    release (a wake message read by the poller), and renewals' replies are still read."""
    import select

    monkeypatch.delattr(select, "epoll")
    with LockClient(RedisStreamExecutor(redis_server.url)) as a, LockClient(RedisStreamExecutor(redis_server.url)) as b:
        held = a.acquire("inl-select", ttl=1)
        assert a.service._poller._ep is None  # the select loop
        renewed = held.valid_until
        wait_until(lambda: held.valid_until > renewed, bound=5, what="a renewal confirmed")  # timer thread, poller
        got: list[float] = []

        def wait() -> None:
            with b.acquire("inl-select", ttl=10, wait=8) as lock:
                got.append(time.monotonic())
                assert lock.fencing_token > held.fencing_token

        t = threading.Thread(target=wait)
        t.start()
        wait_until(lambda: b.backend_counters()["subscribed"] >= 1, bound=5, what="the waiter subscribed")
        time.sleep(0.2)
        released = time.monotonic()
        held.release()
        t.join(10)
        assert got and got[0] - released < 2.0  # woken, not the idle recheck
        assert b.backend_counters()["wakeups"] >= 1
    assert not _lock_keys(r, "inl-select")


def test_a_plain_stream_waits_in_recv_and_never_blocks_a_write(redis_server) -> None:  # type: ignore[no-untyped-def]
    """A plain socket stays blocking with a receive timeout of one slice, so the caller that
    holds it waits in one recv(); every other read and every write must not block on it: a
    write the socket cannot take goes to the writer thread, a read with nothing there says
    so, and a held read with nothing there returns after its slice, not its whole timeout."""
    import socket
    import struct

    from leasehold.backends import redis_stream as rs

    ex = RedisStreamExecutor(redis_server.url)
    with LockClient(ex) as c:
        c.acquire("inl-blocking", ttl=10).release()
        (st,) = [s for s in ex._streams.values() if not s.closed][:1]
        assert st.blocking and st.sock.gettimeout() is None
        raw = st.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, len(rs._SLICE_TIMEVAL))
        sec, usec = struct.unpack("@ll", raw)
        assert sec == 0 and 0 < usec <= 2 * rs._SLICE * 1e6  # (the kernel rounds it to its tick)

    a, b = socket.socketpair()
    try:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, rs._SLICE_TIMEVAL)
        st = rs._Stream(7, None)
        st.sock, st.fd, st.blocking = a, a.fileno(), True
        ex = RedisStreamExecutor(redis_server.url)
        ex._streams[7] = st
        assert st.recv() is None  # nothing there: no wait
        big = b"x" * (8 << 20)  # more than the socket takes while its peer reads nothing
        w = threading.Thread(target=ex.write, args=(7, big), daemon=True)
        w.start()
        w.join(2.0)
        assert not w.is_alive(), "a write blocked on a full socket"
        assert st.out or st.writing  # the rest waits for the writer thread
        t0 = time.monotonic()
        assert ex.read_held([st], 30.0) == []  # nothing came: back after a slice
        assert time.monotonic() - t0 < 5.0, "a held read waited its whole timeout, not a slice"
        b.sendall(b"+OK\r\n")
        assert ex.read_held([st], 30.0) == [(7, b"+OK\r\n", "")]
    finally:
        st.closed = True  # the writer thread stops at its next look
        wait_until(lambda: not st.writing, bound=10, what="the writer thread ended")
        a.close()
        b.close()


def test_a_held_read_of_several_streams_reads_only_those_that_are_ready(redis_server) -> None:  # type: ignore[no-untyped-def]
    """A waiter holds several streams (its subscriber and its commands): after the poll it
    reads only the ones the poll reported, never a ``recv`` that would find nothing; a stream
    that ended is reported once."""
    import socket

    from leasehold.backends import redis_stream as rs

    ex = RedisStreamExecutor(redis_server.url)
    pairs = [socket.socketpair() for _ in range(3)]
    streams: list[Any] = []
    recvs: dict[int, int] = {}
    try:
        for i, (a, _) in enumerate(pairs):
            a.setblocking(False)
            st = rs._Stream(10 + i, None)
            st.sock, st.fd = a, a.fileno()
            plain = st.recv

            def counted(plain: Any = plain, sid: int = st.id) -> Any:
                recvs[sid] = recvs.get(sid, 0) + 1
                return plain()

            st.recv = counted  # type: ignore[method-assign]
            ex._streams[st.id] = st
            streams.append(st)
        assert ex.read_held(streams, 0.05) == []  # nothing there: nothing read
        assert recvs == {}
        pairs[1][1].sendall(b"+OK\r\n")
        assert ex.read_held(streams, 5.0) == [(11, b"+OK\r\n", "")]
        assert recvs == {11: 1}, recvs
        pairs[2][1].close()  # its peer ends
        assert ex.read_held(streams, 5.0) == [(12, b"", rs._EOF)]
        assert recvs == {11: 1, 12: 1}, recvs
        assert ex.read_held(streams, 0.05) == []  # reported once; the rest has nothing
        assert recvs == {11: 1, 12: 1}, recvs
    finally:
        for a, b in pairs:
            a.close()
            b.close()
