/*
 * leasehold.h -- C ABI of leasehold, a sans-IO distributed-lock lease client core.
 *
 * The library decides everything about lease timing (renewal, loss detection, backoff,
 * reentrancy, fencing) and speaks every backend's protocol; the host owns threads, clocks,
 * sockets and its database / HTTP clients. The host feeds inputs in and polls requests and
 * events out. No callbacks cross this ABI.
 *
 * CONVENTIONS
 *
 * Status codes. Every fallible function returns an lh_status (uint32_t): LH_OK (0) or an
 *   LH_ERR_* code. Values are never renumbered or reused. lh_status_str() names any code.
 *   Errors are caller misuse only and leave the client unchanged; service and network faults
 *   are never errors: they are inputs (outcomes) that become events.
 *   A detail message of the last error is kept per handle (never thread-local):
 *   lh_client_last_error(c), valid until the next call on that handle. lh_client_new() has
 *   no handle yet to hold one: lh_client_new_check() on the same arguments returns the same
 *   status and copies the reason (a unix:// URL without an absolute path, a notifications
 *   value that is not 0 or 1, ...) into the caller's buffer, cut like snprintf.
 *
 * Arguments. NULL pointers, invalid UTF-8, oversized lengths, unknown enum values and flag
 *   bits (taken in as uint32_t), too-small struct_size fields and unknown lease ids are
 *   errors, never undefined behaviour. Names are UTF-8 byte strings with an explicit length
 *   (no NUL terminator needed; an embedded NUL is an error). Answers for unknown or already
 *   answered request ids are not errors: they are counted (backend_stale_replies) and
 *   ignored.
 *   Out-parameters are written only when LH_OK is returned (lh_client_new_check's reason
 *   excepted: its status is the verdict). Non-NULL pointers must point to
 *   valid, suitably aligned memory of the documented size (the library cannot check that).
 *
 * Ownership and lifetimes. The library allocates and frees every handle: lh_client_new()
 *   creates one, lh_client_free() destroys it (NULL allowed; double free is undefined).
 *   Input buffers are read during the call and never retained. Pointers the library returns
 *   inside an lh_io_request, an lh_lock_status or an lh_memory_answer and from
 *   lh_client_last_error() / lh_backend_last_error() are BORROWED: they point into the handle and stay valid until the next call on that handle
 *   (copy what you keep). A borrowed buffer of length 0 is NULL. Strings from lh_version()
 *   and lh_status_str() are static.
 *   No output ever needs to be freed by the caller.
 *
 * Thread safety. A handle is not thread-safe: one thread at a time (hosts guard each handle
 *   with a mutex; moving a handle between threads is fine). Different handles are
 *   independent and may be used concurrently. Functions without a handle are thread-safe.
 *
 * Panics. Every function runs inside a panic boundary. A panic returns LH_ERR_PANIC and
 *   poisons the handle: every later call on it returns LH_ERR_POISONED. Free it and create a
 *   new one.
 *
 * Time and randomness. Every input takes now: monotonic nanoseconds from an epoch the host
 *   chooses (CLOCK_MONOTONIC, steady_clock, time.monotonic_ns()). The library never reads a
 *   clock; a now older than one already seen is clamped. lh_client_new() takes a seed (32
 *   bytes of OS entropy in production, fixed bytes in tests); call lh_client_reseed() in a
 *   forked child.
 *
 * ONE SEAM FOR EVERY BACKEND
 *
 *   A client is created with its backend (lh_client_new with an lh_backend_options of kind
 *   LH_BACKEND_MEMORY, _REDIS, _REDIS_STREAM, _SQLITE, _POSTGRES or _ETCD) and speaks that
 *   backend's protocol itself: keys, scripts, statements, HTTP bodies, the meaning of every
 *   answer, the wait queue and the notifications. The host asks for the next piece of IO with one
 *   poll (lh_io_poll) and gets a tagged request; it runs it on its own client, unread, and
 *   hands back the answer with the function of that answer's kind. The same functions serve
 *   every backend; bindings/c/ is the reference host. Two kinds of requests: *calls* (a
 *   command, SQL statements, an HTTP request) the host's own client runs, and *streams*
 *   (LH_BACKEND_REDIS_STREAM: the core owns the Redis wire, from the handshake to the
 *   reconnects) on which the host only opens, writes, reads and closes sockets.
 *
 * THE RUN LOOP (one driver per handle)
 *
 *   for (;;) {
 *       lh_poll_timeout(c, &deadline);              // LH_NO_DEADLINE = none
 *       wait until the earliest of: deadline, an answer, a notification, an application
 *           call (acquire / renew / release / status);
 *       now = monotonic_ns();
 *       feed exactly that one input:
 *           lh_timeout(c, now) |
 *           lh_acquire / lh_renew / lh_release / lh_status_request |
 *           lh_io_reply(c, now, id, values, nvalues, data, data_len) |   // COMMAND, SQL
 *           lh_io_http_reply(c, now, id, status, body, body_len) |       // HTTP
 *           lh_io_stream_message(c, now, id, line, line_len) |           // HTTP_WATCH
 *           lh_io_failed(c, now, id, LH_FAILURE_*, msg, len) |           // no answer
 *           lh_io_message(c, now, channel, len, payload, len) |          // notification
 *           lh_io_connection(c, now, LH_CONNECTION_*, LH_CONNECTION_REOPENED /
 *               _SUBSCRIBED / _UNSUBSCRIBED, channel, len) |
 *           lh_io_opened(c, now, stream) | lh_io_received(c, now, stream, bytes, len) |
 *           lh_io_closed(c, now, stream, reason, len);                   // streams
 *       do {                                         // drain requests completely
 *           lh_io_poll(c, &req);                     // req.kind == LH_IO_NONE: none left
 *           run it asynchronously (never block the loop on the network), answer req.id:
 *           LH_IO_COMMAND: run argv[0..argc] verbatim on req.connection (Redis:
 *               LH_CONNECTION_COMMANDS or the subscriber, LH_CONNECTION_NOTIFY; memory:
 *               lh_memory_service_call) -> lh_io_reply, or lh_io_failed;
 *           LH_IO_SQL: on req.connection, read the host facts once (LH_PARAM_HOST_*); for
 *               each of the req.nstatements statements in order: prepare data[sql_offset ..
 *               +sql_len], bind params[first_param .. +nparams] (?1.. / $1..), run it, keep
 *               its rows; on the first error stop, ROLLBACK if a transaction is open and
 *               answer lh_io_failed (LH_FAILURE_DATABASE; LH_FAILURE_TRANSPORT when the
 *               connection broke); else lh_io_reply with every statement's rows;
 *           LH_IO_HTTP: POST data (Content-Type: application/json, Authorization:
 *               req.authorization unless empty) to member_url + req.path, trying the next
 *               member on a connection failure -> lh_io_http_reply, or lh_io_failed;
 *           LH_IO_HTTP_WATCH: the same, keeping the response open: each newline-delimited
 *               message -> lh_io_stream_message; its end or failure -> lh_io_failed;
 *           LH_IO_HTTP_CANCEL: close the stream of watch req.id (no answer);
 *           LH_IO_OPEN: connect req.stream to req.host:req.port (TLS with req.server_name
 *               when req.tls) or to req.unix_path, giving up at req.deadline ->
 *               lh_io_opened, or lh_io_closed with the reason; then every read on it ->
 *               lh_io_received (any split), its end or a failed read/write -> lh_io_closed;
 *           LH_IO_WRITE: write data[0..data_len] on req.stream after earlier writes;
 *           LH_IO_SHUTDOWN: close req.stream (no answer; later reads are ignored);
 *       } while (req.kind != LH_IO_NONE);
 *       do {                                         // then drain events completely
 *           lh_poll_event(c, &ev);
 *           LH_EVENT_ACQUIRED/ACQUIRE_FAILED/LOST/RELEASED: complete the application's call
 *               or signal the loss (each lease gets exactly one terminal event);
 *           LH_EVENT_RENEWED / RELEASE_OUTCOME: complete an lh_renew / a reported release.
 *       } while (ev.kind != LH_EVENT_NONE);
 *   }
 *
 *   lh_drain(c, &req, events, cap, &out) is the same drain in one call where crossings cost
 *   (ctypes, cgo): the next request, up to cap events and the next deadline; repeat while
 *   out.more_requests or out.more_events, and keep the last call's out.deadline_ns.
 *   lh_io_received_drain(c, now, s, bytes, len, &req, events, cap, &out) feeds bytes read
 *   and makes that drain's first call in one crossing (refused bytes drain nothing).
 *
 *   Values (answers to COMMAND and SQL) cross as a flat list of lh_value in pre-order (an
 *   LH_VALUE_ARRAY of len n is followed by its n elements, recursively) plus ONE data
 *   buffer: string values are offset/len into it. There are no pointers inside lh_value, so
 *   Go passes its own slices through cgo and ctypes / C++ build the list without a copy per
 *   value. SQL rows: an LH_VALUE_ARRAY per statement, of rows, each an LH_VALUE_ARRAY of
 *   columns (NIL, INT with booleans as 0/1, FLOAT, TEXT, BULK for blobs).
 *
 *   Notifications: a Redis pub/sub message on the subscriber, a PostgreSQL NOTIFY on the
 *   listener, a memory-service release (lh_memory_service_poll_released after each call:
 *   channel = the name) all go to lh_io_message; the protocol ignores what is not its own.
 *   Redis: the first request is the SUBSCRIBE of the client's wake channel; report its
 *   confirmation with LH_CONNECTION_SUBSCRIBED, and when the subscriber connection drops,
 *   LH_CONNECTION_UNSUBSCRIBED for every subscribed channel; the handle asks again. SQL:
 *   when a connection is opened anew (a restart; a SQLite file at the path replaced:
 *   compare device and inode before each request), report LH_CONNECTION_REOPENED; the
 *   schema is checked again and the listener LISTENs again. etcd: with a user in the
 *   options the first request authenticates; call lh_io_close before freeing the handle to
 *   revoke its leases.
 *
 *   A database error, an error reply, a non-200 status, a malformed answer or a broken
 *   connection are transport errors for the engine, never grants. lh_backend_last_error
 *   says what the backend said last; lh_counters_get counts the engine's and the backend
 *   protocol's work in one struct.
 *
 * THE LEASE LIFECYCLE FROM THE APPLICATION'S SIDE
 *
 *   Manual renewal: lh_renew(c, now, lease) sends a RENEW now (or joins the one in flight);
 *     the application's call completes on LH_EVENT_RENEWED (new valid_until_ns) or on the
 *     lease's LOST. On a released, lost or failed lease it returns LH_ERR_LEASE_ENDED and
 *     sends nothing (terminal states are sticky); on a lease still acquiring,
 *     LH_ERR_NOT_GRANTED. A lease acquired with LH_ACQUIRE_NO_AUTO_RENEW is renewed only
 *     this way and is LOST (LH_REASON_EXPIRED) when its validity ends unless renewed.
 *   Release outcome: lh_release(c, now, lease, &releasing) tells at once whether the lease
 *     ended RELEASED (LH_RELEASING_PENDING: an LH_EVENT_RELEASE_OUTCOME event follows with
 *     reason LH_REASON_RELEASE_CONFIRMED, _NOT_OWNER -- the service refused, someone else
 *     may hold the lock -- or _UNCONFIRMED -- no answer before the grant ran out) or, its
 *     validity having run out before the release was processed (a paused process), LOST
 *     (LH_RELEASING_LOST; the LOST event carries the reason). With out_releasing NULL the
 *     call does the same without the report.
 *   Renewal failure budget (lh_config.fail_budget): 0, the default, is a time budget:
 *     renewals failing in transport are retried with backoff while validity remains; the
 *     lease is LOST on a rejection, with LH_REASON_FAIL_BUDGET when its validity is about
 *     to end without a confirmed renewal, or with LH_REASON_EXPIRED at valid_until if a
 *     renewal is still unanswered then: never after valid_until. N > 0 is a count budget
 *     instead: LOST (LH_REASON_FAIL_BUDGET) after N consecutive failures.
 *
 *   The fencing token (LH_EVENT_ACQUIRED, lh_fencing_token) is the only authority for a
 *   protected resource; lh_is_held() is advice for stopping work early.
 *   On close, keep driving the loop (bounded) until lh_counters_get().pending_cleanups == 0.
 *
 * THE MEMORY SERVICE (lh_memory_service_*)
 *
 *   An in-process reference lock service with fault switches (test hooks, below), for tests
 *   and examples in every binding. It is not a lock across processes. One
 *   lh_memory_service is "the server"; each client gets a connection
 *   (lh_memory_service_connect) with its own fault switches (lh_memory_service_set_faults:
 *   reject, drop requests, drop responses, partition), its watches and its queue of release
 *   notifications. The service's clock is the host's now plus every
 *   lh_memory_service_step_clock. A memory-backend client is driven by the same loop:
 *
 *       LH_IO_COMMAND -> lh_memory_service_call(svc, conn, now, req.argv, req.argc, &a)
 *                     -> a.dropped ? lh_io_failed(c, now, req.id, LH_FAILURE_TRANSPORT, ..)
 *                                  : lh_io_reply(c, now, req.id, a.values, a.nvalues,
 *                                                a.data, a.data_len)
 *       then lh_memory_service_poll_released(svc, conn, &name, &len) until NULL
 *                     -> lh_io_message(c, now, name, len, NULL, 0)
 *
 *   Delays and hangs are the host's: the service never waits.
 *
 * TEST HOOKS (LH_TESTING)
 *
 *   lh_client_debug_panic, lh_memory_service_debug_panic and the memory service's fault
 *   switches (lh_memory_service_set_faults / _get_faults / _step_clock / _forget) exist only
 *   in a library built with `cargo build --release --features testing`, which the bindings'
 *   test suites use; release builds (cargo build --release, the Python wheel,
 *   scripts/install-lib.sh) do not export them. This header declares them only when the host
 *   defines LH_TESTING; the lh_memory_faults type and its LH_MEMORY_* flags are always there.
 */

