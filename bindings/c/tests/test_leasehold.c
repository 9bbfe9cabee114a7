/*
 * test_leasehold.c -- the C ABI's conventions (include/leasehold.h) under hostile input.
 *
 * Every documented error code for NULL pointers, invalid UTF-8, oversized lengths, unknown
 * lease ids, enum values and flag bits, answers of the wrong kind (LH_ERR_WRONG_ANSWER),
 * malformed lh_value lists (LH_ERR_INVALID_REPLY), small struct_size fields; each leaves the
 * client unchanged and usable. Duplicate, late and unknown answers are counted
 * (backend_stale_replies) and ignored; time running backwards is clamped; per-handle error
 * detail; panics and poisoning; the memory service's own argument checks. Clients are on the
 * memory backend, their requests run on an lh_memory_service (harness.c); the engine's rules
 * are in test_lifecycle.c. Built twice by bindings/c/test.sh: with
 * -fsanitize=address,undefined and plain under valgrind. Time is virtual.
 */
#define _POSIX_C_SOURCE 200809L
#include "harness.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* The layouts ctypes and cgo mirror (LP64): a change here is an ABI break. */
_Static_assert(sizeof(lh_config) == 64, "lh_config layout");
_Static_assert(offsetof(lh_config, drift_fixed_ns) == 8, "lh_config layout");
_Static_assert(offsetof(lh_config, max_leases) == 56, "lh_config layout");
_Static_assert(sizeof(lh_acquire_options) == 24, "lh_acquire_options layout");
_Static_assert(sizeof(lh_event) == 32, "lh_event layout");
_Static_assert(offsetof(lh_event, lease_id) == 8, "lh_event layout");
_Static_assert(offsetof(lh_event, valid_until_ns) == 24, "lh_event layout");
_Static_assert(sizeof(lh_lease_info) == 32, "lh_lease_info layout");
_Static_assert(offsetof(lh_counters, stream_opens) == 328, "lh_counters layout");
_Static_assert(offsetof(lh_counters, sentinel_lookups) == 352, "lh_counters layout");
_Static_assert(offsetof(lh_counters, cluster_redirects) == 368 && sizeof(lh_counters) == 376, "lh_counters layout");
_Static_assert(offsetof(lh_counters, time_clamped) == 112, "lh_counters layout");
_Static_assert(offsetof(lh_counters, backend_requests) == 160, "lh_counters layout");
_Static_assert(offsetof(lh_counters, etcd_waiters_expired) == 320, "lh_counters layout");
/* lh_counters grows at the end only: hosts built against the first header pass this size. */
_Static_assert(offsetof(lh_counters, renewals_requested) == LH_COUNTERS_V1_SIZE, "lh_counters layout");
_Static_assert(sizeof(lh_backend_options) == 136, "lh_backend_options layout");
/* The stream fields were appended: hosts built against the header before them pass 88. */
_Static_assert(offsetof(lh_backend_options, redis_url) == 88, "lh_backend_options layout");
_Static_assert(offsetof(lh_backend_options, sqlite_busy_timeout_ms) == 48, "lh_backend_options layout");
_Static_assert(offsetof(lh_backend_options, etcd_password_len) == 80, "lh_backend_options layout");
_Static_assert(sizeof(lh_io_request) == 144, "lh_io_request layout");
_Static_assert(offsetof(lh_io_request, stream) == 96 && offsetof(lh_io_request, port) == 136, "lh_io_request layout");
_Static_assert(offsetof(lh_io_request, argv) == 16, "lh_io_request layout");
_Static_assert(offsetof(lh_io_request, nstatements) == 28, "lh_io_request layout");
_Static_assert(offsetof(lh_io_request, data) == 56, "lh_io_request layout");
_Static_assert(offsetof(lh_io_request, authorization) == 88, "lh_io_request layout");
_Static_assert(sizeof(lh_value) == 32 && offsetof(lh_value, offset) == 16, "lh_value layout");
_Static_assert(sizeof(lh_bytes) == 16 && sizeof(lh_sql_statement) == 24, "lh_bytes layout");
_Static_assert(sizeof(lh_memory_answer) == 40 && offsetof(lh_memory_answer, data_len) == 32, "answer layout");
_Static_assert(sizeof(lh_lock_status) == 96 && offsetof(lh_lock_status, error_len) == 88, "lh_lock_status layout");

/* A valid one-value answer (nil), for ids the handle does not know. */
static const lh_value NIL_VALUE = {.kind = LH_VALUE_NIL};

/* A client with one acquire of NAME in flight; *q receives its request (copied). */
static lh_client *acquiring(call *q, uint64_t *lease) {
    lh_client *c = mk();
    lh_acquire_options o = opts_ttl(3000);
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, lease), LH_OK);
    EXPECT(poll_call(c, q));
    EXPECT(q->kind == LH_IO_COMMAND && q->connection == LH_CONNECTION_COMMANDS && q->id != 0 && q->argc > 0);
    call none;
    EXPECT(!poll_call(c, &none));
    return c;
}

/* Runs `q` of `c` on a fresh service and answers it; the lease must then be held. */
static void answer_on_fresh_service(lh_client *c, const call *q, uint64_t lease) {
    world w;
    world_init(&w, 0, NULL);
    w.n = 1;
    w.p[0].c = c;
    EXPECT_ST(lh_memory_service_connect(w.svc, &w.p[0].conn), LH_OK);
    run_call(&w, 0, q, 1 * MS);
    uint32_t st = 0;
    EXPECT_ST(lh_lease_state(c, lease, &st), LH_OK);
    EXPECT(st == LH_STATE_HELD);
    w.n = 0; /* the caller frees the client */
    world_free(&w);
}

static void version_macros_match_library(void) {
    EXPECT(strcmp(lh_version(), LH_VERSION) == 0);
    EXPECT(lh_abi_version() == LH_ABI_VERSION);
    EXPECT(LH_ABI_VERSION == 4);
}

static void status_str_names_every_code(void) {
    static const struct { uint32_t code; const char *name; } table[] = {
        {LH_OK, "LH_OK"}, {LH_ERR_NULL_ARGUMENT, "LH_ERR_NULL_ARGUMENT"},
        {LH_ERR_INVALID_UTF8, "LH_ERR_INVALID_UTF8"}, {LH_ERR_EMPTY_NAME, "LH_ERR_EMPTY_NAME"},
        {LH_ERR_NAME_TOO_LONG, "LH_ERR_NAME_TOO_LONG"}, {LH_ERR_NAME_HAS_NUL, "LH_ERR_NAME_HAS_NUL"},
        {LH_ERR_INVALID_TTL, "LH_ERR_INVALID_TTL"}, {LH_ERR_INVALID_CONFIG, "LH_ERR_INVALID_CONFIG"},
        {LH_ERR_SEED_TOO_SHORT, "LH_ERR_SEED_TOO_SHORT"}, {LH_ERR_UNKNOWN_LEASE, "LH_ERR_UNKNOWN_LEASE"},
        {LH_ERR_LEASE_ENDED, "LH_ERR_LEASE_ENDED"}, {LH_ERR_TOO_MANY_LEASES, "LH_ERR_TOO_MANY_LEASES"},
        {LH_ERR_INVALID_ENUM, "LH_ERR_INVALID_ENUM"},
        {LH_ERR_BACKEND_DATA_TOO_LONG, "LH_ERR_BACKEND_DATA_TOO_LONG"},
        {LH_ERR_BUFFER_TOO_SMALL, "LH_ERR_BUFFER_TOO_SMALL"}, {LH_ERR_NOT_GRANTED, "LH_ERR_NOT_GRANTED"},
        {LH_ERR_STRUCT_SIZE, "LH_ERR_STRUCT_SIZE"}, {LH_ERR_INVALID_REPLY, "LH_ERR_INVALID_REPLY"},
        {LH_ERR_NO_BACKEND, "LH_ERR_NO_BACKEND"}, {LH_ERR_INVALID_TOKEN, "LH_ERR_INVALID_TOKEN"},
        {LH_ERR_UNKNOWN_CONNECTION, "LH_ERR_UNKNOWN_CONNECTION"},
        {LH_ERR_LIMIT_REACHED, "LH_ERR_LIMIT_REACHED"}, {LH_ERR_WRONG_ANSWER, "LH_ERR_WRONG_ANSWER"},
        {LH_ERR_PANIC, "LH_ERR_PANIC"}, {LH_ERR_POISONED, "LH_ERR_POISONED"},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        EXPECT(strcmp(lh_status_str(table[i].code), table[i].name) == 0);
    EXPECT(strcmp(lh_status_str(23), "LH_UNKNOWN_STATUS") == 0);
    EXPECT(strcmp(lh_status_str(899), "LH_UNKNOWN_STATUS") == 0);
    EXPECT(strcmp(lh_status_str(UINT32_MAX), "LH_UNKNOWN_STATUS") == 0);
}

static void defaults_fill_structs(void) {
    lh_config cfg;
    lh_acquire_options o;
    memset(&cfg, 0, sizeof cfg);
    lh_config_default(&cfg);
    EXPECT(cfg.struct_size == sizeof cfg);
    EXPECT(cfg.drift_ppm == 10000 && cfg.drift_fixed_ns == 2 * MS && cfg.renew_jitter_ppm == 100000);
    EXPECT(cfg.fail_budget == 0 && cfg.request_timeout_ns == 2000 * MS && cfg.notifications == 1);
    EXPECT(cfg.max_ttl_ms == 604800000ull && cfg.max_leases == 1048576u);
    lh_acquire_options_default(&o);
    EXPECT(o.struct_size == sizeof o && o.flags == 0 && o.ttl_ms == LH_DEFAULT_TTL_MS && o.wait_ns == 0);
    lh_config_default(NULL);          /* ignored */
    lh_acquire_options_default(NULL); /* ignored */

    static const uint32_t kinds[] = {LH_BACKEND_MEMORY, LH_BACKEND_REDIS, LH_BACKEND_SQLITE, LH_BACKEND_POSTGRES,
                                     LH_BACKEND_ETCD};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        lh_backend_options b;
        memset(&b, 0x5a, sizeof b);
        EXPECT_ST(lh_backend_options_default(kinds[i], &b), LH_OK);
        EXPECT(b.struct_size == sizeof b && b.kind == kinds[i]);
        EXPECT(b.redis_standby_delay_ms == 150 && b.redis_key_keep_ms == 60000 && b.redis_queue_max_age_ms == 600000);
        EXPECT(b.redis_idle_recheck_ms == 10000 && b.redis_sharded_wake == 0 && b.postgres_asynchronous_commit == 0);
        EXPECT(b.sqlite_busy_timeout_ms == 5000);
        EXPECT(b.etcd_user == NULL && b.etcd_user_len == 0 && b.etcd_password == NULL && b.etcd_password_len == 0);
    }
    lh_backend_options b;
    memset(&b, 0x5a, sizeof b);
    EXPECT_ST(lh_backend_options_default(0, &b), LH_ERR_INVALID_ENUM);
    EXPECT_ST(lh_backend_options_default(LH_BACKEND_REDIS_STREAM + 1, &b), LH_ERR_INVALID_ENUM);
    EXPECT_ST(lh_backend_options_default(UINT32_MAX, &b), LH_ERR_INVALID_ENUM);
    EXPECT(b.struct_size == 0x5a5a5a5au); /* untouched */
    EXPECT_ST(lh_backend_options_default(LH_BACKEND_MEMORY, NULL), LH_ERR_NULL_ARGUMENT);

    lh_memory_config mc;
    lh_memory_config_default(&mc);
    EXPECT(mc.struct_size == sizeof mc && mc.max_names == 65536 && mc.max_connections == 1024);
    EXPECT(mc.max_watches == 4096 && mc.max_pending == 1024);
    lh_memory_config_default(NULL);
}

