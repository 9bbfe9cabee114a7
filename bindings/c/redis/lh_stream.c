/* lh_stream.c -- see lh_stream.h. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include "lh_stream.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>
#ifdef LH_STREAM_OPENSSL
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#endif

enum { CONNECTING = 1, HANDSHAKE = 2, OPEN = 3 };

static void note(lh_stream_host *h, uint32_t st) {
    if (st != LH_OK && h->last_status == LH_OK) h->last_status = st;
}

void lh_stream_init(lh_stream_host *h, lh_client *client) {
    memset(h, 0, sizeof *h);
    h->client = client;
}

/* Doubles the slots (LH_STREAM_MAX at first): 0 done, -1 out of memory (nothing changed). */
static int grow(lh_stream_host *h) {
    size_t n = h->conns_len ? 2 * h->conns_len : LH_STREAM_MAX;
    lh_stream_conn **conns = realloc(h->conns, n * sizeof *conns);
    if (conns == NULL) return -1;
    h->conns = conns;
    struct pollfd *polls = realloc(h->polls, n * sizeof *polls);
    if (polls == NULL) return -1;
    h->polls = polls;
    lh_stream_conn **polled = realloc(h->polled, n * sizeof *polled);
    if (polled == NULL) return -1;
    h->polled = polled;
    for (size_t i = h->conns_len; i < n; i++) {
        if ((conns[i] = calloc(1, sizeof **conns)) == NULL) return -1;
        conns[i]->fd = -1;
        h->conns_len = i + 1;
    }
    return 0;
}

/* Forgets a stream without reporting it (a SHUTDOWN, or before lh_io_closed). */
static void drop(lh_stream_conn *s) {
#ifdef LH_STREAM_OPENSSL
    if (s->ssl != NULL) SSL_free(s->ssl);
#endif
    if (s->fd >= 0) close(s->fd);
    if (s->addrs != NULL) freeaddrinfo(s->addrs);
    free(s->out);
    memset(s, 0, sizeof *s);
    s->fd = -1;
}

static void closed(lh_stream_host *h, uint64_t id, uint64_t now, const char *why) {
    if (why != h->last_error) snprintf(h->last_error, sizeof h->last_error, "%s", why);
    note(h, lh_io_closed(h->client, now, id, (const uint8_t *)h->last_error, strlen(h->last_error)));
}

static void fail(lh_stream_host *h, lh_stream_conn *s, uint64_t now, const char *why) {
    uint64_t id = s->id;
    snprintf(h->last_error, sizeof h->last_error, "%s", why);
    drop(s);
    closed(h, id, now, h->last_error);
}

/* Starts connecting to the next address of the list: 0 under way, else errno. */
static int try_next(lh_stream_conn *s) {
    int err = EADDRNOTAVAIL;
    for (struct addrinfo *a = s->next; a != NULL; a = s->next) {
        s->next = a->ai_next;
        if (s->fd >= 0) close(s->fd);
        s->fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (s->fd < 0) { err = errno; continue; }
        int one = 1;
        setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(s->fd, a->ai_addr, a->ai_addrlen) == 0 || errno == EINPROGRESS) return 0;
        err = errno;
    }
    return err;
}

/* Moves bytes: n > 0, 0 at the stream's end, -1 when it would block, -2 on failure (*why). */
static ssize_t xfer(lh_stream_conn *s, void *buf, size_t n, int writing, const char **why) {
#ifdef LH_STREAM_OPENSSL
    if (s->ssl != NULL) {
        ERR_clear_error();
        int r = writing ? SSL_write(s->ssl, buf, (int)n) : SSL_read(s->ssl, buf, (int)n);
        if (r > 0) return r;
        int e = SSL_get_error(s->ssl, r);
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return -1;
        if (e == SSL_ERROR_ZERO_RETURN) return 0;
        const char *m = ERR_reason_error_string(ERR_get_error());
        *why = m != NULL ? m : errno != 0 ? strerror(errno) : "TLS failure";
        return -2;
    }
#endif
    ssize_t r = writing ? send(s->fd, buf, n, MSG_NOSIGNAL) : recv(s->fd, buf, n, 0);
    if (r >= 0) return r;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return -1;
    *why = strerror(errno);
    return -2;
}

