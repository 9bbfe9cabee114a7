/*
 * lock.c -- takes a lock, prints its fencing token and releases it, through the C ABI.
 *
 * The C library does no IO: a host runs the requests its handle asks for. This program's
 * backend is the core's in-process memory service (lh_memory_service_*, the reference
 * semantics every backend has; no other process sees its locks), so its executor hands each
 * request to lh_memory_service_call. A host on SQLite or Redis runs the same loop with another
 * executor (bindings/c/sqlite/lh_sqlite3.c, bindings/c/redis/lh_hiredis.c): feed one input,
 * then drain lh_io_poll and lh_poll_event completely (the loop at the top of leasehold.h).
 *
 *   cc lock.c $(pkg-config --cflags --libs leasehold-static) -o lock && ./lock [NAME]
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <leasehold.h>

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int fail(lh_client *c, const char *what, lh_status st) {
    fprintf(stderr, "%s: %s (%s)\n", what, lh_status_str(st), lh_client_last_error(c));
    return 1;
}

static int fail_service(lh_memory_service *svc, const char *what, lh_status st) {
    fprintf(stderr, "%s: %s (%s)\n", what, lh_status_str(st), lh_memory_service_last_error(svc));
    return 1;
}

/* The memory executor: runs one request on the service and answers it at once (the answer
 * borrows the service until its next call), then hands over the service's release
 * notifications. The arguments and the answer are carried, never read. */
static lh_status execute(lh_client *c, lh_memory_service *svc, uint64_t conn, const lh_io_request *q,
                         lh_status *service_status) {
    uint64_t now = now_ns();
    lh_status st;
    if (q->kind != LH_IO_COMMAND) {
        static const char why[] = "this host runs memory-service calls only";
        return lh_io_failed(c, now, q->id, LH_FAILURE_TRANSPORT, (const uint8_t *)why, sizeof why - 1);
    }
    lh_memory_answer a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    *service_status = lh_memory_service_call(svc, conn, now, q->argv, q->argc, &a);
    if (*service_status != LH_OK) return LH_OK;
    st = a.dropped ? lh_io_failed(c, now, q->id, LH_FAILURE_TRANSPORT, NULL, 0)
                   : lh_io_reply(c, now, q->id, a.values, a.nvalues, a.data, a.data_len);
    while (st == LH_OK) {
        const uint8_t *name = NULL;
        size_t len = 0;
        *service_status = lh_memory_service_poll_released(svc, conn, &name, &len);
        if (*service_status != LH_OK || name == NULL) break;
        st = lh_io_message(c, now_ns(), name, len, NULL, 0);
    }
    return st;
}

/* After every input: every request to the executor, then every event. */
static int drain(lh_client *c, lh_memory_service *svc, uint64_t conn, uint64_t *fence, int *released) {
    for (;;) {
        lh_io_request q;
        lh_status service_status = LH_OK;
        lh_status st = lh_io_poll(c, &q);
        if (st != LH_OK) return fail(c, "lh_io_poll", st);
        if (q.kind == LH_IO_NONE) break;
        st = execute(c, svc, conn, &q, &service_status);
        if (service_status != LH_OK) return fail_service(svc, "memory service", service_status);
        if (st != LH_OK) return fail(c, "answer", st);
    }
    for (;;) {
        lh_event ev;
        lh_status st = lh_poll_event(c, &ev);
        if (st != LH_OK) return fail(c, "lh_poll_event", st);
        if (ev.kind == LH_EVENT_NONE) break;
        if (ev.kind == LH_EVENT_ACQUIRED) *fence = ev.fencing_token;
        if (ev.kind == LH_EVENT_RELEASED) *released = 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "example";
    lh_memory_config mcfg;
    lh_memory_config_default(&mcfg);
    lh_memory_service *svc = NULL;
    uint64_t conn = 0;
    lh_status st = lh_memory_service_new(&mcfg, &svc);
    if (st != LH_OK) return fail_service(NULL, "lh_memory_service_new", st);
    if ((st = lh_memory_service_connect(svc, &conn)) != LH_OK) return fail_service(svc, "connect", st);

    lh_config cfg;
    lh_backend_options backend;
    lh_config_default(&cfg);
    if ((st = lh_backend_options_default(LH_BACKEND_MEMORY, &backend)) != LH_OK)
        return fail(NULL, "lh_backend_options_default", st);
    /* Ownership tokens come from this seed: a real host takes it from the OS's random source. */
    uint8_t seed[32];
    FILE *urandom = fopen("/dev/urandom", "rb");
    if (urandom == NULL || fread(seed, 1, sizeof seed, urandom) != sizeof seed) return 1;
    fclose(urandom);
    lh_client *c = NULL;
    st = lh_client_new(&cfg, &backend, seed, sizeof seed, &c);
    if (st != LH_OK) return fail(NULL, "lh_client_new", st);

    lh_acquire_options opts;
    lh_acquire_options_default(&opts);
    opts.ttl_ms = 10000;
    opts.wait_ns = 0; /* one attempt */
    uint64_t lease = 0, fence = 0;
    int released = 0;
    st = lh_acquire(c, now_ns(), (const uint8_t *)name, strlen(name), &opts, &lease);
    if (st != LH_OK) return fail(c, "lh_acquire", st);
    if (drain(c, svc, conn, &fence, &released) != 0) return 1;
    if (fence != 0) {
        /* Hand the token to every write the lock protects; the resource refuses older ones. */
        printf("holding '%s': fencing token %" PRIu64 "\n", name, fence);
        if ((st = lh_release(c, now_ns(), lease, NULL)) != LH_OK) return fail(c, "lh_release", st);
        if (drain(c, svc, conn, &fence, &released) != 0) return 1;
    }
    /* Closing: give back what the backend holds for us, then check nothing is left to confirm. */
    if ((st = lh_io_close(c, now_ns())) != LH_OK) return fail(c, "lh_io_close", st);
    if (drain(c, svc, conn, &fence, &released) != 0) return 1;
    lh_counters k;
    memset(&k, 0, sizeof k);
    k.struct_size = sizeof k;
    if ((st = lh_counters_get(c, &k)) != LH_OK) return fail(c, "lh_counters_get", st);
    lh_client_free(c);

    /* The service agrees: nobody holds the lock any more, and the release was confirmed. */
    lh_memory_status ms;
    memset(&ms, 0, sizeof ms);
    ms.struct_size = sizeof ms;
    st = lh_memory_service_status(svc, now_ns(), (const uint8_t *)name, strlen(name), &ms);
    lh_memory_service_free(svc);
    if (st != LH_OK || !released || fence == 0 || ms.held || k.pending_cleanups != 0) {
        fprintf(stderr, "lock: expected a grant and a release (fence %" PRIu64 ")\n", fence);
        return 1;
    }
    printf("released\n");
    return 0;
}