static void client_new_rejects_hostile_arguments(void) {
    lh_config cfg;
    lh_backend_options b;
    lh_client *sentinel = (lh_client *)(uintptr_t)0x1234;
    lh_client *c = sentinel;
    lh_config_default(&cfg);
    EXPECT_ST(lh_backend_options_default(LH_BACKEND_MEMORY, &b), LH_OK);
    EXPECT_ST(lh_client_new(NULL, &b, SEED, sizeof SEED, &c), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_client_new(&cfg, NULL, SEED, sizeof SEED, &c), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_client_new(&cfg, &b, NULL, sizeof SEED, &c), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_client_new(&cfg, &b, NULL, 0, &c), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_client_new(&cfg, &b, SEED, sizeof SEED, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_client_new(&cfg, &b, SEED, LH_MIN_SEED_LEN - 1, &c), LH_ERR_SEED_TOO_SHORT);
    EXPECT_ST(lh_client_new(&cfg, &b, SEED, 0, &c), LH_ERR_SEED_TOO_SHORT);
    EXPECT_ST(lh_client_new(&cfg, &b, SEED, SIZE_MAX, &c), LH_ERR_INVALID_CONFIG);
    EXPECT_ST(lh_client_new(&cfg, &b, SEED, LH_MAX_SEED_LEN + 1, &c), LH_ERR_INVALID_CONFIG);
    cfg.notifications = 2;
    EXPECT_ST(lh_client_new(&cfg, &b, SEED, sizeof SEED, &c), LH_ERR_INVALID_CONFIG);
    lh_config_default(&cfg);
    cfg.struct_size = 0;
    EXPECT_ST(lh_client_new(&cfg, &b, SEED, sizeof SEED, &c), LH_ERR_STRUCT_SIZE);
    cfg.struct_size = sizeof cfg - 1;
    EXPECT_ST(lh_client_new(&cfg, &b, SEED, sizeof SEED, &c), LH_ERR_STRUCT_SIZE);
    lh_config_default(&cfg);
    cfg.max_leases = 0;
    EXPECT_ST(lh_client_new(&cfg, &b, SEED, sizeof SEED, &c), LH_ERR_INVALID_CONFIG);
    lh_config_default(&cfg);
    /* The backend options: their size, their kind, their values. */
    b.struct_size = sizeof b - 8;
    EXPECT_ST(lh_client_new(&cfg, &b, SEED, sizeof SEED, &c), LH_ERR_STRUCT_SIZE);
    const uint32_t bad_kinds[] = {0, LH_BACKEND_REDIS_STREAM + 1, UINT32_MAX};
    for (size_t i = 0; i < 3; i++) {
        EXPECT_ST(lh_backend_options_default(LH_BACKEND_MEMORY, &b), LH_OK);
        b.kind = bad_kinds[i];
        EXPECT_ST(lh_client_new(&cfg, &b, SEED, sizeof SEED, &c), LH_ERR_INVALID_ENUM);
    }
    EXPECT_ST(lh_backend_options_default(LH_BACKEND_REDIS, &b), LH_OK);
    b.redis_sharded_wake = 2;
    EXPECT_ST(lh_client_new(&cfg, &b, SEED, sizeof SEED, &c), LH_ERR_INVALID_CONFIG);
    EXPECT_ST(lh_backend_options_default(LH_BACKEND_POSTGRES, &b), LH_OK);
    b.postgres_asynchronous_commit = 7;
    EXPECT_ST(lh_client_new(&cfg, &b, SEED, sizeof SEED, &c), LH_ERR_INVALID_CONFIG);
    static const uint8_t not_utf8[] = {'u', 0xff};
    char long_user[300];
    memset(long_user, 'u', sizeof long_user);
    EXPECT_ST(lh_backend_options_default(LH_BACKEND_ETCD, &b), LH_OK);
    b.etcd_user = not_utf8;
    b.etcd_user_len = sizeof not_utf8;
    EXPECT_ST(lh_client_new(&cfg, &b, SEED, sizeof SEED, &c), LH_ERR_INVALID_UTF8);
    b.etcd_user = (const uint8_t *)long_user;
    b.etcd_user_len = sizeof long_user;
    EXPECT_ST(lh_client_new(&cfg, &b, SEED, sizeof SEED, &c), LH_ERR_INVALID_CONFIG);
    b.etcd_user = NULL;
    b.etcd_user_len = 4;
    EXPECT_ST(lh_client_new(&cfg, &b, SEED, sizeof SEED, &c), LH_ERR_NULL_ARGUMENT);
    EXPECT(c == sentinel); /* out-param untouched on every failure */
    EXPECT_ST(lh_backend_options_default(LH_BACKEND_MEMORY, &b), LH_OK);
    EXPECT_ST(lh_client_new(&cfg, &b, SEED, LH_MIN_SEED_LEN, &c), LH_OK);
    EXPECT(c != sentinel && c != NULL);
    lh_client_free(c);
    lh_client_free(NULL);
}

/* Every backend is created the same way and asks for its first IO through lh_io_poll. */
static void every_backend_speaks_through_lh_io_poll(void) {
    static const struct { uint32_t kind, io, connection; int at_once; } table[] = {
        {LH_BACKEND_MEMORY, LH_IO_COMMAND, LH_CONNECTION_COMMANDS, 0},
        {LH_BACKEND_REDIS, LH_IO_COMMAND, LH_CONNECTION_NOTIFY, 1},   /* the wake channel's SUBSCRIBE */
        {LH_BACKEND_SQLITE, LH_IO_SQL, LH_CONNECTION_COMMANDS, 0},     /* the schema check, then */
        {LH_BACKEND_POSTGRES, LH_IO_SQL, LH_CONNECTION_COMMANDS, 0},
        {LH_BACKEND_ETCD, LH_IO_HTTP, LH_CONNECTION_COMMANDS, 0},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        lh_config cfg;
        lh_backend_options b;
        lh_client *c = NULL;
        lh_config_default(&cfg);
        EXPECT_ST(lh_backend_options_default(table[i].kind, &b), LH_OK);
        EXPECT_ST(lh_client_new(&cfg, &b, SEED, sizeof SEED, &c), LH_OK);
        if (c == NULL) continue;
        lh_io_request q;
        EXPECT_ST(lh_io_poll(c, &q), LH_OK);
        if (!table[i].at_once) {
            EXPECT(q.kind == LH_IO_NONE && q.id == 0); /* nothing before the first acquire */
            lh_acquire_options o = opts_ttl(3000);
            uint64_t lease;
            EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_OK);
            EXPECT_ST(lh_io_poll(c, &q), LH_OK);
        }
        EXPECT(q.id != 0 && q.kind == table[i].io && q.connection == table[i].connection);
        if (q.kind == LH_IO_COMMAND) EXPECT(q.argc > 0 && q.argv != NULL && q.nstatements == 0 && q.method == NULL);
        if (q.kind == LH_IO_SQL)
            EXPECT(q.nstatements > 0 && q.statements != NULL && q.data != NULL && q.argc == 0 &&
                   q.statements[0].sql_offset + q.statements[0].sql_len < q.data_len &&
                   q.data[q.statements[0].sql_offset + q.statements[0].sql_len] == 0);
        if (q.kind == LH_IO_HTTP)
            EXPECT(strcmp(q.method, "POST") == 0 && q.path[0] == '/' && q.authorization != NULL &&
                   q.data != NULL && q.data_len > 0 && q.data[q.data_len] == 0 && q.argc == 0);
        lh_client_free(c);
    }
}

