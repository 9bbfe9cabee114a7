//! The SQL protocol (docs/design.md §6) for SQLite and PostgreSQL: the schema and its migration,
//! every statement with typed parameters, and what the rows mean, in one sans-IO object.
//!
//! [`SqlProtocol`] sits between the lease engine ([`Client`]) and a host that owns a
//! database connection (and, for PostgreSQL, a second one that LISTENs). It turns the
//! engine's commands into [`Request`]s — a short list of [`Statement`]s the host runs in
//! order on one connection, verbatim — and the rows the host hands back into the engine's
//! inputs. The host never writes SQL for the lock service and never reads a row itself.
//!
//! # A request
//!
//! Statements carry their own transaction control (SQLite: `BEGIN IMMEDIATE` … `COMMIT`;
//! PostgreSQL: one statement calling a function the migration created, so one round trip),
//! so the host runs them in autocommit mode. If one fails, the host stops, rolls back an open
//! transaction and reports the failure ([`SqlProtocol::handle_failed`]): a
//! [`FailureKind::Database`] (the database refused: busy, read-only, corrupt, missing table)
//! or a [`FailureKind::Transport`] (the connection broke: the outcome is unknown). Both are
//! retried failures for the engine, never grants; a refused acquire took no effect (it ends
//! as not applied: no cleanup release is owed), one whose connection broke may have, so
//! its cleanup release follows. After either, the schema is checked again
//! before the next operation (a deleted file or a dropped table is re-created, and fences
//! still do not regress, see below).
//!
//! Parameters are typed ([`Param`]). A few are facts only the host knows, read once per
//! request when it starts executing it (any moment after polling it) and bound wherever the
//! kind appears ([`HostValue`]): SQLite expiry runs on the host's system-wide monotonic
//! clock (`CLOCK_MONOTONIC`, comparable between processes) tied to the boot id, and fences
//! use the wall clock. The core itself reads no clock.
//!
//! # Fences
//!
//! A table of last fences per name is never reset; a grant mints
//! `max(previous + 1, clock in µs)` (PostgreSQL: `clock_timestamp()`; SQLite: the host's wall
//! clock). Fences strictly increase per name, and if the table is lost (a deleted file, a
//! restored backup) the clock, far past the old fences, keeps them increasing while clocks are
//! sane. None exceeds 2^53: a stored fence that leaves no room (planted, corrupt) refuses the
//! name's acquires without writing anything.
//!
//! # The first request
//!
//! The first operation checks the schema: on SQLite a read-only inspection first (another
//! application's file is refused before anything is created), then the migration, which
//! creates what is missing and checks the version and the columns. Operations wait for it; if
//! it fails they fail in transport with [`SqlProtocol::last_error`] saying why, and the next
//! attempt checks again (`schema.rs`).
//!
//! # Notifications
//!
//! PostgreSQL: a release runs `pg_notify` on the name's channel ([`listen_channel`]); the
//! protocol asks the host to `LISTEN` on the listener connection while a local lease waits
//! for the name, and turns each notification into a wake-up. When a LISTEN takes effect, the
//! name is checked once (a release just before it reached nobody). SQLite has none: waiters
//! wake at the holder's expiry (the refusal's retry hint) or by backoff.
//!
//! # The parts
//!
//! - `wire.rs`: the types that cross to the host (statements, parameters, rows, the flat
//!   result format and its decoder);
//! - `sqlite.rs`, `postgres.rs`: each dialect's schema, statements and result readers;
//! - `rows.rs`: strict readers of single rows and columns the dialects share;
//! - `schema.rs`: the schema check and migration every connection runs before its first
//!   operation;
//! - this module: the protocol object — what each engine command becomes, the LISTENs,
//!   and what each result means for the engine — over the shared outbox
//!   (`backend::outbox`: pending requests and their expiry, the event and status queues,
//!   the last error).

pub mod postgres;
mod rows;
mod schema;
pub mod sqlite;
mod wire;

use std::collections::HashMap;

use super::outbox::{MS, NEVER, Outbox};
pub use crate::backend::value::{FlatValue, KIND_ARRAY, KIND_BULK, KIND_INT, KIND_NIL};
use crate::{
    AcquireResult, Client, Command, Event, LockName, Output, ReleaseResult, RenewResult, RequestId,
    Token,
};
pub(crate) use rows::{
    MAX_FENCE, check_columns, fence, fence_refusal, flag, int, ms_to_ns, one_row, opt_int, text,
    token_text,
};
use schema::Schema;
pub use wire::{
    Connection, DecodeError, Dialect, FailureKind, HostValue, KIND_FLOAT, KIND_HOST_BOOT_ID,
    KIND_HOST_MONOTONIC_NS, KIND_HOST_NAME, KIND_HOST_PID, KIND_HOST_WALL_US, KIND_TEXT, MAX_DATA,
    MAX_VALUES, Param, Request, Rows, SqlOptions, SqlValue, Statement, decode, encode,
    listen_channel,
};

