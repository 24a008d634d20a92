//! The series the gRPC service produces: unary requests and their latency, recovered
//! handler panics, calls refused by the client-identity check, and List streams cut by the
//! send-progress deadline. The service declares them
//! and registers them on the registry the composition root hands it.

use bigfleet_libvirt_observe::metrics::{PREFIX, latency_histogram};
use bigfleet_libvirt_observe::timeline::Timeline;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of `bigfleet_libvirt_grpc_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GrpcLabels {
    /// Short method name (`Create`, `List`, …).
    pub method: &'static str,
    /// gRPC code name (`OK`, `NotFound`, `FailedPrecondition`, …).
    pub code: &'static str,
}

/// A single `method` label. Both label sets are static strings, so counting a call
/// allocates nothing.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    /// Short method name.
    pub method: &'static str,
}

/// Labels of `bigfleet_libvirt_authz_denied_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthzLabels {
    /// Short method name (`Create`, `Get`, …).
    pub method: String,
    /// Why the call was refused (`shard_mismatch`, `no_identity`, …).
    pub reason: String,
}

/// The gRPC service's series, and the timeline its mutating calls are recorded on.
#[derive(Clone, Debug)]
pub struct GrpcMetrics {
    /// Unary gRPC requests by method and code.
    pub grpc_requests: Family<GrpcLabels, Counter>,
    /// Unary gRPC latency by method.
    pub grpc_duration: Family<MethodLabels, Histogram>,
    /// Handler panics caught and answered with INTERNAL.
    pub panics: Counter,
    /// Calls refused by the client-identity check, by method and reason.
    pub authz_denied: Family<AuthzLabels, Counter>,
    /// List streams cut because their reader took nothing for `--list-progress-timeout`.
    pub list_streams_cut: Counter,
    /// Every machine's recent events (a mutating call's arrival is one).
    pub timeline: Timeline,
}

impl GrpcMetrics {
    /// Declares the service's series and registers them on `registry`.
    pub fn register(registry: &mut Registry, timeline: Timeline) -> Self {
        let metrics = Self {
            grpc_requests: Family::default(),
            grpc_duration: Family::new_with_constructor(latency_histogram as fn() -> _),
            panics: Counter::default(),
            authz_denied: Family::default(),
            list_streams_cut: Counter::default(),
            timeline,
        };
        registry.register(
            format!("{PREFIX}_grpc_requests"),
            "Unary gRPC requests by method and status code",
            metrics.grpc_requests.clone(),
        );
        registry.register(
            format!("{PREFIX}_grpc_request_duration_seconds"),
            "Unary gRPC request latency",
            metrics.grpc_duration.clone(),
        );
        registry.register(
            format!("{PREFIX}_panics"),
            "Recovered handler panics",
            metrics.panics.clone(),
        );
        registry.register(
            format!("{PREFIX}_authz_denied"),
            "Calls refused by the client-identity check (mTLS), by method and reason",
            metrics.authz_denied.clone(),
        );
        registry.register(
            format!("{PREFIX}_list_streams_cut"),
            "List streams cut because their reader took nothing for --list-progress-timeout",
            metrics.list_streams_cut.clone(),
        );
        metrics
    }
}
