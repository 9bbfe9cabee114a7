package leasehold

// The Redis executor: it runs the requests of a core speaking the Redis protocol
// (LH_BACKEND_REDIS), verbatim, and hands back replies,
// pub/sub messages and subscription changes unread. It knows no key, script,
// argument or reply: the core does (docs/redis-protocol.md). Beside it:
// redis_config.go (RedisExecutor: the go-redis client and its options),
// redis_reply.go (go-redis replies as the core's values) and redis_cluster.go
// (Redis Cluster shard channels).

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisExec runs one LockClient's Redis requests: commands on rdb, in goroutines of
// their own or on a caller's; (un)subscriptions in order on the subscriber.
type redisExec struct {
	c         *client
	rdb       redis.UniversalClient
	sub       *subscriber
	deadlined bool // rdb bounds its commands by their ctx's deadline
}

func (x *redisExec) run(q *ioRequest) (*job, error) {
	if q.kind != ioCommand || len(q.argv) == 0 {
		return nil, errUnsupportedIO
	}
	if q.connection == connNotify {
		x.sub.push(q)
		return nil, nil
	}
	return &job{id: q.id, timeout: x.c.reqTimeout, deadlined: x.deadlined,
		run: func(ctx context.Context) { x.c.command(ctx, x.rdb, q) }}, nil
}

// ctxDeadlines reports a go-redis client that bounds its commands' IO by their ctx's
// deadline (ContextTimeoutEnabled; without it a read waits out ReadTimeout).
func ctxDeadlines(rdb redis.UniversalClient) bool {
	switch r := rdb.(type) {
	case *redis.Client:
		return r.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return r.Options().ContextTimeoutEnabled
	}
	return false
}

// close waits for the subscriber's goroutines (the driver's stop ended them).
func (x *redisExec) close() { x.sub.wg.Wait() }

