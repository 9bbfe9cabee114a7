package leasehold

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Lease is one holder's handle on an acquired lock. Its methods are safe for
// concurrent use.
type Lease struct {
	owner    *LockClient // keeps the LockClient reachable while a lease is in use
	rec      *leaseRec
	name     string
	fence    uint64
	ctx      context.Context
	cancel   context.CancelCauseFunc
	ref      *leaseRef
	released atomic.Bool

	relOnce sync.Once
	rel     *releaseWait
	relJob  *job
}

// leaseRef is what the client's records keep of a Lease: its cancel func,
// and no pointer to the Lease or the LockClient. A forgotten LockClient whose
// leases are forgotten too is thus unreachable and gets cleaned up (which
// releases the leases) instead of renewing them forever.
type leaseRef struct {
	cancel context.CancelCauseFunc
}

func newLease(owner *LockClient, rec *leaseRec) *Lease {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Lease{owner: owner, rec: rec, name: rec.name, fence: rec.fence, ctx: ctx, cancel: cancel, ref: &leaseRef{cancel: cancel}}
}

// Name returns the lock name.
func (l *Lease) Name() string { return l.name }

// FencingToken returns the fencing token minted by the backend for this
// grant. Tokens of successive grants of one name strictly increase; pass it
// to every protected write (see FencingGate).
func (l *Lease) FencingToken() uint64 { return l.fence }

// ValidUntil returns the time until which the lease is certainly held
// (already reduced by the drift margin); it moves forward with each renewal.
func (l *Lease) ValidUntil() time.Time {
	c := l.owner.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.core != nil && !l.rec.ended {
		if v, err := c.core.validUntil(l.rec.id); err == nil {
			l.rec.validUntil = v
		}
	}
	return c.toTime(l.rec.validUntil)
}

// IsHeld reports whether the lease is still held now: not released, not
// lost, and within its validity.
func (l *Lease) IsHeld() bool {
	if l.released.Load() {
		return false
	}
	c := l.owner.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.core == nil || l.rec.ended {
		return false
	}
	held, err := c.core.isHeld(l.rec.id, c.clock())
	return err == nil && held
}

// Lost returns a channel closed when the lease is lost (rejected by the
// backend, expired before a renewal succeeded, or renewals failed too often).
// It is not closed by Release or Close: use Context for "stop working".
func (l *Lease) Lost() <-chan struct{} { return l.rec.lost }

// Context returns a context cancelled when the lease is lost, released, or
// its LockClient is closed; context.Cause tells which (ErrLost via *LostError,
// ErrReleased, ErrClosed). Hand it to the critical section.
func (l *Lease) Context() context.Context { return l.ctx }

// Err returns nil while the lease is held, a *LostError (matching ErrLost)
// once it was lost (also when Release found it lost), ErrReleased after
// Release and ErrClosed after Close.
func (l *Lease) Err() error {
	if l.ctx.Err() != nil {
		return context.Cause(l.ctx)
	}
	select {
	case <-l.rec.lost:
		// Lost() is closed just before the contexts are cancelled; the
		// close orders the write of lostErr before this read.
		return l.rec.lostErr
	default:
		return nil
	}
}

