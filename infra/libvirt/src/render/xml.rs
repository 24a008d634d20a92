//! The libvirt XML documents the adapter writes (domain, overlay volume, seed volume) and the
//! one it reads (the base volume's format).
//!
//! Documents are built as strings because their shape is fixed; every interpolated value
//! goes through [`escape`], unlike the reference, which interpolated flag values and paths
//! raw. The domain is described in docs/libvirt.md §5.4: x86_64/q35 with BIOS boot, host CPU,
//! a virtio disk on the qcow2 overlay, the cloud-init seed as a second read-only virtio disk
//! (or, with `--seed-bus sata`, a SATA CD-ROM), one virtio NIC on `--network`, the qemu
//! guest-agent channel and a serial console whose output libvirt's log daemon writes to a
//! file beside the seed (the console log), which the provider reads back through libvirt
//! when a guest fails to come up (`storage::console`).
//!
//! Each NIC carries the MAC address derived from its machine (`devices`), the CPU is the
//! operator's choice (`--cpu`, `--instance-cpu`), and the SMBIOS system serial says
//! `ds=nocloud`, so cloud-init picks the NoCloud datasource without probing for it.
//!
//! On an rbd pool the root and the data disks are `<disk type='network'>` on the pool's
//! cluster (`render::rbd`); the seed stays a file in `--seed-pool`.
//!
//! A type that boots by Ignition gets its config as QEMU's firmware configuration entry
//! `opt/com.coreos/config` (a `<sysinfo type='fwcfg'>` naming the config's file) or as a
//! config drive (a read-only disk after the data disks).
//!
//! Beyond the reference, a [`Platform`] can ask for software emulation (`--domain-type
//! qemu`, for hosts without usable KVM: no host CPU model then), direct kernel boot
//! (`--guest-kernel`, for images without a boot loader) and no NIC (`--network ''`).

use crate::options::IgnitionDelivery;
use crate::options::ignition::FW_CFG_ENTRY;
use crate::render::devices::{CpuChoice, Nic};
use crate::render::ownership::escape;
use crate::render::placement::PlacedXml;
use crate::render::rbd::{self, RbdSource};

pub use crate::options::platform::{DirectKernel, DomainType, Firmware, Platform, SeedBus};
pub use crate::render::placement::Placed;
pub use crate::render::spec::{Base, DataVolume, Disks, DomainSpec, IgnitionDisk, VolumePaths};

/// The guest-agent channel name qemu-ga listens on.
pub const AGENT_CHANNEL: &str = "org.qemu.guest_agent.0";

/// The seed's `<disk>` element on `bus` for the volume at `path` (already escaped).
fn seed_disk(bus: SeedBus, path: &str) -> String {
    read_only_disk(bus, path, ("vdb", "sda"))
}

/// A read-only raw `<disk>` on `bus` (a virtio disk, or a SATA CD-ROM) for the file at
/// `path` (already escaped), as target `virtio` or `sata` of `targets`.
fn read_only_disk(bus: SeedBus, path: &str, (virtio, sata): (&str, &str)) -> String {
    let (device, target, bus) = match bus {
        SeedBus::Virtio => ("disk", virtio, "virtio"),
        SeedBus::Sata => ("cdrom", sata, "sata"),
    };
    format!(
        "
    <disk type='file' device='{device}'>
      <driver name='qemu' type='raw'/>
      <source file='{path}'/>
      <target dev='{target}' bus='{bus}'/>
      <readonly/>
    </disk>"
    )
}

/// The Ignition config's elements for `disk` at `path` (already escaped): a firmware
/// configuration entry (a `<sysinfo>` of the domain) or a config drive (a read-only disk
/// beside the seed, after the data disks); `(sysinfo, disk)`.
fn ignition_elements(
    disk: Option<&IgnitionDisk>,
    path: Option<&str>,
    bus: SeedBus,
) -> (String, String) {
    let (Some(disk), Some(path)) = (disk, path) else {
        return (String::new(), String::new());
    };
    match disk.delivery {
        IgnitionDelivery::FwCfg => (
            format!(
                "
  <sysinfo type='fwcfg'>
    <entry name='{FW_CFG_ENTRY}' file='{path}'/>
  </sysinfo>"
            ),
            String::new(),
        ),
        IgnitionDelivery::ConfigDrive => (String::new(), read_only_disk(bus, path, ("vdz", "sdb"))),
    }
}

