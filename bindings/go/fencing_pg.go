package leasehold

import (
	"context"
	"errors"
	"math"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PgxBeginner is what a PostgresFencingGate needs of a connection: *pgx.Conn and
// *pgxpool.Pool both have it.
type PgxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// PostgresFencingGate is the fencing gate on PostgreSQL through pgx v5: Do runs a
// protected operation in one transaction that locks the resource's
// high-water-mark row (SELECT … FOR UPDATE), refuses a token below the mark
// (an equal one passes, so a retry with the same token works), raises the
// mark, and runs the operation's reads and writes in the same transaction.
// Concurrent holders of the row wait for each other, so a stale holder can
// neither interleave a read-modify-write with a newer holder's nor write
// after it. The table is the same as FencingGate's and Python's FencingGate's
// (resource text primary key, hwm bigint).
type PostgresFencingGate struct {
	db     PgxBeginner
	table  string
	insert string
	lock   string
	raise  string
	read   string
}

// NewPostgresFencingGate creates the high-water-mark table if needed and returns a
// gate on db. opts may be nil (only Table is read).
func NewPostgresFencingGate(ctx context.Context, db PgxBeginner, opts *FencingGateOptions) (*PostgresFencingGate, error) {
	if db == nil {
		return nil, invalidArg("nil connection")
	}
	t := "leasehold_fence"
	if opts != nil && opts.Table != "" {
		t = opts.Table
	}
	if !identRE.MatchString(t) {
		return nil, invalidArg("table name %q is not a plain identifier", t)
	}
	if _, err := db.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+t+
		" (resource TEXT PRIMARY KEY, hwm BIGINT NOT NULL)"); err != nil {
		// Two gates creating the table at once: one wins, the other sees it exist.
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "23505" {
			return nil, err
		}
	}
	return &PostgresFencingGate{
		db:    db,
		table: t,
		// A row to lock even for a resource never written (0: below every token).
		insert: "INSERT INTO " + t + " (resource, hwm) VALUES ($1, 0) ON CONFLICT (resource) DO NOTHING",
		lock:   "SELECT hwm FROM " + t + " WHERE resource = $1 FOR UPDATE",
		raise:  "UPDATE " + t + " SET hwm = $2 WHERE resource = $1",
		read:   "SELECT hwm FROM " + t + " WHERE resource = $1",
	}, nil
}

// Do runs fn inside one transaction guarded by token: if the resource's
// high-water mark is above token, the transaction is rolled back and a
// *StaleTokenError (ErrStaleToken) is returned without calling fn;
// otherwise the mark is raised to token and fn runs. An error from fn rolls
// back (the mark included) and is returned; else the transaction commits.
func (g *PostgresFencingGate) Do(ctx context.Context, resource string, token uint64, fn func(ctx context.Context, tx pgx.Tx) error) (err error) {
	if token == 0 || token > math.MaxInt64 {
		return invalidArg("fencing token %d out of range", token)
	}
	if fn == nil {
		return invalidArg("nil function")
	}
	tx, err := g.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if _, err = tx.Exec(ctx, g.insert, resource); err != nil {
		return err
	}
	var hwm int64
	if err = tx.QueryRow(ctx, g.lock, resource).Scan(&hwm); err != nil {
		return err
	}
	if hwm > int64(token) {
		return &StaleTokenError{Resource: resource, Token: token, HWM: uint64(hwm)}
	}
	if hwm < int64(token) {
		if _, err = tx.Exec(ctx, g.raise, resource, int64(token)); err != nil {
			return err
		}
	}
	if err = fn(ctx, tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// HighWaterMark returns the highest token accepted for resource (0 if none).
func (g *PostgresFencingGate) HighWaterMark(ctx context.Context, resource string) (uint64, error) {
	tx, err := g.db.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var hwm int64
	err = tx.QueryRow(ctx, g.read, resource).Scan(&hwm)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return uint64(max(hwm, 0)), err
}
