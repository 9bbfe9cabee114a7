#!/usr/bin/env bash
# The Rust core: formatting, lints (including the ban on clock reads), unit/integration/doc
# tests, the simulator's seeds and the property tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# tests/redis_server.rs runs the Redis protocol against a real redis-server.
bash scripts/ensure-redis.sh
# tests/sql_postgres.rs starts throw-away PostgreSQL clusters (scripts/pg-test-server.sh).
bash scripts/ensure-postgres.sh
# tests/etcd_server.rs starts throw-away 3-member etcd clusters (scripts/etcd-test-cluster.sh).
bash scripts/ensure-etcd.sh
cargo fmt --all --check
cargo clippy --all-targets --all-features -- -D warnings
# Cargo.toml optimises the crate in the test profile but keeps debug assertions and
# overflow checks, so the simulator's 10,000+ seeds run in well under a minute.
cargo test --all-features
# Public items carry doc comments; broken or private intra-doc links fail here, not on docs.rs.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --all-features