static void flush(lh_stream_host *h, lh_stream_conn *s, uint64_t now) {
    while (s->out_len > 0) {
        const char *why = "write failed";
        ssize_t n = xfer(s, s->out, s->out_len, 1, &why);
        if (n == -1) return;
        if (n <= 0) { fail(h, s, now, why); return; }
        memmove(s->out, s->out + n, s->out_len - (size_t)n);
        s->out_len -= (size_t)n;
    }
}

/* (the clock is read only when a failure is reported) */
static void write_stream(lh_stream_host *h, lh_stream_conn *s, const uint8_t *p, size_t n, uint64_t (*now)(void)) {
    if (s->out_len == 0 && s->state == OPEN && n > 0) {  /* the common case: the socket takes it all */
        const char *why = "write failed";
        ssize_t w = xfer(s, (void *)p, n, 1, &why);
        if (w == -2 || w == 0) { fail(h, s, now(), why); return; }
        if (w > 0) p += w, n -= (size_t)w;
    }
    if (n == 0) return;
    if (s->out_len + n > s->out_cap) {
        size_t cap = (s->out_len + n) * 2;
        uint8_t *o = realloc(s->out, cap);
        if (o == NULL) { fail(h, s, now(), "out of memory"); return; }
        s->out = o, s->out_cap = cap;
    }
    memcpy(s->out + s->out_len, p, n);
    s->out_len += n;
}

static void read_stream(lh_stream_host *h, lh_stream_conn *s, uint64_t now) {
    uint8_t buf[65536];
    for (;;) {
        const char *why = "read failed";
        ssize_t n = xfer(s, buf, sizeof buf, 0, &why);
        if (n == -1) return;
        if (n <= 0) { fail(h, s, now, n == 0 ? "end of stream" : why); return; }
        note(h, lh_io_received(h->client, now, s->id, buf, (size_t)n));
        if (s->ssl == NULL && (size_t)n < sizeof buf) return;  /* TLS may hold more than poll sees */
    }
}

static void handshake(lh_stream_host *h, lh_stream_conn *s, uint64_t now) {
#ifdef LH_STREAM_OPENSSL
    ERR_clear_error();
    int r = SSL_connect(s->ssl);
    if (r == 1) {
        s->state = OPEN;
        note(h, lh_io_opened(h->client, now, s->id));
        return;
    }
    int e = SSL_get_error(s->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return;
    long v = SSL_get_verify_result(s->ssl);
    const char *m = v != X509_V_OK ? X509_verify_cert_error_string(v) : ERR_reason_error_string(ERR_get_error());
    char msg[200];
    snprintf(msg, sizeof msg, "TLS handshake: %s", m != NULL ? m : "failed");
    fail(h, s, now, msg);
#else
    fail(h, s, now, "TLS is not built in");
#endif
}

static void connected(lh_stream_host *h, lh_stream_conn *s, uint64_t now) {
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
        int next = try_next(s);
        if (next == 0) return; /* the next address: still connecting */
        char msg[128];
        snprintf(msg, sizeof msg, "connect: %s", strerror(next == EADDRNOTAVAIL ? err : next));
        fail(h, s, now, msg);
        return;
    }
    freeaddrinfo(s->addrs);
    s->addrs = s->next = NULL;
#ifdef LH_STREAM_OPENSSL
    if (s->ssl != NULL) {
        SSL_set_fd(s->ssl, s->fd);
        s->state = HANDSHAKE;
        handshake(h, s, now);
        return;
    }
#endif
    s->state = OPEN;
    note(h, lh_io_opened(h->client, now, s->id));
}

