package leasehold

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisTransport is the configuration of the Redis executor: a Client made
// on it speaks the core's Redis protocol (keys, scripts, the wait queue,
// the meaning of every reply: docs/redis-protocol.md) and only runs what
// the core asks, verbatim, on rdb (commands) and on a pub/sub connection of
// its own (its wake channel). Connection options (password, ACL user, DB,
// unix socket, TLS, Sentinel) are those of the go-redis client. Python,
// C++ and C clients contend correctly with it for the same names.
type RedisTransport struct {
	rdb   redis.UniversalClient
	owned bool // made by NewRedisTransportFromOptions: Close closes it
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
	// SSUBSCRIBE, Redis 7+), for Redis Cluster. The cluster constructors set
	// it; rdb must then be a *redis.ClusterClient.
	ShardedWake bool
}

// NewRedisTransport returns the executor configuration for rdb (the caller
// keeps ownership of it) with the protocol's default options.
func NewRedisTransport(rdb redis.UniversalClient) (*RedisTransport, error) {
	return NewRedisTransportWithOptions(rdb, nil)
}

// NewRedisTransportWithOptions is NewRedisTransport with protocol options (o may be nil).
func NewRedisTransportWithOptions(rdb redis.UniversalClient, o *RedisOptions) (*RedisTransport, error) {
	if rdb == nil {
		return nil, invalidArg("nil redis client")
	}
	t := &RedisTransport{rdb: rdb}
	if o != nil {
		ms := func(d time.Duration) uint64 { return uint64(max(d, 0) / time.Millisecond) }
		t.proto = redisProtocol{standbyDelayMs: ms(o.StandbyDelay), keyKeepMs: ms(o.KeyKeep),
			queueMaxAgeMs: ms(o.QueueMaxAge), idleRecheckMs: ms(o.IdleRecheck), shardedWake: o.ShardedWake}
	}
	if _, cluster := rdb.(*redis.ClusterClient); t.proto.shardedWake && !cluster {
		return nil, invalidArg("RedisOptions.ShardedWake needs a *redis.ClusterClient")
	}
	return t, nil
}

// NewRedisClusterTransport returns the executor configuration for a Redis
// Cluster client (the caller keeps ownership of it): commands are routed by
// their keys' slot (every key of a name has the hash tag {NAME}) and the
// wake-ups of a name travel on its shard channel (docs/redis-protocol.md), subscribed
// on the master of its slot while this client waits on the name (Redis 7+).
// o may be nil; ShardedWake is set either way.
//
// Replication is asynchronous per shard: a failover can lose a held lease's
// key. Its next renewal finds it gone and the lease is lost (Lost; a
// LostError "rejected by the backend"); fences never go back while the
// servers' clocks are sane (docs/backends.md).
func NewRedisClusterTransport(cc *redis.ClusterClient, o *RedisOptions) (*RedisTransport, error) {
	if cc == nil {
		return nil, invalidArg("nil redis cluster client")
	}
	opts := RedisOptions{}
	if o != nil {
		opts = *o
	}
	opts.ShardedWake = true
	return NewRedisTransportWithOptions(cc, &opts)
}

// NewRedisTransportFromClusterOptions makes a go-redis cluster client
// (redis.NewClusterClient) from opt for NewRedisClusterTransport; Close
// closes it. Replica reads are refused: locks are taken on the masters.
func NewRedisTransportFromClusterOptions(opt *redis.ClusterOptions, o *RedisOptions) (*RedisTransport, error) {
	if opt == nil {
		return nil, invalidArg("nil redis cluster options")
	}
	if len(opt.Addrs) == 0 && opt.ClusterSlots == nil {
		return nil, invalidArg("redis cluster options need Addrs")
	}
	if opt.ReadOnly || opt.RouteByLatency || opt.RouteRandomly {
		return nil, invalidArg("redis cluster options: locks are taken on the masters only")
	}
	t, err := NewRedisClusterTransport(redis.NewClusterClient(opt), o)
	if t != nil {
		t.owned = true
	}
	return t, err
}

