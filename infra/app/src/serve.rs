//! [`serve`]: both ports until shutdown, on the real tokio runtime: the gRPC server (the
//! capacity service with the client-identity check, the List budget and streamed Lists,
//! health, reflection, TLS, request tracking for the connection cap), the HTTP side server,
//! the background reconcile loop, and readiness and health kept in step with the state
//! store. Compiled out under `--cfg madsim` (the simulator hosts `capacity_server` itself;
//! `serve_stub` stands in).

// The servers here (tonic, axum) run only on the real tokio runtime, so their plumbing
// tasks are spawned on it directly; provider work goes through the Spawner port.
#![allow(clippy::disallowed_methods)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_domain::Timestamp;
use bigfleet_libvirt_grpc::CapacityService;
use bigfleet_libvirt_grpc::identity::{Identified, PeerConnection, PeerIdentity};
use bigfleet_libvirt_observe::http::{self, Readiness};
use bigfleet_libvirt_observe::side_server;
use bigfleet_libvirt_ports::{Clock, Hypervisor, Provider, Spawner, StateStore};
use bigfleet_libvirt_proto::v1alpha1::capacity_provider_server::CapacityProviderServer;
use bigfleet_libvirt_system::accept::{self, Acceptor, Activity, TrackRequestsLayer};
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tracing::{info, warn};

use crate::metrics::{Metrics, OutcomeLabels, ProviderMetrics, StateLabels};
use crate::serve_config::{Banner, ServeConfig};
use crate::{ServiceSettings, capacity_server, reconcile_every};

/// Serves gRPC on `grpc` and, when given, HTTP on `http` until `shutdown` completes; then
/// flips readiness and gRPC health first, lets in-flight RPCs finish for the drain period,
/// and returns.
///
/// # Errors
/// When a server fails while running.
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
    let (health, health_service) = tonic_health::server::health_reporter();
    // The background loops hold the provider: they stop when serving ends (dropping the set
    // aborts them on an early return), so a caller that keeps its process, like the
    // benchmarks, gets the state file closed and can open it again.
    let mut background = tokio::task::JoinSet::new();
    let on_grpc = (&provider, &metrics, &config);
    let grpc = start_grpc(on_grpc, grpc, health_service, &mut background)?;
    let http = http.map(|listener| {
        start_http(
            &provider,
            &metrics,
            &readiness,
            config.limits.http,
            listener,
        )
    });
    if let Some(interval) = config.reconcile_interval {
        background.spawn(reconcile_loop(provider.clone(), metrics.clone(), interval));
    }
    set_health::<H, S, C, E>(&health, true).await;
    readiness.set(true);
    background.spawn(watch_store(
        provider.clone(),
        readiness.clone(),
        health.clone(),
    ));
    log_banner(&config.banner, grpc_addr, http_addr);
    shutdown.await;
    info!("shutting down");
    readiness.set(false);
    set_health::<H, S, C, E>(&health, false).await;
    // gRPC stops first and drains its in-flight calls; the HTTP side server stays up until
    // then, so probes see `not ready` (503) during the drain rather than a closed port.
    grpc.stop(config.drain_period).await?;
    if let Some(http) = http {
        http.stop(Duration::from_secs(5)).await?;
    }
    background.shutdown().await;
    Ok(())
}

/// A server task and the channel that tells it to stop.
struct Running<T> {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<T>,
}

impl<T> Running<T> {
    /// A channel's receiving end as the future a server's graceful shutdown waits for.
    fn channel() -> (
        tokio::sync::oneshot::Sender<()>,
        impl Future<Output = ()> + Send + 'static,
    ) {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        (stop, async move {
            let _ = stopped.await;
        })
    }
}

impl Running<Result<(), tonic::transport::Error>> {
    /// Stops the gRPC server and waits up to `drain` for its in-flight calls.
    async fn stop(self, drain: Duration) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        match tokio::time::timeout(drain, self.task).await {
            Ok(joined) => joined??,
            Err(_) => warn!(drain_period = ?drain, "in-flight RPCs did not finish in time"),
        }
        Ok(())
    }
}

impl Running<()> {
    /// Stops the HTTP side server and waits up to `wait` for it.
    async fn stop(self, wait: Duration) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        if let Ok(joined) = tokio::time::timeout(wait, self.task).await {
            joined?;
        }
        Ok(())
    }
}

/// What the gRPC server is built from: the provider, the metrics and the serve settings.
type GrpcInputs<'a, H, S, C, E> = (&'a Provider<H, S, C, E>, &'a Metrics, &'a ServeConfig);

