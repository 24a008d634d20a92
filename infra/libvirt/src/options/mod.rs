//! The bottom floor: the operator's choices as plain data. Every libvirt flag is a field of
//! [`DomainConfig`] or a policy here, validated by the composition root's launch plan and
//! used by the floors above as is. Nothing here talks to libvirt or renders a document.

pub mod addresses;
mod config;
pub(crate) mod devices;
mod golden;
pub mod ignition;
pub(crate) mod platform;
mod policies;

pub use addresses::{AddressBook, AddressPools, StaticAddress};
pub use bigfleet_libvirt_ports::claims::CpuSet;
pub use config::{DomainConfig, LibvirtConfig};
pub use devices::{CpuChoice, CpuMode, NicSource};
pub use golden::GoldenImage;
pub use ignition::{IgnitionDelivery, IgnitionSetup};
pub use platform::{DirectKernel, DomainType, Firmware, Platform, SeedBus};
pub use policies::{
    AgentPolicy, Budget, CapacityPolicy, GcPolicy, HostPolicy, REQUESTS_PER_CALL, fit_connections,
};
