//! The lease engine: timing and lifecycle decisions for every lease (docs/design.md §2–§4).
//!
//! Backend-neutral on purpose: it speaks in commands (acquire, renew, release, watch) and
//! results, never in a backend's wire format; `crate::backend` translates.

pub(crate) mod client;
pub(crate) mod config;
pub(crate) mod hash;
pub(crate) mod lease;
pub(crate) mod names;
pub(crate) mod phase;
pub(crate) mod prefetch;
pub(crate) mod rng;
pub(crate) mod table;
pub(crate) mod timers;
