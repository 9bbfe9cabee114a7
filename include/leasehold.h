/*
 * leasehold.h -- C ABI of leasehold, a sans-IO distributed-lock lease client core.
 *
 * The library decides everything about lease timing (renewal, loss detection, backoff,
 * reentrancy, fencing); the host owns threads, clocks, sockets and the lock service client.
 * The host feeds inputs in and polls outputs out. No callbacks cross this ABI.
 *
 * CONVENTIONS
 *
 * Status codes. Every fallible function returns an lh_status (uint32_t): LH_OK (0) or an
 *   LH_ERR_* code. Values are never renumbered or reused. lh_status_str() names any code.
 *   Errors are caller misuse only and leave the client unchanged; service and network faults
 *   are never errors: they are inputs (outcomes) that become events.
 *   A detail message of the last error is kept per handle (never thread-local):
 *   lh_client_last_error(c), valid until the next call on that handle.
 *
 * Arguments. NULL pointers, invalid UTF-8, oversized lengths, unknown enum values and flag
 *   bits (taken in as uint32_t), too-small struct_size fields and unknown lease ids are
 *   errors, never undefined behaviour. Names are UTF-8 byte strings with an explicit length
 *   (no NUL terminator needed; an embedded NUL is an error). Results for unknown or already
 *   answered request ids are not errors: they are counted (stale_results) and ignored.
 *   Out-parameters are written only when LH_OK is returned. Non-NULL pointers must point to
 *   valid, suitably aligned memory of the documented size (the library cannot check that).
 *
 * Ownership and lifetimes. The library allocates and frees every handle: lh_client_new()
 *   creates one, lh_client_free() destroys it (NULL allowed; double free is undefined).
 *   Input buffers are read during the call and never retained. Pointers the library returns
 *   inside an lh_output (name, token, backend_data) and from lh_client_last_error() are
 *   BORROWED: they point into the handle and stay valid until the next call on that handle
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
 * THE RUN LOOP (one driver per handle)
 *
 *   for (;;) {
 *       lh_poll_timeout(c, &deadline);              // LH_NO_DEADLINE = none
 *       wait until the earliest of: deadline, a completed command, an application call
 *           (acquire/renew/release), a release notification of a watched name;
 *       now = monotonic_ns();
 *       feed exactly that one input:
 *           lh_timeout(c, now) | lh_acquire_result / lh_renew_result / lh_release_result(c,
 *           now, request_id, outcome, ...) | lh_acquire / lh_renew / lh_release /
 *           lh_release_reported | lh_released(c, now, name);
 *       do {                                         // drain completely
 *           lh_poll_output(c, &out);
 *           LH_OUTPUT_ACQUIRE/RENEW/RELEASE: copy name/token/backend_data, run the request
 *               asynchronously (never block the loop on the network), later feed the result
 *               back with out.request_id;
 *           LH_OUTPUT_WATCH/UNWATCH: start/stop delivering release notifications of the name;
 *           LH_OUTPUT_ACQUIRED/ACQUIRE_FAILED/LOST/RELEASED: complete the application's call
 *               or signal the loss (each lease gets exactly one terminal event);
 *           LH_OUTPUT_RENEWED / RELEASE_OUTCOME: complete an lh_renew / lh_release_reported
 *               call (only hosts that make those calls see them).
 *       } while (out.kind != LH_OUTPUT_NONE);
 *   }
 *
 * THE LEASE LIFECYCLE FROM THE APPLICATION'S SIDE
 *
 *   Manual renewal: lh_renew(c, now, lease) sends a RENEW now (or joins the one in flight);
 *     the application's call completes on LH_OUTPUT_RENEWED (new valid_until_ns) or on the
 *     lease's LOST. On a released, lost or failed lease it returns LH_ERR_LEASE_ENDED and
 *     sends nothing (terminal states are sticky); on a lease still acquiring,
 *     LH_ERR_NOT_GRANTED. A lease acquired with LH_ACQUIRE_NO_AUTO_RENEW is renewed only
 *     this way and is LOST (LH_REASON_EXPIRED) when its validity ends unless renewed.
 *   Release outcome: lh_release_reported(c, now, lease, &releasing) tells at once whether the
 *     lease ended RELEASED (LH_RELEASING_PENDING: an LH_OUTPUT_RELEASE_OUTCOME event follows
 *     with reason LH_REASON_RELEASE_CONFIRMED, _NOT_OWNER -- the service refused, someone
 *     else may hold the lock -- or _UNCONFIRMED -- no answer before the grant ran out) or,
 *     its validity having run out before the release was processed (a paused process), LOST
 *     (LH_RELEASING_LOST; the LOST event carries the reason). lh_release is the same call
 *     without the report; both count outcomes in lh_counters.
 *   Renewal failure budget (lh_config.fail_budget): 0, the default, is a time budget:
 *     renewals failing in transport are retried with backoff while validity remains; the
 *     lease is LOST on a rejection, with LH_REASON_FAIL_BUDGET when its validity is about
 *     to end without a confirmed renewal, or with LH_REASON_EXPIRED at valid_until if a
 *     renewal is still unanswered then: never after valid_until. N > 0 is a count budget
 *     instead: LOST (LH_REASON_FAIL_BUDGET) after N consecutive failures.
 *
 *   The fencing token (LH_OUTPUT_ACQUIRED, lh_fencing_token) is the only authority for a
 *   protected resource; lh_is_held() is advice for stopping work early.
 *   On close, keep driving the loop (bounded) until lh_counters_get().pending_cleanups == 0.
 *   bindings/c/example/ is the reference implementation of this loop.
 *
 * THE RUN LOOP WITH A BACKEND (Redis: lh_client_new_redis)
 *
 *   The handle then speaks the Redis protocol itself: keys, scripts, arguments, the meaning
 *   of every reply, the wait queue and the wake channel. The host owns two connections
 *   (commands, subscriber) and runs what it is told, verbatim; it never reads a reply.
 *   lh_acquire / lh_release / lh_poll_output (events only) / lh_poll_timeout / lh_timeout
 *   work as above; commands come out as requests instead:
 *
 *   for (;;) {
 *       lh_poll_timeout(c, &deadline);
 *       wait until the earliest of: deadline, a reply, a pub/sub message or subscription
 *           change, an application call;
 *       now = monotonic_ns();
 *       feed exactly that one input:
 *           lh_timeout(c, now) | lh_acquire / lh_release |
 *           lh_reply(c, now, id, values, nvalues, data, data_len) |   // flat reply, below
 *           lh_request_failed(c, now, id) |                           // transport error
 *           lh_pubsub_message(c, now, channel, len, payload, len) |   // every message
 *           lh_subscription(c, now, channel, len, 1 or 0);            // took effect / lost
 *       do {                                         // drain both completely
 *           lh_poll_request(c, &req);                // req.id == 0: none left
 *           run req.argv[0..req.argc] on req.connection (LH_CONNECTION_COMMANDS or
 *               LH_CONNECTION_SUBSCRIBER), asynchronously; later answer req.id;
 *       } while (req.id != 0);
 *       do { lh_poll_output(c, &out); deliver events } while (out.kind != LH_OUTPUT_NONE);
 *   }
 *
 *   A reply crosses as a flat list of lh_value in pre-order (an LH_VALUE_ARRAY of len n is
 *   followed by its n elements, recursively) plus ONE data buffer: string values (BULK,
 *   STATUS, ERROR) are offset/len into it. There are no pointers inside lh_value, so Go can
 *   pass its own slices through cgo, and ctypes / C++ build the list without a copy per
 *   value. The first request is SUBSCRIBE of the client's wake channel on the subscriber
 *   connection: report its confirmation with lh_subscription(..., 1) (or pass the
 *   confirmation as the reply), and when the subscriber connection drops, report
 *   lh_subscription(..., 0) for it; the handle then asks to SUBSCRIBE again.
 *   bindings/c/redis/ is the reference executor (hiredis).
 *
 * THE RUN LOOP WITH SQL (SQLite or PostgreSQL: lh_client_new_sql)
 *
 *   The handle speaks the SQL protocol itself: the schema and its migration, every
 *   statement and parameter, the meaning of every row. The host owns one connection in
 *   autocommit mode (SQLite: a file path, opened as usual; PostgreSQL: a connection string)
 *   and, for PostgreSQL, a second one that LISTENs. It runs what it is told, verbatim.
 *
 *   for (;;) {
 *       lh_poll_timeout(c, &deadline);
 *       wait until the earliest of: deadline, a finished request, a notification (listener
 *           connection), an application call;
 *       now = monotonic_ns();
 *       feed exactly that one input:
 *           lh_timeout(c, now) | lh_acquire / lh_release | lh_status_request |
 *           lh_sql_result(c, now, id, values, nvalues, data, data_len) |  // every row
 *           lh_sql_failed(c, now, id, LH_SQL_FAILURE_DATABASE or _TRANSPORT, msg, len) |
 *           lh_sql_notification(c, now, channel, len, payload, len) |
 *           lh_sql_connection_reset(c, now, LH_SQL_CONNECTION_*);  // reopened
 *       do {                                         // drain both completely
 *           lh_sql_poll_request(c, &req);            // req.id == 0: none left
 *           on req.connection, asynchronously: read the host facts once
 *               (LH_PARAM_HOST_*); for each of the req.nstatements statements, in order:
 *               prepare data[sql_offset .. +sql_len], bind params[first_param ..
 *               +nparams] (?1.. / $1..), run it, keep its rows; on the first error stop,
 *               ROLLBACK if a transaction is open, answer lh_sql_failed; else answer
 *               lh_sql_result with every statement's rows;
 *       } while (req.id != 0);
 *       do { lh_poll_output(c, &out); deliver events } while (out.kind != LH_OUTPUT_NONE);
 *   }
 *
 *   Rows cross like Redis replies: a flat lh_value list in pre-order, an LH_VALUE_ARRAY
 *   per statement, of rows, each an LH_VALUE_ARRAY of columns (NIL, INT with booleans as
 *   0/1, FLOAT, TEXT, BULK for blobs; strings offset/len into one data buffer). A database
 *   error (busy past the timeout, read-only, corrupt, a missing table) and a broken
 *   connection both become transport errors for the engine, never grants; after either the
 *   handle checks the schema again before the next operation. When a connection is opened
 *   anew (a restart, a SQLite file at the path replaced: compare device and inode before
 *   each request), call lh_sql_connection_reset. lh_sql_last_error says what the database
 *   said or why the schema was refused (a foreign table of the same name).
 *
 * THE RUN LOOP WITH ETCD (v3, through its JSON gateway: lh_client_new_etcd)
 *
 *   The handle speaks the etcd protocol itself: keys, leases, transactions, watches and the
 *   meaning of every reply. The host needs an HTTP/1.1 client and the cluster's member URLs
 *   (http://host:2379, ...); any member serves any request. With a user in lh_etcd_options
 *   the first request authenticates, and every request then carries req.authorization.
 *
 *   for (;;) {
 *       lh_poll_timeout(c, &deadline);
 *       wait until the earliest of: deadline, a finished request, a message on an open
 *           watch stream, an application call;
 *       now = monotonic_ns();
 *       feed exactly that one input:
 *           lh_timeout(c, now) | lh_acquire / lh_release |
 *           lh_http_reply(c, now, id, status, body, body_len) |     // a whole reply
 *           lh_http_stream_message(c, now, id, line, line_len) |    // one watch message
 *           lh_http_failed(c, now, id, msg, len);  // no reply / a watch stream ended
 *       do {                                         // drain both completely
 *           lh_http_poll_request(c, &req);           // req.id == 0: none left
 *           LH_HTTP_UNARY: asynchronously POST req.body (Content-Type: application/json,
 *               Authorization: req.authorization unless empty) to member_url + req.path;
 *               on a connection failure try the next member;
 *               answer with the status and the whole body, or lh_http_failed;
 *           LH_HTTP_WATCH: asynchronously POST it the same way and keep the response
 *               open: each newline-delimited JSON message goes to lh_http_stream_message,
 *               the end of the stream (or its failure) to lh_http_failed;
 *           LH_HTTP_CANCEL_WATCH: close the stream of watch req.id (no answer);
 *       } while (req.id != 0);
 *       do { lh_poll_output(c, &out); deliver events } while (out.kind != LH_OUTPUT_NONE);
 *   }
 *
 *   The fencing token is the create revision of the lease's key: strictly increasing per
 *   name across the cluster. Error bodies, non-200 statuses and malformed JSON become
 *   transport errors for the engine, never grants; a keep-alive that finds the lease gone
 *   makes the lease Lost. docs/etcd-protocol.md describes the keys and requests.
 *
 * THE MEMORY SERVICE (lh_memory_service_*)
 *
 *   An in-process reference lock service with fault switches (test hooks, below), for tests
 *   and examples in every binding. It is not a lock across processes. One lh_memory_service is "the server"; each
 *   client gets a connection (lh_memory_service_connect) with its own fault switches
 *   (lh_memory_service_set_faults: reject, drop requests, drop responses, partition), its
 *   watches and its queue of release notifications (lh_memory_service_poll_released). The
 *   service's clock is the host's now plus every lh_memory_service_step_clock. Each request
 *   answers at once; lh_memory_result.engine_outcome is what to feed the client:
 *
 *       LH_OUTPUT_ACQUIRE -> lh_memory_service_acquire(svc, conn, now, name, token, ttl, &r)
 *                            -> lh_acquire_result(c, now, out.request_id, r.engine_outcome,
 *                                 r.fencing_token, r.ttl_ms, r.retry_after_ms, NULL, 0)
 *       LH_OUTPUT_RENEW / RELEASE -> lh_memory_service_renew / _release
 *                            -> lh_renew_result / lh_release_result(..., r.engine_outcome)
 *       LH_OUTPUT_WATCH / UNWATCH -> lh_memory_service_watch / _unwatch
 *       after each request: lh_memory_service_poll_released until NULL -> lh_released
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
 * Backend data was longer than `LH_MAX_BACKEND_DATA_LEN` bytes.
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
 * A reply or pub/sub message passed in is malformed (`lh_value` list inconsistent, offsets
 * outside the data, unknown kinds) or over the limits (`LH_MAX_REPLY_*`); nothing changed:
 * report the request with `lh_request_failed`.
 */
