//! The platform and device flags of the libvirt backend (`--domain-type`, `--firmware`,
//! `--seed-bus`, the direct-boot kernel, `--nic`, `--instance-nic`, `--cpu` and
//! `--instance-cpu`), checked against each other, the platform and the instance-type catalog,
//! and the static address pools (`--address-pools`), booked against the slots. Every refusal
//! names the flag and the accepted forms.

use std::collections::BTreeMap;
use std::io::Read;

use bigfleet_libvirt_domain::Machine;
use bigfleet_libvirt_domain::catalog::InstanceCatalog;
use bigfleet_libvirt_libvirt::{
    AddressPools, CpuChoice, DirectKernel, DomainConfig, DomainType, Firmware, NicSource, Platform,
    SeedBus, address_pools,
};

use super::{Flags, LaunchError, flag};

/// Refuses a Secure Boot type among `slots` when the domains boot a kernel directly
/// (`--guest-kernel`): the firmware then never checks a signed boot loader, so Secure Boot
/// would be claimed and not kept.
pub(super) fn check_secure_boot(
    libvirt: &DomainConfig,
    catalog: &InstanceCatalog,
    slots: &[Machine],
) -> Result<(), LaunchError> {
    if libvirt.platform.kernel.is_none() {
        return Ok(());
    }
    let secure = (slots.iter())
        .map(|m| m.instance_type.as_str())
        .find(|name| catalog.get(name).is_some_and(|t| t.secure_boot));
    match secure {
        Some(name) => Err(flag(format!(
            "instance type {name:?} asks for secure_boot, and --guest-kernel boots a kernel \
             directly, past the firmware's signature check; boot the image's own signed boot \
             loader (drop --guest-kernel) or drop secure_boot from the type"
        ))),
        None => Ok(()),
    }
}

/// Books `--address-pools` (when given) against `slots`, into `libvirt`'s address book.
pub(super) fn address_book(
    flags: &Flags,
    slots: &[Machine],
    libvirt: &mut DomainConfig,
) -> Result<(), LaunchError> {
    let Some(path) = &flags.address_pools else {
        return Ok(());
    };
    let source = path.display().to_string();
    let text = read_limited(
        address_pools::FLAG,
        path,
        address_pools::MAX_FILE_BYTES,
        "a pools file holds a few lines per offering",
    )?;
    let pools = AddressPools::parse(&text, &source).map_err(flag)?;
    libvirt.addresses = pools
        .book(slots, |instance_type| libvirt.nic_sources(instance_type))
        .map_err(flag)?;
    Ok(())
}

/// The bytes of the file `path` that flag `name` gives, refused above `max` bytes (`why`
/// says what the file should hold) without reading past it.
pub(super) fn read_limited(
    name: &str,
    path: &std::path::Path,
    max: u64,
    why: &str,
) -> Result<Vec<u8>, LaunchError> {
    let source = path.display();
    let mut bytes = Vec::new();
    let read =
        std::fs::File::open(path).and_then(|file| file.take(max + 1).read_to_end(&mut bytes));
    read.map_err(|e| flag(format!("{name} {source}: cannot read the file: {e}")))?;
    if bytes.len() as u64 > max {
        return Err(flag(format!(
            "{name} {source} is larger than {max} bytes; {why}"
        )));
    }
    Ok(bytes)
}

/// Fills `libvirt`'s NIC and CPU choices from `flags`.
pub(super) fn apply(
    flags: &Flags,
    catalog: &InstanceCatalog,
    libvirt: &mut DomainConfig,
) -> Result<(), LaunchError> {
    libvirt.nics = flags
        .nic
        .iter()
        .map(|text| NicSource::parse(text.trim()).map_err(|e| flag(format!("--nic: {e}"))))
        .collect::<Result<_, _>>()?;
    if !libvirt.nics.is_empty() && flags.network.trim() != "default" {
        return Err(flag(
            "--network and --nic both choose the NICs: give the network as --nic network=NAME \
             and drop --network",
        ));
    }
    if !libvirt.nics.is_empty() {
        // What `doctor` checks as the network: the first libvirt network the NICs name (none
        // when they only use bridges or macvtap, which it does not check).
        libvirt.network = libvirt
            .nics
            .iter()
            .find_map(|nic| match nic {
                NicSource::Network(name) => Some(name.clone()),
                _ => None,
            })
            .unwrap_or_default();
    }
    for text in &flags.instance_nic {
        let (instance_type, source) = per_type("--instance-nic", text, catalog)?;
        let source = NicSource::parse(source).map_err(|e| flag(format!("--instance-nic: {e}")))?;
        libvirt
            .instance_nics
            .entry(instance_type)
            .or_default()
            .push(source);
    }
    let domain_type = libvirt.platform.domain_type;
    if let Some(text) = flags.cpu.as_deref().filter(|t| !t.trim().is_empty()) {
        libvirt.cpu = Some(cpu("--cpu", text.trim(), domain_type)?);
    }
    let mut instance_cpu = BTreeMap::new();
    for text in &flags.instance_cpu {
        let (instance_type, choice) = per_type("--instance-cpu", text, catalog)?;
        let choice = cpu("--instance-cpu", choice, domain_type)?;
        if instance_cpu.insert(instance_type.clone(), choice).is_some() {
            return Err(flag(format!(
                "--instance-cpu names {instance_type} twice: give each instance type one CPU"
            )));
        }
    }
    libvirt.instance_cpu = instance_cpu;
    Ok(())
}

