/*
 * bench_ffi.c -- cost of the C ABI: ns per renew cycle driven through lh_* from C, on the
 * memory backend with the in-process service answering.
 *
 * One renew cycle = lh_poll_timeout -> lh_timeout(deadline), repeated until a renewal is due,
 * then lh_io_poll (the RENEW call) -> lh_memory_service_call -> lh_io_reply -> lh_io_poll
 * (none) -> lh_poll_event (none).
 * Virtual time, so only CPU cost is measured: the seam's flattening both ways, the memory
 * protocol, the service and the engine.
 *
 *   usage: bench_ffi [cycles]     (default 200000 per run; 11 runs; prints min and median)
 * The machine is shared, so the minimum is the least noisy estimate of the cost.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "leasehold.h"

#define MS 1000000ull
#define RUNS 11

static uint64_t wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void check(lh_status st, const char *what) {
    if (st != LH_OK) {
        fprintf(stderr, "%s: %s\n", what, lh_status_str(st));
        exit(1);
    }
}

/* Runs the one pending call on the service and answers it; 0 when there was none. */
static int serve_one(lh_client *c, lh_memory_service *svc, uint64_t conn, uint64_t now) {
    lh_io_request q;
    check(lh_io_poll(c, &q), "lh_io_poll");
    if (q.kind == LH_IO_NONE) return 0;
    if (q.kind != LH_IO_COMMAND) {
        fprintf(stderr, "unexpected request kind %u\n", q.kind);
        exit(1);
    }
    lh_memory_answer a = {.struct_size = sizeof a};
    check(lh_memory_service_call(svc, conn, now, q.argv, q.argc, &a), "lh_memory_service_call");
    if (a.dropped) {
        fprintf(stderr, "the service dropped a call\n");
        exit(1);
    }
    check(lh_io_reply(c, now, q.id, a.values, a.nvalues, a.data, a.data_len), "lh_io_reply");
    return 1;
}

/* Returns the number of renew cycles completed; *now advances in virtual time. */
static uint64_t run(lh_client *c, lh_memory_service *svc, uint64_t conn, uint64_t *now, uint64_t cycles) {
    lh_event ev;
    lh_counters k = {.struct_size = sizeof k};
    check(lh_counters_get(c, &k), "lh_counters_get");
    uint64_t start = k.renewals_ok, renewed = 0;
    while (renewed < cycles) {
        uint64_t deadline;
        check(lh_poll_timeout(c, &deadline), "lh_poll_timeout");
        if (deadline == LH_NO_DEADLINE) {
            fprintf(stderr, "no deadline while holding a lease\n");
            exit(1);
        }
        if (deadline > *now) *now = deadline;
        check(lh_timeout(c, *now), "lh_timeout");
        while (serve_one(c, svc, conn, *now + 1)) renewed++;
        check(lh_poll_event(c, &ev), "lh_poll_event");
        if (ev.kind != LH_EVENT_NONE) {
            fprintf(stderr, "unexpected event %u\n", ev.kind);
            exit(1);
        }
    }
    check(lh_counters_get(c, &k), "lh_counters_get");
    if (k.renewals_ok - start != renewed) {
        fprintf(stderr, "%llu renewals confirmed for %llu calls\n", (unsigned long long)(k.renewals_ok - start),
                (unsigned long long)renewed);
        exit(1);
    }
    return renewed;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    uint64_t cycles = argc > 1 ? strtoull(argv[1], NULL, 10) : 200000;
    if (cycles == 0) cycles = 1;
    uint8_t seed[32];
    lh_config cfg;
    lh_backend_options backend;
    lh_memory_config mcfg;
    lh_acquire_options opts;
    lh_memory_service *svc;
    lh_client *c;
    uint64_t lease, conn, now = 0;
    lh_event ev;
    memset(seed, 7, sizeof seed);
    lh_config_default(&cfg);
    lh_memory_config_default(&mcfg);
    check(lh_memory_service_new(&mcfg, &svc), "lh_memory_service_new");
    check(lh_memory_service_connect(svc, &conn), "lh_memory_service_connect");
    check(lh_backend_options_default(LH_BACKEND_MEMORY, &backend), "lh_backend_options_default");
    check(lh_client_new(&cfg, &backend, seed, sizeof seed, &c), "lh_client_new");
    lh_acquire_options_default(&opts);
    opts.ttl_ms = 60000;
    check(lh_acquire(c, now, (const uint8_t *)"bench", 5, &opts, &lease), "lh_acquire");
    if (!serve_one(c, svc, conn, now + 1)) return 1;
    check(lh_poll_event(c, &ev), "lh_poll_event");
    if (ev.kind != LH_EVENT_ACQUIRED) return 1;

    run(c, svc, conn, &now, cycles / 10 + 1); /* warm up */
    double ns[RUNS];
    for (int r = 0; r < RUNS; r++) {
        uint64_t t = wall_ns();
        uint64_t n = run(c, svc, conn, &now, cycles);
        ns[r] = (double)(wall_ns() - t) / (double)n;
    }
    qsort(ns, RUNS, sizeof ns[0], cmp);
    printf("c    -> lh_* renew cycle (memory service): min %6.1f ns  median %6.1f ns  (%d runs x %llu cycles)\n",
           ns[0], ns[RUNS / 2], RUNS, (unsigned long long)cycles);
    lh_client_free(c);
    lh_memory_service_free(svc);
    return 0;
}