#define LH_ERR_INVALID_REPLY 17

/**
 * The call needs a backend attached to the handle (`lh_client_new_redis`).
 */
#define LH_ERR_NO_BACKEND 18

/**
 * An ownership token passed to the memory service was empty or longer than
 * `LH_MEMORY_MAX_TOKEN_LEN` bytes.
 */
#define LH_ERR_INVALID_TOKEN 19

/**
 * A memory-service connection id was never issued by that service, or was disconnected.
 */
#define LH_ERR_UNKNOWN_CONNECTION 20

/**
 * A memory-service limit was reached (connections, watches per connection).
 */
#define LH_ERR_LIMIT_REACHED 21

/**
 * A panic was caught inside the library; the handle is now poisoned.
 */
#define LH_ERR_PANIC 900

/**
 * The handle was poisoned by an earlier panic; only `lh_client_free` is still meaningful.
 */
#define LH_ERR_POISONED 901

/**
 * `lh_output.kind`: nothing left to poll.
 */
#define LH_OUTPUT_NONE 0

/**
 * Command: send an acquire (name, token, ttl_ms; answer with `lh_acquire_result`).
 */
#define LH_OUTPUT_ACQUIRE 1

/**
 * Command: send a renew (name, token, ttl_ms, backend data; answer with `lh_renew_result`).
 */
