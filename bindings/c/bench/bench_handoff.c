/*
 * bench_handoff.c -- Redis lock handoff latency, a process per waiter, two ways:
 *   leasehold -- each process has its own LH_BACKEND_REDIS_STREAM client run by
 *                redis/lh_stream.c and calls lh_acquire with a wait;
 *   floor     -- the protocol's own steps on plain sockets, no library: per process a commands
 *                socket and a subscriber socket on a wake channel of its own; the ACQUIRE and
 *                RELEASE script calls are recorded once from a stream client for the name, and
 *                each process puts in its own token and entry (channel#token). A refused
 *                ACQUIRE ([0, pttl_ms, rank]) waits in poll(2) for "w TOKEN NAME" on its
 *                subscriber socket, or the holder's pttl, then asks again with queued = 1.
 * One holder and the waiters contend on one name; each holds 10 ms and queues again only after
 * another process held, so every handoff goes to another process. A handoff's latency runs from
 * the holder's CLOCK_MONOTONIC stamp just before it releases to the next holder's grant (its
 * ACQUIRED event, or the floor's grant reply); the processes share it through a MAP_SHARED map.
 * Prints p50 and p99 of each and leasehold's p50 over the floor's.
 *
 *   usage: bench_handoff [handoffs [waiters]]   (default 150 x 8)
 * Starts its own redis-server on a free loopback port (redis-server must be on PATH).
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lh_stream.h"

#define MS 1000000ull
#define MAX_HANDOFFS 100000
#define MAX_WAITERS 64
#define HOLD_NS (10 * MS)
#define TTL_MS 10000

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* What the processes share: the lock's state as they see it, and the samples. */
typedef struct {
    _Atomic uint64_t stamp; /* the last holder's time just before it released, 0 before any */
    _Atomic int gen;        /* grants so far */
    _Atomic int inside;     /* 1 while a process holds: a second holder is a failure */
    _Atomic int asked;      /* waiters that sent their first acquire */
    _Atomic int done;       /* enough samples, or a failure */
    _Atomic int failed;
    _Atomic int n;
    uint64_t lat[MAX_HANDOFFS];
} shared;

static shared *S;
static pid_t parent, server;
static int am_first; /* this process is the first holder */

static void die(const char *what) {
    fprintf(stderr, "bench_handoff: %s\n", what);
    if (S != NULL) atomic_store(&S->failed, 1), atomic_store(&S->done, 1);
    if (getpid() == parent && server > 0) kill(server, SIGKILL), waitpid(server, NULL, 0);
    exit(1);
}

static void sleep_until(uint64_t t) {
    uint64_t n = now_ns();
    if (n >= t) return;
    struct timespec ts = {.tv_sec = (time_t)((t - n) / 1000000000ull), .tv_nsec = (long)((t - n) % 1000000000ull)};
    nanosleep(&ts, NULL);
}

static void hex(char *out, size_t nbytes) {
    uint8_t raw[32];
    if (nbytes > sizeof raw || getentropy(raw, nbytes) != 0) die("getentropy");
    for (size_t i = 0; i < nbytes; i++) sprintf(out + 2 * i, "%02x", raw[i]);
}

#include "bench_redis.h"

/* --- a process's part, the same for both ways ------------------------------------------- */
typedef struct locker locker;
struct locker {
    void (*lock)(locker *);              /* returns holding the lock */
    void (*unlock)(locker *);            /* returns once released */
    void (*idle)(locker *, uint64_t);    /* until the time given, serving its connections */
    void (*asked)(locker *);             /* an acquire is on its way */
};

