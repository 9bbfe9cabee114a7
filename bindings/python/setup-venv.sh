#!/usr/bin/env bash
# Create (or update) bindings/python/.venv with the package installed editable plus test extras.
# Idempotent: a second run only re-checks the install.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
PY="${PYTHON:-python3.11}"
if ! command -v "$PY" >/dev/null 2>&1; then
    echo "setup-venv: $PY not found (Python 3.11 is required)" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.leasehold-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
    # The development venv loads target/release (LEASEHOLD_LIBRARY, or the checkout fallback),
    # so the editable install skips the package's own Rust build.
    LEASEHOLD_SKIP_RUST_BUILD=1 .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
    touch "$stamp"
fi
.venv/bin/python -c 'import pytest, hypothesis, redis, redis_lock, psycopg' >/dev/null
