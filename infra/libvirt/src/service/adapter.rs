//! The adapter itself: [`LibvirtHypervisor`] and the state its calls share ([`Inner`]), and
//! [`LibvirtHypervisor::connect`], which starts one supervisor per host and one drift
//! watch per zone.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use bigfleet_libvirt_domain::catalog::DeviceClasses;
use bigfleet_libvirt_ports::{Clock, Spawner};
use tracing::{info, warn};

use crate::drift::orphans::OrphanBook;
use crate::drift::tracked::Tracked;
use crate::drift::watch::{self, Watched};
use crate::host::connection::{self, Health, Host};
use crate::host::dial;
use crate::host::gate::{Checks, Gate};
use crate::metrics::LibvirtMetrics;
use crate::options::{DomainConfig, LibvirtConfig};
use crate::render::devices::MacBook;
use crate::render::seed;
use crate::storage::golden::GoldenGate;

/// The MAC address of every NIC every configured slot will have.
fn mac_book(config: &LibvirtConfig) -> MacBook {
    let nics = config.slots.iter().map(|slot| {
        let count = config.options.nic_sources(&slot.instance_type).len();
        (slot.id.as_str(), count)
    });
    MacBook::new(&config.provider, nics)
}

/// What the blocking sequences need, shared with their threads.
#[derive(Debug)]
pub(crate) struct SequenceContext {
    pub(crate) provider: String,
    pub(crate) options: DomainConfig,
    /// The cloud-init user-data every domain gets.
    pub(crate) user_data: Arc<[u8]>,
    /// The MAC address of every NIC of every configured slot.
    pub(crate) macs: MacBook,
    /// Where the blocking create path records its define/start phase durations.
    pub(crate) metrics: LibvirtMetrics,
    /// The declared device classes (`--device-classes`).
    pub(crate) classes: DeviceClasses,
    /// Whether any type asks for devices: then the host's node devices are read with its
    /// topology.
    pub(crate) passes_through: bool,
}

pub(crate) struct Inner<C> {
    pub(crate) config: LibvirtConfig,
    pub(crate) settings: Arc<SequenceContext>,
    pub(crate) hosts: BTreeMap<String, Arc<Host>>,
    pub(crate) clock: C,
    pub(crate) metrics: LibvirtMetrics,
    /// Machines the provider's records place on a host, and those with a Delete in flight
    /// (shared with the drift watch, which leaves those alone).
    pub(crate) tracked: Arc<Tracked>,
    pub(crate) orphans: Mutex<OrphanBook>,
}

impl<C> Inner<C> {
    pub(crate) fn known(&self) -> MutexGuard<'_, BTreeMap<String, String>> {
        self.tracked.known()
    }

    pub(crate) fn book(&self) -> MutexGuard<'_, OrphanBook> {
        self.orphans
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One supervised connection per zone, each with `--image-source` as the gate a fresh
/// connection passes.
fn hosts(config: &LibvirtConfig, metrics: &LibvirtMetrics) -> BTreeMap<String, Arc<Host>> {
    let options = &config.options;
    let golden = options.image_source.as_ref().map(|image| -> Arc<dyn Gate> {
        Arc::new(GoldenGate {
            image: Arc::clone(image),
            pool: options.storage_pool.clone(),
            seed_pool: options.seed_pool().to_owned(),
            clusters: crate::storage::golden_rbd::ClusterLocks::default(),
        })
    });
    (config.connections.iter())
        .map(|c| {
            let host = Host::new(
                c,
                config.hosts.clone(),
                options.budget,
                dial::connections_for(&c.uri, options.connections),
                metrics.lanes.clone(),
                metrics.clone(),
                Checks {
                    pools: vec![options.storage_pool.clone(), options.seed_pool().to_owned()],
                    golden: golden.clone(),
                },
            );
            (c.zone.clone(), host)
        })
        .collect()
}

/// What the drift watch of `zone` reaches: its host and the tracked machines, weakly.
fn watched<C>(inner: &Arc<Inner<C>>, zone: &str, host: &Arc<Host>) -> Watched {
    Watched {
        zone: zone.to_owned(),
        provider: inner.config.provider.clone(),
        interval: inner.config.hosts.watch_interval,
        host: Arc::downgrade(host),
        tracked: Arc::downgrade(&inner.tracked),
        metrics: inner.metrics.clone(),
        catalog: inner.config.catalog.clone(),
    }
}

/// The libvirt hypervisor: one supervised connection per zone.
pub struct LibvirtHypervisor<C> {
    pub(crate) inner: Arc<Inner<C>>,
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
                .unwrap_or_else(|| seed::DEFAULT_USER_DATA.to_vec())
                .into(),
            macs: mac_book(&config),
            metrics: metrics.clone(),
            classes: config.catalog.device_classes().clone(),
            passes_through: config.catalog.asks_devices(),
        });
        let hosts = hosts(&config, &metrics);
        for (index, host) in hosts.values().enumerate() {
            let seed = config.seed.wrapping_add(index as u64);
            let task = connection::supervise(Arc::downgrade(host), clock.clone(), seed);
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
            tracked: Arc::new(Tracked::default()),
            orphans: Mutex::new(OrphanBook::default()),
        };
        let inner = Arc::new(inner);
        if !inner.config.hosts.watch_interval.is_zero() {
            for (zone, host) in &inner.hosts {
                spawner.spawn(
                    "libvirt-drift-watch",
                    watch::run(watched(&inner, zone, host), inner.clock.clone()),
                );
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
