"""EtcdExecutor against a hostile member: a reply body or watch message over the core's limit
(``LH_MAX_REPLY_DATA``) fails as a transport error and the connection is closed instead of
read on, a body dripped byte by byte cannot hold a request, a body cut short is refused.

The member is a raw HTTP server on 127.0.0.1 started by each test; it counts the bytes the
kernel accepted from it and notes when the client closed under it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from leasehold import LockClient, errors
from leasehold._ffi import LH_IO_HTTP, LH_IO_HTTP_WATCH, LH_MAX_REPLY_DATA
from leasehold._core import HttpRequest
from leasehold.backends.etcd_executor import EtcdExecutor

HUGE = 64 << 20  # what the hostile member offers: the old executor read all of it
PIECE = 1 << 16
# Far below HUGE: what the kernel buffers hold plus what the client may read (the limit + 1).
READ_BOUND = LH_MAX_REPLY_DATA + (12 << 20)


class HostileMember:
    """Answers every request per ``mode`` and records, per connection, the bytes sent and
    whether the peer closed while it was still sending."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sent: list[int] = []
        self.peer_closed: list[bool] = []
        self.finished = threading.Event()
        self._lsock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._lsock.getsockname()[1]}"
        self._stop = False
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._lsock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PIECE)
        conn.settimeout(15)  # a client that neither reads nor closes fails the test, not hangs it
        sent, closed = 0, False
        try:
            self._read_request(conn)
            for data in self._reply():
                view = memoryview(data)
                while view:
                    n = conn.send(view)
                    sent += n
                    view = view[n:]
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        except OSError:
            pass
        finally:
            conn.close()
            self.sent.append(sent)
            self.peer_closed.append(closed)
            self.finished.set()

    @staticmethod
    def _read_request(conn: socket.socket) -> None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            got = conn.recv(4096)
            if not got:
                raise OSError("no request")
            buf += got
        head, body = buf.split(b"\r\n\r\n", 1)
        length = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v)
        while len(body) < length:
            body += conn.recv(4096)

    def _reply(self) -> Iterator[bytes]:
        if self.mode == "length":  # advertises 64 MiB, then sends it
            yield f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {HUGE}\r\n\r\n".encode()
            for _ in range(HUGE // PIECE):
                yield b" " * PIECE
        elif self.mode in ("chunked", "watch"):  # no length: chunks of one endless line
            yield b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            for _ in range(HUGE // PIECE):
                yield b"%x\r\n" % PIECE + b"x" * PIECE + b"\r\n"
            yield b"0\r\n\r\n"
        elif self.mode == "eof":  # no length, no chunks: the body runs to the connection's end
            yield b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
            for _ in range(HUGE // PIECE):
                yield b" " * PIECE
        elif self.mode == "drip":  # a small body, one byte at a time
            yield b"HTTP/1.1 200 OK\r\nContent-Length: 200\r\n\r\n"
            for _ in range(200):
                time.sleep(0.1)
                yield b" "
        elif self.mode == "short":  # promises 100 bytes, sends 10, closes
            yield b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b" " * 10
        elif self.mode.startswith("exact-"):  # exactly the limit: still a reply
            body = b" " * LH_MAX_REPLY_DATA
            if self.mode == "exact-length":
                yield f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
            else:
                yield b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                yield b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
        else:  # pragma: no cover
            raise AssertionError(self.mode)

    def close(self) -> None:
        self._stop = True
        self._lsock.close()
        for t in self._threads:
            t.join(20)


@pytest.fixture
def member(request: pytest.FixtureRequest) -> Iterator[HostileMember]:
    m = HostileMember(request.param)
    try:
        yield m
    finally:
        m.close()


def _unary() -> HttpRequest:
    return HttpRequest(LH_IO_HTTP, "POST", "/v3/kv/range", b'{"key":"eA=="}', "")


def _wait_finished(m: HostileMember, bound: float = 10.0) -> None:
    assert m.finished.wait(bound), "the hostile member is still sending: the client neither read on nor closed"


@pytest.mark.parametrize("member", ["length", "chunked", "eof"], indirect=True)
def test_an_oversized_reply_fails_at_once_and_the_connection_is_closed_unread(member: HostileMember) -> None:
    ex = EtcdExecutor([member.url], timeout=5)
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="over the limit"):
        ex.post(_unary())
    assert time.monotonic() - start < 5
    _wait_finished(member)
    # The member saw the client go away after far less than the body it offered.
    assert member.peer_closed == [True]
    assert member.sent[0] < READ_BOUND < HUGE, member.sent
    ex.close()


@pytest.mark.parametrize("member", ["exact-length", "exact-chunked"], indirect=True)
def test_a_reply_of_exactly_the_limit_is_handed_back_whole(member: HostileMember) -> None:
    ex = EtcdExecutor([member.url], timeout=5)
    status, body = ex.post(_unary())
    assert status == 200 and body == b" " * LH_MAX_REPLY_DATA
    ex.close()


@pytest.mark.parametrize("member", ["drip"], indirect=True)
def test_a_dripped_body_cannot_hold_a_request_past_the_timeout(member: HostileMember) -> None:
    ex = EtcdExecutor([member.url], timeout=1)
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="not complete within 1 s"):
        ex.post(_unary())
    # Each read waits at most the timeout, and the deadline is checked after each.
    assert time.monotonic() - start < 3.5
    _wait_finished(member)
    assert member.peer_closed == [True] and member.sent[0] < 200 + 100


@pytest.mark.parametrize("member", ["short"], indirect=True)
def test_a_body_cut_short_is_refused(member: HostileMember) -> None:
    ex = EtcdExecutor([member.url], timeout=5)
    with pytest.raises(ConnectionError, match="cut short"):
        ex.post(_unary())


class _Sink:
    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.ended: list[str] = []
        self.done = threading.Event()

    def stream_message(self, rid: int, message: bytes) -> None:
        self.messages.append(message)

    def stream_ended(self, rid: int, message: str) -> None:
        self.ended.append(message)
        self.done.set()


@pytest.mark.parametrize("member", ["watch"], indirect=True)
def test_a_watch_message_over_the_limit_ends_the_stream_unread(member: HostileMember) -> None:
    ex = EtcdExecutor([member.url], timeout=5)
    sink = _Sink()
    ex.watch(7, HttpRequest(LH_IO_HTTP_WATCH, "POST", "/v3/watch", b"{}", ""), sink)
    assert sink.done.wait(10), "the stream did not end"
    assert sink.messages == []
    assert len(sink.ended) == 1 and "over the limit" in sink.ended[0]
    _wait_finished(member)
    assert member.peer_closed == [True]
    assert member.sent[0] < READ_BOUND < HUGE, member.sent
    ex.close()


@pytest.mark.parametrize("member", ["length"], indirect=True)
def test_a_client_on_an_oversized_member_fails_its_acquire_as_unavailable(member: HostileMember) -> None:
    with LockClient(EtcdExecutor([member.url], timeout=2)) as client:
        start = time.monotonic()
        with pytest.raises(errors.LockTimeout):
            client.acquire("big-body", ttl=5, wait=1.5)
        assert time.monotonic() - start < 10
    _wait_finished(member)
    assert member.sent and all(member.peer_closed), member.peer_closed
    assert max(member.sent) < READ_BOUND, member.sent
