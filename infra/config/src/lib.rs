//! Configuration loading: turns the operator's flags and files into validated values.
//!
//! Everything the binary reads before it can build the provider lives here: the `--connect`
//! host list and its transport security gate, the capacity class, the instance-type catalog,
//! prices, and the offerings that become the Speculative inventory. It is kept apart from clap
//! and from the environment (the binary owns both) so the simulator and the tests can build the
//! same values in code, and so every rule that decides whether the process may start sits in
//! one place with one error type whose messages tell the operator which flag to fix and how.
//!
//! Where the reference provider is lax (docs/libvirt.md §6) these loaders are strict on
//! purpose: zones are checked wherever they come from, prices must be finite, overrides must
//! name a catalog type, and slot numbering never produces two machines with the same id.

mod capacity;
mod connect;
mod instance_types;
mod inventory;
mod machine_id;
mod offerings;
mod pricing;
mod uri;

pub mod naming;

#[cfg(test)]
mod inventory_snapshots;

pub use capacity::parse_capacity_type;
pub use connect::{HostConnection, parse_connect, validate_default_zone};
pub use instance_types::{InstanceCatalog, InstanceType};
pub use inventory::{Inventory, InventoryConfig, MAX_SLOTS, RESERVED_LABEL_KEYS, build_inventory};
pub use machine_id::{ParsedId, format_machine_id, parse_machine_id};
pub use offerings::{
    DEFAULT_SEED_COUNT, FAULT_CREATE_LABEL, FAULT_CREATE_VALUE, FAULT_SLOT_COUNT, Offering,
    default_offerings, fault_offering, load_offerings, offerings_from_json,
};
pub use pricing::{DEFAULT_PER_GIB_HOUR, DEFAULT_PER_VCPU_HOUR, PriceTable, parse_prices};

use std::path::PathBuf;

/// Why a configuration value was refused. Each message names the flag or file at fault and
/// says what to change; the binary prints it as the fatal startup error.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `--default-zone` is unusable as a zone name.
    #[error("--default-zone {zone:?} {problem}; pick a plain name such as \"local\" or \"rack1\"")]
    DefaultZone {
        /// The value given.
        zone: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A `--connect` list entry is not `zone=uri`.
    #[error(
        "--connect entry {part:?} must be zone=uri; write e.g. rack1=qemu+libssh://host/system, \
         or pass a single bare URI for --default-zone"
    )]
    ConnectEntry {
        /// The offending entry (any password in it is masked).
        part: String,
    },
    /// A `--connect` zone label contains a character that would break ids and host refs.
    #[error("--connect zone {zone:?} must not contain ':' or '/'; rename the zone")]
    ConnectZone {
        /// The zone label.
        zone: String,
    },
    /// The same zone appears twice in `--connect`.
    #[error("--connect lists zone {zone:?} twice; give each libvirt host its own zone name")]
    ConnectDuplicateZone {
        /// The repeated zone.
        zone: String,
    },
    /// `--connect` was non-empty but named no host.
    #[error(
        "--connect {raw:?} parsed to no host connections; give a libvirt URI or a \
         comma-separated zone=uri list, or leave the flag empty"
    )]
    ConnectEmpty {
        /// The raw flag value.
        raw: String,
    },
    /// A `--connect` URI does not parse.
    #[error("invalid --connect URI {uri:?}: {problem}")]
    ConnectUri {
        /// The URI (any password masked).
        uri: String,
        /// What the parser disliked, with the fix.
        problem: String,
    },
    /// A `--connect` URI parses but would weaken transport security.
    #[error("--connect URI {uri:?} {problem}")]
    ConnectInsecure {
        /// The URI (any password masked).
        uri: String,
        /// The rule it breaks and how to fix it.
        problem: &'static str,
    },
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
    /// A configuration file could not be read.
    #[error("read {flag} {}: {source}", path.display())]
    Read {
        /// The flag naming the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// A configuration file is not the JSON shape its flag expects.
    #[error("parse {flag} {source_name}: {source}; expected {expected}")]
    Parse {
        /// The flag naming the file.
        flag: &'static str,
        /// The file (or other source) name.
        source_name: String,
        /// The JSON error.
        source: serde_json::Error,
        /// A short description of the expected shape.
        expected: &'static str,
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
        source: Box<ConfigError>,
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
