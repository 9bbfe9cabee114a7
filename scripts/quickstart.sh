#!/usr/bin/env bash
# Quick start: build everything (the Rust core and C ABI, the C example, the Python package and
# CLI, the Go and C++ bindings), then run the main job on the embedded default backend — a
# SQLite file in your cache directory, no server needed:
# two `leasehold run` commands contend for one lock name. They serialise (B starts only after
# A's command has exited and released the lock) and B's fencing token is higher than A's.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

step() { printf '\n== %s\n' "$*"; }

step "dependencies"
bash scripts/ensure-deps.sh

step "Rust core + C ABI (cargo build --release)"
cargo build --release --quiet
bash scripts/check-header.sh

step "C example host"
make -s -C bindings/c build/example
bindings/c/build/example | tail -n 3

step "Python package + CLI (bindings/python/.venv)"
bash bindings/python/setup-venv.sh
export LEASEHOLD_LIBRARY="$root/target/release/libleasehold.so"

if command -v go >/dev/null 2>&1; then
    step "Go binding (go build)"
    (cd bindings/go && go build ./...)
fi

step "C++ binding (cmake)"
cmake -S bindings/cpp -B bindings/cpp/build/quickstart -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build bindings/cpp/build/quickstart -j 2 >/dev/null

step "main job: two 'leasehold run' contend for the lock 'quickstart' (SQLite default backend)"
LH="$root/bindings/python/.venv/bin/leasehold"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
"$LH" run quickstart --ttl 5 -- sh -c \
    'echo "[A] holds the lock, fencing token $LEASEHOLD_FENCING_TOKEN"; sleep 2; echo "[A] done, releasing"' \
    | tee -a "$out" &
a=$!
# Start B only once A holds the lock, so the demo shows B waiting (`status` exits 0 while
# the lock is held). Bounded: 30 s.
for _ in $(seq 300); do
    "$LH" status quickstart >/dev/null 2>&1 && break
    sleep 0.1
done
"$LH" run quickstart --ttl 5 --wait 30 -- sh -c \
    'echo "[B] holds the lock, fencing token $LEASEHOLD_FENCING_TOKEN"; echo "[B] done, releasing"' \
    | tee -a "$out"
wait "$a"

tokens=$(sed -n 's/.*fencing token \([0-9]*\).*/\1/p' "$out")
ta=$(echo "$tokens" | sed -n 1p)
tb=$(echo "$tokens" | sed -n 2p)
order=$(grep -o '^\[[AB]\] [a-z]*' "$out" | tr '\n' ' ')
echo
echo "order of events: $order"
if [ "$order" != "[A] holds [A] done [B] holds [B] done " ] || [ -z "$ta" ] || [ -z "$tb" ] || [ "$tb" -le "$ta" ]; then
    echo "quickstart: expected A then B, with B's fencing token above A's (got A=$ta B=$tb)" >&2
    exit 1
fi
echo "serialised: A ran, then B; fencing tokens $ta -> $tb (strictly increasing)"
"$LH" status quickstart || true   # exits 1 when the lock is free, as it is now
echo
echo "Next: bash scripts/test-all.sh runs every test suite."
