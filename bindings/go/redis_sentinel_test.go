package leasehold

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// sentinelTopology is a real Redis Sentinel deployment (1 master, 1 replica,
// 3 sentinels) on loopback, started and stopped by the shared
// scripts/redis-sentinel-test.sh (processes stopped by pid).
type sentinelTopology struct {
	dir       string
	name      string
	master    string
	replica   string
	sentinels []string
}

func startSentinel(t *testing.T) *sentinelTopology {
	t.Helper()
	needRedis(t)
	script, err := filepath.Abs("../../scripts/redis-sentinel-test.sh")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	out, err := exec.Command("bash", script, "start", dir).CombinedOutput()
	t.Cleanup(func() { _ = exec.Command("bash", script, "stop", dir).Run() })
	if err != nil {
		t.Fatalf("redis-sentinel-test.sh start: %v\n%s", err, out)
	}
	top := &sentinelTopology{dir: dir}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(line, " ")
		switch k {
		case "name":
			top.name = v
		case "master":
			top.master = v
		case "replica":
			top.replica = v
		case "sentinels":
			top.sentinels = strings.Split(v, ",")
		}
	}
	if top.name == "" || top.master == "" || top.replica == "" || len(top.sentinels) != 3 {
		t.Fatalf("redis-sentinel-test.sh printed %q", out)
	}
	return top
}

