"""The examples in the package's module docstrings run against the real API."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from docstring_examples import examples, run_example  # noqa: E402


def test_package_docstring_example_takes_a_lock() -> None:
    (code,) = examples("leasehold")
    tokens: list[int] = []
    run_example(code, {"write_report": lambda fencing_token: tokens.append(fencing_token)})
    assert tokens == [1]


def test_testing_docstring_example_loses_the_lock() -> None:
    (code,) = examples("leasehold.testing")
    from leasehold import LockClient
    from leasehold.testing import FakeClock, MemoryExecutor, MemoryService, settle

    ns = run_example(
        code,
        {"LockClient": LockClient, "FakeClock": FakeClock, "MemoryService": MemoryService,
         "MemoryExecutor": MemoryExecutor, "settle": settle},
    )
    assert ns["h"].lost.is_set()
