//! The libvirt XML documents the adapter writes (domain, overlay volume, seed volume) and the
//! one it reads (the base volume's format).
//!
//! Documents are built as strings because their shape is fixed; every interpolated value
//! goes through [`escape`], unlike the reference, which interpolated flag values and paths
//! raw. The domain is described in docs/libvirt.md §5.4: x86_64/q35 with BIOS boot, host CPU,
//! a virtio disk on the qcow2 overlay, the cloud-init seed as a read-only SATA CD-ROM, one
//! virtio NIC on `--network`, the qemu guest-agent channel and a serial console.
//!
//! Each NIC carries the MAC address derived from its machine (`devices`), the CPU is the
//! operator's choice (`--cpu`, `--instance-cpu`), and the SMBIOS system serial says
//! `ds=nocloud`, so cloud-init picks the NoCloud datasource without probing for it.
//!
//! Beyond the reference, a [`Platform`] can ask for software emulation (`--domain-type
//! qemu`, for hosts without usable KVM: no host CPU model then), direct kernel boot
//! (`--guest-kernel`, for images without a boot loader) and no NIC (`--network ''`).

use super::devices::{CpuChoice, Nic};
use super::ownership::{Tag, escape};

/// The guest-agent channel name qemu-ga listens on.
pub const AGENT_CHANNEL: &str = "org.qemu.guest_agent.0";

/// The accelerator a domain runs under (`--domain-type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DomainType {
    /// Hardware virtualisation; the guest sees the host CPU model.
    #[default]
    Kvm,
    /// QEMU's software emulation (TCG), for hosts where KVM cannot run guests.
    Qemu,
}

impl DomainType {
    /// The value of `<domain type=…>`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Qemu => "qemu",
        }
    }
}

/// The guest firmware (`--firmware`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Firmware {
    /// SeaBIOS, QEMU's default (no `firmware` attribute).
    #[default]
    Bios,
    /// UEFI (OVMF on x86_64) chosen by libvirt's firmware auto-selection, with Secure Boot
    /// off: a directly booted kernel or an unsigned boot loader must still start.
    Efi,
}

impl Firmware {
    /// The flag value.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Bios => "bios",
            Self::Efi => "efi",
        }
    }
}

/// A kernel booted directly by QEMU instead of the image's boot loader. The paths are on
/// the libvirt host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectKernel {
    /// The kernel image (`--guest-kernel`).
    pub kernel: String,
    /// The initramfs (`--guest-initrd`), if any.
    pub initrd: Option<String>,
    /// The kernel command line (`--guest-cmdline`).
    pub cmdline: String,
}

/// How every domain is virtualised and booted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Platform {
    /// The accelerator.
    pub domain_type: DomainType,
    /// `None` boots the overlay disk through the firmware, as the reference does.
    pub kernel: Option<DirectKernel>,
    /// BIOS or UEFI.
    pub firmware: Firmware,
}

/// What a domain is made of.
#[derive(Clone, Debug)]
pub struct DomainSpec<'a> {
    /// The domain name.
    pub name: &'a str,
    /// The ownership tag embedded in `<metadata>`.
    pub tag: &'a Tag,
    /// Virtual CPUs.
    pub vcpu: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Path of the qcow2 overlay volume.
    pub overlay_path: &'a str,
    /// Path of the NoCloud seed volume.
    pub seed_path: &'a str,
    /// The NICs, in order (none: no NIC).
    pub nics: &'a [Nic],
    /// The guest CPU; `None` is the platform's default (`host-passthrough` on KVM, QEMU's
    /// own model under TCG).
    pub cpu: Option<&'a CpuChoice>,
    /// Accelerator and boot method.
    pub platform: &'a Platform,
}

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

