//! Snapshot tests pinning the inventory the built-in offerings produce: slot ids persist in
//! state files and libvirt metadata, so any change to them must show up in review.

use super::{InstanceCatalog, InventoryConfig, PriceTable, build_inventory, default_offerings};

/// The inventory of the built-in offerings on `zones` (the zones of the `--connect` hosts;
/// none for the fake).
fn default_inventory(seed_count: i64, zones: &[&str]) -> super::Inventory {
    let zones: Vec<String> = zones.iter().map(|zone| (*zone).to_owned()).collect();
    let catalog = InstanceCatalog::builtin();
    let prices = PriceTable::default();
    let offerings = default_offerings(seed_count, &zones, "local", "on_demand", &catalog);
    let cfg = InventoryConfig {
        provider: "libvirt",
        catalog: &catalog,
        prices: &prices,
        require_zones: Some(&zones)
            .filter(|zones| !zones.is_empty())
            .map(Vec::as_slice),
    };
    build_inventory(&offerings, &cfg).unwrap()
}

#[test]
fn default_offerings_seed_7_without_connect() {
    insta::assert_yaml_snapshot!(default_inventory(7, &[]));
}

#[test]
fn default_offerings_seed_4_on_one_host() {
    insta::assert_yaml_snapshot!(default_inventory(4, &["rack1"]));
}
