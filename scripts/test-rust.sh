#!/usr/bin/env bash
# The Rust core: formatting, lints (including the ban on clock reads), unit/integration/doc
# tests, the simulator's seeds and the property tests.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all --check
cargo clippy --all-targets --all-features -- -D warnings
# Release mode: the simulator runs 10,000+ seeds and should take well under a minute.
cargo test --release --all-features
