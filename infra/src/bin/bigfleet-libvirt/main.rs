//! `bigfleet-libvirt`: the BigFleet capacity provider for libvirt/QEMU-KVM hosts.
//!
//! This file owns clap and the environment; everything else is library code. Every flag
//! also reads `BIGFLEET_LIBVIRT_<FLAG>`; a flag on the command line wins over its variable.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use bigfleet_libvirt_infra::accept;
use bigfleet_libvirt_infra::app::{self, Banner, NetLimits, ServeConfig};
use bigfleet_libvirt_infra::doctor;
use bigfleet_libvirt_infra::fake::{FakeConfig, FakeHypervisor};
use bigfleet_libvirt_infra::identity::IdentityMode;
use bigfleet_libvirt_infra::inspect;
use bigfleet_libvirt_infra::instrumented::InstrumentedHypervisor;
use bigfleet_libvirt_infra::launch::{self, Backend, Plan};
use bigfleet_libvirt_infra::libvirt::{LibvirtConfig, LibvirtHypervisor};
use bigfleet_libvirt_infra::metrics::Metrics;
use bigfleet_libvirt_infra::preflight;
use bigfleet_libvirt_infra::store::{self, MemoryStateStore, RedbStateStore};
use bigfleet_libvirt_infra::system::{SystemClock, TokioSpawner};
use bigfleet_libvirt_infra::telemetry::{self, LogFormat, TelemetryConfig};
use bigfleet_libvirt_infra::tls::TlsState;
use bigfleet_libvirt_ports::{Hypervisor, Provider, StateStore};
use clap::Parser;
use tracing::warn;

mod cli;

/// How long `doctor` waits for its threads to finish after printing the report.
const DOCTOR_JOIN_TIMEOUT: Duration = Duration::from_secs(1);

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
    }) = &cli.command
    {
        let code = runtime.block_on(doctor(&cli, *output, *host_timeout, *allow_warnings));
        // Join the runtime's threads before `exit` runs the C libraries' cleanup: a thread
        // still freeing its OpenSSL thread state while libcrypto tears down crashes the
        // process after the report is printed. A host that never answered keeps its
        // thread blocked, so give up on that one after a second instead of waiting.
        runtime.shutdown_timeout(DOCTOR_JOIN_TIMEOUT);
        return code;
    }
    let exit = Exit::default();
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

/// What serving hands back to `main` for the exit. Freeing a large inventory (the records,
/// their List encodings, the indexes, the fake's slots) one allocation at a time took most
/// of the time from SIGTERM to exit, and the process is about to give all of its memory
/// back anyway: so once the runtime has stopped, the state file is closed cleanly and
/// those structures are left for the exit to reclaim.
#[derive(Default)]
struct Exit {
    store: std::sync::Mutex<Option<RedbStateStore>>,
    keep: std::sync::Mutex<Vec<Box<dyn Send>>>,
}

impl Exit {
    /// Keeps `value` alive until the process exits, never freeing it.
    fn keep(&self, value: impl Send + 'static) {
        let mut keep = self.keep.lock().unwrap_or_else(|e| e.into_inner());
        keep.push(Box::new(value));
    }

    /// Closes `store` at exit, before whatever holds it is left unfreed.
    fn close_at_exit(&self, store: &RedbStateStore) {
        let mut slot = self.store.lock().unwrap_or_else(|e| e.into_inner());
        *slot = Some(store.clone());
    }

