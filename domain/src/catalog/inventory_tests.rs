//! Unit tests for `inventory`: validation order and messages, slot shape, and the numbering
//! that keeps ids distinct when offerings share (type, zone).

use super::*;
use crate::catalog::{default_offerings, fault_offering, offerings_from_raw};
use crate::validate_instance;

fn build(offerings: &[Offering], zones: Option<&[String]>) -> Result<Inventory, CatalogError> {
    let (catalog, prices) = (InstanceCatalog::builtin(), PriceTable::default());
    let cfg = InventoryConfig {
        provider: "p",
        catalog: &catalog,
        prices: &prices,
        require_zones: zones,
    };
    build_inventory(offerings, &cfg)
}

fn offering(instance_type: &str, zone: &str, capacity: &str, count: i64) -> Offering {
    Offering {
        instance_type: instance_type.into(),
        zone: zone.into(),
        capacity_type: capacity.into(),
        count,
        resources: StringMap::from([("cpu".into(), "1".into())]),
        labels: StringMap::new(),
    }
}

fn error(offerings: &[Offering]) -> String {
    build(offerings, None).unwrap_err().to_string()
}

fn ids(inventory: &Inventory) -> Vec<&str> {
    inventory.machines.iter().map(|m| m.id.as_str()).collect()
}

#[test]
fn slots_have_the_documented_shape() {
    let mut labelled = offering("kvm.small", "rack1", "", 2);
    labelled.labels.insert("pool".into(), "gpu".into());
    let inventory = build(&[labelled], None).unwrap();
    assert_eq!(
        ids(&inventory),
        [
            "p/OnDemand/kvm.small/rack1/000",
            "p/OnDemand/kvm.small/rack1/001"
        ]
    );
    let machine = &inventory.machines[0];
    assert_eq!(machine.state, MachineState::Speculative);
    assert_eq!(
        (machine.host.as_ref(), machine.zone.as_str()),
        (None, "rack1")
    );
    assert_eq!(machine.capacity_type, CapacityType::OnDemand);
    assert!((machine.price_per_hour - 0.0092).abs() < 1e-12);
    assert_eq!(machine.interruption_probability, 0.0);
    assert_eq!(
        machine.resources,
        StringMap::from([("cpu".into(), "1".into())])
    );
    assert_eq!(machine.allocatable["memory"], "4Gi");
    assert_eq!(machine.labels["pool"], "gpu");
    assert!(machine.last_error.is_empty() && machine.cluster.is_empty());
    assert!(machine.shard_metadata.is_empty());
    assert!(inventory.delete_supported);
    assert_eq!(inventory.capacity, CapacityType::OnDemand);
    for machine in &inventory.machines {
        validate_instance(machine, true).unwrap();
        assert!(machine.shape_violation().is_none());
    }
}

#[test]
fn repeated_type_and_zone_continue_the_numbering() {
    let offerings = [
        offering("kvm.small", "a", "", 8),
        offering("kvm.small", "a", "", 8),
    ];
    let inventory = build(&offerings, None).unwrap();
    let got = ids(&inventory);
    assert_eq!(got[7], "p/OnDemand/kvm.small/a/007");
    assert_eq!(got[8], "p/OnDemand/kvm.small/a/008");
    assert_eq!(got[15], "p/OnDemand/kvm.small/a/015");
    assert_distinct(&inventory);
}

fn assert_distinct(inventory: &Inventory) {
    let mut seen = std::collections::BTreeSet::new();
    for id in ids(inventory) {
        assert!(seen.insert(id), "duplicate id {id}");
    }
}

