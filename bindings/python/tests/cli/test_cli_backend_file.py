"""Passing the backend without a secret on the command line (``--backend-file``,
``LEASEHOLD_BACKEND_FILE``, ``LEASEHOLD_BACKEND``), and COMMAND's environment: the lock's
variables, never the backend URL or its password."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cli_helpers import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "redis"))
from lh_redis_server import RedisServer, _in_ci, ensure_redis_server  # noqa: E402

PASSWORD = "S3CRET-pass-word"
# COMMAND prints its environment and the command line of its parent (leasehold itself).
DUMP = [
    sys.executable, "-c",
    "import json, os; print(json.dumps({'env': dict(os.environ), "
    "'parent_cmdline': open(f'/proc/{os.getppid()}/cmdline', 'rb').read().decode(errors='replace')}))",
]


@pytest.fixture
def redis_with_password(tmp_path: Path):
    """A real redis-server on a free loopback port that requires PASSWORD."""
    binary = ensure_redis_server()
    if binary is None:
        msg = "redis-server is not installed"
        if _in_ci():
            pytest.fail(msg + " -- CI=true: a missing redis-server is a failure")
        pytest.skip(msg)
    srv = RedisServer(binary, tmp_path / "redis").start()
    try:
        client = srv.client()
        client.config_set("requirepass", PASSWORD)
        client.close()
        yield f"redis://:{PASSWORD}@127.0.0.1:{srv.port}/0"
    finally:
        srv.close()


def _child(res) -> dict:  # type: ignore[no-untyped-def]
    assert res.returncode == 0, (res.returncode, res.stderr)
    return json.loads(res.stdout)  # type: ignore[no-any-return]


def _write(path: Path, text: str, mode: int) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/cmdline")
def test_child_gets_the_lock_not_the_credentials(env, redis_with_password) -> None:
    url = redis_with_password
    res = run_cli(
        ["run", "job", "--", *DUMP],
        {**env, "LEASEHOLD_BACKEND": url, "APP_REDIS_URL": url, "APP_PASSWORD": PASSWORD, "KEEP_ME": "kept"},
    )
    child = _child(res)
    assert PASSWORD not in json.dumps(child["env"]), child["env"]
    assert "LEASEHOLD_BACKEND" not in child["env"]
    assert child["env"]["LEASEHOLD_LOCK_NAME"] == "job"
    assert int(child["env"]["LEASEHOLD_FENCING_TOKEN"]) >= 1
    assert child["env"]["KEEP_ME"] == "kept"  # everything else is passed on
    assert PASSWORD not in res.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/cmdline")
def test_backend_file_keeps_the_password_off_the_command_line(env, tmp_path, redis_with_password) -> None:
    secret_file = _write(tmp_path / "backend", redis_with_password + "\n# comment lines after the first are ignored\n", 0o600)
    first = _child(run_cli(["run", "--backend-file", str(secret_file), "job", "--", *DUMP], env))
    assert PASSWORD not in first["parent_cmdline"] and str(secret_file) in first["parent_cmdline"]
    assert PASSWORD not in json.dumps(first["env"])
    # The same lock service through LEASEHOLD_BACKEND_FILE: the fencing token goes on.
    res = run_cli(["run", "job", "--", *DUMP], {**env, "LEASEHOLD_BACKEND_FILE": str(secret_file)})
    second = _child(res)
    assert int(second["env"]["LEASEHOLD_FENCING_TOKEN"]) > int(first["env"]["LEASEHOLD_FENCING_TOKEN"])
    assert "LEASEHOLD_BACKEND_FILE" not in second["env"] and PASSWORD not in json.dumps(second["env"])
    assert "warning" not in res.stderr, res.stderr  # mode 600: nothing to say
    status = run_cli(["status", "job", "--backend-file", str(secret_file), "--json"], env)
    assert status.returncode == 1, status.stderr  # free again
    assert json.loads(status.stdout)["last_fencing_token"] == int(second["env"]["LEASEHOLD_FENCING_TOKEN"])
    assert PASSWORD not in status.stdout + status.stderr


def test_backend_file_open_to_others_is_warned_about(env, tmp_path) -> None:
    db = tmp_path / "locks.sqlite3"
    shared = _write(tmp_path / "backend", f"sqlite://{db}\n", 0o644)
    res = run_cli(["run", "--backend-file", str(shared), "job", "--", "sh", "-c", 'echo "$LEASEHOLD_FENCING_TOKEN"'], env)
    assert res.returncode == 0, res.stderr
    assert int(res.stdout) >= 1 and db.exists()
    assert "warning" in res.stderr and "chmod 600" in res.stderr and "644" in res.stderr, res.stderr


def test_child_never_gets_leasehold_backend(env, tmp_path) -> None:
    url = f"sqlite://{tmp_path / 'locks.sqlite3'}"
    child = _child(run_cli(["run", "job", "--", *DUMP], {**env, "LEASEHOLD_BACKEND": url}))
    assert "LEASEHOLD_BACKEND" not in child["env"] and child["env"]["LEASEHOLD_LOCK_NAME"] == "job"


@pytest.mark.parametrize(
    "content, mode, args_extra, env_extra, needle",
    [
        ("", 0o600, [], {}, "empty"),
        ("\n\n", 0o600, [], {}, "empty"),
        (None, 0, [], {}, "cannot read"),  # no such file
        ("sqlite://", 0o600, ["--backend", "sqlite://"], {}, "not both"),
        ("sqlite://", 0o600, [], {"LEASEHOLD_BACKEND": "sqlite://", "LEASEHOLD_BACKEND_FILE": "/x"}, "unset one"),
        ("redis://:S3CRET@127.0.0.1:notaport/0", 0o600, [], {}, "bad Redis URL"),
    ],
)
def test_bad_backend_files_are_usage_errors(env, tmp_path, content, mode, args_extra, env_extra, needle) -> None:
    path = tmp_path / "backend"
    if content is not None:
        _write(path, content, mode)
    if "LEASEHOLD_BACKEND_FILE" in env_extra:
        args = ["run", "job", "--", "true"]
    else:
        args = ["run", "--backend-file", str(path), *args_extra, "job", "--", "true"]
    res = run_cli(args, {**env, **env_extra})
    assert res.returncode == 64, (res.returncode, res.stderr)
    assert needle in res.stderr and "S3CRET" not in res.stderr, res.stderr


def test_child_environment_drops_what_holds_the_secret_and_keeps_the_rest() -> None:
    from leasehold._cli_backends import child_environment

    url = f"redis://app:{PASSWORD}@h:1/0"
    env = {
        "LEASEHOLD_BACKEND": url, "LEASEHOLD_BACKEND_FILE": "/etc/x", "REDIS_URL": url,
        "PW": PASSWORD, "OPTS": f"--auth {PASSWORD} -v", "USER": "app", "PATH": "/usr/bin", "SHORT": "pw",
    }
    assert child_environment(env, url) == {"USER": "app", "PATH": "/usr/bin", "SHORT": "pw"}
    # A user name alone is not taken for a secret: $USER stays.
    assert child_environment({"USER": "alice"}, "postgresql://alice@h/db") == {"USER": "alice"}
    # The default backend has no secret: only the backend variables go.
    assert child_environment({"LEASEHOLD_BACKEND": "sqlite://", "A": "sqlite://"}, "sqlite://") == {"A": "sqlite://"}
    # Secret query values count too.
    assert child_environment({"T": "tok-123456"}, "postgresql://h/db?password=tok-123456") == {}
