/* lh_sqlite3.c -- see lh_sqlite3.h. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include "lh_sqlite3.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void note(lh_sqlite3 *x, uint32_t st) {
    if (st != LH_OK && x->last_status == LH_OK) x->last_status = st;
}

/* Says what about an existing file or its directory would let another user read or rewrite the
 * locks (the open goes on: the directory is trusted). A directory owned by root, or sticky (like
 * /tmp), does not let others replace the file. */
static void check_owner(const struct stat *st, const char *what, const char *path, int is_dir) {
    unsigned mode = (unsigned)(st->st_mode & 07777);
    if (st->st_uid != geteuid() && !(is_dir && st->st_uid == 0))
        fprintf(stderr, "lh_sqlite3: warning: the lock %s %s is owned by another user (uid %u)\n", what, path,
                (unsigned)st->st_uid);
    if ((mode & 022) != 0 && !(is_dir && (mode & S_ISVTX) != 0))
        fprintf(stderr, "lh_sqlite3: warning: the lock %s %s is writable by other users (mode %04o)\n", what, path, mode);
    else if (!is_dir && (mode & 004) != 0)
        fprintf(stderr, "lh_sqlite3: warning: the lock %s %s is readable by other users (mode %04o)\n", what, path, mode);
}

/* Closing a descriptor drops every POSIX lock this process holds on the file, so no other
 * executor of this process may open a file between its creation and that close. */
static pthread_mutex_t create_mu = PTHREAD_MUTEX_INITIALIZER;

/* Creates the file (0600 whatever the umask) when missing, without following a symbolic link
 * at the path, warns about an existing file or its directory, and records which file it is.
 * Fills x->last_error and returns -1 when it cannot be used. An existing file is never opened
 * here (that close would drop SQLite's locks on it). */
static int prepare_file(lh_sqlite3 *x) {
    pthread_mutex_lock(&create_mu);
    int fd = open(x->path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    int created = fd >= 0, err = errno;
    if (created && fchmod(fd, 0600) != 0) err = errno, created = -1;
    if (fd >= 0) close(fd);
    pthread_mutex_unlock(&create_mu);
    struct stat st;
    if (created < 0 || (!created && err != EEXIST) || lstat(x->path, &st) != 0) {
        snprintf(x->last_error, sizeof x->last_error, "cannot open %.200s: %s", x->path,
                 strerror(created < 0 || !created ? err : errno));
        return -1;
    }
    if (S_ISLNK(st.st_mode)) {
        snprintf(x->last_error, sizeof x->last_error,
                 "refusing %.160s: it is a symbolic link (not followed; give the target's path)", x->path);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(x->last_error, sizeof x->last_error, "refusing %.200s: not a regular file", x->path);
        return -1;
    }
    char *dir = strdup(x->path);
    if (dir == NULL) {
        snprintf(x->last_error, sizeof x->last_error, "out of memory");
        return -1;
    }
    char *slash = strrchr(dir, '/');
    if (slash == NULL) strcpy(dir, ".");
    else slash[slash == dir] = 0;
    struct stat ds;
    if (stat(dir, &ds) == 0) check_owner(&ds, "directory", dir, 1);
    free(dir);
    if (!created) check_owner(&st, "file", x->path, 0);
    x->dev = st.st_dev;
    x->ino = st.st_ino;
    x->mode = st.st_mode & 0777;
    return 0;
}

/* Gives this user's -wal and -shm files no permission the lock file lacks: SQLite sets their
 * mode only when it creates them. By path: a descriptor's close would drop SQLite's locks. */
static void tighten_sidecars(const lh_sqlite3 *x) {
    static const char *const suffix[] = {"-wal", "-shm"};
    size_t n = strlen(x->path);
    char *p = malloc(n + 5);
    if (p == NULL) return;
    for (int i = 0; i < 2; i++) {
        memcpy(p, x->path, n);
        memcpy(p + n, suffix[i], 5);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 0777 & ~x->mode) != 0)
            chmod(p, st.st_mode & 0777 & x->mode);
    }
    free(p);
}

