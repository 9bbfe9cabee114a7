//! The SQLite dialect: one file shared by the processes of one host.
//!
//! The schema is the one Python's `SQLiteLockService` wrote before it ran on this protocol
//! (so its older files open unchanged; schema version `1`):
//!
//! ```text
//! leasehold_meta     (key PRIMARY KEY, value)                    -- schema version
//! leasehold_locks    (name PRIMARY KEY, token, fence, expiry_ns, boot_id, pid)
//! leasehold_fences   (name PRIMARY KEY, fence)                   -- never deleted
//! leasehold_watchers (name, addr, pid)                           -- its old wake-up channel, unused
//! leasehold_holders  (name PRIMARY KEY, fence, host, since_ns)   -- who holds it, for status
//! ```
//!
//! Every operation is one `BEGIN IMMEDIATE` transaction (the read-check-write is atomic
//! between processes). Expiry instants are the host's `CLOCK_MONOTONIC` in ns, valid only
//! under the boot id written beside them (the clock restarts at boot). An inspection that
//! writes nothing refuses a file holding anything else first. The migration puts the
//! file in WAL mode with `synchronous=FULL` (a minted fence survives a power loss), sets the
//! busy timeout and runs `quick_check`.

use super::{
    Acquired, HostValue, Param, Rows, SqlOptions, SqlValue, Statement, check_columns, fence, flag,
    int, ms_to_ns, one_row, opt_int, text, token_text,
};
use crate::{LockName, Token};

/// The schema version in `leasehold_meta`.
pub const SCHEMA_VERSION: &str = "1";

const CREATE: [&str; 5] = [
    "CREATE TABLE IF NOT EXISTS leasehold_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS leasehold_locks (name TEXT PRIMARY KEY, token TEXT NOT NULL, \
     fence INTEGER NOT NULL, expiry_ns INTEGER NOT NULL, boot_id TEXT NOT NULL, \
     pid INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS leasehold_fences (name TEXT PRIMARY KEY, fence INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS leasehold_watchers (name TEXT NOT NULL, addr BLOB NOT NULL, \
     pid INTEGER NOT NULL, PRIMARY KEY (name, addr))",
    "CREATE TABLE IF NOT EXISTS leasehold_holders (name TEXT PRIMARY KEY, fence INTEGER NOT NULL, \
     host TEXT NOT NULL, since_ns INTEGER NOT NULL)",
];

const LOCKS_COLUMNS: [(&str, &str); 6] = [
    ("name", "text"),
    ("token", "text"),
    ("fence", "integer"),
    ("expiry_ns", "integer"),
    ("boot_id", "text"),
    ("pid", "integer"),
];
const FENCES_COLUMNS: [(&str, &str); 2] = [("name", "text"), ("fence", "integer")];
const HOLDERS_COLUMNS: [(&str, &str); 4] = [
    ("name", "text"),
    ("fence", "integer"),
    ("host", "text"),
    ("since_ns", "integer"),
];

/// Lists what the file holds besides leasehold's tables (and SQLite's own): a database of
/// another application, which must not be migrated, nor switched to WAL.
const FOREIGN_OBJECTS: &str = "SELECT type, name FROM sqlite_master \
     WHERE tbl_name NOT LIKE 'leasehold\\_%' ESCAPE '\\' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' \
     ORDER BY name LIMIT 6";

/// The inspection before the migration: it reads the schema and writes nothing.
pub(crate) fn inspection(opts: &SqlOptions) -> Vec<Statement> {
    vec![
        Statement::bare(format!("PRAGMA busy_timeout = {}", opts.busy_timeout_ms)),
        Statement::bare(FOREIGN_OBJECTS),
    ]
}

