package leasehold

import (
	"context"
	"testing"
	"time"
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
	b := newPostgresClient(t, url, nil)
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
