"""No message shows a backend's secret, whatever the URL: the redaction function on hostile
URLs, the library's URL parsers, and the real CLI (its stdout and stderr, log lines included)."""

from __future__ import annotations

import pytest
from cli_helpers import run_cli

from leasehold._urls import PLACEHOLDER, check_url, escape_control, redact, scrub, secrets_of

SECRET = "S3CRET"

# Each holds SECRET where a password goes (or a secret query value), in a way some parser
# misreads. Ports are 1 on 127.0.0.1: nothing listens, so nothing waits.
HOSTILE = [
    f"redis://:{SECRET}@127.0.0.1:1/0",
    f"redis://user:{SECRET}@127.0.0.1:1/0",
    f"rediss://:{SECRET}@127.0.0.1:1/0",
    f"redis://{SECRET}xx@127.0.0.1:1/0",  # a user-only userinfo may be a misplaced password
    f"redis://:pa/{SECRET}@127.0.0.1:1/0",  # unescaped '/'
    f"redis://:pa?{SECRET}@127.0.0.1:1/0",  # unescaped '?'
    f"redis://:pa#{SECRET}@127.0.0.1:1/0",  # unescaped '#'
    f"redis://:pa@{SECRET}@127.0.0.1:1/0",  # unescaped '@'
    f"redis://:{SECRET}%ZZ@127.0.0.1:1/0",  # bad percent-escape
    f"redis://:{SECRET}%@127.0.0.1:1/0",
    f"redis://127.0.0.1:1/0?password={SECRET}",
    f"redis://127.0.0.1:1/0?db=0&password={SECRET}&x=1",
    f"redis://:{SECRET}@127.0.0.1:notaport/0",
    f"redis://:{SECRET}@127.0.0.1:1/notadb",
    f"rediss://:{SECRET}@[::1:1/0",
    f"unix://:{SECRET}@/tmp/nothing.sock?db=0",
    f"unix:///tmp/nothing.sock?password={SECRET}",
    f"redis+sentinel://:{SECRET}@h:1/m/x",
    f"redis+sentinel://:{SECRET}@127.0.0.1:1/m",
    f"redis+sentinel://:pa/{SECRET}@127.0.0.1:1/m",
    f"redis+sentinel://u:{SECRET}@127.0.0.1:1",
    f"redis+sentinel://:{SECRET}@[::1/m",
    f"redis+cluster://:{SECRET}@127.0.0.1:1",
    f"redis+cluster://:pa/{SECRET}@127.0.0.1:1",
    f"redis+cluster://:{SECRET}@127.0.0.1:1/path",
    f"redis+cluster://u:{SECRET}@127.0.0.1:x",
    f"postgresql://u:{SECRET}@[::1/db",
    f"postgresql://u:{SECRET}@127.0.0.1:1/db",
    f"postgresql://u:pa/{SECRET}@127.0.0.1:1/db",
    f"postgresql://u:{SECRET}%ZZ@127.0.0.1:1/db",
    f"postgresql://u@127.0.0.1:1/db?password={SECRET}",
    f"postgresql://u@127.0.0.1:1/db?sslpassword={SECRET}&sslmode=bogus",
    f"postgresql://u@127.0.0.1:1/db?password={SECRET}%ZZ",
    f"postgres://u:{SECRET}@127.0.0.1:1/db?sslmode=verify-full",
    f"postgresql://u:{SECRET}@127.0.0.1:1/db#frag",
    f"postgresql://u:{SECRET} x@127.0.0.1:1/db",
    f"etcd://user:{SECRET}@127.0.0.1:1",
    f"etcd://user:{SECRET}@127.0.0.1:1?insecure_auth=1",
    f"etcds://user:{SECRET}@127.0.0.1:1",
    f"etcd://user:pa/{SECRET}@127.0.0.1:1",
    f"etcd://user:{SECRET}@",
    f"etcds://user:{SECRET}@127.0.0.1:1/path",
    f"sqlite://u:{SECRET}@host/x.db",
    f"memory://u:{SECRET}@x",
    f"ftp://u:{SECRET}@host/",
    f"u:{SECRET}@127.0.0.1:1",  # no scheme
    f"host=127.0.0.1 password={SECRET}",  # a libpq key=value string
    f"redis://:{SECRET}\x1b[2J@127.0.0.1:1/0",
]


def test_sqlite_url_errors_do_not_quote_the_url() -> None:
    from leasehold.backends.sqlite import path_from_url

    for url in (f"sqlite://u:{SECRET}@host/x.db", f"sqlite:///x.db?password={SECRET}", f"redis://:{SECRET}@h/0"):
        with pytest.raises(ValueError) as info:
            path_from_url(url)
        assert SECRET not in str(info.value), info.value


