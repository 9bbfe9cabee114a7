package leasehold

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func newPostgresClient(t testing.TB, url string, opts *Options) *Client {
	t.Helper()
	tr, err := NewPostgresTransport(url)
	if err != nil {
		t.Fatal(err)
	}
	return newTestClient(t, tr, opts)
}

func TestPostgresAcquireReleaseAndFences(t *testing.T) {
	url := needPostgres(t)
	ctx := context.Background()
	name := uniq(t, "pg")
	a := newPostgresClient(t, url, nil)
	// The waiter commits asynchronously: both settings share the lock.
	tr, err := NewPostgresTransportWithOptions(url, &PostgresOptions{AsynchronousCommit: true})
	if err != nil {
		t.Fatal(err)
	}
	b := newTestClient(t, tr, nil)
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
	time.Sleep(200 * time.Millisecond)
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
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// pgStore is the fenced resource on PostgreSQL: a counter per name and a log, behind a
// PostgresGate.
type pgStore struct {
	conn *pgx.Conn
	g    *PostgresGate
}

func openPgStore(ctx context.Context, url string) (*pgStore, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	g, err := NewPostgresGate(ctx, conn, nil)
	if err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	return &pgStore{conn: conn, g: g}, nil
}

// setupPgStore creates the resource tables and the counters of names (the parent does
// it before the workers start).
func setupPgStore(t *testing.T, url string, names []string) *pgStore {
	t.Helper()
	ctx := context.Background()
	s, err := openPgStore(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	for _, q := range []string{
		"CREATE TABLE IF NOT EXISTS gate_counter (name text PRIMARY KEY, v bigint NOT NULL)",
		"CREATE TABLE IF NOT EXISTS gate_log (id bigserial PRIMARY KEY, name text NOT NULL, token bigint NOT NULL, worker text NOT NULL)",
	} {
		if _, err := s.conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range names {
		if _, err := s.conn.Exec(ctx, "INSERT INTO gate_counter (name, v) VALUES ($1, 0) ON CONFLICT DO NOTHING", n); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func (s *pgStore) critical(ctx context.Context, name string, token uint64, worker string) error {
	var v int64
	err := s.g.Do(ctx, name, token, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT v FROM gate_counter WHERE name = $1", name).Scan(&v)
	})
	if err != nil {
		return err
	}
	time.Sleep(time.Millisecond)
	return s.g.Do(ctx, name, token, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "UPDATE gate_counter SET v = $1 WHERE name = $2", v+1, name); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO gate_log (name, token, worker) VALUES ($1, $2, $3)", name, int64(token), worker)
		return err
	})
}

func (s *pgStore) write(ctx context.Context, name string, token uint64, worker string) error {
	return s.g.Do(ctx, name, token, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO gate_log (name, token, worker) VALUES ($1, $2, $3)", name, int64(token), worker)
		return err
	})
}

func (s *pgStore) close() { _ = s.conn.Close(context.Background()) }

// check verifies that the counters of names add up to total and that the log's tokens
// strictly increase per name in commit order; it returns the entries per worker prefix.
func (s *pgStore) check(ctx context.Context, names []string, total int) (map[string]int, error) {
	var sum int
	if err := s.conn.QueryRow(ctx, "SELECT coalesce(sum(v), 0) FROM gate_counter WHERE name = ANY($1)", names).Scan(&sum); err != nil {
		return nil, err
	}
	if sum != total {
		return nil, fmt.Errorf("counters add up to %d, want %d: updates were lost", sum, total)
	}
	rows, err := s.conn.Query(ctx, "SELECT name, token, worker FROM gate_log WHERE name = ANY($1) ORDER BY id", names)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	last := map[string]int64{}
	per := map[string]int{}
	n := 0
	for rows.Next() {
		var name, worker string
		var tok int64
		if err := rows.Scan(&name, &tok, &worker); err != nil {
			return nil, err
		}
		if tok <= last[name] {
			return nil, fmt.Errorf("log entry %d: token %d on %s by %s not above %d", n, tok, name, worker, last[name])
		}
		last[name] = tok
		per[strings.SplitN(worker, "-", 2)[0]]++
		n++
	}
	if n != total {
		return nil, fmt.Errorf("log has %d entries, want %d", n, total)
	}
	return per, rows.Err()
}

// startBackendWorker re-executes the test binary as a worker on the given backend.
func startBackendWorker(t *testing.T, mode, id string, env []string, names []string, iters int) *workerProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(append(os.Environ(), env...),
		"LEASEHOLD_TEST_WORKER="+mode, "LH_NAMES="+strings.Join(names, ","),
		"LH_ITERS="+strconv.Itoa(iters), "LH_ID="+id)
	return startProc(t, cmd, id)
}

