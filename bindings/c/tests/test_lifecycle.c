/*
 * test_lifecycle.c -- the engine's rules through the C ABI, on clients whose requests run on
 * an lh_memory_service (harness.c: the run loop on virtual time). Transport errors and
 * rejections come from the service's fault switches (lh_memory_service_set_faults), calls
 * that never come back from a client whose calls hang, expiry from lh_memory_service_step_clock
 * or jumps of `now`. The lifecycle (acquire, renew before validity ends, release and its
 * cleanup), cancel, loss by rejection, expiry and failure budget, manual renew, release
 * outcomes, reentrancy, answers that are not grants, determinism from the seed and reseeding
 * after fork, contention between clients, reconnects and status queries.
 */
#define _GNU_SOURCE /* memmem */
#include "harness.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int is_lower_hex(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f'))) return 0;
    return 1;
}

static void full_lifecycle(void) {
    world w;
    world_init(&w, 1, NULL);
    lh_client *c = w.p[0].c;
    lh_acquire_options o = opts_ttl(3000);
    uint64_t lease = 0, now = 0, fence = 0, vu = 0, deadline = 0;
    EXPECT_ST(lh_acquire(c, now, NAME, NAME_LEN, &o, &lease), LH_OK);
    EXPECT(lease != 0);
    uint32_t st = 0;
    EXPECT_ST(lh_lease_state(c, lease, &st), LH_OK);
    EXPECT(st == LH_STATE_ACQUIRING);
    EXPECT_ST(lh_fencing_token(c, lease, &fence), LH_ERR_NOT_GRANTED);
    EXPECT_ST(lh_valid_until(c, lease, &vu), LH_ERR_NOT_GRANTED);

    /* One call to the service; the grant comes from its answer. */
    call q;
    EXPECT(poll_call(c, &q));
    EXPECT(q.kind == LH_IO_COMMAND && q.connection == LH_CONNECTION_COMMANDS && q.id != 0 && q.argc > 0);
    call none;
    EXPECT(!poll_call(c, &none));
    drain_events(&w, 0);
    EXPECT(w.p[0].nevents == 0);
    now = 1 * MS;
    run_call(&w, 0, &q, now);
    drain_events(&w, 0);
    EXPECT(w.p[0].nevents == 1);
    const lh_event *ev = find_event(&w.p[0], LH_EVENT_ACQUIRED, lease);
    EXPECT(ev != NULL);
    if (ev == NULL) { world_free(&w); return; }
    EXPECT(ev->fencing_token == 1 && ev->reason == LH_REASON_NONE);
    EXPECT(ev->valid_until_ns > now && ev->valid_until_ns <= 0 + 3000 * MS); /* counted from send */
    EXPECT_ST(lh_fencing_token(c, lease, &fence), LH_OK);
    EXPECT(fence == 1);
    EXPECT_ST(lh_valid_until(c, lease, &vu), LH_OK);
    EXPECT(vu == ev->valid_until_ns);
    bool held = false;
    EXPECT_ST(lh_is_held(c, lease, now, &held), LH_OK);
    EXPECT(held);
    EXPECT_ST(lh_is_held(c, lease, vu, &held), LH_OK);
    EXPECT(!held);
    lh_lease_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info + 64; /* a newer, larger struct is fine */
    EXPECT_ST(lh_lease_info_get(c, lease, &info), LH_OK);
    EXPECT(info.struct_size == sizeof info);
    EXPECT(info.state == LH_STATE_HELD && info.holders == 1 && info.has_token == 1);
    EXPECT(info.fencing_token == 1 && info.valid_until_ns == vu);
    /* The service holds it for this connection under a 32-hex-digit ownership token. */
    lh_memory_status ss = service_status(&w, now);
    EXPECT(ss.held == 1 && ss.fencing_token == 1 && ss.holder_connection == w.p[0].conn);
    EXPECT(ss.holder_token_len == 32 && is_lower_hex(ss.holder_token, 32));
    EXPECT(ss.remaining_ttl_ms > 2900 && ss.remaining_ttl_ms <= 3000);

    /* Renewal: before validity ends, with the same token; validity moves on. */
    EXPECT_ST(lh_poll_timeout(c, &deadline), LH_OK);
    EXPECT(deadline != LH_NO_DEADLINE && deadline < vu);
    for (int i = 0; i < 20 && counters(c).renewals_sent == 0; i++) {
        EXPECT_ST(lh_poll_timeout(c, &deadline), LH_OK);
        if (deadline > now) now = deadline;
        EXPECT_ST(lh_timeout(c, now), LH_OK);
        pump(&w, now);
    }
    EXPECT(now < vu);
    uint64_t vu2 = 0;
    EXPECT_ST(lh_valid_until(c, lease, &vu2), LH_OK);
    EXPECT(vu2 > vu);
    lh_memory_status ss2 = service_status(&w, now);
    EXPECT(ss2.held == 1 && ss2.holder_token_len == 32 && memcmp(ss2.holder_token, ss.holder_token, 32) == 0);
    EXPECT(ss2.expires_at_ns > ss.expires_at_ns);
    lh_counters k = counters(c);
    EXPECT(k.renewals_sent == 1 && k.renewals_ok == 1 && k.grants == 1 && k.acquires_sent == 1);
    EXPECT(k.backend_requests == 2 && k.backend_transport_failures == 0);
    EXPECT(count_events(&w.p[0], LH_EVENT_RENEWED, 0) == 0); /* automatic renewals are silent */

    /* Release: RELEASED at once; the cleanup is pending until the service confirms. */
    now += 2 * MS;
    EXPECT_ST(lh_release(c, now, lease, NULL), LH_OK);
    EXPECT(counters(c).pending_cleanups == 1);
    lh_status s = lh_lease_state(c, lease, &st);
    EXPECT(s == LH_ERR_LEASE_ENDED || (s == LH_OK && st == LH_STATE_RELEASED));
    EXPECT_ST(lh_is_held(c, lease, now, &held), LH_OK);
    EXPECT(!held);
    pump(&w, now + 1 * MS);
    EXPECT(find_event(&w.p[0], LH_EVENT_RELEASED, lease) != NULL);
    EXPECT(find_event(&w.p[0], LH_EVENT_RELEASE_OUTCOME, 0) == NULL); /* not asked for */
    EXPECT(counters(c).pending_cleanups == 0 && counters(c).releases_sent == 1);
    EXPECT(service_status(&w, now + 1 * MS).held == 0);
    world_free(&w);
}

