//! The operator's choices for the libvirt backend, whole: [`DomainConfig`] (one field per
//! libvirt flag) inside [`LibvirtConfig`] (everything the adapter is built from).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_config::HostConnection;
use bigfleet_libvirt_domain::Machine;
use bigfleet_libvirt_domain::catalog::InstanceCatalog;

use super::addresses::AddressBook;
use super::devices::{CpuChoice, NicSource};
use super::golden::GoldenImage;
use super::ignition::IgnitionSetup;
use super::platform::Platform;
use super::policies::{AgentPolicy, Budget, CapacityPolicy, GcPolicy, HostPolicy};
use bigfleet_libvirt_ports::lanes::LIBVIRTD_DEFAULT_MAX_CLIENT_REQUESTS;

/// The operator's choices for the libvirt backend: one field per libvirt flag, as the
/// composition root's launch plan validated it, used here as is. A new libvirt flag is a
/// field here (with its default), the clap flag in the binary, and its check in the plan.
#[derive(Clone, Debug)]
pub struct DomainConfig {
    /// The golden base-image volume (`--image`), in the storage pool.
    pub image: String,
    /// `--image-source`: uploaded to every host that lacks it; `image` is its volume name.
    pub image_source: Option<Arc<GoldenImage>>,
    /// The storage pool for roots and data disks (`--storage-pool`): a local pool (qcow2
    /// overlays) or an rbd pool (clones of the golden image).
    pub storage_pool: String,
    /// The pool for the cloud-init seeds (`--seed-pool`); empty = `storage_pool`. Must be a
    /// local pool: the seed is a file QEMU reads.
    pub seed_pool: String,
    /// The libvirt network for each domain's NIC (`--network`); empty = no NIC. Used when
    /// `nics` is empty.
    pub network: String,
    /// Every domain's NICs, in order (`--nic`); empty = the one NIC of `network`.
    pub nics: Vec<NicSource>,
    /// The NICs of one instance type instead (`--instance-nic TYPE:SOURCE`).
    pub instance_nics: BTreeMap<String, Vec<NicSource>>,
    /// The first NIC's fixed address of every slot a static address pool serves
    /// (`--address-pools`, booked against the slots by the launch plan); empty = DHCP.
    pub addresses: AddressBook,
    /// The guest CPU (`--cpu`); `None` = the platform's default.
    pub cpu: Option<CpuChoice>,
    /// The guest CPU of one instance type instead (`--instance-cpu TYPE:CPU`).
    pub instance_cpu: BTreeMap<String, CpuChoice>,
    /// Accelerator and boot method (`--domain-type`, `--guest-kernel`, …).
    pub platform: Platform,
    /// `--base-user-data`: the file the composition root reads at start-up into
    /// [`LibvirtConfig::user_data`].
    pub base_user_data: Option<PathBuf>,
    /// `--ignition-template` and `--ignition-delivery`, for the types that boot by
    /// Ignition (`None`: no type does).
    pub ignition: Option<IgnitionSetup>,
    /// Host capacity accounting (`--host-reserve-*`, `--*-allocation-ratio`).
    pub capacity: CapacityPolicy,
    /// Orphan collection (`--gc-orphans`, `--orphan-grace`).
    pub gc: GcPolicy,
    /// Calls in flight per host, and the agent's share (`--host-budget`, `--agent-budget`).
    pub budget: Budget,
    /// Connections per host, over which those calls are spread (`--host-connections`,
    /// resolved by [`fit_connections`](super::policies::fit_connections)). A host on
    /// libvirt's `test` driver gets one whatever this says: that driver keeps a separate
    /// in-memory host per connection.
    pub connections: usize,
    /// The hosts' libvirtd `max_client_requests` as the operator states it
    /// (`--host-max-client-requests`); `connections` keeps every connection below it.
    pub max_client_requests: usize,
}