static void null_handle_is_an_error_everywhere(void) {
    lh_acquire_options o = opts_ttl(1000);
    lh_event ev;
    lh_io_request q;
    lh_lease_info info;
    lh_counters k;
    lh_lock_status ls;
    uint64_t u64 = 7;
    uint32_t u32 = 7;
    bool b = false;
    info.struct_size = sizeof info;
    k.struct_size = sizeof k;
    ls.struct_size = sizeof ls;
    EXPECT_ST(lh_client_reseed(NULL, SEED, sizeof SEED), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_acquire(NULL, 0, NAME, NAME_LEN, &o, &u64), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_release(NULL, 0, 1, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_release(NULL, 0, 1, &u32), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_renew(NULL, 0, 1), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_timeout(NULL, 0), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_poll_event(NULL, &ev), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_poll_timeout(NULL, &u64), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_io_poll(NULL, &q), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_io_reply(NULL, 0, 1, &NIL_VALUE, 1, NULL, 0), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_io_http_reply(NULL, 0, 1, 200, NULL, 0), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_io_stream_message(NULL, 0, 1, NULL, 0), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_io_failed(NULL, 0, 1, LH_FAILURE_TRANSPORT, NULL, 0), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_io_message(NULL, 0, NAME, NAME_LEN, NULL, 0), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_io_connection(NULL, 0, LH_CONNECTION_COMMANDS, LH_CONNECTION_REOPENED, NULL, 0),
              LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_io_close(NULL, 0), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_status_request(NULL, 0, NAME, NAME_LEN, &u64), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_poll_status(NULL, &ls), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_lease_state(NULL, 1, &u32), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_lease_info_get(NULL, 1, &info), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_fencing_token(NULL, 1, &u64), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_valid_until(NULL, 1, &u64), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_is_held(NULL, 1, 0, &b), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_counters_get(NULL, &k), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_client_debug_panic(NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT(strcmp(lh_client_last_error(NULL), "") == 0);
    EXPECT(strcmp(lh_backend_last_error(NULL), "") == 0);
    EXPECT(u64 == 7 && u32 == 7 && b == false);
}

static void null_out_params_are_errors_and_change_nothing(void) {
    lh_client *c = mk();
    lh_acquire_options o = opts_ttl(1000);
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT(counters(c).acquires_sent == 0);
    EXPECT(strlen(lh_client_last_error(c)) > 0);
    EXPECT_ST(lh_poll_timeout(c, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_lease_state(c, 1, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_lease_info_get(c, 1, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_fencing_token(c, 1, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_valid_until(c, 1, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_is_held(c, 1, 0, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_counters_get(c, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_status_request(c, 0, NAME, NAME_LEN, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_poll_status(c, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT(counters(c).backend_requests == 0);
    /* A NULL out for lh_io_poll / lh_poll_event must not consume the request / the event. */
    uint64_t lease = 0;
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_OK);
    EXPECT_ST(lh_io_poll(c, NULL), LH_ERR_NULL_ARGUMENT);
    call q;
    EXPECT(poll_call(c, &q) && q.kind == LH_IO_COMMAND);
    EXPECT_ST(lh_release(c, 1, lease, NULL), LH_OK); /* cancelled: ACQUIRE_FAILED queued */
    EXPECT_ST(lh_poll_event(c, NULL), LH_ERR_NULL_ARGUMENT);
    lh_event ev;
    EXPECT_ST(lh_poll_event(c, &ev), LH_OK);
    EXPECT(ev.kind == LH_EVENT_ACQUIRE_FAILED && ev.lease_id == lease && ev.reason == LH_REASON_CANCELLED);
    lh_client_free(c);
}

static void acquire_rejects_hostile_names_and_options(void) {
    lh_client *c = mk();
    lh_acquire_options o = opts_ttl(1000);
    uint64_t lease = 99;
    uint8_t long_name[LH_MAX_NAME_LEN + 1];
    memset(long_name, 'a', sizeof long_name);
    static const uint8_t bad_utf8_1[] = {0xff};
    static const uint8_t bad_utf8_2[] = {'a', 0xc3, 0x28};
    static const uint8_t overlong_slash[] = {0xc0, 0xaf};
    static const uint8_t surrogate[] = {0xed, 0xa0, 0x80};
    static const uint8_t with_nul[] = {'a', 0, 'b'};

    EXPECT_ST(lh_acquire(c, 0, NULL, NAME_LEN, &o, &lease), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_acquire(c, 0, NULL, 0, &o, &lease), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, NULL, &lease), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_acquire(c, 0, bad_utf8_1, sizeof bad_utf8_1, &o, &lease), LH_ERR_INVALID_UTF8);
    EXPECT_ST(lh_acquire(c, 0, bad_utf8_2, sizeof bad_utf8_2, &o, &lease), LH_ERR_INVALID_UTF8);
    EXPECT_ST(lh_acquire(c, 0, overlong_slash, sizeof overlong_slash, &o, &lease), LH_ERR_INVALID_UTF8);
    EXPECT_ST(lh_acquire(c, 0, surrogate, sizeof surrogate, &o, &lease), LH_ERR_INVALID_UTF8);
    EXPECT_ST(lh_acquire(c, 0, NAME, 0, &o, &lease), LH_ERR_EMPTY_NAME);
    EXPECT_ST(lh_acquire(c, 0, long_name, sizeof long_name, &o, &lease), LH_ERR_NAME_TOO_LONG);
    EXPECT_ST(lh_acquire(c, 0, NAME, SIZE_MAX, &o, &lease), LH_ERR_NAME_TOO_LONG);
    EXPECT_ST(lh_acquire(c, 0, NAME, (size_t)1 << 62, &o, &lease), LH_ERR_NAME_TOO_LONG);
    EXPECT_ST(lh_acquire(c, 0, with_nul, sizeof with_nul, &o, &lease), LH_ERR_NAME_HAS_NUL);
    o.ttl_ms = 0;
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_ERR_INVALID_TTL);
    o.ttl_ms = UINT64_MAX; /* "-1" from a careless host */
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_ERR_INVALID_TTL);
    o.ttl_ms = 604800000ull + 1;
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_ERR_INVALID_TTL);
    o = opts_ttl(1000);
    o.flags = 4;
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_ERR_INVALID_ENUM);
    o.flags = UINT32_MAX;
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_ERR_INVALID_ENUM);
    o = opts_ttl(1000);
    o.struct_size = 4;
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_ERR_STRUCT_SIZE);
    EXPECT(strstr(lh_client_last_error(c), "struct_size") != NULL);
    /* The same rules for a status query's name. */
    uint64_t sid = 5;
    EXPECT_ST(lh_status_request(c, 0, bad_utf8_1, sizeof bad_utf8_1, &sid), LH_ERR_INVALID_UTF8);
    EXPECT_ST(lh_status_request(c, 0, NAME, 0, &sid), LH_ERR_EMPTY_NAME);
    EXPECT_ST(lh_status_request(c, 0, long_name, sizeof long_name, &sid), LH_ERR_NAME_TOO_LONG);
    EXPECT_ST(lh_status_request(c, 0, with_nul, sizeof with_nul, &sid), LH_ERR_NAME_HAS_NUL);
    EXPECT(sid == 5);

    /* Nothing happened: no lease, no request, out-params untouched; the client still works
     * and the longest name is locked on the service. */
    EXPECT(lease == 99);
    lh_counters k = counters(c);
    EXPECT(k.acquires_sent == 0 && k.live_leases == 0 && k.backend_requests == 0);
    call q;
    EXPECT(!poll_call(c, &q));
    world w;
    world_init(&w, 0, NULL);
    w.n = 1;
    w.p[0].c = c;
    EXPECT_ST(lh_memory_service_connect(w.svc, &w.p[0].conn), LH_OK);
    o = opts_ttl(1000);
    EXPECT_ST(lh_acquire(c, 0, long_name, LH_MAX_NAME_LEN, &o, &lease), LH_OK);
    EXPECT(lease != 99);
    pump(&w, 1 * MS);
    EXPECT(find_event(&w.p[0], LH_EVENT_ACQUIRED, lease) != NULL);
    lh_memory_status st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    EXPECT_ST(lh_memory_service_status(w.svc, 1 * MS, long_name, LH_MAX_NAME_LEN, &st), LH_OK);
    EXPECT(st.held == 1 && st.holder_connection == w.p[0].conn);
    world_free(&w);
}

static void unknown_lease_ids_are_errors(void) {
    lh_client *c = mk();
    uint64_t u64 = 5;
    uint32_t u32 = 5;
    bool b = true;
    lh_lease_info info;
    info.struct_size = sizeof info;
    const uint64_t ids[] = {0, 1, 12345, UINT64_MAX};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        EXPECT_ST(lh_release(c, 0, ids[i], NULL), LH_ERR_UNKNOWN_LEASE);
        EXPECT_ST(lh_release(c, 0, ids[i], &u32), LH_ERR_UNKNOWN_LEASE);
        EXPECT_ST(lh_renew(c, 0, ids[i]), LH_ERR_UNKNOWN_LEASE);
        EXPECT_ST(lh_lease_state(c, ids[i], &u32), LH_ERR_UNKNOWN_LEASE);
        EXPECT_ST(lh_lease_info_get(c, ids[i], &info), LH_ERR_UNKNOWN_LEASE);
        EXPECT_ST(lh_fencing_token(c, ids[i], &u64), LH_ERR_UNKNOWN_LEASE);
        EXPECT_ST(lh_valid_until(c, ids[i], &u64), LH_ERR_UNKNOWN_LEASE);
        EXPECT_ST(lh_is_held(c, ids[i], 0, &b), LH_ERR_UNKNOWN_LEASE);
    }
    EXPECT(u64 == 5 && u32 == 5 && b == true);
    EXPECT(strlen(lh_client_last_error(c)) > 0);
    call q;
    EXPECT(!poll_call(c, &q));
    lh_client_free(c);
}

static void unknown_enum_values_are_errors(void) {
    call q;
    uint64_t lease = 0;
    lh_client *c = acquiring(&q, &lease);
    const uint32_t bad[] = {0, 3, 17, UINT32_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        EXPECT_ST(lh_io_failed(c, 1, q.id, bad[i], NULL, 0), LH_ERR_INVALID_ENUM);
        EXPECT_ST(lh_io_connection(c, 1, bad[i], LH_CONNECTION_REOPENED, NULL, 0), LH_ERR_INVALID_ENUM);
        EXPECT_ST(lh_io_connection(c, 1, LH_CONNECTION_COMMANDS, bad[i] == 3 ? 4 : bad[i], NULL, 0),
                  LH_ERR_INVALID_ENUM);
    }
    EXPECT(strstr(lh_client_last_error(c), "connection event") != NULL);
    /* The acquire is still pending and still answerable. */
    uint32_t st = 0;
    EXPECT_ST(lh_lease_state(c, lease, &st), LH_OK);
    EXPECT(st == LH_STATE_ACQUIRING);
    lh_counters k = counters(c);
    EXPECT(k.backend_stale_replies == 0 && k.backend_transport_failures == 0);
    answer_on_fresh_service(c, &q, lease);
    lh_client_free(c);
}

/* An answer of a kind the handle's backend cannot have is LH_ERR_WRONG_ANSWER and changes
 * nothing. */
static void answers_of_the_wrong_kind_are_refused(void) {
    call q;
    uint64_t lease = 0;
    lh_client *c = acquiring(&q, &lease);
    static const uint8_t body[] = "{}";
    EXPECT_ST(lh_io_http_reply(c, 1, q.id, 200, body, 2), LH_ERR_WRONG_ANSWER);
    EXPECT(strlen(lh_client_last_error(c)) > 0);
    EXPECT_ST(lh_io_stream_message(c, 1, q.id, body, 2), LH_ERR_WRONG_ANSWER);
    EXPECT_ST(lh_io_connection(c, 1, LH_CONNECTION_NOTIFY, LH_CONNECTION_SUBSCRIBED, NAME, NAME_LEN),
              LH_ERR_WRONG_ANSWER);
    EXPECT_ST(lh_io_connection(c, 1, LH_CONNECTION_COMMANDS, LH_CONNECTION_UNSUBSCRIBED, NAME, NAME_LEN),
              LH_ERR_WRONG_ANSWER);
    EXPECT_ST(lh_io_http_reply(c, 1, q.id, 99, NULL, 0), LH_ERR_INVALID_REPLY); /* not an HTTP status */
    EXPECT_ST(lh_io_http_reply(c, 1, q.id, 600, NULL, 0), LH_ERR_INVALID_REPLY);
    uint32_t st = 0;
    EXPECT_ST(lh_lease_state(c, lease, &st), LH_OK);
    EXPECT(st == LH_STATE_ACQUIRING);
    EXPECT(counters(c).backend_stale_replies == 0);
    answer_on_fresh_service(c, &q, lease);
    lh_client_free(c);

    /* etcd: values and messages are not its answers; SQL: no subscriptions; Redis: no HTTP. */
    static const struct { uint32_t kind; int values, message, subscribe, http; } table[] = {
        {LH_BACKEND_ETCD, 1, 1, 1, 0},
        {LH_BACKEND_SQLITE, 0, 0, 1, 1},
        {LH_BACKEND_REDIS, 0, 0, 0, 1},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        lh_config cfg;
        lh_backend_options b;
        lh_client *h = NULL;
        lh_config_default(&cfg);
        EXPECT_ST(lh_backend_options_default(table[i].kind, &b), LH_OK);
        EXPECT_ST(lh_client_new(&cfg, &b, SEED, sizeof SEED, &h), LH_OK);
        if (table[i].values) EXPECT_ST(lh_io_reply(h, 0, 1, &NIL_VALUE, 1, NULL, 0), LH_ERR_WRONG_ANSWER);
        if (table[i].message) EXPECT_ST(lh_io_message(h, 0, NAME, NAME_LEN, NULL, 0), LH_ERR_WRONG_ANSWER);
        if (table[i].subscribe)
            EXPECT_ST(lh_io_connection(h, 0, LH_CONNECTION_NOTIFY, LH_CONNECTION_SUBSCRIBED, NAME, NAME_LEN),
                      LH_ERR_WRONG_ANSWER);
        if (table[i].http) {
            EXPECT_ST(lh_io_http_reply(h, 0, 1, 200, NULL, 0), LH_ERR_WRONG_ANSWER);
            EXPECT_ST(lh_io_stream_message(h, 0, 1, NULL, 0), LH_ERR_WRONG_ANSWER);
        }
        EXPECT_ST(lh_io_connection(h, 0, LH_CONNECTION_COMMANDS, LH_CONNECTION_REOPENED, NULL, 0), LH_OK);
        lh_client_free(h);
    }
}

/* A malformed or oversized value list is LH_ERR_INVALID_REPLY (or NULL_ARGUMENT) and changes
 * nothing: the request is still pending and its real answer still counts. */
static void malformed_value_lists_are_invalid_replies(void) {
    call q;
    uint64_t lease = 0;
    lh_client *c = acquiring(&q, &lease);
    static const uint8_t data[] = "GRANTED";
    lh_value v[LH_MAX_REPLY_DEPTH + 2];
    memset(v, 0, sizeof v);
    EXPECT_ST(lh_io_reply(c, 1, q.id, NULL, 1, NULL, 0), LH_ERR_NULL_ARGUMENT);
    lh_status empty = lh_io_reply(c, 1, q.id, NULL, 0, NULL, 0);
    EXPECT(empty == LH_ERR_NULL_ARGUMENT || empty == LH_ERR_INVALID_REPLY);
    EXPECT_ST(lh_io_reply(c, 1, q.id, v, 0, NULL, 0), LH_ERR_INVALID_REPLY); /* no value */
    v[0].kind = 99;                                                          /* unknown kind */
    EXPECT_ST(lh_io_reply(c, 1, q.id, v, 1, NULL, 0), LH_ERR_INVALID_REPLY);
    v[0].kind = 0;
    EXPECT_ST(lh_io_reply(c, 1, q.id, v, 1, NULL, 0), LH_ERR_INVALID_REPLY);
    v[0].kind = LH_VALUE_TEXT; /* an SQL column is not a reply value */
    EXPECT_ST(lh_io_reply(c, 1, q.id, v, 1, data, 7), LH_ERR_INVALID_REPLY);
    v[0] = (lh_value){.kind = LH_VALUE_ARRAY, .len = 3}; /* announces more than follow */
    v[1] = (lh_value){.kind = LH_VALUE_STATUS, .offset = 0, .len = 7};
    EXPECT_ST(lh_io_reply(c, 1, q.id, v, 2, data, 7), LH_ERR_INVALID_REPLY);
    v[0].len = UINT64_MAX;
    EXPECT_ST(lh_io_reply(c, 1, q.id, v, 2, data, 7), LH_ERR_INVALID_REPLY);
    v[0] = (lh_value){.kind = LH_VALUE_BULK, .offset = 3, .len = 5}; /* outside the data */
    EXPECT_ST(lh_io_reply(c, 1, q.id, v, 1, data, 7), LH_ERR_INVALID_REPLY);
    v[0] = (lh_value){.kind = LH_VALUE_STATUS, .offset = UINT64_MAX, .len = 2}; /* overflowing */
    EXPECT_ST(lh_io_reply(c, 1, q.id, v, 1, data, 7), LH_ERR_INVALID_REPLY);
    v[0] = (lh_value){.kind = LH_VALUE_NIL};
    v[1] = (lh_value){.kind = LH_VALUE_NIL}; /* trailing values */
    EXPECT_ST(lh_io_reply(c, 1, q.id, v, 2, NULL, 0), LH_ERR_INVALID_REPLY);
    for (size_t i = 0; i <= LH_MAX_REPLY_DEPTH; i++) v[i] = (lh_value){.kind = LH_VALUE_ARRAY, .len = 1};
    v[LH_MAX_REPLY_DEPTH + 1] = (lh_value){.kind = LH_VALUE_NIL}; /* nested one level too deep */
    EXPECT_ST(lh_io_reply(c, 1, q.id, v, LH_MAX_REPLY_DEPTH + 2, NULL, 0), LH_ERR_INVALID_REPLY);
    /* Over the limits, and a data pointer that is NULL with a length. */
    lh_value *many = calloc(LH_MAX_REPLY_VALUES + 1, sizeof *many);
    uint8_t *big = calloc(LH_MAX_REPLY_DATA + 1, 1);
    EXPECT(many != NULL && big != NULL);
    if (many != NULL && big != NULL) {
        many[0] = (lh_value){.kind = LH_VALUE_ARRAY, .len = LH_MAX_REPLY_VALUES};
        for (size_t i = 1; i <= LH_MAX_REPLY_VALUES; i++) many[i].kind = LH_VALUE_NIL;
        EXPECT_ST(lh_io_reply(c, 1, q.id, many, LH_MAX_REPLY_VALUES + 1, NULL, 0), LH_ERR_INVALID_REPLY);
        EXPECT_ST(lh_io_reply(c, 1, q.id, many, SIZE_MAX, NULL, 0), LH_ERR_INVALID_REPLY);
        many[0] = (lh_value){.kind = LH_VALUE_BULK, .len = LH_MAX_REPLY_DATA + 1};
        EXPECT_ST(lh_io_reply(c, 1, q.id, many, 1, big, LH_MAX_REPLY_DATA + 1), LH_ERR_INVALID_REPLY);
        EXPECT_ST(lh_io_reply(c, 1, q.id, many, 1, big, SIZE_MAX), LH_ERR_INVALID_REPLY);
    }
    free(many);
    free(big);
    EXPECT_ST(lh_io_reply(c, 1, q.id, &NIL_VALUE, 1, NULL, 5), LH_ERR_NULL_ARGUMENT);
    EXPECT(strlen(lh_client_last_error(c)) > 0);

    uint32_t st = 0;
    EXPECT_ST(lh_lease_state(c, lease, &st), LH_OK);
    EXPECT(st == LH_STATE_ACQUIRING);
    lh_counters k = counters(c);
    EXPECT(k.backend_stale_replies == 0 && k.backend_garbage_replies == 0 && k.backend_transport_failures == 0);
    answer_on_fresh_service(c, &q, lease);
    lh_client_free(c);
}

/* Failure reports and notifications with hostile buffers; a notification nobody here waits
 * for (or one that is not even UTF-8) is counted and ignored. */
static void failures_and_messages_with_hostile_buffers(void) {
    call q;
    uint64_t lease = 0;
    lh_client *c = acquiring(&q, &lease);
    static const uint8_t bad[] = {0xfe, 0xff};
    EXPECT_ST(lh_io_failed(c, 1, q.id, LH_FAILURE_TRANSPORT, NULL, 5), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_io_failed(c, 1, q.id, LH_FAILURE_TRANSPORT, bad, LH_MAX_REPLY_DATA + 1), LH_ERR_INVALID_REPLY);
    EXPECT_ST(lh_io_failed(c, 1, q.id, LH_FAILURE_TRANSPORT, bad, SIZE_MAX), LH_ERR_INVALID_REPLY);
    EXPECT_ST(lh_io_message(c, 1, NULL, 3, NULL, 0), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_io_message(c, 1, NULL, 0, NULL, 0), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_io_message(c, 1, NAME, SIZE_MAX, NULL, 0), LH_ERR_INVALID_REPLY);
    EXPECT_ST(lh_io_message(c, 1, NAME, LH_MAX_REPLY_DATA + 1, NULL, 0), LH_ERR_INVALID_REPLY);
    EXPECT_ST(lh_io_message(c, 1, NAME, NAME_LEN, NULL, 5), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_io_connection(c, 1, LH_CONNECTION_COMMANDS, LH_CONNECTION_REOPENED, NULL, 4), LH_ERR_NULL_ARGUMENT);
    uint32_t st = 0;
    EXPECT_ST(lh_lease_state(c, lease, &st), LH_OK);
    EXPECT(st == LH_STATE_ACQUIRING);
    uint64_t ignored = counters(c).backend_ignored_messages;
    EXPECT_ST(lh_io_message(c, 1, bad, sizeof bad, NULL, 0), LH_OK);
    EXPECT_ST(lh_io_message(c, 1, (const uint8_t *)"other", 5, bad, sizeof bad), LH_OK);
    EXPECT(counters(c).backend_ignored_messages == ignored + 2);
    lh_event ev;
    EXPECT_ST(lh_poll_event(c, &ev), LH_OK);
    EXPECT(ev.kind == LH_EVENT_NONE);
    call none;
    EXPECT(!poll_call(c, &none));
    /* A transport failure's text need not be UTF-8; the engine sees a transport error. */
    EXPECT_ST(lh_io_failed(c, 2, q.id, LH_FAILURE_TRANSPORT, bad, sizeof bad), LH_OK);
    EXPECT(counters(c).backend_transport_failures == 1);
    EXPECT(strlen(lh_backend_last_error(c)) > 0);
    lh_client_free(c);
}

/* Answers for ids never issued, answered twice, or reported failed first are counted in
 * backend_stale_replies and change nothing. */
static void duplicate_late_and_unknown_answers_are_stale(void) {
    world w;
    world_init(&w, 1, NULL);
    lh_client *c = w.p[0].c;
    lh_acquire_options o = opts_ttl(3000);
    uint64_t lease = 0;
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_OK);
    call q;
    EXPECT(poll_call(c, &q));
    lh_memory_answer a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    EXPECT_ST(lh_memory_service_call(w.svc, w.p[0].conn, 1 * MS, q.argv, q.argc, &a), LH_OK);
    EXPECT(!a.dropped && a.nvalues > 0 && a.nvalues <= 8 && a.data_len <= 64);
    lh_value values[8];
    uint8_t data[64];
    size_t nvalues = a.nvalues < 8 ? a.nvalues : 8, ndata = a.data_len < 64 ? a.data_len : 64;
    memcpy(values, a.values, nvalues * sizeof *values); /* kept: the answer borrows the service */
    if (ndata) memcpy(data, a.data, ndata);
    EXPECT_ST(lh_io_reply(c, 1 * MS, q.id, values, nvalues, data, ndata), LH_OK);
    drain_events(&w, 0);
    EXPECT(find_event(&w.p[0], LH_EVENT_ACQUIRED, lease) != NULL);
    lh_counters before = counters(c);
    /* The same answer again, another answer, a failure: all for the answered id. */
    EXPECT_ST(lh_io_reply(c, 2 * MS, q.id, values, nvalues, data, ndata), LH_OK);
    EXPECT_ST(lh_io_reply(c, 2 * MS, q.id, &NIL_VALUE, 1, NULL, 0), LH_OK);
    EXPECT_ST(lh_io_failed(c, 2 * MS, q.id, LH_FAILURE_TRANSPORT, NULL, 0), LH_OK);
    /* Ids never issued. */
    EXPECT_ST(lh_io_reply(c, 2 * MS, 999999, values, nvalues, data, ndata), LH_OK);
    EXPECT_ST(lh_io_reply(c, 2 * MS, 0, &NIL_VALUE, 1, NULL, 0), LH_OK);
    EXPECT_ST(lh_io_failed(c, 2 * MS, UINT64_MAX, LH_FAILURE_DATABASE, NULL, 0), LH_OK);
    lh_counters after = counters(c);
    EXPECT(after.backend_stale_replies == before.backend_stale_replies + 6);
    EXPECT(after.backend_transport_failures == before.backend_transport_failures);
    EXPECT(after.grants == 1);
    /* A late answer: the release is reported failed (a timeout on the host's side), then the
     * service's answer arrives after all. */
    EXPECT_ST(lh_release(c, 3 * MS, lease, NULL), LH_OK);
    call rel;
    EXPECT(poll_call(c, &rel));
    EXPECT_ST(lh_memory_service_call(w.svc, w.p[0].conn, 3 * MS, rel.argv, rel.argc, &a), LH_OK);
    EXPECT(!a.dropped && a.nvalues > 0 && a.nvalues <= 8 && a.data_len <= 64);
    nvalues = a.nvalues < 8 ? a.nvalues : 8;
    ndata = a.data_len < 64 ? a.data_len : 64;
    memcpy(values, a.values, nvalues * sizeof *values);
    if (ndata) memcpy(data, a.data, ndata);
    EXPECT_ST(lh_io_failed(c, 3 * MS, rel.id, LH_FAILURE_TRANSPORT, NULL, 0), LH_OK);
    EXPECT(counters(c).backend_transport_failures == after.backend_transport_failures + 1);
    EXPECT_ST(lh_io_reply(c, 4 * MS, rel.id, values, nvalues, data, ndata), LH_OK);
    lh_counters late = counters(c);
    EXPECT(late.backend_stale_replies == after.backend_stale_replies + 1);
    EXPECT(late.releases_confirmed == 0); /* never looked at */
    EXPECT(service_status(&w, 4 * MS).held == 0);
    world_free(&w);
}

static void reseed_hostile_inputs(void) {
    lh_client *c = mk();
    EXPECT_ST(lh_client_reseed(c, NULL, 32), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_client_reseed(c, SEED, 3), LH_ERR_SEED_TOO_SHORT);
    EXPECT_ST(lh_client_reseed(c, SEED, SIZE_MAX), LH_ERR_INVALID_CONFIG);
    EXPECT_ST(lh_client_reseed(c, SEED, sizeof SEED), LH_OK);
    lh_client_free(c);
}

static void struct_size_checks_on_out_structs(void) {
    world w;
    world_init(&w, 1, NULL);
    lh_client *c = w.p[0].c;
    uint64_t lease = acquire_granted(&w, 0, 0, 3000);
    lh_lease_info info;
    lh_counters k;
    lh_lock_status ls;
    memset(&info, 0x5a, sizeof info);
    info.struct_size = sizeof info - 8;
    EXPECT_ST(lh_lease_info_get(c, lease, &info), LH_ERR_STRUCT_SIZE);
    EXPECT(info.state == 0x5a5a5a5au); /* untouched */
    memset(&k, 0x5a, sizeof k);
    k.struct_size = 8;
    EXPECT_ST(lh_counters_get(c, &k), LH_ERR_STRUCT_SIZE);
    EXPECT(k.live_leases == 0x5a5a5a5a5a5a5a5aull);
    k.struct_size = sizeof k;
    EXPECT_ST(lh_counters_get(c, &k), LH_OK);
    EXPECT(k.struct_size == sizeof k && k._reserved == 0 && k.live_leases == 1);
    memset(&ls, 0x5a, sizeof ls);
    ls.struct_size = 8;
    EXPECT_ST(lh_poll_status(c, &ls), LH_ERR_STRUCT_SIZE);
    EXPECT(ls.ok == 0x5a5a5a5au);
    lh_memory_answer a;
    memset(&a, 0x5a, sizeof a);
    a.struct_size = 4;
    lh_bytes arg = {NAME, NAME_LEN};
    EXPECT_ST(lh_memory_service_call(w.svc, w.p[0].conn, 0, &arg, 1, &a), LH_ERR_STRUCT_SIZE);
    EXPECT(a.dropped == 0x5a5a5a5au);
    world_free(&w);
}

static void counters_accept_the_first_struct_size(void) {
    world w;
    world_init(&w, 1, NULL);
    (void)acquire_granted(&w, 0, 0, 3000);
    lh_counters k;
    memset(&k, 0x5a, sizeof k);
    k.struct_size = LH_COUNTERS_V1_SIZE; /* a host built against the first header */
    EXPECT_ST(lh_counters_get(w.p[0].c, &k), LH_OK);
    EXPECT(k.struct_size == LH_COUNTERS_V1_SIZE && k.live_leases == 1 && k.grants == 1);
    EXPECT(k.renewals_requested == 0x5a5a5a5a5a5a5a5aull); /* beyond its struct: untouched */
    EXPECT(k.backend_requests == 0x5a5a5a5a5a5a5a5aull);
    k.struct_size = sizeof k;
    EXPECT_ST(lh_counters_get(w.p[0].c, &k), LH_OK);
    EXPECT(k.backend_requests == 1 && k.backend_stale_replies == 0 && k.redis_script_calls == 0);
    world_free(&w);
}

static void time_running_backwards_is_clamped(void) {
    world w;
    world_init(&w, 1, NULL);
    lh_client *c = w.p[0].c;
    uint64_t lease = acquire_granted(&w, 0, 1000 * MS, 3000);
    uint64_t before = counters(c).time_clamped;
    EXPECT_ST(lh_timeout(c, 5 * MS), LH_OK); /* earlier than anything seen */
    EXPECT_ST(lh_timeout(c, 0), LH_OK);
    EXPECT_ST(lh_io_message(c, 1, NAME, NAME_LEN, NULL, 0), LH_OK);
    EXPECT_ST(lh_release(c, 1, lease, NULL), LH_OK); /* still a valid input */
    pump(&w, 2);
    EXPECT(find_event(&w.p[0], LH_EVENT_RELEASED, lease) != NULL);
    EXPECT(counters(c).time_clamped >= before + 3);
    EXPECT(counters(c).pending_cleanups == 0);
    world_free(&w);
}

static void last_error_is_per_handle(void) {
    lh_client *a = mk(), *b = mk();
    lh_acquire_options o = opts_ttl(0);
    uint64_t lease;
    EXPECT(strcmp(lh_client_last_error(a), "") == 0);
    EXPECT(strcmp(lh_backend_last_error(a), "") == 0);
    EXPECT_ST(lh_acquire(a, 0, NAME, NAME_LEN, &o, &lease), LH_ERR_INVALID_TTL);
    char saved[256];
    snprintf(saved, sizeof saved, "%s", lh_client_last_error(a));
    EXPECT(strlen(saved) > 0);
    EXPECT_ST(lh_release(b, 0, 777, NULL), LH_ERR_UNKNOWN_LEASE);
    EXPECT(strcmp(lh_client_last_error(a), saved) == 0); /* b's error did not touch a */
    EXPECT(strcmp(lh_client_last_error(b), saved) != 0);
    EXPECT(strcmp(lh_backend_last_error(a), "") == 0); /* a call's error is not the backend's */
    lh_client_free(a);
    lh_client_free(b);
}

static void panic_poisons_only_that_handle(void) {
    lh_client *c = mk();
    lh_acquire_options o = opts_ttl(3000);
    uint64_t lease = 0, u64 = 1;
    uint32_t u32 = 1;
    bool b = false;
    lh_event ev;
    lh_io_request q;
    lh_lease_info info;
    lh_counters k;
    lh_lock_status ls;
    info.struct_size = sizeof info;
    k.struct_size = sizeof k;
    ls.struct_size = sizeof ls;
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_OK);
    EXPECT_ST(lh_client_debug_panic(c), LH_ERR_PANIC);
    EXPECT(strstr(lh_client_last_error(c), "panic") != NULL);
    EXPECT_ST(lh_client_debug_panic(c), LH_ERR_POISONED);
    EXPECT_ST(lh_client_reseed(c, SEED, sizeof SEED), LH_ERR_POISONED);
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_ERR_POISONED);
    EXPECT_ST(lh_release(c, 0, lease, NULL), LH_ERR_POISONED);
    EXPECT_ST(lh_renew(c, 0, lease), LH_ERR_POISONED);
    EXPECT_ST(lh_timeout(c, 0), LH_ERR_POISONED);
    EXPECT_ST(lh_io_poll(c, &q), LH_ERR_POISONED);
    EXPECT_ST(lh_io_reply(c, 0, 1, &NIL_VALUE, 1, NULL, 0), LH_ERR_POISONED);
    EXPECT_ST(lh_io_http_reply(c, 0, 1, 200, NULL, 0), LH_ERR_POISONED);
    EXPECT_ST(lh_io_stream_message(c, 0, 1, NULL, 0), LH_ERR_POISONED);
    EXPECT_ST(lh_io_failed(c, 0, 1, LH_FAILURE_TRANSPORT, NULL, 0), LH_ERR_POISONED);
    EXPECT_ST(lh_io_message(c, 0, NAME, NAME_LEN, NULL, 0), LH_ERR_POISONED);
    EXPECT_ST(lh_io_connection(c, 0, LH_CONNECTION_COMMANDS, LH_CONNECTION_REOPENED, NULL, 0), LH_ERR_POISONED);
    EXPECT_ST(lh_io_close(c, 0), LH_ERR_POISONED);
    EXPECT_ST(lh_status_request(c, 0, NAME, NAME_LEN, &u64), LH_ERR_POISONED);
    EXPECT_ST(lh_poll_status(c, &ls), LH_ERR_POISONED);
    EXPECT_ST(lh_poll_event(c, &ev), LH_ERR_POISONED);
    EXPECT_ST(lh_poll_timeout(c, &u64), LH_ERR_POISONED);
    EXPECT_ST(lh_lease_state(c, lease, &u32), LH_ERR_POISONED);
    EXPECT_ST(lh_lease_info_get(c, lease, &info), LH_ERR_POISONED);
    EXPECT_ST(lh_fencing_token(c, lease, &u64), LH_ERR_POISONED);
    EXPECT_ST(lh_valid_until(c, lease, &u64), LH_ERR_POISONED);
    EXPECT_ST(lh_is_held(c, lease, 0, &b), LH_ERR_POISONED);
    EXPECT_ST(lh_counters_get(c, &k), LH_ERR_POISONED);
    EXPECT(strstr(lh_client_last_error(c), "poisoned") != NULL);
    EXPECT(strcmp(lh_backend_last_error(c), "") == 0);
    EXPECT(u64 == 1 && u32 == 1);
    lh_client_free(c);
    /* Another handle is unaffected. */
    world w;
    world_init(&w, 1, NULL);
    EXPECT(acquire_granted(&w, 0, 0, 3000) != 0);
    world_free(&w);
}

/* The memory service's own arguments: NULL, sizes, limits, unknown connections, its panic. */
static void memory_service_rejects_hostile_arguments(void) {
    lh_memory_config mc;
    lh_memory_service *svc = NULL, *sentinel = (lh_memory_service *)(uintptr_t)0x99;
    lh_memory_service *s2 = sentinel;
    lh_memory_config_default(&mc);
    EXPECT_ST(lh_memory_service_new(NULL, &s2), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_memory_service_new(&mc, NULL), LH_ERR_NULL_ARGUMENT);
    mc.struct_size = 4;
    EXPECT_ST(lh_memory_service_new(&mc, &s2), LH_ERR_STRUCT_SIZE);
    lh_memory_config_default(&mc);
    mc.max_names = 0;
    EXPECT_ST(lh_memory_service_new(&mc, &s2), LH_ERR_INVALID_CONFIG);
    mc.max_names = (1u << 24) + 1;
    EXPECT_ST(lh_memory_service_new(&mc, &s2), LH_ERR_INVALID_CONFIG);
    EXPECT(s2 == sentinel);
    lh_memory_config_default(&mc);
    mc.max_connections = 1;
    EXPECT_ST(lh_memory_service_new(&mc, &svc), LH_OK);
    uint64_t conn = 0, other = 0;
    EXPECT_ST(lh_memory_service_connect(NULL, &conn), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_memory_service_connect(svc, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_memory_service_connect(svc, &conn), LH_OK);
    EXPECT(conn != 0);
    EXPECT_ST(lh_memory_service_connect(svc, &other), LH_ERR_LIMIT_REACHED);
    EXPECT(other == 0);

    lh_memory_answer a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    lh_bytes args[65];
    for (size_t i = 0; i < 65; i++) args[i] = (lh_bytes){NAME, NAME_LEN};
    EXPECT_ST(lh_memory_service_call(NULL, conn, 0, args, 2, &a), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_memory_service_call(svc, conn, 0, NULL, 2, &a), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_memory_service_call(svc, conn, 0, args, 2, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_memory_service_call(svc, conn, 0, args, 65, &a), LH_ERR_INVALID_REPLY);
    EXPECT_ST(lh_memory_service_call(svc, conn + 1, 0, args, 2, &a), LH_ERR_UNKNOWN_CONNECTION);
    args[1] = (lh_bytes){NULL, 3};
    EXPECT_ST(lh_memory_service_call(svc, conn, 0, args, 2, &a), LH_ERR_NULL_ARGUMENT);
    args[1] = (lh_bytes){NAME, LH_MAX_REPLY_DATA + 1};
    EXPECT_ST(lh_memory_service_call(svc, conn, 0, args, 2, &a), LH_ERR_INVALID_REPLY);
    EXPECT(strlen(lh_memory_service_last_error(svc)) > 0);
    /* A request the service cannot read is an error answer for the client, never a status. */
    static const uint8_t nope[] = "NOPE";
    args[0] = (lh_bytes){nope, 4};
    args[1] = (lh_bytes){NAME, NAME_LEN};
    EXPECT_ST(lh_memory_service_call(svc, conn, 0, args, 2, &a), LH_OK);
    EXPECT(!a.dropped && a.nvalues == 1 && a.values[0].kind == LH_VALUE_ERROR && a.data != NULL);

    const uint8_t *name = NAME;
    size_t len = 7;
    EXPECT_ST(lh_memory_service_poll_released(svc, conn, NULL, &len), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_memory_service_poll_released(svc, conn, &name, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_memory_service_poll_released(svc, conn + 1, &name, &len), LH_ERR_UNKNOWN_CONNECTION);
    EXPECT(name == NAME && len == 7);
    lh_memory_status st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    static const uint8_t bad[] = {0xff};
    EXPECT_ST(lh_memory_service_status(svc, 0, bad, 1, &st), LH_ERR_INVALID_UTF8);
    EXPECT_ST(lh_memory_service_status(svc, 0, NAME, 0, &st), LH_ERR_EMPTY_NAME);
    EXPECT_ST(lh_memory_service_status(svc, 0, NULL, 3, &st), LH_ERR_NULL_ARGUMENT);
    st.struct_size = 8;
    EXPECT_ST(lh_memory_service_status(svc, 0, NAME, NAME_LEN, &st), LH_ERR_STRUCT_SIZE);
    lh_memory_faults f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    f.flags = 1u << 20;
    EXPECT_ST(lh_memory_service_set_faults(svc, conn, &f), LH_ERR_INVALID_ENUM);
    f.flags = 0;
    EXPECT_ST(lh_memory_service_set_faults(svc, conn + 1, &f), LH_ERR_UNKNOWN_CONNECTION);
    EXPECT_ST(lh_memory_service_set_faults(svc, conn, NULL), LH_ERR_NULL_ARGUMENT);
    f.struct_size = 4;
    EXPECT_ST(lh_memory_service_set_faults(svc, conn, &f), LH_ERR_STRUCT_SIZE);
    EXPECT_ST(lh_memory_service_get_faults(svc, conn, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_memory_service_step_clock(NULL, 1), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_memory_service_forget(svc, bad, 1), LH_ERR_INVALID_UTF8);
    lh_memory_stats ms;
    ms.struct_size = 4;
    EXPECT_ST(lh_memory_service_stats_get(svc, &ms), LH_ERR_STRUCT_SIZE);
    EXPECT_ST(lh_memory_service_stats_get(svc, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_memory_service_disconnect(svc, conn + 1), LH_ERR_UNKNOWN_CONNECTION);
    EXPECT_ST(lh_memory_service_disconnect(svc, conn), LH_OK);
    EXPECT_ST(lh_memory_service_call(svc, conn, 0, args, 2, &a), LH_ERR_UNKNOWN_CONNECTION);
    EXPECT_ST(lh_memory_service_connect(svc, &other), LH_OK); /* the slot is free again */
    EXPECT(other != conn);
    EXPECT(strcmp(lh_memory_service_last_error(NULL), "") == 0);
    EXPECT_ST(lh_memory_service_debug_panic(NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_memory_service_debug_panic(svc), LH_ERR_PANIC);
    EXPECT_ST(lh_memory_service_connect(svc, &other), LH_ERR_POISONED);
    EXPECT_ST(lh_memory_service_call(svc, other, 0, args, 2, &a), LH_ERR_POISONED);
    lh_memory_service_free(svc);
    lh_memory_service_free(NULL);
}

/* lh_drain takes, in one call, what lh_io_poll, lh_poll_event and lh_poll_timeout take: two
 * clients on one seed, fed alike, one drained each way; a full events array says so; bad
 * arguments are refused before anything is taken. */
static void drain_in_one_call_takes_what_the_single_polls_take(void) {
    lh_client *a = mk(), *b = mk();
    lh_acquire_options o = opts_ttl(3000);
    uint64_t la = 0, lb = 0, now = MS;
    const uint8_t other[4] = "jobs";
    for (int i = 0; i < 2; i++) {
        EXPECT_ST(lh_acquire(a, now, i ? other : NAME, i ? 4 : NAME_LEN, &o, &la), LH_OK);
        EXPECT_ST(lh_acquire(b, now, i ? other : NAME, i ? 4 : NAME_LEN, &o, &lb), LH_OK);
        EXPECT(la == lb);
    }
    call qa[4];
    size_t na = 0, nb = 0;
    while (na < 4 && poll_call(a, &qa[na])) na++;
    lh_io_request r;
    lh_event evs[1];
    lh_drained d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    /* Refused before anything is taken: NULL out, NULL events with room, a short struct. */
    EXPECT_ST(lh_drain(b, &r, evs, 1, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_drain(b, &r, NULL, 1, &d), LH_ERR_NULL_ARGUMENT);
    d.struct_size = 8;
    EXPECT_ST(lh_drain(b, &r, evs, 1, &d), LH_ERR_STRUCT_SIZE);
    d.struct_size = sizeof d;
    EXPECT_ST(lh_drain(NULL, &r, evs, 1, &d), LH_ERR_NULL_ARGUMENT);
    /* Call again while more requests may be pending: one call per request here. */
    int drains = 0;
    do {
        EXPECT_ST(lh_drain(b, &r, evs, 1, &d), LH_OK);
        drains++;
        EXPECT(d.nevents == 0 && d.more_events == 0);
        if (d.more_requests) EXPECT(d.deadline_ns == LH_NO_DEADLINE); /* only a drain's last call has one */
        if (!d.request) continue;
        EXPECT(nb < 4 && r.id == qa[nb].id && r.kind == qa[nb].kind && r.argc == qa[nb].argc);
        for (uint32_t i = 0; nb < 4 && i < r.argc && i < qa[nb].argc; i++)
            EXPECT(r.argv[i].len == qa[nb].argv[i].len &&
                   memcmp(r.argv[i].ptr, qa[nb].argv[i].ptr, r.argv[i].len) == 0);
        nb++;
    } while (d.more_requests && drains < 10);
    EXPECT(na == 2 && nb == 2 && drains == 2);
    uint64_t dl = 0;
    EXPECT_ST(lh_poll_timeout(a, &dl), LH_OK);
    EXPECT(d.deadline_ns == dl && dl != LH_NO_DEADLINE);
    /* Both acquires fail: two events, taken one per call (the array holds one). */
    for (size_t i = 0; i < na; i++) {
        EXPECT_ST(lh_io_failed(a, 2 * MS, qa[i].id, LH_FAILURE_TRANSPORT, NULL, 0), LH_OK);
        EXPECT_ST(lh_io_failed(b, 2 * MS, qa[i].id, LH_FAILURE_TRANSPORT, NULL, 0), LH_OK);
    }
    while (poll_call(a, &qa[0])) {
    }
    lh_event ea[4];
    size_t nea = 0, neb = 0, calls = 0;
    for (;;) {
        EXPECT_ST(lh_poll_event(a, &ea[nea]), LH_OK);
        if (ea[nea].kind == LH_EVENT_NONE || ++nea == 4) break;
    }
    for (; calls < 16; calls++) {
        EXPECT_ST(lh_drain(b, &r, evs, 1, &d), LH_OK);
        EXPECT(d.more_events == d.nevents); /* full after one */
        if (d.nevents) {
            EXPECT(neb < nea && memcmp(&evs[0], &ea[neb], sizeof evs[0]) == 0);
            neb++;
        }
        if (!d.request && !d.more_events) break;
        EXPECT(d.deadline_ns == LH_NO_DEADLINE);
    }
    EXPECT(nea == 2 && neb == 2 && ea[0].kind == LH_EVENT_ACQUIRE_FAILED);
    EXPECT_ST(lh_poll_timeout(a, &dl), LH_OK);
    EXPECT(d.deadline_ns == dl);
    lh_client_free(a);
    lh_client_free(b);
}

/* lh_io_received_drain feeds bytes read and makes the first drain call in one: a stream-kind
 * client with no server, its handshake answered by hand. Refused bytes and bad drain arguments
 * take nothing and write nothing. */
static void received_and_drained_in_one_call(void) {
    const char *url = "redis://127.0.0.1:1/0";
    lh_config cfg;
    lh_config_default(&cfg);
    lh_backend_options b;
    lh_backend_options_default(LH_BACKEND_REDIS_STREAM, &b);
    b.redis_url = (const uint8_t *)url;
    b.redis_url_len = strlen(url);
    uint8_t seed[32] = {7};
    lh_client *c = NULL;
    EXPECT_ST(lh_client_new(&cfg, &b, seed, sizeof seed, &c), LH_OK);
    if (c == NULL) return;
    lh_acquire_options o = opts_ttl(3000);
    uint64_t lease = 0;
    EXPECT_ST(lh_acquire(c, MS, NAME, NAME_LEN, &o, &lease), LH_OK);
    lh_io_request r;
    uint64_t opens[2] = {0, 0};
    size_t nopens = 0;
    while (lh_io_poll(c, &r) == LH_OK && r.kind != LH_IO_NONE)
        if (r.kind == LH_IO_OPEN && nopens < 2) opens[nopens++] = r.stream;
    EXPECT(nopens >= 1);
    lh_event evs[2];
    lh_drained d;
    memset(&d, 0xab, sizeof d);
    d.struct_size = sizeof d;
    const uint8_t ok[] = "+OK\r\n";
    /* Before the stream opened, and on a stream never handed out: refused, `d` untouched. */
    EXPECT_ST(lh_io_received_drain(c, 2 * MS, opens[0], ok, 5, &r, evs, 2, &d), LH_ERR_WRONG_ANSWER);
    EXPECT_ST(lh_io_received_drain(c, 2 * MS, 999, ok, 5, &r, evs, 2, &d), LH_ERR_UNKNOWN_CONNECTION);
    EXPECT(d.nevents == 0xabababab && d.deadline_ns == 0xababababababababull);
    const uint8_t hello[] = "%1\r\n$6\r\nserver\r\n$5\r\nredis\r\n";
    const size_t hello_len = sizeof hello - 1;
    int sent_more = 0;
    for (size_t i = 0; i < nopens; i++) {
        EXPECT_ST(lh_io_opened(c, 3 * MS, opens[i]), LH_OK);
        while (lh_io_poll(c, &r) == LH_OK && r.kind != LH_IO_NONE) EXPECT(r.kind == LH_IO_WRITE);
        /* Bad drain arguments: refused before the bytes are taken. */
        EXPECT_ST(lh_io_received_drain(c, 4 * MS, opens[i], hello, hello_len, &r, evs, 2, NULL), LH_ERR_NULL_ARGUMENT);
        EXPECT_ST(lh_io_received_drain(c, 4 * MS, opens[i], hello, hello_len, &r, NULL, 2, &d), LH_ERR_NULL_ARGUMENT);
        EXPECT_ST(lh_io_received_drain(c, 4 * MS, opens[i], NULL, 3, &r, evs, 2, &d), LH_ERR_NULL_ARGUMENT);
        EXPECT_ST(lh_io_received_drain(NULL, 4 * MS, opens[i], hello, hello_len, &r, evs, 2, &d), LH_ERR_NULL_ARGUMENT);
        EXPECT_ST(lh_io_poll(c, &r), LH_OK);
        EXPECT(r.kind == LH_IO_NONE); /* the handshake still waits for its reply */
        /* The reply, fed and drained at once: what waited for the handshake comes out. */
        EXPECT_ST(lh_io_received_drain(c, 4 * MS, opens[i], hello, hello_len, &r, evs, 2, &d), LH_OK);
        EXPECT(d.struct_size == sizeof d && d.nevents == 0);
        if (d.request) {
            EXPECT(r.kind == LH_IO_WRITE && r.stream == opens[i] && r.data_len > 0);
            sent_more++;
        }
        while (d.more_requests) EXPECT_ST(lh_drain(c, &r, evs, 2, &d), LH_OK);
    }
    EXPECT(sent_more >= 1);
    lh_client_free(c);
}

void abi_tests(void) {
    RUN(version_macros_match_library);
    RUN(status_str_names_every_code);
    RUN(defaults_fill_structs);
    RUN(client_new_rejects_hostile_arguments);
    RUN(every_backend_speaks_through_lh_io_poll);
    RUN(drain_in_one_call_takes_what_the_single_polls_take);
    RUN(received_and_drained_in_one_call);
    RUN(null_handle_is_an_error_everywhere);
    RUN(null_out_params_are_errors_and_change_nothing);
    RUN(acquire_rejects_hostile_names_and_options);
    RUN(unknown_lease_ids_are_errors);
    RUN(unknown_enum_values_are_errors);
    RUN(answers_of_the_wrong_kind_are_refused);
    RUN(malformed_value_lists_are_invalid_replies);
    RUN(failures_and_messages_with_hostile_buffers);
    RUN(duplicate_late_and_unknown_answers_are_stale);
    RUN(reseed_hostile_inputs);
    RUN(struct_size_checks_on_out_structs);
    RUN(counters_accept_the_first_struct_size);
    RUN(time_running_backwards_is_clamped);
    RUN(last_error_is_per_handle);
    RUN(panic_poisons_only_that_handle);
    RUN(memory_service_rejects_hostile_arguments);
}
