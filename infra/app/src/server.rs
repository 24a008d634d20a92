//! The composition root shared by the binary, the simulator and the benchmarks:
//! [`assemble`] builds the provider from its settings and raw adapters, [`capacity_server`]
//! the generated gRPC server over its handlers; `serve.rs` runs them on already-bound
//! listeners until a shutdown future completes. Nothing here parses flags or reads the
//! environment.
//!
//! Under `--cfg madsim` (the simulation, `sim/`) the generated server is madsim-tonic's:
//! the simulator hosts [`capacity_server`] on madsim's network, and `serve`, with
//! tonic-health, reflection, TLS, the HTTP side server and the reconcile loop on tokio, is
//! compiled out (a stub that refuses to run keeps the binary compiling).

use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_domain::{MachineState, ReconcileReport, Timestamp};
use bigfleet_libvirt_grpc::CapacityService;
use bigfleet_libvirt_observe::instrumented::InstrumentedHypervisor;
use bigfleet_libvirt_ports::{
    Clock, Hypervisor, Observer, Provider, ProviderConfig, ReconcileError, Spawner, StartError,
    StateStore, TransitionEvent,
};
use bigfleet_libvirt_proto::v1alpha1::capacity_provider_server::CapacityProviderServer;
use tracing::warn;

use crate::metrics::{KindLabels, Metrics, ProviderMetrics, TransitionLabels};

/// How the servers run.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Register gRPC reflection (v1 and v1alpha).
    pub reflection: bool,
    /// Background reconcile period; `None` disables it.
    pub reconcile_interval: Option<Duration>,
    /// How long in-flight RPCs may finish after a shutdown signal.
    pub drain_period: Duration,
    /// Facts for the serving log line.
    pub banner: Banner,
    /// TLS material for the gRPC port; `None` serves plaintext.
    pub tls: Option<bigfleet_libvirt_grpc::tls::TlsState>,
    /// Honour the fake's test-only hooks in the gRPC layer (the injected handler panic).
    pub fault_hooks: bool,
    /// Check every call against the client certificate's `bigfleet://` identity (mTLS).
    pub client_identity: bigfleet_libvirt_domain::authorization::IdentityMode,
    /// Per-client bounds on both ports.
    pub limits: NetLimits,
}

/// Per-client bounds on both ports (the flags' defaults are [`NetLimits::default`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetLimits {
    /// gRPC connections open at once (`--max-connections`).
    pub grpc_max_connections: usize,
    /// Concurrent HTTP/2 streams per gRPC connection, advertised in SETTINGS; excess
    /// streams are refused with REFUSED_STREAM (`--max-concurrent-streams`).
    pub max_concurrent_streams: u32,
    /// How long a new gRPC connection may take to finish TLS and send the HTTP/2 preface
    /// (`--handshake-timeout`).
    pub handshake_timeout: Duration,
    /// HTTP/2 keepalive ping period on an otherwise quiet connection
    /// (`--http2-keepalive-interval`).
    pub http2_keepalive_interval: Duration,
    /// How long a keepalive ping may go unanswered before the connection is dropped
    /// (`--http2-keepalive-timeout`).
    pub http2_keepalive_timeout: Duration,
    /// The HTTP side server's bounds (`--metrics-max-connections`,
    /// `--http-header-read-timeout`, `--http-idle-timeout`).
    pub http: bigfleet_libvirt_observe::limits::HttpLimits,
    /// MiB of large List answers held for their readers at once
    /// (`--list-memory-budget-mib`; see `bigfleet_libvirt_grpc::list_budget`).
    pub list_memory_budget_mib: usize,
}

impl Default for NetLimits {
    fn default() -> Self {
        Self {
            grpc_max_connections: 1024,
            max_concurrent_streams: 256,
            handshake_timeout: Duration::from_secs(10),
            http2_keepalive_interval: Duration::from_secs(30),
            http2_keepalive_timeout: Duration::from_secs(10),
            http: bigfleet_libvirt_observe::limits::HttpLimits {
                max_connections: 64,
                header_read_timeout: Duration::from_secs(10),
                idle_timeout: Duration::from_secs(60),
            },
            list_memory_budget_mib: bigfleet_libvirt_grpc::list_budget::DEFAULT_BUDGET_MIB,
        }
    }
}

/// What the "serving CapacityProvider" line reports.
#[derive(Clone, Debug, Default)]
pub struct Banner {
    /// `--provider`.
    pub provider: String,
    /// `fake` or `libvirt`.
    pub backend: String,
    /// `insecure`, `TLS` or `mTLS`.
    pub security: String,
    /// Number of offering entries.
    pub offerings: usize,
    /// Configured zones, sorted.
    pub zones: Vec<String>,
    /// `enforce` or `off`: whether calls are checked against the client identity.
    pub client_identity: String,
}