/// The data disks' `<disk>` elements, from `vdc` on, each with its serial; `paths` are
/// already placed by libvirt, in the same order as `data` (on an rbd pool the images are
/// named by the spec, and `paths` are not read).
fn data_disks(data: &[DataVolume], paths: &[String], rbd: Option<&RbdSource>) -> String {
    let targets = (b'c'..=b'z').map(|letter| format!("vd{}", char::from(letter)));
    if let Some(source) = rbd {
        return (data.iter().zip(targets))
            .map(|(disk, target)| rbd::disk(source, &disk.volume, &target, &disk.serial))
            .collect();
    }
    (data.iter().zip(paths).zip(targets))
        .map(|((disk, path), target)| {
            format!(
                "
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='{}'/>
      <target dev='{target}' bus='virtio'/>
      <serial>{}</serial>
    </disk>",
                escape(path),
                escape(&disk.serial)
            )
        })
        .collect()
}

/// The serial port, and the log its output goes to when `log` (an escaped path) is given.
/// The log is rewritten at each start (`append='off'`): it holds this boot only. libvirt
/// makes the `<console>` the same device, so the console needs no element of its own.
fn serial(log: Option<&str>) -> String {
    match log {
        Some(path) => format!(
            "
    <serial type='pty'>
      <log file='{path}' append='off'/>
    </serial>"
        ),
        None => "
    <serial type='pty'/>"
            .to_owned(),
    }
}

/// The emulated TPM 2.0 (CRB interface, what current guests' drivers expect on q35): libvirt
/// runs swtpm for it and keeps its state under the host's `/var/lib/libvirt/swtpm/`, which
/// the domain's undefine removes.
const TPM: &str = "
    <tpm model='tpm-crb'>
      <backend type='emulator' version='2.0'/>
    </tpm>";

/// The SMBIOS table the domain presents: its system serial names cloud-init's datasource.
const SYSINFO: &str = "\n  <sysinfo type='smbios'>
    <system><entry name='serial'>ds=nocloud</entry></system>
  </sysinfo>";

/// The `<os>` attribute that asks libvirt to pick the firmware, and the `<os>` child that
/// narrows its choice: UEFI without Secure Boot (a descriptor of the host's OVMF package).
pub(crate) fn firmware_elements(firmware: Firmware) -> (&'static str, &'static str) {
    match firmware {
        Firmware::Bios => ("", ""),
        Firmware::Efi => (
            " firmware='efi'",
            "\n    <firmware><feature enabled='no' name='secure-boot'/></firmware>",
        ),
    }
}

/// The same for an instance type with `secure_boot`, whatever `--firmware` says: UEFI with
/// Secure Boot on and the firmware's usual keys enrolled (Debian's `ovmf` has such a build,
/// `OVMF_CODE_4M.ms.fd` with `OVMF_VARS_4M.ms.fd`), which needs SMM
/// ([`SECURE_BOOT_FEATURES`]).
const SECURE_BOOT_FIRMWARE: (&str, &str) = (
    " firmware='efi'",
    "\n    <firmware>
      <feature enabled='yes' name='enrolled-keys'/>
      <feature enabled='yes' name='secure-boot'/>
    </firmware>",
);

/// The `<features>` of a Secure Boot domain: SMM keeps the firmware's variables out of the
/// guest's reach, and libvirt's Secure Boot firmware requires it.
const SECURE_BOOT_FEATURES: &str = "<acpi/><apic/><smm state='on'/>";

/// The `<os>` children after `<type>`: the boot device or the direct-boot kernel.
fn boot_elements(platform: &Platform) -> String {
    let Some(direct) = &platform.kernel else {
        return "<boot dev='hd'/>".to_owned();
    };
    let mut out = format!("<kernel>{}</kernel>", escape(&direct.kernel));
    if let Some(initrd) = &direct.initrd {
        out.push_str(&format!("\n    <initrd>{}</initrd>", escape(initrd)));
    }
    out.push_str(&format!(
        "\n    <cmdline>{}</cmdline>",
        escape(&direct.cmdline)
    ));
    out
}

