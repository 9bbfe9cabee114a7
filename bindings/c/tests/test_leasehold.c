/*
 * test_leasehold.c -- C tests of the leasehold C ABI (include/leasehold.h).
 *
 * Hostile inputs (each documented code, client still usable afterwards), the full lease
 * lifecycle on virtual time, borrowed-pointer lifetimes, per-handle error detail, panics and
 * poisoning. Built twice by bindings/c/test.sh: with -fsanitize=address,undefined and plain
 * under valgrind. Prints "N passed, N failed"; exit status 1 on any failure.
 * Time is virtual (now is an argument), so nothing here depends on how fast the machine is.
 */
#define _POSIX_C_SOURCE 200809L
/* The panic tests call lh_client_debug_panic, a test hook: declared under LH_TESTING and
 * exported only by a library built with `cargo build --release --features testing`. */
#define LH_TESTING 1
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "leasehold.h"

/* The layouts ctypes and cgo mirror (LP64): a change here is an ABI break. */
_Static_assert(sizeof(lh_config) == 64, "lh_config layout");
_Static_assert(offsetof(lh_config, drift_fixed_ns) == 8, "lh_config layout");
_Static_assert(offsetof(lh_config, max_leases) == 56, "lh_config layout");
_Static_assert(sizeof(lh_acquire_options) == 24, "lh_acquire_options layout");
_Static_assert(sizeof(lh_output) == 96, "lh_output layout");
_Static_assert(offsetof(lh_output, request_id) == 8, "lh_output layout");
_Static_assert(offsetof(lh_output, name) == 24, "lh_output layout");
_Static_assert(offsetof(lh_output, backend_data_len) == 64, "lh_output layout");
_Static_assert(offsetof(lh_output, valid_until_ns) == 88, "lh_output layout");
_Static_assert(sizeof(lh_lease_info) == 32, "lh_lease_info layout");
_Static_assert(sizeof(lh_counters) == 160, "lh_counters layout");
_Static_assert(offsetof(lh_counters, time_clamped) == 112, "lh_counters layout");
/* lh_counters grows at the end only: hosts built against the first header pass this size. */
_Static_assert(offsetof(lh_counters, renewals_requested) == LH_COUNTERS_V1_SIZE, "lh_counters layout");

#define MS 1000000ull

static int passed, failed;
static int test_ok;
static const char *test_name;

#define EXPECT(cond)                                                                     \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "  %s:%d: %s: expected %s\n", __FILE__, __LINE__, test_name, #cond); \
            test_ok = 0;                                                                 \
        }                                                                                \
    } while (0)

