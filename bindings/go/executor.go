package leasehold

import (
	"context"
	"errors"
	"time"
)

// ErrBackendReply marks an error reply of the lock service itself, as
// opposed to a network failure, for an Executor to return. Both are
// transport errors for the core, never a grant; the LockClient logs the former
// at warning level. (With a RedisExecutor the core reads Redis's replies
// itself and counts error replies in LockClient.RedisCounters.)
var ErrBackendReply = errors.New("leasehold: backend error reply")

// AcquireReply is a backend's answer to an acquire request.
type AcquireReply struct {
	// Granted is true when the caller now holds the lock.
	Granted bool
	// FencingToken is the token minted by the backend for this grant.
	FencingToken uint64
	// TTL is the TTL the backend granted (whole milliseconds).
	TTL time.Duration
	// RetryAfter is, when not granted, the holder's remaining TTL;
	// negative when unknown.
	RetryAfter time.Duration
	// BackendData is opaque data handed back to Renew and Release.
	BackendData []byte
}

// Executor is what a LockClient runs its backend's IO on: one per backend
// (RedisExecutor, SQLiteExecutor, PostgresExecutor, EtcdExecutor,
// MemoryExecutor), made by its New…Executor constructor or by NewExecutor
// from a URL. The backends' executors carry their protocol in the core and
// the LockClient only runs the requests the core writes; their methods
// below are never called. An Executor of your own implements the methods
// for the core's commands instead. Methods are
// called from their own goroutines, concurrently, with a ctx that carries
// the request timeout; a returned error is a transport error for the core
// (the request may or may not have taken effect). Implementations must be
// safe for concurrent use. Tokens are 32 lowercase hex characters and a
// retried request carries the same token, so operations must be idempotent
// per token.
type Executor interface {
	// Acquire takes the lock name for token with the given TTL, or reports
	// who holds it. Acquiring again with the same token refreshes the TTL
	// and returns the same fencing token.
	Acquire(ctx context.Context, name, token string, ttl time.Duration) (AcquireReply, error)
	// Renew extends the lock if token still owns it: false means rejected.
	Renew(ctx context.Context, name, token string, ttl time.Duration, backendData []byte) (bool, error)
	// Release frees the lock if token owns it (and publishes a release
	// notification): false means token was not the owner.
	Release(ctx context.Context, name, token string, backendData []byte) (bool, error)
	// Watch tells the transport that the LockClient waits for name: until the
	// returned unwatch function is called, notify is called (from any
	// goroutine, possibly concurrently) when a release makes another
	// attempt worthwhile. Spurious notifications are harmless;
	// missed ones cost a waiter the holder's remaining TTL, so a transport
	// that may have missed messages (for example after a reconnect) should
	// notify.
	Watch(ctx context.Context, name string, notify func(name string)) (unwatch func(), err error)
}

// WaiterWatcher can be implemented by an Executor that wakes one waiting
// client per release: the LockClient then watches with
// WatchWaiter instead of Watch. wake returns false when no waiter of the
// LockClient takes the wake-up (its last waiter for name won or gave up, and
// unwatch is not called yet); the transport should then pass the wake-up
// on to another waiting client, else that client sleeps for the holder's
// remaining TTL. Otherwise WatchWaiter is Watch.
type WaiterWatcher interface {
	WatchWaiter(ctx context.Context, name string, wake func(name string) bool) (unwatch func(), err error)
}

// PollingExecutor can be implemented by an Executor that cannot deliver
// release notifications: when Notifications reports false the core polls
// with capped backoff instead of sleeping for the holder's remaining TTL,
// and Watch is never called.
type PollingExecutor interface {
	Notifications() bool
}
