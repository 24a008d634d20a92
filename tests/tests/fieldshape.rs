//! Field shape & cost (docs/conformance.md §3.7, B801–B807): every record is well formed, costs are
//! in range, host/cluster follow the state, quantities parse, and the host provider is stable.

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::{CapacityType, MachineState as S};

use crate::harness::*;

/// The `--provider` label the core profile stamps into every HostRef.provider.
const PROVIDER: &str = "certify";

/// Well-known fields that must never be smuggled into labels (B801).
const HIDDEN: [&str; 9] = [
    "instance-type",
    "instance_type",
    "instanceType",
    "zone",
    "availability-zone",
    "availability_zone",
    "capacity-type",
    "capacity_type",
    "capacityType",
];

/// Puts one machine in IDLE and one in CONFIGURED so inventory-wide checks see more than the
/// seeded Speculative shape.
async fn diversify(server: &Server, c: &mut Client) -> (String, String) {
    let idle = walk_to_idle(server, c).await;
    let configured = walk_to_configured(server, c, "conf-b8xx", &[("k", "v")]).await;
    (idle, configured)
}

fn capacity(m: &pb::Machine) -> CapacityType {
    CapacityType::try_from(m.capacity_type).unwrap_or(CapacityType::Unspecified)
}

/// B801: over the whole inventory ids are non-empty, state and instance_type are set, and no
/// well-known field is hidden in labels.
#[tokio::test]
async fn b801_inventory_ids_state_and_instance_type_are_set() {
    let server = core();
    let mut c = server.client().await;
    diversify(&server, &mut c).await;
    let all = list_all(&mut c).await;
    assert!(!all.machines.is_empty(), "empty inventory");
    for m in &all.machines {
        assert!(!m.id.is_empty(), "empty id: {m:?}");
        assert_ne!(state(m), S::Unspecified, "{} has no state", m.id);
        assert!(!m.instance_type.is_empty(), "{} has no instance_type", m.id);
        for key in HIDDEN {
            assert!(
                !m.labels.contains_key(key),
                "{} hides {key:?} in labels: {:?}",
                m.id,
                m.labels
            );
        }
    }
}

/// B802: price_per_hour is finite and ≥ 0, interruption_probability is in [0, 1], and any
/// SPOT machine has a positive interruption probability.
#[tokio::test]
async fn b802_cost_fields_are_in_range() {
    let server = core();
    let mut c = server.client().await;
    diversify(&server, &mut c).await;
    let all = list_all(&mut c).await;
    assert!(!all.machines.is_empty(), "empty inventory");
    let mut spot = 0;
    for m in &all.machines {
        assert!(
            m.price_per_hour.is_finite(),
            "{} price {}",
            m.id,
            m.price_per_hour
        );
        assert!(
            m.price_per_hour >= 0.0,
            "{} price {}",
            m.id,
            m.price_per_hour
        );
        let p = m.interruption_probability;
        assert!(
            !p.is_nan() && (0.0..=1.0).contains(&p),
            "{} interruption {p}",
            m.id
        );
        if capacity(m) == CapacityType::Spot {
            spot += 1;
            assert!(p > 0.0, "SPOT {} has interruption probability {p}", m.id);
        }
    }
    if spot == 0 {
        eprintln!("b802: no SPOT machines in the inventory; SPOT rule not exercised");
    }
}

/// The B803 host/cluster rule for one record.
fn check_host_cluster(m: &pb::Machine, when: &str) {
    match state(m) {
        S::Speculative => {
            assert!(
                !host_set(m),
                "{when}: SPECULATIVE {} has a host: {:?}",
                m.id,
                m.host
            );
            assert_eq!(m.cluster, "", "{when}: SPECULATIVE {} has a cluster", m.id);
        }
        S::Idle => {
            assert!(host_set(m), "{when}: IDLE {} has no host", m.id);
            assert_eq!(m.cluster, "", "{when}: IDLE {} has a cluster", m.id);
        }
        S::Configured => {
            assert!(host_set(m), "{when}: CONFIGURED {} has no host", m.id);
            assert!(
                !m.cluster.is_empty(),
                "{when}: CONFIGURED {} has no cluster",
                m.id
            );
        }
        _ => {}
    }
}

