// Package leasehold is the Go binding of leasehold, a distributed-lock client
// whose lease logic (renewal cadence, local expiry with a drift margin,
// failure budget, backoff, reentrancy, fencing tokens) and backend protocols
// live in a sans-IO Rust core reached through its C ABI (cgo, statically
// linked).
//
// The names are those of every leasehold binding: a LockClient runs on one
// Executor per backend (RedisExecutor or RedisStreamExecutor, SQLiteExecutor,
// PostgresExecutor, EtcdExecutor, MemoryExecutor), Acquire returns a Lease, and
// FencingGate checks fencing tokens at the resource. Open makes a LockClient from a
// backend URL (a Redis URL, Cluster included, on RedisStreamExecutor, where the core
// owns the wire; ExecutorOptions.GoRedis for go-redis); each New…Executor takes the
// backend's own client or address and an options struct.
//
// A LockClient owns one core handle behind a mutex and one driver goroutine
// that feeds the core's timeouts. The core speaks the backend's protocol (the
// in-process memory service's too) and asks for its IO through one seam; the
// LockClient, the same for every backend, only executes the requests,
// verbatim (on go-redis, database/sql with go-sqlite3, pgx v5, net/http, the
// memory service; RedisStreamExecutor moves the core's bytes on net), off the
// driver (in their own goroutines, started by the driver, or on the
// Acquire/Release call that waits for that very call, which returns by its own
// bound), so a hung backend never delays loss detection nor holds a caller past
// its deadline.
//
//	client, _ := leasehold.Open("redis://127.0.0.1:6379/0", nil) // or sqlite://, postgresql://, etcd://…
//	defer client.Close()
//
//	lease, err := client.Acquire(ctx, "reports", leasehold.AcquireOptions{TTL: 30 * time.Second, Wait: 5 * time.Second})
//	if errors.Is(err, leasehold.ErrNotAcquired) { ... }
//	defer lease.Release(context.Background()) // nil, ErrLost or ErrNotOwner: see Lease.Release
//	// lease.Context() is cancelled when the lease is lost or released:
//	// hand it to the critical section, and pass lease.FencingToken() to
//	// every protected write (see FencingGate). lease.Renew(ctx) extends it now.
//
// A lock client can detect that it lost a lock; only the resource can
// enforce exclusivity, by checking the fencing token on every write:
// FencingGate does that for database/sql stores, PostgresFencingGate for
// PostgreSQL on pgx.
package leasehold
