package leasehold

/*
#include "leasehold.h"

// The service's fault switches are test hooks: a library built with the `testing` feature
// exports them, a release library does not. Weak references (ELF) let a program link against
// either; they are NULL in a release library, and the Go side checks before calling.
#if defined(__ELF__)
#define LHGO_WEAK __attribute__((weak))
#else
#define LHGO_WEAK
#endif
extern lh_status lh_memory_service_set_faults(struct lh_memory_service *svc, uint64_t connection,
                                              const struct lh_memory_faults *faults) LHGO_WEAK;
extern lh_status lh_memory_service_forget(struct lh_memory_service *svc, const uint8_t *name,
                                          size_t name_len) LHGO_WEAK;
static int lhgo_has_set_faults(void) { return lh_memory_service_set_faults != NULL; }
static int lhgo_has_forget(void) { return lh_memory_service_forget != NULL; }
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// ErrNoTestingFeature: the linked libleasehold was built without the `testing`
// feature, so the memory service's fault switches (SetFault, Expire) are not in
// it. The bindings' test suites build it with `cargo build --release --features
// testing`; release builds leave the test hooks out. SetFault and Expire panic
// with an error wrapping it.
var ErrNoTestingFeature = errors.New("leasehold: this libleasehold was built without the `testing` feature " +
	"(build it with `cargo build --release --features testing`)")

// Fault selects how a MemoryExecutor misbehaves.
type Fault int

const (
	// FaultNone: requests are served normally.
	FaultNone Fault = iota
	// FaultReject: acquire reports the lock held, renew and release report
	// that the caller is not the owner; nothing changes on the server.
	FaultReject
	// FaultDrop: requests are lost before reaching the server; the caller
	// gets an error at once.
	FaultDrop
	// FaultDropReply: requests take effect but the reply is lost; the
	// caller gets an error.
	FaultDropReply
	// FaultHang: requests never reach the server and block until their
	// context ends (a backend that stopped answering).
	FaultHang
	// FaultPartition: like FaultHang, and release notifications are not
	// delivered either.
	FaultPartition
)

// ErrInjected is returned by a MemoryExecutor for injected faults.
var ErrInjected = errors.New("leasehold: injected transport fault")

// MemoryService is an in-process lock service with the semantics of the
// Redis scripts: ownership by token, expiry, fencing tokens that never go
// backwards, release notifications. It wraps the core's reference service
// (lh_memory_service_*), so every binding tests against the same one; expiry
// runs on the monotonic clock the LockClient feeds its core.
type MemoryService struct {
	mu sync.Mutex // the C handle is not thread-safe
	p  *C.lh_memory_service
	// watching holds the connections with watches (their notifications are
	// polled after every release).
	watching map[uint64]*memConn
}

// memConn is one connection's watches, kept apart from its MemoryExecutor
// so that the server can deliver to it.
type memConn struct {
	id   uint64
	subs map[string]map[*memSub]struct{} // guarded by MemoryService.mu
}

type memSub struct{ notify func(string) }

// NewMemoryService returns an empty server.
func NewMemoryService() *MemoryService {
	var cfg C.lh_memory_config
	C.lh_memory_config_default(&cfg)
	// Transports have no Close (a collected one disconnects): never refuse one.
	cfg.max_connections = 1 << 24
	s := &MemoryService{watching: map[uint64]*memConn{}}
	if st := C.lh_memory_service_new(&cfg, &s.p); st != statusOK {
		panic(fmt.Sprintf("leasehold: lh_memory_service_new: %s", statusName(uint32(st))))
	}
	runtime.AddCleanup(s, func(p *C.lh_memory_service) { C.lh_memory_service_free(p) }, s.p)
	return s
}

// err turns a failed call into an error with the service's detail; s.mu is held.
func (s *MemoryService) err(op string, st C.lh_status) error {
	return fmt.Errorf("leasehold: memory service %s: %s: %s", op, statusName(uint32(st)),
		C.GoString(C.lh_memory_service_last_error(s.p)))
}

// Executor returns a new connection to the server with its own fault
// switches.
func (s *MemoryService) Executor() *MemoryExecutor {
	s.mu.Lock()
	defer s.mu.Unlock()
	var id C.uint64_t
	if st := C.lh_memory_service_connect(s.p, &id); st != statusOK {
		panic(s.err("connect", st))
	}
	t := &MemoryExecutor{s: s, conn: &memConn{id: uint64(id)}, changed: make(chan struct{})}
	// Transports have no Close: a collected one's connection (and its watches) goes.
	runtime.AddCleanup(t, s.disconnect, uint64(id))
	return t
}

// connections is how many connections are open (tests).
func (s *MemoryService) connections() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var st C.lh_memory_stats
	st.struct_size = C.uint32_t(C.sizeof_lh_memory_stats)
	if C.lh_memory_service_stats_get(s.p, &st) != statusOK {
		return 0
	}
	return uint64(st.connections)
}

// disconnect drops connection id and its watches.
func (s *MemoryService) disconnect(id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.watching, id)
	C.lh_memory_service_disconnect(s.p, C.uint64_t(id))
}

// status is the service's view of name; s.mu is held.
func (s *MemoryService) status(name string) (C.lh_memory_status, error) {
	var st C.lh_memory_status
	st.struct_size = C.uint32_t(C.sizeof_lh_memory_status)
	p, n := strPtr(name)
	if rc := C.lh_memory_service_status(s.p, C.uint64_t(monoNow()), p, n, &st); rc != statusOK {
		return st, s.err("status", rc)
	}
	return st, nil
}

// Holder returns the token holding name and its fencing token.
func (s *MemoryService) Holder(name string) (token string, fence uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.status(name)
	if err != nil || st.held == 0 {
		return "", 0, false
	}
	return C.GoStringN((*C.char)(unsafe.Pointer(&st.holder_token[0])), C.int(st.holder_token_len)),
		uint64(st.fencing_token), true
}

// Expire drops the lock on name as if its TTL had run out. It needs a library
// built with the `testing` feature (else it panics with ErrNoTestingFeature).
func (s *MemoryService) Expire(name string) {
	if C.lhgo_has_forget() == 0 {
		panic(fmt.Errorf("leasehold: MemoryService.Expire: %w", ErrNoTestingFeature))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p, n := strPtr(name)
	C.lh_memory_service_forget(s.p, p, n)
}

// Watchers returns how many connections watch name.
func (s *MemoryService) Watchers(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.status(name)
	if err != nil {
		return 0
	}
	return int(st.watchers)
}

// expiry returns when the server would drop the lock on name (tests).
func (s *MemoryService) expiry(name string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.status(name)
	if err != nil || st.held == 0 {
		return time.Time{}
	}
	return monoToTime(uint64(st.expires_at_ns))
}

type memOp int

const (
	memAcquire memOp = iota
	memRenew
	memRelease
)

// call runs one request on connection c and, after a release, delivers the
// notifications it queued.
func (s *MemoryService) call(op memOp, c *memConn, name, token string, ttl time.Duration) (C.lh_memory_result, error) {
	var r C.lh_memory_result
	r.struct_size = C.uint32_t(C.sizeof_lh_memory_result)
	np, nn := strPtr(name)
	tp, tn := strPtr(token)
	ttlMs := C.uint64_t(max(1, (ttl+time.Millisecond-1)/time.Millisecond))
	s.mu.Lock()
	now := C.uint64_t(monoNow())
	var st C.lh_status
	switch op {
	case memAcquire:
		st = C.lh_memory_service_acquire(s.p, C.uint64_t(c.id), now, np, nn, tp, tn, ttlMs, &r)
	case memRenew:
		st = C.lh_memory_service_renew(s.p, C.uint64_t(c.id), now, np, nn, tp, tn, ttlMs, &r)
	default:
		st = C.lh_memory_service_release(s.p, C.uint64_t(c.id), now, np, nn, tp, tn, &r)
	}
	if st != statusOK {
		err := s.err("request", st)
		s.mu.Unlock()
		return r, err
	}
	var deliver []func()
	if r.outcome == C.LH_MEMORY_RELEASED {
		deliver = s.pollReleased()
	}
	s.mu.Unlock()
	for _, d := range deliver { // outside the lock: a notify may call back in
		d()
	}
	if r.outcome == C.LH_MEMORY_DROPPED || r.outcome == C.LH_MEMORY_FULL {
		return r, ErrInjected
	}
	return r, nil
}

// pollReleased takes every queued notification; s.mu is held.
func (s *MemoryService) pollReleased() []func() {
	var out []func()
	for _, c := range s.watching {
		for {
			var p *C.uint8_t
			var n C.size_t
			if C.lh_memory_service_poll_released(s.p, C.uint64_t(c.id), &p, &n) != statusOK || p == nil {
				break
			}
			name := C.GoStringN((*C.char)(unsafe.Pointer(p)), C.int(n))
			for sub := range c.subs[name] {
				out = append(out, func() { sub.notify(name) })
			}
		}
	}
	return out
}

// MemoryExecutor is one connection to a MemoryService, with fault switches.
// Its zero value is not usable: see NewMemoryExecutor and
// MemoryService.Executor.
type MemoryExecutor struct {
	s    *MemoryService
	conn *memConn

	mu       sync.Mutex
	fault    Fault
	delay    time.Duration
	changed  chan struct{} // closed and replaced when the fault switches change
	calls    int64
	releases int64
}

// NewMemoryExecutor returns a connection to a new MemoryService.
func NewMemoryExecutor() *MemoryExecutor { return NewMemoryService().Executor() }

// Service returns the server this transport talks to.
func (t *MemoryExecutor) Service() *MemoryService { return t.s }

// SetFault switches the fault mode; hung calls re-evaluate it. FaultNone and
// FaultHang are the host's own and work with any library; the others need one
// built with the `testing` feature (else SetFault panics with
// ErrNoTestingFeature).
func (t *MemoryExecutor) SetFault(f Fault) {
	var flags C.uint32_t
	switch f {
	case FaultReject:
		flags = C.LH_MEMORY_REJECT_ALL
	case FaultDrop:
		flags = C.LH_MEMORY_DROP_REQUESTS
	case FaultDropReply:
		flags = C.LH_MEMORY_DROP_RESPONSES
	case FaultPartition: // hung here, and the service discards its notifications
		flags = C.LH_MEMORY_PARTITIONED
	}
	hooks := C.lhgo_has_set_faults() != 0
	if !hooks && flags != 0 {
		panic(fmt.Errorf("leasehold: MemoryExecutor.SetFault: %w", ErrNoTestingFeature))
	}
	faults := C.lh_memory_faults{struct_size: C.uint32_t(C.sizeof_lh_memory_faults), flags: flags}
	t.mu.Lock()
	var st C.lh_status = statusOK
	if hooks { // without them no switch can be on: nothing to clear
		t.s.mu.Lock()
		st = C.lh_memory_service_set_faults(t.s.p, C.uint64_t(t.conn.id), &faults)
		t.s.mu.Unlock()
	}
	if st != statusOK {
		t.mu.Unlock()
		panic(fmt.Sprintf("leasehold: lh_memory_service_set_faults: %s", statusName(uint32(st))))
	}
	t.fault = f
	close(t.changed)
	t.changed = make(chan struct{})
	t.mu.Unlock()
}

// Fault returns the current fault mode.
func (t *MemoryExecutor) Fault() Fault {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.fault
}

// SetDelay adds a delay before every request reaches the server.
func (t *MemoryExecutor) SetDelay(d time.Duration) {
	t.mu.Lock()
	t.delay = d
	t.mu.Unlock()
}

// Calls returns how many requests were issued on this transport.
func (t *MemoryExecutor) Calls() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.calls
}

// ReleaseCalls returns how many of those requests were releases.
func (t *MemoryExecutor) ReleaseCalls() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.releases
}

// enter applies the host-level faults (delay, hang) before a request goes
// to the service, which applies the others.
func (t *MemoryExecutor) enter(ctx context.Context) error {
	t.mu.Lock()
	t.calls++
	d := t.delay
	t.mu.Unlock()
	if d > 0 {
		tm := time.NewTimer(d)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			return ctx.Err()
		}
	}
	for {
		t.mu.Lock()
		f, ch := t.fault, t.changed
		t.mu.Unlock()
		if f != FaultHang && f != FaultPartition {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Acquire implements Executor.
func (t *MemoryExecutor) Acquire(ctx context.Context, name, token string, ttl time.Duration) (AcquireReply, error) {
	if err := t.enter(ctx); err != nil {
		return AcquireReply{}, err
	}
	r, err := t.s.call(memAcquire, t.conn, name, token, ttl)
	if err != nil {
		return AcquireReply{}, err
	}
	if r.outcome == C.LH_MEMORY_GRANTED {
		return AcquireReply{Granted: true, FencingToken: uint64(r.fencing_token), TTL: ttl}, nil
	}
	if r.retry_after_ms == C.LH_NO_RETRY_HINT {
		return AcquireReply{RetryAfter: -1}, nil
	}
	return AcquireReply{RetryAfter: time.Duration(r.retry_after_ms) * time.Millisecond}, nil
}

// Renew implements Executor.
func (t *MemoryExecutor) Renew(ctx context.Context, name, token string, ttl time.Duration, _ []byte) (bool, error) {
	if err := t.enter(ctx); err != nil {
		return false, err
	}
	r, err := t.s.call(memRenew, t.conn, name, token, ttl)
	return err == nil && r.outcome == C.LH_MEMORY_RENEWED, err
}

// Release implements Executor.
func (t *MemoryExecutor) Release(ctx context.Context, name, token string, _ []byte) (bool, error) {
	t.mu.Lock()
	t.releases++
	t.mu.Unlock()
	if err := t.enter(ctx); err != nil {
		return false, err
	}
	r, err := t.s.call(memRelease, t.conn, name, token, 0)
	return err == nil && r.outcome == C.LH_MEMORY_RELEASED, err
}

// Watch implements Executor. Notifications are delivered synchronously from
// the goroutine that released the lock.
func (t *MemoryExecutor) Watch(_ context.Context, name string, notify func(string)) (func(), error) {
	s, c := t.s, t.conn
	sub := &memSub{notify: notify}
	p, n := strPtr(name)
	s.mu.Lock()
	if len(c.subs[name]) == 0 {
		if st := C.lh_memory_service_watch(s.p, C.uint64_t(c.id), p, n); st != statusOK {
			err := s.err("watch", st)
			s.mu.Unlock()
			return nil, err
		}
	}
	if c.subs == nil {
		c.subs = map[string]map[*memSub]struct{}{}
	}
	if c.subs[name] == nil {
		c.subs[name] = map[*memSub]struct{}{}
	}
	c.subs[name][sub] = struct{}{}
	s.watching[c.id] = c
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			delete(c.subs[name], sub)
			if len(c.subs[name]) > 0 {
				return
			}
			delete(c.subs, name)
			p, n := strPtr(name)
			C.lh_memory_service_unwatch(s.p, C.uint64_t(c.id), p, n)
			if len(c.subs) == 0 {
				delete(s.watching, c.id)
			}
		})
	}, nil
}

// Close does nothing (the service lives as long as it is referenced). It makes
// every executor an io.Closer.
func (t *MemoryExecutor) Close() error { return nil }
