package leasehold

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"regexp"
	"strconv"
)

// Dialect selects the SQL placeholder style of a FencingGate.
type Dialect int

const (
	// DialectSQLite uses ? placeholders (SQLite, MySQL-style drivers).
	DialectSQLite Dialect = iota
	// DialectPostgres uses $1, $2, ... placeholders.
	DialectPostgres
)

// FencingGateOptions configures a FencingGate.
type FencingGateOptions struct {
	// Table holding one high-water mark per resource. Default
	// "leasehold_fence".
	Table string
	// Dialect of the database. Default DialectSQLite.
	Dialect Dialect
}

// FencingGate is a fencing gate for a database/sql store: Do runs a protected
// operation in one transaction that first raises the resource's high-water
// mark to the caller's fencing token and rejects the operation when a higher
// token was seen before. Only token < high-water mark is rejected, so a
// retry with the same token passes. The protected operation's reads happen
// inside the same transaction, after the mark was raised, so a stale holder
// cannot interleave a read-modify-write with a newer holder's.
//
// For SQLite open the database with a busy timeout (and preferably
// _txlock=immediate with mattn/go-sqlite3).
type FencingGate struct {
	db     *sql.DB
	table  string
	upsert string
	read   string
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// StaleTokenError is returned by FencingGate.Do for a token below the high-water
// mark; it matches ErrStaleToken.
type StaleTokenError struct {
	Resource string
	Token    uint64
	HWM      uint64
}

func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("leasehold: stale fencing token %d for %q (high-water mark %d)", e.Token, e.Resource, e.HWM)
}

func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// NewFencingGate creates the high-water-mark table if needed and returns a FencingGate.
func NewFencingGate(ctx context.Context, db *sql.DB, opts *FencingGateOptions) (*FencingGate, error) {
	if db == nil {
		return nil, invalidArg("nil database")
	}
	o := FencingGateOptions{Table: "leasehold_fence"}
	if opts != nil {
		if opts.Table != "" {
			o.Table = opts.Table
		}
		o.Dialect = opts.Dialect
	}
	if !identRE.MatchString(o.Table) {
		return nil, invalidArg("table name %q is not a plain identifier", o.Table)
	}
	ph := func(i int) string { return "?" }
	switch o.Dialect {
	case DialectSQLite:
	case DialectPostgres:
		ph = func(i int) string { return "$" + strconv.Itoa(i) }
	default:
		return nil, invalidArg("unknown dialect %d", o.Dialect)
	}
	t := o.Table
	if _, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+t+
		" (resource TEXT PRIMARY KEY, hwm BIGINT NOT NULL)"); err != nil {
		return nil, err
	}
	return &FencingGate{
		db:    db,
		table: t,
		// Writing first takes the write lock (SQLite) or the row lock
		// (PostgreSQL) before anything is read.
		upsert: "INSERT INTO " + t + " (resource, hwm) VALUES (" + ph(1) + ", " + ph(2) + ") " +
			"ON CONFLICT (resource) DO UPDATE SET hwm = CASE WHEN excluded.hwm > " + t + ".hwm " +
			"THEN excluded.hwm ELSE " + t + ".hwm END",
		read: "SELECT hwm FROM " + t + " WHERE resource = " + ph(1),
	}, nil
}

// Do runs fn inside one transaction guarded by token: the high-water mark
// of resource is raised to token first; if it already was above token the
// transaction is rolled back and a *StaleTokenError (ErrStaleToken) is
// returned without calling fn. An error from fn rolls back (the mark
// included) and is returned.
func (g *FencingGate) Do(ctx context.Context, resource string, token uint64, fn func(ctx context.Context, tx *sql.Tx) error) (err error) {
	if token == 0 || token > math.MaxInt64 {
		return invalidArg("fencing token %d out of range", token)
	}
	if fn == nil {
		return invalidArg("nil function")
	}
	tx, err := g.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if _, err = tx.ExecContext(ctx, g.upsert, resource, int64(token)); err != nil {
		return err
	}
	var hwm int64
	if err = tx.QueryRowContext(ctx, g.read, resource).Scan(&hwm); err != nil {
		return err
	}
	if uint64(hwm) > token {
		return &StaleTokenError{Resource: resource, Token: token, HWM: uint64(hwm)}
	}
	if err = fn(ctx, tx); err != nil {
		return err
	}
	return tx.Commit()
}

// HighWaterMark returns the highest token accepted for resource (0 if none).
func (g *FencingGate) HighWaterMark(ctx context.Context, resource string) (uint64, error) {
	var hwm int64
	err := g.db.QueryRowContext(ctx, g.read, resource).Scan(&hwm)
	if err == sql.ErrNoRows {
		return 0, nil
	}
	return uint64(hwm), err
}
