package leasehold

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// pythonForInterop returns the interpreter of bindings/python/.venv (made by
// bindings/python/setup-venv.sh). Without it the test skips, except under
// CI=true where it fails: the interop test must run in CI.
func pythonForInterop(t *testing.T) string {
	t.Helper()
	py, err := filepath.Abs(filepath.Join("..", "python", ".venv", "bin", "python"))
	if err == nil {
		if _, err = os.Stat(py); err == nil {
			cmd := exec.Command(py, "-c", "import leasehold, leasehold.backends.redis; leasehold.LockClient")
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			if err = cmd.Run(); err != nil {
				err = fmt.Errorf("%w: %s", err, out.String())
			}
		}
	}
	if err != nil {
		msg := fmt.Sprintf("Python leasehold package unavailable (run bindings/python/setup-venv.sh): %v", err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return py
}

// TestInteropGoAndPythonContend runs Go and Python worker processes that
// contend for the same names on the same Redis and do a fenced
// read-modify-write on one SQLite file: no update may be lost, no write
// refused (the lock was exclusive), and the fencing tokens in the log
// strictly increase per name across both languages.
func TestInteropGoAndPythonContend(t *testing.T) {
	addr := needRedis(t)
	py := pythonForInterop(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "interop.db")
	names := []string{uniq(t, "i0"), uniq(t, "i1")}
	db, _, err := setupDB(ctx, path, names)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const goProcs, pyProcs, iters = 2, 2, 12
	var waits []func() error
	for i := 0; i < goProcs; i++ {
		w := startWorker(t, "contend", fmt.Sprintf("go-%d", i), path, names, iters)
		waits = append(waits, w.wait)
		go func() { _, _ = io.Copy(io.Discard, w.out) }()
	}
	for i := 0; i < pyProcs; i++ {
		id := fmt.Sprintf("py-%d", i)
		cmd := exec.Command(py, filepath.Join("testdata", "interop_worker.py"))
		cmd.Env = append(os.Environ(), "LH_REDIS="+addr, "LH_DB="+path,
			"LH_NAMES="+strings.Join(names, ","), fmt.Sprintf("LH_ITERS=%d", iters), "LH_ID="+id)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
		})
		waits = append(waits, func() error {
			if err := cmd.Wait(); err != nil {
				return fmt.Errorf("python worker %s: %w\n%s", id, err, out.String())
			}
			if !strings.Contains(out.String(), "DONE") {
				return fmt.Errorf("python worker %s did not finish:\n%s", id, out.String())
			}
			return nil
		})
	}
	for _, w := range waits {
		if err := w(); err != nil {
			t.Fatal(err)
		}
	}
	per, err := checkDB(ctx, db, names, (goProcs+pyProcs)*iters)
	if err != nil {
		t.Fatal(err)
	}
	if per["go"] != goProcs*iters || per["py"] != pyProcs*iters {
		t.Fatalf("entries per language: %v", per)
	}
}

