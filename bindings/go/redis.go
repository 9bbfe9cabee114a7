package leasehold

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisTransport runs the canonical leasehold Lua scripts (read from the
// linked library, never retyped) on one Redis server through go-redis v9,
// with EVALSHA and an EVAL fallback on NOSCRIPT, and delivers release
// notifications through one pub/sub connection that go-redis re-establishes
// (and resubscribes) after a connection loss. Python, C++ and C clients
// using the same scripts contend correctly with it for the same names.
type RedisTransport struct {
	rdb     redis.UniversalClient
	acquire *redis.Script
	renew   *redis.Script
	release *redis.Script

	opMu   sync.Mutex // serialises Watch/unwatch decisions with their (un)subscribe calls
	mu     sync.Mutex
	ps     *redis.PubSub
	subs   map[string]map[*redisSub]struct{} // channel -> subscribers
	names  map[string]string                 // channel -> name
	closed bool
	psDone chan struct{}
}

type redisSub struct{ notify func(string) }

// NewRedisTransport returns a transport on rdb (a *redis.Client in
// practice; the caller keeps ownership of it). Scripts are loaded lazily.
func NewRedisTransport(rdb redis.UniversalClient) (*RedisTransport, error) {
	if rdb == nil {
		return nil, invalidArg("nil redis client")
	}
	a, err := redisScript(redisScriptAcquire)
	if err != nil {
		return nil, err
	}
	r, err := redisScript(redisScriptRenew)
	if err != nil {
		return nil, err
	}
	l, err := redisScript(redisScriptRelease)
	if err != nil {
		return nil, err
	}
	return &RedisTransport{
		rdb:     rdb,
		acquire: redis.NewScript(a),
		renew:   redis.NewScript(r),
		release: redis.NewScript(l),
		subs:    map[string]map[*redisSub]struct{}{},
		names:   map[string]string{},
	}, nil
}

// RedisKeys returns the lock, fence and channel keys of name.
func RedisKeys(name string) (lock, fence, channel string, err error) {
	if lock, err = redisKey(redisKeyLock, name); err != nil {
		return
	}
	if fence, err = redisKey(redisKeyFence, name); err != nil {
		return
	}
	channel, err = redisKey(redisKeyChannel, name)
	return
}

// Load loads the three scripts into the server's script cache (optional:
// Run falls back to EVAL on NOSCRIPT).
func (t *RedisTransport) Load(ctx context.Context) error {
	for _, s := range []*redis.Script{t.acquire, t.renew, t.release} {
		if err := s.Load(ctx, t.rdb).Err(); err != nil {
			return err
		}
	}
	return nil
}

// wrapReply marks Redis error replies (as opposed to network errors).
func wrapReply(err error) error {
	var re redis.Error
	if err != nil && err != redis.Nil && errors.As(err, &re) {
		return fmt.Errorf("%w: %w", ErrBackendReply, err)
	}
	return err
}

func toInt64(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	default:
		return 0, fmt.Errorf("leasehold: unexpected reply element %T %v", v, v)
	}
}

// Acquire implements Transport.
func (t *RedisTransport) Acquire(ctx context.Context, name, token string, ttl time.Duration) (AcquireReply, error) {
	lock, err := redisKey(redisKeyLock, name)
	if err != nil {
		return AcquireReply{}, err
	}
	fence, err := redisKey(redisKeyFence, name)
	if err != nil {
		return AcquireReply{}, err
	}
	ms := int64(ttl / time.Millisecond)
	res, err := t.acquire.Run(ctx, t.rdb, []string{lock, fence}, token, ms).Slice()
	if err != nil {
		return AcquireReply{}, wrapReply(err)
	}
	if len(res) < 2 {
		return AcquireReply{}, fmt.Errorf("%w: malformed acquire reply %v", ErrBackendReply, res)
	}
	flag, err := toInt64(res[0])
	if err != nil {
		return AcquireReply{}, err
	}
	switch flag {
	case 1:
		if len(res) < 3 {
			return AcquireReply{}, fmt.Errorf("%w: malformed acquire reply %v", ErrBackendReply, res)
		}
		f, err := toInt64(res[1])
		if err != nil || f <= 0 {
			return AcquireReply{}, fmt.Errorf("leasehold: malformed fencing token in %v", res)
		}
		g, err := toInt64(res[2])
		if err != nil || g <= 0 {
			return AcquireReply{}, fmt.Errorf("leasehold: malformed ttl in %v", res)
		}
		return AcquireReply{Granted: true, FencingToken: uint64(f), TTL: time.Duration(g) * time.Millisecond}, nil
	case 0:
		r, err := toInt64(res[1])
		if err != nil {
			return AcquireReply{}, err
		}
		if r < 0 {
			return AcquireReply{RetryAfter: -1}, nil
		}
		return AcquireReply{RetryAfter: time.Duration(r) * time.Millisecond}, nil
	}
	return AcquireReply{}, fmt.Errorf("leasehold: malformed acquire reply %v", res)
}

