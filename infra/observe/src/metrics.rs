//! The provider's Prometheus metrics on an explicit registry (no process-global state).
//!
//! Series names follow the reference provider (`bigfleet_libvirt_*`) so existing
//! dashboards keep working; machines by state and transition outcomes are additions.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of `bigfleet_libvirt_grpc_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GrpcLabels {
    /// Short method name (`Create`, `List`, …).
    pub method: String,
    /// gRPC code name (`OK`, `NotFound`, `FailedPrecondition`, …).
    pub code: String,
}

/// A single `method` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    /// Short method name.
    pub method: String,
}

/// Labels of transition series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    /// `create`, `configure`, `drain` or `delete`.
    pub kind: String,
    /// `success`, `failed` or `dropped`.
    pub outcome: String,
}

/// A single `kind` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// Transition kind.
    pub kind: String,
}

/// A single `state` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// Machine state name.
    pub state: String,
}

/// Labels of `bigfleet_libvirt_api_calls_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabels {
    /// Hypervisor operation (`CreateDomain`, `Configure`, …).
    pub op: String,
    /// `success` or `error`.
    pub outcome: String,
}

/// A single `op` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// Hypervisor operation.
    pub op: String,
}

/// A single `phase` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// `define`, `start`, `agent_ready`, `bootstrap`, `drain` or `delete`.
    pub phase: String,
}

/// A single `outcome` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `success` or `error`.
    pub outcome: String,
}

/// Labels of `bigfleet_libvirt_host_health`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostLabels {
    /// The host's zone.
    pub zone: String,
    /// `connecting`, `healthy` or `unreachable`.
    pub state: String,
}

/// Labels of `bigfleet_libvirt_substrate_drift`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriftLabels {
    /// The host's zone.
    pub zone: String,
    /// `vanished`, `stopped`, `orphan_domain` or `orphan_volume`.
    pub kind: String,
}

/// Labels of `bigfleet_libvirt_authz_denied_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthzLabels {
    /// Short method name (`Create`, `Get`, …).
    pub method: String,
    /// Why the call was refused (`shard_mismatch`, `no_identity`, …).
    pub reason: String,
}

/// Labels of `bigfleet_libvirt_connections_evicted_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PortLabels {
    /// `grpc` (`--addr`) or `metrics` (`--metrics-addr`).
    pub port: String,
}

/// Every series the provider exports.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// Unary gRPC requests by method and code.
    pub grpc_requests: Family<GrpcLabels, Counter>,
    /// Unary gRPC latency by method.
    pub grpc_duration: Family<MethodLabels, Histogram>,
    /// Handler panics caught and answered with INTERNAL.
    pub panics: Counter,
    /// 1 while the provider is ready to take traffic (what `/readyz` answers), else 0.
    pub ready: Gauge,
    /// Finished transitions by kind and outcome.
    pub transitions: Family<TransitionLabels, Counter>,
    /// Transition duration from accept to completion, by kind.
    pub transition_duration: Family<KindLabels, Histogram>,
    /// Machines by state (set at scrape time).
    pub machines: Family<StateLabels, Gauge>,
    /// Background reconcile runs by outcome.
    pub reconcile: Family<OutcomeLabels, Counter>,
    /// Hypervisor calls by operation and outcome.
    pub api_calls: Family<ApiLabels, Counter>,
    /// Hypervisor call latency by operation.
    pub api_duration: Family<OpLabels, Histogram>,
    /// Duration of each libvirt phase (define, start, agent ready, bootstrap, drain, delete).
    pub phases: Family<PhaseLabels, Histogram>,
    /// libvirt host health, one-hot over the states (1 = the host's current state).
    pub host_health: Family<HostLabels, Gauge>,
    /// `--image-source` per host, one-hot over `pending`, `ready`, `mismatch`, `failed`.
    pub golden_image: Family<HostLabels, Gauge>,
    /// What the last describe found out of line with the provider's records, by kind.
    pub drift: Family<DriftLabels, Gauge>,
    /// Calls refused by the client-identity check, by method and reason.
    pub authz_denied: Family<AuthzLabels, Counter>,
    /// State-store commit attempts that failed (brought up to date at scrape time).
    pub state_commit_failures: Counter,
    /// 1 while the state store takes commits, 0 while the last attempt failed.
    pub state_writable: Gauge,
    /// Idle connections evicted at a port's connection cap to let a new client in, by port.
    pub connections_evicted: Family<PortLabels, Counter>,
    /// Every machine's recent events, recorded by the same adapters that count them.
    pub timeline: crate::timeline::Timeline,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

fn transition_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 18))
}

const PREFIX: &str = "bigfleet_libvirt";

impl Metrics {
    /// Registers every series on a fresh registry.
    #[must_use]
    pub fn new() -> Self {
        Self::with(|_| {})
    }