static void double_release_is_lease_ended(void) {
    world w;
    world_init(&w, 1, NULL);
    uint64_t lease = acquire_granted(&w, 0, 0, 3000);
    EXPECT_ST(lh_release(w.p[0].c, 2 * MS, lease, NULL), LH_OK);
    pump(&w, 2 * MS);
    uint64_t requests = counters(w.p[0].c).backend_requests;
    size_t events = w.p[0].nevents;
    EXPECT_ST(lh_release(w.p[0].c, 3 * MS, lease, NULL), LH_ERR_LEASE_ENDED);
    EXPECT(strlen(lh_client_last_error(w.p[0].c)) > 0);
    pump(&w, 3 * MS);
    EXPECT(w.p[0].nevents == events && counters(w.p[0].c).backend_requests == requests); /* nothing more */
    world_free(&w);
}

static void release_while_acquiring_is_cancelled(void) {
    world w;
    world_init(&w, 1, NULL);
    w.p[0].mode = PEER_HANG;
    lh_acquire_options o = opts_ttl(3000);
    uint64_t lease;
    EXPECT_ST(lh_acquire(w.p[0].c, 0, NAME, NAME_LEN, &o, &lease), LH_OK);
    pump(&w, 0);
    EXPECT(w.p[0].nheld == 1);
    uint32_t releasing = 0;
    EXPECT_ST(lh_release(w.p[0].c, 1 * MS, lease, &releasing), LH_OK);
    EXPECT(releasing == LH_RELEASING_NOT_ACQUIRED);
    pump(&w, 1 * MS);
    const lh_event *f = find_event(&w.p[0], LH_EVENT_ACQUIRE_FAILED, lease);
    EXPECT(f != NULL && f->reason == LH_REASON_CANCELLED);
    EXPECT(find_event(&w.p[0], LH_EVENT_RELEASED, 0) == NULL);
    /* The grant that arrives after all is given back. */
    w.p[0].mode = PEER_ANSWER;
    run_call(&w, 0, &w.p[0].held[0], 2 * MS);
    pump(&w, 2 * MS);
    EXPECT(find_event(&w.p[0], LH_EVENT_ACQUIRED, 0) == NULL);
    EXPECT(service_status(&w, 2 * MS).held == 0 && counters(w.p[0].c).pending_cleanups == 0);
    world_free(&w);
}

static void renew_rejected_is_lost(void) {
    world w;
    world_init(&w, 1, NULL);
    uint64_t now = 0;
    uint64_t lease = acquire_granted(&w, 0, now, 3000);
    set_faults(&w, 0, LH_MEMORY_REJECT_RENEWALS);
    lh_event l;
    EXPECT(advance_until(&w, 0, &now, 5000 * MS, LH_EVENT_LOST, &l));
    EXPECT(l.lease_id == lease && l.reason == LH_REASON_REJECTED);
    EXPECT(counters(w.p[0].c).lost_rejected == 1 && counters(w.p[0].c).renewals_sent == 1);
    /* Terminal: LOST while its cleanup is pending, LEASE_ENDED once the record is dropped. */
    uint32_t st = 0;
    lh_status s = lh_lease_state(w.p[0].c, lease, &st);
    EXPECT(s == LH_ERR_LEASE_ENDED || (s == LH_OK && st == LH_STATE_LOST));
    EXPECT_ST(lh_release(w.p[0].c, now + 2 * MS, lease, NULL), LH_ERR_LEASE_ENDED);
    world_free(&w);
}

/* The service's clock runs ahead: the grant expires there first, another client takes the
 * lock, and the first client's next renewal is rejected. */
static void grant_expired_on_the_service_is_lost_by_rejection(void) {
    world w;
    world_init(&w, 2, NULL);
    uint64_t now = 0;
    uint64_t lease = acquire_granted(&w, 0, now, 3000);
    EXPECT_ST(lh_memory_service_step_clock(w.svc, 3001 * (int64_t)MS), LH_OK);
    EXPECT(service_status(&w, now).held == 0);
    uint64_t other = acquire_granted(&w, 1, now, 3000);
    EXPECT(find_event(&w.p[1], LH_EVENT_ACQUIRED, other)->fencing_token == 2);
    lh_event l;
    EXPECT(advance_until(&w, 0, &now, 5000 * MS, LH_EVENT_LOST, &l));
    EXPECT(l.lease_id == lease && l.reason == LH_REASON_REJECTED);
    EXPECT(service_status(&w, now).holder_connection == w.p[1].conn);
    lh_memory_stats ms;
    ms.struct_size = sizeof ms;
    EXPECT_ST(lh_memory_service_stats_get(w.svc, &ms), LH_OK);
    EXPECT(ms.grants == 2 && ms.renewals_rejected >= 1);
    world_free(&w);
}

static void unanswered_renew_expires(void) {
    world w;
    world_init(&w, 1, NULL);
    uint64_t now = 0, vu = 0;
    uint64_t lease = acquire_granted(&w, 0, now, 3000);
    EXPECT_ST(lh_valid_until(w.p[0].c, lease, &vu), LH_OK);
    w.p[0].mode = PEER_HANG; /* from now on no call comes back */
    lh_event lost;
    EXPECT(advance_until(&w, 0, &now, 10000 * MS, LH_EVENT_LOST, &lost));
    EXPECT(lost.lease_id == lease);
    EXPECT(lost.reason == LH_REASON_EXPIRED || lost.reason == LH_REASON_FAIL_BUDGET);
    EXPECT(now <= vu);
    EXPECT(w.p[0].nheld >= 1);
    bool held = true;
    EXPECT_ST(lh_is_held(w.p[0].c, lease, now, &held), LH_OK);
    EXPECT(!held);
    world_free(&w);
}

