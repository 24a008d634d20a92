//! The simulated adapters behind the product's ports: `SimClock` and `SimSpawner` on
//! madsim's time and scheduler, `SimStateStore` with an explicit durability model, and
//! `SimHypervisor` hosts with seeded faults.

pub mod books;
pub mod clock;
pub mod hypervisor;
pub mod on_host;
pub mod store;
