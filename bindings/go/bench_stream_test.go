package leasehold

// The stream executor beside its floor, on the Redis TestMain starts (from bindings/go):
//
//	go test -run '^$' -bench RedisStreamVsFloor -benchtime 20000x
//
// Uncontended acquire + release, in blocks of 100 of each variant in turn so that the load
// of a shared machine weighs on all alike: RedisStreamExecutor (the core owns the wire),
// the floor (the requests the core sends for one acquire + release, recorded once through
// the executor, replayed pre-encoded on a plain net.Conn in a bare loop, each reply read
// whole), RedisExecutor (go-redis: on a client of the caller's, each request on a goroutine
// of its own; go-redis-open: Open with GoRedis, whose client honours ctx deadlines, so a
// caller with context.Background runs it on its own goroutine) and redsync. Each reports
// ops/s and this process's CPU time per lock + unlock; stream/floor, stream/go-redis and
// stream/go-redis-open are ratios of ops/s.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// processCPU is the CPU time this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// recordingProxy forwards loopback TCP to a server and keeps what clients send while
// phase is not 0, per phase.
type recordingProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	phase int
	sent  map[int][]byte
	conns []net.Conn
}

func newRecordingProxy(t testing.TB, target string) *recordingProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &recordingProxy{ln: ln, sent: map[int][]byte{}}
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(c, s); _ = c.Close() }()
			go func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						p.mu.Lock()
						if p.phase != 0 {
							p.sent[p.phase] = append(p.sent[p.phase], buf[:n]...)
						}
						p.mu.Unlock()
						if _, err := s.Write(buf[:n]); err != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				_ = s.Close()
			}()
		}
	}()
	return p
}

func (p *recordingProxy) setPhase(n int) {
	p.mu.Lock()
	p.phase = n
	p.mu.Unlock()
}

// respSkip reads one whole RESP2 value from r (the floor reads its replies whole, as a
// client must); it returns the value's first line for the caller to check.
func respSkip(r *bufio.Reader) (string, error) {
	line, err := r.ReadSlice('\n')
	if err != nil || len(line) < 3 {
		return "", fmt.Errorf("bad RESP line %q: %v", line, err)
	}
	head := string(line[:len(line)-2])
	switch line[0] {
	case '+', '-', ':', '_', '#', ',':
		return head, nil
	case '$':
		n, err := strconv.Atoi(head[1:])
		if err != nil || n < 0 {
			return head, err
		}
		_, err = r.Discard(n + 2)
		return head, err
	case '*':
		n, err := strconv.Atoi(head[1:])
		for i := 0; i < n && err == nil; i++ {
			_, err = respSkip(r)
		}
		return head, err
	}
	return head, fmt.Errorf("unexpected RESP type %q", line)
}

// countCommands is how many commands (RESP arrays) the recorded bytes hold.
func countCommands(t testing.TB, b []byte) int {
	r := bufio.NewReader(bytes.NewReader(b))
	n := 0
	for {
		if _, err := r.Peek(1); err != nil {
			return n
		}
		if _, err := respSkip(r); err != nil {
			t.Fatalf("recorded requests do not parse: %v", err)
		}
		n++
	}
}

