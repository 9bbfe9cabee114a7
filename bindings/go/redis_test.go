package leasehold

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func newRedis(t testing.TB) *redis.Client {
	t.Helper()
	addr := needRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func newRedisClient(t testing.TB, opts *Options) (*Client, *RedisTransport) {
	t.Helper()
	tr, err := NewRedisTransport(newRedis(t))
	if err != nil {
		t.Fatal(err)
	}
	c := newTestClient(t, tr, opts)
	t.Cleanup(func() { _ = tr.Close() })
	return c, tr
}

// uniq returns a lock name no other test (or earlier run) uses.
func uniq(t testing.TB, base string) string {
	return fmt.Sprintf("%s-%s-%d", base, t.Name(), time.Now().UnixNano())
}

func TestRedisKeysAndScriptsComeFromTheLibrary(t *testing.T) {
	lock, fence, ch, err := RedisKeys("orders")
	if err != nil {
		t.Fatal(err)
	}
	if lock != "lh:{orders}" || fence != "lh:{orders}:fence" || ch != "lh:{orders}:released" {
		t.Fatalf("keys %q %q %q", lock, fence, ch)
	}
	long := strings.Repeat("n", 512)
	if l, _, _, err := RedisKeys(long); err != nil || l != "lh:{"+long+"}" {
		t.Fatalf("long name key: %v", err)
	}
	if w, err := redisKey(redisKeyWaiters, "orders"); err != nil || w != "lh:{orders}:waiters" {
		t.Fatalf("waiters key %q %v", w, err)
	}
	for _, k := range []uint32{redisScriptAcquire, redisScriptRenew, redisScriptRelease, redisScriptNotify} {
		s, err := redisScript(k)
		if err != nil || !strings.Contains(s, "redis.call") {
			t.Fatalf("script %d: %v %q", k, err, s)
		}
	}
	if _, err := redisScript(99); err == nil {
		t.Fatal("unknown script kind accepted")
	}
	if _, _, _, err := RedisKeys(""); err == nil {
		t.Fatal("empty name accepted")
	}
	var random [wakeRandomLen]byte
	for i := range random {
		random[i] = byte(i * 17)
	}
	if w, err := redisWakeChannel(random); err != nil || w != "lh:wake:00112233445566778899aabbccddeeff" {
		t.Fatalf("wake channel %q %v", w, err)
	}
}

func TestRedisTransportProtocol(t *testing.T) {
	rdb := newRedis(t)
	tr, err := NewRedisTransport(rdb)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	name := uniq(t, "proto")
	a, b := strings.Repeat("a", 32), strings.Repeat("b", 32)
	// No script cached: Run must fall back to EVAL.
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	ra, err := tr.Acquire(ctx, name, a, 5*time.Second)
	if err != nil || !ra.Granted || ra.FencingToken == 0 || ra.TTL != 5*time.Second {
		t.Fatalf("first acquire: %+v %v", ra, err)
	}
	rb, err := tr.Acquire(ctx, name, b, 5*time.Second)
	if err != nil || rb.Granted || rb.RetryAfter <= 0 {
		t.Fatalf("contending acquire: %+v %v", rb, err)
	}
	ra2, err := tr.Acquire(ctx, name, a, 5*time.Second)
	if err != nil || !ra2.Granted || ra2.FencingToken != ra.FencingToken {
		t.Fatalf("idempotent acquire: %+v %v", ra2, err)
	}
	if ok, err := tr.Renew(ctx, name, a, 5*time.Second, nil); err != nil || !ok {
		t.Fatalf("owner renew: %v %v", ok, err)
	}
	if ok, err := tr.Renew(ctx, name, b, 5*time.Second, nil); err != nil || ok {
		t.Fatalf("foreign renew: %v %v", ok, err)
	}
	if ok, err := tr.Release(ctx, name, b, nil); err != nil || ok {
		t.Fatalf("foreign release: %v %v", ok, err)
	}
	if ok, err := tr.Release(ctx, name, a, nil); err != nil || !ok {
		t.Fatalf("owner release: %v %v", ok, err)
	}
	if ok, err := tr.Renew(ctx, name, a, 5*time.Second, nil); err != nil || ok {
		t.Fatalf("renew after release must not re-create the lock: %v %v", ok, err)
	}
	rb2, err := tr.Acquire(ctx, name, b, 5*time.Second)
	if err != nil || !rb2.Granted || rb2.FencingToken <= ra.FencingToken {
		t.Fatalf("next grant: %+v %v (previous token %d)", rb2, err, ra.FencingToken)
	}
	// Garbage in the keyspace is an error, never a grant.
	bad := uniq(t, "garbage")
	lock, _, _, _ := RedisKeys(bad)
	if err := rdb.Set(ctx, lock, "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if r, err := tr.Acquire(ctx, bad, a, time.Second); !errors.Is(err, ErrBackendReply) || !strings.Contains(err.Error(), "lh:") {
		t.Fatalf("acquire over garbage: %+v %v", r, err)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestRedisGarbageIsATransportErrorForTheClient(t *testing.T) {
	var logs syncBuffer
	c, _ := newRedisClient(t, &Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	rdb := newRedis(t)
	name := uniq(t, "garbage")
	lock, _, _, _ := RedisKeys(name)
	if err := rdb.Set(context.Background(), lock, "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := c.Acquire(context.Background(), name, AcquireOptions{TTL: time.Second, Wait: 200 * time.Millisecond})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("acquire over garbage: %v", err)
	}
	if !strings.Contains(logs.String(), "backend error reply") {
		t.Fatalf("the script error was not logged as a warning: %q", logs.String())
	}
}

// waitersKey is the queue of wake channels of name.
func waitersKey(t testing.TB, name string) string {
	t.Helper()
	k, err := redisKey(redisKeyWaiters, name)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// queue returns the wake channels queued for name, oldest first.
func queue(rdb *redis.Client, name string) []string {
	k, _ := redisKey(redisKeyWaiters, name)
	q, _ := rdb.ZRange(context.Background(), k, 0, -1).Result()
	return q
}

func numSub(rdb *redis.Client, ch string) int64 {
	m, _ := rdb.PubSubNumSub(context.Background(), ch).Result()
	return m[ch]
}

// acquireAsync runs c.Acquire on its own goroutine.
func acquireAsync(ctx context.Context, c *Client, name string, opts AcquireOptions) <-chan acqResult {
	ch := make(chan acqResult, 1)
	go func() {
		l, err := c.Acquire(ctx, name, opts)
		ch <- acqResult{l, err}
	}()
	return ch
}

// awaitLease waits for an acquireAsync; the bound is a hang guard.
func awaitLease(t testing.TB, ch <-chan acqResult, what string) *Lease {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.lease
	case <-time.After(time.Minute):
		t.Fatalf("%s: not acquired", what)
		return nil
	}
}

// parked reports whether c's waiter is past its quick attempts: from now on
// it sleeps for the holder's remaining TTL unless it is woken.
func parked(c *Client) bool {
	k, err := c.Counters()
	return err == nil && k.AcquiresSent >= 3
}

func TestRedisReleaseNotificationWakesWaiter(t *testing.T) {
	a, _ := newRedisClient(t, nil)
	b, trb := newRedisClient(t, nil)
	ctx := context.Background()
	name := uniq(t, "notify")
	la, err := a.Acquire(ctx, name, AcquireOptions{TTL: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Without the wake-up the waiter would sleep for the holder's remaining
	// TTL (a minute) and miss this bound.
	got := acquireAsync(ctx, b, name, AcquireOptions{TTL: time.Second, Wait: 20 * time.Second})
	rdb := newRedis(t)
	waitFor(t, "the waiter queued and parked", func() bool {
		q := queue(rdb, name)
		return len(q) == 1 && q[0] == trb.wake && parked(b)
	})
	// Waiting does not subscribe the release channel any more.
	if _, _, ch, _ := RedisKeys(name); numSub(rdb, ch) != 0 {
		t.Fatalf("%d subscribers of %s", numSub(rdb, ch), ch)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb := awaitLease(t, got, "waiter")
	if n := trb.stats.wakes.Load(); n != 1 {
		t.Fatalf("%d wake-ups, want 1", n)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestRedisResubscribesAfterConnectionLoss(t *testing.T) {
	a, _ := newRedisClient(t, nil)
	b, trb := newRedisClient(t, nil)
	rdb := newRedis(t)
	ctx := context.Background()
	name := uniq(t, "resub")
	la, err := a.Acquire(ctx, name, AcquireOptions{TTL: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := b.Acquire(ctx, name, AcquireOptions{TTL: time.Second, Wait: 30 * time.Second})
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	waitFor(t, "the waiter queued and parked", func() bool {
		return numSub(rdb, trb.wake) == 1 && len(queue(rdb, name)) == 1 && parked(b)
	})
	rechecks := trb.stats.rechecks.Load()
	if err := rdb.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	// The resubscription re-checks the waiting name (a release may have
	// gone unheard meanwhile).
	waitFor(t, "resubscription", func() bool {
		return numSub(rdb, trb.wake) == 1 && trb.stats.rechecks.Load() > rechecks
	})
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter after resubscription: %v", err)
	}
}

// TestRedisReleaseWakesOneWaiterAtATime: N clients wait for one name; each
// release wakes exactly one of them (the oldest queued), the others make no
// attempt meanwhile, and every waiter gets the lock in turn.
func TestRedisReleaseWakesOneWaiterAtATime(t *testing.T) {
	const n = 5
	holder, _ := newRedisClient(t, nil)
	rdb := newRedis(t)
	ctx := context.Background()
	name := uniq(t, "one")
	first, err := holder.Acquire(ctx, name, AcquireOptions{TTL: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	type waiter struct {
		c  *Client
		tr *RedisTransport
	}
	ws := make([]waiter, n)
	byWake := map[string]int{}
	type win struct {
		i int
		l *Lease
	}
	won := make(chan win, n)
	errc := make(chan error, n)
	for i := range ws {
		c, tr := newRedisClient(t, nil)
		ws[i] = waiter{c, tr}
		byWake[tr.wake] = i
		go func() {
			l, err := c.Acquire(ctx, name, AcquireOptions{TTL: time.Minute, Wait: 5 * time.Minute})
			if err != nil {
				errc <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			won <- win{i, l}
		}()
	}
	waitFor(t, "every waiter queued and parked", func() bool {
		for _, w := range ws {
			if !parked(w.c) {
				return false
			}
		}
		return len(queue(rdb, name)) == n
	})
	order := queue(rdb, name)
	if _, _, ch, _ := RedisKeys(name); numSub(rdb, ch) != 0 {
		t.Fatalf("waiters subscribe the release channel (%d)", numSub(rdb, ch))
	}
	served := map[int]bool{}
	prev, release := first.FencingToken(), first.Release
	for turn, wake := range order {
		want := byWake[wake]
		before := make([]uint64, n)
		for i, w := range ws {
			k, _ := w.c.Counters()
			before[i] = k.AcquiresSent
		}
		if err := release(ctx); err != nil {
			t.Fatal(err)
		}
		var got win
		select {
		case got = <-won:
		case err := <-errc:
			t.Fatal(err)
		case <-time.After(time.Minute): // hang guard: unwoken, the waiters sleep 5 minutes
			t.Fatalf("turn %d: nobody woken", turn)
		}
		if got.i != want {
			t.Fatalf("turn %d: waiter %d got the lock, the oldest queued was %d", turn, got.i, want)
		}
		served[got.i] = true
		for i, w := range ws {
			wakes := w.tr.stats.wakes.Load()
			if (served[i] && wakes != 1) || (!served[i] && wakes != 0) {
				t.Fatalf("turn %d: waiter %d (served %v) had %d wake-ups", turn, i, served[i], wakes)
			}
			if k, _ := w.c.Counters(); !served[i] && k.AcquiresSent != before[i] {
				t.Fatalf("turn %d: parked waiter %d made %d attempts", turn, i, k.AcquiresSent-before[i])
			}
		}
		if got.l.FencingToken() <= prev {
			t.Fatalf("turn %d: token %d not above %d", turn, got.l.FencingToken(), prev)
		}
		prev, release = got.l.FencingToken(), got.l.Release
	}
	if err := release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "an empty queue", func() bool { return len(queue(rdb, name)) == 0 })
}

// TestRedisDeadQueuedWaiterIsSkipped: the oldest queued waiter's transport
// is closed (its wake channel has no subscriber); the release wakes the next.
func TestRedisDeadQueuedWaiterIsSkipped(t *testing.T) {
	holder, _ := newRedisClient(t, nil)
	a, tra := newRedisClient(t, nil)
	b, trb := newRedisClient(t, nil)
	rdb := newRedis(t)
	ctx := context.Background()
	name := uniq(t, "dead")
	lh, err := holder.Acquire(ctx, name, AcquireOptions{TTL: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	aerr := make(chan error, 1)
	go func() {
		_, err := a.Acquire(actx, name, AcquireOptions{TTL: time.Minute, Wait: 5 * time.Minute})
		aerr <- err
	}()
	waitFor(t, "a queued", func() bool { return len(queue(rdb, name)) == 1 && parked(a) })
	got := acquireAsync(ctx, b, name, AcquireOptions{TTL: time.Minute, Wait: 5 * time.Minute})
	waitFor(t, "b queued behind a", func() bool {
		q := queue(rdb, name)
		return len(q) == 2 && q[0] == tra.wake && q[1] == trb.wake && parked(b)
	})
	if err := tra.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a's wake channel unsubscribed", func() bool { return numSub(rdb, tra.wake) == 0 })
	if err := lh.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb := awaitLease(t, got, "b") // unwoken, b would sleep 5 minutes
	if n := trb.stats.wakes.Load(); n != 1 {
		t.Fatalf("b had %d wake-ups", n)
	}
	if slices.Contains(queue(rdb, name), tra.wake) {
		t.Fatal("the dead entry is still queued")
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-aerr; !errors.Is(err, context.Canceled) {
		t.Fatalf("a: %v", err)
	}
}

// TestRedisStaleWakeIsPassedOn: a transport that is queued for a name it no
// longer waits for (an entry left behind, put there by hand) passes the
// wake-up on to the real waiter with NOTIFY.
func TestRedisStaleWakeIsPassedOn(t *testing.T) {
	holder, _ := newRedisClient(t, nil)
	w, trw := newRedisClient(t, nil)
	rdb := newRedis(t)
	ctx := context.Background()
	name := uniq(t, "stale")
	stale, err := NewRedisTransport(newRedis(t))
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Close()
	// The stale transport listens on its wake channel (it waits for another name).
	unwatch, err := stale.Watch(ctx, uniq(t, "other"), func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	defer unwatch()
	lh, err := holder.Acquire(ctx, name, AcquireOptions{TTL: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got := acquireAsync(ctx, w, name, AcquireOptions{TTL: time.Minute, Wait: 5 * time.Minute})
	waitFor(t, "the waiter queued, the stale transport subscribed", func() bool {
		return len(queue(rdb, name)) == 1 && parked(w) && numSub(rdb, stale.wake) == 1
	})
	// Score 0: older than any real registration, so the release pops it first.
	if err := rdb.ZAdd(ctx, waitersKey(t, name), redis.Z{Score: 0, Member: stale.wake}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := lh.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lw := awaitLease(t, got, "waiter") // unwoken, it would sleep 5 minutes
	if p, k := stale.stats.passOns.Load(), stale.stats.wakes.Load(); p != 1 || k != 0 {
		t.Fatalf("stale transport: %d pass-ons, %d wake-ups", p, k)
	}
	if n := trw.stats.wakes.Load(); n != 1 {
		t.Fatalf("waiter: %d wake-ups", n)
	}
	if err := lw.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRedisWakeDeclinedByClientIsPassedOn: a client whose core no longer
// waits for a name, while its transport still has its watch registered (the
// window before the watcher unwatches, held open here by registering the
// client's wake func by hand), declines the wake-up, and the transport
// passes it on to the real waiter behind it.
func TestRedisWakeDeclinedByClientIsPassedOn(t *testing.T) {
	holder, _ := newRedisClient(t, nil)
	a, tra := newRedisClient(t, nil)
	b, trb := newRedisClient(t, nil)
	rdb := newRedis(t)
	ctx := context.Background()
	name := uniq(t, "declined")
	unwatch, err := tra.WatchWaiter(ctx, name, a.c.wake)
	if err != nil {
		t.Fatal(err)
	}
	defer unwatch()
	lh, err := holder.Acquire(ctx, name, AcquireOptions{TTL: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got := acquireAsync(ctx, b, name, AcquireOptions{TTL: time.Minute, Wait: time.Minute})
	waitFor(t, "b queued and parked, a's wake channel subscribed", func() bool {
		q := queue(rdb, name)
		return len(q) == 1 && q[0] == trb.wake && parked(b) && numSub(rdb, tra.wake) == 1
	})
	// Score 0: a's entry is popped first.
	if err := rdb.ZAdd(ctx, waitersKey(t, name), redis.Z{Score: 0, Member: tra.wake}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := lh.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Unwoken, b waits out its whole Wait (the holder's TTL is longer).
	var lb *Lease
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("b: %v", r.err)
		}
		lb = r.lease
	case <-time.After(15 * time.Second):
		t.Fatal("b was not woken: the declined wake-up was lost")
	}
	if p, k := tra.stats.passOns.Load(), tra.stats.wakes.Load(); p != 1 || k != 0 {
		t.Fatalf("a's transport: %d pass-ons, %d wake-ups", p, k)
	}
	if n := trb.stats.wakes.Load(); n != 1 {
		t.Fatalf("b: %d wake-ups", n)
	}
	if k, _ := a.Counters(); k.AcquiresSent != 0 {
		t.Fatalf("a made %d attempts", k.AcquiresSent)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRedisWaitersKeyOfWrongType: a contended, queueing acquire over a
// waiters key that is not a zset is a transport error (never a grant), and
// the holder's release still works.
func TestRedisWaitersKeyOfWrongType(t *testing.T) {
	var logs syncBuffer
	holder, _ := newRedisClient(t, nil)
	c, _ := newRedisClient(t, &Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	rdb := newRedis(t)
	ctx := context.Background()
	name := uniq(t, "wrongtype")
	wk := waitersKey(t, name)
	lock, _, _, _ := RedisKeys(name)
	if err := rdb.Set(ctx, wk, "not a zset", 0).Err(); err != nil {
		t.Fatal(err)
	}
	lh, err := holder.Acquire(ctx, name, AcquireOptions{TTL: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Acquire(ctx, name, AcquireOptions{TTL: time.Second, Wait: 3 * time.Second})
	if !errors.Is(err, ErrNotAcquired) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("contended acquire: %v", err)
	}
	if !strings.Contains(logs.String(), "lh: waiters key") {
		t.Fatalf("the waiters key error was not logged: %q", logs.String())
	}
	if tok, _ := rdb.HGet(ctx, lock, "token").Result(); tok == "" {
		t.Fatal("the holder lost the lock")
	}
	if err := lh.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := rdb.Exists(ctx, lock).Result(); err != nil || n != 0 {
		t.Fatalf("lock key after release: %d %v", n, err)
	}
	if v, err := rdb.Get(ctx, wk).Result(); err != nil || v != "not a zset" {
		t.Fatalf("waiters key after release: %q %v", v, err)
	}
}

func TestRedisContentionBetweenGoroutines(t *testing.T) {
	a, _ := newRedisClient(t, nil)
	b, _ := newRedisClient(t, nil)
	clients := []*Client{a, b}
	names := []string{uniq(t, "g0"), uniq(t, "g1")}
	var inside [2]atomic.Int32
	var mu sync.Mutex
	last := map[string]uint64{}
	const workers, iters = 16, 8
	var wg sync.WaitGroup
	errc := make(chan error, workers*iters*2)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < iters; i++ {
				k := (w + i) % 2
				l, err := clients[w%2].Acquire(context.Background(), names[k], AcquireOptions{TTL: 10 * time.Second, Wait: time.Minute})
				if err != nil {
					errc <- err
					return
				}
				if n := inside[k].Add(1); n != 1 {
					errc <- fmt.Errorf("%d holders of %s", n, names[k])
				}
				mu.Lock()
				if l.FencingToken() <= last[names[k]] {
					errc <- fmt.Errorf("token %d not above %d", l.FencingToken(), last[names[k]])
				}
				last[names[k]] = l.FencingToken()
				mu.Unlock()
				time.Sleep(100 * time.Microsecond)
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
}

type workerProc struct {
	cmd    *exec.Cmd
	out    *bufio.Reader
	stdin  io.WriteCloser
	stderr *strings.Builder
	wait   func() error
}

// startWorker re-executes the test binary as a worker process.
func startWorker(t *testing.T, mode, id, db string, names []string, iters int) *workerProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(),
		"LEASEHOLD_TEST_WORKER="+mode, "LH_REDIS="+needRedis(t), "LH_DB="+db,
		"LH_NAMES="+strings.Join(names, ","), "LH_ITERS="+strconv.Itoa(iters), "LH_ID="+id)
	return startProc(t, cmd, id)
}

// startProc starts cmd with piped stdin/stdout and captured stderr; the test's cleanup kills
// it (resuming it first, in case a test left it stopped) if it is still running.
func startProc(t *testing.T, cmd *exec.Cmd, id string) *workerProc {
	t.Helper()
	stderr := &strings.Builder{}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	wait := func() error {
		_ = stdin.Close()
		if err := cmd.Wait(); err != nil {
			return fmt.Errorf("worker %s: %w; stderr: %s", id, err, stderr.String())
		}
		return nil
	}
	return &workerProc{cmd: cmd, out: bufio.NewReader(out), stdin: stdin, stderr: stderr, wait: wait}
}

func TestRedisContentionBetweenProcesses(t *testing.T) {
	needRedis(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "resource.db")
	names := []string{uniq(t, "p0"), uniq(t, "p1")}
	db, _, err := setupDB(ctx, path, names)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const procs, iters = 3, 12
	var waits []func() error
	for i := 0; i < procs; i++ {
		w := startWorker(t, "contend", fmt.Sprintf("go-%d", i), path, names, iters)
		waits = append(waits, w.wait)
		go func() { _, _ = io.Copy(io.Discard, w.out) }()
	}
	for _, w := range waits {
		if err := w(); err != nil {
			t.Fatal(err)
		}
	}
	per, err := checkDB(ctx, db, names, procs*iters)
	if err != nil {
		t.Fatal(err)
	}
	if per["go"] != procs*iters {
		t.Fatalf("entries per worker kind: %v", per)
	}
}

func TestRedisPausedHolderStaleWriteRejectedByGate(t *testing.T) {
	rdb := newRedis(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "resource.db")
	name := uniq(t, "paused")
	db, g, err := setupDB(ctx, path, []string{name})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	w := startWorker(t, "paused", "stale", path, []string{name}, 0)
	cmd, r, wait := w.cmd, w.out, w.wait
	line, err := r.ReadString('\n')
	if err != nil {
		_ = wait()
		t.Fatalf("worker: %v", err)
	}
	var t1 uint64
	if _, err := fmt.Sscanf(line, "ACQUIRED %d", &t1); err != nil {
		t.Fatalf("worker said %q", line)
	}
	// Pause the holder (a GC pause, a VM migration) past its TTL.
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	lock, _, _, _ := RedisKeys(name)
	waitFor(t, "the paused holder's key to expire", func() bool {
		n, err := rdb.Exists(ctx, lock).Result()
		return err == nil && n == 0
	})
	c, _ := newRedisClient(t, nil)
	l, err := c.Acquire(ctx, name, AcquireOptions{TTL: 10 * time.Second, Wait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t2 := l.FencingToken()
	if t2 <= t1 {
		t.Fatalf("new token %d not above the paused holder's %d", t2, t1)
	}
	if err := criticalSection(ctx, g, name, t2, "fresh"); err != nil {
		t.Fatal(err)
	}
	// Resume the stale holder and let it write.
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := w.stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	verdict, _ := r.ReadString('\n')
	lost, _ := r.ReadString('\n')
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(verdict) != "STALE" {
		t.Fatalf("the stale holder's write was not refused: %q", verdict)
	}
	if strings.TrimSpace(lost) != "LOST true" {
		t.Fatalf("the stale holder did not see its loss: %q", lost)
	}
	hwm, err := g.HighWaterMark(ctx, name)
	if err != nil || hwm != t2 {
		t.Fatalf("high-water mark %d (%v), want %d", hwm, err, t2)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM log WHERE token = ?", int64(t1)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("stale entries in the log: %d (%v)", n, err)
	}
	_ = l.Release(ctx)
}

// TestRedisReleaseAfterPauseEndsLost: a holder process stopped (SIGSTOP)
// past its lease's validity releases as soon as it is resumed, racing its
// own driver's expiry check: Release reports the loss, the lease's Context
// is cancelled with it and Lost is closed, whichever ran first.
func TestRedisReleaseAfterPauseEndsLost(t *testing.T) {
	rdb := newRedis(t)
	ctx := context.Background()
	name := uniq(t, "pause-release")
	const rounds = 4
	w := startWorker(t, "pause-release", "paused", filepath.Join(t.TempDir(), "unused.db"), []string{name}, rounds)
	lock, _, _, _ := RedisKeys(name)
	for i := 0; i < rounds; i++ {
		line, err := w.out.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "ACQUIRED") {
			t.Fatalf("round %d: worker said %q (%v); stderr: %s", i, line, err, w.stderr.String())
		}
		if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		// The server-side expiry comes after the lease's validity.
		waitFor(t, "the paused holder's key to expire", func() bool {
			n, err := rdb.Exists(ctx, lock).Result()
			return err == nil && n == 0
		})
		// Queued before the resume: the release and the expiry check race.
		if _, err := w.stdin.Write([]byte("release\n")); err != nil {
			t.Fatal(err)
		}
		if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		verdict, err := w.out.ReadString('\n')
		if err != nil {
			t.Fatalf("round %d: %v; stderr: %s", i, err, w.stderr.String())
		}
		if !strings.HasPrefix(verdict, "RELEASE true true true ") {
			t.Fatalf("round %d: want Release to report the loss, the Context cancelled by it and Lost closed: %q", i, verdict)
		}
	}
	if err := w.wait(); err != nil {
		t.Fatal(err)
	}
}

// TestRedisLossDetectedWhenServerStopsAnswering stops a private
// redis-server (SIGSTOP) right after a grant: the lease's context must be
// cancelled before the server-side expiry, bounded from below by reading
// the key's PTTL just before the stop.
func TestRedisLossDetectedWhenServerStopsAnswering(t *testing.T) {
	needRedis(t)
	addr, stop, err := startRedis()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	tr, err := NewRedisTransport(rdb)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	check := redis.NewClient(&redis.Options{Addr: addr})
	defer check.Close()
	pid, err := redisPid(addr)
	if err != nil {
		t.Fatal(err)
	}
	// A wide drift margin keeps the check independent of scheduling noise.
	c := newTestClient(t, tr, &Options{DriftFixed: 300 * time.Millisecond})
	ctx := context.Background()
	l, err := c.Acquire(ctx, "stopped", AcquireOptions{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lock, _, _, _ := RedisKeys("stopped")
	before := time.Now()
	pttl, err := check.PTTL(ctx, lock).Result()
	if err != nil || pttl <= 0 {
		t.Fatalf("PTTL %v %v", pttl, err)
	}
	expiresNoEarlierThan := before.Add(pttl)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(pid, syscall.SIGCONT) }()
	var lostAt time.Time
	select {
	case <-l.Context().Done():
		lostAt = time.Now()
	case <-time.After(30 * time.Second):
		t.Fatal("loss never detected")
	}
	if !errors.Is(l.Err(), ErrLost) {
		t.Fatalf("cause %v", l.Err())
	}
	if k, _ := c.Counters(); k.RenewalsOK != 0 {
		t.Fatalf("a renewal got through before the stop (%d); the bound does not apply", k.RenewalsOK)
	}
	if !lostAt.Before(expiresNoEarlierThan) {
		t.Fatalf("loss signalled at %v, not before the server-side expiry (no earlier than %v)", lostAt, expiresNoEarlierThan)
	}
}

// redisPid asks the server for its process id.
func redisPid(addr string) (int, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	info, err := rdb.Info(context.Background(), "server").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, fmt.Errorf("no process_id in INFO server")
}
