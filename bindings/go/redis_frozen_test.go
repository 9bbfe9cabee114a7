package leasehold

// A holder frozen (SIGSTOP) after the lock went round several processes is
// taken over when its grant runs out, whatever the queue looked like.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// handoffWorker runs until killed: acquire name (1s TTL, renewed
// automatically, waiting up to 10s), print "ACQUIRED <fence> <monotonic ns>"
// (CLOCK_MONOTONIC, one clock for every process of the machine),
// hold it 30ms, print "RELEASING <fence>", release, and give a waiter its
// turn (20ms) before asking again. A wait that runs out prints "TIMEOUT".
func handoffWorker(ctx context.Context, c *Client, name string) error {
	for {
		l, err := c.Acquire(ctx, name, AcquireOptions{TTL: time.Second, Wait: 10 * time.Second})
		if errors.Is(err, ErrNotAcquired) {
			fmt.Println("TIMEOUT", monotonicNs())
			continue
		}
		if err != nil {
			return err
		}
		fmt.Println("ACQUIRED", l.FencingToken(), monotonicNs())
		time.Sleep(30 * time.Millisecond)
		fmt.Println("RELEASING", l.FencingToken())
		if err := l.Release(ctx); err != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond) // a release then an instant acquire would barge
	}
}

// processStopped: the process is in the stopped state (the SIGSTOP took effect).
func processStopped(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] == "T"
}

type handoffEvent struct {
	worker int
	fields []string
}