#define LH_OUTPUT_RENEW 2

/**
 * Command: send a release (name, token, backend data; answer with `lh_release_result`).
 */
#define LH_OUTPUT_RELEASE 3

/**
 * Command: start delivering release notifications of `name` (via `lh_released`).
 */
#define LH_OUTPUT_WATCH 4

/**
 * Command: stop delivering release notifications of `name`.
 */
#define LH_OUTPUT_UNWATCH 5

/**
 * Event: the lease is held (lease_id, fencing_token, valid_until_ns).
 */
#define LH_OUTPUT_ACQUIRED 6

/**
 * Event (terminal): the acquire did not succeed (lease_id, reason).
 */
#define LH_OUTPUT_ACQUIRE_FAILED 7

/**
 * Event (terminal): a held lease was lost (lease_id, reason).
 */
#define LH_OUTPUT_LOST 8

/**
 * Event (terminal): the lease was released by the application (lease_id).
 */
#define LH_OUTPUT_RELEASED 9

/**
 * Event: a renewal asked for with `lh_renew` was confirmed (lease_id, valid_until_ns). Only
 * hosts that call `lh_renew` ever see it; automatic renewals are silent.
 */
#define LH_OUTPUT_RENEWED 10

/**
 * Event: the service's answer to a release made with `lh_release_reported` (lease_id;
 * reason `LH_REASON_RELEASE_CONFIRMED`, `_NOT_OWNER` or `_UNCONFIRMED`). Only hosts that
 * call `lh_release_reported` ever see it. Not a lifecycle event: it follows RELEASED.
 */
#define LH_OUTPUT_RELEASE_OUTCOME 11

/**
 * `lh_output.reason`: no reason (every output kind except ACQUIRE_FAILED, LOST and
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
 * `lh_acquire_result` outcome: granted (fencing_token, ttl_ms, backend data are read).
 */
#define LH_ACQUIRE_GRANTED 1

/**
 * `lh_acquire_result` outcome: held by someone else (retry_after_ms or `LH_NO_RETRY_HINT`).
 */
#define LH_ACQUIRE_HELD_BY_OTHER 2

/**
 * `lh_acquire_result` outcome: the request failed in transit or the service errored.
 */
#define LH_ACQUIRE_TRANSPORT_ERROR 3

/**
 * `lh_renew_result` outcome: renewed.
 */
#define LH_RENEW_RENEWED 1

/**
 * `lh_renew_result` outcome: the service refused (token no longer owns the lock).
 */
#define LH_RENEW_REJECTED 2

/**
 * `lh_renew_result` outcome: the request failed in transit or the service errored.
 */
#define LH_RENEW_TRANSPORT_ERROR 3

/**
 * `lh_release_result` outcome: released.
 */
#define LH_RELEASE_RELEASED 1

/**
 * `lh_release_result` outcome: the token did not own the lock (already expired or taken).
 */
#define LH_RELEASE_NOT_OWNER 2

/**
 * `lh_release_result` outcome: the request failed in transit (the core retries).
 */
#define LH_RELEASE_TRANSPORT_ERROR 3

/**
 * `lh_release_reported` disposition: other reentrant holders remain; nothing was sent.
 */
#define LH_RELEASING_HOLDER_LEFT 1

/**
 * `lh_release_reported` disposition: the lease ended RELEASED (event queued) and a RELEASE
 * command was sent; a RELEASE_OUTCOME event follows with the service's answer.
 */
#define LH_RELEASING_PENDING 2

/**
 * `lh_release_reported` disposition: the lease's validity had run out before the release
 * (a paused process): it ended LOST, and its LOST event, with the reason, is queued.
 */
#define LH_RELEASING_LOST 3

/**
 * `lh_release_reported` disposition: the lease was never granted; it ended ACQUIRE_FAILED.
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
 * `lh_acquire_result`: the holder's remaining TTL is not known.
 */
#define LH_NO_RETRY_HINT UINT64_MAX

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
 * Longest accepted backend data in bytes (equals the core's `MAX_BACKEND_DATA_LEN`).
 */
#define LH_MAX_BACKEND_DATA_LEN 1024

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
#define LH_ABI_VERSION 2

/**
 * Size of the first `lh_counters` (up to `time_clamped`): the smallest `struct_size`
 * `lh_counters_get` accepts.
 */
#define LH_COUNTERS_V1_SIZE 120

/**
 * `lh_request.connection`: the ordinary commands connection.
 */
#define LH_CONNECTION_COMMANDS 1

/**
 * `lh_request.connection`: the pub/sub (subscriber) connection.
 */
#define LH_CONNECTION_SUBSCRIBER 2

/**
 * `lh_value.kind`: nil (null bulk string, null array, RESP3 null).
 */
#define LH_VALUE_NIL 1

/**
 * `lh_value.kind`: integer (`integer`).
 */
#define LH_VALUE_INT 2

/**
 * `lh_value.kind`: bulk string (`offset`, `len` into the data buffer).
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
 * Most values in one reply (`lh_reply` refuses more with `LH_ERR_INVALID_REPLY`).
 */
#define LH_MAX_REPLY_VALUES 4096

/**
 * Largest data buffer of one reply, and longest pub/sub channel or payload, in bytes.
 */
#define LH_MAX_REPLY_DATA (1 << 20)

/**
 * Deepest array nesting accepted in a reply.
 */
#define LH_MAX_REPLY_DEPTH 16

/**
 * `lh_http_request.kind`: `POST` the body, read the whole reply, answer with `lh_http_reply`
 * (or `lh_http_failed` when no reply came).
 */
#define LH_HTTP_UNARY 1

/**
 * `lh_http_request.kind`: `POST` the body and keep the response open; pass each
 * newline-delimited JSON message to `lh_http_stream_message`; when the stream ends or
 * breaks, call `lh_http_failed` with its id.
 */
#define LH_HTTP_WATCH 2

/**
 * `lh_http_request.kind`: close the watch stream `id` (no reply).
 */
#define LH_HTTP_CANCEL_WATCH 3

/**
 * Largest reply body or stream message the protocol reads, in bytes.
 */
#define LH_MAX_HTTP_BODY (1 << 20)

/**
 * Longest ownership token the memory service accepts, in bytes (the engine's are 32).
 */
#define LH_MEMORY_MAX_TOKEN_LEN 64

/**
 * `lh_memory_result.outcome` (acquire): the token holds the name (fencing_token, ttl_ms).
 */
#define LH_MEMORY_GRANTED 1

/**
 * `lh_memory_result.outcome` (acquire): another token holds it (retry_after_ms, or
 * `LH_NO_RETRY_HINT` when a reject switch answered).
 */
#define LH_MEMORY_HELD_BY_OTHER 2

/**
 * `lh_memory_result.outcome` (renew): extended.
 */
#define LH_MEMORY_RENEWED 3

/**
 * `lh_memory_result.outcome` (renew): the token does not hold the name.
 */
#define LH_MEMORY_REJECTED 4

/**
 * `lh_memory_result.outcome` (release): deleted; watchers are notified.
 */
#define LH_MEMORY_RELEASED 5

/**
 * `lh_memory_result.outcome` (release): the token did not hold the name; nothing changed.
 */
#define LH_MEMORY_NOT_OWNER 6

/**
 * `lh_memory_result.outcome`: no answer (request or answer lost, or partitioned): a
 * transport error for the engine.
 */
#define LH_MEMORY_DROPPED 7

/**
 * `lh_memory_result.outcome` (acquire): a new name while every record is live
 * (`max_names`): a transport error for the engine.
 */
#define LH_MEMORY_FULL 8

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
 * `lh_sql_options.dialect`: SQLite (one file shared by the processes of one host).
 */
#define LH_DIALECT_SQLITE 1

/**
 * `lh_sql_options.dialect`: PostgreSQL.
 */
#define LH_DIALECT_POSTGRES 2

/**
 * `lh_sql_request.connection`: the ordinary connection (migration and every operation).
 */
#define LH_SQL_CONNECTION_COMMANDS 1

/**
 * `lh_sql_request.connection`: PostgreSQL's listener connection (LISTEN / UNLISTEN; its
 * notifications go to `lh_sql_notification`).
 */
#define LH_SQL_CONNECTION_LISTENER 2

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
 * `lh_sql_failed` kind: the connection broke or timed out (the outcome is unknown); reopen
 * it and call `lh_sql_connection_reset`.
 */
#define LH_SQL_FAILURE_TRANSPORT 1

/**
 * `lh_sql_failed` kind: the database refused a statement (busy, read-only, corrupt, missing
 * table, …) and the transaction was rolled back.
 */
#define LH_SQL_FAILURE_DATABASE 2

/**
 * Longest notification channel or payload, and longest failure message, in bytes.
 */
#define LH_MAX_SQL_MESSAGE (1 << 16)

/**
 * Opaque client handle: one core session plus the memory that borrowed outputs point into.
 *
 * Created by `lh_client_new`, destroyed by `lh_client_free`. Not thread-safe: one thread at a
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
 * Options of the Redis protocol. Fill with `lh_redis_options_default`, then change fields.
 */
typedef struct lh_redis_options {
  /**
   * `sizeof(lh_redis_options)` as compiled by the caller.
   */
  uint32_t struct_size;
  /**
   * Always 0.
   */
  uint32_t _reserved;
  /**
   * How long a waiter told to stand by waits for "taken" before it tries (default 150 ms):
   * the longest a frozen waiter at the head of the queue keeps the lock free.
   */
  uint64_t standby_delay_ms;
  /**
   * How long the fence and queue keys outlive the lease they serve (default 60000).
   */
  uint64_t key_keep_ms;
  /**
   * Queue entries older than this are dropped at a release (default 600000).
   */
  uint64_t queue_max_age_ms;
  /**
   * How long a queued waiter behind the head of the queue waits before it asks again on
   * its own (default 10000): an idle waiter's cost is one script call per this interval.
   */
  uint64_t idle_recheck_ms;
  /**
   * Redis Cluster (default 0): non-zero sends wake-ups on one shard channel per name,
   * `lh:{NAME}:wake`, with SPUBLISH (Redis 7+); the client then requests `SSUBSCRIBE` /
   * `SUNSUBSCRIBE` of a name's channel on the subscriber connection while it has leases
   * waiting on it, instead of one `SUBSCRIBE` of its own channel. Added after the fields
   * above: a caller whose `struct_size` ends before it gets 0.
   */
  uint32_t sharded_wake;
  /**
   * Always 0.
   */
  uint32_t _reserved2;
} lh_redis_options;

/**
 * Status returned by every fallible function (`LH_OK` or one of `LH_ERR_*`).
 *
 * A plain `uint32_t` rather than a C enum so that the width is fixed for ctypes and cgo and so
 * that codes added later cannot be undefined behaviour in an older host.
 */
typedef uint32_t lh_status;

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
   * 1 if the host delivers release notifications (`LH_OUTPUT_WATCH` / `lh_released`),
   * 0 to make waiters poll with capped backoff. Any other value is `LH_ERR_INVALID_CONFIG`.
   */
  uint32_t notifications;
} lh_config;

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
 * One polled request: run `argv` verbatim on `connection` (`LH_CONNECTION_*`), then answer
 * `id` with `lh_reply` or `lh_request_failed`. `id == 0` means nothing is left. `argv` and
 * the bytes it points to borrow the handle until the next call on it: copy or send them
 * before calling in again.
 */
