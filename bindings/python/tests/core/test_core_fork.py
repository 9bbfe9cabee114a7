"""Fork safety: a client created before os.fork() gives parent and child different tokens."""

from __future__ import annotations

import os
import sys

import pytest

from leasehold import LockClient
from leasehold.testing import FakeClock, MemoryLockService, MemoryStore

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _read_all(fd: int) -> str:
    chunks = []
    while True:
        b = os.read(fd, 4096)
        if not b:
            break
        chunks.append(b)
    os.close(fd)
    return b"".join(chunks).decode()


def test_fork_parent_and_child_tokens_differ() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    svc = MemoryLockService(store)
    # A fixed seed: without the at-fork reseed, parent and child would mint the same next token.
    client = LockClient(svc, clock=clock, seed=b"fork-seed-0123456789abcdef")
    inherited = client.acquire("before-fork", ttl=30)
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(r)
            h = client.acquire("after-fork", ttl=30)
            rec = store.holder("after-fork")  # the child's copy of the store
            msg = f"{rec.token if rec else '-'} {h.fencing_token} {inherited.lost.is_set()} {inherited.lost_reason}"
            os.write(w, msg.encode())
            client.close(timeout=1)
        except BaseException as e:  # report to the parent
            os.write(w, f"ERR {e!r}".encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    try:
        hp = client.acquire("after-fork", ttl=30)
        rec = store.holder("after-fork")
        assert rec is not None
        parent_token = rec.token
        out = _read_all(r)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, out
        child_token, child_fence, inherited_lost, reason = out.split()
        assert len(child_token) == 32 and len(parent_token) == 32
        assert child_token != parent_token
        # In the child the parent's lease is not the child's to renew or release.
        assert inherited_lost == "True" and reason == "forked"
        # The parent is unaffected.
        assert inherited.is_held() and not inherited.lost.is_set()
        assert hp.is_held()
    finally:
        client.close(timeout=1)
