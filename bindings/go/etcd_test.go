package leasehold

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

func newEtcdClient(t testing.TB, urls []string, o *EtcdOptions, opts *Options) *Client {
	t.Helper()
	tr, err := NewEtcdTransport(urls, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return newTestClient(t, tr, opts)
}

// etcdLeases lists the cluster's lease ids.
func etcdLeases(t *testing.T, url string) map[string]bool {
	t.Helper()
	body, err := etcdPost(url, "/v3/lease/leases", "{}", "")
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Leases []struct{ ID string } `json:"leases"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, l := range out.Leases {
		ids[l.ID] = true
	}
	return ids
}

func TestEtcdAcquireReleaseAndFences(t *testing.T) {
	urls := needEtcd(t)
	ctx := context.Background()
	name := uniq(t, "etcd")
	before := etcdLeases(t, urls[0])
	a := newEtcdClient(t, urls, nil, nil)
	b := newEtcdClient(t, urls, nil, nil)
	l1, err := a.Acquire(ctx, name, AcquireOptions{TTL: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lease, 1)
	go func() {
		l, err := b.Acquire(ctx, name, AcquireOptions{TTL: 60 * time.Second, Wait: 10 * time.Second})
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := <-got
	t.Log("handoff", time.Since(start))
	if l2 == nil {
		t.FailNow()
	}
	if l2.FencingToken() <= l1.FencingToken() {
		t.Fatalf("fence %d not above %d", l2.FencingToken(), l1.FencingToken())
	}
	k, _ := b.EtcdCounters()
	t.Logf("%+v", k)
	// Status, asked by a client that holds nothing: the owner's fence and time left.
	st, err := a.Status(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.FencingToken != l2.FencingToken() || st.RemainingTTL <= 0 || st.RemainingTTL > 60*time.Second {
		t.Fatalf("status while held: %+v (fence %d)", st, l2.FencingToken())
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err = a.Status(ctx, name); err != nil || st.Held {
		t.Fatalf("status after the release: %+v, %v", st, err)
	}
	// Each client kept one pooled etcd lease; closing revokes it.
	if got := len(etcdLeases(t, urls[0])) - len(before); got < 1 {
		t.Fatalf("%d new etcd leases while the clients are open, want their pooled ones", got)
	}
	_ = a.Close()
	_ = b.Close()
	for id := range etcdLeases(t, urls[0]) {
		if !before[id] {
			t.Fatalf("etcd lease %s outlived its client's Close", id)
		}
	}
}

// TestEtcdProcessesContendWhileAMemberIsKilled: Go processes contend on the 3-member
// cluster and do a fenced read-modify-write on a SQLite file while one member is killed
// (and later restarted): no update is lost, fences strictly increase per name.
func TestEtcdProcessesContendWhileAMemberIsKilled(t *testing.T) {
	urls := needEtcd(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "resource.db")
	names := []string{uniq(t, "e0"), uniq(t, "e1")}
	db, _, err := setupDB(ctx, path, names)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const procs, iters = 3, 8
	env := []string{"LH_BACKEND=etcd", "LH_ETCD=" + strings.Join(urls, ","), "LH_DB=" + path,
		// A revoke whose member died is retried on another, and may find its lease gone
		// already: the core then says "not owner".
		"LH_TOLERATE_NOT_OWNER=1"}
	killed := make(chan error, 1)
	go func() {
		time.Sleep(400 * time.Millisecond)
		_, err := runScript("etcd-test-cluster.sh", "kill", etcdCluster.dir, "1")
		killed <- err
	}()
	runContenders(t, procs, iters, env, names)
	if err := <-killed; err != nil {
		t.Fatal(err)
	}
	if _, err := runScript("etcd-test-cluster.sh", "restart", etcdCluster.dir, "1"); err != nil {
		t.Fatal(err)
	}
	per, err := checkDB(ctx, db, names, procs*iters)
	if err != nil {
		t.Fatal(err)
	}
	if per["go"] != procs*iters {
		t.Fatalf("entries: %v", per)
	}
	// The restarted member serves again (later tests use every member).
	c := newEtcdClient(t, urls[:1], nil, nil)
	waitFor(t, "the restarted member to serve", func() bool {
		l, err := c.Acquire(ctx, uniq(t, "up"), AcquireOptions{TTL: 5 * time.Second, Wait: time.Second})
		if err != nil {
			return false
		}
		_ = l.Release(ctx)
		return true
	})
}

// etcdPost is one JSON call to the gateway, for the tests' own setup.
func etcdPost(url, path, body, token string) (string, error) {
	req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		return "", err
	}
	if token != "" {
		req.Header.Set("Authorization", token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("%s: HTTP %d: %s", path, resp.StatusCode, b)
	}
	return string(b), err
}

// TestEtcdBadInputIsAClearErrorNeverAGrant: unreachable members and a wrong password fail
// the acquire with what went wrong; the right password works.
func TestEtcdBadInputIsAClearErrorNeverAGrant(t *testing.T) {
	needEtcd(t)
	ctx := context.Background()
	opts := &Options{RequestTimeout: time.Second, CloseTimeout: 100 * time.Millisecond}
	one := AcquireOptions{TTL: 5 * time.Second, Wait: 500 * time.Millisecond}
	var dead []string
	for i := 0; i < 2; i++ {
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		dead = append(dead, fmt.Sprintf("http://127.0.0.1:%d", port))
	}
	c := newEtcdClient(t, dead, nil, opts)
	// The error carries what the host saw, not a vague "no reply".
	if _, err := c.Acquire(ctx, "n", one); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("unreachable members: %v", err)
	}
	if _, err := NewEtcdTransport([]string{"127.0.0.1:2379"}, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("an endpoint without a scheme: %v", err)
	}

	// A cluster of its own with authentication on.
	dir := t.TempDir()
	out, err := runScript("etcd-test-cluster.sh", "start", dir, "1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = runScript("etcd-test-cluster.sh", "stop", dir) })
	url := strings.Split(out, ",")[0]
	for _, step := range [][2]string{
		{"/v3/auth/role/add", `{"name":"root"}`},
		{"/v3/auth/user/add", `{"name":"root","password":"rootpw"}`},
		{"/v3/auth/user/grant", `{"user":"root","role":"root"}`},
		{"/v3/auth/enable", `{}`},
	} {
		if _, err := etcdPost(url, step[0], step[1], ""); err != nil {
			t.Fatal(err)
		}
	}
	bad := newEtcdClient(t, []string{url}, &EtcdOptions{Username: "root", Password: "wrong", AllowInsecureAuth: true}, opts)
	if _, err := bad.Acquire(ctx, "n", one); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "authentication failed") {
		t.Fatalf("wrong password: %v (backend said %q)", err, bad.BackendError())
	}
	good := newEtcdClient(t, []string{url}, &EtcdOptions{Username: "root", Password: "rootpw", AllowInsecureAuth: true}, opts)
	l, err := good.Acquire(ctx, "n", one)
	if err != nil {
		t.Fatalf("right password: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestBackendsRenewHeldLeases: a lease held for several TTLs stays held on every
// backend (renewals: an SQL statement, or an etcd keep-alive), then releases.
func TestBackendsRenewHeldLeases(t *testing.T) {
	ctx := context.Background()
	// Started here: the subtests run in parallel.
	pg, etcd := needPostgres(t), needEtcd(t)
	cases := []struct {
		name string
		mk   func(t *testing.T) *Client
	}{
		{"sqlite", func(t *testing.T) *Client {
			return newSQLiteClient(t, filepath.Join(t.TempDir(), "locks.db"), nil)
		}},
		{"postgres", func(t *testing.T) *Client { return newPostgresClient(t, pg, nil) }},
		{"etcd", func(t *testing.T) *Client { return newEtcdClient(t, etcd, nil, nil) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := tc.mk(t)
			// etcd leases are whole seconds: 1s is the shortest TTL of all three.
			const ttl = time.Second
			l, err := c.Acquire(ctx, uniq(t, "renew"), AcquireOptions{TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * ttl / 2)
			if !l.IsHeld() || l.Err() != nil {
				t.Fatalf("lease not held after 2.5 TTLs: %v", l.Err())
			}
			k, err := c.Counters()
			if err != nil || k.RenewalsOK < 2 {
				t.Fatalf("renewals confirmed: %d (%v)", k.RenewalsOK, err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestEtcdPausedHolderIsFencedOut: a holder stopped past its TTL loses its etcd lease;
// another process takes over and writes through the gate; the resumed holder's write is
// refused and it learns of its loss.
func TestEtcdPausedHolderIsFencedOut(t *testing.T) {
	urls := needEtcd(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "resource.db")
	name := uniq(t, "k")
	db, g, err := setupDB(ctx, path, []string{name})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	w := startBackendWorker(t, "paused", "go-stale", []string{"LH_BACKEND=etcd", "LH_ETCD=" + strings.Join(urls, ","), "LH_DB=" + path}, []string{name}, 0)
	line, err := w.out.ReadString('\n')
	var t1 uint64
	if _, serr := fmt.Sscanf(line, "ACQUIRED %d", &t1); err != nil || serr != nil {
		t.Fatalf("worker said %q (%v); stderr: %s", line, err, w.stderr.String())
	}
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	c := newEtcdClient(t, urls, nil, nil)
	l, err := c.Acquire(ctx, name, AcquireOptions{TTL: 10 * time.Second, Wait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if l.FencingToken() <= t1 {
		t.Fatalf("taker's fence %d not above the paused holder's %d", l.FencingToken(), t1)
	}
	if err := criticalSection(ctx, g, name, l.FencingToken(), "go-fresh"); err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := w.stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	verdict, _ := w.out.ReadString('\n')
	lost, _ := w.out.ReadString('\n')
	if err := w.wait(); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(verdict) != "STALE" || strings.TrimSpace(lost) != "LOST true" {
		t.Fatalf("the resumed holder said %q, %q; stderr: %s", verdict, lost, w.stderr.String())
	}
	_ = l.Release(ctx)
}

// TestEtcdTLS: a member serving https with a self-signed certificate is reached with the
// EtcdOptions.TLS that trusts it; without it, the certificate is refused and nothing is
// granted.
func TestEtcdTLS(t *testing.T) {
	needEtcd(t) // the binary (and the CI=true rule)
	dir := t.TempDir()
	tlsCfg, certFile, keyFile := selfSigned(t, dir)
	client, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	peer, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("https://127.0.0.1:%d", client)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	cmd := exec.Command("etcd", "--name", "tls1", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", url, "--advertise-client-urls", url,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "tls1="+peerURL, "--cert-file", certFile, "--key-file", keyFile,
		"--log-level", "warn")
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ctx := context.Background()
	opts := &Options{RequestTimeout: time.Second, CloseTimeout: 100 * time.Millisecond}
	c := newEtcdClient(t, []string{url}, &EtcdOptions{TLS: tlsCfg}, opts)
	var l *Lease
	waitFor(t, "the TLS member to grant a lock", func() bool {
		l, err = c.Acquire(ctx, "tls", AcquireOptions{TTL: 5 * time.Second, Wait: 500 * time.Millisecond})
		return err == nil
	})
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	untrusting := newEtcdClient(t, []string{url}, nil, opts)
	if _, err := untrusting.Acquire(ctx, "tls", AcquireOptions{TTL: 5 * time.Second, Wait: 300 * time.Millisecond}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a certificate nobody trusts: %v", err)
	}
}

// TestBackendClientsCloseCleanly: Close stops every goroutine an SQL or etcd Client
// started (executors, listener, watch streams) and closes its connections.
func TestBackendClientsCloseCleanly(t *testing.T) {
	ctx := context.Background()
	pg, etcd := needPostgres(t), needEtcd(t)
	path := filepath.Join(t.TempDir(), "locks.db")
	before := runtime.NumGoroutine()
	for i := 0; i < 3; i++ {
		sq, err := NewSQLiteTransport(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		pt, err := NewPostgresTransport(pg)
		if err != nil {
			t.Fatal(err)
		}
		et, err := NewEtcdTransport(etcd, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tr := range []Transport{sq, pt, et} {
			a, err := NewClient(tr, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, err := NewClient(tr, nil)
			if err != nil {
				t.Fatal(err)
			}
			name := uniq(t, "close")
			l, err := a.Acquire(ctx, name, AcquireOptions{TTL: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			// b waits (PostgreSQL: LISTEN; etcd: a watch stream) when it is closed.
			waiting := make(chan error, 1)
			go func() {
				_, err := b.Acquire(ctx, name, AcquireOptions{TTL: 5 * time.Second, Wait: time.Minute})
				waiting <- err
			}()
			time.Sleep(100 * time.Millisecond)
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if err := <-waiting; !errors.Is(err, ErrClosed) && !errors.Is(err, ErrNotAcquired) {
				t.Fatalf("waiter of a closed Client: %v", err)
			}
			_ = l.Release(ctx)
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
		}
		_ = et.Close()
	}
	waitFor(t, "the Clients' goroutines to end", func() bool {
		return runtime.NumGoroutine() <= before+2
	})
}
