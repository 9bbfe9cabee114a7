"""The C ABI's constants and structs as ctypes mirrors (include/leasehold.h, ABI 4).

Pure declarations: nothing here loads the library (that is :mod:`leasehold._ffi`, which
re-exports every name of this module). ``tests/core/test_core_abi_layout.py`` compiles the
header and checks the size and every field offset of each struct below against it.
"""

from __future__ import annotations

import ctypes

ABI_VERSION = 4

# ---- status codes ------------------------------------------------------------------------
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
LH_ERR_BACKEND_DATA_TOO_LONG = 13  # retired (never reused)
LH_ERR_BUFFER_TOO_SMALL = 14
LH_ERR_NOT_GRANTED = 15
LH_ERR_STRUCT_SIZE = 16
LH_ERR_INVALID_REPLY = 17
LH_ERR_NO_BACKEND = 18
LH_ERR_INVALID_TOKEN = 19
LH_ERR_UNKNOWN_CONNECTION = 20
LH_ERR_LIMIT_REACHED = 21
LH_ERR_WRONG_ANSWER = 22
LH_ERR_PANIC = 900
LH_ERR_POISONED = 901

# ---- events (lh_poll_event) --------------------------------------------------------------
LH_EVENT_NONE = 0
LH_EVENT_ACQUIRED = 6
LH_EVENT_ACQUIRE_FAILED = 7
LH_EVENT_LOST = 8
LH_EVENT_RELEASED = 9
LH_EVENT_RENEWED = 10
LH_EVENT_RELEASE_OUTCOME = 11

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

LH_STATE_ACQUIRING = 1
LH_STATE_HELD = 2
LH_STATE_RELEASED = 3
LH_STATE_LOST = 4
LH_STATE_ACQUIRE_FAILED = 5

LH_NO_DEADLINE = 2**64 - 1
LH_ACQUIRE_REENTRANT = 1
LH_ACQUIRE_NO_AUTO_RENEW = 2
LH_DEFAULT_TTL_MS = 30_000
LH_MAX_NAME_LEN = 512
LH_MIN_SEED_LEN = 16
LH_MAX_SEED_LEN = 1024
LH_COUNTERS_V1_SIZE = 120
LH_DRAINED_V1_SIZE = 24

# ---- backends and the IO seam --------------------------------------------------------------
LH_BACKEND_MEMORY = 1
LH_BACKEND_REDIS = 2
LH_BACKEND_SQLITE = 3
LH_BACKEND_POSTGRES = 4
LH_BACKEND_ETCD = 5
LH_BACKEND_REDIS_STREAM = 6
LH_REDIS_PROTOCOL_LEGACY = 1
LH_REDIS_PROTOCOL_RESP2 = 2
LH_REDIS_PROTOCOL_RESP3 = 3

LH_IO_NONE = 0
LH_IO_COMMAND = 1
LH_IO_SQL = 2
LH_IO_HTTP = 3
LH_IO_HTTP_WATCH = 4
LH_IO_HTTP_CANCEL = 5
LH_IO_OPEN = 6
LH_IO_WRITE = 7
LH_IO_SHUTDOWN = 8

LH_CONNECTION_COMMANDS = 1
LH_CONNECTION_NOTIFY = 2

LH_FAILURE_TRANSPORT = 1
LH_FAILURE_DATABASE = 2

LH_CONNECTION_REOPENED = 1
LH_CONNECTION_SUBSCRIBED = 2
LH_CONNECTION_UNSUBSCRIBED = 3

# ---- the flat value format ------------------------------------------------------------------
LH_VALUE_NIL = 1
LH_VALUE_INT = 2
LH_VALUE_BULK = 3
LH_VALUE_STATUS = 4
LH_VALUE_ERROR = 5
LH_VALUE_ARRAY = 6
LH_VALUE_TEXT = 7
LH_VALUE_FLOAT = 8
LH_PARAM_HOST_MONOTONIC_NS = 20
LH_PARAM_HOST_WALL_US = 21
LH_PARAM_HOST_BOOT_ID = 22
LH_PARAM_HOST_PID = 23
LH_PARAM_HOST_NAME = 24
LH_MAX_REPLY_VALUES = 4096
LH_MAX_REPLY_DATA = 1 << 20
LH_MAX_REPLY_DEPTH = 16

# ---- the memory service -------------------------------------------------------------------------
LH_MEMORY_MAX_TOKEN_LEN = 64
LH_MEMORY_REJECT_ACQUIRES = 1
LH_MEMORY_REJECT_RENEWALS = 2
LH_MEMORY_REJECT_RELEASES = 4
LH_MEMORY_REJECT_ALL = 7
LH_MEMORY_DROP_REQUESTS = 8
LH_MEMORY_DROP_RESPONSES = 16
LH_MEMORY_PARTITIONED = 32

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

_u8p = ctypes.POINTER(ctypes.c_uint8)


# ---- the client -------------------------------------------------------------------------------
class lh_client(ctypes.Structure):
    """Opaque core handle."""