// runContenders runs procs contend workers to completion.
func runContenders(t *testing.T, procs, iters int, env []string, names []string) {
	t.Helper()
	var ws []*workerProc
	for i := 0; i < procs; i++ {
		w := startBackendWorker(t, "contend", fmt.Sprintf("go-%d", i), env, names, iters)
		go func() { _, _ = io.Copy(io.Discard, w.out) }()
		ws = append(ws, w)
	}
	for _, w := range ws {
		if err := w.wait(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPostgresProcessesContendThroughTheGate: Go processes contend on PostgreSQL and do
// a read-modify-write split over two gated transactions on PostgreSQL itself: no update
// is lost and the fences in the log strictly increase per name.
func TestPostgresProcessesContendThroughTheGate(t *testing.T) {
	url := needPostgres(t)
	ctx := context.Background()
	names := []string{uniq(t, "a"), uniq(t, "b")}
	s := setupPgStore(t, url, names)
	const procs, iters = 3, 10
	runContenders(t, procs, iters, []string{"LH_BACKEND=postgres", "LH_PG=" + url, "LH_GATE=pg"}, names)
	per, err := s.check(ctx, names, procs*iters)
	if err != nil {
		t.Fatal(err)
	}
	if per["go"] != procs*iters {
		t.Fatalf("entries: %v", per)
	}
}

// TestPostgresPausedHolderIsFencedOut is Kleppmann's case on PostgreSQL: the holder is
// stopped past its TTL, another process takes the lock over and writes through the gate;
// the resumed holder's write is refused and its lease is lost.
func TestPostgresPausedHolderIsFencedOut(t *testing.T) {
	url := needPostgres(t)
	ctx := context.Background()
	name := uniq(t, "k")
	s := setupPgStore(t, url, []string{name})
	w := startBackendWorker(t, "paused", "go-stale", []string{"LH_BACKEND=postgres", "LH_PG=" + url, "LH_GATE=pg"}, []string{name}, 0)
	line, err := w.out.ReadString('\n')
	var t1 uint64
	if _, serr := fmt.Sscanf(line, "ACQUIRED %d", &t1); err != nil || serr != nil {
		t.Fatalf("worker said %q (%v); stderr: %s", line, err, w.stderr.String())
	}
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	c := newPostgresClient(t, url, nil)
	l, err := c.Acquire(ctx, name, AcquireOptions{TTL: 10 * time.Second, Wait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if l.FencingToken() <= t1 {
		t.Fatalf("taker's fence %d not above the paused holder's %d", l.FencingToken(), t1)
	}
	if err := s.critical(ctx, name, l.FencingToken(), "go-fresh"); err != nil {
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
	if strings.TrimSpace(verdict) != "STALE" {
		t.Fatalf("the stale write was not refused: %q; stderr: %s", verdict, w.stderr.String())
	}
	if strings.TrimSpace(lost) != "LOST true" {
		t.Fatalf("the paused holder did not learn of its loss: %q", lost)
	}
	var n int
	if err := s.conn.QueryRow(ctx, "SELECT count(*) FROM gate_log WHERE name = $1 AND token = $2", name, int64(t1)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("stale entries in the log: %d (%v)", n, err)
	}
	if hwm, err := s.g.HighWaterMark(ctx, name); err != nil || hwm != l.FencingToken() {
		t.Fatalf("high-water mark %d (%v), want %d", hwm, err, l.FencingToken())
	}
	_ = l.Release(ctx)
}

// TestPostgresRestartMidRun: the server restarts under a holder and a waiter; nothing
// hangs, the holder keeps or loses its lease per the rules, and fences never regress.
func TestPostgresRestartMidRun(t *testing.T) {
	url := needPostgres(t)
	ctx := context.Background()
	name := uniq(t, "r")
	a := newPostgresClient(t, url, nil)
	b := newPostgresClient(t, url, nil)
	l1, err := a.Acquire(ctx, name, AcquireOptions{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	waiter := make(chan error, 1)
	var l2 *Lease
	go func() {
		var err error
		l2, err = b.Acquire(ctx, name, AcquireOptions{TTL: 3 * time.Second, Wait: 20 * time.Second})
		waiter <- err
	}()
	restartPostgres(t)
	// The holder either renews on a new connection or learns of its loss; either way
	// Release answers within its bound.
	time.Sleep(time.Second)
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := l1.Release(rctx); err != nil && !errors.Is(err, ErrLost) && !errors.Is(err, ErrNotOwner) {
		t.Fatalf("release after the restart: %v", err)
	}
	if err := <-waiter; err != nil {
		t.Fatalf("the waiter did not get the lock after the restart: %v", err)
	}
	if l2.FencingToken() <= l1.FencingToken() {
		t.Fatalf("fence %d after the restart not above %d", l2.FencingToken(), l1.FencingToken())
	}
	// A fresh client works too, with a higher fence still.
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l3, err := newPostgresClient(t, url, nil).Acquire(ctx, name, AcquireOptions{TTL: 3 * time.Second, Wait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if l3.FencingToken() <= l2.FencingToken() {
		t.Fatalf("fence %d not above %d", l3.FencingToken(), l2.FencingToken())
	}
	_ = l3.Release(ctx)
}

// TestPostgresBadInputIsAClearErrorNeverAGrant: a wrong password, an unreachable server
// and a foreign table of the protocol's name fail the acquire with what went wrong.
func TestPostgresBadInputIsAClearErrorNeverAGrant(t *testing.T) {
	url := needPostgres(t)
	ctx := context.Background()
	// Close gives up on the cleanup of a broken backend soon.
	opts := &Options{RequestTimeout: time.Second, CloseTimeout: 100 * time.Millisecond}
	one := AcquireOptions{TTL: 5 * time.Second, Wait: 500 * time.Millisecond}

	_, err := newPostgresClient(t, strings.Replace(url, ":leasehold@", ":wrong@", 1), opts).Acquire(ctx, "n", one)
	t.Log(err)
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "password authentication failed") {
		t.Fatalf("wrong password: %v", err)
	}

	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	_, err = newPostgresClient(t, fmt.Sprintf("postgresql://postgres:x@127.0.0.1:%d/postgres", port), opts).Acquire(ctx, "n", one)
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "connect") {
		t.Fatalf("unreachable server: %v", err)
	}

	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	db := fmt.Sprintf("lh_foreign_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if a, err := pgx.Connect(context.Background(), url); err == nil {
			_, _ = a.Exec(context.Background(), "DROP DATABASE "+db+" WITH (FORCE)")
			_ = a.Close(context.Background())
		}
	})
	foreignURL := strings.TrimSuffix(url, "/postgres") + "/" + db
	other, err := pgx.Connect(ctx, foreignURL)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if _, err := other.Exec(ctx, "CREATE TABLE leasehold_locks (name text PRIMARY KEY, owner int)"); err != nil {
		t.Fatal(err)
	}
	c := newPostgresClient(t, foreignURL, opts)
	_, err = c.Acquire(ctx, "n", one)
	if !errors.Is(err, ErrNotAcquired) || !strings.Contains(c.BackendError(), "leasehold_locks") {
		t.Fatalf("foreign table: %v (backend said %q)", err, c.BackendError())
	}
	var n int
	if err := other.QueryRow(ctx, "SELECT count(*) FROM leasehold_locks").Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows written to the foreign table: %d (%v)", n, err)
	}
}

// A read-only database (default_transaction_read_only, SQLSTATE 25006): acquire fails
// with the server's reason and grants nothing; a lease held when the database turns
// read-only cannot renew and is lost, its row kept until it expires.
func TestPostgresReadOnlyDatabaseIsAClearErrorNeverAGrant(t *testing.T) {
	url := needPostgres(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	db := fmt.Sprintf("lh_ro_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if a, err := pgx.Connect(context.Background(), url); err == nil {
			_, _ = a.Exec(context.Background(), "DROP DATABASE "+db+" WITH (FORCE)")
			_ = a.Close(context.Background())
		}
	})
	dbURL := strings.TrimSuffix(url, "/postgres") + "/" + db
	opts := &Options{RequestTimeout: time.Second, CloseTimeout: 100 * time.Millisecond}
	holder := newPostgresClient(t, dbURL, opts)
	held, err := holder.Acquire(ctx, "n", AcquireOptions{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}

	// A read-only session from the start.
	ro := newPostgresClient(t, dbURL+"?options=-c%20default_transaction_read_only%3Don", opts)
	_, err = ro.Acquire(ctx, "n", AcquireOptions{TTL: 2 * time.Second, Wait: 300 * time.Millisecond})
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(ro.BackendError(), "read-only transaction") {
		t.Fatalf("read-only session: %v (backend said %q)", err, ro.BackendError())
	}
	if !held.IsHeld() {
		t.Fatal("the holder lost its lease to a refused acquire")
	}

	// The database turns read-only under the holder (its connections are cut, so the new
	// ones are read-only): renewals fail and the lease is lost.
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+db+" SET default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", db); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held.Lost():
	case <-time.After(20 * time.Second):
		t.Fatal("the lease outlived a database it could not renew in")
	}
	t.Log("lost:", held.Err(), "backend said:", holder.BackendError())
	fenced := fmt.Sprint(held.FencingToken())
	dbConn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer dbConn.Close(ctx)
	var token string
	var fence int64
	if err := dbConn.QueryRow(ctx, "SELECT token, fence FROM leasehold_locks WHERE name = 'n'").Scan(&token, &fence); err != nil || fmt.Sprint(fence) != fenced || token == "" {
		t.Fatalf("the grant's row: %q %d (%v)", token, fence, err)
	}

	// Writable again: the next grant, after the old one expired, has a higher fence.
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+db+" RESET default_transaction_read_only"); err != nil {
		t.Fatal(err)
	}
	next, err := newPostgresClient(t, dbURL, opts).Acquire(ctx, "n", AcquireOptions{TTL: 2 * time.Second, Wait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if next.FencingToken() <= held.FencingToken() {
		t.Fatalf("fence %d not above %d", next.FencingToken(), held.FencingToken())
	}
	_ = next.Release(ctx)
}