def test_cli_creates_the_default_directory_private(tmp_path) -> None:
    from cli_helpers import cli_env

    env = cli_env(tmp_path)
    r = run_cli(["run", "default-dir", "--", "true"], env)
    assert r.returncode == 0, r.stderr
    cache = tmp_path / "cache"
    for d in (cache, cache / "leasehold"):
        assert d.stat().st_mode & 0o777 == 0o700, (d, oct(d.stat().st_mode))
    assert (cache / "leasehold" / "locks.sqlite3").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("url", HOSTILE)
def test_redact_hides_the_secret(url: str) -> None:
    shown = redact(url)
    assert SECRET not in shown, shown
    assert "\x1b" not in shown
    assert shown == PLACEHOLDER or "***" in shown, shown  # each holds a secret: shown hidden
    assert SECRET not in scrub(f"driver said: {url!r} / {url}", url)


@pytest.mark.parametrize(
    "url, shown",
    [
        ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
        ("redis://user:pw@h:1/0", "redis://user:***@h:1/0"),
        ("redis://h:1/0", "redis://h:1/0"),
        ("etcd://root:secret@a:1,b:2", "etcd://root:***@a:1,b:2"),
        ("redis+sentinel://:pw@h:1,h:2/m/3", "redis+sentinel://:***@h:1,h:2/m/3"),
        ("postgresql://u:p@[::1]:5432/db?sslmode=verify-full", "postgresql://u:***@[::1]:5432/db?sslmode=verify-full"),
        ("postgresql://h/db?sslpassword=x&password=y&user=u", "postgresql://h/db?sslpassword=***&password=***&user=u"),
        ("postgresql://u:p@[::1/db", PLACEHOLDER),
        ("postgresql://alice@h/db", "postgresql://***@h/db"),
        ("sqlite:///home/a@b/x.db", "sqlite:///home/a@b/x.db"),
        ("sqlite://", "sqlite://"),
        ("memory://", "memory://"),
        ("bogus", "bogus"),
        ("u:p@h", "u:***@h"),
        ("a b=c", PLACEHOLDER),
        (None, PLACEHOLDER),
    ],
)
def test_redact_keeps_what_is_not_secret(url: object, shown: str) -> None:
    assert redact(url) == shown


def test_secrets_of_and_scrub() -> None:
    url = "redis://:pa/ss%21word@h:1/0?token=tt%2Btt"
    found = secrets_of(url)
    assert "pa/ss%21word" in found and "pa/ss!word" in found and "pass%21word" in found and "tt+tt" in found
    # A driver that dropped the '/' or decoded the escape is scrubbed all the same.
    assert "ss" not in scrub("bad db 'ss%21word@h0', auth pa/ss!word, pass%21word, tt+tt", url).replace("***", "")
    assert scrub("plain \x1b[31m", None) == "plain \\x1b[31m"


@pytest.mark.parametrize(
    "text, escaped",
    [
        ("a\x1b]0;t\x07b", "a\\x1b]0;t\\x07b"),
        ("\x7f\x9b\x80\x9f", "\\x7f\\x9b\\x80\\x9f"),
        ("tab\there\nnl\r", "tab\\x09here\\x0anl\\x0d"),
        ("bidi\u202eevil\u2066", "bidi\\u202eevil\\u2066"),
        ("ok héllo ✓", "ok héllo ✓"),
    ],
)
def test_escape_control(text: str, escaped: str) -> None:
    assert escape_control(text) == escaped


@pytest.mark.parametrize(
    "url",
    [u for u in HOSTILE if u.startswith(("redis:", "rediss:", "redis+", "postgres", "etcd")) and ("pa/" in u or "%" in u or "[" in u)],
)
def test_check_url_refuses_misreadable_urls_without_quoting_them(url: str) -> None:
    with pytest.raises(ValueError) as info:
        check_url(url)
    assert SECRET not in str(info.value)


