package leasehold

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Options configures a LockClient. Zero fields take the core's defaults.
type Options struct {
	// RequestTimeout bounds each backend request (renewals use
	// min(RequestTimeout, TTL/3)). Default 2s.
	RequestTimeout time.Duration
	// FailBudget is the renewal failure budget. 0 (the default) is a time
	// budget: renewals failing in transport are retried with backoff while
	// validity remains, and the lease is lost on a rejection or just before
	// its validity ends without a confirmed renewal, so a short outage does
	// not cost a lease that is still valid. N > 0 is a count budget instead:
	// the lease is lost after N consecutive failed renewals.
	FailBudget uint32
	// DriftPPM and DriftFixed make up the clock-drift margin subtracted
	// from every lease: TTL*DriftPPM/1e6 + DriftFixed. Defaults 10000, 2ms.
	DriftPPM   uint32
	DriftFixed time.Duration
	// RenewJitterPPM spreads renewals around TTL/3. Default 100000 (10%).
	RenewJitterPPM uint32
	// BackoffBase and BackoffCap bound the retry backoff. Defaults 5ms, 500ms.
	BackoffBase time.Duration
	BackoffCap  time.Duration
	// MaxTTL is the largest TTL accepted. Default 7 days.
	MaxTTL time.Duration
	// MaxLeases bounds the number of live lease records. Default 1<<20.
	MaxLeases uint32
	// DisableNotifications makes waiters poll instead of relying on the
	// transport's release notifications.
	DisableNotifications bool
	// CloseTimeout bounds how long Close keeps driving outstanding releases.
	// Default: RequestTimeout.
	CloseTimeout time.Duration
	// Logger receives transport errors (debug) and anomalies (warn).
	// Default: a logger that discards everything.
	Logger *slog.Logger
}

// AcquireOptions are the per-call options of LockClient.Acquire.
type AcquireOptions struct {
	// TTL of the lease, a whole number of milliseconds (required). The
	// client renews the lease every TTL/3 until it is released.
	TTL time.Duration
	// Wait bounds how long Acquire waits for a lock held by someone else;
	// 0 makes a single attempt. The ctx deadline bounds it too.
	Wait time.Duration
	// Reentrant makes a second Acquire of a name this LockClient already holds
	// reentrantly succeed at once, sharing the lease (and its fencing
	// token); the lock is released when every holder released it.
	Reentrant bool
	// NoAutoRenew turns automatic renewal off for this lease (auto_renew =
	// false in the other bindings): only Lease.Renew extends it, and it is
	// lost (Context cancelled, Lost closed) when its validity ends unless
	// renewed in time.
	NoAutoRenew bool
}

// LockClient is a lock client: it owns one core handle, one driver goroutine
// and the IO of an Executor. It is safe for concurrent use by many goroutines. Call
// Close when done; a LockClient that becomes unreachable without Close is
// closed by a cleanup, which releases its leases.
type LockClient struct {
	c       *client
	cleanup runtime.Cleanup
}

// client is the part of a LockClient that its goroutines reference, so that a
// forgotten LockClient can become unreachable and be cleaned up.
type client struct {
	mu     sync.Mutex
	core   *core // nil once closed
	closed bool
	broken error

	exec         Executor
	kind         uint32 // the backend (backendRedis…)
	x            ioExec // runs the core's requests
	log          *slog.Logger
	reqTimeout   time.Duration
	closeTimeout time.Duration

	closing    chan struct{} // closed when Close starts
	stop       chan struct{} // stops the driver and the executor's goroutines
	driverDone chan struct{}
	timer      *time.Timer // fires at the core's next deadline (armed under mu)
	armed      uint64
	// feeding: bytes read on stream feedingStream are being fed (received); its reader
	// is out of Read.
	feeding       bool
	feedingStream uint64

	recs       map[uint64]*leaseRec
	relWaits   map[uint64][]*releaseWait                // releases awaiting their outcome
	renewWaits map[uint64]map[chan renewResult]struct{} // Renew calls awaiting RENEWED or loss

	// skew is added to the monotonic clock handed to the core: tests use it
	// to make time jump (a paused process) without waiting.
	skew atomic.Int64

	statusWaits map[uint64]*statusWait // Status calls awaiting their answer

	ioCtx    context.Context
	ioCancel context.CancelFunc
	ioWG     sync.WaitGroup
	inflight atomic.Int64 // backend calls running (spawned or inline)

	closeOnce sync.Once
	closeErr  error
	owned     io.Closer // the executor Open made: closed last
}

type acqWaiter struct {
	owner *LockClient
	ch    chan acqResult
}

