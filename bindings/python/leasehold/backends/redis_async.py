"""asyncio twin of :mod:`leasehold.backends.redis`, on ``redis.asyncio``.

``AsyncRedisLockService`` implements :class:`~leasehold.service.AsyncLockService` for
``AsyncLockClient``: the same canonical scripts (EVALSHA with EVAL fallback), the same keys,
the same waiters queue with one wake channel per service, and one pub/sub task per service
that subscribes to the wake channel and to watched names' release channels, reconnects by
itself with capped backoff, re-subscribes, and wakes waiters once per (re)confirmed
subscription because messages published while it was away are lost.

Connection errors, timeouts and script errors (``ResponseError("lh: ...")``) are raised; the
core treats them as transport failures.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..service import AsyncLockService, Granted, HeldByOther
from . import redis_protocol as proto
from .redis import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_PUBSUB_LINGER,
    DEFAULT_PUBSUB_PING_INTERVAL,
    DEFAULT_SOCKET_TIMEOUT,
    _needs_command_name,
)
from .redis_protocol import ProtocolError

__all__ = ["AsyncRedisLockService", "ProtocolError"]

log = logging.getLogger("leasehold.redis")

_RECONNECT_BASE = 0.05
_RECONNECT_CAP = 1.0


async def _aclose(obj: Any) -> None:
    fn = getattr(obj, "aclose", None) or getattr(obj, "close", None)
    if fn is None:
        return
    r = fn()
    if asyncio.iscoroutine(r):
        await r


class AsyncRedisLockService(AsyncLockService):
    """An :class:`~leasehold.service.AsyncLockService` on one Redis server.

    Use it from one event loop (the one ``AsyncLockClient`` runs on). ``close()`` stops the
    pub/sub task and, when the service created the client (:meth:`from_url`), closes it.
    """

    notifications = True
    wakes_one_waiter = True
    grants_on_release = True
    """Protocol 3, as :attr:`RedisLockService.grants_on_release` (``direct_grants=False``:
    protocol 2 only)."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        pubsub_ping_interval: float = DEFAULT_PUBSUB_PING_INTERVAL,
        pubsub_linger: float = DEFAULT_PUBSUB_LINGER,
        owns_client: bool = False,
        direct_grants: bool = True,
    ) -> None:
        if pubsub_ping_interval <= 0:
            raise ValueError("pubsub_ping_interval must be positive")
        if pubsub_linger < 0:
            raise ValueError("pubsub_linger must be >= 0")
        self._client = client
        self._owns_client = owns_client
        self.grants_on_release = bool(direct_grants)
        self._ping_interval = pubsub_ping_interval
        self._linger = pubsub_linger
        self._acquire = proto.script(proto.SCRIPT_ACQUIRE)
        self._renew = proto.script(proto.SCRIPT_RENEW)
        self._release = proto.script(proto.SCRIPT_RELEASE)
        self._notify = proto.script(proto.SCRIPT_NOTIFY)
        # Waking waiters (see leasehold.backends.redis): our wake channel, the names we wait
        # for, whether the server confirmed the channel, and names we queued for → whether that
        # attempt won.
        self.wake_channel = proto.new_wake_channel()
        self._waiting: dict[str, Callable[[str], object]] = {}
        self._grant_route = proto.GrantRoute()  # as in RedisLockService's subscriber
        self._wake_live = False
        self._wake_live_changed: asyncio.Event | None = None
        self._queued = proto.QueueEntries()
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._wanted: dict[str, tuple[str, Callable[[str], None]]] = {}
        self._gen: dict[str, int] = {}  # bumped by every watch() of a channel
        self._next_gen = 0
        self._changed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._direct = _AsyncDirectConnections.for_client(client)
        self._closed = False
        self.subscriber_reconnects = 0

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        socket_connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        pubsub_ping_interval: float = DEFAULT_PUBSUB_PING_INTERVAL,
        pubsub_linger: float = DEFAULT_PUBSUB_LINGER,
        direct_grants: bool = True,
        **redis_kwargs: Any,
    ) -> AsyncRedisLockService:
        """Like :meth:`leasehold.backends.redis.RedisLockService.from_url` (no IO until used)."""
        redis_kwargs.setdefault("retry", Retry(NoBackoff(), 1))
        redis_kwargs.setdefault("socket_keepalive", True)
        client = aioredis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            **redis_kwargs,
        )
        return cls(
            client,
            pubsub_ping_interval=pubsub_ping_interval,
            pubsub_linger=pubsub_linger,
            owns_client=True,
            direct_grants=direct_grants,
        )

    @property
    def client(self) -> aioredis.Redis:
        return self._client

    # ---- commands ------------------------------------------------------------------------
    async def _run(self, script: proto.Script, keys: list[str], args: list[Any]) -> Any:
        try:
            return await self._client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await self._client.eval(script.text, len(keys), *keys, *args)

    async def acquire(self, name: str, token: str, ttl_ms: int, tag: int | None = None) -> Granted | HeldByOther:
        """As :meth:`RedisLockService.acquire` (``tag``: queue this lease for a direct grant)."""
        if not (self._wake_live and name in self._waiting):
            return await self._acquire_once(name, token, ttl_ms, None, None)
        if tag is not None and not self._grant_route.shared():
            return await self._acquire_once(name, token, ttl_ms, self.wake_channel, tag)
        self._queued.sent(name)
        result = await self._acquire_once(name, token, ttl_ms, self.wake_channel, None)
        self._queued.answered(name, isinstance(result, Granted))
        return result

    async def _acquire_once(
        self, name: str, token: str, ttl_ms: int, wake: str | None, tag: int | None
    ) -> Granted | HeldByOther:
        d = self._direct
        if d is not None:
            w = proto.wire_for(name)
            pack = proto.pack_acquire
            reply = await d.call(
                pack(w, token, ttl_ms, False, wake, tag), lambda: pack(w, token, ttl_ms, True, wake, tag)
            )
            return proto.parse_acquire(reply)
        k = proto.keys_for(name)
        if wake is None:
            reply = await self._run(self._acquire, [k.lock, k.fence], [token, proto.ttl_arg(ttl_ms)])
        elif tag is None:
            reply = await self._run(self._acquire, [k.lock, k.fence, k.waiters], [token, proto.ttl_arg(ttl_ms), wake])
        else:
            reply = await self._run(
                self._acquire, [k.lock, k.fence, k.waiters, k.grants], [token, proto.ttl_arg(ttl_ms), wake, tag]
            )
        return proto.parse_acquire(reply)

    async def renew(self, name: str, token: str, ttl_ms: int, backend_data: bytes = b"") -> bool:
        d = self._direct
        if d is not None:
            w = proto.wire_for(name)
            pack = proto.pack_renew
            reply = await d.call(pack(w, token, ttl_ms), lambda: pack(w, token, ttl_ms, True))
            return proto.parse_flag(reply, "RENEW")
        k = proto.keys_for(name)
        reply = await self._run(self._renew, [k.lock], [token, proto.ttl_arg(ttl_ms)])
        return proto.parse_flag(reply, "RENEW")

    async def release(self, name: str, token: str, backend_data: bytes = b"") -> bool:
        skip = self._queued.stale_entry(name, name in self._waiting, self.wake_channel)
        d = self._direct
        if d is not None:
            w = proto.wire_for(name)
            pack = proto.pack_release
            g = self.grants_on_release
            reply = await d.call(pack(w, token, False, skip, g), lambda: pack(w, token, True, skip, g))
            return proto.parse_flag(reply, "RELEASE")
        k = proto.keys_for(name)
        args = [token, k.channel, name] + ([skip] if skip is not None else [])
        keys = [k.lock, k.waiters, k.fence, k.grants] if self.grants_on_release else [k.lock, k.waiters]
        reply = await self._run(self._release, keys, args)
        return proto.parse_flag(reply, "RELEASE")

    # ---- waking waiters ----------------------------------------------------------------------
    async def watch_waiter(self, name: str, on_wake: Callable[[str], object]) -> None:
        """Like :meth:`RedisLockService.watch_waiter`: returns once the wake channel is live."""
        if self._closed:
            return
        self._waiting[name] = on_wake
        self._grant_route.saw(on_wake)
        if self.wake_channel not in self._wanted:
            self._wanted[self.wake_channel] = ("", _ignore)
            self._gen[self.wake_channel] = 0  # a new waiting name needs no re-check of the others
        self._kick()
        if not self._wake_live:
            live = self._wake_live_changed
            if live is None:
                live = self._wake_live_changed = asyncio.Event()
            kw = self._client.connection_pool.connection_kwargs
            limit = float(kw.get("socket_connect_timeout") or kw.get("socket_timeout") or 2.0) * 2
            try:
                await asyncio.wait_for(live.wait(), limit)
            except asyncio.TimeoutError:
                pass  # attempts do not queue meanwhile; the waiters' timers still run

    async def unwatch_waiter(self, name: str) -> None:
        """Like :meth:`RedisLockService.unwatch_waiter`."""
        self._waiting.pop(name, None)
        if self._queued.gave_up(name) and not self._closed:
            try:
                await self._client.zrem(proto.keys_for(name).waiters, self.wake_channel)
            except Exception as e:  # noqa: BLE001 - the release skips or passes it on anyway
                log.debug("leaving the waiters queue of %r failed: %s", name, e)

    async def forget_queued(self, name: str, token: str) -> None:
        """As :meth:`RedisLockService.forget_queued`."""
        if self._closed:
            return
        k = proto.keys_for(name)
        try:
            pipe = self._client.pipeline(transaction=True)
            pipe.zrem(k.waiters, proto.lease_entry(self.wake_channel, token))
            pipe.hdel(k.grants, token)
            await pipe.execute()
        except Exception as e:  # noqa: BLE001 - left behind, it is granted once and released
            log.debug("leaving the waiters queue of %r failed: %s", name, e)

    async def _pass_on(self, name: str) -> None:
        """A release picked us for ``name`` but nobody here waits for it: wake the next one."""
        try:
            await self._run(self._notify, [proto.keys_for(name).waiters], [name, self.wake_channel])
        except Exception as e:  # noqa: BLE001 - the waiters' retry timers still run
            log.debug("passing a wake-up for %r on failed: %s", name, e)

    def _set_wake_live(self, live: bool) -> None:
        self._wake_live = live
        ev = self._wake_live_changed
        if ev is not None:
            if live:
                ev.set()
            else:
                ev.clear()

    # ---- notifications ---------------------------------------------------------------------
    async def watch(self, name: str, on_released: Callable[[str], None]) -> None:
        if self._closed:
            return
        channel = proto.keys_for(name).channel
        self._wanted[channel] = (name, on_released)
        self._next_gen += 1
        self._gen[channel] = self._next_gen
        self._kick()

    def _kick(self) -> None:
        """Have the pub/sub task reconcile its subscriptions (starting it if needed)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        self._changed.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._subscriber(), name="leasehold-redis-pubsub")

    async def unwatch(self, name: str) -> None:
        channel = proto.keys_for(name).channel
        self._gen.pop(channel, None)
        if self._wanted.pop(channel, None) is not None and self._changed is not None:
            self._changed.set()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wanted.clear()
        self._gen.clear()
        self._waiting.clear()
        if self._wake_live_changed is not None:
            self._wake_live_changed.set()  # nobody waits for the channel any more
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if self._direct is not None:
            await self._direct.close()
        if self._owns_client:
            try:
                await _aclose(self._client)
            except Exception:  # pragma: no cover - best effort
                log.debug("closing the redis client failed", exc_info=True)

    async def __aenter__(self) -> AsyncRedisLockService:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- the pub/sub task --------------------------------------------------------------------
    async def _subscriber(self) -> None:
        backoff = _RECONNECT_BASE
        assert self._changed is not None
        while not self._closed:
            if not self._wanted:
                # Nothing to listen to: no connection until the next watch.
                self._changed.clear()
                if not self._wanted:
                    await self._changed.wait()
                continue
            ps = self._client.pubsub()
            confirmed = [False]
            self._set_wake_live(False)
            try:
                if await self._serve(ps, confirmed) == "idle":
                    backoff = _RECONNECT_BASE
                    continue
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - any failure: reconnect
                if self._closed:
                    return
                log.warning("leasehold redis pub/sub connection failed (%s: %s); reconnecting", type(e).__name__, e)
                if confirmed[0]:
                    backoff = _RECONNECT_BASE
            finally:
                self._set_wake_live(False)
                try:
                    await _aclose(ps)
                except Exception:  # pragma: no cover
                    pass
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _RECONNECT_CAP)
            self.subscriber_reconnects += 1

    async def _serve(self, ps: Any, confirmed: list[bool]) -> str:
        assert self._changed is not None
        changed = self._changed
        subscribed: set[str] = set()
        # Unwatched channels stay subscribed for a while (no churn in acquire/release loops).
        lingering: dict[str, float] = {}
        seen: dict[str, int] = {}  # watch generation last served per subscribed channel
        read: asyncio.Task[Any] | None = None
        ping_pending = False
        last_traffic = time.monotonic()
        try:
            while not self._closed:
                changed.clear()
                wanted = dict(self._wanted)
                gens = dict(self._gen)
                now = time.monotonic()
                plan = proto.reconcile(subscribed, wanted, gens, seen, lingering, now, self._linger)
                for target in plan.deliver:
                    self._deliver(target)
                if plan.subscribe:
                    await ps.subscribe(*sorted(plan.subscribe))
                    subscribed |= plan.subscribe
                expired = plan.expired
                if expired:
                    if expired == subscribed:
                        return "idle"  # the caller closes this connection
                    await ps.unsubscribe(*sorted(expired))
                    subscribed -= expired
                if ps.connection is None:
                    try:
                        await asyncio.wait_for(changed.wait(), self._ping_interval)
                    except asyncio.TimeoutError:
                        pass
                    continue
                if read is None:
                    # One read at a time, never cancelled mid-message: a change of the wanted
                    # set is handled while this read stays pending.
                    read = asyncio.ensure_future(ps.get_message(timeout=self._ping_interval))
                waiter = asyncio.ensure_future(changed.wait())
                timeout = None
                if lingering:
                    timeout = max(0.0, min(lingering.values()) - now)
                try:
                    done, _ = await asyncio.wait({read, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if not waiter.done():
                        waiter.cancel()
                if read not in done:
                    continue
                task, read = read, None
                msg = task.result()  # a connection error raises here → reconnect
                if msg is None:
                    if time.monotonic() - last_traffic >= self._ping_interval:
                        if ping_pending:
                            raise RedisTimeoutError(f"no answer to PING within {self._ping_interval:.1f}s")
                        await ps.ping()
                        ping_pending = True
                        last_traffic = time.monotonic()
                    continue
                last_traffic = time.monotonic()
                ping_pending = False
                self._handle(msg, confirmed)
            return "closed"
        finally:
            if read is not None and not read.done():
                read.cancel()

    def _handle(self, msg: dict[str, Any], confirmed: list[bool]) -> None:
        kind = msg.get("type")
        channel = msg.get("channel")
        if isinstance(channel, bytes):
            channel = channel.decode("utf-8", "replace")
        if kind not in ("message", "subscribe"):
            return
        if kind == "subscribe":
            confirmed[0] = True
        if channel == self.wake_channel:
            self._handle_wake(kind, msg.get("data"))
            return
        entry = self._wanted.get(channel) if channel is not None else None
        if entry is not None:
            self._deliver(entry)

    def _handle_wake(self, kind: str, data: Any) -> None:
        if kind == "subscribe":
            # Releases while we were not listening popped our entry without reaching us.
            self._set_wake_live(True)
            for entry in list(self._waiting.items()):
                self._deliver(entry)
            return
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        if data[:1] == b"\0":
            self._handle_grant(data)
            return
        name = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
        if not proto.offer_wake(self._waiting.get(name), name) and not self._closed:
            t = asyncio.get_running_loop().create_task(self._pass_on(name))
            self._side_tasks.add(t)
            t.add_done_callback(self._side_tasks.discard)

    def _handle_grant(self, data: bytes) -> None:
        """As :meth:`RedisLockService._handle_grant`: the notice goes to the client (its core
        decides); one nobody takes is released; on a shared service every client gets it,
        marked ``shared``, and nobody releases it."""
        notice = proto.parse_grant_notice(data)
        if notice is None:
            log.warning("leasehold: ignoring a malformed grant notice on %s: %r", self.wake_channel, data[:80])
            return
        clients = list(self._grant_route.clients)
        taken = proto.offer_notice(clients, notice)
        if not taken and len(clients) <= 1 and not self._closed:
            t = asyncio.get_running_loop().create_task(self._release_stray(notice))
            self._side_tasks.add(t)
            t.add_done_callback(self._side_tasks.discard)

    async def _release_stray(self, notice: proto.GrantNotice) -> None:
        try:
            await self.release(notice.name, notice.token)
        except Exception as e:  # noqa: BLE001 - the grant then runs out by its TTL
            log.debug("releasing a stray grant of %r failed: %s", notice.name, e)

    @staticmethod
    def _deliver(entry: tuple[str, Callable[[str], object]]) -> None:
        name, cb = entry
        try:
            cb(name)
        except Exception:  # pragma: no cover - a callback bug must not kill the subscriber
            log.exception("leasehold redis on_released callback failed for %r", name)


class _AsyncDirectConnections:
    """The asyncio twin of :class:`leasehold.backends.redis._DirectConnections`: the scripts as
    pre-encoded bytes on ``redis.asyncio`` connections the service keeps checked out of the
    client's pool (no per-call pool lock, readiness check or argument encoding), under each
    connection's own ``retry``. A connection is reused only after a complete exchange; on any
    error mid-exchange redis-py has disconnected it (it reconnects on the next send)."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._free: list[Any] = []
        self._closed = False
        self._checkout_args: tuple[str, ...] = ("EVALSHA",) if _needs_command_name(pool.get_connection) else ()

    @classmethod
    def for_client(cls, client: Any) -> _AsyncDirectConnections | None:
        pool = getattr(client, "connection_pool", None)
        if getattr(client, "single_connection_client", False) or not isinstance(pool, aioredis.ConnectionPool):
            return None
        enc = str(pool.connection_kwargs.get("encoding", "utf-8")).lower().replace("-", "").replace("_", "")
        return cls(pool) if enc == "utf8" else None

    async def call(self, packed: bytes, packed_eval: Callable[[], bytes]) -> Any:
        """Send ``packed`` (EVALSHA) and return the reply; after NOSCRIPT, ``packed_eval()``."""
        free = self._free
        conn = free.pop() if free else await self._pool.get_connection(*self._checkout_args)
        try:
            try:
                return await conn.retry.call_with_retry(lambda: _exchange(conn, packed), lambda _e: conn.disconnect())
            except NoScriptError:
                cmd = packed_eval()  # first use on this server: EVAL caches the script
                return await conn.retry.call_with_retry(lambda: _exchange(conn, cmd), lambda _e: conn.disconnect())
        finally:
            if self._closed:
                await self._pool.release(conn)
            else:
                free.append(conn)

    async def close(self) -> None:
        self._closed = True
        free, self._free = self._free, []
        for conn in free:
            try:
                await self._pool.release(conn)
            except Exception:  # pragma: no cover - best effort
                log.debug("returning a connection to the pool failed", exc_info=True)


def _ignore(_name: str) -> None:
    pass


async def _exchange(conn: Any, packed: bytes) -> Any:
    await conn.send_packed_command(packed)
    return await conn.read_response()
