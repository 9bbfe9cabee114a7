#!/usr/bin/env bash
# Smoke test of the leasehold fuzz targets (fuzz/README.md):
#  1. installs cargo-fuzz if missing (cargo install --locked cargo-fuzz);
#  2. replays the committed corpus and the crash regressions on stable Rust, without
#     libFuzzer (cargo test: the same decode + oracle code as the fuzz targets);
#  3. runs each target under libFuzzer on stable (`-s none`, no sanitizer) for
#     LEASEHOLD_FUZZ_SECONDS seconds (default 10). Any crash, panic, leak of the oracle or
#     timeout fails the script; the crashing input is in fuzz/artifacts/<target>/.
# New inputs libFuzzer finds go to a temporary directory, never into fuzz/corpus.
set -euo pipefail
cd "$(dirname "$0")"

seconds="${LEASEHOLD_FUZZ_SECONDS:-10}"
targets=(client_ops ffi sim redis_protocol resp)

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "smoke.sh: installing cargo-fuzz" >&2
    cargo install --locked cargo-fuzz
fi

echo "== replaying fuzz/corpus and fuzz/regressions on stable (cargo test)"
cargo test

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for t in "${targets[@]}"; do
    echo "== cargo fuzz run -s none $t (${seconds}s)"
    mkdir -p "$work/$t"
    # First corpus directory receives new inputs; the committed one is read only.
    if ! cargo fuzz run -s none "$t" "$work/$t" "corpus/$t" -- \
        -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1; then
        echo "smoke.sh: target $t FAILED; crashing input in fuzz/artifacts/$t/" >&2
        echo "  reproduce: cargo fuzz run -s none $t fuzz/artifacts/$t/<file>" >&2
        echo "  or on stable: cargo run --example show $t fuzz/artifacts/$t/<file>" >&2
        exit 1
    fi
done
echo "smoke.sh: all targets ran ${seconds}s without a crash"
