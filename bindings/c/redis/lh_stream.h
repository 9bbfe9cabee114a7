/*
 * lh_stream.h -- a byte-moving host for a leasehold handle of kind LH_BACKEND_REDIS_STREAM.
 *
 * The core owns the Redis wire (the URL in lh_backend_options.redis_url, the handshake, the
 * scripts, the subscriber, the reconnects). This host only runs its stream requests on POSIX
 * sockets: LH_IO_OPEN (a nonblocking connect to host:port with TCP_NODELAY, or to a Unix
 * socket, given up at req.deadline; TLS with the server name when req.tls), LH_IO_WRITE (in
 * order; what the socket does not take at once waits for it) and LH_IO_SHUTDOWN; every read
 * goes to lh_io_received, a stream's end or failure to lh_io_closed with the reason. It knows
 * no Redis command.
 *
 * TLS: built with OpenSSL when LH_STREAM_OPENSSL is defined (the Makefile defines it when
 * <openssl/ssl.h> is present; link -lssl -lcrypto); the certificate is verified against the
 * system's CAs (or `ca_file`) and the server name. Built without it, an OPEN with TLS is
 * answered with lh_io_closed("TLS is not built in ...") and the core retries with backoff.
 *
 * Single-threaded, not thread-safe (like the handle): the program calls lh_stream_step in a
 * loop (it waits with poll(2) over the streams and the handle's deadline, then feeds what came)
 * and reads events with lh_poll_event between steps.
 */
#ifndef LH_STREAM_H
#define LH_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "leasehold.h"

/* The stream slots made at first: a single server's commands and subscriber. Their number
 * doubles when the core opens more at once (a reconnect; Sentinel: a query per sentinel; a
 * Cluster: two per master and a topology query). */
#define LH_STREAM_MAX 2

typedef struct lh_stream_conn {
    uint64_t id;        /* the core's stream id, 0 when the slot is free */
    int fd;
    int state;          /* 1 connecting, 2 TLS handshake, 3 open */
    uint64_t deadline;  /* OPEN: give up connecting then */
    void *addrs, *next; /* struct addrinfo list being tried */
    void *ssl;          /* SSL * with LH_STREAM_OPENSSL */
    uint8_t *out;       /* bytes written but not yet taken by the socket */
    size_t out_len, out_cap;
} lh_stream_conn;

typedef struct lh_stream_host {
    lh_client *client;
    lh_stream_conn **conns; /* the slots, each its own allocation (a slot never moves) */
    size_t conns_len;
    void *polls;            /* struct pollfd[conns_len], and the slot of each below */
    lh_stream_conn **polled;
    const char *ca_file;  /* TLS: extra CA file (PEM) to trust, NULL for the system's */
    void *tls_ctx;        /* SSL_CTX *, made on the first TLS stream */
    uint32_t last_status; /* first non-LH_OK status from the library, 0 if none */
    char last_error[256]; /* the last stream failure ("" if none), for diagnostics */
} lh_stream_host;

/* Fills `h` for `client` (what it allocates is freed by lh_stream_close). */
void lh_stream_init(lh_stream_host *h, lh_client *client);

/* Runs one request polled from the handle (lh_io_poll). A request of another kind than a
 * stream's is answered as a transport failure (this host cannot run it). */
void lh_stream_execute(lh_stream_host *h, const lh_io_request *q, uint64_t (*now)(void));

/* Runs every pending request (drains lh_io_poll). */
void lh_stream_run_requests(lh_stream_host *h, uint64_t (*now)(void));

/* Runs the pending requests, waits up to timeout_ms (less when the handle's deadline or a
 * connect deadline comes first) for the streams, feeds what came (lh_io_opened / _received /
 * _closed), calls lh_timeout when the handle's deadline passed, and runs the requests that
 * result. Events are left for lh_poll_event. */
void lh_stream_step(lh_stream_host *h, int timeout_ms, uint64_t (*now)(void));

/* Closes every stream without reporting (not the client). */
void lh_stream_close(lh_stream_host *h);

#endif
