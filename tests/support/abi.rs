//! Test support for the tests that drive the C ABI (`leasehold::ffi::lh_*`) from Rust the way
//! a C host does: handles freed on drop, the one seam (`lh_io_poll` and the answer functions)
//! with every borrowed pointer copied out at once, answers built as flat `lh_value` lists, and
//! a memory executor that hands `LH_IO_COMMAND` requests to `lh_memory_service_call`.
//!
//! Included with `#[path = "support/abi.rs"] mod abi;` by the tests that need it.
#![allow(dead_code)]
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::ptr::{null, null_mut};

use leasehold::ffi::*;

pub const MS: u64 = 1_000_000;

/// Every backend kind whose protocol a client speaks through the seam with calls.
pub const BACKENDS: [u32; 5] = [
    LH_BACKEND_MEMORY,
    LH_BACKEND_REDIS,
    LH_BACKEND_SQLITE,
    LH_BACKEND_POSTGRES,
    LH_BACKEND_ETCD,
];

pub fn name_of(st: lh_status) -> String {
    // SAFETY: lh_status_str returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(lh_status_str(st)) }
        .to_string_lossy()
        .into_owned()
}

#[track_caller]
pub fn expect(got: lh_status, want: lh_status) {
    assert_eq!(got, want, "got {}, want {}", name_of(got), name_of(want));
}

#[track_caller]
pub fn ok(got: lh_status) {
    expect(got, LH_OK);
}

pub fn config() -> lh_config {
    let mut cfg = MaybeUninit::<lh_config>::uninit();
    // SAFETY: valid out-pointer; lh_config_default fills every field.
    unsafe {
        lh_config_default(cfg.as_mut_ptr());
        cfg.assume_init()
    }
}

pub fn opts(ttl_ms: u64) -> lh_acquire_options {
    let mut o = MaybeUninit::<lh_acquire_options>::uninit();
    // SAFETY: valid out-pointer; the function fills every field.
    let mut o = unsafe {
        lh_acquire_options_default(o.as_mut_ptr());
        o.assume_init()
    };
    o.ttl_ms = ttl_ms;
    o
}

/// The default options of backend `kind`.
pub fn backend(kind: u32) -> lh_backend_options {
    let mut o = MaybeUninit::<lh_backend_options>::uninit();
    // SAFETY: valid out-pointer, filled completely on LH_OK.
    unsafe {
        ok(lh_backend_options_default(kind, o.as_mut_ptr()));
        o.assume_init()
    }
}

/// `lh_client_new` with `cfg` and `o`; the status on failure.
pub fn try_client(cfg: &lh_config, o: &lh_backend_options, seed: &[u8]) -> Result<H, lh_status> {
    let mut c = null_mut();
    // SAFETY: pointers to live locals.
    let st = unsafe { lh_client_new(cfg, o, seed.as_ptr(), seed.len(), &mut c) };
    if st == LH_OK {
        assert!(!c.is_null());
        Ok(H(c))
    } else {
        assert!(c.is_null(), "out written on failure");
        Err(st)
    }
}

/// A client of backend `kind` with the default config and a fixed seed of `seed` bytes.
pub fn client_of(kind: u32, seed: u8) -> H {
    try_client(&config(), &backend(kind), &[seed; 32]).expect("lh_client_new")
}

/// Owns a client handle and frees it on drop.
pub struct H(pub *mut lh_client);

// SAFETY: a handle may move between threads (one thread at a time uses it).
unsafe impl Send for H {}

impl Drop for H {
    fn drop(&mut self) {
        // SAFETY: the handle came from lh_client_new and is not used after drop.
        unsafe { lh_client_free(self.0) }
    }
}

impl H {
    pub fn last_error(&self) -> String {
        // SAFETY: live handle; the returned string is copied at once.
        unsafe { CStr::from_ptr(lh_client_last_error(self.0)) }
            .to_string_lossy()
            .into_owned()
    }

