#!/usr/bin/env bash
# The Python suite: builds the Rust library, sets up the venv, runs pytest over every test
# directory (core, sqlite, cli, redis, sql, etcd), then builds the API reference (build-docs.sh). Exits
# non-zero on any failure, and when pytest collects no test at all (pytest exit code 5).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

# The test hooks (fault switches, debug_panic) are in the library only with --features testing.
echo "== python: cargo build --release --features testing"
(cd "$repo" && cargo build --release --features testing)

if [ -x "$repo/scripts/ensure-redis.sh" ]; then
    # Redis tests start their own redis-server; make sure the binary exists (apt-get).
    "$repo/scripts/ensure-redis.sh"
fi

# PostgreSQL and etcd tests start their own throw-away servers; make sure the binaries exist.
for dep in ensure-postgres.sh ensure-etcd.sh; do
    if [ -x "$repo/scripts/$dep" ]; then
        "$repo/scripts/$dep" || echo "python: $dep failed; those tests skip (or fail under CI=true)" >&2
    fi
done

echo "== python: venv"
"$here/setup-venv.sh"

lib="$repo/target/release/libleasehold.so"
if [ "$(uname)" = "Darwin" ]; then lib="$repo/target/release/libleasehold.dylib"; fi
export LEASEHOLD_LIBRARY="$lib"

cd "$here"
echo "== python: mypy --strict (pyproject.toml [tool.mypy])"
.venv/bin/python -m mypy leasehold

echo "== python: pytest"
set +e
.venv/bin/python -m pytest tests "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "python: pytest collected no tests; that is a failure" >&2
    exit 1
fi
if [ "$rc" -ne 0 ]; then
    exit "$rc"
fi

echo "== python: API reference (pdoc)"
"$here/build-docs.sh"
