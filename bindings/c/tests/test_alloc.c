/*
 * test_alloc.c -- the C executors when memory runs out while they flatten a reply. Linked with
 * -Wl,--wrap=realloc (only the executors' and this file's calls are wrapped, not libsqlite3's,
 * hiredis' or leasehold's), so the Nth realloc of a run fails, for every N the run makes:
 *   SQLite: a fresh file, then acquire (the migration's multi-row result), status, release;
 *   Redis: a hostile server on a loopback port answering every command with a large nested
 *          reply (arrays in arrays, strings, integers, errors, nils); N runs over the first
 *          reply's flattening.
 * Each time the request whose rows did not fit fails as a transport failure (lh_io_failed
 * LH_FAILURE_TRANSPORT "out of memory"), is never answered with a result (lh_io_reply), and
 * nothing is written out of bounds or leaked: bindings/c/test.sh runs this under ASan+UBSan
 * and under valgrind. The answering calls are wrapped too, to see what they got.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lh_hiredis.h"
#include "lh_sqlite3.h"

#define MS 1000000ull

/* ---- the failing allocator and the observed answers ---------------------------------------- */

static int reallocs;     /* calls since the run started */
static int fail_at;      /* the call that returns NULL (0: none) */
static int failed_alloc; /* that call happened */
static int pending;      /* it happened and the request has not been answered yet */
static int verdict;      /* 1: that request failed as it should; -1: it was answered otherwise */
static int first_ok;     /* the first Redis reply held the nested reply exactly */
static int replies;      /* Redis replies handed over */
static int hits;         /* runs in which the chosen call came (and failed) */
static int redis_mode;   /* the Redis runs: the first reply's flattening is checked too */
static int first_reallocs; /* reallocs up to the first Redis reply (its flattening's) */

void *__real_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n) {
    if (++reallocs == fail_at) {
        failed_alloc = pending = 1;
        hits++;
        return NULL;
    }
    return __real_realloc(p, n);
}

/* The next answer after the failed realloc is for the request being flattened. */
static void answered(int as_failure) {
    if (pending) verdict = as_failure ? 1 : -1;
    else if (as_failure < 0) verdict = -1; /* an out-of-memory failure with no failed realloc */
    pending = 0;
}

static void reset_run(int n) {
    reallocs = failed_alloc = pending = verdict = first_ok = replies = first_reallocs = 0;
    fail_at = n;
}

/* The nested reply the hostile Redis server sends, flattened: checked on the first reply. */
static int nested_ok(const lh_value *v, size_t nv, const uint8_t *d, size_t dl);

lh_status __real_lh_io_reply(lh_client *c, uint64_t now, uint64_t id, const lh_value *v, size_t nv,
                             const uint8_t *d, size_t dl);
lh_status __wrap_lh_io_reply(lh_client *c, uint64_t now, uint64_t id, const lh_value *v, size_t nv,
                             const uint8_t *d, size_t dl) {
    answered(0);
    if (redis_mode) {
        if (replies == 0) first_reallocs = reallocs;
        if (replies++ == 0) first_ok = nested_ok(v, nv, d, dl);
    }
    return __real_lh_io_reply(c, now, id, v, nv, d, dl);
}

