package leasehold

// Benchmarks of the SQLite, PostgreSQL and etcd transports on the servers the tests
// start (from bindings/go):
//
//	go test -run '^$' -bench 'Backend' -benchtime 3s
//
// Uncontended lock + unlock (ops/s), beside PostgreSQL's advisory locks (what users
// reach for today; no TTL, no fencing); handoff latency with 8 waiters (p50/p99), as in
// BenchmarkHandoff.

import (
	"context"
	"path/filepath"
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
	b.Run("pg_advisory_lock", func(b *testing.B) {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, needPostgres(b))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close(ctx)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			var ok bool
			if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock(42)").Scan(&ok); err != nil || !ok {
				b.Fatal(ok, err)
			}
			if err := conn.QueryRow(ctx, "SELECT pg_advisory_unlock(42)").Scan(&ok); err != nil || !ok {
				b.Fatal(ok, err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	})
}

// BenchmarkBackendPostgresFloor runs the protocol's two statements (its functions, as
// docs/sql-protocol.md names them) straight on one pgx connection: what the server costs
// per acquire + release, without the core and the executor.
func BenchmarkBackendPostgresFloor(b *testing.B) {
	ctx := context.Background()
	url := needPostgres(b)
	// The migration creates the functions.
	l, err := newPostgresClient(b, url, nil).Acquire(ctx, uniq(b, "m"), AcquireOptions{TTL: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	_ = l.Release(ctx)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	name, token := uniq(b, "f"), "00112233445566778899aabbccddeeff"
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var granted, released bool
		var fence int64
		var left *int64
		if err := conn.QueryRow(ctx, "SELECT lh_granted, lh_fence, lh_remaining_ms FROM leasehold_acquire($1, $2, $3)",
			name, token, int64(10000)).Scan(&granted, &fence, &left); err != nil || !granted {
			b.Fatal(granted, err)
		}
		if err := conn.QueryRow(ctx, "SELECT leasehold_release($1, $2, $3)", name, token, "lh_bench").Scan(&released); err != nil || !released {
			b.Fatal(released, err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
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
