// Command crosslangworker is the Go worker of the cross-language contention
// test (tests/crosslang/README.md):
//
//	crosslangworker BACKEND NAME ROUNDS LOG TAG WORKERS [bytes]
//
// With bytes a Redis URL goes to the byte executor (the core owns the wire).
package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/bindings/go"
)

func transport(backend, path string) (leasehold.Executor, error) {
	if path == "bytes" {
		return leasehold.NewRedisStreamExecutor(backend, nil)
	}
	return leasehold.NewExecutor(backend, nil) // redis://, postgresql://, etcd://… as the other workers take them
}

// count is the number of log lines of one kind.
func count(log, kind string) int {
	b, _ := os.ReadFile(log)
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, kind+" ") {
			n++
		}
	}
	return n
}

// othersHadIt: others held the lock turns times since our last exit, or
// every other worker is done.
func othersHadIt(log, tag string, workers, turns int) bool {
	b, err := os.ReadFile(log)
	if err != nil {
		return true
	}
	done, others := 0, 0
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) > 1 && f[0] == "done":
			done++
		case len(f) > 1 && f[0] == "exit" && f[1] == tag:
			others = 0
		case len(f) > 1 && f[0] == "enter" && f[1] != tag:
			others++
		}
	}
	return done >= workers-1 || others >= turns
}

func run() error {
	if len(os.Args) != 7 && len(os.Args) != 8 {
		return fmt.Errorf("usage: crosslangworker BACKEND NAME ROUNDS LOG TAG WORKERS [bytes]")
	}
	path := ""
	if len(os.Args) == 8 {
		path = os.Args[7]
	}
	backend, name, log, tag := os.Args[1], os.Args[2], os.Args[4], os.Args[5]
	rounds, err := strconv.Atoi(os.Args[3])
	if err != nil {
		return err
	}
	workers, err := strconv.Atoi(os.Args[6])
	if err != nil {
		return err
	}
	f, err := os.OpenFile(log, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	tr, err := transport(backend, path)
	if err != nil {
		return err
	}
	c, err := leasehold.NewLockClient(tr, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx := context.Background()
	pid := os.Getpid()
	// Start together: each waits until every worker has its client.
	if _, err := fmt.Fprintf(f, "ready %s %d\n", tag, pid); err != nil {
		return err
	}
	for deadline := time.Now().Add(time.Minute); count(log, "ready") < workers && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	for i := 0; i < rounds; i++ {
		l, err := c.Acquire(ctx, name, leasehold.AcquireOptions{TTL: 10 * time.Second, Wait: time.Minute})
		if err != nil {
			return err
		}
		fence := l.FencingToken()
		// One write per line: O_APPEND keeps lines whole.
		if _, err := fmt.Fprintf(f, "enter %s %d %d\n", tag, pid, fence); err != nil {
			return err
		}
		time.Sleep(500 * time.Microsecond)
		if _, err := fmt.Fprintf(f, "exit %s %d %d\n", tag, pid, fence); err != nil {
			return err
		}
		if err := l.Release(ctx); err != nil {
			return fmt.Errorf("release: %w", err)
		}
		// Now and then let two others go first, so a FIFO queue changes its order.
		turns := 1
		if rand.IntN(10) < 3 {
			turns = 2
		}
		deadline := time.Now().Add(500 * time.Millisecond)
		for !othersHadIt(log, tag, workers, turns) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	_, err = fmt.Fprintf(f, "done %s %d\n", tag, pid)
	return err
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "crosslangworker:", err)
		os.Exit(1)
	}
}
