/*
 * Cross-language contention worker (C): see tests/crosslang/README.md.
 *
 *   crosslang_worker_c REDIS_URL NAME ROUNDS LOG TAG WORKERS [bytes]
 *
 * The C binding's byte host (bindings/c/redis/lh_stream.c) on a handle of kind
 * LH_BACKEND_REDIS_STREAM: the core owns the Redis wire, this program only runs its loop.
 * Always the byte path (C has no other Redis host that takes a URL); `bytes` is accepted so
 * that every worker takes the same arguments.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lh_stream.h"

#define MS 1000000ull

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static lh_client *client;
static lh_stream_host host;
/* The event the worker waits for: the lease it concerns, and what came. */
static uint64_t watched;
static lh_event seen;

static void die(const char *what, uint32_t st) {
    fprintf(stderr, "crosslang_worker_c: %s: %s (%s)\n", what, lh_status_str(st), host.last_error);
    exit(1);
}

/* One turn of the loop: IO for up to `ms`, then the events (a LOST of the held lease is fatal). */
static void step(int ms) {
    lh_stream_step(&host, ms, now_ns);
    if (host.last_status != LH_OK) die("the library refused an input", host.last_status);
    lh_event e;
    while (lh_poll_event(client, &e) == LH_OK && e.kind != LH_EVENT_NONE) {
        if (e.lease_id != watched) continue;
        if (e.kind == LH_EVENT_LOST) {
            fprintf(stderr, "crosslang_worker_c: lease lost (reason %u)\n", e.reason);
            exit(1);
        }
        if (e.kind == LH_EVENT_ACQUIRED || e.kind == LH_EVENT_ACQUIRE_FAILED || e.kind == LH_EVENT_RELEASE_OUTCOME)
            seen = e;
    }
}

/* Steps until the watched lease has an event of `kind` (or `fail`), for at most `secs`. */
static lh_event wait_for(uint32_t kind, uint32_t fail, int secs) {
    uint64_t until = now_ns() + (uint64_t)secs * 1000 * MS;
    while (seen.kind != kind && (fail == 0 || seen.kind != fail)) {
        if (now_ns() > until) {
            fprintf(stderr, "crosslang_worker_c: no event %u within %d s\n", kind, secs);
            exit(1);
        }
        step(5);
    }
    return seen;
}

static void append(int fd, const char *line) {
    size_t n = strlen(line);
    if (write(fd, line, n) != (ssize_t)n) { /* one write per line: O_APPEND keeps lines whole */
        perror("crosslang_worker_c: write");
        exit(1);
    }
}

/* The log's lines, scanned: how many of `kind`; whether others held the lock `turns` times since
 * our last exit (or every other worker is done). */
static int scan(const char *log, const char *kind, const char *tag, int workers, int turns) {
    FILE *f = fopen(log, "r");
    if (f == NULL) return 1;
    char line[256], k[16], who[64];
    int n = 0, done = 0, others = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "%15s %63s", k, who) != 2) continue;
        if (kind != NULL) {
            n += strcmp(k, kind) == 0;
            continue;
        }
        if (strcmp(k, "done") == 0) done++;
        if (strcmp(k, "exit") == 0 && strcmp(who, tag) == 0) others = 0;
        if (strcmp(k, "enter") == 0 && strcmp(who, tag) != 0) others++;
    }
    fclose(f);
    return kind != NULL ? n : (done >= workers - 1 || others >= turns);
}

int main(int argc, char **argv) {
    if (argc != 7 && argc != 8) {
        fprintf(stderr, "usage: crosslang_worker_c REDIS_URL NAME ROUNDS LOG TAG WORKERS [bytes]\n");
        return 2;
    }
    const char *url = argv[1], *name = argv[2], *log = argv[4], *tag = argv[5];
    int rounds = atoi(argv[3]), workers = atoi(argv[6]);
    int fd = open(log, O_WRONLY | O_APPEND);
    if (fd < 0) {
        perror("crosslang_worker_c: open the log");
        return 1;
    }
    uint8_t seed[32];
    for (size_t i = 0; i < sizeof seed; i++) seed[i] = (uint8_t)((uint64_t)getpid() * 31 + now_ns() * 7 + i * 13);
    lh_config cfg;
    lh_config_default(&cfg);
    lh_backend_options b;
    lh_backend_options_default(LH_BACKEND_REDIS_STREAM, &b);
    b.redis_url = (const uint8_t *)url;
    b.redis_url_len = strlen(url);
    uint32_t st = lh_client_new(&cfg, &b, seed, sizeof seed, &client);
    if (st != LH_OK) die("lh_client_new", st);
    lh_stream_init(&host, client);
    srand((unsigned)getpid());

    char line[256];
    snprintf(line, sizeof line, "ready %s %d\n", tag, (int)getpid());
    append(fd, line);
    for (uint64_t until = now_ns() + 60000 * MS; scan(log, "ready", tag, workers, 0) < workers && now_ns() < until;)
        step(5);
    for (int i = 0; i < rounds; i++) {
        lh_acquire_options o;
        lh_acquire_options_default(&o);
        o.ttl_ms = 10000;
        o.wait_ns = 60000 * MS;
        memset(&seen, 0, sizeof seen);
        if ((st = lh_acquire(client, now_ns(), (const uint8_t *)name, strlen(name), &o, &watched)) != LH_OK)
            die("lh_acquire", st);
        lh_stream_run_requests(&host, now_ns);
        lh_event e = wait_for(LH_EVENT_ACQUIRED, LH_EVENT_ACQUIRE_FAILED, 90);
        if (e.kind != LH_EVENT_ACQUIRED) {
            fprintf(stderr, "crosslang_worker_c: acquire failed (reason %u)\n", e.reason);
            return 1;
        }
        snprintf(line, sizeof line, "enter %s %d %llu\n", tag, (int)getpid(), (unsigned long long)e.fencing_token);
        append(fd, line);
        usleep(500);
        snprintf(line, sizeof line, "exit %s %d %llu\n", tag, (int)getpid(), (unsigned long long)e.fencing_token);
        append(fd, line);
        memset(&seen, 0, sizeof seen);
        uint32_t how = 0;
        if ((st = lh_release(client, now_ns(), watched, &how)) != LH_OK) die("lh_release", st);
        lh_stream_run_requests(&host, now_ns);
        if (how == LH_RELEASING_PENDING) {
            e = wait_for(LH_EVENT_RELEASE_OUTCOME, 0, 30);
            if (e.reason != LH_REASON_RELEASE_CONFIRMED) {
                fprintf(stderr, "crosslang_worker_c: release said reason %u\n", e.reason);
                return 1;
            }
        } else {
            fprintf(stderr, "crosslang_worker_c: release gave %u, not pending\n", how);
            return 1;
        }
        watched = 0;
        /* Now and then let two others go first, so a FIFO queue changes its order. */
        int turns = rand() % 10 < 3 ? 2 : 1;
        for (uint64_t until = now_ns() + 500 * MS; !scan(log, NULL, tag, workers, turns) && now_ns() < until;) step(1);
    }
    lh_io_close(client, now_ns());
    lh_counters k = {.struct_size = sizeof k};
    for (int i = 0; i < 400 && lh_counters_get(client, &k) == LH_OK && k.pending_cleanups > 0; i++) step(5);
    lh_stream_close(&host);
    lh_client_free(client);
    snprintf(line, sizeof line, "done %s %d\n", tag, (int)getpid());
    append(fd, line);
    close(fd);
    return 0;
}
