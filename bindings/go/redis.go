package leasehold

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisTransport runs the canonical leasehold Lua scripts (read from the
// linked library, never retyped) on one Redis server through go-redis v9,
// with EVALSHA and an EVAL fallback on NOSCRIPT. Python, C++ and C clients
// using the same scripts contend correctly with it for the same names.
//
// Waiting follows Redis protocol 2: the transport subscribes one wake
// channel of its own (on one pub/sub connection that go-redis
// re-establishes and resubscribes after a connection loss) and queues it
// with the ACQUIRE attempts for names it waits for, so a release wakes one
// waiting client instead of every client waiting for the name.
type RedisTransport struct {
	rdb     redis.UniversalClient
	acquire *redis.Script
	renew   *redis.Script
	release *redis.Script
	notify  *redis.Script
	wake    string // this transport's wake channel
	log     atomic.Pointer[slog.Logger]

	mu        sync.Mutex
	ps        *redis.PubSub
	psDone    chan struct{}
	closed    bool
	subSent   bool                              // SUBSCRIBE of the wake channel was written
	confirmed bool                              // the server confirmed the wake subscription
	waiting   map[string]map[*redisSub]struct{} // name -> Watch/WatchWaiter callers
	queued    map[string]struct{}               // names a queueing ACQUIRE was sent for

	bg       sync.WaitGroup // NOTIFY pass-ons
	bgCtx    context.Context
	bgCancel context.CancelFunc

	stats redisStats
}

type redisSub struct{ wake func(string) bool }

// redisStats counts what the wake channel delivered (read by tests).
type redisStats struct {
	wakes    atomic.Int64 // wake-ups a waiter here took
	rechecks atomic.Int64 // notifications without a wake-up (subscription (re)confirmed)
	passOns  atomic.Int64 // wake-ups no waiter here took, passed on
}

// redisOpTimeout bounds the best-effort calls made off the Client's
// requests (ZREM on unwatch, NOTIFY pass-ons).
const redisOpTimeout = 2 * time.Second

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
	n, err := redisScript(redisScriptNotify)
	if err != nil {
		return nil, err
	}
	// Unguessable, so no other client's releases can be steered to us.
	var random [wakeRandomLen]byte
	if _, err := rand.Read(random[:]); err != nil {
		return nil, fmt.Errorf("leasehold: wake channel: %w", err)
	}
	wake, err := redisWakeChannel(random)
	if err != nil {
		return nil, err
	}
	t := &RedisTransport{
		rdb:     rdb,
		acquire: redis.NewScript(a),
		renew:   redis.NewScript(r),
		release: redis.NewScript(l),
		notify:  redis.NewScript(n),
		wake:    wake,
		waiting: map[string]map[*redisSub]struct{}{},
		queued:  map[string]struct{}{},
	}
	t.bgCtx, t.bgCancel = context.WithCancel(context.Background())
	return t, nil
}

// SetLogger sets the logger for the transport's best-effort calls (removing
// its wake channel from a queue, passing a wake-up on): they are not part of
// any request, so their failures are only logged. Default: none.
func (t *RedisTransport) SetLogger(l *slog.Logger) { t.log.Store(l) }