typedef struct lh_request {
  /**
   * Request id (never reused), 0 when none.
   */
  uint64_t id;
  /**
   * `LH_CONNECTION_COMMANDS` or `LH_CONNECTION_SUBSCRIBER`.
   */
  uint32_t connection;
  /**
   * Number of arguments (command name included).
   */
  uint32_t argc;
  /**
   * The arguments.
   */
  const struct lh_bytes *argv;
} lh_request;

/**
 * One value of a flat reply (see `lh_reply`). No pointers: strings are `offset`/`len` into
 * the data buffer passed beside the list.
 */
typedef struct lh_value {
  /**
   * `LH_VALUE_*`.
   */
  uint32_t kind;
  /**
   * Always 0.
   */
  uint32_t _reserved;
  /**
   * The integer of `LH_VALUE_INT`.
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
 * What the Redis protocol saw, filled by `lh_redis_counters_get`.
 */
typedef struct lh_redis_counters {
  /**
   * `sizeof(lh_redis_counters)` as compiled by the caller; set to the library's size.
   */
  uint32_t struct_size;
  /**
   * 1 while the subscription is in effect.
   */
  uint32_t subscribed;
  /**
   * Requests emitted.
   */
  uint64_t requests;
  /**
   * Script calls emitted (EVALSHA and EVAL).
   */
  uint64_t script_calls;
  /**
   * EVALSHAs re-sent as EVAL after NOSCRIPT.
   */
  uint64_t noscript_retries;
  /**
   * Error replies.
   */
  uint64_t error_replies;
  /**
   * Replies of a shape the request cannot have.
   */
  uint64_t garbage_replies;
  /**
   * Replies and failures for unknown or already answered ids.
   */
  uint64_t stale_replies;
  /**
   * Transport failures reported.
   */
  uint64_t transport_failures;
  /**
   * Retries answered without a round trip.
   */
  uint64_t local_refusals;
  /**
   * Wake-ups received.
   */
  uint64_t wakeups;
  /**
   * Standbys that tried after hearing nothing.
   */
  uint64_t standby_takeovers;
  /**
   * Messages and confirmations ignored.
   */
  uint64_t ignored_messages;
  /**
   * Times the subscription took effect.
   */
  uint64_t subscriptions;
  /**
   * Times the subscription was reported lost.
   */
  uint64_t subscriber_losses;
} lh_redis_counters;

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
 * One polled output: a command for the host to execute or an event for the application.
 *
 * Flat and union-free so that ctypes and cgo mirror it field for field. Fields that do not
 * apply to `kind` are 0 (pointers NULL with length 0). The pointers borrow memory owned by the
 * handle; they stay valid until the next call on that handle, so copy what you keep.
 */
typedef struct lh_output {
  /**
   * `LH_OUTPUT_*`.
   */
  uint32_t kind;
  /**
   * `LH_REASON_*` (ACQUIRE_FAILED, LOST, RELEASE_OUTCOME), else `LH_REASON_NONE`.
   */
  uint32_t reason;
  /**
   * Request id to pass back with the result (ACQUIRE, RENEW, RELEASE), else 0. Opaque:
   * never reused, but neither sequential nor ordered.
   */
  uint64_t request_id;
  /**
   * Lease the output concerns (every kind except WATCH, UNWATCH, NONE), else 0.
   */
  uint64_t lease_id;
  /**
   * Lock name, UTF-8, not NUL-terminated (commands).
   */
  const uint8_t *name;
  /**
   * Length of `name` in bytes.
   */
  size_t name_len;
  /**
   * Ownership token: 32 lowercase hex characters, not NUL-terminated (ACQUIRE, RENEW, RELEASE).
   */
  const uint8_t *token;
  /**
   * Length of `token` (32, or 0 when absent).
   */
  size_t token_len;
  /**
   * Backend-specific bytes from the grant, echoed in RENEW and RELEASE (may be empty).
   */
  const uint8_t *backend_data;
  /**
   * Length of `backend_data`.
   */
  size_t backend_data_len;
  /**
   * TTL to request in ms (ACQUIRE, RENEW).
   */
  uint64_t ttl_ms;
  /**
   * Fencing token of the grant (ACQUIRED).
   */
  uint64_t fencing_token;
  /**
   * Monotonic ns until which the lease is valid (ACQUIRED, RENEWED).
   */
  uint64_t valid_until_ns;
} lh_output;

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
} lh_counters;

