//! The operator's flags, declared once: clap's derive reads the names, defaults, help and
//! `BIGFLEET_LIBVIRT_<FLAG>` variables from here, the binary flattens [`Flags`] into its
//! command line, and benchmarks and tests build the same values with [`Flags::parse_args`],
//! so no caller copies a default by hand.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser};

/// Every flag that shapes the launch plan, as typed values. Field names are the flag names.
/// A path flag set to the empty string is unset (`None`), as its default is.
#[derive(clap::Args, Clone, Debug)]
pub struct Flags {
    /// gRPC listen address (`:PORT` listens on every interface).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_ADDR",
        default_value = ":9000"
    )]
    pub addr: String,
    /// Label stamped on every HostRef.provider and used in machine ids.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_PROVIDER",
        default_value = "libvirt"
    )]
    pub provider: String,
    /// libvirt | fake | auto (auto = libvirt when --connect is set, else the fake).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_LIBVIRT_BACKEND",
        default_value = "auto"
    )]
    pub libvirt_backend: String,
    /// Force the in-memory fake hypervisor whatever else is set (conformance runs).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_USE_FAKE_BACKEND", action = ArgAction::Set,
          num_args = 0..=1, default_value_t = false, default_missing_value = "true")]
    pub use_fake_backend: bool,
    /// A bare libvirt URI for --default-zone, or a zone=uri,... list (one libvirt host per zone).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_CONNECT",
        default_value = ""
    )]
    pub connect: String,
    /// Zone label for a single bare --connect URI; also the stem of the fake's zones.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_DEFAULT_ZONE",
        default_value = "local"
    )]
    pub default_zone: String,
    /// Durable state file (redb); empty = in-memory only, nothing survives a restart.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_STATE",
        default_value = "",
        value_parser = optional_path
    )]
    pub state: ::std::option::Option<PathBuf>,
    /// Golden base-image volume in --storage-pool (required by the libvirt backend).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_IMAGE",
        default_value = ""
    )]
    pub image: String,
    /// Local qcow2 or raw golden image: uploaded to every host's --storage-pool that lacks it,
    /// as a volume named after its sha256 (--image may then be empty, or must name it).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_IMAGE_SOURCE")]
    pub image_source: Option<PathBuf>,
    /// Storage pool for roots and data disks (libvirt backend): a local pool (qcow2 overlays)
    /// or an rbd pool (copy-on-write clones of the golden image).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_STORAGE_POOL",
        default_value = "default"
    )]
    pub storage_pool: String,
    /// Local (dir) pool for the cloud-init seeds (libvirt backend); empty = --storage-pool.
    /// Required when --storage-pool is an rbd pool.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_SEED_POOL",
        default_value = ""
    )]
    pub seed_pool: String,
    /// libvirt network for the domain NIC (libvirt backend); empty = no NIC.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_NETWORK",
        default_value = "default"
    )]
    pub network: String,
    /// A NIC of every domain, in order, replacing --network's: network=NAME, bridge=NAME,
    /// ovs=NAME (an Open vSwitch bridge) or direct=DEVICE[:bridge|vepa|private|passthrough]
    /// (libvirt backend; repeatable; the variable takes several, separated by ';').
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_NIC",
        value_name = "SOURCE",
        value_delimiter = ';'
    )]
    pub nic: Vec<String>,
    /// The NICs of one instance type instead, as TYPE:SOURCE (repeatable, one NIC each; the
    /// variable takes several, separated by ';').
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_INSTANCE_NIC",
        value_name = "TYPE:SOURCE",
        value_delimiter = ';'
    )]
    pub instance_nic: Vec<String>,
    /// Guest CPU: host-passthrough, host-model or a model name, optionally with ,+feature or
    /// ,-feature (libvirt backend; default host-passthrough on kvm, QEMU's model on qemu).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_CPU")]
    pub cpu: Option<String>,
    /// The guest CPU of one instance type instead, as TYPE:CPU (repeatable; the variable
    /// takes several, separated by ';').
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_INSTANCE_CPU",
        value_name = "TYPE:CPU",
        value_delimiter = ';'
    )]
    pub instance_cpu: Vec<String>,
    /// Domain type: kvm, or qemu for software emulation where KVM cannot run guests.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_DOMAIN_TYPE",
        default_value = "kvm"
    )]
    pub domain_type: String,
    /// Guest firmware: bios, or efi for UEFI (OVMF chosen by libvirt, Secure Boot off).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_FIRMWARE",
        default_value = "bios"
    )]
    pub firmware: String,
    /// The NoCloud seed's bus: virtio (a read-only virtio disk), or sata (a SATA CD-ROM, for
    /// images that look for their seed on an optical drive only).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_SEED_BUS",
        default_value = "virtio"
    )]
    pub seed_bus: String,
    /// Direct kernel boot: kernel path on the libvirt host; empty = boot the image's disk.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_GUEST_KERNEL",
        default_value = ""
    )]
    pub guest_kernel: String,
    /// Direct kernel boot: initramfs path on the libvirt host (needs --guest-kernel).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_GUEST_INITRD",
        default_value = ""
    )]
    pub guest_initrd: String,
    /// Direct kernel boot: kernel command line (needs --guest-kernel).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_GUEST_CMDLINE",
        default_value = ""
    )]
    pub guest_cmdline: String,
    /// Cloud-init user-data file baked into every new domain (libvirt backend).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_BASE_USER_DATA",
        default_value = "",
        value_parser = optional_path
    )]
    pub base_user_data: ::std::option::Option<PathBuf>,
    /// on_demand (Delete implemented) or bare_metal (fixed pool) for the built-in offerings.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_CAPACITY_TYPE",
        default_value = "on_demand"
    )]
    pub capacity_type: String,
    /// JSON catalog name -> {vcpu, memory_mib}; replaces the built-in kvm.* sizes.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_INSTANCE_TYPES",
        default_value = "",
        value_parser = optional_path
    )]
    pub instance_types: ::std::option::Option<PathBuf>,
    /// JSON device classes name -> {resource, pci|mdev|vf}: the passthrough hardware
    /// instance types may ask for (docs/placement.md).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_DEVICE_CLASSES",
        default_value = "",
        value_parser = optional_path
    )]
    pub device_classes: ::std::option::Option<PathBuf>,
    /// JSON list of static address pools, one per offering ({instance_type, zone, cidr,
    /// first, gateway, dns, search, vlan}): slot i gets first + i on its first NIC instead of
    /// DHCP (libvirt backend; docs/libvirt.md §3.7).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_ADDRESS_POOLS",
        default_value = "",
        value_parser = optional_path
    )]
    pub address_pools: ::std::option::Option<PathBuf>,
    /// Ignition config (JSON, spec 3.x) that machines of the types with "boot": "ignition"
    /// get at first boot, with the join blob merged in as /etc/bigfleet/join (libvirt
    /// backend; docs/libvirt.md §5.14).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_IGNITION_TEMPLATE",
        default_value = "",
        value_parser = optional_path
    )]
    pub ignition_template: ::std::option::Option<PathBuf>,
    /// How the Ignition config reaches the guest: fw-cfg (QEMU's firmware configuration
    /// entry opt/com.coreos/config; the default) or config-drive (an OpenStack config drive).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_IGNITION_DELIVERY",
        default_value = ""
    )]
    pub ignition_delivery: String,
    /// Explicit USD/hour prices, type=usd,...
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_PRICES",
        default_value = ""
    )]
    pub prices: String,
    /// Synthetic USD/hour per vCPU.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_PRICE_PER_VCPU_HOUR",
        default_value_t = 0.0030
    )]
    pub price_per_vcpu_hour: f64,
    /// Synthetic USD/hour per GiB of RAM.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_PRICE_PER_GIB_HOUR",
        default_value_t = 0.0008
    )]
    pub price_per_gib_hour: f64,
    /// JSON offerings file; empty = a built-in mix sized by --seed-count.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_OFFERINGS",
        default_value = "",
        value_parser = optional_path
    )]
    pub offerings: ::std::option::Option<PathBuf>,
    /// Speculative slots in the built-in offerings (values <= 0 mean 16).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_SEED_COUNT",
        default_value_t = 32
    )]
    pub seed_count: i64,
    /// Background reconcile interval (0 = off), e.g. 30s, 2m.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_RECONCILE_INTERVAL", default_value = "2m",
          value_parser = parse_duration)]
    pub reconcile_interval: Duration,
    /// HTTP address for /metrics, /healthz, /readyz; empty disables it.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_METRICS_ADDR",
        default_value = ":9090"
    )]
    pub metrics_addr: String,
    /// Register gRPC server reflection (v1 and v1alpha).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_REFLECTION", action = ArgAction::Set,
          num_args = 0..=1, default_value_t = true, default_missing_value = "true")]
    pub reflection: bool,
    /// Server certificate (PEM); enables TLS 1.3. Reloaded when the file changes or on SIGHUP.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_TLS_CERT",
        default_value = "",
        value_parser = optional_path
    )]
    pub tls_cert: ::std::option::Option<PathBuf>,
    /// Server private key (PEM).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_TLS_KEY",
        default_value = "",
        value_parser = optional_path
    )]
    pub tls_key: ::std::option::Option<PathBuf>,
    /// Client CA bundle (PEM); enables mTLS (client certificates required and verified).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_TLS_CA",
        default_value = "",
        value_parser = optional_path
    )]
    pub tls_ca: ::std::option::Option<PathBuf>,
    /// Under mTLS: enforce (default) checks every call against the client certificate's
    /// bigfleet:// identity; off lets every verified client call everything. Needs --tls-ca.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_CLIENT_IDENTITY")]
    pub client_identity: Option<String>,
    /// Fake only: honour the conformance fault hooks (fault slots and fault-* cluster ids).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_FAKE_FAULT_HOOKS", action = ArgAction::Set,
          num_args = 0..=1, default_value_t = false, default_missing_value = "true")]
    pub fake_fault_hooks: bool,
    /// Override every transition deadline (e.g. 2s); default Create 5m, Configure 8m, Drain 15m, Delete 5m.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_TRANSITION_TIMEOUT", value_parser = parse_duration)]
    pub transition_timeout: Option<Duration>,
    /// libvirt: physical CPUs per host kept for the host itself (not offered to slots).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_HOST_RESERVE_CPU",
        default_value_t = 1
    )]
    pub host_reserve_cpu: u32,
    /// libvirt: MiB of RAM per host kept for the host itself (not offered to slots).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_HOST_RESERVE_MEMORY_MIB",
        default_value_t = 2048
    )]
    pub host_reserve_memory_mib: u64,
    /// libvirt: the host CPUs (e.g. 4-15) that machines of a dedicated_cpus instance type are
    /// pinned to, one vCPU each; every other machine keeps to the host's other CPUs.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_DEDICATED_CPUS",
        default_value = ""
    )]
    pub dedicated_cpus: String,
    /// libvirt: vCPUs offered per remaining physical CPU of a host.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_CPU_ALLOCATION_RATIO",
        default_value_t = 4.0
    )]
    pub cpu_allocation_ratio: f64,
    /// libvirt: MiB offered per remaining MiB of host RAM (1 = no memory overcommit).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_MEMORY_ALLOCATION_RATIO",
        default_value_t = 1.0
    )]
    pub memory_allocation_ratio: f64,
    /// libvirt: bytes of virtual disk offered per byte of a host's storage pool (1 = the
    /// machines' disks could all be written full; thin pools may take more).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_DISK_ALLOCATION_RATIO",
        default_value_t = 1.0
    )]
    pub disk_allocation_ratio: f64,
    /// libvirt: delete orphaned domains and volumes after --orphan-grace (default: report only).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_GC_ORPHANS", action = ArgAction::Set,
          num_args = 0..=1, default_value_t = false, default_missing_value = "true")]
    pub gc_orphans: bool,
    /// libvirt: how long an orphan must be seen before it may be collected, e.g. 15m.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_ORPHAN_GRACE", default_value = "15m",
          value_parser = parse_duration)]
    pub orphan_grace: Duration,
    /// libvirt: the most libvirt calls in flight per host, all lanes together; keep it
    /// below the host's libvirtd `max_client_requests` (default 5).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_HOST_BUDGET",
          default_value_t = bigfleet_libvirt_ports::lanes::DEFAULT_HOST_BUDGET)]
    pub host_budget: usize,
    /// libvirt: of --host-budget, the most guest-agent calls in flight per host.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_AGENT_BUDGET",
          default_value_t = bigfleet_libvirt_ports::lanes::DEFAULT_AGENT_BUDGET)]
    pub agent_budget: usize,
    /// libvirt: connections per host, over which --host-budget's calls are spread (unset:
    /// enough that none carries more than two calls: 4 for the default --host-budget 7).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_HOST_CONNECTIONS")]
    pub host_connections: Option<usize>,
    /// libvirt: the hosts' libvirtd `max_client_requests` (libvirtd.conf, virtqemud.conf),
    /// which libvirt cannot report: the connections are sized so that none reaches it. At
    /// least 3; the smallest value among the hosts.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_HOST_MAX_CLIENT_REQUESTS",
          default_value_t = bigfleet_libvirt_ports::lanes::LIBVIRTD_DEFAULT_MAX_CLIENT_REQUESTS)]
    pub host_max_client_requests: usize,
    /// Fake only: shortest simulated hypervisor latency.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_FAKE_DELAY_MIN", default_value = "20ms",
          value_parser = parse_duration)]
    pub fake_delay_min: Duration,
    /// Fake only: longest simulated hypervisor latency.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_FAKE_DELAY_MAX", default_value = "200ms",
          value_parser = parse_duration)]
    pub fake_delay_max: Duration,
    /// Fake only: seed of the latency generator.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_FAKE_SEED",
        default_value_t = 1
    )]
    pub fake_seed: u64,
}

