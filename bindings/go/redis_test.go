package leasehold

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	crand "crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
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
	// Acquires sent from now on are covered by the wake channel.
	subscribed(t, c)
	return c, tr
}

// uniq returns a lock name no other test (or earlier run) uses.
func uniq(t testing.TB, base string) string {
	return fmt.Sprintf("%s-%s-%d", base, t.Name(), time.Now().UnixNano())
}

// lockKey and queueKey are the protocol's keys of name (docs/redis-protocol.md);
// only tests spell them, to plant garbage and to watch the queue.
func lockKey(name string) string  { return "lh:{" + name + "}" }
func queueKey(name string) string { return "lh:{" + name + "}:queue" }

func queueLen(rdb *redis.Client, name string) int64 {
	n, _ := rdb.ZCard(context.Background(), queueKey(name)).Result()
	return n
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

func redisCounters(t testing.TB, c *Client) RedisCounters {
	t.Helper()
	k, err := c.RedisCounters()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// parked reports whether c's waiter is queued and idle: its retries are
// answered locally until it is woken.
func parked(c *Client) bool {
	k, err := c.RedisCounters()
	return err == nil && k.LocalRefusals > 0
}

// scriptCalls is how many EVALSHA and EVAL calls the server ran (INFO commandstats).
func scriptCalls(t testing.TB, rdb *redis.Client) int64 {
	t.Helper()
	stats := commandStats(t, rdb)
	return stats["evalsha"] + stats["eval"]
}

// commandStats maps each command to its calls since the last CONFIG RESETSTAT.
func commandStats(t testing.TB, rdb *redis.Client) map[string]int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out
}

// privateRedis starts a redis-server of the test's own (for tests that
// stop, restart or count commands on it) and returns a client on it.
func privateRedis(t *testing.T) (*redis.Client, string) {
	t.Helper()
	needRedis(t)
	addr, stop, err := startRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb, addr
}

func clientOn(t testing.TB, rdb redis.UniversalClient, opts *Options) *Client {
	t.Helper()
	// A long standby delay: the handoffs counted here must not race a standby.
	tr, err := NewRedisTransportWithOptions(rdb, &RedisOptions{StandbyDelay: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c := newTestClient(t, tr, opts)
	subscribed(t, c)
	return c
}

// subscribed waits until c's wake channel subscription is in effect.
func subscribed(t testing.TB, c *Client) {
	t.Helper()
	waitFor(t, "the wake channel subscribed", func() bool { return redisCounters(t, c).Subscribed })
}

// TestRedisGarbageIsAnErrorNeverAGrant: keys of the wrong type under a
// lock's names are error replies for the core (transport errors for the
// engine): the acquire fails as unavailable and the garbage is left alone.
func TestRedisGarbageIsAnErrorNeverAGrant(t *testing.T) {
	c, _ := newRedisClient(t, nil)
	rdb := newRedis(t)
	ctx := context.Background()
	plant := map[string]func(string) error{
		"string lock":     func(n string) error { return rdb.Set(ctx, lockKey(n), "x", 0).Err() },
		"list lock":       func(n string) error { return rdb.RPush(ctx, lockKey(n), "x").Err() },
		"hash, no token":  func(n string) error { return rdb.HSet(ctx, lockKey(n), "other", "1").Err() },
		"bad fence":       func(n string) error { return rdb.Set(ctx, lockKey(n)+":fence", "not a number", 0).Err() },
		"lock, no expiry": func(n string) error { return rdb.HSet(ctx, lockKey(n), "token", "t", "fence", "1").Err() },
	}
	for what, f := range plant {
		name := uniq(t, "garbage")
		if err := f(name); err != nil {
			t.Fatal(err)
		}
		before := redisCounters(t, c).ErrorReplies
		_, err := c.Acquire(ctx, name, AcquireOptions{TTL: time.Second, Wait: 200 * time.Millisecond})
		if !errors.Is(err, ErrNotAcquired) || !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%s: acquire over garbage: %v", what, err)
		}
		if redisCounters(t, c).ErrorReplies == before {
			t.Fatalf("%s: no error reply counted", what)
		}
	}
	if k, _ := c.Counters(); k.Grants != 0 {
		t.Fatalf("%d grants over garbage", k.Grants)
	}
	name := uniq(t, "garbage")
	_ = rdb.Set(ctx, lockKey(name), "x", 0).Err()
	_, _ = c.Acquire(ctx, name, AcquireOptions{TTL: time.Second})
	if v, err := rdb.Get(ctx, lockKey(name)).Result(); err != nil || v != "x" {
		t.Fatalf("garbage changed: %q %v", v, err)
	}
}

// TestRedisStatus: Client.Status on Redis runs the core's read-only status
// script: held with the holder's fence and remaining TTL, free with the last
// fence after the release, and a garbage key is the backend's error, left alone.
func TestRedisStatus(t *testing.T) {
	c, _ := newRedisClient(t, nil)
	rdb := newRedis(t)
	checkStatusCycle(t, c, rdb, uniq(t, "status"), uniq(t, "status-junk"))
}

// checkStatusCycle checks Client.Status of name never locked, held (the
// holder's fence and TTL) and released, then over a foreign list key junk on
// rdb: the backend's error, the key left as it was.
func checkStatusCycle(t *testing.T, c *Client, rdb redis.Cmdable, name, junk string) {
	t.Helper()
	ctx := context.Background()
	st, err := c.Status(ctx, name)
	if err != nil || st.Held || st.FencingToken != 0 || st.Name != name {
		t.Fatalf("%s: status of a name never locked: %+v, %v", name, st, err)
	}
	l, err := c.Acquire(ctx, name, AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	st, err = c.Status(ctx, name)
	if err != nil || !st.Held || st.FencingToken != l.FencingToken() || st.LastFencingToken != l.FencingToken() ||
		st.RemainingTTL <= 0 || st.RemainingTTL > 30*time.Second {
		t.Fatalf("%s: status while held: %+v, %v (fence %d)", name, st, err, l.FencingToken())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	st, err = c.Status(ctx, name)
	if err != nil || st.Held || st.LastFencingToken != l.FencingToken() {
		t.Fatalf("%s: status after release: %+v, %v", name, st, err)
	}
	if err := rdb.RPush(ctx, lockKey(junk), "x").Err(); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Status(ctx, junk); err == nil {
		t.Fatalf("status over a list key: %+v, want the backend's error", st)
	}
	if n, err := rdb.LLen(ctx, lockKey(junk)).Result(); err != nil || n != 1 {
		t.Fatalf("garbage changed: %d %v", n, err)
	}
}

// TestRedisQueueKeyOfWrongType: a contended acquire over a queue key that
// is not a zset is an error (never a grant); the holder's release works.
func TestRedisQueueKeyOfWrongType(t *testing.T) {
	holder, _ := newRedisClient(t, nil)
	c, _ := newRedisClient(t, nil)
	rdb := newRedis(t)
	ctx := context.Background()
	name := uniq(t, "wrongtype")
	if err := rdb.Set(ctx, queueKey(name), "not a zset", 0).Err(); err != nil {
		t.Fatal(err)
	}
	lh, err := holder.Acquire(ctx, name, AcquireOptions{TTL: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Acquire(ctx, name, AcquireOptions{TTL: time.Second, Wait: time.Second})
	if !errors.Is(err, ErrNotAcquired) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("contended acquire: %v", err)
	}
	if v, _ := rdb.Get(ctx, lockKey(name)).Result(); v == "" {
		t.Fatal("the holder lost the lock")
	}
	if err := lh.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := rdb.Exists(ctx, lockKey(name)).Result(); err != nil || n != 0 {
		t.Fatalf("lock key after release: %d %v", n, err)
	}
}

func TestRedisReleaseWakesWaiter(t *testing.T) {
	a, _ := newRedisClient(t, nil)
	b, _ := newRedisClient(t, nil)
	rdb := newRedis(t)
	ctx := context.Background()
	name := uniq(t, "notify")
	la, err := a.Acquire(ctx, name, AcquireOptions{TTL: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Without the wake-up the waiter would sleep for the holder's remaining
	// TTL (a minute) and miss the hang guard.
	got := acquireAsync(ctx, b, name, AcquireOptions{TTL: time.Second, Wait: 50 * time.Second})
	waitFor(t, "the waiter queued and parked", func() bool { return queueLen(rdb, name) == 1 && parked(b) })
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb := awaitLease(t, got, "waiter")
	if lb.FencingToken() <= la.FencingToken() {
		t.Fatalf("token %d not above %d", lb.FencingToken(), la.FencingToken())
	}
	if k := redisCounters(t, b); k.Wakeups != 1 {
		t.Fatalf("%d wake-ups, want 1", k.Wakeups)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "an empty queue", func() bool { return queueLen(rdb, name) == 0 })
}

// TestRedisPubSubConnectionKilled: CLIENT KILL TYPE pubsub under a parked
// waiter; the executor reports the subscription lost, subscribes again, the
// core re-checks, and the next release still wakes the waiter.
func TestRedisPubSubConnectionKilled(t *testing.T) {
	a, _ := newRedisClient(t, nil)
	b, _ := newRedisClient(t, nil)
	rdb := newRedis(t)
	ctx := context.Background()
	name := uniq(t, "resub")
	la, err := a.Acquire(ctx, name, AcquireOptions{TTL: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got := acquireAsync(ctx, b, name, AcquireOptions{TTL: time.Second, Wait: 50 * time.Second})
	waitFor(t, "the waiter queued and parked", func() bool { return queueLen(rdb, name) == 1 && parked(b) })
	before := redisCounters(t, b)
	if err := rdb.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	// Back, the core checks the waiting name again: a release in the gap reached nobody.
	waitFor(t, "the loss reported, the subscription back and the name checked", func() bool {
		k := redisCounters(t, b)
		return k.SubscriberLosses > before.SubscriberLosses && k.Subscriptions > before.Subscriptions &&
			k.Subscribed && k.ScriptCalls > before.ScriptCalls
	})
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Unwoken, the waiter would sleep for the holder's TTL, past the hang guard.
	lb := awaitLease(t, got, "waiter after resubscription")
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRedisHandoffCostAndIdleWaiters: N clients queue for one name on a
// server of the test's own. Parked, they send (almost) nothing; each release
// then hands the lock to exactly one of them, with at most 2 script calls
// per handoff counted by the server (INFO commandstats).
func TestRedisHandoffCostAndIdleWaiters(t *testing.T) {
	const n = 5
	rdb, _ := privateRedis(t)
	ctx := context.Background()
	holder := clientOn(t, rdb, nil)
	// Warm the server's script cache: a first EVALSHA would cost a NOSCRIPT round.
	warm, err := holder.Acquire(ctx, "warm-up", AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	name := uniq(t, "handoff")
	first, err := holder.Acquire(ctx, name, AcquireOptions{TTL: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ws := make([]*Client, n)
	type win struct {
		i int
		l *Lease
	}
	won := make(chan win, n)
	errc := make(chan error, n)
	for i := range ws {
		ws[i] = clientOn(t, rdb, nil)
		go func() {
			l, err := ws[i].Acquire(ctx, name, AcquireOptions{TTL: time.Minute, Wait: 5 * time.Minute})
			if err != nil {
				errc <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			won <- win{i, l}
		}()
	}
	waitFor(t, "every waiter queued and parked", func() bool {
		for _, w := range ws {
			if !parked(w) {
				return false
			}
		}
		return queueLen(rdb, name) == n
	})

	// Idle: the waiters' cores emit no request, the server sees no script call.
	const idle = 4 * time.Second
	requests := func() (sum uint64) {
		for _, w := range ws {
			sum += redisCounters(t, w).Requests
		}
		return sum
	}
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	renewals := func() uint64 { k, _ := holder.Counters(); return k.RenewalsSent }
	r0, h0 := requests(), renewals()
	time.Sleep(idle)
	sent := requests() - r0
	calls := scriptCalls(t, rdb) - int64(renewals()-h0)
	perWaiter := float64(sent) / float64(n) / idle.Seconds()
	t.Logf("idle waiters: %d requests from %d waiters in %v (%.3f/s each), %d script calls on the server", sent, n, idle, perWaiter, calls)
	if perWaiter > 0.1 || float64(calls)/float64(n)/idle.Seconds() > 0.1 {
		t.Fatalf("idle waiters cost %.3f requests/s each (%d script calls)", perWaiter, calls)
	}

	// Handoffs: each release wakes exactly one waiter.
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	h0 = renewals()
	served := map[int]bool{}
	prev, release := first.FencingToken(), first.Release
	for turn := 0; turn < n; turn++ {
		if err := release(ctx); err != nil {
			t.Fatal(err)
		}
		var got win
		select {
		case got = <-won:
		case err := <-errc:
			t.Fatal(err)
		case <-time.After(time.Minute): // hang guard: unwoken, the waiters sleep for minutes
			t.Fatalf("turn %d: nobody woken", turn)
		}
		if served[got.i] {
			t.Fatalf("turn %d: waiter %d served twice", turn, got.i)
		}
		served[got.i] = true
		if got.l.FencingToken() <= prev {
			t.Fatalf("turn %d: token %d not above %d", turn, got.l.FencingToken(), prev)
		}
		prev, release = got.l.FencingToken(), got.l.Release
	}
	if err := release(ctx); err != nil {
		t.Fatal(err)
	}
	var renewed uint64
	for _, w := range append(ws, holder) {
		k, _ := w.Counters()
		renewed += k.RenewalsSent
	}
	calls = scriptCalls(t, rdb) - int64(renewed-h0)
	t.Logf("%d handoffs between queued waiters: %d script calls (the last holder's release included)", n, calls)
	if calls > 2*n+1 {
		t.Fatalf("%d script calls for %d handoffs, want at most %d", calls, n, 2*n+1)
	}
	select {
	case w := <-won:
		t.Fatalf("waiter %d got the lock with nobody releasing", w.i)
	default:
	}
	waitFor(t, "an empty queue", func() bool { return queueLen(rdb, name) == 0 })
}

// TestRedisFrozenWaiterAtHeadOfQueue: a waiter process queued first is
// stopped (SIGSTOP: its subscriber socket stays open, so the release's
// wake-up counts as delivered); a live waiter queued behind it must get the
// lock within about one standby delay (150ms), not after the holder's TTL.
func TestRedisFrozenWaiterAtHeadOfQueue(t *testing.T) {
	rdb := newRedis(t)
	ctx := context.Background()
	name := uniq(t, "frozen")
	holder, _ := newRedisClient(t, nil)
	lh, err := holder.Acquire(ctx, name, AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	frozen := startWorker(t, "wait", "frozen", filepath.Join(t.TempDir(), "unused.db"), []string{name}, 0)
	if line, err := frozen.out.ReadString('\n'); err != nil || line != "READY\n" {
		t.Fatalf("worker said %q (%v); stderr: %s", line, err, frozen.stderr.String())
	}
	waitFor(t, "the worker queued at the head", func() bool { return queueLen(rdb, name) == 1 })
	if err := frozen.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	live, _ := newRedisClient(t, nil)
	got := acquireAsync(ctx, live, name, AcquireOptions{TTL: 10 * time.Second, Wait: 50 * time.Second})
	waitFor(t, "the live waiter queued behind it and parked", func() bool { return queueLen(rdb, name) == 2 && parked(live) })
	start := time.Now()
	if err := lh.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := awaitLease(t, got, "live waiter")
	delay := time.Since(start)
	fmt.Printf("frozen waiter at the head: the live waiter got the lock %v after the release\n", delay)
	// About 150ms; the holder's TTL (a minute) is what an unbounded protocol would cost.
	if delay > 3*time.Second {
		t.Fatalf("a frozen head waiter kept the lock free for %v", delay)
	}
	if k := redisCounters(t, live); k.StandbyTakeovers == 0 {
		t.Fatalf("no standby takeover: %+v", k)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRedisKilledHolderTakeover: a holder process is killed (SIGKILL)
// without releasing; the waiter at the head of the queue gets the lock once
// the holder's TTL ran out.
func TestRedisKilledHolderTakeover(t *testing.T) {
	rdb := newRedis(t)
	ctx := context.Background()
	name := uniq(t, "killed")
	w := startWorker(t, "hold", "killed", filepath.Join(t.TempDir(), "unused.db"), []string{name}, 0)
	_, _ = w.out.ReadString('\n') // READY
	line, err := w.out.ReadString('\n')
	var t1 uint64
	if _, serr := fmt.Sscanf(line, "ACQUIRED %d", &t1); err != nil || serr != nil {
		t.Fatalf("worker said %q (%v); stderr: %s", line, err, w.stderr.String())
	}
	c, _ := newRedisClient(t, nil)
	got := acquireAsync(ctx, c, name, AcquireOptions{TTL: 10 * time.Second, Wait: 50 * time.Second})
	waitFor(t, "the waiter queued and parked", func() bool { return queueLen(rdb, name) == 1 && parked(c) })
	if err := w.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = w.cmd.Wait()
	start := time.Now()
	l := awaitLease(t, got, "waiter after the holder was killed")
	fmt.Printf("killed holder (TTL 1s): the waiter got the lock %v after the kill\n", time.Since(start))
	if l.FencingToken() <= t1 {
		t.Fatalf("token %d not above the killed holder's %d", l.FencingToken(), t1)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRedisRestart: the server is killed and started again on the same port
// without persistence. The held lease is lost (its key is gone), the
// subscription comes back, the scripts are loaded again (NOSCRIPT), fences
// keep increasing, and a waiter is woken by a release after the restart.
func TestRedisRestart(t *testing.T) {
	needRedis(t)
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	start := func() func() {
		stop, err := startRedisWith(&redis.Options{Addr: addr}, "--port", strconv.Itoa(port))
		if err != nil {
			t.Fatal(err)
		}
		return stop
	}
	stop := start()
	defer func() { stop() }()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx := context.Background()
	a := clientOn(t, rdb, nil)
	b := clientOn(t, rdb, nil)
	subscribed(t, a)
	subscribed(t, b)
	l1, err := a.Acquire(ctx, "restart", AcquireOptions{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	stop()
	stop = start()
	select {
	case <-l1.Lost():
	case <-time.After(30 * time.Second):
		t.Fatal("the lease whose key vanished was not lost")
	}
	waitFor(t, "both subscriptions back", func() bool {
		ka, kb := redisCounters(t, a), redisCounters(t, b)
		return ka.Subscribed && kb.Subscribed && ka.SubscriberLosses > 0 && kb.SubscriberLosses > 0
	})
	l2, err := a.Acquire(ctx, "restart", AcquireOptions{TTL: time.Minute, Wait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if l2.FencingToken() <= l1.FencingToken() {
		t.Fatalf("fence %d after the restart not above %d", l2.FencingToken(), l1.FencingToken())
	}
	if k := redisCounters(t, a); k.NoscriptRetries == 0 {
		t.Fatal("no NOSCRIPT retry after the restart emptied the script cache")
	}
	got := acquireAsync(ctx, b, "restart", AcquireOptions{TTL: time.Second, Wait: 50 * time.Second})
	waitFor(t, "the waiter parked", func() bool { return parked(b) })
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb := awaitLease(t, got, "waiter after the restart")
	if lb.FencingToken() <= l2.FencingToken() {
		t.Fatalf("fence %d not above %d", lb.FencingToken(), l2.FencingToken())
	}
	_ = lb.Release(ctx)
}

// TestRedisConnectionOptions: the executor runs on go-redis clients made
// from *redis.Options: a unix socket with an ACL user, password and DB 3,
// and TLS; two clients hand a lock over on each (the wake-up crosses the
// pub/sub connection, which authenticates like the commands connection).
func TestRedisConnectionOptions(t *testing.T) {
	needRedis(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "redis.sock")
	unix := &redis.Options{Network: "unix", Addr: sock, Username: "locker", Password: "s3cret", DB: 3}
	stop, err := startRedisWith(&redis.Options{Network: "unix", Addr: sock, Password: "admin"},
		"--port", "0", "--unixsocket", sock, "--requirepass", "admin",
		"--user", "locker", "on", ">s3cret", "~lh:*", "&lh:wake:*", "+@all")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop) // after the clients' Close
	start := time.Now()
	handoffOn(t, unix)
	t.Logf("unix %v", time.Since(start))
	admin := redis.NewClient(&redis.Options{Network: "unix", Addr: sock, Password: "admin", DB: 3})
	defer admin.Close()
	if n, err := admin.Exists(context.Background(), "lh:{opts}:fence").Result(); err != nil || n != 1 {
		t.Fatalf("fence key in DB 3: %d %v", n, err)
	}

	tlsConf, certFile, keyFile := selfSigned(t, dir)
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	tlsOpts := &redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), TLSConfig: tlsConf}
	stopTLS, err := startRedisWith(tlsOpts, "--port", "0", "--tls-port", strconv.Itoa(port),
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", certFile,
		"--tls-auth-clients", "no")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopTLS)
	t.Logf("tls server up %v", time.Since(start))
	handoffOn(t, tlsOpts)
	t.Logf("tls %v", time.Since(start))
}

// handoffOn: two clients on transports made from opt; one holds "opts", the
// other waits and gets it on release.
func handoffOn(t *testing.T, opt *redis.Options) {
	t.Helper()
	ctx := context.Background()
	var cs [2]*Client
	for i := range cs {
		tr, err := NewRedisTransportFromOptions(opt, &RedisOptions{StandbyDelay: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tr.Close() })
		cs[i] = newTestClient(t, tr, nil)
		// Refusals before the wake channel is live do not quiet the waiter: its quick
		// attempts spent, it sleeps out the holder's TTL and parked would not hold.
		subscribed(t, cs[i])
	}
	l, err := cs[0].Acquire(ctx, "opts", AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatalf("%s: %v", opt.Addr, err)
	}
	got := acquireAsync(ctx, cs[1], "opts", AcquireOptions{TTL: time.Second, Wait: 50 * time.Second})
	waitFor(t, "the waiter parked", func() bool { return parked(cs[1]) })
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := awaitLease(t, got, "waiter on "+opt.Addr)
	if k := redisCounters(t, cs[1]); k.Wakeups != 1 {
		t.Fatalf("%s: %d wake-ups", opt.Addr, k.Wakeups)
	}
	_ = l2.Release(ctx)
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and returns a
// client TLS config that trusts it.
func selfSigned(t *testing.T, dir string) (*tls.Config, string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "leasehold test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(crand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}, certFile, keyFile
}

// TestRedisTransportArguments: the earlier constructors refuse what is missing, the
// kept methods are no-ops, the Redis counters belong to Redis clients, and a nil
// executor is refused.
func TestRedisTransportArguments(t *testing.T) {
	tr, err := NewRedisTransport(newRedis(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewClient((*RedisExecutor)(nil), nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a nil executor: %v", err)
	}
	if _, err := NewLockClient(nil, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("no executor: %v", err)
	}
	if _, err := NewRedisTransport(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("nil client: %v", err)
	}
	if _, err := NewRedisTransportFromOptions(nil, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("nil options: %v", err)
	}
	if tr.Load(context.Background()) != nil || tr.Close() != nil {
		t.Fatal("Load and Close are no-ops")
	}
	c := newTestClient(t, tr, nil)
	if _, err := c.RedisCounters(); err != nil {
		t.Fatal(err)
	}
	m := newTestClient(t, NewMemoryTransport(), nil)
	if _, err := m.RedisCounters(); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("RedisCounters of a memory client: %v", err)
	}
	if _, err := NewClient(mustTransport(t, newRedis(t), &RedisOptions{StandbyDelay: time.Hour}), nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a standby delay of an hour: %v", err)
	}
}

func mustTransport(t testing.TB, rdb redis.UniversalClient, o *RedisOptions) *RedisTransport {
	t.Helper()
	tr, err := NewRedisTransportWithOptions(rdb, o)
	if err != nil {
		t.Fatal(err)
	}
	return tr
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
	lock := lockKey(name)
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
	lock := lockKey(name)
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
	lock := lockKey("stopped")
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

// TestRedisLeaseLifecycle: Renew, NoAutoRenew, the outcomes of Release and
// a ctx deadline shorter than Wait, on the Redis protocol.
func TestRedisLeaseLifecycle(t *testing.T) {
	c, _ := newRedisClient(t, nil)
	other, _ := newRedisClient(t, nil)
	rdb := newRedis(t)
	ctx := context.Background()

	// Renew moves the validity; Release confirms; Renew after it fails at once.
	name := uniq(t, "renew")
	l, err := c.Acquire(ctx, name, AcquireOptions{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	before := l.ValidUntil()
	time.Sleep(20 * time.Millisecond)
	until, err := l.Renew(ctx)
	if err != nil || !until.After(before) {
		t.Fatalf("Renew: %v, %v not after %v", err, until, before)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := l.Renew(ctx); !errors.Is(err, ErrReleased) {
		t.Fatalf("Renew after Release: %v", err)
	}

	// NoAutoRenew: lost at the end of its validity.
	l, err = c.Acquire(ctx, uniq(t, "noauto"), AcquireOptions{TTL: 300 * time.Millisecond, NoAutoRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost():
	case <-time.After(20 * time.Second):
		t.Fatal("a NoAutoRenew lease outlived its validity")
	}
	if err := l.Release(ctx); !errors.Is(err, ErrLost) {
		t.Fatalf("Release of a lost lease: %v", err)
	}

	// Not owner: the lock key vanished and someone else took the lock.
	name = uniq(t, "stolen")
	l, err = c.Acquire(ctx, name, AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, lockKey(name)).Err(); err != nil {
		t.Fatal(err)
	}
	thief, err := other.Acquire(ctx, name, AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("Release after the lock was taken: %v", err)
	}
	if thief.FencingToken() <= l.FencingToken() {
		t.Fatalf("token %d not above %d", thief.FencingToken(), l.FencingToken())
	}

	// A ctx deadline shorter than Wait ends the wait with DeadlineExceeded.
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := c.Acquire(dctx, name, AcquireOptions{TTL: time.Second, Wait: time.Minute}); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("Acquire past its ctx deadline: %v", err)
	}
	if err := thief.Release(ctx); err != nil {
		t.Fatal(err)
	}
	k, err := c.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if k.ReleasesConfirmed != 1 || k.ReleasesNotOwner != 1 || k.LostExpired != 1 || k.RenewalsRequested != 1 {
		t.Fatalf("counters %+v", k)
	}
	// The waiter that gave up left the queue.
	waitFor(t, "an empty queue", func() bool { return queueLen(rdb, name) == 0 })
}

// TestRedisFlattenAndReplyLimits: go-redis replies (RESP2 and RESP3 shapes,
// nested errors) flatten to pre-order values over one data buffer, and the
// core takes them through lh_io_reply: a shape a SUBSCRIBE cannot have is
// counted as garbage, an oversized list is refused (the executor then
// reports the request failed), an answer of another backend's kind is refused,
// nothing is a grant.
func TestRedisFlattenAndReplyLimits(t *testing.T) {
	rdb := newRedis(t)
	redisErr := rdb.Do(context.Background(), "NO-SUCH-COMMAND").Err()
	var re redis.Error
	if !errors.As(redisErr, &re) {
		t.Fatalf("not an error reply: %v", redisErr)
	}
	vals, data, err := flatten(nil, nil, []any{int64(-7), "ab", []any{nil, re, true}, 1.5, big.NewInt(12), map[any]any{"k": int64(1)}})
	if err != nil {
		t.Fatal(err)
	}
	type v struct {
		kind uint32
		i    int64
		s    string
		n    int
	}
	var got []v
	for _, x := range vals {
		e := v{kind: uint32(x.kind), i: int64(x.integer), n: int(x.len)}
		if e.kind == valueBulk || e.kind == valueError {
			e.s, e.n = string(data[x.offset:x.offset+x.len]), 0
		}
		got = append(got, e)
	}
	want := []v{{valueArray, 0, "", 6}, {valueInt, -7, "", 0}, {valueBulk, 0, "ab", 0}, {valueArray, 0, "", 3},
		{valueNil, 0, "", 0}, {valueError, 0, re.Error(), 0}, {valueInt, 1, "", 0}, {valueBulk, 0, "1.5", 0},
		{valueBulk, 0, "12", 0}, {valueArray, 0, "", 2}, {valueBulk, 0, "k", 0}, {valueInt, 1, "", 0}}
	if !slices.Equal(got, want) {
		t.Fatalf("flattened\n%v\nwant\n%v", got, want)
	}
	if _, _, err := flatten(nil, nil, struct{}{}); err == nil {
		t.Fatal("an unknown reply type was flattened")
	}

	seed := make([]byte, 32)
	k, err := newCore(defaultCoreConfig(), backendOptions{kind: backendRedis}, seed)
	if err != nil {
		t.Fatal(err)
	}
	defer k.free()
	q, err := k.ioPoll()
	if err != nil || q == nil || q.kind != ioCommand || q.connection != connNotify || len(q.argv) != 2 || q.argv[0] != "SUBSCRIBE" {
		t.Fatalf("first request %+v %v", q, err)
	}
	if err := k.ioHTTPReply(monoNow(), q.id, 200, []byte("{}")); !isStatus(err, statusWrongAnswer) {
		t.Fatalf("an HTTP reply on a Redis handle: %v", err)
	}
	if err := k.ioStreamMessage(monoNow(), q.id, []byte("{}")); !isStatus(err, statusWrongAnswer) {
		t.Fatalf("a stream message on a Redis handle: %v", err)
	}
	if err := k.ioConnection(monoNow(), connNotify, 99, "ch"); !isStatus(err, statusInvalidEnum) {
		t.Fatalf("an unknown connection event: %v", err)
	}
	if err := k.ioFailed(monoNow(), q.id, 99, ""); !isStatus(err, statusInvalidEnum) {
		t.Fatalf("an unknown failure kind: %v", err)
	}
	huge := make([]any, 5000)
	for i := range huge {
		huge[i] = int64(i)
	}
	hv, hd, err := flatten(nil, nil, huge)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.ioReply(monoNow(), q.id, hv, hd); !isStatus(err, statusInvalidReply) {
		t.Fatalf("oversized reply: %v", err)
	}
	if err := k.ioReply(monoNow(), q.id, vals, data); err != nil {
		t.Fatalf("garbage reply: %v", err)
	}
	kc, err := k.counters()
	if rc := kc.redis(); err != nil || rc.GarbageReplies != 1 || rc.Subscribed {
		t.Fatalf("counters %+v %v", rc, err)
	}
	if err := k.ioReply(monoNow(), 999, vals, data); err != nil {
		t.Fatalf("reply to an unknown id: %v", err)
	}
	if kc, _ := k.counters(); kc.BackendStaleReplies != 1 {
		t.Fatalf("stale replies %d", kc.BackendStaleReplies)
	}
}

// TestRedisSilentPubSubConnectionIsDropped: a server that stops answering
// (SIGSTOP: the sockets stay open, nothing comes back) is found out by the
// pub/sub health check (a PING, then silence): the subscription is reported
// lost, and it comes back once the server answers again.
func TestRedisSilentPubSubConnectionIsDropped(t *testing.T) {
	rdb, addr := privateRedis(t)
	pid, err := redisPid(addr)
	if err != nil {
		t.Fatal(err)
	}
	old := subHealthCheck
	subHealthCheck = 200 * time.Millisecond // read by the Client's goroutines, started below
	t.Cleanup(func() { subHealthCheck = old })
	c := clientOn(t, rdb, nil)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}()
	waitFor(t, "the silent subscription reported lost", func() bool {
		k := redisCounters(t, c)
		return k.SubscriberLosses == 1 && !k.Subscribed
	})
	resumed = true
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the subscription back", func() bool { return redisCounters(t, c).Subscribed })
}
