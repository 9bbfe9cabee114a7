#!/usr/bin/env bash
# Installs the leasehold C library: header, shared and static library, pkg-config files.
#
#   scripts/install-lib.sh [PREFIX]          # default PREFIX=/usr/local
#
# After installing into a prefix that pkg-config searches (/usr/local and /usr are):
#   cc app.c $(pkg-config --cflags --libs leasehold)          # links libleasehold.so
#   cc app.c $(pkg-config --cflags --libs leasehold-static)   # links libleasehold.a
# For another prefix: export PKG_CONFIG_PATH=PREFIX/lib/pkgconfig (and, for the shared
# library at run time, LD_LIBRARY_PATH=PREFIX/lib or -Wl,-rpath,PREFIX/lib).
#
# Builds the release library first (cargo build --release) unless LEASEHOLD_NO_BUILD=1.
set -euo pipefail
cd "$(dirname "$0")/.."

PREFIX="${1:-${PREFIX:-/usr/local}}"
LIBDIR="$PREFIX/lib"
INCLUDEDIR="$PREFIX/include"
PCDIR="$LIBDIR/pkgconfig"
# Native libraries a Rust staticlib needs on Linux (cargo rustc -- --print native-static-libs).
NATIVE_LIBS="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"

if [[ "${LEASEHOLD_NO_BUILD:-0}" != 1 ]]; then
    cargo build --release --quiet
fi
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
[[ -n "$VERSION" ]] || { echo "install-lib: no version in Cargo.toml" >&2; exit 1; }
for f in target/release/libleasehold.so target/release/libleasehold.a include/leasehold.h; do
    [[ -f "$f" ]] || { echo "install-lib: missing $f (cargo build --release)" >&2; exit 1; }
done
# The shared library's SONAME is libleasehold.so.<ABI> (build.rs): installed as
# libleasehold.so.<version>, with libleasehold.so.<ABI> (what programs load) and
# libleasehold.so (what -lleasehold finds) pointing at it.
ABI="$(sed -n 's/^#define LH_ABI_VERSION \([0-9][0-9]*\)$/\1/p' include/leasehold.h)"
[[ -n "$ABI" ]] || { echo "install-lib: no LH_ABI_VERSION in include/leasehold.h" >&2; exit 1; }

install -d "$LIBDIR" "$INCLUDEDIR" "$PCDIR"
install -m 0644 include/leasehold.h "$INCLUDEDIR/leasehold.h"
rm -f "$LIBDIR/libleasehold.so" "$LIBDIR/libleasehold.so.$ABI"
install -m 0755 target/release/libleasehold.so "$LIBDIR/libleasehold.so.$VERSION"
ln -s "libleasehold.so.$VERSION" "$LIBDIR/libleasehold.so.$ABI"
ln -s "libleasehold.so.$ABI" "$LIBDIR/libleasehold.so"
install -m 0644 target/release/libleasehold.a "$LIBDIR/libleasehold.a"

render() { # name flavour libs
    sed -e "s|@PREFIX@|$PREFIX|" -e "s|@LIBDIR@|$LIBDIR|" -e "s|@INCLUDEDIR@|$INCLUDEDIR|" \
        -e "s|@NAME@|$1|" -e "s|@FLAVOUR@|$2|" -e "s|@VERSION@|$VERSION|" \
        -e "s|@LIBS@|$3|" -e "s|@NATIVE_LIBS@|$NATIVE_LIBS|" leasehold.pc.in
}
render leasehold shared "-L\${libdir} -lleasehold" >"$PCDIR/leasehold.pc"
render leasehold-static static "\${libdir}/libleasehold.a $NATIVE_LIBS" >"$PCDIR/leasehold-static.pc"

if [[ $EUID -eq 0 && "$PREFIX" == /usr/local ]] && command -v ldconfig >/dev/null; then
    ldconfig || true
fi
echo "install-lib: installed leasehold $VERSION into $PREFIX"
echo "  cc app.c \$(pkg-config --cflags --libs leasehold)          # shared"
echo "  cc app.c \$(pkg-config --cflags --libs leasehold-static)   # static"
