#!/usr/bin/env bash
# History suite (tests/histories/README.md): Python, Go and C++ workers run lock workloads
# through the public APIs against real servers this script's harness starts (SQLite files,
# PostgreSQL, Redis, Redis Sentinel, Redis Cluster, a 3-member etcd cluster) while faults are
# injected (paused and killed clients, killed servers and leaders, failovers, dropped
# connections, clock steps); checkers decide from the recorded histories. Every fenced cell
# must show 0 violations, every unfenced control at least one.
#
#   LEASEHOLD_HISTORIES_LONG=1    the long run (15 s per run, faults repeated, 2 seeds per cell)
#   LEASEHOLD_HISTORIES_SEED=N    replay a matrix with this seed (the seed is printed)
#   CI=true                       a missing server fails the suite instead of skipping its cells
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash scripts/ensure-redis.sh
bash scripts/ensure-postgres.sh
bash scripts/ensure-etcd.sh
bash bindings/python/setup-venv.sh >/dev/null
py="$root/bindings/python/.venv/bin/python"

echo "test-histories: the checkers on hand-made histories"
"$py" -m pytest -q -p no:cacheprovider tests/histories/test_check.py

echo "test-histories: building the library and the Go and C++ workers"
bash tests/histories/build-workers.sh
export LEASEHOLD_LIBRARY="$root/target/release/libleasehold.so"

args=(--go target/histories/go-worker --cpp target/histories/cpp-worker --out target/histories/failures)
if [ "${LEASEHOLD_HISTORIES_LONG:-0}" = 1 ]; then
    args+=(--matrix long --seeds "${LEASEHOLD_HISTORIES_SEEDS:-2}")
else
    args+=(--matrix short)
fi
[ -n "${LEASEHOLD_HISTORIES_SEED:-}" ] && args+=(--seed "$LEASEHOLD_HISTORIES_SEED")
[ "${CI:-}" = true ] && args+=(--require-servers)
"$py" tests/histories/run.py "${args[@]}"
echo "test-histories: passed"
