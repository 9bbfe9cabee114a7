/*
 * bench_stream.c -- one uncontended acquire+release on a real redis-server three ways, in
 * interleaved batches so that the load of a shared machine hits all alike:
 *   floor   -- the requests the core sends for one acquire+release, recorded once from a
 *              stream client, replayed pre-encoded on a plain blocking socket in a bare loop
 *              (each write, then a read until as many replies as it had commands);
 *   stream  -- an LH_BACKEND_REDIS_STREAM client run by redis/lh_stream.c (the byte path);
 *   hiredis -- an LH_BACKEND_REDIS client run by redis/lh_hiredis.c (the peer executor);
 *   floor with poll -- the floor again, each read preceded by poll(2) as in a host that
 *              multiplexes its streams (what the stream host's syscalls cost at least).
 * Prints min and median ns per acquire+release of each, and floor/stream, floor/hiredis.
 *
 *   usage: bench_stream [cycles-per-batch [batches [stream]]]   (default 2000 x 11)
 * With `stream`, only the stream loop runs in the batches: for counting its instructions
 * (valgrind --tool=callgrind at two cycle counts, differenced).
 * Starts its own redis-server on a free loopback port (redis-server must be on PATH).
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lh_hiredis.h"
#include "lh_stream.h"

#define MS 1000000ull

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what) {
    fprintf(stderr, "bench_stream: %s\n", what);
    exit(1);
}

#include "bench_redis.h"

static int count_values(const char *b, long n) {
    int c = 0;
    for (long i = 0; i < n && (i = value_end(b, n, i)) >= 0; c++) {}
    return c;
}

/* --- the recorded requests -------------------------------------------------------------- */
typedef struct {
    char *bytes[16];
    long len[16];
    int replies[16];
    int n;
    uint64_t stream;
} recording;

typedef struct {
    lh_client *c;
    lh_stream_host h;
    lh_hiredis x;
    int kind;
    recording *rec; /* while recording: every WRITE goes here too */
} client;

static void run_requests(client *k) {
    lh_io_request q;
    while (lh_io_poll(k->c, &q) == LH_OK && q.kind != LH_IO_NONE) {
        if (k->rec != NULL && q.kind == LH_IO_WRITE && k->rec->n < 16) {
            recording *r = k->rec;
            if (r->n == 0) r->stream = q.stream;
            if (q.stream != r->stream) die("the cycle wrote on two streams");
            r->bytes[r->n] = malloc(q.data_len);
            memcpy(r->bytes[r->n], q.data, q.data_len);
            r->len[r->n] = (long)q.data_len;
            r->replies[r->n] = count_values(r->bytes[r->n], r->len[r->n]);
            r->n++;
        }
        if (k->kind == LH_BACKEND_REDIS) lh_hiredis_execute(&k->x, &q, now_ns);
        else lh_stream_execute(&k->h, &q, now_ns);
    }
}

static void client_new(client *k, int kind, int port) {
    memset(k, 0, sizeof *k);
    k->kind = kind;
    uint8_t seed[32];
    for (size_t i = 0; i < sizeof seed; i++) seed[i] = (uint8_t)(i * 7 + (uint8_t)kind);
    lh_config cfg;
    lh_config_default(&cfg);
    lh_backend_options b;
    lh_backend_options_default((uint32_t)kind, &b);
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    b.redis_url = (const uint8_t *)url;
    b.redis_url_len = strlen(url);
    if (lh_client_new(&cfg, &b, seed, sizeof seed, &k->c) != LH_OK) die("lh_client_new");
    if (kind == LH_BACKEND_REDIS) lh_hiredis_init(&k->x, k->c, "127.0.0.1", port);
    else lh_stream_init(&k->h, k->c);
}

/* Waits for `lease`'s event of `kind`; dies on a failure or after 5 s. */
static void wait_for(client *k, uint64_t lease, uint32_t kind) {
    uint64_t until = now_ns() + 5000 * MS;
    for (;;) {
        lh_event ev;
        while (lh_poll_event(k->c, &ev) == LH_OK && ev.kind != LH_EVENT_NONE) {
            if (ev.lease_id != lease) continue;
            if (ev.kind == kind) return;
            if (ev.kind == LH_EVENT_ACQUIRE_FAILED || ev.kind == LH_EVENT_LOST) die(lh_backend_last_error(k->c));
        }
        if (now_ns() > until) die("no answer in 5 s");
        if (k->kind == LH_BACKEND_REDIS) {
            lh_hiredis_step(&k->x, 100, now_ns);
            run_requests(k);
        } else {
            lh_stream_step(&k->h, 100, now_ns);  /* (it ends by running the requests) */
        }
    }
}

static void cycle(client *k, const char *name) {
    lh_acquire_options o;
    lh_acquire_options_default(&o);
    o.ttl_ms = 30000;
    o.wait_ns = 1000 * MS;
    uint64_t lease = 0;
    if (lh_acquire(k->c, now_ns(), (const uint8_t *)name, strlen(name), &o, &lease) != LH_OK) die("lh_acquire");
    run_requests(k);
    wait_for(k, lease, LH_EVENT_ACQUIRED);
    uint32_t how = 0;
    if (lh_release(k->c, now_ns(), lease, &how) != LH_OK || how != LH_RELEASING_PENDING) die("lh_release");
    run_requests(k);
    wait_for(k, lease, LH_EVENT_RELEASE_OUTCOME);
}

