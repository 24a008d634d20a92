//! `bigfleet-libvirt`: the BigFleet capacity provider for libvirt/QEMU-KVM hosts.
//!
//! This file owns clap and the environment; everything else is library code. Every flag
//! also reads `BIGFLEET_LIBVIRT_<FLAG>`; a flag on the command line wins over its variable.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use bigfleet_libvirt_infra::app::{self, Banner, ServeConfig};
use bigfleet_libvirt_infra::fake::{FakeConfig, FakeHypervisor};
use bigfleet_libvirt_infra::instrumented::InstrumentedHypervisor;
use bigfleet_libvirt_infra::launch::{self, Backend, Flags, Plan};
use bigfleet_libvirt_infra::metrics::Metrics;
use bigfleet_libvirt_infra::store::{MemoryStateStore, RedbStateStore};
use bigfleet_libvirt_infra::system::{SystemClock, TokioSpawner};
use bigfleet_libvirt_infra::telemetry::{self, LogFormat, TelemetryConfig};
use bigfleet_libvirt_infra::tls::TlsState;
use bigfleet_libvirt_ports::StateStore;
use clap::{ArgAction, Parser, Subcommand, ValueEnum};
use tracing::warn;

#[derive(Parser, Debug)]
#[command(
    name = "bigfleet-libvirt",
    version,
    about = "BigFleet capacity provider for libvirt hosts"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// gRPC listen address (`:PORT` listens on every interface).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_ADDR",
        default_value = ":9000"
    )]
    addr: String,
    /// Label stamped on every HostRef.provider and used in machine ids.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_PROVIDER",
        default_value = "libvirt"
    )]
    provider: String,
    /// libvirt | fake | auto (auto = libvirt when --connect is set, else the fake).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_LIBVIRT_BACKEND",
        default_value = "auto"
    )]
    libvirt_backend: String,
    /// Force the in-memory fake hypervisor whatever else is set (conformance runs).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_USE_FAKE_BACKEND", action = ArgAction::Set,
          num_args = 0..=1, default_value_t = false, default_missing_value = "true")]
    use_fake_backend: bool,
    /// A bare libvirt URI for --default-zone, or a zone=uri,... list (libvirt backend: not in this build yet).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_CONNECT",
        default_value = ""
    )]
    connect: String,
    /// Zone label for a single bare --connect URI; also the stem of the fake's zones.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_DEFAULT_ZONE",
        default_value = "local"
    )]
    default_zone: String,
    /// Durable state file (redb); empty = in-memory only, nothing survives a restart.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_STATE",
        default_value = ""
    )]
    state: String,
    /// Golden base-image volume (libvirt backend; not in this build yet).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_IMAGE",
        default_value = ""
    )]
    image: String,
    /// Storage pool for overlay and cloud-init volumes (libvirt backend).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_STORAGE_POOL",
        default_value = "default"
    )]
    storage_pool: String,
    /// libvirt network for the domain NIC (libvirt backend).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_NETWORK",
        default_value = "default"
    )]
    network: String,
    /// Cloud-init user-data file baked into every new domain (libvirt backend).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_BASE_USER_DATA",
        default_value = ""
    )]
    base_user_data: String,
    /// on_demand (Delete implemented) or bare_metal (fixed pool) for the built-in offerings.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_CAPACITY_TYPE",
        default_value = "on_demand"
    )]
    capacity_type: String,
    /// JSON catalog name -> {vcpu, memory_mib}; replaces the built-in kvm.* sizes.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_INSTANCE_TYPES",
        default_value = ""
    )]
    instance_types: String,
    /// Explicit USD/hour prices, type=usd,...
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_PRICES",
        default_value = ""
    )]
    prices: String,
    /// Synthetic USD/hour per vCPU.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_PRICE_PER_VCPU_HOUR",
        default_value_t = 0.0030
    )]
    price_per_vcpu_hour: f64,
    /// Synthetic USD/hour per GiB of RAM.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_PRICE_PER_GIB_HOUR",
        default_value_t = 0.0008
    )]
    price_per_gib_hour: f64,
    /// JSON offerings file; empty = a built-in mix sized by --seed-count.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_OFFERINGS",
        default_value = ""
    )]
    offerings: String,
    /// Speculative slots in the built-in offerings (values <= 0 mean 16).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_SEED_COUNT",
        default_value_t = 32
    )]
    seed_count: i64,
    /// Background reconcile interval (0 = off), e.g. 30s, 2m.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_RECONCILE_INTERVAL", default_value = "2m",
          value_parser = parse_duration)]
    reconcile_interval: Duration,
    /// HTTP address for /metrics, /healthz, /readyz; empty disables it.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_METRICS_ADDR",
        default_value = ":9090"
    )]
    metrics_addr: String,
    /// Register gRPC server reflection (v1 and v1alpha).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_REFLECTION", action = ArgAction::Set,
          num_args = 0..=1, default_value_t = true, default_missing_value = "true")]
    reflection: bool,
    /// Server certificate (PEM); enables TLS 1.3. Reloaded when the file changes or on SIGHUP.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_TLS_CERT",
        default_value = ""
    )]
    tls_cert: String,
    /// Server private key (PEM).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_TLS_KEY",
        default_value = ""
    )]
    tls_key: String,
    /// Client CA bundle (PEM); enables mTLS (client certificates required and verified).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_TLS_CA",
        default_value = ""
    )]
    tls_ca: String,
    /// Fake only: honour the conformance fault hooks (fault slots and fault-* cluster ids).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_FAKE_FAULT_HOOKS", action = ArgAction::Set,
          num_args = 0..=1, default_value_t = false, default_missing_value = "true")]
    fake_fault_hooks: bool,
    /// Override every transition deadline (e.g. 2s); default Create 5m, Configure 8m, Drain 15m, Delete 5m.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_TRANSITION_TIMEOUT", value_parser = parse_duration)]
    transition_timeout: Option<Duration>,
    /// Fake only: shortest simulated hypervisor latency.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_FAKE_DELAY_MIN", default_value = "20ms",
          value_parser = parse_duration)]
    fake_delay_min: Duration,
    /// Fake only: longest simulated hypervisor latency.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_FAKE_DELAY_MAX", default_value = "200ms",
          value_parser = parse_duration)]
    fake_delay_max: Duration,
    /// Fake only: seed of the latency generator.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_FAKE_SEED",
        default_value_t = 1
    )]
    fake_seed: u64,
    /// Log format.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_LOG_FORMAT", value_enum, default_value_t = Format::Text)]
    log_format: Format,
    /// OTLP/gRPC endpoint for traces (e.g. http://collector:4317); unset = no export.
    #[arg(long, global = true, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// Log level (RUST_LOG, when set, wins).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_LOG_LEVEL",
        default_value = "info"
    )]
    log_level: String,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the Speculative inventory these flags would serve, as JSON, and exit.
    Offerings,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Format {
    Text,
    Json,
}