static void time_jump_forward_loses_the_lease(void) {
    world w;
    world_init(&w, 1, NULL);
    uint64_t lease = acquire_granted(&w, 0, 0, 3000);
    uint64_t sent = counters(w.p[0].c).renewals_sent;
    EXPECT_ST(lh_timeout(w.p[0].c, 3600000 * MS), LH_OK); /* a suspended VM wakes up an hour later */
    drain_events(&w, 0);
    const lh_event *l = find_event(&w.p[0], LH_EVENT_LOST, lease);
    EXPECT(l != NULL && l->reason == LH_REASON_EXPIRED);
    EXPECT(counters(w.p[0].c).renewals_sent == sent); /* no renewal of a lease already gone */
    world_free(&w);
}

static void reentrant_acquire_shares_the_lease(void) {
    world w;
    world_init(&w, 1, NULL);
    lh_client *c = w.p[0].c;
    lh_acquire_options o = opts_ttl(3000);
    o.flags = LH_ACQUIRE_REENTRANT;
    uint64_t l1 = 0, l2 = 0;
    EXPECT_ST(lh_acquire(c, 0, NAME, NAME_LEN, &o, &l1), LH_OK);
    pump(&w, 1 * MS);
    uint64_t requests = counters(c).backend_requests;
    EXPECT_ST(lh_acquire(c, 2 * MS, NAME, NAME_LEN, &o, &l2), LH_OK);
    EXPECT(l1 == l2);
    pump(&w, 2 * MS);
    EXPECT(counters(c).backend_requests == requests); /* no network call */
    EXPECT(count_events(&w.p[0], LH_EVENT_ACQUIRED, l1) == 2);
    lh_lease_info info;
    info.struct_size = sizeof info;
    EXPECT_ST(lh_lease_info_get(c, l1, &info), LH_OK);
    EXPECT(info.holders == 2);
    uint32_t releasing = 0;
    EXPECT_ST(lh_release(c, 3 * MS, l1, &releasing), LH_OK);
    EXPECT(releasing == LH_RELEASING_HOLDER_LEFT);
    pump(&w, 3 * MS);
    EXPECT(find_event(&w.p[0], LH_EVENT_RELEASED, 0) == NULL && counters(c).backend_requests == requests);
    EXPECT_ST(lh_release(c, 4 * MS, l1, NULL), LH_OK);
    pump(&w, 4 * MS);
    EXPECT(find_event(&w.p[0], LH_EVENT_RELEASED, l1) != NULL && counters(c).backend_requests == requests + 1);
    EXPECT(service_status(&w, 4 * MS).held == 0);
    world_free(&w);
}

static void many_leases_and_free_with_pending_work(void) {
    lh_client *c = mk();
    lh_acquire_options o = opts_ttl(3000);
    char name[32];
    for (int i = 0; i < 200; i++) {
        uint64_t lease;
        int n = snprintf(name, sizeof name, "lock-%d", i);
        EXPECT_ST(lh_acquire(c, (uint64_t)i, (const uint8_t *)name, (size_t)n, &o, &lease), LH_OK);
    }
    EXPECT(counters(c).live_leases == 200);
    /* Free with 200 unpolled requests: no leak (valgrind checks). */
    lh_client_free(c);
}

/* Well-formed answers that are not what the service says (garbage, an error reply) are
 * transport errors for the engine, never grants; the protocol counts and keeps them. */
static void answers_that_are_not_grants_never_grant(void) {
    static const uint8_t text[] = "ERR boom";
    static const lh_value answers[][2] = {
        {{.kind = LH_VALUE_INT, .integer = 7}},
        {{.kind = LH_VALUE_NIL}},
        {{.kind = LH_VALUE_ARRAY, .len = 0}},
        {{.kind = LH_VALUE_ARRAY, .len = 1}, {.kind = LH_VALUE_INT, .integer = -1}},
        {{.kind = LH_VALUE_BULK, .offset = 0, .len = 3}},
        {{.kind = LH_VALUE_ERROR, .offset = 0, .len = 8}},
    };
    static const size_t lens[] = {1, 1, 1, 2, 1, 1};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        lh_client *c = mk();
        lh_acquire_options o = opts_ttl(3000);
        uint64_t lease = 0;
        bool held = true;
        EXPECT_ST(lh_acquire(c, 10 * MS, NAME, NAME_LEN, &o, &lease), LH_OK);
        call q;
        EXPECT(poll_call(c, &q));
        EXPECT_ST(lh_io_reply(c, 11 * MS, q.id, answers[i], lens[i], text, sizeof text - 1), LH_OK);
        lh_event ev;
        EXPECT_ST(lh_poll_event(c, &ev), LH_OK);
        EXPECT(ev.kind == LH_EVENT_ACQUIRE_FAILED && ev.lease_id == lease && ev.reason == LH_REASON_UNAVAILABLE);
        EXPECT_ST(lh_is_held(c, lease, 11 * MS, &held), LH_OK);
        EXPECT(!held);
        lh_counters k = counters(c);
        int error = answers[i][0].kind == LH_VALUE_ERROR;
        EXPECT(k.grants == 0 && k.backend_error_replies == (uint64_t)error && k.backend_garbage_replies == (uint64_t)!error);
        EXPECT(strlen(lh_backend_last_error(c)) > 0);
        if (error) EXPECT(strstr(lh_backend_last_error(c), "ERR boom") != NULL);
        lh_client_free(c);
    }
}

