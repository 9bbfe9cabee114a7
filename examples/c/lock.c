/*
 * lock.c -- takes a lock, prints its fencing token and releases it, through the C ABI.
 *
 * The C library does no IO, so a C host runs the core's commands on a lock service itself.
 * This program answers them from the core's in-process memory service (lh_memory_service_*,
 * the reference semantics every backend has; no other process sees its locks). A host on
 * SQLite or Redis runs the same loop with an executor instead (bindings/c/sqlite/lh_sqlite3.c,
 * bindings/c/redis/lh_hiredis.c): feed one input, then drain lh_poll_output completely (the
 * loop at the top of leasehold.h).
 *
 *   cc lock.c $(pkg-config --cflags --libs leasehold-static) -o lock && ./lock [NAME]
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <leasehold.h>

/* Commands queued between two drains at most (one lock: a handful). */
#define QUEUE_CAP 8

/* A command copied out of lh_poll_output (its borrowed pointers die at the next call). */
typedef struct command {
    uint32_t kind;
    uint64_t request_id;
    uint64_t ttl_ms;
    uint8_t name[512];
    size_t name_len;
    uint8_t token[64];
    size_t token_len;
} command;

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

/* Drains every output; commands are copied (borrowed pointers die at the next call), events
 * are reported. Returns the number of commands queued. */
static size_t drain(lh_client *c, command *queue, size_t cap, uint64_t *fence, int *released) {
    size_t n = 0;
    lh_output out;
    while (lh_poll_output(c, &out) == LH_OK && out.kind != LH_OUTPUT_NONE) {
        switch (out.kind) {
        case LH_OUTPUT_ACQUIRE:
        case LH_OUTPUT_RENEW:
        case LH_OUTPUT_RELEASE:
            if (n < cap && out.token_len <= sizeof queue[n].token && out.name_len <= sizeof queue[n].name) {
                queue[n].kind = out.kind;
                queue[n].request_id = out.request_id;
                queue[n].ttl_ms = out.ttl_ms;
                memcpy(queue[n].name, out.name, out.name_len);
                queue[n].name_len = out.name_len;
                memcpy(queue[n].token, out.token, out.token_len);
                queue[n].token_len = out.token_len;
                n++;
            }
            break;
        case LH_OUTPUT_ACQUIRED:
            *fence = out.fencing_token;
            break;
        case LH_OUTPUT_RELEASED:
            *released = 1;
            break;
        default:
            break;
        }
    }
    return n;
}

/* Runs one command on the memory service and feeds its answer to the core. */
static lh_status serve(lh_client *c, lh_memory_service *svc, uint64_t conn, const command *cmd,
                       lh_status *service_status) {
    lh_memory_result r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    uint64_t now = now_ns();
    switch (cmd->kind) {
    case LH_OUTPUT_ACQUIRE:
        *service_status = lh_memory_service_acquire(svc, conn, now, cmd->name, cmd->name_len, cmd->token,
                                                    cmd->token_len, cmd->ttl_ms, &r);
        if (*service_status != LH_OK) return LH_OK;
        return lh_acquire_result(c, now_ns(), cmd->request_id, r.engine_outcome, r.fencing_token, r.ttl_ms,
                                 r.retry_after_ms, NULL, 0);
    case LH_OUTPUT_RENEW:
        *service_status = lh_memory_service_renew(svc, conn, now, cmd->name, cmd->name_len, cmd->token,
                                                  cmd->token_len, cmd->ttl_ms, &r);
        if (*service_status != LH_OK) return LH_OK;
        return lh_renew_result(c, now_ns(), cmd->request_id, r.engine_outcome);
    default:
        *service_status = lh_memory_service_release(svc, conn, now, cmd->name, cmd->name_len, cmd->token,
                                                    cmd->token_len, &r);
        if (*service_status != LH_OK) return LH_OK;
        return lh_release_result(c, now_ns(), cmd->request_id, r.engine_outcome);
    }
}

/* Serves every queued command, draining after each input; stops at the first error. */
static int serve_all(lh_client *c, lh_memory_service *svc, uint64_t conn, command *queue, size_t n,
                     uint64_t *fence, int *released) {
    for (size_t i = 0; i < n; i++) {
        lh_status service_status = LH_OK;
        lh_status st = serve(c, svc, conn, &queue[i], &service_status);
        if (service_status != LH_OK) return fail_service(svc, "memory service", service_status);
        if (st != LH_OK) return fail(c, "result", st);
        /* After each input, drain again before the next one. */
        n += drain(c, queue + n, QUEUE_CAP - n, fence, released);
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
    lh_config_default(&cfg);
    /* Ownership tokens come from this seed: a real host takes it from the OS's random source. */
    uint8_t seed[32];
    FILE *urandom = fopen("/dev/urandom", "rb");
    if (urandom == NULL || fread(seed, 1, sizeof seed, urandom) != sizeof seed) return 1;
    fclose(urandom);
    lh_client *c = NULL;
    st = lh_client_new(&cfg, seed, sizeof seed, &c);
    if (st != LH_OK) return fail(NULL, "lh_client_new", st);

    lh_acquire_options opts;
    lh_acquire_options_default(&opts);
    opts.ttl_ms = 10000;
    opts.wait_ns = 0; /* one attempt */
    uint64_t lease = 0, fence = 0;
    int released = 0;
    st = lh_acquire(c, now_ns(), (const uint8_t *)name, strlen(name), &opts, &lease);
    if (st != LH_OK) return fail(c, "lh_acquire", st);

    command queue[QUEUE_CAP];
    int release_sent = 0;
    for (int round = 0; round < 16 && !released; round++) {
        size_t n = drain(c, queue, QUEUE_CAP, &fence, &released);
        if (serve_all(c, svc, conn, queue, n, &fence, &released) != 0) return 1;
        if (fence != 0 && !release_sent) {
            /* Hand the token to every write the lock protects; the resource refuses older ones. */
            printf("holding '%s': fencing token %" PRIu64 "\n", name, fence);
            if ((st = lh_release(c, now_ns(), lease)) != LH_OK) return fail(c, "lh_release", st);
            release_sent = 1;
        }
    }
    lh_client_free(c);

    /* The service agrees: nobody holds the lock any more. */
    lh_memory_status ms;
    memset(&ms, 0, sizeof ms);
    ms.struct_size = sizeof ms;
    st = lh_memory_service_status(svc, now_ns(), (const uint8_t *)name, strlen(name), &ms);
    lh_memory_service_free(svc);
    if (st != LH_OK || !released || fence == 0 || ms.held) {
        fprintf(stderr, "lock: expected a grant and a release (fence %" PRIu64 ")\n", fence);
        return 1;
    }
    printf("released\n");
    return 0;
}
