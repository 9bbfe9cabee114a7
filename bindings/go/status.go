package leasehold

import (
	"context"
	"errors"
	"time"
)

// LockStatus is what the backend says about one name right now (advisory:
// it can change at once). Numbers that are unknown are zero.
type LockStatus struct {
	Name string
	// Held is true while a live grant exists.
	Held bool
	// FencingToken and RemainingTTL describe the holder's grant, while held.
	FencingToken uint64
	RemainingTTL time.Duration
	// LastFencingToken is the highest fence ever minted for the name.
	LastFencingToken uint64
	// HolderPID and HolderHost name the holder's process (SQLite), while held.
	HolderPID  int64
	HolderHost string
	// HeldFor is how long the grant has been held, when recorded.
	HeldFor time.Duration
}

// ErrStatusUnsupported was Status's error on an executor whose core did not
// answer status queries.
//
// Deprecated: every executor answers them now (the memory service too).
var ErrStatusUnsupported = errors.New("leasehold: status needs a Redis, SQL or etcd transport")

// statusWait is one Status call waiting for its answer.
type statusWait struct {
	ch chan statusAnswer
}

// Status asks the backend about name (a query the core writes, like
// `leasehold status`): whether it is held, by which fence, for how long, and
// (SQL, memory, and Redis while the fence key lives) the last fence minted.
// On etcd the fence is the owner key's create revision. A query that fails
// returns the backend's error.
func (cl *LockClient) Status(ctx context.Context, name string) (LockStatus, error) {
	c := cl.c
	if ctx == nil {
		return LockStatus{}, invalidArg("nil context")
	}
	c.mu.Lock()
	if c.core == nil || c.closed {
		c.mu.Unlock()
		return LockStatus{}, ErrClosed
	}
	id, err := c.core.statusRequest(c.clock(), name)
	if err != nil {
		c.mu.Unlock()
		return LockStatus{}, err
	}
	w := &statusWait{ch: make(chan statusAnswer, 1)}
	c.statusWaits[id] = w
	c.drainLocked()
	c.mu.Unlock()
	select {
	case a := <-w.ch:
		if a.err != "" {
			return LockStatus{}, errors.New("leasehold: status of " + name + ": " + a.err)
		}
		a.st.Name = name
		return a.st, nil
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.statusWaits, id)
		c.mu.Unlock()
		return LockStatus{}, ctx.Err()
	case <-c.closing:
		return LockStatus{}, ErrClosed
	}
}

// answerStatusesLocked hands the core's answered status queries to their callers.
func (c *client) answerStatusesLocked() error {
	for c.core.statusOut > 0 {
		a, err := c.core.pollStatus()
		if err != nil || a.id == 0 {
			return err
		}
		if w := c.statusWaits[a.id]; w != nil {
			delete(c.statusWaits, a.id)
			w.ch <- a
		}
	}
	return nil
}
