package main

import (
	"bufio"
	"encoding/json"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// monoNow is CLOCK_MONOTONIC in nanoseconds: system-wide, so the histories
// of every process of the host merge on one time line.
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err) // cannot fail on Linux
	}
	return ts.Nano()
}

// monoOf converts a time.Time that carries Go's monotonic reading (as
// Lease.ValidUntil does) to CLOCK_MONOTONIC: Go's monotonic clock is
// CLOCK_MONOTONIC with another origin, so the distance from now is the same
// on both; time.Until subtracts the monotonic readings.
func monoOf(t time.Time) int64 {
	now := monoNow()
	return now + int64(time.Until(t))
}

// entry is one history line (tests/histories/README.md).
type entry struct {
	P          string  `json:"p"`
	T          int64   `json:"t"`
	Type       string  `json:"type"`
	F          string  `json:"f"`
	Name       string  `json:"name"`
	Token      *uint64 `json:"token"`
	ValidUntil *int64  `json:"valid_until"`
	Value      *int64  `json:"value"`
	Read       *int64  `json:"read"`
	Error      *string `json:"error"`
}

// history appends lines to the history file, each with one write(2) on an
// O_APPEND descriptor, so a process killed at any moment leaves whole lines.
type history struct {
	mu   sync.Mutex
	f    *os.File
	p    string
	name string
}

func openHistory(path, p, name string) (*history, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	return &history{f: f, p: p, name: name}, nil
}

// rec fills the common fields, stamps the time and writes e.
func (h *history) rec(e entry) {
	e.P, e.Name = h.p, h.name
	h.mu.Lock()
	defer h.mu.Unlock()
	e.T = monoNow()
	b, err := json.Marshal(e)
	if err != nil {
		panic(err) // plain fields only
	}
	b = append(b, '\n')
	if _, err := h.f.Write(b); err != nil {
		fatal(1, "writing the history: %v", err)
	}
}

// lastCounter is the highest value counter this process index wrote into
// path before (a worker restarted after SIGKILL appends to its history and
// must not repeat a value).
func lastCounter(path string, index int64) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	var last int64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e entry
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Value == nil {
			continue // a line torn by a kill, or no value
		}
		if *e.Value/valueBase == index && *e.Value%valueBase > last {
			last = *e.Value % valueBase
		}
	}
	return last
}

func u64(v uint64) *uint64 { return &v }
func i64(v int64) *int64   { return &v }
func str(s string) *string { return &s }
