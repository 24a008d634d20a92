//! What the provider tells its operators: Prometheus metrics (`metrics`, with the standard
//! `process_*` series from `process`), the `/metrics` `/healthz` `/readyz` routes (`http`)
//! and the bounded HTTP side server that serves them (`side_server`), logs and OTLP tracing
//! (`telemetry`, with the bounded export path in `export` and inbound W3C trace context in
//! `trace_context`), the `Hypervisor` decorator that times and counts every backend call
//! (`instrumented`), and every machine's recent history (`timeline`).

pub mod export;
pub mod http;
pub mod instrumented;
pub mod metrics;
mod process;
pub mod side_server;
pub mod telemetry;
pub mod timeline;
pub mod trace_context;
