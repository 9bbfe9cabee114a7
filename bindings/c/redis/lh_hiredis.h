/*
 * lh_hiredis.h -- a thin Redis executor for a leasehold handle created with
 * lh_client_new_redis(): it runs the handle's requests verbatim on two hiredis connections
 * (commands, subscriber) and hands replies, pub/sub messages and subscription changes back
 * unread. It knows no key, script, argument or reply meaning: the core does.
 *
 * Not thread-safe (like the handle). Blocking: each command runs synchronously on the
 * commands connection, which is fine for a C example host and its tests; an event-loop host
 * would use hiredis' async API with the same calls into leasehold.
 */
#ifndef LH_HIREDIS_H
#define LH_HIREDIS_H

#include <stdint.h>
#include <hiredis/hiredis.h>

#include "leasehold.h"

#define LH_HIREDIS_MAX_CHANNELS 8

typedef struct lh_hiredis {
    lh_client *client;
    char host[64];
    int port;
    redisContext *cmd;  /* commands connection (reconnected on demand) */
    redisContext *sub;  /* subscriber connection (reconnected on demand) */
    /* Channels subscribed on `sub`, to report them lost if the connection drops. */
    char *channels[LH_HIREDIS_MAX_CHANNELS];
    size_t nchannels;
    uint32_t last_status; /* first non-LH_OK status from the library, 0 if none */
} lh_hiredis;

/* Connects both connections lazily; returns 0 (the struct is filled, nothing else to free
 * until lh_hiredis_close). */
int lh_hiredis_init(lh_hiredis *x, lh_client *client, const char *host, int port);

/* Runs every pending request (drains lh_poll_request). */
void lh_hiredis_run_requests(lh_hiredis *x, uint64_t (*now)(void));

/* Waits up to timeout_ms for subscriber traffic and feeds what arrived; then, if the
 * handle's deadline passed, calls lh_timeout. Runs the requests that result. */
void lh_hiredis_step(lh_hiredis *x, int timeout_ms, uint64_t (*now)(void));

/* Frees both connections (not the client). */
void lh_hiredis_close(lh_hiredis *x);

#endif
