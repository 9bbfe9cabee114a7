#!/usr/bin/env bash
# Installs leasehold for C, C++ and Go: the C header and the C++ headers, the shared and static
# library, the CMake package (leaseholdConfig.cmake) and the pkg-config files.
#
#   scripts/install-lib.sh [PREFIX]          # default PREFIX=/usr/local
#
# After installing into a prefix that pkg-config searches (/usr/local and /usr are):
#   cc app.c $(pkg-config --cflags --libs leasehold)          # links libleasehold.so
#   cc app.c $(pkg-config --cflags --libs leasehold-static)   # links libleasehold.a
#   find_package(leasehold 0.1 CONFIG REQUIRED)               # CMake
# For another prefix: export PKG_CONFIG_PATH=PREFIX/lib/pkgconfig, CMAKE_PREFIX_PATH=PREFIX (and,
# for the shared library at run time, LD_LIBRARY_PATH=PREFIX/lib or -Wl,-rpath,PREFIX/lib).
#
# Builds the release library first (cargo build --release) unless LEASEHOLD_NO_BUILD=1. The
# layout is defined once, by the install rules of bindings/cpp (cmake --install).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

PREFIX="${1:-${PREFIX:-/usr/local}}"
command -v cmake >/dev/null || { echo "install-lib: cmake is required (apt-get install cmake)" >&2; exit 1; }

if [[ "${LEASEHOLD_NO_BUILD:-0}" != 1 ]]; then
    cargo build --release --quiet
fi
for f in target/release/libleasehold.so target/release/libleasehold.a include/leasehold.h; do
    [[ -f "$f" ]] || { echo "install-lib: missing $f (cargo build --release)" >&2; exit 1; }
done

build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
# GNUInstallDirs would pick lib/<multiarch> for /usr; keep one lib/ for every prefix.
cmake -S bindings/cpp -B "$build" -DLEASEHOLD_ROOT="$root" -DLEASEHOLD_BUILD_TESTS=OFF \
    -DLEASEHOLD_INSTALL=ON -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_INSTALL_PREFIX="$PREFIX" >/dev/null
cmake --install "$build" >/dev/null

if [[ $EUID -eq 0 && "$PREFIX" == /usr/local ]] && command -v ldconfig >/dev/null; then
    ldconfig || true
fi
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
echo "install-lib: installed leasehold $VERSION into $PREFIX"
echo "  cc app.c \$(pkg-config --cflags --libs leasehold)          # shared"
echo "  cc app.c \$(pkg-config --cflags --libs leasehold-static)   # static"
echo "  find_package(leasehold 0.1 CONFIG REQUIRED)               # CMake (CMAKE_PREFIX_PATH=$PREFIX)"