    pub fn backend_error(&self) -> String {
        // SAFETY: live handle; NUL-terminated, copied at once.
        let p = unsafe { lh_backend_last_error(self.0) };
        assert!(!p.is_null(), "lh_backend_last_error is never NULL");
        // SAFETY: as above.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    pub fn acquire(&self, now: u64, name: &[u8], o: &lh_acquire_options) -> Result<u64, lh_status> {
        let mut lease = 0;
        // SAFETY: pointers to live locals/slices.
        let st = unsafe { lh_acquire(self.0, now, name.as_ptr(), name.len(), o, &mut lease) };
        if st == LH_OK { Ok(lease) } else { Err(st) }
    }

    pub fn release(&self, now: u64, lease: u64) -> lh_status {
        // SAFETY: live handle; NULL out_releasing is documented.
        unsafe { lh_release(self.0, now, lease, null_mut()) }
    }

    pub fn timeout(&self, now: u64) -> lh_status {
        // SAFETY: live handle.
        unsafe { lh_timeout(self.0, now) }
    }

    pub fn deadline(&self) -> u64 {
        let mut d = 0;
        // SAFETY: valid out-pointer.
        ok(unsafe { lh_poll_timeout(self.0, &mut d) });
        d
    }

    pub fn state(&self, lease: u64) -> Result<u32, lh_status> {
        let mut s = 0;
        // SAFETY: valid pointer.
        let st = unsafe { lh_lease_state(self.0, lease, &mut s) };
        if st == LH_OK { Ok(s) } else { Err(st) }
    }

    pub fn valid_until(&self, lease: u64) -> u64 {
        let mut v = 0;
        // SAFETY: valid pointer.
        ok(unsafe { lh_valid_until(self.0, lease, &mut v) });
        v
    }

    pub fn fence(&self, lease: u64) -> Result<u64, lh_status> {
        let mut f = 0;
        // SAFETY: valid pointer.
        let st = unsafe { lh_fencing_token(self.0, lease, &mut f) };
        if st == LH_OK { Ok(f) } else { Err(st) }
    }

    pub fn counters(&self) -> lh_counters {
        // SAFETY: lh_counters is plain integers; zeroed is a valid value.
        let mut k: lh_counters = unsafe { std::mem::zeroed() };
        k.struct_size = size_of::<lh_counters>() as u32;
        // SAFETY: valid pointer.
        ok(unsafe { lh_counters_get(self.0, &mut k) });
        k
    }

    /// The next request, its borrowed parts copied out.
    pub fn poll(&self) -> Option<Req> {
        let mut r = MaybeUninit::<lh_io_request>::uninit();
        // SAFETY: valid out-pointer; written on LH_OK.
        ok(unsafe { lh_io_poll(self.0, r.as_mut_ptr()) });
        // SAFETY: LH_OK wrote it; the pointers are read before the next call on the handle.
        unsafe { Req::copy(&r.assume_init()) }
    }

    /// Every request queued now.
    pub fn requests(&self) -> Vec<Req> {
        let mut v = Vec::new();
        while let Some(r) = self.poll() {
            v.push(r);
            assert!(v.len() < 10_000, "requests do not drain");
        }
        v
    }

    pub fn event(&self) -> Option<lh_event> {
        let mut e = lh_event::default();
        // SAFETY: valid out-pointer.
        ok(unsafe { lh_poll_event(self.0, &mut e) });
        if e.kind == LH_EVENT_NONE {
            assert_eq!(e, lh_event::default(), "NONE carries nothing");
            None
        } else {
            Some(e)
        }
    }

    /// Every event queued now.
    pub fn events(&self) -> Vec<lh_event> {
        let mut v = Vec::new();
        while let Some(e) = self.event() {
            v.push(e);
            assert!(v.len() < 10_000, "events do not drain");
        }
        v
    }

    /// `lh_io_reply` with a built answer.
    pub fn reply(&self, now: u64, id: u64, v: &V<'_>) -> lh_status {
        let (values, data) = flat(v);
        self.reply_raw(now, id, &values, &data)
    }

    pub fn reply_raw(&self, now: u64, id: u64, values: &[lh_value], data: &[u8]) -> lh_status {
        // SAFETY: slices of live locals, read during the call.
        unsafe {
            lh_io_reply(
                self.0,
                now,
                id,
                values.as_ptr(),
                values.len(),
                data.as_ptr(),
                data.len(),
            )
        }
    }

