//! The real libvirt backend: [`LibvirtHypervisor`] drives one libvirt host per zone
//! through the `virt` bindings and implements the `Hypervisor` port.
//!
//! The adapter is split by concern so each file stays small enough to review in one
//! sitting (docs/design.md §5.5) and each rule has one home:
//!
//! - `host`: one connection per zone, blocking calls behind the host's lanes, keepalive,
//!   liveness probes, reconnect with jittered backoff (`backoff`), health;
//! - `lanes`, `lane_metrics`: the per-host budget (`--host-budget`, `--agent-budget`), the
//!   lanes (teardown, create, read, agent) and their fairness rule, and their series;
//! - `ownership`: the metadata tag that proves a domain is ours, and XML escaping;
//! - `xml`: the domain and volume documents; `seed`: the cloud-init NoCloud ISO;
//! - `volumes`: overlay and seed volumes (create-or-adopt, upload, delete);
//! - `golden`: `--image-source`, the content-addressed golden volume uploaded to each host;
//! - `domains`: find-and-prove-ownership, power on, retag, remove;
//! - `capacity`: what a host can run and what is committed on it;
//! - `lifecycle`: Create and Delete as blocking sequences with rollback;
//! - `agent`, `guest`: the qemu guest-agent protocol, and bootstrap and drain over it;
//!   `addresses`: the guest's addresses, read after Configure for its log line;
//! - `describe`, `orphans`: inventory, drift and orphan reporting, orphan collection;
//! - `watch`: the 2-second state poll that reports out-of-band changes between reconciles;
//! - `service`: the `Hypervisor` implementation tying the above together;
//! - `probe`: the read-only look at a host behind `bigfleet-libvirt doctor`; `trial`: its
//!   opt-in throw-away paused domains that find a CPU mode QEMU aborts on;
//! - `credentials`, `tls_peer`: a refused remote dial (ssh key, host key, polkit, TLS
//!   certificates) as one line with the fix;
//! - `fixture`: libvirt test-driver node files for tests, benchmarks and demos.
//!
//! docs/libvirt.md describes how it behaves, and the README's "Running against real libvirt
//! hosts" section how to operate it: connection URIs, image requirements, the in-guest hook
//! contract and the flags.

mod addresses;
mod agent;
mod backoff;
mod capacity;
mod credentials;
mod describe;
pub mod devices;
pub mod doctor;
mod domains;
mod error;
pub mod fixture;
pub mod golden;
mod guest;
mod host;
mod lane_metrics;
pub mod lanes;
mod lifecycle;
pub mod metrics;
mod orphans;
mod ownership;
mod probe;
mod seed;
mod service;
mod tls_peer;
pub mod trial;
mod volumes;
mod watch;
mod watch_timeline;
pub mod xml;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bigfleet_libvirt_domain::Machine;
use bigfleet_libvirt_ports::{Clock, Spawner};
use tracing::{info, warn};

pub use agent::{AgentError, AgentPolicy, GuestAgent};
pub use capacity::{CapacityPolicy, Shape};
pub use devices::{CpuChoice, CpuMode, NicSource};
pub use host::{Health, HostPolicy};
pub use lane_metrics::LaneMetrics;
pub use lanes::{Budget, Lane};
pub use orphans::GcPolicy;
pub use ownership::{NAMESPACE, Tag};
pub use probe::{ProbeTarget, probe};
pub use xml::{DirectKernel, DomainType, Firmware, Platform};

use crate::metrics::LibvirtMetrics;
use bigfleet_libvirt_config::HostConnection;
use bigfleet_libvirt_domain::catalog::InstanceCatalog;
use host::Host;
use orphans::OrphanBook;

