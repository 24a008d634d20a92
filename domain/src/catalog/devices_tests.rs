//! Unit tests for `devices`: the classes file's checks and messages, the types' counts, the
//! catalog's cross-check, `allocatable`, and offerings that would advertise phantom devices.

use std::collections::BTreeMap;

use super::*;
use crate::StringMap;
use crate::catalog::{
    InstanceCatalog, InventoryConfig, Offering, PriceTable, RawInstanceType, build_inventory,
};

fn classes(text: &str) -> Result<DeviceClasses, CatalogError> {
    DeviceClasses::from_raw(serde_json::from_str(text).unwrap(), "classes.json")
}

fn refusal(text: &str) -> String {
    classes(text).unwrap_err().to_string()
}

const THREE: &str = r#"{
    "a100": {"resource": "nvidia.com/gpu", "pci": {"vendor": "10de", "product": "0x20B0"}},
    "a100-2g": {"resource": "nvidia.com/mig-2g.10gb", "mdev": {"type": "nvidia-500"}},
    "cx6-vf": {"resource": "mellanox.com/cx6_vf", "vf": {"vendor": "15b3", "product": "101e"}}
}"#;

#[test]
fn the_three_kinds_are_read() {
    let got = classes(THREE).unwrap();
    let source = |name: &str| got.get(name).unwrap().source.clone();
    assert_eq!(
        source("a100"),
        DeviceSource::Pci {
            vendor: 0x10de,
            product: 0x20b0
        }
    );
    assert_eq!(
        source("a100-2g"),
        DeviceSource::Mdev {
            mdev_type: "nvidia-500".into()
        }
    );
    assert_eq!(source("cx6-vf").to_string(), "vf 15b3:101e");
    let tagged = r#"{"vf100": {"resource": "mellanox.com/cx6_vf",
                               "vf": {"vendor": "15b3", "product": "101e", "vlan": 100}}}"#;
    let tagged = classes(tagged).unwrap();
    assert_eq!(
        tagged.get("vf100").unwrap().source,
        DeviceSource::Vf {
            vendor: 0x15b3,
            product: 0x101e,
            vlan: Some(100)
        }
    );
    assert_eq!(got.by_resource("nvidia.com/gpu").unwrap().0, "a100");
    assert_eq!(got.known(), "a100, a100-2g, cx6-vf");
}

#[test]
fn bad_classes_are_refused_with_the_fix() {
    let cases = [
        (
            r#"{}"#,
            "--device-classes classes.json is empty; declare at least one class",
        ),
        (
            r#"{"g": {"resource": "gpu", "pci": {"vendor": "10de", "product": "20b0"}}}"#,
            "class \"g\" resource \"gpu\" is not an extended resource name; write a \
             domain-prefixed name such as \"nvidia.com/gpu\"",
        ),
        (
            r#"{"g": {"resource": "nvidia.com/gpu"}}"#,
            "class \"g\" must have exactly one of \"pci\", \"mdev\" or \"vf\"",
        ),
        (
            r#"{"g": {"resource": "nvidia.com/gpu", "pci": {"vendor": "10de", "product": "20b0"},
                      "vf": {"vendor": "10de", "product": "20b0"}}}"#,
            "must have exactly one of",
        ),
        (
            r#"{"g": {"resource": "nvidia.com/gpu", "pci": {"vendor": "nvidia", "product": "20b0"}}}"#,
            "pci.vendor \"nvidia\" is not a PCI id; write four hex digits as lspci -nn prints",
        ),
        (
            r#"{"v": {"resource": "x.com/vf", "vf": {"vendor": "15b3", "product": "101e", "vlan": 4095}}}"#,
            "class \"v\" vf.vlan 4095 is not a VLAN id; use 1 to 4094",
        ),
        (
            r#"{"g": {"resource": "nvidia.com/gpu", "mdev": {"type": "a b"}}}"#,
            "mdev.type \"a b\" is not an mdev type id",
        ),
        (
            r#"{"g h": {"resource": "nvidia.com/gpu", "mdev": {"type": "x"}}}"#,
            "class \"g h\" is not a usable class name",
        ),
        (
            r#"{"g": {"resource": "nvidia.com/gpu", "mdev": {"type": "x"}},
                "h": {"resource": "nvidia.com/gpu", "mdev": {"type": "y"}}}"#,
            "class \"h\" advertises \"nvidia.com/gpu\", as class \"g\" does",
        ),
    ];
    for (text, want) in cases {
        let got = refusal(text);
        assert!(got.contains(want), "{text}:\n{got}\nwants: {want}");
    }
    let typo: Result<BTreeMap<String, RawDeviceClass>, _> =
        serde_json::from_str(r#"{"g": {"resource": "a.b/c", "pcie": {}}}"#);
    assert!(
        typo.unwrap_err()
            .to_string()
            .contains("unknown field `pcie`")
    );
}

