// Package leasehold is the Go binding of leasehold, a distributed-lock client
// whose lease logic (renewal cadence, local expiry with a drift margin,
// failure budget, backoff, reentrancy, fencing tokens) lives in a sans-IO
// Rust core reached through its C ABI (cgo, statically linked).
//
// A LockClient owns one core handle behind a mutex and one driver goroutine
// that feeds the core's timeouts. With a RedisExecutor, SQLiteExecutor,
// PostgresExecutor or EtcdExecutor the core speaks the backend's protocol
// itself and the LockClient only executes its requests, verbatim (on go-redis,
// database/sql with go-sqlite3, pgx v5, net/http); with another Executor
// (MemoryExecutor) the LockClient calls the
// Executor's methods for the core's commands. Either way backend calls run
// off the driver (in their own goroutines, or on the goroutine of an
// Acquire/Release call that waits for that very call), so a hung backend
// never delays loss detection.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	tr, _ := leasehold.NewRedisTransport(rdb)
//	client, _ := leasehold.NewClient(tr, nil)
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
// enforce exclusivity, by checking the fencing token on every write: FencingGate
// does that for database/sql stores, PostgresFencingGate for PostgreSQL on pgx.
package leasehold