/* The first request of a fresh acquire of `name`, copied. */
static void first_call(lh_client *c, const char *name, call *q) {
    lh_acquire_options o = opts_ttl(3000);
    uint64_t lease;
    EXPECT_ST(lh_acquire(c, 0, (const uint8_t *)name, strlen(name), &o, &lease), LH_OK);
    EXPECT(poll_call(c, q));
}

static void same_seed_is_deterministic(void) {
    lh_client *a = mk(), *b = mk();
    static const uint8_t other_seed[32] = {9};
    lh_client *d = mk_client(NULL, other_seed, sizeof other_seed);
    call ca, cb, cd;
    first_call(a, "x", &ca);
    first_call(b, "x", &cb);
    first_call(d, "x", &cd);
    EXPECT(same_args(&ca, &cb));  /* tests and fuzzers replay runs from a seed */
    EXPECT(!same_args(&ca, &cd)); /* another seed, another ownership token */
    lh_client_free(a);
    lh_client_free(b);
    lh_client_free(d);
}

static void reseed_after_fork_gives_distinct_tokens(void) {
    lh_client *c = mk();
    call parent, child;
    memset(&child, 0, sizeof child);
    int fds[2];
    EXPECT(pipe(fds) == 0);
    pid_t pid = fork();
    EXPECT(pid >= 0);
    if (pid == 0) {
        /* Child: what Python's os.register_at_fork(after_in_child=...) does. */
        uint8_t fresh[32];
        for (size_t i = 0; i < sizeof fresh; i++) fresh[i] = (uint8_t)(0xc0 + i);
        int ok = lh_client_reseed(c, fresh, sizeof fresh) == LH_OK;
        call q;
        first_call(c, "x", &q);
        ok = ok && test_ok;
        ssize_t w = write(fds[1], &q, sizeof q);
        lh_client_free(c);
        _exit(ok && w == (ssize_t)sizeof q ? 0 : 1);
    }
    close(fds[1]);
    first_call(c, "x", &parent);
    EXPECT(read(fds[0], &child, sizeof child) == (ssize_t)sizeof child);
    close(fds[0]);
    size_t at = 0; /* the child's pointers were into its own copy */
    for (uint32_t i = 0; i < child.argc && i < CALL_MAX_ARGS; i++) {
        child.argv[i].ptr = child.bytes + at;
        at += child.argv[i].len;
    }
    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT(child.argc == parent.argc && child.argc > 0);
    EXPECT(!same_args(&parent, &child));
    lh_client_free(c);
}

/* -------------------------------------------- manual renew, auto renew, release outcomes */

static void manual_renew_extends_validity_from_its_send_time(void) {
    world w;
    world_init(&w, 1, NULL);
    lh_client *c = w.p[0].c;
    uint64_t lease = acquire_granted(&w, 0, 0, 3000);
    w.p[0].mode = PEER_HANG;
    EXPECT_ST(lh_renew(c, 500 * MS, lease), LH_OK);
    pump(&w, 500 * MS);
    EXPECT(w.p[0].nheld == 1);
    EXPECT_ST(lh_renew(c, 505 * MS, lease), LH_OK); /* joins the one in flight */
    pump(&w, 505 * MS);
    EXPECT(w.p[0].nheld == 1);
    run_call(&w, 0, &w.p[0].held[0], 510 * MS);
    drain_events(&w, 0);
    const lh_event *r = find_event(&w.p[0], LH_EVENT_RENEWED, lease);
    /* 500 ms + 3000 ms - (1% of 3000 ms + 2 ms) */
    EXPECT(r != NULL && r->valid_until_ns == 3468 * MS);
    EXPECT(count_events(&w.p[0], LH_EVENT_RENEWED, lease) == 1);
    uint64_t vu = 0;
    EXPECT_ST(lh_valid_until(c, lease, &vu), LH_OK);
    EXPECT(vu == 3468 * MS);
    EXPECT(counters(c).renewals_requested == 2 && counters(c).renewals_sent == 1);
    world_free(&w);
}

static void manual_renew_of_an_ended_or_acquiring_lease_sends_nothing(void) {
    world w;
    world_init(&w, 2, NULL);
    uint64_t now = 0;
    lh_client *c = w.p[0].c;
    uint64_t released = acquire_granted(&w, 0, now, 3000);
    EXPECT_ST(lh_release(c, 2 * MS, released, NULL), LH_OK);
    pump(&w, 2 * MS);
    uint64_t requests = counters(c).backend_requests;
    EXPECT_ST(lh_renew(c, 3 * MS, released), LH_ERR_LEASE_ENDED);

    lh_client *c2 = w.p[1].c;
    uint64_t lost = acquire_granted(&w, 1, now, 3000);
    set_faults(&w, 1, LH_MEMORY_REJECT_RENEWALS);
    EXPECT(advance_until(&w, 1, &now, 5000 * MS, LH_EVENT_LOST, NULL));
    uint64_t requests2 = counters(c2).backend_requests;
    EXPECT_ST(lh_renew(c2, now + MS, lost), LH_ERR_LEASE_ENDED);
    EXPECT(counters(c2).backend_requests == requests2);

    w.p[0].mode = PEER_HANG;
    lh_acquire_options o = opts_ttl(3000);
    uint64_t acquiring = 0;
    EXPECT_ST(lh_acquire(c, now, (const uint8_t *)"second", 6, &o, &acquiring), LH_OK);
    pump(&w, now);
    EXPECT_ST(lh_renew(c, now + 1 * MS, acquiring), LH_ERR_NOT_GRANTED);
    EXPECT_ST(lh_renew(c, now + 1 * MS, 0), LH_ERR_UNKNOWN_LEASE);
    EXPECT_ST(lh_renew(NULL, now + 1 * MS, acquiring), LH_ERR_NULL_ARGUMENT);
    pump(&w, now + 1 * MS);
    EXPECT(counters(c).backend_requests == requests + 1 && w.p[0].nheld == 1); /* the acquire only */
    EXPECT(counters(c).renewals_requested == 0);
    world_free(&w);
}

