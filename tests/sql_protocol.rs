//! One test per behaviour of the SQL protocol (docs/design.md §6): feed rows and failures as a host
//! would, assert the statements, their typed parameters and what the engine makes of them.
//! `tests/sql_sqlite.rs` and `tests/sql_postgres.rs` run the same statements on real databases.

use leasehold::backend::sql::{
    self, Connection, Dialect, FailureKind, FlatValue, HostValue, Param, Rows, SqlOptions,
    SqlProtocol, SqlValue, decode, encode, listen_channel,
};
use leasehold::{AcquireFailReason, AcquireOptions, Client, Config, Event, LeaseId};

const MS: u64 = 1_000_000;

fn setup(dialect: Dialect) -> (Client, SqlProtocol) {
    let cfg = Config {
        notifications: dialect == Dialect::Postgres,
        ..Config::default()
    };
    (
        Client::new(cfg, &[9; 32]).unwrap(),
        SqlProtocol::new(dialect, SqlOptions::default()).unwrap(),
    )
}

/// A polled request: (id, connection, statements as text, parameters per statement).
type Polled = (u64, Connection, Vec<String>, Vec<Vec<Param>>);

/// The next request.
fn next(core: &mut Client, p: &mut SqlProtocol) -> Option<Polled> {
    let r = p.poll_request(core)?;
    Some((
        r.id,
        r.connection,
        r.statements.iter().map(|s| s.sql.to_string()).collect(),
        r.statements.iter().map(|s| s.params.clone()).collect(),
    ))
}

fn events(core: &mut Client, p: &mut SqlProtocol) -> Vec<Event> {
    std::iter::from_fn(|| p.poll_event(core)).collect()
}

fn text(s: &str) -> SqlValue<'_> {
    SqlValue::Text(s.as_bytes())
}

/// Rows a healthy SQLite migration returns (16 statements).
fn sqlite_migration_rows() -> Vec<Rows<'static>> {
    let cols = |c: &[(&'static str, &'static str)]| -> Rows<'static> {
        c.iter().map(|(n, t)| vec![text(n), text(t)]).collect()
    };
    let mut r: Vec<Rows<'static>> = vec![Vec::new(); 16];
    r[0] = vec![vec![SqlValue::Int(5000)]];
    r[1] = vec![vec![text("wal")]];
    r[3] = vec![vec![text("ok")]];
    r[11] = vec![vec![text("1")]];
    r[12] = cols(&[
        ("name", "TEXT"),
        ("token", "TEXT"),
        ("fence", "INTEGER"),
        ("expiry_ns", "INTEGER"),
        ("boot_id", "TEXT"),
        ("pid", "INTEGER"),
    ]);
    r[13] = cols(&[("name", "TEXT"), ("fence", "INTEGER")]);
    r[14] = cols(&[
        ("name", "TEXT"),
        ("fence", "INTEGER"),
        ("host", "TEXT"),
        ("since_ns", "INTEGER"),
    ]);
    r
}

