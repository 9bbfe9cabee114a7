package leasehold

// The Redis stream executor: the core owns the Redis wire (LH_BACKEND_REDIS_STREAM) and
// asks only to open a stream, to write on it and to close it. This file moves those bytes
// on net and crypto/tls; it knows no Redis command. The public type is in
// redis_stream_config.go.
//
// Reads are fed in order by whoever holds the stream's token: a caller that waits for its
// answer anyway (Acquire, Release) writes and reads on its own goroutine (drive); else the
// stream's reader goroutine, which steps aside (a past read deadline) while callers drive
// and comes back when they leave (at once if others' answers may be due, else when idle).
// A write starts when the core asks for it, without waiting (tryWrite), so that a request
// is on its way while the rest of the drain and the caller's set-up run; a flusher writes
// what is left.

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// idleResume: the reader comes back this long after the last caller left a quiet stream
// (back-to-back callers do not wake it; a peer closing an idle stream is seen by then).
const idleResume = 5 * time.Millisecond

var kickTime = time.Unix(1, 0) // a read deadline in the past: a blocked Read returns

type streamExec struct {
	c       *client
	tls     *tls.Config // the user's, or nil: the system roots
	streams map[uint64]*stream
	drives  []*drive // callers reading for their answer (c.mu held)
	wg      sync.WaitGroup
}

// stream is one connection the core asked for.
type stream struct {
	x          *streamExec
	id         uint64
	conn, raw  net.Conn // raw (under a *tls.Conn over TLS) is closed to end it
	isTLS      bool
	cancel     context.CancelFunc
	tok        chan struct{} // held to read into buf and feed (the bytes reach the core in order)
	buf        []byte
	job        job           // the one flush in flight (writing)
	resume     chan struct{} // wakes the reader
	mu         sync.Mutex
	out, spare []byte // queued writes; one flusher at a time (writing)
	writing    bool
	closed     bool   // shut down by the core, or ended and reported
	werr       error  // why a write failed (the stream's end)
	callers    int    // callers driving, or waiting to
	readerIn   bool   // the reader is reading
	other      bool   // written for others since the reader left: it must come back at once
	lastDrive  uint64 // when the last caller left (monoNow)
	// rdl is the read deadline a drive set last (token held); rdlSet, that it is still the
	// connection's: every other setter clears it first, so a drive whose deadline did not
	// change sets none (a kick landing after the check ends a Read early, as any kick).
	rdl    time.Time
	rdlSet atomic.Bool
	wdl    time.Time // the write deadline (the flusher's: writing)
	// rc writes without waiting (nil over TLS): the request leaves while the core is still
	// drained (tryWrite). tryFn is rc's callback, bound once; tryN and tryErr its result.
	rc     syscall.RawConn
	tryFn  func(fd uintptr) bool
	tryN   int
	tryErr error
}

// drive is one caller reading for its answer.
type drive struct {
	s      *stream
	ready  answered
	kick   chan struct{}
	kicked atomic.Bool
}

