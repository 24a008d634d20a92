//! The pools file's checks and the book's addresses, through `AddressPools`'s public face.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;
use crate::tests::slots;

fn network() -> Vec<NicSource> {
    vec![NicSource::Network("nodes".to_owned())]
}

fn parse(json: &str) -> Result<AddressPools, String> {
    AddressPools::parse(json.as_bytes(), "pools.json")
}

#[test]
fn slot_i_gets_first_plus_i_with_the_pool_settings() {
    let pools = parse(
        r#"[{"instance_type": "kvm.small", "zone": "a", "cidr": "10.20.0.0/24",
             "first": "10.20.0.10", "gateway": "10.20.0.1", "dns": ["10.20.0.2", "1.1.1.1"],
             "search": ["nodes.example"], "vlan": 120}]"#,
    )
    .unwrap();
    let mut all = slots("p", "a", "kvm.small", 3);
    all.extend(slots("p", "b", "kvm.small", 2));
    let book = pools.book(&all, |_| network()).unwrap();
    assert_eq!(book.len(), 3, "only the offering's slots have an address");
    for (index, slot) in all.iter().take(3).enumerate() {
        let address = book.get(slot.id.as_str()).unwrap();
        assert_eq!(address.with_prefix(), format!("10.20.0.{}/24", 10 + index));
        let subnet = &address.subnet;
        assert_eq!(subnet.gateway, Some(Ipv4Addr::new(10, 20, 0, 1)));
        assert_eq!(subnet.dns.len(), 2);
        assert_eq!(subnet.search, ["nodes.example"]);
        assert_eq!(subnet.vlan, Some(120));
    }
    assert!(book.get(all[3].id.as_str()).is_none(), "zone b keeps DHCP");
}

