package leasehold

// The etcd executor: the core's etcd v3 requests (docs/etcd-protocol.md) go to the
// cluster's JSON gateway over net/http, failing over between members; replies and watch
// messages are handed back unread.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// EtcdExecutor is the etcd executor: a LockClient made on
// it speaks the core's etcd protocol (a lease per holder, one transaction
// per acquire, the owner key's create revision as the fencing token, a
// waiter watching only its predecessor) through etcd's JSON gateway, with
// nothing but net/http. Any member serves any request: a member that does
// not answer is skipped for the next one. Python and C++ clients contend
// correctly with it for the same names.
type EtcdExecutor struct {
	urls       []string
	proto      etcdProtocol
	http       *http.Client
	tryTimeout time.Duration
	preferred  atomic.Int64 // the member that answered last
}

// EtcdOptions configures an EtcdExecutor; zero fields take the defaults.
type EtcdOptions struct {
	// Username and Password authenticate every LockClient (etcd's auth);
	// empty: no authentication. Over http:// endpoints both, and the token
	// that stands for them, would cross the network in clear text: they are
	// refused there unless AllowInsecureAuth is set.
	Username, Password string
	// AllowInsecureAuth lets Username and Password go to http:// endpoints
	// (a loopback or otherwise trusted network). Default false.
	AllowInsecureAuth bool
	// TLS is used for https:// endpoints (client certificates, CAs).
	TLS *tls.Config
	// TryTimeout bounds one attempt on one member before the next one is
	// tried (default 1s; the whole request is bounded by the LockClient's
	// RequestTimeout).
	TryTimeout time.Duration
}

// NewEtcdExecutor returns the executor for the cluster whose
// members' client URLs are endpoints (http://host:2379 or https://…; no
// credentials in them: those are EtcdOptions'). o may be nil. Its errors
// never quote a password: an endpoint that does not parse is named by its
// position.
func NewEtcdExecutor(endpoints []string, o *EtcdOptions) (*EtcdExecutor, error) {
	if len(endpoints) == 0 {
		return nil, invalidArg("no etcd endpoints")
	}
	var opt EtcdOptions
	if o != nil {
		opt = *o
	}
	if opt.TryTimeout < 0 {
		return nil, invalidArg("negative TryTimeout")
	}
	if opt.TryTimeout == 0 {
		opt.TryTimeout = time.Second
	}
	if opt.Username == "" && opt.Password != "" {
		return nil, invalidArg("a password without a user name")
	}
	t := &EtcdExecutor{proto: etcdProtocol{user: opt.Username, password: opt.Password}, tryTimeout: opt.TryTimeout}
	for i, e := range endpoints {
		u, err := url.Parse(strings.TrimRight(e, "/"))
		if err != nil {
			return nil, invalidArg("etcd endpoint #%d does not parse as a URL (not shown: it may hold a password)", i+1)
		}
		if u.User != nil {
			return nil, invalidArg("etcd endpoint %s holds credentials: pass them as EtcdOptions.Username and Password", u.Redacted())
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			if u.Opaque != "" { // "user:password@host" reads as scheme "user"
				return nil, invalidArg("etcd endpoint #%d is not an http:// or https:// URL (not shown: it may hold a password)", i+1)
			}
			return nil, invalidArg("etcd endpoint %q is not an http:// or https:// URL", u.Redacted())
		}
		if u.Scheme == "http" && opt.Username != "" && !opt.AllowInsecureAuth {
			return nil, invalidArg("etcd endpoint %s is http://: the user name and password (and the token that stands for them) "+
				"would cross the network in clear text; use https://, or set EtcdOptions.AllowInsecureAuth on a trusted network", u)
		}
		t.urls = append(t.urls, u.String())
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = opt.TLS
	tr.MaxIdleConnsPerHost = 64
	t.http = &http.Client{Transport: tr}
	return t, nil
}

// Format prints the options with the password masked, whatever the verb.
func (o EtcdOptions) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "{Username:%q Password:%q AllowInsecureAuth:%t TLS:%t TryTimeout:%v}",
		o.Username, mask(o.Password), o.AllowInsecureAuth, o.TLS != nil, o.TryTimeout)
}

// Format prints the transport with the password masked, whatever the verb.
func (t *EtcdExecutor) Format(f fmt.State, _ rune) {
	if t == nil {
		fmt.Fprint(f, "<nil>")
		return
	}
	fmt.Fprintf(f, "EtcdExecutor{Endpoints:%q Username:%q Password:%q}", t.urls, t.proto.user, mask(t.proto.password))
}

func mask(secret string) string {
	if secret == "" {
		return ""
	}
	return "xxxxx"
}

// Endpoints returns the members' client URLs.
func (t *EtcdExecutor) Endpoints() []string { return append([]string(nil), t.urls...) }

// Close closes the idle HTTP connections. Each LockClient closes its watch
// streams in LockClient.Close.
func (t *EtcdExecutor) Close() error {
	t.http.CloseIdleConnections()
	return nil
}

func (t *EtcdExecutor) backend() backendOptions {
	return backendOptions{kind: backendEtcd, etcd: t.proto}
}

func (t *EtcdExecutor) start(c *client) (ioExec, error) {
	return &etcdExec{c: c, t: t, watches: map[uint64]context.CancelFunc{}}, nil
}