static void no_auto_renew_lease_is_lost_at_valid_until_without_renewals(void) {
    world w;
    world_init(&w, 1, NULL);
    lh_acquire_options o = opts_ttl(3000);
    o.flags = LH_ACQUIRE_NO_AUTO_RENEW;
    uint64_t lease = 0, now = 0, vu = 0;
    EXPECT_ST(lh_acquire(w.p[0].c, 0, NAME, NAME_LEN, &o, &lease), LH_OK);
    pump(&w, 1 * MS);
    EXPECT_ST(lh_valid_until(w.p[0].c, lease, &vu), LH_OK);
    lh_event lost;
    EXPECT(advance_until(&w, 0, &now, 10000 * MS, LH_EVENT_LOST, &lost));
    EXPECT(lost.lease_id == lease && lost.reason == LH_REASON_EXPIRED && now == vu);
    EXPECT(counters(w.p[0].c).renewals_sent == 0);
    world_free(&w);
}

/* Releases a held lease with a reported outcome while the service's `faults` are set;
 * returns the RELEASE_OUTCOME reason (0 if none came). */
static uint32_t reported_release(uint32_t faults) {
    world w;
    world_init(&w, 1, NULL);
    lh_client *c = w.p[0].c;
    uint64_t lease = acquire_granted(&w, 0, 0, 3000);
    set_faults(&w, 0, faults);
    uint32_t releasing = 0xdead;
    EXPECT_ST(lh_release(c, 2 * MS, lease, &releasing), LH_OK);
    EXPECT(releasing == LH_RELEASING_PENDING);
    pump(&w, 3 * MS);
    EXPECT(find_event(&w.p[0], LH_EVENT_RELEASED, lease) != NULL);
    const lh_event *o = find_event(&w.p[0], LH_EVENT_RELEASE_OUTCOME, lease);
    uint32_t reason = o != NULL ? o->reason : 0;
    EXPECT(count_events(&w.p[0], LH_EVENT_RELEASE_OUTCOME, 0) == (o != NULL));
    lh_counters k = counters(c);
    EXPECT(k.releases_confirmed == (faults == 0));
    EXPECT(k.releases_not_owner == (faults == LH_MEMORY_REJECT_RELEASES));
    EXPECT(k.releases_lost == 0 && k.releases_unconfirmed == 0);
    world_free(&w);
    return reason;
}

static void release_outcomes_confirmed_and_not_owner(void) {
    EXPECT(reported_release(0) == LH_REASON_RELEASE_CONFIRMED);
    EXPECT(reported_release(LH_MEMORY_REJECT_RELEASES) == LH_REASON_RELEASE_NOT_OWNER);
    uint32_t releasing = 0xdead;
    lh_client *c = mk();
    EXPECT_ST(lh_release(c, 0, 12345, &releasing), LH_ERR_UNKNOWN_LEASE);
    EXPECT(releasing == 0xdead); /* written only on success */
    lh_client_free(c);
}

/* The service never answers the release: UNCONFIRMED once the grant has certainly run out. */
static void release_never_answered_is_unconfirmed(void) {
    world w;
    world_init(&w, 1, NULL);
    uint64_t now = 0;
    uint64_t lease = acquire_granted(&w, 0, now, 3000);
    set_faults(&w, 0, LH_MEMORY_PARTITIONED);
    uint32_t releasing = 0;
    EXPECT_ST(lh_release(w.p[0].c, 2 * MS, lease, &releasing), LH_OK);
    EXPECT(releasing == LH_RELEASING_PENDING);
    lh_event o;
    EXPECT(advance_until(&w, 0, &now, 10000 * MS, LH_EVENT_RELEASE_OUTCOME, &o));
    EXPECT(o.lease_id == lease && o.reason == LH_REASON_RELEASE_UNCONFIRMED && now >= 3000 * MS);
    EXPECT(counters(w.p[0].c).releases_unconfirmed == 1);
    world_free(&w);
}

static void release_after_a_pause_ends_lost(void) {
    world w;
    world_init(&w, 1, NULL);
    lh_client *c = w.p[0].c;
    uint64_t lease = acquire_granted(&w, 0, 0, 3000);
    uint32_t releasing = 0;
    /* The process was paused past valid_until; its first act on waking is the release. */
    EXPECT_ST(lh_release(c, 10000 * MS, lease, &releasing), LH_OK);
    EXPECT(releasing == LH_RELEASING_LOST);
    pump(&w, 10000 * MS);
    const lh_event *l = find_event(&w.p[0], LH_EVENT_LOST, lease);
    EXPECT(l != NULL && l->reason == LH_REASON_EXPIRED);
    EXPECT(counters(c).releases_lost == 1);
    EXPECT_ST(lh_release(c, 10001 * MS, lease, &releasing), LH_ERR_LEASE_ENDED);
    /* The driver runs on: its timeouts and the cleanup's answer bring no second LOST. */
    uint64_t now = 10001 * MS;
    advance(&w, &now, 60000 * MS);
    EXPECT(count_events(&w.p[0], LH_EVENT_LOST, lease) == 1);
    EXPECT(find_event(&w.p[0], LH_EVENT_RELEASED, 0) == NULL && find_event(&w.p[0], LH_EVENT_RELEASE_OUTCOME, 0) == NULL);
    EXPECT(counters(c).lost_expired == 1 && counters(c).releases_confirmed == 0);
    EXPECT(counters(c).pending_cleanups == 0);
    world_free(&w);
}

/* ------------------------------------------------------------------ the renewal failure budget */

/* One lease whose service drops every request from `down_from` to `down_until` (a
 * transport error each) and answers otherwise; runs the deadlines up to `end`. */
typedef struct outage_run {
    uint64_t lease, valid_until; /* valid_until: the last one known before the loss */
    size_t lost_events;
    uint32_t lost_reason;
    uint64_t lost_at;
    lh_counters k;
} outage_run;

