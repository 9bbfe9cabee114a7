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

	"github.com/redis/go-redis/v9"
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
// and an Executor. It is safe for concurrent use by many goroutines. Call
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

	t             Executor
	rdb           redis.UniversalClient // set with a RedisExecutor: the core speaks Redis, we execute
	sub           *subscriber
	exec          backendExec // set with an SQL or etcd transport: the core speaks it, we execute
	notifications bool        // Watch commands are executed (else waiters poll)
	log           *slog.Logger
	reqTimeout    time.Duration
	closeTimeout  time.Duration

	closing    chan struct{} // closed when Close starts
	stop       chan struct{} // stops the driver and the watcher
	driverDone chan struct{}
	watchDone  chan struct{}
	timer      *time.Timer // fires at the core's next deadline (armed under mu)
	armed      uint64

	recs       map[uint64]*leaseRec
	relWaits   map[uint64][]*releaseWait                // releases awaiting their outcome
	renewWaits map[uint64]map[chan renewResult]struct{} // Renew calls awaiting RENEWED or loss

	// skew is added to the monotonic clock handed to the core: tests use it
	// to make time jump (a paused process) without waiting.
	skew atomic.Int64

	watchQ    []watchOp
	watchKick chan struct{}
	coreWaits map[string]struct{} // names the core waits for (its Watch/Unwatch outputs)

	statusWaits map[uint64]*statusWait // Status calls awaiting their answer (SQL)

	ioCtx    context.Context
	ioCancel context.CancelFunc
	ioWG     sync.WaitGroup
	inflight atomic.Int64 // backend calls running (spawned or inline)

	closeOnce sync.Once
	closeErr  error
	owned     io.Closer // the executor Open made: closed last
}

type watchOp struct {
	watch bool
	name  string
}

type acqWaiter struct {
	owner *LockClient
	ch    chan acqResult
}

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

