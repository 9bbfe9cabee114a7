// Package peer is the harness the peer benchmarks share (etcd, postgres): interleaved
// throughput rounds with paired ratios, and a handoff run of one holder and 8 waiters, so
// that every library in a run is measured the same way on the same server.
package peer

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	leasehold "github.com/leasehold/leasehold/bindings/go"
)

// LockFunc takes the lock and returns what releases it.
type LockFunc func(ctx context.Context) (unlock func(context.Context) error, err error)

// Lib is one lock implementation: NewLocker returns a lock function for one process-like
// participant (its own connection), and the function that closes what it opened.
type Lib struct {
	Name      string
	NewLocker func(name string) (LockFunc, func(), error)
}

// Runner is one row of a throughput run: Round runs for about the round's length and
// returns the cycles done and the time they took. External marks a row measured in
// another process, whose CPU time this process cannot see.
type Runner struct {
	Name     string
	Round    func(d time.Duration) (cycles int, took time.Duration)
	External bool
}

// Leasehold is leasehold's row: a LockClient per participant on the executor that open
// makes (Acquire with a minute's wait, then Release).
func Leasehold(name string, ttl time.Duration, open func() (leasehold.Executor, error)) Lib {
	return Lib{Name: name, NewLocker: func(lockName string) (LockFunc, func(), error) {
		tr, err := open()
		if err != nil {
			return nil, nil, err
		}
		c, err := leasehold.NewLockClient(tr, nil)
		if err != nil {
			_ = tr.Close()
			return nil, nil, err
		}
		lock := func(ctx context.Context) (func(context.Context) error, error) {
			l, err := c.Acquire(ctx, lockName, leasehold.AcquireOptions{TTL: ttl, Wait: time.Minute})
			if err != nil {
				return nil, err
			}
			return l.Release, nil
		}
		return lock, func() { _ = c.Close(); _ = tr.Close() }, nil
	}}
}

// Cycles runs lock+unlock for d and returns the count.
func Cycles(ctx context.Context, lock LockFunc, d time.Duration) int {
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end); n++ {
		unlock, err := lock(ctx)
		Check(err)
		Check(unlock(ctx))
	}
	return n
}

// Runners opens one locker per library (warmed up: connections, schema, first lease) and
// returns its throughput rows and the function that closes them all.
func Runners(ctx context.Context, libs []Lib, prefix string) ([]Runner, func()) {
	var rs []Runner
	var closers []func()
	for i, l := range libs {
		lock, closeFn, err := l.NewLocker(fmt.Sprintf("%s-%d-%d", prefix, i, time.Now().UnixNano()))
		Check(err)
		closers = append(closers, closeFn)
		Cycles(ctx, lock, 300*time.Millisecond)
		rs = append(rs, Runner{Name: l.Name, Round: func(d time.Duration) (int, time.Duration) {
			t0 := time.Now()
			n := Cycles(ctx, lock, d)
			return n, time.Since(t0)
		}})
	}
	return rs, func() {
		for _, c := range closers {
			c()
		}
	}
}

// Throughput runs rounds interleaved rounds of every runner (in an order rotated each
// round, so a load burst weighs on all alike) and prints a markdown table: median ops/s,
// range, the paired ratio (median over rounds of runner_i / reference_i) to each of refs,
// and this process's CPU time per cycle.
func Throughput(rs []Runner, rounds int, d time.Duration, refs ...int) {
	rates := make([][]float64, len(rs))
	cpus := make([][]float64, len(rs))
	for r := 0; r < rounds; r++ {
		for k := range rs {
			i := (k + r) % len(rs)
			c0 := CPU()
			n, took := rs[i].Round(d)
			rates[i] = append(rates[i], float64(n)/took.Seconds())
			cpus[i] = append(cpus[i], float64(CPU()-c0)/float64(time.Microsecond)/float64(max(n, 1)))
		}
		fmt.Fprintf(os.Stderr, "round %d/%d done\n", r+1, rounds)
	}
	fmt.Printf("\nuncontended lock+unlock, %d interleaved rounds of %s (ops/s)\n", rounds, d)
	head, line := "| library | median | min–max |", "|---|---:|---:|"
	for _, ref := range refs {
		head += fmt.Sprintf(" paired ratio to %s |", rs[ref].Name)
		line += "---:|"
	}
	fmt.Printf("%s CPU here per cycle (µs) |\n%s---:|\n", head, line)
	for i, x := range rs {
		row := fmt.Sprintf("| %s | %.0f | %.0f–%.0f |", x.Name, Median(rates[i]), Pct(rates[i], 0), Pct(rates[i], 100))
		for _, ref := range refs {
			ratios := make([]float64, rounds)
			for r := range ratios {
				ratios[r] = rates[i][r] / rates[ref][r]
			}
			row += fmt.Sprintf(" %.2f× |", Median(ratios))
		}
		if x.External {
			row += " |"
		} else {
			row += fmt.Sprintf(" %.0f |", Median(cpus[i]))
		}
		fmt.Println(row)
	}
}

