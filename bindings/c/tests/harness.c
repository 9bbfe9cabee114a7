/* harness.c -- see harness.h; also the tests' main. */
#define _POSIX_C_SOURCE 200809L
#include "harness.h"

#include <string.h>

int passed, failed, test_ok;
const char *test_name;

const uint8_t SEED[32] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
                          17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};
const uint8_t NAME[7] = "orders";

lh_client *mk_client(const lh_config *cfg, const uint8_t *seed, size_t seed_len) {
    lh_config def;
    lh_backend_options backend;
    lh_client *c = NULL;
    lh_config_default(&def);
    EXPECT_ST(lh_backend_options_default(LH_BACKEND_MEMORY, &backend), LH_OK);
    EXPECT_ST(lh_client_new(cfg ? cfg : &def, &backend, seed ? seed : SEED, seed ? seed_len : sizeof SEED, &c),
              LH_OK);
    EXPECT(c != NULL);
    return c;
}

lh_client *mk(void) { return mk_client(NULL, NULL, 0); }

lh_acquire_options opts_ttl(uint64_t ttl_ms) {
    lh_acquire_options o;
    lh_acquire_options_default(&o);
    o.ttl_ms = ttl_ms;
    return o;
}

lh_counters counters(const lh_client *c) {
    lh_counters k;
    memset(&k, 0, sizeof k);
    k.struct_size = sizeof k;
    EXPECT_ST(lh_counters_get(c, &k), LH_OK);
    return k;
}

int poll_call(lh_client *c, call *out) {
    lh_io_request q;
    memset(out, 0, sizeof *out);
    EXPECT_ST(lh_io_poll(c, &q), LH_OK);
    if (q.kind == LH_IO_NONE) {
        EXPECT(q.id == 0);
        return 0;
    }
    out->id = q.id;
    out->kind = q.kind;
    out->connection = q.connection;
    EXPECT(q.argc <= CALL_MAX_ARGS);
    size_t at = 0;
    for (uint32_t i = 0; i < q.argc && i < CALL_MAX_ARGS; i++) {
        size_t len = q.argv[i].len;
        EXPECT(at + len <= sizeof out->bytes);
        if (at + len > sizeof out->bytes) break;
        if (len) memcpy(out->bytes + at, q.argv[i].ptr, len);
        out->argv[i].ptr = len ? out->bytes + at : NULL;
        out->argv[i].len = len;
        at += len;
        out->argc = i + 1;
    }
    return 1;
}

int same_args(const call *a, const call *b) {
    if (a->argc != b->argc) return 0;
    for (uint32_t i = 0; i < a->argc; i++)
        if (a->argv[i].len != b->argv[i].len ||
            (a->argv[i].len && memcmp(a->argv[i].ptr, b->argv[i].ptr, a->argv[i].len) != 0))
            return 0;
    return 1;
}

void world_init(world *w, size_t n, const lh_config *cfg) {
    lh_memory_config mc;
    memset(w, 0, sizeof *w);
    lh_memory_config_default(&mc);
    EXPECT_ST(lh_memory_service_new(&mc, &w->svc), LH_OK);
    w->n = n;
    for (size_t i = 0; i < n; i++) {
        uint8_t seed[32];
        memcpy(seed, SEED, sizeof seed);
        seed[0] = (uint8_t)(seed[0] + 40 * i);
        w->p[i].c = mk_client(cfg, seed, sizeof seed);
        EXPECT_ST(lh_memory_service_connect(w->svc, &w->p[i].conn), LH_OK);
    }
}

void world_free(world *w) {
    for (size_t i = 0; i < w->n; i++) lh_client_free(w->p[i].c);
    lh_memory_service_free(w->svc);
    memset(w, 0, sizeof *w);
}

void drain_events(world *w, size_t i) {
    peer *p = &w->p[i];
    for (int guard = 0; guard < 10000; guard++) {
        lh_event ev;
        memset(&ev, 0xAB, sizeof ev);
        EXPECT_ST(lh_poll_event(p->c, &ev), LH_OK);
        if (ev.kind == LH_EVENT_NONE) {
            EXPECT(ev.lease_id == 0 && ev.reason == LH_REASON_NONE);
            return;
        }
        EXPECT(p->nevents < MAX_EVENTS);
        if (p->nevents < MAX_EVENTS) p->events[p->nevents++] = ev;
    }
    EXPECT(!"the event queue did not drain");
}

static void deliver_released(world *w, uint64_t now, int *moved) {
    for (size_t i = 0; i < w->n; i++) {
        for (;;) {
            const uint8_t *name = (const uint8_t *)"x";
            size_t len = 99;
            EXPECT_ST(lh_memory_service_poll_released(w->svc, w->p[i].conn, &name, &len), LH_OK);
            if (name == NULL) {
                EXPECT(len == 0);
                break;
            }
            if (moved) *moved = 1;
            EXPECT_ST(lh_io_message(w->p[i].c, now, name, len, NULL, 0), LH_OK);
        }
    }
}

