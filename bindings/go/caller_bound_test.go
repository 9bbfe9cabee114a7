package leasehold

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Release: %v", err)
	}
	if l.IsHeld() {
		t.Fatal("a released lease is still held")
	}
	p.delay.Store(0)
	waitFor(t, "the lock key gone", func() bool { return direct.Exists(context.Background(), lockKey(name)).Val() == 0 })
}

// An Acquire fails by its bound (Wait plus one request timeout) while the server stalls,
// and a grant answered after it failed is released: no lock leaks.
func TestCallerBoundAcquireWithAStalledServer(t *testing.T) {
	c, p, direct := stalledRedisClient(t, &Options{RequestTimeout: 300 * time.Millisecond})
	acquireBoundedWhileStalled(t, c, p, direct, "bound-acq")
}

// acquireBoundedWhileStalled: after a warm-up cycle, an Acquire with Wait 100ms through a
// stalled server fails within Wait plus c's 300ms request timeout, and no lock is left once
// the server answers again.
func acquireBoundedWhileStalled(t *testing.T, c *LockClient, p *stallProxy, direct *redis.Client, base string) {
	t.Helper()
	warm, err := c.Acquire(context.Background(), uniq(t, "warm"), AcquireOptions{TTL: 30 * time.Second})
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
	waitFor(t, "no lock left", func() bool { return direct.Exists(context.Background(), lockKey(name)).Val() == 0 })
}
