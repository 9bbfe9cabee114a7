//! # leasehold — a sans-IO distributed-lock lease core
//!
//! leasehold decides everything about a lock lease — timing, renewal, loss detection,
//! bounded waits with jittered backoff, reentrancy, fencing tokens — and does no IO at all.
//! A host (the Python, Go, C++ or C binding, or your own code) owns the clock, the threads
//! and the connection to the lock service (Redis, SQLite, PostgreSQL, etcd, …) and drives
//! one [`Client`] per session.
//!
//! A lock client can *detect* that it lost a lock; it can never *enforce* exclusivity.
//! [`Client::is_held`] is advice for stopping work early. The fencing token in
//! [`Event::Acquired`], checked by the storage layer on every protected write, is the only
//! authority.
//!
//! ## The run loop a host implements
//!
//! 1. Wait until the earliest of: the deadline from [`Client::poll_timeout`], a command
//!    result, an application call, a release notification.
//! 2. Feed exactly that one input, with `now` from a monotonic clock in nanoseconds:
//!    [`Client::acquire`] / [`Client::release`], [`Client::handle_acquire_result`] /
//!    [`Client::handle_renew_result`] / [`Client::handle_release_result`] (matched by the
//!    command's [`RequestId`]), [`Client::handle_released`] (a name is free: wake one local
//!    waiter), [`Client::handle_wake`] (this lease's turn came), or [`Client::handle_timeout`].
//! 3. Drain [`Client::poll_output`] until it returns `None`: start each [`Command`]
//!    asynchronously (never block the loop on the network — a hung service must not delay
//!    loss detection) and deliver each [`Event`] to the application.
//! 4. Repeat.
//!
//! Manual renewal ([`Client::renew`]) and a release that reports the service's answer
//! ([`Client::release_reported`]) are application calls too; their answers arrive as
//! [`Event::Renewed`] and [`Event::ReleaseOutcome`] in step 3.
//!
//! Time never runs backwards inside the core (an older `now` is clamped); a big forward jump
//! is real elapsed time and expires leases. Early or spurious timeouts are harmless.
//!
//! ```
//! use leasehold::{AcquireOptions, AcquireResult, Client, Command, Config, Event, Output, RenewResult};
//!
//! let mut core = Client::new(Config::default(), &[7u8; 32]).unwrap();
//! let ms = 1_000_000u64;
//! let lease = core.acquire(0, "orders", AcquireOptions::new(3_000)).unwrap();
//!
//! // The host executes the Acquire command against its service and feeds the answer back.
//! let Some(Output::Command(Command::Acquire { request, .. })) = core.poll_output() else { panic!() };
//! core.handle_acquire_result(1 * ms, request, AcquireResult::Granted {
//!     fencing_token: 42, ttl_ms: 3_000, backend_data: &[],
//! }).unwrap();
//! let Some(Output::Event(Event::Acquired { fencing_token, valid_until, .. })) = core.poll_output() else { panic!() };
//! assert_eq!(fencing_token, 42);
//! // Validity counts from when the request was sent, minus the drift margin.
//! assert_eq!(valid_until, 3_000 * ms - (30 * ms + 2 * ms));
//!
//! // When the deadline comes, the core asks for a renewal.
//! let deadline = core.poll_timeout().unwrap();
//! core.handle_timeout(deadline);
//! let Some(Output::Command(Command::Renew { request, .. })) = core.poll_output() else { panic!() };
//! core.handle_renew_result(deadline + ms, request, RenewResult::Renewed).unwrap();
//! assert!(core.is_held(lease, deadline + ms).unwrap());
//!
//! // Releasing emits Released at once and a Release command for the service.
//! core.release(deadline + 2 * ms, lease).unwrap();
//! assert!(matches!(core.poll_output(), Some(Output::Event(Event::Released { .. }))));
//! assert!(matches!(core.poll_output(), Some(Output::Command(Command::Release { .. }))));
//! ```
//!
//! The C ABI in [`ffi`] (header `include/leasehold.h`) exposes exactly this surface.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod engine;
mod error;
mod types;

pub mod backend;
pub mod ffi;
pub mod service;
#[cfg(feature = "sim")]
pub mod sim;

pub use engine::client::Client;
pub use engine::config::{AcquireOptions, Config, MAX_LEASES_LIMIT, TTL_CEILING_MS};
pub use engine::rng::MIN_SEED_LEN;
pub use error::Error;
pub use types::{
    AcquireFailReason, AcquireResult, Command, Counters, Event, INLINE_NAME_LEN, LeaseId,
    LeaseInfo, LeaseState, LockName, LostReason, Output, ReleaseOutcome, ReleaseResult, Releasing,
    RenewResult, RequestId, Token,
};

/// Longest lock name in bytes: names become service keys, so they are bounded.
pub const MAX_NAME_LEN: usize = 512;
/// Checks a lock name: non-empty, at most [`MAX_NAME_LEN`] bytes, no NUL (names become C
/// strings and service keys). The core and the Redis key builders share this one rule.
pub fn validate_name(name: &str) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::EmptyName);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Error::NameTooLong { len: name.len() });
    }
    if name.as_bytes().contains(&0) {
        return Err(Error::NameHasNul);
    }
    Ok(())
}

/// Longest backend ownership data (an etcd lease id, a ZooKeeper path) in bytes.
pub const MAX_BACKEND_DATA_LEN: usize = 1024;
