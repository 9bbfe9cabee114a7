//! Drives the SQL exports (`lh_client_new_sql`, `lh_sql_poll_request`, `lh_sql_result`, …)
//! from Rust as a C host would: statements and parameters read in place from the request's
//! data buffer, executed on a real SQLite file, rows flattened into `lh_value`s. Hostile
//! input is an error that changes nothing.
#![allow(unsafe_code)]
// A host reads clocks: that is its job (the core never does).
#![allow(clippy::disallowed_methods)]

use std::mem::MaybeUninit;
use std::ptr::{null, null_mut};

use leasehold::ffi::*;
use rusqlite::types::{Value, ValueRef};

const MS: u64 = 1_000_000;

struct H(*mut lh_client);

impl Drop for H {
    fn drop(&mut self) {
        // SAFETY: from lh_client_new*, not used after drop.
        unsafe { lh_client_free(self.0) }
    }
}

fn config() -> lh_config {
    let mut cfg = MaybeUninit::<lh_config>::uninit();
    // SAFETY: valid out-pointer, filled completely.
    unsafe {
        lh_config_default(cfg.as_mut_ptr());
        cfg.assume_init()
    }
}

fn options(dialect: u32) -> lh_sql_options {
    let mut o = MaybeUninit::<lh_sql_options>::uninit();
    // SAFETY: valid out-pointer, filled completely.
    let mut o = unsafe {
        lh_sql_options_default(o.as_mut_ptr());
        o.assume_init()
    };
    o.dialect = dialect;
    o
}

fn sql_client(dialect: u32, seed: u8) -> H {
    let (cfg, opts, seed) = (config(), options(dialect), [seed; 32]);
    let mut c = null_mut();
    // SAFETY: pointers to locals.
    let st = unsafe { lh_client_new_sql(&cfg, &opts, seed.as_ptr(), seed.len(), &mut c) };
    assert_eq!(st, LH_OK);
    H(c)
}

fn now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec * 1_000_000_000 + ts.tv_nsec) as u64
}

