//! Doctor's `devices` lines: enough free devices, fewer than every slot needs, fewer than
//! one machine needs (held by domains), and devices that cannot be passed through, each
//! with its fix.

use std::collections::{BTreeMap, BTreeSet};

use super::tests::{good, status, want};
use super::*;
use crate::render::passthrough::{HostDevice, test_gpu as gpu};
use crate::render::placement::Topology;
use bigfleet_libvirt_domain::catalog::{DeviceClasses, RawDeviceClass, RawPciIds};

/// A host with `gpus`, whose domains hold `held`.
fn host(gpus: Vec<HostDevice>, held: &[&HostDevice]) -> HostFacts {
    let topology = Topology {
        devices: gpus.clone(),
        ..Topology::flat(8)
    };
    HostFacts {
        topology: Some(Probe::Found((topology, BTreeMap::new()))),
        held_devices: Some(held.iter().map(|d| d.key.clone()).collect::<BTreeSet<_>>()),
        ..good()
    }
}

/// Two slots of a type asking for one `a100` each.
fn asking() -> Expectations {
    let mut want = want();
    let raw = BTreeMap::from([(
        "a100".to_owned(),
        RawDeviceClass {
            resource: "nvidia.com/gpu".to_owned(),
            pci: Some(RawPciIds {
                vendor: "10de".to_owned(),
                product: "20b0".to_owned(),
            }),
            ..RawDeviceClass::default()
        },
    )]);
    want.classes = DeviceClasses::from_raw(Some(raw), "c.json").unwrap();
    want.slots[0].1[0].devices = BTreeMap::from([("a100".to_owned(), 1)]);
    want
}

#[test]
fn enough_free_devices_pass() {
    let report = judge(
        &asking(),
        &[host(
            vec![gpu(0x3b, "vfio-pci"), gpu(0x5e, "vfio-pci")],
            &[],
        )],
    );
    let (verdict, detail, fix) = status(&report, "a", "devices");
    assert_eq!(verdict, Status::Ok, "{detail}");
    assert_eq!(
        detail,
        "a100 (pci 10de:20b0): 2 usable (0000:3b:00.0, 0000:5e:00.0), 0 held by domains, 2 \
         free; one machine needs 1, every slot 2"
    );
    assert_eq!(fix, "");
}

#[test]
fn a_device_on_a_host_driver_warns_with_the_binding_fix() {
    let report = judge(
        &asking(),
        &[host(vec![gpu(0x3b, "vfio-pci"), gpu(0x5e, "nvidia")], &[])],
    );
    let (verdict, detail, fix) = status(&report, "a", "devices");
    assert_eq!(verdict, Status::Warn, "{detail}");
    assert!(detail.ends_with("; 1 unusable (0000:5e:00.0)"), "{detail}");
    assert!(
        fix.contains("bound to the host driver nvidia")
            && fix.contains("driverctl set-override 0000:5e:00.0 vfio-pci"),
        "{fix}"
    );
}

#[test]
fn devices_all_held_block_with_the_fix() {
    let one = gpu(0x3b, "vfio-pci");
    let report = judge(&asking(), &[host(vec![one.clone()], &[&one])]);
    let (verdict, detail, fix) = status(&report, "a", "devices");
    assert_eq!(verdict, Status::Block, "{detail}");
    assert!(
        detail.contains("1 usable (0000:3b:00.0), 1 held by domains, 0 free"),
        "{detail}"
    );
    assert!(
        fix.starts_with("add pci 10de:20b0 devices to this host"),
        "{fix}"
    );
    // No type asks for devices: no line.
    let report = judge(&want(), &[host(vec![one], &[])]);
    assert!(report.checks.iter().all(|c| c.check != "devices"));
}