// NewLockClient starts a LockClient on transport t. opts may be nil.
func NewLockClient(t Executor, opts *Options) (*LockClient, error) {
	if abiErr != nil {
		return nil, abiErr
	}
	if t == nil {
		return nil, invalidArg("nil transport")
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
	rt, _ := t.(*RedisExecutor)
	var k *core
	var err error
	switch tt := t.(type) {
	case *RedisExecutor:
		k, err = newCore(cfg, &tt.proto, seed)
	case coreExecutor:
		k, err = tt.newCore(cfg, seed)
	default:
		k, err = newCore(cfg, nil, seed)
	}
	if err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c := &client{
		core:          k,
		t:             t,
		notifications: cfg.notifications,
		log:           log,
		reqTimeout:    time.Duration(cfg.requestTimeoutNs),
		closeTimeout:  o.CloseTimeout,
		closing:       make(chan struct{}),
		stop:          make(chan struct{}),
		driverDone:    make(chan struct{}),
		watchDone:     make(chan struct{}),
		timer:         time.NewTimer(time.Hour),
		armed:         noDeadline,
		recs:          map[uint64]*leaseRec{},
		relWaits:      map[uint64][]*releaseWait{},
		renewWaits:    map[uint64]map[chan renewResult]struct{}{},
		watchKick:     make(chan struct{}, 1),
		coreWaits:     map[string]struct{}{},
	}
	if c.closeTimeout == 0 {
		c.closeTimeout = c.reqTimeout
	}
	c.timer.Stop()
	c.ioCtx, c.ioCancel = context.WithCancel(context.Background())
	if rt != nil {
		c.rdb = rt.rdb
		c.sub = &subscriber{c: c, rdb: rt.rdb, kick: make(chan struct{}, 1), health: subHealthCheck}
		c.sub.wg.Add(1)
		go c.sub.run(c.stop)
		c.mu.Lock()
		c.drainLocked() // the first request: SUBSCRIBE of the wake channel
		c.mu.Unlock()
	}
	if bt, ok := t.(coreExecutor); ok {
		c.exec = bt.startExec(c)
		c.mu.Lock()
		c.drainLocked()
		c.mu.Unlock()
	}
	go c.driver()
	go c.watcher()
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
// on a RedisExecutor; others get ErrInvalidArgument).
func (cl *LockClient) RedisCounters() (RedisCounters, error) {
	c := cl.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.core == nil {
		return RedisCounters{}, ErrClosed
	}
	if c.sub == nil {
		return RedisCounters{}, invalidArg("not a Redis client")
	}
	return c.core.redisCounters()
}

// EtcdCounters returns what the core's etcd protocol saw (a LockClient made on
// an EtcdExecutor; others get ErrInvalidArgument).
func (cl *LockClient) EtcdCounters() (EtcdCounters, error) {
	c := cl.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.core == nil {
		return EtcdCounters{}, ErrClosed
	}
	if _, ok := c.exec.(*etcdExec); !ok {
		return EtcdCounters{}, invalidArg("not an etcd client")
	}
	return c.core.etcdCounters()
}

// BackendError returns the last error the core's SQL or etcd protocol saw
// (what the database or the cluster said, a refused schema, a connection
// failure), for diagnostics; empty when none, or for other transports.
// An acquire that failed because the backend was unavailable carries it
// in AcquireError.Detail.
func (cl *LockClient) BackendError() string {
	c := cl.c
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.backendErrorLocked()
}

func (c *client) backendErrorLocked() string {
	if c.core == nil || c.exec == nil {
		return ""
	}
	return c.exec.lastErrorLocked()
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
	// The first attempt runs on this goroutine, which waits anyway: no
	// goroutine handoff on the uncontended path. The driver is not involved,
	// so loss detection for other leases is not delayed.
	j := c.drainTake(outAcquire, id)
	c.mu.Unlock()
	if j != nil {
		c.runInline(ctx, j)
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

// armLocked points the driver's timer at the core's next deadline.
func (c *client) armLocked(dl uint64) {
	if dl == c.armed {
		return
	}
	c.armed = dl
	if dl == noDeadline {
		c.timer.Stop()
		return
	}
	now := c.clock()
	d := time.Duration(dl - min(now, dl))
	c.timer.Reset(max(d, 20*time.Microsecond))
}

// driver feeds the core's timeouts. Every other input is fed by the
// goroutine that has it, under c.mu, and drained at once (which re-arms the
// timer); the driver never touches the network.
func (c *client) driver() {
	defer close(c.driverDone)
	for {
		select {
		case <-c.timer.C:
		case <-c.stop:
			return
		}
		c.mu.Lock()
		if c.core == nil {
			c.mu.Unlock()
			return
		}
		c.armed = noDeadline // the timer fired: nothing is armed
		if err := c.core.timeout(c.clock()); err != nil {
			c.breakLocked(err)
		}
		c.drainLocked()
		c.mu.Unlock()
	}
}

// input feeds one input to the core under the mutex and drains its outputs.
func (c *client) input(f func(now uint64) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.core == nil {
		return
	}
	if err := f(c.clock()); err != nil {
		var se *StatusError
		if errors.As(err, &se) && (se.Status == statusPanic || se.Status == statusPoisoned) {
			c.breakLocked(err)
			return
		}
		c.log.Warn("leasehold: core refused an input", "err", err)
	}
	c.drainLocked()
}

// drainLocked drains every output of the core: commands start in their own
// goroutines, events complete waiters and signal losses; then the driver's
// timer is re-armed.
func (c *client) drainLocked() { _ = c.drainTake(0, 0) }

// job is one backend call produced by a command.
type job struct {
	kind    uint32
	lease   uint64
	timeout time.Duration
	run     func(ctx context.Context)
}

// drainTake is drainLocked, except that the first command of the given kind
// for the given lease (with Redis: the first request on the commands
// connection, which the caller's input caused) is returned instead of
// started, for the caller to run on its own goroutine (runInline) after
// unlocking.
func (c *client) drainTake(kind uint32, lease uint64) *job {
	var taken *job
	for c.sub != nil && c.core != nil {
		q, err := c.core.pollRequest()
		if err != nil {
			c.breakLocked(err)
			return nil
		}
		if q == nil {
			break
		}
		if q.connection == connSubscriber {
			c.sub.mu.Lock()
			c.sub.queue = append(c.sub.queue, q)
			c.sub.mu.Unlock()
			select {
			case c.sub.kick <- struct{}{}:
			default:
			}
			continue
		}
		j := &job{timeout: c.reqTimeout, run: func(ctx context.Context) { c.command(ctx, c.rdb, q) }}
		if taken == nil && kind != 0 {
			taken = j
		} else {
			c.spawn(j)
		}
	}
	// SQL and etcd requests start in the executor's goroutines, like Redis's;
	// etcd's first one can run on the caller's, like Redis's first command.
	if t, ok := c.exec.(interface{ pollTakeLocked(bool) (*job, error) }); ok && c.core != nil {
		j, err := t.pollTakeLocked(kind != 0 && taken == nil)
		if err != nil {
			c.breakLocked(err)
			return nil
		}
		if j != nil {
			taken = j
		}
	} else if c.exec != nil && c.core != nil {
		if err := c.exec.pollLocked(); err != nil {
			c.breakLocked(err)
			return nil
		}
	}
	for c.core != nil {
		o, err := c.core.pollOutput()
		if err != nil {
			c.breakLocked(err)
			return nil
		}
		if o.kind == outNone {
			break
		}
		if j := c.dispatchLocked(o); j != nil {
			if taken == nil && kind != 0 && j.kind == kind && j.lease == lease {
				taken = j
			} else {
				c.spawn(j)
			}
		}
	}
	if c.core == nil {
		return taken
	}
	if c.answersStatusLocked() {
		if err := c.answerStatusesLocked(); err != nil {
			c.breakLocked(err)
			return taken
		}
	}
	c.checkReleaseWaitsLocked()
	dl, err := c.core.pollTimeout()
	if err != nil {
		c.breakLocked(err)
		return taken
	}
	c.armLocked(dl)
	return taken
}

func ttlMillis(ms uint64) time.Duration { return time.Duration(ms) * time.Millisecond }

func (c *client) dispatchLocked(o output) *job {
	switch o.kind {
	case outAcquire:
		return &job{kind: o.kind, lease: o.lease, timeout: c.reqTimeout, run: func(ctx context.Context) {
			r, err := callAcquire(ctx, c.t, o.name, o.token, ttlMillis(o.ttlMs))
			c.input(func(now uint64) error {
				if err != nil {
					c.logTransport("acquire", o.name, err)
					return c.core.acquireResult(now, o.request, acquireTransportError, 0, 0, noRetryHint, nil)
				}
				if !r.Granted {
					retry := noRetryHint
					if r.RetryAfter >= 0 {
						retry = uint64((r.RetryAfter + time.Millisecond - 1) / time.Millisecond)
					}
					return c.core.acquireResult(now, o.request, acquireHeldByOther, 0, 0, retry, nil)
				}
				ttl := o.ttlMs
				if r.TTL > 0 {
					ttl = uint64(r.TTL / time.Millisecond)
				}
				err := c.core.acquireResult(now, o.request, acquireGranted, r.FencingToken, ttl, noRetryHint, r.BackendData)
				if err != nil && errors.Is(err, ErrInvalidArgument) {
					c.log.Warn("leasehold: transport returned an invalid grant", "name", o.name, "err", err)
					return c.core.acquireResult(now, o.request, acquireTransportError, 0, 0, noRetryHint, nil)
				}
				return err
			})
		}}
	case outRenew:
		timeout := min(c.reqTimeout, max(ttlMillis(o.ttlMs)/3, time.Millisecond))
		return &job{kind: o.kind, lease: o.lease, timeout: timeout, run: func(ctx context.Context) {
			ok, err := callRenew(ctx, c.t, o.name, o.token, ttlMillis(o.ttlMs), o.backendData)
			c.input(func(now uint64) error {
				switch {
				case err != nil:
					c.logTransport("renew", o.name, err)
					return c.core.renewResult(now, o.request, renewTransportError)
				case ok:
					return c.core.renewResult(now, o.request, renewRenewed)
				default:
					return c.core.renewResult(now, o.request, renewRejected)
				}
			})
		}}
	case outRelease:
		return &job{kind: o.kind, lease: o.lease, timeout: c.reqTimeout, run: func(ctx context.Context) {
			ok, err := callRelease(ctx, c.t, o.name, o.token, o.backendData)
			c.input(func(now uint64) error {
				if err != nil {
					c.logTransport("release", o.name, err)
					return c.core.releaseResult(now, o.request, releaseTransportError)
				}
				if ok {
					return c.core.releaseResult(now, o.request, releaseReleased)
				}
				return c.core.releaseResult(now, o.request, releaseNotOwner)
			})
		}}
	case outWatch, outUnwatch:
		if !c.notifications {
			return nil // polling: the transport is never asked to watch
		}
		c.watchQ = append(c.watchQ, watchOp{watch: o.kind == outWatch, name: o.name})
		// Tracked now, not when the watcher gets to it: wake-ups in between
		// must be declined (see wake).
		if o.kind == outWatch {
			c.coreWaits[o.name] = struct{}{}
		} else {
			delete(c.coreWaits, o.name)
		}
		select {
		case c.watchKick <- struct{}{}:
		default:
		}
	case outAcquired:
		rec := c.recs[o.lease]
		if rec == nil {
			c.log.Warn("leasehold: Acquired for an unknown lease", "lease", o.lease)
			return nil
		}
		rec.fence = o.fencingToken
		rec.validUntil = o.validUntil
		for w := range rec.waiters {
			l := newLease(w.owner, rec)
			rec.handles[l.ref] = struct{}{}
			w.ch <- acqResult{lease: l}
			delete(rec.waiters, w)
		}
	case outAcquireFailed:
		rec := c.recs[o.lease]
		if rec == nil {
			return nil
		}
		err := &AcquireError{Name: rec.name, Reason: reasonString(o.reason), code: o.reason}
		if o.reason == reasonUnavailable {
			err.Detail = c.backendErrorLocked()
		}
		for w := range rec.waiters {
			w.ch <- acqResult{err: err}
			delete(rec.waiters, w)
		}
		if len(rec.handles) == 0 {
			rec.ended = true
			delete(c.recs, o.lease)
		}
	case outLost:
		rec := c.recs[o.lease]
		if rec == nil {
			return nil
		}
		c.loseLocked(rec, &LostError{Name: rec.name, Reason: reasonString(o.reason)})
	case outReleased:
		rec := c.recs[o.lease]
		if rec == nil {
			return nil
		}
		rec.ended = true
		for h := range rec.handles {
			h.cancel(ErrReleased)
		}
		c.answerRenewsLocked(o.lease, renewResult{err: ErrReleased})
		delete(c.recs, o.lease)
	case outRenewed:
		if rec := c.recs[o.lease]; rec != nil {
			rec.validUntil = o.validUntil
		}
		c.answerRenewsLocked(o.lease, renewResult{validUntil: c.toTime(o.validUntil)})
	case outRelOutcome:
		// CONFIRMED and UNCONFIRMED (no answer before the grant had
		// certainly run out: it is gone) are both a release.
		for _, w := range c.relWaits[o.lease] {
			if o.reason == reasonRelNotOwner {
				w.finish(fmt.Errorf("%w: lock %q", ErrNotOwner, w.name))
			} else {
				w.finish(nil)
			}
		}
		delete(c.relWaits, o.lease)
	default:
		c.log.Warn("leasehold: unknown output kind", "kind", o.kind)
	}
	return nil
}

// logTransport logs a failed backend call: error replies of the service at
// warning level (they point at a bug or keyspace garbage), network errors at
// debug level (the core's retries and loss detection handle them).
func (c *client) logTransport(op, name string, err error) {
	if errors.Is(err, ErrBackendReply) {
		c.log.Warn("leasehold: backend error reply", "op", op, "name", name, "err", err)
		return
	}
	c.log.Debug("leasehold: "+op+" failed", "name", name, "err", err)
}

// answerRenewsLocked completes the Renew calls waiting on lease.
func (c *client) answerRenewsLocked(lease uint64, r renewResult) {
	for ch := range c.renewWaits[lease] {
		ch <- r
	}
	delete(c.renewWaits, lease)
}

func (c *client) loseLocked(rec *leaseRec, err error) {
	rec.ended = true
	rec.lostErr = err
	c.answerRenewsLocked(rec.id, renewResult{err: err})
	// Lost() first: whoever sees a context cancelled by loss sees it closed.
	close(rec.lost)
	for h := range rec.handles {
		h.cancel(err)
	}
	for w := range rec.waiters {
		w.ch <- acqResult{err: err}
		delete(rec.waiters, w)
	}
	delete(c.recs, rec.id)
}

// breakLocked handles a poisoned core: every waiter fails and every lease
// is reported lost, since its state can no longer be known.
func (c *client) breakLocked(err error) {
	if c.broken != nil {
		return
	}
	c.broken = fmt.Errorf("%w: %w", ErrBroken, err)
	c.log.Warn("leasehold: core handle broken", "err", err)
	for _, rec := range c.recs {
		c.loseLocked(rec, &LostError{Name: rec.name, Reason: "core handle poisoned"})
	}
	for id := range c.relWaits {
		c.finishReleasesLocked(id, c.broken)
	}
}

func (c *client) finishReleasesLocked(lease uint64, err error) {
	for _, w := range c.relWaits[lease] {
		w.finish(err)
	}
	delete(c.relWaits, lease)
}

// checkReleaseWaitsLocked is a safety net: a release whose lease the core
// forgot without an outcome event must not keep its caller waiting.
func (c *client) checkReleaseWaitsLocked() {
	for id := range c.relWaits {
		if _, err := c.core.leaseState(id); err != nil {
			c.log.Warn("leasehold: lease forgotten without a release outcome", "lease", id)
			c.finishReleasesLocked(id, nil)
		}
	}
}

// spawn runs one backend call in its own goroutine with a timeout.
func (c *client) spawn(j *job) {
	c.ioWG.Add(1)
	c.inflight.Add(1)
	go func() {
		defer c.ioWG.Done()
		defer c.inflight.Add(-1)
		ctx, cancel := context.WithTimeout(c.ioCtx, j.timeout)
		defer cancel()
		j.run(ctx)
	}()
}

// runInline runs a job on the calling goroutine; the call is abandoned
// (a transport error for the core) when caller's ctx ends.
func (c *client) runInline(caller context.Context, j *job) {
	c.ioWG.Add(1)
	c.inflight.Add(1)
	defer c.ioWG.Done()
	defer c.inflight.Add(-1)
	ctx, cancel := context.WithTimeout(c.ioCtx, j.timeout)
	defer cancel()
	stop := context.AfterFunc(caller, cancel)
	defer stop()
	j.run(ctx)
}

func callAcquire(ctx context.Context, t Executor, name, token string, ttl time.Duration) (r AcquireReply, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("leasehold: transport panicked: %v", p)
		}
	}()
	return t.Acquire(ctx, name, token, ttl)
}

func callRenew(ctx context.Context, t Executor, name, token string, ttl time.Duration, data []byte) (ok bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("leasehold: transport panicked: %v", p)
		}
	}()
	return t.Renew(ctx, name, token, ttl, data)
}