#define EXPECT_ST(call, want)                                                            \
    do {                                                                                 \
        lh_status got_ = (call);                                                         \
        if (got_ != (lh_status)(want)) {                                                 \
            fprintf(stderr, "  %s:%d: %s: %s returned %s, expected %s\n", __FILE__, __LINE__, \
                    test_name, #call, lh_status_str(got_), lh_status_str(want));         \
            test_ok = 0;                                                                 \
        }                                                                                \
    } while (0)

#define RUN(fn)                                                          \
    do {                                                                 \
        test_name = #fn;                                                 \
        test_ok = 1;                                                     \
        fn();                                                            \
        if (test_ok) passed++; else { failed++; fprintf(stderr, "FAIL %s\n", #fn); } \
    } while (0)

static const uint8_t SEED[32] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};
static const uint8_t NAME[] = "orders";
#define NAME_LEN (sizeof NAME - 1)

static lh_client *mk(void) {
    lh_config cfg;
    lh_client *c = NULL;
    lh_config_default(&cfg);
    EXPECT_ST(lh_client_new(&cfg, SEED, sizeof SEED, &c), LH_OK);
    EXPECT(c != NULL);
    return c;
}

static lh_acquire_options opts_ttl(uint64_t ttl_ms) {
    lh_acquire_options o;
    lh_acquire_options_default(&o);
    o.ttl_ms = ttl_ms;
    return o;
}

static lh_counters counters(const lh_client *c) {
    lh_counters k;
    memset(&k, 0, sizeof k);
    k.struct_size = sizeof k;
    EXPECT_ST(lh_counters_get(c, &k), LH_OK);
    return k;
}

/* Polls one output (copying nothing). */
static lh_output poll1(lh_client *c) {
    lh_output o;
    memset(&o, 0xAB, sizeof o);
    EXPECT_ST(lh_poll_output(c, &o), LH_OK);
    return o;
}

/* Drains all outputs, keeping their kinds, lease ids and request ids (not the borrowed bytes). */
typedef struct drained {
    size_t n;
    lh_output o[32];
} drained;

static drained drain_all(lh_client *c) {
    drained d;
    d.n = 0;
    for (int guard = 0; guard < 1000; guard++) {
        lh_output o = poll1(c);
        if (o.kind == LH_OUTPUT_NONE) return d;
        o.name = o.token = o.backend_data = NULL; /* borrowed: invalid after the next call */
        if (d.n < 32) d.o[d.n++] = o;
    }
    EXPECT(!"output queue did not drain");
    return d;
}

static const lh_output *find(const drained *d, uint32_t kind) {
    for (size_t i = 0; i < d->n; i++)
        if (d->o[i].kind == kind) return &d->o[i];
    return NULL;
}

/* acquire + grant at t=now; returns the lease id; *req receives the acquire request id. */
static uint64_t acquire_granted(lh_client *c, uint64_t now, uint64_t ttl_ms, uint64_t fence) {
    lh_acquire_options o = opts_ttl(ttl_ms);
    uint64_t lease = 0;
    EXPECT_ST(lh_acquire(c, now, NAME, NAME_LEN, &o, &lease), LH_OK);
    lh_output a = poll1(c);
    EXPECT(a.kind == LH_OUTPUT_ACQUIRE);
    EXPECT(poll1(c).kind == LH_OUTPUT_NONE);
    EXPECT_ST(lh_acquire_result(c, now + 1 * MS, a.request_id, LH_ACQUIRE_GRANTED, fence, ttl_ms,
                                LH_NO_RETRY_HINT, NULL, 0), LH_OK);
    drained d = drain_all(c);
    const lh_output *ev = find(&d, LH_OUTPUT_ACQUIRED);
    EXPECT(ev != NULL && ev->lease_id == lease && ev->fencing_token == fence);
    return lease;
}

/* Feeds timeouts at the core's deadlines until an output of `kind` appears (bounded). */
static int advance_until(lh_client *c, uint64_t *now, uint32_t kind, lh_output *found) {
    for (int i = 0; i < 50; i++) {
        uint64_t d;
        EXPECT_ST(lh_poll_timeout(c, &d), LH_OK);
        if (d == LH_NO_DEADLINE) return 0;
        if (d > *now) *now = d;
        EXPECT_ST(lh_timeout(c, *now), LH_OK);
        drained dr = drain_all(c);
        const lh_output *f = find(&dr, kind);
        if (f != NULL) {
            if (found) *found = *f;
            return 1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */

static void version_macros_match_library(void) {
    EXPECT(strcmp(lh_version(), LH_VERSION) == 0);
    EXPECT(lh_abi_version() == LH_ABI_VERSION);
    EXPECT(LH_ABI_VERSION == 2);
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
        {LH_ERR_LIMIT_REACHED, "LH_ERR_LIMIT_REACHED"}, {LH_ERR_PANIC, "LH_ERR_PANIC"},
        {LH_ERR_POISONED, "LH_ERR_POISONED"},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        EXPECT(strcmp(lh_status_str(table[i].code), table[i].name) == 0);
    EXPECT(strcmp(lh_status_str(22), "LH_UNKNOWN_STATUS") == 0);
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
}

static void client_new_rejects_hostile_arguments(void) {
    lh_config cfg;
    lh_client *sentinel = (lh_client *)(uintptr_t)0x1234;
    lh_client *c = sentinel;
    lh_config_default(&cfg);
    EXPECT_ST(lh_client_new(NULL, SEED, sizeof SEED, &c), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_client_new(&cfg, NULL, sizeof SEED, &c), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_client_new(&cfg, NULL, 0, &c), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_client_new(&cfg, SEED, sizeof SEED, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_client_new(&cfg, SEED, LH_MIN_SEED_LEN - 1, &c), LH_ERR_SEED_TOO_SHORT);
    EXPECT_ST(lh_client_new(&cfg, SEED, 0, &c), LH_ERR_SEED_TOO_SHORT);
    EXPECT_ST(lh_client_new(&cfg, SEED, SIZE_MAX, &c), LH_ERR_INVALID_CONFIG);
    EXPECT_ST(lh_client_new(&cfg, SEED, LH_MAX_SEED_LEN + 1, &c), LH_ERR_INVALID_CONFIG);
    cfg.notifications = 2;
    EXPECT_ST(lh_client_new(&cfg, SEED, sizeof SEED, &c), LH_ERR_INVALID_CONFIG);
    lh_config_default(&cfg);
    cfg.struct_size = 0;
    EXPECT_ST(lh_client_new(&cfg, SEED, sizeof SEED, &c), LH_ERR_STRUCT_SIZE);
    cfg.struct_size = sizeof cfg - 1;
    EXPECT_ST(lh_client_new(&cfg, SEED, sizeof SEED, &c), LH_ERR_STRUCT_SIZE);
    lh_config_default(&cfg);
    cfg.max_leases = 0;
    EXPECT_ST(lh_client_new(&cfg, SEED, sizeof SEED, &c), LH_ERR_INVALID_CONFIG);
    EXPECT(c == sentinel); /* out-param untouched on every failure */
    lh_config_default(&cfg);
    EXPECT_ST(lh_client_new(&cfg, SEED, LH_MIN_SEED_LEN, &c), LH_OK);
    EXPECT(c != sentinel && c != NULL);
    lh_client_free(c);
    lh_client_free(NULL);
}

static void null_handle_is_an_error_everywhere(void) {
    lh_acquire_options o = opts_ttl(1000);
    lh_output out;
    lh_lease_info info;
    lh_counters k;
    uint64_t u64 = 7;
    uint32_t u32 = 7;
    bool b = false;
    info.struct_size = sizeof info;
    k.struct_size = sizeof k;
    EXPECT_ST(lh_client_reseed(NULL, SEED, sizeof SEED), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_acquire(NULL, 0, NAME, NAME_LEN, &o, &u64), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_release(NULL, 0, 1), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_acquire_result(NULL, 0, 1, LH_ACQUIRE_GRANTED, 1, 1000, 0, NULL, 0), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_renew_result(NULL, 0, 1, LH_RENEW_RENEWED), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_release_result(NULL, 0, 1, LH_RELEASE_RELEASED), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_released(NULL, 0, NAME, NAME_LEN), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_timeout(NULL, 0), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_poll_output(NULL, &out), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_poll_timeout(NULL, &u64), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_lease_state(NULL, 1, &u32), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_lease_info_get(NULL, 1, &info), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_fencing_token(NULL, 1, &u64), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_valid_until(NULL, 1, &u64), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_is_held(NULL, 1, 0, &b), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_counters_get(NULL, &k), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_client_debug_panic(NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT(strcmp(lh_client_last_error(NULL), "") == 0);
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
    /* A NULL out for poll_output must not consume the output. */
    uint64_t lease = 0;
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_OK);
    EXPECT_ST(lh_poll_output(c, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT(poll1(c).kind == LH_OUTPUT_ACQUIRE);
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

    /* Nothing happened: no lease, no command, out-param untouched; the client still works. */
    EXPECT(lease == 99);
    lh_counters k = counters(c);
    EXPECT(k.acquires_sent == 0 && k.live_leases == 0);
    EXPECT(poll1(c).kind == LH_OUTPUT_NONE);
    o = opts_ttl(1000);
    EXPECT_ST(lh_acquire(c, 0, long_name, LH_MAX_NAME_LEN, &o, &lease), LH_OK);
    EXPECT(lease != 99);
    lh_output a = poll1(c);
    EXPECT(a.kind == LH_OUTPUT_ACQUIRE && a.name_len == LH_MAX_NAME_LEN);
    lh_client_free(c);
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
        EXPECT_ST(lh_release(c, 0, ids[i]), LH_ERR_UNKNOWN_LEASE);
        EXPECT_ST(lh_lease_state(c, ids[i], &u32), LH_ERR_UNKNOWN_LEASE);
        EXPECT_ST(lh_lease_info_get(c, ids[i], &info), LH_ERR_UNKNOWN_LEASE);
        EXPECT_ST(lh_fencing_token(c, ids[i], &u64), LH_ERR_UNKNOWN_LEASE);
        EXPECT_ST(lh_valid_until(c, ids[i], &u64), LH_ERR_UNKNOWN_LEASE);
        EXPECT_ST(lh_is_held(c, ids[i], 0, &b), LH_ERR_UNKNOWN_LEASE);
    }
    EXPECT(u64 == 5 && u32 == 5 && b == true);
    EXPECT(strlen(lh_client_last_error(c)) > 0);
    lh_client_free(c);
}

static void unknown_enum_values_are_errors(void) {
    lh_client *c = mk();
    lh_acquire_options o = opts_ttl(1000);
    uint64_t lease;
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_OK);
    lh_output a = poll1(c);
    const uint32_t bad[] = {0, 4, 17, UINT32_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        EXPECT_ST(lh_acquire_result(c, 1, a.request_id, bad[i], 1, 1000, LH_NO_RETRY_HINT, NULL, 0),
                  LH_ERR_INVALID_ENUM);
        EXPECT_ST(lh_renew_result(c, 1, a.request_id, bad[i]), LH_ERR_INVALID_ENUM);
        EXPECT_ST(lh_release_result(c, 1, a.request_id, bad[i]), LH_ERR_INVALID_ENUM);
    }
    /* The acquire is still pending and still answerable. */
    uint32_t st = 0;
    EXPECT_ST(lh_lease_state(c, lease, &st), LH_OK);
    EXPECT(st == LH_STATE_ACQUIRING);
    EXPECT(counters(c).stale_results == 0);
    EXPECT_ST(lh_acquire_result(c, 1, a.request_id, LH_ACQUIRE_GRANTED, 9, 1000, LH_NO_RETRY_HINT, NULL, 0), LH_OK);
    EXPECT_ST(lh_lease_state(c, lease, &st), LH_OK);
    EXPECT(st == LH_STATE_HELD);
    lh_client_free(c);
}

static void stale_and_unknown_request_ids_are_ignored(void) {
    lh_client *c = mk();
    uint64_t lease = acquire_granted(c, 0, 3000, 7);
    lh_counters before = counters(c);
    /* never issued */
    EXPECT_ST(lh_acquire_result(c, 2 * MS, 999999, LH_ACQUIRE_GRANTED, 8, 3000, 0, NULL, 0), LH_OK);
    EXPECT_ST(lh_renew_result(c, 2 * MS, 999999, LH_RENEW_REJECTED), LH_OK);
    EXPECT_ST(lh_release_result(c, 2 * MS, 999999, LH_RELEASE_RELEASED), LH_OK);
    EXPECT_ST(lh_acquire_result(c, 2 * MS, 0, LH_ACQUIRE_GRANTED, 8, 3000, 0, NULL, 0), LH_OK);
    EXPECT_ST(lh_renew_result(c, 2 * MS, UINT64_MAX, LH_RENEW_REJECTED), LH_OK);
    lh_counters after = counters(c);
    EXPECT(after.stale_results >= before.stale_results + 5);
    EXPECT(poll1(c).kind == LH_OUTPUT_NONE);
    uint32_t st = 0;
    uint64_t fence = 0;
    EXPECT_ST(lh_lease_state(c, lease, &st), LH_OK);
    EXPECT(st == LH_STATE_HELD);
    EXPECT_ST(lh_fencing_token(c, lease, &fence), LH_OK);
    EXPECT(fence == 7);
    lh_client_free(c);
}

static void already_answered_request_is_stale(void) {
    lh_client *c = mk();
    lh_acquire_options o = opts_ttl(3000);
    uint64_t lease, fence = 0;
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_OK);
    lh_output a = poll1(c);
    EXPECT_ST(lh_acquire_result(c, 1 * MS, a.request_id, LH_ACQUIRE_GRANTED, 5, 3000, 0, NULL, 0), LH_OK);
    drain_all(c);
    uint64_t stale = counters(c).stale_results;
    /* The same answer again, a different answer, and an answer of the wrong kind. */
    EXPECT_ST(lh_acquire_result(c, 2 * MS, a.request_id, LH_ACQUIRE_GRANTED, 6, 3000, 0, NULL, 0), LH_OK);
    EXPECT_ST(lh_acquire_result(c, 2 * MS, a.request_id, LH_ACQUIRE_TRANSPORT_ERROR, 0, 0, 0, NULL, 0), LH_OK);
    EXPECT_ST(lh_renew_result(c, 2 * MS, a.request_id, LH_RENEW_REJECTED), LH_OK);
    EXPECT_ST(lh_release_result(c, 2 * MS, a.request_id, LH_RELEASE_NOT_OWNER), LH_OK);
    EXPECT(counters(c).stale_results == stale + 4);
    EXPECT(poll1(c).kind == LH_OUTPUT_NONE);
    EXPECT_ST(lh_fencing_token(c, lease, &fence), LH_OK);
    EXPECT(fence == 5);
    lh_client_free(c);
}

static int is_lower_hex(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f'))) return 0;
    return 1;
}

static void full_lifecycle_with_backend_data(void) {
    lh_client *c = mk();
    lh_acquire_options o = opts_ttl(3000);
    uint64_t lease = 0, now = 0, fence = 0, vu = 0, deadline = 0;
    uint8_t token[32];
    static const uint8_t bd[] = {0x00, 0x01, 0xfe, 0xff, 'e', 't', 'c', 'd'};
    EXPECT_ST(lh_acquire(c, now, NAME, NAME_LEN, &o, &lease), LH_OK);
    EXPECT(lease != 0);
    uint32_t st = 0;
    EXPECT_ST(lh_lease_state(c, lease, &st), LH_OK);
    EXPECT(st == LH_STATE_ACQUIRING);
    EXPECT_ST(lh_fencing_token(c, lease, &fence), LH_ERR_NOT_GRANTED);
    EXPECT_ST(lh_valid_until(c, lease, &vu), LH_ERR_NOT_GRANTED);

    lh_output a = poll1(c);
    EXPECT(a.kind == LH_OUTPUT_ACQUIRE && a.reason == LH_REASON_NONE);
    EXPECT(a.lease_id == lease && a.request_id != 0 && a.ttl_ms == 3000);
    EXPECT(a.name_len == NAME_LEN && a.name != NULL && memcmp(a.name, NAME, NAME_LEN) == 0);
    EXPECT(a.token_len == 32 && a.token != NULL && is_lower_hex(a.token, 32));
    EXPECT(a.backend_data_len == 0);
    if (a.token_len == 32) memcpy(token, a.token, 32); /* copy: borrowed until the next call */
    EXPECT(poll1(c).kind == LH_OUTPUT_NONE);

    now = 1 * MS;
    EXPECT_ST(lh_acquire_result(c, now, a.request_id, LH_ACQUIRE_GRANTED, 42, 3000, LH_NO_RETRY_HINT,
                                bd, sizeof bd), LH_OK);
    lh_output ev = poll1(c);
    EXPECT(ev.kind == LH_OUTPUT_ACQUIRED && ev.lease_id == lease && ev.fencing_token == 42);
    EXPECT(ev.valid_until_ns > now && ev.valid_until_ns <= 0 + 3000 * MS); /* counted from send */
    EXPECT(ev.name == NULL && ev.token == NULL && ev.request_id == 0);
    EXPECT(poll1(c).kind == LH_OUTPUT_NONE);
    EXPECT_ST(lh_fencing_token(c, lease, &fence), LH_OK);
    EXPECT(fence == 42);
    EXPECT_ST(lh_valid_until(c, lease, &vu), LH_OK);
    EXPECT(vu == ev.valid_until_ns);
    bool held = false;
    EXPECT_ST(lh_is_held(c, lease, now, &held), LH_OK);
    EXPECT(held);
    EXPECT_ST(lh_is_held(c, lease, vu, &held), LH_OK);
    EXPECT(!held);
    lh_lease_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info + 64; /* a newer, larger struct is fine */
    EXPECT_ST(lh_lease_info_get(c, lease, &info), LH_OK);
    EXPECT(info.struct_size == sizeof info);
    EXPECT(info.state == LH_STATE_HELD && info.holders == 1 && info.has_token == 1);
    EXPECT(info.fencing_token == 42 && info.valid_until_ns == vu);

    /* Renew: comes before validity ends, carries the same token and the backend data. */
    EXPECT_ST(lh_poll_timeout(c, &deadline), LH_OK);
    EXPECT(deadline != LH_NO_DEADLINE && deadline < vu);
    lh_output r;
    int got_renew = 0;
    for (int i = 0; i < 20 && !got_renew; i++) {
        EXPECT_ST(lh_poll_timeout(c, &deadline), LH_OK);
        if (deadline > now) now = deadline;
        EXPECT_ST(lh_timeout(c, now), LH_OK);
        for (;;) {
            r = poll1(c);
            if (r.kind == LH_OUTPUT_NONE) break;
            if (r.kind == LH_OUTPUT_RENEW) {
                got_renew = 1;
                EXPECT(r.lease_id == lease && r.ttl_ms == 3000);
                EXPECT(r.token_len == 32 && memcmp(r.token, token, 32) == 0);
                EXPECT(r.name_len == NAME_LEN && memcmp(r.name, NAME, NAME_LEN) == 0);
                EXPECT(r.backend_data_len == sizeof bd && memcmp(r.backend_data, bd, sizeof bd) == 0);
                break;
            }
        }
    }
    EXPECT(got_renew);
    EXPECT(now < vu);
    drain_all(c);
    EXPECT_ST(lh_renew_result(c, now + 1 * MS, r.request_id, LH_RENEW_RENEWED), LH_OK);
    drain_all(c);
    uint64_t vu2 = 0;
    EXPECT_ST(lh_valid_until(c, lease, &vu2), LH_OK);
    EXPECT(vu2 > vu);
    lh_counters k = counters(c);
    EXPECT(k.renewals_sent >= 1 && k.renewals_ok == 1 && k.grants == 1 && k.acquires_sent == 1);

    /* Release: RELEASED at once, plus a RELEASE command with the same token and data. */
    now += 2 * MS;
    EXPECT_ST(lh_release(c, now, lease), LH_OK);
    int saw_released = 0, saw_release = 0;
    uint64_t rel_req = 0;
    for (;;) {
        lh_output x = poll1(c);
        if (x.kind == LH_OUTPUT_NONE) break;
        if (x.kind == LH_OUTPUT_RELEASED) saw_released = (x.lease_id == lease);
        if (x.kind == LH_OUTPUT_RELEASE) {
            saw_release = 1;
            rel_req = x.request_id;
            EXPECT(x.token_len == 32 && memcmp(x.token, token, 32) == 0);
            EXPECT(x.backend_data_len == sizeof bd && memcmp(x.backend_data, bd, sizeof bd) == 0);
        }
    }
    EXPECT(saw_released && saw_release);
    lh_status s = lh_lease_state(c, lease, &st);
    EXPECT(s == LH_ERR_LEASE_ENDED || (s == LH_OK && st == LH_STATE_RELEASED));
    EXPECT_ST(lh_is_held(c, lease, now, &held), LH_OK);
    EXPECT(!held);
    EXPECT(counters(c).pending_cleanups == 1);
    EXPECT_ST(lh_release_result(c, now + 1 * MS, rel_req, LH_RELEASE_RELEASED), LH_OK);
    EXPECT(counters(c).pending_cleanups == 0);
    lh_client_free(c);
}

static void double_release_is_lease_ended(void) {
    lh_client *c = mk();
    uint64_t lease = acquire_granted(c, 0, 3000, 1);
    EXPECT_ST(lh_release(c, 2 * MS, lease), LH_OK);
    drain_all(c);
    EXPECT_ST(lh_release(c, 3 * MS, lease), LH_ERR_LEASE_ENDED);
    EXPECT(strlen(lh_client_last_error(c)) > 0);
    EXPECT(poll1(c).kind == LH_OUTPUT_NONE); /* no second event, no second command */
    lh_client_free(c);
}

static void release_while_acquiring_is_cancelled(void) {
    lh_client *c = mk();
    lh_acquire_options o = opts_ttl(3000);
    uint64_t lease;
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_OK);
    drain_all(c);
    EXPECT_ST(lh_release(c, 1 * MS, lease), LH_OK);
    drained d = drain_all(c);
    const lh_output *f = find(&d, LH_OUTPUT_ACQUIRE_FAILED);
    EXPECT(f != NULL && f->lease_id == lease && f->reason == LH_REASON_CANCELLED);
    EXPECT(find(&d, LH_OUTPUT_RELEASED) == NULL);
    lh_client_free(c);
}

static void backend_data_hostile_inputs(void) {
    lh_client *c = mk();
    lh_acquire_options o = opts_ttl(3000);
    uint64_t lease;
    static uint8_t big[LH_MAX_BACKEND_DATA_LEN + 1];
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_OK);
    lh_output a = poll1(c);
    EXPECT_ST(lh_acquire_result(c, 1, a.request_id, LH_ACQUIRE_GRANTED, 1, 3000, 0, big, sizeof big),
              LH_ERR_BACKEND_DATA_TOO_LONG);
    EXPECT_ST(lh_acquire_result(c, 1, a.request_id, LH_ACQUIRE_GRANTED, 1, 3000, 0, big, SIZE_MAX),
              LH_ERR_BACKEND_DATA_TOO_LONG);
    EXPECT_ST(lh_acquire_result(c, 1, a.request_id, LH_ACQUIRE_GRANTED, 1, 3000, 0, NULL, 5),
              LH_ERR_NULL_ARGUMENT);
    uint32_t st = 0;
    EXPECT_ST(lh_lease_state(c, lease, &st), LH_OK);
    EXPECT(st == LH_STATE_ACQUIRING);
    EXPECT_ST(lh_acquire_result(c, 1, a.request_id, LH_ACQUIRE_GRANTED, 1, 3000, 0, big,
                                LH_MAX_BACKEND_DATA_LEN), LH_OK);
    EXPECT_ST(lh_lease_state(c, lease, &st), LH_OK);
    EXPECT(st == LH_STATE_HELD);
    lh_client_free(c);
}

static void released_notification_hostile_inputs(void) {
    lh_client *c = mk();
    static const uint8_t bad[] = {0xfe};
    EXPECT_ST(lh_released(c, 0, NULL, 3), LH_ERR_NULL_ARGUMENT);
    EXPECT_ST(lh_released(c, 0, bad, 1), LH_ERR_INVALID_UTF8);
    EXPECT_ST(lh_released(c, 0, NAME, SIZE_MAX), LH_ERR_NAME_TOO_LONG);
    EXPECT_ST(lh_released(c, 0, NAME, 0), LH_ERR_EMPTY_NAME);
    EXPECT_ST(lh_released(c, 0, NAME, NAME_LEN), LH_OK); /* nobody waits: harmless */
    EXPECT(poll1(c).kind == LH_OUTPUT_NONE);
    lh_client_free(c);
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
    lh_client *c = mk();
    uint64_t lease = acquire_granted(c, 0, 3000, 3);
    lh_lease_info info;
    lh_counters k;
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
    lh_client_free(c);
}

static void time_running_backwards_is_clamped(void) {
    lh_client *c = mk();
    uint64_t lease = acquire_granted(c, 1000 * MS, 3000, 11);
    uint64_t before = counters(c).time_clamped;
    EXPECT_ST(lh_timeout(c, 5 * MS), LH_OK);  /* earlier than anything seen */
    EXPECT_ST(lh_timeout(c, 0), LH_OK);
    EXPECT_ST(lh_release(c, 1, lease), LH_OK); /* still a valid input */
    drained d = drain_all(c);
    EXPECT(find(&d, LH_OUTPUT_RELEASED) != NULL);
    EXPECT(counters(c).time_clamped > before);
    lh_client_free(c);
}

static void renew_rejected_is_lost(void) {
    lh_client *c = mk();
    uint64_t now = 0;
    uint64_t lease = acquire_granted(c, now, 3000, 5);
    lh_output r;
    EXPECT(advance_until(c, &now, LH_OUTPUT_RENEW, &r));
    EXPECT_ST(lh_renew_result(c, now + 1 * MS, r.request_id, LH_RENEW_REJECTED), LH_OK);
    drained d = drain_all(c);
    const lh_output *l = find(&d, LH_OUTPUT_LOST);
    EXPECT(l != NULL && l->lease_id == lease && l->reason == LH_REASON_REJECTED);
    /* Terminal: LOST while its cleanup is pending, LEASE_ENDED once the record is dropped. */
    uint32_t st = 0;
    lh_status s = lh_lease_state(c, lease, &st);
    EXPECT(s == LH_ERR_LEASE_ENDED || (s == LH_OK && st == LH_STATE_LOST));
    EXPECT_ST(lh_release(c, now + 2 * MS, lease), LH_ERR_LEASE_ENDED);
    lh_client_free(c);
}

static void unanswered_renew_expires(void) {
    lh_client *c = mk();
    uint64_t now = 0, vu = 0;
    uint64_t lease = acquire_granted(c, now, 3000, 5);
    EXPECT_ST(lh_valid_until(c, lease, &vu), LH_OK);
    lh_output lost;
    /* Never answer anything: the core must declare the loss on its own, on time. */
    EXPECT(advance_until(c, &now, LH_OUTPUT_LOST, &lost));
    EXPECT(lost.lease_id == lease);
    EXPECT(lost.reason == LH_REASON_EXPIRED || lost.reason == LH_REASON_FAIL_BUDGET);
    EXPECT(now <= vu);
    bool held = true;
    EXPECT_ST(lh_is_held(c, lease, now, &held), LH_OK);
    EXPECT(!held);
    lh_client_free(c);
}

static void time_jump_forward_loses_the_lease(void) {
    lh_client *c = mk();
    uint64_t lease = acquire_granted(c, 0, 3000, 5);
    EXPECT_ST(lh_timeout(c, 3600000 * MS), LH_OK); /* a suspended VM wakes up an hour later */
    drained d = drain_all(c);
    const lh_output *l = find(&d, LH_OUTPUT_LOST);
    EXPECT(l != NULL && l->lease_id == lease);
    EXPECT(find(&d, LH_OUTPUT_RENEW) == NULL || find(&d, LH_OUTPUT_LOST) < find(&d, LH_OUTPUT_RENEW));
    lh_client_free(c);
}

static void reentrant_acquire_shares_the_lease(void) {
    lh_client *c = mk();
    lh_acquire_options o = opts_ttl(3000);
    o.flags = LH_ACQUIRE_REENTRANT;
    uint64_t l1 = 0, l2 = 0;
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &l1), LH_OK);
    lh_output a = poll1(c);
    EXPECT_ST(lh_acquire_result(c, 1 * MS, a.request_id, LH_ACQUIRE_GRANTED, 3, 3000, 0, NULL, 0), LH_OK);
    drain_all(c);
    EXPECT_ST(lh_acquire(c, 2 * MS, NAME, NAME_LEN, &o, &l2), LH_OK);
    EXPECT(l1 == l2);
    drained d = drain_all(c);
    EXPECT(find(&d, LH_OUTPUT_ACQUIRE) == NULL); /* no network call */
    EXPECT(find(&d, LH_OUTPUT_ACQUIRED) != NULL);
    lh_lease_info info;
    info.struct_size = sizeof info;
    EXPECT_ST(lh_lease_info_get(c, l1, &info), LH_OK);
    EXPECT(info.holders == 2);
    EXPECT_ST(lh_release(c, 3 * MS, l1), LH_OK);
    d = drain_all(c);
    EXPECT(d.n == 0);
    EXPECT_ST(lh_release(c, 4 * MS, l1), LH_OK);
    d = drain_all(c);
    EXPECT(find(&d, LH_OUTPUT_RELEASED) != NULL && find(&d, LH_OUTPUT_RELEASE) != NULL);
    lh_client_free(c);
}

static void last_error_is_per_handle(void) {
    lh_client *a = mk(), *b = mk();
    lh_acquire_options o = opts_ttl(0);
    uint64_t lease;
    EXPECT(strcmp(lh_client_last_error(a), "") == 0);
    EXPECT_ST(lh_acquire(a, 0, NAME, NAME_LEN, &o, &lease), LH_ERR_INVALID_TTL);
    char saved[256];
    snprintf(saved, sizeof saved, "%s", lh_client_last_error(a));
    EXPECT(strlen(saved) > 0);
    EXPECT_ST(lh_release(b, 0, 777), LH_ERR_UNKNOWN_LEASE);
    EXPECT(strcmp(lh_client_last_error(a), saved) == 0); /* b's error did not touch a */
    EXPECT(strcmp(lh_client_last_error(b), saved) != 0);
    lh_client_free(a);
    lh_client_free(b);
}

static void panic_poisons_only_that_handle(void) {
    lh_client *c = mk(), *other = mk();
    lh_acquire_options o = opts_ttl(3000);
    uint64_t lease = 0, u64 = 1;
    uint32_t u32 = 1;
    bool b = false;
    lh_output out;
    lh_lease_info info;
    lh_counters k;
    info.struct_size = sizeof info;
    k.struct_size = sizeof k;
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_OK);
    EXPECT_ST(lh_client_debug_panic(c), LH_ERR_PANIC);
    EXPECT(strstr(lh_client_last_error(c), "panic") != NULL);
    EXPECT_ST(lh_client_debug_panic(c), LH_ERR_POISONED);
    EXPECT_ST(lh_client_reseed(c, SEED, sizeof SEED), LH_ERR_POISONED);
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_ERR_POISONED);
    EXPECT_ST(lh_release(c, 0, lease), LH_ERR_POISONED);
    EXPECT_ST(lh_acquire_result(c, 0, 1, LH_ACQUIRE_GRANTED, 1, 3000, 0, NULL, 0), LH_ERR_POISONED);
    EXPECT_ST(lh_renew_result(c, 0, 1, LH_RENEW_RENEWED), LH_ERR_POISONED);
    EXPECT_ST(lh_release_result(c, 0, 1, LH_RELEASE_RELEASED), LH_ERR_POISONED);
    EXPECT_ST(lh_released(c, 0, NAME, NAME_LEN), LH_ERR_POISONED);
    EXPECT_ST(lh_timeout(c, 0), LH_ERR_POISONED);
    EXPECT_ST(lh_poll_output(c, &out), LH_ERR_POISONED);
    EXPECT_ST(lh_poll_timeout(c, &u64), LH_ERR_POISONED);
    EXPECT_ST(lh_lease_state(c, lease, &u32), LH_ERR_POISONED);
    EXPECT_ST(lh_lease_info_get(c, lease, &info), LH_ERR_POISONED);
    EXPECT_ST(lh_fencing_token(c, lease, &u64), LH_ERR_POISONED);
    EXPECT_ST(lh_valid_until(c, lease, &u64), LH_ERR_POISONED);
    EXPECT_ST(lh_is_held(c, lease, 0, &b), LH_ERR_POISONED);
    EXPECT_ST(lh_counters_get(c, &k), LH_ERR_POISONED);
    EXPECT(strstr(lh_client_last_error(c), "poisoned") != NULL);
    EXPECT(u64 == 1 && u32 == 1);
    /* Another handle is unaffected. */
    lh_client_free(c);
    uint64_t l2 = acquire_granted(other, 0, 3000, 4);
    EXPECT(l2 != 0);
    lh_client_free(other);
}

