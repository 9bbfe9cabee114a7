/* lh_hiredis.c -- see lh_hiredis.h. */
#define _POSIX_C_SOURCE 200809L
#include "lh_hiredis.h"

#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void note(lh_hiredis *x, uint32_t st) {
    if (st != LH_OK && x->last_status == LH_OK) x->last_status = st;
}

int lh_hiredis_init(lh_hiredis *x, lh_client *client, const char *host, int port) {
    lh_hiredis_options o = {.host = host, .port = port};
    return lh_hiredis_init_options(x, client, &o);
}

static int copy_opt(char **dst, const char *src) {
    if (src == NULL) return 0;
    *dst = strdup(src);
    return *dst == NULL ? -1 : 0;
}

int lh_hiredis_init_options(lh_hiredis *x, lh_client *client, const lh_hiredis_options *o) {
    memset(x, 0, sizeof *x);
    if (o == NULL) return -1;
    const char *host = o->host != NULL ? o->host : "127.0.0.1";
    if (strlen(host) >= sizeof x->host) return -1;
    strcpy(x->host, host);
    x->client = client;
    x->port = o->port != 0 ? o->port : 6379;
    x->db = o->db;
    x->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 1000;
    if (copy_opt(&x->unix_socket, o->unix_socket) || copy_opt(&x->username, o->username) ||
        copy_opt(&x->password, o->password)) {
        lh_hiredis_close(x);
        return -1;
    }
    return 0;
}

static void failed_connect(lh_hiredis *x, redisContext *c, const char *what) {
    snprintf(x->last_error, sizeof x->last_error, "%.32s: %.200s", what,
             c == NULL ? "out of memory" : c->errstr);
    if (c != NULL) redisFree(c);
}

/* Runs one setup command (AUTH, SELECT); 0 when the server answered OK. */
static int setup(lh_hiredis *x, redisContext *c, int argc, const char **argv) {
    redisReply *r = redisCommandArgv(c, argc, argv, NULL);
    int ok = r != NULL && r->type == REDIS_REPLY_STATUS;
    if (!ok) {
        snprintf(x->last_error, sizeof x->last_error, "%.32s: %.200s", argv[0],
                 r == NULL ? c->errstr : r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    }
    if (r != NULL) freeReplyObject(r);
    return ok ? 0 : -1;
}

static redisContext *connect_to(lh_hiredis *x) {
    struct timeval tv = {.tv_sec = x->timeout_ms / 1000, .tv_usec = (x->timeout_ms % 1000) * 1000};
    redisContext *c = x->unix_socket != NULL ? redisConnectUnixWithTimeout(x->unix_socket, tv)
                                             : redisConnectWithTimeout(x->host, x->port, tv);
    if (c == NULL || c->err) {
        failed_connect(x, c, "connect");
        return NULL;
    }
    if (redisSetTimeout(c, tv) != REDIS_OK) {
        failed_connect(x, c, "timeout");
        return NULL;
    }
    const char *auth[3] = {"AUTH", x->username != NULL ? x->username : x->password, x->password};
    char db[16];
    snprintf(db, sizeof db, "%d", x->db);
    const char *sel[2] = {"SELECT", db};
    if ((x->password != NULL && setup(x, c, x->username != NULL ? 3 : 2, auth) != 0) ||
        (x->db != 0 && setup(x, c, 2, sel) != 0)) {
        redisFree(c);
        return NULL;
    }
    return c;
}

/* Flat pre-order list of values plus one data buffer (lh_io_reply's format). Once `bad` (out of
 * memory) nothing more is added and the reply is not delivered. */
typedef struct { lh_value *v; size_t n, cap; uint8_t *data; size_t len, dcap; int bad; } flat;

/* Appends one value; a capacity is recorded only after realloc succeeded. */
static void push_value(flat *f, uint32_t kind, int64_t integer, const char *s, size_t len) {
    if (f->bad) return;
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 8;
        lh_value *v = cap <= SIZE_MAX / sizeof *v ? realloc(f->v, cap * sizeof *v) : NULL;
        if (v == NULL) { f->bad = 1; return; }
        f->v = v;
        f->cap = cap;
    }
    if (s != NULL && len > f->dcap - f->len) {
        size_t dcap = len <= (SIZE_MAX - 64) / 2 - f->len ? 2 * (f->len + len) + 64 : 0;
        uint8_t *d = dcap != 0 ? realloc(f->data, dcap) : NULL;
        if (d == NULL) { f->bad = 1; return; }
        f->data = d;
        f->dcap = dcap;
    }
    lh_value *v = &f->v[f->n++];
    memset(v, 0, sizeof *v);
    v->kind = kind;
    v->integer = integer;
    v->len = (uint64_t)len;
    if (s != NULL) {
        v->offset = (uint64_t)f->len;
        if (len) memcpy(f->data + f->len, s, len);
        f->len += len;
    }
}