/// Rows of a SQLite acquire (8 statements) whose result row is `row`.
fn sqlite_acquire_rows(row: Vec<SqlValue<'static>>) -> Vec<Rows<'static>> {
    let mut r: Vec<Rows<'static>> = vec![Vec::new(); 8];
    r[5] = vec![row];
    r
}

/// Answers the SQLite inspection (it reads the schema, writes nothing) with `foreign`'s
/// rows of (type, name) that are not leasehold's.
fn inspected_sqlite(core: &mut Client, p: &mut SqlProtocol, foreign: Rows<'static>) {
    let (id, conn, sql, _) = next(core, p).unwrap();
    assert_eq!(conn, Connection::Commands);
    assert_eq!(sql.len(), 2, "{sql:?}");
    assert!(sql[0].starts_with("PRAGMA busy_timeout = 5000"));
    assert!(sql[1].starts_with("SELECT type, name FROM sqlite_master"));
    p.handle_rows(core, 0, id, &[Vec::new(), foreign]);
}

fn migrated_sqlite(core: &mut Client, p: &mut SqlProtocol) {
    inspected_sqlite(core, p, Vec::new());
    let (id, conn, sql, _) = next(core, p).unwrap();
    assert_eq!(conn, Connection::Commands);
    assert!(sql[0].starts_with("PRAGMA busy_timeout = 5000"));
    p.handle_rows(core, 0, id, &sqlite_migration_rows());
}

fn acquire(core: &mut Client, name: &str, wait_ms: u64) -> LeaseId {
    core.acquire(0, name, AcquireOptions::new(3_000).wait_ns(wait_ms * MS))
        .unwrap()
}

#[test]
fn the_first_operation_waits_for_the_migration_then_runs_in_one_immediate_transaction() {
    let (mut core, mut p) = setup(Dialect::Sqlite);
    let lease = acquire(&mut core, "jobs", 0);
    inspected_sqlite(&mut core, &mut p, Vec::new());
    let (id, _, sql, _) = next(&mut core, &mut p).unwrap();
    assert!(
        sql.iter()
            .any(|s| s.contains("CREATE TABLE IF NOT EXISTS leasehold_holders"))
    );
    assert!(
        next(&mut core, &mut p).is_none(),
        "the acquire waits for the migration"
    );
    p.handle_rows(&mut core, MS, id, &sqlite_migration_rows());
    let (id, _, sql, params) = next(&mut core, &mut p).unwrap();
    assert_eq!(sql.first().map(String::as_str), Some("BEGIN IMMEDIATE"));
    assert_eq!(sql.last().map(String::as_str), Some("COMMIT"));
    // Typed parameters: name and token as text, the TTL in ns, host facts bound at execution.
    let grant = &params[2];
    assert_eq!(grant[0], Param::Text("jobs".into()));
    assert!(matches!(&grant[1], Param::Text(t) if t.len() == 32));
    assert_eq!(grant[2], Param::Int(3_000 * MS as i64));
    assert_eq!(grant[3], Param::Host(HostValue::MonotonicNs));
    assert_eq!(grant[4], Param::Host(HostValue::BootId));
    assert_eq!(
        params[2][5],
        Param::Host(HostValue::WallUs),
        "fences use the wall clock"
    );
    p.handle_rows(
        &mut core,
        2 * MS,
        id,
        &sqlite_acquire_rows(vec![
            SqlValue::Int(1),
            SqlValue::Int(1_700_000_000_000_000),
            SqlValue::Int(2_999 * MS as i64),
            SqlValue::Int(1),
        ]),
    );
    assert!(matches!(
        events(&mut core, &mut p)[..],
        [Event::Acquired { lease: l, fencing_token: 1_700_000_000_000_000, .. }] if l == lease
    ));
}

#[test]
fn a_refusal_carries_the_holders_remaining_time() {
    let (mut core, mut p) = setup(Dialect::Sqlite);
    let lease = acquire(&mut core, "jobs", 10_000);
    migrated_sqlite(&mut core, &mut p);
    let (id, ..) = next(&mut core, &mut p).unwrap();
    p.handle_rows(
        &mut core,
        MS,
        id,
        &sqlite_acquire_rows(vec![
            SqlValue::Int(0),
            SqlValue::Int(42),
            SqlValue::Int(1_500 * MS as i64 + 1),
            SqlValue::Int(1),
        ]),
    );
    assert!(events(&mut core, &mut p).is_empty());
    assert_eq!(
        core.lease_state(lease).unwrap(),
        leasehold::LeaseState::Acquiring
    );
    // SQLite has no notifications: the retry is scheduled no later than the holder's expiry.
    let t = p.poll_timeout(&mut core).unwrap();
    assert!(t <= MS + 1_501 * MS, "{t}");
}

#[test]
fn rows_of_the_wrong_shape_or_type_are_never_grants() {
    for row in [
        vec![
            SqlValue::Int(1),
            text("17"),
            SqlValue::Int(MS as i64),
            SqlValue::Int(1),
        ],
        vec![
            SqlValue::Int(1),
            SqlValue::Int(0),
            SqlValue::Int(MS as i64),
            SqlValue::Int(1),
        ],
        vec![
            SqlValue::Int(1),
            SqlValue::Int(5),
            SqlValue::Int(-1),
            SqlValue::Int(1),
        ],
        vec![
            SqlValue::Int(1),
            SqlValue::Int(5),
            SqlValue::Int(MS as i64),
            SqlValue::Int(0),
        ],
        vec![
            SqlValue::Int(2),
            SqlValue::Int(5),
            SqlValue::Int(MS as i64),
            SqlValue::Int(1),
        ],
        vec![SqlValue::Int(1), SqlValue::Int(5)],
    ] {
        let (mut core, mut p) = setup(Dialect::Sqlite);
        let lease = acquire(&mut core, "jobs", 0);
        migrated_sqlite(&mut core, &mut p);
        let (id, ..) = next(&mut core, &mut p).unwrap();
        p.handle_rows(&mut core, MS, id, &sqlite_acquire_rows(row.clone()));
        assert_eq!(
            events(&mut core, &mut p),
            vec![Event::AcquireFailed {
                lease,
                reason: AcquireFailReason::Unavailable
            }],
            "{row:?}"
        );
        assert!(
            p.last_error().contains("unexpected result"),
            "{}",
            p.last_error()
        );
        assert_eq!(p.counters().garbage_results, 1);
    }
    // No rows at all, and a result list of the wrong length.
    let (mut core, mut p) = setup(Dialect::Sqlite);
    let lease = acquire(&mut core, "jobs", 0);
    migrated_sqlite(&mut core, &mut p);
    let (id, ..) = next(&mut core, &mut p).unwrap();
    p.handle_rows(&mut core, MS, id, &[Vec::new()]);
    assert!(
        matches!(events(&mut core, &mut p)[..], [Event::AcquireFailed { lease: l, .. }] if l == lease)
    );
}

#[test]
fn a_foreign_table_fails_the_migration_with_a_clear_error_and_the_next_attempt_checks_again() {
    let (mut core, mut p) = setup(Dialect::Sqlite);
    let lease = acquire(&mut core, "jobs", 0);
    inspected_sqlite(&mut core, &mut p, Vec::new());
    let (id, ..) = next(&mut core, &mut p).unwrap();
    let mut rows = sqlite_migration_rows();
    rows[12] = vec![
        vec![text("name"), text("TEXT")],
        vec![text("owner"), text("INTEGER")],
    ];
    p.handle_rows(&mut core, MS, id, &rows);
    assert_eq!(
        events(&mut core, &mut p),
        vec![Event::AcquireFailed {
            lease,
            reason: AcquireFailReason::Unavailable
        }]
    );
    assert!(
        p.last_error().contains("leasehold_locks"),
        "{}",
        p.last_error()
    );
    assert!(
        p.last_error().contains("owner integer"),
        "{}",
        p.last_error()
    );
    // The acquire waited behind the migration, never sent: no cleanup release is owed, and
    // nothing runs on the foreign table.
    assert!(next(&mut core, &mut p).is_none());
    assert_eq!(core.counters().pending_cleanups, 0);
    // The next acquire checks the schema again.
    acquire(&mut core, "jobs", 0);
    inspected_sqlite(&mut core, &mut p, Vec::new());
    let (id, _, sql, _) = next(&mut core, &mut p).unwrap();
    assert!(
        sql[0].starts_with("PRAGMA busy_timeout"),
        "migration again: {sql:?}"
    );
    p.handle_rows(&mut core, 2 * MS, id, &rows);
    assert!(next(&mut core, &mut p).is_none());
    assert_eq!(p.counters().migrations, 2);
}

#[test]
fn a_corrupt_file_and_a_wrong_journal_mode_are_clear_errors() {
    for (at, row, want) in [
        (
            3,
            vec![text(
                "*** in database main *** Page 2: btreeInitPage() returns error code 11",
            )],
            "corrupt",
        ),
        (1, vec![text("delete")], "WAL"),
        (11, vec![text("7")], "schema version"),
    ] {
        let (mut core, mut p) = setup(Dialect::Sqlite);
        acquire(&mut core, "jobs", 0);
        inspected_sqlite(&mut core, &mut p, Vec::new());
        let (id, ..) = next(&mut core, &mut p).unwrap();
        let mut rows = sqlite_migration_rows();
        rows[at] = vec![row];
        p.handle_rows(&mut core, MS, id, &rows);
        assert!(p.last_error().contains(want), "{}", p.last_error());
        assert!(!p.is_ready());
    }
}

#[test]
fn a_database_error_owes_no_cleanup_a_broken_connection_does_and_the_schema_is_checked_again() {
    let (mut core, mut p) = setup(Dialect::Sqlite);
    let lease = acquire(&mut core, "jobs", 0);
    migrated_sqlite(&mut core, &mut p);
    let (id, ..) = next(&mut core, &mut p).unwrap();
    p.handle_failed(
        &mut core,
        MS,
        id,
        FailureKind::Database,
        "database is locked",
    );
    assert_eq!(
        events(&mut core, &mut p),
        vec![Event::AcquireFailed {
            lease,
            reason: AcquireFailReason::Unavailable
        }]
    );
    assert_eq!(p.last_error(), "database error: database is locked");
    assert_eq!(p.counters().database_errors, 1);
    // Refused and rolled back: nothing took effect, so no cleanup release is owed.
    assert_eq!(core.counters().pending_cleanups, 0);
    assert!(next(&mut core, &mut p).is_none(), "nothing to send");
    // Stale: the same id again is counted and ignored.
    p.handle_failed(&mut core, MS, id, FailureKind::Database, "again");
    assert_eq!(p.counters().stale_results, 1);
    let again = acquire(&mut core, "jobs", 0);
    migrated_sqlite(&mut core, &mut p); // (it checks that the schema check comes first)
    // Against that: an acquire whose connection broke may have taken effect, so its cleanup
    // release is owed.
    let (acq, ..) = next(&mut core, &mut p).unwrap();
    p.handle_failed(
        &mut core,
        3 * MS,
        acq,
        FailureKind::Transport,
        "connection reset",
    );
    assert!(events(&mut core, &mut p).contains(&Event::AcquireFailed {
        lease: again,
        reason: AcquireFailReason::Unavailable
    }));
    assert_eq!(core.counters().pending_cleanups, 1);
}

#[test]
fn acquires_parked_behind_a_refused_schema_owe_no_cleanup() {
    let (mut core, mut p) = setup(Dialect::Sqlite);
    acquire(&mut core, "jobs", 0);
    acquire(&mut core, "other", 0);
    let (id, ..) = next(&mut core, &mut p).unwrap(); // the schema inspection
    p.handle_failed(
        &mut core,
        MS,
        id,
        FailureKind::Transport,
        "connection reset",
    );
    let failed = events(&mut core, &mut p);
    assert_eq!(failed.len(), 2, "{failed:?}");
    // Never sent: nothing to clean up, whatever happened to the inspection.
    assert_eq!(core.counters().pending_cleanups, 0);
}

#[test]
fn renew_and_release_read_their_rows() {
    let (mut core, mut p) = setup(Dialect::Sqlite);
    let lease = acquire(&mut core, "jobs", 0);
    migrated_sqlite(&mut core, &mut p);
    let (id, ..) = next(&mut core, &mut p).unwrap();
    let ok = vec![
        SqlValue::Int(1),
        SqlValue::Int(9),
        SqlValue::Int(3_000 * MS as i64),
        SqlValue::Int(1),
    ];
    p.handle_rows(&mut core, MS, id, &sqlite_acquire_rows(ok));
    events(&mut core, &mut p);
    let t = p.poll_timeout(&mut core).unwrap();
    p.handle_timeout(&mut core, t);
    let (id, _, sql, params) = next(&mut core, &mut p).unwrap();
    assert!(sql[1].starts_with("UPDATE leasehold_locks SET expiry_ns"));
    assert_eq!(params[1].len(), 5);
    // SELECT changes() answered 0: someone else's now.
    let rows: Vec<Rows<'_>> = vec![vec![], vec![], vec![vec![SqlValue::Int(0)]], vec![]];
    p.handle_rows(&mut core, t + MS, id, &rows);
    assert!(matches!(
        events(&mut core, &mut p)[..],
        [Event::Lost { lease: l, reason: leasehold::LostReason::Rejected }] if l == lease
    ));
    // A release deletes our row; it was live, so it is released.
    let lease = acquire(&mut core, "jobs", 0);
    let (id, ..) = next(&mut core, &mut p).unwrap();
    let ok = vec![
        SqlValue::Int(1),
        SqlValue::Int(10),
        SqlValue::Int(3_000 * MS as i64),
        SqlValue::Int(1),
    ];
    p.handle_rows(&mut core, t + 2 * MS, id, &sqlite_acquire_rows(ok));
    core.release(t + 3 * MS, lease).unwrap();
    let (id, _, sql, params) = next(&mut core, &mut p).unwrap();
    assert!(sql[1].starts_with("SELECT boot_id = ?4 AND expiry_ns > ?3"));
    assert!(sql[2].starts_with("DELETE FROM leasehold_locks"));
    assert_eq!(params[1][2], Param::Host(HostValue::MonotonicNs));
    let rows: Vec<Rows<'_>> = vec![vec![], vec![vec![SqlValue::Int(1)]], vec![], vec![]];
    p.handle_rows(&mut core, t + 4 * MS, id, &rows);
    let c = core.counters();
    assert_eq!(
        (c.stale_results, p.counters().garbage_results),
        (0, 0),
        "{c:?}"
    );
}

fn pg_migrated(core: &mut Client, p: &mut SqlProtocol) {
    let (id, conn, sql, _) = next(core, p).unwrap();
    assert_eq!(conn, Connection::Commands);
    assert!(sql[1].contains("pg_advisory_xact_lock"));
    let mut rows: Vec<Rows<'static>> = vec![Vec::new(); sql.len()];
    rows[10] = vec![vec![text("1")]];
    rows[11] = [
        ("name", "text"),
        ("token", "text"),
        ("fence", "bigint"),
        ("expires_at", "timestamp with time zone"),
        ("acquired_at", "timestamp with time zone"),
        ("waited", "boolean"),
    ]
    .iter()
    .map(|(n, t)| vec![text(n), text(t)])
    .collect();
    rows[12] = vec![
        vec![text("name"), text("text")],
        vec![text("fence"), text("bigint")],
    ];
    p.handle_rows(core, 0, id, &rows);
    assert!(p.is_ready(), "{}", p.last_error());
}

#[test]
fn postgres_operations_are_one_statement_and_waiters_listen_for_releases() {
    let (mut core, mut p) = setup(Dialect::Postgres);
    let lease = acquire(&mut core, "jobs", 60_000);
    pg_migrated(&mut core, &mut p);
    let (id, _, sql, params) = next(&mut core, &mut p).unwrap();
    assert_eq!(
        sql,
        vec!["SELECT lh_granted, lh_fence, lh_remaining_ms FROM leasehold_acquire($1, $2, $3)"]
    );
    assert_eq!(params[0][2], Param::Int(3_000));
    p.handle_rows(
        &mut core,
        MS,
        id,
        &[vec![vec![
            SqlValue::Int(0),
            SqlValue::Int(5),
            SqlValue::Int(2_000),
        ]]],
    );
    // Refused: the waiter LISTENs on the name's channel (the listener connection).
    let (lid, conn, sql, _) = next(&mut core, &mut p).unwrap();
    assert_eq!(conn, Connection::Listener);
    assert_eq!(sql, vec![format!("LISTEN {}", listen_channel("jobs"))]);
    // When the LISTEN takes effect the name is checked once (a release may have come first).
    p.handle_rows(&mut core, 2 * MS, lid, &[vec![]]);
    let (id, ..) = next(&mut core, &mut p).unwrap();
    p.handle_rows(
        &mut core,
        3 * MS,
        id,
        &[vec![vec![
            SqlValue::Int(0),
            SqlValue::Int(5),
            SqlValue::Int(2_000),
        ]]],
    );
    // Idle: no request until the holder's expiry or a notification.
    assert!(next(&mut core, &mut p).is_none());
    p.handle_notification(&mut core, 4 * MS, b"lh_other", b"jobs");
    p.handle_notification(&mut core, 4 * MS, listen_channel("x").as_bytes(), b"x");
    assert_eq!(p.counters().ignored_notifications, 2);
    assert!(next(&mut core, &mut p).is_none());
    p.handle_notification(
        &mut core,
        5 * MS,
        listen_channel("jobs").as_bytes(),
        b"jobs",
    );
    let (id, ..) = next(&mut core, &mut p).expect("a release wakes the waiter");
    p.handle_rows(
        &mut core,
        6 * MS,
        id,
        &[vec![vec![
            SqlValue::Int(1),
            SqlValue::Int(6),
            SqlValue::Int(3_000),
        ]]],
    );
    let evs = events(&mut core, &mut p);
    assert!(
        matches!(evs[..], [Event::Acquired { lease: l, fencing_token: 6, .. }] if l == lease),
        "{evs:?}"
    );
    // Granted: the waiter UNLISTENs; the release names the channel it notifies.
    let (_, conn, sql, _) = next(&mut core, &mut p).unwrap();
    assert_eq!(
        (conn, sql[0].as_str()),
        (
            Connection::Listener,
            &*format!("UNLISTEN {}", listen_channel("jobs"))
        )
    );
    core.release(7 * MS, lease).unwrap();
    let (_, _, sql, params) = next(&mut core, &mut p).unwrap();
    assert_eq!(sql, vec!["SELECT leasehold_release($1, $2, $3)"]);
    assert_eq!(params[0][2], Param::Text(listen_channel("jobs")));
}

#[test]
fn asynchronous_commit_sets_synchronous_commit_off_in_the_writing_statements_only() {
    let cfg = Config {
        notifications: true,
        ..Config::default()
    };
    let mut core = Client::new(cfg, &[9; 32]).unwrap();
    let opts = SqlOptions {
        asynchronous_commit: true,
        ..SqlOptions::default()
    };
    let mut p = SqlProtocol::new(Dialect::Postgres, opts).unwrap();
    let lease = acquire(&mut core, "jobs", 60_000);
    pg_migrated(&mut core, &mut p);
    let off = "FROM set_config('synchronous_commit', 'off', true) s";
    // Still one statement (one round trip), the setting local to its transaction.
    let (id, _, sql, params) = next(&mut core, &mut p).unwrap();
    assert_eq!(sql.len(), 1);
    assert!(
        sql[0].contains(off) && sql[0].contains("leasehold_acquire($1, $2, $3)"),
        "{sql:?}"
    );
    assert_eq!(params[0].len(), 3);
    p.handle_rows(
        &mut core,
        MS,
        id,
        &[vec![vec![
            SqlValue::Int(1),
            SqlValue::Int(7),
            SqlValue::Int(3_000),
        ]]],
    );
    assert!(matches!(
        events(&mut core, &mut p)[..],
        [Event::Acquired {
            fencing_token: 7,
            ..
        }]
    ));
    core.handle_timeout(1_500 * MS);
    let (id, _, sql, _) = next(&mut core, &mut p).expect("a renewal");
    assert_eq!(
        sql,
        vec![format!("SELECT leasehold_renew($1, $2, $3) {off}")]
    );
    p.handle_rows(&mut core, 1_501 * MS, id, &[vec![vec![SqlValue::Int(1)]]]);
    core.release(1_502 * MS, lease).unwrap();
    let (_, _, sql, _) = next(&mut core, &mut p).unwrap();
    assert_eq!(
        sql,
        vec![format!("SELECT leasehold_release($1, $2, $3) {off}")]
    );
    // A status query writes nothing: it is left as it is.
    p.request_status(&mut core, 1_503 * MS, "jobs").unwrap();
    let (_, _, sql, _) = next(&mut core, &mut p).unwrap();
    assert!(
        sql[0].contains("leasehold_status") && !sql[0].contains("set_config"),
        "{sql:?}"
    );
}

#[test]
fn a_lost_listener_connection_listens_again_and_rechecks() {
    let (mut core, mut p) = setup(Dialect::Postgres);
    acquire(&mut core, "jobs", 60_000);
    pg_migrated(&mut core, &mut p);
    let (id, ..) = next(&mut core, &mut p).unwrap();
    p.handle_rows(
        &mut core,
        MS,
        id,
        &[vec![vec![
            SqlValue::Int(0),
            SqlValue::Int(5),
            SqlValue::Int(20_000),
        ]]],
    );
    let (lid, ..) = next(&mut core, &mut p).unwrap();
    p.handle_rows(&mut core, 2 * MS, lid, &[vec![]]);
    let (id, ..) = next(&mut core, &mut p).unwrap();
    p.handle_rows(
        &mut core,
        3 * MS,
        id,
        &[vec![vec![
            SqlValue::Int(0),
            SqlValue::Int(5),
            SqlValue::Int(20_000),
        ]]],
    );
    assert!(next(&mut core, &mut p).is_none());
    p.handle_connection_reset(&mut core, 4 * MS, Connection::Listener);
    let (lid, conn, ..) = next(&mut core, &mut p).unwrap();
    assert_eq!(conn, Connection::Listener);
    p.handle_rows(&mut core, 5 * MS, lid, &[vec![]]);
    let (_, conn, sql, _) = next(&mut core, &mut p).unwrap();
    assert_eq!(conn, Connection::Commands);
    assert!(sql[0].contains("leasehold_acquire"));
}

#[test]
fn flat_results_round_trip_and_hostile_lists_are_errors() {
    let rows: Vec<Rows<'_>> = vec![
        vec![],
        vec![vec![
            SqlValue::Int(1),
            text("é"),
            SqlValue::Null,
            SqlValue::Blob(b"\0x"),
            SqlValue::Float(1.5),
        ]],
    ];
    let (mut values, mut data) = (Vec::new(), Vec::new());
    encode(&rows, &mut values, &mut data);
    assert_eq!(decode(&values, &data).unwrap(), rows);
    let arr = |n| FlatValue {
        kind: sql::KIND_ARRAY,
        len: n,
        ..FlatValue::default()
    };
    let int = FlatValue {
        kind: sql::KIND_INT,
        ..FlatValue::default()
    };
    assert!(decode(&[], b"").is_err());
    assert!(decode(&[int], b"").is_err(), "not an array of statements");
    assert!(
        decode(&[arr(1), int], b"").is_err(),
        "a statement's rows are an array"
    );
    assert!(decode(&[arr(u64::MAX)], b"").is_err());
    assert!(
        decode(&[arr(1), arr(1), arr(1), int, int], b"").is_err(),
        "trailing"
    );
    let status = FlatValue {
        kind: 4,
        ..FlatValue::default()
    };
    assert!(
        decode(&[arr(1), arr(1), arr(1), status], b"").is_err(),
        "Redis kinds are not columns"
    );
    let text_oob = FlatValue {
        kind: sql::KIND_TEXT,
        offset: 2,
        len: 5,
        ..FlatValue::default()
    };
    assert!(decode(&[arr(1), arr(1), arr(1), text_oob], b"abc").is_err());
    assert!(decode(&vec![arr(0); sql::MAX_VALUES + 1], b"").is_err());
}