func (x *streamExec) run(q *ioRequest) (*job, error) {
	switch q.kind {
	case ioOpen:
		ctx, cancel := context.WithDeadline(x.c.ioCtx, x.c.toTime(q.deadline))
		s := &stream{x: x, id: q.stream, isTLS: q.tls, cancel: cancel, tok: make(chan struct{}, 1), resume: make(chan struct{}, 1)}
		s.tok <- struct{}{}
		s.buf = make([]byte, 64<<10)
		s.job = job{id: s.id, timeout: x.c.reqTimeout, run: s.flushFor, drive: s.drive}
		x.streams[s.id] = s
		x.wg.Add(1)
		go x.dial(ctx, s, q)
		return nil, nil
	case ioWrite:
		s := x.streams[q.stream]
		if s == nil {
			return nil, nil // shut down since: the core ignores it
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.out = append(s.out, q.body...)
		if s.writing || s.conn == nil || s.closed {
			s.other = true
			return nil, nil
		}
		s.writing = true
		s.tryWrite()
		return &s.job, nil
	case ioShutdown:
		if s := x.streams[q.stream]; s != nil {
			delete(x.streams, q.stream)
			s.end(nil)
		}
		return nil, nil
	}
	return nil, errUnsupportedIO
}

// drained stops the drives whose answer came (c.mu held). Bytes of a drive's own stream
// being fed means nobody is in that stream's Read: its drives need no read deadline kick.
func (x *streamExec) drained() {
	kept := x.drives[:0]
	for _, d := range x.drives {
		if d.ready.answered() {
			d.stop(!x.c.feeding || x.c.feedingStream != d.s.id)
		} else {
			kept = append(kept, d)
		}
	}
	clear(x.drives[len(kept):])
	x.drives = kept
}

func (s *stream) wake() {
	select {
	case s.resume <- struct{}{}:
	default:
	}
}

// end closes s; with err (not shut down by the core) it reports it, once.
func (s *stream) end(err error) {
	s.mu.Lock()
	was := s.closed
	s.closed = true
	if s.werr != nil {
		err = s.werr
	}
	raw := s.raw
	s.mu.Unlock()
	s.cancel()
	s.wake()
	if raw != nil {
		_ = raw.Close()
	}
	if err != nil && !was {
		s.x.c.input(func(now uint64) error {
			delete(s.x.streams, s.id)
			return s.x.c.core.ioClosed(now, s.id, err.Error())
		})
	}
}

// dial connects s, reports it opened, then reads it for the core while no caller does.
func (x *streamExec) dial(ctx context.Context, s *stream, q *ioRequest) {
	defer x.wg.Done()
	var d net.Dialer
	network, addr := "tcp", net.JoinHostPort(q.host, strconv.Itoa(q.port))
	if q.unixPath != "" {
		network, addr = "unix", q.unixPath
	}
	raw, err := d.DialContext(ctx, network, addr)
	conn := raw
	if err == nil && q.tls {
		cfg := &tls.Config{}
		if x.tls != nil {
			cfg = x.tls.Clone()
		}
		if cfg.ServerName == "" {
			cfg.ServerName = q.serverName
		}
		tc := tls.Client(raw, cfg)
		err, conn = tc.HandshakeContext(ctx), tc
	}
	s.mu.Lock()
	if err == nil && s.closed {
		err = net.ErrClosed
	}
	early := err == nil && len(s.out) > 0 // written before it opened
	if err == nil {
		s.conn, s.raw, s.writing = conn, raw, early
		if sc, ok := conn.(syscall.Conn); ok {
			s.rc, _ = sc.SyscallConn()
			s.tryFn = s.tryWriteFD
		}
	} else if raw != nil {
		_ = raw.Close()
	}
	s.mu.Unlock()
	if err != nil {
		s.end(err)
		return
	}
	if early {
		s.flushFor(context.Background())
	}
	x.c.input(func(now uint64) error { return x.c.core.ioOpened(now, s.id) })
	idle := time.NewTimer(idleResume)
	defer idle.Stop()
	for {
		s.mu.Lock()
		for !s.closed && (s.callers > 0 || !s.other && monoNow()-s.lastDrive < uint64(idleResume)) {
			s.mu.Unlock()
			idle.Reset(idleResume)
			select {
			case <-s.resume:
			case <-idle.C:
			}
			s.mu.Lock()
		}
		if s.closed {
			s.mu.Unlock()
			return
		}
		s.readerIn, s.other = true, false
		s.setReadDeadline(time.Time{})
		s.mu.Unlock()
		<-s.tok
		err := s.read()
		s.mu.Lock()
		s.readerIn = false
		s.mu.Unlock()
		s.tok <- struct{}{}
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			s.end(err)
			return
		}
	}
}

// read reads once (token held) and feeds what came to the core.
func (s *stream) read() error {
	n, err := s.conn.Read(s.buf)
	if n > 0 {
		s.x.c.received(s.id, s.buf[:n])
	}
	return err
}

// drive runs on a caller's goroutine: it writes what is queued, then reads and feeds until
// ready or until ctx ends, leaving the rest to the reader.
func (s *stream) drive(ctx context.Context, ready answered) {
	if !s.flush(ctx) || ready.answered() {
		return
	}
	dl, bounded := ctx.Deadline()
	d := drives.Get().(*drive)
	d.s, d.ready = s, ready
	s.mu.Lock()
	s.callers++
	if s.readerIn {
		s.setReadDeadline(kickTime)
	}
	s.mu.Unlock()
	s.x.c.mu.Lock()
	s.x.drives = append(s.x.drives, d)
	s.x.c.mu.Unlock()
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, d.wake)
		defer func() {
			if stop() { // else d.wake may still run: d is not reused
				d.recycle()
			}
		}()
	} else {
		defer d.recycle()
	}
	select {
	case <-s.tok:
		var err error
		for s.driveDeadline(dl, false); err == nil && !d.kicked.Load() && !ready.answered(); {
			if err = s.read(); errors.Is(err, os.ErrDeadlineExceeded) {
				if err = nil; bounded && !time.Now().Before(dl) {
					break
				}
				s.driveDeadline(dl, true) // another drive's kick
			}
		}
		s.tok <- struct{}{}
		if err != nil {
			s.end(err)
		}
	case <-d.kick:
	case <-ctx.Done():
	}
	s.x.c.mu.Lock()
	s.x.forget(d)
	s.x.c.mu.Unlock()
	done := d.kicked.Load() || ready.answered()
	s.mu.Lock()
	s.callers--
	s.other = s.other || !done // the reader reads the answer it left
	now := s.callers == 0 && s.other
	if s.callers == 0 {
		s.lastDrive = monoNow()
	}
	s.mu.Unlock()
	if now {
		s.wake()
	}
}

