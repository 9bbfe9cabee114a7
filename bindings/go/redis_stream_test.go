package leasehold

// RedisStreamExecutor against real redis-servers: the core owns the wire, the executor
// moves bytes (TCP, unix socket, TLS).

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// newStreamClient is a LockClient on a RedisStreamExecutor for url, subscribed to its wake
// channel.
func newStreamClient(t testing.TB, url string, o *RedisStreamOptions, opts *Options) *LockClient {
	t.Helper()
	if o == nil {
		// A long standby delay: the handoffs counted here must not race a standby.
		o = &RedisStreamOptions{Redis: RedisOptions{StandbyDelay: 2 * time.Second}}
	}
	x, err := NewRedisStreamExecutor(url, o)
	if err != nil {
		t.Fatal(err)
	}
	c := newTestClient(t, x, opts)
	subscribed(t, c)
	return c
}

// Acquire and release on the stream executor: the fence increases, the key is the
// protocol's, the lock is free after the release, and a go-redis client sees the same lock.
func TestRedisStreamAcquireRelease(t *testing.T) {
	rdb := newRedis(t)
	c := newStreamClient(t, "redis://"+needRedis(t)+"/0", nil, nil)
	other := clientOn(t, rdb, nil)
	ctx := context.Background()
	name := uniq(t, "stream")
	var last uint64
	for i := 0; i < 20; i++ {
		l, err := c.Acquire(ctx, name, AcquireOptions{TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if l.FencingToken() <= last {
			t.Fatalf("fence %d not above %d", l.FencingToken(), last)
		}
		last = l.FencingToken()
		if rdb.Exists(ctx, lockKey(name)).Val() != 1 {
			t.Fatal("no lock key while held")
		}
		if _, err := other.Acquire(ctx, name, AcquireOptions{TTL: time.Second}); !errors.Is(err, ErrNotAcquired) {
			t.Fatalf("a go-redis client took a lock the stream client holds: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if rdb.Exists(ctx, lockKey(name)).Val() != 0 {
			t.Fatal("lock key left after a confirmed release")
		}
	}
	lo, err := other.Acquire(ctx, name, AcquireOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if lo.FencingToken() <= last {
		t.Fatalf("fence %d of the go-redis client not above %d", lo.FencingToken(), last)
	}
	_ = lo.Release(ctx)
	k := redisCounters(t, c)
	if k.ScriptCalls == 0 || !k.Subscribed {
		t.Fatalf("counters: %+v", k)
	}
	// One open per connection (commands, subscriber), none ended.
	if k.StreamOpens != 2 || k.StreamCloses != 0 || k.StreamLateAnswers != 0 || k.SentinelLookups != 0 {
		t.Fatalf("stream counters: %+v", k)
	}
}

// Two stream clients contend: the waiter parks, is woken once by the release and gets the
// lock with a higher fence; many goroutines on one client keep their requests apart.
func TestRedisStreamContention(t *testing.T) {
	url := "redis://" + needRedis(t)
	a, b := newStreamClient(t, url, nil, nil), newStreamClient(t, url, nil, nil)
	ctx := context.Background()
	name := uniq(t, "contend")
	l, err := a.Acquire(ctx, name, AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got := acquireAsync(ctx, b, name, AcquireOptions{TTL: time.Second, Wait: 50 * time.Second})
	waitFor(t, "the waiter parked", func() bool { return parked(b) })
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb := awaitLease(t, got, "the waiter")
	if lb.FencingToken() <= l.FencingToken() {
		t.Fatalf("fence %d not above %d", lb.FencingToken(), l.FencingToken())
	}
	if k := redisCounters(t, b); k.Wakeups != 1 {
		t.Fatalf("%d wake-ups", k.Wakeups)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// 8 goroutines of each client share 3 names: every grant is exclusive.
	var wg sync.WaitGroup
	var mu sync.Mutex
	holders := map[string]int{}
	errs := make(chan error, 16)
	for g := 0; g < 16; g++ {
		c := a
		if g%2 == 1 {
			c = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 15; i++ {
				n := fmt.Sprintf("%s-%d", name, (g+i)%3)
				l, err := c.Acquire(ctx, n, AcquireOptions{TTL: 10 * time.Second, Wait: time.Minute})
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				holders[n]++
				if holders[n] != 1 {
					errs <- fmt.Errorf("%s held by %d", n, holders[n])
				}
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				holders[n]--
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// The server is killed and started again on the same port: the held lease is lost, the
// streams are opened anew (subscription back, scripts loaded again), fences keep
// increasing and a waiter is woken after the restart.
func TestRedisStreamRestart(t *testing.T) {
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
	ctx := context.Background()
	a, b := newStreamClient(t, "redis://"+addr, nil, nil), newStreamClient(t, "redis://"+addr, nil, nil)
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
	// The connections a client had ended with the server and were opened again: a held
	// both, b only its subscriber (its commands connection opened after the restart).
	for i, want := range []struct{ opens, closes uint64 }{{4, 2}, {3, 1}} {
		k := redisCounters(t, []*LockClient{a, b}[i])
		if k.StreamCloses < want.closes || k.StreamOpens < want.opens || k.StreamOpens-k.StreamCloses > 2 {
			t.Fatalf("client %d: stream counters after the restart: %+v", i, k)
		}
	}
}

// A unix socket URL with DB 3, redis:// with an ACL user and password, and rediss:// with
// the user's TLS configuration (its ServerName left empty: the core's is used); without it
// the system roots refuse the self-signed certificate.
func TestRedisStreamUnixSocketAndTLS(t *testing.T) {
	needRedis(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "redis.sock")
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	stop, err := startRedisWith(&redis.Options{Network: "unix", Addr: sock},
		"--port", strconv.Itoa(port), "--unixsocket", sock,
		"--user", "locker", "on", ">s3cret", "~lh:*", "&lh:wake:*", "+@all")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop) // after the clients' Close
	streamHandoff(t, "unix://"+sock+"?db=3", nil)
	admin := redis.NewClient(&redis.Options{Network: "unix", Addr: sock, DB: 3})
	defer admin.Close()
	if n, err := admin.Exists(context.Background(), "lh:{stream-opts}:fence").Result(); err != nil || n != 1 {
		t.Fatalf("fence key in DB 3: %d %v", n, err)
	}
	streamHandoff(t, "redis://locker:s3cret@"+addr+"/4", nil)
	admin4 := redis.NewClient(&redis.Options{Network: "unix", Addr: sock, DB: 4})
	defer admin4.Close()
	if n, err := admin4.Exists(context.Background(), "lh:{stream-opts}:fence").Result(); err != nil || n != 1 {
		t.Fatalf("fence key in DB 4: %d %v", n, err)
	}
	x, err := NewRedisStreamExecutor("redis://locker:wrong@"+addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newTestClient(t, x, &Options{RequestTimeout: 300 * time.Millisecond})
	_, err = c.Acquire(context.Background(), uniq(t, "badpass"), AcquireOptions{TTL: time.Second, Wait: 300 * time.Millisecond})
	if !errors.Is(err, ErrNotAcquired) || !strings.Contains(c.BackendError(), "WRONGPASS") {
		t.Fatalf("a wrong password was let in: %v (%s)", err, c.BackendError())
	}
	t.Logf("wrong password: %v (%s)", err, c.BackendError())

	tlsConf, certFile, keyFile := selfSigned(t, dir)
	if port, err = freePort(); err != nil {
		t.Fatal(err)
	}
	addr = fmt.Sprintf("127.0.0.1:%d", port)
	stopTLS, err := startRedisWith(&redis.Options{Addr: addr, TLSConfig: tlsConf}, "--port", "0", "--tls-port", strconv.Itoa(port),
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", certFile,
		"--tls-auth-clients", "no")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopTLS)
	conf := tlsConf.Clone()
	conf.ServerName = ""
	streamHandoff(t, "rediss://"+addr, &RedisStreamOptions{TLSConfig: conf})

	x, err = NewRedisStreamExecutor("rediss://"+addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	c = newTestClient(t, x, &Options{RequestTimeout: 300 * time.Millisecond})
	_, err = c.Acquire(context.Background(), uniq(t, "untrusted"), AcquireOptions{TTL: time.Second, Wait: 500 * time.Millisecond})
	if !errors.Is(err, ErrNotAcquired) || !strings.Contains(c.BackendError(), "certificate") {
		t.Fatalf("a self-signed certificate was not refused by the system roots: %v (%s)", err, c.BackendError())
	}
}

// streamHandoff: two stream clients on url; one holds "stream-opts", the other waits and
// gets it on release.
func streamHandoff(t *testing.T, url string, o *RedisStreamOptions) {
	t.Helper()
	if o == nil {
		o = &RedisStreamOptions{}
	}
	o.Redis.StandbyDelay = 100 * time.Millisecond
	ctx := context.Background()
	a, b := newStreamClient(t, url, o, nil), newStreamClient(t, url, o, nil)
	l, err := a.Acquire(ctx, "stream-opts", AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	got := acquireAsync(ctx, b, "stream-opts", AcquireOptions{TTL: time.Second, Wait: 50 * time.Second})
	waitFor(t, "the waiter parked", func() bool { return parked(b) })
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := awaitLease(t, got, "waiter on "+url)
	if k := redisCounters(t, b); k.Wakeups != 1 {
		t.Fatalf("%s: %d wake-ups", url, k.Wakeups)
	}
	_ = l2.Release(ctx)
}

// Bad URLs and options are refused at construction with ErrInvalidArgument, saying what
// is wanted, never showing the password.
func TestRedisStreamBadURL(t *testing.T) {
	for _, url := range []string{
		"", "http://127.0.0.1:6379", "redis://127.0.0.1:notaport", "redis://:hunter2@127.0.0.1:6379/x",
		"redis+sentinel://:hunter2@127.0.0.1:26379", "redis+cluster://:hunter2@127.0.0.1:7000/3", "redis://:hunter2@127.0.0.1/0?dial_timeout=1s",
	} {
		_, err := NewRedisStreamExecutor(url, nil)
		if !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%q: %v", url, err)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("%q: the error shows the password: %v", url, err)
		}
		if !strings.Contains(err.Error(), "redis://") {
			t.Fatalf("%q: the error does not say what is wanted: %v", url, err)
		}
		t.Logf("%q: %v", url, err)
	}
	// The core's reason is in the error (lh_client_new_check), not only the accepted forms.
	for url, reason := range map[string]string{
		"unix://redis.sock":                 "absolute socket path",
		"redis://:hunter2@127.0.0.1:6379/x": "database",
		"redis://127.0.0.1:0":               "port",
		"redis://u:@127.0.0.1:6379":         "needs a password",
	} {
		_, err := NewRedisStreamExecutor(url, nil)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), reason) {
			t.Fatalf("%q: want the reason %q: %v", url, reason, err)
		}
	}
	if _, err := NewRedisStreamExecutor("redis://127.0.0.1:6379", &RedisStreamOptions{ClientName: "has space"}); err == nil ||
		!strings.Contains(err.Error(), "redis_client_name") && !strings.Contains(err.Error(), "client name") {
		t.Fatalf("the client name's reason: %v", err)
	}
	for _, o := range []*RedisStreamOptions{{Protocol: 4}, {ClientName: "has space"}, {ConnectTimeout: -1},
		{Redis: RedisOptions{ShardedWake: true}}} {
		if _, err := NewRedisStreamExecutor("redis://127.0.0.1:6379", o); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%+v: %v", o, err)
		}
	}
}

// A Release bounded by ctx returns by ctx's deadline while the server stalls its answers;
// the release goes on and the lock is freed once the server answers.
func TestRedisStreamCallerBoundRelease(t *testing.T) {
	direct := newRedis(t)
	p := newStallProxy(t, needRedis(t))
	c := newStreamClient(t, "redis://"+p.addr(), nil, nil)
	name := uniq(t, "bound-rel")
	l, err := c.Acquire(context.Background(), name, AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p.delay.Store(int64(stall))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	err = l.Release(ctx)
	took := time.Since(t0)
	t.Logf("Release with a 100ms ctx, the server stalled %v: %v (%v)", stall, took, err)
	if took > 100*time.Millisecond+boundMargin {
		t.Fatalf("Release with a 100ms ctx took %v", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Release through a stalled server: %v", err)
	}
	if l.IsHeld() {
		t.Fatal("a released lease is still held")
	}
	p.delay.Store(0)
	waitFor(t, "the lock key gone", func() bool { return direct.Exists(context.Background(), lockKey(name)).Val() == 0 })
}

// An Acquire without a ctx bound, reading for its own answer while the lock is held
// elsewhere, returns when its wait ends.
func TestRedisStreamAcquireWaitEndsWhileReading(t *testing.T) {
	url := "redis://" + needRedis(t)
	holder := newStreamClient(t, url, nil, nil)
	c := newStreamClient(t, url, nil, nil)
	name := uniq(t, "wait-ends")
	held, err := holder.Acquire(context.Background(), name, AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = held.Release(context.Background()) }()
	const wait = 300 * time.Millisecond
	t0 := time.Now()
	l, err := c.Acquire(context.Background(), name, AcquireOptions{TTL: 30 * time.Second, Wait: wait})
	took := time.Since(t0)
	t.Logf("Acquire of a held lock with Wait %v: %v (%v)", wait, took, err)
	if !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("Acquire of a held lock: %v, %v", l, err)
	}
	if took > wait+boundMargin {
		t.Fatalf("Acquire with Wait %v took %v", wait, took)
	}
}

// Close ends the streams and their goroutines; a LockClient made after it works.
func TestRedisStreamClose(t *testing.T) {
	url := "redis://" + needRedis(t)
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		x, err := NewRedisStreamExecutor(url, nil)
		if err != nil {
			t.Fatal(err)
		}
		c, err := NewLockClient(x, nil)
		if err != nil {
			t.Fatal(err)
		}
		l, err := c.Acquire(ctx, uniq(t, "close"), AcquireOptions{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if l.IsHeld() {
			t.Fatal("held after Close")
		}
		if err := x.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// Callers whose ctx ends while they read hand the stream back mid-answer, many at once and
// over and over: no byte is lost or fed twice (the core would see a broken reply and
// reopen the stream), every grant is exclusive, and the client works on afterwards.
func TestRedisStreamCallersGiveUpMidRead(t *testing.T) {
	p := newStallProxy(t, needRedis(t))
	p.delay.Store(int64(500 * time.Microsecond))
	c := newStreamClient(t, "redis://"+p.addr(), nil, nil)
	name := uniq(t, "giveup")
	// The commands connection opens first: a caller that gives up while it opens is a request
	// never sent (counted as a transport failure), not a reply left mid-read.
	warm, err := c.Acquire(context.Background(), name+"-warm", AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var holders [2]atomic.Int32
	var granted, gaveUp atomic.Int32
	errs := make(chan error, 16)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+i%10)*500*time.Microsecond)
				l, err := c.Acquire(ctx, fmt.Sprintf("%s-%d", name, g%2), AcquireOptions{TTL: 10 * time.Second})
				if err == nil {
					granted.Add(1)
					if n := holders[g%2].Add(1); n != 1 {
						errs <- fmt.Errorf("%d holders of one name", n)
					}
					holders[g%2].Add(-1)
					_ = l.Release(ctx) // may end by ctx: the release goes on
				} else if errors.Is(err, context.DeadlineExceeded) {
					gaveUp.Add(1)
				} else if !errors.Is(err, ErrNotAcquired) {
					errs <- err
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d grants, %d acquires given up by ctx", granted.Load(), gaveUp.Load())
	if granted.Load() == 0 || gaveUp.Load() == 0 {
		t.Fatalf("want both grants and acquires given up mid-read: %d, %d", granted.Load(), gaveUp.Load())
	}
	p.delay.Store(0)
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		l, err := c.Acquire(ctx, fmt.Sprintf("%s-%d", name, i), AcquireOptions{TTL: 10 * time.Second, Wait: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	k, err := c.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if k.BackendErrorReplies != 0 || k.BackendTransportFailures != 0 {
		t.Fatalf("the stream broke: %d error replies, %d transport failures (%s)", k.BackendErrorReplies, k.BackendTransportFailures, c.BackendError())
	}
}

// Open makes a RedisStreamExecutor with ExecutorOptions.RedisStream (the default path too).
func TestRedisStreamOpen(t *testing.T) {
	c, err := Open("redis://"+needRedis(t), &OpenOptions{ExecutorOptions: ExecutorOptions{RedisStream: &RedisStreamOptions{}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.c.exec.(*RedisStreamExecutor); !ok {
		t.Fatalf("Open made a %T", c.c.exec)
	}
	l, err := c.Acquire(context.Background(), uniq(t, "open"), AcquireOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}
