//! Device classes (`--device-classes`): the passthrough hardware an instance type may ask
//! for, as the operator declares it — a name, the Kubernetes resource a machine holding one
//! advertises (`nvidia.com/gpu`), and what on a host is one of them:
//!
//! - `pci`: a whole PCI device of that vendor and product id (a GPU, an NVMe drive);
//! - `mdev`: a mediated device of that type (a vGPU slice, made on its parent beforehand);
//! - `vf`: an SR-IOV virtual function of that vendor and product id (the VF's own ids).
//!
//! The file is a JSON object `name -> {"resource": ..., "pci"|"mdev"|"vf": {...}}`, decoded
//! into [`RawDeviceClass`] entries and checked by [`DeviceClasses::from_raw`]. Instance
//! types ask for a count per class (`"devices": {"a100": 1}`); docs/placement.md says how
//! hosts are set up and how the books keep one device from two machines.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::CatalogError;

const FLAG: &str = "--device-classes";

/// The most devices of one class a type may ask for.
pub const MAX_DEVICES_PER_CLASS: u32 = 16;

/// What on a host is one device of a class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSource {
    /// A whole PCI device.
    Pci {
        /// PCI vendor id.
        vendor: u16,
        /// PCI product (device) id.
        product: u16,
    },
    /// A mediated device of this type (`nvidia-63`, `i915-GVTg_V5_4`).
    Mdev {
        /// The mdev type id.
        mdev_type: String,
    },
    /// An SR-IOV virtual function with these ids, given to the guest as a NIC.
    Vf {
        /// PCI vendor id.
        vendor: u16,
        /// PCI product (device) id of the VF.
        product: u16,
        /// The 802.1Q tag the host's port sets on the VF's frames (`vf.vlan`), if any.
        vlan: Option<u16>,
    },
}

impl DeviceSource {
    /// The kind, as the file writes it.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Pci { .. } => "pci",
            Self::Mdev { .. } => "mdev",
            Self::Vf { .. } => "vf",
        }
    }
}

impl std::fmt::Display for DeviceSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pci { vendor, product } => write!(f, "pci {vendor:04x}:{product:04x}"),
            Self::Mdev { mdev_type } => write!(f, "mdev type {mdev_type}"),
            Self::Vf {
                vendor,
                product,
                vlan: None,
            } => write!(f, "vf {vendor:04x}:{product:04x}"),
            Self::Vf {
                vendor,
                product,
                vlan: Some(tag),
            } => write!(f, "vf {vendor:04x}:{product:04x} vlan {tag}"),
        }
    }
}

/// One class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceClass {
    /// The resource a machine holding one advertises, per device.
    pub resource: String,
    /// What on a host is one.
    pub source: DeviceSource,
}

/// The declared classes, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceClasses {
    classes: BTreeMap<String, DeviceClass>,
}

/// PCI ids as written: hex strings, with or without `0x`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPciIds {
    /// Vendor id.
    #[serde(default)]
    pub vendor: String,
    /// Product id.
    #[serde(default)]
    pub product: String,
}

/// An mdev type as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMdev {
    /// The type id.
    #[serde(default, rename = "type")]
    pub mdev_type: String,
}

/// One class as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDeviceClass {
    /// The advertised resource.
    #[serde(default)]
    pub resource: String,
    /// Whole-device passthrough.
    #[serde(default)]
    pub pci: Option<RawPciIds>,
    /// A mediated device type.
    #[serde(default)]
    pub mdev: Option<RawMdev>,
    /// SR-IOV virtual functions.
    #[serde(default)]
    pub vf: Option<RawVf>,
}

/// A VF class's ids as written, and its VLAN tag.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVf {
    /// Vendor id.
    #[serde(default)]
    pub vendor: String,
    /// Product id.
    #[serde(default)]
    pub product: String,
    /// The 802.1Q tag, 1 to 4094.
    #[serde(default)]
    pub vlan: Option<i64>,
}

impl DeviceClasses {
    /// Checks decoded classes (`None` for a JSON `null`); `source_name` names the file.
    ///
    /// # Errors
    /// [`CatalogError::Empty`] for `{}` or `null`, [`CatalogError::DeviceClass`] naming the
    /// class, what is wrong and the fix.
    pub fn from_raw(
        raw: Option<BTreeMap<String, RawDeviceClass>>,
        source_name: &str,
    ) -> Result<Self, CatalogError> {
        let raw = raw.unwrap_or_default();
        if raw.is_empty() {
            return Err(CatalogError::Empty {
                flag: FLAG,
                source_name: source_name.to_owned(),
                fix: "declare at least one class, or drop the flag",
            });
        }
        let mut classes = BTreeMap::new();
        let mut resources: BTreeMap<String, String> = BTreeMap::new();
        for (name, entry) in raw {
            let refuse = |problem: String| CatalogError::DeviceClass {
                source_name: source_name.to_owned(),
                name: name.clone(),
                problem,
            };
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return Err(refuse(
                    "is not a usable class name; use letters, digits, '-', '_' and '.'".to_owned(),
                ));
            }
            let class = class(&entry).map_err(refuse)?;
            if let Some(other) = resources.insert(class.resource.clone(), name.clone()) {
                return Err(CatalogError::DeviceClass {
                    source_name: source_name.to_owned(),
                    name,
                    problem: format!(
                        "advertises {:?}, as class {other:?} does; give each class its own \
                         resource, so a slot's resources say which hardware it has",
                        class.resource
                    ),
                });
            }
            classes.insert(name, class);
        }
        Ok(Self { classes })
    }

    /// The class called `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&DeviceClass> {
        self.classes.get(name)
    }

    /// Every class, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &DeviceClass)> {
        self.classes
            .iter()
            .map(|(name, class)| (name.as_str(), class))
    }

    /// Whether none are declared.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }

    /// The class advertising `resource`.
    #[must_use]
    pub fn by_resource(&self, resource: &str) -> Option<(&str, &DeviceClass)> {
        self.iter().find(|(_, class)| class.resource == resource)
    }

    /// The names, `", "`-joined, for messages (`none` when there are none).
    #[must_use]
    pub fn known(&self) -> String {
        if self.classes.is_empty() {
            return "none".to_owned();
        }
        self.classes.keys().cloned().collect::<Vec<_>>().join(", ")
    }
}

