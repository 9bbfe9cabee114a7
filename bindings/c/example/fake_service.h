/*
 * fake_service.h -- an in-process fake lock service for the leasehold C example and tests.
 *
 * Semantics follow the real backends (docs/design.md §6): a lock is (token, fencing token, expiry);
 * acquire is idempotent for the same token and answers the holder's remaining TTL otherwise;
 * renew and release compare the token first; a release notifies every watcher of the name.
 * Fencing tokens per name strictly increase and survive the lock being deleted.
 * Time is passed in (monotonic ns), exactly like the core: the fake never reads a clock.
 */
#ifndef LEASEHOLD_FAKE_SERVICE_H
#define LEASEHOLD_FAKE_SERVICE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "leasehold.h"

#define FAKE_MAX_LOCKS 16
#define FAKE_NAME_MAX 64

typedef struct fake_lock {
    char name[FAKE_NAME_MAX + 1];
    char token[33];          /* "" when not held */
    uint64_t last_fence;     /* never reset: fencing tokens keep increasing */
    uint64_t expires_ns;
} fake_lock;

typedef struct fake_service {
    fake_lock locks[FAKE_MAX_LOCKS];
    size_t nlocks;
    uint64_t grants, renewals, releases, rejections;
} fake_service;

typedef struct fake_acquire_answer {
    uint32_t outcome;        /* LH_ACQUIRE_* */
    uint64_t fencing_token;
    uint64_t ttl_ms;
    uint64_t retry_after_ms; /* LH_NO_RETRY_HINT when not HELD_BY_OTHER */
} fake_acquire_answer;

static inline fake_lock *fake_find(fake_service *s, const uint8_t *name, size_t name_len, int create) {
    size_t i;
    if (name_len > FAKE_NAME_MAX) return NULL;
    for (i = 0; i < s->nlocks; i++) {
        if (strlen(s->locks[i].name) == name_len && memcmp(s->locks[i].name, name, name_len) == 0)
            return &s->locks[i];
    }
    if (!create || s->nlocks == FAKE_MAX_LOCKS) return NULL;
    fake_lock *l = &s->locks[s->nlocks++];
    memset(l, 0, sizeof *l);
    memcpy(l->name, name, name_len);
    return l;
}

static inline int fake_held(const fake_lock *l, uint64_t now) {
    return l->token[0] != '\0' && now < l->expires_ns;
}

static inline int fake_owned_by(const fake_lock *l, const uint8_t *token, size_t token_len, uint64_t now) {
    return fake_held(l, now) && token_len == 32 && memcmp(l->token, token, 32) == 0;
}

static inline fake_acquire_answer fake_acquire(fake_service *s, uint64_t now, const uint8_t *name,
                                               size_t name_len, const uint8_t *token,
                                               size_t token_len, uint64_t ttl_ms) {
    fake_acquire_answer a = {LH_ACQUIRE_TRANSPORT_ERROR, 0, 0, LH_NO_RETRY_HINT};
    fake_lock *l = fake_find(s, name, name_len, 1);
    if (l == NULL || token_len != 32) return a; /* the service errors: a transport error */
    if (fake_held(l, now) && memcmp(l->token, token, 32) != 0) {
        a.outcome = LH_ACQUIRE_HELD_BY_OTHER;
        a.retry_after_ms = (l->expires_ns - now + 999999) / 1000000;
        return a;
    }
    if (!fake_owned_by(l, token, token_len, now)) { /* new grant (idempotent for same token) */
        memcpy(l->token, token, 32);
        l->token[32] = '\0';
        l->last_fence += 1;
        s->grants++;
    }
    l->expires_ns = now + ttl_ms * 1000000u;
    a.outcome = LH_ACQUIRE_GRANTED;
    a.fencing_token = l->last_fence;
    a.ttl_ms = ttl_ms;
    return a;
}

static inline uint32_t fake_renew(fake_service *s, uint64_t now, const uint8_t *name, size_t name_len,
                                  const uint8_t *token, size_t token_len, uint64_t ttl_ms) {
    fake_lock *l = fake_find(s, name, name_len, 0);
    if (l == NULL || !fake_owned_by(l, token, token_len, now)) {
        s->rejections++;
        return LH_RENEW_REJECTED;
    }
    l->expires_ns = now + ttl_ms * 1000000u;
    s->renewals++;
    return LH_RENEW_RENEWED;
}

/* Returns LH_RELEASE_*; *notify is set to 1 when watchers of the name must be told. */
static inline uint32_t fake_release(fake_service *s, uint64_t now, const uint8_t *name, size_t name_len,
                                    const uint8_t *token, size_t token_len, int *notify) {
    fake_lock *l = fake_find(s, name, name_len, 0);
    *notify = 0;
    if (l == NULL || !fake_owned_by(l, token, token_len, now)) return LH_RELEASE_NOT_OWNER;
    l->token[0] = '\0';
    l->expires_ns = 0;
    s->releases++;
    *notify = 1;
    return LH_RELEASE_RELEASED;
}

#endif