static void many_leases_and_free_with_pending_work(void) {
    lh_client *c = mk();
    lh_acquire_options o = opts_ttl(3000);
    char name[32];
    for (int i = 0; i < 200; i++) {
        uint64_t lease;
        int n = snprintf(name, sizeof name, "lock-%d", i);
        EXPECT_ST(lh_acquire(c, (uint64_t)i, (const uint8_t *)name, (size_t)n, &o, &lease), LH_OK);
    }
    EXPECT(counters(c).live_leases == 200);
    /* Free with 200 unpolled outputs and unanswered requests: no leak (valgrind checks). */
    lh_client_free(c);
}

static void hostile_granted_ttls_never_extend_validity(void) {
    static const uint64_t ttls[] = {0, UINT64_MAX, UINT64_MAX / 1000000 + 1};
    for (size_t i = 0; i < sizeof ttls / sizeof ttls[0]; i++) {
        lh_client *c = mk();
        lh_acquire_options o = opts_ttl(3000);
        uint64_t lease = 0;
        bool held = true;
        EXPECT_ST(lh_acquire(c, 10 * MS, NAME, NAME_LEN, &o, &lease), LH_OK);
        lh_output a = poll1(c);
        EXPECT_ST(lh_acquire_result(c, 11 * MS, a.request_id, LH_ACQUIRE_GRANTED, UINT64_MAX, ttls[i],
                                    LH_NO_RETRY_HINT, NULL, 0), LH_OK);
        drained d = drain_all(c);
        const lh_output *ev = find(&d, LH_OUTPUT_ACQUIRED);
        if (ev != NULL) EXPECT(ev->valid_until_ns <= 10 * MS + 3000 * MS);
        EXPECT_ST(lh_is_held(c, lease, 10 * MS + 3000 * MS, &held), LH_OK);
        EXPECT(!held);
        EXPECT_ST(lh_acquire(c, 12 * MS, (const uint8_t *)"other", 5, &o, &lease), LH_OK);
        lh_client_free(c);
    }
}