#ifndef LEASEHOLD_H
#define LEASEHOLD_H

/* Generated by cbindgen 0.29.0 from src/ffi/ with cbindgen.toml. Do not edit by hand;
 * regenerate with the command at the top of cbindgen.toml (scripts/check-header.sh verifies). */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** Library version (Cargo.toml), also returned by lh_version(). */
#define LH_VERSION "0.1.0"


/**
 * Success.
 */
#define LH_OK 0

/**
 * A required pointer argument was NULL (or NULL with a non-zero length).
 */
#define LH_ERR_NULL_ARGUMENT 1

/**
 * A name was not valid UTF-8.
 */
#define LH_ERR_INVALID_UTF8 2

/**
 * A name was empty.
 */
#define LH_ERR_EMPTY_NAME 3

/**
 * A name was longer than `LH_MAX_NAME_LEN` bytes.
 */
#define LH_ERR_NAME_TOO_LONG 4

/**
 * A name contained a NUL byte.
 */
#define LH_ERR_NAME_HAS_NUL 5

/**
 * A TTL was zero, too short for the renew cadence and margins, or above `max_ttl_ms`.
 */
#define LH_ERR_INVALID_TTL 6

/**
 * A configuration value was out of range (also: a seed longer than `LH_MAX_SEED_LEN`).
 */
#define LH_ERR_INVALID_CONFIG 7

/**
 * A seed was shorter than `LH_MIN_SEED_LEN` bytes.
 */
#define LH_ERR_SEED_TOO_SHORT 8

/**
 * A lease id was never issued by this client.
 */
#define LH_ERR_UNKNOWN_LEASE 9

/**
 * A lease id names a lease that has already ended (released, lost, failed).
 */
#define LH_ERR_LEASE_ENDED 10

/**
 * The client already holds `max_leases` live lease records.
 */
#define LH_ERR_TOO_MANY_LEASES 11

/**
 * An enum value or flag bit passed in is not one this library knows.
 */
#define LH_ERR_INVALID_ENUM 12

/**
 * Retired with the engine-command results of ABI 2 (never reused).
 */
#define LH_ERR_BACKEND_DATA_TOO_LONG 13

/**
 * A caller-provided buffer was too small (the needed size is reported where documented).
 */
#define LH_ERR_BUFFER_TOO_SMALL 14

/**
 * The fencing token or validity was asked for a lease that was never granted.
 */
#define LH_ERR_NOT_GRANTED 15

/**
 * The `struct_size` field of a struct passed in is smaller than this library's struct.
 */
#define LH_ERR_STRUCT_SIZE 16

/**
 * An answer or message passed in is malformed (`lh_value` list inconsistent, offsets
 * outside the data, unknown kinds, an HTTP status outside 100..=599) or over the limits
 * (`LH_MAX_REPLY_*`); nothing changed: report the request with `lh_io_failed`.
 */
#define LH_ERR_INVALID_REPLY 17

/**
 * The call needs a backend the handle does not have (kept for hosts built against older
 * headers; `lh_client_new` always attaches one).
 */
#define LH_ERR_NO_BACKEND 18

/**
 * An ownership token passed to the memory service was empty or longer than
 * `LH_MEMORY_MAX_TOKEN_LEN` bytes.
 */
#define LH_ERR_INVALID_TOKEN 19

/**
 * A memory-service connection id was never issued by that service, or was disconnected; or
 * a stream id this client never handed out in an `LH_IO_OPEN`.
 */
#define LH_ERR_UNKNOWN_CONNECTION 20

/**
 * A memory-service limit was reached (connections, watches per connection).
 */
#define LH_ERR_LIMIT_REACHED 21

/**
 * The answer's kind does not fit the handle's backend (an HTTP reply on a Redis handle, a
 * message on an etcd handle); nothing changed.
 */
#define LH_ERR_WRONG_ANSWER 22

/**
 * A panic was caught inside the library; the handle is now poisoned.
 */
#define LH_ERR_PANIC 900

/**
 * The handle was poisoned by an earlier panic; only `lh_client_free` is still meaningful.
 */
#define LH_ERR_POISONED 901

/**
 * `lh_event.kind`: nothing left to poll. (Values 1 to 5 named engine commands before the
 * seam; they are never reused.)
 */
#define LH_EVENT_NONE 0

/**
 * The lease is held (lease_id, fencing_token, valid_until_ns).
 */
#define LH_EVENT_ACQUIRED 6

/**
 * Terminal: the acquire did not succeed (lease_id, reason).
 */
#define LH_EVENT_ACQUIRE_FAILED 7

/**
 * Terminal: a held lease was lost (lease_id, reason).
 */
#define LH_EVENT_LOST 8

/**
 * Terminal: the lease was released by the application (lease_id).
 */
#define LH_EVENT_RELEASED 9

/**
 * A renewal asked for with `lh_renew` was confirmed (lease_id, valid_until_ns). Only hosts
 * that call `lh_renew` ever see it; automatic renewals are silent.
 */
#define LH_EVENT_RENEWED 10

/**
 * The service's answer to a release whose disposition was asked for (`lh_release` with a
 * non-NULL `out_releasing`; lease_id; reason `LH_REASON_RELEASE_CONFIRMED`, `_NOT_OWNER` or
 * `_UNCONFIRMED`). Not a lifecycle event: it follows RELEASED.
 */
#define LH_EVENT_RELEASE_OUTCOME 11

/**
 * `lh_event.reason`: no reason (every event kind except ACQUIRE_FAILED, LOST and
 * RELEASE_OUTCOME).
 */
#define LH_REASON_NONE 0

/**
 * ACQUIRE_FAILED: the wait budget ran out while someone else held the lock.
 */
#define LH_REASON_WAIT_EXHAUSTED 1

/**
 * ACQUIRE_FAILED: the application released the lease while it was being acquired.
 */
#define LH_REASON_CANCELLED 2

/**
 * ACQUIRE_FAILED: the service could not be reached within the wait budget.
 */
#define LH_REASON_UNAVAILABLE 3

/**
 * LOST: the service rejected a renew (someone else owns the lock now).
 */
#define LH_REASON_REJECTED 4

/**
 * LOST: the validity window elapsed without a confirmed renewal.
 */
#define LH_REASON_EXPIRED 5

/**
 * LOST: the renewal failure budget ran out: under the default time budget
 * (`fail_budget = 0`) renewals kept failing until validity was about to end (declared
 * before valid_until, never after); with `fail_budget = N > 0`, N consecutive failures.
 */
#define LH_REASON_FAIL_BUDGET 6

/**
 * RELEASE_OUTCOME: the service deleted our grant.
 */
#define LH_REASON_RELEASE_CONFIRMED 7

/**
 * RELEASE_OUTCOME: the service refused: our grant was no longer there (expired, or someone
 * else holds the lock now).
 */
#define LH_REASON_RELEASE_NOT_OWNER 8

/**
 * RELEASE_OUTCOME: no answer before the grant's TTL had certainly run out (it is gone).
 */
#define LH_REASON_RELEASE_UNCONFIRMED 9

/**
 * `lh_release` disposition: other reentrant holders remain; nothing was sent.
 */
#define LH_RELEASING_HOLDER_LEFT 1

/**
 * `lh_release` disposition: the lease ended RELEASED (event queued) and a RELEASE
 * command was sent; a RELEASE_OUTCOME event follows with the service's answer.
 */
#define LH_RELEASING_PENDING 2

/**
 * `lh_release` disposition: the lease's validity had run out before the release
 * (a paused process): it ended LOST, and its LOST event, with the reason, is queued.
 */
#define LH_RELEASING_LOST 3

/**
 * `lh_release` disposition: the lease was never granted; it ended ACQUIRE_FAILED.
 */
#define LH_RELEASING_NOT_ACQUIRED 4

/**
 * Lease state: an acquire is in progress.
 */
#define LH_STATE_ACQUIRING 1

/**
 * Lease state: granted and believed valid.
 */
#define LH_STATE_HELD 2

/**
 * Lease state (terminal): released by the application.
 */
#define LH_STATE_RELEASED 3

/**
 * Lease state (terminal): lost after a grant.
 */
#define LH_STATE_LOST 4

/**
 * Lease state (terminal): never granted.
 */
#define LH_STATE_ACQUIRE_FAILED 5

/**
 * `lh_poll_timeout`: the core has no deadline; wait for other inputs only.
 */
#define LH_NO_DEADLINE UINT64_MAX

/**
 * `lh_acquire_options.flags` bit: in-process reentrant acquire.
 */
#define LH_ACQUIRE_REENTRANT 1

/**
 * `lh_acquire_options.flags` bit: no automatic renewal; only `lh_renew` extends the lease,
 * which is lost (EXPIRED) when its validity ends unless renewed.
 */
#define LH_ACQUIRE_NO_AUTO_RENEW 2

