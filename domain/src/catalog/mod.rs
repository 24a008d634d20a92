//! The catalog: what the provider offers, as pure values and rules.
//!
//! Instance types (the VM shapes), prices, the capacity class, offerings (instance type ×
//! zone × count, with the built-in defaults) and the Speculative inventory they expand into,
//! with the slot ids that name every machine. Nothing here reads a file or decodes JSON: the
//! configuration loader hands over decoded values ([`RawInstanceType`] maps and
//! [`Offering`] lists, both `Deserialize`), and the rules that decide whether they are usable
//! live here, with one error type whose messages tell the operator which flag to fix and how.
//!
//! Where the reference provider is lax (docs/libvirt.md §6) these rules are strict on
//! purpose: zones are checked wherever they come from, prices must be finite, overrides must
//! name a catalog type, and slot numbering never produces two machines with the same id.

mod capacity;
mod devices;
mod disks;
mod instance_types;
mod inventory;
mod machine_id;
mod offerings;
mod placement;
mod pricing;

#[cfg(test)]
mod inventory_snapshots;

pub use capacity::parse_capacity_type;
pub use devices::{
    DeviceClass, DeviceClasses, DeviceSource, MAX_DEVICES_PER_CLASS, RawDeviceClass, RawMdev,
    RawPciIds,
};
pub use disks::{
    DataDisk, DiskShape, MAX_DATA_DISKS, MAX_DISK_GIB, MAX_DISK_NAME, RawDataDisk, RawDisks,
    gib_bytes,
};
pub use instance_types::{BootMode, InstanceCatalog, InstanceType, RawInstanceType};
pub use inventory::{Inventory, InventoryConfig, MAX_SLOTS, RESERVED_LABEL_KEYS, build_inventory};
pub use machine_id::{ParsedId, format_machine_id, parse_machine_id};
pub use offerings::{
    DEFAULT_SEED_COUNT, FAULT_CREATE_LABEL, FAULT_CREATE_VALUE, FAULT_SLOT_COUNT, Offering,
    default_offerings, fault_offering, offerings_from_raw,
};
pub use placement::{Placement, RawPlacement, page_kib, page_name};
pub use pricing::{DEFAULT_PER_GIB_HOUR, DEFAULT_PER_VCPU_HOUR, PriceTable, parse_prices};

