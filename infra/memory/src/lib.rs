//! The in-process adapters, with no libvirt and no database: the fake hypervisor (`fake`)
//! that the binary runs without `--connect` and the tests and benchmarks drive, and the
//! in-memory state store (`store`) used without `--state`.

pub mod fake;
pub mod store;

pub use fake::{FakeConfig, FakeHypervisor};
pub use store::MemoryStateStore;
