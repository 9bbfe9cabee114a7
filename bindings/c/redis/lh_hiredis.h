/*
 * lh_hiredis.h -- a thin Redis executor for a leasehold handle created with lh_client_new()
 * and an lh_backend_options of kind LH_BACKEND_REDIS: it runs the handle's LH_IO_COMMAND
 * requests verbatim on two hiredis connections (LH_CONNECTION_COMMANDS, and the subscriber,
 * LH_CONNECTION_NOTIFY) and hands replies (lh_io_reply), failures (lh_io_failed), pub/sub
 * messages (lh_io_message) and subscription changes (lh_io_connection) back unread. It knows
 * no key, script, argument or reply meaning: the core does.
 *
 * Not thread-safe (like the handle). Blocking: each command runs synchronously on the
 * commands connection, bounded by the options' timeout, which is fine for a C example host
 * and its tests; an event-loop host would use hiredis' async API with the same calls into
 * leasehold.
 *
 * TLS: Debian's libhiredis-dev (0.14) ships no hiredis_ssl, so there is no TLS option; use a
 * Unix socket or a local TLS proxy (stunnel, spiped).
 */
#ifndef LH_HIREDIS_H
#define LH_HIREDIS_H

#include <stdint.h>
#include <hiredis/hiredis.h>

#include "leasehold.h"

#define LH_HIREDIS_MAX_CHANNELS 8
/* Most arguments of one command (the core's longest script call has far fewer). */
#define LH_HIREDIS_MAX_ARGS 64

/* Where and how to connect; every connection (commands, subscriber, reconnects) gets the same
 * setup. Zero-initialise, then set what you need. */
typedef struct lh_hiredis_options {
    const char *host;        /* TCP host (default "127.0.0.1"); ignored with unix_socket */
    int port;                /* TCP port (default 6379) */
    const char *unix_socket; /* non-NULL: connect to this path instead of host:port */
    const char *username;    /* ACL user (AUTH username password); NULL: AUTH password */
    const char *password;    /* NULL: no AUTH */
    int db;                  /* SELECT db on each connection when non-zero */
    int timeout_ms;          /* connect and per-command bound (default 1000): a hung server
                                becomes a transport failure the core retries, not a hang */
} lh_hiredis_options;

typedef struct lh_hiredis {
    lh_client *client;
    char host[64];
    int port;
    char *unix_socket, *username, *password; /* owned copies, NULL when unset */
    int db;
    int timeout_ms;
    redisContext *cmd;  /* LH_CONNECTION_COMMANDS (reconnected on demand) */
    redisContext *sub;  /* LH_CONNECTION_NOTIFY, the subscriber (reconnected on demand) */
    /* Channels subscribed (or being subscribed) on `sub`, to report them lost if it drops. */
    char *channels[LH_HIREDIS_MAX_CHANNELS];
    size_t channel_lens[LH_HIREDIS_MAX_CHANNELS];
    size_t nchannels;
    uint32_t last_status; /* first non-LH_OK status from the library, 0 if none */
    char last_error[256]; /* the last connection failure ("" if none), for diagnostics */
} lh_hiredis;

/* Connects both connections lazily; returns 0 (the struct is filled, nothing else to free
 * until lh_hiredis_close). The same as lh_hiredis_init_options with only host and port. */
int lh_hiredis_init(lh_hiredis *x, lh_client *client, const char *host, int port);

/* Like lh_hiredis_init with every connection option; returns 0, or -1 (nothing to free) when
 * `o` is NULL, a string is too long, or memory runs out. */
int lh_hiredis_init_options(lh_hiredis *x, lh_client *client, const lh_hiredis_options *o);

/* Runs one request polled from the handle (lh_io_poll) and answers it. A request of another
 * kind than LH_IO_COMMAND is answered as a transport failure (this executor cannot run it). */
void lh_hiredis_execute(lh_hiredis *x, const lh_io_request *q, uint64_t (*now)(void));

/* Runs every pending request (drains lh_io_poll). */
void lh_hiredis_run_requests(lh_hiredis *x, uint64_t (*now)(void));

/* Waits up to timeout_ms for subscriber traffic and feeds what arrived; then, if the
 * handle's deadline passed, calls lh_timeout. Runs the requests that result. */
void lh_hiredis_step(lh_hiredis *x, int timeout_ms, uint64_t (*now)(void));

/* Frees both connections and the option copies (not the client). */
void lh_hiredis_close(lh_hiredis *x);

#endif
