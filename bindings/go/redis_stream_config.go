package leasehold

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"
)

// RedisStreamExecutor is the Redis executor with the connections in the core: the
// LockClient's core speaks RESP itself (handshake, scripts, the wait queue, the subscriber,
// reconnects) and the executor only moves its bytes, on net and crypto/tls. It needs no
// Redis client; it contends correctly with RedisExecutor and the other bindings for the
// same names. An acquire or release whose IO can run at once writes on the caller's
// goroutine, within the caller's ctx.
type RedisStreamExecutor struct {
	url   string
	tls   *tls.Config
	proto backendOptions
}

// RedisStreamOptions configures a RedisStreamExecutor; zero fields take the defaults.
type RedisStreamOptions struct {
	// TLSConfig is used for rediss:// (cloned; an empty ServerName becomes the URL's
	// host). Default: the system roots, the URL's host as ServerName.
	TLSConfig *tls.Config
	// ClientName is the CLIENT SETNAME of the connections (printable ASCII, no spaces,
	// at most 256 bytes); empty for none.
	ClientName string
	// Protocol is the RESP version the handshake asks for first: 3 (the default, falling
	// back to 2, then to AUTH/SELECT only), 2, or 1 (AUTH/SELECT only, before Redis 6).
	Protocol int
	// ConnectTimeout bounds opening a connection (TCP, TLS). Default 5s.
	ConnectTimeout time.Duration
	// CommandTimeout is how long a command waits for its reply before its connection is
	// dropped and opened anew. Default 5s.
	CommandTimeout time.Duration
	// Redis tunes the core's Redis protocol (StandbyDelay, KeyKeep, QueueMaxAge,
	// IdleRecheck); ShardedWake and CloseClient do not apply.
	Redis RedisOptions
}

// NewRedisStreamExecutor returns the executor for url: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB],
// rediss://… (TLS), unix:///PATH[?db=N] (no credentials) or
// redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT…]/MASTER[/DB] (the master the
// sentinels name, followed across failovers), parsed by the core; no query options (NewExecutor
// maps go-redis's). A URL the core cannot read or does not serve on this path (Cluster) is
// refused with its reason (ErrInvalidArgument). o may be nil.
func NewRedisStreamExecutor(url string, o *RedisStreamOptions) (*RedisStreamExecutor, error) {
	var opt RedisStreamOptions
	if o != nil {
		opt = *o
	}
	if opt.Protocol < 0 || opt.Protocol > 3 || opt.ConnectTimeout < 0 || opt.CommandTimeout < 0 {
		return nil, invalidArg("RedisStreamOptions: Protocol is 1 to 3 (0: the default), timeouts are not negative")
	}
	if opt.Redis.ShardedWake && !isClusterURL(url) {
		return nil, invalidArg("RedisStreamOptions.Redis.ShardedWake: only for redis+cluster:// URLs (which turn it on themselves)")
	}
	b := backendOptions{kind: backendRedisStream, stream: streamProtocol{url: url}}
	if err := checkBackend(b); err != nil {
		return nil, invalidArg("bad Redis stream URL %s: %s; want redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], rediss://…, "+
			"unix:///PATH[?db=N] without credentials or redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT…]/MASTER[/DB]",
			redactURL(url), refusal(err))
	}
	ms := func(d time.Duration) uint64 { return uint64(max(d, 0) / time.Millisecond) }
	b.redis = redisProtocol{standbyDelayMs: ms(opt.Redis.StandbyDelay), keyKeepMs: ms(opt.Redis.KeyKeep),
		queueMaxAgeMs: ms(opt.Redis.QueueMaxAge), idleRecheckMs: ms(opt.Redis.IdleRecheck)}
	b.stream.clientName, b.stream.protocol = opt.ClientName, uint32(opt.Protocol)
	b.stream.connectTimeoutMs = uint32(min(ms(opt.ConnectTimeout), 1<<32-1))
	b.stream.requestTimeoutMs = ms(opt.CommandTimeout)
	if err := checkBackend(b); err != nil {
		return nil, invalidArg("RedisStreamOptions refused: %s (ClientName: printable ASCII without spaces, at most 256 bytes)", refusal(err))
	}
	return &RedisStreamExecutor{url: url, tls: opt.TLSConfig, proto: b}, nil
}

// Format prints the executor without its URL's password.
func (t *RedisStreamExecutor) Format(f fmt.State, _ rune) {
	_, _ = fmt.Fprintf(f, "RedisStreamExecutor(%s)", redactURL(t.url))
}

// Close does nothing: each LockClient closes its own connections in LockClient.Close.
func (t *RedisStreamExecutor) Close() error { return nil }

func (t *RedisStreamExecutor) backend() backendOptions { return t.proto }

func (t *RedisStreamExecutor) start(c *client) (ioExec, error) {
	return &streamExec{c: c, tls: t.tls, streams: map[uint64]*stream{}}, nil
}

// refusal is the core's reason for refusing a configuration (the whole error without one).
func refusal(err error) string {
	var se *StatusError
	if errors.As(err, &se) && se.Detail != "" {
		return se.Detail
	}
	return err.Error()
}

// isClusterURL: a redis+cluster:// or rediss+cluster:// URL (the core turns sharded wake-ups on).
func isClusterURL(url string) bool {
	scheme, _, _ := strings.Cut(url, "://")
	s := strings.ToLower(scheme)
	return s == "redis+cluster" || s == "rediss+cluster"
}
