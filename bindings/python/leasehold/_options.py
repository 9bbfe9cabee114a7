"""What a core is made with: its configuration (:class:`Config`) and its backend's options.

Every backend's options fill the one C struct ``lh_backend_options`` (``to_c()``), starting
from the core's defaults for that backend (``lh_backend_options_default``); ``None`` fields
keep them. ``protocol`` names the family of requests the core will ask its executor to run
(``"memory"``, ``"redis"``, ``"sql"``, ``"etcd"``).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any, Union

from . import _ffi
from ._ffi import lib

__all__ = [
    "Config",
    "MemoryOptions",
    "RedisOptions",
    "RedisStreamOptions",
    "SqlOptions",
    "EtcdOptions",
    "BackendOptions",
]


def _u64(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not 0 <= value <= _ffi.U64_MAX:
        raise ValueError(f"{what} must be in 0..2**64-1, got {value}")
    return value


@dataclass(frozen=True)
class Config:
    """Core configuration. ``None`` fields keep the core's defaults (``lh_config_default``).

    Times are nanoseconds, TTLs milliseconds, ratios parts per million, as in the core.
    ``notifications`` is normally taken from the executor (its ``notifications`` attribute).
    """

    drift_ppm: int | None = None
    drift_fixed_ns: int | None = None
    renew_jitter_ppm: int | None = None
    request_timeout_ns: int | None = None
    fail_budget: int | None = None
    backoff_base_ns: int | None = None
    backoff_cap_ns: int | None = None
    max_ttl_ms: int | None = None
    max_leases: int | None = None
    notifications: bool | None = None

    def to_c(self) -> _ffi.lh_config:
        """The C struct with defaults filled in and overrides applied."""
        c = _ffi.lh_config()
        lib.lh_config_default(ctypes.byref(c))
        c.struct_size = ctypes.sizeof(_ffi.lh_config)
        for name in (
            "drift_ppm",
            "drift_fixed_ns",
            "renew_jitter_ppm",
            "request_timeout_ns",
            "fail_budget",
            "backoff_base_ns",
            "backoff_cap_ns",
            "max_ttl_ms",
            "max_leases",
        ):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Config.{name} must be an int, not {type(value).__name__}")
            limit = 2 ** (8 * getattr(_ffi.lh_config, name).size) - 1
            if not 0 <= value <= limit:
                raise ValueError(f"Config.{name} must be in 0..{limit}, got {value}")
            setattr(c, name, value)
        if self.notifications is not None:
            c.notifications = 1 if self.notifications else 0
        return c

    @staticmethod
    def defaults() -> dict[str, int]:
        """The core's default values (from ``lh_config_default``)."""
        c = _ffi.lh_config()
        lib.lh_config_default(ctypes.byref(c))
        names = [f[0] for f in _ffi.lh_config._fields_]
        return {n: int(getattr(c, n)) for n in names if n != "struct_size"}


def _defaults(kind: int) -> _ffi.lh_backend_options:
    c = _ffi.lh_backend_options()
    lib.lh_backend_options_default(kind, ctypes.byref(c))
    c.struct_size = ctypes.sizeof(_ffi.lh_backend_options)
    return c


@dataclass(frozen=True)
class MemoryOptions:
    """The memory service's protocol (``LH_BACKEND_MEMORY``): it has no options."""

    protocol = "memory"

    def to_c(self) -> _ffi.lh_backend_options:
        return _defaults(_ffi.LH_BACKEND_MEMORY)


@dataclass(frozen=True)
class RedisOptions:
    """Options of the core's Redis protocol (``lh_backend_options.redis_*``); ``None`` keeps
    the core's default. Milliseconds."""

    standby_delay_ms: int | None = None
    key_keep_ms: int | None = None
    queue_max_age_ms: int | None = None
    idle_recheck_ms: int | None = None
    #: Redis Cluster: wake-ups on one shard channel per name (SPUBLISH / SSUBSCRIBE).
    sharded_wake: bool = False

    protocol = "redis"

    def to_c(self) -> _ffi.lh_backend_options:
        c = _defaults(_ffi.LH_BACKEND_REDIS)
        for name in ("standby_delay_ms", "key_keep_ms", "queue_max_age_ms", "idle_recheck_ms"):
            value = getattr(self, name)
            if value is not None:
                setattr(c, "redis_" + name, _u64(value, f"RedisOptions.{name}"))
        c.redis_sharded_wake = 1 if self.sharded_wake else 0
        return c