    /// As [`Metrics::new`], then lets an adapter register its own series (`extra`) last.
    #[must_use]
    pub fn with(extra: impl FnOnce(&mut Registry)) -> Self {
        let metrics = Self {
            registry: Arc::default(),
            grpc_requests: Family::default(),
            grpc_duration: Family::new_with_constructor(latency_histogram as fn() -> _),
            panics: Counter::default(),
            ready: Gauge::default(),
            transitions: Family::default(),
            transition_duration: Family::new_with_constructor(transition_histogram as fn() -> _),
            machines: Family::default(),
            reconcile: Family::default(),
            api_calls: Family::default(),
            api_duration: Family::new_with_constructor(transition_histogram as fn() -> _),
            phases: Family::new_with_constructor(transition_histogram as fn() -> _),
            host_health: Family::default(),
            golden_image: Family::default(),
            drift: Family::default(),
            authz_denied: Family::default(),
            state_commit_failures: Counter::default(),
            state_writable: Gauge::default(),
            connections_evicted: Family::default(),
            timeline: crate::timeline::Timeline::default(),
        };
        metrics.state_writable.set(1);
        // Both series exist from the start (at 0), so the first eviction shows as a rise.
        for port in ["grpc", "metrics"] {
            let _ = metrics.connections_evicted.get_or_create(&PortLabels {
                port: port.to_owned(),
            });
        }
        // Registration order is exposition order.
        let mut registry = Registry::default();
        metrics.register_hypervisor(&mut registry);
        metrics.register_grpc(&mut registry);
        metrics.register_provider(&mut registry);
        metrics.register_hosts(&mut registry);
        metrics.register_access(&mut registry);
        extra(&mut registry);
        Self {
            registry: Arc::new(registry),
            ..metrics
        }
    }

    /// The hypervisor's series (the libvirt phases, every call), and the process's.
    fn register_hypervisor(&self, registry: &mut Registry) {
        registry.register(
            format!("{PREFIX}_phase_duration_seconds"),
            "Duration of each libvirt phase: define, start, agent_ready, bootstrap, drain, delete",
            self.phases.clone(),
        );
        registry.register(
            format!("{PREFIX}_api_calls"),
            "Hypervisor calls by operation and outcome",
            self.api_calls.clone(),
        );
        registry.register(
            format!("{PREFIX}_api_duration_seconds"),
            "Hypervisor call latency",
            self.api_duration.clone(),
        );
        registry.register_collector(Box::new(crate::process::ProcessCollector));
        registry.register_collector(Box::new(crate::export::ExportCollector));
    }

    /// The gRPC service's series.
    fn register_grpc(&self, registry: &mut Registry) {
        registry.register(
            format!("{PREFIX}_grpc_requests"),
            "Unary gRPC requests by method and status code",
            self.grpc_requests.clone(),
        );
        registry.register(
            format!("{PREFIX}_grpc_request_duration_seconds"),
            "Unary gRPC request latency",
            self.grpc_duration.clone(),
        );
        registry.register(
            format!("{PREFIX}_panics"),
            "Recovered handler panics",
            self.panics.clone(),
        );
        registry.register(
            format!("{PREFIX}_ready"),
            "1 while the provider is ready to take traffic (the answer of /readyz), else 0",
            self.ready.clone(),
        );
    }

    /// The provider's series: transitions, machines, reconcile.
    fn register_provider(&self, registry: &mut Registry) {
        registry.register(
            format!("{PREFIX}_transitions"),
            "Finished transitions by kind and outcome",
            self.transitions.clone(),
        );
        registry.register(
            format!("{PREFIX}_transition_duration_seconds"),
            "Time from accept to completion of a transition",
            self.transition_duration.clone(),
        );
        registry.register(
            format!("{PREFIX}_machines"),
            "Machines by state",
            self.machines.clone(),
        );
        registry.register(
            format!("{PREFIX}_reconcile"),
            "Background reconcile runs by outcome",
            self.reconcile.clone(),
        );
    }

    /// The libvirt hosts' series: health, golden image, drift.
    fn register_hosts(&self, registry: &mut Registry) {
        registry.register(
            format!("{PREFIX}_host_health"),
            "libvirt host health (1 for the current state of each zone)",
            self.host_health.clone(),
        );
        registry.register(
            format!("{PREFIX}_golden_image"),
            "--image-source on each zone's host (1 for the current state: pending, ready, \
             mismatch, failed)",
            self.golden_image.clone(),
        );
        registry.register(
            format!("{PREFIX}_substrate_drift"),
            "Managed domains vanished or stopped outside the provider, and orphans, by zone",
            self.drift.clone(),
        );
    }

    /// Client identity, the state store and the connection caps.
    fn register_access(&self, registry: &mut Registry) {
        registry.register(
            format!("{PREFIX}_authz_denied"),
            "Calls refused by the client-identity check (mTLS), by method and reason",
            self.authz_denied.clone(),
        );
        registry.register(
            format!("{PREFIX}_state_commit_failures"),
            "State-store commit attempts that failed (the calls in them were not acknowledged)",
            self.state_commit_failures.clone(),
        );
        registry.register(
            format!("{PREFIX}_state_writable"),
            "1 while the state store takes commits, 0 while the last commit attempt failed",
            self.state_writable.clone(),
        );
        registry.register(
            format!("{PREFIX}_connections_evicted"),
            "Idle connections evicted at a port's connection cap to let a new client in",
            self.connections_evicted.clone(),
        );
    }

    /// The acceptor hook that counts one eviction on `port` (`grpc` or `metrics`).
    #[must_use]
    pub fn eviction_counter(&self, port: &str) -> bigfleet_libvirt_system::accept::OnEvict {
        let evicted = self
            .connections_evicted
            .get_or_create(&PortLabels {
                port: port.to_owned(),
            })
            .clone();
        bigfleet_libvirt_system::accept::OnEvict::new(move || {
            evicted.inc();
        })
    }

    /// Records how long one libvirt phase took.
    pub fn observe_phase(&self, phase: &str, seconds: f64) {
        self.phases
            .get_or_create(&PhaseLabels {
                phase: phase.to_owned(),
            })
            .observe(seconds);
    }

    /// The text exposition of every series.
    #[must_use]
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("encode metrics into a string");
        out
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