// TestInteropPausedPythonHolderRejectedByGoGate: a Python holder stopped past
// its TTL loses the lock to a Go client, whose fenced write raises the
// high-water mark; the Python holder's stale write, resumed, is refused by
// the same gate.
func TestInteropPausedPythonHolderRejectedByGoGate(t *testing.T) {
	addr := needRedis(t)
	py := pythonForInterop(t)
	rdb := newRedis(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "interop.db")
	name := uniq(t, "ip")
	db, g, err := setupDB(ctx, path, []string{name})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	cmd := exec.Command(py, filepath.Join("testdata", "interop_worker.py"))
	cmd.Env = append(os.Environ(), "LH_REDIS="+addr, "LH_DB="+path, "LH_NAMES="+name,
		"LH_ITERS=0", "LH_ID=py-stale", "LH_MODE=paused")
	w := startProc(t, cmd, "py-stale")
	out, stdin, stderr := w.out, w.stdin, w.stderr
	line, err := out.ReadString('\n')
	var t1 uint64
	if _, serr := fmt.Sscanf(line, "ACQUIRED %d", &t1); err != nil || serr != nil {
		t.Fatalf("python worker said %q (%v); stderr: %s", line, err, stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	lock := lockKey(name)
	waitFor(t, "the paused Python holder's key to expire", func() bool {
		n, err := rdb.Exists(ctx, lock).Result()
		return err == nil && n == 0
	})
	c, _ := newRedisClient(t, nil)
	l, err := c.Acquire(ctx, name, AcquireOptions{TTL: 10 * time.Second, Wait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if l.FencingToken() <= t1 {
		t.Fatalf("Go token %d not above the Python holder's %d", l.FencingToken(), t1)
	}
	if err := criticalSection(ctx, g, name, l.FencingToken(), "go-fresh"); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	verdict, _ := out.ReadString('\n')
	lost, _ := out.ReadString('\n')
	if err := w.wait(); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(verdict) != "STALE" {
		t.Fatalf("the stale Python write was not refused: %q; stderr: %s", verdict, stderr.String())
	}
	if strings.TrimSpace(lost) != "LOST True" {
		t.Fatalf("the Python holder did not see its loss: %q", lost)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM log WHERE token = ?", int64(t1)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("stale entries in the log: %d (%v)", n, err)
	}
	_ = l.Release(ctx)
}

// TestInteropGoAndPythonContendOnSQLite: Go processes (SQLiteTransport, the core's SQL
// protocol) and Python processes (SQLiteLockService) contend on one SQLite lock file and
// do a fenced read-modify-write on one resource file: no update is lost, no write is
// refused, and the fences strictly increase per name across both languages.
func TestInteropGoAndPythonContendOnSQLite(t *testing.T) {
	py := pythonForInterop(t)
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "resource.db")
	lockdb := filepath.Join(dir, "locks.db")
	names := []string{uniq(t, "q0"), uniq(t, "q1")}
	db, _, err := setupDB(ctx, path, names)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const goProcs, pyProcs, iters = 2, 2, 10
	env := []string{"LH_BACKEND=sqlite", "LH_LOCKDB=" + lockdb, "LH_DB=" + path}
	var waits []func() error
	for i := 0; i < goProcs; i++ {
		w := startBackendWorker(t, "contend", fmt.Sprintf("go-%d", i), env, names, iters)
		waits = append(waits, w.wait)
		go func() { _, _ = io.Copy(io.Discard, w.out) }()
	}
	for i := 0; i < pyProcs; i++ {
		id := fmt.Sprintf("py-%d", i)
		cmd := exec.Command(py, filepath.Join("testdata", "interop_worker.py"))
		cmd.Env = append(append(os.Environ(), env...), "LH_NAMES="+strings.Join(names, ","),
			fmt.Sprintf("LH_ITERS=%d", iters), "LH_ID="+id)
		w := startProc(t, cmd, id)
		var out strings.Builder
		copied := make(chan struct{})
		go func() { _, _ = io.Copy(&out, w.out); close(copied) }()
		waits = append(waits, func() error {
			err := w.wait()
			<-copied
			if err != nil {
				return err
			}
			if !strings.Contains(out.String(), "DONE") {
				return fmt.Errorf("python worker %s did not finish: %s %s", id, out.String(), w.stderr.String())
			}
			return nil
		})
	}
	for _, w := range waits {
		if err := w(); err != nil {
			t.Fatal(err)
		}
	}
	per, err := checkDB(ctx, db, names, (goProcs+pyProcs)*iters)
	if err != nil {
		t.Fatal(err)
	}
	if per["go"] != goProcs*iters || per["py"] != pyProcs*iters {
		t.Fatalf("entries per language: %v", per)
	}
	// Both languages minted from one table of fences: its last fence of each name is the
	// last token in the log.
	locks, err := sql.Open("sqlite3", lockdb)
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	for _, n := range names {
		var fence, last int64
		if err := locks.QueryRow("SELECT fence FROM leasehold_fences WHERE name = ?", n).Scan(&fence); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow("SELECT max(token) FROM log WHERE name = ?", n).Scan(&last); err != nil {
			t.Fatal(err)
		}
		if fence != last {
			t.Fatalf("%s: last fence %d in the lock file, last token %d in the log", n, fence, last)
		}
	}
}
