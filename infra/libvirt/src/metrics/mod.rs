//! The series the libvirt adapter produces: the duration of each libvirt phase, each host's
//! health, golden image, capacity and storage pool, and the drift the last describe found. The adapter declares
//! them and registers them on the registry the composition root hands it; a new libvirt
//! series is a field and a `register` call here, and nowhere else.

pub mod lanes;

use bigfleet_libvirt_observe::metrics::{PREFIX, transition_histogram};
use bigfleet_libvirt_observe::timeline::Timeline;
use lanes::LaneMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// A single `phase` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// `define`, `start`, `agent_ready`, `bootstrap`, `drain` or `delete`.
    pub phase: String,
}

/// Labels of `bigfleet_libvirt_host_health` and `bigfleet_libvirt_golden_image`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostLabels {
    /// The host's zone.
    pub zone: String,
    /// `connecting`, `healthy` or `unreachable` (health); `pending`, `ready`, `mismatch`
    /// or `failed` (golden image).
    pub state: String,
}

/// Labels of `bigfleet_libvirt_host_capacity`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CapacityLabels {
    /// The host's zone.
    pub zone: String,
    /// `vcpu`, `memory_bytes`, `disk_bytes`, `dedicated_cpus`, or `hugepages_<size>kib`
    /// (pages of one size).
    pub resource: String,
    /// `allocatable` (what the host offers under the reserves and ratios) or `committed`
    /// (what its domains and the Creates in flight take).
    pub of: String,
}

/// Labels of `bigfleet_libvirt_storage_pool_bytes`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// The host's zone.
    pub zone: String,
    /// `capacity` or `allocation` (what is written).
    pub kind: String,
}

/// Labels of `bigfleet_libvirt_substrate_drift`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriftLabels {
    /// The host's zone.
    pub zone: String,
    /// `vanished`, `stopped`, `orphan_domain` or `orphan_volume`.
    pub kind: String,
}

/// The libvirt adapter's series, and the timeline its drift findings are recorded on.
#[derive(Clone, Debug)]
pub struct LibvirtMetrics {
    /// Duration of each libvirt phase (define, start, agent ready, bootstrap, drain, delete).
    pub phases: Family<PhaseLabels, Histogram>,
    /// libvirt host health, one-hot over the states (1 = the host's current state).
    pub host_health: Family<HostLabels, Gauge>,
    /// `--image-source` per host, one-hot over `pending`, `ready`, `mismatch`, `failed`.
    pub golden_image: Family<HostLabels, Gauge>,
    /// What the last describe found out of line with the provider's records, by kind.
    pub drift: Family<DriftLabels, Gauge>,
    /// Each host's allocatable and committed vCPUs, memory and disk, as of the last describe.
    pub capacity: Family<CapacityLabels, Gauge>,
    /// Each host's storage pool capacity and allocation, as of the last describe.
    pub pool: Family<PoolLabels, Gauge>,
    /// Every machine's recent events (drift is recorded on the machine it concerns).
    pub timeline: Timeline,
    /// The per-host lanes' queue depth, waits, calls in flight and budget.
    pub lanes: LaneMetrics,
}

impl LibvirtMetrics {
    /// Declares the adapter's series and registers them on `registry`.
    pub fn register(registry: &mut Registry, timeline: Timeline) -> Self {
        let metrics = Self {
            phases: Family::new_with_constructor(transition_histogram as fn() -> _),
            host_health: Family::default(),
            golden_image: Family::default(),
            drift: Family::default(),
            capacity: Family::default(),
            pool: Family::default(),
            timeline,
            lanes: LaneMetrics::default(),
        };
        registry.register(
            format!("{PREFIX}_phase_duration_seconds"),
            "Duration of each libvirt phase: define, start, agent_ready, bootstrap, drain, delete",
            metrics.phases.clone(),
        );
        registry.register(
            format!("{PREFIX}_host_health"),
            "libvirt host health (1 for the current state of each zone)",
            metrics.host_health.clone(),
        );
        registry.register(
            format!("{PREFIX}_golden_image"),
            "--image-source on each zone's host (1 for the current state: pending, ready, \
             mismatch, failed)",
            metrics.golden_image.clone(),
        );
        registry.register(
            format!("{PREFIX}_substrate_drift"),
            "Managed domains vanished or stopped outside the provider, and orphans, by zone",
            metrics.drift.clone(),
        );
        registry.register(
            format!("{PREFIX}_host_capacity"),
            "Each host's allocatable and committed vcpu, memory_bytes and disk_bytes (disk: \
             the storage pool's capacity times --disk-allocation-ratio, and the volumes' \
             virtual sizes), as of the last describe",
            metrics.capacity.clone(),
        );
        registry.register(
            format!("{PREFIX}_storage_pool_bytes"),
            "Each host's storage pool: capacity and allocation (bytes written), as of the last \
             describe",
            metrics.pool.clone(),
        );
        metrics.lanes.register(registry);
        metrics
    }

    /// Records one resource of zone `zone`: what it offers and what is taken.
    pub fn set_capacity(&self, zone: &str, resource: &str, allocatable: u64, committed: u64) {
        for (of, value) in [("allocatable", allocatable), ("committed", committed)] {
            let labels = CapacityLabels {
                zone: zone.to_owned(),
                resource: resource.to_owned(),
                of: of.to_owned(),
            };
            self.capacity
                .get_or_create(&labels)
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        }
    }

    /// Records zone `zone`'s storage pool.
    pub fn set_pool(&self, zone: &str, capacity: u64, allocation: u64) {
        for (kind, value) in [("capacity", capacity), ("allocation", allocation)] {
            let labels = PoolLabels {
                zone: zone.to_owned(),
                kind: kind.to_owned(),
            };
            self.pool
                .get_or_create(&labels)
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        }
    }

    /// The series on a registry of their own (tests and benchmarks that read no
    /// exposition).
    #[must_use]
    pub fn unexposed() -> Self {
        Self::register(&mut Registry::default(), Timeline::default())
    }

    /// Records how long one libvirt phase took.
    pub fn observe_phase(&self, phase: &str, seconds: f64) {
        self.phases
            .get_or_create(&PhaseLabels {
                phase: phase.to_owned(),
            })
            .observe(seconds);
    }
}
