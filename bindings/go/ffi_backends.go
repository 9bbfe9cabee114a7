package leasehold

// cgo wrappers of the one IO seam (lh_io_*) every backend is driven through, of the backend
// options (lh_backend_options) and of status queries. Requests are copied out of the handle
// at once (they borrow it until the next call); answers go in as flat lh_value lists, HTTP
// replies, stream messages, failures, notifications and connection events.

/*
#include <stdlib.h>
#include <string.h>
#include "leasehold.h"

// The library may hand out a dangling, non-NULL pointer (its alignment, like 0x8) for an
// empty buffer. Go's runtime refuses such values in pointer-typed variables (a stack copy
// throws "invalid pointer found on stack"), so empty buffers cross as NULL.
static lh_status lhgo_io_poll(lh_client *c, lh_io_request *out) {
	lh_status st = lh_io_poll(c, out);
	if (st == LH_OK) {
		if (out->argc == 0) out->argv = NULL;
		if (out->nstatements == 0) out->statements = NULL;
		if (out->nparams == 0) out->params = NULL;
		if (out->data_len == 0) out->data = NULL;
	}
	return st;
}

// The arguments of a COMMAND, copied into one buffer (their lengths into lens), so that Go
// never holds a pointer an empty argument may carry.
static size_t lhgo_args_size(const lh_bytes *argv, uint32_t argc) {
	size_t n = 0;
	for (uint32_t i = 0; i < argc; i++) n += argv[i].len;
	return n;
}

static void lhgo_args_copy(const lh_bytes *argv, uint32_t argc, uint8_t *buf, size_t *lens) {
	size_t at = 0;
	for (uint32_t i = 0; i < argc; i++) {
		if (argv[i].len > 0) memcpy(buf + at, argv[i].ptr, argv[i].len);
		lens[i] = argv[i].len;
		at += argv[i].len;
	}
}

// The step after an event, taken in the same crossing (handling an event asks nothing of
// the core): the next event, else, with deadline, the next deadline.
typedef struct lhgo_peek {
	lh_event ev;
	uint64_t dl;
	int what; // 2 an event, 3 neither; on a failure, the call that failed
	lh_status st;
} lhgo_peek;

static lh_status lhgo_events_step(lh_client *c, int deadline, lh_event *ev, uint64_t *dl, int *what) {
	*what = 2;
	lh_status st = lh_poll_event(c, ev);
	if (st != LH_OK || ev->kind != LH_EVENT_NONE) return st;
	*what = 3;
	return deadline ? lh_poll_timeout(c, dl) : LH_OK;
}

// One step of a drain in one crossing (a cgo call costs more than these calls' work): the
// next request (unless events is set), else the next event, else, with deadline, the next
// deadline. *what: 1 a request, 2 an event, 3 neither; on a failure, the call that failed.
// After an event, the step that follows it goes into *peek. The pointers (all to C memory)
// cross as integers: cgo checks no pointer argument then.
static lh_status lhgo_drain_step(uintptr_t cp, int events, int deadline, uintptr_t reqp, uintptr_t evp,
                                 uintptr_t dlp, uintptr_t whatp, uintptr_t peekp) {
	lh_client *c = (lh_client *)cp;
	lh_io_request *req = (lh_io_request *)reqp;
	int *what = (int *)whatp;
	lhgo_peek *peek = (lhgo_peek *)peekp;
	lh_status st;
	peek->what = 0;
	if (!events) {
		*what = 1;
		st = lhgo_io_poll(c, req);
		if (st != LH_OK || req->kind != LH_IO_NONE) return st;
	}
	st = lhgo_events_step(c, deadline, (lh_event *)evp, (uint64_t *)dlp, what);
	if (st == LH_OK && *what == 2) {
		peek->st = lhgo_events_step(c, deadline, &peek->ev, &peek->dl, &peek->what);
	}
	return st;
}

// lh_io_received, then the first step of the drain it calls for (*what 0: received failed).
static lh_status lhgo_received_step(uintptr_t cp, uint64_t now, uint64_t stream, const uint8_t *b,
                                    size_t n, int deadline, uintptr_t reqp, uintptr_t evp,
                                    uintptr_t dlp, uintptr_t whatp, uintptr_t peekp) {
	*(int *)whatp = 0;
	((lhgo_peek *)peekp)->what = 0;
	lh_status st = lh_io_received((lh_client *)cp, now, stream, b, n);
	if (st != LH_OK) return st;
	return lhgo_drain_step(cp, 0, deadline, reqp, evp, dlp, whatp, peekp);
}

static lh_status lhgo_poll_status(lh_client *c, lh_lock_status *out) {
	lh_status st = lh_poll_status(c, out);
	if (st == LH_OK) {
		if (out->holder_host_len == 0) out->holder_host = NULL;
		if (out->error_len == 0) out->error = NULL;
	}
	return st;
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"time"
	"unsafe"
)

// The seam's constants, checked against the header in init.
const (
	backendMemory   = 1
	backendRedis    = 2
	backendSQLite   = 3
	backendPostgres = 4
	backendEtcd     = 5
	// backendRedisStream: Redis with the connections in the core (RedisStreamExecutor).
	backendRedisStream = 6

	ioNone       = 0
	ioCommand    = 1
	ioSQL        = 2
	ioHTTP       = 3
	ioHTTPWatch  = 4
	ioHTTPCancel = 5
	ioOpen       = 6
	ioWrite      = 7
	ioShutdown   = 8

	connCommands = 1
	connNotify   = 2

	failTransport = 1
	failDatabase  = 2

	connReopened     = 1
	connSubscribed   = 2
	connUnsubscribed = 3

	valueNil    = 1
	valueInt    = 2
	valueBulk   = 3
	valueStatus = 4
	valueError  = 5
	valueArray  = 6
	valueText   = 7
	valueFloat  = 8

	paramMonotonicNs = 20
	paramWallUs      = 21
	paramBootID      = 22
	paramPid         = 23
	paramHostName    = 24

	maxReplyValues = 4096
	maxReplyData   = 1 << 20
)

func init() {
	if abiErr != nil {
		return
	}
	pairs := [][2]uint64{
		{C.LH_BACKEND_MEMORY, backendMemory}, {C.LH_BACKEND_REDIS, backendRedis},
		{C.LH_BACKEND_SQLITE, backendSQLite}, {C.LH_BACKEND_POSTGRES, backendPostgres},
		{C.LH_BACKEND_ETCD, backendEtcd}, {C.LH_BACKEND_REDIS_STREAM, backendRedisStream},
		{C.LH_IO_NONE, ioNone}, {C.LH_IO_COMMAND, ioCommand}, {C.LH_IO_SQL, ioSQL}, {C.LH_IO_HTTP, ioHTTP},
		{C.LH_IO_HTTP_WATCH, ioHTTPWatch}, {C.LH_IO_HTTP_CANCEL, ioHTTPCancel},
		{C.LH_IO_OPEN, ioOpen}, {C.LH_IO_WRITE, ioWrite}, {C.LH_IO_SHUTDOWN, ioShutdown},
		{C.LH_CONNECTION_COMMANDS, connCommands}, {C.LH_CONNECTION_NOTIFY, connNotify},
		{C.LH_FAILURE_TRANSPORT, failTransport}, {C.LH_FAILURE_DATABASE, failDatabase},
		{C.LH_CONNECTION_REOPENED, connReopened}, {C.LH_CONNECTION_SUBSCRIBED, connSubscribed},
		{C.LH_CONNECTION_UNSUBSCRIBED, connUnsubscribed},
		{C.LH_VALUE_NIL, valueNil}, {C.LH_VALUE_INT, valueInt}, {C.LH_VALUE_BULK, valueBulk},
		{C.LH_VALUE_STATUS, valueStatus}, {C.LH_VALUE_ERROR, valueError}, {C.LH_VALUE_ARRAY, valueArray},
		{C.LH_VALUE_TEXT, valueText}, {C.LH_VALUE_FLOAT, valueFloat},
		{C.LH_PARAM_HOST_MONOTONIC_NS, paramMonotonicNs}, {C.LH_PARAM_HOST_WALL_US, paramWallUs},
		{C.LH_PARAM_HOST_BOOT_ID, paramBootID}, {C.LH_PARAM_HOST_PID, paramPid},
		{C.LH_PARAM_HOST_NAME, paramHostName},
		{C.LH_MAX_REPLY_VALUES, maxReplyValues}, {C.LH_MAX_REPLY_DATA, maxReplyData},
	}
	for i, p := range pairs {
		if p[0] != p[1] {
			abiErr = fmt.Errorf("leasehold: seam constant #%d differs between leasehold.h (%d) and the Go binding (%d)", i, p[0], p[1])
			return
		}
	}
}

// redisProtocol tunes the core's Redis protocol; zero fields take the library's defaults.
type redisProtocol struct {
	standbyDelayMs, keyKeepMs, queueMaxAgeMs, idleRecheckMs uint64
	shardedWake                                             bool // Redis Cluster: redis_sharded_wake
}

// sqlProtocol tunes the core's SQL protocol.
type sqlProtocol struct {
	busyTimeoutMs      uint64 // SQLite; 0: the library's default
	asynchronousCommit bool   // PostgreSQL
}

// etcdProtocol holds the etcd credentials the core authenticates with.
type etcdProtocol struct {
	user, password string
}

// streamProtocol is what the core needs to own the Redis wire (LH_BACKEND_REDIS_STREAM);
// zero numbers take the library's defaults.
type streamProtocol struct {
	url, clientName            string
	protocol, connectTimeoutMs uint32
	requestTimeoutMs           uint64
}

// backendOptions is an lh_backend_options: the backend a core speaks and its options.
type backendOptions struct {
	kind   uint32
	redis  redisProtocol
	sql    sqlProtocol
	etcd   etcdProtocol
	stream streamProtocol
}

// c fills an lh_backend_options; free releases the C copies of the etcd credentials once
// lh_client_new has read them (a Go pointer must not be stored in memory passed to C).
func (b backendOptions) c() (o C.lh_backend_options, free func(), err error) {
	free = func() {}
	if st := uint32(C.lh_backend_options_default(C.uint32_t(b.kind), &o)); st != statusOK {
		return o, free, &StatusError{Status: st, Name: statusName(st), Op: "lh_backend_options_default"}
	}
	for _, f := range []struct {
		dst *C.uint64_t
		v   uint64
	}{{&o.redis_standby_delay_ms, b.redis.standbyDelayMs}, {&o.redis_key_keep_ms, b.redis.keyKeepMs},
		{&o.redis_queue_max_age_ms, b.redis.queueMaxAgeMs}, {&o.redis_idle_recheck_ms, b.redis.idleRecheckMs},
		{&o.sqlite_busy_timeout_ms, b.sql.busyTimeoutMs}} {
		if f.v > 0 {
			*f.dst = C.uint64_t(f.v)
		}
	}
	if b.redis.shardedWake {
		o.redis_sharded_wake = 1
	}
	if b.sql.asynchronousCommit {
		o.postgres_asynchronous_commit = 1
	}
	var copies []unsafe.Pointer
	free = func() {
		for _, p := range copies {
			C.free(p)
		}
	}
	cstr := func(dst **C.uint8_t, n *C.size_t, s string) {
		if s != "" {
			p := C.CBytes([]byte(s))
			copies = append(copies, p)
			*dst, *n = (*C.uint8_t)(p), C.size_t(len(s))
		}
	}
	if b.etcd.user != "" {
		cstr(&o.etcd_user, &o.etcd_user_len, b.etcd.user)
		cstr(&o.etcd_password, &o.etcd_password_len, b.etcd.password)
	}
	if b.kind == backendRedisStream {
		cstr(&o.redis_url, &o.redis_url_len, b.stream.url)
		cstr(&o.redis_client_name, &o.redis_client_name_len, b.stream.clientName)
		if b.stream.protocol > 0 {
			o.redis_protocol = C.uint32_t(b.stream.protocol)
		}
		if b.stream.connectTimeoutMs > 0 {
			o.redis_connect_timeout_ms = C.uint32_t(b.stream.connectTimeoutMs)
		}
		if b.stream.requestTimeoutMs > 0 {
			o.redis_request_timeout_ms = C.uint64_t(b.stream.requestTimeoutMs)
		}
	}
	return o, free, nil
}

// sqlParam is one parameter of a statement: kind is an LH_VALUE_* or LH_PARAM_HOST_* value.
type sqlParam struct {
	kind    uint32
	integer int64
	bytes   []byte // TEXT or BULK
}

type sqlStatement struct {
	sql    string
	params []sqlParam
}

// ioRequest is a copy of one lh_io_request: it owns its memory.
type ioRequest struct {
	id         uint64
	kind       uint32
	connection uint32
	argv       []string       // COMMAND
	statements []sqlStatement // SQL
	// HTTP, HTTP_WATCH.
	method, path, authorization string
	body                        []byte // HTTP: the JSON body; WRITE: the bytes to write (borrowed: see request)
	// OPEN, WRITE, SHUTDOWN (the stream kind).
	stream, deadline           uint64
	host, unixPath, serverName string
	port                       int
	tls                        bool
}

// ioPoll takes the next request (nil when none is left).
func (c *core) ioPoll() (*ioRequest, error) {
	r := c.req
	st := uint32(C.lhgo_io_poll(c.p, r))
	if st != statusOK {
		runtime.KeepAlive(c)
		return nil, c.err("lh_io_poll", st)
	}
	if r.kind == ioNone {
		return nil, nil
	}
	return c.request(), nil
}

// drainStep is one step of a drain: a request, an event, or neither (then the next
// deadline, when it was asked for: hasDeadline).
type drainStep struct {
	q           *ioRequest
	e           event
	dl          uint64
	hasDeadline bool
	err         error
	polling     bool // err came from lh_io_poll
}

var stepOps = [...]string{"lh_io_received", "lh_io_poll", "lh_poll_event", "lh_poll_timeout"}

// step takes the next request (unless events: the requests were drained), else the next
// event, else, with deadline, the next deadline, in one crossing. The step after an event
// came with it (peeked): it is the next one, step(true, deadline) straight after handling it.
func (c *core) step(events, deadline bool) drainStep {
	if c.peeked {
		c.peeked = false
		return c.next
	}
	st := uint32(C.lhgo_drain_step(cAddr(unsafe.Pointer(c.p)), cBool(events), cBool(deadline), cAddr(unsafe.Pointer(c.req)),
		cAddr(unsafe.Pointer(c.ev)), cAddr(unsafe.Pointer(c.u64)), cAddr(unsafe.Pointer(c.what)), cAddr(c.peek)))
	return c.stepResult(st, deadline)
}

// newPeek allocates the step a drain step takes after an event (C memory).
func newPeek() unsafe.Pointer { return C.calloc(1, C.sizeof_lhgo_peek) }

// receivedStep is ioReceived of at most maxReplyData bytes, then step(false, deadline), in
// one crossing; received is false when lh_io_received itself failed (err).
func (c *core) receivedStep(now, stream uint64, b []byte, deadline bool) (s drainStep, received bool) {
	bp, bn := bytesPtr(b)
	c.peeked = false
	st := uint32(C.lhgo_received_step(cAddr(unsafe.Pointer(c.p)), C.uint64_t(now), C.uint64_t(stream), bp, bn,
		cBool(deadline), cAddr(unsafe.Pointer(c.req)), cAddr(unsafe.Pointer(c.ev)), cAddr(unsafe.Pointer(c.u64)),
		cAddr(unsafe.Pointer(c.what)), cAddr(c.peek)))
	runtime.KeepAlive(b)
	return c.stepResult(st, deadline), st == statusOK || *c.what != 0
}

func (c *core) stepResult(st uint32, deadline bool) drainStep {
	defer runtime.KeepAlive(c)
	what, dl := *c.what, *c.u64
	switch {
	case st != statusOK:
		return drainStep{err: c.err(stepOps[what], st), polling: what == 1}
	case what == 1:
		return drainStep{q: c.request()}
	case what == 2:
		if p := (*C.lhgo_peek)(c.peek); p.what != 0 {
			c.next, c.peeked = c.peekResult(p, deadline), true
		}
		return drainStep{e: c.event()}
	}
	return drainStep{dl: uint64(dl), hasDeadline: deadline}
}

// peekResult is stepResult of the peeked step.
func (c *core) peekResult(p *C.lhgo_peek, deadline bool) drainStep {
	switch {
	case p.st != statusOK:
		return drainStep{err: c.err(stepOps[p.what], uint32(p.st))}
	case p.what == 2:
		return drainStep{e: cEvent(&p.ev)}
	}
	return drainStep{dl: uint64(p.dl), hasDeadline: deadline}
}

// cAddr is the address of C memory, for the shims above.
func cAddr(p unsafe.Pointer) C.uintptr_t { return C.uintptr_t(uintptr(p)) }

func cBool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// request copies the polled request out of the handle. A WRITE's bytes are borrowed
// (q.body points into the handle until its next call) and its ioRequest is reused: the
// executor copies them at once, under the client's mutex, and keeps neither.
func (c *core) request() *ioRequest {
	r := c.req
	if r.kind == ioWrite {
		q := &c.write
		*q = ioRequest{id: uint64(r.id), kind: ioWrite, connection: uint32(r.connection), stream: uint64(r.stream),
			deadline: uint64(r.deadline)}
		if r.data != nil {
			q.body = unsafe.Slice((*byte)(unsafe.Pointer(r.data)), int(r.data_len))
		}
		return q
	}
	q := &ioRequest{id: uint64(r.id), kind: uint32(r.kind), connection: uint32(r.connection)}
	switch q.kind {
	case ioCommand:
		q.argv = copyArgs(r.argv, r.argc)
	case ioSQL:
		var data []byte
		if r.data != nil {
			data = unsafe.Slice((*byte)(unsafe.Pointer(r.data)), int(r.data_len))
		}
		var params []C.lh_value
		if r.params != nil {
			params = unsafe.Slice(r.params, int(r.nparams))
		}
		var stmts []C.lh_sql_statement
		if r.statements != nil {
			stmts = unsafe.Slice(r.statements, int(r.nstatements))
		}
		for _, s := range stmts {
			stmt := sqlStatement{sql: string(data[s.sql_offset : s.sql_offset+s.sql_len])}
			for _, p := range params[s.first_param : s.first_param+s.nparams] {
				sp := sqlParam{kind: uint32(p.kind), integer: int64(p.integer)}
				if sp.kind == valueText || sp.kind == valueBulk {
					sp.bytes = append([]byte{}, data[p.offset:p.offset+p.len]...)
				}
				stmt.params = append(stmt.params, sp)
			}
			q.statements = append(q.statements, stmt)
		}
	case ioHTTP, ioHTTPWatch, ioHTTPCancel:
		if r.method != nil {
			q.method = C.GoString(r.method)
		}
		if r.path != nil {
			q.path = C.GoString(r.path)
		}
		if r.authorization != nil {
			q.authorization = C.GoString(r.authorization)
		}
		if r.data != nil {
			q.body = C.GoBytes(unsafe.Pointer(r.data), C.int(r.data_len))
		}
	case ioOpen, ioWrite, ioShutdown:
		q.stream, q.deadline, q.port, q.tls = uint64(r.stream), uint64(r.deadline), int(r.port), r.tls != 0
		for _, f := range []struct {
			dst *string
			src *C.char
		}{{&q.host, r.host}, {&q.unixPath, r.unix_path}, {&q.serverName, r.server_name}} {
			if f.src != nil {
				*f.dst = C.GoString(f.src)
			}
		}
		if r.data != nil {
			q.body = C.GoBytes(unsafe.Pointer(r.data), C.int(r.data_len))
		}
	}
	return q
}

// ioOpened reports that stream is connected (lh_io_opened).
func (c *core) ioOpened(now, stream uint64) error {
	st := uint32(C.lh_io_opened(c.p, C.uint64_t(now), C.uint64_t(stream)))
	runtime.KeepAlive(c)
	return c.err("lh_io_opened", st)
}

// ioReceived hands the core bytes read on stream, split at the seam's bound.
func (c *core) ioReceived(now, stream uint64, b []byte) error {
	for len(b) > 0 {
		n := min(len(b), maxReplyData)
		bp, bn := bytesPtr(b[:n])
		st := uint32(C.lh_io_received(c.p, C.uint64_t(now), C.uint64_t(stream), bp, bn))
		runtime.KeepAlive(b)
		if st != statusOK {
			runtime.KeepAlive(c)
			return c.err("lh_io_received", st)
		}
		b = b[n:]
	}
	runtime.KeepAlive(c)
	return nil
}

// ioClosed reports that stream ended or never opened, and why.
func (c *core) ioClosed(now, stream uint64, why string) error {
	if len(why) > maxReplyData {
		why = why[:maxReplyData]
	}
	mp, mn := strPtr(why)
	st := uint32(C.lh_io_closed(c.p, C.uint64_t(now), C.uint64_t(stream), mp, mn))
	runtime.KeepAlive(why)
	runtime.KeepAlive(c)
	return c.err("lh_io_closed", st)
}

// copyArgs copies a COMMAND's arguments out of the handle.
func copyArgs(argv *C.lh_bytes, argc C.uint32_t) []string {
	if argv == nil || argc == 0 {
		return nil
	}
	buf := make([]byte, int(C.lhgo_args_size(argv, argc)))
	lens := make([]C.size_t, int(argc))
	bp, _ := bytesPtr(buf)
	C.lhgo_args_copy(argv, argc, bp, &lens[0])
	out := make([]string, len(lens))
	at := 0
	for i, n := range lens {
		if n > 0 {
			out[i] = unsafe.String(&buf[at], int(n)) // buf is never written again
			at += int(n)
		}
	}
	return out
}

// lhValue is lh_value: no pointers inside, so a Go slice of them goes to C as it is.
type lhValue = C.lh_value

func newValue(kind uint32, integer int64, offset, n int) lhValue {
	return lhValue{kind: C.uint32_t(kind), integer: C.int64_t(integer), offset: C.uint64_t(offset), len: C.uint64_t(n)}
}

// ioReply hands back the values answering a COMMAND or SQL request.
func (c *core) ioReply(now, id uint64, vals []lhValue, data []byte) error {
	var vp *C.lh_value
	if len(vals) > 0 {
		vp = &vals[0]
	}
	dp, dn := bytesPtr(data)
	st := uint32(C.lh_io_reply(c.p, C.uint64_t(now), C.uint64_t(id), vp, C.size_t(len(vals)), dp, dn))
	runtime.KeepAlive(vals)
	runtime.KeepAlive(data)
	runtime.KeepAlive(c)
	return c.err("lh_io_reply", st)
}

func (c *core) ioHTTPReply(now, id uint64, status int, body []byte) error {
	bp, bn := bytesPtr(body)
	st := uint32(C.lh_io_http_reply(c.p, C.uint64_t(now), C.uint64_t(id), C.uint32_t(status), bp, bn))
	runtime.KeepAlive(body)
	runtime.KeepAlive(c)
	return c.err("lh_io_http_reply", st)
}

func (c *core) ioStreamMessage(now, id uint64, line []byte) error {
	lp, ln := bytesPtr(line)
	st := uint32(C.lh_io_stream_message(c.p, C.uint64_t(now), C.uint64_t(id), lp, ln))
	runtime.KeepAlive(line)
	runtime.KeepAlive(c)
	return c.err("lh_io_stream_message", st)
}

// ioFailed reports that request id got no answer (failTransport) or that the database
// refused it (failDatabase); msg is cut to the seam's bound.
func (c *core) ioFailed(now, id uint64, kind uint32, msg string) error {
	if len(msg) > maxReplyData {
		msg = msg[:maxReplyData]
	}
	mp, mn := strPtr(msg)
	st := uint32(C.lh_io_failed(c.p, C.uint64_t(now), C.uint64_t(id), C.uint32_t(kind), mp, mn))
	runtime.KeepAlive(msg)
	runtime.KeepAlive(c)
	return c.err("lh_io_failed", st)
}

// ioMessage delivers one notification (a pub/sub message, a NOTIFY, a memory release).
func (c *core) ioMessage(now uint64, channel, payload string) error {
	cp, cn := strPtr(channel)
	pp, pn := strPtr(payload)
	st := uint32(C.lh_io_message(c.p, C.uint64_t(now), cp, cn, pp, pn))
	runtime.KeepAlive(channel)
	runtime.KeepAlive(payload)
	runtime.KeepAlive(c)
	return c.err("lh_io_message", st)
}

// ioConnection reports what happened to a connection (connReopened, or a channel's
// connSubscribed / connUnsubscribed).
func (c *core) ioConnection(now uint64, conn, ev uint32, channel string) error {
	var cp *C.uint8_t
	var cn C.size_t
	if channel != "" {
		cp, cn = strPtr(channel)
	}
	st := uint32(C.lh_io_connection(c.p, C.uint64_t(now), C.uint32_t(conn), C.uint32_t(ev), cp, cn))
	runtime.KeepAlive(channel)
	runtime.KeepAlive(c)
	return c.err("lh_io_connection", st)
}

// ioClose tells the core the client is closing (etcd revokes its pooled leases).
func (c *core) ioClose(now uint64) error {
	st := uint32(C.lh_io_close(c.p, C.uint64_t(now)))
	runtime.KeepAlive(c)
	return c.err("lh_io_close", st)
}

// backendLastError is what the backend or the protocol last found wrong ("" if nothing).
func (c *core) backendLastError() string {
	s := C.GoString(C.lh_backend_last_error(c.p))
	runtime.KeepAlive(c)
	return s
}

func (c *core) statusRequest(now uint64, name string) (uint64, error) {
	np, nn := strPtr(name)
	var id C.uint64_t
	st := uint32(C.lh_status_request(c.p, C.uint64_t(now), np, nn, &id))
	runtime.KeepAlive(name)
	runtime.KeepAlive(c)
	if st != statusOK {
		return 0, c.err("lh_status_request", st)
	}
	c.statusOut++
	return uint64(id), nil
}

// statusAnswer is a copy of one lh_lock_status.
type statusAnswer struct {
	id  uint64
	st  LockStatus
	err string // why the query failed, when not empty
}

// pollStatus takes the next answered status query (id 0 when none is waiting).
func (c *core) pollStatus() (statusAnswer, error) {
	var s C.lh_lock_status
	s.struct_size = C.uint32_t(unsafe.Sizeof(s))
	st := uint32(C.lhgo_poll_status(c.p, &s))
	if st != statusOK {
		runtime.KeepAlive(c)
		return statusAnswer{}, c.err("lh_poll_status", st)
	}
	a := statusAnswer{id: uint64(s.id)}
	if a.id == 0 {
		return a, nil
	}
	c.statusOut--
	if s.ok == 0 {
		a.err = "status query failed"
		if s.error != nil && s.error_len > 0 {
			a.err = C.GoStringN((*C.char)(unsafe.Pointer(s.error)), C.int(s.error_len))
		}
		runtime.KeepAlive(c)
		return a, nil
	}
	a.st = LockStatus{
		Held:             s.held != 0,
		FencingToken:     uint64(s.fencing_token),
		RemainingTTL:     time.Duration(s.remaining_ttl_ms) * time.Millisecond,
		LastFencingToken: uint64(s.last_fencing_token),
		HolderPID:        int64(s.holder_pid),
		HeldFor:          time.Duration(s.held_for_ms) * time.Millisecond,
	}
	if s.holder_host != nil && s.holder_host_len > 0 {
		a.st.HolderHost = C.GoStringN((*C.char)(unsafe.Pointer(s.holder_host)), C.int(s.holder_host_len))
	}
	runtime.KeepAlive(c)
	return a, nil
}

// checkBackend creates and frees a handle with b, to refuse bad options at construction
// (the error's Detail is the core's reason, from lh_client_new_check).
func checkBackend(b backendOptions) error {
	k, err := newCore(defaultCoreConfig(), b, make([]byte, 32))
	if err != nil {
		return err
	}
	k.freeHandle()
	return nil
}
