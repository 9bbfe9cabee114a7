package leasehold

import (
	"context"
	"path/filepath"
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
