//! The PostgreSQL dialect: expiry on the server's clock, one round trip per operation.
//!
//! ```text
//! leasehold_meta   (key PRIMARY KEY, value)                         -- schema version
//! leasehold_fences (name PRIMARY KEY, fence bigint)                 -- never deleted
//! leasehold_locks  (name PRIMARY KEY, token, fence bigint, expires_at timestamptz,
//!                   acquired_at timestamptz, waited boolean)        -- one row per name, kept
//! leasehold_acquire(name, token, ttl_ms) / leasehold_renew(…) / leasehold_release(name,
//!                   token, channel) / leasehold_status(name)        -- PL/pgSQL functions
//! ```
//!
//! Each operation is one statement calling a function, so one round trip in its own
//! transaction. Every operation on a name locks its lock row (acquire with `FOR UPDATE`,
//! renew and release by updating it), so they are serialized per name, and acquire reads
//! `clock_timestamp()` only after the lock is held: a renewal that committed while it waited
//! is seen. Expiry, remaining time and fences use `clock_timestamp()`: client clocks do not
//! matter.
//!
//! A name's lock row is created on first use and kept: release clears its token rather than
//! deleting it, so every later write is an in-place (HOT) update of one row rather than an
//! insert and a delete that leave dead rows and index entries behind. A refused acquire sets
//! `waited`, a grant clears it, and a release notifies the name's channel only when it is
//! set: `pg_notify` takes a database-wide lock at commit, and with nobody waiting it would
//! wake nobody. Each waiter's latest refusal came after the current grant (it was refused by
//! the current holder), so the flag is set at that holder's release; a waiter woken by it
//! retries, and one that loses the race is refused again and sets it again.
//!
//! With [`SqlOptions::asynchronous_commit`] the three writing statements also run
//! `set_config('synchronous_commit', 'off', true)`, for their own transaction only: the
//! commit does not wait for the WAL flush (docs/backends.md weighs what that costs). The
//! migration runs in one transaction under an advisory lock, so concurrent first starts do
//! not collide.

use super::{
    Acquired, Param, Rows, SqlOptions, Statement, check_columns, fence, flag, int, listen_channel,
    one_row, opt_int, text, token_text,
};
use crate::{LockName, Token};

/// The schema version in `leasehold_meta`.
pub const SCHEMA_VERSION: &str = "1";

/// Key of the advisory lock that serializes migrations (`lh` in ASCII and a tag).
const MIGRATION_LOCK: i64 = 0x6c68_5f73_716c_0001;

const CREATE: [&str; 3] = [
    "CREATE TABLE IF NOT EXISTS leasehold_meta (key text PRIMARY KEY, value text NOT NULL)",
    "CREATE TABLE IF NOT EXISTS leasehold_fences (name text PRIMARY KEY, fence bigint NOT NULL)",
    "CREATE TABLE IF NOT EXISTS leasehold_locks (name text PRIMARY KEY, token text NOT NULL, \
     fence bigint NOT NULL, expires_at timestamptz NOT NULL, acquired_at timestamptz NOT NULL, \
     waited boolean NOT NULL DEFAULT false)",
];

