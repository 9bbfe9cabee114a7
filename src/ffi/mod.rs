//! The C ABI of leasehold (`include/leasehold.h`, generated from this module by cbindgen).
//!
//! Every other binding (Python ctypes, Go cgo, C++, plain C) drives the core through exactly
//! these `lh_*` functions, so this module is the one place where the crate meets raw pointers.
//! It is also the only place allowed to contain `unsafe` code: the crate root denies it and this
//! module opts back in, so an audit of the FFI surface is an audit of `src/ffi/` alone.
//!
//! Layout:
//! - [`types`]: status codes, output kinds, reasons and the flat `#[repr(C)]` structs;
//! - `boundary`: the panic boundary, handle poisoning, the per-handle detail message and
//!   checked conversion of C pointers into Rust slices and strings;
//! - [`client`]: one `extern "C"` function per core input and getter;
//! - [`backend`]: a handle with the Redis protocol attached: requests, replies, messages;
//! - [`sql`]: a handle with the SQL protocol attached: statements, rows, notifications.
//! - [`etcd`]: a handle with the etcd protocol attached: HTTP requests, replies, watch streams.
//! - [`status`]: status queries on whichever protocol a handle has.
//! - [`memory`]: the in-memory reference lock service (`lh_memory_service_*`).
//!
//! The conventions (ownership, lifetimes of borrowed pointers, thread safety, the run loop)
//! are written once, at the top of the generated header (see `cbindgen.toml`).
#![allow(unsafe_code)]

// `types` first: cbindgen emits items in module order, so the header starts with the codes.
pub mod types;

pub mod backend;
pub(crate) mod boundary;
pub mod client;
/// A handle with the etcd protocol attached (`lh_client_new_etcd`, `lh_http_*`).
pub mod etcd;
/// The in-memory reference lock service for tests and examples (`lh_memory_service_*`).
pub mod memory;
/// A handle with the SQL protocol attached (`lh_client_new_sql`, `lh_sql_*`).
pub mod sql;
/// Status queries on any backend protocol (`lh_status_request`, `lh_poll_status`).
pub mod status;

pub use backend::*;
pub use client::*;
pub use etcd::*;
pub use memory::*;
pub use sql::*;
pub use status::*;
pub use types::*;
