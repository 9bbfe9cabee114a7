package leasehold

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Fault selects how a MemoryTransport misbehaves.
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

// ErrInjected is returned by a MemoryTransport for injected faults.
var ErrInjected = errors.New("leasehold: injected transport fault")

// MemoryServer is an in-process lock service with the semantics of the
// Redis scripts: ownership by token, expiry, fencing tokens that never go
// backwards, release notifications.
type MemoryServer struct {
	mu     sync.Mutex
	locks  map[string]*memLock
	fences map[string]uint64
	subs   map[string]map[*memSub]struct{}
	now    func() time.Time
}

type memLock struct {
	token   string
	fence   uint64
	expires time.Time
}

type memSub struct {
	t      *MemoryTransport
	notify func(string)
}

// NewMemoryServer returns an empty server.
func NewMemoryServer() *MemoryServer {
	return &MemoryServer{
		locks:  map[string]*memLock{},
		fences: map[string]uint64{},
		subs:   map[string]map[*memSub]struct{}{},
		now:    time.Now,
	}
}

// Transport returns a new connection to the server with its own fault
// switches.
func (s *MemoryServer) Transport() *MemoryTransport {
	return &MemoryTransport{s: s, changed: make(chan struct{})}
}

// Holder returns the token holding name and its fencing token.
func (s *MemoryServer) Holder(name string) (token string, fence uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.live(name)
	if l == nil {
		return "", 0, false
	}
	return l.token, l.fence, true
}

// Expire drops the lock on name as if its TTL had run out.
func (s *MemoryServer) Expire(name string) {
	s.mu.Lock()
	delete(s.locks, name)
	s.mu.Unlock()
}

func (s *MemoryServer) live(name string) *memLock {
	l := s.locks[name]
	if l != nil && !s.now().Before(l.expires) {
		delete(s.locks, name)
		return nil
	}
	return l
}

func (s *MemoryServer) acquire(name, token string, ttl time.Duration) AcquireReply {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if l := s.live(name); l != nil {
		if l.token == token {
			l.expires = now.Add(ttl)
			return AcquireReply{Granted: true, FencingToken: l.fence, TTL: ttl}
		}
		return AcquireReply{RetryAfter: l.expires.Sub(now)}
	}
	f := s.fences[name] + 1
	s.fences[name] = f
	s.locks[name] = &memLock{token: token, fence: f, expires: now.Add(ttl)}
	return AcquireReply{Granted: true, FencingToken: f, TTL: ttl}
}

func (s *MemoryServer) renew(name, token string, ttl time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.live(name)
	if l == nil || l.token != token {
		return false
	}
	l.expires = s.now().Add(ttl)
	return true
}

func (s *MemoryServer) release(name, token string) bool {
	s.mu.Lock()
	l := s.live(name)
	if l == nil || l.token != token {
		s.mu.Unlock()
		return false
	}
	delete(s.locks, name)
	var targets []*memSub
	for sub := range s.subs[name] {
		targets = append(targets, sub)
	}
	s.mu.Unlock()
	for _, sub := range targets {
		if sub.t.Fault() != FaultPartition {
			sub.notify(name)
		}
	}
	return true
}

// MemoryTransport is one connection to a MemoryServer, with fault switches.
// Its zero value is not usable: see NewMemoryTransport and
// MemoryServer.Transport.
type MemoryTransport struct {
	s *MemoryServer

	mu       sync.Mutex
	fault    Fault
	delay    time.Duration
	changed  chan struct{} // closed and replaced when the fault switches change
	calls    int64
	releases int64
}

// NewMemoryTransport returns a connection to a new MemoryServer.
func NewMemoryTransport() *MemoryTransport { return NewMemoryServer().Transport() }

// Server returns the server this transport talks to.
func (t *MemoryTransport) Server() *MemoryServer { return t.s }

// SetFault switches the fault mode; hung calls re-evaluate it.
func (t *MemoryTransport) SetFault(f Fault) {
	t.mu.Lock()
	t.fault = f
	close(t.changed)
	t.changed = make(chan struct{})
	t.mu.Unlock()
}

// Fault returns the current fault mode.
func (t *MemoryTransport) Fault() Fault {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.fault
}

// SetDelay adds a delay before every request reaches the server.
func (t *MemoryTransport) SetDelay(d time.Duration) {
	t.mu.Lock()
	t.delay = d
	t.mu.Unlock()
}

// Calls returns how many requests were issued on this transport.
func (t *MemoryTransport) Calls() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.calls
}

// ReleaseCalls returns how many of those requests were releases.
func (t *MemoryTransport) ReleaseCalls() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.releases
}

// enter applies the delay and the fault switches before a request reaches
// the server. It returns the fault in force and an error when the request
// must not proceed.
func (t *MemoryTransport) enter(ctx context.Context) (Fault, error) {
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
			return FaultNone, ctx.Err()
		}
	}
	for {
		t.mu.Lock()
		f, ch := t.fault, t.changed
		t.mu.Unlock()
		switch f {
		case FaultDrop:
			return f, ErrInjected
		case FaultHang, FaultPartition:
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return f, ctx.Err()
			}
		}
		return f, nil
	}
}

// Acquire implements Transport.
func (t *MemoryTransport) Acquire(ctx context.Context, name, token string, ttl time.Duration) (AcquireReply, error) {
	f, err := t.enter(ctx)
	if err != nil {
		return AcquireReply{}, err
	}
	if f == FaultReject {
		return AcquireReply{RetryAfter: -1}, nil
	}
	r := t.s.acquire(name, token, ttl)
	if f == FaultDropReply {
		return AcquireReply{}, ErrInjected
	}
	return r, nil
}

// Renew implements Transport.
func (t *MemoryTransport) Renew(ctx context.Context, name, token string, ttl time.Duration, _ []byte) (bool, error) {
	f, err := t.enter(ctx)
	if err != nil {
		return false, err
	}
	if f == FaultReject {
		return false, nil
	}
	ok := t.s.renew(name, token, ttl)
	if f == FaultDropReply {
		return false, ErrInjected
	}
	return ok, nil
}

// Release implements Transport.
func (t *MemoryTransport) Release(ctx context.Context, name, token string, _ []byte) (bool, error) {
	t.mu.Lock()
	t.releases++
	t.mu.Unlock()
	f, err := t.enter(ctx)
	if err != nil {
		return false, err
	}
	if f == FaultReject {
		return false, nil
	}
	ok := t.s.release(name, token)
	if f == FaultDropReply {
		return false, ErrInjected
	}
	return ok, nil
}

// Watch implements Transport. Notifications are delivered synchronously from
// the goroutine that released the lock.
func (t *MemoryTransport) Watch(_ context.Context, name string, notify func(string)) (func(), error) {
	sub := &memSub{t: t, notify: notify}
	t.s.mu.Lock()
	m := t.s.subs[name]
	if m == nil {
		m = map[*memSub]struct{}{}
		t.s.subs[name] = m
	}
	m[sub] = struct{}{}
	t.s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			t.s.mu.Lock()
			delete(t.s.subs[name], sub)
			if len(t.s.subs[name]) == 0 {
				delete(t.s.subs, name)
			}
			t.s.mu.Unlock()
		})
	}, nil
}

// Watchers returns how many subscriptions the server has for name.
func (s *MemoryServer) Watchers(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.subs[name])
}

// expiry returns when the server would drop the lock on name (tests).
func (s *MemoryServer) expiry(name string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.locks[name]; l != nil {
		return l.expires
	}
	return time.Time{}
}
