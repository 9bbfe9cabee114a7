package leasehold

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func newTestClient(t testing.TB, tr Transport, opts *Options) *Client {
	t.Helper()
	c, err := NewClient(tr, opts)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// waitFor polls cond until it holds; it fails the test after a generous
// bound (a liveness failure, not a timing assertion).
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestABIVersion(t *testing.T) {
	if abiErr != nil {
		t.Fatal(abiErr)
	}
	if Version == "" {
		t.Fatal("empty library version")
	}
}

func TestAcquireRelease(t *testing.T) {
	tr := NewMemoryTransport()
	c := newTestClient(t, tr, nil)
	ctx := context.Background()
	l, err := c.Acquire(ctx, "orders", AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if l.FencingToken() == 0 {
		t.Fatal("zero fencing token")
	}
	if !l.IsHeld() {
		t.Fatal("fresh lease not held")
	}
	if !l.ValidUntil().After(time.Now()) {
		t.Fatalf("ValidUntil %v not in the future", l.ValidUntil())
	}
	if l.Err() != nil || l.Context().Err() != nil {
		t.Fatalf("lease context done while held: %v", l.Err())
	}
	if _, fence, ok := tr.Server().Holder("orders"); !ok || fence != l.FencingToken() {
		t.Fatalf("server holder fence %d ok=%v, lease token %d", fence, ok, l.FencingToken())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if l.IsHeld() {
		t.Fatal("released lease still held")
	}
	if !errors.Is(context.Cause(l.Context()), ErrReleased) || !errors.Is(l.Err(), ErrReleased) {
		t.Fatalf("context cause after release = %v", context.Cause(l.Context()))
	}
	if _, _, ok := tr.Server().Holder("orders"); ok {
		t.Fatal("server still has a holder after a confirmed Release")
	}
	select {
	case <-l.Lost():
		t.Fatal("Lost closed by Release")
	default:
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	// A second grant gets a strictly larger token.
	l2, err := c.Acquire(ctx, "orders", AcquireOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if l2.FencingToken() <= l.FencingToken() {
		t.Fatalf("token %d not above %d", l2.FencingToken(), l.FencingToken())
	}
	_ = l2.Release(ctx)
}

func TestRenewalAcrossTTLs(t *testing.T) {
	for _, ttl := range []time.Duration{200 * time.Millisecond, 350 * time.Millisecond, 700 * time.Millisecond, 1500 * time.Millisecond} {
		t.Run(ttl.String(), func(t *testing.T) {
			t.Parallel()
			tr := NewMemoryTransport()
			c := newTestClient(t, tr, nil)
			l, err := c.Acquire(context.Background(), "renew", AcquireOptions{TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			first := l.ValidUntil()
			// Without renewals the server would drop the lock after one TTL.
			time.Sleep(3 * ttl)
			waitFor(t, "three renewals", func() bool {
				k, _ := c.Counters()
				return k.RenewalsOK >= 3
			})
			if err := l.Err(); err != nil {
				t.Fatalf("lease lost: %v", err)
			}
			if !l.IsHeld() {
				t.Fatal("lease not held after renewals")
			}
			if _, fence, ok := tr.Server().Holder("renew"); !ok || fence != l.FencingToken() {
				t.Fatalf("server lost the lock (ok=%v fence=%d)", ok, fence)
			}
			if !l.ValidUntil().After(first) {
				t.Fatalf("ValidUntil did not move: %v then %v", first, l.ValidUntil())
			}
			if err := l.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestLossDetectedBeforeServerExpiryWhenBackendHangs(t *testing.T) {
	for _, fault := range []Fault{FaultHang, FaultPartition, FaultDrop} {
		t.Run(fmt.Sprint(fault), func(t *testing.T) {
			t.Parallel()
			srv := NewMemoryServer()
			tr := srv.Transport()
			// A wide drift margin keeps the safety check independent of
			// scheduler noise on a loaded machine.
			c := newTestClient(t, tr, &Options{DriftFixed: 150 * time.Millisecond, RequestTimeout: time.Second})
			ttl := 900 * time.Millisecond
			l, err := c.Acquire(context.Background(), "hang", AcquireOptions{TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			tr.SetFault(fault)
			var lostAt time.Time
			select {
			case <-l.Context().Done():
				lostAt = time.Now()
			case <-time.After(30 * time.Second):
				t.Fatal("loss never detected")
			}
			_, _, stillThere := srv.Holder("hang")
			expiry := srv.expiry("hang")
			if !errors.Is(l.Err(), ErrLost) {
				t.Fatalf("cause = %v, want ErrLost", l.Err())
			}
			var le *LostError
			if !errors.As(l.Err(), &le) || le.Name != "hang" {
				t.Fatalf("cause %v is not a *LostError for hang", l.Err())
			}
			select {
			case <-l.Lost():
			default:
				t.Fatal("Lost() not closed")
			}
			if l.IsHeld() {
				t.Fatal("lost lease reported held")
			}
			// The server still considered us the holder when we gave up.
			if !stillThere || !lostAt.Before(expiry) {
				t.Fatalf("loss observed at %v, server expiry %v (holder present: %v)", lostAt, expiry, stillThere)
			}
			tr.SetFault(FaultNone)
			// The lost lease's best-effort cleanup release (and a renewal polled
			// just before the loss) may still reach the transport: let the
			// cleanup finish, then count releases only.
			waitFor(t, "the cleanup", func() bool { k, _ := c.Counters(); return k.PendingCleanups == 0 })
			releases := tr.ReleaseCalls()
			err = l.Release(context.Background())
			var re *LostError
			if !errors.As(err, &re) || re != le {
				t.Fatalf("Release after loss: %v, want the loss %v", err, le)
			}
			if tr.ReleaseCalls() != releases {
				t.Fatal("Release after loss sent a release")
			}
		})
	}
}

func TestRejectedRenewalLosesLease(t *testing.T) {
	tr := NewMemoryTransport()
	c := newTestClient(t, tr, nil)
	l, err := c.Acquire(context.Background(), "rej", AcquireOptions{TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Someone else took the lock server-side (e.g. after an expiry).
	tr.Server().Expire("rej")
	other, err := newTestClient(t, tr.Server().Transport(), nil).Acquire(context.Background(), "rej", AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatalf("other acquire: %v", err)
	}
	select {
	case <-l.Lost():
	case <-time.After(30 * time.Second):
		t.Fatal("rejection not detected")
	}
	var le *LostError
	if !errors.As(l.Err(), &le) || !strings.Contains(le.Reason, "reject") {
		t.Fatalf("cause %v, want a rejection", l.Err())
	}
	if err := l.Release(context.Background()); !errors.Is(err, ErrLost) {
		t.Fatalf("Release of a rejected lease: %v", err)
	}
	if _, fence, ok := tr.Server().Holder("rej"); !ok || fence != other.FencingToken() {
		t.Fatalf("our release removed the other holder (held %t, fence %d, the other's %d)", ok, fence, other.FencingToken())
	}
}

func TestBoundedWait(t *testing.T) {
	tr := NewMemoryTransport()
	a := newTestClient(t, tr, nil)
	b := newTestClient(t, tr.Server().Transport(), nil)
	ctx := context.Background()
	la, err := a.Acquire(ctx, "busy", AcquireOptions{TTL: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// One attempt.
	if _, err := b.Acquire(ctx, "busy", AcquireOptions{TTL: time.Second}); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("try-acquire of a held lock: %v", err)
	}
	// A bounded wait gives up well before the holder's TTL runs out.
	start := time.Now()
	_, err = b.Acquire(ctx, "busy", AcquireOptions{TTL: time.Second, Wait: 200 * time.Millisecond})
	var ae *AcquireError
	if !errors.As(err, &ae) || !errors.Is(err, ErrNotAcquired) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("bounded wait: %v", err)
	}
	if time.Since(start) >= 20*time.Second {
		t.Fatal("bounded wait outlived the holder's TTL")
	}
	// The ctx deadline bounds the wait as well.
	dctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
	defer cancel()
	if _, err := b.Acquire(dctx, "busy", AcquireOptions{TTL: time.Second, Wait: time.Hour}); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("ctx deadline: %v", err)
	}
	// A waiter gets the lock when the holder releases.
	got := make(chan *Lease, 1)
	go func() {
		l, err := b.Acquire(ctx, "busy", AcquireOptions{TTL: time.Second, Wait: time.Minute})
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		got <- l
	}()
	time.Sleep(50 * time.Millisecond)
	_ = la.Release(ctx)
	lb := <-got
	if lb == nil || lb.FencingToken() <= la.FencingToken() {
		t.Fatalf("waiter lease %v", lb)
	}
	_ = lb.Release(ctx)
	waitFor(t, "unwatch", func() bool { return tr.Server().Watchers("busy") == 0 })
}

func TestUnavailableBackend(t *testing.T) {
	tr := NewMemoryTransport()
	tr.SetFault(FaultDrop)
	c := newTestClient(t, tr, nil)
	_, err := c.Acquire(context.Background(), "down", AcquireOptions{TTL: time.Second, Wait: 300 * time.Millisecond})
	if !errors.Is(err, ErrNotAcquired) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("acquire on a dead backend: %v", err)
	}
}

func TestCtxCancelWhileWaiting(t *testing.T) {
	tr := NewMemoryTransport()
	a := newTestClient(t, tr, nil)
	b := newTestClient(t, tr.Server().Transport(), nil)
	bg := context.Background()
	la, err := a.Acquire(bg, "cancel", AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	errc := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, "cancel", AcquireOptions{TTL: time.Second, Wait: time.Hour})
		errc <- err
	}()
	waitFor(t, "waiter watching", func() bool { return tr.Server().Watchers("cancel") > 0 })
	cancel()
	err = <-errc
	if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("cancelled acquire: %v", err)
	}
	waitFor(t, "cancelled waiter to stop watching", func() bool { return tr.Server().Watchers("cancel") == 0 })
	_ = la.Release(bg)
	// Nobody holds it: the cancelled waiter did not take it behind our back.
	time.Sleep(50 * time.Millisecond)
	if _, _, ok := tr.Server().Holder("cancel"); ok {
		t.Fatal("cancelled waiter holds the lock")
	}
	k, _ := b.Counters()
	if k.LiveLeases != 0 {
		t.Fatalf("cancelled waiter left %d live leases", k.LiveLeases)
	}
	// An already-cancelled ctx fails at once.
	if _, err := b.Acquire(ctx, "cancel", AcquireOptions{TTL: time.Second}); !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire with a done ctx: %v", err)
	}
}

func TestConcurrentAcquireRelease(t *testing.T) {
	srv := NewMemoryServer()
	clients := []*Client{newTestClient(t, srv.Transport(), nil), newTestClient(t, srv.Transport(), nil)}
	names := []string{"n0", "n1", "n2"}
	var inside [3]atomic.Int32
	var mu [3]sync.Mutex
	last := [3]uint64{}
	const workers, iters = 24, 15
	var wg sync.WaitGroup
	errc := make(chan error, workers*iters)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c := clients[w%len(clients)]
			for i := 0; i < iters; i++ {
				k := (w + i) % len(names)
				l, err := c.Acquire(context.Background(), names[k], AcquireOptions{TTL: 10 * time.Second, Wait: time.Minute})
				if err != nil {
					errc <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
				if n := inside[k].Add(1); n != 1 {
					errc <- fmt.Errorf("%d holders of %s", n, names[k])
				}
				mu[k].Lock()
				if l.FencingToken() <= last[k] {
					errc <- fmt.Errorf("token %d after %d on %s", l.FencingToken(), last[k], names[k])
				}
				last[k] = l.FencingToken()
				mu[k].Unlock()
				runtime.Gosched()
				inside[k].Add(-1)
				if err := l.Release(context.Background()); err != nil {
					errc <- err
				}
			}
		}(w)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	for _, c := range clients {
		k, err := c.Counters()
		if err != nil {
			t.Fatal(err)
		}
		if k.LiveLeases != 0 {
			t.Errorf("live leases left: %+v", k)
		}
	}
}

func TestBadInputs(t *testing.T) {
	if _, err := NewClient(nil, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("nil transport: %v", err)
	}
	if _, err := NewClient(NewMemoryTransport(), &Options{RequestTimeout: -1}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("negative timeout: %v", err)
	}
	if _, err := NewClient(NewMemoryTransport(), &Options{MaxTTL: 1500 * time.Microsecond}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("sub-ms MaxTTL: %v", err)
	}
	for _, o := range []Options{{DriftPPM: 2_000_000}, {RenewJitterPPM: 2_000_000}, {MaxLeases: 1 << 31}} {
		_, err := NewClient(NewMemoryTransport(), &o)
		var se *StatusError
		if !errors.Is(err, ErrInvalidArgument) || !errors.As(err, &se) || se.Status != statusInvalidConfig {
			t.Fatalf("options %+v: %v", o, err)
		}
	}
	c := newTestClient(t, NewMemoryTransport(), &Options{MaxTTL: time.Hour})
	ok := AcquireOptions{TTL: time.Second}
	cases := []struct {
		name   string
		lock   string
		opts   AcquireOptions
		status uint32 // expected C status, 0 when checked in Go
	}{
		{"empty name", "", ok, statusEmptyName},
		{"NUL in name", "a\x00b", ok, statusNameHasNul},
		{"name too long", strings.Repeat("x", 513), ok, statusNameTooLong},
		{"invalid UTF-8", "bad\xff\xfe", ok, statusInvalidUTF8},
		{"zero TTL", "n", AcquireOptions{}, 0},
		{"negative TTL", "n", AcquireOptions{TTL: -time.Second}, 0},
		{"sub-millisecond TTL", "n", AcquireOptions{TTL: 1500 * time.Microsecond}, 0},
		{"TTL above MaxTTL", "n", AcquireOptions{TTL: 2 * time.Hour}, statusInvalidTTL},
		{"negative wait", "n", AcquireOptions{TTL: time.Second, Wait: -1}, 0},
	}
	for _, tc := range cases {
		_, err := c.Acquire(context.Background(), tc.lock, tc.opts)
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", tc.name, err)
			continue
		}
		if tc.status != 0 {
			var se *StatusError
			if !errors.As(err, &se) || se.Status != tc.status {
				t.Errorf("%s: err = %#v, want status %d", tc.name, err, tc.status)
			} else if se.Name == "" || !strings.HasPrefix(se.Name, "LH_") {
				t.Errorf("%s: status name %q", tc.name, se.Name)
			}
		}
	}
	// A maximal name is fine.
	l, err := c.Acquire(context.Background(), strings.Repeat("x", 512), ok)
	if err != nil {
		t.Fatalf("512-byte name: %v", err)
	}
	_ = l.Release(context.Background())
	var nilCtx context.Context // a nil context is a bad input too
	if _, err := c.Acquire(nilCtx, "n", ok); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("nil ctx: %v", err)
	}
	// Nothing leaked from the refused calls.
	k, _ := c.Counters()
	if k.LiveLeases != 0 {
		t.Fatalf("refused calls left %d live leases", k.LiveLeases)
	}
}

func TestCloseReleasesAndIsIdempotent(t *testing.T) {
	tr := NewMemoryTransport()
	c, err := NewClient(tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	other := newTestClient(t, tr.Server().Transport(), nil)
	ctx := context.Background()
	l, err := c.Acquire(ctx, "close", AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// A goroutine of the closing client waits for a lock someone else holds.
	lo, err := other.Acquire(ctx, "close2", AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, "close2", AcquireOptions{TTL: time.Second, Wait: time.Hour})
		errc <- err
	}()
	waitFor(t, "waiter", func() bool { return tr.Server().Watchers("close2") > 0 })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("waiter during Close: %v", err)
	}
	if !errors.Is(context.Cause(l.Context()), ErrClosed) {
		t.Fatalf("lease context after Close: %v", context.Cause(l.Context()))
	}
	if _, _, ok := tr.Server().Holder("close"); ok {
		t.Fatal("Close did not release the lock")
	}
	if l.IsHeld() {
		t.Fatal("lease held after Close")
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release after Close: %v", err)
	}
	if _, err := c.Acquire(ctx, "close", AcquireOptions{TTL: time.Second}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Acquire after Close: %v", err)
	}
	if _, err := c.Counters(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Counters after Close: %v", err)
	}
	_ = lo.Release(ctx)
}

func TestForgottenClientIsCleanedUp(t *testing.T) {
	tr := NewMemoryTransport()
	before := handlesFreed.Load()
	func() {
		c, err := NewClient(tr, nil)
		if err != nil {
			t.Fatal(err)
		}
		l, err := c.Acquire(context.Background(), "forgotten", AcquireOptions{TTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		_ = l.Release(context.Background())
	}()
	deadline := time.Now().Add(20 * time.Second)
	for handlesFreed.Load() == before {
		if time.Now().After(deadline) {
			t.Fatal("the cleanup never freed the forgotten client's handle")
		}
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
}

func TestForgottenClientWithHeldLeaseIsCleanedUpAndReleases(t *testing.T) {
	tr := NewMemoryTransport()
	before := handlesFreed.Load()
	func() {
		c, err := NewClient(tr, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Acquire(context.Background(), "dropped", AcquireOptions{TTL: 30 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for handlesFreed.Load() == before {
		if time.Now().After(deadline) {
			t.Fatal("a forgotten client holding a forgotten lease was never cleaned up")
		}
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
	if _, _, ok := tr.Server().Holder("dropped"); ok {
		t.Fatal("the cleanup did not release the forgotten lease")
	}
}

func TestLeaseKeepsClientAlive(t *testing.T) {
	tr := NewMemoryTransport()
	var l *Lease
	func() {
		c, err := NewClient(tr, nil)
		if err != nil {
			t.Fatal(err)
		}
		l, err = c.Acquire(context.Background(), "alive", AcquireOptions{TTL: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
	}()
	for i := 0; i < 5; i++ {
		runtime.GC()
		time.Sleep(100 * time.Millisecond)
	}
	if !l.IsHeld() || l.Err() != nil {
		t.Fatalf("a reachable lease lost its client: %v", l.Err())
	}
	_ = l.Release(context.Background())
	_ = l.owner.Close()
}

func TestReentrant(t *testing.T) {
	tr := NewMemoryTransport()
	c := newTestClient(t, tr, nil)
	ctx := context.Background()
	opts := AcquireOptions{TTL: 5 * time.Second, Reentrant: true}
	l1, err := c.Acquire(ctx, "re", opts)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := c.Acquire(ctx, "re", opts)
	if err != nil {
		t.Fatal(err)
	}
	if l1.FencingToken() != l2.FencingToken() {
		t.Fatalf("reentrant tokens differ: %d %d", l1.FencingToken(), l2.FencingToken())
	}
	// A non-reentrant acquire by the same client contends.
	if _, err := c.Acquire(ctx, "re", AcquireOptions{TTL: time.Second}); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("non-reentrant acquire of a held name: %v", err)
	}
	_ = l1.Release(ctx)
	if !l2.IsHeld() || l1.IsHeld() {
		t.Fatalf("after one release: l1 held=%v l2 held=%v", l1.IsHeld(), l2.IsHeld())
	}
	if _, _, ok := tr.Server().Holder("re"); !ok {
		t.Fatal("lock released while a holder remains")
	}
	_ = l2.Release(ctx)
	if _, _, ok := tr.Server().Holder("re"); ok {
		t.Fatal("lock still held after the last release")
	}
}

func TestReentrantLossReachesAllHolders(t *testing.T) {
	tr := NewMemoryTransport()
	c := newTestClient(t, tr, nil)
	opts := AcquireOptions{TTL: 300 * time.Millisecond, Reentrant: true}
	l1, err := c.Acquire(context.Background(), "rl", opts)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := c.Acquire(context.Background(), "rl", opts)
	if err != nil {
		t.Fatal(err)
	}
	tr.SetFault(FaultReject)
	for _, l := range []*Lease{l1, l2} {
		select {
		case <-l.Context().Done():
		case <-time.After(30 * time.Second):
			t.Fatal("loss not signalled to every holder")
		}
		if !errors.Is(l.Err(), ErrLost) {
			t.Fatalf("cause %v", l.Err())
		}
	}
}

func TestPoisonedCoreFailsEverything(t *testing.T) {
	tr := NewMemoryTransport()
	c := newTestClient(t, tr, nil)
	l, err := c.Acquire(context.Background(), "p", AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c.c.input(func(uint64) error { return c.c.core.debugPanic() })
	select {
	case <-l.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("panic in the core did not end the lease")
	}
	if _, err := c.Acquire(context.Background(), "q", AcquireOptions{TTL: time.Second}); !errors.Is(err, ErrBroken) {
		t.Fatalf("Acquire on a poisoned core: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestStatusErrorDetail(t *testing.T) {
	c := newTestClient(t, NewMemoryTransport(), nil)
	_, err := c.Acquire(context.Background(), "", AcquireOptions{TTL: time.Second})
	var se *StatusError
	if !errors.As(err, &se) {
		t.Fatalf("%T %v", err, err)
	}
	if se.Op != "lh_acquire" || se.Name != "LH_ERR_EMPTY_NAME" || !strings.Contains(err.Error(), "LH_ERR_EMPTY_NAME") {
		t.Fatalf("status error %+v", se)
	}
}

// An executor whose IO panics (a driver's bug) fails the request in transport: the
// client neither crashes nor grants, and works again once the IO does.
func TestExecutorPanicIsATransportError(t *testing.T) {
	tr := NewMemoryTransport()
	var boom atomic.Bool
	boom.Store(true)
	tr.beforeCall = func() {
		if boom.Load() {
			panic("boom")
		}
	}
	c := newTestClient(t, tr, nil)
	_, err := c.Acquire(context.Background(), "x", AcquireOptions{TTL: time.Second, Wait: 100 * time.Millisecond})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("acquire through a panicking executor: %v", err)
	}
	if k, _ := c.Counters(); k.BackendTransportFailures == 0 {
		t.Fatalf("no transport failure counted: %+v", k)
	}
	boom.Store(false)
	l, err := c.Acquire(context.Background(), "x", AcquireOptions{TTL: time.Second})
	if err != nil {
		t.Fatalf("acquire once the executor works: %v", err)
	}
	_ = l.Release(context.Background())
}

// TestPollingWithoutNotifications: a waiter with notifications off polls, so it finds a
// lock freed without a notification (the grant dropped on the service) long before the
// holder's TTL, which a sleeping waiter would wait out.
func TestPollingWithoutNotifications(t *testing.T) {
	tr := NewMemoryTransport()
	a := newTestClient(t, tr, nil)
	b := newTestClient(t, tr.Server().Transport(), &Options{DisableNotifications: true, BackoffCap: 50 * time.Millisecond})
	ctx := context.Background()
	la, err := a.Acquire(ctx, "poll", AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := b.Acquire(ctx, "poll", AcquireOptions{TTL: time.Second, Wait: 20 * time.Second})
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(100 * time.Millisecond)
	tr.Server().Expire("poll") // no notification
	if err := <-got; err != nil {
		t.Fatalf("polling waiter: %v", err)
	}
	_ = la.Release(ctx)
}

func TestCloseWhileBusy(t *testing.T) {
	srv := NewMemoryServer()
	c, err := NewClient(srv.Transport(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var acquired atomic.Int64
	errc := make(chan error, 64)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; ; i++ {
				l, err := c.Acquire(context.Background(), fmt.Sprintf("busy-%d", i%3), AcquireOptions{TTL: time.Second, Wait: time.Second})
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil && !errors.Is(err, ErrNotAcquired) {
					errc <- err
					return
				}
				if l != nil {
					acquired.Add(1)
					_ = l.IsHeld()
					_ = l.ValidUntil()
					if err := l.Release(context.Background()); err != nil {
						errc <- err
						return
					}
				}
			}
		}(g)
	}
	waitFor(t, "some grants", func() bool { return acquired.Load() > 50 })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	for _, n := range []string{"busy-0", "busy-1", "busy-2"} {
		if _, _, ok := srv.Holder(n); ok {
			t.Errorf("%s still held after Close", n)
		}
	}
}

func TestCloseStopsItsGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	tr := NewMemoryTransport()
	c, err := NewClient(tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	holder := newTestClient(t, tr.Server().Transport(), nil)
	hl, err := holder.Acquire(context.Background(), "g", AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		l, err := c.Acquire(context.Background(), fmt.Sprintf("g%d", i), AcquireOptions{TTL: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(context.Background())
	}
	go func() {
		_, _ = c.Acquire(context.Background(), "g", AcquireOptions{TTL: time.Second, Wait: time.Minute})
	}()
	waitFor(t, "a waiter", func() bool { return tr.Server().Watchers("g") > 0 })
	time.Sleep(200 * time.Millisecond) // let renewals run
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	_ = hl.Release(context.Background())
	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the clients' goroutines to exit", func() bool { return runtime.NumGoroutine() <= before })
}

// pause makes the client's clock jump by d without its driver running, as
// when the process was stopped (SIGSTOP, a long GC pause, a suspended VM).
func pause(c *Client, d time.Duration) { c.c.skew.Add(int64(d)) }

// tick feeds the core a timeout now, as the driver does when its timer fires.
func tick(c *Client) { c.c.input(func(now uint64) error { return c.c.core.timeout(now) }) }

func TestAcquireDeadlineShorterThanWaitIsDeadlineExceeded(t *testing.T) {
	tr := NewMemoryTransport()
	holder := newTestClient(t, tr, nil)
	b := newTestClient(t, tr.Server().Transport(), nil)
	down := tr.Server().Transport()
	down.SetFault(FaultDrop)
	c := newTestClient(t, down, nil)
	hl, err := holder.Acquire(context.Background(), "dl", AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Release(context.Background())
	// The core's wait budget (cut to the deadline) and ctx's timer end
	// together: whichever is seen first, the error is the same.
	for i := 0; i < 100; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(2+i%5)*time.Millisecond)
		_, err := b.Acquire(ctx, "dl", AcquireOptions{TTL: time.Second, Wait: time.Hour})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrNotAcquired) {
			t.Fatalf("run %d, lock held: %v", i, err)
		}
	}
	for i := 0; i < 20; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		_, err := c.Acquire(ctx, "down", AcquireOptions{TTL: time.Second, Wait: time.Hour})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrNotAcquired) {
			t.Fatalf("run %d, backend down: %v", i, err)
		}
	}
	// A Wait shorter than the deadline still ends as the wait running out.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = b.Acquire(ctx, "dl", AcquireOptions{TTL: time.Second, Wait: 20 * time.Millisecond})
	if !errors.Is(err, ErrNotAcquired) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait shorter than the deadline: %v", err)
	}
	if k, _ := b.Counters(); k.LiveLeases != 0 {
		t.Fatalf("%d live leases left", k.LiveLeases)
	}
}

func TestReleaseAfterPauseEndsLost(t *testing.T) {
	for _, noAuto := range []bool{false, true} {
		t.Run(fmt.Sprint("NoAutoRenew=", noAuto), func(t *testing.T) {
			tr := NewMemoryTransport()
			c := newTestClient(t, tr, nil)
			l, err := c.Acquire(context.Background(), "paused", AcquireOptions{TTL: 30 * time.Second, NoAutoRenew: noAuto})
			if err != nil {
				t.Fatal(err)
			}
			// Stopped past the validity; on waking the release is processed
			// before the driver saw the expiry.
			pause(c, 31*time.Second)
			err = l.Release(context.Background())
			var le *LostError
			if !errors.Is(err, ErrLost) || !errors.As(err, &le) || le.Reason != reasonString(reasonExpired) {
				t.Fatalf("Release after the pause: %v, want a loss (expired)", err)
			}
			expectLossSignalled(t, l, le)
			if l.Err() != error(le) || l.IsHeld() {
				t.Fatalf("Err %v, held %v", l.Err(), l.IsHeld())
			}
			if again := l.Release(context.Background()); again != err {
				t.Fatalf("second Release: %v, first %v", again, err)
			}
			k, _ := c.Counters()
			if k.ReleasesLost != 1 || k.LostExpired != 1 || k.ReleasesConfirmed+k.ReleasesNotOwner+k.ReleasesUnconfirmed != 0 {
				t.Fatalf("counters %+v", k)
			}
		})
	}
}

func TestRenewExtendsValidity(t *testing.T) {
	for _, noAuto := range []bool{false, true} {
		t.Run(fmt.Sprint("NoAutoRenew=", noAuto), func(t *testing.T) {
			tr := NewMemoryTransport()
			c := newTestClient(t, tr, nil)
			ctx := context.Background()
			l, err := c.Acquire(ctx, "renew", AcquireOptions{TTL: 30 * time.Second, NoAutoRenew: noAuto})
			if err != nil {
				t.Fatal(err)
			}
			v0 := l.ValidUntil()
			c.c.mu.Lock()
			v0ns := l.rec.validUntil
			c.c.mu.Unlock()
			expiry0 := tr.Server().expiry("renew")
			pause(c, 5*time.Second)
			v1, err := l.Renew(ctx)
			if err != nil {
				t.Fatalf("Renew: %v", err)
			}
			if !v1.After(v0) {
				t.Fatalf("Renew returned %v, not after %v", v1, v0)
			}
			// Counted from the send, 5 s later on the core's clock.
			c.c.mu.Lock()
			moved := time.Duration(l.rec.validUntil - v0ns)
			c.c.mu.Unlock()
			if moved < 5*time.Second {
				t.Fatalf("validity moved by %v, want at least 5s", moved)
			}
			if !l.ValidUntil().Equal(v1) {
				t.Fatalf("ValidUntil %v, Renew returned %v", l.ValidUntil(), v1)
			}
			if !tr.Server().expiry("renew").After(expiry0) {
				t.Fatal("the service's expiry did not move")
			}
			k, _ := c.Counters()
			if k.RenewalsRequested != 1 || k.RenewalsOK != 1 {
				t.Fatalf("counters %+v", k)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestNoAutoRenewLostAtValidityEndUnlessRenewed(t *testing.T) {
	tr := NewMemoryTransport()
	c := newTestClient(t, tr, nil)
	ctx := context.Background()
	l, err := c.Acquire(ctx, "manual", AcquireOptions{TTL: 30 * time.Second, NoAutoRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	// Past the automatic cadence (TTL/3): nothing is sent.
	pause(c, 20*time.Second)
	tick(c)
	if k, _ := c.Counters(); k.RenewalsSent != 0 {
		t.Fatalf("%d automatic renewals", k.RenewalsSent)
	}
	if _, err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	// Past the first validity: the renewal carried it.
	pause(c, 15*time.Second)
	tick(c)
	if l.Err() != nil || !l.IsHeld() {
		t.Fatalf("renewed lease lost at its first validity: %v", l.Err())
	}
	// Past the renewed validity: lost, with its signals.
	pause(c, 20*time.Second)
	tick(c)
	select {
	case <-l.Context().Done():
	default:
		t.Fatal("Context not cancelled at the end of the validity")
	}
	var le *LostError
	if !errors.As(context.Cause(l.Context()), &le) || le.Reason != reasonString(reasonExpired) {
		t.Fatalf("cause %v", context.Cause(l.Context()))
	}
	if k, _ := c.Counters(); k.RenewalsSent != 1 {
		t.Fatalf("%d renewals sent, want only the manual one", k.RenewalsSent)
	}
	// On a real clock, too: no renewal, lost when the validity ends.
	l2, err := c.Acquire(ctx, "manual-real", AcquireOptions{TTL: 300 * time.Millisecond, NoAutoRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l2.Lost():
	case <-time.After(30 * time.Second):
		t.Fatal("a lease without automatic renewal was never lost")
	}
	if !errors.Is(l2.Err(), ErrLost) {
		t.Fatalf("cause %v", l2.Err())
	}
	if k, _ := c.Counters(); k.RenewalsSent != 1 {
		t.Fatalf("%d renewals sent, want only the manual one", k.RenewalsSent)
	}
}

func TestRenewAfterReleaseOrLossFailsFast(t *testing.T) {
	tr := NewMemoryTransport()
	c := newTestClient(t, tr, nil)
	ctx := context.Background()

	released, err := c.Acquire(ctx, "r1", AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := released.Release(ctx); err != nil {
		t.Fatal(err)
	}
	calls := tr.Calls()
	if _, err := released.Renew(ctx); !errors.Is(err, ErrReleased) {
		t.Fatalf("Renew after Release: %v", err)
	}
	if n := tr.Calls(); n != calls {
		t.Fatalf("Renew of a released lease made %d requests", n-calls)
	}

	lost, err := c.Acquire(ctx, "r2", AcquireOptions{TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	tr.SetFault(FaultReject)
	<-lost.Lost()
	// Let the lost lease's best-effort cleanup release finish first.
	waitFor(t, "the cleanup", func() bool { k, _ := c.Counters(); return k.PendingCleanups == 0 })
	tr.SetFault(FaultNone)
	calls = tr.Calls()
	if _, err := lost.Renew(ctx); !errors.Is(err, ErrLost) {
		t.Fatalf("Renew after loss: %v", err)
	}
	if n := tr.Calls(); n != calls {
		t.Fatalf("Renew of an ended lease made %d requests", n-calls)
	}

	// A lease whose validity ran out (a pause) is lost by Renew, which
	// sends no renewal.
	paused, err := c.Acquire(ctx, "r3", AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	k0, _ := c.Counters()
	pause(c, time.Minute)
	if _, err := paused.Renew(ctx); !errors.Is(err, ErrLost) {
		t.Fatalf("Renew after a pause: %v", err)
	}
	if !errors.Is(paused.Err(), ErrLost) {
		t.Fatalf("cause %v", paused.Err())
	}
	if k, _ := c.Counters(); k.RenewalsSent != k0.RenewalsSent {
		t.Fatal("Renew after the validity ran out sent a renewal")
	}

	closing, err := c.Acquire(ctx, "r4", AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	if _, err := closing.Renew(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Renew after Close: %v", err)
	}
	var nilCtx context.Context
	if _, err := closing.Renew(nilCtx); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Renew(nil): %v", err)
	}
}

func TestReleaseOutcomes(t *testing.T) {
	tr := NewMemoryTransport()
	srv := tr.Server()
	c := newTestClient(t, tr, nil)
	ctx := context.Background()

	clean, err := c.Acquire(ctx, "clean", AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := clean.Release(ctx); err != nil {
		t.Fatalf("clean Release: %v", err)
	}

	// The grant expired on the service and someone else took the lock:
	// the service refuses our release.
	stolen, err := c.Acquire(ctx, "stolen", AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv.Expire("stolen")
	thief, err := newTestClient(t, srv.Transport(), nil).Acquire(ctx, "stolen", AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatalf("other acquire: %v", err)
	}
	err = stolen.Release(ctx)
	if !errors.Is(err, ErrNotOwner) || errors.Is(err, ErrLost) {
		t.Fatalf("Release of a stolen lock: %v", err)
	}
	if again := stolen.Release(ctx); again != err {
		t.Fatalf("second Release: %v, first %v", again, err)
	}
	if _, fence, ok := srv.Holder("stolen"); !ok || fence != thief.FencingToken() {
		t.Fatalf("the other holder lost the lock (held %t, fence %d, the other's %d)", ok, fence, thief.FencingToken())
	}

	// Refused by the service's reply itself.
	refused, err := c.Acquire(ctx, "refused", AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tr.SetFault(FaultReject)
	if err := refused.Release(ctx); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("refused Release: %v", err)
	}
	tr.SetFault(FaultNone)

	// ctx bounds the wait; the release goes on and a later call gets the outcome.
	hung, err := c.Acquire(ctx, "hung", AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tr.SetFault(FaultHang)
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	err = hung.Release(short)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Release bounded by ctx: %v", err)
	}
	if hung.IsHeld() || !errors.Is(hung.Err(), ErrReleased) {
		t.Fatalf("a released lease still held: %v", hung.Err())
	}
	tr.SetFault(FaultNone)
	if err := hung.Release(ctx); err != nil {
		t.Fatalf("Release once the service answers: %v", err)
	}
	if _, _, ok := srv.Holder("hung"); ok {
		t.Fatal("the retried release did not reach the service")
	}

	// Reentrant holders: the first release leaves, the last one reports.
	opts := AcquireOptions{TTL: 30 * time.Second, Reentrant: true}
	r1, err := c.Acquire(ctx, "re", opts)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.Acquire(ctx, "re", opts)
	if err != nil {
		t.Fatal(err)
	}
	calls := tr.Calls()
	if err := r1.Release(ctx); err != nil || tr.Calls() != calls {
		t.Fatalf("first reentrant Release: %v (%d requests)", err, tr.Calls()-calls)
	}
	if err := r2.Release(ctx); err != nil {
		t.Fatalf("last reentrant Release: %v", err)
	}

	k, _ := c.Counters()
	if k.ReleasesConfirmed != 3 || k.ReleasesNotOwner != 2 || k.ReleasesLost != 0 {
		t.Fatalf("counters %+v", k)
	}
}

// TestShortOutageKeepsLease: with the time budget (the default), renewals
// failing for a while (here three of them, with the service partitioned)
// do not cost a lease whose validity remains; a count budget of three does.
func TestShortOutageKeepsLease(t *testing.T) {
	for _, budget := range []uint32{0, 3} {
		t.Run(fmt.Sprint("FailBudget=", budget), func(t *testing.T) {
			t.Parallel()
			tr := NewMemoryTransport()
			c := newTestClient(t, tr, &Options{FailBudget: budget, RequestTimeout: 100 * time.Millisecond})
			l, err := c.Acquire(context.Background(), "outage", AcquireOptions{TTL: 3 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			tr.SetFault(FaultPartition)
			waitFor(t, "three failed renewals", func() bool {
				k, _ := c.Counters()
				return k.RenewalsFailed >= 3 || l.Err() != nil
			})
			if budget == 3 {
				var le *LostError
				<-l.Lost()
				if !errors.As(l.Err(), &le) || le.Reason != reasonString(reasonFailBudget) {
					t.Fatalf("count budget: cause %v", l.Err())
				}
				return
			}
			tr.SetFault(FaultNone)
			waitFor(t, "a renewal through", func() bool {
				k, _ := c.Counters()
				return k.RenewalsOK >= 1 || l.Err() != nil
			})
			if err := l.Err(); err != nil {
				t.Fatalf("lease lost by a short outage: %v", err)
			}
			if _, fence, ok := tr.Server().Holder("outage"); !ok || fence != l.FencingToken() {
				t.Fatal("the service dropped the lock")
			}
			if err := l.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// stepClock advances the client's clock by total in steps, feeding the core
// a timeout after each and waiting until no backend call is in flight, as a
// controlled clock would. It stops early once stop reports true.
func stepClock(t *testing.T, c *Client, total, step time.Duration, stop func() bool) {
	t.Helper()
	for d := time.Duration(0); d < total; d += step {
		pause(c, step)
		tick(c)
		waitFor(t, "no backend call in flight", func() bool { return c.c.inflight.Load() == 0 })
		if stop != nil && stop() {
			return
		}
	}
}

// expectLossSignalled checks that l's loss le reached both of its signals:
// Lost() is closed and its Context's cause is le.
func expectLossSignalled(t *testing.T, l *Lease, le *LostError) {
	t.Helper()
	select {
	case <-l.Lost():
	default:
		t.Fatal("Lost() not closed")
	}
	if cause := context.Cause(l.Context()); cause != error(le) {
		t.Fatalf("context cause %v, want the loss", cause)
	}
}

// coreValidUntil is the lease's validity on the core's clock (ns).
func coreValidUntil(t *testing.T, l *Lease) uint64 {
	t.Helper()
	c := l.owner.c
	c.mu.Lock()
	defer c.mu.Unlock()
	v, err := c.core.validUntil(l.rec.id)
	if err != nil {
		t.Fatalf("validUntil: %v", err)
	}
	return v
}

// TestThirtySecondLeaseThroughAThreeSecondOutage, on a controlled clock:
// the service is unreachable (every request fails at once) for 3 s from
// just before the first renewal is due. With the time budget (the default)
// the 30 s lease keeps its lock however many retries failed; a count
// budget of 3 loses it, long before its validity would have ended.
func TestThirtySecondLeaseThroughAThreeSecondOutage(t *testing.T) {
	for _, budget := range []uint32{0, 3} {
		t.Run(fmt.Sprint("FailBudget=", budget), func(t *testing.T) {
			tr := NewMemoryTransport()
			c := newTestClient(t, tr, &Options{FailBudget: budget})
			l, err := c.Acquire(context.Background(), "outage30", AcquireOptions{TTL: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			stepClock(t, c, 9*time.Second, 100*time.Millisecond, nil)
			validUntil := coreValidUntil(t, l)
			tr.SetFault(FaultDrop)
			var lostAt uint64
			stepClock(t, c, 3*time.Second, 50*time.Millisecond, func() bool {
				if l.Err() != nil && lostAt == 0 {
					lostAt = c.c.clock()
				}
				return false
			})
			k, _ := c.Counters()
			if k.RenewalsFailed < 3 {
				t.Fatalf("%d failed renewals in the outage, want at least 3", k.RenewalsFailed)
			}
			if budget == 3 {
				var le *LostError
				if !errors.As(l.Err(), &le) || le.Reason != reasonString(reasonFailBudget) {
					t.Fatalf("count budget: cause %v", l.Err())
				}
				if lostAt == 0 || lostAt >= validUntil || k.RenewalsFailed != 3 {
					t.Fatalf("lost at %d (validity to %d) after %d failures", lostAt, validUntil, k.RenewalsFailed)
				}
				return
			}
			tr.SetFault(FaultNone)
			stepClock(t, c, 60*time.Second, 500*time.Millisecond, nil)
			if err := l.Err(); err != nil || !l.IsHeld() {
				t.Fatalf("lease lost by a 3 s outage: %v", err)
			}
			select {
			case <-l.Lost():
				t.Fatal("Lost() closed")
			default:
			}
			if _, fence, ok := tr.Server().Holder("outage30"); !ok || fence != l.FencingToken() {
				t.Fatal("the service dropped the lock")
			}
			if k, _ := c.Counters(); k.RenewalsOK < 3 || k.LostFailBudget+k.LostExpired+k.LostRejected != 0 {
				t.Fatalf("counters %+v", k)
			}
			if err := l.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestUnreachableServiceLosesTheLeaseBeforeValidityEnds, on a controlled
// clock: a 30 s lease whose service never answers again is lost (time
// budget: FailBudget) while the core's clock is still before its validity
// end, with Lost closed and its Context cancelled by the loss.
func TestUnreachableServiceLosesTheLeaseBeforeValidityEnds(t *testing.T) {
	tr := NewMemoryTransport()
	c := newTestClient(t, tr, nil)
	l, err := c.Acquire(context.Background(), "down30", AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	validUntil := coreValidUntil(t, l)
	tr.SetFault(FaultDrop)
	var lostAt uint64
	stepClock(t, c, 40*time.Second, 100*time.Millisecond, func() bool {
		if l.Err() != nil {
			lostAt = c.c.clock()
			return true
		}
		if now := c.c.clock(); now >= validUntil {
			t.Fatalf("still held at %d, past its validity (%d)", now, validUntil)
		}
		return false
	})
	if lostAt == 0 || lostAt >= validUntil {
		t.Fatalf("lost at %d, validity to %d", lostAt, validUntil)
	}
	var le *LostError
	if !errors.As(l.Err(), &le) || le.Reason != reasonString(reasonFailBudget) {
		t.Fatalf("cause %v", l.Err())
	}
	expectLossSignalled(t, l, le)
	if k, _ := c.Counters(); k.RenewalsFailed < 3 || k.LostFailBudget != 1 || k.RenewalsOK != 0 {
		t.Fatalf("counters %+v", k)
	}
	if err := l.Release(context.Background()); !errors.Is(err, ErrLost) {
		t.Fatalf("Release after the loss: %v", err)
	}
}

// Each LockClient on a MemoryTransport has a connection of its own to the server, which
// goes with the client: at Close, or when a forgotten client is collected, so
// long-lived servers do not accumulate them.
func TestMemoryConnectionsGoWithTheirClients(t *testing.T) {
	s := NewMemoryServer()
	tr := s.Transport()
	if got := s.connections(); got != 0 {
		t.Fatalf("open connections = %d before any client", got)
	}
	keep := newTestClient(t, tr, nil)
	closed, err := NewClient(tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	func() {
		for i := 0; i < 50; i++ {
			if _, err := NewClient(tr, nil); err != nil {
				t.Fatal(err)
			}
		}
	}()
	if got := s.connections(); got != 52 {
		t.Fatalf("open connections = %d, want 52", got)
	}
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.connections() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("open connections = %d after Close and GC, want 1 (the live client's)", s.connections())
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	runtime.KeepAlive(keep)
}

// TestSeamRefusesBadAnswers: on a memory-backend handle, answers of another backend's kind
// (an HTTP reply, a stream message, a subscription) are LH_ERR_WRONG_ANSWER, a malformed
// value list LH_ERR_INVALID_REPLY and unknown enums LH_ERR_INVALID_ENUM, each changing
// nothing: the request still takes its answer afterwards, and a second one is counted
// as stale.
func TestSeamRefusesBadAnswers(t *testing.T) {
	k, err := newCore(defaultCoreConfig(), backendOptions{kind: backendMemory}, make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	defer k.free()
	if _, err := newCore(defaultCoreConfig(), backendOptions{kind: 99}, make([]byte, 32)); !isStatus(err, statusInvalidEnum) {
		t.Fatalf("an unknown backend: %v", err)
	}
	if _, err := newCore(defaultCoreConfig(), backendOptions{kind: backendMemory}, make([]byte, 8)); !isStatus(err, statusSeedTooShort) {
		t.Fatalf("a short seed: %v", err)
	}
	now := monoNow()
	lease, err := k.acquire(now, "seam", 1000, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	q, err := k.ioPoll()
	if err != nil || q == nil || q.kind != ioCommand || len(q.argv) == 0 {
		t.Fatalf("the acquire's request: %+v %v", q, err)
	}
	for what, err := range map[string]error{
		"an HTTP reply":    k.ioHTTPReply(now, q.id, 200, []byte("{}")),
		"a stream message": k.ioStreamMessage(now, q.id, []byte("{}")),
		"a subscription":   k.ioConnection(now, connNotify, connSubscribed, "seam"),
	} {
		if !isStatus(err, statusWrongAnswer) {
			t.Errorf("%s on a memory handle: %v", what, err)
		}
	}
	bad := []lhValue{newValue(valueArray, 0, 0, 3)} // an array missing its elements
	if err := k.ioReply(now, q.id, bad, nil); !isStatus(err, statusInvalidReply) {
		t.Errorf("a malformed value list: %v", err)
	}
	if err := k.ioReply(now, q.id, []lhValue{newValue(99, 0, 0, 0)}, nil); !isStatus(err, statusInvalidReply) {
		t.Errorf("an unknown value kind: %v", err)
	}
	if err := k.ioFailed(now, q.id, 99, "x"); !isStatus(err, statusInvalidEnum) {
		t.Errorf("an unknown failure kind: %v", err)
	}
	if err := k.ioConnection(now, connCommands, 99, ""); !isStatus(err, statusInvalidEnum) {
		t.Errorf("an unknown connection event: %v", err)
	}
	if st, err := k.leaseState(lease); err != nil || st != stateAcquiring {
		t.Fatalf("the refused answers changed the lease: state %d, %v", st, err)
	}
	// The request is still waiting for its answer: a transport failure ends the attempt.
	if err := k.ioFailed(now, q.id, failTransport, "no answer"); err != nil {
		t.Fatal(err)
	}
	if e, err := k.pollEvent(); err != nil || e.kind != evAcquireFailed || e.lease != lease || e.reason != reasonUnavailable {
		t.Fatalf("event %+v %v", e, err)
	}
	if err := k.ioFailed(now, q.id, failTransport, "again"); err != nil {
		t.Fatalf("a second answer: %v", err)
	}
	if kc, _ := k.counters(); kc.BackendStaleReplies != 1 {
		t.Fatalf("stale replies %d, want 1", kc.BackendStaleReplies)
	}
}
