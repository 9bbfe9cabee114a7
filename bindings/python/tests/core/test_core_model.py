"""Property: with one shared clock and no pauses, a handle that says it holds a lock really does.

Two clients on one memory store run random acquires (plain or reentrant, with or without a
wait), releases, clock advances and per-connection faults (partition, lost answers, rejected
renewals). After every step, once the clients are idle:

* every handle with ``is_held()`` is backed by the store: the store's holder has its fencing
  token (validity is counted from the send time minus a drift margin, so the client's window
  ends before the server's);
* at most one client believes it holds a given name;
* handle states are consistent: ``lost`` is set exactly for lost handles, released and lost
  handles never report ``is_held()``.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leasehold import LockClient, LockHandle, LockTimeout
from leasehold.testing import FakeClock, MemoryLockService, MemoryStore

NAMES = ("a", "b")
client_ix = st.integers(0, 1)
step = st.one_of(
    st.tuples(st.just("acquire"), client_ix, st.sampled_from(NAMES), st.booleans()),
    st.tuples(st.just("acquire"), client_ix, st.sampled_from(NAMES), st.booleans()),
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("advance"), st.floats(0.01, 2.5)),
    st.tuples(st.just("advance"), st.floats(0.01, 0.5)),
    st.tuples(st.just("partition"), client_ix),
    st.tuples(st.just("heal"), client_ix),
    st.tuples(st.just("drop"), client_ix),
    st.tuples(st.just("reject"), client_ix),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=3, max_size=30))
def test_is_held_is_backed_by_the_store(steps: list[tuple[object, ...]]) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    services = [MemoryLockService(store), MemoryLockService(store)]
    clients = [LockClient(s, clock=clock, release_timeout=0.05) for s in services]
    handles: list[tuple[int, LockHandle]] = []
    try:
        for s in steps:
            kind = s[0]
            if kind == "acquire":
                ci, name, reentrant = int(s[1]), str(s[2]), bool(s[3])  # type: ignore[call-overload]
                try:
                    handles.append((ci, clients[ci].acquire(name, ttl=2.0, reentrant=reentrant)))
                except LockTimeout:
                    pass
            elif kind == "release" and handles:
                _, h = handles[int(s[1]) % len(handles)]  # type: ignore[call-overload]
                h.release()
            elif kind == "advance":
                clock.advance(float(s[1]))  # type: ignore[arg-type]
            elif kind == "partition":
                services[int(s[1])].partition()  # type: ignore[call-overload]
            elif kind == "heal":
                services[int(s[1])].heal()  # type: ignore[call-overload]
            elif kind == "drop":
                services[int(s[1])].drop_next_responses(1)  # type: ignore[call-overload]
            elif kind == "reject":
                services[int(s[1])].reject_renewals = True  # type: ignore[call-overload]
            for c in clients:
                assert c.wait_idle(10)
            believers: dict[str, set[int]] = {}
            for ci, h in handles:
                held = h.is_held()
                assert h.lost.is_set() == (h.state == "lost")
                if h.state != "held":
                    assert not held
                if held:
                    rec = store.holder(h.name)
                    assert rec is not None, f"{h!r} believes it holds {h.name!r}; the store has no holder"
                    assert rec.fencing_token == h.fencing_token
                    believers.setdefault(h.name, set()).add(ci)
            for name, cis in believers.items():
                assert len(cis) == 1, f"two clients believe they hold {name!r}"
    finally:
        for sv in services:
            sv.heal()
        for c in clients:
            c.close(timeout=0.2)
