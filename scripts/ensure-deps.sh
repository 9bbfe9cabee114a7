#!/usr/bin/env bash
# Installs what the build and the test suites need and is missing. Idempotent; safe to re-run.
# Debian packages need root (CI runs as root); elsewhere it says what to install and fails.
set -euo pipefail

need_apt=()
have() { command -v "$1" >/dev/null 2>&1; }

have cc || need_apt+=(gcc)
have c++ || need_apt+=(g++)
have make || need_apt+=(make)
have cmake || need_apt+=(cmake)
have pkg-config || need_apt+=(pkg-config)
have valgrind || need_apt+=(valgrind)
have redis-server || need_apt+=(redis-server)
[ -f /usr/include/hiredis/hiredis.h ] || need_apt+=(libhiredis-dev)
{ [ -f /usr/include/gtest/gtest.h ] && compgen -G "/usr/lib/*/libgtest.a" >/dev/null; } || need_apt+=(libgtest-dev googletest)

if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        echo "ensure-deps: installing ${need_apt[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq "${need_apt[@]}" >/dev/null
    else
        echo "ensure-deps: missing ${need_apt[*]}; install them with apt-get (needs root)" >&2
        exit 1
    fi
fi

have cargo || { echo "ensure-deps: Rust (cargo) is required: https://rustup.rs" >&2; exit 1; }
have python3 || { echo "ensure-deps: python3 (3.11+) is required" >&2; exit 1; }

# cbindgen is pinned: the committed header must be byte-identical to what it generates.
CBINDGEN_VERSION=0.29.0
if ! cbindgen --version 2>/dev/null | grep -q "$CBINDGEN_VERSION"; then
    cargo install --locked "cbindgen@$CBINDGEN_VERSION"
fi
