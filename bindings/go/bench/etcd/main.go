// Command etcd compares leasehold on etcd with etcd's own Go lock, concurrency.Mutex, on one
// cluster in one run (from this directory, after `cargo build --release` at the root):
//
//	go run . -members http://127.0.0.1:2379,http://127.0.0.1:22379,http://127.0.0.1:32379
//	go run . -members URLS -python ../../../python/.venv/bin/python   # Python's EtcdExecutor too
//
// It prints uncontended lock+unlock ops/s (interleaved rounds, median, range and the paired
// ratio to concurrency.Mutex), the Raft entries each lock+unlock appends (the members' raft
// index before and after), and handoff latency with 8 waiters (p50/p99). It lives in its own
// module so that the binding's module does not depend on etcd's client.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	leasehold "github.com/leasehold/leasehold/bindings/go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// lib is one lock implementation: newLocker returns a lock function for one process-like
// participant (its own connection), and close releases what it opened.
type lib struct {
	name      string
	newLocker func(name string) (lockFunc, func(), error)
}

type lockFunc func(ctx context.Context) (unlock func(context.Context) error, err error)

const ttl = 10 * time.Second

// floorLeaseTTL outlasts a run: the floors' one lease needs no keep-alive (it is revoked at
// their close).
const floorLeaseTTL = 3600

var (
	members    = flag.String("members", "", "comma-separated etcd client URLs (required)")
	rounds     = flag.Int("rounds", 7, "interleaved throughput rounds per library")
	roundTime  = flag.Duration("round", 2*time.Second, "length of one throughput round")
	handoffs   = flag.Int("handoffs", 200, "handoffs measured per library (in two interleaved halves)")
	holdFor    = flag.Duration("hold", 10*time.Millisecond, "how long each holder keeps the lock in the handoff run")
	python     = flag.String("python", "", "a Python with leasehold installed: also measure EtcdExecutor (bindings/python/bench/bench_etcd.py)")
	only       = flag.String("only", "", "throughput or handoff (default: both)")
	pyScript   = flag.String("python-script", "", "path of bench_etcd.py (default: found from this directory)")
	commitsOps = flag.Int("commit-ops", 50, "lock+unlock cycles over which Raft entries are counted")
)

func main() {
	flag.Parse()
	if *members == "" {
		fmt.Fprintln(os.Stderr, "usage: go run . -members URL,URL,URL [-python PATH]")
		os.Exit(2)
	}
	urls := strings.Split(*members, ",")
	if *python != "" && *pyScript == "" {
		wd, _ := os.Getwd()
		*pyScript = filepath.Join(wd, "..", "..", "..", "python", "bench", "bench_etcd.py")
	}
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: urls, DialTimeout: 5 * time.Second})
	check(err)
	defer cli.Close()

	libs := []lib{leaseholdGo(urls), mutexShared(urls), mutexPerLock(urls), floorGRPC(urls), floorGateway(urls)}
	fmt.Printf("etcd cluster %s; %d CPUs; load average %s\n", *members, runtime.NumCPU(), loadavg())
	if *only == "" || *only == "throughput" {
		throughput(ctx, libs)
		raftEntries(ctx, cli, libs)
	}
	if *only == "" || *only == "handoff" {
		handoffAll(ctx, libs[:2]) // the floors do not wait
		commitWatch(ctx, urls)
	}
	fmt.Printf("load average at the end %s\n", loadavg())
}

func leaseholdGo(urls []string) lib {
	return lib{"leasehold-go (EtcdExecutor)", func(name string) (lockFunc, func(), error) {
		tr, err := leasehold.NewEtcdExecutor(urls, nil)
		if err != nil {
			return nil, nil, err
		}
		c, err := leasehold.NewLockClient(tr, nil)
		if err != nil {
			return nil, nil, err
		}
		lock := func(ctx context.Context) (func(context.Context) error, error) {
			l, err := c.Acquire(ctx, name, leasehold.AcquireOptions{TTL: ttl, Wait: time.Minute})
			if err != nil {
				return nil, err
			}
			return l.Release, nil
		}
		return lock, func() { _ = c.Close(); _ = tr.Close() }, nil
	}}
}

// mutexShared is concurrency.Mutex as its documentation shows it: one session (one lease,
// kept alive) per process, a Mutex per lock.
func mutexShared(urls []string) lib {
	return lib{"concurrency.Mutex (a session per process)", func(name string) (lockFunc, func(), error) {
		cli, err := clientv3.New(clientv3.Config{Endpoints: urls, DialTimeout: 5 * time.Second})
		if err != nil {
			return nil, nil, err
		}
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(ttl/time.Second)))
		if err != nil {
			return nil, nil, err
		}
		lock := func(ctx context.Context) (func(context.Context) error, error) {
			m := concurrency.NewMutex(s, "/bench-mutex/"+name)
			if err := m.Lock(ctx); err != nil {
				return nil, err
			}
			return m.Unlock, nil
		}
		return lock, func() { _ = s.Close(); _ = cli.Close() }, nil
	}}
}