lh_client_p = ctypes.POINTER(lh_client)


class lh_backend_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("kind", ctypes.c_uint32),
        ("redis_standby_delay_ms", ctypes.c_uint64),
        ("redis_key_keep_ms", ctypes.c_uint64),
        ("redis_queue_max_age_ms", ctypes.c_uint64),
        ("redis_idle_recheck_ms", ctypes.c_uint64),
        ("redis_sharded_wake", ctypes.c_uint32),
        ("postgres_asynchronous_commit", ctypes.c_uint32),
        ("sqlite_busy_timeout_ms", ctypes.c_uint64),
        ("etcd_user", ctypes.c_char_p),
        ("etcd_user_len", ctypes.c_size_t),
        ("etcd_password", ctypes.c_char_p),
        ("etcd_password_len", ctypes.c_size_t),
        ("redis_url", ctypes.c_char_p),
        ("redis_url_len", ctypes.c_size_t),
        ("redis_client_name", ctypes.c_char_p),
        ("redis_client_name_len", ctypes.c_size_t),
        ("redis_protocol", ctypes.c_uint32),
        ("redis_connect_timeout_ms", ctypes.c_uint32),
        ("redis_request_timeout_ms", ctypes.c_uint64),
    ]


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


class lh_event(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_uint32),
        ("reason", ctypes.c_uint32),
        ("lease_id", ctypes.c_uint64),
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


# The engine's counters (the first struct, up to time_clamped, is LH_COUNTERS_V1_SIZE bytes).
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

# Counters the C struct gained after its first version (it grows at the end only): the
# release outcomes, then the backend protocol's.
COUNTER_FIELDS_ADDED = (
    "renewals_requested",
    "releases_confirmed",
    "releases_not_owner",
    "releases_unconfirmed",
    "releases_lost",
)

BACKEND_COUNTER_FIELDS = (
    "backend_requests",
    "backend_error_replies",
    "backend_garbage_replies",
    "backend_stale_replies",
    "backend_transport_failures",
    "backend_wakeups",
    "backend_ignored_messages",
    "redis_script_calls",
    "redis_noscript_retries",
    "redis_local_refusals",
    "redis_standby_takeovers",
    "redis_subscriptions",
    "redis_subscriber_losses",
    "redis_subscribed",
    "sql_migrations",
    "sql_database_errors",
    "etcd_leases_granted",
    "etcd_txns",
    "etcd_watches",
    "etcd_waiting_keepalives",
    "etcd_waiters_expired",
)

# The Redis stream kind's connections (LH_BACKEND_REDIS_STREAM; 0 for the other kinds).
STREAM_COUNTER_FIELDS = (
    "stream_opens",
    "stream_closes",
    "stream_late_answers",
    "sentinel_lookups",
    "cluster_refreshes",
    "cluster_redirects",
)

ALL_COUNTER_FIELDS = COUNTER_FIELDS + COUNTER_FIELDS_ADDED + BACKEND_COUNTER_FIELDS + STREAM_COUNTER_FIELDS


class lh_counters(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("_reserved", ctypes.c_uint32)] + [
        (f, ctypes.c_uint64) for f in ALL_COUNTER_FIELDS
    ]


# ---- requests and answers ---------------------------------------------------------------------
class lh_bytes(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("len", ctypes.c_size_t)]


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


class lh_io_request(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint64),
        ("kind", ctypes.c_uint32),
        ("connection", ctypes.c_uint32),
        ("argv", ctypes.POINTER(lh_bytes)),
        ("argc", ctypes.c_uint32),
        ("nstatements", ctypes.c_uint32),
        ("statements", ctypes.POINTER(lh_sql_statement)),
        ("params", ctypes.POINTER(lh_value)),
        ("nparams", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("data_len", ctypes.c_size_t),
        ("method", ctypes.c_char_p),
        ("path", ctypes.c_char_p),
        ("authorization", ctypes.c_char_p),
        ("stream", ctypes.c_uint64),
        ("deadline", ctypes.c_uint64),
        ("host", ctypes.c_char_p),
        ("unix_path", ctypes.c_char_p),
        ("server_name", ctypes.c_char_p),
        ("port", ctypes.c_uint32),
        ("tls", ctypes.c_uint32),
    ]


class lh_drained(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("request", ctypes.c_uint32),
        ("nevents", ctypes.c_uint32),
        ("more_events", ctypes.c_uint32),
        ("deadline_ns", ctypes.c_uint64),
        ("more_requests", ctypes.c_uint32),
        ("_reserved", ctypes.c_uint32),
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


# ---- the memory service -----------------------------------------------------------------------
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


class lh_memory_answer(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("dropped", ctypes.c_uint32),
        ("values", ctypes.c_void_p),
        ("nvalues", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("data_len", ctypes.c_size_t),
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


class lh_memory_faults(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("drop_next_responses", ctypes.c_uint32),
        ("_reserved", ctypes.c_uint32),
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
