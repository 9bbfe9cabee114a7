package leasehold_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	leasehold "github.com/leasehold/leasehold/bindings/go"
)

// A lock on the in-process MemoryServer: acquire, use the fencing token, release. With
// Redis, pass NewRedisTransport(rdb) instead.
func ExampleClient_Acquire() {
	client, err := leasehold.NewClient(leasehold.NewMemoryTransport(), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	ctx := context.Background()
	lease, err := client.Acquire(ctx, "reports", leasehold.AcquireOptions{TTL: 10 * time.Second, Wait: 5 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	// Every write the lock protects carries the token; the resource refuses older ones.
	fmt.Println("fencing token", lease.FencingToken())
	fmt.Println("held:", lease.IsHeld())
	if err := lease.Release(ctx); err != nil {
		fmt.Println(err)
	}
	fmt.Println("held after release:", lease.IsHeld())
	// Output:
	// fencing token 1
	// held: true
	// held after release: false
}

// Two clients on one service: the second gets ErrNotAcquired while the first holds the
// lock, then the lock with a larger fencing token.
func ExampleClient_Acquire_contended() {
	server := leasehold.NewMemoryServer()
	alice, _ := leasehold.NewClient(server.Transport(), nil)
	defer alice.Close()
	bob, _ := leasehold.NewClient(server.Transport(), nil)
	defer bob.Close()

	ctx := context.Background()
	opts := leasehold.AcquireOptions{TTL: 10 * time.Second}
	first, err := alice.Acquire(ctx, "orders", opts)
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = bob.Acquire(ctx, "orders", opts) // one attempt: alice holds it
	fmt.Println("bob while alice holds it, not acquired:", errors.Is(err, leasehold.ErrNotAcquired))

	_ = first.Release(ctx)
	second, err := bob.Acquire(ctx, "orders", leasehold.AcquireOptions{TTL: 10 * time.Second, Wait: 5 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer second.Release(ctx)
	fmt.Println("tokens:", first.FencingToken(), second.FencingToken())
	// Output:
	// bob while alice holds it, not acquired: true
	// tokens: 1 2
}

// A Lease's Context ends when the lease does, so work under the lock stops when the lock
// is lost or released.
func ExampleLease_Context() {
	client, _ := leasehold.NewClient(leasehold.NewMemoryTransport(), nil)
	defer client.Close()

	ctx := context.Background()
	lease, err := client.Acquire(ctx, "jobs", leasehold.AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	work := lease.Context()
	fmt.Println("before release:", work.Err())
	_ = lease.Release(ctx)
	<-work.Done()
	fmt.Println("after release:", work.Err())
	// Output:
	// before release: <nil>
	// after release: context canceled
}
