package leasehold

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis started by TestMain for the whole package (empty when unavailable).
var (
	redisAddr string
	redisErr  error
)

func TestMain(m *testing.M) {
	if mode := os.Getenv("LEASEHOLD_TEST_WORKER"); mode != "" {
		os.Exit(runWorker(mode))
	}
	var stop func()
	redisAddr, stop, redisErr = startRedis()
	code := m.Run()
	if stop != nil {
		stop()
	}
	stopServers()
	os.Exit(code)
}

// needRedis skips (or, under CI=true, fails) a test when no redis-server
// could be started.
func needRedis(t testing.TB) string {
	t.Helper()
	if redisErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server unavailable under CI=true: %v", redisErr)
		}
		t.Skipf("redis-server unavailable: %v", redisErr)
	}
	return redisAddr
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func findRedisServer() (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	if os.Geteuid() == 0 {
		if _, err := exec.LookPath("apt-get"); err == nil {
			_ = exec.Command("apt-get", "update", "-qq").Run()
			cmd := exec.Command("apt-get", "install", "-y", "-qq", "redis-server")
			cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
			_ = cmd.Run()
		}
	}
	return exec.LookPath("redis-server")
}

// startRedis starts a private redis-server on a free loopback port and
// returns a function that stops it by its pid.
func startRedis() (string, func(), error) {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return "", nil, err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		stop, err := startRedisWith(&redis.Options{Addr: addr}, "--port", strconv.Itoa(port))
		if err == nil {
			return addr, stop, nil
		}
		lastErr = err
	}
	return "", nil, lastErr
}

// startRedisWith starts redis-server with args (plus loopback, no
// persistence unless args say otherwise) and waits until a client made
// with ping answers PING; the returned function stops it by its pid.
func startRedisWith(ping *redis.Options, args ...string) (func(), error) {
	path, err := findRedisServer()
	if err != nil {
		return nil, fmt.Errorf("redis-server not found: %w", err)
	}
	cmd := exec.Command(path, append([]string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no"}, args...)...)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	rdb := redis.NewClient(ping)
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return stop, nil
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("redis-server %v exited: %w", args, err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("redis-server did not answer PING: %w", err)
		}
	}
}
