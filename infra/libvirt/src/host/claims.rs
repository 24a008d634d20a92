//! What a machine of some type takes from its host's shared budget and what it holds alone.
//! The books of what machines hold alone (dedicated CPUs, huge pages, passthrough devices)
//! are the ports crate's [`Claims`], so the simulator keeps the same books; docs/placement.md
//! explains why no CPU, page or device is ever given to two machines.

use std::collections::BTreeMap;

use bigfleet_libvirt_domain::catalog::Placement;
pub use bigfleet_libvirt_ports::claims::{Ask, Claim, Room};

use crate::host::capacity::Shape;

/// What a machine of `vcpu` and `memory_mib` placed as `placement` with `devices`, its
/// disks being `disk_bytes`, takes from its host's shared budget (a dedicated machine's
/// vCPUs and a huge page machine's memory are not in it), and what it holds alone.
#[must_use]
pub fn needs(
    vcpu: u32,
    memory_mib: u64,
    placement: Placement,
    devices: &BTreeMap<String, u32>,
    disk_bytes: u64,
) -> (Shape, Ask) {
    let shape = Shape {
        vcpu: if placement.dedicated_cpus {
            0
        } else {
            u64::from(vcpu)
        },
        memory_mib: if placement.hugepage_kib.is_some() {
            0
        } else {
            memory_mib
        },
        disk_bytes,
    };
    let ask = Ask {
        dedicated: if placement.dedicated_cpus { vcpu } else { 0 },
        pages: (placement.hugepage_kib).zip(placement.pages(memory_mib)),
        devices: devices.clone(),
    };
    (shape, ask)
}

#[cfg(test)]
#[path = "claims_tests.rs"]
mod tests;
