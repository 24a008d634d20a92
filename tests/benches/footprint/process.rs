//! The real-binary half of the footprint benchmark: spawns the release binary on the fake
//! backend and measures it from outside (/proc, the wire, the clock, the state file).

use crate::results::say;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::capacity_provider_client::CapacityProviderClient;
use prost::Message;
use prost::bytes::{Buf, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Request, Status};

use super::{BoxError, goal};

const CLIENTS: usize = 64;
/// Full Lists after the first, to see whether memory settles.
const LATER_LISTS: usize = 4;
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The binary Cargo built for this benchmark (under `cargo bench`, the release-profile one),
/// or `$BIGFLEET_LIBVIRT_RELEASE_BIN` to measure another build.
fn release_binary() -> Result<PathBuf, BoxError> {
    let path = std::env::var_os("BIGFLEET_LIBVIRT_RELEASE_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_bigfleet-libvirt")),
        PathBuf::from,
    );
    if !path.exists() {
        return Err(format!(
            "{} is missing: run the benchmark with cargo bench",
            path.display()
        )
        .into());
    }
    if cfg!(debug_assertions) {
        say!(
            "footprint: measuring a debug build ({}); run `cargo bench` for the release figures",
            path.display()
        );
    }
    Ok(path)
}

/// A provider process and when it started.
struct Proc {
    child: Child,
    started: Instant,
    ready: Duration,
    addr: SocketAddr,
}

impl Proc {
    /// Spawns the binary and waits for its "serving" line.
    fn start(binary: &Path, machines: usize, state: Option<&Path>) -> Result<Self, BoxError> {
        let mut command = Command::new(binary);
        command.args([
            "--use-fake-backend",
            "--addr=127.0.0.1:0",
            "--metrics-addr=127.0.0.1:0",
            "--log-format=json",
            "--fake-delay-min=0s",
            "--fake-delay-max=0s",
            "--reconcile-interval=0s",
        ]);
        command.arg(format!("--seed-count={machines}"));
        if let Ok(extra) = std::env::var("BENCH_FOOTPRINT_ARGS") {
            command.args(extra.split_whitespace());
        }
        if let Some(path) = state {
            command.arg(format!("--state={}", path.display()));
        }
        command
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = command.spawn()?;
        let stderr = child.stderr.take().ok_or("no stderr pipe")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stderr);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                if let Some(addr) = serving_addr(&line) {
                    let _ = tx.send((addr, started.elapsed()));
                    // The rest of the log is drained unread: parsing every line (one per
                    // mutating call) would take CPU from the process measured.
                    let _ = std::io::copy(&mut reader, &mut std::io::sink());
                    return;
                }
                line.clear();
            }
        });
        match rx.recv_timeout(START_TIMEOUT) {
            Ok((addr, ready)) => Ok(Self {
                child,
                started,
                ready,
                addr,
            }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                Err("the provider did not log its serving line in time".into())
            }
        }
    }

    fn rss_mib(&self) -> f64 {
        rss_kib(self.child.id()) as f64 / 1024.0
    }

    /// SIGTERM, then the time until the process has exited.
    fn terminate(mut self) -> Result<Duration, BoxError> {
        let pid = self.child.id().to_string();
        let t = Instant::now();
        let status = Command::new("kill").args(["-TERM", &pid]).status()?;
        if !status.success() {
            return Err("kill -TERM failed".into());
        }
        loop {
            if let Some(status) = self.child.try_wait()? {
                let elapsed = t.elapsed();
                if !status.success() {
                    return Err(format!("the provider exited with {status} on SIGTERM").into());
                }
                return Ok(elapsed);
            }
            if t.elapsed() > Duration::from_secs(30) {
                let _ = self.child.kill();
                return Err("the provider did not exit within 30 s of SIGTERM".into());
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn serving_addr(line: &str) -> Option<SocketAddr> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = value.get("fields")?;
    if fields.get("message")?.as_str()? != "serving CapacityProvider" {
        return None;
    }
    fields.get("addr")?.as_str()?.parse().ok()
}

/// VmRSS of `pid` in KiB (0 when /proc does not say).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------
// Clients

async fn channel(addr: SocketAddr) -> Result<Channel, BoxError> {
    Ok(Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?)
}

fn client(channel: &Channel) -> CapacityProviderClient<Channel> {
    CapacityProviderClient::new(channel.clone()).max_decoding_message_size(usize::MAX)
}

/// Sends a `ListFilter` and keeps the answer's bytes undecoded: the time measured is the
/// server's, as received on the wire, not the client's decode.
#[derive(Clone, Copy, Debug, Default)]
struct RawList;

impl Codec for RawList {
    type Encode = pb::ListFilter;
    type Decode = Bytes;
    type Encoder = RawList;
    type Decoder = RawList;

    fn encoder(&mut self) -> Self::Encoder {
        RawList
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawList
    }
}

impl Encoder for RawList {
    type Item = pb::ListFilter;
    type Error = Status;

    fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encode ListFilter: {e}")))
    }
}

impl Decoder for RawList {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n)))
    }
}

