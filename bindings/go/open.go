package leasehold

// Opening a backend from a URL, in the forms the leasehold CLI and the other bindings
// accept. The URL becomes the options of the host's own driver (go-redis, pgx,
// go-sqlite3, net/http), or, for Redis on the byte path, goes to the core
// (open_stream.go); nothing of a backend's protocol is read here. A URL may hold a
// password: no error shows it (redactURL, scrubSecrets).

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ExecutorOptions are the backends' options for NewExecutor; only those of the
// URL's backend are read. Nil fields take the defaults.
type ExecutorOptions struct {
	// Redis tunes the core's Redis protocol, on either path.
	Redis *RedisOptions
	// RedisStream configures the RedisStreamExecutor (the core on the wire) that
	// redis://, rediss://, unix://, redis+sentinel:// and redis+cluster:// URLs open by default.
	RedisStream *RedisStreamOptions
	// GoRedis opens those URLs with go-redis instead (a RedisExecutor on a client of its
	// own, go-redis's URL forms and query options).
	GoRedis  bool
	SQLite   *SQLiteOptions
	Postgres *PostgresOptions
	// Etcd: TLS and TryTimeout; a user name and password in the URL take the
	// place of Username and Password.
	Etcd *EtcdOptions
}

// OpenOptions configure Open: the LockClient's Options and its executor's.
type OpenOptions struct {
	Options
	ExecutorOptions
}

// backendSchemes is what an unknown scheme's error suggests.
const backendSchemes = "sqlite://, redis://, rediss://, unix://, redis+sentinel://, redis+cluster://, " +
	"postgresql://, etcd://, etcds:// or memory://"

// Open opens the backend rawURL names (see NewExecutor) and starts a LockClient on
// it; the LockClient's Close also closes the executor. o may be nil.
func Open(rawURL string, o *OpenOptions) (*LockClient, error) {
	var oo OpenOptions
	if o != nil {
		oo = *o
	}
	e, err := NewExecutor(rawURL, &oo.ExecutorOptions)
	if err != nil {
		return nil, err
	}
	cl, err := NewLockClient(e, &oo.Options)
	if err != nil {
		if c, ok := e.(io.Closer); ok {
			_ = c.Close()
		}
		return nil, err
	}
	if c, ok := e.(io.Closer); ok {
		cl.c.owned = c
	}
	return cl, nil
}