#[test]
fn single_zone_and_single_type_defaults_get_distinct_ids() {
    let catalog = InstanceCatalog::builtin();
    let one_zone = ["rack1".to_owned()];
    let inventory = build(
        &default_offerings(32, &one_zone, "local", "", &catalog),
        None,
    );
    let inventory = inventory.unwrap();
    assert_eq!(inventory.machines.len(), 32);
    assert_distinct(&inventory);
    assert_eq!(ids(&inventory)[16], "p/OnDemand/kvm.large/rack1/008");

    let raw = serde_json::from_str(r#"{"one": {"vcpu": 1, "memory_mib": 512}}"#).unwrap();
    let single = InstanceCatalog::from_raw(raw, "t");
    let single = single.unwrap();
    let prices = PriceTable::default();
    let cfg = InventoryConfig {
        provider: "p",
        catalog: &single,
        prices: &prices,
        require_zones: None,
    };
    for zones in [&[][..], &one_zone[..]] {
        let offerings = default_offerings(7, zones, "local", "", &single);
        let inventory = build_inventory(&offerings, &cfg).unwrap();
        assert_eq!(inventory.machines.len(), 7);
        assert_distinct(&inventory);
        assert_eq!(inventory.machines[0].allocatable["memory"], "512Mi");
    }
}

#[test]
fn fault_slots_share_the_numbering() {
    let catalog = InstanceCatalog::builtin();
    let mut offerings = default_offerings(8, &[], "local", "on_demand", &catalog);
    offerings.push(fault_offering(&catalog, &[], "local", "on_demand"));
    let inventory = build(&offerings, None).unwrap();
    assert_eq!(inventory.machines.len(), 16);
    assert_distinct(&inventory);
    let faults: Vec<_> = inventory
        .machines
        .iter()
        .filter(|m| !m.labels.is_empty())
        .collect();
    assert_eq!(faults.len(), 8);
    assert_eq!(faults[0].id.as_str(), "p/OnDemand/kvm.large/local-a/002");
}

#[test]
fn validation_order_and_messages() {
    let bad_capacity = error(&[offering("", "", "spot", 0)]);
    assert!(
        bad_capacity.starts_with("offering /: capacity_type \"spot\""),
        "{bad_capacity}"
    );
    let empty_type = error(&[offering("", "", "", 0)]);
    assert!(
        empty_type.starts_with("offering with empty instance_type"),
        "{empty_type}"
    );
    let unknown = error(&[offering("kvm.huge", "", "", 0)]);
    let want = "offering instance_type \"kvm.huge\" is not in the instance-type catalog \
                (known types: kvm.large, kvm.medium, kvm.small, kvm.xlarge); fix the offering";
    assert!(unknown.starts_with(want), "{unknown}");
    let empty_zone = error(&[offering("kvm.small", "", "", 0)]);
    assert!(empty_zone.starts_with("offering kvm.small with empty zone (libvirt host)"));
    for zone in ["a/b", "a:b"] {
        let msg = error(&[offering("kvm.small", zone, "", 0)]);
        assert!(msg.contains("must not contain ':' or '/'"), "{msg}");
    }
    let count = error(&[offering("kvm.small", "z", "", 0)]);
    assert!(
        count.starts_with("offering kvm.small/z has non-positive count 0"),
        "{count}"
    );
    assert!(error(&[offering("kvm.small", "z", "", -2)]).contains("count -2"));
    assert_eq!(
        error(&[]),
        "no offerings configured; pass --offerings or a positive --seed-count"
    );
}

#[test]
fn reserved_label_keys_are_refused() {
    for key in RESERVED_LABEL_KEYS {
        let mut labelled = offering("kvm.small", "z", "", 1);
        labelled.labels.insert(key.to_owned(), "x".into());
        let msg = error(&[labelled]);
        assert!(msg.starts_with(&format!("offering kvm.small/z: label {key:?} is reserved")));
        assert!(msg.contains("top-level fields"), "{msg}");
    }
}

#[test]
fn zones_must_be_connected_for_the_real_backend() {
    let zones = ["rack2".to_owned(), "rack1".to_owned()];
    let ok = [
        offering("kvm.small", "rack1", "", 1),
        offering("kvm.large", "rack2", "", 1),
    ];
    assert!(build(&ok, Some(&zones)).is_ok());
    let msg = build(&[offering("kvm.small", "rack3", "", 1)], Some(&zones)).unwrap_err();
    assert_eq!(
        msg.to_string(),
        "offering kvm.small is placed on zone \"rack3\", which has no --connect host \
         (configured zones: rack1, rack2); add rack3=<uri> to --connect or move the offering"
    );
    assert!(build(&[offering("kvm.small", "rack3", "", 1)], None).is_ok());
}

#[test]
fn bare_metal_pools() {
    let mixed = [
        offering("kvm.small", "z", "bare_metal", 1),
        offering("kvm.small", "z", "", 1),
    ];
    assert_eq!(
        error(&mixed),
        "offerings mix bare_metal with deletable (on_demand/reserved) capacity; run one \
         provider instance per capacity class"
    );
    let metal = [
        offering("kvm.small", "z", "metal", 2),
        offering("kvm.large", "y", "bare-metal", 1),
    ];
    let inventory = build(&metal, None).unwrap();
    assert!(!inventory.delete_supported);
    assert_eq!(inventory.capacity, CapacityType::BareMetal);
    assert_eq!(
        inventory.machines[0].id.as_str(),
        "p/BareMetal/kvm.small/z/000"
    );
    assert!(inventory.machines.iter().all(|m| m.price_per_hour == 0.0));
}

#[test]
fn oversized_totals_are_refused() {
    let huge = [
        offering("kvm.small", "z", "", MAX_SLOTS),
        offering("kvm.small", "y", "", 1),
    ];
    assert!(error(&huge).starts_with("offerings ask for more than 1000000 slots"));
    let overflow = [
        offering("kvm.small", "z", "", i64::MAX),
        offering("kvm.small", "y", "", 1),
    ];
    assert!(error(&overflow).contains("slots in total"));
}

#[test]
fn offerings_file_to_inventory() {
    let text = r#"[{"instance_type": "kvm.medium", "zone": "rack1", "count": 1,
                    "resources": {"cpu": "2", "memory": "4Gi"}}]"#;
    let inventory = build(
        &offerings_from_raw(serde_json::from_str(text).unwrap(), "o.json").unwrap(),
        None,
    )
    .unwrap();
    let machine = &inventory.machines[0];
    assert_eq!(machine.id.as_str(), "p/OnDemand/kvm.medium/rack1/000");
    assert_ne!(machine.resources, machine.allocatable);
    assert!((machine.price_per_hour - 0.0184).abs() < 1e-12);
}

#[test]
fn slots_of_one_offering_share_their_maps_and_other_offerings_do_not() {
    let mut other = offering("kvm.large", "z", "on_demand", 2);
    other.resources = StringMap::from([("cpu".into(), "4".into())]);
    let inventory = build(&[offering("kvm.small", "z", "on_demand", 3), other], None).unwrap();
    let [a, b, c, d, e] = inventory.machines.as_slice() else {
        panic!("five slots");
    };
    for slot in [b, c] {
        assert!(slot.resources.shares(&a.resources));
        assert!(slot.allocatable.shares(&a.allocatable));
        assert!(slot.labels.shares(&a.labels));
    }
    assert!(e.resources.shares(&d.resources));
    assert!(!d.resources.shares(&a.resources));
    assert_eq!(d.resources, StringMap::from([("cpu".into(), "4".into())]));
    assert_eq!(a.resources, StringMap::from([("cpu".into(), "1".into())]));
}
