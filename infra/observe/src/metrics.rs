//! The exposition of the provider's Prometheus metrics, on an explicit registry (no
//! process-global state).
//!
//! Each adapter declares and registers the series it produces, on the one [`Registry`] the
//! composition root creates (`docs/architecture.md`, "Who owns a series"): the hypervisor
//! calls here in [`crate::instrumented`], the libvirt hosts in the libvirt crate, gRPC and
//! client identity in the grpc crate, transitions, machines, the state store and the
//! connection caps in the composition root. This module keeps what the exposition itself
//! produces: `bigfleet_libvirt_ready` (set by the side server on every scrape) and the
//! scrape-time collectors (`process_*` with feature `process`, the OTLP export counters with
//! feature `otlp`), and [`Exposition::render`].
//!
//! Series names follow the reference provider (`bigfleet_libvirt_*`) so existing
//! dashboards keep working.

use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The prefix of every series the provider itself names.
pub const PREFIX: &str = "bigfleet_libvirt";

/// Buckets of request-sized latencies (0.5 ms up to about 16 s): gRPC calls.
#[must_use]
pub fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Buckets of work-sized durations (10 ms up to about 22 min): transitions, hypervisor
/// calls and libvirt phases.
#[must_use]
pub fn transition_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 18))
}

/// Every registered series, sealed for rendering, and the readiness gauge the side server
/// sets at scrape time. Clones share the registry.
#[derive(Clone)]
pub struct Exposition {
    registry: Arc<Registry>,
    /// 1 while the provider is ready to take traffic (what `/readyz` answers), else 0.
    pub ready: Gauge,
}

impl Exposition {
    /// Registers the exposition's own series (`bigfleet_libvirt_ready` and the scrape-time
    /// collectors) after what the adapters registered on `registry`, and seals it.
    #[must_use]
    pub fn seal(mut registry: Registry) -> Self {
        let ready = Gauge::default();
        registry.register(
            format!("{PREFIX}_ready"),
            "1 while the provider is ready to take traffic (the answer of /readyz), else 0",
            ready.clone(),
        );
        #[cfg(feature = "process")]
        registry.register_collector(Box::new(crate::process::ProcessCollector));
        #[cfg(feature = "otlp")]
        registry.register_collector(Box::new(crate::export::ExportCollector));
        Self {
            registry: Arc::new(registry),
            ready,
        }
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

impl std::fmt::Debug for Exposition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exposition").finish_non_exhaustive()
    }
}