fn catalog(types: &str) -> Result<InstanceCatalog, CatalogError> {
    let raw: BTreeMap<String, RawInstanceType> = serde_json::from_str(types).unwrap();
    InstanceCatalog::from_raw(Some(raw), "types.json")?.with_device_classes(classes(THREE)?)
}

#[test]
fn types_ask_for_declared_classes_and_allocatable_shows_them() {
    let got = catalog(
        r#"{"gpu.1": {"vcpu": 4, "memory_mib": 8192, "devices": {"a100": 1, "cx6-vf": 2}}}"#,
    )
    .unwrap();
    let shape = got.get("gpu.1").unwrap();
    assert_eq!(shape.devices.get("a100"), Some(&1));
    let allocatable = got.allocatable("gpu.1").unwrap();
    assert_eq!(allocatable["nvidia.com/gpu"], "1");
    assert_eq!(allocatable["mellanox.com/cx6_vf"], "2");
    assert_eq!(allocatable["cpu"], "4");

    let unknown = catalog(r#"{"gpu.1": {"vcpu": 1, "memory_mib": 512, "devices": {"h100": 1}}}"#)
        .unwrap_err()
        .to_string();
    assert_eq!(
        unknown,
        "--instance-types: \"gpu.1\" asks for devices of class \"h100\", which \
         --device-classes does not declare (declared: a100, a100-2g, cx6-vf); declare the \
         class or fix the name"
    );
    for count in ["0", "-1", "17"] {
        let text = format!(
            r#"{{"gpu.1": {{"vcpu": 1, "memory_mib": 512, "devices": {{"a100": {count}}}}}}}"#
        );
        let why = catalog(&text).unwrap_err().to_string();
        assert!(
            why.contains(&format!(
                "\"gpu.1\" devices.a100 is {count}; ask for 1 to 16"
            )),
            "{why}"
        );
    }
    let without: BTreeMap<String, RawInstanceType> =
        serde_json::from_str(r#"{"g": {"vcpu": 1, "memory_mib": 512, "devices": {"a100": 1}}}"#)
            .unwrap();
    let why = (InstanceCatalog::from_raw(Some(without), "t").unwrap())
        .with_device_classes(DeviceClasses::default())
        .unwrap_err()
        .to_string();
    assert!(why.contains("(declared: none)"), "{why}");
}

fn offer(resources: &[(&str, &str)]) -> Offering {
    Offering {
        instance_type: "gpu.1".into(),
        zone: "rack1".into(),
        capacity_type: String::new(),
        count: 1,
        resources: (resources.iter())
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<StringMap>(),
        labels: StringMap::new(),
    }
}

fn inventory(offering: &Offering) -> Result<usize, String> {
    let catalog =
        catalog(r#"{"gpu.1": {"vcpu": 4, "memory_mib": 8192, "devices": {"a100": 1}}}"#).unwrap();
    let prices = PriceTable::default();
    let cfg = InventoryConfig {
        provider: "p",
        catalog: &catalog,
        prices: &prices,
        require_zones: None,
    };
    build_inventory(std::slice::from_ref(offering), &cfg)
        .map(|i| i.machines.len())
        .map_err(|e| e.to_string())
}

#[test]
fn offerings_cannot_advertise_devices_their_machines_lack() {
    assert_eq!(
        inventory(&offer(&[("cpu", "4"), ("nvidia.com/gpu", "1")])),
        Ok(1)
    );
    assert_eq!(inventory(&offer(&[("cpu", "4")])), Ok(1));
    let phantom = inventory(&offer(&[("amd.com/gpu", "1")])).unwrap_err();
    assert_eq!(
        phantom,
        "offering gpu.1/rack1: resources name \"amd.com/gpu\" = \"1\", but no class in \
         --device-classes advertises it (declared: a100, a100-2g, cx6-vf); a slot may \
         advertise a device only as its instance type's \"devices\" claim it"
    );
    let more = inventory(&offer(&[("nvidia.com/gpu", "2")])).unwrap_err();
    assert!(
        more.contains("but instance type \"gpu.1\" asks for 1 of class \"a100\""),
        "{more}"
    );
    let other = inventory(&offer(&[("mellanox.com/cx6_vf", "1")])).unwrap_err();
    assert!(other.contains("asks for 0 of class \"cx6-vf\""), "{other}");
}