/* Copies the token of the next ACQUIRE command of a fresh acquire of `name`. */
static void acquire_token(lh_client *c, const char *name, uint8_t token[32]) {
    lh_acquire_options o = opts_ttl(3000);
    uint64_t lease;
    EXPECT_ST(lh_acquire(c, 0, (const uint8_t *)name, strlen(name), &o, &lease), LH_OK);
    lh_output a = poll1(c);
    EXPECT(a.kind == LH_OUTPUT_ACQUIRE && a.token_len == 32);
    if (a.token_len == 32) memcpy(token, a.token, 32);
}

static void same_seed_is_deterministic(void) {
    lh_client *a = mk(), *b = mk();
    uint8_t ta[32] = {0}, tb[32] = {1};
    acquire_token(a, "x", ta);
    acquire_token(b, "x", tb);
    EXPECT(memcmp(ta, tb, 32) == 0); /* tests and fuzzers replay runs from a seed */
    lh_client_free(a);
    lh_client_free(b);
}

static void reseed_after_fork_gives_distinct_tokens(void) {
    lh_client *c = mk();
    uint8_t parent[32] = {0}, child[32] = {0};
    int fds[2];
    EXPECT(pipe(fds) == 0);
    pid_t pid = fork();
    EXPECT(pid >= 0);
    if (pid == 0) {
        /* Child: what Python's os.register_at_fork(after_in_child=...) does. */
        uint8_t fresh[32];
        for (size_t i = 0; i < sizeof fresh; i++) fresh[i] = (uint8_t)(0xc0 + i);
        int ok = lh_client_reseed(c, fresh, sizeof fresh) == LH_OK;
        uint8_t tok[32] = {0};
        acquire_token(c, "x", tok);
        ok = ok && test_ok;
        ssize_t w = write(fds[1], tok, 32);
        lh_client_free(c);
        _exit(ok && w == 32 ? 0 : 1);
    }
    close(fds[1]);
    acquire_token(c, "x", parent);
    EXPECT(read(fds[0], child, 32) == 32);
    close(fds[0]);
    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT(memcmp(parent, child, 32) != 0);
    lh_client_free(c);
}

