#!/usr/bin/env bash
# Builds the history harness's Go and C++ workers into target/histories/ (go-worker,
# cpp-worker) against the checkout's target/release/libleasehold.a, built here first with
# --features testing, as the bindings' suites build it (one build shared with them; the workers
# call no test hook, but the bindings' sources declare them, under LH_TESTING).
# LEASEHOLD_SKIP_CARGO_BUILD=1 uses the library as it is.
# Needs go, g++ and the -dev packages of libpq, libcurl and sqlite3 (installed with apt-get
# when run as root).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

libs="libpq libcurl sqlite3"
command -v pkg-config >/dev/null 2>&1 && pkg-config --exists $libs || {
    if [ "$(id -u)" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            libpq-dev libcurl4-openssl-dev libsqlite3-dev pkg-config >/dev/null
    else
        echo "build-workers: libpq, libcurl and sqlite3 (-dev packages) are required" >&2
        exit 1
    fi
}
if [ "${LEASEHOLD_SKIP_CARGO_BUILD:-}" != 1 ]; then
    cargo build --release --features testing --quiet
fi
out="$root/target/histories"
mkdir -p "$out"
(cd bindings/go && CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -DLH_TESTING" go build -o "$out/go-worker" ./internal/historyworker)
# shellcheck disable=SC2046
g++ -std=c++20 -O2 -Wall -Wextra -Werror -DLH_TESTING -Iinclude -Ibindings/cpp/include \
    $(pkg-config --cflags $libs) tests/histories/worker.cpp target/release/libleasehold.a \
    $(pkg-config --libs $libs) -lpthread -ldl -lm -o "$out/cpp-worker"
echo "build-workers: $out/go-worker $out/cpp-worker"
