//! What one domain looks like, as one plain value: [`DomainSpec`]. Everything that decides
//! the domain's documents is in it (the slot's instance type, shape, machine id and
//! incarnation; the operator's CPU, NICs, accelerator, boot, firmware, seed bus and
//! user-data; the volumes and the base image facts the host gave; where it sits on the
//! host's CPUs and huge pages, as the host's ledger granted), it is built in one place
//! ([`DomainSpec::new`], from the operator's [`Choices`], the [`Slot`] and the host's
//! [`Base`]), and `render::xml` and `render::seed` turn it into documents without reading
//! configuration. A new shape of domain is a field here, its rendering, and its snapshot
//! (`render/spec_tests.rs`).
//!
//! The volumes' names are decided here too ([`overlay_name`], [`seed_name`],
//! [`data_name`]): they derive from the domain name alone (and a data disk's own name), so
//! the volumes can be found, and collected, from it.

use std::sync::Arc;

use bigfleet_libvirt_config::naming::domain_name;
use bigfleet_libvirt_domain::catalog::{DiskShape, gib_bytes};

use crate::options::{CpuChoice, DomainConfig, IgnitionDelivery, Platform, StaticAddress};
use crate::render::devices::{MacBook, Nic};
use crate::render::ownership::Tag;
use crate::render::placement::Placed;
use crate::render::rbd::RbdSource;
use crate::render::seed;

/// Everything that decides what one domain looks like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainSpec {
    /// The domain name (the provider label and the machine id).
    pub name: String,
    /// The ownership tag in `<metadata>` (provider label and machine id; no cluster yet).
    pub tag: Tag,
    /// The slot's instance type.
    pub instance_type: String,
    /// This incarnation of the slot: the cloud-init `instance-id` (the domain name and the
    /// Create's operation id).
    pub instance_id: String,
    /// Virtual CPUs.
    pub vcpu: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Where its vCPUs and memory sit on the host: dedicated CPUs, the CPUs shared machines
    /// keep to, huge pages. Decided with the host's ledger when the Create reserves
    /// (`service::lifecycle` sets it); the default places nothing.
    pub placed: Placed,
    /// The guest CPU; `None` is the platform's default (`host-passthrough` on KVM, QEMU's
    /// own model under TCG).
    pub cpu: Option<CpuChoice>,
    /// The NICs, in order, each with its derived MAC address (none: no NIC).
    pub nics: Vec<Nic>,
    /// The first NIC's fixed address, when a static address pool serves the slot (the seed
    /// then carries a `network-config`); `None`: DHCP.
    pub address: Option<StaticAddress>,
    /// Accelerator, boot method, firmware and the seed's bus.
    pub platform: Platform,
    /// The overlay, seed and data volumes, and the base image the overlay stands on.
    pub disks: Disks,
    /// The cloud-init user-data, verbatim.
    pub user_data: Arc<[u8]>,
    /// A virtual TPM 2.0 (the instance type's `tpm`), emulated on the host by swtpm.
    pub tpm: bool,
    /// UEFI Secure Boot with enrolled keys (the instance type's `secure_boot`), whatever
    /// the platform's firmware choice.
    pub secure_boot: bool,
}

/// A domain's volumes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disks {
    /// The root volume's name: the qcow2 overlay ([`overlay_name`]) on a local pool, the
    /// copy-on-write clone ([`rbd_root_name`]) on an rbd pool.
    pub overlay: String,
    /// The NoCloud seed's volume name.
    pub seed: String,
    /// The serial console's log: a file beside the seed that virtlogd writes
    /// ([`console_name`]).
    pub console: String,
    /// What the root is made from, as the host reported it.
    pub base: Base,
    /// The data disks, in the order the guest gets them.
    pub data: Vec<DataVolume>,
    /// The Ignition config's volume, beside the seed, for a type that boots by Ignition.
    pub ignition: Option<IgnitionDisk>,
}

/// A domain's Ignition config: a volume in the seed pool ([`ignition_name`]) and how the
/// guest gets it (the file as a firmware configuration entry, or the volume as a config
/// drive).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IgnitionDisk {
    /// The volume's name.
    pub volume: String,
    /// How the guest reads it.
    pub delivery: IgnitionDelivery,
}

