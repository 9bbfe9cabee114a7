//! The SQL protocol's SQLite dialect executed on real SQLite files (rusqlite on the system
//! libsqlite3): contention, idempotence, files written by the Python backend, a deleted file,
//! and the faults that must be clear errors, never grants.

mod sql_host;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::backend::sql::{Dialect, FailureKind, Request, SqlOptions};
use leasehold::{AcquireFailReason, Event};
use rusqlite::types::{Value, ValueRef};
use sql_host::{Executor, Host, Owned, OwnedRows, bind, facts};

struct Sqlite {
    path: PathBuf,
    flags: rusqlite::OpenFlags,
    conn: rusqlite::Connection,
    ident: Option<(u64, u64)>,
    reset: bool,
}

fn ident(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl Sqlite {
    fn open(path: &Path) -> Self {
        Self::open_with(path, rusqlite::OpenFlags::default())
    }

    fn open_with(path: &Path, flags: rusqlite::OpenFlags) -> Self {
        Self {
            path: path.to_owned(),
            flags,
            conn: rusqlite::Connection::open_with_flags(path, flags).unwrap(),
            ident: ident(path),
            reset: false,
        }
    }

    fn run(&mut self, req: &Request<'_>) -> Result<Vec<OwnedRows>, rusqlite::Error> {
        let f = facts();
        let mut out = Vec::with_capacity(req.statements.len());
        for st in req.statements {
            let mut stmt = self.conn.prepare(&st.sql)?;
            let params: Vec<Value> = st
                .params
                .iter()
                .map(|p| match bind(p, &f) {
                    Owned::Null => Value::Null,
                    Owned::Int(i) => Value::Integer(i),
                    Owned::Float(x) => Value::Real(x),
                    Owned::Text(s) => Value::Text(s),
                    Owned::Blob(b) => Value::Blob(b),
                })
                .collect();
            let ncols = stmt.column_count();
            let mut rows = stmt.query(rusqlite::params_from_iter(params))?;
            let mut got = Vec::new();
            while let Some(row) = rows.next()? {
                let mut cols = Vec::with_capacity(ncols);
                for i in 0..ncols {
                    cols.push(match row.get_ref(i)? {
                        ValueRef::Null => Owned::Null,
                        ValueRef::Integer(i) => Owned::Int(i),
                        ValueRef::Real(x) => Owned::Float(x),
                        ValueRef::Text(t) => Owned::Text(String::from_utf8_lossy(t).into_owned()),
                        ValueRef::Blob(b) => Owned::Blob(b.to_vec()),
                    });
                }
                got.push(cols);
            }
            out.push(got);
        }
        Ok(out)
    }
}

impl Executor for Sqlite {
    fn execute(&mut self, req: &Request<'_>) -> Result<Vec<OwnedRows>, (FailureKind, String)> {
        // A deleted or replaced file: follow the path, never lock alone on the old inode.
        if ident(&self.path) != self.ident {
            if let Ok(c) = rusqlite::Connection::open_with_flags(&self.path, self.flags) {
                self.conn = c;
                self.ident = ident(&self.path);
                self.reset = true;
            }
            return Err((
                FailureKind::Transport,
                "the database file was replaced".into(),
            ));
        }
        self.run(req).map_err(|e| {
            if !self.conn.is_autocommit() {
                let _ = self.conn.execute_batch("ROLLBACK");
            }
            (FailureKind::Database, e.to_string())
        })
    }

    fn take_resets(&mut self) -> Vec<leasehold::backend::sql::Connection> {
        if std::mem::take(&mut self.reset) {
            vec![leasehold::backend::sql::Connection::Commands]
        } else {
            Vec::new()
        }
    }
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lh-sql-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn host(path: &Path, seed: u8) -> Host<Sqlite> {
    Host::new(
        Dialect::Sqlite,
        SqlOptions::default(),
        Sqlite::open(path),
        seed,
    )
}

fn wall_us() -> u64 {
    facts().wall_us as u64
}

#[test]
fn grant_renew_release_and_fences_from_the_wall_clock() {
    let dir = tmpdir("basic");
    let db = dir.join("locks.sqlite3");
    let mut a = host(&db, 1);
    let mut b = host(&db, 2);
    let before = wall_us();
    let (la, fa) = a.acquire("jobs", 5_000, Duration::ZERO).unwrap();
    assert!(
        fa >= before,
        "fence {fa} is at least the wall clock in µs {before}"
    );
    // Held: b is refused with the holder's remaining time as the hint.
    assert!(matches!(
        b.acquire("jobs", 5_000, Duration::ZERO),
        Err(Event::AcquireFailed {
            reason: AcquireFailReason::WaitExhausted,
            ..
        })
    ));
    a.release(la);
    let (lb, fb) = b.acquire("jobs", 5_000, Duration::ZERO).unwrap();
    assert!(fb > fa);
    // A renewal runs and is accepted.
    let deadline = b.proto.poll_timeout(&mut b.core).unwrap();
    std::thread::sleep(Duration::from_nanos(deadline.saturating_sub(b.now())));
    b.wait_step(Duration::ZERO);
    assert!(
        b.core.counters().renewals_ok >= 1,
        "{:?}",
        b.core.counters()
    );
    assert!(b.core.is_held(lb, b.now()).unwrap());
    b.release(lb);
    let st = status(&mut b, "jobs");
    assert!(!st.held);
    assert_eq!(st.last_fencing_token, Some(fb));
}

fn status(h: &mut Host<Sqlite>, name: &str) -> leasehold::backend::sql::LockStatus {
    let now = h.now();
    let id = h.proto.request_status(&mut h.core, now, name).unwrap();
    h.pump();
    let (got, st) = h.proto.poll_status().unwrap();
    assert_eq!(got, id);
    st.unwrap()
}

#[test]
fn acquire_is_idempotent_for_its_token() {
    let dir = tmpdir("idem");
    let db = dir.join("locks.sqlite3");
    let mut a = host(&db, 3);
    let now = a.now();
    let lease = a
        .core
        .acquire(
            now,
            "n",
            leasehold::AcquireOptions::new(5_000).wait_ns(2_000 * sql_host::MS),
        )
        .unwrap();
    // The inspection and the migration run; then the first attempt runs but its answer is
    // lost: the grant is in the file.
    for _ in 0..2 {
        let req = a.proto.poll_request(&mut a.core).unwrap();
        let id = req.id;
        let rows = a.exec.execute(&req).unwrap();
        assert_eq!(rows.len(), req.statements.len());
        let mig_rows: Vec<leasehold::backend::sql::Rows<'_>> = rows
            .iter()
            .map(|r| r.iter().map(|row| row.iter().map(view).collect()).collect())
            .collect();
        let now = a.now();
        a.proto.handle_rows(&mut a.core, now, id, &mig_rows);
    }
    let req = a.proto.poll_request(&mut a.core).unwrap();
    let id = req.id;
    a.exec.execute(&req).unwrap();
    let now = a.now();
    a.proto
        .handle_failed(&mut a.core, now, id, FailureKind::Transport, "lost answer");
    // The retry finds its own grant and gets the same fence.
    let first = status(&mut a, "n").fencing_token.unwrap();
    let got = loop {
        if let Some(Event::Acquired { fencing_token, .. }) = a.events.first().copied() {
            break fencing_token;
        }
        a.wait_step(Duration::from_millis(20));
    };
    assert_eq!(got, first);
    a.release(lease);
}

fn view(o: &Owned) -> leasehold::backend::sql::SqlValue<'_> {
    use leasehold::backend::sql::SqlValue;
    match o {
        Owned::Null => SqlValue::Null,
        Owned::Int(i) => SqlValue::Int(*i),
        Owned::Float(f) => SqlValue::Float(*f),
        Owned::Text(s) => SqlValue::Text(s.as_bytes()),
        Owned::Blob(b) => SqlValue::Blob(b),
    }
}

#[test]
fn threads_contending_on_one_file_get_strictly_increasing_fences_one_at_a_time() {
    let dir = tmpdir("contend");
    let db = dir.join("locks.sqlite3");
    let inside = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..4u8)
        .map(|i| {
            let (db, inside, fences) = (db.clone(), inside.clone(), fences.clone());
            std::thread::spawn(move || {
                let mut h = host(&db, 10 + i);
                for _ in 0..15 {
                    let (lease, fence) =
                        h.acquire("shared", 5_000, Duration::from_secs(30)).unwrap();
                    assert_eq!(
                        inside.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders at once"
                    );
                    fences.lock().unwrap().push(fence);
                    std::thread::sleep(Duration::from_millis(1));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    h.release(lease);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let fences = fences.lock().unwrap();
    assert_eq!(fences.len(), 60);
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
}

/// The tables exactly as the Python backend creates them (before and after the holders
/// table was added).
const PYTHON_SCHEMA: [&str; 4] = [
    "CREATE TABLE IF NOT EXISTS leasehold_meta (
        key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS leasehold_locks (
        name TEXT PRIMARY KEY, token TEXT NOT NULL, fence INTEGER NOT NULL,
        expiry_ns INTEGER NOT NULL, boot_id TEXT NOT NULL, pid INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS leasehold_fences (
        name TEXT PRIMARY KEY, fence INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS leasehold_watchers (
        name TEXT NOT NULL, addr BLOB NOT NULL, pid INTEGER NOT NULL,
        PRIMARY KEY (name, addr))",
];

#[test]
fn files_written_by_the_python_backend_are_used_in_place_and_fences_continue() {
    let dir = tmpdir("python");
    let db = dir.join("locks.sqlite3");
    {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch("PRAGMA journal_mode=WAL").unwrap();
        for s in PYTHON_SCHEMA {
            c.execute(s, []).unwrap();
        }
        c.execute(
            "INSERT INTO leasehold_meta(key, value) VALUES ('schema', '1')",
            [],
        )
        .unwrap();
        // A live grant of another process (its expiry far ahead on this boot) and old fences.
        let f = facts();
        c.execute(
            "INSERT INTO leasehold_locks VALUES ('held', 'pytoken', 7, ?1, ?2, 4242)",
            rusqlite::params![f.mono_ns + 60_000_000_000, f.boot_id],
        )
        .unwrap();
        c.execute(
            "INSERT INTO leasehold_fences VALUES ('held', 7), ('free', 3)",
            [],
        )
        .unwrap();
    }
    let mut h = host(&db, 20);
    assert!(matches!(
        h.acquire("held", 5_000, Duration::ZERO),
        Err(Event::AcquireFailed { .. })
    ));
    let st = status(&mut h, "held");
    assert!(st.held);
    assert_eq!((st.fencing_token, st.holder_pid), (Some(7), Some(4242)));
    let (lease, fence) = h.acquire("free", 5_000, Duration::ZERO).unwrap();
    assert!(fence > 3);
    let st = status(&mut h, "free");
    assert_eq!(
        st.holder_host.as_deref(),
        Some("testhost"),
        "holders table added in place"
    );
    h.release(lease);
    // Running the migration again changes nothing.
    let mut again = host(&db, 21);
    let (lease, next) = again.acquire("free", 5_000, Duration::ZERO).unwrap();
    assert!(next > fence);
    again.release(lease);
}

#[test]
fn a_deleted_file_does_not_make_fences_regress() {
    let dir = tmpdir("deleted");
    let db = dir.join("locks.sqlite3");
    let mut h = host(&db, 30);
    let (lease, first) = h.acquire("n", 5_000, Duration::ZERO).unwrap();
    h.release(lease);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    // The executor notices the file is gone, reopens it and the schema is created again.
    let (lease, second) = h.acquire("n", 5_000, Duration::from_secs(5)).unwrap();
    assert!(second > first, "{second} > {first}");
    assert!(h.failures >= 1);
    h.release(lease);
}

fn fails_clearly(h: &mut Host<Sqlite>, want: &[&str]) {
    let got = h.acquire("n", 5_000, Duration::ZERO);
    assert!(
        matches!(
            got,
            Err(Event::AcquireFailed {
                reason: AcquireFailReason::Unavailable,
                ..
            })
        ),
        "{got:?}"
    );
    let err = h.proto.last_error().to_lowercase();
    assert!(
        want.iter().any(|w| err.contains(w)),
        "{err:?} mentions one of {want:?}"
    );
}

#[test]
fn a_corrupt_file_is_a_clear_error() {
    let dir = tmpdir("corrupt");
    let db = dir.join("locks.sqlite3");
    std::fs::write(&db, vec![0x5a; 8192]).unwrap();
    let mut h = host(&db, 40);
    fails_clearly(&mut h, &["not a database", "corrupt", "malformed"]);
}

#[test]
fn a_locked_file_fails_after_the_busy_timeout() {
    let dir = tmpdir("locked");
    let db = dir.join("locks.sqlite3");
    let mut h = Host::new(
        Dialect::Sqlite,
        SqlOptions {
            busy_timeout_ms: 100,
            ..SqlOptions::default()
        },
        Sqlite::open(&db),
        50,
    );
    let (lease, _) = h.acquire("warm", 5_000, Duration::ZERO).unwrap();
    h.release(lease);
    let blocker = rusqlite::Connection::open(&db).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    fails_clearly(&mut h, &["locked", "busy"]);
    blocker.execute_batch("ROLLBACK").unwrap();
    let (lease, _) = h.acquire("n", 5_000, Duration::from_secs(5)).unwrap();
    h.release(lease);
}

#[test]
fn a_read_only_database_is_a_clear_error() {
    let dir = tmpdir("readonly");
    let db = dir.join("locks.sqlite3");
    // leasehold's own (a rollback-journal file with its meta table), opened read-only.
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("CREATE TABLE leasehold_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        .unwrap();
    let mut h = Host::new(
        Dialect::Sqlite,
        SqlOptions::default(),
        Sqlite::open_with(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY),
        60,
    );
    fails_clearly(&mut h, &["readonly", "read-only", "wal"]);
}

#[test]
fn a_foreign_table_of_the_same_name_is_refused_not_used() {
    for ddl in [
        "CREATE TABLE leasehold_locks (name TEXT PRIMARY KEY, owner INTEGER)",
        // Right names, wrong types.
        "CREATE TABLE leasehold_locks (name TEXT PRIMARY KEY, token TEXT, fence TEXT, \
         expiry_ns INTEGER, boot_id TEXT, pid INTEGER)",
    ] {
        let dir = tmpdir("foreign");
        let db = dir.join("locks.sqlite3");
        rusqlite::Connection::open(&db)
            .unwrap()
            .execute_batch(ddl)
            .unwrap();
        let mut h = host(&db, 70);
        fails_clearly(&mut h, &["leasehold_locks"]);
    }
}

/// Every row of leasehold's tables and the file's journal mode, with the values' types.
fn snapshot(db: &Path) -> Vec<String> {
    let c = rusqlite::Connection::open(db).unwrap();
    let mut out = vec![
        c.query_row("PRAGMA journal_mode", [], |r| r.get::<_, String>(0))
            .unwrap(),
    ];
    let tables: Vec<String> = c
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for t in tables {
        let mut st = c.prepare(&format!("SELECT * FROM \"{t}\"")).unwrap();
        let n = st.column_count();
        let rows: Vec<String> = st
            .query_map([], |r| {
                Ok((0..n)
                    .map(|i| format!("{:?}", r.get_ref(i).unwrap()))
                    .collect::<Vec<_>>()
                    .join("|"))
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        out.push(format!("{t}: {rows:?}"));
    }
    out
}

#[test]
fn a_database_of_another_application_is_refused_and_left_as_it_was() {
    for ddl in [
        "CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT); \
         INSERT INTO users (email) VALUES ('a@example.org')",
        // A view, or leasehold's tables beside someone else's, are foreign all the same.
        "CREATE VIEW v AS SELECT 1",
        "CREATE TABLE leasehold_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL); \
         CREATE TABLE orders (id INTEGER PRIMARY KEY)",
    ] {
        let dir = tmpdir("otherapp");
        let db = dir.join("app.sqlite3");
        rusqlite::Connection::open(&db)
            .unwrap()
            .execute_batch(ddl)
            .unwrap();
        let before = snapshot(&db);
        assert_eq!(before[0], "delete");
        let mut h = host(&db, 80);
        fails_clearly(&mut h, &["belongs to something else"]);
        let err = h.proto.last_error().to_owned();
        assert!(err.contains("give it another path"), "{err}");
        // Nothing created, no WAL: the file is exactly as it was.
        assert_eq!(snapshot(&db), before, "{ddl}");
        assert!(!Path::new(&format!("{}-wal", db.display())).exists());
        drop(h);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn leasehold_files_with_sqlites_own_tables_or_an_operators_index_are_used() {
    let dir = tmpdir("ownextras");
    let db = dir.join("locks.sqlite3");
    let mut h = host(&db, 81);
    let (lease, first) = h.acquire("n", 5_000, Duration::ZERO).unwrap();
    h.release(lease);
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(
            "ANALYZE; CREATE INDEX ops_expiry ON leasehold_locks (expiry_ns); \
             CREATE TABLE IF NOT EXISTS leasehold_extra (x)",
        )
        .unwrap();
    let mut again = host(&db, 82);
    let (lease, second) = again.acquire("n", 5_000, Duration::ZERO).unwrap();
    assert!(second > first);
    again.release(lease);
}

#[test]
fn a_planted_fence_at_its_limit_is_refused_and_nothing_is_written() {
    let limit = 1i64 << 53;
    let plants: [(&str, &str, Value); 5] = [
        ("fences", "2^53", Value::Integer(limit)),
        ("fences", "i64::MAX", Value::Integer(i64::MAX)),
        ("fences", "a REAL", Value::Real(9.3e18)),
        ("fences", "text", Value::Text("many".into())),
        // An expired lock row with the last fence, its fence row gone.
        ("locks", "2^53", Value::Integer(limit)),
    ];
    for (table, what, value) in plants {
        let dir = tmpdir("planted");
        let db = dir.join("locks.sqlite3");
        let mut h = host(&db, 90);
        let (lease, _) = h.acquire("warm", 5_000, Duration::ZERO).unwrap();
        h.release(lease);
        {
            let c = rusqlite::Connection::open(&db).unwrap();
            if table == "fences" {
                c.execute("INSERT INTO leasehold_fences VALUES ('n', ?1)", [&value])
                    .unwrap();
            } else {
                c.execute(
                    "INSERT INTO leasehold_locks VALUES ('n', 'old', ?1, 0, 'gone', 1)",
                    [&value],
                )
                .unwrap();
            }
        }
        let before = snapshot(&db);
        fails_clearly(&mut h, &["stored fence"]);
        let err = h.proto.last_error().to_owned();
        assert!(
            err.contains("\"n\" refused") && err.contains("2^53"),
            "{what}: {err}"
        );
        assert_eq!(snapshot(&db), before, "{table} {what}: nothing written");
        // Retries (a waiting acquire) write nothing either.
        assert!(h.acquire("n", 5_000, Duration::from_millis(300)).is_err());
        assert_eq!(snapshot(&db), before, "{table} {what}: nothing written");
        // Other names are not affected.
        let (lease, _) = h.acquire("other", 5_000, Duration::ZERO).unwrap();
        h.release(lease);
        // The recovery of docs/sql-protocol.md: delete the name's rows; fences restart from
        // the wall clock.
        rusqlite::Connection::open(&db)
            .unwrap()
            .execute_batch(
                "BEGIN IMMEDIATE; DELETE FROM leasehold_fences WHERE name = 'n'; \
                 DELETE FROM leasehold_locks WHERE name = 'n'; \
                 DELETE FROM leasehold_holders WHERE name = 'n'; COMMIT",
            )
            .unwrap();
        let before = wall_us();
        let (lease, fence) = h.acquire("n", 5_000, Duration::ZERO).unwrap();
        assert!(fence >= before && fence < limit as u64, "{fence}");
        h.release(lease);
        drop(h);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn the_last_fence_below_the_limit_is_granted_once_then_refused() {
    let limit = 1i64 << 53;
    let dir = tmpdir("lastfence");
    let db = dir.join("locks.sqlite3");
    let mut h = host(&db, 91);
    let (lease, _) = h.acquire("warm", 5_000, Duration::ZERO).unwrap();
    h.release(lease);
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute("INSERT INTO leasehold_fences VALUES ('n', ?1)", [limit - 1])
        .unwrap();
    let (lease, fence) = h.acquire("n", 5_000, Duration::ZERO).unwrap();
    assert_eq!(fence, limit as u64, "2^53 itself is a fence");
    h.release(lease);
    fails_clearly(&mut h, &["stored fence is 9007199254740992"]);
}