type etcdExec struct {
	c  *client
	t  *EtcdExecutor
	mu sync.Mutex
	// watches maps each open watch to what closes it.
	watches map[uint64]context.CancelFunc
	closed  bool
	wg      sync.WaitGroup
}

// run: a unary request is a job (an acquire's transaction, a release's delete can run on
// the goroutine that waits for them); a watch stream gets a goroutine of its own; a
// cancellation closes its stream.
func (x *etcdExec) run(q *ioRequest) (*job, error) {
	switch q.kind {
	case ioHTTP:
		return &job{id: q.id, timeout: x.c.reqTimeout, run: func(ctx context.Context) { x.unary(ctx, q) }}, nil
	case ioHTTPWatch:
		x.mu.Lock()
		defer x.mu.Unlock()
		if x.closed {
			return nil, nil
		}
		ctx, cancel := context.WithCancel(x.c.ioCtx)
		x.watches[q.id] = cancel
		x.wg.Add(1)
		go x.watch(ctx, q)
		return nil, nil
	case ioHTTPCancel:
		x.mu.Lock()
		if cancel := x.watches[q.id]; cancel != nil {
			delete(x.watches, q.id)
			cancel()
		}
		x.mu.Unlock()
		return nil, nil
	}
	return nil, errUnsupportedIO
}

func (x *etcdExec) close() {
	x.mu.Lock()
	x.closed = true
	for id, cancel := range x.watches {
		cancel()
		delete(x.watches, id)
	}
	x.mu.Unlock()
	x.wg.Wait()
}

// post sends one request to member i; the response is the caller's to close.
func (x *etcdExec) post(ctx context.Context, i int, q *ioRequest) (*http.Response, error) {
	method := q.method
	if method == "" {
		method = http.MethodPost
	}
	req, err := http.NewRequestWithContext(ctx, method, x.t.urls[i]+q.path, bytes.NewReader(q.body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if q.authorization != "" {
		req.Header.Set("Authorization", q.authorization)
	}
	return x.t.http.Do(req)
}

// unary tries each member, starting at the one that answered last, until one answers.
func (x *etcdExec) unary(ctx context.Context, q *ioRequest) {
	n := len(x.t.urls)
	start := int(x.t.preferred.Load()) % n
	var last error
	for k := 0; k < n && ctx.Err() == nil; k++ {
		i := (start + k) % n
		tctx, cancel := context.WithTimeout(ctx, x.t.tryTimeout)
		resp, err := x.post(tctx, i, q)
		var body []byte
		if err == nil {
			body, err = io.ReadAll(io.LimitReader(resp.Body, maxReplyData+1))
			_ = resp.Body.Close()
			if err == nil && len(body) > maxReplyData {
				err = fmt.Errorf("reply body over %d bytes", maxReplyData)
			}
		}
		cancel()
		if err != nil {
			last = fmt.Errorf("%s: %w", x.t.urls[i], err)
			continue
		}
		x.t.preferred.Store(int64(i))
		status := resp.StatusCode
		x.c.input(func(now uint64) error { return x.c.core.ioHTTPReply(now, q.id, status, body) })
		return
	}
	if last == nil {
		last = ctx.Err()
	}
	// The next request starts at another member.
	x.t.preferred.CompareAndSwap(int64(start), int64((start+1)%n))
	x.c.input(func(now uint64) error { return x.c.core.ioFailed(now, q.id, failTransport, failMessage(last)) })
}

// watch keeps one watch stream open and passes each message on; its end is a failure.
func (x *etcdExec) watch(ctx context.Context, q *ioRequest) {
	defer x.wg.Done()
	err := x.stream(ctx, q)
	x.mu.Lock()
	_, live := x.watches[q.id]
	delete(x.watches, q.id)
	x.mu.Unlock()
	if live { // a cancelled watch is answered by nothing
		if err == nil {
			err = errors.New("watch stream ended")
		}
		x.c.input(func(now uint64) error { return x.c.core.ioFailed(now, q.id, failTransport, failMessage(err)) })
	}
}

func (x *etcdExec) stream(ctx context.Context, q *ioRequest) error {
	n := len(x.t.urls)
	start := int(x.t.preferred.Load()) % n
	var resp *http.Response
	var last error
	for k := 0; k < n && ctx.Err() == nil; k++ {
		i := (start + k) % n
		// Only the connection and the response head are bounded; the stream stays open.
		tctx, cancel := context.WithCancel(ctx)
		timer := time.AfterFunc(x.t.tryTimeout, cancel)
		r, err := x.post(tctx, i, q)
		if err == nil && !timer.Stop() {
			_ = r.Body.Close()
			err = context.DeadlineExceeded
		}
		if err != nil {
			cancel()
			last = fmt.Errorf("%s: %w", x.t.urls[i], err)
			continue
		}
		defer cancel()
		resp = r
		break
	}
	if resp == nil {
		if last == nil {
			last = ctx.Err()
		}
		return last
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("watch answered HTTP %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxReplyData+1)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		msg := append([]byte(nil), line...)
		x.c.input(func(now uint64) error { return x.c.core.ioStreamMessage(now, q.id, msg) })
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("watch stream ended")
}
