package leasehold

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
)

func newGateDB(t *testing.T) (*sql.DB, *Gate) {
	t.Helper()
	db, g, err := setupDB(context.Background(), filepath.Join(t.TempDir(), "gate.db"), []string{"r"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db, g
}

func TestGateAcceptsEqualAndHigherRejectsLower(t *testing.T) {
	db, g := newGateDB(t)
	ctx := context.Background()
	write := func(tok uint64) error {
		return g.Do(ctx, "r", tok, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO log (name, token, worker) VALUES ('r', ?, 't')", int64(tok))
			return err
		})
	}
	for _, tok := range []uint64{5, 5, 9} {
		if err := write(tok); err != nil {
			t.Fatalf("token %d: %v", tok, err)
		}
	}
	err := write(7)
	var se *StaleTokenError
	if !errors.Is(err, ErrStaleToken) || !errors.As(err, &se) || se.Token != 7 || se.HWM != 9 {
		t.Fatalf("stale token: %v", err)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM log WHERE token = 7").Scan(&n); err != nil || n != 0 {
		t.Fatalf("the stale write happened: %d %v", n, err)
	}
	if hwm, err := g.HighWaterMark(ctx, "r"); err != nil || hwm != 9 {
		t.Fatalf("hwm %d %v", hwm, err)
	}
	if hwm, err := g.HighWaterMark(ctx, "unknown"); err != nil || hwm != 0 {
		t.Fatalf("hwm of an unknown resource %d %v", hwm, err)
	}
}

func TestGateErrorRollsBackTheMark(t *testing.T) {
	_, g := newGateDB(t)
	ctx := context.Background()
	boom := errors.New("boom")
	if err := g.Do(ctx, "r", 3, func(context.Context, *sql.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := g.Do(ctx, "r", 10, func(context.Context, *sql.Tx) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("fn error: %v", err)
	}
	if hwm, _ := g.HighWaterMark(ctx, "r"); hwm != 3 {
		t.Fatalf("a failed operation raised the mark to %d", hwm)
	}
}

// A stale holder that read before a newer holder's first write must not
// complete its read-modify-write: reads run inside the gate too.
func TestGateStopsInterleavedReadModifyWrite(t *testing.T) {
	db, g := newGateDB(t)
	ctx := context.Background()
	var staleRead int64
	if err := g.Do(ctx, "r", 1, func(ctx context.Context, tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, "SELECT v FROM counter WHERE name = 'r'").Scan(&staleRead)
	}); err != nil {
		t.Fatal(err)
	}
	// The newer holder reads (raising the mark) before it writes anything.
	if err := criticalSection(ctx, g, "r", 2, "new"); err != nil {
		t.Fatal(err)
	}
	err := g.Do(ctx, "r", 1, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE counter SET v = ? WHERE name = 'r'", staleRead+1)
		return err
	})
	if !errors.Is(err, ErrStaleToken) {
		t.Fatalf("stale read-modify-write: %v", err)
	}
	var v int
	_ = db.QueryRow("SELECT v FROM counter WHERE name = 'r'").Scan(&v)
	if v != 1 {
		t.Fatalf("counter %d, want 1", v)
	}
}

func TestGateBadInputs(t *testing.T) {
	db, g := newGateDB(t)
	ctx := context.Background()
	noop := func(context.Context, *sql.Tx) error { return nil }
	if err := g.Do(ctx, "r", 0, noop); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("token 0: %v", err)
	}
	if err := g.Do(ctx, "r", 1<<63, noop); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("token above int64: %v", err)
	}
	if err := g.Do(ctx, "r", 1, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("nil fn: %v", err)
	}
	if _, err := NewGate(ctx, db, &GateOptions{Table: "x; DROP TABLE log"}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad table name: %v", err)
	}
	if _, err := NewGate(ctx, nil, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("nil db: %v", err)
	}
	if _, err := NewGate(ctx, db, &GateOptions{Dialect: 7}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad dialect: %v", err)
	}
}
