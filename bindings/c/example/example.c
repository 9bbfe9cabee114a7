/*
 * example.c -- a complete leasehold host in plain C: the reference run loop.
 *
 * Two clients ("alice" and "bob", think two processes) share one in-process lock service (the
 * core's reference service, lh_memory_service_*, one connection per client). Alice acquires "orders" with a 300 ms TTL and holds it for about
 * 1 s, so the core renews it across several TTLs; bob asks for the same lock with a 3 s wait
 * budget, is told it is held, watches the name, and is woken by alice's release. Both
 * release and the program drains the cleanup releases before exiting.
 *
 * The loop is the one documented at the top of leasehold.h:
 *   wait until the earliest of (core deadline, completed command, application call,
 *   release notification) -> feed that one input with now = CLOCK_MONOTONIC ns ->
 *   drain lh_poll_output completely: commands go to the service asynchronously (here: a
 *   queue of in-flight requests with simulated latency, so the loop never blocks on the
 *   "network"), events complete application calls.
 *
 * Exit status: 0 when every lh_* call returned what the loop expected, 1 otherwise.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "leasehold.h"

#define MS 1000000ull
#define LATENCY_NS (2 * MS)       /* one-way "network" delay to the service */
#define NAME_MAX_LEN 64
#define MAX_INFLIGHT 64
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

/* ---- one host: a core handle plus the application's view of its lease ---------------- */

typedef struct host {
    const char *label;
    lh_client *c;
    uint64_t lease;        /* current lease id, 0 = none */
    int held;              /* ACQUIRED seen and no terminal event yet */
    int done;              /* the application part of the scenario has finished */
    uint64_t release_at;   /* application call scheduled: release at this time (0 = none) */
    uint64_t conn;         /* its connection to the service (watches live there) */
    uint64_t renewals;     /* RENEW commands seen */
} host;

/* ---- in-flight requests: the asynchronous side of the loop ---------------------------- */

enum { REQ_ACQUIRE, REQ_RENEW, REQ_RELEASE, NOTIFY_RELEASED };

typedef struct inflight {
    int used;
    uint64_t due;          /* when the answer (or notification) arrives */
    host *h;
    int kind;
    uint64_t request_id;
    uint8_t name[NAME_MAX_LEN];
    size_t name_len;
    uint8_t token[32];
    uint64_t ttl_ms;
} inflight;

static inflight queue[MAX_INFLIGHT];
static lh_memory_service *service;
static host hosts[2];

static void die(host *h, const char *what, lh_status st) {
    fprintf(stderr, "%s: %s failed: %s (%s)\n", h ? h->label : "-", what, lh_status_str(st),
            h ? lh_client_last_error(h->c) : "");
    exit(1);
}

