//! The OTLP export path's bounds, counted. Spans are exported by the SDK's batch processor
//! from its own thread, so an RPC never waits for the collector; this module puts a gate in
//! front of it and a counter behind it:
//!
//! - at most `OTEL_BSP_MAX_QUEUE_SIZE` (default 2,048) ended spans wait for export at once,
//!   counting the batch being sent; a span ending while that many wait is dropped and
//!   counted (`reason="queue_full"`), so memory stays bounded however long the collector is
//!   away, and the batch processor's own queue can never fill (its drops are not counted);
//! - a batch the collector does not take (refused, unreachable, timed out after
//!   `OTEL_BSP_EXPORT_TIMEOUT`) is dropped and its spans counted (`reason="export_failed"`);
//!   the OTLP exporter does not retry it.
//!
//! Both counts are `bigfleet_libvirt_otlp_spans_dropped_total{reason}`, beside
//! `bigfleet_libvirt_otlp_spans_exported_total`. They are process-wide (one tracer per
//! process, as the tracing subscriber is), so a registry reads them through a collector.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter, SpanProcessor};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;

/// The default bound on spans waiting for export (the OpenTelemetry spec's default).
pub const DEFAULT_QUEUE: usize = 2048;

static EXPORTED: AtomicU64 = AtomicU64::new(0);
static DROPPED_QUEUE_FULL: AtomicU64 = AtomicU64::new(0);
static DROPPED_EXPORT_FAILED: AtomicU64 = AtomicU64::new(0);

/// The bound on spans waiting for export: `OTEL_BSP_MAX_QUEUE_SIZE` when it is a positive
/// integer (the value the batch processor is built with, so the two agree), else
/// [`DEFAULT_QUEUE`].
#[must_use]
pub fn queue_bound(env: Option<&str>) -> usize {
    env.and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_QUEUE)
}

/// Admits an ended span to the wrapped processor only while fewer than the bound wait.
#[derive(Debug)]
pub struct Gate<P> {
    inner: P,
    waiting: Arc<AtomicUsize>,
    bound: usize,
}

/// Counts what the wrapped exporter sent and dropped, and releases the gate's places.
#[derive(Debug)]
pub struct Counted<E> {
    inner: E,
    waiting: Arc<AtomicUsize>,
}

/// Puts a [`Gate`] in front of a processor whose exporter is the matching [`Counted`].
#[derive(Debug)]
pub struct GateBuilder {
    waiting: Arc<AtomicUsize>,
    bound: usize,
}

impl GateBuilder {
    /// The gate in front of `inner`, which must hand every admitted span to the exporter
    /// [`bounded`] returned with this builder (as the batch processor does).
    pub fn wrap<P: SpanProcessor>(self, inner: P) -> Gate<P> {
        Gate {
            inner,
            waiting: self.waiting,
            bound: self.bound,
        }
    }
}

/// The exporter, counted, and the builder of the gate that goes in front of the processor
/// built over it; at most `bound` spans wait between the two.
pub fn bounded<E: SpanExporter>(exporter: E, bound: usize) -> (Counted<E>, GateBuilder) {
    let waiting = Arc::new(AtomicUsize::new(0));
    let counted = Counted {
        inner: exporter,
        waiting: Arc::clone(&waiting),
    };
    (counted, GateBuilder { waiting, bound })
}

impl<P: SpanProcessor> SpanProcessor for Gate<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        let admitted = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.bound).then_some(n + 1)
            })
            .is_ok();
        if admitted {
            self.inner.on_end(span);
        } else {
            DROPPED_QUEUE_FULL.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        let count = u64::try_from(spans).unwrap_or(u64::MAX);
        match &result {
            Ok(()) => EXPORTED.fetch_add(count, Ordering::Relaxed),
            Err(_) => DROPPED_EXPORT_FAILED.fetch_add(count, Ordering::Relaxed),
        };
        // Saturating: never below zero, whatever the processor hands over.
        let _ = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(spans))
            });
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The export counters at scrape time.
#[derive(Debug)]
pub struct ExportCollector;