/* ------------------------------------------------- manual renew, auto_renew, release outcomes */

static void manual_renew_extends_validity_from_its_send_time(void) {
    lh_client *c = mk();
    uint64_t lease = acquire_granted(c, 0, 3000, 5);
    EXPECT_ST(lh_renew(c, 500 * MS, lease), LH_OK);
    drained d = drain_all(c);
    EXPECT(d.n == 1 && d.o[0].kind == LH_OUTPUT_RENEW && d.o[0].lease_id == lease);
    EXPECT_ST(lh_renew_result(c, 510 * MS, d.o[0].request_id, LH_RENEW_RENEWED), LH_OK);
    d = drain_all(c);
    const lh_output *r = find(&d, LH_OUTPUT_RENEWED);
    /* 500 ms + 3000 ms - (1% of 3000 ms + 2 ms) */
    EXPECT(r != NULL && r->lease_id == lease && r->valid_until_ns == 3468 * MS);
    uint64_t vu = 0;
    EXPECT_ST(lh_valid_until(c, lease, &vu), LH_OK);
    EXPECT(vu == 3468 * MS);
    EXPECT(counters(c).renewals_requested == 1);
    lh_client_free(c);
}

static void manual_renew_of_an_ended_or_acquiring_lease_sends_nothing(void) {
    lh_client *c = mk();
    uint64_t now = 0;
    uint64_t released = acquire_granted(c, now, 3000, 5);
    EXPECT_ST(lh_release(c, 2 * MS, released), LH_OK);
    drain_all(c);
    uint64_t sent = counters(c).renewals_sent;
    EXPECT_ST(lh_renew(c, 3 * MS, released), LH_ERR_LEASE_ENDED);
    EXPECT(poll1(c).kind == LH_OUTPUT_NONE);

    lh_client *c2 = mk();
    uint64_t lost = acquire_granted(c2, now, 3000, 6);
    lh_output r;
    EXPECT(advance_until(c2, &now, LH_OUTPUT_RENEW, &r));
    EXPECT_ST(lh_renew_result(c2, now, r.request_id, LH_RENEW_REJECTED), LH_OK);
    drain_all(c2);
    EXPECT_ST(lh_renew(c2, now + MS, lost), LH_ERR_LEASE_ENDED);
    EXPECT(poll1(c2).kind == LH_OUTPUT_NONE);
    lh_client_free(c2);

    lh_acquire_options o = opts_ttl(3000);
    uint64_t acquiring = 0;
    EXPECT_ST(lh_acquire(c, 4 * MS, NAME, NAME_LEN, &o, &acquiring), LH_OK);
    drain_all(c);
    EXPECT_ST(lh_renew(c, 5 * MS, acquiring), LH_ERR_NOT_GRANTED);
    EXPECT_ST(lh_renew(c, 5 * MS, 0), LH_ERR_UNKNOWN_LEASE);
    EXPECT_ST(lh_renew(NULL, 5 * MS, acquiring), LH_ERR_NULL_ARGUMENT);
    EXPECT(poll1(c).kind == LH_OUTPUT_NONE);
    EXPECT(counters(c).renewals_sent == sent && counters(c).renewals_requested == 0);
    lh_client_free(c);
}

