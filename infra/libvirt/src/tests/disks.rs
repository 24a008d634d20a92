//! Disk shapes on the test driver: each type's root size, its data disks (volumes,
//! serials, removal, rollback) and the refusal of a root smaller than the golden image.

use std::sync::Arc;

use bigfleet_libvirt_config::instance_types_from_json;
use bigfleet_libvirt_config::naming::domain_name;

use super::*;
use crate::render::spec::data_name;
use crate::render::xml;
use crate::service::lifecycle;
use crate::storage::volumes::{console_name, overlay_name, seed_name};

/// `kvm.small` with a 20 GiB root and two data disks (one named), in place of the built-in.
const SHAPED: &str = r#"{"kvm.small": {"vcpu": 2, "memory_mib": 4096, "disk_gib": 20,
    "data_disks": [{"size_gib": 5}, {"name": "scratch", "size_gib": 64}]}}"#;

/// A rig of two `kvm.small` slots whose catalog is `types`.
async fn rig_typed(types: &str) -> Rig {
    let catalog = instance_types_from_json(types, "types.json").unwrap();
    let slots = slots("libvirt", ZONE, "kvm.small", 2);
    rig_with(&Fixture::default(), slots, |config| {
        config.catalog = catalog
    })
    .await
}

#[tokio::test]
async fn a_types_root_size_and_data_disks_are_made_served_by_serial_and_removed() {
    let rig = rig_typed(SHAPED).await;
    let machine = create(&rig.hv, &rig.slots[0]).await.unwrap();
    let name = domain_name("libvirt", rig.slots[0].id.as_str());
    let mut want = vec![
        ("base.qcow2".to_owned(), 10 << 30),
        (seed_name(&name), 0),
        (console_name(&name), 0),
        (overlay_name(&name), 20 << 30),
        (data_name(&name, "data1"), 5 << 30),
        (data_name(&name, "scratch"), 64 << 30),
    ];
    want.sort();
    let mut got = sized(&rig, "default").await;
    for (volume, bytes) in &mut got {
        if *volume == seed_name(&name) {
            *bytes = 0; // the seed is sized by its image, not the type
        }
    }
    assert_eq!(got, want);
    let probe = name.clone();
    let document = on_host(&rig.hv, ZONE, move |s| {
        let d = s.conn.lookup_domain_by_name(&probe).unwrap();
        d.xml_desc(0).unwrap()
    })
    .await;
    for serial in ["root", "data1", "scratch"] {
        assert!(
            document.contains(&format!("<serial>{serial}</serial>")),
            "{serial}: {document}"
        );
    }
    assert!(
        document.contains(&data_name(&name, "scratch")),
        "{document}"
    );
    delete(&rig.hv, &machine).await.unwrap();
    assert_eq!(volumes(&rig.hv, ZONE, "default").await, ["base.qcow2"]);
}