@dataclass(frozen=True)
class SqlOptions:
    """Options of the core's SQL protocol: the dialect (``"sqlite"`` or ``"postgresql"``),
    for SQLite the busy timeout in ms (``None``: the core's 5000), for PostgreSQL
    ``asynchronous_commit`` (acquire, renew and release commit without waiting for the WAL
    flush; docs/backends.md)."""

    dialect: str = "sqlite"
    busy_timeout_ms: int | None = None
    asynchronous_commit: bool = False

    protocol = "sql"

    def to_c(self) -> _ffi.lh_backend_options:
        kinds = {"sqlite": _ffi.LH_BACKEND_SQLITE, "postgresql": _ffi.LH_BACKEND_POSTGRES}
        if self.dialect not in kinds:
            raise ValueError(f"SqlOptions.dialect must be 'sqlite' or 'postgresql', not {self.dialect!r}")
        c = _defaults(kinds[self.dialect])
        if self.busy_timeout_ms is not None:
            c.sqlite_busy_timeout_ms = _u64(self.busy_timeout_ms, "SqlOptions.busy_timeout_ms")
        c.postgres_asynchronous_commit = 1 if self.asynchronous_commit else 0
        return c


@dataclass(frozen=True)
class EtcdOptions:
    """Options of the core's etcd protocol: a user and password make the core authenticate
    first and send its token with every request."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)

    protocol = "etcd"

    def to_c(self) -> _ffi.lh_backend_options:
        c = _defaults(_ffi.LH_BACKEND_ETCD)
        user = (self.user or "").encode("utf-8")
        password = (self.password or "").encode("utf-8")
        if user:  # ctypes keeps the bytes alive as long as the struct
            c.etcd_user, c.etcd_user_len = user, len(user)
            c.etcd_password, c.etcd_password_len = (password or None), len(password)
        return c


@dataclass(frozen=True)
class RedisStreamOptions:
    """Redis with the connections in the core (``LH_BACKEND_REDIS_STREAM``): the URL
    (``redis://[user:pass@]host[:port][/db]``, ``rediss://``, ``unix:///path[?db=N]``,
    parsed by the core), the connections' name, the handshake's first protocol (3, 2, or 1
    for AUTH/SELECT only), timeouts in ms, and the Redis protocol's own options."""

    url: str = field(repr=False)
    client_name: str | None = None
    resp: int | None = None
    connect_timeout_ms: int | None = None
    request_timeout_ms: int | None = None
    redis: RedisOptions = field(default_factory=RedisOptions)

    protocol = "stream"

    def to_c(self) -> _ffi.lh_backend_options:
        c = self.redis.to_c()
        c.kind = _ffi.LH_BACKEND_REDIS_STREAM
        d = _defaults(_ffi.LH_BACKEND_REDIS_STREAM)
        c.redis_protocol, c.redis_connect_timeout_ms = d.redis_protocol, d.redis_connect_timeout_ms
        c.redis_request_timeout_ms = d.redis_request_timeout_ms
        url = self.url.encode("utf-8")
        c.redis_url, c.redis_url_len = url, len(url)  # ctypes keeps the bytes alive
        if self.client_name:
            name = self.client_name.encode("utf-8")
            c.redis_client_name, c.redis_client_name_len = name, len(name)
        if self.resp is not None:
            c.redis_protocol = _u64(self.resp, "RedisStreamOptions.resp") & 0xFFFFFFFF
        if self.connect_timeout_ms is not None:
            c.redis_connect_timeout_ms = min(_u64(self.connect_timeout_ms, "connect_timeout_ms"), 2**32 - 1)
        if self.request_timeout_ms is not None:
            c.redis_request_timeout_ms = _u64(self.request_timeout_ms, "request_timeout_ms")
        return c


BackendOptions = Union[MemoryOptions, RedisOptions, RedisStreamOptions, SqlOptions, EtcdOptions]


def backend_options(options: Any) -> Any:
    """``options`` checked: one of the backend option classes (``None``: the memory service)."""
    if options is None:
        return MemoryOptions()
    if not isinstance(options, (MemoryOptions, RedisOptions, RedisStreamOptions, SqlOptions, EtcdOptions)):
        raise TypeError(f"unknown backend options {type(options).__name__}")
    return options