/// Refuses a file that holds anything but leasehold's tables (an empty file is fine).
pub(crate) fn check_inspection(r: &[Rows<'_>]) -> Result<(), String> {
    if r[1].is_empty() {
        return Ok(());
    }
    let mut listed: Vec<String> = Vec::new();
    for row in r[1].iter().take(5) {
        let [kind, name] = row.as_slice() else {
            return Err(format!("schema listing has {} values", row.len()));
        };
        listed.push(format!(
            "{} {:?}",
            String::from_utf8_lossy(text(kind, "type")?),
            String::from_utf8_lossy(text(name, "name")?)
        ));
    }
    if r[1].len() > 5 {
        listed.push("...".into());
    }
    Err(format!(
        "the database file belongs to something else (it holds {}); leasehold uses a file of \
         its own and changes nothing in this one: give it another path",
        listed.join(", ")
    ))
}

// Positions of the statements whose rows the migration checks.
const M_JOURNAL: usize = 1;
const M_QUICK_CHECK: usize = 3;
const M_VERSION: usize = 11;
const M_LOCKS: usize = 12;
const M_FENCES: usize = 13;
const M_HOLDERS: usize = 14;

/// The migration: connection settings, then the tables (created when missing) and their
/// checks in one transaction.
pub(crate) fn migration(opts: &SqlOptions) -> Vec<Statement> {
    let mut s = vec![
        Statement::bare(format!("PRAGMA busy_timeout = {}", opts.busy_timeout_ms)),
        // Fails or answers another mode on a read-only or foreign file.
        Statement::bare("PRAGMA journal_mode = WAL"),
        Statement::bare("PRAGMA synchronous = FULL"),
        Statement::bare("PRAGMA quick_check"),
        Statement::bare("BEGIN IMMEDIATE"),
    ];
    s.extend(CREATE.iter().map(|c| Statement::bare(*c)));
    s.extend([
        Statement::bare("INSERT OR IGNORE INTO leasehold_meta (key, value) VALUES ('schema', '1')"),
        Statement::bare("SELECT value FROM leasehold_meta WHERE key = 'schema'"),
        Statement::bare("SELECT name, type FROM pragma_table_info('leasehold_locks')"),
        Statement::bare("SELECT name, type FROM pragma_table_info('leasehold_fences')"),
        Statement::bare("SELECT name, type FROM pragma_table_info('leasehold_holders')"),
        Statement::bare("COMMIT"),
    ]);
    s
}

pub(crate) fn check_migration(r: &[Rows<'_>]) -> Result<(), String> {
    let mode = text(&one_row(&r[M_JOURNAL], "journal_mode")?[0], "journal_mode")?;
    if !mode.eq_ignore_ascii_case(b"wal") {
        return Err(format!(
            "cannot switch the lock database to WAL mode (it stays in {:?})",
            String::from_utf8_lossy(mode)
        ));
    }
    let ok = match r[M_QUICK_CHECK].as_slice() {
        [row] => matches!(row.as_slice(), [v] if text(v, "quick_check") == Ok(&b"ok"[..])),
        _ => false,
    };
    if !ok {
        let lines: Vec<String> = r[M_QUICK_CHECK]
            .iter()
            .take(3)
            .filter_map(|row| row.first())
            .map(|v| String::from_utf8_lossy(text(v, "quick_check").unwrap_or(b"?")).into_owned())
            .collect();
        return Err(format!("lock database is corrupt ({})", lines.join("; ")));
    }
    let version = text(
        one_row(&r[M_VERSION], "schema version")?
            .first()
            .ok_or("schema version: no column")?,
        "schema version",
    )?;
    if version != SCHEMA_VERSION.as_bytes() {
        return Err(format!(
            "lock database has schema version {:?}, this leasehold uses {SCHEMA_VERSION:?}",
            String::from_utf8_lossy(version)
        ));
    }
    check_columns(&r[M_LOCKS], "leasehold_locks", &LOCKS_COLUMNS)?;
    check_columns(&r[M_FENCES], "leasehold_fences", &FENCES_COLUMNS)?;
    check_columns(&r[M_HOLDERS], "leasehold_holders", &HOLDERS_COLUMNS)?;
    Ok(())
}

// Acquire parameters: ?1 name, ?2 token, ?3 ttl in ns, ?4 monotonic ns, ?5 boot id,
// ?6 wall µs, ?7 pid, ?8 host name. A statement binds exactly the first N it uses.
const A_REFRESH: &str = "UPDATE leasehold_locks SET expiry_ns = ?4 + ?3 \
     WHERE name = ?1 AND token = ?2 AND boot_id = ?5 AND expiry_ns > ?4";
// The grant computes the next fence, max(previous + 1, wall clock), and writes nothing when
// a stored fence is not an integer below 2^53 (a planted or corrupt value): it would leave
// the range every host holds exactly (or turn into a REAL past i64::MAX).
const A_GRANT: &str = "INSERT INTO leasehold_locks (name, token, fence, expiry_ns, boot_id, pid) \
     SELECT ?1, ?2, n.fence, ?4 + ?3, ?5, ?7 FROM (SELECT max( \
         coalesce((SELECT fence FROM leasehold_fences WHERE name = ?1), 0) + 1, \
         coalesce((SELECT fence FROM leasehold_locks WHERE name = ?1), 0) + 1, ?6) AS fence) n \
     WHERE NOT EXISTS (SELECT 1 FROM leasehold_locks \
                       WHERE name = ?1 AND boot_id = ?5 AND expiry_ns > ?4) \
       AND typeof(n.fence) = 'integer' AND n.fence <= 9007199254740992 \
       AND NOT EXISTS (SELECT 1 FROM leasehold_fences WHERE name = ?1 \
                       AND (typeof(fence) <> 'integer' OR fence >= 9007199254740992)) \
       AND NOT EXISTS (SELECT 1 FROM leasehold_locks WHERE name = ?1 \
                       AND (typeof(fence) <> 'integer' OR fence >= 9007199254740992)) \
     ON CONFLICT (name) DO UPDATE SET token = excluded.token, fence = excluded.fence, \
         expiry_ns = excluded.expiry_ns, boot_id = excluded.boot_id, pid = excluded.pid";
// Records the granted fence as the name's last (never lowers it).
const A_MINT: &str = "INSERT INTO leasehold_fences (name, fence) \
     SELECT name, fence FROM leasehold_locks WHERE name = ?1 AND token = ?2 \
     ON CONFLICT (name) DO UPDATE SET fence = excluded.fence \
         WHERE excluded.fence > leasehold_fences.fence";
const A_HOLDER: &str = "INSERT INTO leasehold_holders (name, fence, host, since_ns) \
     SELECT name, fence, ?8, ?4 FROM leasehold_locks l WHERE name = ?1 AND token = ?2 \
       AND NOT EXISTS (SELECT 1 FROM leasehold_holders h WHERE h.name = ?1 AND h.fence = l.fence) \
     ON CONFLICT (name) DO UPDATE SET fence = excluded.fence, host = excluded.host, \
         since_ns = excluded.since_ns";
const A_RESULT: &str = "SELECT token = ?2, fence, expiry_ns - ?4, boot_id = ?5 \
     FROM leasehold_locks WHERE name = ?1";
const A_LAST: &str = "SELECT fence FROM leasehold_fences WHERE name = ?1";
const A_RESULT_AT: usize = 5;
const A_LAST_AT: usize = 6;

/// Acquire: refresh our own live grant (idempotent), or grant with a new fence if the lock
/// is free; record the fence; then read the row and the last fence.
pub(crate) fn acquire(name: &LockName, token: &Token, ttl_ms: u64) -> Vec<Statement> {
    let p = [
        Param::Text(name.as_str().to_owned()),
        Param::Text(token_text(token)),
        Param::Int(ms_to_ns(ttl_ms)),
        Param::Host(HostValue::MonotonicNs),
        Param::Host(HostValue::BootId),
        Param::Host(HostValue::WallUs),
        Param::Host(HostValue::Pid),
        Param::Host(HostValue::HostName),
    ];
    vec![
        Statement::bare("BEGIN IMMEDIATE"),
        Statement::with(A_REFRESH, p[..5].to_vec()),
        Statement::with(A_GRANT, p[..7].to_vec()),
        Statement::with(A_MINT, p[..2].to_vec()),
        Statement::with(A_HOLDER, p.to_vec()),
        Statement::with(A_RESULT, p[..5].to_vec()),
        Statement::with(A_LAST, p[..1].to_vec()),
        Statement::bare("COMMIT"),
    ]
}

pub(crate) fn read_acquire(r: &[Rows<'_>]) -> Result<Acquired, String> {
    let last = match r[A_LAST_AT].as_slice() {
        [] => None,
        [row] => Some(*row.first().ok_or("last fence: no column")?),
        rows => return Err(format!("{} fence rows for one name", rows.len())),
    };
    let row = match r[A_RESULT_AT].as_slice() {
        [row] => row,
        [] => {
            return match exhausted(last, None) {
                Some(msg) => Ok(Acquired::Refused(msg)),
                None => Err("no lock row after the acquire".into()),
            };
        }
        rows => return Err(format!("{} lock rows for one name", rows.len())),
    };
    let [ours, f, left_ns, same_boot] = row.as_slice() else {
        return Err(format!("lock row has {} columns, expected 4", row.len()));
    };
    let (ours, same_boot) = (flag(ours, "token")?, flag(same_boot, "boot id")?);
    let left_ns = int(left_ns, "expiry_ns")?;
    if !same_boot || left_ns <= 0 {
        // Nothing was granted: a stored fence at its limit refused it.
        if let Some(msg) = exhausted(last, Some(*f)) {
            return Ok(Acquired::Refused(msg));
        }
        return Err("the lock row is expired right after the acquire".into());
    }
    Ok(if ours {
        Acquired::Granted {
            fence: fence(f, "fence")?,
        }
    } else {
        Acquired::Held {
            left_ms: Some((left_ns as u64).div_ceil(super::MS)),
        }
    })
}

/// Why no fence can follow the stored ones (`None`: they leave room).
fn exhausted(last: Option<SqlValue<'_>>, held: Option<SqlValue<'_>>) -> Option<String> {
    [last, held]
        .into_iter()
        .flatten()
        .find(|v| !matches!(v, SqlValue::Int(i) if *i < super::MAX_FENCE))
        .map(|v| super::fence_refusal(&v))
}

// Renew parameters: ?1 name, ?2 token, ?3 ttl in ns, ?4 monotonic ns, ?5 boot id.
const R_UPDATE: &str = A_REFRESH;

/// Renew: extend our live grant (never an expired one: the lock was free for a while).
pub(crate) fn renew(name: &LockName, token: &Token, ttl_ms: u64) -> Vec<Statement> {
    vec![
        Statement::bare("BEGIN IMMEDIATE"),
        Statement::with(
            R_UPDATE,
            vec![
                Param::Text(name.as_str().to_owned()),
                Param::Text(token_text(token)),
                Param::Int(ms_to_ns(ttl_ms)),
                Param::Host(HostValue::MonotonicNs),
                Param::Host(HostValue::BootId),
            ],
        ),
        Statement::bare("SELECT changes()"),
        Statement::bare("COMMIT"),
    ]
}

pub(crate) fn read_renew(r: &[Rows<'_>]) -> Result<bool, String> {
    match int(&one_row(&r[2], "changes()")?[0], "changes()")? {
        0 => Ok(false),
        1 => Ok(true),
        n => Err(format!("renew changed {n} rows")),
    }
}

// Release parameters: ?1 name, ?2 token, ?3 monotonic ns, ?4 boot id.
const L_LIVE: &str = "SELECT boot_id = ?4 AND expiry_ns > ?3 FROM leasehold_locks \
     WHERE name = ?1 AND token = ?2";
const L_DELETE: &str = "DELETE FROM leasehold_locks WHERE name = ?1 AND token = ?2";

/// Release: delete our row, live or not; "released" only if it was still live.
pub(crate) fn release(name: &LockName, token: &Token) -> Vec<Statement> {
    let name = Param::Text(name.as_str().to_owned());
    let token = Param::Text(token_text(token));
    vec![
        Statement::bare("BEGIN IMMEDIATE"),
        Statement::with(
            L_LIVE,
            vec![
                name.clone(),
                token.clone(),
                Param::Host(HostValue::MonotonicNs),
                Param::Host(HostValue::BootId),
            ],
        ),
        Statement::with(L_DELETE, vec![name, token]),
        Statement::bare("COMMIT"),
    ]
}

pub(crate) fn read_release(r: &[Rows<'_>]) -> Result<bool, String> {
    match r[1].as_slice() {
        [] => Ok(false),
        [row] => flag(row.first().ok_or("no column")?, "live"),
        rows => Err(format!("{} lock rows for one name", rows.len())),
    }
}

// Status parameters: ?1 name, ?2 monotonic ns, ?3 boot id.
const S_LOCK: &str = "SELECT boot_id = ?3 AND expiry_ns > ?2, fence, expiry_ns - ?2, pid \
     FROM leasehold_locks WHERE name = ?1";
const S_FENCE: &str = "SELECT fence FROM leasehold_fences WHERE name = ?1";
const S_HOLDER: &str = "SELECT fence, host, ?2 - since_ns FROM leasehold_holders WHERE name = ?1";

/// Status: the lock row, the last fence and the holder's record, in one read transaction.
pub(crate) fn status(name: &LockName) -> Vec<Statement> {
    let p = vec![
        Param::Text(name.as_str().to_owned()),
        Param::Host(HostValue::MonotonicNs),
        Param::Host(HostValue::BootId),
    ];
    vec![
        Statement::bare("BEGIN"),
        Statement::with(S_LOCK, p.clone()),
        Statement::with(S_FENCE, p[..1].to_vec()),
        Statement::with(S_HOLDER, p[..2].to_vec()),
        Statement::bare("COMMIT"),
    ]
}

pub(crate) fn read_status(r: &[Rows<'_>]) -> Result<super::LockStatus, String> {
    let mut st = super::LockStatus::default();
    if let [row] = r[2].as_slice() {
        st.last_fencing_token = Some(fence(row.first().ok_or("no column")?, "last fence")?);
    }
    let held_fence = match r[1].as_slice() {
        [] => None,
        [row] => {
            let [live, f, left_ns, pid] = row.as_slice() else {
                return Err(format!("lock row has {} columns, expected 4", row.len()));
            };
            if flag(live, "live")? {
                st.held = true;
                let f = fence(f, "fence")?;
                st.fencing_token = Some(f);
                let left = int(left_ns, "expiry_ns")?.max(1) as u64;
                st.remaining_ttl_ms = Some(left.div_ceil(super::MS));
                st.holder_pid = opt_int(pid, "pid")?.filter(|&p| p != 0);
                Some(f)
            } else {
                None
            }
        }
        rows => return Err(format!("{} lock rows for one name", rows.len())),
    };
    if let (Some(f), [row]) = (held_fence, r[3].as_slice()) {
        if let [hf, host, age] = row.as_slice() {
            // A holder record of an earlier grant describes someone else.
            if fence(hf, "holder fence")? == f {
                let host = String::from_utf8_lossy(text(host, "host")?).into_owned();
                st.holder_host = (!host.is_empty()).then_some(host);
                st.held_for_ms = Some(int(age, "since_ns")?.max(0) as u64 / super::MS);
            }
        }
    }
    Ok(st)
}
