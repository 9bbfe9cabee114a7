package leasehold

// Benchmarks of the SQLite, PostgreSQL and etcd transports on the servers the tests
// start (from bindings/go):
//
//	go test -run '^$' -bench 'Backend' -benchtime 3s
//
// Uncontended lock + unlock (ops/s); PostgreSQL beside its advisory locks (what users
// reach for today; no TTL, no fencing) on a durable cluster of its own
// (BenchmarkBackendPostgresVsAdvisory); handoff latency with 8 waiters (p50/p99), as in
// BenchmarkHandoff.

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func benchBackendLock(c *Client, name string) lockFunc {
	return func(ctx context.Context) (func() error, error) {
		l, err := c.Acquire(ctx, name, AcquireOptions{TTL: 10 * time.Second, Wait: time.Minute})
		if err != nil {
			return nil, err
		}
		return func() error { return l.Release(ctx) }, nil
	}
}

func backendClients(b *testing.B) map[string]func() *Client {
	dir := b.TempDir()
	return map[string]func() *Client{
		"sqlite":   func() *Client { return newSQLiteClient(b, filepath.Join(dir, "locks.db"), nil) },
		"postgres": func() *Client { return newPostgresClient(b, needPostgres(b), nil) },
		"etcd":     func() *Client { return newEtcdClient(b, needEtcd(b), nil, nil) },
	}
}

func BenchmarkBackendUncontended(b *testing.B) {
	for _, backend := range []string{"sqlite", "postgres", "etcd"} {
		b.Run(backend, func(b *testing.B) {
			lock := benchBackendLock(backendClients(b)[backend](), uniq(b, "u"))
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
		})
	}
}