/**
 * Default requested TTL of `lh_acquire_options_default`, in ms.
 */
#define LH_DEFAULT_TTL_MS 30000

/**
 * Longest accepted name in bytes (equals the core's `MAX_NAME_LEN`).
 */
#define LH_MAX_NAME_LEN 512

/**
 * Shortest accepted seed in bytes (equals the core's `MIN_SEED_LEN`).
 */
#define LH_MIN_SEED_LEN 16

/**
 * Longest accepted seed in bytes: bounds how far the library reads from a seed pointer, so a
 * garbage length is an error instead of an out-of-bounds read of gigabytes.
 */
#define LH_MAX_SEED_LEN 1024

/**
 * ABI version; bumped on any incompatible change. Wrappers compare it with `lh_abi_version()`
 * at load time.
 */
#define LH_ABI_VERSION 4

/**
 * Size of the first `lh_counters` (up to `time_clamped`): the smallest `struct_size`
 * `lh_counters_get` accepts.
 */
#define LH_COUNTERS_V1_SIZE 120

/**
 * `lh_backend_options.kind`: the in-process memory service (`lh_memory_service_*`).
 */
#define LH_BACKEND_MEMORY 1

/**
 * `lh_backend_options.kind`: Redis (single server, Sentinel, Cluster).
 */
#define LH_BACKEND_REDIS 2

/**
 * `lh_backend_options.kind`: SQLite (one file shared by the processes of one host).
 */
#define LH_BACKEND_SQLITE 3

/**
 * `lh_backend_options.kind`: PostgreSQL.
 */
#define LH_BACKEND_POSTGRES 4

/**
 * `lh_backend_options.kind`: etcd v3 through its JSON gateway.
 */
#define LH_BACKEND_ETCD 5

/**
 * `lh_backend_options.kind`: Redis with the connections in the core (the *stream* kind of
 * the seam): the client asks for `LH_IO_OPEN` / `LH_IO_WRITE` / `LH_IO_SHUTDOWN` to the
 * endpoint of `redis_url` (for a Sentinel URL: the sentinels, then the master they name)
 * and speaks RESP itself; the host only moves bytes. The `redis_*` tunables apply as for
 * `LH_BACKEND_REDIS`.
 */
#define LH_BACKEND_REDIS_STREAM 6

/**
 * `lh_backend_options.redis_protocol`: `AUTH` + `SELECT` + `CLIENT SETNAME` only (servers
 * before Redis 6).
 */
#define LH_REDIS_PROTOCOL_LEGACY 1

/**
 * `lh_backend_options.redis_protocol`: `HELLO 2`, falling back to the legacy handshake.
 */
#define LH_REDIS_PROTOCOL_RESP2 2

/**
 * `lh_backend_options.redis_protocol`: `HELLO 3`, falling back to `HELLO 2`, then to the
 * legacy handshake (the default).
 */
#define LH_REDIS_PROTOCOL_RESP3 3

/**
 * Size of the first `lh_drained` (up to `deadline_ns`): the smallest `struct_size`
 * `lh_drain` accepts.
 */
#define LH_DRAINED_V1_SIZE 24

/**
 * `lh_io_request.kind`: nothing left to poll.
 */
#define LH_IO_NONE 0

/**
 * Run the command `argv` on `connection` (Redis: verbatim on that connection; memory: hand
 * the request to `lh_memory_service_call`). Answer with `lh_io_reply` or `lh_io_failed`; a
 * SUBSCRIBE is answered by its confirmation through `lh_io_connection`.
 */
#define LH_IO_COMMAND 1

/**
 * Run the statements in order on `connection`, in autocommit mode (transaction control is
 * part of the list). Answer with `lh_io_reply` (one array per statement, of rows, of
 * columns) or `lh_io_failed`.
 */
#define LH_IO_SQL 2

/**
 * Send the HTTP request to any cluster member and read the whole reply. Answer with
 * `lh_io_http_reply` or `lh_io_failed`.
 */
#define LH_IO_HTTP 3

/**
 * Send the HTTP request and keep the response open: pass each newline-delimited message to
 * `lh_io_stream_message`; when the stream ends or breaks, `lh_io_failed` with its id.
 */
#define LH_IO_HTTP_WATCH 4

/**
 * Close the watch stream `id` (no answer).
 */
#define LH_IO_HTTP_CANCEL 5

/**
 * Open stream `stream` (the core owns the wire: Redis on the stream path) to `host`:`port`
 * over TCP, or to the Unix socket `unix_path`; with `tls` 1, wrap it in TLS and verify the
 * server's certificate against `server_name`. Give up at `deadline` (ns, the clock of `now`).
 * Answer with `lh_io_opened`, or `lh_io_closed` if it failed; then pass every byte read on
 * it to `lh_io_received` and its end to `lh_io_closed`.
 */
#define LH_IO_OPEN 6

/**
 * Write `data`/`data_len` on `stream`, after the bytes of earlier writes (no answer; a
 * write that fails is the stream's end: `lh_io_closed`).
 */
#define LH_IO_WRITE 7

/**
 * Close `stream` (no answer; bytes or a close still reported for it are ignored).
 */
#define LH_IO_SHUTDOWN 8

/**
 * `lh_io_request.connection`: the ordinary connection.
 */
#define LH_CONNECTION_COMMANDS 1

/**
 * `lh_io_request.connection`: the connection notifications arrive on (the Redis subscriber,
 * the PostgreSQL listener).
 */
#define LH_CONNECTION_NOTIFY 2

/**
 * `lh_io_failed` kind: no answer came (connection refused, broken or timed out; the
 * outcome is unknown), or the memory service dropped the request.
 */
#define LH_FAILURE_TRANSPORT 1

/**
 * `lh_io_failed` kind: the database refused a statement (busy, read-only, corrupt,
 * missing table…) and the transaction was rolled back (SQL only).
 */
#define LH_FAILURE_DATABASE 2

/**
 * `lh_io_connection` event: the connection was opened anew (after a failure or a restart of
 * the server, a replaced SQLite file, a reconnect to the memory service): what lived on the
 * old one is set up again.
 */
#define LH_CONNECTION_REOPENED 1

/**
 * `lh_io_connection` event: a SUBSCRIBE of `channel` took effect (its confirmation came).
 */
#define LH_CONNECTION_SUBSCRIBED 2

/**
 * `lh_io_connection` event: a subscription ended (its confirmation came), or the connection
 * carrying it was lost: report every subscribed channel.
 */
#define LH_CONNECTION_UNSUBSCRIBED 3

/**
 * Longest ownership token the memory service accepts, in bytes (the engine's are 32).
 */
#define LH_MEMORY_MAX_TOKEN_LEN 64

/**
 * `lh_memory_faults.flags`: acquires answer HELD_BY_OTHER (no hint) without looking.
 */
#define LH_MEMORY_REJECT_ACQUIRES 1

/**
 * `lh_memory_faults.flags`: renews answer REJECTED without looking (the lease is lost).
 */
#define LH_MEMORY_REJECT_RENEWALS 2

/**
 * `lh_memory_faults.flags`: releases answer NOT_OWNER without looking.
 */
#define LH_MEMORY_REJECT_RELEASES 4

/**
 * `lh_memory_faults.flags`: all three reject switches.
 */
#define LH_MEMORY_REJECT_ALL 7

/**
 * `lh_memory_faults.flags`: requests are lost before reaching the service (DROPPED).
 */
#define LH_MEMORY_DROP_REQUESTS 8

/**
 * `lh_memory_faults.flags`: requests are applied, then their answers lost (DROPPED).
 */
#define LH_MEMORY_DROP_RESPONSES 16

/**
 * `lh_memory_faults.flags`: cut off: requests are lost (DROPPED) and release notifications
 * for the connection are discarded.
 */
#define LH_MEMORY_PARTITIONED 32

/**
 * `lh_value.kind`: nil (null bulk string, null array, RESP3 null, SQL NULL).
 */
#define LH_VALUE_NIL 1

/**
 * `lh_value.kind`: integer (`integer`).
 */
#define LH_VALUE_INT 2

/**
 * `lh_value.kind`: bulk string or blob (`offset`, `len` into the data buffer).
 */
#define LH_VALUE_BULK 3

/**
 * `lh_value.kind`: simple string such as `OK` (`offset`, `len`).
 */
#define LH_VALUE_STATUS 4

/**
 * `lh_value.kind`: error reply, the message without `-` (`offset`, `len`).
 */
#define LH_VALUE_ERROR 5

/**
 * `lh_value.kind`: array of `len` elements, which follow it in the list (pre-order).
 */
#define LH_VALUE_ARRAY 6

/**
 * `lh_value.kind` of a column or parameter: UTF-8 text (`offset`, `len`).
 */
#define LH_VALUE_TEXT 7

/**
 * `lh_value.kind` of a column: a double, its IEEE-754 bits in `integer`. (None of the
 * protocol's statements return one; a float where a number belongs is an error.)
 */
#define LH_VALUE_FLOAT 8

/**
 * Parameter kind: bind the host's `CLOCK_MONOTONIC` in ns as an integer.
 */
#define LH_PARAM_HOST_MONOTONIC_NS 20

/**
 * Parameter kind: bind the host's wall clock in µs since the Unix epoch as an integer.
 */
#define LH_PARAM_HOST_WALL_US 21

/**
 * Parameter kind: bind the boot id (`/proc/sys/kernel/random/boot_id`, trimmed) as text.
 */
#define LH_PARAM_HOST_BOOT_ID 22

/**
 * Parameter kind: bind the executing process's id as an integer.
 */
#define LH_PARAM_HOST_PID 23

/**
 * Parameter kind: bind the host name as text.
 */
#define LH_PARAM_HOST_NAME 24

/**
 * Most values in one answer (`lh_io_reply` refuses more with `LH_ERR_INVALID_REPLY`).
 */
#define LH_MAX_REPLY_VALUES 4096

/**
 * Largest data buffer of one answer, and longest channel, payload, message or body, in bytes.
 */
#define LH_MAX_REPLY_DATA (1 << 20)

/**
 * Deepest array nesting accepted in an answer.
 */
#define LH_MAX_REPLY_DEPTH 16

/**
 * Opaque client handle: one core session plus the memory that borrowed outputs point into.
 *
 * Created by `lh_client_new` with one backend attached, destroyed by `lh_client_free`. Not thread-safe: one thread at a
 * time (hosts guard it with a mutex).
 */
typedef struct lh_client lh_client;

/**
 * Opaque memory-service handle: one in-process lock service, for tests and examples (it is
 * not a lock across processes). Created by `lh_memory_service_new`, destroyed by
 * `lh_memory_service_free`. Not thread-safe: one thread at a time.
 */
typedef struct lh_memory_service lh_memory_service;

/**
 * Status returned by every fallible function (`LH_OK` or one of `LH_ERR_*`).
 *
 * A plain `uint32_t` rather than a C enum so that the width is fixed for ctypes and cgo and so
 * that codes added later cannot be undefined behaviour in an older host.
 */
typedef uint32_t lh_status;

/**
 * The backend of a client and its options. Fill with `lh_backend_options_default`, then
 * change fields; fields of other backends are ignored.
 */
