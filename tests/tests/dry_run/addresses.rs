//! Dry runs with `--address-pools`: the pools are checked against the offerings before the
//! provider starts (an exhausted, overlapping or misplaced pool is refused on one line that
//! names the flag, the pool and the fix), and pools that fit are accepted.

use super::{dry_run, refused};

/// The pools file `json` and the offerings `kvm.small`×10 and `kvm.large`×4 in `rack1`,
/// for a libvirt dry run on the test driver.
fn run_with(json: &str, check: impl FnOnce(&[&str])) {
    let dir = tempfile::tempdir().unwrap();
    let pools = dir.path().join("pools.json");
    std::fs::write(&pools, json).unwrap();
    let offerings = dir.path().join("offerings.json");
    std::fs::write(
        &offerings,
        r#"[{"instance_type": "kvm.small", "zone": "rack1", "count": 10},
            {"instance_type": "kvm.large", "zone": "rack1", "count": 4}]"#,
    )
    .unwrap();
    let args = [
        "--connect",
        "rack1=test:///default",
        "--image",
        "base.qcow2",
        "--offerings",
        offerings.to_str().unwrap(),
        "--address-pools",
        pools.to_str().unwrap(),
    ];
    check(&args);
}

#[test]
fn pools_that_fit_the_offerings_are_accepted() {
    run_with(
        r#"[{"instance_type": "kvm.small", "zone": "rack1", "cidr": "10.20.0.0/24",
             "first": "10.20.0.10", "gateway": "10.20.0.1", "dns": ["10.20.0.1"]},
            {"instance_type": "kvm.large", "zone": "rack1", "cidr": "10.20.0.0/24",
             "first": "10.20.0.20", "gateway": "10.20.0.1"}]"#,
        |args| {
            let inventory = dry_run(args);
            assert_eq!(inventory.matches("\"id\"").count(), 14, "{inventory}");
        },
    );
}

#[test]
fn pools_that_cannot_serve_their_offering_are_refused_naming_the_fix() {
    let small = |fields: &str| {
        format!(
            r#"[{{"instance_type": "kvm.small", "zone": "rack1", "cidr": "10.20.0.0/24", {fields}}}]"#
        )
    };
    for (json, says) in [
        (
            small(r#""first": "10.20.0.250""#),
            "--address-pools: pool 0 (kvm.small in rack1): slot numbers run up to 9, so the pool needs 10 addresses",
        ),
        (
            r#"[{"instance_type": "kvm.small", "zone": "rack1", "cidr": "10.20.0.0/24", "first": "10.20.0.10"},
                {"instance_type": "kvm.large", "zone": "rack1", "cidr": "10.20.0.0/24", "first": "10.20.0.15"}]"#
                .to_owned(),
            "hands out 10.20.0.10–10.20.0.19, and pool 1 (kvm.large in rack1) starts at 10.20.0.15",
        ),
        (
            r#"[{"instance_type": "kvm.small", "zone": "rack9", "cidr": "10.20.0.0/24", "first": "10.20.0.10"}]"#
                .to_owned(),
            "no offering has slots of that type in that zone",
        ),
        (small(r#""first": "10.20.0.10", "vlan": 0"#), "vlan 0 is not a VLAN id"),
        ("not json".to_owned(), "not a JSON list of pools"),
    ] {
        run_with(&json, |args| {
            let error = refused(args);
            assert!(error.contains("--address-pools"), "{error}");
            assert!(error.contains(says), "{json}: {error}");
        });
    }
}
