"""The ctypes mirrors of the C structs match include/leasehold.h (sizes and offsets), and so
do the constants Python must size buffers with (the ABI version, the wake channel's random
bytes: a smaller mirror would let the library read past a Python buffer).

Compiles a tiny C program against the header with the system C compiler (present wherever
the Rust library is built) and compares its sizeof/offsetof output with ctypes.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from leasehold import _ffi

HEADER_DIR = Path(__file__).resolve().parents[4] / "include"
STRUCTS = {
    "lh_config": _ffi.lh_config,
    "lh_acquire_options": _ffi.lh_acquire_options,
    "lh_output": _ffi.lh_output,
    "lh_lease_info": _ffi.lh_lease_info,
    "lh_counters": _ffi.lh_counters,
    "lh_value": _ffi.lh_value,
    "lh_sql_options": _ffi.lh_sql_options,
    "lh_sql_statement": _ffi.lh_sql_statement,
    "lh_sql_request": _ffi.lh_sql_request,
    "lh_sql_status": _ffi.lh_sql_status,
    "lh_etcd_options": _ffi.lh_etcd_options,
    "lh_http_request": _ffi.lh_http_request,
    "lh_etcd_counters": _ffi.lh_etcd_counters,
    # the memory service
    "lh_memory_config": _ffi.lh_memory_config,
    "lh_memory_faults": _ffi.lh_memory_faults,
    "lh_memory_result": _ffi.lh_memory_result,
    "lh_memory_status": _ffi.lh_memory_status,
    "lh_memory_stats": _ffi.lh_memory_stats,
}


def _cc() -> str | None:
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.mark.skipif(not (HEADER_DIR / "leasehold.h").is_file(), reason="header not in this checkout")
def test_struct_layouts_match_header(tmp_path: Path) -> None:
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
    lines += ["  return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", f"-I{HEADER_DIR}", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    assert [line for line in out if line] == expected
