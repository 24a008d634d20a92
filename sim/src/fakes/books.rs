//! What the simulated hosts have that a machine may hold alone, and the product's books of
//! it ([`Claims`], the libvirt adapter's own) in each provider process.
//!
//! Every host has two NUMA cells of four CPUs (0-3, 4-7), of which 2-7 are dedicated
//! (`--dedicated-cpus`), and three GPUs of class `gpu` bound to vfio-pci. The slots ask by
//! their index: slot 0 two dedicated CPUs, slot 1 a GPU, slot 2 a dedicated CPU and a GPU,
//! slot 3 nothing, slot 4 two dedicated CPUs; five slots fit a host with a GPU and a CPU to
//! spare. A domain's definition names what it holds (`Domain::held`), as a libvirt
//! definition does; a process's books start empty and are filled by a scan of the host's
//! definitions: describe's, or a Create's own when no scan has filled them yet (as the
//! adapter's `read_books`).
//!
//! One thing the simulation collapses: the host carries out a Create's steps at one instant,
//! even after the process that sent it has died (a request already in the daemon), whereas
//! the adapter claims on the process's side when its sequence begins. Such a late Create is
//! granted from books scanned at that instant. And its domain may appear after the next
//! process scanned the host, whose books then miss it and may give its CPUs or devices
//! again: the case docs/placement.md states as outside what the books can see (a define
//! that a frozen libvirtd carries out after its sender died and the next process scanned).
//! `claims-held-once` exempts a pair of domains when one of them is such a late one
//! (`Domain::late`), and judges every other pair.

use std::collections::{BTreeMap, BTreeSet};

use bigfleet_libvirt_domain::MachineId;
use bigfleet_libvirt_domain::catalog::{
    DeviceClasses, RawDeviceClass, RawPciIds, parse_machine_id,
};
use bigfleet_libvirt_ports::claims::{
    Ask, Cell, Claim, Claims, CpuSet, DeviceKey, HostDevice, PciAddress, Placed, Topology,
};

use crate::hosts::Domain;

/// The one device class the simulated hosts have.
const CLASS: &str = "gpu";

/// A simulated host's CPUs and GPUs.
#[must_use]
pub fn topology() -> Topology {
    let cell = |id: u32| Cell {
        id,
        cpus: (id * 4..id * 4 + 4).collect(),
    };
    let gpu = |bus: u8| HostDevice {
        name: format!("pci_0000_{bus:02x}_00_0"),
        key: DeviceKey::Pci(PciAddress {
            domain: 0,
            bus,
            slot: 0,
            function: 0,
        }),
        ids: (0x10de, 0x20b0),
        vf: false,
        mdev_type: None,
        driver: Some("vfio-pci".to_owned()),
        iommu_group: Some(u32::from(bus)),
        active: true,
    };
    Topology {
        cells: vec![cell(0), cell(1)],
        pages: BTreeMap::new(),
        devices: vec![gpu(0x3b), gpu(0x5e), gpu(0x86)],
    }
}

/// The device classes (`--device-classes`): `gpu`, the hosts' GPUs.
#[must_use]
pub fn classes() -> DeviceClasses {
    let class = RawDeviceClass {
        resource: "nvidia.com/gpu".to_owned(),
        pci: Some(RawPciIds {
            vendor: "10de".to_owned(),
            product: "20b0".to_owned(),
        }),
        ..RawDeviceClass::default()
    };
    let raw = BTreeMap::from([(CLASS.to_owned(), class)]);
    DeviceClasses::from_raw(Some(raw), "sim").expect("a valid class")
}

/// `--dedicated-cpus`.
#[must_use]
pub fn dedicated() -> CpuSet {
    (2..8).collect()
}

/// What the machine of slot `id` asks for alone.
#[must_use]
pub fn ask(id: &MachineId) -> Ask {
    let slot = parse_machine_id(id.as_str()).map_or(0, |parts| parts.index);
    let (dedicated, gpus) = match slot.rem_euclid(5) {
        0 | 4 => (2, 0),
        1 => (0, 1),
        2 => (1, 1),
        _ => (0, 0),
    };
    Ask {
        dedicated,
        pages: None,
        devices: (gpus > 0)
            .then(|| (CLASS.to_owned(), gpus))
            .into_iter()
            .collect(),
    }
}

/// What a domain placed as `placed` holds, as its definition names it.
#[must_use]
pub fn held(placed: &Placed) -> Claim {
    Claim {
        cpus: (placed.pinning.iter())
            .flat_map(|p| p.cpus.iter().copied())
            .collect(),
        pages: None,
        devices: placed.devices.iter().map(|d| d.key.clone()).collect(),
    }
}

/// A scan of one host into `books`: its topology and every domain's claim (every
/// simulated domain is the provider's, running or not, so each counts).
pub fn scan(books: &mut Claims, domains: &BTreeMap<MachineId, Domain>) {
    books.set_topology(topology(), &classes());
    let claims = (domains.values())
        .map(|d| (d.name.clone(), d.held.clone()))
        .collect();
    books.refresh(claims, &BTreeMap::new(), &BTreeMap::new());
}

/// What each domain on a host holds, by domain name, written out (`cpu 3`, `0000:3b:00.0`),
/// and whether it is a late one (`Domain::late`).
#[must_use]
pub fn holdings(domains: &BTreeMap<MachineId, Domain>) -> Vec<Holding> {
    (domains.values())
        .map(|d| {
            let cpus = d.held.cpus.iter().map(|c| format!("cpu {c}"));
            let devices = d.held.devices.iter().map(ToString::to_string);
            Holding {
                domain: d.name.clone(),
                late: d.late,
                held: cpus.chain(devices).collect(),
            }
        })
        .collect()
}

/// What one domain's definition holds alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    /// The domain's name.
    pub domain: String,
    /// Defined by a late Create (`Domain::late`).
    pub late: bool,
    /// Its CPUs (`cpu N`) and devices (PCI addresses).
    pub held: BTreeSet<String>,
}
