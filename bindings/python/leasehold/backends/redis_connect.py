"""Connections for the Redis executors: redis-py connection pools from a client, a pool, a URL
or connection keywords (password / ACL user, DB, unix socket, TLS), and Redis Sentinel
(``redis+sentinel://`` URLs, sentinel addresses, a pool on the master the sentinels name),
for ``redis`` and ``redis.asyncio``.

The executors (:mod:`leasehold.backends.redis_executor`, :mod:`~leasehold.backends.redis_executor_async`)
run the core's requests on what this makes, and re-export these names.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import redis
import redis.asyncio as aredis
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.retry
import redis.sentinel
from redis.backoff import NoBackoff

from .._urls import check_url, redact, scrub

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_SOCKET_TIMEOUT",
    "SENTINEL_SCHEME",
    "async_connection_pool",
    "async_sentinel_pool",
    "connection_pool",
    "parse_addresses",
    "parse_sentinel_url",
    "parse_sentinels",
    "sentinel_pool",
    "split_credentials",
    "tls_defaults",
]

SENTINEL_SCHEME = "redis+sentinel"

DEFAULT_SOCKET_TIMEOUT = 5.0
DEFAULT_CONNECT_TIMEOUT = 2.0


def connection_pool(
    client: redis.Redis | redis.ConnectionPool | None = None, url: str | None = None, **kwargs: Any
) -> redis.ConnectionPool:
    """A connection pool from a redis-py client or pool, a URL (``redis://``, ``rediss://``,
    ``unix://``, or ``redis+sentinel://`` for a Sentinel deployment: :func:`parse_sentinel_url`),
    or redis-py connection keywords (``host``, ``port``, ``db``, ``username``, ``password``,
    ``unix_socket_path``, ``ssl``...). Replies stay bytes either way."""
    return _pool(redis, sentinel_pool, client, url, kwargs)  # type: ignore[no-any-return]


def _pool(mod: Any, sentinel: Callable[..., Any], client: Any, url: str | None, kwargs: dict[str, Any]) -> Any:
    """:func:`connection_pool` for ``mod`` (``redis`` or ``redis.asyncio``), whose Sentinel
    pools ``sentinel`` makes."""
    if client is not None and url is not None:
        raise ValueError("give a redis-py client/pool or a URL, not both")
    if isinstance(client, mod.Redis):
        return client.connection_pool
    if isinstance(client, mod.ConnectionPool):
        return client
    if client is not None:
        raise TypeError(f"client must be a {mod.__name__}.Redis or ConnectionPool, not {type(client).__name__}")
    kwargs.setdefault("socket_timeout", DEFAULT_SOCKET_TIMEOUT)
    kwargs.setdefault("socket_connect_timeout", DEFAULT_CONNECT_TIMEOUT)
    if url is not None and url.lower().startswith(SENTINEL_SCHEME + "://"):
        sentinels, master_name, from_url = parse_sentinel_url(url)
        return sentinel(sentinels, master_name, **{**from_url, **kwargs})
    if url is not None:
        # Checked first: redis-py would read part of a malformed password as the port or the
        # database, and quote it in its error.
        check_url(url)
        if url.lower().startswith("rediss:"):
            tls_defaults(kwargs)
        try:
            return mod.ConnectionPool.from_url(url, **kwargs)
        except ValueError as e:
            raise ValueError(f"bad Redis URL {redact(url)}: {scrub(e, url)}") from None
    if kwargs.pop("ssl", False):
        tls_defaults(kwargs)
        kwargs["connection_class"] = mod.SSLConnection
    if "unix_socket_path" in kwargs:
        kwargs["connection_class"] = mod.UnixDomainSocketConnection
        kwargs["path"] = kwargs.pop("unix_socket_path")
    return mod.ConnectionPool(**kwargs)


def tls_defaults(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Complete redis-py TLS keywords in place: the server's certificate is verified and must
    name the host connected to, whatever redis-py's own defaults (5.x checked no host name).
    Keywords given, or ``ssl_*`` query parameters of a URL, still win."""
    kwargs.setdefault("ssl_cert_reqs", "required")
    kwargs.setdefault("ssl_check_hostname", True)
    return kwargs


def parse_sentinels(sentinels: str | Iterable[str | tuple[str, int]]) -> list[tuple[str, int]]:
    """Sentinel addresses as ``(host, port)`` pairs, from pairs, ``"host:port"`` strings or one
    comma-separated string (``"h1:26379,h2:26379"``); the port defaults to 26379."""
    return parse_addresses(sentinels, 26379, "sentinel")


def parse_addresses(
    items: str | Iterable[str | tuple[str, int]], default_port: int, what: str
) -> list[tuple[str, int]]:
    """``(host, port)`` pairs from pairs, ``"host:port"`` / ``"[v6]:port"`` strings or one
    comma-separated string; a missing port is ``default_port``. ``what`` names them in errors."""
    parts = items.split(",") if isinstance(items, str) else list(items)
    out: list[tuple[str, int]] = []
    for item in parts:
        try:
            if isinstance(item, tuple):
                host, port = item
            else:
                text = item.strip()
                if text.startswith("["):  # [v6 address]:port
                    host, _, rest = text[1:].partition("]")
                    port = int(rest[1:]) if rest.startswith(":") else default_port
                else:
                    host, sep, p = text.rpartition(":")
                    host, port = (host, int(p)) if sep else (p, default_port)
        except ValueError:
            host, port = "", 0
        if not host or not 0 < int(port) < 65536:
            raise ValueError(f"bad {what} address {item!r} (want host:port)")
        out.append((str(host), int(port)))
    if not out:
        raise ValueError(f"no {what} address given")
    return out


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, dict[str, Any]]:
    """``redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER[/DB]`` as
    (sentinel addresses, master name, redis-py keywords for the Redis servers: ``username``,
    ``password``, ``db``). The credentials are the servers'; sentinels that need their own
    take ``sentinel_kwargs`` (:func:`sentinel_pool`)."""
    from urllib.parse import unquote

    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != SENTINEL_SCHEME:
        raise ValueError(f"not a {SENTINEL_SCHEME}:// URL: {redact(url)}")
    check_url(url)  # a password with an unescaped '/' would otherwise be read as the master name
    hosts, _, path = rest.partition("/")
    hosts, kwargs = split_credentials(hosts)
    parts = [p for p in path.split("/") if p]
    if not parts or len(parts) > 2:
        raise ValueError(f"{SENTINEL_SCHEME} URL needs /MASTER_NAME[/DB] after the sentinels: {redact(url)}")
    if len(parts) == 2:
        if not parts[1].isdigit():
            raise ValueError(f"bad database number in {redact(url)} (want /MASTER_NAME/DB, DB a number)")
        kwargs["db"] = int(parts[1])
    return parse_sentinels(hosts), unquote(parts[0]), kwargs


