"""A kept-alive connection carries each request exactly once: a member that answers with
Content-Length bodies over one connection sees every POST once, in order, whichever way the
body was sized (the pooled connection is reusable only once its response is marked done)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from leasehold._core import HttpRequest
from leasehold._ffi import LH_IO_HTTP
from leasehold.backends.etcd_executor import EtcdExecutor


class _Member(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    seen: list[bytes] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            self.seen.append(body)
        reply = b'{"header":{"revision":"1"},"n":' + str(len(self.seen)).encode() + b"}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def member() -> Iterator[str]:
    _Member.seen = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Member)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_each_request_is_sent_once_on_a_kept_alive_connection(member: str) -> None:
    # Two members, the second the same server: a request re-sent after a failure on the
    # first would show up twice.
    ex = EtcdExecutor([member, member], timeout=5)
    try:
        for i in range(20):
            body = b'{"key":"' + str(i).encode() + b'"}'
            status, reply = ex.post(HttpRequest(LH_IO_HTTP, "POST", "/v3/kv/range", body, ""))
            assert status == 200
            assert reply.endswith(b'"n":' + str(i + 1).encode() + b"}"), reply
    finally:
        ex.close()
    assert [b for b in _Member.seen] == [b'{"key":"' + str(i).encode() + b'"}' for i in range(20)]
