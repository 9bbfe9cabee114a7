"""Helpers for the end-to-end CLI tests: run ``python -m leasehold`` as a real process."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
import polling  # noqa: E402

BOUND = 60.0  # generous bound for waits; never a timing assertion


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env.pop("LEASEHOLD_BACKEND", None)
    env.update(extra)
    return env


def run_cli(args: list[str], env: dict[str, str], timeout: float = BOUND * 2, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leasehold", *args], env=env, capture_output=True, text=True, timeout=timeout, **kw
    )


def spawn_cli(args: list[str], env: dict[str, str], **kw: Any) -> subprocess.Popen[str]:
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([sys.executable, "-m", "leasehold", *args], env=env, text=True, **kw)


def wait_until(pred: Callable[[], Any], bound: float = BOUND, step: float = 0.02, what: str = "condition") -> Any:
    return polling.wait_until(pred, bound, step, what)


def finish(proc: subprocess.Popen[str], bound: float = BOUND * 2) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"leasehold did not exit within {bound}s; stderr: {err}") from None
    return proc.returncode, out, err


def db_rows(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    if not db.exists():
        return []
    con = sqlite3.connect(db, timeout=30)
    try:
        return con.execute(sql, params).fetchall()
    except sqlite3.OperationalError:  # schema not created yet
        return []
    finally:
        con.close()


def db_exec(db: Path, sql: str, *params: Any) -> int:
    con = sqlite3.connect(db, timeout=30)
    try:
        cur = con.execute(sql, params)
        con.commit()
        return cur.rowcount
    finally:
        con.close()


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
