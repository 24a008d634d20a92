//! Passthrough devices on the test driver, whose node file declares them (two whole GPUs in
//! IOMMU groups and one outside any, two VFs of a NIC, a mediated device; the test driver
//! keeps no driver binding, so a device on a host driver is unit-tested in `host::claims`):
//! discovery, one device per claim in the domain XML, exhaustion and the inventory that
//! withholds the slot (and leaves out a Failed slot), release on Delete and on a failed
//! Create, a restarted provider that reads the claims back from the definitions, a device a
//! foreign domain holds, and the `devices_<class>` capacity series.

use bigfleet_libvirt_config::instance_types_from_json;
use bigfleet_libvirt_config::naming::domain_name;
use bigfleet_libvirt_domain::catalog::{DeviceClasses, RawDeviceClass};

use super::*;
use crate::host::fixture::{mdev_device, pci_device};
use crate::metrics::CapacityLabels;
use crate::render::placement::FromDefinition;
use crate::render::placement::Held;
use crate::render::spec::{overlay_name as overlay, seed_name as seed};

const NVIDIA_A100: (u16, u16) = (0x10de, 0x20b0);
const CX6_VF: (u16, u16) = (0x15b3, 0x101e);
const MDEV: &str = "4b20d080-1b54-4048-85b3-a6a62d165c01";

/// `kvm.small` holds one A100 and one VF; `kvm.medium` one GVT-g slice.
const TYPES: &str = r#"{
    "kvm.small": {"vcpu": 2, "memory_mib": 1024, "devices": {"a100": 1, "cx6-vf": 1}},
    "kvm.medium": {"vcpu": 1, "memory_mib": 512, "devices": {"gvt": 1}}
}"#;

const CLASSES: &str = r#"{
    "a100": {"resource": "nvidia.com/gpu", "pci": {"vendor": "10de", "product": "20b0"}},
    "cx6-vf": {"resource": "mellanox.com/cx6_vf", "vf": {"vendor": "15b3", "product": "101e", "vlan": 42}},
    "gvt": {"resource": "intel.com/gvt", "mdev": {"type": "i915-GVTg_V5_4"}}
}"#;

/// The host's devices: A100s at 3b and 5e and at 86 (in no IOMMU group: never taken), the
/// NIC's VFs at 17.2 and 17.3, and one mdev.
fn devices() -> Vec<String> {
    vec![
        pci_device((0x86, 0), NVIDIA_A100, (false, false)),
        pci_device((0x5e, 0), NVIDIA_A100, (false, true)),
        pci_device((0x3b, 0), NVIDIA_A100, (false, true)),
        pci_device((0x17, 3), CX6_VF, (true, true)),
        pci_device((0x17, 2), CX6_VF, (true, true)),
        mdev_device(MDEV, "i915-GVTg_V5_4", 0x02),
    ]
}

/// Three `kvm.small` (GPU) slots and two `kvm.medium` (vGPU) slots, with `planted` domains on the host.
async fn rig_devices(planted: Vec<String>) -> Rig {
    let raw: std::collections::BTreeMap<String, RawDeviceClass> =
        serde_json::from_str(CLASSES).unwrap();
    let classes = DeviceClasses::from_raw(Some(raw), "classes.json").unwrap();
    let catalog = (instance_types_from_json(TYPES, "types.json").unwrap())
        .with_device_classes(classes)
        .unwrap();
    let mut slots = slots("libvirt", ZONE, "kvm.small", 3);
    slots.extend(super::slots("libvirt", ZONE, "kvm.medium", 2));
    let fixture = Fixture {
        domains: planted,
        devices: devices(),
        ..Fixture::default()
    };
    rig_with(&fixture, slots, |config| config.catalog = catalog).await
}

/// What the domain of `slot` holds, from its definition, and the definition.
async fn held(rig: &Rig, slot: &Machine) -> (Vec<String>, String) {
    let name = domain_name("libvirt", slot.id.as_str());
    on_host(&rig.hv, ZONE, move |s| {
        let domain = s.conn.lookup_domain_by_name(&name).unwrap();
        let xml = domain.xml_desc(0).unwrap();
        let keys = Held::parse(&xml)
            .devices
            .iter()
            .map(ToString::to_string)
            .collect();
        (keys, xml)
    })
    .await
}

