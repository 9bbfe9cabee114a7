"""Run the code examples of module docstrings, so that they keep matching the real API."""

from __future__ import annotations

import importlib
import re
import textwrap
from typing import Any


def examples(module_name: str) -> list[str]:
    """The literal blocks (``::`` followed by an indented block) of a module's docstring."""
    doc = importlib.import_module(module_name).__doc__ or ""
    blocks = []
    for m in re.finditer(r"::\n\n((?:[ ]{4,}.*\n|\n)+)", doc + "\n"):
        blocks.append(textwrap.dedent(m.group(1)))
    return blocks


def run_example(code: str, namespace: dict[str, Any]) -> dict[str, Any]:
    exec(compile(code, "<docstring example>", "exec"), namespace)
    return namespace
