from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # cli_helpers

from cli_helpers import cli_env  # noqa: E402


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return cli_env(tmp_path)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "locks.sqlite3"


@pytest.fixture
def backend(db: Path) -> list[str]:
    return ["--backend", f"sqlite://{db}"]
