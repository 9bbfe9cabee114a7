//! Drives SQL-backend handles through the seam (`lh_client_new` with `LH_BACKEND_SQLITE` /
//! `LH_BACKEND_POSTGRES`, `lh_io_poll` of `LH_IO_SQL` requests, `lh_io_reply`, `lh_io_failed`,
//! `lh_io_connection`, `lh_backend_last_error`) from Rust as a C host would: statements and
//! parameters read in place from the request's data buffer, executed on a real SQLite file,
//! rows flattened into `lh_value`s. Hostile input is an error that changes nothing.
#![allow(unsafe_code)]
// A host reads clocks: that is its job (the core never does).
#![allow(clippy::disallowed_methods)]

#[path = "support/abi.rs"]
mod abi;

use std::ptr::null;

use abi::*;
use leasehold::ffi::*;
use rusqlite::types::{Value, ValueRef};

fn sql_client(kind: u32, seed: u8) -> H {
    client_of(kind, seed)
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

/// Runs one statement with its bound parameters; its rows.
fn run_statement(
    conn: &rusqlite::Connection,
    sql: &str,
    bound: Vec<Value>,
) -> rusqlite::Result<Vec<Vec<Value>>> {
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
}

/// Every statement's rows as the answer `lh_io_reply` takes: an array per statement, of
/// rows, of columns.
fn rows_answer(results: &[Vec<Vec<Value>>]) -> (Vec<lh_value>, Vec<u8>) {
    let (mut values, mut buf) = (Vec::new(), Vec::<u8>::new());
    let arr = |n: usize| lh_value {
        kind: LH_VALUE_ARRAY,
        len: n as u64,
        ..lh_value::default()
    };
    values.push(arr(results.len()));
    for rows in results {
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
    (values, buf)
}

/// Runs every request of the handle on `conn`, as a C executor would; returns how many.
fn run_requests(h: &H, conn: &rusqlite::Connection) -> usize {
    let mut ran = 0;
    while let Some(r) = h.poll() {
        ran += 1;
        assert_eq!((r.kind, r.connection), (LH_IO_SQL, LH_CONNECTION_COMMANDS));
        assert!(r.args.is_empty() && r.method.is_none());
        let data = &r.data;
        let at = |o: u64, l: u64| &data[o as usize..(o + l) as usize];
        // The host facts are read once per request and bound wherever they appear.
        let mono = now() as i64;
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as i64;
        let mut results: Vec<Vec<Vec<Value>>> = Vec::new();
        let mut failure = None;
        for s in &r.statements {
            assert_eq!(
                data[(s.sql_offset + s.sql_len) as usize],
                0,
                "NUL after SQL"
            );
            let sql = std::str::from_utf8(at(s.sql_offset, s.sql_len)).unwrap();
            let ps = &r.params[s.first_param as usize..(s.first_param + s.nparams) as usize];
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
            match run_statement(conn, sql, bound) {
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
            ok(h.failed(now(), r.id, LH_FAILURE_DATABASE, msg.as_bytes()));
            continue;
        }
        let (values, buf) = rows_answer(&results);
        ok(h.reply_raw(now(), r.id, &values, &buf));
    }
    ran
}

#[derive(Debug, PartialEq)]
enum Got {
    Acquired(u64),
    Failed(u32),
    Other,
}

fn poll_event(h: &H) -> Option<Got> {
    h.event().map(|e| match e.kind {
        LH_EVENT_ACQUIRED => Got::Acquired(e.fencing_token),
        LH_EVENT_ACQUIRE_FAILED => Got::Failed(e.reason),
        _ => Got::Other,
    })
}

fn acquire(h: &H, conn: &rusqlite::Connection, name: &str) -> (u64, Got) {
    let lease = h.acquire(now(), name.as_bytes(), &opts(5_000)).unwrap();
    assert!(run_requests(h, conn) >= 1);
    let got = std::iter::from_fn(|| poll_event(h))
        .find(|g| *g != Got::Other)
        .unwrap();
    (lease, got)
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
        sql_client(LH_BACKEND_SQLITE, 1),
        sql_client(LH_BACKEND_SQLITE, 2),
    );
    let (la, got) = acquire(&a, &ca, "jobs");
    let Got::Acquired(fa) = got else {
        panic!("{got:?} ({})", a.backend_error())
    };
    assert_eq!(
        acquire(&b, &cb, "jobs").1,
        Got::Failed(LH_REASON_WAIT_EXHAUSTED)
    );
    ok(a.release(now(), la));
    run_requests(&a, &ca);
    let Got::Acquired(fb) = acquire(&b, &cb, "jobs").1 else {
        panic!("{}", b.backend_error())
    };
    assert!(fb > fa, "{fb} > {fa}");
    // Status through the ABI.
    let id = b.status_request(now(), b"jobs");
    run_requests(&b, &cb);
    let (st, host, _) = b.poll_status();
    assert_eq!((st.id, st.ok, st.held, st.fencing_token), (id, 1, 1, fb));
    assert_eq!(st.last_fencing_token, fb);
    assert_eq!(st.holder_pid, i64::from(std::process::id()));
    assert_eq!(host, b"ffi-test");
    let k = b.counters();
    assert!(k.sql_migrations >= 1 && k.backend_requests >= 3);
    assert_eq!((k.sql_database_errors, k.backend_garbage_replies), (0, 0));
    assert_eq!(b.backend_error(), "");
}

#[test]
fn a_foreign_table_is_reported_through_lh_backend_last_error() {
    let db = tmp_db("foreign");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch("CREATE TABLE leasehold_fences (name TEXT PRIMARY KEY, fence TEXT)")
        .unwrap();
    let h = sql_client(LH_BACKEND_SQLITE, 3);
    assert_eq!(
        acquire(&h, &conn, "jobs").1,
        Got::Failed(LH_REASON_UNAVAILABLE)
    );
    assert!(
        h.backend_error().contains("leasehold_fences"),
        "{}",
        h.backend_error()
    );
}

#[test]
fn a_replaced_file_is_reported_reopened_and_the_schema_is_made_again() {
    let db = tmp_db("reopened");
    let conn = rusqlite::Connection::open(&db).unwrap();
    let h = sql_client(LH_BACKEND_SQLITE, 6);
    let (lease, got) = acquire(&h, &conn, "jobs");
    assert!(matches!(got, Got::Acquired(_)), "{got:?}");
    ok(h.release(now(), lease));
    run_requests(&h, &conn);
    let migrations = h.counters().sql_migrations;
    // The file is replaced: the host opens the new one and says so.
    drop(conn);
    std::fs::remove_file(&db).unwrap();
    let conn = rusqlite::Connection::open(&db).unwrap();
    ok(h.connection(now(), LH_CONNECTION_COMMANDS, LH_CONNECTION_REOPENED, b""));
    let (_, got) = acquire(&h, &conn, "jobs");
    assert!(matches!(got, Got::Acquired(_)), "{got:?}");
    assert!(
        h.counters().sql_migrations > migrations,
        "the schema is made again"
    );
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'leasehold_fences'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 1);
}

#[test]
fn hostile_input_is_an_error_that_changes_nothing() {
    let (cfg, seed) = (config(), [4u8; 32]);
    let mut bad = backend(LH_BACKEND_POSTGRES);
    bad.kind = 9;
    assert_eq!(
        try_client(&cfg, &bad, &seed).err(),
        Some(LH_ERR_INVALID_ENUM)
    );
    let mut c = std::ptr::null_mut();
    // SAFETY: a NULL backend must be reported.
    expect(
        unsafe { lh_client_new(&cfg, null(), seed.as_ptr(), 32, &mut c) },
        LH_ERR_NULL_ARGUMENT,
    );
    assert!(c.is_null());
    bad = backend(LH_BACKEND_POSTGRES);
    bad.sqlite_busy_timeout_ms = u64::MAX;
    assert_eq!(
        try_client(&cfg, &bad, &seed).err(),
        Some(LH_ERR_INVALID_CONFIG)
    );
    bad = backend(LH_BACKEND_POSTGRES);
    bad.struct_size = 4;
    assert_eq!(
        try_client(&cfg, &bad, &seed).err(),
        Some(LH_ERR_STRUCT_SIZE)
    );
    bad.struct_size = size_of::<lh_backend_options>() as u32 - 1;
    assert_eq!(
        try_client(&cfg, &bad, &seed).err(),
        Some(LH_ERR_STRUCT_SIZE)
    );
    bad = backend(LH_BACKEND_POSTGRES);
    bad.postgres_asynchronous_commit = 2;
    assert_eq!(
        try_client(&cfg, &bad, &seed).err(),
        Some(LH_ERR_INVALID_CONFIG)
    );
    bad.postgres_asynchronous_commit = 1;
    assert!(try_client(&cfg, &bad, &seed).is_ok());

    let h = sql_client(LH_BACKEND_POSTGRES, 5);
    let lease = h.acquire(MS, b"n", &opts(LH_DEFAULT_TTL_MS)).unwrap();
    let r = h.poll().expect("the schema check");
    assert_eq!(r.kind, LH_IO_SQL);
    let int = lh_value {
        kind: LH_VALUE_INT,
        ..lh_value::default()
    };
    let status = lh_value {
        kind: LH_VALUE_STATUS,
        ..lh_value::default()
    };
    for vals in [vec![int], vec![status], vec![]] {
        expect(h.reply_raw(2 * MS, r.id, &vals, &[]), LH_ERR_INVALID_REPLY);
    }
    // SAFETY: NULL lists and strings with lengths are reported, never read.
    unsafe {
        expect(
            lh_io_reply(h.0, 2 * MS, r.id, null(), 0, null(), 0),
            LH_ERR_NULL_ARGUMENT,
        );
        expect(
            lh_io_message(h.0, 2 * MS, null(), 3, null(), 0),
            LH_ERR_NULL_ARGUMENT,
        );
    }
    expect(h.failed(2 * MS, r.id, 7, b""), LH_ERR_INVALID_ENUM);
    expect(
        h.connection(2 * MS, 0, LH_CONNECTION_REOPENED, b""),
        LH_ERR_INVALID_ENUM,
    );
    expect(
        h.connection(
            2 * MS,
            LH_CONNECTION_NOTIFY,
            LH_CONNECTION_SUBSCRIBED,
            b"ch",
        ),
        LH_ERR_WRONG_ANSWER,
    );
    expect(h.http_reply(2 * MS, r.id, 200, b"{}"), LH_ERR_WRONG_ANSWER);
    assert_eq!(h.state(lease), Ok(LH_STATE_ACQUIRING));
    let k = h.counters();
    assert_eq!(
        (
            k.backend_stale_replies,
            k.backend_transport_failures,
            k.sql_database_errors
        ),
        (0, 0, 0)
    );
    // Nothing changed: the schema check is still pending and answers normally.
    ok(h.failed(3 * MS, r.id, LH_FAILURE_TRANSPORT, b"gone"));
    let ev = h.event().expect("an event");
    assert_eq!((ev.kind, ev.lease_id), (LH_EVENT_ACQUIRE_FAILED, lease));
    assert!(h.backend_error().contains("gone"), "{}", h.backend_error());
    ok(h.failed(3 * MS, r.id, LH_FAILURE_TRANSPORT, b""));
    let k = h.counters();
    assert_eq!(
        (k.backend_transport_failures, k.backend_stale_replies),
        (1, 1),
        "stale ids are counted and ignored"
    );
}

#[test]
fn a_database_error_is_counted_and_reported() {
    let db = tmp_db("dberror");
    let conn = rusqlite::Connection::open(&db).unwrap();
    let h = sql_client(LH_BACKEND_SQLITE, 7);
    let lease = h.acquire(now(), b"jobs", &opts(5_000)).unwrap();
    let r = h.poll().expect("a request");
    ok(h.failed(now(), r.id, LH_FAILURE_DATABASE, b"database is locked"));
    let k = h.counters();
    assert_eq!(
        (k.sql_database_errors, k.backend_transport_failures),
        (1, 0)
    );
    assert!(h.backend_error().contains("database is locked"));
    assert_eq!(
        h.events()
            .iter()
            .map(|e| (e.kind, e.lease_id))
            .collect::<Vec<_>>(),
        [(LH_EVENT_ACQUIRE_FAILED, lease)]
    );
    // The next acquire runs normally.
    assert!(matches!(acquire(&h, &conn, "jobs").1, Got::Acquired(_)));
}
