//! Provider benchmark: ack latency, full-List latency and delta-List latency, measured in one
//! run on one machine, each next to its yardstick.
//!
//! 1. Ack latency (p50/p99) of Create, Configure, Drain, Delete and Get at concurrency 1 and
//!    64, next to a bare tonic "echo" server that implements the same generated service with
//!    fixed answers. Target: mutating ack <= 2x echo.
//! 2. Full List latency at 10k and 100k machines next to the time prost needs to encode the
//!    same `MachineList`, measured (a) with the generated client (includes decode) and (b) with
//!    a raw-bytes codec (server latency as seen on the wire). Target: List <= 2x encode.
//! 3. `since_revision` delta latency for 100 changed machines among 100k. Target: <= 1 ms.
//!
//! The provider runs in-process (`app::assemble` + `app::serve` on a loopback listener) over
//! the fake hypervisor with zero latency. Timings are printed, never asserted.
//!
//! Run: `cargo bench -p bigfleet-libvirt-tests --bench provider`
//! Sizes: `BENCH_QUICK=1` for a smoke run; `BENCH_LIST_SIZES=10000,100000`,
//! `BENCH_C1_CALLS`, `BENCH_WORKERS`, `BENCH_CALLS_PER_WORKER`, `BENCH_ROUNDS`, `BENCH_DELTA_FLEET`,
//! `BENCH_DELTA_CHANGED`, `BENCH_DELTA_REPS`, `BENCH_LIST_REPS` override single values.
//! Started without `--bench` (e.g. by `cargo test --benches`) it always uses the quick sizes.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use bigfleet_libvirt_domain::ListQuery;
use bigfleet_libvirt_infra::app::{self, Banner, ServeConfig};
use bigfleet_libvirt_infra::config::{DEFAULT_PER_GIB_HOUR, DEFAULT_PER_VCPU_HOUR};
use bigfleet_libvirt_infra::fake::{FakeConfig, FakeHypervisor};
use bigfleet_libvirt_infra::grpc::convert;
use bigfleet_libvirt_infra::identity::IdentityMode;
use bigfleet_libvirt_infra::launch::{self, Flags};
use bigfleet_libvirt_infra::metrics::Metrics;
use bigfleet_libvirt_infra::store::MemoryStateStore;
use bigfleet_libvirt_infra::system::{SystemClock, TokioSpawner};
use bigfleet_libvirt_proto::v1alpha1 as pb;
use bigfleet_libvirt_proto::wire::EncodedMachineList;
use pb::capacity_provider_client::CapacityProviderClient;
use pb::capacity_provider_server::{CapacityProvider, CapacityProviderServer};
use prost::Message;
use prost::bytes::{Buf, Bytes};
use tokio::net::TcpListener;
use tokio::sync::{Barrier, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Client = CapacityProviderClient<Channel>;

const SHARD: &str = "bench-shard";
const CLUSTER: &str = "bench-cluster";
const ACK_RATIO_TARGET: f64 = 2.0;
const LIST_RATIO_TARGET: f64 = 2.0;
const DELTA_TARGET: Duration = Duration::from_millis(1);
const WAIT_TIMEOUT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------
// Sizes

#[derive(Clone, Debug)]
struct Sizes {
    quick: bool,
    list_sizes: Vec<usize>,
    list_reps: usize,
    c1_calls: usize,
    workers: usize,
    calls_per_worker: usize,
    rounds: usize,
    delta_fleet: usize,
    delta_changed: usize,
    delta_reps: usize,
}

fn env_string(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn env_usize(name: &str, default: usize) -> usize {
    match env_string(name) {
        Some(raw) => raw.trim().parse().unwrap_or_else(|_| {
            eprintln!("{name}={raw:?} is not a number; using {default}");
            default
        }),
        None => default,
    }
}

impl Sizes {
    fn from_env(force_quick: bool) -> Self {
        let quick = force_quick || env_string("BENCH_QUICK").is_some_and(|v| v != "0");
        let default_lists: Vec<usize> = if quick {
            vec![1_000, 5_000]
        } else {
            vec![10_000, 100_000]
        };
        let list_sizes = env_string("BENCH_LIST_SIZES")
            .map(|raw| {
                raw.split(',')
                    .filter_map(|s| s.trim().parse().ok())
                    .filter(|n| *n > 0)
                    .collect::<Vec<usize>>()
            })
            .filter(|v| !v.is_empty())
            .unwrap_or(default_lists);
        let pick = |full: usize, small: usize| if quick { small } else { full };
        Self {
            quick,
            list_sizes,
            list_reps: env_usize("BENCH_LIST_REPS", pick(10, 3)).max(1),
            c1_calls: env_usize("BENCH_C1_CALLS", pick(1_000, 100)).max(1),
            workers: env_usize("BENCH_WORKERS", 64).max(1),
            calls_per_worker: env_usize("BENCH_CALLS_PER_WORKER", pick(200, 10)).max(1),
            rounds: env_usize("BENCH_ROUNDS", pick(4, 2)).max(1),
            delta_fleet: env_usize("BENCH_DELTA_FLEET", pick(100_000, 5_000)).max(1),
            delta_changed: env_usize("BENCH_DELTA_CHANGED", 100).max(1),
            delta_reps: env_usize("BENCH_DELTA_REPS", pick(300, 100)).max(1),
        }
    }

    /// Machines the delta and ack phases need as distinct Speculative slots.
    fn needed_slots(&self) -> usize {
        self.delta_changed + self.c1_calls + self.workers * self.calls_per_worker
    }
}

// ---------------------------------------------------------------------------------------
// Statistics and formatting

#[derive(Clone, Debug, Default)]
struct Samples(Vec<Duration>);

impl Samples {
    fn new(mut v: Vec<Duration>) -> Self {
        v.sort_unstable();
        Self(v)
    }

    /// Nearest-rank percentile.
    fn pct(&self, p: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let n = self.0.len();
        let rank = ((p / 100.0) * n as f64).ceil() as usize;
        self.0[rank.clamp(1, n) - 1]
    }

    fn p50(&self) -> Duration {
        self.pct(50.0)
    }

    fn p99(&self) -> Duration {
        self.pct(99.0)
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

fn fmt_d(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1_000.0 {
        format!("{us:.1}µs")
    } else if us < 1_000_000.0 {
        format!("{:.2}ms", us / 1_000.0)
    } else {
        format!("{:.3}s", us / 1_000_000.0)
    }
}

fn ratio(a: Duration, b: Duration) -> f64 {
    let b = b.as_secs_f64();
    if b == 0.0 {
        f64::INFINITY
    } else {
        a.as_secs_f64() / b
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "PASS" } else { "MISS" }
}

fn fmt_bytes(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{:.1}MiB", n as f64 / f64::from(1u32 << 20))
    } else if n >= 1 << 10 {
        format!("{:.1}KiB", n as f64 / 1024.0)
    } else {
        format!("{n}B")
    }
}

/// One target's outcome for the summary.
struct Verdict {
    what: String,
    measured: String,
    target: String,
    pass: bool,
}

// ---------------------------------------------------------------------------------------
// The provider, in-process

/// A running gRPC server and how to stop it.
struct Running {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), String>>,
}

impl Running {
    async fn shutdown(self) -> Result<(), BoxError> {
        let _ = self.stop.send(());
        self.task.await??;
        Ok(())
    }
}

/// Time of each server-side step of a full List, measured in-process on the provider.
#[derive(Clone, Copy, Debug, Default)]
struct ServerSteps {
    /// `Provider::list` (core lock, walk, Arc clones).
    list: Duration,
    /// Each machine's memoised encoding (converted and encoded only when the record
    /// changed since the last List), as the gRPC handler gathers them.
    convert: Duration,
    /// Splicing those encodings into the `MachineList` bytes (`ListCodec`'s work).
    encode: Duration,
    /// Dropping the gathered encodings and the bytes.
    drop: Duration,
}

type StepsFuture = futures::future::BoxFuture<'static, Result<ServerSteps, String>>;

/// Runs the provider's List path in-process for a query (what the gRPC handler does, minus
/// gRPC) and times each step.
#[derive(Clone)]
struct StepsProbe(Arc<dyn Fn(ListQuery) -> StepsFuture + Send + Sync>);

impl StepsProbe {
    /// Runs on a runtime worker, as the gRPC handler does (same threads, same allocator
    /// arenas).
    async fn run(&self, query: ListQuery) -> Result<ServerSteps, BoxError> {
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
async fn start_provider(seed_count: usize) -> Result<(Running, StepsProbe), BoxError> {
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
struct Echo {
    ack: pb::TransitionAck,
    machine: pb::Machine,
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
async fn start_echo(echo: Echo) -> Result<Running, BoxError> {
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

// ---------------------------------------------------------------------------------------
// Clients

/// A loopback listener on a fresh port.
async fn listen() -> Result<TcpListener, BoxError> {
    Ok(TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?)
}

async fn connect(addr: SocketAddr) -> Result<Channel, BoxError> {
    Ok(Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?)
}

fn client(channel: &Channel) -> Client {
    CapacityProviderClient::new(channel.clone()).max_decoding_message_size(usize::MAX)
}

/// Sends a prost-encoded `ListFilter` and hands back the response body undecoded.
#[derive(Clone, Copy, Debug, Default)]
struct RawListCodec;

#[derive(Clone, Copy, Debug, Default)]
struct ListFilterEncoder;

#[derive(Clone, Copy, Debug, Default)]
struct RawBytesDecoder;

impl Codec for RawListCodec {
    type Encode = pb::ListFilter;
    type Decode = Bytes;
    type Encoder = ListFilterEncoder;
    type Decoder = RawBytesDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ListFilterEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawBytesDecoder
    }
}

impl Encoder for ListFilterEncoder {
    type Item = pb::ListFilter;
    type Error = Status;

    fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encode ListFilter: {e}")))
    }
}

impl Decoder for RawBytesDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n)))
    }
}

