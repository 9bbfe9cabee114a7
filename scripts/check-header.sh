#!/usr/bin/env bash
# Verifies that include/leasehold.h is exactly what cbindgen generates from src/ffi/.
# Regenerates into a temporary file and diffs it against the committed header; any
# difference fails (exit 1) with the diff. `--write` updates the committed header instead.
# Installs the pinned cbindgen with `cargo install --locked` when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

CBINDGEN_VERSION=0.29.0
export PATH="$HOME/.cargo/bin:$PATH"
if ! cbindgen --version 2>/dev/null | grep -qx "cbindgen $CBINDGEN_VERSION"; then
    echo "check-header: installing cbindgen $CBINDGEN_VERSION" >&2
    cargo install --locked "cbindgen@$CBINDGEN_VERSION"
fi

generate() {
    # Source-file mode: only src/ffi/ is parsed, so core items never reach the header.
    cbindgen --quiet --config cbindgen.toml --output "$1" src/ffi/mod.rs
}

if [[ "${1:-}" == "--write" ]]; then
    generate include/leasehold.h
    echo "check-header: wrote include/leasehold.h"
    exit 0
fi

tmp="$(mktemp)"
crate="$(mktemp)"
trap 'rm -f "$tmp" "$crate"' EXIT
generate "$tmp"
if ! diff -u include/leasehold.h "$tmp"; then
    echo "check-header: include/leasehold.h is stale; run scripts/check-header.sh --write and commit" >&2
    exit 1
fi
# The conventional whole-crate invocation must give the same bytes (cbindgen.toml excludes
# the core's own constants), so whichever way a reader regenerates, the header matches.
cbindgen --quiet --config cbindgen.toml --crate leasehold --output "$crate"
if ! diff -u include/leasehold.h "$crate"; then
    echo "check-header: 'cbindgen --crate leasehold' differs; extend [export] exclude in cbindgen.toml" >&2
    exit 1
fi
echo "check-header: include/leasehold.h is up to date"
