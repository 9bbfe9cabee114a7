// Command postgres compares leasehold on PostgreSQL with cirello.io/pglock (a lease kept in
// a table with a record version number: the same guarantees) and with the floor, the
// protocol's two statements on pgx with no library, on one server in one run (from this
// directory, after `cargo build --release` at the root):
//
//	PG_TEST_DURABLE=1 ../../../../scripts/pg-test-server.sh start /tmp/lh-pg   # prints the URL
//	go run . -dsn URL            # durable commits, as in production
//	go run . -dsn URL -async     # every row with synchronous_commit off
//
// It prints uncontended acquire+release ops/s (interleaved rounds, median, range, the
// paired ratios to the floor and to pglock, this process's CPU time per cycle) and handoff
// latency with 8 waiters (p50/p99). pg_try_advisory_lock + unlock is a reference row: no
// TTL, no fence, nothing written. It lives in the bench module so that the binding's module
// does not depend on pglock.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"time"

	"cirello.io/pglock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	leasehold "github.com/leasehold/leasehold/bindings/go"
	"github.com/leasehold/leasehold/bindings/go/bench/peer"
)

var (
	dsn        = flag.String("dsn", "", "PostgreSQL URL (required), e.g. postgres://postgres:leasehold@127.0.0.1:PORT/postgres")
	async      = flag.Bool("async", false, "run every row with synchronous_commit = off (leasehold's AsynchronousCommit)")
	rounds     = flag.Int("rounds", 7, "interleaved throughput rounds per library")
	roundTime  = flag.Duration("round", time.Second, "length of one throughput round")
	ttl        = flag.Duration("ttl", 10*time.Second, "lease TTL in the throughput rounds (pglock's lease duration)")
	handoffs   = flag.Int("handoffs", 60, "handoffs measured per library (in two interleaved halves)")
	handoffTTL = flag.Duration("handoff-ttl", 2*time.Second, "lease TTL in the handoff run (pglock's waiters retry once per lease duration)")
	holdFor    = flag.Duration("hold", 10*time.Millisecond, "how long each holder keeps the lock in the handoff run")
	only       = flag.String("only", "", "throughput or handoff (default: both)")
)

func main() {
	flag.Parse()
	if *dsn == "" {
		fmt.Fprintln(os.Stderr, "usage: go run . -dsn postgres://USER:PASSWORD@HOST:PORT/DB [-async] [-rounds N] [-round D] [-handoffs N] [-only throughput|handoff]")
		os.Exit(2)
	}
	if *rounds < 1 || *roundTime <= 0 || *handoffs < 2 || *ttl < time.Second || *handoffTTL < 100*time.Millisecond {
		fmt.Fprintln(os.Stderr, "bench: -rounds ≥ 1, -round > 0, -handoffs ≥ 2, -ttl ≥ 1s and -handoff-ttl ≥ 100ms")
		os.Exit(2)
	}
	ctx := context.Background()
	commit := "durable commits"
	if *async {
		commit = "synchronous_commit off"
	}
	fmt.Printf("PostgreSQL, %s; %d CPUs; load average %s\n", commit, runtime.NumCPU(), peer.Loadavg())
	if *only == "" || *only == "throughput" {
		// leasehold first: its warm-up runs the migration that creates the floor's functions.
		libs := []peer.Lib{leaseholdGo(*ttl), floor(), pgLock(*ttl), advisory()}
		rs, closeAll := peer.Runners(ctx, libs, "tp")
		peer.Throughput(rs, *rounds, *roundTime, 1, 2)
		closeAll()
	}
	if *only == "" || *only == "handoff" {
		peer.HandoffAll(ctx, []peer.Lib{leaseholdGo(*handoffTTL), pgLock(*handoffTTL)}, *handoffs, *holdFor, *handoffTTL, nil)
	}
	fmt.Printf("load average at the end %s\n", peer.Loadavg())
}

func leaseholdGo(ttl time.Duration) peer.Lib {
	return peer.Leasehold("leasehold-go (PostgresExecutor)", ttl, func() (leasehold.Executor, error) {
		return leasehold.NewPostgresExecutor(*dsn, &leasehold.PostgresOptions{AsynchronousCommit: *async})
	})
}

