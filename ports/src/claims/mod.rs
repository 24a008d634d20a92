//! The books of what a machine holds of its host alone: dedicated CPUs, huge pages and
//! passthrough devices, and who holds them ([`Claims`]), with the values they are kept in.
//! Pure data and rules, no libvirt: the libvirt adapter fills them from its hosts' documents
//! and renders what they decide, and the simulator keeps the very same books for its
//! simulated hosts, so the rules it checks under crashes and replays are the product's.

mod books;
mod cpuset;
mod devices;
mod placement;

pub use books::{Ask, Claim, Claims, Room};
pub use cpuset::{CpuSet, MAX_CPU_ID};
pub use devices::{DeviceKey, HostDevice, PciAddress, PlacedDevice};
pub use placement::{Cell, Held, Pinning, Placed, Topology};
