//! Every shape of domain the adapter makes today, pinned as documents: the domain XML, the
//! overlay and seed volume XML, and the seed's `meta-data` and `user-data`. Each shape is a
//! [`DomainSpec`] built the one way the adapter builds it ([`DomainSpec::new`]) from the
//! options the flags would give; the snapshots hold no temporary path or random value.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;
use crate::options::{
    CpuChoice, DirectKernel, DomainType, Firmware, IgnitionDelivery, IgnitionSetup, NicSource,
    SeedBus,
};
use crate::render::xml;
use bigfleet_libvirt_domain::catalog::DataDisk;

const PROVIDER: &str = "libvirt";
const MACHINE: &str = "libvirt/OnDemand/kvm.small/rack1/0";
const INSTANCE_TYPE: &str = "kvm.small";

/// The spec of the slot [`MACHINE`] under `options`, on a host whose base image is a 2 GiB
/// qcow2 (the overlay gets the 40 GiB floor), its type without disks of its own.
fn spec_with(options: &DomainConfig) -> DomainSpec {
    spec_shaped(options, &DiskShape::default())
}

/// [`spec_with`] for a type whose disks are `disks`.
fn spec_shaped(options: &DomainConfig, disks: &DiskShape) -> DomainSpec {
    let base = Base {
        path: "/var/lib/libvirt/images/golden.qcow2".to_owned(),
        format: "qcow2".to_owned(),
        overlay_bytes: 40 << 30,
        rbd: None,
    };
    spec_on(options, disks, base)
}

/// [`spec_shaped`] on a host whose base image is `base`.
fn spec_on(options: &DomainConfig, disks: &DiskShape, base: Base) -> DomainSpec {
    spec_of(MACHINE, options, disks, base)
}

/// [`spec_on`] for the slot `machine` (of [`INSTANCE_TYPE`]).
fn spec_of(machine: &str, options: &DomainConfig, disks: &DiskShape, base: Base) -> DomainSpec {
    let nics = options.nic_sources(INSTANCE_TYPE).len();
    let macs = MacBook::new(PROVIDER, [(machine, nics)]);
    let user_data: Arc<[u8]> = Arc::from(&b"#cloud-config\npackages: [jq]\n"[..]);
    let choices = Choices {
        provider: PROVIDER,
        options,
        macs: &macs,
        user_data: &user_data,
    };
    let slot = Slot {
        machine_id: machine,
        instance_type: INSTANCE_TYPE,
        operation_id: "op-7",
        vcpu: 2,
        memory_mib: 4096,
        disks,
        tpm: false,
        secure_boot: false,
        ignition: options.ignition.is_some(),
    };
    DomainSpec::new(&choices, &slot, base)
}

/// The options the flags give by default, changed by `change`.
fn options(change: impl FnOnce(&mut DomainConfig)) -> DomainConfig {
    let mut options = DomainConfig {
        image: "golden.qcow2".to_owned(),
        ..DomainConfig::default()
    };
    change(&mut options);
    options
}

/// Every document of `spec`, its volumes placed in the pool's directory.
fn documents(spec: &DomainSpec) -> String {
    let overlay_path = format!("/var/lib/libvirt/images/{}", spec.disks.overlay);
    let seed_path = format!("/var/lib/libvirt/images/{}", spec.disks.seed);
    let console_path = format!("/var/lib/libvirt/images/{}", spec.disks.console);
    let data_paths: Vec<String> = (spec.disks.data.iter())
        .map(|disk| format!("/var/lib/libvirt/images/{}", disk.volume))
        .collect();
    let ignition_path = (spec.disks.ignition.as_ref())
        .map(|disk| format!("/var/lib/libvirt/images/{}", disk.volume));
    let paths = VolumePaths {
        overlay: &overlay_path,
        seed: &seed_path,
        console: Some(&console_path),
        data: &data_paths,
        ignition: ignition_path.as_deref(),
    };
    let network_config = (spec.address.as_ref()).map(|a| seed::network_config(&spec.nics, a));
    let image = seed::build(
        &spec.name,
        &spec.instance_id,
        &spec.user_data,
        network_config.as_deref(),
    )
    .unwrap();
    let seed_bytes = u64::try_from(image.len()).unwrap();
    let data: String = (spec.disks.data.iter())
        .map(|disk| xml::data_volume_of(spec, disk))
        .collect();
    let network_config = (network_config)
        .map(|text| format!("=== seed network-config\n{text}"))
        .unwrap_or_default();
    format!(
        "=== domain\n{}=== overlay volume\n{}=== seed volume\n{}=== console volume\n{}\
         === data volumes\n{}=== seed meta-data\n{}=== seed user-data\n{}{network_config}",
        xml::domain(spec, paths),
        xml::overlay(spec),
        xml::seed(spec, seed_bytes),
        xml::console(spec),
        data,
        seed::meta_data(&spec.name, &spec.instance_id),
        String::from_utf8_lossy(&spec.user_data),
    )
}

