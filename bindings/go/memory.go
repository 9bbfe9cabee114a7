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

// Runs one memory-protocol request whose arguments lie end to end in buf (lens[i] bytes
// each). Empty answer buffers cross as NULL (see ffi_backends.go).
static lh_status lhgo_memory_call(lh_memory_service *svc, uint64_t conn, uint64_t now,
                                  const uint8_t *buf, const size_t *lens, uint32_t argc,
                                  lh_memory_answer *out) {
	lh_bytes argv[64];
	if (argc > 64) return LH_ERR_INVALID_REPLY;
	size_t at = 0;
	for (uint32_t i = 0; i < argc; i++) {
		argv[i].ptr = lens[i] ? buf + at : NULL;
		argv[i].len = lens[i];
		at += lens[i];
	}
	lh_status st = lh_memory_service_call(svc, conn, now, argv, argc, out);
	if (st == LH_OK) {
		if (out->nvalues == 0) out->values = NULL;
		if (out->data_len == 0) out->data = NULL;
	}
	return st;
}
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
// runs on the monotonic clock the LockClient feeds its core. A LockClient on
// it is driven like on any backend: its core speaks the memory protocol and
// its MemoryExecutor hands each request to the service, unread.
type MemoryService struct {
	mu sync.Mutex // the C handle is not thread-safe
	p  *C.lh_memory_service
	// conns are the connections of live LockClients: a release on one queues
	// notifications for others, taken after every call.
	conns map[uint64]*memExec
}