#define CHECK(h, call)                      \
    do {                                    \
        lh_status st_ = (call);             \
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
#include <stdarg.h>
static void say(host *h, const char *fmt, ...) {
    va_list ap;
    printf("[%7.1f ms] %-5s ", (double)(now_ns() - t0) / 1e6, h->label);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
}

static inflight *enqueue(host *h, int kind, uint64_t due, const lh_output *o) {
    for (size_t i = 0; i < MAX_INFLIGHT; i++) {
        inflight *q = &queue[i];
        if (q->used) continue;
        memset(q, 0, sizeof *q);
        q->used = 1;
        q->due = due;
        q->h = h;
        q->kind = kind;
        if (o != NULL) {
            /* Copy everything we keep: o's pointers are only valid until the next lh_* call. */
            q->request_id = o->request_id;
            q->ttl_ms = o->ttl_ms;
            q->name_len = o->name_len < NAME_MAX_LEN ? o->name_len : NAME_MAX_LEN;
            memcpy(q->name, o->name, q->name_len);
            if (o->token_len == 32) memcpy(q->token, o->token, 32);
        }
        return q;
    }
    fprintf(stderr, "in-flight queue full\n");
    exit(1);
}

/* Drain every output after an input. Commands become in-flight requests; events update the
 * application's view. */
static void drain(host *h, uint64_t now) {
    for (;;) {
        lh_output o;
        CHECK(h, lh_poll_output(h->c, &o));
        switch (o.kind) {
        case LH_OUTPUT_NONE:
            return;
        case LH_OUTPUT_ACQUIRE:
            say(h, "-> ACQUIRE  req=%" PRIu64 " name=%.*s token=%.8s... ttl=%" PRIu64 " ms",
                o.request_id, (int)o.name_len, (const char *)o.name, (const char *)o.token, o.ttl_ms);
            enqueue(h, REQ_ACQUIRE, now + LATENCY_NS, &o);
            break;
        case LH_OUTPUT_RENEW:
            h->renewals++;
            say(h, "-> RENEW    req=%" PRIu64 " ttl=%" PRIu64 " ms", o.request_id, o.ttl_ms);
            enqueue(h, REQ_RENEW, now + LATENCY_NS, &o);
            break;
        case LH_OUTPUT_RELEASE:
            say(h, "-> RELEASE  req=%" PRIu64, o.request_id);
            enqueue(h, REQ_RELEASE, now + LATENCY_NS, &o);
            break;
        case LH_OUTPUT_WATCH:
            say(h, "-> WATCH    %.*s", (int)o.name_len, (const char *)o.name);
            SVC_CHECK(lh_memory_service_watch(service, h->conn, o.name, o.name_len));
            break;
        case LH_OUTPUT_UNWATCH:
            say(h, "-> UNWATCH  %.*s", (int)o.name_len, (const char *)o.name);
            SVC_CHECK(lh_memory_service_unwatch(service, h->conn, o.name, o.name_len));
            break;
        case LH_OUTPUT_ACQUIRED: {
            uint64_t left = o.valid_until_ns > now ? o.valid_until_ns - now : 0;
            say(h, "<= ACQUIRED lease=%" PRIu64 " fencing_token=%" PRIu64 " valid for %.1f ms",
                o.lease_id, o.fencing_token, (double)left / 1e6);
            h->held = 1;
            /* Application: alice holds for ~3.3 TTLs, bob for a short critical section. */
            h->release_at = now + (h == &hosts[0] ? 1000 * MS : 200 * MS);
            break;
        }
        case LH_OUTPUT_ACQUIRE_FAILED:
            say(h, "<= ACQUIRE_FAILED lease=%" PRIu64 " reason=%u", o.lease_id, o.reason);
            h->held = 0;
            h->done = 1;
            break;
        case LH_OUTPUT_LOST:
            say(h, "<= LOST     lease=%" PRIu64 " reason=%u (stop writing; fencing protects the data)",
                o.lease_id, o.reason);
            h->held = 0;
            h->release_at = 0;
            h->done = 1;
            break;
        case LH_OUTPUT_RELEASED:
            say(h, "<= RELEASED lease=%" PRIu64, o.lease_id);
            h->held = 0;
            h->done = 1;
            break;
        case LH_OUTPUT_RENEWED: { /* answers the application's lh_renew */
            uint64_t left = o.valid_until_ns > now ? o.valid_until_ns - now : 0;
            say(h, "<= RENEWED  lease=%" PRIu64 " (manual renew) valid for %.1f ms", o.lease_id,
                (double)left / 1e6);
            break;
        }
        case LH_OUTPUT_RELEASE_OUTCOME: /* the service's answer to lh_release_reported */
            say(h, "<= RELEASE_OUTCOME lease=%" PRIu64 " %s", o.lease_id,
                o.reason == LH_REASON_RELEASE_CONFIRMED   ? "confirmed"
                : o.reason == LH_REASON_RELEASE_NOT_OWNER ? "not owner (the lock was no longer ours)"
                                                          : "unconfirmed (the grant has run out)");
            break;
        default:
            say(h, "unknown output kind %u", o.kind);
            exit(1);
        }
    }
}

/* The service answers one in-flight request: execute it and feed the result to the core. */
static void complete(inflight *q, uint64_t now) {
    host *h = q->h;
    lh_memory_result r;
    r.struct_size = sizeof r;
    switch (q->kind) {
    case REQ_ACQUIRE:
        SVC_CHECK(lh_memory_service_acquire(service, h->conn, now, q->name, q->name_len, q->token, 32,
                                            q->ttl_ms, &r));
        if (r.outcome == LH_MEMORY_GRANTED)
            say(h, "<- granted  req=%" PRIu64 " fence=%" PRIu64, q->request_id, r.fencing_token);
        else
            say(h, "<- held by other req=%" PRIu64 " (retry after %" PRIu64 " ms)", q->request_id,
                r.retry_after_ms);
        CHECK(h, lh_acquire_result(h->c, now, q->request_id, r.engine_outcome, r.fencing_token, r.ttl_ms,
                                   r.retry_after_ms, NULL, 0));
        break;
    case REQ_RENEW:
        SVC_CHECK(lh_memory_service_renew(service, h->conn, now, q->name, q->name_len, q->token, 32,
                                          q->ttl_ms, &r));
        say(h, "<- %s req=%" PRIu64, r.outcome == LH_MEMORY_RENEWED ? "renewed " : "rejected", q->request_id);
        CHECK(h, lh_renew_result(h->c, now, q->request_id, r.engine_outcome));
        break;
    case REQ_RELEASE:
        SVC_CHECK(lh_memory_service_release(service, h->conn, now, q->name, q->name_len, q->token, 32, &r));
        say(h, "<- %s req=%" PRIu64, r.outcome == LH_MEMORY_RELEASED ? "released" : "not owner", q->request_id);
        CHECK(h, lh_release_result(h->c, now, q->request_id, r.engine_outcome));
        break;
    case NOTIFY_RELEASED:
        say(h, "<- notification: %.*s released", (int)q->name_len, (const char *)q->name);
        CHECK(h, lh_released(h->c, now, q->name, q->name_len));
        break;
    }
    q->used = 0;
    drain(h, now);
    /* The service queued a notification for every connection watching a released name (the
     * releaser's included): deliver each one hop later. */
    for (size_t i = 0; i < 2; i++) {
        for (;;) {
            const uint8_t *name;
            size_t len;
            SVC_CHECK(lh_memory_service_poll_released(service, hosts[i].conn, &name, &len));
            if (name == NULL) break;
            inflight *n = enqueue(&hosts[i], NOTIFY_RELEASED, now + LATENCY_NS, NULL);
            n->name_len = len < NAME_MAX_LEN ? len : NAME_MAX_LEN;
            memcpy(n->name, name, n->name_len);
        }
    }
}

static int finished(void) {
    for (size_t i = 0; i < 2; i++) {
        lh_counters k;
        k.struct_size = sizeof k;
        CHECK(&hosts[i], lh_counters_get(hosts[i].c, &k));
        if (!hosts[i].done || k.pending_cleanups != 0) return 0;
    }
    for (size_t i = 0; i < MAX_INFLIGHT; i++)
        if (queue[i].used) return 0;
    return 1;
}

static void start(host *h, const char *label, uint8_t seed_byte) {
    lh_config cfg;
    uint8_t seed[32];
    /* A real host seeds from the OS (getrandom); fixed bytes keep the example reproducible. */
    memset(seed, seed_byte, sizeof seed);
    lh_config_default(&cfg);
    memset(h, 0, sizeof *h);
    h->label = label;
    lh_status st = lh_client_new(&cfg, seed, sizeof seed, &h->c);
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
            fprintf(stderr, "nothing to wait for but not finished\n");
            return 1;
        }
        if (wake > t0 + RUN_LIMIT_NS) {
            fprintf(stderr, "scenario did not finish in time\n");
            return 1;
        }
        sleep_until(wake);

        /* 2. Feed every input that is due, one at a time, draining after each. */
        uint64_t now = now_ns();
        for (size_t i = 0; i < MAX_INFLIGHT; i++)
            if (queue[i].used && queue[i].due <= now) complete(&queue[i], now_ns());
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
                say(h, "app: release(lease=%" PRIu64 ") after %" PRIu64 " renewals", h->lease, h->renewals);
                uint32_t releasing = 0;
                lh_status st = lh_release_reported(h->c, now_ns(), h->lease, &releasing);
                if (st != LH_OK && st != LH_ERR_LEASE_ENDED) die(h, "lh_release_reported", st);
                if (st == LH_OK && releasing == LH_RELEASING_LOST)
                    say(h, "app: the lease had run out before the release: it ended lost");
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

    for (size_t i = 0; i < 2; i++) {
        lh_counters k;
        k.struct_size = sizeof k;
        CHECK(&hosts[i], lh_counters_get(hosts[i].c, &k));
        printf("%-5s counters: acquires_sent=%" PRIu64 " grants=%" PRIu64 " renewals_sent=%" PRIu64
               " renewals_ok=%" PRIu64 " releases_sent=%" PRIu64 " lost=%" PRIu64 " stale=%" PRIu64 "\n",
               hosts[i].label, k.acquires_sent, k.grants, k.renewals_sent, k.renewals_ok, k.releases_sent,
               k.lost_rejected + k.lost_expired + k.lost_fail_budget, k.stale_results);
        lh_client_free(hosts[i].c);
    }
    lh_memory_stats ms;
    ms.struct_size = sizeof ms;
    SVC_CHECK(lh_memory_service_stats_get(service, &ms));
    printf("service: grants=%" PRIu64 " renewals=%" PRIu64 " releases=%" PRIu64 " rejections=%" PRIu64 "\n",
           ms.grants, ms.renewals, ms.releases, ms.renewals_rejected);
    lh_memory_service_free(service);
    return 0;
}
