package leasehold

// The binding's earlier names, kept so that code written against them still builds.
// Each is an alias of, or a one-line wrapper around, the name every binding shares
// (LockClient, Executor, <Backend>Executor, FencingGate, MemoryService).

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// Client is the earlier name of LockClient.
//
// Deprecated: use LockClient.
type Client = LockClient

// NewClient is the earlier name of NewLockClient.
//
// Deprecated: use NewLockClient.
func NewClient(t Executor, opts *Options) (*LockClient, error) { return NewLockClient(t, opts) }

// Transport is the earlier name of Executor.
//
// Deprecated: use Executor.
type Transport = Executor

// PollingTransport is the earlier name of PollingExecutor.
//
// Deprecated: use PollingExecutor.
type PollingTransport = PollingExecutor

// RedisTransport is the earlier name of RedisExecutor.
//
// Deprecated: use RedisExecutor.
type RedisTransport = RedisExecutor

// SQLiteTransport is the earlier name of SQLiteExecutor.
//
// Deprecated: use SQLiteExecutor.
type SQLiteTransport = SQLiteExecutor

// PostgresTransport is the earlier name of PostgresExecutor.
//
// Deprecated: use PostgresExecutor.
type PostgresTransport = PostgresExecutor

// EtcdTransport is the earlier name of EtcdExecutor.
//
// Deprecated: use EtcdExecutor.
type EtcdTransport = EtcdExecutor

// MemoryTransport is the earlier name of MemoryExecutor.
//
// Deprecated: use MemoryExecutor.
type MemoryTransport = MemoryExecutor

// MemoryServer is the earlier name of MemoryService.
//
// Deprecated: use MemoryService.
type MemoryServer = MemoryService

// Gate is the earlier name of FencingGate.
//
// Deprecated: use FencingGate.
type Gate = FencingGate

// GateOptions is the earlier name of FencingGateOptions.
//
// Deprecated: use FencingGateOptions.
type GateOptions = FencingGateOptions

// PostgresGate is the earlier name of PostgresFencingGate.
//
// Deprecated: use PostgresFencingGate.
type PostgresGate = PostgresFencingGate

// NewGate is the earlier name of NewFencingGate.
//
// Deprecated: use NewFencingGate.
func NewGate(ctx context.Context, db *sql.DB, opts *FencingGateOptions) (*FencingGate, error) {
	return NewFencingGate(ctx, db, opts)
}

// NewPostgresGate is the earlier name of NewPostgresFencingGate.
//
// Deprecated: use NewPostgresFencingGate.
func NewPostgresGate(ctx context.Context, db PgxBeginner, opts *FencingGateOptions) (*PostgresFencingGate, error) {
	return NewPostgresFencingGate(ctx, db, opts)
}

// NewMemoryServer is the earlier name of NewMemoryService.
//
// Deprecated: use NewMemoryService.
func NewMemoryServer() *MemoryService { return NewMemoryService() }

// NewMemoryTransport is the earlier name of NewMemoryExecutor.
//
// Deprecated: use NewMemoryExecutor.
func NewMemoryTransport() *MemoryExecutor { return NewMemoryExecutor() }

// Transport is the earlier name of Executor.
//
// Deprecated: use MemoryService.Executor.
func (s *MemoryService) Transport() *MemoryExecutor { return s.Executor() }

// Server is the earlier name of Service.
//
// Deprecated: use MemoryExecutor.Service.
func (t *MemoryExecutor) Server() *MemoryService { return t.Service() }

// NewSQLiteTransport is the earlier name of NewSQLiteExecutor.
//
// Deprecated: use NewSQLiteExecutor.
func NewSQLiteTransport(path string, o *SQLiteOptions) (*SQLiteExecutor, error) {
	return NewSQLiteExecutor(path, o)
}

// NewEtcdTransport is the earlier name of NewEtcdExecutor.
//
// Deprecated: use NewEtcdExecutor.
func NewEtcdTransport(endpoints []string, o *EtcdOptions) (*EtcdExecutor, error) {
	return NewEtcdExecutor(endpoints, o)
}

// NewPostgresTransport is NewPostgresExecutor(connString, nil).
//
// Deprecated: use NewPostgresExecutor.
func NewPostgresTransport(connString string) (*PostgresExecutor, error) {
	return NewPostgresExecutor(connString, nil)
}

