// Command historyworker is the Go workload client of the history harness
// (tests/histories/README.md): it acquires one name in a loop through the
// binding's public API, writes through the fencing gate (workload lock-set),
// releases, and appends every operation to a JSON-lines history.
//
//	historyworker --backend URL --name NAME --process ID --history FILE
//	    [--workload lock-set|lock] [--unfenced] [--gate URL]
//	    [--ttl-ms N] [--wait-ms N] [--hold-ms N] [--duration-ms N] [--ops N] [--seed N]
//	    [--write-hold-ms N] [--clock-step-at-ms N --clock-step-ms N]
//
// Exit status: 0 done (also after SIGTERM), 1 runtime error, 2 bad usage,
// 3 unsupported backend, gate or clock step (the Go binding has no
// injectable clock in its public options).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	leasehold "github.com/leasehold/leasehold/bindings/go"
)

// valueBase spaces the values of processes: process index * valueBase + counter.
const valueBase = 1_000_000_000

func fatal(code int, format string, a ...any) {
	fmt.Fprintf(os.Stderr, "historyworker: "+format+"\n", a...)
	os.Exit(code)
}

var errUnsupportedBackend = errors.New("unsupported backend")

// hostPorts splits "h:p,h:p" (the part of a URL after the scheme).
func hostPorts(s string) []string {
	var out []string
	for _, hp := range strings.Split(s, ",") {
		if hp = strings.TrimSpace(hp); hp != "" {
			out = append(out, hp)
		}
	}
	return out
}

// transport opens the backend named by url through the binding's constructors.
func transport(url string) (leasehold.Transport, error) {
	switch {
	case strings.HasPrefix(url, "sqlite://"):
		return leasehold.NewSQLiteTransport(strings.TrimPrefix(url, "sqlite://"), nil)
	case strings.HasPrefix(url, "redis://"), strings.HasPrefix(url, "rediss://"),
		strings.HasPrefix(url, "redis+sentinel://"), strings.HasPrefix(url, "redis+cluster://"):
		// What a Redis URL opens for a user: the core on the wire, net moving its bytes.
		return leasehold.NewExecutor(url, nil)
	case strings.HasPrefix(url, "postgresql://"), strings.HasPrefix(url, "postgres://"):
		return leasehold.NewPostgresTransport(url)
	case strings.HasPrefix(url, "etcd://"):
		var urls []string
		for _, hp := range hostPorts(strings.TrimSuffix(strings.TrimPrefix(url, "etcd://"), "/")) {
			urls = append(urls, "http://"+hp)
		}
		if len(urls) == 0 {
			return nil, fmt.Errorf("bad etcd URL %q: etcd://host:port[,host:port]", url)
		}
		return leasehold.NewEtcdTransport(urls, nil)
	}
	return nil, errUnsupportedBackend
}

// lostReason names a loss the way every worker does: rejected, expired, fail_budget.
func lostReason(err error) string {
	var le *leasehold.LostError
	if !errors.As(err, &le) {
		return err.Error()
	}
	switch r := le.Reason; {
	case strings.Contains(r, "reject"):
		return "rejected"
	case strings.Contains(r, "budget"):
		return "fail_budget"
	case strings.Contains(r, "expire"):
		return "expired"
	default:
		return r
	}
}

type config struct {
	backend, name, process, historyPath, workload, gate string
	unfenced                                            bool
	ttl, wait, hold, duration, writeHold                time.Duration
	ops                                                 int
	seed                                                int64
	index                                               int64
}