/// B803: host and cluster follow the state (SPECULATIVE: no host, no cluster; IDLE: host, no
/// cluster; CONFIGURED: host and cluster), across the inventory and along a fresh walk.
#[tokio::test]
async fn b803_host_and_cluster_are_consistent_with_state() {
    let server = core();
    let mut c = server.client().await;
    diversify(&server, &mut c).await;
    for m in &list_all(&mut c).await.machines {
        check_host_cluster(m, "inventory");
    }

    let id = pick(&server, &mut c).await;
    let m = get(&mut c, &id).await.expect("Get");
    assert_eq!(state(&m), S::Speculative);
    check_host_cluster(&m, "picked");
    create(&mut c, &id, None).await.expect("Create accepted");
    let m = reach(&mut c, &id, S::Idle, SETTLE).await;
    check_host_cluster(&m, "after Create");
    configure(&mut c, &id, "conf-b803", &[("k", "v")], None)
        .await
        .expect("Configure accepted");
    let m = reach(&mut c, &id, S::Configured, SETTLE).await;
    check_host_cluster(&m, "after Configure");
    assert_eq!(m.cluster, "conf-b803");
    drain(&mut c, &id, 0, None).await.expect("Drain accepted");
    let m = reach(&mut c, &id, S::Idle, SETTLE).await;
    check_host_cluster(&m, "after Drain");
}

/// Parses a Kubernetes-style quantity of the B804 grammar: digits, an optional `.digits`
/// fraction, an optional suffix from Gi, Mi, Ki, G, M, k, m. Returns the scaled value.
fn quantity(text: &str) -> Option<f64> {
    const SUFFIXES: [(&str, f64); 7] = [
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Ki", 1024.0),
        ("G", 1e9),
        ("M", 1e6),
        ("k", 1e3),
        ("m", 1e-3),
    ];
    let (number, scale) = SUFFIXES
        .iter()
        .find_map(|(s, f)| text.strip_suffix(s).map(|n| (n, *f)))
        .unwrap_or((text, 1.0));
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (number, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || fraction.is_some_and(|f| !digits(f)) {
        return None;
    }
    number.parse::<f64>().ok().map(|v| v * scale)
}

/// B804: wherever a machine fills both `resources` and `allocatable`, every shared key parses
/// as a quantity (decimal with optional fraction and Gi/Mi/Ki/G/M/k/m suffix), the resources
/// value is > 0 and the allocatable value ≥ 0. This provider fills both maps, so at least one
/// machine must be checked.
#[tokio::test]
async fn b804_resource_quantities_parse_for_density() {
    // The grammar itself, so a too-lenient parser cannot pass the inventory vacuously.
    for ok in [
        "4", "16Gi", "1.5", "500m", "2k", "0", "3Mi", "7Ki", "1G", "2M",
    ] {
        assert!(quantity(ok).is_some(), "{ok} should parse");
    }
    for bad in [
        "", "Gi", "abc", "1.", ".5", "-1", "1e3", "4 Gi", "1.5Ti", "4GiB",
    ] {
        assert!(quantity(bad).is_none(), "{bad:?} should not parse");
    }

    let server = core();
    let mut c = server.client().await;
    diversify(&server, &mut c).await;
    let all = list_all(&mut c).await;
    assert!(!all.machines.is_empty(), "empty inventory");
    let mut checked = 0;
    for m in &all.machines {
        let (Some(res), Some(alloc)) = (&m.resources, &m.allocatable) else {
            continue;
        };
        if res.resources.is_empty() || alloc.resources.is_empty() {
            continue;
        }
        checked += 1;
        for (key, rv) in &res.resources {
            let Some(av) = alloc.resources.get(key) else {
                continue;
            };
            let r = quantity(rv).unwrap_or_else(|| panic!("{}: resources[{key}]={rv:?}", m.id));
            let a = quantity(av).unwrap_or_else(|| panic!("{}: allocatable[{key}]={av:?}", m.id));
            assert!(r > 0.0, "{}: resources[{key}]={rv} is not > 0", m.id);
            assert!(a >= 0.0, "{}: allocatable[{key}]={av} is negative", m.id);
        }
    }
    assert!(
        checked > 0,
        "no machine fills both resources and allocatable"
    );
}

/// Asserts `id` has a host whose provider is `p`, on Get and in a full unfiltered List.
async fn check_provider(c: &mut Client, id: &str, p: &str, when: &str) {
    let m = get(c, id).await.expect("Get");
    let host = m
        .host
        .as_ref()
        .unwrap_or_else(|| panic!("{when}: Get shows no host"));
    assert_eq!(host.provider, p, "{when}: Get host.provider");
    let all = list_all(c).await;
    let listed = all.machines.iter().find(|m| m.id == id);
    let listed = listed.unwrap_or_else(|| panic!("{when}: {id} missing from the full List"));
    let host = listed
        .host
        .as_ref()
        .unwrap_or_else(|| panic!("{when}: List shows no host"));
    assert_eq!(host.provider, p, "{when}: List host.provider");
}

/// B805: HostRef.provider is non-empty at Idle (here: the `--provider` label) and unchanged
/// on Get and List through Configure → CONFIGURED and Drain → IDLE.
#[tokio::test]
async fn b805_host_provider_is_stable_across_a_binding_cycle() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_idle(&server, &mut c).await;
    let m = get(&mut c, &id).await.expect("Get");
    assert!(host_set(&m), "IDLE without a host");
    let p = m
        .host
        .as_ref()
        .map(|h| h.provider.clone())
        .unwrap_or_default();
    assert!(
        !p.is_empty(),
        "IDLE host has an empty provider: {:?}",
        m.host
    );
    assert_eq!(p, PROVIDER, "host.provider should be the --provider label");
    check_provider(&mut c, &id, &p, "IDLE").await;

    configure(&mut c, &id, "conf-b805", &[("k", "v")], None)
        .await
        .expect("Configure accepted");
    reach(&mut c, &id, S::Configured, SETTLE).await;
    check_provider(&mut c, &id, &p, "CONFIGURED").await;

    drain(&mut c, &id, 0, None).await.expect("Drain accepted");
    reach(&mut c, &id, S::Idle, SETTLE).await;
    check_provider(&mut c, &id, &p, "IDLE after Drain").await;
}