// command runs one request of the commands connection and hands back its
// reply, or a transport failure, with the request's id.
func (c *client) command(ctx context.Context, rdb redis.UniversalClient, q *ioRequest) {
	args := make([]any, len(q.argv))
	for i, a := range q.argv {
		args[i] = a
	}
	v, err := rdb.Do(ctx, args...).Result()
	var re redis.Error
	switch {
	case errors.Is(err, redis.Nil):
		v, err = nil, nil
	case errors.As(err, &re):
		v, err = re, nil
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok && err != nil {
		// go-redis reloads its slot map on MOVED, not when a master stopped
		// answering: ask for it, so the retry finds the promoted replica.
		cc.ReloadState(ctx)
	}
	var vals []lhValue
	var data []byte
	if err == nil {
		vals, data, err = flatten(nil, nil, v)
	}
	c.input(func(now uint64) error {
		if err == nil {
			if err = c.core.ioReply(now, q.id, vals, data); err == nil || !isStatus(err, statusInvalidReply) {
				return err
			}
		}
		c.log.Debug("leasehold: redis request failed", "command", q.argv[0], "err", err)
		return c.core.ioFailed(now, q.id, failTransport, failMessage(err))
	})
}

// subscriber runs the core's SUBSCRIBE / UNSUBSCRIBE requests in order on a
// pub/sub connection and feeds back every message and confirmation. When
// the connection breaks, every channel written on it is reported lost and
// the connection is dropped (go-redis would resubscribe behind the core's
// back); the core then asks to subscribe again, on a new one.
type subscriber struct {
	c         *client
	rdb       redis.UniversalClient
	mu        sync.Mutex
	queue     []*ioRequest
	kick      chan struct{}
	ps        *redis.PubSub
	channels  map[string]struct{} // (UN)SUBSCRIBE written on ps
	receiving bool                // ps has its reader
	lostAt    time.Time
	health    time.Duration // subHealthCheck when made
	wg        sync.WaitGroup
	// Redis Cluster (sharded wake): one pub/sub connection per shard channel,
	// on the master of its slot (go-redis binds a pub/sub connection to the
	// node of its first channel).
	shards     map[string]*redis.PubSub
	shardStale bool // a shard connection failed: reload the slot map
}

// subHealthCheck: a pub/sub connection silent this long is pinged; silent
// twice in a row, it is taken for dead.
var subHealthCheck = 15 * time.Second

// push queues one (UN)SUBSCRIBE for the subscriber's goroutine (c.mu held).
func (s *subscriber) push(q *ioRequest) {
	s.mu.Lock()
	s.queue = append(s.queue, q)
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *subscriber) run(stop <-chan struct{}) {
	defer s.wg.Done()
	for {
		select {
		case <-s.kick:
		case <-stop:
			s.mu.Lock()
			ps := s.ps
			s.ps = nil
			shards := s.shards
			s.shards = nil
			s.mu.Unlock()
			if ps != nil {
				_ = ps.Close()
			}
			for _, sp := range shards {
				_ = sp.Close()
			}
			return
		}
		for s.c.ioCtx.Err() == nil {
			s.mu.Lock()
			if len(s.queue) == 0 {
				s.mu.Unlock()
				break
			}
			q := s.queue[0]
			s.queue = s.queue[1:]
			s.mu.Unlock()
			s.exec(q)
		}
	}
}

// exec writes one (UN)SUBSCRIBE on the pub/sub connection, opening it if needed.
func (s *subscriber) exec(q *ioRequest) {
	if strings.EqualFold(q.argv[0], "SSUBSCRIBE") || strings.EqualFold(q.argv[0], "SUNSUBSCRIBE") {
		s.execShard(q)
		return
	}
	s.mu.Lock()
	if s.ps == nil {
		// A server that drops every connection must not make this a busy loop.
		pause := time.Until(s.lostAt.Add(100 * time.Millisecond))
		s.mu.Unlock()
		time.Sleep(pause)
		s.mu.Lock()
		s.ps, s.channels, s.receiving = s.rdb.Subscribe(s.c.ioCtx), map[string]struct{}{}, false
	}
	ps := s.ps
	sub := strings.EqualFold(q.argv[0], "SUBSCRIBE")
	// Counted before the write: a confirmation may be read before Subscribe returns.
	for _, ch := range q.argv[1:] {
		if sub {
			s.channels[ch] = struct{}{}
		} else {
			delete(s.channels, ch)
		}
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.c.ioCtx, s.c.reqTimeout)
	var err error
	if sub {
		err = ps.Subscribe(ctx, q.argv[1:]...)
	} else {
		err = ps.Unsubscribe(ctx, q.argv[1:]...)
	}
	cancel()
	s.mu.Lock()
	if err != nil && sub && s.ps == ps {
		for _, ch := range q.argv[1:] {
			delete(s.channels, ch) // never written: failed, not lost
		}
	}
	if err == nil && s.ps == ps && !s.receiving {
		// Read once the connection exists: a reader would dial on its own.
		s.receiving = true
		s.wg.Add(1)
		go s.receive(ps)
	}
	s.mu.Unlock()
	if err != nil {
		s.c.input(func(now uint64) error { return s.c.core.ioFailed(now, q.id, failTransport, failMessage(err)) })
		s.lost(ps, err)
	}
}

func (s *subscriber) receive(ps *redis.PubSub) {
	s.pump(ps, func(err error) { s.lost(ps, err) }, func(m *redis.Subscription) bool {
		if m.Kind == "subscribe" || m.Kind == "unsubscribe" {
			ev := uint32(connUnsubscribed)
			if m.Kind == "subscribe" {
				ev = connSubscribed
			}
			s.c.input(func(now uint64) error { return s.c.core.ioConnection(now, connNotify, ev, m.Channel) })
		}
		return true
	})
}

// pump feeds the core every message read on ps, and each subscription
// change to sub, until sub returns false or ps fails: a read timeout is
// answered with one PING first, so an idle connection is not taken for a
// dead one.
func (s *subscriber) pump(ps *redis.PubSub, lost func(error), sub func(*redis.Subscription) bool) {
	defer s.wg.Done()
	pinged := false
	for {
		m, err := ps.ReceiveTimeout(s.c.ioCtx, s.health)
		var ne net.Error
		if err != nil && errors.As(err, &ne) && ne.Timeout() && !pinged {
			pinged = true
			_ = ps.Ping(s.c.ioCtx)
			continue
		}
		if err != nil {
			lost(err)
			return
		}
		pinged = false
		switch m := m.(type) {
		case *redis.Message:
			s.c.input(func(now uint64) error { return s.c.core.ioMessage(now, m.Channel, m.Payload) })
		case *redis.Subscription:
			if !sub(m) {
				return
			}
		}
	}
}

// lost drops ps (once) and reports every channel written on it as gone.
func (s *subscriber) lost(ps *redis.PubSub, err error) {
	s.mu.Lock()
	if s.ps != ps {
		s.mu.Unlock()
		return
	}
	chans := s.channels
	s.ps, s.channels, s.lostAt = nil, nil, time.Now()
	s.mu.Unlock()
	_ = ps.Close()
	s.c.log.Debug("leasehold: redis pub/sub connection lost", "err", err)
	for ch := range chans {
		s.c.input(func(now uint64) error { return s.c.core.ioConnection(now, connNotify, connUnsubscribed, ch) })
	}
}
