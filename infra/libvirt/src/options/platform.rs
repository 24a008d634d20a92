//! How every domain is virtualised and booted (`--domain-type`, `--guest-kernel`,
//! `--firmware`, `--seed-bus`), as plain values. Their XML is `render::xml`'s.

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

/// The bus the NoCloud seed is attached on (`--seed-bus`). cloud-init finds the seed by its
/// file-system label `cidata` on any block device, so the bus only has to be one the image's
/// kernel drives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SeedBus {
    /// A read-only virtio-blk disk (`vdb`): the image already needs the virtio-blk driver for
    /// its root disk (`vda`), so every image the provider can boot can read it.
    #[default]
    Virtio,
    /// A read-only SATA CD-ROM (`sda`), the reference's choice: for images whose
    /// initialisation looks for its seed on an optical drive only. Needs an AHCI driver in
    /// the image (Debian's cloud kernel, for one, has none).
    Sata,
}

impl SeedBus {
    /// The flag value.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Virtio => "virtio",
            Self::Sata => "sata",
        }
    }
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
    /// Where the NoCloud seed is attached.
    pub seed_bus: SeedBus,
}