// Renew extends the lease now, whether or not it renews automatically
// (see AcquireOptions.NoAutoRenew), and returns its new validity (as
// ValidUntil), counted from when the renewal was sent; a renewal already in
// flight is joined. It waits, bounded by ctx, for the service's answer; a
// renewal failing in transport is retried within the failure budget
// (Options.FailBudget), so without a ctx bound it ends in a new validity or
// the lease's loss.
//
// On a lease that was released (ErrReleased), lost (a *LostError, matching
// ErrLost) or whose LockClient was closed (ErrClosed), Renew fails at once and
// sends nothing. A lease whose validity already ran out is lost by this
// call, without a request.
func (l *Lease) Renew(ctx context.Context) (time.Time, error) {
	if ctx == nil {
		return time.Time{}, invalidArg("nil context")
	}
	if l.released.Load() {
		return time.Time{}, ErrReleased
	}
	c := l.owner.c
	c.mu.Lock()
	if err := l.endedLocked(); err != nil {
		c.mu.Unlock()
		return time.Time{}, err
	}
	id := l.rec.id
	if err := c.core.renew(c.clock(), id); err != nil {
		if errors.Is(err, ErrBroken) {
			c.breakLocked(err)
			err = c.broken
		}
		c.mu.Unlock()
		return time.Time{}, err
	}
	ch := make(chan renewResult, 1)
	if c.renewWaits[id] == nil {
		c.renewWaits[id] = map[chan renewResult]struct{}{}
	}
	c.renewWaits[id][ch] = struct{}{}
	c.drainLocked() // spawns the RENEW, or delivers the loss found on the way
	c.mu.Unlock()
	select {
	case r := <-ch:
		return r.validUntil, r.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	delete(c.renewWaits[id], ch)
	c.mu.Unlock()
	select {
	case r := <-ch:
		return r.validUntil, r.err
	default:
		return time.Time{}, ctx.Err()
	}
}

// endedLocked returns the error of an operation on a lease that ended
// (lost, or its LockClient closed or broken), nil while it lives (c.mu held).
func (l *Lease) endedLocked() error {
	c := l.owner.c
	switch {
	case l.rec.lostErr != nil:
		return l.rec.lostErr
	case c.broken != nil:
		return c.broken
	case c.closed || c.core == nil || l.rec.ended:
		return ErrClosed
	}
	return nil
}

// Release gives the lock back and tells what happened: nil when the
// service confirmed the release (or the grant had certainly run out before
// it could answer); a *LostError (matching ErrLost, with the reason) when
// the lease was lost before it was released, including a lease whose
// validity ran out before this call (a paused process: it ends lost, its
// Context is cancelled with the loss and Lost is closed, never a quiet
// release); an error matching ErrNotOwner when the service refused because
// the grant was no longer ours (someone else may hold the lock now).
//
// The lease stops being held at once; Release then waits, bounded by ctx,
// for the service's answer (the release keeps being retried in the
// background if ctx ends first, and ctx's error is returned). Release is
// idempotent: every call returns the same result once it is known. Releasing
// one of several reentrant holders returns nil at once; after Close it
// returns nil (Close released the lock).
func (l *Lease) Release(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	w, j := l.startRelease()
	if j != nil {
		// This goroutine waits anyway: it starts the release itself.
		l.owner.c.runInline(ctx, j, w)
	}
	select {
	case <-w.done:
		return w.err
	default:
	}
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// answered reports whether the release's outcome is known.
func (w *releaseWait) answered() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// startRelease releases the lease in the core on its first call and
// returns its result (shared by every call) and, on the first call only,
// the release call for the caller to run (nil if there is none to run).
func (l *Lease) startRelease() (*releaseWait, *job) {
	first := false
	l.relOnce.Do(func() {
		first = true
		l.released.Store(true)
		l.rel, l.relJob = l.release()
	})
	if !first {
		return l.rel, nil
	}
	j := l.relJob
	l.relJob = nil
	return l.rel, j
}

func (l *Lease) release() (*releaseWait, *job) {
	w := newReleaseWait(l.name)
	c := l.owner.c
	c.mu.Lock()
	defer c.mu.Unlock()
	// The handle stays registered until the core decided: a lease found
	// lost by this release cancels it with the loss, not with ErrReleased.
	defer func() {
		delete(l.rec.handles, l.ref)
		l.cancel(ErrReleased)
	}()
	if c.core == nil || l.rec.ended {
		if errors.Is(l.endedLocked(), ErrClosed) {
			w.finish(nil)
		} else {
			w.finish(l.endedLocked())
		}
		return w, nil
	}
	id := l.rec.id
	disp, err := c.core.releaseReported(c.clock(), id)
	if err != nil {
		if errors.Is(err, ErrBroken) {
			c.breakLocked(err)
			err = c.broken
		} else if isEnded(err) {
			err = l.rec.lostErr
		} else {
			c.log.Warn("leasehold: release", "name", l.name, "err", err)
		}
		w.finish(err)
		return w, nil
	}
	switch disp {
	case releasingPending:
		c.relWaits[id] = append(c.relWaits[id], w)
		return w, c.drainTake(true)
	case releasingLost:
		c.drainLocked() // delivers the LOST event: Lost, Context and lostErr
		if l.rec.lostErr != nil {
			w.finish(l.rec.lostErr)
		} else {
			w.finish(&LostError{Name: l.name, Reason: reasonString(reasonExpired)})
		}
	default: // other reentrant holders remain, or never granted
		c.drainLocked()
		w.finish(nil)
	}
	return w, nil
}
