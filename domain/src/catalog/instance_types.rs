//! The instance-type catalog (docs/libvirt.md §3.5): the VM shapes offerings may name.
//!
//! The built-in `kvm.*` catalog covers a first run; `--instance-types` replaces it (no merge)
//! with a JSON object `name -> {"vcpu": N, "memory_mib": N}` (and optionally `disk_gib` and
//! `data_disks`, see [`DiskShape`]; `hugepages` and `dedicated_cpus`, see [`Placement`];
//! `devices`, a count per class of [`DeviceClasses`]; `tpm`, a virtual TPM 2.0;
//! `secure_boot`, UEFI Secure Boot with the firmware's enrolled keys; `boot`, how a machine
//! gets its node configuration, [`BootMode`]; `guest_agent`, whether its image runs the qemu
//! guest agent),
//! which the configuration loader
//! decodes into [`RawInstanceType`] entries and hands to [`InstanceCatalog::from_raw`]. The
//! catalog is the only source of a machine's `allocatable`, so a shape is refused unless both
//! numbers are positive, and a name is refused if it could not sit inside a machine id.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::CatalogError;
use super::devices::{DeviceClasses, device_counts};
use super::disks::{DiskShape, RawDisks};
use super::placement::{Placement, RawPlacement};
use crate::StringMap;

const FLAG: &str = "--instance-types";

/// One VM shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceType {
    /// Virtual CPUs.
    pub vcpu: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// The root disk's size and the data disks.
    pub disks: DiskShape,
    /// Huge pages and dedicated CPUs.
    pub placement: Placement,
    /// Passthrough devices: a count per device class.
    pub devices: BTreeMap<String, u32>,
    /// A virtual TPM 2.0 (`tpm`): an emulated TPM whose state lives on the host with the
    /// domain and goes with it.
    pub tpm: bool,
    /// UEFI Secure Boot (`secure_boot`): the domain boots on UEFI firmware that has the
    /// usual keys enrolled and refuses an unsigned boot loader.
    pub secure_boot: bool,
    /// How a machine of the type gets its node configuration (`boot`).
    pub boot: BootMode,
    /// Whether the type's image runs the qemu guest agent (`guest_agent`, default true). Only
    /// a first-boot type may go without: its Configure is done once the domain runs with its
    /// configuration, and its Drain asks the guest to shut down.
    pub guest_agent: bool,
}

/// How a machine gets its node configuration (docs/libvirt.md §3.5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BootMode {
    /// `agent`: the machine boots at Create; Configure runs the image's bootstrap hook with
    /// the join blob through the guest agent.
    #[default]
    Agent,
    /// `nocloud`: Create defines the machine without starting it; Configure writes the join
    /// blob as the NoCloud seed's user-data and starts it, and the guest configures itself at
    /// first boot (cloud-init, Talos).
    NoCloud,
    /// `ignition`: like `nocloud`, but Configure writes an Ignition config (the operator's
    /// template with the join blob merged in) that the guest's Ignition reads at first boot
    /// (Flatcar, Fedora CoreOS).
    Ignition,
}

impl BootMode {
    /// Reads the file's `boot` value (absent: `agent`).
    fn parse(raw: Option<&str>) -> Result<Self, String> {
        match raw {
            None | Some("agent") => Ok(Self::Agent),
            Some("nocloud") => Ok(Self::NoCloud),
            Some("ignition") => Ok(Self::Ignition),
            Some(other) => Err(format!(
                "is {other:?}; use \"agent\" (the default: Configure runs the bootstrap hook \
                 through the guest agent), \"nocloud\" (the join blob is the user-data the \
                 guest reads at its first boot) or \"ignition\" (the join blob is merged into \
                 the --ignition-template config the guest reads at its first boot)"
            )),
        }
    }

    /// Whether the guest takes its configuration at first boot (Configure starts it).
    #[must_use]
    pub fn first_boot(self) -> bool {
        self != Self::Agent
    }
}

