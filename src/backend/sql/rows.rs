//! Reading rows for the dialects: typed column access, fences and their limit, column
//! listings, and the parameter forms they share.

use super::{MS, Rows, SqlValue};
use crate::Token;

/// The single row of a statement's result.
pub(crate) fn one_row<'r, 'a>(
    rows: &'r Rows<'a>,
    what: &str,
) -> Result<&'r [SqlValue<'a>], String> {
    match rows.as_slice() {
        [row] => Ok(row),
        _ => Err(format!("{what}: {} rows, expected 1", rows.len())),
    }
}

pub(crate) fn int(v: &SqlValue<'_>, what: &str) -> Result<i64, String> {
    match v {
        SqlValue::Int(i) => Ok(*i),
        other => Err(format!(
            "{what}: {} where an integer belongs",
            kind_name(other)
        )),
    }
}

pub(crate) fn opt_int(v: &SqlValue<'_>, what: &str) -> Result<Option<i64>, String> {
    match v {
        SqlValue::Null => Ok(None),
        other => int(other, what).map(Some),
    }
}

pub(crate) fn flag(v: &SqlValue<'_>, what: &str) -> Result<bool, String> {
    match int(v, what)? {
        0 => Ok(false),
        1 => Ok(true),
        i => Err(format!("{what}: {i} where a boolean belongs")),
    }
}

pub(crate) fn text<'a>(v: &SqlValue<'a>, what: &str) -> Result<&'a [u8], String> {
    match v {
        SqlValue::Text(s) => Ok(s),
        other => Err(format!("{what}: {} where text belongs", kind_name(other))),
    }
}

/// The largest fence: 2^53, what every host language holds exactly.
pub(crate) const MAX_FENCE: i64 = 1 << 53;

/// A fence as stored: an integer in `1..=2^53` (what every host language holds exactly).
pub(crate) fn fence(v: &SqlValue<'_>, what: &str) -> Result<u64, String> {
    let f = int(v, what)?;
    if (1..=MAX_FENCE).contains(&f) {
        Ok(f as u64)
    } else {
        Err(format!("{what}: fence {f} out of range"))
    }
}

/// Why an acquire was refused when a stored fence `v` leaves no room for the next one.
pub(crate) fn fence_refusal(v: &SqlValue<'_>) -> String {
    let shown = match v {
        SqlValue::Int(i) => i.to_string(),
        SqlValue::Float(x) => format!("{x:e} (a REAL)"),
        SqlValue::Text(t) => {
            let t = String::from_utf8_lossy(&t[..t.len().min(32)]).into_owned();
            format!("{t:?} (text)")
        }
        other => kind_name(other).to_owned(),
    };
    format!(
        "its stored fence is {shown}, and a fence must be an integer of at most 2^53 \
         (9007199254740992): no fence can follow it, so nothing was granted or written \
         (the recovery is in docs/sql-protocol.md)"
    )
}

pub(crate) fn kind_name(v: &SqlValue<'_>) -> &'static str {
    match v {
        SqlValue::Null => "NULL",
        SqlValue::Int(_) => "an integer",
        SqlValue::Float(_) => "a float",
        SqlValue::Text(_) => "text",
        SqlValue::Blob(_) => "a blob",
    }
}

/// Checks that `rows` (name, type) list exactly the expected columns, types compared
/// case-insensitively.
pub(crate) fn check_columns(
    rows: &Rows<'_>,
    table: &str,
    want: &[(&str, &str)],
) -> Result<(), String> {
    let mut got = Vec::with_capacity(rows.len());
    for row in rows {
        let [n, t] = row.as_slice() else {
            return Err(format!("{table}: column listing has {} values", row.len()));
        };
        got.push((
            String::from_utf8_lossy(text(n, table)?).into_owned(),
            String::from_utf8_lossy(text(t, table)?).to_ascii_lowercase(),
        ));
    }
    let ok = got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|((n, t), (wn, wt))| n == wn && t == wt);
    if ok {
        Ok(())
    } else {
        let listed: Vec<String> = got.iter().map(|(n, t)| format!("{n} {t}")).collect();
        Err(format!(
            "table {table} exists with columns ({}), not leasehold's",
            listed.join(", ")
        ))
    }
}

pub(crate) fn token_text(token: &Token) -> String {
    token.to_string()
}

pub(crate) fn ms_to_ns(ms: u64) -> i64 {
    i64::try_from(ms.saturating_mul(MS)).unwrap_or(i64::MAX)
}
