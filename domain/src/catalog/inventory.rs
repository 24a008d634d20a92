//! Offerings → the Speculative inventory (docs/libvirt.md §3.2, §3.4, §3.6).
//!
//! Each offering is validated in the reference's order, then expanded into one Speculative
//! machine per slot, offering by offering. Unlike the reference, slot numbers count per
//! (capacity, type, zone) across all offerings rather than restarting per offering, so two
//! offerings on the same (type, zone) — a single host, a single-type catalog, a repeated
//! entry, or the fault slots — continue the numbering instead of producing duplicate ids that
//! would stop the provider from starting.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    CatalogError, InstanceCatalog, Offering, PriceTable, format_machine_id, parse_capacity_type,
};
use crate::{CapacityType, Machine, MachineId, MachineState, SharedMap, StringMap};

/// Most slots one provider will hold, so a typo in a count fails loudly instead of exhausting
/// memory.
pub const MAX_SLOTS: i64 = 1_000_000;

/// Label keys an offering may not set: they would shadow top-level machine fields.
pub const RESERVED_LABEL_KEYS: [&str; 9] = [
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

/// What `build_inventory` needs besides the offerings.
#[derive(Clone, Copy, Debug)]
pub struct InventoryConfig<'a> {
    /// The provider label, first component of every id.
    pub provider: &'a str,
    /// The instance-type catalog.
    pub catalog: &'a InstanceCatalog,
    /// The price table.
    pub prices: &'a PriceTable,
    /// With the real backend, the `--connect` zones every offering must be placed on; `None`
    /// for the fake, whose zones are synthetic.
    pub require_zones: Option<&'a [String]>,
}

/// The validated inventory.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Inventory {
    /// Every slot, Speculative and hostless, offering by offering.
    pub machines: Vec<Machine>,
    /// The pool's class: `BareMetal` when every offering is bare metal, else `OnDemand`.
    pub capacity: CapacityType,
    /// Whether Delete is offered: false exactly when the pool is bare metal.
    pub delete_supported: bool,
}

/// Validates `offerings` and expands them into Speculative machines.
///
/// Per offering, first failure wins: capacity type, empty type, type not in the catalog,
/// empty zone, zone containing `/` or `:`, zone without a `--connect` host (only with
/// `require_zones`), `count <= 0`, reserved label keys. Then across offerings: bare metal
/// mixed with deletable capacity, no offerings, more than [`MAX_SLOTS`] slots.
///
/// # Errors
/// The first [`CatalogError`] found, in the order above.
pub fn build_inventory(
    offerings: &[Offering],
    cfg: &InventoryConfig<'_>,
) -> Result<Inventory, CatalogError> {
    let capacities = offerings
        .iter()
        .map(|offering| validate_offering(offering, cfg))
        .collect::<Result<Vec<_>, _>>()?;
    let bare_metal = capacities
        .iter()
        .filter(|c| **c == CapacityType::BareMetal)
        .count();
    if bare_metal > 0 && bare_metal < capacities.len() {
        return Err(CatalogError::MixedCapacity);
    }
    if offerings.is_empty() {
        return Err(CatalogError::NoOfferings);
    }
    let total = offerings
        .iter()
        .try_fold(0i64, |sum, o| sum.checked_add(o.count));
    if total.is_none_or(|total| total > MAX_SLOTS) {
        return Err(CatalogError::TooManySlots);
    }
    let mut next_index: BTreeMap<(CapacityType, &str, &str), u64> = BTreeMap::new();
    let slots = total.and_then(|t| usize::try_from(t).ok()).unwrap_or(0);
    let mut machines = Vec::with_capacity(slots);
    for (offering, capacity) in offerings.iter().zip(capacities) {
        let key = (
            capacity,
            offering.instance_type.as_str(),
            offering.zone.as_str(),
        );
        let next = next_index.entry(key).or_insert(0);
        // Every slot of the offering shares one copy of each map.
        let maps = SlotMaps {
            resources: offering.resources.clone().into(),
            allocatable: cfg
                .catalog
                .allocatable(&offering.instance_type)
                .unwrap_or_default()
                .into(),
            labels: offering.labels.clone().into(),
        };
        for _ in 0..offering.count {
            machines.push(slot(offering, capacity, *next, cfg, &maps));
            *next += 1;
        }
    }
    let capacity = if bare_metal > 0 {
        CapacityType::BareMetal
    } else {
        CapacityType::OnDemand
    };
    Ok(Inventory {
        machines,
        capacity,
        delete_supported: capacity != CapacityType::BareMetal,
    })
}