static int reopen(lh_sqlite3 *x) {
    if (x->db != NULL) sqlite3_close(x->db);
    x->db = NULL;
    x->last_error[0] = 0;
    if (prepare_file(x) != 0) return -1;
    /* Without SQLITE_OPEN_CREATE: SQLite never creates the file (it would follow a link put at
     * the path since it was checked); the identity check below sees such a swap. */
    int rc = sqlite3_open_v2(x->path, &x->db, SQLITE_OPEN_READWRITE, NULL);
    struct stat st;
    if (rc != SQLITE_OK || lstat(x->path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != x->dev ||
        st.st_ino != x->ino) {
        snprintf(x->last_error, sizeof x->last_error, "cannot open %.200s: %s", x->path,
                 rc != SQLITE_OK ? (x->db != NULL ? sqlite3_errmsg(x->db) : sqlite3_errstr(rc))
                                 : "the file was replaced while it was opened");
        sqlite3_close(x->db);
        x->db = NULL;
        return -1;
    }
    tighten_sidecars(x);
    return 0;
}

int lh_sqlite3_open(lh_sqlite3 *x, lh_client *client, const char *path) {
    memset(x, 0, sizeof *x);
    x->client = client;
    x->path = strdup(path);
    if (x->path == NULL) return -1;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        if (fgets(x->boot_id, sizeof x->boot_id, f) == NULL) x->boot_id[0] = 0;
        fclose(f);
        x->boot_id[strcspn(x->boot_id, "\n")] = 0;
    }
    if (gethostname(x->host, sizeof x->host - 1) != 0) x->host[0] = 0;
    if (reopen(x) != 0) {
        fprintf(stderr, "lh_sqlite3: %s\n", x->last_error);
        free(x->path);
        x->path = NULL;
        return -1;
    }
    return 0;
}

void lh_sqlite3_close(lh_sqlite3 *x) {
    if (x->db != NULL) sqlite3_close(x->db);
    free(x->path);
    memset(x, 0, sizeof *x);
}

/* Flat pre-order list of values plus one data buffer (lh_io_reply's format). Once `bad`
 * (out of memory) nothing more is added and the result is not delivered. */
typedef struct { lh_value *v; size_t n, cap; uint8_t *data; size_t len, dcap; int bad; } flat;

#define NO_INDEX SIZE_MAX

/* Appends one value; its index, or NO_INDEX once memory ran out. A capacity is recorded only
 * after realloc succeeded. */
static size_t push(flat *f, uint32_t kind, int64_t integer, const void *s, size_t len) {
    if (f->bad) return NO_INDEX;
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 16;
        lh_value *v = cap <= SIZE_MAX / sizeof *v ? realloc(f->v, cap * sizeof *v) : NULL;
        if (v == NULL) { f->bad = 1; return NO_INDEX; }
        f->v = v;
        f->cap = cap;
    }
    if (s != NULL && len > f->dcap - f->len) {
        size_t dcap = len <= (SIZE_MAX - 64) / 2 - f->len ? 2 * (f->len + len) + 64 : 0;
        uint8_t *d = dcap != 0 ? realloc(f->data, dcap) : NULL;
        if (d == NULL) { f->bad = 1; return NO_INDEX; }
        f->data = d;
        f->dcap = dcap;
    }
    lh_value *v = &f->v[f->n];
    memset(v, 0, sizeof *v);
    v->kind = kind;
    v->integer = integer;
    v->len = (uint64_t)len;
    if (s != NULL) {
        v->offset = (uint64_t)f->len;
        if (len) memcpy(f->data + f->len, s, len);
        f->len += len;
    }
    return f->n++;
}