// NewExecutor returns the executor for a backend URL:
//
//	sqlite:///ABS/PATH, sqlite:REL/PATH, sqlite://      a SQLite file (sqlite:// is DefaultSQLitePath)
//	redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]           Redis, a RedisStreamExecutor;
//	rediss://…, unix:///PATH[?db=N]                      over TLS, or a unix socket
//	redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT…]/MASTER[/DB]
//	                                                    the master the sentinels name MASTER (the
//	                                                    credentials and DB are the Redis servers')
//	redis+cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT…]
//	                                                    Redis Cluster (7+), any of its nodes
//	postgresql://…, postgres://…                        PostgreSQL (pgx's connection strings)
//	etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][?insecure_auth=1]
//	etcds://…                                           an etcd v3 cluster over http or https
//	memory://                                           a new in-process MemoryService
//
// redis://, rediss://, unix://, redis+sentinel:// and redis+cluster:// open on the byte
// path (the core on the wire, RedisStreamExecutor), which maps the go-redis query options
// client_name, protocol, dial_timeout, read_timeout, db and skip_verify (rediss://) to
// RedisStreamOptions and refuses any other; with o.GoRedis they open on go-redis
// (RedisExecutor: go-redis's URL forms, a password on unix://, all its query options).
// etcd:// with a
// user name or password is refused unless the URL ends in ?insecure_auth=1 (they would
// cross the network in clear text). A '/', '?', '#' or '@' in a user name or password
// must be percent-encoded. No error shows the password.
//
// Every executor it returns has a Close method (io.Closer); a go-redis client it makes
// is the executor's own. o may be nil.
func NewExecutor(rawURL string, o *ExecutorOptions) (Executor, error) {
	var eo ExecutorOptions
	if o != nil {
		eo = *o
	}
	scheme, _, ok := strings.Cut(rawURL, ":")
	if !ok || !validScheme(scheme) {
		return nil, invalidArg("backend URL %s has no scheme (use %s)", redactURL(rawURL), backendSchemes)
	}
	switch strings.ToLower(scheme) {
	case "sqlite":
		path, err := sqlitePathFromURL(rawURL)
		if err != nil {
			return nil, err
		}
		return NewSQLiteExecutor(path, eo.SQLite)
	case "memory":
		if rest := strings.TrimLeft(rawURL[len(scheme)+1:], "/"); rest != "" {
			return nil, invalidArg("memory URLs take no host or path: %s", redactURL(rawURL))
		}
		return NewMemoryExecutor(), nil
	case "redis", "rediss", "unix", "redis+sentinel", "redis+cluster":
		s := strings.ToLower(scheme)
		if streamSchemes[s] && !eo.GoRedis {
			return openRedisStream(rawURL, s, &eo)
		}
		if streamSchemes[s] && eo.RedisStream != nil {
			return nil, invalidArg("ExecutorOptions: GoRedis and RedisStream both set for %s (RedisStream configures the byte path)", redactURL(rawURL))
		}
		switch s {
		case "redis+sentinel":
			return openSentinel(rawURL, eo.Redis)
		case "redis+cluster":
			return openCluster(rawURL, eo.Redis)
		}
		return openRedis(rawURL, eo.Redis)
	case "postgresql", "postgres":
		return NewPostgresExecutor(rawURL, eo.Postgres)
	case "etcd", "etcds":
		return openEtcd(rawURL, eo.Etcd)
	}
	return nil, invalidArg("unknown backend URL %s (use %s)", redactURL(rawURL), backendSchemes)
}

func validScheme(s string) bool {
	if s == "" || !(s[0] >= 'a' && s[0] <= 'z' || s[0] >= 'A' && s[0] <= 'Z') {
		return false
	}
	return strings.Trim(strings.ToLower(s), "abcdefghijklmnopqrstuvwxyz0123456789+.-") == ""
}

// sqlitePathFromURL maps sqlite:///abs, sqlite:rel and sqlite:// (the default file).
func sqlitePathFromURL(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", invalidArg("bad SQLite URL %s: %s", redactURL(rawURL), parseReason(err, nil))
	}
	if u.Host != "" || u.User != nil {
		return "", invalidArg("SQLite URLs have no host part (use sqlite:///ABSOLUTE/PATH): %s", redactURL(rawURL))
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return "", invalidArg("SQLite URLs take no query or fragment: %s", redactURL(rawURL))
	}
	path := u.Path
	if u.Opaque != "" {
		if path, err = url.PathUnescape(u.Opaque); err != nil {
			return "", invalidArg("bad SQLite URL %s: bad percent escape", redactURL(rawURL))
		}
	}
	if path == "" {
		return DefaultSQLitePath()
	}
	return path, nil
}

// openRedis: redis://, rediss:// and unix:// through go-redis's ParseURL.
func openRedis(rawURL string, o *RedisOptions) (Executor, error) {
	if err := checkAuthority(rawURL, "Redis"); err != nil {
		return nil, err
	}
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, invalidArg("bad Redis URL %s: %s", redactURL(rawURL), parseReason(err, urlSecrets(rawURL)))
	}
	opt.ContextTimeoutEnabled = true // see newOwnedRedis
	return newOwnedRedis(redis.NewClient(opt), o, false)
}