impl Default for DomainConfig {
    /// No image, storage pool and network `default`, default platform and policies.
    fn default() -> Self {
        Self {
            image: String::new(),
            image_source: None,
            storage_pool: "default".to_owned(),
            seed_pool: String::new(),
            network: "default".to_owned(),
            nics: Vec::new(),
            instance_nics: BTreeMap::new(),
            addresses: AddressBook::default(),
            cpu: None,
            instance_cpu: BTreeMap::new(),
            platform: Platform::default(),
            base_user_data: None,
            ignition: None,
            capacity: CapacityPolicy::default(),
            gc: GcPolicy::default(),
            budget: Budget::default(),
            connections: super::policies::fit_connections(
                Budget::default(),
                None,
                LIBVIRTD_DEFAULT_MAX_CLIENT_REQUESTS,
            )
            .unwrap_or(1),
            max_client_requests: LIBVIRTD_DEFAULT_MAX_CLIENT_REQUESTS,
        }
    }
}

impl DomainConfig {
    /// The NIC sources of a domain of `instance_type`, in order.
    #[must_use]
    pub fn nic_sources(&self, instance_type: &str) -> Vec<NicSource> {
        if let Some(nics) = self.instance_nics.get(instance_type) {
            return nics.clone();
        }
        if !self.nics.is_empty() {
            return self.nics.clone();
        }
        if self.network.is_empty() {
            return Vec::new();
        }
        vec![NicSource::Network(self.network.clone())]
    }

    /// The pool the seeds go to: `--seed-pool`, or `--storage-pool` when that is empty.
    #[must_use]
    pub fn seed_pool(&self) -> &str {
        if self.seed_pool.is_empty() {
            &self.storage_pool
        } else {
            &self.seed_pool
        }
    }

    /// Whether any machine holds part of a host alone: `--dedicated-cpus` is set, or a type
    /// of `catalog` asks for dedicated CPUs, huge pages or devices. Only then do scans (and
    /// doctor) read every domain's definition and the host's topology.
    #[must_use]
    pub fn places(&self, catalog: &InstanceCatalog) -> bool {
        !self.capacity.dedicated_cpus.is_empty()
            || catalog.asks_devices()
            || (catalog.iter()).any(|(_, shape)| !shape.placement.is_default())
    }

    /// The CPU choice for a domain of `instance_type` (`None`: the platform's default).
    #[must_use]
    pub fn cpu_for(&self, instance_type: &str) -> Option<&CpuChoice> {
        self.instance_cpu.get(instance_type).or(self.cpu.as_ref())
    }
}

/// Everything the libvirt backend needs.
#[derive(Clone, Debug)]
pub struct LibvirtConfig {
    /// The provider label: host refs, machine ids, domain names and ownership tags.
    pub provider: String,
    /// One libvirt URI per zone (`--connect`).
    pub connections: Vec<HostConnection>,
    /// The configured slots, Speculative, in offering order.
    pub slots: Vec<Machine>,
    /// The instance-type catalog (vCPU and memory per type).
    pub catalog: InstanceCatalog,
    /// The operator's libvirt flags.
    pub options: DomainConfig,
    /// The cloud-init user-data (the `--base-user-data` file's bytes); `None` =
    /// `#cloud-config {}`.
    pub user_data: Option<Vec<u8>>,
    /// Connection handling.
    pub hosts: HostPolicy,
    /// Guest-agent timing and limits.
    pub agent: AgentPolicy,
    /// How long start-up waits for the first dial of every host.
    pub startup_wait: Duration,
    /// How long one host's describe scan may take before it is left out.
    pub describe_timeout: Duration,
    /// Seed of the reconnect jitter.
    pub seed: u64,
}

impl LibvirtConfig {
    /// A configuration with default options (storage pool and network `default`) but `image`.
    #[must_use]
    pub fn new(
        provider: &str,
        connections: Vec<HostConnection>,
        slots: Vec<Machine>,
        catalog: InstanceCatalog,
        image: &str,
    ) -> Self {
        Self {
            provider: provider.to_owned(),
            connections,
            slots,
            catalog,
            options: DomainConfig {
                image: image.to_owned(),
                ..DomainConfig::default()
            },
            user_data: None,
            hosts: HostPolicy::default(),
            agent: AgentPolicy::default(),
            startup_wait: Duration::from_secs(20),
            describe_timeout: Duration::from_secs(20),
            seed: 1,
        }
    }
}
