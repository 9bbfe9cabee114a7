package leasehold

// The SQLite executor: it runs the core's SQL requests (docs/sql-protocol.md) on one
// connection to the file, verbatim, and hands the rows back unread.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/mattn/go-sqlite3"
	"golang.org/x/sys/unix"
)

// SQLiteExecutor is the SQLite executor: a LockClient made
// on it speaks the core's SQL protocol (the schema and its migration, every
// statement, the meaning of every row) on one SQLite file shared by the
// processes of one host, and only runs what the core asks. Python's
// SQLiteLockService, and the C and C++ hosts, write the same tables (schema
// version 1), so processes of every kind contend correctly on one file.
//
// It runs on database/sql with github.com/mattn/go-sqlite3: the binding needs
// cgo anyway, so the C library itself (the SQLite every other host uses, with
// the same locking and WAL code) costs nothing extra, and the driver was
// already the binding's test dependency. Each LockClient opens its own connection;
// a file replaced at the path (a different device or inode) is reopened and
// reported to the core, which checks the schema again.
//
// The file holds lock names, pids, host names and tokens: a missing file is
// created 0600, and the default file's missing directory 0700 (whatever the
// umask; SQLite gives
// its -wal and -shm files the file's mode), a symbolic link at the path is
// refused rather than followed, and an existing file or directory that
// another user owns or may write is reported on the LockClient's Logger (warn).
type SQLiteExecutor struct {
	path  string
	mkdir bool // the default file: its missing directory is created
	proto sqlProtocol
	facts hostFacts
}

// SQLiteOptions tunes the SQLite protocol; zero fields take its defaults.
type SQLiteOptions struct {
	// BusyTimeout: how long an operation waits for another process's
	// transaction before it fails (a transport error for the core, never a
	// hang). Default 5s.
	BusyTimeout time.Duration
}

// DefaultSQLitePath is the embedded default lock file the Python package and
// the leasehold CLI use, so every program of a user on one host shares it:
// $XDG_CACHE_HOME/leasehold/locks.sqlite3, or ~/.cache/leasehold/locks.sqlite3
// when XDG_CACHE_HOME is unset or relative. Its directory may not exist yet:
// a SQLiteExecutor on this path creates it (0700) with the file (0600).
func DefaultSQLitePath() (string, error) {
	cache := os.Getenv("XDG_CACHE_HOME")
	if !filepath.IsAbs(cache) {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "leasehold", "locks.sqlite3"), nil
}

// NewSQLiteExecutor returns the executor for the lock
// database at path (created 0600 when missing, on first use; its directory
// must exist, unless path is DefaultSQLitePath, whose directory is created
// 0700). A path that is a symbolic link, or not a regular file, is refused.
// o may be nil.
func NewSQLiteExecutor(path string, o *SQLiteOptions) (*SQLiteExecutor, error) {
	if path == "" || path == ":memory:" {
		return nil, invalidArg("SQLite needs a file path, not %q", path)
	}
	// A later chdir must not switch files.
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, invalidArg("SQLite path %q: %v", path, err)
	}
	if fi, err := os.Lstat(abs); err == nil {
		if err := checkLockFileType(abs, fi); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
		}
	}
	t := &SQLiteExecutor{path: abs, facts: readHostFacts()}
	if def, err := DefaultSQLitePath(); err == nil && def == abs {
		t.mkdir = true
	}
	if o != nil {
		if o.BusyTimeout < 0 {
			return nil, invalidArg("negative BusyTimeout")
		}
		t.proto.busyTimeoutMs = uint64(o.BusyTimeout / time.Millisecond)
	}
	return t, nil
}

// Path returns the lock database's absolute path.
func (t *SQLiteExecutor) Path() string { return t.path }

// Notifications reports false: SQLite has no release notifications (waiters
// retry at the holder's expiry or by backoff).
func (t *SQLiteExecutor) Notifications() bool { return false }