// Handoff runs 9 participants (a holder and 8 waiters, each with its own locker) on one
// name until n handoffs were timed: from the start of a holder's unlock to the next
// holder's lock returning. Each holder keeps the lock for hold, and asks for it again only
// once another participant holds it, so every handoff goes to a waiter: a library that lets
// the releaser take its lock straight back (barging) is not timed on that. Each participant
// starts at a random moment within stagger, so the waiters of a library that polls do not
// all poll in step (which would time one poll's round trip, not the poll interval).
func Handoff(ctx context.Context, l Lib, n int, hold, stagger time.Duration) (samples, releases []time.Duration) {
	const participants = 9
	name := fmt.Sprintf("h-%d", time.Now().UnixNano())
	var (
		mu          sync.Mutex
		taken       = sync.NewCond(&mu)
		grants      int // lock calls returned so far
		started     int // participants that called lock
		lastRelease time.Time
		done        bool
		wg          sync.WaitGroup
	)
	for g := 0; g < participants; g++ {
		lock, closeFn, err := l.NewLocker(name)
		Check(err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer closeFn()
			if stagger > 0 {
				time.Sleep(rand.N(stagger))
			}
			mu.Lock()
			started++
			mu.Unlock()
			for {
				unlock, err := lock(ctx)
				now := time.Now()
				Check(err)
				mu.Lock()
				grants++
				if !lastRelease.IsZero() && !done {
					samples = append(samples, now.Sub(lastRelease))
					done = len(samples) >= n
				}
				stop := done
				mine := grants
				taken.Broadcast()
				mu.Unlock()
				time.Sleep(hold)
				mu.Lock()
				t0 := time.Now()
				lastRelease = t0
				if started < participants { // nobody may be waiting yet: not a handoff
					lastRelease = time.Time{}
				}
				mu.Unlock()
				Check(unlock(ctx))
				mu.Lock()
				if !stop {
					releases = append(releases, time.Since(t0))
				}
				for !stop && !done && grants == mine {
					taken.Wait()
				}
				mu.Unlock()
				if stop {
					return
				}
			}
		}()
	}
	wg.Wait()
	return samples, releases
}

// External is a row measured in another process (a Python client): Run times n handoffs
// and returns them in milliseconds.
type External struct {
	Name string
	Run  func(n int) []float64
}

// HandoffAll measures every library (and ext, if not nil) in two interleaved halves of n
// handoffs (Handoff) and prints a markdown table: p50 and p99 of the handoff, and p50 of
// the release call alone.
func HandoffAll(ctx context.Context, libs []Lib, n int, hold, stagger time.Duration, ext *External) {
	samples := make([][]time.Duration, len(libs))
	releases := make([][]time.Duration, len(libs))
	var extSamples []float64
	half := n / 2
	for h := 0; h < 2; h++ {
		for i, l := range libs {
			s, r := Handoff(ctx, l, half, hold, stagger)
			samples[i] = append(samples[i], s...)
			releases[i] = append(releases[i], r...)
		}
		if ext != nil {
			extSamples = append(extSamples, ext.Run(half)...)
		}
	}
	fmt.Printf("\nhandoff latency, 1 holder + 8 waiters each with its own connection, holder keeps the lock %s (release call → next holder's lock returning)\n", hold)
	fmt.Println("| library | handoffs | p50 ms | p99 ms | the release call alone, p50 ms |\n|---|---:|---:|---:|---:|")
	for i, l := range libs {
		ms := Ms(samples[i])
		fmt.Printf("| %s | %d | %.2f | %.2f | %.2f |\n", l.Name, len(ms), Pct(ms, 50), Pct(ms, 99), Pct(Ms(releases[i]), 50))
	}
	if ext != nil {
		fmt.Printf("| %s | %d | %.2f | %.2f | |\n", ext.Name, len(extSamples), Pct(extSamples, 50), Pct(extSamples, 99))
	}
}

// Ms turns durations into milliseconds.
func Ms(ds []time.Duration) []float64 {
	ms := make([]float64, len(ds))
	for k, d := range ds {
		ms[k] = float64(d.Microseconds()) / 1000
	}
	return ms
}

// CPU is this process's CPU time (user + system): the host's share of a cycle, which the
// machine's load inflates less than the wall clock.
func CPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Loadavg is the first three fields of /proc/loadavg, printed beside a run.
func Loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// Median is the nearest-rank 50th percentile.
func Median(xs []float64) float64 { return Pct(xs, 50) }

// Pct is the nearest-rank percentile (0: the minimum, 100: the maximum).
func Pct(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	k := int(math.Ceil(p/100*float64(len(s)))) - 1
	if k < 0 {
		k = 0
	}
	return s[k]
}

// Check ends the run on an error: a benchmark that goes on after a failed cycle measures
// something else.
func Check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