impl Collector for ExportCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let exported = ConstCounter::new(EXPORTED.load(Ordering::Relaxed));
        let e = encoder.encode_descriptor(
            "bigfleet_libvirt_otlp_spans_exported",
            "Spans the OTLP collector accepted",
            None,
            exported.metric_type(),
        )?;
        exported.encode(e)?;
        let mut family = encoder.encode_descriptor(
            "bigfleet_libvirt_otlp_spans_dropped",
            "Spans dropped on the way to the OTLP collector, by reason",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (reason, count) in [
            ("queue_full", &DROPPED_QUEUE_FULL),
            ("export_failed", &DROPPED_EXPORT_FAILED),
        ] {
            let counter = ConstCounter::new(count.load(Ordering::Relaxed));
            let labels = [("reason", reason)];
            counter.encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status};
    use opentelemetry_sdk::error::OTelSdkError;

    use super::*;

    #[test]
    fn the_queue_bound_is_the_batch_processors() {
        assert_eq!(queue_bound(None), DEFAULT_QUEUE);
        assert_eq!(queue_bound(Some("64")), 64);
        assert_eq!(queue_bound(Some(" 64 ")), 64);
        assert_eq!(queue_bound(Some("0")), DEFAULT_QUEUE);
        assert_eq!(queue_bound(Some("lots")), DEFAULT_QUEUE);
    }

    /// Keeps what it is handed, as the batch processor's queue does.
    #[derive(Debug, Default)]
    struct Queue(Mutex<Vec<SpanData>>);

    impl SpanProcessor for Queue {
        fn on_start(&self, _: &mut opentelemetry_sdk::trace::Span, _: &Context) {}
        fn on_end(&self, span: SpanData) {
            self.0.lock().unwrap().push(span);
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
            Ok(())
        }
    }

    impl Queue {
        fn take(&self) -> Vec<SpanData> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    /// A collector that takes everything, or nothing.
    #[derive(Debug)]
    struct Collector(bool);

    impl SpanExporter for Collector {
        async fn export(&self, _: Vec<SpanData>) -> OTelSdkResult {
            if self.0 {
                Ok(())
            } else {
                Err(OTelSdkError::InternalFailure(
                    "connection refused".to_owned(),
                ))
            }
        }
    }

    fn span() -> SpanData {
        SpanData {
            span_context: SpanContext::empty_context(),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: "rpc".into(),
            start_time: std::time::UNIX_EPOCH,
            end_time: std::time::UNIX_EPOCH,
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: Default::default(),
        }
    }

    fn counts() -> [u64; 3] {
        [&EXPORTED, &DROPPED_QUEUE_FULL, &DROPPED_EXPORT_FAILED].map(|c| c.load(Ordering::SeqCst))
    }

    /// Three may wait: the fourth and fifth are dropped and counted; a batch the collector
    /// refuses is counted and frees its places; one it takes is counted as exported.
    #[tokio::test]
    async fn at_most_the_bound_waits_and_every_drop_is_counted() {
        let start = counts();
        let delta = || {
            let now = counts();
            [0, 1, 2].map(|i| now[i] - start[i])
        };
        let (down, gate) = bounded(Collector(false), 3);
        let gate = gate.wrap(Queue::default());
        (0..5).for_each(|_| gate.on_end(span()));
        let waiting = gate.inner.take();
        assert_eq!(waiting.len(), 3, "the bound");
        assert_eq!(delta(), [0, 2, 0], "two turned away");
        assert!(down.export(waiting).await.is_err());
        assert_eq!(delta(), [0, 2, 3], "the refused batch");
        gate.on_end(span());
        assert_eq!(
            gate.inner.take().len(),
            1,
            "places freed by the failed export"
        );

        let (up, gate) = bounded(Collector(true), 3);
        let gate = gate.wrap(Queue::default());
        (0..2).for_each(|_| gate.on_end(span()));
        up.export(gate.inner.take()).await.unwrap();
        assert_eq!(delta(), [2, 2, 3], "the accepted batch");
    }
}