// A row with token '' is free (released, or created on first use). A stored fence of 2^53
// or more leaves no room for the next one: the call returns (false, that fence, NULL) and
// writes nothing (not even the first-use row), where `+ 1` would commit past the range every
// host holds exactly, or fail at bigint's end.
const F_ACQUIRE: &str = r#"CREATE OR REPLACE FUNCTION leasehold_acquire(p_name text, p_token text, p_ttl_ms bigint)
RETURNS TABLE (lh_granted boolean, lh_fence bigint, lh_remaining_ms bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_token text;
    v_held bigint;
    v_expires timestamptz;
    v_waited boolean;
    v_now timestamptz;
    v_fence bigint;
    v_last bigint;
BEGIN
    SELECT l.token, l.fence, l.expires_at, l.waited INTO v_token, v_held, v_expires, v_waited
        FROM leasehold_locks l WHERE l.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        SELECT f.fence INTO v_last FROM leasehold_fences f WHERE f.name = p_name;
        IF v_last >= 9007199254740992 THEN
            RETURN QUERY SELECT false, v_last, NULL::bigint;
            RETURN;
        END IF;
        INSERT INTO leasehold_locks AS l (name, token, fence, expires_at, acquired_at)
            VALUES (p_name, '', 0, '-infinity', '-infinity') ON CONFLICT (name) DO NOTHING;
        SELECT l.token, l.fence, l.expires_at, l.waited INTO v_token, v_held, v_expires, v_waited
            FROM leasehold_locks l WHERE l.name = p_name FOR UPDATE;
    END IF;
    v_now := clock_timestamp();
    IF v_token <> '' AND v_expires > v_now THEN
        IF v_token = p_token THEN
            UPDATE leasehold_locks l SET expires_at = v_now + p_ttl_ms * interval '1 millisecond'
                WHERE l.name = p_name;
            RETURN QUERY SELECT true, v_held, p_ttl_ms;
        ELSE
            IF NOT v_waited THEN
                UPDATE leasehold_locks l SET waited = true WHERE l.name = p_name;
            END IF;
            RETURN QUERY SELECT false, v_held,
                greatest(1, ceil(extract(epoch FROM v_expires - v_now) * 1000))::bigint;
        END IF;
        RETURN;
    END IF;
    SELECT f.fence INTO v_last FROM leasehold_fences f WHERE f.name = p_name;
    IF greatest(v_last, v_held) >= 9007199254740992
            OR extract(epoch FROM v_now) * 1000000 > 9007199254740992 THEN
        RETURN QUERY SELECT false, greatest(v_last, v_held), NULL::bigint;
        RETURN;
    END IF;
    -- Only acquires write fences, and they hold the lock row: no lock needed here.
    UPDATE leasehold_fences f SET fence = greatest(f.fence + 1, v_held + 1,
            floor(extract(epoch FROM v_now) * 1000000)::bigint)
        WHERE f.name = p_name RETURNING f.fence INTO v_fence;
    IF NOT FOUND THEN
        v_fence := greatest(v_held + 1, floor(extract(epoch FROM v_now) * 1000000)::bigint);
        INSERT INTO leasehold_fences AS f (name, fence) VALUES (p_name, v_fence)
            ON CONFLICT (name) DO UPDATE SET fence = greatest(f.fence + 1, excluded.fence)
            RETURNING f.fence INTO v_fence;
    END IF;
    UPDATE leasehold_locks l SET token = p_token, fence = v_fence,
            expires_at = v_now + p_ttl_ms * interval '1 millisecond', acquired_at = v_now,
            waited = false
        WHERE l.name = p_name;
    RETURN QUERY SELECT true, v_fence, p_ttl_ms;
END
$fn$"#;

const F_RENEW: &str = r#"CREATE OR REPLACE FUNCTION leasehold_renew(p_name text, p_token text, p_ttl_ms bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    UPDATE leasehold_locks l
        SET expires_at = clock_timestamp() + p_ttl_ms * interval '1 millisecond'
        WHERE l.name = p_name AND l.token = p_token AND l.expires_at > clock_timestamp();
    RETURN FOUND;
END
$fn$"#;

const F_RELEASE: &str = r#"CREATE OR REPLACE FUNCTION leasehold_release(p_name text, p_token text, p_channel text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_live boolean;
    v_waited boolean;
BEGIN
    UPDATE leasehold_locks l SET token = '' WHERE l.name = p_name AND l.token = p_token
        RETURNING l.expires_at > clock_timestamp(), l.waited INTO v_live, v_waited;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_waited THEN
        PERFORM pg_notify(p_channel, p_name);
    END IF;
    RETURN v_live;
END
$fn$"#;

const F_STATUS: &str = r#"CREATE OR REPLACE FUNCTION leasehold_status(p_name text)
RETURNS TABLE (lh_held boolean, lh_fence bigint, lh_remaining_ms bigint, lh_last_fence bigint,
               lh_held_for_ms bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    RETURN QUERY SELECT coalesce(l.token <> '' AND l.expires_at > v_now, false), l.fence,
            greatest(1, ceil(extract(epoch FROM l.expires_at - v_now) * 1000))::bigint,
            nullif(f.fence, 0),
            greatest(0, floor(extract(epoch FROM v_now - l.acquired_at) * 1000))::bigint
        FROM (SELECT p_name AS name) n
        LEFT JOIN leasehold_locks l ON l.name = n.name
        LEFT JOIN leasehold_fences f ON f.name = n.name;
END
$fn$"#;

const COLUMNS_OF: &str = "SELECT column_name::text, data_type::text FROM information_schema.columns \
     WHERE table_schema = current_schema() AND table_name::text = $1 ORDER BY ordinal_position";

const LOCKS_COLUMNS: [(&str, &str); 6] = [
    ("name", "text"),
    ("token", "text"),
    ("fence", "bigint"),
    ("expires_at", "timestamp with time zone"),
    ("acquired_at", "timestamp with time zone"),
    ("waited", "boolean"),
];
const FENCES_COLUMNS: [(&str, &str); 2] = [("name", "text"), ("fence", "bigint")];

const M_VERSION: usize = 10;
const M_LOCKS: usize = 11;
const M_FENCES: usize = 12;

/// The migration: tables (created when missing), functions (replaced, so an upgrade takes
/// effect) and checks, in one transaction under an advisory lock.
pub(crate) fn migration() -> Vec<Statement> {
    let mut s = vec![
        Statement::bare("BEGIN"),
        Statement::with(
            "SELECT pg_advisory_xact_lock($1)",
            vec![Param::Int(MIGRATION_LOCK)],
        ),
    ];
    s.extend(CREATE.iter().map(|c| Statement::bare(*c)));
    s.push(Statement::bare(
        "INSERT INTO leasehold_meta (key, value) VALUES ('schema', '1') ON CONFLICT (key) DO NOTHING",
    ));
    s.extend(
        [F_ACQUIRE, F_RENEW, F_RELEASE, F_STATUS]
            .iter()
            .map(|f| Statement::bare(*f)),
    );
    s.extend([
        Statement::bare("SELECT value FROM leasehold_meta WHERE key = 'schema'"),
        Statement::with(COLUMNS_OF, vec![Param::Text("leasehold_locks".into())]),
        Statement::with(COLUMNS_OF, vec![Param::Text("leasehold_fences".into())]),
        Statement::bare("COMMIT"),
    ]);
    s
}

pub(crate) fn check_migration(r: &[Rows<'_>]) -> Result<(), String> {
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
    Ok(())
}

// `set_config` in the same statement, so it holds for that statement's transaction only.
const ACQUIRE: &str =
    "SELECT lh_granted, lh_fence, lh_remaining_ms FROM leasehold_acquire($1, $2, $3)";
const ACQUIRE_ASYNC: &str = "SELECT a.lh_granted, a.lh_fence, a.lh_remaining_ms \
     FROM set_config('synchronous_commit', 'off', true) s, leasehold_acquire($1, $2, $3) a";
const RENEW: &str = "SELECT leasehold_renew($1, $2, $3)";
const RENEW_ASYNC: &str =
    "SELECT leasehold_renew($1, $2, $3) FROM set_config('synchronous_commit', 'off', true) s";
const RELEASE: &str = "SELECT leasehold_release($1, $2, $3)";
const RELEASE_ASYNC: &str =
    "SELECT leasehold_release($1, $2, $3) FROM set_config('synchronous_commit', 'off', true) s";

fn op(sql: &'static str, a: &LockName, b: Param, c: Param) -> Vec<Statement> {
    vec![Statement::with(
        sql,
        vec![Param::Text(a.as_str().to_owned()), b, c],
    )]
}

/// Acquire: one call (idempotent for the same token).
pub(crate) fn acquire(
    opts: &SqlOptions,
    name: &LockName,
    token: &Token,
    ttl_ms: u64,
) -> Vec<Statement> {
    op(
        if opts.asynchronous_commit {
            ACQUIRE_ASYNC
        } else {
            ACQUIRE
        },
        name,
        Param::Text(token_text(token)),
        Param::Int(i64::try_from(ttl_ms).unwrap_or(i64::MAX)),
    )
}

pub(crate) fn read_acquire(r: &[Rows<'_>]) -> Result<Acquired, String> {
    let row = one_row(&r[0], "leasehold_acquire")?;
    let [granted, f, left] = row else {
        return Err(format!(
            "leasehold_acquire: {} columns, expected 3",
            row.len()
        ));
    };
    let granted = flag(granted, "granted")?;
    if !granted && *left == super::SqlValue::Null {
        return Ok(Acquired::Refused(super::fence_refusal(f)));
    }
    let f = fence(f, "fence")?;
    if granted {
        Ok(Acquired::Granted { fence: f })
    } else {
        let left = int(left, "remaining_ms")?;
        Ok(Acquired::Held {
            left_ms: u64::try_from(left).ok().filter(|&l| l > 0),
        })
    }
}

/// Renew: one call.
pub(crate) fn renew(
    opts: &SqlOptions,
    name: &LockName,
    token: &Token,
    ttl_ms: u64,
) -> Vec<Statement> {
    op(
        if opts.asynchronous_commit {
            RENEW_ASYNC
        } else {
            RENEW
        },
        name,
        Param::Text(token_text(token)),
        Param::Int(i64::try_from(ttl_ms).unwrap_or(i64::MAX)),
    )
}

/// Release: one call; it notifies the name's channel when someone waited.
pub(crate) fn release(opts: &SqlOptions, name: &LockName, token: &Token) -> Vec<Statement> {
    op(
        if opts.asynchronous_commit {
            RELEASE_ASYNC
        } else {
            RELEASE
        },
        name,
        Param::Text(token_text(token)),
        Param::Text(listen_channel(name)),
    )
}

pub(crate) fn read_flag(r: &[Rows<'_>]) -> Result<bool, String> {
    let row = one_row(&r[0], "result")?;
    match row {
        [v] => flag(v, "result"),
        _ => Err(format!("{} columns, expected 1", row.len())),
    }
}

/// Status: one call.
pub(crate) fn status(name: &LockName) -> Vec<Statement> {
    vec![Statement::with(
        "SELECT lh_held, lh_fence, lh_remaining_ms, lh_last_fence, lh_held_for_ms \
         FROM leasehold_status($1)",
        vec![Param::Text(name.as_str().to_owned())],
    )]
}

pub(crate) fn read_status(r: &[Rows<'_>]) -> Result<super::LockStatus, String> {
    let row = one_row(&r[0], "leasehold_status")?;
    let [held, f, left, last, age] = row else {
        return Err(format!(
            "leasehold_status: {} columns, expected 5",
            row.len()
        ));
    };
    let mut st = super::LockStatus {
        last_fencing_token: match last {
            super::SqlValue::Null => None,
            v => Some(fence(v, "last fence")?),
        },
        ..Default::default()
    };
    if flag(held, "held")? {
        st.held = true;
        st.fencing_token = Some(fence(f, "fence")?);
        st.remaining_ttl_ms = opt_int(left, "remaining_ms")?.map(|l| l.max(1) as u64);
        st.held_for_ms = opt_int(age, "held_for_ms")?.map(|a| a.max(0) as u64);
    }
    Ok(st)
}