func (t *SQLiteExecutor) backend() backendOptions {
	return backendOptions{kind: backendSQLite, sql: t.proto}
}

func (t *SQLiteExecutor) start(c *client) (ioExec, error) {
	return &sqliteExec{c: c, t: t, stop: make(chan struct{}), turn: make(chan struct{}, 1)}, nil
}

type sqliteExec struct {
	c    *client
	t    *SQLiteExecutor
	stop chan struct{}
	// turn: one request at a time on the connection, on whichever goroutine runs its job
	// (an application call's own, when it waits for the answer); a channel, so that waiting
	// for the connection counts against the request's timeout.
	turn chan struct{}

	// The holder's of turn.
	db       *sql.DB
	conn     *sql.Conn
	dev, ino uint64
	opened   bool // a connection was opened before (a new one is a reset)
}

// run hands a request back as a job: an application call that waits for its answer runs
// it on its own goroutine (runInline), with no hop; the driver starts the others.
func (x *sqliteExec) run(q *ioRequest) (*job, error) {
	if q.kind != ioSQL {
		return nil, errUnsupportedIO
	}
	// deadlined: the driver ends a statement at its ctx's deadline (sqlite3_interrupt).
	return &job{id: q.id, timeout: x.c.reqTimeout, deadlined: true, run: func(ctx context.Context) {
		if !takeTurn(ctx, x.turn, x.stop) {
			missedTurn(x.c, q, x.stop)
			return
		}
		defer func() { <-x.turn }()
		if x.stopped() {
			return // unanswered, as a request in flight at close is
		}
		x.exec(ctx, q)
	}}, nil
}

func (x *sqliteExec) stopped() bool {
	select {
	case <-x.stop:
		return true
	default:
		return false
	}
}

// close ends the connection once a job still running (its ctx, the client's IO context, is
// cancelled by now) let it go.
func (x *sqliteExec) close() {
	close(x.stop)
	x.turn <- struct{}{}
	x.shut()
	<-x.turn
}

func (x *sqliteExec) shut() {
	if x.conn != nil {
		_ = x.conn.Close()
	}
	if x.db != nil {
		_ = x.db.Close()
	}
	x.conn, x.db = nil, nil
}

// fileID is the identity of what is at path itself: a symbolic link put in the
// file's place is a replacement, never followed.
func fileID(path string) (dev, ino uint64, ok bool) {
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return 0, 0, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	return uint64(st.Dev), st.Ino, true
}

// errLockFileLink: SQLite would follow a link and create or rewrite its target.
var errLockFileLink = errors.New("is a symbolic link; leasehold does not follow links to its lock file (give the target's path)")

func checkLockFileType(path string, fi os.FileInfo) error {
	if fi.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("SQLite lock file %s %w", path, errLockFileLink)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("SQLite lock file %s is not a regular file (%v)", path, fi.Mode().Type())
	}
	return nil
}

// createMu: closing a descriptor drops every POSIX lock this process holds on
// the file, so no connection of this process may open a file between its
// creation and the close of the descriptor that created it.
var createMu sync.Mutex

// prepareLockFile creates the file (0600, whatever the umask) when missing, with
// its directory (0700) if mkdir, without following a link at path, and returns
// the file's identity and what is unsafe about an existing file or directory.
func prepareLockFile(path string, mkdir bool) (fi os.FileInfo, warnings []string, err error) {
	dir := filepath.Dir(path)
	if mkdir {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, nil, err
		}
	}
	if di, err := os.Stat(dir); err == nil {
		warnings = append(warnings, unsafeOwnerOrMode("directory", dir, di, true)...)
	}
	createMu.Lock()
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	created := err == nil
	if created {
		err = unix.Fchmod(fd, 0o600)
		_ = unix.Close(fd)
	}
	createMu.Unlock()
	if created && err != nil {
		return nil, nil, err
	}
	// An existing file is used as it is (EEXIST, or EROFS / EACCES where the directory
	// or file system cannot be written).
	fi, lerr := os.Lstat(path)
	if lerr != nil {
		if err == nil {
			err = lerr
		}
		return nil, nil, err
	}
	if err := checkLockFileType(path, fi); err != nil {
		return nil, nil, err
	}
	if !created {
		warnings = append(warnings, unsafeOwnerOrMode("file", path, fi, false)...)
	}
	return fi, warnings, nil
}