/// A type's `boot` and `guest_agent`, checked together: only a first-boot type may go
/// without the agent.
fn boot_of(
    shape: &RawInstanceType,
    source_name: &str,
    name: &str,
) -> Result<(BootMode, bool), CatalogError> {
    let boot = BootMode::parse(shape.boot.as_deref()).map_err(|problem| {
        CatalogError::InstanceTypeField {
            source_name: source_name.to_owned(),
            name: name.to_owned(),
            field: "boot".to_owned(),
            problem,
        }
    })?;
    let guest_agent = shape.guest_agent.unwrap_or(true);
    if !guest_agent && !boot.first_boot() {
        return Err(CatalogError::InstanceTypeField {
            source_name: source_name.to_owned(),
            name: name.to_owned(),
            field: "guest_agent".to_owned(),
            problem: "is false, but only a type that boots by \"nocloud\" or \
                      \"ignition\" can go without the agent (the \"agent\" boot runs \
                      its bootstrap hook through it); set \"boot\" or drop \
                      \"guest_agent\""
                .to_owned(),
        });
    }
    Ok((boot, guest_agent))
}

/// Instance types by name, in name order, and the device classes they may ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceCatalog {
    types: BTreeMap<String, InstanceType>,
    classes: DeviceClasses,
}

/// The file's per-type entry, as decoded and not yet checked. Missing numbers default to 0 so
/// they fail the positivity check with the operator-facing message rather than a bare serde
/// error.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct RawInstanceType {
    /// Virtual CPUs as written.
    #[serde(default)]
    pub vcpu: i64,
    /// Memory in MiB as written.
    #[serde(default)]
    pub memory_mib: i64,
    /// The disk fields as written.
    #[serde(flatten)]
    pub disks: RawDisks,
    /// The placement fields as written.
    #[serde(flatten)]
    pub placement: RawPlacement,
    /// Device counts by class, as written.
    #[serde(default)]
    pub devices: BTreeMap<String, i64>,
    /// Whether the type has a virtual TPM.
    #[serde(default)]
    pub tpm: bool,
    /// Whether the type boots with UEFI Secure Boot.
    #[serde(default)]
    pub secure_boot: bool,
    /// The boot mode as written (`agent`, `nocloud`).
    #[serde(default)]
    pub boot: Option<String>,
    /// Whether the image runs the qemu guest agent, as written (absent: it does).
    #[serde(default)]
    pub guest_agent: Option<bool>,
}

impl InstanceCatalog {
    /// The built-in catalog: `kvm.small` 2/4096/40, `kvm.medium` 4/8192/80, `kvm.large`
    /// 8/16384/160, `kvm.xlarge` 16/32768/320 (vCPU/MiB/root GiB), no data disks.
    #[must_use]
    pub fn builtin() -> Self {
        let shapes = [
            ("kvm.small", 2, 4096, 40),
            ("kvm.medium", 4, 8192, 80),
            ("kvm.large", 8, 16384, 160),
            ("kvm.xlarge", 16, 32768, 320),
        ];
        let types = shapes
            .into_iter()
            .map(|(name, vcpu, memory_mib, root_gib)| {
                let disks = DiskShape {
                    root_gib: Some(root_gib),
                    data: Vec::new(),
                };
                let shape = InstanceType {
                    vcpu,
                    memory_mib,
                    disks,
                    placement: Placement::default(),
                    devices: BTreeMap::new(),
                    tpm: false,
                    secure_boot: false,
                    boot: BootMode::Agent,
                    guest_agent: true,
                };
                (name.to_owned(), shape)
            })
            .collect();
        Self {
            types,
            classes: DeviceClasses::default(),
        }
    }

