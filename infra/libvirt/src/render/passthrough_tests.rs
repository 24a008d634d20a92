//! Unit tests for `passthrough`: node-device XML as libvirt writes it, the classes' matches,
//! why a device is unusable, and a rendered device read back as held.

use super::*;
use bigfleet_libvirt_domain::catalog::DeviceSource;

const GPU: &str = "<device>
  <name>pci_0000_3b_00_0</name>
  <path>/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0</path>
  <parent>pci_0000_3a_00_0</parent>
  <driver><name>vfio-pci</name></driver>
  <capability type='pci'>
    <class>0x030200</class>
    <domain>0</domain><bus>59</bus><slot>0</slot><function>0</function>
    <product id='0x20b0'>GA100 [A100 SXM4 40GB]</product>
    <vendor id='0x10de'>NVIDIA Corporation</vendor>
    <iommuGroup number='40'><address domain='0x0000' bus='0x3b' slot='0x00' function='0x0'/></iommuGroup>
  </capability>
</device>";

const VF: &str = "<device>
  <name>pci_0000_5e_00_2</name>
  <driver><name>mlx5_core</name></driver>
  <capability type='pci'>
    <domain>0</domain><bus>94</bus><slot>0</slot><function>2</function>
    <product id='0x101e'>ConnectX Family mlx5Gen Virtual Function</product>
    <vendor id='0x15b3'>Mellanox Technologies</vendor>
    <capability type='phys_function'><address domain='0x0000' bus='0x5e' slot='0x00' function='0x0'/></capability>
    <iommuGroup number='77'/>
  </capability>
</device>";

const MDEV: &str = "<device>
  <name>mdev_4b20d080_1b54_4048_85b3_a6a62d165c01_0000_00_02_0</name>
  <parent>pci_0000_00_02_0</parent>
  <driver><name>vfio_mdev</name></driver>
  <capability type='mdev'>
    <type id='i915-GVTg_V5_4'/>
    <uuid>4b20d080-1b54-4048-85b3-a6a62d165c01</uuid>
    <iommuGroup number='0'/>
  </capability>
</device>";

fn address(bus: u8, function: u8) -> PciAddress {
    PciAddress {
        domain: 0,
        bus,
        slot: 0,
        function,
    }
}

#[test]
fn node_devices_are_read_as_libvirt_writes_them() {
    let gpu = HostDevice::parse(GPU).unwrap();
    assert_eq!(gpu.key, DeviceKey::Pci(address(0x3b, 0)));
    assert_eq!(gpu.key.to_string(), "0000:3b:00.0");
    assert_eq!(
        (gpu.ids, gpu.vf, gpu.iommu_group),
        ((0x10de, 0x20b0), false, Some(40))
    );
    assert_eq!(gpu.unusable(), None);
    let vf = HostDevice::parse(VF).unwrap();
    assert!(vf.vf);
    assert_eq!(vf.key.to_string(), "0000:5e:00.2");
    let why = vf.unusable().unwrap();
    assert!(
        why.contains("bound to the host driver mlx5_core")
            && why.contains("driverctl set-override 0000:5e:00.2 vfio-pci"),
        "{why}"
    );
    let mdev = HostDevice::parse(MDEV).unwrap();
    assert_eq!(
        mdev.key,
        DeviceKey::Mdev("4b20d080-1b54-4048-85b3-a6a62d165c01".into())
    );
    assert_eq!(mdev.mdev_type.as_deref(), Some("i915-GVTg_V5_4"));
    assert_eq!(mdev.unusable(), None);
    // Defined through mdevctl and not started: not there for a domain, so never given.
    let defined = HostDevice {
        active: false,
        ..mdev.clone()
    };
    let why = defined.unusable().unwrap();
    assert!(
        why.contains("mdev 4b20d080-1b54-4048-85b3-a6a62d165c01 is defined but not started")
            && why.contains(&format!("virsh nodedev-start {}", mdev.name)),
        "{why}"
    );
    let no_iommu = GPU.replace(
        "<iommuGroup number='40'><address domain='0x0000' bus='0x3b' slot='0x00' function='0x0'/></iommuGroup>",
        "",
    );
    let why = HostDevice::parse(&no_iommu).unwrap().unusable().unwrap();
    assert!(
        why.contains("has no IOMMU group: enable the IOMMU"),
        "{why}"
    );
    let net = "<device><name>net_eth0</name><capability type='net'><interface>eth0</interface></capability></device>";
    assert_eq!(HostDevice::parse(net), None);
    assert_eq!(HostDevice::parse("<device"), None);
}

#[test]
fn a_device_is_of_a_class_by_kind_and_ids() {
    let (gpu, vf, mdev) = (
        HostDevice::parse(GPU).unwrap(),
        HostDevice::parse(VF).unwrap(),
        HostDevice::parse(MDEV).unwrap(),
    );
    let a100 = DeviceSource::Pci {
        vendor: 0x10de,
        product: 0x20b0,
    };
    let cx6 = DeviceSource::Vf {
        vendor: 0x15b3,
        product: 0x101e,
        vlan: None,
    };
    let gvt = DeviceSource::Mdev {
        mdev_type: "i915-GVTg_V5_4".into(),
    };
    assert!(gpu.is(&a100) && !gpu.is(&cx6) && !gpu.is(&gvt));
    assert!(vf.is(&cx6) && !vf.is(&a100));
    // A VF is never taken for a whole device of the same ids.
    let same_ids = DeviceSource::Pci {
        vendor: 0x15b3,
        product: 0x101e,
    };
    assert!(!vf.is(&same_ids));
    assert!(mdev.is(&gvt) && !mdev.is(&a100));
}

#[test]
fn rendered_devices_are_read_back_as_held() {
    let placed = [
        PlacedDevice {
            key: DeviceKey::Pci(address(0x3b, 0)),
            vf: false,
            vlan: None,
        },
        PlacedDevice {
            key: DeviceKey::Pci(address(0x5e, 2)),
            vf: true,
            vlan: Some(120),
        },
        PlacedDevice {
            key: DeviceKey::Mdev("4b20d080-1b54-4048-85b3-a6a62d165c01".into()),
            vf: false,
            vlan: None,
        },
    ];
    let elements: String = placed.iter().map(PlacedDevice::to_xml).collect();
    let domain = format!(
        "<domain><devices><interface type='network'><source network='default'/></interface>\
         <hostdev mode='subsystem' type='usb'><source><address bus='1' device='2'/></source></hostdev>\
         {elements}</devices></domain>"
    );
    let document = roxmltree::Document::parse(&domain).unwrap();
    let got = held(document.root_element());
    let want: BTreeSet<DeviceKey> = placed.into_iter().map(|p| p.key).collect();
    assert_eq!(got, want);
    assert!(elements.contains("<interface type='hostdev' managed='yes'>"));
    assert!(
        elements.contains(
            "</source>\n      <vlan>\n        <tag id='120'/>\n      </vlan>\n    </interface>"
        ),
        "the VF carries its class's tag: {elements}"
    );
    assert_eq!(
        elements.matches("<vlan>").count(),
        1,
        "only the VF is tagged"
    );
    assert!(elements.contains(
        "<source><address domain='0x0000' bus='0x3b' slot='0x00' function='0x0'/></source>"
    ));
    let none = roxmltree::Document::parse("<domain/>").unwrap();
    assert!(held(none.root_element()).is_empty());
}