/// The domain XML for `spec`.
#[must_use]
pub fn domain(spec: &DomainSpec<'_>) -> String {
    let name = escape(spec.name);
    let overlay = escape(spec.overlay_path);
    let seed = escape(spec.seed_path);
    let (vcpu, memory) = (spec.vcpu, spec.memory_mib);
    let tag = spec.tag.to_domain_xml();
    let kind = spec.platform.domain_type.as_str();
    let boot = boot_elements(spec.platform);
    let (firmware, firmware_choice) = firmware_elements(spec.platform.firmware);
    let cpu = cpu_element(spec.cpu, spec.platform.domain_type);
    let nic: String = spec.nics.iter().map(Nic::to_xml).collect();
    format!(
        "<domain type='{kind}'>
  <name>{name}</name>
  <metadata>{tag}</metadata>
  <memory unit='MiB'>{memory}</memory>
  <currentMemory unit='MiB'>{memory}</currentMemory>
  <vcpu placement='static'>{vcpu}</vcpu>{SYSINFO}
  <os{firmware}>
    <type arch='x86_64' machine='q35'>hvm</type>{firmware_choice}
    {boot}
    <smbios mode='sysinfo'/>
  </os>
  <features><acpi/><apic/></features>{cpu}
  <clock offset='utc'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>restart</on_crash>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='{overlay}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/>
      <source file='{seed}'/>
      <target dev='sda' bus='sata'/>
      <readonly/>
    </disk>{nic}
    <channel type='unix'>
      <source mode='bind'/>
      <target type='virtio' name='{AGENT_CHANNEL}'/>
    </channel>
    <serial type='pty'/>
    <console type='pty'/>
  </devices>
</domain>
"
    )
}

/// A qcow2 overlay volume backed by the base image. It is thin (allocation 0): qcow2 grows
/// on write, and a pool must not be charged the full virtual size per machine.
#[must_use]
pub fn overlay_volume(name: &str, capacity: u64, base_path: &str, base_format: &str) -> String {
    let (name, base_path, base_format) = (escape(name), escape(base_path), escape(base_format));
    format!(
        "<volume type='file'>
  <name>{name}</name>
  <capacity unit='bytes'>{capacity}</capacity>
  <allocation unit='bytes'>0</allocation>
  <target><format type='qcow2'/></target>
  <backingStore>
    <path>{base_path}</path>
    <format type='{base_format}'/>
  </backingStore>
</volume>
"
    )
}

/// A raw volume sized for the seed ISO.
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
mod tests {
    use super::*;

    const KVM: Platform = Platform {
        domain_type: DomainType::Kvm,
        kernel: None,
        firmware: Firmware::Bios,
    };

    fn nics(network: &str) -> Vec<Nic> {
        if network.is_empty() {
            return Vec::new();
        }
        vec![Nic {
            source: crate::devices::NicSource::Network(network.to_owned()),
            mac: crate::devices::Mac([2, 0, 0, 0, 0, 1]),
        }]
    }

    fn spec<'a>(tag: &'a Tag, nics: &'a [Nic]) -> DomainSpec<'a> {
        DomainSpec {
            platform: &KVM,
            name: "bigfleet-0123456789abcdef01234567",
            tag,
            vcpu: 2,
            memory_mib: 4096,
            overlay_path: "/var/lib/libvirt/images/o.qcow2",
            seed_path: "/var/lib/libvirt/images/s.iso",
            nics,
            cpu: None,
        }
    }

    #[test]
    fn the_domain_document_parses_and_carries_every_device() {
        let tag = Tag::new("libvirt", "libvirt/OnDemand/kvm.small/a/000");
        let xml = domain(&spec(&tag, &nics("default")));
        let document = roxmltree::Document::parse(&xml).unwrap();
        let find =
            |name: &'static str| document.descendants().filter(move |n| n.has_tag_name(name));
        assert_eq!(find("vcpu").next().unwrap().text(), Some("2"));
        assert_eq!(find("memory").next().unwrap().text(), Some("4096"));
        assert_eq!(find("disk").count(), 2);
        let channel = find("channel").next().unwrap();
        let target = channel
            .children()
            .find(|n| n.has_tag_name("target"))
            .unwrap();
        assert_eq!(target.attribute("name"), Some(AGENT_CHANNEL));
        assert_eq!(find("serial").count(), 1);
        let metadata = find("metadata").next().unwrap();
        let tag_xml = &xml[metadata.range()];
        assert!(tag_xml.contains("machineID"), "{tag_xml}");
    }

    #[test]
    fn the_reference_platform_is_kvm_with_host_cpu_booting_the_disk() {
        let tag = Tag::new("libvirt", "m");
        let xml = domain(&spec(&tag, &nics("default")));
        let document = roxmltree::Document::parse(&xml).unwrap();
        let root = document.root_element();
        assert_eq!(root.attribute("type"), Some("kvm"));
        let has = |name: &str| document.descendants().any(|n| n.has_tag_name(name));
        assert!(has("boot") && has("cpu") && has("interface"));
        assert!(!has("kernel") && !has("initrd") && !has("cmdline"));
    }