    pub fn http_reply(&self, now: u64, id: u64, status: u32, body: &[u8]) -> lh_status {
        // SAFETY: a readable body.
        unsafe { lh_io_http_reply(self.0, now, id, status, body.as_ptr(), body.len()) }
    }

    pub fn stream_message(&self, now: u64, id: u64, line: &[u8]) -> lh_status {
        // SAFETY: a readable message.
        unsafe { lh_io_stream_message(self.0, now, id, line.as_ptr(), line.len()) }
    }

    pub fn failed(&self, now: u64, id: u64, kind: u32, msg: &[u8]) -> lh_status {
        // SAFETY: a readable message.
        unsafe { lh_io_failed(self.0, now, id, kind, msg.as_ptr(), msg.len()) }
    }

    pub fn message(&self, now: u64, channel: &[u8], payload: &[u8]) -> lh_status {
        // SAFETY: readable buffers.
        unsafe {
            lh_io_message(
                self.0,
                now,
                channel.as_ptr(),
                channel.len(),
                payload.as_ptr(),
                payload.len(),
            )
        }
    }

    pub fn connection(&self, now: u64, conn: u32, event: u32, channel: &[u8]) -> lh_status {
        // SAFETY: a readable channel.
        unsafe { lh_io_connection(self.0, now, conn, event, channel.as_ptr(), channel.len()) }
    }

    /// `lh_status_request` for `name`: its id.
    pub fn status_request(&self, now: u64, name: &[u8]) -> u64 {
        let mut id = 0;
        // SAFETY: pointers to locals.
        ok(unsafe { lh_status_request(self.0, now, name.as_ptr(), name.len(), &mut id) });
        id
    }

    /// `lh_poll_status`, its borrowed strings copied: (status, holder host, error).
    pub fn poll_status(&self) -> (lh_lock_status, Vec<u8>, Vec<u8>) {
        let mut st = MaybeUninit::<lh_lock_status>::zeroed();
        // SAFETY: valid out-pointer with its size set; the strings are copied at once.
        unsafe {
            (*st.as_mut_ptr()).struct_size = size_of::<lh_lock_status>() as u32;
            ok(lh_poll_status(self.0, st.as_mut_ptr()));
            let st = st.assume_init();
            let host = copy(st.holder_host, st.holder_host_len);
            let error = copy(st.error, st.error_len);
            (st, host, error)
        }
    }
}

/// Copies a borrowed buffer (NULL when empty, never NULL with a length).
pub fn copy(ptr: *const u8, len: usize) -> Vec<u8> {
    if ptr.is_null() {
        assert_eq!(len, 0, "NULL pointer with non-zero length");
        Vec::new()
    } else {
        assert_ne!(len, 0, "an empty borrowed buffer is NULL");
        // SAFETY: the library keeps ptr/len valid until the next call on the handle.
        unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec()
    }
}