static void flatten(flat *f, const redisReply *r) {
    switch (r->type) {
    case REDIS_REPLY_INTEGER: push_value(f, LH_VALUE_INT, r->integer, NULL, 0); break;
    case REDIS_REPLY_STRING: push_value(f, LH_VALUE_BULK, 0, r->str, r->len); break;
    case REDIS_REPLY_STATUS: push_value(f, LH_VALUE_STATUS, 0, r->str, r->len); break;
    case REDIS_REPLY_ERROR: push_value(f, LH_VALUE_ERROR, 0, r->str, r->len); break;
    case REDIS_REPLY_ARRAY:
        push_value(f, LH_VALUE_ARRAY, 0, NULL, r->elements);
        for (size_t i = 0; i < r->elements && !f->bad; i++) flatten(f, r->element[i]);
        break;
    default: push_value(f, LH_VALUE_NIL, 0, NULL, 0); break;
    }
}

static void forget_channel(lh_hiredis *x, size_t i) {
    free(x->channels[i]);
    x->nchannels--;
    x->channels[i] = x->channels[x->nchannels];
    x->channel_lens[i] = x->channel_lens[x->nchannels];
}

/* The subscriber connection is gone: every channel on it is reported lost (the handle asks
 * for them again). */
static void lost_subscriber(lh_hiredis *x, uint64_t now) {
    if (x->sub != NULL) redisFree(x->sub);
    x->sub = NULL;
    while (x->nchannels > 0) {
        size_t i = x->nchannels - 1;
        note(x, lh_io_connection(x->client, now, LH_CONNECTION_NOTIFY, LH_CONNECTION_UNSUBSCRIBED,
                                 (const uint8_t *)x->channels[i], x->channel_lens[i]));
        forget_channel(x, i);
    }
}

static int word_is(const char *s, size_t len, const char *word) {
    return len == strlen(word) && strncasecmp(s, word, len) == 0;
}

/* Remembers a channel a (S)SUBSCRIBE asked for, to report it if the connection drops. */
static void remember_channel(lh_hiredis *x, const char *ch, size_t len) {
    for (size_t i = 0; i < x->nchannels; i++)
        if (x->channel_lens[i] == len && memcmp(x->channels[i], ch, len) == 0) return;
    if (x->nchannels == LH_HIREDIS_MAX_CHANNELS) return;
    char *copy = malloc(len + 1);
    if (copy == NULL) return;
    memcpy(copy, ch, len);
    copy[len] = 0;
    x->channels[x->nchannels] = copy;
    x->channel_lens[x->nchannels++] = len;
}

static void failed(lh_hiredis *x, uint64_t id, uint64_t now, const char *why) {
    note(x, lh_io_failed(x->client, now, id, LH_FAILURE_TRANSPORT, (const uint8_t *)why, strlen(why)));
}

static void run_command(lh_hiredis *x, const lh_io_request *q, uint64_t (*now)(void)) {
    const char *argv[LH_HIREDIS_MAX_ARGS];
    size_t lens[LH_HIREDIS_MAX_ARGS];
    if (q->argc == 0 || q->argc > LH_HIREDIS_MAX_ARGS) {
        failed(x, q->id, now(), "the command has no or too many arguments for this executor");
        return;
    }
    for (uint32_t i = 0; i < q->argc; i++) {
        argv[i] = (const char *)q->argv[i].ptr;
        lens[i] = q->argv[i].len;
    }
    if (q->connection == LH_CONNECTION_NOTIFY) {
        /* Only sent here: confirmations and messages arrive in lh_hiredis_step. */
        if (x->sub == NULL) x->sub = connect_to(x);
        int done = 0;
        if (x->sub != NULL && redisAppendCommandArgv(x->sub, (int)q->argc, argv, lens) == REDIS_OK) {
            while (redisBufferWrite(x->sub, &done) == REDIS_OK && !done) {}
        }
        if (!done) {
            failed(x, q->id, now(), x->last_error[0] ? x->last_error : "the subscriber connection failed");
            lost_subscriber(x, now());
        } else if (q->argc == 2 && (word_is(argv[0], lens[0], "SUBSCRIBE") || word_is(argv[0], lens[0], "SSUBSCRIBE"))) {
            remember_channel(x, argv[1], lens[1]);
        }
        return;
    }
    if (x->cmd == NULL) x->cmd = connect_to(x);
    redisReply *r = x->cmd != NULL ? redisCommandArgv(x->cmd, (int)q->argc, argv, lens) : NULL;
    if (r == NULL) {
        if (x->cmd != NULL) {
            snprintf(x->last_error, sizeof x->last_error, "command: %.200s", x->cmd->errstr);
            redisFree(x->cmd);
        }
        x->cmd = NULL;
        failed(x, q->id, now(), x->last_error);
        return;
    }
    flat f = {0};
    flatten(&f, r);
    freeReplyObject(r);
    /* A reply that did not fit in memory, or that the handle refused, is a transport failure
     * (the connection stays in step: hiredis read the whole reply). */
    uint32_t st = f.bad ? LH_ERR_INVALID_REPLY
                        : lh_io_reply(x->client, now(), q->id, f.v, f.n, f.data, f.len);
    if (st != LH_OK) failed(x, q->id, now(), f.bad ? "out of memory" : "the reply was refused");
    free(f.v);
    free(f.data);
}

