"""ctypes declarations of the leasehold C ABI (include/leasehold.h).

The library is located in this order:

1. ``$LEASEHOLD_LIBRARY`` (a full path to the shared library): an override that always wins;
2. the copy built into the package (``leasehold/_lib/libleasehold.so``: wheels and
   ``pip install`` carry it);
3. the repository's build output (``<repo>/target/release``, then ``target/debug``), for a
   checkout installed with ``LEASEHOLD_SKIP_RUST_BUILD=1`` (the development venv).

At import the ABI version (``lh_abi_version()``) is compared with :data:`ABI_VERSION`; a
mismatch raises :class:`~leasehold.errors.LibraryError` with both numbers and the path.

The constants and struct mirrors are in :mod:`leasehold._ffi_types` (re-exported here).
Every fallible function is declared once in :data:`_SIGNATURES` with ``argtypes``/``restype``
and an ``errcheck`` that turns a non-zero ``lh_status`` into a typed exception carrying the
status name and the handle's detail message (``lh_client_last_error``, or
``lh_memory_service_last_error`` for a memory-service call).

The test hooks (:data:`TESTING_HOOKS`) exist only in a library built with ``cargo build
--features testing``; they are looked up when called (:func:`hook`), so a release library loads
and only a call to one raises :class:`~leasehold.errors.LibraryError`.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import Any

from . import errors
from ._ffi_types import *  # noqa: F403 - the constants and structs, re-exported
from ._ffi_types import (
    ABI_VERSION,
    LH_ERR_BACKEND_DATA_TOO_LONG,
    LH_ERR_BUFFER_TOO_SMALL,
    LH_ERR_EMPTY_NAME,
    LH_ERR_INVALID_CONFIG,
    LH_ERR_INVALID_ENUM,
    LH_ERR_INVALID_REPLY,
    LH_ERR_INVALID_TOKEN,
    LH_ERR_INVALID_TTL,
    LH_ERR_INVALID_UTF8,
    LH_ERR_LEASE_ENDED,
    LH_ERR_NAME_HAS_NUL,
    LH_ERR_NAME_TOO_LONG,
    LH_ERR_NOT_GRANTED,
    LH_ERR_NULL_ARGUMENT,
    LH_ERR_PANIC,
    LH_ERR_POISONED,
    LH_ERR_SEED_TOO_SHORT,
    LH_ERR_STRUCT_SIZE,
    LH_ERR_TOO_MANY_LEASES,
    LH_ERR_UNKNOWN_LEASE,
    LH_ERR_WRONG_ANSWER,
    LH_OK,
    lh_acquire_options,
    lh_backend_options,
    lh_bytes,
    lh_client_p,
    lh_config,
    lh_counters,
    lh_drained,
    lh_event,
    lh_io_request,
    lh_lease_info,
    lh_lock_status,
    lh_memory_answer,
    lh_memory_config,
    lh_memory_faults,
    lh_memory_service_p,
    lh_memory_stats,
    lh_memory_status,
)

# ---- loading ---------------------------------------------------------------------------------
def _lib_filenames() -> list[str]:
    if sys.platform == "darwin":
        return ["libleasehold.dylib"]
    if sys.platform == "win32":
        return ["leasehold.dll", "libleasehold.dll"]
    return ["libleasehold.so"]


def candidate_paths() -> list[Path]:
    """The places searched for the shared library, in order (the env override first)."""
    out: list[Path] = []
    env = os.environ.get("LEASEHOLD_LIBRARY")
    if env:
        out.append(Path(env))
    pkg = Path(__file__).resolve().parent
    for fn in _lib_filenames():
        out.append(pkg / "_lib" / fn)
    # bindings/python/leasehold/_ffi.py -> repo root is three levels above the package dir.
    repo = pkg.parent.parent.parent
    for profile in ("release", "debug"):
        for fn in _lib_filenames():
            out.append(repo / "target" / profile / fn)
    return out


def _load() -> tuple[ctypes.CDLL, Path]:
    # PyDLL: calls keep the GIL. Every lh_* function is a short, non-blocking, sans-IO call that
    # never calls back into Python, so releasing and re-taking the GIL around each one (CDLL)
    # only costs a GIL hand-off per call -- with the driver and IO threads running, a call could
    # wait for another thread's switch interval just to get the GIL back.
    env = os.environ.get("LEASEHOLD_LIBRARY")
    if env:
        path = Path(env)
        if not path.is_file():
            raise errors.LibraryError(f"LEASEHOLD_LIBRARY={env!r} does not name a file")
        try:
            return ctypes.PyDLL(str(path)), path
        except OSError as e:
            raise errors.LibraryError(f"cannot load LEASEHOLD_LIBRARY={env!r}: {e}") from e
    tried = candidate_paths()
    for path in tried:
        if path.is_file():
            try:
                return ctypes.PyDLL(str(path)), path
            except OSError as e:
                raise errors.LibraryError(f"cannot load the leasehold library at {path}: {e}") from e
    listing = "\n  ".join(str(p) for p in tried)
    raise errors.LibraryError(
        "the leasehold shared library was not found. Install the package from a wheel or with "
        "`pip install` (both build the library in), or build it with `cargo build --release` at "
        "the repository root, or set LEASEHOLD_LIBRARY to its full path. Searched:\n  " + listing
    )


lib, library_path = _load()

# ---- status names and errcheck ---------------------------------------------------------------
lib.lh_status_str.argtypes = [ctypes.c_uint32]
lib.lh_status_str.restype = ctypes.c_char_p
lib.lh_client_last_error.argtypes = [lh_client_p]
lib.lh_client_last_error.restype = ctypes.c_char_p
lib.lh_abi_version.argtypes = []
lib.lh_abi_version.restype = ctypes.c_uint32
lib.lh_version.argtypes = []
lib.lh_version.restype = ctypes.c_char_p

_STATUS_CLASSES: dict[int, type[errors.CoreError]] = {
    LH_ERR_NULL_ARGUMENT: errors.InvalidArgument,
    LH_ERR_INVALID_UTF8: errors.InvalidArgument,
    LH_ERR_EMPTY_NAME: errors.InvalidArgument,
    LH_ERR_NAME_TOO_LONG: errors.InvalidArgument,
    LH_ERR_NAME_HAS_NUL: errors.InvalidArgument,
    LH_ERR_INVALID_TTL: errors.InvalidArgument,
    LH_ERR_INVALID_CONFIG: errors.InvalidArgument,
    LH_ERR_SEED_TOO_SHORT: errors.InvalidArgument,
    LH_ERR_UNKNOWN_LEASE: errors.UnknownLease,
    LH_ERR_LEASE_ENDED: errors.LeaseEnded,
    LH_ERR_TOO_MANY_LEASES: errors.TooManyLeases,
    LH_ERR_INVALID_ENUM: errors.InvalidArgument,
    LH_ERR_BACKEND_DATA_TOO_LONG: errors.InvalidArgument,
    LH_ERR_BUFFER_TOO_SMALL: errors.InvalidArgument,
    LH_ERR_NOT_GRANTED: errors.NotGranted,
    LH_ERR_STRUCT_SIZE: errors.InvalidArgument,
    LH_ERR_INVALID_REPLY: errors.InvalidArgument,
    LH_ERR_INVALID_TOKEN: errors.InvalidArgument,
    LH_ERR_WRONG_ANSWER: errors.InvalidArgument,
    LH_ERR_PANIC: errors.CorePanic,
    LH_ERR_POISONED: errors.CorePoisoned,
}


def status_name(status: int) -> str:
    """The symbolic name of an ``lh_status`` (``"LH_ERR_EMPTY_NAME"``, ...)."""
    raw = lib.lh_status_str(status)
    return raw.decode("ascii", "replace") if raw else f"LH_STATUS_{status}"


def make_error(status: int, detail: str = "", function: str = "") -> errors.CoreError:
    """Build the typed exception for a non-zero status."""
    cls = _STATUS_CLASSES.get(status, errors.CoreError)
    return cls(status, status_name(status), detail, function)


def _errcheck(result: int, func: Any, args: tuple[Any, ...]) -> int:
    if result == LH_OK:
        return result
    detail = ""
    if args and isinstance(args[0], lh_client_p) and args[0]:
        raw = lib.lh_client_last_error(args[0])
        if raw:
            detail = raw.decode("utf-8", "replace")
    raise make_error(result, detail, getattr(func, "__name__", ""))


def _memory_errcheck(result: int, func: Any, args: tuple[Any, ...]) -> int:
    if result == LH_OK:
        return result
    detail = ""
    if args and args[0]:
        raw = lib.lh_memory_service_last_error(args[0])
        if raw:
            detail = raw.decode("utf-8", "replace")
    raise make_error(result, detail, getattr(func, "__name__", ""))


_u8p = ctypes.POINTER(ctypes.c_uint8)
_u64 = ctypes.c_uint64
_u32 = ctypes.c_uint32
_sz = ctypes.c_size_t
# Byte-buffer inputs with an explicit length (names, answers, messages): declared char* so
# Python `bytes` pass straight through (same ABI as const uint8_t*; the length, not a NUL,
# bounds them). A packed lh_value list crosses the same way (see leasehold._values).
_cp = ctypes.c_char_p
_P = ctypes.POINTER

# Exported only by a library built with `--features testing` (the test suites build it);
# release builds (wheels, `pip install`, scripts/install-lib.sh) leave them out.
TESTING_HOOKS = frozenset(
    {
        "lh_client_debug_panic",
        "lh_memory_service_debug_panic",
        "lh_memory_service_set_faults",
        "lh_memory_service_get_faults",
        "lh_memory_service_step_clock",
        "lh_memory_service_forget",
    }
)


def has_hook(name: str) -> bool:
    """Whether the loaded library exports the test hook ``name`` (built with ``testing``)."""
    return getattr(lib, name, None) is not None


def hook(name: str) -> Any:
    """The test hook ``name``, declared; :class:`~leasehold.errors.LibraryError` if the loaded
    library was built without the ``testing`` feature."""
    fn = getattr(lib, name, None)
    if fn is None:
        raise errors.LibraryError(
            f"this libleasehold ({library_path}) was built without the `testing` feature: {name} "
            "is a test hook (build the library with `cargo build --release --features testing`)"
        )
    return fn


# name: (argtypes, restype, checked). Functions on an lh_client report its last error;
# those on an lh_memory_service, the service's (see _declare).
_SIGNATURES: dict[str, tuple[list[Any], Any, bool]] = {
    "lh_config_default": ([_P(lh_config)], None, False),
    "lh_acquire_options_default": ([_P(lh_acquire_options)], None, False),
    "lh_backend_options_default": ([_u32, _P(lh_backend_options)], _u32, True),
    "lh_client_new": (
        [_P(lh_config), _P(lh_backend_options), _u8p, _sz, _P(lh_client_p)],
        _u32,
        True,
    ),
    # Unchecked: its status is the verdict on the arguments (see client_new_reason).
    "lh_client_new_check": (
        [_P(lh_config), _P(lh_backend_options), _u8p, _sz, ctypes.c_char_p, _sz, _P(_sz)],
        _u32,
        False,
    ),
    "lh_client_free": ([lh_client_p], None, False),
    "lh_client_reseed": ([lh_client_p, _u8p, _sz], _u32, True),
    "lh_acquire": ([lh_client_p, _u64, _cp, _sz, _P(lh_acquire_options), _P(_u64)], _u32, True),
    "lh_release": ([lh_client_p, _u64, _u64, _P(_u32)], _u32, True),
    "lh_renew": ([lh_client_p, _u64, _u64], _u32, True),
    "lh_timeout": ([lh_client_p, _u64], _u32, True),
    "lh_poll_event": ([lh_client_p, _P(lh_event)], _u32, True),
    "lh_poll_timeout": ([lh_client_p, _P(_u64)], _u32, True),
    "lh_lease_state": ([lh_client_p, _u64, _P(_u32)], _u32, True),
    "lh_lease_info_get": ([lh_client_p, _u64, _P(lh_lease_info)], _u32, True),
    "lh_fencing_token": ([lh_client_p, _u64, _P(_u64)], _u32, True),
    "lh_valid_until": ([lh_client_p, _u64, _P(_u64)], _u32, True),
    "lh_is_held": ([lh_client_p, _u64, _u64, _P(ctypes.c_bool)], _u32, True),
    "lh_counters_get": ([lh_client_p, _P(lh_counters)], _u32, True),
    "lh_client_debug_panic": ([lh_client_p], _u32, True),
    # the IO seam
    "lh_io_poll": ([lh_client_p, _P(lh_io_request)], _u32, True),
    "lh_drain": ([lh_client_p, _P(lh_io_request), _P(lh_event), _sz, _P(lh_drained)], _u32, True),
    "lh_io_received_drain": (
        [lh_client_p, _u64, _u64, _cp, _sz, _P(lh_io_request), _P(lh_event), _sz, _P(lh_drained)],
        _u32,
        True,
    ),
    # values: a packed lh_value list passed as bytes (see leasehold._values.flatten_reply)
    "lh_io_reply": ([lh_client_p, _u64, _u64, _cp, _sz, _cp, _sz], _u32, True),
    "lh_io_http_reply": ([lh_client_p, _u64, _u64, _u32, _cp, _sz], _u32, True),
    "lh_io_stream_message": ([lh_client_p, _u64, _u64, _cp, _sz], _u32, True),
    "lh_io_failed": ([lh_client_p, _u64, _u64, _u32, _cp, _sz], _u32, True),
    "lh_io_message": ([lh_client_p, _u64, _cp, _sz, _cp, _sz], _u32, True),
    "lh_io_connection": ([lh_client_p, _u64, _u32, _u32, _cp, _sz], _u32, True),
    "lh_io_close": ([lh_client_p, _u64], _u32, True),
    "lh_io_opened": ([lh_client_p, _u64, _u64], _u32, True),
    "lh_io_received": ([lh_client_p, _u64, _u64, _cp, _sz], _u32, True),
    "lh_io_closed": ([lh_client_p, _u64, _u64, _cp, _sz], _u32, True),
    "lh_backend_last_error": ([lh_client_p], ctypes.c_char_p, False),
    "lh_status_request": ([lh_client_p, _u64, _cp, _sz, _P(_u64)], _u32, True),
    "lh_poll_status": ([lh_client_p, _P(lh_lock_status)], _u32, True),
}

_msp = lh_memory_service_p
_MEMORY_SIGNATURES: dict[str, tuple[list[Any], Any, bool]] = {
    "lh_memory_config_default": ([_P(lh_memory_config)], None, False),
    "lh_memory_service_new": ([_P(lh_memory_config), _P(_msp)], _u32, True),
    "lh_memory_service_free": ([_msp], None, False),
    "lh_memory_service_last_error": ([_msp], ctypes.c_char_p, False),
    "lh_memory_service_connect": ([_msp, _P(_u64)], _u32, True),
    "lh_memory_service_disconnect": ([_msp, _u64], _u32, True),
    "lh_memory_service_call": ([_msp, _u64, _u64, _P(lh_bytes), _u32, _P(lh_memory_answer)], _u32, True),
    "lh_memory_service_status": ([_msp, _u64, _cp, _sz, _P(lh_memory_status)], _u32, True),
    "lh_memory_service_poll_released": (
        [_msp, _u64, _P(ctypes.c_void_p), _P(_sz)],
        _u32,
        True,
    ),
    "lh_memory_service_set_faults": ([_msp, _u64, _P(lh_memory_faults)], _u32, True),
    "lh_memory_service_get_faults": ([_msp, _u64, _P(lh_memory_faults)], _u32, True),
    "lh_memory_service_step_clock": ([_msp, ctypes.c_int64], _u32, True),
    "lh_memory_service_forget": ([_msp, _cp, _sz], _u32, True),
    "lh_memory_service_stats_get": ([_msp, _P(lh_memory_stats)], _u32, True),
    "lh_memory_service_debug_panic": ([_msp], _u32, True),
}


# Exports added without an ABI change (a library of ABI_VERSION may predate them).
_ADDED_EXPORTS = frozenset({"lh_client_new_check", "lh_drain", "lh_io_received_drain"})


def client_new_reason(cfg: lh_config, bopts: lh_backend_options, seed: Any, seed_len: int) -> str:
    """Why ``lh_client_new`` refuses these arguments (``lh_client_new_check``), ``""`` when it
    would not or the library predates the function."""
    fn = getattr(lib, "lh_client_new_check", None)
    if fn is None:
        return ""
    size = 256
    while True:
        buf = ctypes.create_string_buffer(size)
        n = ctypes.c_size_t()
        fn(ctypes.byref(cfg), ctypes.byref(bopts), seed, seed_len, buf, size, ctypes.byref(n))
        if n.value < size:
            return buf.value.decode("utf-8", "replace")
        size = n.value + 1


def _declare() -> None:
    for table, check_fn in ((_SIGNATURES, _errcheck), (_MEMORY_SIGNATURES, _memory_errcheck)):
        for name, (argtypes, restype, checked) in table.items():
            fn = getattr(lib, name, None)
            if fn is None:
                if name in TESTING_HOOKS:
                    continue  # hook() says why when one is called
                if name in _ADDED_EXPORTS:
                    continue  # a library of the same ABI from before them: used when present
                raise errors.LibraryError(f"{library_path} does not export {name}; is it a leasehold build?")
            fn.argtypes = argtypes
            fn.restype = restype
            if checked:
                fn.errcheck = check_fn


def unchecked(name: str, *, pointers_only: bool = False, ctypes_args: bool = False) -> Any:
    """A second function object for ``name`` without ``errcheck``: hot paths test the status
    themselves with :func:`check` (one Python frame less per call).

    ``pointers_only``: the caller passes nothing but ctypes pointer objects (the handle, a
    ``byref``), which ctypes passes as pointers as they are, so no ``argtypes`` conversion is
    needed (it costs more than the call into the core itself). ``ctypes_args``: the same for
    a caller that passes a ctypes object of the right type for every argument.
    """
    argtypes, restype, _ = _SIGNATURES[name]
    fn = lib[name]  # indexing builds a new function object; ``lib.name`` is the checked one
    if ctypes_args:
        pass
    elif not pointers_only:
        fn.argtypes = argtypes
    elif not all(issubclass(t, ctypes._Pointer) for t in argtypes):  # pragma: no cover - misuse
        raise TypeError(f"{name} takes non-pointer arguments")
    fn.restype = restype
    return fn


def check(status: int, handle: Any, function: str) -> None:
    """Raise the typed exception for a non-zero ``status`` of ``function`` on ``handle``."""
    if status != LH_OK:
        _errcheck(status, _Named(function), (handle,))


class _Named:
    def __init__(self, name: str) -> None:
        self.__name__ = name


def _check_abi() -> None:
    found = int(lib.lh_abi_version())
    if found != ABI_VERSION:
        raise errors.LibraryError(
            f"leasehold ABI mismatch: this Python package speaks ABI {ABI_VERSION}, but {library_path} "
            f"reports ABI {found}. Rebuild the library (cargo build --release) or install a matching package."
        )


_check_abi()
_declare()

VERSION: str = lib.lh_version().decode("ascii", "replace")
