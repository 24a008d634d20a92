//! The HTTP side server on `--metrics-addr`: `/metrics` (Prometheus text), `/healthz`
//! (liveness: always `ok`) and `/readyz` (`ready` only while gRPC serves; `not ready`
//! during start-up and from the first shutdown signal).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;

/// Whether the provider is ready to take traffic. Clones share the flag.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the provider ready or not.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    /// Whether the provider is ready.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Refreshes gauges that are computed at scrape time (machines by state).
pub type ScrapeHook = Arc<dyn Fn(&Metrics) + Send + Sync>;

#[derive(Clone)]
struct HttpState {
    metrics: Metrics,
    readiness: Readiness,
    on_scrape: ScrapeHook,
}

/// The side server's routes.
pub fn router(metrics: Metrics, readiness: Readiness, on_scrape: ScrapeHook) -> Router {
    Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(HttpState {
            metrics,
            readiness,
            on_scrape,
        })
}

async fn metrics_page(State(state): State<HttpState>) -> impl IntoResponse {
    (state.on_scrape)(&state.metrics);
    let body = state.metrics.render();
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    ([(header::CONTENT_TYPE, content_type)], body)
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<HttpState>) -> (StatusCode, &'static str) {
    if state.readiness.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}
