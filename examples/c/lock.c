/*
 * lock.c -- takes a lock, prints its fencing token and releases it, through the C ABI.
 *
 * The C library has no lock service of its own yet (the embedded SQLite default is in the
 * Python package), so this host answers the core's commands from a tiny in-memory service:
 * one lock table in this process. A real host sends the commands to Redis, SQLite or its own
 * service asynchronously; the loop is the one at the top of leasehold.h: feed one input, then
 * drain lh_poll_output completely.
 *
 *   cc lock.c $(pkg-config --cflags --libs leasehold-static) -o lock && ./lock
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <leasehold.h>

/* The in-memory service: who holds the one lock, and the last fencing token it granted. */
static uint8_t holder[64];
static size_t holder_len;
static uint64_t last_fence;

typedef struct command {
    uint32_t kind;
    uint64_t request_id;
    uint64_t ttl_ms;
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
            if (n < cap && out.token_len <= sizeof queue[n].token) {
                queue[n].kind = out.kind;
                queue[n].request_id = out.request_id;
                queue[n].ttl_ms = out.ttl_ms;
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

/* Answers one command from the in-memory service and feeds the answer to the core. */
static lh_status serve(lh_client *c, const command *cmd) {
    int ours = holder_len == cmd->token_len && memcmp(holder, cmd->token, cmd->token_len) == 0;
    switch (cmd->kind) {
    case LH_OUTPUT_ACQUIRE:
        if (holder_len != 0 && !ours)
            return lh_acquire_result(c, now_ns(), cmd->request_id, LH_ACQUIRE_HELD_BY_OTHER, 0, 0,
                                     LH_NO_RETRY_HINT, NULL, 0);
        if (!ours) {
            memcpy(holder, cmd->token, cmd->token_len);
            holder_len = cmd->token_len;
            last_fence++;
        }
        return lh_acquire_result(c, now_ns(), cmd->request_id, LH_ACQUIRE_GRANTED, last_fence,
                                 cmd->ttl_ms, 0, NULL, 0);
    case LH_OUTPUT_RENEW:
        return lh_renew_result(c, now_ns(), cmd->request_id, ours ? LH_RENEW_RENEWED : LH_RENEW_REJECTED);
    default:
        if (ours) holder_len = 0;
        return lh_release_result(c, now_ns(), cmd->request_id,
                                 ours ? LH_RELEASE_RELEASED : LH_RELEASE_NOT_OWNER);
    }
}

int main(void) {
    lh_config cfg;
    lh_config_default(&cfg);
    /* Ownership tokens come from this seed: a real host takes it from the OS's random source. */
    uint8_t seed[32];
    FILE *urandom = fopen("/dev/urandom", "rb");
    if (urandom == NULL || fread(seed, 1, sizeof seed, urandom) != sizeof seed) return 1;
    fclose(urandom);
    lh_client *c = NULL;
    lh_status st = lh_client_new(&cfg, seed, sizeof seed, &c);
    if (st != LH_OK) return fail(NULL, "lh_client_new", st);

    lh_acquire_options opts;
    lh_acquire_options_default(&opts);
    opts.ttl_ms = 10000;
    opts.wait_ns = 0; /* one attempt */
    const char *name = "example";
    uint64_t lease = 0, fence = 0;
    int released = 0;
    st = lh_acquire(c, now_ns(), (const uint8_t *)name, strlen(name), &opts, &lease);
    if (st != LH_OK) return fail(c, "lh_acquire", st);

    command queue[8];
    int release_sent = 0;
    for (int round = 0; round < 16 && !released; round++) {
        size_t n = drain(c, queue, 8, &fence, &released);
        for (size_t i = 0; i < n; i++) {
            if ((st = serve(c, &queue[i])) != LH_OK) return fail(c, "result", st);
            /* After each input, drain again before the next one. */
            n += drain(c, queue + n, 8 - n, &fence, &released);
        }
        if (fence != 0 && !release_sent) {
            printf("holding '%s': fencing token %" PRIu64 "\n", name, fence);
            if ((st = lh_release(c, now_ns(), lease)) != LH_OK) return fail(c, "lh_release", st);
            release_sent = 1;
        }
    }
    /* The release command must have reached the service too. */
    size_t n = drain(c, queue, 8, &fence, &released);
    for (size_t i = 0; i < n; i++) {
        if ((st = serve(c, &queue[i])) != LH_OK) return fail(c, "result", st);
    }
    lh_client_free(c);
    if (!released || fence == 0 || holder_len != 0) {
        fprintf(stderr, "lock: expected a grant and a release (fence %" PRIu64 ")\n", fence);
        return 1;
    }
    printf("released\n");
    return 0;
}
