// Package leasehold is the Go binding of leasehold, a distributed-lock client
// whose lease logic (renewal cadence, local expiry with a drift margin,
// failure budget, backoff, reentrancy, fencing tokens) lives in a sans-IO
// Rust core reached through its C ABI (cgo, statically linked).
//
// A Client owns one core handle behind a mutex, one driver goroutine that
// feeds the core's timeouts, and a Transport that executes the core's
// commands: backend calls run off the driver (in their own goroutines, or on
// the goroutine of an Acquire/Release call that waits for that very call),
// so a hung backend never delays loss detection.
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
//	// every protected write (see Gate). lease.Renew(ctx) extends it now.
//
// A lock client can detect that it lost a lock; only the resource can
// enforce exclusivity, by checking the fencing token on every write: Gate
// does that for database/sql stores.
package leasehold