// mutexPerLock gives each lock its own session (lease): a lease granted and revoked around
// every lock, the Mutex's protocol.
func mutexPerLock(urls []string) lib {
	return lib{"concurrency.Mutex (a session per lock)", func(name string) (lockFunc, func(), error) {
		cli, err := clientv3.New(clientv3.Config{Endpoints: urls, DialTimeout: 5 * time.Second})
		if err != nil {
			return nil, nil, err
		}
		lock := func(ctx context.Context) (func(context.Context) error, error) {
			s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(ttl/time.Second)))
			if err != nil {
				return nil, err
			}
			m := concurrency.NewMutex(s, "/bench-mutex/"+name)
			if err := m.Lock(ctx); err != nil {
				_ = s.Close()
				return nil, err
			}
			return func(ctx context.Context) error {
				err := m.Unlock(ctx)
				if cerr := s.Close(); err == nil {
					err = cerr
				}
				return err
			}, nil
		}
		return lock, func() { _ = cli.Close() }, nil
	}}
}

// floorGRPC sends leasehold's two requests per lock+unlock (a put-if-absent transaction
// bound to a lease granted once, that also reads the queue's first key; a delete of the key)
// on clientv3's gRPC connection, with no lock library: what those two Raft commits cost.
func floorGRPC(urls []string) lib {
	return lib{"floor: leasehold's 2 requests on clientv3 (gRPC)", func(name string) (lockFunc, func(), error) {
		cli, err := clientv3.New(clientv3.Config{Endpoints: urls, DialTimeout: 5 * time.Second})
		if err != nil {
			return nil, nil, err
		}
		g, err := cli.Grant(context.Background(), floorLeaseTTL)
		if err != nil {
			return nil, nil, err
		}
		key, prefix := "/bench-floor/"+name+"/owner", "/bench-floor/"+name+"/"
		lock := func(ctx context.Context) (func(context.Context) error, error) {
			r, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
				Then(clientv3.OpPut(key, "", clientv3.WithLease(g.ID)), clientv3.OpGet(prefix, clientv3.WithFirstCreate()...)).
				Else(clientv3.OpGet(prefix, clientv3.WithFirstCreate()...)).Commit()
			if err != nil {
				return nil, err
			}
			if !r.Succeeded {
				return nil, fmt.Errorf("floor: %s is taken", key)
			}
			return func(ctx context.Context) error { _, err := cli.Delete(ctx, key); return err }, nil
		}
		return lock, func() { _, _ = cli.Revoke(context.Background(), g.ID); _ = cli.Close() }, nil
	}}
}

// floorGateway sends the same two requests as JSON over etcd's HTTP gateway with
// net/http, as leasehold's EtcdTransport does, without the core.
func floorGateway(urls []string) lib {
	return lib{"floor: the same 2 requests on the JSON gateway (net/http)", func(name string) (lockFunc, func(), error) {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
		b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
		key, prefix := b64("/bench-floor-gw/"+name+"/owner"), "/bench-floor-gw/"+name+"/"
		end := b64(prefix[:len(prefix)-1] + "0")
		post := func(ctx context.Context, path string, body any, out any) error {
			b, _ := json.Marshal(body)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, urls[0]+path, bytes.NewReader(b))
			if err != nil {
				return err
			}
			resp, err := hc.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			data, err := io.ReadAll(resp.Body)
			if err != nil {
				return err
			}
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("floor: %s: %s", path, data)
			}
			return json.Unmarshal(data, out)
		}
		var g struct{ ID string }
		if err := post(context.Background(), "/v3/lease/grant", map[string]any{"TTL": floorLeaseTTL}, &g); err != nil {
			return nil, nil, err
		}
		lock := func(ctx context.Context) (func(context.Context) error, error) {
			first := map[string]any{"request_range": map[string]any{"key": b64(prefix), "range_end": end, "sort_order": "ASCEND", "sort_target": "CREATE", "limit": 1}}
			var r struct {
				Succeeded bool `json:"succeeded"`
			}
			if err := post(ctx, "/v3/kv/txn", map[string]any{
				"compare": []any{map[string]any{"key": key, "target": "CREATE", "create_revision": "0"}},
				"success": []any{map[string]any{"request_put": map[string]any{"key": key, "value": "", "lease": g.ID}}, first},
				"failure": []any{first},
			}, &r); err != nil {
				return nil, err
			}
			if !r.Succeeded {
				return nil, fmt.Errorf("floor: the gateway key is taken")
			}
			return func(ctx context.Context) error {
				var out map[string]any
				return post(ctx, "/v3/kv/deleterange", map[string]any{"key": key}, &out)
			}, nil
		}
		return lock, func() {
			var out map[string]any
			_ = post(context.Background(), "/v3/lease/revoke", map[string]any{"ID": g.ID}, &out)
			tr.CloseIdleConnections()
		}, nil
	}}
}

