#!/usr/bin/env bash
# Builds everything and runs every test suite: Rust core, C ABI (+ sanitizers, valgrind),
# Python (+ SQLite, CLI, real Redis), Go (+ race detector, real Redis, interop), C++
# (+ ASan/UBSan, TSan, real Redis), cross-language contention (Python, Go and C++ processes on
# one lock), packaging (wheel, sdist, installs and examples as an outside user builds them) and
# smoke fuzzing. Installs what it needs.
# Exits non-zero if any suite fails; the summary at the end says which.
set -uo pipefail
cd "$(dirname "$0")/.."

bash scripts/ensure-deps.sh || exit 1

# The binding suites build target/release with --features testing (the test hooks); the
# cross-language and packaging suites build it without (what users get). In this order the
# crate is rebuilt once.
suites=(
    scripts/test-rust.sh
    bindings/c/test.sh
    bindings/python/test.sh
    bindings/go/test.sh
    bindings/cpp/test.sh
    scripts/test-crosslang.sh
    scripts/test-histories.sh
    scripts/test-packaging.sh
    fuzz/smoke.sh
)
# Each suite's output is also kept in target/test-logs, so that the summary can repeat what a
# failing suite said where a reader of only the end of the output will see it.
logs=target/test-logs
mkdir -p "$logs"
passed=0
failed=0
summary=()
failures=()
for suite in "${suites[@]}"; do
    echo
    echo "=================== $suite ==================="
    start=$(date +%s)
    log="$logs/$(echo "$suite" | tr '/' '_').log"
    if bash "$suite" 2>&1 | tee "$log"; then
        passed=$((passed + 1))
        summary+=("PASS  $suite  ($(( $(date +%s) - start ))s)")
    else
        failed=$((failed + 1))
        summary+=("FAIL  $suite  ($(( $(date +%s) - start ))s)")
        failures+=("$log")
    fi
done
# The lines that say what failed come last, just above the summary: a reader of only the end
# of the output sees them.
for log in "${failures[@]}"; do
    echo
    echo "=================== failed: $log ==================="
    echo "--- last lines ---"
    tail -10 "$log"
    echo "--- what failed ---"
    grep -n -E "FAIL|panicked|error(\[|:)|Error|assert|Traceback|--- FAIL" "$log" | tail -15
done
echo
echo "=================== summary ==================="
printf '%s\n' "${summary[@]}"
echo "suites: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
