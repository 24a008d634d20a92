//! Settings in, a running provider out: everything between a validated [`Plan`] and the
//! servers, in one place that the binary and the benchmarks both run. [`run`] chooses the
//! store (`--state` or memory) and the backend (the fake or libvirt), configures the
//! adapter from the plan, wraps it in the [`InstrumentedHypervisor`] metrics decorator,
//! starts the provider through [`assemble`](crate::assemble), gives the restored machines
//! back to the backend (the fake adopts their domains, libvirt tracks them for drift and
//! orphan checks), binds both ports and serves until shutdown.

use std::future::Future;
use std::time::Duration;

use anyhow::Context;
use bigfleet_libvirt_grpc::identity::IdentityMode;
use bigfleet_libvirt_grpc::tls::TlsState;
use bigfleet_libvirt_libvirt::{LibvirtConfig, LibvirtHypervisor};
use bigfleet_libvirt_memory::MemoryStateStore;
use bigfleet_libvirt_memory::fake::{FakeConfig, FakeHypervisor};
use bigfleet_libvirt_observe::instrumented::InstrumentedHypervisor;
use bigfleet_libvirt_observe::metrics::Metrics;
use bigfleet_libvirt_ports::{Hypervisor, Provider, Spawner, StateStore};
use bigfleet_libvirt_redb::RedbStateStore;
use bigfleet_libvirt_system::{SystemClock, TokioSpawner};
use tokio::net::TcpListener;
use tracing::warn;

use crate::exit::Exit;
use crate::launch::{Backend, Plan};
use crate::{Banner, NetLimits, ServeConfig};

/// The provider as [`run`] builds it, for an [`OnStart`] hook.
pub type Running<H, S> = Provider<H, S, SystemClock, TokioSpawner>;

/// The two ports, already bound (a caller that binds port 0 learns the addresses first).
#[derive(Debug)]
pub struct Listeners {
    /// The gRPC port (`--addr`).
    pub grpc: TcpListener,
    /// The HTTP side server's port (`--metrics-addr`), if any.
    pub http: Option<TcpListener>,
}

/// Told about the provider once it is started and its restored machines are handed back
/// to the backend, before it serves. `()` does nothing; the provider benchmark keeps a
/// handle to time List's server-side steps in-process.
pub trait OnStart {
    /// Called once, with the provider about to serve.
    fn started<H: Hypervisor, S: StateStore>(self, provider: &Running<H, S>);
}

impl OnStart for () {
    fn started<H: Hypervisor, S: StateStore>(self, _: &Running<H, S>) {}
}

/// Serves `plan` until `shutdown` completes. With `listeners` `None` both ports are bound
/// from the plan once the provider has started (a bind failure is fatal and names the
/// flag), as the binary does.
///
/// # Errors
/// When the state file cannot be opened, the provider cannot start, `--base-user-data`
/// cannot be read, a port cannot be bound, or a server fails while running.
pub async fn run(
    plan: Plan,
    tls: Option<TlsState>,
    limits: NetLimits,
    listeners: Option<Listeners>,
    on_start: impl OnStart,
    shutdown: impl Future<Output = ()> + Send,
    exit: &Exit,
) -> anyhow::Result<()> {
    let ports = Ports {
        tls,
        limits,
        listeners,
    };
    match &plan.state {
        Some(path) => match RedbStateStore::open(path) {
            Ok(store) => {
                exit.close_at_exit(&store);
                serve(plan, store, ports, on_start, shutdown, exit).await
            }
            Err(e) => Err(anyhow::anyhow!("--state: {e}")),
        },
        None => {
            warn!("no --state: bindings, fence marks and operation ids will not survive a restart");
            let store = MemoryStateStore::new();
            serve(plan, store, ports, on_start, shutdown, exit).await
        }
    }
}

/// How the servers are reached: TLS, per-client bounds, and ports bound by the caller.
struct Ports {
    tls: Option<TlsState>,
    limits: NetLimits,
    listeners: Option<Listeners>,
}

async fn serve<S: StateStore>(
    mut plan: Plan,
    store: S,
    ports: Ports,
    on_start: impl OnStart,
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
            on_start.started(&provider);
            run_servers(&plan, provider, metrics, ports, shutdown).await
        }
        Backend::Libvirt => serve_libvirt(plan, store, metrics, ports, on_start, shutdown).await,
    }
}

/// The provider over `hypervisor`, on the real clock and spawner.
async fn start<H: Hypervisor, S: StateStore>(
    plan: &Plan,
    hypervisor: H,
    store: S,
    metrics: &Metrics,
) -> anyhow::Result<Running<H, S>> {
    let config = plan.provider.clone();
    Ok(crate::assemble(
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
    mut plan: Plan,
    store: S,
    metrics: Metrics,
    ports: Ports,
    on_start: impl OnStart,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let config = libvirt_config(&mut plan)?;
    let libvirt =
        LibvirtHypervisor::connect(config, SystemClock, &TokioSpawner, metrics.clone()).await;
    TokioSpawner.spawn(
        "libvirt-redial-on-sighup",
        libvirt.clone().redial_on_sighup(),
    );
    let hypervisor = InstrumentedHypervisor::new(libvirt.clone(), metrics.clone());
    let provider = start(&plan, hypervisor, store, &metrics).await?;
    // Restored machines tell the adapter what should be running (drift and orphan checks).
    libvirt.track(&provider.peek(&Default::default()).machines);
    on_start.started(&provider);
    run_servers(&plan, provider, metrics, ports, shutdown).await
}

/// Moves the plan's slots into the adapter's configuration: the plan needs them no longer,
/// and a second copy of every record would double the inventory's memory.
fn libvirt_config(plan: &mut Plan) -> anyhow::Result<LibvirtConfig> {
    let user_data = match &plan.libvirt.base_user_data {
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
        plan.catalog.clone(),
        &plan.libvirt.image,
    );
    config.options = plan.libvirt.clone();
    config.user_data = user_data;
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

/// Binds both ports unless the caller did (a bind failure is fatal and names the flag) and
/// serves until a signal.
async fn run_servers<H: Hypervisor, S: StateStore>(
    plan: &Plan,
    provider: Running<H, S>,
    metrics: Metrics,
    ports: Ports,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let Ports {
        tls,
        limits,
        listeners,
    } = ports;
    let Listeners { grpc, http } = match listeners {
        Some(bound) => bound,
        None => bind(plan).await?,
    };
    let mut zones: Vec<String> = plan.connections.iter().map(|c| c.zone.clone()).collect();
    zones.sort();
    let backend = match plan.backend {
        Backend::Fake => "fake",
        Backend::Libvirt => "libvirt",
    };
    let config = ServeConfig {
        reflection: plan.reflection,
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
    crate::serve(provider, metrics, grpc, http, config, shutdown).await
}

/// Binds `plan`'s `--addr` and `--metrics-addr`.
async fn bind(plan: &Plan) -> anyhow::Result<Listeners> {
    let grpc = TcpListener::bind(plan.grpc_addr)
        .await
        .with_context(|| format!("--addr: listen on {}", plan.grpc_addr))?;
    let http = match plan.metrics_addr {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("--metrics-addr: listen on {addr}"))?,
        ),
        None => None,
    };
    Ok(Listeners { grpc, http })
}
