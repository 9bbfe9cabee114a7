package leasehold

// Helpers shared by the multi-process tests: the worker entry point (the
// test binary re-executes itself with LEASEHOLD_TEST_WORKER set) and the
// SQLite schema and critical section that every worker, Go or Python, runs.

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	_ "github.com/mattn/go-sqlite3"
	"github.com/redis/go-redis/v9"
)

// openDB opens the shared SQLite file used as the fenced resource.
func openDB(path string) (*sql.DB, error) {
	return sql.Open("sqlite3", "file:"+path+"?_busy_timeout=30000&_journal_mode=WAL&_txlock=immediate")
}

// setupDB creates the fence table, the counters and the log.
func setupDB(ctx context.Context, path string, names []string) (*sql.DB, *Gate, error) {
	db, err := openDB(path)
	if err != nil {
		return nil, nil, err
	}
	g, err := NewGate(ctx, db, nil)
	if err != nil {
		return nil, nil, err
	}
	for _, q := range []string{
		"CREATE TABLE IF NOT EXISTS counter (name TEXT PRIMARY KEY, v INTEGER NOT NULL)",
		"CREATE TABLE IF NOT EXISTS log (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, token INTEGER NOT NULL, worker TEXT NOT NULL)",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return nil, nil, err
		}
	}
	for _, n := range names {
		if _, err := db.ExecContext(ctx, "INSERT OR IGNORE INTO counter (name, v) VALUES (?, 0)", n); err != nil {
			return nil, nil, err
		}
	}
	return db, g, nil
}

// criticalSection is a read-modify-write split over two fenced
// transactions: a second holder overlapping this one either loses an
// update (caught by the counter) or is refused by the gate (caught by the
// stale count).
func criticalSection(ctx context.Context, g *Gate, name string, token uint64, worker string) error {
	var v int64
	err := g.Do(ctx, name, token, func(ctx context.Context, tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, "SELECT v FROM counter WHERE name = ?", name).Scan(&v)
	})
	if err != nil {
		return err
	}
	time.Sleep(time.Millisecond)
	return g.Do(ctx, name, token, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "UPDATE counter SET v = ? WHERE name = ?", v+1, name); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO log (name, token, worker) VALUES (?, ?, ?)", name, int64(token), worker)
		return err
	})
}

// checkDB verifies the counters, the log (tokens strictly increasing per
// name, in commit order) and returns how many entries each worker prefix
// wrote.
func checkDB(ctx context.Context, db *sql.DB, names []string, total int) (map[string]int, error) {
	sum := 0
	for _, n := range names {
		var v int
		if err := db.QueryRowContext(ctx, "SELECT v FROM counter WHERE name = ?", n).Scan(&v); err != nil {
			return nil, err
		}
		sum += v
	}
	if sum != total {
		return nil, fmt.Errorf("counters add up to %d, want %d: updates were lost", sum, total)
	}
	rows, err := db.QueryContext(ctx, "SELECT name, token, worker FROM log ORDER BY id")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	last := map[string]int64{}
	per := map[string]int{}
	n := 0
	for rows.Next() {
		var name, worker string
		var tok int64
		if err := rows.Scan(&name, &tok, &worker); err != nil {
			return nil, err
		}
		if tok <= last[name] {
			return nil, fmt.Errorf("log entry %d: token %d on %s by %s not above %d", n, tok, name, worker, last[name])
		}
		last[name] = tok
		per[strings.SplitN(worker, "-", 2)[0]]++
		n++
	}
	if n != total {
		return nil, fmt.Errorf("log has %d entries, want %d", n, total)
	}
	return per, rows.Err()
}

func runWorker(mode string) int {
	if err := worker(mode); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	return 0
}

// workerTransport is the worker's lock service: LH_BACKEND sqlite (LH_LOCKDB), postgres
// (LH_PG), etcd (LH_ETCD, comma-separated URLs), or Redis (LH_REDIS) by default.
func workerTransport() (Transport, func(), error) {
	switch os.Getenv("LH_BACKEND") {
	case "sqlite":
		t, err := NewSQLiteTransport(os.Getenv("LH_LOCKDB"), nil)
		return t, func() {}, err
	case "postgres":
		t, err := NewPostgresTransport(os.Getenv("LH_PG"))
		return t, func() {}, err
	case "etcd":
		t, err := NewEtcdTransport(strings.Split(os.Getenv("LH_ETCD"), ","), nil)
		if err != nil {
			return nil, nil, err
		}
		return t, func() { _ = t.Close() }, nil
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("LH_REDIS")})
	t, err := NewRedisTransport(rdb)
	return t, func() { _ = rdb.Close() }, err
}

// fencedStore is the protected resource of the process tests: a SQLite file behind a
// Gate, or (LH_GATE=pg) PostgreSQL tables behind a PostgresGate.
type fencedStore interface {
	// critical is a fenced read-modify-write of name's counter, logged with token.
	critical(ctx context.Context, name string, token uint64, worker string) error
	// write is one fenced log entry.
	write(ctx context.Context, name string, token uint64, worker string) error
	close()
}

type sqliteStore struct {
	db *sql.DB
	g  *Gate
}