/// Why a catalog value was refused. Each message names the flag or file at fault and says
/// what to change; the binary prints it as the fatal startup error.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// A capacity type the libvirt provider cannot honour, or does not know.
    #[error(
        "capacity_type {raw:?} {problem}; use on_demand or bare_metal \
         (in --capacity-type or the offering's capacity_type)"
    )]
    Capacity {
        /// The value given.
        raw: String,
        /// Why it is refused.
        problem: &'static str,
    },
    /// A configuration file parsed to nothing.
    #[error("{flag} {source_name} is empty; {fix}")]
    Empty {
        /// The flag naming the file.
        flag: &'static str,
        /// The file (or other source) name.
        source_name: String,
        /// What to put in it.
        fix: &'static str,
    },
    /// An instance type with a zero, negative or oversized shape.
    #[error(
        "--instance-types {source_name}: {name:?} must have positive vcpu and memory_mib \
         (vcpu at most {max_vcpu}); fix the entry",
        max_vcpu = u32::MAX
    )]
    InstanceTypeShape {
        /// The file name.
        source_name: String,
        /// The instance type.
        name: String,
    },
    /// An instance type field that cannot be used (a disk's size or name, a huge page size).
    #[error("--instance-types {source_name}: {name:?} {field} {problem}")]
    InstanceTypeField {
        /// The file name.
        source_name: String,
        /// The instance type.
        name: String,
        /// The field at fault (`disk_gib`, `data_disks[1].size_gib`, …).
        field: String,
        /// What is wrong with it and how to fix it.
        problem: String,
    },
    /// A device class that cannot be used.
    #[error("--device-classes {source_name}: class {name:?} {problem}")]
    DeviceClass {
        /// The file name.
        source_name: String,
        /// The class.
        name: String,
        /// What is wrong with it and how to fix it.
        problem: String,
    },
    /// An instance type asking for a class `--device-classes` does not declare.
    #[error(
        "--instance-types: {instance_type:?} asks for devices of class {class:?}, which \
         --device-classes does not declare (declared: {known}); declare the class or fix the name"
    )]
    UnknownDeviceClass {
        /// The instance type.
        instance_type: String,
        /// The class it names.
        class: String,
        /// The declared classes.
        known: String,
    },
    /// An offering advertising a device resource its machines would not have.
    #[error(
        "offering {instance_type}/{zone}: resources name {resource:?} = {value:?}, but {why}; \
         a slot may advertise a device only as its instance type's \"devices\" claim it"
    )]
    OfferingDeviceResource {
        /// The offering's instance type.
        instance_type: String,
        /// The offering's zone.
        zone: String,
        /// The resource named.
        resource: String,
        /// The value given.
        value: String,
        /// Why it cannot be backed.
        why: String,
    },
    /// An instance type name that cannot appear inside a machine id.
    #[error(
        "--instance-types {source_name}: name {name:?} must be non-empty and must not \
         contain '/' (it is a machine id component); rename the type"
    )]
    InstanceTypeName {
        /// The file name.
        source_name: String,
        /// The instance type.
        name: String,
    },
    /// A `--prices` entry without `=`.
    #[error("--prices entry {part:?} must be type=usd, e.g. kvm.small=0.01")]
    PriceEntry {
        /// The offending entry.
        part: String,
    },
    /// A `--prices` entry whose value is not a usable price.
    #[error("--prices entry {part:?}: bad price, {problem}")]
    PriceValue {
        /// The offending entry.
        part: String,
        /// What is wrong and how to fix it.
        problem: &'static str,
    },
    /// A `--prices` override for a type the catalog does not have.
    #[error(
        "--prices names instance type {name:?}, which is not in the instance-type catalog \
         (known types: {known}); fix the name or add the type to --instance-types"
    )]
    PriceUnknownType {
        /// The unknown name.
        name: String,
        /// The catalog's names, sorted and ", "-joined.
        known: String,
    },
    /// A synthetic price rate that is negative or not finite.
    #[error("{flag} must be a finite number >= 0 (got {value}); 0 makes that part free")]
    PriceRate {
        /// The rate flag.
        flag: &'static str,
        /// The value given.
        value: f64,
    },
    /// An offering's capacity type is refused.
    #[error("offering {instance_type}/{zone}: {source}")]
    OfferingCapacity {
        /// The offering's instance type.
        instance_type: String,
        /// The offering's zone.
        zone: String,
        /// The capacity error.
        source: Box<CatalogError>,
    },
    /// An offering without an instance type.
    #[error("offering with empty instance_type; set it to a catalog name (known types: {known})")]
    OfferingEmptyType {
        /// The catalog's names.
        known: String,
    },
    /// An offering whose instance type is not in the catalog.
    #[error(
        "offering instance_type {instance_type:?} is not in the instance-type catalog \
         (known types: {known}); fix the offering or add the type to --instance-types"
    )]
    OfferingUnknownType {
        /// The unknown type.
        instance_type: String,
        /// The catalog's names.
        known: String,
    },
    /// An offering without a zone.
    #[error("offering {instance_type} with empty zone (libvirt host); set zone")]
    OfferingEmptyZone {
        /// The offering's instance type.
        instance_type: String,
    },
    /// An offering whose zone would break machine ids or host refs.
    #[error("offering {instance_type} zone {zone:?} must not contain ':' or '/'; rename it")]
    OfferingZoneChars {
        /// The offering's instance type.
        instance_type: String,
        /// The zone.
        zone: String,
    },
    /// With the real backend, an offering on a zone that has no `--connect` host.
    #[error(
        "offering {instance_type} is placed on zone {zone:?}, which has no --connect host \
         (configured zones: {configured}); add {zone}=<uri> to --connect or move the offering"
    )]
    OfferingZoneNotConnected {
        /// The offering's instance type.
        instance_type: String,
        /// The zone.
        zone: String,
        /// The configured zones, sorted and ", "-joined.
        configured: String,
    },
    /// An offering with `count <= 0`.
    #[error(
        "offering {instance_type}/{zone} has non-positive count {count}; set count to 1 or \
         more, or remove the offering"
    )]
    OfferingCount {
        /// The offering's instance type.
        instance_type: String,
        /// The offering's zone.
        zone: String,
        /// The count given.
        count: i64,
    },
    /// An offering label that duplicates a top-level machine field.
    #[error(
        "offering {instance_type}/{zone}: label {key:?} is reserved; instance type, zone and \
         capacity type are top-level fields (instance_type, zone, capacity_type), so remove \
         the label"
    )]
    OfferingReservedLabel {
        /// The offering's instance type.
        instance_type: String,
        /// The offering's zone.
        zone: String,
        /// The reserved key.
        key: String,
    },
    /// Bare-metal and deletable offerings in one provider.
    #[error(
        "offerings mix bare_metal with deletable (on_demand/reserved) capacity; run one \
         provider instance per capacity class"
    )]
    MixedCapacity,
    /// The offerings add up to more slots than one provider will hold.
    #[error(
        "offerings ask for more than {max} slots in total; lower the counts or --seed-count",
        max = MAX_SLOTS
    )]
    TooManySlots,
    /// No offerings at all.
    #[error("no offerings configured; pass --offerings or a positive --seed-count")]
    NoOfferings,
}