struct RawClient {
    grpc: tonic::client::Grpc<Channel>,
}

impl RawClient {
    fn new(channel: &Channel) -> Self {
        Self {
            grpc: tonic::client::Grpc::new(channel.clone()).max_decoding_message_size(usize::MAX),
        }
    }

    async fn list(&mut self, filter: pb::ListFilter) -> Result<Bytes, BoxError> {
        self.grpc.ready().await?;
        let path = PathAndQuery::from_static("/bigfleet.v1alpha1.CapacityProvider/List");
        let response = self
            .grpc
            .unary(Request::new(filter), path, RawListCodec)
            .await?;
        Ok(response.into_inner())
    }
}

// ---------------------------------------------------------------------------------------
// Calls

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rpc {
    Create,
    Configure,
    Drain,
    Delete,
    Get,
}

impl Rpc {
    fn name(self) -> &'static str {
        match self {
            Rpc::Create => "Create",
            Rpc::Configure => "Configure",
            Rpc::Drain => "Drain",
            Rpc::Delete => "Delete",
            Rpc::Get => "Get",
        }
    }

    fn mutating(self) -> bool {
        self != Rpc::Get
    }
}

enum Call {
    Create(pb::CreateRequest),
    Configure(pb::ConfigureRequest),
    Drain(pb::DrainRequest),
    Delete(pb::DeleteRequest),
    Get(pb::MachineRef),
}

