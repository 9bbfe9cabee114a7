"""What ``RedisLockService.from_url`` (and its asyncio twin) make of their arguments on the
byte path: the URL the core parses, the TLS context the executor opens connections with, the
core's timeouts, and the redis-py keywords of the client ``.client`` builds on demand.

The core parses the URL; only the ``ssl_*`` query parameters redis-py reads (``rediss://
...?ssl_ca_certs=/etc/ca.pem``) are taken off it here: they say how to open the socket, which
is the executor's business. Every other query parameter stays in the URL, for the core to
refuse.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import unquote_plus

from .._options import RedisOptions, RedisStreamOptions
from .._urls import check_url, redact, scrub

__all__ = ["StreamSettings", "stream_settings"]

_TLS_KEYS = (
    "ssl_ca_certs",
    "ssl_ca_path",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_password",
    "ssl_check_hostname",
    "ssl_cert_reqs",
)
_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
_FALSE = ("0", "false", "no", "off", "f", "n")
# redis-py keywords with a meaning on the byte path (the rest raise TypeError).
_STREAM_KEYS = ("client_name", "socket_keepalive", "protocol", "ssl_context", *_TLS_KEYS)


class StreamSettings:
    """``executor``: the stream executor's arguments; ``redis_py``: the URL and keywords of
    the redis-py client made on demand (``.client``)."""

    def __init__(self, executor: dict[str, Any], redis_py_url: str, redis_py: dict[str, Any]) -> None:
        self.executor = executor
        self.redis_py_url = redis_py_url
        self.redis_py = redis_py


def _split_tls(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without its ``ssl_*`` query parameters, and those (decoded)."""
    base, sep, query = url.partition("?")
    if not sep:
        return url, {}
    query, hsep, fragment = query.partition("#")
    kept: list[str] = []
    tls: dict[str, str] = {}
    for item in query.split("&"):
        key = unquote_plus(item.partition("=")[0])
        if key in _TLS_KEYS:
            tls[key] = unquote_plus(item.partition("=")[2])
        elif item:
            kept.append(item)
    rest = ("?" + "&".join(kept) if kept else "") + (hsep + fragment)
    return base + rest, tls


def _tls_context(tls: dict[str, Any]) -> ssl.SSLContext:
    """A verifying context (certificate and host name, whatever redis-py's defaults) unless
    the settings say otherwise."""
    ctx = ssl.create_default_context(cafile=tls.get("ssl_ca_certs"), capath=tls.get("ssl_ca_path"))
    if tls.get("ssl_certfile"):
        ctx.load_cert_chain(tls["ssl_certfile"], tls.get("ssl_keyfile"), tls.get("ssl_password"))
    check = tls.get("ssl_check_hostname", True)
    if isinstance(check, str):
        check = check.strip().lower() not in _FALSE
    reqs = tls.get("ssl_cert_reqs", "required")
    if isinstance(reqs, str):
        if reqs.lower() not in _CERT_REQS:
            raise ValueError(f"ssl_cert_reqs must be one of {', '.join(_CERT_REQS)}")
        reqs = _CERT_REQS[reqs.lower()]
    ctx.check_hostname = bool(check) and reqs != ssl.CERT_NONE
    ctx.verify_mode = reqs
    return ctx


def _ms(seconds: Any, what: str) -> int | None:
    if seconds is None:
        return None  # the core's default
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ValueError(f"{what} must be a positive number of seconds or None")
    return max(1, int(seconds * 1000))


def stream_settings(
    url: str,
    *,
    socket_timeout: float | None,
    socket_connect_timeout: float | None,
    options: RedisOptions | None,
    kwargs: dict[str, Any],
    who: str = "RedisLockService.from_url()",
) -> StreamSettings:
    """Check ``from_url``'s arguments and map them onto the byte path; a bad URL raises
    ``ValueError`` (never quoting its secret), a redis-py keyword without a meaning there
    ``TypeError``."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, not {type(url).__name__}")
    other = sorted(k for k in kwargs if k not in _STREAM_KEYS)
    if other:
        raise TypeError(
            f"{who} got {', '.join(other)}: redis-py keywords the byte path has no use for (it takes "
            f"{', '.join(_STREAM_KEYS)}; credentials and the database go in the URL); to use redis-py's "
            "connection, pass your own client: RedisLockService(redis.Redis.from_url(url, ...))"
        )
    check_url(url)
    core_url, tls = _split_tls(url)
    tls.update({k: kwargs[k] for k in _TLS_KEYS if k in kwargs})
    ctx = kwargs.get("ssl_context")
    secure = core_url.lower().startswith(("rediss:", "rediss+cluster:"))
    if (tls or ctx is not None) and not secure:
        raise ValueError(f"bad Redis URL {redact(url)}: TLS settings (ssl_*) need a rediss:// URL")
    if tls:
        if ctx is not None:
            raise ValueError("give ssl_context or the ssl_* settings, not both")
        try:
            ctx = _tls_context(tls)
        except (OSError, ssl.SSLError) as e:
            raise ValueError(f"the TLS settings of {redact(url)}: {scrub(e, url)}") from None
    resp = kwargs.get("protocol")
    if resp is not None and resp not in (2, 3, "2", "3"):
        raise ValueError("protocol must be 2 or 3")
    name = kwargs.get("client_name")
    opts = RedisStreamOptions(
        core_url,
        client_name=name,
        resp=int(resp) if resp is not None else None,
        connect_timeout_ms=_ms(socket_connect_timeout, "socket_connect_timeout"),
        request_timeout_ms=_ms(socket_timeout, "socket_timeout"),
        redis=options or RedisOptions(),
    )
    _check_with_core(opts, url)
    keepalive = bool(kwargs.get("socket_keepalive", True))
    executor = {"url": core_url, "stream_options": opts, "ssl_context": ctx, "keepalive": keepalive}
    redis_py = {k: v for k, v in kwargs.items() if k != "ssl_context"}
    redis_py.update(socket_timeout=socket_timeout, socket_connect_timeout=socket_connect_timeout, socket_keepalive=keepalive)
    return StreamSettings(executor, url, redis_py)


def _check_with_core(opts: RedisStreamOptions, url: str) -> None:
    """The core's own check of the URL and options (no IO): a bad one fails here, at
    construction, as it did with redis-py."""
    from .._core import Config, Core

    try:
        Core(Config(), backend=opts).close()
    except Exception as e:
        raise ValueError(f"bad Redis URL {redact(url)}: {scrub(e, url)}") from None