static void no_auto_renew_lease_is_lost_at_valid_until_without_renewals(void) {
    lh_client *c = mk();
    lh_acquire_options o = opts_ttl(3000);
    o.flags = LH_ACQUIRE_NO_AUTO_RENEW;
    uint64_t lease = 0, now = 0, vu = 0;
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &lease), LH_OK);
    lh_output a = poll1(c);
    EXPECT_ST(lh_acquire_result(c, 1 * MS, a.request_id, LH_ACQUIRE_GRANTED, 3, 3000, 0, NULL, 0), LH_OK);
    drain_all(c);
    EXPECT_ST(lh_valid_until(c, lease, &vu), LH_OK);
    lh_output lost;
    EXPECT(advance_until(c, &now, LH_OUTPUT_LOST, &lost));
    EXPECT(lost.lease_id == lease && lost.reason == LH_REASON_EXPIRED && now == vu);
    EXPECT(counters(c).renewals_sent == 0);
    lh_client_free(c);
}

/* Releases a held lease with lh_release_reported and answers the RELEASE with `outcome`;
 * returns the RELEASE_OUTCOME reason (0 if none came). */
static uint32_t reported_release(uint32_t outcome) {
    lh_client *c = mk();
    uint64_t lease = acquire_granted(c, 0, 3000, 5);
    uint32_t releasing = 0xdead;
    EXPECT_ST(lh_release_reported(c, 2 * MS, lease, NULL), LH_ERR_NULL_ARGUMENT);
    EXPECT(poll1(c).kind == LH_OUTPUT_NONE); /* nothing happened */
    EXPECT_ST(lh_release_reported(c, 2 * MS, lease, &releasing), LH_OK);
    EXPECT(releasing == LH_RELEASING_PENDING);
    drained d = drain_all(c);
    const lh_output *rel = find(&d, LH_OUTPUT_RELEASE);
    EXPECT(find(&d, LH_OUTPUT_RELEASED) != NULL && rel != NULL);
    uint32_t reason = 0;
    if (rel != NULL) {
        EXPECT_ST(lh_release_result(c, 3 * MS, rel->request_id, outcome), LH_OK);
        d = drain_all(c);
        const lh_output *o = find(&d, LH_OUTPUT_RELEASE_OUTCOME);
        if (o != NULL && o->lease_id == lease) reason = o->reason;
    }
    lh_counters k = counters(c);
    EXPECT(k.releases_confirmed == (outcome == LH_RELEASE_RELEASED));
    EXPECT(k.releases_not_owner == (outcome == LH_RELEASE_NOT_OWNER));
    EXPECT(k.releases_lost == 0 && k.releases_unconfirmed == 0);
    lh_client_free(c);
    return reason;
}

static void release_reported_tells_confirmed_and_not_owner(void) {
    EXPECT(reported_release(LH_RELEASE_RELEASED) == LH_REASON_RELEASE_CONFIRMED);
    EXPECT(reported_release(LH_RELEASE_NOT_OWNER) == LH_REASON_RELEASE_NOT_OWNER);
    uint32_t releasing = 0xdead;
    lh_client *c = mk();
    EXPECT_ST(lh_release_reported(c, 0, 12345, &releasing), LH_ERR_UNKNOWN_LEASE);
    EXPECT(releasing == 0xdead); /* written only on success */
    EXPECT_ST(lh_release_reported(NULL, 0, 1, &releasing), LH_ERR_NULL_ARGUMENT);
    lh_client_free(c);
}

static void release_after_a_pause_ends_lost(void) {
    lh_client *c = mk();
    uint64_t lease = acquire_granted(c, 0, 3000, 5);
    uint32_t releasing = 0;
    /* The process was paused past valid_until; its first act on waking is the release. */
    EXPECT_ST(lh_release_reported(c, 10000 * MS, lease, &releasing), LH_OK);
    EXPECT(releasing == LH_RELEASING_LOST);
    drained d = drain_all(c);
    const lh_output *l = find(&d, LH_OUTPUT_LOST);
    EXPECT(l != NULL && l->lease_id == lease && l->reason == LH_REASON_EXPIRED);
    EXPECT(find(&d, LH_OUTPUT_RELEASED) == NULL && find(&d, LH_OUTPUT_RELEASE_OUTCOME) == NULL);
    EXPECT(counters(c).releases_lost == 1);
    EXPECT_ST(lh_release_reported(c, 10001 * MS, lease, &releasing), LH_ERR_LEASE_ENDED);
    /* The driver runs again: its timeouts and the cleanup's answer bring no second LOST. */
    int lost_events = 0;
    for (size_t i = 0; i < d.n; i++) lost_events += d.o[i].kind == LH_OUTPUT_LOST;
    uint64_t now = 10001 * MS;
    for (int i = 0; i < 20; i++) {
        uint64_t dl;
        EXPECT_ST(lh_poll_timeout(c, &dl), LH_OK);
        if (dl == LH_NO_DEADLINE) break;
        if (dl > now) now = dl;
        EXPECT_ST(lh_timeout(c, now), LH_OK);
        drained more = drain_all(c);
        for (size_t j = 0; j < more.n; j++) {
            lost_events += more.o[j].kind == LH_OUTPUT_LOST;
            EXPECT(more.o[j].kind != LH_OUTPUT_RELEASED && more.o[j].kind != LH_OUTPUT_RELEASE_OUTCOME);
            if (more.o[j].kind == LH_OUTPUT_RELEASE)
                EXPECT_ST(lh_release_result(c, now, more.o[j].request_id, LH_RELEASE_RELEASED), LH_OK);
        }
    }
    EXPECT(lost_events == 1);
    EXPECT(counters(c).lost_expired == 1 && counters(c).releases_confirmed == 0);
    lh_client_free(c);
}

/* ------------------------------------------------------------------ the renewal failure budget */

/* One lease on virtual time whose service is unreachable (every RENEW answered with a transport
 * error) from `down_from` to `down_until`, and answers otherwise; runs the core's deadlines up
 * to `end`. */
typedef struct outage_run {
    uint64_t lease, valid_until;  /* valid_until: the last one known before the loss */
    int lost_events;
    uint32_t lost_reason;
    uint64_t lost_at;
    lh_counters k;
} outage_run;

