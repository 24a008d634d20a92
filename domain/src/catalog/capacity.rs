//! Capacity-type strings (docs/libvirt.md §3.6), from `--capacity-type` or an offering's
//! `capacity_type`.
//!
//! A libvirt host is owned hardware: it can be on-demand (slots are created and deleted) or a
//! bare-metal free pool (held forever, no Delete). Spot and reserved are refused with the
//! reason, since neither a preemption market nor commitment billing exists on one's own hosts.

use crate::CapacityType;

use super::CatalogError;

/// Parses a capacity string, case-insensitively and ignoring surrounding blanks; empty means
/// on-demand.
///
/// # Errors
/// [`CatalogError::Capacity`] for `spot`, `reserved` and anything unknown.
pub fn parse_capacity_type(raw: &str) -> Result<CapacityType, CatalogError> {
    let problem = match raw.trim().to_ascii_lowercase().as_str() {
        "" | "on_demand" | "on-demand" | "ondemand" => return Ok(CapacityType::OnDemand),
        "bare_metal" | "bare-metal" | "metal" => return Ok(CapacityType::BareMetal),
        "spot" => "is not meaningful for libvirt (a local host has no preemption market)",
        "reserved" => "is not meaningful for libvirt (no reservation/commitment billing)",
        _ => "is unknown",
    };
    Err(CatalogError::Capacity {
        raw: raw.to_owned(),
        problem,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_demand_aliases_and_empty() {
        for raw in [
            "on_demand",
            "on-demand",
            "ondemand",
            "",
            "ON_DEMAND",
            "On-Demand",
            " ondemand ",
        ] {
            assert_eq!(
                parse_capacity_type(raw).unwrap(),
                CapacityType::OnDemand,
                "{raw:?}"
            );
        }
    }

    #[test]
    fn bare_metal_aliases() {
        for raw in ["bare_metal", "bare-metal", "metal", "BARE_METAL", "Metal"] {
            assert_eq!(
                parse_capacity_type(raw).unwrap(),
                CapacityType::BareMetal,
                "{raw:?}"
            );
        }
    }

    #[test]
    fn spot_and_reserved_are_refused_with_the_reason() {
        let spot = parse_capacity_type("Spot").unwrap_err().to_string();
        assert_eq!(
            spot,
            "capacity_type \"Spot\" is not meaningful for libvirt (a local host has no \
             preemption market); use on_demand or bare_metal (in --capacity-type or the \
             offering's capacity_type)"
        );
        let reserved = parse_capacity_type("reserved").unwrap_err().to_string();
        assert!(
            reserved.contains("no reservation/commitment billing"),
            "{reserved}"
        );
        assert!(
            reserved.contains("use on_demand or bare_metal"),
            "{reserved}"
        );
    }

    #[test]
    fn unknown_values_are_refused() {
        for raw in ["nonsense", "on demand", "baremetal", "OnDemand3"] {
            let msg = parse_capacity_type(raw).unwrap_err().to_string();
            assert!(
                msg.starts_with(&format!("capacity_type {raw:?} is unknown")),
                "{msg}"
            );
        }
    }
}
