//! The servers under test: the provider in-process, wired as the binary wires it, and the
//! echo yardstick (the same generated service, fixed answers, no logic).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bigfleet_libvirt_app::launch::{self, Flags};
use bigfleet_libvirt_app::{self as app, Banner, ServeConfig};
use bigfleet_libvirt_config::{DEFAULT_PER_GIB_HOUR, DEFAULT_PER_VCPU_HOUR};
use bigfleet_libvirt_domain::ListQuery;
use bigfleet_libvirt_grpc::convert;
use bigfleet_libvirt_grpc::identity::IdentityMode;
use bigfleet_libvirt_memory::MemoryStateStore;
use bigfleet_libvirt_memory::fake::{FakeConfig, FakeHypervisor};
use bigfleet_libvirt_observe::metrics::Metrics;
use bigfleet_libvirt_proto::v1alpha1 as pb;
use bigfleet_libvirt_proto::wire::EncodedMachineList;
use bigfleet_libvirt_system::{SystemClock, TokioSpawner};
use pb::capacity_provider_server::{CapacityProvider, CapacityProviderServer};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

use super::*;
use crate::clients::listen;

// ---------------------------------------------------------------------------------------
// The provider, in-process

/// A running gRPC server and how to stop it.
pub(crate) struct Running {
    pub(crate) addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), String>>,
}

impl Running {
    pub(crate) async fn shutdown(self) -> Result<(), BoxError> {
        let _ = self.stop.send(());
        self.task.await??;
        Ok(())
    }
}

/// Time of each server-side step of a full List, measured in-process on the provider.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ServerSteps {
    /// `Provider::list` (core lock, walk, Arc clones).
    pub(crate) list: Duration,
    /// Each machine's memoised encoding (converted and encoded only when the record
    /// changed since the last List), as the gRPC handler gathers them.
    pub(crate) convert: Duration,
    /// Splicing those encodings into the `MachineList` bytes (`ListCodec`'s work).
    pub(crate) encode: Duration,
    /// Dropping the gathered encodings and the bytes.
    pub(crate) drop: Duration,
}

type StepsFuture = futures::future::BoxFuture<'static, Result<ServerSteps, String>>;

/// Runs the provider's List path in-process for a query (what the gRPC handler does, minus
/// gRPC) and times each step.
#[derive(Clone)]
pub(crate) struct StepsProbe(Arc<dyn Fn(ListQuery) -> StepsFuture + Send + Sync>);

impl StepsProbe {
    /// Runs on a runtime worker, as the gRPC handler does (same threads, same allocator
    /// arenas).
    pub(crate) async fn run(&self, query: ListQuery) -> Result<ServerSteps, BoxError> {
        Ok(tokio::spawn((self.0)(query)).await??)
    }
}

fn flags(seed_count: usize) -> Flags {
    Flags {
        addr: "127.0.0.1:0".to_owned(),
        provider: "libvirt".to_owned(),
        libvirt_backend: "fake".to_owned(),
        use_fake_backend: true,
        connect: String::new(),
        default_zone: "local".to_owned(),
        state: None,
        image: String::new(),
        image_source: None,
        storage_pool: "default".to_owned(),
        network: "default".to_owned(),
        domain_type: "kvm".to_owned(),
        firmware: "bios".to_owned(),
        guest_kernel: String::new(),
        guest_initrd: String::new(),
        guest_cmdline: String::new(),
        base_user_data: None,
        capacity_type: "on_demand".to_owned(),
        instance_types: None,
        prices: String::new(),
        price_per_vcpu_hour: DEFAULT_PER_VCPU_HOUR,
        price_per_gib_hour: DEFAULT_PER_GIB_HOUR,
        offerings: None,
        seed_count: i64::try_from(seed_count).unwrap_or(i64::MAX),
        reconcile_interval: Duration::ZERO,
        metrics_addr: String::new(),
        reflection: false,
        tls_cert: None,
        tls_key: None,
        tls_ca: None,
        client_identity: None,
        fake_fault_hooks: false,
        transition_timeout: None,
        fake_delay_min: Duration::ZERO,
        fake_delay_max: Duration::ZERO,
        fake_seed: 1,
        // The binary's defaults for the libvirt-only capacity and GC flags.
        host_reserve_cpu: 1,
        host_reserve_memory_mib: 2048,
        cpu_allocation_ratio: 4.0,
        memory_allocation_ratio: 1.0,
        gc_orphans: false,
        orphan_grace: Duration::from_secs(15 * 60),
    }
}

