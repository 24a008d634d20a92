//! Settings in, a running provider out: everything between a validated [`Plan`] and the
//! servers, in one place that the binary and the benchmarks both run. [`run`] chooses the
//! store (`--state` or memory) and the backend (the fake or libvirt), configures the
//! adapter from the plan, hands both to [`assemble`](crate::assemble) (which instruments the
//! backend, starts the provider and gives it the restored machines), binds both ports and
//! serves until shutdown.

use std::future::Future;
use std::time::Duration;

use anyhow::Context;
use bigfleet_libvirt_domain::authorization::IdentityMode;
use bigfleet_libvirt_grpc::tls::TlsState;
use bigfleet_libvirt_libvirt::{LibvirtConfig, LibvirtHypervisor};
use bigfleet_libvirt_memory::MemoryStateStore;
use bigfleet_libvirt_memory::fake::{FakeConfig, FakeHypervisor};
use bigfleet_libvirt_observe::instrumented::InstrumentedHypervisor;
use bigfleet_libvirt_ports::{Hypervisor, Provider, Spawner, StateStore};
use bigfleet_libvirt_redb::RedbStateStore;
use bigfleet_libvirt_system::{SystemClock, TokioSpawner};
use tokio::net::TcpListener;
use tracing::warn;

use crate::exit::Exit;
use crate::launch::{Backend, Plan};
use crate::metrics::Metrics;
use crate::{Banner, NetLimits, Parts, ServeConfig};

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

/// Everything [`run`] needs: the validated plan, how the ports are reached, who is told
/// once the provider has started, when to stop, and what is left for the process exit.
pub struct Launch<'a, O, F> {
    /// The validated flags.
    pub plan: Plan,
    /// TLS material for the gRPC port; `None` serves plaintext.
    pub tls: Option<TlsState>,
    /// Per-client bounds on both ports.
    pub limits: NetLimits,
    /// Ports the caller bound already; `None` binds the plan's.
    pub listeners: Option<Listeners>,
    /// Told about the provider before it serves (`()` for nobody).
    pub on_start: O,
    /// Serving ends when this completes.
    pub shutdown: F,
    /// What the fast exit closes and keeps.
    pub exit: &'a Exit,
}

/// Serves `launch.plan` until `launch.shutdown` completes. With `listeners` `None` both
/// ports are bound from the plan once the provider has started (a bind failure is fatal
/// and names the flag), as the binary does.
///
/// # Errors
/// When the state file cannot be opened, the provider cannot start, `--base-user-data`
/// cannot be read, a port cannot be bound, or a server fails while running.
pub async fn run<O: OnStart, F: Future<Output = ()> + Send>(
    launch: Launch<'_, O, F>,
) -> anyhow::Result<()> {
    match &launch.plan.state {
        Some(path) => match RedbStateStore::open(path) {
            Ok(store) => {
                launch.exit.close_at_exit(&store);
                serve(launch, store).await
            }
            Err(e) => Err(anyhow::anyhow!("--state: {e}")),
        },
        None => {
            warn!("no --state: bindings, fence marks and operation ids will not survive a restart");
            serve(launch, MemoryStateStore::new()).await
        }
    }
}

/// Builds the chosen backend from the plan and serves the provider over it and `store`.
async fn serve<S: StateStore, O: OnStart, F: Future<Output = ()> + Send>(
    mut launch: Launch<'_, O, F>,
    store: S,
) -> anyhow::Result<()> {
    let metrics = Metrics::new();
    match launch.plan.backend {
        Backend::Fake => {
            warn!(
                "using the IN-MEMORY fake hypervisor: no real domains will be created \
                 (pass --connect for real hosts)"
            );
            let fake = FakeHypervisor::new(fake_config(&mut launch.plan), SystemClock);
            let provider = start(&launch.plan, fake, store, &metrics).await?;
            // Nothing in the provider or the fake it holds needs to run when they go: they
            // are not freed at exit.
            launch.exit.keep(provider.clone());
            run_servers(launch, provider, metrics).await
        }
        Backend::Libvirt => {
            let config = libvirt_config(&mut launch.plan)?;
            let libvirt = LibvirtHypervisor::connect(
                config,
                SystemClock,
                &TokioSpawner,
                metrics.libvirt.clone(),
            )
            .await;
            TokioSpawner.spawn(
                "libvirt-redial-on-sighup",
                libvirt.clone().redial_on_sighup(),
            );
            let provider = start(&launch.plan, libvirt, store, &metrics).await?;
            run_servers(launch, provider, metrics).await
        }
    }
}

/// The provider over `hypervisor`, on the real clock and spawner, through
/// [`assemble`](crate::assemble).
async fn start<H: Hypervisor, S: StateStore>(
    plan: &Plan,
    hypervisor: H,
    store: S,
    metrics: &Metrics,
) -> anyhow::Result<Running<InstrumentedHypervisor<H>, S>> {
    let parts = Parts {
        config: plan.provider.clone(),
        hypervisor,
        store,
        clock: SystemClock,
        spawner: TokioSpawner,
        metrics: metrics.clone(),
        observers: Vec::new(),
    };
    Ok(crate::assemble(parts).await?)
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
    config.agent = (config.agent).fit_to(&plan.provider.policy.timeouts);
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

/// Tells the `on_start` hook, binds both ports unless the caller did (a bind failure is
/// fatal and names the flag) and serves until `shutdown`.
async fn run_servers<H: Hypervisor, S: StateStore, O: OnStart, F: Future<Output = ()> + Send>(
    launch: Launch<'_, O, F>,
    provider: Running<H, S>,
    metrics: Metrics,
) -> anyhow::Result<()> {
    let Launch {
        plan,
        tls,
        limits,
        listeners,
        on_start,
        shutdown,
        exit: _,
    } = launch;
    on_start.started(&provider);
    let Listeners { grpc, http } = match listeners {
        Some(bound) => bound,
        None => bind(&plan).await?,
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
