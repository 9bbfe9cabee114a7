"""The example in leasehold.backends.redis's module docstring runs against a real server."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from docstring_examples import examples, run_example  # noqa: E402


def test_redis_docstring_example_takes_a_lock(r, redis_server) -> None:
    (code,) = examples("leasehold.backends.redis")
    assert "redis://127.0.0.1:6379/0" in code
    tokens: list[int] = []
    run_example(
        code.replace("redis://127.0.0.1:6379/0", redis_server.url),
        {"write_report": lambda fencing_token: tokens.append(fencing_token)},
    )
    assert len(tokens) == 1 and tokens[0] > 0
    assert r.exists("lh:{reports}") == 0  # released on leaving the block