// TestRedisFrozenHolderAfterHandoffsTakenOverAtExpiry: four processes hand a
// 1s lock round (each acquire waits up to 10s, holds 30ms, releases); the
// process holding it is then stopped (SIGSTOP: its renewals stop too).
// Another must get the lock within TTL + 1s of the frozen holder's grant,
// with a higher fence, not when its own 10s wait runs out.
func TestRedisFrozenHolderAfterHandoffsTakenOverAtExpiry(t *testing.T) {
	needRedis(t)
	const workers, warmUp = 4, 12
	const ttl = time.Second
	name := uniq(t, "frozen-holder")
	// Every worker opens a fencing store, unused here; made before they start, so that four
	// processes do not race to create one file (its WAL switch can fail with "database is locked").
	db := filepath.Join(t.TempDir(), "unused.db")
	store, _, err := setupDB(context.Background(), db, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = store.Close()
	events := make(chan handoffEvent, 1024)
	var procs []*workerProc
	for i := 0; i < workers; i++ {
		w := startWorker(t, "handoff", fmt.Sprintf("handoff-%d", i), db, []string{name}, 0)
		procs = append(procs, w)
		go func(i int, w *workerProc) {
			for {
				line, err := w.out.ReadString('\n')
				if err != nil {
					events <- handoffEvent{i, []string{"EOF"}}
					return
				}
				events <- handoffEvent{i, strings.Fields(line)}
			}
		}(i, w)
	}
	fail := func(format string, args ...any) {
		t.Helper()
		for i, w := range procs { // the workers may be running: stop them before reading stderr
			_ = w.cmd.Process.Signal(syscall.SIGCONT)
			_ = w.cmd.Process.Kill()
			_ = w.cmd.Wait()
			t.Logf("worker %d stderr: %s", i, w.stderr.String())
		}
		t.Fatalf(format, args...)
	}
	// Before the freeze a wait that runs out is a failure; after it, its worker retries.
	frozen := -1
	next := func(until time.Time) (handoffEvent, bool) {
		select {
		case ev := <-events:
			if ev.fields[0] == "EOF" || (ev.fields[0] == "TIMEOUT" && frozen < 0) {
				fail("worker %d: %v", ev.worker, ev.fields)
			}
			return ev, true
		case <-time.After(time.Until(until)):
			return handoffEvent{}, false
		}
	}
	type grant struct {
		worker int
		fence  uint64
	}
	var grants []grant
	seen := map[int]bool{}
	frozenFence, frozenAt := uint64(0), int64(0)
	deadline := time.Now().Add(2 * time.Minute)
	for frozen < 0 {
		ev, ok := next(deadline)
		if !ok {
			fail("no freeze within 2 minutes; grants %v", grants)
		}
		if ev.fields[0] != "ACQUIRED" {
			continue
		}
		fence, _ := strconv.ParseUint(ev.fields[1], 10, 64)
		at, _ := strconv.ParseInt(ev.fields[2], 10, 64)
		if n := len(grants); n > 0 && fence <= grants[n-1].fence {
			fail("fences went backwards: %v then %d", grants[n-1], fence)
		}
		handed := len(grants) > 0 && grants[len(grants)-1].worker != ev.worker
		grants = append(grants, grant{ev.worker, fence})
		seen[ev.worker] = true
		// Freeze a holder that got the lock through a handoff, once every worker had it.
		if !handed || len(grants) < warmUp || len(seen) < workers {
			continue
		}
		p := procs[ev.worker].cmd.Process
		if err := p.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the worker stopped", func() bool { return processStopped(p.Pid) })
		// Its last lines reach us; if it printed RELEASING before the stop took
		// effect, it was too late: resume it and try with a later grant.
		missed := false
		settle := time.Now().Add(100 * time.Millisecond)
		for {
			e, ok := next(settle)
			if !ok {
				break
			}
			switch {
			case e.worker == ev.worker && e.fields[0] == "RELEASING":
				missed = true
			case e.fields[0] == "ACQUIRED":
				f, _ := strconv.ParseUint(e.fields[1], 10, 64)
				grants = append(grants, grant{e.worker, f})
			}
		}
		if missed {
			if err := p.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if last := grants[len(grants)-1]; last != (grant{ev.worker, fence}) {
			fail("worker %d acquired (fence %d) while worker %d holds %d", last.worker, last.fence, ev.worker, fence)
		}
		frozen, frozenFence, frozenAt = ev.worker, fence, at
	}
	handoffs := 0
	for i := 1; i < len(grants); i++ {
		if grants[i].worker != grants[i-1].worker {
			handoffs++
		}
	}
	// Wait past the waiters' 10s waits, so that a late takeover is measured too.
	var taker int
	var takerFence uint64
	var takenAt int64
	until := time.Now().Add(ttl + 15*time.Second)
	for takenAt == 0 {
		ev, ok := next(until)
		if !ok {
			fail("nobody took over from frozen worker %d (fence %d) within %v", frozen, frozenFence, ttl+15*time.Second)
		}
		if ev.worker == frozen {
			fail("the frozen worker said %v", ev.fields)
		}
		if ev.fields[0] == "ACQUIRED" {
			taker = ev.worker
			takerFence, _ = strconv.ParseUint(ev.fields[1], 10, 64)
			takenAt, _ = strconv.ParseInt(ev.fields[2], 10, 64)
		}
	}
	_ = procs[frozen].cmd.Process.Signal(syscall.SIGCONT)
	delay := time.Duration(takenAt - frozenAt)
	fmt.Printf("%d grants (%d handoffs between processes) before the freeze; worker %d frozen holding fence %d; "+
		"worker %d took over %v after that grant (fence %d)\n",
		len(grants), handoffs, frozen, frozenFence, taker, delay.Round(time.Millisecond), takerFence)
	if takerFence <= frozenFence {
		t.Fatalf("the takeover's fence %d is not above the frozen holder's %d", takerFence, frozenFence)
	}
	// Not before the frozen holder's grant ran out (its key's TTL starts a little
	// before the worker's report), and soon after it.
	if delay <= ttl-200*time.Millisecond || delay >= ttl+time.Second {
		t.Fatalf("taken over %v after the frozen holder's grant; want about the TTL (%v), under TTL + 1s", delay, ttl)
	}
}
