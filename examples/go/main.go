// Takes a lock, prints its fencing token and releases it, with the Go binding.
//
// The Go binding has no SQLite service yet (the embedded default is in the Python package), so
// this uses its in-process MemoryServer; with Redis, pass leasehold.NewRedisTransport(rdb).
//
//	cd examples/go && go run .
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	leasehold "github.com/leasehold/leasehold/bindings/go"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "lock:", err)
		os.Exit(1)
	}
}

func run() error {
	client, err := leasehold.NewClient(leasehold.NewMemoryTransport(), nil)
	if err != nil {
		return err
	}
	defer client.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := client.Acquire(ctx, "example", leasehold.AcquireOptions{TTL: 10 * time.Second, Wait: 5 * time.Second})
	if errors.Is(err, leasehold.ErrNotAcquired) {
		return fmt.Errorf("'example' is held by someone else: %w", err)
	} else if err != nil {
		return err
	}
	// Hand the token to every write the lock protects; the resource refuses older tokens.
	fmt.Printf("holding 'example': fencing token %d\n", lease.FencingToken())
	if err := lease.Release(ctx); err != nil {
		return err
	}
	fmt.Println("released")
	return nil
}