// recordStreamCycle records the bytes the core sends for one uncontended acquire and one
// release of name (after a first cycle loaded the scripts).
func recordStreamCycle(b *testing.B, name string) (acquire, release []byte) {
	p := newRecordingProxy(b, needRedis(b))
	x, err := NewRedisStreamExecutor("redis://"+p.ln.Addr().String(), nil)
	if err != nil {
		b.Fatal(err)
	}
	c := newTestClient(b, x, nil)
	subscribed(b, c)
	ctx := context.Background()
	for i := 0; i < 2; i++ { // the first cycle loads the scripts; the second is recorded
		p.setPhase(i) // 1: the acquire's bytes
		l, err := c.Acquire(ctx, name, AcquireOptions{TTL: 10 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		p.setPhase(2 * i) // 2: the release's
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	p.setPhase(0)
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent[1], p.sent[2]
}

// floorCycle replays the recorded requests on a plain connection: write, read each reply.
func floorCycle(b *testing.B, acquire, release []byte) func() error {
	conn, err := net.Dial("tcp", needRedis(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	r := bufio.NewReaderSize(conn, 64<<10)
	na, nr := countCommands(b, acquire), countCommands(b, release)
	b.Logf("floor: acquire %d command(s), %d bytes; release %d command(s), %d bytes", na, len(acquire), nr, len(release))
	step := func(req []byte, n int) error {
		if _, err := conn.Write(req); err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			head, err := respSkip(r)
			if err != nil {
				return err
			}
			if head[0] == '-' {
				return fmt.Errorf("floor: error reply %s", head)
			}
		}
		return nil
	}
	return func() error {
		if err := step(acquire, na); err != nil {
			return err
		}
		return step(release, nr)
	}
}

func BenchmarkRedisStreamVsFloor(b *testing.B) {
	ctx := context.Background()
	name := uniq(b, "sf")
	acq, rel := recordStreamCycle(b, name)
	if len(acq) == 0 || len(rel) == 0 {
		b.Fatalf("nothing recorded: acquire %d bytes, release %d bytes", len(acq), len(rel))
	}
	floor := floorCycle(b, acq, rel)
	cycle := func(lock lockFunc) func() error {
		return func() error {
			unlock, err := lock(ctx)
			if err != nil {
				return err
			}
			return unlock()
		}
	}
	stream := newStreamClient(b, "redis://"+needRedis(b), &RedisStreamOptions{}, nil)
	opened, err := Open("redis://"+needRedis(b), &OpenOptions{ExecutorOptions: ExecutorOptions{GoRedis: true}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = opened.Close() })
	subscribed(b, opened)
	variants := []struct {
		name string
		run  func() error
		took time.Duration
		cpu  time.Duration // this process's CPU time (user + system)
	}{
		{"stream", cycle(benchBackendLock(stream, uniq(b, "s"))), 0, 0},
		{"floor", floor, 0, 0},
		{"go-redis", cycle(benchLeasehold(b, uniq(b, "g"))), 0, 0},
		{"redsync", cycle(benchRedsync(b, uniq(b, "r"))()), 0, 0},
		{"go-redis-open", cycle(benchBackendLock(opened, uniq(b, "o"))), 0, 0},
	}
	for i := range variants { // warm up
		for j := 0; j < 100; j++ {
			if err := variants[i].run(); err != nil {
				b.Fatalf("%s: %v", variants[i].name, err)
			}
		}
	}
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(100, b.N-done)
		for i := range variants {
			v := &variants[i]
			start, cpu := time.Now(), processCPU()
			for j := 0; j < n; j++ {
				if err := v.run(); err != nil {
					b.Fatalf("%s: %v", v.name, err)
				}
			}
			v.took += time.Since(start)
			v.cpu += processCPU() - cpu
		}
		done += n
	}
	for _, v := range variants {
		b.ReportMetric(float64(b.N)/v.took.Seconds(), v.name+"-ops/s")
		b.ReportMetric(float64(v.cpu.Microseconds())/float64(b.N), v.name+"-cpu-us/op")
	}
	b.ReportMetric(variants[1].took.Seconds()/variants[0].took.Seconds(), "stream/floor")
	b.ReportMetric(variants[2].took.Seconds()/variants[0].took.Seconds(), "stream/go-redis")
	b.ReportMetric(variants[4].took.Seconds()/variants[0].took.Seconds(), "stream/go-redis-open")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkRedisStreamUncontended is the stream executor alone, lock + unlock in a loop
// (for profiling: -cpuprofile).
func BenchmarkRedisStreamUncontended(b *testing.B) {
	ctx := context.Background()
	stream := newStreamClient(b, "redis://"+needRedis(b), &RedisStreamOptions{}, nil)
	lock := benchBackendLock(stream, uniq(b, "s"))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		unlock, err := lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := unlock(); err != nil {
			b.Fatal(err)
		}
	}
}
