"""The background reader of :class:`~leasehold.backends.redis_stream.RedisStreamExecutor`:
one thread that waits on every stream no caller is reading.

A stream is *armed* while nobody reads it; when bytes arrive the poller disarms it (one shot)
and calls ``ready(stream)``, whose reader arms it again once done. A caller that reads a
stream itself disarms it first, so the poller thread is not woken by the reply the caller is
about to read. Linux uses ``epoll`` with ``EPOLLONESHOT`` (arming and disarming are one
``epoll_ctl`` each, from any thread, without waking the poller); elsewhere a ``select`` loop
with a wake-up pipe, disarming lazily (a stream that fires while a caller reads it is
dropped from the set until it is armed again).
"""

from __future__ import annotations

import os
import select
import socket
import threading
from typing import Any, Callable

__all__ = ["Poller"]


class Poller:
    """The poller thread and its arm/disarm calls (thread-safe)."""

    def __init__(self, ready: Callable[[Any], None], name: str) -> None:
        self._ready = ready
        self._stop = False
        self._by_fd: dict[int, Any] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._mu = threading.Lock()
        self._ep: Any = getattr(select, "epoll", None)
        self._arm_mask = 0
        if self._ep is not None:
            self._ep = self._ep()
            self._ep.register(self._wake_r.fileno(), select.EPOLLIN)
            self._arm_mask = select.EPOLLIN | select.EPOLLONESHOT
        # With epoll, arm() and disarm() are ``epoll.modify(fd, arm_mask or 0)`` (ignoring
        # OSError and ValueError), which a hot caller may call itself, one frame less.
        self.epoll: Any = self._ep
        self.arm_mask: int = self._arm_mask
        self._armed: set[Any] = set()  # the select fallback's set
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, fd: int, st: Any) -> None:
        """Watch ``st`` (whose socket is ``fd``), armed."""
        with self._mu:
            self._by_fd[fd] = st
            if self._ep is not None:
                self._ep.register(fd, self._arm_mask)
                return
            self._armed.add(st)
        self._poke()

    def arm(self, fd: int, st: Any) -> None:
        """Wait for ``st``'s next bytes (bytes already there fire at once)."""
        if self._ep is not None:
            try:
                self._ep.modify(fd, self._arm_mask)
            except (OSError, ValueError):  # removed meanwhile
                pass
            return
        with self._mu:
            if self._by_fd.get(fd) is not st:
                return
            self._armed.add(st)
        self._poke()

    def disarm(self, fd: int) -> None:
        """A caller reads ``fd`` itself: the poller leaves it alone until it is armed again."""
        if self._ep is not None:
            try:
                self._ep.modify(fd, 0)
            except (OSError, ValueError):
                pass

    def remove(self, fd: int, st: Any) -> None:
        """Forget ``st`` (before its socket is closed: the fd number may be reused)."""
        with self._mu:
            if self._by_fd.get(fd) is st:
                del self._by_fd[fd]
            self._armed.discard(st)
            if self._ep is not None:
                try:
                    self._ep.unregister(fd)
                except (OSError, ValueError):
                    pass

    def stop(self) -> None:
        """End the thread (the streams are closed by their owner)."""
        self._stop = True
        self._poke()

    def _poke(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:  # full (a wake-up is pending anyway) or closed
            pass

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _run(self) -> None:
        try:
            wake = self._wake_r.fileno()
            while not self._stop:
                fired: list[Any] = []
                if self._ep is not None:
                    for fd, _ in self._ep.poll():
                        if fd == wake:
                            self._drain_wake()
                            continue
                        st = self._by_fd.get(fd)
                        if st is not None:
                            fired.append(st)
                else:
                    with self._mu:
                        armed = {s.fd: s for s in self._armed if s.fd >= 0}
                    try:
                        rl, _, _ = select.select([wake, *armed], [], [])
                    except (OSError, ValueError):  # a socket closed meanwhile: look again
                        continue
                    with self._mu:
                        for fd in rl:
                            if fd == wake:
                                self._drain_wake()
                            elif (st := armed.get(fd)) is not None and st in self._armed:
                                self._armed.discard(st)  # one shot
                                fired.append(st)
                for st in fired:
                    self._ready(st)
        finally:
            if self._ep is not None:
                self._ep.close()
            self._wake_r.close()
            self._wake_w.close()

    def after_fork(self) -> None:
        """(in a forked child) The thread is gone; release what the parent's poller held here."""
        for s in (self._wake_r, self._wake_w):
            try:
                os.close(s.detach())
            except OSError:
                pass
        if self._ep is not None:
            try:
                self._ep.close()
            except OSError:
                pass