fn nic(text: &str) -> NicSource {
    NicSource::parse(text).unwrap()
}

fn cpu(text: &str) -> CpuChoice {
    CpuChoice::parse(text).unwrap()
}

/// A slot a static address pool serves, with its first NIC on an Open vSwitch bridge: the
/// NIC carries the pool's VLAN tag, the second NIC none, and the seed gains a
/// `network-config` giving the first NIC (by its MAC) slot 2's address, the route and DNS,
/// and the second DHCP.
#[test]
fn a_static_address_on_an_ovs_bridge_with_a_vlan_tag() {
    let slots = crate::tests::slots(PROVIDER, "rack1", INSTANCE_TYPE, 3);
    let options = options(|o| o.nics = vec![nic("ovs=ovsbr0"), nic("network=storage")]);
    let pools = crate::options::AddressPools::parse(
        br#"[{"instance_type": "kvm.small", "zone": "rack1", "cidr": "10.20.0.0/24",
              "first": "10.20.0.10", "gateway": "10.20.0.1", "dns": ["10.20.0.1"],
              "search": ["nodes.example"], "vlan": 120}]"#,
        "pools.json",
    )
    .unwrap();
    let addresses = pools.book(&slots, |t| options.nic_sources(t)).unwrap();
    let options = DomainConfig {
        addresses,
        ..options
    };
    let base = Base {
        path: "/var/lib/libvirt/images/golden.qcow2".to_owned(),
        format: "qcow2".to_owned(),
        overlay_bytes: 40 << 30,
        rbd: None,
    };
    let spec = spec_of(slots[2].id.as_str(), &options, &DiskShape::default(), base);
    assert_eq!(
        spec.address.as_ref().unwrap().with_prefix(),
        "10.20.0.12/24"
    );
    insta::assert_snapshot!("static_address_ovs_vlan", documents(&spec));
}

#[test]
fn kvm_bios_one_network_nic_seed_on_virtio() {
    insta::assert_snapshot!("kvm_bios_network", documents(&spec_with(&options(|_| {}))));
}

#[test]
fn a_sized_root_and_two_data_disks_with_their_serials() {
    let disks = DiskShape {
        root_gib: Some(20),
        data: vec![
            DataDisk {
                name: "data1".to_owned(),
                size_gib: 5,
            },
            DataDisk {
                name: "scratch".to_owned(),
                size_gib: 64,
            },
        ],
    };
    let spec = spec_shaped(&options(|_| {}), &disks);
    let volumes: Vec<(&str, u64)> = (spec.disks.data.iter())
        .map(|d| (d.serial.as_str(), d.bytes))
        .collect();
    assert_eq!(volumes, [("data1", 5 << 30), ("scratch", 64 << 30)]);
    for disk in &spec.disks.data {
        assert_eq!(owner_of(&disk.volume), Some(spec.name.as_str()));
    }
    insta::assert_snapshot!("data_disks", documents(&spec));
}

#[test]
fn an_rbd_pool_clones_the_root_and_makes_rbd_data_disks_with_the_pools_auth() {
    let disks = DiskShape {
        root_gib: Some(20),
        data: vec![DataDisk {
            name: "data1".to_owned(),
            size_gib: 5,
        }],
    };
    let pool = crate::host::fixture::rbd_pool("ceph", "golden", 2 << 30);
    let crate::render::rbd::PoolKind::Rbd(source) = crate::render::rbd::pool_kind(&pool).unwrap()
    else {
        panic!("not an rbd pool");
    };
    let base = Base {
        path: "bigfleet/golden".to_owned(),
        format: "raw".to_owned(),
        overlay_bytes: 20 << 30,
        rbd: Some(source),
    };
    let spec = spec_on(
        &options(|o| o.storage_pool = "ceph".to_owned()),
        &disks,
        base,
    );
    assert_eq!(spec.disks.overlay, rbd_root_name(&spec.name));
    assert_eq!(
        spec.disks.data[0].volume,
        rbd_data_name(&spec.name, "data1")
    );
    for volume in [&spec.disks.overlay, &spec.disks.data[0].volume] {
        assert_eq!(owner_of(volume), Some(spec.name.as_str()));
    }
    insta::assert_snapshot!("rbd_disks", documents(&spec));
}

