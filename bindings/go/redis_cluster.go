package leasehold

// The Redis Cluster part of the Redis executor (redis.go): each shard channel
// the core subscribes (SSUBSCRIBE, the sharded wake of RedisOptions.ShardedWake)
// gets a pub/sub connection of its own on the master serving its slot.

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// execShard runs one SSUBSCRIBE / SUNSUBSCRIBE of a shard channel (Redis
// Cluster): each channel gets a pub/sub connection of its own on the master
// serving its slot. SUNSUBSCRIBE closes it; the core has forgotten the name.
func (s *subscriber) execShard(q *ioRequest) {
	cc, ok := s.rdb.(*redis.ClusterClient)
	if len(q.argv) != 2 || !ok {
		s.c.log.Debug("leasehold: shard channel request without a cluster client", "command", q.argv[0])
		s.c.input(func(now uint64) error {
			return s.c.core.ioFailed(now, q.id, failTransport, "a shard channel needs a cluster client")
		})
		return
	}
	ch := q.argv[1]
	s.mu.Lock()
	old := s.shards[ch]
	delete(s.shards, ch)
	stale := s.shardStale
	s.shardStale = false
	s.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	if strings.EqualFold(q.argv[0], "SUNSUBSCRIBE") {
		return
	}
	ctx, cancel := context.WithTimeout(s.c.ioCtx, s.c.reqTimeout)
	defer cancel()
	if stale {
		cc.ReloadState(ctx)
	}
	ps := cc.SSubscribe(ctx) // dials on the first SSUBSCRIBE, by its channel's slot
	if err := ps.SSubscribe(ctx, ch); err != nil {
		_ = ps.Close()
		s.mu.Lock()
		s.shardStale = true
		s.mu.Unlock()
		s.c.log.Debug("leasehold: redis SSUBSCRIBE failed", "channel", ch, "err", err)
		s.c.input(func(now uint64) error { return s.c.core.ioFailed(now, q.id, failTransport, failMessage(err)) })
		return
	}
	s.mu.Lock()
	if s.shards == nil {
		s.shards = map[string]*redis.PubSub{}
	}
	s.shards[ch] = ps
	s.mu.Unlock()
	s.wg.Add(1)
	go s.receiveShard(ch, ps)
}

func (s *subscriber) receiveShard(ch string, ps *redis.PubSub) {
	s.pump(ps, func(err error) { s.lostShard(ch, ps, err) }, func(m *redis.Subscription) bool {
		switch m.Kind {
		case "ssubscribe":
			s.c.input(func(now uint64) error { return s.c.core.ioConnection(now, connNotify, connSubscribed, m.Channel) })
		case "sunsubscribe": // the slot left this node
			s.lostShard(ch, ps, errors.New("sunsubscribe from the server"))
			return false
		}
		return true
	})
}

// lostShard drops a shard channel's connection (once) and reports the
// channel gone; the core subscribes it again, routed on a reloaded slot map.
func (s *subscriber) lostShard(ch string, ps *redis.PubSub, err error) {
	s.mu.Lock()
	if s.shards[ch] != ps {
		s.mu.Unlock()
		return
	}
	delete(s.shards, ch)
	s.shardStale = true
	s.mu.Unlock()
	_ = ps.Close()
	s.c.log.Debug("leasehold: redis shard channel lost", "channel", ch, "err", err)
	s.c.input(func(now uint64) error { return s.c.core.ioConnection(now, connNotify, connUnsubscribed, ch) })
}
