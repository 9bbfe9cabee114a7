#!/usr/bin/env bash
# Build and test the C++ binding: the Rust library (with the test hooks, --features testing), then
# two builds of the GoogleTest suite — -fsanitize=address,undefined and -fsanitize=thread (both
# optimised, RelWithDebInfo) — each run with ctest (the suite includes the Redis tests, which start
# their own servers — rediss:// too, with certificates made by openssl — and the C++/Python
# contention test, which uses bindings/python/.venv; the SQLite, PostgreSQL and etcd tests run in
# the asan build and in the opt-in plain one). Every variant must pass. Then the example is linked
# against the shared library and run (its SONAME must resolve), and RedisStreamExecutor's tests are
# built and run with hiredis, OpenSSL and SQLite left out (CMAKE_DISABLE_FIND_PACKAGE_*): Redis
# needs none of them, and rediss:// / sqlite: URLs are refused with the reason.
#
#   bindings/cpp/test.sh                 # asan and tsan (the test command's default)
#   VARIANTS="plain" bindings/cpp/test.sh # no sanitizer: the quickest loop while editing
#   VARIANTS="plain asan tsan" bindings/cpp/test.sh
#   JOBS=1 bindings/cpp/test.sh           # build parallelism (default 2)
# Build trees live in bindings/cpp/build/<variant> and are reused (incremental).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# The plain build runs the same tests as asan with less checking, so it is opt-in: the whole
# test command has a 30-minute budget.
VARIANTS="${VARIANTS:-asan tsan}"
JOBS="${JOBS:-2}"

log() { printf '== cpp: %s\n' "$*"; }

# --- dependencies (idempotent; apt-get only when something is missing and we are root) -----
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v readelf >/dev/null 2>&1 || need+=(binutils)
[ -f /usr/include/hiredis/hiredis.h ] || need+=(libhiredis-dev)
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
# rediss:// on RedisStreamExecutor, and the test's certificates.
[ -f /usr/include/openssl/ssl.h ] || need+=(libssl-dev)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# The SQLite, PostgreSQL and etcd executors (their tests fail under CI=true without them).
[ -f /usr/include/sqlite3.h ] || need+=(libsqlite3-dev)
[ -f /usr/include/postgresql/libpq-fe.h ] || need+=(libpq-dev)
[ -f /usr/include/x86_64-linux-gnu/curl/curl.h ] || [ -f /usr/include/curl/curl.h ] \
    || compgen -G "/usr/include/*/curl/curl.h" >/dev/null || need+=(libcurl4-openssl-dev)
if [ "${#need[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing ${need[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
    else
        echo "cpp: missing ${need[*]} (install them, e.g. apt-get install ${need[*]})" >&2
        exit 1
    fi
fi
if ! command -v redis-server >/dev/null 2>&1 && [ ! -x /usr/bin/redis-server ]; then
    if [ -x "$root/scripts/ensure-redis.sh" ]; then
        "$root/scripts/ensure-redis.sh" || true
    elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server || true
    fi
    # Still missing: the Redis tests skip, or fail under CI=true.
fi

# --- the Rust library --------------------------------------------------------------------------
# --features testing: the tests drive the memory service's fault switches and the panic hook.
log "cargo build --release --features testing"
(cd "$root" && cargo build --release --features testing --quiet)

# --- Python environment for the contention test (the test fails under CI=true without it) ----
if [ -x "$root/bindings/python/setup-venv.sh" ] || [ -f "$root/bindings/python/setup-venv.sh" ]; then
    log "bindings/python/setup-venv.sh"
    bash "$root/bindings/python/setup-venv.sh" || echo "cpp: warning: setup-venv.sh failed; the C++/Python test will not run" >&2
fi

# --- build and run each variant ----------------------------------------------------------------
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
failed=()
for v in $VARIANTS; do
    # The SQLite, PostgreSQL and etcd tests run in the plain and the asan builds (each real-server
    # suite once per run of the default variants, never skipped by them).
    servers=OFF
    case "$v" in
        plain) san="" ;;
        asan) san="address,undefined" servers=ON ;;
        tsan) san="thread" ;;
        *) echo "cpp: unknown variant $v" >&2; exit 2 ;;
    esac
    bdir="$here/build/$v"
    log "[$v] configure + build (sanitize='${san}')"
    cmake -S "$here" -B "$bdir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLEASEHOLD_SANITIZE="$san" \
        -DLEASEHOLD_SERVER_TESTS_ALL="$servers" -DLEASEHOLD_ROOT="$root" >/dev/null
    cmake --build "$bdir" -j "$JOBS"
    log "[$v] ctest"
    if ! ctest --test-dir "$bdir" --output-on-failure --timeout 300; then
        # Named again at the end: the variants after this one push ctest's own list far up.
        failed+=("$v (FAILED tests: $(tr '\n' ' ' 2>/dev/null < "$bdir/Testing/Temporary/LastTestsFailed.log" || true))")
    fi
done

# --- the shared library: the example linked against libleasehold.so records its SONAME
# (libleasehold.so.<ABI>), which must resolve through the repository build's symlink ----------
sdir="$here/build/shared"
log "[shared] configure + build the example against libleasehold.so"
cmake -S "$here" -B "$sdir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLEASEHOLD_STATIC=OFF \
    -DLEASEHOLD_ROOT="$root" >/dev/null
cmake --build "$sdir" --target leasehold_example -j "$JOBS"
if ! readelf -d "$sdir/leasehold_example" | grep -q 'NEEDED.*\[libleasehold\.so\.[0-9][0-9]*\]'; then
    echo "cpp: the shared example does not record libleasehold.so.<ABI>" >&2
    failed+=(shared)
elif ! "$sdir/leasehold_example" >/dev/null; then
    failed+=(shared)
fi

# --- Redis without hiredis or OpenSSL (and SQLite, for open.hpp's refusal): the stream tests --
ndir="$here/build/nodeps"
log "[nodeps] configure + build the stream tests without hiredis, OpenSSL and SQLite"
cmake -S "$here" -B "$ndir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLEASEHOLD_ROOT="$root" \
    -DCMAKE_DISABLE_FIND_PACKAGE_hiredis=ON -DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=ON \
    -DCMAKE_DISABLE_FIND_PACKAGE_SQLite3=ON >/dev/null
cmake --build "$ndir" --target leasehold_redis_stream_tests leasehold_names_tests -j "$JOBS"
if readelf -d "$ndir/leasehold_redis_stream_tests" | grep -Eq 'NEEDED.*(hiredis|libssl|sqlite)'; then
    echo "cpp: the nodeps stream tests link hiredis, libssl or sqlite" >&2
    failed+=(nodeps)
elif ! "$ndir/leasehold_redis_stream_tests" || ! "$ndir/leasehold_names_tests"; then
    failed+=(nodeps)
fi

if [ "${#failed[@]}" -gt 0 ]; then
    echo "cpp: FAILED variants: ${failed[*]}" >&2
    exit 1
fi
log "all variants passed: $VARIANTS, the example linked against the shared library, and nodeps"
