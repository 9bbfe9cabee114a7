//! Backend protocols and services: what a lock service does with the engine's commands.
pub mod memory;
