package leasehold

// The driver: how a LockClient feeds its core and runs the IO it asks for, the same for
// every backend. The core's timeouts are fed by one driver goroutine; every other input
// (an application call, an answer, a notification) by the goroutine that has it, under
// c.mu, which then drains the core: each request goes to the executor (ioExec.run), off
// the driver (in a goroutine of its own, or on the goroutine that waits for it), and each
// event completes waiters or signals a loss.

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// armLocked points the driver's timer at the core's next deadline when it comes before
// the armed one. A later one keeps the timer: the driver wakes early, feeds a timeout with
// nothing due and re-arms, so a request timeout pushed back at every answer costs no
// timer change (and no wake-up of the runtime's poller).
func (c *client) armLocked(dl uint64) {
	if dl >= c.armed {
		return
	}
	c.armed = dl
	now := c.clock()
	d := time.Duration(dl - min(now, dl))
	c.timer.Reset(max(d, 20*time.Microsecond))
}

// driver feeds the core's timeouts; it never touches the network.
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

// input feeds one input to the core under the mutex and drains it.
func (c *client) input(f func(now uint64) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.core == nil {
		return
	}
	if err := f(c.clock()); err != nil {
		if errors.Is(err, ErrBroken) {
			c.breakLocked(err)
			return
		}
		c.log.Warn("leasehold: core refused an input", "err", err)
	}
	c.drainLocked()
}

// job is one request that runs on any goroutine, with its timeout.
type job struct {
	id      uint64 // the request it answers
	timeout time.Duration
	run     func(ctx context.Context)
	// drive, when set, runs the job on the caller's goroutine instead (runInline): its IO
	// and the reading of answers until ready reports the caller's answer in, within ctx,
	// handing what is left to goroutines of the executor's past it.
	drive func(ctx context.Context, ready answered)
	// deadlined: run ends by its ctx's deadline by itself (a go-redis client with
	// ContextTimeoutEnabled bounds its socket IO by it), so a caller whose ctx cannot be
	// cancelled runs it on its own goroutine (runInline).
	deadlined bool
}

// answered reports whether a caller's answer came (a drive reads until it did); an
// interface so that the caller's waiter is passed without a closure to allocate.
type answered interface{ answered() bool }

// drainer is an executor told after every drain (c.mu held), to wake callers whose answer
// came while they were blocked in IO of their own.
type drainer interface{ drained() }

// drainLocked drains the core: requests go to the executor, events to the application;
// then the driver's timer is re-armed.
func (c *client) drainLocked() { _ = c.drainTake(false) }

// drainTake is drainLocked, except that with take the first request the executor hands
// back as a job is returned instead of started, for the caller, which waits for its
// answer anyway, to start after unlocking (runInline): the driver is not involved.
func (c *client) drainTake(take bool) *job {
	if c.core == nil {
		return nil
	}
	return c.drainFrom(take, c.core.step(false, c.core.statusOut == 0))
}

// drainFrom is drainTake from its first step s, taken already. The deadline comes in the
// last step when no status answer is to be polled before it (nothing else in between
// changes the core).
func (c *client) drainFrom(take bool, s drainStep) *job {
	var taken *job
	for events := false; ; {
		if s.err != nil {
			c.breakLocked(s.err)
			if s.polling {
				return nil // as a request that failed to run: the caller has none to drive
			}
			return taken
		}
		if s.q != nil {
			j, err := c.x.run(s.q)
			if err != nil {
				c.log.Warn("leasehold: request not run", "kind", s.q.kind, "err", err)
				if err := c.core.ioFailed(c.clock(), s.q.id, failTransport, err.Error()); err != nil {
					c.breakLocked(err)
					return nil
				}
			} else if j != nil {
				if take && taken == nil {
					taken = j
				} else {
					c.spawn(j)
				}
			}
		} else if s.e.kind != evNone {
			events = true
			c.eventLocked(s.e)
		} else {
			break
		}
		if c.core == nil {
			return taken
		}
		s = c.core.step(events, c.core.statusOut == 0)
	}
	if err := c.answerStatusesLocked(); err != nil {
		c.breakLocked(err)
		return taken
	}
	c.checkReleaseWaitsLocked()
	if d, ok := c.x.(drainer); ok {
		d.drained()
	}
	dl := s.dl
	if !s.hasDeadline {
		var err error
		if dl, err = c.core.pollTimeout(); err != nil {
			c.breakLocked(err)
			return taken
		}
	}
	c.armLocked(dl)
	return taken
}