func parseFlags() config {
	var c config
	var ttl, wait, hold, duration, writeHold, stepAt, step int64
	fs := flag.NewFlagSet("historyworker", flag.ContinueOnError)
	fs.StringVar(&c.backend, "backend", "", "lock backend URL")
	fs.StringVar(&c.name, "name", "", "lock name (and resource)")
	fs.StringVar(&c.process, "process", "", "process ID, ending in its index (go-2)")
	fs.StringVar(&c.historyPath, "history", "", "history file (appended)")
	fs.StringVar(&c.workload, "workload", "lock-set", "lock-set or lock")
	fs.BoolVar(&c.unfenced, "unfenced", false, "write without the gate (control runs)")
	fs.StringVar(&c.gate, "gate", "", "fenced resource URL: postgresql://… or sqlite:///path")
	fs.Int64Var(&ttl, "ttl-ms", 1000, "lease TTL")
	fs.Int64Var(&wait, "wait-ms", 2000, "acquire wait")
	fs.Int64Var(&hold, "hold-ms", 20, "each sleep is random in [0, hold-ms]")
	fs.Int64Var(&duration, "duration-ms", 5000, "run this long (0: no limit)")
	fs.Int64Var(&writeHold, "write-hold-ms", 0, "sleep inside the write transaction, between read and insert")
	fs.IntVar(&c.ops, "ops", 0, "stop after this many iterations (0: no limit)")
	fs.Int64Var(&c.seed, "seed", 1, "random seed")
	fs.Int64Var(&stepAt, "clock-step-at-ms", 0, "step the lease clock at this time")
	fs.Int64Var(&step, "clock-step-ms", 0, "step the lease clock forward this much")
	if err := fs.Parse(os.Args[1:]); errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	} else if err != nil {
		os.Exit(2)
	}
	stepAsked := false
	fs.Visit(func(f *flag.Flag) { stepAsked = stepAsked || strings.HasPrefix(f.Name, "clock-step") })
	if fs.NArg() != 0 {
		fatal(2, "unexpected arguments %q", fs.Args())
	}
	if c.backend == "" || c.name == "" || c.process == "" || c.historyPath == "" {
		fatal(2, "--backend, --name, --process and --history are required")
	}
	if c.workload != "lock-set" && c.workload != "lock" {
		fatal(2, "--workload must be lock-set or lock, not %q", c.workload)
	}
	if c.workload == "lock-set" && c.gate == "" {
		fatal(2, "--workload lock-set needs --gate")
	}
	if ttl <= 0 || wait < 0 || hold < 0 || duration < 0 || writeHold < 0 || c.ops < 0 {
		fatal(2, "--ttl-ms must be positive; --wait-ms, --hold-ms, --write-hold-ms, --duration-ms and --ops not negative")
	}
	m := regexp.MustCompile(`(\d+)$`).FindString(c.process)
	if m == "" {
		fatal(2, "--process %q must end in the process index (go-2)", c.process)
	}
	c.index, _ = strconv.ParseInt(m, 10, 64)
	if c.index > 9_000_000_000 {
		fatal(2, "--process index %d too large", c.index)
	}
	if stepAsked {
		fatal(3, "unsupported clock step: the Go binding has no injectable clock in its public options")
	}
	c.ttl, c.wait, c.hold, c.duration, c.writeHold = ms(ttl), ms(wait), ms(hold), ms(duration), ms(writeHold)
	return c
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// sleep waits d, or less when the worker is told to stop.
func sleep(stop context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop.Done():
	}
}

func main() {
	c := parseFlags()
	tr, err := transport(c.backend)
	if errors.Is(err, errUnsupportedBackend) {
		fatal(3, "unsupported backend %q", c.backend)
	} else if err != nil {
		fatal(1, "backend: %v", err)
	}
	var st store
	if c.workload == "lock-set" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err = openStore(ctx, c.gate, c.unfenced, c.writeHold)
		cancel()
		if errors.Is(err, errUnsupportedGate) {
			fatal(3, "unsupported gate %q", c.gate)
		} else if err != nil {
			fatal(1, "gate: %v", err)
		}
		defer st.close()
	}
	h, err := openHistory(c.historyPath, c.process, c.name)
	if err != nil {
		fatal(1, "history: %v", err)
	}
	client, err := leasehold.NewClient(tr, nil)
	if err != nil {
		fatal(1, "client: %v", err)
	}
	stop, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	h.rec(entry{Type: "info", F: "start"})
	w := worker{c: c, h: h, client: client, st: st, stop: stop,
		rng:     rand.New(rand.NewPCG(uint64(c.seed), uint64(c.index))),
		counter: lastCounter(c.historyPath, c.index)}
	w.loop()
	_ = client.Close()
	if cl, ok := tr.(io.Closer); ok {
		_ = cl.Close()
	}
	h.rec(entry{Type: "info", F: "stop"})
}

type worker struct {
	c       config
	h       *history
	client  *leasehold.Client
	st      store
	stop    context.Context
	rng     *rand.Rand
	counter int64
}

func (w *worker) pause() {
	if w.c.hold > 0 {
		sleep(w.stop, time.Duration(w.rng.Int64N(int64(w.c.hold)+1)))
	}
}