lh_status __real_lh_io_failed(lh_client *c, uint64_t now, uint64_t id, uint32_t kind, const uint8_t *m, size_t n);
lh_status __wrap_lh_io_failed(lh_client *c, uint64_t now, uint64_t id, uint32_t kind, const uint8_t *m, size_t n) {
    int oom = kind == LH_FAILURE_TRANSPORT && n == 13 && memcmp(m, "out of memory", 13) == 0;
    answered(oom ? (pending ? 1 : -1) : 0);
    return __real_lh_io_failed(c, now, id, kind, m, n);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void seed_for(uint8_t seed[32], int salt) {
    for (int i = 0; i < 32; i++) seed[i] = (uint8_t)(getpid() * 17 + salt * 5 + i * 11);
}

static lh_client *new_client(uint32_t backend, const uint8_t seed[32]) {
    lh_config cfg;
    lh_backend_options o;
    lh_client *c = NULL;
    lh_config_default(&cfg);
    if (lh_backend_options_default(backend, &o) != LH_OK) return NULL;
    return lh_client_new(&cfg, &o, seed, 32, &c) == LH_OK ? c : NULL;
}

/* Drains events: 1 when `lease` got an outcome (acquired, failed, released), else 0. */
static int outcome(lh_client *c, uint64_t lease) {
    lh_event ev;
    int got = 0;
    while (lh_poll_event(c, &ev) == LH_OK && ev.kind != LH_EVENT_NONE)
        if (ev.lease_id == lease && (ev.kind == LH_EVENT_ACQUIRED || ev.kind == LH_EVENT_ACQUIRE_FAILED ||
                                     ev.kind == LH_EVENT_RELEASED || ev.kind == LH_EVENT_LOST))
            got = 1;
    return got;
}

/* ---- SQLite ----------------------------------------------------------------------------------- */

/* One run on a fresh file with realloc call `n` failing; returns the reallocs it made, -1 on a
 * failed check. */
static int sqlite_run(const char *dir, int n) {
    char path[512], side[540];
    snprintf(path, sizeof path, "%s/locks.sqlite3", dir);
    unlink(path);
    snprintf(side, sizeof side, "%s-wal", path);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", path);
    unlink(side);
    uint8_t seed[32];
    seed_for(seed, n);
    lh_client *c = new_client(LH_BACKEND_SQLITE, seed);
    if (c == NULL) return -1;
    reset_run(n);
    lh_sqlite3 x;
    if (lh_sqlite3_open(&x, c, path) != 0) {
        lh_client_free(c);
        return -1;
    }
    int ok = 1;
    lh_acquire_options ao;
    lh_acquire_options_default(&ao);
    ao.wait_ns = 5000 * MS;
    uint64_t lease = 0, limit = now_ns() + 20000 * MS;
    ok &= lh_acquire(c, now_ns(), (const uint8_t *)"alloc", 5, &ao, &lease) == LH_OK;
    lh_sqlite3_run_requests(&x, now_ns);
    while (ok && !outcome(c, lease) && now_ns() < limit) lh_sqlite3_step(&x, 5, now_ns);
    uint64_t sid = 0;
    ok &= lh_status_request(c, now_ns(), (const uint8_t *)"alloc", 5, &sid) == LH_OK;
    lh_sqlite3_run_requests(&x, now_ns);
    lh_release(c, now_ns(), lease, NULL);
    lh_sqlite3_run_requests(&x, now_ns);
    outcome(c, lease);
    ok &= now_ns() < limit;
    lh_sqlite3_close(&x);
    lh_client_free(c);
    fail_at = 0;
    if (!ok) {
        fprintf(stderr, "test_alloc: sqlite run %d did not finish\n", n);
        return -1;
    }
    if (verdict != (failed_alloc ? 1 : 0)) {
        fprintf(stderr, "test_alloc: sqlite run %d: the request whose rows did not fit was %s\n", n,
                verdict < 0 ? "answered otherwise" : failed_alloc ? "never answered" : "failed");
        return -1;
    }
    return reallocs;
}

static int sqlite_test(void) {
    char dir[] = "/tmp/lh-c-alloc-XXXXXX";
    if (mkdtemp(dir) == NULL) return 1;
    hits = 0;
    int total = sqlite_run(dir, 0), failed = total < 2;
    for (int n = 1; !failed && n <= total; n++) failed = sqlite_run(dir, n) < 0;
    /* A retry's timing may differ from the clean run's; the rest must be hit. */
    if (hits + 1 < total) failed = 1;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) failed = 1;
    printf("test_alloc: sqlite: each of %d reallocs failing in turn (%d came): a transport failure, no result: %s\n",
           total, hits, failed ? "FAIL" : "OK");
    return failed;
}

/* ---- Redis ------------------------------------------------------------------------------------ */

/* The hostile server's answer to every command, and its flattened size. */
#define S10 "0123456789"
#define S100 S10 S10 S10 S10 S10 S10 S10 S10 S10 S10
static const char nested[] =
    "*4\r\n"
    "*12\r\n$7\r\nvalue-0\r\n$7\r\nvalue-1\r\n$7\r\nvalue-2\r\n$7\r\nvalue-3\r\n$7\r\nvalue-4\r\n$7\r\nvalue-5\r\n"
    "$7\r\nvalue-6\r\n$7\r\nvalue-7\r\n$7\r\nvalue-8\r\n$7\r\nvalue-9\r\n:10\r\n:11\r\n"
    "*3\r\n:42\r\n*3\r\n+OK\r\n-ERR nested\r\n$-1\r\n*2\r\n*1\r\n$3\r\nabc\r\n*0\r\n"
    "$200\r\n"
    S100 S100 "\r\n"
    ":-1\r\n";
#define NESTED_VALUES 26

/* Answers every complete command (a RESP multibulk) on each connection with `nested`, except
 * SUBSCRIBE, which it confirms (the core sends its commands once subscribed). The process per
 * connection ends when the client closes it. */
