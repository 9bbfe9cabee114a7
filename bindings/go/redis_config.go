package leasehold

import (
	"context"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisExecutor is the Redis executor: a LockClient made
// on it speaks the core's Redis protocol (keys, scripts, the wait queue,
// the meaning of every reply: docs/redis-protocol.md) and only runs what
// the core asks, verbatim, on rdb (commands) and on a pub/sub connection of
// its own (its wake channel). Connection options (password, ACL user, DB,
// unix socket, TLS, Sentinel) are those of the go-redis client. Python,
// C++ and C clients contend correctly with it for the same names.
type RedisExecutor struct {
	rdb   redis.UniversalClient
	owned bool // Close closes rdb
	proto redisProtocol
}

// RedisOptions tunes the core's Redis protocol; zero fields take its defaults.
type RedisOptions struct {
	// StandbyDelay: how long a waiter told to stand by waits for the woken
	// one to take the lock before it tries (default 150ms), which bounds how
	// long a frozen waiter at the head of the queue keeps the lock free.
	StandbyDelay time.Duration
	// KeyKeep: how long the fence and queue keys outlive the lease they
	// serve (default 60s).
	KeyKeep time.Duration
	// QueueMaxAge: queue entries older than this are dropped at a release
	// (default 10 minutes).
	QueueMaxAge time.Duration
	// IdleRecheck: how long a queued waiter behind the head waits before it
	// asks again on its own (default 10s).
	IdleRecheck time.Duration
	// ShardedWake: wake-ups on one shard channel per name (SPUBLISH /
	// SSUBSCRIBE, Redis 7+), for Redis Cluster. NewRedisExecutor sets it for a
	// *redis.ClusterClient, the only client it works with.
	ShardedWake bool
	// CloseClient makes RedisExecutor.Close close the go-redis client too (the
	// executor owns it). Default false: the caller keeps it.
	CloseClient bool
}

// NewRedisExecutor returns the Redis executor for rdb, any go-redis v9 client:
// redis.NewClient (an address or a unix socket, ACL user, password, DB, TLS),
// redis.NewFailoverClient (Sentinel: the master the sentinels name, followed
// across failovers) or redis.NewClusterClient (Redis Cluster 7+: commands routed
// by their keys' slot, wake-ups on each name's shard channel, so ShardedWake is
// set). The caller keeps rdb unless o.CloseClient is set. o may be nil.
//
// Replication is asynchronous (Sentinel, and per shard in a Cluster): a failover
// can lose a held lease's key. Its next renewal finds it gone and the lease is
// lost (Lost; a LostError "rejected by the backend"); fences never go back while
// the servers' clocks are sane (docs/backends.md).
func NewRedisExecutor(rdb redis.UniversalClient, o *RedisOptions) (*RedisExecutor, error) {
	if rdb == nil {
		return nil, invalidArg("nil redis client")
	}
	var opt RedisOptions
	if o != nil {
		opt = *o
	}
	cc, cluster := rdb.(*redis.ClusterClient)
	if cluster {
		if cc == nil {
			return nil, invalidArg("nil redis cluster client")
		}
		if co := cc.Options(); co.ReadOnly || co.RouteByLatency || co.RouteRandomly {
			return nil, invalidArg("redis cluster options: locks are taken on the masters only")
		}
		opt.ShardedWake = true
	}
	return newRedisExecutor(rdb, opt, opt.CloseClient)
}

// newRedisExecutor is NewRedisExecutor without the cluster defaults (the deprecated
// constructors keep their own).
func newRedisExecutor(rdb redis.UniversalClient, o RedisOptions, owned bool) (*RedisExecutor, error) {
	if rdb == nil {
		return nil, invalidArg("nil redis client")
	}
	ms := func(d time.Duration) uint64 { return uint64(max(d, 0) / time.Millisecond) }
	t := &RedisExecutor{rdb: rdb, owned: owned, proto: redisProtocol{standbyDelayMs: ms(o.StandbyDelay), keyKeepMs: ms(o.KeyKeep),
		queueMaxAgeMs: ms(o.QueueMaxAge), idleRecheckMs: ms(o.IdleRecheck), shardedWake: o.ShardedWake}}
	if _, cluster := rdb.(*redis.ClusterClient); t.proto.shardedWake && !cluster {
		return nil, invalidArg("RedisOptions.ShardedWake needs a *redis.ClusterClient")
	}
	return t, nil
}

// Close closes the go-redis client if the executor owns it (RedisOptions.CloseClient,
// or an executor opened from a URL). Each LockClient closes its own pub/sub connection in
// LockClient.Close.
func (t *RedisExecutor) Close() error {
	if t.owned {
		return t.rdb.Close()
	}
	return nil
}

// SetLogger is kept for compatibility and ignored: the LockClient's
// Options.Logger receives what the executor has to say.
func (t *RedisExecutor) SetLogger(*slog.Logger) {}

// Load is kept for compatibility and does nothing: the core loads its
// scripts itself.
func (t *RedisExecutor) Load(context.Context) error { return nil }

func (t *RedisExecutor) backend() backendOptions {
	return backendOptions{kind: backendRedis, redis: t.proto}
}

// start makes one LockClient's executor: commands run on rdb, (un)subscriptions on a
// pub/sub connection of the LockClient's own.
func (t *RedisExecutor) start(c *client) (ioExec, error) {
	x := &redisExec{c: c, rdb: t.rdb, deadlined: ctxDeadlines(t.rdb),
		sub: &subscriber{c: c, rdb: t.rdb, kick: make(chan struct{}, 1), health: subHealthCheck}}
	x.sub.wg.Add(1)
	go x.sub.run(c.stop)
	return x, nil
}

// checkFailoverOptions refuses Sentinel options that could not reach the master.
func checkFailoverOptions(opt *redis.FailoverOptions) error {
	if opt == nil {
		return invalidArg("nil redis failover options")
	}
	if opt.MasterName == "" || len(opt.SentinelAddrs) == 0 {
		return invalidArg("redis failover options need MasterName and SentinelAddrs")
	}
	if opt.ReplicaOnly || opt.RouteByLatency || opt.RouteRandomly {
		return invalidArg("redis failover options: locks are taken on the master only")
	}
	return nil
}
