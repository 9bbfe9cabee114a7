//! Caller-misuse errors. Faults of the service or network are never errors: they are inputs
//! that become events, so a host can tell "my code is wrong" from "the world is unreliable".

use crate::types::LeaseId;

/// Why a call was refused. Every error leaves the core exactly as it was before the call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Lock names key the service's records; an empty one would alias every backend's root.
    #[error("lock name is empty")]
    EmptyName,
    /// Names are bounded so a hostile caller cannot make the core or the backend allocate freely.
    #[error("lock name is {len} bytes; the limit is {max}", max = crate::MAX_NAME_LEN)]
    NameTooLong {
        /// Length of the rejected name in bytes.
        len: usize,
    },
    /// NUL bytes break C strings and several backends' key formats.
    #[error("lock name contains a NUL byte")]
    NameHasNul,
    /// A TTL must leave room for the renew cadence, the drift margin and at least one retry.
    #[error("invalid TTL {ttl_ms} ms: {reason}")]
    InvalidTtl {
        /// The rejected TTL in milliseconds.
        ttl_ms: u64,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A configuration value that would make timing decisions meaningless.
    #[error("invalid configuration: {0}")]
    InvalidConfig(&'static str),
    /// Ownership tokens are only as unique as the entropy behind them.
    #[error("seed is {len} bytes; at least {min} are required", min = crate::MIN_SEED_LEN)]
    SeedTooShort {
        /// Length of the rejected seed in bytes.
        len: usize,
    },
    /// The id was never issued by this core (a stale id from another core, or garbage).
    #[error("unknown lease {0}")]
    UnknownLease(LeaseId),
    /// The lease finished (released, lost or failed) and its record is gone or terminal.
    #[error("lease {0} has ended")]
    LeaseEnded(LeaseId),
    /// Only a granted lease can be renewed; one still acquiring has nothing to extend.
    #[error("lease {0} is not granted yet")]
    NotGranted(LeaseId),
    /// The table of live leases is bounded so memory stays O(configured limit).
    #[error("too many live leases")]
    TooManyLeases,
    /// Backend ownership bytes are echoed in commands; they are bounded like names.
    #[error("backend data is {len} bytes; the limit is {max}", max = crate::MAX_BACKEND_DATA_LEN)]
    BackendDataTooLong {
        /// Length of the rejected data in bytes.
        len: usize,
    },
}
