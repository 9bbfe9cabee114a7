"""The Redis protocol shared by :mod:`.redis` and :mod:`.redis_async`.

Nothing here is retyped from the design: the Lua scripts and the key layout are read from the
native library through the C ABI (``lh_redis_script`` / ``lh_redis_key``), so the Python, Go
and C++ transports run the same bytes against the same keys.

Calling convention (docs/design.md §6; the full protocol: docs/redis-protocol-3.md):

- ACQUIRE ``KEYS=[lock, fence] ARGV=[token, ttl_ms]`` → ``[1, fencing_token, ttl_ms]`` or
  ``[0, retry_after_ms | -1]``; a client that has waiters for the name adds the waiters key
  and its wake channel (``KEYS=[lock, fence, waiters] ARGV=[token, ttl_ms, wake]``) so a
  refused attempt queues it, or (protocol 3) the grants key and the attempt's tag too
  (``KEYS=[lock, fence, waiters, grants] ARGV=[token, ttl_ms, wake, tag]``) so a refused
  attempt queues the lease (``wake#token``) for a direct grant on release;
- RENEW ``KEYS=[lock] ARGV=[token, ttl_ms]`` → ``1 | 0``;
- RELEASE ``KEYS=[lock, waiters] ARGV=[token, channel, name(, own wake)]`` → ``1 | 0`` (1
  wakes the oldest live queued client and publishes ``name`` on the release channel); with
  ``KEYS=[lock, waiters, fence, grants]`` (protocol 3) the oldest live queued lease is granted
  the lock directly and gets a grant notice on its wake channel (:func:`parse_grant_notice`);
- NOTIFY ``KEYS=[waiters] ARGV=[name(, own wake)]`` → ``1 | 0``: passes on a wake-up that
  reached a client with no waiter for the name any more.

Garbage in the keyspace makes a script answer with a Redis error whose message starts with
``lh:``; redis-py raises it as ``ResponseError``, which the core treats as a transport error.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import secrets
import threading
from dataclasses import dataclass, replace
from typing import Callable, Generic, TypeVar

from .. import _ffi, errors
from ..service import Granted, HeldByOther

__all__ = [
    "SCRIPT_ACQUIRE",
    "SCRIPT_RENEW",
    "SCRIPT_RELEASE",
    "KEY_LOCK",
    "KEY_FENCE",
    "KEY_CHANNEL",
    "KEY_WAITERS",
    "KEY_GRANTS",
    "SCRIPT_NOTIFY",
    "new_wake_channel",
    "offer_wake",
    "QueueEntries",
    "Script",
    "ProtocolError",
    "script",
    "key",
    "keys_for",
    "parse_acquire",
    "parse_flag",
    "Wire",
    "wire_for",
    "pack_acquire",
    "pack_renew",
    "pack_release",
    "GrantNotice",
    "parse_grant_notice",
]

SCRIPT_ACQUIRE = 1
SCRIPT_RENEW = 2
SCRIPT_RELEASE = 3
SCRIPT_NOTIFY = 4
KEY_LOCK = 1
KEY_FENCE = 2
KEY_CHANNEL = 3
KEY_WAITERS = 4
KEY_GRANTS = 5
#: Random bytes a wake channel is made of (``LH_REDIS_WAKE_RANDOM_LEN``).
WAKE_RANDOM_LEN = 16

_LH_OK = 0
_LH_ERR_BUFFER_TOO_SMALL = 14


class ProtocolError(Exception):
    """Redis answered a script with a reply of the wrong shape (a transport error for the core)."""


def _declare() -> ctypes.CDLL:
    lib = _ffi.lib
    try:
        script_fn = lib.lh_redis_script
        key_fn = lib.lh_redis_key
        wake_fn = lib.lh_redis_wake_channel
    except AttributeError as e:  # pragma: no cover - only with an older library
        raise errors.LibraryError(
            f"{_ffi.library_path} does not export lh_redis_script/lh_redis_key/lh_redis_wake_channel; "
            "rebuild it with `cargo build --release`"
        ) from e
    script_fn.argtypes = [ctypes.c_uint32, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t)]
    script_fn.restype = ctypes.c_uint32
    key_fn.argtypes = [
        ctypes.c_uint32,
        ctypes.POINTER(ctypes.c_uint8),
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_uint8),
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_size_t),
    ]
    key_fn.restype = ctypes.c_uint32
    wake_fn.argtypes = [
        ctypes.POINTER(ctypes.c_uint8),
        ctypes.POINTER(ctypes.c_uint8),
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_size_t),
    ]
    wake_fn.restype = ctypes.c_uint32
    return lib


_lib = _declare()


@dataclass(frozen=True)
class Script:
    """One canonical script: its kind, text, SHA1 (for EVALSHA) and number of KEYS in its
    basic form (ACQUIRE and RELEASE also take the waiters key as one more)."""

    kind: int
    text: str
    sha: str
    num_keys: int


def _read_script(kind: int) -> Script:
    text_p = ctypes.c_char_p()
    length = ctypes.c_size_t()
    status = _lib.lh_redis_script(kind, ctypes.byref(text_p), ctypes.byref(length))
    if status != _LH_OK:
        raise _ffi.make_error(status, f"script kind {kind}", "lh_redis_script")
    raw = ctypes.string_at(text_p, length.value)
    text = raw.decode("utf-8")
    return Script(
        kind=kind,
        text=text,
        sha=hashlib.sha1(raw).hexdigest(),
        num_keys=2 if kind == SCRIPT_ACQUIRE else 1,
    )


_SCRIPTS: dict[int, Script] = {k: _read_script(k) for k in (SCRIPT_ACQUIRE, SCRIPT_RENEW, SCRIPT_RELEASE, SCRIPT_NOTIFY)}


def script(kind: int) -> Script:
    """The canonical script of ``kind`` (``SCRIPT_ACQUIRE`` / ``_RENEW`` / ``_RELEASE`` / ``_NOTIFY``)."""
    try:
        return _SCRIPTS[kind]
    except KeyError:
        raise ValueError(f"unknown Redis script kind {kind!r}") from None


def key(kind: int, name: str) -> str:
    """The Redis key of ``kind`` for lock ``name``, formatted by the library (``lh_redis_key``).

    Raises :class:`leasehold.errors.InvalidArgument` for names the core refuses (empty, over
    512 bytes, containing NUL).
    """
    if not isinstance(name, str):
        raise TypeError(f"lock names are str, not {type(name).__name__}")
    raw = name.encode("utf-8")
    src = (ctypes.c_uint8 * max(len(raw), 1)).from_buffer_copy(raw or b"\0")
    size = len(raw) + 32
    for _ in range(2):
        buf = (ctypes.c_uint8 * size)()
        out_len = ctypes.c_size_t()
        status = _lib.lh_redis_key(kind, src, len(raw), buf, size, ctypes.byref(out_len))
        if status == _LH_OK:
            return bytes(buf[: out_len.value]).decode("utf-8")
        if status == _LH_ERR_BUFFER_TOO_SMALL and out_len.value > size:
            size = out_len.value
            continue
        raise _ffi.make_error(status, f"name {name[:64]!r}", "lh_redis_key")
    raise ProtocolError("lh_redis_key kept asking for a larger buffer")  # pragma: no cover


@dataclass(frozen=True)
class Keys:
    lock: str
    fence: str
    channel: str
    waiters: str
    grants: str


_CACHE_MAX = 4096
_cache: dict[str, Keys] = {}
_cache_lock = threading.Lock()


def keys_for(name: str) -> Keys:
    """The keys of ``name`` (cached: one C call per key of a new name, bounded memory)."""
    found = _cache.get(name)
    if found is not None:
        return found
    keys = Keys(
        key(KEY_LOCK, name),
        key(KEY_FENCE, name),
        key(KEY_CHANNEL, name),
        key(KEY_WAITERS, name),
        key(KEY_GRANTS, name),
    )
    with _cache_lock:
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        _cache[name] = keys
    return keys


def new_wake_channel() -> str:
    """A fresh wake channel for one subscriber: the library formats it
    (``lh_redis_wake_channel``, the same format in every binding) from 128 bits of OS
    randomness."""
    random = (ctypes.c_uint8 * WAKE_RANDOM_LEN).from_buffer_copy(secrets.token_bytes(WAKE_RANDOM_LEN))
    size = 64
    buf = (ctypes.c_uint8 * size)()
    out_len = ctypes.c_size_t()
    status = _lib.lh_redis_wake_channel(random, buf, size, ctypes.byref(out_len))
    if status != _LH_OK:  # pragma: no cover - the channel is 40 bytes
        raise _ffi.make_error(status, "wake channel", "lh_redis_wake_channel")
    return bytes(buf[: out_len.value]).decode("ascii")


def offer_wake(on_wake: Callable[[str], object] | None, name: str) -> bool:
    """Offer a wake-up for ``name`` to the waiter callback registered for it (the sync and
    asyncio services alike); whether it was taken, else the caller passes it on. ``None`` from
    the callback counts as taken (an asyncio client called from another thread cannot tell at
    once); one that raises is logged and counts as not taken."""
    if on_wake is None:
        return False
    try:
        return on_wake(name) is not False
    except Exception:  # a callback bug must not kill the subscriber
        logging.getLogger("leasehold.redis").exception("leasehold redis wake-up callback failed for %r", name)
        return False


class GrantRoute:
    """Which clients a grant notice goes to (the sync and the asyncio service alike). Its lease
    may hold the lock already (its own ACQUIRE won the race with the notice), so only the
    owning client's core may decide what the grant means.

    A service used by one client (the usual case) gives it every notice, and that client
    releases a grant no lease of it owns. Once a second client has waited through the service
    it is *shared*: wake-up callbacks are per name, not per lease, so a notice goes to every
    client, each marked ``shared`` (the owner's core takes it; the others must not release it:
    a grant nobody owns then runs out by its TTL), and the service stops tagging attempts
    (protocol 2 from then on). Before any client waited, nothing of ours can hold a grant."""

    _MAX_CLIENTS = 64  # beyond this many clients on one service, later ones hear no notices

    def __init__(self) -> None:
        self.clients: list[Callable[..., object]] = []
        self._owners: list[object] = []

    def saw(self, on_wake: Callable[..., object]) -> None:
        """A client registered ``on_wake`` (a bound method of the client, or any callable)."""
        owner = getattr(on_wake, "__self__", on_wake)
        if not any(o is owner for o in self._owners) and len(self._owners) < self._MAX_CLIENTS:
            self._owners.append(owner)
            self.clients.append(on_wake)

    def shared(self) -> bool:
        """True once two clients waited through the service."""
        return len(self._owners) > 1


def lease_entry(wake: str, token: str) -> str:
    """A waiting lease's queue member (protocol 3): its client's wake channel, ``#``, its
    token (``leasehold::redis::ENTRY_SEPARATOR``; the scripts split at the first ``#``)."""
    return f"{wake}#{token}"


def offer_notice(clients: list[Callable[..., object]], notice: GrantNotice) -> bool:
    """Offer a grant notice to the clients of a service (the sync and the asyncio one alike;
    see :class:`GrantRoute`): several clients each get it marked ``shared``. Whether one took
    it; a callback that raises is logged and counts as not taken."""
    if len(clients) > 1:
        notice = replace(notice, shared=True)
    taken = False
    for cb in clients:
        try:
            taken = cb(notice.name, notice) is not False or taken
        except Exception:  # a callback bug must not kill the subscriber
            logging.getLogger("leasehold.redis").exception("leasehold redis grant callback failed for %r", notice.name)
    return taken


class QueueEntries:
    """Which names' waiters key may hold our wake channel, and whether the queueing attempt
    that put it there won (the winner stays queued until its own RELEASE drops the entry).
    The bookkeeping of the sync and the asyncio service alike."""

    def __init__(self) -> None:
        self._won: dict[str, bool] = {}

    def sent(self, name: str) -> None:
        """A queueing ACQUIRE for ``name`` is on its way."""
        self._won[name] = False

    def answered(self, name: str, granted: bool) -> None:
        self._won[name] = granted

    def stale_entry(self, name: str, waiting: bool, wake: str) -> str | None:
        """``wake`` if our entry may still be queued for ``name`` although nobody here waits
        (``waiting`` false): RELEASE then drops it instead of waking us."""
        if name in self._won and not waiting:
            del self._won[name]
            return wake
        return None

    def gave_up(self, name: str) -> bool:
        """Nobody here waits for ``name`` any more: true when the entry is from an attempt
        that did not win, which the caller then removes (ZREM) itself."""
        if self._won.get(name) is False:
            del self._won[name]
            return True
        return False


def _as_int(v: object, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ProtocolError(f"{what}: expected an integer, got {v!r}")
    return v


def parse_acquire(reply: object) -> Granted | HeldByOther:
    """Turn an ACQUIRE reply into the service result (or raise :class:`ProtocolError`)."""
    if type(reply) is list:  # the usual replies, checked without a call per field
        if len(reply) == 3:
            flag, fence, ttl = reply
            if type(flag) is int and type(fence) is int and type(ttl) is int and flag == 1 and fence > 0 and ttl > 0:
                return Granted(fencing_token=fence, ttl_ms=ttl)
        elif len(reply) == 2:
            flag, retry = reply
            if type(flag) is int and type(retry) is int and flag == 0:
                return HeldByOther(retry_after_ms=None if retry < 0 else retry)
    if not isinstance(reply, (list, tuple)) or not reply:
        raise ProtocolError(f"ACQUIRE: expected an array reply, got {reply!r}")
    flag = _as_int(reply[0], "ACQUIRE status")
    if flag == 1 and len(reply) == 3:
        fence = _as_int(reply[1], "ACQUIRE fencing token")
        ttl = _as_int(reply[2], "ACQUIRE ttl")
        if fence <= 0 or ttl <= 0:
            raise ProtocolError(f"ACQUIRE: nonsensical grant {reply!r}")
        return Granted(fencing_token=fence, ttl_ms=ttl)
    if flag == 0 and len(reply) == 2:
        retry = _as_int(reply[1], "ACQUIRE retry hint")
        return HeldByOther(retry_after_ms=None if retry < 0 else retry)
    raise ProtocolError(f"ACQUIRE: unexpected reply {reply!r}")


def parse_flag(reply: object, what: str) -> bool:
    """Turn a RENEW/RELEASE reply (1 or 0) into a bool (or raise :class:`ProtocolError`)."""
    if type(reply) is int and (reply == 1 or reply == 0):
        return reply == 1
    v = _as_int(reply, what)
    if v not in (0, 1):
        raise ProtocolError(f"{what}: expected 0 or 1, got {v!r}")
    return v == 1


def ttl_arg(ttl_ms: int) -> int:
    """Validate a TTL before it goes on the wire (the script refuses anything else anyway)."""
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or ttl_ms <= 0:
        raise ValueError(f"ttl_ms must be a positive int, got {ttl_ms!r}")
    return ttl_ms


# ---- pre-encoded commands (RESP) for transports that write to the socket themselves ----------
def _bulk(b: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(b), b)


def _heads(s: Script, argc: int, extra_keys: int = 0) -> tuple[bytes, bytes]:
    """RESP array headers ``EVALSHA sha numkeys`` and ``EVAL text numkeys`` for ``argc`` more
    arguments (keys + ARGV); ``extra_keys``: how many keys beyond the script's basic ones
    (the waiters key; protocol 3 also the fence/grants keys)."""
    nk = _bulk(str(s.num_keys + extra_keys).encode())
    n = 3 + argc
    sha = b"*%d\r\n" % n + _bulk(b"EVALSHA") + _bulk(s.sha.encode()) + nk
    text = b"*%d\r\n" % n + _bulk(b"EVAL") + _bulk(s.text.encode("utf-8")) + nk
    return sha, text


# (EVALSHA head, EVAL head) per calling form: acquire 2 keys + 2 ARGV (queueing: 3 + 3; direct
# grant: 4 + 4), renew 1 + 2, release 2 + 3 (dropping our own queue entry: 2 + 4; direct
# grant: 4 + 3, or 4 + 4).
_HEAD_ACQUIRE = _heads(_SCRIPTS[SCRIPT_ACQUIRE], 4)
_HEAD_ACQUIRE_QUEUED = _heads(_SCRIPTS[SCRIPT_ACQUIRE], 6, extra_keys=1)
_HEAD_ACQUIRE_GRANT = _heads(_SCRIPTS[SCRIPT_ACQUIRE], 8, extra_keys=2)
_HEAD_RENEW = _heads(_SCRIPTS[SCRIPT_RENEW], 3)
_HEAD_RELEASE = _heads(_SCRIPTS[SCRIPT_RELEASE], 5, extra_keys=1)
_HEAD_RELEASE_SKIP = _heads(_SCRIPTS[SCRIPT_RELEASE], 6, extra_keys=1)
_HEAD_RELEASE_GRANT = _heads(_SCRIPTS[SCRIPT_RELEASE], 7, extra_keys=3)
_HEAD_RELEASE_GRANT_SKIP = _heads(_SCRIPTS[SCRIPT_RELEASE], 8, extra_keys=3)


@dataclass(frozen=True)
class Wire:
    """The RESP-encoded per-name arguments: ``KEYS`` of ACQUIRE (plain, queueing, and direct
    grant: ``lock fence waiters grants``), ``KEYS`` of RENEW, ``KEYS`` of RELEASE (with the
    waiters key, and direct grant: ``lock waiters fence grants``) and its trailing
    ``channel name`` (UTF-8, exactly the bytes of :func:`keys_for`)."""

    acquire_keys: bytes
    acquire_keys_queued: bytes
    acquire_keys_grant: bytes
    lock_key: bytes
    release_keys: bytes
    release_keys_grant: bytes
    release_tail: bytes


_wire: dict[str, Wire] = {}


def wire_for(name: str) -> Wire:
    """The pre-encoded arguments of ``name`` (cached like :func:`keys_for`)."""
    found = _wire.get(name)
    if found is not None:
        return found
    k = keys_for(name)
    lock = _bulk(k.lock.encode("utf-8"))
    fence = _bulk(k.fence.encode("utf-8"))
    waiters = _bulk(k.waiters.encode("utf-8"))
    grants = _bulk(k.grants.encode("utf-8"))
    w = Wire(
        acquire_keys=lock + fence,
        acquire_keys_queued=lock + fence + waiters,
        acquire_keys_grant=lock + fence + waiters + grants,
        lock_key=lock,
        release_keys=lock + waiters,
        release_keys_grant=lock + waiters + fence + grants,
        release_tail=_bulk(k.channel.encode("utf-8")) + _bulk(name.encode("utf-8")),
    )
    with _cache_lock:
        if len(_wire) >= _CACHE_MAX:
            _wire.clear()
        _wire[name] = w
    return w


def pack_acquire(
    w: Wire, token: str, ttl_ms: int, by_text: bool = False, wake: str | None = None, tag: int | None = None
) -> bytes:
    """ACQUIRE as one RESP command (EVALSHA, or EVAL with the text when ``by_text``); with
    ``wake``, a refused attempt queues that wake channel; with ``tag`` too (the attempt's id,
    ``0 <= tag < 2**64``), it queues the lease for a direct grant on release (protocol 3)."""
    t = token.encode("ascii")
    ttl = b"%d" % (ttl_ms if type(ttl_ms) is int and ttl_ms > 0 else ttl_arg(ttl_ms))  # no call when valid
    if wake is None:
        if tag is not None:
            raise ValueError("pack_acquire: a tag needs a wake channel")
        return b"%s%s$%d\r\n%s\r\n$%d\r\n%s\r\n" % (_HEAD_ACQUIRE[by_text], w.acquire_keys, len(t), t, len(ttl), ttl)
    c = wake.encode("ascii")
    if tag is not None:
        g = b"%d" % (tag if type(tag) is int and 0 <= tag < _TAG_LIMIT else _tag_arg(tag))
        return b"%s%s$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
            _HEAD_ACQUIRE_GRANT[by_text],
            w.acquire_keys_grant,
            len(t),
            t,
            len(ttl),
            ttl,
            len(c),
            c,
            len(g),
            g,
        )
    return b"%s%s$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
        _HEAD_ACQUIRE_QUEUED[by_text],
        w.acquire_keys_queued,
        len(t),
        t,
        len(ttl),
        ttl,
        len(c),
        c,
    )


