/*
 * harness.h -- what the C ABI tests share: the check macros, clients on the memory backend,
 * and a memory executor that runs every pending request of a few clients on one
 * lh_memory_service (the loop of leasehold.h on virtual time), so the engine's rules are
 * exercised through the same seam as every backend. Host-level faults live here too: a
 * client whose calls hang (polled, never answered) and calls held back to be answered late.
 */
#ifndef LH_TEST_HARNESS_H
#define LH_TEST_HARNESS_H

/* The tests call test hooks (lh_client_debug_panic, the memory service's fault switches),
 * declared under LH_TESTING and exported by a library built with --features testing. */
#define LH_TESTING 1
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "leasehold.h"

#define MS 1000000ull

extern int passed, failed, test_ok;
extern const char *test_name;

#define EXPECT(cond)                                                                               \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  %s:%d: %s: expected %s\n", __FILE__, __LINE__, test_name, #cond);   \
            test_ok = 0;                                                                           \
        }                                                                                          \
    } while (0)

#define EXPECT_ST(call, want)                                                                      \
    do {                                                                                           \
        lh_status got_ = (call);                                                                   \
        if (got_ != (lh_status)(want)) {                                                           \
            fprintf(stderr, "  %s:%d: %s: %s returned %s, expected %s\n", __FILE__, __LINE__,      \
                    test_name, #call, lh_status_str(got_), lh_status_str(want));                   \
            test_ok = 0;                                                                           \
        }                                                                                          \
    } while (0)

#define RUN(fn)                                                                                    \
    do {                                                                                           \
        test_name = #fn;                                                                           \
        test_ok = 1;                                                                               \
        fn();                                                                                      \
        if (test_ok) passed++;                                                                     \
        else {                                                                                     \
            failed++;                                                                              \
            fprintf(stderr, "FAIL %s\n", #fn);                                                     \
        }                                                                                          \
    } while (0)

extern const uint8_t SEED[32];
extern const uint8_t NAME[7]; /* "orders" */
#define NAME_LEN 6

/* A memory-backend client with `cfg` (NULL: the defaults) and `seed` (NULL: SEED). */
lh_client *mk_client(const lh_config *cfg, const uint8_t *seed, size_t seed_len);
/* A memory-backend client with the defaults and SEED. */
lh_client *mk(void);
lh_acquire_options opts_ttl(uint64_t ttl_ms);
lh_counters counters(const lh_client *c);

/* One request copied out of lh_io_poll (its pointers borrow the handle until the next call). */
#define CALL_MAX_ARGS 8
typedef struct call {
    uint64_t id;
    uint32_t kind, connection, argc;
    lh_bytes argv[CALL_MAX_ARGS];
    uint8_t bytes[1200];
} call;

/* Polls one request into *out (copied); 0 when none is left. */
int poll_call(lh_client *c, call *out);
/* Whether two calls carry the same arguments, byte for byte (never read, only compared). */
int same_args(const call *a, const call *b);

#define MAX_PEERS 4
#define MAX_EVENTS 64
#define MAX_HELD 16

enum { PEER_ANSWER, PEER_HANG };

/* One client of the service: its handle, connection, how its calls are treated, and the
 * events it polled (in order). */
typedef struct peer {
    lh_client *c;
    uint64_t conn;
    int mode;           /* PEER_ANSWER: every call runs at once; PEER_HANG: calls are held */
    size_t nevents;
    lh_event events[MAX_EVENTS];
    size_t nheld;       /* PEER_HANG: the calls polled and not answered */
    call held[MAX_HELD];
    uint64_t calls;     /* calls run on the service */
} peer;

typedef struct world {
    lh_memory_service *svc;
    size_t n;
    peer p[MAX_PEERS];
} world;

/* A service with `n` connected clients (client 0 on SEED, the others on their own seeds),
 * each with `cfg` (NULL: the defaults). */
void world_init(world *w, size_t n, const lh_config *cfg);
void world_free(world *w);

/* Polls every event of peer i into its log. */
void drain_events(world *w, size_t i);
/* Runs call `q` of peer i on the service at `now` and answers it (values, or failed when
 * the service dropped it); then delivers every queued release notification. */
void run_call(world *w, size_t i, const call *q, uint64_t now);
/* Runs every peer's pending requests (or holds them, PEER_HANG) and notifications, draining
 * events, until nothing moves. */
void pump(world *w, uint64_t now);
/* Feeds every peer's deadlines up to `to`, pumping after each; *now ends at `to`. */
void advance(world *w, uint64_t *now, uint64_t to);
/* Advances deadline by deadline (at most until `limit`) until peer i logged an event of
 * `kind`; copies it to *out. Returns 1 when found. */
int advance_until(world *w, size_t i, uint64_t *now, uint64_t limit, uint32_t kind, lh_event *out);
/* Replaces peer i's fault switches (LH_MEMORY_* flags). */
void set_faults(world *w, size_t i, uint32_t flags);

/* The first / last logged event of `kind` for `lease` (0: any lease), or NULL. */
const lh_event *find_event(const peer *p, uint32_t kind, uint64_t lease);
size_t count_events(const peer *p, uint32_t kind, uint64_t lease);
void clear_events(peer *p);

/* Acquires NAME on peer i at `now` with `ttl_ms`, pumps, expects ACQUIRED; the lease id. */
uint64_t acquire_granted(world *w, size_t i, uint64_t now, uint64_t ttl_ms);

/* What the service says about NAME. */
lh_memory_status service_status(world *w, uint64_t now);

/* Runs the test groups (test_leasehold.c, test_lifecycle.c). */
void abi_tests(void);
void lifecycle_tests(void);

#endif
