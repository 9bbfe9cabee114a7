"""The test hooks (fault switches, step_clock, forget, debug_panic) are in the library only with
the `testing` feature. Against a library without them (the test hides the symbols the way a
release build lacks them) each one raises a clear LibraryError and changes nothing, and the
memory service keeps working."""

from __future__ import annotations

from typing import Any

import pytest

from leasehold import _ffi, errors
from leasehold._core import Core
from leasehold.backends.memory import MemoryLockService, MemoryStore
from leasehold import LockClient, LockTimeout
from leasehold.testing import FakeClock

MISSING = "built without the `testing` feature"


class _ReleaseLibrary:
    """The loaded library minus the test hooks: ctypes raises AttributeError for an absent
    symbol, as it does for a release build."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        if name in _ffi.TESTING_HOOKS:
            raise AttributeError(name)
        return getattr(self._real, name)

    def __getitem__(self, name: str) -> Any:
        if name in _ffi.TESTING_HOOKS:
            raise AttributeError(name)
        return self._real[name]


@pytest.fixture
def release_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ffi, "lib", _ReleaseLibrary(_ffi.lib))


def test_the_test_suite_library_has_every_hook() -> None:
    for name in sorted(_ffi.TESTING_HOOKS):
        assert _ffi.has_hook(name) and _ffi.hook(name) is getattr(_ffi.lib, name)


@pytest.mark.usefixtures("release_library")
def test_fault_switches_say_the_feature_is_missing_and_change_nothing() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    svc = MemoryLockService(store)
    for call in (
        svc.partition,
        lambda: setattr(svc, "reject_renewals", True),
        lambda: svc.drop_next_responses(2),
        lambda: svc.step_clock(5),
        lambda: store.forget("n"),
    ):
        with pytest.raises(errors.LibraryError, match=MISSING):
            call()
    assert not svc.partitioned and not svc.reject_renewals
    svc.delay = 0.5
    svc.heal()  # no switch can be on: nothing to clear in the store, the host's own reset
    assert svc.delay == 0.0
    assert store.now_ns() == clock.monotonic_ns()
    # The service itself needs no hook: grants, contention and release work as before.
    with LockClient(svc, clock=clock) as a, LockClient(MemoryLockService(store), clock=clock) as b:
        h = a.acquire("n", ttl=3)
        assert h.fencing_token == 1
        with pytest.raises(LockTimeout):
            b.acquire("n", ttl=3)
        assert h.release() == "released" and store.holder("n") is None


def test_debug_panic_says_the_feature_is_missing_and_the_core_keeps_working(monkeypatch: pytest.MonkeyPatch) -> None:
    core = Core()
    monkeypatch.setattr(_ffi, "lib", _ReleaseLibrary(_ffi.lib))
    with pytest.raises(errors.LibraryError, match=MISSING):
        core.debug_panic()
    assert core.counters().acquires_sent == 0  # not poisoned: no panic happened