// NewMemoryService returns an empty server.
func NewMemoryService() *MemoryService {
	var cfg C.lh_memory_config
	C.lh_memory_config_default(&cfg)
	// Forgotten LockClients disconnect when collected: never refuse one.
	cfg.max_connections = 1 << 24
	s := &MemoryService{conns: map[uint64]*memExec{}}
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

// Executor returns a new executor on the server, with its own fault switches
// (each LockClient on it gets a connection of its own).
func (s *MemoryService) Executor() *MemoryExecutor {
	return &MemoryExecutor{s: s, changed: make(chan struct{}), execs: map[*memExec]struct{}{}}
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

// memAnswer is a copy of one lh_memory_answer.
type memAnswer struct {
	dropped bool
	vals    []lhValue
	data    []byte
}

// call runs one request of connection conn and takes the release notifications it
// queued for every live connection; deliver hands them to their LockClients.
func (s *MemoryService) call(conn uint64, argv []string) (a memAnswer, deliver func(), err error) {
	var buf []byte
	lens := make([]C.size_t, len(argv))
	for i, arg := range argv {
		buf = append(buf, arg...)
		lens[i] = C.size_t(len(arg))
	}
	bp, _ := bytesPtr(buf)
	var lp *C.size_t
	if len(lens) > 0 {
		lp = &lens[0]
	}
	var r C.lh_memory_answer
	r.struct_size = C.uint32_t(C.sizeof_lh_memory_answer)
	s.mu.Lock()
	st := C.lhgo_memory_call(s.p, C.uint64_t(conn), C.uint64_t(monoNow()), bp, lp, C.uint32_t(len(argv)), &r)
	runtime.KeepAlive(buf)
	runtime.KeepAlive(lens)
	if st != statusOK {
		err = s.err("call", st)
		s.mu.Unlock()
		return a, func() {}, err
	}
	// The answer borrows the handle until its next call: copy it now.
	a.dropped = r.dropped != 0
	if r.values != nil {
		a.vals = append([]lhValue(nil), unsafe.Slice(r.values, int(r.nvalues))...)
	}
	if r.data != nil {
		a.data = C.GoBytes(unsafe.Pointer(r.data), C.int(r.data_len))
	}
	deliver = s.pollReleasedLocked()
	s.mu.Unlock()
	return a, deliver, nil
}

// pollReleasedLocked takes every queued notification (s.mu held) and returns what hands
// them to their LockClients, to run once s.mu is released (an input may call back in).
func (s *MemoryService) pollReleasedLocked() func() {
	type note struct {
		x    *memExec
		name string
	}
	var notes []note
	for id, x := range s.conns {
		for {
			var p *C.uint8_t
			var n C.size_t
			if C.lh_memory_service_poll_released(s.p, C.uint64_t(id), &p, &n) != statusOK || p == nil {
				break
			}
			notes = append(notes, note{x, C.GoStringN((*C.char)(unsafe.Pointer(p)), C.int(n))})
		}
	}
	return func() {
		for _, m := range notes {
			c := m.x.c
			c.input(func(now uint64) error { return c.core.ioMessage(now, m.name, "") })
		}
	}
}

// MemoryExecutor is the memory executor: the fault switches of a MemoryService's
// clients. Each LockClient made on it gets a connection to the service of its
// own (its watches and notifications), and its requests go to the service
// through the executor's faults. Its zero value is not usable: see
// NewMemoryExecutor and MemoryService.Executor.
type MemoryExecutor struct {
	s *MemoryService

	mu      sync.Mutex
	fault   Fault
	delay   time.Duration
	changed chan struct{} // closed and replaced when the fault switches change
	calls   int64
	execs   map[*memExec]struct{} // the connections of live LockClients
	// releases sent by LockClients that closed (ReleaseCalls)
	closedReleases uint64
	// beforeCall, when set (tests), runs before each request reaches the service.
	beforeCall func()
}

// NewMemoryExecutor returns an executor on a new MemoryService.
func NewMemoryExecutor() *MemoryExecutor { return NewMemoryService().Executor() }

// Service returns the server this executor talks to.
func (t *MemoryExecutor) Service() *MemoryService { return t.s }

// faultFlags are the service's switches for f (the host's own faults need none).
func faultFlags(f Fault) C.uint32_t {
	switch f {
	case FaultReject:
		return C.LH_MEMORY_REJECT_ALL
	case FaultDrop:
		return C.LH_MEMORY_DROP_REQUESTS
	case FaultDropReply:
		return C.LH_MEMORY_DROP_RESPONSES
	case FaultPartition: // hung here, and the service discards its notifications
		return C.LH_MEMORY_PARTITIONED
	}
	return 0
}

// setFaultsLocked sets the service's switches of one connection (t.mu and t.s.mu held).
func (t *MemoryExecutor) setFaultsLocked(conn uint64, flags C.uint32_t) {
	if C.lhgo_has_set_faults() == 0 {
		return // without the test hooks no switch can be on: nothing to clear
	}
	faults := C.lh_memory_faults{struct_size: C.uint32_t(C.sizeof_lh_memory_faults), flags: flags}
	if st := C.lh_memory_service_set_faults(t.s.p, C.uint64_t(conn), &faults); st != statusOK {
		panic(fmt.Sprintf("leasehold: lh_memory_service_set_faults: %s", statusName(uint32(st))))
	}
}

// SetFault switches the fault mode of every connection of the executor (and
// of those of LockClients made later); hung calls re-evaluate it. FaultNone
// and FaultHang are the host's own and work with any library; the others
// need one built with the `testing` feature (else SetFault panics with
// ErrNoTestingFeature).
func (t *MemoryExecutor) SetFault(f Fault) {
	flags := faultFlags(f)
	if flags != 0 && C.lhgo_has_set_faults() == 0 {
		panic(fmt.Errorf("leasehold: MemoryExecutor.SetFault: %w", ErrNoTestingFeature))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.s.mu.Lock()
	for x := range t.execs {
		t.setFaultsLocked(x.conn, flags)
	}
	t.s.mu.Unlock()
	t.fault = f
	close(t.changed)
	t.changed = make(chan struct{})
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

// Calls returns how many requests the LockClients on this executor issued.
func (t *MemoryExecutor) Calls() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.calls
}

// ReleaseCalls returns how many releases the LockClients on this executor
// sent (their Counters.ReleasesSent, cleanup releases included).
func (t *MemoryExecutor) ReleaseCalls() int64 {
	t.mu.Lock()
	n := t.closedReleases
	live := make([]*client, 0, len(t.execs))
	for x := range t.execs {
		live = append(live, x.c)
	}
	t.mu.Unlock()
	for _, c := range live {
		n += c.releasesSent()
	}
	return int64(n)
}

// releasesSent is the core's count of release requests (0 once it is gone).
func (c *client) releasesSent() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.core == nil {
		return 0
	}
	k, err := c.core.counters()
	if err != nil {
		return 0
	}
	return k.ReleasesSent
}

// enter applies the host-level faults (delay, hang) before a request goes
// to the service, which applies the others.
func (t *MemoryExecutor) enter(ctx context.Context) error {
	t.mu.Lock()
	t.calls++
	d, hook := t.delay, t.beforeCall
	t.mu.Unlock()
	if hook != nil {
		hook()
	}
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

func (t *MemoryExecutor) backend() backendOptions { return backendOptions{kind: backendMemory} }

// start connects one LockClient to the service, with the executor's faults.
func (t *MemoryExecutor) start(c *client) (ioExec, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var id C.uint64_t
	if st := C.lh_memory_service_connect(s.p, &id); st != statusOK {
		return nil, s.err("connect", st)
	}
	x := &memExec{t: t, c: c, conn: uint64(id)}
	if flags := faultFlags(t.fault); flags != 0 {
		t.setFaultsLocked(x.conn, flags)
	}
	s.conns[x.conn] = x
	t.execs[x] = struct{}{}
	return x, nil
}

// memExec is one LockClient's connection to the service.
type memExec struct {
	t    *MemoryExecutor
	c    *client
	conn uint64
}

func (x *memExec) run(q *ioRequest) (*job, error) {
	if q.kind != ioCommand {
		return nil, errUnsupportedIO
	}
	return &job{id: q.id, timeout: x.c.reqTimeout, run: func(ctx context.Context) { x.call(ctx, q) }}, nil
}

// call hands one request to the service through the executor's faults, its answer to
// the core, then the release notifications it caused to their LockClients.
func (x *memExec) call(ctx context.Context, q *ioRequest) {
	c := x.c
	if err := x.t.enter(ctx); err != nil {
		c.input(func(now uint64) error { return c.core.ioFailed(now, q.id, failTransport, err.Error()) })
		return
	}
	a, deliver, err := x.t.s.call(x.conn, q.argv)
	c.input(func(now uint64) error {
		switch {
		case err != nil:
			return c.core.ioFailed(now, q.id, failTransport, err.Error())
		case a.dropped:
			return c.core.ioFailed(now, q.id, failTransport, ErrInjected.Error())
		}
		err := c.core.ioReply(now, q.id, a.vals, a.data)
		if isStatus(err, statusInvalidReply) {
			return c.core.ioFailed(now, q.id, failTransport, err.Error())
		}
		return err
	})
	deliver()
}

// close disconnects the LockClient (its watches and queued notifications go; its
// grants stay until they expire, as a dead client's would).
func (x *memExec) close() {
	sent := x.c.releasesSent()
	t := x.t
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.execs, x)
	t.closedReleases += sent
	t.s.mu.Lock()
	delete(t.s.conns, x.conn)
	C.lh_memory_service_disconnect(t.s.p, C.uint64_t(x.conn))
	t.s.mu.Unlock()
}

// Close does nothing (the service lives as long as it is referenced); each
// LockClient closes its connection in LockClient.Close. It makes every
// executor an io.Closer.
func (t *MemoryExecutor) Close() error { return nil }