#[test]
fn a_request_the_host_never_answers_is_failed_not_waited_for_forever() {
    let (mut core, mut p) = setup(Dialect::Sqlite);
    let id = p.request_status(&mut core, 0, "jobs").unwrap();
    let (mid, _, sql, _) = next(&mut core, &mut p).unwrap();
    assert!(
        sql[0].starts_with("PRAGMA"),
        "the status query waits for the migration"
    );
    assert!(p.poll_status().is_none());
    p.handle_timeout(&mut core, 121_000 * MS);
    let (got, answer) = p.poll_status().unwrap();
    assert_eq!(got, id);
    assert!(answer.unwrap_err().contains("never answered"));
    // The late answer is stale; the next operation checks the schema again.
    p.handle_rows(&mut core, 122_000 * MS, mid, &sqlite_migration_rows());
    assert_eq!(p.counters().stale_results, 1);
    assert!(!p.is_ready());
    assert!(
        p.request_status(&mut core, 123_000 * MS, "").is_err(),
        "empty name"
    );
}

#[test]
fn a_sqlite_file_of_another_application_is_refused_before_anything_is_created() {
    let (mut core, mut p) = setup(Dialect::Sqlite);
    let lease = acquire(&mut core, "jobs", 0);
    let foreign: Rows<'static> = vec![
        vec![text("table"), text("users")],
        vec![text("index"), text("users_email")],
    ];
    inspected_sqlite(&mut core, &mut p, foreign.clone());
    // No migration (no CREATE, no journal mode switch): the acquire fails with the reason.
    assert_eq!(
        events(&mut core, &mut p),
        vec![Event::AcquireFailed {
            lease,
            reason: AcquireFailReason::Unavailable
        }]
    );
    let err = p.last_error();
    assert!(
        err.contains("belongs to something else") && err.contains("table \"users\""),
        "{err}"
    );
    // The acquire waited behind the inspection, never sent: no cleanup release is owed.
    assert!(next(&mut core, &mut p).is_none());
    assert_eq!(core.counters().pending_cleanups, 0);
    // The next acquire inspects again, and is refused again.
    acquire(&mut core, "jobs", 0);
    inspected_sqlite(&mut core, &mut p, foreign);
    assert!(next(&mut core, &mut p).is_none());
    assert_eq!(events(&mut core, &mut p).len(), 1);
    assert_eq!(p.counters().migrations, 0);
    // Once the file holds nothing foreign, the migration follows the inspection.
    acquire(&mut core, "jobs", 0);
    inspected_sqlite(&mut core, &mut p, Vec::new());
    let (_, _, sql, _) = next(&mut core, &mut p).unwrap();
    assert!(sql.iter().any(|s| s.contains("journal_mode = WAL")));
}

