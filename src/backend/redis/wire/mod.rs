//! The Redis wire in the core: RESP2/RESP3 encoding and decoding ([`codec`], through the
//! maintained `redis-protocol` crate) and one connection's protocol state ([`conn`]: the
//! handshake, pipelining, replies matched to commands, push messages, deadlines), so a host
//! only moves bytes (docs/design.md §5, the *stream* kind).
//!
//! Replies come out as owned [`Reply`] values; [`Reply::as_value`] gives the [`Value`] form
//! the Redis protocol ([`super::RedisProtocol::handle_reply`]) reads, so a connection's
//! replies reach it without passing through the flat value format of the C ABI.
//!
//! [`Value`]: crate::backend::value::Value

pub mod codec;
pub mod conn;
pub mod message;
mod scan;

pub use codec::{Decoder, Limits, Reply, WireError, encode_command};
pub use conn::{Conn, ConnError, ConnEvent, ConnOptions, Protocol, SendError};
pub use message::{ErrorKind, Push, Redirect, ServerError, SubscriptionKind};

#[cfg(test)]
mod codec_tests;