// openSentinel reads redis+sentinel://CREDS@HOSTS/MASTER[/DB]?QUERY into go-redis's
// failover options (ParseFailoverURL for the query's options).
func openSentinel(rawURL string, o *RedisOptions) (Executor, error) {
	p, err := splitMultiHost(rawURL, "Redis Sentinel", 26379)
	if err != nil {
		return nil, err
	}
	parts := strings.FieldsFunc(p.path, func(r rune) bool { return r == '/' })
	if len(parts) == 0 || len(parts) > 2 {
		return nil, invalidArg("Redis Sentinel URL %s needs /MASTER_NAME[/DB] after the sentinels", redactURL(rawURL))
	}
	master, err := url.PathUnescape(parts[0])
	if err != nil {
		return nil, invalidArg("Redis Sentinel URL %s: bad percent escape in the master name", redactURL(rawURL))
	}
	db := ""
	if len(parts) == 2 {
		if _, err := strconv.ParseUint(parts[1], 10, 16); err != nil {
			return nil, invalidArg("Redis Sentinel URL %s: bad database number (want /MASTER_NAME/DB, DB a number)", redactURL(rawURL))
		}
		db = "/" + parts[1]
	}
	p.query.Set("master_name", master)
	opt, err := redis.ParseFailoverURL(p.goRedisURL(db))
	if err != nil {
		return nil, invalidArg("bad Redis Sentinel URL %s: %s", redactURL(rawURL), parseReason(err, urlSecrets(rawURL)))
	}
	opt.Username, opt.Password = p.user, p.password
	if !p.query.Has("context_timeout_enabled") {
		opt.ContextTimeoutEnabled = true // see newOwnedRedis
	}
	if err := checkFailoverOptions(opt); err != nil {
		return nil, err
	}
	return newOwnedRedis(redis.NewFailoverClient(opt), o, false)
}

// openCluster reads redis+cluster://CREDS@HOSTS?QUERY into go-redis's cluster options
// (ParseClusterURL for the query's options).
func openCluster(rawURL string, o *RedisOptions) (Executor, error) {
	p, err := splitMultiHost(rawURL, "Redis Cluster", 6379)
	if err != nil {
		return nil, err
	}
	if strings.Trim(p.path, "/") != "" {
		return nil, invalidArg("a Redis Cluster URL has no path (Cluster has one database): %s", redactURL(rawURL))
	}
	opt, err := redis.ParseClusterURL(p.goRedisURL(""))
	if err != nil {
		return nil, invalidArg("bad Redis Cluster URL %s: %s", redactURL(rawURL), parseReason(err, urlSecrets(rawURL)))
	}
	opt.Username, opt.Password = p.user, p.password
	opt.ContextTimeoutEnabled = true // see newOwnedRedis
	if opt.ReadOnly || opt.RouteByLatency || opt.RouteRandomly {
		return nil, invalidArg("Redis Cluster URL %s: locks are taken on the masters only", redactURL(rawURL))
	}
	return newOwnedRedis(redis.NewClusterClient(opt), o, true)
}

// newOwnedRedis is the executor on a go-redis client made here: Close closes it. The
// client honours its commands' ctx deadlines (ContextTimeoutEnabled), so a command ends
// by the core's request timeout and a caller that cannot cancel runs it on its own
// goroutine (runInline).
func newOwnedRedis(rdb redis.UniversalClient, o *RedisOptions, cluster bool) (Executor, error) {
	var opt RedisOptions
	if o != nil {
		opt = *o
	}
	opt.CloseClient = true
	if cluster {
		opt.ShardedWake = true
	}
	t, err := newRedisExecutor(rdb, opt, true)
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	return t, nil
}

