package leasehold

// The PostgreSQL executor: the core's SQL requests (docs/sql-protocol.md) run verbatim on a
// commands connection; LISTEN / UNLISTEN on a listener connection, whose notifications are
// passed on unread.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PostgresExecutor is the PostgreSQL executor: a LockClient
// made on it speaks the core's SQL protocol (its tables and PL/pgSQL
// functions, expiry on the server's clock, fences that never regress,
// release notifications through LISTEN/NOTIFY) and only runs what the core
// asks, on pgx v5 connections of its own: one for commands and one that
// LISTENs. Python and C++ clients contend correctly with it for the same
// names.
type PostgresExecutor struct {
	cfg   *pgx.ConnConfig
	proto sqlProtocol
	facts hostFacts
}

// PostgresOptions tunes the PostgreSQL protocol; zero fields take its defaults.
type PostgresOptions struct {
	// AsynchronousCommit: acquire, renew and release commit without waiting
	// for the server's WAL flush (synchronous_commit = off for their own
	// transactions only). Several times the throughput on a server that
	// flushes; a crash of the server may forget the last moments' grants and
	// releases (docs/backends.md). Default false.
	AsynchronousCommit bool
	// Config is a parsed pgx configuration (TLS, dialer, runtime
	// parameters…) used instead of a connection string; each LockClient
	// connects with a copy of it.
	Config *pgx.ConnConfig
}

// NewPostgresExecutor returns the PostgreSQL executor for connString, in the
// usual forms (postgresql://user:pass@host:port/db?sslmode=verify-full or
// key=value pairs; PG* environment variables fill what it leaves out), or for
// o.Config when connString is empty. A string that does not parse is refused
// with an error that does not quote it (it may hold a password), as is a URL
// with an '@' past its host part: a password holding an unescaped '/', '?' or
// '#'. o may be nil.
func NewPostgresExecutor(connString string, o *PostgresOptions) (*PostgresExecutor, error) {
	var opt PostgresOptions
	if o != nil {
		opt = *o
	}
	if opt.Config != nil {
		if connString != "" {
			return nil, invalidArg("give a PostgreSQL connection string or PostgresOptions.Config, not both")
		}
		return newPostgresExecutor(opt.Config, opt), nil
	}
	if misplacedAt(connString) {
		return nil, invalidArg("PostgreSQL URL (not shown: it may hold a password) has an '@' past its host: " +
			"a '/', '?' or '#' in a user name or password must be percent-encoded")
	}
	// pgx masks the password in its parse errors only as far as it can tell where it
	// is, and its wrapped errors quote the string: none of it is passed on.
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return nil, invalidArg("PostgreSQL connection string does not parse: %s (not shown: it may hold a password; "+
			"a '@', ':', '/', '?', '#' or '%%' in a user name or password must be percent-encoded)", pgParseReason(err))
	}
	return newPostgresExecutor(cfg, opt), nil
}

func newPostgresExecutor(cfg *pgx.ConnConfig, o PostgresOptions) *PostgresExecutor {
	t := &PostgresExecutor{cfg: cfg.Copy(), facts: readHostFacts()}
	t.proto.asynchronousCommit = o.AsynchronousCommit
	return t
}

// Format prints the executor's server, database and user, never its password,
// whatever the verb.
func (t *PostgresExecutor) Format(f fmt.State, _ rune) {
	if t == nil {
		fmt.Fprint(f, "<nil>")
		return
	}
	pw := ""
	if t.cfg.Password != "" {
		pw = "xxxxx"
	}
	fmt.Fprintf(f, "PostgresExecutor{Host:%q Port:%d Database:%q User:%q Password:%q}",
		t.cfg.Host, t.cfg.Port, t.cfg.Database, t.cfg.User, pw)
}

// pgParseReasons are pgx's parse error messages that quote nothing of the input.
var pgParseReasons = []string{"failed to parse as URL", "failed to parse as keyword/value", "invalid port",
	"invalid connect_timeout", "invalid sslcertmode", "failed to configure TLS", "failed to read service",
	"invalid require_auth", "could not match"}

// pgParseReason is what went wrong, from err's text, without the text itself.
func pgParseReason(err error) string {
	s := err.Error()
	for _, r := range pgParseReasons {
		if strings.Contains(s, "`: "+r) {
			return r
		}
	}
	return "invalid"
}

// misplacedAt reports a postgres:// URL with an '@' in its path, fragment or a query
// key: the rest of a password cut short by an unescaped '/', '?' or '#', which would
// otherwise be taken for a database name or parameter and quoted in errors.
func misplacedAt(s string) bool {
	rest, ok := strings.CutPrefix(s, "postgresql://")
	if !ok {
		if rest, ok = strings.CutPrefix(s, "postgres://"); !ok {
			return false
		}
	}
	i := strings.IndexAny(rest, "/?#")
	if i < 0 {
		return false
	}
	rest = rest[i:]
	rest, frag, _ := strings.Cut(rest, "#")
	path, query, _ := strings.Cut(rest, "?")
	if strings.Contains(path, "@") || strings.Contains(frag, "@") {
		return true
	}
	for _, kv := range strings.Split(query, "&") {
		if k, _, _ := strings.Cut(kv, "="); strings.Contains(k, "@") {
			return true
		}
	}
	return false
}

