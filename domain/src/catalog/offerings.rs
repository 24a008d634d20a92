//! Offerings (docs/libvirt.md §3.1, §3.3): the quota, as instance type × zone × count.
//!
//! They come from an `--offerings` JSON file, or, without one, from a built-in set sized by
//! `--seed-count` that spreads slots over two zones and the catalog's first and last type
//! names. The configuration loader decodes the file into [`Offering`]s; here they are only
//! checked for being there at all, and `inventory` validates them and turns them into slots.

use serde::{Deserialize, Deserializer, Serialize};

use super::{CatalogError, InstanceCatalog};
use crate::StringMap;

const FLAG: &str = "--offerings";

/// What `--seed-count` values of 0 or below stand for.
pub const DEFAULT_SEED_COUNT: i64 = 16;
/// The label selecting the conformance create fault.
pub const FAULT_CREATE_LABEL: &str = "conformance.fault/create";
/// The value of [`FAULT_CREATE_LABEL`] whose Create fails.
pub const FAULT_CREATE_VALUE: &str = "error";
/// How many create-fault slots `--fake-fault-hooks` adds.
pub const FAULT_SLOT_COUNT: i64 = 8;

/// One offering: `count` Speculative slots of `instance_type` on `zone`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offering {
    /// Catalog name.
    pub instance_type: String,
    /// Zone (one libvirt host).
    pub zone: String,
    /// Capacity string (docs/libvirt.md §3.6); empty means on-demand.
    #[serde(default, deserialize_with = "null_as_default")]
    pub capacity_type: String,
    /// Number of slots.
    pub count: i64,
    /// Per-replica request shape copied onto every slot.
    #[serde(default, deserialize_with = "null_as_default")]
    pub resources: StringMap,
    /// Labels copied onto every slot.
    #[serde(default, deserialize_with = "null_as_default")]
    pub labels: StringMap,
}

/// Accepts an explicit JSON `null` for an optional field, as the reference's decoder does.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// Checks decoded offerings (`None` for a JSON `null`); `source` names them in errors.
///
/// # Errors
/// [`CatalogError::Empty`] for `[]` or `null`.
pub fn offerings_from_raw(
    parsed: Option<Vec<Offering>>,
    source: &str,
) -> Result<Vec<Offering>, CatalogError> {
    match parsed {
        Some(offerings) if !offerings.is_empty() => Ok(offerings),
        _ => Err(CatalogError::Empty {
            flag: FLAG,
            source_name: source.to_owned(),
            fix: "list at least one offering, or drop the flag for the --seed-count defaults",
        }),
    }
}

/// The built-in offerings (docs/libvirt.md §3.3). `seed_count <= 0` means [`DEFAULT_SEED_COUNT`].
/// Zones A/B are the first two of `zones` (both the only one when there is one, `<default_zone>-a`
/// and `-b` when there are none); "small"/"large" are the first and last catalog names in sorted
/// order. The four buckets small@A, large@A, small@B, large@B share the count, the remainder going
/// to the first buckets; empty buckets are dropped. Buckets that share (type, zone) are fine: the
/// inventory numbers slots per (type, zone) across offerings, so ids stay distinct.
#[must_use]
pub fn default_offerings(
    seed_count: i64,
    zones: &[String],
    default_zone: &str,
    capacity: &str,
    catalog: &InstanceCatalog,
) -> Vec<Offering> {
    let seed_count = if seed_count <= 0 {
        DEFAULT_SEED_COUNT
    } else {
        seed_count
    };
    let (zone_a, zone_b) = match zones {
        [] => (format!("{default_zone}-a"), format!("{default_zone}-b")),
        [only] => (only.clone(), only.clone()),
        [first, second, ..] => (first.clone(), second.clone()),
    };
    let names = catalog.names();
    let (small, large) = match (names.first(), names.last()) {
        (Some(first), Some(last)) => ((*first).to_owned(), (*last).to_owned()),
        _ => ("kvm.small".to_owned(), "kvm.large".to_owned()),
    };
    let buckets = [
        (&small, &zone_a),
        (&large, &zone_a),
        (&small, &zone_b),
        (&large, &zone_b),
    ];
    let (base, remainder) = (seed_count / 4, seed_count % 4);
    let resources = StringMap::from([
        ("cpu".to_owned(), "1".to_owned()),
        ("memory".to_owned(), "2Gi".to_owned()),
    ]);
    (0i64..)
        .zip(buckets)
        .map(|(position, (instance_type, zone))| Offering {
            instance_type: instance_type.clone(),
            zone: zone.clone(),
            capacity_type: capacity.to_owned(),
            count: base + i64::from(position < remainder),
            resources: resources.clone(),
            labels: StringMap::new(),
        })
        .filter(|offering| offering.count > 0)
        .collect()
}

