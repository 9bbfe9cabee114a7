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

// clusterTopology is a real Redis Cluster (3 masters, 3 replicas) on
// loopback, started and stopped by the shared scripts/redis-cluster-test.sh
// (processes stopped by pid).
type clusterTopology struct {
	dir   string
	nodes []string
}

func startCluster(t *testing.T) *clusterTopology {
	t.Helper()
	needRedis(t)
	script, err := filepath.Abs("../../scripts/redis-cluster-test.sh")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	out, err := exec.Command("bash", script, "start", dir).CombinedOutput()
	t.Cleanup(func() { _ = exec.Command("bash", script, "stop", dir).Run() })
	if err != nil {
		t.Fatalf("redis-cluster-test.sh start: %v\n%s", err, out)
	}
	top := &clusterTopology{dir: dir}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if k, v, _ := strings.Cut(line, " "); k == "nodes" {
			top.nodes = strings.Split(v, ",")
		}
	}
	if len(top.nodes) != 6 {
		t.Fatalf("redis-cluster-test.sh printed %q", out)
	}
	return top
}

func (s *clusterTopology) node(t *testing.T, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func (s *clusterTopology) transport(t *testing.T) *RedisTransport {
	t.Helper()
	tr, err := NewRedisTransportFromClusterOptions(&redis.ClusterOptions{
		Addrs:       s.nodes,
		DialTimeout: 500 * time.Millisecond, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond,
		MaxRedirects: 3, DialerRetries: 1,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// shardOf is the master and replicas serving key's slot, as a live node reports them.
func (s *clusterTopology) shardOf(t *testing.T, key string) (string, []string) {
	t.Helper()
	ctx := context.Background()
	slot := int64(clusterKeySlot(key))
	for _, addr := range s.nodes {
		slots, err := s.node(t, addr).ClusterSlots(ctx).Result()
		if err != nil {
			continue
		}
		for _, r := range slots {
			if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
				var reps []string
				for _, n := range r.Nodes[1:] {
					reps = append(reps, n.Addr)
				}
				return r.Nodes[0].Addr, reps
			}
		}
	}
	t.Fatal("no node answered CLUSTER SLOTS")
	return "", nil
}

func (s *clusterTopology) pid(t *testing.T, addr string) int {
	t.Helper()
	_, port, _ := strings.Cut(addr, ":")
	b, err := os.ReadFile(filepath.Join(s.dir, port, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

func (s *clusterTopology) signal(t *testing.T, addr string, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(s.pid(t, addr), sig); err != nil {
		t.Fatal(err)
	}
}

// waitPromoted waits until one of replicas is a master that reports the
// cluster ok; its address.
func (s *clusterTopology) waitPromoted(t *testing.T, replicas []string) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		for _, addr := range replicas {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			rdb := s.node(t, addr)
			role, err := rdb.Do(ctx, "ROLE").Slice()
			info, ierr := rdb.ClusterInfo(ctx).Result()
			cancel()
			if err == nil && ierr == nil && len(role) > 0 && role[0] == "master" && strings.Contains(info, "cluster_state:ok") {
				return addr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("none of %v was promoted within 60s", replicas)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// clusterKeySlot is Redis Cluster's CRC16 slot of key (with hash tags).
func clusterKeySlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}

// namesOnMasters is one lock name per master: master address -> name.
func (s *clusterTopology) namesOnMasters(t *testing.T, prefix string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for i := 0; len(out) < 3 && i < 10000; i++ {
		name := fmt.Sprintf("%s%d", prefix, i)
		m, _ := s.shardOf(t, lockKey(name))
		if _, ok := out[m]; !ok {
			out[m] = name
		}
	}
	if len(out) != 3 {
		t.Fatalf("names on %d masters", len(out))
	}
	return out
}

func TestRedisClusterTransportOptionsAreChecked(t *testing.T) {
	if _, err := NewRedisTransportFromClusterOptions(nil, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("nil options: %v", err)
	}
	if _, err := NewRedisTransportFromClusterOptions(&redis.ClusterOptions{}, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("no addresses: %v", err)
	}
	if _, err := NewRedisTransportFromClusterOptions(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ReadOnly: true}, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("replica reads: %v", err)
	}
	if _, err := NewRedisClusterTransport(nil, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("nil client: %v", err)
	}
	single := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer single.Close()
	if _, err := NewRedisTransportWithOptions(single, &RedisOptions{ShardedWake: true}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("sharded wake on a single-server client: %v", err)
	}
	if clusterKeySlot("lh:{a}") != clusterKeySlot("a") || clusterKeySlot("123456789") != 12739 {
		t.Fatal("key slot")
	}
}

type clusterGrant struct {
	at    time.Time
	name  string
	fence uint64
}

// TestRedisCluster runs on one real cluster: handoffs on names in three
// slots over their shard channels; Client.Status on a name on each master;
// then a master SIGKILLed while goroutines
// contend on names on two masters; then, on a third shard, a lease whose key
// did not reach the replica is lost at its next renewal.
func TestRedisCluster(t *testing.T) {
	s := startCluster(t)
	t.Run("HandoffsUseShardChannels", func(t *testing.T) { clusterHandoffs(t, s) })
	t.Run("HandoffCostAndIdleWaiters", func(t *testing.T) { clusterHandoffCost(t, s) })
	t.Run("Status", func(t *testing.T) { clusterStatus(t, s) })
	victim := ""
	t.Run("MasterKilledDuringContention", func(t *testing.T) { victim = clusterMasterKilled(t, s) })
	t.Run("LostKeyIsDetectedOnRenew", func(t *testing.T) { clusterLostKey(t, s, victim) })
}

// clusterStatus: Client.Status of a name on each master, never locked, held
// (the holder's fence and TTL) and released; a foreign key is the backend's
// error and stays as it was.
func clusterStatus(t *testing.T, s *clusterTopology) {
	c := newTestClient(t, s.transport(t), nil)
	for master, name := range s.namesOnMasters(t, "status") {
		junk := uniq(t, "status-junk-"+master)
		owner, _ := s.shardOf(t, lockKey(junk))
		checkStatusCycle(t, c, s.node(t, owner), name, junk)
	}
}

func clusterHandoffs(t *testing.T, s *clusterTopology) {
	ctx := context.Background()
	spread := s.namesOnMasters(t, "hand")
	clients := []*Client{newTestClient(t, s.transport(t), nil), newTestClient(t, s.transport(t), nil)}
	const rounds = 5
	var mu sync.Mutex
	counts := map[string]int{}
	seen := map[string]bool{}
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for m := range spread {
				chans, _ := s.node(t, m).PubSubShardChannels(ctx, "lh:*").Result()
				mu.Lock()
				for _, ch := range chans {
					seen[ch] = true
				}
				mu.Unlock()
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	var wg sync.WaitGroup
	for _, name := range spread {
		for _, c := range clients {
			for j := 0; j < 2; j++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < rounds; i++ {
						l, err := c.Acquire(ctx, name, AcquireOptions{TTL: 5 * time.Second, Wait: 20 * time.Second})
						if err != nil {
							t.Errorf("%s: %v", name, err)
							return
						}
						mu.Lock()
						counts[name]++
						mu.Unlock()
						time.Sleep(100 * time.Millisecond)
						_ = l.Release(ctx)
					}
				}()
			}
		}
	}
	wg.Wait()
	close(stop)
	<-watched
	for _, name := range spread {
		if counts[name] != rounds*4 {
			t.Errorf("%s: %d grants, want %d", name, counts[name], rounds*4)
		}
		if !seen["lh:{"+name+"}:wake"] {
			t.Errorf("%s: its shard channel was never subscribed (saw %v)", name, seen)
		}
	}
	for ch := range seen {
		if strings.HasPrefix(ch, "lh:wake:") {
			t.Errorf("a client channel on a cluster: %s", ch)
		}
	}
	waitFor(t, "the shard channels unsubscribed", func() bool {
		for m := range spread {
			if chans, err := s.node(t, m).PubSubShardChannels(ctx, "lh:*").Result(); err != nil || len(chans) > 0 {
				return false
			}
		}
		return true
	})
}

// clusterMasterKilled returns the killed master's address.
func clusterMasterKilled(t *testing.T, s *clusterTopology) string {
	ctx := context.Background()
	spread := s.namesOnMasters(t, "busy")
	var victimMaster, victim, other string
	for m, n := range spread {
		if victim == "" {
			victimMaster, victim = m, n
		} else if other == "" {
			other = n
		}
	}
	_, replicas := s.shardOf(t, lockKey(victim))
	db, err := openDB(filepath.Join(t.TempDir(), "gate.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	gate, err := NewGate(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE writes (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, token INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		grants []clusterGrant
		stale  int
		wg     sync.WaitGroup
	)
	stop := make(chan struct{})
	for i := 0; i < 3; i++ {
		c := newTestClient(t, s.transport(t), nil)
		for _, name := range []string{victim, other} {
			wg.Add(1)
			go func() {
				defer wg.Done()
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
					err = gate.Do(ctx, name, l.FencingToken(), func(ctx context.Context, tx *sql.Tx) error {
						_, err := tx.ExecContext(ctx, "INSERT INTO writes (name, token) VALUES (?, ?)", name, int64(l.FencingToken()))
						return err
					})
					mu.Lock()
					grants = append(grants, clusterGrant{at, name, l.FencingToken()})
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
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	master := s.node(t, victimMaster)
	fenceKey := lockKey(victim) + ":fence"
	waitFor(t, "a grant on the first master", func() bool { return master.Exists(ctx, fenceKey).Val() == 1 })
	time.Sleep(time.Second)
	before, err := master.Get(ctx, fenceKey).Uint64()
	if err != nil {
		t.Fatal(err)
	}
	s.signal(t, victimMaster, syscall.SIGKILL)
	killed := time.Now()
	promotedAddr := s.waitPromoted(t, replicas)
	promoted := time.Since(killed)
	newMaster := s.node(t, promotedAddr)
	waitFor(t, "a grant on the promoted replica", func() bool {
		v, err := newMaster.Get(ctx, fenceKey).Uint64()
		return err == nil && v > before
	})
	resumed := time.Since(killed)
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	t.Logf("cluster failover: promoted %v after the kill, first grant on the new master after %v; %d grants, %d stale writes refused",
		promoted.Round(time.Millisecond), resumed.Round(time.Millisecond), len(grants), stale)
	slices.SortFunc(grants, func(a, b clusterGrant) int { return a.at.Compare(b.at) })
	for _, name := range []string{victim, other} {
		var last uint64
		var beforeKill, afterKill int
		for _, g := range grants {
			if g.name != name {
				continue
			}
			if g.fence <= last {
				t.Errorf("%s: in grant order, fence %d follows %d", name, g.fence, last)
			}
			last = g.fence
			if g.at.After(killed) {
				afterKill++
				// <: a grant just before the kill may be recorded just after it.
				if name == victim && g.fence < before {
					t.Errorf("fence %d granted after the kill is below the old master's %d", g.fence, before)
				}
			} else {
				beforeKill++
			}
		}
		if afterKill == 0 || beforeKill == 0 {
			t.Errorf("%s: grants before the kill: %d, after: %d", name, beforeKill, afterKill)
		}
		rows, err := db.Query("SELECT token FROM writes WHERE name = ? ORDER BY id", name)
		if err != nil {
			t.Fatal(err)
		}
		var prev uint64
		for rows.Next() {
			var tok uint64
			if err := rows.Scan(&tok); err != nil {
				t.Fatal(err)
			}
			if tok < prev {
				t.Errorf("%s: the gate accepted token %d after %d", name, tok, prev)
			}
			prev = tok
		}
		rows.Close()
	}
	return victimMaster
}

func clusterLostKey(t *testing.T, s *clusterTopology, killed string) {
	ctx := context.Background()
	// A shard whose master and replica are both alive.
	var masterAddr, replicaAddr string
	for m, n := range s.namesOnMasters(t, "keep") {
		if m == killed {
			continue
		}
		if _, reps := s.shardOf(t, lockKey(n)); len(reps) > 0 {
			role, err := s.node(t, reps[0]).Do(ctx, "ROLE").Slice()
			if err == nil && len(role) > 0 && role[0] == "slave" {
				masterAddr, replicaAddr = m, reps[0]
				break
			}
		}
	}
	if masterAddr == "" {
		t.Fatal("no shard with a live master and replica")
	}
	nameOn := func(prefix string) string {
		for i := 0; ; i++ {
			n := fmt.Sprintf("%s%d", prefix, i)
			if m, _ := s.shardOf(t, lockKey(n)); m == masterAddr {
				return n
			}
		}
	}
	keptName, goneName := nameOn("kept"), nameOn("gone")
	holder := newTestClient(t, s.transport(t), nil)
	newcomer := newTestClient(t, s.transport(t), nil)
	master, replica := s.node(t, masterAddr), s.node(t, replicaAddr)
	kept, err := holder.Acquire(ctx, keptName, AcquireOptions{TTL: 8 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := master.Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT: %d %v", n, err)
	}
	s.signal(t, replicaAddr, syscall.SIGSTOP)
	var gone *Lease
	var killedAt time.Time
	func() {
		defer s.signal(t, replicaAddr, syscall.SIGCONT)
		if n, err := master.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Int(); err != nil || n < 1 {
			t.Fatalf("CLIENT KILL TYPE replica: %d %v", n, err)
		}
		if gone, err = holder.Acquire(ctx, goneName, AcquireOptions{TTL: 8 * time.Second}); err != nil {
			t.Fatal(err)
		}
		s.signal(t, masterAddr, syscall.SIGKILL)
		killedAt = time.Now()
	}()
	s.waitPromoted(t, []string{replicaAddr})
	if n := replica.Exists(ctx, lockKey(keptName)).Val(); n != 1 {
		t.Fatal("the replicated lease's key did not survive")
	}
	if n := replica.Exists(ctx, lockKey(goneName)).Val(); n != 0 {
		t.Fatal("the unreplicated lease's key survived: the scenario did not happen")
	}
	select {
	case <-gone.Lost():
	case <-time.After(20 * time.Second):
		t.Fatal("the lost lease's loss signal did not fire")
	}
	t.Logf("cluster: loss detected %v after the kill", time.Since(killedAt).Round(time.Millisecond))
	var le *LostError
	if err := gone.Err(); !errors.As(err, &le) || le.Reason != reasonString(reasonRejected) {
		t.Fatalf("lost lease: %v", err)
	}
	if _, err := kept.Renew(ctx); err != nil || !kept.IsHeld() {
		t.Fatalf("the replicated lease: %v", err)
	}
	newer, err := newcomer.Acquire(ctx, goneName, AcquireOptions{TTL: 8 * time.Second, Wait: 10 * time.Second})
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
	if err := gate.Do(ctx, goneName, newer.FencingToken(), nop); err != nil {
		t.Fatal(err)
	}
	if err := gate.Do(ctx, goneName, gone.FencingToken(), nop); !errors.Is(err, ErrStaleToken) {
		t.Fatalf("the loser's write: %v", err)
	}
	if err := newer.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := kept.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// clusterHandoffCost: waiters of several clients queue for one name; parked,
// they send nothing (the name's shard channel is live); each release hands
// the lock to exactly one of them with at most 2 script calls per handoff,
// counted by the master serving the name (INFO commandstats).
func clusterHandoffCost(t *testing.T, s *clusterTopology) {
	const n = 4
	ctx := context.Background()
	name := "cost"
	masterAddr, _ := s.shardOf(t, lockKey(name))
	master := s.node(t, masterAddr)
	on := func() *Client {
		tr, err := NewRedisTransportFromClusterOptions(&redis.ClusterOptions{Addrs: s.nodes},
			&RedisOptions{StandbyDelay: 2 * time.Second}) // no standby races the counted handoffs
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tr.Close() })
		return newTestClient(t, tr, nil)
	}
	holder := on()
	// Load the scripts on that master (a first EVALSHA costs a NOSCRIPT round).
	warm, err := holder.Acquire(ctx, name, AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	first, err := holder.Acquire(ctx, name, AcquireOptions{TTL: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	type win struct {
		i int
		l *Lease
	}
	won := make(chan win, n)
	errc := make(chan error, n)
	ws := make([]*Client, n)
	for i := range ws {
		ws[i] = on()
		go func() {
			l, err := ws[i].Acquire(ctx, name, AcquireOptions{TTL: time.Minute, Wait: 5 * time.Minute})
			if err != nil {
				errc <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			won <- win{i, l}
		}()
	}
	// Queued, and the name's shard channel live in every waiter (each then
	// re-checked once): from here on nothing needs Redis.
	waitFor(t, "every waiter queued and subscribed", func() bool {
		for _, w := range ws {
			if k, err := w.RedisCounters(); err != nil || k.Subscriptions == 0 || k.ScriptCalls < 2 {
				return false
			}
		}
		return queueLen(master, name) == n
	})
	time.Sleep(200 * time.Millisecond) // the re-checks' replies
	if err := master.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	requests := func() (sum uint64) {
		for _, w := range ws {
			sum += redisCounters(t, w).Requests
		}
		return sum
	}
	renewals := func() uint64 { k, _ := holder.Counters(); return k.RenewalsSent }
	const idle = 3 * time.Second
	r0, h0 := requests(), renewals()
	time.Sleep(idle)
	sent := requests() - r0
	calls := scriptCalls(t, master) - int64(renewals()-h0)
	t.Logf("cluster idle waiters: %d requests from %d waiters in %v, %d script calls on the master", sent, n, idle, calls)
	if float64(sent)/n/idle.Seconds() > 0.1 || float64(calls)/n/idle.Seconds() > 0.1 {
		t.Fatalf("idle waiters sent %d requests (%d script calls)", sent, calls)
	}
	if err := master.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	h0 = renewals()
	served := map[int]bool{}
	prev, release := first.FencingToken(), first.Release
	for turn := 0; turn < n; turn++ {
		if err := release(ctx); err != nil {
			t.Fatal(err)
		}
		var got win
		select {
		case got = <-won:
		case err := <-errc:
			t.Fatal(err)
		case <-time.After(time.Minute):
			t.Fatalf("turn %d: nobody woken", turn)
		}
		if served[got.i] || got.l.FencingToken() <= prev {
			t.Fatalf("turn %d: waiter %d (served before: %v), token %d after %d", turn, got.i, served[got.i], got.l.FencingToken(), prev)
		}
		served[got.i] = true
		prev, release = got.l.FencingToken(), got.l.Release
	}
	if err := release(ctx); err != nil {
		t.Fatal(err)
	}
	var renewed uint64
	for _, w := range append(ws, holder) {
		k, _ := w.Counters()
		renewed += k.RenewalsSent
	}
	calls = scriptCalls(t, master) - int64(renewed-h0)
	t.Logf("cluster: %d handoffs between queued waiters: %d script calls (the last release included)", n, calls)
	if calls > 2*n+1 {
		t.Fatalf("%d script calls for %d handoffs, want at most %d", calls, n, 2*n+1)
	}
}
