"""The canonical Lua scripts, run directly with redis-py against a real redis-server.

The script texts and keys come from the native library (lh_redis_script / lh_redis_key), as
every transport gets them. No LockClient here: these tests pin the wire protocol itself.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid

import pytest
import redis

from leasehold import errors
from leasehold.backends import redis_protocol as proto

ACQ = proto.script(proto.SCRIPT_ACQUIRE)
REN = proto.script(proto.SCRIPT_RENEW)
REL = proto.script(proto.SCRIPT_RELEASE)
NOT = proto.script(proto.SCRIPT_NOTIFY)


def tok() -> str:
    return uuid.uuid4().hex


def acquire(r: redis.Redis, name: str, token: str, ttl_ms: int | str):
    k = proto.keys_for(name)
    return r.eval(ACQ.text, 2, k.lock, k.fence, token, ttl_ms)


def renew(r: redis.Redis, name: str, token: str, ttl_ms: int | str):
    return r.eval(REN.text, 1, proto.keys_for(name).lock, token, ttl_ms)


def release(r: redis.Redis, name: str, token: str):
    k = proto.keys_for(name)
    return r.eval(REL.text, 1, k.lock, token, k.channel, name)


def server_time_us(r: redis.Redis) -> int:
    sec, usec = r.time()
    return sec * 1_000_000 + usec


# ---- texts and keys ------------------------------------------------------------------------
def test_script_texts_come_from_the_library_and_their_sha_is_what_redis_computes(r):
    for s in (ACQ, REN, REL, NOT):
        assert s.text.startswith("-- leasehold ")
        assert s.sha == hashlib.sha1(s.text.encode()).hexdigest()
        assert r.script_load(s.text) == s.sha
    assert (ACQ.num_keys, REN.num_keys, REL.num_keys, NOT.num_keys) == (2, 1, 1, 1)


def test_keys_are_hash_tagged_and_share_a_cluster_slot(r):
    k = proto.keys_for("jobs")
    assert (k.lock, k.fence, k.channel, k.waiters, k.grants) == (
        "lh:{jobs}",
        "lh:{jobs}:fence",
        "lh:{jobs}:released",
        "lh:{jobs}:waiters",
        "lh:{jobs}:grants",
    )
    assert proto.key(proto.KEY_LOCK, "é x") == "lh:{é x}"
    # CLUSTER KEYSLOT is not available on a non-cluster server; compare with redis-py's CRC16.
    from redis.crc import key_slot

    for name in ("jobs", "x{y}", "a}b", "räksmörgås"):
        k = proto.keys_for(name)
        slots = {key_slot(x.encode()) for x in (k.lock, k.fence, k.channel, k.waiters, k.grants)}
        assert len(slots) == 1, (name, slots)


@pytest.mark.parametrize("bad", ["", "a\0b", "n" * 513])
def test_invalid_names_are_refused_by_the_library(bad):
    with pytest.raises(errors.InvalidArgument):
        proto.key(proto.KEY_LOCK, bad)


# ---- ACQUIRE -------------------------------------------------------------------------------
def test_acquire_grants_a_free_lock_with_a_time_based_fence_and_a_ttl(r):
    t = tok()
    before = server_time_us(r)
    flag, fence, ttl = acquire(r, "a", t, 30_000)
    after = server_time_us(r)
    assert (flag, ttl) == (1, 30_000)
    assert before <= fence <= after, "fresh fence = server TIME in µs"
    k = proto.keys_for("a")
    assert r.hgetall(k.lock) == {b"token": t.encode(), b"fence": str(fence).encode()}
    assert 0 < r.pttl(k.lock) <= 30_000
    assert int(r.get(k.fence)) == fence
    assert r.ttl(k.fence) == -1, "the fence key never expires"


def test_acquire_is_idempotent_for_the_same_token_and_refreshes_the_ttl(r):
    t = tok()
    first = acquire(r, "a", t, 1_000)
    again = acquire(r, "a", t, 60_000)
    assert again == [1, first[1], 60_000]
    assert r.pttl(proto.keys_for("a").lock) > 1_000
    assert int(r.get(proto.keys_for("a").fence)) == first[1], "no new fence minted"


def test_acquire_by_another_token_reports_the_remaining_ttl(r):
    acquire(r, "a", tok(), 20_000)
    flag, left = acquire(r, "a", tok(), 5_000)
    assert flag == 0
    assert 0 < left <= 20_000
    assert r.hget(proto.keys_for("a").lock, "token") != b""


def test_fences_strictly_increase_across_grants(r):
    fences = []
    for _ in range(200):
        t = tok()
        flag, fence, _ = acquire(r, "inc", t, 10_000)
        assert flag == 1
        fences.append(fence)
        assert release(r, "inc", t) == 1
    assert all(b > a for a, b in zip(fences, fences[1:])), fences


def test_fence_is_previous_plus_one_when_the_counter_is_ahead_of_the_clock(r):
    ahead = server_time_us(r) + 10**12
    r.set(proto.keys_for("a").fence, ahead)
    assert acquire(r, "a", tok(), 1_000)[1] == ahead + 1


def test_fence_keeps_increasing_when_the_fence_key_was_lost(r):
    t = tok()
    fence = acquire(r, "a", t, 1_000)[1]
    release(r, "a", t)
    r.delete(proto.keys_for("a").fence)  # what a restart without persistence does
    assert acquire(r, "a", tok(), 1_000)[1] > fence


def test_a_different_name_does_not_interfere(r):
    acquire(r, "a", tok(), 10_000)
    assert acquire(r, "b", tok(), 10_000)[0] == 1


def test_an_expired_lock_is_granted_to_the_next_token(r):
    t1 = tok()
    f1 = acquire(r, "a", t1, 30)[1]
    lock = proto.keys_for("a").lock
    for _ in range(500):
        if not r.exists(lock):
            break
        time.sleep(0.01)
    assert not r.exists(lock)
    flag, f2, _ = acquire(r, "a", tok(), 1_000)
    assert flag == 1 and f2 > f1
    assert renew(r, "a", t1, 1_000) == 0, "the old holder cannot renew someone else's lock"


# ---- RENEW ---------------------------------------------------------------------------------
def test_renew_by_the_owner_extends_the_ttl(r):
    t = tok()
    acquire(r, "a", t, 1_000)
    assert renew(r, "a", t, 60_000) == 1
    assert r.pttl(proto.keys_for("a").lock) > 1_000


def test_renew_by_another_token_is_rejected_and_changes_nothing(r):
    t = tok()
    acquire(r, "a", t, 5_000)
    before = r.hgetall(proto.keys_for("a").lock)
    assert renew(r, "a", tok(), 60_000) == 0
    assert r.pttl(proto.keys_for("a").lock) <= 5_000
    assert r.hgetall(proto.keys_for("a").lock) == before


def test_renew_never_recreates_a_lock_that_is_gone(r):
    # redsync's WithSetNXOnExtend bug: an extend that silently re-acquires hides a gap.
    assert renew(r, "gone", tok(), 5_000) == 0
    assert not r.exists(proto.keys_for("gone").lock)


# ---- RELEASE -------------------------------------------------------------------------------
def test_release_by_the_owner_deletes_the_lock_keeps_the_fence_and_publishes(r):
    t = tok()
    fence = acquire(r, "a", t, 5_000)[1]
    k = proto.keys_for("a")
    ps = r.pubsub(ignore_subscribe_messages=True)
    ps.subscribe(k.channel)
    ps.get_message(timeout=1.0)  # the subscribe confirmation
    assert release(r, "a", t) == 1
    assert not r.exists(k.lock)
    assert int(r.get(k.fence)) == fence
    msg = None
    for _ in range(100):
        msg = ps.get_message(timeout=0.1)
        if msg:
            break
    assert msg is not None and msg["type"] == "message"
    assert (msg["channel"], msg["data"]) == (k.channel.encode(), b"a")
    ps.close()


def test_release_by_another_token_is_refused_and_publishes_nothing(r):
    t = tok()
    acquire(r, "a", t, 5_000)
    k = proto.keys_for("a")
    ps = r.pubsub(ignore_subscribe_messages=True)
    ps.subscribe(k.channel)
    ps.get_message(timeout=1.0)
    assert release(r, "a", tok()) == 0
    assert release(r, "nobody-holds-this", tok()) == 0
    assert r.hget(k.lock, "token") == t.encode()
    r.publish(k.channel, "marker")  # the first message to arrive must be our own marker
    msg = None
    for _ in range(100):
        msg = ps.get_message(timeout=0.1)
        if msg:
            break
    assert msg is not None and msg["data"] == b"marker"
    ps.close()


def test_a_retried_release_is_a_harmless_not_owner(r):
    t = tok()
    acquire(r, "a", t, 5_000)
    assert release(r, "a", t) == 1
    t2 = tok()
    assert acquire(r, "a", t2, 5_000)[0] == 1
    assert release(r, "a", t) == 0, "a late retry of the first release must not free the next grant"
    assert r.hget(proto.keys_for("a").lock, "token") == t2.encode()


# ---- garbage and malformed arguments ---------------------------------------------------------
def _plant(r: redis.Redis, key: str, kind: str) -> None:
    if kind == "string":
        r.set(key, "hello")
    elif kind == "list":
        r.rpush(key, "x")
    elif kind == "set":
        r.sadd(key, "x")
    elif kind == "zset":
        r.zadd(key, {"x": 1})
    elif kind == "stream":
        r.xadd(key, {"x": "1"})
    elif kind == "hash-without-token":
        r.hset(key, mapping={"owner": "someone"})
    elif kind == "hash-with-bad-fence":
        r.hset(key, mapping={"token": "t", "fence": "not-a-number"})
    else:  # pragma: no cover
        raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["string", "list", "set", "zset", "stream", "hash-without-token", "hash-with-bad-fence"]
)
def test_a_lock_key_of_the_wrong_shape_is_a_clear_error_never_a_grant(r, kind):
    k = proto.keys_for("g")
    _plant(r, k.lock, kind)
    dump = r.dump(k.lock)
    with pytest.raises(redis.ResponseError, match=r"^lh: lock key lh:\{g\}"):
        acquire(r, "g", tok(), 5_000)
    if kind != "hash-with-bad-fence":  # renew/release only read the token
        with pytest.raises(redis.ResponseError, match=r"^lh: lock key lh:\{g\}"):
            renew(r, "g", tok(), 5_000)
        with pytest.raises(redis.ResponseError, match=r"^lh: lock key lh:\{g\}"):
            release(r, "g", tok())
    assert r.dump(k.lock) == dump, "garbage is reported, not modified"
    assert not r.exists(k.fence), "no fence minted"


def test_a_lock_hash_without_expiry_is_an_error_not_an_endless_wait(r):
    k = proto.keys_for("g")
    r.hset(k.lock, mapping={"token": "someone", "fence": "5"})
    with pytest.raises(redis.ResponseError, match="^lh: .*no expiry"):
        acquire(r, "g", tok(), 5_000)


@pytest.mark.parametrize(
    "text", ["hello", "12abc", "-5", "1e5", "1.5", " 7", "", "99999999999999999999", "9007199254740992"]
)
def test_a_fence_key_holding_text_is_a_clear_error_never_a_grant(r, text):
    k = proto.keys_for("g")
    r.set(k.fence, text)
    with pytest.raises(redis.ResponseError, match=r"^lh: fence key lh:\{g\}:fence holds"):
        acquire(r, "g", tok(), 5_000)
    assert not r.exists(k.lock)
    assert r.get(k.fence) == text.encode()


def test_a_fence_key_of_another_type_is_a_clear_error(r):
    k = proto.keys_for("g")
    r.rpush(k.fence, "1")
    with pytest.raises(redis.ResponseError, match=r"^lh: fence key .* holds a list"):
        acquire(r, "g", tok(), 5_000)
    assert not r.exists(k.lock)


def test_the_fence_space_running_out_is_an_error_not_a_repeat(r):
    k = proto.keys_for("g")
    r.set(k.fence, str(2**53 - 1))
    with pytest.raises(redis.ResponseError, match="^lh: .*exhausted"):
        acquire(r, "g", tok(), 5_000)
    assert not r.exists(k.lock)


@pytest.mark.parametrize("ttl", ["0", "-1", "abc", "1.5", "1e3", "", "9999999999999999"])
def test_malformed_ttls_are_refused(r, ttl):
    for call in (lambda: acquire(r, "a", tok(), ttl), lambda: renew(r, "a", tok(), ttl)):
        with pytest.raises(redis.ResponseError, match="^lh: .*ttl_ms"):
            call()
    assert not r.exists(proto.keys_for("a").lock)


def test_empty_tokens_and_missing_arguments_are_refused(r):
    k = proto.keys_for("a")
    with pytest.raises(redis.ResponseError, match="^lh: .*token"):
        acquire(r, "a", "", 1_000)
    with pytest.raises(redis.ResponseError, match="^lh: .*token"):
        r.eval(REN.text, 1, k.lock, "", 1_000)
    with pytest.raises(redis.ResponseError, match="^lh: ACQUIRE expects 2 keys \\(lock, fence\\), 3 .* or 4 "):
        r.eval(ACQ.text, 1, k.lock, tok(), 1_000)
    with pytest.raises(redis.ResponseError, match="^lh: ACQUIRE expects 2 keys .*, got 5$"):
        r.eval(ACQ.text, 5, k.lock, k.fence, k.waiters, k.grants, k.channel, tok(), 1_000, "lh:wake:x", 1)
    with pytest.raises(redis.ResponseError, match="^lh: RELEASE needs a channel"):
        r.eval(REL.text, 1, k.lock, tok())
    assert not r.exists(k.lock)


# ---- the waiters queue (protocol 2) --------------------------------------------------------------
def acquire_q(r: redis.Redis, name: str, token: str, ttl_ms: int, wake: str):
    k = proto.keys_for(name)
    return r.eval(ACQ.text, 3, k.lock, k.fence, k.waiters, token, ttl_ms, wake)


def release_q(r: redis.Redis, name: str, token: str, skip: str | None = None):
    k = proto.keys_for(name)
    return r.eval(REL.text, 2, k.lock, k.waiters, token, k.channel, name, *([skip] if skip else []))


def notify(r: redis.Redis, name: str, skip: str | None = None):
    return r.eval(NOT.text, 1, proto.keys_for(name).waiters, name, *([skip] if skip else []))


def queue(r: redis.Redis, name: str) -> list[str]:
    return [m.decode() for m in r.zrange(proto.keys_for(name).waiters, 0, -1)]


class Listener:
    """A pub/sub connection on some channels; ``take()`` returns the messages that arrived
    (``take_raw()`` with the payloads as bytes)."""

    def __init__(self, r: redis.Redis, *channels: str) -> None:
        self.ps = r.pubsub()
        self.ps.subscribe(*channels)
        for _ in channels:  # the confirmations: from here on every publish reaches us
            msg = self.ps.get_message(timeout=2.0)
            assert msg is not None and msg["type"] == "subscribe", msg

    def take(self, marker_channel: str, r: redis.Redis) -> list[tuple[str, str]]:
        """Everything before our own marker on ``marker_channel`` (which we must listen to)."""
        return [(ch, data.decode()) for ch, data in self.take_raw(marker_channel, r)]

    def take_raw(self, marker_channel: str, r: redis.Redis) -> list[tuple[str, bytes]]:
        r.publish(marker_channel, "--marker--")
        got: list[tuple[str, bytes]] = []
        for _ in range(200):
            msg = self.ps.get_message(timeout=0.05)
            if msg is None:
                continue
            item = (msg["channel"].decode(), msg["data"])
            if item[1] == b"--marker--":
                return got
            got.append(item)
        raise AssertionError(f"marker never arrived; got {got}")

    def close(self) -> None:
        self.ps.close()


def test_refused_queueing_attempts_queue_their_wake_channel_in_arrival_order(r):
    holder = tok()
    acquire(r, "q", holder, 5_000)
    w1, w2 = proto.new_wake_channel(), proto.new_wake_channel()
    assert acquire_q(r, "q", tok(), 1_000, w1)[0] == 0
    assert acquire_q(r, "q", tok(), 1_000, w2)[0] == 0
    assert acquire_q(r, "q", tok(), 1_000, w1)[0] == 0, "a retry keeps its place"
    assert queue(r, "q") == [w1, w2]
    left = r.pttl(proto.keys_for("q").waiters)
    assert 5_000 < left <= 5_000 + 60_000, "the queue outlives the holder's TTL"
    assert acquire(r, "q", tok(), 1_000)[0] == 0
    assert queue(r, "q") == [w1, w2], "a plain attempt does not queue"


def test_a_release_wakes_the_oldest_live_waiter_only_and_still_publishes_on_the_release_channel(r):
    holder = tok()
    acquire(r, "q", holder, 5_000)
    dead, w1, w2 = proto.new_wake_channel(), proto.new_wake_channel(), proto.new_wake_channel()
    k = proto.keys_for("q")
    for w in (dead, w1, w2):
        acquire_q(r, "q", tok(), 1_000, w)
    r.zadd(k.waiters, {"not-a-wake-channel": 0})  # garbage is dropped, never published to
    ln = Listener(r, w1, w2, k.channel, "not-a-wake-channel")
    try:
        assert release_q(r, "q", holder) == 1
        got = ln.take(k.channel, r)
        assert sorted(got) == sorted([(w1, "q"), (k.channel, "q")]), got
        assert queue(r, "q") == [w2], "the dead channel and the garbage member were dropped, w1 was popped"
    finally:
        ln.close()


def test_a_winner_stays_queued_at_the_back_and_its_release_can_drop_it(r):
    holder = tok()
    acquire(r, "q", holder, 5_000)
    w1, w2 = proto.new_wake_channel(), proto.new_wake_channel()
    acquire_q(r, "q", tok(), 1_000, w1)
    acquire_q(r, "q", tok(), 1_000, w2)
    r.delete(proto.keys_for("q").lock)  # the holder's TTL ran out
    t1 = tok()
    assert acquire_q(r, "q", t1, 1_000, w1)[0] == 1
    assert queue(r, "q") == [w2, w1], "the winner's client may have more waiters: queued at the back"
    ln = Listener(r, w1, w2)
    try:
        assert release_q(r, "q", t1, skip=w1) == 1
        assert ln.take(w2, r) == [(w2, "q")]
        assert queue(r, "q") == []
    finally:
        ln.close()


def test_a_retried_grant_moves_its_wake_channel_to_the_back_like_a_fresh_one(r):
    k = proto.keys_for("q")
    w1, w2 = proto.new_wake_channel(), proto.new_wake_channel()
    t1 = tok()
    first = acquire_q(r, "q", t1, 1_000, w1)
    assert first[0] == 1
    assert acquire_q(r, "q", tok(), 1_000, w2)[0] == 0
    assert queue(r, "q") == [w1, w2]
    r.persist(k.waiters)  # so the TTL checked below is the retry's own
    # The reply to the first ACQUIRE was lost; the client retries with the same token.
    assert acquire_q(r, "q", t1, 1_000, w1) == [1, first[1], 1_000], "the same grant"
    assert queue(r, "q") == [w2, w1], "queued at the back, as a fresh grant would be"
    assert 60_000 < r.pttl(k.waiters) <= 1_000 + 60_000, "the queue outlives the grant's TTL"
    assert acquire(r, "q", t1, 1_000) == [1, first[1], 1_000]
    assert queue(r, "q") == [w2, w1], "a plain retry does not touch the queue"


def test_notify_passes_a_wake_up_on_and_reports_whether_anyone_was_reached(r):
    w1, w2 = proto.new_wake_channel(), proto.new_wake_channel()
    k = proto.keys_for("q")
    assert notify(r, "q") == 0, "nobody queued"
    r.zadd(k.waiters, {w1: 1, w2: 2})
    ln = Listener(r, w2)
    try:
        assert notify(r, "q", skip=w1) == 1
        assert ln.take(w2, r) == [(w2, "q")]
        assert queue(r, "q") == []
        assert notify(r, "q") == 0
    finally:
        ln.close()


def test_a_plain_release_leaves_the_queue_alone(r):
    holder = tok()
    acquire(r, "q", holder, 5_000)
    w = proto.new_wake_channel()
    acquire_q(r, "q", tok(), 1_000, w)
    assert release(r, "q", holder) == 1  # the protocol-1 form (one key)
    assert queue(r, "q") == [w]


@pytest.mark.parametrize("kind", ["string", "list", "set", "stream"])
def test_a_waiters_key_of_another_type_fails_a_queueing_refusal_clearly_and_never_blocks_a_release(r, kind):
    holder = tok()
    acquire(r, "q", holder, 5_000)
    k = proto.keys_for("q")
    _plant(r, k.waiters, kind)
    with pytest.raises(redis.ResponseError, match=f"^lh: waiters key lh:{{q}}:waiters holds a {kind}, expected a zset"):
        acquire_q(r, "q", tok(), 1_000, proto.new_wake_channel())
    assert r.hget(k.lock, "token") == holder.encode(), "no grant"
    assert release_q(r, "q", holder, skip=proto.new_wake_channel()) == 1
    assert not r.exists(k.lock)
    assert r.type(k.waiters).decode() == kind, "left as it was"
    assert notify(r, "q") == 0
    t = tok()
    assert acquire_q(r, "q", t, 1_000, proto.new_wake_channel())[0] == 1, "a free lock is granted all the same"


@pytest.mark.parametrize("wake", ["", "lh:wake:", "other:channel", "lh:wake:" + "x" * 121])
def test_malformed_wake_channels_are_refused(r, wake):
    with pytest.raises(redis.ResponseError, match="^lh: ACQUIRE with a waiters key needs a wake channel"):
        acquire_q(r, "q", tok(), 1_000, wake)
    k = proto.keys_for("q")
    with pytest.raises(redis.ResponseError, match="^lh: ACQUIRE with a waiters key needs a wake channel"):
        r.eval(ACQ.text, 3, k.lock, k.fence, k.waiters, tok(), 1_000)
    assert not r.exists(k.lock) and not r.exists(k.waiters)
    assert len("lh:wake:" + "x" * 120) == 128
    acquire_q(r, "q", tok(), 1_000, "lh:wake:" + "x" * 120)


def test_wake_channels_are_the_prefix_and_128_random_bits_in_hex_and_the_scripts_accept_them(r):
    chans = {proto.new_wake_channel() for _ in range(100)}
    assert len(chans) == 100, "128 random bits each"
    for ch in chans:
        assert re.fullmatch(r"lh:wake:[0-9a-f]{32}", ch), ch
    ch = chans.pop()
    assert acquire_q(r, "q", tok(), 1_000, ch)[0] == 1
    assert acquire_q(r, "q", tok(), 1_000, ch)[0] == 0
    assert queue(r, "q") == [ch]


def test_a_release_that_does_not_own_the_lock_still_drops_the_callers_own_entry(r):
    w_mine, w_other = proto.new_wake_channel(), proto.new_wake_channel()
    r.zadd(proto.keys_for("q").waiters, {w_mine: 1, w_other: 2})
    assert release_q(r, "q", tok(), skip=w_mine) == 0
    assert queue(r, "q") == [w_other], "only the caller's own entry goes; nobody is woken"


def test_malformed_notify_and_release_calls_are_refused(r):
    k = proto.keys_for("q")
    with pytest.raises(redis.ResponseError, match="^lh: NOTIFY needs a lock name"):
        r.eval(NOT.text, 1, k.waiters, "")
    with pytest.raises(redis.ResponseError, match="^lh: NOTIFY expects 1 key"):
        r.eval(NOT.text, 2, k.waiters, k.lock, "q")
    with pytest.raises(
        redis.ResponseError, match="^lh: RELEASE expects 1 key \\(lock\\), 2 \\(lock, waiters\\) or 4 .*, got 3$"
    ):
        r.eval(REL.text, 3, k.lock, k.waiters, k.fence, tok(), k.channel, "q")
    # A caller's "own channel" that is not a wake channel never removes anything.
    r.zadd(k.waiters, {"not-a-wake-channel": 1})
    assert release_q(r, "q", tok(), skip="not-a-wake-channel") == 0
    assert r.zcard(k.waiters) == 1
    assert notify(r, "q", skip="not-a-wake-channel") == 0
    assert r.zcard(k.waiters) == 0, "popped by NOTIFY as garbage, never published to"


def test_a_winner_reuses_the_grants_server_time_for_its_queue_place(r):
    w = proto.new_wake_channel()
    before = server_time_us(r)
    assert acquire_q(r, "q", tok(), 1_000, w)[0] == 1
    score = r.zscore(proto.keys_for("q").waiters, w)
    fence = int(r.get(proto.keys_for("q").fence))
    assert score == fence >= before, "queued at the grant's own TIME, the fence's source"


# ---- direct grant on release (protocol 3) ---------------------------------------------------------
def acquire_g(r: redis.Redis, name: str, token: str, ttl_ms: int, wake: str, tag: int | str):
    k = proto.keys_for(name)
    return r.eval(ACQ.text, 4, k.lock, k.fence, k.waiters, k.grants, token, ttl_ms, wake, tag)


def release_g(r: redis.Redis, name: str, token: str, skip: str | None = None):
    k = proto.keys_for(name)
    return r.eval(REL.text, 4, k.lock, k.waiters, k.fence, k.grants, token, k.channel, name, *([skip] if skip else []))


def grants(r: redis.Redis, name: str) -> dict[str, str]:
    return {f.decode(): v.decode() for f, v in r.hgetall(proto.keys_for(name).grants).items()}


def notice_of(got: list[tuple[str, bytes]], channel: str) -> proto.GrantNotice:
    payloads = [data for ch, data in got if ch == channel]
    assert len(payloads) == 1, got
    n = proto.parse_grant_notice(payloads[0])
    assert n is not None, payloads[0]
    return n


def test_a_refused_granting_acquire_queues_the_lease_and_its_grants_field(r):
    holder = tok()
    acquire(r, "q", holder, 5_000)
    k = proto.keys_for("q")
    w1, w2 = proto.new_wake_channel(), proto.new_wake_channel()
    t1 = tok()
    flag, left = acquire_g(r, "q", t1, 1_000, w1, 7)
    assert flag == 0 and 0 < left <= 5_000
    assert acquire_q(r, "q", tok(), 1_000, w2)[0] == 0, "a protocol-2 entry queues behind it"
    assert queue(r, "q") == [f"{w1}#{t1}", w2]
    assert grants(r, "q") == {t1: "1000:7"}
    for key in (k.waiters, k.grants):
        assert 5_000 < r.pttl(key) <= 5_000 + 60_000, "both keys outlive the holder's TTL"
    score = r.zscore(k.waiters, f"{w1}#{t1}")
    assert score is not None and score <= server_time_us(r), "the server-time score of the 3-key form"
    assert r.hget(k.lock, "token") == holder.encode()


def test_a_granting_release_hands_the_lock_to_the_oldest_queued_lease_and_publishes_the_grant(r):
    name = "q x/é"  # names may contain spaces and any UTF-8
    holder = tok()
    prev = acquire(r, name, holder, 5_000)[1]
    k = proto.keys_for(name)
    w1, w2 = proto.new_wake_channel(), proto.new_wake_channel()
    t1, t2 = tok(), tok()
    assert acquire_g(r, name, t1, 7_000, w1, 11)[0] == 0
    assert acquire_g(r, name, t2, 3_000, w2, 12)[0] == 0
    ln = Listener(r, w1, w2, k.channel)
    try:
        before = server_time_us(r)
        assert release_g(r, name, holder) == 1
        got = ln.take_raw(k.channel, r)
    finally:
        ln.close()
    fence = int(r.hget(k.lock, "fence"))
    assert r.hget(k.lock, "token") == t1.encode()
    assert fence > prev and fence >= before, "the next fence, minted as ACQUIRE mints it"
    assert int(r.get(k.fence)) == fence
    assert 6_000 < r.pttl(k.lock) <= 7_000, "the queued attempt's TTL"
    n = notice_of(got, w1)
    assert (n.tag, n.fencing_token, n.ttl_ms, n.token, n.name) == (11, fence, 7_000, t1, name)
    assert [data for ch, data in got if ch == k.channel] == [name.encode()], "the release channel still hears it"
    assert [ch for ch, _ in got if ch == w2] == [], "one lease served per release"
    assert queue(r, name) == [f"{w2}#{t2}"]
    assert grants(r, name) == {t2: "3000:12"}, "the granted lease's field is gone"
    for key in (k.waiters, k.grants):  # refused under a 5 s hold: kept 65 s; now 7 s + 60 s
        assert 66_000 < r.pttl(key) <= 67_000, "the rest of the queue waits for the new grant"
    # The grantee's own release serves the next lease the same way.
    ln = Listener(r, w2)
    try:
        assert release_g(r, name, t1) == 1
        n2 = notice_of(ln.take_raw(w2, r), w2)
    finally:
        ln.close()
    assert (n2.tag, n2.token, n2.ttl_ms) == (12, t2, 3_000) and n2.fencing_token > fence
    assert r.hget(k.lock, "token") == t2.encode()
    assert queue(r, name) == [] and grants(r, name) == {}


def test_a_lease_whose_channel_has_no_subscriber_gets_no_grant_and_the_next_lease_gets_the_lock(r):
    holder = tok()
    acquire(r, "q", holder, 5_000)
    k = proto.keys_for("q")
    dead, w1 = proto.new_wake_channel(), proto.new_wake_channel()
    t0, t1 = tok(), tok()
    acquire_g(r, "q", t0, 9_000, dead, 1)
    acquire_g(r, "q", t1, 2_000, w1, 2)
    ahead = server_time_us(r) + 10**12  # fences count up by one from here, not with the clock
    r.set(k.fence, ahead)
    ln = Listener(r, w1)
    try:
        assert release_g(r, "q", holder) == 1
        n = notice_of(ln.take_raw(w1, r), w1)
    finally:
        ln.close()
    assert r.hgetall(k.lock) == {b"token": t1.encode(), b"fence": str(n.fencing_token).encode()}
    assert n.fencing_token == ahead + 1, "no grant (and no fence) for the lease nobody listens for"
    assert int(r.get(k.fence)) == n.fencing_token
    assert 1_000 < r.pttl(k.lock) <= 2_000, "t1's TTL"
    assert (n.token, n.tag, n.ttl_ms) == (t1, 2, 2_000)
    assert queue(r, "q") == [] and grants(r, "q") == {}, "the dead lease's entry and field are gone too"


def test_a_protocol_2_entry_between_leases_gets_the_plain_name_and_no_grant(r):
    holder = tok()
    acquire(r, "q", holder, 5_000)
    k = proto.keys_for("q")
    dead, w1, w2 = proto.new_wake_channel(), proto.new_wake_channel(), proto.new_wake_channel()
    t2 = tok()
    acquire_g(r, "q", tok(), 1_000, dead, 1)
    acquire_q(r, "q", tok(), 1_000, w1)
    acquire_g(r, "q", t2, 1_000, w2, 3)
    ln = Listener(r, w1, w2)
    try:
        assert release_g(r, "q", holder) == 1
        got = ln.take_raw(w2, r)
    finally:
        ln.close()
    assert got == [(w1, b"q")], "a plain wake-up, not a notice"
    assert proto.parse_grant_notice(got[0][1]) is None
    assert not r.exists(k.lock), "the dead lease's grant was undone; w1's client must ACQUIRE"
    assert queue(r, "q") == [f"{w2}#{t2}"]
    assert grants(r, "q") == {t2: "1000:3"}


def test_a_later_refused_attempt_overwrites_the_tag_and_ttl_but_keeps_the_place(r):
    holder = tok()
    acquire(r, "q", holder, 5_000)
    k = proto.keys_for("q")
    w1, w2 = proto.new_wake_channel(), proto.new_wake_channel()
    t1, t2 = tok(), tok()
    acquire_g(r, "q", t1, 1_000, w1, 1)
    score = r.zscore(k.waiters, f"{w1}#{t1}")
    acquire_g(r, "q", t2, 1_000, w2, 2)
    assert acquire_g(r, "q", t1, 4_000, w1, 18446744073709551615)[0] == 0
    assert queue(r, "q") == [f"{w1}#{t1}", f"{w2}#{t2}"], "kept its place"
    assert r.zscore(k.waiters, f"{w1}#{t1}") == score
    assert grants(r, "q")[t1] == "4000:18446744073709551615"
    ln = Listener(r, w1)
    try:
        assert release_g(r, "q", holder) == 1
        n = notice_of(ln.take_raw(w1, r), w1)
    finally:
        ln.close()
    assert (n.tag, n.ttl_ms, n.token) == (2**64 - 1, 4_000, t1), "the newest attempt's tag, as digits"
    assert 3_000 < r.pttl(k.lock) <= 4_000


def test_a_granted_granting_acquire_removes_its_own_entry_and_field_and_does_not_requeue(r):
    holder = tok()
    acquire(r, "q", holder, 5_000)
    k = proto.keys_for("q")
    w1, w2 = proto.new_wake_channel(), proto.new_wake_channel()
    t1, t2 = tok(), tok()
    acquire_g(r, "q", t1, 1_000, w1, 1)
    acquire_g(r, "q", t2, 1_000, w2, 2)
    r.delete(k.lock)  # the holder's TTL ran out
    flag, fence, ttl = acquire_g(r, "q", t1, 3_000, w1, 5)
    assert (flag, ttl) == (1, 3_000)
    assert r.hgetall(k.lock) == {b"token": t1.encode(), b"fence": str(fence).encode()}
    assert queue(r, "q") == [f"{w2}#{t2}"], "entries are per lease: the winner is not queued again"
    assert grants(r, "q") == {t2: "1000:2"}
    # The same again on a free lock nobody queued for: nothing is queued at all.
    assert release_g(r, "q2", tok()) == 0
    w3 = proto.new_wake_channel()
    assert acquire_g(r, "q2", tok(), 1_000, w3, 9)[0] == 1
    assert not r.exists(proto.keys_for("q2").waiters) and not r.exists(proto.keys_for("q2").grants)


def test_an_acquire_by_the_directly_granted_token_is_the_idempotent_re_grant(r):
    holder = tok()
    acquire(r, "q", holder, 5_000)
    w1 = proto.new_wake_channel()
    t1 = tok()
    acquire_g(r, "q", t1, 2_000, w1, 1)
    ln = Listener(r, w1)
    try:
        release_g(r, "q", holder)
        n = notice_of(ln.take_raw(w1, r), w1)
    finally:
        ln.close()
    # A retry timer's attempt that crossed the notice: the same grant, the TTL refreshed.
    assert acquire_g(r, "q", t1, 9_000, w1, 2) == [1, n.fencing_token, 9_000]
    assert r.pttl(proto.keys_for("q").lock) > 2_000
    assert acquire(r, "q", t1, 9_000) == [1, n.fencing_token, 9_000]
    assert int(r.get(proto.keys_for("q").fence)) == n.fencing_token, "no new fence minted"
    assert queue(r, "q") == [] and grants(r, "q") == {}


def test_a_protocol_2_release_and_notify_give_a_lease_entry_a_plain_wake_up(r):
    holder = tok()
    acquire(r, "q", holder, 5_000)
    k = proto.keys_for("q")
    w1, w2 = proto.new_wake_channel(), proto.new_wake_channel()
    t1, t2 = tok(), tok()
    acquire_g(r, "q", t1, 1_000, w1, 1)
    acquire_g(r, "q", t2, 1_000, w2, 2)
    ln = Listener(r, w1, w2)
    try:
        assert release_q(r, "q", holder) == 1  # the 2-key form of a protocol-2 client
        assert ln.take_raw(w1, r) == [(w1, b"q")]
        assert not r.exists(k.lock), "no grant: w1's client retries with ACQUIRE"
        assert grants(r, "q") == {t1: "1000:1", t2: "1000:2"}, "a stale field stays (harmless)"
        assert notify(r, "q") == 1
        assert ln.take_raw(w1, r) == [(w2, b"q")]
    finally:
        ln.close()
    assert queue(r, "q") == []
    # The stale field is overwritten by the lease's next refusal and granted from there.
    holder = tok()
    acquire(r, "q", holder, 5_000)
    acquire_g(r, "q", t1, 2_500, w1, 3)
    assert grants(r, "q")[t1] == "2500:3"


@pytest.mark.parametrize("kind", ["string", "list", "set", "zset", "stream"])
def test_a_grants_key_of_another_type_fails_a_refusal_clearly_and_never_grants(r, kind):
    holder = tok()
    acquire(r, "q", holder, 5_000)
    k = proto.keys_for("q")
    _plant(r, k.grants, kind)
    dump = r.dump(k.grants)
    w1 = proto.new_wake_channel()
    t1 = tok()
    with pytest.raises(redis.ResponseError, match=f"^lh: grants key lh:{{q}}:grants holds a {kind}, expected a hash"):
        acquire_g(r, "q", t1, 1_000, w1, 1)
    assert r.hget(k.lock, "token") == holder.encode()
    assert queue(r, "q") == [], "nothing queued"
    r.zadd(k.waiters, {f"{w1}#{t1}": 1})  # as if queued before the key went bad
    ln = Listener(r, w1)
    try:
        assert release_g(r, "q", holder) == 1
        assert ln.take_raw(w1, r) == [(w1, b"q")], "a plain wake-up"
    finally:
        ln.close()
    assert not r.exists(k.lock)
    assert r.dump(k.grants) == dump and r.pttl(k.grants) == -1, "left as it was"
    flag, fence, _ = acquire_g(r, "q", t1, 1_000, w1, 2)
    assert flag == 1 and fence > 0, "a free lock is granted all the same"
    assert r.dump(k.grants) == dump and r.pttl(k.grants) == -1


@pytest.mark.parametrize(
    "value",
    [
        None,  # a lease entry without a field
        "",
        "abc",
        "1000",
        "1000:",
        ":5",
        "0:5",
        "01000:5",
        "-5:1",
        "1000:x",
        "1000:5:6",
        "1000:-5",
        "1 000:5",
        "1234567890123456:1",
        "1000:123456789012345678901",
    ],
)
def test_a_lease_entry_without_a_valid_grants_field_gets_a_plain_wake_up(r, value):
    holder = tok()
    acquire(r, "q", holder, 5_000)
    k = proto.keys_for("q")
    w1, t1 = proto.new_wake_channel(), tok()
    r.zadd(k.waiters, {f"{w1}#{t1}": 1})
    if value is not None:
        r.hset(k.grants, t1, value)
    ln = Listener(r, w1)
    try:
        assert release_g(r, "q", holder) == 1
        assert ln.take_raw(w1, r) == [(w1, b"q")]
    finally:
        ln.close()
    assert not r.exists(k.lock), "never a grant"
    assert grants(r, "q") == {}, "the popped entry's field is gone"


@pytest.mark.parametrize("garbage", ["hello", "9007199254740991", "list"])
def test_a_garbage_fence_key_during_a_direct_grant_gives_a_plain_wake_up_not_a_grant(r, garbage):
    holder = tok()
    acquire(r, "q", holder, 5_000)
    k = proto.keys_for("q")
    w1, t1 = proto.new_wake_channel(), tok()
    acquire_g(r, "q", t1, 1_000, w1, 1)
    r.delete(k.fence)
    if garbage == "list":
        r.rpush(k.fence, "1")
    else:
        r.set(k.fence, garbage)  # text, or a fence space that is used up
    dump = r.dump(k.fence)
    ln = Listener(r, w1)
    try:
        assert release_g(r, "q", holder) == 1
        assert ln.take_raw(w1, r) == [(w1, b"q")]
    finally:
        ln.close()
    assert not r.exists(k.lock)
    assert r.dump(k.fence) == dump
    with pytest.raises(redis.ResponseError, match=r"^lh: fence key lh:\{q\}:fence"):
        acquire_g(r, "q", t1, 1_000, w1, 2)  # where the woken client meets the error


@pytest.mark.parametrize("tag", ["", "x", "-1", "+1", "1.5", "1e3", " 1", "1" * 21])
def test_malformed_tags_are_refused(r, tag):
    holder = tok()
    acquire(r, "q", holder, 5_000)
    with pytest.raises(redis.ResponseError, match="^lh: ACQUIRE with a grants key needs a tag of 1..20 decimal digits"):
        acquire_g(r, "q", tok(), 1_000, proto.new_wake_channel(), tag)
    k = proto.keys_for("q")
    with pytest.raises(redis.ResponseError, match="^lh: ACQUIRE with a grants key needs a tag"):
        r.eval(ACQ.text, 4, k.lock, k.fence, k.waiters, k.grants, tok(), 1_000, proto.new_wake_channel())
    assert not r.exists(k.waiters) and not r.exists(k.grants)
    assert acquire_g(r, "q", tok(), 1_000, proto.new_wake_channel(), "0" * 20)[0] == 0


def test_a_wake_channel_with_a_hash_is_refused_by_the_granting_acquire(r):
    k = proto.keys_for("q")
    with pytest.raises(redis.ResponseError, match="^lh: ACQUIRE with a grants key needs a wake channel without a hash sign"):
        acquire_g(r, "q", tok(), 1_000, "lh:wake:a#b", 1)
    with pytest.raises(redis.ResponseError, match="^lh: ACQUIRE with a waiters key needs a wake channel"):
        acquire_g(r, "q", tok(), 1_000, "other:channel", 1)
    assert not r.exists(k.lock) and not r.exists(k.waiters)


def test_tokens_with_spaces_and_hashes_are_granted_and_announced_intact(r):
    holder = tok()
    acquire(r, "q", holder, 5_000)
    w1 = proto.new_wake_channel()
    t1 = "a b#c 7 "
    acquire_g(r, "q", t1, 1_000, w1, 4)
    assert queue(r, "q") == [f"{w1}#{t1}"]
    ln = Listener(r, w1)
    try:
        assert release_g(r, "q", holder) == 1
        n = notice_of(ln.take_raw(w1, r), w1)
    finally:
        ln.close()
    assert (n.token, n.name, n.tag) == (t1, "q", 4)
    assert r.hget(proto.keys_for("q").lock, "token") == t1.encode()


def test_a_granting_release_by_a_non_owner_grants_nothing_and_drops_the_callers_entry(r):
    holder = tok()
    acquire(r, "q", holder, 5_000)
    w_mine, w1, t1 = proto.new_wake_channel(), proto.new_wake_channel(), tok()
    acquire_q(r, "q", tok(), 1_000, w_mine)
    acquire_g(r, "q", t1, 1_000, w1, 1)
    assert release_g(r, "q", tok(), skip=w_mine) == 0
    assert r.hget(proto.keys_for("q").lock, "token") == holder.encode()
    assert queue(r, "q") == [f"{w1}#{t1}"] and grants(r, "q") == {t1: "1000:1"}


def test_packed_granting_commands_are_what_redis_py_would_send_and_run(r):
    conn = redis.Connection()
    name = "caf\u00e9 q"
    k, w, t = proto.keys_for(name), proto.wire_for(name), tok()
    wake = proto.new_wake_channel()
    for by_text in (False, True):

        def ref(kind: int, nkeys: int, *args: object) -> bytes:
            s = proto.script(kind)
            head = ("EVAL", s.text) if by_text else ("EVALSHA", s.sha)
            return b"".join(conn.pack_command(*head, nkeys, *args))

        assert proto.pack_acquire(w, t, 1234, by_text, wake, tag=77) == ref(
            proto.SCRIPT_ACQUIRE, 4, k.lock, k.fence, k.waiters, k.grants, t, 1234, wake, 77
        )
        assert proto.pack_release(w, t, by_text, grant=True) == ref(
            proto.SCRIPT_RELEASE, 4, k.lock, k.waiters, k.fence, k.grants, t, k.channel, name
        )
        assert proto.pack_release(w, t, by_text, wake, grant=True) == ref(
            proto.SCRIPT_RELEASE, 4, k.lock, k.waiters, k.fence, k.grants, t, k.channel, name, wake
        )
        assert proto.pack_release(w, t, by_text, wake) == ref(
            proto.SCRIPT_RELEASE, 2, k.lock, k.waiters, t, k.channel, name, wake
        ), "the protocol-2 form is unchanged"
    for bad in (-1, 2**64, True, 1.5, "7", b"7"):
        with pytest.raises(ValueError):
            proto.pack_acquire(w, t, 1234, False, wake, tag=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        proto.pack_acquire(w, t, 1234, False, None, tag=1)
    assert proto.pack_acquire(w, t, 1234, False, wake, tag=0).endswith(b"$1\r\n0\r\n")
    # Sent as they are (EVAL: no script cached) they do what the scripts say.
    holder = tok()
    acquire(r, name, holder, 5_000)
    c = r.connection_pool.get_connection()
    try:
        c.send_packed_command([proto.pack_acquire(w, t, 2_000, True, wake, tag=2**64 - 1)])
        assert c.read_response()[0] == 0
        assert grants(r, name) == {t: "2000:18446744073709551615"}
        ln = Listener(r, wake)
        try:
            c.send_packed_command([proto.pack_release(w, holder, True, proto.new_wake_channel(), grant=True)])
            assert c.read_response() == 1
            n = notice_of(ln.take_raw(wake, r), wake)
        finally:
            ln.close()
        assert (n.tag, n.token, n.name, n.ttl_ms) == (2**64 - 1, t, name, 2_000)
    finally:
        r.connection_pool.release(c)


# ---- grant notices (pure parsing; mirrors leasehold::redis::parse_grant_notice) --------------------
def lua_notice(tag: str, fence: str, ttl: str, token: bytes, name: bytes) -> bytes:
    """A notice exactly as the RELEASE script concatenates it."""
    return b"\0grant " + f"{tag} {fence} {ttl} {len(token)} ".encode() + token + name


def test_grant_notices_parse_like_the_script_writes_them():
    n = proto.parse_grant_notice(lua_notice("42", "1733000000123456", "30000", b"tok en", "r\u00e4ks 1".encode()))
    assert n == proto.GrantNotice(tag=42, fencing_token=1733000000123456, ttl_ms=30000, token="tok en", name="r\u00e4ks 1")
    big = proto.parse_grant_notice(lua_notice(str(2**64 - 1), str(2**53 - 1), str(2**64 - 1), b"x" * 256, b"n" * 512))
    assert big is not None and (big.tag, big.fencing_token, big.ttl_ms) == (2**64 - 1, 2**53 - 1, 2**64 - 1)
    assert proto.parse_grant_notice(lua_notice("007", "5", "9", b"t", b"n")).tag == 7  # type: ignore[union-attr]
    assert proto.parse_grant_notice(bytearray(lua_notice("1", "2", "3", b"t", b"n"))) is not None
    n = proto.parse_grant_notice(b"\0grant 1 2 3 3  tokjobs")
    assert n is not None and (n.token, n.name) == (" to", "kjobs"), "the length decides, not spaces"
    with pytest.raises(Exception):
        n.tag = 5  # type: ignore[misc]  # frozen


@pytest.mark.parametrize(
    "data",
    [
        b"jobs",
        b"",
        b"\0",
        b"\0grant",
        b"grant 1 2 3 3 tokjobs",
        b" \0grant 1 2 3 1 tn",
        b"\0GRANT 1 2 3 3 tokjobs",
        b"\0grant\t1 2 3 3 tokjobs",
        b"\0grant  1 2 3 3 tokjobs",
        b"\0grant 1  2 3 3 tokjobs",
        b"\0grant 1 2 3 9 tokjobs",
        b"\0grant 1 2 3 7 tokjobs",
        b"\0grant 1 2 3 99999999999999999999 tokjobs",
        b"\0grant 1 2 3 3",
        b"\0grant 1 2 3 ",
        b"\0grant 1 2 3",
        b"\0grant 1 2",
        b"\0grant 1 0 3 3 tokjobs",
        b"\0grant 1 9007199254740992 3 3 tokjobs",
        b"\0grant 1 2 0 3 tokjobs",
        b"\0grant 1 2 3 0 jobs",
        b"\0grant 18446744073709551616 2 3 3 tokjobs",
        b"\0grant 123456789012345678901 2 3 3 tokjobs",
        b"\0grant -1 2 3 3 tokjobs",
        b"\0grant +1 2 3 3 tokjobs",
        b"\0grant 1.0 2 3 3 tokjobs",
        b"\0grant \xd9\xa1 2 3 3 tokjobs",  # a non-ASCII digit
        b"\0grant 1 2 3 3 tok",
        b"\0grant 1 2 3 3 tok\xff\xfe",
        b"\0grant 1 2 3 3 toka\0b",
        b"\0grant 1 2 3 3 tok" + b"n" * 513,
        b"\0grant 1 2 3 3 t\xc3\xa4jobs",  # a token the Python side cannot hold (not ASCII)
        b"\0grant 1 2 3 257 " + b"x" * 257 + b"jobs",
    ],
)
def test_plain_wake_ups_and_malformed_notices_are_not_notices(data):
    assert proto.parse_grant_notice(data) is None


def test_the_notice_parser_never_raises():
    good = lua_notice("12", "345", "678", b"a token", b"name")
    for cut in range(len(good)):
        n = proto.parse_grant_notice(good[:cut])
        assert n is None or (n.token == "a token" and len(n.name) < 4)
    for odd in (None, 5, "\0grant 1 2 3 1 tn", [b"\0grant"], memoryview(good)):
        proto.parse_grant_notice(odd)  # type: ignore[arg-type]
    assert proto.parse_grant_notice(memoryview(good)) is not None