// Renew implements Transport.
func (t *RedisTransport) Renew(ctx context.Context, name, token string, ttl time.Duration, _ []byte) (bool, error) {
	lock, err := redisKey(redisKeyLock, name)
	if err != nil {
		return false, err
	}
	n, err := t.renew.Run(ctx, t.rdb, []string{lock}, token, int64(ttl/time.Millisecond)).Int64()
	if err != nil {
		return false, wrapReply(err)
	}
	return n == 1, nil
}

// Release implements Transport.
func (t *RedisTransport) Release(ctx context.Context, name, token string, _ []byte) (bool, error) {
	lock, err := redisKey(redisKeyLock, name)
	if err != nil {
		return false, err
	}
	ch, err := redisKey(redisKeyChannel, name)
	if err != nil {
		return false, err
	}
	n, err := t.release.Run(ctx, t.rdb, []string{lock}, token, ch, name).Int64()
	if err != nil {
		return false, wrapReply(err)
	}
	return n == 1, nil
}

// errTransportClosed is returned by Watch after Close.
var errTransportClosed = errors.New("leasehold: transport closed")

// Watch implements Transport: it subscribes to the name's release channel
// (one pub/sub connection per transport, shared by every watched name).
// Every (re)subscription confirmation also notifies once, so a release
// published while the subscription was being (re)established wakes a
// waiter instead of being missed.
func (t *RedisTransport) Watch(ctx context.Context, name string, notify func(string)) (func(), error) {
	ch, err := redisKey(redisKeyChannel, name)
	if err != nil {
		return nil, err
	}
	sub := &redisSub{notify: notify}
	t.opMu.Lock()
	defer t.opMu.Unlock()
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, errTransportClosed
	}
	first := len(t.subs[ch]) == 0
	if t.subs[ch] == nil {
		t.subs[ch] = map[*redisSub]struct{}{}
	}
	t.subs[ch][sub] = struct{}{}
	t.names[ch] = name
	var ps *redis.PubSub
	if t.ps == nil {
		// The first subscription creates the connection.
		t.ps = t.rdb.Subscribe(ctx, ch)
		t.psDone = make(chan struct{})
		go t.listen(t.ps, t.psDone)
		first = false
	}
	ps = t.ps
	t.mu.Unlock()
	if first {
		if err := ps.Subscribe(ctx, ch); err != nil {
			t.dropLocked(ch, sub)
			return nil, err
		}
	}
	var once sync.Once
	return func() { once.Do(func() { t.drop(ch, sub) }) }, nil
}

func (t *RedisTransport) drop(ch string, sub *redisSub) {
	t.opMu.Lock()
	defer t.opMu.Unlock()
	t.dropLocked(ch, sub)
}

func (t *RedisTransport) dropLocked(ch string, sub *redisSub) {
	t.mu.Lock()
	delete(t.subs[ch], sub)
	last := len(t.subs[ch]) == 0
	if last {
		delete(t.subs, ch)
		delete(t.names, ch)
	}
	ps := t.ps
	t.mu.Unlock()
	if last && ps != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = ps.Unsubscribe(ctx, ch)
		cancel()
	}
}

func (t *RedisTransport) listen(ps *redis.PubSub, done chan struct{}) {
	defer close(done)
	for m := range ps.ChannelWithSubscriptions(redis.WithChannelSize(1024)) {
		var ch string
		switch v := m.(type) {
		case *redis.Message:
			ch = v.Channel
		case *redis.Subscription:
			if v.Kind != "subscribe" {
				continue
			}
			ch = v.Channel
		default:
			continue
		}
		t.mu.Lock()
		name := t.names[ch]
		var targets []func(string)
		for s := range t.subs[ch] {
			targets = append(targets, s.notify)
		}
		t.mu.Unlock()
		for _, f := range targets {
			f(name)
		}
	}
}

// Close closes the pub/sub connection (not the Redis client).
func (t *RedisTransport) Close() error {
	t.mu.Lock()
	t.closed = true
	ps, done := t.ps, t.psDone
	t.ps = nil
	t.mu.Unlock()
	if ps == nil {
		return nil
	}
	err := ps.Close()
	<-done
	return err
}