static outage_run run_outage(uint32_t fail_budget, uint64_t ttl_ms, uint64_t down_from, uint64_t down_until,
                             uint64_t end) {
    outage_run r;
    memset(&r, 0, sizeof r);
    lh_config cfg;
    lh_config_default(&cfg);
    cfg.fail_budget = fail_budget;
    world w;
    world_init(&w, 1, &cfg);
    lh_client *c = w.p[0].c;
    uint64_t now = 0;
    int down = 0;
    r.lease = acquire_granted(&w, 0, now, ttl_ms);
    EXPECT_ST(lh_valid_until(c, r.lease, &r.valid_until), LH_OK);
    for (int guard = 0; guard < 100000; guard++) {
        uint64_t dl;
        EXPECT_ST(lh_poll_timeout(c, &dl), LH_OK);
        if (dl == LH_NO_DEADLINE || dl > end) break;
        if (dl > now) now = dl;
        int want = now >= down_from && now < down_until;
        if (want != down) set_faults(&w, 0, want ? LH_MEMORY_DROP_REQUESTS : 0);
        down = want;
        EXPECT_ST(lh_timeout(c, now), LH_OK);
        pump(&w, now);
        const lh_event *l = find_event(&w.p[0], LH_EVENT_LOST, r.lease);
        if (l != NULL && r.lost_events == 0) r.lost_at = now;
        r.lost_events = count_events(&w.p[0], LH_EVENT_LOST, r.lease);
        if (l != NULL) r.lost_reason = l->reason;
        if (r.lost_events == 0) {
            uint64_t vu = 0;
            if (lh_valid_until(c, r.lease, &vu) == LH_OK) r.valid_until = vu;
        }
    }
    r.k = counters(c);
    world_free(&w);
    return r;
}

/* The time budget (the default): a 30 s lease keeps its lock through 3 s of an unreachable
 * service that starts when its first renewal is due, however many retries fail meanwhile. */
static void time_budget_keeps_a_30s_lease_through_a_3s_outage(void) {
    outage_run r = run_outage(0, 30000, 9000 * MS, 12000 * MS, 120000 * MS);
    EXPECT(r.lost_events == 0);
    EXPECT(r.k.renewals_failed >= 3); /* more than a count budget of 3 forgives */
    EXPECT(r.k.backend_transport_failures == r.k.renewals_failed);
    EXPECT(r.k.renewals_ok >= 3 && r.k.live_leases == 1);
    EXPECT(r.valid_until > 120000 * MS);
    /* The same outage under a count budget of 3 costs the lease, long before its validity ends. */
    outage_run n = run_outage(3, 30000, 9000 * MS, 12000 * MS, 120000 * MS);
    EXPECT(n.lost_events == 1 && n.lost_reason == LH_REASON_FAIL_BUDGET);
    EXPECT(n.k.renewals_failed == 3 && n.k.lost_fail_budget == 1);
    EXPECT(n.lost_at < n.valid_until);
}

/* Unreachable for good: lost before its validity ends (never after), once, with renewals
 * retried until then; under a count budget, after that many failures. */
static void unreachable_service_loses_the_lease_before_validity_ends(void) {
    outage_run r = run_outage(0, 30000, 1, UINT64_MAX, 120000 * MS);
    EXPECT(r.lost_events == 1);
    EXPECT(r.lost_reason == LH_REASON_FAIL_BUDGET);
    EXPECT(r.lost_at > 0 && r.lost_at < r.valid_until);
    EXPECT(r.k.renewals_failed >= 3 && r.k.renewals_ok == 0);
    EXPECT(r.k.lost_fail_budget == 1);

    outage_run n = run_outage(2, 30000, 1, UINT64_MAX, 120000 * MS);
    EXPECT(n.lost_events == 1 && n.lost_reason == LH_REASON_FAIL_BUDGET);
    EXPECT(n.k.renewals_failed == 2 && n.lost_at < n.valid_until);
}

/* -------------------------------------------------------------- several clients, one service */

/* Two clients: contention, loss after a partition, handoff, release. */
static void memory_service_drives_two_clients(void) {
    world w;
    world_init(&w, 2, NULL);
    uint64_t now = 0, lease_a = 0, lease_b = 0;
    uint32_t releasing = 0;
    lh_acquire_options o = opts_ttl(300);

    EXPECT_ST(lh_acquire(w.p[0].c, now, NAME, NAME_LEN, &o, &lease_a), LH_OK);
    pump(&w, now);
    EXPECT(find_event(&w.p[0], LH_EVENT_ACQUIRED, lease_a)->fencing_token == 1);
    o.wait_ns = 5000 * MS;
    EXPECT_ST(lh_acquire(w.p[1].c, now, NAME, NAME_LEN, &o, &lease_b), LH_OK);
    pump(&w, now);
    EXPECT(find_event(&w.p[1], LH_EVENT_ACQUIRED, 0) == NULL); /* A holds it */
    EXPECT(service_status(&w, now).watchers == 1);              /* B waits for the release */

    /* A is cut off: it stops believing before its grant expires; then B gets the lock. */
    set_faults(&w, 0, LH_MEMORY_PARTITIONED);
    advance(&w, &now, 2000 * MS);
    const lh_event *lost = find_event(&w.p[0], LH_EVENT_LOST, lease_a);
    EXPECT(lost != NULL && (lost->reason == LH_REASON_FAIL_BUDGET || lost->reason == LH_REASON_EXPIRED));
    const lh_event *got = find_event(&w.p[1], LH_EVENT_ACQUIRED, lease_b);
    EXPECT(got != NULL && got->fencing_token == 2);
    lh_memory_status st = service_status(&w, now);
    EXPECT(st.held == 1 && st.fencing_token == 2 && st.holder_connection == w.p[1].conn);
    EXPECT(st.holder_token_len == 32);

    /* B releases and the service confirms it. */
    EXPECT_ST(lh_release(w.p[1].c, now, lease_b, &releasing), LH_OK);
    EXPECT(releasing == LH_RELEASING_PENDING);
    pump(&w, now);
    const lh_event *out = find_event(&w.p[1], LH_EVENT_RELEASE_OUTCOME, lease_b);
    EXPECT(out != NULL && out->reason == LH_REASON_RELEASE_CONFIRMED);
    st = service_status(&w, now);
    EXPECT(st.held == 0 && st.last_fencing_token == 2);
    world_free(&w);
}

