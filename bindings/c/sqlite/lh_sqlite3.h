/*
 * lh_sqlite3.h -- a thin SQLite executor for a leasehold handle created with lh_client_new()
 * and an lh_backend_options of kind LH_BACKEND_SQLITE: it runs the statements of the handle's
 * LH_IO_SQL requests verbatim on one libsqlite3 connection, binds the host facts
 * (CLOCK_MONOTONIC, the wall clock, the boot id, the pid, the host name) and hands every row
 * back unread (lh_io_reply), or the failure (lh_io_failed: LH_FAILURE_DATABASE when SQLite
 * refused a statement, LH_FAILURE_TRANSPORT when the rows could not be handed back or the file
 * was replaced; then lh_io_connection LH_CONNECTION_REOPENED once the new file is open). It
 * knows no table, statement or row meaning: the core does.
 *
 * The file holds lock names, pids, host names and tokens: a missing file is created 0600 whatever
 * the umask (its directory must exist; SQLite gives the -wal and -shm files the file's mode, and
 * laxer ones this user owns are tightened), a symbolic link at the path is refused rather than
 * followed, and an existing file or directory that another user owns or may write (the file:
 * or read) is reported on stderr (the open goes on: the directory is trusted).
 *
 * Not thread-safe (like the handle). Blocking: each request runs synchronously (bounded by
 * the busy timeout the core sets), which suits a C host and its tests.
 */
#ifndef LH_SQLITE3_H
#define LH_SQLITE3_H

#include <stdint.h>
#include <sys/types.h>
#include <sqlite3.h>

#include "leasehold.h"

typedef struct lh_sqlite3 {
    lh_client *client;
    char *path;
    sqlite3 *db;
    dev_t dev; /* identity of the file the connection opened: a replaced file is followed */
    ino_t ino;
    mode_t mode; /* its permission bits */
    char boot_id[64];
    char host[256];
    uint32_t last_status; /* first non-LH_OK status from the library, 0 if none */
    char last_error[256]; /* why the file could not be opened ("" if it could) */
} lh_sqlite3;

/* Opens `path` (created if missing; see above). Returns 0, or -1 (nothing to free; last_error
 * says why, also printed on stderr) if the file cannot be opened or is a symbolic link. */
int lh_sqlite3_open(lh_sqlite3 *x, lh_client *client, const char *path);

/* Runs one request polled from the handle (lh_io_poll) and answers it. A request of another
 * kind than LH_IO_SQL is answered as a transport failure (this executor cannot run it). */
void lh_sqlite3_execute(lh_sqlite3 *x, const lh_io_request *q, uint64_t (*now)(void));

/* Runs every pending request (drains lh_io_poll). */
void lh_sqlite3_run_requests(lh_sqlite3 *x, uint64_t (*now)(void));

/* Sleeps until the handle's deadline (at most max_ms), calls lh_timeout, runs the requests
 * that result. */
void lh_sqlite3_step(lh_sqlite3 *x, int max_ms, uint64_t (*now)(void));

/* Closes the connection (not the client). */
void lh_sqlite3_close(lh_sqlite3 *x);

#endif
