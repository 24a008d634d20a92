//! Passthrough devices as documents: a host's PCI devices, SR-IOV virtual functions and
//! mediated devices read from libvirt's node-device XML ([`HostDevice`]), the devices an
//! existing domain's definition holds ([`held`]), and the elements a claimed device adds to
//! a domain ([`PlacedDevice::to_xml`]): `<hostdev type='pci'|'mdev'>`, or for a VF an
//! `<interface type='hostdev'>` (so the guest sees a NIC whose MAC libvirt sets).

use std::collections::BTreeSet;

pub use bigfleet_libvirt_ports::claims::{DeviceKey, HostDevice, PciAddress, PlacedDevice};

/// Reads an `<address domain= bus= slot= function=/>` element (hex with `0x`, or decimal).
fn address_from(node: roxmltree::Node<'_, '_>) -> Option<PciAddress> {
    Some(PciAddress {
        domain: number(node.attribute("domain")?)?,
        bus: number(node.attribute("bus")?)?,
        slot: number(node.attribute("slot")?)?,
        function: number(node.attribute("function")?)?,
    })
}

/// The `<address .../>` element of `address`; `typed`: with `type='pci'` (an interface's
/// source has it, a hostdev's does not).
fn address_xml(address: PciAddress, typed: bool) -> String {
    format!(
        "<address{} domain='0x{:04x}' bus='0x{:02x}' slot='0x{:02x}' function='0x{:x}'/>",
        if typed { " type='pci'" } else { "" },
        address.domain,
        address.bus,
        address.slot,
        address.function
    )
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

/// A host device read from libvirt's node-device XML.
pub trait FromNodeDevice: Sized {
    /// Reads one node device's XML (taken for an active one: the document does not say);
    /// `None` for one that is neither PCI nor an mdev.
    fn parse(xml: &str) -> Option<Self>;
}

impl FromNodeDevice for HostDevice {
    fn parse(xml: &str) -> Option<Self> {
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
                    active: true,
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
                    active: true,
                })
            }
            _ => None,
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
        active: true,
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
        } else if let Some(pci) = address_from(address) {
            keys.insert(DeviceKey::Pci(pci));
        }
    }
    keys
}

/// A claimed device's element in a domain definition.
pub trait DeviceElement {
    /// Its element inside `<devices>`, on a line of its own.
    fn to_xml(&self) -> String;
}

impl DeviceElement for PlacedDevice {
    fn to_xml(&self) -> String {
        match (&self.key, self.vf) {
            (DeviceKey::Pci(address), true) => {
                let vlan = (self.vlan)
                    .map(|tag| format!("\n      <vlan>\n        <tag id='{tag}'/>\n      </vlan>"))
                    .unwrap_or_default();
                format!(
                    "\n    <interface type='hostdev' managed='yes'>\n      <source>{}</source>{vlan}\n    </interface>",
                    address_xml(*address, true)
                )
            }
            (DeviceKey::Pci(address), false) => format!(
                "\n    <hostdev mode='subsystem' type='pci' managed='yes'>\n      <source>{}</source>\n    </hostdev>",
                address_xml(*address, false)
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