/// A request as a fenced BigFleet shard would send it.
fn build_call(rpc: Rpc, id: &str, sequence: i64, blob: &[u8]) -> Call {
    let shard_id = SHARD.to_owned();
    let machine_id = id.to_owned();
    match rpc {
        Rpc::Create => Call::Create(pb::CreateRequest {
            machine_id,
            shard_id,
            shard_epoch: 1,
            sequence_number: sequence,
        }),
        Rpc::Configure => Call::Configure(pb::ConfigureRequest {
            machine_id,
            cluster_id: CLUSTER.to_owned(),
            bootstrap_blob: blob.to_vec(),
            shard_id,
            shard_epoch: 1,
            sequence_number: sequence,
            shard_metadata: [("bench".to_owned(), "1".to_owned())].into(),
        }),
        Rpc::Drain => Call::Drain(pb::DrainRequest {
            machine_id,
            grace_period_seconds: 0,
            shard_id,
            shard_epoch: 1,
            sequence_number: sequence,
        }),
        Rpc::Delete => Call::Delete(pb::DeleteRequest {
            machine_id,
            shard_id,
            shard_epoch: 1,
            sequence_number: sequence,
        }),
        Rpc::Get => Call::Get(pb::MachineRef { id: machine_id }),
    }
}

async fn send(client: &mut Client, call: Call) -> Result<(), Status> {
    match call {
        Call::Create(r) => client.create(r).await.map(drop),
        Call::Configure(r) => client.configure(r).await.map(drop),
        Call::Drain(r) => client.drain(r).await.map(drop),
        Call::Delete(r) => client.delete(r).await.map(drop),
        Call::Get(r) => client.get(r).await.map(drop),
    }
}

/// The outcome of one timed batch.
struct Run {
    samples: Samples,
    wall: Duration,
    errors: usize,
    first_error: Option<String>,
}

/// Runs one worker per chunk, all released together; each sends its calls one after the
/// other and times each from just before the send to the decoded answer.
async fn run_batch(
    channel: &Channel,
    rpc: Rpc,
    chunks: &[Vec<String>],
    sequence: &Arc<AtomicI64>,
    blob: &Arc<Vec<u8>>,
) -> Result<Run, BoxError> {
    let barrier = Arc::new(Barrier::new(chunks.len() + 1));
    let mut handles = Vec::with_capacity(chunks.len());
    for chunk in chunks {
        let mut client = client(channel);
        let chunk = chunk.clone();
        let barrier = Arc::clone(&barrier);
        let sequence = Arc::clone(sequence);
        let blob = Arc::clone(blob);
        handles.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(chunk.len());
            let mut errors = 0usize;
            let mut first_error = None;
            barrier.wait().await;
            let began = Instant::now();
            for id in &chunk {
                let call = build_call(rpc, id, sequence.fetch_add(1, Ordering::Relaxed), &blob);
                let started = Instant::now();
                let result = send(&mut client, call).await;
                let elapsed = started.elapsed();
                match result {
                    Ok(()) => latencies.push(elapsed),
                    Err(status) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| format!("{id}: {status}"));
                    }
                }
            }
            (latencies, errors, first_error, began, Instant::now())
        }));
    }
    barrier.wait().await;
    let mut all = Vec::new();
    let mut errors = 0;
    let mut first_error = None;
    let mut span: Option<(Instant, Instant)> = None;
    for handle in handles {
        let (latencies, e, first, began, ended) = handle.await?;
        span = Some(span.map_or((began, ended), |(b, e)| (b.min(began), e.max(ended))));
        all.extend(latencies);
        errors += e;
        if first_error.is_none() {
            first_error = first;
        }
    }
    Ok(Run {
        samples: Samples::new(all),
        wall: span.map_or(Duration::ZERO, |(b, e)| e.duration_since(b)),
        errors,
        first_error,
    })
}