fn parse_duration(raw: &str) -> Result<Duration, String> {
    if raw.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(raw.trim()).map_err(|e| format!("{e} (use e.g. 500ms, 30s, 2m, 1h)"))
}

fn path(raw: &str) -> Option<PathBuf> {
    (!raw.is_empty()).then(|| PathBuf::from(raw))
}

impl Cli {
    fn flags(&self) -> Flags {
        Flags {
            addr: self.addr.clone(),
            provider: self.provider.clone(),
            libvirt_backend: self.libvirt_backend.clone(),
            use_fake_backend: self.use_fake_backend,
            connect: self.connect.clone(),
            default_zone: self.default_zone.clone(),
            state: path(&self.state),
            image: self.image.clone(),
            storage_pool: self.storage_pool.clone(),
            network: self.network.clone(),
            base_user_data: path(&self.base_user_data),
            capacity_type: self.capacity_type.clone(),
            instance_types: path(&self.instance_types),
            prices: self.prices.clone(),
            price_per_vcpu_hour: self.price_per_vcpu_hour,
            price_per_gib_hour: self.price_per_gib_hour,
            offerings: path(&self.offerings),
            seed_count: self.seed_count,
            reconcile_interval: self.reconcile_interval,
            metrics_addr: self.metrics_addr.clone(),
            reflection: self.reflection,
            tls_cert: path(&self.tls_cert),
            tls_key: path(&self.tls_key),
            tls_ca: path(&self.tls_ca),
            fake_fault_hooks: self.fake_fault_hooks,
            transition_timeout: self.transition_timeout,
            fake_delay_min: self.fake_delay_min,
            fake_delay_max: self.fake_delay_max,
            fake_seed: self.fake_seed,
        }
    }
}

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
    match runtime.block_on(run(&cli)) {
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

async fn run(cli: &Cli) -> anyhow::Result<()> {
    let plan = launch::resolve(&cli.flags())?;
    if let Some(Command::Offerings) = cli.command {
        println!("{}", serde_json::to_string_pretty(&launch::dry_run(&plan))?);
        return Ok(());
    }
    // TLS material is checked before any host or file is touched.
    let tls = plan.tls.clone().map(TlsState::load).transpose()?;
    let telemetry = telemetry::init(&telemetry_config(cli))?;
    let served = match &plan.state {
        Some(path) => match RedbStateStore::open(path) {
            Ok(store) => serve(cli, plan, store, tls).await,
            Err(e) => Err(anyhow::anyhow!("--state: {e}")),
        },
        None => {
            warn!("no --state: bindings, fence marks and operation ids will not survive a restart");
            serve(cli, plan, MemoryStateStore::new(), tls).await
        }
    };
    telemetry.shutdown().await;
    served
}

async fn serve<S: StateStore>(
    cli: &Cli,
    plan: Plan,
    store: S,
    tls: Option<TlsState>,
) -> anyhow::Result<()> {
    debug_assert_eq!(plan.backend, Backend::Fake);
    warn!(
        "using the IN-MEMORY fake hypervisor: no real domains will be created \
         (pass --connect for real hosts)"
    );
    let clock = SystemClock;
    let fake_config = FakeConfig {
        provider: plan.provider_label.clone(),
        slots: plan.inventory.machines.clone(),
        delay_min: plan.fake.delay_min,
        delay_max: plan.fake.delay_max,
        seed: plan.fake.seed,
        fault_hooks: plan.fake.fault_hooks,
        slow_ok_delay: plan.provider.policy.timeouts.configure + Duration::from_secs(1),
    };
    let metrics = Metrics::new();
    let fake = FakeHypervisor::new(fake_config, clock);
    let hypervisor = InstrumentedHypervisor::new(fake.clone(), metrics.clone());
    let provider = app::assemble(
        plan.provider.clone(),
        hypervisor,
        store,
        clock,
        TokioSpawner,
        &metrics,
    )
    .await?;
    // The fake keeps no state of its own: give it back the domains of restored machines.
    fake.adopt(&provider.peek(&Default::default()).machines);
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
    let config = ServeConfig {
        reflection: cli.reflection,
        reconcile_interval: plan.reconcile_interval,
        drain_period: Duration::from_secs(10),
        banner: Banner {
            provider: plan.provider_label.clone(),
            backend: "fake".to_owned(),
            security: tls.as_ref().map_or("insecure", TlsState::mode).to_owned(),
            offerings: plan.offerings.len(),
            zones,
        },
        tls,
        fault_hooks: plan.fake.fault_hooks,
    };
    app::serve(provider, metrics, grpc, http, config, shutdown_signal()).await
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install the SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install the SIGINT handler");
    tokio::select! {
        biased;
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