def test_library_url_constructors_do_not_quote_the_url() -> None:
    pytest.importorskip("redis")
    from leasehold.backends.redis import RedisLockService
    from leasehold.backends.redis_cluster_executor import RedisClusterExecutor, parse_cluster_url
    from leasehold.backends.redis_connect import connection_pool, parse_sentinel_url

    calls = [
        lambda: RedisLockService.from_url(f"redis://:pa/{SECRET}@127.0.0.1:1/0"),
        lambda: RedisLockService.from_url(f"redis://:{SECRET}@127.0.0.1:notaport/0"),
        lambda: RedisLockService.from_url(f"redis://:{SECRET}%ZZ@127.0.0.1:1/0"),
        lambda: connection_pool(url=f"redis://127.0.0.1:1/0?password={SECRET}&socket_timeout=bad"),
        lambda: parse_sentinel_url(f"redis+sentinel://:{SECRET}@h:1/m/x"),
        lambda: parse_sentinel_url(f"redis+sentinel://:{SECRET}@h:1"),
        lambda: parse_sentinel_url(f"redis+sentinel://:pa/{SECRET}@h:1/m"),
        lambda: parse_sentinel_url(f"redis://:{SECRET}@h:1/m"),
        lambda: parse_cluster_url(f"redis+cluster://:{SECRET}@h:1/path"),
        lambda: parse_cluster_url(f"redis+cluster://:pa/{SECRET}@h:1"),
        lambda: parse_cluster_url(f"redis://:{SECRET}@h:1"),
        lambda: RedisClusterExecutor(url=f"redis+cluster://:pa/{SECRET}@127.0.0.1:1"),
    ]
    for call in calls:
        with pytest.raises(ValueError) as info:
            call()
        assert SECRET not in str(info.value) and SECRET not in repr(info.value), info.value


@pytest.mark.parametrize("url", HOSTILE)
def test_cli_status_never_prints_the_secret(env, url: str) -> None:
    res = run_cli(["status", "foo", "--backend", url], env, timeout=60)
    out = res.stdout + res.stderr
    assert SECRET not in out, out
    assert "Traceback" not in out and "\x1b" not in out, out
    assert res.returncode in (64, 69), (res.returncode, out)


@pytest.mark.parametrize("url", [u for u in HOSTILE if "127.0.0.1:1" in u][::3])
def test_cli_run_never_prints_the_secret_from_the_environment(env, url: str) -> None:
    # Verbose, so every log line is printed too; the URL comes from LEASEHOLD_BACKEND.
    res = run_cli(["run", "-v", "-w", "1", "foo", "--", "true"], {**env, "LEASEHOLD_BACKEND": url}, timeout=90)
    out = res.stdout + res.stderr
    assert SECRET not in out, out
    assert res.returncode in (64, 69, 75), (res.returncode, out)


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://u:{SECRET}%ZZ@127.0.0.1:1/db",  # libpq quotes the bad token
        f"postgresql://u:{SECRET}@[::1/db",  # libpq quotes the whole URI
        f"postgresql://u@127.0.0.1:1/db?password={SECRET}&sslmode=bogus",
    ],
)
def test_library_log_lines_and_errors_hide_the_secret(url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A driver's error (fed to the core, which reports it as the status error, and logged
    when it is a transport failure) is scrubbed of the URL's secrets."""
    pytest.importorskip("psycopg")
    from leasehold._backend import backend_status
    from leasehold.backends.sql_executor import PostgresExecutor

    executor = PostgresExecutor(url)
    try:
        with caplog.at_level("DEBUG", logger="leasehold"):
            try:
                answer = backend_status(executor, "x", timeout=3)
                text = f"{answer.error} {answer!r}"
            except Exception as e:  # noqa: BLE001 - its text is what is checked
                text = f"{e} {e!r}"
    finally:
        executor.close()
    assert "failed" in text, text  # the driver's error came through ...
    assert SECRET not in caplog.text and SECRET not in text, (caplog.text, text)  # ... without the secret


def test_reprs_of_objects_made_from_secret_urls_hide_the_secret() -> None:
    pytest.importorskip("redis")
    pytest.importorskip("psycopg")
    from leasehold.backends.etcd_executor import EtcdExecutor
    from leasehold.backends.redis import RedisLockService
    from leasehold.backends.redis_executor import RedisExecutor
    from leasehold.backends.sql_executor import PostgresExecutor

    made = [  # none of them does IO before it is used
        RedisLockService.from_url(f"redis://:{SECRET}@127.0.0.1:1/0"),
        RedisExecutor(url=f"redis+sentinel://:{SECRET}@127.0.0.1:1/m"),
        PostgresExecutor(f"postgresql://u:{SECRET}@127.0.0.1:1/db"),
        EtcdExecutor(["https://127.0.0.1:1"], user="u", password=SECRET),
    ]
    try:
        for obj in made:
            for part in (obj, getattr(obj, "pool", None), getattr(obj, "options", None)):
                assert SECRET not in repr(part) and SECRET not in str(part), repr(part)
    finally:
        for obj in made:
            obj.close()