/// Starts the provider over the zero-latency fake with `seed_count` Speculative slots, wired
/// as the binary wires it, serving on a fresh loopback port.
pub(crate) async fn start_provider(seed_count: usize) -> Result<(Running, StepsProbe), BoxError> {
    let plan = launch::resolve(&flags(seed_count))?;
    let clock = SystemClock;
    let fake = FakeHypervisor::new(
        FakeConfig {
            provider: plan.provider_label.clone(),
            slots: plan.inventory.machines.clone(),
            delay_min: plan.fake.delay_min,
            delay_max: plan.fake.delay_max,
            seed: plan.fake.seed,
            fault_hooks: false,
            slow_ok_delay: plan.provider.policy.timeouts.configure + Duration::from_secs(1),
        },
        clock,
    );
    let metrics = Metrics::new();
    let provider = app::assemble(
        plan.provider.clone(),
        fake,
        MemoryStateStore::new(),
        clock,
        TokioSpawner,
        &metrics,
    )
    .await?;
    let probe_provider = provider.clone();
    let probe = StepsProbe(Arc::new(move |query: ListQuery| -> StepsFuture {
        let provider = probe_provider.clone();
        Box::pin(async move {
            let t = Instant::now();
            let page = provider.list(&query).await.map_err(|e| e.to_string())?;
            let list = t.elapsed();
            let t = Instant::now();
            let message = convert::encoded_list(&page);
            let convert = t.elapsed();
            let t = Instant::now();
            let bytes = message.encode_to_vec();
            let encode = t.elapsed();
            let t = Instant::now();
            drop(message);
            drop(bytes);
            let drop_time = t.elapsed();
            drop(page);
            Ok(ServerSteps {
                list,
                convert,
                encode,
                drop: drop_time,
            })
        })
    }));
    let listener = listen().await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let config = ServeConfig {
        reflection: false,
        reconcile_interval: None,
        drain_period: Duration::from_secs(2),
        banner: Banner::default(),
        tls: None,
        fault_hooks: false,
        client_identity: IdentityMode::Off,
        limits: app::NetLimits::default(),
    };
    let task = tokio::spawn(async move {
        app::serve(provider, metrics, listener, None, config, async move {
            let _ = stopped.await;
        })
        .await
        .map_err(|e| format!("{e:#}"))
    });
    Ok((Running { addr, stop, task }, probe))
}

// ---------------------------------------------------------------------------------------
// The echo yardstick: the same generated service, fixed answers, no logic

#[derive(Clone)]
pub(crate) struct Echo {
    pub(crate) ack: pb::TransitionAck,
    pub(crate) machine: pb::Machine,
}

#[tonic::async_trait]
impl CapacityProvider for Echo {
    async fn create(
        &self,
        _: Request<pb::CreateRequest>,
    ) -> Result<Response<pb::TransitionAck>, Status> {
        Ok(Response::new(self.ack.clone()))
    }

    async fn configure(
        &self,
        _: Request<pb::ConfigureRequest>,
    ) -> Result<Response<pb::TransitionAck>, Status> {
        Ok(Response::new(self.ack.clone()))
    }

    async fn drain(
        &self,
        _: Request<pb::DrainRequest>,
    ) -> Result<Response<pb::TransitionAck>, Status> {
        Ok(Response::new(self.ack.clone()))
    }

    async fn delete(
        &self,
        _: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::TransitionAck>, Status> {
        Ok(Response::new(self.ack.clone()))
    }

    async fn get(&self, _: Request<pb::MachineRef>) -> Result<Response<pb::Machine>, Status> {
        Ok(Response::new(self.machine.clone()))
    }

    async fn list(
        &self,
        _: Request<pb::ListFilter>,
    ) -> Result<Response<EncodedMachineList>, Status> {
        Ok(Response::new(EncodedMachineList::default()))
    }
}

/// Serves `echo` as `app::serve` serves the provider (tonic server builder over a
/// `TcpListenerStream`, TCP_NODELAY on accepted sockets), minus the provider.
pub(crate) async fn start_echo(echo: Echo) -> Result<Running, BoxError> {
    let listener = listen().await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let service = CapacityProviderServer::new(echo).max_decoding_message_size(16 * 1024 * 1024);
    let router = tonic::transport::Server::builder().add_service(service);
    // As app::serve: TCP_NODELAY on every accepted socket.
    let incoming = TcpListenerStream::new(listener).map(|accepted| {
        accepted.inspect(|tcp| {
            let _ = tcp.set_nodelay(true);
        })
    });
    let task = tokio::spawn(async move {
        router
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stopped.await;
            })
            .await
            .map_err(|e| e.to_string())
    });
    Ok(Running { addr, stop, task })
}
