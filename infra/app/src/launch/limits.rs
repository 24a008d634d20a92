//! The per-client bound flags (`--max-connections` … `--list-memory-budget-mib`), checked
//! into the servers' [`NetLimits`].

use std::time::Duration;

use bigfleet_libvirt_observe::limits::HttpLimits;

use super::{LaunchError, flag};
use crate::NetLimits;

/// The per-client bounds, as typed values. Field names are the flag names.
#[derive(Clone, Copy, Debug)]
pub struct LimitFlags {
    pub max_connections: usize,
    pub max_concurrent_streams: u32,
    pub handshake_timeout: Duration,
    pub http2_keepalive_interval: Duration,
    pub http2_keepalive_timeout: Duration,
    pub metrics_max_connections: usize,
    pub http_header_read_timeout: Duration,
    pub http_idle_timeout: Duration,
    pub list_memory_budget_mib: usize,
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