/// A borrowed array from the library: NULL when empty.
///
/// # Safety
/// `p` points to `n` readable values when `n > 0`.
pub unsafe fn slice<'a, T>(p: *const T, n: usize) -> &'a [T] {
    if n == 0 {
        assert!(p.is_null(), "an empty borrowed array is NULL");
        &[]
    } else {
        assert!(!p.is_null());
        // SAFETY: per the contract above.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

fn c_text(p: *const std::ffi::c_char) -> Option<String> {
    // SAFETY: the library's strings are NUL-terminated, borrowed until the next call.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned())
}

/// One polled request with everything it borrowed copied out.
#[derive(Debug, Clone, PartialEq)]
pub struct Req {
    pub id: u64,
    pub kind: u32,
    pub connection: u32,
    /// COMMAND: the arguments.
    pub args: Vec<Vec<u8>>,
    /// SQL: the statements, params and data as the request laid them out.
    pub statements: Vec<lh_sql_statement>,
    pub params: Vec<lh_value>,
    /// SQL: the data buffer; HTTP: the body.
    pub data: Vec<u8>,
    pub method: Option<String>,
    pub path: Option<String>,
    pub authorization: Option<String>,
}

impl Req {
    /// Copies a polled request; `None` for `LH_IO_NONE`.
    ///
    /// # Safety
    /// `r` was just written by `lh_io_poll` and its handle was not called since.
    pub unsafe fn copy(r: &lh_io_request) -> Option<Req> {
        if r.kind == LH_IO_NONE {
            assert_eq!(r.id, 0, "NONE has id 0");
            assert!(r.argv.is_null() && r.data.is_null() && r.method.is_null());
            return None;
        }
        assert_ne!(r.id, 0, "a request id is never 0");
        // SAFETY: the request's arrays are valid for their counts until the next call.
        let (argv, statements, params) = unsafe {
            (
                slice(r.argv, r.argc as usize),
                slice(r.statements, r.nstatements as usize),
                slice(r.params, r.nparams),
            )
        };
        let args = argv.iter().map(|b| copy(b.ptr, b.len)).collect();
        let req = Req {
            id: r.id,
            kind: r.kind,
            connection: r.connection,
            args,
            statements: statements.to_vec(),
            params: params.to_vec(),
            data: copy(r.data, r.data_len),
            method: c_text(r.method),
            path: c_text(r.path),
            authorization: c_text(r.authorization),
        };
        if matches!(r.kind, LH_IO_HTTP | LH_IO_HTTP_WATCH | LH_IO_HTTP_CANCEL) && r.data_len > 0 {
            // SAFETY: the body is followed by a NUL the length does not count.
            assert_eq!(unsafe { *r.data.add(r.data_len) }, 0, "NUL after the body");
        }
        Some(req)
    }

    /// The HTTP body as JSON (`Null` when empty).
    pub fn json(&self) -> serde_json::Value {
        if self.data.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&self.data).expect("the body is JSON")
        }
    }
}

// ------------------------------------------------------------------------ answers