/**
 * Options of the etcd protocol. Fill with `lh_etcd_options_default`. With a user, the
 * handle authenticates first (`/v3/auth/authenticate`) and every request carries the token.
 */
typedef struct lh_etcd_options {
  /**
   * `sizeof(lh_etcd_options)` as compiled by the caller.
   */
  uint32_t struct_size;
  /**
   * Always 0.
   */
  uint32_t _reserved;
  /**
   * User name (UTF-8, at most 256 bytes; not NUL-terminated), NULL for none.
   */
  const uint8_t *user;
  /**
   * Length of `user`.
   */
  size_t user_len;
  /**
   * Password (UTF-8, at most 256 bytes), NULL when empty.
   */
  const uint8_t *password;
  /**
   * Length of `password`.
   */
  size_t password_len;
} lh_etcd_options;

/**
 * One polled HTTP request. `id == 0` means nothing is left. `method` and `path` are
 * NUL-terminated (empty for `LH_HTTP_CANCEL_WATCH`); the path is appended to a member's
 * base URL (`http://host:2379`); any member serves any request, so on a transport failure
 * the host may try the next member before reporting it. Send `Content-Type:
 * application/json`. Every pointer borrows the handle until the next call on it.
 */
typedef struct lh_http_request {
  /**
   * Request id (never reused), 0 when none.
   */
  uint64_t id;
  /**
   * `LH_HTTP_*`.
   */
  uint32_t kind;
  /**
   * Always 0.
   */
  uint32_t _reserved;
  /**
   * The HTTP method (`POST`), NUL-terminated.
   */
  const char *method;
  /**
   * The path, NUL-terminated.
   */
  const char *path;
  /**
   * The JSON body (a NUL follows it, not counted).
   */
  const uint8_t *body;
  /**
   * Length of `body`.
   */
  size_t body_len;
  /**
   * NUL-terminated; when not empty, send it as the `Authorization` header (the token of
   * an authenticated cluster).
   */
  const char *authorization;
} lh_http_request;

/**
 * What the etcd protocol saw (monotonic), for diagnostics and tests.
 */
typedef struct lh_etcd_counters {
  /**
   * `sizeof(lh_etcd_counters)` as compiled by the caller; set to the library's size.
   */
  uint32_t struct_size;
  /**
   * Always 0.
   */
  uint32_t _reserved;
  /**
   * Requests emitted (cancellations not included).
   */
  uint64_t requests;
  /**
   * etcd leases granted.
   */
  uint64_t leases_granted;
  /**
   * Acquire transactions sent.
   */
  uint64_t txns;
  /**
   * Watches opened on a predecessor.
   */
  uint64_t watches;
  /**
   * Waiters woken by their predecessor's deletion (or a cut watch).
   */
  uint64_t wakeups;
  /**
   * Keep-alives sent for waiting leases.
   */
  uint64_t waiting_keepalives;
  /**
   * Waiters whose etcd lease was gone (they rejoined the queue).
   */
  uint64_t waiters_expired;
  /**
   * Error bodies or non-200 statuses.
   */
  uint64_t error_replies;
  /**
   * Malformed or oversized replies.
   */
  uint64_t garbage_replies;
  /**
   * Transport failures reported by the host.
   */
  uint64_t transport_failures;
  /**
   * Replies for unknown or already answered ids.
   */
  uint64_t stale_replies;
} lh_etcd_counters;

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
   * it is reached, and an acquire of a new name answers `LH_MEMORY_FULL` if none is.
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
 * The answer to one acquire / renew / release.
 */
typedef struct lh_memory_result {
  /**
   * `sizeof(lh_memory_result)` as compiled by the caller; set to the library's size on return.
   */
  uint32_t struct_size;
  /**
   * `LH_MEMORY_*` outcome.
   */
  uint32_t outcome;
  /**
   * What to feed the engine: `LH_ACQUIRE_*` (acquire), `LH_RENEW_*` (renew) or
   * `LH_RELEASE_*` (release); DROPPED and FULL are the TRANSPORT_ERROR of each.
   */
  uint32_t engine_outcome;
  /**
   * Always 0.
   */
  uint32_t _reserved;
  /**
   * Fencing token (GRANTED), else 0.
   */
  uint64_t fencing_token;
  /**
   * TTL granted in ms (GRANTED), else 0.
   */
  uint64_t ttl_ms;
  /**
   * The holder's remaining TTL in ms, rounded up (HELD_BY_OTHER), else `LH_NO_RETRY_HINT`.
   */
  uint64_t retry_after_ms;
} lh_memory_result;

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
 * Options of the SQL protocol. Fill with `lh_sql_options_default`, then set `dialect`.
 */
typedef struct lh_sql_options {
  /**
   * `sizeof(lh_sql_options)` as compiled by the caller.
   */
  uint32_t struct_size;
  /**
   * `LH_DIALECT_*` (default SQLite).
   */
  uint32_t dialect;
  /**
   * SQLite: `PRAGMA busy_timeout` (default 5000): a file that stays locked is a database
   * error after this long, never a hang.
   */
  uint64_t busy_timeout_ms;
  /**
   * PostgreSQL, 0 or 1 (default 0): acquire, renew and release commit without waiting for
   * the WAL flush. Much faster on a server that flushes; a server crash may forget the
   * last moments' grants and releases (docs/backends.md). Added after the first struct:
   * a caller whose `struct_size` ends before it gets 0.
   */
  uint32_t asynchronous_commit;
  /**
   * Always 0.
   */
  uint32_t _reserved;
} lh_sql_options;

/**
 * One statement of a request: its SQL text and its parameters.
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
 * One polled request: run its statements in order on `connection`, in autocommit mode
 * (transaction control is part of the list), then answer `id` with `lh_sql_result` or
 * `lh_sql_failed`. `id == 0` means nothing is left. Parameters are `lh_value`s: NIL, INT
 * (`integer`), TEXT and BULK (a blob) with `offset`/`len` into `data`, or
 * `LH_PARAM_HOST_*` (facts the host binds: read them once per request, when it starts
 * executing it, and bind the same values wherever the kind appears). Every SQL text and
 * TEXT parameter in `data` is followed by a NUL byte (not counted in its length). The
 * pointers borrow the handle until the next call on it.
 */
typedef struct lh_sql_request {
  /**
   * Request id (never reused), 0 when none.
   */
  uint64_t id;
  /**
   * `LH_SQL_CONNECTION_*`.
   */
  uint32_t connection;
  /**
   * Number of statements.
   */
  uint32_t nstatements;
  /**
   * The statements.
   */
  const struct lh_sql_statement *statements;
  /**
   * The parameters of all statements.
   */
  const struct lh_value *params;
  /**
   * Number of parameters.
   */
  size_t nparams;
  /**
   * The bytes SQL texts and string parameters point into.
   */
  const uint8_t *data;
  /**
   * Length of `data`.
   */
  size_t data_len;
} lh_sql_request;

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

/**
 * The first name of `lh_lock_status`, from when only SQL handles answered status queries.
 */
typedef struct lh_lock_status lh_sql_status;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * Fills `*out` with the default Redis options (and `struct_size`). NULL is ignored.
 *
 * # Safety
 * `out` is NULL or valid for writing one `lh_redis_options`.
 */
void lh_redis_options_default(struct lh_redis_options *out);

