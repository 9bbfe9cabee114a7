"""A loopback TCP proxy in front of a real redis-server that hands the server's replies on in
small pieces (each its own TCP segment, a short gap apart), so a client reads a reply in
several parts; and that can cut a connection in the middle of the next reply
(:meth:`ChunkProxy.cut_next`: half of it goes through, then both sides are closed).
Requests pass unchanged."""

from __future__ import annotations

import socket
import threading
import time


class ChunkProxy:
    def __init__(self, host: str, port: int, chunk: int = 3, gap: float = 0.0002) -> None:
        self.target = (host, port)
        self.chunk = chunk
        self.gap = gap
        self.cuts = 0  # connections cut in the middle of a reply
        self._cut = threading.Event()
        self._socks: list[socket.socket] = []
        self._mu = threading.Lock()
        self._closed = False
        self._lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self._lsock.getsockname()[1]
        threading.Thread(target=self._accept, name="chunk-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def cut_next(self) -> None:
        """The next reply of any connection stops half-way and that connection closes."""
        self._cut.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._lsock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._mu:
                if self._closed:
                    client.close()
                    server.close()
                    return
                self._socks += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while data := src.recv(65536):
                if not replies:
                    dst.sendall(data)
                    continue
                if self._cut.is_set():
                    self._cut.clear()
                    dst.sendall(data[: max(1, len(data) // 2)])
                    self.cuts += 1
                    break
                for i in range(0, len(data), self.chunk):
                    dst.sendall(data[i : i + self.chunk])
                    if self.gap:
                        time.sleep(self.gap)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        with self._mu:
            self._closed = True
            socks, self._socks = self._socks, []
        self._lsock.close()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