static outage_run run_outage(uint32_t fail_budget, uint64_t ttl_ms, uint64_t down_from, uint64_t down_until,
                             uint64_t end) {
    outage_run r;
    memset(&r, 0, sizeof r);
    lh_config cfg;
    lh_client *c = NULL;
    lh_config_default(&cfg);
    cfg.fail_budget = fail_budget;
    EXPECT_ST(lh_client_new(&cfg, SEED, sizeof SEED, &c), LH_OK);
    if (c == NULL) return r;
    uint64_t now = 0;
    r.lease = acquire_granted(c, now, ttl_ms, 7);
    EXPECT_ST(lh_valid_until(c, r.lease, &r.valid_until), LH_OK);
    for (int guard = 0; guard < 100000; guard++) {
        uint64_t dl;
        EXPECT_ST(lh_poll_timeout(c, &dl), LH_OK);
        if (dl == LH_NO_DEADLINE || dl > end) break;
        if (dl > now) now = dl;
        EXPECT_ST(lh_timeout(c, now), LH_OK);
        /* Answer every command at once (an answer may queue the next: a retry, a cleanup). */
        int down = now >= down_from && now < down_until;
        for (int round = 0; round < 100; round++) {
            drained d = drain_all(c);
            if (d.n == 0) break;
            for (size_t i = 0; i < d.n; i++) {
                const lh_output *o = &d.o[i];
                if (o->kind == LH_OUTPUT_RENEW) {
                    EXPECT_ST(lh_renew_result(c, now, o->request_id,
                                              down ? LH_RENEW_TRANSPORT_ERROR : LH_RENEW_RENEWED), LH_OK);
                } else if (o->kind == LH_OUTPUT_RELEASE) {
                    EXPECT_ST(lh_release_result(c, now, o->request_id,
                                                down ? LH_RELEASE_TRANSPORT_ERROR : LH_RELEASE_RELEASED), LH_OK);
                } else if (o->kind == LH_OUTPUT_LOST && o->lease_id == r.lease && r.lost_events++ == 0) {
                    r.lost_reason = o->reason;
                    r.lost_at = now;
                }
            }
        }
        if (r.lost_events == 0) {
            uint64_t vu = 0;
            if (lh_valid_until(c, r.lease, &vu) == LH_OK) r.valid_until = vu;
        }
    }
    r.k = counters(c);
    lh_client_free(c);
    return r;
}

/* The time budget (the default): a 30 s lease keeps its lock through 3 s of an unreachable
 * service that starts when its first renewal is due, however many retries fail meanwhile. */
static void time_budget_keeps_a_30s_lease_through_a_3s_outage(void) {
    outage_run r = run_outage(0, 30000, 9000 * MS, 12000 * MS, 120000 * MS);
    EXPECT(r.lost_events == 0);
    EXPECT(r.k.renewals_failed >= 3); /* more than a count budget of 3 forgives */
    EXPECT(r.k.renewals_ok >= 3 && r.k.live_leases == 1);
    EXPECT(r.valid_until > 120000 * MS);
    /* The same outage under a count budget of 3 costs the lease, long before its validity ends. */
    outage_run n = run_outage(3, 30000, 9000 * MS, 12000 * MS, 120000 * MS);
    EXPECT(n.lost_events == 1 && n.lost_reason == LH_REASON_FAIL_BUDGET);
    EXPECT(n.k.renewals_failed == 3 && n.k.lost_fail_budget == 1);
    EXPECT(n.lost_at < n.valid_until);
}

/* Unreachable for good: lost before its validity ends (never after), once, with renewals
 * retried until then; under a count budget, after that many failures. */
static void unreachable_service_loses_the_lease_before_validity_ends(void) {
    outage_run r = run_outage(0, 30000, 0, UINT64_MAX, 120000 * MS);
    EXPECT(r.lost_events == 1);
    EXPECT(r.lost_reason == LH_REASON_FAIL_BUDGET);
    EXPECT(r.lost_at > 0 && r.lost_at < r.valid_until);
    EXPECT(r.k.renewals_failed >= 3 && r.k.renewals_ok == 0);
    EXPECT(r.k.lost_fail_budget == 1);

    outage_run n = run_outage(2, 30000, 0, UINT64_MAX, 120000 * MS);
    EXPECT(n.lost_events == 1 && n.lost_reason == LH_REASON_FAIL_BUDGET);
    EXPECT(n.k.renewals_failed == 2 && n.lost_at < n.valid_until);
}

static void counters_accept_the_first_struct_size(void) {
    lh_client *c = mk();
    (void)acquire_granted(c, 0, 3000, 5);
    lh_counters k;
    memset(&k, 0x5a, sizeof k);
    k.struct_size = LH_COUNTERS_V1_SIZE; /* a host built against the first header */
    EXPECT_ST(lh_counters_get(c, &k), LH_OK);
    EXPECT(k.struct_size == LH_COUNTERS_V1_SIZE && k.live_leases == 1 && k.grants == 1);
    EXPECT(k.renewals_requested == 0x5a5a5a5a5a5a5a5aull); /* beyond its struct: untouched */
    lh_client_free(c);
}

/* One client of the memory service: its core, its connection and what its events said. */
typedef struct mem_host {
    lh_client *c;
    uint64_t conn;
    uint64_t fence;        /* fencing token of the last ACQUIRED, 0 if none */
    uint32_t lost_reason;  /* reason of LOST, 0 if none */
    uint32_t outcome;      /* reason of RELEASE_OUTCOME, 0 if none */
} mem_host;

/* Runs every host's commands on the service and feeds results and notifications back. */
static void mem_pump(lh_memory_service *s, mem_host *h, size_t n, uint64_t now) {
    for (int round = 0; round < 1000; round++) {
        int busy = 0;
        for (size_t i = 0; i < n; i++) {
            for (;;) {
                lh_output o = poll1(h[i].c);
                lh_memory_result r;
                if (o.kind == LH_OUTPUT_NONE) break;
                busy = 1;
                memset(&r, 0, sizeof r);
                r.struct_size = sizeof r;
                switch (o.kind) {
                case LH_OUTPUT_ACQUIRE:
                    EXPECT_ST(lh_memory_service_acquire(s, h[i].conn, now, o.name, o.name_len, o.token,
                                                        o.token_len, o.ttl_ms, &r), LH_OK);
                    EXPECT_ST(lh_acquire_result(h[i].c, now, o.request_id, r.engine_outcome,
                                                r.fencing_token, r.ttl_ms, r.retry_after_ms, NULL, 0), LH_OK);
                    break;
                case LH_OUTPUT_RENEW:
                    EXPECT_ST(lh_memory_service_renew(s, h[i].conn, now, o.name, o.name_len, o.token,
                                                      o.token_len, o.ttl_ms, &r), LH_OK);
                    EXPECT_ST(lh_renew_result(h[i].c, now, o.request_id, r.engine_outcome), LH_OK);
                    break;
                case LH_OUTPUT_RELEASE:
                    EXPECT_ST(lh_memory_service_release(s, h[i].conn, now, o.name, o.name_len, o.token,
                                                        o.token_len, &r), LH_OK);
                    EXPECT_ST(lh_release_result(h[i].c, now, o.request_id, r.engine_outcome), LH_OK);
                    break;
                case LH_OUTPUT_WATCH:
                    EXPECT_ST(lh_memory_service_watch(s, h[i].conn, o.name, o.name_len), LH_OK);
                    break;
                case LH_OUTPUT_UNWATCH:
                    EXPECT_ST(lh_memory_service_unwatch(s, h[i].conn, o.name, o.name_len), LH_OK);
                    break;
                case LH_OUTPUT_ACQUIRED: h[i].fence = o.fencing_token; break;
                case LH_OUTPUT_LOST: h[i].lost_reason = o.reason; break;
                case LH_OUTPUT_RELEASE_OUTCOME: h[i].outcome = o.reason; break;
                default: break;
                }
            }
            for (;;) {
                const uint8_t *name = NULL;
                size_t len = 0;
                EXPECT_ST(lh_memory_service_poll_released(s, h[i].conn, &name, &len), LH_OK);
                if (name == NULL) break;
                busy = 1;
                EXPECT_ST(lh_released(h[i].c, now, name, len), LH_OK);
            }
        }
        if (!busy) return;
    }
    EXPECT(!"the host loop did not settle");
}

/* Feeds every deadline up to `to`, pumping after each. */
static void mem_advance(lh_memory_service *s, mem_host *h, size_t n, uint64_t *now, uint64_t to) {
    for (int guard = 0; guard < 100000; guard++) {
        uint64_t next = LH_NO_DEADLINE;
        for (size_t i = 0; i < n; i++) {
            uint64_t d;
            EXPECT_ST(lh_poll_timeout(h[i].c, &d), LH_OK);
            if (d < next) next = d;
        }
        if (next > to) break;
        if (next > *now) *now = next;
        for (size_t i = 0; i < n; i++) EXPECT_ST(lh_timeout(h[i].c, *now), LH_OK);
        mem_pump(s, h, n, *now);
    }
    *now = to;
    for (size_t i = 0; i < n; i++) EXPECT_ST(lh_timeout(h[i].c, *now), LH_OK);
    mem_pump(s, h, n, *now);
}

