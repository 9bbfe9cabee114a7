package leasehold

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func newSQLiteClient(t testing.TB, path string, opts *Options) *Client {
	t.Helper()
	tr, err := NewSQLiteTransport(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return newTestClient(t, tr, opts)
}

// TestDefaultSQLitePath: the Python package's and the CLI's default file, under
// an absolute XDG_CACHE_HOME, else under ~/.cache (a relative one is ignored,
// as the XDG spec says).
func TestDefaultSQLitePath(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	for xdg, want := range map[string]string{
		"/var/cache/u": "/var/cache/u/leasehold/locks.sqlite3",
		"":             filepath.Join(home, ".cache", "leasehold", "locks.sqlite3"),
		"relative":     filepath.Join(home, ".cache", "leasehold", "locks.sqlite3"),
	} {
		t.Setenv("XDG_CACHE_HOME", xdg)
		if got, err := DefaultSQLitePath(); err != nil || got != want {
			t.Errorf("XDG_CACHE_HOME=%q: %q, %v; want %q", xdg, got, err, want)
		}
	}
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HOME", "")
	if got, err := DefaultSQLitePath(); err == nil {
		t.Errorf("no HOME and no XDG_CACHE_HOME: %q, want an error", got)
	}
}

func TestSQLiteAcquireReleaseAndFences(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "locks.db")
	a := newSQLiteClient(t, path, nil)
	b := newSQLiteClient(t, path, nil)
	l1, err := a.Acquire(ctx, "n", AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "n", AcquireOptions{TTL: 5 * time.Second}); err == nil {
		t.Fatal("two holders")
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2, err := b.Acquire(ctx, "n", AcquireOptions{TTL: 5 * time.Second, Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if l2.FencingToken() <= l1.FencingToken() {
		t.Fatalf("fence %d not above %d", l2.FencingToken(), l1.FencingToken())
	}
	t.Log(l1.FencingToken(), l2.FencingToken())
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSQLiteProcessesContend: Go processes contend on one SQLite lock file and do a
// read-modify-write split over two gated transactions on a SQLite resource file: no
// update is lost and the fences in the log strictly increase per name.
func TestSQLiteProcessesContend(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "resource.db")
	names := []string{uniq(t, "s0"), uniq(t, "s1")}
	db, _, err := setupDB(ctx, path, names)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const procs, iters = 3, 10
	runContenders(t, procs, iters, []string{"LH_BACKEND=sqlite", "LH_LOCKDB=" + filepath.Join(dir, "locks.db"), "LH_DB=" + path}, names)
	per, err := checkDB(ctx, db, names, procs*iters)
	if err != nil {
		t.Fatal(err)
	}
	if per["go"] != procs*iters {
		t.Fatalf("entries: %v", per)
	}
}

// TestSQLiteReplacedFileLosesTheLease: the lock file is deleted under a holder; the
// executor follows the path to the new file, where the holder's renewal finds nothing,
// so the lease is lost; a new grant there has a higher fence (the wall clock).
func TestSQLiteReplacedFileLosesTheLease(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "locks.db")
	c := newSQLiteClient(t, path, nil)
	l1, err := c.Acquire(ctx, "n", AcquireOptions{TTL: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Remove(path + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	select {
	case <-l1.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the holder did not learn that its file was replaced")
	}
	if !errors.Is(l1.Err(), ErrLost) {
		t.Fatalf("lease error %v", l1.Err())
	}
	l2, err := newSQLiteClient(t, path, nil).Acquire(ctx, "n", AcquireOptions{TTL: 5 * time.Second, Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if l2.FencingToken() <= l1.FencingToken() {
		t.Fatalf("fence %d on the new file not above %d", l2.FencingToken(), l1.FencingToken())
	}
	_ = l2.Release(ctx)
}

// TestSQLiteBadInputIsAClearErrorNeverAGrant: a foreign table of the protocol's name and
// a path in a missing directory fail the acquire with what went wrong.
func TestSQLiteBadInputIsAClearErrorNeverAGrant(t *testing.T) {
	ctx := context.Background()
	one := AcquireOptions{TTL: 5 * time.Second, Wait: 300 * time.Millisecond}
	path := filepath.Join(t.TempDir(), "foreign.db")
	db, err := sql.Open("sqlite3", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE leasehold_locks (name TEXT PRIMARY KEY, owner INTEGER)"); err != nil {
		t.Fatal(err)
	}
	// Close gives up on the cleanup of a broken backend soon.
	opts := &Options{CloseTimeout: 100 * time.Millisecond}
	c := newSQLiteClient(t, path, opts)
	_, err = c.Acquire(ctx, "n", one)
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "leasehold_locks") {
		t.Fatalf("foreign table: %v", err)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM leasehold_locks").Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows written to the foreign table: %d (%v)", n, err)
	}

	_, err = newSQLiteClient(t, filepath.Join(t.TempDir(), "missing", "locks.db"), opts).Acquire(ctx, "n", one)
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "unable to open") {
		t.Fatalf("missing directory: %v", err)
	}
	if _, err := NewSQLiteTransport("", nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("empty path: %v", err)
	}
}

// TestSQLStatus: Status reports the holder's fence, its process on SQLite, and the last
// fence after a release, on SQLite, on PostgreSQL and on the memory service.
func TestSQLStatus(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		mk   func(t *testing.T) *Client
	}{
		{"sqlite", func(t *testing.T) *Client { return newSQLiteClient(t, filepath.Join(t.TempDir(), "l.db"), nil) }},
		{"postgres", func(t *testing.T) *Client { return newPostgresClient(t, needPostgres(t), nil) }},
		{"memory", func(t *testing.T) *Client { return newTestClient(t, NewMemoryTransport(), nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.mk(t)
			name := uniq(t, "st")
			l, err := c.Acquire(ctx, name, AcquireOptions{TTL: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			st, err := c.Status(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if !st.Held || st.FencingToken != l.FencingToken() || st.LastFencingToken != l.FencingToken() ||
				st.RemainingTTL <= 0 || st.RemainingTTL > 30*time.Second || st.Name != name {
				t.Fatalf("status while held: %+v (fence %d)", st, l.FencingToken())
			}
			if tc.name == "sqlite" && st.HolderPID != int64(os.Getpid()) {
				t.Fatalf("holder pid %d, want %d", st.HolderPID, os.Getpid())
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			st, err = c.Status(ctx, name)
			if err != nil || st.Held || st.LastFencingToken != l.FencingToken() {
				t.Fatalf("status after release: %+v, %v", st, err)
			}
		})
	}
}

// TestSQLiteLockedFileIsAnErrorThenWorks: a file another connection keeps locked past the
// busy timeout fails the acquire (database is locked), never hangs or grants; once the
// lock is gone the same Client acquires.
func TestSQLiteLockedFileIsAnErrorThenWorks(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "locks.db")
	tr, err := NewSQLiteTransport(path, &SQLiteOptions{BusyTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c := newTestClient(t, tr, nil)
	l, err := c.Acquire(ctx, "warm", AcquireOptions{TTL: 5 * time.Second}) // the schema exists
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Release(ctx)
	db, err := sql.Open("sqlite3", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN EXCLUSIVE"); err != nil {
		t.Fatal(err)
	}
	_, err = c.Acquire(ctx, "n", AcquireOptions{TTL: 5 * time.Second, Wait: 600 * time.Millisecond})
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("locked file: %v", err)
	}
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	l, err = c.Acquire(ctx, "n", AcquireOptions{TTL: 5 * time.Second, Wait: 5 * time.Second})
	if err != nil {
		t.Fatalf("after the lock was gone: %v", err)
	}
	_ = l.Release(ctx)
}