// unsafeOwnerOrMode says whether another user owns fi or may write it (for the file,
// read it too): they could read or rewrite the locks. A directory owned by root, or
// sticky (like /tmp), does not let others replace the file.
func unsafeOwnerOrMode(what, path string, fi os.FileInfo, dir bool) []string {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	var w []string
	if uid := int(st.Uid); uid != os.Geteuid() && !(dir && uid == 0) {
		w = append(w, fmt.Sprintf("the lock %s %s is owned by another user (uid %d)", what, path, uid))
	}
	mode := fi.Mode()
	switch {
	case dir && mode&0o022 != 0 && mode&os.ModeSticky == 0:
		w = append(w, fmt.Sprintf("the lock %s %s is writable by other users (mode %04o)", what, path, mode.Perm()))
	case !dir && mode&0o022 != 0:
		w = append(w, fmt.Sprintf("the lock %s %s is writable by other users (mode %04o)", what, path, mode.Perm()))
	case !dir && mode&0o004 != 0:
		w = append(w, fmt.Sprintf("the lock %s %s is readable by other users (mode %04o)", what, path, mode.Perm()))
	}
	return w
}

// tightenSidecars gives this user's -wal and -shm files no permission the lock
// file lacks: SQLite sets their mode only when it creates them, so ones left
// by an older, laxer file keep theirs. By path, since a descriptor's close
// would drop SQLite's locks on them.
func tightenSidecars(path string, perm os.FileMode) {
	for _, suffix := range []string{"-wal", "-shm"} {
		p := path + suffix
		fi, err := os.Lstat(p)
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok && int(st.Uid) == os.Geteuid() && fi.Mode().Perm()&^perm != 0 {
			_ = os.Chmod(p, fi.Mode().Perm()&perm)
		}
	}
}

// open (re)opens the connection and records the file's identity.
func (x *sqliteExec) open(ctx context.Context) error {
	x.shut()
	fi, warnings, err := prepareLockFile(x.t.path, x.t.mkdir)
	if err != nil {
		return fmt.Errorf("unable to open database file: %w", err)
	}
	for _, w := range warnings {
		x.c.log.Warn("leasehold: " + w)
	}
	// mode=rw: SQLite never creates the file (it would follow a link put at the path
	// since it was checked); the identity check below sees such a swap.
	dsn := "file:" + (&url.URL{Path: x.t.path}).EscapedPath() + "?mode=rw"
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return err
	}
	db.SetMaxOpenConns(1)
	conn, err := db.Conn(ctx)
	if err == nil {
		// Opening is lazy: touch the file so that it exists, and its identity is known,
		// before the first request runs.
		_, err = conn.ExecContext(ctx, "PRAGMA schema_version")
	}
	if err == nil {
		st, _ := fi.Sys().(*syscall.Stat_t)
		x.dev, x.ino, _ = fileID(x.t.path)
		if st == nil || x.dev != uint64(st.Dev) || x.ino != st.Ino {
			err = fmt.Errorf("the file at %s was replaced while it was opened", x.t.path)
		}
	}
	if err != nil {
		if conn != nil {
			_ = conn.Close()
		}
		_ = db.Close()
		return err
	}
	tightenSidecars(x.t.path, fi.Mode().Perm())
	x.db, x.conn = db, conn
	return nil
}