static void bind(sqlite3_stmt *st, int i, const lh_value *p, const uint8_t *data,
                 int64_t mono, int64_t wall, const lh_sqlite3 *x) {
    switch (p->kind) {
    case LH_VALUE_INT: sqlite3_bind_int64(st, i, p->integer); break;
    case LH_VALUE_TEXT:
        sqlite3_bind_text(st, i, (const char *)data + p->offset, (int)p->len, SQLITE_TRANSIENT);
        break;
    case LH_VALUE_BULK:
        sqlite3_bind_blob(st, i, data + p->offset, (int)p->len, SQLITE_TRANSIENT);
        break;
    case LH_PARAM_HOST_MONOTONIC_NS: sqlite3_bind_int64(st, i, mono); break;
    case LH_PARAM_HOST_WALL_US: sqlite3_bind_int64(st, i, wall); break;
    case LH_PARAM_HOST_BOOT_ID: sqlite3_bind_text(st, i, x->boot_id, -1, SQLITE_TRANSIENT); break;
    case LH_PARAM_HOST_PID: sqlite3_bind_int64(st, i, (int64_t)getpid()); break;
    case LH_PARAM_HOST_NAME: sqlite3_bind_text(st, i, x->host, -1, SQLITE_TRANSIENT); break;
    default: sqlite3_bind_null(st, i); break;
    }
}

static const char out_of_memory[] = "out of memory";

/* Runs one request; returns NULL on success (rows in *f) or the error message (out_of_memory
 * when the rows did not fit in memory: the request stopped there). */
static const char *run(lh_sqlite3 *x, const lh_io_request *r, flat *f) {
    struct timespec m, w;
    clock_gettime(CLOCK_MONOTONIC, &m);
    clock_gettime(CLOCK_REALTIME, &w);
    int64_t mono = (int64_t)m.tv_sec * 1000000000 + m.tv_nsec;
    int64_t wall = (int64_t)w.tv_sec * 1000000 + w.tv_nsec / 1000;
    push(f, LH_VALUE_ARRAY, 0, NULL, r->nstatements);
    for (uint32_t s = 0; s < r->nstatements && !f->bad; s++) {
        const lh_sql_statement *q = &r->statements[s];
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(x->db, (const char *)r->data + q->sql_offset, (int)q->sql_len, &st, NULL) != SQLITE_OK)
            return sqlite3_errmsg(x->db);
        for (uint32_t i = 0; i < q->nparams; i++)
            bind(st, (int)i + 1, &r->params[q->first_param + i], r->data, mono, wall, x);
        size_t rows_at = push(f, LH_VALUE_ARRAY, 0, NULL, 0);
        uint64_t nrows = 0;
        int rc = SQLITE_DONE;
        while (!f->bad && (rc = sqlite3_step(st)) == SQLITE_ROW) {
            int ncols = sqlite3_column_count(st);
            push(f, LH_VALUE_ARRAY, 0, NULL, (size_t)ncols);
            for (int c = 0; c < ncols && !f->bad; c++) {
                switch (sqlite3_column_type(st, c)) {
                case SQLITE_INTEGER: push(f, LH_VALUE_INT, sqlite3_column_int64(st, c), NULL, 0); break;
                case SQLITE_FLOAT: {
                    double d = sqlite3_column_double(st, c);
                    int64_t bits;
                    memcpy(&bits, &d, sizeof bits);
                    push(f, LH_VALUE_FLOAT, bits, NULL, 0);
                    break;
                }
                case SQLITE_TEXT: {
                    const unsigned char *t = sqlite3_column_text(st, c);
                    push(f, LH_VALUE_TEXT, 0, t ? (const void *)t : "", (size_t)sqlite3_column_bytes(st, c));
                    break;
                }
                case SQLITE_BLOB: {
                    const void *b = sqlite3_column_blob(st, c);
                    push(f, LH_VALUE_BULK, 0, b ? b : "", (size_t)sqlite3_column_bytes(st, c));
                    break;
                }
                default: push(f, LH_VALUE_NIL, 0, NULL, 0); break;
                }
            }
            nrows++;
        }
        sqlite3_finalize(st);
        if (f->bad) break;
        if (rc != SQLITE_DONE) return sqlite3_errmsg(x->db);
        f->v[rows_at].len = nrows;
    }
    return f->bad ? out_of_memory : NULL;
}