// BenchmarkBackendPostgresVsAdvisory compares, on one PostgreSQL with its default
// durability (every commit waits for its WAL flush, as in production; the tests' cluster
// skips the flush), uncontended acquire + release against a loop of pg_try_advisory_lock /
// pg_advisory_unlock (no TTL, no fence, nothing written), and against floors run straight
// on pgx: the protocol's two statements, and two one-row UPDATEs (the least any lock kept in
// a table writes). Each variant also runs with asynchronous commit. b.N rounds; each round
// runs every variant for benchRound, in a rotated order, and each variant reports its
// median round (ops/s) and its ratio to the advisory locks', so the load of the machine
// weighs on all alike, and this process's CPU time per cycle (the host's share):
//
//	go test -run '^$' -bench BackendPostgresVsAdvisory -benchtime 10x
func BenchmarkBackendPostgresVsAdvisory(b *testing.B) {
	const benchRound = 300 * time.Millisecond
	ctx := context.Background()
	url := needDurablePostgres(b)
	conn := func(async bool) *pgx.Conn {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close(context.Background()) })
		if async {
			if _, err := c.Exec(ctx, "SET synchronous_commit = off"); err != nil {
				b.Fatal(err)
			}
		}
		return c
	}
	client := func(async bool) *Client {
		tr, err := NewPostgresTransportWithOptions(url, &PostgresOptions{AsynchronousCommit: async})
		if err != nil {
			b.Fatal(err)
		}
		return newTestClient(b, tr, nil)
	}
	leasehold := func(async bool) func() error {
		lock := benchBackendLock(client(async), uniq(b, "l"))
		return func() error {
			unlock, err := lock(ctx)
			if err != nil {
				return err
			}
			return unlock()
		}
	}
	// The migration creates the functions the statements call.
	if err := leasehold(false)(); err != nil {
		b.Fatal(err)
	}
	statements := func(async bool) func() error {
		c, name, token := conn(false), uniq(b, "s"), "00112233445566778899aabbccddeeff"
		acquire, release := "SELECT lh_granted, lh_fence, lh_remaining_ms FROM leasehold_acquire($1, $2, $3)",
			"SELECT leasehold_release($1, $2, $3)"
		if async {
			acquire = "SELECT a.lh_granted, a.lh_fence, a.lh_remaining_ms FROM set_config('synchronous_commit', 'off', true) s, leasehold_acquire($1, $2, $3) a"
			release = "SELECT leasehold_release($1, $2, $3) FROM set_config('synchronous_commit', 'off', true) s"
		}
		return func() error {
			var granted, released bool
			var fence int64
			var left *int64
			if err := c.QueryRow(ctx, acquire, name, token, int64(10000)).Scan(&granted, &fence, &left); err != nil || !granted {
				return fmt.Errorf("acquire: %v %v", granted, err)
			}
			if err := c.QueryRow(ctx, release, name, token, "lh_bench").Scan(&released); err != nil || !released {
				return fmt.Errorf("release: %v %v", released, err)
			}
			return nil
		}
	}
	if _, err := conn(false).Exec(ctx, "CREATE TABLE IF NOT EXISTS lh_bench_row (k int PRIMARY KEY, n bigint NOT NULL); "+
		"INSERT INTO lh_bench_row VALUES (1, 0) ON CONFLICT DO NOTHING"); err != nil {
		b.Fatal(err)
	}
	updates := func(async bool) func() error {
		c := conn(async)
		return func() error {
			for i := 0; i < 2; i++ {
				if _, err := c.Exec(ctx, "UPDATE lh_bench_row SET n = n + 1 WHERE k = 1"); err != nil {
					return err
				}
			}
			return nil
		}
	}
	advisory := func() func() error {
		c := conn(false)
		return func() error {
			var ok bool
			if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock(42)").Scan(&ok); err != nil || !ok {
				return fmt.Errorf("lock: %v %v", ok, err)
			}
			if err := c.QueryRow(ctx, "SELECT pg_advisory_unlock(42)").Scan(&ok); err != nil || !ok {
				return fmt.Errorf("unlock: %v %v", ok, err)
			}
			return nil
		}
	}
	variants := []struct {
		name string
		op   func() error
	}{
		{"advisory", advisory()},
		{"leasehold", leasehold(false)},
		{"leasehold-async", leasehold(true)},
		{"statements", statements(false)},
		{"statements-async", statements(true)},
		{"updates", updates(false)},
		{"updates-async", updates(true)},
	}
	// This process's CPU time per cycle (the host's share: the core, the executor, pgx),
	// which the machine's load does not inflate as it does the wall clock.
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	rates := make([][]float64, len(variants))
	cpus := make([][]float64, len(variants))
	b.ResetTimer()
	for round := 0; round < b.N; round++ {
		for k := range variants {
			i := (k + round) % len(variants)
			n, start, c0 := 0, time.Now(), cpu()
			for time.Since(start) < benchRound {
				if err := variants[i].op(); err != nil {
					b.Fatalf("%s: %v", variants[i].name, err)
				}
				n++
			}
			rates[i] = append(rates[i], float64(n)/time.Since(start).Seconds())
			cpus[i] = append(cpus[i], float64(cpu()-c0)/float64(time.Microsecond)/float64(n))
		}
	}
	b.StopTimer()
	median := func(v []float64) float64 {
		s := append([]float64(nil), v...)
		sort.Float64s(s)
		return s[len(s)/2]
	}
	base := median(rates[0])
	for i, v := range variants {
		m := median(rates[i])
		b.ReportMetric(m, v.name+"-ops/s")
		b.ReportMetric(median(cpus[i]), v.name+"-cpu-µs/op")
		if i > 0 {
			b.ReportMetric(m/base, v.name+"/advisory")
		}
	}
}

func BenchmarkBackendHandoff(b *testing.B) {
	for _, backend := range []string{"postgres", "etcd"} {
		b.Run(backend, func(b *testing.B) {
			name := uniq(b, "h")
			mk := backendClients(b)[backend]
			// A Client per goroutine, like a process per waiter.
			handoff(b, func() lockFunc { return benchBackendLock(mk(), name) })
		})
	}
}