void run_call(world *w, size_t i, const call *q, uint64_t now) {
    peer *p = &w->p[i];
    lh_memory_answer a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    EXPECT(q->kind == LH_IO_COMMAND && q->connection == LH_CONNECTION_COMMANDS);
    EXPECT_ST(lh_memory_service_call(w->svc, p->conn, now, q->argv, q->argc, &a), LH_OK);
    p->calls++;
    if (a.dropped) {
        static const char why[] = "dropped by the service";
        EXPECT(a.nvalues == 0);
        EXPECT_ST(lh_io_failed(p->c, now, q->id, LH_FAILURE_TRANSPORT, (const uint8_t *)why, sizeof why - 1), LH_OK);
    } else {
        EXPECT(a.nvalues > 0 && a.values != NULL);
        EXPECT_ST(lh_io_reply(p->c, now, q->id, a.values, a.nvalues, a.data, a.data_len), LH_OK);
    }
    deliver_released(w, now, NULL);
}

void pump(world *w, uint64_t now) {
    for (int round = 0; round < 1000; round++) {
        int moved = 0;
        for (size_t i = 0; i < w->n; i++) {
            peer *p = &w->p[i];
            call q;
            while (poll_call(p->c, &q)) {
                moved = 1;
                if (p->mode == PEER_HANG) {
                    EXPECT(p->nheld < MAX_HELD);
                    if (p->nheld < MAX_HELD) p->held[p->nheld++] = q;
                    /* the copy's pointers must follow it */
                    call *h = &p->held[p->nheld - 1];
                    size_t at = 0;
                    for (uint32_t a = 0; a < h->argc; a++) {
                        h->argv[a].ptr = h->argv[a].len ? h->bytes + at : NULL;
                        at += h->argv[a].len;
                    }
                } else {
                    run_call(w, i, &q, now);
                }
            }
            drain_events(w, i);
        }
        deliver_released(w, now, &moved);
        if (!moved) return;
    }
    EXPECT(!"the host loop did not settle");
}

void advance(world *w, uint64_t *now, uint64_t to) {
    for (int guard = 0; guard < 100000; guard++) {
        uint64_t next = LH_NO_DEADLINE;
        for (size_t i = 0; i < w->n; i++) {
            uint64_t d;
            EXPECT_ST(lh_poll_timeout(w->p[i].c, &d), LH_OK);
            if (d < next) next = d;
        }
        if (next > to) break;
        if (next > *now) *now = next;
        for (size_t i = 0; i < w->n; i++) EXPECT_ST(lh_timeout(w->p[i].c, *now), LH_OK);
        pump(w, *now);
    }
    if (to > *now) *now = to;
    for (size_t i = 0; i < w->n; i++) EXPECT_ST(lh_timeout(w->p[i].c, *now), LH_OK);
    pump(w, *now);
}

int advance_until(world *w, size_t i, uint64_t *now, uint64_t limit, uint32_t kind, lh_event *out) {
    for (int guard = 0; guard < 100000; guard++) {
        const lh_event *e = find_event(&w->p[i], kind, 0);
        if (e != NULL) {
            if (out) *out = *e;
            return 1;
        }
        uint64_t next = LH_NO_DEADLINE;
        for (size_t j = 0; j < w->n; j++) {
            uint64_t d;
            EXPECT_ST(lh_poll_timeout(w->p[j].c, &d), LH_OK);
            if (d < next) next = d;
        }
        if (next == LH_NO_DEADLINE || next > limit) return 0;
        if (next > *now) *now = next;
        for (size_t j = 0; j < w->n; j++) EXPECT_ST(lh_timeout(w->p[j].c, *now), LH_OK);
        pump(w, *now);
    }
    return 0;
}

void set_faults(world *w, size_t i, uint32_t flags) {
    lh_memory_faults f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    f.flags = flags;
    EXPECT_ST(lh_memory_service_set_faults(w->svc, w->p[i].conn, &f), LH_OK);
}

const lh_event *find_event(const peer *p, uint32_t kind, uint64_t lease) {
    for (size_t i = 0; i < p->nevents; i++)
        if (p->events[i].kind == kind && (lease == 0 || p->events[i].lease_id == lease)) return &p->events[i];
    return NULL;
}

size_t count_events(const peer *p, uint32_t kind, uint64_t lease) {
    size_t n = 0;
    for (size_t i = 0; i < p->nevents; i++)
        n += p->events[i].kind == kind && (lease == 0 || p->events[i].lease_id == lease);
    return n;
}

void clear_events(peer *p) { p->nevents = 0; }

uint64_t acquire_granted(world *w, size_t i, uint64_t now, uint64_t ttl_ms) {
    lh_acquire_options o = opts_ttl(ttl_ms);
    uint64_t lease = 0;
    EXPECT_ST(lh_acquire(w->p[i].c, now, NAME, NAME_LEN, &o, &lease), LH_OK);
    pump(w, now);
    EXPECT(find_event(&w->p[i], LH_EVENT_ACQUIRED, lease) != NULL);
    return lease;
}

lh_memory_status service_status(world *w, uint64_t now) {
    lh_memory_status st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    EXPECT_ST(lh_memory_service_status(w->svc, now, NAME, NAME_LEN, &st), LH_OK);
    return st;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* forked children must not repeat buffered lines */
    abi_tests();
    lifecycle_tests();
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
