//! Shared support for the integration tests that talk to real servers.
pub mod resp;