fn capacity(rig: &Rig, resource: &str) -> (i64, i64) {
    let get = |of: &str| {
        let labels = CapacityLabels {
            zone: ZONE.to_owned(),
            resource: resource.to_owned(),
            of: of.to_owned(),
        };
        rig.metrics.capacity.get_or_create(&labels).get()
    };
    (get("allocatable"), get("committed"))
}

fn offered(machines: &[Machine]) -> Vec<String> {
    machines.iter().map(|m| m.id.to_string()).collect()
}

#[tokio::test]
async fn each_device_is_given_once_and_exhaustion_withholds_the_slot() {
    let rig = rig_devices(Vec::new()).await;
    let s = &rig.slots;
    let first = create(&rig.hv, &s[0]).await.unwrap();
    create(&rig.hv, &s[1]).await.unwrap();
    let (a, a_xml) = held(&rig, &s[0]).await;
    let (b, _) = held(&rig, &s[1]).await;
    assert_eq!(a, ["0000:17:00.2", "0000:3b:00.0"]);
    assert_eq!(b, ["0000:17:00.3", "0000:5e:00.0"]);
    assert!(
        a_xml.contains("<hostdev mode='subsystem' type='pci' managed='yes'>"),
        "{a_xml}"
    );
    assert!(
        a_xml.contains("<interface type='hostdev' managed='yes'>"),
        "{a_xml}"
    );
    assert!(
        a_xml.contains("<vlan>") && a_xml.contains("<tag id='42'/>"),
        "the VF carries its class's tag: {a_xml}"
    );
    // The A100 outside any IOMMU group is never taken: no third GPU machine.
    let refused = create(&rig.hv, &s[2]).await.unwrap_err();
    assert!(
        refused.message.contains(&format!(
            "has no room for machine {}: needs 1 devices of class \"a100\" but 0 of the \
             host's 2 usable ones are free",
            s[2].id
        )),
        "{}",
        refused.message
    );
    let third = domain_name("libvirt", s[2].id.as_str());
    assert!(!domains(&rig.hv, ZONE).await.contains(&third));
    let left = volumes(&rig.hv, ZONE, "default").await;
    assert!(left.iter().all(|v| !v.starts_with(&third)), "{left:?}");
    let now = offered(&rig.hv.describe().await.unwrap());
    assert!(!now.contains(&s[2].id.to_string()), "{now:?}");
    assert_eq!(capacity(&rig, "devices_a100"), (2, 2));
    assert_eq!(capacity(&rig, "devices_cx6-vf"), (2, 2));
    // The mdev: one slice, one vGPU machine.
    create(&rig.hv, &s[3]).await.unwrap();
    let (slice, slice_xml) = held(&rig, &s[3]).await;
    assert_eq!(slice, [format!("mdev {MDEV}")]);
    assert!(
        slice_xml.contains(&format!("<address uuid='{MDEV}'/>")),
        "{slice_xml}"
    );
    assert!(create(&rig.hv, &s[4]).await.is_err());
    // A Delete gives its devices back: room for one GPU machine again, so the first such
    // slot (the one deleted) is offered, and the third still is not.
    delete(&rig.hv, &first).await.unwrap();
    let now = offered(&rig.hv.describe().await.unwrap());
    assert!(now.contains(&s[0].id.to_string()), "{now:?}");
    assert!(!now.contains(&s[2].id.to_string()), "{now:?}");
    create(&rig.hv, &s[2]).await.unwrap();
    assert_eq!(held(&rig, &s[2]).await.0, ["0000:17:00.2", "0000:3b:00.0"]);
}

