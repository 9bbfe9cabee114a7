//! The reference lock service (docs/design.md §6, "Memory"): not a client protocol but a lock
//! *service*, in process, shared by the simulator and the tests.
//!
//! - [`table`]: the lock records — grants, expiry, idempotent acquires, rising fences — that
//!   the simulator's service and the memory service both keep;
//! - [`memory`]: the memory service around it (connections, fault switches, notifications,
//!   limits, a clock of its own), which every binding's test helpers reach through the C ABI;
//! - [`call`]: how it reads a memory-protocol request and writes its answer, so clients reach
//!   it through the same seam as every other backend.

pub mod call;
pub mod memory;
pub mod table;
