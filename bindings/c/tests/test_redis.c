/*
 * test_redis.c -- the C host executing the core's Redis protocol with hiredis
 * (redis/lh_hiredis.c) against a real redis-server that this test starts on a free loopback
 * port and stops by pid. Several processes contend for one name: every one gets the lock in
 * turn, fences strictly increase in grant order, no two ever hold it at once (checked in
 * shared memory), and waiters are woken by pub/sub messages. A subscriber connection the
 * server drops is reported and subscribed again; a paused holder's release reports its loss;
 * the connection options work on a real server. Without redis-server the test is skipped,
 * except under CI=true.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lh_hiredis.h"

#define MS 1000000ull
#define WORKERS 4
#define ROUNDS 15
#define NAME "c-shared"

typedef struct {
    int held;
    int violations;
    uint32_t n;
    uint64_t fences[WORKERS * ROUNDS];
    uint64_t wakeups; /* release notifications that woke a waiter, over every worker */
} shared_state;

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

/* Starts redis-server on `port` with `extra` arguments (NULL-terminated, may be NULL). */
static pid_t start_server_with(int port, const char *const *extra) {
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    const char *argv[40] = {"redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "",
                            "--appendonly", "no", "--loglevel", "warning"};
    size_t n = 11;
    for (size_t i = 0; extra != NULL && extra[i] != NULL && n < 39; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        FILE *null = fopen("/dev/null", "w");
        if (null != NULL) {
            dup2(fileno(null), 1);
            dup2(fileno(null), 2);
        }
        execvp("redis-server", (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < 500; i++) {
        redisContext *c = redisConnect("127.0.0.1", port);
        if (c != NULL && !c->err) {
            /* Any answer will do: with a password PING is refused, but the server is up. */
            redisReply *r = redisCommand(c, "PING");
            int ok = r != NULL && (r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_ERROR);
            if (r) freeReplyObject(r);
            redisFree(c);
            if (ok) return pid;
        } else if (c != NULL) {
            redisFree(c);
        }
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static pid_t start_server(int port) { return start_server_with(port, NULL); }

/* Drains events; returns the fence when `lease` was acquired, 0 otherwise, -1 on failure. */
static int64_t drain(lh_client *c, uint64_t lease) {
    lh_event ev;
    int64_t got = 0;
    while (lh_poll_event(c, &ev) == LH_OK && ev.kind != LH_EVENT_NONE) {
        if (ev.lease_id != lease) continue;
        if (ev.kind == LH_EVENT_ACQUIRED) got = (int64_t)ev.fencing_token;
        if (ev.kind == LH_EVENT_ACQUIRE_FAILED || ev.kind == LH_EVENT_LOST) got = -1;
    }
    return got;
}

/* A client of the Redis backend (default options) seeded from the pid and `salt`. */
static lh_client *new_client(int salt) {
    uint8_t seed[32];
    for (size_t i = 0; i < sizeof seed; i++) seed[i] = (uint8_t)(getpid() * 17 + salt * 5 + i * 11);
    lh_config cfg;
    lh_config_default(&cfg);
    lh_backend_options b;
    lh_client *c = NULL;
    if (lh_backend_options_default(LH_BACKEND_REDIS, &b) != LH_OK) return NULL;
    return lh_client_new(&cfg, &b, seed, sizeof seed, &c) == LH_OK ? c : NULL;
}

/* Steps until the wake channel's subscription is confirmed (the handle's first request). */
static void wait_subscribed(lh_client *c, lh_hiredis *x, uint64_t limit) {
    lh_counters k = {.struct_size = sizeof k};
    while (lh_counters_get(c, &k) == LH_OK && !k.redis_subscribed && now_ns() < limit) lh_hiredis_step(x, 5, now_ns);
}

static int worker(int port, shared_state *sh, int index) {
    lh_client *c = new_client(100 + index);
    if (c == NULL) return 2;
    lh_hiredis x;
    lh_hiredis_init(&x, c, "127.0.0.1", port);
    uint64_t limit = now_ns() + 30000 * MS;
    int rc = 0;
    wait_subscribed(c, &x, limit);
    for (int round = 0; round < ROUNDS && rc == 0; round++) {
        lh_acquire_options o;
        lh_acquire_options_default(&o);
        o.ttl_ms = 10000;
        o.wait_ns = 30000 * MS;
        uint64_t lease = 0;
        if (lh_acquire(c, now_ns(), (const uint8_t *)NAME, strlen(NAME), &o, &lease) != LH_OK) { rc = 3; break; }
        int64_t fence = 0;
        while ((fence = drain(c, lease)) == 0 && now_ns() < limit + 60000 * MS)
            lh_hiredis_step(&x, 5, now_ns);
        if (fence <= 0) { rc = 4; break; }
        if (__atomic_exchange_n(&sh->held, 1, __ATOMIC_SEQ_CST) != 0) __atomic_add_fetch(&sh->violations, 1, __ATOMIC_SEQ_CST);
        uint32_t at = __atomic_fetch_add(&sh->n, 1, __ATOMIC_SEQ_CST);
        if (at < WORKERS * ROUNDS) sh->fences[at] = (uint64_t)fence;
        usleep(500);
        __atomic_store_n(&sh->held, 0, __ATOMIC_SEQ_CST);
        if (lh_release(c, now_ns(), lease, NULL) != LH_OK) { rc = 5; break; }
        lh_counters kc = {.struct_size = sizeof kc};
        uint64_t until = now_ns() + 2 * MS; /* then give the woken waiter its turn */
        do {
            lh_hiredis_step(&x, 1, now_ns);
            drain(c, lease);
        } while ((lh_counters_get(c, &kc) == LH_OK && kc.pending_cleanups > 0) || now_ns() < until);
    }
    if (rc == 0 && x.last_status != LH_OK) rc = 6;
    lh_counters k = {.struct_size = sizeof k};
    if (lh_counters_get(c, &k) == LH_OK) __atomic_add_fetch(&sh->wakeups, k.backend_wakeups, __ATOMIC_SEQ_CST);
    lh_hiredis_close(&x);
    lh_client_free(c);
    return rc;
}

/* The server drops the subscriber connection (CLIENT KILL TYPE pubsub): the executor reports
 * the channel lost (lh_io_connection UNSUBSCRIBED), the handle subscribes again on a new
 * connection, and a waiter is still woken by a release. */
static int subscriber_loss_heals(int port) {
    lh_client *holder = new_client(7), *waiter = new_client(8);
    if (holder == NULL || waiter == NULL) return 1;
    lh_hiredis xh, xw;
    lh_hiredis_init(&xh, holder, "127.0.0.1", port);
    lh_hiredis_init(&xw, waiter, "127.0.0.1", port);
    uint64_t limit = now_ns() + 20000 * MS;
    wait_subscribed(holder, &xh, limit);
    wait_subscribed(waiter, &xw, limit);
    redisContext *admin = redisConnect("127.0.0.1", port);
    redisReply *r = admin != NULL && !admin->err ? redisCommand(admin, "CLIENT KILL TYPE pubsub") : NULL;
    long long killed = r != NULL && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r) freeReplyObject(r);
    if (admin) redisFree(admin);
    lh_counters k = {.struct_size = sizeof k};
    while (lh_counters_get(waiter, &k) == LH_OK && (k.redis_subscriber_losses == 0 || !k.redis_subscribed) &&
           now_ns() < limit)
        lh_hiredis_step(&xw, 5, now_ns);
    int healed = k.redis_subscriber_losses == 1 && k.redis_subscribed == 1 && k.redis_subscriptions == 2;
    /* The holder takes the lock, the waiter queues behind it, the release wakes the waiter. */
    lh_acquire_options o;
    lh_acquire_options_default(&o);
    o.ttl_ms = 10000;
    o.wait_ns = 10000 * MS;
    uint64_t lh = 0, lw = 0;
    int64_t fh = 0, fw = 0;
    lh_acquire(holder, now_ns(), (const uint8_t *)"c-heal", 6, &o, &lh);
    while ((fh = drain(holder, lh)) == 0 && now_ns() < limit) lh_hiredis_step(&xh, 5, now_ns);
    lh_acquire(waiter, now_ns(), (const uint8_t *)"c-heal", 6, &o, &lw);
    for (int i = 0; i < 20; i++) lh_hiredis_step(&xw, 5, now_ns); /* queued, asleep */
    uint64_t asked = 0;
    if (lh_counters_get(waiter, &k) == LH_OK) asked = k.redis_script_calls;
    lh_release(holder, now_ns(), lh, NULL);
    lh_hiredis_run_requests(&xh, now_ns);
    while ((fw = drain(waiter, lw)) == 0 && now_ns() < limit) lh_hiredis_step(&xw, 5, now_ns);
    lh_counters_get(waiter, &k);
    int woken = fh > 0 && fw > fh && k.backend_wakeups >= 1 && k.redis_script_calls <= asked + 2;
    int failed = killed < 2 || !healed || !woken || xw.last_status != LH_OK || xh.last_status != LH_OK;
    printf("test_redis: subscriber connection killed (%lld pubsub clients): lost %llu, subscribed %llu times, "
           "then woken by a release (fences %lld < %lld, wakeups %llu): %s\n",
           killed, (unsigned long long)k.redis_subscriber_losses, (unsigned long long)k.redis_subscriptions,
           (long long)fh, (long long)fw, (unsigned long long)k.backend_wakeups, failed ? "FAIL" : "OK");
    lh_release(waiter, now_ns(), lw, NULL);
    lh_hiredis_run_requests(&xw, now_ns);
    lh_hiredis_close(&xh);
    lh_hiredis_close(&xw);
    lh_client_free(holder);
    lh_client_free(waiter);
    return failed;
}

/* The paused-holder scenario's shared state. */
typedef struct {
    int ready;          /* holder: lock taken, fence written */
    int release_now;    /* parent: release after resuming */
    int quiet;          /* parent: the holder's driver stops too (release comes first) */
    uint64_t holder_fence;
    uint64_t taker_fence;
    uint32_t releasing; /* lh_release's disposition, 100 for LEASE_ENDED, 200 + status else */
    int lost_events, released_events, rc;
} pause_state;

/* Acquires NAME with `ttl_ms`; returns the fence (> 0) or 0. */
static uint64_t acquire_blocking(lh_client *c, lh_hiredis *x, uint32_t ttl_ms, uint64_t *lease) {
    uint64_t limit = now_ns() + 30000 * MS;
    wait_subscribed(c, x, limit);
    lh_acquire_options o;
    lh_acquire_options_default(&o);
    o.ttl_ms = ttl_ms;
    o.wait_ns = 20000 * MS;
    if (lh_acquire(c, now_ns(), (const uint8_t *)"c-paused", 8, &o, lease) != LH_OK) return 0;
    int64_t fence = 0;
    while ((fence = drain(c, *lease)) == 0 && now_ns() < limit) lh_hiredis_step(x, 5, now_ns);
    return fence > 0 ? (uint64_t)fence : 0;
}

static int paused_holder(int port, pause_state *ps) {
    lh_client *c = new_client(1);
    if (c == NULL) return 2;
    lh_hiredis x;
    lh_hiredis_init(&x, c, "127.0.0.1", port);
    uint64_t lease = 0;
    ps->holder_fence = acquire_blocking(c, &x, 1000, &lease);
    __atomic_store_n(&ps->ready, 1, __ATOMIC_SEQ_CST);
    /* Renew as usual until told to release; the parent stops this process meanwhile. With
     * `quiet` the driver stops first, so the release is the first input after the pause. */
    while (!__atomic_load_n(&ps->release_now, __ATOMIC_SEQ_CST)) {
        if (__atomic_load_n(&ps->quiet, __ATOMIC_SEQ_CST)) usleep(1000);
        else lh_hiredis_step(&x, 5, now_ns);
    }
    uint32_t releasing = 0;
    lh_status st = lh_release(c, now_ns(), lease, &releasing);
    ps->releasing = st == LH_OK ? releasing : (st == LH_ERR_LEASE_ENDED ? 100 : 200 + st);
    /* Every event of the lease is still queued (the loop above polls none): count them. */
    uint64_t until = now_ns() + 500 * MS;
    lh_event ev;
    while (now_ns() < until) {
        lh_hiredis_step(&x, 5, now_ns);
        while (lh_poll_event(c, &ev) == LH_OK && ev.kind != LH_EVENT_NONE) {
            if (ev.lease_id != lease) continue;
            if (ev.kind == LH_EVENT_LOST) ps->lost_events++;
            if (ev.kind == LH_EVENT_RELEASED) ps->released_events++;
        }
    }
    lh_hiredis_close(&x);
    lh_client_free(c);
    return 0;
}

static int taker(int port, pause_state *ps) {
    lh_client *c = new_client(2);
    if (c == NULL) return 2;
    lh_hiredis x;
    lh_hiredis_init(&x, c, "127.0.0.1", port);
    uint64_t lease = 0;
    ps->taker_fence = acquire_blocking(c, &x, 10000, &lease);
    lh_release(c, now_ns(), lease, NULL);
    for (int i = 0; i < 100; i++) lh_hiredis_step(&x, 2, now_ns);
    lh_hiredis_close(&x);
    lh_client_free(c);
    return ps->taker_fence > 0 ? 0 : 3;
}

static int paused_holder_release_reports_the_loss(int port, int quiet) {
    pause_state *ps = mmap(NULL, sizeof *ps, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ps == MAP_FAILED) return 1;
    memset(ps, 0, sizeof *ps);
    ps->quiet = quiet;
    pid_t holder = fork();
    if (holder == 0) _exit(paused_holder(port, ps));
    uint64_t limit = now_ns() + 30000 * MS;
    while (!__atomic_load_n(&ps->ready, __ATOMIC_SEQ_CST) && now_ns() < limit) usleep(1000);
    kill(holder, SIGSTOP);
    pid_t t = fork();
    if (t == 0) _exit(taker(port, ps));
    int status = 0;
    waitpid(t, &status, 0); /* the holder's key expired on the server (TTL 1 s) */
    int failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    usleep(200000);         /* and its validity has certainly ended on its own clock */
    __atomic_store_n(&ps->release_now, 1, __ATOMIC_SEQ_CST);
    kill(holder, SIGCONT);
    waitpid(holder, &status, 0);
    failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    /* A quiet driver cannot have seen the expiry: the release itself must report the loss. */
    int lost = ps->releasing == LH_RELEASING_LOST || (!quiet && ps->releasing == 100);
    if (!lost || ps->lost_events != 1 || ps->released_events != 0) failed = 1;
    if (ps->holder_fence == 0 || ps->taker_fence <= ps->holder_fence) failed = 1;
    printf("test_redis: paused holder%s (fence %llu) released after a taker (fence %llu): "
           "releasing=%u lost events=%d released events=%d: %s\n", quiet ? " with its driver" : "",
           (unsigned long long)ps->holder_fence, (unsigned long long)ps->taker_fence, ps->releasing,
           ps->lost_events, ps->released_events, failed ? "FAIL" : "OK");
    munmap(ps, sizeof *ps);
    return failed;
}

/* Acquires `name` through an executor made with `o` (wait `wait_ms`); returns the fence, or 0
 * when the attempt failed. The lease is released and the executor closed before returning;
 * `err` receives the executor's last connection error. */
static uint64_t acquire_with(const lh_hiredis_options *o, const char *name, uint32_t wait_ms,
                             int (*while_held)(void *), void *arg, char *err, size_t errlen) {
    lh_client *c = new_client(3);
    if (c == NULL) return 0;
    lh_hiredis x;
    if (lh_hiredis_init_options(&x, c, o) != 0) {
        lh_client_free(c);
        return 0;
    }
    lh_acquire_options ao;
    lh_acquire_options_default(&ao);
    ao.ttl_ms = 10000;
    ao.wait_ns = wait_ms * MS;
    uint64_t lease = 0, limit = now_ns() + (wait_ms + 10000) * MS;
    int64_t fence = 0;
    if (lh_acquire(c, now_ns(), (const uint8_t *)name, strlen(name), &ao, &lease) == LH_OK) {
        while ((fence = drain(c, lease)) == 0 && now_ns() < limit) lh_hiredis_step(&x, 5, now_ns);
    }
    if (fence > 0 && while_held != NULL && while_held(arg) != 0) fence = -1;
    if (fence > 0) {
        lh_release(c, now_ns(), lease, NULL);
        lh_counters k = {.struct_size = sizeof k};
        while (lh_counters_get(c, &k) == LH_OK && k.pending_cleanups > 0 && now_ns() < limit)
            lh_hiredis_step(&x, 5, now_ns);
    }
    snprintf(err, errlen, "%s", x.last_error);
    lh_hiredis_close(&x);
    lh_client_free(c);
    return fence > 0 ? (uint64_t)fence : 0;
}

/* While the lock is held: its keys are in the selected database, none in database 0. */
static int keys_in_db5(void *sock) {
    redisContext *c = redisConnectUnix((const char *)sock);
    if (c == NULL || c->err) return 1;
    long long n[2] = {-1, -1};
    const char *dbs[2] = {"5", "0"};
    for (int i = 0; i < 2; i++) {
        redisReply *r = redisCommand(c, "AUTH secret");
        if (r) freeReplyObject(r);
        r = redisCommand(c, "SELECT %s", dbs[i]);
        if (r) freeReplyObject(r);
        r = redisCommand(c, "DBSIZE");
        if (r != NULL && r->type == REDIS_REPLY_INTEGER) n[i] = r->integer;
        if (r) freeReplyObject(r);
    }
    redisFree(c);
    return n[0] > 0 && n[1] == 0 ? 0 : 1;
}

/* Password, ACL user, database number and Unix socket, each on a real server; a wrong
 * password fails the acquire with the server's reason and grants nothing. */
static int connection_options(void) {
    char dir[] = "/tmp/lh-c-redis-XXXXXX";
    if (mkdtemp(dir) == NULL) return 1;
    char sock[64];
    snprintf(sock, sizeof sock, "%s/redis.sock", dir);
    int port = free_port();
    const char *extra[] = {"--unixsocket", sock, "--unixsocketperm", "700", "--requirepass", "secret",
                           "--user", "alice", "on", ">wonder", "~*", "&*", "+@all", NULL};
    pid_t server = port > 0 ? start_server_with(port, extra) : -1;
    if (server < 0) {
        fprintf(stderr, "test_redis: redis-server with a password did not start\n");
        rmdir(dir);
        return 1;
    }
    char err[256];
    int failed = 0;
    lh_hiredis_options unix_db = {.unix_socket = sock, .password = "secret", .db = 5};
    uint64_t f1 = acquire_with(&unix_db, "c-opts", 5000, keys_in_db5, sock, err, sizeof err);
    printf("test_redis: unix socket, password, db 5: fence %llu %s\n", (unsigned long long)f1, err);
    failed |= f1 == 0;
    lh_hiredis_options acl = {.port = port, .username = "alice", .password = "wonder"};
    uint64_t f2 = acquire_with(&acl, "c-opts", 5000, NULL, NULL, err, sizeof err);
    printf("test_redis: ACL user over TCP: fence %llu %s\n", (unsigned long long)f2, err);
    failed |= f2 == 0;
    lh_hiredis_options wrong = {.port = port, .password = "not-it"};
    uint64_t f3 = acquire_with(&wrong, "c-opts-wrong", 1500, NULL, NULL, err, sizeof err);
    int refused = f3 == 0 && strstr(err, "AUTH") != NULL;
    printf("test_redis: wrong password: fence %llu, error \"%s\": %s\n", (unsigned long long)f3, err,
           refused ? "OK" : "FAIL");
    failed |= !refused;
    char nowhere[80];
    snprintf(nowhere, sizeof nowhere, "%s/no.sock", dir);
    lh_hiredis_options absent = {.unix_socket = nowhere};
    uint64_t f4 = acquire_with(&absent, "c-opts-absent", 500, NULL, NULL, err, sizeof err);
    int unreachable = f4 == 0 && strncmp(err, "connect: ", 9) == 0;
    printf("test_redis: no server at the socket: error \"%s\": %s\n", err, unreachable ? "OK" : "FAIL");
    failed |= !unreachable;
    lh_hiredis x;
    failed |= lh_hiredis_init_options(&x, NULL, NULL) != -1;
    char longhost[100];
    memset(longhost, 'h', sizeof longhost - 1);
    longhost[sizeof longhost - 1] = 0;
    lh_hiredis_options too_long = {.host = longhost};
    failed |= lh_hiredis_init_options(&x, NULL, &too_long) != -1;
    kill(server, SIGTERM);
    waitpid(server, NULL, 0);
    unlink(sock);
    rmdir(dir);
    printf("test_redis: connection options: %s\n", failed ? "FAIL" : "OK");
    return failed;
}

int main(void) {
    const char *ci = getenv("CI");
    setvbuf(stdout, NULL, _IOLBF, 0); /* forked children must not repeat buffered lines */
    if (system("command -v redis-server >/dev/null 2>&1") != 0) {
        if (ci != NULL && strcmp(ci, "true") == 0) {
            fprintf(stderr, "test_redis: redis-server missing (scripts/ensure-redis.sh)\n");
            return 1;
        }
        printf("test_redis: SKIP (redis-server not installed)\n");
        return 0;
    }
    int port = free_port();
    pid_t server = port > 0 ? start_server(port) : -1;
    if (server < 0) { fprintf(stderr, "test_redis: redis-server did not start\n"); return 1; }
    shared_state *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return 1;
    memset(sh, 0, sizeof *sh);
    pid_t kids[WORKERS];
    for (int i = 0; i < WORKERS; i++) {
        kids[i] = fork();
        if (kids[i] == 0) _exit(worker(port, sh, i));
    }
    int failed = 0;
    for (int i = 0; i < WORKERS; i++) {
        int status = 0;
        waitpid(kids[i], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "test_redis: worker %d failed (status %d)\n", i, status);
            failed = 1;
        }
    }
    if (sh->wakeups == 0) { fprintf(stderr, "test_redis: no waiter was woken by a release\n"); failed = 1; }
    failed |= subscriber_loss_heals(port);
    failed |= paused_holder_release_reports_the_loss(port, 0);
    failed |= paused_holder_release_reports_the_loss(port, 1);
    failed |= connection_options();
    kill(server, SIGTERM);
    waitpid(server, NULL, 0);
    if (sh->n != WORKERS * ROUNDS) { fprintf(stderr, "test_redis: %u grants\n", sh->n); failed = 1; }
    if (sh->violations != 0) { fprintf(stderr, "test_redis: two holders at once\n"); failed = 1; }
    for (uint32_t i = 1; i < sh->n && i < WORKERS * ROUNDS; i++) {
        if (sh->fences[i] <= sh->fences[i - 1]) {
            fprintf(stderr, "test_redis: fence %u not increasing\n", i);
            failed = 1;
        }
    }
    printf("test_redis: %u grants between %d processes (%llu woken by a release), fences strictly increasing: %s\n",
           sh->n, WORKERS, (unsigned long long)sh->wakeups, failed ? "FAIL" : "OK");
    munmap(sh, sizeof *sh);
    return failed;
}
