package leasehold

// Benchmarks against go-redsync/redsync v4 (single node) on the Redis that
// TestMain starts. Run (from bindings/go):
//
//	go test -run '^$' -bench . -benchtime 5s
//
// Uncontended: one goroutine, lock + unlock, reported as ops/s.
// Handoff: 9 goroutines (each with a Client of its own for leasehold, a
// mutex of its own for redsync) contend for one name, so every release has exactly 8
// waiters (a goroutine that released waits for the next grant before it
// queues again, and each holder keeps the lock 10ms so that it has queued);
// latency is measured from the start of the holder's release
// call to the return of the next holder's acquire, reported as p50/p99.

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
)

type lockFunc func(ctx context.Context) (unlock func() error, err error)

func benchLeasehold(b testing.TB, name string) lockFunc {
	c, _ := newRedisClient(b, nil)
	return func(ctx context.Context) (func() error, error) {
		l, err := c.Acquire(ctx, name, AcquireOptions{TTL: 10 * time.Second, Wait: time.Minute})
		if err != nil {
			return nil, err
		}
		return func() error { return l.Release(ctx) }, nil
	}
}

func benchRedsync(b testing.TB, name string) func() lockFunc {
	rs := redsync.New(goredis.NewPool(newRedis(b)))
	// One mutex per goroutine (redsync mutexes are not shared), default
	// retry delay (50-250ms), enough tries never to give up.
	return func() lockFunc {
		m := rs.NewMutex(name, redsync.WithExpiry(10*time.Second), redsync.WithTries(1<<20))
		return func(ctx context.Context) (func() error, error) {
			if err := m.LockContext(ctx); err != nil {
				return nil, err
			}
			return func() error { _, err := m.UnlockContext(ctx); return err }, nil
		}
	}
}

func BenchmarkUncontended(b *testing.B) {
	run := func(b *testing.B, lock lockFunc) {
		ctx := context.Background()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			unlock, err := lock(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := unlock(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	}
	b.Run("leasehold", func(b *testing.B) {
		run(b, benchLeasehold(b, uniq(b, "u")))
	})
	b.Run("redsync", func(b *testing.B) {
		run(b, benchRedsync(b, uniq(b, "u"))())
	})
}

// BenchmarkUncontendedInterleaved alternates blocks of 100 lock+unlock
// operations of both libraries, so that the load of a shared machine hits
// both alike, and reports each one's ops/s and their ratio.
func BenchmarkUncontendedInterleaved(b *testing.B) {
	ctx := context.Background()
	lh := benchLeasehold(b, uniq(b, "il"))
	rs := benchRedsync(b, uniq(b, "ir"))()
	var tl, tr time.Duration
	block := func(lock lockFunc, n int) time.Duration {
		start := time.Now()
		for i := 0; i < n; i++ {
			unlock, err := lock(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := unlock(); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start)
	}
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(100, b.N-done)
		tl += block(lh, n)
		tr += block(rs, n)
		done += n
	}
	b.ReportMetric(float64(b.N)/tl.Seconds(), "leasehold-ops/s")
	b.ReportMetric(float64(b.N)/tr.Seconds(), "redsync-ops/s")
	b.ReportMetric(tr.Seconds()/tl.Seconds(), "ratio")
}

func BenchmarkHandoff(b *testing.B) {
	b.Run("leasehold", func(b *testing.B) {
		name := uniq(b, "h")
		// A Client per goroutine, like a process per waiter.
		handoff(b, func() lockFunc { return benchLeasehold(b, name) })
	})
	b.Run("stream", func(b *testing.B) {
		name := uniq(b, "h")
		handoff(b, func() lockFunc {
			return benchBackendLock(newStreamClient(b, "redis://"+needRedis(b), &RedisStreamOptions{}, nil), name)
		})
	})
	b.Run("redsync", func(b *testing.B) {
		handoff(b, benchRedsync(b, uniq(b, "h")))
	})
}

// holdFor is how long each holder keeps the lock in the handoff benchmark.
const holdFor = 10 * time.Millisecond

func handoff(b *testing.B, newLock func() lockFunc) {
	const goroutines = 9 // one holder + 8 waiters
	ctx := context.Background()
	var (
		mu          sync.Mutex
		cond        = sync.NewCond(&mu)
		gen         int
		done        bool
		lastRelease time.Time
		samples     = make([]time.Duration, 0, b.N)
		firstErr    error
	)
	b.ResetTimer()
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		lock := newLock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				unlock, err := lock(ctx)
				now := time.Now()
				mu.Lock()
				if err != nil {
					if firstErr == nil {
						firstErr = err
					}
					done = true
					cond.Broadcast()
					mu.Unlock()
					return
				}
				gen++
				cond.Broadcast()
				if !lastRelease.IsZero() && !done {
					samples = append(samples, now.Sub(lastRelease))
					if len(samples) >= b.N {
						done = true
					}
				}
				stop := done
				my := gen
				mu.Unlock()
				// Hold the lock long enough for the previous holder to
				// queue again behind it: the handoff below then has
				// exactly 8 goroutines waiting.
				time.Sleep(holdFor)
				mu.Lock()
				lastRelease = time.Now()
				mu.Unlock()
				if err := unlock(); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					done = true
					cond.Broadcast()
					mu.Unlock()
					return
				}
				if stop {
					return
				}
				// Queue again only once someone else got the lock, so
				// each handoff has exactly 8 waiters.
				mu.Lock()
				for gen == my && !done {
					cond.Wait()
				}
				stop = done
				mu.Unlock()
				if stop {
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	slices.Sort(samples)
	if len(samples) == 0 {
		b.Fatal("no handoffs measured")
	}
	pct := func(p float64) float64 {
		i := int(p * float64(len(samples)-1))
		return float64(samples[i].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op")
}
