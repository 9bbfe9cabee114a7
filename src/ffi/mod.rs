//! The C ABI of leasehold (`include/leasehold.h`, generated from this module by cbindgen).
//!
//! Every other binding (Python ctypes, Go cgo, C++, plain C) drives the core through exactly
//! these `lh_*` functions, so this module is the one place where the crate meets raw pointers.
//! It is also the only place allowed to contain `unsafe` code: the crate root denies it and this
//! module opts back in, so an audit of the FFI surface is an audit of `src/ffi/` alone.
//!
//! Layout:
//! - [`types`]: status codes, event kinds, reasons and the flat `#[repr(C)]` structs;
//! - `boundary`: the panic boundary, handle poisoning, the per-handle detail message and
//!   checked conversion of C pointers into Rust slices and strings;
//! - [`client`]: the application's calls (acquire, release, renew, events, timers, getters);
//! - [`counters`]: the engine's and the protocol's counters in one struct;
//! - [`drain`]: the host's drain after an input (request, events, deadline) in one call;
//! - [`backend`]: a client's backend and its options (`lh_client_new`);
//! - [`io`]: the seam — one tagged request poll and one answer function per kind, the same for
//!   every backend;
//! - [`stream`]: the answers of the stream kind (opened, bytes read, closed);
//! - [`values`]: the flat value format of answers and SQL parameters;
//! - [`status`]: status queries on the handle's backend;
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
pub mod counters;
pub mod drain;
pub mod io;
/// The in-memory reference lock service for tests and examples (`lh_memory_service_*`).
pub mod memory;
/// Status queries on any backend protocol (`lh_status_request`, `lh_poll_status`).
pub mod status;
pub mod stream;
pub mod values;

pub use backend::*;
pub use client::*;
pub use counters::*;
pub use drain::*;
pub use io::*;
pub use memory::*;
pub use status::*;
pub use stream::*;
pub use types::*;
pub use values::*;
