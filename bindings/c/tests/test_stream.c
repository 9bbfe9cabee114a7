/*
 * test_stream.c -- the byte-moving host (redis/lh_stream.c) for LH_BACKEND_REDIS_STREAM against
 * a real redis-server this test starts on a free loopback port (and a Unix socket) and stops by
 * pid: acquire/release with strictly increasing fences, two clients contending where the waiter
 * is woken by the holder's release, a server killed and restarted under a client that
 * reconnects by itself, a Unix socket URL, bad URLs / unreachable servers / TLS refused with
 * a clear reason, and (built with OpenSSL) a lock over rediss:// with the test's own CA; then a
 * Redis Cluster (scripts/redis-cluster-test.sh: 3 masters, 3 replicas, run from bindings/c)
 * through a redis+cluster:// URL: names on every master, and a waiter woken by the holder's
 * release on the name's shard channel. Without redis-server the test is skipped, except under
 * CI=true.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lh_stream.h"

#define MS 1000000ull

static int failures;
#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            failures++;                                                    \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
        }                                                                  \
    } while (0)

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int free_port(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(s, (struct sockaddr *)&a, &len) != 0)
        return -1;
    close(s);
    return ntohs(a.sin_port);
}

/* A raw PING on the socket until +PONG: the server is up. */
static int server_up(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char buf[16] = {0};
    int ok = s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) == 0 && write(s, "PING\r\n", 6) == 6 &&
             read(s, buf, sizeof buf - 1) > 0 && strncmp(buf, "+PONG", 5) == 0;
    if (s >= 0) close(s);
    return ok;
}