def pack_renew(w: Wire, token: str, ttl_ms: int, by_text: bool = False) -> bytes:
    t = token.encode("ascii")
    ttl = b"%d" % (ttl_ms if type(ttl_ms) is int and ttl_ms > 0 else ttl_arg(ttl_ms))
    return b"%s%s$%d\r\n%s\r\n$%d\r\n%s\r\n" % (_HEAD_RENEW[by_text], w.lock_key, len(t), t, len(ttl), ttl)


def pack_release(w: Wire, token: str, by_text: bool = False, skip: str | None = None, grant: bool = False) -> bytes:
    """RELEASE; ``skip`` is our own wake channel when we queued for this name earlier but no
    longer wait for it (the script drops it before it wakes the next client). ``grant``: the
    4-key form (protocol 3), which grants the lock directly to the oldest live queued lease."""
    t = token.encode("ascii")
    if grant:
        head, keys = _HEAD_RELEASE_GRANT_SKIP if skip is not None else _HEAD_RELEASE_GRANT, w.release_keys_grant
    else:
        head, keys = _HEAD_RELEASE_SKIP if skip is not None else _HEAD_RELEASE, w.release_keys
    if skip is None:
        return b"%s%s$%d\r\n%s\r\n%s" % (head[by_text], keys, len(t), t, w.release_tail)
    return b"%s%s$%d\r\n%s\r\n%s%s" % (head[by_text], keys, len(t), t, w.release_tail, _bulk(skip.encode("ascii")))


