//! Logging and tracing set-up: structured logs on stderr as text or JSON (filtered by
//! `RUST_LOG` when set, else by the configured level), and, when an OTLP endpoint is
//! configured, every span exported over OTLP/gRPC with the standard `OTEL_*` variables
//! honoured by the exporter (`OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` by the SDK's
//! sampler, parent-based by default), through the bounded, counted path of `export`.
//! Without an endpoint no OpenTelemetry layer is installed at all (it costs CPU on every
//! span), so spans have no trace ids and the caller's context is not read. Must be called
//! inside the tokio runtime (the exporter's channel lives on it).

use std::io::IsTerminal;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// How log lines are rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable `key=value` lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// What to set up.
#[derive(Clone, Debug)]
pub struct TelemetryConfig {
    /// Log rendering.
    pub format: LogFormat,
    /// The level filter when `env_filter` is unset.
    pub level: String,
    /// The value of `RUST_LOG`, if any; wins over `level`.
    pub env_filter: Option<String>,
    /// The OTLP/gRPC endpoint; `None` disables export.
    pub otlp_endpoint: Option<String>,
    /// The service name, unless `OTEL_SERVICE_NAME` already names it.
    pub service_name: Option<String>,
}

/// Keeps the exporter alive; `shutdown` flushes the spans still buffered.
#[derive(Debug, Default)]
pub struct Telemetry {
    tracer: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Flushes and stops the exporter (blocking work runs off the async threads).
    pub async fn shutdown(self) {
        if let Some(tracer) = self.tracer {
            let flushed = tokio::task::spawn_blocking(move || tracer.shutdown()).await;
            if let Ok(Err(e)) = flushed {
                eprintln!("bigfleet-libvirt: flush OTLP spans: {e}");
            }
        }
    }
}

/// Installs the global subscriber.
///
/// # Errors
/// When the filter does not parse, the exporter cannot be built, or a subscriber is
/// already installed.
pub fn init(config: &TelemetryConfig) -> anyhow::Result<Telemetry> {
    let filter = match config.env_filter.as_deref() {
        Some(spec) if !spec.is_empty() => EnvFilter::try_new(spec)
            .map_err(|e| anyhow::anyhow!("RUST_LOG {spec:?} does not parse: {e}"))?,
        _ => EnvFilter::try_new(&config.level)
            .map_err(|e| anyhow::anyhow!("--log-level {:?} does not parse: {e}", config.level))?,
    };
    let tracer = match &config.otlp_endpoint {
        Some(endpoint) => Some(exporter(endpoint, config.service_name.clone())?),
        None => None,
    };
    // Exported spans have their own filter: the provider's own spans down to debug (one per
    // hypervisor call) whatever the log level, everything else from info.
    let span_filter = Targets::new()
        .with_default(LevelFilter::INFO)
        .with_target("bigfleet_libvirt", LevelFilter::DEBUG);
    let otel = tracer.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("bigfleet-libvirt"))
            .with_filter(span_filter)
    });
    let ansi = std::io::stderr().is_terminal();
    let logs = match config.format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .fmt_fields(crate::json_fields::AppendedJsonFields)
            .event_format(crate::json_line::JsonLine::default())
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
    };
    tracing_subscriber::registry()
        .with(logs)
        .with(otel)
        .try_init()
        .map_err(|e| anyhow::anyhow!("install the log subscriber: {e}"))?;
    crate::trace_context::ENABLED.store(tracer.is_some(), std::sync::atomic::Ordering::Relaxed);
    Ok(Telemetry { tracer })
}

fn exporter(endpoint: &str, service_name: Option<String>) -> anyhow::Result<SdkTracerProvider> {
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| {
            anyhow::anyhow!("--otlp-endpoint {endpoint:?}: cannot build the exporter: {e}")
        })?;
    let mut resource = Resource::builder();
    if let Some(name) = service_name {
        resource = resource.with_service_name(name);
    }
    let bound = crate::export::queue_bound(
        std::env::var(opentelemetry_sdk::trace::OTEL_BSP_MAX_QUEUE_SIZE)
            .ok()
            .as_deref(),
    );
    let (exporter, gate) = crate::export::bounded(exporter, bound);
    let batch = BatchConfigBuilder::default()
        .with_max_queue_size(bound)
        .build();
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(batch)
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(gate.wrap(processor))
        .with_resource(resource.build())
        .build())
}