/// Parses [`Flags`] alone from `args` (no binary name), with every other flag at its
/// default and `BIGFLEET_LIBVIRT_<FLAG>` variables read as the binary reads them.
#[derive(Parser)]
#[command(no_binary_name = true)]
struct FlagsOnly {
    #[command(flatten)]
    flags: Flags,
}

impl Flags {
    /// The flags `args` set (e.g. `["--seed-count", "8"]`), the rest at their defaults.
    ///
    /// # Errors
    /// clap's error for an unknown flag or a value it refuses.
    pub fn parse_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        FlagsOnly::try_parse_from(args).map(|only| only.flags)
    }
}

/// A duration flag: `0`, or a humantime value such as `500ms`, `30s`, `2m`.
///
/// # Errors
/// The parse error, with examples of the accepted form.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    if raw.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(raw.trim()).map_err(|e| format!("{e} (use e.g. 500ms, 30s, 2m, 1h)"))
}

/// A path flag: the empty string is unset.
///
/// # Errors
/// Never; the `Result` is the shape clap's value parsers take.
pub fn optional_path(raw: &str) -> Result<Option<PathBuf>, String> {
    Ok((!raw.is_empty()).then(|| PathBuf::from(raw)))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::Flags;
    use bigfleet_libvirt_ports::lanes::{DEFAULT_AGENT_BUDGET, DEFAULT_HOST_BUDGET};

    #[test]
    fn parse_args_sets_what_it_is_given_and_leaves_the_declared_defaults() {
        let flags = Flags::parse_args(["--seed-count", "8", "--state=/var/lib/p.redb"])
            .expect("the flags parse");
        assert_eq!(flags.seed_count, 8);
        assert_eq!(flags.state, Some(PathBuf::from("/var/lib/p.redb")));
        assert_eq!(flags.addr, ":9000");
        assert_eq!(flags.reconcile_interval, Duration::from_secs(120));
        assert_eq!(flags.orphan_grace, Duration::from_secs(15 * 60));
        assert_eq!(flags.host_budget, DEFAULT_HOST_BUDGET);
        assert_eq!(flags.agent_budget, DEFAULT_AGENT_BUDGET);
        assert_eq!(flags.offerings, None);
        assert!(flags.reflection && !flags.use_fake_backend);
    }

    #[test]
    fn an_empty_path_is_unset_and_a_bad_value_names_the_flag() {
        let flags = Flags::parse_args(["--state=", "--tls-ca="]).expect("the flags parse");
        assert_eq!((flags.state, flags.tls_ca), (None, None));
        let error = Flags::parse_args(["--reconcile-interval=soon"])
            .expect_err("a bad duration is refused")
            .to_string();
        assert!(error.contains("--reconcile-interval"), "{error}");
        assert!(error.contains("30s"), "{error}");
    }
}