/// An answer value, flattened by [`flat`] into what `lh_io_reply` takes.
#[derive(Debug, Clone)]
pub enum V<'a> {
    Nil,
    Int(i64),
    Bulk(&'a [u8]),
    Status(&'a [u8]),
    Error(&'a [u8]),
    Text(&'a [u8]),
    Float(f64),
    Arr(Vec<V<'a>>),
}

/// A memory-service answer `[STATUS word, rest…]`.
pub fn word<'a>(w: &'a str, rest: Vec<V<'a>>) -> V<'a> {
    let mut items = vec![V::Status(w.as_bytes())];
    items.extend(rest);
    V::Arr(items)
}

/// The flat pre-order list and data buffer of `v`.
pub fn flat(v: &V<'_>) -> (Vec<lh_value>, Vec<u8>) {
    fn go(v: &V<'_>, out: &mut Vec<lh_value>, data: &mut Vec<u8>) {
        let mut s = |kind, b: &[u8], out: &mut Vec<lh_value>| {
            out.push(lh_value {
                kind,
                offset: data.len() as u64,
                len: b.len() as u64,
                ..lh_value::default()
            });
            data.extend_from_slice(b);
        };
        match v {
            V::Nil => out.push(lh_value {
                kind: LH_VALUE_NIL,
                ..lh_value::default()
            }),
            V::Int(i) => out.push(lh_value {
                kind: LH_VALUE_INT,
                integer: *i,
                ..lh_value::default()
            }),
            V::Float(x) => out.push(lh_value {
                kind: LH_VALUE_FLOAT,
                integer: x.to_bits() as i64,
                ..lh_value::default()
            }),
            V::Bulk(b) => s(LH_VALUE_BULK, b, out),
            V::Status(b) => s(LH_VALUE_STATUS, b, out),
            V::Error(b) => s(LH_VALUE_ERROR, b, out),
            V::Text(b) => s(LH_VALUE_TEXT, b, out),
            V::Arr(items) => {
                out.push(lh_value {
                    kind: LH_VALUE_ARRAY,
                    len: items.len() as u64,
                    ..lh_value::default()
                });
                for i in items {
                    go(i, out, data);
                }
            }
        }
    }
    let (mut out, mut data) = (Vec::new(), Vec::new());
    go(v, &mut out, &mut data);
    (out, data)
}

// ------------------------------------------------------------------ memory service

/// Owns a memory-service handle and frees it on drop.
pub struct Svc(pub *mut lh_memory_service);

// SAFETY: a service handle may move between threads (one thread at a time uses it).
unsafe impl Send for Svc {}

impl Drop for Svc {
    fn drop(&mut self) {
        // SAFETY: from lh_memory_service_new, not used after drop.
        unsafe { lh_memory_service_free(self.0) }
    }
}

pub fn memory_config() -> lh_memory_config {
    let mut c = MaybeUninit::<lh_memory_config>::uninit();
    // SAFETY: valid out-pointer; every field is written.
    unsafe {
        lh_memory_config_default(c.as_mut_ptr());
        c.assume_init()
    }
}

/// An answer of `lh_memory_service_call`, copied out of the service handle.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub dropped: bool,
    pub values: Vec<lh_value>,
    pub data: Vec<u8>,
}

impl Answer {
    /// The status words and integers of the answer, in order (for assertions).
    pub fn words(&self) -> Vec<String> {
        self.values
            .iter()
            .map(|v| match v.kind {
                LH_VALUE_INT => v.integer.to_string(),
                LH_VALUE_NIL => "nil".to_owned(),
                LH_VALUE_ARRAY => format!("[{}]", v.len),
                _ => {
                    let b = &self.data[v.offset as usize..(v.offset + v.len) as usize];
                    let t = String::from_utf8_lossy(b).into_owned();
                    if v.kind == LH_VALUE_ERROR {
                        format!("-{t}")
                    } else {
                        t
                    }
                }
            })
            .collect()
    }
}

impl Svc {
    pub fn new() -> Svc {
        let cfg = memory_config();
        let mut p = null_mut();
        // SAFETY: pointers to live locals.
        ok(unsafe { lh_memory_service_new(&cfg, &mut p) });
        assert!(!p.is_null());
        Svc(p)
    }

    pub fn connect(&self) -> u64 {
        let mut id = 0;
        // SAFETY: live handle, valid out-pointer.
        ok(unsafe { lh_memory_service_connect(self.0, &mut id) });
        id
    }

    pub fn last_error(&self) -> String {
        // SAFETY: live handle; the string is copied at once.
        unsafe { CStr::from_ptr(lh_memory_service_last_error(self.0)) }
            .to_string_lossy()
            .into_owned()
    }

    /// `lh_memory_service_call` with `args`, the answer copied out.
    pub fn call(&self, conn: u64, now: u64, args: &[&[u8]]) -> Result<Answer, lh_status> {
        let argv: Vec<lh_bytes> = args
            .iter()
            .map(|a| lh_bytes {
                ptr: a.as_ptr(),
                len: a.len(),
            })
            .collect();
        let mut a = answer_out();
        // SAFETY: argv and its buffers live for the call; valid out-pointer.
        let st = unsafe {
            lh_memory_service_call(self.0, conn, now, argv.as_ptr(), argv.len() as u32, &mut a)
        };
        if st != LH_OK {
            return Err(st);
        }
        assert_eq!(a.struct_size as usize, size_of::<lh_memory_answer>());
        // SAFETY: borrowed from the service until its next call; copied at once.
        let values = unsafe { slice(a.values, a.nvalues) }.to_vec();
        let answer = Answer {
            dropped: a.dropped == 1,
            values,
            data: copy(a.data, a.data_len),
        };
        assert!(a.dropped <= 1);
        if answer.dropped {
            assert!(answer.values.is_empty() && answer.data.is_empty());
        }
        Ok(answer)
    }

    pub fn status(&self, now: u64, name: &[u8]) -> lh_memory_status {
        // SAFETY: plain data; zeroed is valid.
        let mut st: lh_memory_status = unsafe { std::mem::zeroed() };
        st.struct_size = size_of::<lh_memory_status>() as u32;
        // SAFETY: valid pointers.
        ok(unsafe { lh_memory_service_status(self.0, now, name.as_ptr(), name.len(), &mut st) });
        st
    }

    pub fn stats(&self) -> lh_memory_stats {
        // SAFETY: plain integers; zeroed is valid.
        let mut k: lh_memory_stats = unsafe { std::mem::zeroed() };
        k.struct_size = size_of::<lh_memory_stats>() as u32;
        // SAFETY: valid pointer.
        ok(unsafe { lh_memory_service_stats_get(self.0, &mut k) });
        k
    }

    /// Takes the next release notification of `conn`.
    pub fn released(&self, conn: u64) -> Option<Vec<u8>> {
        let (mut p, mut n) = (null(), 0usize);
        // SAFETY: valid out-pointers; the name is copied at once.
        ok(unsafe { lh_memory_service_poll_released(self.0, conn, &mut p, &mut n) });
        (!p.is_null()).then(|| copy(p, n))
    }

    /// Sets the fault switches of `conn` (a test hook of the `testing` feature).
    #[cfg(feature = "testing")]
    pub fn set_faults(&self, conn: u64, flags: u32, drop_next: u32) {
        let f = lh_memory_faults {
            struct_size: size_of::<lh_memory_faults>() as u32,
            flags,
            drop_next_responses: drop_next,
            _reserved: 0,
        };
        // SAFETY: live handle, valid pointer.
        ok(unsafe { lh_memory_service_set_faults(self.0, conn, &f) });
    }
}

impl Default for Svc {
    fn default() -> Self {
        Svc::new()
    }
}

pub fn answer_out() -> lh_memory_answer {
    lh_memory_answer {
        struct_size: size_of::<lh_memory_answer>() as u32,
        dropped: 7,
        values: null(),
        nvalues: 7,
        data: null(),
        data_len: 7,
    }
}

/// A memory-backend client with its own connection to a service: the executor every
/// binding's memory helper is.
pub struct Mem {
    pub h: H,
    pub conn: u64,
}

impl Mem {
    pub fn new(svc: &Svc, seed: u8) -> Mem {
        Mem {
            h: client_of(LH_BACKEND_MEMORY, seed),
            conn: svc.connect(),
        }
    }

    /// Runs every pending request on the service and answers it (the borrowed answer goes
    /// to the client before the service is called again), then hands each queued release
    /// notification to the client. Returns the requests run.
    pub fn serve(&self, svc: &Svc, now: u64) -> Vec<Req> {
        let mut ran = Vec::new();
        while let Some(r) = self.h.poll() {
            assert_eq!(
                (r.kind, r.connection),
                (LH_IO_COMMAND, LH_CONNECTION_COMMANDS)
            );
            let argv: Vec<lh_bytes> = r
                .args
                .iter()
                .map(|a| lh_bytes {
                    ptr: a.as_ptr(),
                    len: a.len(),
                })
                .collect();
            let mut a = answer_out();
            // SAFETY: live handles; argv borrows `r`; the answer borrows the service and is
            // handed to the client before the service's next call.
            unsafe {
                ok(lh_memory_service_call(
                    svc.0,
                    self.conn,
                    now,
                    argv.as_ptr(),
                    argv.len() as u32,
                    &mut a,
                ));
                if a.dropped == 1 {
                    ok(lh_io_failed(
                        self.h.0,
                        now,
                        r.id,
                        LH_FAILURE_TRANSPORT,
                        b"dropped".as_ptr(),
                        7,
                    ));
                } else {
                    ok(lh_io_reply(
                        self.h.0, now, r.id, a.values, a.nvalues, a.data, a.data_len,
                    ));
                }
            }
            self.notify(svc, now);
            ran.push(r);
            assert!(ran.len() < 10_000, "the client keeps asking");
        }
        self.notify(svc, now);
        ran
    }

    /// Hands every queued release notification of the connection to the client.
    pub fn notify(&self, svc: &Svc, now: u64) -> usize {
        let mut n = 0;
        while let Some(name) = svc.released(self.conn) {
            ok(self.h.message(now, &name, &[]));
            n += 1;
        }
        n
    }
}
