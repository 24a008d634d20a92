//! The servers under test: the provider in-process, built by the binary's own wiring, and the
//! echo yardstick (the same generated service, fixed answers, no logic).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bigfleet_libvirt_app as app;
use bigfleet_libvirt_app::launch;
use bigfleet_libvirt_domain::ListQuery;
use bigfleet_libvirt_grpc::convert;
use bigfleet_libvirt_ports::{Hypervisor, StateStore};
use bigfleet_libvirt_proto::v1alpha1 as pb;
use bigfleet_libvirt_proto::wire::EncodedMachineList;
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

/// Starts the provider over the zero-latency fake with `seed_count` Speculative slots, built
/// and served by the binary's own wiring (`app::run`), on a fresh loopback port.
pub(crate) async fn start_provider(seed_count: usize) -> Result<(Running, StepsProbe), BoxError> {
    let plan = launch::resolve(&crate::flags::fake(seed_count))?;
    let listener = listen().await?;
    let addr = listener.local_addr()?;
    let listeners = app::Listeners {
        grpc: listener,
        http: None,
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let (probe_tx, probe_rx) = oneshot::channel::<StepsProbe>();
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        // Dropped when serving ends: the benchmark frees what the binary leaves at exit.
        let exit = app::Exit::default();
        app::run(app::Launch {
            plan,
            tls: None,
            limits: app::NetLimits::default(),
            listeners: Some(listeners),
            on_start: KeepProbe(probe_tx),
            shutdown,
            exit: &exit,
        })
        .await
        .map_err(|e| format!("{e:#}"))
    });
    match probe_rx.await {
        Ok(probe) => Ok((Running { addr, stop, task }, probe)),
        // The provider did not start: its error is the task's result.
        Err(_) => Err(task.await?.err().unwrap_or_default().into()),
    }
}

/// Hands a [`StepsProbe`] over the started provider back to [`start_provider`].
struct KeepProbe(oneshot::Sender<StepsProbe>);

impl app::OnStart for KeepProbe {
    fn started<H: Hypervisor, S: StateStore>(self, provider: &app::Running<H, S>) {
        let provider = provider.clone();
        let probe = StepsProbe(Arc::new(move |query: ListQuery| -> StepsFuture {
            let provider = provider.clone();
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
        let _ = self.0.send(probe);
    }
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