#[tokio::test]
async fn a_root_smaller_than_the_golden_image_is_refused_before_anything_is_made() {
    let rig = rig_typed(r#"{"kvm.small": {"vcpu": 2, "memory_mib": 4096, "disk_gib": 9}}"#).await;
    let error = create(&rig.hv, &rig.slots[0]).await.unwrap_err();
    assert_eq!(
        error.side_effects,
        bigfleet_libvirt_ports::SideEffects::None
    );
    assert!(
        error
            .message
            .contains("instance type \"kvm.small\" has a 9 GiB root disk (disk_gib)"),
        "{}",
        error.message
    );
    assert!(
        error.message.contains("set its disk_gib to at least 10"),
        "{}",
        error.message
    );
    assert_eq!(volumes(&rig.hv, ZONE, "default").await, ["base.qcow2"]);
    assert!(domains(&rig.hv, ZONE).await.is_empty());
}

#[tokio::test]
async fn a_failed_create_rolls_back_every_data_disk_it_made_and_keeps_an_adopted_one() {
    let rig = rig_typed(SHAPED).await;
    let slot = rig.slots[1].clone();
    let name = domain_name("libvirt", slot.id.as_str());
    let earlier = data_name(&name, "scratch");
    let volume = xml::data_volume(&crate::render::spec::DataVolume {
        volume: earlier.clone(),
        serial: "scratch".to_owned(),
        bytes: 1 << 30,
    });
    on_host(&rig.hv, ZONE, move |s| {
        let pool = s.conn.lookup_storage_pool_by_name("default").unwrap();
        virt::storage_vol::StorageVol::create_xml(&pool, &volume, 0).unwrap();
    })
    .await;
    let disks = rig
        .hv
        .inner
        .config
        .catalog
        .get("kvm.small")
        .unwrap()
        .disks
        .clone();
    let error = create_refused_at_define(&rig, &slot, disks).await;
    assert!(error.message.contains("define domain"), "{}", error.message);
    assert_eq!(
        error.side_effects,
        bigfleet_libvirt_ports::SideEffects::None,
        "rolled back on a live connection: nothing this attempt made is left"
    );
    assert!(domains(&rig.hv, ZONE).await.is_empty());
    assert_eq!(
        volumes(&rig.hv, ZONE, "default").await,
        ["base.qcow2".to_owned(), earlier],
        "the overlay, the seed and data1 are rolled back; the adopted disk stays"
    );
}

#[tokio::test]
async fn delete_removes_data_disks_the_type_no_longer_lists() {
    let rig = rig_typed(SHAPED).await;
    let slot = rig.slots[0].clone();
    create(&rig.hv, &slot).await.unwrap();
    let name = domain_name("libvirt", slot.id.as_str());
    let host = Arc::clone(&rig.hv.inner.hosts[ZONE]);
    let settings = Arc::clone(&rig.hv.inner.settings);
    let (owner, id, doomed) = (Arc::clone(&host), slot.id.to_string(), name.clone());
    // As if the operator had since removed both data disks from the type.
    host.call(Lane::Teardown, move |s| {
        lifecycle::delete(s, &owner, &settings, &doomed, &id, Vec::new())
    })
    .await
    .unwrap();
    assert_eq!(volumes(&rig.hv, ZONE, "default").await, ["base.qcow2"]);
}

#[tokio::test]
async fn a_pool_offers_only_the_slots_whose_disks_it_holds() {
    // The test driver's pool holds 100 GiB, 10 of them the golden image: at ratio 1, room
    // for two 40 GiB kvm.small roots and not three.
    let rig = rig_with(
        &Fixture::default(),
        slots("libvirt", ZONE, "kvm.small", 4),
        |config| config.options.capacity.disk_ratio = 1.0,
    )
    .await;
    let offered = rig.hv.describe().await.unwrap();
    assert_eq!(offered.len(), 2, "{offered:?}");
    create(&rig.hv, &rig.slots[0]).await.unwrap();
    create(&rig.hv, &rig.slots[1]).await.unwrap();
    let refused = create(&rig.hv, &rig.slots[2]).await.unwrap_err();
    assert_eq!(
        refused.side_effects,
        bigfleet_libvirt_ports::SideEffects::None
    );
    assert!(
        refused
            .message
            .contains("needs 40.0 GiB of disk but only 10.0 GiB are free of 90.0 GiB allocatable"),
        "{}",
        refused.message
    );
    assert!(
        refused.message.contains("--disk-allocation-ratio 1"),
        "{}",
        refused.message
    );
    assert_eq!(domains(&rig.hv, ZONE).await.len(), 2, "nothing was made");
    // Both machines now run: nothing more is offered, and the series say why.
    let offered = rig.hv.describe().await.unwrap();
    let speculative = offered
        .iter()
        .filter(|m| m.state == bigfleet_libvirt_domain::MachineState::Speculative)
        .count();
    assert_eq!(speculative, 0, "{offered:?}");
    let gauge = |resource: &str, of: &str| {
        let labels = crate::metrics::CapacityLabels {
            zone: ZONE.to_owned(),
            resource: resource.to_owned(),
            of: of.to_owned(),
        };
        rig.metrics.capacity.get_or_create(&labels).get()
    };
    assert_eq!(gauge("disk_bytes", "allocatable"), 90 << 30);
    assert_eq!(gauge("disk_bytes", "committed"), 80 << 30);
    let pool = crate::metrics::PoolLabels {
        zone: ZONE.to_owned(),
        kind: "capacity".to_owned(),
    };
    assert_eq!(rig.metrics.pool.get_or_create(&pool).get(), 100 << 30);
}

#[tokio::test]
async fn a_higher_ratio_offers_thin_disks_past_the_pool() {
    let rig = rig_with(
        &Fixture::default(),
        slots("libvirt", ZONE, "kvm.small", 4),
        |config| config.options.capacity.disk_ratio = 2.0,
    )
    .await;
    // 100 GiB × 2 − 10 GiB: four 40 GiB roots.
    assert_eq!(rig.hv.describe().await.unwrap().len(), 4);
}

/// `kvm.small` with Secure Boot.
const WITH_SECURE_BOOT: &str =
    r#"{"kvm.small": {"vcpu": 2, "memory_mib": 4096, "secure_boot": true}}"#;

#[tokio::test]
async fn a_secure_boot_type_is_defined_with_secure_boot_firmware_and_smm() {
    let rig = rig_typed(WITH_SECURE_BOOT).await;
    let machine = create(&rig.hv, &rig.slots[0]).await.unwrap();
    let name = domain_name("libvirt", rig.slots[0].id.as_str());
    let document = on_host(&rig.hv, ZONE, move |s| {
        let d = s.conn.lookup_domain_by_name(&name).unwrap();
        d.xml_desc(0).unwrap()
    })
    .await;
    let parsed = roxmltree::Document::parse(&document).unwrap();
    let os = (parsed.descendants())
        .find(|n| n.has_tag_name("os"))
        .unwrap();
    assert_eq!(os.attribute("firmware"), Some("efi"), "{document}");
    let enabled = |feature: &str| {
        (os.descendants()).any(|n| {
            n.has_tag_name("feature")
                && n.attribute("name") == Some(feature)
                && n.attribute("enabled") == Some("yes")
        })
    };
    assert!(
        enabled("secure-boot") && enabled("enrolled-keys"),
        "{document}"
    );
    let smm = (parsed.descendants())
        .find(|n| n.has_tag_name("smm"))
        .unwrap();
    assert_eq!(smm.attribute("state"), Some("on"), "{document}");
    delete(&rig.hv, &machine).await.unwrap();
    assert!(domains(&rig.hv, ZONE).await.is_empty(), "undefined");
}

/// `kvm.small` with a virtual TPM.
const WITH_TPM: &str = r#"{"kvm.small": {"vcpu": 2, "memory_mib": 4096, "tpm": true}}"#;

#[tokio::test]
async fn a_type_with_a_tpm_gets_an_emulated_tpm_and_delete_removes_the_domain() {
    let rig = rig_typed(WITH_TPM).await;
    let machine = create(&rig.hv, &rig.slots[0]).await.unwrap();
    let name = domain_name("libvirt", rig.slots[0].id.as_str());
    let probe = name.clone();
    let document = on_host(&rig.hv, ZONE, move |s| {
        let d = s.conn.lookup_domain_by_name(&probe).unwrap();
        d.xml_desc(0).unwrap()
    })
    .await;
    assert!(document.contains("<tpm model='tpm-crb'>"), "{document}");
    assert!(
        document.contains("<backend type='emulator' version='2.0'"),
        "{document}"
    );
    delete(&rig.hv, &machine).await.unwrap();
    assert!(domains(&rig.hv, ZONE).await.is_empty(), "undefined");
    assert_eq!(volumes(&rig.hv, ZONE, "default").await, ["base.qcow2"]);

    // A type without `tpm` has none.
    let plain = rig_typed(SHAPED).await;
    create(&plain.hv, &plain.slots[0]).await.unwrap();
    let document = on_host(&plain.hv, ZONE, move |s| {
        let d = s.conn.lookup_domain_by_name(&name).unwrap();
        d.xml_desc(0).unwrap()
    })
    .await;
    assert!(!document.contains("<tpm"), "{document}");
}
