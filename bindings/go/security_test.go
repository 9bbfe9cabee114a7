package leasehold

// What a lock library must not give away: the lock file to other local users or
// through a link, and passwords in errors, logs or printed configurations.

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// logBuf collects a Client's log lines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func capturingOptions() (*Options, *logBuf) {
	lb := &logBuf{}
	return &Options{Logger: slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})),
		RequestTimeout: 2 * time.Second, CloseTimeout: 200 * time.Millisecond}, lb
}

func wantPerm(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Errorf("%s: mode %04o, want %04o", path, got, want)
	}
}

// TestSQLiteDefaultFileIsPrivate: the default file's missing directory is created 0700
// and the file 0600, its -wal and -shm files too, even under umask 0 (another local user
// could otherwise read lock names, pids, hosts and tokens); nothing is reported.
func TestSQLiteDefaultFileIsPrivate(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	cache := filepath.Join(t.TempDir(), "cache")
	t.Setenv("XDG_CACHE_HOME", cache)
	path, err := DefaultSQLitePath()
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewSQLiteTransport(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	opts, logs := capturingOptions()
	c := newTestClient(t, tr, opts)
	ctx := context.Background()
	l, err := c.Acquire(ctx, "private", AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	wantPerm(t, filepath.Dir(path), 0o700)
	wantPerm(t, path, 0o600)
	for _, s := range []string{"-wal", "-shm"} {
		wantPerm(t, path+s, 0o600)
	}
	if strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("a private file was reported:\n%s", logs)
	}
}

// TestSQLiteRefusesASymlink: link.db -> victim.db is refused with a clear error, at
// NewSQLiteTransport and when the link appears before the file is opened; victim.db is
// neither created nor modified.
func TestSQLiteRefusesASymlink(t *testing.T) {
	ctx := context.Background()
	for _, victimExists := range []bool{false, true} {
		dir := t.TempDir()
		victim, link := filepath.Join(dir, "victim.db"), filepath.Join(dir, "link.db")
		content := []byte("not leasehold's: keep me")
		if victimExists {
			if err := os.WriteFile(victim, content, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		checkVictim := func(when string) {
			t.Helper()
			got, err := os.ReadFile(victim)
			if !victimExists {
				if !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s: victim.db was created (%v)", when, err)
				}
			} else if err != nil || !bytes.Equal(got, content) {
				t.Errorf("%s: victim.db changed: %q, %v", when, got, err)
			}
			for _, s := range []string{"-wal", "-shm", "-journal"} {
				if _, err := os.Lstat(victim + s); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s: victim.db%s exists (%v)", when, s, err)
				}
			}
		}
		if err := os.Symlink(victim, link); err != nil {
			t.Fatal(err)
		}
		_, err := NewSQLiteTransport(link, nil)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "symbolic link") {
			t.Fatalf("NewSQLiteTransport on a link: %v", err)
		}
		checkVictim("NewSQLiteTransport")

		// The link appears after the transport was made, before the first request.
		if err := os.Remove(link); err != nil {
			t.Fatal(err)
		}
		tr, err := NewSQLiteTransport(link, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(victim, link); err != nil {
			t.Fatal(err)
		}
		opts, _ := capturingOptions()
		c := newTestClient(t, tr, opts)
		_, err = c.Acquire(ctx, "n", AcquireOptions{TTL: 5 * time.Second, Wait: 300 * time.Millisecond})
		if err == nil {
			t.Fatal("a lock granted through a link")
		}
		if msg := err.Error() + " " + c.BackendError(); !strings.Contains(msg, "symbolic link") {
			t.Errorf("the error does not say why: %v (backend: %q)", err, c.BackendError())
		}
		checkVictim("Acquire")
		_ = c.Close()
	}
}

// TestSQLiteLinkPutInPlaceOfAHeldFile: the file is replaced by a link under a holder;
// the executor does not follow it: the lease is lost and the link's target untouched.
func TestSQLiteLinkPutInPlaceOfAHeldFile(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path, victim := filepath.Join(dir, "locks.db"), filepath.Join(dir, "victim.db")
	opts, _ := capturingOptions()
	c := newSQLiteClient(t, path, opts)
	l, err := c.Acquire(ctx, "n", AcquireOptions{TTL: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"", "-wal", "-shm"} {
		if err := os.Remove(path + s); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(victim, path); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the holder did not learn that its file was replaced")
	}
	if _, err := os.Lstat(victim); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the link's target was created: %v", err)
	}
}

// TestSQLiteReportsAnUnsafeFile: an existing file or directory that other users may
// write, or that another user owns, is reported on the Client's Logger (and still used);
// -wal and -shm files laxer than the file are tightened.
func TestSQLiteReportsAnUnsafeFile(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "locks.db")

	// A private file, held open; its -wal and -shm are loosened behind its back.
	opts, logs := capturingOptions()
	a := newSQLiteClient(t, path, opts)
	l, err := a.Acquire(ctx, "a", AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	for _, s := range []string{"-wal", "-shm"} {
		if err := os.Chmod(path+s, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	opts2, logs2 := capturingOptions()
	b := newSQLiteClient(t, path, opts2)
	if _, err := b.Acquire(ctx, "b", AcquireOptions{TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"-wal", "-shm"} {
		wantPerm(t, path+s, 0o600)
	}
	if out := logs.String() + logs2.String(); strings.Contains(out, "level=WARN") {
		t.Errorf("a private file was reported:\n%s", out)
	}

	// Writable by others: the file and the directory.
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	opts3, logs3 := capturingOptions()
	c := newSQLiteClient(t, path, opts3)
	if _, err := c.Acquire(ctx, "c", AcquireOptions{TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	out := logs3.String()
	for _, want := range []string{"lock file " + path + " is writable by other users (mode 0666)",
		"lock directory " + dir + " is writable by other users (mode 0777)"} {
		if !strings.Contains(out, want) {
			t.Errorf("not reported: %q in\n%s", want, out)
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}

	// Owned by another user (only root can give a file away).
	if os.Geteuid() != 0 {
		t.Log("not root: the foreign-owner case needs chown")
		return
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	opts4, logs4 := capturingOptions()
	d := newSQLiteClient(t, path, opts4)
	if _, err := d.Acquire(ctx, "d", AcquireOptions{TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if want := "lock file " + path + " is owned by another user (uid 65534)"; !strings.Contains(logs4.String(), want) {
		t.Errorf("not reported: %q in\n%s", want, logs4)
	}
}

const secret = "S3CRET"

// noSecret fails the test if any of texts holds the password.
func noSecret(t *testing.T, what string, texts ...string) {
	t.Helper()
	for _, s := range texts {
		if strings.Contains(s, secret) {
			t.Errorf("%s shows the password: %s", what, s)
		}
	}
}

// printed is v as every fmt verb a log line or a panic message might use.
func printed(v any) []string {
	return []string{fmt.Sprint(v), fmt.Sprintf("%v", v), fmt.Sprintf("%+v", v), fmt.Sprintf("%#v", v), fmt.Sprintf("%s", v)}
}

// TestNoPasswordInConfigErrors: whatever a connection string or endpoint looks like,
// the constructors' errors never quote its password; one that does not parse is named,
// not shown; a password cut short by an unescaped '/' or '?' is refused, not taken for
// a database name or parameter.
func TestNoPasswordInConfigErrors(t *testing.T) {
	for _, s := range []string{
		"postgresql://u:S3CRET@[::1/db",                 // unparseable host
		"postgresql://u@[::1/db?password=S3CRET",        // unparseable, password in the query
		"postgresql://u:S3%zzCRET@h/db",                 // bad percent escape in the password
		"postgresql://u:S3CRET%@h/db",                   // truncated escape
		"postgresql://u:S3/CRET@h/db",                   // unescaped '/' in the password
		"postgresql://u:12/S3CRET@h:5432/db",            // ... that would parse as host u, port 12
		"postgresql://u:12?S3CRET@h/db",                 // unescaped '?': a query key
		"postgresql://u:12#S3CRET@h/db",                 // unescaped '#': a fragment
		"postgres://u:S3CRET@h:99999/db",                // bad port
		"postgresql://u@h/db?password=S3CRET&sslmode=x", // bad sslmode
		"postgresql://u:S3CRET@h/db?connect_timeout=x",  // bad timeout
		"host=h password=S3CRET port=abc",               // keyword/value, bad port
		"host=h password='S3CRET",                       // unterminated quote
		"host=h password=S3CRET sslmode=nope",           // bad sslmode
	} {
		tr, err := NewPostgresTransport(s)
		if err == nil {
			t.Errorf("%q: accepted (%v)", s, tr)
			continue
		}
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%q: %v is not ErrInvalidArgument", s, err)
		}
		noSecret(t, "NewPostgresTransport's error", append(printed(err), err.Error())...)
		t.Logf("%s -> %v", strings.ReplaceAll(s, secret, "…"), err)
	}
	// Good forms still parse, their password percent-encoded or in a keyword.
	for _, s := range []string{"postgresql://u:12%2FS3CRET@h/db?application_name=svc@host",
		"postgresql://u@h/db?password=S3CRET", "host=h password=S3CRET dbname=d"} {
		tr, err := NewPostgresTransport(s)
		if err != nil {
			t.Errorf("%q: %v", s, err)
			continue
		}
		noSecret(t, "a printed PostgresTransport", printed(tr)...)
	}

	for _, e := range []string{
		"http://u:S3CRET@127.0.0.1:2379",   // credentials in the URL
		"https://u:S3CRET@127.0.0.1:2379/", // the same over TLS
		"http://u:S3CRET@[::1:2379",        // unparseable
		"u:S3CRET@127.0.0.1:2379",          // no scheme
		"ftp://u:S3CRET@h:2379",            // another scheme
		"http://h:2379/%zzS3CRET",          // bad escape
	} {
		tr, err := NewEtcdTransport([]string{"http://127.0.0.1:2379", e}, nil)
		if err == nil {
			t.Errorf("%q: accepted (%v)", e, tr)
			continue
		}
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%q: %v is not ErrInvalidArgument", e, err)
		}
		noSecret(t, "NewEtcdTransport's error", printed(err)...)
		t.Logf("%s -> %v", strings.ReplaceAll(e, secret, "…"), err)
	}
}

// TestNoPasswordInPrintedConfigs: the configurations that hold a password print it
// masked whatever the verb.
func TestNoPasswordInPrintedConfigs(t *testing.T) {
	eo := EtcdOptions{Username: "u", Password: secret, TryTimeout: time.Second}
	et, err := NewEtcdTransport([]string{"https://127.0.0.1:2379"}, &eo)
	if err != nil {
		t.Fatal(err)
	}
	pt, err := NewPostgresTransport("postgresql://u:" + secret + "@127.0.0.1:1/db")
	if err != nil {
		t.Fatal(err)
	}
	rt, err := NewRedisTransportFromOptions(&redis.Options{Addr: "127.0.0.1:1", Username: "u", Password: secret}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	ft, err := NewRedisTransportFromFailoverOptions(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"},
		Password: secret, SentinelPassword: secret}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ft.Close()
	ct, err := NewRedisTransportFromClusterOptions(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, Password: secret}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ct.Close()
	for _, v := range []any{eo, &eo, et, pt, rt, ft, ct, struct{ E *EtcdTransport }{et}} {
		noSecret(t, fmt.Sprintf("a printed %T", v), printed(v)...)
	}
	if got := fmt.Sprintf("%+v", eo); !strings.Contains(got, `Username:"u"`) || !strings.Contains(got, `Password:"xxxxx"`) {
		t.Errorf("EtcdOptions prints as %s", got)
	}
	var nilEt *EtcdTransport
	if got := fmt.Sprint(nilEt); got != "<nil>" {
		t.Errorf("a nil *EtcdTransport prints as %s", got)
	}
}

// failedAcquireTexts is everything a Client says after a failed acquire: the error, its
// backend error and its log (debug level).
func failedAcquireTexts(t *testing.T, tr Transport) []string {
	t.Helper()
	opts, logs := capturingOptions()
	c := newTestClient(t, tr, opts)
	_, err := c.Acquire(context.Background(), "n", AcquireOptions{TTL: 5 * time.Second, Wait: 500 * time.Millisecond})
	if err == nil {
		t.Fatal("acquired with a wrong password")
	}
	be := c.BackendError()
	_ = c.Close()
	t.Logf("error: %v; backend: %s", err, be)
	return append(printed(err), be, logs.String())
}

// TestNoPasswordInBackendErrors: a wrong password, or an unreachable server, on real
// servers: neither the acquire's error, nor BackendError, nor the log shows it.
func TestNoPasswordInBackendErrors(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		u, err := url.Parse(needPostgres(t))
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword("postgres", secret)
		for _, s := range []string{u.String(), "postgresql://u:" + secret + "@127.0.0.1:1/db",
			"host=127.0.0.1 port=" + u.Port() + " user=postgres password=" + secret} {
			tr, err := NewPostgresTransport(s)
			if err != nil {
				t.Fatal(err)
			}
			texts := failedAcquireTexts(t, tr)
			noSecret(t, "a failed PostgreSQL client", texts...)
		}
	})
	t.Run("redis", func(t *testing.T) {
		addr := needRedis(t)
		// (A password for a server that needs none is ignored by go-redis: no failure.)
		for _, o := range []*redis.Options{{Addr: addr, Username: "nobody", Password: secret},
			{Addr: "127.0.0.1:1", Password: secret}} {
			tr, err := NewRedisTransportFromOptions(o, nil)
			if err != nil {
				t.Fatal(err)
			}
			noSecret(t, "a failed Redis client", failedAcquireTexts(t, tr)...)
			_ = tr.Close()
		}
		ft, err := NewRedisTransportFromFailoverOptions(&redis.FailoverOptions{MasterName: "m",
			SentinelAddrs: []string{addr}, Password: secret, SentinelPassword: secret}, nil)
		if err != nil {
			t.Fatal(err)
		}
		noSecret(t, "a failed Sentinel client", failedAcquireTexts(t, ft)...)
		_ = ft.Close()
	})
	t.Run("etcd", func(t *testing.T) {
		url := etcdWithAuth(t)
		tr, err := NewEtcdTransport([]string{url}, &EtcdOptions{Username: "root", Password: secret, AllowInsecureAuth: true})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		texts := failedAcquireTexts(t, tr)
		noSecret(t, "a failed etcd client", texts...)
		if !strings.Contains(strings.Join(texts, " "), "authentication failed") {
			t.Errorf("the wrong password is not the reason given: %v", texts)
		}
	})
}

// etcdWithAuth starts a 1-member cluster with authentication on (root / rootpw) and
// returns its URL.
func etcdWithAuth(t *testing.T) string {
	t.Helper()
	needEtcd(t)
	dir := t.TempDir()
	out, err := runScript("etcd-test-cluster.sh", "start", dir, "1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = runScript("etcd-test-cluster.sh", "stop", dir) })
	url := strings.Split(out, ",")[0]
	for _, step := range [][2]string{
		{"/v3/auth/role/add", `{"name":"root"}`},
		{"/v3/auth/user/add", `{"name":"root","password":"rootpw"}`},
		{"/v3/auth/user/grant", `{"user":"root","role":"root"}`},
		{"/v3/auth/enable", `{}`},
	} {
		if _, err := etcdPost(url, step[0], step[1], ""); err != nil {
			t.Fatal(err)
		}
	}
	return url
}

// TestEtcdRefusesAuthOverPlainHTTP: a user name and password for an http:// endpoint
// are refused with the reason, unless AllowInsecureAuth says the network is trusted;
// https:// endpoints, and http:// without credentials, need no opt-in.
func TestEtcdRefusesAuthOverPlainHTTP(t *testing.T) {
	auth := &EtcdOptions{Username: "root", Password: "rootpw"}
	_, err := NewEtcdTransport([]string{"https://e1:2379", "http://e2:2379"}, auth)
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "clear text") ||
		!strings.Contains(err.Error(), "http://e2:2379") || !strings.Contains(err.Error(), "AllowInsecureAuth") {
		t.Fatalf("credentials over http://: %v", err)
	}
	if _, err := NewEtcdTransport([]string{"https://e1:2379", "https://e2:2379"}, auth); err != nil {
		t.Fatalf("credentials over https://: %v", err)
	}
	if _, err := NewEtcdTransport([]string{"http://e1:2379"}, nil); err != nil {
		t.Fatalf("http:// without credentials: %v", err)
	}
	// Opted in, on a real cluster with auth on: the right password gets the lock.
	url := etcdWithAuth(t)
	tr, err := NewEtcdTransport([]string{url}, &EtcdOptions{Username: "root", Password: "rootpw", AllowInsecureAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	c := newTestClient(t, tr, &Options{RequestTimeout: 2 * time.Second, CloseTimeout: 200 * time.Millisecond})
	ctx := context.Background()
	l, err := c.Acquire(ctx, "n", AcquireOptions{TTL: 5 * time.Second, Wait: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRedissVerifiesTheHostName: a rediss:// URL (go-redis's ParseURL, ParseFailoverURL,
// ParseClusterURL) verifies the certificate against the URL's host, and a TLSConfig
// without ServerName against the address dialled: on a real TLS redis-server whose
// certificate names 127.0.0.1 only, reached as "localhost", a certificate the client
// trusts is still refused, and no lock is taken.
func TestRedissVerifiesTheHostName(t *testing.T) {
	needRedis(t)
	for u, want := range map[string]string{
		"rediss://:S3CRET@redis.example:6380/0": "redis.example",
		"rediss://:S3CRET@10.0.0.7:6380/0":      "10.0.0.7",
	} {
		o, err := redis.ParseURL(u)
		if err != nil {
			t.Fatal(err)
		}
		if o.TLSConfig == nil || o.TLSConfig.ServerName != want || o.TLSConfig.InsecureSkipVerify {
			t.Errorf("%s: TLS config %+v", u, o.TLSConfig)
		}
	}
	if o, err := redis.ParseFailoverURL("rediss://:S3CRET@sentinel.example:26379/0?master_name=m"); err != nil ||
		o.TLSConfig == nil || o.TLSConfig.ServerName != "sentinel.example" || o.TLSConfig.InsecureSkipVerify {
		t.Errorf("failover URL: %+v, %v", o, err)
	}
	if o, err := redis.ParseClusterURL("rediss://:S3CRET@node.example:7000"); err != nil ||
		o.TLSConfig == nil || o.TLSConfig.ServerName != "node.example" || o.TLSConfig.InsecureSkipVerify {
		t.Errorf("cluster URL: %+v, %v", o, err)
	}

	dir := t.TempDir()
	tlsConf, certFile, keyFile := selfSigned(t, dir)
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	stop, err := startRedisWith(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), TLSConfig: tlsConf},
		"--port", "0", "--tls-port", fmt.Sprint(port), "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--tls-ca-cert-file", certFile, "--tls-auth-clients", "no")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	trusting := func(o *redis.Options) *redis.Options {
		o.TLSConfig.RootCAs = tlsConf.RootCAs
		return o
	}
	ctx := context.Background()
	try := func(what string, o *redis.Options, wantOK bool) {
		t.Helper()
		rdb := redis.NewClient(o)
		defer rdb.Close()
		err := rdb.Ping(ctx).Err()
		if wantOK != (err == nil) {
			t.Errorf("%s: ping %v", what, err)
		}
		if !wantOK && (err == nil || !strings.Contains(err.Error(), "certificate")) {
			t.Errorf("%s: not refused for its certificate: %v", what, err)
		}
		tr, err := NewRedisTransport(rdb)
		if err != nil {
			t.Fatal(err)
		}
		c := newTestClient(t, tr, &Options{RequestTimeout: time.Second, CloseTimeout: 100 * time.Millisecond})
		l, err := c.Acquire(ctx, "tls-host", AcquireOptions{TTL: 5 * time.Second, Wait: 300 * time.Millisecond})
		if wantOK != (err == nil) {
			t.Errorf("%s: acquire %v", what, err)
		}
		if l != nil {
			_ = l.Release(ctx)
		}
		_ = c.Close()
	}
	for _, host := range []string{"127.0.0.1", "localhost"} {
		o, err := redis.ParseURL(fmt.Sprintf("rediss://%s:%d/0", host, port))
		if err != nil {
			t.Fatal(err)
		}
		try("rediss://"+host, trusting(o), host == "127.0.0.1")
		// A TLSConfig of the caller's, without ServerName: the dialled host is checked.
		try("TLSConfig{} to "+host, &redis.Options{Addr: fmt.Sprintf("%s:%d", host, port),
			TLSConfig: &tls.Config{RootCAs: tlsConf.RootCAs, MinVersion: tls.VersionTLS12}}, host == "127.0.0.1")
	}
}

// TestNoPasswordInOpenErrors: whatever a backend URL looks like, NewExecutor's and
// Open's errors never show its password, as written, percent-decoded or quoted; a URL
// whose password is cut short by an unescaped '/', '?', '#' or '@' is refused without
// being shown; what they accept prints without it.
func TestNoPasswordInOpenErrors(t *testing.T) {
	bad := []string{
		"redis://u:S3CRET@127.0.0.1:notaport/0",         // bad port
		"redis://u:S3/CRET@h:6379/0",                    // unescaped '/': the password cut short
		"redis://u:12/S3CRET@h:6379",                    // ... that would parse as host u, port 12
		"redis://u:12?S3CRET@h",                         // unescaped '?'
		"redis://u:12#S3CRET@h",                         // unescaped '#'
		"redis://u:S3%zzCRET@h",                         // bad percent escape
		"redis://u:S3CRET%@h",                           // truncated escape
		"redis://u:S3\"CRET@h",                          // a character userinfo may not hold
		"redis://u:S3CRET\n@h",                          // a control character
		"redis://u:S3CRET@h:6379/x",                     // bad database number
		"redis://u:S3CRET@h:6379/0?bogus=1",             // unknown option
		"redis://h:6379/0?password=S3CRET",              // the password as a query option
		"redis://u:S3CRET@[::1:6379",                    // unparseable host
		"rediss://u:S3CRET@h:6379/0?skip_verify=maybe",  // bad option value
		"unix://u:S3CRET@/tmp/redis.sock?db=x",          // bad database
		"unix://u:S3/CRET@/tmp/redis.sock",              // unescaped '/'
		"unix://u:S3CRET@/tmp/redis.sock",               // a password on unix:// (go-redis's form only)
		"redis://u:S3CRET@h/0?pool_size=3",              // a go-redis-only option on the byte path
		"redis://u:S3CRET@h/0?read_timeout=-1",          // no unbounded timeout on the byte path
		"redis+sentinel://u:S3CRET@h1:26379,h2:x/m",     // bad sentinel port
		"redis+sentinel://u:S3CRET@h1:26379",            // no master name
		"redis+sentinel://u:S3CRET@h1/m/x",              // bad database
		"redis+sentinel://u:S3CRET@h1/m?bogus=1",        // unknown option
		"redis+sentinel://u:S3?CRET@h1/m",               // unescaped '?'
		"redis+sentinel://u:S3%zCRET@h1/m",              // bad escape
		"redis+cluster://u:S3CRET@h1,h2/3",              // a database (Cluster has one)
		"redis+cluster://u:S3CRET@h1?read_only=true",    // replica reads
		"redis+cluster://u:S3CRET@h1?dial_timeout=soon", // bad option value
		"redis+cluster://u:S3CRET@h1#f",                 // a fragment
		"etcd://u:S3CRET@h1:2379",                       // clear text refused
		"etcd://u:S3CRET@h1:2379?insecure_auth=maybe",   // bad flag
		"etcd://u:S3CRET@h1:2379/v3",                    // a path
		"etcds://u:S3CRET@h1:99999",                     // bad port
		"etcds://u:S3/CRET@h1:2379",                     // unescaped '/'
		"postgresql://u:S3/CRET@h/db",                   // unescaped '/'
		"postgres://u:S3CRET@h:99999/db",                // bad port
		"sqlite://u:S3CRET@h/x.db",                      // a host part
		"memory://u:S3CRET@h",                           // memory takes nothing
		"ftp://u:S3CRET@h",                              // unknown scheme
		"u:S3CRET@h:6379",                               // no scheme: reads as scheme "u"
		" redis://u:S3CRET@h",                           // not a scheme
	}
	for _, s := range bad {
		e, err := NewExecutor(s, nil)
		if err == nil {
			t.Errorf("%q: accepted (%v)", s, e)
			if c, ok := e.(interface{ Close() error }); ok {
				_ = c.Close()
			}
			continue
		}
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%q: %v is not ErrInvalidArgument", s, err)
		}
		noSecret(t, "NewExecutor's error", printed(err)...)
		if _, err := Open(s, nil); err == nil {
			t.Errorf("Open(%q) accepted", s)
		} else {
			noSecret(t, "Open's error", printed(err)...)
		}
		t.Logf("%q -> %v", strings.ReplaceAll(s, secret, "…"), err)
	}
	// Accepted URLs with a password print without it.
	goRedis := &ExecutorOptions{GoRedis: true}
	for s, o := range map[string]*ExecutorOptions{"redis://u:S3CRET@127.0.0.1:1/0": nil, "rediss://:S3CRET@127.0.0.1:1": nil,
		"redis://u:S3CRET@127.0.0.1:1/0?pool_size=3": goRedis, "rediss://:S3CRET@127.0.0.1:1?skip_verify=true": nil,
		"unix://u:S3CRET@/tmp/none.sock": goRedis, "redis+sentinel://u:S3CRET@127.0.0.1:1/m": nil,
		"redis+sentinel://u:S3CRET@127.0.0.1:1/m?pool_size=3": goRedis,
		"redis+cluster://u:S3CRET@127.0.0.1:1":                nil, "etcds://u:S3CRET@127.0.0.1:1": nil,
		"postgresql://u:S3CRET@127.0.0.1:1/db": nil} {
		e, err := NewExecutor(s, o)
		if err != nil {
			t.Errorf("%q: %v", strings.ReplaceAll(s, secret, "…"), err)
			continue
		}
		noSecret(t, fmt.Sprintf("a printed %T", e), printed(e)...)
		_ = e.(interface{ Close() error }).Close()
	}
	// redactURL itself, on what messages show.
	for _, s := range append(bad, "redis://u:S3CRET@h?token=S3CRET", "postgresql://h/db?sslpassword=S3CRET") {
		noSecret(t, "redactURL", redactURL(s))
	}
}