typedef struct lh_backend_options {
  /**
   * `sizeof(lh_backend_options)` as compiled by the caller.
   */
  uint32_t struct_size;
  /**
   * `LH_BACKEND_*`.
   */
  uint32_t kind;
  /**
   * Redis: how long a waiter told to stand by waits for "taken" before it tries (default
   * 150 ms): the longest a frozen waiter at the head of the queue keeps the lock free.
   */
  uint64_t redis_standby_delay_ms;
  /**
   * Redis: how long the fence and queue keys outlive the lease they serve (default 60000).
   */
  uint64_t redis_key_keep_ms;
  /**
   * Redis: queue entries older than this are dropped at a release (default 600000).
   */
  uint64_t redis_queue_max_age_ms;
  /**
   * Redis: how long a queued waiter behind the head waits before it asks again on its own
   * (default 10000): an idle waiter's cost is one script call per this interval.
   */
  uint64_t redis_idle_recheck_ms;
  /**
   * Redis Cluster, 0 or 1 (default 0): wake-ups go on one shard channel per name,
   * `lh:{NAME}:wake`, with SPUBLISH (Redis 7+), and the client asks for `SSUBSCRIBE` /
   * `SUNSUBSCRIBE` of a name's channel while it has leases waiting on it.
   */
  uint32_t redis_sharded_wake;
  /**
   * PostgreSQL, 0 or 1 (default 0): acquire, renew and release commit without waiting for
   * the WAL flush. Much faster on a server that flushes; a server crash may forget the
   * last moments' grants and releases (docs/backends.md).
   */
  uint32_t postgres_asynchronous_commit;
  /**
   * SQLite: `PRAGMA busy_timeout` (default 5000): a file that stays locked is a database
   * error after this long, never a hang.
   */
  uint64_t sqlite_busy_timeout_ms;
  /**
   * etcd: user name (UTF-8, at most 256 bytes, not NUL-terminated), NULL for none. With a
   * user the client authenticates first and every request carries the token.
   */
  const uint8_t *etcd_user;
  /**
   * Length of `etcd_user`.
   */
  size_t etcd_user_len;
  /**
   * etcd: password (UTF-8, at most 256 bytes), NULL when empty.
   */
  const uint8_t *etcd_password;
  /**
   * Length of `etcd_password`.
   */
  size_t etcd_password_len;
  /**
   * Redis stream: `redis://[user:pass@]host[:port][/db]`, `rediss://…` (TLS, the server
   * name is the host), `unix:///path[?db=N]` or
   * `redis+sentinel://[[user]:pass@]host:port[,host:port…]/MASTER[/db]` (the master the
   * sentinels name, followed across failovers; the credentials and database are the
   * Redis servers', the sentinels take none) (UTF-8, at most 4096 bytes, not
   * NUL-terminated; percent-escapes in the user, password and master name), or
   * `redis+cluster://[[user]:pass@]host:port[,host:port…]` / `rediss+cluster://…` (seed
   * nodes of a Redis Cluster: requests go to the master serving their slot, wake-ups are
   * sharded whatever `redis_sharded_wake` says). The fields from here on are new: a
   * host built against the header before them passes that smaller `struct_size` and gets
   * their defaults (it cannot ask for `LH_BACKEND_REDIS_STREAM`).
   */
  const uint8_t *redis_url;
  /**
   * Length of `redis_url`.
   */
  size_t redis_url_len;
  /**
   * Redis stream: `CLIENT SETNAME` of both connections (printable ASCII, no spaces, at
   * most 256 bytes), NULL for none.
   */
  const uint8_t *redis_client_name;
  /**
   * Length of `redis_client_name`.
   */
  size_t redis_client_name_len;
  /**
   * Redis stream: `LH_REDIS_PROTOCOL_*` the handshake asks for first (default RESP3).
   */
  uint32_t redis_protocol;
  /**
   * Redis stream: how long an `LH_IO_OPEN` may take (default 5000 ms).
   */
  uint32_t redis_connect_timeout_ms;
  /**
   * Redis stream: how long a command waits for its reply before the connection is
   * dropped and reopened (default 5000 ms).
   */
  uint64_t redis_request_timeout_ms;
} lh_backend_options;

/**
 * Client configuration. Fill it with `lh_config_default`, then change fields.
 *
 * `struct_size` comes first so that the struct can grow: the library reads only the fields it
 * knows and rejects a `struct_size` smaller than its own struct with `LH_ERR_STRUCT_SIZE`.
 */
typedef struct lh_config {
  /**
   * `sizeof(lh_config)` as compiled by the caller.
   */
  uint32_t struct_size;
  /**
   * Clock drift allowance in parts per million of the TTL (default 10000 = 1%).
   */
  uint32_t drift_ppm;
  /**
   * Fixed drift allowance in ns (default 2 ms).
   */
  uint64_t drift_fixed_ns;
  /**
   * Jitter of the renew cadence (TTL/3) in ppm (default 100000 = ±10%).
   */
  uint32_t renew_jitter_ppm;
  /**
   * Renewal failure budget. 0 (default): a time budget: transport failures are retried
   * with backoff while validity remains; the lease is lost on a rejection, or (FAIL_BUDGET)
   * when validity is about to end without a confirmed renewal, or (EXPIRED) at valid_until
   * with a renewal unanswered. N > 0: lost (FAIL_BUDGET) after N consecutive failures.
   */
  uint32_t fail_budget;
  /**
   * Timeout of each request in ns (renews use min(this, TTL/3); default 2 s).
   */
  uint64_t request_timeout_ns;
  /**
   * Base of the capped exponential acquire backoff in ns (default 5 ms).
   */
  uint64_t backoff_base_ns;
  /**
   * Cap of the acquire backoff in ns (default 500 ms).
   */
  uint64_t backoff_cap_ns;
  /**
   * Largest TTL accepted by `lh_acquire` in ms (default 7 days).
   */
  uint64_t max_ttl_ms;
  /**
   * Most live lease records (default 1048576).
   */
  uint32_t max_leases;
  /**
   * 1 (default) to let waiters sleep until the backend's release notification (Redis
   * pub/sub, PostgreSQL NOTIFY, etcd watches, the memory service's messages), 0 to make
   * them poll with capped backoff. Any other value is `LH_ERR_INVALID_CONFIG`.
   */
  uint32_t notifications;
} lh_config;

/**
 * Options of one `lh_acquire`. Fill with `lh_acquire_options_default`, then change fields.
 */
typedef struct lh_acquire_options {
  /**
   * `sizeof(lh_acquire_options)` as compiled by the caller.
   */
  uint32_t struct_size;
  /**
   * `LH_ACQUIRE_REENTRANT | LH_ACQUIRE_NO_AUTO_RENEW` bits or 0; unknown bits are
   * `LH_ERR_INVALID_ENUM`.
   */
  uint32_t flags;
  /**
   * Requested TTL in ms (default 30000).
   */
  uint64_t ttl_ms;
  /**
   * Wait budget in ns; 0 means one attempt (default 0).
   */
  uint64_t wait_ns;
} lh_acquire_options;

/**
 * One polled event for the application (`lh_poll_event`). Flat and union-free so that
 * ctypes and cgo mirror it field for field; fields that do not apply to `kind` are 0.
 */
typedef struct lh_event {
  /**
   * `LH_EVENT_*`.
   */
  uint32_t kind;
  /**
   * `LH_REASON_*` (ACQUIRE_FAILED, LOST, RELEASE_OUTCOME), else `LH_REASON_NONE`.
   */
  uint32_t reason;
  /**
   * The lease the event concerns (0 for NONE).
   */
  uint64_t lease_id;
  /**
   * Fencing token of the grant (ACQUIRED).
   */
  uint64_t fencing_token;
  /**
   * Monotonic ns until which the lease is valid (ACQUIRED, RENEWED).
   */
  uint64_t valid_until_ns;
} lh_event;

/**
 * Snapshot of one lease, filled by `lh_lease_info_get`.
 */
typedef struct lh_lease_info {
  /**
   * `sizeof(lh_lease_info)` as compiled by the caller; set to the library's size on return.
   */
  uint32_t struct_size;
  /**
   * `LH_STATE_*`.
   */
  uint32_t state;
  /**
   * Number of reentrant holders (1 for a plain lease).
   */
  uint32_t holders;
  /**
   * 1 if the lease was granted (then `fencing_token` is meaningful), else 0.
   */
  uint32_t has_token;
  /**
   * Fencing token of the grant, 0 if none.
   */
  uint64_t fencing_token;
  /**
   * Monotonic ns until which the lease is valid, 0 if not known.
   */
  uint64_t valid_until_ns;
} lh_lease_info;

/**
 * Counters of one client, filled by `lh_counters_get`.
 *
 * Grows at the end only: a caller compiled against an older header (a smaller
 * `struct_size`, at least `LH_COUNTERS_V1_SIZE`) gets the fields it knows.
 */
typedef struct lh_counters {
  /**
   * `sizeof(lh_counters)` as compiled by the caller; set to the library's size on return.
   */
  uint32_t struct_size;
  /**
   * Always 0; keeps the u64 fields 8-byte aligned.
   */
  uint32_t _reserved;
  /**
   * Gauge: lease records in the table (live plus those finishing cleanup).
   */
  uint64_t live_leases;
  /**
   * Gauge: leases whose release the core still wants confirmed (drive the loop until 0 on
   * close).
   */
  uint64_t pending_cleanups;
  /**
   * Acquire commands emitted.
   */
  uint64_t acquires_sent;
  /**
   * Grants received.
   */
  uint64_t grants;
  /**
   * Leases that ended in ACQUIRE_FAILED.
   */
  uint64_t acquire_failed;
  /**
   * Renew commands emitted.
   */
  uint64_t renewals_sent;
  /**
   * Renews confirmed.
   */
  uint64_t renewals_ok;
  /**
   * Renewals rejected, failed in transport or timed out.
   */
  uint64_t renewals_failed;
  /**
   * Release commands emitted (including cleanup retries).
   */
  uint64_t releases_sent;
  /**
   * Leases lost because the service rejected a renewal.
   */
  uint64_t lost_rejected;
  /**
   * Leases lost because validity elapsed.
   */
  uint64_t lost_expired;
  /**
   * Leases lost because the renew failure budget ran out.
   */
  uint64_t lost_fail_budget;
  /**
   * Results ignored as unknown, duplicate, superseded or of the wrong kind.
   */
  uint64_t stale_results;
  /**
   * Inputs whose `now` was older than one already seen (clamped).
   */
  uint64_t time_clamped;
  /**
   * `lh_renew` calls that sent or joined a renewal.
   */
  uint64_t renewals_requested;
  /**
   * Application releases the service confirmed.
   */
  uint64_t releases_confirmed;
  /**
   * Application releases the service refused (not owner).
   */
  uint64_t releases_not_owner;
  /**
   * Application releases never answered before the grant had certainly run out.
   */
  uint64_t releases_unconfirmed;
  /**
   * Releases that found the lease's validity run out: the lease ended LOST instead.
   */
  uint64_t releases_lost;
  /**
   * Backend protocol (every backend): requests emitted.
   */
  uint64_t backend_requests;
  /**
   * Error answers (Redis error replies, etcd error bodies or statuses, memory refusals).
   */
  uint64_t backend_error_replies;
  /**
   * Answers of a shape the request cannot have (a foreign table, a garbage reply).
   */
  uint64_t backend_garbage_replies;
  /**
   * Answers and failures for unknown or already answered request ids.
   */
  uint64_t backend_stale_replies;
  /**
   * Requests reported failed in transport.
   */
  uint64_t backend_transport_failures;
  /**
   * Release notifications that woke a waiting name.
   */
  uint64_t backend_wakeups;
  /**
   * Notifications and confirmations ignored (not for a name waited on here).
   */
  uint64_t backend_ignored_messages;
  /**
   * Redis: script calls emitted (EVALSHA and EVAL).
   */
  uint64_t redis_script_calls;
  /**
   * Redis: EVALSHAs re-sent as EVAL after NOSCRIPT.
   */
  uint64_t redis_noscript_retries;
  /**
   * Redis: retries answered without a round trip.
   */
  uint64_t redis_local_refusals;
  /**
   * Redis: standbys that tried after hearing nothing.
   */
  uint64_t redis_standby_takeovers;
  /**
   * Redis: times the subscription took effect.
   */
  uint64_t redis_subscriptions;
  /**
   * Redis: times the subscription was reported lost.
   */
  uint64_t redis_subscriber_losses;
  /**
   * Redis, gauge: 1 while the subscription is in effect.
   */
  uint64_t redis_subscribed;
  /**
   * SQL: schema migrations emitted.
   */
  uint64_t sql_migrations;
  /**
   * SQL: requests the database refused.
   */
  uint64_t sql_database_errors;
  /**
   * etcd: leases granted.
   */
  uint64_t etcd_leases_granted;
  /**
   * etcd: acquire transactions sent.
   */
  uint64_t etcd_txns;
  /**
   * etcd: watches opened on a predecessor.
   */
  uint64_t etcd_watches;
  /**
   * etcd: keep-alives sent for waiting leases.
   */
  uint64_t etcd_waiting_keepalives;
  /**
   * etcd: waiters whose etcd lease was gone (they rejoined the queue).
   */
  uint64_t etcd_waiters_expired;
  /**
   * Redis stream: connections asked for (`LH_IO_OPEN`), to the servers and the sentinels.
   */
  uint64_t stream_opens;
  /**
   * Redis stream: connections that ended (closed by the host or the server, or shut down
   * by the core).
   */
  uint64_t stream_closes;
  /**
   * Redis stream: host reports about connections already ended (ignored).
   */
  uint64_t stream_late_answers;
  /**
   * Redis stream: master lookups sent to a sentinel (a `redis+sentinel://` URL only).
   */
  uint64_t sentinel_lookups;
  /**
   * Redis stream: slot map questions (`CLUSTER SHARDS` / `CLUSTER SLOTS`) sent (a
   * `redis+cluster://` URL only): each follows a start, a redirect or a node that failed.
   */
  uint64_t cluster_refreshes;
  /**
   * Redis stream: `MOVED` and `ASK` redirections followed (a `redis+cluster://` URL only); a
   * steady count means the slot map is current.
   */
  uint64_t cluster_redirects;
} lh_counters;