static void worker(locker *L, int first, int waiters, int handoffs) {
    am_first = first;
    if (!first)
        while (atomic_load(&S->gen) == 0 && !atomic_load(&S->done)) usleep(200);
    for (;;) {
        L->lock(L);
        uint64_t t = now_ns();
        if (atomic_exchange(&S->inside, 1) != 0) die("two holders at once");
        int stop = atomic_load(&S->done);
        uint64_t stamp = atomic_load(&S->stamp);
        if (stamp != 0 && !stop) {
            int i = atomic_fetch_add(&S->n, 1);
            if (i < handoffs) S->lat[i] = t - stamp;
            if (i + 1 >= handoffs) atomic_store(&S->done, 1);
        }
        int my = atomic_fetch_add(&S->gen, 1) + 1;
        if (first) { /* the first holder lets every waiter queue before the first handoff */
            first = 0;
            uint64_t until = now_ns() + 10000 * MS;
            while (atomic_load(&S->asked) < waiters && now_ns() < until) L->idle(L, now_ns() + MS);
            if (atomic_load(&S->asked) < waiters) die("the waiters did not ask in 10 s");
            L->idle(L, now_ns() + 200 * MS);
        }
        L->idle(L, now_ns() + HOLD_NS);
        atomic_store(&S->inside, 0);
        atomic_store(&S->stamp, now_ns());
        L->unlock(L);
        if (stop) return;
        /* Queue again only once another process held. */
        while (atomic_load(&S->gen) == my && !atomic_load(&S->done)) L->idle(L, now_ns() + MS);
        if (atomic_load(&S->done)) return;
    }
}

/* --- leasehold: an lh_stream client per process ----------------------------------------- */
typedef struct {
    locker l;
    lh_client *c;
    lh_stream_host h;
    uint64_t lease;
    const char *name;
} lh_locker;

/* Waits for `lease`'s event of `kind` (0: none, just `until`); dies on a failure. */
static void lh_wait(lh_locker *k, uint32_t kind, uint64_t until) {
    for (;;) {
        lh_event ev;
        while (lh_poll_event(k->c, &ev) == LH_OK && ev.kind != LH_EVENT_NONE) {
            if (ev.lease_id != k->lease) continue;
            if (kind != 0 && ev.kind == kind) return;
            if (ev.kind == LH_EVENT_ACQUIRE_FAILED || ev.kind == LH_EVENT_LOST) die(lh_backend_last_error(k->c));
        }
        uint64_t n = now_ns();
        if (n >= until) {
            if (kind != 0) die("no answer in time");
            return;
        }
        uint64_t left = (until - n + MS - 1) / MS;
        lh_stream_step(&k->h, left > 100 ? 100 : (int)left, now_ns);
    }
}

static void lh_lock(locker *l) {
    lh_locker *k = (lh_locker *)l;
    lh_acquire_options o;
    lh_acquire_options_default(&o);
    o.ttl_ms = TTL_MS;
    o.wait_ns = 60000 * MS;
    if (lh_acquire(k->c, now_ns(), (const uint8_t *)k->name, strlen(k->name), &o, &k->lease) != LH_OK) die("lh_acquire");
    lh_stream_run_requests(&k->h, now_ns);
    l->asked(l);
    lh_wait(k, LH_EVENT_ACQUIRED, now_ns() + 60000 * MS);
}

static void lh_unlock(locker *l) {
    lh_locker *k = (lh_locker *)l;
    uint32_t how = 0;
    if (lh_release(k->c, now_ns(), k->lease, &how) != LH_OK || how != LH_RELEASING_PENDING) die("lh_release");
    lh_stream_run_requests(&k->h, now_ns);
    lh_wait(k, LH_EVENT_RELEASE_OUTCOME, now_ns() + 5000 * MS);
}

static void lh_idle(locker *l, uint64_t until) { lh_wait((lh_locker *)l, 0, until); }

/* Counts each waiter's first acquire once (the first holder waits for them all). */
static void count_asked(locker *l) {
    static int counted;
    (void)l;
    if (!counted && !am_first) counted = 1, atomic_fetch_add(&S->asked, 1);
}

static void not_counted(locker *l) { (void)l; }

static lh_client *stream_client(int port) {
    uint8_t seed[32];
    if (getentropy(seed, sizeof seed) != 0) die("getentropy");
    lh_config cfg;
    lh_config_default(&cfg);
    lh_backend_options b;
    lh_backend_options_default(LH_BACKEND_REDIS_STREAM, &b);
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    b.redis_url = (const uint8_t *)url;
    b.redis_url_len = strlen(url);
    lh_client *c = NULL;
    if (lh_client_new(&cfg, &b, seed, sizeof seed, &c) != LH_OK) die("lh_client_new");
    return c;
}