func (t *RedisTransport) logFailure(op, name string, err error) {
	l := t.log.Load()
	if l == nil {
		return
	}
	if err = wrapReply(err); errors.Is(err, ErrBackendReply) {
		l.Warn("leasehold: backend error reply", "op", op, "name", name, "err", err)
		return
	}
	l.Debug("leasehold: "+op+" failed", "name", name, "err", err)
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

// Load loads the four scripts into the server's script cache (optional:
// Run falls back to EVAL on NOSCRIPT).
func (t *RedisTransport) Load(ctx context.Context) error {
	for _, s := range []*redis.Script{t.acquire, t.renew, t.release, t.notify} {
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
	keys, args := []string{lock, fence}, []any{token, ms}
	if t.queueing(name) {
		waiters, err := redisKey(redisKeyWaiters, name)
		if err != nil {
			return AcquireReply{}, err
		}
		keys, args = append(keys, waiters), append(args, t.wake)
	}
	res, err := t.acquire.Run(ctx, t.rdb, keys, args...).Slice()
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
	waiters, err := redisKey(redisKeyWaiters, name)
	if err != nil {
		return false, err
	}
	args := []any{token, ch, name}
	if t.takeQueued(name) {
		// If the script does not get to drop it (not the owner, an error),
		// the entry is popped by a later release and the wake-up passed on.
		args = append(args, t.wake)
	}
	n, err := t.release.Run(ctx, t.rdb, []string{lock, waiters}, args...).Int64()
	if err != nil {
		return false, wrapReply(err)
	}
	return n == 1, nil
}

// queueing reports whether an ACQUIRE of name queues the wake channel: only
// while name is waiting, and only once the server confirmed the wake
// subscription (else a release could pop the entry unheard).
func (t *RedisTransport) queueing(name string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.confirmed || len(t.waiting[name]) == 0 {
		return false
	}
	t.queued[name] = struct{}{}
	return true
}

// takeQueued reports (and forgets) a name that has queued the wake channel
// and waits no more: its RELEASE drops the entry.
func (t *RedisTransport) takeQueued(name string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.queued[name]; !ok || len(t.waiting[name]) > 0 {
		return false
	}
	delete(t.queued, name)
	return true
}

// errTransportClosed is returned by Watch after Close.
var errTransportClosed = errors.New("leasehold: transport closed")

// Watch implements Transport: name counts as waiting until unwatch, so the
// ACQUIREs for it queue this transport's wake channel, and a wake-up for
// name calls notify. The wake channel is subscribed on the first Watch and
// stays subscribed until Close. A release published while our entry could
// not be heard is made up for: notify is also called once when the server
// (re)confirms the wake subscription, and at once for a Watch on a
// subscription already confirmed (whose first attempts may not have queued).
// Watch does not subscribe the name's release channel. A wake-up counts as
// taken by notify; WatchWaiter lets the caller decline it.
func (t *RedisTransport) Watch(ctx context.Context, name string, notify func(string)) (func(), error) {
	return t.WatchWaiter(ctx, name, func(n string) bool { notify(n); return true })
}

// WatchWaiter implements WaiterWatcher: Watch, except that a wake-up that
// wake declines (returns false for), and that no other registration for
// name takes, is passed on to the next queued client. The re-checks on
// subscription confirmation ignore wake's result.
func (t *RedisTransport) WatchWaiter(ctx context.Context, name string, wake func(string) bool) (func(), error) {
	if _, err := redisKey(redisKeyWaiters, name); err != nil {
		return nil, err
	}
	sub := &redisSub{wake: wake}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, errTransportClosed
	}
	if t.waiting[name] == nil {
		t.waiting[name] = map[*redisSub]struct{}{}
	}
	t.waiting[name][sub] = struct{}{}
	recheck := t.confirmed
	if t.ps == nil {
		// Without a channel Subscribe does no IO, so the dial is not under mu.
		t.ps, t.psDone = t.rdb.Subscribe(context.Background()), make(chan struct{})
		go t.listen(t.ps, t.psDone)
	}
	ps, send := t.ps, !t.confirmed && !t.subSent
	t.subSent = t.subSent || send
	t.mu.Unlock()
	if send {
		if err := ps.Subscribe(ctx, t.wake); err != nil {
			// go-redis resubscribes when it reconnects, but a failed write can
			// leave the connection without the channel: the next Watch retries.
			t.mu.Lock()
			t.subSent = false
			t.mu.Unlock()
		}
	}
	if recheck {
		t.stats.rechecks.Add(1)
		wake(name)
	}
	var once sync.Once
	return func() { once.Do(func() { t.unwatch(name, sub) }) }, nil
}

// unwatch ends sub's wait; when name waits no more and has queued the wake
// channel, the entry is removed (best effort: a stale entry costs one
// pass-on).
func (t *RedisTransport) unwatch(name string, sub *redisSub) {
	t.mu.Lock()
	delete(t.waiting[name], sub)
	var zrem bool
	if len(t.waiting[name]) == 0 {
		_, zrem = t.queued[name]
		delete(t.waiting, name)
		delete(t.queued, name)
	}
	t.mu.Unlock()
	if !zrem {
		return
	}
	waiters, err := redisKey(redisKeyWaiters, name)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), redisOpTimeout)
	defer cancel()
	if err := t.rdb.ZRem(ctx, waiters, t.wake).Err(); err != nil {
		t.logFailure("zrem", name, err)
	}
}

func (t *RedisTransport) listen(ps *redis.PubSub, done chan struct{}) {
	defer close(done)
	for m := range ps.ChannelWithSubscriptions(redis.WithChannelSize(1024)) {
		switch v := m.(type) {
		case *redis.Subscription:
			if v.Kind == "subscribe" && v.Channel == t.wake {
				t.confirm()
			}
		case *redis.Message:
			if v.Channel == t.wake {
				t.woken(v.Payload)
			}
		}
	}
}

// confirm runs on every (re)confirmation of the wake subscription:
// ACQUIREs may queue from now on, and every waiting name is re-checked,
// since a release may have popped our entry while nobody listened.
func (t *RedisTransport) confirm() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.confirmed = true
	type call struct {
		name string
		wake func(string) bool
	}
	var calls []call
	for name, subs := range t.waiting {
		for s := range subs {
			calls = append(calls, call{name, s.wake})
		}
	}
	t.mu.Unlock()
	t.stats.rechecks.Add(int64(len(calls)))
	for _, c := range calls {
		c.wake(c.name)
	}
}

// woken handles a wake-up for name: the waiters for it try again, or, when
// none here takes it (nobody waits for it any more, or a client's last
// waiter just left before its unwatch), the wake-up goes to the next queued
// client (NOTIFY, off the pub/sub connection, best effort).
func (t *RedisTransport) woken(name string) {
	t.mu.Lock()
	var targets []func(string) bool
	for s := range t.waiting[name] {
		targets = append(targets, s.wake)
	}
	t.mu.Unlock()
	// All hear it: the clients sharing this transport share its one entry.
	took := false
	for _, f := range targets {
		took = f(name) || took
	}
	if took {
		t.stats.wakes.Add(1)
		return
	}
	waiters, err := redisKey(redisKeyWaiters, name)
	if err != nil {
		return // not a lock name: not published by a leasehold script
	}
	t.stats.passOns.Add(1)
	// Close waits for the listener before it waits for bg: no Add after Wait.
	t.bg.Add(1)
	go func() {
		defer t.bg.Done()
		ctx, cancel := context.WithTimeout(t.bgCtx, redisOpTimeout)
		defer cancel()
		if err := t.notify.Run(ctx, t.rdb, []string{waiters}, name, t.wake).Err(); err != nil {
			t.logFailure("notify", name, err)
		}
	}()
}

// Close closes the pub/sub connection (not the Redis client) and waits for
// the pass-ons in flight. ACQUIREs after Close no longer queue.
func (t *RedisTransport) Close() error {
	t.mu.Lock()
	t.closed = true
	t.confirmed = false
	ps, done := t.ps, t.psDone
	t.ps = nil
	t.mu.Unlock()
	var err error
	if ps != nil {
		err = ps.Close()
		<-done
	}
	t.bgCancel()
	t.bg.Wait()
	return err
}