const MAX_ERROR_TEXT: usize = 512;
/// How long an unanswered request is remembered (the engine timed it out long before).
const FORGET_AFTER_NS: u64 = 120_000 * MS;

pub use super::LockStatus;

/// What the protocol saw, for diagnostics and tests (monotonic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SqlCounters {
    /// Requests emitted.
    pub requests: u64,
    /// Migrations emitted.
    pub migrations: u64,
    /// Requests the database refused.
    pub database_errors: u64,
    /// Requests that failed in transport.
    pub transport_failures: u64,
    /// Results of a shape the request cannot have (a foreign table, a wrong type).
    pub garbage_results: u64,
    /// Results and failures for unknown or already answered ids.
    pub stale_results: u64,
    /// Notifications that woke a waiting name.
    pub wakeups: u64,
    /// Notifications for names nobody here waits for, or malformed.
    pub ignored_notifications: u64,
}

/// The outcome of an acquire, as the dialects read it from rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Acquired {
    Granted {
        fence: u64,
    },
    Held {
        left_ms: Option<u64>,
    },
    /// Nothing written: the name's stored fence leaves no room for another (why).
    Refused(String),
}

#[derive(Debug, Clone)]
enum Op {
    /// SQLite: what the file holds, before anything is created or switched.
    Inspect,
    Migrate,
    Acquire {
        req: RequestId,
        name: LockName,
        token: Token,
        ttl_ms: u64,
    },
    Renew {
        req: RequestId,
        name: LockName,
        token: Token,
        ttl_ms: u64,
    },
    Release {
        req: RequestId,
        name: LockName,
        token: Token,
    },
    Status {
        id: u64,
        name: LockName,
    },
    Listen {
        name: LockName,
    },
    Unlisten,
}

#[derive(Debug)]
struct Pending {
    op: Op,
    connection: Connection,
    statements: Vec<Statement>,
}

#[derive(Debug)]
struct Watched {
    channel: String,
    /// The LISTEN took effect on the current listener connection.
    live: bool,
}

/// The SQL protocol of one client core. See the module docs.
#[derive(Debug)]
pub struct SqlProtocol {
    dialect: Dialect,
    opts: SqlOptions,
    out: Outbox<Pending>,
    schema: Schema,
    parked: Vec<Op>,
    watched: HashMap<LockName, Watched>,
    relisten_at: u64,
    counters: SqlCounters,
}

impl SqlProtocol {
    /// Creates the protocol for one core.
    pub fn new(dialect: Dialect, opts: SqlOptions) -> Result<Self, crate::Error> {
        opts.validate()?;
        Ok(Self {
            dialect,
            opts,
            out: Outbox::default(),
            schema: Schema::Unchecked,
            parked: Vec::new(),
            watched: HashMap::new(),
            relisten_at: NEVER,
            counters: SqlCounters::default(),
        })
    }

    /// The dialect.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Counters.
    pub fn counters(&self) -> SqlCounters {
        self.counters
    }

    /// The last database error, failed schema check or malformed result ("" if none).
    pub fn last_error(&self) -> &str {
        self.out.last_error()
    }

    /// Whether the schema was checked on the current connection.
    pub fn is_ready(&self) -> bool {
        self.schema == Schema::Ready
    }

    // ------------------------------------------------------------------------ outputs