/* A memory service with two connected hosts on distinct seeds. */
static lh_memory_service *mem_two_hosts(mem_host h[2]) {
    static const uint8_t seed_b[32] = {7};
    lh_memory_config mc;
    lh_memory_service *s = NULL;
    lh_config cfg;
    memset(h, 0, 2 * sizeof *h);
    lh_memory_config_default(&mc);
    EXPECT_ST(lh_memory_service_new(&mc, &s), LH_OK);
    h[0].c = mk();
    lh_config_default(&cfg);
    EXPECT_ST(lh_client_new(&cfg, seed_b, sizeof seed_b, &h[1].c), LH_OK);
    EXPECT_ST(lh_memory_service_connect(s, &h[0].conn), LH_OK);
    EXPECT_ST(lh_memory_service_connect(s, &h[1].conn), LH_OK);
    return s;
}

/* Two clients on lh_memory_service: contention, loss after a partition, handoff, release. */
static void memory_service_drives_two_clients(void) {
    mem_host h[2];
    lh_memory_service *s = mem_two_hosts(h);
    uint64_t now = 0, lease_a = 0, lease_b = 0;
    uint32_t releasing = 0;
    lh_acquire_options o = opts_ttl(300);
    lh_memory_faults f;
    lh_memory_status st;

    EXPECT_ST(lh_memory_service_connect(NULL, &h[1].conn), LH_ERR_NULL_ARGUMENT);

    EXPECT_ST(lh_acquire(h[0].c, now, NAME, NAME_LEN, &o, &lease_a), LH_OK);
    mem_pump(s, h, 2, now);
    EXPECT(h[0].fence == 1);
    o.wait_ns = 5000 * MS;
    EXPECT_ST(lh_acquire(h[1].c, now, NAME, NAME_LEN, &o, &lease_b), LH_OK);
    mem_pump(s, h, 2, now);
    EXPECT(h[1].fence == 0); /* A holds it */

    /* A is cut off: it stops believing before its grant expires; then B gets the lock. */
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    f.flags = LH_MEMORY_PARTITIONED;
    EXPECT_ST(lh_memory_service_set_faults(s, h[0].conn, &f), LH_OK);
    f.flags = 1u << 20;
    EXPECT_ST(lh_memory_service_set_faults(s, h[0].conn, &f), LH_ERR_INVALID_ENUM);
    mem_advance(s, h, 2, &now, 2000 * MS);
    EXPECT(h[0].lost_reason == LH_REASON_FAIL_BUDGET || h[0].lost_reason == LH_REASON_EXPIRED);
    EXPECT(h[1].fence == 2);

    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    EXPECT_ST(lh_memory_service_status(s, now, NAME, NAME_LEN, &st), LH_OK);
    EXPECT(st.held == 1 && st.fencing_token == 2 && st.holder_connection == h[1].conn);
    EXPECT(st.holder_token_len == 32);

    /* B releases and the service confirms it. */
    EXPECT_ST(lh_release_reported(h[1].c, now, lease_b, &releasing), LH_OK);
    EXPECT(releasing == LH_RELEASING_PENDING);
    mem_pump(s, h, 2, now);
    EXPECT(h[1].outcome == LH_REASON_RELEASE_CONFIRMED);
    EXPECT_ST(lh_memory_service_status(s, now, NAME, NAME_LEN, &st), LH_OK);
    EXPECT(st.held == 0 && st.last_fencing_token == 2);

    lh_client_free(h[0].c);
    lh_client_free(h[1].c);
    lh_memory_service_free(s);
    lh_memory_service_free(NULL);
}

/* Release outcomes from a service that answers: a release refused because the service gave
 * the lock to someone else reports NOT_OWNER (and leaves the new holder alone); a clean one
 * reports CONFIRMED; each is counted. */
static void memory_service_release_outcomes(void) {
    mem_host h[2];
    lh_memory_service *s = mem_two_hosts(h);
    uint64_t lease_a = 0, lease_b = 0;
    uint32_t releasing = 0;
    lh_acquire_options o = opts_ttl(30000);
    lh_memory_status st;

    EXPECT_ST(lh_acquire(h[0].c, 0, NAME, NAME_LEN, &o, &lease_a), LH_OK);
    mem_pump(s, h, 2, 0);
    EXPECT(h[0].fence == 1);
    /* The service loses A's grant (a failover) and B takes the lock; A still believes. */
    EXPECT_ST(lh_memory_service_forget(s, NAME, NAME_LEN), LH_OK);
    EXPECT_ST(lh_acquire(h[1].c, MS, NAME, NAME_LEN, &o, &lease_b), LH_OK);
    mem_pump(s, h, 2, MS);
    EXPECT(h[1].fence == 2);

    EXPECT_ST(lh_release_reported(h[0].c, 2 * MS, lease_a, &releasing), LH_OK);
    EXPECT(releasing == LH_RELEASING_PENDING);
    mem_pump(s, h, 2, 2 * MS);
    EXPECT(h[0].outcome == LH_REASON_RELEASE_NOT_OWNER && h[0].lost_reason == 0);
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    EXPECT_ST(lh_memory_service_status(s, 2 * MS, NAME, NAME_LEN, &st), LH_OK);
    EXPECT(st.held == 1 && st.fencing_token == 2 && st.holder_connection == h[1].conn);
    lh_counters ka = counters(h[0].c);
    EXPECT(ka.releases_not_owner == 1 && ka.releases_confirmed == 0 && ka.releases_lost == 0);

    EXPECT_ST(lh_release_reported(h[1].c, 3 * MS, lease_b, &releasing), LH_OK);
    EXPECT(releasing == LH_RELEASING_PENDING);
    mem_pump(s, h, 2, 3 * MS);
    EXPECT(h[1].outcome == LH_REASON_RELEASE_CONFIRMED);
    EXPECT_ST(lh_memory_service_status(s, 3 * MS, NAME, NAME_LEN, &st), LH_OK);
    EXPECT(st.held == 0);
    lh_counters kb = counters(h[1].c);
    EXPECT(kb.releases_confirmed == 1 && kb.releases_not_owner == 0);

    lh_client_free(h[0].c);
    lh_client_free(h[1].c);
    lh_memory_service_free(s);
}

int main(void) {
    RUN(version_macros_match_library);
    RUN(status_str_names_every_code);
    RUN(defaults_fill_structs);
    RUN(client_new_rejects_hostile_arguments);
    RUN(null_handle_is_an_error_everywhere);
    RUN(null_out_params_are_errors_and_change_nothing);
    RUN(acquire_rejects_hostile_names_and_options);
    RUN(unknown_lease_ids_are_errors);
    RUN(unknown_enum_values_are_errors);
    RUN(stale_and_unknown_request_ids_are_ignored);
    RUN(already_answered_request_is_stale);
    RUN(full_lifecycle_with_backend_data);
    RUN(double_release_is_lease_ended);
    RUN(release_while_acquiring_is_cancelled);
    RUN(backend_data_hostile_inputs);
    RUN(released_notification_hostile_inputs);
    RUN(reseed_hostile_inputs);
    RUN(struct_size_checks_on_out_structs);
    RUN(time_running_backwards_is_clamped);
    RUN(renew_rejected_is_lost);
    RUN(unanswered_renew_expires);
    RUN(time_jump_forward_loses_the_lease);
    RUN(reentrant_acquire_shares_the_lease);
    RUN(last_error_is_per_handle);
    RUN(panic_poisons_only_that_handle);
    RUN(many_leases_and_free_with_pending_work);
    RUN(hostile_granted_ttls_never_extend_validity);
    RUN(same_seed_is_deterministic);
    RUN(reseed_after_fork_gives_distinct_tokens);
    RUN(manual_renew_extends_validity_from_its_send_time);
    RUN(manual_renew_of_an_ended_or_acquiring_lease_sends_nothing);
    RUN(no_auto_renew_lease_is_lost_at_valid_until_without_renewals);
    RUN(release_reported_tells_confirmed_and_not_owner);
    RUN(release_after_a_pause_ends_lost);
    RUN(time_budget_keeps_a_30s_lease_through_a_3s_outage);
    RUN(unreachable_service_loses_the_lease_before_validity_ends);
    RUN(counters_accept_the_first_struct_size);
    RUN(memory_service_drives_two_clients);
    RUN(memory_service_release_outcomes);
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