    /// After the runtime has stopped: writes what is queued and closes the state file, then
    /// lets the kept structures go without freeing them.
    fn finish(self) {
        let store = self.store.into_inner().unwrap_or_else(|e| e.into_inner());
        if let Some(store) = store {
            store.close();
        }
        std::mem::forget(self.keep);
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

/// `doctor`: the same configuration checks as serving, then every host probed and judged.
async fn doctor(
    cli: &Cli,
    output: Output,
    host_timeout: Duration,
    allow_warnings: bool,
) -> ExitCode {
    let report = match doctor_plan(cli) {
        Ok(plan) => preflight::run(&plan, &SystemClock, host_timeout).await,
        Err(e) => doctor::Report::refused_configuration(&one_line(&e)),
    };
    let printed = match output {
        Output::Json => serde_json::to_string_pretty(&report).map(|json| json + "\n"),
        Output::Table => Ok(doctor::table(&report)),
    };
    match printed {
        Ok(text) => print!("{text}"),
        Err(e) => {
            eprintln!("bigfleet-libvirt: doctor: print the report: {e}");
            return ExitCode::FAILURE;
        }
    }
    match report.exit_code() {
        2 if allow_warnings => ExitCode::SUCCESS,
        code => ExitCode::from(code),
    }
}

/// The plan serving would run, refused for the same reasons serving refuses it.
fn doctor_plan(cli: &Cli) -> anyhow::Result<Plan> {
    let plan = launch::resolve(&cli.flags())?;
    launch::net_limits(&cli.limit_flags())?;
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
fn inspect_state(state: &str, machine: Option<&str>, output: Output) -> anyhow::Result<()> {
    if state.is_empty() {
        anyhow::bail!(
            "state inspect needs --state FILE (or BIGFLEET_LIBVIRT_STATE): the file to read"
        );
    }
    let inspected = store::inspect(std::path::Path::new(state))
        .map_err(|e| anyhow::anyhow!("state inspect: {e}"))?;
    let report = inspect::report(state, inspected, machine)?;
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

async fn run(cli: &Cli, exit: &Exit) -> anyhow::Result<()> {
    if let Some(Command::State {
        action: StateCommand::Inspect { machine, output },
    }) = &cli.command
    {
        return inspect_state(&cli.state, machine.as_deref(), *output);
    }
    // Installed first, so a SIGTERM or SIGINT that arrives while the provider starts (or in
    // the instant after it announces itself) is a clean shutdown, not the default action.
    let shutdown = shutdown_signal()?;
    let plan = launch::resolve(&cli.flags())?;
    let limits = launch::net_limits(&cli.limit_flags())?;
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
    let served = match &plan.state {
        Some(path) => match RedbStateStore::open(path) {
            Ok(store) => {
                exit.close_at_exit(&store);
                serve(cli, plan, store, tls, limits, shutdown, exit).await
            }
            Err(e) => Err(anyhow::anyhow!("--state: {e}")),
        },
        None => {
            warn!("no --state: bindings, fence marks and operation ids will not survive a restart");
            let store = MemoryStateStore::new();
            serve(cli, plan, store, tls, limits, shutdown, exit).await
        }
    };
    telemetry.shutdown().await;
    served
}

async fn serve<S: StateStore>(
    cli: &Cli,
    mut plan: Plan,
    store: S,
    tls: Option<TlsState>,
    limits: NetLimits,
    shutdown: impl Future<Output = ()> + Send,
    exit: &Exit,
) -> anyhow::Result<()> {
    let metrics = Metrics::new();
    match plan.backend {
        Backend::Fake => {
            warn!(
                "using the IN-MEMORY fake hypervisor: no real domains will be created \
                 (pass --connect for real hosts)"
            );
            let fake = FakeHypervisor::new(fake_config(&mut plan), SystemClock);
            let hypervisor = InstrumentedHypervisor::new(fake.clone(), metrics.clone());
            let provider = start(&plan, hypervisor, store, &metrics).await?;
            // The fake keeps no state of its own: give it back the restored machines' domains.
            fake.adopt(&provider.peek(&Default::default()).machines);
            // Nothing in either needs to run when they go: they are not freed at exit.
            exit.keep(provider.clone());
            exit.keep(fake.clone());
            run_servers(cli, &plan, provider, metrics, tls, limits, shutdown).await
        }
        Backend::Libvirt => serve_libvirt(cli, plan, store, tls, metrics, limits, shutdown).await,
    }
}

/// The provider over `hypervisor`, on the real clock and spawner.
async fn start<H: Hypervisor, S: StateStore>(
    plan: &Plan,
    hypervisor: H,
    store: S,
    metrics: &Metrics,
) -> anyhow::Result<Provider<H, S, SystemClock, TokioSpawner>> {
    let config = plan.provider.clone();
    Ok(app::assemble(
        config,
        hypervisor,
        store,
        SystemClock,
        TokioSpawner,
        metrics,
    )
    .await?)
}

async fn serve_libvirt<S: StateStore>(
    cli: &Cli,
    mut plan: Plan,
    store: S,
    tls: Option<TlsState>,
    metrics: Metrics,
    limits: NetLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let config = libvirt_config(&mut plan)?;
    let libvirt =
        LibvirtHypervisor::connect(config, SystemClock, &TokioSpawner, metrics.clone()).await;
    let hypervisor = InstrumentedHypervisor::new(libvirt.clone(), metrics.clone());
    let provider = start(&plan, hypervisor, store, &metrics).await?;
    // Restored machines tell the adapter what should be running (drift and orphan checks).
    libvirt.track(&provider.peek(&Default::default()).machines);
    run_servers(cli, &plan, provider, metrics, tls, limits, shutdown).await
}

/// Moves the plan's slots into the adapter's configuration: the plan needs them no longer,
/// and a second copy of every record would double the inventory's memory.
fn libvirt_config(plan: &mut Plan) -> anyhow::Result<LibvirtConfig> {
    let settings = &plan.libvirt;
    let user_data = match &settings.base_user_data {
        Some(path) => Some(
            std::fs::read(path)
                .with_context(|| format!("--base-user-data: read {}", path.display()))?,
        ),
        None => None,
    };
    let mut config = LibvirtConfig::new(
        &plan.provider_label,
        plan.connections.clone(),
        std::mem::take(&mut plan.inventory.machines),
        settings.catalog.clone(),
        &settings.image,
    );
    config.storage_pool = settings.storage_pool.clone();
    config.image_source.clone_from(&settings.image_source);
    config.network = settings.network.clone();
    config.platform = settings.platform.clone();
    config.user_data = user_data;
    config.capacity = settings.capacity;
    config.gc = settings.gc;
    config.seed = plan.fake.seed;
    Ok(config)
}

/// As [`libvirt_config`], the plan's slots move into the fake.
fn fake_config(plan: &mut Plan) -> FakeConfig {
    FakeConfig {
        provider: plan.provider_label.clone(),
        slots: std::mem::take(&mut plan.inventory.machines),
        delay_min: plan.fake.delay_min,
        delay_max: plan.fake.delay_max,
        seed: plan.fake.seed,
        fault_hooks: plan.fake.fault_hooks,
        slow_ok_delay: plan.provider.policy.timeouts.configure + Duration::from_secs(1),
    }
}

/// Binds both ports (a bind failure is fatal and names the flag) and serves until a signal.
async fn run_servers<H: Hypervisor, S: StateStore>(
    cli: &Cli,
    plan: &Plan,
    provider: Provider<H, S, SystemClock, TokioSpawner>,
    metrics: Metrics,
    tls: Option<TlsState>,
    limits: NetLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let grpc = tokio::net::TcpListener::bind(plan.grpc_addr)
        .await
        .with_context(|| format!("--addr: listen on {}", plan.grpc_addr))?;
    let http = match plan.metrics_addr {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("--metrics-addr: listen on {addr}"))?,
        ),
        None => None,
    };
    let mut zones: Vec<String> = plan.connections.iter().map(|c| c.zone.clone()).collect();
    zones.sort();
    let backend = match plan.backend {
        Backend::Fake => "fake",
        Backend::Libvirt => "libvirt",
    };
    let config = ServeConfig {
        reflection: cli.reflection,
        reconcile_interval: plan.reconcile_interval,
        drain_period: Duration::from_secs(10),
        banner: Banner {
            provider: plan.provider_label.clone(),
            backend: backend.to_owned(),
            security: tls.as_ref().map_or("insecure", TlsState::mode).to_owned(),
            offerings: plan.offerings.len(),
            zones,
            client_identity: plan.client_identity.name().to_owned(),
        },
        tls,
        fault_hooks: plan.fake.fault_hooks,
        client_identity: plan.client_identity,
        limits,
    };
    if config.tls.as_ref().is_some_and(|t| t.mode() == "mTLS")
        && plan.client_identity == IdentityMode::Off
    {
        warn!(
            "--client-identity=off: every client with a certificate from --tls-ca may call \
             every RPC for any shard"
        );
    }
    app::serve(provider, metrics, grpc, http, config, shutdown).await
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
