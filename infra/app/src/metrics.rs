//! The one metrics registry, created here and handed to each adapter to register the series
//! it produces ([`Metrics::new`]), and the series the composition root produces itself
//! ([`ProviderMetrics`]): finished transitions (the root's transition observer), machines
//! by state and the state store's health (the scrape hook), reconcile runs (the reconcile
//! loop) and connections evicted at the ports' caps (the acceptors' hooks).

use bigfleet_libvirt_grpc::metrics::GrpcMetrics;
#[cfg(feature = "libvirt")]
use bigfleet_libvirt_libvirt::metrics::LibvirtMetrics;
use bigfleet_libvirt_observe::instrumented::ApiMetrics;
use bigfleet_libvirt_observe::metrics::{Exposition, PREFIX, transition_histogram};
use bigfleet_libvirt_observe::timeline::Timeline;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

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

/// A single `outcome` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `success` or `error`.
    pub outcome: String,
}

/// Labels of `bigfleet_libvirt_connections_evicted_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PortLabels {
    /// `grpc` (`--addr`) or `metrics` (`--metrics-addr`).
    pub port: String,
}

/// The series the composition root produces about the provider it serves.
#[derive(Clone, Debug)]
pub struct ProviderMetrics {
    /// Finished transitions by kind and outcome.
    pub transitions: Family<TransitionLabels, Counter>,
    /// Transition duration from accept to completion, by kind.
    pub transition_duration: Family<KindLabels, Histogram>,
    /// Machines by state (set at scrape time).
    pub machines: Family<StateLabels, Gauge>,
    /// Background reconcile runs by outcome.
    pub reconcile: Family<OutcomeLabels, Counter>,
    /// State-store commit attempts that failed (brought up to date at scrape time).
    pub state_commit_failures: Counter,
    /// 1 while the state store takes commits, 0 while the last attempt failed.
    pub state_writable: Gauge,
    /// Idle connections evicted at a port's connection cap to let a new client in, by port.
    pub connections_evicted: Family<PortLabels, Counter>,
}

impl ProviderMetrics {
    /// Declares the root's series and registers them on `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            transitions: Family::default(),
            transition_duration: Family::new_with_constructor(transition_histogram as fn() -> _),
            machines: Family::default(),
            reconcile: Family::default(),
            state_commit_failures: Counter::default(),
            state_writable: Gauge::default(),
            connections_evicted: Family::default(),
        };
        metrics.state_writable.set(1);
        // Both series exist from the start (at 0), so the first eviction shows as a rise.
        for port in ["grpc", "metrics"] {
            let _ = metrics.connections_evicted.get_or_create(&PortLabels {
                port: port.to_owned(),
            });
        }
        metrics.register_transitions(registry);
        metrics.register_store_and_ports(registry);
        metrics
    }

    fn register_transitions(&self, registry: &mut Registry) {
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

    fn register_store_and_ports(&self, registry: &mut Registry) {
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
}

/// Every adapter's series on the one registry, and the shared timeline. Clones share them.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// The sealed registry `/metrics` renders, and the readiness gauge.
    pub exposition: Exposition,
    /// The instrumented hypervisor's series (every backend call).
    pub api: ApiMetrics,
    /// The gRPC service's series.
    pub grpc: GrpcMetrics,
    /// The root's own series (transitions, machines, the state store, evictions).
    pub provider: ProviderMetrics,
    /// The libvirt adapter's series. Registered whenever the adapter is linked, whichever
    /// backend runs, so the exposed set does not depend on `--connect`.
    #[cfg(feature = "libvirt")]
    pub libvirt: LibvirtMetrics,
    /// Every machine's recent events, recorded by the same adapters that count them.
    pub timeline: Timeline,
}

impl Metrics {
    /// Creates the registry, has each adapter register its series on it, and seals it.
    #[must_use]
    pub fn new() -> Self {
        let timeline = Timeline::default();
        let mut registry = Registry::default();
        #[cfg(feature = "libvirt")]
        let libvirt = LibvirtMetrics::register(&mut registry, timeline.clone());
        let api = ApiMetrics::register(&mut registry, timeline.clone());
        let grpc = GrpcMetrics::register(&mut registry, timeline.clone());
        let provider = ProviderMetrics::register(&mut registry);
        Self {
            exposition: Exposition::seal(registry),
            api,
            grpc,
            provider,
            #[cfg(feature = "libvirt")]
            libvirt,
            timeline,
        }
    }

