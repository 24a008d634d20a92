//! A decorator that gives every hypervisor call a span and the reference's metrics
//! (`bigfleet_libvirt_api_calls_total{op,outcome}` and
//! `bigfleet_libvirt_api_duration_seconds{op}`), whichever hypervisor it wraps. The op names
//! are the reference's, so dashboards carry over.

use std::future::Future;

use bigfleet_libvirt_domain::Machine;
use bigfleet_libvirt_ports::{
    ConfigureRequest, CreateRequest, Created, DeleteRequest, DrainRequest, Hypervisor,
    HypervisorError, ReadinessRequest,
};
use tracing::{Instrument, debug_span};

use crate::metrics::{ApiLabels, Metrics, OpLabels};
use bigfleet_libvirt_system::Stopwatch;

/// Wraps a hypervisor with spans and metrics.
#[derive(Clone)]
pub struct InstrumentedHypervisor<H> {
    inner: H,
    metrics: Metrics,
}

impl<H> InstrumentedHypervisor<H> {
    /// Wraps `inner`, recording into `metrics`.
    pub fn new(inner: H, metrics: Metrics) -> Self {
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
        call: impl Future<Output = Result<T, HypervisorError>>,
    ) -> Result<T, HypervisorError> {
        let watch = Stopwatch::start();
        let result = call.instrument(span.clone()).await;
        let outcome = if result.is_ok() { "success" } else { "error" };
        if let Err(e) = &result {
            span.in_scope(|| tracing::debug!(error = %e, "hypervisor call failed"));
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
    debug_span!("hypervisor", op = name, machine_id = %machine.id, operation_id)
}

impl<H: Hypervisor> Hypervisor for InstrumentedHypervisor<H> {
    async fn describe(&self) -> Result<Vec<Machine>, HypervisorError> {
        let span = debug_span!("hypervisor", op = "DescribeManaged");
        self.observe("DescribeManaged", span, self.inner.describe())
            .await
    }

    async fn create(&self, request: CreateRequest) -> Result<Created, HypervisorError> {
        let span = call_span(
            "CreateDomain",
            &request.machine,
            request.operation_id.as_str(),
        );
        self.observe("CreateDomain", span, self.inner.create(request))
            .await
    }

    async fn configure(&self, request: ConfigureRequest) -> Result<(), HypervisorError> {
        let span = call_span("Configure", &request.machine, request.operation_id.as_str());
        self.observe("Configure", span, self.inner.configure(request))
            .await
    }

    async fn confirm_node_ready(&self, request: ReadinessRequest) -> Result<(), HypervisorError> {
        let span = call_span("NodeReady", &request.machine, request.operation_id.as_str());
        self.observe("NodeReady", span, self.inner.confirm_node_ready(request))
            .await
    }

    fn readiness_gate(&self) -> bool {
        self.inner.readiness_gate()
    }

    async fn drain(&self, request: DrainRequest) -> Result<(), HypervisorError> {
        let span = call_span("Drain", &request.machine, request.operation_id.as_str());
        self.observe("Drain", span, self.inner.drain(request)).await
    }

    async fn delete(&self, request: DeleteRequest) -> Result<(), HypervisorError> {
        let span = call_span(
            "DeleteDomain",
            &request.machine,
            request.operation_id.as_str(),
        );
        self.observe("DeleteDomain", span, self.inner.delete(request))
            .await
    }

    fn restored(&self, machines: &[std::sync::Arc<Machine>]) {
        self.inner.restored(machines);
    }
}
