"""The CLI's backends: which URL to use (``--backend``, ``--backend-file``, the environment),
opening it with errors that never show a secret, and the environment COMMAND gets.

Every message here shows a URL through :func:`~leasehold._urls.redact` and a driver's error
text through :func:`~leasehold._urls.scrub`; URLs with an authority are checked
(:func:`~leasehold._urls.url_problem`) before a driver sees them, so a malformed one gets our
own message instead of a driver's quote of it.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import Any
from urllib.parse import unquote

from ._urls import escape_control, redact, scrub, secrets_of, url_problem

__all__ = [
    "BackendError",
    "UsageError",
    "backend_url",
    "child_environment",
    "etcd_url",
    "open_backend",
    "read_backend_file",
    "redact",
    "safe_text",
]

ENV_URL = "LEASEHOLD_BACKEND"
ENV_FILE = "LEASEHOLD_BACKEND_FILE"
_FILE_LIMIT = 64 * 1024  # a backend file is one URL, not a data set
_TRUTHY = ("1", "true", "yes", "on")


class UsageError(Exception):
    """Bad command-line input (exit 64)."""


class BackendError(Exception):
    """The backend could not be opened or used (exit 69)."""


def _warn(msg: str) -> None:
    sys.stderr.write(f"leasehold: warning: {msg}\n")


def read_backend_file(path: str) -> str:
    """The backend URL in the first line of ``path``. Warns when the file can be read or
    written by group or others, or belongs to another user: it holds a password, and whoever
    can write it chooses the lock service."""
    shown = escape_control(path)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise UsageError(f"backend file {shown}: not a regular file")
            data = f.read(_FILE_LIMIT + 1)
    except OSError as e:
        raise UsageError(f"cannot read the backend file {shown}: {e.strerror or type(e).__name__}") from None
    if len(data) > _FILE_LIMIT:
        raise UsageError(f"backend file {shown}: its first line (the URL) is missing or over {_FILE_LIMIT} bytes")
    try:
        url = data.decode("utf-8").splitlines()[0].strip() if data.strip() else ""
    except UnicodeDecodeError:
        raise UsageError(f"backend file {shown}: not UTF-8") from None
    if not url:
        raise UsageError(f"backend file {shown} is empty: its first line is the backend URL")
    if st.st_mode & 0o077:
        _warn(f"backend file {shown} is accessible by group or others (mode {stat.S_IMODE(st.st_mode):03o}); chmod 600 it")
    if hasattr(os, "geteuid") and st.st_uid not in (os.geteuid(), 0):
        _warn(f"backend file {shown} belongs to another user (uid {st.st_uid})")
    return url


_chosen: list[str] = []  # the URL backend_url() chose last: every CLI message is scrubbed of it


def safe_text(text: object) -> str:
    """``text`` fit for the CLI's stderr: the chosen backend URL's secrets scrubbed, control
    characters escaped."""
    return scrub(text, _chosen[-1] if _chosen else None)


def backend_url(arg: str | None, file: str | None = None) -> str:
    """The backend URL: ``--backend``, else ``--backend-file``, else ``$LEASEHOLD_BACKEND``,
    else ``$LEASEHOLD_BACKEND_FILE``, else the default SQLite file (``sqlite://``)."""
    url = _backend_url(arg, file)
    _chosen.append(url)
    return url


def _backend_url(arg: str | None, file: str | None) -> str:
    if arg is not None and file is not None:
        raise UsageError("give --backend or --backend-file, not both")
    if arg is not None:
        return arg.strip()
    if file is not None:
        return read_backend_file(file)
    from_env, env_file = os.environ.get(ENV_URL), os.environ.get(ENV_FILE)
    if from_env and env_file:
        raise UsageError(f"both {ENV_URL} and {ENV_FILE} are set: unset one")
    if from_env:
        return from_env.strip()
    if env_file:
        return read_backend_file(env_file)
    return "sqlite://"


def child_environment(env: dict[str, str], url: str) -> dict[str, str]:
    """COMMAND's environment: ``env`` without the backend's variables and without any variable
    holding the backend URL or its password (COMMAND gets the lock, not the credentials)."""
    # A user-only userinfo is most often just the user name (alice@db): $USER stays.
    secrets = secrets_of(url, user_only=False)
    whole = url if secrets else None

    def holds_secret(value: str) -> bool:
        if whole is not None and whole in value:
            return True
        return any(value == s or (len(s) >= 6 and s in value) for s in secrets)

    return {k: v for k, v in env.items() if k not in (ENV_URL, ENV_FILE) and not holds_secret(v)}


def _check(url: str, what: str) -> None:
    why = url_problem(url)
    if why is not None:
        raise UsageError(f"bad {what} URL {redact(url)}: {why}")


def open_backend(url: str) -> Any:
    """Open the lock service for a ``--backend`` URL.

    :raises UsageError: the URL is malformed or its scheme unknown
    :raises BackendError: the backend cannot be opened
    """
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "sqlite":
        from .backends.sqlite import SQLiteLockService, SQLiteServiceError, path_from_url

        try:
            path = path_from_url(url)
        except ValueError as e:
            raise UsageError(scrub(e, url)) from None
        try:
            return SQLiteLockService(path)
        except SQLiteServiceError as e:
            raise BackendError(scrub(e, url)) from None
    if scheme == "memory":
        if url.rstrip("/") not in ("memory:", "memory:/", "memory://"):
            raise UsageError(f"memory URLs take no host or path: {redact(url)}")
        from .backends.memory import MemoryLockService

        return MemoryLockService()
    if scheme in ("redis", "rediss", "unix", "redis+sentinel", "redis+cluster", "rediss+cluster"):
        return _open_redis(url, scheme)
    if scheme in ("postgresql", "postgres"):
        _check(url, "PostgreSQL")
        try:
            from .backends.sql_executor import PostgresExecutor

            return PostgresExecutor(url)
        except ImportError as e:
            raise BackendError(f"the PostgreSQL backend needs psycopg 3 (pip install 'leasehold[postgres]'): {e}") from None
    if scheme in ("etcd", "etcds"):
        from .backends.etcd_executor import EtcdExecutor

        user, password, endpoints = etcd_url(url)
        try:
            return EtcdExecutor(endpoints, user=user, password=password)
        except ValueError as e:
            raise UsageError(f"bad etcd URL {redact(url)}: {scrub(e, url)}") from None
    raise UsageError(
        f"unknown backend URL {redact(url)} (use sqlite://, redis://, redis+sentinel://, redis+cluster://, "
        "postgresql://, etcd://, or memory://)"
    )


def _open_redis(url: str, scheme: str) -> Any:
    """Redis on the byte path (the core owns the connections; no redis-py): one server, the
    master the sentinels of a ``redis+sentinel://`` URL name (asked again on every reconnect,
    so a run follows a failover), or a Redis Cluster (the core routes each name to its slot's
    master). Checked with a status query before use."""
    sentinel = scheme == "redis+sentinel"
    what = "Redis Sentinel" if sentinel else "Redis Cluster" if scheme.endswith("cluster") else "Redis"
    _check(url, what)
    from .backends.redis import RedisLockService

    try:
        svc = RedisLockService.from_url(url)
    except (TypeError, ValueError) as e:
        why = scrub(e, url)
        raise UsageError(why if why.startswith("bad ") else f"bad {what} URL {redact(url)}: {why}") from None
    try:
        svc.ping()
    except Exception as e:
        svc.close()
        where = "the master through " if sentinel else ""
        raise BackendError(f"cannot reach {where}{redact(url)}: {scrub(e, url)}") from None
    return svc


def etcd_url(url: str) -> tuple[str | None, str | None, list[str]]:
    """``etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...][?insecure_auth=1]`` as (user,
    password, member URLs); ``etcds://`` members speak TLS. A user or password on plain
    ``etcd://`` would cross the network in clear text, so it is refused unless the URL says
    ``insecure_auth=1``."""
    _check(url, "etcd")
    scheme, _, rest = url.partition("://")
    rest, _, query = rest.partition("?")
    user = password = None
    if "@" in rest:
        info, _, rest = rest.rpartition("@")
        name, sep, pw = info.partition(":")
        user, password = unquote(name) or None, (unquote(pw) if sep else None)
    insecure = False
    for item in filter(None, query.split("&")):
        key, _, value = item.partition("=")
        if key != "insecure_auth" or value.lower() not in (*_TRUTHY, "0", "false", "no", "off"):
            raise UsageError(f"bad etcd URL {redact(url)}: the only query parameter is insecure_auth=1")
        insecure = value.lower() in _TRUTHY
    rest = rest.rstrip("/")
    if not rest or "/" in rest:
        raise UsageError(f"bad etcd URL {redact(url)}: give HOST:PORT[,HOST:PORT...] and nothing else")
    tls = scheme.lower() == "etcds"
    if (user is not None or password is not None) and not tls and not insecure:
        raise UsageError(
            f"etcd URL {redact(url)}: etcd:// would send the user name and password in clear text; "
            "use etcds:// (TLS), or add ?insecure_auth=1 to send them over plain HTTP anyway"
        )
    prefix = "https://" if tls else "http://"
    return user, password, [prefix + h.strip() for h in rest.split(",") if h.strip()]