func (t *PostgresExecutor) backend() backendOptions {
	return backendOptions{kind: backendPostgres, sql: t.proto}
}

func (t *PostgresExecutor) start(c *client) (ioExec, error) {
	x := &pgExec{c: c, t: t, stop: make(chan struct{}), cmdTurn: make(chan struct{}, 1)}
	x.lis.q = newReqQueue[*ioRequest]()
	x.cmd.which, x.lis.which = connCommands, connNotify
	x.wg.Add(1)
	go x.runListener()
	return x, nil
}

type pgExec struct {
	c    *client
	t    *PostgresExecutor
	stop chan struct{}
	wg   sync.WaitGroup
	// cmdTurn: one request at a time on the commands connection, on whichever goroutine runs
	// its job (an application call's own, when it can wait for the answer); a channel, so
	// that waiting for the connection counts against the request's timeout.
	cmdTurn  chan struct{}
	cmd, lis pgConn
}

// pgConn is one connection and its state: the listener's is its goroutine's (with a queue),
// the commands connection is the holder's of cmdTurn.
type pgConn struct {
	which  uint32
	q      *reqQueue[*ioRequest]
	conn   *pgx.Conn
	opened bool // a connection was opened before (a new one is a reset)

	mu   sync.Mutex
	wake context.CancelFunc // interrupts the listener's wait for a notification
}

// run hands back a commands request as a job: an application call that waits for its
// answer runs it on its own goroutine (runInline), with no hop to a goroutine of the
// executor's; the driver starts the others. LISTEN / UNLISTEN go to the listener, which it
// wakes from its wait for a notification.
func (x *pgExec) run(q *ioRequest) (*job, error) {
	if q.kind != ioSQL {
		return nil, errUnsupportedIO
	}
	if q.connection != connNotify {
		// deadlined: pgx ends the query at its ctx's deadline by itself.
		return &job{id: q.id, timeout: x.c.reqTimeout, deadlined: true, run: func(ctx context.Context) { x.command(ctx, q) }}, nil
	}
	x.lis.q.push(q)
	x.lis.mu.Lock()
	if x.lis.wake != nil {
		x.lis.wake()
	}
	x.lis.mu.Unlock()
	return nil, nil
}

func (x *pgExec) close() {
	close(x.stop)
	x.lis.mu.Lock()
	if x.lis.wake != nil {
		x.lis.wake()
	}
	x.lis.mu.Unlock()
	x.wg.Wait()
	// A job still running ends with the client's IO context, cancelled by now.
	x.cmdTurn <- struct{}{}
	x.drop(&x.cmd)
	<-x.cmdTurn
}

// command runs one request on the commands connection once no other runs there, all
// within ctx (the request timeout).
func (x *pgExec) command(ctx context.Context, q *ioRequest) {
	if !takeTurn(ctx, x.cmdTurn, x.stop) {
		missedTurn(x.c, q, x.stop)
		return
	}
	defer func() { <-x.cmdTurn }()
	if x.stopped() {
		return // unanswered, as a request in flight at close is
	}
	x.exec(ctx, &x.cmd, q)
}

func (x *pgExec) stopped() bool {
	select {
	case <-x.stop:
		return true
	default:
		return false
	}
}

// connect opens p's connection if it has none; a reopened one is reported.
func (x *pgExec) connect(ctx context.Context, p *pgConn) error {
	if p.conn != nil && !p.conn.IsClosed() {
		return nil
	}
	x.drop(p)
	conn, err := pgx.ConnectConfig(ctx, x.t.cfg.Copy())
	if err != nil {
		return err
	}
	p.conn = conn
	if p.opened {
		x.c.input(func(now uint64) error { return x.c.core.ioConnection(now, p.which, connReopened, "") })
	}
	p.opened = true
	return nil
}

func (x *pgExec) drop(p *pgConn) {
	if p.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_ = p.conn.Close(ctx)
		cancel()
		p.conn = nil
	}
}