_TAG_LIMIT = 1 << 64


def _tag_arg(tag: object) -> int:
    """Validate an attempt tag before it goes on the wire (the script takes 1..20 digits)."""
    if isinstance(tag, bool) or not isinstance(tag, int) or not 0 <= tag < _TAG_LIMIT:
        raise ValueError(f"tag must be an int in 0..2**64-1, got {tag!r}")
    return tag


# ---- grant notices (protocol 3) ---------------------------------------------------------------
#: Every grant notice starts with these bytes; a lock name never contains NUL.
GRANT_NOTICE_PREFIX = b"\0grant "
_MAX_FENCE = (1 << 53) - 1
_MAX_TOKEN_LEN = 256
_MAX_NAME_LEN = 512
_U64_LIMIT = 1 << 64


@dataclass(frozen=True)
class GrantNotice:
    """A direct grant published on our wake channel by a 4-key RELEASE (protocol 3): the lock
    ``name`` was granted to ``token`` with ``fencing_token`` for ``ttl_ms``, counted from the
    send time of our attempt ``tag``."""

    tag: int
    fencing_token: int
    ttl_ms: int
    token: str
    name: str
    shared: bool = False
    """Delivered to every client of a shared service: one that does not own the token must
    not release the grant (see :class:`GrantRoute`)."""