fn list_filter(states: &[pb::MachineState], max_results: i32, since: Vec<u8>) -> pb::ListFilter {
    pb::ListFilter {
        states: states.iter().map(|s| *s as i32).collect(),
        max_results,
        since_revision: since,
    }
}

/// Waits until no machine is mid-transition, then checks that every id in `ids` is in
/// `target`. Returns how long the wait took.
async fn settle(
    client: &mut Client,
    ids: &[String],
    target: pb::MachineState,
) -> Result<Duration, BoxError> {
    use pb::MachineState as S;
    let started = Instant::now();
    let busy = [S::Creating, S::Configuring, S::Draining, S::Deleting];
    loop {
        let page = client
            .list(list_filter(&busy, 1, Vec::new()))
            .await?
            .into_inner();
        if page.machines.is_empty() {
            break;
        }
        if started.elapsed() > WAIT_TIMEOUT {
            return Err(format!("machines still mid-transition after {WAIT_TIMEOUT:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let waited = started.elapsed();
    let in_target: HashSet<String> = client
        .list(list_filter(&[target], 0, Vec::new()))
        .await?
        .into_inner()
        .machines
        .into_iter()
        .map(|m| m.id)
        .collect();
    let missing: Vec<&String> = ids.iter().filter(|id| !in_target.contains(*id)).collect();
    if let Some(first) = missing.first() {
        let state = client
            .get(pb::MachineRef {
                id: (*first).clone(),
            })
            .await?
            .into_inner();
        return Err(format!(
            "{} of {} machines did not reach {target:?}; e.g. {first} is {:?} ({})",
            missing.len(),
            ids.len(),
            pb::MachineState::try_from(state.state).unwrap_or(S::Unspecified),
            state.last_error
        )
        .into());
    }
    Ok(waited)
}

// ---------------------------------------------------------------------------------------
// Phase 1: ack latency

struct AckRow {
    rpc: Rpc,
    concurrency: usize,
    provider: Run,
    echo: Run,
    settle: Option<Duration>,
}

impl Run {
    /// Both runs' calls as one sample (wall times add up: the runs were sequential).
    fn merge(self, other: Run) -> Run {
        let mut all = self.samples.0;
        all.extend(other.samples.0);
        Run {
            samples: Samples::new(all),
            wall: self.wall + other.wall,
            errors: self.errors + other.errors,
            first_error: self.first_error.or(other.first_error),
        }
    }
}

/// One (rpc, concurrency) pair, in `rounds` rounds over disjoint slices of every worker's
/// ids so that load from outside the benchmark hits both servers alike. Each round runs the
/// echo, then the provider with the same requests, then (for mutating calls) waits until
/// the provider's transitions land in `target`, so they do not overlap the next echo round.
#[allow(clippy::too_many_arguments)]
async fn measure_ack(
    provider: &Channel,
    echo: &Channel,
    waiter: &mut Client,
    rpc: Rpc,
    chunks: &[Vec<String>],
    rounds: usize,
    target: Option<pb::MachineState>,
    sequence: &Arc<AtomicI64>,
    blob: &Arc<Vec<u8>>,
) -> Result<AckRow, BoxError> {
    let mut echo_run: Option<Run> = None;
    let mut provider_run: Option<Run> = None;
    let mut settled: Option<Duration> = None;
    for round in 0..rounds {
        let slices: Vec<Vec<String>> = chunks
            .iter()
            .map(|c| c[round * c.len() / rounds..(round + 1) * c.len() / rounds].to_vec())
            .collect();
        if slices.iter().all(Vec::is_empty) {
            continue;
        }
        let e = run_batch(echo, rpc, &slices, sequence, blob).await?;
        let p = run_batch(provider, rpc, &slices, sequence, blob).await?;
        echo_run = Some(match echo_run {
            Some(acc) => acc.merge(e),
            None => e,
        });
        provider_run = Some(match provider_run {
            Some(acc) => acc.merge(p),
            None => p,
        });
        if let Some(target) = target {
            let ids: Vec<String> = slices.into_iter().flatten().collect();
            let waited = settle(waiter, &ids, target).await?;
            settled = Some(settled.map_or(waited, |d| d.max(waited)));
        }
    }
    let (Some(echo_run), Some(provider_run)) = (echo_run, provider_run) else {
        return Err("no calls to measure".into());
    };
    if let Some(error) = &provider_run.first_error {
        eprintln!(
            "warning: {} of {} provider {} calls failed; first: {error}",
            provider_run.errors,
            chunks.iter().map(Vec::len).sum::<usize>(),
            rpc.name()
        );
    }
    Ok(AckRow {
        rpc,
        concurrency: chunks.len(),
        provider: provider_run,
        echo: echo_run,
        settle: settled,
    })
}

/// Walks `ids` through Create, Get, Configure, Drain and Delete at one concurrency.
async fn ack_lifecycle(
    provider: &Channel,
    echo: &Channel,
    chunks: &[Vec<String>],
    rounds: usize,
    sequence: &Arc<AtomicI64>,
    blob: &Arc<Vec<u8>>,
) -> Result<Vec<AckRow>, BoxError> {
    use pb::MachineState as S;
    let mut waiter = client(provider);
    let steps = [
        (Rpc::Create, Some(S::Idle)),
        (Rpc::Get, None),
        (Rpc::Configure, Some(S::Configured)),
        (Rpc::Drain, Some(S::Idle)),
        (Rpc::Delete, Some(S::Speculative)),
    ];
    let mut rows = Vec::new();
    for (rpc, target) in steps {
        let row = measure_ack(
            provider,
            echo,
            &mut waiter,
            rpc,
            chunks,
            rounds,
            target,
            sequence,
            blob,
        )
        .await?;
        rows.push(row);
    }
    Ok(rows)
}

fn print_ack_table(rows: &[AckRow], rounds: usize, verdicts: &mut Vec<Verdict>) {
    println!();
    println!(
        "== 1. Ack latency: provider vs bare tonic echo (same service, same requests, same channel setup; {rounds} interleaved rounds) =="
    );
    println!(
        "{:<10} {:>4} {:>6} | {:>10} {:>10} {:>9} | {:>10} {:>10} {:>9} | {:>7} {:>7} | {:>6} {:>6}",
        "rpc",
        "conc",
        "calls",
        "prov p50",
        "prov p99",
        "prov/s",
        "echo p50",
        "echo p99",
        "echo/s",
        "x p50",
        "x p99",
        "p50",
        "p99",
    );
    for row in rows {
        let p = &row.provider.samples;
        let e = &row.echo.samples;
        let r50 = ratio(p.p50(), e.p50());
        let r99 = ratio(p.p99(), e.p99());
        let rate = |run: &Run| run.samples.len() as f64 / run.wall.as_secs_f64().max(1e-9);
        let (v50, v99) = if row.rpc.mutating() {
            (
                verdict(r50 <= ACK_RATIO_TARGET),
                verdict(r99 <= ACK_RATIO_TARGET),
            )
        } else {
            ("info", "info")
        };
        let errors = if row.provider.errors > 0 {
            format!("  ({} errors)", row.provider.errors)
        } else {
            String::new()
        };
        println!(
            "{:<10} {:>4} {:>6} | {:>10} {:>10} {:>9.0} | {:>10} {:>10} {:>9.0} | {:>6.2}x {:>6.2}x | {:>6} {:>6}{errors}",
            row.rpc.name(),
            row.concurrency,
            p.len(),
            fmt_d(p.p50()),
            fmt_d(p.p99()),
            rate(&row.provider),
            fmt_d(e.p50()),
            fmt_d(e.p99()),
            rate(&row.echo),
            r50,
            r99,
            v50,
            v99,
        );
        if row.rpc.mutating() {
            for (label, value) in [("p50", r50), ("p99", r99)] {
                verdicts.push(Verdict {
                    what: format!("{} ack {label} @ c={}", row.rpc.name(), row.concurrency),
                    measured: format!("{value:.2}x echo"),
                    target: format!("<= {ACK_RATIO_TARGET:.0}x echo"),
                    pass: value <= ACK_RATIO_TARGET && row.provider.errors == 0,
                });
            }
        }
    }
    let settles: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            r.settle
                .map(|d| format!("{}@c{}={}", r.rpc.name(), r.concurrency, fmt_d(d)))
        })
        .collect();
    println!(
        "(x = provider/echo; target for mutating calls: <= {ACK_RATIO_TARGET:.0}x echo; Get is informational)"
    );
    println!(
        "(longest wait, per round, until all transitions landed after the last ack: {})",
        settles.join(", ")
    );
}

// ---------------------------------------------------------------------------------------
// Phase 2: full List

struct ListRow {
    fleet: usize,
    bytes: usize,
    decoded_client: Samples,
    raw_wire: Samples,
    encode: Samples,
    decode: Samples,
    steps: ServerSteps,
}

fn median_steps(mut runs: Vec<ServerSteps>) -> ServerSteps {
    let mid = |f: fn(&ServerSteps) -> Duration, runs: &mut Vec<ServerSteps>| {
        runs.sort_by_key(f);
        f(&runs[runs.len() / 2])
    };
    ServerSteps {
        list: mid(|s| s.list, &mut runs),
        convert: mid(|s| s.convert, &mut runs),
        encode: mid(|s| s.encode, &mut runs),
        drop: mid(|s| s.drop, &mut runs),
    }
}

async fn measure_list(fleet: usize, reps: usize) -> Result<ListRow, BoxError> {
    let (running, probe) = start_provider(fleet).await?;
    let channel = connect(running.addr).await?;
    let mut generated = client(&channel);
    let mut raw = RawClient::new(&channel);
    let full = || list_filter(&[], 0, Vec::new());
    // Warm up both paths (connection, allocator, HTTP/2 windows).
    let mut last = generated.list(full()).await?.into_inner();
    if last.machines.len() != fleet {
        return Err(format!(
            "List returned {} machines, expected {fleet}",
            last.machines.len()
        )
        .into());
    }
    let mut last_raw = raw.list(full()).await?;
    let mut decoded = Vec::with_capacity(reps);
    let mut wire = Vec::with_capacity(reps);
    let mut steps = Vec::with_capacity(reps);
    for _ in 0..reps {
        // Each answer replaces the previous one only after the clock stops, so freeing the
        // old list is not timed.
        let t = Instant::now();
        let answer = generated.list(full()).await?.into_inner();
        decoded.push(t.elapsed());
        last = answer;
        let t = Instant::now();
        let answer = raw.list(full()).await?;
        wire.push(t.elapsed());
        last_raw = answer;
        steps.push(probe.run(ListQuery::default()).await?);
    }
    let encode_reps = reps.max(5);
    let mut encode = Vec::with_capacity(encode_reps);
    let mut decode = Vec::with_capacity(encode_reps);
    let mut bytes = 0;
    for _ in 0..encode_reps {
        let t = Instant::now();
        let encoded = last.encode_to_vec();
        encode.push(t.elapsed());
        bytes = encoded.len();
        drop(encoded);
        let t = Instant::now();
        let back = pb::MachineList::decode(last_raw.clone())?;
        decode.push(t.elapsed());
        drop(back);
    }
    if bytes != last_raw.len() {
        eprintln!(
            "note: re-encoded list is {bytes} bytes, wire body {} bytes",
            last_raw.len()
        );
    }
    let steps = median_steps(steps);
    drop(generated);
    drop(raw);
    drop(channel);
    running.shutdown().await?;
    Ok(ListRow {
        fleet,
        bytes,
        decoded_client: Samples::new(decoded),
        raw_wire: Samples::new(wire),
        encode: Samples::new(encode),
        decode: Samples::new(decode),
        steps,
    })
}

fn print_list_table(rows: &[ListRow], reps: usize, verdicts: &mut Vec<Verdict>) {
    println!();
    println!(
        "== 2. Full List vs prost encode of the same MachineList ({reps} calls per client; encode/decode = median) =="
    );
    println!(
        "{:>8} {:>9} {:>10} | {:>10} {:>10} {:>7} {:>5} | {:>10} {:>10} {:>7} {:>5} | {:>10}",
        "machines",
        "bytes",
        "encode",
        "(a) p50",
        "(a) p99",
        "(a)/enc",
        "",
        "(b) p50",
        "(b) p99",
        "(b)/enc",
        "",
        "decode",
    );
    for row in rows {
        let enc = row.encode.p50();
        let ra = ratio(row.decoded_client.p50(), enc);
        let rb = ratio(row.raw_wire.p50(), enc);
        println!(
            "{:>8} {:>9} {:>10} | {:>10} {:>10} {:>6.2}x {:>5} | {:>10} {:>10} {:>6.2}x {:>5} | {:>10}",
            row.fleet,
            fmt_bytes(row.bytes),
            fmt_d(enc),
            fmt_d(row.decoded_client.p50()),
            fmt_d(row.decoded_client.p99()),
            ra,
            verdict(ra <= LIST_RATIO_TARGET),
            fmt_d(row.raw_wire.p50()),
            fmt_d(row.raw_wire.p99()),
            rb,
            verdict(rb <= LIST_RATIO_TARGET),
            fmt_d(row.decode.p50()),
        );
        verdicts.push(Verdict {
            what: format!("List {} (a) generated client, p50", row.fleet),
            measured: format!("{ra:.2}x encode"),
            target: format!("<= {LIST_RATIO_TARGET:.0}x encode"),
            pass: ra <= LIST_RATIO_TARGET,
        });
        verdicts.push(Verdict {
            what: format!("List {} (b) raw wire, p50", row.fleet),
            measured: format!("{rb:.2}x encode"),
            target: format!("<= {LIST_RATIO_TARGET:.0}x encode"),
            pass: rb <= LIST_RATIO_TARGET,
        });
    }
    println!(
        "((a) = generated client, includes client decode; (b) = raw-bytes codec, no decode; target: List p50 <= {LIST_RATIO_TARGET:.0}x encode)"
    );
    println!(
        "server-side work of one full List, timed in-process on the provider between the calls above (median):"
    );
    for row in rows {
        let s = row.steps;
        let sum = s.list + s.convert + s.encode + s.drop;
        println!(
            "  {:>7}: Provider::list {}  memoised encodings x{} {}  splice {}  drop {}  = {} ({:.2}x encode; wire (b) p50 {})",
            row.fleet,
            fmt_d(s.list),
            row.fleet,
            fmt_d(s.convert),
            fmt_d(s.encode),
            fmt_d(s.drop),
            fmt_d(sum),
            ratio(sum, row.encode.p50()),
            fmt_d(row.raw_wire.p50()),
        );
    }
}

// ---------------------------------------------------------------------------------------
// Phase 3: delta List

struct DeltaResult {
    fleet: usize,
    changed: usize,
    returned: usize,
    bytes: usize,
    decoded_client: Samples,
    raw_wire: Samples,
    steps: ServerSteps,
}

#[allow(clippy::too_many_arguments)]
async fn measure_delta(
    channel: &Channel,
    probe: &StepsProbe,
    fleet: usize,
    ids: &[String],
    reps: usize,
    sequence: &Arc<AtomicI64>,
    blob: &Arc<Vec<u8>>,
) -> Result<DeltaResult, BoxError> {
    let mut c = client(channel);
    let mut raw = RawClient::new(channel);
    let revision = c
        .list(list_filter(&[], 1, Vec::new()))
        .await?
        .into_inner()
        .revision;
    let chunks = vec![ids.to_vec()];
    let created = run_batch(channel, Rpc::Create, &chunks, sequence, blob).await?;
    if let Some(error) = created.first_error {
        return Err(format!("delta setup Create failed: {error}").into());
    }
    settle(&mut c, ids, pb::MachineState::Idle).await?;
    let delta = || list_filter(&[], 0, revision.clone());
    let warm = c.list(delta()).await?.into_inner();
    raw.list(delta()).await?;
    let returned = warm.machines.len();
    let bytes = warm.encoded_len();
    let query = ListQuery {
        since_revision: bigfleet_libvirt_domain::parse_cursor(&revision),
        ..ListQuery::default()
    };
    let mut decoded = Vec::with_capacity(reps);
    let mut wire = Vec::with_capacity(reps);
    let mut steps = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        let page = c.list(delta()).await?;
        decoded.push(t.elapsed());
        drop(page);
        let t = Instant::now();
        let page = raw.list(delta()).await?;
        wire.push(t.elapsed());
        drop(page);
        steps.push(probe.run(query.clone()).await?);
    }
    Ok(DeltaResult {
        fleet,
        changed: ids.len(),
        returned,
        bytes,
        decoded_client: Samples::new(decoded),
        raw_wire: Samples::new(wire),
        steps: median_steps(steps),
    })
}

fn print_delta(d: &DeltaResult, verdicts: &mut Vec<Verdict>) {
    println!();
    println!(
        "== 3. List(since_revision) delta: {} changed among {} machines, {} calls per client ==",
        d.changed,
        d.fleet,
        d.decoded_client.len()
    );
    println!(
        "{:<22} {:>8} {:>9} | {:>10} {:>10} {:>10} | {:>7} | {:>6} {:>6}",
        "client", "returned", "bytes", "p50", "p99", "max", "target", "p50", "p99"
    );
    for (label, samples) in [
        ("(a) generated client", &d.decoded_client),
        ("(b) raw wire", &d.raw_wire),
    ] {
        let p50 = samples.p50();
        let p99 = samples.p99();
        println!(
            "{:<22} {:>8} {:>9} | {:>10} {:>10} {:>10} | {:>7} | {:>6} {:>6}",
            label,
            d.returned,
            fmt_bytes(d.bytes),
            fmt_d(p50),
            fmt_d(p99),
            fmt_d(samples.pct(100.0)),
            fmt_d(DELTA_TARGET),
            verdict(p50 <= DELTA_TARGET),
            verdict(p99 <= DELTA_TARGET),
        );
        let short = &label[..3];
        for (pct, value) in [("p50", p50), ("p99", p99)] {
            verdicts.push(Verdict {
                what: format!("delta {} of {} {short} {pct}", d.changed, d.fleet),
                measured: fmt_d(value),
                target: format!("<= {}", fmt_d(DELTA_TARGET)),
                pass: value <= DELTA_TARGET,
            });
        }
    }
    let s = d.steps;
    println!(
        "server-side work of one delta, in-process (median): Provider::list {}  memoised encodings {}  splice {}  drop {}  = {}",
        fmt_d(s.list),
        fmt_d(s.convert),
        fmt_d(s.encode),
        fmt_d(s.drop),
        fmt_d(s.list + s.convert + s.encode + s.drop),
    );
    if d.returned != d.changed {
        println!(
            "note: the delta returned {} machines for {} changed",
            d.returned, d.changed
        );
    }
}

// ---------------------------------------------------------------------------------------
// Driver

/// The 1-minute load average, to judge whether other work shared the cores.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

async fn bench(sizes: Sizes) -> Result<(), BoxError> {
    let total = Instant::now();
    let load_before = load_average();
    let mut verdicts = Vec::new();

    // Phase 2 first: each fleet size on its own fresh provider, nothing else running.
    let mut list_rows = Vec::new();
    for &fleet in &sizes.list_sizes {
        let t = Instant::now();
        list_rows.push(measure_list(fleet, sizes.list_reps).await?);
        eprintln!("list {fleet}: done in {}", fmt_d(t.elapsed()));
    }

    // Phases 3 and 1 share one provider of the delta fleet size.
    let fleet = sizes.delta_fleet.max(sizes.needed_slots());
    let t = Instant::now();
    let (running, probe) = start_provider(fleet).await?;
    let provider = connect(running.addr).await?;
    let mut c = client(&provider);
    let speculative: Vec<String> = c
        .list(list_filter(&[pb::MachineState::Speculative], 0, Vec::new()))
        .await?
        .into_inner()
        .machines
        .into_iter()
        .map(|m| m.id)
        .collect();
    if speculative.len() < sizes.needed_slots() {
        return Err(format!(
            "only {} Speculative slots, need {}",
            speculative.len(),
            sizes.needed_slots()
        )
        .into());
    }
    eprintln!(
        "provider with {fleet} machines up in {}",
        fmt_d(t.elapsed())
    );
    let sequence = Arc::new(AtomicI64::new(1));
    let blob: Arc<Vec<u8>> = Arc::new((0..1024u32).map(|i| (i % 251) as u8).collect());

    let (delta_ids, rest) = speculative.split_at(sizes.delta_changed);
    let t = Instant::now();
    let delta = measure_delta(
        &provider,
        &probe,
        fleet,
        delta_ids,
        sizes.delta_reps,
        &sequence,
        &blob,
    )
    .await?;
    eprintln!("delta: done in {}", fmt_d(t.elapsed()));

    // The echo answers with a real Idle machine from the provider, so messages are alike.
    let sample = c
        .get(pb::MachineRef {
            id: delta_ids[0].clone(),
        })
        .await?
        .into_inner();
    let echo_running = start_echo(Echo {
        ack: pb::TransitionAck {
            operation_id: "op-00000000000000000001".to_owned(),
            machine: Some(sample.clone()),
        },
        machine: sample,
    })
    .await?;
    let echo = connect(echo_running.addr).await?;

    // Warm both connections.
    let warm_ids = vec![rest[..rest.len().min(64)].to_vec()];
    run_batch(&echo, Rpc::Get, &warm_ids, &sequence, &blob).await?;
    run_batch(&provider, Rpc::Get, &warm_ids, &sequence, &blob).await?;

    let (c1_ids, rest) = rest.split_at(sizes.c1_calls);
    let c64_ids = &rest[..sizes.workers * sizes.calls_per_worker];
    let mut ack_rows = Vec::new();
    let t = Instant::now();
    let c1_chunks = vec![c1_ids.to_vec()];
    ack_rows
        .extend(ack_lifecycle(&provider, &echo, &c1_chunks, sizes.rounds, &sequence, &blob).await?);
    eprintln!("ack c=1: done in {}", fmt_d(t.elapsed()));
    let t = Instant::now();
    let cn_chunks: Vec<Vec<String>> = c64_ids
        .chunks(sizes.calls_per_worker)
        .map(<[String]>::to_vec)
        .collect();
    ack_rows
        .extend(ack_lifecycle(&provider, &echo, &cn_chunks, sizes.rounds, &sequence, &blob).await?);
    eprintln!("ack c={}: done in {}", sizes.workers, fmt_d(t.elapsed()));
    ack_rows.sort_by_key(|r| {
        let order = [
            Rpc::Create,
            Rpc::Configure,
            Rpc::Drain,
            Rpc::Delete,
            Rpc::Get,
        ];
        (order.iter().position(|o| *o == r.rpc), r.concurrency)
    });

    drop(c);
    drop(provider);
    drop(echo);
    running.shutdown().await?;
    echo_running.shutdown().await?;

    println!();
    println!(
        "bigfleet-libvirt provider benchmark{} — in-process provider (fake hypervisor, 0 latency, in-memory store), loopback gRPC, {} cores, load average {} at start / {} at end",
        if sizes.quick { " (BENCH_QUICK)" } else { "" },
        std::thread::available_parallelism().map_or(0, usize::from),
        load_before,
        load_average(),
    );
    print_ack_table(&ack_rows, sizes.rounds, &mut verdicts);
    print_list_table(&list_rows, sizes.list_reps, &mut verdicts);
    print_delta(&delta, &mut verdicts);

    println!();
    println!("== Summary ==");
    let width = verdicts.iter().map(|v| v.what.len()).max().unwrap_or(10);
    for v in &verdicts {
        println!(
            "{:<width$}  {:>14}  target {:<14}  {}",
            v.what,
            v.measured,
            v.target,
            verdict(v.pass)
        );
    }
    let missed = verdicts.iter().filter(|v| !v.pass).count();
    println!(
        "{} of {} targets met; total bench time {}",
        verdicts.len() - missed,
        verdicts.len(),
        fmt_d(total.elapsed())
    );
    Ok(())
}

fn main() -> Result<(), BoxError> {
    // `cargo bench` passes `--bench`; anything else (e.g. `cargo test --benches`) is a smoke
    // run with the small sizes.
    let under_cargo_bench = std::env::args().any(|a| a == "--bench");
    let sizes = Sizes::from_env(!under_cargo_bench);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // Everything (clients, servers, transitions) runs on the runtime's worker threads.
    runtime.block_on(async move { tokio::spawn(bench(sizes)).await? })
}
