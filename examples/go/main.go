// Takes a lock, prints its fencing token and releases it. The backend is a URL
// (LEASEHOLD_BACKEND, as for the leasehold CLI: redis://…, postgresql://…, etcd://…);
// by default sqlite://, the embedded default: a SQLite file in the user's cache
// directory shared by every process on this host (the file the Python package and the
// CLI use; created 0600 in a 0700 directory when missing).
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
	backend := os.Getenv("LEASEHOLD_BACKEND")
	where := "the backend in LEASEHOLD_BACKEND" // its URL may hold a password: not printed
	if backend == "" {
		backend = "sqlite://"
		path, err := leasehold.DefaultSQLitePath()
		if err != nil {
			return err
		}
		where = path
	}
	client, err := leasehold.Open(backend, nil) // its Close closes the executor Open made
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
	fmt.Printf("holding %q in %s: fencing token %d\n", name, where, lease.FencingToken())
	if err := lease.Release(ctx); err != nil {
		return err
	}
	fmt.Println("released")
	return nil
}