/// The operator's choices for the libvirt backend: one field per libvirt flag, as the
/// composition root's launch plan validated it, used here as is. A new libvirt flag is a
/// field here (with its default), the clap flag in the binary, and its check in the plan.
#[derive(Clone, Debug)]
pub struct DomainConfig {
    /// The golden base-image volume (`--image`), in the storage pool.
    pub image: String,
    /// `--image-source`: uploaded to every host that lacks it; `image` is its volume name.
    pub image_source: Option<Arc<golden::GoldenImage>>,
    /// The storage pool for overlays and seeds (`--storage-pool`).
    pub storage_pool: String,
    /// The libvirt network for each domain's NIC (`--network`); empty = no NIC. Used when
    /// `nics` is empty.
    pub network: String,
    /// Every domain's NICs, in order (`--nic`); empty = the one NIC of `network`.
    pub nics: Vec<NicSource>,
    /// The NICs of one instance type instead (`--instance-nic TYPE:SOURCE`).
    pub instance_nics: BTreeMap<String, Vec<NicSource>>,
    /// The guest CPU (`--cpu`); `None` = the platform's default.
    pub cpu: Option<CpuChoice>,
    /// The guest CPU of one instance type instead (`--instance-cpu TYPE:CPU`).
    pub instance_cpu: BTreeMap<String, CpuChoice>,
    /// Accelerator and boot method (`--domain-type`, `--guest-kernel`, …).
    pub platform: Platform,
    /// `--base-user-data`: the file the composition root reads at start-up into
    /// [`LibvirtConfig::user_data`].
    pub base_user_data: Option<PathBuf>,
    /// Host capacity accounting (`--host-reserve-*`, `--*-allocation-ratio`).
    pub capacity: CapacityPolicy,
    /// Orphan collection (`--gc-orphans`, `--orphan-grace`).
    pub gc: GcPolicy,
    /// Calls in flight per host, and the agent's share (`--host-budget`, `--agent-budget`).
    pub budget: Budget,
}