/// A provider started over a host where the previous process made machine 0 with the A100
/// at 3b and the VF at 17.2, and someone else's domain holds the A100 at 5e.
async fn restarted_rig() -> Rig {
    let slots = slots("libvirt", ZONE, "kvm.small", 3);
    let ours = domain_name("libvirt", slots[0].id.as_str());
    let made = planted_domain(
        &ours,
        Tag::new("libvirt", slots[0].id.as_str()),
        2,
        1024,
        (
            &format!("/pool/{}", overlay(&ours)),
            &format!("/pool/{}", seed(&ours)),
        ),
    );
    let hostdev = |bus: u8, function: u8| {
        format!(
            "<hostdev mode='subsystem' type='pci' managed='yes'><source><address \
             domain='0x0000' bus='0x{bus:02x}' slot='0x00' function='0x{function:x}'/></source></hostdev>"
        )
    };
    let made = made.replacen(
        "<devices>",
        &format!("<devices>{}{}", hostdev(0x3b, 0), hostdev(0x17, 2)),
        1,
    );
    let foreign = format!(
        "<domain type='test'><name>theirs</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type>hvm</type></os><devices>{}</devices></domain>",
        hostdev(0x5e, 0)
    );
    rig_devices(vec![made, foreign]).await
}

/// The refusal of a Create that finds no A100 free.
fn none_free(refused: &HypervisorError) {
    assert!(
        refused
            .message
            .contains("0 of the host's 2 usable ones are free"),
        "{}",
        refused.message
    );
}

#[tokio::test]
async fn a_restarted_provider_reads_device_claims_from_the_definitions() {
    let rig = restarted_rig().await;
    rig.hv.describe().await.unwrap();
    assert_eq!(capacity(&rig, "devices_a100"), (2, 2));
    none_free(&create(&rig.hv, &rig.slots[1]).await.unwrap_err());
    // Their domain goes away out of band: the next scan frees its GPU.
    super::placement::remove_theirs(&rig).await;
    create(&rig.hv, &rig.slots[1]).await.unwrap();
    assert_eq!(
        held(&rig, &rig.slots[1]).await.0,
        ["0000:17:00.3", "0000:5e:00.0"]
    );
}

#[tokio::test]
async fn a_create_before_the_first_describe_reads_the_claims_first() {
    // Right after a restart BigFleet may call Create before any describe has scanned the
    // host: the books must still know what the existing definitions hold.
    let rig = restarted_rig().await;
    none_free(&create(&rig.hv, &rig.slots[1]).await.unwrap_err());
}

#[tokio::test]
async fn a_create_that_fails_after_its_claim_gives_the_devices_back() {
    let rig = rig_devices(Vec::new()).await;
    let devices =
        std::collections::BTreeMap::from([("a100".to_owned(), 1), ("cx6-vf".to_owned(), 1)]);
    let failed = super::placement::create_refused_at_define(
        &rig,
        &rig.slots[0],
        bigfleet_libvirt_domain::catalog::Placement::default(),
        devices,
    )
    .await;
    assert!(!failed.message.is_empty());
    let host = Arc::clone(&rig.hv.inner.hosts[ZONE]);
    let counts = host.ledger().claims().device_counts();
    assert_eq!(counts["a100"], (2, 0), "the rollback released the claim");
    create(&rig.hv, &rig.slots[1]).await.unwrap();
    assert_eq!(
        held(&rig, &rig.slots[1]).await.0,
        ["0000:17:00.2", "0000:3b:00.0"]
    );
}

/// A Failed slot is never created again, so the inventory gives its device to the next slot:
/// with one A100 left, slot 1 is offered and slot 2 withheld until the provider says slot 1
/// went Failed (`Hypervisor::failed`), or a restarted provider hands its Failed record over
/// (`restored`); then slot 2 is offered and slot 1 no longer.
#[tokio::test]
async fn a_failed_slot_leaves_its_device_to_the_next_one() {
    for restart in [false, true] {
        let rig = rig_devices(Vec::new()).await;
        let s = &rig.slots;
        create(&rig.hv, &s[0]).await.unwrap();
        let id = |i: usize| s[i].id.to_string();
        let now = offered(&rig.hv.describe().await.unwrap());
        assert!(now.contains(&id(1)) && !now.contains(&id(2)), "{now:?}");
        let mut failed = s[1].clone();
        failed.state = bigfleet_libvirt_domain::MachineState::Failed;
        if restart {
            rig.hv.restored(&[Arc::new(failed)]);
        } else {
            rig.hv.failed(&failed);
        }
        let now = offered(&rig.hv.describe().await.unwrap());
        assert!(!now.contains(&id(1)) && now.contains(&id(2)), "{now:?}");
    }
}