/// Runs every request of the handle on `conn`, as a C executor would.
fn run_requests(h: &H, conn: &rusqlite::Connection) -> usize {
    let mut ran = 0;
    loop {
        let mut r = MaybeUninit::<lh_sql_request>::uninit();
        // SAFETY: valid out-pointer; the request borrows the handle until the next call.
        let r = unsafe {
            assert_eq!(lh_sql_poll_request(h.0, r.as_mut_ptr()), LH_OK);
            r.assume_init()
        };
        if r.id == 0 {
            return ran;
        }
        ran += 1;
        assert_eq!(r.connection, LH_SQL_CONNECTION_COMMANDS);
        // An empty array is NULL: a host need not dereference it, nor see a dangling pointer.
        assert_eq!(r.params.is_null(), r.nparams == 0);
        // SAFETY: arrays of the announced lengths, borrowed until the next call.
        let (stmts, params, data) = unsafe {
            (
                slice(r.statements, r.nstatements as usize),
                slice(r.params, r.nparams),
                slice(r.data, r.data_len),
            )
        };
        let at = |o: u64, l: u64| &data[o as usize..(o + l) as usize];
        let mono = now() as i64;
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as i64;
        let mut results: Vec<Vec<Vec<Value>>> = Vec::new();
        let mut failure = None;
        for s in stmts {
            assert_eq!(
                data[(s.sql_offset + s.sql_len) as usize],
                0,
                "NUL after SQL"
            );
            let sql = std::str::from_utf8(at(s.sql_offset, s.sql_len)).unwrap();
            let ps = &params[s.first_param as usize..(s.first_param + s.nparams) as usize];
            let bound: Vec<Value> = ps
                .iter()
                .map(|p| match p.kind {
                    LH_VALUE_NIL => Value::Null,
                    LH_VALUE_INT => Value::Integer(p.integer),
                    LH_VALUE_TEXT => {
                        Value::Text(String::from_utf8(at(p.offset, p.len).to_vec()).unwrap())
                    }
                    LH_VALUE_BULK => Value::Blob(at(p.offset, p.len).to_vec()),
                    LH_PARAM_HOST_MONOTONIC_NS => Value::Integer(mono),
                    LH_PARAM_HOST_WALL_US => Value::Integer(wall),
                    LH_PARAM_HOST_BOOT_ID => Value::Text(
                        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                            .unwrap()
                            .trim()
                            .into(),
                    ),
                    LH_PARAM_HOST_PID => Value::Integer(i64::from(std::process::id())),
                    LH_PARAM_HOST_NAME => Value::Text("ffi-test".into()),
                    k => panic!("unknown parameter kind {k}"),
                })
                .collect();
            let rows = (|| -> rusqlite::Result<Vec<Vec<Value>>> {
                let mut st = conn.prepare(sql)?;
                let n = st.column_count();
                let mut q = st.query(rusqlite::params_from_iter(bound))?;
                let mut rows = Vec::new();
                while let Some(row) = q.next()? {
                    rows.push(
                        (0..n)
                            .map(|i| row.get::<_, Value>(i))
                            .collect::<Result<_, _>>()?,
                    );
                }
                Ok(rows)
            })();
            match rows {
                Ok(rows) => results.push(rows),
                Err(e) => {
                    failure = Some(e.to_string());
                    break;
                }
            }
        }
        if let Some(msg) = failure {
            if !conn.is_autocommit() {
                conn.execute_batch("ROLLBACK").unwrap();
            }
            // SAFETY: a live handle; the message is read during the call.
            let st = unsafe {
                lh_sql_failed(
                    h.0,
                    now(),
                    r.id,
                    LH_SQL_FAILURE_DATABASE,
                    msg.as_ptr(),
                    msg.len(),
                )
            };
            assert_eq!(st, LH_OK);
            continue;
        }
        let (mut values, mut buf) = (Vec::new(), Vec::<u8>::new());
        let arr = |n: usize| lh_value {
            kind: LH_VALUE_ARRAY,
            len: n as u64,
            ..lh_value::default()
        };
        values.push(arr(results.len()));
        for rows in &results {
            values.push(arr(rows.len()));
            for row in rows {
                values.push(arr(row.len()));
                for v in row {
                    let mut s = |kind, b: &[u8]| {
                        values.push(lh_value {
                            kind,
                            offset: buf.len() as u64,
                            len: b.len() as u64,
                            ..lh_value::default()
                        });
                        buf.extend_from_slice(b);
                    };
                    match ValueRef::from(v) {
                        ValueRef::Null => values.push(lh_value {
                            kind: LH_VALUE_NIL,
                            ..lh_value::default()
                        }),
                        ValueRef::Integer(i) => values.push(lh_value {
                            kind: LH_VALUE_INT,
                            integer: i,
                            ..lh_value::default()
                        }),
                        ValueRef::Real(x) => values.push(lh_value {
                            kind: LH_VALUE_FLOAT,
                            integer: x.to_bits() as i64,
                            ..lh_value::default()
                        }),
                        ValueRef::Text(t) => s(LH_VALUE_TEXT, t),
                        ValueRef::Blob(b) => s(LH_VALUE_BULK, b),
                    }
                }
            }
        }
        // SAFETY: arrays of the given lengths, read during the call.
        let st = unsafe {
            lh_sql_result(
                h.0,
                now(),
                r.id,
                values.as_ptr(),
                values.len(),
                buf.as_ptr(),
                buf.len(),
            )
        };
        assert_eq!(st, LH_OK);
    }
}

#[derive(Debug, PartialEq)]
enum Got {
    Acquired(u64),
    Failed(u32),
    Other,
}

fn poll_event(h: &H) -> Option<Got> {
    let mut o = MaybeUninit::<lh_output>::uninit();
    // SAFETY: valid out-pointer.
    let o = unsafe {
        assert_eq!(lh_poll_output(h.0, o.as_mut_ptr()), LH_OK);
        o.assume_init()
    };
    match o.kind {
        LH_OUTPUT_NONE => None,
        LH_OUTPUT_ACQUIRED => Some(Got::Acquired(o.fencing_token)),
        LH_OUTPUT_ACQUIRE_FAILED => Some(Got::Failed(o.reason)),
        _ => Some(Got::Other),
    }
}

fn acquire(h: &H, conn: &rusqlite::Connection, name: &str) -> (u64, Got) {
    let mut opts = MaybeUninit::<lh_acquire_options>::uninit();
    let mut lease = 0u64;
    // SAFETY: valid pointers.
    unsafe {
        lh_acquire_options_default(opts.as_mut_ptr());
        let mut opts = opts.assume_init();
        opts.ttl_ms = 5_000;
        assert_eq!(
            lh_acquire(h.0, now(), name.as_ptr(), name.len(), &opts, &mut lease),
            LH_OK
        );
    }
    assert!(run_requests(h, conn) >= 1);
    let got = std::iter::from_fn(|| poll_event(h))
        .find(|g| *g != Got::Other)
        .unwrap();
    (lease, got)
}