def split_credentials(hosts: str) -> tuple[str, dict[str, Any]]:
    """``[[USER]:PASSWORD@]HOSTS`` of a URL as (HOSTS, redis-py ``username`` / ``password``
    keywords, percent-decoded)."""
    from urllib.parse import unquote

    kwargs: dict[str, Any] = {}
    if "@" in hosts:
        creds, _, hosts = hosts.rpartition("@")
        user, has_password, password = creds.partition(":")
        if user:
            kwargs["username"] = unquote(user)
        if has_password:
            kwargs["password"] = unquote(password)
    return hosts, kwargs


def sentinel_pool(
    sentinels: str | Iterable[str | tuple[str, int]],
    master_name: str,
    *,
    sentinel_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
) -> redis.sentinel.SentinelConnectionPool:
    """A connection pool on the master the sentinels name ``master_name`` (redis-py's
    ``Sentinel(...).master_for(...)``): each connection asks the sentinels on connect, so a
    reconnect after a failover reaches the promoted replica. ``kwargs`` are redis-py
    connection keywords for the Redis servers (``password``, ``db``, ``ssl``...);
    ``sentinel_kwargs`` those for the sentinels (default: the ``socket_*`` ones of ``kwargs``,
    and no retries: the core retries)."""
    return _sentinel_pool(  # type: ignore[no-any-return]
        redis.sentinel.Sentinel, redis.retry.Retry, sentinels, master_name, sentinel_kwargs, kwargs
    )


def _sentinel_pool(
    sentinel_cls: Any,
    retry_cls: Any,
    sentinels: str | Iterable[str | tuple[str, int]],
    master_name: str,
    sentinel_kwargs: dict[str, Any] | None,
    kwargs: dict[str, Any],
) -> Any:
    """:func:`sentinel_pool` with ``redis``'s or ``redis.asyncio``'s Sentinel and Retry."""
    if not master_name:
        raise ValueError("a master name is required")
    kwargs.setdefault("socket_timeout", DEFAULT_SOCKET_TIMEOUT)
    kwargs.setdefault("socket_connect_timeout", DEFAULT_CONNECT_TIMEOUT)
    if kwargs.get("ssl"):
        tls_defaults(kwargs)
    if sentinel_kwargs is None:
        # A dead sentinel is skipped at once rather than retried with backoff on every reconnect.
        sentinel_kwargs = {
            **{k: v for k, v in kwargs.items() if k.startswith("socket_")},
            "retry": retry_cls(NoBackoff(), 0),
        }
    sentinel = sentinel_cls(parse_sentinels(sentinels), sentinel_kwargs=sentinel_kwargs, **kwargs)
    return sentinel.master_for(master_name).connection_pool


def async_connection_pool(
    client: aredis.Redis | aredis.ConnectionPool | None = None, url: str | None = None, **kwargs: Any
) -> aredis.ConnectionPool:
    """As :func:`connection_pool`, for ``redis.asyncio``."""
    return _pool(aredis, async_sentinel_pool, client, url, kwargs)  # type: ignore[no-any-return]


def async_sentinel_pool(
    sentinels: str | Iterable[str | tuple[str, int]],
    master_name: str,
    *,
    sentinel_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
) -> redis.asyncio.sentinel.SentinelConnectionPool:
    """As :func:`sentinel_pool`, for ``redis.asyncio``."""
    return _sentinel_pool(  # type: ignore[no-any-return]
        redis.asyncio.sentinel.Sentinel, redis.asyncio.retry.Retry, sentinels, master_name, sentinel_kwargs, kwargs
    )
