//! State store adapters. The in-memory store keeps everything for the life of the process
//! only; the durable redb store arrives with `--state`.

mod memory;
mod durable;

pub use memory::MemoryStateStore;
pub use durable::RedbStateStore;