/// Checks one offering and returns its capacity class.
fn validate_offering(
    offering: &Offering,
    cfg: &InventoryConfig<'_>,
) -> Result<CapacityType, CatalogError> {
    let (instance_type, zone) = (&offering.instance_type, &offering.zone);
    let capacity = parse_capacity_type(&offering.capacity_type).map_err(|source| {
        CatalogError::OfferingCapacity {
            instance_type: instance_type.clone(),
            zone: zone.clone(),
            source: Box::new(source),
        }
    })?;
    if instance_type.is_empty() {
        return Err(CatalogError::OfferingEmptyType {
            known: cfg.catalog.known(),
        });
    }
    if cfg.catalog.get(instance_type).is_none() {
        let known = cfg.catalog.known();
        return Err(CatalogError::OfferingUnknownType {
            instance_type: instance_type.clone(),
            known,
        });
    }
    validate_placement(offering, cfg)?;
    validate_device_resources(offering, cfg)?;
    Ok(capacity)
}

/// An offering's `resources` may name a device resource (a name with a `/`) only as its
/// type's `devices` claim it: a class advertising that resource, and the type's count of it.
/// Anything else would advertise hardware no machine of the slot has.
fn validate_device_resources(
    offering: &Offering,
    cfg: &InventoryConfig<'_>,
) -> Result<(), CatalogError> {
    let classes = cfg.catalog.device_classes();
    let asks = (cfg.catalog.get(&offering.instance_type)).map(|t| &t.devices);
    for (resource, value) in &offering.resources {
        if !resource.contains('/') {
            continue;
        }
        let why = match classes.by_resource(resource) {
            None => format!(
                "no class in --device-classes advertises it (declared: {})",
                classes.known()
            ),
            Some((class, _)) => {
                let count = asks.and_then(|a| a.get(class)).copied().unwrap_or(0);
                if value.trim() == count.to_string() {
                    continue;
                }
                format!(
                    "instance type {:?} asks for {count} of class {class:?}",
                    offering.instance_type
                )
            }
        };
        return Err(CatalogError::OfferingDeviceResource {
            instance_type: offering.instance_type.clone(),
            zone: offering.zone.clone(),
            resource: resource.clone(),
            value: value.clone(),
            why,
        });
    }
    Ok(())
}

/// Checks an offering's zone, count and labels.
fn validate_placement(offering: &Offering, cfg: &InventoryConfig<'_>) -> Result<(), CatalogError> {
    let (instance_type, zone) = (&offering.instance_type, &offering.zone);
    if zone.is_empty() {
        return Err(CatalogError::OfferingEmptyZone {
            instance_type: instance_type.clone(),
        });
    }
    if zone.contains(['/', ':']) {
        let (instance_type, zone) = (instance_type.clone(), zone.clone());
        return Err(CatalogError::OfferingZoneChars {
            instance_type,
            zone,
        });
    }
    if let Some(zones) = cfg.require_zones.filter(|zones| !zones.contains(zone)) {
        let mut configured: Vec<&str> = zones.iter().map(String::as_str).collect();
        configured.sort_unstable();
        return Err(CatalogError::OfferingZoneNotConnected {
            instance_type: instance_type.clone(),
            zone: zone.clone(),
            configured: configured.join(", "),
        });
    }
    if offering.count <= 0 {
        let (instance_type, zone) = (instance_type.clone(), zone.clone());
        return Err(CatalogError::OfferingCount {
            instance_type,
            zone,
            count: offering.count,
        });
    }
    if let Some(key) = RESERVED_LABEL_KEYS
        .iter()
        .find(|key| offering.labels.contains_key(**key))
    {
        let (instance_type, zone) = (instance_type.clone(), zone.clone());
        return Err(CatalogError::OfferingReservedLabel {
            instance_type,
            zone,
            key: (*key).into(),
        });
    }
    Ok(())
}

/// The maps every slot of one offering carries.
struct SlotMaps {
    resources: SharedMap,
    allocatable: SharedMap,
    labels: SharedMap,
}

/// One Speculative slot of a validated offering.
fn slot(
    offering: &Offering,
    capacity: CapacityType,
    index: u64,
    cfg: &InventoryConfig<'_>,
    maps: &SlotMaps,
) -> Machine {
    let (instance_type, zone) = (&offering.instance_type, &offering.zone);
    let id = format_machine_id(cfg.provider, capacity, instance_type, zone, index);
    let id = MachineId::new(id).unwrap_or_else(|_| unreachable!("a slot id is never empty"));
    Machine {
        id,
        state: MachineState::Speculative,
        host: None,
        instance_type: instance_type.clone(),
        zone: zone.clone(),
        capacity_type: capacity,
        price_per_hour: cfg.prices.price(instance_type, capacity, cfg.catalog),
        interruption_probability: 0.0,
        resources: maps.resources.clone(),
        allocatable: maps.allocatable.clone(),
        labels: maps.labels.clone(),
        last_error: String::new(),
        cluster: String::new(),
        shard_metadata: StringMap::new(),
        encoded: Default::default(),
    }
}

#[cfg(test)]
#[path = "inventory_tests.rs"]
mod tests;
