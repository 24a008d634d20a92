//! The composition root shared by the binary, the simulator and the benchmarks:
//! [`assemble`] builds the provider from its settings and raw adapters, [`capacity_server`] the generated gRPC server over
//! its handlers, [`serve`] runs them on already-bound listeners until a shutdown future
//! completes. Nothing here parses flags or reads the environment.
//!
//! Under `--cfg madsim` (the simulation, `sim/`) the generated server is madsim-tonic's:
//! the simulator hosts [`capacity_server`] on madsim's network, and [`serve`], with
//! tonic-health, reflection, TLS, the HTTP side server and the reconcile loop on tokio, is
//! compiled out (a stub that refuses to run keeps the binary compiling).

// The servers here (tonic, axum) run only on the real tokio runtime, so their plumbing
// tasks are spawned on it directly; provider work goes through the Spawner port.
#![allow(clippy::disallowed_methods)]
use std::future::Future;
#[cfg(not(madsim))]
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_domain::{MachineState, ReconcileReport, Timestamp};
use bigfleet_libvirt_ports::{
    Clock, Hypervisor, Observer, Provider, ProviderConfig, ReconcileError, Spawner, StartError,
    StateStore, TransitionEvent,
};
use bigfleet_libvirt_proto::v1alpha1::capacity_provider_server::CapacityProviderServer;
use tokio::net::TcpListener;
#[cfg(not(madsim))]
use tokio_stream::StreamExt;
#[cfg(not(madsim))]
use tracing::info;
use tracing::warn;

use bigfleet_libvirt_grpc::CapacityService;
#[cfg(not(madsim))]
use bigfleet_libvirt_grpc::identity::{Identified, PeerConnection, PeerIdentity};
#[cfg(not(madsim))]
use bigfleet_libvirt_observe::http::{self, Readiness};
use bigfleet_libvirt_observe::instrumented::InstrumentedHypervisor;
use bigfleet_libvirt_observe::metrics::{KindLabels, Metrics, TransitionLabels};
#[cfg(not(madsim))]
use bigfleet_libvirt_observe::metrics::{OutcomeLabels, StateLabels};
#[cfg(not(madsim))]
use bigfleet_libvirt_observe::side_server;
#[cfg(not(madsim))]
use bigfleet_libvirt_system::accept::{self, Acceptor, Activity, TrackRequestsLayer};

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
    pub http: bigfleet_libvirt_observe::side_server::HttpLimits,
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
            http: bigfleet_libvirt_observe::side_server::HttpLimits {
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
    let hypervisor = InstrumentedHypervisor::new(hypervisor, metrics.clone());
    let counted: Observer = Arc::new(move |event: &TransitionEvent| {
        record_transition(&metrics, event);
    });
    let observers = std::iter::once(counted).chain(observers).collect();
    let provider = Provider::start(config, hypervisor, store, clock, spawner, observers).await?;
    if !provider.readiness_gate() {
        warn!(
            "the hypervisor cannot observe node readiness: Configured is reported when bootstrap returns"
        );
    }
    provider.hand_off_restored();
    Ok(provider)
}

fn record_transition(metrics: &Metrics, event: &TransitionEvent) {
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
    hosted(CapacityService::new(provider, metrics).with_fault_hooks(fault_hooks))
}

fn hosted<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    capacity: CapacityService<H, S, C, E>,
) -> CapacityProviderServer<CapacityService<H, S, C, E>> {
    CapacityProviderServer::new(capacity).max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE)
}

