package leasehold

// The Redis stream executor: the core owns the Redis wire (LH_BACKEND_REDIS_STREAM), from
// the handshake to the reconnects, and asks only to open a stream, to write on it and to
// close it. This file moves those bytes on net and crypto/tls; it knows no Redis command.
// The executor's public type and options are in redis_stream_config.go.

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"strconv"
	"sync"
	"time"
)

// streamExec moves the bytes of one LockClient's streams.
type streamExec struct {
	c       *client
	tls     *tls.Config        // the user's, or nil: system roots
	streams map[uint64]*stream // c.mu held
	wg      sync.WaitGroup     // dialers/readers and background flushers
}

// stream is one connection the core asked for. Writes queue in out; one flusher at a time
// (writing) drains it, on the caller's goroutine or a goroutine of its own.
type stream struct {
	id         uint64
	mu         sync.Mutex
	conn       net.Conn // what bytes move on (a *tls.Conn over TLS)
	raw        net.Conn // closed to end the stream
	isTLS      bool
	out, spare []byte
	writing    bool
	closed     bool  // shut down by the core, or ended and reported
	werr       error // why a write failed, reported by the reader
	cancel     context.CancelFunc
	flushJob   job
	wg         *sync.WaitGroup // the executor's
}

func (x *streamExec) run(q *ioRequest) (*job, error) {
	switch q.kind {
	case ioOpen:
		ctx, cancel := context.WithDeadline(x.c.ioCtx, x.c.toTime(q.deadline))
		s := &stream{id: q.stream, isTLS: q.tls, cancel: cancel, wg: &x.wg}
		// A write on a TLS connection that timed out breaks it: TLS writes are never cut short.
		s.flushJob = job{id: s.id, timeout: x.c.reqTimeout, run: s.flush, own: !q.tls}
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
			return nil, nil
		}
		s.writing = true
		return &s.flushJob, nil
	case ioShutdown:
		if s := x.streams[q.stream]; s != nil {
			delete(x.streams, q.stream)
			s.end()
		}
		return nil, nil
	}
	return nil, errUnsupportedIO
}

// end closes s for good (nothing more is reported for it).
func (s *stream) end() {
	s.mu.Lock()
	s.closed = true
	raw := s.raw
	s.mu.Unlock()
	s.cancel()
	if raw != nil {
		_ = raw.Close()
	}
}

// dial connects s, reports it opened, then reads it until it ends.
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
	s.cancel()
	if err == nil {
		s.mu.Lock()
		if s.closed {
			err = net.ErrClosed
		} else {
			s.conn, s.raw = conn, raw
		}
		s.mu.Unlock()
	}
	if err != nil {
		if raw != nil {
			_ = raw.Close()
		}
		x.closed(s, err)
		return
	}
	x.c.input(func(now uint64) error { return x.c.core.ioOpened(now, s.id) })
	buf := make([]byte, 64<<10)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			x.c.input(func(now uint64) error { return x.c.core.ioReceived(now, s.id, buf[:n]) })
		}
		if err != nil {
			s.mu.Lock()
			if s.werr != nil {
				err = s.werr
			}
			s.mu.Unlock()
			_ = raw.Close()
			x.closed(s, err)
			return
		}
	}
}

// closed reports s's end to the core, unless the core shut it down.
func (x *streamExec) closed(s *stream, err error) {
	s.mu.Lock()
	was := s.closed
	s.closed = true
	s.mu.Unlock()
	if was {
		return
	}
	x.c.input(func(now uint64) error {
		delete(x.streams, s.id)
		return x.c.core.ioClosed(now, s.id, err.Error())
	})
}

// flush writes what is queued on s, in order, until nothing is left. Past ctx's deadline
// the rest is written by a goroutine of its own, so the caller returns in time.
func (s *stream) flush(ctx context.Context) {
	dl, bounded := ctx.Deadline()
	bounded = bounded && !s.isTLS
	if bounded {
		_ = s.conn.SetWriteDeadline(dl)
	}
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
				_ = s.conn.SetWriteDeadline(time.Time{})
				s.wg.Add(1)
				go func() { defer s.wg.Done(); s.flush(context.Background()) }()
				return
			}
			s.writing, s.werr = false, err
			s.mu.Unlock()
			_ = s.raw.Close() // the reader reports it
			return
		}
		s.spare = buf[:0]
		s.mu.Unlock()
	}
	if bounded {
		_ = s.conn.SetWriteDeadline(time.Time{})
	}
}

// close ends every stream and waits for their goroutines.
func (x *streamExec) close() {
	x.c.mu.Lock()
	streams := x.streams
	x.streams = map[uint64]*stream{}
	x.c.mu.Unlock()
	for _, s := range streams {
		s.end()
	}
	x.wg.Wait()
}
