//! The lanes' series (`bigfleet_libvirt_host_queue_*`, `…_host_in_flight`,
//! `…_host_budget`), owned by this crate and registered by it on the process's registry.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use bigfleet_libvirt_system::Stopwatch;

use bigfleet_libvirt_ports::lanes::{Lane, LaneObserver};

/// Labels of the per-lane series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaneLabels {
    /// The host's zone.
    pub zone: String,
    /// `teardown`, `create`, `read` or `agent`.
    pub lane: String,
}

/// A single `zone` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ZoneLabels {
    /// The host's zone.
    pub zone: String,
}

type WaitFamily = Family<LaneLabels, Histogram, fn() -> Histogram>;

/// Queue depth, queue wait and calls in flight per zone and lane, and each host's budget.
/// Clones share the series; a fresh value records into series no registry shows until
/// [`LaneMetrics::register`] is called.
#[derive(Clone)]
pub struct LaneMetrics {
    depth: Family<LaneLabels, Gauge>,
    wait: WaitFamily,
    in_flight: Family<LaneLabels, Gauge>,
    budget: Family<ZoneLabels, Gauge>,
}

/// 1 ms to about 65 s.
fn wait_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

impl Default for LaneMetrics {
    fn default() -> Self {
        Self {
            depth: Family::default(),
            wait: Family::new_with_constructor(wait_histogram as fn() -> Histogram),
            in_flight: Family::default(),
            budget: Family::default(),
        }
    }
}

impl std::fmt::Debug for LaneMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneMetrics").finish_non_exhaustive()
    }
}

fn gauge_value(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

impl LaneMetrics {
    /// Registers the four series on `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "bigfleet_libvirt_host_queue_depth",
            "libvirt calls waiting for a slot of their host's budget, by zone and lane",
            self.depth.clone(),
        );
        registry.register(
            "bigfleet_libvirt_host_queue_wait_seconds",
            "Time a libvirt call waited for a slot of its host's budget, by zone and lane",
            self.wait.clone(),
        );
        registry.register(
            "bigfleet_libvirt_host_in_flight",
            "libvirt calls in flight on a host, by zone and lane",
            self.in_flight.clone(),
        );
        registry.register(
            "bigfleet_libvirt_host_budget",
            "The most libvirt calls this process keeps in flight on a host (--host-budget)",
            self.budget.clone(),
        );
    }

    /// Sets `bigfleet_libvirt_host_budget` for `zone`.
    pub fn set_budget(&self, zone: &str, budget: usize) {
        let labels = ZoneLabels {
            zone: zone.to_owned(),
        };
        self.budget.get_or_create(&labels).set(gauge_value(budget));
    }

    /// Sets one lane's queue depth and calls in flight on `zone`.
    pub fn set_lane(&self, zone: &str, lane: &str, depth: usize, in_flight: usize) {
        let labels = LaneLabels {
            zone: zone.to_owned(),
            lane: lane.to_owned(),
        };
        self.depth.get_or_create(&labels).set(gauge_value(depth));
        self.in_flight
            .get_or_create(&labels)
            .set(gauge_value(in_flight));
    }

    /// Records how long one call of `lane` on `zone` waited for a slot.
    pub fn observe_wait(&self, zone: &str, lane: &str, seconds: f64) {
        let labels = LaneLabels {
            zone: zone.to_owned(),
            lane: lane.to_owned(),
        };
        self.wait.get_or_create(&labels).observe(seconds);
    }

    /// The text exposition of these series alone (tests and tools).
    #[must_use]
    pub fn render(&self) -> String {
        let mut registry = Registry::default();
        self.register(&mut registry);
        let mut out = String::new();
        // Encoding into a String cannot fail.
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("encode metrics into a string");
        out
    }
}

/// The lanes' view of a host, as series: the wait is timed here, from the call's arrival
/// at its lanes to its grant.
impl LaneObserver for LaneMetrics {
    fn budget(&self, zone: &str, budget: usize) {
        self.set_budget(zone, budget);
    }

    fn lane(&self, zone: &str, lane: Lane, depth: usize, in_flight: usize) {
        self.set_lane(zone, lane.name(), depth, in_flight);
    }

    fn wait(&self, zone: &str, lane: Lane) -> Box<dyn FnOnce() + Send> {
        let watch = Stopwatch::start();
        let (metrics, zone) = (self.clone(), zone.to_owned());
        Box::new(move || metrics.observe_wait(&zone, lane.name(), watch.seconds()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use bigfleet_libvirt_ports::lanes::{Budget, Lanes};

    #[tokio::test(start_paused = true)]
    async fn depth_wait_in_flight_and_budget_are_exported() {
        let metrics = LaneMetrics::default();
        let lanes = Lanes::new(
            "zone-a",
            Budget::new(3, 1).unwrap(),
            Arc::new(metrics.clone()),
        );
        let first = lanes.acquire(Lane::Create).await;
        let mut second = Box::pin(lanes.acquire(Lane::Create));
        assert!(futures::poll!(&mut second).is_pending());
        let text = metrics.render();
        for line in [
            "bigfleet_libvirt_host_budget{zone=\"zone-a\"} 3",
            "bigfleet_libvirt_host_queue_depth{zone=\"zone-a\",lane=\"create\"} 1",
            "bigfleet_libvirt_host_in_flight{zone=\"zone-a\",lane=\"create\"} 1",
            "bigfleet_libvirt_host_queue_wait_seconds_count{zone=\"zone-a\",lane=\"create\"} 1",
            "bigfleet_libvirt_host_queue_depth{zone=\"zone-a\",lane=\"teardown\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        drop(first);
        let _second = second.await;
        assert!(
            metrics
                .render()
                .contains("bigfleet_libvirt_host_queue_depth{zone=\"zone-a\",lane=\"create\"} 0")
        );
    }
}
