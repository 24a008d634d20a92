//! State store adapters. The in-memory store keeps everything for the life of the process
//! only; the durable redb store arrives with `--state`, and [`inspect`] reads its file
//! without serving it.

mod durable;
mod memory;

pub use durable::{Inspected, RedbStateStore, inspect};
pub use memory::MemoryStateStore;

#[cfg(test)]
mod contract_tests;