// cycles runs lock+unlock for d and returns the count.
func cycles(ctx context.Context, lock lockFunc, d time.Duration) int {
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end); n++ {
		unlock, err := lock(ctx)
		check(err)
		check(unlock(ctx))
	}
	return n
}

func throughput(ctx context.Context, libs []lib) {
	type runner struct {
		name  string
		round func() float64
	}
	var rs []runner
	for i, l := range libs {
		lock, closeFn, err := l.newLocker(fmt.Sprintf("tp-%d-%d", i, time.Now().UnixNano()))
		check(err)
		defer closeFn()
		cycles(ctx, lock, 300*time.Millisecond) // warm-up: connections, the first lease
		rs = append(rs, runner{l.name, func() float64 {
			t0 := time.Now()
			n := cycles(ctx, lock, *roundTime)
			return float64(n) / time.Since(t0).Seconds()
		}})
	}
	if *python != "" {
		rs = append(rs, runner{"leasehold-python (EtcdExecutor)", func() float64 {
			var out struct {
				OpsPerSec float64 `json:"ops_per_s"`
			}
			pyJSON(&out, "throughput", "--seconds", fmt.Sprint(roundTime.Seconds()))
			return out.OpsPerSec
		}})
	}
	res := make([][]float64, len(rs))
	for r := 0; r < *rounds; r++ {
		for i, x := range rs {
			res[i] = append(res[i], x.round())
		}
		fmt.Fprintf(os.Stderr, "round %d/%d done\n", r+1, *rounds)
	}
	ref := 1 // concurrency.Mutex with a session per process
	fmt.Printf("\nuncontended lock+unlock, %d interleaved rounds of %s (ops/s)\n", *rounds, *roundTime)
	fmt.Printf("| library | median | min–max | paired ratio to %s |\n|---|---:|---:|---:|\n", rs[ref].name)
	for i, x := range rs {
		ratios := make([]float64, *rounds)
		for r := range ratios {
			ratios[r] = res[i][r] / res[ref][r]
		}
		fmt.Printf("| %s | %.0f | %.0f–%.0f | %.2f× |\n", x.name, median(res[i]), minOf(res[i]), maxOf(res[i]), median(ratios))
	}
}

// raftEntries counts the Raft log entries one lock+unlock appends: the leader's raft index
// before and after n cycles, with nothing else writing.
func raftEntries(ctx context.Context, cli *clientv3.Client, libs []lib) {
	index := func() uint64 {
		var hi uint64
		for _, ep := range cli.Endpoints() {
			st, err := cli.Status(ctx, ep)
			check(err)
			if st.RaftIndex > hi {
				hi = st.RaftIndex
			}
		}
		return hi
	}
	fmt.Printf("\nRaft log entries per lock+unlock (raft index delta over %d cycles; nothing else writing)\n", *commitsOps)
	fmt.Println("| library | entries per cycle |\n|---|---:|")
	for i, l := range libs {
		lock, closeFn, err := l.newLocker(fmt.Sprintf("raft-%d-%d", i, time.Now().UnixNano()))
		check(err)
		cycles(ctx, lock, 100*time.Millisecond)
		time.Sleep(200 * time.Millisecond)
		before := index()
		for k := 0; k < *commitsOps; k++ {
			unlock, err := lock(ctx)
			check(err)
			check(unlock(ctx))
		}
		after := index()
		closeFn()
		fmt.Printf("| %s | %.2f |\n", l.name, float64(after-before)/float64(*commitsOps))
	}
	if *python != "" {
		var out struct {
			Entries float64 `json:"entries_per_cycle"`
		}
		pyJSON(&out, "raft", "--cycles", fmt.Sprint(*commitsOps))
		fmt.Printf("| leasehold-python (EtcdExecutor) | %.2f |\n", out.Entries)
	}
}

