package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	leasehold "github.com/leasehold/leasehold/bindings/go"
	_ "github.com/mattn/go-sqlite3"
)

// gateTable is the high-water-mark table every worker uses, whatever its
// language (Python's and C++'s default), so the gates of one run share marks.
const gateTable = "leasehold_fencing"

const createSet = "CREATE TABLE IF NOT EXISTS lh_hist_set (resource TEXT NOT NULL, value BIGINT NOT NULL)"

// store is the fenced resource: a set of values per resource, written by a
// read-modify-write in one transaction, through the fencing gate unless
// the run is unfenced.
type store interface {
	// write reads the resource's set and inserts value in one transaction;
	// read is how many values it saw. An error matching
	// leasehold.ErrStaleToken means the gate refused the token.
	write(ctx context.Context, resource string, token uint64, value int64) (read int64, err error)
	close()
}

func openStore(ctx context.Context, url string, unfenced bool, hold time.Duration) (store, error) {
	switch {
	case strings.HasPrefix(url, "postgresql://") || strings.HasPrefix(url, "postgres://"):
		s := &pgStore{url: url, unfenced: unfenced, hold: hold}
		// A server still starting is retried by the first write.
		_ = s.connect(ctx)
		return s, nil
	case strings.HasPrefix(url, "sqlite://"):
		return openSQLiteStore(ctx, strings.TrimPrefix(url, "sqlite://"), unfenced, hold)
	}
	return nil, errUnsupportedGate
}

var errUnsupportedGate = errors.New("unsupported gate")

// pgStore: the gate is PostgresGate (pgx) on one connection, opened again
// after any error but a refusal (its transaction's state is then unknown).
type pgStore struct {
	url      string
	unfenced bool
	hold     time.Duration // between the read and the insert (--write-hold-ms)
	conn     *pgx.Conn
	gate     *leasehold.PostgresGate
}

// benignCreate: another worker created the table at the same moment.
func benignCreate(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "23505" || pe.Code == "42P07")
}

func (s *pgStore) connect(ctx context.Context) error {
	if s.conn != nil && !s.conn.IsClosed() {
		return nil
	}
	s.drop()
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, createSet); err != nil && !benignCreate(err) {
		_ = conn.Close(context.Background())
		return err
	}
	gate, err := leasehold.NewPostgresGate(ctx, conn, &leasehold.GateOptions{Table: gateTable})
	if err != nil && benignCreate(err) {
		gate, err = leasehold.NewPostgresGate(ctx, conn, &leasehold.GateOptions{Table: gateTable})
	}
	if err != nil {
		_ = conn.Close(context.Background())
		return err
	}
	s.conn, s.gate = conn, gate
	return nil
}

func (s *pgStore) drop() {
	if s.conn != nil {
		_ = s.conn.Close(context.Background())
	}
	s.conn, s.gate = nil, nil
}

func (s *pgStore) write(ctx context.Context, resource string, token uint64, value int64) (read int64, err error) {
	if err := s.connect(ctx); err != nil {
		return 0, err
	}
	rmw := func(ctx context.Context, tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM lh_hist_set WHERE resource = $1", resource).Scan(&read); err != nil {
			return err
		}
		time.Sleep(s.hold)
		_, err := tx.Exec(ctx, "INSERT INTO lh_hist_set (resource, value) VALUES ($1, $2)", resource, value)
		return err
	}
	if s.unfenced {
		err = pgx.BeginFunc(ctx, s.conn, func(tx pgx.Tx) error { return rmw(ctx, tx) })
	} else {
		err = s.gate.Do(ctx, resource, token, rmw)
	}
	if err != nil && !errors.Is(err, leasehold.ErrStaleToken) {
		s.drop()
	}
	return read, err
}

func (s *pgStore) close() { s.drop() }

// sqliteStore: the gate is Gate on database/sql (mattn/go-sqlite3), with
// immediate transactions so the write lock is taken before anything is read.
type sqliteStore struct {
	db       *sql.DB
	gate     *leasehold.Gate
	unfenced bool
	hold     time.Duration
}

func openSQLiteStore(ctx context.Context, path string, unfenced bool, hold time.Duration) (store, error) {
	if path == "" {
		return nil, fmt.Errorf("sqlite gate needs a path: sqlite:///path")
	}
	db, err := sql.Open("sqlite3", "file:"+path+"?_busy_timeout=10000&_txlock=immediate")
	if err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, createSet); err != nil {
		_ = db.Close()
		return nil, err
	}
	gate, err := leasehold.NewGate(ctx, db, &leasehold.GateOptions{Table: gateTable, Dialect: leasehold.DialectSQLite})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return &sqliteStore{db: db, gate: gate, unfenced: unfenced, hold: hold}, nil
}

func (s *sqliteStore) write(ctx context.Context, resource string, token uint64, value int64) (read int64, err error) {
	rmw := func(ctx context.Context, tx *sql.Tx) error {
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM lh_hist_set WHERE resource = ?", resource).Scan(&read); err != nil {
			return err
		}
		time.Sleep(s.hold)
		_, err := tx.ExecContext(ctx, "INSERT INTO lh_hist_set (resource, value) VALUES (?, ?)", resource, value)
		return err
	}
	if !s.unfenced {
		return read, s.gate.Do(ctx, resource, token, rmw)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	if err := rmw(ctx, tx); err != nil {
		_ = tx.Rollback()
		return 0, err
	}
	return read, tx.Commit()
}

func (s *sqliteStore) close() { _ = s.db.Close() }