/**
 * A borrowed byte string.
 */
typedef struct lh_bytes {
  /**
   * First byte (NULL only when `len` is 0).
   */
  const uint8_t *ptr;
  /**
   * Length in bytes.
   */
  size_t len;
} lh_bytes;

/**
 * One statement of an SQL request: its SQL text and its parameters.
 */
typedef struct lh_sql_statement {
  /**
   * Start of the SQL text in the request's data buffer (a NUL follows it).
   */
  uint64_t sql_offset;
  /**
   * Length of the SQL text in bytes, without the NUL.
   */
  uint64_t sql_len;
  /**
   * Index of the statement's first parameter in the request's `params`.
   */
  uint32_t first_param;
  /**
   * Number of parameters (`?1…`/`$1…` in order).
   */
  uint32_t nparams;
} lh_sql_statement;

/**
 * One value of a flat answer or parameter list. No pointers: strings are `offset`/`len`
 * into the data buffer passed beside the list.
 */
typedef struct lh_value {
  /**
   * `LH_VALUE_*` (or `LH_PARAM_HOST_*` for a parameter).
   */
  uint32_t kind;
  /**
   * Always 0.
   */
  uint32_t _reserved;
  /**
   * The integer of `LH_VALUE_INT` (the bits of `LH_VALUE_FLOAT`).
   */
  int64_t integer;
  /**
   * Start of a string value in the data buffer.
   */
  uint64_t offset;
  /**
   * Byte length of a string value, or element count of an array.
   */
  uint64_t len;
} lh_value;

/**
 * One polled request (`lh_io_poll`). Flat and union-free; the fields of other kinds are 0 /
 * NULL. Every pointer borrows the handle until the next call on it: copy or send before
 * calling in again.
 */
typedef struct lh_io_request {
  /**
   * Request id (never reused), 0 when nothing is left. OPEN, WRITE, SHUTDOWN: the stream id
   * (the same for every request on that stream; answers name the stream).
   */
  uint64_t id;
  /**
   * `LH_IO_*`.
   */
  uint32_t kind;
  /**
   * `LH_CONNECTION_*` (COMMAND, SQL).
   */
  uint32_t connection;
  /**
   * COMMAND: the arguments, command word first.
   */
  const struct lh_bytes *argv;
  /**
   * COMMAND: number of arguments.
   */
  uint32_t argc;
  /**
   * SQL: number of statements.
   */
  uint32_t nstatements;
  /**
   * SQL: the statements.
   */
  const struct lh_sql_statement *statements;
  /**
   * SQL: the parameters of all statements: NIL, INT, TEXT, BULK (a blob) with
   * `offset`/`len` into `data`, or `LH_PARAM_HOST_*` (facts the host binds: read them once
   * per request, when it starts executing it, and bind the same values wherever the kind
   * appears).
   */
  const struct lh_value *params;
  /**
   * SQL: number of parameters.
   */
  size_t nparams;
  /**
   * SQL: the bytes SQL texts and string parameters point into (each followed by a NUL not
   * counted in its length). HTTP: the JSON body (a NUL follows it, not counted).
   */
  const uint8_t *data;
  /**
   * Length of `data`.
   */
  size_t data_len;
  /**
   * HTTP, HTTP_WATCH: the method (`POST`), NUL-terminated (NULL for HTTP_CANCEL, like every
   * field a kind does not use).
   */
  const char *method;
  /**
   * HTTP: the path, NUL-terminated, appended to a member's base URL; any member serves any
   * request, so on a transport failure the host may try the next one before reporting.
   */
  const char *path;
  /**
   * HTTP: NUL-terminated; when not empty, send it as the `Authorization` header. Send
   * `Content-Type: application/json` too.
   */
  const char *authorization;
  /**
   * OPEN, WRITE, SHUTDOWN: the stream (never reused; `id` carries the same value).
   */
  uint64_t stream;
  /**
   * OPEN: when to give up connecting (ns, the clock of `now`).
   */
  uint64_t deadline;
  /**
   * OPEN over TCP: the host name or address, NUL-terminated (NULL for a Unix socket).
   */
  const char *host;
  /**
   * OPEN to a Unix socket: its path, NUL-terminated (NULL over TCP).
   */
  const char *unix_path;
  /**
   * OPEN with `tls` 1: the name to verify the certificate against (and send as SNI),
   * NUL-terminated.
   */
  const char *server_name;
  /**
   * OPEN over TCP: the port.
   */
  uint32_t port;
  /**
   * OPEN: 1 to wrap the stream in TLS, else 0.
   */
  uint32_t tls;
} lh_io_request;

/**
 * What one `lh_drain` call took out. Fill `struct_size`; the rest is written (up to
 * `struct_size`: a host built against the first struct, which ends at `deadline_ns`, gets
 * that much and calls again while `request` is 1).
 */
typedef struct lh_drained {
  /**
   * `sizeof(lh_drained)` as compiled by the caller; written back as the size written.
   */
  uint32_t struct_size;
  /**
   * 1 when `*request` holds a request, 0 when none is left (`request->kind ==
   * LH_IO_NONE`) or `request` was NULL.
   */
  uint32_t request;
  /**
   * Events written to `events`, in order.
   */
  uint32_t nevents;
  /**
   * 1 when `events` was filled to its capacity (more may be pending: call again).
   */
  uint32_t more_events;
  /**
   * The next deadline (`LH_NO_DEADLINE`: none), as `lh_poll_timeout` gives it, on the
   * call that ends a drain (`more_requests` and `more_events` both 0). A call that sets
   * either leaves the deadline to the next call and writes `LH_NO_DEADLINE` here: what is
   * still to take can move it.
   */
  uint64_t deadline_ns;
  /**
   * 1 when another request may be pending: run this one, then call again. 0 when none
   * is: the drain ends with this call (given `more_events` is 0). It may say 1 and the
   * next call find none (what the engine still has to say can but need not make one).
   */
  uint32_t more_requests;
  /**
   * Zero.
   */
  uint32_t _reserved;
} lh_drained;

/**
 * Limits of a memory service. Fill with `lh_memory_config_default`, then change fields;
 * every field is 1 to 2^24 (else `LH_ERR_INVALID_CONFIG`).
 */
typedef struct lh_memory_config {
  /**
   * `sizeof(lh_memory_config)` as compiled by the caller.
   */
  uint32_t struct_size;
  /**
   * Most names with a record (default 65536); free and expired records are reclaimed when
   * it is reached, and an acquire of a new name answers FULL (a transport error for the
   * client) if none is.
   */
  uint32_t max_names;
  /**
   * Most open connections (default 1024).
   */
  uint32_t max_connections;
  /**
   * Most names one connection watches (default 4096).
   */
  uint32_t max_watches;
  /**
   * Most release notifications queued per connection (default 1024); later ones are
   * discarded and counted.
   */
  uint32_t max_pending;
} lh_memory_config;

/**
 * The answer of `lh_memory_service_call`, in the flat value format `lh_io_reply` takes.
 * The pointers borrow the service handle until the next call on it.
 */
typedef struct lh_memory_answer {
  /**
   * `sizeof(lh_memory_answer)` as compiled by the caller; set to the library's size.
   */
  uint32_t struct_size;
  /**
   * 1 when the request or its answer was lost (fault switches, partition): report the
   * request to the client with `lh_io_failed` (`LH_FAILURE_TRANSPORT`); the values are
   * then empty.
   */
  uint32_t dropped;
  /**
   * The answer's values in pre-order.
   */
  const struct lh_value *values;
  /**
   * Number of values.
   */
  size_t nvalues;
  /**
   * The bytes string values point into.
   */
  const uint8_t *data;
  /**
   * Length of `data`.
   */
  size_t data_len;
} lh_memory_answer;

/**
 * What the service says about one name (`lh_memory_service_status`).
 */
typedef struct lh_memory_status {
  /**
   * `sizeof(lh_memory_status)` as compiled by the caller; set to the library's size on return.
   */
  uint32_t struct_size;
  /**
   * 1 while an unexpired grant exists, else 0 (then the holder fields are 0).
   */
  uint32_t held;
  /**
   * The holder's fencing token.
   */
  uint64_t fencing_token;
  /**
   * The holder's remaining TTL in ms, rounded up.
   */
  uint64_t remaining_ttl_ms;
  /**
   * Service time of the holder's expiry, ns.
   */
  uint64_t expires_at_ns;
  /**
   * Time since the grant on the service's clock, ns.
   */
  uint64_t held_for_ns;
  /**
   * Connection that acquired it.
   */
  uint64_t holder_connection;
  /**
   * Highest fencing token issued for the name; 0 if never (or its record was reclaimed).
   */
  uint64_t last_fencing_token;
  /**
   * The service's clock when it looked, ns (the host's `now` plus every clock step).
   */
  uint64_t service_now_ns;
  /**
   * Length of `holder_token`.
   */
  uint32_t holder_token_len;
  /**
   * Connections watching the name (held or not).
   */
  uint32_t watchers;
  /**
   * The holder's ownership token (its first `holder_token_len` bytes), not NUL-terminated.
   */
  uint8_t holder_token[LH_MEMORY_MAX_TOKEN_LEN];
} lh_memory_status;