/**
 * Creates a client with the Redis protocol attached (see the header's run loop). Arguments
 * and errors as for `lh_client_new`, plus `opts` (NULL for the defaults; bad values are
 * `LH_ERR_INVALID_CONFIG`). The first request is the SUBSCRIBE of the client's wake channel.
 *
 * # Safety
 * As for `lh_client_new`; `opts` is NULL or points to a readable `lh_redis_options`.
 */
lh_status lh_client_new_redis(const struct lh_config *cfg,
                              const struct lh_redis_options *opts,
                              const uint8_t *seed,
                              size_t seed_len,
                              struct lh_client **out);

/**
 * Takes the next request into `*out` (`out->id == 0` when none is left; drain until then
 * after every input, like `lh_poll_output`). The argument bytes borrow the handle until the
 * next call on it.
 *
 * # Safety
 * `c` is NULL or a live handle; `out` is valid for writing one `lh_request`.
 */
lh_status lh_poll_request(struct lh_client *c, struct lh_request *out);

/**
 * Hands back the reply to request `id`: `nvalues` values in pre-order (an array is followed
 * by its elements) and the `data_len` bytes their strings point into. Read during the call,
 * never retained. Unknown and already answered ids are counted and ignored (`LH_OK`). A
 * malformed or oversized list is `LH_ERR_INVALID_REPLY` and changes nothing: then report the
 * request with `lh_request_failed`.
 *
 * # Safety
 * `c` is NULL or a live handle; `values` points to `nvalues` readable `lh_value`s and `data`
 * to `data_len` readable bytes (NULL allowed when the count is 0).
 */
lh_status lh_reply(struct lh_client *c,
                   uint64_t now,
                   uint64_t id,
                   const struct lh_value *values,
                   size_t nvalues,
                   const uint8_t *data,
                   size_t data_len);

/**
 * Request `id` failed in transport (connection lost, timeout, or a reply `lh_reply`
 * refused). Unknown ids are counted and ignored.
 *
 * # Safety
 * `c` is NULL or a live handle.
 */
lh_status lh_request_failed(struct lh_client *c, uint64_t now, uint64_t id);

/**
 * Delivers one pub/sub message from the subscriber connection (every one: the protocol
 * ignores what is not its own). Channel and payload are at most `LH_MAX_REPLY_DATA` bytes.
 *
 * # Safety
 * `c` is NULL or a live handle; `channel` and `payload` point to their lengths in readable
 * bytes (`payload` may be NULL when empty).
 */
lh_status lh_pubsub_message(struct lh_client *c,
                            uint64_t now,
                            const uint8_t *channel,
                            size_t channel_len,
                            const uint8_t *payload,
                            size_t payload_len);

/**
 * Reports a subscription change on the subscriber connection: `subscribed` 1 when a
 * SUBSCRIBE of `channel` took effect (its confirmation arrived), 0 when it ended (an
 * UNSUBSCRIBE confirmation, or the connection was lost: report every subscribed channel).
 * Other values are `LH_ERR_INVALID_ENUM`.
 *
 * # Safety
 * `c` is NULL or a live handle; `channel` points to `channel_len` readable bytes.
 */
lh_status lh_subscription(struct lh_client *c,
                          uint64_t now,
                          const uint8_t *channel,
                          size_t channel_len,
                          uint32_t subscribed);

/**
 * Fills `*out` with the Redis protocol's counters (`out->struct_size` set by the caller).
 *
 * # Safety
 * `c` is NULL or a live handle; `out` is valid for reading and writing an `lh_redis_counters`.
 */
lh_status lh_redis_counters_get(const struct lh_client *c, struct lh_redis_counters *out);

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
 * Creates a client. The seed (at least `LH_MIN_SEED_LEN`, at most `LH_MAX_SEED_LEN` bytes;
 * hosts pass 32 bytes of OS entropy, tests a fixed seed) drives tokens and jitter; it is
 * copied, not retained. On success `*out` receives a handle to free with `lh_client_free`.
 *
 * Errors: NULL `cfg`/`seed`/`out` → `LH_ERR_NULL_ARGUMENT`; small `cfg->struct_size` →
 * `LH_ERR_STRUCT_SIZE`; bad config → `LH_ERR_INVALID_CONFIG`; short seed →
 * `LH_ERR_SEED_TOO_SHORT`. There is no handle yet, so no detail message.
 *
 * # Safety
 * `cfg` points to a readable `lh_config` of `cfg->struct_size` bytes; `seed` to `seed_len`
 * readable bytes; `out` is valid for writing one pointer.
 */
lh_status lh_client_new(const struct lh_config *cfg,
                        const uint8_t *seed,
                        size_t seed_len,
                        struct lh_client **out);

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
 * `LH_ERR_LEASE_ENDED`). Emits `LH_OUTPUT_RELEASED` at once and, if needed, a RELEASE command;
 * a lease whose validity ran out before this call ends with `LH_OUTPUT_LOST` instead.
 *
 * # Safety
 * `c` is NULL or a live handle.
 */
lh_status lh_release(struct lh_client *c, uint64_t now, uint64_t lease);

/**
 * Releases a lease like `lh_release` and reports what happened. `*out_releasing` receives
 * an `LH_RELEASING_*` value:
 * - `LH_RELEASING_PENDING`: the lease ended RELEASED (event queued) and a RELEASE command is
 *   queued; when the service answers (or the grant's TTL has certainly run out without an
 *   answer) an `LH_OUTPUT_RELEASE_OUTCOME` event for the lease tells `LH_REASON_RELEASE_CONFIRMED`,
 *   `LH_REASON_RELEASE_NOT_OWNER` or `LH_REASON_RELEASE_UNCONFIRMED`;
 * - `LH_RELEASING_LOST`: the lease's validity had run out before this call (a paused
 *   process): it ended LOST, not RELEASED, and the LOST event with its reason is queued;
 * - `LH_RELEASING_HOLDER_LEFT`: other reentrant holders remain, nothing was sent;
 * - `LH_RELEASING_NOT_ACQUIRED`: the lease was still acquiring and ended ACQUIRE_FAILED.
 *
 * Errors as for `lh_release` (`LH_ERR_LEASE_ENDED` for a lease that already ended: its
 * terminal event was delivered earlier), plus NULL `out_releasing`.
 *
 * # Safety
 * `c` is NULL or a live handle; `out_releasing` is valid for writing a `uint32_t`.
 */
lh_status lh_release_reported(struct lh_client *c,
                              uint64_t now,
                              uint64_t lease,
                              uint32_t *out_releasing);

/**
 * Renews a held lease now (the manual escape hatch; works with or without automatic
 * renewal): a RENEW command is queued, unless one is in flight, which this call then joins.
 * Validity counts from that renewal's send time. The answer arrives as an
 * `LH_OUTPUT_RENEWED` event (lease_id, new valid_until_ns) or as the lease's LOST event; a
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
 * Feeds the answer to an ACQUIRE command. `outcome` is `LH_ACQUIRE_*`. For GRANTED,
 * `fencing_token`, `ttl_ms` and the backend data (NULL allowed when the length is 0; copied,
 * at most `LH_MAX_BACKEND_DATA_LEN` bytes) are read; for HELD_BY_OTHER, `retry_after_ms`
 * (`LH_NO_RETRY_HINT` if unknown); otherwise they are ignored. Unknown or already answered
 * request ids are counted as stale and return `LH_OK`.
 *
 * # Safety
 * `c` is NULL or a live handle; `backend_data` points to `backend_data_len` readable bytes.
 */
lh_status lh_acquire_result(struct lh_client *c,
                            uint64_t now,
                            uint64_t request_id,
                            uint32_t outcome,
                            uint64_t fencing_token,
                            uint64_t ttl_ms,
                            uint64_t retry_after_ms,
                            const uint8_t *backend_data,
                            size_t backend_data_len);

/**
 * Feeds the answer to a RENEW command (`LH_RENEW_*`). Stale request ids return `LH_OK`.
 *
 * # Safety
 * `c` is NULL or a live handle.
 */