/// The conformance create-fault slots (`--fake-fault-hooks`): [`FAULT_SLOT_COUNT`] slots of
/// the first sorted catalog type in the first zone (`<default_zone>-a` without connections),
/// labelled [`FAULT_CREATE_LABEL`]=[`FAULT_CREATE_VALUE`]. `capacity` should be the pool's
/// capacity string so the pool stays one class. Appended after the regular offerings, they
/// share slot numbering and so never collide with them.
#[must_use]
pub fn fault_offering(
    catalog: &InstanceCatalog,
    zones: &[String],
    default_zone: &str,
    capacity: &str,
) -> Offering {
    let zone = zones
        .first()
        .cloned()
        .unwrap_or_else(|| format!("{default_zone}-a"));
    let instance_type = catalog
        .names()
        .first()
        .map_or("kvm.small", |name| name)
        .to_owned();
    Offering {
        instance_type,
        zone,
        capacity_type: capacity.to_owned(),
        count: FAULT_SLOT_COUNT,
        resources: StringMap::from([
            ("cpu".to_owned(), "1".to_owned()),
            ("memory".to_owned(), "2Gi".to_owned()),
        ]),
        labels: StringMap::from([(FAULT_CREATE_LABEL.to_owned(), FAULT_CREATE_VALUE.to_owned())]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `text` as the configuration loader does, then checks it.
    fn offerings_from_json(text: &str, source: &str) -> Result<Vec<Offering>, CatalogError> {
        offerings_from_raw(serde_json::from_str(text).unwrap(), source)
    }

    fn counts(seed: i64, zones: &[String], catalog: &InstanceCatalog) -> Vec<(String, i64)> {
        default_offerings(seed, zones, "local", "on_demand", catalog)
            .into_iter()
            .map(|o| (format!("{}@{}", o.instance_type, o.zone), o.count))
            .collect()
    }

    fn pairs(list: &[(&str, i64)]) -> Vec<(String, i64)> {
        list.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    #[test]
    fn defaults_split_the_seed_over_four_buckets() {
        let catalog = InstanceCatalog::builtin();
        let (s, l) = ("kvm.large", "kvm.xlarge");
        let a = |t: &str| format!("{t}@local-a");
        let b = |t: &str| format!("{t}@local-b");
        let want = |c: [i64; 4]| -> Vec<(String, i64)> {
            [(a(s), c[0]), (a(l), c[1]), (b(s), c[2]), (b(l), c[3])]
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect()
        };
        assert_eq!(counts(32, &[], &catalog), want([8, 8, 8, 8]));
        assert_eq!(counts(7, &[], &catalog), want([2, 2, 2, 1]));
        assert_eq!(counts(3, &[], &catalog), want([1, 1, 1, 0]));
        assert_eq!(counts(2, &[], &catalog), want([1, 1, 0, 0]));
        assert_eq!(counts(1, &[], &catalog), want([1, 0, 0, 0]));
        assert_eq!(counts(0, &[], &catalog), want([4, 4, 4, 4]));
        assert_eq!(counts(-5, &[], &catalog), want([4, 4, 4, 4]));
    }

    #[test]
    fn defaults_never_emit_empty_buckets_and_sum_to_the_seed() {
        let catalog = InstanceCatalog::builtin();
        for seed in [1, 2, 3, 5, 7, 32, 33] {
            let got = counts(seed, &[], &catalog);
            assert!(got.iter().all(|(_, n)| *n > 0), "{seed}: {got:?}");
            assert_eq!(got.iter().map(|(_, n)| n).sum::<i64>(), seed);
        }
    }

    #[test]
    fn defaults_take_zones_from_connections() {
        let catalog = InstanceCatalog::builtin();
        let zones: Vec<String> = ["rack1", "rack2", "rack3"].map(String::from).into();
        assert_eq!(
            counts(4, &zones, &catalog),
            pairs(&[
                ("kvm.large@rack1", 1),
                ("kvm.xlarge@rack1", 1),
                ("kvm.large@rack2", 1),
                ("kvm.xlarge@rack2", 1),
            ])
        );
        let one = counts(4, &zones[..1], &catalog);
        assert!(one.iter().all(|(k, _)| k.ends_with("@rack1")), "{one:?}");
        let stem = default_offerings(1, &[], "lab", "", &catalog);
        assert_eq!(stem[0].zone, "lab-a");
    }

    #[test]
    fn defaults_carry_resources_and_the_capacity_string_verbatim() {
        let catalog = InstanceCatalog::builtin();
        for offering in default_offerings(8, &[], "local", "Bare-Metal", &catalog) {
            assert_eq!(offering.capacity_type, "Bare-Metal");
            assert_eq!(offering.resources["cpu"], "1");
            assert_eq!(offering.resources["memory"], "2Gi");
            assert!(offering.labels.is_empty());
        }
    }

    #[test]
    fn single_type_catalog_uses_it_for_both_sizes() {
        let catalog = InstanceCatalog::from_raw(
            serde_json::from_str(r#"{"only": {"vcpu": 1, "memory_mib": 1024}}"#).unwrap(),
            "t",
        )
        .unwrap();
        let got = counts(4, &[], &catalog);
        assert_eq!(
            got,
            pairs(&[
                ("only@local-a", 1),
                ("only@local-a", 1),
                ("only@local-b", 1),
                ("only@local-b", 1)
            ])
        );
    }

    #[test]
    fn fault_offering_shape() {
        let catalog = InstanceCatalog::builtin();
        let fault = fault_offering(&catalog, &[], "local", "on_demand");
        assert_eq!(
            (fault.instance_type.as_str(), fault.zone.as_str()),
            ("kvm.large", "local-a")
        );
        assert_eq!(fault.count, 8);
        assert_eq!(fault.labels[FAULT_CREATE_LABEL], "error");
        let zones = vec!["rack2".to_owned(), "rack1".to_owned()];
        assert_eq!(fault_offering(&catalog, &zones, "local", "").zone, "rack2");
    }

    #[test]
    fn offerings_json_parses_with_defaults_and_ignores_unknown_keys() {
        let text = r#"[
            {"instance_type": "kvm.small", "zone": "rack1", "count": 3, "extra": true},
            {"instance_type": "kvm.large", "zone": "rack2", "count": 1,
             "capacity_type": "bare_metal", "resources": {"cpu": "2"},
             "labels": {"pool": "gpu"}},
            {"instance_type": "kvm.large", "zone": "rack2", "count": 1, "labels": null}
        ]"#;
        let got = offerings_from_json(text, "o.json").unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].capacity_type, "");
        assert!(got[0].resources.is_empty() && got[0].labels.is_empty());
        assert_eq!(got[1].capacity_type, "bare_metal");
        assert_eq!(got[1].resources["cpu"], "2");
        assert_eq!(got[1].labels["pool"], "gpu");
        assert!(got[2].labels.is_empty());
    }
}
