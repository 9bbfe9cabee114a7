/*
 * test_sqlite.c -- the C host executing the core's SQL protocol (SQLite dialect) with
 * libsqlite3 (sqlite/lh_sqlite3.c) on a real file in a temporary directory. Several processes
 * contend for one name: every one gets the lock in turn, fences strictly increase in grant
 * order, and no two ever hold it at once (checked in shared memory). A corrupt file is a
 * clear error (lh_backend_last_error), never a grant; a file deleted under an open executor is
 * followed (the new file is opened and reported with lh_io_connection). The file is private: created 0600 whatever the
 * umask (its -wal and -shm too), a symbolic link at the path is refused without touching its
 * target, and a file or directory others may write (or own) is reported.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
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
    lh_event ev;
    int64_t got = 0;
    while (lh_poll_event(c, &ev) == LH_OK && ev.kind != LH_EVENT_NONE) {
        if (ev.lease_id != lease) continue;
        if (ev.kind == LH_EVENT_ACQUIRED) got = (int64_t)ev.fencing_token;
        if (ev.kind == LH_EVENT_ACQUIRE_FAILED || ev.kind == LH_EVENT_LOST) {
            got = -1;
            if (reason) *reason = ev.reason;
        }
    }
    return got;
}

static lh_client *new_client(int index) {
    uint8_t seed[32];
    for (size_t i = 0; i < sizeof seed; i++) seed[i] = (uint8_t)(getpid() * 31 + index * 7 + i * 13);
    lh_config cfg;
    lh_config_default(&cfg);
    lh_backend_options o;
    lh_client *c = NULL;
    if (lh_backend_options_default(LH_BACKEND_SQLITE, &o) != LH_OK) return NULL;
    if (lh_client_new(&cfg, &o, seed, sizeof seed, &c) != LH_OK) return NULL;
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
        if (lh_release(c, now_ns(), lease, NULL) != LH_OK) { rc = 5; break; }
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
    chmod(path, 0600); /* private: only the refusal is printed */
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
    int failed = 0;
    if (got != -1 || reason != LH_REASON_UNAVAILABLE) { fprintf(stderr, "corrupt: got %lld\n", (long long)got); failed = 1; }
    const char *msg = lh_backend_last_error(c);
    lh_counters k = {.struct_size = sizeof k};
    if (strstr(msg, "not a database") == NULL) { fprintf(stderr, "corrupt: \"%s\"\n", msg); failed = 1; }
    else printf("test_sqlite: corrupt file: %s\n", msg);
    if (lh_counters_get(c, &k) != LH_OK || k.sql_database_errors == 0 || k.grants != 0) failed = 1;
    lh_sqlite3_close(&x);
    lh_client_free(c);
    return failed;
}

/* Acquires `name` on an open executor; the fence, or -1. */
static int64_t acquire_once(lh_client *c, lh_sqlite3 *x, const char *name) {
    lh_acquire_options o;
    lh_acquire_options_default(&o);
    o.wait_ns = 5000 * MS;
    uint64_t lease = 0;
    if (lh_acquire(c, now_ns(), (const uint8_t *)name, strlen(name), &o, &lease) != LH_OK) return -1;
    lh_sqlite3_run_requests(x, now_ns);
    uint64_t limit = now_ns() + 10000 * MS;
    int64_t fence = 0;
    while ((fence = drain(c, lease, NULL)) == 0 && now_ns() < limit) lh_sqlite3_step(x, 5, now_ns);
    return fence > 0 ? fence : -1;
}

/* The file is deleted under an open executor: the next request is not run on the old inode
 * (a transport failure), the executor opens the new file and reports it (lh_io_connection
 * REOPENED), the schema is made again there, and the acquire, retried, is granted on it: a
 * second process opening the path sees that lock. */