#[test]
fn a_stored_fence_at_its_limit_is_a_refusal_not_garbage() {
    let limit = 1i64 << 53;
    for last in [
        SqlValue::Int(limit),
        SqlValue::Int(i64::MAX),
        SqlValue::Float(9.223372036854776e18),
        text("oops"),
    ] {
        // SQLite: nothing granted (no live row of ours), the last fence read back.
        let (mut core, mut p) = setup(Dialect::Sqlite);
        let lease = acquire(&mut core, "jobs", 0);
        migrated_sqlite(&mut core, &mut p);
        let (id, ..) = next(&mut core, &mut p).unwrap();
        let mut rows: Vec<Rows<'static>> = vec![Vec::new(); 8];
        rows[6] = vec![vec![last]];
        p.handle_rows(&mut core, MS, id, &rows);
        assert_eq!(
            events(&mut core, &mut p),
            vec![Event::AcquireFailed {
                lease,
                reason: AcquireFailReason::Unavailable
            }]
        );
        let err = p.last_error();
        assert!(
            err.contains("refused") && err.contains("stored fence") && err.contains("2^53"),
            "{err}"
        );
        assert_eq!(p.counters().garbage_results, 0, "{last:?}");
        assert!(p.is_ready(), "a refusal is no reason to check the schema");
    }
    // An expired lock row whose fence is at the limit refuses the same way.
    let (mut core, mut p) = setup(Dialect::Sqlite);
    acquire(&mut core, "jobs", 0);
    migrated_sqlite(&mut core, &mut p);
    let (id, ..) = next(&mut core, &mut p).unwrap();
    let rows = sqlite_acquire_rows(vec![
        SqlValue::Int(0),
        SqlValue::Int(limit),
        SqlValue::Int(-5),
        SqlValue::Int(1),
    ]);
    p.handle_rows(&mut core, MS, id, &rows);
    assert!(
        p.last_error().contains("9007199254740992"),
        "{}",
        p.last_error()
    );
    // PostgreSQL: leasehold_acquire answers (false, the fence, NULL).
    let (mut core, mut p) = setup(Dialect::Postgres);
    let lease = acquire(&mut core, "jobs", 0);
    pg_migrated(&mut core, &mut p);
    let (id, ..) = next(&mut core, &mut p).unwrap();
    p.handle_rows(
        &mut core,
        MS,
        id,
        &[vec![vec![
            SqlValue::Int(0),
            SqlValue::Int(limit),
            SqlValue::Null,
        ]]],
    );
    assert!(
        matches!(events(&mut core, &mut p)[..], [Event::AcquireFailed { lease: l, .. }] if l == lease)
    );
    assert!(
        p.last_error().contains("stored fence is 9007199254740992"),
        "{}",
        p.last_error()
    );
    assert_eq!(p.counters().garbage_results, 0);
}