static pid_t start_server(int port, const char *unix_path) {
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *null = fopen("/dev/null", "w");
        if (null != NULL) {
            dup2(fileno(null), 1);
            dup2(fileno(null), 2);
        }
        execlp("redis-server", "redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--unixsocket", unix_path, "--unixsocketperm", "700", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 500; i++) {
        if (server_up(port)) return pid;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static void stop_server(pid_t pid) {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* A client of the stream kind with its host and the events it has seen. */
typedef struct {
    lh_client *c;
    lh_stream_host h;
    lh_event ev[512];
    size_t nev;
} host;

static uint32_t host_new(host *x, const char *url, int salt) {
    memset(x, 0, sizeof *x);
    uint8_t seed[32];
    for (size_t i = 0; i < sizeof seed; i++) seed[i] = (uint8_t)(getpid() * 13 + salt * 7 + i * 3);
    lh_config cfg;
    lh_config_default(&cfg);
    lh_backend_options b;
    lh_backend_options_default(LH_BACKEND_REDIS_STREAM, &b);
    b.redis_url = (const uint8_t *)url;
    b.redis_url_len = strlen(url);
    b.redis_connect_timeout_ms = 1000;
    b.redis_request_timeout_ms = 1000;
    uint32_t st = lh_client_new(&cfg, &b, seed, sizeof seed, &x->c);
    if (st == LH_OK) lh_stream_init(&x->h, x->c);
    return st;
}

static void step(host *x, int ms) {
    lh_stream_step(&x->h, ms, now_ns);
    lh_event e;
    while (lh_poll_event(x->c, &e) == LH_OK && e.kind != LH_EVENT_NONE)
        if (x->nev < sizeof x->ev / sizeof x->ev[0]) x->ev[x->nev++] = e;
}

static const lh_event *find_ev(host *x, uint64_t lease, uint32_t kind) {
    for (size_t i = 0; i < x->nev; i++)
        if (x->ev[i].lease_id == lease && x->ev[i].kind == kind) return &x->ev[i];
    return NULL;
}

/* Steps `x` (and `y`, when not NULL) until `lease` has an event of `kind`, for at most `ms`. */
static const lh_event *wait_ev(host *x, host *y, uint64_t lease, uint32_t kind, int ms) {
    uint64_t until = now_ns() + (uint64_t)ms * MS;
    while (now_ns() < until) {
        step(x, y != NULL ? 1 : 10);
        if (y != NULL) step(y, 1);
        const lh_event *e = find_ev(x, lease, kind);
        if (e != NULL) return e;
        if (kind == LH_EVENT_ACQUIRED && find_ev(x, lease, LH_EVENT_ACQUIRE_FAILED) != NULL) return NULL;
    }
    return NULL;
}

static uint64_t acquire(host *x, const char *name, uint64_t ttl_ms, uint64_t wait_ms) {
    lh_acquire_options o;
    lh_acquire_options_default(&o);
    o.ttl_ms = ttl_ms;
    o.wait_ns = wait_ms * MS;
    uint64_t lease = 0;
    uint32_t st = lh_acquire(x->c, now_ns(), (const uint8_t *)name, strlen(name), &o, &lease);
    CHECK(st == LH_OK, "lh_acquire: %s", lh_status_str(st));
    lh_stream_run_requests(&x->h, now_ns);
    return lease;
}

/* Releases `lease` and waits for the service's confirmation. */
static int release_confirmed(host *x, host *y, uint64_t lease) {
    uint32_t how = 0;
    uint32_t st = lh_release(x->c, now_ns(), lease, &how);
    CHECK(st == LH_OK && how == LH_RELEASING_PENDING, "lh_release: %s, releasing %u", lh_status_str(st), how);
    lh_stream_run_requests(&x->h, now_ns);
    const lh_event *e = wait_ev(x, y, lease, LH_EVENT_RELEASE_OUTCOME, 3000);
    return e != NULL && e->reason == LH_REASON_RELEASE_CONFIRMED;
}

static void host_free(host *x) {
    if (x->c == NULL) return;
    lh_io_close(x->c, now_ns());
    lh_counters k = {.struct_size = sizeof k};
    for (int i = 0; i < 200 && lh_counters_get(x->c, &k) == LH_OK && k.pending_cleanups > 0; i++) step(x, 5);
    lh_stream_close(&x->h);
    lh_client_free(x->c);
    x->c = NULL;
}

static lh_counters counters(host *x) {
    lh_counters k = {.struct_size = sizeof k};
    lh_counters_get(x->c, &k);
    return k;
}

static void test_fences(const char *url) {
    host a;
    CHECK(host_new(&a, url, 1) == LH_OK, "client for %s", url);
    uint64_t last = 0;
    for (int round = 0; round < 5; round++) {
        uint64_t lease = acquire(&a, "c-stream-fences", 5000, 3000);
        const lh_event *e = wait_ev(&a, NULL, lease, LH_EVENT_ACQUIRED, 5000);
        CHECK(e != NULL, "round %d not acquired on %s: %s", round, url, lh_backend_last_error(a.c));
        if (e == NULL) break;
        CHECK(e->fencing_token > last, "fence %llu after %llu", (unsigned long long)e->fencing_token,
              (unsigned long long)last);
        last = e->fencing_token;
        CHECK(release_confirmed(&a, NULL, lease), "round %d release not confirmed", round);
    }
    CHECK(a.h.last_status == LH_OK, "library status %s", lh_status_str(a.h.last_status));
    host_free(&a);
}

static void test_contend(const char *url) {
    host a, b;
    CHECK(host_new(&a, url, 2) == LH_OK && host_new(&b, url, 3) == LH_OK, "clients");
    /* b's subscriber is up before it waits, so the release can wake it. */
    uint64_t until = now_ns() + 3000 * MS;
    while (counters(&b).redis_subscribed == 0 && now_ns() < until) step(&b, 5);
    uint64_t la = acquire(&a, "c-stream-contend", 10000, 1000);
    const lh_event *ea = wait_ev(&a, NULL, la, LH_EVENT_ACQUIRED, 3000);
    CHECK(ea != NULL, "a not acquired: %s", lh_backend_last_error(a.c));
    uint64_t fa = ea != NULL ? ea->fencing_token : 0;
    uint64_t lb = acquire(&b, "c-stream-contend", 10000, 8000);
    CHECK(wait_ev(&b, &a, lb, LH_EVENT_ACQUIRED, 300) == NULL, "b acquired while a holds");
    uint64_t wakeups = counters(&b).backend_wakeups;
    uint64_t t0 = now_ns();
    CHECK(release_confirmed(&a, &b, la), "a's release not confirmed");
    const lh_event *eb = wait_ev(&b, &a, lb, LH_EVENT_ACQUIRED, 5000);
    CHECK(eb != NULL, "b not acquired after a's release: %s", lh_backend_last_error(b.c));
    if (eb != NULL) {
        CHECK(eb->fencing_token > fa, "b's fence %llu after a's %llu", (unsigned long long)eb->fencing_token,
              (unsigned long long)fa);
        CHECK(now_ns() - t0 < 2000 * MS, "b took %llu ms after the release", (unsigned long long)((now_ns() - t0) / MS));
        CHECK(counters(&b).backend_wakeups > wakeups, "b was not woken by the release notification");
        CHECK(release_confirmed(&b, &a, lb), "b's release not confirmed");
    }
    host_free(&a);
    host_free(&b);
}

static void test_restart(int port, const char *unix_path, pid_t *server) {
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    host a;
    CHECK(host_new(&a, url, 4) == LH_OK, "client");
    uint64_t lease = acquire(&a, "c-stream-restart", 5000, 3000);
    CHECK(wait_ev(&a, NULL, lease, LH_EVENT_ACQUIRED, 3000) != NULL, "not acquired before the restart");
    CHECK(release_confirmed(&a, NULL, lease), "release before the restart");
    stop_server(*server);
    for (int i = 0; i < 30; i++) step(&a, 10); /* the client sees both streams end */
    CHECK(strlen(lh_backend_last_error(a.c)) > 0, "no reason after the server died");
    CHECK(counters(&a).redis_subscribed == 0, "still subscribed after the server died");
    *server = start_server(port, unix_path);
    CHECK(*server > 0, "redis-server did not restart");
    lease = acquire(&a, "c-stream-restart", 5000, 8000);
    const lh_event *e = wait_ev(&a, NULL, lease, LH_EVENT_ACQUIRED, 10000);
    CHECK(e != NULL, "not acquired after the restart: %s", lh_backend_last_error(a.c));
    uint64_t until = now_ns() + 3000 * MS;
    while (counters(&a).redis_subscribed == 0 && now_ns() < until) step(&a, 5);
    CHECK(counters(&a).redis_subscribed > 0, "not subscribed again after the restart");
    if (e != NULL) CHECK(release_confirmed(&a, NULL, lease), "release after the restart");
    host_free(&a);
}

static void test_bad(int dead_port, int port) {
    host x;
    const char *bad[] = {"http://127.0.0.1:6379", "redis://127.0.0.1:notaport", "redis-sentinel://127.0.0.1:26379/m",
                         "redis+cluster://127.0.0.1:7000/3", "redis+sentinel://127.0.0.1:26379", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint32_t st = host_new(&x, bad[i], 5);
        CHECK(st == LH_ERR_INVALID_CONFIG, "url '%s': %s", bad[i], lh_status_str(st));
        if (st == LH_OK) host_free(&x);
    }
    /* Nothing listens: the acquire fails within its budget and the reason is the refusal. */
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", dead_port);
    CHECK(host_new(&x, url, 6) == LH_OK, "client");
    uint64_t lease = acquire(&x, "c-stream-nobody", 5000, 500);
    CHECK(wait_ev(&x, NULL, lease, LH_EVENT_ACQUIRE_FAILED, 5000) != NULL, "no failure without a server");
    CHECK(strstr(lh_backend_last_error(x.c), "refused") != NULL, "reason: '%s'", lh_backend_last_error(x.c));
    host_free(&x);
    /* rediss:// to a plain server: never a grant, and the TLS reason is kept. */
    snprintf(url, sizeof url, "rediss://127.0.0.1:%d", port);
    CHECK(host_new(&x, url, 7) == LH_OK, "client");
    lease = acquire(&x, "c-stream-tls", 5000, 500);
    CHECK(wait_ev(&x, NULL, lease, LH_EVENT_ACQUIRE_FAILED, 5000) != NULL, "rediss:// to a plain port granted");
#ifdef LH_STREAM_OPENSSL
    const char *want = "TLS";
#else
    const char *want = "TLS is not built in";
#endif
    CHECK(strstr(lh_backend_last_error(x.c), want) != NULL, "reason: '%s'", lh_backend_last_error(x.c));
    host_free(&x);
}

/* A Redis Cluster through redis+cluster://: the core learns the slot table from the seeds and
 * opens a pair of streams per master; the host moves their bytes like any other. */
static void test_cluster(void) {
    char dir[] = "/tmp/lh-stream-cluster-XXXXXX", cmd[512], url[512], line[400];
    const char *script = "../../scripts/redis-cluster-test.sh";
    if (mkdtemp(dir) == NULL) {
        CHECK(0, "mkdtemp");
        return;
    }
    snprintf(cmd, sizeof cmd, "bash %s start %s >/dev/null 2>&1", script, dir);
    int started = system(cmd) == 0;
    CHECK(started, "%s start failed (run from bindings/c)", script);
    snprintf(cmd, sizeof cmd, "%s/addresses", dir);
    FILE *f = started ? fopen(cmd, "r") : NULL;
    int have = f != NULL && fgets(line, sizeof line, f) != NULL && strncmp(line, "nodes ", 6) == 0;
    if (f != NULL) fclose(f);
    CHECK(!started || have, "no addresses from %s", script);
    if (have) {
        line[strcspn(line, "\r\n")] = 0;
        snprintf(url, sizeof url, "redis+cluster://%s", line + 6);
        host a;
        CHECK(host_new(&a, url, 11) == LH_OK, "client for %s", url);
        /* Thirty names: every master serves some (the cluster's slot ranges are fixed). */
        for (int i = 0; i < 30; i++) {
            char name[32];
            snprintf(name, sizeof name, "c-cluster-%d", i);
            uint64_t lease = acquire(&a, name, 5000, 3000);
            const lh_event *e = wait_ev(&a, NULL, lease, LH_EVENT_ACQUIRED, 5000);
            CHECK(e != NULL, "%s not acquired: %s", name, lh_backend_last_error(a.c));
            if (e == NULL) break;
            CHECK(release_confirmed(&a, NULL, lease), "%s: release not confirmed", name);
        }
        /* The topology stream and one commands stream per master, at least. */
        CHECK(counters(&a).stream_opens >= 4, "%llu streams opened", (unsigned long long)counters(&a).stream_opens);
        /* More streams at once than the slots made at first: they grew (and ASan/valgrind
         * see them freed). */
        CHECK(a.h.conns_len > LH_STREAM_MAX, "%zu stream slots", a.h.conns_len);
        CHECK(a.h.last_status == LH_OK, "library status %s", lh_status_str(a.h.last_status));
        host_free(&a);
        test_contend(url);
    }
    snprintf(cmd, sizeof cmd, "bash %s stop %s >/dev/null 2>&1; rm -rf %s", script, dir, dir);
    CHECK(system(cmd) == 0, "%s stop", script);
}

#ifdef LH_STREAM_OPENSSL
/* rediss:// on a TLS-only port with a certificate of the test's own CA: a lock with the CA
 * file (by name and by address), and a handshake refused without it. */
static void test_tls(const char *dir) {
    char cmd[1024], crt[160], key[160], ca[160], p[16], url[64];
    snprintf(cmd, sizeof cmd,
             "cd %s && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=lh-ca && "
             "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost && "
             "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > ext.cnf && "
             "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 "
             "-extfile ext.cnf",
             dir);
    char quiet[1100];
    snprintf(quiet, sizeof quiet, "(%s) >/dev/null 2>&1", cmd);
    CHECK(system(quiet) == 0, "openssl could not make the test certificates");
    snprintf(crt, sizeof crt, "%s/server.crt", dir);
    snprintf(key, sizeof key, "%s/server.key", dir);
    snprintf(ca, sizeof ca, "%s/ca.crt", dir);
    int port = free_port(), tls = free_port();
    snprintf(p, sizeof p, "%d", tls);
    char plain[16];
    snprintf(plain, sizeof plain, "%d", port);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *null = fopen("/dev/null", "w");
        if (null != NULL) dup2(fileno(null), 1), dup2(fileno(null), 2);
        execlp("redis-server", "redis-server", "--port", plain, "--tls-port", p, "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--tls-cert-file", crt, "--tls-key-file", key, "--tls-ca-cert-file", ca,
               "--tls-auth-clients", "no", (char *)NULL);
        _exit(127);
    }
    int up = 0;
    for (int i = 0; i < 500 && !(up = server_up(port)); i++) usleep(10000);
    CHECK(up, "redis-server with TLS did not start");
    const char *names[] = {"localhost", "127.0.0.1"};
    for (int i = 0; up && i < 2; i++) {
        snprintf(url, sizeof url, "rediss://%s:%d", names[i], tls);
        host x;
        CHECK(host_new(&x, url, 8 + i) == LH_OK, "client");
        x.h.ca_file = ca;
        uint64_t lease = acquire(&x, "c-stream-tls-ok", 5000, 3000);
        const lh_event *e = wait_ev(&x, NULL, lease, LH_EVENT_ACQUIRED, 5000);
        CHECK(e != NULL, "%s: not acquired: %s", url, lh_backend_last_error(x.c));
        if (e != NULL) CHECK(release_confirmed(&x, NULL, lease), "%s: release not confirmed", url);
        host_free(&x);
    }
    if (up) {
        snprintf(url, sizeof url, "rediss://localhost:%d", tls);
        host x;
        CHECK(host_new(&x, url, 10) == LH_OK, "client");
        uint64_t lease = acquire(&x, "c-stream-tls-bad", 5000, 500); /* the system's CAs only */
        CHECK(wait_ev(&x, NULL, lease, LH_EVENT_ACQUIRE_FAILED, 5000) != NULL, "granted without trusting the CA");
        CHECK(strstr(lh_backend_last_error(x.c), "TLS handshake") != NULL, "reason: '%s'", lh_backend_last_error(x.c));
        host_free(&x);
    }
    stop_server(pid);
    const char *files[] = {"ca.key", "ca.crt", "ca.srl", "server.key", "server.csr", "server.crt", "ext.cnf"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s/%s", dir, files[i]);
        unlink(cmd);
    }
}
#endif

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const char *ci = getenv("CI");
    int port = free_port(), dead = free_port();
    char dir[] = "/tmp/lh-stream-XXXXXX", sock[128], url[200];
    if (mkdtemp(dir) == NULL) return 1;
    snprintf(sock, sizeof sock, "%s/redis.sock", dir);
    pid_t server = start_server(port, sock);
    if (server < 0) {
        rmdir(dir);
        if (ci != NULL && strcmp(ci, "true") == 0) {
            fprintf(stderr, "test_stream: redis-server did not start (CI=true: a failure)\n");
            return 1;
        }
        printf("test_stream: SKIPPED (no redis-server)\n");
        return 0;
    }
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    test_fences(url);
    test_contend(url);
    snprintf(url, sizeof url, "unix://%s", sock);
    test_fences(url);
    test_restart(port, sock, &server);
    test_bad(dead, port);
    stop_server(server);
#ifdef LH_STREAM_OPENSSL
    test_tls(dir);
#endif
    test_cluster();
    unlink(sock);
    rmdir(dir);
    printf("test_stream: %s (%d failed checks)\n", failures ? "FAILED" : "OK", failures);
    return failures ? 1 : 0;
}
