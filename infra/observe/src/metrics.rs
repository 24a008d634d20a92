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

impl Metrics {
    /// Registers every series on a fresh registry.
    #[must_use]
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let grpc_requests = Family::<GrpcLabels, Counter>::default();
        let grpc_duration =
            Family::<MethodLabels, Histogram>::new_with_constructor(latency_histogram as fn() -> _);
        let panics = Counter::default();
        let ready = Gauge::default();
        let transitions = Family::<TransitionLabels, Counter>::default();
        let transition_duration = Family::<KindLabels, Histogram>::new_with_constructor(
            transition_histogram as fn() -> _,
        );
        let machines = Family::<StateLabels, Gauge>::default();
        let reconcile = Family::<OutcomeLabels, Counter>::default();
        let api_calls = Family::<ApiLabels, Counter>::default();
        let api_duration =
            Family::<OpLabels, Histogram>::new_with_constructor(transition_histogram as fn() -> _);
        let phases = Family::<PhaseLabels, Histogram>::new_with_constructor(
            transition_histogram as fn() -> _,
        );
        registry.register(
            "bigfleet_libvirt_phase_duration_seconds",
            "Duration of each libvirt phase: define, start, agent_ready, bootstrap, drain, delete",
            phases.clone(),
        );
        let host_health = Family::<HostLabels, Gauge>::default();
        let golden_image = Family::<HostLabels, Gauge>::default();
        let drift = Family::<DriftLabels, Gauge>::default();
        let prefix = "bigfleet_libvirt";
        registry.register(
            format!("{prefix}_api_calls"),
            "Hypervisor calls by operation and outcome",
            api_calls.clone(),
        );
        registry.register(
            format!("{prefix}_api_duration_seconds"),
            "Hypervisor call latency",
            api_duration.clone(),
        );
        registry.register_collector(Box::new(crate::process::ProcessCollector));
        registry.register_collector(Box::new(crate::export::ExportCollector));
        registry.register(
            format!("{prefix}_grpc_requests"),
            "Unary gRPC requests by method and status code",
            grpc_requests.clone(),
        );
        registry.register(
            format!("{prefix}_grpc_request_duration_seconds"),
            "Unary gRPC request latency",
            grpc_duration.clone(),
        );
        registry.register(
            format!("{prefix}_panics"),
            "Recovered handler panics",
            panics.clone(),
        );
        registry.register(
            format!("{prefix}_ready"),
            "1 while the provider is ready to take traffic (the answer of /readyz), else 0",
            ready.clone(),
        );
        registry.register(
            format!("{prefix}_transitions"),
            "Finished transitions by kind and outcome",
            transitions.clone(),
        );
        registry.register(
            format!("{prefix}_transition_duration_seconds"),
            "Time from accept to completion of a transition",
            transition_duration.clone(),
        );
        registry.register(
            format!("{prefix}_machines"),
            "Machines by state",
            machines.clone(),
        );
        registry.register(
            format!("{prefix}_reconcile"),
            "Background reconcile runs by outcome",
            reconcile.clone(),
        );
        registry.register(
            format!("{prefix}_host_health"),
            "libvirt host health (1 for the current state of each zone)",
            host_health.clone(),
        );
        registry.register(
            format!("{prefix}_golden_image"),
            "--image-source on each zone's host (1 for the current state: pending, ready, \
             mismatch, failed)",
            golden_image.clone(),
        );
        registry.register(
            format!("{prefix}_substrate_drift"),
            "Managed domains vanished or stopped outside the provider, and orphans, by zone",
            drift.clone(),
        );
        let authz_denied = Family::<AuthzLabels, Counter>::default();
        registry.register(
            format!("{prefix}_authz_denied"),
            "Calls refused by the client-identity check (mTLS), by method and reason",
            authz_denied.clone(),
        );
        let state_commit_failures = Counter::default();
        registry.register(
            format!("{prefix}_state_commit_failures"),
            "State-store commit attempts that failed (the calls in them were not acknowledged)",
            state_commit_failures.clone(),
        );
        let state_writable = Gauge::default();
        state_writable.set(1);
        registry.register(
            format!("{prefix}_state_writable"),
            "1 while the state store takes commits, 0 while the last commit attempt failed",
            state_writable.clone(),
        );
        let connections_evicted = Family::<PortLabels, Counter>::default();
        // Both series exist from the start (at 0), so the first eviction shows as a rise.
        for port in ["grpc", "metrics"] {
            let _ = connections_evicted.get_or_create(&PortLabels {
                port: port.to_owned(),
            });
        }
        registry.register(
            format!("{prefix}_connections_evicted"),
            "Idle connections evicted at a port's connection cap to let a new client in",
            connections_evicted.clone(),
        );
        Self {
            registry: Arc::new(registry),
            grpc_requests,
            grpc_duration,
            panics,
            ready,
            transitions,
            transition_duration,
            machines,
            reconcile,
            api_calls,
            api_duration,
            phases,
            host_health,
            golden_image,
            drift,
            authz_denied,
            state_commit_failures,
            state_writable,
            connections_evicted,
            timeline: crate::timeline::Timeline::default(),
        }
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
