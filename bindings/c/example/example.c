/*
 * example.c -- a complete leasehold host in plain C: the reference run loop.
 *
 * Two clients ("alice" and "bob", think two processes) share one in-process lock service (the
 * core's reference service, lh_memory_service_*, one connection per client). Alice acquires
 * "orders" with a 300 ms TTL and holds it for about 1 s, so the core renews it across several
 * TTLs (and once by hand, lh_renew); bob asks for the same lock with a 3 s wait budget, is told
 * it is held, and is woken by the service's release notification when alice lets go. Both
 * release with a reported outcome, close, and the program drains the cleanups before exiting.
 *
 * The loop is the one documented at the top of leasehold.h, the same for every backend:
 *   wait until the earliest of (core deadline, an answer, a notification, an application
 *   call) -> feed exactly that one input with now = CLOCK_MONOTONIC ns -> drain lh_io_poll
 *   completely, handing each request to the executor of its kind (here the memory executor:
 *   LH_IO_COMMAND -> lh_memory_service_call, asynchronously, through a queue of in-flight
 *   calls with a simulated network delay, so the loop never blocks) -> drain lh_poll_event
 *   completely, completing application calls. The host never reads a request's arguments or
 *   an answer's values: it carries them between the handle and the service.
 *
 * Exit status: 0 when every lh_* call returned what the loop expected, 1 otherwise.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "leasehold.h"

#define MS 1000000ull
#define LATENCY_NS (2 * MS)       /* one-way "network" delay to the service */
#define MAX_INFLIGHT 64
#define MAX_ARGS 8                /* arguments of one call the executor can carry */
#define ARG_BYTES 1024            /* their bytes */
#define RUN_LIMIT_NS (15000 * MS) /* give up (exit 1) if the scenario has not finished */

