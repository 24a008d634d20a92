//! Unit tests of the domain and volume documents (`xml`).

use super::*;
use crate::render::ownership::Tag;

const KVM: Platform = Platform {
    domain_type: DomainType::Kvm,
    kernel: None,
    firmware: Firmware::Bios,
    seed_bus: SeedBus::Virtio,
};

fn nics(network: &str) -> Vec<Nic> {
    if network.is_empty() {
        return Vec::new();
    }
    vec![Nic {
        source: crate::render::devices::NicSource::Network(network.to_owned()),
        mac: crate::render::devices::Mac([2, 0, 0, 0, 0, 1]),
        vlan: None,
    }]
}

fn spec(tag: &Tag, nics: &[Nic]) -> DomainSpec {
    let name = "bigfleet-0123456789abcdef01234567";
    DomainSpec {
        platform: KVM,
        name: name.to_owned(),
        tag: tag.clone(),
        instance_type: "kvm.small".to_owned(),
        instance_id: format!("{name}-op"),
        vcpu: 2,
        memory_mib: 4096,
        placed: crate::render::placement::Placed::default(),
        nics: nics.to_vec(),
        address: None,
        cpu: None,
        disks: Disks {
            overlay: "o.qcow2".to_owned(),
            seed: "s.iso".to_owned(),
            console: "c.log".to_owned(),
            base: Base {
                path: "/var/lib/libvirt/images/base.qcow2".to_owned(),
                format: "qcow2".to_owned(),
                overlay_bytes: 40 << 30,
                rbd: None,
            },
            data: Vec::new(),
            ignition: None,
        },
        user_data: std::sync::Arc::from(&b""[..]),
        tpm: false,
        secure_boot: false,
    }
}

/// Where the tests' volumes are.
const PATHS: VolumePaths<'static> = VolumePaths {
    overlay: "/var/lib/libvirt/images/o.qcow2",
    seed: "/var/lib/libvirt/images/s.iso",
    console: Some("/var/lib/libvirt/images/c.log"),
    data: &[],
    ignition: None,
};

#[test]
fn the_domain_document_parses_and_carries_every_device() {
    let tag = Tag::new("libvirt", "libvirt/OnDemand/kvm.small/a/000");
    let xml = domain(&spec(&tag, &nics("default")), PATHS);
    let document = roxmltree::Document::parse(&xml).unwrap();
    let find = |name: &'static str| document.descendants().filter(move |n| n.has_tag_name(name));
    assert_eq!(find("vcpu").next().unwrap().text(), Some("2"));
    assert_eq!(find("memory").next().unwrap().text(), Some("4096"));
    assert_eq!(find("disk").count(), 2);
    let channel = find("channel").next().unwrap();
    let target = channel
        .children()
        .find(|n| n.has_tag_name("target"))
        .unwrap();
    assert_eq!(target.attribute("name"), Some(AGENT_CHANNEL));
    let serials: Vec<_> = find("serial")
        .map(|n| n.parent().unwrap().tag_name().name())
        .collect();
    assert_eq!(
        serials,
        ["disk", "devices"],
        "the root disk's serial and the console"
    );
    let metadata = find("metadata").next().unwrap();
    let tag_xml = &xml[metadata.range()];
    assert!(tag_xml.contains("machineID"), "{tag_xml}");
}

#[test]
fn the_reference_platform_is_kvm_with_host_cpu_booting_the_disk() {
    let tag = Tag::new("libvirt", "m");
    let xml = domain(&spec(&tag, &nics("default")), PATHS);
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
        seed_bus: SeedBus::Virtio,
    };
    let spec = DomainSpec {
        platform,
        ..spec(&tag, &[])
    };
    let xml = domain(&spec, PATHS);
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
        seed_bus: SeedBus::Virtio,
    };
    let xml = domain(
        &DomainSpec {
            platform,
            ..spec(&tag, &nics("default"))
        },
        PATHS,
    );
    let document = roxmltree::Document::parse(&xml).unwrap();
    assert!(!document.descendants().any(|n| n.has_tag_name("initrd")));
    assert!(document.descendants().any(|n| n.has_tag_name("cpu")));
}

#[test]
fn the_smbios_serial_names_the_nocloud_datasource() {
    let tag = Tag::new("libvirt", "m");
    let xml = domain(&spec(&tag, &[]), PATHS);
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
            source: crate::render::devices::NicSource::Bridge("br0".to_owned()),
            mac: crate::render::devices::Mac([2, 0, 0, 0, 0, 1]),
            vlan: None,
        },
        Nic {
            source: crate::render::devices::NicSource::parse("direct=eth1:vepa").unwrap(),
            mac: crate::render::devices::Mac([2, 0, 0, 0, 0, 2]),
            vlan: None,
        },
    ];
    let xml = domain(
        &DomainSpec {
            cpu: Some(cpu.clone()),
            ..spec(&tag, &nics)
        },
        PATHS,
    );
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

/// The (device, target dev, bus, read-only) of each `<disk>`, in document order.
fn disks(xml: &str) -> Vec<(String, String, String, bool)> {
    let document = roxmltree::Document::parse(xml).unwrap();
    document
        .descendants()
        .filter(|n| n.has_tag_name("disk"))
        .map(|disk| {
            let target = disk.children().find(|n| n.has_tag_name("target")).unwrap();
            let attr = |name| target.attribute(name).unwrap().to_owned();
            (
                disk.attribute("device").unwrap().to_owned(),
                attr("dev"),
                attr("bus"),
                disk.children().any(|n| n.has_tag_name("readonly")),
            )
        })
        .collect()
}

#[test]
fn the_seed_is_a_read_only_virtio_disk_after_the_overlay_by_default() {
    let tag = Tag::new("libvirt", "m");
    let xml = domain(&spec(&tag, &[]), PATHS);
    let owned = |d: &str, t: &str, b: &str, ro| (d.to_owned(), t.to_owned(), b.to_owned(), ro);
    // The overlay stays the first disk: libvirt turns `<boot dev='hd'/>` into a boot index
    // on the first disk, so the firmware boots the overlay, not the seed.
    assert_eq!(
        disks(&xml),
        [
            owned("disk", "vda", "virtio", false),
            owned("disk", "vdb", "virtio", true),
        ]
    );
    assert!(
        xml.contains("<source file='/var/lib/libvirt/images/s.iso'/>"),
        "{xml}"
    );
    let sata = Platform {
        seed_bus: SeedBus::Sata,
        ..KVM
    };
    let xml = domain(
        &DomainSpec {
            platform: sata,
            ..spec(&tag, &[])
        },
        PATHS,
    );
    assert_eq!(
        disks(&xml),
        [
            owned("disk", "vda", "virtio", false),
            owned("cdrom", "sda", "sata", true),
        ]
    );
    assert!(
        xml.contains("<source file='/var/lib/libvirt/images/s.iso'/>"),
        "{xml}"
    );
    assert_eq!(Platform::default().seed_bus, SeedBus::Virtio);
    assert_eq!(SeedBus::Sata.as_str(), "sata");
}

#[test]
fn bios_leaves_the_firmware_to_qemu() {
    let tag = Tag::new("libvirt", "m");
    let xml = domain(&spec(&tag, &nics("default")), PATHS);
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
        seed_bus: SeedBus::Virtio,
    };
    let xml = domain(
        &DomainSpec {
            platform,
            ..spec(&tag, &[])
        },
        PATHS,
    );
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
    let xml = domain(&spec(&tag, &nics), PATHS);
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