/* With `polled`, each read waits in poll(2) first, as a host multiplexing its streams does. */
static void floor_cycle_how(int fd, const recording *r, int polled) {
    static char buf[1 << 16];
    for (int i = 0; i < r->n; i++) {
        if (write(fd, r->bytes[i], (size_t)r->len[i]) != r->len[i]) die("floor write");
        long got = 0;
        while (count_values(buf, got) < r->replies[i]) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (polled && poll(&p, 1, 5000) != 1) die("floor poll");
            ssize_t n = read(fd, buf + got, sizeof buf - (size_t)got);
            if (n <= 0) die("floor read");
            got += n;
        }
    }
}

static void floor_cycle(int fd, const recording *r) { floor_cycle_how(fd, r, 0); }

static int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    int cycles = argc > 1 ? atoi(argv[1]) : 2000, batches = argc > 2 ? atoi(argv[2]) : 11;
    int only_stream = argc > 3 && strcmp(argv[3], "stream") == 0;
    if (cycles <= 0 || batches <= 0 || batches > 101 || (argc > 3 && !only_stream))
        die("usage: bench_stream [cycles-per-batch [batches [stream]]]");
    int port = 0;
    pid_t server = start_server(&port);
    if (server < 0) die("redis-server did not start");
    client st, hi;
    client_new(&st, LH_BACKEND_REDIS_STREAM, port);
    client_new(&hi, LH_BACKEND_REDIS, port);
    for (int i = 0; i < 50; i++) cycle(&st, "bench-stream"), cycle(&hi, "bench-hiredis");  /* connect, load scripts */
    recording rec = {0};
    st.rec = &rec;
    cycle(&st, "bench-stream");
    st.rec = NULL;
    int fd = tcp_to(port);
    if (fd < 0) die("floor connect");
    static const char hello[] = "*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n";
    recording h = {.bytes = {(char *)hello}, .len = {sizeof hello - 1}, .replies = {1}, .n = 1};
    floor_cycle(fd, &h);
    for (int i = 0; i < 50; i++) floor_cycle(fd, &rec);
    int nreplies = 0;
    for (int i = 0; i < rec.n; i++) nreplies += rec.replies[i];
    printf("recorded: %d writes, %d commands per acquire+release\n", rec.n, nreplies);

    uint64_t t[4][101];
    for (int b = 0; only_stream && b < batches; b++) {
        uint64_t t0 = now_ns();
        for (int i = 0; i < cycles; i++) cycle(&st, "bench-stream");
        t[1][b] = (now_ns() - t0) / (uint64_t)cycles;
    }
    for (int b = 0; !only_stream && b < batches; b++) {
        uint64_t t0 = now_ns();
        for (int i = 0; i < cycles; i++) floor_cycle(fd, &rec);
        uint64_t t1 = now_ns();
        for (int i = 0; i < cycles; i++) cycle(&st, "bench-stream");
        uint64_t t2 = now_ns();
        for (int i = 0; i < cycles; i++) cycle(&hi, "bench-hiredis");
        uint64_t t3 = now_ns();
        for (int i = 0; i < cycles; i++) floor_cycle_how(fd, &rec, 1);
        uint64_t t4 = now_ns();
        t[0][b] = (t1 - t0) / (uint64_t)cycles, t[1][b] = (t2 - t1) / (uint64_t)cycles, t[2][b] = (t3 - t2) / (uint64_t)cycles;
        t[3][b] = (t4 - t3) / (uint64_t)cycles;
    }
    const char *label[4] = {"floor (raw socket, recorded requests)", "stream (lh_stream.c byte path)", "hiredis (lh_hiredis.c)",
                            "floor with poll(2) before each read"};
    uint64_t mn[4];
    for (int r = only_stream; r < (only_stream ? 2 : 4); r++) {
        qsort(t[r], (size_t)batches, sizeof t[r][0], cmp);
        mn[r] = t[r][0];
        printf("%-40s min %7llu ns  median %7llu ns per acquire+release\n", label[r], (unsigned long long)t[r][0],
               (unsigned long long)t[r][batches / 2]);
    }
    if (!only_stream)
        printf("floor/stream %.2fx   floor/hiredis %.2fx   floor-with-poll/stream %.2fx   (min over %d batches of %d)\n",
           (double)mn[0] / (double)mn[1], (double)mn[0] / (double)mn[2], (double)mn[3] / (double)mn[1], batches, cycles);
    close(fd);
    for (int i = 0; i < rec.n; i++) free(rec.bytes[i]);
    lh_io_close(st.c, now_ns());
    lh_stream_close(&st.h);
    lh_hiredis_close(&hi.x);
    lh_client_free(st.c);
    lh_client_free(hi.c);
    kill(server, SIGKILL);
    waitpid(server, NULL, 0);
    return 0;
}
