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
	"strings"
	"time"

	leasehold "github.com/leasehold/leasehold/bindings/go"
	"github.com/leasehold/leasehold/bindings/go/bench/peer"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

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
	peer.Check(err)
	defer cli.Close()

	libs := []peer.Lib{leaseholdGo(urls), mutexShared(urls), mutexPerLock(urls), floorGRPC(urls), floorGateway(urls)}
	fmt.Printf("etcd cluster %s; %d CPUs; load average %s\n", *members, runtime.NumCPU(), peer.Loadavg())
	if *only == "" || *only == "throughput" {
		throughput(ctx, libs)
		raftEntries(ctx, cli, libs)
	}
	if *only == "" || *only == "handoff" {
		var py *peer.External
		if *python != "" {
			py = &peer.External{Name: "leasehold-python (EtcdExecutor, a thread per waiter)", Run: func(n int) []float64 {
				var out struct {
					Samples []float64 `json:"samples_ms"`
				}
				pyJSON(&out, "handoff", "--handoffs", fmt.Sprint(n), "--hold", fmt.Sprint(holdFor.Seconds()))
				return out.Samples
			}}
		}
		peer.HandoffAll(ctx, libs[:2], *handoffs, *holdFor, 0, py) // the floors do not wait
		commitWatch(ctx, urls)
	}
	fmt.Printf("load average at the end %s\n", peer.Loadavg())
}

func leaseholdGo(urls []string) peer.Lib {
	return peer.Leasehold("leasehold-go (EtcdExecutor)", ttl, func() (leasehold.Executor, error) {
		return leasehold.NewEtcdExecutor(urls, nil)
	})
}

// mutexShared is concurrency.Mutex as its documentation shows it: one session (one lease,
// kept alive) per process, a Mutex per lock.
func mutexShared(urls []string) peer.Lib {
	return peer.Lib{Name: "concurrency.Mutex (a session per process)", NewLocker: func(name string) (peer.LockFunc, func(), error) {
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
func mutexPerLock(urls []string) peer.Lib {
	return peer.Lib{Name: "concurrency.Mutex (a session per lock)", NewLocker: func(name string) (peer.LockFunc, func(), error) {
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
func floorGRPC(urls []string) peer.Lib {
	return peer.Lib{Name: "floor: leasehold's 2 requests on clientv3 (gRPC)", NewLocker: func(name string) (peer.LockFunc, func(), error) {
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
func floorGateway(urls []string) peer.Lib {
	return peer.Lib{Name: "floor: the same 2 requests on the JSON gateway (net/http)", NewLocker: func(name string) (peer.LockFunc, func(), error) {
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

// throughput runs the libraries (and Python's EtcdExecutor with -python) in interleaved
// rounds; the reference is concurrency.Mutex with a session per process.
func throughput(ctx context.Context, libs []peer.Lib) {
	rs, closeAll := peer.Runners(ctx, libs, "tp")
	defer closeAll()
	if *python != "" {
		rs = append(rs, peer.Runner{Name: "leasehold-python (EtcdExecutor)", External: true, Round: func(d time.Duration) (int, time.Duration) {
			var out struct {
				OpsPerSec float64 `json:"ops_per_s"`
			}
			pyJSON(&out, "throughput", "--seconds", fmt.Sprint(d.Seconds()))
			return int(math.Round(out.OpsPerSec * d.Seconds())), d
		}})
	}
	peer.Throughput(rs, *rounds, *roundTime, 1)
}

// raftEntries counts the Raft log entries one lock+unlock appends: the leader's raft index
// before and after n cycles, with nothing else writing.
func raftEntries(ctx context.Context, cli *clientv3.Client, libs []peer.Lib) {
	index := func() uint64 {
		var hi uint64
		for _, ep := range cli.Endpoints() {
			st, err := cli.Status(ctx, ep)
			peer.Check(err)
			if st.RaftIndex > hi {
				hi = st.RaftIndex
			}
		}
		return hi
	}
	fmt.Printf("\nRaft log entries per lock+unlock (raft index delta over %d cycles; nothing else writing)\n", *commitsOps)
	fmt.Println("| library | entries per cycle |\n|---|---:|")
	for i, l := range libs {
		lock, closeFn, err := l.NewLocker(fmt.Sprintf("raft-%d-%d", i, time.Now().UnixNano()))
		peer.Check(err)
		peer.Cycles(ctx, lock, 100*time.Millisecond)
		time.Sleep(200 * time.Millisecond)
		before := index()
		for k := 0; k < *commitsOps; k++ {
			unlock, err := lock(ctx)
			peer.Check(err)
			peer.Check(unlock(ctx))
		}
		after := index()
		closeFn()
		fmt.Printf("| %s | %.2f |\n", l.Name, float64(after-before)/float64(*commitsOps))
	}
	if *python != "" {
		var out struct {
			Entries float64 `json:"entries_per_cycle"`
		}
		pyJSON(&out, "raft", "--cycles", fmt.Sprint(*commitsOps))
		fmt.Printf("| leasehold-python (EtcdExecutor) | %.2f |\n", out.Entries)
	}
}

// commitWatch times the budget the issue sets for a handoff: one commit and one watch event.
// A key is deleted on one connection while another watches it; timed from the start of the
// delete to the watcher receiving the event, with the same idle pause as a handoff.
func commitWatch(ctx context.Context, urls []string) {
	w, err := clientv3.New(clientv3.Config{Endpoints: urls, DialTimeout: 5 * time.Second})
	peer.Check(err)
	defer w.Close()
	c, err := clientv3.New(clientv3.Config{Endpoints: urls, DialTimeout: 5 * time.Second})
	peer.Check(err)
	defer c.Close()
	key := fmt.Sprintf("/bench-watch/%d", time.Now().UnixNano())
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := w.Watch(wctx, key)
	ms := make([]float64, 0, *handoffs)
	for len(ms) < *handoffs {
		_, err := c.Put(ctx, key, "x")
		peer.Check(err)
		<-events // the put
		time.Sleep(*holdFor)
		t0 := time.Now()
		_, err = c.Delete(ctx, key)
		peer.Check(err)
		<-events
		ms = append(ms, float64(time.Since(t0).Microseconds())/1000)
	}
	fmt.Printf("| floor: one commit + its watch event (a delete on one connection → the event on another, clientv3) | %d | %.2f | %.2f | |\n", len(ms), peer.Pct(ms, 50), peer.Pct(ms, 99))
}

// pyJSON runs one measurement of bench_etcd.py and decodes its last output line.
func pyJSON(v any, mode string, args ...string) {
	cmd := exec.Command(*python, append([]string{*pyScript, "--members", *members, "--json", mode}, args...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	peer.Check(err)
	var last string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if t := strings.TrimSpace(sc.Text()); t != "" {
			last = t
		}
	}
	peer.Check(json.Unmarshal([]byte(last), v))
}
