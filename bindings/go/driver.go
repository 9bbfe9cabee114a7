package leasehold

// The driver: how a LockClient feeds its core and runs what the core asks. The core's
// timeouts are fed by one driver goroutine; every other input by the goroutine that has
// it, under c.mu, which then drains the outputs: backend calls start off the driver (in
// goroutines of their own, or inline on the goroutine that waits for them) and events
// complete waiters and signal losses.

import (
	"context"
	"errors"
	"fmt"
	"time"
)

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
