//! A decorator that gives every hypervisor call a span and the reference's metrics
//! (`bigfleet_libvirt_api_calls_total{op,outcome}` and
//! `bigfleet_libvirt_api_duration_seconds{op}`), whichever hypervisor it wraps. The op names
//! are the reference's, so dashboards carry over. Each call on a machine is also a phase on
//! that machine's timeline (`timeline`), with its duration and error.

use std::future::Future;

use std::sync::Arc;

use bigfleet_libvirt_domain::{Machine, Timestamp};
use bigfleet_libvirt_ports::{
    ConfigureRequest, CreateRequest, Created, DeleteRequest, DrainRequest, Hypervisor,
    HypervisorError, ReadinessRequest,
};
use tracing::{Instrument, debug_span};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::metrics::{PREFIX, transition_histogram};
use crate::timeline::{Timeline, What, bounded, millis, phase_index};
use bigfleet_libvirt_system::Stopwatch;

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

/// The decorator's series, and the timeline its calls are recorded on.
#[derive(Clone, Debug)]
pub struct ApiMetrics {
    /// Hypervisor calls by operation and outcome.
    pub api_calls: Family<ApiLabels, Counter>,
    /// Hypervisor call latency by operation.
    pub api_duration: Family<OpLabels, Histogram>,
    /// Every machine's recent events (each call on a machine is a phase there).
    pub timeline: Timeline,
}

impl ApiMetrics {
    /// Declares the decorator's series and registers them on `registry`.
    pub fn register(registry: &mut Registry, timeline: Timeline) -> Self {
        let metrics = Self {
            api_calls: Family::default(),
            api_duration: Family::new_with_constructor(transition_histogram as fn() -> _),
            timeline,
        };
        registry.register(
            format!("{PREFIX}_api_calls"),
            "Hypervisor calls by operation and outcome",
            metrics.api_calls.clone(),
        );
        registry.register(
            format!("{PREFIX}_api_duration_seconds"),
            "Hypervisor call latency",
            metrics.api_duration.clone(),
        );
        metrics
    }

    /// The series on a registry of their own (tests and contract suites that read no
    /// exposition).
    #[must_use]
    pub fn unexposed() -> Self {
        Self::register(&mut Registry::default(), Timeline::default())
    }
}

/// Wraps a hypervisor with spans and metrics.
#[derive(Clone)]
pub struct InstrumentedHypervisor<H> {
    inner: H,
    metrics: ApiMetrics,
}

impl<H> InstrumentedHypervisor<H> {
    /// Wraps `inner`, recording into `metrics`.
    pub fn new(inner: H, metrics: ApiMetrics) -> Self {
        Self { inner, metrics }
    }

    /// The wrapped hypervisor.
    pub fn inner(&self) -> &H {
        &self.inner
    }

    async fn observe<T>(
        &self,
        op: &'static str,
        span: tracing::Span,
        machine: Option<&Machine>,
        call: impl Future<Output = Result<T, HypervisorError>>,
    ) -> Result<T, HypervisorError> {
        let watch = Stopwatch::start();
        let result = call.instrument(span.clone()).await;
        let outcome = if result.is_ok() { "success" } else { "error" };
        span.record("outcome", outcome);
        if let Err(e) = &result {
            span.record("otel.status_code", "ERROR");
            span.record("otel.status_description", e.message.as_str());
            span.in_scope(|| tracing::debug!(error = %e, "hypervisor call failed"));
        }
        if let Some(machine) = machine {
            let duration = std::time::Duration::from_secs_f64(watch.seconds());
            let timeline = &self.metrics.timeline;
            let began = timeline
                .now()
                .map(|now| Timestamp(now.0.saturating_sub(duration_nanos(duration))));
            let error = result.as_ref().err().map(|e| bounded(&e.message));
            let phase = What::Phase {
                op: phase_index(op),
                millis: millis(duration),
                error,
            };
            span.in_scope(|| timeline.record(machine.id.as_str(), began, phase));
        }
        let labels = ApiLabels {
            op: op.to_owned(),
            outcome: outcome.to_owned(),
        };
        self.metrics.api_calls.get_or_create(&labels).inc();
        let seconds = watch.seconds();
        self.metrics
            .api_duration
            .get_or_create(&OpLabels { op: op.to_owned() })
            .observe(seconds);
        result
    }
}

fn call_span(name: &'static str, machine: &Machine, operation_id: &str) -> tracing::Span {
    debug_span!(
        "hypervisor",
        op = name,
        machine_id = %machine.id,
        operation_id,
        zone = %machine.zone,
        outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    )
}

fn duration_nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl<H: Hypervisor> Hypervisor for InstrumentedHypervisor<H> {
    async fn describe(&self) -> Result<Vec<Machine>, HypervisorError> {
        let span = debug_span!(
            "hypervisor",
            op = "DescribeManaged",
            outcome = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        self.observe("DescribeManaged", span, None, self.inner.describe())
            .await
    }

    async fn create(&self, request: CreateRequest) -> Result<Created, HypervisorError> {
        let span = call_span(
            "CreateDomain",
            &request.machine,
            request.operation_id.as_str(),
        );
        let machine = Arc::clone(&request.machine);
        self.observe(
            "CreateDomain",
            span,
            Some(&machine),
            self.inner.create(request),
        )
        .await
    }

    async fn configure(&self, request: ConfigureRequest) -> Result<(), HypervisorError> {
        let span = call_span("Configure", &request.machine, request.operation_id.as_str());
        let machine = Arc::clone(&request.machine);
        self.observe(
            "Configure",
            span,
            Some(&machine),
            self.inner.configure(request),
        )
        .await
    }

    async fn confirm_node_ready(&self, request: ReadinessRequest) -> Result<(), HypervisorError> {
        let span = call_span("NodeReady", &request.machine, request.operation_id.as_str());
        let machine = Arc::clone(&request.machine);
        self.observe(
            "NodeReady",
            span,
            Some(&machine),
            self.inner.confirm_node_ready(request),
        )
        .await
    }

    fn readiness_gate(&self) -> bool {
        self.inner.readiness_gate()
    }

    async fn drain(&self, request: DrainRequest) -> Result<(), HypervisorError> {
        let span = call_span("Drain", &request.machine, request.operation_id.as_str());
        let machine = Arc::clone(&request.machine);
        self.observe("Drain", span, Some(&machine), self.inner.drain(request))
            .await
    }

    async fn delete(&self, request: DeleteRequest) -> Result<(), HypervisorError> {
        let span = call_span(
            "DeleteDomain",
            &request.machine,
            request.operation_id.as_str(),
        );
        let machine = Arc::clone(&request.machine);
        self.observe(
            "DeleteDomain",
            span,
            Some(&machine),
            self.inner.delete(request),
        )
        .await
    }

    fn restored(&self, machines: &[std::sync::Arc<Machine>]) {
        self.inner.restored(machines);
    }

    fn failed(&self, machine: &Machine) {
        self.inner.failed(machine);
    }
}