/// Splits `TYPE:VALUE` and checks the type is in the catalog.
fn per_type<'a>(
    name: &str,
    text: &'a str,
    catalog: &InstanceCatalog,
) -> Result<(String, &'a str), LaunchError> {
    let Some((instance_type, value)) = text.trim().split_once(':') else {
        return Err(flag(format!(
            "{name} {text:?} must be INSTANCE_TYPE:VALUE, e.g. kvm.large:{}",
            if name == "--instance-cpu" {
                "host-model"
            } else {
                "bridge=br0"
            }
        )));
    };
    if catalog.get(instance_type).is_none() {
        return Err(flag(format!(
            "{name} {text:?}: unknown instance type {instance_type:?}; the catalog has {}",
            catalog.names().join(", ")
        )));
    }
    Ok((instance_type.to_owned(), value))
}

/// Parses one CPU choice; a mode that needs KVM is refused under `--domain-type qemu`.
fn cpu(name: &str, text: &str, domain_type: DomainType) -> Result<CpuChoice, LaunchError> {
    let choice = CpuChoice::parse(text).map_err(|e| flag(format!("{name}: {e}")))?;
    if choice.needs_kvm() && domain_type == DomainType::Qemu {
        return Err(flag(format!(
            "{name} {text}: host-passthrough and host-model need KVM, and --domain-type qemu is \
             software emulation; name a model QEMU emulates (e.g. {name} qemu64) or leave it \
             unset for QEMU's default model"
        )));
    }
    Ok(choice)
}

/// `--seed-bus`: virtio (the default) or sata.
fn seed_bus(flags: &Flags) -> Result<SeedBus, LaunchError> {
    match flags.seed_bus.trim() {
        "" | "virtio" => Ok(SeedBus::Virtio),
        "sata" => Ok(SeedBus::Sata),
        other => Err(flag(format!(
            "--seed-bus must be virtio or sata (got {other:?}); sata attaches the cloud-init \
             seed as a SATA CD-ROM, for images that look for it on an optical drive only"
        ))),
    }
}

/// `--domain-type`, `--firmware`, `--seed-bus` and the direct-boot flags. The paths are on
/// the libvirt host, so only their shape can be checked here: absolute, and the initrd and
/// command line only with a kernel to go with them.
pub(super) fn platform(flags: &Flags) -> Result<Platform, LaunchError> {
    let domain_type = match flags.domain_type.trim() {
        "" | "kvm" => DomainType::Kvm,
        "qemu" => DomainType::Qemu,
        other => {
            return Err(flag(format!(
                "--domain-type must be kvm or qemu (got {other:?}); qemu is software \
                 emulation for hosts where KVM cannot run guests"
            )));
        }
    };
    let firmware = match flags.firmware.trim() {
        "" | "bios" => Firmware::Bios,
        "efi" => Firmware::Efi,
        other => {
            return Err(flag(format!(
                "--firmware must be bios or efi (got {other:?}); efi boots UEFI guests with \
                 the host's OVMF, which libvirt picks from its firmware descriptors"
            )));
        }
    };
    let seed_bus = seed_bus(flags)?;
    let kernel = flags.guest_kernel.trim();
    let initrd = flags.guest_initrd.trim();
    let cmdline = flags.guest_cmdline.trim();
    if kernel.is_empty() {
        if !initrd.is_empty() || !cmdline.is_empty() {
            return Err(flag(
                "--guest-initrd and --guest-cmdline only apply to direct kernel boot: set \
                 --guest-kernel too, or drop them to boot the image's own boot loader",
            ));
        }
        return Ok(Platform {
            domain_type,
            kernel: None,
            firmware,
            seed_bus,
        });
    }
    for (name, path) in [("--guest-kernel", kernel), ("--guest-initrd", initrd)] {
        if !path.is_empty() && !path.starts_with('/') {
            return Err(flag(format!(
                "{name} must be an absolute path on the libvirt host (got {path:?})"
            )));
        }
    }
    Ok(Platform {
        domain_type,
        kernel: Some(DirectKernel {
            kernel: kernel.to_owned(),
            initrd: (!initrd.is_empty()).then(|| initrd.to_owned()),
            cmdline: cmdline.to_owned(),
        }),
        firmware,
        seed_bus,
    })
}