/// Serves gRPC on `grpc` and, when given, HTTP on `http` until `shutdown` completes; then
/// flips readiness and gRPC health first, lets in-flight RPCs finish for the drain period,
/// and returns.
///
/// # Errors
/// When a server fails while running.
#[cfg(not(madsim))]
pub async fn serve<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    provider: Provider<H, S, C, E>,
    metrics: Metrics,
    grpc: TcpListener,
    http: Option<TcpListener>,
    config: ServeConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let grpc_addr = grpc.local_addr()?;
    let http_addr = http.as_ref().map(TcpListener::local_addr).transpose()?;
    let readiness = Readiness::default();
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    // As `capacity_server`, plus the client-identity check (the simulation has no TLS).
    let service = hosted(
        CapacityService::new(provider.clone(), metrics.clone())
            .with_fault_hooks(config.fault_hooks)
            .with_client_identity(config.client_identity)
            .with_list_budget(config.limits.list_memory_budget_mib)
            .with_streamed_lists(),
    );
    let limits = config.limits;
    let mut router = tonic::transport::Server::builder()
        // Every call is in flight on its connection until its response ends, so a connection
        // serving one is never evicted at the connection cap.
        .layer(TrackRequestsLayer::new(connection_activity))
        .max_concurrent_streams(limits.max_concurrent_streams)
        .http2_keepalive_interval(Some(limits.http2_keepalive_interval))
        .http2_keepalive_timeout(Some(limits.http2_keepalive_timeout))
        // A List answer's share of the memory budget lives as long as its body.
        .layer(tower::util::MapResponseLayer::new(
            bigfleet_libvirt_grpc::list_budget::release_when_sent,
        ))
        .add_service(health_service)
        .add_service(service);
    if config.reflection {
        // Both reflection versions: older grpcurl builds only speak v1alpha.
        let set = bigfleet_libvirt_proto::FILE_DESCRIPTOR_SET;
        let health_set = tonic_health::pb::FILE_DESCRIPTOR_SET;
        let v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(set)
            .register_encoded_file_descriptor_set(health_set)
            .build_v1()?;
        let v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(set)
            .register_encoded_file_descriptor_set(health_set)
            .build_v1alpha()?;
        router = router.add_service(v1).add_service(v1alpha);
    }
    let (stop_grpc, grpc_stopped) = tokio::sync::oneshot::channel::<()>();
    let stopped = async move {
        let _ = grpc_stopped.await;
    };
    // The background loops hold the provider: they stop when serving ends (dropping the set
    // aborts them on an early return), so a caller that keeps its process, like the
    // benchmarks, gets the state file closed and can open it again.
    let mut background = tokio::task::JoinSet::new();
    let acceptor = Acceptor::new(grpc, "--addr", limits.grpc_max_connections)
        .on_evict(metrics.eviction_counter("grpc"));
    let grpc_task = match &config.tls {
        Some(tls) => {
            background.spawn(tls.clone().watch(Duration::from_secs(2)));
            // Each connection's client identity is read once, here, and handed to its calls.
            let incoming =
                bigfleet_libvirt_grpc::tls::incoming(acceptor, tls, limits.handshake_timeout).map(
                    |accepted| {
                        accepted.map(|stream| {
                            let session = stream.get_ref().get_ref().1;
                            let peer = PeerIdentity::from_certificates(session.peer_certificates());
                            Identified::new(stream, peer)
                        })
                    },
                );
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped))
        }
        None => {
            let incoming = accept::grpc_incoming(acceptor, limits.handshake_timeout, |tcp| {
                std::future::ready(Ok(tcp))
            });
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped))
        }
    };
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let http_task = http.map(|listener| {
        let hook_provider = provider.clone();
        // One scrape at a time brings the failure counter up to date, so none counts twice.
        let one_at_a_time = std::sync::Mutex::new(());
        let on_scrape: http::ScrapeHook = Arc::new(move |m: &Metrics| {
            let _turn = one_at_a_time
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            refresh_gauges(&hook_provider, m);
        });
        let app = http::router(metrics.clone(), readiness.clone(), on_scrape);
        let stopped = async move {
            let _ = http_stopped.await;
        };
        let on_evict = metrics.eviction_counter("metrics");
        tokio::spawn(side_server::serve(
            listener,
            app,
            limits.http,
            on_evict,
            stopped,
        ))
    });
    if let Some(interval) = config.reconcile_interval {
        background.spawn(reconcile_loop(provider.clone(), metrics.clone(), interval));
    }
    health_reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    health_reporter
        .set_serving::<CapacityProviderServer<CapacityService<H, S, C, E>>>()
        .await;
    readiness.set(true);
    background.spawn(watch_store(
        provider.clone(),
        readiness.clone(),
        health_reporter.clone(),
    ));
    log_banner(&config.banner, grpc_addr, http_addr);
    shutdown.await;
    info!("shutting down");
    readiness.set(false);
    health_reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    health_reporter
        .set_not_serving::<CapacityProviderServer<CapacityService<H, S, C, E>>>()
        .await;
    // gRPC stops first and drains its in-flight calls; the HTTP side server stays up until
    // then, so probes see `not ready` (503) during the drain rather than a closed port.
    let _ = stop_grpc.send(());
    match tokio::time::timeout(config.drain_period, grpc_task).await {
        Ok(joined) => joined??,
        Err(_) => {
            warn!(drain_period = ?config.drain_period, "in-flight RPCs did not finish in time")
        }
    }
    let _ = stop_http.send(());
    if let Some(task) = http_task {
        if let Ok(joined) = tokio::time::timeout(Duration::from_secs(5), task).await {
            joined?;
        }
    }
    background.shutdown().await;
    Ok(())
}

/// A gRPC call's connection, from the connection info tonic attached to it: the
/// acceptor's [`Activity`] in plaintext, inside the [`PeerConnection`] with TLS.
#[cfg(not(madsim))]
fn connection_activity(extensions: &tonic::Extensions) -> Option<Activity> {
    extensions.get::<Activity>().cloned().or_else(|| {
        extensions
            .get::<PeerConnection>()
            .map(|connection| connection.activity.clone())
    })
}