func callRelease(ctx context.Context, t Executor, name, token string, data []byte) (ok bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("leasehold: transport panicked: %v", p)
		}
	}()
	return t.Release(ctx, name, token, data)
}

// watcher executes Watch/Unwatch commands in order, off the driver.
func (c *client) watcher() {
	defer close(c.watchDone)
	unwatch := map[string]func(){}
	defer func() {
		for _, f := range unwatch {
			safeCall(f)
		}
	}()
	notify := func(name string) {
		c.input(func(now uint64) error { return c.core.released(now, name) })
	}
	for {
		select {
		case <-c.watchKick:
		case <-c.stop:
			return
		}
		for {
			c.mu.Lock()
			if len(c.watchQ) == 0 {
				c.mu.Unlock()
				break
			}
			op := c.watchQ[0]
			c.watchQ = c.watchQ[1:]
			c.mu.Unlock()
			if op.watch {
				if _, dup := unwatch[op.name]; dup {
					continue
				}
				ctx, cancel := context.WithTimeout(c.ioCtx, c.reqTimeout)
				f, err := callWatch(ctx, c.t, op.name, notify, c.wake)
				cancel()
				if err != nil {
					c.log.Debug("leasehold: watch failed; waiters fall back to retry hints", "name", op.name, "err", err)
					continue
				}
				if f == nil {
					f = func() {}
				}
				unwatch[op.name] = f
			} else if f, ok := unwatch[op.name]; ok {
				delete(unwatch, op.name)
				safeCall(f)
			}
		}
	}
}