// openEtcd: etcd:// (http) and etcds:// (https) members, credentials from the URL.
func openEtcd(rawURL string, o *EtcdOptions) (Executor, error) {
	p, err := splitMultiHost(rawURL, "etcd", 2379)
	if err != nil {
		return nil, err
	}
	if strings.Trim(p.path, "/") != "" {
		return nil, invalidArg("bad etcd URL %s: give HOST:PORT[,HOST:PORT...] and nothing else", redactURL(rawURL))
	}
	var opt EtcdOptions
	if o != nil {
		opt = *o
	}
	for k, v := range p.query {
		if k != "insecure_auth" || len(v) != 1 {
			return nil, invalidArg("bad etcd URL %s: the only query parameter is insecure_auth=1", redactURL(rawURL))
		}
		on, err := strconv.ParseBool(v[0])
		if err != nil {
			return nil, invalidArg("bad etcd URL %s: insecure_auth takes 1 or 0", redactURL(rawURL))
		}
		opt.AllowInsecureAuth = opt.AllowInsecureAuth || on
	}
	if p.hasUser {
		opt.Username, opt.Password = p.user, p.password
	}
	tls := strings.EqualFold(p.scheme, "etcds")
	if opt.Username != "" && !tls && !opt.AllowInsecureAuth {
		return nil, invalidArg("etcd URL %s: etcd:// would send the user name and password in clear text; "+
			"use etcds:// (TLS), or add ?insecure_auth=1 to send them over plain HTTP anyway", redactURL(rawURL))
	}
	prefix := "http://"
	if tls {
		prefix = "https://"
	}
	endpoints := make([]string, len(p.hosts))
	for i, h := range p.hosts {
		endpoints[i] = prefix + h
	}
	return NewEtcdExecutor(endpoints, &opt)
}

// multiHost is a URL of the form SCHEME://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]…][/PATH][?QUERY].
type multiHost struct {
	scheme, user, password, path string
	hasUser                      bool
	hosts                        []string // host:port, the default port filled in
	query                        url.Values
}

func splitMultiHost(rawURL, what string, defaultPort int) (*multiHost, error) {
	if err := checkAuthority(rawURL, what); err != nil {
		return nil, err
	}
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok || strings.Contains(rest, "#") {
		return nil, invalidArg("bad %s URL %s: want %s://HOST:PORT[,HOST:PORT...] (no fragment)", what, redactURL(rawURL), strings.ToLower(scheme))
	}
	p := &multiHost{scheme: scheme}
	rest, rawQuery, _ := strings.Cut(rest, "?")
	authority, path, _ := strings.Cut(rest, "/")
	p.path = path
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		p.hasUser = true
		user, pass, _ := strings.Cut(authority[:at], ":")
		var err1, err2 error
		p.user, err1 = url.PathUnescape(user)
		p.password, err2 = url.PathUnescape(pass)
		if err1 != nil || err2 != nil {
			return nil, invalidArg("bad %s URL %s: bad percent escape in the user name or password", what, redactURL(rawURL))
		}
		authority = authority[at+1:]
	}
	for _, h := range strings.Split(authority, ",") {
		h = strings.TrimSpace(h)
		host, port, err := net.SplitHostPort(h)
		if err != nil { // no port: the default one
			host, port = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"), strconv.Itoa(defaultPort)
		}
		if n, err := strconv.Atoi(port); host == "" || err != nil || n <= 0 || n > 65535 || strings.ContainsAny(host, "[]/ ") {
			return nil, invalidArg("bad %s URL %s: bad address %q (want HOST:PORT)", what, redactURL(rawURL), h)
		}
		p.hosts = append(p.hosts, net.JoinHostPort(host, port))
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, invalidArg("bad %s URL %s: its query does not parse", what, redactURL(rawURL))
	}
	p.query = q
	return p, nil
}

// goRedisURL is the redis:// URL go-redis's parsers read: the first host, the others as
// addr parameters, no credentials (the caller sets them on the parsed options).
func (p *multiHost) goRedisURL(path string) string {
	q := url.Values{}
	for k, v := range p.query {
		q[k] = v
	}
	for _, h := range p.hosts[1:] {
		q.Add("addr", h)
	}
	u := url.URL{Scheme: "redis", Host: p.hosts[0], Path: path, RawQuery: q.Encode()}
	return u.String()
}

// checkAuthority refuses a URL with an '@' past its host part: the rest of a user name
// or password cut short by an unescaped '/', '?' or '#', which a parser would take for
// a path or query and quote in its errors. The URL is not shown.
func checkAuthority(rawURL, what string) error {
	_, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return nil
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 && strings.Contains(rest[i:], "@") {
		return invalidArg("%s URL (not shown: it may hold a password) has an '@' past its host: "+
			"a '/', '?', '#' or '@' in a user name or password must be percent-encoded", what)
	}
	return nil
}

// redactPlaceholder stands for a URL that cannot be shown safely.
const redactPlaceholder = "<URL not shown>"