static void leasehold_process(int port, const char *name, int first, int waiters, int handoffs) {
    lh_locker k = {.l = {lh_lock, lh_unlock, lh_idle, count_asked}, .name = name};
    k.c = stream_client(port);
    lh_stream_init(&k.h, k.c);
    worker(&k.l, first, waiters, handoffs);
    lh_io_close(k.c, now_ns());
    lh_stream_close(&k.h);
    lh_client_free(k.c);
}

/* --- the recorded script calls ---------------------------------------------------------- */
typedef struct {
    int argc;
    char *argv[16];
    long len[16];
} command;

/* Reads one RESP array of bulk strings (a recorded command) from b[0..n). */
static int parse_command(const char *b, long n, command *out) {
    if (n < 4 || b[0] != '*' || value_end(b, n, 0) != n) return 0;
    out->argc = atoi(b + 1);
    if (out->argc <= 0 || out->argc > 16) return 0;
    const char *p = strchr(b, '\n') + 1;
    for (int i = 0; i < out->argc; i++) {
        if (*p != '$') return 0;
        out->len[i] = atol(p + 1);
        p = strchr(p, '\n') + 1;
        out->argv[i] = malloc((size_t)out->len[i] + 1);
        memcpy(out->argv[i], p, (size_t)out->len[i]);
        out->argv[i][out->len[i]] = 0;
        p += out->len[i] + 2;
    }
    return 1;
}

/* Encodes argv as a RESP array into out (malloc'd); returns its length. */
static long encode(char **argv, char **out) {
    size_t cap = 64;
    int argc = 0;
    while (argv[argc] != NULL) cap += strlen(argv[argc++]) + 32;
    char *b = malloc(cap);
    long n = sprintf(b, "*%d\r\n", argc);
    for (int i = 0; i < argc; i++) n += sprintf(b + n, "$%zu\r\n%s\r\n", strlen(argv[i]), argv[i]);
    *out = b;
    return n;
}

/* One acquire (with a wait) and release of `name` by a stream client, its writes kept; the
 * ACQUIRE call is the EVALSHA with 3 keys, RELEASE the one with 2. */
static void record(int port, const char *name, command *acquire, command *release) {
    lh_client *c = stream_client(port);
    lh_locker k = {.l = {lh_lock, lh_unlock, lh_idle, not_counted}, .c = c, .name = name};
    lh_stream_init(&k.h, c);
    for (int i = 0; i < 3; i++) lh_lock(&k.l), lh_unlock(&k.l); /* connect, load the scripts */
    memset(acquire, 0, sizeof *acquire), memset(release, 0, sizeof *release);
    for (int phase = 0; phase < 2; phase++) {
        lh_acquire_options o;
        lh_acquire_options_default(&o);
        o.ttl_ms = TTL_MS;
        o.wait_ns = 60000 * MS;
        uint32_t how = 0;
        if (phase == 0 && lh_acquire(c, now_ns(), (const uint8_t *)name, strlen(name), &o, &k.lease) != LH_OK)
            die("lh_acquire");
        if (phase == 1 && (lh_release(c, now_ns(), k.lease, &how) != LH_OK || how != LH_RELEASING_PENDING))
            die("lh_release");
        lh_io_request q;
        while (lh_io_poll(c, &q) == LH_OK && q.kind != LH_IO_NONE) {
            command cmd;
            if (q.kind == LH_IO_WRITE && parse_command((const char *)q.data, (long)q.data_len, &cmd)) {
                command *into = cmd.argc > 2 && strcasecmp(cmd.argv[0], "EVALSHA") == 0
                                    ? strcmp(cmd.argv[2], "3") == 0 ? acquire : strcmp(cmd.argv[2], "2") == 0 ? release : NULL
                                    : NULL;
                if (into != NULL && into->argc == 0) *into = cmd;
                else
                    for (int i = 0; i < cmd.argc; i++) free(cmd.argv[i]);
            }
            lh_stream_execute(&k.h, &q, now_ns);
        }
        lh_wait(&k, phase == 0 ? LH_EVENT_ACQUIRED : LH_EVENT_RELEASE_OUTCOME, now_ns() + 5000 * MS);
    }
    if (acquire->argc != 12 || release->argc != 8) die("the recorded ACQUIRE / RELEASE calls are not of the expected shape");
    lh_io_close(c, now_ns());
    lh_stream_close(&k.h);
    lh_client_free(c);
}

