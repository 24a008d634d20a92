//! `bigfleet-libvirt`: the BigFleet capacity provider for libvirt/QEMU-KVM hosts.
//!
//! This file owns clap and the environment; everything else is library code. Every flag
//! also reads `BIGFLEET_LIBVIRT_<FLAG>`; a flag on the command line wins over its variable.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use bigfleet_libvirt_app as app;
use bigfleet_libvirt_app::inspect;
use bigfleet_libvirt_app::launch::{self, Backend, Plan};
use bigfleet_libvirt_app::preflight;
use bigfleet_libvirt_grpc::tls::TlsState;
use bigfleet_libvirt_libvirt::doctor;
use bigfleet_libvirt_observe::telemetry::{self, LogFormat, TelemetryConfig};
use bigfleet_libvirt_redb as store;
use bigfleet_libvirt_system::SystemClock;
use bigfleet_libvirt_system::accept;
use clap::Parser;

mod cli;

/// How long `doctor` waits for its threads to finish after printing the report when a
/// host's probe was left behind at its timeout (its thread may never leave libvirt).
const DOCTOR_JOIN_TIMEOUT: Duration = Duration::from_secs(1);
/// How long it waits when every probe returned: their threads only have to exit, which on
/// a machine busy with guests took longer than a second (the C libraries' exit-time
/// cleanup then ran beside a thread still tearing down its TLS state, and the process died
/// of a signal after printing its report, its exit code lost).
const DOCTOR_JOIN_RETURNED: Duration = Duration::from_secs(30);

use cli::{Cli, Command, Format, Output, StateCommand};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("bigfleet-libvirt: start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(Command::Doctor {
        output,
        host_timeout,
        allow_warnings,
        trial_domain,
    }) = &cli.command
    {
        let flags = DoctorFlags {
            output: *output,
            host_timeout: *host_timeout,
            allow_warnings: *allow_warnings,
            trial_domain: *trial_domain,
        };
        let (code, all_returned) = runtime.block_on(doctor(&cli, flags));
        // Join the runtime's threads before `exit` runs the C libraries' cleanup: a thread
        // still freeing its OpenSSL thread state while libcrypto tears down crashes the
        // process after the report is printed. A host that never answered keeps its
        // thread blocked, so give up on that one after a second instead of waiting.
        let join = if all_returned {
            DOCTOR_JOIN_RETURNED
        } else {
            DOCTOR_JOIN_TIMEOUT
        };
        runtime.shutdown_timeout(join);
        return code;
    }
    let exit = app::Exit::default();
    let served = runtime.block_on(run(&cli, &exit));
    // Every runtime thread is joined before anything else happens at exit (see doctor).
    drop(runtime);
    exit.finish();
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bigfleet-libvirt: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, skipping a cause its parent already quotes.
fn one_line(error: &anyhow::Error) -> String {
    let mut line = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !line.contains(&cause) {
            line = format!("{line}: {cause}");
        }
    }
    line
}

/// The `doctor` subcommand's own flags.
#[derive(Clone, Copy)]
struct DoctorFlags {
    output: Output,
    host_timeout: Duration,
    allow_warnings: bool,
    trial_domain: bool,
}

/// `doctor`: the same configuration checks as serving, then every host probed and judged;
/// the exit code, and whether every host's probe returned.
async fn doctor(cli: &Cli, flags: DoctorFlags) -> (ExitCode, bool) {
    let DoctorFlags {
        output,
        host_timeout,
        allow_warnings,
        trial_domain,
    } = flags;
    let (report, all_returned) = match doctor_plan(cli) {
        Ok(plan) => {
            let probed = preflight::run(&plan, &SystemClock, host_timeout, trial_domain).await;
            (probed.report, probed.all_returned)
        }
        Err(e) => (doctor::Report::refused_configuration(&one_line(&e)), true),
    };
    let printed = match output {
        Output::Json => serde_json::to_string_pretty(&report).map(|json| json + "\n"),
        Output::Table => Ok(doctor::table(&report)),
    };
    match printed {
        Ok(text) => print!("{text}"),
        Err(e) => {
            eprintln!("bigfleet-libvirt: doctor: print the report: {e}");
            return (ExitCode::FAILURE, all_returned);
        }
    }
    let code = match report.exit_code() {
        2 if allow_warnings => ExitCode::SUCCESS,
        code => ExitCode::from(code),
    };
    (code, all_returned)
}

