package leasehold

// NewExecutor and Open on the byte path by default (redis://, rediss://, unix://,
// redis+sentinel://), go-redis with ExecutorOptions.GoRedis, go-redis's query options
// mapped or refused; runInline's choice of goroutine.

import (
	"context"
	"crypto/tls"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestOpenRedisDefaultsToByteTransport: Open and NewExecutor put redis:// on the byte
// path (its streams counted), GoRedis puts it on go-redis (no stream), and the mapped
// query options reach the connections (the server sees the client name).
func TestOpenRedisDefaultsToByteTransport(t *testing.T) {
	addr := needRedis(t)
	ctx := context.Background()
	name := "lh-open-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	u := "redis://" + addr + "?db=0&client_name=" + name + "&dial_timeout=2s&read_timeout=3&protocol=2"
	e, err := NewExecutor(u, nil)
	if err != nil {
		t.Fatal(err)
	}
	x, ok := e.(*RedisStreamExecutor)
	if !ok {
		t.Fatalf("NewExecutor(redis://) made a %T", e)
	}
	st := x.proto.stream
	if st.url != "redis://"+addr+"/0" || st.clientName != name || st.protocol != 2 || st.connectTimeoutMs != 2000 || st.requestTimeoutMs != 3000 {
		t.Fatalf("the query options did not reach the stream config: %+v", st)
	}
	_ = e.Close()
	c := onStreamClient(t, u, nil)
	l, err := c.Acquire(ctx, uniq(t, "default"), AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if k, _ := c.Counters(); k.StreamOpens == 0 {
		t.Fatalf("Open(redis://) opened no stream: %+v", k)
	}
	list, err := newRedis(t).ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(list, "name="+name+" ") {
		t.Fatalf("no connection named %s: client_name did not reach the handshake:\n%s", name, list)
	}

	// The opt-out: go-redis, with its own query options (pool_size is go-redis's).
	g, err := Open("redis://"+addr+"/0?pool_size=3", &OpenOptions{ExecutorOptions: ExecutorOptions{GoRedis: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	re, ok := g.c.exec.(*RedisExecutor)
	if !ok || re.rdb.(*redis.Client).Options().PoolSize != 3 || !ctxDeadlines(re.rdb) {
		t.Fatalf("Open with GoRedis made a %T", g.c.exec)
	}
	l, err = g.Acquire(ctx, uniq(t, "goredis"), AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if k, _ := g.Counters(); k.StreamOpens != 0 || k.Grants == 0 {
		t.Fatalf("Open with GoRedis: %+v", k)
	}
}

// onStreamClient is Open(u) on the byte path, closed at the end of the test.
func onStreamClient(t *testing.T, u string, eo *ExecutorOptions) *LockClient {
	t.Helper()
	c := openOnWith(t, u, eo)
	if _, ok := c.c.exec.(*RedisStreamExecutor); !ok {
		t.Fatalf("Open made a %T", c.c.exec)
	}
	return c
}

// TestOpenRedisSchemesPaths: which executor each Redis scheme gets, with and without GoRedis.
func TestOpenRedisSchemesPaths(t *testing.T) {
	for _, u := range []string{"redis://127.0.0.1:1/0", "REDIS://127.0.0.1:1", "rediss://127.0.0.1:1",
		"unix:///tmp/none.sock?db=2", "redis+sentinel://127.0.0.1:1,127.0.0.1:2/m/1", "redis+cluster://127.0.0.1:1"} {
		for _, goRedis := range []bool{false, true} {
			e, err := NewExecutor(u, &ExecutorOptions{GoRedis: goRedis})
			if err != nil {
				t.Fatalf("%s (GoRedis %t): %v", u, goRedis, err)
			}
			_, stream := e.(*RedisStreamExecutor)
			if want := !goRedis; stream != want {
				t.Errorf("%s (GoRedis %t): a %T", u, goRedis, e)
			}
			_ = e.Close()
		}
	}
}

// TestOpenRedisByteQueryRefused: what the byte path cannot honour is refused with a clear
// error (ErrInvalidArgument naming the option, and GoRedis where go-redis would take it);
// what it maps never silently overrides an option given in code.
func TestOpenRedisByteQueryRefused(t *testing.T) {
	cases := []struct {
		url  string
		o    *ExecutorOptions
		want []string
	}{
		{"redis://127.0.0.1:6379/0?pool_size=10&max_retries=2", nil, []string{"max_retries, pool_size", "GoRedis"}},
		{"rediss://127.0.0.1:6379?write_timeout=1s", nil, []string{"write_timeout", "GoRedis"}},
		{"unix:///tmp/r.sock?db=1&pool_fifo=true", nil, []string{"pool_fifo", "GoRedis"}},
		{"redis+sentinel://127.0.0.1:26379/m?sentinel_password=x", nil, []string{"sentinel_password", "GoRedis"}},
		{"redis+sentinel://127.0.0.1:26379/m?db=1", nil, []string{"/MASTER/DB"}},
		{"redis://127.0.0.1:6379/1?db=2", nil, []string{"two database numbers"}},
		{"redis://127.0.0.1:6379?db=x", nil, []string{"database number"}},
		{"redis://127.0.0.1:6379?client_name=a&client_name=b", nil, []string{"client_name given 2 times"}},
		{"redis://127.0.0.1:6379?protocol=4", nil, []string{"protocol"}},
		{"redis://127.0.0.1:6379?dial_timeout=0", nil, []string{"dial_timeout", "unbounded"}},
		{"redis://127.0.0.1:6379?read_timeout=soon", nil, []string{"read_timeout", "duration"}},
		{"redis://127.0.0.1:6379?skip_verify=true", nil, []string{"rediss:// only"}},
		{"unix://:pw@/tmp/r.sock", nil, []string{"no user name or password", "GoRedis"}},
		{"redis://127.0.0.1:6379?client_name=a", &ExecutorOptions{RedisStream: &RedisStreamOptions{ClientName: "b"}},
			[]string{"RedisStreamOptions.ClientName"}},
		{"redis://127.0.0.1:6379", &ExecutorOptions{GoRedis: true, RedisStream: &RedisStreamOptions{}}, []string{"GoRedis and RedisStream"}},
		{"redis://127.0.0.1:6379", &ExecutorOptions{Redis: &RedisOptions{KeyKeep: time.Minute},
			RedisStream: &RedisStreamOptions{Redis: RedisOptions{KeyKeep: time.Hour}}}, []string{"give the Redis protocol options once"}},
		{"redis+cluster://127.0.0.1:7000?context_timeout_enabled=true", nil, []string{"context_timeout_enabled", "GoRedis"}},
		{"redis+cluster://127.0.0.1:7000?context_timeout_enabled=true", &ExecutorOptions{GoRedis: true}, []string{"bad Redis Cluster URL"}},
	}
	for _, tc := range cases {
		e, err := NewExecutor(tc.url, tc.o)
		if err == nil {
			_ = e.Close()
			t.Errorf("%s: accepted", tc.url)
			continue
		}
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v is not ErrInvalidArgument", tc.url, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: the error does not say %q: %v", tc.url, w, err)
			}
		}
	}
	// Options the byte path does map, beside equal ones given in code; skip_verify on a
	// copy of the caller's TLS config.
	mine := &tls.Config{ServerName: "redis.example"}
	e, err := NewExecutor("rediss://127.0.0.1:6380?skip_verify=true&client_name=a", &ExecutorOptions{
		RedisStream: &RedisStreamOptions{TLSConfig: mine, ClientName: "a"}})
	if err != nil {
		t.Fatal(err)
	}
	x := e.(*RedisStreamExecutor)
	if x.tls == nil || !x.tls.InsecureSkipVerify || x.tls.ServerName != "redis.example" || mine.InsecureSkipVerify || x.proto.stream.url != "rediss://127.0.0.1:6380" {
		t.Fatalf("skip_verify: %+v (the caller's config changed: %t), url %s", x.tls, mine.InsecureSkipVerify, x.proto.stream.url)
	}
	// The same URLs go to go-redis with GoRedis, which reads them.
	for _, u := range []string{"redis://127.0.0.1:6379/0?pool_size=10&max_retries=2", "unix://:pw@/tmp/r.sock"} {
		e, err := NewExecutor(u, &ExecutorOptions{GoRedis: true})
		if err != nil {
			t.Fatalf("%s with GoRedis: %v", u, err)
		}
		_ = e.Close()
	}
}

// goid is the running goroutine's id.
func goid() string {
	buf := make([]byte, 64)
	f := strings.Fields(string(buf[:runtime.Stack(buf, false)]))
	return f[1]
}

// TestRunInlineGoroutine: a job bounded by its own ctx's deadline runs on the caller's
// goroutine when the caller's ctx cannot be cancelled (and keeps the job's timeout);
// otherwise, or for a job that may not honour its ctx, on a goroutine of its own.
func TestRunInlineGoroutine(t *testing.T) {
	c := &client{ioCtx: context.Background()}
	cancellable, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, tc := range []struct {
		deadlined bool
		ctx       context.Context
		inline    bool
	}{
		{true, context.Background(), true},
		{true, context.WithoutCancel(cancellable), true},
		{true, cancellable, false},
		{false, context.Background(), false},
		{false, cancellable, false},
	} {
		var ran string
		var bounded bool
		j := &job{timeout: time.Second, deadlined: tc.deadlined, run: func(ctx context.Context) {
			ran = goid()
			_, bounded = ctx.Deadline()
		}}
		c.runInline(tc.ctx, j, nil)
		c.ioWG.Wait()
		if (ran == goid()) != tc.inline || !bounded {
			t.Errorf("deadlined %t, ctx %v: ran on the caller's goroutine %t, want %t (bounded %t)", tc.deadlined, tc.ctx, ran == goid(), tc.inline, bounded)
		}
	}
}

// On a go-redis client that honours ctx deadlines, an Acquire whose ctx cannot be cancelled
// runs its request on its own goroutine, and still fails by its bound (Wait plus one request
// timeout) while the server stalls; a grant answered late is not left behind.
func TestCallerBoundAcquireInlineWithAStalledServer(t *testing.T) {
	direct := newRedis(t)
	p := newStallProxy(t, needRedis(t))
	rdb := redis.NewClient(&redis.Options{Addr: p.addr(), ReadTimeout: 5 * time.Second, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	c := clientOn(t, rdb, &Options{RequestTimeout: 300 * time.Millisecond})
	acquireBoundedWhileStalled(t, c, p, "bound-inline", redisHeld(direct))
}

// TestOpenRedisSentinelByteFailover: Open's default path follows a Sentinel failover: the
// master killed (SIGKILL), the client asks the sentinels again and grants on the promoted
// replica, the fence above the one granted before.
func TestOpenRedisSentinelByteFailover(t *testing.T) {
	s := startSentinel(t)
	ctx := context.Background()
	o := openOptions()
	o.RequestTimeout = 500 * time.Millisecond
	c, err := Open("redis+sentinel://"+strings.Join(s.sentinels, ",")+"/"+s.name+"?dial_timeout=500ms", o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.c.exec.(*RedisStreamExecutor); !ok {
		t.Fatalf("Open made a %T", c.c.exec)
	}
	before, err := c.Acquire(ctx, "failover", AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := before.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := s.node(t, "master").Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT: %d %v", n, err)
	}
	k0, _ := c.Counters()
	s.signal(t, "master", syscall.SIGKILL)
	killed := time.Now()
	s.waitPromoted(t)
	after, err := c.Acquire(ctx, "failover", AcquireOptions{TTL: 5 * time.Second, Wait: 30 * time.Second})
	if err != nil {
		t.Fatalf("no grant after the failover: %v (%s)", err, c.BackendError())
	}
	k1, _ := c.Counters()
	t.Logf("byte path: granted %v after the kill; sentinel lookups %d -> %d, streams opened %d -> %d",
		time.Since(killed).Round(time.Millisecond), k0.SentinelLookups, k1.SentinelLookups, k0.StreamOpens, k1.StreamOpens)
	if after.FencingToken() <= before.FencingToken() {
		t.Errorf("fence %d after the failover, %d before", after.FencingToken(), before.FencingToken())
	}
	if k1.SentinelLookups <= k0.SentinelLookups {
		t.Errorf("no sentinel asked again after the kill: %d -> %d", k0.SentinelLookups, k1.SentinelLookups)
	}
	if s.node(t, "replica").Exists(ctx, lockKey("failover")).Val() != 1 {
		t.Error("the grant is not on the promoted replica")
	}
	if err := after.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