impl Default for DomainConfig {
    /// No image, storage pool and network `default`, default platform and policies.
    fn default() -> Self {
        Self {
            image: String::new(),
            image_source: None,
            storage_pool: "default".to_owned(),
            network: "default".to_owned(),
            nics: Vec::new(),
            instance_nics: BTreeMap::new(),
            cpu: None,
            instance_cpu: BTreeMap::new(),
            platform: Platform::default(),
            base_user_data: None,
            capacity: CapacityPolicy::default(),
            gc: GcPolicy::default(),
            budget: Budget::default(),
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

/// What a host of `cpus` CPUs and `memory_kib` KiB can run under `policy`.
#[must_use]
pub fn allocatable_for(cpus: u32, memory_kib: u64, policy: &CapacityPolicy) -> Shape {
    capacity::allocatable(capacity::Node { cpus, memory_kib }, policy)
}

/// The MAC address of every NIC every configured slot will have.
fn mac_book(config: &LibvirtConfig) -> devices::MacBook {
    let nics = config.slots.iter().map(|slot| {
        let count = config.options.nic_sources(&slot.instance_type).len();
        (slot.id.as_str(), count)
    });
    devices::MacBook::new(&config.provider, nics)
}

/// What the blocking sequences need, shared with their threads.
#[derive(Debug)]
pub(crate) struct SequenceContext {
    pub(crate) provider: String,
    pub(crate) options: DomainConfig,
    pub(crate) user_data: Vec<u8>,
    /// The MAC address of every NIC of every configured slot.
    pub(crate) macs: devices::MacBook,
    /// Where the blocking create path records its define/start phase durations.
    pub(crate) metrics: LibvirtMetrics,
}

pub(crate) struct Inner<C> {
    config: LibvirtConfig,
    settings: Arc<SequenceContext>,
    hosts: BTreeMap<String, Arc<Host>>,
    clock: C,
    metrics: LibvirtMetrics,
    /// Machines the provider's records say run on a host: id → zone.
    known: Mutex<BTreeMap<String, String>>,
    /// Machine ids with a Delete in flight (the drift watch leaves them alone).
    busy: Mutex<BTreeSet<String>>,
    orphans: Mutex<OrphanBook>,
}

impl<C> Inner<C> {
    fn known(&self) -> MutexGuard<'_, BTreeMap<String, String>> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn busy(&self) -> MutexGuard<'_, BTreeSet<String>> {
        self.busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn book(&self) -> MutexGuard<'_, OrphanBook> {
        self.orphans
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The libvirt hypervisor: one supervised connection per zone.
pub struct LibvirtHypervisor<C> {
    inner: Arc<Inner<C>>,
}

impl<C> Clone for LibvirtHypervisor<C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C: Clock> LibvirtHypervisor<C> {
    /// Starts one supervisor per host (through `spawner`) and waits, at most
    /// `startup_wait`, for every host's first dial. A host that cannot be reached is not
    /// fatal: it stays `unreachable`, keeps being redialled, and its slots are withheld.
    pub async fn connect<E: Spawner>(
        config: LibvirtConfig,
        clock: C,
        spawner: &E,
        metrics: LibvirtMetrics,
    ) -> Self {
        let settings = Arc::new(SequenceContext {
            provider: config.provider.clone(),
            options: config.options.clone(),
            user_data: config
                .user_data
                .clone()
                .unwrap_or_else(|| seed::DEFAULT_USER_DATA.to_vec()),
            macs: mac_book(&config),
            metrics: metrics.clone(),
        });
        let hosts: BTreeMap<String, Arc<Host>> = config
            .connections
            .iter()
            .map(|c| {
                let golden = config
                    .options
                    .image_source
                    .as_ref()
                    .map(|g| (Arc::clone(g), config.options.storage_pool.clone()));
                let host = Host::new(
                    &c.zone,
                    &c.uri,
                    config.hosts.clone(),
                    config.options.budget,
                    metrics.lanes.clone(),
                    metrics.clone(),
                    golden,
                );
                (c.zone.clone(), host)
            })
            .collect();
        for (index, host) in hosts.values().enumerate() {
            let seed = config.seed.wrapping_add(index as u64);
            let task = host::supervise(Arc::downgrade(host), clock.clone(), seed);
            spawner.spawn("libvirt-host-supervisor", task);
        }
        let deadline = clock.now().saturating_add(config.startup_wait);
        let settled = futures::future::join_all(hosts.values().map(|h| h.settled()));
        futures::select_biased! {
            _ = futures::FutureExt::fuse(settled) => {}
            () = futures::FutureExt::fuse(clock.sleep_until(deadline)) => {}
        }
        let inner = Inner {
            config,
            settings,
            hosts,
            clock,
            metrics,
            known: Mutex::new(BTreeMap::new()),
            busy: Mutex::new(BTreeSet::new()),
            orphans: Mutex::new(OrphanBook::default()),
        };
        let inner = Arc::new(inner);
        if !inner.config.hosts.watch_interval.is_zero() {
            for zone in inner.hosts.keys() {
                let task = watch::run(Arc::downgrade(&inner), zone.clone(), inner.clock.clone());
                spawner.spawn("libvirt-drift-watch", task);
            }
        }
        Self { inner }
    }

    /// The health of a zone's host.
    #[must_use]
    pub fn health(&self, zone: &str) -> Option<Health> {
        self.inner.hosts.get(zone).map(|h| h.health())
    }

    /// Redials every host now (a healthy one keeps its connection until the new one is
    /// up, and keeps it if the new dial fails), so rotated credentials on disk take effect.
    pub fn redial_all(&self, reason: &'static str) {
        info!(
            reason,
            hosts = self.inner.hosts.len(),
            "redialling every libvirt host"
        );
        for host in self.inner.hosts.values() {
            host.redial();
        }
    }

    /// Redials every host on each SIGHUP, until the process ends (the documented trigger
    /// for a credential rotation; the next dial reads the files anyway).
    pub async fn redial_on_sighup(self) {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hangup) = signal(SignalKind::hangup()) else {
            warn!(
                "cannot install the SIGHUP handler: rotated libvirt credentials apply on the next reconnect only"
            );
            return;
        };
        while hangup.recv().await.is_some() {
            self.redial_all("SIGHUP");
        }
    }

    /// Waits until a zone's host is healthy (returns at once for an unknown zone).
    pub async fn wait_healthy(&self, zone: &str) {
        if let Some(host) = self.inner.hosts.get(zone) {
            host.healthy().await;
        }
    }
}