/// The plan serving would run, refused for the same reasons serving refuses it.
fn doctor_plan(cli: &Cli) -> anyhow::Result<Plan> {
    let plan = launch::resolve(&cli.flags)?;
    launch::net_limits(&cli.limits)?;
    launch::check_client_programs(&plan, |program| which::which(program).is_ok())?;
    if let Some(tls) = plan.tls.clone() {
        TlsState::load(tls)?;
    }
    if plan.backend != Backend::Libvirt {
        anyhow::bail!(
            "these flags run the in-memory fake hypervisor, so there is no host to check: pass \
             --connect (a libvirt URI, or zone=uri,...) and --image"
        );
    }
    Ok(plan)
}

/// `state inspect`: reads the file read-only and prints it; never serves, never writes.
fn inspect_state(
    state: Option<&std::path::Path>,
    machine: Option<&str>,
    output: Output,
) -> anyhow::Result<()> {
    let Some(state) = state else {
        anyhow::bail!(
            "state inspect needs --state FILE (or BIGFLEET_LIBVIRT_STATE): the file to read"
        );
    };
    let inspected = store::inspect(state).map_err(|e| anyhow::anyhow!("state inspect: {e}"))?;
    let report = inspect::report(&state.display().to_string(), inspected, machine)?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Table => print!("{}", inspect::table(&report)),
    }
    Ok(())
}

fn telemetry_config(cli: &Cli) -> TelemetryConfig {
    // The binary is the one place that reads the environment.
    let env = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
    TelemetryConfig {
        format: match cli.log_format {
            Format::Text => LogFormat::Text,
            Format::Json => LogFormat::Json,
        },
        level: cli.log_level.clone(),
        env_filter: env("RUST_LOG"),
        otlp_endpoint: cli.otlp_endpoint.clone().filter(|e| !e.is_empty()),
        service_name: env("OTEL_SERVICE_NAME")
            .is_none()
            .then(|| "bigfleet-libvirt".to_owned()),
    }
}

async fn run(cli: &Cli, exit: &app::Exit) -> anyhow::Result<()> {
    if let Some(Command::State {
        action: StateCommand::Inspect { machine, output },
    }) = &cli.command
    {
        return inspect_state(cli.flags.state.as_deref(), machine.as_deref(), *output);
    }
    // Installed first, so a SIGTERM or SIGINT that arrives while the provider starts (or in
    // the instant after it announces itself) is a clean shutdown, not the default action.
    let shutdown = shutdown_signal()?;
    let plan = launch::resolve(&cli.flags)?;
    let limits = launch::net_limits(&cli.limits)?;
    if let Some(Command::Offerings) = cli.command {
        println!("{}", serde_json::to_string_pretty(&launch::dry_run(&plan))?);
        return Ok(());
    }
    // A transport that runs a local program (qemu+ssh runs ssh) needs it on PATH.
    launch::check_client_programs(&plan, |program| which::which(program).is_ok())?;
    // TLS material is checked before any host or file is touched.
    let tls = plan.tls.clone().map(TlsState::load).transpose()?;
    let telemetry = telemetry::init(&telemetry_config(cli))?;
    accept::raise_nofile_limit();
    let served = app::run(app::Launch {
        plan,
        tls,
        limits,
        listeners: None,
        on_start: (),
        shutdown,
        exit,
    })
    .await;
    telemetry.shutdown().await;
    served
}

/// Installs the SIGTERM and SIGINT handlers now and returns the future that completes on the
/// first of them. (An `async fn` would install them only when first polled, leaving the
/// default action — death by the signal — in place until then.)
fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()> + Send> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("install the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            biased;
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}