func (w *worker) loop() {
	start := time.Now()
	for i := 0; w.c.ops == 0 || i < w.c.ops; i++ {
		if w.stop.Err() != nil || (w.c.duration > 0 && time.Since(start) >= w.c.duration) {
			return
		}
		w.iteration()
	}
}

// iteration is one acquire, [write,] release.
func (w *worker) iteration() {
	w.h.rec(entry{Type: "invoke", F: "acquire"})
	l, err := w.client.Acquire(w.stop, w.c.name, leasehold.AcquireOptions{TTL: w.c.ttl, Wait: w.c.wait})
	if err != nil {
		switch {
		case w.stop.Err() != nil:
			// Cancelled by SIGTERM: a grant may have crossed the cancel.
			w.h.rec(entry{Type: "info", F: "acquire", Error: str("cancelled: " + err.Error())})
		case errors.Is(err, leasehold.ErrUnavailable):
			// The backend failed: a grant may have happened unseen.
			w.h.rec(entry{Type: "info", F: "acquire", Error: str(err.Error())})
			sleep(w.stop, 10*time.Millisecond)
		case errors.Is(err, leasehold.ErrNotAcquired), errors.Is(err, context.DeadlineExceeded):
			w.h.rec(entry{Type: "fail", F: "acquire", Error: str(err.Error())})
		default:
			w.h.rec(entry{Type: "info", F: "acquire", Error: str(err.Error())})
			sleep(w.stop, 10*time.Millisecond)
		}
		return
	}
	token := l.FencingToken()
	w.h.rec(entry{Type: "ok", F: "acquire", Token: u64(token), ValidUntil: i64(monoOf(l.ValidUntil()))})
	watched := make(chan struct{})
	go func() {
		// The loss signal: the lease's context is cancelled on loss,
		// release or Close; only a loss is recorded.
		defer close(watched)
		<-l.Context().Done()
		if cause := context.Cause(l.Context()); errors.Is(cause, leasehold.ErrLost) {
			w.h.rec(entry{Type: "info", F: "lost", Token: u64(token),
				ValidUntil: i64(monoOf(l.ValidUntil())), Error: str(lostReason(cause))})
		}
	}()
	w.pause()
	if w.st != nil && w.stop.Err() == nil {
		w.write(token, validity(l))
		w.pause()
	}
	w.h.rec(entry{Type: "invoke", F: "release", Token: u64(token), ValidUntil: validity(l)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second+w.c.ttl)
	err = l.Release(ctx)
	cancel()
	switch {
	case err == nil:
		w.h.rec(entry{Type: "ok", F: "release", Token: u64(token)})
	case errors.Is(err, leasehold.ErrLost):
		w.h.rec(entry{Type: "fail", F: "release", Token: u64(token), Error: str("lost")})
	case errors.Is(err, leasehold.ErrNotOwner):
		w.h.rec(entry{Type: "fail", F: "release", Token: u64(token), Error: str("not_owner")})
	default:
		w.h.rec(entry{Type: "info", F: "release", Token: u64(token), Error: str(err.Error())})
	}
	<-watched
}

// validity is the lease's current validity on CLOCK_MONOTONIC, nil when the
// binding says it is not held (lost, or its validity ran out).
func validity(l *leasehold.Lease) *int64 {
	if !l.IsHeld() {
		return nil
	}
	return i64(monoOf(l.ValidUntil()))
}

// write is the read-modify-write of the resource with the lease's token.
func (w *worker) write(token uint64, validUntil *int64) {
	w.counter++
	value := w.c.index*valueBase + w.counter
	w.h.rec(entry{Type: "invoke", F: "write", Token: u64(token), ValidUntil: validUntil, Value: i64(value)})
	// Not bound by SIGTERM: a started write finishes and its outcome is known.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second+w.c.ttl)
	read, err := w.st.write(ctx, w.c.name, token, value)
	cancel()
	switch {
	case err == nil:
		w.h.rec(entry{Type: "ok", F: "write", Token: u64(token), Value: i64(value), Read: i64(read)})
	case errors.Is(err, leasehold.ErrStaleToken):
		w.h.rec(entry{Type: "fail", F: "write", Token: u64(token), Value: i64(value), Error: str("stale")})
	default:
		// Unknown outcome: the commit may have happened.
		w.h.rec(entry{Type: "info", F: "write", Token: u64(token), Value: i64(value), Error: str(err.Error())})
	}
}