fn last_error(h: &H) -> String {
    let (mut p, mut n) = (null(), 0usize);
    // SAFETY: valid out-pointers; the text borrows the handle, copied at once.
    unsafe {
        assert_eq!(lh_sql_last_error(h.0, &mut p, &mut n), LH_OK);
        assert_eq!(p.is_null(), n == 0, "an empty text is NULL");
        String::from_utf8_lossy(slice(p, n)).into_owned()
    }
}

/// A borrowed array from the library: NULL when empty.
///
/// # Safety
/// `p` points to `n` readable values when `n > 0`.
unsafe fn slice<'a, T>(p: *const T, n: usize) -> &'a [T] {
    if n == 0 {
        &[]
    } else {
        // SAFETY: per the contract above.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

fn tmp_db(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("lh-ffi-sql-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d.join("locks.sqlite3")
}

#[test]
fn two_handles_take_turns_on_a_real_sqlite_file_through_the_abi() {
    let db = tmp_db("turns");
    let (ca, cb) = (
        rusqlite::Connection::open(&db).unwrap(),
        rusqlite::Connection::open(&db).unwrap(),
    );
    let (a, b) = (
        sql_client(LH_DIALECT_SQLITE, 1),
        sql_client(LH_DIALECT_SQLITE, 2),
    );
    let (la, got) = acquire(&a, &ca, "jobs");
    let Got::Acquired(fa) = got else {
        panic!("{got:?} ({})", last_error(&a))
    };
    assert_eq!(
        acquire(&b, &cb, "jobs").1,
        Got::Failed(LH_REASON_WAIT_EXHAUSTED)
    );
    // SAFETY: a live handle and lease.
    assert_eq!(unsafe { lh_release(a.0, now(), la) }, LH_OK);
    run_requests(&a, &ca);
    let Got::Acquired(fb) = acquire(&b, &cb, "jobs").1 else {
        panic!("{}", last_error(&b))
    };
    assert!(fb > fa, "{fb} > {fa}");
    // Status through the ABI.
    let mut id = 0u64;
    // SAFETY: valid pointers.
    unsafe {
        assert_eq!(
            lh_sql_status_request(b.0, now(), b"jobs".as_ptr(), 4, &mut id),
            LH_OK
        );
    }
    run_requests(&b, &cb);
    let mut st = MaybeUninit::<lh_sql_status>::zeroed();
    // SAFETY: valid pointer with its struct_size set.
    let st = unsafe {
        (*st.as_mut_ptr()).struct_size = size_of::<lh_sql_status>() as u32;
        assert_eq!(lh_sql_poll_status(b.0, st.as_mut_ptr()), LH_OK);
        st.assume_init()
    };
    assert_eq!((st.id, st.ok, st.held, st.fencing_token), (id, 1, 1, fb));
    assert_eq!(st.last_fencing_token, fb);
    // SAFETY: borrowed until the next call on b.
    let host = unsafe { slice(st.holder_host, st.holder_host_len) };
    assert_eq!(host, b"ffi-test");
}

#[test]
fn a_foreign_table_is_reported_through_lh_sql_last_error() {
    let db = tmp_db("foreign");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch("CREATE TABLE leasehold_fences (name TEXT PRIMARY KEY, fence TEXT)")
        .unwrap();
    let h = sql_client(LH_DIALECT_SQLITE, 3);
    assert_eq!(
        acquire(&h, &conn, "jobs").1,
        Got::Failed(LH_REASON_UNAVAILABLE)
    );
    assert!(
        last_error(&h).contains("leasehold_fences"),
        "{}",
        last_error(&h)
    );
}

#[test]
fn hostile_input_is_an_error_that_changes_nothing() {
    let (cfg, seed) = (config(), [4u8; 32]);
    let mut c = null_mut();
    let mut bad = options(9);
    // SAFETY: pointers to locals or NULL, which must be reported.
    unsafe {
        assert_eq!(
            lh_client_new_sql(&cfg, &bad, seed.as_ptr(), 32, &mut c),
            LH_ERR_INVALID_ENUM
        );
        assert_eq!(
            lh_client_new_sql(&cfg, null(), seed.as_ptr(), 32, &mut c),
            LH_ERR_NULL_ARGUMENT
        );
        bad = options(LH_DIALECT_POSTGRES);
        bad.busy_timeout_ms = u64::MAX;
        assert_eq!(
            lh_client_new_sql(&cfg, &bad, seed.as_ptr(), 32, &mut c),
            LH_ERR_INVALID_CONFIG
        );
        bad = options(LH_DIALECT_POSTGRES);
        bad.struct_size = 4;
        assert_eq!(
            lh_client_new_sql(&cfg, &bad, seed.as_ptr(), 32, &mut c),
            LH_ERR_STRUCT_SIZE
        );
        bad = options(LH_DIALECT_POSTGRES);
        bad.asynchronous_commit = 2;
        assert_eq!(
            lh_client_new_sql(&cfg, &bad, seed.as_ptr(), 32, &mut c),
            LH_ERR_INVALID_CONFIG
        );
    }
    assert!(c.is_null());
    // A host built before asynchronous_commit (a 16-byte struct) still works: the field it
    // does not know is 0, whatever lies past its struct.
    let mut old = options(LH_DIALECT_POSTGRES);
    old.struct_size = 16;
    old.asynchronous_commit = 7;
    // SAFETY: a local with its struct_size set.
    let st = unsafe { lh_client_new_sql(&cfg, &old, seed.as_ptr(), 32, &mut c) };
    assert_eq!(st, LH_OK);
    // SAFETY: the handle just created, freed once.
    unsafe { lh_client_free(c) };
    let h = sql_client(LH_DIALECT_POSTGRES, 5);
    let mut lease = 0u64;
    let mut r = MaybeUninit::<lh_sql_request>::uninit();
    // SAFETY: as above.
    unsafe {
        let mut o = MaybeUninit::<lh_acquire_options>::uninit();
        lh_acquire_options_default(o.as_mut_ptr());
        assert_eq!(
            lh_acquire(h.0, MS, b"n".as_ptr(), 1, o.as_ptr(), &mut lease),
            LH_OK
        );
        assert_eq!(lh_sql_poll_request(h.0, r.as_mut_ptr()), LH_OK);
        let id = r.assume_init().id;
        assert_ne!(id, 0);
        let int = lh_value {
            kind: LH_VALUE_INT,
            ..lh_value::default()
        };
        let status = lh_value {
            kind: LH_VALUE_STATUS,
            ..lh_value::default()
        };
        for vals in [vec![int], vec![status], vec![]] {
            assert_eq!(
                lh_sql_result(h.0, 2 * MS, id, vals.as_ptr(), vals.len(), null(), 0),
                LH_ERR_INVALID_REPLY
            );
        }
        assert_eq!(
            lh_sql_result(h.0, 2 * MS, id, null(), 0, null(), 0),
            LH_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            lh_sql_failed(h.0, 2 * MS, id, 7, null(), 0),
            LH_ERR_INVALID_ENUM
        );
        assert_eq!(lh_sql_connection_reset(h.0, 2 * MS, 0), LH_ERR_INVALID_ENUM);
        assert_eq!(
            lh_sql_notification(h.0, 2 * MS, null(), 3, null(), 0),
            LH_ERR_NULL_ARGUMENT
        );
        // Nothing changed: the migration is still pending and answers normally.
        assert_eq!(
            lh_sql_failed(
                h.0,
                3 * MS,
                id,
                LH_SQL_FAILURE_TRANSPORT,
                b"gone".as_ptr(),
                4
            ),
            LH_OK
        );
        let mut out = MaybeUninit::<lh_output>::uninit();
        assert_eq!(lh_poll_output(h.0, out.as_mut_ptr()), LH_OK);
        let out = out.assume_init();
        assert_eq!(out.kind, LH_OUTPUT_ACQUIRE_FAILED);
        assert_eq!(
            lh_sql_failed(h.0, 3 * MS, id, LH_SQL_FAILURE_TRANSPORT, null(), 0),
            LH_OK,
            "stale ids are ignored"
        );
    }
    // A handle without the SQL protocol says so.
    let mut plain = null_mut();
    // SAFETY: pointers to locals.
    unsafe {
        assert_eq!(lh_client_new(&cfg, seed.as_ptr(), 32, &mut plain), LH_OK);
        let plain = H(plain);
        assert_eq!(
            lh_sql_poll_request(plain.0, r.as_mut_ptr()),
            LH_ERR_NO_BACKEND
        );
        let (mut p, mut n) = (null(), 0usize);
        assert_eq!(
            lh_sql_last_error(plain.0, &mut p, &mut n),
            LH_ERR_NO_BACKEND
        );
        assert_eq!(
            lh_sql_poll_request(null_mut(), r.as_mut_ptr()),
            LH_ERR_NULL_ARGUMENT
        );
    }
}