/// One entry checked: a resource name Kubernetes accepts for an extended resource, and
/// exactly one source.
fn class(entry: &RawDeviceClass) -> Result<DeviceClass, String> {
    let resource = entry.resource.trim();
    let (prefix, rest) = resource.split_once('/').unwrap_or(("", ""));
    let fine = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    };
    if !fine(prefix) || !prefix.contains('.') || !fine(rest) {
        return Err(format!(
            "resource {:?} is not an extended resource name; write a domain-prefixed name \
             such as \"nvidia.com/gpu\"",
            entry.resource
        ));
    }
    let source = match (&entry.pci, &entry.mdev, &entry.vf) {
        (Some(ids), None, None) => {
            let (vendor, product) = ids_of(ids, "pci")?;
            DeviceSource::Pci { vendor, product }
        }
        (None, Some(mdev), None) => {
            let mdev_type = mdev.mdev_type.trim();
            if !fine(mdev_type) {
                return Err(format!(
                    "mdev.type {:?} is not an mdev type id; write the type as the host lists \
                     it in /sys/class/mdev_bus/*/mdev_supported_types (e.g. \"nvidia-63\")",
                    mdev.mdev_type
                ));
            }
            DeviceSource::Mdev {
                mdev_type: mdev_type.to_owned(),
            }
        }
        (None, None, Some(vf)) => {
            let ids = RawPciIds {
                vendor: vf.vendor.clone(),
                product: vf.product.clone(),
            };
            let (vendor, product) = ids_of(&ids, "vf")?;
            let vlan = match vf.vlan {
                None => None,
                Some(tag) => Some(
                    u16::try_from(tag)
                        .ok()
                        .filter(|t| (1..=4094).contains(t))
                        .ok_or_else(|| format!("vf.vlan {tag} is not a VLAN id; use 1 to 4094"))?,
                ),
            };
            DeviceSource::Vf {
                vendor,
                product,
                vlan,
            }
        }
        _ => {
            return Err(
                "must have exactly one of \"pci\", \"mdev\" or \"vf\" saying what on a host \
                 is one device of it"
                    .to_owned(),
            );
        }
    };
    Ok(DeviceClass {
        resource: resource.to_owned(),
        source,
    })
}

/// Vendor and product ids: four hex digits each, `0x` optional.
fn ids_of(ids: &RawPciIds, kind: &str) -> Result<(u16, u16), String> {
    let hex = |field: &str, text: &str| {
        let digits = text.trim().trim_start_matches("0x");
        if digits.len() == 4 {
            if let Ok(id) = u16::from_str_radix(digits, 16) {
                return Ok(id);
            }
        }
        Err(format!(
            "{kind}.{field} {text:?} is not a PCI id; write four hex digits as lspci -nn \
             prints them (e.g. \"10de\")"
        ))
    };
    Ok((hex("vendor", &ids.vendor)?, hex("product", &ids.product)?))
}

/// An instance type's device counts as written, checked against `classes`.
///
/// # Errors
/// The class that is not declared, or a count outside 1..=[`MAX_DEVICES_PER_CLASS`].
pub fn device_counts(
    raw: &BTreeMap<String, i64>,
    source_name: &str,
    name: &str,
) -> Result<BTreeMap<String, u32>, CatalogError> {
    let mut counts = BTreeMap::new();
    for (class, count) in raw {
        let count = u32::try_from(*count)
            .ok()
            .filter(|c| (1..=MAX_DEVICES_PER_CLASS).contains(c))
            .ok_or_else(|| CatalogError::InstanceTypeField {
                source_name: source_name.to_owned(),
                name: name.to_owned(),
                field: format!("devices.{class}"),
                problem: format!(
                    "is {count}; ask for 1 to {MAX_DEVICES_PER_CLASS} devices, or leave the \
                     class out"
                ),
            })?;
        counts.insert(class.clone(), count);
    }
    Ok(counts)
}

#[cfg(test)]
#[path = "devices_tests.rs"]
mod tests;