/// The B806 rule for one record.
fn check_capacity_zone(m: &pb::Machine, when: &str) {
    let stable = matches!(state(m), S::Speculative | S::Idle | S::Configured);
    if stable && host_set(m) {
        assert_ne!(
            capacity(m),
            CapacityType::Unspecified,
            "{when}: {} has no capacity_type",
            m.id
        );
        assert!(!m.zone.is_empty(), "{when}: {} has no zone", m.id);
    }
}

/// B806: every stable machine with a host also has a capacity_type and a zone — across the
/// inventory, on a machine walked to Idle, and on it again once CONFIGURED.
#[tokio::test]
async fn b806_hosted_machines_have_capacity_type_and_zone() {
    let server = core();
    let mut c = server.client().await;
    diversify(&server, &mut c).await;
    let all = list_all(&mut c).await;
    assert!(
        all.machines.iter().any(host_set),
        "no hosted machine to check in the inventory"
    );
    for m in &all.machines {
        check_capacity_zone(m, "inventory");
    }
    let id = walk_to_idle(&server, &mut c).await;
    let m = get(&mut c, &id).await.expect("Get");
    assert!(host_set(&m));
    check_capacity_zone(&m, "IDLE");
    configure(&mut c, &id, "conf-b806", &[("k", "v")], None)
        .await
        .expect("Configure accepted");
    let m = reach(&mut c, &id, S::Configured, SETTLE).await;
    assert!(host_set(&m));
    check_capacity_zone(&m, "CONFIGURED");
}

/// B807: Delete clears host, cluster and metadata: Configured (host, cluster) → Drain(0) →
/// IDLE with host → Delete → SPECULATIVE with no host, no cluster, no metadata.
#[tokio::test]
async fn b807_delete_clears_host_cluster_and_metadata() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_configured(&server, &mut c, "conf-b807", &[("a", "1"), ("b", "2")]).await;
    let m = get(&mut c, &id).await.expect("Get");
    assert!(host_set(&m), "CONFIGURED without a host");
    assert!(!m.cluster.is_empty(), "CONFIGURED without a cluster");
    assert_eq!(m.shard_metadata, md(&[("a", "1"), ("b", "2")]));

    drain(&mut c, &id, 0, None).await.expect("Drain accepted");
    let m = reach(&mut c, &id, S::Idle, SETTLE).await;
    assert!(host_set(&m), "IDLE after Drain without a host");

    delete(&mut c, &id, None)
        .await
        .expect("Delete accepted (core profile supports Delete)");
    let m = reach(&mut c, &id, S::Speculative, SETTLE).await;
    assert!(
        !host_set(&m),
        "SPECULATIVE after Delete still has a host: {:?}",
        m.host
    );
    assert_eq!(m.cluster, "", "cluster left after Delete");
    assert!(
        m.shard_metadata.is_empty(),
        "metadata left after Delete: {:?}",
        m.shard_metadata
    );
}

crate::harness::backend::on_test_driver!(
    b801_inventory_ids_state_and_instance_type_are_set,
    b802_cost_fields_are_in_range,
    b803_host_and_cluster_are_consistent_with_state,
    b804_resource_quantities_parse_for_density,
    b805_host_provider_is_stable_across_a_binding_cycle,
    b806_hosted_machines_have_capacity_type_and_zone,
    b807_delete_clears_host_cluster_and_metadata,
);

crate::harness::backend::on_real_libvirtd!(
    b803_host_and_cluster_are_consistent_with_state,
    b807_delete_clears_host_cluster_and_metadata,
);