    /// The next request to execute. The statements borrow this object until its next
    /// mutation.
    pub fn poll_request(&mut self, core: &mut Client) -> Option<Request<'_>> {
        self.pump(core);
        let (id, p) = self.out.next_ready()?;
        Some(Request {
            id,
            connection: p.connection,
            statements: &p.statements,
        })
    }

    /// Whether [`Self::poll_request`] may give a request, taking and moving nothing (the last
    /// request handed out stays valid): one is queued, or the engine has output that may
    /// make one.
    pub fn has_request(&self, core: &Client) -> bool {
        self.out.has_request(core)
    }

    /// The next event for the application.
    pub fn poll_event(&mut self, core: &mut Client) -> Option<Event> {
        self.pump(core);
        self.out.pop_event()
    }

    /// The next finished status query: its id and what the database said (or why not).
    pub fn poll_status(&mut self) -> Option<crate::backend::StatusAnswer> {
        self.out.pop_status()
    }

    /// When [`Self::handle_timeout`] must be called at the latest.
    pub fn poll_timeout(&mut self, core: &mut Client) -> Option<u64> {
        let t = core.poll_timeout().unwrap_or(NEVER).min(self.relisten_at);
        (t != NEVER).then_some(t)
    }

    // ------------------------------------------------------------------------- inputs

    /// Time passed: runs the engine's timers and due re-LISTENs.
    pub fn handle_timeout(&mut self, core: &mut Client, now: u64) {
        core.handle_timeout(now);
        let now = core.now();
        if self.relisten_at <= now {
            self.relisten_at = NEVER;
            self.relisten_all(now);
        }
        self.prune(core, now);
        self.pump(core);
    }

    /// Asks the database about `name` (for `leasehold status`); the answer comes out of
    /// [`Self::poll_status`] with the returned id.
    pub fn request_status(
        &mut self,
        core: &mut Client,
        now: u64,
        name: &str,
    ) -> Result<u64, crate::Error> {
        crate::validate_name(name)?;
        core.handle_timeout(now);
        let id = self.out.next_id();
        self.submit(
            Op::Status {
                id,
                name: LockName::from(name),
            },
            core.now(),
        );
        self.pump(core);
        Ok(id)
    }

    /// The rows of every statement of request `id`, in order. Unknown and already answered
    /// ids are counted and ignored.
    pub fn handle_rows(&mut self, core: &mut Client, now: u64, id: u64, results: &[Rows<'_>]) {
        core.handle_timeout(now);
        let now = core.now();
        let Some(p) = self.out.take(id) else {
            self.counters.stale_results += 1;
            self.pump(core);
            return;
        };
        if results.len() != p.statements.len() {
            let msg = format!(
                "{} results for {} statements",
                results.len(),
                p.statements.len()
            );
            self.garbage(&msg);
            self.fail_op(core, p.op, now, &msg, false);
            self.pump(core);
            return;
        }
        match p.op {
            Op::Inspect => self.on_inspected(core, now, results),
            Op::Migrate => self.on_migrated(core, now, results),
            Op::Acquire {
                req,
                ref name,
                ttl_ms,
                ..
            } => {
                let read = match self.dialect {
                    Dialect::Sqlite => sqlite::read_acquire(results),
                    Dialect::Postgres => postgres::read_acquire(results),
                };
                let result = match read {
                    Ok(Acquired::Granted { fence }) => AcquireResult::Granted {
                        fencing_token: fence,
                        ttl_ms,
                        backend_data: &[],
                    },
                    Ok(Acquired::Held { left_ms }) => AcquireResult::HeldByOther {
                        retry_after_ms: left_ms,
                    },
                    Ok(Acquired::Refused(why)) => {
                        self.note_error(&format!("acquire of {name:?} refused: {why}"));
                        AcquireResult::TransportError
                    }
                    Err(msg) => {
                        self.garbage(&format!("acquire of {name:?}: {msg}"));
                        AcquireResult::TransportError
                    }
                };
                let _ = core.handle_acquire_result(now, req, result);
            }
            Op::Renew { req, ref name, .. } => {
                let read = match self.dialect {
                    Dialect::Sqlite => sqlite::read_renew(results),
                    Dialect::Postgres => postgres::read_flag(results),
                };
                let result = match read {
                    Ok(true) => RenewResult::Renewed,
                    Ok(false) => RenewResult::Rejected,
                    Err(msg) => {
                        self.garbage(&format!("renew of {name:?}: {msg}"));
                        RenewResult::TransportError
                    }
                };
                let _ = core.handle_renew_result(now, req, result);
            }
            Op::Release { req, ref name, .. } => {
                let read = match self.dialect {
                    Dialect::Sqlite => sqlite::read_release(results),
                    Dialect::Postgres => postgres::read_flag(results),
                };
                let result = match read {
                    Ok(true) => ReleaseResult::Released,
                    Ok(false) => ReleaseResult::NotOwner,
                    Err(msg) => {
                        self.garbage(&format!("release of {name:?}: {msg}"));
                        ReleaseResult::TransportError
                    }
                };
                let _ = core.handle_release_result(now, req, result);
            }
            Op::Status { id, .. } => {
                let read = match self.dialect {
                    Dialect::Sqlite => sqlite::read_status(results),
                    Dialect::Postgres => postgres::read_status(results),
                };
                if let Err(msg) = &read {
                    self.garbage(&format!("status: {msg}"));
                }
                self.out.answer_status((id, read));
            }
            Op::Listen { name } => {
                if let Some(w) = self.watched.get_mut(&name) {
                    if !w.live {
                        w.live = true;
                        // A release just before the LISTEN took effect reached nobody.
                        let _ = core.handle_released(now, &name);
                    }
                }
            }
            Op::Unlisten => {}
        }
        self.pump(core);
    }

    /// Request `id` failed: the database refused it, or the connection broke. The engine sees
    /// a transport error; the schema is checked again before the next operation.
    pub fn handle_failed(
        &mut self,
        core: &mut Client,
        now: u64,
        id: u64,
        kind: FailureKind,
        message: &str,
    ) {
        core.handle_timeout(now);
        let now = core.now();
        let Some(p) = self.out.take(id) else {
            self.counters.stale_results += 1;
            self.pump(core);
            return;
        };
        match kind {
            FailureKind::Transport => self.counters.transport_failures += 1,
            FailureKind::Database => self.counters.database_errors += 1,
        }
        let what = match kind {
            FailureKind::Transport => "connection failed",
            FailureKind::Database => "database error",
        };
        self.note_error(&format!("{what}: {message}"));
        if p.connection == Connection::Commands {
            self.schema = Schema::Unchecked;
        }
        let detail = self.out.last_error().to_owned();
        // The database refused and the host rolled back: nothing took effect.
        self.fail_op(core, p.op, now, &detail, kind == FailureKind::Database);
        self.pump(core);
    }

    /// A notification from the listener connection (PostgreSQL): `payload` is the released
    /// name. Anything for a name nobody here waits for is counted and ignored.
    pub fn handle_notification(
        &mut self,
        core: &mut Client,
        now: u64,
        channel: &[u8],
        payload: &[u8],
    ) {
        core.handle_timeout(now);
        let now = core.now();
        let name = std::str::from_utf8(payload).ok().filter(|n| {
            self.watched
                .get(*n)
                .is_some_and(|w| w.channel.as_bytes() == channel)
        });
        match name {
            Some(n) => {
                self.counters.wakeups += 1;
                let _ = core.handle_released(now, n);
            }
            None => self.counters.ignored_notifications += 1,
        }
        self.pump(core);
    }

    /// The host opened `connection` anew (after a failure, a restart of the server, a
    /// replaced SQLite file): commands re-check the schema first; the listener LISTENs again
    /// (each name is checked once when its LISTEN takes effect).
    pub fn handle_connection_reset(&mut self, core: &mut Client, now: u64, connection: Connection) {
        core.handle_timeout(now);
        let now = core.now();
        match connection {
            Connection::Commands => {
                if self.schema == Schema::Ready {
                    self.schema = Schema::Unchecked;
                }
            }
            Connection::Listener => self.relisten_all(now),
        }
        self.pump(core);
    }

    // ---------------------------------------------------------------------- internals

    fn pump(&mut self, core: &mut Client) {
        while let Some(out) = core.poll_output() {
            match out {
                Output::Event(ev) => self.out.push_event(ev),
                Output::Command(cmd) => self.on_command(core.now(), cmd),
            }
        }
    }

    fn on_command(&mut self, now: u64, cmd: Command) {
        match cmd {
            Command::Acquire {
                request,
                name,
                token,
                ttl_ms,
                ..
            } => self.submit(
                Op::Acquire {
                    req: request,
                    name,
                    token,
                    ttl_ms,
                },
                now,
            ),
            Command::Renew {
                request,
                name,
                token,
                ttl_ms,
                ..
            } => self.submit(
                Op::Renew {
                    req: request,
                    name,
                    token,
                    ttl_ms,
                },
                now,
            ),
            Command::Release {
                request,
                name,
                token,
                ..
            } => self.submit(
                Op::Release {
                    req: request,
                    name,
                    token,
                },
                now,
            ),
            Command::Watch { name } => {
                if self.dialect == Dialect::Postgres && !self.watched.contains_key(&name) {
                    self.watched.insert(
                        name.clone(),
                        Watched {
                            channel: listen_channel(&name),
                            live: false,
                        },
                    );
                    self.emit(Op::Listen { name }, now);
                }
            }
            Command::Unwatch { name } => {
                if let Some(w) = self.watched.remove(&name) {
                    let sql = format!("UNLISTEN {}", w.channel);
                    self.push(
                        Op::Unlisten,
                        Connection::Listener,
                        vec![Statement::bare(sql)],
                        now,
                    );
                }
            }
        }
    }

    fn emit(&mut self, op: Op, now: u64) {
        let (connection, statements) = match (&op, self.dialect) {
            (Op::Inspect, _) => (Connection::Commands, sqlite::inspection(&self.opts)),
            (Op::Migrate, Dialect::Sqlite) => {
                self.counters.migrations += 1;
                (Connection::Commands, sqlite::migration(&self.opts))
            }
            (Op::Migrate, Dialect::Postgres) => {
                self.counters.migrations += 1;
                (Connection::Commands, postgres::migration())
            }
            (
                Op::Acquire {
                    name,
                    token,
                    ttl_ms,
                    ..
                },
                d,
            ) => (
                Connection::Commands,
                match d {
                    Dialect::Sqlite => sqlite::acquire(name, token, *ttl_ms),
                    Dialect::Postgres => postgres::acquire(&self.opts, name, token, *ttl_ms),
                },
            ),
            (
                Op::Renew {
                    name,
                    token,
                    ttl_ms,
                    ..
                },
                d,
            ) => (
                Connection::Commands,
                match d {
                    Dialect::Sqlite => sqlite::renew(name, token, *ttl_ms),
                    Dialect::Postgres => postgres::renew(&self.opts, name, token, *ttl_ms),
                },
            ),
            (Op::Release { name, token, .. }, d) => (
                Connection::Commands,
                match d {
                    Dialect::Sqlite => sqlite::release(name, token),
                    Dialect::Postgres => postgres::release(&self.opts, name, token),
                },
            ),
            (Op::Status { name, .. }, d) => (
                Connection::Commands,
                match d {
                    Dialect::Sqlite => sqlite::status(name),
                    Dialect::Postgres => postgres::status(name),
                },
            ),
            (Op::Listen { name }, _) => (
                Connection::Listener,
                vec![Statement::bare(format!("LISTEN {}", listen_channel(name)))],
            ),
            (Op::Unlisten, _) => return,
        };
        self.push(op, connection, statements, now);
    }

    fn push(&mut self, op: Op, connection: Connection, statements: Vec<Statement>, now: u64) {
        self.counters.requests += 1;
        self.out.push(
            Pending {
                op,
                connection,
                statements,
            },
            now.saturating_add(FORGET_AFTER_NS),
        );
    }

    /// Tells whoever waits for `op` that it failed.
    /// `op` got no usable answer. `not_applied`: it certainly took no effect (refused and
    /// rolled back, or never sent), so a failed acquire owes no cleanup release.
    fn fail_op(&mut self, core: &mut Client, op: Op, now: u64, detail: &str, not_applied: bool) {
        match op {
            Op::Inspect | Op::Migrate => {
                self.schema = Schema::Unchecked;
                // The parked operations were never sent.
                for op in std::mem::take(&mut self.parked) {
                    self.fail_op(core, op, now, detail, true);
                }
            }
            Op::Acquire { req, .. } => {
                let result = if not_applied {
                    AcquireResult::NotApplied
                } else {
                    AcquireResult::TransportError
                };
                let _ = core.handle_acquire_result(now, req, result);
            }
            Op::Renew { req, .. } => {
                let _ = core.handle_renew_result(now, req, RenewResult::TransportError);
            }
            Op::Release { req, .. } => {
                let _ = core.handle_release_result(now, req, ReleaseResult::TransportError);
            }
            Op::Status { id, .. } => self.out.answer_status((id, Err(detail.to_owned()))),
            Op::Listen { name } => {
                if let Some(w) = self.watched.get_mut(&name) {
                    w.live = false;
                    self.relisten_at = self.relisten_at.min(now.saturating_add(500 * MS));
                }
            }
            Op::Unlisten => {}
        }
    }

    fn relisten_all(&mut self, now: u64) {
        let names: Vec<LockName> = self.watched.keys().cloned().collect();
        for name in names {
            if let Some(w) = self.watched.get_mut(&name) {
                w.live = false;
            }
            self.emit(Op::Listen { name }, now);
        }
    }

    /// Forgets requests the host never answered. The engine timed its own out long ago; a
    /// migration, a status query or a LISTEN is failed here, so nothing waits for it forever.
    fn prune(&mut self, core: &mut Client, now: u64) {
        while let Some((_, p)) = self.out.pop_expired(now) {
            if matches!(
                p.op,
                Op::Inspect | Op::Migrate | Op::Status { .. } | Op::Listen { .. }
            ) {
                self.fail_op(
                    core,
                    p.op,
                    now,
                    "the host never answered the request",
                    false,
                );
            }
        }
    }

    fn garbage(&mut self, msg: &str) {
        self.counters.garbage_results += 1;
        self.note_error(&format!("unexpected result: {msg}"));
        // A foreign table of the same name shows up here first: check the schema again.
        self.schema = Schema::Unchecked;
    }

    fn note_error(&mut self, text: &str) {
        self.out.note_error(text, MAX_ERROR_TEXT);
    }
}