#[test]
fn dedicated_cpus_in_one_cell_on_huge_pages() {
    use bigfleet_libvirt_ports::claims::Pinning;

    use crate::render::placement::Placed;
    let placed = Placed {
        pinning: Some(Pinning {
            cpus: vec![6, 7],
            cell: Some(1),
        }),
        shared: None,
        hugepage_kib: Some(2048),
        devices: Vec::new(),
    };
    let spec = DomainSpec {
        placed,
        ..spec_with(&options(|_| {}))
    };
    insta::assert_snapshot!("dedicated_hugepages", documents(&spec));
}

#[test]
fn passthrough_devices_a_gpu_a_vf_and_an_mdev() {
    use crate::render::passthrough::{DeviceKey, PciAddress, PlacedDevice};
    use crate::render::placement::Placed;
    let pci = |bus, function| {
        DeviceKey::Pci(PciAddress {
            domain: 0,
            bus,
            slot: 0,
            function,
        })
    };
    let placed = Placed {
        devices: vec![
            PlacedDevice {
                key: pci(0x3b, 0),
                vf: false,
                vlan: None,
            },
            PlacedDevice {
                key: pci(0x17, 2),
                vf: true,
                vlan: None,
            },
            PlacedDevice {
                key: DeviceKey::Mdev("4b20d080-1b54-4048-85b3-a6a62d165c01".to_owned()),
                vf: false,
                vlan: None,
            },
        ],
        ..Placed::default()
    };
    let spec = DomainSpec {
        placed,
        ..spec_with(&options(|_| {}))
    };
    insta::assert_snapshot!("passthrough", documents(&spec));
}

#[test]
fn a_shared_machine_keeps_off_the_dedicated_cpus() {
    use crate::render::placement::Placed;
    let placed = Placed {
        shared: Some(crate::options::CpuSet::parse("0-1,8-15").unwrap()),
        ..Placed::default()
    };
    let spec = DomainSpec {
        placed,
        ..spec_with(&options(|_| {}))
    };
    let domain = documents(&spec);
    assert!(
        domain.contains("<vcpu placement='static' cpuset='0-1,8-15'>2</vcpu>"),
        "{domain}"
    );
    assert!(!domain.contains("<cputune>"), "{domain}");
}

#[test]
fn efi_firmware() {
    let options = options(|o| o.platform.firmware = Firmware::Efi);
    insta::assert_snapshot!("efi", documents(&spec_with(&options)));
}

#[test]
fn a_virtual_tpm_on_efi() {
    let options = options(|o| o.platform.firmware = Firmware::Efi);
    let spec = DomainSpec {
        tpm: true,
        ..spec_with(&options)
    };
    insta::assert_snapshot!("tpm_efi", documents(&spec));
}

/// A Secure Boot type on a host whose `--firmware` is BIOS: the type's domains still boot
/// UEFI, with Secure Boot on, the enrolled keys, and SMM.
#[test]
fn secure_boot_with_a_tpm() {
    let spec = DomainSpec {
        tpm: true,
        secure_boot: true,
        ..spec_with(&options(|_| {}))
    };
    insta::assert_snapshot!("secure_boot_tpm", documents(&spec));
}

/// A type that boots by Ignition: with the firmware configuration delivery the domain names
/// the config's file as QEMU's `opt/com.coreos/config`; with a config drive it gets a
/// read-only disk on the seed's bus after the data disks instead. The config's volume is
/// the domain's by its name (Delete and orphan collection find it).
#[test]
fn ignition_by_fw_cfg_and_by_config_drive() {
    let setup = |delivery| {
        let template = br#"{"ignition": {"version": "3.3.0"}}"#;
        IgnitionSetup::parse(template, "t.ign", delivery).unwrap()
    };
    let fw_cfg = options(|o| o.ignition = Some(setup(IgnitionDelivery::FwCfg)));
    let spec = spec_with(&fw_cfg);
    let disk = spec.disks.ignition.as_ref().unwrap();
    assert_eq!(disk.volume, ignition_name(&spec.name));
    assert_eq!(owner_of(&disk.volume), Some(spec.name.as_str()));
    insta::assert_snapshot!("ignition_fw_cfg", documents(&spec));
    let drive = options(|o| {
        o.ignition = Some(setup(IgnitionDelivery::ConfigDrive));
        o.platform.seed_bus = SeedBus::Sata;
    });
    insta::assert_snapshot!("ignition_config_drive_sata", documents(&spec_with(&drive)));
}

#[test]
fn seed_on_sata() {
    let options = options(|o| o.platform.seed_bus = SeedBus::Sata);
    insta::assert_snapshot!("seed_sata", documents(&spec_with(&options)));
}

#[test]
fn qemu_emulation_with_a_directly_booted_kernel() {
    let options = options(|o| {
        o.platform.domain_type = DomainType::Qemu;
        o.platform.kernel = Some(DirectKernel {
            kernel: "/var/lib/bigfleet/vmlinuz".to_owned(),
            initrd: Some("/var/lib/bigfleet/initrd.img".to_owned()),
            cmdline: "console=ttyS0 root=/dev/vda1".to_owned(),
        });
    });
    insta::assert_snapshot!("qemu_direct_kernel", documents(&spec_with(&options)));
}