    /// Checks a decoded catalog (`None` for a JSON `null`); `source_name` names the file in
    /// errors.
    ///
    /// # Errors
    /// [`CatalogError::Empty`] for `{}` or `null`, [`CatalogError::InstanceTypeName`] for an
    /// empty name or one containing `/`, [`CatalogError::InstanceTypeShape`] for a
    /// non-positive (or, for vCPU, oversized) shape, [`CatalogError::InstanceTypeField`] for
    /// a disk size or name that cannot be used.
    pub fn from_raw(
        raw: Option<BTreeMap<String, RawInstanceType>>,
        source_name: &str,
    ) -> Result<Self, CatalogError> {
        let raw = raw.unwrap_or_default();
        if raw.is_empty() {
            return Err(CatalogError::Empty {
                flag: FLAG,
                source_name: source_name.to_owned(),
                fix: "define at least one type, or drop the flag for the built-in kvm.* catalog",
            });
        }
        let mut types = BTreeMap::new();
        for (name, shape) in raw {
            let name_error = || CatalogError::InstanceTypeName {
                source_name: source_name.to_owned(),
                name: name.clone(),
            };
            if name.is_empty() || name.contains('/') {
                return Err(name_error());
            }
            let vcpu = u32::try_from(shape.vcpu).ok().filter(|v| *v > 0);
            let memory_mib = u64::try_from(shape.memory_mib).ok().filter(|m| *m > 0);
            let (Some(vcpu), Some(memory_mib)) = (vcpu, memory_mib) else {
                return Err(CatalogError::InstanceTypeShape {
                    source_name: source_name.to_owned(),
                    name,
                });
            };
            let disks = DiskShape::from_raw(&shape.disks, source_name, &name)?;
            let placement = Placement::from_raw(&shape.placement, memory_mib, source_name, &name)?;
            let devices = device_counts(&shape.devices, source_name, &name)?;
            let (boot, guest_agent) = boot_of(&shape, source_name, &name)?;
            let shape = InstanceType {
                vcpu,
                memory_mib,
                disks,
                placement,
                devices,
                tpm: shape.tpm,
                secure_boot: shape.secure_boot,
                boot,
                guest_agent,
            };
            types.insert(name, shape);
        }
        Ok(Self {
            types,
            classes: DeviceClasses::default(),
        })
    }

    /// The catalog with `classes` (`--device-classes`; empty without the flag): every class a
    /// type asks for must be declared there.
    ///
    /// # Errors
    /// [`CatalogError::UnknownDeviceClass`] naming the type and the class.
    pub fn with_device_classes(mut self, classes: DeviceClasses) -> Result<Self, CatalogError> {
        for (name, shape) in &self.types {
            if let Some(class) = shape.devices.keys().find(|c| classes.get(c).is_none()) {
                return Err(CatalogError::UnknownDeviceClass {
                    instance_type: name.clone(),
                    class: class.clone(),
                    known: classes.known(),
                });
            }
        }
        self.classes = classes;
        Ok(self)
    }

    /// The device classes.
    #[must_use]
    pub fn device_classes(&self) -> &DeviceClasses {
        &self.classes
    }

    /// Whether any type asks for passthrough devices.
    #[must_use]
    pub fn asks_devices(&self) -> bool {
        self.types.values().any(|shape| !shape.devices.is_empty())
    }

    /// Whether machines of type `name` take their configuration at first boot (an unknown
    /// type does not).
    #[must_use]
    pub fn boots_first(&self, name: &str) -> bool {
        self.get(name).is_some_and(|t| t.boot.first_boot())
    }

    /// Whether machines of type `name` run the qemu guest agent (an unknown type does).
    #[must_use]
    pub fn has_agent(&self, name: &str) -> bool {
        self.get(name).is_none_or(|t| t.guest_agent)
    }

    /// The names of the types that boot by `mode`, in name order.
    #[must_use]
    pub fn booting(&self, mode: BootMode) -> Vec<&str> {
        (self.types.iter())
            .filter(|(_, shape)| shape.boot == mode)
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// The shape called `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&InstanceType> {
        self.types.get(name)
    }