/**
 * The fault switches of one connection (`lh_memory_service_set_faults` / `_get_faults`).
 */
typedef struct lh_memory_faults {
  /**
   * `sizeof(lh_memory_faults)` as compiled by the caller.
   */
  uint32_t struct_size;
  /**
   * `LH_MEMORY_REJECT_* | LH_MEMORY_DROP_* | LH_MEMORY_PARTITIONED` bits, or 0 for none;
   * unknown bits are `LH_ERR_INVALID_ENUM`.
   */
  uint32_t flags;
  /**
   * The answers of the next this-many requests are lost (counts down as they go).
   */
  uint32_t drop_next_responses;
  /**
   * Always 0.
   */
  uint32_t _reserved;
} lh_memory_faults;

/**
 * Counters of a memory service (`lh_memory_service_stats_get`).
 */
typedef struct lh_memory_stats {
  /**
   * `sizeof(lh_memory_stats)` as compiled by the caller; set to the library's size on return.
   */
  uint32_t struct_size;
  /**
   * Always 0.
   */
  uint32_t _reserved;
  /**
   * Gauge: names with a record.
   */
  uint64_t names;
  /**
   * Gauge: open connections.
   */
  uint64_t connections;
  /**
   * New grants (idempotent re-acquires not counted).
   */
  uint64_t grants;
  /**
   * Releases that deleted a grant.
   */
  uint64_t releases;
  /**
   * Renews that extended a grant.
   */
  uint64_t renewals;
  /**
   * Renews refused (not the holder, or a reject switch).
   */
  uint64_t renewals_rejected;
  /**
   * Gauge: (connection, name) watches.
   */
  uint64_t watches;
  /**
   * Release notifications queued for watchers.
   */
  uint64_t notifications;
  /**
   * Release notifications discarded (partitioned connection, full queue).
   */
  uint64_t notifications_dropped;
  /**
   * Records reclaimed to stay within `max_names`.
   */
  uint64_t reclaimed;
} lh_memory_stats;

/**
 * What the backend said about one name (`lh_poll_status`). Advisory: it can change at once.
 * Numbers that are unknown (or that the backend does not record) are 0.
 */
typedef struct lh_lock_status {
  /**
   * `sizeof(lh_lock_status)` as compiled by the caller; set to the library's size.
   */
  uint32_t struct_size;
  /**
   * 1 if the query succeeded; 0 if it failed (`error` says why).
   */
  uint32_t ok;
  /**
   * The id `lh_status_request` returned; 0 when no answer is waiting.
   */
  uint64_t id;
  /**
   * 1 while a live grant exists.
   */
  uint32_t held;
  /**
   * Always 0.
   */
  uint32_t _reserved;
  /**
   * The holder's fencing token, while held.
   */
  uint64_t fencing_token;
  /**
   * The holder's remaining TTL in ms, while held.
   */
  uint64_t remaining_ttl_ms;
  /**
   * The highest fence ever minted for the name (SQL, Redis while its fence key lives).
   */
  uint64_t last_fencing_token;
  /**
   * SQLite: the holder's process id, while held.
   */
  int64_t holder_pid;
  /**
   * How long the grant has been held, in ms (when recorded).
   */
  uint64_t held_for_ms;
  /**
   * SQLite: the holder's host name (borrowed, not NUL-terminated), while held.
   */
  const uint8_t *holder_host;
  /**
   * Length of `holder_host`.
   */
  size_t holder_host_len;
  /**
   * Why the query failed (borrowed, not NUL-terminated), when `ok == 0`.
   */
  const uint8_t *error;
  /**
   * Length of `error`.
   */
  size_t error_len;
} lh_lock_status;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * Fills `*out` with the defaults of backend `kind` (and `struct_size`). An unknown kind is
 * `LH_ERR_INVALID_ENUM`; NULL `out` is `LH_ERR_NULL_ARGUMENT`.
 *
 * # Safety
 * `out` is NULL or valid for writing one `lh_backend_options`.
 */
lh_status lh_backend_options_default(uint32_t kind, struct lh_backend_options *out);

/**
 * Creates a client with its backend's protocol attached (see the header's run loop). The
 * seed (at least `LH_MIN_SEED_LEN`, at most `LH_MAX_SEED_LEN` bytes; hosts pass 32 bytes of
 * OS entropy, tests a fixed seed) drives tokens and jitter; it is copied, not retained. On
 * success `*out` receives a handle to free with `lh_client_free`.
 *
 * SQLite delivers no release notifications, so for it `cfg->notifications` is taken as 0
 * (waiters retry at the holder's expiry or by backoff). The first requests are the backend's
 * set-up (Redis: the SUBSCRIBE of the client's wake channel; SQL: the schema check).
 *
 * Errors: NULL `cfg`/`backend`/`seed`/`out` → `LH_ERR_NULL_ARGUMENT`; small `struct_size` →
 * `LH_ERR_STRUCT_SIZE` (for `backend`, the size before the stream fields is accepted for the
 * other kinds); a bad `redis_url` → `LH_ERR_INVALID_CONFIG`; an unknown backend kind → `LH_ERR_INVALID_ENUM`; bad values →
 * `LH_ERR_INVALID_CONFIG` (credentials that are not UTF-8: `LH_ERR_INVALID_UTF8`); short
 * seed → `LH_ERR_SEED_TOO_SHORT`. There is no handle yet to hold a detail message:
 * `lh_client_new_check` on the same arguments says why.
 *
 * # Safety
 * `cfg` and `backend` point to readable structs of their `struct_size` bytes (the etcd
 * strings readable for their lengths); `seed` to `seed_len` readable bytes; `out` is valid
 * for writing one pointer.
 */
lh_status lh_client_new(const struct lh_config *cfg,
                        const struct lh_backend_options *backend,
                        const uint8_t *seed,
                        size_t seed_len,
                        struct lh_client **out);

/**
 * Why `lh_client_new` refuses these arguments: runs its checks on `cfg`, `backend` and the
 * seed (creating nothing it keeps) and returns the status `lh_client_new` returns for them,
 * `LH_OK` when it would create a client.
 *
 * The reason ("" for `LH_OK`), UTF-8, is copied into `buf` like `snprintf` does: at most
 * `buf_len - 1` bytes (cut at a character boundary) and a NUL; nothing when `buf` is NULL
 * or `buf_len` is 0. `*out_len`, when `out_len` is not NULL, receives the reason's whole
 * length without the NUL, so a reason was cut short when `*out_len >= buf_len`. Unlike
 * other out-parameters these are written whatever the status: the status is the verdict.
 *
 * # Safety
 * As for `lh_client_new` (without `out`); `buf` is NULL or valid for writing `buf_len`
 * bytes; `out_len` is NULL or valid for writing a `size_t`.
 */
lh_status lh_client_new_check(const struct lh_config *cfg,
                              const struct lh_backend_options *backend,
                              const uint8_t *seed,
                              size_t seed_len,
                              char *buf,
                              size_t buf_len,
                              size_t *out_len);

/**
 * Library version as a static NUL-terminated string (equal to `LH_VERSION` of the header the
 * library was built with); lets a host detect a header/library mismatch at run time.
 */
const char *lh_version(void);

/**
 * ABI version of the loaded library; wrappers compare it with `LH_ABI_VERSION` (or their own
 * constant, for ctypes) at load time and refuse to run on a mismatch.
 */
uint32_t lh_abi_version(void);

/**
 * Static name of a status code ("LH_OK", "LH_ERR_NULL_ARGUMENT", ...), or
 * "LH_UNKNOWN_STATUS" for a value this library does not know. Never NULL; never freed.
 */
const char *lh_status_str(uint32_t status);

/**
 * Fills `*out` with the default configuration (and `struct_size = sizeof(lh_config)`), so a
 * host only sets the fields it cares about. NULL is ignored.
 *
 * # Safety
 * `out` is NULL or valid for writing one `lh_config`.
 */
void lh_config_default(struct lh_config *out);

/**
 * Fills `*out` with default acquire options: no flags, `ttl_ms = LH_DEFAULT_TTL_MS`,
 * `wait_ns = 0` (one attempt). NULL is ignored.
 *
 * # Safety
 * `out` is NULL or valid for writing one `lh_acquire_options`.
 */
void lh_acquire_options_default(struct lh_acquire_options *out);

/**
 * Destroys a client and everything it owns (borrowed output pointers become invalid).
 * NULL is a no-op. Freeing a handle twice is undefined behaviour, as with `free()`.
 *
 * # Safety
 * `c` is NULL or a handle from `lh_client_new` that is not used again afterwards.
 */
void lh_client_free(struct lh_client *c);

/**
 * NUL-terminated detail of the last error reported on this handle, "" if none yet. Never
 * NULL ("" for a NULL handle). Valid until the next call on this handle; copy it to keep it.
 *
 * # Safety
 * `c` is NULL or a live handle.
 */
const char *lh_client_last_error(const struct lh_client *c);

/**
 * Mixes a fresh seed into the client's random generator. Call it in a forked child before
 * using an inherited handle, so parent and child never generate the same ownership tokens.
 *
 * # Safety
 * `c` is NULL or a live handle; `seed` points to `seed_len` readable bytes.
 */
lh_status lh_client_reseed(struct lh_client *c, const uint8_t *seed, size_t seed_len);

/**
 * Starts acquiring `name` (UTF-8, `name_len` bytes, no NUL needed or allowed). On success
 * `*out_lease` receives the new lease id (or, for a reentrant acquire of a name already
 * leased here, the existing id) and outputs are ready to poll.
 *
 * Errors: NULL pointers, small `opts->struct_size`, unknown `opts->flags` bits
 * (`LH_ERR_INVALID_ENUM`), bad names (`LH_ERR_INVALID_UTF8`, `EMPTY_NAME`, `NAME_TOO_LONG`,
 * `NAME_HAS_NUL`), bad TTL (`LH_ERR_INVALID_TTL`), `LH_ERR_TOO_MANY_LEASES`.
 *
 * # Safety
 * `c` is NULL or a live handle; `name` points to `name_len` readable bytes; `opts` to a
 * readable `lh_acquire_options`; `out_lease` is valid for writing a `uint64_t`.
 */
lh_status lh_acquire(struct lh_client *c,
                     uint64_t now,
                     const uint8_t *name,
                     size_t name_len,
                     const struct lh_acquire_options *opts,
                     uint64_t *out_lease);

/**
 * Releases a lease (idempotence is the wrapper's business: a second release returns
 * `LH_ERR_LEASE_ENDED`, its terminal event was delivered earlier). When `out_releasing` is
 * not NULL it receives an `LH_RELEASING_*` value saying what happened:
 * - `LH_RELEASING_PENDING`: the lease ended RELEASED (event queued) and a RELEASE is queued;
 *   when the service answers (or the grant's TTL has certainly run out without an answer)
 *   an `LH_EVENT_RELEASE_OUTCOME` event tells `LH_REASON_RELEASE_CONFIRMED`,
 *   `LH_REASON_RELEASE_NOT_OWNER` or `LH_REASON_RELEASE_UNCONFIRMED`;
 * - `LH_RELEASING_LOST`: the lease's validity had run out before this call (a paused
 *   process): it ended LOST, not RELEASED, and the LOST event with its reason is queued;
 * - `LH_RELEASING_HOLDER_LEFT`: other reentrant holders remain, nothing was sent;
 * - `LH_RELEASING_NOT_ACQUIRED`: the lease was still acquiring and ended ACQUIRE_FAILED.
 *
 * With `out_releasing` NULL no RELEASE_OUTCOME event is produced.
 *
 * # Safety
 * `c` is NULL or a live handle; `out_releasing` is NULL or valid for writing a `uint32_t`.
 */
