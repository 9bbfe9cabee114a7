package leasehold

// PostgreSQL and etcd for the tests: started once per package run, on first use, with the
// repository's scripts (free loopback ports), and stopped by pid when the run ends.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func repoScript(name string) string {
	p, _ := filepath.Abs(filepath.Join("..", "..", "scripts", name))
	return p
}

func runScript(name string, args ...string) (string, error) {
	cmd := exec.Command("bash", append([]string{repoScript(name)}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// missing skips a test whose server could not be started, or fails it under CI=true.
func missing(t testing.TB, what string, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s unavailable under CI=true: %v", what, err)
	}
	t.Skipf("%s unavailable: %v", what, err)
}

// pgServer is the package's throw-away PostgreSQL cluster.
var pgServer struct {
	once sync.Once
	dir  string
	url  string
	err  error
}

// needPostgres returns the URL of the shared cluster, starting it on first use.
func needPostgres(t testing.TB) string {
	t.Helper()
	pgServer.once.Do(func() {
		if _, err := runScript("ensure-postgres.sh"); err != nil {
			pgServer.err = err
			return
		}
		dir, err := os.MkdirTemp("", "lh-go-pg-")
		if err != nil {
			pgServer.err = err
			return
		}
		pgServer.dir = dir
		pgServer.url, pgServer.err = runScript("pg-test-server.sh", "start", dir)
	})
	if pgServer.err != nil {
		missing(t, "PostgreSQL", pgServer.err)
	}
	return pgServer.url
}

// pgDurable is a second cluster with PostgreSQL's default durability (every commit waits
// for its WAL flush), for the benchmarks only.
var pgDurable struct {
	once sync.Once
	dir  string
	url  string
	err  error
}

// needDurablePostgres returns the URL of the durable cluster, starting it on first use.
func needDurablePostgres(t testing.TB) string {
	t.Helper()
	pgDurable.once.Do(func() {
		if _, err := runScript("ensure-postgres.sh"); err != nil {
			pgDurable.err = err
			return
		}
		dir, err := os.MkdirTemp("", "lh-go-pgd-")
		if err != nil {
			pgDurable.err = err
			return
		}
		pgDurable.dir = dir
		cmd := exec.Command("bash", repoScript("pg-test-server.sh"), "start", dir)
		cmd.Env = append(os.Environ(), "PG_TEST_DURABLE=1")
		out, err := cmd.Output()
		if err != nil {
			pgDurable.err = fmt.Errorf("pg-test-server.sh start (durable): %w", err)
			return
		}
		pgDurable.url = strings.TrimSpace(string(out))
	})
	if pgDurable.err != nil {
		missing(t, "PostgreSQL", pgDurable.err)
	}
	return pgDurable.url
}

// restartPostgres stops and starts the shared cluster on the same port and data.
func restartPostgres(t testing.TB) {
	t.Helper()
	if _, err := runScript("pg-test-server.sh", "stop", pgServer.dir); err != nil {
		t.Fatal(err)
	}
	url, err := runScript("pg-test-server.sh", "start", pgServer.dir)
	if err != nil {
		t.Fatal(err)
	}
	if url != pgServer.url {
		t.Fatalf("restarted on %s, was %s", url, pgServer.url)
	}
}

// etcdCluster is the package's throw-away 3-member etcd cluster.
var etcdCluster struct {
	once sync.Once
	dir  string
	urls []string
	err  error
}

// needEtcd returns the member URLs of the shared cluster, starting it on first use.
func needEtcd(t testing.TB) []string {
	t.Helper()
	etcdCluster.once.Do(func() {
		if _, err := runScript("ensure-etcd.sh"); err != nil {
			etcdCluster.err = err
			return
		}
		dir, err := os.MkdirTemp("", "lh-go-etcd-")
		if err != nil {
			etcdCluster.err = err
			return
		}
		etcdCluster.dir = dir
		out, err := runScript("etcd-test-cluster.sh", "start", dir, "3")
		if err != nil {
			etcdCluster.err = err
			return
		}
		etcdCluster.urls = strings.Split(out, ",")
	})
	if etcdCluster.err != nil {
		missing(t, "etcd", etcdCluster.err)
	}
	return etcdCluster.urls
}

// stopServers stops what needPostgres and needEtcd started (TestMain, after the run).
func stopServers() {
	if pgServer.dir != "" {
		_, _ = runScript("pg-test-server.sh", "stop", pgServer.dir)
		_ = os.RemoveAll(pgServer.dir)
	}
	if pgDurable.dir != "" {
		_, _ = runScript("pg-test-server.sh", "stop", pgDurable.dir)
		_ = os.RemoveAll(pgDurable.dir)
	}
	if etcdCluster.dir != "" {
		_, _ = runScript("etcd-test-cluster.sh", "stop", etcdCluster.dir)
		_ = os.RemoveAll(etcdCluster.dir)
	}
}