#ifdef LH_STREAM_OPENSSL
static void *tls_for(lh_stream_host *h, const char *server_name) {
    if (h->tls_ctx == NULL) {
        SSL_CTX *c = SSL_CTX_new(TLS_client_method());
        if (c == NULL) return NULL;
        SSL_CTX_set_verify(c, SSL_VERIFY_PEER, NULL);
        SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
        if ((h->ca_file != NULL ? SSL_CTX_load_verify_locations(c, h->ca_file, NULL) : SSL_CTX_set_default_verify_paths(c)) != 1) {
            SSL_CTX_free(c);
            return NULL;
        }
        h->tls_ctx = c;
    }
    SSL *ssl = SSL_new(h->tls_ctx);
    struct in6_addr ip;
    int literal = inet_pton(AF_INET, server_name, &ip) == 1 || inet_pton(AF_INET6, server_name, &ip) == 1;
    if (ssl != NULL && (literal ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), server_name) != 1 /* no SNI */
                                : SSL_set_tlsext_host_name(ssl, server_name) != 1 || SSL_set1_host(ssl, server_name) != 1)) {
        SSL_free(ssl);
        ssl = NULL;
    }
    return ssl;
}
#endif

static void open_stream(lh_stream_host *h, const lh_io_request *q, uint64_t now) {
    lh_stream_conn *s = NULL;
    for (size_t i = 0; i < h->conns_len && s == NULL; i++)
        if (h->conns[i]->id == 0) s = h->conns[i];
    if (s == NULL) {
        size_t first = h->conns_len;
        if (grow(h) != 0 || h->conns_len == first) { closed(h, q->stream, now, "out of memory for a stream"); return; }
        s = h->conns[first];
    }
    char msg[200];
    drop(s);
    s->id = q->stream;
    s->deadline = q->deadline;
    s->state = CONNECTING;
    if (q->unix_path != NULL) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        if (strlen(q->unix_path) >= sizeof a.sun_path) { fail(h, s, now, "unix socket path too long"); return; }
        strcpy(a.sun_path, q->unix_path);
        s->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s->fd < 0 || connect(s->fd, (struct sockaddr *)&a, sizeof a) != 0 || fcntl(s->fd, F_SETFL, O_NONBLOCK) != 0) {
            snprintf(msg, sizeof msg, "connect %.120s: %s", q->unix_path, strerror(errno));
            fail(h, s, now, msg);
            return;
        }
        s->state = OPEN;
        note(h, lh_io_opened(h->client, now, s->id));
        return;
    }
    if (q->tls) {
#ifdef LH_STREAM_OPENSSL
        if ((s->ssl = tls_for(h, q->server_name)) == NULL) { fail(h, s, now, "TLS setup failed (OpenSSL context or CA file)"); return; }
#else
        fail(h, s, now, "TLS is not built in (lh_stream.c without OpenSSL): a rediss:// stream cannot be opened");
        return;
#endif
    }
    char port[12];
    snprintf(port, sizeof port, "%u", q->port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *list = NULL;
    int rc = getaddrinfo(q->host, port, &hints, &list);
    if (rc != 0) {
        snprintf(msg, sizeof msg, "resolve %.120s: %s", q->host, gai_strerror(rc));
        fail(h, s, now, msg);
        return;
    }
    s->addrs = s->next = list;
    if ((rc = try_next(s)) != 0) {
        snprintf(msg, sizeof msg, "connect %.120s:%s: %s", q->host, port, strerror(rc));
        fail(h, s, now, msg);
    }
}

static lh_stream_conn *find(lh_stream_host *h, uint64_t id) {
    for (size_t i = 0; i < h->conns_len; i++)
        if (id != 0 && h->conns[i]->id == id) return h->conns[i];
    return NULL;
}

