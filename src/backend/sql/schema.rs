//! The schema gate: no operation runs on a connection whose schema was not checked.
//!
//! The first operation runs the migration: it creates missing tables (and, for PostgreSQL,
//! the functions), then checks the schema version and the column names and types. On SQLite
//! a read-only inspection comes first: a file holding anything but leasehold's tables is
//! another application's and is refused before anything is created or switched to WAL. Operations
//! wait for it; if it fails (a foreign table of the same name, a read-only or corrupt file),
//! they fail in transport with [`super::SqlProtocol::last_error`] saying why, and the next attempt
//! runs the migration again.
//!
//! The check runs again after any failure on the commands connection, a result of the wrong
//! shape (a foreign table of the same name shows up there first) or a reconnection, so a
//! deleted file or a dropped table is re-created and fences still do not regress.

use super::{Dialect, Op, Rows, SqlProtocol, postgres, sqlite};
use crate::Client;

/// Whether the commands connection's schema is known good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Schema {
    /// Not checked since the connection opened or last failed: the next operation checks.
    Unchecked,
    /// The inspection or the migration is out; operations are parked until it answers.
    Migrating,
    /// Checked: operations go out at once.
    Ready,
}

impl SqlProtocol {
    /// An operation that needs the schema: emitted now, or after the migration.
    pub(super) fn submit(&mut self, op: Op, now: u64) {
        match self.schema {
            Schema::Ready => self.emit(op, now),
            Schema::Migrating => self.parked.push(op),
            Schema::Unchecked => {
                self.parked.push(op);
                self.schema = Schema::Migrating;
                let first = match self.dialect {
                    Dialect::Sqlite => Op::Inspect,
                    Dialect::Postgres => Op::Migrate,
                };
                self.emit(first, now);
            }
        }
    }

    /// SQLite's read-only inspection answered: another application's file is refused before
    /// anything is created; otherwise the migration goes out.
    pub(super) fn on_inspected(&mut self, core: &mut Client, now: u64, results: &[Rows<'_>]) {
        match sqlite::check_inspection(results) {
            Ok(()) => self.emit(Op::Migrate, now),
            Err(msg) => self.schema_unusable(core, now, &msg),
        }
    }

    /// The migration answered: the parked operations go out, or fail with the reason.
    pub(super) fn on_migrated(&mut self, core: &mut Client, now: u64, results: &[Rows<'_>]) {
        let checked = match self.dialect {
            Dialect::Sqlite => sqlite::check_migration(results),
            Dialect::Postgres => postgres::check_migration(results),
        };
        match checked {
            Ok(()) => {
                self.schema = Schema::Ready;
                for op in std::mem::take(&mut self.parked) {
                    self.emit(op, now);
                }
            }
            Err(msg) => self.schema_unusable(core, now, &msg),
        }
    }

    /// The inspection or the migration refused the database: everything parked fails.
    fn schema_unusable(&mut self, core: &mut Client, now: u64, msg: &str) {
        self.counters.garbage_results += 1;
        self.note_error(&format!("the lock schema is not usable: {msg}"));
        self.schema = Schema::Unchecked;
        let detail = self.out.last_error().to_owned();
        for op in std::mem::take(&mut self.parked) {
            self.fail_op(core, op, now, &detail, true); // never sent
        }
    }
}