#[test]
fn efi_under_qemu_with_a_direct_kernel_and_no_initrd() {
    let options = options(|o| {
        o.platform.domain_type = DomainType::Qemu;
        o.platform.firmware = Firmware::Efi;
        o.platform.kernel = Some(DirectKernel {
            kernel: "/boot/vmlinuz".to_owned(),
            initrd: None,
            cmdline: "console=ttyS0".to_owned(),
        });
    });
    insta::assert_snapshot!("qemu_efi_direct_kernel", documents(&spec_with(&options)));
}

#[test]
fn no_nic() {
    let options = options(|o| o.network = String::new());
    let spec = spec_with(&options);
    assert!(spec.nics.is_empty());
    insta::assert_snapshot!("no_nic", documents(&spec));
}

#[test]
fn a_bridge_nic() {
    let options = options(|o| o.nics = vec![nic("bridge=br0")]);
    insta::assert_snapshot!("nic_bridge", documents(&spec_with(&options)));
}

#[test]
fn a_macvtap_nic_in_each_mode() {
    for mode in ["bridge", "vepa", "private", "passthrough"] {
        let options = options(|o| o.nics = vec![nic(&format!("direct=eth1:{mode}"))]);
        insta::assert_snapshot!(
            format!("nic_direct_{mode}"),
            documents(&spec_with(&options))
        );
    }
}

#[test]
fn several_nics_each_with_its_own_mac() {
    let options = options(|o| {
        o.nics = vec![
            nic("network=default"),
            nic("bridge=br-storage"),
            nic("direct=enp3s0"),
        ];
    });
    let spec = spec_with(&options);
    let macs: std::collections::BTreeSet<_> = spec.nics.iter().map(|n| n.mac).collect();
    assert_eq!(
        macs.len(),
        3,
        "every NIC has its own address: {:?}",
        spec.nics
    );
    insta::assert_snapshot!("nics_several", documents(&spec));
}

#[test]
fn each_cpu_choice() {
    for (name, choice) in [
        ("host_passthrough", "host-passthrough"),
        ("host_model", "host-model"),
        ("custom", "Skylake-Server"),
        ("custom_features", "qemu64,+svm,-pcid"),
        ("host_model_features", "host-model,-vmx"),
    ] {
        let options = options(|o| o.cpu = Some(cpu(choice)));
        insta::assert_snapshot!(format!("cpu_{name}"), documents(&spec_with(&options)));
    }
}

#[test]
fn a_custom_cpu_under_qemu_emulation() {
    let options = options(|o| {
        o.platform.domain_type = DomainType::Qemu;
        o.cpu = Some(cpu("qemu64,+sse4.2"));
    });
    insta::assert_snapshot!("cpu_custom_qemu", documents(&spec_with(&options)));
}

#[test]
fn an_instance_types_own_cpu_and_nics_win_over_the_defaults() {
    let options = options(|o| {
        o.cpu = Some(cpu("host-model"));
        o.nics = vec![nic("network=default")];
        o.instance_cpu = BTreeMap::from([(INSTANCE_TYPE.to_owned(), cpu("Icelake-Server"))]);
        o.instance_nics = BTreeMap::from([(
            INSTANCE_TYPE.to_owned(),
            vec![nic("bridge=br0"), nic("network=isolated")],
        )]);
    });
    let spec = spec_with(&options);
    assert_eq!(spec.cpu, Some(cpu("Icelake-Server")));
    let sources: Vec<_> = spec.nics.iter().map(|n| n.source.to_string()).collect();
    assert_eq!(sources, ["bridge=br0", "network=isolated"]);
}

#[test]
fn the_spec_names_the_domain_its_volumes_and_this_incarnation() {
    let spec = spec_with(&options(|_| {}));
    let name = bigfleet_libvirt_config::naming::domain_name(PROVIDER, MACHINE);
    assert_eq!(spec.disks.overlay, overlay_name(&name));
    assert_eq!(spec.disks.seed, seed_name(&name));
    assert_eq!(owner_of(&spec.disks.seed), Some(name.as_str()));
    assert_eq!(spec.disks.console, console_name(&name));
    assert_eq!(owner_of(&spec.disks.console), Some(name.as_str()));
    assert_eq!(spec.instance_id, seed::instance_id(&name, "op-7"));
    assert_eq!(spec.tag, Tag::new(PROVIDER, MACHINE));
    assert_eq!(spec.name, name);
    // Pure: the same inputs give the same value.
    assert_eq!(spec, spec_with(&options(|_| {})));
}
