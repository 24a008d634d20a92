//! The in-memory state store: it keeps everything for the life of the process only (the
//! durable store for `--state` is the redb crate's).

mod memory;

pub use memory::MemoryStateStore;

#[cfg(test)]
mod contract_tests;