/// One data disk: a thin volume of its own (qcow2 on a local pool, a raw image on an rbd
/// pool), found by the guest by its serial.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataVolume {
    /// The volume's name ([`data_name`]).
    pub volume: String,
    /// The serial the guest sees (`/dev/disk/by-id/virtio-<serial>`): the disk's name.
    pub serial: String,
    /// Its virtual size in bytes.
    pub bytes: u64,
}

/// The host's facts about the base image (`--image`) a root is made from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Base {
    /// The base volume's path on the host (on an rbd pool: `<ceph pool>/<image>`).
    pub path: String,
    /// Its format (`qcow2`, `raw`).
    pub format: String,
    /// The root's virtual size in bytes.
    pub overlay_bytes: u64,
    /// The rbd pool's cluster when `--storage-pool` is an rbd pool (roots are clones of the
    /// base and every disk but the seed is an RBD image); `None` on a local pool.
    pub rbd: Option<RbdSource>,
}

/// Where libvirt placed a domain's volumes (known once they exist).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumePaths<'a> {
    /// The overlay's path on the host.
    pub overlay: &'a str,
    /// The seed's path on the host.
    pub seed: &'a str,
    /// The console log's path on the host (`None`: the console is not kept).
    pub console: Option<&'a str>,
    /// The data disks' paths, in the spec's order.
    pub data: &'a [String],
    /// The Ignition config's path on the host (a type that boots by Ignition).
    pub ignition: Option<&'a str>,
}

/// The operator's side of every domain.
#[derive(Clone, Copy, Debug)]
pub struct Choices<'a> {
    /// The provider label.
    pub provider: &'a str,
    /// The libvirt flags.
    pub options: &'a DomainConfig,
    /// The MAC address of every NIC of every configured slot.
    pub macs: &'a MacBook,
    /// The cloud-init user-data.
    pub user_data: &'a Arc<[u8]>,
}

/// The slot's side of one domain.
#[derive(Clone, Copy, Debug)]
pub struct Slot<'a> {
    /// The machine id.
    pub machine_id: &'a str,
    /// Its instance type.
    pub instance_type: &'a str,
    /// The Create's operation id (this incarnation).
    pub operation_id: &'a str,
    /// Virtual CPUs of the instance type.
    pub vcpu: u32,
    /// Memory of the instance type, in MiB.
    pub memory_mib: u64,
    /// The instance type's disks.
    pub disks: &'a DiskShape,
    /// Whether the instance type has a virtual TPM.
    pub tpm: bool,
    /// Whether the instance type boots with UEFI Secure Boot.
    pub secure_boot: bool,
    /// Whether the instance type boots by Ignition (its config goes with the domain).
    pub ignition: bool,
}

impl DomainSpec {
    /// The one place a domain's spec is decided: `slot` as the operator's `choices` make
    /// it, on a host whose base image is `base`.
    #[must_use]
    pub fn new(choices: &Choices<'_>, slot: &Slot<'_>, base: Base) -> Self {
        let name = domain_name(choices.provider, slot.machine_id);
        let options = choices.options;
        let address = options.addresses.get(slot.machine_id).cloned();
        let nics = nics(options, choices.macs, slot.machine_id, slot.instance_type);
        Self {
            tag: Tag::new(choices.provider, slot.machine_id),
            instance_type: slot.instance_type.to_owned(),
            instance_id: seed::instance_id(&name, slot.operation_id),
            vcpu: slot.vcpu,
            memory_mib: slot.memory_mib,
            placed: Placed::default(),
            cpu: options.cpu_for(slot.instance_type).cloned(),
            nics,
            address,
            platform: options.platform.clone(),
            disks: Disks {
                overlay: root_name(&name, base.rbd.is_some()),
                seed: seed_name(&name),
                console: console_name(&name),
                data: data_volumes(&name, slot.disks, base.rbd.is_some()),
                ignition: (options.ignition.as_ref())
                    .filter(|_| slot.ignition)
                    .map(|setup| IgnitionDisk {
                        volume: ignition_name(&name),
                        delivery: setup.delivery,
                    }),
                base,
            },
            user_data: Arc::clone(choices.user_data),
            tpm: slot.tpm,
            secure_boot: slot.secure_boot,
            name,
        }
    }
}

