"""Every SQL executor in both clients, on a real SQLite file and a real PostgreSQL server: a
synchronous one in ``AsyncLockClient`` runs its requests in worker threads (the PostgreSQL
listener's notifications reach the loop); an asyncio one in ``LockClient`` is refused with
an error naming its synchronous twin."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from either_client import in_both_clients, refused_by_lock_client  # noqa: E402

from leasehold.backends.sql_executor import PostgresExecutor, SqliteExecutor  # noqa: E402
from leasehold.backends.sql_executor_async import AsyncPostgresExecutor  # noqa: E402
from leasehold.backends.sqlite import SQLiteLockService  # noqa: E402


def test_sqlite_executor_in_both_clients(tmp_path: Path) -> None:
    path = str(tmp_path / "locks.db")
    in_both_clients(lambda: SqliteExecutor(path), "either")


def test_sqlite_lock_service_in_both_clients(tmp_path: Path) -> None:
    path = str(tmp_path / "locks.db")
    in_both_clients(lambda: SQLiteLockService(path), "either")


def test_postgres_executor_in_both_clients(pg_url: str) -> None:
    in_both_clients(lambda: PostgresExecutor(pg_url), "either")


def test_async_postgres_executor_is_refused_by_lock_client(pg_url: str) -> None:
    refused_by_lock_client(AsyncPostgresExecutor(pg_url), "leasehold.backends.sql_executor.PostgresExecutor")
