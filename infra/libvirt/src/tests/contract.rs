//! The libvirt adapter on the test driver against the shared `Hypervisor` contract suites.
//! The test driver has no guest agent, so Configure and Drain are checked to fail clearly
//! (`bootstrap: false`); the substrate probe lists the domain and the volumes named after
//! the machine on the rig's private host.

use std::sync::Arc;

use bigfleet_libvirt_ports::testkit::{
    HypervisorCaps, Residue, failed_create_contract, hypervisor_contract,
};
use futures::FutureExt;

use super::*;
use bigfleet_libvirt_config::naming::domain_name;

/// The domain and volumes of a machine on the rig's host.
fn residue(hv: &Arc<LibvirtHypervisor<SystemClock>>) -> Residue {
    let hv = Arc::clone(hv);
    Box::new(move |machine| {
        let hv = Arc::clone(&hv);
        let name = domain_name("libvirt", machine.id.as_str());
        async move {
            let mut held: Vec<String> = domains(&hv, ZONE)
                .await
                .into_iter()
                .filter(|d| *d == name)
                .collect();
            held.extend(
                volumes(&hv, ZONE, "default")
                    .await
                    .into_iter()
                    .filter(|v| v.contains(&name)),
            );
            held
        }
        .boxed()
    })
}

#[tokio::test]
async fn the_libvirt_adapter_passes_the_hypervisor_contract() {
    let rig = rig().await;
    let hv = Arc::new(rig.hv);
    let caps = HypervisorCaps { bootstrap: false };
    hypervisor_contract(&*hv, caps, &residue(&hv)).await;
}

/// One slot of an instance type far larger than libvirt accepts (2^44 MiB of memory), on a
/// host whose allocation ratio lets the capacity check pass: the volumes are made, then the
/// define is refused, so the rollback has two fresh volumes to remove.
async fn oversized_rig() -> Rig {
    let catalog = bigfleet_libvirt_config::instance_types_from_json(
        r#"{"contract.huge": {"vcpu": 1, "memory_mib": 17592186044416}}"#,
        "contract",
    )
    .unwrap();
    let prices = PriceTable::new(BTreeMap::new(), 0.003, 0.0008, &catalog).unwrap();
    let offering = Offering {
        instance_type: "contract.huge".to_owned(),
        zone: ZONE.to_owned(),
        capacity_type: String::new(),
        count: 1,
        resources: StringMap::new(),
        labels: StringMap::new(),
    };
    let inventory = InventoryConfig {
        provider: "libvirt",
        catalog: &catalog,
        prices: &prices,
        require_zones: None,
    };
    let slots = build_inventory(&[offering], &inventory).unwrap().machines;
    rig_with(&Fixture::default(), slots, |config| {
        config.catalog = catalog.clone();
        config.options.capacity.memory_ratio = 1e30;
        config.options.capacity.disk_ratio = 1e30;
    })
    .await
}

#[tokio::test]
async fn a_failed_libvirt_create_leaves_nothing_behind() {
    let rig = oversized_rig().await;
    let hv = Arc::new(rig.hv);
    let slot = rig.slots[0].clone();
    let error = failed_create_contract(&*hv, &residue(&hv), &slot).await;
    assert!(
        error.message.contains("define domain"),
        "the create failed after making its volumes: {}",
        error.message
    );
}
