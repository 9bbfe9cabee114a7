package leasehold

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// stallProxy forwards loopback TCP to a real server; while delay is set, every chunk the
// server sends waits that long before it reaches the client (requests pass at once, so the
// server acts on them; only the answers are late).
type stallProxy struct {
	ln    net.Listener
	delay atomic.Int64 // nanoseconds
	mu    sync.Mutex
	conns []net.Conn
}

func newStallProxy(t testing.TB, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln}
	go p.accept(target)
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) addr() string { return p.ln.Addr().String() }

func (p *stallProxy) accept(target string) {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(s, c); _ = s.Close() }()
		go func() {
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					if d := p.delay.Load(); d > 0 {
						time.Sleep(time.Duration(d))
					}
					if _, werr := c.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			_ = c.Close()
		}()
	}
}

func (p *stallProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
}

const (
	stall       = 1500 * time.Millisecond
	boundMargin = 500 * time.Millisecond
)

func stalledRedisClient(t *testing.T, opts *Options) (*LockClient, *stallProxy, *redis.Client) {
	t.Helper()
	direct := newRedis(t)
	p := newStallProxy(t, needRedis(t))
	rdb := redis.NewClient(&redis.Options{Addr: p.addr(), ReadTimeout: 5 * time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	return clientOn(t, rdb, opts), p, direct
}

// A Release bounded by ctx returns by ctx's deadline while the server stalls; the release
// continues in the background and the lock is freed once the server answers.
func TestCallerBoundReleaseWithAStalledServer(t *testing.T) {
	c, p, direct := stalledRedisClient(t, nil)
	releaseBoundedWhileStalled(t, c, p, "bound-rel", redisHeld(direct))
}

// redisHeld reports, through a direct connection, whether a name's lock key exists.
func redisHeld(direct *redis.Client) func(name string) bool {
	return func(name string) bool { return direct.Exists(context.Background(), lockKey(name)).Val() == 1 }
}

// releaseBoundedWhileStalled: a lease taken on c, then released with a 100ms ctx through a
// stalled server, returns within that bound and is no longer held; once the server answers
// again, held reports the name free. It returns the name.
func releaseBoundedWhileStalled(t *testing.T, c *LockClient, p *stallProxy, base string, held func(string) bool) string {
	t.Helper()
	name := uniq(t, base)
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
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Release: %v", err)
	}
	if l.IsHeld() {
		t.Fatal("a released lease is still held")
	}
	p.delay.Store(0)
	waitFor(t, "the lock freed", func() bool { return !held(name) })
	return name
}

// An Acquire fails by its bound (Wait plus one request timeout) while the server stalls,
// and a grant answered after it failed is released: no lock leaks.
func TestCallerBoundAcquireWithAStalledServer(t *testing.T) {
	c, p, direct := stalledRedisClient(t, &Options{RequestTimeout: 300 * time.Millisecond})
	acquireBoundedWhileStalled(t, c, p, "bound-acq", redisHeld(direct))
}

// acquireBoundedWhileStalled: after a warm-up cycle (it waits, so a first connect slower than
// the request timeout is retried), an Acquire with Wait 100ms through a stalled server fails
// within Wait plus c's 300ms request timeout, and held reports the name free once the server
// answers again. It returns the name.
func acquireBoundedWhileStalled(t *testing.T, c *LockClient, p *stallProxy, base string, held func(string) bool) string {
	t.Helper()
	warm, err := c.Acquire(context.Background(), uniq(t, "warm"), AcquireOptions{TTL: 30 * time.Second, Wait: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	name := uniq(t, base)
	p.delay.Store(int64(stall))
	t0 := time.Now()
	l, err := c.Acquire(context.Background(), name, AcquireOptions{TTL: 30 * time.Second, Wait: 100 * time.Millisecond})
	took := time.Since(t0)
	t.Logf("Acquire with Wait 100ms, the server stalled %v: %v (%v)", stall, took, err)
	if err == nil {
		t.Fatalf("Acquire granted %v through a stalled server", l)
	}
	if took > 400*time.Millisecond+boundMargin {
		t.Fatalf("Acquire with Wait 100ms and a 300ms request timeout took %v (%v)", took, err)
	}
	p.delay.Store(0)
	waitFor(t, "no lock left", func() bool { return !held(name) })
	return name
}

// stalledPostgresClient is a client whose PostgreSQL connections go through a stall proxy,
// and a direct connection for looking at the locks table.
func stalledPostgresClient(t *testing.T, opts *Options) (*LockClient, *stallProxy, *pgx.Conn) {
	t.Helper()
	raw := needPostgres(t)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	p := newStallProxy(t, u.Host)
	u.Host = p.addr()
	direct, err := pgx.Connect(context.Background(), raw)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = direct.Close(context.Background()) })
	return newPostgresClient(t, u.String(), opts), p, direct
}

// pgHeld reports, through a direct connection, whether the locks table has a name held (by
// any token).
func pgHeld(t *testing.T, direct *pgx.Conn) func(name string) bool {
	return func(name string) bool {
		var held bool
		err := direct.QueryRow(context.Background(), "SELECT coalesce(bool_or(token <> ''), false) FROM leasehold_locks WHERE name = $1", name).Scan(&held)
		if err != nil {
			t.Fatal(err)
		}
		return held
	}
}

// The same bounds on PostgreSQL, whose commands requests run on the caller's goroutine when
// its ctx cannot end sooner than the request timeout, and on a goroutine of their own when it
// can: a Release bounded by ctx returns by ctx's deadline and the release is confirmed later.
func TestCallerBoundPostgresReleaseWithAStalledServer(t *testing.T) {
	c, p, direct := stalledPostgresClient(t, nil)
	releaseBoundedWhileStalled(t, c, p, "pg-bound-rel", pgHeld(t, direct))
	waitFor(t, "the release confirmed", func() bool {
		k, err := c.Counters()
		return err == nil && k.ReleasesConfirmed == 1
	})
}

// An Acquire with a background ctx runs its request on its own goroutine within the request
// timeout: it fails by Wait plus one request timeout while the server stalls, no lock is left
// once the server answers again, and another client takes the name.
func TestCallerBoundPostgresAcquireWithAStalledServer(t *testing.T) {
	c, p, direct := stalledPostgresClient(t, &Options{RequestTimeout: 300 * time.Millisecond})
	name := acquireBoundedWhileStalled(t, c, p, "pg-bound-acq", pgHeld(t, direct))
	other := newPostgresClient(t, needPostgres(t), nil)
	l, err := other.Acquire(context.Background(), name, AcquireOptions{TTL: 5 * time.Second, Wait: 5 * time.Second})
	if err != nil {
		t.Fatalf("the name stayed taken after the stall: %v", err)
	}
	_ = l.Release(context.Background())
}