/// One full List (every machine); returns the size of the answer in bytes.
async fn full_list(addr: SocketAddr) -> Result<usize, BoxError> {
    let channel = channel(addr).await?;
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(usize::MAX);
    grpc.ready().await?;
    let path = PathAndQuery::from_static("/bigfleet.v1alpha1.CapacityProvider/List");
    let filter = pb::ListFilter::default();
    let answer = grpc.unary(Request::new(filter), path, RawList).await?;
    Ok(answer.into_inner().len())
}

/// Waits until `id` is in `state`.
async fn reach(addr: SocketAddr, id: &str, state: pb::MachineState) -> Result<(), BoxError> {
    let mut c = client(&channel(addr).await?);
    let t = Instant::now();
    loop {
        let m = c
            .get(pb::MachineRef { id: id.to_owned() })
            .await?
            .into_inner();
        if m.state == state as i32 {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(30) {
            return Err(format!("{id} did not reach {state:?} within 30 s").into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Some machine ids (from a capped List).
async fn some_ids(addr: SocketAddr, count: usize) -> Result<Vec<String>, BoxError> {
    let mut c = client(&channel(addr).await?);
    let filter = pb::ListFilter {
        states: vec![pb::MachineState::Speculative as i32],
        max_results: i32::try_from(count)?,
        since_revision: vec![],
    };
    let list = c.list(filter).await?.into_inner();
    Ok(list.machines.into_iter().map(|m| m.id).collect())
}

#[derive(Clone, Copy)]
enum Load {
    Get,
    Replay,
}

/// Calls per second of `load` over `window`, from `CLIENTS` clients with a connection each.
async fn throughput(
    addr: SocketAddr,
    ids: &[String],
    load: Load,
    window: Duration,
) -> Result<f64, BoxError> {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut workers = Vec::new();
    for worker in 0..CLIENTS {
        let id = ids[worker % ids.len()].clone();
        let mut c = client(&channel(addr).await?);
        let done = Arc::clone(&done);
        workers.push(tokio::spawn(async move {
            while start.elapsed() < window {
                let answer = match load {
                    Load::Get => c.get(pb::MachineRef { id: id.clone() }).await.map(|_| ()),
                    Load::Replay => c
                        .create(pb::CreateRequest {
                            machine_id: id.clone(),
                            ..Default::default()
                        })
                        .await
                        .map(|_| ()),
                };
                answer.map_err(|e| e.to_string())?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, String>(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

// ---------------------------------------------------------------------------------------
// The phases

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One process: ready, RSS, one full List, RSS; returns it still running.
async fn boot(
    binary: &Path,
    machines: usize,
    state: Option<&Path>,
) -> Result<(Proc, f64, f64, Duration), BoxError> {
    let proc = Proc::start(binary, machines, state)?;
    let rss_ready = proc.rss_mib();
    full_list(proc.addr).await?;
    let listed = proc.started.elapsed();
    let rss_listed = proc.rss_mib();
    Ok((proc, rss_ready, rss_listed, listed))
}

/// Bytes the process has caused to be written to storage so far (`write_bytes` of
/// /proc/PID/io: the state file's pages; sockets and pipes do not count).
fn written_bytes(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Size of the state file's current contents (redb grows its file in steps).
fn file_bytes(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

async fn one_size(
    binary: &Path,
    dir: &Path,
    machines: usize,
    empty_mib: f64,
) -> Result<(), BoxError> {
    say!("\n== {machines} machines ==");
    say!(
        "{:<10} {:>11} {:>12} {:>13} {:>10} {:>11} {:>10}",
        "store",
        "ready ms",
        "1st List ms",
        "RSS ready",
        "RSS List",
        "KiB/mach.",
        "exit ms"
    );
    let path = dir.join(format!("state-{machines}.redb"));
    let _ = std::fs::remove_file(&path);
    let mut later = Vec::new();
    for state in [None, Some(path.as_path())] {
        let (proc, rss_ready, rss_listed, listed) = boot(binary, machines, state).await?;
        let per_machine = (rss_listed - empty_mib) * 1024.0 / machines as f64;
        let ready = proc.ready;
        for _ in 0..LATER_LISTS {
            full_list(proc.addr).await?;
        }
        later.push(proc.rss_mib());
        let exit = proc.terminate()?;
        say!(
            "{:<10} {:>11.0} {:>12.0} {:>9.1} MiB {:>6.1} MiB {:>11.2} {:>10.1}",
            if state.is_some() {
                "--state"
            } else {
                "in-memory"
            },
            ms(ready),
            ms(listed),
            rss_ready,
            rss_listed,
            per_machine,
            ms(exit)
        );
    }
    say!(
        "RSS after {LATER_LISTS} more full Lists: {:.1} MiB in memory, {:.1} MiB with --state",
        later[0],
        later[1]
    );
    let size = file_bytes(&path);
    say!(
        "state file: {:.1} MB, {:.0} bytes per machine (goal at 100k: ≤ {} MB)",
        size as f64 / 1e6,
        size as f64 / machines as f64,
        goal::STATE_MB
    );
    restart_and_configure(binary, &path, machines).await
}

/// Restarts on the file, then one Create and one Configure to see what a mutation writes.
async fn restart_and_configure(
    binary: &Path,
    path: &Path,
    machines: usize,
) -> Result<(), BoxError> {
    let (proc, _, rss_listed, listed) = boot(binary, machines, Some(path)).await?;
    say!(
        "restart on the state file to first full List: {:.0} ms (goal ≤ {} ms), RSS {rss_listed:.1} MiB",
        ms(listed),
        goal::RESTART_MS
    );
    let id = some_ids(proc.addr, 1).await?.remove(0);
    let mut c = client(&channel(proc.addr).await?);
    c.create(pb::CreateRequest {
        machine_id: id.clone(),
        shard_id: "bench".to_owned(),
        shard_epoch: 1,
        sequence_number: 1,
    })
    .await?;
    reach(proc.addr, &id, pb::MachineState::Idle).await?;
    let (before, written) = (file_bytes(path), written_bytes(proc.child.id()));
    c.configure(pb::ConfigureRequest {
        machine_id: id.clone(),
        cluster_id: "bench-cluster".to_owned(),
        shard_id: "bench".to_owned(),
        shard_epoch: 1,
        sequence_number: 2,
        ..Default::default()
    })
    .await?;
    reach(proc.addr, &id, pb::MachineState::Configured).await?;
    let after = file_bytes(path);
    let written = written_bytes(proc.child.id()) - written;
    say!(
        "one Configure (two commits): {written} bytes written to storage ({:.1} per machine \
         of the inventory); the file grew by {} bytes",
        written as f64 / machines as f64,
        i128::from(after) - i128::from(before)
    );
    let exit = proc.terminate()?;
    say!("SIGTERM to exit after the restart: {:.1} ms", ms(exit));
    Ok(())
}

/// Waits until no machine is in `states` (polls a capped List).
async fn settled(addr: SocketAddr, states: &[pb::MachineState]) -> Result<(), BoxError> {
    let mut c = client(&channel(addr).await?);
    let filter = pb::ListFilter {
        states: states.iter().map(|s| *s as i32).collect(),
        max_results: 1,
        since_revision: vec![],
    };
    let t = Instant::now();
    while !c
        .list(filter.clone())
        .await?
        .into_inner()
        .machines
        .is_empty()
    {
        if t.elapsed() > Duration::from_secs(300) {
            return Err(format!("machines still {states:?} after 300 s").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Sends `call` for every id from `CLIENTS` clients, each with a share of the ids.
async fn for_all<F, Fut>(addr: SocketAddr, ids: &[String], call: F) -> Result<(), BoxError>
where
    F: Fn(CapacityProviderClient<Channel>, String) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<CapacityProviderClient<Channel>, tonic::Status>> + Send,
{
    let mut workers = Vec::new();
    for chunk in ids.chunks(ids.len().div_ceil(CLIENTS).max(1)) {
        let chunk = chunk.to_vec();
        let mut c = client(&channel(addr).await?);
        let call = call.clone();
        workers.push(tokio::spawn(async move {
            for id in chunk {
                c = call(c, id).await.map_err(|e| e.to_string())?;
            }
            Ok::<_, String>(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    Ok(())
}

/// The worst case for sizing: every machine Created and Configured (a fence mark, two
/// operation ids, a host, a cluster and metadata each), then one full List; in memory.
async fn all_in_use(binary: &Path, machines: usize) -> Result<(), BoxError> {
    let (proc, _, rss_listed, _) = boot(binary, machines, None).await?;
    let ids = some_ids(proc.addr, machines).await?;
    let t = Instant::now();
    for_all(proc.addr, &ids, |mut c, id| async move {
        c.create(pb::CreateRequest {
            machine_id: id,
            shard_id: "bench".to_owned(),
            shard_epoch: 1,
            sequence_number: 1,
        })
        .await?;
        Ok(c)
    })
    .await?;
    settled(proc.addr, &[pb::MachineState::Creating]).await?;
    for_all(proc.addr, &ids, |mut c, id| async move {
        c.configure(pb::ConfigureRequest {
            machine_id: id,
            cluster_id: "bench-cluster".to_owned(),
            shard_id: "bench".to_owned(),
            shard_epoch: 1,
            sequence_number: 2,
            shard_metadata: [("bigfleet.io/node-pool".to_owned(), "pool-a".to_owned())].into(),
            ..Default::default()
        })
        .await?;
        Ok(c)
    })
    .await?;
    settled(proc.addr, &[pb::MachineState::Configuring]).await?;
    full_list(proc.addr).await?;
    let rss = proc.rss_mib();
    say!(
        "\nevery one of {machines} machines Created and Configured ({:.1} s), then a full List: \
         RSS {rss:.1} MiB ({rss_listed:.1} MiB with all Speculative; {:.2} KiB more per machine \
         in use)",
        t.elapsed().as_secs_f64(),
        (rss - rss_listed) * 1024.0 / machines as f64
    );
    proc.terminate()?;
    Ok(())
}

/// No-token Create replay vs Get at 64 clients, in memory.
async fn replay_vs_get(binary: &Path, machines: usize, window: Duration) -> Result<(), BoxError> {
    let (proc, _, _, _) = boot(binary, machines, None).await?;
    let ids = some_ids(proc.addr, CLIENTS).await?;
    let mut c = client(&channel(proc.addr).await?);
    for id in &ids {
        c.create(pb::CreateRequest {
            machine_id: id.clone(),
            shard_id: "bench".to_owned(),
            shard_epoch: 1,
            sequence_number: 1,
        })
        .await?;
    }
    for id in &ids {
        reach(proc.addr, id, pb::MachineState::Idle).await?;
    }
    // Warm both paths, then interleave two rounds each.
    throughput(proc.addr, &ids, Load::Get, window / 4).await?;
    throughput(proc.addr, &ids, Load::Replay, window / 4).await?;
    let (mut get, mut replay) = (0.0, 0.0);
    for _ in 0..2 {
        get += throughput(proc.addr, &ids, Load::Get, window).await? / 2.0;
        replay += throughput(proc.addr, &ids, Load::Replay, window).await? / 2.0;
    }
    say!(
        "\n64 clients, {machines} machines: Get {get:.0}/s, no-token Create replay {replay:.0}/s, \
         replay/Get = {:.2} (goal ≥ {})",
        replay / get,
        goal::REPLAY_SHARE
    );
    proc.terminate()?;
    Ok(())
}

/// Every real-binary measurement, for each size.
pub async fn run(sizes: &[usize], quick: bool) -> Result<(), BoxError> {
    let binary = release_binary()?;
    say!("binary: {}", binary.display());
    let dir = tempfile::tempdir()?;
    let (empty, rss_ready, rss_empty, listed) = boot(&binary, 1, None).await?;
    let exit = empty.terminate()?;
    say!(
        "empty process (1 machine): RSS {rss_ready:.1} MiB ready, {rss_empty:.1} MiB after a List, \
         first List at {:.0} ms, SIGTERM to exit {:.1} ms",
        ms(listed),
        ms(exit)
    );
    for &machines in sizes {
        one_size(&binary, dir.path(), machines, rss_empty).await?;
    }
    say!(
        "goals at 100k: RSS ≤ {} MiB ({} KiB/machine), start to first full List ≤ {} ms, \
         SIGTERM to exit ≤ {} ms",
        goal::RSS_MIB,
        goal::KIB_PER_MACHINE,
        goal::START_MS,
        goal::EXIT_MS
    );
    let window = if quick {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(2)
    };
    let largest = sizes.iter().copied().max().unwrap_or(8_000);
    replay_vs_get(&binary, largest, window).await?;
    all_in_use(&binary, largest).await?;
    Ok(())
}