/// The `<cpu>` element of a domain: the operator's choice, else `host-passthrough` on KVM
/// and nothing under TCG (which cannot pass the host CPU through; QEMU's default model is
/// the portable choice).
pub(crate) fn cpu_element(cpu: Option<&CpuChoice>, domain_type: DomainType) -> String {
    match (cpu, domain_type) {
        (Some(cpu), _) => cpu.to_xml(),
        (None, DomainType::Kvm) => "\n  <cpu mode='host-passthrough' check='none'/>".to_owned(),
        (None, DomainType::Qemu) => String::new(),
    }
}

/// The root's `<disk>`: the qcow2 overlay at `path`, or the RBD clone.
fn root_disk(disks: &Disks, path: &str) -> String {
    if let Some(source) = &disks.base.rbd {
        return rbd::disk(source, &disks.overlay, "vda", "root");
    }
    format!(
        "
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='{}'/>
      <target dev='vda' bus='virtio'/>
      <serial>root</serial>
    </disk>",
        escape(path)
    )
}

/// The domain XML for `spec`, its volumes at `paths`.
#[must_use]
pub fn domain(spec: &DomainSpec, paths: VolumePaths<'_>) -> String {
    let name = escape(&spec.name);
    let root = root_disk(&spec.disks, paths.overlay);
    let seed = seed_disk(spec.platform.seed_bus, &escape(paths.seed));
    let data = data_disks(&spec.disks.data, paths.data, spec.disks.base.rbd.as_ref());
    let ignition_path = paths.ignition.map(escape);
    let (fw_cfg, drive) = ignition_elements(
        spec.disks.ignition.as_ref(),
        ignition_path.as_deref(),
        spec.platform.seed_bus,
    );
    let (vcpu, memory) = (spec.vcpu, spec.memory_mib);
    let tag = spec.tag.to_domain_xml();
    let kind = spec.platform.domain_type.as_str();
    let boot = boot_elements(&spec.platform);
    let ((firmware, firmware_choice), features) = if spec.secure_boot {
        (SECURE_BOOT_FIRMWARE, SECURE_BOOT_FEATURES)
    } else {
        (firmware_elements(spec.platform.firmware), "<acpi/><apic/>")
    };
    let cpu = cpu_element(spec.cpu.as_ref(), spec.platform.domain_type);
    let nic: String = spec.nics.iter().map(Nic::to_xml).collect();
    let (cpuset, placement) = (spec.placed.vcpu_cpuset(), spec.placed.elements());
    let passthrough = spec.placed.device_elements();
    let serial = serial(paths.console.map(escape).as_deref());
    let tpm = if spec.tpm { TPM } else { "" };
    format!(
        "<domain type='{kind}'>
  <name>{name}</name>
  <metadata>{tag}</metadata>
  <memory unit='MiB'>{memory}</memory>
  <currentMemory unit='MiB'>{memory}</currentMemory>
  <vcpu placement='static'{cpuset}>{vcpu}</vcpu>{placement}{SYSINFO}{fw_cfg}
  <os{firmware}>
    <type arch='x86_64' machine='q35'>hvm</type>{firmware_choice}
    {boot}
    <smbios mode='sysinfo'/>
  </os>
  <features>{features}</features>{cpu}
  <clock offset='utc'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>restart</on_crash>
  <devices>{root}{seed}{data}{drive}{nic}{passthrough}{tpm}
    <channel type='unix'>
      <source mode='bind'/>
      <target type='virtio' name='{AGENT_CHANNEL}'/>
    </channel>{serial}
  </devices>
</domain>
"
    )
}

/// `spec`'s root volume, of the size the type asks for: a qcow2 overlay backed by the base
/// image, or on an rbd pool a raw image (made as a clone of the base).
#[must_use]
pub fn overlay(spec: &DomainSpec) -> String {
    let (disks, base) = (&spec.disks, &spec.disks.base);
    if base.rbd.is_some() {
        return rbd::volume(&disks.overlay, base.overlay_bytes);
    }
    overlay_volume(&disks.overlay, base.overlay_bytes, &base.path, &base.format)
}

/// A data disk's volume on a local pool: thin qcow2 of its size, no backing.
#[must_use]
pub fn data_volume(disk: &DataVolume) -> String {
    thin_qcow2(&escape(&disk.volume), disk.bytes, "")
}