/// What [`assemble`] builds the provider from: the raw adapters (the hypervisor not yet
/// instrumented), the provider's settings, the metrics registry the series go to, and
/// whoever else is told about finished transitions.
pub struct Parts<H, S, C, E> {
    /// The provider's settings.
    pub config: ProviderConfig,
    /// The backend, as its adapter built it.
    pub hypervisor: H,
    /// The state store.
    pub store: S,
    /// The clock the provider runs on.
    pub clock: C,
    /// Where the provider's tasks run.
    pub spawner: E,
    /// Where the hypervisor calls and finished transitions are counted.
    pub metrics: Metrics,
    /// Told about every finished transition, after the metrics (a benchmark's timer, say).
    pub observers: Vec<Observer>,
}

/// The provider [`assemble`] returns: over the instrumented hypervisor.
pub type Assembled<H, S, C, E> = Provider<InstrumentedHypervisor<H>, S, C, E>;

/// The adapter-level composition root, which every builder of the provider calls (the
/// binary through [`run`](crate::run), the simulator and the benchmarks directly): wraps the
/// hypervisor in the [`InstrumentedHypervisor`] metrics decorator, starts the provider with
/// the transition metrics and `parts.observers` as its observers, and hands the machines it
/// started with back to the hypervisor ([`Hypervisor::restored`]: the fake re-creates their
/// domains, libvirt tracks them for drift and orphan checks).
///
/// # Errors
/// When durable state cannot be loaded or first-boot seeding fails.
pub async fn assemble<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    parts: Parts<H, S, C, E>,
) -> Result<Assembled<H, S, C, E>, StartError> {
    let Parts {
        config,
        hypervisor,
        store,
        clock,
        spawner,
        metrics,
        observers,
    } = parts;
    let hypervisor = InstrumentedHypervisor::new(hypervisor, metrics.api.clone());
    let metrics_timeline = metrics.timeline.clone();
    let counted: Observer = Arc::new(move |event: &TransitionEvent| {
        record_transition(&metrics.provider, event);
    });
    let timeline = crate::timeline::observer(clock.clone(), &metrics_timeline);
    let observers = [counted, timeline].into_iter().chain(observers).collect();
    let provider = Provider::start(config, hypervisor, store, clock, spawner, observers).await?;
    crate::timeline::track(&provider, &metrics_timeline);
    if !provider.readiness_gate() {
        warn!(
            "the hypervisor cannot observe node readiness: Configured is reported when bootstrap returns"
        );
    }
    provider.hand_off_restored();
    Ok(provider)
}

fn record_transition(metrics: &ProviderMetrics, event: &TransitionEvent) {
    let outcome = match &event.machine {
        Some(m) if m.state == MachineState::Failed => "failed",
        Some(_) => "success",
        None => "dropped",
    };
    let kind = event.kind.name().to_owned();
    let labels = TransitionLabels {
        kind: kind.clone(),
        outcome: outcome.to_owned(),
    };
    metrics.transitions.get_or_create(&labels).inc();
    if event.machine.is_some() {
        let seconds = event.elapsed.as_secs_f64();
        metrics
            .transition_duration
            .get_or_create(&KindLabels { kind })
            .observe(seconds);
    }
}

/// The largest request the gRPC server decodes.
const MAX_DECODING_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

/// The generated `CapacityProvider` server over the real handlers ([`CapacityService`]):
/// what [`serve`] hosts on tonic, and the simulation on madsim-tonic.
pub fn capacity_server<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    provider: Provider<H, S, C, E>,
    metrics: Metrics,
    fault_hooks: bool,
) -> CapacityProviderServer<CapacityService<H, S, C, E>> {
    hosted(CapacityService::new(provider, metrics.grpc).with_fault_hooks(fault_hooks))
}

pub(crate) fn hosted<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    capacity: CapacityService<H, S, C, E>,
) -> CapacityProviderServer<CapacityService<H, S, C, E>> {
    CapacityProviderServer::new(capacity).max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE)
}

/// The simulation build has no tokio sockets, tonic-health, reflection, TLS or HTTP side
/// server to run: it hosts [`capacity_server`] on madsim-tonic itself (`sim/`). A build
/// without the `serve` feature links none of them either.
///
/// # Errors
/// Always.
#[cfg(not(all(feature = "serve", not(madsim))))]
pub async fn serve<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    _provider: Provider<H, S, C, E>,
    _metrics: Metrics,
    _grpc: tokio::net::TcpListener,
    _http: Option<tokio::net::TcpListener>,
    _config: ServeConfig,
    _shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    anyhow::bail!(
        "app::serve is compiled out of this build: it needs the `serve` feature of \
         bigfleet-libvirt-app and a build without --cfg madsim"
    )
}

/// The background reconcile pass: one interval after start-up (as the reference does) and
/// every interval after that, each outcome handed to `after`. The binary logs and counts
/// outcomes; the simulator traces them. Both run this same loop on their own clock.
pub async fn reconcile_every<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    provider: Provider<H, S, C, E>,
    interval: Duration,
    mut after: impl FnMut(&Result<ReconcileReport, ReconcileError>),
) {
    loop {
        let next: Timestamp = provider.now().saturating_add(interval);
        provider.sleep_until(next).await;
        after(&provider.reconcile().await);
    }
}