    #[test]
    fn emulated_direct_boot_without_nic() {
        let tag = Tag::new("libvirt", "m");
        let platform = Platform {
            domain_type: DomainType::Qemu,
            kernel: Some(DirectKernel {
                kernel: "/guest/vmlinuz".to_owned(),
                initrd: Some("/guest/initrd & co.img".to_owned()),
                cmdline: "console=ttyS0 panic=-1".to_owned(),
            }),
            firmware: Firmware::Bios,
        };
        let spec = DomainSpec {
            platform: &platform,
            ..spec(&tag, &[])
        };
        let xml = domain(&spec);
        let document = roxmltree::Document::parse(&xml).unwrap();
        assert_eq!(document.root_element().attribute("type"), Some("qemu"));
        let text = |name: &str| {
            document
                .descendants()
                .find(|n| n.has_tag_name(name))
                .and_then(|n| n.text())
        };
        assert_eq!(text("kernel"), Some("/guest/vmlinuz"));
        assert_eq!(text("initrd"), Some("/guest/initrd & co.img"));
        assert_eq!(text("cmdline"), Some("console=ttyS0 panic=-1"));
        let has = |name: &str| document.descendants().any(|n| n.has_tag_name(name));
        assert!(!has("boot"), "direct boot replaces the boot device");
        assert!(!has("cpu"), "TCG gets QEMU's default CPU model");
        assert!(!has("interface"), "an empty --network means no NIC");
        assert_eq!(
            document
                .descendants()
                .filter(|n| n.has_tag_name("disk"))
                .count(),
            2,
            "the overlay and the seed stay attached"
        );
    }

    #[test]
    fn direct_boot_without_initrd_has_no_initrd_element() {
        let tag = Tag::new("libvirt", "m");
        let platform = Platform {
            domain_type: DomainType::Kvm,
            kernel: Some(DirectKernel {
                kernel: "/k".to_owned(),
                initrd: None,
                cmdline: String::new(),
            }),
            firmware: Firmware::Bios,
        };
        let xml = domain(&DomainSpec {
            platform: &platform,
            ..spec(&tag, &nics("default"))
        });
        let document = roxmltree::Document::parse(&xml).unwrap();
        assert!(!document.descendants().any(|n| n.has_tag_name("initrd")));
        assert!(document.descendants().any(|n| n.has_tag_name("cpu")));
    }

    #[test]
    fn the_smbios_serial_names_the_nocloud_datasource() {
        let tag = Tag::new("libvirt", "m");
        let xml = domain(&spec(&tag, &[]));
        let document = roxmltree::Document::parse(&xml).unwrap();
        let serial = document
            .descendants()
            .find(|n| n.has_tag_name("entry") && n.attribute("name") == Some("serial"))
            .unwrap();
        assert_eq!(serial.text(), Some("ds=nocloud"));
        let smbios = document
            .descendants()
            .find(|n| n.has_tag_name("smbios"))
            .unwrap();
        assert_eq!(smbios.attribute("mode"), Some("sysinfo"));
        assert_eq!(smbios.parent().unwrap().tag_name().name(), "os");
    }

    #[test]
    fn a_chosen_cpu_replaces_the_platform_default_and_nics_keep_their_order() {
        let tag = Tag::new("libvirt", "m");
        let cpu = CpuChoice::parse("host-model,-arch-capabilities").unwrap();
        let nics = vec![
            Nic {
                source: crate::devices::NicSource::Bridge("br0".to_owned()),
                mac: crate::devices::Mac([2, 0, 0, 0, 0, 1]),
            },
            Nic {
                source: crate::devices::NicSource::parse("direct=eth1:vepa").unwrap(),
                mac: crate::devices::Mac([2, 0, 0, 0, 0, 2]),
            },
        ];
        let xml = domain(&DomainSpec {
            cpu: Some(&cpu),
            ..spec(&tag, &nics)
        });
        let document = roxmltree::Document::parse(&xml).unwrap();
        let cpu = document
            .descendants()
            .find(|n| n.has_tag_name("cpu"))
            .unwrap();
        assert_eq!(cpu.attribute("mode"), Some("host-model"));
        let types: Vec<_> = document
            .descendants()
            .filter(|n| n.has_tag_name("interface"))
            .map(|n| n.attribute("type").unwrap())
            .collect();
        assert_eq!(types, ["bridge", "direct"]);
        let macs: Vec<_> = document
            .descendants()
            .filter(|n| n.has_tag_name("mac"))
            .map(|n| n.attribute("address").unwrap())
            .collect();
        assert_eq!(macs, ["02:00:00:00:00:01", "02:00:00:00:00:02"]);
    }

