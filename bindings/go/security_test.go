package leasehold

// What a lock library must not give away: the lock file to other local users or
// through a link, and passwords in errors, logs or printed configurations.

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// logBuf collects a Client's log lines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func capturingOptions() (*Options, *logBuf) {
	lb := &logBuf{}
	return &Options{Logger: slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})),
		RequestTimeout: 2 * time.Second, CloseTimeout: 200 * time.Millisecond}, lb
}

func wantPerm(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Errorf("%s: mode %04o, want %04o", path, got, want)
	}
}

// TestSQLiteDefaultFileIsPrivate: the default file's missing directory is created 0700
// and the file 0600, its -wal and -shm files too, even under umask 0 (another local user
// could otherwise read lock names, pids, hosts and tokens); nothing is reported.
func TestSQLiteDefaultFileIsPrivate(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	cache := filepath.Join(t.TempDir(), "cache")
	t.Setenv("XDG_CACHE_HOME", cache)
	path, err := DefaultSQLitePath()
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewSQLiteTransport(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	opts, logs := capturingOptions()
	c := newTestClient(t, tr, opts)
	ctx := context.Background()
	l, err := c.Acquire(ctx, "private", AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	wantPerm(t, filepath.Dir(path), 0o700)
	wantPerm(t, path, 0o600)
	for _, s := range []string{"-wal", "-shm"} {
		wantPerm(t, path+s, 0o600)
	}
	if strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("a private file was reported:\n%s", logs)
	}
}

// TestSQLiteRefusesASymlink: link.db -> victim.db is refused with a clear error, at
// NewSQLiteTransport and when the link appears before the file is opened; victim.db is
// neither created nor modified.
func TestSQLiteRefusesASymlink(t *testing.T) {
	ctx := context.Background()
	for _, victimExists := range []bool{false, true} {
		dir := t.TempDir()
		victim, link := filepath.Join(dir, "victim.db"), filepath.Join(dir, "link.db")
		content := []byte("not leasehold's: keep me")
		if victimExists {
			if err := os.WriteFile(victim, content, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		checkVictim := func(when string) {
			t.Helper()
			got, err := os.ReadFile(victim)
			if !victimExists {
				if !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s: victim.db was created (%v)", when, err)
				}
			} else if err != nil || !bytes.Equal(got, content) {
				t.Errorf("%s: victim.db changed: %q, %v", when, got, err)
			}
			for _, s := range []string{"-wal", "-shm", "-journal"} {
				if _, err := os.Lstat(victim + s); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s: victim.db%s exists (%v)", when, s, err)
				}
			}
		}
		if err := os.Symlink(victim, link); err != nil {
			t.Fatal(err)
		}
		_, err := NewSQLiteTransport(link, nil)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "symbolic link") {
			t.Fatalf("NewSQLiteTransport on a link: %v", err)
		}
		checkVictim("NewSQLiteTransport")

		// The link appears after the transport was made, before the first request.
		if err := os.Remove(link); err != nil {
			t.Fatal(err)
		}
		tr, err := NewSQLiteTransport(link, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(victim, link); err != nil {
			t.Fatal(err)
		}
		opts, _ := capturingOptions()
		c := newTestClient(t, tr, opts)
		_, err = c.Acquire(ctx, "n", AcquireOptions{TTL: 5 * time.Second, Wait: 300 * time.Millisecond})
		if err == nil {
			t.Fatal("a lock granted through a link")
		}
		if msg := err.Error() + " " + c.BackendError(); !strings.Contains(msg, "symbolic link") {
			t.Errorf("the error does not say why: %v (backend: %q)", err, c.BackendError())
		}
		checkVictim("Acquire")
		_ = c.Close()
	}
}

// TestSQLiteLinkPutInPlaceOfAHeldFile: the file is replaced by a link under a holder;
// the executor does not follow it: the lease is lost and the link's target untouched.
func TestSQLiteLinkPutInPlaceOfAHeldFile(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path, victim := filepath.Join(dir, "locks.db"), filepath.Join(dir, "victim.db")
	opts, _ := capturingOptions()
	c := newSQLiteClient(t, path, opts)
	l, err := c.Acquire(ctx, "n", AcquireOptions{TTL: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"", "-wal", "-shm"} {
		if err := os.Remove(path + s); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(victim, path); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the holder did not learn that its file was replaced")
	}
	if _, err := os.Lstat(victim); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the link's target was created: %v", err)
	}
}

// TestSQLiteReportsAnUnsafeFile: an existing file or directory that other users may
// write, or that another user owns, is reported on the Client's Logger (and still used);
// -wal and -shm files laxer than the file are tightened.
func TestSQLiteReportsAnUnsafeFile(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "locks.db")

	// A private file, held open; its -wal and -shm are loosened behind its back.
	opts, logs := capturingOptions()
	a := newSQLiteClient(t, path, opts)
	l, err := a.Acquire(ctx, "a", AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	for _, s := range []string{"-wal", "-shm"} {
		if err := os.Chmod(path+s, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	opts2, logs2 := capturingOptions()
	b := newSQLiteClient(t, path, opts2)
	if _, err := b.Acquire(ctx, "b", AcquireOptions{TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"-wal", "-shm"} {
		wantPerm(t, path+s, 0o600)
	}
	if out := logs.String() + logs2.String(); strings.Contains(out, "level=WARN") {
		t.Errorf("a private file was reported:\n%s", out)
	}

	// Writable by others: the file and the directory.
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	opts3, logs3 := capturingOptions()
	c := newSQLiteClient(t, path, opts3)
	if _, err := c.Acquire(ctx, "c", AcquireOptions{TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	out := logs3.String()
	for _, want := range []string{"lock file " + path + " is writable by other users (mode 0666)",
		"lock directory " + dir + " is writable by other users (mode 0777)"} {
		if !strings.Contains(out, want) {
			t.Errorf("not reported: %q in\n%s", want, out)
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}

	// Owned by another user (only root can give a file away).
	if os.Geteuid() != 0 {
		t.Log("not root: the foreign-owner case needs chown")
		return
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	opts4, logs4 := capturingOptions()
	d := newSQLiteClient(t, path, opts4)
	if _, err := d.Acquire(ctx, "d", AcquireOptions{TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if want := "lock file " + path + " is owned by another user (uid 65534)"; !strings.Contains(logs4.String(), want) {
		t.Errorf("not reported: %q in\n%s", want, logs4)
	}
}