func (w *acqWaiter) answered() bool { return len(w.ch) > 0 }

type acqResult struct {
	lease *Lease
	err   error
}

// leaseRec is the state shared by the handles of one core lease (several
// handles when reentrant).
type leaseRec struct {
	id         uint64
	name       string
	ttl        time.Duration
	waiters    map[*acqWaiter]struct{}
	handles    map[*leaseRef]struct{} // no pointer back to the LockClient: see leaseRef
	lost       chan struct{}
	lostErr    error
	ended      bool
	fence      uint64
	validUntil uint64
}

// renewResult answers one Renew call.
type renewResult struct {
	validUntil time.Time
	err        error
}

// releaseWait is the result of one Lease's Release, shared by every call
// of it: err is written before done is closed.
type releaseWait struct {
	name string
	done chan struct{}
	err  error
}

func newReleaseWait(name string) *releaseWait {
	return &releaseWait{name: name, done: make(chan struct{})}
}

func (w *releaseWait) finish(err error) {
	w.err = err
	close(w.done)
}

// clock is the core's clock: monotonic nanoseconds (plus the test skew).
func (c *client) clock() uint64 { return uint64(int64(monoNow()) + c.skew.Load()) }

// toTime converts a core time to a time.Time.
func (c *client) toTime(ns uint64) time.Time {
	return monoToTime(uint64(int64(ns) - c.skew.Load()))
}