void lh_stream_execute(lh_stream_host *h, const lh_io_request *q, uint64_t (*now)(void)) {
    lh_stream_conn *s = find(h, q->stream);
    if (q->kind == LH_IO_OPEN) {
        open_stream(h, q, now());
    } else if (q->kind == LH_IO_WRITE) {
        if (s != NULL) write_stream(h, s, q->data, q->data_len, now); /* else: reported closed already */
    } else if (q->kind == LH_IO_SHUTDOWN) {
        if (s != NULL) drop(s);
    } else if (q->kind != LH_IO_NONE) {
        static const char why[] = "lh_stream runs only streams (LH_BACKEND_REDIS_STREAM)";
        note(h, lh_io_failed(h->client, now(), q->id, LH_FAILURE_TRANSPORT, (const uint8_t *)why, sizeof why - 1));
    }
}

void lh_stream_run_requests(lh_stream_host *h, uint64_t (*now)(void)) {
    lh_io_request q;
    uint32_t st;
    while ((st = lh_io_poll(h->client, &q)) == LH_OK && q.kind != LH_IO_NONE) lh_stream_execute(h, &q, now);
    note(h, st);
}

void lh_stream_step(lh_stream_host *h, int timeout_ms, uint64_t (*now)(void)) {
    lh_stream_run_requests(h, now);
    uint64_t t = now(), due = LH_NO_DEADLINE;
    note(h, lh_poll_timeout(h->client, &due));
    uint64_t deadline = due;
    /* (no request runs until the loop below is done: the slots and these arrays stay put) */
    struct pollfd *p = h->polls;
    lh_stream_conn **who = h->polled;
    nfds_t n = 0;
    for (size_t i = 0; i < h->conns_len; i++) {
        lh_stream_conn *s = h->conns[i];
        if (s->id == 0) continue;
        short ev = s->state == CONNECTING ? POLLOUT : (short)(POLLIN | (s->out_len > 0 ? POLLOUT : 0));
#ifdef LH_STREAM_OPENSSL
        if (s->state == HANDSHAKE) ev = SSL_want_write((SSL *)s->ssl) ? POLLOUT : POLLIN;
#endif
        if (s->state != OPEN && s->deadline < deadline) deadline = s->deadline;
        p[n] = (struct pollfd){.fd = s->fd, .events = ev};
        who[n++] = s;
    }
    if (deadline != LH_NO_DEADLINE) {
        uint64_t left_ms = deadline > t ? (deadline - t + 999999) / 1000000 : 0;
        if (left_ms < (uint64_t)timeout_ms) timeout_ms = (int)left_ms;
    }
    int ready = poll(p, n, timeout_ms);
    t = now();
    for (nfds_t i = 0; ready > 0 && i < n; i++) {
        lh_stream_conn *s = who[i];
        if (p[i].revents == 0 || s->id == 0) continue;
        if (s->state == CONNECTING) {
            connected(h, s, t);
        } else if (s->state == HANDSHAKE) {
            handshake(h, s, t);
        } else {
            if (p[i].revents & POLLOUT) flush(h, s, t);
            if (s->id != 0 && (p[i].revents & (POLLIN | POLLHUP | POLLERR))) read_stream(h, s, t);
        }
    }
    for (size_t i = 0; i < h->conns_len; i++) {
        lh_stream_conn *s = h->conns[i];
        if (s->id != 0 && s->state != OPEN && s->deadline <= t)
            fail(h, s, t, s->state == HANDSHAKE ? "TLS handshake timed out" : "connect timed out");
    }
    /* The handle's deadline as it was before the wait: one that what came brought forward is
     * due at the next step, whose wait it shortens (one call less on the way to the next write). */
    if (due <= t) note(h, lh_timeout(h->client, t));
    lh_stream_run_requests(h, now);
}

void lh_stream_close(lh_stream_host *h) {
    for (size_t i = 0; i < h->conns_len; i++) {
        drop(h->conns[i]);
        free(h->conns[i]);
    }
    free(h->conns);
    free(h->polls);
    free(h->polled);
    h->conns = h->polled = NULL;
    h->polls = NULL;
    h->conns_len = 0;
#ifdef LH_STREAM_OPENSSL
    SSL_CTX_free(h->tls_ctx);
#endif
    h->tls_ctx = NULL;
}
