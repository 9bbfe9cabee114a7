package leasehold

import (
	"context"
	"sync/atomic"
	"time"
)

// Lease is one holder's handle on an acquired lock. Its methods are safe for
// concurrent use.
type Lease struct {
	owner    *Client // keeps the Client reachable while a lease is in use
	rec      *leaseRec
	name     string
	fence    uint64
	ctx      context.Context
	cancel   context.CancelCauseFunc
	ref      *leaseRef
	released atomic.Bool
}

// leaseRef is what the client's records keep of a Lease: its cancel func,
// and no pointer to the Lease or the Client. A forgotten Client whose
// leases are forgotten too is thus unreachable and gets cleaned up (which
// releases the leases) instead of renewing them forever.
type leaseRef struct {
	cancel context.CancelCauseFunc
}

func newLease(owner *Client, rec *leaseRec) *Lease {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Lease{owner: owner, rec: rec, name: rec.name, fence: rec.fence, ctx: ctx, cancel: cancel, ref: &leaseRef{cancel: cancel}}
}

// Name returns the lock name.
func (l *Lease) Name() string { return l.name }

// FencingToken returns the fencing token minted by the backend for this
// grant. Tokens of successive grants of one name strictly increase; pass it
// to every protected write (see Gate).
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
	return monoToTime(l.rec.validUntil)
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
	held, err := c.core.isHeld(l.rec.id, monoNow())
	return err == nil && held
}

// Lost returns a channel closed when the lease is lost (rejected by the
// backend, expired before a renewal succeeded, or renewals failed too often).
// It is not closed by Release or Close: use Context for "stop working".
func (l *Lease) Lost() <-chan struct{} { return l.rec.lost }

// Context returns a context cancelled when the lease is lost, released, or
// its Client is closed; context.Cause tells which (ErrLost via *LostError,
// ErrReleased, ErrClosed). Hand it to the critical section.
func (l *Lease) Context() context.Context { return l.ctx }

// Err returns nil while the lease is held, a *LostError (matching ErrLost)
// once it was lost, ErrReleased after Release and ErrClosed after Close.
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

// Release gives the lock back. It is idempotent and safe to call after a
// loss. The lease stops being held at once; Release then waits, bounded by
// ctx, until the backend confirmed (the release keeps being retried in the
// background if ctx ends first, in which case ctx's error is returned).
func (l *Lease) Release(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	ch, j := l.releaseCh()
	if ch == nil {
		return nil
	}
	if j != nil {
		// This goroutine waits anyway: it runs the release itself.
		l.owner.c.runInline(ctx, j)
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// releaseCh releases the lease locally and returns a channel closed when the
// backend confirmed (nil when there is nothing to wait for) and the release
// call for the caller to run (nil if there is none to run).
func (l *Lease) releaseCh() (chan struct{}, *job) {
	if !l.released.CompareAndSwap(false, true) {
		return nil, nil
	}
	c := l.owner.c
	c.mu.Lock()
	defer c.mu.Unlock()
	l.cancel(ErrReleased)
	delete(l.rec.handles, l.ref)
	if c.core == nil || l.rec.ended {
		return nil, nil
	}
	id := l.rec.id
	if err := c.core.release(monoNow(), id); err != nil {
		if !isEnded(err) {
			c.log.Warn("leasehold: release", "name", l.name, "err", err)
		}
		return nil, nil
	}
	j := c.drainTake(outRelease, id)
	if c.core == nil {
		return nil, nil
	}
	st, err := c.core.leaseState(id)
	if err != nil || st == stateHeld || st == stateAcquiring {
		// Gone already, or other reentrant holders keep it.
		if j != nil {
			c.spawn(j)
		}
		return nil, nil
	}
	ch := make(chan struct{})
	c.relWaits[id] = append(c.relWaits[id], ch)
	return ch, j
}
