"""The handoff floor: the Redis protocol's own steps for one handoff, run by a bare process on
plain sockets with no library (what ``bench_redis.py`` sets leasehold's handoff beside).

One handoff is: the holder's RELEASE script (it pops the oldest queued entry and publishes
``w TOKEN NAME`` to that entry's channel), the message reaching the waiter's subscriber
socket, and the waiter's ACQUIRE script (``queued = 1``), which grants. The scripts, keys and
arguments are the ones leasehold's core sends, recorded once from a real client for the name;
each floor process only puts in its own token and its own wake channel
(``docs/redis-protocol.md``: ARGV of ACQUIRE ``[token, ttl_ms, entry, keep_ms, name,
queued]``, of RELEASE ``[token, name, max_age_ms]``). No timers, no standbys, no renewal: a
waiter that hears nothing for its holder's remaining time asks again, as the protocol does.
"""

from __future__ import annotations

import secrets
import socket
import time
from typing import Any

__all__ = ["FloorHandoffLocker", "recorded_scripts"]


def _resp(argv: list[bytes]) -> bytes:
    return b"*%d\r\n" % len(argv) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in argv)


class _Conn:
    """A plain socket and a RESP2 reader (enough for script replies and pub/sub messages)."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("redis://").split("/")[0].rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def call(self, payload: bytes) -> Any:
        self.sock.sendall(payload)
        return self.read(None)

    def read(self, timeout: float | None) -> Any:
        """The next reply; ``None`` when ``timeout`` seconds pass without one."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            got = self._parse(0)
            if got is not None:
                value, i = got
                self.buf = self.buf[i:]
                return value
            if end is not None:
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self.sock.settimeout(left)
            else:
                self.sock.settimeout(None)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return None
            if not data:
                raise ConnectionError("the server closed the connection")
            self.buf += data

    def _parse(self, i: int) -> tuple[Any, int] | None:
        nl = self.buf.find(b"\r\n", i)
        if nl < 0:
            return None
        kind, line, j = self.buf[i : i + 1], self.buf[i + 1 : nl], nl + 2
        if kind == b"+":
            return line, j
        if kind == b"-":
            raise RuntimeError(line.decode(errors="replace"))
        if kind == b":":
            return int(line), j
        if kind == b"$":
            n = int(line)
            if n < 0:
                return None, j
            return (self.buf[j : j + n], j + n + 2) if len(self.buf) >= j + n + 2 else None
        if kind == b"*":
            items = []
            for _ in range(max(int(line), 0)):
                got = self._parse(j)
                if got is None:
                    return None
                item, j = got
                items.append(item)
            return items, j
        raise RuntimeError(f"unexpected reply {self.buf[i : i + 20]!r}")

    def close(self) -> None:
        self.sock.close()


def recorded_scripts(seen: list[list[bytes]]) -> tuple[list[bytes], list[bytes]]:
    """The ACQUIRE and RELEASE calls among the commands a client sent for one acquire (with a
    wait) and release: the EVALSHAs with 3 keys and with 2 keys."""
    acquire = next(a for a in seen if a[0].upper() == b"EVALSHA" and a[2] == b"3")
    release = next(a for a in seen if a[0].upper() == b"EVALSHA" and a[2] == b"2")
    return list(acquire), list(release)


class FloorHandoffLocker:
    """One bare waiter: a commands socket, a subscriber socket on a wake channel of its own."""

    def __init__(self, url: str, acquire: list[bytes], release: list[bytes]) -> None:
        self.cmd, self.sub = _Conn(url), _Conn(url)
        token = secrets.token_hex(16).encode()
        self.token = token
        chan = b"lh:wake:" + secrets.token_hex(16).encode()
        self.sub.call(_resp([b"SUBSCRIBE", chan]))  # its confirmation
        a = list(acquire)
        a[6], a[8] = token, chan + b"#" + token
        self.first = _resp(a[:11] + [b"0"])
        self.again = _resp(a[:11] + [b"1"])
        r = list(release)
        r[5] = token
        self.release_call = _resp(r)
        self.wake = b"w " + token + b" "

    def acquire(self, name: str, ttl: float, wait: float) -> Any:
        end = time.monotonic() + wait
        payload = self.first
        while True:
            reply = self.cmd.call(payload)
            if reply[0] == 1:
                return reply[1]
            payload = self.again
            # Queued: wait for this entry's wake-up, at most the holder's remaining time.
            until = time.monotonic() + max(reply[1], 1) / 1000
            while (left := until - time.monotonic()) > 0:
                msg = self.sub.read(left)
                if msg is None:
                    break
                if isinstance(msg, list) and len(msg) == 3 and msg[2].startswith(self.wake):
                    break
            if time.monotonic() > end:
                raise TimeoutError(name)

    def release(self, h: Any) -> None:
        if self.cmd.call(self.release_call) != 1:
            raise RuntimeError("the floor's RELEASE found another owner")

    def close(self) -> None:
        self.cmd.close()
        self.sub.close()