    #[test]
    fn bios_leaves_the_firmware_to_qemu() {
        let tag = Tag::new("libvirt", "m");
        let xml = domain(&spec(&tag, &nics("default")));
        let document = roxmltree::Document::parse(&xml).unwrap();
        let os = document
            .descendants()
            .find(|n| n.has_tag_name("os"))
            .unwrap();
        assert_eq!(os.attribute("firmware"), None);
        assert!(!document.descendants().any(|n| n.has_tag_name("firmware")));
        assert!(!document.descendants().any(|n| n.has_tag_name("loader")));
    }

    #[test]
    fn efi_asks_libvirt_for_uefi_without_secure_boot() {
        let tag = Tag::new("libvirt", "m");
        let platform = Platform {
            domain_type: DomainType::Qemu,
            kernel: Some(DirectKernel {
                kernel: "/guest/vmlinuz".to_owned(),
                initrd: None,
                cmdline: "console=ttyS0".to_owned(),
            }),
            firmware: Firmware::Efi,
        };
        let xml = domain(&DomainSpec {
            platform: &platform,
            ..spec(&tag, &[])
        });
        let document = roxmltree::Document::parse(&xml).unwrap();
        let os = document
            .descendants()
            .find(|n| n.has_tag_name("os"))
            .unwrap();
        assert_eq!(os.attribute("firmware"), Some("efi"));
        let features: Vec<(Option<&str>, Option<&str>)> = os
            .children()
            .filter(|n| n.has_tag_name("firmware"))
            .flat_map(|f| f.children().filter(|n| n.has_tag_name("feature")))
            .map(|f| (f.attribute("name"), f.attribute("enabled")))
            .collect();
        assert_eq!(features, [(Some("secure-boot"), Some("no"))]);
        // Auto-selection: libvirt picks the loader and NVRAM template itself.
        assert!(!document.descendants().any(|n| n.has_tag_name("loader")));
        assert!(!document.descendants().any(|n| n.has_tag_name("nvram")));
        let kernel = os.children().find(|n| n.has_tag_name("kernel")).unwrap();
        assert_eq!(kernel.text(), Some("/guest/vmlinuz"));
    }

    #[test]
    fn hostile_values_are_escaped() {
        let tag = Tag::new("p'<x>", "m&n");
        let nics = nics("net'/><evil/>");
        let xml = domain(&spec(&tag, &nics));
        let document = roxmltree::Document::parse(&xml).unwrap();
        assert!(!document.descendants().any(|n| n.has_tag_name("evil")));
        let source = document
            .descendants()
            .find(|n| n.has_tag_name("source") && n.attribute("network").is_some())
            .unwrap();
        assert_eq!(source.attribute("network"), Some("net'/><evil/>"));
    }

    #[test]
    fn overlay_records_the_backing_format() {
        let xml = overlay_volume("v-overlay.qcow2", 1 << 30, "/b/base.img", "raw");
        let document = roxmltree::Document::parse(&xml).unwrap();
        let backing = document
            .descendants()
            .find(|n| n.has_tag_name("backingStore"))
            .unwrap();
        let format = backing
            .children()
            .find(|n| n.has_tag_name("format"))
            .unwrap();
        assert_eq!(format.attribute("type"), Some("raw"));
        assert_eq!(volume_format(&xml).as_deref(), Some("qcow2"));
        assert_eq!(
            volume_format(&seed_volume("s.iso", 2048)).as_deref(),
            Some("raw")
        );
    }

    #[test]
    fn volume_format_tolerates_missing_pieces() {
        assert_eq!(volume_format("<volume><name>x</name></volume>"), None);
        assert_eq!(
            volume_format("<volume><target><format type=''/></target></volume>"),
            None
        );
        assert_eq!(volume_format("garbage"), None);
    }
}