/// The simulation build has no tokio sockets, tonic-health, reflection, TLS or HTTP side
/// server to run: it hosts [`capacity_server`] on madsim-tonic itself (`sim/`).
///
/// # Errors
/// Always.
#[cfg(madsim)]
pub async fn serve<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    _provider: Provider<H, S, C, E>,
    _metrics: Metrics,
    _grpc: TcpListener,
    _http: Option<TcpListener>,
    _config: ServeConfig,
    _shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    anyhow::bail!("app::serve is compiled out of the simulation build (--cfg madsim)")
}

#[cfg(not(madsim))]
fn log_banner(banner: &Banner, grpc: SocketAddr, http: Option<SocketAddr>) {
    let metrics_addr = http.map(|a| a.to_string()).unwrap_or_default();
    info!(
        addr = %grpc,
        provider = banner.provider,
        libvirt_backend = banner.backend,
        security = banner.security,
        offerings = banner.offerings,
        zones = banner.zones.join(","),
        client_identity = banner.client_identity,
        metrics_addr,
        "serving CapacityProvider"
    );
}

/// How often readiness and gRPC health look at the state store.
#[cfg(not(madsim))]
const STORE_WATCH_PERIOD: Duration = Duration::from_millis(200);
/// While the store refuses commits, how many watch periods pass between probe commits.
#[cfg(not(madsim))]
const STORE_PROBE_EVERY: u32 = 5;

/// Keeps readiness and gRPC health in step with the state store: while the last commit
/// attempt failed, `/readyz` answers 503 with the reason and health is NOT_SERVING, so the
/// provider is taken out of service; liveness stays ok, since a restart would not make room
/// on the disk and the store heals by itself once there is room. While it refuses commits,
/// a probe commit (one that changes nothing) runs every second, so readiness comes back
/// even when no call arrives, as none does once the provider is out of service.
#[cfg(not(madsim))]
async fn watch_store<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    provider: Provider<H, S, C, E>,
    readiness: Readiness,
    health: tonic_health::server::HealthReporter,
) {
    type Served<H, S, C, E> = CapacityProviderServer<CapacityService<H, S, C, E>>;
    let mut last: Option<String> = None;
    let mut ticks: u32 = 0;
    loop {
        ticks = ticks.wrapping_add(1);
        if last.is_some() && ticks % STORE_PROBE_EVERY == 0 {
            // The outcome also lands in the store status read below.
            if let Err(e) = provider.probe_store().await {
                tracing::debug!(error = %e, "the state store still refuses commits");
            }
        }
        let failing = provider.store_status().failing;
        if failing != last {
            let healthy = failing.is_none();
            if healthy != last.is_none() {
                if healthy {
                    info!("the state store takes commits again: ready");
                } else {
                    warn!("the state store refuses commits: not ready until it takes them");
                }
            }
            readiness.set_store_failing(failing.clone());
            if readiness.is_serving() {
                if healthy {
                    health
                        .set_service_status("", tonic_health::ServingStatus::Serving)
                        .await;
                    health.set_serving::<Served<H, S, C, E>>().await;
                } else {
                    health
                        .set_service_status("", tonic_health::ServingStatus::NotServing)
                        .await;
                    health.set_not_serving::<Served<H, S, C, E>>().await;
                }
            }
            if !readiness.is_serving() {
                // Shutting down: health says NOT_SERVING whatever the store does.
                health
                    .set_service_status("", tonic_health::ServingStatus::NotServing)
                    .await;
                health.set_not_serving::<Served<H, S, C, E>>().await;
            }
            last = failing;
        }
        let next: Timestamp = provider.now().saturating_add(STORE_WATCH_PERIOD);
        provider.sleep_until(next).await;
    }
}

#[cfg(not(madsim))]
fn refresh_gauges<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    provider: &Provider<H, S, C, E>,
    metrics: &Metrics,
) {
    let store = provider.store_status();
    metrics
        .state_writable
        .set(i64::from(store.failing.is_none()));
    let counted = metrics.state_commit_failures.get();
    if store.failures > counted {
        metrics
            .state_commit_failures
            .inc_by(store.failures - counted);
    }
    for (state, count) in provider.count_by_state() {
        let labels = StateLabels {
            state: state.name().to_owned(),
        };
        metrics
            .machines
            .get_or_create(&labels)
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }
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

#[cfg(not(madsim))]
async fn reconcile_loop<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    provider: Provider<H, S, C, E>,
    metrics: Metrics,
    interval: Duration,
) {
    reconcile_every(provider, interval, |outcome| {
        let outcome = match outcome {
            Ok(report) => {
                if !report.added.is_empty() || !report.refreshed.is_empty() {
                    info!(
                        added = report.added.len(),
                        refreshed = report.refreshed.len(),
                        "reconciled"
                    );
                }
                "success"
            }
            Err(e) => {
                warn!(error = %e, "reconcile failed");
                "error"
            }
        };
        metrics
            .reconcile
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
    })
    .await;
}
