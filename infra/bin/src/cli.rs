//! The command line: the subcommands, the logging flags, and the launch and per-client flags
//! flattened from the library, where they are declared once (`launch::Flags`,
//! `launch::LimitFlags`) with their defaults and `BIGFLEET_LIBVIRT_<FLAG>` variables.

use std::time::Duration;

use bigfleet_libvirt_app::launch::{Flags, LimitFlags, parse_duration};
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "bigfleet-libvirt",
    version,
    about = "BigFleet capacity provider for libvirt hosts"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub flags: Flags,
    #[command(flatten)]
    pub limits: LimitFlags,
    /// Log format.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_LOG_FORMAT", value_enum, default_value_t = Format::Text)]
    pub log_format: Format,
    /// OTLP/gRPC endpoint for traces (e.g. http://collector:4317); unset = no export.
    #[arg(long, global = true, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Log level (RUST_LOG, when set, wins).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_LOG_LEVEL",
        default_value = "info"
    )]
    pub log_level: String,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the Speculative inventory these flags would serve, as JSON, and exit.
    Offerings,
    /// Check every --connect host against these flags (read-only) and print a verdict:
    /// exit 0 when nothing blocks, 1 when something blocks, 2 for warnings only.
    Doctor {
        /// table for a person, json for tools.
        #[arg(long, env = "BIGFLEET_LIBVIRT_OUTPUT", value_enum, default_value_t = Output::Table)]
        output: Output,
        /// How long one host may take to answer every check.
        #[arg(long, env = "BIGFLEET_LIBVIRT_HOST_TIMEOUT", default_value = "30s",
              value_parser = parse_duration)]
        host_timeout: Duration,
        /// Exit 0 instead of 2 when there are warnings but no blockers (for hook Jobs).
        #[arg(long, env = "BIGFLEET_LIBVIRT_ALLOW_WARNINGS")]
        allow_warnings: bool,
        /// Also start (paused) and destroy one throw-away domain per CPU choice on every
        /// host, to find a CPU mode QEMU aborts on; without it doctor changes nothing.
        #[arg(long, env = "BIGFLEET_LIBVIRT_TRIAL_DOMAIN")]
        trial_domain: bool,
    },
    /// Work with a --state file without serving it.
    State {
        #[command(subcommand)]
        action: StateCommand,
    },
}

#[derive(Subcommand, Debug)]
pub enum StateCommand {
    /// Print what the --state file holds (read-only; refused while a provider holds it).
    Inspect {
        /// Show only this machine's record, fence marks and operation ids.
        #[arg(long, env = "BIGFLEET_LIBVIRT_MACHINE")]
        machine: Option<String>,
        /// table for a person, json for tools.
        #[arg(long, env = "BIGFLEET_LIBVIRT_OUTPUT", value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

/// How a report is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Format {
    Text,
    Json,
}
