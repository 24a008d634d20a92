//! Durability benchmark: what `--state` costs.
//!
//! Measured in one run on one disk: the raw single-fsync rate of the disk (write 4 KiB +
//! fdatasync in a loop), then mutating-RPC throughput and p99 ack latency at concurrency 1,
//! 16 and 64 with the in-memory store and with the redb store on a real file in the same
//! directory, then restart-to-ready with 100k machines in the state file. Group commit is
//! working when durable throughput at concurrency 64 is well above the raw fsync rate
//! (target ≥ 10×). Numbers are printed, never asserted.
//!
//! Run: `cargo bench -p bigfleet-libvirt-tests --bench durability`
//! (`BENCH_QUICK=1` for a fast smoke run; `BENCH_DIR` picks the directory/disk).

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bigfleet_libvirt_app::{self as app, Banner, ServeConfig};
use bigfleet_libvirt_config::{
    InstanceCatalog, InventoryConfig, PriceTable, build_inventory, default_offerings,
};
use bigfleet_libvirt_grpc::identity::IdentityMode;
use bigfleet_libvirt_memory::MemoryStateStore;
use bigfleet_libvirt_memory::fake::{FakeConfig, FakeHypervisor};
use bigfleet_libvirt_observe::metrics::Metrics;
use bigfleet_libvirt_ports::{ProviderConfig, StateStore};
use bigfleet_libvirt_proto::v1alpha1 as pb;
use bigfleet_libvirt_redb::RedbStateStore;
use bigfleet_libvirt_system::{SystemClock, TokioSpawner};
use pb::capacity_provider_client::CapacityProviderClient;
use tonic::transport::Channel;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const GROUP_COMMIT_TARGET: f64 = 10.0;
const RESTART_TARGET: Duration = Duration::from_secs(1);

fn quick() -> bool {
    std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
}

fn slots(count: usize) -> Vec<bigfleet_libvirt_domain::Machine> {
    let catalog = InstanceCatalog::builtin();
    let prices = PriceTable::default();
    let count = i64::try_from(count).unwrap_or(i64::MAX);
    let offerings = default_offerings(count, &[], "local", "on_demand", &catalog);
    let config = InventoryConfig {
        provider: "bench",
        catalog: &catalog,
        prices: &prices,
        require_zones: None,
    };
    build_inventory(&offerings, &config)
        .expect("default offerings build")
        .machines
}

/// A provider serving on loopback; dropping `stop` shuts it down.
struct Running {
    addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), String>>,
}

async fn start<S: StateStore>(
    machines: Vec<bigfleet_libvirt_domain::Machine>,
    store: S,
) -> Result<Running, BoxError> {
    let fake = FakeHypervisor::new(
        FakeConfig {
            provider: "bench".to_owned(),
            slots: machines,
            delay_min: Duration::ZERO,
            delay_max: Duration::ZERO,
            seed: 1,
            fault_hooks: false,
            slow_ok_delay: Duration::from_secs(1),
        },
        SystemClock,
    );
    let metrics = Metrics::new();
    let provider = app::assemble(
        ProviderConfig::default(),
        fake,
        store,
        SystemClock,
        TokioSpawner,
        &metrics,
    )
    .await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
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
        let shutdown = async move {
            let _ = stopped.await;
        };
        app::serve(provider, metrics, listener, None, config, shutdown)
            .await
            .map_err(|e| e.to_string())
    });
    Ok(Running { addr, stop, task })
}

impl Running {
    async fn shutdown(self) -> Result<(), BoxError> {
        let _ = self.stop.send(());
        self.task.await??;
        Ok(())
    }
}

async fn client(addr: SocketAddr) -> Result<CapacityProviderClient<Channel>, BoxError> {
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    Ok(CapacityProviderClient::new(channel).max_decoding_message_size(512 * 1024 * 1024))
}

/// Waits until the server answers a List (that is "ready" for a client).
async fn first_list(addr: SocketAddr) -> Result<usize, BoxError> {
    loop {
        if let Ok(mut c) = client(addr).await {
            let filter = pb::ListFilter {
                states: vec![],
                max_results: 1,
                since_revision: vec![],
            };
            if let Ok(answer) = c.list(filter).await {
                return Ok(answer.into_inner().machines.len());
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Raw single-fsync rate of the disk holding `dir`: overwrite one 4 KiB block in place and
/// fdatasync, per op (no file growth, so no metadata update slows the probe down).
fn raw_fsync_rate(dir: &std::path::Path, window: Duration) -> Result<f64, BoxError> {
    use std::os::unix::fs::FileExt;
    let path = dir.join("fsync-probe");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)?;
    let block = [0xA5u8; 4096];
    file.write_all(&block)?;
    file.sync_all()?;
    let start = Instant::now();
    let mut ops = 0u64;
    while start.elapsed() < window {
        file.write_all_at(&block, 0)?;
        file.sync_data()?;
        ops += 1;
    }
    let rate = ops as f64 / start.elapsed().as_secs_f64();
    std::fs::remove_file(path)?;
    Ok(rate)
}

struct Load {
    throughput: f64,
    p50: Duration,
    p99: Duration,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// `concurrency` workers each send `per_worker` Creates on machines of their own.
async fn mutate_load(
    addr: SocketAddr,
    ids: Vec<String>,
    concurrency: usize,
) -> Result<Load, BoxError> {
    let per_worker = ids.len() / concurrency;
    let mut workers = Vec::new();
    let start = Instant::now();
    for chunk in ids.chunks(per_worker).take(concurrency) {
        let chunk = chunk.to_vec();
        let mut c = client(addr).await?;
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(chunk.len());
            for id in chunk {
                let request = pb::CreateRequest {
                    machine_id: id,
                    shard_id: "bench".to_owned(),
                    shard_epoch: 1,
                    sequence_number: 1,
                };
                let t = Instant::now();
                c.create(request).await.map_err(|e| e.to_string())?;
                latencies.push(t.elapsed());
            }
            Ok::<_, String>(latencies)
        }));
    }
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await??);
    }
    let elapsed = start.elapsed();
    all.sort();
    Ok(Load {
        throughput: all.len() as f64 / elapsed.as_secs_f64(),
        p50: percentile(&all, 0.50),
        p99: percentile(&all, 0.99),
    })
}

