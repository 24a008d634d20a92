//! State store adapters. The in-memory store keeps everything for the life of the process
//! only; the durable redb store arrives with `--state`.

mod durable;
mod memory;

pub use durable::RedbStateStore;
pub use memory::MemoryStateStore;

#[cfg(test)]
mod contract_tests;
