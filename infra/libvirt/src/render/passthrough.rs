//! Passthrough devices as documents: a host's PCI devices, SR-IOV virtual functions and
//! mediated devices read from libvirt's node-device XML ([`HostDevice`]), the devices an
//! existing domain's definition holds ([`held`]), and the elements a claimed device adds to
//! a domain ([`PlacedDevice::to_xml`]): `<hostdev type='pci'|'mdev'>`, or for a VF an
//! `<interface type='hostdev'>` (so the guest sees a NIC whose MAC libvirt sets).

use std::collections::BTreeSet;
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

impl PciAddress {
    /// Reads an `<address domain= bus= slot= function=/>` element (hex with `0x`, or decimal).
    fn from_attributes(node: roxmltree::Node<'_, '_>) -> Option<Self> {
        Some(Self {
            domain: number(node.attribute("domain")?)?,
            bus: number(node.attribute("bus")?)?,
            slot: number(node.attribute("slot")?)?,
            function: number(node.attribute("function")?)?,
        })
    }

    /// The `<address .../>` element; `typed`: with `type='pci'` (an interface's source
    /// has it, a hostdev's does not).
    fn to_xml(self, typed: bool) -> String {
        format!(
            "<address{} domain='0x{:04x}' bus='0x{:02x}' slot='0x{:02x}' function='0x{:x}'/>",
            if typed { " type='pci'" } else { "" },
            self.domain,
            self.bus,
            self.slot,
            self.function
        )
    }
}

/// A number as libvirt writes one: `0x`-prefixed hex, or decimal.
fn number<T: TryFrom<u64>>(text: &str) -> Option<T> {
    let text = text.trim();
    let value = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok()?,
        None => text.parse().ok()?,
    };
    T::try_from(value).ok()
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
}

impl HostDevice {
    /// Reads one node device's XML; `None` for one that is neither PCI nor an mdev.
    #[must_use]
    pub fn parse(xml: &str) -> Option<Self> {
        let document = roxmltree::Document::parse(xml).ok()?;
        let root = document.root_element();
        let name = child(root, "name")?.text()?.trim().to_owned();
        let driver = child(root, "driver")
            .and_then(|d| child(d, "name"))
            .and_then(|n| n.text())
            .map(|t| t.trim().to_owned());
        let cap = (root.children())
            .find(|n| n.has_tag_name("capability") && n.attribute("type").is_some())?;
        let iommu_group = child(cap, "iommuGroup").and_then(|g| number(g.attribute("number")?));
        match cap.attribute("type")? {
            "pci" => {
                let address = PciAddress {
                    domain: field(cap, "domain")?,
                    bus: field(cap, "bus")?,
                    slot: field(cap, "slot")?,
                    function: field(cap, "function")?,
                };
                let id = |tag: &str| child(cap, tag).and_then(|n| number(n.attribute("id")?));
                let vf = (cap.children()).any(|n| {
                    n.has_tag_name("capability") && n.attribute("type") == Some("phys_function")
                });
                Some(Self {
                    name,
                    key: DeviceKey::Pci(address),
                    ids: (id("vendor")?, id("product")?),
                    vf,
                    mdev_type: None,
                    driver,
                    iommu_group,
                })
            }
            "mdev" => {
                let mdev_type = child(cap, "type").and_then(|t| t.attribute("id"))?;
                // libvirt 7.8 and later say the UUID; before, the name carries it.
                let uuid = child(cap, "uuid")
                    .and_then(|u| u.text())
                    .map(|t| t.trim().to_owned())
                    .or_else(|| name.strip_prefix("mdev_").map(|u| u.replace('_', "-")))?;
                Some(Self {
                    name,
                    key: DeviceKey::Mdev(uuid),
                    ids: (0, 0),
                    vf: false,
                    mdev_type: Some(mdev_type.to_owned()),
                    driver,
                    iommu_group,
                })
            }
            _ => None,
        }
    }