// runListener runs LISTEN / UNLISTEN requests in order and, between them, waits for
// notifications. A broken listener is reopened at once (with a pause when the server
// is down), and reported, so the core LISTENs again.
func (x *pgExec) runListener() {
	defer x.wg.Done()
	defer x.drop(&x.lis)
	pause := 50 * time.Millisecond
	for !x.stopped() {
		for !x.stopped() {
			q, ok := x.lis.q.pop()
			if !ok {
				break
			}
			ctx, cancel := context.WithTimeout(x.c.ioCtx, x.c.reqTimeout)
			x.exec(ctx, &x.lis, q)
			cancel()
		}
		if x.lis.conn == nil || x.lis.conn.IsClosed() {
			if !x.lis.opened {
				// Nothing to listen on before the core's first LISTEN.
				select {
				case <-x.lis.q.kick:
				case <-x.stop:
				}
				continue
			}
			ctx, cancel := context.WithTimeout(x.c.ioCtx, x.c.reqTimeout)
			err := x.connect(ctx, &x.lis)
			cancel()
			if err != nil {
				select {
				case <-x.lis.q.kick:
				case <-x.stop:
				case <-time.After(pause):
				}
				pause = min(2*pause, time.Second)
				continue
			}
			pause = 50 * time.Millisecond
		}
		ctx, cancel := context.WithCancel(x.c.ioCtx)
		x.lis.mu.Lock()
		x.lis.wake = cancel
		x.lis.mu.Unlock()
		// A request queued before wake was set must not wait for a notification.
		select {
		case <-x.lis.q.kick:
			cancel()
		default:
		}
		n, err := x.lis.conn.WaitForNotification(ctx)
		x.lis.mu.Lock()
		x.lis.wake = nil
		x.lis.mu.Unlock()
		woken := ctx.Err() != nil
		cancel()
		if n != nil {
			x.c.input(func(now uint64) error { return x.c.core.ioMessage(now, n.Channel, n.Payload) })
		}
		if err != nil && !woken {
			x.c.log.Debug("leasehold: postgres listener connection lost", "err", err)
			x.drop(&x.lis)
		}
	}
}

// exec runs q on p within ctx (the request timeout) and answers the core.
func (x *pgExec) exec(ctx context.Context, p *pgConn, q *ioRequest) {
	if err := x.connect(ctx, p); err != nil {
		x.c.input(func(now uint64) error { return x.c.core.ioFailed(now, q.id, failTransport, failMessage(err)) })
		return
	}
	b, err := x.run1(ctx, p.conn, q)
	if err != nil {
		kind := uint32(failTransport)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && !p.conn.IsClosed() {
			kind = failDatabase
			if p.conn.PgConn().TxStatus() != 'I' {
				rctx, rcancel := context.WithTimeout(x.c.ioCtx, x.c.reqTimeout)
				if _, rerr := p.conn.Exec(rctx, "ROLLBACK"); rerr != nil {
					x.drop(p)
				}
				rcancel()
			}
		} else {
			// The outcome is unknown and the connection's state too: start afresh.
			x.drop(p)
		}
		msg := failMessage(err)
		if pe != nil {
			msg = pe.Message
		}
		x.c.input(func(now uint64) error { return x.c.core.ioFailed(now, q.id, kind, msg) })
		return
	}
	x.c.input(func(now uint64) error {
		err := x.c.core.ioReply(now, q.id, b.vals, b.data)
		if err != nil && isStatus(err, statusInvalidReply) {
			return x.c.core.ioFailed(now, q.id, failDatabase, err.Error())
		}
		return err
	})
}

// Type OIDs whose values cross as they are; every other column (void…) is NULL.
const (
	oidBool   = 16
	oidBytea  = 17
	oidName   = 19
	oidInt8   = 20
	oidInt2   = 21
	oidInt4   = 23
	oidText   = 25
	oidFloat4 = 700
	oidFloat8 = 701
	oidVarch  = 1043
)

func (x *pgExec) run1(ctx context.Context, conn *pgx.Conn, q *ioRequest) (*rowsBuilder, error) {
	f := x.t.facts.now()
	b := &rowsBuilder{}
	top := b.array()
	b.setLen(top, len(q.statements))
	for _, s := range q.statements {
		args := make([]any, len(s.params))
		for i, p := range s.params {
			args[i] = f.bind(p)
		}
		rows, err := conn.Query(ctx, s.sql, args...)
		if err != nil {
			return nil, err
		}
		at, n := b.array(), 0
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				rows.Close()
				return nil, err
			}
			fds := rows.FieldDescriptions()
			row := b.array()
			b.setLen(row, len(vals))
			for i, v := range vals {
				switch fds[i].DataTypeOID {
				case oidBool, oidBytea, oidName, oidInt8, oidInt2, oidInt4, oidText, oidVarch:
					b.column(v)
				case oidFloat4:
					if f, ok := v.(float32); ok {
						v = float64(f)
					}
					b.column(v)
				case oidFloat8:
					b.column(v)
				default:
					b.column(nil)
				}
			}
			n++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		b.setLen(at, n)
	}
	return b, nil
}

// Close does nothing: each LockClient closes its own connections in LockClient.Close.
// It makes every executor an io.Closer.
func (t *PostgresExecutor) Close() error { return nil }
