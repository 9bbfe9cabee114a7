package leasehold

// cgo wrappers of the SQL (lh_sql_*) and etcd (lh_http_*, lh_etcd_*) ABIs: requests are
// copied out of the handle at once (they borrow it until the next call), results go in as
// flat lh_value lists like Redis replies.

/*
#include <stdlib.h>
#include "leasehold.h"

// The library may hand out a dangling, non-NULL pointer (its alignment, like 0x8) for an
// empty buffer. Go's runtime refuses such values in pointer-typed variables (a stack copy
// throws "invalid pointer found on stack"), so empty buffers cross as NULL.
static lh_status lh_go_sql_poll_request(lh_client *c, lh_sql_request *out) {
	lh_status st = lh_sql_poll_request(c, out);
	if (st == LH_OK) {
		if (out->nstatements == 0) out->statements = NULL;
		if (out->nparams == 0) out->params = NULL;
		if (out->data_len == 0) out->data = NULL;
	}
	return st;
}

static lh_status lh_go_poll_status(lh_client *c, lh_lock_status *out) {
	lh_status st = lh_poll_status(c, out);
	if (st == LH_OK) {
		if (out->holder_host_len == 0) out->holder_host = NULL;
		if (out->error_len == 0) out->error = NULL;
	}
	return st;
}

static lh_status lh_go_http_poll_request(lh_client *c, lh_http_request *out) {
	lh_status st = lh_http_poll_request(c, out);
	if (st == LH_OK && out->body_len == 0) out->body = NULL;
	return st;
}

static lh_status lh_go_sql_last_error(const lh_client *c, const uint8_t **text, size_t *len) {
	lh_status st = lh_sql_last_error(c, text, len);
	if (st == LH_OK && *len == 0) *text = NULL;
	return st;
}

static lh_status lh_go_etcd_last_error(const lh_client *c, const uint8_t **text, size_t *len) {
	lh_status st = lh_etcd_last_error(c, text, len);
	if (st == LH_OK && *len == 0) *text = NULL;
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

// The SQL and etcd ABIs' constants, checked against the header in init.
const (
	dialectSQLite    = 1
	dialectPostgres  = 2
	sqlConnCommands  = 1
	sqlConnListener  = 2
	valueText        = 7
	valueFloat       = 8
	paramMonotonicNs = 20
	paramWallUs      = 21
	paramBootID      = 22
	paramPid         = 23
	paramHostName    = 24
	sqlFailTransport = 1
	sqlFailDatabase  = 2
	maxSQLMessage    = 1 << 16
	httpUnary        = 1
	httpWatch        = 2
	httpCancelWatch  = 3
	maxHTTPBody      = 1 << 20
)

func init() {
	if abiErr != nil {
		return
	}
	pairs := [][2]uint64{
		{C.LH_DIALECT_SQLITE, dialectSQLite}, {C.LH_DIALECT_POSTGRES, dialectPostgres},
		{C.LH_SQL_CONNECTION_COMMANDS, sqlConnCommands}, {C.LH_SQL_CONNECTION_LISTENER, sqlConnListener},
		{C.LH_VALUE_TEXT, valueText}, {C.LH_VALUE_FLOAT, valueFloat},
		{C.LH_PARAM_HOST_MONOTONIC_NS, paramMonotonicNs}, {C.LH_PARAM_HOST_WALL_US, paramWallUs},
		{C.LH_PARAM_HOST_BOOT_ID, paramBootID}, {C.LH_PARAM_HOST_PID, paramPid},
		{C.LH_PARAM_HOST_NAME, paramHostName},
		{C.LH_SQL_FAILURE_TRANSPORT, sqlFailTransport}, {C.LH_SQL_FAILURE_DATABASE, sqlFailDatabase},
		{C.LH_MAX_SQL_MESSAGE, maxSQLMessage},
		{C.LH_HTTP_UNARY, httpUnary}, {C.LH_HTTP_WATCH, httpWatch}, {C.LH_HTTP_CANCEL_WATCH, httpCancelWatch},
		{C.LH_MAX_HTTP_BODY, maxHTTPBody},
	}
	for i, p := range pairs {
		if p[0] != p[1] {
			abiErr = fmt.Errorf("leasehold: backend constant #%d differs between leasehold.h (%d) and the Go binding (%d)", i, p[0], p[1])
			return
		}
	}
}

// sqlProtocol selects lh_client_new_sql.
type sqlProtocol struct {
	dialect       uint32
	busyTimeoutMs uint64 // 0: the library's default
	// PostgreSQL: lh_sql_options.asynchronous_commit
	asynchronousCommit bool
}

// etcdProtocol selects lh_client_new_etcd.
type etcdProtocol struct {
	user, password string
}

func cConfig(cfg coreConfig) C.lh_config {
	var c C.lh_config
	C.lh_config_default(&c)
	c.drift_ppm = C.uint32_t(cfg.driftPPM)
	c.drift_fixed_ns = C.uint64_t(cfg.driftFixedNs)
	c.renew_jitter_ppm = C.uint32_t(cfg.renewJitterPPM)
	c.fail_budget = C.uint32_t(cfg.failBudget)
	c.request_timeout_ns = C.uint64_t(cfg.requestTimeoutNs)
	c.backoff_base_ns = C.uint64_t(cfg.backoffBaseNs)
	c.backoff_cap_ns = C.uint64_t(cfg.backoffCapNs)
	c.max_ttl_ms = C.uint64_t(cfg.maxTTLms)
	c.max_leases = C.uint32_t(cfg.maxLeases)
	c.notifications = 0
	if cfg.notifications {
		c.notifications = 1
	}
	return c
}

// newCoreSQL creates a core handle with the SQL protocol attached.
func newCoreSQL(cfg coreConfig, sp sqlProtocol, seed []byte) (*core, error) {
	c := cConfig(cfg)
	var o C.lh_sql_options
	C.lh_sql_options_default(&o)
	o.dialect = C.uint32_t(sp.dialect)
	if sp.busyTimeoutMs > 0 {
		o.busy_timeout_ms = C.uint64_t(sp.busyTimeoutMs)
	}
	if sp.asynchronousCommit {
		o.asynchronous_commit = 1
	}
	p, n := bytesPtr(seed)
	var out *C.lh_client
	st := uint32(C.lh_client_new_sql(&c, &o, p, n, &out))
	runtime.KeepAlive(seed)
	if st != statusOK {
		return nil, &StatusError{Status: st, Name: statusName(st), Op: "lh_client_new_sql"}
	}
	return &core{p: out}, nil
}

// newCoreEtcd creates a core handle with the etcd protocol attached.
func newCoreEtcd(cfg coreConfig, ep etcdProtocol, seed []byte) (*core, error) {
	c := cConfig(cfg)
	var o C.lh_etcd_options
	C.lh_etcd_options_default(&o)
	if ep.user != "" {
		o.user, o.user_len = strPtr(ep.user)
		o.password, o.password_len = strPtr(ep.password)
	}
	p, n := bytesPtr(seed)
	var out *C.lh_client
	st := uint32(C.lh_client_new_etcd(&c, &o, p, n, &out))
	runtime.KeepAlive(seed)
	runtime.KeepAlive(ep)
	if st != statusOK {
		return nil, &StatusError{Status: st, Name: statusName(st), Op: "lh_client_new_etcd"}
	}
	return &core{p: out}, nil
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

// sqlRequest is a copy of one lh_sql_request: it owns its memory.
type sqlRequest struct {
	id         uint64
	connection uint32
	statements []sqlStatement
}

// sqlPollRequest takes the next SQL request (nil when none is left).
func (c *core) sqlPollRequest() (*sqlRequest, error) {
	var r C.lh_sql_request
	st := uint32(C.lh_go_sql_poll_request(c.p, &r))
	if st != statusOK {
		runtime.KeepAlive(c)
		return nil, c.err("lh_sql_poll_request", st)
	}
	if r.id == 0 {
		return nil, nil
	}
	data := unsafe.Slice((*byte)(unsafe.Pointer(r.data)), int(r.data_len))
	params := unsafe.Slice(r.params, int(r.nparams))
	q := &sqlRequest{id: uint64(r.id), connection: uint32(r.connection)}
	for _, s := range unsafe.Slice(r.statements, int(r.nstatements)) {
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
	runtime.KeepAlive(c)
	return q, nil
}

func (c *core) sqlResult(now, id uint64, vals []lhValue, data []byte) error {
	var vp *C.lh_value
	if len(vals) > 0 {
		vp = &vals[0]
	}
	dp, dn := bytesPtr(data)
	st := uint32(C.lh_sql_result(c.p, C.uint64_t(now), C.uint64_t(id), vp, C.size_t(len(vals)), dp, dn))
	runtime.KeepAlive(vals)
	runtime.KeepAlive(data)
	runtime.KeepAlive(c)
	return c.err("lh_sql_result", st)
}

func (c *core) sqlFailed(now, id uint64, kind uint32, msg string) error {
	if len(msg) > maxSQLMessage {
		msg = msg[:maxSQLMessage]
	}
	mp, mn := strPtr(msg)
	st := uint32(C.lh_sql_failed(c.p, C.uint64_t(now), C.uint64_t(id), C.uint32_t(kind), mp, mn))
	runtime.KeepAlive(msg)
	runtime.KeepAlive(c)
	return c.err("lh_sql_failed", st)
}

func (c *core) sqlNotification(now uint64, channel, payload string) error {
	cp, cn := strPtr(channel)
	pp, pn := strPtr(payload)
	st := uint32(C.lh_sql_notification(c.p, C.uint64_t(now), cp, cn, pp, pn))
	runtime.KeepAlive(channel)
	runtime.KeepAlive(payload)
	runtime.KeepAlive(c)
	return c.err("lh_sql_notification", st)
}

func (c *core) sqlConnectionReset(now uint64, conn uint32) error {
	st := uint32(C.lh_sql_connection_reset(c.p, C.uint64_t(now), C.uint32_t(conn)))
	runtime.KeepAlive(c)
	return c.err("lh_sql_connection_reset", st)
}

func (c *core) sqlLastError() string {
	var p *C.uint8_t
	var n C.size_t
	if st := uint32(C.lh_go_sql_last_error(c.p, &p, &n)); st != statusOK || n == 0 {
		return ""
	}
	s := C.GoStringN((*C.char)(unsafe.Pointer(p)), C.int(n))
	runtime.KeepAlive(c)
	return s
}

// httpRequest is a copy of one lh_http_request: it owns its memory.
type httpRequest struct {
	id            uint64
	kind          uint32
	method, path  string
	body          []byte
	authorization string
}

// httpPollRequest takes the next HTTP request (nil when none is left).
func (c *core) httpPollRequest() (*httpRequest, error) {
	var r C.lh_http_request
	st := uint32(C.lh_go_http_poll_request(c.p, &r))
	if st != statusOK {
		runtime.KeepAlive(c)
		return nil, c.err("lh_http_poll_request", st)
	}
	if r.id == 0 {
		return nil, nil
	}
	q := &httpRequest{id: uint64(r.id), kind: uint32(r.kind)}
	if r.method != nil {
		q.method = C.GoString(r.method)
	}
	if r.path != nil {
		q.path = C.GoString(r.path)
	}
	if r.body != nil && r.body_len > 0 {
		q.body = C.GoBytes(unsafe.Pointer(r.body), C.int(r.body_len))
	}
	if r.authorization != nil {
		q.authorization = C.GoString(r.authorization)
	}
	runtime.KeepAlive(c)
	return q, nil
}

func (c *core) httpReply(now, id uint64, status int, body []byte) error {
	bp, bn := bytesPtr(body)
	st := uint32(C.lh_http_reply(c.p, C.uint64_t(now), C.uint64_t(id), C.uint32_t(status), bp, bn))
	runtime.KeepAlive(body)
	runtime.KeepAlive(c)
	return c.err("lh_http_reply", st)
}

func (c *core) httpStreamMessage(now, id uint64, line []byte) error {
	lp, ln := bytesPtr(line)
	st := uint32(C.lh_http_stream_message(c.p, C.uint64_t(now), C.uint64_t(id), lp, ln))
	runtime.KeepAlive(line)
	runtime.KeepAlive(c)
	return c.err("lh_http_stream_message", st)
}

func (c *core) httpFailed(now, id uint64, msg string) error {
	if len(msg) > maxHTTPBody {
		msg = msg[:maxHTTPBody]
	}
	mp, mn := strPtr(msg)
	st := uint32(C.lh_http_failed(c.p, C.uint64_t(now), C.uint64_t(id), mp, mn))
	runtime.KeepAlive(msg)
	runtime.KeepAlive(c)
	return c.err("lh_http_failed", st)
}

// etcdClose revokes the pooled etcd leases (lh_etcd_close); the requests follow.
func (c *core) etcdClose(now uint64) error {
	st := uint32(C.lh_etcd_close(c.p, C.uint64_t(now)))
	runtime.KeepAlive(c)
	return c.err("lh_etcd_close", st)
}

func (c *core) etcdLastError() string {
	var p *C.uint8_t
	var n C.size_t
	if st := uint32(C.lh_go_etcd_last_error(c.p, &p, &n)); st != statusOK || n == 0 {
		return ""
	}
	s := C.GoStringN((*C.char)(unsafe.Pointer(p)), C.int(n))
	runtime.KeepAlive(c)
	return s
}

// EtcdCounters mirrors the core's lh_etcd_counters: what the etcd protocol saw.
type EtcdCounters struct {
	Requests          uint64 // requests emitted (cancellations not included)
	LeasesGranted     uint64
	Txns              uint64 // acquire transactions sent
	Watches           uint64 // watches opened on a predecessor
	Wakeups           uint64 // waiters woken by their predecessor's deletion (or a cut watch)
	WaitingKeepalives uint64
	WaitersExpired    uint64 // waiters whose etcd lease was gone (they rejoined the queue)
	ErrorReplies      uint64
	GarbageReplies    uint64
	TransportFailures uint64
	StaleReplies      uint64
}

func (c *core) etcdCounters() (EtcdCounters, error) {
	var k C.lh_etcd_counters
	k.struct_size = C.uint32_t(unsafe.Sizeof(k))
	st := uint32(C.lh_etcd_counters_get(c.p, &k))
	runtime.KeepAlive(c)
	if st != statusOK {
		return EtcdCounters{}, c.err("lh_etcd_counters_get", st)
	}
	return EtcdCounters{
		Requests: uint64(k.requests), LeasesGranted: uint64(k.leases_granted), Txns: uint64(k.txns),
		Watches: uint64(k.watches), Wakeups: uint64(k.wakeups), WaitingKeepalives: uint64(k.waiting_keepalives),
		WaitersExpired: uint64(k.waiters_expired), ErrorReplies: uint64(k.error_replies),
		GarbageReplies: uint64(k.garbage_replies), TransportFailures: uint64(k.transport_failures),
		StaleReplies: uint64(k.stale_replies),
	}, nil
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
	st := uint32(C.lh_go_poll_status(c.p, &s))
	if st != statusOK {
		runtime.KeepAlive(c)
		return statusAnswer{}, c.err("lh_poll_status", st)
	}
	a := statusAnswer{id: uint64(s.id)}
	if a.id == 0 {
		return a, nil
	}
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