// drives are reused: a drive per call was a good part of a cycle's garbage.
var drives = sync.Pool{New: func() any { return &drive{kick: make(chan struct{}, 1)} }}

// recycle returns d to drives once nothing can wake it (out of x.drives, no AfterFunc).
func (d *drive) recycle() {
	d.s, d.ready = nil, nil
	d.kicked.Store(false)
	select {
	case <-d.kick:
	default:
	}
	drives.Put(d)
}

// forget takes d out of drives (c.mu held).
func (x *streamExec) forget(d *drive) {
	for i, e := range x.drives {
		if e == d {
			last := len(x.drives) - 1
			x.drives[i], x.drives[last] = x.drives[last], nil
			x.drives = x.drives[:last]
			return
		}
	}
}

// wake stops the drive: its Read returns, its wait for the token ends.
func (d *drive) wake() { d.stop(true) }

// stop is wake; without read, only when d cannot be in its stream's Read.
func (d *drive) stop(read bool) {
	d.kicked.Store(true)
	select {
	case d.kick <- struct{}{}:
	default:
	}
	if read {
		d.s.setReadDeadline(kickTime)
	}
}

// setReadDeadline sets the read deadline for anyone but a drive reading (see rdl).
func (s *stream) setReadDeadline(t time.Time) {
	s.rdlSet.Store(false)
	_ = s.conn.SetReadDeadline(t)
}

// driveDeadline sets the read deadline of a drive (token held), unless it is set already.
func (s *stream) driveDeadline(dl time.Time, force bool) {
	if !force && s.rdlSet.Load() && s.rdl.Equal(dl) {
		return
	}
	s.rdl = dl
	s.rdlSet.Store(true)
	_ = s.conn.SetReadDeadline(dl)
}

// tryWrite writes what it can of s.out at once, never waiting (s.mu held, writing): the
// caller's request leaves before the core's drain ends. What is left, and any error, is
// flush's.
func (s *stream) tryWrite() {
	if s.rc == nil || len(s.out) == 0 {
		return
	}
	s.tryN, s.tryErr = 0, nil
	if s.rc.Write(s.tryFn) != nil || s.tryErr != nil || s.tryN <= 0 {
		return
	}
	s.out = s.out[:copy(s.out, s.out[s.tryN:])]
}

// tryWriteFD is tryWrite's one write(2), done whatever it returns.
func (s *stream) tryWriteFD(fd uintptr) bool {
	s.tryN, s.tryErr = syscall.Write(int(fd), s.out)
	return true
}

// flushFor is the job run off the caller: the answer is the reader's to read.
func (s *stream) flushFor(ctx context.Context) {
	s.mu.Lock()
	s.other = true
	idle := s.callers == 0
	s.mu.Unlock()
	if idle {
		s.wake()
	}
	s.flush(ctx)
}

// flush writes what is queued on s, in order, until nothing is left; past ctx's deadline
// the rest is written by a goroutine of its own (false: not all written here).
func (s *stream) flush(ctx context.Context) bool {
	dl, bounded := ctx.Deadline()
	bounded = bounded && !s.isTLS // a TLS write cut short breaks the connection
	if !bounded {
		dl = time.Time{}
	}
	s.writeDeadline(dl)
	for {
		s.mu.Lock()
		if len(s.out) == 0 || s.closed {
			s.writing = false
			s.mu.Unlock()
			break
		}
		buf := s.out
		s.out = s.spare[:0]
		s.mu.Unlock()
		n, err := s.conn.Write(buf)
		s.mu.Lock()
		if err != nil {
			if bounded && errors.Is(err, os.ErrDeadlineExceeded) && !s.closed {
				s.out = append(buf[n:len(buf):len(buf)], s.out...)
				s.mu.Unlock()
				s.writeDeadline(time.Time{})
				s.x.wg.Add(1)
				go func() { defer s.x.wg.Done(); s.flushFor(context.Background()) }()
				return false
			}
			s.writing, s.werr = false, err
			s.mu.Unlock()
			s.end(err)
			return false
		}
		s.spare = buf[:0]
		s.mu.Unlock()
	}
	return true
}

// writeDeadline sets the write deadline unless it is set already (the flusher's).
func (s *stream) writeDeadline(dl time.Time) {
	if !s.wdl.Equal(dl) {
		s.wdl = dl
		_ = s.conn.SetWriteDeadline(dl)
	}
}

// close ends every stream and waits for their goroutines.
func (x *streamExec) close() {
	x.c.mu.Lock()
	streams := x.streams
	x.streams = map[uint64]*stream{}
	x.c.mu.Unlock()
	for _, s := range streams {
		s.end(nil)
	}
	x.wg.Wait()
}