#[test]
fn a_bad_pool_is_refused_naming_the_file_the_pool_and_the_fix() {
    let pool =
        |fields: &str| format!(r#"[{{"instance_type": "kvm.small", "zone": "a", {fields}}}]"#);
    for (json, says) in [
        ("{}".to_owned(), "not a JSON list of pools"),
        ("[]".to_owned(), "lists no pool; add one, or drop the flag"),
        (pool(r#""cidr": "10.0.0.0/24""#), "missing field `first`"),
        (
            pool(r#""cidr": "10.0.0.0/24", "first": "10.0.0.9", "mask": 1"#),
            "unknown field `mask`",
        ),
        (
            pool(r#""cidr": "10.0.0/24", "first": "10.0.0.9""#),
            "is not an IPv4 network such as 10.20.0.0/24",
        ),
        (
            pool(r#""cidr": "10.0.0.0/31", "first": "10.0.0.1""#),
            "use a /30 or wider",
        ),
        (
            pool(r#""cidr": "10.0.0.5/24", "first": "10.0.0.9""#),
            "has host bits set; write the network itself, 10.0.0.0/24",
        ),
        (
            pool(r#""cidr": "10.0.0.0/24", "first": "10.0.1.9""#),
            "first 10.0.1.9 is not a host address of 10.0.0.0/24",
        ),
        (
            pool(r#""cidr": "10.0.0.0/24", "first": "10.0.0.0""#),
            "first 10.0.0.0 is not a host address",
        ),
        (
            pool(r#""cidr": "10.0.0.0/24", "first": "10.0.0.9", "gateway": "10.0.0.255""#),
            "gateway 10.0.0.255 is not a host address",
        ),
        (
            pool(r#""cidr": "10.0.0.0/24", "first": "10.0.0.9", "dns": ["dns.example"]"#),
            "dns \"dns.example\" is not an IPv4 address",
        ),
        (
            pool(r#""cidr": "10.0.0.0/24", "first": "10.0.0.9", "search": ["a b"]"#),
            "is not a DNS name",
        ),
        (
            pool(r#""cidr": "10.0.0.0/24", "first": "10.0.0.9", "vlan": 4095"#),
            "vlan 4095 is not a VLAN id; use 1 to 4094",
        ),
        (
            r#"[{"instance_type": "", "zone": "a", "cidr": "10.0.0.0/24", "first": "10.0.0.9"}]"#
                .to_owned(),
            "instance_type is empty",
        ),
    ] {
        let error = parse(&json).unwrap_err();
        assert!(error.starts_with("--address-pools pools.json"), "{error}");
        assert!(error.contains(says), "{json}: {error}");
    }
    let twice = r#"[{"instance_type": "kvm.small", "zone": "a", "cidr": "10.0.0.0/24", "first": "10.0.0.9"},
                    {"instance_type": "kvm.small", "zone": "a", "cidr": "10.1.0.0/24", "first": "10.1.0.9"}]"#;
    let error = parse(twice).unwrap_err();
    assert!(
        error.contains("pool 1 (kvm.small in a) serves the same offering as pool 0"),
        "{error}"
    );
}

#[test]
fn pools_that_do_not_fit_their_slots_are_refused_at_start() {
    let all = slots("p", "a", "kvm.small", 10);
    let book = |json: &str, nics: Vec<NicSource>| {
        parse(json)
            .unwrap()
            .book(&all, |_| nics.clone())
            .unwrap_err()
    };
    let one = |fields: &str| {
        format!(
            r#"[{{"instance_type": "kvm.small", "zone": "a", "cidr": "10.0.0.0/24", {fields}}}]"#
        )
    };
    for (json, nics, says) in [
        (one(r#""first": "10.0.0.250""#), network(),
         "slot numbers run up to 9, so the pool needs 10 addresses from 10.0.0.250, past 10.0.0.0/24's last host address 10.0.0.254; widen the cidr"),
        (one(r#""first": "10.0.0.1", "gateway": "10.0.0.5""#), network(),
         "its range 10.0.0.1–10.0.0.10 contains the gateway 10.0.0.5"),
        (one(r#""first": "10.0.0.1", "dns": ["10.0.0.10"]"#), network(),
         "contains the DNS server 10.0.0.10"),
        (one(r#""first": "10.0.0.1""#), Vec::new(), "its machines have no NIC"),
        (one(r#""first": "10.0.0.1", "vlan": 7"#), vec![NicSource::Bridge("br0".to_owned())],
         "asks for VLAN 7 on the first NIC, bridge=br0, which cannot carry a tag; plug it into an Open vSwitch bridge (ovs=NAME)"),
        (one(r#""first": "10.0.0.1", "vlan": 7"#), vec![NicSource::parse("direct=eth1:vepa").unwrap()],
         "on the first NIC, direct=eth1:vepa, which cannot carry a tag"),
        (r#"[{"instance_type": "kvm.large", "zone": "a", "cidr": "10.0.0.0/24", "first": "10.0.0.1"}]"#.to_owned(),
         network(), "no offering has slots of that type in that zone"),
    ] {
        let error = book(&json, nics);
        assert!(error.starts_with("--address-pools: pool 0 ("), "{error}");
        assert!(error.contains(says), "{json}: {error}");
    }
    let tagged = parse(&one(r#""first": "10.0.0.1", "vlan": 7"#)).unwrap();
    for carrier in [
        "ovs=ovsbr0",
        "direct=enp1s0f1v0:passthrough",
        "network=tagged",
    ] {
        let nics = vec![NicSource::parse(carrier).unwrap()];
        let booked = tagged.book(&all, |_| nics.clone());
        assert_eq!(booked.map(|b| b.len()), Ok(10), "{carrier} carries a tag");
    }
}

#[test]
fn overlapping_ranges_are_refused_naming_both_pools() {
    let mut all = slots("p", "a", "kvm.small", 10);
    all.extend(slots("p", "a", "kvm.large", 4));
    let pools = parse(
        r#"[{"instance_type": "kvm.small", "zone": "a", "cidr": "10.0.0.0/24", "first": "10.0.0.10"},
            {"instance_type": "kvm.large", "zone": "a", "cidr": "10.0.0.0/16", "first": "10.0.0.19"}]"#,
    )
    .unwrap();
    let error = pools.book(&all, |_| network()).unwrap_err();
    assert!(
        error.contains("pool 0 (kvm.small in a) hands out 10.0.0.10–10.0.0.19, and pool 1 (kvm.large in a) starts at 10.0.0.19"),
        "{error}"
    );
    let apart = parse(
        r#"[{"instance_type": "kvm.small", "zone": "a", "cidr": "10.0.0.0/24", "first": "10.0.0.10"},
            {"instance_type": "kvm.large", "zone": "a", "cidr": "10.0.0.0/24", "first": "10.0.0.20"}]"#,
    )
    .unwrap();
    assert_eq!(apart.book(&all, |_| network()).unwrap().len(), 14);
}

proptest! {
    /// Whatever pools and offerings the book accepts, no address goes to two slots, every
    /// address is a host address of its pool's network and not its gateway, a slot keeps
    /// its address when its offering grows, and a restarted process that lists the slots in
    /// another order books each the same address (nothing is stored for it).
    #[test]
    fn an_accepted_book_never_hands_one_address_to_two_slots(
        offers in prop::collection::vec((0usize..2, 0usize..2, 1i64..40), 1..4),
        starts in prop::collection::vec((0u32..3, 1u32..250), 1..4),
        grow in 1i64..20,
    ) {
        let types = ["kvm.small", "kvm.large"];
        let zones = ["a", "b"];
        let mut all = Vec::new();
        let mut offered = BTreeSet::new();
        for (t, z, count) in offers {
            if offered.insert((t, z)) {
                all.extend(slots("p", zones[z], types[t], count));
            }
        }
        let pools: Vec<String> = offered.iter().zip(&starts).map(|((t, z), (net, first))| {
            format!(
                r#"{{"instance_type": "{}", "zone": "{}", "cidr": "10.{net}.0.0/24",
                    "first": "10.{net}.0.{first}", "gateway": "10.{net}.0.254"}}"#,
                types[*t], zones[*z]
            )
        }).collect();
        let pools = parse(&format!("[{}]", pools.join(","))).unwrap();
        if let Ok(book) = pools.book(&all, |_| network()) {
            let mut seen = BTreeSet::new();
            for slot in &all {
                let Some(address) = book.get(slot.id.as_str()) else { continue };
                let net = address.subnet.network;
                prop_assert!(seen.insert(address.address), "{} twice", address.address);
                prop_assert!(net.hosts().any(|h| h == address.address));
                prop_assert_ne!(Some(address.address), address.subnet.gateway);
            }
            let mut reordered = all.clone();
            reordered.reverse();
            let again = pools.book(&reordered, |_| network()).unwrap();
            for slot in &all {
                prop_assert_eq!(book.get(slot.id.as_str()), again.get(slot.id.as_str()));
            }
            let (t, z) = *offered.iter().next().unwrap();
            let mut grown = all.clone();
            grown.extend(slots("p", zones[z], types[t], grow));
            grown.sort_by(|a, b| a.id.cmp(&b.id));
            grown.dedup_by(|a, b| a.id == b.id);
            if let Ok(bigger) = pools.book(&grown, |_| network()) {
                for slot in &all {
                    prop_assert_eq!(book.get(slot.id.as_str()), bigger.get(slot.id.as_str()));
                }
            }
        }
    }
}
