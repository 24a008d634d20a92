//! The per-client bound flags (`--max-connections` … `--list-progress-timeout`), checked
//! into the servers' [`NetLimits`].

use std::time::Duration;

use bigfleet_libvirt_observe::limits::HttpLimits;

use super::{LaunchError, flag, parse_duration};
use crate::NetLimits;

/// The per-client bounds, as typed values. Field names are the flag names.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct LimitFlags {
    /// gRPC connections open at once on --addr; a new client past it evicts the oldest idle one.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_MAX_CONNECTIONS",
        default_value_t = 1024
    )]
    pub max_connections: usize,
    /// Concurrent HTTP/2 streams per gRPC connection; streams past it get REFUSED_STREAM.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_MAX_CONCURRENT_STREAMS",
        default_value_t = 256
    )]
    pub max_concurrent_streams: u32,
    /// How long a new gRPC connection may take to finish TLS and send the HTTP/2 preface.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_HANDSHAKE_TIMEOUT", default_value = "10s",
          value_parser = parse_duration)]
    pub handshake_timeout: Duration,
    /// HTTP/2 keepalive ping period on a quiet gRPC connection.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_HTTP2_KEEPALIVE_INTERVAL",
          default_value = "30s", value_parser = parse_duration)]
    pub http2_keepalive_interval: Duration,
    /// How long a keepalive ping may go unanswered before the gRPC connection is dropped.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_HTTP2_KEEPALIVE_TIMEOUT",
          default_value = "10s", value_parser = parse_duration)]
    pub http2_keepalive_timeout: Duration,
    /// Connections open at once on --metrics-addr; a new client past it evicts the oldest idle one.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_METRICS_MAX_CONNECTIONS",
        default_value_t = 64
    )]
    pub metrics_max_connections: usize,
    /// How long a request head on --metrics-addr may take (from connect or the last response).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_HTTP_HEADER_READ_TIMEOUT",
          default_value = "10s", value_parser = parse_duration)]
    pub http_header_read_timeout: Duration,
    /// How long a connection on --metrics-addr may move no byte before it is closed.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_HTTP_IDLE_TIMEOUT", default_value = "60s",
          value_parser = parse_duration)]
    pub http_idle_timeout: Duration,
    /// MiB the large List answers (over 1 MiB each) being streamed may hold at once, measured:
    /// the shared encodings are not counted; Lists that do not fit wait. Within the pod's limit.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_LIST_MEMORY_BUDGET_MIB",
        default_value_t = 64
    )]
    pub list_memory_budget_mib: usize,
    /// A List stream whose reader takes nothing for this long is cut (reset with CANCEL).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_LIST_PROGRESS_TIMEOUT",
          default_value = "30s", value_parser = parse_duration)]
    pub list_progress_timeout: Duration,
}

/// Validates the per-client bounds: every count and every timeout must be above 0.
///
/// # Errors
/// The first flag set to 0, with its default.
pub fn net_limits(flags: &LimitFlags) -> Result<NetLimits, LaunchError> {
    let defaults = NetLimits::default();
    check_counts(flags, &defaults)?;
    check_timeouts(flags, &defaults)?;
    Ok(NetLimits {
        grpc_max_connections: flags.max_connections,
        max_concurrent_streams: flags.max_concurrent_streams,
        handshake_timeout: flags.handshake_timeout,
        http2_keepalive_interval: flags.http2_keepalive_interval,
        http2_keepalive_timeout: flags.http2_keepalive_timeout,
        http: HttpLimits {
            max_connections: flags.metrics_max_connections,
            header_read_timeout: flags.http_header_read_timeout,
            idle_timeout: flags.http_idle_timeout,
        },
        list_memory_budget_mib: flags.list_memory_budget_mib,
        list_progress_timeout: flags.list_progress_timeout,
    })
}

/// The counts among the bounds: each at least 1.
fn check_counts(flags: &LimitFlags, defaults: &NetLimits) -> Result<(), LaunchError> {
    for (name, value, default) in [
        (
            "--max-connections",
            flags.max_connections,
            defaults.grpc_max_connections,
        ),
        (
            "--max-concurrent-streams",
            flags.max_concurrent_streams as usize,
            defaults.max_concurrent_streams as usize,
        ),
        (
            "--metrics-max-connections",
            flags.metrics_max_connections,
            defaults.http.max_connections,
        ),
        (
            "--list-memory-budget-mib",
            flags.list_memory_budget_mib,
            defaults.list_memory_budget_mib,
        ),
    ] {
        if value == 0 {
            return Err(flag(format!(
                "{name} must be at least 1 (the default is {default})"
            )));
        }
    }
    Ok(())
}

/// The timeouts among the bounds: each above 0.
fn check_timeouts(flags: &LimitFlags, defaults: &NetLimits) -> Result<(), LaunchError> {
    for (name, value, default) in [
        (
            "--handshake-timeout",
            flags.handshake_timeout,
            defaults.handshake_timeout,
        ),
        (
            "--http2-keepalive-interval",
            flags.http2_keepalive_interval,
            defaults.http2_keepalive_interval,
        ),
        (
            "--http2-keepalive-timeout",
            flags.http2_keepalive_timeout,
            defaults.http2_keepalive_timeout,
        ),
        (
            "--http-header-read-timeout",
            flags.http_header_read_timeout,
            defaults.http.header_read_timeout,
        ),
        (
            "--http-idle-timeout",
            flags.http_idle_timeout,
            defaults.http.idle_timeout,
        ),
        (
            "--list-progress-timeout",
            flags.list_progress_timeout,
            defaults.list_progress_timeout,
        ),
    ] {
        if value.is_zero() {
            return Err(flag(format!(
                "{name} must be above 0 (the default is {})",
                humantime::format_duration(default)
            )));
        }
    }
    Ok(())
}
