//! Inbound W3C trace context: a call's `traceparent`, `tracestate` and `baggage` headers,
//! read with the OpenTelemetry SDK's own propagators (W3C Trace Context and W3C Baggage),
//! make the call's span a child of the caller's span, so everything the call starts (its
//! transition, the hypervisor and guest-agent calls, also after the answer has left) is in
//! the caller's trace. A malformed `traceparent` is ignored: the call starts a new trace.
//!
//! Of the baggage, only the entries named in [`BAGGAGE_KEYS`] are kept, as span attributes
//! `baggage.<key>`, each value cut to the echo bound of every caller-supplied string.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

use bigfleet_libvirt_domain::EchoField;
use opentelemetry::Context;
use opentelemetry::baggage::BaggageExt;
use opentelemetry::propagation::{Extractor, TextMapCompositePropagator, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TraceId};
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The baggage entries kept as span attributes (`baggage.<key>`); every other entry is
/// ignored.
pub const BAGGAGE_KEYS: [&str; 3] = [
    "bigfleet.cluster_id",
    "bigfleet.scale_reason",
    "bigfleet.request_id",
];

/// The three headers a caller's context arrives in, as found in a call's metadata.
#[derive(Clone, Copy, Debug, Default)]
pub struct Carrier<'a> {
    /// `traceparent`.
    pub traceparent: Option<&'a str>,
    /// `tracestate`.
    pub tracestate: Option<&'a str>,
    /// `baggage`.
    pub baggage: Option<&'a str>,
}

impl Carrier<'_> {
    /// The header names read, lower-case as gRPC metadata keys are.
    pub const HEADERS: [&'static str; 3] = ["traceparent", "tracestate", "baggage"];

    fn is_empty(&self) -> bool {
        self.traceparent.is_none() && self.tracestate.is_none() && self.baggage.is_none()
    }
}

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => self.traceparent,
            "tracestate" => self.tracestate,
            "baggage" => self.baggage,
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        Self::HEADERS
            .into_iter()
            .filter(|key| self.get(key).is_some())
            .collect()
    }
}

/// Whether spans go to an OpenTelemetry layer (set once by `telemetry::init` when it installs
/// one): without it there is no trace to continue and no trace id to read.
pub(crate) static ENABLED: AtomicBool = AtomicBool::new(false);

static PROPAGATOR: LazyLock<TextMapCompositePropagator> = LazyLock::new(|| {
    TextMapCompositePropagator::new(vec![
        Box::new(TraceContextPropagator::new()),
        Box::new(BaggagePropagator::new()),
    ])
});

/// Makes `span` (not yet entered) a child of the caller's span named in `carrier`, and
/// keeps the documented baggage entries as its attributes. Without a valid `traceparent`
/// the span stays a root (a malformed one is logged at debug).
pub fn adopt(span: &tracing::Span, carrier: &Carrier<'_>) {
    // Without the layer (no OTLP endpoint) there is nothing to parent: skip the parsing.
    if carrier.is_empty() || !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let parent = PROPAGATOR.extract(carrier);
    let valid = parent.span().span_context().is_valid();
    if carrier.traceparent.is_some() && !valid {
        tracing::debug!(
            parent: span,
            traceparent = %EchoField(carrier.traceparent.unwrap_or_default()),
            "malformed traceparent ignored: the call starts a new trace"
        );
    }
    for key in BAGGAGE_KEYS {
        if let Some(value) = parent.baggage().get(key) {
            let value = EchoField(value.as_str()).to_string();
            span.set_attribute(format!("baggage.{key}"), value);
        }
    }
    if valid {
        // Fails only when no OpenTelemetry layer is installed (nothing to parent then).
        let _no_layer = span.set_parent(parent);
    }
}

/// The trace of the current span, if spans have trace ids (an OpenTelemetry layer is
/// installed and the span is enabled for it).
#[must_use]
pub fn current_trace_id() -> Option<TraceId> {
    trace_id(&tracing::Span::current())
}

/// The trace `span` belongs to, if it has one.
#[must_use]
pub fn trace_id(span: &tracing::Span) -> Option<TraceId> {
    if span.is_none() || !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    let context: Context = span.context();
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then(|| span_context.trace_id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_carrier_lists_only_the_headers_it_has() {
        let carrier = Carrier {
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            tracestate: None,
            baggage: Some("bigfleet.request_id=r1"),
        };
        assert_eq!(carrier.keys(), ["traceparent", "baggage"]);
        assert_eq!(carrier.get("tracestate"), None);
        assert_eq!(carrier.get("other"), None);
    }
}