/* A waiter sleeps until the holder's release wakes it (one notification, no polling). */
static void a_release_wakes_the_waiter(void) {
    world w;
    world_init(&w, 2, NULL);
    uint64_t now = 0, lease_b = 0;
    uint64_t lease_a = acquire_granted(&w, 0, now, 3000);
    lh_acquire_options o = opts_ttl(3000);
    o.wait_ns = 20000 * MS;
    EXPECT_ST(lh_acquire(w.p[1].c, now, NAME, NAME_LEN, &o, &lease_b), LH_OK);
    pump(&w, now);
    advance(&w, &now, 1500 * MS);
    uint64_t acquires = counters(w.p[1].c).acquires_sent;
    EXPECT(find_event(&w.p[1], LH_EVENT_ACQUIRED, 0) == NULL);
    EXPECT_ST(lh_release(w.p[0].c, now, lease_a, NULL), LH_OK);
    pump(&w, now);
    const lh_event *got = find_event(&w.p[1], LH_EVENT_ACQUIRED, lease_b);
    EXPECT(got != NULL && got->fencing_token == 2);
    lh_counters k = counters(w.p[1].c);
    EXPECT(k.backend_wakeups == 1 && k.acquires_sent == acquires + 1);
    world_free(&w);
}

/* The service loses A's grant (a failover) and B takes the lock: A's release is refused
 * (NOT_OWNER) and leaves B alone; B's is confirmed; each is counted. */
static void memory_service_release_outcomes(void) {
    world w;
    world_init(&w, 2, NULL);
    uint64_t lease_a = acquire_granted(&w, 0, 0, 30000);
    EXPECT_ST(lh_memory_service_forget(w.svc, NAME, NAME_LEN), LH_OK);
    uint64_t lease_b = acquire_granted(&w, 1, MS, 30000);
    EXPECT(find_event(&w.p[1], LH_EVENT_ACQUIRED, lease_b)->fencing_token == 2);
    uint32_t releasing = 0;
    EXPECT_ST(lh_release(w.p[0].c, 2 * MS, lease_a, &releasing), LH_OK);
    EXPECT(releasing == LH_RELEASING_PENDING);
    pump(&w, 2 * MS);
    const lh_event *o = find_event(&w.p[0], LH_EVENT_RELEASE_OUTCOME, lease_a);
    EXPECT(o != NULL && o->reason == LH_REASON_RELEASE_NOT_OWNER);
    EXPECT(find_event(&w.p[0], LH_EVENT_LOST, 0) == NULL);
    lh_memory_status st = service_status(&w, 2 * MS);
    EXPECT(st.held == 1 && st.fencing_token == 2 && st.holder_connection == w.p[1].conn);
    lh_counters ka = counters(w.p[0].c);
    EXPECT(ka.releases_not_owner == 1 && ka.releases_confirmed == 0 && ka.releases_lost == 0);

    EXPECT_ST(lh_release(w.p[1].c, 3 * MS, lease_b, &releasing), LH_OK);
    pump(&w, 3 * MS);
    o = find_event(&w.p[1], LH_EVENT_RELEASE_OUTCOME, lease_b);
    EXPECT(o != NULL && o->reason == LH_REASON_RELEASE_CONFIRMED);
    EXPECT(service_status(&w, 3 * MS).held == 0);
    lh_counters kb = counters(w.p[1].c);
    EXPECT(kb.releases_confirmed == 1 && kb.releases_not_owner == 0);
    world_free(&w);
}

/* Answers lost after the service applied the request: the acquire is retried within its
 * wait budget and the service grants the same owner again (no second fence). */
static void dropped_answers_are_transport_errors(void) {
    world w;
    world_init(&w, 1, NULL);
    lh_memory_faults f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    f.drop_next_responses = 1;
    EXPECT_ST(lh_memory_service_set_faults(w.svc, w.p[0].conn, &f), LH_OK);
    lh_acquire_options o = opts_ttl(3000);
    o.wait_ns = 2000 * MS;
    uint64_t lease = 0, now = 0;
    EXPECT_ST(lh_acquire(w.p[0].c, now, NAME, NAME_LEN, &o, &lease), LH_OK);
    pump(&w, now);
    EXPECT(find_event(&w.p[0], LH_EVENT_ACQUIRED, 0) == NULL);
    EXPECT(counters(w.p[0].c).backend_transport_failures == 1);
    EXPECT(strlen(lh_backend_last_error(w.p[0].c)) > 0);
    EXPECT_ST(lh_memory_service_get_faults(w.svc, w.p[0].conn, &f), LH_OK);
    EXPECT(f.drop_next_responses == 0);
    EXPECT(service_status(&w, now).held == 1); /* applied all the same */
    lh_event got;
    EXPECT(advance_until(&w, 0, &now, 2000 * MS, LH_EVENT_ACQUIRED, &got));
    EXPECT(got.lease_id == lease && got.fencing_token == 1);
    world_free(&w);
}

/* A reconnect to the service: the waiter's watch lived on the old connection, so the client
 * asks for it again (lh_io_connection REOPENED) and is woken by a release on the new one. */