static int replaced_file_is_followed(const char *dir) {
    char path[512], side[540];
    snprintf(path, sizeof path, "%s/replaced.sqlite3", dir);
    lh_client *c = new_client(80), *other = new_client(81);
    lh_sqlite3 x, y;
    if (c == NULL || other == NULL || lh_sqlite3_open(&x, c, path) != 0) return 1;
    int failed = acquire_once(c, &x, "before") <= 0;
    unlink(path);
    snprintf(side, sizeof side, "%s-wal", path);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", path);
    unlink(side);
    lh_counters k0 = {.struct_size = sizeof k0}, k = {.struct_size = sizeof k};
    lh_counters_get(c, &k0);
    failed |= acquire_once(c, &x, "after") <= 0;
    lh_counters_get(c, &k);
    failed |= k.backend_transport_failures != k0.backend_transport_failures + 1 || k.sql_migrations <= k0.sql_migrations;
    failed |= x.last_status != LH_OK;
    /* Another process on the path finds "after" held and "before" free (the old file is gone). */
    if (lh_sqlite3_open(&y, other, path) != 0) failed = 1;
    else {
        lh_acquire_options o;
        lh_acquire_options_default(&o);
        uint64_t l1 = 0, l2 = 0;
        lh_acquire(other, now_ns(), (const uint8_t *)"after", 5, &o, &l1);
        lh_acquire(other, now_ns(), (const uint8_t *)"before", 6, &o, &l2);
        lh_sqlite3_run_requests(&y, now_ns);
        lh_lease_info i1 = {.struct_size = sizeof i1}, i2 = {.struct_size = sizeof i2};
        lh_status s1 = lh_lease_info_get(other, l1, &i1), s2 = lh_lease_info_get(other, l2, &i2);
        failed |= !(s1 == LH_ERR_LEASE_ENDED || (s1 == LH_OK && i1.state == LH_STATE_ACQUIRE_FAILED));
        failed |= s2 != LH_OK || i2.state != LH_STATE_HELD;
        lh_sqlite3_close(&y);
    }
    printf("test_sqlite: file deleted under the executor: reopened (%llu transport failure, schema again), "
           "the lock lands in the new file: %s\n",
           (unsigned long long)(k.backend_transport_failures - k0.backend_transport_failures), failed ? "FAIL" : "OK");
    lh_sqlite3_close(&x);
    lh_client_free(c);
    lh_client_free(other);
    return failed;
}

static int mode_is(const char *path, mode_t want) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        fprintf(stderr, "test_sqlite: %s: %s\n", path, strerror(errno));
        return 0;
    }
    if ((st.st_mode & 07777) != want) {
        fprintf(stderr, "test_sqlite: %s has mode %04o, want %04o\n", path, (unsigned)(st.st_mode & 07777), (unsigned)want);
        return 0;
    }
    return 1;
}

/* A missing file is created 0600 whatever the umask, SQLite's -wal and -shm files follow its
 * mode, laxer ones left behind are tightened, and a missing directory is a clear error (not
 * created). */
static int new_file_is_private(const char *dir) {
    char sub[512], path[600], wal[620], shm[620], missing[600];
    snprintf(sub, sizeof sub, "%s/private", dir);
    snprintf(path, sizeof path, "%s/locks.sqlite3", sub);
    snprintf(wal, sizeof wal, "%s-wal", path);
    snprintf(shm, sizeof shm, "%s-shm", path);
    snprintf(missing, sizeof missing, "%s/missing/locks.sqlite3", dir);
    if (mkdir(sub, 0700) != 0) return 1;
    int failed = 0;
    for (int laxer = 0; laxer < 2 && !failed; laxer++) {
        if (laxer) { /* left by an older, laxer file: empty, which SQLite accepts */
            unlink(path);
            for (int i = 0; i < 2; i++) {
                int fd = open(i ? shm : wal, O_WRONLY | O_CREAT | O_TRUNC, 0644);
                if (fd < 0 || fchmod(fd, 0644) != 0) return 1;
                close(fd);
            }
        }
        mode_t old = umask(laxer ? 022 : 0277);
        lh_client *c = new_client(50 + laxer);
        lh_sqlite3 x;
        failed = c == NULL || lh_sqlite3_open(&x, c, path) != 0;
        umask(old);
        if (!failed) {
            failed = acquire_once(c, &x, "private") <= 0;
            if (failed) fprintf(stderr, "test_sqlite: no grant on the new private file\n");
            failed |= !mode_is(path, 0600);
            failed |= !mode_is(wal, 0600) || !mode_is(shm, 0600); /* there while the connection is open */
            lh_sqlite3_close(&x);
        }
        lh_client_free(c);
    }
    lh_client *c = new_client(52);
    lh_sqlite3 x;
    struct stat st;
    if (c == NULL || lh_sqlite3_open(&x, c, missing) == 0) {
        fprintf(stderr, "test_sqlite: opened a file in a missing directory\n");
        failed = 1;
    } else if (strstr(x.last_error, "No such file or directory") == NULL || stat(missing, &st) == 0) {
        fprintf(stderr, "test_sqlite: missing directory: %s\n", x.last_error);
        failed = 1;
    }
    lh_client_free(c);
    printf("test_sqlite: new file 0600 whatever the umask, -wal and -shm too (laxer ones tightened): %s\n",
           failed ? "FAIL" : "OK");
    return failed;
}

/* A symbolic link at the path is refused with a clear reason; its target is neither created
 * nor changed, whether it exists or not. */