/// Data disk `disk` of `spec`'s volume: [`data_volume`] on a local pool, a raw RBD image on
/// an rbd pool.
#[must_use]
pub fn data_volume_of(spec: &DomainSpec, disk: &DataVolume) -> String {
    if spec.disks.base.rbd.is_some() {
        return rbd::volume(&disk.volume, disk.bytes);
    }
    data_volume(disk)
}

/// `spec`'s seed volume, sized for a seed image of `bytes`.
#[must_use]
pub fn seed(spec: &DomainSpec, bytes: u64) -> String {
    seed_volume(&spec.disks.seed, bytes)
}

/// `spec`'s console log: an empty raw file made before the domain is defined, so the pool
/// knows it (libvirt reads it back as a volume, also from remote hosts) and Delete removes it.
#[must_use]
pub fn console(spec: &DomainSpec) -> String {
    seed_volume(&spec.disks.console, 0)
}

/// A qcow2 overlay volume backed by the base image. It is thin (allocation 0): qcow2 grows
/// on write, and a pool must not be charged the full virtual size per machine.
#[must_use]
pub fn overlay_volume(name: &str, capacity: u64, base_path: &str, base_format: &str) -> String {
    let (base_path, base_format) = (escape(base_path), escape(base_format));
    let backing = format!(
        "
  <backingStore>
    <path>{base_path}</path>
    <format type='{base_format}'/>
  </backingStore>"
    );
    thin_qcow2(&escape(name), capacity, &backing)
}

/// A thin (allocation 0) qcow2 volume `name` (escaped) of `capacity` bytes, with `backing`
/// (a `<backingStore>` element, or nothing) after its target.
fn thin_qcow2(name: &str, capacity: u64, backing: &str) -> String {
    format!(
        "<volume type='file'>
  <name>{name}</name>
  <capacity unit='bytes'>{capacity}</capacity>
  <allocation unit='bytes'>0</allocation>
  <target><format type='qcow2'/></target>{backing}
</volume>
"
    )
}

/// A raw volume of `capacity` bytes (the seed ISO's size, or 0 for the console log).
#[must_use]
pub fn seed_volume(name: &str, capacity: u64) -> String {
    let name = escape(name);
    format!(
        "<volume type='file'>
  <name>{name}</name>
  <capacity unit='bytes'>{capacity}</capacity>
  <target><format type='raw'/></target>
</volume>
"
    )
}

/// The volumes of domain `domain` that its definition `domain_xml` names as disks (by file
/// or RBD image name, those [`owner_of`](crate::render::spec::owner_of) gives to `domain`),
/// other than its root and seed. Unreadable documents name none.
#[must_use]
pub fn owned_volumes(domain_xml: &str, domain: &str) -> Vec<String> {
    let Ok(document) = roxmltree::Document::parse(domain_xml) else {
        return Vec::new();
    };
    let named = |file: &str| {
        let volume = file.rsplit('/').next().unwrap_or(file);
        (crate::render::spec::owner_of(volume) == Some(domain)).then(|| volume.to_owned())
    };
    (document.descendants())
        .filter(|n| n.has_tag_name("source") && n.parent().is_some_and(|d| d.has_tag_name("disk")))
        .filter_map(|source| {
            (source.attribute("file").or(source.attribute("name"))).and_then(named)
        })
        .filter(|volume| {
            *volume != crate::render::spec::overlay_name(domain)
                && *volume != crate::render::spec::rbd_root_name(domain)
                && *volume != crate::render::spec::seed_name(domain)
                && *volume != crate::render::spec::ignition_name(domain)
        })
        .collect()
}

/// The `<target><format type=…/>` of a volume description, if present and non-empty.
#[must_use]
pub fn volume_format(volume_xml: &str) -> Option<String> {
    let document = roxmltree::Document::parse(volume_xml).ok()?;
    let target = document
        .root_element()
        .children()
        .find(|n| n.has_tag_name("target"))?;
    let format = target.children().find(|n| n.has_tag_name("format"))?;
    format
        .attribute("type")
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
}

#[cfg(test)]
#[path = "xml_tests.rs"]
mod tests;