/// Starts the gRPC server on `listener`: the capacity service (with the client-identity
/// check, the List budget and streamed Lists), health, reflection when asked for, request
/// tracking for the connection cap, and TLS when configured (its reload task goes into
/// `background`).
fn start_grpc<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    (provider, metrics, config): GrpcInputs<'_, H, S, C, E>,
    listener: TcpListener,
    health_service: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    background: &mut tokio::task::JoinSet<()>,
) -> anyhow::Result<Running<Result<(), tonic::transport::Error>>> {
    let settings = ServiceSettings {
        fault_hooks: config.fault_hooks,
        client_identity: config.client_identity,
        list_budget_mib: config.limits.list_memory_budget_mib,
        list_progress_timeout: config.limits.list_progress_timeout,
        // The router below releases each streamed answer when it is sent.
        streamed_lists: true,
    };
    let service = capacity_server(provider.clone(), metrics, settings);
    let limits = config.limits;
    let (v1, v1alpha) = reflection(config.reflection)?;
    let router = tonic::transport::Server::builder()
        // Every call is in flight on its connection until its response ends, so a connection
        // serving one is never evicted at the connection cap.
        .layer(TrackRequestsLayer::new(connection_activity))
        .max_concurrent_streams(limits.max_concurrent_streams)
        .http2_keepalive_interval(Some(limits.http2_keepalive_interval))
        .http2_keepalive_timeout(Some(limits.http2_keepalive_timeout))
        // Large List answers are streamed; what each holds lives as long as its body.
        .layer(tower::util::MapResponseLayer::new(
            bigfleet_libvirt_grpc::list_stream::release_when_sent,
        ))
        .add_service(health_service)
        .add_service(service)
        .add_optional_service(v1)
        .add_optional_service(v1alpha);
    let (stop, stopped) = Running::<()>::channel();
    let acceptor = Acceptor::new(listener, "--addr", limits.grpc_max_connections)
        .on_evict(metrics.provider.eviction_counter("grpc"));
    let task = match &config.tls {
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
    Ok(Running { stop, task })
}

/// Both gRPC reflection versions when `enabled` (older grpcurl builds only speak v1alpha).
#[allow(clippy::type_complexity)]
fn reflection(
    enabled: bool,
) -> anyhow::Result<(
    Option<
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
    >,
    Option<
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    >,
)> {
    if !enabled {
        return Ok((None, None));
    }
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
    Ok((Some(v1), Some(v1alpha)))
}

/// Starts the HTTP side server (`/metrics`, `/healthz`, `/readyz`) on `listener`.
fn start_http<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    provider: &Provider<H, S, C, E>,
    metrics: &Metrics,
    readiness: &Readiness,
    limits: bigfleet_libvirt_observe::limits::HttpLimits,
    listener: TcpListener,
) -> Running<()> {
    let hook_provider = provider.clone();
    // One scrape at a time brings the failure counter up to date, so none counts twice.
    let one_at_a_time = std::sync::Mutex::new(());
    let hook_metrics = metrics.provider.clone();
    let on_scrape: http::ScrapeHook = Arc::new(move || {
        let _turn = one_at_a_time
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        refresh_gauges(&hook_provider, &hook_metrics);
    });
    let app = http::router(
        metrics.exposition.clone(),
        metrics.timeline.clone(),
        readiness.clone(),
        on_scrape,
    );
    let (stop, stopped) = Running::<()>::channel();
    let on_evict = metrics.provider.eviction_counter("metrics");
    let task = tokio::spawn(side_server::serve(listener, app, limits, on_evict, stopped));
    Running { stop, task }
}

/// Sets gRPC health, for the whole server and for the capacity service, to serving or not.
async fn set_health<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    health: &tonic_health::server::HealthReporter,
    serving: bool,
) {
    type Served<H, S, C, E> = CapacityProviderServer<CapacityService<H, S, C, E>>;
    if serving {
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

/// A gRPC call's connection, from the connection info tonic attached to it: the
/// acceptor's [`Activity`] in plaintext, inside the [`PeerConnection`] with TLS.
fn connection_activity(extensions: &tonic::Extensions) -> Option<Activity> {
    extensions.get::<Activity>().cloned().or_else(|| {
        extensions
            .get::<PeerConnection>()
            .map(|connection| connection.activity.clone())
    })
}

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
const STORE_WATCH_PERIOD: Duration = Duration::from_millis(200);
/// While the store refuses commits, how many watch periods pass between probe commits.
const STORE_PROBE_EVERY: u32 = 5;

/// Keeps readiness and gRPC health in step with the state store: while the last commit
/// attempt failed, `/readyz` answers 503 with the reason and health is NOT_SERVING, so the
/// provider is taken out of service; liveness stays ok, since a restart would not make room
/// on the disk and the store heals by itself once there is room. While it refuses commits,
/// a probe commit (one that changes nothing) runs every second, so readiness comes back
/// even when no call arrives, as none does once the provider is out of service.
async fn watch_store<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    provider: Provider<H, S, C, E>,
    readiness: Readiness,
    health: tonic_health::server::HealthReporter,
) {
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
                set_health::<H, S, C, E>(&health, healthy).await;
            }
            if !readiness.is_serving() {
                // Shutting down: health says NOT_SERVING whatever the store does.
                set_health::<H, S, C, E>(&health, false).await;
            }
            last = failing;
        }
        let next: Timestamp = provider.now().saturating_add(STORE_WATCH_PERIOD);
        provider.sleep_until(next).await;
    }
}

fn refresh_gauges<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    provider: &Provider<H, S, C, E>,
    metrics: &ProviderMetrics,
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

async fn reconcile_loop<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    provider: Provider<H, S, C, E>,
    metrics: Metrics,
    interval: Duration,
) {
    reconcile_every(provider, interval, |outcome| {
        let outcome = match outcome {
            Ok(report) => {
                crate::timeline::reconciled(&metrics.timeline, report);
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
            .provider
            .reconcile
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
    })
    .await;
}