// NewPostgresTransportWithOptions is NewPostgresExecutor.
//
// Deprecated: use NewPostgresExecutor.
func NewPostgresTransportWithOptions(connString string, o *PostgresOptions) (*PostgresExecutor, error) {
	return NewPostgresExecutor(connString, o)
}

// NewPostgresTransportFromConfig is NewPostgresExecutor with PostgresOptions.Config.
//
// Deprecated: use NewPostgresExecutor with PostgresOptions.Config.
func NewPostgresTransportFromConfig(cfg *pgx.ConnConfig) (*PostgresExecutor, error) {
	return NewPostgresTransportFromConfigWithOptions(cfg, nil)
}

// NewPostgresTransportFromConfigWithOptions is NewPostgresExecutor with
// PostgresOptions.Config.
//
// Deprecated: use NewPostgresExecutor with PostgresOptions.Config.
func NewPostgresTransportFromConfigWithOptions(cfg *pgx.ConnConfig, o *PostgresOptions) (*PostgresExecutor, error) {
	if cfg == nil {
		return nil, invalidArg("nil pgx configuration")
	}
	var opt PostgresOptions
	if o != nil {
		opt = *o
	}
	opt.Config = cfg
	return NewPostgresExecutor("", &opt)
}

// NewRedisTransport is NewRedisExecutor(rdb, nil) for a client that is not a
// *redis.ClusterClient.
//
// Deprecated: use NewRedisExecutor.
func NewRedisTransport(rdb redis.UniversalClient) (*RedisExecutor, error) {
	return NewRedisTransportWithOptions(rdb, nil)
}

// NewRedisTransportWithOptions is NewRedisExecutor, except that a
// *redis.ClusterClient gets ShardedWake only when o sets it.
//
// Deprecated: use NewRedisExecutor.
func NewRedisTransportWithOptions(rdb redis.UniversalClient, o *RedisOptions) (*RedisExecutor, error) {
	var opt RedisOptions
	if o != nil {
		opt = *o
	}
	return newRedisExecutor(rdb, opt, opt.CloseClient)
}

// NewRedisClusterTransport is NewRedisExecutor for a cluster client.
//
// Deprecated: use NewRedisExecutor.
func NewRedisClusterTransport(cc *redis.ClusterClient, o *RedisOptions) (*RedisExecutor, error) {
	if cc == nil {
		return nil, invalidArg("nil redis cluster client")
	}
	return NewRedisExecutor(cc, o)
}

// NewRedisTransportFromClusterOptions is NewRedisExecutor on
// redis.NewClusterClient(opt), with RedisOptions.CloseClient.
//
// Deprecated: use NewRedisExecutor.
func NewRedisTransportFromClusterOptions(opt *redis.ClusterOptions, o *RedisOptions) (*RedisExecutor, error) {
	if opt == nil {
		return nil, invalidArg("nil redis cluster options")
	}
	if len(opt.Addrs) == 0 && opt.ClusterSlots == nil {
		return nil, invalidArg("redis cluster options need Addrs")
	}
	if opt.ReadOnly || opt.RouteByLatency || opt.RouteRandomly {
		return nil, invalidArg("redis cluster options: locks are taken on the masters only")
	}
	return NewRedisExecutor(redis.NewClusterClient(opt), owning(o))
}

// NewRedisTransportFromOptions is NewRedisExecutor on redis.NewClient(opt),
// with RedisOptions.CloseClient.
//
// Deprecated: use NewRedisExecutor.
func NewRedisTransportFromOptions(opt *redis.Options, o *RedisOptions) (*RedisExecutor, error) {
	if opt == nil {
		return nil, invalidArg("nil redis options")
	}
	return NewRedisTransportWithOptions(redis.NewClient(opt), owning(o))
}

// NewRedisTransportFromFailoverOptions is NewRedisExecutor on
// redis.NewFailoverClient(opt), with RedisOptions.CloseClient.
//
// Deprecated: use NewRedisExecutor.
func NewRedisTransportFromFailoverOptions(opt *redis.FailoverOptions, o *RedisOptions) (*RedisExecutor, error) {
	if err := checkFailoverOptions(opt); err != nil {
		return nil, err
	}
	return NewRedisTransportWithOptions(redis.NewFailoverClient(opt), owning(o))
}

// owning is o (or the defaults) with CloseClient set.
func owning(o *RedisOptions) *RedisOptions {
	var opt RedisOptions
	if o != nil {
		opt = *o
	}
	opt.CloseClient = true
	return &opt
}
