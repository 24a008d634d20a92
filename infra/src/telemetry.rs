//! Logging set-up: structured logs on stderr as text or JSON, filtered by `RUST_LOG` when
//! set, else by the configured level.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How log lines are rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable `key=value` lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber. `env_filter` is the value of `RUST_LOG`, if any; it wins
/// over `level`.
///
/// # Errors
/// When the filter does not parse or a subscriber is already installed.
pub fn init(format: LogFormat, level: &str, env_filter: Option<&str>) -> anyhow::Result<()> {
    let filter = match env_filter {
        Some(spec) if !spec.is_empty() => EnvFilter::try_new(spec)
            .map_err(|e| anyhow::anyhow!("RUST_LOG {spec:?} does not parse: {e}"))?,
        _ => EnvFilter::try_new(level)
            .map_err(|e| anyhow::anyhow!("--log-level {level:?} does not parse: {e}"))?,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!("install the log subscriber: {e}"))
}