func (s *sentinelTopology) pid(t *testing.T, node string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.dir, node, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

func (s *sentinelTopology) signal(t *testing.T, node string, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(s.pid(t, node), sig); err != nil {
		t.Fatal(err)
	}
}

// node is a plain client on the node that started as master or replica.
func (s *sentinelTopology) node(t *testing.T, role string) *redis.Client {
	addr := s.master
	if role == "replica" {
		addr = s.replica
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func (s *sentinelTopology) transport(t *testing.T) *RedisTransport {
	t.Helper()
	tr, err := NewRedisTransportFromFailoverOptions(&redis.FailoverOptions{
		MasterName: s.name, SentinelAddrs: s.sentinels,
		DialTimeout: 500 * time.Millisecond, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// waitPromoted waits until the sentinels name the replica and it is a master.
func (s *sentinelTopology) waitPromoted(t *testing.T) {
	t.Helper()
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.sentinels[0], MaxRetries: -1})
	defer sc.Close()
	replica := s.node(t, "replica")
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		addr, err := sc.GetMasterAddrByName(ctx, s.name).Result()
		role, rerr := replica.Do(ctx, "ROLE").Slice()
		cancel()
		if err == nil && rerr == nil && strings.Join(addr, ":") == s.replica && len(role) > 0 && role[0] == "master" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no promotion within 60s (sentinel says %v, %v)", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func wakeChannels(ctx context.Context, rdb *redis.Client) int {
	chans, err := rdb.PubSubChannels(ctx, "lh:wake:*").Result()
	if err != nil {
		return -1
	}
	return len(chans)
}

func TestRedisSentinelTransportOptionsAreChecked(t *testing.T) {
	if _, err := NewRedisTransportFromFailoverOptions(nil, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("nil options: %v", err)
	}
	if _, err := NewRedisTransportFromFailoverOptions(&redis.FailoverOptions{SentinelAddrs: []string{"127.0.0.1:1"}}, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("no master name: %v", err)
	}
	if _, err := NewRedisTransportFromFailoverOptions(&redis.FailoverOptions{MasterName: "m"}, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("no sentinels: %v", err)
	}
	replicas := &redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}, ReplicaOnly: true}
	if _, err := NewRedisTransportFromFailoverOptions(replicas, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("replica only: %v", err)
	}
}

type sentinelGrant struct {
	at    time.Time
	fence uint64
}

// TestRedisSentinelMasterKilledDuringContention: goroutines of three clients
// (each its own failover client) contend on a name while the master is
// SIGKILLed. They follow the promotion (commands and wake subscriptions), the
// gate accepts no stale write, fences never go back, and acquisitions resume
// (the delay is logged, not asserted).
func TestRedisSentinelMasterKilledDuringContention(t *testing.T) {
	s := startSentinel(t)
	ctx := context.Background()
	name := uniq(t, "busy")
	db, err := openDB(filepath.Join(t.TempDir(), "gate.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	gate, err := NewGate(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE writes (id INTEGER PRIMARY KEY AUTOINCREMENT, token INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	const clients, perClient = 3, 2
	var (
		mu     sync.Mutex
		grants []sentinelGrant
		stale  int
		wg     sync.WaitGroup
	)
	stop := make(chan struct{})
	for i := 0; i < clients; i++ {
		c := newTestClient(t, s.transport(t), nil)
		for j := 0; j < perClient; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var last uint64
				for {
					select {
					case <-stop:
						return
					default:
					}
					l, err := c.Acquire(ctx, name, AcquireOptions{TTL: 2 * time.Second, Wait: 2 * time.Second})
					if err != nil {
						continue // the master is gone: try again
					}
					at := time.Now()
					if l.FencingToken() <= last {
						t.Errorf("fence %d after %d in one goroutine", l.FencingToken(), last)
					}
					last = l.FencingToken()
					err = gate.Do(ctx, name, l.FencingToken(), func(ctx context.Context, tx *sql.Tx) error {
						_, err := tx.ExecContext(ctx, "INSERT INTO writes (token) VALUES (?)", int64(l.FencingToken()))
						return err
					})
					mu.Lock()
					grants = append(grants, sentinelGrant{at, l.FencingToken()})
					if errors.Is(err, ErrStaleToken) {
						stale++
					} else if err != nil {
						t.Errorf("gate: %v", err)
					}
					mu.Unlock()
					time.Sleep(5 * time.Millisecond)
					_ = l.Release(ctx)
				}
			}()
		}
	}
	defer func() { close(stop); wg.Wait() }()

	master, replica := s.node(t, "master"), s.node(t, "replica")
	fenceKey := lockKey(name) + ":fence"
	waitFor(t, "a grant on the first master", func() bool { return master.Exists(ctx, fenceKey).Val() == 1 })
	time.Sleep(time.Second)
	if n := wakeChannels(ctx, master); n != clients {
		t.Fatalf("%d wake channels on the first master, want %d", n, clients)
	}
	before, err := master.Get(ctx, fenceKey).Uint64()
	if err != nil {
		t.Fatal(err)
	}
	s.signal(t, "master", syscall.SIGKILL)
	killed := time.Now()
	s.waitPromoted(t)
	promoted := time.Since(killed)
	waitFor(t, "a grant on the promoted replica", func() bool {
		v, err := replica.Get(ctx, fenceKey).Uint64()
		return err == nil && v > before
	})
	resumed := time.Since(killed)
	waitFor(t, "every subscriber on the new master", func() bool { return wakeChannels(ctx, replica) == clients })
	resubscribed := time.Since(killed)
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()
	stop = make(chan struct{})

	mu.Lock()
	defer mu.Unlock()
	t.Logf("sentinel failover: promoted %v after the kill, first grant on the new master after %v, subscribers there after %v; %d grants, %d stale writes refused",
		promoted.Round(time.Millisecond), resumed.Round(time.Millisecond), resubscribed.Round(time.Millisecond), len(grants), stale)
	slices.SortFunc(grants, func(a, b sentinelGrant) int { return a.at.Compare(b.at) })
	var afterKill, beforeKill, lateLast int
	for i, g := range grants {
		if i > 0 && g.fence <= grants[i-1].fence {
			t.Errorf("in grant order, fence %d follows %d: a fence went back", g.fence, grants[i-1].fence)
		}
		if g.at.After(killed) {
			afterKill++
			// The old master's last grant may be seen after the kill (its reply raced the
			// kill, or a retry of it found the replicated lock): that one grant, once.
			if g.fence == before {
				lateLast++
			}
			if g.fence < before || lateLast > 1 {
				t.Errorf("fence %d granted after the kill is not above the old master's %d", g.fence, before)
			}
		} else {
			beforeKill++
		}
	}
	if afterKill == 0 || beforeKill == 0 {
		t.Fatalf("grants before the kill: %d, after: %d", beforeKill, afterKill)
	}
	rows, err := db.Query("SELECT token FROM writes ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var prev, n uint64
	for rows.Next() {
		var tok uint64
		if err := rows.Scan(&tok); err != nil {
			t.Fatal(err)
		}
		if tok < prev {
			t.Errorf("the gate accepted token %d after %d", tok, prev)
		}
		prev, n = tok, n+1
	}
	if n == 0 || prev <= before {
		t.Errorf("writes: %d, last token %d (old master's last fence %d)", n, prev, before)
	}
}

// TestRedisSentinelLostKeyIsDetectedOnRenew: a lease whose key never reached
// the replica (the replica frozen and its replication link closed by the
// master, then the master killed: what a lagging replica loses in a real
// failover) is lost at its next renewal ("rejected"); a lease whose key was
// replicated stays held; a newcomer's fence is higher and the gate refuses
// the loser.
func TestRedisSentinelLostKeyIsDetectedOnRenew(t *testing.T) {
	s := startSentinel(t)
	ctx := context.Background()
	holder := newTestClient(t, s.transport(t), nil)
	newcomer := newTestClient(t, s.transport(t), nil)
	master, replica := s.node(t, "master"), s.node(t, "replica")
	kept, err := holder.Acquire(ctx, "kept", AcquireOptions{TTL: 8 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := master.Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT: %d %v", n, err)
	}
	s.signal(t, "replica", syscall.SIGSTOP)
	var gone *Lease
	var killed time.Time
	func() {
		defer s.signal(t, "replica", syscall.SIGCONT)
		if n, err := master.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Int(); err != nil || n < 1 {
			t.Fatalf("CLIENT KILL TYPE replica: %d %v", n, err)
		}
		if gone, err = holder.Acquire(ctx, "gone", AcquireOptions{TTL: 8 * time.Second}); err != nil {
			t.Fatal(err)
		}
		s.signal(t, "master", syscall.SIGKILL)
		killed = time.Now()
	}()
	s.waitPromoted(t)
	if n := replica.Exists(ctx, lockKey("kept")).Val(); n != 1 {
		t.Fatal("the replicated lease's key did not survive")
	}
	if n := replica.Exists(ctx, lockKey("gone")).Val(); n != 0 {
		t.Fatal("the unreplicated lease's key survived: the scenario did not happen")
	}
	select {
	case <-gone.Lost():
	case <-time.After(20 * time.Second):
		t.Fatal("the lost lease's loss signal did not fire")
	}
	t.Logf("sentinel: loss detected %v after the kill", time.Since(killed).Round(time.Millisecond))
	var le *LostError
	if err := gone.Err(); !errors.As(err, &le) || le.Reason != reasonString(reasonRejected) {
		t.Fatalf("lost lease: %v", err)
	}
	if _, err := kept.Renew(ctx); err != nil || !kept.IsHeld() {
		t.Fatalf("the replicated lease: %v", err)
	}
	newer, err := newcomer.Acquire(ctx, "gone", AcquireOptions{TTL: 8 * time.Second, Wait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if newer.FencingToken() <= max(gone.FencingToken(), kept.FencingToken()) {
		t.Fatalf("newcomer's fence %d not above %d / %d", newer.FencingToken(), gone.FencingToken(), kept.FencingToken())
	}
	db, err := openDB(filepath.Join(t.TempDir(), "gate.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	gate, err := NewGate(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	nop := func(context.Context, *sql.Tx) error { return nil }
	if err := gate.Do(ctx, "gone", newer.FencingToken(), nop); err != nil {
		t.Fatal(err)
	}
	if err := gate.Do(ctx, "gone", gone.FencingToken(), nop); !errors.Is(err, ErrStaleToken) {
		t.Fatalf("the loser's write: %v", err)
	}
	if err := newer.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := kept.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
