//! Passthrough devices as the books see them: what names one on its host ([`DeviceKey`]),
//! one device a host has ([`HostDevice`]: read from libvirt's node-device XML by the libvirt
//! adapter) and one a machine was given ([`PlacedDevice`]).

use std::fmt;

use bigfleet_libvirt_domain::catalog::DeviceSource;

/// A PCI address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    /// PCI domain (segment).
    pub domain: u16,
    /// Bus.
    pub bus: u8,
    /// Slot (device).
    pub slot: u8,
    /// Function.
    pub function: u8,
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.slot, self.function
        )
    }
}

/// What names one passthrough device on its host.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceKey {
    /// A PCI device or VF, by address.
    Pci(PciAddress),
    /// A mediated device, by UUID.
    Mdev(String),
}

impl fmt::Display for DeviceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pci(address) => address.fmt(f),
            Self::Mdev(uuid) => write!(f, "mdev {uuid}"),
        }
    }
}

/// One device of a host, as its node-device XML describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostDevice {
    /// libvirt's node-device name (`pci_0000_3b_00_0`).
    pub name: String,
    /// What names it.
    pub key: DeviceKey,
    /// PCI vendor and product ids (0 for an mdev).
    pub ids: (u16, u16),
    /// An SR-IOV virtual function.
    pub vf: bool,
    /// The mdev type of a mediated device.
    pub mdev_type: Option<String>,
    /// The host driver bound to it, if any.
    pub driver: Option<String>,
    /// Its IOMMU group (a PCI device without one cannot be passed through).
    pub iommu_group: Option<u32>,
    /// It exists now: a mediated device can be defined (persistently, through mdevctl) and
    /// not started, and then it is not there for a domain to use.
    pub active: bool,
}

impl HostDevice {
    /// Whether it is one device of a class with this source.
    #[must_use]
    pub fn is(&self, source: &DeviceSource) -> bool {
        match source {
            DeviceSource::Pci { vendor, product } => {
                matches!(self.key, DeviceKey::Pci(_)) && !self.vf && self.ids == (*vendor, *product)
            }
            DeviceSource::Vf {
                vendor, product, ..
            } => self.vf && self.ids == (*vendor, *product),
            DeviceSource::Mdev { mdev_type } => self.mdev_type.as_deref() == Some(mdev_type),
        }
    }

    /// Why it cannot be given to a machine, with the fix; `None` when it can. The provider
    /// never takes a device from a host driver: a PCI device or VF must be bound to
    /// `vfio-pci` (or to no driver) and sit in an IOMMU group.
    #[must_use]
    pub fn unusable(&self) -> Option<String> {
        if !self.active {
            return Some(format!(
                "{} is defined but not started, so a domain given it could not start: start \
                 it (virsh nodedev-start {}, or mdevctl start), or mark it to start with its \
                 parent (virsh nodedev-autostart {})",
                self.key, self.name, self.name
            ));
        }
        if matches!(self.key, DeviceKey::Mdev(_)) {
            return None;
        }
        if self.iommu_group.is_none() {
            return Some(format!(
                "{} has no IOMMU group: enable the IOMMU (intel_iommu=on or amd_iommu=on on \
                 the host kernel's command line, and VT-d/AMD-Vi in the firmware), then reboot",
                self.key
            ));
        }
        match self.driver.as_deref() {
            None | Some("vfio-pci") => None,
            Some(driver) => Some(format!(
                "{} is bound to the host driver {driver}, which the provider never takes it \
                 from: bind it to vfio-pci (driverctl set-override {} vfio-pci, or vfio-pci.ids= \
                 on the kernel command line)",
                self.key, self.key
            )),
        }
    }
}

/// A claimed device as the domain gets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacedDevice {
    /// The device.
    pub key: DeviceKey,
    /// A VF (given as a NIC).
    pub vf: bool,
    /// A VF's 802.1Q tag (its class's `vf.vlan`).
    pub vlan: Option<u16>,
}
