//! What doctor judges: the facts the probe read from each host ([`HostFacts`]) and what the
//! flags would run there ([`Expectations`]).

use std::collections::{BTreeMap, BTreeSet};

use bigfleet_libvirt_domain::catalog::{DeviceClasses, DiskShape, Placement};
use std::sync::Arc;

use crate::options::{Budget, CapacityPolicy, GoldenImage, IgnitionDelivery};
use crate::render::passthrough::DeviceKey;
use crate::render::placement::Topology;

/// A probe's answer about one object on a host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe<T> {
    /// It exists; what it looks like.
    Found(T),
    /// It does not exist.
    Missing,
    /// The host's driver cannot answer this question (the reason).
    Unsupported(String),
    /// The question failed (the error).
    Failed(String),
}

/// The connection to one host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    /// libvirt's driver name (`QEMU`, `TEST`).
    pub driver: String,
    /// libvirt's version, `major * 1_000_000 + minor * 1000 + release`.
    pub libvirt_version: u32,
    /// The hypervisor's version, in the same encoding.
    pub hypervisor_version: u32,
    /// Physical CPUs.
    pub cpus: u32,
    /// Memory in KiB.
    pub memory_kib: u64,
}

/// What the host says about running the provider's domains.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainCaps {
    /// The machine type the `q35` alias resolves to.
    pub machine: String,
    /// Whether the host boots guests of that type (`<os supported='yes'>`).
    pub os_supported: bool,
    /// Whether a `unix` channel (the guest-agent channel) is supported; `None` when this
    /// libvirt does not list channel types.
    pub unix_channel: Option<bool>,
    /// Whether libvirt can give a domain an emulated TPM (`<tpm>`'s `backendModel` lists
    /// `emulator`, as it does once swtpm is installed); `None` when this libvirt does not
    /// list TPM support.
    pub tpm_emulator: Option<bool>,
    /// Whether libvirt has a UEFI firmware build that enforces Secure Boot (the `<os>`
    /// loader's `secure` values list `yes`); `None` when this libvirt does not list them.
    pub secure_boot: Option<bool>,
}

/// A storage pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    /// Its type (`dir`, `logical`, …).
    pub kind: String,
    /// Whether it is active.
    pub active: bool,
    /// Capacity in bytes.
    pub capacity: u64,
    /// Free bytes.
    pub available: u64,
    /// The cluster and its secret when this is an rbd pool.
    pub rbd: Option<RbdFacts>,
}

/// An rbd pool's cluster, as its definition states it, and whether its libvirt secret is
/// defined on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdFacts {
    /// The Ceph pool, monitors and cephx user.
    pub source: crate::render::rbd::RbdSource,
    /// The secret the definition names (found when there is no `<auth>`).
    pub secret: Probe<()>,
}

/// A storage volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    /// Its format (`qcow2`, `raw`).
    pub format: String,
    /// Virtual size in bytes.
    pub capacity: u64,
}

/// The domains on a host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Domains {
    /// Domains tagged as this provider's.
    pub ours: usize,
    /// Of those, how many run.
    pub ours_running: usize,
    /// This provider's domains for machine ids no configured slot has (their names).
    pub orphans: Vec<String>,
    /// Domains of anybody else.
    pub others: usize,
}

