//! Dedicated CPUs and huge pages on the test driver: the pins a Create writes, exhaustion,
//! release on Delete and on a failed Create, what a restarted provider reads back from the
//! host's definitions, and a domain removed out of band. The driver has no huge page pools
//! (a node file's host has no NUMA cells at all: the adapter takes it as one cell of its
//! CPUs), so huge pages are refused here; their books are unit-tested in `host::claims`, and
//! a guest really backed by them boots in the real-QEMU tier.

use bigfleet_libvirt_config::instance_types_from_json;
use bigfleet_libvirt_config::naming::domain_name;

use super::*;
use crate::metrics::CapacityLabels;
use crate::options::CpuSet;
use crate::render::placement::FromDefinition;
use crate::render::placement::Held;
use crate::render::spec::{overlay_name as overlay, seed_name as seed};

/// `kvm.small` holds two dedicated CPUs; `kvm.medium` is shared; `kvm.large` is backed by
/// 2 MiB pages.
const TYPES: &str = r#"{
    "kvm.small": {"vcpu": 2, "memory_mib": 1024, "dedicated_cpus": true},
    "kvm.medium": {"vcpu": 2, "memory_mib": 1024},
    "kvm.large": {"vcpu": 1, "memory_mib": 1024, "hugepages": "2Mi"}
}"#;

/// An 8-CPU host whose CPUs 4-7 are dedicated, with three `kvm.small` slots, a
/// `kvm.medium` and a `kvm.large`, and the domains of `planted` on it.
async fn rig_placed(planted: Vec<String>) -> Rig {
    let catalog = instance_types_from_json(TYPES, "types.json").unwrap();
    let mut slots = slots("libvirt", ZONE, "kvm.small", 3);
    slots.extend(super::slots("libvirt", ZONE, "kvm.medium", 1));
    slots.extend(super::slots("libvirt", ZONE, "kvm.large", 1));
    let fixture = Fixture {
        cpus: 8,
        domains: planted,
        ..Fixture::default()
    };
    rig_with(&fixture, slots, |config| {
        config.catalog = catalog;
        config.options.capacity.dedicated_cpus = CpuSet::parse("4-7").unwrap();
    })
    .await
}

/// What the domain of `slot` binds, from its definition.
async fn held(rig: &Rig, slot: &Machine) -> Held {
    let name = domain_name("libvirt", slot.id.as_str());
    on_host(&rig.hv, ZONE, move |s| {
        let domain = s.conn.lookup_domain_by_name(&name).unwrap();
        Held::parse(&domain.xml_desc(0).unwrap())
    })
    .await
}

#[tokio::test]
async fn dedicated_cpus_are_held_once_each_and_shared_machines_keep_off_them() {
    let rig = rig_placed(Vec::new()).await;
    let s = &rig.slots;
    let first = create(&rig.hv, &s[0]).await.unwrap();
    create(&rig.hv, &s[1]).await.unwrap();
    let (a, b) = (held(&rig, &s[0]).await, held(&rig, &s[1]).await);
    assert_eq!(a.pinned.to_string(), "4-5");
    assert_eq!(b.pinned.to_string(), "6-7");
    let refused = create(&rig.hv, &s[2]).await.unwrap_err();
    assert!(
        refused.message.contains(&format!(
            "has no room for machine {}: needs 2 dedicated CPUs but only 0 of \
             --dedicated-cpus 4-7 are free on this host (none)",
            s[2].id
        )),
        "{}",
        refused.message
    );
    // The inventory offers only what the host can still give: no third dedicated slot,
    // and no huge page slot on a host without pools.
    let offered: Vec<String> = (rig.hv.describe().await.unwrap().iter())
        .map(|m| m.id.to_string())
        .collect();
    assert!(offered.contains(&s[3].id.to_string()), "{offered:?}");
    let capacity = |of: &str| {
        let labels = CapacityLabels {
            zone: ZONE.to_owned(),
            resource: "dedicated_cpus".to_owned(),
            of: of.to_owned(),
        };
        rig.metrics.capacity.get_or_create(&labels).get()
    };
    assert_eq!((capacity("allocatable"), capacity("committed")), (4, 4));
    for withheld in [&s[2], &s[4]] {
        assert!(!offered.contains(&withheld.id.to_string()), "{offered:?}");
    }
    let third = domain_name("libvirt", s[2].id.as_str());
    assert!(!domains(&rig.hv, ZONE).await.contains(&third));
    let left = volumes(&rig.hv, ZONE, "default").await;
    assert!(left.iter().all(|v| !v.starts_with(&third)), "{left:?}");
    // The shared machine may run on CPUs 0-3 only.
    create(&rig.hv, &s[3]).await.unwrap();
    assert_eq!(held(&rig, &s[3]).await.pinned.to_string(), "0-3");
    // A Delete gives its CPUs back.
    delete(&rig.hv, &first).await.unwrap();
    let offered = rig.hv.describe().await.unwrap();
    // Room for one dedicated machine again: the first such slot (the one deleted) is
    // offered, and the third still is not.
    let offered: Vec<&Machine> = offered
        .iter()
        .filter(|m| m.instance_type == "kvm.small")
        .collect();
    assert!(offered.iter().any(|m| m.id == s[0].id), "{offered:?}");
    assert!(offered.iter().all(|m| m.id != s[2].id), "{offered:?}");
    create(&rig.hv, &s[2]).await.unwrap();
    assert_eq!(held(&rig, &s[2]).await.pinned.to_string(), "4-5");
}

