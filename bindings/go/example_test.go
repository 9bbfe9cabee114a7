package leasehold_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	leasehold "github.com/leasehold/leasehold/bindings/go"
)

// A lock on the in-process MemoryService: acquire, use the fencing token, release. With
// Redis, pass NewRedisExecutor(rdb, nil) instead.
func ExampleLockClient_Acquire() {
	client, err := leasehold.NewClient(leasehold.NewMemoryExecutor(), nil)
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
func ExampleLockClient_Acquire_contended() {
	server := leasehold.NewMemoryService()
	alice, _ := leasehold.NewClient(server.Executor(), nil)
	defer alice.Close()
	bob, _ := leasehold.NewClient(server.Executor(), nil)
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
	client, _ := leasehold.NewClient(leasehold.NewMemoryExecutor(), nil)
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

// Renew extends a lease now; with NoAutoRenew it is the only thing that does. On a released
// lease it fails at once, without a request.
func ExampleLease_Renew() {
	client, _ := leasehold.NewClient(leasehold.NewMemoryExecutor(), nil)
	defer client.Close()

	ctx := context.Background()
	lease, err := client.Acquire(ctx, "batch", leasehold.AcquireOptions{TTL: 10 * time.Second, NoAutoRenew: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	before := lease.ValidUntil()
	until, err := lease.Renew(ctx)
	fmt.Println("renewed:", err == nil, "validity moved:", until.After(before))
	_ = lease.Release(ctx)
	_, err = lease.Renew(ctx)
	fmt.Println("after release:", errors.Is(err, leasehold.ErrReleased))
	// Output:
	// renewed: true validity moved: true
	// after release: true
}

// Release tells what happened: nil for a clean release, ErrNotOwner when the service refused
// because the grant was no longer ours, ErrLost (a *LostError with the reason) when the lease
// had been lost.
func ExampleLease_Release() {
	server := leasehold.NewMemoryService()
	client, _ := leasehold.NewClient(server.Executor(), nil)
	defer client.Close()

	ctx := context.Background()
	opts := leasehold.AcquireOptions{TTL: 10 * time.Second}
	clean, _ := client.Acquire(ctx, "a", opts)
	fmt.Println("clean:", clean.Release(ctx))

	other, _ := leasehold.NewClient(server.Executor(), nil)
	defer other.Close()

	stolen, _ := client.Acquire(ctx, "b", opts)
	server.Expire("b") // our grant ran out on the service, and someone else took the lock
	_, _ = other.Acquire(ctx, "b", opts)
	err := stolen.Release(ctx)
	fmt.Println("not owner:", errors.Is(err, leasehold.ErrNotOwner))

	lost, _ := client.Acquire(ctx, "c", opts)
	server.Expire("c")
	_, _ = other.Acquire(ctx, "c", opts)
	_, _ = lost.Renew(ctx) // rejected: the lease is lost
	err = lost.Release(ctx)
	var le *leasehold.LostError
	fmt.Println("lost:", errors.Is(err, leasehold.ErrLost), errors.As(err, &le) && le.Reason != "")
	// Output:
	// clean: <nil>
	// not owner: true
	// lost: true true
}

// A LockClient on a backend named by its URL (sqlite://, redis://, postgresql://,
// etcd://, memory://…); Close also closes the executor Open made.
func ExampleOpen() {
	client, err := leasehold.Open("memory://", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	ctx := context.Background()
	lease, err := client.Acquire(ctx, "reports", leasehold.AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("held:", lease.IsHeld())
	_ = lease.Release(ctx)
	// Output:
	// held: true
}