static int symlink_is_refused(const char *dir) {
    char link[512], victim[512];
    snprintf(link, sizeof link, "%s/link.db", dir);
    snprintf(victim, sizeof victim, "%s/victim.db", dir);
    int failed = 0;
    for (int exists = 0; exists < 2; exists++) {
        unlink(link);
        unlink(victim);
        if (exists) {
            FILE *f = fopen(victim, "w");
            if (f == NULL) return 1;
            fputs("keep", f);
            fclose(f);
        }
        if (symlink("victim.db", link) != 0) return 1;
        lh_client *c = new_client(60 + exists);
        lh_sqlite3 x;
        if (c == NULL) return 1;
        if (lh_sqlite3_open(&x, c, link) == 0) {
            fprintf(stderr, "test_sqlite: opened through a symbolic link\n");
            lh_sqlite3_close(&x);
            failed = 1;
        } else if (strstr(x.last_error, "symbolic link") == NULL) {
            fprintf(stderr, "test_sqlite: symlink refused for the wrong reason: %s\n", x.last_error);
            failed = 1;
        }
        lh_client_free(c);
        struct stat st;
        if (!exists && lstat(victim, &st) == 0) {
            fprintf(stderr, "test_sqlite: the link's target was created\n");
            failed = 1;
        }
        if (exists && (lstat(victim, &st) != 0 || st.st_size != 4)) {
            fprintf(stderr, "test_sqlite: the link's target was changed\n");
            failed = 1;
        }
    }
    unlink(link);
    unlink(victim);
    printf("test_sqlite: symbolic link refused, target untouched: %s\n", failed ? "FAIL" : "OK");
    return failed;
}

/* Runs lh_sqlite3_open on `path` with stderr captured; what it printed in `out`. */
static int open_captured(const char *path, char *out, size_t cap) {
    char log[] = "/tmp/lh-c-sqlite-stderr-XXXXXX";
    int fd = mkstemp(log);
    if (fd < 0) return -1;
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    lh_client *c = new_client(70);
    lh_sqlite3 x;
    int rc = c != NULL && lh_sqlite3_open(&x, c, path) == 0 ? 0 : -1;
    if (rc == 0) lh_sqlite3_close(&x);
    lh_client_free(c);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ssize_t n = pread(fd, out, cap - 1, 0);
    out[n > 0 ? n : 0] = 0;
    close(fd);
    unlink(log);
    return rc;
}

/* A file or directory others may write (or, as root, a file another user owns) is reported;
 * a private one is not. */
static int exposed_file_is_reported(const char *dir) {
    char open_dir[512], path[600], msg[2048];
    snprintf(open_dir, sizeof open_dir, "%s/shared", dir);
    snprintf(path, sizeof path, "%s/locks.sqlite3", open_dir);
    int failed = 0;
    if (mkdir(open_dir, 0700) != 0 || open_captured(path, msg, sizeof msg) != 0) return 1;
    if (msg[0] != 0) { fprintf(stderr, "test_sqlite: a private file was reported: %s\n", msg); failed = 1; }
    chmod(path, 0666);
    chmod(open_dir, 0777);
    if (open_captured(path, msg, sizeof msg) != 0) return 1;
    if (strstr(msg, "file ") == NULL || strstr(msg, "locks.sqlite3 is writable by other users (mode 0666)") == NULL ||
        strstr(msg, "shared is writable by other users (mode 0777)") == NULL) {
        fprintf(stderr, "test_sqlite: a file and directory others may write were not both reported: %s\n", msg);
        failed = 1;
    }
    chmod(open_dir, 0700);
    chmod(path, 0644);
    if (open_captured(path, msg, sizeof msg) != 0) return 1;
    if (strstr(msg, "locks.sqlite3 is readable by other users (mode 0644)") == NULL || strstr(msg, "directory") != NULL) {
        fprintf(stderr, "test_sqlite: a file others may read was not reported (alone): %s\n", msg);
        failed = 1;
    }
    chmod(path, 0600);
    if (geteuid() == 0) {
        if (chown(path, 65534, 65534) != 0 || open_captured(path, msg, sizeof msg) != 0) return 1;
        if (strstr(msg, "is owned by another user") == NULL) {
            fprintf(stderr, "test_sqlite: a file another user owns was not reported: %s\n", msg);
            failed = 1;
        }
    }
    printf("test_sqlite: a file others may read, a file or directory others may write%s is reported: %s\n",
           geteuid() == 0 ? " or own" : "", failed ? "FAIL" : "OK");
    return failed;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* forked children must not repeat buffered lines */
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
    failed |= replaced_file_is_followed(dir);
    failed |= new_file_is_private(dir);
    failed |= symlink_is_refused(dir);
    failed |= exposed_file_is_reported(dir);
    munmap(sh, sizeof *sh);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) failed = 1;
    return failed;
}
