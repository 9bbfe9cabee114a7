//! Shared support for the integration tests that talk to real servers.
pub mod cluster;
pub mod etcd;
pub mod resp;
pub mod rounds;
pub mod sentinel;
