package leasehold

// The shared names and the URL opener: every backend opened from its URL on a real
// server, and the earlier names still building and working.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// openOptions keep a failing test short.
func openOptions() *OpenOptions {
	return &OpenOptions{Options: Options{RequestTimeout: 2 * time.Second, CloseTimeout: time.Second}}
}

// openOn opens rawURL and closes the client at the end of the test.
func openOn(t *testing.T, rawURL string) *LockClient {
	t.Helper()
	return openOnWith(t, rawURL, nil)
}

// openOnWith is openOn with executor options (nil: the defaults).
func openOnWith(t *testing.T, rawURL string, eo *ExecutorOptions) *LockClient {
	t.Helper()
	o := openOptions()
	if eo != nil {
		o.ExecutorOptions = *eo
	}
	c, err := Open(rawURL, o)
	if err != nil {
		t.Fatalf("Open(%s): %v", redactURL(rawURL), err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// openContend: two LockClients opened from one URL share the backend: the second is
// refused while the first holds the name, then takes it with a higher fence. Closing
// a client closes the go-redis client Open made for it.
func openContend(t *testing.T, rawURL string) { t.Helper(); openContendWith(t, rawURL, nil) }

// openContendWith is openContend with executor options (nil: the defaults); it returns
// the first client's executor and its counters before Close.
func openContendWith(t *testing.T, rawURL string, eo *ExecutorOptions) opened {
	t.Helper()
	ctx := context.Background()
	a, b := openOnWith(t, rawURL, eo), openOnWith(t, rawURL, eo)
	name := fmt.Sprintf("open-%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano())
	la, err := a.Acquire(ctx, name, AcquireOptions{TTL: 5 * time.Second, Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("first acquire: %v", err)
	}
	if _, err := b.Acquire(ctx, name, AcquireOptions{TTL: 5 * time.Second}); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("second client while held: %v, want ErrNotAcquired", err)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	lb, err := b.Acquire(ctx, name, AcquireOptions{TTL: 5 * time.Second, Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("second acquire after the release: %v", err)
	}
	if lb.FencingToken() <= la.FencingToken() {
		t.Errorf("fence %d after %d", lb.FencingToken(), la.FencingToken())
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	k, err := a.Counters()
	if err != nil {
		t.Fatal(err)
	}
	re, isRedis := a.c.owned.(*RedisExecutor)
	if err := a.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if isRedis {
		if err := re.rdb.Ping(ctx).Err(); !errors.Is(err, redis.ErrClosed) {
			t.Errorf("the go-redis client Open made answers %v after Close, want redis.ErrClosed", err)
		}
	}
	return opened{a.c.exec, k}
}

// opened is what openContendWith opened: the executor and the first client's counters.
type opened struct {
	e Executor
	k Counters
}

// onStream fails t unless e is the byte path's executor and its client opened streams.
func onStream(t *testing.T, o opened) {
	t.Helper()
	e, k := o.e, o.k
	if _, ok := e.(*RedisStreamExecutor); !ok || k.StreamOpens == 0 {
		t.Errorf("Open made a %T, %d streams opened; want the byte path", e, k.StreamOpens)
	}
}

// onGoRedis fails t unless e is go-redis's executor and no stream was opened.
func onGoRedis(t *testing.T, o opened) {
	t.Helper()
	e, k := o.e, o.k
	if _, ok := e.(*RedisExecutor); !ok || k.StreamOpens != 0 {
		t.Errorf("Open made a %T, %d streams opened; want go-redis", e, k.StreamOpens)
	}
}

// TestOpenSQLite: sqlite:///ABS, sqlite:REL (from the working directory) and sqlite://
// (the default file) name the same files as the paths do.
func TestOpenSQLite(t *testing.T) {
	dir := t.TempDir()
	abs := filepath.Join(dir, "locks.sqlite3")
	t.Run("absolute", func(t *testing.T) { openContend(t, "sqlite://"+abs) })
	t.Run("relative", func(t *testing.T) {
		t.Chdir(dir)
		e, err := NewExecutor("sqlite:rel.sqlite3", nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := e.(*SQLiteExecutor).Path(); got != filepath.Join(dir, "rel.sqlite3") {
			t.Errorf("sqlite:rel.sqlite3 is %s", got)
		}
		openContend(t, "sqlite:rel.sqlite3")
		if _, err := os.Stat(filepath.Join(dir, "rel.sqlite3")); err != nil {
			t.Errorf("the relative file: %v", err)
		}
	})
	t.Run("default", func(t *testing.T) {
		t.Setenv("XDG_CACHE_HOME", filepath.Join(dir, "cache"))
		def, err := DefaultSQLitePath()
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range []string{"sqlite://", "sqlite:", "SQLite://"} {
			e, err := NewExecutor(u, &ExecutorOptions{SQLite: &SQLiteOptions{BusyTimeout: time.Second}})
			if err != nil {
				t.Fatalf("%s: %v", u, err)
			}
			if got := e.(*SQLiteExecutor).Path(); got != def {
				t.Errorf("%s is %s, want %s", u, got, def)
			}
		}
		openContend(t, "sqlite://")
	})
}

// TestOpenMemory: memory:// is a new MemoryService per executor (two Opens do not
// share it).
func TestOpenMemory(t *testing.T) {
	ctx := context.Background()
	a, b := openOn(t, "memory://"), openOn(t, "memory:")
	la, err := a.Acquire(ctx, "m", AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lb, err := b.Acquire(ctx, "m", AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatalf("a second memory:// service: %v", err)
	}
	if _, err := a.Acquire(ctx, "m", AcquireOptions{TTL: 5 * time.Second}); !errors.Is(err, ErrNotAcquired) {
		t.Errorf("the same service while held: %v, want ErrNotAcquired", err)
	}
	_ = la.Release(ctx)
	_ = lb.Release(ctx)
}

// TestOpenRedis: redis:// with a percent-encoded password and a database number (the
// keys land in that database), and unix:// on a socket.
func TestOpenRedis(t *testing.T) {
	needRedis(t)
	const pw = "p/w@x:y"
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	sock := filepath.Join(t.TempDir(), "redis.sock")
	stop, err := startRedisWith(&redis.Options{Addr: addr, Password: pw}, "--port", fmt.Sprint(port),
		"--requirepass", pw, "--unixsocket", sock, "--unixsocketperm", "700")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	t.Run("tcp", func(t *testing.T) {
		onStream(t, openContendWith(t, "redis://:"+url.QueryEscape(pw)+"@"+addr+"/2", nil))
		// The same on go-redis, its database in the query (go-redis's form, mapped on the byte path).
		onGoRedis(t, openContendWith(t, "redis://:"+url.QueryEscape(pw)+"@"+addr+"?db=2", &ExecutorOptions{GoRedis: true}))
		onStream(t, openContendWith(t, "redis://:"+url.QueryEscape(pw)+"@"+addr+"?db=2", nil))
		ctx := context.Background()
		for db, want := range map[int]bool{0: false, 2: true} {
			rdb := redis.NewClient(&redis.Options{Addr: addr, Password: pw, DB: db})
			keys, err := rdb.Keys(ctx, "*").Result()
			_ = rdb.Close()
			if err != nil {
				t.Fatal(err)
			}
			if (len(keys) > 0) != want {
				t.Errorf("database %d holds %q", db, keys)
			}
		}
	})
	t.Run("unix", func(t *testing.T) {
		// A password on unix:// is go-redis's form: the byte path refuses it, saying so.
		u := "unix://:" + url.QueryEscape(pw) + "@" + sock + "?db=3"
		if _, err := NewExecutor(u, nil); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "GoRedis") {
			t.Fatalf("unix:// with a password on the byte path: %v", err)
		}
		onGoRedis(t, openContendWith(t, u, &ExecutorOptions{GoRedis: true}))
	})
	t.Run("options", func(t *testing.T) {
		// RedisOptions reach the executor on either path; the go-redis client is the
		// executor's own and bounds its commands by their ctx's deadline.
		u := "redis://:" + url.QueryEscape(pw) + "@" + addr
		redisOpts := &RedisOptions{StandbyDelay: 321 * time.Millisecond}
		e, err := NewExecutor(u, &ExecutorOptions{Redis: redisOpts})
		if err != nil {
			t.Fatal(err)
		}
		se := e.(*RedisStreamExecutor)
		if se.proto.redis.standbyDelayMs != 321 || se.proto.kind != backendRedisStream {
			t.Errorf("stream executor %+v", se.proto.redis)
		}
		e, err = NewExecutor(u, &ExecutorOptions{Redis: redisOpts, GoRedis: true})
		if err != nil {
			t.Fatal(err)
		}
		re := e.(*RedisExecutor)
		if re.proto.standbyDelayMs != 321 || !re.owned || re.proto.shardedWake || !ctxDeadlines(re.rdb) {
			t.Errorf("executor %+v (ContextTimeoutEnabled %v)", re.proto, ctxDeadlines(re.rdb))
		}
		_ = re.Close()
	})
}

// TestOpenRedisSentinel: redis+sentinel://SENTINELS/MASTER/DB reaches the master the
// sentinels name.
func TestOpenRedisSentinel(t *testing.T) {
	s := startSentinel(t)
	u := "redis+sentinel://" + strings.Join(s.sentinels, ",") + "/" + s.name + "/1?dial_timeout=1s"
	rdb := redis.NewClient(&redis.Options{Addr: s.master, DB: 1})
	defer rdb.Close()
	for _, goRedis := range []bool{false, true} {
		if err := rdb.FlushDB(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		o := openContendWith(t, u, &ExecutorOptions{GoRedis: goRedis})
		if goRedis {
			onGoRedis(t, o)
		} else if onStream(t, o); o.k.SentinelLookups == 0 {
			t.Errorf("the byte path reached the master without asking a sentinel: %+v", o.k)
		}
		if n, err := rdb.DBSize(context.Background()).Result(); err != nil || n == 0 {
			t.Errorf("GoRedis %t: database 1 of the master holds %d keys (%v)", goRedis, n, err)
		}
	}
}

// TestOpenRedisCluster: redis+cluster://NODES runs the cluster protocol (sharded
// wake-ups) on a real cluster: on the byte path (the core routes by slot), and on
// go-redis's ClusterClient with GoRedis.
func TestOpenRedisCluster(t *testing.T) {
	s := startCluster(t)
	e, err := NewExecutor("redis+cluster://"+strings.Join(s.nodes[:2], ",")+"?dial_timeout=1s", &ExecutorOptions{GoRedis: true})
	if err != nil {
		t.Fatal(err)
	}
	if re := e.(*RedisExecutor); !re.proto.shardedWake || !re.owned {
		t.Errorf("cluster executor %+v owned=%t", re.proto, re.owned)
	}
	_ = e.(*RedisExecutor).Close()
	u := "redis+cluster://" + strings.Join(s.nodes, ",")
	onGoRedis(t, openContendWith(t, u, &ExecutorOptions{GoRedis: true}))
	o := openContendWith(t, u+"?dial_timeout=1s", nil)
	onStream(t, o)
	if o.k.StreamOpens < 2 { // the topology's, and the name's master's
		t.Errorf("the byte path opened %d streams on a cluster", o.k.StreamOpens)
	}
	if o.k.ClusterRefreshes < 1 || o.k.SentinelLookups != 0 {
		t.Errorf("the slot map was not asked for: %+v", o.k)
	}
}

// TestOpenPostgres: postgresql:// and postgres:// on the shared cluster.
func TestOpenPostgres(t *testing.T) {
	u := needPostgres(t)
	t.Run("postgresql", func(t *testing.T) { openContend(t, u) })
	t.Run("postgres", func(t *testing.T) {
		openContend(t, "postgres://"+strings.TrimPrefix(u, "postgresql://"))
	})
}

// TestOpenEtcd: etcd://MEMBERS on the shared 3-member cluster.
func TestOpenEtcd(t *testing.T) {
	members := needEtcd(t)
	hosts := make([]string, len(members))
	for i, m := range members {
		hosts[i] = strings.TrimPrefix(m, "http://")
	}
	e, err := NewExecutor("etcd://"+strings.Join(hosts, ","), &ExecutorOptions{Etcd: &EtcdOptions{TryTimeout: 700 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.(*EtcdExecutor).Endpoints(); !reflect.DeepEqual(got, members) {
		t.Errorf("endpoints %q, want %q", got, members)
	}
	if got := e.(*EtcdExecutor).tryTimeout; got != 700*time.Millisecond {
		t.Errorf("TryTimeout %v", got)
	}
	openContend(t, "etcd://"+strings.Join(hosts, ","))
}

// TestOpenRefusesBadURLs: malformed URLs and unknown schemes are ErrInvalidArgument,
// naming what is wrong.
func TestOpenRefusesBadURLs(t *testing.T) {
	for u, want := range map[string]string{
		"":                                "no scheme",
		"locks.db":                        "no scheme",
		"ftp://h/x":                       "unknown backend URL",
		"sqlite://host/x.db":              "no host part",
		"sqlite:///x.db?mode=ro":          "no query",
		"memory://somewhere":              "no host or path",
		"redis+sentinel://h:26379":        "MASTER_NAME",
		"redis+sentinel://h:26379/m/x":    "database of a Redis URL must be a number",
		"redis+sentinel://h:x/m":          "port of a Redis URL",
		"redis+cluster://h:7000/3":        "database",
		"redis+cluster://h?read_only=1":   "read_only",
		"redis://h:6379/0?no_such=1":      "no_such",
		"etcd://h:2379?tls=1":             "insecure_auth",
		"etcd://h:2379/v3":                "nothing else",
		"etcd://u:p@h:2379":               "clear text",
		"etcd://u:p@h:2379?insecure_auth": "insecure_auth takes",
	} {
		e, err := NewExecutor(u, nil)
		if err == nil {
			t.Errorf("%q: accepted (%v)", u, e)
			continue
		}
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want ErrInvalidArgument saying %q", u, err, want)
		}
	}
	// go-redis's cluster URL rules hold with GoRedis.
	for u, want := range map[string]string{"redis+cluster://h:7000/0": "no path", "redis+cluster://h?read_only=1": "masters only"} {
		e, err := NewExecutor(u, &ExecutorOptions{GoRedis: true})
		if err == nil {
			t.Errorf("%q with GoRedis: accepted (%v)", u, e)
		} else if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q with GoRedis: %v, want ErrInvalidArgument saying %q", u, err, want)
		}
	}
	// Over etcd:// the credentials go in clear text only when the URL says so.
	e, err := NewExecutor("etcd://u:p@127.0.0.1:2379?insecure_auth=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if et := e.(*EtcdExecutor); et.proto.user != "u" || et.proto.password != "p" || et.Endpoints()[0] != "http://127.0.0.1:2379" {
		t.Errorf("etcd executor %v", et)
	}
	e, err = NewExecutor("etcds://u:p%2Fq@127.0.0.1,[::1]:2380", nil)
	if err != nil {
		t.Fatal(err)
	}
	if et := e.(*EtcdExecutor); et.proto.password != "p/q" || !reflect.DeepEqual(et.Endpoints(), []string{"https://127.0.0.1:2379", "https://[::1]:2380"}) {
		t.Errorf("etcds executor %v", et)
	}
}

// TestEarlierNamesStillWork: each earlier name is the same type as, or builds the same
// thing as, the shared name; a program written against them still runs.
func TestEarlierNamesStillWork(t *testing.T) {
	same := []struct{ old, now any }{
		{(*Client)(nil), (*LockClient)(nil)},
		{(*Transport)(nil), (*Executor)(nil)},
		{(*PollingTransport)(nil), (*PollingExecutor)(nil)},
		{(*RedisTransport)(nil), (*RedisExecutor)(nil)},
		{(*SQLiteTransport)(nil), (*SQLiteExecutor)(nil)},
		{(*PostgresTransport)(nil), (*PostgresExecutor)(nil)},
		{(*EtcdTransport)(nil), (*EtcdExecutor)(nil)},
		{(*MemoryTransport)(nil), (*MemoryExecutor)(nil)},
		{(*MemoryServer)(nil), (*MemoryService)(nil)},
		{(*Gate)(nil), (*FencingGate)(nil)},
		{(*GateOptions)(nil), (*FencingGateOptions)(nil)},
		{(*PostgresGate)(nil), (*PostgresFencingGate)(nil)},
	}
	for _, p := range same {
		if reflect.TypeOf(p.old) != reflect.TypeOf(p.now) {
			t.Errorf("%T is not %T", p.old, p.now)
		}
	}
	// The earlier constructors, by their signatures (a change breaks the build).
	var (
		_ func(Transport, *Options) (*Client, error)                              = NewClient
		_ func() *MemoryServer                                                    = NewMemoryServer
		_ func() *MemoryTransport                                                 = NewMemoryTransport
		_ func(string, *SQLiteOptions) (*SQLiteTransport, error)                  = NewSQLiteTransport
		_ func([]string, *EtcdOptions) (*EtcdTransport, error)                    = NewEtcdTransport
		_ func(string) (*PostgresTransport, error)                                = NewPostgresTransport
		_ func(string, *PostgresOptions) (*PostgresTransport, error)              = NewPostgresTransportWithOptions
		_ func(*pgx.ConnConfig) (*PostgresTransport, error)                       = NewPostgresTransportFromConfig
		_ func(*pgx.ConnConfig, *PostgresOptions) (*PostgresTransport, error)     = NewPostgresTransportFromConfigWithOptions
		_ func(redis.UniversalClient) (*RedisTransport, error)                    = NewRedisTransport
		_ func(redis.UniversalClient, *RedisOptions) (*RedisTransport, error)     = NewRedisTransportWithOptions
		_ func(*redis.ClusterClient, *RedisOptions) (*RedisTransport, error)      = NewRedisClusterTransport
		_ func(*redis.ClusterOptions, *RedisOptions) (*RedisTransport, error)     = NewRedisTransportFromClusterOptions
		_ func(*redis.Options, *RedisOptions) (*RedisTransport, error)            = NewRedisTransportFromOptions
		_ func(*redis.FailoverOptions, *RedisOptions) (*RedisTransport, error)    = NewRedisTransportFromFailoverOptions
		_ func(context.Context, *sql.DB, *GateOptions) (*Gate, error)             = NewGate
		_ func(context.Context, PgxBeginner, *GateOptions) (*PostgresGate, error) = NewPostgresGate
		_ func(*MemoryServer) *MemoryTransport                                    = (*MemoryServer).Transport
		_ func(*MemoryTransport) *MemoryServer                                    = (*MemoryTransport).Server
		_ func(*RedisTransport, context.Context) error                            = (*RedisTransport).Load
	)

	// A program in the earlier names: a memory server's transport, a SQLite file, a gate.
	ctx := context.Background()
	srv := NewMemoryServer()
	tr := srv.Transport()
	if tr.Server() != srv {
		t.Error("MemoryTransport.Server is not the server it came from")
	}
	c, err := NewClient(tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Acquire(ctx, "old", AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if tok, fence, ok := srv.Holder("old"); !ok || fence != l.FencingToken() || tok == "" {
		t.Errorf("the server's holder: %q %d %t", tok, fence, ok)
	}
	_ = l.Release(ctx)

	st, err := NewSQLiteTransport(filepath.Join(t.TempDir(), "old.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := NewClient(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	db, err := sql.Open("sqlite3", filepath.Join(t.TempDir(), "store.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	g, err := NewGate(ctx, db, &GateOptions{Dialect: DialectSQLite})
	if err != nil {
		t.Fatal(err)
	}
	l, err = sc.Acquire(ctx, "old", AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Do(ctx, "r", l.FencingToken(), func(context.Context, *sql.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := g.Do(ctx, "r", l.FencingToken()-1, func(context.Context, *sql.Tx) error { return nil }); !errors.Is(err, ErrStaleToken) {
		t.Errorf("a stale token through the earlier Gate: %v", err)
	}
	_ = l.Release(ctx)
}