// NewLockClient starts a LockClient on executor t. opts may be nil.
func NewLockClient(t Executor, opts *Options) (*LockClient, error) {
	if abiErr != nil {
		return nil, abiErr
	}
	if isNilExecutor(t) {
		return nil, invalidArg("nil executor")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	cfg := defaultCoreConfig()
	if o.RequestTimeout < 0 || o.DriftFixed < 0 || o.BackoffBase < 0 || o.BackoffCap < 0 || o.MaxTTL < 0 || o.CloseTimeout < 0 {
		return nil, invalidArg("negative duration in Options")
	}
	if o.RequestTimeout > 0 {
		cfg.requestTimeoutNs = uint64(o.RequestTimeout)
	}
	if o.FailBudget > 0 {
		cfg.failBudget = o.FailBudget
	}
	if o.DriftPPM > 0 {
		cfg.driftPPM = o.DriftPPM
	}
	if o.DriftFixed > 0 {
		cfg.driftFixedNs = uint64(o.DriftFixed)
	}
	if o.RenewJitterPPM > 0 {
		cfg.renewJitterPPM = o.RenewJitterPPM
	}
	if o.BackoffBase > 0 {
		cfg.backoffBaseNs = uint64(o.BackoffBase)
	}
	if o.BackoffCap > 0 {
		cfg.backoffCapNs = uint64(o.BackoffCap)
	}
	if o.MaxTTL > 0 {
		if o.MaxTTL%time.Millisecond != 0 {
			return nil, invalidArg("MaxTTL %v is not a whole number of milliseconds", o.MaxTTL)
		}
		cfg.maxTTLms = uint64(o.MaxTTL / time.Millisecond)
	}
	if o.MaxLeases > 0 {
		cfg.maxLeases = o.MaxLeases
	}
	cfg.notifications = !o.DisableNotifications
	if p, ok := t.(PollingExecutor); ok && !p.Notifications() {
		cfg.notifications = false
	}
	seed := make([]byte, 32)
	if _, err := rand.Read(seed); err != nil {
		return nil, fmt.Errorf("leasehold: seeding: %w", err)
	}
	b := t.backend()
	k, err := newCore(cfg, b, seed)
	if err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c := &client{
		core:         k,
		exec:         t,
		kind:         b.kind,
		log:          log,
		reqTimeout:   time.Duration(cfg.requestTimeoutNs),
		closeTimeout: o.CloseTimeout,
		closing:      make(chan struct{}),
		stop:         make(chan struct{}),
		driverDone:   make(chan struct{}),
		timer:        time.NewTimer(time.Hour),
		armed:        noDeadline,
		recs:         map[uint64]*leaseRec{},
		relWaits:     map[uint64][]*releaseWait{},
		renewWaits:   map[uint64]map[chan renewResult]struct{}{},
		statusWaits:  map[uint64]*statusWait{},
	}
	if c.closeTimeout == 0 {
		c.closeTimeout = c.reqTimeout
	}
	c.timer.Stop()
	c.ioCtx, c.ioCancel = context.WithCancel(context.Background())
	if c.x, err = t.start(c); err != nil {
		c.ioCancel()
		k.free()
		return nil, err
	}
	c.mu.Lock()
	c.drainLocked() // the backend's set-up: Redis's SUBSCRIBE, SQL's schema check…
	c.mu.Unlock()
	go c.driver()
	cl := &LockClient{c: c}
	cl.cleanup = runtime.AddCleanup(cl, func(c *client) { go c.close() }, c)
	return cl, nil
}

// Close releases every lease of the LockClient (bounded by Options.CloseTimeout),
// stops its goroutines and frees the core handle. It is idempotent; the
// Executor is not closed (it belongs to the caller), unless Open made it.
func (cl *LockClient) Close() error {
	cl.cleanup.Stop()
	return cl.c.close()
}

// RedisCounters returns what the core's Redis protocol saw (a LockClient made
// on a RedisExecutor or a RedisStreamExecutor; others get ErrInvalidArgument).
// Counters has the same figures, for every backend.
func (cl *LockClient) RedisCounters() (RedisCounters, error) {
	kind := uint32(backendRedis)
	if cl.c.kind == backendRedisStream {
		kind = backendRedisStream
	}
	k, err := cl.backendCounters(kind, "not a Redis client")
	return k.redis(), err
}

// EtcdCounters returns what the core's etcd protocol saw (a LockClient made on
// an EtcdExecutor; others get ErrInvalidArgument). Counters has the same
// figures, for every backend.
func (cl *LockClient) EtcdCounters() (EtcdCounters, error) {
	k, err := cl.backendCounters(backendEtcd, "not an etcd client")
	return k.etcd(), err
}

func (cl *LockClient) backendCounters(kind uint32, other string) (Counters, error) {
	c := cl.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.core == nil {
		return Counters{}, ErrClosed
	}
	if c.kind != kind {
		return Counters{}, invalidArg("%s", other)
	}
	return c.core.counters()
}

// BackendError returns the last error the core's backend protocol saw (what
// the database, the cluster or the server said, a refused schema, a
// malformed answer, a connection failure), for diagnostics; empty when none.
// An acquire that failed because the backend was unavailable carries it in
// AcquireError.Detail.
func (cl *LockClient) BackendError() string {
	c := cl.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.core == nil {
		return ""
	}
	return c.core.backendLastError()
}

// Counters returns the core's counters.
func (cl *LockClient) Counters() (Counters, error) {
	c := cl.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.core == nil {
		return Counters{}, ErrClosed
	}
	return c.core.counters()
}

// Acquire takes the lock name. It waits up to opts.Wait (and no longer than
// ctx allows) while someone else holds it. On success the lease is renewed
// in the background until Release (unless opts.NoAutoRenew); watch
// Lease.Context or Lease.Lost for loss. Errors: ErrInvalidArgument,
// ErrNotAcquired (an *AcquireError, also ErrUnavailable when the backend was
// unreachable), ErrClosed, or ctx's error (joined with ErrNotAcquired). When
// ctx's deadline is shorter than opts.Wait and ends the wait, the error
// matches context.DeadlineExceeded as well as ErrNotAcquired.
func (cl *LockClient) Acquire(ctx context.Context, name string, opts AcquireOptions) (*Lease, error) {
	c := cl.c
	if ctx == nil {
		return nil, invalidArg("nil context")
	}
	if opts.TTL <= 0 {
		return nil, invalidArg("TTL %v must be positive", opts.TTL)
	}
	if opts.TTL%time.Millisecond != 0 {
		return nil, invalidArg("TTL %v is not a whole number of milliseconds", opts.TTL)
	}
	if opts.Wait < 0 {
		return nil, invalidArg("Wait %v is negative", opts.Wait)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotAcquired, err)
	}
	// The core's wait budget ends at ctx's deadline when that comes first,
	// so its retries stop in time; the budget running out is then the
	// deadline passing, and is reported as such (below).
	wait := opts.Wait
	byDeadline := false
	if dl, ok := ctx.Deadline(); ok {
		if rem := time.Until(dl); rem < wait {
			wait = max(rem, 0)
			byDeadline = true
		}
	}
	var flags uint32
	if opts.Reentrant {
		flags |= flagReentrant
	}
	if opts.NoAutoRenew {
		flags |= flagNoAutoRenew
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if c.broken != nil {
		err := c.broken
		c.mu.Unlock()
		return nil, err
	}
	id, err := c.core.acquire(c.clock(), name, uint64(opts.TTL/time.Millisecond), uint64(wait), flags)
	if err != nil {
		c.mu.Unlock()
		return nil, err
	}
	rec := c.recs[id]
	if rec == nil {
		rec = &leaseRec{id: id, name: name, ttl: opts.TTL, waiters: map[*acqWaiter]struct{}{},
			handles: map[*leaseRef]struct{}{}, lost: make(chan struct{})}
		c.recs[id] = rec
	}
	w := &acqWaiter{owner: cl, ch: make(chan acqResult, 1)}
	rec.waiters[w] = struct{}{}
	// The first attempt is started here, by the goroutine that waits for it
	// anyway, and waited for within ctx and the request timeout. The driver is
	// not involved, so loss detection for other leases is not delayed.
	j := c.drainTake(true)
	c.mu.Unlock()
	if j != nil {
		c.runInline(ctx, j, w)
	}

	select {
	case r := <-w.ch:
		if byDeadline && budgetSpent(r.err) {
			// The core's budget and ctx's timer end together; which one
			// this select saw first must not change the error.
			return nil, fmt.Errorf("%w: %w", r.err, context.DeadlineExceeded)
		}
		return r.lease, r.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	delete(rec.waiters, w)
	select {
	case r := <-w.ch:
		// Resolved while we were cancelled: give a granted lease back.
		c.mu.Unlock()
		if r.lease != nil {
			if _, j := r.lease.startRelease(); j != nil {
				c.spawn(j)
			}
		}
	default:
		if c.core != nil && !rec.ended {
			if err := c.core.release(c.clock(), id); err != nil && !isEnded(err) {
				c.log.Warn("leasehold: cancelling acquire", "name", name, "err", err)
			}
			c.drainLocked()
		}
		c.mu.Unlock()
	}
	return nil, fmt.Errorf("%w: %w", ErrNotAcquired, ctx.Err())
}

// budgetSpent reports whether an acquire ended because its wait budget ran
// out (held by someone else, or the backend unreachable, all along).
func budgetSpent(err error) bool {
	var ae *AcquireError
	return errors.As(err, &ae) && (ae.code == reasonWaitExhausted || ae.code == reasonUnavailable)
}

func isEnded(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && (se.Status == statusLeaseEnded || se.Status == statusUnknownLease)
}

// closeLocked (c.mu held) answers the record's waiters and cancels its handles with
// ErrClosed; run again after the driver stopped for what arrived meanwhile.
func (rec *leaseRec) closeLocked() {
	for w := range rec.waiters {
		w.ch <- acqResult{err: ErrClosed}
		delete(rec.waiters, w)
	}
	for h := range rec.handles {
		h.cancel(ErrClosed)
	}
}

func (c *client) close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		close(c.closing)
		if c.core != nil && c.broken == nil {
			now := c.clock()
			for id, rec := range c.recs {
				rec.closeLocked()
				c.answerRenewsLocked(id, renewResult{err: ErrClosed})
				// Release every holder (reentrant leases count holders).
				for i := 0; i < 1<<20; i++ {
					if err := c.core.release(now, id); err != nil {
						break
					}
				}
			}
			c.drainLocked()
		}
		c.mu.Unlock()

		// Keep the loop running until the releases were answered and no
		// backend call is in flight (an acquire answered after its lease was
		// cancelled makes the core release it again), bounded.
		deadline := time.Now().Add(c.closeTimeout)
		for time.Now().Before(deadline) {
			c.mu.Lock()
			var k Counters
			var err error
			if c.core != nil && c.broken == nil {
				k, err = c.core.counters()
			}
			c.mu.Unlock()
			if err != nil || (k.PendingCleanups == 0 && c.inflight.Load() == 0) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		// A backend with something of the client's own on the server (etcd's pooled
		// leases) gives it back now, within the same bound.
		c.mu.Lock()
		if c.core != nil && c.broken == nil {
			if err := c.core.ioClose(c.clock()); err != nil {
				c.log.Warn("leasehold: closing the backend", "err", err)
			}
			c.drainLocked()
		}
		c.mu.Unlock()
		for time.Now().Before(deadline) && c.inflight.Load() != 0 {
			time.Sleep(time.Millisecond)
		}

		close(c.stop)
		c.ioCancel()
		<-c.driverDone
		c.x.close()

		c.mu.Lock()
		for id, rec := range c.recs {
			rec.closeLocked()
			rec.ended = true
			delete(c.recs, id)
		}
		// Close released the lock; the service's answer is no longer awaited.
		for id := range c.relWaits {
			c.finishReleasesLocked(id, nil)
		}
		for id := range c.renewWaits {
			c.answerRenewsLocked(id, renewResult{err: ErrClosed})
		}
		if c.core != nil {
			c.core.free()
			c.core = nil
		}
		c.mu.Unlock()
		if c.owned != nil {
			c.closeErr = c.owned.Close()
		}
	})
	return c.closeErr
}