// floor sends the protocol's two statements (leasehold_acquire, leasehold_release: what the
// core asks the executor to run for one acquire + release) on a pgx connection, with no
// library: what no client on this driver can beat.
func floor() peer.Lib {
	return peer.Lib{Name: "floor: the protocol's 2 statements on pgx", NewLocker: func(name string) (peer.LockFunc, func(), error) {
		c, err := pgx.Connect(context.Background(), *dsn)
		if err != nil {
			return nil, nil, err
		}
		acquire, release := "SELECT lh_granted, lh_fence, lh_remaining_ms FROM leasehold_acquire($1, $2, $3)",
			"SELECT leasehold_release($1, $2, $3)"
		if *async {
			acquire = "SELECT a.lh_granted, a.lh_fence, a.lh_remaining_ms FROM set_config('synchronous_commit', 'off', true) s, leasehold_acquire($1, $2, $3) a"
			release = "SELECT leasehold_release($1, $2, $3) FROM set_config('synchronous_commit', 'off', true) s"
		}
		const token = "00112233445566778899aabbccddeeff"
		lock := func(ctx context.Context) (func(context.Context) error, error) {
			var granted bool
			var fence int64
			var left *int64
			if err := c.QueryRow(ctx, acquire, name, token, ttl.Milliseconds()).Scan(&granted, &fence, &left); err != nil {
				return nil, err
			}
			if !granted {
				return nil, fmt.Errorf("floor: %s is taken", name)
			}
			return func(ctx context.Context) error {
				var released bool
				if err := c.QueryRow(ctx, release, name, token, "lh_bench").Scan(&released); err != nil {
					return err
				}
				if !released {
					return fmt.Errorf("floor: %s was not released", name)
				}
				return nil
			}, nil
		}
		return lock, func() { _ = c.Close(context.Background()) }, nil
	}}
}

// pgLock is cirello.io/pglock as its documentation shows it (Acquire, then Release; a
// heartbeat goroutine per held lock at a third of the lease), on pgx's database/sql driver
// (UnsafeNew: New accepts only lib/pq), so that every row uses the same driver.
func pgLock(ttl time.Duration) peer.Lib {
	return peer.Lib{Name: "cirello.io/pglock", NewLocker: func(name string) (peer.LockFunc, func(), error) {
		cfg, err := pgx.ParseConfig(*dsn)
		if err != nil {
			return nil, nil, err
		}
		if *async {
			cfg.RuntimeParams["synchronous_commit"] = "off"
		}
		db := stdlib.OpenDB(*cfg)
		c, err := pglock.UnsafeNew(db, pglock.WithLeaseDuration(ttl), pglock.WithHeartbeatFrequency(ttl/3),
			pglock.WithCustomTable("lh_bench_pglock"))
		if err != nil {
			_ = db.Close()
			return nil, nil, err
		}
		if err := c.TryCreateTable(); err != nil {
			_ = db.Close()
			return nil, nil, err
		}
		lock := func(ctx context.Context) (func(context.Context) error, error) {
			l, err := c.AcquireContext(ctx, name)
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context) error { return c.ReleaseContext(ctx, l) }, nil
		}
		return lock, func() { _ = db.Close() }, nil
	}}
}

// advisory is pg_try_advisory_lock + pg_advisory_unlock: what users reach for first (no TTL,
// no fence, nothing written); a reference, not a peer with the same guarantees.
func advisory() peer.Lib {
	return peer.Lib{Name: "pg_try_advisory_lock + unlock (no TTL, no fence)", NewLocker: func(name string) (peer.LockFunc, func(), error) {
		c, err := pgx.Connect(context.Background(), *dsn)
		if err != nil {
			return nil, nil, err
		}
		lock := func(ctx context.Context) (func(context.Context) error, error) {
			var ok bool
			if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtext($1))", name).Scan(&ok); err != nil {
				return nil, err
			}
			if !ok {
				return nil, fmt.Errorf("advisory: %s is taken", name)
			}
			return func(ctx context.Context) error {
				return c.QueryRow(ctx, "SELECT pg_advisory_unlock(hashtext($1))", name).Scan(&ok)
			}, nil
		}
		return lock, func() { _ = c.Close(context.Background()) }, nil
	}}
}