/// Everything the probe read from one host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostFacts {
    /// The zone.
    pub zone: String,
    /// The `--connect` URI.
    pub uri: String,
    /// The connection, or why it failed. When it failed nothing else was read.
    pub connection: Result<Connection, String>,
    /// Domain capabilities for `--domain-type`.
    pub domain_caps: Probe<DomainCaps>,
    /// `--storage-pool`.
    pub pool: Probe<Pool>,
    /// `--seed-pool` when it is another pool than `--storage-pool` (`None`: the same).
    pub seed_pool: Option<Probe<Pool>>,
    /// `--image` in that pool.
    pub image: Probe<Volume>,
    /// `--network` and whether it is active; `None` when `--network` is empty.
    pub network: Option<Probe<bool>>,
    /// The domains on the host.
    pub domains: Probe<Domains>,
    /// `--trial-domain`: how each CPU choice's trial domain fared; `None` when not asked.
    pub cpu_trials: Option<Vec<CpuTrial>>,
    /// libvirtd's `max_client_requests` for this connection (read through libvirt's admin
    /// API where the bindings allow it; the `virt` crate has none, so the probe reports
    /// it unsupported and the judgement assumes libvirtd's default).
    pub max_client_requests: Probe<usize>,
    /// libvirtd's `max_workers`, the calls it executes at once for all clients together
    /// (read the same way, so unsupported too).
    pub max_workers: Probe<usize>,
    /// The host's CPU and huge page topology and its free huge pages by size; read only
    /// when some type holds part of a host alone or `--dedicated-cpus` is set (`None`).
    pub topology: Option<Probe<(Topology, BTreeMap<u64, u64>)>>,
    /// The passthrough devices the host's domains hold (any domain's); read with the
    /// topology when some type asks for devices (`None` otherwise).
    pub held_devices: Option<BTreeSet<DeviceKey>>,
}

/// One CPU choice tried on a throw-away paused domain (`doctor --trial-domain`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuTrial {
    /// The choice as `--cpu` spells it, or the platform default named as such.
    pub cpu: String,
    /// Whether it is `host-passthrough` or `host-model` (a host CPU mode, KVM only).
    pub host_cpu: bool,
    /// The instance types whose domains would use it.
    pub used_by: Vec<String>,
    /// What was seen when QEMU stayed up, or why the domain did not start or stay up.
    pub outcome: Result<String, String>,
}

/// One instance type's slots in one zone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slots {
    /// The instance type.
    pub instance_type: String,
    /// How many slots the offerings declare.
    pub count: usize,
    /// vCPUs per slot.
    pub vcpu: u64,
    /// MiB per slot.
    pub memory_mib: u64,
    /// The type's root size and data disks.
    pub disks: DiskShape,
    /// The type's huge pages and dedicated CPUs.
    pub placement: Placement,
    /// The type's passthrough devices: a count per class.
    pub devices: BTreeMap<String, u32>,
    /// Whether the type has a virtual TPM.
    pub tpm: bool,
    /// Whether the type boots with UEFI Secure Boot.
    pub secure_boot: bool,
}

/// What the flags would run.
#[derive(Clone, Debug)]
pub struct Expectations {
    /// `--image`.
    pub image: String,
    /// `--image-source`, read and hashed (then `image` is its volume).
    pub image_source: Option<Arc<GoldenImage>>,
    /// `--storage-pool`.
    pub storage_pool: String,
    /// `--seed-pool`, resolved (`--storage-pool` when not given).
    pub seed_pool: String,
    /// `--network` (empty: no NIC).
    pub network: String,
    /// `--domain-type`.
    pub domain_type: String,
    /// `--base-user-data`: its path and size, or the read error; `None` when unset.
    pub user_data: Option<(String, Result<usize, String>)>,
    /// The allocation ratios and reserves.
    pub capacity: CapacityPolicy,
    /// Per zone, the slots the offerings declare.
    pub slots: Vec<(String, Vec<Slots>)>,
    /// `--host-budget` and `--agent-budget`.
    pub budget: Budget,
    /// Connections per host (`--host-connections`, resolved).
    pub connections: usize,
    /// The hosts' `max_client_requests` as stated (`--host-max-client-requests`).
    pub max_client_requests: usize,
    /// `--device-classes`.
    pub classes: DeviceClasses,
    /// How Ignition configs reach the guests (`--ignition-delivery`), when a type boots by
    /// Ignition (`--ignition-template` given).
    pub ignition: Option<IgnitionDelivery>,
}