static void serve(int listener) {
    signal(SIGCHLD, SIG_IGN); /* a process per connection, reaped by the kernel */
    for (;;) {
        int s = accept(listener, NULL, NULL);
        if (s < 0) continue;
        if (fork() != 0) {
            close(s);
            continue;
        }
        close(listener);
        char buf[65536];
        size_t have = 0;
        ssize_t got;
        while ((got = read(s, buf + have, sizeof buf - have)) > 0) {
            have += (size_t)got;
            for (;;) { /* consume whole commands: *N then N times $len\r\n bytes\r\n */
                char *p = buf, *end = buf + have, *nl;
                if (have == 0 || *p != '*' || (nl = memchr(p, '\n', (size_t)(end - p))) == NULL) break;
                long args = strtol(p + 1, NULL, 10);
                const char *arg[2] = {"", ""};
                long arglen[2] = {0, 0};
                p = nl + 1;
                int whole = 1;
                for (long i = 0; i < args && whole; i++) {
                    if (p >= end || *p != '$' || (nl = memchr(p, '\n', (size_t)(end - p))) == NULL) { whole = 0; break; }
                    long len = strtol(p + 1, NULL, 10);
                    p = nl + 1;
                    if (i < 2) arg[i] = p, arglen[i] = len;
                    if (end - p < len + 2) whole = 0;
                    else p += len + 2;
                }
                if (!whole) break;
                char out[1024];
                int n = 0;
                if (arglen[0] == 9 && strncasecmp(arg[0], "SUBSCRIBE", 9) == 0 && arglen[1] < 900)
                    n = snprintf(out, sizeof out, "*3\r\n$9\r\nsubscribe\r\n$%ld\r\n%.*s\r\n:1\r\n", arglen[1],
                                 (int)arglen[1], arg[1]);
                memmove(buf, p, (size_t)(end - p));
                have = (size_t)(end - p);
                if (n > 0 ? write(s, out, (size_t)n) < 0 : write(s, nested, sizeof nested - 1) < 0) break;
            }
            if (have == sizeof buf) break;
        }
        _exit(0); /* the client closed the connection */
    }
}

static pid_t start_hostile_server(int *port) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 16) != 0 ||
        getsockname(l, (struct sockaddr *)&a, &len) != 0)
        return -1;
    *port = ntohs(a.sin_port);
    fflush(stdout); /* not printed again by the server's processes */
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* gone with the test, even if it crashes */
        serve(l);
        _exit(0);
    }
    close(l);
    return pid;
}

static int nested_ok(const lh_value *v, size_t nv, const uint8_t *d, size_t dl) {
    /* pre-order, strings in the data buffer */
    return nv == NESTED_VALUES && v[0].kind == LH_VALUE_ARRAY && v[0].len == 4 && v[1].kind == LH_VALUE_ARRAY &&
           v[1].len == 12 && v[2].kind == LH_VALUE_BULK && v[2].len == 7 && memcmp(d + v[2].offset, "value-0", 7) == 0 &&
           v[15].integer == 42 && v[17].kind == LH_VALUE_STATUS && v[18].kind == LH_VALUE_ERROR &&
           memcmp(d + v[18].offset, "ERR nested", 10) == 0 && v[19].kind == LH_VALUE_NIL &&
           v[22].kind == LH_VALUE_BULK && memcmp(d + v[22].offset, "abc", 3) == 0 && v[24].len == 200 &&
           v[24].offset + 200 <= dl && v[25].integer == -1;
}

/* One acquire, every command of it answered with the nested reply, with realloc call `n`
 * failing; returns the reallocs the first reply's flattening made, -1 on a failed check. */
static int redis_run(int port, int n) {
    uint8_t seed[32];
    seed_for(seed, 1000 + n);
    lh_client *c = new_client(LH_BACKEND_REDIS, seed);
    if (c == NULL) return -1;
    lh_hiredis x;
    if (lh_hiredis_init(&x, c, "127.0.0.1", port) != 0) {
        lh_client_free(c);
        return -1;
    }
    reset_run(n);
    lh_acquire_options ao;
    lh_acquire_options_default(&ao);
    uint64_t lease = 0;
    int ok = lh_acquire(c, now_ns(), (const uint8_t *)"alloc", 5, &ao, &lease) == LH_OK;
    /* Subscribed, then its first command: the reply flattened, or the one that failed. */
    uint64_t limit = now_ns() + 5000 * MS;
    while (now_ns() < limit && replies < 1 && verdict == 0) lh_hiredis_step(&x, 5, now_ns);
    int made = first_reallocs;
    fail_at = 0;
    lh_hiredis_close(&x);
    lh_client_free(c);
    if (!ok) return -1;
    if (n == 0 && !first_ok) {
        fprintf(stderr, "test_alloc: redis: the nested reply was not handed over whole\n");
        return -1;
    }
    if (verdict != (failed_alloc ? 1 : 0)) {
        fprintf(stderr, "test_alloc: redis run %d: the request whose reply did not fit was %s\n", n,
                verdict < 0 ? "answered with a reply" : "never failed");
        return -1;
    }
    return made;
}

static int redis_test(void) {
    int port = 0;
    pid_t server = start_hostile_server(&port);
    if (server < 0) return 1;
    hits = 0;
    redis_mode = 1;
    int total = redis_run(port, 0), failed = total < 3;
    for (int n = 1; !failed && n <= total; n++) failed = redis_run(port, n) < 0;
    if (hits != total) failed = 1;
    kill(server, SIGKILL);
    waitpid(server, NULL, 0);
    printf("test_alloc: redis: each of %d reallocs of a nested reply failing in turn (%d came): a transport "
           "failure, no reply: %s\n",
           total, hits, failed ? "FAIL" : "OK");
    return failed;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    int failed = sqlite_test();
    failed |= redis_test();
    return failed;
}
