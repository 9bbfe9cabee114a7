"""The SQL executors' tests: real SQLite files, and a real PostgreSQL cluster shared by the
session (the ``pg_server`` / ``pg_url`` fixtures of tests/conftest.py)."""