/* --- the floor: plain sockets ----------------------------------------------------------- */
typedef struct {
    int fd;
    long len;
    char buf[1 << 14];
} conn;

/* Waits until conn holds a whole value; returns its end, or -1 when `until` passed first. */
static long next_value(conn *c, uint64_t until) {
    for (;;) {
        long end = c->len > 0 ? value_end(c->buf, c->len, 0) : -1;
        if (end > 0) return end;
        uint64_t n = now_ns();
        if (until != 0 && n >= until) return -1;
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int r = poll(&p, 1, until == 0 ? 5000 : (int)((until - n + MS - 1) / MS));
        if (r < 0) die("floor poll");
        if (r == 0) {
            if (until == 0) die("floor: no reply in 5 s");
            continue;
        }
        if (c->len == (long)sizeof c->buf) die("floor: reply too long");
        ssize_t got = read(c->fd, c->buf + c->len, sizeof c->buf - (size_t)c->len);
        if (got <= 0) die("floor read");
        c->len += got;
    }
}

static void consume(conn *c, long end) {
    memmove(c->buf, c->buf + end, (size_t)(c->len - end));
    c->len -= end;
}

/* Sends `req` and reads its reply, an integer or an array of integers, into v[0..3). */
static int call_ints(conn *c, const char *req, long len, long long v[3]) {
    if (write(c->fd, req, (size_t)len) != len) die("floor write");
    long end = next_value(c, 0);
    if (c->buf[0] == '-') {
        fprintf(stderr, "bench_handoff: floor: %.*s\n", (int)end, c->buf);
        die("floor: error reply");
    }
    int n = 0;
    for (const char *p = c->buf; p < c->buf + end; p = strchr(p, '\n') + 1)
        if (*p == ':' && n < 3) v[n++] = atoll(p + 1);
    consume(c, end);
    return n;
}

typedef struct {
    locker l;
    conn cmd, sub;
    char *first, *again, *rel, wake[64];
    long first_len, again_len, rel_len;
} floor_locker;

static void floor_lock(locker *l) {
    floor_locker *k = (floor_locker *)l;
    for (int queued = 0;; queued = 1) {
        long long v[3] = {0};
        int n = queued ? call_ints(&k->cmd, k->again, k->again_len, v) : call_ints(&k->cmd, k->first, k->first_len, v);
        l->asked(l);
        if (n == 3 && v[0] == 1) return;
        if (n != 3 || v[0] != 0) die("floor: unexpected ACQUIRE reply");
        /* Queued: its wake-up ("w TOKEN NAME" on its channel), or the holder's time is up. */
        uint64_t until = now_ns() + (uint64_t)(v[1] > 0 ? v[1] : 1) * MS;
        for (;;) {
            long end = next_value(&k->sub, until);
            if (end < 0) break;
            size_t w = strlen(k->wake);
            int woken = 0;
            for (long i = 0; i + (long)w <= end && !woken; i++) woken = memcmp(k->sub.buf + i, k->wake, w) == 0;
            consume(&k->sub, end);
            if (woken) break;
        }
    }
}

static void floor_unlock(locker *l) {
    floor_locker *k = (floor_locker *)l;
    long long v[3] = {0};
    if (call_ints(&k->cmd, k->rel, k->rel_len, v) != 1 || v[0] != 1) die("floor: RELEASE found another owner");
}

static void floor_idle(locker *l, uint64_t until) {
    (void)l;
    sleep_until(until);
}

