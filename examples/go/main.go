// Takes a lock on the embedded default, a SQLite file in the user's cache directory shared
// by every process on this host (the file the Python package and the leasehold CLI use by
// default; created 0600 in a 0700 directory when missing), prints its fencing token and
// releases it. With Redis, pass
// leasehold.NewRedisTransport(rdb) to NewClient instead.
//
//	cd examples/go && go run . [NAME]
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
	name := "example"
	if len(os.Args) > 1 {
		name = os.Args[1]
	}
	if err := run(name); err != nil {
		fmt.Fprintln(os.Stderr, "lock:", err)
		os.Exit(1)
	}
}

func run(name string) error {
	path, err := leasehold.DefaultSQLitePath()
	if err != nil {
		return err
	}
	tr, err := leasehold.NewSQLiteTransport(path, nil)
	if err != nil {
		return err
	}
	client, err := leasehold.NewClient(tr, nil)
	if err != nil {
		return err
	}
	defer client.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := client.Acquire(ctx, name, leasehold.AcquireOptions{TTL: 10 * time.Second, Wait: 5 * time.Second})
	if errors.Is(err, leasehold.ErrNotAcquired) {
		return fmt.Errorf("%q is held by another process: %w", name, err)
	} else if err != nil {
		return err
	}
	// Hand the token to every write the lock protects; the resource refuses older tokens.
	fmt.Printf("holding %q in %s: fencing token %d\n", name, path, lease.FencingToken())
	if err := lease.Release(ctx); err != nil {
		return err
	}
	fmt.Println("released")
	return nil
}