lh_status lh_release(struct lh_client *c, uint64_t now, uint64_t lease, uint32_t *out_releasing);

/**
 * Renews a held lease now (the manual escape hatch; works with or without automatic
 * renewal): a RENEW command is queued, unless one is in flight, which this call then joins.
 * Validity counts from that renewal's send time. The answer arrives as an
 * `LH_EVENT_RENEWED` event (lease_id, new valid_until_ns) or as the lease's LOST event; a
 * renewal failing in transport is retried within the failure budget like any other. If
 * the lease's validity had already run out, it ends LOST in this call (event queued) and
 * nothing is sent.
 *
 * Errors (nothing sent, nothing changed): `LH_ERR_LEASE_ENDED` for a released, lost or
 * failed lease (terminal states are sticky), `LH_ERR_NOT_GRANTED` for a lease still
 * acquiring, `LH_ERR_UNKNOWN_LEASE`.
 *
 * # Safety
 * `c` is NULL or a live handle.
 */
lh_status lh_renew(struct lh_client *c, uint64_t now, uint64_t lease);

/**
 * Tells the core that time has passed (call it when the deadline from `lh_poll_timeout`
 * arrives; early or spurious calls are harmless).
 *
 * # Safety
 * `c` is NULL or a live handle.
 */
lh_status lh_timeout(struct lh_client *c, uint64_t now);

/**
 * Takes the next event for the application into `*out` (`out->kind == LH_EVENT_NONE` when
 * nothing is left; drain until then after every input).
 *
 * # Safety
 * `c` is NULL or a live handle; `out` is valid for writing one `lh_event`.
 */
lh_status lh_poll_event(struct lh_client *c, struct lh_event *out);

/**
 * Writes the monotonic ns at which `lh_timeout` must be called at the latest, or
 * `LH_NO_DEADLINE` if the core has nothing scheduled.
 *
 * # Safety
 * `c` is NULL or a live handle; `out_deadline_ns` is valid for writing a `uint64_t`.
 */
lh_status lh_poll_timeout(struct lh_client *c, uint64_t *out_deadline_ns);

/**
 * Writes the lease's `LH_STATE_*`.
 *
 * # Safety
 * `c` is NULL or a live handle; `out_state` is valid for writing a `uint32_t`.
 */
lh_status lh_lease_state(const struct lh_client *c, uint64_t lease, uint32_t *out_state);

/**
 * Fills `*out` with a snapshot of the lease (`out->struct_size` must be set by the caller;
 * on return it holds the library's size).
 *
 * # Safety
 * `c` is NULL or a live handle; `out` is valid for reading and writing an `lh_lease_info`.
 */
lh_status lh_lease_info_get(const struct lh_client *c, uint64_t lease, struct lh_lease_info *out);

/**
 * Writes the fencing token of the lease's grant; `LH_ERR_NOT_GRANTED` if it was never
 * granted. Pass it with every protected write: it, not `lh_is_held`, is the authority.
 *
 * # Safety
 * `c` is NULL or a live handle; `out` is valid for writing a `uint64_t`.
 */
lh_status lh_fencing_token(const struct lh_client *c, uint64_t lease, uint64_t *out);

/**
 * Writes the monotonic ns until which the lease is believed valid; `LH_ERR_NOT_GRANTED` if
 * it was never granted.
 *
 * # Safety
 * `c` is NULL or a live handle; `out_ns` is valid for writing a `uint64_t`.
 */
lh_status lh_valid_until(const struct lh_client *c, uint64_t lease, uint64_t *out_ns);

/**
 * Writes whether the lease is held and still valid at `now`. Advice for stopping work early;
 * the fencing token checked by the resource is the only authority.
 *
 * # Safety
 * `c` is NULL or a live handle; `out_held` is valid for writing a `bool`.
 */
lh_status lh_is_held(const struct lh_client *c, uint64_t lease, uint64_t now, bool *out_held);

#if defined(LH_TESTING)
/**
 * Test hook: panics inside the panic boundary, so hosts can check that they handle
 * `LH_ERR_PANIC` and that the handle reports `LH_ERR_POISONED` afterwards.
 *
 * # Safety
 * `c` is NULL or a live handle.
 */
lh_status lh_client_debug_panic(struct lh_client *c);
#endif

/**
 * Fills `*out` with the client's counters, the engine's and its backend protocol's (`out->struct_size` must be set by the caller, at
 * least `LH_COUNTERS_V1_SIZE`; the library fills the fields that fit, up to its own struct,
 * and sets `struct_size` to the bytes it wrote).
 *
 * # Safety
 * `c` is NULL or a live handle; `out` is valid for reading and writing an `lh_counters`.
 */
lh_status lh_counters_get(const struct lh_client *c,
                          struct lh_counters *out);

/**
 * The host's drain after an input, in one call: takes the next IO request into `*request`
 * (as `lh_io_poll`; skipped when `request` is NULL), then up to `events_cap` events into
 * `events` (as `lh_poll_event`; skipped when `events_cap` is 0), then, when neither is
 * left, the next deadline. Call it again while `out->more_requests` or `out->more_events`
 * is 1 (with the first, shorter `lh_drained`: while `out->request` or `out->more_events`).
 * What `*request` points to is valid until the next poll of either kind. It mixes freely
 * with the single polls.
 *
 * # Safety
 * `c` is NULL or a live handle; `request` is NULL or valid for writing one `lh_io_request`;
 * `events` is valid for writing `events_cap` `lh_event`s (NULL allowed when `events_cap`
 * is 0); `out` is valid for writing one `lh_drained` whose `struct_size` is set.
 */
lh_status lh_drain(struct lh_client *c,
                   struct lh_io_request *request,
                   struct lh_event *events,
                   size_t events_cap,
                   struct lh_drained *out);

/**
 * `lh_io_received` and then the first `lh_drain`, in one call: what the bytes caused comes
 * back with them, so a host whose crossings cost (ctypes, cgo) feeds a read and takes what
 * it caused in one. Continue with `lh_drain` while `out` says more is left, as after any
 * `lh_drain` call. The drain's arguments are checked first and refused bytes drain nothing
 * (`out` untouched): on any status but `LH_OK` the bytes were not taken, and the host
 * drains as after any refused input.
 *
 * # Safety
 * As `lh_io_received` for `c`, `bytes` and `len`; as `lh_drain` for `request`, `events`,
 * `events_cap` and `out`.
 */
lh_status lh_io_received_drain(struct lh_client *c,
                               uint64_t now,
                               uint64_t stream,
                               const uint8_t *bytes,
                               size_t len,
                               struct lh_io_request *request,
                               struct lh_event *events,
                               size_t events_cap,
                               struct lh_drained *out);

/**
 * Takes the next request into `*out` (`out->kind == LH_IO_NONE`, `out->id == 0` when none is
 * left). Drain it after every input, like `lh_poll_event`.
 *
 * # Safety
 * `c` is NULL or a live handle; `out` is valid for writing one `lh_io_request`.
 */
lh_status lh_io_poll(struct lh_client *c, struct lh_io_request *out);

/**
 * Hands back the values answering COMMAND or SQL request `id`: `nvalues` values in
 * pre-order (an array is followed by its elements) and the `data_len` bytes their strings
 * point into. SQL: one array per statement (every statement, an empty array for one without
 * rows), of rows, each an array of column values (NIL, INT — booleans as 0/1 —, FLOAT,
 * TEXT, BULK for blobs). Read during the call, never retained. Unknown and already answered
 * ids are counted and ignored (`LH_OK`). A malformed or oversized list is
 * `LH_ERR_INVALID_REPLY` and changes nothing: then report the request with `lh_io_failed`.
 *
 * # Safety
 * `c` is NULL or a live handle; `values` points to `nvalues` readable `lh_value`s (never
 * NULL: an answer has at least one value) and `data` to `data_len` readable bytes (NULL
 * allowed when `data_len` is 0).
 */
lh_status lh_io_reply(struct lh_client *c,
                      uint64_t now,
                      uint64_t id,
                      const struct lh_value *values,
                      size_t nvalues,
                      const uint8_t *data,
                      size_t data_len);

/**
 * Hands back the reply to HTTP request `id`: the status (100..=599) and the whole body (at
 * most `LH_MAX_REPLY_DATA` bytes; NULL when empty). Any status, error body or malformed
 * JSON is the protocol's to judge. Unknown and already answered ids are counted and ignored.
 *
 * # Safety
 * `c` is NULL or a live handle; `body` points to `body_len` readable bytes.
 */
lh_status lh_io_http_reply(struct lh_client *c,
                           uint64_t now,
                           uint64_t id,
                           uint32_t status,
                           const uint8_t *body,
                           size_t body_len);

/**
 * One message streamed on HTTP watch `id` (one line of its response body, without the
 * newline; at most `LH_MAX_REPLY_DATA` bytes).
 *
 * # Safety
 * `c` is NULL or a live handle; `message` points to `message_len` readable bytes.
 */
lh_status lh_io_stream_message(struct lh_client *c,
                               uint64_t now,
                               uint64_t id,
                               const uint8_t *message,
                               size_t message_len);

/**
 * Request `id` got no answer (`LH_FAILURE_TRANSPORT`: connection refused, broken or timed
 * out, a reply `lh_io_reply` refused, a request the memory service dropped; a watch stream
 * that ended), or the database refused it (`LH_FAILURE_DATABASE`, SQL). `message` is the
 * host's text (UTF-8 not required; at most `LH_MAX_REPLY_DATA` bytes, NULL when empty). The
 * engine sees a transport error either way. Unknown ids are counted and ignored.
 *
 * # Safety
 * `c` is NULL or a live handle; `message` points to `message_len` readable bytes.
 */
lh_status lh_io_failed(struct lh_client *c,
                       uint64_t now,
                       uint64_t id,
                       uint32_t kind,
                       const uint8_t *message,
                       size_t message_len);

/**
 * Delivers one notification that arrived on a connection, every one (the protocol ignores
 * what is not its own): a Redis pub/sub message on the subscriber (channel, payload), a
 * PostgreSQL NOTIFY on the listener (channel, payload), a memory-service release
 * (`lh_memory_service_poll_released`: channel = the name, no payload). Channel and payload
 * are at most `LH_MAX_REPLY_DATA` bytes.
 *
 * # Safety
 * `c` is NULL or a live handle; `channel` and `payload` point to their lengths in readable
 * bytes (`payload` may be NULL when empty).
 */
lh_status lh_io_message(struct lh_client *c,
                        uint64_t now,
                        const uint8_t *channel,
                        size_t channel_len,
                        const uint8_t *payload,
                        size_t payload_len);