#[tokio::test]
async fn a_restarted_provider_reads_the_claims_from_the_definitions_and_drift_frees_them() {
    // A machine the previous process made holds CPUs 4-5 (ours by its tag), and someone
    // else's domain is pinned to CPU 7.
    let slots = slots("libvirt", ZONE, "kvm.small", 3);
    let ours = domain_name("libvirt", slots[0].id.as_str());
    let mut made = planted_domain(
        &ours,
        Tag::new("libvirt", slots[0].id.as_str()),
        2,
        1024,
        (
            &format!("/pool/{}", overlay(&ours)),
            &format!("/pool/{}", seed(&ours)),
        ),
    );
    let pins =
        "\n  <cputune><vcpupin vcpu='0' cpuset='4'/><vcpupin vcpu='1' cpuset='5'/></cputune>";
    made = made.replacen("</vcpu>", &format!("</vcpu>{pins}"), 1);
    let foreign = "<domain type='test'><name>theirs</name><memory unit='MiB'>64</memory>\
        <vcpu cpuset='7'>1</vcpu><os><type>hvm</type></os></domain>";
    let rig = rig_placed(vec![made, foreign.to_owned()]).await;
    rig.hv.describe().await.unwrap();
    // Only CPU 6 is free: a 2-CPU machine does not fit.
    let refused = create(&rig.hv, &rig.slots[1]).await.unwrap_err();
    assert!(
        refused
            .message
            .contains("only 1 of --dedicated-cpus 4-7 are free on this host (6)")
    );
    // Someone removes their domain: the next scan frees CPU 7.
    remove_theirs(&rig).await;
    create(&rig.hv, &rig.slots[1]).await.unwrap();
    assert_eq!(held(&rig, &rig.slots[1]).await.pinned.to_string(), "6-7");
}

#[tokio::test]
async fn a_create_that_fails_after_its_claim_gives_the_cpus_back() {
    let rig = rig_placed(Vec::new()).await;
    // The test driver refuses a define without memory; by then the CPUs were claimed.
    let dedicated = bigfleet_libvirt_domain::catalog::Placement {
        hugepage_kib: None,
        dedicated_cpus: true,
    };
    let failed = create_refused_at_define(&rig, &rig.slots[0], dedicated, Default::default()).await;
    assert!(!failed.message.is_empty());
    let host = Arc::clone(&rig.hv.inner.hosts[ZONE]);
    assert_eq!(
        host.ledger().claims().held().0,
        0,
        "the rollback released the claim"
    );
    create(&rig.hv, &rig.slots[1]).await.unwrap();
    assert_eq!(held(&rig, &rig.slots[1]).await.pinned.to_string(), "4-5");
}

#[tokio::test]
async fn huge_pages_the_host_does_not_have_are_refused_before_anything_is_made() {
    let rig = rig_placed(Vec::new()).await;
    let large = &rig.slots[4];
    let refused = create(&rig.hv, large).await.unwrap_err();
    assert!(
        refused
            .message
            .contains("needs 512 huge pages of 2048 KiB but only 0 are free of the host's 0"),
        "{}",
        refused.message
    );
    let name = domain_name("libvirt", large.id.as_str());
    assert!(!domains(&rig.hv, ZONE).await.contains(&name));
}

/// Someone else's domain `theirs` is destroyed and undefined out of band, and a scan runs.
pub(super) async fn remove_theirs(rig: &Rig) {
    on_host(&rig.hv, ZONE, |s| {
        let theirs = s.conn.lookup_domain_by_name("theirs").unwrap();
        theirs.destroy().unwrap();
        theirs.undefine().unwrap();
    })
    .await;
    rig.hv.describe().await.unwrap();
}

/// A Create of `slot` (2 vCPUs placed as `placement`, with `devices`) with no memory, which
/// the test driver refuses at its define, after the claim and every volume: run directly
/// on the rig's host.
pub(super) async fn create_refused_at_define(
    rig: &Rig,
    slot: &Machine,
    placement: bigfleet_libvirt_domain::catalog::Placement,
    devices: std::collections::BTreeMap<String, u32>,
) -> HypervisorError {
    let host = Arc::clone(&rig.hv.inner.hosts[ZONE]);
    let settings = Arc::clone(&rig.hv.inner.settings);
    let spec = crate::service::lifecycle::CreateSpec {
        name: domain_name("libvirt", slot.id.as_str()),
        machine_id: slot.id.to_string(),
        instance_type: slot.instance_type.clone(),
        operation_id: "op-1".to_owned(),
        vcpu: 2,
        memory_mib: 0,
        disks: bigfleet_libvirt_domain::catalog::DiskShape::default(),
        placement,
        devices,
        tpm: false,
        secure_boot: false,
        boot: bigfleet_libvirt_domain::catalog::BootMode::Agent,
    };
    let owner = Arc::clone(&host);
    host.call(Lane::Create, move |s| {
        crate::service::lifecycle::create(s, &owner, &settings, &spec)
    })
    .await
    .unwrap_err()
}