// NewRedisTransportFromOptions makes a go-redis client from opt (Addr or a
// unix socket path with Network "unix", Username/Password, DB, TLSConfig…)
// for the executor; Close closes it.
func NewRedisTransportFromOptions(opt *redis.Options, o *RedisOptions) (*RedisTransport, error) {
	if opt == nil {
		return nil, invalidArg("nil redis options")
	}
	t, err := NewRedisTransportWithOptions(redis.NewClient(opt), o)
	if t != nil {
		t.owned = true
	}
	return t, err
}

// NewRedisTransportFromFailoverOptions makes a go-redis failover client
// (redis.NewFailoverClient) from opt for the executor: the master is the one
// the sentinels (opt.SentinelAddrs) name opt.MasterName, and the commands and
// the pub/sub connection both follow a failover, since go-redis asks the
// sentinels again when it dials and closes its connections to a replaced
// master. Close closes the client.
//
// Replication is asynchronous: a failover can lose a held lease's key. The
// lease's next renewal then finds it gone and the lease is lost (Lost; a
// LostError "rejected by the backend"); fences never go back while the
// servers' clocks are sane (docs/backends.md).
func NewRedisTransportFromFailoverOptions(opt *redis.FailoverOptions, o *RedisOptions) (*RedisTransport, error) {
	if opt == nil {
		return nil, invalidArg("nil redis failover options")
	}
	if opt.MasterName == "" || len(opt.SentinelAddrs) == 0 {
		return nil, invalidArg("redis failover options need MasterName and SentinelAddrs")
	}
	if opt.ReplicaOnly || opt.RouteByLatency || opt.RouteRandomly {
		return nil, invalidArg("redis failover options: locks are taken on the master only")
	}
	t, err := NewRedisTransportWithOptions(redis.NewFailoverClient(opt), o)
	if t != nil {
		t.owned = true
	}
	return t, err
}

// Close closes the go-redis client if NewRedisTransportFromOptions or
// NewRedisTransportFromFailoverOptions made it.
// Each Client closes its own pub/sub connection in Client.Close.
func (t *RedisTransport) Close() error {
	if t.owned {
		return t.rdb.Close()
	}
	return nil
}

// SetLogger is kept for compatibility and ignored: the Client's
// Options.Logger receives what the executor has to say.
func (t *RedisTransport) SetLogger(*slog.Logger) {}

// Load is kept for compatibility and does nothing: the core loads its
// scripts itself.
func (t *RedisTransport) Load(context.Context) error { return nil }

// errDrivenByCore answers the Transport methods of a RedisTransport: a
// Client runs the core's requests instead of calling them.
var errDrivenByCore = fmt.Errorf("leasehold: a RedisTransport is driven by a Client's core: %w", errors.ErrUnsupported)

// Acquire, Renew, Release and Watch keep RedisTransport a Transport (it is
// passed to NewClient); a Client never calls them, and they fail.
func (t *RedisTransport) Acquire(context.Context, string, string, time.Duration) (AcquireReply, error) {
	return AcquireReply{}, errDrivenByCore
}

// Renew: see Acquire.
func (t *RedisTransport) Renew(context.Context, string, string, time.Duration, []byte) (bool, error) {
	return false, errDrivenByCore
}

// Release: see Acquire.
func (t *RedisTransport) Release(context.Context, string, string, []byte) (bool, error) {
	return false, errDrivenByCore
}

// Watch: see Acquire.
func (t *RedisTransport) Watch(context.Context, string, func(string)) (func(), error) {
	return nil, errDrivenByCore
}

// WatchWaiter: see Acquire.
func (t *RedisTransport) WatchWaiter(context.Context, string, func(string) bool) (func(), error) {
	return nil, errDrivenByCore
}
