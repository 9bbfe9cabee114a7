"""Shared pytest setup for every Python test directory (core, sqlite, cli, redis)."""

from __future__ import annotations

import logging

import pytest


def pytest_report_header(config: pytest.Config) -> list[str]:
    try:
        import leasehold

        return [f"leasehold core {leasehold.CORE_VERSION} from {leasehold.library_path}"]
    except Exception as e:  # the import error itself is reported by the tests
        return [f"leasehold: cannot import ({e})"]


@pytest.fixture(autouse=True)
def _leasehold_debug_logging(caplog: pytest.LogCaptureFixture) -> None:
    """Keep leasehold's warnings in the captured log of a failing test."""
    caplog.set_level(logging.INFO, logger="leasehold")