/**
 * Something happened to `connection` (`LH_CONNECTION_*`): `event` is
 * `LH_CONNECTION_REOPENED` (SQL, memory; harmless elsewhere) or, for Redis,
 * `LH_CONNECTION_SUBSCRIBED` / `LH_CONNECTION_UNSUBSCRIBED` of `channel` (NULL otherwise).
 * Unknown values are `LH_ERR_INVALID_ENUM`; an event the backend does not have is
 * `LH_ERR_WRONG_ANSWER`.
 *
 * # Safety
 * `c` is NULL or a live handle; `channel` points to `channel_len` readable bytes.
 */
lh_status lh_io_connection(struct lh_client *c,
                           uint64_t now,
                           uint32_t connection,
                           uint32_t event,
                           const uint8_t *channel,
                           size_t channel_len);

/**
 * The client is closing. etcd: cancels acquires still waiting and queues a `lease/revoke`
 * of every pooled etcd lease (the keys of its locks go with it), locks still held end Lost;
 * other backends have nothing of their own to give back. Call it after releasing what you
 * hold and before `lh_client_free`, then run the loop until the requests are answered, for
 * a short bound.
 *
 * # Safety
 * `c` is NULL or a live handle.
 */
lh_status lh_io_close(struct lh_client *c, uint64_t now);

/**
 * NUL-terminated text of the last error the backend reported or the protocol found in an
 * answer (a refused statement, an error reply, a malformed body, a failed schema check), for
 * the application's diagnostics; "" if none, and "" for a NULL or poisoned handle. Same
 * convention as `lh_client_last_error` (which holds the detail of the last failed *call*):
 * never NULL, valid until the next call on this handle.
 *
 * # Safety
 * `c` is NULL or a live handle.
 */
const char *lh_backend_last_error(struct lh_client *c);

/**
 * Fills `*out` with the default limits (and `struct_size`). NULL is ignored.
 *
 * # Safety
 * `out` is NULL or valid for writing one `lh_memory_config`.
 */
void lh_memory_config_default(struct lh_memory_config *out);

/**
 * Creates an empty memory service with the limits in `*cfg`. On success `*out` receives a
 * handle to free with `lh_memory_service_free`.
 *
 * Errors: NULL `cfg`/`out`, small `cfg->struct_size` (`LH_ERR_STRUCT_SIZE`), a limit of 0
 * or above 2^24 (`LH_ERR_INVALID_CONFIG`). There is no handle yet, so no detail message.
 *
 * # Safety
 * `cfg` points to a readable `lh_memory_config`; `out` is valid for writing one pointer.
 */
lh_status lh_memory_service_new(const struct lh_memory_config *cfg, struct lh_memory_service **out);

/**
 * Destroys a memory service (its connection ids and borrowed pointers become invalid).
 * NULL is a no-op; freeing twice is undefined behaviour, as with `free()`.
 *
 * # Safety
 * `svc` is NULL or a handle from `lh_memory_service_new` that is not used again.
 */
void lh_memory_service_free(struct lh_memory_service *svc);

/**
 * NUL-terminated detail of the last error on this handle, "" if none (also for NULL).
 * Valid until the next call on this handle.
 *
 * # Safety
 * `svc` is NULL or a live handle.
 */
const char *lh_memory_service_last_error(const struct lh_memory_service *svc);

/**
 * Opens a connection (one per client: it has its own fault switches, watches and
 * notification queue). `*out_connection` receives its id (never 0, never reused).
 *
 * Errors: `LH_ERR_LIMIT_REACHED` at `max_connections`.
 *
 * # Safety
 * `svc` is NULL or a live handle; `out_connection` is valid for writing a `uint64_t`.
 */
lh_status lh_memory_service_connect(struct lh_memory_service *svc, uint64_t *out_connection);

/**
 * Closes a connection: its watches and queued notifications go; the locks it acquired stay
 * until they expire, as a dead client's would. Errors: `LH_ERR_UNKNOWN_CONNECTION`.
 *
 * # Safety
 * `svc` is NULL or a live handle.
 */
lh_status lh_memory_service_disconnect(struct lh_memory_service *svc, uint64_t connection);

/**
 * Runs one request a memory-backend client polled (`LH_IO_COMMAND`: hand over its `argv`
 * unread) for `connection` at host time `now` (monotonic ns; the service's clock is it plus
 * every clock step). `*out` receives the answer to pass to `lh_io_reply`, or `dropped`. A
 * malformed request is an error *answer* for the client to see, never a status here.
 *
 * Errors (nothing changed): NULL pointers (an argument may be NULL only when empty), more
 * than 64 arguments or one over `LH_MAX_REPLY_DATA` bytes (`LH_ERR_INVALID_REPLY`),
 * small `out->struct_size`, `LH_ERR_UNKNOWN_CONNECTION`.
 *
 * # Safety
 * `svc` is NULL or a live handle; `argv` points to `argc` readable `lh_bytes`, each readable
 * for its length; `out` is valid for reading and writing an `lh_memory_answer`.
 */
lh_status lh_memory_service_call(struct lh_memory_service *svc,
                                 uint64_t connection,
                                 uint64_t now,
                                 const struct lh_bytes *argv,
                                 uint32_t argc,
                                 struct lh_memory_answer *out);

/**
 * Fills `*out` with what the service says about `name` at host time `now` (no fault switch
 * applies). Errors: NULL pointers, small `out->struct_size`, bad names.
 *
 * # Safety
 * `svc` is NULL or a live handle; `name` points to `name_len` readable bytes; `out` is
 * valid for writing one `lh_memory_status`.
 */
lh_status lh_memory_service_status(struct lh_memory_service *svc,
                                   uint64_t now,
                                   const uint8_t *name,
                                   size_t name_len,
                                   struct lh_memory_status *out);

/**
 * Takes the oldest release notification queued for `connection`: `*out_name` /
 * `*out_name_len` receive the name (BORROWED, valid until the next call on this handle;
 * hand it to the client with `lh_io_message` as the channel), or NULL / 0 when none is
 * queued.
 *
 * # Safety
 * `svc` is NULL or a live handle; `out_name` and `out_name_len` are valid for writing.
 */
lh_status lh_memory_service_poll_released(struct lh_memory_service *svc,
                                          uint64_t connection,
                                          const uint8_t **out_name,
                                          size_t *out_name_len);

#if defined(LH_TESTING)
/**
 * Replaces the fault switches of `connection` with `*faults`.
 * Errors: NULL, small `faults->struct_size`, unknown flag bits (`LH_ERR_INVALID_ENUM`),
 * `LH_ERR_UNKNOWN_CONNECTION`.
 *
 * # Safety
 * `svc` is NULL or a live handle; `faults` points to a readable `lh_memory_faults`.
 */
lh_status lh_memory_service_set_faults(struct lh_memory_service *svc,
                                       uint64_t connection,
                                       const struct lh_memory_faults *faults);
#endif

#if defined(LH_TESTING)
/**
 * Fills `*out` with the fault switches of `connection` now (`drop_next_responses` as it
 * has counted down). Errors: NULL, small `out->struct_size`, `LH_ERR_UNKNOWN_CONNECTION`.
 *
 * # Safety
 * `svc` is NULL or a live handle; `out` is valid for writing one `lh_memory_faults`.
 */
lh_status lh_memory_service_get_faults(struct lh_memory_service *svc,
                                       uint64_t connection,
                                       struct lh_memory_faults *out);
#endif

#if defined(LH_TESTING)
/**
 * Steps the service's clock by `delta_ns` (either direction; steps add up). Forward: grants
 * expire early on the service side only; backward: they outlive what their holders believe.
 * The clock is service-wide: every connection sees it.
 *
 * # Safety
 * `svc` is NULL or a live handle.
 */
lh_status lh_memory_service_step_clock(struct lh_memory_service *svc, int64_t delta_ns);
#endif

#if defined(LH_TESTING)
/**
 * Drops the grant of `name` without a notification, as a failover that lost the key would
 * (the holder's next renew is rejected); the name's fence is kept. Errors: bad names.
 *
 * # Safety
 * `svc` is NULL or a live handle; `name` points to `name_len` readable bytes.
 */
lh_status lh_memory_service_forget(struct lh_memory_service *svc,
                                   const uint8_t *name,
                                   size_t name_len);
#endif

/**
 * Fills `*out` with the service's counters. Errors: NULL, small `out->struct_size`.
 *
 * # Safety
 * `svc` is NULL or a live handle; `out` is valid for writing one `lh_memory_stats`.
 */
lh_status lh_memory_service_stats_get(struct lh_memory_service *svc, struct lh_memory_stats *out);

#if defined(LH_TESTING)
/**
 * Test hook: panics inside the panic boundary (the handle is poisoned afterwards).
 *
 * # Safety
 * `svc` is NULL or a live handle.
 */
lh_status lh_memory_service_debug_panic(struct lh_memory_service *svc);
#endif

/**
 * Queues a status query for `name` (rules as for `lh_acquire`'s name) on the handle's
 * backend protocol; `*out_id` identifies its answer in `lh_poll_status`. Run the requests it
 * produces as usual.
 *
 * # Safety
 * `c` is NULL or a live handle; `name` points to `name_len` readable bytes; `out_id` is
 * valid for writes.
 */
lh_status lh_status_request(struct lh_client *c,
                            uint64_t now,
                            const uint8_t *name,
                            size_t name_len,
                            uint64_t *out_id);

/**
 * Takes the next answered status query into `*out` (`out->id == 0` when none is waiting).
 * Its strings borrow the handle until the next call on it.
 *
 * # Safety
 * `c` is NULL or a live handle; `out` is valid for reading and writing an `lh_lock_status`.
 */
lh_status lh_poll_status(struct lh_client *c, struct lh_lock_status *out);

/**
 * The host opened `stream` (of an `LH_IO_OPEN`, TLS handshake included): the core starts
 * its own handshake on it. A stream closed since is ignored (`LH_OK`); an id never handed
 * out is `LH_ERR_UNKNOWN_CONNECTION`; a handle whose backend opens no streams,
 * `LH_ERR_WRONG_ANSWER`.
 *
 * # Safety
 * `c` is NULL or a live handle.
 */
lh_status lh_io_opened(struct lh_client *c, uint64_t now, uint64_t stream);

/**
 * `len` bytes read on `stream`, split anywhere (at most `LH_MAX_REPLY_DATA` per call: split longer reads); read
 * during the call, never retained. Bytes for a stream closed since are ignored (`LH_OK`);
 * bytes before `lh_io_opened` are `LH_ERR_WRONG_ANSWER`; an unknown id is
 * `LH_ERR_UNKNOWN_CONNECTION`.
 *
 * # Safety
 * `c` is NULL or a live handle; `bytes` points to `len` readable bytes (NULL when 0).
 */
lh_status lh_io_received(struct lh_client *c,
                         uint64_t now,
                         uint64_t stream,
                         const uint8_t *bytes,
                         size_t len);

/**
 * `stream` ended (the peer closed it, a read or write failed) or never opened (refused,
 * timed out, a TLS failure); `message` is the host's reason (UTF-8 not required, at most
 * `LH_MAX_REPLY_DATA` bytes, NULL when empty), kept as the backend's last error. The core
 * fails what was outstanding on it and opens a new stream after a backoff. A stream closed
 * since is ignored; an unknown id is `LH_ERR_UNKNOWN_CONNECTION`.
 *
 * # Safety
 * `c` is NULL or a live handle; `message` points to `message_len` readable bytes.
 */
lh_status lh_io_closed(struct lh_client *c,
                       uint64_t now,
                       uint64_t stream,
                       const uint8_t *message,
                       size_t message_len);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* LEASEHOLD_H */
