//! Configuration loading: turns the operator's `--connect` list and catalog files into
//! validated values.
//!
//! What the binary reads before it can build the provider and that is not a pure catalog
//! rule lives here: the `--connect` host list and its transport security gate, reading and
//! decoding the `--instance-types` and `--offerings` files (whose contents the domain's
//! catalog then checks), and the names the provider gives the things it creates on a host. It
//! is kept apart from clap and from the environment (the binary owns both) so the simulator
//! and the tests can build the same values in code, and every refusal carries a message that
//! tells the operator which flag to fix and how.

mod catalog_files;
mod connect;
mod uri;

pub mod naming;

pub use catalog_files::{
    instance_types_from_json, load_device_classes, load_instance_types, load_offerings,
    offerings_from_json,
};
pub use connect::{HostConnection, parse_connect, validate_default_zone};
pub use uri::{query_value, redact as redact_uri};

use std::path::PathBuf;

use bigfleet_libvirt_domain::catalog::CatalogError;

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
    /// A catalog value (instance types, prices, capacity type, offerings) was refused.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
}