// wake is notify for a WaiterWatcher. It declines a wake-up the core would
// drop (it waits no more for name, though the watcher has not unwatched
// yet), so that the transport passes it on instead of losing it.
func (c *client) wake(name string) bool {
	took := false
	c.input(func(now uint64) error {
		if _, ok := c.coreWaits[name]; !ok || c.broken != nil {
			return nil
		}
		took = true
		return c.core.released(now, name)
	})
	return took
}

func callWatch(ctx context.Context, t Executor, name string, notify func(string), wake func(string) bool) (f func(), err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("leasehold: transport panicked: %v", p)
		}
	}()
	if w, ok := t.(WaiterWatcher); ok {
		return w.WatchWaiter(ctx, name, wake)
	}
	return t.Watch(ctx, name, notify)
}

func safeCall(f func()) {
	defer func() { _ = recover() }()
	f()
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
		// lease) removes it now, within the same bound.
		if cl, ok := c.exec.(interface{ closingLocked(uint64) error }); ok {
			c.mu.Lock()
			if c.core != nil && c.broken == nil && cl.closingLocked(c.clock()) == nil {
				c.drainLocked()
			}
			c.mu.Unlock()
			for time.Now().Before(deadline) && c.inflight.Load() != 0 {
				time.Sleep(time.Millisecond)
			}
		}

		close(c.stop)
		c.ioCancel()
		<-c.driverDone
		<-c.watchDone
		if c.sub != nil {
			c.sub.wg.Wait()
		}
		if c.exec != nil {
			c.exec.close()
		}

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
