package leasehold

import (
	"context"
	"errors"
	"io"
	"reflect"
	"time"
)

// Executor is what a LockClient runs its backend's IO on: one of the package's
// executors, one per backend (RedisExecutor, SQLiteExecutor, PostgresExecutor,
// EtcdExecutor, MemoryExecutor), made by its New…Executor constructor or by
// NewExecutor from a URL. The LockClient's core speaks the backend's protocol
// (for the memory service too) and the executor only runs the requests it
// writes, verbatim, on the backend's own client, handing the answers back
// unread. Every Executor is an io.Closer; a LockClient leaves it open unless
// Open made it.
//
// Its methods are the package's own: a type of another package satisfies
// Executor only by embedding one of the executors above. The earlier method
// set (Acquire, Renew, Release, Watch) is gone with the engine commands it
// served: every backend is now a protocol in the core, driven through one
// IO seam.
type Executor interface {
	io.Closer
	// backend is the protocol the LockClient's core speaks, with its options.
	backend() backendOptions
	// start makes the executor of one LockClient: its connections and goroutines.
	start(c *client) (ioExec, error)
}

// ioExec runs the IO requests of one LockClient's core, each of the kinds its backend
// uses, and hands the answers back through the client's input.
type ioExec interface {
	// run takes one request (c.mu held, so it never blocks). It returns a job when the
	// request runs on any goroutine (the driver starts it, or hands it to a caller that
	// waits for its answer anyway), or nil when the executor queued it on a connection of
	// its own; errUnsupportedIO for a kind it has no use for.
	run(q *ioRequest) (*job, error)
	// close stops the executor's goroutines and closes its connections; called once the
	// LockClient's driver stopped and its IO context is cancelled.
	close()
}

// errUnsupportedIO answers a request of a kind the executor's backend does not use.
var errUnsupportedIO = errors.New("leasehold: the executor does not run requests of this kind")

// isNilExecutor reports a nil interface or a nil pointer inside one.
func isNilExecutor(t Executor) bool {
	if t == nil {
		return true
	}
	v := reflect.ValueOf(t)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// PollingExecutor can be implemented by an Executor that cannot deliver
// release notifications (SQLiteExecutor): when Notifications reports false
// the core polls with capped backoff instead of sleeping for the holder's
// remaining TTL.
type PollingExecutor interface {
	Notifications() bool
}

// ErrBackendReply marked an error reply of a lock service, for an Executor of
// one's own to return.
//
// Deprecated: no Executor returns it any more: the core reads every backend's
// answers itself and counts error replies in Counters.BackendErrorReplies.
var ErrBackendReply = errors.New("leasehold: backend error reply")

// AcquireReply was an Executor's answer to an acquire request.
//
// Deprecated: a LockClient no longer calls Executor methods: the core speaks
// every backend's protocol, the memory service's included.
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

// WaiterWatcher was implemented by an Executor of one's own that woke one
// waiting client per release.
//
// Deprecated: a LockClient no longer calls it: wake-ups are part of each
// backend's protocol in the core.
type WaiterWatcher interface {
	WatchWaiter(ctx context.Context, name string, wake func(name string) bool) (unwatch func(), err error)
}