static void floor_process(int port, const command *acquire, const command *release, int first, int waiters,
                          int handoffs) {
    static floor_locker k;
    k.l = (locker){floor_lock, floor_unlock, floor_idle, count_asked};
    k.cmd.fd = tcp_to(port), k.sub.fd = tcp_to(port);
    if (k.cmd.fd < 0 || k.sub.fd < 0) die("floor connect");
    char token[33], channel[8 + 33], entry[8 + 33 + 1 + 33];
    hex(token, 16);
    strcpy(channel, "lh:wake:");
    hex(channel + 8, 16);
    snprintf(entry, sizeof entry, "%s#%s", channel, token);
    snprintf(k.wake, sizeof k.wake, "w %s ", token);
    char *sub_argv[] = {"SUBSCRIBE", channel, NULL}, *req;
    long len = encode(sub_argv, &req);
    if (write(k.sub.fd, req, (size_t)len) != len) die("floor write");
    free(req);
    consume(&k.sub, next_value(&k.sub, 0)); /* its confirmation */
    char *a[13], *r[9];
    for (int i = 0; i < 12; i++) a[i] = acquire->argv[i];
    for (int i = 0; i < 8; i++) r[i] = release->argv[i];
    a[6] = token, a[8] = entry, a[12] = NULL;
    a[11] = "0";
    k.first_len = encode(a, &k.first);
    a[11] = "1";
    k.again_len = encode(a, &k.again);
    r[5] = token, r[8] = NULL;
    k.rel_len = encode(r, &k.rel);
    worker(&k.l, first, waiters, handoffs);
    close(k.cmd.fd), close(k.sub.fd);
    free(k.first), free(k.again), free(k.rel);
}

/* --- the runs ---------------------------------------------------------------------------- */
static int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Runs one way with 1 + waiters processes; puts its p50 and p99 (ns) in pct. */
static void run(const char *label, int floor, int port, const char *name, const command *acq, const command *rel,
                int waiters, int handoffs, uint64_t pct[2]) {
    memset(S, 0, sizeof *S);
    pid_t kids[MAX_WAITERS + 1];
    for (int p = 0; p <= waiters; p++) {
        fflush(NULL);
        kids[p] = fork();
        if (kids[p] < 0) die("fork");
        if (kids[p] == 0) {
            if (floor) floor_process(port, acq, rel, p == 0, waiters, handoffs);
            else leasehold_process(port, name, p == 0, waiters, handoffs);
            _exit(0);
        }
    }
    int left = waiters + 1, ok = 1;
    uint64_t until = now_ns() + 120000 * MS;
    while (left > 0 && now_ns() < until) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid > 0) {
            left--;
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ok = 0, atomic_store(&S->done, 1);
        } else {
            usleep(10000);
        }
    }
    if (left > 0) {
        for (int p = 0; p <= waiters; p++) kill(kids[p], SIGKILL);
        while (waitpid(-1, NULL, 0) > 0) {}
        die("the processes did not finish in 120 s");
    }
    int n = atomic_load(&S->n);
    if (!ok || atomic_load(&S->failed) || n < handoffs) die("a process failed");
    qsort(S->lat, (size_t)handoffs, sizeof S->lat[0], cmp);
    pct[0] = S->lat[(handoffs - 1) / 2];
    pct[1] = S->lat[(int)(0.99 * (handoffs - 1))];
    printf("%-48s p50 %6.3f ms  p99 %6.3f ms  (%d handoffs, %d waiters)\n", label, (double)pct[0] / 1e6,
           (double)pct[1] / 1e6, handoffs, waiters);
    fflush(stdout);
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    int handoffs = argc > 1 ? atoi(argv[1]) : 150, waiters = argc > 2 ? atoi(argv[2]) : 8;
    if (handoffs <= 0 || handoffs > MAX_HANDOFFS || waiters <= 0 || waiters > MAX_WAITERS)
        die("usage: bench_handoff [handoffs [waiters]]");
    S = mmap(NULL, sizeof *S, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (S == MAP_FAILED) die("mmap");
    shared *s = S;
    S = NULL; /* the parent's failures before the runs need not flag the map */
    int port = 0;
    parent = getpid();
    server = start_server(&port);
    if (server < 0) die("redis-server did not start");
    command acq, rel;
    record(port, "bench-handoff-floor", &acq, &rel);
    S = s;
    uint64_t lh[2], fl[2];
    run("leasehold (lh_stream.c, a client per process)", 0, port, "bench-handoff", NULL, NULL, waiters, handoffs, lh);
    run("floor (recorded scripts, plain sockets)", 1, port, "bench-handoff-floor", &acq, &rel, waiters, handoffs, fl);
    printf("leasehold p50 / floor p50 %.2fx\n", (double)lh[0] / (double)fl[0]);
    for (int i = 0; i < 12; i++) free(acq.argv[i]);
    for (int i = 0; i < 8; i++) free(rel.argv[i]);
    kill(server, SIGKILL);
    waitpid(server, NULL, 0);
    munmap(S, sizeof *S);
    return 0;
}