lh_status lh_renew_result(struct lh_client *c, uint64_t now, uint64_t request_id, uint32_t outcome);

/**
 * Feeds the answer to a RELEASE command (`LH_RELEASE_*`). Stale request ids return `LH_OK`.
 *
 * # Safety
 * `c` is NULL or a live handle.
 */
lh_status lh_release_result(struct lh_client *c,
                            uint64_t now,
                            uint64_t request_id,
                            uint32_t outcome);

/**
 * Delivers one release notification for a watched `name` (wakes one local waiter).
 *
 * # Safety
 * `c` is NULL or a live handle; `name` points to `name_len` readable bytes.
 */
lh_status lh_released(struct lh_client *c, uint64_t now, const uint8_t *name, size_t name_len);

/**
 * Tells the core that time has passed (call it when the deadline from `lh_poll_timeout`
 * arrives; early or spurious calls are harmless).
 *
 * # Safety
 * `c` is NULL or a live handle.
 */
lh_status lh_timeout(struct lh_client *c, uint64_t now);

/**
 * Takes the next output into `*out`. `out->kind == LH_OUTPUT_NONE` when nothing is left;
 * drain until then after every input. Pointers in `*out` borrow handle memory and stay valid
 * until the next call on this handle.
 *
 * # Safety
 * `c` is NULL or a live handle; `out` is valid for writing one `lh_output`.
 */
lh_status lh_poll_output(struct lh_client *c, struct lh_output *out);

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

/**
 * Fills `*out` with the client's counters (`out->struct_size` must be set by the caller, at
 * least `LH_COUNTERS_V1_SIZE`; the library fills the fields that fit, up to its own struct,
 * and sets `struct_size` to the bytes it wrote).
 *
 * # Safety
 * `c` is NULL or a live handle; `out` is valid for reading and writing an `lh_counters`.
 */
lh_status lh_counters_get(const struct lh_client *c, struct lh_counters *out);

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
 * Fills `*out` with the default etcd options (no authentication, and `struct_size`).
 * NULL is ignored.
 *
 * # Safety
 * `out` is NULL or valid for writing one `lh_etcd_options`.
 */
void lh_etcd_options_default(struct lh_etcd_options *out);

/**
 * Creates a client with the etcd protocol attached (see the header's etcd run loop).
 * Arguments and errors as for `lh_client_new`, plus `opts` (NULL: no authentication).
 * Credentials that are not UTF-8 are `LH_ERR_INVALID_UTF8`; empty or overlong ones
 * `LH_ERR_INVALID_CONFIG`.
 *
 * # Safety
 * As for `lh_client_new`; `opts` is NULL or points to a readable `lh_etcd_options` whose
 * strings are readable for their lengths.
 */
lh_status lh_client_new_etcd(const struct lh_config *cfg,
                             const struct lh_etcd_options *opts,
                             const uint8_t *seed,
                             size_t seed_len,
                             struct lh_client **out);

/**
 * Takes the next request into `*out` (`out->id == 0` when none is left; drain until then
 * after every input, like `lh_poll_output`).
 *
 * # Safety
 * `c` is NULL or a live handle; `out` is valid for writing one `lh_http_request`.
 */
lh_status lh_http_poll_request(struct lh_client *c, struct lh_http_request *out);

/**
 * Hands back the reply to unary request `id`: the HTTP status (100..=599) and the whole
 * body (at most `LH_MAX_HTTP_BODY` bytes; NULL when empty). Read during the call, never
 * retained. Any status, error body or malformed JSON is the protocol's to judge (a
 * transport error for the engine, never a grant). Unknown and already answered ids are
 * counted and ignored (`LH_OK`).
 *
 * # Safety
 * `c` is NULL or a live handle; `body` points to `body_len` readable bytes.
 */
lh_status lh_http_reply(struct lh_client *c,
                        uint64_t now,
                        uint64_t id,
                        uint32_t status,
                        const uint8_t *body,
                        size_t body_len);

/**
 * One JSON message streamed on watch `id` (one line of its response body, without the
 * newline; at most `LH_MAX_HTTP_BODY` bytes).
 *
 * # Safety
 * `c` is NULL or a live handle; `message` points to `message_len` readable bytes.
 */
lh_status lh_http_stream_message(struct lh_client *c,
                                 uint64_t now,
                                 uint64_t id,
                                 const uint8_t *message,
                                 size_t message_len);

/**
 * Request `id` got no reply (connection refused or broken, timed out on every member), or
 * watch stream `id` ended. `message` is the client's text (UTF-8 not required; at most
 * `LH_MAX_HTTP_BODY` bytes, NULL when empty). Unknown ids are counted and ignored.
 *
 * # Safety
 * `c` is NULL or a live handle; `message` points to `message_len` readable bytes.
 */
lh_status lh_http_failed(struct lh_client *c,
                         uint64_t now,
                         uint64_t id,
                         const uint8_t *message,
                         size_t message_len);

/**
 * The client is closing: cancels acquires still waiting and queues a `lease/revoke` of
 * every pooled etcd lease (the keys of its locks go with it, so nothing of this client is
 * left on the cluster for a TTL); locks still held end Lost. Call it after releasing what
 * you hold and before `lh_client_free`, then run the loop until those requests are
 * answered, for a short bound (an unanswered revoke leaves the lease to expire on its own).
 *
 * # Safety
 * `c` is NULL or a live handle.
 */
lh_status lh_etcd_close(struct lh_client *c, uint64_t now);

/**
 * Writes the etcd protocol's counters (`out->struct_size` must be set).
 *
 * # Safety
 * `c` is NULL or a live handle; `out` is valid for writing `out->struct_size` bytes.
 */
lh_status lh_etcd_counters_get(const struct lh_client *c, struct lh_etcd_counters *out);

/**
 * The last error body, transport failure or malformed reply the protocol saw:
 * `*out_text` / `*out_len` (not NUL-terminated; length 0 if none), borrowed until the next
 * call on the handle.
 *
 * # Safety
 * `c` is NULL or a live handle; the out-pointers are valid for writes.
 */
lh_status lh_etcd_last_error(const struct lh_client *c, const uint8_t **out_text, size_t *out_len);

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
 * Acquires `name` for `token` for `ttl_ms` at host time `now` (monotonic ns; the service's
 * clock is it plus every clock step). Idempotent for the same token: the same fencing
 * token, the TTL counted again from now. `*out` receives GRANTED, HELD_BY_OTHER, DROPPED or
 * FULL, with `engine_outcome` an `LH_ACQUIRE_*` value.
 *
 * Errors (nothing changed, `*out` untouched): NULL pointers, small `out->struct_size`, bad
 * names (as for `lh_acquire`), a token empty or over `LH_MEMORY_MAX_TOKEN_LEN`
 * (`LH_ERR_INVALID_TOKEN`), `ttl_ms == 0` (`LH_ERR_INVALID_TTL`),
 * `LH_ERR_UNKNOWN_CONNECTION`.
 *
 * # Safety
 * `svc` is NULL or a live handle; `name`/`token` point to `name_len`/`token_len` readable
 * bytes; `out` is valid for writing one `lh_memory_result`.
 */
lh_status lh_memory_service_acquire(struct lh_memory_service *svc,
                                    uint64_t connection,
                                    uint64_t now,
                                    const uint8_t *name,
                                    size_t name_len,
                                    const uint8_t *token,
                                    size_t token_len,
                                    uint64_t ttl_ms,
                                    struct lh_memory_result *out);

/**
 * Extends `token`'s unexpired grant of `name` to `ttl_ms` from now. `*out` receives
 * RENEWED, REJECTED or DROPPED, with `engine_outcome` an `LH_RENEW_*` value. Errors as for
 * `lh_memory_service_acquire`.
 *
 * # Safety
 * As for `lh_memory_service_acquire`.
 */
