"""Builds the Rust core (the crate at the repository root) into the package as
``leasehold/_lib/libleasehold.so`` with setuptools-rust, so a wheel or ``pip install`` carries
the library that ``leasehold._ffi`` loads with ctypes. Metadata lives in pyproject.toml.

The crate is found at ``rust/`` (inside an sdist, which carries a copy) or at ``../..`` (a
checkout). Cargo builds into ``<crate>/target/python`` unless ``CARGO_TARGET_DIR`` is set, so a
package build never replaces the ``target/release`` library that development tools load.

``LEASEHOLD_SKIP_RUST_BUILD=1`` installs the Python code alone; the development venv uses it
(``setup-venv.sh``) and loads ``target/release`` through ``LEASEHOLD_LIBRARY`` instead.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.sdist import sdist
from setuptools_rust import Binding, RustExtension, Strip

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
LIB_MODULE = "leasehold._lib.libleasehold"

# What the crate needs to build, relative to its root; copied into the sdist as rust/.
# Cargo.toml names the benches and the example, so their sources must be present too.
CRATE_FILES = ["Cargo.toml", "Cargo.lock", "build.rs", "README.md", "LICENSE-MIT", "LICENSE-APACHE"]
CRATE_DIRS = ["src", "benches"]
CRATE_GLOBS = ["examples/*.rs"]


def crate_dir() -> Path:
    for candidate in (HERE / "rust", HERE.parent.parent):
        if (candidate / "Cargo.toml").is_file() and (candidate / "src" / "ffi").is_dir():
            return candidate
    raise SystemExit(
        "leasehold: the Rust crate was not found (expected rust/Cargo.toml in an sdist or "
        f"../../Cargo.toml in a checkout, from {HERE})"
    )


def lib_filename() -> str:
    if sys.platform == "darwin":
        return "libleasehold.dylib"
    if sys.platform == "win32":
        return "leasehold.dll"
    return "libleasehold.so"


class BuildExt(build_ext):
    """Names the library as the C toolchain does (``libleasehold.so``), not as a Python
    extension module (``*.cpython-311-*.so``): it is loaded by ctypes and fits any Python 3."""

    def get_ext_filename(self, fullname: str) -> str:
        # get_ext_fullpath asks with the last component only.
        parts = fullname.split(".")
        if parts[-1] == LIB_MODULE.rsplit(".", 1)[-1]:
            return os.path.join(*parts[:-1], lib_filename())
        return super().get_ext_filename(fullname)


class BdistWheel(bdist_wheel):
    """Tags the wheel ``py3-none-<platform>``: the library has no Python ABI, only a C one."""

    def get_tag(self) -> tuple[str, str, str]:
        _, _, plat = super().get_tag()
        return "py3", "none", plat


class Sdist(sdist):
    """Carries the crate sources in ``rust/`` so the sdist builds outside the repository."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        src = crate_dir()
        dest = Path(base_dir) / "rust"
        for name in CRATE_FILES:
            if (src / name).is_file():
                dest.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / name, dest / name)
        for name in CRATE_DIRS:
            shutil.copytree(src / name, dest / name, dirs_exist_ok=True)
        for pattern in CRATE_GLOBS:
            for path in src.glob(pattern):
                target = dest / path.relative_to(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)


def rust_extensions() -> list[RustExtension]:
    if os.environ.get("LEASEHOLD_SKIP_RUST_BUILD") == "1":
        return []
    crate = crate_dir()
    target_dir = os.environ.get("CARGO_TARGET_DIR") or str(crate / "target" / "python")
    return [
        RustExtension(
            LIB_MODULE,
            path=str(crate / "Cargo.toml"),
            binding=Binding.NoBinding,
            strip=Strip.All,
            # Link-time stripping drops the debug info the release profile keeps for benchmarks.
            rustc_flags=["-C", "strip=symbols"],
            args=["--locked", "--target-dir", target_dir],
        )
    ]


setup(
    rust_extensions=rust_extensions(),
    cmdclass={"build_ext": BuildExt, "bdist_wheel": BdistWheel, "sdist": Sdist},
    zip_safe=False,
)
