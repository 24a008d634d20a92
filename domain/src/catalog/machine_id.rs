//! Slot ids (docs/libvirt.md §3.4): `<provider>/<CapacityToken>/<type>/<zone>/<index>`.
//!
//! Ids persist in the state store and in each domain's libvirt metadata, so the format is
//! fixed: the index is zero-padded to at least three digits, and parsing reads the last four
//! components from the right so a provider label may itself contain `/`. Instance types and
//! zones never contain `/` (the loaders refuse them), which is what makes the parse unambiguous.

use crate::CapacityType;

/// The components of a slot id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedId {
    /// The provider label (may contain `/`).
    pub provider: String,
    /// The capacity class named by the token.
    pub capacity: CapacityType,
    /// The instance type.
    pub instance_type: String,
    /// The zone.
    pub zone: String,
    /// The slot number.
    pub index: i64,
}

/// Formats a slot id.
#[must_use]
pub fn format_machine_id(
    provider: &str,
    capacity: CapacityType,
    instance_type: &str,
    zone: &str,
    index: u64,
) -> String {
    format!(
        "{provider}/{}/{instance_type}/{zone}/{index:03}",
        capacity.token()
    )
}

/// Parses a slot id from the right: at least five `/`-separated parts, the last four being
/// capacity token, type, zone and a (signed) integer index, the rest joined as the provider.
/// Only the `OnDemand`, `BareMetal`, `Reserved` and `Spot` tokens are understood, and the type
/// and zone must be non-empty. Checking the provider, zone and type against the running
/// configuration is the caller's job.
#[must_use]
pub fn parse_machine_id(id: &str) -> Option<ParsedId> {
    let mut parts = id.rsplitn(5, '/');
    let index = parts.next()?.parse().ok()?;
    let zone = parts.next()?;
    let instance_type = parts.next()?;
    let capacity = match parts.next()? {
        "OnDemand" => CapacityType::OnDemand,
        "BareMetal" => CapacityType::BareMetal,
        "Reserved" => CapacityType::Reserved,
        "Spot" => CapacityType::Spot,
        _ => return None,
    };
    let provider = parts.next()?;
    if zone.is_empty() || instance_type.is_empty() {
        return None;
    }
    Some(ParsedId {
        provider: provider.to_owned(),
        capacity,
        instance_type: instance_type.to_owned(),
        zone: zone.to_owned(),
        index,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn format_pads_to_three_digits_and_grows_beyond() {
        let id =
            |index| format_machine_id("libvirt", CapacityType::OnDemand, "kvm.large", "a", index);
        assert_eq!(id(0), "libvirt/OnDemand/kvm.large/a/000");
        assert_eq!(id(42), "libvirt/OnDemand/kvm.large/a/042");
        assert_eq!(id(999), "libvirt/OnDemand/kvm.large/a/999");
        assert_eq!(id(1000), "libvirt/OnDemand/kvm.large/a/1000");
        let metal = format_machine_id("p", CapacityType::BareMetal, "t", "z", 7);
        assert_eq!(metal, "p/BareMetal/t/z/007");
    }

    #[test]
    fn parse_reads_from_the_right_and_keeps_slashes_in_the_provider() {
        let parsed = parse_machine_id("team/libvirt/BareMetal/kvm.small/rack1/012").unwrap();
        assert_eq!(
            parsed,
            ParsedId {
                provider: "team/libvirt".into(),
                capacity: CapacityType::BareMetal,
                instance_type: "kvm.small".into(),
                zone: "rack1".into(),
                index: 12,
            }
        );
        assert_eq!(parse_machine_id("/Spot/t/z/1").unwrap().provider, "");
        assert_eq!(parse_machine_id("p/Reserved/t/z/-3").unwrap().index, -3);
    }

    #[test]
    fn parse_refuses_malformed_ids() {
        for id in [
            "",
            "OnDemand/t/z/000",
            "p/OnDemand/t/z/x",
            "p/OnDemand/t/z/",
            "p/Unspecified/t/z/000",
            "p/ondemand/t/z/000",
            "p/OnDemand//z/000",
            "p/OnDemand/t//000",
            "libvirt-test/OnDemand/kvm.large/rack1/99999999999999999999",
        ] {
            assert_eq!(parse_machine_id(id), None, "{id:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn format_then_parse_round_trips(
            provider in "[a-z/]{0,12}",
            metal in any::<bool>(),
            instance_type in "[a-z.0-9-]{1,10}",
            zone in "[a-z0-9-]{1,8}",
            index in 0u64..100_000,
        ) {
            let capacity = if metal { CapacityType::BareMetal } else { CapacityType::OnDemand };
            let id = format_machine_id(&provider, capacity, &instance_type, &zone, index);
            let parsed = parse_machine_id(&id).unwrap();
            prop_assert_eq!(parsed.provider, provider);
            prop_assert_eq!(parsed.capacity, capacity);
            prop_assert_eq!(parsed.instance_type, instance_type);
            prop_assert_eq!(parsed.zone, zone);
            prop_assert_eq!(parsed.index, i64::try_from(index).unwrap());
        }
    }
}