lh_status lh_memory_service_renew(struct lh_memory_service *svc,
                                  uint64_t connection,
                                  uint64_t now,
                                  const uint8_t *name,
                                  size_t name_len,
                                  const uint8_t *token,
                                  size_t token_len,
                                  uint64_t ttl_ms,
                                  struct lh_memory_result *out);

/**
 * Deletes `token`'s unexpired grant of `name` and queues a release notification for every
 * connection watching it. `*out` receives RELEASED, NOT_OWNER (expired, or someone else's
 * now: nothing changed) or DROPPED, with `engine_outcome` an `LH_RELEASE_*` value. Errors
 * as for `lh_memory_service_acquire` (no TTL).
 *
 * # Safety
 * As for `lh_memory_service_acquire`.
 */
lh_status lh_memory_service_release(struct lh_memory_service *svc,
                                    uint64_t connection,
                                    uint64_t now,
                                    const uint8_t *name,
                                    size_t name_len,
                                    const uint8_t *token,
                                    size_t token_len,
                                    struct lh_memory_result *out);

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
 * Starts queueing release notifications of `name` for `connection` (idempotent).
 * Errors: bad names, `LH_ERR_UNKNOWN_CONNECTION`, `LH_ERR_LIMIT_REACHED` at `max_watches`.
 *
 * # Safety
 * `svc` is NULL or a live handle; `name` points to `name_len` readable bytes.
 */
lh_status lh_memory_service_watch(struct lh_memory_service *svc,
                                  uint64_t connection,
                                  const uint8_t *name,
                                  size_t name_len);

/**
 * Stops queueing release notifications of `name` for `connection` (idempotent; those
 * already queued stay). Errors: bad names, `LH_ERR_UNKNOWN_CONNECTION`.
 *
 * # Safety
 * `svc` is NULL or a live handle; `name` points to `name_len` readable bytes.
 */
lh_status lh_memory_service_unwatch(struct lh_memory_service *svc,
                                    uint64_t connection,
                                    const uint8_t *name,
                                    size_t name_len);

/**
 * Takes the oldest release notification queued for `connection`: `*out_name` /
 * `*out_name_len` receive the name (BORROWED, valid until the next call on this handle;
 * feed it to `lh_released`), or NULL / 0 when none is queued.
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
 * Fills `*out` with the default SQL options (SQLite, and `struct_size`). NULL is ignored.
 *
 * # Safety
 * `out` is NULL or valid for writing one `lh_sql_options`.
 */
void lh_sql_options_default(struct lh_sql_options *out);

/**
 * Creates a client with the SQL protocol attached (see the header's SQL run loop).
 * Arguments and errors as for `lh_client_new`, plus `opts` (required: it names the
 * dialect; an unknown dialect is `LH_ERR_INVALID_ENUM`, bad values `LH_ERR_INVALID_CONFIG`).
 * SQLite delivers no release notifications, so for it `cfg->notifications` is taken as 0
 * (waiters retry at the holder's expiry or by backoff). The first request is the migration.
 *
 * # Safety
 * As for `lh_client_new`; `opts` points to a readable `lh_sql_options`.
 */
lh_status lh_client_new_sql(const struct lh_config *cfg,
                            const struct lh_sql_options *opts,
                            const uint8_t *seed,
                            size_t seed_len,
                            struct lh_client **out);

/**
 * Takes the next request into `*out` (`out->id == 0` when none is left; drain until then
 * after every input, like `lh_poll_output`). Everything it points to borrows the handle
 * until the next call on it.
 *
 * # Safety
 * `c` is NULL or a live handle; `out` is valid for writing one `lh_sql_request`.
 */
lh_status lh_sql_poll_request(struct lh_client *c, struct lh_sql_request *out);

/**
 * Hands back the rows of request `id`: `nvalues` values in pre-order forming one array per
 * statement (in order, every statement included, an empty array for one without rows), of
 * rows, each an array of column values (NIL, INT — booleans as 0/1 —, FLOAT, TEXT, BULK for
 * blobs), and the `data_len` bytes their strings point into. Read during the call, never
 * retained. Unknown and already answered ids are counted and ignored (`LH_OK`). A malformed
 * or oversized list is `LH_ERR_INVALID_REPLY` and changes nothing: then report the request
 * with `lh_sql_failed`.
 *
 * # Safety
 * `c` is NULL or a live handle; `values` points to `nvalues` readable `lh_value`s and `data`
 * to `data_len` readable bytes (NULL allowed when the count is 0).
 */
lh_status lh_sql_result(struct lh_client *c,
                        uint64_t now,
                        uint64_t id,
                        const struct lh_value *values,
                        size_t nvalues,
                        const uint8_t *data,
                        size_t data_len);

/**
 * Request `id` failed: `kind` is `LH_SQL_FAILURE_TRANSPORT` or `LH_SQL_FAILURE_DATABASE`,
 * `message` the driver's text (UTF-8 not required; at most `LH_MAX_SQL_MESSAGE` bytes, NULL
 * when empty). The engine sees a transport error either way; the schema is checked again
 * before the next operation. Unknown ids are counted and ignored.
 *
 * # Safety
 * `c` is NULL or a live handle; `message` points to `message_len` readable bytes.
 */
lh_status lh_sql_failed(struct lh_client *c,
                        uint64_t now,
                        uint64_t id,
                        uint32_t kind,
                        const uint8_t *message,
                        size_t message_len);

/**
 * Delivers one notification received on the listener connection (PostgreSQL; every one:
 * the protocol ignores what is not its own). Channel and payload are at most
 * `LH_MAX_SQL_MESSAGE` bytes.
 *
 * # Safety
 * `c` is NULL or a live handle; `channel` and `payload` point to their lengths in readable
 * bytes (`payload` may be NULL when empty).
 */
lh_status lh_sql_notification(struct lh_client *c,
                              uint64_t now,
                              const uint8_t *channel,
                              size_t channel_len,
                              const uint8_t *payload,
                              size_t payload_len);

/**
 * The host opened `connection` (`LH_SQL_CONNECTION_*`) anew — after a transport failure,
 * a server restart, a replaced SQLite file: the schema is checked again before the next
 * operation; the listener LISTENs again (and each waiting name is checked once).
 *
 * # Safety
 * `c` is NULL or a live handle.
 */
lh_status lh_sql_connection_reset(struct lh_client *c, uint64_t now, uint32_t connection);

/**
 * `lh_status_request` under its first name (SQL handles came first).
 *
 * # Safety
 * As `lh_status_request`.
 */
lh_status lh_sql_status_request(struct lh_client *c,
                                uint64_t now,
                                const uint8_t *name,
                                size_t name_len,
                                uint64_t *out_id);

/**
 * `lh_poll_status` under its first name (SQL handles came first).
 *
 * # Safety
 * As `lh_poll_status`.
 */
lh_status lh_sql_poll_status(struct lh_client *c, struct lh_lock_status *out);

/**
 * The last database error, failed schema check or malformed result the protocol saw (a
 * read-only or corrupt file, a foreign table of the same name…), for the application's
 * diagnostics: `*out_text` / `*out_len` (not NUL-terminated; length 0 if none), borrowed
 * until the next call on the handle.
 *
 * # Safety
 * `c` is NULL or a live handle; the out-pointers are valid for writes.
 */
lh_status lh_sql_last_error(const struct lh_client *c, const uint8_t **out_text, size_t *out_len);

/**
 * Queues a status query for `name` (rules as for `lh_acquire`'s name) on the handle's
 * backend protocol; `*out_id` identifies its answer in `lh_poll_status`. Run the requests it
 * produces as usual. `LH_ERR_NO_BACKEND` on a handle without a protocol.
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

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* LEASEHOLD_H */
