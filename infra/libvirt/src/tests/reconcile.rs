//! Describe against a real (test-driver) host: drift of managed machines, orphan reporting,
//! and orphan collection behind `--gc-orphans`.

use bigfleet_libvirt_domain::MachineState;
use bigfleet_libvirt_ports::Hypervisor;

use super::*;
use crate::metrics::DriftLabels;
use crate::render::ownership::Tag;
use crate::render::xml;
use crate::storage::volumes::overlay_name;
use bigfleet_libvirt_config::naming::domain_name;

fn drift(metrics: &LibvirtMetrics, kind: &str) -> i64 {
    let labels = DriftLabels {
        zone: ZONE.to_owned(),
        kind: kind.to_owned(),
    };
    metrics.drift.get_or_create(&labels).get()
}

/// Leaves a tagged domain no slot explains and a stray volume of slot 3's name.
async fn plant_orphans(rig: &Rig) -> (String, String) {
    let stray_id = "libvirt/OnDemand/kvm.small/rack1/999".to_owned();
    let orphan = domain_name("libvirt", &stray_id);
    let stray_volume = overlay_name(&domain_name("libvirt", rig.slots[3].id.as_str()));
    let tag = Tag::new("libvirt", &stray_id);
    let document = planted_domain(&orphan, tag, 1, 256, ("/o", "/s"));
    let volume = xml::seed_volume(&stray_volume, 4096);
    on_host(&rig.hv, ZONE, move |s| {
        s.conn
            .define_domain_xml(&document)
            .unwrap()
            .create()
            .unwrap();
        let pool = s.conn.lookup_storage_pool_by_name("default").unwrap();
        virt::storage_vol::StorageVol::create_xml(&pool, &volume, 0).unwrap();
    })
    .await;
    (orphan, stray_volume)
}

#[tokio::test]
async fn vanished_and_stopped_machines_are_reported() {
    let rig = rig().await;
    create(&rig.hv, &rig.slots[0]).await.unwrap();
    create(&rig.hv, &rig.slots[1]).await.unwrap();
    let (stop, vanish) = (
        domain_name("libvirt", rig.slots[0].id.as_str()),
        domain_name("libvirt", rig.slots[1].id.as_str()),
    );
    on_host(&rig.hv, ZONE, move |s| {
        s.conn
            .lookup_domain_by_name(&stop)
            .unwrap()
            .destroy()
            .unwrap();
        let gone = s.conn.lookup_domain_by_name(&vanish).unwrap();
        gone.destroy().unwrap();
        gone.undefine().unwrap();
    })
    .await;
    let described = rig.hv.describe().await.unwrap();
    assert_eq!(drift(&rig.metrics, "stopped"), 1);
    assert_eq!(drift(&rig.metrics, "vanished"), 1);
    assert!(
        described
            .iter()
            .all(|m| m.state == MachineState::Speculative)
    );
    // The vanished machine's leftover volumes (overlay, seed, console log) are orphans (its
    // slot is still ours).
    assert_eq!(drift(&rig.metrics, "orphan_volume"), 3);
}

#[tokio::test]
async fn orphans_are_reported_but_kept_in_a_dry_run() {
    let rig = rig_with(
        &Fixture::default(),
        slots("libvirt", ZONE, "kvm.small", 4),
        |c| c.options.gc.grace = Duration::ZERO,
    )
    .await;
    let machine = create(&rig.hv, &rig.slots[0]).await.unwrap();
    let (orphan, stray) = plant_orphans(&rig).await;
    let described = rig.hv.describe().await.unwrap();
    assert!(!described.iter().any(|m| m.id.as_str().ends_with("/999")));
    assert_eq!(drift(&rig.metrics, "orphan_domain"), 1);
    assert_eq!(drift(&rig.metrics, "orphan_volume"), 1);
    rig.hv.describe().await.unwrap();
    assert!(
        domains(&rig.hv, ZONE).await.contains(&orphan),
        "dry run keeps it"
    );
    assert!(volumes(&rig.hv, ZONE, "default").await.contains(&stray));
    let managed = domain_name("libvirt", machine.id.as_str());
    assert!(domains(&rig.hv, ZONE).await.contains(&managed));
}

#[tokio::test]
async fn orphans_are_collected_after_the_grace_with_gc_on() {
    let rig = rig_with(
        &Fixture::default(),
        slots("libvirt", ZONE, "kvm.small", 4),
        |c| {
            c.options.gc.collect = true;
            c.options.gc.grace = Duration::ZERO;
        },
    )
    .await;
    let machine = create(&rig.hv, &rig.slots[0]).await.unwrap();
    let (orphan, stray) = plant_orphans(&rig).await;
    rig.hv.describe().await.unwrap();
    assert!(!domains(&rig.hv, ZONE).await.contains(&orphan));
    assert!(!volumes(&rig.hv, ZONE, "default").await.contains(&stray));
    let managed = domain_name("libvirt", machine.id.as_str());
    assert_eq!(
        domains(&rig.hv, ZONE).await,
        [managed],
        "managed domains are kept"
    );
}

#[tokio::test]
async fn orphans_wait_out_the_grace_period() {
    let rig = rig_with(
        &Fixture::default(),
        slots("libvirt", ZONE, "kvm.small", 4),
        |c| {
            c.options.gc.collect = true;
            c.options.gc.grace = Duration::from_secs(3600);
        },
    )
    .await;
    let (orphan, _) = plant_orphans(&rig).await;
    rig.hv.describe().await.unwrap();
    rig.hv.describe().await.unwrap();
    assert!(domains(&rig.hv, ZONE).await.contains(&orphan));
}

#[tokio::test]
async fn machines_restored_from_state_are_checked_too() {
    let rig = rig().await;
    // The store says slot 0 runs here (restart with durable state), but the host has no
    // such domain: describe reports it vanished.
    let mut restored = rig.slots[0].clone();
    restored.state = MachineState::Idle;
    restored.host = Some(
        bigfleet_libvirt_ports::DomainRef::new(ZONE, domain_name("libvirt", restored.id.as_str()))
            .host_ref("libvirt"),
    );
    rig.hv.restored(&[Arc::new(restored)]);
    rig.hv.describe().await.unwrap();
    assert_eq!(drift(&rig.metrics, "vanished"), 1);
    assert_eq!(drift(&rig.metrics, "stopped"), 0);
}
