package leasehold

import (
	"context"
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

func TestEtcdAcquireReleaseAndFences(t *testing.T) {
	urls := needEtcd(t)
	ctx := context.Background()
	name := uniq(t, "etcd")
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
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