static void reconnect_restores_the_watch(void) {
    world w;
    world_init(&w, 2, NULL);
    uint64_t now = 0, lease_b = 0;
    uint64_t lease_a = acquire_granted(&w, 0, now, 30000);
    lh_acquire_options o = opts_ttl(3000);
    o.wait_ns = 60000 * MS;
    EXPECT_ST(lh_acquire(w.p[1].c, now, NAME, NAME_LEN, &o, &lease_b), LH_OK);
    pump(&w, now);
    EXPECT(service_status(&w, now).watchers == 1);
    EXPECT_ST(lh_memory_service_disconnect(w.svc, w.p[1].conn), LH_OK);
    EXPECT(service_status(&w, now).watchers == 0);
    EXPECT_ST(lh_memory_service_connect(w.svc, &w.p[1].conn), LH_OK);
    EXPECT_ST(lh_io_connection(w.p[1].c, now, LH_CONNECTION_COMMANDS, LH_CONNECTION_REOPENED, NULL, 0), LH_OK);
    pump(&w, now);
    EXPECT(service_status(&w, now).watchers == 1);
    EXPECT(find_event(&w.p[1], LH_EVENT_ACQUIRED, 0) == NULL);
    EXPECT_ST(lh_release(w.p[0].c, now + MS, lease_a, NULL), LH_OK);
    pump(&w, now + MS);
    EXPECT(find_event(&w.p[1], LH_EVENT_ACQUIRED, lease_b) != NULL);
    EXPECT(counters(w.p[1].c).backend_wakeups == 1);
    world_free(&w);
}

/* lh_status_request through the memory service: the holder's fence and remaining TTL; a
 * query whose call failed answers with the reason. */
static void status_queries_through_the_service(void) {
    world w;
    world_init(&w, 2, NULL);
    (void)acquire_granted(&w, 0, 0, 3000);
    uint64_t id = 0, free_id = 0;
    EXPECT_ST(lh_status_request(w.p[1].c, 1 * MS, NAME, NAME_LEN, &id), LH_OK);
    EXPECT_ST(lh_status_request(w.p[1].c, 1 * MS, (const uint8_t *)"free", 4, &free_id), LH_OK);
    EXPECT(id != 0 && free_id != 0 && id != free_id);
    lh_lock_status ls;
    memset(&ls, 0, sizeof ls);
    ls.struct_size = sizeof ls;
    EXPECT_ST(lh_poll_status(w.p[1].c, &ls), LH_OK);
    EXPECT(ls.id == 0); /* nothing answered yet */
    pump(&w, 1 * MS);
    int seen = 0;
    for (int i = 0; i < 3; i++) {
        EXPECT_ST(lh_poll_status(w.p[1].c, &ls), LH_OK);
        if (ls.id == 0) break;
        seen++;
        EXPECT(ls.struct_size == sizeof ls && ls.ok == 1 && ls.error_len == 0);
        if (ls.id == id)
            EXPECT(ls.held == 1 && ls.fencing_token == 1 && ls.remaining_ttl_ms > 2900 &&
                   ls.remaining_ttl_ms <= 3000 && ls.last_fencing_token == 1);
        else
            EXPECT(ls.id == free_id && ls.held == 0 && ls.fencing_token == 0);
    }
    EXPECT(seen == 2);
    w.p[1].mode = PEER_HANG;
    EXPECT_ST(lh_status_request(w.p[1].c, 2 * MS, NAME, NAME_LEN, &id), LH_OK);
    pump(&w, 2 * MS);
    EXPECT(w.p[1].nheld == 1);
    static const char why[] = "connection refused";
    EXPECT_ST(lh_io_failed(w.p[1].c, 3 * MS, w.p[1].held[0].id, LH_FAILURE_TRANSPORT, (const uint8_t *)why,
                           sizeof why - 1), LH_OK);
    EXPECT_ST(lh_poll_status(w.p[1].c, &ls), LH_OK);
    EXPECT(ls.id == id && ls.ok == 0 && ls.error_len > 0 && ls.error != NULL);
    if (ls.error != NULL) EXPECT(memmem(ls.error, ls.error_len, why, sizeof why - 1) != NULL);
    world_free(&w);
}

/* lh_io_close on the memory backend gives nothing back of its own: the loop goes on. */
static void close_then_drain(void) {
    world w;
    world_init(&w, 1, NULL);
    uint64_t lease = acquire_granted(&w, 0, 0, 3000);
    EXPECT_ST(lh_release(w.p[0].c, MS, lease, NULL), LH_OK);
    EXPECT_ST(lh_io_close(w.p[0].c, 2 * MS), LH_OK);
    pump(&w, 2 * MS);
    EXPECT(counters(w.p[0].c).pending_cleanups == 0 && service_status(&w, 2 * MS).held == 0);
    world_free(&w);
}

void lifecycle_tests(void) {
    RUN(full_lifecycle);
    RUN(double_release_is_lease_ended);
    RUN(release_while_acquiring_is_cancelled);
    RUN(renew_rejected_is_lost);
    RUN(grant_expired_on_the_service_is_lost_by_rejection);
    RUN(unanswered_renew_expires);
    RUN(time_jump_forward_loses_the_lease);
    RUN(reentrant_acquire_shares_the_lease);
    RUN(many_leases_and_free_with_pending_work);
    RUN(answers_that_are_not_grants_never_grant);
    RUN(same_seed_is_deterministic);
    RUN(reseed_after_fork_gives_distinct_tokens);
    RUN(manual_renew_extends_validity_from_its_send_time);
    RUN(manual_renew_of_an_ended_or_acquiring_lease_sends_nothing);
    RUN(no_auto_renew_lease_is_lost_at_valid_until_without_renewals);
    RUN(release_outcomes_confirmed_and_not_owner);
    RUN(release_never_answered_is_unconfirmed);
    RUN(release_after_a_pause_ends_lost);
    RUN(time_budget_keeps_a_30s_lease_through_a_3s_outage);
    RUN(unreachable_service_loses_the_lease_before_validity_ends);
    RUN(memory_service_drives_two_clients);
    RUN(a_release_wakes_the_waiter);
    RUN(memory_service_release_outcomes);
    RUN(dropped_answers_are_transport_errors);
    RUN(reconnect_restores_the_watch);
    RUN(status_queries_through_the_service);
    RUN(close_then_drain);
}