    /// Every type and its shape, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &InstanceType)> {
        self.types
            .iter()
            .map(|(name, shape)| (name.as_str(), shape))
    }

    /// The type names, sorted.
    #[must_use]
    pub fn names(&self) -> Vec<&str> {
        self.types.keys().map(String::as_str).collect()
    }

    /// The names sorted and `", "`-joined, for error messages.
    pub(super) fn known(&self) -> String {
        self.names().join(", ")
    }

    /// The machine's `allocatable` for type `name`: `cpu` as the vCPU count and `memory` in
    /// `Gi` when the MiB count is a whole number of GiB, else in `Mi`, and each device
    /// class's resource with its count. `None` for an unknown type.
    #[must_use]
    pub fn allocatable(&self, name: &str) -> Option<StringMap> {
        let shape = self.get(name)?;
        let memory = if shape.memory_mib % 1024 == 0 {
            format!("{}Gi", shape.memory_mib / 1024)
        } else {
            format!("{}Mi", shape.memory_mib)
        };
        let mut map = StringMap::from([
            ("cpu".to_owned(), shape.vcpu.to_string()),
            ("memory".to_owned(), memory),
        ]);
        for (class, count) in &shape.devices {
            if let Some(class) = self.classes.get(class) {
                map.insert(class.resource.clone(), count.to_string());
            }
        }
        Some(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `text` as the configuration loader does, then checks it.
    fn from_json(text: &str, source_name: &str) -> Result<InstanceCatalog, CatalogError> {
        InstanceCatalog::from_raw(serde_json::from_str(text).unwrap(), source_name)
    }

    fn err(text: &str) -> String {
        from_json(text, "types.json").unwrap_err().to_string()
    }

    #[test]
    fn builtin_catalog_shapes_and_sorted_names() {
        let catalog = InstanceCatalog::builtin();
        assert_eq!(
            catalog.names(),
            ["kvm.large", "kvm.medium", "kvm.small", "kvm.xlarge"]
        );
        let shape = |vcpu, memory_mib, root_gib| InstanceType {
            vcpu,
            memory_mib,
            disks: DiskShape {
                root_gib: Some(root_gib),
                data: Vec::new(),
            },
            placement: Placement::default(),
            devices: BTreeMap::new(),
            tpm: false,
            secure_boot: false,
            boot: BootMode::Agent,
            guest_agent: true,
        };
        assert_eq!(catalog.get("kvm.small"), Some(&shape(2, 4096, 40)));
        assert_eq!(catalog.get("kvm.medium"), Some(&shape(4, 8192, 80)));
        assert_eq!(catalog.get("kvm.large"), Some(&shape(8, 16384, 160)));
        assert_eq!(catalog.get("kvm.xlarge"), Some(&shape(16, 32768, 320)));
        assert_eq!(catalog.get("kvm.huge"), None);
    }

    #[test]
    fn allocatable_uses_gi_for_whole_gib_and_mi_otherwise() {
        let catalog = InstanceCatalog::builtin();
        let map = |cpu: &str, mem: &str| {
            Some(StringMap::from([
                ("cpu".into(), cpu.into()),
                ("memory".into(), mem.into()),
            ]))
        };
        assert_eq!(catalog.allocatable("kvm.large"), map("8", "16Gi"));
        assert_eq!(catalog.allocatable("kvm.small"), map("2", "4Gi"));
        assert_eq!(catalog.allocatable("kvm.xlarge"), map("16", "32Gi"));
        assert_eq!(catalog.allocatable("nope"), None);
        let odd = from_json(r#"{"odd": {"vcpu": 3, "memory_mib": 1536}}"#, "t").unwrap();
        assert_eq!(odd.allocatable("odd"), map("3", "1536Mi"));
    }

    #[test]
    fn file_replaces_the_catalog_and_ignores_unknown_keys() {
        let text = r#"{"b.big": {"vcpu": 32, "memory_mib": 65536, "gpu": "none"},
                       "a.tiny": {"vcpu": 1, "memory_mib": 512}}"#;
        let catalog = from_json(text, "t").unwrap();
        assert_eq!(catalog.names(), ["a.tiny", "b.big"]);
        assert_eq!(catalog.get("kvm.small"), None);
        assert_eq!(catalog.get("a.tiny").unwrap().disks, DiskShape::default());
    }

    #[test]
    fn disks_are_read_and_checked_per_type() {
        let text = r#"{"d.disks": {"vcpu": 1, "memory_mib": 512, "disk_gib": 20,
                        "data_disks": [{"size_gib": 2}, {"name": "logs", "size_gib": 3}]}}"#;
        let disks = from_json(text, "t")
            .unwrap()
            .get("d.disks")
            .unwrap()
            .disks
            .clone();
        assert_eq!(disks.root_gib, Some(20));
        assert_eq!(disks.data.len(), 2);
        assert_eq!(disks.data[1].name, "logs");
        let msg = err(r#"{"d.bad": {"vcpu": 1, "memory_mib": 512, "disk_gib": 0}}"#);
        assert!(
            msg.starts_with("--instance-types types.json: \"d.bad\" disk_gib is 0"),
            "{msg}"
        );
    }

    #[test]
    fn a_type_asks_for_a_tpm_and_secure_boot_by_their_fields() {
        let text = r#"{"t.tpm": {"vcpu": 1, "memory_mib": 512, "tpm": true},
                       "t.sb": {"vcpu": 1, "memory_mib": 512, "secure_boot": true},
                       "t.plain": {"vcpu": 1, "memory_mib": 512}}"#;
        let catalog = from_json(text, "t").unwrap();
        let asks = |name: &str| {
            let shape = catalog.get(name).unwrap();
            (shape.tpm, shape.secure_boot)
        };
        assert_eq!(asks("t.tpm"), (true, false));
        assert_eq!(asks("t.sb"), (false, true));
        assert_eq!(asks("t.plain"), (false, false), "off unless asked");
        let builtin = InstanceCatalog::builtin();
        assert!(!builtin.iter().any(|(_, t)| t.tpm || t.secure_boot));
    }

    #[test]
    fn a_type_boots_by_the_agent_unless_it_asks_for_a_first_boot() {
        let text = r#"{"t.nc": {"vcpu": 1, "memory_mib": 512, "boot": "nocloud"},
                       "t.ign": {"vcpu": 1, "memory_mib": 512, "boot": "ignition"},
                       "t.agent": {"vcpu": 1, "memory_mib": 512, "boot": "agent"},
                       "t.plain": {"vcpu": 1, "memory_mib": 512}}"#;
        let catalog = from_json(text, "t").unwrap();
        assert_eq!(catalog.get("t.nc").unwrap().boot, BootMode::NoCloud);
        assert!(catalog.get("t.nc").unwrap().boot.first_boot());
        assert_eq!(catalog.get("t.agent").unwrap().boot, BootMode::Agent);
        assert_eq!(catalog.get("t.plain").unwrap().boot, BootMode::Agent);
        assert_eq!(catalog.get("t.ign").unwrap().boot, BootMode::Ignition);
        assert!(catalog.boots_first("t.ign") && !catalog.boots_first("t.plain"));
        assert_eq!(catalog.booting(BootMode::Ignition), ["t.ign"]);
        assert_eq!(catalog.booting(BootMode::Agent), ["t.agent", "t.plain"]);
        let bad = r#"{"t.x": {"vcpu": 1, "memory_mib": 512, "boot": "talos"}}"#;
        let error = from_json(bad, "types.json").unwrap_err().to_string();
        assert!(
            error.contains("\"t.x\" boot is \"talos\"; use \"agent\"")
                && error.contains("\"ignition\""),
            "{error}"
        );
    }

    #[test]
    fn only_a_first_boot_type_may_go_without_the_guest_agent() {
        let text = r#"{"t.bare": {"vcpu": 1, "memory_mib": 512, "boot": "nocloud",
                                  "guest_agent": false},
                       "t.nc": {"vcpu": 1, "memory_mib": 512, "boot": "nocloud"}}"#;
        let catalog = from_json(text, "t").unwrap();
        assert!(!catalog.has_agent("t.bare"));
        assert!(catalog.has_agent("t.nc"), "on unless refused");
        assert!(
            InstanceCatalog::builtin()
                .iter()
                .all(|(_, t)| t.guest_agent)
        );
        let bad = r#"{"t.x": {"vcpu": 1, "memory_mib": 512, "guest_agent": false}}"#;
        let error = from_json(bad, "types.json").unwrap_err().to_string();
        assert!(
            error.contains("\"t.x\" guest_agent is false, but only a type that boots by"),
            "{error}"
        );
    }

    #[test]
    fn empty_catalogs_are_refused() {
        for text in ["{}", "null"] {
            assert!(
                err(text).starts_with("--instance-types types.json is empty; "),
                "{text}"
            );
        }
    }

    #[test]
    fn non_positive_or_missing_shapes_are_refused() {
        for entry in [
            r#"{"vcpu": 0, "memory_mib": 1024}"#,
            r#"{"vcpu": 2, "memory_mib": -1}"#,
            r#"{"vcpu": 2}"#,
            r#"{"memory_mib": 2048}"#,
            r#"{"vcpu": 4294967296, "memory_mib": 2048}"#,
        ] {
            let msg = err(&format!(r#"{{"k.bad": {entry}}}"#));
            let want = "--instance-types types.json: \"k.bad\" must have positive vcpu and \
                        memory_mib";
            assert!(msg.starts_with(want), "{entry}: {msg}");
        }
    }

    #[test]
    fn names_that_break_machine_ids_are_refused() {
        for name in ["a/b", ""] {
            let msg = err(&format!(
                r#"{{"{name}": {{"vcpu": 1, "memory_mib": 1024}}}}"#
            ));
            assert!(msg.contains("must not contain '/'"), "{msg}");
            assert!(
                msg.starts_with("--instance-types types.json: name"),
                "{msg}"
            );
        }
    }
}
