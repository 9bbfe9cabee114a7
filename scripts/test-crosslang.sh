#!/usr/bin/env bash
# Cross-language suite: Python, Go and C++ worker processes contend for one lock name on a real
# backend each run starts itself (Redis, PostgreSQL, a 3-member etcd cluster), and a checker
# reads their shared log (tests/crosslang/README.md). On Redis they run twice more on the byte
# executors, with a C worker too: on one server, on a Sentinel set and on a Cluster.
# Builds the Rust library and the Go and C++ workers; installs what it needs.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash scripts/ensure-redis.sh
bash scripts/ensure-postgres.sh
bash scripts/ensure-etcd.sh
libs="hiredis libpq libcurl"
command -v pkg-config >/dev/null 2>&1 && pkg-config --exists $libs || {
    if [ "$(id -u)" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            libhiredis-dev libpq-dev libcurl4-openssl-dev pkg-config >/dev/null
    else
        echo "test-crosslang: hiredis, libpq and libcurl (-dev packages) are required" >&2
        exit 1
    fi
}
bash bindings/python/setup-venv.sh >/dev/null

echo "test-crosslang: building the library and the workers"
# The release build, without the test hooks (the workers use none): what users link.
cargo build --release --quiet
out="$root/target/crosslang"
mkdir -p "$out"
(cd bindings/go && go build -o "$out/go-worker" ./internal/crosslangworker)
# shellcheck disable=SC2046
g++ -std=c++20 -O2 -Wall -Wextra -Werror -Iinclude -Ibindings/cpp/include \
    $(pkg-config --cflags $libs) tests/crosslang/worker.cpp target/release/libleasehold.a \
    $(pkg-config --libs $libs) -lpthread -ldl -lm -o "$out/cpp-worker"
gcc -std=c11 -O2 -Wall -Wextra -Werror -Iinclude -Ibindings/c/redis tests/crosslang/worker.c \
    bindings/c/redis/lh_stream.c target/release/libleasehold.a -lpthread -ldl -lm -o "$out/c-worker"

for backend in redis redis-bytes redis-sentinel redis-cluster postgres etcd; do
    bindings/python/.venv/bin/python tests/crosslang/run.py --backend "$backend" \
        --go "$out/go-worker" --cpp "$out/cpp-worker" --c "$out/c-worker" \
        --rounds "${LEASEHOLD_CROSSLANG_ROUNDS:-100}"
done
echo "test-crosslang: passed"
