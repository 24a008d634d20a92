//! `/metrics` scraped over HTTP and parsed with a Prometheus text parser.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::http_get;

/// One parsed `/metrics` page.
pub struct Scrape {
    pub parsed: prometheus_parse::Scrape,
    pub text: String,
}

/// Scrapes `/metrics`, checks it is OpenMetrics text ending in `# EOF`, and parses it.
pub async fn scrape(addr: SocketAddr) -> Scrape {
    let (status, head, body) = http_get(addr, "/metrics").await.expect("GET /metrics");
    assert_eq!(status, 200, "/metrics status; head {head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "/metrics content type: {head}"
    );
    assert_eq!(
        body.lines().last(),
        Some("# EOF"),
        "OpenMetrics ends with # EOF"
    );
    let parsed = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned())))
        .expect("parse the exposition");
    Scrape { parsed, text: body }
}

impl Scrape {
    /// The value of the sample `name` whose label set is exactly `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.parsed
            .samples
            .iter()
            .filter(|s| s.metric == name && s.labels.len() == labels.len())
            .find(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .and_then(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => Some(v),
                _ => None,
            })
    }

    /// Like `value`, with an absent series read as 0 (a counter not yet created).
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels).unwrap_or(0.0)
    }

    /// Every sample of `name`, by the value of `label`.
    pub fn by_label(&self, name: &str, label: &str) -> HashMap<String, f64> {
        self.parsed
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .filter_map(|s| {
                let key = s.labels.get(label)?.to_owned();
                match s.value {
                    prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => {
                        Some((key, v))
                    }
                    _ => None,
                }
            })
            .collect()
    }
}

/// Scrapes until `ok` holds (transition bookkeeping may land just after the state change).
pub async fn scrape_until(addr: SocketAddr, what: &str, ok: impl Fn(&Scrape) -> bool) -> Scrape {
    scrape_within(addr, what, Duration::from_secs(5), ok).await
}

/// Scrapes until `ok` holds, for at most `within` (a series a reconcile sets: it waits for
/// the next describe of a real host).
pub async fn scrape_within(
    addr: SocketAddr,
    what: &str,
    within: Duration,
    ok: impl Fn(&Scrape) -> bool,
) -> Scrape {
    let start = Instant::now();
    loop {
        let page = scrape(addr).await;
        if ok(&page) {
            super::timing::seen(&format!("scrape until {what}"), start.elapsed(), within);
            return page;
        }
        assert!(
            start.elapsed() < within,
            "{what} never held within {within:?}; last page:\n{}",
            page.text
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
