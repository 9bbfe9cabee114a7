#!/usr/bin/env bash
# The C suite of leasehold. From the repository root or anywhere:
#   bindings/c/test.sh
# 1. builds the Rust library in release with the test hooks (target/release/libleasehold.{so,a},
#    `--features testing`: the C tests call lh_client_debug_panic);
# 2. verifies include/leasehold.h against a fresh cbindgen run (scripts/check-header.sh);
# 3. compiles the header as C11 and C++17 with -Wall -Wextra -Werror;
# 4. builds and runs the example host, the C tests under ASan+UBSan, and the C tests again
#    under valgrind --error-exitcode=1 --leak-check=full; then the Redis host (the hiredis
#    executor in redis/) against a real redis-server, and the SQLite host (the libsqlite3
#    executor in sqlite/) on a real file, under both; then both executors under a failing
#    allocator (tests/test_alloc.c), under both; then the stream host (redis/lh_stream.c) against
#    a real redis-server under both, and built without TLS;
# 5. installs into a scratch prefix with scripts/install-lib.sh and links a program through
#    `pkg-config --cflags --libs leasehold` (shared) and `leasehold-static` (static).
# Installs missing tools with apt-get (as root). Prints "c: OK" at the end.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
export PATH="$HOME/.cargo/bin:$PATH"

need=()
command -v cc >/dev/null || need+=(gcc)
command -v c++ >/dev/null || need+=(g++)
command -v make >/dev/null || need+=(make)
command -v valgrind >/dev/null || need+=(valgrind)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v readelf >/dev/null || need+=(binutils)
[ -f /usr/include/hiredis/hiredis.h ] || need+=(libhiredis-dev)
[ -f /usr/include/sqlite3.h ] || need+=(libsqlite3-dev)
[ -f /usr/include/openssl/ssl.h ] || need+=(libssl-dev)
command -v openssl >/dev/null || need+=(openssl)
if ((${#need[@]})); then
    if [[ $EUID -ne 0 ]]; then
        echo "c: missing ${need[*]} and not root to apt-get them" >&2
        exit 1
    fi
    echo "c: installing ${need[*]}" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

step() { printf '\n== c: %s\n' "$*"; }

bash "$ROOT/scripts/ensure-redis.sh"

step "cargo build --release --features testing"
cargo build --release --features testing --quiet

step "header is up to date"
scripts/check-header.sh

cd bindings/c
step "header compiles as C11 and C++17 (-Wall -Wextra -Werror)"
make -s headers

step "build example, tests, bench"
make -s all

step "example"
./build/example

# The poisoning test panics on purpose; keep its message short.
export RUST_BACKTRACE=0

step "C tests under AddressSanitizer + UndefinedBehaviorSanitizer"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ./build/test_asan

step "C tests under valgrind"
valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect,possible \
    ./build/test_plain

step "Redis host (hiredis executor) against a real redis-server, ASan+UBSan and valgrind"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ./build/test_redis_asan
valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect,possible \
    ./build/test_redis_plain

step "SQLite host (libsqlite3 executor) on a real file, ASan+UBSan and valgrind"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ./build/test_sqlite_asan
valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect,possible \
    ./build/test_sqlite_plain

step "both executors under a failing allocator (every realloc of a flatten fails in turn), ASan+UBSan and valgrind"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ./build/test_alloc_asan
valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect,possible \
    ./build/test_alloc_plain

step "stream host (redis/lh_stream.c, LH_BACKEND_REDIS_STREAM) against a real redis-server, ASan+UBSan, valgrind, and built without TLS"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ./build/test_stream_asan
valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect,possible \
    ./build/test_stream_plain
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ./build/test_stream_notls

step "install + pkg-config (shared and static)"
PREFIX="$PWD/build/prefix"
rm -rf "$PREFIX"
LEASEHOLD_NO_BUILD=1 "$ROOT/scripts/install-lib.sh" "$PREFIX" >/dev/null
export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"
echo "pkg-config --cflags --libs leasehold: $(pkg-config --cflags --libs leasehold)"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror tests/link_smoke.c $(pkg-config --cflags --libs leasehold) -o build/link_shared
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror tests/link_smoke.c $(pkg-config --cflags --libs leasehold-static) -o build/link_static
LD_LIBRARY_PATH="$PREFIX/lib" ./build/link_shared
# The shared library carries SONAME libleasehold.so.<LH_ABI_VERSION>, a program records that
# name, and the install provides it as a symlink to the versioned file.
abi="$(sed -n 's/^#define LH_ABI_VERSION \([0-9][0-9]*\)$/\1/p' "$ROOT/include/leasehold.h")"
soname="$(readelf -d "$PREFIX/lib/libleasehold.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')"
needed="$(readelf -d build/link_shared | sed -n 's/.*Shared library: \[\(libleasehold[^]]*\)\]/\1/p')"
echo "SONAME $soname, link_shared needs $needed (LH_ABI_VERSION $abi)"
if [[ -z "$abi" || "$soname" != "libleasehold.so.$abi" || "$needed" != "$soname" ]]; then
    echo "c: SONAME '$soname' / NEEDED '$needed' do not follow LH_ABI_VERSION $abi" >&2
    exit 1
fi
if [[ ! -L "$PREFIX/lib/$soname" || ! -L "$PREFIX/lib/libleasehold.so" ]]; then
    echo "c: install-lib.sh did not link $soname and libleasehold.so to the versioned library" >&2
    exit 1
fi
if ldd build/link_static | grep -q libleasehold; then
    echo "c: static link still depends on libleasehold.so" >&2
    exit 1
fi
./build/link_static

printf '\nc: OK\n'