static void failed(lh_sqlite3 *x, uint64_t id, uint64_t now, uint32_t kind, const char *msg) {
    note(x, lh_io_failed(x->client, now, id, kind, (const uint8_t *)msg, strlen(msg)));
}

/* The connection was opened anew: the handle checks the schema again. */
static void reopened(lh_sqlite3 *x, uint64_t now) {
    note(x, lh_io_connection(x->client, now, LH_CONNECTION_COMMANDS, LH_CONNECTION_REOPENED, NULL, 0));
}

static void run_sql(lh_sqlite3 *x, const lh_io_request *r, uint64_t (*now)(void)) {
    /* A deleted or replaced file: follow the path instead of locking alone on the old inode
     * (the request did not run; the schema is checked again on the new file). */
    struct stat fs;
    int same = x->db != NULL && lstat(x->path, &fs) == 0 && fs.st_dev == x->dev && fs.st_ino == x->ino;
    if (!same) {
        int ok = reopen(x) == 0;
        failed(x, r->id, now(), LH_FAILURE_TRANSPORT,
               ok || x->last_error[0] == 0 ? "the database file was replaced or could not be opened" : x->last_error);
        if (ok) reopened(x, now());
        return;
    }
    flat f = {0};
    const char *err = run(x, r, &f);
    if (err == out_of_memory) {
        /* The rows could not be handed back: the outcome is unknown to the core, as after a
         * broken connection. Undo what the request left open and start afresh. */
        if (!sqlite3_get_autocommit(x->db)) sqlite3_exec(x->db, "ROLLBACK", NULL, NULL, NULL);
        failed(x, r->id, now(), LH_FAILURE_TRANSPORT, out_of_memory);
        if (reopen(x) == 0) reopened(x, now());
    } else if (err != NULL) {
        /* The message lives in the connection: copy it before the ROLLBACK replaces it. */
        size_t n = strlen(err);
        char *copy = malloc(n + 1);
        if (copy != NULL) memcpy(copy, err, n + 1);
        if (!sqlite3_get_autocommit(x->db)) sqlite3_exec(x->db, "ROLLBACK", NULL, NULL, NULL);
        failed(x, r->id, now(), LH_FAILURE_DATABASE, copy ? copy : "");
        free(copy);
    } else {
        lh_status st = lh_io_reply(x->client, now(), r->id, f.v, f.n, f.data, f.len);
        note(x, st);
        if (st != LH_OK) failed(x, r->id, now(), LH_FAILURE_TRANSPORT, "the rows were refused");
    }
    free(f.v);
    free(f.data);
}

void lh_sqlite3_execute(lh_sqlite3 *x, const lh_io_request *q, uint64_t (*now)(void)) {
    switch (q->kind) {
    case LH_IO_NONE: return;
    case LH_IO_SQL: run_sql(x, q, now); return;
    case LH_IO_HTTP_CANCEL: return; /* no answer expected */
    default: failed(x, q->id, now(), LH_FAILURE_TRANSPORT, "the sqlite3 executor runs LH_IO_SQL requests only"); return;
    }
}

void lh_sqlite3_run_requests(lh_sqlite3 *x, uint64_t (*now)(void)) {
    for (;;) {
        lh_io_request r;
        uint32_t st = lh_io_poll(x->client, &r);
        note(x, st);
        if (st != LH_OK || r.kind == LH_IO_NONE) return;
        lh_sqlite3_execute(x, &r, now);
    }
}

void lh_sqlite3_step(lh_sqlite3 *x, int max_ms, uint64_t (*now)(void)) {
    uint64_t deadline = LH_NO_DEADLINE;
    note(x, lh_poll_timeout(x->client, &deadline));
    uint64_t t = now();
    uint64_t wait = deadline > t ? deadline - t : 0;
    if (wait > (uint64_t)max_ms * 1000000ull) wait = (uint64_t)max_ms * 1000000ull;
    if (wait > 0) {
        struct timespec ts = {(time_t)(wait / 1000000000ull), (long)(wait % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
    note(x, lh_timeout(x->client, now()));
    lh_sqlite3_run_requests(x, now);
}
