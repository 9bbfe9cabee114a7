package leasehold

// What the backends' executors share: the SQL executors' host facts and row lists, and
// the FIFO a connection's goroutine runs its requests from.

import (
	"context"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// hostFacts are the facts an SQL executor binds that do not change while it runs.
type hostFacts struct {
	bootID, host string
}

func readHostFacts() hostFacts {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	h, _ := os.Hostname()
	return hostFacts{bootID: strings.TrimSpace(string(b)), host: h}
}

// monotonicNs is CLOCK_MONOTONIC itself (not Go's process-relative clock): SQLite
// expiries written by one process are read by the others of the host.
func monotonicNs() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}

// factValues are the host facts of one request, read once when it starts.
type factValues struct {
	mono, wall, pid int64
	hostFacts
}

func (h hostFacts) now() factValues {
	return factValues{mono: monotonicNs(), wall: time.Now().UnixMicro(), pid: int64(os.Getpid()), hostFacts: h}
}

// bind turns a parameter into the Go value the driver binds (nil for NULL).
func (f factValues) bind(p sqlParam) any {
	switch p.kind {
	case valueInt:
		return p.integer
	case valueText:
		return string(p.bytes)
	case valueBulk:
		return p.bytes
	case paramMonotonicNs:
		return f.mono
	case paramWallUs:
		return f.wall
	case paramBootID:
		return f.bootID
	case paramPid:
		return f.pid
	case paramHostName:
		return f.host
	}
	return nil
}

// rowsBuilder builds the flat value list of an SQL answer (lh_io_reply): an array per
// statement, of rows, of columns.
type rowsBuilder struct {
	vals []lhValue
	data []byte
}

func (b *rowsBuilder) array() int {
	b.vals = append(b.vals, newValue(valueArray, 0, 0, 0))
	return len(b.vals) - 1
}

func (b *rowsBuilder) setLen(at, n int) {
	b.vals[at] = newValue(valueArray, 0, 0, n)
}

// column appends one column value; kinds the protocol never reads become NULL.
func (b *rowsBuilder) column(v any) {
	str := func(kind uint32, s []byte) {
		b.vals = append(b.vals, newValue(kind, 0, len(b.data), len(s)))
		b.data = append(b.data, s...)
	}
	switch x := v.(type) {
	case int64:
		b.vals = append(b.vals, newValue(valueInt, x, 0, 0))
	case int32:
		b.vals = append(b.vals, newValue(valueInt, int64(x), 0, 0))
	case int16:
		b.vals = append(b.vals, newValue(valueInt, int64(x), 0, 0))
	case bool:
		var i int64
		if x {
			i = 1
		}
		b.vals = append(b.vals, newValue(valueInt, i, 0, 0))
	case float64:
		b.vals = append(b.vals, newValue(valueFloat, int64(math.Float64bits(x)), 0, 0))
	case string:
		str(valueText, []byte(x))
	case []byte:
		str(valueBulk, x)
	default:
		b.vals = append(b.vals, newValue(valueNil, 0, 0, 0))
	}
}

// missedTurn fails a request that never got its connection within its timeout (it did not
// run), unless stop closed (the client is closing: it is left unanswered).
func missedTurn(c *client, q *ioRequest, stop <-chan struct{}) {
	select {
	case <-stop:
		return
	default:
	}
	c.input(func(now uint64) error {
		return c.core.ioFailed(now, q.id, failTransport, "the connection stayed busy past the request timeout")
	})
}

// takeTurn waits for turn (a channel of capacity 1 that the holder of a connection fills)
// until ctx ends or stop closes; false when it did not get it.
func takeTurn(ctx context.Context, turn chan struct{}, stop <-chan struct{}) bool {
	select {
	case turn <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	case <-stop:
		return false
	}
}

// reqQueue is a FIFO of requests for one connection, run by one goroutine.
type reqQueue[T any] struct {
	mu    sync.Mutex
	items []T
	kick  chan struct{}
}

func newReqQueue[T any]() *reqQueue[T] { return &reqQueue[T]{kick: make(chan struct{}, 1)} }

func (q *reqQueue[T]) push(v T) {
	q.mu.Lock()
	q.items = append(q.items, v)
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

func (q *reqQueue[T]) pop() (T, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var zero T
	if len(q.items) == 0 {
		return zero, false
	}
	v := q.items[0]
	q.items = q.items[1:]
	return v, true
}

// failMessage is a driver's error text for lh_io_failed (which cuts it to its bound).
func failMessage(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