    /// Whether it is one device of a class with this source.
    #[must_use]
    pub fn is(&self, source: &DeviceSource) -> bool {
        match source {
            DeviceSource::Pci { vendor, product } => {
                matches!(self.key, DeviceKey::Pci(_)) && !self.vf && self.ids == (*vendor, *product)
            }
            DeviceSource::Vf { vendor, product } => self.vf && self.ids == (*vendor, *product),
            DeviceSource::Mdev { mdev_type } => self.mdev_type.as_deref() == Some(mdev_type),
        }
    }

    /// Why it cannot be given to a machine, with the fix; `None` when it can. The provider
    /// never takes a device from a host driver: a PCI device or VF must be bound to
    /// `vfio-pci` (or to no driver) and sit in an IOMMU group.
    #[must_use]
    pub fn unusable(&self) -> Option<String> {
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

/// The number in `node`'s child element `tag`.
fn field<T: TryFrom<u64>>(node: roxmltree::Node<'_, '_>, tag: &str) -> Option<T> {
    child(node, tag).and_then(|n| number(n.text()?))
}

/// An A100 (10de:20b0) at `0000:<bus>:00.0` in IOMMU group `bus`, bound to `driver`: what
/// the books' and doctor's unit tests hand around.
#[cfg(test)]
pub(crate) fn test_gpu(bus: u8, driver: &str) -> HostDevice {
    HostDevice {
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
        driver: Some(driver.to_owned()),
        iommu_group: Some(u32::from(bus)),
    }
}

/// `node`'s first child element called `name`.
fn child<'a, 'i>(node: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    node.children().find(|n| n.has_tag_name(name))
}

/// The passthrough devices a domain definition holds: `<hostdev>` of type `pci` (by source
/// address) and `mdev` (by UUID), and `<interface type='hostdev'>` (by source address).
#[must_use]
pub fn held(root: roxmltree::Node<'_, '_>) -> BTreeSet<DeviceKey> {
    let Some(devices) = child(root, "devices") else {
        return BTreeSet::new();
    };
    let mut keys = BTreeSet::new();
    for device in devices.children().filter(roxmltree::Node::is_element) {
        let kind = device.attribute("type");
        let passthrough = (device.has_tag_name("hostdev") && kind != Some("usb"))
            || (device.has_tag_name("interface") && kind == Some("hostdev"));
        let address = child(device, "source").and_then(|s| child(s, "address"));
        let Some(address) = address.filter(|_| passthrough) else {
            continue;
        };
        if let Some(uuid) = address.attribute("uuid") {
            keys.insert(DeviceKey::Mdev(uuid.to_owned()));
        } else if let Some(pci) = PciAddress::from_attributes(address) {
            keys.insert(DeviceKey::Pci(pci));
        }
    }
    keys
}

/// A claimed device as the domain gets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacedDevice {
    /// The device.
    pub key: DeviceKey,
    /// A VF (given as a NIC).
    pub vf: bool,
}

impl PlacedDevice {
    /// Its element inside `<devices>`, on a line of its own.
    #[must_use]
    pub fn to_xml(&self) -> String {
        match (&self.key, self.vf) {
            (DeviceKey::Pci(address), true) => format!(
                "\n    <interface type='hostdev' managed='yes'>\n      <source>{}</source>\n    </interface>",
                address.to_xml(true)
            ),
            (DeviceKey::Pci(address), false) => format!(
                "\n    <hostdev mode='subsystem' type='pci' managed='yes'>\n      <source>{}</source>\n    </hostdev>",
                address.to_xml(false)
            ),
            (DeviceKey::Mdev(uuid), _) => format!(
                "\n    <hostdev mode='subsystem' type='mdev' model='vfio-pci'>\n      <source><address uuid='{}'/></source>\n    </hostdev>",
                crate::render::ownership::escape(uuid)
            ),
        }
    }
}

#[cfg(test)]
#[path = "passthrough_tests.rs"]
mod tests;