// handoffAll measures every library in two interleaved halves.
func handoffAll(ctx context.Context, libs []lib) {
	samples := make([][]time.Duration, len(libs))
	releases := make([][]time.Duration, len(libs))
	var pySamples []float64
	half := *handoffs / 2
	for h := 0; h < 2; h++ {
		for i, l := range libs {
			s, r := handoff(ctx, l, half)
			samples[i] = append(samples[i], s...)
			releases[i] = append(releases[i], r...)
		}
		if *python != "" {
			var out struct {
				Samples []float64 `json:"samples_ms"`
			}
			pyJSON(&out, "handoff", "--handoffs", fmt.Sprint(half), "--hold", fmt.Sprint(holdFor.Seconds()))
			pySamples = append(pySamples, out.Samples...)
		}
	}
	fmt.Printf("\nhandoff latency, 1 holder + 8 waiters each with its own connection, holder keeps the lock %s (release call → next holder's lock returning)\n", *holdFor)
	fmt.Println("| library | handoffs | p50 ms | p99 ms | the release call alone, p50 ms |\n|---|---:|---:|---:|---:|")
	toMS := func(ds []time.Duration) []float64 {
		ms := make([]float64, len(ds))
		for k, d := range ds {
			ms[k] = float64(d.Microseconds()) / 1000
		}
		return ms
	}
	for i, l := range libs {
		ms := toMS(samples[i])
		fmt.Printf("| %s | %d | %.2f | %.2f | %.2f |\n", l.name, len(ms), pct(ms, 50), pct(ms, 99), pct(toMS(releases[i]), 50))
	}
	if *python != "" {
		fmt.Printf("| leasehold-python (EtcdExecutor, a thread per waiter) | %d | %.2f | %.2f | |\n", len(pySamples), pct(pySamples, 50), pct(pySamples, 99))
	}
}

// commitWatch times the budget the issue sets for a handoff: one commit and one watch event.
// A key is deleted on one connection while another watches it; timed from the start of the
// delete to the watcher receiving the event, with the same idle pause as a handoff.
func commitWatch(ctx context.Context, urls []string) {
	w, err := clientv3.New(clientv3.Config{Endpoints: urls, DialTimeout: 5 * time.Second})
	check(err)
	defer w.Close()
	c, err := clientv3.New(clientv3.Config{Endpoints: urls, DialTimeout: 5 * time.Second})
	check(err)
	defer c.Close()
	key := fmt.Sprintf("/bench-watch/%d", time.Now().UnixNano())
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := w.Watch(wctx, key)
	ms := make([]float64, 0, *handoffs)
	for len(ms) < *handoffs {
		_, err := c.Put(ctx, key, "x")
		check(err)
		<-events // the put
		time.Sleep(*holdFor)
		t0 := time.Now()
		_, err = c.Delete(ctx, key)
		check(err)
		<-events
		ms = append(ms, float64(time.Since(t0).Microseconds())/1000)
	}
	fmt.Printf("| floor: one commit + its watch event (a delete on one connection → the event on another, clientv3) | %d | %.2f | %.2f | |\n", len(ms), pct(ms, 50), pct(ms, 99))
}

// handoff runs 9 participants (a holder and 8 waiters) on one name until n handoffs were
// timed: from the start of a holder's unlock to the next holder's lock returning.
func handoff(ctx context.Context, l lib, n int) (samples, releases []time.Duration) {
	const participants = 9
	name := fmt.Sprintf("h-%d", time.Now().UnixNano())
	var (
		mu          sync.Mutex
		lastRelease time.Time
		done        bool
		wg          sync.WaitGroup
	)
	for g := 0; g < participants; g++ {
		lock, closeFn, err := l.newLocker(name)
		check(err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer closeFn()
			for {
				unlock, err := lock(ctx)
				now := time.Now()
				check(err)
				mu.Lock()
				if !lastRelease.IsZero() && !done {
					samples = append(samples, now.Sub(lastRelease))
					done = len(samples) >= n
				}
				stop := done
				mu.Unlock()
				// Long enough for the previous holder to queue again: 8 wait.
				time.Sleep(*holdFor)
				mu.Lock()
				lastRelease = time.Now()
				t0 := lastRelease
				mu.Unlock()
				check(unlock(ctx))
				mu.Lock()
				if !stop {
					releases = append(releases, time.Since(t0))
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

// pyJSON runs one measurement of bench_etcd.py and decodes its last output line.
func pyJSON(v any, mode string, args ...string) {
	cmd := exec.Command(*python, append([]string{*pyScript, "--members", *members, "--json", mode}, args...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	check(err)
	var last string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if t := strings.TrimSpace(sc.Text()); t != "" {
			last = t
		}
	}
	check(json.Unmarshal([]byte(last), v))
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}

func median(xs []float64) float64 { return pct(xs, 50) }

// pct is the nearest-rank percentile.
func pct(xs []float64, p float64) float64 {
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

func minOf(xs []float64) float64 { return pct(xs, 0) }

func maxOf(xs []float64) float64 { return pct(xs, 100) }

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