def _notice_number(data: bytes, start: int) -> tuple[int, int]:
    """A notice field at ``start``: 1..20 ASCII digits and a space → (value, index after the
    space), or (-1, -1)."""
    end = data.find(b" ", start, start + 21)
    if end <= start:
        return -1, -1
    digits = data[start:end]
    if not digits.isdigit():  # bytes.isdigit: ASCII digits only
        return -1, -1
    n = int(digits)
    if n >= _U64_LIMIT:
        return -1, -1
    return n, end + 1


def parse_grant_notice(data: bytes) -> GrantNotice | None:
    """The grant notice in a wake-channel payload, or ``None`` for a plain wake-up (the payload
    is the lock name) and for anything malformed. Mirrors ``leasehold::redis::parse_grant_notice``
    (``"\\0grant TAG FENCE TTL_MS TOKEN_LEN TOKEN NAME"``); never raises."""
    if type(data) is not bytes:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            return None
        data = bytes(data)
    if not data.startswith(GRANT_NOTICE_PREFIX):
        return None
    tag, i = _notice_number(data, len(GRANT_NOTICE_PREFIX))
    fence, i = _notice_number(data, i) if i >= 0 else (-1, -1)
    ttl, i = _notice_number(data, i) if i >= 0 else (-1, -1)
    token_len, i = _notice_number(data, i) if i >= 0 else (-1, -1)
    if i < 0 or not 0 < fence <= _MAX_FENCE or ttl <= 0:
        return None
    if not 0 < token_len <= _MAX_TOKEN_LEN or i + token_len > len(data):
        return None
    raw_token = data[i : i + token_len]
    raw_name = data[i + token_len :]
    if not raw_name or len(raw_name) > _MAX_NAME_LEN or b"\0" in raw_name or not raw_token.isascii():
        return None
    try:
        name = raw_name.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return GrantNotice(tag=tag, fencing_token=fence, ttl_ms=ttl, token=raw_token.decode("ascii"), name=name)