// received feeds bytes read on stream to the core and drains it, like input, with the
// first step of the drain in the same crossing.
func (c *client) received(stream uint64, b []byte) {
	if len(b) > maxReplyData {
		c.input(func(now uint64) error { return c.core.ioReceived(now, stream, b) })
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.core == nil {
		return
	}
	c.feeding, c.feedingStream = true, stream
	defer func() { c.feeding = false }()
	s, ok := c.core.receivedStep(c.clock(), stream, b, c.core.statusOut == 0)
	if !ok {
		if errors.Is(s.err, ErrBroken) {
			c.breakLocked(s.err)
			return
		}
		c.log.Warn("leasehold: core refused an input", "err", s.err)
		c.drainLocked()
		return
	}
	c.drainFrom(false, s)
}

// eventLocked delivers one event of the core to the application.
func (c *client) eventLocked(e event) {
	switch e.kind {
	case evAcquired:
		rec := c.recs[e.lease]
		if rec == nil {
			c.log.Warn("leasehold: Acquired for an unknown lease", "lease", e.lease)
			return
		}
		rec.fence = e.fencingToken
		rec.validUntil = e.validUntil
		for w := range rec.waiters {
			l := newLease(w.owner, rec)
			rec.handles[l.ref] = struct{}{}
			w.ch <- acqResult{lease: l}
			delete(rec.waiters, w)
		}
	case evAcquireFailed:
		rec := c.recs[e.lease]
		if rec == nil {
			return
		}
		err := &AcquireError{Name: rec.name, Reason: reasonString(e.reason), code: e.reason}
		if e.reason == reasonUnavailable {
			err.Detail = c.core.backendLastError()
		}
		for w := range rec.waiters {
			w.ch <- acqResult{err: err}
			delete(rec.waiters, w)
		}
		if len(rec.handles) == 0 {
			rec.ended = true
			delete(c.recs, e.lease)
		}
	case evLost:
		if rec := c.recs[e.lease]; rec != nil {
			c.loseLocked(rec, &LostError{Name: rec.name, Reason: reasonString(e.reason)})
		}
	case evReleased:
		rec := c.recs[e.lease]
		if rec == nil {
			return
		}
		rec.ended = true
		for h := range rec.handles {
			h.cancel(ErrReleased)
		}
		c.answerRenewsLocked(e.lease, renewResult{err: ErrReleased})
		delete(c.recs, e.lease)
	case evRenewed:
		if rec := c.recs[e.lease]; rec != nil {
			rec.validUntil = e.validUntil
		}
		c.answerRenewsLocked(e.lease, renewResult{validUntil: c.toTime(e.validUntil)})
	case evRelOutcome:
		// CONFIRMED and UNCONFIRMED (no answer before the grant had
		// certainly run out: it is gone) are both a release.
		for _, w := range c.relWaits[e.lease] {
			if e.reason == reasonRelNotOwner {
				w.finish(fmt.Errorf("%w: lock %q", ErrNotOwner, w.name))
			} else {
				w.finish(nil)
			}
		}
		delete(c.relWaits, e.lease)
	default:
		c.log.Warn("leasehold: unknown event kind", "kind", e.kind)
	}
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
	for id, w := range c.statusWaits {
		delete(c.statusWaits, id)
		w.ch <- statusAnswer{id: id, err: c.broken.Error()}
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

// spawn runs one job in its own goroutine with its timeout.
func (c *client) spawn(j *job) {
	c.ioWG.Add(1)
	c.inflight.Add(1)
	go func() {
		defer c.ioWG.Done()
		defer c.inflight.Add(-1)
		ctx, cancel := context.WithTimeout(c.ioCtx, j.timeout)
		defer cancel()
		c.runJob(ctx, j)
	}()
}

// runInline runs a job for a caller that waits for its answer anyway, and
// returns when it is done or when the caller's ctx or the job's timeout ends,
// whichever is first. A job with a drive honours ctx itself and runs on the
// caller's goroutine, until ready reports the caller's answer in. So does a
// deadlined job when the caller's ctx cannot be cancelled (no Done channel):
// its bound is then the job's timeout, which the job keeps. Otherwise the
// executor's IO may not honour the caller's ctx (go-redis never watches a
// cancellation, and bounds a read by its ReadTimeout alone unless
// ContextTimeoutEnabled), so the job runs on a goroutine of its own and, past
// the caller's bound, continues there and answers the core as usual (a late
// release is confirmed, a late grant released).
func (c *client) runInline(caller context.Context, j *job, ready answered) {
	c.ioWG.Add(1)
	c.inflight.Add(1)
	if j.drive != nil {
		defer c.ioWG.Done()
		defer c.inflight.Add(-1)
		defer c.recoverJob(j)
		j.drive(caller, ready)
		return
	}
	if j.deadlined && caller.Done() == nil {
		defer c.ioWG.Done()
		defer c.inflight.Add(-1)
		ctx, cancel := context.WithTimeout(c.ioCtx, j.timeout)
		defer cancel()
		c.runJob(ctx, j)
		return
	}
	ctx, cancel := context.WithTimeout(c.ioCtx, j.timeout)
	done := make(chan struct{})
	go func() {
		defer c.ioWG.Done()
		defer c.inflight.Add(-1)
		defer cancel()
		defer close(done)
		c.runJob(ctx, j)
	}()
	select {
	case <-done:
	case <-caller.Done():
	case <-ctx.Done():
	}
}

// runJob runs j; a panic in the executor's IO (a driver's bug) is the request's transport
// failure, never a crash of the application.
func (c *client) runJob(ctx context.Context, j *job) {
	defer c.recoverJob(j)
	j.run(ctx)
}

func (c *client) recoverJob(j *job) {
	if p := recover(); p != nil {
		c.log.Warn("leasehold: executor panicked", "panic", p)
		msg := fmt.Sprint("the executor panicked: ", p)
		c.input(func(now uint64) error { return c.core.ioFailed(now, j.id, failTransport, msg) })
	}
}
