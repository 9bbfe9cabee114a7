"""ctypes declarations of the leasehold C ABI (include/leasehold.h).

The library is located in this order:

1. ``$LEASEHOLD_LIBRARY`` (a full path to the shared library): an override that always wins;
2. the copy built into the package (``leasehold/_lib/libleasehold.so``: wheels and
   ``pip install`` carry it);
3. the repository's build output (``<repo>/target/release``, then ``target/debug``), for a
   checkout installed with ``LEASEHOLD_SKIP_RUST_BUILD=1`` (the development venv).

At import the ABI version (``lh_abi_version()``) is compared with :data:`ABI_VERSION`; a
mismatch raises :class:`~leasehold.errors.LibraryError` with both numbers and the path.

Every fallible function is declared once in :data:`_SIGNATURES` with ``argtypes``/``restype``
and an ``errcheck`` that turns a non-zero ``lh_status`` into a typed exception carrying the
status name and the handle's detail message (``lh_client_last_error``).

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

ABI_VERSION = 2

# ---- constants (mirror include/leasehold.h) ---------------------------------------------
LH_OK = 0
LH_ERR_NULL_ARGUMENT = 1
LH_ERR_INVALID_UTF8 = 2
LH_ERR_EMPTY_NAME = 3
LH_ERR_NAME_TOO_LONG = 4
LH_ERR_NAME_HAS_NUL = 5
LH_ERR_INVALID_TTL = 6
LH_ERR_INVALID_CONFIG = 7
LH_ERR_SEED_TOO_SHORT = 8
LH_ERR_UNKNOWN_LEASE = 9
LH_ERR_LEASE_ENDED = 10
LH_ERR_TOO_MANY_LEASES = 11
LH_ERR_INVALID_ENUM = 12
LH_ERR_BACKEND_DATA_TOO_LONG = 13
LH_ERR_BUFFER_TOO_SMALL = 14
LH_ERR_NOT_GRANTED = 15
LH_ERR_STRUCT_SIZE = 16
LH_ERR_INVALID_REPLY = 17
LH_ERR_NO_BACKEND = 18
LH_ERR_PANIC = 900
LH_ERR_POISONED = 901

LH_OUTPUT_NONE = 0
LH_OUTPUT_ACQUIRE = 1
LH_OUTPUT_RENEW = 2
LH_OUTPUT_RELEASE = 3
LH_OUTPUT_WATCH = 4
LH_OUTPUT_UNWATCH = 5
LH_OUTPUT_ACQUIRED = 6
LH_OUTPUT_ACQUIRE_FAILED = 7
LH_OUTPUT_LOST = 8
LH_OUTPUT_RELEASED = 9
LH_OUTPUT_RENEWED = 10
LH_OUTPUT_RELEASE_OUTCOME = 11

LH_REASON_NONE = 0
LH_REASON_WAIT_EXHAUSTED = 1
LH_REASON_CANCELLED = 2
LH_REASON_UNAVAILABLE = 3
LH_REASON_REJECTED = 4
LH_REASON_EXPIRED = 5
LH_REASON_FAIL_BUDGET = 6
LH_REASON_RELEASE_CONFIRMED = 7
LH_REASON_RELEASE_NOT_OWNER = 8
LH_REASON_RELEASE_UNCONFIRMED = 9

LH_RELEASING_HOLDER_LEFT = 1
LH_RELEASING_PENDING = 2
LH_RELEASING_LOST = 3
LH_RELEASING_NOT_ACQUIRED = 4

LH_ACQUIRE_GRANTED = 1
LH_ACQUIRE_HELD_BY_OTHER = 2
LH_ACQUIRE_TRANSPORT_ERROR = 3
LH_RENEW_RENEWED = 1
LH_RENEW_REJECTED = 2
LH_RENEW_TRANSPORT_ERROR = 3
LH_RELEASE_RELEASED = 1
LH_RELEASE_NOT_OWNER = 2
LH_RELEASE_TRANSPORT_ERROR = 3

LH_STATE_ACQUIRING = 1
LH_STATE_HELD = 2
LH_STATE_RELEASED = 3
LH_STATE_LOST = 4
LH_STATE_ACQUIRE_FAILED = 5

LH_NO_DEADLINE = 2**64 - 1
LH_CONNECTION_COMMANDS = 1
LH_CONNECTION_SUBSCRIBER = 2
LH_VALUE_NIL = 1
LH_VALUE_INT = 2
LH_VALUE_BULK = 3
LH_VALUE_STATUS = 4
LH_VALUE_ERROR = 5
LH_VALUE_ARRAY = 6
LH_NO_RETRY_HINT = 2**64 - 1
LH_VALUE_TEXT = 7
LH_VALUE_FLOAT = 8
LH_ACQUIRE_REENTRANT = 1
LH_ACQUIRE_NO_AUTO_RENEW = 2

# SQL protocol (lh_client_new_sql)
LH_DIALECT_SQLITE = 1
LH_DIALECT_POSTGRES = 2
LH_SQL_CONNECTION_COMMANDS = 1
LH_SQL_CONNECTION_LISTENER = 2
LH_PARAM_HOST_MONOTONIC_NS = 20
LH_PARAM_HOST_WALL_US = 21
LH_PARAM_HOST_BOOT_ID = 22
LH_PARAM_HOST_PID = 23
LH_PARAM_HOST_NAME = 24
LH_SQL_FAILURE_TRANSPORT = 1
LH_SQL_FAILURE_DATABASE = 2
LH_MAX_SQL_MESSAGE = 1 << 16

# etcd protocol (lh_client_new_etcd)
LH_HTTP_UNARY = 1
LH_HTTP_WATCH = 2
LH_HTTP_CANCEL_WATCH = 3
LH_MAX_HTTP_BODY = 1 << 20

U64_MAX = 2**64 - 1

REASON_NAMES = {
    LH_REASON_NONE: "none",
    LH_REASON_WAIT_EXHAUSTED: "wait_exhausted",
    LH_REASON_CANCELLED: "cancelled",
    LH_REASON_UNAVAILABLE: "unavailable",
    LH_REASON_REJECTED: "rejected",
    LH_REASON_EXPIRED: "expired",
    LH_REASON_FAIL_BUDGET: "fail_budget",
    LH_REASON_RELEASE_CONFIRMED: "release_confirmed",
    LH_REASON_RELEASE_NOT_OWNER: "release_not_owner",
    LH_REASON_RELEASE_UNCONFIRMED: "release_unconfirmed",
}

STATE_NAMES = {
    LH_STATE_ACQUIRING: "acquiring",
    LH_STATE_HELD: "held",
    LH_STATE_RELEASED: "released",
    LH_STATE_LOST: "lost",
    LH_STATE_ACQUIRE_FAILED: "acquire_failed",
}


# ---- structs -------------------------------------------------------------------------------
class lh_client(ctypes.Structure):
    """Opaque core handle."""


lh_client_p = ctypes.POINTER(lh_client)


class lh_config(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("drift_ppm", ctypes.c_uint32),
        ("drift_fixed_ns", ctypes.c_uint64),
        ("renew_jitter_ppm", ctypes.c_uint32),
        ("fail_budget", ctypes.c_uint32),
        ("request_timeout_ns", ctypes.c_uint64),
        ("backoff_base_ns", ctypes.c_uint64),
        ("backoff_cap_ns", ctypes.c_uint64),
        ("max_ttl_ms", ctypes.c_uint64),
        ("max_leases", ctypes.c_uint32),
        ("notifications", ctypes.c_uint32),
    ]


class lh_acquire_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("ttl_ms", ctypes.c_uint64),
        ("wait_ns", ctypes.c_uint64),
    ]


class lh_output(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_uint32),
        ("reason", ctypes.c_uint32),
        ("request_id", ctypes.c_uint64),
        ("lease_id", ctypes.c_uint64),
        ("name", ctypes.POINTER(ctypes.c_uint8)),
        ("name_len", ctypes.c_size_t),
        ("token", ctypes.POINTER(ctypes.c_uint8)),
        ("token_len", ctypes.c_size_t),
        ("backend_data", ctypes.POINTER(ctypes.c_uint8)),
        ("backend_data_len", ctypes.c_size_t),
        ("ttl_ms", ctypes.c_uint64),
        ("fencing_token", ctypes.c_uint64),
        ("valid_until_ns", ctypes.c_uint64),
    ]


class lh_lease_info(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("state", ctypes.c_uint32),
        ("holders", ctypes.c_uint32),
        ("has_token", ctypes.c_uint32),
        ("fencing_token", ctypes.c_uint64),
        ("valid_until_ns", ctypes.c_uint64),
    ]


COUNTER_FIELDS = (
    "live_leases",
    "pending_cleanups",
    "acquires_sent",
    "grants",
    "acquire_failed",
    "renewals_sent",
    "renewals_ok",
    "renewals_failed",
    "releases_sent",
    "lost_rejected",
    "lost_expired",
    "lost_fail_budget",
    "stale_results",
    "time_clamped",
)


# Counters the C struct gained after its first version (it grows at the end only).
COUNTER_FIELDS_ADDED = (
    "renewals_requested",
    "releases_confirmed",
    "releases_not_owner",
    "releases_unconfirmed",
    "releases_lost",
)


class lh_counters(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("_reserved", ctypes.c_uint32)] + [
        (f, ctypes.c_uint64) for f in COUNTER_FIELDS + COUNTER_FIELDS_ADDED
    ]


class lh_redis_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("_reserved", ctypes.c_uint32),
        ("standby_delay_ms", ctypes.c_uint64),
        ("key_keep_ms", ctypes.c_uint64),
        ("queue_max_age_ms", ctypes.c_uint64),
        ("idle_recheck_ms", ctypes.c_uint64),
        ("sharded_wake", ctypes.c_uint32),
        ("_reserved2", ctypes.c_uint32),
    ]


class lh_bytes(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class lh_request(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint64),
        ("connection", ctypes.c_uint32),
        ("argc", ctypes.c_uint32),
        ("argv", ctypes.POINTER(lh_bytes)),
    ]


REDIS_COUNTER_FIELDS = (
    "requests",
    "script_calls",
    "noscript_retries",
    "error_replies",
    "garbage_replies",
    "stale_replies",
    "transport_failures",
    "local_refusals",
    "wakeups",
    "standby_takeovers",
    "ignored_messages",
    "subscriptions",
    "subscriber_losses",
)


class lh_redis_counters(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("subscribed", ctypes.c_uint32)] + [
        (f, ctypes.c_uint64) for f in REDIS_COUNTER_FIELDS
    ]


class lh_sql_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("dialect", ctypes.c_uint32),
        ("busy_timeout_ms", ctypes.c_uint64),
        ("asynchronous_commit", ctypes.c_uint32),
        ("_reserved", ctypes.c_uint32),
    ]


class lh_sql_statement(ctypes.Structure):
    _fields_ = [
        ("sql_offset", ctypes.c_uint64),
        ("sql_len", ctypes.c_uint64),
        ("first_param", ctypes.c_uint32),
        ("nparams", ctypes.c_uint32),
    ]


class lh_value(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_uint32),
        ("_reserved", ctypes.c_uint32),
        ("integer", ctypes.c_int64),
        ("offset", ctypes.c_uint64),
        ("len", ctypes.c_uint64),
    ]


class lh_sql_request(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint64),
        ("connection", ctypes.c_uint32),
        ("nstatements", ctypes.c_uint32),
        ("statements", ctypes.POINTER(lh_sql_statement)),
        ("params", ctypes.POINTER(lh_value)),
        ("nparams", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("data_len", ctypes.c_size_t),
    ]


class lh_lock_status(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("ok", ctypes.c_uint32),
        ("id", ctypes.c_uint64),
        ("held", ctypes.c_uint32),
        ("_reserved", ctypes.c_uint32),
        ("fencing_token", ctypes.c_uint64),
        ("remaining_ttl_ms", ctypes.c_uint64),
        ("last_fencing_token", ctypes.c_uint64),
        ("holder_pid", ctypes.c_int64),
        ("held_for_ms", ctypes.c_uint64),
        ("holder_host", ctypes.c_void_p),
        ("holder_host_len", ctypes.c_size_t),
        ("error", ctypes.c_void_p),
        ("error_len", ctypes.c_size_t),
    ]


lh_sql_status = lh_lock_status  # its first name


class lh_etcd_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("_reserved", ctypes.c_uint32),
        ("user", ctypes.c_char_p),
        ("user_len", ctypes.c_size_t),
        ("password", ctypes.c_char_p),
        ("password_len", ctypes.c_size_t),
    ]


class lh_http_request(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint64),
        ("kind", ctypes.c_uint32),
        ("_reserved", ctypes.c_uint32),
        ("method", ctypes.c_char_p),
        ("path", ctypes.c_char_p),
        ("body", ctypes.c_void_p),
        ("body_len", ctypes.c_size_t),
        ("authorization", ctypes.c_char_p),
    ]


ETCD_COUNTER_FIELDS = (
    "requests",
    "leases_granted",
    "txns",
    "watches",
    "wakeups",
    "waiting_keepalives",
    "waiters_expired",
    "error_replies",
    "garbage_replies",
    "transport_failures",
    "stale_replies",
)


class lh_etcd_counters(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("_reserved", ctypes.c_uint32)] + [
        (f, ctypes.c_uint64) for f in ETCD_COUNTER_FIELDS
    ]


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


_u8p = ctypes.POINTER(ctypes.c_uint8)
_u64 = ctypes.c_uint64
_u32 = ctypes.c_uint32
_sz = ctypes.c_size_t
# Byte-buffer inputs with an explicit length (names, backend data): declared char* so Python
# `bytes` pass straight through (same ABI as const uint8_t*; the length, not a NUL, bounds them).
_cp = ctypes.c_char_p

# Exported only by a library built with `--features testing` (the test suites build it);
# release builds (wheels, `pip install`, scripts/install-lib.sh) leave them out.
TESTING_HOOKS = frozenset(
    {
        "lh_client_debug_panic",
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


# name: (argtypes, restype, checked)
_SIGNATURES: dict[str, tuple[list[Any], Any, bool]] = {
    "lh_config_default": ([ctypes.POINTER(lh_config)], None, False),
    "lh_acquire_options_default": ([ctypes.POINTER(lh_acquire_options)], None, False),
    "lh_client_new": (
        [ctypes.POINTER(lh_config), _u8p, _sz, ctypes.POINTER(lh_client_p)],
        _u32,
        True,
    ),
    "lh_client_free": ([lh_client_p], None, False),
    "lh_client_reseed": ([lh_client_p, _u8p, _sz], _u32, True),
    "lh_acquire": (
        [lh_client_p, _u64, _cp, _sz, ctypes.POINTER(lh_acquire_options), ctypes.POINTER(_u64)],
        _u32,
        True,
    ),
    "lh_release": ([lh_client_p, _u64, _u64], _u32, True),
    "lh_release_reported": ([lh_client_p, _u64, _u64, ctypes.POINTER(_u32)], _u32, True),
    "lh_renew": ([lh_client_p, _u64, _u64], _u32, True),
    "lh_acquire_result": ([lh_client_p, _u64, _u64, _u32, _u64, _u64, _u64, _cp, _sz], _u32, True),
    "lh_renew_result": ([lh_client_p, _u64, _u64, _u32], _u32, True),
    "lh_release_result": ([lh_client_p, _u64, _u64, _u32], _u32, True),
    "lh_released": ([lh_client_p, _u64, _cp, _sz], _u32, True),
    "lh_timeout": ([lh_client_p, _u64], _u32, True),
    "lh_poll_output": ([lh_client_p, ctypes.POINTER(lh_output)], _u32, True),
    "lh_poll_timeout": ([lh_client_p, ctypes.POINTER(_u64)], _u32, True),
    "lh_lease_state": ([lh_client_p, _u64, ctypes.POINTER(_u32)], _u32, True),
    "lh_lease_info_get": ([lh_client_p, _u64, ctypes.POINTER(lh_lease_info)], _u32, True),
    "lh_fencing_token": ([lh_client_p, _u64, ctypes.POINTER(_u64)], _u32, True),
    "lh_valid_until": ([lh_client_p, _u64, ctypes.POINTER(_u64)], _u32, True),
    "lh_is_held": ([lh_client_p, _u64, _u64, ctypes.POINTER(ctypes.c_bool)], _u32, True),
    "lh_counters_get": ([lh_client_p, ctypes.POINTER(lh_counters)], _u32, True),
    "lh_client_debug_panic": ([lh_client_p], _u32, True),
    "lh_redis_options_default": ([ctypes.POINTER(lh_redis_options)], None, False),
    "lh_client_new_redis": (
        [ctypes.POINTER(lh_config), ctypes.POINTER(lh_redis_options), _u8p, _sz, ctypes.POINTER(lh_client_p)],
        _u32,
        True,
    ),
    "lh_poll_request": ([lh_client_p, ctypes.POINTER(lh_request)], _u32, True),
    # values: a packed lh_value array passed as bytes (see _core.flatten_reply)
    "lh_reply": ([lh_client_p, _u64, _u64, _cp, _sz, _cp, _sz], _u32, True),
    "lh_request_failed": ([lh_client_p, _u64, _u64], _u32, True),
    "lh_pubsub_message": ([lh_client_p, _u64, _cp, _sz, _cp, _sz], _u32, True),
    "lh_subscription": ([lh_client_p, _u64, _cp, _sz, _u32], _u32, True),
    "lh_redis_counters_get": ([lh_client_p, ctypes.POINTER(lh_redis_counters)], _u32, True),
    # SQL protocol
    "lh_sql_options_default": ([ctypes.POINTER(lh_sql_options)], None, False),
    "lh_client_new_sql": (
        [ctypes.POINTER(lh_config), ctypes.POINTER(lh_sql_options), _u8p, _sz, ctypes.POINTER(lh_client_p)],
        _u32,
        True,
    ),
    "lh_sql_poll_request": ([lh_client_p, ctypes.POINTER(lh_sql_request)], _u32, True),
    "lh_sql_result": ([lh_client_p, _u64, _u64, _cp, _sz, _cp, _sz], _u32, True),
    "lh_sql_failed": ([lh_client_p, _u64, _u64, _u32, _cp, _sz], _u32, True),
    "lh_sql_notification": ([lh_client_p, _u64, _cp, _sz, _cp, _sz], _u32, True),
    "lh_sql_connection_reset": ([lh_client_p, _u64, _u32], _u32, True),
    "lh_sql_status_request": ([lh_client_p, _u64, _cp, _sz, ctypes.POINTER(_u64)], _u32, True),
    "lh_sql_poll_status": ([lh_client_p, ctypes.POINTER(lh_sql_status)], _u32, True),
    "lh_status_request": ([lh_client_p, _u64, _cp, _sz, ctypes.POINTER(_u64)], _u32, True),
    "lh_poll_status": ([lh_client_p, ctypes.POINTER(lh_lock_status)], _u32, True),
    "lh_sql_last_error": ([lh_client_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_sz)], _u32, True),
    # etcd protocol
    "lh_etcd_options_default": ([ctypes.POINTER(lh_etcd_options)], None, False),
    "lh_client_new_etcd": (
        [ctypes.POINTER(lh_config), ctypes.POINTER(lh_etcd_options), _u8p, _sz, ctypes.POINTER(lh_client_p)],
        _u32,
        True,
    ),
    "lh_http_poll_request": ([lh_client_p, ctypes.POINTER(lh_http_request)], _u32, True),
    "lh_http_reply": ([lh_client_p, _u64, _u64, _u32, _cp, _sz], _u32, True),
    "lh_http_stream_message": ([lh_client_p, _u64, _u64, _cp, _sz], _u32, True),
    "lh_http_failed": ([lh_client_p, _u64, _u64, _cp, _sz], _u32, True),
    "lh_etcd_counters_get": ([lh_client_p, ctypes.POINTER(lh_etcd_counters)], _u32, True),
    "lh_etcd_last_error": ([lh_client_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_sz)], _u32, True),
    "lh_etcd_close": ([lh_client_p, _u64], _u32, True),
}


def _declare() -> None:
    for name, (argtypes, restype, checked) in _SIGNATURES.items():
        fn = getattr(lib, name, None)
        if fn is None:
            if name in TESTING_HOOKS:
                continue  # hook() says why when one is called
            raise errors.LibraryError(f"{library_path} does not export {name}; is it a leasehold build?")
        fn.argtypes = argtypes
        fn.restype = restype
        if checked:
            fn.errcheck = _errcheck


def unchecked(name: str, *, pointers_only: bool = False) -> Any:
    """A second function object for ``name`` without ``errcheck``: hot paths test the status
    themselves with :func:`check` (one Python frame less per call).

    ``pointers_only``: the caller passes nothing but ctypes pointer objects (the handle, a
    ``byref``), which ctypes passes as pointers as they are, so no ``argtypes`` conversion is
    needed (it costs more than the call into the core itself).
    """
    argtypes, restype, _ = _SIGNATURES[name]
    fn = lib[name]  # indexing builds a new function object; ``lib.name`` is the checked one
    if not pointers_only:
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


# ---- the memory service (lh_memory_service_*): the core's in-memory reference service ----------
LH_ERR_INVALID_TOKEN = 19
LH_ERR_UNKNOWN_CONNECTION = 20
LH_ERR_LIMIT_REACHED = 21

LH_MEMORY_MAX_TOKEN_LEN = 64
LH_MEMORY_GRANTED = 1
LH_MEMORY_HELD_BY_OTHER = 2
LH_MEMORY_RENEWED = 3
LH_MEMORY_REJECTED = 4
LH_MEMORY_RELEASED = 5
LH_MEMORY_NOT_OWNER = 6
LH_MEMORY_DROPPED = 7
LH_MEMORY_FULL = 8

LH_MEMORY_REJECT_ACQUIRES = 1
LH_MEMORY_REJECT_RENEWALS = 2
LH_MEMORY_REJECT_RELEASES = 4
LH_MEMORY_DROP_REQUESTS = 8
LH_MEMORY_DROP_RESPONSES = 16
LH_MEMORY_PARTITIONED = 32


class lh_memory_service(ctypes.Structure):
    """Opaque memory-service handle."""


lh_memory_service_p = ctypes.POINTER(lh_memory_service)


class lh_memory_config(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("max_names", ctypes.c_uint32),
        ("max_connections", ctypes.c_uint32),
        ("max_watches", ctypes.c_uint32),
        ("max_pending", ctypes.c_uint32),
    ]


class lh_memory_faults(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("drop_next_responses", ctypes.c_uint32),
        ("_reserved", ctypes.c_uint32),
    ]


class lh_memory_result(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("outcome", ctypes.c_uint32),
        ("engine_outcome", ctypes.c_uint32),
        ("_reserved", ctypes.c_uint32),
        ("fencing_token", ctypes.c_uint64),
        ("ttl_ms", ctypes.c_uint64),
        ("retry_after_ms", ctypes.c_uint64),
    ]


class lh_memory_status(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("held", ctypes.c_uint32),
        ("fencing_token", ctypes.c_uint64),
        ("remaining_ttl_ms", ctypes.c_uint64),
        ("expires_at_ns", ctypes.c_uint64),
        ("held_for_ns", ctypes.c_uint64),
        ("holder_connection", ctypes.c_uint64),
        ("last_fencing_token", ctypes.c_uint64),
        ("service_now_ns", ctypes.c_uint64),
        ("holder_token_len", ctypes.c_uint32),
        ("watchers", ctypes.c_uint32),
        ("holder_token", ctypes.c_uint8 * LH_MEMORY_MAX_TOKEN_LEN),
    ]


class lh_memory_stats(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("_reserved", ctypes.c_uint32),
        ("names", ctypes.c_uint64),
        ("connections", ctypes.c_uint64),
        ("grants", ctypes.c_uint64),
        ("releases", ctypes.c_uint64),
        ("renewals", ctypes.c_uint64),
        ("renewals_rejected", ctypes.c_uint64),
        ("watches", ctypes.c_uint64),
        ("notifications", ctypes.c_uint64),
        ("notifications_dropped", ctypes.c_uint64),
        ("reclaimed", ctypes.c_uint64),
    ]


_STATUS_CLASSES[LH_ERR_INVALID_TOKEN] = errors.InvalidArgument


def _memory_errcheck(result: int, func: Any, args: tuple[Any, ...]) -> int:
    if result == LH_OK:
        return result
    detail = ""
    if args and args[0]:
        raw = lib.lh_memory_service_last_error(args[0])
        if raw:
            detail = raw.decode("utf-8", "replace")
    raise make_error(result, detail, getattr(func, "__name__", ""))


_msp = lh_memory_service_p
_MEMORY_SIGNATURES: dict[str, tuple[list[Any], Any, bool]] = {
    "lh_memory_config_default": ([ctypes.POINTER(lh_memory_config)], None, False),
    "lh_memory_service_new": ([ctypes.POINTER(lh_memory_config), ctypes.POINTER(_msp)], _u32, True),
    "lh_memory_service_free": ([_msp], None, False),
    "lh_memory_service_last_error": ([_msp], ctypes.c_char_p, False),
    "lh_memory_service_connect": ([_msp, ctypes.POINTER(_u64)], _u32, True),
    "lh_memory_service_disconnect": ([_msp, _u64], _u32, True),
    "lh_memory_service_acquire": (
        [_msp, _u64, _u64, _cp, _sz, _cp, _sz, _u64, ctypes.POINTER(lh_memory_result)],
        _u32,
        True,
    ),
    "lh_memory_service_renew": (
        [_msp, _u64, _u64, _cp, _sz, _cp, _sz, _u64, ctypes.POINTER(lh_memory_result)],
        _u32,
        True,
    ),
    "lh_memory_service_release": (
        [_msp, _u64, _u64, _cp, _sz, _cp, _sz, ctypes.POINTER(lh_memory_result)],
        _u32,
        True,
    ),
    "lh_memory_service_status": ([_msp, _u64, _cp, _sz, ctypes.POINTER(lh_memory_status)], _u32, True),
    "lh_memory_service_watch": ([_msp, _u64, _cp, _sz], _u32, True),
    "lh_memory_service_unwatch": ([_msp, _u64, _cp, _sz], _u32, True),
    "lh_memory_service_poll_released": (
        [_msp, _u64, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_sz)],
        _u32,
        True,
    ),
    "lh_memory_service_set_faults": ([_msp, _u64, ctypes.POINTER(lh_memory_faults)], _u32, True),
    "lh_memory_service_get_faults": ([_msp, _u64, ctypes.POINTER(lh_memory_faults)], _u32, True),
    "lh_memory_service_step_clock": ([_msp, ctypes.c_int64], _u32, True),
    "lh_memory_service_forget": ([_msp, _cp, _sz], _u32, True),
    "lh_memory_service_stats_get": ([_msp, ctypes.POINTER(lh_memory_stats)], _u32, True),
}


def _declare_memory() -> None:
    for name, (argtypes, restype, checked) in _MEMORY_SIGNATURES.items():
        fn = getattr(lib, name, None)
        if fn is None:
            if name in TESTING_HOOKS:
                continue  # hook() says why when one is called
            raise errors.LibraryError(f"{library_path} does not export {name}; is it a leasehold build?")
        fn.argtypes = argtypes
        fn.restype = restype
        if checked:
            fn.errcheck = _memory_errcheck


_declare_memory()
