#!/usr/bin/env bash
# Go binding suite: builds the Rust static library (with the test hooks), then gofmt, go vet and
# `go test -race` of every test, RedisStreamExecutor's included (it starts its own
# redis-servers, a throw-away PostgreSQL
# cluster and a 3-member etcd cluster, and, for the interop tests, runs Python
# workers from bindings/python/.venv). Installs what it needs; under CI=true a
# missing server or Python package is a failure.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

command -v go >/dev/null 2>&1 || { echo "go/test.sh: the Go toolchain (1.24+) is required" >&2; exit 1; }
command -v cargo >/dev/null 2>&1 || { echo "go/test.sh: cargo is required to build libleasehold.a" >&2; exit 1; }

# --features testing: the tests drive the memory service's fault switches and the panic hook.
echo "go/test.sh: building the Rust library (cargo build --release --features testing)"
(cd "$root" && cargo build --release --features testing --quiet)
test -f "$root/target/release/libleasehold.a" || { echo "go/test.sh: target/release/libleasehold.a missing" >&2; exit 1; }

# redis-server for the Redis, process and interop tests (they start their own on a free port).
if [ -x "$root/scripts/ensure-redis.sh" ] || [ -f "$root/scripts/ensure-redis.sh" ]; then
    bash "$root/scripts/ensure-redis.sh"
fi
# PostgreSQL and etcd binaries (the tests start their own servers with
# scripts/pg-test-server.sh and scripts/etcd-test-cluster.sh). Without them
# the tests say so and skip, except under CI=true.
for ensure in ensure-postgres.sh ensure-etcd.sh; do
    bash "$root/scripts/$ensure" || echo "go/test.sh: scripts/$ensure failed; the tests that need it will report it" >&2
done
# The Python package for the interop test (idempotent; fast when already installed).
if [ -f "$root/bindings/python/setup-venv.sh" ]; then
    bash "$root/bindings/python/setup-venv.sh" || {
        echo "go/test.sh: bindings/python/setup-venv.sh failed; the interop test will report it" >&2
    }
fi

cd "$here"
go mod download
unformatted="$(gofmt -l .)"
if [ -n "$unformatted" ]; then
    echo "go/test.sh: gofmt -l is not empty:" >&2
    echo "$unformatted" >&2
    exit 1
fi
echo "go/test.sh: go vet"
go vet ./...
# The peer benchmarks (their own module: etcd's client, pglock) are not run here, but they
# must keep building against the binding.
(cd bench && go vet ./...)
echo "go/test.sh: go test -race"
go test -race -count=1 -timeout 20m ./...