func (s *sqliteStore) critical(ctx context.Context, name string, token uint64, worker string) error {
	return criticalSection(ctx, s.g, name, token, worker)
}

func (s *sqliteStore) write(ctx context.Context, name string, token uint64, worker string) error {
	return s.g.Do(ctx, name, token, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO log (name, token, worker) VALUES (?, ?, ?)", name, int64(token), worker)
		return err
	})
}

func (s *sqliteStore) close() { _ = s.db.Close() }

func openStore(ctx context.Context) (fencedStore, error) {
	if os.Getenv("LH_GATE") == "pg" {
		return openPgStore(ctx, os.Getenv("LH_PG"))
	}
	db, err := openDB(os.Getenv("LH_DB"))
	if err != nil {
		return nil, err
	}
	g, err := NewGate(ctx, db, nil)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return &sqliteStore{db: db, g: g}, nil
}

func worker(mode string) error {
	ctx := context.Background()
	tr, done, err := workerTransport()
	if err != nil {
		return err
	}
	defer done()
	c, err := NewClient(tr, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	store, err := openStore(ctx)
	if err != nil {
		return err
	}
	defer store.close()
	id := os.Getenv("LH_ID")
	names := strings.Split(os.Getenv("LH_NAMES"), ",")
	switch mode {
	case "contend":
		iters, _ := strconv.Atoi(os.Getenv("LH_ITERS"))
		for i := 0; i < iters; i++ {
			name := names[rand.IntN(len(names))]
			l, err := c.Acquire(ctx, name, AcquireOptions{TTL: 10 * time.Second, Wait: 2 * time.Minute})
			if err != nil {
				return fmt.Errorf("iteration %d: %w", i, err)
			}
			if err := store.critical(l.Context(), name, l.FencingToken(), id); err != nil {
				return fmt.Errorf("iteration %d on %s (token %d): %w", i, name, l.FencingToken(), err)
			}
			if err := l.Release(ctx); err != nil {
				// A release retried on another member after the first one died with it
				// may find the lease already revoked: with LH_TOLERATE_NOT_OWNER that
				// is counted, not fatal (the gate, not the release, keeps writes safe).
				if !errors.Is(err, ErrNotOwner) || os.Getenv("LH_TOLERATE_NOT_OWNER") == "" {
					return err
				}
				fmt.Println("NOT-OWNER", name)
			}
		}
		fmt.Println("DONE", iters)
		return nil
	case "paused":
		l, err := c.Acquire(ctx, names[0], AcquireOptions{TTL: 400 * time.Millisecond, Wait: time.Minute})
		if err != nil {
			return err
		}
		fmt.Println("ACQUIRED", l.FencingToken())
		// The parent stops this process (SIGSTOP) here, lets the lease
		// expire, and resumes it; then the stale write is attempted
		// without looking at the lease, as a paused program would.
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			return err
		}
		err = store.write(ctx, names[0], l.FencingToken(), id)
		switch {
		case errors.Is(err, ErrStaleToken):
			fmt.Println("STALE")
		case err == nil:
			fmt.Println("WROTE")
		default:
			return err
		}
		// The loss is signalled too, once the driver ran after the pause.
		select {
		case <-l.Context().Done():
			fmt.Println("LOST", errors.Is(l.Err(), ErrLost))
		case <-time.After(20 * time.Second):
			fmt.Println("NOT-LOST")
		}
		return nil
	case "pause-release":
		// Each round: acquire, wait to be stopped and resumed past the
		// validity, release at once and report what Release said.
		in := bufio.NewReader(os.Stdin)
		iters, _ := strconv.Atoi(os.Getenv("LH_ITERS"))
		for i := 0; i < iters; i++ {
			l, err := c.Acquire(ctx, names[0], AcquireOptions{TTL: 300 * time.Millisecond, Wait: time.Minute})
			if err != nil {
				return err
			}
			fmt.Println("ACQUIRED", l.FencingToken())
			if _, err := in.ReadString('\n'); err != nil {
				return err
			}
			err = l.Release(ctx)
			var le *LostError
			lostSignalled := false
			select {
			case <-l.Lost():
				lostSignalled = true
			default:
			}
			fmt.Println("RELEASE", errors.As(err, &le), errors.Is(context.Cause(l.Context()), ErrLost), lostSignalled, err)
		}
		return nil
	case "wait", "hold":
		// wait: queue for the lock, report the grant, release on a line of
		// stdin. hold: take it with a 1s TTL and keep it until killed.
		ttl, wait := 10*time.Second, 2*time.Minute
		if mode == "hold" {
			ttl = time.Second
		}
		if _, ok := tr.(*RedisTransport); ok {
			for k, _ := c.RedisCounters(); !k.Subscribed; k, _ = c.RedisCounters() {
				time.Sleep(time.Millisecond)
			}
		}
		fmt.Println("READY") // a release from now on can wake this process
		l, err := c.Acquire(ctx, names[0], AcquireOptions{TTL: ttl, Wait: wait})
		if err != nil {
			return err
		}
		fmt.Println("ACQUIRED", l.FencingToken())
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			return err
		}
		return l.Release(ctx)
	case "handoff":
		return handoffWorker(ctx, c, names[0])
	}
	return fmt.Errorf("unknown worker mode %q", mode)
}