void lh_hiredis_execute(lh_hiredis *x, const lh_io_request *q, uint64_t (*now)(void)) {
    switch (q->kind) {
    case LH_IO_NONE: return;
    case LH_IO_COMMAND: run_command(x, q, now); return;
    case LH_IO_HTTP_CANCEL: return; /* no answer expected */
    default: failed(x, q->id, now(), "the hiredis executor runs LH_IO_COMMAND requests only"); return;
    }
}

void lh_hiredis_run_requests(lh_hiredis *x, uint64_t (*now)(void)) {
    lh_io_request q;
    for (;;) {
        uint32_t st = lh_io_poll(x->client, &q);
        note(x, st);
        if (st != LH_OK || q.kind == LH_IO_NONE) return;
        lh_hiredis_execute(x, &q, now);
    }
}

/* One push on the subscriber: a message, or the confirmation of a (un)subscription. */
static void feed_push(lh_hiredis *x, const redisReply *r, uint64_t now) {
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 || r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_STRING)
        return;
    const redisReply *kind = r->element[0], *ch = r->element[1], *p = r->element[2];
    const char *k = kind->str;
    size_t kl = kind->len;
    if ((word_is(k, kl, "message") || word_is(k, kl, "smessage")) && p->type == REDIS_REPLY_STRING) {
        note(x, lh_io_message(x->client, now, (const uint8_t *)ch->str, ch->len, (const uint8_t *)p->str, p->len));
    } else if (word_is(k, kl, "subscribe") || word_is(k, kl, "ssubscribe")) {
        note(x, lh_io_connection(x->client, now, LH_CONNECTION_NOTIFY, LH_CONNECTION_SUBSCRIBED,
                                 (const uint8_t *)ch->str, ch->len));
    } else if (word_is(k, kl, "unsubscribe") || word_is(k, kl, "sunsubscribe")) {
        for (size_t i = 0; i < x->nchannels; i++) {
            if (x->channel_lens[i] == ch->len && memcmp(x->channels[i], ch->str, ch->len) == 0) {
                forget_channel(x, i);
                break;
            }
        }
        note(x, lh_io_connection(x->client, now, LH_CONNECTION_NOTIFY, LH_CONNECTION_UNSUBSCRIBED,
                                 (const uint8_t *)ch->str, ch->len));
    }
}

void lh_hiredis_step(lh_hiredis *x, int timeout_ms, uint64_t (*now)(void)) {
    lh_hiredis_run_requests(x, now);
    uint64_t deadline = LH_NO_DEADLINE, t = now();
    note(x, lh_poll_timeout(x->client, &deadline));
    if (deadline != LH_NO_DEADLINE) {
        uint64_t left_ms = deadline > t ? (deadline - t + 999999) / 1000000 : 0;
        if (left_ms < (uint64_t)timeout_ms) timeout_ms = (int)left_ms;
    }
    if (x->sub != NULL) {
        struct pollfd pfd = {.fd = x->sub->fd, .events = POLLIN};
        if (poll(&pfd, 1, timeout_ms) > 0) {
            if (redisBufferRead(x->sub) != REDIS_OK) {
                lost_subscriber(x, now());
            } else {
                void *r = NULL;
                while (redisGetReplyFromReader(x->sub, &r) == REDIS_OK && r != NULL) {
                    feed_push(x, r, now());
                    freeReplyObject(r);
                    r = NULL;
                }
            }
        }
    } else if (timeout_ms > 0) {
        poll(NULL, 0, timeout_ms);
    }
    t = now();
    note(x, lh_poll_timeout(x->client, &deadline));
    if (deadline != LH_NO_DEADLINE && deadline <= t) note(x, lh_timeout(x->client, t));
    lh_hiredis_run_requests(x, now);
}

void lh_hiredis_close(lh_hiredis *x) {
    if (x->cmd != NULL) redisFree(x->cmd);
    if (x->sub != NULL) redisFree(x->sub);
    for (size_t i = 0; i < x->nchannels; i++) free(x->channels[i]);
    free(x->unix_socket);
    free(x->username);
    free(x->password);
    x->unix_socket = x->username = x->password = NULL;
    x->cmd = x->sub = NULL;
    x->nchannels = 0;
}