_W = TypeVar("_W")


@dataclass
class Reconciled(Generic[_W]):
    """What the subscriber must do after its wanted set changed (see ``reconcile``)."""

    deliver: list[_W]  # the wanted entries whose waiters must re-check now
    subscribe: set[str]  # channels to SUBSCRIBE
    expired: set[str]  # channels that lingered unwanted long enough: UNSUBSCRIBE


def reconcile(
    subscribed: set[str],
    wanted: dict[str, _W],
    gens: dict[str, int],
    seen: dict[str, int],
    lingering: dict[str, float],
    now: float,
    linger: float,
) -> Reconciled[_W]:
    """The subscription bookkeeping shared by the thread and the asyncio subscriber.

    ``wanted`` maps channel → what to deliver for it, ``gens`` counts each channel's watches; ``seen`` and
    ``lingering`` are the subscriber's own state and are updated here. Channels no longer
    wanted linger ``linger`` seconds (a quick re-watch keeps its subscription)."""
    deliver: list[_W] = []
    for ch in subscribed:
        if ch in wanted:
            lingering.pop(ch, None)
            if seen.get(ch) != gens.get(ch):
                # Watched again while still subscribed (maybe unwatched in between): a release
                # published while nobody here waited was ignored, so wake one waiter to
                # re-check now, as a fresh SUBSCRIBE would.
                seen[ch] = gens.get(ch, 0)
                deliver.append(wanted[ch])
        else:
            lingering.setdefault(ch, now + linger)
    add = set(wanted) - subscribed
    for ch in add:
        seen[ch] = gens.get(ch, 0)  # the SUBSCRIBE confirmation wakes a waiter
    expired = {ch for ch, until in lingering.items() if until <= now}
    for ch in expired:
        del lingering[ch]
        seen.pop(ch, None)
    return Reconciled(deliver, add, expired)
