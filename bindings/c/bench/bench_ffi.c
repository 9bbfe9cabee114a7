/*
 * bench_ffi.c -- cost of the C ABI: ns per renew cycle driven through lh_* from C.
 *
 * One renew cycle = lh_poll_timeout -> lh_timeout(deadline) -> lh_poll_output (RENEW) ->
 * lh_poll_output (NONE) -> lh_renew_result(RENEWED) -> lh_poll_output (NONE).
 * benches/ffi_cycle.rs runs the identical sequence on the Rust Client directly (and through
 * lh_* from Rust); compare the numbers. Virtual time, so only CPU cost is measured.
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

/* Returns the number of renew cycles completed; *now advances in virtual time. */
static uint64_t run(lh_client *c, uint64_t *now, uint64_t cycles) {
    uint64_t renewed = 0;
    lh_output o;
    while (renewed < cycles) {
        uint64_t deadline;
        check(lh_poll_timeout(c, &deadline), "lh_poll_timeout");
        if (deadline == LH_NO_DEADLINE) {
            fprintf(stderr, "no deadline while holding a lease\n");
            exit(1);
        }
        if (deadline > *now) *now = deadline;
        check(lh_timeout(c, *now), "lh_timeout");
        for (;;) {
            check(lh_poll_output(c, &o), "lh_poll_output");
            if (o.kind == LH_OUTPUT_NONE) break;
            if (o.kind == LH_OUTPUT_RENEW) {
                uint64_t req = o.request_id;
                check(lh_poll_output(c, &o), "lh_poll_output");
                if (o.kind != LH_OUTPUT_NONE) { fprintf(stderr, "unexpected output %u\n", o.kind); exit(1); }
                check(lh_renew_result(c, *now + 1, req, LH_RENEW_RENEWED), "lh_renew_result");
                renewed++;
            } else {
                fprintf(stderr, "unexpected output %u\n", o.kind);
                exit(1);
            }
        }
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
    lh_acquire_options opts;
    lh_client *c;
    uint64_t lease, now = 0;
    lh_output o;
    memset(seed, 7, sizeof seed);
    lh_config_default(&cfg);
    check(lh_client_new(&cfg, seed, sizeof seed, &c), "lh_client_new");
    lh_acquire_options_default(&opts);
    opts.ttl_ms = 60000;
    check(lh_acquire(c, now, (const uint8_t *)"bench", 5, &opts, &lease), "lh_acquire");
    check(lh_poll_output(c, &o), "lh_poll_output");
    if (o.kind != LH_OUTPUT_ACQUIRE) return 1;
    check(lh_acquire_result(c, now + 1, o.request_id, LH_ACQUIRE_GRANTED, 1, 60000, LH_NO_RETRY_HINT, NULL, 0),
          "lh_acquire_result");
    do check(lh_poll_output(c, &o), "lh_poll_output"); while (o.kind != LH_OUTPUT_NONE);

    run(c, &now, cycles / 10 + 1); /* warm up */
    double ns[RUNS];
    for (int r = 0; r < RUNS; r++) {
        uint64_t t = wall_ns();
        uint64_t n = run(c, &now, cycles);
        ns[r] = (double)(wall_ns() - t) / (double)n;
    }
    qsort(ns, RUNS, sizeof ns[0], cmp);
    printf("c    -> lh_* renew cycle:   min %6.1f ns  median %6.1f ns  (%d runs x %llu cycles)\n", ns[0],
           ns[RUNS / 2], RUNS, (unsigned long long)cycles);
    lh_client_free(c);
    return 0;
}