// redactURL is rawURL fit for a message: the password and secret-looking query values
// replaced by xxxxx, the fragment dropped, quoted (control characters escaped). It never
// returns the secret: the password is whatever follows the first ':' of everything
// between "//" and the last '@' of the host part, and a URL with an '@' anywhere else
// (outside a file path) is not shown at all.
func redactURL(rawURL string) string {
	scheme, body, ok := strings.Cut(rawURL, ":")
	if !ok || !validScheme(scheme) {
		if strings.Trim(rawURL, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._/~-") == "" {
			return strconv.Quote(rawURL)
		}
		return redactPlaceholder
	}
	pathScheme := slices.Contains([]string{"sqlite", "unix", "memory"}, strings.ToLower(scheme))
	body, _, _ = strings.Cut(body, "#")
	body, query, hasQuery := strings.Cut(body, "?")
	if rest, ok := strings.CutPrefix(body, "//"); ok {
		end := len(rest)
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			end = i
		}
		if !pathScheme && strings.Contains(rest[end:], "@") {
			return redactPlaceholder
		}
		if at := strings.LastIndex(rest[:end], "@"); at >= 0 {
			user, _, hasPass := strings.Cut(rest[:at], ":")
			if hasPass {
				user += ":xxxxx"
			}
			rest = user + rest[at:]
		}
		body = "//" + rest
	} else if !pathScheme && strings.Contains(body, "@") {
		return redactPlaceholder // "user:password@host" reads as scheme "user"
	}
	if hasQuery {
		if strings.Contains(query, "@") && !pathScheme {
			return redactPlaceholder
		}
		kvs := strings.Split(query, "&")
		for i, kv := range kvs {
			if k, _, ok := strings.Cut(kv, "="); ok && secretKey(k) {
				kvs[i] = k + "=xxxxx"
			}
		}
		body += "?" + strings.Join(kvs, "&")
	}
	return strconv.Quote(scheme + ":" + body)
}

// secretKey reports a query key whose value is a secret (libpq's password and
// sslpassword, tokens, keys…).
func secretKey(k string) bool {
	k = strings.ToLower(k)
	for _, s := range []string{"pass", "pwd", "secret", "token", "key", "cred"} {
		if strings.Contains(k, s) {
			return true
		}
	}
	return false
}

// urlSecrets are the password of rawURL (as written and decoded) and its
// secret-looking query values.
func urlSecrets(rawURL string) []string {
	var out []string
	add := func(s string) {
		if s != "" {
			out = append(out, s)
			if d, err := url.PathUnescape(s); err == nil && d != s {
				out = append(out, d)
			}
		}
	}
	_, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return nil
	}
	rest, query, _ := strings.Cut(rest, "?")
	end := len(rest)
	if i := strings.IndexAny(rest, "/#"); i >= 0 {
		end = i
	}
	if at := strings.LastIndex(rest[:end], "@"); at >= 0 {
		if _, pass, ok := strings.Cut(rest[:at], ":"); ok {
			add(pass)
		}
	}
	query, _, _ = strings.Cut(query, "#")
	for _, kv := range strings.Split(query, "&") {
		if k, v, ok := strings.Cut(kv, "="); ok && secretKey(k) {
			add(v)
		}
	}
	return out
}

// parseReason is a driver's parse error without the URL it quotes (net/url's errors
// quote it whole) and with every secret masked, however it was quoted.
func parseReason(err error, secrets []string) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ee url.EscapeError
	if errors.As(err, &ee) {
		return "bad percent escape"
	}
	return scrubSecrets(err.Error(), secrets)
}

// scrubSecrets replaces each secret in text, as written or quoted by %q, with xxxxx.
func scrubSecrets(text string, secrets []string) string {
	for _, s := range secrets {
		q := strconv.Quote(s)
		for _, form := range []string{s, q[1 : len(q)-1], fmt.Sprintf("%+q", s)} {
			if form != "" {
				text = strings.ReplaceAll(text, form, "xxxxx")
			}
		}
	}
	return text
}
