package leasehold

// cgo wrappers of the client handle (lh_client_*, lh_acquire, lh_release, lh_poll_event…).
// The IO seam (lh_io_*) is in ffi_backends.go. Where the C header and library come from is
// chosen by link_checkout.go (the default) or link_pkgconfig.go (-tags leasehold_pkgconfig).

/*
#include <stdlib.h>
#include "leasehold.h"

// A test hook (the `testing` feature); weak so a release library links too (see memory.go).
#if defined(__ELF__)
extern lh_status lh_client_debug_panic(struct lh_client *c) __attribute__((weak));
#else
extern lh_status lh_client_debug_panic(struct lh_client *c);
#endif
static int lhgo_has_debug_panic(void) { return lh_client_debug_panic != NULL; }

// The out-parameters of the hot calls, in C memory: a Go variable whose address goes to C
// escapes to the heap, an allocation per call.
typedef struct lhgo_outs {
	lh_acquire_options acq;
	uint64_t u64;
	uint32_t u32;
	int what;
} lhgo_outs;
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"
)

// ABIVersion is the C ABI version this package was written against.
const ABIVersion = 4

// C status codes (lh_status); the values are part of the stable ABI.
const (
	statusOK                 = 0
	statusNullArgument       = 1
	statusInvalidUTF8        = 2
	statusEmptyName          = 3
	statusNameTooLong        = 4
	statusNameHasNul         = 5
	statusInvalidTTL         = 6
	statusInvalidConfig      = 7
	statusSeedTooShort       = 8
	statusUnknownLease       = 9
	statusLeaseEnded         = 10
	statusTooManyLeases      = 11
	statusInvalidEnum        = 12
	statusBackendDataTooLong = 13
	statusBufferTooSmall     = 14
	statusNotGranted         = 15
	statusStructSize         = 16
	statusInvalidReply       = 17
	statusNoBackend          = 18
	statusInvalidToken       = 19
	statusUnknownConnection  = 20
	statusLimitReached       = 21
	statusWrongAnswer        = 22
	statusPanic              = 900
	statusPoisoned           = 901
)

// lh_event kinds (values 1 to 5 are retired).
const (
	evNone          = 0
	evAcquired      = 6
	evAcquireFailed = 7
	evLost          = 8
	evReleased      = 9
	evRenewed       = 10
	evRelOutcome    = 11
)

// Reasons carried by AcquireFailed and Lost events.
const (
	reasonNone          = 0
	reasonWaitExhausted = 1
	reasonCancelled     = 2
	reasonUnavailable   = 3
	reasonRejected      = 4
	reasonExpired       = 5
	reasonFailBudget    = 6
	reasonRelConfirmed  = 7
	reasonRelNotOwner   = 8
	reasonRelUnconfirm  = 9
)

// lh_release dispositions.
const (
	releasingHolderLeft  = 1
	releasingPending     = 2
	releasingLost        = 3
	releasingNotAcquired = 4
)

const (
	stateAcquiring     = 1
	stateHeld          = 2
	stateReleased      = 3
	stateLost          = 4
	stateAcquireFailed = 5
)

const (
	noDeadline      = ^uint64(0)
	flagReentrant   = 1
	flagNoAutoRenew = 2
)

// abiErr is set at package initialisation when the linked library has a
// different ABI version; NewLockClient then refuses to run.
var abiErr error

// Version is the version string of the linked Rust library.
var Version string

func init() {
	v := uint32(C.lh_abi_version())
	Version = C.GoString(C.lh_version())
	if v != ABIVersion {
		abiErr = fmt.Errorf("leasehold: linked library has ABI version %d, this package needs %d (library %s)", v, ABIVersion, Version)
		return
	}
	// The Go mirrors of the header's constants must match the header.
	pairs := [][2]uint64{
		{C.LH_ABI_VERSION, ABIVersion},
		{C.LH_ERR_NULL_ARGUMENT, statusNullArgument}, {C.LH_ERR_INVALID_UTF8, statusInvalidUTF8},
		{C.LH_ERR_EMPTY_NAME, statusEmptyName}, {C.LH_ERR_NAME_TOO_LONG, statusNameTooLong},
		{C.LH_ERR_NAME_HAS_NUL, statusNameHasNul}, {C.LH_ERR_INVALID_TTL, statusInvalidTTL},
		{C.LH_ERR_INVALID_CONFIG, statusInvalidConfig}, {C.LH_ERR_SEED_TOO_SHORT, statusSeedTooShort},
		{C.LH_ERR_UNKNOWN_LEASE, statusUnknownLease}, {C.LH_ERR_LEASE_ENDED, statusLeaseEnded},
		{C.LH_ERR_TOO_MANY_LEASES, statusTooManyLeases}, {C.LH_ERR_INVALID_ENUM, statusInvalidEnum},
		{C.LH_ERR_BACKEND_DATA_TOO_LONG, statusBackendDataTooLong}, {C.LH_ERR_BUFFER_TOO_SMALL, statusBufferTooSmall},
		{C.LH_ERR_NOT_GRANTED, statusNotGranted}, {C.LH_ERR_STRUCT_SIZE, statusStructSize},
		{C.LH_ERR_INVALID_REPLY, statusInvalidReply}, {C.LH_ERR_NO_BACKEND, statusNoBackend},
		{C.LH_ERR_INVALID_TOKEN, statusInvalidToken}, {C.LH_ERR_UNKNOWN_CONNECTION, statusUnknownConnection},
		{C.LH_ERR_LIMIT_REACHED, statusLimitReached}, {C.LH_ERR_WRONG_ANSWER, statusWrongAnswer},
		{C.LH_ERR_PANIC, statusPanic}, {C.LH_ERR_POISONED, statusPoisoned},
		{C.LH_EVENT_NONE, evNone}, {C.LH_EVENT_ACQUIRED, evAcquired}, {C.LH_EVENT_ACQUIRE_FAILED, evAcquireFailed},
		{C.LH_EVENT_LOST, evLost}, {C.LH_EVENT_RELEASED, evReleased},
		{C.LH_EVENT_RENEWED, evRenewed}, {C.LH_EVENT_RELEASE_OUTCOME, evRelOutcome},
		{C.LH_REASON_NONE, reasonNone},
		{C.LH_REASON_WAIT_EXHAUSTED, reasonWaitExhausted}, {C.LH_REASON_CANCELLED, reasonCancelled},
		{C.LH_REASON_UNAVAILABLE, reasonUnavailable}, {C.LH_REASON_REJECTED, reasonRejected},
		{C.LH_REASON_EXPIRED, reasonExpired}, {C.LH_REASON_FAIL_BUDGET, reasonFailBudget},
		{C.LH_REASON_RELEASE_CONFIRMED, reasonRelConfirmed}, {C.LH_REASON_RELEASE_NOT_OWNER, reasonRelNotOwner},
		{C.LH_REASON_RELEASE_UNCONFIRMED, reasonRelUnconfirm},
		{C.LH_RELEASING_HOLDER_LEFT, releasingHolderLeft}, {C.LH_RELEASING_PENDING, releasingPending},
		{C.LH_RELEASING_LOST, releasingLost}, {C.LH_RELEASING_NOT_ACQUIRED, releasingNotAcquired},
		{C.LH_STATE_ACQUIRING, stateAcquiring}, {C.LH_STATE_HELD, stateHeld}, {C.LH_STATE_RELEASED, stateReleased},
		{C.LH_STATE_LOST, stateLost}, {C.LH_STATE_ACQUIRE_FAILED, stateAcquireFailed},
		{C.LH_NO_DEADLINE, noDeadline}, {C.LH_ACQUIRE_REENTRANT, flagReentrant},
		{C.LH_ACQUIRE_NO_AUTO_RENEW, flagNoAutoRenew},
	}
	for i, p := range pairs {
		if p[0] != p[1] {
			abiErr = fmt.Errorf("leasehold: constant #%d differs between leasehold.h (%d) and the Go binding (%d)", i, p[0], p[1])
			return
		}
	}
}

// clockBase is the origin of the monotonic nanosecond clock handed to the
// core. time.Since uses the monotonic reading carried by clockBase.
var clockBase = time.Now()

// clockOffset keeps the core's clock away from zero.
const clockOffset = uint64(time.Second)

func monoNow() uint64 { return uint64(time.Since(clockBase)) + clockOffset }

func monoToTime(ns uint64) time.Time {
	if ns < clockOffset {
		return clockBase
	}
	return clockBase.Add(time.Duration(ns - clockOffset))
}

// handlesFreed counts core handles freed (tests observe the GC cleanup).
var handlesFreed atomic.Int64

// core wraps one lh_client. It is not safe for concurrent use: the LockClient
// serialises every call with its mutex.
type core struct {
	p *C.lh_client
	// Reused by the polls (the handle is used under its client's mutex), in C memory: no
	// allocation and no cgo pointer check per call.
	req       *C.lh_io_request
	ev        *C.lh_event
	outs      *C.lhgo_outs
	u64       *C.uint64_t    // &outs.u64, for the other files' calls
	what      *C.int         // &outs.what
	statusOut int            // status queries the core has yet to answer
	write     ioRequest      // the polled WRITE (see request)
	peek      unsafe.Pointer // the step after an event, taken with it (ffi_backends.go)
	next      drainStep      // that step, when peeked: the next step's answer
	peeked    bool
}

// emptyByte gives an empty Go string or slice a non-NULL pointer of length zero.
var emptyByte [1]byte

func strPtr(s string) (*C.uint8_t, C.size_t) {
	if len(s) == 0 {
		return (*C.uint8_t)(unsafe.Pointer(&emptyByte[0])), 0
	}
	return (*C.uint8_t)(unsafe.Pointer(unsafe.StringData(s))), C.size_t(len(s))
}

func bytesPtr(b []byte) (*C.uint8_t, C.size_t) {
	if len(b) == 0 {
		return (*C.uint8_t)(unsafe.Pointer(&emptyByte[0])), 0
	}
	return (*C.uint8_t)(unsafe.Pointer(&b[0])), C.size_t(len(b))
}

func statusName(st uint32) string {
	return C.GoString(C.lh_status_str(C.uint32_t(st)))
}

type coreConfig struct {
	driftPPM         uint32
	driftFixedNs     uint64
	renewJitterPPM   uint32
	failBudget       uint32
	requestTimeoutNs uint64
	backoffBaseNs    uint64
	backoffCapNs     uint64
	maxTTLms         uint64
	maxLeases        uint32
	notifications    bool
}

func defaultCoreConfig() coreConfig {
	var c C.lh_config
	C.lh_config_default(&c)
	return coreConfig{
		driftPPM:         uint32(c.drift_ppm),
		driftFixedNs:     uint64(c.drift_fixed_ns),
		renewJitterPPM:   uint32(c.renew_jitter_ppm),
		failBudget:       uint32(c.fail_budget),
		requestTimeoutNs: uint64(c.request_timeout_ns),
		backoffBaseNs:    uint64(c.backoff_base_ns),
		backoffCapNs:     uint64(c.backoff_cap_ns),
		maxTTLms:         uint64(c.max_ttl_ms),
		maxLeases:        uint32(c.max_leases),
		notifications:    c.notifications != 0,
	}
}

func cConfig(cfg coreConfig) C.lh_config {
	var c C.lh_config
	C.lh_config_default(&c)
	c.drift_ppm = C.uint32_t(cfg.driftPPM)
	c.drift_fixed_ns = C.uint64_t(cfg.driftFixedNs)
	c.renew_jitter_ppm = C.uint32_t(cfg.renewJitterPPM)
	c.fail_budget = C.uint32_t(cfg.failBudget)
	c.request_timeout_ns = C.uint64_t(cfg.requestTimeoutNs)
	c.backoff_base_ns = C.uint64_t(cfg.backoffBaseNs)
	c.backoff_cap_ns = C.uint64_t(cfg.backoffCapNs)
	c.max_ttl_ms = C.uint64_t(cfg.maxTTLms)
	c.max_leases = C.uint32_t(cfg.maxLeases)
	c.notifications = 0
	if cfg.notifications {
		c.notifications = 1
	}
	return c
}

// newCore creates a client handle speaking backend b's protocol (lh_client_new).
func newCore(cfg coreConfig, b backendOptions, seed []byte) (*core, error) {
	c := cConfig(cfg)
	o, free, err := b.c()
	if err != nil {
		return nil, err
	}
	defer free()
	sp, sn := bytesPtr(seed)
	var out *C.lh_client
	st := uint32(C.lh_client_new(&c, &o, sp, sn, &out))
	if st != statusOK {
		why := clientNewReason(&c, &o, sp, sn)
		runtime.KeepAlive(seed)
		runtime.KeepAlive(b)
		return nil, &StatusError{Status: st, Name: statusName(st), Op: "lh_client_new", Detail: why}
	}
	runtime.KeepAlive(seed)
	runtime.KeepAlive(b)
	outs := (*C.lhgo_outs)(C.calloc(1, C.sizeof_lhgo_outs))
	return &core{p: out, req: (*C.lh_io_request)(C.malloc(C.sizeof_lh_io_request)),
		ev: (*C.lh_event)(C.malloc(C.sizeof_lh_event)), outs: outs, u64: &outs.u64, what: &outs.what, peek: newPeek()}, nil
}

// clientNewReason asks the core why lh_client_new refused these arguments
// (lh_client_new_check): there is no handle yet to hold the detail.
func clientNewReason(c *C.lh_config, o *C.lh_backend_options, sp *C.uint8_t, sn C.size_t) string {
	buf := make([]byte, 256)
	for {
		var n C.size_t
		C.lh_client_new_check(c, o, sp, sn, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &n)
		if int(n) < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, int(n)+1)
	}
}

func (c *core) free() {
	if c.p != nil {
		c.freeHandle()
		handlesFreed.Add(1)
	}
}

// freeHandle frees the handle and the poll buffers.
func (c *core) freeHandle() {
	C.lh_client_free(c.p)
	C.free(unsafe.Pointer(c.req))
	C.free(unsafe.Pointer(c.ev))
	C.free(unsafe.Pointer(c.outs))
	C.free(c.peek)
	c.p, c.req, c.ev, c.outs, c.u64, c.what, c.peek = nil, nil, nil, nil, nil, nil, nil
}

func (c *core) err(op string, st uint32) error {
	if st == statusOK {
		return nil
	}
	detail := ""
	if c.p != nil {
		detail = C.GoString(C.lh_client_last_error(c.p))
	}
	return &StatusError{Status: st, Name: statusName(st), Op: op, Detail: detail}
}

func (c *core) reseed(seed []byte) error {
	sp, sn := bytesPtr(seed)
	st := uint32(C.lh_client_reseed(c.p, sp, sn))
	runtime.KeepAlive(seed)
	runtime.KeepAlive(c)
	return c.err("lh_client_reseed", st)
}

// acquireDefaults is lh_acquire_options_default's, read once.
var acquireDefaults = func() (o C.lh_acquire_options) {
	C.lh_acquire_options_default(&o)
	return o
}()

func (c *core) acquire(now uint64, name string, ttlMs, waitNs uint64, flags uint32) (uint64, error) {
	o := &c.outs.acq
	*o = acquireDefaults
	o.ttl_ms = C.uint64_t(ttlMs)
	o.wait_ns = C.uint64_t(waitNs)
	o.flags = C.uint32_t(flags)
	np, nn := strPtr(name)
	st := uint32(C.lh_acquire(c.p, C.uint64_t(now), np, nn, o, c.u64))
	runtime.KeepAlive(name)
	runtime.KeepAlive(c)
	if st != statusOK {
		return 0, c.err("lh_acquire", st)
	}
	return uint64(*c.u64), nil
}

// release releases a lease without asking for its outcome.
func (c *core) release(now, lease uint64) error {
	st := uint32(C.lh_release(c.p, C.uint64_t(now), C.uint64_t(lease), nil))
	runtime.KeepAlive(c)
	return c.err("lh_release", st)
}

// releaseReported is release that also tells what it did (an LH_RELEASING_* value) and
// asks for the service's answer (an LH_EVENT_RELEASE_OUTCOME event).
func (c *core) releaseReported(now, lease uint64) (uint32, error) {
	r := &c.outs.u32
	st := uint32(C.lh_release(c.p, C.uint64_t(now), C.uint64_t(lease), r))
	runtime.KeepAlive(c)
	if st != statusOK {
		return 0, c.err("lh_release", st)
	}
	return uint32(*r), nil
}

func (c *core) renew(now, lease uint64) error {
	st := uint32(C.lh_renew(c.p, C.uint64_t(now), C.uint64_t(lease)))
	runtime.KeepAlive(c)
	return c.err("lh_renew", st)
}

func (c *core) timeout(now uint64) error {
	st := uint32(C.lh_timeout(c.p, C.uint64_t(now)))
	runtime.KeepAlive(c)
	return c.err("lh_timeout", st)
}

// event is a copy of one lh_event.
type event struct {
	kind         uint32
	reason       uint32
	lease        uint64
	fencingToken uint64
	validUntil   uint64
}

func (c *core) pollEvent() (event, error) {
	st := uint32(C.lh_poll_event(c.p, c.ev))
	runtime.KeepAlive(c)
	if st != statusOK {
		return event{}, c.err("lh_poll_event", st)
	}
	return c.event(), nil
}

// event copies the polled event.
func (c *core) event() event { return cEvent(c.ev) }

func cEvent(e *C.lh_event) event {
	return event{kind: uint32(e.kind), reason: uint32(e.reason), lease: uint64(e.lease_id),
		fencingToken: uint64(e.fencing_token), validUntil: uint64(e.valid_until_ns)}
}

func (c *core) pollTimeout() (uint64, error) {
	st := uint32(C.lh_poll_timeout(c.p, c.u64))
	runtime.KeepAlive(c)
	if st != statusOK {
		return noDeadline, c.err("lh_poll_timeout", st)
	}
	return uint64(*c.u64), nil
}

func (c *core) leaseState(lease uint64) (uint32, error) {
	s := &c.outs.u32
	st := uint32(C.lh_lease_state(c.p, C.uint64_t(lease), s))
	runtime.KeepAlive(c)
	if st != statusOK {
		return 0, c.err("lh_lease_state", st)
	}
	return uint32(*s), nil
}

func (c *core) fencingToken(lease uint64) (uint64, error) {
	var v C.uint64_t
	st := uint32(C.lh_fencing_token(c.p, C.uint64_t(lease), &v))
	runtime.KeepAlive(c)
	if st != statusOK {
		return 0, c.err("lh_fencing_token", st)
	}
	return uint64(v), nil
}

func (c *core) validUntil(lease uint64) (uint64, error) {
	var v C.uint64_t
	st := uint32(C.lh_valid_until(c.p, C.uint64_t(lease), &v))
	runtime.KeepAlive(c)
	if st != statusOK {
		return 0, c.err("lh_valid_until", st)
	}
	return uint64(v), nil
}

func (c *core) isHeld(lease, now uint64) (bool, error) {
	var v C.bool
	st := uint32(C.lh_is_held(c.p, C.uint64_t(lease), C.uint64_t(now), &v))
	runtime.KeepAlive(c)
	if st != statusOK {
		return false, c.err("lh_is_held", st)
	}
	return bool(v), nil
}

// Counters mirrors the core's lh_counters: the engine's work, then its backend
// protocol's (the Backend… fields for every backend, the others for theirs).
type Counters struct {
	LiveLeases      uint64
	PendingCleanups uint64
	AcquiresSent    uint64
	Grants          uint64
	AcquireFailed   uint64
	RenewalsSent    uint64
	RenewalsOK      uint64
	RenewalsFailed  uint64
	ReleasesSent    uint64
	LostRejected    uint64
	LostExpired     uint64
	LostFailBudget  uint64
	StaleResults    uint64
	TimeClamped     uint64
	// Renewals asked for with Lease.Renew (sent or joined).
	RenewalsRequested uint64
	// Outcomes of application releases: confirmed by the service, refused
	// (not owner), unanswered before the grant had certainly run out, and
	// releases that found the validity run out (the lease ended lost).
	ReleasesConfirmed   uint64
	ReleasesNotOwner    uint64
	ReleasesUnconfirmed uint64
	ReleasesLost        uint64

	// The backend protocol: requests emitted, error answers (error replies,
	// etcd error bodies, memory refusals), answers of a shape the request
	// cannot have, answers for unknown or answered requests, requests that
	// failed in transport, release notifications that woke a waiting name,
	// and notifications ignored (not for a name waited on here).
	BackendRequests          uint64
	BackendErrorReplies      uint64
	BackendGarbageReplies    uint64
	BackendStaleReplies      uint64
	BackendTransportFailures uint64
	BackendWakeups           uint64
	BackendIgnoredMessages   uint64
	// Redis: script calls, scripts re-sent after NOSCRIPT, retries answered
	// without a round trip, standbys that tried after hearing nothing, times
	// the wake channel's subscription took effect or was lost, and 1 while
	// it is in effect.
	RedisScriptCalls      uint64
	RedisNoscriptRetries  uint64
	RedisLocalRefusals    uint64
	RedisStandbyTakeovers uint64
	RedisSubscriptions    uint64
	RedisSubscriberLosses uint64
	RedisSubscribed       uint64
	// SQL: schema migrations emitted, requests the database refused.
	SQLMigrations     uint64
	SQLDatabaseErrors uint64
	// etcd: leases granted, acquire transactions, watches opened on a
	// predecessor, keep-alives of waiting leases, waiters whose etcd lease
	// was gone.
	EtcdLeasesGranted     uint64
	EtcdTxns              uint64
	EtcdWatches           uint64
	EtcdWaitingKeepalives uint64
	EtcdWaitersExpired    uint64
	// Redis stream kind (NewRedisStreamExecutor): connections asked for (to
	// the servers and the sentinels), connections that ended (closed by the
	// host or the server, or shut down by the core), reports about
	// connections already ended (ignored), and master lookups sent to a
	// sentinel. Zero for the other kinds, and with a library older than
	// these fields.
	StreamOpens       uint64
	StreamCloses      uint64
	StreamLateAnswers uint64
	SentinelLookups   uint64
	// With a redis+cluster:// URL: slot map questions (CLUSTER SHARDS /
	// SLOTS) sent, and MOVED / ASK redirections followed (a steady count
	// means the slot map is current).
	ClusterRefreshes uint64
	ClusterRedirects uint64
}

func (c *core) counters() (Counters, error) {
	var k C.lh_counters
	k.struct_size = C.uint32_t(unsafe.Sizeof(k))
	st := uint32(C.lh_counters_get(c.p, &k))
	runtime.KeepAlive(c)
	if st != statusOK {
		return Counters{}, c.err("lh_counters_get", st)
	}
	u := func(v C.uint64_t) uint64 { return uint64(v) }
	return Counters{
		LiveLeases: u(k.live_leases), PendingCleanups: u(k.pending_cleanups), AcquiresSent: u(k.acquires_sent),
		Grants: u(k.grants), AcquireFailed: u(k.acquire_failed), RenewalsSent: u(k.renewals_sent),
		RenewalsOK: u(k.renewals_ok), RenewalsFailed: u(k.renewals_failed), ReleasesSent: u(k.releases_sent),
		LostRejected: u(k.lost_rejected), LostExpired: u(k.lost_expired), LostFailBudget: u(k.lost_fail_budget),
		StaleResults: u(k.stale_results), TimeClamped: u(k.time_clamped),
		RenewalsRequested: u(k.renewals_requested), ReleasesConfirmed: u(k.releases_confirmed),
		ReleasesNotOwner: u(k.releases_not_owner), ReleasesUnconfirmed: u(k.releases_unconfirmed),
		ReleasesLost: u(k.releases_lost),

		BackendRequests: u(k.backend_requests), BackendErrorReplies: u(k.backend_error_replies),
		BackendGarbageReplies: u(k.backend_garbage_replies), BackendStaleReplies: u(k.backend_stale_replies),
		BackendTransportFailures: u(k.backend_transport_failures), BackendWakeups: u(k.backend_wakeups),
		BackendIgnoredMessages: u(k.backend_ignored_messages),
		RedisScriptCalls:       u(k.redis_script_calls), RedisNoscriptRetries: u(k.redis_noscript_retries),
		RedisLocalRefusals: u(k.redis_local_refusals), RedisStandbyTakeovers: u(k.redis_standby_takeovers),
		RedisSubscriptions: u(k.redis_subscriptions), RedisSubscriberLosses: u(k.redis_subscriber_losses),
		RedisSubscribed: u(k.redis_subscribed),
		SQLMigrations:   u(k.sql_migrations), SQLDatabaseErrors: u(k.sql_database_errors),
		EtcdLeasesGranted: u(k.etcd_leases_granted), EtcdTxns: u(k.etcd_txns), EtcdWatches: u(k.etcd_watches),
		EtcdWaitingKeepalives: u(k.etcd_waiting_keepalives), EtcdWaitersExpired: u(k.etcd_waiters_expired),
		StreamOpens: u(k.stream_opens), StreamCloses: u(k.stream_closes),
		StreamLateAnswers: u(k.stream_late_answers), SentinelLookups: u(k.sentinel_lookups),
		ClusterRefreshes: u(k.cluster_refreshes), ClusterRedirects: u(k.cluster_redirects),
	}, nil
}

// RedisCounters is what the core's Redis protocol saw, read from Counters.
type RedisCounters struct {
	Subscribed        bool   // the wake channel's subscription is in effect
	Requests          uint64 // requests emitted
	ScriptCalls       uint64 // script calls emitted
	NoscriptRetries   uint64 // script calls re-sent after the server lost its script cache
	ErrorReplies      uint64
	GarbageReplies    uint64 // replies of a shape the request cannot have
	StaleReplies      uint64
	TransportFailures uint64
	LocalRefusals     uint64 // retries answered without a round trip
	Wakeups           uint64
	StandbyTakeovers  uint64 // standbys that tried after hearing nothing
	IgnoredMessages   uint64
	Subscriptions     uint64 // times the subscription took effect
	SubscriberLosses  uint64
	// The stream kind's connections (see Counters.StreamOpens).
	StreamOpens       uint64
	StreamCloses      uint64
	StreamLateAnswers uint64
	SentinelLookups   uint64
	ClusterRefreshes  uint64
	ClusterRedirects  uint64
}

func (k Counters) redis() RedisCounters {
	return RedisCounters{
		Subscribed: k.RedisSubscribed != 0, Requests: k.BackendRequests, ScriptCalls: k.RedisScriptCalls,
		NoscriptRetries: k.RedisNoscriptRetries, ErrorReplies: k.BackendErrorReplies,
		GarbageReplies: k.BackendGarbageReplies, StaleReplies: k.BackendStaleReplies,
		TransportFailures: k.BackendTransportFailures, LocalRefusals: k.RedisLocalRefusals,
		Wakeups: k.BackendWakeups, StandbyTakeovers: k.RedisStandbyTakeovers,
		IgnoredMessages: k.BackendIgnoredMessages, Subscriptions: k.RedisSubscriptions,
		SubscriberLosses: k.RedisSubscriberLosses,
		StreamOpens:      k.StreamOpens, StreamCloses: k.StreamCloses,
		StreamLateAnswers: k.StreamLateAnswers, SentinelLookups: k.SentinelLookups,
		ClusterRefreshes: k.ClusterRefreshes, ClusterRedirects: k.ClusterRedirects,
	}
}

// EtcdCounters is what the core's etcd protocol saw, read from Counters.
type EtcdCounters struct {
	Requests          uint64 // requests emitted
	LeasesGranted     uint64
	Txns              uint64 // acquire transactions sent
	Watches           uint64 // watches opened on a predecessor
	Wakeups           uint64 // waiters woken by their predecessor's deletion (or a cut watch)
	WaitingKeepalives uint64
	WaitersExpired    uint64 // waiters whose etcd lease was gone (they rejoined the queue)
	ErrorReplies      uint64
	GarbageReplies    uint64
	TransportFailures uint64
	StaleReplies      uint64
}

func (k Counters) etcd() EtcdCounters {
	return EtcdCounters{
		Requests: k.BackendRequests, LeasesGranted: k.EtcdLeasesGranted, Txns: k.EtcdTxns,
		Watches: k.EtcdWatches, Wakeups: k.BackendWakeups, WaitingKeepalives: k.EtcdWaitingKeepalives,
		WaitersExpired: k.EtcdWaitersExpired, ErrorReplies: k.BackendErrorReplies,
		GarbageReplies: k.BackendGarbageReplies, TransportFailures: k.BackendTransportFailures,
		StaleReplies: k.BackendStaleReplies,
	}
}

func (c *core) debugPanic() error {
	if C.lhgo_has_debug_panic() == 0 {
		return fmt.Errorf("leasehold: lh_client_debug_panic: %w", ErrNoTestingFeature)
	}
	st := uint32(C.lh_client_debug_panic(c.p))
	runtime.KeepAlive(c)
	return c.err("lh_client_debug_panic", st)
}
