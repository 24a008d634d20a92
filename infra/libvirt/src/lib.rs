//! The real libvirt backend: [`LibvirtHypervisor`] drives one libvirt host per zone
//! through the `virt` bindings and implements the `Hypervisor` port.
//!
//! One folder a subsystem, each on its floor; a folder uses only the folders below it
//! (docs/architecture.md §7 draws the floors, and the tidy test keeps them):
//!
//! - `options`, `metrics` (the ground): the operator's choices as plain data (every libvirt
//!   flag), and the adapter's series;
//! - `render`: what a domain looks like ([`xml::DomainSpec`]) and its documents: domain,
//!   overlay and seed volume XML, devices and MAC addresses, firmware, the cloud-init seed,
//!   the ownership tag;
//! - `host`: one connection per zone (dial, credentials, TLS peer checks, backoff, lanes,
//!   health), libvirt's errors, capacity, our domains on a host, the test driver's files;
//! - `storage`: overlay and seed volumes, and the golden image;
//! - `guest`: the qemu guest agent, bootstrap and drain over it, the guest's addresses;
//! - `doctor`: the read-only probe of a host, the trial domains, and their judgement;
//! - `drift`: describe's scan, orphans, and the drift watch between describes;
//! - `service`: the `Hypervisor` implementation, Create and Delete with rollback, and
//!   [`LibvirtHypervisor::connect`].
//!
//! docs/libvirt.md describes how it behaves, and docs/operating.md's "Running against real libvirt
//! hosts" section how to operate it: connection URIs, image requirements and the in-guest hook
//! contract; the README's flag table lists the flags.

pub mod doctor;
mod drift;
mod guest;
mod host;
pub mod metrics;
mod options;
mod render;
mod service;
mod storage;

#[cfg(test)]
mod tests;

pub use doctor::probe::{ProbeTarget, probe};
pub use doctor::trial_domain as trial;
pub use guest::agent::{AgentError, GuestAgent};
pub use host::capacity::Shape;
pub use host::connection::Health;
pub use host::lanes::Lane;
pub use host::{fixture, lanes};
pub use metrics::lanes::LaneMetrics;
pub use options::addresses as address_pools;
pub use options::ignition;
pub use options::{
    AddressBook, AddressPools, AgentPolicy, Budget, CapacityPolicy, CpuChoice, CpuMode, CpuSet,
    DirectKernel, DomainConfig, DomainType, Firmware, GcPolicy, HostPolicy, IgnitionDelivery,
    IgnitionSetup, LibvirtConfig, NicSource, Platform, SeedBus, fit_connections,
};
pub use render::ownership::{NAMESPACE, Tag};
pub use render::{devices, xml};
pub use service::LibvirtHypervisor;
pub use storage::golden;

/// What a host of `cpus` CPUs and `memory_kib` KiB can run under `policy`.
#[must_use]
pub fn allocatable_for(cpus: u32, memory_kib: u64, policy: &CapacityPolicy) -> Shape {
    let node = host::capacity::Node { cpus, memory_kib };
    host::capacity::allocatable(node, None, policy, host::capacity::Carved::default())
}
