#!/usr/bin/env bash
# Regenerates the small committed seed corpus in fuzz/corpus/<target>/ from property runs
# (client_ops), differential C ABI runs (ffi) and simulator worlds (sim). Inputs that add no
# new behaviour are not written, so the corpus stays at a few dozen small files.
set -euo pipefail
cd "$(dirname "$0")"
cargo test --release --test gen_corpus -- --ignored --nocapture
ls corpus/*/ | head -100