/// The NICs of `machine_id` (of `instance_type`) as `options` and `macs` make them: each
/// source with its derived MAC, the first tagged with its address pool's VLAN.
#[must_use]
pub fn nics(
    options: &DomainConfig,
    macs: &MacBook,
    machine_id: &str,
    instance_type: &str,
) -> Vec<Nic> {
    let vlan = (options.addresses.get(machine_id)).and_then(|a| a.subnet.vlan);
    (options.nic_sources(instance_type).into_iter().enumerate())
        .map(|(index, source)| Nic {
            source,
            mac: macs.mac(machine_id, index),
            vlan: vlan.filter(|_| index == 0),
        })
        .collect()
}

/// The data volumes of domain `name` for `disks` (`rbd`: in an rbd pool).
#[must_use]
pub fn data_volumes(name: &str, disks: &DiskShape, rbd: bool) -> Vec<DataVolume> {
    (disks.data.iter())
        .map(|disk| DataVolume {
            volume: if rbd {
                rbd_data_name(name, &disk.name)
            } else {
                data_name(name, &disk.name)
            },
            serial: disk.name.clone(),
            bytes: gib_bytes(disk.size_gib),
        })
        .collect()
}

/// The overlay volume's name for a domain.
#[must_use]
pub fn overlay_name(domain: &str) -> String {
    format!("{domain}-overlay.qcow2")
}

/// The root volume's name for a domain: its overlay, or (`rbd`) its clone.
#[must_use]
pub fn root_name(domain: &str, rbd: bool) -> String {
    if rbd {
        rbd_root_name(domain)
    } else {
        overlay_name(domain)
    }
}

/// The RBD image name of a domain's root (a clone of the golden image: raw, no extension).
#[must_use]
pub fn rbd_root_name(domain: &str) -> String {
    format!("{domain}-root")
}

/// The RBD image name of data disk `disk` of a domain.
#[must_use]
pub fn rbd_data_name(domain: &str, disk: &str) -> String {
    format!("{domain}-data-{disk}")
}

/// The seed volume's name for a domain.
#[must_use]
pub fn seed_name(domain: &str) -> String {
    format!("{domain}-cidata.iso")
}

/// The Ignition config's volume name for a domain (a JSON file, or a config drive ISO).
#[must_use]
pub fn ignition_name(domain: &str) -> String {
    format!("{domain}-ignition")
}

/// The console log's volume name for a domain. virtlogd keeps at most its configured
/// number of older files beside it (`-console.log.0`, `.1`, …), which [`owner_of`] knows
/// too.
#[must_use]
pub fn console_name(domain: &str) -> String {
    format!("{domain}-console.log")
}

/// The volume name of data disk `disk` of a domain (`disk` is lower-case letters and digits,
/// as the catalog checks).
#[must_use]
pub fn data_name(domain: &str, disk: &str) -> String {
    format!("{domain}-data-{disk}.qcow2")
}

/// The domain a volume of ours belongs to, if the name has one of our suffixes (those of
/// a local pool's files and those of an rbd pool's images).
#[must_use]
pub fn owner_of(volume: &str) -> Option<&str> {
    let data_owner = || {
        let stem = volume.strip_suffix(".qcow2").unwrap_or(volume);
        let (domain, disk) = stem.rsplit_once("-data-")?;
        let ours = !disk.is_empty()
            && (disk.bytes()).all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        (ours && !domain.is_empty()).then_some(domain)
    };
    let console_owner = || {
        let (stem, number) = volume.rsplit_once('.')?;
        let rotated = !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit());
        let stem = if rotated { stem } else { volume };
        stem.strip_suffix("-console.log")
    };
    volume
        .strip_suffix("-overlay.qcow2")
        .or_else(|| volume.strip_suffix("-cidata.iso"))
        .or_else(|| volume.strip_suffix("-ignition"))
        .or_else(console_owner)
        .or_else(|| volume.strip_suffix("-root"))
        .or_else(data_owner)
        .filter(|domain| !domain.is_empty())
}

#[cfg(test)]
#[path = "spec_tests.rs"]
mod tests;
