//! Static address pools on libvirt's test driver: the Create of a slot a pool serves defines
//! its first NIC with the pool's VLAN tag on an Open vSwitch port, and its seed volume is
//! sized for the extra `network-config` file. The test driver cannot stream a volume, so
//! the seed's content is pinned by the spec snapshot (`render/spec_tests.rs`) and walked by
//! the real-QEMU tier (`qemu_image::network`), where the guest takes the address.

use super::*;
use crate::options::AddressPools;
use crate::storage::volumes::seed_name;
use bigfleet_libvirt_config::naming::domain_name;

#[tokio::test]
async fn a_pooled_slot_gets_its_tag_on_the_first_nic_and_a_larger_seed() {
    let mut all = slots("libvirt", ZONE, "kvm.small", 2);
    all.extend(slots("libvirt", ZONE, "kvm.medium", 1));
    let pools = AddressPools::parse(
        br#"[{"instance_type": "kvm.small", "zone": "rack1", "cidr": "10.30.0.0/24",
              "first": "10.30.0.20", "gateway": "10.30.0.1", "vlan": 30}]"#,
        "pools.json",
    )
    .unwrap();
    let book_slots = all.clone();
    let rig = rig_with(&Fixture::default(), all, move |config| {
        config.options.nics = vec![crate::NicSource::parse("ovs=ovsbr0").unwrap()];
        let options = config.options.clone();
        config.options.addresses = pools.book(&book_slots, |t| options.nic_sources(t)).unwrap();
    })
    .await;
    let (second, other) = (rig.slots[1].clone(), rig.slots[2].clone());
    create(&rig.hv, &second).await.unwrap();
    create(&rig.hv, &other).await.unwrap();
    let name = domain_name("libvirt", second.id.as_str());
    let document = on_host(&rig.hv, ZONE, {
        let name = name.clone();
        move |s| (s.conn.lookup_domain_by_name(&name).unwrap().xml_desc(0)).unwrap()
    })
    .await;
    let parsed = roxmltree::Document::parse(&document).unwrap();
    let nic = (parsed.descendants())
        .find(|n| n.has_tag_name("interface"))
        .unwrap();
    let child = |tag: &str| nic.children().find(|c| c.has_tag_name(tag)).unwrap();
    assert_eq!(
        child("virtualport").attribute("type"),
        Some("openvswitch"),
        "{document}"
    );
    let tag = child("vlan")
        .children()
        .find(|c| c.has_tag_name("tag"))
        .unwrap();
    assert_eq!(tag.attribute("id"), Some("30"), "{document}");

    let seeds = sized(&rig, "default").await;
    let size = |name: &str| {
        let seed = seed_name(&domain_name("libvirt", name));
        (seeds.iter())
            .find(|(n, _)| *n == seed)
            .map(|(_, bytes)| *bytes)
            .unwrap()
    };
    assert!(
        size(second.id.as_str()) >= size(other.id.as_str()) + 2048,
        "the pooled slot's seed holds one more file (a sector at least): {seeds:?}"
    );
}