static uint64_t t0;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t deadline) {
    uint64_t now = now_ns();
    if (deadline <= now) return;
    uint64_t d = deadline - now;
    struct timespec ts = {(time_t)(d / 1000000000ull), (long)(d % 1000000000ull)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

/* ---- one host: a client handle plus the application's view of its lease ------------------- */

typedef struct host {
    const char *label;
    lh_client *c;
    uint64_t conn;         /* its connection to the service (watches and notifications live there) */
    uint64_t lease;        /* current lease id, 0 = none */
    uint64_t fence;        /* fencing token of its grant, 0 = none */
    int held;              /* ACQUIRED seen and no terminal event yet */
    int done;              /* the application part of the scenario has finished */
    int closed;            /* lh_io_close called */
    uint64_t release_at;   /* application call scheduled: release at this time (0 = none) */
} host;

/* ---- in-flight work: the asynchronous side of the loop --------------------------------------- */

enum { CALL, NOTIFICATION };

/* A call on its way to the service (a copy of the request: its pointers borrow the handle
 * only until the next call on it), or a release notification on its way to a client. */
typedef struct inflight {
    int used;
    int kind;
    uint64_t due;          /* when it arrives */
    host *h;
    uint64_t id;           /* CALL: the request id to answer */
    uint32_t argc;         /* CALL: argv; NOTIFICATION: argv[0] is the channel */
    lh_bytes argv[MAX_ARGS];
    uint8_t bytes[ARG_BYTES];
} inflight;

static inflight queue[MAX_INFLIGHT];
static lh_memory_service *service;
static host hosts[2];

static void die(host *h, const char *what, lh_status st) {
    fprintf(stderr, "%s: %s failed: %s (%s)\n", h ? h->label : "-", what, lh_status_str(st),
            h ? lh_client_last_error(h->c) : "");
    exit(1);
}

#define CHECK(h, call)                          \
    do {                                        \
        lh_status st_ = (call);                 \
        if (st_ != LH_OK) die((h), #call, st_); \
    } while (0)

#define SVC_CHECK(call)                                                                     \
    do {                                                                                    \
        lh_status st_ = (call);                                                             \
        if (st_ != LH_OK) {                                                                 \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, lh_status_str(st_),              \
                    lh_memory_service_last_error(service));                                 \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

static void say(host *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(host *h, const char *fmt, ...) {
    va_list ap;
    printf("[%7.1f ms] %-5s ", (double)(now_ns() - t0) / 1e6, h->label);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
}

/* Queues a copy of `argc` byte strings; NULL when they do not fit. */
static inflight *enqueue(host *h, int kind, uint64_t due, uint64_t id, const lh_bytes *argv, uint32_t argc) {
    if (argc > MAX_ARGS) return NULL;
    size_t total = 0;
    for (uint32_t i = 0; i < argc; i++) total += argv[i].len;
    if (total > ARG_BYTES) return NULL;
    for (size_t i = 0; i < MAX_INFLIGHT; i++) {
        inflight *q = &queue[i];
        if (q->used) continue;
        q->used = 1;
        q->kind = kind;
        q->due = due;
        q->h = h;
        q->id = id;
        q->argc = argc;
        size_t at = 0;
        for (uint32_t a = 0; a < argc; a++) {
            if (argv[a].len) memcpy(q->bytes + at, argv[a].ptr, argv[a].len);
            q->argv[a].ptr = argv[a].len ? q->bytes + at : NULL;
            q->argv[a].len = argv[a].len;
            at += argv[a].len;
        }
        return q;
    }
    return NULL;
}

/* The memory executor: an LH_IO_COMMAND request goes to the service, one hop later. The
 * arguments are printed as they are, never interpreted. */
static void memory_execute(host *h, const lh_io_request *q, uint64_t now) {
    char line[200];
    int n = 0;
    for (uint32_t i = 0; i < q->argc && n < (int)sizeof line - 1; i++)
        n += snprintf(line + n, sizeof line - (size_t)n, " %.*s", (int)q->argv[i].len, (const char *)q->argv[i].ptr);
    say(h, "-> call %" PRIu64 ":%s", q->id, line);
    if (enqueue(h, CALL, now + LATENCY_NS, q->id, q->argv, q->argc) == NULL) {
        static const char why[] = "the executor cannot carry this call";
        CHECK(h, lh_io_failed(h->c, now, q->id, LH_FAILURE_TRANSPORT, (const uint8_t *)why, sizeof why - 1));
    }
}

/* After every input: drain the requests, each to the executor of its kind, then the events. */
static void drain(host *h, uint64_t now) {
    for (;;) {
        lh_io_request q;
        CHECK(h, lh_io_poll(h->c, &q));
        if (q.kind == LH_IO_NONE) break;
        switch (q.kind) {
        case LH_IO_COMMAND:
            memory_execute(h, &q, now);
            break;
        default: { /* SQL and HTTP need their executors (bindings/c/sqlite, ...) */
            static const char why[] = "this host has no executor for the request's kind";
            CHECK(h, lh_io_failed(h->c, now, q.id, LH_FAILURE_TRANSPORT, (const uint8_t *)why, sizeof why - 1));
        }
        }
    }
    for (;;) {
        lh_event ev;
        CHECK(h, lh_poll_event(h->c, &ev));
        if (ev.kind == LH_EVENT_NONE) break;
        uint64_t left = ev.valid_until_ns > now ? ev.valid_until_ns - now : 0;
        switch (ev.kind) {
        case LH_EVENT_ACQUIRED:
            say(h, "<= ACQUIRED lease=%" PRIu64 " fencing_token=%" PRIu64 " valid for %.1f ms", ev.lease_id,
                ev.fencing_token, (double)left / 1e6);
            h->held = 1;
            h->fence = ev.fencing_token;
            /* Application: alice holds for ~3.3 TTLs, bob for a short critical section. */
            h->release_at = now + (h == &hosts[0] ? 1000 * MS : 200 * MS);
            break;
        case LH_EVENT_ACQUIRE_FAILED:
            say(h, "<= ACQUIRE_FAILED lease=%" PRIu64 " reason=%u", ev.lease_id, ev.reason);
            h->held = 0;
            h->done = 1;
            break;
        case LH_EVENT_LOST:
            say(h, "<= LOST     lease=%" PRIu64 " reason=%u (stop writing; fencing protects the data)", ev.lease_id,
                ev.reason);
            h->held = 0;
            h->release_at = 0;
            h->done = 1;
            break;
        case LH_EVENT_RELEASED:
            say(h, "<= RELEASED lease=%" PRIu64, ev.lease_id);
            h->held = 0;
            h->done = 1;
            break;
        case LH_EVENT_RENEWED: /* answers the application's lh_renew */
            say(h, "<= RENEWED  lease=%" PRIu64 " (manual renew) valid for %.1f ms", ev.lease_id, (double)left / 1e6);
            break;
        case LH_EVENT_RELEASE_OUTCOME: /* the service's answer to a reported release */
            say(h, "<= RELEASE_OUTCOME lease=%" PRIu64 " %s", ev.lease_id,
                ev.reason == LH_REASON_RELEASE_CONFIRMED   ? "confirmed"
                : ev.reason == LH_REASON_RELEASE_NOT_OWNER ? "not owner (the lock was no longer ours)"
                                                           : "unconfirmed (the grant has run out)");
            break;
        default:
            say(h, "unknown event kind %u", ev.kind);
            exit(1);
        }
    }
}

/* One in-flight item arrives: a call reaches the service and its answer goes straight back
 * (the answer borrows the service until its next call), or a notification reaches a client. */
static void arrive(inflight *q, uint64_t now) {
    host *h = q->h;
    if (q->kind == CALL) {
        lh_memory_answer a;
        memset(&a, 0, sizeof a);
        a.struct_size = sizeof a;
        SVC_CHECK(lh_memory_service_call(service, h->conn, now, q->argv, q->argc, &a));
        if (a.dropped) {
            static const char why[] = "the service dropped the call";
            say(h, "<- call %" PRIu64 " dropped", q->id);
            CHECK(h, lh_io_failed(h->c, now, q->id, LH_FAILURE_TRANSPORT, (const uint8_t *)why, sizeof why - 1));
        } else {
            say(h, "<- answer to call %" PRIu64 " (%zu values)", q->id, a.nvalues);
            CHECK(h, lh_io_reply(h->c, now, q->id, a.values, a.nvalues, a.data, a.data_len));
        }
    } else {
        say(h, "<- notification on %.*s", (int)q->argv[0].len, (const char *)q->argv[0].ptr);
        CHECK(h, lh_io_message(h->c, now, q->argv[0].ptr, q->argv[0].len, NULL, 0));
    }
    q->used = 0;
    drain(h, now);
    /* The service queued a release notification for every connection watching a released
     * name: each travels one hop to its client, like an answer. */
    for (size_t i = 0; i < 2; i++) {
        for (;;) {
            lh_bytes name;
            SVC_CHECK(lh_memory_service_poll_released(service, hosts[i].conn, &name.ptr, &name.len));
            if (name.ptr == NULL) break;
            if (enqueue(&hosts[i], NOTIFICATION, now + LATENCY_NS, 0, &name, 1) == NULL) {
                fprintf(stderr, "in-flight queue full\n");
                exit(1);
            }
        }
    }
}

static int finished(void) {
    for (size_t i = 0; i < 2; i++) {
        lh_counters k;
        k.struct_size = sizeof k;
        CHECK(&hosts[i], lh_counters_get(hosts[i].c, &k));
        if (!hosts[i].closed || k.pending_cleanups != 0) return 0;
    }
    for (size_t i = 0; i < MAX_INFLIGHT; i++)
        if (queue[i].used) return 0;
    return 1;
}

static void start(host *h, const char *label, uint8_t seed_byte) {
    lh_config cfg;
    lh_backend_options backend;
    uint8_t seed[32];
    /* A real host seeds from the OS (getrandom); fixed bytes keep the example reproducible. */
    memset(seed, seed_byte, sizeof seed);
    lh_config_default(&cfg);
    memset(h, 0, sizeof *h);
    h->label = label;
    lh_status st = lh_backend_options_default(LH_BACKEND_MEMORY, &backend);
    if (st == LH_OK) st = lh_client_new(&cfg, &backend, seed, sizeof seed, &h->c);
    if (st != LH_OK) die(NULL, "lh_client_new", st);
    SVC_CHECK(lh_memory_service_connect(service, &h->conn));
}

static void app_acquire(host *h, uint64_t now, uint64_t ttl_ms, uint64_t wait_ms) {
    lh_acquire_options opts;
    lh_acquire_options_default(&opts);
    opts.ttl_ms = ttl_ms;
    opts.wait_ns = wait_ms * MS;
    say(h, "app: acquire(\"orders\", ttl=%" PRIu64 " ms, wait=%" PRIu64 " ms)", ttl_ms, wait_ms);
    CHECK(h, lh_acquire(h->c, now, (const uint8_t *)"orders", 6, &opts, &h->lease));
    drain(h, now);
}

int main(void) {
    printf("leasehold %s (ABI %u), header %s\n", lh_version(), lh_abi_version(), LH_VERSION);
    if (lh_abi_version() != LH_ABI_VERSION) {
        fprintf(stderr, "ABI mismatch: library %u, header %u\n", lh_abi_version(), LH_ABI_VERSION);
        return 1;
    }
    t0 = now_ns();
    lh_memory_config mcfg;
    lh_memory_config_default(&mcfg);
    if (lh_memory_service_new(&mcfg, &service) != LH_OK) {
        fprintf(stderr, "lh_memory_service_new failed\n");
        return 1;
    }
    start(&hosts[0], "alice", 0xa1);
    start(&hosts[1], "bob", 0xb0);

    app_acquire(&hosts[0], now_ns(), 300, 0);
    uint64_t bob_starts = t0 + 50 * MS;
    int bob_started = 0;

    while (!finished()) {
        /* 1. The earliest of every source of input. */
        uint64_t wake = UINT64_MAX;
        for (size_t i = 0; i < 2; i++) {
            uint64_t d;
            CHECK(&hosts[i], lh_poll_timeout(hosts[i].c, &d));
            if (d < wake) wake = d;
            if (hosts[i].release_at && hosts[i].release_at < wake) wake = hosts[i].release_at;
        }
        for (size_t i = 0; i < MAX_INFLIGHT; i++)
            if (queue[i].used && queue[i].due < wake) wake = queue[i].due;
        if (!bob_started && bob_starts < wake) wake = bob_starts;
        if (wake == UINT64_MAX) {
            if (!(hosts[0].done && !hosts[0].closed) && !(hosts[1].done && !hosts[1].closed)) {
                fprintf(stderr, "nothing to wait for but not finished\n");
                return 1;
            }
            wake = now_ns(); /* only a closing is left: do it now */
        }
        if (wake > t0 + RUN_LIMIT_NS) {
            fprintf(stderr, "scenario did not finish in time\n");
            return 1;
        }
        sleep_until(wake);

        /* 2. Feed every input that is due, one at a time, draining after each. */
        uint64_t now = now_ns();
        for (size_t i = 0; i < MAX_INFLIGHT; i++)
            if (queue[i].used && queue[i].due <= now) arrive(&queue[i], now_ns());
        if (!bob_started && bob_starts <= now) {
            bob_started = 1;
            app_acquire(&hosts[1], now_ns(), 300, 3000);
            if (hosts[0].held) { /* the manual escape hatch: renew now, whatever the cadence */
                say(&hosts[0], "app: renew(lease=%" PRIu64 ")", hosts[0].lease);
                CHECK(&hosts[0], lh_renew(hosts[0].c, now_ns(), hosts[0].lease));
                drain(&hosts[0], now_ns());
            }
        }
        for (size_t i = 0; i < 2; i++) {
            host *h = &hosts[i];
            if (h->release_at && h->release_at <= now) {
                h->release_at = 0;
                say(h, "app: release(lease=%" PRIu64 ")", h->lease);
                uint32_t releasing = 0;
                lh_status st = lh_release(h->c, now_ns(), h->lease, &releasing);
                if (st != LH_OK && st != LH_ERR_LEASE_ENDED) die(h, "lh_release", st);
                if (st == LH_OK && releasing == LH_RELEASING_LOST)
                    say(h, "app: the lease had run out before the release: it ended lost");
                drain(h, now_ns());
            }
            if (h->done && !h->closed) { /* closing: give back what the backend holds for us */
                h->closed = 1;
                CHECK(h, lh_io_close(h->c, now_ns()));
                drain(h, now_ns());
            }
            uint64_t d;
            CHECK(h, lh_poll_timeout(h->c, &d));
            if (d <= now_ns()) {
                CHECK(h, lh_timeout(h->c, now_ns()));
                drain(h, now_ns());
            }
        }
    }

    int ok = 1;
    for (size_t i = 0; i < 2; i++) {
        lh_counters k;
        k.struct_size = sizeof k;
        CHECK(&hosts[i], lh_counters_get(hosts[i].c, &k));
        /* Alice renewed across TTLs; bob was woken by her release and got the next fence. */
        if (i == 0) ok &= hosts[0].fence != 0 && k.renewals_ok >= 3;
        else ok &= hosts[1].fence > hosts[0].fence && k.backend_wakeups >= 1;
        printf("%-5s counters: acquires_sent=%" PRIu64 " grants=%" PRIu64 " renewals_sent=%" PRIu64
               " renewals_ok=%" PRIu64 " releases_sent=%" PRIu64 " lost=%" PRIu64 " requests=%" PRIu64
               " wakeups=%" PRIu64 " stale=%" PRIu64 "\n",
               hosts[i].label, k.acquires_sent, k.grants, k.renewals_sent, k.renewals_ok, k.releases_sent,
               k.lost_rejected + k.lost_expired + k.lost_fail_budget, k.backend_requests, k.backend_wakeups,
               k.backend_stale_replies);
        lh_client_free(hosts[i].c);
    }
    lh_memory_stats ms;
    ms.struct_size = sizeof ms;
    SVC_CHECK(lh_memory_service_stats_get(service, &ms));
    printf("service: grants=%" PRIu64 " renewals=%" PRIu64 " releases=%" PRIu64 " rejections=%" PRIu64
           " notifications=%" PRIu64 "\n",
           ms.grants, ms.renewals, ms.releases, ms.renewals_rejected, ms.notifications);
    lh_memory_service_free(service);
    if (!ok) fprintf(stderr, "the scenario did not go as expected\n");
    return ok ? 0 : 1;
}
