//! What the provider tells its operators: the exposition of the Prometheus metrics each
//! adapter registers (`metrics`, with the standard `process_*` series from `process`), the
//! `/metrics` `/healthz` `/readyz` routes (`http`) and the bounded HTTP side server that
//! serves them (`side_server`), logs and OTLP tracing (`telemetry`, with the JSON line's formatter and span-field store in
//! `json_line` and `json_fields`, with the bounded export
//! path in `export` and inbound W3C trace context in `trace_context`), the `Hypervisor` decorator that times and counts every backend call
//! (`instrumented`), and every machine's recent history (`timeline`). The side server's
//! client bounds (`limits`) are plain values, there with or without the server.
//!
//! Features (all on by default; the simulator builds with none): `side-server` (the HTTP
//! side server, on axum and hyper), `process` (the `process_*` series, through procfs) and
//! `otlp` (logs and OTLP tracing set-up, through opentelemetry-otlp).

#[cfg(feature = "otlp")]
pub mod export;
#[cfg(feature = "side-server")]
pub mod http;
pub mod instrumented;
#[cfg(feature = "otlp")]
pub mod json_fields;
#[cfg(feature = "otlp")]
pub mod json_line;
pub mod limits;
pub mod metrics;
#[cfg(feature = "process")]
mod process;
#[cfg(feature = "side-server")]
pub mod side_server;
#[cfg(feature = "otlp")]
pub mod telemetry;
pub mod timeline;
pub mod trace_context;
