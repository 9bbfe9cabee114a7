package leasehold

// Where the C header and library come from is chosen by link_checkout.go (the default) or
// link_pkgconfig.go (-tags leasehold_pkgconfig).

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
const ABIVersion = 2

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
	statusPanic              = 900
	statusPoisoned           = 901
)

const (
	outNone          = 0
	outAcquire       = 1
	outRenew         = 2
	outRelease       = 3
	outWatch         = 4
	outUnwatch       = 5
	outAcquired      = 6
	outAcquireFailed = 7
	outLost          = 8
	outReleased      = 9
	outRenewed       = 10
	outRelOutcome    = 11
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

// lh_release_reported dispositions.
const (
	releasingHolderLeft  = 1
	releasingPending     = 2
	releasingLost        = 3
	releasingNotAcquired = 4
)

const (
	acquireGranted        = 1
	acquireHeldByOther    = 2
	acquireTransportError = 3
	renewRenewed          = 1
	renewRejected         = 2
	renewTransportError   = 3
	releaseReleased       = 1
	releaseNotOwner       = 2
	releaseTransportError = 3
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
	noRetryHint     = ^uint64(0)
	flagReentrant   = 1
	flagNoAutoRenew = 2
)

// The Redis request and reply ABI (lh_poll_request, lh_reply).
const (
	connCommands       = 1
	connSubscriber     = 2
	valueNil           = 1
	valueInt           = 2
	valueBulk          = 3
	valueStatus        = 4
	valueError         = 5
	valueArray         = 6
	statusInvalidReply = 17
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
		{C.LH_ERR_PANIC, statusPanic}, {C.LH_ERR_POISONED, statusPoisoned},
		{C.LH_OUTPUT_NONE, outNone}, {C.LH_OUTPUT_ACQUIRE, outAcquire}, {C.LH_OUTPUT_RENEW, outRenew},
		{C.LH_OUTPUT_RELEASE, outRelease}, {C.LH_OUTPUT_WATCH, outWatch}, {C.LH_OUTPUT_UNWATCH, outUnwatch},
		{C.LH_OUTPUT_ACQUIRED, outAcquired}, {C.LH_OUTPUT_ACQUIRE_FAILED, outAcquireFailed},
		{C.LH_OUTPUT_LOST, outLost}, {C.LH_OUTPUT_RELEASED, outReleased},
		{C.LH_OUTPUT_RENEWED, outRenewed}, {C.LH_OUTPUT_RELEASE_OUTCOME, outRelOutcome},
		{C.LH_REASON_WAIT_EXHAUSTED, reasonWaitExhausted}, {C.LH_REASON_CANCELLED, reasonCancelled},
		{C.LH_REASON_UNAVAILABLE, reasonUnavailable}, {C.LH_REASON_REJECTED, reasonRejected},
		{C.LH_REASON_EXPIRED, reasonExpired}, {C.LH_REASON_FAIL_BUDGET, reasonFailBudget},
		{C.LH_REASON_RELEASE_CONFIRMED, reasonRelConfirmed}, {C.LH_REASON_RELEASE_NOT_OWNER, reasonRelNotOwner},
		{C.LH_REASON_RELEASE_UNCONFIRMED, reasonRelUnconfirm},
		{C.LH_RELEASING_HOLDER_LEFT, releasingHolderLeft}, {C.LH_RELEASING_PENDING, releasingPending},
		{C.LH_RELEASING_LOST, releasingLost}, {C.LH_RELEASING_NOT_ACQUIRED, releasingNotAcquired},
		{C.LH_ACQUIRE_NO_AUTO_RENEW, flagNoAutoRenew},
		{C.LH_ACQUIRE_GRANTED, acquireGranted}, {C.LH_ACQUIRE_HELD_BY_OTHER, acquireHeldByOther},
		{C.LH_ACQUIRE_TRANSPORT_ERROR, acquireTransportError},
		{C.LH_RENEW_RENEWED, renewRenewed}, {C.LH_RENEW_REJECTED, renewRejected},
		{C.LH_RENEW_TRANSPORT_ERROR, renewTransportError},
		{C.LH_RELEASE_RELEASED, releaseReleased}, {C.LH_RELEASE_NOT_OWNER, releaseNotOwner},
		{C.LH_RELEASE_TRANSPORT_ERROR, releaseTransportError},
		{C.LH_STATE_ACQUIRING, stateAcquiring}, {C.LH_STATE_HELD, stateHeld}, {C.LH_STATE_RELEASED, stateReleased},
		{C.LH_STATE_LOST, stateLost}, {C.LH_STATE_ACQUIRE_FAILED, stateAcquireFailed},
		{C.LH_NO_DEADLINE, noDeadline}, {C.LH_NO_RETRY_HINT, noRetryHint}, {C.LH_ACQUIRE_REENTRANT, flagReentrant},
		{C.LH_CONNECTION_COMMANDS, connCommands}, {C.LH_CONNECTION_SUBSCRIBER, connSubscriber},
		{C.LH_VALUE_NIL, valueNil}, {C.LH_VALUE_INT, valueInt}, {C.LH_VALUE_BULK, valueBulk},
		{C.LH_VALUE_STATUS, valueStatus}, {C.LH_VALUE_ERROR, valueError}, {C.LH_VALUE_ARRAY, valueArray},
		{C.LH_ERR_INVALID_REPLY, statusInvalidReply},
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
}

// cbytes returns a pointer suitable for passing a Go byte string to C. An
// empty string gets a pointer to a static byte so the C side sees a
// non-NULL pointer with length zero.
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

// redisProtocol tunes a core created with the Redis protocol attached (lh_redis_options);
// zero fields take the library's defaults.
type redisProtocol struct {
	standbyDelayMs, keyKeepMs, queueMaxAgeMs, idleRecheckMs uint64
	shardedWake                                             bool // Redis Cluster: lh_redis_options.sharded_wake
}

// newCore creates a core handle: with the Redis protocol attached when rp is not nil.
func newCore(cfg coreConfig, rp *redisProtocol, seed []byte) (*core, error) {
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
	if cfg.notifications {
		c.notifications = 1
	} else {
		c.notifications = 0
	}
	sp, sn := bytesPtr(seed)
	var out *C.lh_client
	var st uint32
	op := "lh_client_new"
	if rp == nil {
		st = uint32(C.lh_client_new(&c, sp, sn, &out))
	} else {
		op = "lh_client_new_redis"
		var o C.lh_redis_options
		C.lh_redis_options_default(&o)
		for _, f := range []struct {
			dst *C.uint64_t
			v   uint64
		}{{&o.standby_delay_ms, rp.standbyDelayMs}, {&o.key_keep_ms, rp.keyKeepMs},
			{&o.queue_max_age_ms, rp.queueMaxAgeMs}, {&o.idle_recheck_ms, rp.idleRecheckMs}} {
			if f.v > 0 {
				*f.dst = C.uint64_t(f.v)
			}
		}
		if rp.shardedWake {
			o.sharded_wake = 1
		}
		st = uint32(C.lh_client_new_redis(&c, &o, sp, sn, &out))
	}
	runtime.KeepAlive(seed)
	if st != statusOK {
		return nil, &StatusError{Status: st, Name: statusName(st), Op: op}
	}
	return &core{p: out}, nil
}

func (c *core) free() {
	if c.p != nil {
		C.lh_client_free(c.p)
		c.p = nil
		handlesFreed.Add(1)
	}
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

func (c *core) acquire(now uint64, name string, ttlMs, waitNs uint64, flags uint32) (uint64, error) {
	var o C.lh_acquire_options
	C.lh_acquire_options_default(&o)
	o.ttl_ms = C.uint64_t(ttlMs)
	o.wait_ns = C.uint64_t(waitNs)
	o.flags = C.uint32_t(flags)
	np, nn := strPtr(name)
	var lease C.uint64_t
	st := uint32(C.lh_acquire(c.p, C.uint64_t(now), np, nn, &o, &lease))
	runtime.KeepAlive(name)
	runtime.KeepAlive(c)
	if st != statusOK {
		return 0, c.err("lh_acquire", st)
	}
	return uint64(lease), nil
}

func (c *core) release(now, lease uint64) error {
	st := uint32(C.lh_release(c.p, C.uint64_t(now), C.uint64_t(lease)))
	runtime.KeepAlive(c)
	return c.err("lh_release", st)
}

// releaseReported is release that also tells what it did (an LH_RELEASING_* value).
func (c *core) releaseReported(now, lease uint64) (uint32, error) {
	var r C.uint32_t
	st := uint32(C.lh_release_reported(c.p, C.uint64_t(now), C.uint64_t(lease), &r))
	runtime.KeepAlive(c)
	if st != statusOK {
		return 0, c.err("lh_release_reported", st)
	}
	return uint32(r), nil
}

func (c *core) renew(now, lease uint64) error {
	st := uint32(C.lh_renew(c.p, C.uint64_t(now), C.uint64_t(lease)))
	runtime.KeepAlive(c)
	return c.err("lh_renew", st)
}

func (c *core) acquireResult(now, req uint64, outcome uint32, fence, ttlMs, retryMs uint64, data []byte) error {
	dp, dn := bytesPtr(data)
	st := uint32(C.lh_acquire_result(c.p, C.uint64_t(now), C.uint64_t(req), C.uint32_t(outcome),
		C.uint64_t(fence), C.uint64_t(ttlMs), C.uint64_t(retryMs), dp, dn))
	runtime.KeepAlive(data)
	runtime.KeepAlive(c)
	return c.err("lh_acquire_result", st)
}

func (c *core) renewResult(now, req uint64, outcome uint32) error {
	st := uint32(C.lh_renew_result(c.p, C.uint64_t(now), C.uint64_t(req), C.uint32_t(outcome)))
	runtime.KeepAlive(c)
	return c.err("lh_renew_result", st)
}

func (c *core) releaseResult(now, req uint64, outcome uint32) error {
	st := uint32(C.lh_release_result(c.p, C.uint64_t(now), C.uint64_t(req), C.uint32_t(outcome)))
	runtime.KeepAlive(c)
	return c.err("lh_release_result", st)
}

func (c *core) released(now uint64, name string) error {
	np, nn := strPtr(name)
	st := uint32(C.lh_released(c.p, C.uint64_t(now), np, nn))
	runtime.KeepAlive(name)
	runtime.KeepAlive(c)
	return c.err("lh_released", st)
}

func (c *core) timeout(now uint64) error {
	st := uint32(C.lh_timeout(c.p, C.uint64_t(now)))
	runtime.KeepAlive(c)
	return c.err("lh_timeout", st)
}

// output is a copy of one lh_output: it owns its memory.
type output struct {
	kind         uint32
	reason       uint32
	request      uint64
	lease        uint64
	name         string
	token        string
	backendData  []byte
	ttlMs        uint64
	fencingToken uint64
	validUntil   uint64
}

func (c *core) pollOutput() (output, error) {
	var o C.lh_output
	st := uint32(C.lh_poll_output(c.p, &o))
	if st != statusOK {
		runtime.KeepAlive(c)
		return output{}, c.err("lh_poll_output", st)
	}
	out := output{
		kind:         uint32(o.kind),
		reason:       uint32(o.reason),
		request:      uint64(o.request_id),
		lease:        uint64(o.lease_id),
		ttlMs:        uint64(o.ttl_ms),
		fencingToken: uint64(o.fencing_token),
		validUntil:   uint64(o.valid_until_ns),
	}
	// Borrowed pointers are valid until the next call on the handle: copy now.
	if o.name != nil && o.name_len > 0 {
		out.name = C.GoStringN((*C.char)(unsafe.Pointer(o.name)), C.int(o.name_len))
	}
	if o.token != nil && o.token_len > 0 {
		out.token = C.GoStringN((*C.char)(unsafe.Pointer(o.token)), C.int(o.token_len))
	}
	if o.backend_data != nil && o.backend_data_len > 0 {
		out.backendData = C.GoBytes(unsafe.Pointer(o.backend_data), C.int(o.backend_data_len))
	}
	runtime.KeepAlive(c)
	return out, nil
}

func (c *core) pollTimeout() (uint64, error) {
	var d C.uint64_t
	st := uint32(C.lh_poll_timeout(c.p, &d))
	runtime.KeepAlive(c)
	if st != statusOK {
		return noDeadline, c.err("lh_poll_timeout", st)
	}
	return uint64(d), nil
}

func (c *core) leaseState(lease uint64) (uint32, error) {
	var s C.uint32_t
	st := uint32(C.lh_lease_state(c.p, C.uint64_t(lease), &s))
	runtime.KeepAlive(c)
	if st != statusOK {
		return 0, c.err("lh_lease_state", st)
	}
	return uint32(s), nil
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

// Counters mirrors the core's lh_counters.
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
}

func (c *core) counters() (Counters, error) {
	var k C.lh_counters
	k.struct_size = C.uint32_t(unsafe.Sizeof(k))
	st := uint32(C.lh_counters_get(c.p, &k))
	runtime.KeepAlive(c)
	if st != statusOK {
		return Counters{}, c.err("lh_counters_get", st)
	}
	return Counters{
		LiveLeases:      uint64(k.live_leases),
		PendingCleanups: uint64(k.pending_cleanups),
		AcquiresSent:    uint64(k.acquires_sent),
		Grants:          uint64(k.grants),
		AcquireFailed:   uint64(k.acquire_failed),
		RenewalsSent:    uint64(k.renewals_sent),
		RenewalsOK:      uint64(k.renewals_ok),
		RenewalsFailed:  uint64(k.renewals_failed),
		ReleasesSent:    uint64(k.releases_sent),
		LostRejected:    uint64(k.lost_rejected),
		LostExpired:     uint64(k.lost_expired),
		LostFailBudget:  uint64(k.lost_fail_budget),
		StaleResults:    uint64(k.stale_results),
		TimeClamped:     uint64(k.time_clamped),

		RenewalsRequested:   uint64(k.renewals_requested),
		ReleasesConfirmed:   uint64(k.releases_confirmed),
		ReleasesNotOwner:    uint64(k.releases_not_owner),
		ReleasesUnconfirmed: uint64(k.releases_unconfirmed),
		ReleasesLost:        uint64(k.releases_lost),
	}, nil
}

func (c *core) debugPanic() error {
	if C.lhgo_has_debug_panic() == 0 {
		return fmt.Errorf("leasehold: lh_client_debug_panic: %w", ErrNoTestingFeature)
	}
	st := uint32(C.lh_client_debug_panic(c.p))
	runtime.KeepAlive(c)
	return c.err("lh_client_debug_panic", st)
}

// request is a copy of one lh_request: it owns its memory.
type request struct {
	id         uint64
	connection uint32
	argv       []string
}

// pollRequest takes the next backend request (nil when none is left).
func (c *core) pollRequest() (*request, error) {
	var r C.lh_request
	st := uint32(C.lh_poll_request(c.p, &r))
	if st != statusOK {
		runtime.KeepAlive(c)
		return nil, c.err("lh_poll_request", st)
	}
	if r.id == 0 {
		return nil, nil
	}
	// The arguments borrow the handle until the next call: copy them now.
	args := unsafe.Slice(r.argv, int(r.argc))
	q := &request{id: uint64(r.id), connection: uint32(r.connection), argv: make([]string, len(args))}
	for i, a := range args {
		if a.len > 0 {
			q.argv[i] = C.GoStringN((*C.char)(unsafe.Pointer(a.ptr)), C.int(a.len))
		}
	}
	runtime.KeepAlive(c)
	return q, nil
}

// lhValue is lh_value: no pointers inside, so a Go slice of them goes to C as it is.
type lhValue = C.lh_value

func newValue(kind uint32, integer int64, offset, n int) lhValue {
	return lhValue{kind: C.uint32_t(kind), integer: C.int64_t(integer), offset: C.uint64_t(offset), len: C.uint64_t(n)}
}

// reply hands back the flat reply to request id.
func (c *core) reply(now, id uint64, vals []lhValue, data []byte) error {
	var vp *C.lh_value
	if len(vals) > 0 {
		vp = &vals[0]
	}
	dp, dn := bytesPtr(data)
	st := uint32(C.lh_reply(c.p, C.uint64_t(now), C.uint64_t(id), vp, C.size_t(len(vals)), dp, dn))
	runtime.KeepAlive(vals)
	runtime.KeepAlive(data)
	runtime.KeepAlive(c)
	return c.err("lh_reply", st)
}

func (c *core) requestFailed(now, id uint64) error {
	st := uint32(C.lh_request_failed(c.p, C.uint64_t(now), C.uint64_t(id)))
	runtime.KeepAlive(c)
	return c.err("lh_request_failed", st)
}

func (c *core) pubsubMessage(now uint64, channel, payload string) error {
	cp, cn := strPtr(channel)
	pp, pn := strPtr(payload)
	st := uint32(C.lh_pubsub_message(c.p, C.uint64_t(now), cp, cn, pp, pn))
	runtime.KeepAlive(channel)
	runtime.KeepAlive(payload)
	runtime.KeepAlive(c)
	return c.err("lh_pubsub_message", st)
}

func (c *core) subscription(now uint64, channel string, subscribed bool) error {
	cp, cn := strPtr(channel)
	var s C.uint32_t
	if subscribed {
		s = 1
	}
	st := uint32(C.lh_subscription(c.p, C.uint64_t(now), cp, cn, s))
	runtime.KeepAlive(channel)
	runtime.KeepAlive(c)
	return c.err("lh_subscription", st)
}

// RedisCounters mirrors the core's lh_redis_counters: what the Redis protocol saw.
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
}

func (c *core) redisCounters() (RedisCounters, error) {
	var k C.lh_redis_counters
	k.struct_size = C.uint32_t(unsafe.Sizeof(k))
	st := uint32(C.lh_redis_counters_get(c.p, &k))
	runtime.KeepAlive(c)
	if st != statusOK {
		return RedisCounters{}, c.err("lh_redis_counters_get", st)
	}
	return RedisCounters{
		Subscribed: k.subscribed != 0, Requests: uint64(k.requests), ScriptCalls: uint64(k.script_calls),
		NoscriptRetries: uint64(k.noscript_retries), ErrorReplies: uint64(k.error_replies),
		GarbageReplies: uint64(k.garbage_replies), StaleReplies: uint64(k.stale_replies),
		TransportFailures: uint64(k.transport_failures), LocalRefusals: uint64(k.local_refusals),
		Wakeups: uint64(k.wakeups), StandbyTakeovers: uint64(k.standby_takeovers),
		IgnoredMessages: uint64(k.ignored_messages), Subscriptions: uint64(k.subscriptions),
		SubscriberLosses: uint64(k.subscriber_losses),
	}, nil
}