// exec runs q within ctx (the request timeout) and answers the core.
func (x *sqliteExec) exec(ctx context.Context, q *ioRequest) {
	if x.conn != nil {
		if dev, ino, ok := fileID(x.t.path); !ok || dev != x.dev || ino != x.ino {
			// Follow the path instead of locking alone on the old file: the request did
			// not run; the core checks the schema of the new file first.
			err := x.open(ctx)
			x.c.input(func(now uint64) error {
				msg := "the database file was replaced or removed"
				if err != nil {
					msg += ", and could not be opened again: " + err.Error()
				}
				if ferr := x.c.core.ioFailed(now, q.id, failTransport, msg); ferr != nil || err != nil {
					return ferr
				}
				return x.c.core.ioConnection(now, connCommands, connReopened, "")
			})
			return
		}
	}
	if x.conn == nil {
		if err := x.open(ctx); err != nil {
			x.c.input(func(now uint64) error {
				return x.c.core.ioFailed(now, q.id, failTransport, "cannot open "+x.t.path+": "+err.Error())
			})
			return
		}
		if x.opened {
			x.c.input(func(now uint64) error { return x.c.core.ioConnection(now, connCommands, connReopened, "") })
		}
		x.opened = true
	}
	b, err := x.run1(ctx, q)
	if err != nil {
		kind := uint32(failDatabase)
		if errors.Is(err, driverConnGone) {
			kind = failTransport
			x.shut()
		} else {
			x.rollback()
		}
		x.c.input(func(now uint64) error { return x.c.core.ioFailed(now, q.id, kind, failMessage(err)) })
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

// driverConnGone marks a connection database/sql no longer has.
var driverConnGone = errors.New("leasehold: sqlite connection gone")

// run1 runs the statements of one request in order and collects their rows.
func (x *sqliteExec) run1(ctx context.Context, q *ioRequest) (*rowsBuilder, error) {
	f := x.t.facts.now()
	b := &rowsBuilder{}
	top := b.array()
	b.setLen(top, len(q.statements))
	for _, s := range q.statements {
		args := make([]any, len(s.params))
		for i, p := range s.params {
			args[i] = f.bind(p)
		}
		rows, err := x.conn.QueryContext(ctx, s.sql, args...)
		if err != nil {
			return nil, sqliteErr(err)
		}
		cols, err := rows.Columns()
		if err != nil {
			_ = rows.Close()
			return nil, sqliteErr(err)
		}
		at, n := b.array(), 0
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		for rows.Next() {
			if err := rows.Scan(ptrs...); err != nil {
				_ = rows.Close()
				return nil, sqliteErr(err)
			}
			row := b.array()
			b.setLen(row, len(cols))
			for _, v := range vals {
				b.column(v)
			}
			n++
		}
		if err := rows.Err(); err != nil {
			_ = rows.Close()
			return nil, sqliteErr(err)
		}
		_ = rows.Close()
		b.setLen(at, n)
	}
	return b, nil
}

func sqliteErr(err error) error {
	if errors.Is(err, sql.ErrConnDone) {
		return fmt.Errorf("%w: %w", driverConnGone, err)
	}
	return err
}

// rollback ends a transaction a failed statement left open.
func (x *sqliteExec) rollback() {
	if x.conn == nil {
		return
	}
	open := false
	_ = x.conn.Raw(func(dc any) error {
		if sc, ok := dc.(*sqlite3.SQLiteConn); ok {
			open = !sc.AutoCommit()
		}
		return nil
	})
	if open {
		ctx, cancel := context.WithTimeout(context.Background(), x.c.reqTimeout)
		defer cancel()
		if _, err := x.conn.ExecContext(ctx, "ROLLBACK"); err != nil {
			x.shut() // a connection stuck in a transaction is no use: open a new one
		}
	}
}

// Close does nothing: each LockClient closes its own connection in LockClient.Close.
// It makes every executor an io.Closer.
func (t *SQLiteExecutor) Close() error { return nil }