async fn run_load(
    dir: &std::path::Path,
    durable: bool,
    concurrency: usize,
    calls: usize,
) -> Result<Load, BoxError> {
    let machines = slots(calls);
    let ids: Vec<String> = machines.iter().map(|m| m.id.to_string()).collect();
    let running = if durable {
        let path = dir.join(format!("load-{concurrency}.redb"));
        let _ = std::fs::remove_file(&path);
        start(machines, RedbStateStore::open(&path)?).await?
    } else {
        start(machines, MemoryStateStore::new()).await?
    };
    first_list(running.addr).await?;
    let load = mutate_load(running.addr, ids, concurrency).await?;
    running.shutdown().await?;
    Ok(load)
}

fn fmt(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

async fn restart_to_ready(
    dir: &std::path::Path,
    machines: usize,
) -> Result<(Duration, usize), BoxError> {
    let path = dir.join("restart.redb");
    let _ = std::fs::remove_file(&path);
    // First boot seeds the file; a Configure-free run is enough to fill it.
    let first = start(slots(machines), RedbStateStore::open(&path)?).await?;
    first_list(first.addr).await?;
    first.shutdown().await?;
    let inventory = slots(machines);
    let t = Instant::now();
    let store = RedbStateStore::open(&path)?;
    // The restart path: reload, fail interrupted transitions, bind, serve, answer a List.
    let again = start(inventory, store).await?;
    let listed = first_list(again.addr).await?;
    let elapsed = t.elapsed();
    again.shutdown().await?;
    Ok((elapsed, listed))
}

async fn bench() -> Result<(), BoxError> {
    let base = std::env::var_os("BENCH_DIR").map_or_else(std::env::temp_dir, Into::into);
    let dir = tempfile::tempdir_in(base)?;
    let quick = quick();
    let fsync_window = if quick {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(2)
    };
    let fsync_rate = raw_fsync_rate(dir.path(), fsync_window)?;
    println!("disk: {}", dir.path().display());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "load average at start: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("raw single-fsync rate (4 KiB write + fdatasync): {fsync_rate:.0} ops/s\n");
    println!(
        "{:<12} {:>6} {:>12} {:>12} {:>12} {:>14}",
        "store", "conc", "calls/s", "p50 ack", "p99 ack", "× raw fsync"
    );
    let mut durable_at_64 = 0.0;
    let mut memory_at_64 = 0.0;
    for concurrency in [1usize, 16, 64] {
        let calls = match (quick, concurrency) {
            (true, _) => 64 * 4,
            (false, 1) => 1_000,
            (false, _) => 64 * 100,
        };
        for durable in [false, true] {
            let load = run_load(dir.path(), durable, concurrency, calls).await?;
            let name = if durable { "redb --state" } else { "in-memory" };
            println!(
                "{:<12} {:>6} {:>12.0} {:>12} {:>12} {:>13.1}×",
                name,
                concurrency,
                load.throughput,
                fmt(load.p50),
                fmt(load.p99),
                load.throughput / fsync_rate
            );
            match (durable, concurrency) {
                (true, 64) => durable_at_64 = load.throughput,
                (false, 64) => memory_at_64 = load.throughput,
                _ => {}
            }
        }
    }
    let ratio = durable_at_64 / fsync_rate;
    let verdict = if ratio >= GROUP_COMMIT_TARGET {
        "PASS"
    } else {
        "MISS"
    };
    println!(
        "\ngroup commit: durable throughput at concurrency 64 = {ratio:.1}× the raw fsync rate (target ≥ {GROUP_COMMIT_TARGET}×): {verdict}"
    );
    // No store can make the provider faster than it is with no disk at all: when the
    // in-memory run is itself below the target, the target is out of reach on this disk
    // and what is left to judge is how much of the in-memory rate durability keeps.
    println!(
        "ceiling: in-memory throughput at concurrency 64 = {:.1}× the raw fsync rate; durable keeps {:.0}% of it",
        memory_at_64 / fsync_rate,
        100.0 * durable_at_64 / memory_at_64
    );
    let machines = if quick { 10_000 } else { 100_000 };
    let (restart, listed) = restart_to_ready(dir.path(), machines).await?;
    let verdict = if restart <= RESTART_TARGET {
        "PASS"
    } else {
        "MISS"
    };
    println!(
        "restart-to-ready with {machines} machines in the state file: {} (first List answered, {listed} machine) (target ≤ {:?}): {verdict}",
        fmt(restart),
        RESTART_TARGET
    );
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}
