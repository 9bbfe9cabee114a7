//! Backend protocols (docs/design.md §6): what to send to a lock service and what its replies mean,
//! written once in Rust for every host.
//!
//! A protocol sits between the lease engine ([`crate::Client`]) and the host's own client
//! library. It consumes the engine's commands and produces backend requests (for Redis: an
//! argument vector and the connection that runs it); it consumes replies and notifications
//! and feeds the engine's inputs. The engine stays backend-neutral; the host executes
//! requests verbatim and hands replies back unread.

pub mod etcd;
pub mod memory;
pub mod redis;
pub mod sql;
