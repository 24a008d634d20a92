//! The HTTP side server on `--metrics-addr`: `/metrics` (Prometheus text), `/healthz`
//! (liveness: always `ok`) and `/readyz` (`ready` only while gRPC serves and the state store
//! takes commits; `not ready` during start-up, from the first shutdown signal, and with the
//! reason while the last commit attempt failed). The same answer is exported as the gauge
//! `bigfleet_libvirt_ready`, so alert rules can see it. `/timeline?machine=ID` answers one
//! machine's recent events as JSON (`timeline`), read-only.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Exposition;
use crate::timeline::Timeline;

/// Whether the provider is ready to take traffic. Clones share the flags.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    serving: Arc<AtomicBool>,
    /// Why mutations cannot be made durable right now (the last commit attempt failed).
    store_failing: Arc<Mutex<Option<String>>>,
}

impl Readiness {
    /// Marks the provider serving or not.
    pub fn set(&self, ready: bool) {
        self.serving.store(ready, Ordering::SeqCst);
    }

    /// Records why the state store refuses commits, or `None` once it takes them again.
    pub fn set_store_failing(&self, reason: Option<String>) {
        *self
            .store_failing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = reason;
    }

    /// Whether the provider serves (a failing store aside).
    #[must_use]
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::SeqCst)
    }

    /// Whether the provider is ready: serving, with a state store that takes commits.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.not_ready_reason().is_none()
    }

    /// Why the provider is not ready, if it is not.
    #[must_use]
    pub fn not_ready_reason(&self) -> Option<String> {
        if !self.is_serving() {
            return Some(String::new());
        }
        self.store_failing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(|reason| format!("the state store refuses commits: {reason}"))
    }
}

/// Refreshes gauges that are computed at scrape time (machines by state), before each
/// `/metrics` answer is rendered.
pub type ScrapeHook = Arc<dyn Fn() + Send + Sync>;

#[derive(Clone)]
struct HttpState {
    metrics: Exposition,
    timeline: Timeline,
    readiness: Readiness,
    on_scrape: ScrapeHook,
}

/// The side server's routes: `/metrics` renders `metrics`, `/timeline` reads `timeline`.
pub fn router(
    metrics: Exposition,
    timeline: Timeline,
    readiness: Readiness,
    on_scrape: ScrapeHook,
) -> Router {
    Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/timeline", get(timeline_page))
        .with_state(HttpState {
            metrics,
            timeline,
            readiness,
            on_scrape,
        })
}

async fn metrics_page(State(state): State<HttpState>) -> impl IntoResponse {
    (state.on_scrape)();
    state
        .metrics
        .ready
        .set(i64::from(state.readiness.is_ready()));
    let body = state.metrics.render();
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    ([(header::CONTENT_TYPE, content_type)], body)
}

/// `GET /timeline?machine=ID`: the machine's recent events as JSON (see `timeline`).
async fn timeline_page(
    State(state): State<HttpState>,
    Query(query): Query<crate::timeline::Query>,
) -> (StatusCode, [(header::HeaderName, &'static str); 1], String) {
    let (status, body) = crate::timeline::answer(&state.timeline, &query);
    let content_type = if status == 200 {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    };
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, content_type)], body)
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<HttpState>) -> (StatusCode, String) {
    match state.readiness.not_ready_reason() {
        None => (StatusCode::OK, "ready\n".to_owned()),
        Some(reason) if reason.is_empty() => {
            (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_owned())
        }
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn metrics_body(addr: std::net::SocketAddr) -> String {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n")
            .await
            .unwrap();
        let mut raw = String::new();
        tcp.read_to_string(&mut raw).await.unwrap();
        raw
    }

    #[tokio::test]
    async fn the_ready_gauge_says_what_readyz_says() {
        let readiness = Readiness::default();
        let app = router(
            Exposition::seal(prometheus_client::registry::Registry::default()),
            Timeline::default(),
            readiness.clone(),
            Arc::new(|| {}),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = async {
            let starting = metrics_body(addr).await;
            readiness.set(true);
            let serving = metrics_body(addr).await;
            readiness.set(false);
            let stopping = metrics_body(addr).await;
            (starting, serving, stopping)
        };
        let (starting, serving, stopping) = tokio::select! {
            biased;
            result = axum::serve(listener, app) => panic!("the server stopped: {result:?}"),
            bodies = client => bodies,
        };
        assert!(
            starting.contains("\nbigfleet_libvirt_ready 0\n"),
            "{starting}"
        );
        assert!(
            serving.contains("\nbigfleet_libvirt_ready 1\n"),
            "{serving}"
        );
        assert!(
            stopping.contains("\nbigfleet_libvirt_ready 0\n"),
            "{stopping}"
        );
    }
}
