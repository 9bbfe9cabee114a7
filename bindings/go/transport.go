package leasehold

import (
	"context"
	"errors"
	"time"
)

// ErrBackendReply marks an error reply of the lock service itself, as
// opposed to a network failure, for a Transport to return. Both are
// transport errors for the core, never a grant; the Client logs the former
// at warning level. (With a RedisTransport the core reads Redis's replies
// itself and counts error replies in Client.RedisCounters.)
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

// Transport executes the core's commands against a lock service (except
// RedisTransport: with it the core speaks Redis and the Client runs its
// requests; its Transport methods are never called). Methods are
// called from their own goroutines, concurrently, with a ctx that carries
// the request timeout; a returned error is a transport error for the core
// (the request may or may not have taken effect). Implementations must be
// safe for concurrent use. Tokens are 32 lowercase hex characters and a
// retried request carries the same token, so operations must be idempotent
// per token.
type Transport interface {
	// Acquire takes the lock name for token with the given TTL, or reports
	// who holds it. Acquiring again with the same token refreshes the TTL
	// and returns the same fencing token.
	Acquire(ctx context.Context, name, token string, ttl time.Duration) (AcquireReply, error)
	// Renew extends the lock if token still owns it: false means rejected.
	Renew(ctx context.Context, name, token string, ttl time.Duration, backendData []byte) (bool, error)
	// Release frees the lock if token owns it (and publishes a release
	// notification): false means token was not the owner.
	Release(ctx context.Context, name, token string, backendData []byte) (bool, error)
	// Watch tells the transport that the Client waits for name: until the
	// returned unwatch function is called, notify is called (from any
	// goroutine, possibly concurrently) when a release makes another
	// attempt worthwhile. Spurious notifications are harmless;
	// missed ones cost a waiter the holder's remaining TTL, so a transport
	// that may have missed messages (for example after a reconnect) should
	// notify.
	Watch(ctx context.Context, name string, notify func(name string)) (unwatch func(), err error)
}

// WaiterWatcher can be implemented by a Transport that wakes one waiting
// client per release: the Client then watches with
// WatchWaiter instead of Watch. wake returns false when no waiter of the
// Client takes the wake-up (its last waiter for name won or gave up, and
// unwatch is not called yet); the transport should then pass the wake-up
// on to another waiting client, else that client sleeps for the holder's
// remaining TTL. Otherwise WatchWaiter is Watch.
type WaiterWatcher interface {
	WatchWaiter(ctx context.Context, name string, wake func(name string) bool) (unwatch func(), err error)
}

// PollingTransport can be implemented by a Transport that cannot deliver
// release notifications: when Notifications reports false the core polls
// with capped backoff instead of sleeping for the holder's remaining TTL,
// and Watch is never called.
type PollingTransport interface {
	Notifications() bool
}