    /// The text exposition of every series.
    #[must_use]
    pub fn render(&self) -> String {
        self.exposition.render()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, feature = "libvirt", feature = "serve"))]
mod tests {
    use bigfleet_libvirt_grpc::metrics::{AuthzLabels, GrpcLabels, MethodLabels};
    use bigfleet_libvirt_libvirt::metrics::{DriftLabels, HostLabels};
    use bigfleet_libvirt_observe::instrumented::{ApiLabels, OpLabels};

    use super::*;

    /// The `# HELP`, `# TYPE` and `# UNIT` lines of an exposition, sorted.
    fn catalog(exposition: &str) -> Vec<&str> {
        let mut lines: Vec<&str> = exposition
            .lines()
            .filter(|l| {
                ["# HELP ", "# TYPE ", "# UNIT "]
                    .iter()
                    .any(|p| l.starts_with(p))
            })
            .collect();
        lines.sort_unstable();
        lines
    }

    /// One sample in every family, so each is rendered (an empty family is not).
    fn touch_every_family(m: &Metrics) {
        let s = |v: &str| v.to_owned();
        let g = &m.grpc;
        g.grpc_requests
            .get_or_create(&GrpcLabels {
                method: "Get",
                code: "OK",
            })
            .inc();
        g.grpc_duration
            .get_or_create(&MethodLabels { method: "Get" })
            .observe(0.1);
        g.authz_denied
            .get_or_create(&AuthzLabels {
                method: s("Get"),
                reason: s("no_identity"),
            })
            .inc();
        let p = &m.provider;
        p.transitions
            .get_or_create(&TransitionLabels {
                kind: s("create"),
                outcome: s("success"),
            })
            .inc();
        p.transition_duration
            .get_or_create(&KindLabels { kind: s("create") })
            .observe(1.0);
        p.machines
            .get_or_create(&StateLabels { state: s("Idle") })
            .set(1);
        p.reconcile
            .get_or_create(&OutcomeLabels {
                outcome: s("success"),
            })
            .inc();
        m.api
            .api_calls
            .get_or_create(&ApiLabels {
                op: s("Get"),
                outcome: s("success"),
            })
            .inc();
        m.api
            .api_duration
            .get_or_create(&OpLabels { op: s("Get") })
            .observe(0.1);
        let l = &m.libvirt;
        l.observe_phase("define", 0.5);
        l.lanes.set_budget("z", 4);
        l.lanes.set_lane("z", "create", 1, 1);
        l.lanes.observe_wait("z", "create", 0.1);
        let host = HostLabels {
            zone: s("z"),
            state: s("healthy"),
        };
        l.host_health.get_or_create(&host).set(1);
        l.golden_image.get_or_create(&host).set(1);
        l.drift
            .get_or_create(&DriftLabels {
                zone: s("z"),
                kind: s("vanished"),
            })
            .set(1);
    }

    /// Every series the binary exports, named, typed and described byte for byte as the
    /// committed catalog says (`metrics_catalog.txt`, rendered from the registry before each
    /// adapter registered its own series): the PrometheusRule, the dashboard and the docs use
    /// these names. A series added on purpose is added to the catalog in the same change.
    #[test]
    fn every_series_is_named_and_described_as_the_catalog_says() {
        let metrics = Metrics::new();
        touch_every_family(&metrics);
        let rendered = metrics.render();
        let expected: Vec<&str> = include_str!("metrics_catalog.txt").lines().collect();
        assert_eq!(
            catalog(&rendered),
            expected,
            "the /metrics catalog changed (update infra/app/src/metrics_catalog.txt only for a \
             deliberate change):\n{rendered}"
        );
    }

    #[test]
    fn the_catalog_is_every_help_type_and_unit_line_sorted() {
        let text = "# HELP b_total B.\n# TYPE b counter\nb_total 1\n# HELP a A.\n# TYPE a gauge\n\
                    # UNIT a seconds\na 2\n# EOF\n";
        let want = [
            "# HELP a A.",
            "# HELP b_total B.",
            "# TYPE a gauge",
            "# TYPE b counter",
        ];
        assert_eq!(catalog(text)[..4], want);
        assert_eq!(catalog(text)[4], "# UNIT a seconds");
    }
}
