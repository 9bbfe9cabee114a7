/*
 * test_sqlite.c -- the C host executing the core's SQL protocol (SQLite dialect) with
 * libsqlite3 (sqlite/lh_sqlite3.c) on a real file in a temporary directory. Several processes
 * contend for one name: every one gets the lock in turn, fences strictly increase in grant
 * order, and no two ever hold it at once (checked in shared memory). A corrupt file is a
 * clear error (lh_sql_last_error), never a grant.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lh_sqlite3.h"

#define MS 1000000ull
#define WORKERS 4
#define ROUNDS 10
#define NAME "c-shared"

typedef struct {
    int held;
    int violations;
    uint32_t n;
    uint64_t fences[WORKERS * ROUNDS];
} shared_state;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Drains events; returns the fence when `lease` was acquired, 0 otherwise, -1 on failure. */
static int64_t drain(lh_client *c, uint64_t lease, uint32_t *reason) {
    lh_output out;
    int64_t got = 0;
    while (lh_poll_output(c, &out) == LH_OK && out.kind != LH_OUTPUT_NONE) {
        if (out.lease_id != lease) continue;
        if (out.kind == LH_OUTPUT_ACQUIRED) got = (int64_t)out.fencing_token;
        if (out.kind == LH_OUTPUT_ACQUIRE_FAILED || out.kind == LH_OUTPUT_LOST) {
            got = -1;
            if (reason) *reason = out.reason;
        }
    }
    return got;
}

static lh_client *new_client(int index) {
    uint8_t seed[32];
    for (size_t i = 0; i < sizeof seed; i++) seed[i] = (uint8_t)(getpid() * 31 + index * 7 + i * 13);
    lh_config cfg;
    lh_config_default(&cfg);
    lh_sql_options o;
    lh_sql_options_default(&o);
    o.dialect = LH_DIALECT_SQLITE;
    lh_client *c = NULL;
    if (lh_client_new_sql(&cfg, &o, seed, sizeof seed, &c) != LH_OK) return NULL;
    return c;
}

static int worker(const char *path, shared_state *sh, int index) {
    lh_client *c = new_client(index);
    if (c == NULL) return 2;
    lh_sqlite3 x;
    if (lh_sqlite3_open(&x, c, path) != 0) return 2;
    uint64_t limit = now_ns() + 60000 * MS;
    int rc = 0;
    for (int round = 0; round < ROUNDS && rc == 0; round++) {
        lh_acquire_options o;
        lh_acquire_options_default(&o);
        o.ttl_ms = 10000;
        o.wait_ns = 30000 * MS;
        uint64_t lease = 0;
        if (lh_acquire(c, now_ns(), (const uint8_t *)NAME, strlen(NAME), &o, &lease) != LH_OK) { rc = 3; break; }
        lh_sqlite3_run_requests(&x, now_ns);
        int64_t fence = 0;
        while ((fence = drain(c, lease, NULL)) == 0 && now_ns() < limit)
            lh_sqlite3_step(&x, 5, now_ns);
        if (fence <= 0) { rc = 4; break; }
        if (__atomic_exchange_n(&sh->held, 1, __ATOMIC_SEQ_CST) != 0) __atomic_add_fetch(&sh->violations, 1, __ATOMIC_SEQ_CST);
        uint32_t at = __atomic_fetch_add(&sh->n, 1, __ATOMIC_SEQ_CST);
        if (at < WORKERS * ROUNDS) sh->fences[at] = (uint64_t)fence;
        usleep(500);
        __atomic_store_n(&sh->held, 0, __ATOMIC_SEQ_CST);
        if (lh_release(c, now_ns(), lease) != LH_OK) { rc = 5; break; }
        lh_sqlite3_run_requests(&x, now_ns);
        drain(c, lease, NULL);
        usleep(1000); /* give a waiter its turn */
    }
    if (rc == 0 && x.last_status != LH_OK) rc = 6;
    lh_sqlite3_close(&x);
    lh_client_free(c);
    return rc;
}

/* A file that is not a database: the acquire fails (unavailable) and the reason is told. */
static int corrupt_file_is_a_clear_error(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/corrupt.sqlite3", dir);
    FILE *f = fopen(path, "w");
    if (f == NULL) return 1;
    for (int i = 0; i < 8192; i++) fputc('Z', f);
    fclose(f);
    lh_client *c = new_client(99);
    lh_sqlite3 x;
    if (c == NULL || lh_sqlite3_open(&x, c, path) != 0) return 1;
    lh_acquire_options o;
    lh_acquire_options_default(&o);
    uint64_t lease = 0;
    if (lh_acquire(c, now_ns(), (const uint8_t *)NAME, strlen(NAME), &o, &lease) != LH_OK) return 1;
    lh_sqlite3_run_requests(&x, now_ns);
    uint32_t reason = 0;
    int64_t got = drain(c, lease, &reason);
    const uint8_t *text = NULL;
    size_t len = 0;
    int failed = 0;
    if (got != -1 || reason != LH_REASON_UNAVAILABLE) { fprintf(stderr, "corrupt: got %lld\n", (long long)got); failed = 1; }
    if (lh_sql_last_error(c, &text, &len) != LH_OK || len == 0) failed = 1;
    else {
        char msg[600];
        snprintf(msg, sizeof msg, "%.*s", (int)len, (const char *)text);
        if (strstr(msg, "not a database") == NULL) { fprintf(stderr, "corrupt: %s\n", msg); failed = 1; }
        else printf("test_sqlite: corrupt file: %s\n", msg);
    }
    lh_sqlite3_close(&x);
    lh_client_free(c);
    return failed;
}

int main(void) {
    char dir[] = "/tmp/lh-c-sqlite-XXXXXX";
    if (mkdtemp(dir) == NULL) return 1;
    char path[512];
    snprintf(path, sizeof path, "%s/locks.sqlite3", dir);
    shared_state *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return 1;
    memset(sh, 0, sizeof *sh);
    pid_t kids[WORKERS];
    for (int i = 0; i < WORKERS; i++) {
        kids[i] = fork();
        if (kids[i] == 0) _exit(worker(path, sh, i));
    }
    int failed = 0;
    for (int i = 0; i < WORKERS; i++) {
        int status = 0;
        waitpid(kids[i], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "test_sqlite: worker %d failed (status %d)\n", i, status);
            failed = 1;
        }
    }
    if (sh->n != WORKERS * ROUNDS) { fprintf(stderr, "test_sqlite: %u grants\n", sh->n); failed = 1; }
    if (sh->violations != 0) { fprintf(stderr, "test_sqlite: two holders at once\n"); failed = 1; }
    for (uint32_t i = 1; i < sh->n && i < WORKERS * ROUNDS; i++) {
        if (sh->fences[i] <= sh->fences[i - 1]) {
            fprintf(stderr, "test_sqlite: fence %u not increasing\n", i);
            failed = 1;
        }
    }
    printf("test_sqlite: %u grants between %d processes on one file, fences strictly increasing: %s\n",
           sh->n, WORKERS, failed ? "FAIL" : "OK");
    failed |= corrupt_file_is_a_clear_error(dir);
    munmap(sh, sizeof *sh);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) failed = 1;
    return failed;
}
