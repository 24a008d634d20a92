//! Durability benchmark: what `--state` costs.
//!
//! Measured in one run on one disk: the raw single-fsync rate of the disk (write 4 KiB +
//! fdatasync in a loop), then mutating-RPC throughput and p99 ack latency at concurrency 1,
//! 16 and 64 with the in-memory store and with the redb store on a real file in the same
//! directory, then restart-to-ready with 100k machines in the state file. Group commit is
//! working when durable throughput at concurrency 64 is well above the raw fsync rate
//! (target ≥ 10×). Numbers are printed, never asserted.
//!
//! Run: `cargo bench -p bigfleet-libvirt --bench durability`
//! (`BENCH_QUICK=1` for a fast smoke run; `BENCH_DIR` picks the directory/disk).

// Black-box tests and benchmarks measure wall time and spawn freely: the product's bans on raw
// time, spawning and hash collections (clippy.toml) do not apply to them.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use crate::results::say;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use bigfleet_libvirt_app as app;
use bigfleet_libvirt_app::launch::{self, Plan};
use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::capacity_provider_client::CapacityProviderClient;
use tonic::transport::Channel;

#[path = "common/flags.rs"]
mod flags;
#[path = "common/results.rs"]
mod results;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const GROUP_COMMIT_TARGET: f64 = 10.0;
const RESTART_TARGET: Duration = Duration::from_secs(1);

fn quick() -> bool {
    std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The plan the binary would run for `machines` Speculative slots on the zero-latency fake,
/// with `--state` at `state` (the redb store) or without it (the in-memory store).
fn plan(machines: usize, state: Option<&Path>) -> Result<Plan, BoxError> {
    let mut flags = flags::fake(machines);
    flags.state = state.map(Path::to_path_buf);
    Ok(launch::resolve(&flags)?)
}

/// The slots' machine ids.
fn ids(plan: &Plan) -> Vec<String> {
    plan.inventory
        .machines
        .iter()
        .map(|m| m.id.to_string())
        .collect()
}

/// A provider serving on loopback; dropping `stop` shuts it down.
struct Running {
    addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), String>>,
}

/// Builds and serves `plan` through the binary's own wiring (`app::run`) on a fresh
/// loopback port.
async fn start(plan: Plan) -> Result<Running, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let listeners = app::Listeners {
        grpc: listener,
        http: None,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
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
            on_start: (),
            shutdown,
            exit: &exit,
        })
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
    let state = durable.then(|| dir.join(format!("load-{concurrency}.redb")));
    if let Some(path) = &state {
        let _ = std::fs::remove_file(path);
    }
    let plan = plan(calls, state.as_deref())?;
    let ids = ids(&plan);
    let running = start(plan).await?;
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
    let first = start(plan(machines, Some(&path))?).await?;
    first_list(first.addr).await?;
    first.shutdown().await?;
    let again = plan(machines, Some(&path))?;
    let t = Instant::now();
    // The restart path: open, reload, fail interrupted transitions, serve, answer a List.
    let again = start(again).await?;
    let listed = first_list(again.addr).await?;
    let elapsed = t.elapsed();
    again.shutdown().await?;
    Ok((elapsed, listed))
}

/// The disk, the load and the raw fsync rate the run starts with, and the table's header.
fn print_preamble(dir: &Path, fsync_rate: f64) {
    say!("disk: {}", dir.display());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    say!(
        "load average at start: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    say!("raw single-fsync rate (4 KiB write + fdatasync): {fsync_rate:.0} ops/s\n");
    say!(
        "{:<12} {:>6} {:>12} {:>12} {:>12} {:>14}",
        "store",
        "conc",
        "calls/s",
        "p50 ack",
        "p99 ack",
        "× raw fsync"
    );
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
    print_preamble(dir.path(), fsync_rate);
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
            say!(
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
    say!(
        "\ngroup commit: durable throughput at concurrency 64 = {ratio:.1}× the raw fsync rate (target ≥ {GROUP_COMMIT_TARGET}×): {verdict}"
    );
    // No store can make the provider faster than it is with no disk at all: when the
    // in-memory run is itself below the target, the target is out of reach on this disk
    // and what is left to judge is how much of the in-memory rate durability keeps.
    say!(
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
    say!(
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
    runtime.block_on(bench())?;
    let section = match std::env::var("SLOW_FSYNC_US") {
        Ok(us) => {
            format!("durability, every fsync delayed by {us} µs (scripts/bench/slow-fsync.sh)")
        }
        Err(_) => "durability".to_owned(),
    };
    results::write(&section)
}
