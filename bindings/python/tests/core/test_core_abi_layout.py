"""The ctypes mirrors of the C structs match include/leasehold.h (sizes and offsets; every
struct the header defines is mirrored), and so does every integer constant (the ABI version,
the limits Python sizes buffers with, the kinds and flags it passes in).

Compiles a tiny C program against the header with the system C compiler (present wherever
the Rust library is built) and compares its sizeof/offsetof output with ctypes.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from leasehold import _ffi, _ffi_types

HEADER_DIR = Path(__file__).resolve().parents[4] / "include"
STRUCTS = {
    "lh_backend_options": _ffi.lh_backend_options,
    "lh_config": _ffi.lh_config,
    "lh_acquire_options": _ffi.lh_acquire_options,
    "lh_event": _ffi.lh_event,
    "lh_drained": _ffi.lh_drained,
    "lh_lease_info": _ffi.lh_lease_info,
    "lh_counters": _ffi.lh_counters,
    "lh_bytes": _ffi.lh_bytes,
    "lh_sql_statement": _ffi.lh_sql_statement,
    "lh_value": _ffi.lh_value,
    "lh_io_request": _ffi.lh_io_request,
    "lh_lock_status": _ffi.lh_lock_status,
    # the memory service
    "lh_memory_config": _ffi.lh_memory_config,
    "lh_memory_answer": _ffi.lh_memory_answer,
    "lh_memory_status": _ffi.lh_memory_status,
    "lh_memory_faults": _ffi.lh_memory_faults,
    "lh_memory_stats": _ffi.lh_memory_stats,
}


def _cc() -> str | None:
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _header() -> str:
    return (HEADER_DIR / "leasehold.h").read_text()


@pytest.mark.skipif(not (HEADER_DIR / "leasehold.h").is_file(), reason="header not in this checkout")
def test_every_struct_and_constant_of_the_header_is_mirrored() -> None:
    structs = set(re.findall(r"typedef struct (lh_\w+) \{", _header()))
    assert structs == set(STRUCTS)
    defines = set(re.findall(r"#define (LH_\w+) ", _header())) - {"LH_VERSION", "LH_ABI_VERSION"}
    assert sorted(d for d in defines if not hasattr(_ffi_types, d)) == []


def _constants() -> list[str]:
    return [d for d in sorted(set(re.findall(r"#define (LH_\w+) ", _header()))) if hasattr(_ffi_types, d)]


@pytest.mark.skipif(not (HEADER_DIR / "leasehold.h").is_file(), reason="header not in this checkout")
def test_struct_layouts_and_constants_match_header(tmp_path: Path) -> None:
    cc = _cc()
    if cc is None:
        pytest.skip("no C compiler")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "leasehold.h"', "int main(void) {"]
    expected = []
    for cname, cls in STRUCTS.items():
        lines.append(f'  printf("{cname} %zu\\n", sizeof({cname}));')
        expected.append(f"{cname} {ctypes.sizeof(cls)}")
        for fname, _ in cls._fields_:
            lines.append(f'  printf("{cname}.{fname} %zu\\n", offsetof({cname}, {fname}));')
            expected.append(f"{cname}.{fname} {getattr(cls, fname).offset}")
    lines.append('  printf("abi %u\\n", (unsigned)LH_ABI_VERSION);')
    expected.append(f"abi {_ffi.ABI_VERSION}")
    for name in _constants():
        lines.append(f'  printf("{name} %llu\\n", (unsigned long long)({name}));')
        expected.append(f"{name} {getattr(_ffi_types, name)}")
    lines += ["  return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", f"-I{HEADER_DIR}", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    assert [line for line in out if line] == expected
